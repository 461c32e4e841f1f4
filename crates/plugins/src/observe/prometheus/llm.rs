//! The LLM metrics of APISIX 3.18's exporter: `llm_latency` (histogram, `type` `total` and
//! `ttft`), `llm_prompt_tokens` and `llm_completion_tokens` (counters) and their per-request
//! distributions `llm_prompt_tokens_dist` and `llm_completion_tokens_dist` (histograms),
//! recorded for the requests ai-proxy or ai-proxy-multi served (`$request_type` `ai_chat` or
//! `ai_stream`).
//!
//! Their labels are request-time strings (the models a client names, the consumer, the extra
//! labels), so a series is found by its label values in a map behind a read-write lock:
//! recording takes the read side (the write side only for a series' first request) and then
//! counts on atomics. Only AI requests come here; the others stop at the one check of
//! [`Prometheus::record`](super::Prometheus) for the AI record.
//!
//! The series live as long as the gateway, as APISIX's shared-dict keys do (a deleted route's
//! LLM series stay until they expire): only the HTTP metrics' groups follow the routes.
//!
//! `expire` stamps each series per metric; a render leaves out and zeroes a metric of a series
//! not updated for that long, as its shared-dict keys would have lapsed in APISIX.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use ferrisix_config::settings::{MetricAttr, PrometheusAttr};
use ferrisix_plugin_api::{Clock, LogCtx};

use super::{blank, bucket_format, expire_ms, node_text, series_key, DisabledLabels, ExtraLabels};
use crate::support::ai::LlmFields;

/// `DEFAULT_TOKEN_BUCKETS` of APISIX's exporter: token counts.
pub const DEFAULT_TOKEN_BUCKETS: [f64; 16] = [
    1.0, 10.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0, 50000.0,
    100000.0, 200000.0, 500000.0, 1000000.0,
];

/// Model names come from clients: APISIX cuts their labels to this many bytes.
const MAX_MODEL_LABEL_LEN: usize = 128;

/// The built-in labels of `llm_latency` (APISIX's `metric_label_map`); the token metrics have
/// them without `type`.
pub const LLM_LATENCY_LABELS: [&str; 8] = [
    "type",
    "route_id",
    "service_id",
    "consumer",
    "node",
    "request_type",
    "request_llm_model",
    "llm_model",
];

/// `llm_active_connections`' labels.
pub const LLM_ACTIVE_CONNECTIONS_LABELS: [&str; 11] = [
    "route",
    "route_id",
    "matched_uri",
    "matched_host",
    "service",
    "service_id",
    "consumer",
    "node",
    "request_type",
    "request_llm_model",
    "llm_model",
];

/// The recorded LLM metrics, in the order their extra labels sit in a series key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LlmMetric {
    Latency,
    PromptTokens,
    CompletionTokens,
    PromptTokensDist,
    CompletionTokensDist,
}

impl LlmMetric {
    pub const ALL: [LlmMetric; 5] = [
        LlmMetric::Latency,
        LlmMetric::PromptTokens,
        LlmMetric::CompletionTokens,
        LlmMetric::PromptTokensDist,
        LlmMetric::CompletionTokensDist,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LlmMetric::Latency => "llm_latency",
            LlmMetric::PromptTokens => "llm_prompt_tokens",
            LlmMetric::CompletionTokens => "llm_completion_tokens",
            LlmMetric::PromptTokensDist => "llm_prompt_tokens_dist",
            LlmMetric::CompletionTokensDist => "llm_completion_tokens_dist",
        }
    }

    fn attr(self, attr: &PrometheusAttr) -> &MetricAttr {
        let m = &attr.metrics;
        match self {
            LlmMetric::Latency => &m.llm_latency,
            LlmMetric::PromptTokens => &m.llm_prompt_tokens,
            LlmMetric::CompletionTokens => &m.llm_completion_tokens,
            LlmMetric::PromptTokensDist => &m.llm_prompt_tokens_dist,
            LlmMetric::CompletionTokensDist => &m.llm_completion_tokens_dist,
        }
    }
}

