//! skywalking (`apisix/plugins/skywalking.lua` on skywalking-nginx-lua's tracer): one
//! SkyWalking trace segment per sampled request, reported to the OAP's HTTP receiver.
//!
//! Settings are `plugin_attr.skywalking` (`service_name`, default `APISIX`;
//! `service_instance_name`, default `APISIX Instance Name`, `$hostname` the machine's name;
//! `endpoint_addr`, default `http://127.0.0.1:12800`; `report_interval` in seconds, default the
//! tracer's 3); the route's conf has only `sample_ratio` (default 1). A global rule's instance
//! is skipped on routes that have their own (`prefer_route`).
//!
//! A sampled request (in `rewrite`) gets the tracer's two spans:
//! - the entry span (id 0, parent -1) named `$uri`, layer `Http`, with the tags `http.method`,
//!   `http.params` (`$scheme://$host$request_uri`) and, at the end, `http.status_code` (the
//!   response status, as text), `isError` for 5xx, and a `CrossProcess` ref to the caller's
//!   segment when the request came with a valid `sw8` header (8 `-`-separated fields, the ids
//!   base64); the segment then continues the caller's trace id. Without one the trace id is
//!   the `request-id` header when there is one, else the segment's id (a random UUID);
//! - the exit span (id 1, parent 0) named `$uri`, peer `upstream service`, layer `Http`, with
//!   `http.status_code` the upstream's status (a number) when one upstream answered.
//!
//! Both end with the body's last chunk (a body filter on sampled requests, as APISIX's
//! `delayed_body_filter` finishes the tracer), and then carry component id 6002 (APISIX's); a
//! body that never reached its end leaves them to the log phase, with the tracer's 6000. The
//! upstream gets `sw8` for the exit span
//! (`1-<trace>-<segment>-1-<service>-<instance>-<$uri>-<upstream service>`, base64) and
//! `sw8-correlation` with the caller's correlation data (at most 3 entries), replacing what
//! the client sent; a request that is not sampled passes the client's headers unchanged.
//!
//! Reporting, as the tracer's client: segments go as JSON arrays (at most 100 a POST) to
//! `<endpoint_addr>/v3/segments`, through a batch processor that sends what it holds every
//! `report_interval`, off the request path; from the first sampled request on, a background
//! task reports the instance every `report_interval` (`/v3/management/reportProperties` with
//! `language: lua` until the OAP answers 200, then `/v3/management/keepAlive`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use bytes::Bytes;
use ferrisix_plugin_api::{
    BodyChunk, BodyFilter, Clock, CompileCtx, Lease, LogCtx, LogNeeds, Phases, Plugin, PluginCtx,
    PluginDef, PluginServices, ResponseHead, Retain, RunPolicy, StateMap, Step,
};
use ferrisix_router::VarSource;
use http::{HeaderName, HeaderValue, Request};
use serde_json::{json, Map, Value};

use crate::log::batch_processor::{
    Backlogs, BatchConfig, BatchProcessor, BatchSink, SendFuture, DEFAULT_MAX_PENDING_ENTRIES,
};
use crate::log::logger::{encode_batch, Concat};
use crate::support::trace::Collector;

pub const NAME: &str = "skywalking";

pub static DEF: PluginDef = PluginDef {
    run_policy: RunPolicy::PreferRoute,
    ..PluginDef::new(NAME, 12010, schema, compile)
};

/// APISIX's component id for its spans, set when the body reaches its end.
const COMPONENT_ID: u32 = 6002;
/// The tracer's own component id, which the spans keep when the body never reached its end.
const TRACER_COMPONENT_ID: u32 = 6000;
/// The peer APISIX names for the upstream.
const PEER: &str = "upstream service";
/// The client's `SEGMENT_BATCH_COUNT`.
const SEGMENTS_PER_POST: usize = 100;
/// The client's `backendTimerDelay` (seconds).
const DEFAULT_REPORT_INTERVAL: u64 = 3;
/// lua-resty-http's default socket timeout, which the client's calls keep.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "sample_ratio": {"type": "number", "minimum": 0.00001, "maximum": 1, "default": 1}
        }
    })
}

