//! `discovery.consul`: every service of each Consul server, followed with blocking queries.
//!
//! As APISIX's module: per server, `GET /v1/catalog/services` and `GET /v1/health/state/any`
//! are watched with `index` (the last `X-Consul-Index`) and `wait`; when either index moves,
//! every service the catalog lists (but `skip_services`, and `consul` itself) is read from
//! `GET /v1/health/service/<name>?passing=true` and the whole map is published (beyond APISIX,
//! a service whose read fails keeps its last good nodes). With
//! `keepalive: false` the two indexes are read every `fetch_interval` seconds instead. A
//! failed round is retried after 1, 4, 16, 64, 256 seconds, then 1 again; the last good
//! services keep serving meanwhile. `dump` writes what was fetched to a file (read back at
//! start with `load_on_init`); `default_service` is the node of a service Consul does not list.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use ferrisix_config::settings::discovery::{ConsulSettings, DumpSettings};
use ferrisix_plugin_api::{Executor, HttpClient, TlsClient};
use futures_util::StreamExt;
use http::Method;
use serde_json::Value;

use super::fetch::{self, call, enc};
use super::{DiscoveredNode, DiscoveryEnv, Lookup, Nodes, Part, Publisher, ServiceMap};

/// Services read at once when the indexes moved.
const PARALLEL_READS: usize = 16;
/// The retry ladder's top (seconds), as APISIX's.
const MAX_RETRY: u64 = 256;

pub struct Consul {
    parts: Vec<Arc<Part>>,
    default: Option<DiscoveredNode>,
    settings: ConsulSettings,
}

/// The next delay of APISIX's ladder: 1, 4, 16, 64, 256, then 1 again.
pub(super) fn next_retry(previous: Option<u64>) -> u64 {
    match previous {
        Some(d) if d < MAX_RETRY => d * 4,
        _ => 1,
    }
}

/// Node order by `sort_type`.
pub(super) fn sort_nodes(nodes: &mut [DiscoveredNode], sort_type: &str) {
    match sort_type {
        "host_sort" => nodes.sort_by(|a, b| a.host.cmp(&b.host)),
        "port_sort" => nodes.sort_by_key(|n| n.port),
        "combine_sort" => nodes.sort_by(|a, b| (&a.host, a.port).cmp(&(&b.host, b.port))),
        _ => {}
    }
}

/// The nodes of `GET /v1/health/service/<name>` (each entry's `Service`; an empty
/// `Service.Address` takes the node's address, as Consul's own DNS does; a port 0 is 80).
pub(super) fn parse_health(
    body: &Value,
    weight: u32,
    sort_type: &str,
) -> Result<Vec<DiscoveredNode>, String> {
    let entries = body.as_array().ok_or("health answer is not a list")?;
    let mut seen = HashSet::new();
    let mut nodes = Vec::new();
    for e in entries {
        let Some(svc) = e.get("Service").filter(|s| s.is_object()) else {
            tracing::warn!("invalid consul service entry without Service field, skip it");
            continue;
        };
        let mut address = svc.get("Address").and_then(Value::as_str).unwrap_or("");
        if address.is_empty() {
            address = e
                .pointer("/Node/Address")
                .and_then(Value::as_str)
                .unwrap_or("");
        }
        if address.is_empty() {
            continue;
        }
        let port = svc
            .get("Port")
            .and_then(Value::as_u64)
            .filter(|p| *p != 0)
            .unwrap_or(80);
        let Ok(port) = u16::try_from(port) else {
            continue;
        };
        if seen.insert((address.to_string(), port)) {
            nodes.push(DiscoveredNode::new(address, port, weight));
        }
    }
    sort_nodes(&mut nodes, sort_type);
    Ok(nodes)
}

/// One Consul server as the client reads it.
struct Server {
    base: String,
    token: String,
    client: HttpClient,
    connect_read: Duration,
    wait: u64,
}

impl Server {
    fn url(&self, path: &str, extra: &[(&str, String)]) -> String {
        let mut args: Vec<String> = Vec::new();
        if !self.token.is_empty() {
            args.push(format!("token={}", enc(&self.token)));
        }
        for (k, v) in extra {
            args.push(format!("{k}={}", enc(v)));
        }
        if args.is_empty() {
            format!("{}/v1{path}", self.base)
        } else {
            format!("{}/v1{path}?{}", self.base, args.join("&"))
        }
    }

