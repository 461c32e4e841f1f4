//! opentelemetry (`apisix/plugins/opentelemetry.lua`): one SERVER span per request, started
//! in `rewrite` (priority 12009) and ended in the log phase, exported as OTLP/HTTP protobuf
//! to the collector (`POST http://<address>/v1/traces`).
//!
//! The incoming W3C `traceparent`/`tracestate` are extracted and the request's own context is
//! injected into the request sent upstream with the SDK's `TraceContextPropagator`; the
//! sampler (`always_on`, `always_off`, `trace_id_ratio` with `fraction`, `parent_base` with
//! a `root` sampler) is the SDK's. Attributes are APISIX's (`http.method`, `url.path`,
//! `apisix.route_id`, `http.route`, ... at the start; `apisix.response_source`,
//! `http.status_code` and the status for 5xx at the end), plus `additional_attributes`
//! (request variables) and `additional_header_prefix_attributes` (request headers, `x-*`
//! for a prefix).
//!
//! The collector, the batch span processor (`max_queue_size`, `batch_timeout`,
//! `inactive_timeout`, `max_export_batch_size`), the `resource` and `trace_id_source` come
//! from `plugin_metadata/opentelemetry` (APISIX 3.13+), else from
//! `plugin_attr.opentelemetry` (earlier 3.x). Spans go through ferrisix's batch processor on
//! the gateway's executor (no exporter thread of the SDK's), one per collector setting,
//! dropped and counted when the queue is full: a slow or absent collector never holds up a
//! request. `set_ngx_var` has no nginx variables to set and is accepted without effect.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_plugin_api::{
    CompileCtx, LogCtx, LogNeeds, Phases, Plugin, PluginCtx, PluginDef, ResponseSource, StateMap,
    Step, VarNames,
};
use ferrisix_router::VarSource;
use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{
    SpanContext, SpanKind, TraceContextExt, TraceFlags, TraceId, TraceState,
};
use opentelemetry::Context;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span, status, ResourceSpans, ScopeSpans, Span, Status,
};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SamplingDecision, ShouldSample};
use prost::Message;
use serde_json::{json, Map, Value};

use crate::log::batch_processor::{
    Backlogs, BatchConfig, BatchProcessor, BatchSink, SendError, SendFuture,
};
use crate::support::trace::{new_span_id, new_trace_id, now_ns, Collector};

pub const NAME: &str = "opentelemetry";

pub static DEF: PluginDef = PluginDef {
    metadata_schema: Some(metadata_schema),
    ..PluginDef::new(NAME, 12009, schema, compile)
};

fn attr_value_schema() -> Value {
    json!({"oneOf": [{"type": "boolean"}, {"type": "number"}, {"type": "string"}]})
}

fn metadata_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "trace_id_source": {
                "type": "string",
                "enum": ["x-request-id", "random"],
                "description": "the source of trace id",
                "default": "random"
            },
            "resource": {
                "type": "object",
                "description": "additional resource",
                "additionalProperties": attr_value_schema()
            },
            "collector": {
                "type": "object",
                "description": "opentelemetry collector",
                "properties": {
                    "address": {"type": "string", "description": "host:port", "default": "127.0.0.1:4318"},
                    "request_timeout": {"type": "integer", "description": "second uint", "default": 3},
                    "request_headers": {
                        "type": "object",
                        "description": "http headers",
                        "additionalProperties": attr_value_schema()
                    }
                },
                "default": {"address": "127.0.0.1:4318", "request_timeout": 3}
            },
            "batch_span_processor": {
                "type": "object",
                "description": "batch span processor",
                "properties": {
                    "drop_on_queue_full": {"type": "boolean"},
                    "max_queue_size": {"type": "integer"},
                    "batch_timeout": {"type": "number"},
                    "inactive_timeout": {"type": "number"},
                    "max_export_batch_size": {"type": "integer"}
                },
                "default": {}
            },
            "set_ngx_var": {"type": "boolean", "description": "set nginx variables", "default": false}
        }
    })
}