/// `plugin_attr.skywalking`'s schema.
fn attr_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "service_name": {"type": "string", "description": "service name for skywalking", "default": "APISIX"},
            "service_instance_name": {"type": "string", "description": "User Service Instance Name", "default": "APISIX Instance Name"},
            "endpoint_addr": {"type": "string", "default": "http://127.0.0.1:12800"},
            "report_interval": {"type": "integer"}
        }
    })
}

/// The reporter's settings, from `plugin_attr.skywalking`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Settings {
    service: String,
    instance: String,
    endpoint: String,
    interval: Duration,
}

impl Settings {
    fn from_attr(attr: Option<&Value>) -> Result<Settings, String> {
        let mut v = attr.cloned().unwrap_or_else(|| json!({}));
        ferrisix_config::schema::validate_and_fill(&attr_schema(), &mut v)
            .map_err(|e| format!("failed to check the plugin_attr[{NAME}]: {e}"))?;
        let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        let mut instance = text("service_instance_name");
        if instance == "$hostname" {
            instance = crate::log::log_entry::hostname();
        }
        // A zero or negative interval would spin; the tracer's timer cannot go below a tick.
        let interval = v
            .get("report_interval")
            .and_then(Value::as_i64)
            .map_or(DEFAULT_REPORT_INTERVAL, |n| n.max(1) as u64);
        Ok(Settings {
            service: text("service_name"),
            instance,
            endpoint: text("endpoint_addr").trim_end_matches('/').to_owned(),
            interval: Duration::from_secs(interval),
        })
    }
}

/// The instance reports, started with the first sampled request.
struct Management {
    settings: Settings,
    services: Weak<PluginServices>,
    /// `instancePropertiesSubmitted`.
    submitted: AtomicBool,
}

impl Management {
    async fn post(&self, path: &str, body: Value) -> Result<u16, String> {
        let services = self.services.upgrade().ok_or("the gateway is gone")?;
        let req = Request::post(format!("{}{path}", self.settings.endpoint))
            .header("content-type", "application/json")
            .body(Bytes::from(body.to_string()))
            .map_err(|e| e.to_string())?;
        services
            .http()
            .send(req, CALL_TIMEOUT)
            .await
            .map(|r| r.status().as_u16())
            .map_err(|e| e.to_string())
    }

    /// One tick of the client's timer: the instance's properties until the OAP took them,
    /// then a keep-alive.
    async fn tick(&self) {
        let s = &self.settings;
        if !self.submitted.load(Ordering::Relaxed) {
            let body = json!({"service": s.service, "serviceInstance": s.instance,
                "properties": [{"key": "language", "value": "lua"}]});
            match self.post("/v3/management/reportProperties", body).await {
                Ok(200) => self.submitted.store(true, Ordering::Relaxed),
                Ok(status) => tracing::error!("Instance report fails, response code {status}"),
                Err(e) => tracing::error!("Instance report fails, {e}"),
            }
        } else {
            let body = json!({"service": s.service, "serviceInstance": s.instance});
            match self.post("/v3/management/keepAlive", body).await {
                Ok(200) => {}
                Ok(status) => tracing::error!("Agent ping fails, response code {status}"),
                Err(e) => tracing::error!("Agent ping fails, {e}"),
            }
        }
    }
}

/// One gateway's reporter: the segments' processor and the instance reports.
struct Reporter {
    processor: BatchProcessor,
    management: Arc<Management>,
    started: AtomicBool,
}

impl Retain for Reporter {}

impl Reporter {
    /// Starts the instance reports once (the client's `startBackendTimer`).
    fn start(&self, services: &PluginServices) {
        if self.started.swap(true, Ordering::Relaxed) {
            return;
        }
        let weak = Arc::downgrade(&self.management);
        let interval = self.management.settings.interval;
        let shutdown = services.shutdown().clone();
        let task = async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = shutdown.started() => return,
                }
                let Some(m) = weak.upgrade() else {
                    return;
                };
                m.tick().await;
            }
        };
        if let Err(e) = services.executor().spawn(task) {
            tracing::error!("failed to create timer: {e}");
        }
    }
}

/// POSTs batches of segments (each entry one encoded segment) as a JSON array.
struct SegmentSink(Collector);

