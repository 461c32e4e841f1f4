//! prometheus plugin costs (spec data-plane §7):
//!
//! - `prometheus/log`: recording one request in the log phase for a route with `prometheus: {}`
//!   (benchmark scenario 2's conf): one status counter, three latency histogram observations
//!   (request, upstream, apisix) and two bandwidth counters, all atomics of the route's group.
//! - `prometheus/log_extra_labels`: the same with `plugin_attr.prometheus.metrics` giving every
//!   metric `extra_labels` (`upstream_addr`, and `upstream_status` for `http_status`) and an
//!   `expire`: the per-request label lookup, map probe and time stamp that configuration costs.
//! - `prometheus/log_prometheus_crate`: the same request recorded with the `prometheus` crate
//!   instead (the same metrics, APISIX 3.18's labels): it formats every label value and looks
//!   the series up by hashing them, per metric per request, since `code` and `node` are only
//!   known at log time. The measured reason ferrisix keeps its own series
//!   (`docs/dependencies.md`).
//! - `prometheus/render`: producing the whole exposition text (what a scrape of
//!   `/apisix/prometheus/metrics` returns) at about 1k and 10k series: routes that each saw
//!   four status codes give 60 series per route (4 `http_status`, 3 × 18 `http_latency_*`,
//!   2 `bandwidth`), plus the node metrics. The exact count is printed.
//!
//! Each group uses its own `Metrics` (default `plugin_attr.prometheus`), so the counts are not
//! mixed with other benches' series.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::borrow::Cow;

use std::sync::Arc;

use ferrisix_config::settings::{
    ExtraLabel, MetricAttr, PrometheusAttr, PrometheusMetrics, BANDWIDTH_LABELS,
    HTTP_LATENCY_LABELS, HTTP_STATUS_LABELS,
};
use ferrisix_plugin_api::{Clock, ConnStats, LogCtx, LogVars, Plugin, ResponseSource, RouteInfo};
use ferrisix_plugins::observe::prometheus::{Metrics, Prometheus, DEFAULT_BUCKETS};
use ferrisix_router::VarSource;
use serde_json::json;

/// Series per route in the render bench: 4 status codes, 3 histograms of 15 buckets + `+Inf`,
/// `_count` and `_sum`, 2 bandwidth directions.
const SERIES_PER_ROUTE: usize = 4 + 3 * 18 + 2;
const STATUS_CODES: [u16; 4] = [200, 404, 429, 503];

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

fn route(id: usize) -> RouteInfo {
    RouteInfo {
        id: id.to_string().into(),
        uris: vec!["/hello".into()].into(),
        ..Default::default()
    }
}

/// A proxied request as the log phase sees it.
fn request(status: u16) -> LogCtx {
    LogCtx {
        status,
        matched_uri: Some(0),
        matched_host: None,
        node: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        request_length: 80,
        bytes_sent: 180,
        request_time: Duration::from_micros(1500),
        upstream_time: Some(Duration::from_micros(1200)),
        response_source: ResponseSource::Upstream,
        ..Default::default()
    }
}

fn log(c: &mut Criterion) {
    let p = Prometheus::compile(&json!({}), Some(&route(1)), metrics());
    let ctx = request(200);
    let mut g = c.benchmark_group("prometheus");
    g.bench_function("log", |b| b.iter(|| p.log(black_box(&ctx))));
    g.finish();
}

/// The same metrics in the `prometheus` crate.
struct CrateMetrics {
    status: prometheus::IntCounterVec,
    latency: prometheus::HistogramVec,
    bandwidth: prometheus::IntCounterVec,
}

impl CrateMetrics {
    fn new() -> CrateMetrics {
        let opts = |name: &str| prometheus::Opts::new(name, name);
        CrateMetrics {
            status: prometheus::IntCounterVec::new(opts("apisix_http_status"), &HTTP_STATUS_LABELS)
                .unwrap(),
            latency: prometheus::HistogramVec::new(
                prometheus::HistogramOpts::new("apisix_http_latency", "latency")
                    .buckets(DEFAULT_BUCKETS.to_vec()),
                &HTTP_LATENCY_LABELS,
            )
            .unwrap(),
            bandwidth: prometheus::IntCounterVec::new(opts("apisix_bandwidth"), &BANDWIDTH_LABELS)
                .unwrap(),
        }
    }

