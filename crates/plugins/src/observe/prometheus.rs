//! prometheus (spec data-plane §7): HTTP metrics recorded in the log phase, node metrics, and
//! the text exposition APISIX's exporter produces.
//!
//! Each compiled plugin instance holds a lease on the [`series::SeriesGroup`] of its
//! `(route, service)` labels, resolved at compile time, plus the interned ids of the route's
//! uris and hosts, so recording a request touches only atomics. Groups are leased from the
//! gateway's [`Metrics`] by label pair, so counts survive recompiles; a group no snapshot uses
//! any more (its route was deleted) is released with the last one and its series disappear
//! from the output. The connection and request counters come from the gateway's
//! [`ConnStats`], which the proxy core writes.
//!
//! `plugin_attr.prometheus.metrics.<name>.extra_labels` add labels whose values are request
//! variables read at log time (the plugin asks the proxy for just those variables through
//! [`Plugin::log_needs`]); `.expire` drops series not updated for that many seconds. Both cost
//! nothing when they are not configured.
//!
//! A request ai-proxy or ai-proxy-multi served carries its `request_type`, `request_llm_model`
//! and `llm_model` labels on the HTTP metrics (the others carry `traditional_http` and two
//! empty models) and is counted in the LLM metrics of [`llm`]; ai-proxy's calls in flight
//! are the [`llm::ActiveConnections`] gauge, which those plugins count on themselves (they
//! take it from the gateway's [`Metrics`] when they compile), and what ai-cache decided is
//! counted in [`ai_cache`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use ferrisix_config::schema::lua;
use ferrisix_config::settings::{MetricAttr, PrometheusAttr};
use ferrisix_plugin_api::{
    ApiAnswer, ApiHandler, Clock, CompileCtx, ConnStats, Lease, LogCtx, LogNeeds, Phases, Plugin,
    PluginApi, PluginDef, PluginServices, ResponseSource, Retain, RouteInfo, RunPolicy,
    SharedState, StateMap, VarNames,
};
use ferrisix_router::VarSource;
use http::{HeaderValue, Method, StatusCode};
use serde_json::{json, Value};

pub mod ai_cache;
pub mod llm;
pub mod series;
pub mod server;

use crate::ai::ai_cache::AiCacheState;
use crate::log::batch_processor::BatchGauges;
use crate::support::ai::{LlmRecord, PickedInstance};
use series::{
    push_extra_value, Direction, Expire, ExtraKey, GroupValues, LatencyType, SeriesGroup,
    StatusLabels,
};

pub const NAME: &str = "prometheus";

pub static DEF: PluginDef = PluginDef {
    version: 0.2,
    metadata_schema: Some(metadata_schema),
    run_policy: RunPolicy::PreferRoute,
    // Its labels are the route's: global rules compile it per route.
    per_route: true,
    apis: Some(apis),
    ..PluginDef::new(NAME, 500, schema, compile)
};

fn schema() -> Value {
    json!({"type": "object", "properties": {"prefer_name": {"type": "boolean", "default": false}}})
}

/// `ai_cache_hits_total`'s labels (the other ai-cache metrics' without `layer`).
const AI_CACHE_HITS_LABELS: [&str; 10] = [
    "layer",
    "route",
    "route_id",
    "service",
    "service_id",
    "consumer",
    "node",
    "request_type",
    "request_llm_model",
    "llm_model",
];

/// `disabled_labels` per metric (3.18); a metric's identity labels (`code`, `type`, `layer`)
/// cannot be disabled.
fn metadata_schema() -> Value {
    use ferrisix_config::settings::{BANDWIDTH_LABELS, HTTP_LATENCY_LABELS, HTTP_STATUS_LABELS};
    // The built-in labels but the first (`code`, `type`).
    let list = |labels: &[&str]| {
        let disabled = &labels[1..];
        json!({"type": "array", "items": {"type": "string", "enum": disabled}})
    };
    // Metrics without an identity label: every label may be disabled.
    let list_all =
        |labels: &[&str]| json!({"type": "array", "items": {"type": "string", "enum": labels}});
    json!({
        "type": "object",
        "properties": {
            "disabled_labels": {
                "type": "object",
                "properties": {
                    "http_status": list(&HTTP_STATUS_LABELS),
                    "http_latency": list(&HTTP_LATENCY_LABELS),
                    "bandwidth": list(&BANDWIDTH_LABELS),
                    "llm_latency": list(&llm::LLM_LATENCY_LABELS),
                    "llm_prompt_tokens": list_all(&llm::LLM_LATENCY_LABELS[1..]),
                    "llm_completion_tokens": list_all(&llm::LLM_LATENCY_LABELS[1..]),
                    "llm_prompt_tokens_dist": list_all(&llm::LLM_LATENCY_LABELS[1..]),
                    "llm_completion_tokens_dist": list_all(&llm::LLM_LATENCY_LABELS[1..]),
                    "llm_active_connections": list_all(&llm::LLM_ACTIVE_CONNECTIONS_LABELS),
                    "ai_cache_hits_total": list(&AI_CACHE_HITS_LABELS),
                    "ai_cache_misses_total": list_all(&AI_CACHE_HITS_LABELS[1..]),
                    "ai_cache_bypasses_total": list_all(&AI_CACHE_HITS_LABELS[1..]),
                    "ai_cache_embedding_latency": list_all(&AI_CACHE_HITS_LABELS[1..])
                },
                "additionalProperties": false
            }
        }
    })
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let metrics = cx.services.shared::<Metrics>();
    // `disabled_labels` apply to the whole exposition, not to one route.
    metrics.set_metadata(cx.metadata);
    Ok(Arc::new(Prometheus::compile(cx.conf, cx.route, metrics)))
}

/// The metrics text at `export_uri`, served by `public-api` on a data-plane route when there
/// is no export server (as APISIX's `get_api`).
fn apis(services: &PluginServices) -> Vec<PluginApi> {
    let attr = &services.plugin_attr().prometheus;
    if attr.enable_export_server {
        return Vec::new();
    }
    let metrics = services.shared::<Metrics>();
    vec![PluginApi {
        methods: &[Method::GET],
        uri: attr.export_uri.clone(),
        handler: ApiHandler::Answer(Arc::new(move |_: &Method, _: &str| ApiAnswer {
            status: StatusCode::OK,
            // APISIX's handler sets `content_type: text/plain` before answering the text.
            content_type: HeaderValue::from_static("text/plain"),
            body: Bytes::from(metrics.render()),
        })),
    }]
}

/// What the configuration store and the data plane say, for `apisix_etcd_reachable`,
/// `apisix_etcd_modify_indexes` and `apisix_upstream_status`.
pub trait NodeSource: Send + Sync {
    /// `None`: not applicable (reported as reachable, as a file provider always is).
    fn etcd_reachable(&self) -> Option<bool> {
        None
    }

    /// `(key, index)` pairs (`routes`, `services`, ..., `max_modify_index`); empty when the
    /// store has no such indexes (standalone files).
    fn modify_indexes(&self) -> Vec<(String, i64)> {
        Vec::new()
    }

    /// `apisix_upstream_status`: `(checker name, ip, port, healthy)` of every health-checked
    /// node.
    fn upstream_status(&self) -> Vec<(String, String, u16, bool)> {
        Vec::new()
    }
}

/// The local host name (`apisix_node_info{hostname}`).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// `DEFAULT_BUCKETS` of APISIX's exporter, in milliseconds.
pub const DEFAULT_BUCKETS: [f64; 15] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 30000.0,
    60000.0,
];

/// The metrics of one gateway.
pub struct Metrics {
    prefix: String,
    export_uri: String,
    buckets: Vec<f64>,
    /// `le` label texts in sortable (zero-padded) and printed forms.
    le_sort: Vec<String>,
    le_print: Vec<String>,
    groups: StateMap<SeriesGroup>,
    conn_stats: Arc<ConnStats>,
    clock: Clock,
    node_source: ArcSwapOption<Box<dyn NodeSource>>,
    hostname: String,
    /// `plugin_metadata/prometheus` `disabled_labels`.
    disabled: ArcSwapOption<DisabledLabels>,
    /// `plugin_attr.prometheus.metrics.<name>.extra_labels`.
    extra_status: ExtraLabels,
    extra_latency: ExtraLabels,
    extra_bandwidth: ExtraLabels,
    /// Every variable the extra labels read; `None` without extra labels.
    log_vars: Option<VarNames>,
    /// `plugin_attr.prometheus.metrics.<name>.expire`.
    expire: Expire,
    llm: llm::LlmMetrics,
    active: Arc<llm::ActiveConnections>,
    ai_cache: ai_cache::AiCacheMetrics,
    /// One render at a time: expiring series is then the work of one thread (see
    /// [`series`]), and concurrent scrapes are rare.
    render_lock: Mutex<()>,
    /// `stream_connection_total` per stream route: the stream proxy takes a route's counter
    /// when it compiles the route and counts on it without a lock.
    stream_connections: Mutex<BTreeMap<String, Arc<AtomicU64>>>,
    /// The redis xRPC protocol's series per (stream route, command): a session takes a
    /// command's series once and counts on it without a lock.
    redis_commands: Mutex<BTreeMap<(String, String), Arc<RedisCommandSeries>>>,
    /// The loggers' batch processors' `batch_process_entries`.
    batch_entries: Arc<BatchGauges>,
}

/// APISIX's `apisix/stream/xrpc/protocols/redis/metrics.lua` latency buckets, in seconds.
pub const REDIS_LATENCY_BUCKETS: [f64; 10] =
    [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0];

