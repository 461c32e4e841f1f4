//! An upstream's live node set: nodes as resolved (domains and DNS discovery expanded to their
//! addresses), the balancer over them, and each node's health target.
//!
//! The snapshot stays immutable. An upstream of addresses only has one fixed set, borrowed by
//! the request path at no cost; one that names hosts swaps its set (one atomic load per
//! request) when a name's addresses change. A refresh task per upstream with names runs on the
//! resolver's executor, re-resolves each name when its TTL ends and rebuilds the set: unchanged
//! nodes keep their health state (through the checker) and least_conn counts (through the
//! previous picker).
//!
//! Health costs a pick one atomic load while every node is up (the checker's count of down
//! targets); only when some node is down is each candidate's state read.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use ferrisix_config::model::{LbType, PassHost, Upstream};
use http::HeaderValue;

use crate::error::ProxyError;
use crate::upstream::balancer::{
    BalancerEnv, BalancerType, HashOn, NodeWeight, PickState, UpstreamPicker,
};
use crate::upstream::discovery::{Discovery, Lookup, Nodes};
use crate::upstream::dns::{self, DnsResolver, Purpose, Record};
use crate::upstream::health::{HealthService, Target, TargetSpec, UpstreamChecker};

/// What compiling and refreshing upstreams draws on, shared by every snapshot of the process:
/// the health probers' executor, the balancers' shared state, the resolver, and the key prefix
/// that names checkers.
#[derive(Debug)]
pub struct UpstreamServices {
    pub health: HealthService,
    pub balancer: BalancerEnv,
    pub dns: DnsResolver,
    /// The etcd key prefix (`/apisix`), which names health checkers as APISIX does.
    pub prefix: String,
    /// Equal inline upstreams of every snapshot, shared.
    pub inline: crate::snapshot::InlineUpstreams,
    /// The registries of `discovery_type` consul, consul_kv, nacos, eureka and kubernetes.
    pub discovery: Discovery,
}

impl Default for UpstreamServices {
    fn default() -> Self {
        UpstreamServices {
            health: HealthService::default(),
            balancer: BalancerEnv::default(),
            dns: DnsResolver::new(&dns::DnsOptions::default(), None),
            prefix: "/apisix".to_string(),
            inline: Default::default(),
            discovery: Discovery::default(),
        }
    }
}

/// One upstream node as the try loop uses it.
#[derive(Clone, Debug)]
pub struct NodeTarget {
    /// The host as written (a domain for a node given by name).
    pub host: String,
    pub port: u16,
    pub addr: SocketAddr,
    /// `Host` for `pass_host: node`: the node host, plus `:port` unless it is the scheme default.
    pub host_header: HeaderValue,
}

/// The nodes of one upstream as resolved now.
pub struct NodeSet {
    pub nodes: Vec<NodeTarget>,
    pub picker: UpstreamPicker,
    /// Per node, when the upstream is health-checked.
    targets: Vec<Arc<Target>>,
    checker: Option<Arc<UpstreamChecker>>,
    /// Some name has no address yet (its first lookup is under way).
    pub pending: bool,
    /// The records each name had when this set was built.
    answers: HashMap<(Purpose, String), Vec<Record>>,
    /// What the registry listed when this set was built (registry discovery only).
    discovered: Option<Nodes>,
}

impl std::fmt::Debug for NodeSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeSet")
            .field("nodes", &self.nodes.len())
            .field("pending", &self.pending)
            .finish()
    }
}

pub(crate) fn is_ip(host: &str) -> bool {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .is_ok()
}

fn ip_text(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// Whether `up` takes its nodes from a registry (not DNS).
fn from_registry(up: &Upstream) -> bool {
    up.discovery_type
        .as_deref()
        .is_some_and(Discovery::is_registry)
}

/// What the registry lists for `up` now.
fn registry_lookup(up: &Upstream, env: &UpstreamServices) -> Lookup {
    match (&up.discovery_type, &up.service_name) {
        (Some(kind), Some(sn)) => env.discovery.nodes(kind, sn, up.discovery_args.as_deref()),
        _ => Lookup::Missing,
    }
}

/// The host names among a registry's nodes (resolved like domain nodes).
fn registry_names(nodes: Option<&Nodes>) -> Vec<(Purpose, String)> {
    let mut out = Vec::new();
    for n in nodes.into_iter().flat_map(|n| n.iter()) {
        if !is_ip(&n.host) {
            let key = (Purpose::Node, n.host.clone());
            if !out.contains(&key) {
                out.push(key);
            }
        }
    }
    out
}

/// The names an upstream needs resolved.
fn names(up: &Upstream) -> Vec<(Purpose, String)> {
    let mut out = Vec::new();
    if from_registry(up) {
        return out;
    }
    if up.discovery_type.as_deref() == Some("dns") {
        if let Some(sn) = &up.service_name {
            out.push((Purpose::Discovery, discovery_host(sn).0.to_string()));
        }
        return out;
    }
    for n in &up.nodes {
        if !is_ip(&n.host) {
            let key = (Purpose::Node, n.host.clone());
            if !out.contains(&key) {
                out.push(key);
            }
        }
    }
    out
}

/// `service_name` as `host[:port]`.
fn discovery_host(sn: &str) -> (&str, Option<u16>) {
    match sn.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') || h.ends_with(']') => match p.parse() {
            Ok(p) => (h, Some(p)),
            Err(_) => (sn, None),
        },
        _ => (sn, None),
    }
}

