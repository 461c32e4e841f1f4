//! The log entry of a finished request, as APISIX's `log-util.lua` builds it for its loggers:
//! the default ("full") entry, or the conf's `log_format` (else the plugin metadata's), with
//! `log_format_extra`, `include_req_body(_expr)`, `include_resp_body(_expr)` and the body
//! limits.
//!
//! What an entry reads is fixed when the conf compiles ([`LogEntryConf::needs`]): the default
//! entry asks for the request and response headers and a few variables, a `log_format` for
//! just its `$variables`, and bodies only when they may be logged, so a route without a logger
//! captures nothing.

use std::borrow::Cow;
use std::collections::BTreeSet;

use ferrisix_config::vars::compile_vars;
use ferrisix_plugin_api::clock::CivilTime;
use ferrisix_plugin_api::{LogCtx, LogNeeds, VarNames};
use ferrisix_router::{Expr, VarSource};
use http::HeaderMap;
use serde_json::{json, Map, Value};

/// log-util's `MAX_REQ_BODY` and `MAX_RESP_BODY`: 512 KiB.
pub const MAX_BODY: usize = 524_288;
/// log-util's `MAX_LOG_FORMAT_DEPTH`.
const MAX_LOG_FORMAT_DEPTH: usize = 5;

/// The properties every logger's schema shares (`log_format`, the bodies and their limits).
pub fn entry_properties() -> Map<String, Value> {
    let expr = json!({"type": "array", "minItems": 1, "items": {"type": "array"}});
    let Value::Object(m) = json!({
        "log_format": {"type": "object"},
        "log_format_extra": {"type": "object"},
        "include_req_body": {"type": "boolean", "default": false},
        "include_req_body_expr": expr,
        "include_resp_body": {"type": "boolean", "default": false},
        "include_resp_body_expr": expr,
        "max_req_body_bytes": {"type": "integer", "minimum": 1, "default": MAX_BODY},
        "max_resp_body_bytes": {"type": "integer", "minimum": 1, "default": MAX_BODY}
    }) else {
        unreachable!("an object literal")
    };
    m
}

/// The loggers' metadata schema (before the batch processor's `max_pending_entries`).
pub fn metadata_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "log_format_extra": {"type": "object"},
            "log_format": {"type": "object"}
        }
    })
}

/// file-logger's check of `match`: the whole list compiles as one expression (each item a
/// nested expression), as lua-resty-expr sees it.
pub fn check_match(conf: &Value) -> Result<(), String> {
    match conf.get("match") {
        Some(m) => compile_expr(m)
            .map(drop)
            .map_err(|err| format!("failed to validate the 'match' expression: {err}")),
        None => Ok(()),
    }
}

/// `log_util.check_log_schema`: the body expressions compile.
pub fn check(conf: &Value) -> Result<(), String> {
    for field in ["include_req_body_expr", "include_resp_body_expr"] {
        if let Some(e) = conf.get(field) {
            compile_expr(e)
                .map_err(|err| format!("failed to validate the '{field}' expression: {err}"))?;
        }
    }
    Ok(())
}

/// lua-resty-expr's own error, without the route `vars` prefix.
fn compile_expr(v: &Value) -> Result<Expr, String> {
    compile_vars(v).map_err(|e| {
        e.strip_prefix("failed to validate the 'vars' expression: ")
            .map_or(e.clone(), str::to_owned)
    })
}

/// One field of a `log_format`.
#[derive(Clone, Debug, PartialEq)]
enum Field {
    /// `"$name"`: the variable (absent when unset).
    Var(Box<str>),
    Literal(Value),
    Nested(Format),
}

/// A compiled `log_format` (`gen_log_format`), keys in the conf's order.
#[derive(Clone, Debug, PartialEq)]
struct Format(Vec<(String, Field)>);

