//! Compiling a store's `ConfigState` into the immutable `Snapshot` the request path reads.
//!
//! Each resource is validated on its own. One that fails is quarantined: it is logged, left
//! out, and if an earlier version of it was accepted, that version keeps serving (as APISIX
//! keeps the older valid item). Nothing else is held back. Unchanged resources reuse their
//! previous compiled form, so a balancer keeps its position across unrelated changes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use ferrisix_config::model::{
    GlobalRule, LbType, PassHost, PluginConfig, ResourceKind, Route, Scheme, Service, Timeout,
    Upstream,
};
use ferrisix_config::state::{ConfigState, StoredItem};
use ferrisix_config::validate::{self, PluginCheck};
use ferrisix_config::vars::compile_vars;
use ferrisix_plugins::{
    CompileEnv, GlobalChains, GlobalRules, Owner, PluginChain, PluginSource, RouteInfo,
};
use ferrisix_router::{Expr, MethodSet, RouteEntry, RouteTable, RouterKind};
use http::{HeaderValue, StatusCode};
use ipnet::IpNet;
use serde_json::{Map, Value};

use crate::balancer::HashOn;
use crate::client::{PoolLimits, TryTimeouts};
use crate::health::{self, UpstreamChecker};
use crate::upstream::{NodeSet, UpstreamEnv, UpstreamNodes};

/// The published, immutable serving state.
pub struct Snapshot {
    pub revision: i64,
    pub router: RouteTable<Arc<CompiledRoute>>,
    pub upstreams: HashMap<String, Arc<CompiledUpstream>>,
    pub quarantine: Vec<Quarantined>,
    /// The global rules' plugins for requests that match no route.
    pub global_chain: Arc<PluginChain>,
    /// Every health checker in use, by the resource holding the upstream.
    pub checkers: Vec<CheckerEntry>,
    /// What upstreams compile and refresh with, handed from snapshot to snapshot.
    pub env: Arc<UpstreamEnv>,
    cache: CompileCache,
}

/// A health checker and the resource whose upstream it checks.
#[derive(Clone, Debug)]
pub struct CheckerEntry {
    pub kind: ResourceKind,
    pub id: String,
    pub checker: Arc<UpstreamChecker>,
}

/// A resource left out of (or held at an older version in) the snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quarantined {
    pub kind: ResourceKind,
    pub id: String,
    pub error: String,
    /// An earlier accepted version keeps serving.
    pub serving_previous: bool,
}

/// Where a matched route sends its requests.
#[derive(Clone)]
pub enum RouteTarget {
    Upstream(Arc<CompiledUpstream>),
    /// APISIX ends such requests with nginx's page for this status (spec data-plane §2.5).
    Fail(StatusCode),
}

/// A route as the request path needs it: merged with its service and plugin config, its
/// upstream resolved.
pub struct CompiledRoute {
    pub id: String,
    /// The id shared with access-log records, so logging a request copies a pointer.
    pub log_id: Arc<str>,
    pub name: Option<String>,
    pub service_id: Option<String>,
    pub service_name: Option<String>,
    pub target: RouteTarget,
    /// The route's own `timeout`, which replaces the upstream's.
    pub timeout: Option<TryTimeouts>,
    pub enable_websocket: bool,
    /// Effective plugins after the plugin_config and service merges (run by the plugins crate).
    pub plugins: Map<String, Value>,
    /// The route as plugins see it.
    pub info: RouteInfo,
    /// False when APISIX ends the request before any plugin runs (the route's service or
    /// plugin_config is missing); only the global rules' log phase runs then.
    pub plugins_run: bool,
    /// `plugins` compiled, highest priority first.
    pub chain: Arc<PluginChain>,
    /// The global rules as they run for this route (`prefer_route` applied).
    pub global_chain: Arc<PluginChain>,
}

pub use crate::upstream::NodeTarget;

