//! Routes as the request path needs them: merged with their service and plugin config (in
//! APISIX's precedence), their upstream resolved, their plugins and the global rules compiled
//! into chains. A compiled route remembers what it was built from ([`RouteDeps`]), so a compile
//! rebuilds exactly the routes a change touches and hands the others on unchanged.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use ferrisix_config::model::{ResourceKind, Route, Service};
use ferrisix_plugin_api::{Owner, RouteInfo};
use ferrisix_plugins::{CompileEnv, GlobalChains, PluginChain, PluginSource};
use ferrisix_router::{MethodSet, RouteEntry};
use http::StatusCode;
use ipnet::IpNet;
use serde_json::{Map, Value};

use super::accept::{Applied, RouteDef};
use super::diff::{ConfigDiff, Difference};
use super::upstreams::{
    inline_upstream, try_timeouts, CompiledUpstream, CompiledUpstreams, Holder, PluginUpstreams,
    RouteUpstreams, UpstreamEnv,
};
use crate::upstream::client::TryTimeouts;

/// Where a matched route sends its requests.
#[derive(Clone)]
pub enum RouteTarget {
    Upstream(Arc<CompiledUpstream>),
    /// APISIX ends such requests with nginx's page for this status (spec data-plane §2.5).
    Fail(StatusCode),
}

/// A route as the request path needs it: merged with its service and plugin config, its
/// upstream resolved.
///
/// One per route, so it holds only what requests read: the id (shared with access-log
/// records), name and service are in `info`, the merged plugin confs only in the compiled
/// chains.
pub struct CompiledRoute {
    pub target: RouteTarget,
    /// The route's own `timeout`, which replaces the upstream's (boxed: most routes have
    /// none).
    pub timeout: Option<Box<TryTimeouts>>,
    pub enable_websocket: bool,
    /// The route as plugins see it (its id, name, service, patterns).
    pub info: RouteInfo,
    /// False when APISIX ends the request before any plugin runs (the route's service or
    /// plugin_config is missing); only the global rules' log phase runs then.
    pub plugins_run: bool,
    /// `plugins` compiled, highest priority first.
    pub chain: Arc<PluginChain>,
    /// The global rules as they run for this route (`prefer_route` applied).
    pub global_chain: Arc<PluginChain>,
}

/// A route compiled for the table, with what it was built from besides its definition (which
/// a compile that builds it again reads from its accepted text: the table holds what it
/// matches on).
#[derive(Clone)]
pub(super) struct RouteSlot {
    /// The route's place in the router's insertion order (its key in the route table).
    pub seq: u64,
    pub compiled: Arc<CompiledRoute>,
    /// The route's own inline upstream, reused while its definition is equal.
    pub inline: Option<Arc<CompiledUpstream>>,
    /// Its plugins' inline upstreams (traffic-split's), by resource path.
    pub plugin_upstreams: PluginUpstreams,
    /// `None` when it depends on nothing but its own definition (boxed: most routes).
    pub deps: Option<Box<RouteDeps>>,
}

impl RouteSlot {
    /// Whether the route must be built again after `changes`.
    pub fn touched_by(&self, changes: &Changes<'_>) -> bool {
        match &self.deps {
            Some(deps) => deps.touched_by(changes),
            None => changes.globals,
        }
    }
}

/// What a compiled route was built from besides its own definition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct RouteDeps {
    pub service: Option<String>,
    pub plugin_config: Option<String>,
    /// Upstreams by id: the route's or its service's `upstream_id`, and any `upstream_id` in
    /// its plugins' configurations (traffic-split's weighted upstreams and the like).
    pub upstreams: BTreeSet<String>,
    /// The names of its plugins, whose plugin metadata its chain reads.
    pub plugins: BTreeSet<String>,
}

/// What changed since the previous snapshot, as far as routes depend on it.
pub(super) struct Changes<'a> {
    pub applied: &'a ConfigDiff,
    /// Compiled upstreams by id.
    pub upstreams: &'a Difference,
    /// Services' compiled inline upstreams, by service id.
    pub service_upstreams: &'a Difference,
    /// The global chains were prepared again: every route's global chain is rebuilt.
    pub globals: bool,
}