impl BatchSink for SegmentSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], _: usize) -> SendFuture<'a> {
        Box::pin(self.0.post(
            encode_batch(entries, usize::MAX, Concat::Json),
            "Segment report fails, ",
        ))
    }
}

struct Skywalking {
    sample_ratio: f64,
    /// `None`: `plugin_attr.skywalking` is invalid, so nothing is traced (as APISIX, whose
    /// tracer then has no service to report for).
    reporter: Option<Lease<Reporter>>,
    services: Arc<PluginServices>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let services = cx.services;
    let reporter = match Settings::from_attr(services.plugin_attr().others.get(NAME)) {
        Ok(settings) => {
            let key = format!(
                "{NAME}:{}|{}|{}|{}",
                settings.endpoint,
                settings.service,
                settings.instance,
                settings.interval.as_secs()
            );
            Some(
                services
                    .shared::<StateMap<Reporter>>()
                    .lease(&key, || new_reporter(settings, services)),
            )
        }
        Err(e) => {
            tracing::error!("{e}");
            None
        }
    };
    Ok(Arc::new(Skywalking {
        sample_ratio: conf
            .get("sample_ratio")
            .and_then(Value::as_f64)
            .unwrap_or(1.0),
        reporter,
        services: services.clone(),
    }))
}

fn new_reporter(settings: Settings, services: &Arc<PluginServices>) -> Reporter {
    let sink = SegmentSink(Collector {
        url: format!("{}/v3/segments", settings.endpoint),
        content_type: HeaderValue::from_static("application/json"),
        headers: Vec::new(),
        timeout: CALL_TIMEOUT,
        services: Arc::downgrade(services),
    });
    let config = BatchConfig {
        name: NAME.into(),
        batch_max_size: SEGMENTS_PER_POST,
        inactive_timeout: settings.interval,
        buffer_duration: settings.interval,
        max_retry_count: 0,
        retry_delay: Duration::from_secs(1),
    };
    Reporter {
        processor: BatchProcessor::new(
            config,
            Arc::new(sink),
            services.shared::<Backlogs>().of(NAME),
            DEFAULT_MAX_PENDING_ENTRIES,
            services,
        ),
        management: Arc::new(Management {
            settings,
            services: Arc::downgrade(services),
            submitted: AtomicBool::new(false),
        }),
        started: AtomicBool::new(false),
    }
}

/// `ngx.decode_base64`: the standard alphabet, padding optional.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

fn decode(s: &str) -> Option<String> {
    LENIENT
        .decode(s)
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// The caller's segment, from its `sw8` header.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SegmentRef {
    trace_id: String,
    segment_id: String,
    span_id: Option<i64>,
    parent_service: String,
    parent_instance: String,
    parent_endpoint: String,
    address: String,
}

impl SegmentRef {
    /// `SegmentRef.fromSW8Value`: 8 fields exactly, else no ref.
    fn parse(sw8: &str) -> Option<SegmentRef> {
        let parts: Vec<&str> = sw8.split('-').collect();
        if parts.len() != 8 {
            return None;
        }
        Some(SegmentRef {
            trace_id: decode(parts[1])?,
            segment_id: decode(parts[2])?,
            span_id: parts[3].parse().ok(),
            parent_service: decode(parts[4])?,
            parent_instance: decode(parts[5])?,
            parent_endpoint: decode(parts[6])?,
            address: decode(parts[7])?,
        })
    }

    fn to_json(&self) -> Value {
        json!({
            "refType": "CrossProcess",
            "traceId": self.trace_id,
            "parentTraceSegmentId": self.segment_id,
            "parentSpanId": self.span_id,
            "parentService": self.parent_service,
            "parentServiceInstance": self.parent_instance,
            "parentEndpoint": self.parent_endpoint,
            "networkAddressUsedAtPeer": self.address,
        })
    }
}

/// `CorrelationContext.fromSW8Value`: `key:value` pairs (base64), comma-separated; more than
/// 3 drops them all.
fn parse_correlation(value: &str) -> Vec<(String, String)> {
    let data: Vec<&str> = value.split(',').filter(|s| !s.is_empty()).collect();
    if data.len() > 3 {
        return Vec::new();
    }
    data.iter()
        .filter_map(|d| {
            let parts: Vec<&str> = d.split(':').filter(|s| !s.is_empty()).collect();
            match parts[..] {
                [k, v] => Some((decode(k)?, decode(v)?)),
                _ => None,
            }
        })
        .collect()
}

