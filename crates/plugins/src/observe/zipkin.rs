//! zipkin (`apisix/plugins/zipkin.lua` with its codec, sampler and reporter): B3 propagation
//! and Zipkin v2 JSON spans POSTed to `endpoint` in batches (`https` verified against the
//! gateway's trusted bundle, as lua-resty-http's default `ssl_verify`).
//!
//! The incoming context is the single `b3` header (`{trace}-{span}[-{sampled}[-{parent}]]`,
//! `0` alone for "do not sample"; one without a span id is refused with 400; it is not passed
//! upstream) or the `x-b3-traceid`/`x-b3-spanid`/`x-b3-parentspanid`/`x-b3-sampled` headers.
//! Ids that are not hex of the right length (16 or 32 for the trace, 16 for spans) are
//! ignored and a new trace starts. The sampling decision is the client's when it sent one
//! (`x-b3-sampled` `1`/`true`/`0`/`false`, `x-b3-flags: 1` or `b3` `d` for debug), else
//! `sample_ratio`. The upstream gets the context of the span that covers its call
//! (`apisix.proxy` when sampled, else `apisix.request`) as `x-b3-*` headers, and
//! `x-b3-sampled` says the decision either way.
//!
//! Sampled requests report, as APISIX's two layouts (`span_version`):
//! - 2 (default): `apisix.request` with children `apisix.proxy` (request start to the response
//!   head) and `apisix.response_span` (response head to the log phase);
//! - 1: `apisix.request` with children `apisix.rewrite`, `apisix.access`, `apisix.proxy` (end
//!   of access to the log phase) and its child `apisix.body_filter` (response head to the log
//!   phase).
//!
//! The request span carries the `SERVER` kind, the tags `component`, `http.method`,
//! `http.url`, `http.status_code`, `apisix.response_source`, and the client as its remote
//! endpoint; every span's local endpoint is `service_name` at `server_addr` (default the
//! connection's `$server_addr`) and `$server_port`. Spans go through ferrisix's batch
//! processor with the reporter's settings (`zipkin_report`: batches of 1000, 5 s inactive, 60 s
//! buffer, no retry), so a collector that is down or slow never holds a request up.
//!
//! Jaeger baggage (`uberctx-<key>` headers) of a valid incoming context is passed on
//! re-escaped, as the codec's injector writes it.
//!
//! Not built: `plugin_attr.zipkin.set_ngx_var` (the plugin API has no way for a plugin to set
//! request variables such as `$zipkin_trace_id`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_plugin_api::{
    CompileCtx, Exit, Lease, LogCtx, Phases, Plugin, PluginCtx, PluginDef, ResponseHead, StateMap,
    Step,
};
use ferrisix_router::VarSource;
use http::{HeaderName, HeaderValue, StatusCode};
use serde_json::{json, Map, Value};

use crate::log::batch_processor::{
    Backlogs, BatchConfig, BatchProcessor, BatchSink, SendFuture, DEFAULT_MAX_PENDING_ENTRIES,
};
use crate::log::logger::{encode_batch, Concat};
use crate::support::trace::{new_span_id, new_trace_id, now_ns, Collector};

pub const NAME: &str = "zipkin";

pub static DEF: PluginDef = PluginDef::new(NAME, 12011, schema, compile);

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "endpoint": {"type": "string"},
            "sample_ratio": {"type": "number", "minimum": 0.00001, "maximum": 1},
            "service_name": {
                "type": "string",
                "description": "service name for zipkin reporter",
                "default": "APISIX"
            },
            "server_addr": {
                "type": "string",
                "description": "default is $server_addr, you can specify your external ip address",
                "pattern": "^[0-9]{1,3}.[0-9]{1,3}.[0-9]{1,3}.[0-9]{1,3}$"
            },
            "span_version": {"enum": [1, 2], "default": 2}
        },
        "required": ["endpoint", "sample_ratio"]
    })
}