    async fn get(&self, url: &str, blocking: bool) -> Result<fetch::Answer, String> {
        let timeout = if blocking {
            // Consul adds up to wait/16 of jitter to a blocking query.
            self.connect_read + Duration::from_secs(self.wait + self.wait / 16 + 1)
        } else {
            self.connect_read
        };
        call(&self.client, Method::GET, url, &[], timeout, true).await
    }

    /// A blocking query on `path` from `index`: the index it answered with.
    async fn watch(&self, path: &str, index: u64) -> Result<u64, String> {
        let url = self.url(
            path,
            &[
                ("index", index.to_string()),
                ("wait", format!("{}s", self.wait)),
            ],
        );
        let a = self.get(&url, true).await?;
        if a.status != 200 {
            return Err(format!("{path}: status {}", a.status));
        }
        a.header_u64("X-Consul-Index")
            .filter(|i| *i > 0)
            .ok_or_else(|| format!("{path}: no X-Consul-Index"))
    }

    /// Waits until the catalog's or the health index moves past what is known.
    async fn wait_change(&self, catalog: u64, health: u64) -> Result<(), String> {
        let until_moved = |path: &'static str, known: u64| async move {
            loop {
                let asked = std::time::Instant::now();
                let i = self.watch(path, known).await?;
                if known == 0 || i != known {
                    return Ok::<(), String>(());
                }
                // A server that answers at once without a change (no blocking) is asked
                // again after a pause, not in a busy loop.
                if asked.elapsed() < Duration::from_secs(1) {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        tokio::select! {
            r = until_moved("/catalog/services", catalog) => r,
            r = until_moved("/health/state/any", health) => r,
        }
    }

    /// Every service's passing nodes, and the two indexes read.
    async fn fetch(
        &self,
        settings: &ConsulSettings,
        skip: &HashSet<String>,
        previous: &ServiceMap,
    ) -> Result<(ServiceMap, u64, u64), String> {
        let catalog = self.get(&self.url("/catalog/services", &[]), false).await?;
        let catalog_index = catalog.header_u64("X-Consul-Index").unwrap_or(0);
        let catalog = catalog.json().map_err(|e| format!("catalog: {e}"))?;
        let names: Vec<String> = catalog
            .as_object()
            .ok_or("catalog answer is not an object")?
            .keys()
            .filter(|k| !skip.contains(*k))
            .cloned()
            .collect();
        let health = self.get(&self.url("/health/state/any", &[]), false).await?;
        if health.status != 200 {
            return Err(format!("health: status {}", health.status));
        }
        let health_index = health.header_u64("X-Consul-Index").unwrap_or(0);
        let reads = futures_util::stream::iter(names.into_iter().map(|name| async move {
            let url = self.url(
                &format!("/health/service/{}", enc(&name)),
                &[("passing", "true".to_string())],
            );
            let r = self
                .get(&url, false)
                .await
                .and_then(|a| a.json())
                .and_then(|v| parse_health(&v, settings.weight, &settings.sort_type));
            (name, r)
        }))
        .buffer_unordered(PARALLEL_READS)
        .collect::<Vec<_>>()
        .await;
        let mut map = ServiceMap::new();
        for (name, r) in reads {
            match r {
                Ok(nodes) if !nodes.is_empty() => {
                    map.insert(name, Arc::new(nodes));
                }
                Ok(_) => {}
                Err(e) => {
                    // APISIX drops a service it cannot read; here it keeps its last good
                    // nodes.
                    tracing::error!(service = %name, error = %e, "consul: cannot read service");
                    if let Some(prev) = previous.get(&name) {
                        map.insert(name, prev.clone());
                    }
                }
            }
        }
        Ok((map, catalog_index, health_index))
    }
}

async fn run(server: Server, settings: ConsulSettings, publisher: Publisher) {
    let mut skip: HashSet<String> = settings.skip_services.iter().cloned().collect();
    skip.insert("consul".into());
    let (mut catalog, mut health) = (0u64, 0u64);
    let mut retry: Option<u64> = None;
    let mut first = true;
    loop {
        if !first {
            if settings.keepalive {
                if let Err(e) = server.wait_change(catalog, health).await {
                    publisher.failed(&e);
                    let d = next_retry(retry);
                    retry = Some(d);
                    tokio::time::sleep(Duration::from_secs(d)).await;
                    continue;
                }
            } else {
                tokio::time::sleep(Duration::from_secs(settings.fetch_interval)).await;
            }
        }
        first = false;
        let previous = publisher.part().map();
        match server.fetch(&settings, &skip, &previous).await {
            Ok((map, c, h)) => {
                retry = None;
                if c == catalog && h == health && c != 0 {
                    publisher.unchanged();
                } else {
                    if let Some(dump) = &settings.dump {
                        fetch::write_dump(dump, &map);
                    }
                    publisher.publish(map);
                }
                if c > 0 {
                    catalog = c;
                }
                if h > 0 {
                    health = h;
                }
            }
            Err(e) => {
                publisher.failed(&e);
                let d = next_retry(retry);
                retry = Some(d);
                tokio::time::sleep(Duration::from_secs(d)).await;
                // Fetch again after the pause, without waiting for a change.
                first = true;
            }
        }
    }
}

impl Consul {
    pub(super) fn start(
        settings: &ConsulSettings,
        env: &DiscoveryEnv,
        publisher: &dyn Fn(&'static str, &Arc<Part>) -> Publisher,
    ) -> Consul {
        let tls = TlsClient::new(env.trusted.clone());
        let mut parts = Vec::new();
        let loaded = settings
            .dump
            .as_ref()
            .filter(|d| d.load_on_init)
            .and_then(|d| fetch::read_dump(d, settings.weight));
        for s in &settings.servers {
            let part = Part::new(s.clone());
            let p = publisher("consul", &part);
            if let Some(map) = &loaded {
                // The dump serves until the server first answers.
                p.publish(map.clone());
            }
            let server = Server {
                base: s.trim_end_matches('/').to_string(),
                token: settings.token.clone(),
                client: HttpClient::with_tls(Executor::new(env.executor.clone()), &tls),
                connect_read: Duration::from_millis(
                    settings.timeout.connect + settings.timeout.read,
                ),
                wait: settings.timeout.wait,
            };
            env.executor.spawn(run(server, settings.clone(), p));
            parts.push(part);
        }
        Consul {
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

    /// Every server's services by name (a later server's list of a name wins, as in APISIX's
    /// shared dict).
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

pub(super) fn nodes_json(map: &HashMap<String, Nodes>) -> Value {
    Value::Object(
        map.iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    Value::Array(v.iter().map(|n| n.to_json()).collect()),
                )
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn health_entries_give_nodes() {
        let body = json!([
            {"Node": {"Address": "10.0.0.9"}, "Service": {"Address": "10.0.0.2", "Port": 8080}},
            {"Node": {"Address": "10.0.0.9"}, "Service": {"Address": "10.0.0.1", "Port": 0}},
            {"Node": {"Address": "10.0.0.9"}, "Service": {"Address": "", "Port": 9000}},
            {"Node": {"Address": "10.0.0.9"}, "Service": {"Address": "10.0.0.2", "Port": 8080}},
            {"Node": {"Address": "10.0.0.9"}}
        ]);
        let nodes = parse_health(&body, 3, "origin").unwrap();
        let got: Vec<_> = nodes
            .iter()
            .map(|n| (n.host.as_str(), n.port, n.weight))
            .collect();
        assert_eq!(
            got,
            [
                ("10.0.0.2", 8080, 3),
                ("10.0.0.1", 80, 3),
                ("10.0.0.9", 9000, 3)
            ]
        );
        let sorted = parse_health(&body, 1, "combine_sort").unwrap();
        assert_eq!(sorted[0].host, "10.0.0.1");
        let by_port = parse_health(&body, 1, "port_sort").unwrap();
        assert_eq!(by_port[0].port, 80);
        assert!(parse_health(&json!({"x": 1}), 1, "origin").is_err());
    }

    #[test]
    fn retry_ladder() {
        let mut d = None;
        let mut seen = Vec::new();
        for _ in 0..7 {
            let n = next_retry(d);
            seen.push(n);
            d = Some(n);
        }
        assert_eq!(seen, [1, 4, 16, 64, 256, 1, 4]);
    }
}