/// A random UUID v4 (`resty.jit-uuid`'s `generate_v4`), the tracer's segment ids.
fn new_id() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// A sampled request's trace, from `rewrite` to the log phase.
#[derive(Clone, Debug)]
struct RequestTrace {
    trace_id: String,
    segment_id: String,
    start_ms: u64,
    operation: String,
    method: String,
    params: String,
    reference: Option<SegmentRef>,
}

impl Skywalking {
    fn rewrite_phase(&self, ctx: &mut PluginCtx<'_>) {
        let Some(reporter) = &self.reporter else {
            return;
        };
        if self.sample_ratio != 1.0 && rand::random::<f64>() >= self.sample_ratio {
            return;
        }
        let settings = &reporter.management.settings;
        let segment_id = new_id();
        let reference = ctx.header("sw8").and_then(SegmentRef::parse);
        let trace_id = match (&reference, ctx.header("request-id")) {
            (Some(r), _) => r.trace_id.clone(),
            (None, Some(id)) => id.to_owned(),
            (None, None) => segment_id.clone(),
        };
        let correlation = ctx
            .header("sw8-correlation")
            .map(parse_correlation)
            .unwrap_or_default();
        let uri = ctx.uri().to_owned();
        let var = |n: &str| ctx.var(n).map(|v| v.into_owned()).unwrap_or_default();
        let params = format!("{}://{}{}", var("scheme"), var("host"), ctx.request_uri());
        let sw8 = [
            "1".to_owned(),
            STANDARD.encode(&trace_id),
            STANDARD.encode(&segment_id),
            "1".to_owned(),
            STANDARD.encode(&settings.service),
            STANDARD.encode(&settings.instance),
            STANDARD.encode(&uri),
            STANDARD.encode(PEER),
        ]
        .join("-");
        let correlation = correlation
            .iter()
            .map(|(k, v)| format!("{}:{}", STANDARD.encode(k), STANDARD.encode(v)))
            .collect::<Vec<_>>()
            .join(",");
        let headers = ctx.headers_mut();
        if let Ok(v) = HeaderValue::from_str(&sw8) {
            headers.insert(HeaderName::from_static("sw8"), v);
        }
        // An empty value clears the header, as `ngx.req.set_header` does.
        match HeaderValue::from_str(&correlation) {
            Ok(v) if !correlation.is_empty() => {
                headers.insert(HeaderName::from_static("sw8-correlation"), v);
            }
            _ => {
                headers.remove("sw8-correlation");
            }
        }
        let trace = RequestTrace {
            trace_id,
            segment_id,
            start_ms: self.services.clock().epoch_ms(),
            operation: uri,
            method: ctx.method().as_str().to_owned(),
            params,
            reference,
        };
        ctx.insert(trace);
    }

    fn log_phase(&self, ctx: &LogCtx) {
        let (Some(reporter), Some(trace)) = (&self.reporter, ctx.value::<RequestTrace>()) else {
            return;
        };
        reporter.start(&self.services);
        // The tracer finishes with the body's last chunk; a body that never got there
        // (the client went away) leaves the spans to the log phase's time.
        let ended = ctx
            .value::<BodyEnd>()
            .map(|e| e.0.load(Ordering::Relaxed))
            .filter(|t| *t != 0);
        let now = ended
            .unwrap_or_else(|| self.services.clock().epoch_ms())
            .max(trace.start_ms);
        let settings = &reporter.management.settings;
        let component = if ended.is_some() {
            COMPONENT_ID
        } else {
            TRACER_COMPONENT_ID
        };
        let segment = segment(trace, settings, ctx, now, component);
        reporter.processor.push(Bytes::from(segment.to_string()));
    }
}

