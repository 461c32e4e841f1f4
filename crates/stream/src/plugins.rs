//! The stream plugins on a connection: APISIX's `preread` phase (before any byte goes to an
//! upstream) and `log` phase (after the session ends), each plugin's conf compiled once per
//! stream route.
//!
//! - ip-restriction: `remote_addr` outside `whitelist` / inside `blacklist` closes.
//! - limit-conn: the key's sessions in flight past `conn` are delayed `default_conn_delay`,
//!   past `conn + burst` closed; the count drops when the session ends. Counts live in the
//!   same spaces as the HTTP plugin's, kept across recompiles of an unchanged conf; with
//!   `policy: redis` / `redis-cluster` they are the HTTP plugin's Redis sorted sets, keyed
//!   `limit_conn:/apisix/stream_routes/<id>:<conf version>:<key>`.
//! - mqtt-proxy: the first packet must be an MQTT CONNECT of `protocol_name` and
//!   `protocol_level` (3.1.1 or 5); its client id becomes `$mqtt_client_id`; anything else
//!   closes. The bytes read go to the upstream unchanged.
//! - traffic-split: the first rule whose `match` passes picks an upstream by weight (an entry
//!   without upstream: the route's own).
//! - prometheus: `apisix_stream_connection_total{route}` counts each session at its end.
//! - syslog: the HTTP plugin's sender and batching, fed the stream variables at the end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferrisix_config::model::ResourceKind;
use ferrisix_plugin_api::state::Lease;
use ferrisix_plugin_api::{KeyRef, LogCtx, LogVars, Owner, Plugin, RouteInfo};
use ferrisix_plugins::limit::limit_conn::{remote_incoming, ConnSpace, ConnSpaces, RemoteSlot};
use ferrisix_plugins::observe::prometheus::Metrics;
use ferrisix_plugins::support::redis::{policy_remote, Remote};
use ferrisix_plugins::PluginRegistry;
use ferrisix_proxy::snapshot::CompiledUpstream;
use ferrisix_proxy::Snapshot;
use ferrisix_router::{Expr, VarSource};
use ipnet::IpNet;
use serde_json::Value;

use crate::vars::ConnVars;
use crate::StreamEnv;

/// One compiled stream plugin of a route.
pub enum StreamPlugin {
    IpRestriction {
        whitelist: Option<Vec<IpNet>>,
        blacklist: Option<Vec<IpNet>>,
    },
    LimitConn(LimitConn),
    Mqtt {
        protocol_name: String,
        protocol_level: u8,
    },
    TrafficSplit(TrafficSplit),
    Prometheus(Arc<AtomicU64>),
    Syslog {
        plugin: Arc<dyn Plugin>,
        vars: Option<ferrisix_plugin_api::VarNames>,
    },
}

pub struct LimitConn {
    conn: u64,
    burst: u64,
    delay: f64,
    key: String,
    combination: bool,
    space: Lease<ConnSpace>,
    /// `policy: redis` / `redis-cluster`: the count lives in Redis instead of `space`.
    remote: Option<RemoteConn>,
    /// The conf this was compiled from (an unchanged conf keeps its space).
    conf: Value,
}

/// The Redis side of a stream limit-conn with a redis policy.
struct RemoteConn {
    remote: Remote,
    /// `<resource key>:<conf version>`, as APISIX's `gen_limit_key`.
    prefix: String,
    key_ttl: i64,
    clock: ferrisix_plugin_api::Clock,
    /// After a Redis error: let the session through (else close it, APISIX's 500).
    allow_degradation: bool,
}

pub struct TrafficSplit {
    rules: Vec<SplitRule>,
    conf: Value,
}

struct SplitRule {
    /// `None`: the rule always passes; else any of the expressions.
    matches: Option<Vec<Expr>>,
    /// Smooth weighted round robin's sequence over the entries (`None`: the route's own).
    sequence: Vec<usize>,
    targets: Vec<Option<Arc<CompiledUpstream>>>,
    next: AtomicU64,
}

/// What the preread phase decided.
pub enum Preread {
    Continue,
    /// Close the connection now.
    Close,
}