/// `redis_commands_total` and `redis_commands_latency_seconds` of one route and command.
#[derive(Default)]
pub struct RedisCommandSeries {
    total: AtomicU64,
    /// Per bucket, not cumulative; the last is `+Inf`'s own.
    buckets: [AtomicU64; REDIS_LATENCY_BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

impl RedisCommandSeries {
    /// One finished command that took `latency`.
    pub fn observe(&self, latency: std::time::Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        self.total.fetch_add(1, Relaxed);
        let secs = latency.as_secs_f64();
        let i = REDIS_LATENCY_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(REDIS_LATENCY_BUCKETS.len());
        self.buckets[i].fetch_add(1, Relaxed);
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    fn lines(&self, route: &str, command: &str, out: &mut Vec<(String, String)>) {
        use std::sync::atomic::Ordering::Relaxed;
        let labels: &[(&str, &str)] = &[("route", route), ("command", command)];
        let total = self.total.load(Relaxed);
        out.push((
            series_key("redis_commands_total", &[labels]),
            total.to_string(),
        ));
        let (width, precision) = bucket_format(&REDIS_LATENCY_BUCKETS);
        let mut cumulative = 0;
        let mut count = 0;
        for (i, b) in REDIS_LATENCY_BUCKETS.iter().enumerate() {
            cumulative += self.buckets[i].load(Relaxed);
            let le = format!("{b:0width$.precision$}");
            out.push((
                series_key(
                    "redis_commands_latency_seconds_bucket",
                    &[labels, &[("le", &le)]],
                ),
                cumulative.to_string(),
            ));
            count = cumulative;
        }
        count += self.buckets[REDIS_LATENCY_BUCKETS.len()].load(Relaxed);
        out.push((
            series_key(
                "redis_commands_latency_seconds_bucket",
                &[labels, &[("le", "Inf")]],
            ),
            count.to_string(),
        ));
        out.push((
            series_key("redis_commands_latency_seconds_count", &[labels]),
            count.to_string(),
        ));
        out.push((
            series_key("redis_commands_latency_seconds_sum", &[labels]),
            lua::number(self.sum_ns.load(Relaxed) as f64 / 1e9),
        ));
    }
}

/// The extra labels of one metric, in their configured order.
#[derive(Clone, Debug, Default)]
struct ExtraLabels {
    names: Vec<String>,
    /// The variable each label reads (APISIX's `v:sub(2)` of the configured value).
    vars: Vec<String>,
}

impl ExtraLabels {
    fn new(attr: &MetricAttr) -> ExtraLabels {
        ExtraLabels {
            names: attr.extra_labels.iter().map(|l| l.name.clone()).collect(),
            vars: attr
                .extra_labels
                .iter()
                .map(|l| l.variable().to_owned())
                .collect(),
        }
    }

    /// The request's consumer, AI labels and extra-label values packed into a series key;
    /// `None` for a request without a consumer and not served by an AI plugin when the metric
    /// has no extra labels (the group's own series). An unset variable gives `""` (APISIX:
    /// `ctx.var[name]` is nil).
    fn key(&self, ctx: &LogCtx, consumer: &str, ai: Option<&llm::AiFacts>) -> Option<ExtraKey> {
        if self.vars.is_empty() && consumer.is_empty() && ai.is_none() {
            return None;
        }
        let mut key = ExtraKey::new();
        // The consumer and the AI labels go first: [`Metrics::group_lines`] reads them back
        // from there.
        push_extra_value(&mut key, consumer);
        let (request_type, request_model, model) = match ai {
            Some(ai) => (
                ai.request_type,
                ai.request_model.as_str(),
                ai.model.as_str(),
            ),
            None => (TRADITIONAL_HTTP, "", ""),
        };
        push_extra_value(&mut key, request_type);
        push_extra_value(&mut key, request_model);
        push_extra_value(&mut key, model);
        for var in &self.vars {
            push_extra_value(&mut key, ctx.var(var).as_deref().unwrap_or(""));
        }
        Some(key)
    }

    /// `(name, value)` pairs for one tuple of extra values (the consumer taken off).
    fn pairs<'a>(&'a self, values: &'a [String]) -> Vec<(&'a str, &'a str)> {
        self.names
            .iter()
            .zip(values)
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect()
    }
}

/// `$request_type` of a request no AI plugin served.
const TRADITIONAL_HTTP: &str = "traditional_http";

/// The labels a series key starts with: consumer, request type, requested model, model.
const KEY_LABELS: usize = 4;

/// Seconds of `expire` in milliseconds; a positive value never rounds to "never".
fn expire_ms(secs: f64) -> u64 {
    if secs > 0.0 {
        ((secs * 1000.0).round() as u64).max(1)
    } else {
        0
    }
}

/// Labels emitted as `""` per metric (3.18's `disabled_labels` plugin metadata).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DisabledLabels {
    pub http_status: Vec<String>,
    pub http_latency: Vec<String>,
    pub bandwidth: Vec<String>,
    /// The LLM and ai-cache metrics' (by name).
    pub llm: Vec<(&'static str, Vec<String>)>,
}

impl DisabledLabels {
    /// The disabled labels of LLM metric `name`.
    pub fn of(&self, name: &str) -> Option<&[String]> {
        self.llm
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, l)| l.as_slice())
    }

    /// From the metadata document (`None` when nothing is disabled).
    pub fn from_metadata(meta: Option<&Value>) -> Option<DisabledLabels> {
        let d = meta?.get("disabled_labels")?;
        let list = |name: &str| -> Vec<String> {
            d.get(name)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        let labels = DisabledLabels {
            http_status: list("http_status"),
            http_latency: list("http_latency"),
            bandwidth: list("bandwidth"),
            llm: llm::LlmMetric::ALL
                .iter()
                .map(|m| m.name())
                .chain(["llm_active_connections"])
                .chain(ai_cache::CacheMetric::ALL.iter().map(|m| m.name()))
                .map(|name| (name, list(name)))
                .filter(|(_, l)| !l.is_empty())
                .collect(),
        };
        (labels != DisabledLabels::default()).then_some(labels)
    }
}

/// What stays the same while one group's lines are rendered: the group, its values as read
/// (the root of its per-consumer children), and the labels to blank.
#[derive(Clone, Copy)]
struct GroupRender<'a> {
    group: &'a SeriesGroup,
    root: &'a GroupValues,
    disabled: Option<&'a DisabledLabels>,
}