/// The reporter's processor settings (`zipkin/reporter.lua`'s `init_processor`).
fn report_config() -> BatchConfig {
    BatchConfig {
        name: "zipkin_report".into(),
        batch_max_size: 1000,
        inactive_timeout: Duration::from_secs(5),
        buffer_duration: Duration::from_secs(60),
        max_retry_count: 0,
        retry_delay: Duration::from_secs(1),
    }
}

/// POSTs batches of spans (each entry one encoded span) as a JSON array.
struct ZipkinSink(Collector);

impl BatchSink for ZipkinSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], batch_max_size: usize) -> SendFuture<'a> {
        Box::pin(self.0.post(
            encode_batch(entries, batch_max_size, Concat::Json),
            "failed: ",
        ))
    }
}

struct Zipkin {
    sample_ratio: f64,
    service_name: String,
    server_addr: Option<String>,
    v1: bool,
    processor: Lease<BatchProcessor>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let endpoint = conf
        .get("endpoint")
        .and_then(Value::as_str)
        .ok_or("endpoint is required")?
        .to_owned();
    let services = cx.services;
    let processor = services.shared::<StateMap<BatchProcessor>>().lease(
        &format!("{NAME}:{}", cx.state_key()),
        || {
            let sink = ZipkinSink(Collector {
                url: endpoint,
                content_type: HeaderValue::from_static("application/json"),
                headers: Vec::new(),
                // lua-resty-http's default: the socket's 60 s.
                timeout: Duration::from_secs(60),
                services: Arc::downgrade(services),
            });
            BatchProcessor::new(
                report_config(),
                Arc::new(sink),
                services.shared::<Backlogs>().of(NAME),
                DEFAULT_MAX_PENDING_ENTRIES,
                services,
            )
        },
    );
    Ok(Arc::new(Zipkin {
        sample_ratio: conf
            .get("sample_ratio")
            .and_then(Value::as_f64)
            .unwrap_or(0.0),
        service_name: conf
            .get("service_name")
            .and_then(Value::as_str)
            .unwrap_or("APISIX")
            .to_owned(),
        server_addr: conf
            .get("server_addr")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
        v1: conf.get("span_version").and_then(Value::as_u64) == Some(1),
        processor,
    }))
}

/// One span's ids (lower-case hex, as the reporter and the injector write them).
#[derive(Clone, Debug, PartialEq, Eq)]
struct SpanIds {
    id: String,
    parent: Option<String>,
}

/// What every reported span has: its name, its ids, and when it started and ended
/// (microseconds since the epoch).
#[derive(Clone, Copy)]
struct SpanParts<'a> {
    name: &'a str,
    ids: &'a SpanIds,
    start: u64,
    end: u64,
}

impl SpanIds {
    fn child_of(parent: &str) -> SpanIds {
        SpanIds {
            id: new_span_id().to_string(),
            parent: Some(parent.to_owned()),
        }
    }
}

/// The request's trace, from `rewrite` to the log phase.
#[derive(Clone, Debug)]
struct RequestTrace {
    trace_id: String,
    request: SpanIds,
    sampled: bool,
    /// The incoming context's baggage, key and unescaped value, passed on re-escaped.
    baggage: Vec<(String, Vec<u8>)>,
    /// Microseconds since the epoch at the start of `rewrite`.
    start_us: u64,
    /// v1: the end of the rewrite and access spans.
    rewrite_end_us: u64,
    access_end_us: u64,
    /// v2: from `rewrite`; v1: from `access`.
    proxy: Option<SpanIds>,
    /// The response head's time.
    header_us: Option<u64>,
    /// The request span's tags and remote endpoint, read in `rewrite`.
    method: String,
    url: String,
    remote: Value,
    local: Value,
}

/// The `b3` single header: `(trace, span, sampled, parent)`, or why it is refused.
type B3 = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

fn parse_b3(b3: &str) -> Result<B3, &'static str> {
    if b3 == "0" {
        return Ok((None, None, Some("0".into()), None));
    }
    // ngx_re.split(b3, "-", nil, nil, 4): at most four pieces, the last keeping any rest.
    let mut pieces = b3.splitn(4, '-').map(str::to_owned);
    let trace = pieces
        .next()
        .filter(|s| !s.is_empty())
        .ok_or("missing trace_id")?;
    let span = pieces.next().ok_or("missing span_id")?;
    Ok((Some(trace), Some(span), pieces.next(), pieces.next()))
}

