//! `discovery.nacos`: the instances of the services upstreams name, every `fetch_interval`
//! seconds (and at once when an upstream names a new one), from the first of the `host` list
//! (tried from a random one) that answers.
//!
//! As APISIX's module: `GET <host><prefix>ns/instance/list?healthyOnly=true&serviceName=…
//! &namespaceId=…&groupName=…`, the namespace and group from the upstream's
//! `discovery_args` (default `public` and `DEFAULT_GROUP`). A host written
//! `http://user:password@host:port` logs in first (`POST <prefix>auth/login`) and sends the
//! `accessToken` it gets; `access_key`/`secret_key` add `ak`, `data` and `signature` (HMAC-SHA1
//! of `<millis>@@<group>@@<service>`). Beyond APISIX, which speaks Nacos' v1 API only: with a
//! `/nacos/v2/` prefix the v2 open API's answer (`{"code":0,"data":{"hosts":[…]}}`) is read
//! too, and a service whose read fails keeps its last good nodes (APISIX drops them when some
//! other service was read).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use ferrisix_config::settings::discovery::NacosSettings;
use ferrisix_plugin_api::{Executor, HttpClient, TlsClient};
use http::Method;
use serde_json::{json, Value};

use super::fetch::{self, call, enc};
use super::{DiscoveredNode, DiscoveryEnv, Lookup, Part, Publisher, ServiceMap};

/// (namespace, group, service).
type Wanted = (String, String, String);

pub struct Nacos {
    part: Arc<Part>,
    wanted: Arc<Mutex<BTreeSet<Wanted>>>,
    wake: Arc<tokio::sync::Notify>,
}

fn key(w: &Wanted) -> String {
    format!("{}/{}/{}", w.0, w.1, w.2)
}

/// An instance list answer (v1: `{"hosts": […]}`; v2: `{"code": 0, "data": {"hosts": […]}}`).
pub(super) fn parse_instances(
    body: &Value,
    default_weight: u32,
) -> Result<Vec<DiscoveredNode>, String> {
    let hosts = match body.get("hosts") {
        Some(h) => h,
        None => match body.get("data") {
            Some(d) => {
                if let Some(code) = body.get("code").and_then(Value::as_i64) {
                    if code != 0 {
                        return Err(format!("nacos answered code {code}"));
                    }
                }
                d.get("hosts").unwrap_or(&Value::Null)
            }
            None => return Err("no hosts in the answer".into()),
        },
    };
    let mut nodes = Vec::new();
    for h in hosts.as_array().into_iter().flatten() {
        let (Some(ip), Some(port)) = (
            h.get("ip").and_then(Value::as_str),
            h.get("port")
                .and_then(Value::as_u64)
                .and_then(|p| u16::try_from(p).ok()),
        ) else {
            continue;
        };
        let weight = h
            .get("weight")
            .and_then(Value::as_f64)
            .map(|w| w.max(0.0).round() as u32)
            .unwrap_or(default_weight);
        nodes.push(DiscoveredNode {
            host: ip.to_string(),
            port,
            weight,
            metadata: None,
        });
    }
    Ok(nodes)
}

/// `ak`, `data` and `signature` for AK/SK auth.
pub(super) fn signed_param(group: &str, service: &str, ak: &str, sk: &str, millis: u128) -> String {
    if ak.is_empty() || sk.is_empty() {
        return String::new();
    }
    let data = format!("{millis}@@{group}@@{service}");
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, sk.as_bytes());
    let sig = ring::hmac::sign(&key, data.as_bytes());
    format!(
        "&ak={}&data={}&signature={}",
        enc(ak),
        enc(&data),
        enc(&base64::engine::general_purpose::STANDARD.encode(sig.as_ref()))
    )
}

struct Host {
    base: String,
    login: Option<(String, String)>,
}

struct Client {
    hosts: Vec<Host>,
    http: HttpClient,
    settings: NacosSettings,
}

