//! grpc-web (`apisix/plugins/grpc-web.lua`): gRPC-Web calls from browsers made gRPC calls to
//! the route's `grpc`/`grpcs` upstream, after the protocol in grpc's `doc/PROTOCOL-WEB.md`.
//!
//! `access`: `OPTIONS` (a CORS preflight) answers 204, a method other than `POST` 405, a
//! Content-Type other than `application/grpc-web`, `application/grpc-web+proto` (binary) and
//! `application/grpc-web-text`, `application/grpc-web-text+proto` (base64) 400. The body
//! (at most `max_req_body_size`, else 400) is decoded from base64 for the text forms and sent
//! as `application/grpc`; a route whose URI ends in `*` sends what the `*` matched as the
//! path (`/grpc/web/*` and `/grpc/web/pkg.Svc/Method` call `/pkg.Svc/Method`).
//!
//! `header_filter`: CORS headers (`Access-Control-Allow-Origin: *` unless one is set already,
//! by the cors plugin; `Access-Control-Expose-Headers: grpc-message,grpc-status`; on the
//! preflight `Access-Control-Allow-Methods: POST` and `cors_allow_headers`), the request's
//! Content-Type on the answer. The body: base64-encoded for the text forms, and the
//! upstream's trailers as gRPC-Web's trailer frame at the end (`0x80`, length,
//! `grpc-status:<s>\r\ngrpc-message:<m>\r\n`; status 2 "upstream grpc status not received"
//! without trailers), except for a trailers-only answer, whose `grpc-status` is in the head.

use std::sync::Arc;

use base64::Engine;
use bytes::{BufMut, Bytes, BytesMut};
use ferrisix_plugin_api::{
    BodyChunk, BodyFilter, CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef,
    ResponseHead, Step,
};
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, StatusCode};
use serde_json::{json, Value};

pub const NAME: &str = "grpc-web";

pub static DEF: PluginDef = PluginDef::new(NAME, 505, schema, compile);

const DEFAULT_CORS_ALLOW_HEADERS: &str = "content-type,x-grpc-web,x-user-agent";

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "max_req_body_size": {
                "type": "integer", "minimum": 1, "default": 67108864,
                "description": "maximum request body size in bytes buffered into memory; larger request bodies are rejected"
            },
            "cors_allow_headers": {
                "description": "multiple header use ',' to split. default: content-type,x-grpc-web,x-user-agent.",
                "type": "string",
                "default": DEFAULT_CORS_ALLOW_HEADERS
            }
        }
    })
}

#[derive(Debug)]
struct GrpcWeb {
    max_body: usize,
    allow_headers: HeaderValue,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let allow = conf["cors_allow_headers"]
        .as_str()
        .unwrap_or(DEFAULT_CORS_ALLOW_HEADERS);
    Ok(Arc::new(GrpcWeb {
        max_body: conf["max_req_body_size"]
            .as_u64()
            .map_or(67_108_864, |n| usize::try_from(n).unwrap_or(usize::MAX)),
        allow_headers: HeaderValue::from_str(allow)
            .map_err(|_| format!("invalid cors_allow_headers: {allow}"))?,
    }))
}

/// How the request's messages are encoded (by its Content-Type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encoding {
    Binary,
    Base64,
}

fn encoding(content_type: &str) -> Option<Encoding> {
    match content_type {
        "application/grpc-web" | "application/grpc-web+proto" => Some(Encoding::Binary),
        "application/grpc-web-text" | "application/grpc-web-text+proto" => Some(Encoding::Base64),
        _ => None,
    }
}

/// The request's state: its Content-Type (echoed on the answer), its encoding, and whether
/// the plugin answered itself (no body filter then).
struct WebCall {
    mime: Option<HeaderValue>,
    encoding: Option<Encoding>,
    exited: bool,
}