pub struct CompiledUpstream {
    pub id: Option<String>,
    /// The resource's etcd key (`/apisix/upstreams/1`, `/apisix/routes/1` for an inline one),
    /// which names its health checker.
    pub name: String,
    /// The nodes as resolved now, with their balancer.
    pub nodes: Arc<UpstreamNodes>,
    pub checker: Option<Arc<UpstreamChecker>>,
    /// chash's key source.
    pub hash_on: Option<HashOn>,
    /// `None` means APISIX's default: number of nodes − 1.
    pub retries: Option<u32>,
    pub retry_timeout: Option<Duration>,
    pub timeouts: TryTimeouts,
    pub pass_host: PassHost,
    pub upstream_host: Option<HeaderValue>,
    pub pool: PoolLimits,
    source: Upstream,
}

impl CompiledUpstream {
    /// Total tries allowed for a request on `set`: `retries` + 1.
    pub fn max_tries(&self, set: &NodeSet) -> usize {
        match self.retries {
            Some(r) => r as usize + 1,
            None => set.nodes.len().max(1),
        }
    }

    /// `previous`: the compiled form this one replaces for the same resource, whose health
    /// checker and balancer state carry over.
    fn compile(
        up: &Upstream,
        kind: ResourceKind,
        id: &str,
        previous: Option<&Arc<CompiledUpstream>>,
        env: &Arc<UpstreamEnv>,
    ) -> Result<CompiledUpstream, String> {
        if up.scheme != Scheme::Http {
            // TLS, gRPC and L4 upstreams need the TLS and stream work that comes later.
            return Err(format!(
                "upstream scheme {:?} is not supported yet",
                up.scheme
            ));
        }
        if let LbType::Other(t) = &up.lb_type {
            return Err(format!("invalid balancer type: {t}"));
        }
        if up.lb_type == LbType::Chash {
            // resty.chash allocates 160 points per weight unit (after the gcd); a huge weight
            // would take gigabytes, so such an upstream is refused rather than built.
            let g = up
                .nodes
                .iter()
                .map(|n| u64::from(n.weight))
                .fold(0, gcd)
                .max(1);
            let points: u64 = up
                .nodes
                .iter()
                .map(|n| u64::from(n.weight) / g)
                .sum::<u64>()
                * u64::from(crate::balancer::POINTS_PER_WEIGHT);
            if points > MAX_CHASH_POINTS {
                return Err(format!(
                    "chash weights need {points} ring points, more than {MAX_CHASH_POINTS}"
                ));
            }
        }
        match up.discovery_type.as_deref() {
            None | Some("dns") => {}
            Some(other) => return Err(format!("discovery {other} is not supported")),
        }
        let name = format!("{}/{}/{}", env.prefix, kind.dir(), id);
        // The one place a checker is made or reused (see `health::attach`).
        let checker = health::attach(
            &env.health,
            &name,
            up.checks.as_ref(),
            previous.and_then(|p| p.checker.as_ref()),
        );
        let nodes = UpstreamNodes::new(up, env, checker.as_ref(), previous.map(|p| &*p.nodes))?;
        let upstream_host = match &up.upstream_host {
            Some(h) => {
                Some(HeaderValue::from_str(h).map_err(|_| format!("invalid upstream_host {h}"))?)
            }
            None => None,
        };
        let hash_on = (up.lb_type == LbType::Chash)
            .then(|| HashOn::from_config(up.hash_on.as_deref(), up.key.as_deref()));
        Ok(CompiledUpstream {
            id: up.id.clone(),
            name,
            nodes,
            checker,
            hash_on,
            retries: up.retries,
            retry_timeout: (up.retry_timeout > 0.0).then(|| secs(up.retry_timeout)),
            timeouts: up.timeout.map(try_timeouts).unwrap_or_default(),
            pass_host: up.pass_host,
            upstream_host,
            pool: PoolLimits {
                size: up.keepalive_pool.size as usize,
                idle_timeout: secs(up.keepalive_pool.idle_timeout),
                max_requests: up.keepalive_pool.requests,
            },
            source: up.clone(),
        })
    }

    /// Whether the upstream can have nodes at all (a node list, or discovery).
    fn has_nodes(&self) -> bool {
        !self.source.nodes.is_empty() || self.source.discovery_type.is_some()
    }
}