fn sampler_schema(names: &[&str], with_root: bool) -> Value {
    let mut options = json!({
        "type": "object",
        "properties": {
            "fraction": {"type": "number", "description": "trace_id_ratio fraction", "default": 0}
        },
        "default": {"fraction": 0}
    });
    if with_root {
        options["properties"]["root"] = {
            let mut root = sampler_schema(&["always_on", "always_off", "trace_id_ratio"], false);
            root["description"] = json!("parent_base root sampler");
            root["default"] = json!({"name": "always_off", "options": {"fraction": 0}});
            root
        };
        options["default"] = json!({"fraction": 0, "root": {"name": "always_off"}});
    }
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "enum": names, "description": "sampling strategy", "default": "always_off"},
            "options": options
        },
        "default": {"name": "always_off", "options": {"fraction": 0, "root": {"name": "always_off"}}}
    })
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "sampler": sampler_schema(&["always_on", "always_off", "trace_id_ratio", "parent_base"], true),
            "additional_attributes": {"type": "array", "items": {"type": "string", "minLength": 1}},
            "additional_header_prefix_attributes": {
                "type": "array",
                "items": {"type": "string", "minLength": 1}
            }
        }
    })
}

/// The exporter settings: the metadata's, else `plugin_attr.opentelemetry`'s, with APISIX's
/// (and opentelemetry-lua's batch span processor's) defaults.
#[derive(Clone, Debug, PartialEq)]
struct Exporter {
    address: String,
    timeout: Duration,
    headers: Vec<(HeaderName, HeaderValue)>,
    resource: Vec<KeyValue>,
    x_request_id: bool,
    max_queue_size: usize,
    batch_timeout: Duration,
    inactive_timeout: Duration,
    max_export_batch_size: usize,
}

fn secs(v: Option<&Value>, default: f64) -> Duration {
    Duration::try_from_secs_f64(v.and_then(Value::as_f64).unwrap_or(default).max(0.001))
        .unwrap_or(Duration::from_secs(5))
}

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn string_kv(key: &str, value: impl Into<String>) -> KeyValue {
    kv(key, any_value::Value::StringValue(value.into()))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "localhost".into())
}

impl Exporter {
    fn new(settings: &Value) -> Exporter {
        let collector = settings.get("collector");
        let bsp = settings.get("batch_span_processor");
        let text = |v: &Value| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let headers = collector
            .and_then(|c| c.get("request_headers"))
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| {
                Some((
                    HeaderName::from_bytes(k.as_bytes()).ok()?,
                    HeaderValue::from_str(&text(v)).ok()?,
                ))
            })
            .collect();
        let mut resource = vec![string_kv("hostname", hostname())];
        let configured = settings.get("resource").and_then(Value::as_object);
        if !configured.is_some_and(|r| r.contains_key("service.name")) {
            resource.push(string_kv("service.name", "APISIX"));
        }
        for (k, v) in configured.into_iter().flatten() {
            let v = match v {
                Value::String(s) => any_value::Value::StringValue(s.clone()),
                Value::Bool(b) => any_value::Value::BoolValue(*b),
                Value::Number(n) => any_value::Value::DoubleValue(n.as_f64().unwrap_or(0.0)),
                _ => continue,
            };
            resource.push(kv(k, v));
        }
        let int = |v: Option<&Value>, d: u64| v.and_then(Value::as_u64).unwrap_or(d).max(1);
        Exporter {
            address: collector
                .and_then(|c| c.get("address"))
                .and_then(Value::as_str)
                .unwrap_or("127.0.0.1:4318")
                .to_owned(),
            timeout: Duration::from_secs(int(collector.and_then(|c| c.get("request_timeout")), 3)),
            headers,
            resource,
            x_request_id: settings.get("trace_id_source").and_then(Value::as_str)
                == Some("x-request-id"),
            max_queue_size: int(bsp.and_then(|b| b.get("max_queue_size")), 2048) as usize,
            batch_timeout: secs(bsp.and_then(|b| b.get("batch_timeout")), 5.0),
            inactive_timeout: secs(bsp.and_then(|b| b.get("inactive_timeout")), 2.0),
            max_export_batch_size: int(bsp.and_then(|b| b.get("max_export_batch_size")), 256)
                as usize,
        }
    }

    /// The state key of this setting's processor.
    fn key(&self) -> String {
        format!("{self:?}")
    }
}