fn is_hex(s: &str, lens: &[usize]) -> bool {
    lens.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `ngx.unescape_uri`: `%XX` decoded, anything else (a `%` without two hex digits too) kept.
fn unescape_uri(s: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' && i + 2 < s.len() {
            if let (Some(h), Some(l)) = (hex(s[i + 1]), hex(s[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(s[i]);
        i += 1;
    }
    out
}

/// `ngx.escape_uri` (a URI component): everything but letters, digits and `-._~` as `%XX`.
fn escape_uri(s: &[u8]) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn header_value(s: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(s).ok()
}

impl Zipkin {
    fn rewrite_phase(&self, ctx: &mut PluginCtx<'_>) -> Step<'static> {
        let header = |ctx: &PluginCtx<'_>, n: &str| ctx.header(n).map(str::to_owned);
        let mut ratio = None;
        if header(ctx, "x-b3-flags").as_deref() == Some("1") {
            ratio = Some(1.0);
        }
        let (trace_id, span_id, mut sampled, parent_id) = match header(ctx, "b3") {
            Some(b3) => {
                // Not passed upstream: the x-b3-* headers say the same.
                ctx.headers_mut().remove("b3");
                match parse_b3(&b3) {
                    Ok(parts) => parts,
                    Err(e) => {
                        tracing::error!("invalid b3 header: {b3}, ignored: {e}");
                        return Step::exit(Exit::status(StatusCode::BAD_REQUEST));
                    }
                }
            }
            None => (
                header(ctx, "x-b3-traceid"),
                header(ctx, "x-b3-spanid"),
                header(ctx, "x-b3-sampled"),
                header(ctx, "x-b3-parentspanid"),
            ),
        };
        if sampled.as_deref() == Some("d") {
            ctx.headers_mut()
                .insert("x-b3-flags", HeaderValue::from_static("1"));
            sampled = Some("1".into());
        }
        // The codec's extractor: any malformed id drops the whole incoming context.
        let valid = trace_id.as_deref().is_some_and(|t| is_hex(t, &[16, 32]))
            && parent_id.as_deref().is_none_or(|p| is_hex(p, &[16]))
            && span_id.as_deref().is_none_or(|s| is_hex(s, &[16]));
        // Jaeger's baggage (`uberctx-<key>`) comes with a valid incoming context only.
        let baggage: Vec<(String, Vec<u8>)> = if valid {
            ctx.headers()
                .iter()
                .filter_map(|(name, value)| {
                    let key = name.as_str().strip_prefix("uberctx-")?;
                    Some((key.to_owned(), unescape_uri(value.as_bytes())))
                })
                .collect()
        } else {
            Vec::new()
        };
        let (trace_id, request) = match trace_id.filter(|_| valid) {
            Some(trace) => {
                // A context without a span id gets one, as opentracing's span context does.
                let wire_span = span_id
                    .map(|s| s.to_ascii_lowercase())
                    .unwrap_or_else(|| new_span_id().to_string());
                (trace.to_ascii_lowercase(), SpanIds::child_of(&wire_span))
            }
            None => (
                new_trace_id().to_string(),
                SpanIds {
                    id: new_span_id().to_string(),
                    parent: None,
                },
            ),
        };
        match sampled.as_deref() {
            Some("1" | "true") => ratio = Some(1.0),
            Some("0" | "false") => ratio = Some(0.0),
            _ => {}
        }
        let sampled = rand::random::<f64>() < ratio.unwrap_or(self.sample_ratio);
        let start_us = now_ns() / 1000;
        let port = |name: &str| {
            ctx.var(name)
                .and_then(|p| p.parse::<u16>().ok())
                .map_or(Value::Null, Value::from)
        };
        let server_addr = self
            .server_addr
            .clone()
            .or_else(|| ctx.var("server_addr").map(|a| a.into_owned()));
        let mut trace = RequestTrace {
            trace_id,
            sampled,
            baggage,
            start_us,
            rewrite_end_us: start_us,
            access_end_us: start_us,
            proxy: None,
            header_us: None,
            method: ctx.method().as_str().to_owned(),
            url: ctx.request_uri().to_owned(),
            remote: json!({"ipv4": ctx.remote_addr().to_string(), "port": port("remote_port")}),
            local: json!({
                "serviceName": self.service_name,
                "ipv4": server_addr,
                "port": port("server_port"),
            }),
            request,
        };
        if sampled {
            if self.v1 {
                let rewrite = SpanIds::child_of(&trace.request.id);
                trace.rewrite_end_us = now_ns() / 1000;
                self.report(
                    &trace,
                    "apisix.rewrite",
                    &rewrite,
                    start_us,
                    trace.rewrite_end_us,
                );
            } else {
                trace.proxy = Some(SpanIds::child_of(&trace.request.id));
            }
        }
        ctx.insert(trace);
        Step::CONTINUE
    }

    fn access_phase(&self, ctx: &mut PluginCtx<'_>) {
        let Some(trace) = ctx.get_mut::<RequestTrace>() else {
            return;
        };
        if trace.sampled && self.v1 {
            let access = SpanIds::child_of(&trace.request.id);
            trace.access_end_us = now_ns() / 1000;
            trace.proxy = Some(SpanIds::child_of(&trace.request.id));
            let trace = trace.clone();
            self.report(
                &trace,
                "apisix.access",
                &access,
                trace.rewrite_end_us,
                trace.access_end_us,
            );
        }
        let Some(trace) = ctx.get::<RequestTrace>() else {
            return;
        };
        // The upstream's call is the proxy span's when sampled, else the request span's.
        let span = match (&trace.proxy, trace.sampled) {
            (Some(proxy), true) => proxy.clone(),
            _ => trace.request.clone(),
        };
        let trace_id = trace.trace_id.clone();
        let sampled = if trace.sampled { "1" } else { "0" };
        let baggage: Vec<(HeaderName, HeaderValue)> = trace
            .baggage
            .iter()
            .filter_map(|(k, v)| {
                Some((
                    HeaderName::from_bytes(format!("uberctx-{k}").as_bytes()).ok()?,
                    HeaderValue::from_str(&escape_uri(v)).ok()?,
                ))
            })
            .collect();
        let headers = ctx.headers_mut();
        for (name, value) in baggage {
            headers.insert(name, value);
        }
        let set = |headers: &mut http::HeaderMap, name: &'static str, v: Option<&str>| {
            let name = HeaderName::from_static(name);
            match v.and_then(header_value) {
                Some(v) => {
                    headers.insert(name, v);
                }
                None => {
                    headers.remove(name);
                }
            }
        };
        set(headers, "x-b3-traceid", Some(&trace_id));
        set(headers, "x-b3-parentspanid", span.parent.as_deref());
        set(headers, "x-b3-spanid", Some(&span.id));
        set(headers, "x-b3-sampled", Some(sampled));
    }

    fn header_phase(&self, ctx: &mut PluginCtx<'_>) {
        let Some(trace) = ctx.get_mut::<RequestTrace>() else {
            return;
        };
        if !trace.sampled {
            return;
        }
        let now = now_ns() / 1000;
        trace.header_us = Some(now);
        if !self.v1 {
            if let Some(proxy) = trace.proxy.clone() {
                let trace = trace.clone();
                self.report(&trace, "apisix.proxy", &proxy, trace.start_us, now);
            }
        }
    }

    fn log_phase(&self, ctx: &LogCtx) {
        let Some(trace) = ctx.value::<RequestTrace>() else {
            return;
        };
        if !trace.sampled {
            return;
        }
        let end = (now_ns() / 1000).max(trace.start_us);
        // ngx.req.start_time(): the request's arrival, before the gateway's own work.
        let request_start = end
            .saturating_sub(ctx.request_time.as_micros() as u64)
            .min(trace.start_us);
        if self.v1 {
            if let (Some(proxy), Some(header_us)) = (&trace.proxy, trace.header_us) {
                let body_filter = SpanIds::child_of(&proxy.id);
                self.report(trace, "apisix.body_filter", &body_filter, header_us, end);
            }
            if let Some(proxy) = &trace.proxy {
                self.report(trace, "apisix.proxy", proxy, trace.access_end_us, end);
            }
        } else if let Some(header_us) = trace.header_us {
            let response = SpanIds::child_of(&trace.request.id);
            self.report(trace, "apisix.response_span", &response, header_us, end);
        }
        let tags = json!({
            "component": "apisix",
            "http.method": trace.method,
            "http.url": trace.url,
            "http.status_code": ctx.status.to_string(),
            "apisix.response_source": ctx.response_source.as_str(),
        });
        let request = SpanParts {
            name: "apisix.request",
            ids: &trace.request,
            start: request_start,
            end,
        };
        let span = self.span(trace, &request, Some(tags), trace.remote.clone());
        self.processor.push(span);
    }

    /// Reports one of the request span's children (no tags, no kind, no remote endpoint).
    fn report(&self, trace: &RequestTrace, name: &str, ids: &SpanIds, start: u64, end: u64) {
        let parts = SpanParts {
            name,
            ids,
            start,
            end,
        };
        let span = self.span(trace, &parts, None, Value::Null);
        self.processor.push(span);
    }

    /// One span as the reporter encodes it (Zipkin v2 JSON); `tags` make it the server span.
    fn span(
        &self,
        trace: &RequestTrace,
        parts: &SpanParts<'_>,
        tags: Option<Value>,
        remote: Value,
    ) -> Bytes {
        let SpanParts {
            name,
            ids,
            start,
            end,
        } = *parts;
        let mut span = Map::new();
        span.insert("traceId".into(), json!(trace.trace_id));
        span.insert("name".into(), json!(name));
        if let Some(parent) = &ids.parent {
            span.insert("parentId".into(), json!(parent));
        }
        span.insert("id".into(), json!(ids.id));
        if tags.is_some() {
            span.insert("kind".into(), json!("SERVER"));
        }
        span.insert("timestamp".into(), json!(start));
        span.insert("duration".into(), json!(end.saturating_sub(start)));
        span.insert("localEndpoint".into(), trace.local.clone());
        span.insert("remoteEndpoint".into(), remote);
        span.insert("tags".into(), tags.unwrap_or_else(|| json!({})));
        Bytes::from(Value::Object(span).to_string())
    }
}

impl Plugin for Zipkin {
    fn phases(&self) -> Phases {
        Phases::REWRITE | Phases::ACCESS | Phases::HEADER_FILTER | Phases::LOG
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        self.rewrite_phase(ctx)
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        self.access_phase(ctx);
        Step::CONTINUE
    }

    fn header_filter(&self, ctx: &mut PluginCtx<'_>, _resp: &mut ResponseHead<'_>) {
        self.header_phase(ctx);
    }

    fn log(&self, ctx: &LogCtx) {
        self.log_phase(ctx);
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::{BodyEdits, ResponseSource};
    use http::HeaderMap;
    use tokio::sync::mpsc;

    use super::*;
    use crate::log::sink::testing::{answer, http_server, next, Captured};
    use crate::testing::Compiler;

    /// A Zipkin collector: the loggers' test server, answering 202.
    async fn collector() -> (String, mpsc::UnboundedReceiver<Captured>) {
        let (port, rx) = http_server(|_| answer(202, "")).await;
        (format!("http://127.0.0.1:{port}/api/v2/spans?x=1"), rx)
    }

    /// Runs a request through the plugin's phases; answers the upstream's request headers.
    fn run(p: &dyn Plugin, req: &mut TestRequest, status: u16) -> HeaderMap {
        let mut ctx = req.ctx();
        assert!(matches!(p.rewrite(&mut ctx), Step::Done(_)));
        assert!(matches!(p.access(&mut ctx), Step::Done(_)));
        let sent = ctx.headers().clone();
        std::thread::sleep(Duration::from_millis(5));
        let (mut code, mut headers, mut edits) =
            (StatusCode::OK, HeaderMap::new(), BodyEdits::default());
        p.header_filter(
            &mut ctx,
            &mut ResponseHead::new(&mut code, &mut headers, true, &mut edits),
        );
        std::thread::sleep(Duration::from_millis(5));
        p.log(&LogCtx {
            status,
            response_source: ResponseSource::Upstream,
            request_time: Duration::from_millis(12),
            values: req.state.take_values(),
            ..Default::default()
        });
        sent
    }

    fn compile(c: &Compiler, conf: &Value, owner: &str) -> Arc<dyn Plugin> {
        (DEF.compile)(&c.cx(NAME, conf, owner, None)).unwrap()
    }

    async fn spans(rx: &mut mpsc::UnboundedReceiver<Captured>) -> (String, Vec<Value>) {
        let got = next(rx).await;
        let body: Value = serde_json::from_slice(&got.body).unwrap();
        (got.lower(), body.as_array().unwrap().clone())
    }

    fn by_name<'a>(spans: &'a [Value], name: &str) -> &'a Value {
        spans
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no span {name} in {spans:?}"))
    }

    const TRACE: &str = "80f198ee56343ba864fe8b2a57d3eff7";
    const SPAN: &str = "e457b5a2e4d86bd1";

    #[tokio::test]
    async fn span_version_2_reports_request_proxy_and_response_spans() {
        let (endpoint, mut rx) = collector().await;
        let c = Compiler::new();
        let conf = json!({"endpoint": endpoint, "sample_ratio": 0.00001, "service_name": "gw"});
        let p = compile(&c, &conf, "zk-1");
        let mut req = TestRequest::get("/a?b=1")
            .header("x-b3-traceid", &TRACE.to_uppercase())
            .header("x-b3-spanid", SPAN)
            .header("x-b3-flags", "1");
        let before = now_ns() / 1000;
        let sent = run(&*p, &mut req, 200);
        let after = now_ns() / 1000;
        drop(p); // the processor flushes what it holds
        let (head, spans) = spans(&mut rx).await;
        assert!(
            head.starts_with("post /api/v2/spans?x=1 http/1.1"),
            "{head}"
        );
        assert!(head.contains("content-type: application/json"), "{head}");
        assert_eq!(spans.len(), 3, "{spans:?}");
        let (request, proxy, response) = (
            by_name(&spans, "apisix.request"),
            by_name(&spans, "apisix.proxy"),
            by_name(&spans, "apisix.response_span"),
        );
        for s in [request, proxy, response] {
            assert_eq!(
                s["traceId"], TRACE,
                "sampled by x-b3-flags: 1, the id lower-cased"
            );
            assert_eq!(
                s["localEndpoint"],
                json!({"serviceName": "gw", "ipv4": "127.0.0.1", "port": 9080})
            );
            assert_eq!(s["id"].as_str().unwrap().len(), 16);
        }
        assert_eq!(request["parentId"], SPAN);
        assert_eq!(proxy["parentId"], request["id"]);
        assert_eq!(response["parentId"], request["id"]);
        assert_eq!(request["kind"], "SERVER");
        assert!(proxy.get("kind").is_none());
        assert_eq!(
            request["remoteEndpoint"],
            json!({"ipv4": "127.0.0.1", "port": 40000})
        );
        assert_eq!(proxy["remoteEndpoint"], Value::Null);
        assert_eq!(
            request["tags"],
            json!({"component": "apisix", "http.method": "GET", "http.url": "/a?b=1",
                "http.status_code": "200", "apisix.response_source": "upstream"})
        );
        assert_eq!(proxy["tags"], json!({}));
        // The upstream continues from the proxy span.
        assert_eq!(sent["x-b3-traceid"], TRACE);
        assert_eq!(sent["x-b3-spanid"], proxy["id"].as_str().unwrap());
        assert_eq!(sent["x-b3-parentspanid"], request["id"].as_str().unwrap());
        assert_eq!(sent["x-b3-sampled"], "1");
        // Timing: the request from its arrival (request_time before the log phase) to the
        // log phase, the proxy span up to the response head, the response span after it.
        let ts = |s: &Value| s["timestamp"].as_u64().unwrap();
        let dur = |s: &Value| s["duration"].as_u64().unwrap();
        assert!(
            ts(request) <= ts(proxy) && ts(request) + 12_000 >= before,
            "{request}"
        );
        assert!(ts(proxy) >= before && ts(proxy) + dur(proxy) <= ts(response));
        assert!(dur(proxy) >= 5_000 && dur(response) >= 5_000);
        assert!(ts(response) + dur(response) <= after);
        assert_eq!(ts(request) + dur(request), ts(response) + dur(response));
    }

    #[tokio::test]
    async fn span_version_1_reports_rewrite_access_proxy_and_body_filter() {
        let (endpoint, mut rx) = collector().await;
        let c = Compiler::new();
        let conf = json!({"endpoint": endpoint, "sample_ratio": 1, "span_version": 1,
            "server_addr": "1.2.3.4"});
        let p = compile(&c, &conf, "zk-2");
        let mut req = TestRequest::get("/")
            .header("b3", &format!("{TRACE}-{SPAN}-d"))
            .header("uberctx-user", "a b%2fc");
        let sent = run(&*p, &mut req, 502);
        drop(p);
        let (_, spans) = spans(&mut rx).await;
        let names: Vec<&str> = spans.iter().map(|s| s["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "apisix.rewrite",
                "apisix.access",
                "apisix.body_filter",
                "apisix.proxy",
                "apisix.request"
            ],
            "reported as they finish"
        );
        let request = by_name(&spans, "apisix.request");
        let proxy = by_name(&spans, "apisix.proxy");
        assert_eq!(request["parentId"], SPAN);
        for n in ["apisix.rewrite", "apisix.access", "apisix.proxy"] {
            assert_eq!(by_name(&spans, n)["parentId"], request["id"], "{n}");
        }
        assert_eq!(
            by_name(&spans, "apisix.body_filter")["parentId"],
            proxy["id"]
        );
        assert_eq!(request["tags"]["http.status_code"], "502");
        assert_eq!(request["localEndpoint"]["ipv4"], "1.2.3.4");
        let end = |s: &Value| s["timestamp"].as_u64().unwrap() + s["duration"].as_u64().unwrap();
        assert_eq!(
            end(by_name(&spans, "apisix.rewrite")),
            by_name(&spans, "apisix.access")["timestamp"]
        );
        assert_eq!(end(by_name(&spans, "apisix.access")), proxy["timestamp"]);
        assert_eq!(sent["x-b3-spanid"], proxy["id"].as_str().unwrap());
        assert_eq!(sent["uberctx-user"], "a%20b%2Fc", "baggage re-escaped");
        // `b3` is not passed on; its debug flag is.
        assert!(sent.get("b3").is_none());
        assert_eq!(sent["x-b3-flags"], "1");
        assert_eq!(sent["x-b3-sampled"], "1");
    }

    #[tokio::test]
    async fn unsampled_requests_report_nothing_and_say_so_upstream() {
        let (endpoint, mut rx) = collector().await;
        let c = Compiler::new();
        let conf = json!({"endpoint": endpoint, "sample_ratio": 0.00001});
        let p = compile(&c, &conf, "zk-3");
        let mut req = TestRequest::get("/");
        let sent = run(&*p, &mut req, 200);
        assert_eq!(sent["x-b3-sampled"], "0");
        assert_eq!(sent["x-b3-traceid"].len(), 32);
        assert!(sent.get("x-b3-parentspanid").is_none(), "a new trace");
        // b3 "-0-": not sampled; the upstream gets the request span, child of the client's.
        let mut req =
            TestRequest::get("/").header("b3", &format!("{TRACE}-{SPAN}-0-05e3ac9a4f6e3b90"));
        let sent = run(&*p, &mut req, 200);
        assert_eq!(sent["x-b3-sampled"], "0");
        assert_eq!(sent["x-b3-traceid"], TRACE);
        assert_eq!(sent["x-b3-parentspanid"], SPAN);
        // An explicit x-b3-sampled: 0 wins over the debug flag, as in zipkin.lua.
        let mut req = TestRequest::get("/")
            .header("x-b3-flags", "1")
            .header("x-b3-sampled", "0");
        assert_eq!(run(&*p, &mut req, 200)["x-b3-sampled"], "0");
        // b3 "0" alone.
        let mut req = TestRequest::get("/").header("b3", "0");
        assert_eq!(run(&*p, &mut req, 200)["x-b3-sampled"], "0");
        // A malformed id starts a new trace.
        let mut req = TestRequest::get("/")
            .header("x-b3-traceid", "xyz")
            .header("x-b3-spanid", SPAN);
        let sent = run(&*p, &mut req, 200);
        assert_ne!(sent["x-b3-traceid"], "xyz");
        assert!(sent.get("x-b3-parentspanid").is_none());
        drop(p);
        assert!(tokio::time::timeout(Duration::from_millis(300), rx.recv())
            .await
            .is_err());
    }

    #[test]
    fn a_b3_header_without_span_id_is_refused() {
        let c = Compiler::new();
        let p = compile(
            &c,
            &json!({"endpoint": "http://127.0.0.1:1/", "sample_ratio": 1}),
            "zk-4",
        );
        for bad in [TRACE, ""] {
            let mut req = TestRequest::get("/").header("b3", bad);
            let mut ctx = req.ctx();
            let step = p.rewrite(&mut ctx);
            match step {
                Step::Done(ferrisix_plugin_api::Flow::Exit(e)) => assert_eq!(e.status, 400),
                other => panic!("{bad}: {other:?}"),
            }
        }
        assert_eq!(
            parse_b3(&format!("{TRACE}-{SPAN}")),
            Ok((Some(TRACE.into()), Some(SPAN.into()), None, None))
        );
        assert_eq!(parse_b3("0"), Ok((None, None, Some("0".into()), None)));
    }

    #[test]
    fn sample_ratio_is_honoured() {
        let c = Compiler::new();
        let p = compile(
            &c,
            &json!({"endpoint": "http://127.0.0.1:1/", "sample_ratio": 0.3}),
            "zk-5",
        );
        let sampled = (0..1000)
            .filter(|_| {
                let mut req = TestRequest::get("/");
                let mut ctx = req.ctx();
                let _ = p.rewrite(&mut ctx);
                ctx.get::<RequestTrace>().unwrap().sampled
            })
            .count();
        assert!((200..400).contains(&sampled), "{sampled}");
    }

    #[test]
    fn uri_escapes() {
        assert_eq!(unescape_uri(b"a%20b%2fc%zz%4"), b"a b/c%zz%4");
        assert_eq!(escape_uri("a b/ü-_.~".as_bytes()), "a%20b%2F%C3%BC-_.~");
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        let err = |c: Value| r.check(NAME, &c).unwrap_err();
        assert!(r
            .check(
                NAME,
                &json!({"endpoint": "http://127.0.0.1", "sample_ratio": 0.001})
            )
            .is_ok());
        assert_eq!(
            err(json!({"endpoint": "http://127.0.0.1", "sample_ratio": 2})),
            "failed to check the configuration of plugin zipkin err: property \"sample_ratio\" validation failed: expected 2 to be at most 1"
        );
        assert_eq!(
            err(json!({"endpoint": "http://127.0.0.1", "sample_ratio": 0.1, "server_addr": "badip"})),
            "failed to check the configuration of plugin zipkin err: property \"server_addr\" validation failed: failed to match pattern \"^[0-9]{1,3}.[0-9]{1,3}.[0-9]{1,3}.[0-9]{1,3}$\" with \"badip\""
        );
        assert!(
            err(json!({"endpoint": "http://127.0.0.1", "sample_ratio": 1, "span_version": 3}))
                .contains("span_version")
        );
        assert!(err(json!({"sample_ratio": 1})).contains("\"endpoint\" is required"));
        assert_eq!(r.get(NAME).unwrap().priority, 12011);
    }
}
