//! Upstreams as the request path needs them: nodes resolved as far as compile time allows, a
//! balancer, retry and timeout settings, pool limits, and for `https`/`grpcs` the TLS client
//! config. An upstream keeps its compiled form (and so its balancer's position) across
//! snapshots while its definition, and the client certificate it names, are unchanged.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ferrisix_config::model::{LbType, PassHost, ResourceKind, Scheme, Timeout, Upstream};
use ferrisix_plugin_api::{UpstreamRef, UpstreamResolver};
use ferrisix_tls::{CertStore, TlsContext, UpstreamTls};
use http::HeaderValue;
use serde_json::Value;

use super::accept::{Accepted, Quarantined};
use super::diff::Difference;
use crate::balancer::{NodeWeight, UpstreamPicker};
use crate::client::{PoolLimits, TryTimeouts};

/// One upstream node, resolved as far as compile time allows.
#[derive(Clone, Debug)]
pub struct NodeTarget {
    pub host: String,
    pub port: u16,
    /// Known when the host is an IP literal; domains are resolved at connect time.
    pub addr: Option<SocketAddr>,
    /// `Host` for `pass_host: node`: the node host, plus `:port` unless it is the scheme default.
    pub host_header: HeaderValue,
    /// `ip:port`, as `$upstream_addr` shows it.
    pub addr_text: String,
}

pub struct CompiledUpstream {
    pub id: Option<String>,
    pub nodes: Vec<NodeTarget>,
    pub picker: UpstreamPicker,
    /// Total tries allowed: `retries` + 1.
    pub max_tries: usize,
    pub retry_timeout: Option<Duration>,
    pub timeouts: TryTimeouts,
    pub pass_host: PassHost,
    pub upstream_host: Option<HeaderValue>,
    pub pool: PoolLimits,
    pub scheme: Scheme,
    /// The client config for `https`/`grpcs`.
    pub tls: Option<UpstreamTls>,
    /// HTTP/2 to the upstream (`grpc`, `grpcs`).
    pub h2: bool,
    /// The fingerprint of the `tls.client_cert_id` certificate it was compiled with.
    client_cert_fp: u64,
    /// The definition it was compiled from: an inline upstream is reused while its owner's
    /// copy is equal.
    pub(super) source: Upstream,
}

/// What compiling TLS upstreams needs: the settings and keyring, and the snapshot's ssls
/// (for `tls.client_cert_id`).
#[derive(Clone, Copy)]
pub(super) struct UpstreamEnv<'a> {
    pub ctx: &'a TlsContext,
    pub store: &'a CertStore,
}

impl UpstreamEnv<'_> {
    fn client_cert_fp(&self, up: &Upstream) -> u64 {
        client_cert_id(up)
            .and_then(|id| self.store.client_identity(&id))
            .map_or(0, |c| c.fingerprint)
    }

    /// Whether `c` still is what compiling `up` would give.
    pub fn reusable(&self, c: &CompiledUpstream, up: &Upstream) -> bool {
        c.source == *up && c.client_cert_fp == self.client_cert_fp(up)
    }
}

pub(super) fn client_cert_id(up: &Upstream) -> Option<String> {
    up.tls
        .as_ref()
        .and_then(|t| t.get("client_cert_id"))
        .map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
}