/// POSTs spans (each entry one encoded [`Span`]) to the collector.
struct OtlpSink {
    collector: Collector,
    resource: Vec<KeyValue>,
}

impl OtlpSink {
    async fn export(&self, entries: &[Bytes]) -> Result<(), SendError> {
        let spans: Vec<Span> = entries
            .iter()
            .filter_map(|e| Span::decode(e.as_ref()).ok())
            .collect();
        let req = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: self.resource.clone(),
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "opentelemetry-lua".into(),
                        ..Default::default()
                    }),
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        self.collector
            .post(
                Bytes::from(req.encode_to_vec()),
                "failed to export traces: ",
            )
            .await
    }
}

impl BatchSink for OtlpSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], _: usize) -> SendFuture<'a> {
        Box::pin(self.export(entries))
    }
}

/// The span of one request, from `rewrite` to the log phase.
struct RequestSpan {
    span: Span,
}

struct Opentelemetry {
    sampler: Sampler,
    additional: Vec<String>,
    header_prefixes: Vec<String>,
    exporter: Arc<Exporter>,
    processor: ferrisix_plugin_api::Lease<BatchProcessor>,
    needs: LogNeeds,
}

fn sampler_of(conf: &Value) -> Sampler {
    let fraction = conf
        .pointer("/options/fraction")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    match conf.get("name").and_then(Value::as_str) {
        Some("always_on") => Sampler::AlwaysOn,
        Some("trace_id_ratio") => Sampler::TraceIdRatioBased(fraction),
        Some("parent_base") => {
            let root = conf
                .pointer("/options/root")
                .map_or(Sampler::AlwaysOff, sampler_of);
            Sampler::ParentBased(Box::new(root))
        }
        _ => Sampler::AlwaysOff,
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let settings = match cx.metadata {
        Some(m) => m.clone(),
        None => cx
            .services
            .plugin_attr()
            .others
            .get(NAME)
            .cloned()
            .unwrap_or(Value::Object(Map::new())),
    };
    let exporter = Arc::new(Exporter::new(&settings));
    let list = |k: &str| -> Vec<String> {
        conf.get(k)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    let additional = list("additional_attributes");
    let header_prefixes = list("additional_header_prefix_attributes");
    let services = cx.services;
    let e = exporter.clone();
    let processor = services.shared::<StateMap<BatchProcessor>>().lease(
        &format!("opentelemetry:{}", exporter.key()),
        || {
            let sink = OtlpSink {
                collector: Collector {
                    url: format!("http://{}/v1/traces", e.address),
                    content_type: HeaderValue::from_static("application/x-protobuf"),
                    headers: e.headers.clone(),
                    timeout: e.timeout,
                    services: Arc::downgrade(services),
                },
                resource: e.resource.clone(),
            };
            let config = BatchConfig {
                name: "opentelemetry".into(),
                batch_max_size: e.max_export_batch_size,
                inactive_timeout: e.inactive_timeout,
                buffer_duration: e.batch_timeout,
                max_retry_count: 0,
                retry_delay: Duration::ZERO,
            };
            BatchProcessor::new(
                config,
                Arc::new(sink),
                services.shared::<Backlogs>().of(NAME),
                e.max_queue_size,
                services,
            )
        },
    );
    let needs = LogNeeds {
        vars: (!additional.is_empty()).then(|| {
            VarNames::from(
                additional
                    .iter()
                    .map(|a| a.as_str().into())
                    .collect::<Vec<_>>(),
            )
        }),
        request_headers: !header_prefixes.is_empty(),
        ..LogNeeds::default()
    };
    Ok(Arc::new(Opentelemetry {
        sampler: sampler_of(conf.get("sampler").unwrap_or(&Value::Null)),
        additional,
        header_prefixes,
        exporter,
        processor,
        needs,
    }))
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct HeadersMut<'a>(&'a mut HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(k, v);
        }
    }
}

