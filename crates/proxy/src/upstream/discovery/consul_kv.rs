//! `discovery.consul_kv`: nodes registered as Consul KV keys
//! `<prefix>/<service>/<ip>:<port>`, each value a base64 JSON object (`weight`, `max_fails`,
//! `fail_timeout`, `check_status`).
//!
//! As APISIX's module: per server, `GET /v1/kv/<prefix>?recurse=true` as a blocking query
//! (`index` + `wait`) while `keepalive` is on, else every `fetch_interval` seconds. A service's
//! `service_name` is the server's KV URL and the key's directory,
//! `http://127.0.0.1:8500/v1/kv/upstreams/webpages/`. A key whose value says
//! `check_status: false` is left out; `skip_keys` names directories to leave out.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use ferrisix_config::settings::discovery::{ConsulKvSettings, DumpSettings};
use ferrisix_plugin_api::{Executor, HttpClient, TlsClient};
use http::Method;
use serde_json::Value;

use super::consul::{next_retry, nodes_json};
use super::fetch::{self, call, enc};
use super::{DiscoveredNode, DiscoveryEnv, Lookup, Nodes, Part, Publisher, ServiceMap};

pub struct ConsulKv {
    parts: Vec<Arc<Part>>,
    default: Option<DiscoveredNode>,
    settings: ConsulKvSettings,
}

/// `<prefix>/<dir>/<ip>:<port>` → (`<prefix>/<dir>/`, ip, port).
fn split_key<'a>(key: &'a str, prefix: &str) -> Option<(&'a str, &'a str, u16)> {
    let (dir, last) = key.rsplit_once('/')?;
    let head = format!("{prefix}/");
    if !dir.starts_with(&head) || dir.len() < head.len() {
        return None;
    }
    let (host, port) = last.split_once(':')?;
    if host.is_empty() || !host.chars().all(|c| c.is_ascii_alphanumeric() || c == '.') {
        return None;
    }
    let port: u16 = port.parse().ok()?;
    Some((&key[..dir.len() + 1], host, port))
}

/// The KV listing as services keyed by `server_key` + directory.
pub(super) fn parse_kv(
    body: &Value,
    server_key: &str,
    settings: &ConsulKvSettings,
) -> Result<ServiceMap, String> {
    let entries = body.as_array().ok_or("KV answer is not a list")?;
    let mut out: HashMap<String, Vec<DiscoveredNode>> = HashMap::new();
    for e in entries {
        let Some(key) = e
            .get("Key")
            .and_then(Value::as_str)
            .filter(|k| !k.is_empty())
        else {
            tracing::error!("consul_key_empty");
            continue;
        };
        let Some((dir, host, port)) = split_key(key, &settings.prefix) else {
            tracing::error!(key, "server name parse error");
            continue;
        };
        if settings.skip_keys.iter().any(|s| s == dir) {
            continue;
        }
        let Some(raw) = e
            .get("Value")
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
        else {
            tracing::error!(key, "consul_value_empty");
            continue;
        };
        let meta: Value = match base64::engine::general_purpose::STANDARD
            .decode(raw)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
        {
            Some(v) => v,
            None => {
                tracing::error!(key, "invalid upstream value");
                continue;
            }
        };
        if matches!(meta.get("check_status"), Some(Value::Bool(false)))
            || meta.get("check_status").and_then(Value::as_str) == Some("false")
        {
            continue;
        }
        let weight = meta
            .get("weight")
            .and_then(Value::as_u64)
            .and_then(|w| u32::try_from(w).ok())
            .unwrap_or(settings.weight);
        out.entry(format!("{server_key}{dir}"))
            .or_default()
            .push(DiscoveredNode::new(host, port, weight));
    }
    Ok(out.into_iter().map(|(k, v)| (k, Arc::new(v))).collect())
}

struct Server {
    base: String,
    client: HttpClient,
    settings: ConsulKvSettings,
}

impl Server {
    async fn get(&self, index: Option<u64>) -> Result<fetch::Answer, String> {
        let mut url = format!("{}/v1/kv/{}?recurse=true", self.base, self.settings.prefix);
        if !self.settings.token.is_empty() {
            url.push_str(&format!("&token={}", enc(&self.settings.token)));
        }
        let t = &self.settings.timeout;
        let mut timeout = Duration::from_millis(t.connect + t.read);
        if let Some(i) = index {
            url.push_str(&format!("&wait={}s&index={i}", t.wait));
            timeout += Duration::from_secs(t.wait + t.wait / 16 + 1);
        }
        call(&self.client, Method::GET, &url, &[], timeout, true).await
    }
}