/// The segment of a finished request (`Segment.transform`): the exit span, then the entry
/// span, in the order the tracer finishes them.
fn segment(
    trace: &RequestTrace,
    settings: &Settings,
    ctx: &LogCtx,
    now: u64,
    component: u32,
) -> Value {
    let mut exit = Map::new();
    exit.insert("spanId".into(), json!(1));
    exit.insert("parentSpanId".into(), json!(0));
    exit.insert("startTime".into(), json!(trace.start_ms));
    exit.insert("endTime".into(), json!(now));
    exit.insert("operationName".into(), json!(trace.operation));
    exit.insert("peer".into(), json!(PEER));
    exit.insert("spanType".into(), json!("Exit"));
    exit.insert("spanLayer".into(), json!("Http"));
    exit.insert("componentId".into(), json!(component));
    exit.insert("isError".into(), json!(false));
    // `tonumber($upstream_status)`: only when one upstream answered.
    if let Some(status) = ctx
        .vars
        .get("upstream_status")
        .and_then(|s| s.trim().parse::<u16>().ok())
    {
        exit.insert(
            "tags".into(),
            json!([{"key": "http.status_code", "value": status}]),
        );
    }
    let mut entry = Map::new();
    entry.insert("spanId".into(), json!(0));
    entry.insert("parentSpanId".into(), json!(-1));
    entry.insert("startTime".into(), json!(trace.start_ms));
    entry.insert("endTime".into(), json!(now));
    if let Some(r) = &trace.reference {
        entry.insert("refs".into(), json!([r.to_json()]));
    }
    entry.insert("operationName".into(), json!(trace.operation));
    entry.insert("spanType".into(), json!("Entry"));
    entry.insert("spanLayer".into(), json!("Http"));
    entry.insert("componentId".into(), json!(component));
    entry.insert("isError".into(), json!(ctx.status >= 500));
    entry.insert(
        "tags".into(),
        json!([
            {"key": "http.method", "value": trace.method},
            {"key": "http.params", "value": trace.params},
            {"key": "http.status_code", "value": ctx.status.to_string()},
        ]),
    );
    json!({
        "traceId": trace.trace_id,
        "traceSegmentId": trace.segment_id,
        "service": settings.service,
        "serviceInstance": settings.instance,
        "spans": [Value::Object(exit), Value::Object(entry)],
    })
}

/// When a sampled request's body reached its end (epoch ms; 0 until then).
struct BodyEnd(Arc<AtomicU64>);

/// APISIX's `delayed_body_filter`: notes the time of the last chunk, when the tracer
/// finishes the spans. The chunks pass unchanged.
struct MarkEnd {
    at: Arc<AtomicU64>,
    clock: Clock,
}

impl BodyFilter for MarkEnd {
    fn filter(&mut self, chunk: &mut BodyChunk) {
        if chunk.end && self.at.load(Ordering::Relaxed) == 0 {
            self.at
                .store(self.clock.epoch_ms().max(1), Ordering::Relaxed);
        }
    }
}

impl Plugin for Skywalking {
    fn phases(&self) -> Phases {
        Phases::REWRITE | Phases::HEADER_FILTER | Phases::LOG
    }

    fn header_filter(&self, ctx: &mut PluginCtx<'_>, resp: &mut ResponseHead<'_>) {
        // Sampled requests only: the others' bodies pass without a filter.
        if ctx.get::<RequestTrace>().is_none() {
            return;
        }
        let at = Arc::new(AtomicU64::new(0));
        ctx.insert(BodyEnd(at.clone()));
        resp.add_body_filter(Box::new(MarkEnd {
            at,
            clock: self.services.clock().clone(),
        }));
    }

    fn log_needs(&self) -> LogNeeds {
        LogNeeds {
            vars: Some(vec![Box::<str>::from("upstream_status")].into()),
            ..LogNeeds::default()
        }
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        self.rewrite_phase(ctx);
        Step::CONTINUE
    }

