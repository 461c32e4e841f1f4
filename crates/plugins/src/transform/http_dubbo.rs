//! http-dubbo (`apisix/plugins/http-dubbo.lua`): the request becomes one Dubbo 2 call of
//! `service_name`/`service_version`/`method` with fastjson serialization, sent to the
//! upstream node the balancer picked, and the call's value the answer.
//!
//! In `before_proxy` it connects to the node (a new connection per request, request id 1, as
//! APISIX's cosocket does) under `connect_timeout`, `send_timeout` and `read_timeout`
//! (milliseconds). The request body is the call's parameters: a JSON array (or object) whose
//! members are written one per line, strings as JSON strings, numbers as Lua prints them,
//! anything else as JSON; or, with `serialized` (or the request header named by
//! `serialization_header_key` equal to `true`), the body as it is, the provider's fastjson
//! lines already. `params_type_desc` is the parameter types' JVM descriptor
//! (`Ljava/lang/String;I`); the attachments are empty.
//!
//! The answer: a value (`1`, `4`) is 200 with the value's JSON line as the body, a null
//! value (`2`, `5`) 200 with none; a connection that cannot be made 502, a body past
//! `max_req_body_size` 413, and everything else (an exception, a status other than OK, a
//! frame that is not Dubbo's, a timeout, a body that is not JSON) 500, as APISIX answers.

use std::sync::Arc;
use std::time::Duration;

use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{Exit, Flow, Phases, Plugin, PluginCtx, PluginDef, Step};
use http::StatusCode;
use serde_json::{json, Value};

use crate::support::dubbo::{self, CallError, FrameReader, STATUS_OK};

pub const NAME: &str = "http-dubbo";

pub static DEF: PluginDef = PluginDef::new(NAME, 504, schema, compile);

/// The largest answer frame read (a provider's value is one JSON line).
const MAX_ANSWER: u32 = 64 * 1024 * 1024;

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "max_req_body_size": {
                "type": "integer", "minimum": 1, "default": 67108864,
                "description": "maximum request body size in bytes buffered into memory; larger request bodies are rejected"
            },
            "service_name": {"type": "string", "minLength": 1},
            "service_version": {"type": "string", "pattern": "^\\d+\\.\\d+\\.\\d+", "default": "0.0.0"},
            "method": {"type": "string", "minLength": 1},
            "params_type_desc": {"type": "string", "default": ""},
            "serialization_header_key": {"type": "string"},
            "serialized": {"type": "boolean", "default": false},
            "connect_timeout": {"type": "number", "default": 6000},
            "read_timeout": {"type": "number", "default": 6000},
            "send_timeout": {"type": "number", "default": 6000}
        },
        "required": ["service_name", "method"]
    })
}

#[derive(Debug)]
struct HttpDubbo {
    max_body: usize,
    /// The request's fixed lines: Dubbo's version, the service, its version, the method and
    /// the parameter types, each a JSON string and a newline.
    head: String,
    serialization_header: Option<String>,
    serialized: bool,
    timeouts: dubbo::Timeouts,
}

/// A timeout in milliseconds as the conf gives it (cosocket's `settimeouts` takes any
/// number; a negative one is treated as none at all here, a tiny one as 1 ms).
fn millis(v: Option<&Value>) -> Duration {
    let ms = v.and_then(Value::as_f64).unwrap_or(6000.0);
    if ms.is_nan() || ms <= 0.0 {
        return Duration::from_millis(1);
    }
    Duration::from_secs_f64((ms / 1000.0).min(1e9))
}

fn compile(cx: &ferrisix_plugin_api::CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let text = |k: &str| conf.get(k).and_then(Value::as_str).unwrap_or_default();
    let mut head = String::new();
    for line in [
        dubbo::DUBBO_VERSION,
        text("service_name"),
        text("service_version"),
        text("method"),
        text("params_type_desc"),
    ] {
        // APISIX quotes these verbatim: a conf value holding a quote or a newline breaks the
        // provider's parse there as it does here.
        head.push('"');
        head.push_str(line);
        head.push_str("\"\n");
    }
    Ok(Arc::new(HttpDubbo {
        max_body: conf
            .get("max_req_body_size")
            .and_then(Value::as_u64)
            .map_or(67_108_864, |n| usize::try_from(n).unwrap_or(usize::MAX)),
        head,
        serialization_header: conf
            .get("serialization_header_key")
            .and_then(Value::as_str)
            .map(str::to_owned),
        serialized: conf.get("serialized").and_then(Value::as_bool) == Some(true),
        timeouts: dubbo::Timeouts {
            connect: millis(conf.get("connect_timeout")),
            send: millis(conf.get("send_timeout")),
            read: millis(conf.get("read_timeout")),
        },
    }))
}

