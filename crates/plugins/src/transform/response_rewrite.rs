//! response-rewrite (`apisix/plugins/response-rewrite.lua`): rewrites the answer when its
//! `vars` hold (evaluated on the response: `$status`, `$upstream_status`, `$sent_http_*`,
//! `$upstream_http_*` and every request variable): `status_code`, `body` (or `body_base64`),
//! `headers` (`add` as `"Name: value"`, `set`, `remove`, or the old flat form that sets; values
//! with `$var`s) and `filters` (regex substitutions over the body, `once` or `global`, with
//! `ngx.re` options).
//!
//! `filters` run on the streamed body: a gzip or brotli body is decoded first (and goes out
//! plain, as in APISIX), then each filter substitutes over a sliding window
//! (`support::stream_sub`). A pattern with a longest match carries only that many bytes from
//! read to read and finds what the whole body gives; one without a bound holds up to 16 MiB
//! of the body (exact on a body that fits), then falls back to windows of 8 MiB. So memory
//! stays bounded whatever the body's size. As APISIX, the body is cut after
//! `max_resp_body_size` bytes when filters apply.

use std::borrow::Cow;
use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use ferrisix_config::vars::compile_vars;
use ferrisix_plugin_api::{
    BodyChunk, BodyFilter, CheckCtx, CompileCtx, Phases, Plugin, PluginCtx, PluginDef, ResponseHead,
};
use ferrisix_router::{Expr, VarSource};
use http::{header, HeaderMap, HeaderName, StatusCode};
use serde_json::{json, Map, Value};

use crate::support::encoding::Decoder;
use crate::support::headers::{self, ValueTemplate};
use crate::support::pcre::{compile_bytes, BodyRegex, Replacement};
use crate::support::stream_sub::StreamSub;

pub const NAME: &str = "response-rewrite";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    ..PluginDef::new(NAME, 899, schema, compile)
};

/// What a filter whose pattern has no longest match holds of the body (`support::stream_sub`).
const UNBOUNDED_HOLD: usize = 16 << 20;

fn header_value_schema() -> Value {
    json!({"oneOf": [{"type": "string"}, {"type": "number"}]})
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "max_resp_body_size": {
                "type": "integer",
                "minimum": 1,
                "default": 67108864,
                "description": "maximum response body size in bytes buffered into memory when filters are applied; larger responses are truncated"
            },
            "headers": {
                "description": "new headers for response",
                "anyOf": [
                    {
                        "type": "object",
                        "minProperties": 1,
                        "patternProperties": {"^[^:]+$": header_value_schema()}
                    },
                    {
                        "properties": {
                            "add": {
                                "type": "array",
                                "minItems": 1,
                                "items": {"type": "string", "pattern": "^[^:]+:[^:]*[^/]$"}
                            },
                            "set": {
                                "type": "object",
                                "minProperties": 1,
                                "patternProperties": {"^[^:]+$": header_value_schema()}
                            },
                            "remove": {
                                "type": "array",
                                "minItems": 1,
                                "items": {"type": "string", "pattern": "^[^:]+$"}
                            }
                        }
                    }
                ]
            },
            "body": {"description": "new body for response", "type": "string"},
            "body_base64": {
                "description": "whether new body for response need base64 decode before return",
                "type": "boolean",
                "default": false
            },
            "status_code": {
                "description": "new status code for response",
                "type": "integer",
                "minimum": 200,
                "maximum": 598
            },
            "vars": {"type": "array"},
            "filters": {
                "description": "a group of filters that modify response bodyby replacing one specified string by another",
                "type": "array",
                "minItems": 1,
                "items": {
                    "description": "filter that modifies response body",
                    "type": "object",
                    "required": ["regex", "replace"],
                    "properties": {
                        "regex": {
                            "description": "match pattern on response body",
                            "type": "string",
                            "minLength": 1
                        },
                        "scope": {
                            "description": "regex substitution range",
                            "type": "string",
                            "enum": ["once", "global"],
                            "default": "once"
                        },
                        "replace": {"description": "regex substitution content", "type": "string"},
                        "options": {"description": "regex options", "type": "string", "default": "jo"}
                    }
                }
            }
        },
        "dependencies": {
            "body": {"not": {"required": ["filters"]}},
            "filters": {"not": {"required": ["body"]}}
        }
    })
}

fn is_new_headers_conf(h: &Map<String, Value>) -> bool {
    ["add", "set", "remove"]
        .iter()
        .any(|k| matches!(h.get(*k), Some(Value::Object(_) | Value::Array(_))))
}