fn balancer_type(up: &Upstream) -> BalancerType {
    match &up.lb_type {
        LbType::Chash => BalancerType::Chash(HashOn::from_config(
            up.hash_on.as_deref(),
            up.key.as_deref(),
        )),
        LbType::LeastConn => BalancerType::LeastConn,
        LbType::Ewma => BalancerType::Ewma,
        _ => BalancerType::RoundRobin,
    }
}

impl NodeSet {
    /// Builds the set from `up` and the answers known for its names. `looked_up`: every name
    /// has had a lookup, so one without an answer is a failure, not a lookup under way.
    pub fn build(
        up: &Upstream,
        env: &UpstreamServices,
        checker: Option<&Arc<UpstreamChecker>>,
        previous: Option<&NodeSet>,
        looked_up: bool,
    ) -> Result<NodeSet, String> {
        let mut answers = HashMap::new();
        let mut pending = false;
        let discovered = if from_registry(up) {
            match registry_lookup(up, env) {
                Lookup::Nodes(n) => Some(n),
                Lookup::Pending => {
                    pending = true;
                    None
                }
                Lookup::Missing => None,
            }
        } else {
            None
        };
        let mut names = names(up);
        names.extend(registry_names(discovered.as_ref()));
        for (purpose, name) in names {
            match env.dns.known(purpose, &name) {
                Some(a) => {
                    answers.insert((purpose, name), a.records);
                }
                None => pending |= !looked_up,
            }
        }
        // (host as written, ip, port, weight, priority)
        let mut expanded: Vec<(String, IpAddr, u16, u32, i64)> = Vec::new();
        if let Some(list) = &discovered {
            for n in list.iter() {
                let bare = n.host.trim_start_matches('[').trim_end_matches(']');
                match bare.parse::<IpAddr>() {
                    Ok(ip) => expanded.push((ip_text(ip), ip, n.port, n.weight, 0)),
                    Err(_) => {
                        for r in answers
                            .get(&(Purpose::Node, n.host.clone()))
                            .into_iter()
                            .flatten()
                        {
                            expanded.push((n.host.clone(), r.ip, n.port, n.weight, 0));
                        }
                    }
                }
            }
        } else if up.discovery_type.as_deref() == Some("dns") {
            if let Some(sn) = &up.service_name {
                let (host, port) = discovery_host(sn);
                for r in answers
                    .get(&(Purpose::Discovery, host.to_string()))
                    .into_iter()
                    .flatten()
                {
                    let port = port
                        .or((r.port != 0).then_some(r.port))
                        .unwrap_or(up.scheme.default_port());
                    expanded.push((ip_text(r.ip), r.ip, port, r.weight, r.priority));
                }
            }
        } else {
            for n in &up.nodes {
                let bare = n.host.trim_start_matches('[').trim_end_matches(']');
                match bare.parse::<IpAddr>() {
                    Ok(ip) => expanded.push((n.host.clone(), ip, n.port, n.weight, n.priority)),
                    Err(_) => {
                        for r in answers
                            .get(&(Purpose::Node, n.host.clone()))
                            .into_iter()
                            .flatten()
                        {
                            expanded.push((n.host.clone(), r.ip, n.port, n.weight, n.priority));
                        }
                    }
                }
            }
        }
        let mut nodes = Vec::with_capacity(expanded.len());
        let mut weights = Vec::with_capacity(expanded.len());
        let mut specs = Vec::with_capacity(expanded.len());
        for (host, ip, port, weight, priority) in expanded {
            let host_header = if port == up.scheme.default_port() {
                host.clone()
            } else {
                format!("{host}:{port}")
            };
            let host_header = HeaderValue::from_str(&host_header)
                .map_err(|_| format!("invalid node host {host}"))?;
            weights.push(NodeWeight {
                weight,
                priority,
                host: ip_text(ip),
                port,
            });
            specs.push(TargetSpec {
                ip,
                port,
                domain: (!is_ip(&host)).then(|| host.clone()),
            });
            nodes.push(NodeTarget {
                host,
                port,
                addr: SocketAddr::new(ip, port),
                host_header,
            });
        }
        let picker = UpstreamPicker::new(
            balancer_type(up),
            &weights,
            &env.balancer,
            previous.map(|p| &p.picker),
            |n| {
                if n == 0 {
                    0
                } else {
                    rand::random::<usize>() % n
                }
            },
        );
        let rewrite = (up.pass_host == PassHost::Rewrite)
            .then_some(up.upstream_host.as_deref())
            .flatten();
        let targets = match checker {
            Some(c) => c.sync_targets(&specs, rewrite),
            None => Vec::new(),
        };
        Ok(NodeSet {
            nodes,
            picker,
            targets,
            checker: checker.cloned(),
            pending,
            answers,
            discovered,
        })
    }