/// 16 M points (128 MiB): 100,000 nodes of equal weight fit.
const MAX_CHASH_POINTS: u64 = 16_000_000;

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
}

fn try_timeouts(t: Timeout) -> TryTimeouts {
    TryTimeouts {
        connect: secs(t.connect),
        send: secs(t.send),
        read: secs(t.read),
    }
}

/// Validated forms of the last accepted version of every resource, for reuse and fallback.
#[derive(Default, Clone)]
struct CompileCache {
    routes: HashMap<String, Accepted<(Route, Option<Expr>)>>,
    services: HashMap<String, Accepted<Service>>,
    upstreams: HashMap<String, Accepted<Upstream>>,
    plugin_configs: HashMap<String, Accepted<PluginConfig>>,
    global_rules: HashMap<String, Accepted<GlobalRule>>,
    compiled_upstreams: HashMap<String, Arc<CompiledUpstream>>,
    /// Inline upstreams of routes, by route id.
    inline_upstreams: HashMap<String, Arc<CompiledUpstream>>,
    /// Inline upstreams of services, by service id.
    service_upstreams: HashMap<String, Arc<CompiledUpstream>>,
}

struct Accepted<T> {
    raw: Arc<Value>,
    typed: Arc<T>,
}

impl<T> Clone for Accepted<T> {
    fn clone(&self) -> Self {
        Accepted {
            raw: self.raw.clone(),
            typed: self.typed.clone(),
        }
    }
}

/// Options that shape compilation.
#[derive(Clone, Copy, Debug, Default)]
pub struct CompileOptions {
    pub router: RouterKind,
}

impl Snapshot {
    /// The accepted (possibly previous, if quarantined) stored values of one kind, by id.
    pub fn applied(&self, kind: ResourceKind) -> Vec<(String, Arc<Value>)> {
        fn raw<T>(m: &HashMap<String, Accepted<T>>) -> Vec<(String, Arc<Value>)> {
            let mut v: Vec<_> = m.iter().map(|(k, a)| (k.clone(), a.raw.clone())).collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        }
        match kind {
            ResourceKind::Routes => raw(&self.cache.routes),
            ResourceKind::Upstreams => raw(&self.cache.upstreams),
            ResourceKind::Services => raw(&self.cache.services),
            ResourceKind::PluginConfigs => raw(&self.cache.plugin_configs),
            ResourceKind::GlobalRules => raw(&self.cache.global_rules),
            _ => Vec::new(),
        }
    }

    pub fn empty(options: CompileOptions) -> Snapshot {
        Snapshot::empty_with(options, Arc::new(UpstreamEnv::default()))
    }

    /// An empty snapshot whose upstreams will compile with `env` (health probes, DNS).
    pub fn empty_with(options: CompileOptions, env: Arc<UpstreamEnv>) -> Snapshot {
        Snapshot {
            revision: 0,
            router: RouteTable::new(options.router, Vec::new()).0,
            upstreams: HashMap::new(),
            quarantine: Vec::new(),
            global_chain: PluginChain::empty(),
            checkers: Vec::new(),
            env,
            cache: CompileCache::default(),
        }
    }

