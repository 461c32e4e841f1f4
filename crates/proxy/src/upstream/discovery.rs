//! Service discovery from registries: APISIX's `consul`, `consul_kv`, `nacos`, `eureka` and
//! `kubernetes` modules (`dns` is [`super::dns`]).
//!
//! Each configured registry runs its client on the executor it is given (never on a worker):
//! blocking queries for Consul, list-and-watch for Kubernetes, polling for Nacos and Eureka.
//! A client publishes whole service maps (service key → node list) into its [`Part`] with an
//! atomic swap and bumps one change counter; the upstreams that use discovery follow that
//! counter from their refresh tasks ([`super::nodes`]) and rebuild their node sets, so the
//! request path reads one atomic pointer, as for DNS. A registry that fails or answers
//! garbage changes nothing: the last good map keeps serving, the failure is logged once per
//! change of outcome and counted in [`DiscoveryMetrics`].

pub mod consul;
pub mod consul_kv;
pub mod eureka;
mod fetch;
pub mod kubernetes;
pub mod nacos;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use ferrisix_config::settings::DiscoverySettings;
use serde_json::{json, Map, Value};

/// One node a registry lists.
#[derive(Clone, Debug, PartialEq)]
pub struct DiscoveredNode {
    /// An address, or a host name (resolved like a domain node).
    pub host: String,
    pub port: u16,
    pub weight: u32,
    pub metadata: Option<Map<String, Value>>,
}

impl DiscoveredNode {
    pub fn new(host: impl Into<String>, port: u16, weight: u32) -> DiscoveredNode {
        DiscoveredNode {
            host: host.into(),
            port,
            weight,
            metadata: None,
        }
    }

    /// As APISIX's dumps show a node.
    pub fn to_json(&self) -> Value {
        let mut v = json!({"host": self.host, "port": self.port, "weight": self.weight});
        if let Some(m) = &self.metadata {
            v["metadata"] = Value::Object(m.clone());
        }
        v
    }

    fn from_json(v: &Value, default_weight: u32) -> Option<DiscoveredNode> {
        Some(DiscoveredNode {
            host: v.get("host")?.as_str()?.to_string(),
            port: u16::try_from(v.get("port")?.as_u64()?).ok()?,
            weight: v
                .get("weight")
                .and_then(Value::as_u64)
                .and_then(|w| u32::try_from(w).ok())
                .unwrap_or(default_weight),
            metadata: v.get("metadata").and_then(Value::as_object).cloned(),
        })
    }
}

/// A service's nodes as published (compared by pointer: a new list is a change).
pub type Nodes = Arc<Vec<DiscoveredNode>>;
/// Service key → nodes.
pub type ServiceMap = HashMap<String, Nodes>;

/// One source of services: a Consul server, a Kubernetes cluster, the Nacos or Eureka hosts.
#[derive(Debug, Default)]
pub struct Part {
    /// The Consul server's URL, the cluster's id, or empty.
    pub id: String,
    map: ArcSwap<ServiceMap>,
    /// A first fetch (or a dump file) has filled the map.
    ready: AtomicBool,
}

impl Part {
    fn new(id: impl Into<String>) -> Arc<Part> {
        Arc::new(Part {
            id: id.into(),
            ..Default::default()
        })
    }

