//! Upstreams as the request path needs them: their node set (addresses, and names resolved off
//! the workers) with its balancer, the health checker, retry and timeout settings, pool limits,
//! and for `https`/`grpcs` the TLS client config. An upstream keeps its compiled form (and so
//! its balancer's position and its checker) across snapshots while its definition, and the
//! client certificate it names, are unchanged; one compiled again takes over its predecessor's
//! checker (unchanged nodes keep their health) and least_conn counts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ferrisix_config::model::{LbType, PassHost, ResourceKind, Scheme, Timeout, Upstream};
use ferrisix_plugin_api::{UpstreamRef, UpstreamResolver};
use ferrisix_plugins::pubsub::kafka::KafkaUpstream;
use ferrisix_tls::{CertStore, TlsContext, UpstreamTls};
use http::HeaderValue;
use serde_json::Value;

use super::accept::{Accepted, Quarantined};
use super::diff::Difference;
use super::intern::InternPool;
use crate::upstream::balancer::HashOn;
use crate::upstream::client::{PoolLimits, TryTimeouts};
use crate::upstream::health::{self, ChecksConfig, ProbeType, UpstreamChecker};
use crate::upstream::nodes::{is_ip, NodeSet, UpstreamNodes, UpstreamServices};

pub struct CompiledUpstream {
    pub id: Option<String>,
    /// The resource's etcd key (`/apisix/upstreams/1`, `/apisix/routes/1` for a route's inline
    /// upstream), which names its health checker as APISIX names it.
    pub name: String,
    /// The nodes as resolved now, with their balancer.
    pub nodes: Arc<UpstreamNodes>,
    pub checker: Option<Arc<UpstreamChecker>>,
    /// chash's key source.
    pub hash_on: Option<HashOn>,
    /// `None`: APISIX's default, one try per node.
    pub retries: Option<u32>,
    pub retry_timeout: Option<Duration>,
    pub timeouts: TryTimeouts,
    pub pass_host: PassHost,
    pub upstream_host: Option<HeaderValue>,
    pub pool: PoolLimits,
    pub scheme: Scheme,
    /// The client config for `https`/`grpcs`.
    pub tls: Option<UpstreamTls>,
    /// HTTP/2 to the upstream (`grpc`, `grpcs`, and `http`/`https` with the
    /// `ferrisix.http_version` label).
    pub h2: bool,
    /// `scheme: kafka`: its brokers, whom the pub-sub connection consumes from instead of a
    /// proxied request (see [`crate::pubsub`]).
    pub kafka: Option<Arc<KafkaUpstream>>,
    /// Why `tls.client_cert_id` names no client certificate (APISIX's message): the upstream
    /// stays, and a request for it is answered 502 before any try, as APISIX's
    /// `resolve_upstream_client_cert` does, until the ssl is a client one again.
    client_cert_error: Option<Box<str>>,
    /// The fingerprint of the `tls.client_cert_id` certificate it was compiled with.
    client_cert_fp: u64,
    /// The definition it was compiled from (shared with the typed resource that holds it):
    /// an inline upstream is reused while its owner's copy is equal.
    pub(super) source: Arc<Upstream>,
}

/// What compiling upstreams needs: the TLS settings and keyring, the snapshot's ssls (for
/// `tls.client_cert_id`), and the process' health probers, balancer state and resolver.
#[derive(Clone, Copy)]
pub(super) struct UpstreamEnv<'a> {
    pub ctx: &'a TlsContext,
    pub store: &'a CertStore,
    pub services: &'a Arc<UpstreamServices>,
}

impl UpstreamEnv<'_> {
    fn client_cert_fp(&self, up: &Upstream) -> u64 {
        client_cert_id(up)
            .and_then(|id| self.store.client_identity(&id))
            .map_or(0, |c| c.fingerprint)
    }

    /// Whether `c` still is what compiling `up` would give.
    pub fn reusable(&self, c: &CompiledUpstream, up: &Upstream) -> bool {
        (std::ptr::eq(&*c.source, up) || *c.source == *up)
            && c.client_cert_fp == self.client_cert_fp(up)
            && c.client_cert_error == client_cert_error(up, self.store)
    }
}

