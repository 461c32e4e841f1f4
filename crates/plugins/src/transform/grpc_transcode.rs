//! grpc-transcode (`apisix/plugins/grpc-transcode.lua` and `grpc-transcode/*.lua`): an HTTP
//! request becomes a unary gRPC call to the route's `grpc`/`grpcs` upstream, and its answer
//! JSON.
//!
//! `access` builds the input message of `service`/`method` of the proto `proto_id` from the
//! request (a JSON body for POST/PUT/PATCH with a JSON content type, else a form body for
//! POST, else the query arguments: [`message`] says how fields are read), and sends it as one
//! gRPC frame: `POST /<service>/<method>`, no query, `Content-Type: application/grpc`, and
//! `grpc-timeout` from `deadline`. A method the proto does not define answers 503, a request
//! that does not encode 400 (APISIX's codes, logged with its messages). A proto that cannot be
//! loaded (none with that id, or one held back) is logged and the request goes on untouched, as
//! APISIX's does.
//!
//! `header_filter`, for an answer below 300: `Content-Type: application/json`, no
//! `Content-Length`, and a `grpc-status` other than 0 in the head (a trailers-only gRPC error)
//! becomes the HTTP status of APISIX's table (599 for an unknown code). The body of a success
//! is the output message decoded (the 5-byte frame prefix dropped, except for requests with an
//! `X-Grpc-Web` header) and written as JSON with `pb_option`'s forms; at most
//! `max_resp_body_size` bytes are held. With `show_status_in_body`, an error's body is
//! `{"error": <grpc-status-details-bin decoded>}`, its `details` decoded as
//! `status_detail_type` of the proto when that is set.

mod message;

use std::sync::Arc;

use base64::Engine;
use bytes::{BufMut, Bytes, BytesMut};
use ferrisix_config::schema::defs;
use ferrisix_plugin_api::{
    BodyChunk, BodyFilter, CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef,
    ResponseHead, Step,
};
use http::header::{self, HeaderValue};
use http::{Method, StatusCode};
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, MethodDescriptor};
use serde_json::{json, Map, Value};

use self::message::Options;
use crate::support::args::decode_form;

pub const NAME: &str = "grpc-transcode";

pub static DEF: PluginDef = PluginDef::new(NAME, 506, schema, compile);

fn schema() -> Value {
    let pb_option_def = json!([
        {"description": "enum as result", "type": "string",
         "enum": ["enum_as_name", "enum_as_value"]},
        {"description": "int64 as result", "type": "string",
         "enum": ["int64_as_number", "int64_as_string", "int64_as_hexstring"]},
        {"description": "default values option", "type": "string",
         "enum": ["auto_default_values", "no_default_values",
                  "use_default_values", "use_default_metatable"]},
        {"description": "hooks option", "type": "string",
         "enum": ["enable_hooks", "disable_hooks"]}
    ]);
    json!({
        "type": "object",
        "properties": {
            "max_resp_body_size": {
                "type": "integer", "minimum": 1, "default": 67108864,
                "description": "maximum response body size in bytes buffered into memory for transcoding; larger responses are truncated"
            },
            "proto_id": defs::id(),
            "service": {"description": "the grpc service name", "type": "string"},
            "method": {"description": "the method name in the grpc service.", "type": "string"},
            "deadline": {"description": "deadline for grpc, millisecond", "type": "number", "default": 0},
            "pb_option": {
                "type": "array",
                "items": {"type": "string", "anyOf": pb_option_def},
                "minItems": 1,
                "default": ["enum_as_name", "int64_as_number", "auto_default_values", "disable_hooks"]
            },
            "show_status_in_body": {
                "description": "show decoded grpc-status-details-bin in response body",
                "type": "boolean", "default": false
            },
            "status_detail_type": {
                "description": "the message type of the grpc-status-details-bin's details part, if not given, the details part will not be decoded",
                "type": "string"
            }
        },
        "additionalProperties": true,
        "required": ["proto_id", "service", "method"]
    })
}

/// What the proto gave for this conf.
#[derive(Debug)]
enum Target {
    /// The method to call.
    Method(MethodDescriptor),
    /// The proto has no such service or method: 503.
    Undefined,
    /// The proto could not be loaded: the request goes on untouched.
    Unloaded(String),
}

