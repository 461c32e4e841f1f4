//! `discovery.kubernetes`: Endpoints (or, with `watch_endpoint_slices`, EndpointSlices) of one
//! cluster or of several, followed with the API server's list-and-watch protocol.
//!
//! As APISIX's informer: a paged list (`limit=120`, `continue`), then watches from the list's
//! `resourceVersion` (`watch=true&allowWatchBookmarks=true&timeoutSeconds=…`), each event a
//! line of JSON; `BOOKMARK`s move the version on, an `ERROR` event with code 410 (the version
//! is gone) lists again at once. A list replaces everything the cluster had (so what was
//! deleted while the watch was down goes away); a failed list or watch keeps the last good
//! endpoints. Only ready addresses are used (an Endpoints subset's `addresses`, an
//! EndpointSlice endpoint whose `conditions.ready` is true). The bearer token is `client.token`,
//! or read from `client.token_file` for each request (so a rotated token is picked up).
//! `namespace_selector.equal`/`not_equal` become a field selector, `match`/`not_match` are
//! regular expressions the namespace must (not) match in full; `label_selector` is passed on.
//!
//! `service_name` is `<namespace>/<name>:<port name>` (one cluster) or
//! `<id>/<namespace>/<name>:<port name>` (several); a port without a name is named by its
//! `targetPort`, else its number. Until every cluster has listed once, `/status/ready`
//! answers 503 "kubernetes discovery not ready" (APISIX 3.15's readiness check).
//!
//! Beyond APISIX, which waits 40 seconds after any failure: the first retry after a working
//! period comes after one second, later ones after 40.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_config::settings::discovery::{KubernetesCluster, KubernetesSettings};
use ferrisix_plugin_api::{Executor, HttpClient, TlsClient};
use http::Request;
use http_body_util::BodyExt;
use serde_json::{json, Value};

use super::fetch::enc;
use super::{DiscoveredNode, DiscoveryEnv, Lookup, Nodes, Part, Publisher};

/// APISIX's page size.
const LIST_LIMIT: u32 = 120;
const RETRY_LATER: Duration = Duration::from_secs(40);
const RETRY_FIRST: Duration = Duration::from_secs(1);
const CA_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

pub struct Kubernetes {
    /// (id, part) per cluster; one cluster without an id in the single form.
    clusters: Vec<Arc<Part>>,
    multiple: bool,
    settings: KubernetesSettings,
}

/// `${NAME}` from the environment, else the text itself.
fn read_env(v: &str) -> Result<String, String> {
    if v.len() > 3 && v.starts_with("${") && v.ends_with('}') {
        let name = &v[2..v.len() - 1];
        return std::env::var(name).map_err(|_| format!("not found environment variable {name}"));
    }
    Ok(v.to_string())
}

/// A port map: port name → nodes (sorted by host, then port).
type PortMap = HashMap<String, Vec<DiscoveredNode>>;

fn port_name(p: &Value) -> Option<String> {
    if let Some(n) = p.get("name").and_then(Value::as_str) {
        return Some(n.to_string());
    }
    if let Some(t) = p.get("targetPort") {
        return Some(match t {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        });
    }
    p.get("port").map(|v| v.to_string())
}

fn sorted(mut m: PortMap) -> PortMap {
    for nodes in m.values_mut() {
        nodes.sort_by(|a, b| (&a.host, a.port).cmp(&(&b.host, b.port)));
    }
    m
}

/// An Endpoints object's ready addresses by port name.
pub(super) fn endpoints_ports(obj: &Value, weight: u32) -> PortMap {
    let mut out = PortMap::new();
    for subset in obj
        .get("subsets")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(addresses) = subset.get("addresses").and_then(Value::as_array) else {
            continue;
        };
        for port in subset
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let (Some(name), Some(number)) = (
                port_name(port),
                port.get("port")
                    .and_then(Value::as_u64)
                    .and_then(|p| u16::try_from(p).ok()),
            ) else {
                continue;
            };
            let nodes = out.entry(name).or_default();
            for a in addresses {
                if let Some(ip) = a.get("ip").and_then(Value::as_str) {
                    nodes.push(DiscoveredNode::new(ip, number, weight));
                }
            }
        }
    }
    sorted(out)
}