/// Blanks the disabled labels of one series.
fn blank(labels: &mut [(&str, &str)], disabled: Option<&[String]>) {
    let Some(disabled) = disabled else { return };
    for (name, value) in labels.iter_mut() {
        if disabled.iter().any(|d| d == name) {
            *value = "";
        }
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// nginx-lua-prometheus' `construct_bucket_format`: enough leading zeros and decimals for
/// every bucket so that the texts sort in numeric order.
fn bucket_format(buckets: &[f64]) -> (usize, usize) {
    let mut order = 1;
    let mut precision = 1;
    for b in buckets {
        let s = format!("{b:.6}");
        let s = s.trim_end_matches('0');
        let dot = s.find('.').unwrap_or(s.len());
        order = order.max(dot);
        precision = precision.max(s.len() - dot - 1);
    }
    (order + precision + 1, precision)
}

fn escape_label(v: &str, out: &mut String) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// `name{a="x",b="y"}` from label pairs, given in parts (built-in labels, extra labels,
/// `le`) that are written one after the other.
fn series_key(name: &str, parts: &[&[(&str, &str)]]) -> String {
    let count: usize = parts.iter().map(|p| p.len()).sum();
    let mut s = String::with_capacity(name.len() + 16 * count);
    s.push_str(name);
    if count > 0 {
        s.push('{');
        for (i, (k, v)) in parts.iter().flat_map(|p| p.iter()).enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(k);
            s.push_str("=\"");
            escape_label(v, &mut s);
            s.push('"');
        }
        s.push('}');
    }
    s
}

/// Metric families: (name without prefix, help, type).
const FAMILIES: [(&str, &str, &str); 24] = [
    (
        "batch_process_entries",
        "batch process remaining entries",
        "gauge",
    ),
    (
        "llm_active_connections",
        "Number of active connections to LLM service",
        "gauge",
    ),
    (
        "ai_cache_hits_total",
        "Total AI cache hits served, per cache layer",
        "counter",
    ),
    ("ai_cache_misses_total", "Total AI cache misses", "counter"),
    (
        "ai_cache_bypasses_total",
        "Total AI cache bypassed requests",
        "counter",
    ),
    (
        "ai_cache_embedding_latency",
        "Latency of AI cache embedding calls in milliseconds",
        "histogram",
    ),
    (
        "redis_commands_total",
        "Total number of requests for a specific Redis command",
        "counter",
    ),
    (
        "redis_commands_latency_seconds",
        "Latency of requests for a specific Redis command",
        "histogram",
    ),
    (
        "llm_latency",
        "LLM request latency in milliseconds",
        "histogram",
    ),
    (
        "llm_prompt_tokens",
        "LLM service consumed prompt tokens",
        "counter",
    ),
    (
        "llm_completion_tokens",
        "LLM service consumed completion tokens",
        "counter",
    ),
    (
        "llm_prompt_tokens_dist",
        "LLM prompt tokens distribution per request",
        "histogram",
    ),
    (
        "llm_completion_tokens_dist",
        "LLM completion tokens distribution per request",
        "histogram",
    ),
    (
        "stream_connection_total",
        "Total number of connections handled per stream route in APISIX",
        "counter",
    ),
    (
        "bandwidth",
        "Total bandwidth in bytes consumed per service in APISIX",
        "counter",
    ),
    (
        "upstream_status",
        "Upstream status from health check",
        "gauge",
    ),
    (
        "etcd_modify_indexes",
        "Etcd modify index for APISIX keys",
        "gauge",
    ),
    (
        "etcd_reachable",
        "Config server etcd reachable from APISIX, 0 is unreachable",
        "gauge",
    ),
    (
        "http_latency",
        "HTTP request latency in milliseconds per service in APISIX",
        "histogram",
    ),
    (
        "http_requests_total",
        "The total number of client requests since APISIX started",
        "gauge",
    ),
    (
        "http_status",
        "HTTP status codes per service in APISIX",
        "counter",
    ),
    (
        "nginx_http_current_connections",
        "Number of HTTP connections",
        "gauge",
    ),
    (
        "nginx_metric_errors_total",
        "Number of nginx-lua-prometheus errors",
        "counter",
    ),
    ("node_info", "Info of APISIX node", "gauge"),
];

/// The family a stored key belongs to, as nginx-lua-prometheus finds it: the name before `{`,
/// minus `_bucket` for histogram buckets.
fn short_name(key: &str) -> &str {
    let Some(brace) = key.find('{') else {
        return key;
    };
    if let Some(i) = key.find("_bucket{") {
        if key.contains("le=") {
            return &key[..i];
        }
    }
    &key[..brace]
}

fn node_text(node: Option<std::net::IpAddr>) -> String {
    node.map(|n| n.to_string()).unwrap_or_default()
}

impl SharedState for Metrics {
    fn create(services: &PluginServices) -> Self {
        Metrics {
            batch_entries: services.shared::<BatchGauges>(),
            ..Metrics::new(
                &services.plugin_attr().prometheus,
                services.conn_stats().clone(),
                services.clock().clone(),
            )
        }
    }
}

impl Retain for SeriesGroup {}

impl Metrics {
    pub fn new(attr: &PrometheusAttr, conn_stats: Arc<ConnStats>, clock: Clock) -> Metrics {
        let buckets = attr
            .default_buckets
            .clone()
            .unwrap_or_else(|| DEFAULT_BUCKETS.to_vec());
        let (width, precision) = bucket_format(&buckets);
        let m = &attr.metrics;
        let (extra_status, extra_latency, extra_bandwidth) = (
            ExtraLabels::new(&m.http_status),
            ExtraLabels::new(&m.http_latency),
            ExtraLabels::new(&m.bandwidth),
        );
        let llm = llm::LlmMetrics::new(attr);
        let ai_cache = ai_cache::AiCacheMetrics::new(attr);
        let mut vars: Vec<Box<str>> = Vec::new();
        for var in [&extra_status, &extra_latency, &extra_bandwidth]
            .iter()
            .flat_map(|e| e.vars.iter())
            .chain(llm.vars())
            .chain(ai_cache.vars())
        {
            if !vars.iter().any(|v| **v == **var) {
                vars.push(var.as_str().into());
            }
        }
        Metrics {
            prefix: attr.metric_prefix.clone(),
            export_uri: attr.export_uri.clone(),
            le_sort: buckets
                .iter()
                .map(|b| format!("{b:0width$.precision$}"))
                .collect(),
            le_print: buckets.iter().map(|b| lua::number(*b)).collect(),
            buckets,
            groups: StateMap::default(),
            conn_stats,
            clock: clock.clone(),
            node_source: ArcSwapOption::empty(),
            hostname: hostname(),
            disabled: ArcSwapOption::empty(),
            log_vars: (!vars.is_empty()).then(|| VarNames::from(vars)),
            extra_status,
            extra_latency,
            extra_bandwidth,
            expire: Expire {
                status: expire_ms(m.http_status.expire),
                latency: expire_ms(m.http_latency.expire),
                bandwidth: expire_ms(m.bandwidth.expire),
            },
            llm,
            active: Arc::new(llm::ActiveConnections::new(attr, clock.clone())),
            ai_cache,
            render_lock: Mutex::new(()),
            stream_connections: Mutex::new(BTreeMap::new()),
            redis_commands: Mutex::new(BTreeMap::new()),
            batch_entries: Arc::default(),
        }
    }

    /// The `apisix_stream_connection_total{route}` counter of stream route `route` (kept
    /// for the life of the process, as APISIX's shared-dict counters are).
    pub fn stream_connection_counter(&self, route: &str) -> Arc<AtomicU64> {
        let mut map = self
            .stream_connections
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        map.entry(route.to_owned()).or_default().clone()
    }

    /// The redis xRPC series of `command` on stream route `route` (kept for the life of the
    /// process, as APISIX's shared-dict metrics are).
    pub fn redis_command(&self, route: &str, command: &str) -> Arc<RedisCommandSeries> {
        let mut map = self
            .redis_commands
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        map.entry((route.to_owned(), command.to_owned()))
            .or_default()
            .clone()
    }

    /// Applies `plugin_metadata/prometheus` (its `disabled_labels`); `None`: no metadata.
    ///
    /// APISIX blanks disabled labels when a request is logged; ferrisix blanks them when the
    /// text is rendered and sums the series that then share a key, so a change applies to the
    /// whole history at once instead of leaving the old series beside the new ones.
    pub fn set_metadata(&self, meta: Option<&Value>) {
        let new = DisabledLabels::from_metadata(meta);
        if self.disabled.load().as_deref() != new.as_ref() {
            self.disabled.store(new.map(Arc::new));
        }
    }

    /// `llm_active_connections`, which ai-proxy and ai-proxy-multi count their calls on.
    pub fn llm_active(&self) -> Arc<llm::ActiveConnections> {
        self.active.clone()
    }

    pub fn export_uri(&self) -> &str {
        &self.export_uri
    }

    /// Where `etcd_reachable` and `etcd_modify_indexes` come from.
    pub fn set_node_source(&self, source: Box<dyn NodeSource>) {
        self.node_source.store(Some(Arc::new(source)));
    }

    /// A lease on the group of a label pair, shared with earlier compiles of the same labels.
    pub fn group(&self, route: &str, service: &str) -> Lease<SeriesGroup> {
        // A route id cannot hold a NUL, so the pair is unambiguous.
        let key = format!("{route}\0{service}");
        self.groups.lease(&key, || {
            SeriesGroup::new(
                route.to_owned(),
                service.to_owned(),
                self.buckets.len(),
                self.expire,
            )
        })
    }

    /// The groups some snapshot still uses.
    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// The bucket index of a latency in microseconds (`buckets.len()` for `+Inf`).
    fn bucket(&self, micros: u64) -> usize {
        let ms = micros as f64 / 1000.0;
        self.buckets
            .iter()
            .position(|b| ms <= *b)
            .unwrap_or(self.buckets.len())
    }

    /// The lines of the series in `v`, part of the group `at.group` read as `at.root`;
    /// `key_labels`: the `consumer`, `request_type`, `request_llm_model` and `llm_model` labels
    /// of `v`'s series; `extra`: their extra-label pairs per metric (empty for the group's own
    /// series, see [`GroupValues::extra`]).
    fn group_lines(
        &self,
        at: &GroupRender<'_>,
        v: &GroupValues,
        key_labels: [&str; KEY_LABELS],
        extra: [&[(&str, &str)]; 3],
        out: &mut Vec<(String, String)>,
    ) {
        let GroupRender {
            group: g,
            root,
            disabled,
        } = *at;
        let (route, service) = (g.route.as_str(), g.service.as_str());
        let [extra_status, extra_latency, extra_bandwidth] = extra;
        let [consumer, request_type, request_model, model] = key_labels;
        let label = |table: &[String], id: u16| table.get(id as usize).cloned().unwrap_or_default();
        for (l, n) in &v.status {
            let code = l.code.to_string();
            let source = match l.source {
                0 => ResponseSource::Upstream,
                1 => ResponseSource::Nginx,
                _ => ResponseSource::Apisix,
            };
            let (uri, host, node) = (
                label(&root.uris, l.uri),
                label(&root.hosts, l.host),
                node_text(l.node),
            );
            let mut labels: [(&str, &str); 11] = [
                ("code", &code),
                ("route", route),
                ("matched_uri", &uri),
                ("matched_host", &host),
                ("service", service),
                ("consumer", consumer),
                ("node", &node),
                ("request_type", request_type),
                ("request_llm_model", request_model),
                ("llm_model", model),
                ("response_source", source.as_str()),
            ];
            // APISIX blanks only built-in labels; extra labels are kept.
            blank(&mut labels, disabled.map(|d| d.http_status.as_slice()));
            out.push((
                series_key("http_status", &[&labels, extra_status]),
                n.to_string(),
            ));
        }
        for ((kind, node), h) in &v.latency {
            let node = node_text(*node);
            let mut labels: [(&str, &str); 8] = [
                ("type", kind.as_str()),
                ("route", route),
                ("service", service),
                ("consumer", consumer),
                ("node", node.as_str()),
                ("request_type", request_type),
                ("request_llm_model", request_model),
                ("llm_model", model),
            ];
            blank(&mut labels, disabled.map(|d| d.http_latency.as_slice()));
            let mut cumulative = 0;
            for (i, le) in self.le_sort.iter().enumerate() {
                cumulative += h.counts.get(i).copied().unwrap_or(0);
                out.push((
                    series_key(
                        "http_latency_bucket",
                        &[&labels, extra_latency, &[("le", le.as_str())]],
                    ),
                    cumulative.to_string(),
                ));
            }
            let total: u64 = h.counts.iter().sum();
            // "Inf" sorts after the zero-padded numbers; it is printed as "+Inf".
            out.push((
                series_key(
                    "http_latency_bucket",
                    &[&labels, extra_latency, &[("le", "Inf")]],
                ),
                total.to_string(),
            ));
            out.push((
                series_key("http_latency_count", &[&labels, extra_latency]),
                total.to_string(),
            ));
            out.push((
                series_key("http_latency_sum", &[&labels, extra_latency]),
                lua::number(h.sum_micros as f64 / 1000.0),
            ));
        }
        for ((dir, node), n) in &v.bandwidth {
            let node = node_text(*node);
            let mut labels: [(&str, &str); 8] = [
                ("type", dir.as_str()),
                ("route", route),
                ("service", service),
                ("consumer", consumer),
                ("node", &node),
                ("request_type", request_type),
                ("request_llm_model", request_model),
                ("llm_model", model),
            ];
            blank(&mut labels, disabled.map(|d| d.bandwidth.as_slice()));
            out.push((
                series_key("bandwidth", &[&labels, extra_bandwidth]),
                n.to_string(),
            ));
        }
        for (values, child) in &v.extra {
            // Each child holds one metric's series; the pairs of the others go unused.
            let (head, values) = values.split_at(KEY_LABELS.min(values.len()));
            let at_key = |i: usize| head.get(i).map_or("", String::as_str);
            let key_labels = [at_key(0), at_key(1), at_key(2), at_key(3)];
            let (s, l, b) = (
                self.extra_status.pairs(values),
                self.extra_latency.pairs(values),
                self.extra_bandwidth.pairs(values),
            );
            self.group_lines(at, child, key_labels, [&s, &l, &b], out);
        }
    }

    /// The exposition text: every sample sorted by its key, each family preceded by its
    /// `# HELP` and `# TYPE` lines (nginx-lua-prometheus' `metric_data`).
    pub fn render(&self) -> String {
        self.render_at(self.clock.mono_ms())
    }

    /// [`Metrics::render`] at `now` ([`series::now_ms`]), which decides what expired.
    fn render_at(&self, now: u64) -> String {
        let _one_at_a_time = self.render_lock.lock().unwrap_or_else(|e| e.into_inner());
        let groups: Vec<Arc<SeriesGroup>> =
            self.groups.states().into_iter().map(|(_, g)| g).collect();
        let mut lines: Vec<(String, String)> = Vec::new();
        let disabled = self.disabled.load_full();
        for g in &groups {
            let v = g.read(now);
            let at = GroupRender {
                group: g,
                root: &v,
                disabled: disabled.as_deref(),
            };
            self.group_lines(
                &at,
                &v,
                ["", TRADITIONAL_HTTP, "", ""],
                [&[], &[], &[]],
                &mut lines,
            );
        }
        self.llm.lines(now, disabled.as_deref(), &mut lines);
        self.active.lines(
            now,
            disabled
                .as_deref()
                .and_then(|d| d.of("llm_active_connections")),
            &mut lines,
        );
        self.ai_cache.lines(now, disabled.as_deref(), &mut lines);

        let c = self.conn_stats.read();
        for (state, n) in [
            ("active", c.active),
            ("accepted", c.accepted),
            ("handled", c.handled),
            ("reading", c.reading),
            ("writing", c.writing),
            ("waiting", c.waiting),
        ] {
            lines.push((
                series_key("nginx_http_current_connections", &[&[("state", state)]]),
                n.to_string(),
            ));
        }
        lines.push(("http_requests_total".into(), c.requests.to_string()));
        for (route, n) in self
            .stream_connections
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            lines.push((
                series_key("stream_connection_total", &[&[("route", route)]]),
                n.load(std::sync::atomic::Ordering::Relaxed).to_string(),
            ));
        }
        for ((route, command), s) in self
            .redis_commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            s.lines(route, command, &mut lines);
        }
        for ([name, route_id, server_addr], n) in self.batch_entries.values() {
            lines.push((
                series_key(
                    "batch_process_entries",
                    &[&[
                        ("name", &name),
                        ("route_id", &route_id),
                        ("server_addr", &server_addr),
                    ]],
                ),
                n.to_string(),
            ));
        }
        let source = self.node_source.load_full();
        let reachable = source
            .as_ref()
            .and_then(|s| s.etcd_reachable())
            .unwrap_or(true);
        lines.push((
            "etcd_reachable".into(),
            if reachable { "1" } else { "0" }.into(),
        ));
        if let Some(s) = &source {
            // exporter.lua: 1 for a healthy or mostly healthy node, 0 otherwise.
            for (name, ip, port, up) in s.upstream_status() {
                lines.push((
                    series_key(
                        "upstream_status",
                        &[&[("name", &name), ("ip", &ip), ("port", &port.to_string())]],
                    ),
                    if up { "1" } else { "0" }.into(),
                ));
            }
            for (key, idx) in s.modify_indexes() {
                lines.push((
                    series_key("etcd_modify_indexes", &[&[("key", &key)]]),
                    idx.to_string(),
                ));
            }
        }
        lines.push((
            series_key(
                "node_info",
                &[&[
                    ("hostname", &self.hostname),
                    ("version", env!("CARGO_PKG_VERSION")),
                ]],
            ),
            "1".into(),
        ));
        lines.push(("nginx_metric_errors_total".into(), "0".into()));

        lines.sort_by(|a, b| a.0.cmp(&b.0));
        // Series that differed only in a blanked label, or in an extra label of another LLM
        // metric (an LLM series key holds every LLM metric's extra values), are one series.
        lines.dedup_by(|later, kept| {
            if later.0 != kept.0 {
                return false;
            }
            let sum = kept.1.parse::<f64>().unwrap_or(0.0) + later.1.parse::<f64>().unwrap_or(0.0);
            kept.1 = lua::number(sum);
            true
        });
        let mut out = String::with_capacity(lines.len() * 160);
        let mut seen: Vec<&str> = Vec::new();
        for (key, value) in &lines {
            let short = short_name(key);
            if !seen.contains(&short) {
                seen.push(short);
                if let Some((name, help, kind)) = FAMILIES.iter().find(|f| f.0 == short) {
                    let _ = writeln!(out, "# HELP {}{name} {help}", self.prefix);
                    let _ = writeln!(out, "# TYPE {}{name} {kind}", self.prefix);
                }
            }
            out.push_str(&self.prefix);
            out.push_str(&self.printable_key(key));
            out.push(' ');
            out.push_str(value);
            out.push('\n');
        }
        out
    }

    /// The stored key with its `le` label printed as Prometheus wants it.
    fn printable_key(&self, key: &str) -> String {
        let Some(pos) = key.rfind(",le=\"") else {
            return key.to_owned();
        };
        let start = pos + 5;
        let Some(len) = key[start..].find('"') else {
            return key.to_owned();
        };
        let le = &key[start..start + len];
        let printed = if le == "Inf" {
            "+Inf".to_owned()
        } else {
            match self.le_sort.iter().position(|s| s == le) {
                Some(i) => self.le_print[i].clone(),
                // The LLM histograms' own buckets.
                None => le
                    .parse::<f64>()
                    .map_or_else(|_| le.to_owned(), lua::number),
            }
        };
        format!("{}{printed}{}", &key[..start], &key[start + len..])
    }
}