    pub fn map(&self) -> Arc<ServiceMap> {
        self.map.load_full()
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    fn get(&self, key: &str) -> Option<Nodes> {
        self.map.load().get(key).cloned()
    }
}

/// Per registry: fetches, failures and the last error (the control API's `/v1/discovery`).
#[derive(Debug, Default)]
pub struct ModuleStats {
    pub fetches: AtomicU64,
    pub failures: AtomicU64,
    /// Updates published (a change of some service's nodes).
    pub updates: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl ModuleStats {
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The registries' counters, made by the binary and handed in (no process-wide state).
#[derive(Debug, Default)]
pub struct DiscoveryMetrics {
    pub consul: ModuleStats,
    pub consul_kv: ModuleStats,
    pub nacos: ModuleStats,
    pub eureka: ModuleStats,
    pub kubernetes: ModuleStats,
}

impl DiscoveryMetrics {
    pub fn module(&self, name: &str) -> Option<&ModuleStats> {
        Some(match name {
            "consul" => &self.consul,
            "consul_kv" => &self.consul_kv,
            "nacos" => &self.nacos,
            "eureka" => &self.eureka,
            "kubernetes" => &self.kubernetes,
            _ => return None,
        })
    }
}

/// What a client publishes through: its part, the shared change counter and its stats.
#[derive(Clone)]
pub struct Publisher {
    module: &'static str,
    part: Arc<Part>,
    changed: Arc<tokio::sync::watch::Sender<u64>>,
    metrics: Arc<DiscoveryMetrics>,
}

impl Publisher {
    fn stats(&self) -> &ModuleStats {
        self.metrics
            .module(self.module)
            .expect("publishers are made for known modules")
    }

    pub fn part(&self) -> &Arc<Part> {
        &self.part
    }

    /// Replaces the part's services with `map` (unchanged lists keep their pointers, so
    /// upstreams whose nodes did not change are not rebuilt).
    pub fn publish(&self, mut map: ServiceMap) {
        let old = self.part.map.load_full();
        let mut changed = map.len() != old.len();
        for (k, v) in map.iter_mut() {
            match old.get(k) {
                Some(prev) if **prev == **v => *v = prev.clone(),
                _ => changed = true,
            }
        }
        self.stats().fetches.fetch_add(1, Ordering::Relaxed);
        self.recovered();
        let first = !self.part.ready.swap(true, Ordering::AcqRel);
        if changed || first {
            self.part.map.store(Arc::new(map));
            self.stats().updates.fetch_add(1, Ordering::Relaxed);
            self.changed.send_modify(|v| *v += 1);
        }
    }

    /// Changes some services and removes others, keeping the rest (a watch event).
    pub fn update(&self, set: Vec<(String, Option<Nodes>)>) {
        let mut map = (*self.part.map.load_full()).clone();
        for (k, v) in set {
            match v {
                Some(v) => map.insert(k, v),
                None => map.remove(&k),
            };
        }
        self.publish(map);
    }

    /// A fetch succeeded without changes.
    pub fn unchanged(&self) {
        self.stats().fetches.fetch_add(1, Ordering::Relaxed);
        self.recovered();
    }

    fn recovered(&self) {
        let mut last = self
            .stats()
            .last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if last.take().is_some() {
            tracing::info!(discovery = self.module, source = %self.part.id, "registry answers again");
        }
    }

    /// A fetch failed: the last good services stay. Logged when the error differs from the
    /// previous outcome.
    pub fn failed(&self, error: &str) {
        let stats = self.stats();
        stats.failures.fetch_add(1, Ordering::Relaxed);
        let mut last = stats.last_error.lock().unwrap_or_else(|e| e.into_inner());
        if last.as_deref() != Some(error) {
            tracing::warn!(
                discovery = self.module,
                source = %self.part.id,
                error,
                services_kept = self.part.map.load().len(),
                "registry fetch failed; last good nodes kept"
            );
            *last = Some(error.to_string());
        }
    }
}

/// What a registry knows of a service now.
#[derive(Clone, Debug)]
pub enum Lookup {
    Nodes(Nodes),
    /// The registry has not answered yet.
    Pending,
    /// The registry does not list the service (APISIX: "no valid upstream node").
    Missing,
}

/// The configured registries.
pub struct Discovery {
    consul: Option<consul::Consul>,
    consul_kv: Option<consul_kv::ConsulKv>,
    nacos: Option<nacos::Nacos>,
    eureka: Option<eureka::Eureka>,
    kubernetes: Option<kubernetes::Kubernetes>,
    settings: DiscoverySettings,
    changed: Arc<tokio::sync::watch::Sender<u64>>,
    metrics: Arc<DiscoveryMetrics>,
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery").finish_non_exhaustive()
    }
}

impl Default for Discovery {
    fn default() -> Self {
        Discovery {
            consul: None,
            consul_kv: None,
            nacos: None,
            eureka: None,
            kubernetes: None,
            settings: DiscoverySettings::default(),
            changed: Arc::new(tokio::sync::watch::channel(0).0),
            metrics: Default::default(),
        }
    }
}

/// Where the clients run and what they verify TLS against.
#[derive(Clone)]
pub struct DiscoveryEnv {
    pub executor: tokio::runtime::Handle,
    /// The gateway's trusted CA bundle (`None`: the system's).
    pub trusted: Option<Arc<rustls::RootCertStore>>,
    pub metrics: Arc<DiscoveryMetrics>,
}

impl Discovery {
    /// Starts a client for every registry `settings` configures (`dns` is the resolver's).
    pub fn start(settings: &DiscoverySettings, env: DiscoveryEnv) -> Discovery {
        let mut d = Discovery {
            settings: settings.clone(),
            metrics: env.metrics.clone(),
            ..Default::default()
        };
        let publisher = |module: &'static str, part: &Arc<Part>| Publisher {
            module,
            part: part.clone(),
            changed: d.changed.clone(),
            metrics: env.metrics.clone(),
        };
        if let Some(c) = &settings.consul {
            d.consul = Some(consul::Consul::start(c, &env, &publisher));
        }
        if let Some(c) = &settings.consul_kv {
            d.consul_kv = Some(consul_kv::ConsulKv::start(c, &env, &publisher));
        }
        if let Some(c) = &settings.nacos {
            d.nacos = Some(nacos::Nacos::start(c, &env, &publisher));
        }
        if let Some(c) = &settings.eureka {
            d.eureka = Some(eureka::Eureka::start(c, &env, &publisher));
        }
        if let Some(c) = &settings.kubernetes {
            d.kubernetes = Some(kubernetes::Kubernetes::start(c, &env, &publisher));
        }
        if settings.tars.is_some() {
            tracing::warn!("discovery.tars is not built (it reads a MySQL database); upstreams with discovery_type tars are quarantined");
        }
        d
    }