/// APISIX's `string_to_json_string`: the string in double quotes with backslash, newline,
/// tab, carriage return, backspace, form feed and double quote escaped, and nothing else.
fn json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '"' => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The parameter lines of a JSON body: each member of the array (or object) on its own
/// line. `None` when the body is not a JSON array or object (a Lua runtime error in APISIX:
/// 500).
fn param_lines(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let members: Vec<&Value> = match &v {
        Value::Array(a) => a.iter().collect(),
        Value::Object(o) => o.values().collect(),
        _ => return None,
    };
    let mut out = String::new();
    for m in members {
        match m {
            Value::String(s) => json_string(s, &mut out),
            Value::Number(n) => out.push_str(&lua::json_number(n)),
            other => out.push_str(&lua::cjson_encode(other)),
        }
        out.push('\n');
    }
    Some(out)
}

impl HttpDubbo {
    /// The whole request frame; the exit when the body cannot be had.
    async fn request(&self, ctx: &mut PluginCtx<'_>) -> Result<Vec<u8>, Exit> {
        let serialized = match &self.serialization_header {
            Some(name) => ctx.header(name) == Some("true"),
            None => self.serialized,
        };
        let body = match ctx.read_body(self.max_body).await {
            Ok(b) => b.clone(),
            Err(e) => {
                tracing::error!("failed to get request body: {e}");
                return Err(Exit::status(StatusCode::PAYLOAD_TOO_LARGE));
            }
        };
        let mut payload = self.head.clone().into_bytes();
        if serialized {
            payload.extend_from_slice(&body);
            if !body.is_empty() && !body.ends_with(b"\n") {
                payload.push(b'\n');
            }
        } else if !body.is_empty() {
            match param_lines(&body) {
                Some(lines) => payload.extend_from_slice(lines.as_bytes()),
                None => {
                    tracing::error!("http-dubbo: the request body is not a JSON array or object");
                    return Err(Exit::status(StatusCode::INTERNAL_SERVER_ERROR));
                }
            }
        }
        payload.extend_from_slice(b"{}\n");
        Ok(dubbo::frame(dubbo::SERIALIZATION_FASTJSON, 1, &payload))
    }

    async fn call(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let Some(node) = ctx.upstream_node() else {
            return Flow::Continue;
        };
        let mut stream = match dubbo::connect(node, self.timeouts.connect).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("http-dubbo: {e} (upstream {node})");
                return Flow::Exit(Exit::status(StatusCode::BAD_GATEWAY));
            }
        };
        let frame = match self.request(ctx).await {
            Ok(f) => f,
            Err(exit) => return Flow::Exit(exit),
        };
        let answer = async {
            dubbo::send(&mut stream, &frame, self.timeouts.send).await?;
            FrameReader::new()
                .next(&mut stream, self.timeouts.read, MAX_ANSWER)
                .await
        }
        .await;
        let server_error = Flow::Exit(Exit::status(StatusCode::INTERNAL_SERVER_ERROR));
        let (header, body) = match answer {
            Ok(a) => a,
            Err(e) => {
                log_failure(&e, node);
                return server_error;
            }
        };
        if header.status != STATUS_OK {
            tracing::error!(
                "dubbo upstream {node} answered status {} ({})",
                header.status,
                dubbo::status_name(header.status)
            );
            return server_error;
        }
        let mut lines = body[..].split(|&b| b == b'\n');
        match lines.next().and_then(|l| l.first()) {
            Some(b'2' | b'5') => Flow::Exit(Exit::status(StatusCode::OK)),
            Some(b'1' | b'4') => {
                let value = lines.next().unwrap_or_default();
                Flow::Exit(Exit::body(StatusCode::OK, value.to_vec()))
            }
            _ => {
                tracing::error!("dubbo upstream {node} answered an exception or no value");
                server_error
            }
        }
    }
}

fn log_failure(e: &CallError, node: std::net::SocketAddr) {
    tracing::error!("http-dubbo: {e} (upstream {node})");
}

impl Plugin for HttpDubbo {
    fn phases(&self) -> Phases {
        Phases::BEFORE_PROXY | Phases::NODE
    }

    fn before_proxy<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.call(ctx)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_written_as_apisix_writes_them() {
        let lines = param_lines(br#"["a\"b\n/c", 1, 1.5, 1e20, true, null, {"k":[1,2]}]"#).unwrap();
        assert_eq!(
            lines,
            "\"a\\\"b\\n/c\"\n1\n1.5\n1e+20\ntrue\nnull\n{\"k\":[1,2]}\n"
        );
        assert_eq!(param_lines(br#"{"x": "y"}"#).unwrap(), "\"y\"\n");
        assert_eq!(param_lines(b"5"), None);
        assert_eq!(param_lines(b"not json"), None);
    }

    #[test]
    fn schema_defaults_and_checks() {
        let s = schema();
        assert_eq!(s["properties"]["service_version"]["default"], "0.0.0");
        assert_eq!(s["required"], json!(["service_name", "method"]));
        assert_eq!(millis(Some(&json!(1500))), Duration::from_millis(1500));
        assert_eq!(millis(Some(&json!(-1))), Duration::from_millis(1));
    }
}