/// The upstream's TLS client config (`https`, `grpcs`), with the client certificate from
/// `tls.client_cert`/`client_key` or from the ssl named by `tls.client_cert_id`.
fn upstream_tls(up: &Upstream, env: UpstreamEnv<'_>, h2: bool) -> Result<UpstreamTls, String> {
    let tls = up.tls.as_ref();
    let field = |k: &str| tls.and_then(|t| t.get(k)).and_then(Value::as_str);
    let verify = tls
        .and_then(|t| t.get("verify"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let identity = if let Some(id) = client_cert_id(up) {
        match env.store.client_identity(&id) {
            Some(c) => Some((c.key.clone(), c.fingerprint)),
            None => return Err(format!("failed to fetch ssl info by ssl id [{id}], not found or not a usable client certificate")),
        }
    } else if let (Some(cert), Some(key)) = (field("client_cert"), field("client_key")) {
        let key = env
            .ctx
            .keyring
            .decrypt_pkey(key)
            .map_err(|e| format!("failed to decrypt tls.client_key: {e}"))?;
        Some(UpstreamTls::identity_from_pem(
            cert,
            &key,
            &env.ctx.settings,
        )?)
    } else {
        None
    };
    let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
    UpstreamTls::new(&env.ctx.settings, verify, identity, alpn)
}

impl CompiledUpstream {
    pub(super) fn compile(up: &Upstream, env: UpstreamEnv<'_>) -> Result<CompiledUpstream, String> {
        let (tls, h2) = match up.scheme {
            Scheme::Http => (None, false),
            Scheme::Https => (Some(upstream_tls(up, env, false)?), false),
            Scheme::Grpc => (None, true),
            Scheme::Grpcs => (Some(upstream_tls(up, env, true)?), true),
            // L4 schemes belong to stream routes, which ferrisix does not have.
            other => {
                return Err(format!(
                    "upstream scheme {other:?} is for stream routes, which are not supported"
                ))
            }
        };
        if up.lb_type != LbType::RoundRobin {
            // Said out loud rather than hidden: only roundrobin is built so far.
            tracing::warn!(
                upstream = up.id.as_deref().unwrap_or("(inline)"),
                lb_type = ?up.lb_type,
                "balancer type not supported yet; balancing roundrobin"
            );
        }
        let mut nodes = Vec::with_capacity(up.nodes.len());
        for n in &up.nodes {
            let bare = n.host.trim_start_matches('[').trim_end_matches(']');
            let addr = bare
                .parse::<IpAddr>()
                .ok()
                .map(|ip| SocketAddr::new(ip, n.port));
            let host_header = if n.port == up.scheme.default_port() {
                n.host.clone()
            } else {
                format!("{}:{}", n.host, n.port)
            };
            let host_header = HeaderValue::from_str(&host_header)
                .map_err(|_| format!("invalid node host {}", n.host))?;
            nodes.push(NodeTarget {
                host: n.host.clone(),
                port: n.port,
                addr,
                host_header,
                addr_text: format!("{}:{}", n.host, n.port),
            });
        }
        let weights: Vec<NodeWeight> = up
            .nodes
            .iter()
            .map(|n| NodeWeight {
                weight: n.weight,
                priority: n.priority,
            })
            .collect();
        let picker = UpstreamPicker::new(&weights, |n| {
            if n == 0 {
                0
            } else {
                rand::random::<usize>() % n
            }
        });
        let retries = match up.retries {
            Some(r) => r as usize,
            None => up.nodes.len().saturating_sub(1),
        };
        let upstream_host = match &up.upstream_host {
            Some(h) => {
                Some(HeaderValue::from_str(h).map_err(|_| format!("invalid upstream_host {h}"))?)
            }
            None => None,
        };
        Ok(CompiledUpstream {
            id: up.id.clone(),
            nodes,
            picker,
            max_tries: retries + 1,
            retry_timeout: (up.retry_timeout > 0.0).then(|| secs(up.retry_timeout)),
            timeouts: up.timeout.map(try_timeouts).unwrap_or_default(),
            pass_host: up.pass_host,
            upstream_host,
            pool: PoolLimits {
                size: up.keepalive_pool.size as usize,
                idle_timeout: secs(up.keepalive_pool.idle_timeout),
                max_requests: up.keepalive_pool.requests,
            },
            scheme: up.scheme,
            tls,
            h2,
            client_cert_fp: env.client_cert_fp(up),
            source: up.clone(),
        })
    }
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
}

pub(super) fn try_timeouts(t: Timeout) -> TryTimeouts {
    TryTimeouts {
        connect: secs(t.connect),
        send: secs(t.send),
        read: secs(t.read),
    }
}

/// The upstreams by id: unchanged ones keep their compiled form, changed and added ones are
/// compiled (an upstream that does not compile is quarantined and left out: routes using it
/// answer 502). An upstream whose `tls.client_cert_id` certificate changed is compiled again.
pub(super) fn upstreams_by_id(
    applied: &HashMap<String, Accepted<Upstream>>,
    changed: &Difference,
    previous: &HashMap<String, Arc<CompiledUpstream>>,
    env: UpstreamEnv<'_>,
    quarantine: &mut Vec<Quarantined>,
) -> HashMap<String, Arc<CompiledUpstream>> {
    let mut out = HashMap::with_capacity(applied.len());
    for (id, acc) in applied {
        let reuse = previous
            .get(id)
            .filter(|c| !changed.touches(id) && env.reusable(c, &acc.typed))
            .cloned();
        let compiled = match reuse {
            Some(c) => c,
            None => match CompiledUpstream::compile(&acc.typed, env) {
                Ok(c) => Arc::new(c),
                Err(e) => {
                    quarantine.push(Quarantined::new(ResourceKind::Upstreams, id, e));
                    continue;
                }
            },
        };
        out.insert(id.clone(), compiled);
    }
    out
}

/// An inline upstream (of a route or a service): the previous compiled form while it is still
/// what compiling the definition would give, else a new one.
pub(super) fn inline_upstream(
    up: &Upstream,
    previous: Option<&Arc<CompiledUpstream>>,
    env: UpstreamEnv<'_>,
) -> Result<Arc<CompiledUpstream>, String> {
    match previous.filter(|c| env.reusable(c, up)) {
        Some(c) => Ok(c.clone()),
        None => CompiledUpstream::compile(up, env).map(Arc::new),
    }
}

/// The upstreams plugins may send requests to, as compiled for the snapshot being built.
pub(super) struct CompiledUpstreams<'a> {
    by_id: &'a HashMap<String, Arc<CompiledUpstream>>,
    env: UpstreamEnv<'a>,
}

impl<'a> CompiledUpstreams<'a> {
    pub fn new(
        by_id: &'a HashMap<String, Arc<CompiledUpstream>>,
        env: UpstreamEnv<'a>,
    ) -> CompiledUpstreams<'a> {
        CompiledUpstreams { by_id, env }
    }
}

impl UpstreamResolver for CompiledUpstreams<'_> {
    fn upstream_by_id(&self, id: &str) -> Result<UpstreamRef, String> {
        self.by_id
            .get(id)
            .map(|u| UpstreamRef::new(u.clone()))
            .ok_or_else(|| format!("failed to find upstream by id: {id}"))
    }

    fn compile_inline_upstream(&self, conf: &Value) -> Result<UpstreamRef, String> {
        let up =
            ferrisix_config::validate::upstream_from_value(None, conf).map_err(|e| e.message)?;
        Ok(UpstreamRef::new(Arc::new(CompiledUpstream::compile(
            &up, self.env,
        )?)))
    }
}
