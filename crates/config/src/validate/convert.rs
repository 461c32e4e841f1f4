//! Builds the typed model from resources that passed validation.
//!
//! Each converter validates first (so a caller cannot build a model from a document APISIX
//! would refuse) and then reads the checked copy, which carries the schema defaults
//! (`priority: 0`, upstream `type: roundrobin`, `pass_host: pass`, keepalive pool sizes ...).
//! Alternative spellings are normalised here: `uri`/`host`/`remote_addr` become one-element
//! lists, map-form nodes become [`Node`]s in document order, hosts are lower-cased.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::addr::parse_addr;
use super::checks::{
    check_synced_in_place, id_text, AcceptAnyPlugin, PluginCheck, ValidationError,
};
use crate::model::{
    GlobalRule, KeepalivePool, LbType, Node, OcspStapling, PassHost, PluginConfig, ResourceKind,
    Route, Scheme, Service, Ssl, SslClient, SslType, Timeout, Upstream,
};

/// Validates a route (as [`super::check_resource`]) and converts it. `id` is the key's id; it is
/// also written into the checked copy when the document has none, as the Admin API does.
pub fn route_from_value(
    id: &str,
    v: impl Document,
    plugins: &dyn PluginCheck,
) -> Result<Route, ValidationError> {
    let conf = checked(ResourceKind::Routes, Some(id), v, plugins)?;
    let methods = strings(conf.get("methods"));
    Ok(Route {
        id: id.to_string(),
        name: string(conf.get("name")),
        uris: one_or_many(&conf, "uri", "uris"),
        hosts: lower(one_or_many(&conf, "host", "hosts")),
        // An empty list leaves the method unconstrained in APISIX's router.
        methods: (!methods.is_empty()).then_some(methods),
        remote_addrs: one_or_many(&conf, "remote_addr", "remote_addrs"),
        vars: conf
            .get("vars")
            .filter(|v| !v.is_null())
            .map(|v| Box::new(v.clone())),
        priority: conf
            .get("priority")
            .and_then(Value::as_f64)
            .map_or(0, |p| p as i64),
        enabled: conf.get("status").and_then(Value::as_f64) != Some(0.0),
        plugins: object(conf.get("plugins")),
        upstream: inline_upstream(&conf),
        upstream_id: conf.get("upstream_id").map(id_text),
        service_id: conf.get("service_id").map(id_text),
        plugin_config_id: conf.get("plugin_config_id").map(id_text),
        timeout: timeout(conf.get("timeout")).map(Box::new),
        enable_websocket: conf.get("enable_websocket").and_then(Value::as_bool),
    })
}

/// Validates a stored upstream and converts it; `id` is `None` for an upstream that is not
/// stored on its own.
pub fn upstream_from_value(
    id: Option<&str>,
    v: impl Document,
) -> Result<Upstream, ValidationError> {
    let conf = checked(ResourceKind::Upstreams, id, v, &AcceptAnyPlugin)?;
    Ok(build_upstream(id.map(str::to_string), &conf))
}

pub fn service_from_value(
    id: &str,
    v: impl Document,
    plugins: &dyn PluginCheck,
) -> Result<Service, ValidationError> {
    let conf = checked(ResourceKind::Services, Some(id), v, plugins)?;
    Ok(Service {
        id: id.to_string(),
        name: string(conf.get("name")),
        hosts: lower(strings(conf.get("hosts"))),
        plugins: object(conf.get("plugins")),
        upstream: inline_upstream(&conf),
        upstream_id: conf.get("upstream_id").map(id_text),
        enable_websocket: conf.get("enable_websocket").and_then(Value::as_bool),
    })
}

pub fn plugin_config_from_value(
    id: &str,
    v: impl Document,
    plugins: &dyn PluginCheck,
) -> Result<PluginConfig, ValidationError> {
    Ok(PluginConfig {
        id: id.to_string(),
        plugins: plugins_only(ResourceKind::PluginConfigs, id, v, plugins)?,
    })
}

pub fn global_rule_from_value(
    id: &str,
    v: impl Document,
    plugins: &dyn PluginCheck,
) -> Result<GlobalRule, ValidationError> {
    Ok(GlobalRule {
        id: id.to_string(),
        plugins: plugins_only(ResourceKind::GlobalRules, id, v, plugins)?,
    })
}

/// Checks a plugin config or global rule, which hold nothing but their plugins; the plugins.
fn plugins_only(
    kind: ResourceKind,
    id: &str,
    v: impl Document,
    plugins: &dyn PluginCheck,
) -> Result<Map<String, Value>, ValidationError> {
    Ok(object(checked(kind, Some(id), v, plugins)?.get("plugins")))
}