/// opentelemetry.lua's `is_valid_trace_id`: 32 lower-case hex digits, not all zero.
fn trace_id_from_request_id(id: &str) -> Option<TraceId> {
    let id = id.to_ascii_lowercase();
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    TraceId::from_hex(&id)
        .ok()
        .filter(|t| *t != TraceId::INVALID)
}

impl Opentelemetry {
    fn start(&self, ctx: &mut PluginCtx<'_>) {
        let propagator = TraceContextPropagator::new();
        let parent = propagator.extract(&Headers(ctx.headers()));
        let parent_span = parent.span().span_context().clone();
        let has_parent = parent_span.is_valid();
        let trace_id = if has_parent {
            parent_span.trace_id()
        } else {
            self.exporter
                .x_request_id
                .then(|| {
                    ctx.header("x-request-id")
                        .and_then(trace_id_from_request_id)
                })
                .flatten()
                .unwrap_or_else(new_trace_id)
        };
        let span_id = new_span_id();
        let method = ctx.method().as_str().to_owned();
        let var = |n: &str| ctx.var(n).map(Cow::into_owned).unwrap_or_default();
        let mut attributes = vec![
            string_kv("net.host.name", var("host")),
            string_kv("http.method", method.clone()),
            string_kv("http.scheme", var("scheme")),
            string_kv("http.target", var("request_uri")),
            string_kv("http.user_agent", var("http_user_agent")),
            string_kv("http.request.method", method.clone()),
            string_kv("url.scheme", var("scheme")),
            string_kv("url.path", var("uri")),
            string_kv("user_agent.original", var("http_user_agent")),
        ];
        let mut name = method;
        if let Some(route) = ctx.route() {
            let path = ctx.matched_uri().to_owned();
            attributes.push(string_kv("apisix.route_id", &*route.id));
            attributes.push(string_kv(
                "apisix.route_name",
                route.name.clone().unwrap_or_default(),
            ));
            attributes.push(string_kv("http.route", path.clone()));
            name = format!("{name} {path}");
            if let Some(s) = &route.service_id {
                attributes.push(string_kv("apisix.service_id", s.clone()));
                attributes.push(string_kv(
                    "apisix.service_name",
                    route.service_name.clone().unwrap_or_default(),
                ));
            }
        }
        let otel_attrs: Vec<opentelemetry::KeyValue> = Vec::new();
        let decision = self.sampler.should_sample(
            has_parent.then_some(&parent),
            trace_id,
            &name,
            &SpanKind::Server,
            &otel_attrs,
            &[],
        );
        let sampled = decision.decision == SamplingDecision::RecordAndSample;
        let trace_state = if has_parent {
            parent_span.trace_state().clone()
        } else {
            TraceState::default()
        };
        let flags = if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let own = SpanContext::new(trace_id, span_id, flags, false, trace_state.clone());
        // The upstream continues this request's trace.
        propagator.inject_context(
            &Context::new().with_remote_span_context(own),
            &mut HeadersMut(ctx.headers_mut()),
        );
        if !sampled {
            return;
        }
        let span = Span {
            trace_id: trace_id.to_bytes().to_vec(),
            span_id: span_id.to_bytes().to_vec(),
            trace_state: trace_state.header(),
            parent_span_id: if has_parent {
                parent_span.span_id().to_bytes().to_vec()
            } else {
                Vec::new()
            },
            flags: u32::from(flags.to_u8()),
            name,
            kind: span::SpanKind::Server as i32,
            start_time_unix_nano: now_ns(),
            attributes,
            ..Default::default()
        };
        ctx.insert(RequestSpan { span });
    }