impl Format {
    fn compile(format: &Map<String, Value>, depth: usize) -> Format {
        Format(
            format
                .iter()
                .map(|(k, v)| {
                    let field = match v {
                        Value::Object(nested) if depth >= MAX_LOG_FORMAT_DEPTH => {
                            tracing::warn!(
                                "log_format nesting exceeds max depth {MAX_LOG_FORMAT_DEPTH}, truncating"
                            );
                            let _ = nested;
                            Field::Nested(Format(Vec::new()))
                        }
                        Value::Object(nested) => Field::Nested(Format::compile(nested, depth + 1)),
                        Value::String(s) if s.starts_with('$') => Field::Var(s[1..].into()),
                        other => Field::Literal(other.clone()),
                    };
                    (k.clone(), field)
                })
                .collect(),
        )
    }

    fn var_names(&self, out: &mut BTreeSet<Box<str>>) {
        for (_, f) in &self.0 {
            match f {
                Field::Var(n) => {
                    out.insert(n.clone());
                }
                Field::Nested(n) => n.var_names(out),
                Field::Literal(_) => {}
            }
        }
    }

    fn build(&self, src: &EntrySource<'_>, max_req_body: usize) -> Map<String, Value> {
        let mut entry = Map::new();
        for (k, f) in &self.0 {
            let v = match f {
                Field::Var(name) if &**name == "request_body" => src
                    .ctx
                    .request_body
                    .as_ref()
                    .map(|b| body_text(&b[..b.len().min(max_req_body)])),
                Field::Var(name) => src.var(name).map(|v| Value::String(v.into_owned())),
                Field::Nested(n) => Some(Value::Object(n.build(src, max_req_body))),
                Field::Literal(v) => Some(v.clone()),
            };
            if let Some(v) = v {
                entry.insert(k.clone(), v);
            }
        }
        entry
    }
}

fn body_text(b: &[u8]) -> Value {
    Value::String(String::from_utf8_lossy(b).into_owned())
}

/// What entries are built from: the log context and the time of the log phase.
struct EntrySource<'a> {
    ctx: &'a LogCtx,
    now_ms: u64,
}

impl EntrySource<'_> {
    /// The variables nginx computes at log time, then the log context's.
    fn var(&self, name: &str) -> Option<Cow<'_, str>> {
        match name {
            "msec" => Some(Cow::Owned(format!(
                "{}.{:03}",
                self.now_ms / 1000,
                self.now_ms % 1000
            ))),
            "time_iso8601" => Some(Cow::Owned(iso8601(self.now_ms / 1000))),
            _ => {
                if let Some(h) = name.strip_prefix("sent_http_") {
                    let headers = self.ctx.response_headers.as_ref()?;
                    return header_joined(headers, &h.replace('_', "-")).map(Cow::Owned);
                }
                self.ctx.var(name)
            }
        }
    }
}

impl VarSource for EntrySource<'_> {
    fn var(&self, name: &str) -> Option<Cow<'_, str>> {
        EntrySource::var(self, name)
    }
}

/// nginx's `$time_iso8601` in UTC (`2024-01-02T03:04:05+00:00`).
fn iso8601(secs: u64) -> String {
    CivilTime::from_unix_secs(secs).iso8601().to_string()
}

fn header_joined(headers: &HeaderMap, name: &str) -> Option<String> {
    let mut values = headers.get_all(name).iter().filter_map(|v| v.to_str().ok());
    let first = values.next()?;
    let mut out = first.to_owned();
    for v in values {
        out.push_str(", ");
        out.push_str(v);
    }
    Some(out)
}