/// A route's or service's own `upstream` object, converted (a non-table one is none).
fn inline_upstream(conf: &Value) -> Option<Arc<Upstream>> {
    conf.get("upstream")
        .filter(|u| is_table(u))
        .map(|u| Arc::new(build_upstream(None, u)))
}

/// Decrypts a stored ssl's keys with `keyring`, validates it (the certificate and keys must
/// parse) and converts it. A key that does not belong to its certificate passes, as in APISIX.
pub fn ssl_from_value(
    id: &str,
    v: &Value,
    keyring: &crate::encrypt::Keyring,
) -> Result<Ssl, ValidationError> {
    let mut plain = v.clone();
    keyring.decrypt_ssl(&mut plain).map_err(|e| {
        ValidationError::from(format!("failed to decrypt previous encrypted key: {e}"))
    })?;
    let conf = checked(ResourceKind::Ssls, None, &plain, &AcceptAnyPlugin)?;
    let text = |k: &str| conf.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let list = |k: &str| strings(conf.get(k));
    // APISIX's ssl_filter: a trailing dot goes, names are lower-cased.
    let norm = |s: &str| s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase();
    let (snis, sni_list) = match conf.get("snis").and_then(Value::as_array) {
        Some(a) if !a.is_empty() => (a.iter().filter_map(Value::as_str).map(norm).collect(), true),
        _ => (
            conf.get("sni")
                .and_then(Value::as_str)
                .map(norm)
                .into_iter()
                .collect(),
            false,
        ),
    };
    let client = conf
        .get("client")
        .filter(|c| c.is_object())
        .map(|c| SslClient {
            ca: c.get("ca").and_then(Value::as_str).unwrap_or("").to_owned(),
            depth: c.get("depth").and_then(Value::as_u64).unwrap_or(1) as u32,
            skip_mtls_uri_regex: c
                .get("skip_mtls_uri_regex")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
        });
    Ok(Ssl {
        id: id.to_string(),
        ssl_type: match conf.get("type").and_then(Value::as_str) {
            Some("client") => SslType::Client,
            _ => SslType::Server,
        },
        cert: text("cert"),
        key: text("key"),
        certs: list("certs"),
        keys: list("keys"),
        snis,
        sni_list,
        client,
        enabled: conf.get("status").and_then(Value::as_i64) != Some(0),
        ssl_protocols: conf.get("ssl_protocols").map(|_| list("ssl_protocols")),
        ocsp_stapling: conf
            .get("ocsp_stapling")
            .filter(|o| o.is_object())
            .map(|o| OcspStapling {
                enabled: o.get("enabled").and_then(Value::as_bool).unwrap_or(false),
                skip_verify: o
                    .get("skip_verify")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                cache_ttl: o.get("cache_ttl").and_then(Value::as_u64).unwrap_or(3600),
            }),
    })
}

/// A document to validate: checking writes the schema defaults into it, so a borrowed one is
/// copied first and an owned one (a stored value just parsed, at boot 100,000 of them) is
/// checked in place.
pub trait Document {
    fn into_value(self) -> Value;
}

impl Document for &Value {
    fn into_value(self) -> Value {
        self.clone()
    }
}

impl Document for Value {
    fn into_value(self) -> Value {
        self
    }
}

fn checked(
    kind: ResourceKind,
    id: Option<&str>,
    v: impl Document,
    plugins: &dyn PluginCheck,
) -> Result<Value, ValidationError> {
    let mut conf = v.into_value();
    if let (Some(id), Value::Object(m)) = (id, &mut conf) {
        // Global rules and plugin configs require an id in the document; the Admin API puts
        // the key's id there before checking, so a stored document may lack it.
        m.entry("id")
            .or_insert_with(|| Value::String(id.to_string()));
    }
    check_synced_in_place(kind, &mut conf, plugins)?;
    Ok(conf)
}