fn decode_base64(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    let conf = cx.filled()?;
    if let Some(h) = conf.get("headers").and_then(Value::as_object) {
        if !is_new_headers_conf(h) {
            for (field, value) in h {
                if headers::value_text(value).is_none() {
                    return Err("invalid type as header value".into());
                }
                if field.is_empty() {
                    return Err("invalid field length in header".into());
                }
            }
        }
    }
    if conf["body_base64"].as_bool() == Some(true) {
        let body = conf.get("body").and_then(Value::as_str).unwrap_or("");
        if body.is_empty() || decode_base64(body).is_none() {
            return Err("invalid base64 content".into());
        }
    }
    if let Some(v) = conf.get("vars") {
        compile_vars(v).map_err(|e| format!("failed to validate the 'vars' expression: {e}"))?;
    }
    for f in conf
        .get("filters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let re = f["regex"].as_str().unwrap_or("");
        compile_bytes(re, f["options"].as_str().unwrap_or("jo"))
            .map_err(|e| format!("regex \"{re}\" validation failed: {e}"))?;
    }
    Ok(())
}

#[derive(Debug)]
struct Filter {
    regex: BodyRegex,
    replacement: Replacement,
    global: bool,
}

#[derive(Debug, Default)]
struct HeaderOps {
    add: Vec<(HeaderName, ValueTemplate)>,
    set: Vec<(HeaderName, ValueTemplate)>,
    remove: Vec<HeaderName>,
}

/// `create_header_operation`; `None` when an `add` item is no `Name: value` (APISIX then
/// applies no header operation at all).
fn header_ops(h: &Map<String, Value>) -> Option<HeaderOps> {
    let set_of = |m: &Map<String, Value>| -> Vec<(HeaderName, ValueTemplate)> {
        m.iter()
            .filter_map(|(k, v)| {
                Some((
                    headers::name(k, NAME)?,
                    ValueTemplate::new(&headers::value_text(v)?),
                ))
            })
            .collect()
    };
    if !is_new_headers_conf(h) {
        return Some(HeaderOps {
            set: set_of(h),
            ..Default::default()
        });
    }
    let mut ops = HeaderOps::default();
    for item in h.get("add").and_then(Value::as_array).into_iter().flatten() {
        let text = item.as_str()?;
        // `^([^:\s]+)\s*:\s*([^:]+)$`
        let (name, value) = text.split_once(':')?;
        let name = name.trim_end();
        if name.is_empty() || name.contains(char::is_whitespace) || value.contains(':') {
            return None;
        }
        let value = value.trim_start();
        if value.is_empty() {
            return None;
        }
        ops.add
            .push((headers::name(name, NAME)?, ValueTemplate::new(value)));
    }
    if let Some(set) = h.get("set").and_then(Value::as_object) {
        ops.set = set_of(set);
    }
    ops.remove = h
        .get("remove")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter_map(|f| headers::name(f, NAME))
        .collect();
    Some(ops)
}

#[derive(Debug)]
struct ResponseRewrite {
    vars: Option<Expr>,
    status: Option<StatusCode>,
    body: Option<Bytes>,
    headers: Option<HeaderOps>,
    filters: Arc<Vec<Filter>>,
    max_body: usize,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let vars = conf.get("vars").map(compile_vars).transpose()?;
    let status = conf
        .get("status_code")
        .and_then(Value::as_u64)
        .map(|s| {
            u16::try_from(s)
                .ok()
                .and_then(|s| StatusCode::from_u16(s).ok())
                .ok_or_else(|| format!("invalid status_code {s}"))
        })
        .transpose()?;
    let body = match conf.get("body").and_then(Value::as_str) {
        Some(b) if conf["body_base64"].as_bool() == Some(true) => Some(Bytes::from(
            decode_base64(b).ok_or("invalid base64 content")?,
        )),
        Some(b) => Some(Bytes::from(b.to_owned())),
        None => None,
    };
    let headers = match conf.get("headers").and_then(Value::as_object) {
        Some(h) => {
            let ops = header_ops(h);
            if ops.is_none() {
                tracing::error!("response-rewrite: failed to create header operation");
            }
            ops
        }
        None => None,
    };
    let filters = conf
        .get("filters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|f| {
            Ok(Filter {
                regex: compile_bytes(
                    f["regex"].as_str().unwrap_or(""),
                    f["options"].as_str().unwrap_or("jo"),
                )?,
                replacement: Replacement::parse(f["replace"].as_str().unwrap_or("")),
                global: f["scope"].as_str() == Some("global"),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Arc::new(ResponseRewrite {
        vars,
        status,
        body,
        headers,
        filters: Arc::new(filters),
        max_body: conf["max_resp_body_size"].as_u64().unwrap_or(67_108_864) as usize,
    }))
}

/// The variables of the response phase: the response's status and headers, then the
/// context's (the upstream tries, `$upstream_status` and `$balancer_ip` among them, and the
/// request's).
struct ResponseVars<'a, 'r> {
    ctx: &'a PluginCtx<'r>,
    status: StatusCode,
    headers: &'a HeaderMap,
    from_upstream: bool,
}

impl VarSource for ResponseVars<'_, '_> {
    fn var(&self, name: &str) -> Option<Cow<'_, str>> {
        if name == "status" {
            return Some(Cow::Owned(self.status.as_u16().to_string()));
        }
        let resp_header = name.strip_prefix("sent_http_").or_else(|| {
            name.strip_prefix("upstream_http_")
                .filter(|_| self.from_upstream)
        });
        if let Some(h) = resp_header {
            return ferrisix_plugin_api::vars::header_var(self.headers, h);
        }
        self.ctx.var(name)
    }
}

impl Plugin for ResponseRewrite {
    fn phases(&self) -> Phases {
        Phases::HEADER_FILTER
    }