    /// Compiles `state`, reusing what `previous` already compiled.
    pub fn compile(
        state: &ConfigState,
        previous: &Snapshot,
        options: CompileOptions,
        plugins: &dyn PluginCheck,
    ) -> Snapshot {
        let mut quarantine = Vec::new();
        let prev = &previous.cache;
        let env = &previous.env;
        let upstreams = accept_all(
            state,
            ResourceKind::Upstreams,
            &prev.upstreams,
            &mut quarantine,
            |id, v| validate::upstream_from_value(Some(id), v).map_err(|e| e.message),
        );
        let mut cache = CompileCache {
            upstreams,
            ..CompileCache::default()
        };
        cache.services = accept_all(
            state,
            ResourceKind::Services,
            &prev.services,
            &mut quarantine,
            |id, v| validate::service_from_value(id, v, plugins).map_err(|e| e.message),
        );
        cache.plugin_configs = accept_all(
            state,
            ResourceKind::PluginConfigs,
            &prev.plugin_configs,
            &mut quarantine,
            |id, v| validate::plugin_config_from_value(id, v, plugins).map_err(|e| e.message),
        );
        cache.global_rules = accept_all(
            state,
            ResourceKind::GlobalRules,
            &prev.global_rules,
            &mut quarantine,
            |id, v| validate::global_rule_from_value(id, v, plugins).map_err(|e| e.message),
        );
        // Plugin metadata (limit-count's header names ...) by plugin name.
        let metadata: HashMap<String, Value> = state
            .items(ResourceKind::PluginMetadata)
            .map(|i| (i.id.clone(), (*i.value).clone()))
            .collect();
        // prometheus' `disabled_labels` apply to the whole exposition, not to one route.
        ferrisix_plugins::runtime()
            .metrics
            .set_metadata(metadata.get(ferrisix_plugins::prometheus::NAME));
        let plugin_env = CompileEnv {
            metadata: &metadata,
        };
        let globals = {
            let mut rules: Vec<&StoredItem> = state.items(ResourceKind::GlobalRules).collect();
            rules.sort_by_key(|i| i.seq);
            GlobalRules::merge(
                rules
                    .iter()
                    .filter_map(|i| cache.global_rules.get(&i.id))
                    .map(|acc| (acc.typed.id.as_str(), &acc.typed.plugins)),
            )
            .prepare(plugin_env)
        };
        cache.routes = accept_all(
            state,
            ResourceKind::Routes,
            &prev.routes,
            &mut quarantine,
            |id, v| {
                let route = validate::route_from_value(id, v, plugins).map_err(|e| e.message)?;
                let vars = match &route.vars {
                    Some(v) => Some(compile_vars(v)?),
                    None => None,
                };
                Ok((route, vars))
            },
        );

        // Upstreams by id: keep the previous compiled picker when the definition is unchanged.
        for (id, acc) in &cache.upstreams {
            let reuse = prev
                .compiled_upstreams
                .get(id)
                .filter(|c| c.source == *acc.typed)
                .cloned();
            let compiled = match reuse {
                Some(c) => Some(c),
                None => match CompiledUpstream::compile(
                    &acc.typed,
                    ResourceKind::Upstreams,
                    id,
                    prev.compiled_upstreams.get(id),
                    env,
                ) {
                    Ok(c) => Some(Arc::new(c)),
                    Err(e) => {
                        quarantine.push(Quarantined {
                            kind: ResourceKind::Upstreams,
                            id: id.clone(),
                            error: e,
                            serving_previous: false,
                        });
                        None
                    }
                },
            };
            if let Some(c) = compiled {
                cache.compiled_upstreams.insert(id.clone(), c);
            }
        }

        for (id, acc) in &cache.services {
            let Some(up) = &acc.typed.upstream else {
                continue;
            };
            let reuse = prev
                .service_upstreams
                .get(id)
                .filter(|c| c.source == *up)
                .cloned();
            match reuse.map(Ok).unwrap_or_else(|| {
                CompiledUpstream::compile(
                    up,
                    ResourceKind::Services,
                    id,
                    prev.service_upstreams.get(id),
                    env,
                )
                .map(Arc::new)
            }) {
                Ok(c) => {
                    cache.service_upstreams.insert(id.clone(), c);
                }
                Err(e) => quarantine.push(q(ResourceKind::Services, id, e)),
            }
        }

        let mut order: Vec<(&str, u64)> = state
            .items(ResourceKind::Routes)
            .map(|i| (i.id.as_str(), i.seq))
            .collect();
        order.sort_by_key(|(_, seq)| *seq);

        let mut entries = Vec::with_capacity(order.len());
        for (id, _) in order {
            let Some(acc) = cache.routes.get(id) else {
                continue;
            };
            let (route, vars) = &*acc.typed;
            if !route.enabled {
                continue;
            }
            let compiled =
                compile_route(route, &cache, prev, env, options).and_then(|(c, h, i)| {
                    let c = attach_plugins(route, c, &h, &cache, &globals, plugin_env)?;
                    Ok((c, h, i))
                });
            match compiled {
                Ok((compiled, hosts, inline)) => {
                    if let Some(inline) = inline {
                        cache.inline_upstreams.insert(route.id.clone(), inline);
                    }
                    let methods = match &route.methods {
                        Some(m) => match MethodSet::from_names(m.iter().map(String::as_str)) {
                            Ok(m) => m,
                            Err(e) => {
                                quarantine.push(q(ResourceKind::Routes, id, e));
                                continue;
                            }
                        },
                        None => MethodSet::ALL,
                    };
                    let remote_addrs = match parse_addrs(&route.remote_addrs) {
                        Ok(a) => a,
                        Err(e) => {
                            quarantine.push(q(ResourceKind::Routes, id, e));
                            continue;
                        }
                    };
                    entries.push((
                        id.to_string(),
                        RouteEntry {
                            paths: route.uris.clone(),
                            hosts,
                            methods,
                            remote_addrs,
                            vars: vars.clone(),
                            priority: route.priority,
                            value: Arc::new(compiled),
                        },
                    ));
                }
                Err(e) => quarantine.push(q(ResourceKind::Routes, id, e)),
            }
        }
        let ids: Vec<String> = entries.iter().map(|(id, _)| id.clone()).collect();
        let (router, errors) = RouteTable::new(
            options.router,
            entries.into_iter().map(|(_, e)| e).collect(),
        );
        for e in errors {
            quarantine.push(q(ResourceKind::Routes, &ids[e.index], e.message));
        }
        for ((kind, id), error) in &state.unreadable {
            quarantine.push(Quarantined {
                kind: *kind,
                id: id.clone(),
                error: error.clone(),
                serving_previous: state.get(*kind, id).is_some(),
            });
        }
        for item in &quarantine {
            tracing::error!(
                kind = item.kind.dir(),
                id = %item.id,
                serving_previous = item.serving_previous,
                "resource refused: {}",
                item.error
            );
        }
        // Counters and metric series only the replaced snapshot still used can go now.
        ferrisix_plugins::runtime().sweep();
        let mut checkers = Vec::new();
        for (kind, map) in [
            (ResourceKind::Routes, &cache.inline_upstreams),
            (ResourceKind::Services, &cache.service_upstreams),
            (ResourceKind::Upstreams, &cache.compiled_upstreams),
        ] {
            let mut ids: Vec<&String> = map.keys().collect();
            ids.sort();
            for id in ids {
                if let Some(c) = &map[id].checker {
                    checkers.push(CheckerEntry {
                        kind,
                        id: id.clone(),
                        checker: c.clone(),
                    });
                }
            }
        }
        Snapshot {
            revision: state.revision,
            router,
            upstreams: cache.compiled_upstreams.clone(),
            quarantine,
            global_chain: globals.unmatched(),
            checkers,
            env: env.clone(),
            cache,
        }
    }
}

