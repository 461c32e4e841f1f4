//! The ai-cache metrics of APISIX 3.18's exporter: `ai_cache_hits_total` (per serving
//! `layer`), `ai_cache_misses_total`, `ai_cache_bypasses_total` (counters) and
//! `ai_cache_embedding_latency` (histogram, milliseconds of the semantic layer's embedding
//! call), recorded in the log phase from what ai-cache decided for the request
//! ([`AiCacheState`]).
//!
//! Their labels are the route's name and id, the service's name and id (not `prefer_name`'s
//! choice, as exporter.lua's `ai_cache_label_values`), the consumer, the picked instance's
//! name as `node` and the AI labels, so a series is found by its label values in a map
//! behind a read-write lock, as the LLM metrics' are ([`super::llm`]). Only requests ai-cache
//! ran on come here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use ferrisix_config::settings::{MetricAttr, PrometheusAttr};
use ferrisix_plugin_api::LogCtx;

use super::llm::{Buckets, Histogram};
use super::{blank, expire_ms, series_key, DisabledLabels, ExtraLabels};
use crate::ai::ai_cache::{AiCacheState, CacheStatus};

/// The four metrics, in the order of their per-metric settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheMetric {
    Hits,
    Misses,
    Bypasses,
    EmbeddingLatency,
}

impl CacheMetric {
    pub const ALL: [CacheMetric; 4] = [
        CacheMetric::Hits,
        CacheMetric::Misses,
        CacheMetric::Bypasses,
        CacheMetric::EmbeddingLatency,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CacheMetric::Hits => "ai_cache_hits_total",
            CacheMetric::Misses => "ai_cache_misses_total",
            CacheMetric::Bypasses => "ai_cache_bypasses_total",
            CacheMetric::EmbeddingLatency => "ai_cache_embedding_latency",
        }
    }

    fn attr(self, attr: &PrometheusAttr) -> &MetricAttr {
        let m = &attr.metrics;
        match self {
            CacheMetric::Hits => &m.ai_cache_hits_total,
            CacheMetric::Misses => &m.ai_cache_misses_total,
            CacheMetric::Bypasses => &m.ai_cache_bypasses_total,
            CacheMetric::EmbeddingLatency => &m.ai_cache_embedding_latency,
        }
    }
}