/// One compiled prometheus configuration for one route (or for unmatched requests).
pub struct Prometheus {
    metrics: Arc<Metrics>,
    group: Lease<SeriesGroup>,
    /// The ai-cache metrics' route name, route id, service name and service id.
    cache_labels: [String; 4],
    uri_ids: Box<[u16]>,
    host_ids: Box<[u16]>,
}

impl Prometheus {
    pub fn compile(conf: &Value, route: Option<&RouteInfo>, metrics: Arc<Metrics>) -> Prometheus {
        let prefer_name = conf.get("prefer_name").and_then(Value::as_bool) == Some(true);
        let (route_label, service_label) = match route {
            None => (String::new(), String::new()),
            Some(r) => {
                let service = r.service_id.as_deref().unwrap_or_default().to_string();
                if prefer_name {
                    (
                        r.name.as_deref().unwrap_or(&r.id).to_string(),
                        r.service_name
                            .as_deref()
                            .filter(|_| !service.is_empty())
                            .map_or(service, str::to_string),
                    )
                } else {
                    (r.id.to_string(), service)
                }
            }
        };
        let group = metrics.group(&route_label, &service_label);
        let cache_labels = match route {
            None => Default::default(),
            Some(r) => {
                let service = r.service_id.as_deref().unwrap_or_default().to_string();
                [
                    r.name.as_deref().unwrap_or_default().to_string(),
                    r.id.to_string(),
                    r.service_name
                        .as_deref()
                        .filter(|_| !service.is_empty())
                        .unwrap_or_default()
                        .to_string(),
                    service,
                ]
            }
        };
        let (uri_ids, host_ids) = match route {
            Some(r) => (
                r.uris.iter().map(|u| group.uri_id(u)).collect(),
                r.hosts.iter().map(|h| group.host_id(h)).collect(),
            ),
            None => (Box::default(), Box::default()),
        };
        Prometheus {
            metrics,
            group,
            cache_labels,
            uri_ids,
            host_ids,
        }
    }
}