#[derive(Debug)]
struct GrpcTranscode {
    target: Target,
    pool: Option<DescriptorPool>,
    service: String,
    method: String,
    /// `/<service>/<method>`.
    path: String,
    /// `grpc-timeout`, from a positive `deadline`.
    timeout: Option<HeaderValue>,
    options: Options,
    show_status_in_body: bool,
    status_detail_type: Option<String>,
    max_resp_body: usize,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let text = |k: &str| conf.get(k).and_then(Value::as_str).unwrap_or_default();
    let proto_id = match conf.get("proto_id") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let service = text("service").to_owned();
    let method = text("method").to_owned();
    let (target, pool) = match cx.protos.get(&proto_id) {
        None => (
            Target::Unloaded(format!("failed to find proto by id: {proto_id}")),
            None,
        ),
        Some(Err(e)) => (Target::Unloaded(e.message.clone()), None),
        Some(Ok(pool)) => {
            let found = pool
                .get_service_by_name(&service)
                .and_then(|s| s.methods().find(|m| m.name() == method));
            let target = found.map_or(Target::Undefined, Target::Method);
            (target, Some(pool.clone()))
        }
    };
    let deadline = conf.get("deadline").and_then(Value::as_f64).unwrap_or(0.0);
    // A fractional deadline is sent as whole milliseconds (gRPC's header has no fractions).
    let timeout = (deadline > 0.0).then(|| {
        let ms = (deadline.ceil() as u64).clamp(1, 99_999_999);
        HeaderValue::from_str(&format!("{ms}m")).unwrap_or(HeaderValue::from_static("1m"))
    });
    let pb_option: Vec<String> = conf
        .get("pb_option")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    Ok(Arc::new(GrpcTranscode {
        target,
        pool,
        path: format!("/{service}/{method}"),
        service,
        method,
        timeout,
        options: Options::of(&pb_option),
        show_status_in_body: conf["show_status_in_body"].as_bool() == Some(true),
        status_detail_type: conf
            .get("status_detail_type")
            .and_then(Value::as_str)
            .map(str::to_owned),
        max_resp_body: conf["max_resp_body_size"]
            .as_u64()
            .map_or(67_108_864, |n| usize::try_from(n).unwrap_or(usize::MAX)),
    }))
}

/// The request as a table, as APISIX's `get_request_table` reads it: a JSON body (POST, PUT,
/// PATCH with a JSON content type) that decodes, else a POST's form arguments, else the query
/// arguments.
fn request_table(method: &Method, content_type: &str, body: &[u8], query: &str) -> Value {
    let has_body = matches!(*method, Method::POST | Method::PUT | Method::PATCH);
    if has_body && content_type.contains("application/json") {
        if let Ok(v @ Value::Object(_)) = serde_json::from_slice::<Value>(body) {
            return v;
        }
    }
    if *method == Method::POST {
        if content_type.starts_with("application/x-www-form-urlencoded") {
            return decode_form(body);
        }
        return Value::Object(Map::new());
    }
    decode_form(query.as_bytes())
}

/// A gRPC message frame: no compression, the length big-endian, the message.
fn frame(msg: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + msg.len());
    b.put_u8(0);
    b.put_u32(u32::try_from(msg.len()).unwrap_or(u32::MAX));
    b.put_slice(msg);
    b.freeze()
}