    /// What a log phase on this crate does per request.
    fn log(&self, route: &str, ctx: &LogCtx) {
        let code = ctx.status.to_string();
        let node = ctx.node.map(|n| n.to_string()).unwrap_or_default();
        let http = "traditional_http";
        self.status
            .with_label_values(&[
                &code, route, "/hello", "", "", "", &node, http, "", "", "upstream",
            ])
            .inc();
        let request = ctx.request_time.as_secs_f64() * 1000.0;
        let upstream = ctx.upstream_time.unwrap_or_default().as_secs_f64() * 1000.0;
        for (kind, ms) in [
            ("request", request),
            ("upstream", upstream),
            ("apisix", request - upstream),
        ] {
            self.latency
                .with_label_values(&[kind, route, "", "", &node, http, "", ""])
                .observe(ms);
        }
        for (kind, bytes) in [("ingress", ctx.request_length), ("egress", ctx.bytes_sent)] {
            self.bandwidth
                .with_label_values(&[kind, route, "", "", &node, http, "", ""])
                .inc_by(bytes);
        }
    }
}

fn log_prometheus_crate(c: &mut Criterion) {
    let m = CrateMetrics::new();
    let ctx = request(200);
    let mut g = c.benchmark_group("prometheus");
    g.bench_function("log_prometheus_crate", |b| {
        b.iter(|| m.log("1", black_box(&ctx)))
    });
    g.finish();
}

/// What the proxy captures for the extra labels.
struct Upstream;

impl VarSource for Upstream {
    fn var(&self, name: &str) -> Option<Cow<'_, str>> {
        match name {
            "upstream_addr" => Some(Cow::Borrowed("127.0.0.1:1980")),
            "upstream_status" => Some(Cow::Borrowed("200")),
            _ => None,
        }
    }
}

fn log_extra_labels(c: &mut Criterion) {
    let label = |name: &str| ExtraLabel {
        name: name.into(),
        value: format!("${name}"),
    };
    let attr = |labels: &[&str]| MetricAttr {
        expire: 60.0,
        extra_labels: labels.iter().map(|l| label(l)).collect(),
    };
    let m = metrics_of(&PrometheusAttr {
        metrics: PrometheusMetrics {
            http_status: attr(&["upstream_addr", "upstream_status"]),
            http_latency: attr(&["upstream_addr"]),
            bandwidth: attr(&["upstream_addr"]),
            ..Default::default()
        },
        ..Default::default()
    });
    let p = Prometheus::compile(&json!({}), Some(&route(1)), m);
    let mut ctx = request(200);
    ctx.vars = LogVars::capture(p.log_needs().vars.unwrap(), &Upstream);
    let mut g = c.benchmark_group("prometheus");
    g.bench_function("log_extra_labels", |b| b.iter(|| p.log(black_box(&ctx))));
    g.finish();
}

fn render(c: &mut Criterion) {
    let mut g = c.benchmark_group("prometheus/render");
    g.sample_size(10);
    for target in [1_000, 10_000] {
        let m = metrics();
        let routes = target / SERIES_PER_ROUTE;
        // The compiled plugins must stay alive: a group nothing leases is released.
        let plugins: Vec<Prometheus> = (0..routes)
            .map(|i| {
                let p = Prometheus::compile(&json!({}), Some(&route(i)), m.clone());
                for code in STATUS_CODES {
                    p.log(&request(code));
                }
                p
            })
            .collect();
        let series = m.render().lines().filter(|l| !l.starts_with('#')).count();
        eprintln!("prometheus/render/{target}: {routes} routes, {series} series");
        g.throughput(Throughput::Elements(series as u64));
        g.bench_with_input(BenchmarkId::from_parameter(target), &target, |b, _| {
            b.iter(|| m.render().len())
        });
        drop(plugins);
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
}

criterion_group! {
    name = benches;
    config = config();
    targets = log, log_prometheus_crate, log_extra_labels, render
}
criterion_main!(benches);