impl Prometheus {
    /// Records one request; `now`: [`series::now_ms`] when a metric expires.
    fn record(&self, ctx: &LogCtx, now: u64) {
        let m = &*self.metrics;
        let pick =
            |ids: &[u16], i: Option<u16>| i.and_then(|i| ids.get(i as usize)).copied().unwrap_or(0);
        let source = match ctx.response_source {
            ResponseSource::Upstream => 0,
            ResponseSource::Nginx => 1,
            ResponseSource::Apisix => 2,
        };
        let g = &self.group;
        // exporter.lua: `ctx.consumer_name or ""`.
        let consumer = ctx.consumer.as_deref().map_or("", |c| c.username.as_str());
        // The one cost of the AI labels to other requests: this lookup.
        let ai = ctx
            .value::<Arc<LlmRecord>>()
            .map(|r| r.read(llm::AiFacts::of));
        let ai = ai.as_ref();
        // exporter.lua's `node` is `ctx.balancer_ip`, which ai-proxy sets to the picked
        // instance's name.
        let instance = ctx.value::<PickedInstance>().map(|p| p.0.as_str());
        if let Some(ai) = ai {
            m.llm.record(
                [g.route.as_str(), g.service.as_str(), consumer],
                instance,
                ctx,
                ai,
                now,
            );
        }
        if let Some(state) = ctx.value::<AiCacheState>() {
            let c = &self.cache_labels;
            let (request_type, request_model, model) = match ai {
                Some(ai) => (
                    ai.request_type,
                    ai.request_model.as_str(),
                    ai.model.as_str(),
                ),
                None => (TRADITIONAL_HTTP, "", ""),
            };
            m.ai_cache.record(
                state,
                &[
                    &c[0],
                    &c[1],
                    &c[2],
                    &c[3],
                    consumer,
                    instance.unwrap_or_default(),
                    request_type,
                    request_model,
                    model,
                ],
                ctx,
                now,
            );
        }
        let status_key = m.extra_status.key(ctx, consumer, ai);
        g.count_status(
            StatusLabels {
                code: ctx.status,
                source,
                uri: pick(&self.uri_ids, ctx.matched_uri),
                host: pick(&self.host_ids, ctx.matched_host),
                node: ctx.node,
            },
            status_key.as_deref(),
            now,
        );
        let latency_key = m.extra_latency.key(ctx, consumer, ai);
        let latency_key = latency_key.as_deref();
        let request = ctx.request_time.as_micros() as u64;
        g.observe_latency(
            LatencyType::Request,
            ctx.node,
            m.bucket(request),
            request,
            latency_key,
            now,
        );
        let apisix = match ctx.upstream_time {
            Some(up) => {
                let up = up.as_micros() as u64;
                g.observe_latency(
                    LatencyType::Upstream,
                    ctx.node,
                    m.bucket(up),
                    up,
                    latency_key,
                    now,
                );
                request.saturating_sub(up)
            }
            None => request,
        };
        g.observe_latency(
            LatencyType::Apisix,
            ctx.node,
            m.bucket(apisix),
            apisix,
            latency_key,
            now,
        );
        let bandwidth_key = m.extra_bandwidth.key(ctx, consumer, ai);
        let bandwidth_key = bandwidth_key.as_deref();
        g.add_bandwidth(
            Direction::Ingress,
            ctx.node,
            ctx.request_length,
            bandwidth_key,
            now,
        );
        g.add_bandwidth(
            Direction::Egress,
            ctx.node,
            ctx.bytes_sent,
            bandwidth_key,
            now,
        );
    }
}

impl Plugin for Prometheus {
    fn phases(&self) -> Phases {
        Phases::LOG
    }

    fn log_needs(&self) -> LogNeeds {
        LogNeeds {
            vars: self.metrics.log_vars.clone(),
            ..LogNeeds::default()
        }
    }

    fn log(&self, ctx: &LogCtx) {
        let now = if self.metrics.expire.any()
            || self.metrics.llm.expires()
            || self.metrics.ai_cache.expires()
        {
            self.metrics.clock.mono_ms()
        } else {
            0
        };
        self.record(ctx, now);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    fn metrics_of(attr: &PrometheusAttr) -> Arc<Metrics> {
        Arc::new(Metrics::new(
            attr,
            Arc::new(ConnStats::new()),
            Clock::system(),
        ))
    }

    fn metrics() -> Arc<Metrics> {
        metrics_of(&PrometheusAttr::default())
    }

    #[test]
    fn redis_command_series_render_as_apisix_names_them() {
        let m = metrics();
        let get = m.redis_command("1", "get");
        get.observe(Duration::from_micros(1500));
        get.observe(Duration::from_millis(300));
        m.redis_command("1", "get").observe(Duration::from_secs(2));
        let text = m.render();
        for line in [
            "# HELP apisix_redis_commands_total Total number of requests for a specific Redis command\n",
            "# TYPE apisix_redis_commands_total counter\n",
            "apisix_redis_commands_total{route=\"1\",command=\"get\"} 3\n",
            "# TYPE apisix_redis_commands_latency_seconds histogram\n",
            "apisix_redis_commands_latency_seconds_bucket{route=\"1\",command=\"get\",le=\"0.001\"} 0\n",
            "apisix_redis_commands_latency_seconds_bucket{route=\"1\",command=\"get\",le=\"0.002\"} 1\n",
            "apisix_redis_commands_latency_seconds_bucket{route=\"1\",command=\"get\",le=\"0.5\"} 2\n",
            "apisix_redis_commands_latency_seconds_bucket{route=\"1\",command=\"get\",le=\"1\"} 2\n",
            "apisix_redis_commands_latency_seconds_bucket{route=\"1\",command=\"get\",le=\"+Inf\"} 3\n",
            "apisix_redis_commands_latency_seconds_count{route=\"1\",command=\"get\"} 3\n",
            "apisix_redis_commands_latency_seconds_sum{route=\"1\",command=\"get\"} 2.3015\n",
        ] {
            assert!(text.contains(line), "no {line:?} in\n{text}");
        }
        // The buckets come in increasing order.
        let at = |le: &str| text.find(&format!("le=\"{le}\"")).unwrap();
        assert!(at("0.001") < at("0.01") && at("0.5") < at("1") && at("1") < at("+Inf"));
    }

    /// The loggers' `batch_process_entries`, from the processors of the same gateway.
    #[tokio::test(start_paused = true)]
    async fn batch_process_entries_render_per_processor() {
        use crate::log::batch_processor::{
            Backlog, BatchConfig, BatchProcessor, BatchSink, SendFuture,
        };
        struct Nowhere;
        impl BatchSink for Nowhere {
            fn send<'a>(&'a self, _: &'a [bytes::Bytes], _: usize) -> SendFuture<'a> {
                Box::pin(async { Ok(()) })
            }
        }
        let services = PluginServices::default();
        let m = services.shared::<Metrics>();
        let conf = json!({"name": "http logger", "batch_max_size": 10});
        let p = BatchProcessor::new(
            BatchConfig::from_conf(conf.as_object().unwrap()),
            Arc::new(Nowhere),
            Arc::new(Backlog::default()),
            100,
            &services,
        );
        p.label("1", "127.0.0.1");
        for _ in 0..3 {
            p.push(bytes::Bytes::from_static(b"{}"));
        }
        let text = m.render();
        for line in [
            "# HELP apisix_batch_process_entries batch process remaining entries\n",
            "# TYPE apisix_batch_process_entries gauge\n",
            "apisix_batch_process_entries{name=\"http logger\",route_id=\"1\",server_addr=\"127.0.0.1\"} 3\n",
        ] {
            assert!(text.contains(line), "no {line:?} in\n{text}");
        }
    }

    fn metrics_with(yaml: &str) -> Arc<Metrics> {
        let (settings, _) = ferrisix_config::settings::Settings::from_yaml_str(yaml).unwrap();
        metrics_of(&settings.plugin_attr.prometheus)
    }

    /// Variables as the proxy would capture them.
    struct Vars(&'static [(&'static str, &'static str)]);

    impl VarSource for Vars {
        fn var(&self, name: &str) -> Option<std::borrow::Cow<'_, str>> {
            self.0
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| std::borrow::Cow::Borrowed(*v))
        }
    }

    fn proxied(p: &Prometheus, vars: Vars) -> LogCtx {
        LogCtx {
            status: 200,
            matched_uri: Some(0),
            node: Some("127.0.0.1".parse().unwrap()),
            request_length: 80,
            bytes_sent: 612,
            request_time: Duration::from_micros(3500),
            upstream_time: Some(Duration::from_micros(3000)),
            response_source: ResponseSource::Upstream,
            vars: p
                .log_needs()
                .vars
                .map(|n| ferrisix_plugin_api::LogVars::capture(n, &vars))
                .unwrap_or_default(),
            ..Default::default()
        }
    }

    /// The label names of a sample line, in order.
    fn label_names(line: &str) -> Vec<&str> {
        let inner = &line[line.find('{').unwrap() + 1..line.rfind('}').unwrap()];
        inner
            .split("\",")
            .map(|pair| pair.split('=').next().unwrap())
            .collect()
    }