/// The HTTP status of a gRPC status (APISIX's table, after Google's API design guide).
fn http_status(grpc_status: &str) -> StatusCode {
    let code = match grpc_status {
        "1" => 499,
        "2" => 500,
        "3" => 400,
        "4" => 504,
        "5" => 404,
        "6" => 409,
        "7" => 403,
        "8" => 429,
        "9" => 400,
        "10" => 409,
        "11" => 400,
        "12" => 501,
        "13" => 500,
        "14" => 503,
        "15" => 500,
        "16" => 401,
        _ => 599,
    };
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The most of a request body read to build the message from (APISIX reads it whole, bounded
/// by `client_max_body_size` only; ferrisix bounds what it holds in memory, and the gateway's
/// `client_max_body_size` still applies below it). Larger bodies answer 413.
const REQUEST_BODY_LIMIT: usize = 64 << 20;

/// The transcoded call was sent: the answer is decoded.
struct Transcoded;

impl GrpcTranscode {
    async fn transcode(&self, m: &MethodDescriptor, ctx: &mut PluginCtx<'_>) -> Flow {
        let body = match ctx.read_body(REQUEST_BODY_LIMIT).await {
            Ok(b) => b.clone(),
            Err(e) => {
                tracing::error!("failed to read request body: {e}");
                return Flow::Exit(Exit::status(StatusCode::PAYLOAD_TOO_LARGE));
            }
        };
        let content_type = ctx.header("content-type").unwrap_or_default().to_owned();
        let query = ctx.query().unwrap_or_default().to_owned();
        let table = request_table(ctx.method(), &content_type, &body, &query);
        let encoded = match message::message(&m.input(), &table) {
            Ok(msg) => prost::Message::encode_to_vec(&msg),
            Err(e) => {
                tracing::error!(
                    "transform request error: failed to encode request data to protobuf: {e}"
                );
                return Flow::Exit(Exit::status(StatusCode::BAD_REQUEST));
            }
        };
        ctx.set_upstream_method(Method::POST);
        ctx.set_upstream_path(self.path.clone());
        ctx.set_upstream_query(None);
        ctx.set_body(frame(&encoded));
        let headers = ctx.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.remove(header::CONTENT_LENGTH);
        if let Some(t) = &self.timeout {
            headers.insert("grpc-timeout", t.clone());
        }
        ctx.insert(Transcoded);
        Flow::Continue
    }

    /// `{"error": <status>}` of `grpc-status-details-bin`, or the message APISIX answers with
    /// when that does not decode.
    fn status_body(&self, details_bin: &[u8]) -> Bytes {
        let compact: Vec<u8> = details_bin
            .iter()
            .copied()
            .filter(|b| !b.is_ascii_whitespace())
            .collect();
        let raw = base64::engine::general_purpose::STANDARD
            .decode(&compact)
            .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(&compact));
        let Ok(raw) = raw else {
            return Bytes::from_static(b"grpc-status-details-bin is not base64 format");
        };
        let Ok(status) = <RpcStatus as prost::Message>::decode(raw.as_slice()) else {
            tracing::error!("transform response error: failed to call pb.decode to decode grpc-status-details-bin");
            return Bytes::from_static(
                b"failed to call pb.decode to decode grpc-status-details-bin",
            );
        };
        let details: Result<Vec<Value>, ()> = status
            .details
            .iter()
            .map(|d| match &self.status_detail_type {
                None => Ok(json!({
                    "type_url": d.type_url,
                    "value": String::from_utf8_lossy(&d.value),
                })),
                Some(t) => {
                    let desc = self.message_type(t).ok_or(())?;
                    let msg = DynamicMessage::decode(desc, d.value.as_slice()).map_err(|_| ())?;
                    Ok(message::message_json(&msg, self.options))
                }
            })
            .collect();
        let Ok(details) = details else {
            tracing::error!(
                "transform response error: failed to call pb.decode to decode details in grpc-status-details-bin"
            );
            return Bytes::from_static(
                b"failed to call pb.decode to decode details in grpc-status-details-bin",
            );
        };
        let body = json!({"error": {
            "code": status.code,
            "message": status.message,
            "details": details,
        }});
        Bytes::from(body.to_string())
    }

    fn message_type(&self, name: &str) -> Option<MessageDescriptor> {
        self.pool.as_ref()?.get_message_by_name(name)
    }
}

/// `google.rpc.Status` (APISIX's `grpc_status.ErrorStatus`), the content of
/// `grpc-status-details-bin`.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<RpcAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RpcAny {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// Holds up to `max` bytes of the body (what comes after is dropped, as APISIX truncates) and
/// replaces it at its end with what `f` makes of it.
struct Held<F> {
    buf: BytesMut,
    max: usize,
    f: Option<F>,
}

impl<F: FnOnce(Bytes) -> Bytes + Send + 'static> BodyFilter for Held<F> {
    fn filter(&mut self, chunk: &mut BodyChunk) {
        let room = self.max.saturating_sub(self.buf.len());
        let take = chunk.data.len().min(room);
        self.buf.extend_from_slice(&chunk.data[..take]);
        if !chunk.end {
            chunk.data = Bytes::new();
            return;
        }
        let whole = std::mem::take(&mut self.buf).freeze();
        chunk.data = match self.f.take() {
            Some(f) => f(whole),
            None => whole,
        };
    }
}

fn held<F: FnOnce(Bytes) -> Bytes + Send + 'static>(max: usize, f: F) -> Box<dyn BodyFilter> {
    Box::new(Held {
        buf: BytesMut::new(),
        max,
        f: Some(f),
    })
}

impl Plugin for GrpcTranscode {
    fn phases(&self) -> Phases {
        Phases::ACCESS | Phases::HEADER_FILTER
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        match &self.target {
            Target::Unloaded(e) => {
                tracing::error!("proto load error: {e}");
                Step::CONTINUE
            }
            Target::Undefined => {
                tracing::error!(
                    "transform request error: Undefined service method: {}/{} end",
                    self.service,
                    self.method
                );
                Step::exit(Exit::status(StatusCode::SERVICE_UNAVAILABLE))
            }
            Target::Method(m) => Step::Wait(Box::pin(self.transcode(m, ctx))),
        }
    }