/// A session admitted by limit-conn, released when dropped (a Redis member is removed from
/// the Redis thread, without waiting).
pub enum ConnTicket {
    Local {
        space: Lease<ConnSpace>,
        key: String,
    },
    /// Released by the slot's own drop.
    Remote { _release: RemoteSlot },
}

impl Drop for ConnTicket {
    fn drop(&mut self) {
        if let ConnTicket::Local { space, key } = self {
            space.leaving(KeyRef::Text(key));
        }
    }
}

pub fn compile_all(
    route_id: &str,
    plugins: &Value,
    snapshot: &Snapshot,
    env: &StreamEnv,
    previous: Option<&Vec<StreamPlugin>>,
) -> Result<Vec<StreamPlugin>, String> {
    let Some(map) = plugins.as_object() else {
        return Ok(Vec::new());
    };
    let mut named: Vec<(i64, StreamPlugin)> = Vec::new();
    for (name, conf) in map {
        if conf
            .get("_meta")
            .and_then(|m| m.get("disable"))
            .and_then(Value::as_bool)
            == Some(true)
        {
            continue;
        }
        let mut conf = conf.clone();
        env.plugins.check_one(name, &mut conf)?;
        let priority = env.plugins.priority(name).unwrap_or(0);
        let compiled = match name.as_str() {
            "ip-restriction" => StreamPlugin::IpRestriction {
                whitelist: ip_list(conf.get("whitelist")),
                blacklist: ip_list(conf.get("blacklist")),
            },
            "limit-conn" => StreamPlugin::LimitConn(limit_conn(route_id, &conf, env, previous)?),
            "mqtt-proxy" => StreamPlugin::Mqtt {
                protocol_name: conf
                    .get("protocol_name")
                    .and_then(Value::as_str)
                    .unwrap_or("MQTT")
                    .to_string(),
                protocol_level: conf
                    .get("protocol_level")
                    .and_then(Value::as_u64)
                    .and_then(|l| u8::try_from(l).ok())
                    .unwrap_or(0),
            },
            "traffic-split" => {
                StreamPlugin::TrafficSplit(traffic_split(route_id, &conf, snapshot, previous)?)
            }
            "prometheus" => StreamPlugin::Prometheus(
                env.services
                    .shared::<Metrics>()
                    .stream_connection_counter(route_id),
            ),
            "syslog" => {
                let (plugin, vars) = syslog(route_id, &conf, env)?;
                StreamPlugin::Syslog { plugin, vars }
            }
            other => return Err(format!("unknown plugin [{other}]")),
        };
        named.push((priority, compiled));
    }
    named.sort_by_key(|(p, _)| std::cmp::Reverse(*p));
    Ok(named.into_iter().map(|(_, p)| p).collect())
}

/// syslog's sender for stream route `route_id`, `conf` already checked.
fn syslog(
    route_id: &str,
    conf: &Value,
    env: &StreamEnv,
) -> Result<(Arc<dyn Plugin>, Option<ferrisix_plugin_api::VarNames>), String> {
    let registry = PluginRegistry::new(env.services.clone(), Some(&["syslog".to_string()])).0;
    let route = RouteInfo {
        id: Arc::from(route_id),
        name: None,
        service_id: None,
        service_name: None,
        uris: Box::new([]),
        hosts: Box::new([]),
    };
    let plugin = registry.compile_one(
        "syslog",
        conf,
        &Owner::new(ResourceKind::StreamRoutes, route_id),
        Some(&route),
        None,
    )?;
    let vars = plugin.log_needs().vars;
    Ok((plugin, vars))
}

/// syslog as an xRPC logger of stream route `route_id`: `conf` checked (its defaults filled)
/// as the plugin's, then compiled.
pub fn compile_syslog(
    route_id: &str,
    mut conf: Value,
    env: &StreamEnv,
) -> Result<(Arc<dyn Plugin>, Option<ferrisix_plugin_api::VarNames>), String> {
    env.plugins.check_one("syslog", &mut conf)?;
    syslog(route_id, &conf, env)
}