    /// The next node for this request: not tried yet, healthy unless no node is healthy
    /// (APISIX then uses them all).
    pub fn pick(
        &self,
        state: &mut PickState<'_>,
        tried: &[usize],
        health: &mut HealthView,
    ) -> Option<usize> {
        let checked = match &self.checker {
            // Every node up (the usual case): health needs no further look.
            Some(c) if !health.ignore && c.any_down() => c,
            _ => return self.picker.pick(state, &|i| !tried.contains(&i)),
        };
        let found = self
            .picker
            .pick(state, &|i| !tried.contains(&i) && self.targets[i].is_up());
        if found.is_some() {
            return found;
        }
        if self.targets.iter().any(|t| t.is_up()) || !checked.any_down() {
            return None;
        }
        health.ignore = true;
        *state = PickState::new(std::mem::take(&mut state.key));
        self.picker.pick(state, &|i| !tried.contains(&i))
    }

    /// How many times `node` went down: pooled connections from before are not reused.
    pub fn down_epoch(&self, node: usize) -> u32 {
        self.targets.get(node).map_or(0, |t| t.down_epoch())
    }

    /// A try on `node` failed and the request goes on to another try.
    pub fn report_retry(&self, node: usize, failure: ProxyError) {
        // APISIX reports before a retry only when the balancer runs: not for one node, except
        // under least_conn, whose balancer always runs.
        if let (Some(c), Some(t)) = (&self.checker, self.targets.get(node)) {
            if self.nodes.len() > 1 || *self.picker.kind() == BalancerType::LeastConn {
                c.report_retried_failure(t, failure);
            }
        }
    }

    /// The status the request's last try on `node` ended with.
    pub fn report_final(&self, node: usize, status: u16) {
        if let (Some(c), Some(t)) = (&self.checker, self.targets.get(node)) {
            c.report_final_status(t, status);
        }
    }
}

/// Per request: whether health was set aside because no node is healthy.
#[derive(Debug, Default)]
pub struct HealthView {
    ignore: bool,
}

/// The node set of one compiled upstream: fixed for an upstream of addresses, swapped by its
/// refresh task for one that names hosts.
pub struct UpstreamNodes {
    sets: Sets,
    changed: tokio::sync::Notify,
}

// The fixed set is read in place on every request (a box would add a pointer chase); there is
// one of these per upstream, so its size does not matter.
#[allow(clippy::large_enum_variant)]
enum Sets {
    Fixed(NodeSet),
    Live(ArcSwap<NodeSet>),
}

impl std::fmt::Debug for UpstreamNodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.load().fmt(f)
    }
}

/// The node set a request uses: borrowed when fixed, held when it may be swapped meanwhile.
pub enum NodeSetRef<'a> {
    Fixed(&'a NodeSet),
    Live(Arc<NodeSet>),
}

impl std::ops::Deref for NodeSetRef<'_> {
    type Target = NodeSet;

    fn deref(&self) -> &NodeSet {
        match self {
            NodeSetRef::Fixed(s) => s,
            NodeSetRef::Live(s) => s,
        }
    }
}

/// What the refresh task needs to rebuild a set.
struct Source {
    config: Upstream,
    checker: Option<Arc<UpstreamChecker>>,
    env: Arc<UpstreamServices>,
}

impl UpstreamNodes {
    /// Builds the first set and, when the upstream names hosts, starts its refresh task.
    pub fn new(
        up: &Upstream,
        env: &Arc<UpstreamServices>,
        checker: Option<&Arc<UpstreamChecker>>,
        previous: Option<&UpstreamNodes>,
    ) -> Result<Arc<UpstreamNodes>, String> {
        let prev = previous.map(UpstreamNodes::load);
        // Without an executor nothing will look names up: an unknown one is just missing.
        let looked_up = env.dns.executor().is_none();
        let set = NodeSet::build(up, env, checker, prev.as_deref(), looked_up)?;
        drop(prev);
        let named = !names(up).is_empty() || from_registry(up);
        let nodes = Arc::new(UpstreamNodes {
            sets: if named {
                Sets::Live(ArcSwap::from_pointee(set))
            } else {
                Sets::Fixed(set)
            },
            changed: tokio::sync::Notify::new(),
        });
        if named {
            if let Some(executor) = env.dns.executor() {
                let source = Source {
                    config: up.clone(),
                    checker: checker.cloned(),
                    env: env.clone(),
                };
                if from_registry(up) {
                    executor.spawn(follow_registry(Arc::downgrade(&nodes), source));
                } else {
                    executor.spawn(refresh(Arc::downgrade(&nodes), source));
                }
            }
        }
        Ok(nodes)
    }