async fn run(server: Server, publisher: Publisher) {
    let server_key = format!("{}/v1/kv/", server.base);
    let mut index = 0u64;
    let mut retry = None;
    loop {
        let blocking = server.settings.keepalive.then_some(index);
        let round = async {
            let a = server.get(blocking).await?;
            let i = a.header_u64("X-Consul-Index").unwrap_or(0);
            if i == index && index != 0 {
                return Ok(None);
            }
            let map = parse_kv(&a.json()?, &server_key, &server.settings)?;
            Ok::<_, String>(Some((map, i)))
        };
        match round.await {
            Ok(Some((map, i))) => {
                retry = None;
                index = i;
                if let Some(dump) = &server.settings.dump {
                    fetch::write_dump(dump, &map);
                }
                publisher.publish(map);
            }
            Ok(None) => {
                retry = None;
                publisher.unchanged();
            }
            Err(e) => {
                publisher.failed(&e);
                let d = next_retry(retry);
                retry = Some(d);
                tokio::time::sleep(Duration::from_secs(d)).await;
                continue;
            }
        }
        if !server.settings.keepalive {
            tokio::time::sleep(Duration::from_secs(server.settings.fetch_interval)).await;
        }
    }
}

impl ConsulKv {
    pub(super) fn start(
        settings: &ConsulKvSettings,
        env: &DiscoveryEnv,
        publisher: &dyn Fn(&'static str, &Arc<Part>) -> Publisher,
    ) -> ConsulKv {
        let tls = TlsClient::new(env.trusted.clone());
        let loaded = settings
            .dump
            .as_ref()
            .filter(|d| d.load_on_init)
            .and_then(|d| fetch::read_dump(d, settings.weight));
        let mut parts = Vec::new();
        for s in &settings.servers {
            let part = Part::new(s.clone());
            let p = publisher("consul_kv", &part);
            if let Some(map) = &loaded {
                let base = format!("{}/v1/kv/", s.trim_end_matches('/'));
                let mine: ServiceMap = map
                    .iter()
                    .filter(|(k, _)| k.starts_with(&base))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                if !mine.is_empty() {
                    p.publish(mine);
                }
            }
            let server = Server {
                base: s.trim_end_matches('/').to_string(),
                client: HttpClient::with_tls(Executor::new(env.executor.clone()), &tls),
                settings: settings.clone(),
            };
            env.executor.spawn(run(server, p));
            parts.push(part);
        }
        ConsulKv {
            parts,
            default: super::default_node(settings.default_service.as_ref(), settings.weight),
            settings: settings.clone(),
        }
    }

    pub(super) fn lookup(&self, service_name: &str) -> Lookup {
        for p in &self.parts {
            if let Some(n) = p.get(service_name) {
                return Lookup::Nodes(n);
            }
        }
        if let Some(d) = &self.default {
            return Lookup::Nodes(Arc::new(vec![d.clone()]));
        }
        if self.parts.iter().any(|p| p.is_ready()) {
            Lookup::Missing
        } else {
            Lookup::Pending
        }
    }

    pub(super) fn config(&self) -> Option<Value> {
        super::config_json(&self.settings)
    }

    pub(super) fn services(&self) -> Value {
        let mut out: HashMap<String, Nodes> = HashMap::new();
        for p in &self.parts {
            for (k, v) in p.map().iter() {
                out.insert(k.clone(), v.clone());
            }
        }
        nodes_json(&out)
    }

    pub(super) fn dump_settings(&self) -> Option<&DumpSettings> {
        self.settings.dump.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn b64(v: &Value) -> String {
        base64::engine::general_purpose::STANDARD.encode(v.to_string())
    }

    #[test]
    fn kv_keys_become_services() {
        let settings = ConsulKvSettings {
            skip_keys: vec!["upstreams/unused_api/".into()],
            ..Default::default()
        };
        let body = json!([
            {"Key": "upstreams/webpages/172.19.5.12:8000", "Value": b64(&json!({"weight": 1, "max_fails": 2, "fail_timeout": 1}))},
            {"Key": "upstreams/webpages/172.19.5.13:8000", "Value": b64(&json!({"weight": 3}))},
            {"Key": "upstreams/webpages/172.19.5.14:8000", "Value": b64(&json!({"check_status": false}))},
            {"Key": "upstreams/unused_api/172.19.5.15:8000", "Value": b64(&json!({"weight": 1}))},
            {"Key": "upstreams/172.19.5.16:8000", "Value": b64(&json!({"weight": 1}))},
            {"Key": "upstreams/webpages/bad", "Value": b64(&json!({}))},
            {"Key": "upstreams/webpages/172.19.5.17:8000", "Value": "not base64!"},
            {"Key": "upstreams/webpages/172.19.5.18:8000", "Value": null}
        ]);
        let map = parse_kv(&body, "http://127.0.0.1:8500/v1/kv/", &settings).unwrap();
        assert_eq!(map.len(), 1);
        let nodes = &map["http://127.0.0.1:8500/v1/kv/upstreams/webpages/"];
        let got: Vec<_> = nodes
            .iter()
            .map(|n| (n.host.as_str(), n.port, n.weight))
            .collect();
        assert_eq!(got, [("172.19.5.12", 8000, 1), ("172.19.5.13", 8000, 3)]);
        assert!(parse_kv(&json!({}), "x", &settings).is_err());
    }
}