/// An EndpointSlice's ready endpoints by port name.
pub(super) fn slice_ports(obj: &Value, weight: u32) -> PortMap {
    let mut out = PortMap::new();
    for ep in obj
        .get("endpoints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let ready = ep.pointer("/conditions/ready").and_then(Value::as_bool) == Some(true);
        let Some(addresses) = ep.get("addresses").and_then(Value::as_array) else {
            continue;
        };
        if !ready {
            continue;
        }
        for port in obj
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let (Some(name), Some(number)) = (
                port_name(port),
                port.get("port")
                    .and_then(Value::as_u64)
                    .and_then(|p| u16::try_from(p).ok()),
            ) else {
                continue;
            };
            let nodes = out.entry(name).or_default();
            for a in addresses.iter().filter_map(Value::as_str) {
                nodes.push(DiscoveredNode::new(a, number, weight));
            }
        }
    }
    out
}

/// The namespace filter applied to objects (the equal/not_equal forms are a field selector).
enum NsFilter {
    All,
    Match(Vec<regex::Regex>),
    NotMatch(Vec<regex::Regex>),
}

impl NsFilter {
    fn allows(&self, ns: &str) -> bool {
        match self {
            NsFilter::All => true,
            NsFilter::Match(r) => r.iter().any(|r| r.is_match(ns)),
            NsFilter::NotMatch(r) => !r.iter().any(|r| r.is_match(ns)),
        }
    }
}

/// One cluster's state as the informer keeps it.
struct Informer {
    slices: bool,
    weight: u32,
    filter: NsFilter,
    /// "ns/name" → port map (Endpoints), or "ns/service" → slice name → port map.
    endpoints: HashMap<String, PortMap>,
    slice_maps: HashMap<String, HashMap<String, PortMap>>,
}

fn meta<'a>(obj: &'a Value, k: &str) -> Option<&'a str> {
    obj.pointer(&format!("/metadata/{k}"))
        .and_then(Value::as_str)
}

impl Informer {
    /// Applies one object (added, modified or deleted): the endpoint key it changed and its
    /// new port map (empty: gone).
    fn apply(&mut self, obj: &Value, deleted: bool) -> Option<(String, PortMap)> {
        let ns = meta(obj, "namespace")?;
        if !self.filter.allows(ns) {
            return None;
        }
        if self.slices {
            let slice = meta(obj, "name")?;
            let svc = obj
                .pointer("/metadata/labels/kubernetes.io~1service-name")
                .and_then(Value::as_str);
            let Some(svc) = svc else {
                tracing::error!(slice, "endpoint_slice has no service-name");
                return None;
            };
            let key = format!("{ns}/{svc}");
            let slices = self.slice_maps.entry(key.clone()).or_default();
            if deleted {
                slices.remove(slice);
            } else {
                slices.insert(slice.to_string(), slice_ports(obj, self.weight));
            }
            let mut merged = PortMap::new();
            for m in slices.values() {
                for (p, nodes) in m {
                    merged
                        .entry(p.clone())
                        .or_default()
                        .extend(nodes.iter().cloned());
                }
            }
            if slices.is_empty() {
                self.slice_maps.remove(&key);
            }
            let merged = sorted(merged);
            self.endpoints.insert(key.clone(), merged.clone());
            Some((key, merged))
        } else {
            let name = meta(obj, "name")?;
            let key = format!("{ns}/{name}");
            if deleted {
                self.endpoints.remove(&key);
                Some((key, PortMap::new()))
            } else {
                let m = endpoints_ports(obj, self.weight);
                self.endpoints.insert(key.clone(), m.clone());
                Some((key, m))
            }
        }
    }

    fn clear(&mut self) {
        self.endpoints.clear();
        self.slice_maps.clear();
    }

    /// Everything as published keys (`ns/name:port`).
    fn all(&self) -> super::ServiceMap {
        let mut out = super::ServiceMap::new();
        for (k, ports) in &self.endpoints {
            for (p, nodes) in ports {
                out.insert(format!("{k}:{p}"), Arc::new(nodes.clone()));
            }
        }
        out
    }
}

struct ApiServer {
    base: String,
    token: Option<String>,
    token_file: Option<String>,
    ssl_verify: bool,
    client: HttpClient,
    path: &'static str,
    list_kind: &'static str,
    label_selector: Option<String>,
    field_selector: Option<String>,
}