fn q(kind: ResourceKind, id: &str, error: String) -> Quarantined {
    Quarantined {
        kind,
        id: id.to_string(),
        error,
        serving_previous: false,
    }
}

/// Validates every item of one kind, reusing unchanged ones and falling back to the last
/// accepted version of an item that no longer validates.
fn accept_all<T>(
    state: &ConfigState,
    kind: ResourceKind,
    previous: &HashMap<String, Accepted<T>>,
    quarantine: &mut Vec<Quarantined>,
    mut convert: impl FnMut(&str, &Value) -> Result<T, String>,
) -> HashMap<String, Accepted<T>> {
    let mut out = HashMap::new();
    for StoredItem { id, value, .. } in state.items(kind) {
        if let Some(prev) = previous.get(id) {
            if Arc::ptr_eq(&prev.raw, value) || prev.raw == *value {
                out.insert(id.clone(), prev.clone());
                continue;
            }
        }
        match convert(id, value) {
            Ok(typed) => {
                out.insert(
                    id.clone(),
                    Accepted {
                        raw: value.clone(),
                        typed: Arc::new(typed),
                    },
                );
            }
            Err(error) => {
                let fallback = previous.get(id).cloned();
                quarantine.push(Quarantined {
                    kind,
                    id: id.clone(),
                    error,
                    serving_previous: fallback.is_some(),
                });
                if let Some(f) = fallback {
                    out.insert(id.clone(), f);
                }
            }
        }
    }
    out
}