/// gRPC-Web's trailer frame.
fn trailer_frame(status: &str, message: &str) -> Bytes {
    let text = format!("grpc-status:{status}\r\ngrpc-message:{message}\r\n");
    let mut b = BytesMut::with_capacity(5 + text.len());
    b.put_u8(0x80);
    b.put_u32(u32::try_from(text.len()).unwrap_or(u32::MAX));
    b.put_slice(text.as_bytes());
    b.freeze()
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

impl GrpcWeb {
    fn exit(ctx: &mut PluginCtx<'_>, mime: Option<HeaderValue>, status: StatusCode) -> Flow {
        ctx.insert(WebCall {
            mime,
            encoding: None,
            exited: true,
        });
        Flow::Exit(Exit::status(status))
    }

    async fn call(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let mime = ctx.headers().get(header::CONTENT_TYPE).cloned();
        if *ctx.method() == Method::OPTIONS {
            return Self::exit(ctx, mime, StatusCode::NO_CONTENT);
        }
        if *ctx.method() != Method::POST {
            tracing::error!("request method: `{}` invalid", ctx.method());
            return Self::exit(ctx, mime, StatusCode::METHOD_NOT_ALLOWED);
        }
        let Some(enc) = mime
            .as_ref()
            .and_then(|m| m.to_str().ok())
            .and_then(encoding)
        else {
            tracing::error!(
                "request Content-Type: `{}` invalid",
                mime.as_ref()
                    .map_or("", |m| m.to_str().unwrap_or("(not text)"))
            );
            return Self::exit(ctx, mime, StatusCode::BAD_REQUEST);
        };
        // What the route's trailing `*` matched is the gRPC path.
        if let Some(prefix) = ctx.matched_uri().strip_suffix('*') {
            let ext = ctx.uri().strip_prefix(prefix).unwrap_or_default();
            if !ext.is_empty() {
                let path = if ext.starts_with('/') {
                    ext.to_owned()
                } else {
                    format!("/{ext}")
                };
                ctx.set_upstream_path(path);
            }
        }
        let body = match ctx.read_body(self.max_body).await {
            Ok(b) => b.clone(),
            Err(e) => {
                tracing::error!("failed to read request body, err: {e}");
                return Self::exit(ctx, mime, StatusCode::BAD_REQUEST);
            }
        };
        let body = if enc == Encoding::Base64 {
            let compact: Vec<u8> = body
                .iter()
                .copied()
                .filter(|b| !b.is_ascii_whitespace())
                .collect();
            match b64().decode(&compact) {
                Ok(b) => Bytes::from(b),
                Err(_) => {
                    tracing::error!("failed to decode request body");
                    return Self::exit(ctx, mime, StatusCode::BAD_REQUEST);
                }
            }
        } else {
            body
        };
        ctx.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        ctx.headers_mut().remove(header::CONTENT_LENGTH);
        ctx.set_body(body);
        ctx.insert(WebCall {
            mime,
            encoding: Some(enc),
            exited: false,
        });
        Flow::Continue
    }
}

/// Re-encodes the answer for the client: base64 chunks for the text forms, the trailers as
/// the last frame.
struct WebBody {
    encoding: Encoding,
    /// The answer's head carried `grpc-status` (trailers-only): no trailer frame.
    metadata_sent: bool,
    trailers: Option<(String, String)>,
    /// Bytes of a text answer not yet encoded: base64 goes out in whole 3-byte groups, so the
    /// chunks a client decodes one by one have no padding in their middle.
    pending: BytesMut,
}

impl BodyFilter for WebBody {
    fn trailers(&mut self, trailers: &mut HeaderMap) {
        let get = |n: &str| {
            trailers
                .get(n)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        };
        if let Some(status) = get("grpc-status").filter(|s| !s.is_empty()) {
            self.trailers = Some((status, get("grpc-message").unwrap_or_default()));
        }
        // They go in the body; an HTTP/1.1 browser would not see them anyway.
        trailers.clear();
    }

    fn filter(&mut self, chunk: &mut BodyChunk) {
        let trailer = (chunk.end && !self.metadata_sent).then(|| {
            let (status, message) = self
                .trailers
                .take()
                .unwrap_or_else(|| ("2".into(), "upstream grpc status not received".into()));
            trailer_frame(&status, &message)
        });
        match self.encoding {
            Encoding::Base64 => {
                // The trailer frame is encoded with the last bytes: one base64 text, padded
                // only at its very end.
                self.pending.extend_from_slice(&chunk.data);
                if let Some(t) = &trailer {
                    self.pending.extend_from_slice(t);
                }
                let whole = if chunk.end {
                    self.pending.len()
                } else {
                    self.pending.len() / 3 * 3
                };
                let raw = self.pending.split_to(whole);
                chunk.data = Bytes::from(b64().encode(&raw));
            }
            Encoding::Binary => {
                if let Some(t) = trailer {
                    let mut data = BytesMut::from(&chunk.data[..]);
                    data.extend_from_slice(&t);
                    chunk.data = data.freeze();
                }
            }
        }
    }
}

impl Plugin for GrpcWeb {
    fn phases(&self) -> Phases {
        Phases::ACCESS | Phases::HEADER_FILTER
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.call(ctx)))
    }

    fn header_filter(&self, ctx: &mut PluginCtx<'_>, resp: &mut ResponseHead<'_>) {
        let h = resp.headers_mut();
        if *ctx.method() == Method::OPTIONS {
            h.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("POST"),
            );
            h.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                self.allow_headers.clone(),
            );
        }
        // The cors plugin (higher priority) set its own origin already: APISIX leaves it.
        if !h.contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN) {
            h.insert(
                header::ACCESS_CONTROL_ALLOW_ORIGIN,
                HeaderValue::from_static("*"),
            );
        }
        h.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("grpc-message,grpc-status"),
        );
        let Some(call) = ctx.get::<WebCall>() else {
            return;
        };
        if call.exited {
            return;
        }
        let (Some(mime), Some(encoding)) = (call.mime.clone(), call.encoding) else {
            return;
        };
        let h = resp.headers_mut();
        h.insert(header::CONTENT_TYPE, mime);
        h.remove(header::CONTENT_LENGTH);
        let metadata_sent = h.contains_key(HeaderName::from_static("grpc-status"));
        resp.add_body_filter(Box::new(WebBody {
            encoding,
            metadata_sent,
            trailers: None,
            pending: BytesMut::new(),
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(f: &mut WebBody, parts: &[&[u8]], trailers: Option<HeaderMap>) -> Vec<u8> {
        let mut out = Vec::new();
        for p in parts {
            let mut c = BodyChunk {
                data: Bytes::copy_from_slice(p),
                end: false,
            };
            f.filter(&mut c);
            out.extend_from_slice(&c.data);
        }
        if let Some(mut t) = trailers {
            f.trailers(&mut t);
            assert!(t.is_empty(), "trailers go in the body");
        }
        let mut c = BodyChunk {
            data: Bytes::new(),
            end: true,
        };
        f.filter(&mut c);
        out.extend_from_slice(&c.data);
        out
    }

    fn web(encoding: Encoding, metadata_sent: bool) -> WebBody {
        WebBody {
            encoding,
            metadata_sent,
            trailers: None,
            pending: BytesMut::new(),
        }
    }

    #[test]
    fn trailers_become_the_last_frame() {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("0"));
        let out = run(
            &mut web(Encoding::Binary, false),
            &[b"\0\0\0\0\x01x"],
            Some(t),
        );
        let mut want = b"\0\0\0\0\x01x".to_vec();
        want.extend_from_slice(&trailer_frame("0", ""));
        assert_eq!(out, want);
        assert_eq!(
            &trailer_frame("0", "")[..],
            b"\x80\0\0\0\x1egrpc-status:0\r\ngrpc-message:\r\n"
        );
        // No trailers at all: status 2.
        let out = run(&mut web(Encoding::Binary, false), &[], None);
        assert_eq!(
            out,
            trailer_frame("2", "upstream grpc status not received").to_vec()
        );
        // Trailers-only: nothing added.
        assert!(run(&mut web(Encoding::Binary, true), &[], None).is_empty());
    }

    #[test]
    fn text_answers_are_base64_in_whole_groups() {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("0"));
        let out = run(
            &mut web(Encoding::Base64, false),
            &[b"abcd", b"ef", b"g"],
            Some(t),
        );
        let text = String::from_utf8(out).unwrap();
        let mut raw = b"abcdefg".to_vec();
        raw.extend_from_slice(&trailer_frame("0", ""));
        assert_eq!(text, b64().encode(raw));
        assert!(encoding("application/grpc-web-text+proto") == Some(Encoding::Base64));
        assert!(encoding("application/json").is_none());
    }
}