impl ApiServer {
    fn token(&self) -> String {
        if let Some(t) = &self.token {
            return t.clone();
        }
        match self.token_file.as_deref().map(read_env) {
            Some(Ok(path)) => match std::fs::read_to_string(&path) {
                Ok(t) => t.trim().to_string(),
                Err(e) => {
                    tracing::error!(path, error = %e, "failed to read token from file");
                    String::new()
                }
            },
            Some(Err(e)) => {
                tracing::error!(error = %e, "failed to read token file path");
                String::new()
            }
            None => String::new(),
        }
    }

    fn selectors(&self) -> String {
        let mut q = String::new();
        if let Some(l) = self.label_selector.as_deref().filter(|l| !l.is_empty()) {
            q.push_str(&format!("&labelSelector={}", enc(l)));
        }
        if let Some(f) = &self.field_selector {
            q.push_str(&format!("&fieldSelector={}", enc(f)));
        }
        q
    }

    fn request(&self, query: &str) -> Result<Request<Bytes>, String> {
        Request::get(format!("{}{}?{query}", self.base, self.path))
            .header("Authorization", format!("Bearer {}", self.token()))
            .header("Accept", "application/json")
            .body(Bytes::new())
            .map_err(|e| e.to_string())
    }

    /// Every page of the list: the objects and the list's resourceVersion.
    async fn list(&self) -> Result<(Vec<Value>, String), String> {
        let mut items = Vec::new();
        let mut cont = String::new();
        loop {
            let mut q = format!("limit={LIST_LIMIT}");
            if !cont.is_empty() {
                q.push_str(&format!("&continue={}", enc(&cont)));
            }
            q.push_str(&self.selectors());
            let resp = self
                .client
                .send_verified(self.request(&q)?, Duration::from_secs(30), self.ssl_verify)
                .await
                .map_err(|e| format!("RequestError: {e}"))?;
            if resp.status() != 200 {
                return Err(format!(
                    "list answered {}: {}",
                    resp.status(),
                    String::from_utf8_lossy(resp.body())
                ));
            }
            let data: Value =
                serde_json::from_slice(resp.body()).map_err(|e| format!("UnexpectedBody: {e}"))?;
            if data.get("kind").and_then(Value::as_str) != Some(self.list_kind) {
                return Err(format!("UnexpectedBody: kind is not {}", self.list_kind));
            }
            items.extend(
                data.get("items")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .cloned(),
            );
            let version = meta(&data, "resourceVersion").unwrap_or("").to_string();
            cont = meta(&data, "continue").unwrap_or("").to_string();
            if cont.is_empty() {
                return Ok((items, version));
            }
        }
    }
}

/// How a watch ended.
enum WatchEnd {
    /// The server ended the stream (its timeout): watch again from the version.
    Closed,
    /// 410: list again.
    Gone,
}

struct Cluster {
    api: ApiServer,
    informer: Informer,
    publisher: Publisher,
    prefix: String,
    /// Failures since the last good list (the first retry comes sooner).
    failures: u32,
}

impl Cluster {
    fn publish_all(&self) {
        self.publisher.publish(self.informer.all());
    }

    /// Publishes one endpoint's new port map, removing the ports it no longer has.
    fn publish_one(&self, key: &str, ports: &PortMap) {
        let part = self.publisher.part().map();
        let head = format!("{key}:");
        let mut set: Vec<(String, Option<Nodes>)> = part
            .keys()
            .filter(|k| k.starts_with(&head) && !ports.contains_key(&k[head.len()..]))
            .map(|k| (k.clone(), None))
            .collect();
        for (p, nodes) in ports {
            set.push((format!("{key}:{p}"), Some(Arc::new(nodes.clone()))));
        }
        if !set.is_empty() {
            self.publisher.update(set);
        }
    }