    #[test]
    fn extra_labels_follow_the_built_in_ones() {
        let m = metrics_with(
            r#"
plugin_attr:
  prometheus:
    metrics:
      http_status:
        extra_labels:
          - upstream_addr: $upstream_addr
          - upstream_status: $upstream_status
      http_latency:
        extra_labels:
          - upstream_addr: $upstream_addr
"#,
        );
        let route = RouteInfo {
            id: "x".into(),
            uris: vec!["/x".into()].into(),
            ..Default::default()
        };
        let p = Prometheus::compile(&json!({}), Some(&route), m.clone());
        assert_eq!(
            p.log_needs()
                .vars
                .unwrap()
                .iter()
                .map(|n| &**n)
                .collect::<Vec<_>>(),
            ["upstream_addr", "upstream_status"]
        );
        let up = Vars(&[
            ("upstream_addr", "127.0.0.1:1980"),
            ("upstream_status", "200"),
        ]);
        p.log(&proxied(&p, up));
        p.log(&proxied(
            &p,
            Vars(&[
                ("upstream_addr", "127.0.0.1:1980"),
                ("upstream_status", "200"),
            ]),
        ));
        // Unset variables are "".
        p.log(&proxied(&p, Vars(&[])));
        let text = m.render();
        let status = "apisix_http_status{code=\"200\",route=\"x\",matched_uri=\"/x\",matched_host=\"\",service=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\",response_source=\"upstream\",upstream_addr=\"127.0.0.1:1980\",upstream_status=\"200\"} 2\n";
        assert!(text.contains(status), "{text}");
        assert!(
            text.contains(
                ",response_source=\"upstream\",upstream_addr=\"\",upstream_status=\"\"} 1\n"
            ),
            "{text}"
        );
        let mut names = ferrisix_config::settings::HTTP_STATUS_LABELS.to_vec();
        names.extend(["upstream_addr", "upstream_status"]);
        assert_eq!(label_names(status.trim_end()), names);
        // `le` comes after the extra labels.
        assert!(text.contains("apisix_http_latency_bucket{type=\"request\",route=\"x\",service=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\",upstream_addr=\"127.0.0.1:1980\",le=\"5\"} 2\n"), "{text}");
        assert!(text.contains("apisix_http_latency_bucket{type=\"request\",route=\"x\",service=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\",upstream_addr=\"127.0.0.1:1980\",le=\"+Inf\"} 2\n"), "{text}");
        assert!(text.contains("apisix_http_latency_count{type=\"upstream\",route=\"x\",service=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\",upstream_addr=\"\"} 1\n"), "{text}");
        // Bandwidth has none configured.
        assert!(text.contains("apisix_bandwidth{type=\"egress\",route=\"x\",service=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\"} 1836\n"), "{text}");
        // disabled_labels blanks built-in labels only, and sums what then shares a key.
        m.set_metadata(Some(
            &json!({"disabled_labels": {"http_status": ["node", "code"]}}),
        ));
        let text = m.render();
        assert!(text.contains("apisix_http_status{code=\"\",route=\"x\",matched_uri=\"/x\",matched_host=\"\",service=\"\",consumer=\"\",node=\"\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\",response_source=\"upstream\",upstream_addr=\"127.0.0.1:1980\",upstream_status=\"200\"} 2\n"), "{text}");
        drop(p);
        assert!(!m.render().contains("apisix_http_status{"));
    }

    #[test]
    fn without_extra_labels_nothing_is_captured() {
        let m = metrics();
        let p = Prometheus::compile(&json!({}), None, m.clone());
        assert!(p.log_needs().is_empty());
        assert!(m.extra_status.key(&LogCtx::default(), "", None).is_none());
        assert!(!m.expire.any());
    }

    #[test]
    fn consumer_label_is_the_consumer_name() {
        let m = metrics_with(
            "plugin_attr:\n  prometheus:\n    metrics:\n      http_status:\n        extra_labels:\n          - upstream_addr: $upstream_addr\n",
        );
        let route = RouteInfo {
            id: "c".into(),
            uris: vec!["/c".into()].into(),
            ..Default::default()
        };
        let p = Prometheus::compile(&json!({}), Some(&route), m.clone());
        let jack = Arc::new(ferrisix_plugin_api::Consumer {
            username: "jack".into(),
            ..Default::default()
        });
        let with_consumer = |vars| LogCtx {
            consumer: Some(jack.clone()),
            ..proxied(&p, vars)
        };
        p.log(&with_consumer(Vars(&[("upstream_addr", "127.0.0.1:1980")])));
        p.log(&with_consumer(Vars(&[("upstream_addr", "127.0.0.1:1980")])));
        p.log(&proxied(&p, Vars(&[("upstream_addr", "127.0.0.1:1980")])));
        let text = m.render();
        // The consumer's series and the anonymous one are apart, extra labels kept after.
        assert!(text.contains("apisix_http_status{code=\"200\",route=\"c\",matched_uri=\"/c\",matched_host=\"\",service=\"\",consumer=\"jack\",node=\"127.0.0.1\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\",response_source=\"upstream\",upstream_addr=\"127.0.0.1:1980\"} 2\n"), "{text}");
        assert!(text.contains("consumer=\"\",node=\"127.0.0.1\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\",response_source=\"upstream\",upstream_addr=\"127.0.0.1:1980\"} 1\n"), "{text}");
        // Metrics without extra labels carry the consumer too.
        assert!(text.contains("apisix_http_latency_count{type=\"request\",route=\"c\",service=\"\",consumer=\"jack\",node=\"127.0.0.1\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\"} 2\n"), "{text}");
        assert!(text.contains("apisix_bandwidth{type=\"egress\",route=\"c\",service=\"\",consumer=\"jack\",node=\"127.0.0.1\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\"} 1224\n"), "{text}");
        assert!(text.contains("apisix_bandwidth{type=\"egress\",route=\"c\",service=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\"} 612\n"), "{text}");
        // disabled_labels blanks it, and the series that then share a key are summed.
        m.set_metadata(Some(
            &json!({"disabled_labels": {"bandwidth": ["consumer"]}}),
        ));
        let text = m.render();
        assert!(text.contains("apisix_bandwidth{type=\"egress\",route=\"c\",service=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\"} 1836\n"), "{text}");
    }

    #[test]
    fn series_expire_when_not_updated() {
        let m = metrics_with(
            "plugin_attr:\n  prometheus:\n    metrics:\n      http_status:\n        expire: 1\n      bandwidth:\n        expire: 0.5\n",
        );
        assert_eq!(
            m.expire,
            Expire {
                status: 1000,
                latency: 0,
                bandwidth: 500
            }
        );
        let route = RouteInfo {
            id: "e".into(),
            uris: vec!["/e".into()].into(),
            ..Default::default()
        };
        let p = Prometheus::compile(&json!({}), Some(&route), m.clone());
        let ctx = proxied(&p, Vars(&[]));
        p.record(&ctx, 10_000);
        p.record(&ctx, 10_000);
        let status = "apisix_http_status{code=\"200\",route=\"e\",";
        let count = |text: &str, prefix: &str| {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .map(|l| l.rsplit(' ').next().unwrap().to_owned())
        };
        let text = m.render_at(10_499);
        assert_eq!(count(&text, status).as_deref(), Some("2"));
        assert!(text.contains("apisix_bandwidth{type=\"egress\",route=\"e\""));
        let text = m.render_at(10_500);
        assert_eq!(count(&text, status).as_deref(), Some("2"));
        assert!(!text.contains("apisix_bandwidth{"), "{text}");
        let text = m.render_at(11_000);
        assert_eq!(count(&text, status), None, "{text}");
        // http_latency has no expire.
        assert!(text.contains("apisix_http_latency_count{type=\"request\",route=\"e\""));
        // Updated again: back, counted from 0.
        p.record(&ctx, 12_000);
        let text = m.render_at(12_000);
        assert_eq!(count(&text, status).as_deref(), Some("1"));
        assert_eq!(
            count(
                &text,
                "apisix_http_latency_count{type=\"request\",route=\"e\""
            )
            .as_deref(),
            Some("3")
        );
    }

    /// A request ai-proxy served: `stream`, the models, times in milliseconds, tokens.
    fn ai_request(
        p: &Prometheus,
        status: u16,
        stream: bool,
        times: (u64, u64),
        tokens: (u64, u64),
    ) -> LogCtx {
        use crate::support::ai::protocol::Usage;
        let record = Arc::new(LlmRecord::default());
        record.update(|f| {
            f.stream = stream;
            f.request_model = Some("gpt-4".into());
            f.model = Some("gpt-4o".into());
            f.time_to_first_token = Some(Duration::from_millis(times.0));
            f.upstream_response_time = Some(Duration::from_millis(times.1));
            f.usage = Some(Usage {
                prompt_tokens: tokens.0,
                completion_tokens: tokens.1,
                total_tokens: tokens.0 + tokens.1,
                raw: json!({}),
            });
        });
        let mut values = ferrisix_plugin_api::RequestValues::default();
        values.insert(record);
        LogCtx {
            status,
            values: Some(Arc::new(values)),
            ..proxied(p, Vars(&[("http_x_team", "blue")]))
        }
    }

    fn ai_route() -> RouteInfo {
        RouteInfo {
            id: "a".into(),
            uris: vec!["/v1/chat/completions".into()].into(),
            ..Default::default()
        }
    }