impl Client {
    fn timeout(&self) -> Duration {
        let t = self.settings.timeout;
        Duration::from_millis(t.connect + t.send + t.read)
    }

    async fn token(&self, host: &Host) -> Result<String, String> {
        let Some((user, password)) = &host.login else {
            return Ok(String::new());
        };
        // Nacos 2 still logs in on the v1 path.
        let base = host.base.replace("/v2/", "/v1/");
        let url = format!(
            "{base}auth/login?username={}&password={}",
            enc(user),
            enc(password)
        );
        let headers = [("Accept", "application/json".to_string())];
        let v = call(
            &self.http,
            Method::POST,
            &url,
            &headers,
            self.timeout(),
            true,
        )
        .await
        .and_then(|a| a.json())
        .map_err(|e| format!("nacos login fail: {user}: {e}"))?;
        match v.get("accessToken").and_then(Value::as_str) {
            Some(t) if !t.is_empty() => Ok(format!("&accessToken={}", enc(t))),
            _ => Err("nacos login response missing accessToken".into()),
        }
    }

    /// Reads every wanted service from `host`; `Err` when none could be read.
    async fn fetch(
        &self,
        host: &Host,
        wanted: &[Wanted],
        previous: &ServiceMap,
    ) -> Result<ServiceMap, String> {
        let token = self.token(host).await?;
        let mut out = ServiceMap::new();
        let mut ok = false;
        let mut last_err = String::new();
        let headers = [("Accept", "application/json".to_string())];
        for w in wanted {
            let millis = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            let url = format!(
                "{}ns/instance/list?healthyOnly=true&serviceName={}{token}&namespaceId={}&groupName={}{}",
                host.base,
                enc(&w.2),
                enc(&w.0),
                enc(&w.1),
                signed_param(&w.1, &w.2, &self.settings.access_key, &self.settings.secret_key, millis)
            );
            let r = call(
                &self.http,
                Method::GET,
                &url,
                &headers,
                self.timeout(),
                true,
            )
            .await
            .and_then(|a| a.json())
            .and_then(|v| parse_instances(&v, self.settings.weight));
            match r {
                Ok(nodes) => {
                    ok = true;
                    out.insert(key(w), Arc::new(nodes));
                }
                Err(e) => {
                    tracing::error!(service = %w.2, error = %e, "nacos: cannot read service");
                    last_err = e;
                    if let Some(prev) = previous.get(&key(w)) {
                        out.insert(key(w), prev.clone());
                    }
                }
            }
        }
        if ok || wanted.is_empty() {
            Ok(out)
        } else {
            Err(format!("all nacos services fetch failed: {last_err}"))
        }
    }
}

async fn run(
    client: Client,
    wanted: Arc<Mutex<BTreeSet<Wanted>>>,
    wake: Arc<tokio::sync::Notify>,
    publisher: Publisher,
) {
    loop {
        let list: Vec<Wanted> = wanted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        let previous = publisher.part().map();
        let n = client.hosts.len().max(1);
        let start = rand::random::<usize>() % n;
        let mut result = Err("no nacos host".to_string());
        for k in 0..client.hosts.len() {
            let host = &client.hosts[(start + k) % n];
            match client.fetch(host, &list, &previous).await {
                Ok(map) => {
                    result = Ok(map);
                    break;
                }
                Err(e) => {
                    tracing::error!(host = %host.base, error = %e, "fetch_from_host");
                    result = Err(e);
                }
            }
        }
        match result {
            Ok(map) => publisher.publish(map),
            Err(e) => publisher.failed(&format!(
                "failed to fetch nacos registry from all hosts: {e}"
            )),
        }
        let _ = tokio::time::timeout(
            Duration::from_secs(client.settings.fetch_interval),
            wake.notified(),
        )
        .await;
    }
}