    fn log(&self, ctx: &LogCtx) {
        self.log_phase(ctx);
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::settings::PluginAttr;
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::LogVars;
    use tokio::sync::mpsc;

    use super::*;
    use crate::log::sink::testing::{answer, http_server, next, Captured};
    use crate::testing::Compiler;

    fn oap(req: &Captured) -> Vec<u8> {
        if req.head.starts_with("POST /v3/") {
            answer(200, "{}")
        } else {
            answer(404, "")
        }
    }

    /// A gateway whose `plugin_attr.skywalking` points at an in-test OAP.
    async fn gateway(attr: Value) -> (Compiler, mpsc::UnboundedReceiver<Captured>) {
        gateway_on(attr, ferrisix_plugin_api::Clock::system()).await
    }

    async fn gateway_on(
        attr: Value,
        clock: ferrisix_plugin_api::Clock,
    ) -> (Compiler, mpsc::UnboundedReceiver<Captured>) {
        let (port, rx) = http_server(oap).await;
        let mut attr = attr;
        attr["endpoint_addr"] = json!(format!("http://127.0.0.1:{port}"));
        let mut plugin_attr = PluginAttr::default();
        plugin_attr.others.insert(NAME.into(), attr);
        let services =
            PluginServices::new(plugin_attr, ferrisix_plugin_api::Executor::current(), clock);
        (Compiler::with(Arc::new(services)), rx)
    }

    /// Runs a request through rewrite and log, its body to its end; answers the upstream's
    /// request headers.
    fn run(p: &dyn Plugin, req: &mut TestRequest, status: u16, upstream: &str) -> http::HeaderMap {
        run_with(p, req, status, upstream, &mut |filters| {
            filters.run(Bytes::from("body"), true);
        })
    }

    /// [`run`], `body` given the response's body filters after `header_filter`.
    fn run_with(
        p: &dyn Plugin,
        req: &mut TestRequest,
        status: u16,
        upstream: &str,
        body: &mut dyn FnMut(&mut ferrisix_plugin_api::BodyFilters),
    ) -> http::HeaderMap {
        let mut ctx = req.ctx();
        assert!(matches!(p.rewrite(&mut ctx), Step::Done(_)));
        let sent = ctx.headers().clone();
        let (mut code, mut headers, mut edits) = (
            http::StatusCode::OK,
            http::HeaderMap::new(),
            ferrisix_plugin_api::BodyEdits::default(),
        );
        p.header_filter(
            &mut ctx,
            &mut ResponseHead::new(&mut code, &mut headers, true, &mut edits),
        );
        body(&mut edits.filters);
        struct V(String);
        impl ferrisix_router::VarSource for V {
            fn var(&self, name: &str) -> Option<std::borrow::Cow<'_, str>> {
                (name == "upstream_status" && !self.0.is_empty()).then(|| self.0.as_str().into())
            }
        }
        p.log(&LogCtx {
            status,
            vars: LogVars::capture(p.log_needs().vars.unwrap(), &V(upstream.into())),
            values: req.state.take_values(),
            ..Default::default()
        });
        sent
    }

    /// The requests the OAP got until one to `path` (all of them, in order).
    async fn until(rx: &mut mpsc::UnboundedReceiver<Captured>, path: &str) -> Vec<Captured> {
        let mut got = Vec::new();
        loop {
            let one = next(rx).await;
            let done = one.head.starts_with(&format!("POST {path} "));
            got.push(one);
            if done {
                return got;
            }
        }
    }

    async fn segments(rx: &mut mpsc::UnboundedReceiver<Captured>) -> Vec<Value> {
        let got = until(rx, "/v3/segments").await;
        let v: Value = serde_json::from_slice(&got.last().unwrap().body).unwrap();
        v.as_array().unwrap().clone()
    }

    const SW8: &str =
        "1-My4xMi4xMw==-My40NS42Nw-2-c2VydmljZQ==-aW5zdGFuY2U=-L2FwaQ==-MTAuMC4wLjE6ODA=";