/// `ngx.req.get_headers()` / `ngx.resp.get_headers()`: lower-cased names, a list for a
/// repeated header.
fn headers_object(headers: &HeaderMap) -> Value {
    let mut m = Map::new();
    for name in headers.keys() {
        let values: Vec<Value> = headers
            .get_all(name)
            .iter()
            .map(|v| Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect();
        let v = if values.len() == 1 {
            values.into_iter().next().unwrap_or(Value::Null)
        } else {
            Value::Array(values)
        };
        m.insert(name.as_str().to_owned(), v);
    }
    Value::Object(m)
}

/// `ngx.req.get_uri_args()`: decoded values, `true` for an argument without `=`, a list for
/// a repeated one.
fn query_object(query: Option<&str>) -> Value {
    let mut m = Map::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = match pair.split_once('=') {
            Some((k, v)) => (k, Value::String(decode(v))),
            None => (pair, Value::Bool(true)),
        };
        let k = decode(k);
        if k.is_empty() {
            continue;
        }
        match m.get_mut(&k) {
            None => {
                m.insert(k, v);
            }
            Some(Value::Array(list)) => list.push(v),
            Some(prev) => {
                let first = prev.take();
                *prev = Value::Array(vec![first, v]);
            }
        }
    }
    Value::Object(m)
}