fn ip_list(v: Option<&Value>) -> Option<Vec<IpNet>> {
    let list = v?.as_array()?;
    Some(
        list.iter()
            .filter_map(Value::as_str)
            .filter_map(|s| {
                s.parse::<std::net::IpAddr>()
                    .map(IpNet::from)
                    .ok()
                    .or_else(|| s.parse::<IpNet>().ok())
            })
            .collect(),
    )
}

fn limit_conn(
    route_id: &str,
    conf: &Value,
    env: &StreamEnv,
    previous: Option<&Vec<StreamPlugin>>,
) -> Result<LimitConn, String> {
    let reuse = previous.into_iter().flatten().find_map(|p| match p {
        StreamPlugin::LimitConn(l) if l.conf == *conf => Some(l.space.clone()),
        _ => None,
    });
    let delay = conf
        .get("default_conn_delay")
        .and_then(Value::as_f64)
        .unwrap_or(0.1);
    let space = reuse.unwrap_or_else(|| {
        let clock = env.services.clock().clone();
        // One space per route and conf, apart from the HTTP plugin's.
        let key = format!("stream_route#{route_id}#{conf}");
        env.services
            .shared::<ConnSpaces>()
            .lease(&key, || ConnSpace::new(delay, clock))
    });
    let remote = match conf.as_object() {
        Some(c) => policy_remote("limit-conn", c, &env.services)?,
        None => None,
    }
    .map(|remote| {
        let schema = env.plugins.schema("limit-conn").unwrap_or(Value::Null);
        RemoteConn {
            remote,
            prefix: format!(
                "/apisix/stream_routes/{route_id}:{}",
                ferrisix_plugin_api::compile::conf_version(&schema, conf)
            ),
            key_ttl: conf.get("key_ttl").and_then(Value::as_i64).unwrap_or(3600),
            clock: env.services.clock().clone(),
            allow_degradation: conf.get("allow_degradation").and_then(Value::as_bool) == Some(true),
        }
    });
    Ok(LimitConn {
        conn: conf.get("conn").and_then(Value::as_u64).unwrap_or(1),
        burst: conf.get("burst").and_then(Value::as_u64).unwrap_or(0),
        delay,
        key: conf
            .get("key")
            .and_then(Value::as_str)
            .unwrap_or("remote_addr")
            .to_string(),
        combination: conf.get("key_type").and_then(Value::as_str) == Some("var_combination"),
        space,
        remote,
        conf: conf.clone(),
    })
}

/// What limit-conn decided for a session.
enum Admission {
    /// Counted: hold the ticket for the session, after waiting the delay if any.
    In(ConnTicket, Option<Duration>),
    /// Not counted (a Redis error with `allow_degradation`): go on.
    Uncounted,
    /// Past `conn + burst`, or a Redis error: close.
    Refused,
}

impl LimitConn {
    async fn admit(&self, vars: &ConnVars) -> Admission {
        let value = if self.combination {
            let (text, n) = ferrisix_proxy::upstream::balancer::resolve_template(&self.key, &|n| {
                vars.var(n).map(|v| std::borrow::Cow::Owned(v.into_owned()))
            });
            (n > 0).then_some(text)
        } else {
            vars.var(self.key.trim_start_matches('$'))
                .map(|v| v.into_owned())
        };
        // APISIX: a key with no value counts under the client address.
        let key = value
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| vars.remote.ip().to_string());
        let max = self.conn.saturating_add(self.burst);
        let delay_for = |count: u64| {
            (count > self.conn).then(|| {
                Duration::try_from_secs_f64(self.delay).unwrap_or(Duration::from_millis(100))
            })
        };
        if let Some(r) = &self.remote {
            let key = format!("limit_conn:{}:{key}", r.prefix);
            let now_s = r.clock.epoch_ms() / 1000;
            return match remote_incoming(&r.remote, key, max, r.key_ttl, now_s).await {
                Ok(Some((count, slot))) => {
                    Admission::In(ConnTicket::Remote { _release: slot }, delay_for(count))
                }
                Ok(None) => Admission::Refused,
                Err(e) => {
                    tracing::error!("failed to limit conn: {e}");
                    if r.allow_degradation {
                        Admission::Uncounted
                    } else {
                        Admission::Refused
                    }
                }
            };
        }
        match self.space.incoming(KeyRef::Text(&key), max) {
            None => Admission::Refused,
            Some(count) => Admission::In(
                ConnTicket::Local {
                    space: self.space.clone(),
                    key,
                },
                delay_for(count),
            ),
        }
    }
}