/// A model name as a label value (`model_to_label`): at most 128 bytes, cut at a character
/// boundary.
pub fn model_label(model: Option<&str>) -> String {
    let m = model.unwrap_or_default();
    if m.len() <= MAX_MODEL_LABEL_LEN {
        return m.to_owned();
    }
    let mut end = MAX_MODEL_LABEL_LEN;
    while !m.is_char_boundary(end) {
        end -= 1;
    }
    m[..end].to_owned()
}

/// What the log phase reads of an AI request's record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AiFacts {
    pub request_type: &'static str,
    pub request_model: String,
    pub model: String,
    /// `$llm_time_to_first_token`, milliseconds.
    pub ttft_ms: u64,
    /// `$apisix_upstream_response_time`, milliseconds.
    pub upstream_ms: Option<u64>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl AiFacts {
    pub fn of(f: &LlmFields) -> AiFacts {
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        let usage = f.usage.as_ref();
        AiFacts {
            request_type: f.request_type(),
            request_model: model_label(f.request_model.as_deref()),
            model: model_label(f.model.as_deref()),
            ttft_ms: f.time_to_first_token.map_or(0, ms),
            upstream_ms: f.upstream_response_time.map(ms),
            prompt_tokens: usage.map_or(0, |u| u.prompt_tokens),
            completion_tokens: usage.map_or(0, |u| u.completion_tokens),
        }
    }
}

/// One histogram's bounds and their `le` texts in sortable form (see [`super::Metrics`]).
pub(super) struct Buckets {
    bounds: Vec<f64>,
    le_sort: Vec<String>,
}

impl Buckets {
    pub(super) fn new(bounds: Vec<f64>) -> Buckets {
        let (width, precision) = bucket_format(&bounds);
        Buckets {
            le_sort: bounds
                .iter()
                .map(|b| format!("{b:0width$.precision$}"))
                .collect(),
            bounds,
        }
    }

    /// The bucket of `v` (`bounds.len()` for `+Inf`).
    fn index(&self, v: f64) -> usize {
        self.bounds
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(self.bounds.len())
    }
}

pub(super) struct Histogram {
    /// Per bucket, not cumulative; the last is `+Inf`'s own.
    counts: Box<[AtomicU64]>,
    sum: AtomicU64,
}

impl Histogram {
    pub(super) fn new(buckets: &Buckets) -> Histogram {
        Histogram {
            counts: (0..=buckets.bounds.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            sum: AtomicU64::new(0),
        }
    }

    pub(super) fn observe(&self, buckets: &Buckets, v: u64) {
        self.counts[buckets.index(v as f64)].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(v, Ordering::Relaxed);
    }

    pub(super) fn reset(&self) {
        for c in self.counts.iter() {
            c.store(0, Ordering::Relaxed);
        }
        self.sum.store(0, Ordering::Relaxed);
    }

    pub(super) fn lines(
        &self,
        name: &str,
        labels: &[&[(&str, &str)]],
        buckets: &Buckets,
        out: &mut Vec<(String, String)>,
    ) {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return;
        }
        let bucket = format!("{name}_bucket");
        let with_le = |le: &str| {
            let le = [("le", le)];
            let mut parts: Vec<&[(&str, &str)]> = labels.to_vec();
            parts.push(&le);
            series_key(&bucket, &parts)
        };
        let mut cumulative = 0;
        for (i, le) in buckets.le_sort.iter().enumerate() {
            cumulative += counts[i];
            out.push((with_le(le), cumulative.to_string()));
        }
        out.push((with_le("Inf"), total.to_string()));
        out.push((
            series_key(&format!("{name}_count"), labels),
            total.to_string(),
        ));
        out.push((
            series_key(&format!("{name}_sum"), labels),
            self.sum.load(Ordering::Relaxed).to_string(),
        ));
    }
}

/// The LLM metrics of one tuple of label values.
struct LlmSeries {
    /// Per [`LlmMetric`]: the last update (the gateway's monotonic milliseconds) when it
    /// expires; 0 = never updated.
    touched: [AtomicU64; 5],
    latency_total: Histogram,
    latency_ttft: Histogram,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    prompt_dist: Histogram,
    completion_dist: Histogram,
}

/// The built-in label values of a series key, before the extra ones.
const BASE_LABELS: usize = 7;