/// APISIX's reason (after "failed to get ssl cert: ") why `tls.client_cert_id` names no
/// client certificate; checked whatever the scheme, as APISIX does.
fn client_cert_error(up: &Upstream, store: &CertStore) -> Option<Box<str>> {
    let id = client_cert_id(up)?;
    if store.client_identity(&id).is_some() {
        None
    } else if store.has_server(&id) {
        Some("ssl type should be 'client'".into())
    } else {
        Some(format!("ssl id [{id}] not exits").into())
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
fn upstream_tls(
    up: &Upstream,
    env: UpstreamEnv<'_>,
    alpn: &[&[u8]],
) -> Result<UpstreamTls, String> {
    let tls = up.tls.as_ref();
    let field = |k: &str| tls.and_then(|t| t.get(k)).and_then(Value::as_str);
    let verify = tls
        .and_then(|t| t.get("verify"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let identity = if let Some(id) = client_cert_id(up) {
        // Without its client ssl the upstream is never tried (see `client_cert_error`).
        env.store
            .client_identity(&id)
            .map(|c| (c.key.clone(), c.fingerprint))
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
    UpstreamTls::new(&env.ctx.settings, verify, identity, alpn)
}

/// A kafka upstream's brokers: its nodes as written (the Kafka client resolves names and
/// verifies certificates against them), over TLS when it has `tls` (`verify` against the
/// trusted bundle; no client certificate, as lua-resty-kafka sends none).
fn kafka_upstream(up: &Upstream, env: UpstreamEnv<'_>) -> Result<KafkaUpstream, String> {
    let brokers = up
        .nodes
        .iter()
        .map(|n| {
            if n.host.contains(':') && !n.host.starts_with('[') {
                format!("[{}]:{}", n.host, n.port)
            } else {
                format!("{}:{}", n.host, n.port)
            }
        })
        .collect();
    let tls = match &up.tls {
        Some(t) => {
            let verify = t.get("verify").and_then(Value::as_bool).unwrap_or(false);
            Some(UpstreamTls::new(&env.ctx.settings, verify, None, &[])?.config)
        }
        None => None,
    };
    Ok(KafkaUpstream { brokers, tls })
}

/// The client config of `type: https` probes: no client certificate (resty.healthcheck sends
/// none), verified against `ssl_trusted_certificate` when `https_verify_certificate` is on.
fn probe_tls(config: &ChecksConfig, env: UpstreamEnv<'_>) -> Result<Option<UpstreamTls>, String> {
    if config.active.kind != ProbeType::Https {
        return Ok(None);
    }
    UpstreamTls::new(
        &env.ctx.settings,
        config.active.https_verify_certificate,
        None,
        &[b"http/1.1"],
    )
    .map(Some)
    .map_err(|e| format!("checks.active (https): {e}"))
}

/// Who holds an upstream: its checker is named after the holder's key.
#[derive(Clone, Copy, Debug)]
pub(super) enum Holder<'a> {
    /// An upstream object, or a route's or service's inline upstream.
    Resource { kind: ResourceKind, id: &'a str },
    /// A plugin's inline upstream, by its resource path (see
    /// [`UpstreamResolver::compile_inline_upstream`]).
    Plugin(&'a str),
}

impl CompiledUpstream {
    /// The upstream's own `timeout` as written (`None`: it sets none, and the defaults of
    /// the subsystem apply: the stream proxy's differ from the HTTP side's).
    pub fn configured_timeout(&self) -> Option<ferrisix_config::model::Timeout> {
        self.source.timeout
    }

    /// Total tries allowed for a request on `set`: `retries` + 1, by default one per node.
    pub fn max_tries(&self, set: &NodeSet) -> usize {
        match self.retries {
            Some(r) => r as usize + 1,
            None => set.nodes.len().max(1),
        }
    }

    /// Why a request for this upstream is answered 502 before any try: its
    /// `tls.client_cert_id` names no client certificate.
    pub fn client_cert_error(&self) -> Option<&str> {
        self.client_cert_error.as_deref()
    }

    /// The `type` when it names no balancer. APISIX stores it and fails only the requests
    /// that need the balancer (see [`crate::upstream`]); here the nodes get roundrobin's
    /// picker, which such a request never uses.
    pub fn unknown_balancer(&self) -> Option<&str> {
        match &self.source.lb_type {
            LbType::Other(t) => Some(t),
            _ => None,
        }
    }

    /// Whether the upstream can have nodes at all (a node list, or discovery).
    pub fn has_nodes(&self) -> bool {
        !self.source.nodes.is_empty() || self.source.discovery_type.is_some()
    }

    /// `previous`: the compiled form this one replaces for the same holder, whose checker and
    /// balancer state carry over.
    pub(super) fn compile(
        up: &Arc<Upstream>,
        holder: Holder<'_>,
        previous: Option<&Arc<CompiledUpstream>>,
        env: UpstreamEnv<'_>,
    ) -> Result<CompiledUpstream, String> {
        let mut kafka = None;
        let (tls, h2) = match up.scheme {
            // h2c with prior knowledge.
            Scheme::Http => (None, up.http2),
            // HTTP/2 offered by ALPN; each connection speaks what the server picks.
            Scheme::Https if up.http2 => {
                (Some(upstream_tls(up, env, &[b"h2", b"http/1.1"])?), true)
            }
            Scheme::Https => (Some(upstream_tls(up, env, &[b"http/1.1"])?), false),
            Scheme::Grpc => (None, true),
            Scheme::Grpcs => (Some(upstream_tls(up, env, &[b"h2"])?), true),
            // The stream proxy's schemes: bytes as they come, and TLS without ALPN (nginx's
            // stream `proxy_ssl` offers none).
            Scheme::Tcp | Scheme::Udp => (None, false),
            Scheme::Tls => (Some(upstream_tls(up, env, &[])?), false),
            Scheme::Kafka => {
                kafka = Some(Arc::new(kafka_upstream(up, env)?));
                (None, false)
            }
        };
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
                * u64::from(crate::upstream::balancer::POINTS_PER_WEIGHT);
            if points > MAX_CHASH_POINTS {
                return Err(format!(
                    "chash weights need {points} ring points, more than {MAX_CHASH_POINTS}"
                ));
            }
        }
        match up.discovery_type.as_deref() {
            None | Some("dns") => {}
            Some(other) => env.services.discovery.check_type(other)?,
        }
        let services = env.services;
        let name = match holder {
            Holder::Resource { kind, id } => format!("{}/{}/{id}", services.prefix, kind.dir()),
            Holder::Plugin(key) => key.to_string(),
        };
        // The one place a checker is made or reused (see `health::attach`).
        let checker = health::attach(
            &services.health,
            &name,
            up.checks.as_deref(),
            previous.and_then(|p| p.checker.as_ref()),
            |config| probe_tls(config, env),
        )?;
        let nodes =
            UpstreamNodes::new(up, services, checker.as_ref(), previous.map(|p| &*p.nodes))?;
        let upstream_host = match &up.upstream_host {
            Some(h) => {
                Some(HeaderValue::from_str(h).map_err(|_| format!("invalid upstream_host {h}"))?)
            }
            None => None,
        };
        // Compiled: the predecessor's checker, if this one replaces it, stops probing.
        if let (Some(new), Some(old)) = (&checker, previous.and_then(|p| p.checker.as_ref())) {
            if !Arc::ptr_eq(new, old) {
                old.retire();
            }
        }
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
            scheme: up.scheme,
            tls,
            h2,
            kafka,
            client_cert_error: client_cert_error(up, env.store),
            client_cert_fp: env.client_cert_fp(up),
            source: up.clone(),
        })
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
            None => match CompiledUpstream::compile(
                &acc.typed,
                Holder::Resource {
                    kind: ResourceKind::Upstreams,
                    id,
                },
                previous.get(id),
                env,
            ) {
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

/// Equal inline upstreams (of routes and services), shared across holders and snapshots.
#[derive(Debug, Default)]
pub struct InlineUpstreams {
    /// Typed definitions, by value: equal ones are one `Arc` (immutable, so sharing them is
    /// invisible).
    definitions: InternPool<Upstream>,
    /// Compiled forms of the definitions that have no per-holder state ([`stateless`]), by
    /// definition.
    compiled: InternPool<CompiledUpstream>,
}

impl InlineUpstreams {
    /// The shared copy of a definition equal to `up`.
    pub(super) fn definition(&self, up: Arc<Upstream>) -> Arc<Upstream> {
        self.definitions.share(fingerprint(&up), up, |a, b| a == b)
    }

    /// `n` holders of inline upstreams were replaced or removed.
    pub(super) fn released(&self, n: usize) {
        self.definitions.released(n);
        self.compiled.released(n);
    }

    pub fn sweep_due(&self) -> bool {
        self.definitions.sweep_due() || self.compiled.sweep_due()
    }

    /// Drops the entries of definitions nothing holds any more.
    pub fn sweep(&self) {
        self.compiled.sweep();
        self.definitions.sweep();
    }

    /// Entries: (definitions, compiled forms).
    #[cfg(test)]
    pub fn len(&self) -> (usize, usize) {
        (self.definitions.len(), self.compiled.len())
    }
}

/// A hash of what makes two definitions equal (equality itself confirms a match).
fn fingerprint(up: &Upstream) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    use std::mem::discriminant;
    let mut h = foldhash::fast::FixedState::default().build_hasher();
    (&up.id, &up.name, &up.hash_on, &up.key, up.retries).hash(&mut h);
    for n in &up.nodes {
        (&n.host, n.port, n.weight, n.priority, n.metadata.is_some()).hash(&mut h);
    }
    discriminant(&up.lb_type).hash(&mut h);
    discriminant(&up.pass_host).hash(&mut h);
    discriminant(&up.scheme).hash(&mut h);
    up.retry_timeout.to_bits().hash(&mut h);
    if let Some(t) = up.timeout {
        (t.connect.to_bits(), t.send.to_bits(), t.read.to_bits()).hash(&mut h);
    }
    (&up.upstream_host, &up.discovery_type, &up.service_name).hash(&mut h);
    up.discovery_args
        .as_ref()
        .map(|a| a.to_string())
        .hash(&mut h);
    (up.checks.is_some(), up.tls.is_some()).hash(&mut h);
    h.finish()
}

/// Whether nothing of an upstream's compiled form could tell its holders apart: one node
/// given by address (APISIX picks a lone node without a balancer, so there is no position or
/// count to keep per route), no health checks (a checker is named after its holder), no
/// name to resolve, no TLS. Such a compiled form is shared by every holder of an equal
/// definition.
fn stateless(up: &Upstream) -> bool {
    matches!(&up.nodes[..], [node] if is_ip(&node.host))
        && up.checks.is_none()
        && up.discovery_type.is_none()
        && up.tls.is_none()
        && matches!(up.scheme, Scheme::Http | Scheme::Grpc)
}

/// An inline upstream (of a route or a service): the previous compiled form while it is still
/// what compiling the definition would give, else a new one that takes over its state. A
/// [`stateless`] one is the compiled form every holder of the definition shares.
pub(super) fn inline_upstream(
    up: &Arc<Upstream>,
    holder: Holder<'_>,
    previous: Option<&Arc<CompiledUpstream>>,
    env: UpstreamEnv<'_>,
) -> Result<Arc<CompiledUpstream>, String> {
    if stateless(up) {
        // Keyed by the definition's address: equal definitions are one (see `definition`),
        // and a live compiled form keeps its definition, so the address is not reused.
        return env.services.inline.compiled.get_or_make(
            Arc::as_ptr(up) as usize as u64,
            |c| Arc::ptr_eq(&c.source, up),
            || CompiledUpstream::compile(up, holder, None, env).map(Arc::new),
        );
    }
    match previous.filter(|c| env.reusable(c, up)) {
        Some(c) => Ok(c.clone()),
        None => CompiledUpstream::compile(up, holder, previous, env).map(Arc::new),
    }
}

/// Plugins' inline upstreams by resource path (see
/// [`UpstreamResolver::compile_inline_upstream`]).
pub(super) type PluginUpstreams = Vec<(String, Arc<CompiledUpstream>)>;

/// The upstreams plugins may send requests to, as compiled for the snapshot being built.
pub(super) struct CompiledUpstreams<'a> {
    by_id: &'a HashMap<String, Arc<CompiledUpstream>>,
    env: UpstreamEnv<'a>,
    /// The plugins' inline upstreams the previous snapshot used, by resource path.
    previous: HashMap<&'a str, &'a Arc<CompiledUpstream>>,
    made: Mutex<Made>,
}

/// The plugins' inline upstreams of this compile.
#[derive(Default)]
struct Made {
    /// By resource path: a service's plugin conf merged into several routes compiles once.
    by_key: HashMap<String, Arc<CompiledUpstream>>,
    /// Asked for since the last [`CompiledUpstreams::take_asked`].
    asked: PluginUpstreams,
}

impl<'a> CompiledUpstreams<'a> {
    /// `previous`: the plugins' inline upstreams of the previous snapshot.
    pub fn new(
        by_id: &'a HashMap<String, Arc<CompiledUpstream>>,
        env: UpstreamEnv<'a>,
        previous: impl IntoIterator<Item = &'a (String, Arc<CompiledUpstream>)>,
    ) -> CompiledUpstreams<'a> {
        CompiledUpstreams {
            by_id,
            env,
            previous: previous.into_iter().map(|(k, u)| (k.as_str(), u)).collect(),
            made: Mutex::default(),
        }
    }

    /// The plugins' inline upstreams asked for since the last call (one compile's: the
    /// global rules, the consumers; each route records its own, see [`RouteUpstreams`]).
    pub fn take_asked(&self) -> PluginUpstreams {
        let mut made = self.made.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::take(&mut made.asked)
    }

    fn by_id(&self, id: &str) -> Result<UpstreamRef, String> {
        self.by_id
            .get(id)
            .map(|u| UpstreamRef::new(u.clone()))
            .ok_or_else(|| format!("failed to find upstream by id: {id}"))
    }

    /// A plugin's inline upstream for this compile (the caller records it as asked for).
    fn inline(&self, key: &str, conf: &Value) -> Result<Arc<CompiledUpstream>, String> {
        let up = Arc::new(
            ferrisix_config::validate::upstream_from_value(None, conf).map_err(|e| e.message)?,
        );
        let mut made = self.made.lock().unwrap_or_else(PoisonError::into_inner);
        // This compile's, else the previous snapshot's: reused while the definition is equal,
        // else taken over (the checker's node states, least_conn's counts).
        let before = made
            .by_key
            .get(key)
            .or_else(|| self.previous.get(key).copied())
            .cloned();
        let compiled = match before.as_ref().filter(|c| self.env.reusable(c, &up)) {
            Some(c) => c.clone(),
            None => Arc::new(CompiledUpstream::compile(
                &up,
                Holder::Plugin(key),
                before.as_ref(),
                self.env,
            )?),
        };
        made.by_key.insert(key.to_string(), compiled.clone());
        Ok(compiled)
    }
}

/// Adds `key`'s upstream to `asked` unless it is there already.
fn record(asked: &mut PluginUpstreams, key: &str, compiled: &Arc<CompiledUpstream>) {
    if !asked.iter().any(|(k, _)| k == key) {
        asked.push((key.to_string(), compiled.clone()));
    }
}

impl UpstreamResolver for CompiledUpstreams<'_> {
    fn upstream_by_id(&self, id: &str) -> Result<UpstreamRef, String> {
        self.by_id(id)
    }

    fn compile_inline_upstream(&self, key: &str, conf: &Value) -> Result<UpstreamRef, String> {
        let compiled = self.inline(key, conf)?;
        let mut made = self.made.lock().unwrap_or_else(PoisonError::into_inner);
        record(&mut made.asked, key, &compiled);
        Ok(UpstreamRef::new(compiled))
    }
}

/// One route's view of [`CompiledUpstreams`]: what its plugins ask for is recorded for it
/// alone, so that routes can compile on several threads at once.
pub(super) struct RouteUpstreams<'r, 'a> {
    shared: &'r CompiledUpstreams<'a>,
    asked: Mutex<PluginUpstreams>,
}

impl<'r, 'a> RouteUpstreams<'r, 'a> {
    pub fn new(shared: &'r CompiledUpstreams<'a>) -> Self {
        RouteUpstreams {
            shared,
            asked: Mutex::default(),
        }
    }

    /// The inline upstreams this route's plugins asked for.
    pub fn into_asked(self) -> PluginUpstreams {
        self.asked
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl UpstreamResolver for RouteUpstreams<'_, '_> {
    fn upstream_by_id(&self, id: &str) -> Result<UpstreamRef, String> {
        self.shared.by_id(id)
    }

    fn compile_inline_upstream(&self, key: &str, conf: &Value) -> Result<UpstreamRef, String> {
        let compiled = self.shared.inline(key, conf)?;
        let mut asked = self.asked.lock().unwrap_or_else(PoisonError::into_inner);
        record(&mut asked, key, &compiled);
        Ok(UpstreamRef::new(compiled))
    }
}