    fn header_filter(&self, ctx: &mut PluginCtx<'_>, resp: &mut ResponseHead<'_>) {
        if resp.status().as_u16() < 300 {
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            resp.headers_mut().remove(header::CONTENT_LENGTH);
            let grpc_status = resp
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .filter(|s| *s != "0")
                .map(http_status);
            if let Some(status) = grpc_status {
                resp.set_status(status);
            }
        }
        let Target::Method(m) = &self.target else {
            return;
        };
        if ctx.get::<Transcoded>().is_none() {
            return;
        }
        if resp.status().as_u16() >= 300 {
            if !self.show_status_in_body {
                return;
            }
            let Some(details) = resp.headers().get("grpc-status-details-bin").cloned() else {
                return;
            };
            let body = self.status_body(details.as_bytes());
            resp.add_body_filter(held(self.max_resp_body, move |_| body));
            return;
        }
        let skip_prefix = ctx.header("x-grpc-web").is_none();
        let output = m.output();
        let options = self.options;
        resp.add_body_filter(held(self.max_resp_body, move |body: Bytes| {
            let msg = if skip_prefix {
                body.get(5..).unwrap_or_default()
            } else {
                &body[..]
            };
            match DynamicMessage::decode(output, msg) {
                Ok(decoded) => Bytes::from(message::message_json(&decoded, options).to_string()),
                Err(e) => {
                    tracing::error!(
                        "transform response error: failed to decode response data by protobuf: {e}"
                    );
                    Bytes::from_static(b"failed to decode response data by protobuf")
                }
            }
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_table() {
        assert_eq!(http_status("14"), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(http_status("4"), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(http_status("16"), StatusCode::UNAUTHORIZED);
        assert_eq!(http_status("99").as_u16(), 599);
    }

    #[test]
    fn request_tables() {
        let t = request_table(&Method::POST, "application/json", br#"{"a":1}"#, "b=2");
        assert_eq!(t, json!({"a": 1}));
        // A body that is not JSON: a POST's form arguments (none here), as APISIX.
        let t = request_table(&Method::POST, "application/json", b"{bad", "b=2");
        assert_eq!(t, json!({}));
        let t = request_table(
            &Method::POST,
            "application/x-www-form-urlencoded",
            b"a=1",
            "",
        );
        assert_eq!(t, json!({"a": "1"}));
        let t = request_table(&Method::GET, "", b"", "a=1&a=2&b=x");
        assert_eq!(t, json!({"a": ["1", "2"], "b": "x"}));
        let t = request_table(&Method::PUT, "application/json", b"[1]", "b=2");
        assert_eq!(t, json!({"b": "2"}));
    }

    #[test]
    fn status_details() {
        let pool = ferrisix_config::proto::compile(
            "e",
            "syntax = \"proto3\";\npackage helloworld;\n\
             message ErrorDetail { int64 code = 1; string message = 2; string type = 3; }",
            &Default::default(),
        )
        .unwrap();
        let mut p = GrpcTranscode {
            target: Target::Undefined,
            pool: Some(pool),
            service: String::new(),
            method: String::new(),
            path: String::new(),
            timeout: None,
            options: Options::default(),
            show_status_in_body: true,
            status_detail_type: None,
            max_resp_body: 1 << 20,
        };
        // APISIX's test value (t/plugin/grpc-transcode3.t).
        let bin = b"CA4SDk91dCBvZiBzZXJ2aWNlGlcKKnR5cGUuZ29vZ2xlYXBpcy5jb20vaGVsbG93b3JsZC5FcnJvckRldGFpbBIpCAESHFRoZSBzZXJ2ZXIgaXMgb3V0IG9mIHNlcnZpY2UaB3NlcnZpY2U";
        let v: Value = serde_json::from_slice(&p.status_body(bin)).unwrap();
        assert_eq!(
            v,
            json!({"error": {"code": 14, "message": "Out of service", "details": [{
                "type_url": "type.googleapis.com/helloworld.ErrorDetail",
                "value": "\u{8}\u{1}\u{12}\u{1c}The server is out of service\u{1a}\u{7}service"}]}})
        );
        p.status_detail_type = Some("helloworld.ErrorDetail".into());
        let v: Value = serde_json::from_slice(&p.status_body(bin)).unwrap();
        assert_eq!(
            v["error"]["details"],
            json!([{"code": 1, "message": "The server is out of service", "type": "service"}])
        );
        p.status_detail_type = Some("helloworld.error".into());
        assert_eq!(
            p.status_body(bin),
            "failed to call pb.decode to decode details in grpc-status-details-bin"
        );
        assert_eq!(
            p.status_body(b"%%%"),
            "grpc-status-details-bin is not base64 format"
        );
    }
}