fn traffic_split(
    route_id: &str,
    conf: &Value,
    snapshot: &Snapshot,
    previous: Option<&Vec<StreamPlugin>>,
) -> Result<TrafficSplit, String> {
    let reuse = previous.into_iter().flatten().find_map(|p| match p {
        StreamPlugin::TrafficSplit(t) if t.conf == *conf => Some(t),
        _ => None,
    });
    let mut rules = Vec::new();
    let empty = Vec::new();
    let list = conf
        .get("rules")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    for (ri, rule) in list.iter().enumerate() {
        let matches = match rule.get("match").and_then(Value::as_array) {
            None => None,
            Some(ms) => Some(
                ms.iter()
                    .map(|m| {
                        ferrisix_config::vars::compile_vars(
                            m.get("vars").unwrap_or(&Value::Array(Vec::new())),
                        )
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        let mut weights = Vec::new();
        let mut targets = Vec::new();
        let entries = rule
            .get("weighted_upstreams")
            .and_then(Value::as_array)
            .unwrap_or(&empty);
        for (ui, entry) in entries.iter().enumerate() {
            let weight = entry.get("weight").and_then(Value::as_u64).unwrap_or(1);
            let target = if let Some(up) = entry.get("upstream").filter(|u| u.is_object()) {
                let previous = reuse.and_then(|t| t.rules.get(ri)?.targets.get(ui)?.clone());
                let holder =
                    format!("{route_id}#traffic-split.rules[{ri}].weighted_upstreams[{ui}]");
                Some(snapshot.compile_upstream(
                    ResourceKind::StreamRoutes,
                    &holder,
                    up,
                    previous.as_ref(),
                )?)
            } else if let Some(uid) = entry.get("upstream_id") {
                let uid = match uid {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                Some(
                    snapshot
                        .upstreams
                        .get(&uid)
                        .cloned()
                        .ok_or_else(|| format!("failed to find upstream by id: {uid}"))?,
                )
            } else {
                None
            };
            weights.push(weight);
            targets.push(target);
        }
        let next = reuse
            .and_then(|t| t.rules.get(ri))
            .map_or(0, |r| r.next.load(Ordering::Relaxed));
        rules.push(SplitRule {
            matches,
            sequence: smooth_wrr(&weights),
            targets,
            next: AtomicU64::new(next),
        });
    }
    Ok(TrafficSplit {
        rules,
        conf: conf.clone(),
    })
}

/// The order smooth weighted round robin visits the entries in, one full cycle (weights
/// reduced by their gcd, capped so the cycle stays small).
fn smooth_wrr(weights: &[u64]) -> Vec<usize> {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let g = weights.iter().copied().fold(0, gcd).max(1);
    let mut w: Vec<i64> = weights.iter().map(|x| (x / g) as i64).collect();
    let total: i64 = w.iter().sum();
    if total > 4096 {
        let scale = total as f64 / 4096.0;
        for x in &mut w {
            if *x > 0 {
                *x = ((*x as f64 / scale).round() as i64).max(1);
            }
        }
    }
    let total: i64 = w.iter().sum();
    let mut current = vec![0i64; w.len()];
    let mut out = Vec::with_capacity(total.max(0) as usize);
    for _ in 0..total {
        let mut best = 0;
        for i in 0..w.len() {
            current[i] += w[i];
            if current[i] > current[best] {
                best = i;
            }
        }
        current[best] -= total;
        out.push(best);
    }
    out
}

impl TrafficSplit {
    /// The upstream picked for this session: `None` keeps the route's.
    pub fn pick(&self, vars: &ConnVars) -> Option<Arc<CompiledUpstream>> {
        let rule = self.rules.iter().find(|r| match &r.matches {
            None => true,
            Some(ms) => ms.iter().any(|m| m.eval(vars)),
        })?;
        if rule.sequence.is_empty() {
            return None;
        }
        let n = rule.next.fetch_add(1, Ordering::Relaxed) as usize;
        let idx = rule.sequence[n % rule.sequence.len()];
        rule.targets.get(idx).cloned().flatten()
    }
}

/// What the preread phase leaves for the session.
#[derive(Default)]
pub struct Session {
    pub tickets: Vec<ConnTicket>,
    /// traffic-split's choice over the route's upstream.
    pub upstream: Option<Arc<CompiledUpstream>>,
    /// mqtt-proxy's CONNECT packet, read from the client, to send on first.
    pub preread: Vec<u8>,
    /// The route has mqtt-proxy: its CONNECT must be read first.
    pub mqtt: Option<(String, u8)>,
}

/// The preread phase up to mqtt-proxy's read: ip-restriction, limit-conn, traffic-split
/// (mqtt-proxy's own check runs where the bytes are read, see [`check_mqtt_connect`]).
pub async fn preread(plugins: &[StreamPlugin], vars: &ConnVars, session: &mut Session) -> Preread {
    for p in plugins {
        match p {
            StreamPlugin::IpRestriction {
                whitelist,
                blacklist,
            } => {
                let ip = match vars.remote.ip() {
                    std::net::IpAddr::V6(v6) => v6
                        .to_ipv4_mapped()
                        .map_or(vars.remote.ip(), std::net::IpAddr::V4),
                    v4 => v4,
                };
                if let Some(list) = blacklist {
                    if list.iter().any(|n| n.contains(&ip)) {
                        return Preread::Close;
                    }
                }
                if let Some(list) = whitelist {
                    if !list.iter().any(|n| n.contains(&ip)) {
                        return Preread::Close;
                    }
                }
            }
            StreamPlugin::LimitConn(l) => match l.admit(vars).await {
                Admission::Refused => return Preread::Close,
                Admission::Uncounted => {}
                Admission::In(ticket, delay) => {
                    session.tickets.push(ticket);
                    if let Some(d) = delay {
                        tokio::time::sleep(d).await;
                    }
                }
            },
            StreamPlugin::Mqtt {
                protocol_name,
                protocol_level,
            } => session.mqtt = Some((protocol_name.clone(), *protocol_level)),
            StreamPlugin::TrafficSplit(t) => {
                if let Some(up) = t.pick(vars) {
                    session.upstream = Some(up);
                }
            }
            StreamPlugin::Prometheus(_) | StreamPlugin::Syslog { .. } => {}
        }
    }
    Preread::Continue
}

/// The log phase, once the session is over.
pub fn log(plugins: &[StreamPlugin], vars: &ConnVars) {
    for p in plugins {
        match p {
            StreamPlugin::Prometheus(counter) => {
                counter.fetch_add(1, Ordering::Relaxed);
            }
            StreamPlugin::Syslog {
                plugin,
                vars: names,
            } => {
                let ctx = LogCtx {
                    status: 200,
                    request_time: vars.started.elapsed(),
                    vars: names
                        .clone()
                        .map(|n| LogVars::capture(n, vars))
                        .unwrap_or_default(),
                    ..LogCtx::default()
                };
                plugin.log(&ctx);
            }
            _ => {}
        }
    }
}

/// What reading an MQTT CONNECT found.
#[derive(Debug, PartialEq, Eq)]
pub enum MqttRead {
    /// More bytes are needed.
    Incomplete,
    /// A CONNECT of the expected protocol: its client id.
    Connect(String),
    /// Not a CONNECT, another protocol or level, or malformed: close.
    Bad(&'static str),
}

/// mqtt-proxy's `preread`: the first packet in `data` against the conf.
pub fn check_mqtt_connect(data: &[u8], name: &str, level: u8) -> MqttRead {
    let Some(&first) = data.first() else {
        return MqttRead::Incomplete;
    };
    if !(16..=32).contains(&first) {
        return MqttRead::Bad("Received unexpected MQTT packet type+flags");
    }
    // Remaining length: up to four bytes, 7 bits each.
    let mut len: usize = 0;
    let mut mult: usize = 1;
    let mut pos = 1;
    loop {
        let Some(&b) = data.get(pos) else {
            return MqttRead::Incomplete;
        };
        len += usize::from(b & 127) * mult;
        mult *= 128;
        pos += 1;
        if b & 128 == 0 {
            break;
        }
        if pos > 4 {
            return MqttRead::Bad("malformed remaining length");
        }
    }
    let end = pos + len;
    if data.len() < end {
        return MqttRead::Incomplete;
    }
    let body = &data[pos..end];
    let u16_at = |i: usize| -> Option<usize> {
        Some(usize::from(*body.get(i)?) << 8 | usize::from(*body.get(i + 1)?))
    };
    let Some(name_len) = u16_at(0) else {
        return MqttRead::Bad("truncated CONNECT");
    };
    let Some(proto) = body.get(2..2 + name_len) else {
        return MqttRead::Bad("truncated CONNECT");
    };
    if proto != name.as_bytes() {
        return MqttRead::Bad("unexpected protocol name");
    }
    let mut i = 2 + name_len;
    let Some(&got_level) = body.get(i) else {
        return MqttRead::Bad("truncated CONNECT");
    };
    if got_level != level {
        return MqttRead::Bad("unexpected protocol level");
    }
    // Level, connect flags, keep alive.
    i += 4;
    if level == 5 {
        // Properties: a variable byte integer length, then the properties.
        let mut plen = 0usize;
        let mut m = 1usize;
        loop {
            let Some(&b) = body.get(i) else {
                return MqttRead::Bad("truncated CONNECT");
            };
            plen += usize::from(b & 127) * m;
            m *= 128;
            i += 1;
            if b & 128 == 0 {
                break;
            }
            if m > 128 * 128 * 128 * 128 {
                return MqttRead::Bad("malformed properties length");
            }
        }
        i += plen;
    }
    let Some(id_len) = u16_at(i) else {
        return MqttRead::Bad("truncated CONNECT");
    };
    match body.get(i + 2..i + 2 + id_len) {
        Some(id) => MqttRead::Connect(String::from_utf8_lossy(id).into_owned()),
        None => MqttRead::Bad("truncated CONNECT"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        s.split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect()
    }

    #[test]
    fn mqtt_connect_packets() {
        let v311 = hex("10 0f 00 04 4d 51 54 54 04 02 00 3c 00 03 66 6f 6f");
        assert_eq!(
            check_mqtt_connect(&v311, "MQTT", 4),
            MqttRead::Connect("foo".into())
        );
        assert_eq!(
            check_mqtt_connect(&v311[..5], "MQTT", 4),
            MqttRead::Incomplete
        );
        let empty = hex("10 0c 00 04 4d 51 54 54 04 02 00 3c 00 00");
        assert_eq!(
            check_mqtt_connect(&empty, "MQTT", 4),
            MqttRead::Connect(String::new())
        );
        let v5 = hex("10 0d 00 04 4d 51 54 54 05 02 00 3c 00 00 00");
        assert!(matches!(
            check_mqtt_connect(&v5, "MQTT", 4),
            MqttRead::Bad(_)
        ));
        assert_eq!(
            check_mqtt_connect(&v5, "MQTT", 5),
            MqttRead::Connect(String::new())
        );
        let v5_id = hex("10 10 00 04 4d 51 54 54 05 02 00 3c 00 00 03 63 6c 69");
        assert_eq!(
            check_mqtt_connect(&v5_id, "MQTT", 5),
            MqttRead::Connect("cli".into())
        );
        assert!(matches!(
            check_mqtt_connect(b"mmmmmm\n", "MQTT", 4),
            MqttRead::Bad(_)
        ));
    }

    #[test]
    fn weighted_sequence() {
        let seq = smooth_wrr(&[3, 1]);
        assert_eq!(seq.len(), 4);
        assert_eq!(seq.iter().filter(|i| **i == 0).count(), 3);
        assert_eq!(smooth_wrr(&[2, 2]), vec![0, 1]);
        assert!(smooth_wrr(&[0, 0]).is_empty());
    }
}