    /// Whether `upstream`'s `discovery_type` is served here (`Err`: why not).
    pub fn check_type(&self, kind: &str) -> Result<(), String> {
        let configured = match kind {
            "consul" => self.consul.is_some(),
            "consul_kv" => self.consul_kv.is_some(),
            "nacos" => self.nacos.is_some(),
            "eureka" => self.eureka.is_some(),
            "kubernetes" => self.kubernetes.is_some(),
            "tars" => return Err("discovery tars is not supported".into()),
            other => return Err(format!("discovery {other} is uninitialized")),
        };
        if configured {
            Ok(())
        } else {
            Err(format!("discovery {kind} is uninitialized"))
        }
    }

    /// Whether `kind` is a registry of this module (not `dns`).
    pub fn is_registry(kind: &str) -> bool {
        matches!(
            kind,
            "consul" | "consul_kv" | "nacos" | "eureka" | "kubernetes"
        )
    }

    /// The nodes of `service_name` in registry `kind` now.
    pub fn nodes(&self, kind: &str, service_name: &str, args: Option<&Value>) -> Lookup {
        match kind {
            "consul" => self.consul.as_ref().map(|c| c.lookup(service_name)),
            "consul_kv" => self.consul_kv.as_ref().map(|c| c.lookup(service_name)),
            "nacos" => self.nacos.as_ref().map(|c| c.lookup(service_name, args)),
            "eureka" => self.eureka.as_ref().map(|c| c.lookup(service_name)),
            "kubernetes" => self.kubernetes.as_ref().map(|c| c.lookup(service_name)),
            _ => None,
        }
        .unwrap_or(Lookup::Missing)
    }

    /// Follows changes of any registry's services.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// `GET /v1/discovery/{name}/dump`, as APISIX's `dump_data` (`None`: not configured).
    pub fn dump(&self, name: &str) -> Option<Value> {
        let config = |v: Option<Value>| v.unwrap_or(Value::Null);
        match name {
            "consul" => self
                .consul
                .as_ref()
                .map(|c| json!({"config": config(c.config()), "services": c.services()})),
            "consul_kv" => self
                .consul_kv
                .as_ref()
                .map(|c| json!({"config": config(c.config()), "services": c.services()})),
            "nacos" => self
                .nacos
                .as_ref()
                .map(|c| json!({"services": c.services()})),
            "eureka" => self
                .eureka
                .as_ref()
                .map(|c| json!({"config": config(c.config()), "services": c.services()})),
            "kubernetes" => self.kubernetes.as_ref().map(|c| c.dump()),
            _ => None,
        }
    }

    /// `GET /v1/discovery/{consul|consul_kv}/show_dump_file`: (status, body).
    pub fn show_dump_file(&self, name: &str) -> Option<(u16, String)> {
        let dump = match name {
            "consul" => self.consul.as_ref().map(|c| c.dump_settings())?,
            "consul_kv" => self.consul_kv.as_ref().map(|c| c.dump_settings())?,
            _ => return None,
        };
        Some(fetch::show_dump_file(dump))
    }