    fn header_filter(&self, ctx: &mut PluginCtx<'_>, resp: &mut ResponseHead<'_>) {
        if let Some(expr) = &self.vars {
            let vars = ResponseVars {
                ctx,
                status: resp.status(),
                headers: resp.headers(),
                from_upstream: resp.from_upstream(),
            };
            if !expr.eval(&vars) {
                return;
            }
        }
        if let Some(s) = self.status {
            resp.set_status(s);
        }
        if self.body.is_some() || !self.filters.is_empty() {
            let encoding = resp
                .headers()
                .get(header::CONTENT_ENCODING)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            resp.clear_headers_as_body_modified();
            if let Some(body) = &self.body {
                resp.replace_body(body.clone());
            } else {
                let decoder = match encoding.as_deref() {
                    None => Ok(None),
                    Some(e) => Decoder::for_encoding(e).map(Some).ok_or(e),
                };
                match decoder {
                    Ok(decoder) => resp.add_body_filter(Box::new(FilterBody::new(
                        &self.filters,
                        decoder,
                        self.max_body,
                    ))),
                    Err(e) => tracing::error!(
                        encoding = e,
                        "response-rewrite: filters may not work as expected due to unsupported compression encoding type"
                    ),
                }
            }
        }
        let Some(ops) = &self.headers else { return };
        let mut add = Vec::new();
        let mut set = Vec::new();
        {
            let vars = ResponseVars {
                ctx,
                status: resp.status(),
                headers: resp.headers(),
                from_upstream: resp.from_upstream(),
            };
            for (name, v) in &ops.add {
                let text = v.resolve(&vars);
                if let Some(hv) = headers::header_value(&text, NAME, name) {
                    add.push((name.clone(), hv));
                }
            }
            for (name, v) in &ops.set {
                let text = v.resolve(&vars);
                // `ngx.header[name] = ""` clears the header.
                let hv = if text.is_empty() {
                    None
                } else {
                    headers::header_value(&text, NAME, name)
                };
                set.push((name, hv));
            }
        }
        let h = resp.headers_mut();
        for (name, v) in add {
            h.append(name, v);
        }
        for (name, v) in set {
            match v {
                Some(v) => {
                    h.insert(name.clone(), v);
                }
                None => {
                    h.remove(name);
                }
            }
        }
        for name in &ops.remove {
            h.remove(name);
        }
    }
}

/// The `filters` of one response: decode, cut at the size limit, substitute stage by stage.
struct FilterBody {
    decoder: Option<Decoder>,
    stages: Vec<StreamSub>,
    left: usize,
    /// Decoding failed: the rest goes out as it came.
    broken: bool,
}

impl FilterBody {
    fn new(filters: &[Filter], decoder: Option<Decoder>, max_body: usize) -> FilterBody {
        let hold = UNBOUNDED_HOLD.min(max_body.max(1));
        FilterBody {
            decoder,
            stages: filters
                .iter()
                .map(|f| StreamSub::new(f.regex.clone(), f.replacement.clone(), f.global, hold))
                .collect(),
            left: max_body,
            broken: false,
        }
    }