impl RouteDeps {
    fn of(route: &Route, service: Option<&Service>, plugins: &Map<String, Value>) -> RouteDeps {
        let mut upstreams = BTreeSet::new();
        upstreams.extend(route.upstream_id.clone());
        upstreams.extend(service.and_then(|s| s.upstream_id.clone()));
        for conf in plugins.values() {
            upstream_ids_in(conf, &mut upstreams);
        }
        RouteDeps {
            service: route.service_id.clone(),
            plugin_config: route.plugin_config_id.clone(),
            upstreams,
            plugins: plugins.keys().cloned().collect(),
        }
    }

    /// Whether a route built from these must be built again after `changes`.
    pub fn touched_by(&self, changes: &Changes<'_>) -> bool {
        let applied = changes.applied;
        changes.globals
            || self.service.as_deref().is_some_and(|s| {
                applied.services.touches(s) || changes.service_upstreams.touches(s)
            })
            || self
                .plugin_config
                .as_deref()
                .is_some_and(|p| applied.plugin_configs.touches(p))
            || self.upstreams.iter().any(|u| changes.upstreams.touches(u))
            || self
                .plugins
                .iter()
                .any(|p| applied.plugin_metadata.touches(p))
            || (!applied.protos.is_empty() && self.plugins.contains(PROTO_PLUGIN))
            || (!applied.plugin_metadata.is_empty() && self.plugins.contains(API_PLUGIN))
    }
}

/// The plugin that serves other plugins' APIs, whose handlers it builds from those plugins'
/// metadata (batch-requests' `max_body_size`): its routes are built again when any plugin
/// metadata changes.
pub(super) const API_PLUGIN: &str = "public-api";

/// The plugin that compiles against protos: its routes are built again when a proto changes
/// (one proto may import another, so any change).
pub(super) const PROTO_PLUGIN: &str = "grpc-transcode";

/// Every string `upstream_id` in a plugin configuration.
fn upstream_ids_in(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match v {
                    Value::String(id) if k == "upstream_id" => {
                        out.insert(id.clone());
                    }
                    other => upstream_ids_in(other, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| upstream_ids_in(v, out)),
        _ => {}
    }
}

/// What routes are compiled against.
pub(super) struct RouteInputs<'a> {
    pub applied: &'a Applied,
    pub upstreams: &'a HashMap<String, Arc<CompiledUpstream>>,
    /// Inline upstreams of services, by service id.
    pub service_upstreams: &'a HashMap<String, Arc<CompiledUpstream>>,
    pub globals: &'a GlobalChains,
    pub env: CompileEnv<'a>,
    pub upstream_env: UpstreamEnv<'a>,
    /// What `env` resolves plugins' upstreams with, which records their inline ones.
    pub resolver: &'a CompiledUpstreams<'a>,
}