fn build_upstream(id: Option<String>, u: &Value) -> Upstream {
    let scheme = match u.get("scheme").and_then(Value::as_str) {
        Some("https") => Scheme::Https,
        Some("grpc") => Scheme::Grpc,
        Some("grpcs") => Scheme::Grpcs,
        Some("tcp") => Scheme::Tcp,
        Some("tls") => Scheme::Tls,
        Some("udp") => Scheme::Udp,
        Some("kafka") => Scheme::Kafka,
        _ => Scheme::Http,
    };
    let pass_host = match u.get("pass_host").and_then(Value::as_str) {
        Some("node") => PassHost::Node,
        Some("rewrite") => PassHost::Rewrite,
        _ => PassHost::Pass,
    };
    let lb_type = u
        .get("type")
        .cloned()
        .and_then(|t| serde_json::from_value::<LbType>(t).ok())
        .unwrap_or_default();
    let keepalive_pool = match u.get("keepalive_pool") {
        Some(pool) if is_table(pool) => {
            let default = KeepalivePool::default();
            KeepalivePool {
                size: pool
                    .get("size")
                    .and_then(saturating_u32)
                    .unwrap_or(default.size),
                idle_timeout: pool
                    .get("idle_timeout")
                    .and_then(Value::as_f64)
                    .unwrap_or(default.idle_timeout),
                requests: pool
                    .get("requests")
                    .and_then(saturating_u32)
                    .unwrap_or(default.requests),
            }
        }
        _ => KeepalivePool::default(),
    };
    Upstream {
        id,
        name: string(u.get("name")),
        nodes: u.get("nodes").map(|n| nodes(n, scheme)).unwrap_or_default(),
        lb_type,
        hash_on: string(u.get("hash_on")),
        key: string(u.get("key")),
        retries: u.get("retries").and_then(saturating_u32),
        retry_timeout: u
            .get("retry_timeout")
            .and_then(Value::as_f64)
            .unwrap_or(0.0),
        timeout: timeout(u.get("timeout")),
        pass_host,
        upstream_host: string(u.get("upstream_host")),
        scheme,
        keepalive_pool,
        checks: u.get("checks").map(|v| Box::new(v.clone())),
        tls: u.get("tls").map(|v| Box::new(v.clone())),
        discovery_type: string(u.get("discovery_type")),
        service_name: string(u.get("service_name")),
        discovery_args: u.get("discovery_args").map(|v| Box::new(v.clone())),
        http2: u
            .get("labels")
            .and_then(|l| l.get(crate::model::HTTP_VERSION_LABEL))
            .and_then(Value::as_str)
            == Some("2"),
    }
}

/// Both node forms as [`Node`]s. Map keys are split like APISIX's `parse_addr`; a node without a
/// port gets the scheme's default port, and a bare IPv6 host is bracketed.
fn nodes(v: &Value, scheme: Scheme) -> Vec<Node> {
    let mut nodes = nodes_of(v, scheme);
    // The filtered list's growth leaves room for four (kept in every typed upstream).
    nodes.shrink_to_fit();
    nodes
}

fn nodes_of(v: &Value, scheme: Scheme) -> Vec<Node> {
    let port_or_default = |p: Option<f64>| match p {
        Some(p) if (1.0..=65535.0).contains(&p) => p as u16,
        _ => scheme.default_port(),
    };
    match v {
        Value::Object(map) => map
            .iter()
            .map(|(addr, weight)| {
                let (host, port) = parse_addr(addr);
                Node {
                    host: bracket_ipv6(host),
                    port: port_or_default(port),
                    weight: saturating_u32(weight).unwrap_or(0),
                    priority: 0,
                    metadata: None,
                }
            })
            .collect(),
        Value::Array(list) => list
            .iter()
            .filter_map(|n| {
                let host = n.get("host")?.as_str()?;
                Some(Node {
                    host: bracket_ipv6(host),
                    port: port_or_default(n.get("port").and_then(Value::as_f64)),
                    weight: n.get("weight").and_then(saturating_u32).unwrap_or(0),
                    priority: n
                        .get("priority")
                        .and_then(Value::as_f64)
                        .map_or(0, |p| p as i64),
                    metadata: n.get("metadata").map(|v| Box::new(v.clone())),
                })
            })
            .collect::<Vec<_>>(),
        _ => Vec::new(),
    }
}

fn bracket_ipv6(host: &str) -> String {
    if !host.starts_with('[') && host.parse::<std::net::Ipv6Addr>().is_ok() {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

fn is_table(v: &Value) -> bool {
    matches!(v, Value::Object(_) | Value::Array(_))
}

fn string(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str).map(str::to_string)
}

/// The strings of a JSON array, other items skipped; none where it is absent or no array.
pub(super) fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// `single` as a one-element list, else the `many` list.
fn one_or_many(conf: &Value, single: &str, many: &str) -> Vec<String> {
    match conf.get(single).and_then(Value::as_str) {
        Some(s) => vec![s.to_string()],
        None => strings(conf.get(many)),
    }
}

fn lower(v: Vec<String>) -> Vec<String> {
    v.into_iter().map(|s| s.to_ascii_lowercase()).collect()
}

fn object(v: Option<&Value>) -> Map<String, Value> {
    v.and_then(Value::as_object).cloned().unwrap_or_default()
}

fn timeout(v: Option<&Value>) -> Option<Timeout> {
    let v = v?;
    Some(Timeout {
        connect: v.get("connect")?.as_f64()?,
        send: v.get("send")?.as_f64()?,
        read: v.get("read")?.as_f64()?,
    })
}

fn saturating_u32(v: &Value) -> Option<u32> {
    let x = v.as_f64()?;
    Some(if x <= 0.0 {
        0
    } else if x >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        x as u32
    })
}