/// The labels every ai-cache metric has (`layer` leads them on the hits).
pub const AI_CACHE_LABELS: [&str; 9] = [
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

/// One series: a count, or (the embedding latency) a histogram.
struct CacheSeries {
    count: AtomicU64,
    latency: Option<Histogram>,
    /// The last update (monotonic milliseconds) when the metric expires.
    touched: AtomicU64,
}

pub struct AiCacheMetrics {
    latency_buckets: Buckets,
    extra: [ExtraLabels; 4],
    expire: [u64; 4],
    /// Keyed by the metric's index, `layer` (empty but on hits), the nine labels, then
    /// the metric's extra-label values.
    series: RwLock<HashMap<Box<[String]>, Arc<CacheSeries>>>,
}

impl AiCacheMetrics {
    pub fn new(attr: &PrometheusAttr) -> AiCacheMetrics {
        let buckets = attr
            .ai_cache_embedding_latency_buckets
            .clone()
            .unwrap_or_else(|| super::DEFAULT_BUCKETS.to_vec());
        AiCacheMetrics {
            latency_buckets: Buckets::new(buckets),
            extra: CacheMetric::ALL.map(|m| ExtraLabels::new(m.attr(attr))),
            expire: CacheMetric::ALL.map(|m| expire_ms(m.attr(attr).expire)),
            series: RwLock::new(HashMap::new()),
        }
    }

    /// The variables the extra labels read.
    pub fn vars(&self) -> impl Iterator<Item = &String> {
        self.extra.iter().flat_map(|e| e.vars.iter())
    }

    pub fn expires(&self) -> bool {
        self.expire.iter().any(|e| *e > 0)
    }

    fn series(&self, m: CacheMetric, key: Vec<String>) -> Arc<CacheSeries> {
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
                Arc::new(CacheSeries {
                    count: AtomicU64::new(0),
                    latency: (m == CacheMetric::EmbeddingLatency)
                        .then(|| Histogram::new(&self.latency_buckets)),
                    touched: AtomicU64::new(0),
                })
            })
            .clone()
    }

    fn key(&self, m: CacheMetric, layer: &str, labels: &[&str; 9], ctx: &LogCtx) -> Vec<String> {
        let mut key = Vec::with_capacity(11 + self.extra[m as usize].vars.len());
        key.push((m as usize).to_string());
        key.push(layer.to_owned());
        key.extend(labels.iter().map(|l| (*l).to_owned()));
        for var in &self.extra[m as usize].vars {
            key.push(
                ferrisix_router::VarSource::var(ctx, var)
                    .map(|v| v.into_owned())
                    .unwrap_or_default(),
            );
        }
        key
    }

    /// Records what ai-cache decided (exporter.lua's `http_log`, its ai-cache part):
    /// `labels` in [`AI_CACHE_LABELS`]' order; `now`: the clock when a metric expires.
    pub fn record(&self, state: &AiCacheState, labels: &[&str; 9], ctx: &LogCtx, now: u64) {
        let touch = |m: CacheMetric, s: &CacheSeries| {
            if self.expire[m as usize] > 0 {
                s.touched.store(now.max(1), Ordering::Relaxed);
            }
        };
        let (m, layer) = match state.status {
            CacheStatus::Hit => (CacheMetric::Hits, state.hit_layer.unwrap_or("exact")),
            CacheStatus::Miss => (CacheMetric::Misses, ""),
            CacheStatus::Bypass => (CacheMetric::Bypasses, ""),
        };
        let s = self.series(m, self.key(m, layer, labels, ctx));
        s.count.fetch_add(1, Ordering::Relaxed);
        touch(m, &s);
        if let Some(took) = state.embedding_latency {
            let m = CacheMetric::EmbeddingLatency;
            let s = self.series(m, self.key(m, "", labels, ctx));
            if let Some(h) = &s.latency {
                // ngx.now()'s resolution: whole milliseconds.
                h.observe(&self.latency_buckets, took.as_millis() as u64);
            }
            touch(m, &s);
        }
    }

    /// The lines of every live series at `now`; a lapsed one is zeroed.
    pub fn lines(
        &self,
        now: u64,
        disabled: Option<&DisabledLabels>,
        out: &mut Vec<(String, String)>,
    ) {
        let all: Vec<(Box<[String]>, Arc<CacheSeries>)> = self
            .series
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect();
        for (key, s) in all {
            let Some(m) = key
                .first()
                .and_then(|i| i.parse::<usize>().ok())
                .and_then(|i| CacheMetric::ALL.get(i).copied())
            else {
                continue;
            };
            let expire = self.expire[m as usize];
            if expire > 0 {
                let touched = s.touched.load(Ordering::Relaxed);
                if touched == 0 || now.saturating_sub(touched) >= expire {
                    s.count.store(0, Ordering::Relaxed);
                    if let Some(h) = &s.latency {
                        h.reset();
                    }
                    continue;
                }
            }
            let at = |i: usize| key.get(i).map_or("", String::as_str);
            let layer = [("layer", at(1))];
            let mut labels: Vec<(&str, &str)> = AI_CACHE_LABELS
                .iter()
                .enumerate()
                .map(|(i, n)| (*n, at(2 + i)))
                .collect();
            blank(&mut labels, disabled.and_then(|d| d.of(m.name())));
            let extra = self.extra[m as usize].pairs(key.get(11..).unwrap_or_default());
            let parts: Vec<&[(&str, &str)]> = if m == CacheMetric::Hits {
                vec![&layer, &labels, &extra]
            } else {
                vec![&labels, &extra]
            };
            match &s.latency {
                Some(h) => h.lines(m.name(), &parts, &self.latency_buckets, out),
                None => out.push((
                    series_key(m.name(), &parts),
                    s.count.load(Ordering::Relaxed).to_string(),
                )),
            }
        }
    }
}