fn parse_addrs(addrs: &[String]) -> Result<Vec<IpNet>, String> {
    addrs
        .iter()
        .map(|a| {
            a.parse::<IpNet>()
                .or_else(|_| a.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| format!("invalid remote address {a}"))
        })
        .collect()
}

type CompiledParts = (CompiledRoute, Vec<String>, Option<Arc<CompiledUpstream>>);

fn compile_route(
    route: &Route,
    cache: &CompileCache,
    prev: &CompileCache,
    env: &Arc<UpstreamEnv>,
    _options: CompileOptions,
) -> Result<CompiledParts, String> {
    let service = match &route.service_id {
        Some(sid) => match cache.services.get(sid) {
            Some(s) => Some(s.typed.clone()),
            // APISIX answers 404 with nginx's page when the service is gone.
            None => {
                return Ok((
                    failing_route(route, StatusCode::NOT_FOUND),
                    route.hosts.clone(),
                    None,
                ))
            }
        },
        None => None,
    };

    // Plugin merge order: plugin_config under the route, then the service under both.
    let mut plugins = Map::new();
    if let Some(s) = &service {
        plugins.extend(s.plugins.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    if let Some(pcid) = &route.plugin_config_id {
        match cache.plugin_configs.get(pcid) {
            Some(pc) => {
                plugins.extend(pc.typed.plugins.iter().map(|(k, v)| (k.clone(), v.clone())))
            }
            None => {
                return Ok((
                    failing_route(route, StatusCode::SERVICE_UNAVAILABLE),
                    hosts_for(route, service.as_deref()),
                    None,
                ))
            }
        }
    }
    plugins.extend(route.plugins.iter().map(|(k, v)| (k.clone(), v.clone())));

    let mut inline = None;
    let target = if let Some(up) = &route.upstream {
        let reuse = prev
            .inline_upstreams
            .get(&route.id)
            .filter(|c| c.source == *up)
            .cloned();
        let compiled = match reuse {
            Some(c) => c,
            None => Arc::new(CompiledUpstream::compile(
                up,
                ResourceKind::Routes,
                &route.id,
                prev.inline_upstreams.get(&route.id),
                env,
            )?),
        };
        inline = Some(compiled.clone());
        RouteTarget::Upstream(compiled)
    } else if let Some(uid) = &route.upstream_id {
        upstream_by_id(cache, uid)
    } else if let Some(s) = &service {
        if s.upstream.is_some() {
            match cache.service_upstreams.get(&s.id) {
                Some(c) => RouteTarget::Upstream(c.clone()),
                None => RouteTarget::Fail(StatusCode::SERVICE_UNAVAILABLE),
            }
        } else if let Some(uid) = &s.upstream_id {
            upstream_by_id(cache, uid)
        } else {
            RouteTarget::Fail(StatusCode::SERVICE_UNAVAILABLE)
        }
    } else {
        RouteTarget::Fail(StatusCode::SERVICE_UNAVAILABLE)
    };
    let target = match target {
        RouteTarget::Upstream(u) if !u.has_nodes() => {
            RouteTarget::Fail(StatusCode::SERVICE_UNAVAILABLE)
        }
        t => t,
    };

    let compiled = CompiledRoute {
        id: route.id.clone(),
        log_id: Arc::from(route.id.as_str()),
        name: route.name.clone(),
        service_id: route.service_id.clone(),
        service_name: service.as_ref().and_then(|s| s.name.clone()),
        target,
        timeout: route.timeout.map(try_timeouts),
        enable_websocket: route
            .enable_websocket
            .or_else(|| service.as_ref().and_then(|s| s.enable_websocket))
            .unwrap_or(false),
        plugins,
        info: RouteInfo::default(),
        plugins_run: true,
        chain: PluginChain::empty(),
        global_chain: PluginChain::empty(),
    };
    Ok((compiled, hosts_for(route, service.as_deref()), inline))
}

fn upstream_by_id(cache: &CompileCache, id: &str) -> RouteTarget {
    match cache.compiled_upstreams.get(id) {
        Some(u) => RouteTarget::Upstream(u.clone()),
        // A dangling upstream_id ends in 502, as APISIX's balancer fails.
        None => RouteTarget::Fail(StatusCode::BAD_GATEWAY),
    }
}

/// A route's own hosts, else its service's (spec data-plane §2.3, §5.1).
fn hosts_for(route: &Route, service: Option<&Service>) -> Vec<String> {
    if !route.hosts.is_empty() {
        route.hosts.clone()
    } else {
        service.map(|s| s.hosts.clone()).unwrap_or_default()
    }
}

/// Compiles the route's plugins (each with the resource that holds its conf, which keys
/// limit-count's counters) and the global rules as they run for this route.
fn attach_plugins(
    route: &Route,
    mut compiled: CompiledRoute,
    hosts: &[String],
    cache: &CompileCache,
    globals: &GlobalChains,
    env: CompileEnv<'_>,
) -> Result<CompiledRoute, String> {
    compiled.info = RouteInfo {
        id: compiled.id.clone(),
        name: compiled.name.clone(),
        service_id: compiled.service_id.clone(),
        service_name: compiled.service_name.clone(),
        uris: route.uris.clone(),
        hosts: hosts.to_vec(),
    };
    let route_owner = Owner::new(ResourceKind::Routes, &route.id);
    let pc = route.plugin_config_id.as_deref().and_then(|id| {
        cache
            .plugin_configs
            .get(id)
            .map(|pc| (Owner::new(ResourceKind::PluginConfigs, id), pc))
    });
    let service_owner = route
        .service_id
        .as_deref()
        .map(|id| Owner::new(ResourceKind::Services, id));
    let sources: Vec<PluginSource<'_>> = compiled
        .plugins
        .iter()
        .map(|(name, conf)| {
            // Precedence of the merge: route, then plugin_config, then service.
            let owner = if route.plugins.contains_key(name) {
                &route_owner
            } else if let Some((owner, _)) = pc
                .as_ref()
                .filter(|(_, pc)| pc.typed.plugins.contains_key(name))
            {
                owner
            } else {
                service_owner.as_ref().unwrap_or(&route_owner)
            };
            PluginSource { name, conf, owner }
        })
        .collect();
    let chain = Arc::new(PluginChain::compile(&sources, Some(&compiled.info), env)?);
    let global_chain = globals.for_route(&compiled.info, &compiled.plugins, env);
    compiled.chain = chain;
    compiled.global_chain = global_chain;
    Ok(compiled)
}

fn failing_route(route: &Route, status: StatusCode) -> CompiledRoute {
    CompiledRoute {
        id: route.id.clone(),
        log_id: Arc::from(route.id.as_str()),
        name: route.name.clone(),
        service_id: route.service_id.clone(),
        service_name: None,
        target: RouteTarget::Fail(status),
        timeout: None,
        enable_websocket: false,
        plugins: Map::new(),
        info: RouteInfo::default(),
        plugins_run: false,
        chain: PluginChain::empty(),
        global_chain: PluginChain::empty(),
    }
}

/// The published snapshot, swapped atomically; readers never lock.
pub type SnapshotHandle = Arc<ArcSwap<Snapshot>>;

pub fn new_handle(options: CompileOptions) -> SnapshotHandle {
    Arc::new(ArcSwap::from_pointee(Snapshot::empty(options)))
}

/// A handle whose snapshots compile upstreams with `env` (the binary's probes and resolver).
pub fn new_handle_with(options: CompileOptions, env: Arc<UpstreamEnv>) -> SnapshotHandle {
    Arc::new(ArcSwap::from_pointee(Snapshot::empty_with(options, env)))
}

/// Follows a store's states, compiling and publishing each one, until the sender goes away.
pub async fn follow(
    mut rx: tokio::sync::watch::Receiver<Arc<ConfigState>>,
    handle: SnapshotHandle,
    options: CompileOptions,
    plugins: Arc<dyn PluginCheck + Send + Sync>,
) {
    loop {
        let state = rx.borrow_and_update().clone();
        let previous = handle.load_full();
        let started = std::time::Instant::now();
        let snapshot = Snapshot::compile(&state, &previous, options, plugins.as_ref());
        tracing::info!(
            revision = snapshot.revision,
            routes = snapshot.router.len(),
            quarantined = snapshot.quarantine.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "configuration applied"
        );
        handle.store(Arc::new(snapshot));
        // Let the replaced snapshot go now, not at the next change: what only it referenced
        // (plugin state of deleted routes) is released with it.
        drop(previous);
        if rx.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrisix_config::state::StoredItem;
    use serde_json::json;

    fn state_with_upstream(revision: i64, upstream: Value) -> ConfigState {
        let mut state = ConfigState {
            revision,
            ..ConfigState::default()
        };
        state
            .resources
            .entry(ResourceKind::Upstreams)
            .or_default()
            .insert(
                "u1".into(),
                StoredItem {
                    id: "u1".into(),
                    value: Arc::new(upstream),
                    create_revision: 1,
                    mod_revision: revision,
                    seq: 0,
                },
            );
        state
    }

    fn compile(state: &ConfigState, prev: &Snapshot) -> Snapshot {
        Snapshot::compile(
            state,
            prev,
            CompileOptions::default(),
            &validate::AcceptAnyPlugin,
        )
    }

    #[test]
    fn a_node_list_change_keeps_the_checker_and_the_state_of_unchanged_nodes() {
        let checks = json!({"active": {"unhealthy": {"tcp_failures": 1}}});
        let first = state_with_upstream(
            1,
            json!({"type": "roundrobin", "checks": checks,
                   "nodes": {"127.0.0.1:1": 1, "127.0.0.1:2": 1}}),
        );
        let s1 = compile(&first, &Snapshot::empty(CompileOptions::default()));
        assert!(s1.quarantine.is_empty(), "{:?}", s1.quarantine);
        assert_eq!(s1.checkers.len(), 1);
        let checker = s1.checkers[0].checker.clone();
        assert_eq!(checker.name, "/apisix/upstreams/u1");
        let targets = checker.targets();
        targets[1].report(false, health::Counter::Tcp, 1);
        assert!(!targets[1].is_up());

        let second = state_with_upstream(
            2,
            json!({"type": "roundrobin", "checks": checks,
                   "nodes": {"127.0.0.1:2": 1, "127.0.0.1:3": 1}}),
        );
        let s2 = compile(&second, &s1);
        assert!(Arc::ptr_eq(&s2.checkers[0].checker, &checker));
        let now = s2.checkers[0].checker.targets();
        assert_eq!(now.len(), 2);
        assert_eq!(now[0].port, 2);
        assert!(!now[0].is_up(), "the unchanged node lost its state");
        assert!(now[1].is_up());

        // A chash ring too big to build is refused, not allocated.
        let huge = state_with_upstream(
            3,
            json!({"type": "chash", "key": "uri", "checks": checks,
                   "nodes": {"127.0.0.1:2": 1_000_000_000u64, "127.0.0.1:3": 1}}),
        );
        let refused = compile(&huge, &s2);
        assert_eq!(refused.quarantine.len(), 1, "{:?}", refused.quarantine);
        drop(refused);

        // The upstream goes: so does its checker.
        let s3 = compile(&ConfigState::default(), &s2);
        assert!(s3.checkers.is_empty());
        drop((s1, s2));
        assert_eq!(
            Arc::strong_count(&checker),
            1,
            "the checker outlived its upstream"
        );
    }
}
