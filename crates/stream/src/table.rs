//! The stream routes of one HTTP snapshot, compiled: validated (a bad route is quarantined
//! alone), their matchers built, their upstream resolved (the route's own, else its
//! `upstream_id`, else its service's), and their plugins compiled (`plugins`).
//!
//! Matching follows APISIX's `apisix/stream/router/ip_port.lua`: on a TLS connection the
//! routes with an `sni` matching the client's SNI come first, then every route without
//! `sni`; within each group the first route (in store order) whose `remote_addr`,
//! `server_addr` and `server_port` all match wins.

use std::net::IpAddr;
use std::sync::Arc;

use ferrisix_config::model::ResourceKind;
use ferrisix_config::schema;
use ferrisix_proxy::snapshot::CompiledUpstream;
use ferrisix_proxy::upstream::health::UpstreamChecker;
use ferrisix_proxy::Snapshot;
use ferrisix_tls::CertStore;
use ipnet::IpNet;
use serde_json::{Map, Value};

use crate::plugins::{self, StreamPlugin};
use crate::vars::ConnVars;
use crate::StreamEnv;

/// The compiled stream routes and what serving them needs.
#[derive(Default)]
pub struct StreamTable {
    /// Routes with `sni`, in store order.
    sni_routes: Vec<Arc<StreamRoute>>,
    /// Routes without `sni`, in store order.
    other_routes: Vec<Arc<StreamRoute>>,
    /// The certificates of the snapshot the routes came from (TLS ports).
    pub tls: Arc<CertStore>,
    /// Routes that did not compile, with the reason.
    pub quarantine: Vec<(String, String)>,
}

/// One compiled stream route.
pub struct StreamRoute {
    pub id: String,
    pub service_id: Option<String>,
    remote_addr: Option<IpNet>,
    server_addr: Option<IpNet>,
    server_port: Option<u16>,
    sni: Option<SniMatch>,
    /// The upstream the route's own definition, `upstream_id` or service gives; `None`
    /// closes the connection (APISIX: "missing upstream configuration").
    pub upstream: Option<Arc<CompiledUpstream>>,
    /// The route's inline upstream (reused by the next compile while unchanged).
    inline: Option<Arc<CompiledUpstream>>,
    /// Highest priority first.
    pub plugins: Vec<StreamPlugin>,
    /// The stored value this was compiled from, with its service's.
    source: (Value, Option<Value>),
    /// `protocol`: the session is read as that xRPC protocol's requests.
    pub xrpc: Option<Arc<crate::xrpc::XrpcRoute>>,
    /// `protocol.superior_id`: a subordinate route, never matched at the entry.
    subordinate: bool,
}

/// `sni`: a host name, or `*.suffix`.
#[derive(Debug, PartialEq)]
enum SniMatch {
    Exact(String),
    /// The part after `*` (`.example.com`).
    Suffix(String),
}

impl SniMatch {
    fn new(sni: &str) -> SniMatch {
        let sni = sni.to_ascii_lowercase();
        match sni.strip_prefix('*') {
            Some(rest) => SniMatch::Suffix(rest.to_string()),
            None => SniMatch::Exact(sni),
        }
    }

    fn matches(&self, sni: &str) -> bool {
        match self {
            SniMatch::Exact(s) => s.eq_ignore_ascii_case(sni),
            SniMatch::Suffix(s) => {
                sni.len() > s.len() && sni.to_ascii_lowercase().ends_with(s.as_str())
            }
        }
    }
}

fn ip_matcher(text: &str) -> Option<IpNet> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(IpNet::from(ip));
    }
    text.parse::<IpNet>().ok()
}

impl StreamRoute {
    fn addrs_match(&self, vars: &ConnVars) -> bool {
        let ip = |a: IpAddr| match a {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, IpAddr::V4),
            v4 => v4,
        };
        if let Some(net) = &self.remote_addr {
            if !net.contains(&ip(vars.remote.ip())) {
                return false;
            }
        }
        if let Some(net) = &self.server_addr {
            if !net.contains(&ip(vars.local.ip())) {
                return false;
            }
        }
        if let Some(port) = self.server_port {
            if port != vars.local.port() {
                return false;
            }
        }
        true
    }
}