    /// One event line; `Err` for an unexpected body.
    fn event(&mut self, line: &[u8], version: &mut String) -> Result<Option<WatchEnd>, String> {
        let ev: Value = serde_json::from_slice(line).map_err(|e| format!("UnexpectedBody: {e}"))?;
        let (Some(tp), Some(obj)) = (ev.get("type").and_then(Value::as_str), ev.get("object"))
        else {
            return Err("UnexpectedBody: event without type or object".into());
        };
        if tp == "ERROR" {
            if obj.get("code").and_then(Value::as_u64) == Some(410) {
                return Ok(Some(WatchEnd::Gone));
            }
            return Err(format!("watch error event: {obj}"));
        }
        if let Some(v) = meta(obj, "resourceVersion") {
            *version = v.to_string();
        }
        let deleted = match tp {
            "ADDED" | "MODIFIED" => false,
            "DELETED" => true,
            _ => return Ok(None), // BOOKMARK: only the version moves.
        };
        if let Some((key, ports)) = self.informer.apply(obj, deleted) {
            self.publish_one(&key, &ports);
        }
        Ok(None)
    }

    async fn watch(&mut self, version: &mut String) -> Result<WatchEnd, String> {
        let seconds = 1800 + rand::random::<u64>() % 990 + 9;
        let mut q = format!("watch=true&allowWatchBookmarks=true&timeoutSeconds={seconds}");
        if !version.is_empty() {
            q.push_str(&format!("&resourceVersion={}", enc(version)));
        }
        q.push_str(&self.api.selectors());
        let resp = self
            .api
            .client
            .send_streaming(
                self.api.request(&q)?,
                Duration::from_secs(5),
                self.api.ssl_verify,
            )
            .await
            .map_err(|e| format!("RequestError: {e}"))?;
        if resp.status() != 200 {
            let status = resp.status();
            if status == 410 {
                return Ok(WatchEnd::Gone);
            }
            return Err(format!("watch answered {status}"));
        }
        let mut body = resp.into_body();
        let mut buf: Vec<u8> = Vec::new();
        let idle = Duration::from_secs(seconds + 120);
        loop {
            let frame = match tokio::time::timeout(idle, body.frame()).await {
                Err(_) => return Err("ReadBodyError: timeout".into()),
                Ok(None) => return Ok(WatchEnd::Closed),
                Ok(Some(Err(e))) => return Err(format!("ReadBodyError: {e}")),
                Ok(Some(Ok(f))) => f,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buf.extend_from_slice(&data);
            while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                let line = line.trim_ascii();
                if line.is_empty() {
                    continue;
                }
                if let Some(end) = self.event(line, version)? {
                    return Ok(end);
                }
            }
        }
    }