    /// The current set.
    pub fn load(&self) -> NodeSetRef<'_> {
        match &self.sets {
            Sets::Fixed(s) => NodeSetRef::Fixed(s),
            Sets::Live(live) => NodeSetRef::Live(live.load_full()),
        }
    }

    /// The current set, waiting up to `limit` (at most 5 s) for a first resolution when no
    /// node has an address yet (the worker only awaits; the lookup runs on the resolver's
    /// executor).
    pub async fn ready(&self, limit: Duration) -> NodeSetRef<'_> {
        let limit = limit.min(Duration::from_secs(5));
        let set = self.load();
        if !(set.pending && set.nodes.is_empty()) {
            return set;
        }
        let notified = self.changed.notified();
        let set = self.load();
        if !(set.pending && set.nodes.is_empty()) {
            return set;
        }
        drop(set);
        let _ = tokio::time::timeout(limit, notified).await;
        self.load()
    }
}

async fn refresh(nodes: Weak<UpstreamNodes>, source: Source) {
    let names = names(&source.config);
    loop {
        let mut next = None::<std::time::Instant>;
        let mut answers = HashMap::new();
        for (purpose, name) in &names {
            let result = source.env.dns.resolve(*purpose, name).await;
            let known = source.env.dns.known(*purpose, name);
            let at = dns::next_refresh(known.as_ref(), result.is_err());
            next = Some(next.map_or(at, |n: std::time::Instant| n.min(at)));
            if let Some(a) = known {
                answers.insert((*purpose, name.clone()), a.records);
            }
        }
        let Some(live) = nodes.upgrade() else {
            return;
        };
        let Sets::Live(slot) = &live.sets else {
            return;
        };
        let current = slot.load_full();
        if answers != current.answers || current.pending {
            match NodeSet::build(
                &source.config,
                &source.env,
                source.checker.as_ref(),
                Some(&current),
                true,
            ) {
                Ok(set) => {
                    slot.store(Arc::new(set));
                    live.changed.notify_waiters();
                }
                Err(e) => tracing::warn!(error = %e, "upstream nodes not rebuilt"),
            }
        }
        drop(live);
        let wait = next
            .map(|n| n.saturating_duration_since(std::time::Instant::now()))
            .unwrap_or(Duration::from_secs(5));
        tokio::time::sleep(wait).await;
    }
}

/// The refresh task of an upstream whose nodes come from a registry: rebuilds its set when the
/// registry's list for its service changes (and resolves the host names the list has).
async fn follow_registry(nodes: Weak<UpstreamNodes>, source: Source) {
    let mut changes = source.env.discovery.subscribe();
    loop {
        changes.borrow_and_update();
        let lookup = registry_lookup(&source.config, &source.env);
        let list = match &lookup {
            Lookup::Nodes(n) => Some(n.clone()),
            _ => None,
        };
        let mut resolved = HashMap::new();
        for (purpose, name) in registry_names(list.as_ref()) {
            let _ = source.env.dns.resolve(purpose, &name).await;
            if let Some(a) = source.env.dns.known(purpose, &name) {
                resolved.insert((purpose, name), a.records);
            }
        }
        let Some(live) = nodes.upgrade() else {
            return;
        };
        let Sets::Live(slot) = &live.sets else {
            return;
        };
        let current = slot.load_full();
        let same_list = match (&current.discovered, &list) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        let pending = matches!(lookup, Lookup::Pending);
        if !same_list || resolved != current.answers || current.pending != pending {
            match NodeSet::build(
                &source.config,
                &source.env,
                source.checker.as_ref(),
                Some(&current),
                true,
            ) {
                Ok(set) => {
                    slot.store(Arc::new(set));
                    live.changed.notify_waiters();
                }
                Err(e) => tracing::warn!(error = %e, "upstream nodes not rebuilt"),
            }
        }
        drop(live);
        // Host names among the nodes are looked up again while nothing changes.
        let recheck = if resolved.is_empty() {
            Duration::from_secs(3600)
        } else {
            Duration::from_secs(30)
        };
        if let Ok(Err(_)) = tokio::time::timeout(recheck, changes.changed()).await {
            return;
        }
    }
}