    fn substitute(&mut self, mut data: Vec<u8>, end: bool) -> Vec<u8> {
        for s in &mut self.stages {
            data = s.push(&data, end);
        }
        data
    }
}

impl BodyFilter for FilterBody {
    fn filter(&mut self, chunk: &mut BodyChunk) {
        if self.broken {
            return;
        }
        let mut data = std::mem::take(&mut chunk.data);
        if let Some(d) = &mut self.decoder {
            match d.push(&data) {
                Ok(plain) => data = Bytes::from(plain),
                Err(e) => {
                    tracing::error!(error = %e, "response-rewrite: filters may not work as expected");
                    self.broken = true;
                    chunk.data = data;
                    return;
                }
            }
            if chunk.end {
                if let Some(d) = self.decoder.take() {
                    match d.finish() {
                        Ok(rest) if !rest.is_empty() => {
                            let mut all = data.to_vec();
                            all.extend(rest);
                            data = Bytes::from(all);
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::error!(error = %e, "response-rewrite: filters may not work as expected")
                        }
                    }
                }
            }
        }
        // `hold_body_chunk(.., max_resp_body_size)`: the body is cut at the limit.
        if data.len() >= self.left {
            data.truncate(self.left);
            chunk.end = true;
        }
        self.left -= data.len();
        chunk.data = Bytes::from(self.substitute(data.to_vec(), chunk.end));
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::{BodyEdits, BodyFilters};
    use http::HeaderValue;

    use super::*;
    use crate::testing::Compiler;

    struct Answer {
        status: StatusCode,
        headers: HeaderMap,
        edits: BodyEdits,
    }

    fn respond(conf: Value, status: StatusCode, headers: HeaderMap) -> Answer {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "rr", None)).unwrap();
        let mut req = TestRequest::get("/x?a=1");
        let mut a = Answer {
            status,
            headers,
            edits: BodyEdits::default(),
        };
        let mut head = ResponseHead::new(&mut a.status, &mut a.headers, true, &mut a.edits);
        p.header_filter(&mut req.ctx(), &mut head);
        a
    }