/// The LLM metrics of one gateway.
pub struct LlmMetrics {
    latency_buckets: Buckets,
    prompt_buckets: Buckets,
    completion_buckets: Buckets,
    /// Per [`LlmMetric`], in [`LlmMetric::ALL`]'s order.
    extra: [ExtraLabels; 5],
    expire: [u64; 5],
    /// Keyed by route, service, consumer, node, request type, the two models, then each
    /// metric's extra-label values in [`LlmMetric::ALL`]'s order.
    series: RwLock<HashMap<Box<[String]>, Arc<LlmSeries>>>,
}

impl LlmMetrics {
    pub fn new(attr: &PrometheusAttr) -> LlmMetrics {
        let latency = attr
            .llm_latency_buckets
            .clone()
            .unwrap_or_else(|| super::DEFAULT_BUCKETS.to_vec());
        let tokens =
            |b: &Option<Vec<f64>>| b.clone().unwrap_or_else(|| DEFAULT_TOKEN_BUCKETS.to_vec());
        LlmMetrics {
            latency_buckets: Buckets::new(latency),
            prompt_buckets: Buckets::new(tokens(&attr.llm_prompt_tokens_buckets)),
            completion_buckets: Buckets::new(tokens(&attr.llm_completion_tokens_buckets)),
            extra: LlmMetric::ALL.map(|m| ExtraLabels::new(m.attr(attr))),
            expire: LlmMetric::ALL.map(|m| expire_ms(m.attr(attr).expire)),
            series: RwLock::new(HashMap::new()),
        }
    }

    /// The variables the extra labels read.
    pub fn vars(&self) -> impl Iterator<Item = &String> {
        self.extra.iter().flat_map(|e| e.vars.iter())
    }

    /// Whether some metric expires (the log phase then reads the clock).
    pub fn expires(&self) -> bool {
        self.expire.iter().any(|e| *e > 0)
    }

