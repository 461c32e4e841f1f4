//! Answers of the Admin API: APISIX's JSON envelopes and error bodies, and nginx's own pages.

use bytes::Bytes;
use http::StatusCode;
use serde_json::{json, Map, Value};

/// What a stage of the pipeline answered, before the common headers are added.
#[derive(Debug)]
pub enum Reply {
    /// nginx's HTML page: the allow-list refusal, or a path no admin route matches.
    Page(StatusCode),
    /// The CORS preflight answer.
    Preflight,
    /// An answer from APISIX's Lua code.
    Lua {
        status: StatusCode,
        body: Body,
        /// The resource handler produced it: gets `X-API-VERSION`.
        handler: bool,
    },
    /// An answer with its own content type and headers (`/apisix/admin/configs`).
    Custom {
        status: StatusCode,
        body: Bytes,
        content_type: &'static str,
        headers: Vec<(&'static str, String)>,
    },
}

#[derive(Debug)]
pub enum Body {
    /// Encoded with a trailing newline, as `core.response.exit` does for tables.
    Json(Value),
    /// Sent as is (`done`, `page_size must be between 10 and 500`).
    Text(String),
    Empty,
}

impl Body {
    pub fn into_bytes(self) -> Bytes {
        match self {
            Body::Json(v) => {
                let mut out = serde_json::to_vec(&v).unwrap_or_default();
                out.push(b'\n');
                Bytes::from(out)
            }
            Body::Text(s) => Bytes::from(s),
            Body::Empty => Bytes::new(),
        }
    }
}

impl Reply {
    /// A non-handler JSON answer (auth, routing and body errors).
    pub fn early(status: StatusCode, body: Value) -> Reply {
        Reply::Lua {
            status,
            body: Body::Json(body),
            handler: false,
        }
    }

    /// A handler answer with a JSON body.
    pub fn json(status: StatusCode, body: Value) -> Reply {
        Reply::Lua {
            status,
            body: Body::Json(body),
            handler: true,
        }
    }

    /// A handler answer `{"error_msg": msg}`.
    pub fn error(status: StatusCode, msg: impl Into<String>) -> Reply {
        Reply::json(status, error_body(msg))
    }

    pub fn bad_request(msg: impl Into<String>) -> Reply {
        Reply::error(StatusCode::BAD_REQUEST, msg)
    }

    /// Store failures: 503 with the store's text, as APISIX passes etcd's error on.
    pub fn unavailable(msg: impl Into<String>) -> Reply {
        Reply::error(StatusCode::SERVICE_UNAVAILABLE, msg)
    }

    /// `{"message":"Key not found"}`: etcd's not-found body, not an `error_msg`.
    pub fn key_not_found() -> Reply {
        Reply::json(StatusCode::NOT_FOUND, json!({"message": "Key not found"}))
    }
}

pub fn error_body(msg: impl Into<String>) -> Value {
    json!({"error_msg": msg.into()})
}

/// A stored value as APISIX prints it: it went through a Lua table, and lua-cjson encodes an
/// empty table as `{}`, so empty arrays come back as empty objects.
pub fn lua_view(value: Value) -> Value {
    match value {
        Value::Array(items) if items.is_empty() => Value::Object(Map::new()),
        Value::Array(items) => Value::Array(items.into_iter().map(lua_view).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, lua_view(v))).collect())
        }
        other => other,
    }
}

/// nginx's reason phrases in its built-in pages.
fn nginx_reason(status: StatusCode) -> &'static str {
    match status.as_u16() {
        405 => "Not Allowed",
        413 => "Request Entity Too Large",
        503 => "Service Temporarily Unavailable",
        _ => status.canonical_reason().unwrap_or("Unknown"),
    }
}

/// nginx's HTML error page; `server` is the footer nginx prints.
pub fn nginx_page(status: StatusCode, server: &str) -> Bytes {
    let code = status.as_u16();
    let reason = nginx_reason(status);
    Bytes::from(format!(
        "<html>\r\n<head><title>{code} {reason}</title></head>\r\n<body>\r\n<center><h1>{code} {reason}</h1></center>\r\n<hr><center>{server}</center>\r\n</body>\r\n</html>\r\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_arrays_print_as_objects() {
        assert_eq!(
            lua_view(json!({"nodes": [], "methods": ["GET"], "o": {"a": [[]]}})),
            json!({"nodes": {}, "methods": ["GET"], "o": {"a": [{}]}})
        );
    }

    #[test]
    fn json_bodies_end_with_a_newline() {
        assert_eq!(
            Body::Json(json!({"a": "/b"})).into_bytes(),
            Bytes::from_static(b"{\"a\":\"/b\"}\n")
        );
        assert_eq!(
            Body::Text("done".into()).into_bytes(),
            Bytes::from_static(b"done")
        );
    }
}