impl Nacos {
    pub(super) fn start(
        settings: &NacosSettings,
        env: &DiscoveryEnv,
        publisher: &dyn Fn(&'static str, &Arc<Part>) -> Publisher,
    ) -> Nacos {
        let part = Part::new("");
        let hosts = settings
            .host
            .iter()
            .map(|h| {
                let (url, login) = fetch::split_userinfo(h);
                let mut base = format!("{url}{}", settings.prefix);
                if !base.ends_with('/') {
                    base.push('/');
                }
                Host { base, login }
            })
            .collect();
        let client = Client {
            hosts,
            http: HttpClient::with_tls(
                Executor::new(env.executor.clone()),
                &TlsClient::new(env.trusted.clone()),
            ),
            settings: settings.clone(),
        };
        let wanted = Arc::new(Mutex::new(BTreeSet::new()));
        let wake = Arc::new(tokio::sync::Notify::new());
        env.executor.spawn(run(
            client,
            wanted.clone(),
            wake.clone(),
            publisher("nacos", &part),
        ));
        Nacos { part, wanted, wake }
    }

    /// Called when upstreams compile and refresh (never per request): a service not asked
    /// for before is fetched from now on, starting at once.
    pub(super) fn lookup(&self, service_name: &str, args: Option<&Value>) -> Lookup {
        let arg = |k: &str, d: &str| {
            args.and_then(|a| a.get(k))
                .and_then(Value::as_str)
                .unwrap_or(d)
                .to_string()
        };
        let w = (
            arg("namespace_id", "public"),
            arg("group_name", "DEFAULT_GROUP"),
            service_name.to_string(),
        );
        let k = key(&w);
        if let Some(n) = self.part.get(&k) {
            return Lookup::Nodes(n);
        }
        let new = self
            .wanted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(w);
        if new {
            self.wake.notify_one();
            return Lookup::Pending;
        }
        if self.part.is_ready() {
            Lookup::Missing
        } else {
            Lookup::Pending
        }
    }

    /// APISIX's dump: `{"<ns>/<group>/<service>": {"nodes": […]}}`.
    pub(super) fn services(&self) -> Value {
        Value::Object(
            self.part
                .map()
                .iter()
                .map(|(k, v)| {
                    (
                        format!("default/{k}"),
                        json!({"nodes": v.iter().map(|n| n.to_json()).collect::<Vec<_>>()}),
                    )
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_and_v2_answers() {
        let v1 = json!({"name": "DEFAULT_GROUP@@svc", "hosts": [
            {"ip": "10.0.0.1", "port": 8080, "weight": 1.0, "healthy": true},
            {"ip": "10.0.0.2", "port": 8081, "weight": 2.6},
            {"ip": "10.0.0.3"}
        ]});
        let nodes = parse_instances(&v1, 100).unwrap();
        let got: Vec<_> = nodes
            .iter()
            .map(|n| (n.host.as_str(), n.port, n.weight))
            .collect();
        assert_eq!(got, [("10.0.0.1", 8080, 1), ("10.0.0.2", 8081, 3)]);
        let v2 = json!({"code": 0, "message": "success", "data": {"hosts": [
            {"ip": "10.0.0.4", "port": 80}
        ]}});
        assert_eq!(parse_instances(&v2, 100).unwrap()[0].weight, 100);
        assert!(parse_instances(&json!({"code": 20004, "data": null}), 1).is_err());
        assert!(parse_instances(&json!([]), 1).is_err());
    }

    #[test]
    fn signature_is_hmac_sha1_of_time_group_service() {
        let p = signed_param("DEFAULT_GROUP", "svc", "ak1", "sk1", 1700000000000);
        assert!(
            p.starts_with("&ak=ak1&data=1700000000000%40%40DEFAULT%5FGROUP%40%40svc&signature=")
        );
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, b"sk1");
        let sig = ring::hmac::sign(&key, b"1700000000000@@DEFAULT_GROUP@@svc");
        let b64 = base64::engine::general_purpose::STANDARD.encode(sig.as_ref());
        assert!(p.ends_with(&enc(&b64)));
        assert_eq!(signed_param("g", "s", "", "sk", 1), "");
    }
}