    fn finish(&self, ctx: &LogCtx) {
        let Some(RequestSpan { span }) = ctx.value::<RequestSpan>() else {
            return;
        };
        let mut span = span.clone();
        let source = match ctx.response_source {
            ResponseSource::Upstream => "upstream",
            ResponseSource::Nginx => "nginx",
            ResponseSource::Apisix => "apisix",
        };
        span.attributes
            .push(string_kv("apisix.response_source", source));
        if ctx.status >= 500 {
            span.status = Some(Status {
                message: format!("{source} error: {}", ctx.status),
                code: status::StatusCode::Error as i32,
            });
        }
        let code = i64::from(ctx.status);
        span.attributes
            .push(kv("http.status_code", any_value::Value::IntValue(code)));
        span.attributes.push(kv(
            "http.response.status_code",
            any_value::Value::IntValue(code),
        ));
        for key in &self.additional {
            if let Some(v) = ctx.var(key) {
                span.attributes.push(string_kv(key, v.into_owned()));
            }
        }
        if let Some(headers) = &ctx.request_headers {
            self.header_attributes(headers, &mut span.attributes);
        }
        span.end_time_unix_nano = now_ns().max(span.start_time_unix_nano);
        self.processor.push(Bytes::from(span.encode_to_vec()));
    }

    /// `inject_attributes` over the request headers: `x-*` takes every header with that
    /// prefix, another name just that header (repeated values joined with `, `).
    fn header_attributes(&self, headers: &HeaderMap, out: &mut Vec<KeyValue>) {
        let joined = |name: &HeaderName| {
            let values: Vec<String> = headers
                .get_all(name)
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .collect();
            values.join(", ")
        };
        for key in &self.header_prefixes {
            match key.strip_suffix('*').filter(|_| key.len() >= 2) {
                Some(prefix) => {
                    let prefix = prefix.to_ascii_lowercase();
                    let mut matched: HashMap<&str, String> = HashMap::new();
                    for name in headers.keys() {
                        if name.as_str().starts_with(&prefix) {
                            matched.insert(name.as_str(), joined(name));
                        }
                    }
                    let mut matched: Vec<_> = matched.into_iter().collect();
                    matched.sort();
                    for (k, v) in matched {
                        out.push(string_kv(k, v));
                    }
                }
                None => {
                    if let Ok(name) = HeaderName::from_bytes(key.to_ascii_lowercase().as_bytes()) {
                        if headers.contains_key(&name) {
                            out.push(string_kv(key, joined(&name)));
                        }
                    }
                }
            }
        }
    }
}

impl Plugin for Opentelemetry {
    fn phases(&self) -> Phases {
        Phases::REWRITE | Phases::LOG
    }

    fn log_needs(&self) -> LogNeeds {
        self.needs.clone()
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        self.start(ctx);
        Step::CONTINUE
    }