    #[tokio::test]
    async fn a_segment_continues_the_callers_trace() {
        let (c, mut rx) = gateway(
            json!({"service_name": "gw", "service_instance_name": "gw-1",
            "report_interval": 1}),
        )
        .await;
        let p = (DEF.compile)(&c.cx(NAME, &json!({}), "sw-1", None)).unwrap();
        let mut req = TestRequest::get("/api/users?x=1")
            .header("sw8", SW8)
            .header("sw8-correlation", "a2V5:dmFsdWU=")
            .header("host", "gw.test");
        let sent = run(&*p, &mut req, 502, "502");
        let sw8 = sent.get("sw8").unwrap().to_str().unwrap().to_owned();
        let parts: Vec<&str> = sw8.split('-').collect();
        assert_eq!(parts.len(), 8);
        assert_eq!(parts[0], "1");
        assert_eq!(decode(parts[1]).unwrap(), "3.12.13");
        assert_eq!(parts[3], "1");
        assert_eq!(decode(parts[4]).unwrap(), "gw");
        assert_eq!(decode(parts[5]).unwrap(), "gw-1");
        assert_eq!(decode(parts[6]).unwrap(), "/api/users");
        assert_eq!(decode(parts[7]).unwrap(), "upstream service");
        assert_eq!(sent.get("sw8-correlation").unwrap(), "a2V5:dmFsdWU=");

        // The instance reports start with the first sampled request, the properties first,
        // then keep-alives; the segment comes in between or after.
        let mut got = until(&mut rx, "/v3/management/keepAlive").await;
        if !got.iter().any(|g| g.head.starts_with("POST /v3/segments ")) {
            got.extend(until(&mut rx, "/v3/segments").await);
        }
        let line = |g: &Captured| g.head.lines().next().unwrap().to_owned();
        let management: Vec<&Captured> = got
            .iter()
            .filter(|g| g.head.starts_with("POST /v3/management/"))
            .collect();
        assert!(line(management[0]).starts_with("POST /v3/management/reportProperties "));
        assert!(line(management.last().unwrap()).starts_with("POST /v3/management/keepAlive "));
        let props: Value = serde_json::from_slice(&management[0].body).unwrap();
        assert_eq!(
            props,
            json!({"service": "gw", "serviceInstance": "gw-1",
                "properties": [{"key": "language", "value": "lua"}]})
        );
        let ping: Value = serde_json::from_slice(&management.last().unwrap().body).unwrap();
        assert_eq!(ping, json!({"service": "gw", "serviceInstance": "gw-1"}));
        let seg = got
            .iter()
            .find(|g| g.head.starts_with("POST /v3/segments "))
            .unwrap();
        let segs: Vec<Value> = serde_json::from_slice(&seg.body).unwrap();
        assert_eq!(segs.len(), 1);
        let s = &segs[0];
        assert_eq!(s["traceId"], "3.12.13");
        assert_eq!(s["traceSegmentId"], decode(parts[2]).unwrap());
        assert_eq!(s["service"], "gw");
        assert_eq!(s["serviceInstance"], "gw-1");
        let (exit, entry) = (&s["spans"][0], &s["spans"][1]);
        assert_eq!(exit["spanType"], "Exit");
        assert_eq!(exit["spanId"], 1);
        assert_eq!(exit["parentSpanId"], 0);
        assert_eq!(exit["peer"], "upstream service");
        assert_eq!(exit["componentId"], 6002);
        assert_eq!(exit["spanLayer"], "Http");
        assert_eq!(
            exit["tags"],
            json!([{"key": "http.status_code", "value": 502}])
        );
        assert_eq!(entry["spanType"], "Entry");
        assert_eq!(entry["parentSpanId"], -1);
        assert_eq!(entry["operationName"], "/api/users");
        assert_eq!(entry["isError"], true);
        assert_eq!(
            entry["refs"],
            json!([{"refType": "CrossProcess", "traceId": "3.12.13",
                "parentTraceSegmentId": "3.45.67", "parentSpanId": 2, "parentService": "service",
                "parentServiceInstance": "instance", "parentEndpoint": "/api",
                "networkAddressUsedAtPeer": "10.0.0.1:80"}])
        );
        let tags = entry["tags"].as_array().unwrap();
        assert_eq!(tags[0], json!({"key": "http.method", "value": "GET"}));
        assert_eq!(tags[2], json!({"key": "http.status_code", "value": "502"}));
        assert!(entry["endTime"].as_u64() >= entry["startTime"].as_u64());
    }