/// Compiles one enabled route for the table.
pub(super) fn compile_slot(
    def: &Arc<RouteDef>,
    seq: u64,
    inputs: &RouteInputs<'_>,
    previous: Option<&RouteSlot>,
) -> Result<(RouteSlot, RouteEntry<Arc<CompiledRoute>>), String> {
    let (route, vars) = &**def;
    // This route's plugins record the inline upstreams they ask for here (routes may compile
    // on several threads).
    let resolver = RouteUpstreams::new(inputs.resolver);
    let env = CompileEnv {
        upstreams: &resolver,
        ..inputs.env
    };
    let (compiled, plugins, hosts, inline) =
        merge_route(route, inputs, previous.and_then(|p| p.inline.as_ref()))?;
    let service = route
        .service_id
        .as_deref()
        .and_then(|s| inputs.applied.services.get(s))
        .map(|s| &*s.typed);
    let deps = RouteDeps::of(route, service, &plugins);
    let compiled = attach_plugins(
        route,
        compiled,
        &plugins,
        inputs.applied,
        inputs.globals,
        env,
    )?;
    let methods = match &route.methods {
        Some(m) => MethodSet::from_names(m.iter().map(String::as_str))?,
        None => MethodSet::ALL,
    };
    let remote_addrs = parse_addrs(&route.remote_addrs)?;
    let compiled = Arc::new(compiled);
    let entry = RouteEntry {
        paths: route.uris.clone(),
        hosts,
        methods,
        remote_addrs,
        vars: vars.as_deref().cloned(),
        priority: route.priority,
        value: compiled.clone(),
    };
    let slot = RouteSlot {
        seq,
        compiled,
        inline,
        plugin_upstreams: resolver.into_asked(),
        deps: (deps != RouteDeps::default()).then(|| Box::new(deps)),
    };
    Ok((slot, entry))
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

/// The compiled route, its effective plugins (after the plugin_config and service merges),
/// its hosts and its own inline upstream.
type CompiledParts = (
    CompiledRoute,
    Map<String, Value>,
    Vec<String>,
    Option<Arc<CompiledUpstream>>,
);

/// The route merged with its service and plugin config, its upstream resolved; its plugins
/// are attached by [`attach_plugins`].
fn merge_route(
    route: &Route,
    inputs: &RouteInputs<'_>,
    previous_inline: Option<&Arc<CompiledUpstream>>,
) -> Result<CompiledParts, String> {
    let service = match &route.service_id {
        Some(sid) => match inputs.applied.services.get(sid) {
            Some(s) => Some(s.typed.clone()),
            // APISIX answers 404 with nginx's page when the service is gone.
            None => {
                let hosts = route.hosts.clone();
                let failing = failing_route(route, &hosts, StatusCode::NOT_FOUND);
                return Ok((failing, Map::new(), hosts, None));
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
        match inputs.applied.plugin_configs.get(pcid) {
            Some(pc) => {
                plugins.extend(pc.typed.plugins.iter().map(|(k, v)| (k.clone(), v.clone())))
            }
            None => {
                let hosts = hosts_for(route, service.as_deref());
                // APISIX ends the request before it merges the service: the service is not
                // known to the log phase.
                let failing = failing_route(route, &hosts, StatusCode::SERVICE_UNAVAILABLE);
                return Ok((failing, Map::new(), hosts, None));
            }
        }
    }
    plugins.extend(route.plugins.iter().map(|(k, v)| (k.clone(), v.clone())));

    let mut inline = None;
    let target = if let Some(up) = &route.upstream {
        let holder = Holder::Resource {
            kind: ResourceKind::Routes,
            id: &route.id,
        };
        let compiled = inline_upstream(up, holder, previous_inline, inputs.upstream_env)?;
        inline = Some(compiled.clone());
        RouteTarget::Upstream(compiled)
    } else if let Some(uid) = &route.upstream_id {
        upstream_by_id(inputs, uid)
    } else if let Some(s) = &service {
        if s.upstream.is_some() {
            match inputs.service_upstreams.get(&s.id) {
                Some(c) => RouteTarget::Upstream(c.clone()),
                None => RouteTarget::Fail(StatusCode::SERVICE_UNAVAILABLE),
            }
        } else if let Some(uid) = &s.upstream_id {
            upstream_by_id(inputs, uid)
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

    let hosts = hosts_for(route, service.as_deref());
    let compiled = CompiledRoute {
        target,
        timeout: route.timeout.as_deref().map(|t| Box::new(try_timeouts(*t))),
        enable_websocket: route
            .enable_websocket
            .or_else(|| service.as_ref().and_then(|s| s.enable_websocket))
            .unwrap_or(false),
        info: route_info(route, service.as_deref(), &hosts),
        plugins_run: true,
        chain: PluginChain::empty(),
        global_chain: PluginChain::empty(),
    };
    Ok((compiled, plugins, hosts, inline))
}

/// The route as plugins see it.
fn route_info(route: &Route, service: Option<&Service>, hosts: &[String]) -> RouteInfo {
    RouteInfo {
        id: route.id.as_str().into(),
        name: route.name.as_deref().map(Box::from),
        service_id: route.service_id.as_deref().map(Box::from),
        service_name: service.and_then(|s| s.name.as_deref()).map(Box::from),
        uris: route.uris.clone().into(),
        hosts: hosts.into(),
    }
}

fn upstream_by_id(inputs: &RouteInputs<'_>, id: &str) -> RouteTarget {
    match inputs.upstreams.get(id) {
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
    plugins: &Map<String, Value>,
    applied: &Applied,
    globals: &GlobalChains,
    env: CompileEnv<'_>,
) -> Result<CompiledRoute, String> {
    let route_owner = Owner::new(ResourceKind::Routes, &route.id);
    let pc = route.plugin_config_id.as_deref().and_then(|id| {
        applied
            .plugin_configs
            .get(id)
            .map(|pc| (Owner::new(ResourceKind::PluginConfigs, id), pc))
    });
    let service_owner = route
        .service_id
        .as_deref()
        .map(|id| Owner::new(ResourceKind::Services, id));
    let sources: Vec<PluginSource<'_>> = plugins
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
    let chain = if sources.is_empty() {
        globals.empty_chain()
    } else {
        Arc::new(PluginChain::compile(&sources, Some(&compiled.info), env)?)
    };
    let global_chain = globals.for_route(&compiled.info, plugins, env);
    compiled.chain = chain;
    compiled.global_chain = global_chain;
    Ok(compiled)
}

fn failing_route(route: &Route, hosts: &[String], status: StatusCode) -> CompiledRoute {
    CompiledRoute {
        target: RouteTarget::Fail(status),
        timeout: None,
        enable_websocket: false,
        info: route_info(route, None, hosts),
        plugins_run: false,
        chain: PluginChain::empty(),
        global_chain: PluginChain::empty(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn dependencies_and_what_touches_them() {
        let plugins = json!({
            "traffic-split": {"rules": [{"weighted_upstreams": [
                {"upstream_id": "u2", "weight": 1},
                {"upstream": {"nodes": {"127.0.0.1:1": 1}}, "weight": 1}
            ]}]},
            "other": {"upstream_id": 7}
        });
        let route = Route {
            upstream_id: Some("u1".into()),
            service_id: Some("s".into()),
            plugin_config_id: Some("pc".into()),
            ..Route::default()
        };
        let service = Service {
            upstream_id: Some("u3".into()),
            ..Service::default()
        };
        let deps = RouteDeps::of(&route, Some(&service), plugins.as_object().unwrap());
        let set = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(deps.upstreams, set(&["u1", "u2", "u3"]));
        assert_eq!(deps.plugins, set(&["other", "traffic-split"]));
        assert_eq!(deps.service.as_deref(), Some("s"));
        assert_eq!(deps.plugin_config.as_deref(), Some("pc"));

        let touched = |applied: &ConfigDiff, upstreams: &Difference, globals: bool| {
            deps.touched_by(&Changes {
                applied,
                upstreams,
                service_upstreams: &Difference::default(),
                globals,
            })
        };
        let nothing = ConfigDiff::default();
        let none = Difference::default();
        assert!(!touched(&nothing, &none, false));
        assert!(touched(&nothing, &none, true), "rebuilt global chains");
        let mut up = Difference::default();
        up.removed.insert("u2".into());
        assert!(touched(&nothing, &up, false), "an upstream a plugin names");
        up.removed = set(&["elsewhere"]);
        assert!(!touched(&nothing, &up, false));
        for kind in [
            ResourceKind::Services,
            ResourceKind::PluginConfigs,
            ResourceKind::PluginMetadata,
        ] {
            let mut applied = ConfigDiff::default();
            let id = match kind {
                ResourceKind::Services => "s",
                ResourceKind::PluginConfigs => "pc",
                _ => "other",
            };
            applied.of_mut(kind).changed.insert(id.into());
            assert!(touched(&applied, &none, false), "{kind:?}");
            let mut unrelated = ConfigDiff::default();
            unrelated.of_mut(kind).added.insert("unrelated".into());
            assert!(!touched(&unrelated, &none, false), "{kind:?}");
        }
    }
}