fn decode(s: &str) -> String {
    let s = s.replace('+', " ");
    percent_decode(&s)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Variables the default entry reads.
const FULL_LOG_VARS: &[&str] = &[
    "scheme",
    "host",
    "server_port",
    "request_uri",
    "request_method",
    "remote_addr",
    "upstream_addr",
    "route_id",
    "service_id",
];

/// Variables the log context computes itself (no capture needed).
const LOG_CTX_VARS: &[&str] = &[
    "status",
    "request_time",
    "upstream_response_time",
    "request_length",
    "bytes_sent",
    "balancer_ip",
    "msec",
    "time_iso8601",
    "request_body",
];

/// How one logger conf builds its entries.
#[derive(Clone, Debug)]
pub struct LogEntryConf {
    /// The conf's `log_format`, else the metadata's (when not empty); `None`: the default entry.
    format: Option<Format>,
    /// `log_format_extra` (the conf's, else the metadata's) for the default entry.
    extra: Option<Format>,
    include_req_body: bool,
    req_body_expr: Option<Expr>,
    include_resp_body: bool,
    resp_body_expr: Option<Expr>,
    max_req_body_bytes: usize,
    max_resp_body_bytes: usize,
    /// `match`: log only requests one of these expressions accepts (`None`: every request).
    matches: Option<Vec<Expr>>,
    hostname: String,
    needs: LogNeeds,
}

fn expr_vars(e: &Expr, out: &mut BTreeSet<Box<str>>) {
    match e {
        Expr::And(l) | Expr::Or(l) => l.iter().for_each(|e| expr_vars(e, out)),
        Expr::Not(e) => expr_vars(e, out),
        Expr::Compare(c) => {
            out.insert(c.var().into());
        }
    }
}

/// The machine's name (`core.utils.gethostname`).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

impl LogEntryConf {
    /// From a logger's conf (defaults filled in) and its `plugin_metadata`.
    pub fn compile(conf: &Map<String, Value>, metadata: Option<&Value>) -> Result<Self, String> {
        let meta_obj = |k: &str| {
            metadata
                .and_then(|m| m.get(k))
                .and_then(Value::as_object)
                .filter(|m| !m.is_empty())
        };
        let format = conf
            .get("log_format")
            .and_then(Value::as_object)
            .or_else(|| meta_obj("log_format"))
            .map(|f| Format::compile(f, 1));
        let extra = match conf.get("log_format_extra") {
            Some(v) => v.as_object().filter(|m| !m.is_empty()),
            None => meta_obj("log_format_extra"),
        }
        .map(|f| Format::compile(f, 1));
        let expr = |k: &str| conf.get(k).map(compile_expr).transpose();
        let limit = |k: &str| {
            conf.get(k)
                .and_then(Value::as_u64)
                .map_or(MAX_BODY, |n| n as usize)
        };
        let flag = |k: &str| conf.get(k).and_then(Value::as_bool).unwrap_or(false);
        let matches = match conf.get("match") {
            None => None,
            Some(list) => Some(
                list.as_array()
                    .into_iter()
                    .flatten()
                    .map(|e| {
                        compile_expr(e).map_err(|err| {
                            format!("failed to validate the 'match' expression: {err}")
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        let mut entry = LogEntryConf {
            format,
            extra,
            include_req_body: flag("include_req_body"),
            req_body_expr: expr("include_req_body_expr")?,
            include_resp_body: flag("include_resp_body"),
            resp_body_expr: expr("include_resp_body_expr")?,
            max_req_body_bytes: limit("max_req_body_bytes"),
            max_resp_body_bytes: limit("max_resp_body_bytes"),
            matches,
            hostname: hostname(),
            needs: LogNeeds::default(),
        };
        entry.needs = entry.compute_needs();
        Ok(entry)
    }

    fn compute_needs(&self) -> LogNeeds {
        let mut vars = BTreeSet::new();
        let mut needs = LogNeeds::default();
        vars.insert("route_id".into());
        vars.insert("service_id".into());
        for e in self.matches.iter().flatten() {
            expr_vars(e, &mut vars);
        }
        match &self.format {
            Some(f) => {
                f.var_names(&mut vars);
                if vars.contains("request_body") {
                    needs.request_body = Some(self.max_req_body_bytes);
                }
                if vars.iter().any(|v| v.starts_with("sent_http_")) {
                    needs.response_headers = true;
                }
            }
            None => {
                vars.extend(FULL_LOG_VARS.iter().map(|v| Box::<str>::from(*v)));
                if let Some(x) = &self.extra {
                    x.var_names(&mut vars);
                }
                needs.request_headers = true;
                needs.response_headers = true;
                if self.include_req_body {
                    needs.request_body = Some(self.max_req_body_bytes);
                    if let Some(e) = &self.req_body_expr {
                        expr_vars(e, &mut vars);
                    }
                }
                if self.include_resp_body {
                    needs.response_body = Some(self.max_resp_body_bytes);
                    if let Some(e) = &self.resp_body_expr {
                        expr_vars(e, &mut vars);
                    }
                }
            }
        }
        let names: Vec<Box<str>> = vars
            .into_iter()
            .filter(|v| !LOG_CTX_VARS.contains(&&**v) && !v.starts_with("sent_http_"))
            .collect();
        needs.vars = Some(VarNames::from(names));
        needs
    }

    /// What the log phase must capture for these entries.
    pub fn needs(&self) -> LogNeeds {
        self.needs.clone()
    }

    /// Whether entries are the conf's `log_format` (APISIX's `customized`).
    pub fn customized(&self) -> bool {
        self.format.is_some()
    }

    /// Whether the request is logged at all: `match` absent, or one of its expressions
    /// accepts the request (log-util's `is_match`).
    pub fn matches(&self, ctx: &LogCtx, now_ms: u64) -> bool {
        let Some(list) = &self.matches else {
            return true;
        };
        let src = EntrySource { ctx, now_ms };
        list.iter().any(|e| e.eval(&src as &dyn VarSource))
    }

    /// The entry of one request (`get_log_entry`); `now_ms` is the wall clock now.
    pub fn build(&self, ctx: &LogCtx, now_ms: u64) -> Map<String, Value> {
        let (mut entry, extra) = self.build_parts(ctx, now_ms);
        for (k, v) in extra.into_iter().flatten() {
            entry.entry(k).or_insert(v);
        }
        entry
    }

    /// The entry and, apart, the `log_format_extra` fields of a default entry (`None` for a
    /// `log_format` entry), as `get_log_entry` returns them: splunk-hec-logging puts the
    /// extra fields into its own event rather than the entry.
    pub fn build_parts(
        &self,
        ctx: &LogCtx,
        now_ms: u64,
    ) -> (Map<String, Value>, Option<Map<String, Value>>) {
        let src = EntrySource { ctx, now_ms };
        match &self.format {
            Some(f) => {
                let mut entry = f.build(&src, self.max_req_body_bytes);
                if let Some(route_id) = ctx.vars.get("route_id") {
                    if let Some(s) = ctx.vars.get("service_id") {
                        entry.insert("service_id".into(), Value::String(s.into()));
                    }
                    entry.insert("route_id".into(), Value::String(route_id.into()));
                }
                (entry, None)
            }
            None => (
                self.full_log(&src),
                self.extra
                    .as_ref()
                    .map(|x| x.build(&src, self.max_req_body_bytes)),
            ),
        }
    }

    /// `get_full_log`.
    fn full_log(&self, src: &EntrySource<'_>) -> Map<String, Value> {
        let ctx = src.ctx;
        let var = |n: &str| ctx.vars.get(n).unwrap_or("");
        let request_uri = var("request_uri");
        let url = format!(
            "{}://{}:{}{}",
            var("scheme"),
            var("host"),
            var("server_port"),
            request_uri
        );
        let (service_id, route_id) = match ctx.vars.get("route_id") {
            Some(r) => (var("service_id").to_owned(), Some(r.to_owned())),
            None => (var("host").to_owned(), None),
        };
        let latency = ctx.request_time.as_secs_f64() * 1000.0;
        let upstream_latency = ctx
            .upstream_time
            // nginx's $upstream_response_time has millisecond precision.
            .map(|t| t.as_millis() as f64);
        let apisix_latency = match upstream_latency {
            Some(u) => (latency - u).max(0.0),
            None => latency,
        };
        let start_time = src
            .now_ms
            .saturating_sub(ctx.request_time.as_millis() as u64);
        let query = request_uri.split_once('?').map(|(_, q)| q);
        let mut request = json!({
            "url": url,
            "uri": request_uri,
            "method": var("request_method"),
            "headers": ctx.request_headers.as_ref().map_or(json!({}), headers_object),
            "querystring": query_object(query),
            "size": ctx.request_length,
        });
        let mut response = json!({
            "status": ctx.status,
            "headers": ctx.response_headers.as_ref().map_or(json!({}), headers_object),
            "size": ctx.bytes_sent,
        });
        if self.include_resp_body
            && self
                .resp_body_expr
                .as_ref()
                .is_none_or(|e| e.eval(src as &dyn VarSource))
        {
            if let Some(b) = &ctx.response_body {
                response["body"] = body_text(&b[..b.len().min(self.max_resp_body_bytes)]);
            }
        }
        if self.include_req_body
            && self
                .req_body_expr
                .as_ref()
                .is_none_or(|e| e.eval(src as &dyn VarSource))
        {
            if let Some(b) = &ctx.request_body {
                request["body"] = body_text(&b[..b.len().min(self.max_req_body_bytes)]);
            }
        }
        let mut entry = Map::new();
        entry.insert("request".into(), request);
        entry.insert("response".into(), response);
        entry.insert(
            "server".into(),
            json!({"hostname": self.hostname, "version": env!("CARGO_PKG_VERSION")}),
        );
        if let Some(u) = ctx.vars.get("upstream_addr") {
            entry.insert("upstream".into(), Value::String(u.into()));
        }
        entry.insert("service_id".into(), Value::String(service_id));
        if let Some(r) = route_id {
            entry.insert("route_id".into(), Value::String(r));
        }
        if let Some(c) = &ctx.consumer {
            entry.insert("consumer".into(), json!({"username": c.username}));
        }
        if let Some(ip) = ctx.vars.get("remote_addr") {
            entry.insert("client_ip".into(), Value::String(ip.into()));
        }
        entry.insert("start_time".into(), json!(start_time));
        entry.insert("latency".into(), json!(latency));
        if let Some(u) = upstream_latency {
            entry.insert("upstream_latency".into(), json!(u));
        }
        entry.insert("apisix_latency".into(), json!(apisix_latency));
        // ai-proxy's `logging.summaries` and `logging.payloads`.
        if let Some(record) = ctx.value::<std::sync::Arc<crate::support::ai::LlmRecord>>() {
            for (k, v) in record.log_fields() {
                entry.insert(k.into(), v);
            }
        }
        entry
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use ferrisix_plugin_api::LogVars;
    use http::HeaderValue;

    use super::*;

    struct Vars(Vec<(&'static str, &'static str)>);

    impl VarSource for Vars {
        fn var(&self, name: &str) -> Option<Cow<'_, str>> {
            self.0
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| Cow::Borrowed(*v))
        }
    }

    fn ctx_for(conf: &LogEntryConf, vars: Vec<(&'static str, &'static str)>) -> LogCtx {
        let needs = conf.needs();
        let mut req_headers = HeaderMap::new();
        req_headers.insert("host", HeaderValue::from_static("log.test"));
        req_headers.append("x-a", HeaderValue::from_static("1"));
        req_headers.append("x-a", HeaderValue::from_static("2"));
        let mut resp_headers = HeaderMap::new();
        resp_headers.insert("content-type", HeaderValue::from_static("text/plain"));
        LogCtx {
            status: 200,
            request_length: 80,
            bytes_sent: 120,
            request_time: Duration::from_millis(12),
            upstream_time: Some(Duration::from_millis(10)),
            vars: LogVars::capture(needs.vars.clone().unwrap(), &Vars(vars)),
            request_headers: needs.request_headers.then_some(req_headers),
            response_headers: needs.response_headers.then_some(resp_headers),
            request_body: needs.request_body.map(|_| Bytes::from("abcdefgh")),
            response_body: needs.response_body.map(|_| Bytes::from("resp")),
            ..Default::default()
        }
    }

    fn std_vars() -> Vec<(&'static str, &'static str)> {
        vec![
            ("scheme", "http"),
            ("host", "log.test"),
            ("server_port", "9080"),
            ("request_uri", "/a?x=1&y=%41+b&flag&x=2"),
            ("request_method", "POST"),
            ("remote_addr", "10.0.0.1"),
            ("upstream_addr", "127.0.0.1:1980"),
            ("route_id", "r1"),
            ("uri", "/a"),
            ("arg_debug", "1"),
        ]
    }

    #[test]
    fn default_entry_fields_and_shapes() {
        let conf = LogEntryConf::compile(&Map::new(), None).unwrap();
        let needs = conf.needs();
        assert!(needs.request_headers && needs.response_headers);
        assert_eq!((needs.request_body, needs.response_body), (None, None));
        let ctx = ctx_for(&conf, std_vars());
        let e = Value::Object(conf.build(&ctx, 1_700_000_000_500));
        assert_eq!(
            e["request"]["url"],
            "http://log.test:9080/a?x=1&y=%41+b&flag&x=2"
        );
        assert_eq!(e["request"]["uri"], "/a?x=1&y=%41+b&flag&x=2");
        assert_eq!(e["request"]["method"], "POST");
        assert_eq!(
            e["request"]["querystring"],
            json!({"x": ["1", "2"], "y": "A b", "flag": true})
        );
        assert_eq!(
            e["request"]["headers"],
            json!({"host": "log.test", "x-a": ["1", "2"]})
        );
        assert_eq!(e["request"]["size"], 80);
        assert_eq!(
            e["response"],
            json!({"status": 200, "headers": {"content-type": "text/plain"}, "size": 120})
        );
        assert_eq!(e["upstream"], "127.0.0.1:1980");
        assert_eq!(e["route_id"], "r1");
        assert_eq!(e["service_id"], "");
        assert_eq!(e["client_ip"], "10.0.0.1");
        assert_eq!(e["start_time"], 1_700_000_000_488u64);
        assert_eq!(e["latency"], 12.0);
        assert_eq!(e["upstream_latency"], 10.0);
        assert_eq!(e["apisix_latency"], 2.0);
        assert!(e.get("consumer").is_none());
        assert!(e["server"]["hostname"].as_str().is_some());
        // No route: the service is the host, no route_id.
        let ctx = ctx_for(&conf, vec![("host", "h.test")]);
        let e = conf.build(&ctx, 0);
        assert_eq!(e["service_id"], "h.test");
        assert!(!e.contains_key("route_id"));
    }

    #[test]
    fn bodies_with_limits_and_exprs() {
        let conf = json!({"include_req_body": true, "max_req_body_bytes": 5,
            "include_resp_body": true, "include_resp_body_expr": [["arg_debug", "==", "1"]]});
        let conf = LogEntryConf::compile(conf.as_object().unwrap(), None).unwrap();
        assert_eq!(conf.needs().request_body, Some(5));
        assert_eq!(conf.needs().response_body, Some(MAX_BODY));
        assert!(conf
            .needs()
            .vars
            .unwrap()
            .iter()
            .any(|v| &**v == "arg_debug"));
        let e = conf.build(&ctx_for(&conf, std_vars()), 0);
        assert_eq!(e["request"]["body"], "abcde");
        assert_eq!(e["response"]["body"], "resp");
        let e = conf.build(&ctx_for(&conf, vec![("route_id", "r")]), 0);
        assert!(e["response"].get("body").is_none());
        let conf =
            json!({"include_req_body": true, "include_req_body_expr": [["arg_x", "==", "9"]]});
        let conf = LogEntryConf::compile(conf.as_object().unwrap(), None).unwrap();
        let e = conf.build(&ctx_for(&conf, std_vars()), 0);
        assert!(e["request"].get("body").is_none());
    }

    #[test]
    fn log_format_from_conf_or_metadata() {
        let meta = json!({"log_format": {"host": "$host", "tag": "meta", "n": 1}});
        let conf = LogEntryConf::compile(&Map::new(), Some(&meta)).unwrap();
        assert!(conf.customized());
        let needs = conf.needs();
        assert!(!needs.request_headers && !needs.response_headers);
        let e = conf.build(&ctx_for(&conf, std_vars()), 0);
        assert_eq!(
            Value::Object(e),
            json!({"host": "log.test", "tag": "meta", "n": 1, "route_id": "r1"})
        );
        // The conf's wins; nested formats, unset variables left out, log-time variables.
        let own = json!({"log_format": {"a": {"b": "$uri", "c": "$nope"}, "s": "$status",
            "body": "$request_body", "t": "$time_iso8601", "ct": "$sent_http_content_type"}});
        let conf = LogEntryConf::compile(own.as_object().unwrap(), Some(&meta)).unwrap();
        assert_eq!(conf.needs().request_body, Some(MAX_BODY));
        let e = conf.build(&ctx_for(&conf, std_vars()), 1_704_164_645_000);
        assert_eq!(e["a"], json!({"b": "/a"}));
        assert_eq!(e["s"], "200");
        assert_eq!(e["body"], "abcdefgh");
        assert_eq!(e["t"], "2024-01-02T03:04:05+00:00");
        assert_eq!(e["ct"], "text/plain");
        assert!(!e.contains_key("host"));
        // log_format_extra adds to the default entry without replacing its fields.
        let extra = json!({"log_format_extra": {"arg": "$arg_debug", "route_id": "x"}});
        let conf = LogEntryConf::compile(extra.as_object().unwrap(), None).unwrap();
        let e = conf.build(&ctx_for(&conf, std_vars()), 0);
        assert_eq!(
            (e["arg"].as_str(), e["route_id"].as_str()),
            (Some("1"), Some("r1"))
        );
    }

    #[test]
    fn expr_checks() {
        assert!(check(&json!({"include_req_body_expr": [["arg_a", "==", "1"]]})).is_ok());
        assert_eq!(
            check(&json!({"include_resp_body_expr": [["arg_a", "=", "1"]]})),
            Err(
                "failed to validate the 'include_resp_body_expr' expression: invalid operator '='"
                    .into()
            )
        );
    }
}