    #[tokio::test]
    async fn the_spans_end_with_the_bodys_last_chunk() {
        let clock = ferrisix_plugin_api::Clock::manual(1_700_000_000_000);
        let (c, mut rx) = gateway_on(json!({"report_interval": 1}), clock.clone()).await;
        let p = (DEF.compile)(&c.cx(NAME, &json!({}), "sw-end", None)).unwrap();
        let mut req = TestRequest::get("/a");
        run_with(&*p, &mut req, 200, "200", &mut |filters| {
            clock.advance(5);
            let first = filters.run(Bytes::from("part"), false);
            assert_eq!(first.data, "part", "the chunks pass unchanged");
            clock.advance(7);
            filters.run(Bytes::from("end"), true);
            // The log phase comes later.
            clock.advance(100);
        });
        let segs = segments(&mut rx).await;
        for span in segs[0]["spans"].as_array().unwrap() {
            assert_eq!(span["startTime"], 1_700_000_000_000u64);
            assert_eq!(span["endTime"], 1_700_000_000_012u64, "{span}");
            assert_eq!(span["componentId"], 6002);
        }
        // A body that never reached its end: the spans end in the log phase, with the
        // tracer's own component id.
        let mut req = TestRequest::get("/b");
        run_with(&*p, &mut req, 200, "200", &mut |filters| {
            filters.run(Bytes::from("part"), false);
            clock.advance(30);
        });
        let segs = segments(&mut rx).await;
        for span in segs[0]["spans"].as_array().unwrap() {
            assert_eq!(
                span["endTime"].as_u64().unwrap() - span["startTime"].as_u64().unwrap(),
                30
            );
            assert_eq!(span["componentId"], 6000);
        }
        // A request that is not sampled gets no body filter.
        let p =
            (DEF.compile)(&c.cx(NAME, &json!({"sample_ratio": 0.00001}), "sw-none", None)).unwrap();
        let mut none = 0;
        for _ in 0..20 {
            let mut req = TestRequest::get("/c");
            run_with(&*p, &mut req, 200, "", &mut |filters| {
                none += usize::from(filters.is_empty());
            });
        }
        assert!(none >= 19, "{none}");
    }

    #[tokio::test]
    async fn a_new_trace_takes_the_request_id_or_its_segment_id() {
        let (c, mut rx) = gateway(json!({"report_interval": 1})).await;
        let p = (DEF.compile)(&c.cx(NAME, &json!({"sample_ratio": 1}), "sw-2", None)).unwrap();
        let mut req = TestRequest::get("/a").header("sw8", "1-bad");
        let sent = run(&*p, &mut req, 200, "");
        assert!(sent.get("sw8-correlation").is_none());
        let segs = segments(&mut rx).await;
        let s = &segs[0];
        assert_eq!(s["traceId"], s["traceSegmentId"]);
        assert_eq!(s["service"], "APISIX");
        assert_eq!(s["serviceInstance"], "APISIX Instance Name");
        assert!(s["spans"][0].get("tags").is_none());
        assert!(s["spans"][1].get("refs").is_none());
        assert_eq!(s["spans"][1]["isError"], false);

        let mut req = TestRequest::get("/a").header("request-id", "rid-1");
        run(&*p, &mut req, 200, "200");
        let segs = segments(&mut rx).await;
        assert_eq!(segs[0]["traceId"], "rid-1");
    }

    #[test]
    fn ids_and_headers() {
        let id = new_id();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert_ne!(new_id(), id);
        assert!(SegmentRef::parse("1-a-b-c").is_none());
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
                .collect()
        };
        assert_eq!(
            parse_correlation("YQ==:Yg==,Yw:ZA"),
            pairs(&[("a", "b"), ("c", "d")])
        );
        assert!(parse_correlation("YQ:Yg,YQ:Yg,YQ:Yg,YQ:Yg").is_empty());
    }

    #[test]
    fn schema_and_attr() {
        let r = crate::PluginRegistry::builtin();
        assert!(r.check(NAME, &json!({})).is_ok());
        assert_eq!(
            r.check(NAME, &json!({"sample_ratio": 0})).unwrap_err(),
            "failed to check the configuration of plugin skywalking err: property \"sample_ratio\" validation failed: expected 0 to be at least 1e-05"
        );
        let info = r.get(NAME).unwrap();
        assert_eq!(info.priority, 12010);
        assert_eq!(info.schema["properties"]["sample_ratio"]["default"], 1);
        let s = Settings::from_attr(None).unwrap();
        assert_eq!(s.endpoint, "http://127.0.0.1:12800");
        assert_eq!(s.interval, Duration::from_secs(3));
        assert!(Settings::from_attr(Some(&json!({"report_interval": "x"}))).is_err());
        let s = Settings::from_attr(Some(&json!({"service_instance_name": "$hostname"}))).unwrap();
        assert_eq!(s.instance, crate::log::log_entry::hostname());
    }
}