    #[test]
    fn ai_cache_decisions_are_counted_with_their_labels() {
        use crate::ai::ai_cache::CacheStatus;
        let m = metrics_with(
            r#"
plugin_attr:
  prometheus:
    ai_cache_embedding_latency_buckets: [10, 100]
    metrics:
      ai_cache_misses_total:
        extra_labels:
          - team: $http_x_team
"#,
        );
        let route = RouteInfo {
            id: "r1".into(),
            name: Some("chat".into()),
            service_id: Some("s1".into()),
            service_name: Some("svc".into()),
            uris: vec!["/v1/chat/completions".into()].into(),
            ..Default::default()
        };
        // prefer_name changes route_id on the LLM metrics, not on ai-cache's.
        let p = Prometheus::compile(&json!({"prefer_name": true}), Some(&route), m.clone());
        let with_state = |state: AiCacheState| {
            let mut ctx = ai_request(&p, 200, false, (10, 10), (1, 1));
            let mut values = ferrisix_plugin_api::RequestValues::default();
            values.insert(ctx.value::<Arc<LlmRecord>>().unwrap().clone());
            values.insert(PickedInstance("openai-1".into(), Arc::new(json!({}))));
            values.insert(state);
            ctx.values = Some(Arc::new(values));
            ctx
        };
        let hit = |layer| AiCacheState::decided(CacheStatus::Hit, Some(layer), None);
        p.record(&with_state(hit("exact")), 0);
        p.record(&with_state(hit("exact")), 0);
        p.record(
            &with_state(AiCacheState::decided(
                CacheStatus::Hit,
                Some("semantic"),
                Some(Duration::from_millis(40)),
            )),
            0,
        );
        p.record(
            &with_state(AiCacheState::decided(
                CacheStatus::Miss,
                None,
                Some(Duration::from_millis(400)),
            )),
            0,
        );
        p.record(
            &with_state(AiCacheState::decided(CacheStatus::Bypass, None, None)),
            0,
        );
        // A request ai-cache did not run on counts in none of them.
        p.record(&ai_request(&p, 200, false, (10, 10), (1, 1)), 0);
        let text = m.render();
        let labels = "route=\"chat\",route_id=\"r1\",service=\"svc\",service_id=\"s1\",consumer=\"\",node=\"openai-1\",request_type=\"ai_chat\",request_llm_model=\"gpt-4\",llm_model=\"gpt-4o\"";
        for (line, n) in [
            (
                format!("apisix_ai_cache_hits_total{{layer=\"exact\",{labels}}}"),
                2,
            ),
            (
                format!("apisix_ai_cache_hits_total{{layer=\"semantic\",{labels}}}"),
                1,
            ),
            (
                format!("apisix_ai_cache_misses_total{{{labels},team=\"blue\"}}"),
                1,
            ),
            (format!("apisix_ai_cache_bypasses_total{{{labels}}}"), 1),
            (
                format!("apisix_ai_cache_embedding_latency_bucket{{{labels},le=\"100\"}}"),
                1,
            ),
            (
                format!("apisix_ai_cache_embedding_latency_bucket{{{labels},le=\"+Inf\"}}"),
                2,
            ),
            (
                format!("apisix_ai_cache_embedding_latency_sum{{{labels}}}"),
                440,
            ),
        ] {
            assert!(
                text.contains(&format!("{line} {n}\n")),
                "{line} {n} in {text}"
            );
        }
        // The configured buckets, not the default ones.
        assert!(!text.contains(&format!(
            "apisix_ai_cache_embedding_latency_bucket{{{labels},le=\"50\"}}"
        )));
        for family in [
            "# TYPE apisix_ai_cache_hits_total counter\n",
            "# TYPE apisix_ai_cache_embedding_latency histogram\n",
            "# HELP apisix_ai_cache_bypasses_total Total AI cache bypassed requests\n",
        ] {
            assert!(text.contains(family), "{family} in {text}");
        }
        // The LLM metrics' node is the picked instance too, their route_id prefer_name's.
        assert!(text.contains("apisix_llm_prompt_tokens{route_id=\"chat\",service_id=\"svc\",consumer=\"\",node=\"openai-1\""), "{text}");
        // layer cannot be disabled; the others can.
        m.set_metadata(Some(
            &json!({"disabled_labels": {"ai_cache_hits_total": ["route", "node"]}}),
        ));
        let text = m.render();
        assert!(text.contains("apisix_ai_cache_hits_total{layer=\"exact\",route=\"\",route_id=\"r1\",service=\"svc\",service_id=\"s1\",consumer=\"\",node=\"\","), "{text}");
        assert!(
            metadata_schema()["properties"]["disabled_labels"]["properties"]["ai_cache_hits_total"]
                ["items"]["enum"]
                .as_array()
                .is_some_and(|e| !e.contains(&json!("layer")))
        );
    }

    #[test]
    fn active_llm_connections_count_calls_in_flight() {
        let m = metrics_with(
            r#"
plugin_attr:
  prometheus:
    metrics:
      llm_active_connections:
        expire: 60
        extra_labels:
          - team: $http_x_team
"#,
        );
        let active = m.llm_active();
        assert_eq!(active.vars(), ["http_x_team".to_owned()]);
        let labels = [
            "chat",
            "r1",
            "/v1/*",
            "",
            "svc",
            "s1",
            "jack",
            "openai-1",
            "ai_stream",
            "gpt-4",
            "gpt-4o",
        ];
        let one = active.track(labels, vec!["blue".into()]);
        let two = active.track(labels, vec!["blue".into()]);
        let line = "apisix_llm_active_connections{route=\"chat\",route_id=\"r1\",matched_uri=\"/v1/*\",matched_host=\"\",service=\"svc\",service_id=\"s1\",consumer=\"jack\",node=\"openai-1\",request_type=\"ai_stream\",request_llm_model=\"gpt-4\",llm_model=\"gpt-4o\",team=\"blue\"}";
        let text = m.render();
        assert!(text.contains(&format!("{line} 2\n")), "{text}");
        assert!(
            text.contains("# TYPE apisix_llm_active_connections gauge\n"),
            "{text}"
        );
        drop(one);
        assert!(m.render().contains(&format!("{line} 1\n")));
        drop(two);
        // A gauge back at 0 stays, as APISIX's does.
        assert!(m.render().contains(&format!("{line} 0\n")));
        // Past `expire` without a change the series leaves the exposition, its count kept.
        let late = m.clock.mono_ms() + 61_000;
        assert!(!m.render_at(late).contains("apisix_llm_active_connections{"));
        m.set_metadata(Some(
            &json!({"disabled_labels": {"llm_active_connections": ["consumer", "route"]}}),
        ));
        let _three = active.track(labels, vec!["blue".into()]);
        assert!(m.render().contains("apisix_llm_active_connections{route=\"\",route_id=\"r1\",matched_uri=\"/v1/*\",matched_host=\"\",service=\"svc\",service_id=\"s1\",consumer=\"\",node=\"openai-1\""));
    }