    fn log(&self, ctx: &LogCtx) {
        self.finish(ctx);
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::RouteInfo;
    use tokio::sync::mpsc;

    use super::*;
    use crate::log::sink::testing::{answer, http_server, next, Captured};
    use crate::testing::Compiler;

    fn run(conf: Value, req: &mut TestRequest) -> (Arc<dyn Plugin>, Option<Span>) {
        let c = Compiler::new();
        let meta = json!({"collector": {"address": "127.0.0.1:1"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "ot", Some(&meta))).unwrap();
        let mut ctx = req.ctx();
        assert!(matches!(p.rewrite(&mut ctx), Step::Done(_)));
        let span = ctx.get::<RequestSpan>().map(|s| s.span.clone());
        (p, span)
    }

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn continues_the_parent_and_injects_its_own_context() {
        let route = RouteInfo {
            id: "r1".into(),
            uris: vec!["/a/*".into()].into(),
            ..Default::default()
        };
        let mut req = TestRequest::get("/a/b?x=1")
            .header("traceparent", PARENT)
            .header("tracestate", "k=v")
            .header("user-agent", "curl")
            .route(route);
        req.state.set_matched(Some(0), None);
        let (_, span) = run(json!({"sampler": {"name": "always_on"}}), &mut req);
        let span = span.expect("sampled");
        assert_eq!(hex(&span.trace_id), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(hex(&span.parent_span_id), "b7ad6b7169203331");
        assert_eq!(span.name, "GET /a/*");
        assert_eq!(span.trace_state, "k=v");
        let attr = |k: &str| {
            span.attributes
                .iter()
                .find(|a| a.key == k)
                .and_then(|a| a.value.clone()?.value)
        };
        assert_eq!(
            attr("http.route"),
            Some(any_value::Value::StringValue("/a/*".into()))
        );
        assert_eq!(
            attr("http.target"),
            Some(any_value::Value::StringValue("/a/b?x=1".into()))
        );
        assert_eq!(
            attr("user_agent.original"),
            Some(any_value::Value::StringValue("curl".into()))
        );
        let sent = req.headers["traceparent"].to_str().unwrap().to_owned();
        assert_eq!(
            sent,
            format!(
                "00-0af7651916cd43dd8448eb211c80319c-{}-01",
                hex(&span.span_id)
            )
        );
        assert_eq!(req.headers["tracestate"], "k=v");
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn samplers() {
        // always_off (the default): no span, but the upstream still gets a context.
        let mut req = TestRequest::get("/");
        let (_, span) = run(json!({}), &mut req);
        assert!(span.is_none());
        assert!(req.headers["traceparent"]
            .to_str()
            .unwrap()
            .ends_with("-00"));
        // parent_base follows the parent's flag, else its root.
        let mut req = TestRequest::get("/").header("traceparent", PARENT);
        let (_, span) = run(json!({"sampler": {"name": "parent_base"}}), &mut req);
        assert!(span.is_some());
        let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
        let mut req = TestRequest::get("/").header("traceparent", unsampled);
        let conf =
            json!({"sampler": {"name": "parent_base", "options": {"root": {"name": "always_on"}}}});
        let (_, span) = run(conf.clone(), &mut req);
        assert!(span.is_none());
        let mut req = TestRequest::get("/");
        assert!(
            run(conf, &mut req).1.is_some(),
            "no parent: the root decides"
        );
        // trace_id_ratio: about the fraction.
        let sampled = (0..1000)
            .filter(|_| {
                let mut req = TestRequest::get("/");
                run(
                    json!({"sampler": {"name": "trace_id_ratio", "options": {"fraction": 0.3}}}),
                    &mut req,
                )
                .1
                .is_some()
            })
            .count();
        assert!((200..400).contains(&sampled), "{sampled}");
    }

    /// An OTLP/HTTP receiver: the loggers' test server, answering 200.
    async fn receiver() -> (String, mpsc::UnboundedReceiver<Captured>) {
        let (port, rx) = http_server(|_| answer(200, "")).await;
        (format!("127.0.0.1:{port}"), rx)
    }

    #[tokio::test]
    async fn spans_reach_an_otlp_receiver_with_parent_attributes_and_timing() {
        let (addr, mut rx) = receiver().await;
        let c = Compiler::new();
        let meta = json!({"collector": {"address": addr, "request_headers": {"x-tenant": "t1"}},
            "resource": {"service.name": "gw", "env": "test"},
            "batch_span_processor": {"max_export_batch_size": 1}});
        let conf = json!({"sampler": {"name": "always_on"}, "additional_attributes": ["arg_q"],
            "additional_header_prefix_attributes": ["x-my-*", "x-one"]});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "ot-2", Some(&meta))).unwrap();
        assert!(p.log_needs().request_headers);
        let mut req = TestRequest::get("/p?q=7")
            .header("traceparent", PARENT)
            .header("x-my-a", "1")
            .header("x-my-b", "2")
            .header("x-one", "3");
        let before = now_ns();
        assert!(matches!(p.rewrite(&mut req.ctx()), Step::Done(_)));
        tokio::time::sleep(Duration::from_millis(20)).await;
        struct V;
        impl VarSource for V {
            fn var(&self, name: &str) -> Option<Cow<'_, str>> {
                (name == "arg_q").then_some(Cow::Borrowed("7"))
            }
        }
        let log = LogCtx {
            status: 502,
            response_source: ResponseSource::Nginx,
            vars: ferrisix_plugin_api::LogVars::capture(p.log_needs().vars.unwrap(), &V),
            request_headers: Some(req.headers.clone()),
            values: req.state.take_values(),
            ..Default::default()
        };
        p.log(&log);
        let after = now_ns();
        let got = next(&mut rx).await;
        let head = got.lower();
        let export = ExportTraceServiceRequest::decode(&got.body[..]).unwrap();
        assert!(head.starts_with("post /v1/traces http/1.1"), "{head}");
        assert!(
            head.contains("content-type: application/x-protobuf"),
            "{head}"
        );
        assert!(head.contains("x-tenant: t1"), "{head}");
        let rs = &export.resource_spans[0];
        let res: Vec<&str> = rs
            .resource
            .as_ref()
            .unwrap()
            .attributes
            .iter()
            .map(|a| a.key.as_str())
            .collect();
        assert!(res.contains(&"hostname") && res.contains(&"service.name") && res.contains(&"env"));
        let span = &rs.scope_spans[0].spans[0];
        assert_eq!(hex(&span.trace_id), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(hex(&span.parent_span_id), "b7ad6b7169203331");
        assert_eq!(span.kind, span::SpanKind::Server as i32);
        assert!(before <= span.start_time_unix_nano && span.end_time_unix_nano <= after);
        assert!(span.end_time_unix_nano - span.start_time_unix_nano >= 20_000_000);
        let status = span.status.as_ref().unwrap();
        assert_eq!(
            (status.code, status.message.as_str()),
            (status::StatusCode::Error as i32, "nginx error: 502")
        );
        let attr = |k: &str| {
            span.attributes
                .iter()
                .find(|a| a.key == k)
                .and_then(|a| a.value.clone()?.value)
        };
        let s = |v: &str| Some(any_value::Value::StringValue(v.into()));
        assert_eq!(
            attr("http.status_code"),
            Some(any_value::Value::IntValue(502))
        );
        assert_eq!(attr("apisix.response_source"), s("nginx"));
        assert_eq!(attr("arg_q"), s("7"));
        assert_eq!(attr("x-my-a"), s("1"));
        assert_eq!(attr("x-my-b"), s("2"));
        assert_eq!(attr("x-one"), s("3"));
        assert_eq!(attr("url.path"), s("/p"));
    }

    #[test]
    fn schema_and_metadata() {
        let r = crate::PluginRegistry::builtin();
        assert!(r
            .check(NAME, &json!({"sampler": {"name": "always_on"}}))
            .is_ok());
        assert!(r
            .check(NAME, &json!({"sampler": {"name": "sometimes"}}))
            .is_err());
        assert!(r
            .check_metadata(
                NAME,
                &json!({"collector": {"address": "127.0.0.1:4318"},
                "resource": {"service.name": "gw", "n": 1}})
            )
            .is_ok());
        assert_eq!(r.get(NAME).unwrap().priority, 12009);
        let e = Exporter::new(&json!({"resource": {"service.name": "gw"}}));
        assert!(e.resource.iter().all(|kv| kv.key != "service.name"
            || kv.value
                == Some(AnyValue {
                    value: Some(any_value::Value::StringValue("gw".into()))
                })));
        assert_eq!(e.max_export_batch_size, 256);
    }
}
