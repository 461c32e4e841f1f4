//! echo (`apisix/plugins/echo.lua`): replaces the response body (`body`), wraps it
//! (`before_body` first, `after_body` at the end of the stream) and sets response headers
//! (`headers`), on whatever answer ends the request.
//!
//! As APISIX's body filter, `body` replaces the first chunk and ends the stream there (what
//! the upstream still sends is dropped), `before_body` is put before the first chunk the
//! client gets and `after_body` after the last; `Content-Length`, `Content-Encoding`,
//! `Last-Modified` and `ETag` go when any of the three is set, since the body is not the
//! upstream's any more.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{
    BodyChunk, BodyFilter, CompileCtx, Phases, Plugin, PluginCtx, PluginDef, ResponseHead,
};
use http::{HeaderName, HeaderValue};
use serde_json::{json, Value};

pub const NAME: &str = "echo";

pub static DEF: PluginDef = PluginDef::new(NAME, 412, schema, compile);

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "before_body": {"description": "body before the filter phase.", "type": "string"},
            "body": {"description": "body to replace upstream response.", "type": "string"},
            "after_body": {
                "description": "body after the modification of filter phase.",
                "type": "string"
            },
            "headers": {
                "description": "new headers for response",
                "type": "object",
                "minProperties": 1
            }
        },
        "anyOf": [
            {"required": ["before_body"]},
            {"required": ["body"]},
            {"required": ["after_body"]}
        ],
        "minProperties": 1
    })
}

/// One compiled echo conf.
#[derive(Debug)]
struct Echo {
    bodies: Arc<Bodies>,
    headers: Vec<(HeaderName, HeaderValue)>,
}

#[derive(Debug)]
struct Bodies {
    before: Option<Bytes>,
    body: Option<Bytes>,
    after: Option<Bytes>,
}

impl Bodies {
    fn any(&self) -> bool {
        self.before.is_some() || self.body.is_some() || self.after.is_some()
    }
}

/// The headers to set, in the conf's order. APISIX stops at the first field that is not a
/// non-empty name with a string or number value (`invalid type as header value`) and sets the
/// ones before it from then on; here they are set from the first request (APISIX's very first
/// request sets none). A value nginx could not send is left out.
fn headers(conf: &Value) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = Vec::new();
    for (field, value) in conf
        .get("headers")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let text = match value {
            Value::String(s) => s.clone(),
            Value::Number(n) => lua::json_number(n),
            _ => {
                tracing::warn!(field, "echo: invalid type as header value");
                break;
            }
        };
        if field.is_empty() {
            tracing::warn!("echo: invalid field length in header");
            break;
        }
        match (
            HeaderName::from_bytes(field.as_bytes()),
            HeaderValue::from_str(&text),
        ) {
            (Ok(name), Ok(value)) => out.push((name, value)),
            _ => tracing::warn!(field, "echo: header not set: invalid name or value"),
        }
    }
    out
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let text = |name: &str| {
        cx.conf
            .get(name)
            .and_then(Value::as_str)
            .map(|s| Bytes::from(s.to_owned()))
    };
    Ok(Arc::new(Echo {
        bodies: Arc::new(Bodies {
            before: text("before_body"),
            body: text("body"),
            after: text("after_body"),
        }),
        headers: headers(cx.conf),
    }))
}

impl Plugin for Echo {
    fn phases(&self) -> Phases {
        Phases::HEADER_FILTER
    }

    fn header_filter(&self, _ctx: &mut PluginCtx<'_>, resp: &mut ResponseHead<'_>) {
        if self.bodies.any() {
            resp.clear_headers_as_body_modified();
            resp.add_body_filter(Box::new(EchoFilter {
                bodies: self.bodies.clone(),
                started: false,
            }));
        }
        for (name, value) in &self.headers {
            resp.headers_mut().insert(name.clone(), value.clone());
        }
    }
}

/// echo's `body_filter` for one response.
struct EchoFilter {
    bodies: Arc<Bodies>,
    /// `ctx.plugin_echo_body_set`: `before_body` went out.
    started: bool,
}

fn concat(a: &[u8], b: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(a.len() + b.len());
    out.extend_from_slice(a);
    out.extend_from_slice(b);
    out.freeze()
}