    fn body_through(filters: BodyFilters, chunks: &[&[u8]]) -> Vec<u8> {
        let mut filters = filters;
        let mut out = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            let r = filters.run(Bytes::copy_from_slice(c), i + 1 == chunks.len());
            out.extend_from_slice(&r.data);
            if r.end {
                break;
            }
        }
        out
    }

    fn upstream_headers() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("11"));
        h.insert("x-up", HeaderValue::from_static("1"));
        h
    }

    #[test]
    fn status_body_and_headers() {
        let a = respond(
            json!({"status_code": 201, "body": "new body\n",
                "headers": {"X-Server-id": 3, "X-Server-status": "on", "X-Up": ""}}),
            StatusCode::OK,
            upstream_headers(),
        );
        assert_eq!(a.status, 201);
        assert_eq!(a.edits.replacement.as_deref(), Some(&b"new body\n"[..]));
        assert_eq!(a.headers["x-server-id"], "3");
        assert_eq!(a.headers["x-server-status"], "on");
        assert!(!a.headers.contains_key(header::CONTENT_LENGTH));
        assert!(!a.headers.contains_key("x-up"), "set to empty clears");
        let a = respond(
            json!({"body": "aGVsbG8=", "body_base64": true}),
            StatusCode::OK,
            HeaderMap::new(),
        );
        assert_eq!(a.edits.replacement.as_deref(), Some(&b"hello"[..]));
    }

    #[test]
    fn headers_add_set_remove_with_vars() {
        let a = respond(
            json!({"headers": {"add": ["Set-Cookie: a=1; Max-Age=10", "X-Arg : $arg_a", "X-Arg:b"],
                "set": {"X-Status": "$status", "X-Up": "2"}, "remove": ["Content-Length"]}}),
            StatusCode::ACCEPTED,
            upstream_headers(),
        );
        assert_eq!(a.headers["set-cookie"], "a=1; Max-Age=10");
        let args: Vec<_> = a.headers.get_all("x-arg").iter().collect();
        assert_eq!(args, ["1", "b"]);
        assert_eq!(a.headers["x-status"], "202");
        assert_eq!(a.headers["x-up"], "2");
        assert!(!a.headers.contains_key(header::CONTENT_LENGTH));
        assert!(a.edits.is_empty(), "headers alone leave the body");
        // An `add` item that is no `Name: value` applies no header operation.
        let a = respond(
            json!({"headers": {"add": ["X-A: 1:2"], "set": {"X-B": "1"}}}),
            StatusCode::OK,
            HeaderMap::new(),
        );
        assert!(a.headers.is_empty());
    }

    #[test]
    fn vars_on_the_response() {
        let conf = json!({"vars": [["status", "==", 200]], "status_code": 403, "body": "no"});
        assert_eq!(
            respond(conf.clone(), StatusCode::OK, HeaderMap::new()).status,
            403
        );
        let a = respond(conf, StatusCode::NOT_FOUND, HeaderMap::new());
        assert_eq!(a.status, 404);
        assert!(a.edits.is_empty());
        let conf = json!({"vars": [["sent_http_x_up", "==", "1"], ["arg_a", "==", "1"]], "status_code": 500});
        assert_eq!(
            respond(conf, StatusCode::OK, upstream_headers()).status,
            500
        );
    }

    #[test]
    fn filters_once_global_and_options() {
        let a = respond(
            json!({"filters": [{"regex": "l", "replace": "X"}]}),
            StatusCode::OK,
            upstream_headers(),
        );
        assert!(!a.headers.contains_key(header::CONTENT_LENGTH));
        assert_eq!(
            body_through(a.edits.filters, &[b"hello ", b"world"]),
            b"heXlo world"
        );
        let a = respond(
            json!({"filters": [{"regex": "L", "replace": "X", "scope": "global", "options": "joi"},
                {"regex": "(w)or", "replace": "${1}0r", "scope": "global"}]}),
            StatusCode::OK,
            HeaderMap::new(),
        );
        assert_eq!(
            body_through(a.edits.filters, &[b"hello ", b"world"]),
            b"heXXo w0rXd"
        );
        let a = respond(
            json!({"filters": [{"regex": "o", "replace": "0", "scope": "global"}], "max_resp_body_size": 4}),
            StatusCode::OK,
            HeaderMap::new(),
        );
        assert_eq!(body_through(a.edits.filters, &[b"fo", b"oooooo"]), b"f000");
    }

    /// APISIX runs `filters` over the whole held body: a match of 3 MiB, split across many
    /// chunks, is still one match.
    #[test]
    fn filters_find_long_matches_across_chunks() {
        let mut body = b"<p>".to_vec();
        body.extend(std::iter::repeat_n(b'a', 3 << 20));
        body.extend(b"</p>\n");
        let chunks: Vec<&[u8]> = body.chunks(64 * 1024).collect();
        let a = respond(
            json!({"filters": [{"regex": "<p>a*</p>", "replace": "P", "scope": "global"}]}),
            StatusCode::OK,
            HeaderMap::new(),
        );
        assert_eq!(body_through(a.edits.filters, &chunks), b"P\n");
        let a = respond(
            json!({"filters": [{"regex": "<p>[^<]*", "replace": "P"}]}),
            StatusCode::OK,
            HeaderMap::new(),
        );
        assert_eq!(body_through(a.edits.filters, &chunks), b"P</p>\n");
    }

    #[test]
    fn filters_on_a_gzip_body() {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(b"hello world").unwrap();
        let gz = enc.finish().unwrap();
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        let a = respond(
            json!({"filters": [{"regex": "world", "replace": "there"}]}),
            StatusCode::OK,
            h,
        );
        assert!(!a.headers.contains_key(header::CONTENT_ENCODING));
        let (x, y) = gz.split_at(5);
        assert_eq!(body_through(a.edits.filters, &[x, y]), b"hello there");
        // An encoding it cannot decode: no filter.
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("zstd"));
        let a = respond(
            json!({"filters": [{"regex": "a", "replace": "b"}]}),
            StatusCode::OK,
            h,
        );
        assert!(a.edits.filters.is_empty());
    }

    #[test]
    fn validation() {
        let r = crate::PluginRegistry::builtin();
        let err = |c: Value| {
            r.check(NAME, &c).expect_err(&c.to_string()).replace(
                "failed to check the configuration of plugin response-rewrite err: ",
                "",
            )
        };
        assert_eq!(
            err(json!({"body": "x", "body_base64": true})),
            "invalid base64 content"
        );
        assert_eq!(err(json!({"body_base64": true})), "invalid base64 content");
        assert!(err(json!({"status_code": 100})).contains("status_code"));
        assert!(err(json!({"status_code": 599})).contains("status_code"));
        assert!(err(json!({"vars": [["status", "~~~", 1]]}))
            .starts_with("failed to validate the 'vars' expression: "));
        assert!(err(json!({"filters": [{"regex": "(", "replace": "x"}]}))
            .starts_with("regex \"(\" validation failed: "));
        assert!(
            err(json!({"filters": [{"regex": "a", "replace": "x", "options": "jz"}]}))
                .contains("unknown flag")
        );
        assert!(
            err(json!({"filters": [{"regex": "a", "replace": "b"}], "body": "x"})).contains("body")
        );
        assert!(err(json!({"headers": {"add": ["X-A: 1/"]}})).contains("headers"));
        assert!(r.check(NAME, &json!({"headers": {"X-A": 1}})).is_ok());
    }
}