    #[test]
    fn ai_requests_carry_their_labels_and_feed_the_llm_metrics() {
        let m = metrics_with(
            r#"
plugin_attr:
  prometheus:
    llm_prompt_tokens_buckets: [5, 100]
    metrics:
      llm_prompt_tokens:
        extra_labels:
          - team: $http_x_team
"#,
        );
        let p = Prometheus::compile(&json!({}), Some(&ai_route()), m.clone());
        p.record(&ai_request(&p, 200, false, (150, 150), (10, 20)), 0);
        p.record(&ai_request(&p, 200, true, (30, 400), (5, 7)), 0);
        // An error answer: its tokens count, its latency does not.
        p.record(&ai_request(&p, 429, false, (20, 20), (0, 0)), 0);
        p.record(&proxied(&p, Vars(&[])), 0);
        let text = m.render();
        let labels = |t: &str| {
            format!("route_id=\"a\",service_id=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"{t}\",request_llm_model=\"gpt-4\",llm_model=\"gpt-4o\"")
        };
        // The HTTP metrics carry the AI labels; the plain request keeps traditional_http.
        assert!(text.contains("apisix_http_status{code=\"200\",route=\"a\",matched_uri=\"/v1/chat/completions\",matched_host=\"\",service=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"ai_chat\",request_llm_model=\"gpt-4\",llm_model=\"gpt-4o\",response_source=\"upstream\"} 1\n"), "{text}");
        assert!(text.contains("apisix_http_status{code=\"429\",route=\"a\",matched_uri=\"/v1/chat/completions\",matched_host=\"\",service=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"ai_chat\""), "{text}");
        assert!(text.contains("apisix_http_status{code=\"200\",route=\"a\",matched_uri=\"/v1/chat/completions\",matched_host=\"\",service=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\",response_source=\"upstream\"} 1\n"), "{text}");
        assert!(text.contains("apisix_bandwidth{type=\"egress\",route=\"a\",service=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"ai_stream\",request_llm_model=\"gpt-4\",llm_model=\"gpt-4o\"} 612\n"), "{text}");
        assert!(
            text.contains("# TYPE apisix_llm_latency histogram\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE apisix_llm_prompt_tokens counter\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE apisix_llm_completion_tokens_dist histogram\n"),
            "{text}"
        );
        // total: the whole answer; ttft only for a stream.
        let chat = labels("ai_chat");
        let stream = labels("ai_stream");
        assert!(
            text.contains(&format!(
                "apisix_llm_latency_bucket{{type=\"total\",{chat},le=\"100\"}} 0\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "apisix_llm_latency_bucket{{type=\"total\",{chat},le=\"200\"}} 1\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "apisix_llm_latency_count{{type=\"total\",{chat}}} 1\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "apisix_llm_latency_sum{{type=\"total\",{stream}}} 400\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "apisix_llm_latency_sum{{type=\"ttft\",{stream}}} 30\n"
            )),
            "{text}"
        );
        assert!(
            !text.contains(&format!("apisix_llm_latency_count{{type=\"ttft\",{chat}}}")),
            "{text}"
        );
        // Counters, with their extra label after the built-in ones.
        assert!(
            text.contains(&format!(
                "apisix_llm_prompt_tokens{{{chat},team=\"blue\"}} 10\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!("apisix_llm_completion_tokens{{{chat}}} 20\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("apisix_llm_completion_tokens{{{stream}}} 7\n")),
            "{text}"
        );
        // Distributions: the configured prompt buckets, the default token ones.
        assert!(
            text.contains(&format!(
                "apisix_llm_prompt_tokens_dist_bucket{{{stream},le=\"5\"}} 1\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "apisix_llm_prompt_tokens_dist_bucket{{{chat},le=\"5\"}} 1\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "apisix_llm_prompt_tokens_dist_count{{{chat}}} 2\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "apisix_llm_completion_tokens_dist_bucket{{{chat},le=\"10\"}} 1\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "apisix_llm_completion_tokens_dist_bucket{{{chat},le=\"50\"}} 2\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "apisix_llm_completion_tokens_dist_bucket{{{chat},le=\"1000000\"}} 2\n"
            )),
            "{text}"
        );
        // No LLM series for the plain request.
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("apisix_llm") && l.contains("traditional_http")),
            "{text}"
        );
        // disabled_labels reach the LLM metrics.
        m.set_metadata(Some(
            &json!({"disabled_labels": {"llm_completion_tokens": ["request_type"]}}),
        ));
        let text = m.render();
        assert!(text.contains("apisix_llm_completion_tokens{route_id=\"a\",service_id=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"\",request_llm_model=\"gpt-4\",llm_model=\"gpt-4o\"} 27\n"), "{text}");
    }

    #[test]
    fn llm_series_expire_per_metric() {
        let m = metrics_with(
            "plugin_attr:\n  prometheus:\n    metrics:\n      llm_prompt_tokens:\n        expire: 1\n",
        );
        assert!(m.llm.expires());
        let p = Prometheus::compile(&json!({}), Some(&ai_route()), m.clone());
        p.record(&ai_request(&p, 200, false, (5, 5), (3, 4)), 10_000);
        let text = m.render_at(10_999);
        assert!(text.contains("apisix_llm_prompt_tokens{"), "{text}");
        let text = m.render_at(11_000);
        assert!(!text.contains("apisix_llm_prompt_tokens{"), "{text}");
        // The others have no expire.
        assert!(text.contains("apisix_llm_completion_tokens{"), "{text}");
        // Back, counted from 0.
        p.record(&ai_request(&p, 200, false, (5, 5), (2, 4)), 12_000);
        let text = m.render_at(12_000);
        assert!(text.contains("llm_model=\"gpt-4o\"} 2\n"), "{text}");
        assert!(text.contains("apisix_llm_completion_tokens{route_id=\"a\",service_id=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"ai_chat\",request_llm_model=\"gpt-4\",llm_model=\"gpt-4o\"} 8\n"), "{text}");
    }

    #[test]
    fn model_labels_are_capped() {
        assert_eq!(llm::model_label(None), "");
        assert_eq!(llm::model_label(Some("gpt-4o")), "gpt-4o");
        assert_eq!(llm::model_label(Some(&"m".repeat(200))).len(), 128);
        // Cut at a character boundary.
        let wide = "é".repeat(100);
        assert_eq!(llm::model_label(Some(&wide)).len(), 128);
        let odd = format!("a{wide}");
        assert_eq!(llm::model_label(Some(&odd)).len(), 127);
    }

    #[test]
    fn llm_disabled_labels_follow_the_schema() {
        let schema = metadata_schema();
        let llm = &schema["properties"]["disabled_labels"]["properties"]["llm_latency"];
        let labels = llm["items"]["enum"].as_array().unwrap();
        // `type` is the metric's identity.
        assert!(!labels.contains(&json!("type")));
        assert!(labels.contains(&json!("llm_model")));
        let d = DisabledLabels::from_metadata(Some(
            &json!({"disabled_labels": {"llm_latency": ["node"]}}),
        ))
        .unwrap();
        assert_eq!(d.of("llm_latency"), Some(&["node".to_owned()][..]));
        assert_eq!(d.of("llm_prompt_tokens"), None);
    }

    #[test]
    fn number_and_bucket_texts() {
        // Lua's `tostring` (the one of `ferrisix_config`): no truncation of large values.
        assert_eq!(lua::number(1e15), "1e+15");
        assert_eq!(lua::number(3.0), "3");
        assert_eq!(lua::number(2.5), "2.5");
        assert_eq!(lua::number(0.123), "0.123");
        assert_eq!(bucket_format(&DEFAULT_BUCKETS), (7, 1));
        assert_eq!(bucket_format(&[0.005, 10.0]), (6, 3));
        let m = metrics();
        assert_eq!(m.le_sort[0], "00001.0");
        assert_eq!(m.le_print[14], "60000");
        assert_eq!(m.bucket(1000), 0);
        assert_eq!(m.bucket(1001), 1);
        assert_eq!(m.bucket(61_000_000), 15);
    }

    #[test]
    fn exposition_text() {
        let m = metrics();
        let route = RouteInfo {
            id: "1".into(),
            name: Some("named".into()),
            uris: vec!["/hello".into()].into(),
            ..Default::default()
        };
        let p = Prometheus::compile(&json!({}), Some(&route), m.clone());
        let ctx = proxied(&p, Vars(&[]));
        p.log(&ctx);
        p.log(&ctx);
        let text = m.render();
        assert!(text.contains("# HELP apisix_http_status HTTP status codes per service in APISIX\n# TYPE apisix_http_status counter\n"));
        assert!(text.contains("apisix_http_status{code=\"200\",route=\"1\",matched_uri=\"/hello\",matched_host=\"\",service=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\",response_source=\"upstream\"} 2\n"), "{text}");
        assert!(text.contains("apisix_http_latency_bucket{type=\"request\",route=\"1\",service=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\",le=\"5\"} 2\n"));
        assert!(text.contains("apisix_http_latency_bucket{type=\"request\",route=\"1\",service=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\",le=\"1\"} 0\n"));
        assert!(text.contains(",le=\"+Inf\"} 2\n"));
        assert!(text.contains("apisix_http_latency_sum{type=\"apisix\",route=\"1\",service=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\"} 1\n"));
        assert!(text.contains("apisix_http_latency_count{type=\"upstream\""));
        assert!(text.contains("apisix_bandwidth{type=\"egress\",route=\"1\",service=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\"} 1224\n"));
        assert!(text.contains("apisix_etcd_reachable 1\n"));
        assert!(text.contains("apisix_nginx_metric_errors_total 0\n"));
        assert!(text.contains("apisix_nginx_http_current_connections{state=\"active\"} "));
        // Buckets in numeric order, HELP once per family, lines sorted.
        let le: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("apisix_http_latency_bucket{type=\"request\""))
            .map(|l| l.split("le=\"").nth(1).unwrap().split('"').next().unwrap())
            .collect();
        assert_eq!(
            le,
            [
                "1", "2", "5", "10", "20", "50", "100", "200", "500", "1000", "2000", "5000",
                "10000", "30000", "60000", "+Inf"
            ]
        );
        assert_eq!(
            text.matches("# TYPE apisix_http_latency histogram").count(),
            1
        );

        // prefer_name, and the series go when the route's instances are gone.
        let named = Prometheus::compile(&json!({"prefer_name": true}), Some(&route), m.clone());
        named.log(&ctx);
        assert!(m.render().contains("route=\"named\""));
        drop(p);
        drop(named);
        let text = m.render();
        assert!(!text.contains("apisix_http_status{"), "{text}");
    }

    #[test]
    fn disabled_labels_are_blank_and_their_series_summed() {
        let m = metrics();
        let route = RouteInfo {
            id: "dl".into(),
            uris: vec!["/a".into()].into(),
            ..Default::default()
        };
        let p = Prometheus::compile(&json!({}), Some(&route), m.clone());
        for node in ["10.0.0.1", "10.0.0.2"] {
            p.log(&LogCtx {
                status: 200,
                matched_uri: Some(0),
                node: Some(node.parse().unwrap()),
                request_length: 10,
                bytes_sent: 100,
                request_time: Duration::from_micros(1500),
                upstream_time: Some(Duration::from_micros(1000)),
                response_source: ResponseSource::Upstream,
                ..Default::default()
            });
        }
        let text = m.render();
        assert!(text.contains("node=\"10.0.0.1\""), "{text}");
        m.set_metadata(Some(&json!({"disabled_labels": {
            "http_status": ["node", "matched_uri"], "bandwidth": ["node"]}})));
        let text = m.render();
        let status = "apisix_http_status{code=\"200\",route=\"dl\",matched_uri=\"\",matched_host=\"\",service=\"\",consumer=\"\",node=\"\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\",response_source=\"upstream\"} 2\n";
        assert!(text.contains(status), "{text}");
        assert!(text.contains("apisix_bandwidth{type=\"egress\",route=\"dl\",service=\"\",consumer=\"\",node=\"\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\"} 200\n"), "{text}");
        // Latency keeps its node label: it was not disabled.
        assert!(text.contains("apisix_http_latency_count{type=\"request\",route=\"dl\",service=\"\",consumer=\"\",node=\"10.0.0.2\""), "{text}");
        m.set_metadata(None);
        assert!(m.render().contains("node=\"10.0.0.1\""));
        drop(p);
    }
}