impl BodyFilter for EchoFilter {
    fn filter(&mut self, chunk: &mut BodyChunk) {
        let b = &*self.bodies;
        if let Some(body) = &b.body {
            chunk.data = body.clone();
            chunk.end = true;
        }
        if let Some(before) = &b.before {
            if !self.started {
                chunk.data = concat(before, &chunk.data);
                self.started = true;
            }
        }
        if chunk.end {
            if let Some(after) = &b.after {
                chunk.data = concat(&chunk.data, after);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::{BodyEdits, BodyFilters};
    use http::{header, HeaderMap, StatusCode};

    use super::*;
    use crate::testing::Compiler;

    /// Runs echo's header filter on a response with `headers`; answers the headers after it
    /// and what the body filters make of `chunks` (the last one ending the stream).
    fn respond(conf: Value, headers: HeaderMap, chunks: &[&str]) -> (HeaderMap, Vec<Bytes>) {
        let c = Compiler::new();
        let plugin = (DEF.compile)(&c.cx(NAME, &conf, "echo-1", None)).unwrap();
        let mut req = TestRequest::get("/hello");
        let (mut status, mut headers, mut edits) = (StatusCode::OK, headers, BodyEdits::default());
        let mut head = ResponseHead::new(&mut status, &mut headers, true, &mut edits);
        plugin.header_filter(&mut req.ctx(), &mut head);
        let mut filters: BodyFilters = edits.filters;
        let mut out = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            let chunk = filters.run(Bytes::from(c.to_string()), i + 1 == chunks.len());
            out.push(chunk.data);
            if chunk.end {
                break;
            }
        }
        (headers, out)
    }

    fn joined(chunks: &[Bytes]) -> String {
        chunks
            .iter()
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect()
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        assert!(r
            .check(
                NAME,
                &json!({"before_body": "body before", "body": "body to attach",
                    "after_body": "body to attach"})
            )
            .is_ok());
        // t/plugin/echo.t TEST 2.
        assert_eq!(
            r.check(
                NAME,
                &json!({"before_body": "body before", "body": "body to attach", "after_body": 10})
            ),
            Err("failed to check the configuration of plugin echo err: property \"after_body\" validation failed: wrong type: expected string, got number".into())
        );
        assert_eq!(
            r.check(NAME, &json!({"headers": {"a": "b"}})),
            Err("failed to check the configuration of plugin echo err: object matches none of the required: [\"before_body\"] or [\"body\"] or [\"after_body\"]".into())
        );
        let e = r.check(NAME, &json!({})).unwrap_err();
        assert!(
            e.starts_with("failed to check the configuration of plugin echo err: "),
            "{e}"
        );
        let e = r
            .check(NAME, &json!({"body": "x", "headers": {}}))
            .unwrap_err();
        assert!(e.contains("headers"), "{e}");
        assert_eq!(r.get(NAME).unwrap().priority, 412);
    }

    #[test]
    fn body_before_and_after_with_headers() {
        // t/plugin/echo.t TEST 3-4.
        let mut upstream = HeaderMap::new();
        upstream.insert(header::CONTENT_LENGTH, HeaderValue::from_static("12"));
        upstream.insert(header::ETAG, HeaderValue::from_static("\"e\""));
        let (headers, body) = respond(
            json!({"before_body": "before the body modification ", "body": "hello upstream",
                "after_body": " after the body modification.",
                "headers": {"Location": "https://www.iresty.com", "Authorization": "userpass"}}),
            upstream,
            &["hello world\n"],
        );
        assert_eq!(
            joined(&body),
            "before the body modification hello upstream after the body modification."
        );
        assert_eq!(headers["location"], "https://www.iresty.com");
        assert_eq!(headers["authorization"], "userpass");
        assert!(!headers.contains_key(header::CONTENT_LENGTH));
        assert!(!headers.contains_key(header::ETAG));
    }

    #[test]
    fn before_only_keeps_the_upstream_body() {
        // t/plugin/echo.t TEST 5-6.
        let (_, body) = respond(
            json!({"before_body": "before the body modification "}),
            HeaderMap::new(),
            &["hello world\n"],
        );
        assert_eq!(joined(&body), "before the body modification hello world\n");
    }

    #[test]
    fn chunked_upstream() {
        // t/plugin/echo.t TEST 8-9: `body` ends the stream at the first chunk.
        let (_, body) = respond(
            json!({"body": "hello upstream"}),
            HeaderMap::new(),
            &["hello ", "world\n", ""],
        );
        assert_eq!(body, vec![Bytes::from("hello upstream")]);
        // TEST 10-11: before the first chunk, after the last.
        let (_, body) = respond(
            json!({"before_body": "before the body modification ",
                "after_body": " after the body modification."}),
            HeaderMap::new(),
            &["hello ", "world\n", ""],
        );
        assert_eq!(
            body,
            vec![
                Bytes::from("before the body modification hello "),
                Bytes::from("world\n"),
                Bytes::from(" after the body modification.")
            ]
        );
    }

    #[test]
    fn header_values_and_their_limits() {
        let (headers, _) = respond(
            json!({"after_body": "x", "headers": {"X-Num": 10, "X-Float": 1.5, "X-Str": "s",
                "X-Bad": true, "X-After": "never"}}),
            HeaderMap::new(),
            &[""],
        );
        assert_eq!(headers["x-num"], "10");
        assert_eq!(headers["x-float"], "1.5");
        assert_eq!(headers["x-str"], "s");
        assert!(!headers.contains_key("x-bad") && !headers.contains_key("x-after"));
        // Headers alone leave the body and its length as they are.
        let mut upstream = HeaderMap::new();
        upstream.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        let conf = json!({"headers": {"X-A": "1"}});
        let c = Compiler::new();
        let plugin = (DEF.compile)(&c.cx(NAME, &conf, "echo-2", None)).unwrap();
        let mut req = TestRequest::get("/");
        let (mut status, mut edits) = (StatusCode::OK, BodyEdits::default());
        let mut head = ResponseHead::new(&mut status, &mut upstream, false, &mut edits);
        plugin.header_filter(&mut req.ctx(), &mut head);
        assert!(edits.is_empty());
        assert_eq!(upstream[header::CONTENT_LENGTH], "5");
        assert_eq!(upstream["x-a"], "1");
    }
}