    /// List, publish, then watch until something fails (`Err`) or the version is gone.
    async fn list_watch(&mut self) -> Result<(), String> {
        let (items, mut version) = self
            .api
            .list()
            .await
            .map_err(|e| format!("list failed: {e}"))?;
        self.informer.clear();
        for obj in &items {
            self.informer.apply(obj, false);
        }
        self.publish_all();
        self.failures = 0;
        // APISIX watches 8 times from one list, then lists again.
        for _ in 0..8 {
            match self
                .watch(&mut version)
                .await
                .map_err(|e| format!("watch failed: {e}"))?
            {
                WatchEnd::Closed => continue,
                WatchEnd::Gone => {
                    tracing::info!(cluster = %self.prefix, "watch: resource version gone, listing again");
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

async fn run(mut cluster: Cluster) {
    loop {
        if let Err(e) = cluster.list_watch().await {
            cluster.publisher.failed(&e);
            cluster.failures += 1;
            let pause = if cluster.failures == 1 {
                RETRY_FIRST
            } else {
                RETRY_LATER
            };
            tokio::time::sleep(pause).await;
        }
    }
}

fn roots(env: &DiscoveryEnv) -> Option<Arc<rustls::RootCertStore>> {
    let Ok(text) = std::fs::read_to_string(CA_FILE) else {
        return env.trusted.clone();
    };
    let mut store = match &env.trusted {
        Some(r) => (**r).clone(),
        None => ferrisix_tls::settings::system_roots(),
    };
    match ferrisix_config::pem::parse_certs(&text) {
        Ok(certs) => {
            store.add_parsable_certificates(certs);
        }
        Err(e) => tracing::warn!(path = CA_FILE, error = %e, "kubernetes CA not read"),
    }
    Some(Arc::new(store))
}

fn start_cluster(
    c: &KubernetesCluster,
    env: &DiscoveryEnv,
    tls: &TlsClient,
    part: &Arc<Part>,
    publisher: Publisher,
) -> Result<(), String> {
    let host = read_env(&c.service.host)?;
    if host.is_empty() {
        return Err("service.host should set to non-empty string".into());
    }
    let port = read_env(&c.service.port)?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("invalid port value: {port}"))?;
    let token = match &c.client.token {
        Some(t) => Some(read_env(t)?.trim().to_string()),
        None => None,
    };
    if token.is_none() && c.client.token_file.as_deref().is_none_or(str::is_empty) {
        return Err("one of [client.token,client.token_file] should be set but none".into());
    }
    if c.service.schema == "https" && token.as_deref() == Some("") {
        return Err(
            "apiserver.token should set to non-empty string when service.schema is https".into(),
        );
    }
    let (mut field_selector, mut filter) = (None, NsFilter::All);
    if let Some(ns) = &c.namespace_selector {
        let compile = |list: &Vec<String>| {
            list.iter()
                .filter_map(|p| regex::Regex::new(&format!("^(?:{p})$")).ok())
                .collect()
        };
        if let Some(e) = &ns.equal {
            field_selector = Some(format!("metadata.namespace={e}"));
        } else if let Some(e) = &ns.not_equal {
            field_selector = Some(format!("metadata.namespace!={e}"));
        } else if let Some(m) = &ns.r#match {
            filter = NsFilter::Match(compile(m));
        } else if let Some(m) = &ns.not_match {
            filter = NsFilter::NotMatch(compile(m));
        }
    }
    let (path, list_kind) = if c.watch_endpoint_slices {
        (
            "/apis/discovery.k8s.io/v1/endpointslices",
            "EndpointSliceList",
        )
    } else {
        ("/api/v1/endpoints", "EndpointsList")
    };
    let bracketed = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.clone()
    };
    let cluster = Cluster {
        api: ApiServer {
            base: format!("{}://{bracketed}:{port}", c.service.schema),
            token,
            token_file: c.client.token_file.clone(),
            ssl_verify: c.service.ssl_verify.unwrap_or(false),
            client: HttpClient::with_tls(Executor::new(env.executor.clone()), tls),
            path,
            list_kind,
            label_selector: c.label_selector.clone(),
            field_selector,
        },
        informer: Informer {
            slices: c.watch_endpoint_slices,
            weight: c.default_weight,
            filter,
            endpoints: HashMap::new(),
            slice_maps: HashMap::new(),
        },
        publisher,
        prefix: part.id.clone(),
        failures: 0,
    };
    env.executor.spawn(run(cluster));
    Ok(())
}

impl Kubernetes {
    pub(super) fn start(
        settings: &KubernetesSettings,
        env: &DiscoveryEnv,
        publisher: &dyn Fn(&'static str, &Arc<Part>) -> Publisher,
    ) -> Kubernetes {
        let tls = TlsClient::new(roots(env));
        let (list, multiple): (Vec<&KubernetesCluster>, bool) = match settings {
            KubernetesSettings::Single(c) => (vec![&**c], false),
            KubernetesSettings::Multiple(l) => (l.iter().collect(), true),
        };
        let mut clusters = Vec::new();
        for c in list {
            let part = Part::new(c.id.clone().unwrap_or_default());
            if let Err(e) = start_cluster(c, env, &tls, &part, publisher("kubernetes", &part)) {
                // APISIX fails the worker's start; here the cluster is not watched and its
                // services have no nodes, which the log says.
                tracing::error!(cluster = %part.id, error = %e, "kubernetes discovery not started");
                publisher("kubernetes", &part).failed(&e);
            }
            clusters.push(part);
        }
        Kubernetes {
            clusters,
            multiple,
            settings: settings.clone(),
        }
    }

    pub(super) fn lookup(&self, service_name: &str) -> Lookup {
        let (part, key) = if self.multiple {
            // id/namespace/name:port, the id the shortest leading segment that leaves a
            // namespace/name:port.
            let Some((id, rest)) = service_name.split_once('/') else {
                tracing::error!(service_name, "get unexpected upstream service_name");
                return Lookup::Missing;
            };
            match self.clusters.iter().find(|p| p.id == id) {
                Some(p) => (p, rest),
                None => {
                    tracing::error!(service_name, "id not exist");
                    return Lookup::Missing;
                }
            }
        } else {
            (&self.clusters[0], service_name)
        };
        if !key.contains(':') {
            tracing::error!(service_name, "get unexpected upstream service_name");
            return Lookup::Missing;
        }
        match part.get(key) {
            Some(n) => Lookup::Nodes(n),
            None if part.is_ready() => Lookup::Missing,
            None => Lookup::Pending,
        }
    }

    pub(super) fn check_ready(&self) -> Result<(), String> {
        if self.clusters.iter().all(|p| p.is_ready()) {
            Ok(())
        } else {
            Err("kubernetes discovery not ready".into())
        }
    }

    /// APISIX's dump: `{"config": …, "endpoints": [{"id"?, "endpoints": [{"name":
    /// "ns/name", "value": "<the port map as JSON text>"}]}]}`.
    pub(super) fn dump(&self) -> Value {
        let mut eps = Vec::new();
        for p in &self.clusters {
            let mut by_name: HashMap<String, serde_json::Map<String, Value>> = HashMap::new();
            for (k, nodes) in p.map().iter() {
                if let Some((name, port)) = k.rsplit_once(':') {
                    by_name.entry(name.to_string()).or_default().insert(
                        port.to_string(),
                        Value::Array(nodes.iter().map(|n| n.to_json()).collect()),
                    );
                }
            }
            let mut list: Vec<Value> = by_name
                .into_iter()
                .map(|(name, ports)| json!({"name": name, "value": Value::Object(ports).to_string()}))
                .collect();
            list.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
            let mut entry = json!({"endpoints": list});
            if self.multiple {
                entry["id"] = json!(p.id);
            }
            eps.push(entry);
        }
        json!({"config": super::config_json(&self.settings), "endpoints": eps})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_ready_addresses_by_port_name() {
        let obj = json!({"metadata": {"namespace": "ns", "name": "svc"}, "subsets": [
            {"addresses": [{"ip": "10.0.0.2"}, {"ip": "10.0.0.1"}],
             "notReadyAddresses": [{"ip": "10.0.0.9"}],
             "ports": [{"name": "http", "port": 80}, {"port": 8080, "targetPort": 8080}, {"port": 9090}]}
        ]});
        let m = endpoints_ports(&obj, 50);
        let hosts: Vec<_> = m["http"]
            .iter()
            .map(|n| (n.host.as_str(), n.port, n.weight))
            .collect();
        assert_eq!(hosts, [("10.0.0.1", 80, 50), ("10.0.0.2", 80, 50)]);
        assert_eq!(m["8080"].len(), 2);
        assert_eq!(m["9090"][0].port, 9090);
        assert_eq!(m.len(), 3);
    }

    #[test]
    fn slices_merge_and_readiness() {
        let mut inf = Informer {
            slices: true,
            weight: 1,
            filter: NsFilter::Match(vec![regex::Regex::new("^(?:ns.*)$").unwrap()]),
            endpoints: HashMap::new(),
            slice_maps: HashMap::new(),
        };
        let slice = |name: &str, ip: &str, ready: bool| {
            json!({"metadata": {"namespace": "ns1", "name": name, "labels": {"kubernetes.io/service-name": "svc"}},
                   "endpoints": [{"addresses": [ip], "conditions": {"ready": ready}}],
                   "ports": [{"name": "http", "port": 80}]})
        };
        inf.apply(&slice("a", "10.0.0.1", true), false);
        let (_, m) = inf.apply(&slice("b", "10.0.0.2", true), false).unwrap();
        assert_eq!(m["http"].len(), 2);
        let (_, m) = inf.apply(&slice("b", "10.0.0.2", false), false).unwrap();
        assert_eq!(m["http"].len(), 1);
        let (key, m) = inf.apply(&slice("a", "10.0.0.1", true), true).unwrap();
        assert_eq!(key, "ns1/svc");
        assert!(m.get("http").is_none_or(|n| n.is_empty()));
        let other = json!({"metadata": {"namespace": "kube-system", "name": "x", "labels": {"kubernetes.io/service-name": "svc"}}});
        assert!(inf.apply(&other, false).is_none());
        let unlabelled = json!({"metadata": {"namespace": "ns1", "name": "x"}});
        assert!(inf.apply(&unlabelled, false).is_none());
    }

    #[test]
    fn env_references() {
        assert_eq!(read_env("example.com").unwrap(), "example.com");
        assert!(read_env("${FERRISIX_SURELY_UNSET_VAR}").is_err());
        assert_eq!(read_env("${PATH}").unwrap(), std::env::var("PATH").unwrap());
    }
}