    fn series(&self, key: Vec<String>) -> Arc<LlmSeries> {
        if let Some(s) = self
            .series
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key.as_slice())
        {
            return s.clone();
        }
        let mut map = self.series.write().unwrap_or_else(|e| e.into_inner());
        map.entry(key.into_boxed_slice())
            .or_insert_with(|| {
                Arc::new(LlmSeries {
                    touched: Default::default(),
                    latency_total: Histogram::new(&self.latency_buckets),
                    latency_ttft: Histogram::new(&self.latency_buckets),
                    prompt_tokens: AtomicU64::new(0),
                    completion_tokens: AtomicU64::new(0),
                    prompt_dist: Histogram::new(&self.prompt_buckets),
                    completion_dist: Histogram::new(&self.completion_buckets),
                })
            })
            .clone()
    }

    /// Records one AI request (exporter.lua's `http_log`, its `ai_chat`/`ai_stream` part);
    /// `now`: the clock when a metric expires.
    /// `instance`: the picked instance's name, the `node` label (else the upstream node's
    /// address).
    pub fn record(
        &self,
        labels: [&str; 3],
        instance: Option<&str>,
        ctx: &LogCtx,
        ai: &AiFacts,
        now: u64,
    ) {
        let [route, service, consumer] = labels;
        let mut key = vec![
            route.to_owned(),
            service.to_owned(),
            consumer.to_owned(),
            instance.map_or_else(|| node_text(ctx.node), str::to_owned),
            ai.request_type.to_owned(),
            ai.request_model.clone(),
            ai.model.clone(),
        ];
        for e in &self.extra {
            for var in &e.vars {
                key.push(
                    ferrisix_router::VarSource::var(ctx, var)
                        .map(|v| v.into_owned())
                        .unwrap_or_default(),
                );
            }
        }
        let s = self.series(key);
        let touch = |m: LlmMetric| {
            if self.expire[m as usize] > 0 {
                s.touched[m as usize].store(now.max(1), Ordering::Relaxed);
            }
        };
        // A zero time to first token is APISIX's unset `"0"`; an error answer has no
        // status label here to tell it apart, so only served answers are measured.
        if ai.ttft_ms != 0 && ctx.status < 400 {
            // For a stream the time to first token is not the whole answer's.
            let total = ai.upstream_ms.unwrap_or(ai.ttft_ms);
            s.latency_total.observe(&self.latency_buckets, total);
            if ai.request_type == "ai_stream" {
                s.latency_ttft.observe(&self.latency_buckets, ai.ttft_ms);
            }
            touch(LlmMetric::Latency);
        }
        s.prompt_tokens
            .fetch_add(ai.prompt_tokens, Ordering::Relaxed);
        touch(LlmMetric::PromptTokens);
        s.prompt_dist
            .observe(&self.prompt_buckets, ai.prompt_tokens);
        touch(LlmMetric::PromptTokensDist);
        s.completion_tokens
            .fetch_add(ai.completion_tokens, Ordering::Relaxed);
        touch(LlmMetric::CompletionTokens);
        s.completion_dist
            .observe(&self.completion_buckets, ai.completion_tokens);
        touch(LlmMetric::CompletionTokensDist);
    }

    /// Whether metric `m` of `s` is live at `now`; a lapsed one is zeroed.
    fn live(&self, s: &LlmSeries, m: LlmMetric, now: u64) -> bool {
        let expire = self.expire[m as usize];
        if expire == 0 {
            return true;
        }
        let touched = s.touched[m as usize].load(Ordering::Relaxed);
        if touched != 0 && now.saturating_sub(touched) < expire {
            return true;
        }
        match m {
            LlmMetric::Latency => {
                s.latency_total.reset();
                s.latency_ttft.reset();
            }
            LlmMetric::PromptTokens => s.prompt_tokens.store(0, Ordering::Relaxed),
            LlmMetric::CompletionTokens => s.completion_tokens.store(0, Ordering::Relaxed),
            LlmMetric::PromptTokensDist => s.prompt_dist.reset(),
            LlmMetric::CompletionTokensDist => s.completion_dist.reset(),
        }
        false
    }

    /// The lines of every live series at `now`.
    pub fn lines(
        &self,
        now: u64,
        disabled: Option<&DisabledLabels>,
        out: &mut Vec<(String, String)>,
    ) {
        let all: Vec<(Box<[String]>, Arc<LlmSeries>)> = self
            .series
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect();
        for (key, s) in all {
            let (base, mut extra_values) = key.split_at(BASE_LABELS.min(key.len()));
            let label = |i: usize| base.get(i).map_or("", String::as_str);
            for (m, extra) in LlmMetric::ALL.iter().zip(&self.extra) {
                let (values, rest) =
                    extra_values.split_at(extra.vars.len().min(extra_values.len()));
                extra_values = rest;
                if !self.live(&s, *m, now) {
                    continue;
                }
                let extra_pairs = extra.pairs(values);
                let mut labels: [(&str, &str); 7] = [
                    ("route_id", label(0)),
                    ("service_id", label(1)),
                    ("consumer", label(2)),
                    ("node", label(3)),
                    ("request_type", label(4)),
                    ("request_llm_model", label(5)),
                    ("llm_model", label(6)),
                ];
                blank(&mut labels, disabled.and_then(|d| d.of(m.name())));
                match m {
                    LlmMetric::Latency => {
                        for (kind, h) in [("total", &s.latency_total), ("ttft", &s.latency_ttft)] {
                            let kind_label = [("type", kind)];
                            h.lines(
                                m.name(),
                                &[&kind_label, &labels, &extra_pairs],
                                &self.latency_buckets,
                                out,
                            );
                        }
                    }
                    LlmMetric::PromptTokens | LlmMetric::CompletionTokens => {
                        let n = if *m == LlmMetric::PromptTokens {
                            &s.prompt_tokens
                        } else {
                            &s.completion_tokens
                        };
                        out.push((
                            series_key(m.name(), &[&labels, &extra_pairs]),
                            n.load(Ordering::Relaxed).to_string(),
                        ));
                    }
                    LlmMetric::PromptTokensDist => s.prompt_dist.lines(
                        m.name(),
                        &[&labels, &extra_pairs],
                        &self.prompt_buckets,
                        out,
                    ),
                    LlmMetric::CompletionTokensDist => s.completion_dist.lines(
                        m.name(),
                        &[&labels, &extra_pairs],
                        &self.completion_buckets,
                        out,
                    ),
                }
            }
        }
    }
}