impl StreamTable {
    /// The route for a connection, `None` when no route matches (the connection is closed).
    pub fn match_route(&self, vars: &ConnVars) -> Option<&Arc<StreamRoute>> {
        if let Some(sni) = vars.sni.as_deref() {
            let hit = self
                .sni_routes
                .iter()
                .find(|r| r.sni.as_ref().is_some_and(|m| m.matches(sni)) && r.addrs_match(vars));
            if hit.is_some() {
                return hit;
            }
        }
        self.other_routes.iter().find(|r| r.addrs_match(vars))
    }

    /// Every route, `sni` ones first.
    pub fn routes(&self) -> impl Iterator<Item = &Arc<StreamRoute>> {
        self.sni_routes.iter().chain(self.other_routes.iter())
    }

    /// Every route's id with the health checker of its own inline upstream (`None` without
    /// `checks`, or on an `upstream_id` or service upstream, which the control API lists
    /// under those), in id order: what APISIX's control API shows of stream routes.
    pub fn checkers(&self) -> Vec<(String, Option<Arc<UpstreamChecker>>)> {
        let mut out: Vec<(String, Option<Arc<UpstreamChecker>>)> = self
            .routes()
            .map(|r| {
                let checker = r.inline.as_ref().and_then(|up| up.checker.clone());
                (r.id.clone(), checker)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The stream routes of `snapshot`, reusing what `previous` compiled from the same
    /// definitions.
    pub fn compile(snapshot: &Snapshot, previous: &StreamTable, env: &StreamEnv) -> StreamTable {
        let state = snapshot.source();
        let mut table = StreamTable {
            tls: snapshot.tls.clone(),
            ..StreamTable::default()
        };
        let services: std::collections::HashMap<String, Arc<Value>> = snapshot
            .applied(ResourceKind::Services)
            .into_iter()
            .collect();
        for item in state.items_in_order(ResourceKind::StreamRoutes) {
            let value = item.value.parse();
            let prev = previous.routes().find(|r| r.id == item.id);
            match compile_route(&item.id, value, prev, snapshot, &services, env) {
                Ok(route) => {
                    let route = Arc::new(route);
                    if route.subordinate {
                        // APISIX's ip_port router leaves subordinate routes out; their
                        // protocol routes to them (the redis protocol does not).
                        continue;
                    }
                    if route.sni.is_some() {
                        table.sni_routes.push(route);
                    } else {
                        table.other_routes.push(route);
                    }
                }
                Err(e) => table.quarantine.push((item.id.clone(), e)),
            }
        }
        table
    }
}

fn compile_route(
    id: &str,
    mut value: Value,
    previous: Option<&Arc<StreamRoute>>,
    snapshot: &Snapshot,
    services: &std::collections::HashMap<String, Arc<Value>>,
    env: &StreamEnv,
) -> Result<StreamRoute, String> {
    let stored = value.clone();
    if let Some(obj) = value.as_object_mut() {
        // The key names the route; a stored `id` may be absent or an integer.
        obj.insert("id".into(), Value::String(id.to_string()));
    }
    schema::validate(schema::resource_schema(ResourceKind::StreamRoutes), &value)?;
    let text = |k: &str| value.get(k).and_then(Value::as_str);
    let id_of = |k: &str| {
        value.get(k).and_then(|v| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        })
    };
    let matcher = |field: &str| -> Result<Option<IpNet>, String> {
        match text(field) {
            None => Ok(None),
            Some(t) => ip_matcher(t)
                .map(Some)
                .ok_or_else(|| format!("invalid {field}: {t}")),
        }
    };
    let remote_addr = matcher("remote_addr")?;
    let server_addr = matcher("server_addr")?;
    let server_port = value
        .get("server_port")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok());
    let sni = text("sni").map(SniMatch::new);

    let service_id = id_of("service_id");
    let service = match &service_id {
        Some(sid) => Some(
            services
                .get(sid)
                .map(|v| (**v).clone())
                .ok_or_else(|| format!("failed to fetch service configuration by id: {sid}"))?,
        ),
        None => None,
    };
    let source = (stored, service.clone());
    let reusable_inline = previous
        .filter(|p| p.source.0.get("upstream") == value.get("upstream"))
        .and_then(|p| p.inline.clone());

    // The route's own upstream, then its upstream_id, then the service's (APISIX's
    // merge_service_stream_route keeps the route's upstream over the service's).
    let mut inline = None;
    let upstream = if let Some(conf) = value.get("upstream").filter(|u| u.is_object()) {
        let compiled = snapshot.compile_upstream(
            ResourceKind::StreamRoutes,
            id,
            conf,
            reusable_inline.as_ref(),
        )?;
        inline = Some(compiled.clone());
        Some(compiled)
    } else if let Some(uid) = id_of("upstream_id") {
        Some(
            snapshot
                .upstreams
                .get(&uid)
                .cloned()
                .ok_or_else(|| format!("failed to find upstream by id: {uid}"))?,
        )
    } else if let (Some(sid), Some(svc)) = (&service_id, &service) {
        if svc.get("upstream").is_some_and(Value::is_object) {
            snapshot.service_upstream(sid).cloned()
        } else {
            svc.get("upstream_id")
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .and_then(|uid| snapshot.upstreams.get(&uid).cloned())
        }
    } else {
        None
    };

    // The service's plugins under the route's (the route's conf wins for a plugin in both).
    let mut merged = Map::new();
    for src in [service.as_ref(), Some(&value)].into_iter().flatten() {
        if let Some(p) = src.get("plugins").and_then(Value::as_object) {
            for (k, v) in p {
                merged.insert(k.clone(), v.clone());
            }
        }
    }
    let merged = Value::Object(merged);
    env.plugins.check(&merged)?;
    let plugins = plugins::compile_all(id, &merged, snapshot, env, previous.map(|p| &p.plugins))?;

    // apisix/stream/router/ip_port.lua's checker: the protocol among `xrpc.protocols`, its
    // `conf` against the protocol's schema.
    let protocol = value.get("protocol");
    if let Some(p) = protocol {
        env.xrpc.check(p)?;
    }
    let subordinate = protocol
        .and_then(|p| p.get("superior_id"))
        .is_some_and(|s| !s.is_null());
    let xrpc = protocol.map(|p| Arc::new(crate::xrpc::XrpcRoute::compile(id, p, env)));

    Ok(StreamRoute {
        id: id.to_string(),
        service_id,
        remote_addr,
        server_addr,
        server_port,
        sni,
        upstream,
        inline,
        plugins,
        source,
        xrpc,
        subordinate,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sni_patterns() {
        assert!(SniMatch::new("test.com").matches("TEST.com"));
        assert!(!SniMatch::new("test.com").matches("a.test.com"));
        let wild = SniMatch::new("*.c.test");
        assert!(wild.matches("a.c.test"));
        assert!(wild.matches("x.y.c.test"));
        assert!(!wild.matches("c.test"));
        assert!(!wild.matches(".c.test"));
    }

    #[test]
    fn ip_matchers() {
        let net = ip_matcher("127.0.0.1/26").unwrap();
        assert!(net.contains(&"127.0.0.63".parse::<IpAddr>().unwrap()));
        assert!(!net.contains(&"127.0.0.64".parse::<IpAddr>().unwrap()));
        assert!(ip_matcher("127.0.0.1")
            .unwrap()
            .contains(&"127.0.0.1".parse::<IpAddr>().unwrap()));
        assert!(ip_matcher(":/8").is_none());
    }
}