    /// Whether every configured Kubernetes cluster has listed its endpoints once (APISIX's
    /// `check_discovery_ready`, which `/status/ready` asks): `Err` says which is not.
    pub fn check_ready(&self) -> Result<(), String> {
        match &self.kubernetes {
            Some(k) => k.check_ready(),
            None => Ok(()),
        }
    }

    /// The counters and last errors of each configured registry (ferrisix's
    /// `/v1/discovery`).
    pub fn stats(&self) -> Value {
        let mut out = BTreeMap::new();
        for name in ["consul", "consul_kv", "nacos", "eureka", "kubernetes"] {
            if !self.settings.configured(name) {
                continue;
            }
            let Some(s) = self.metrics.module(name) else {
                continue;
            };
            out.insert(
                name,
                json!({
                    "fetches": s.fetches.load(Ordering::Relaxed),
                    "failures": s.failures.load(Ordering::Relaxed),
                    "updates": s.updates.load(Ordering::Relaxed),
                    "last_error": s.last_error(),
                }),
            );
        }
        json!(out)
    }

    pub fn metrics(&self) -> &Arc<DiscoveryMetrics> {
        &self.metrics
    }
}

/// A settings section as JSON (the dumps' `config`).
fn config_json<T: serde::Serialize>(settings: &T) -> Option<Value> {
    serde_json::to_value(settings).ok()
}

/// `metadata` of APISIX's `default_service` as the node it gives.
fn default_node(
    d: Option<&ferrisix_config::settings::discovery::DefaultService>,
    weight: u32,
) -> Option<DiscoveredNode> {
    let d = d?;
    Some(DiscoveredNode {
        host: d.host.clone()?,
        port: d.port.unwrap_or(80),
        weight,
        metadata: d.metadata.as_ref().map(|m| {
            let mut map = Map::new();
            map.insert("fail_timeout".into(), json!(m.fail_timeout));
            map.insert("weight".into(), json!(m.weight));
            map.insert("max_fails".into(), json!(m.max_fails));
            map
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publisher() -> (Publisher, tokio::sync::watch::Receiver<u64>) {
        let (tx, rx) = tokio::sync::watch::channel(0);
        (
            Publisher {
                module: "consul",
                part: Part::new("p"),
                changed: Arc::new(tx),
                metrics: Default::default(),
            },
            rx,
        )
    }

    #[test]
    fn publish_keeps_unchanged_lists_and_counts_changes() {
        let (p, rx) = publisher();
        let a: Nodes = Arc::new(vec![DiscoveredNode::new("10.0.0.1", 80, 1)]);
        p.publish(HashMap::from([("a".to_string(), a.clone())]));
        assert!(p.part.is_ready());
        assert_eq!(*rx.borrow(), 1);
        let first = p.part.get("a").unwrap();
        // The same nodes again: no change, the pointer stays.
        p.publish(HashMap::from([(
            "a".to_string(),
            Arc::new(vec![DiscoveredNode::new("10.0.0.1", 80, 1)]),
        )]));
        assert_eq!(*rx.borrow(), 1);
        assert!(Arc::ptr_eq(&first, &p.part.get("a").unwrap()));
        p.update(vec![("a".into(), None)]);
        assert_eq!(*rx.borrow(), 2);
        assert!(p.part.get("a").is_none());
    }

    #[test]
    fn failures_keep_the_map_and_count() {
        let (p, _rx) = publisher();
        p.publish(HashMap::from([(
            "a".to_string(),
            Arc::new(vec![DiscoveredNode::new("10.0.0.1", 80, 1)]),
        )]));
        p.failed("status 500");
        p.failed("status 500");
        assert_eq!(p.stats().failures.load(Ordering::Relaxed), 2);
        assert_eq!(p.stats().last_error().as_deref(), Some("status 500"));
        assert!(p.part.get("a").is_some());
        p.unchanged();
        assert_eq!(p.stats().last_error(), None);
    }

    #[test]
    fn node_json_round_trip() {
        let v = json!({"host": "10.0.0.2", "port": 8080, "weight": 3, "metadata": {"a": "b"}});
        let n = DiscoveredNode::from_json(&v, 1).unwrap();
        assert_eq!(n.to_json(), v);
        assert!(DiscoveredNode::from_json(&json!({"host": "x", "port": 70000}), 1).is_none());
    }
}