/// `llm_active_connections`: the calls to a provider in flight (exporter.lua's
/// `inc_llm_active_connections` / `dec_llm_active_connections`), by the labels the call
/// started with. A call is counted from the moment it is sent until the provider's answer
/// is over (read whole, or its stream ended or dropped), each try of ai-proxy-multi on its
/// own instance; APISIX counts up at each try and down once in the log phase with the
/// labels as they are then, which can leave a series off by the retries or the model the
/// answer named.
pub struct ActiveConnections {
    extra: ExtraLabels,
    expire: u64,
    clock: Clock,
    series: RwLock<HashMap<Box<[String]>, Arc<Gauge>>>,
}

impl std::fmt::Debug for ActiveConnections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActiveConnections").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Gauge {
    value: AtomicI64,
    /// The last change (monotonic milliseconds) when the metric expires.
    touched: AtomicU64,
}

/// One call counted in [`ActiveConnections`]; dropping it counts the call out.
pub struct ActiveConnection {
    gauge: Arc<Gauge>,
    clock: Option<Clock>,
}

impl std::fmt::Debug for ActiveConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActiveConnection").finish_non_exhaustive()
    }
}

impl Drop for ActiveConnection {
    fn drop(&mut self) {
        self.gauge.value.fetch_sub(1, Ordering::Relaxed);
        if let Some(clock) = &self.clock {
            self.gauge
                .touched
                .store(clock.mono_ms().max(1), Ordering::Relaxed);
        }
    }
}

impl ActiveConnections {
    pub fn new(attr: &PrometheusAttr, clock: Clock) -> ActiveConnections {
        let m = &attr.metrics.llm_active_connections;
        ActiveConnections {
            extra: ExtraLabels::new(m),
            expire: expire_ms(m.expire),
            clock,
            series: RwLock::new(HashMap::new()),
        }
    }

    /// The variables the extra labels read.
    pub fn vars(&self) -> &[String] {
        &self.extra.vars
    }

    /// Counts a call in: `labels` in [`LLM_ACTIVE_CONNECTIONS_LABELS`]' order (the models
    /// cut as [`model_label`] cuts them), `extra` the values of [`Self::vars`].
    pub fn track(&self, labels: [&str; 11], extra: Vec<String>) -> ActiveConnection {
        let mut key: Vec<String> = labels.iter().map(|l| (*l).to_owned()).collect();
        key.extend(extra);
        let found = self
            .series
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key.as_slice())
            .cloned();
        let gauge = match found {
            Some(g) => g,
            None => self
                .series
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .entry(key.into_boxed_slice())
                .or_default()
                .clone(),
        };
        gauge.value.fetch_add(1, Ordering::Relaxed);
        let clock = (self.expire > 0).then(|| self.clock.clone());
        if let Some(clock) = &clock {
            gauge
                .touched
                .store(clock.mono_ms().max(1), Ordering::Relaxed);
        }
        ActiveConnection { gauge, clock }
    }

    /// The gauge's lines at `now`. A series not changed for `expire` leaves the exposition
    /// (as its shared-dict key lapses in APISIX) but keeps its count, so the calls still in
    /// flight are counted out from it and it comes back right.
    pub fn lines(&self, now: u64, disabled: Option<&[String]>, out: &mut Vec<(String, String)>) {
        let all: Vec<(Box<[String]>, Arc<Gauge>)> = self
            .series
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, g)| (k.clone(), g.clone()))
            .collect();
        for (key, g) in all {
            if self.expire > 0 {
                let touched = g.touched.load(Ordering::Relaxed);
                if touched == 0 || now.saturating_sub(touched) >= self.expire {
                    continue;
                }
            }
            let (base, extra_values) =
                key.split_at(LLM_ACTIVE_CONNECTIONS_LABELS.len().min(key.len()));
            let mut labels: Vec<(&str, &str)> = LLM_ACTIVE_CONNECTIONS_LABELS
                .iter()
                .zip(base)
                .map(|(n, v)| (*n, v.as_str()))
                .collect();
            blank(&mut labels, disabled);
            let extra = self.extra.pairs(extra_values);
            out.push((
                series_key("llm_active_connections", &[&labels, &extra]),
                g.value.load(Ordering::Relaxed).to_string(),
            ));
        }
    }
}
