//! How a plugin ends a request: APISIX's `core.response.exit(status, body)`, with the headers
//! it sets first (`core.response.set_header`).

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use serde_json::{Map, Value};

/// The answer a plugin ends the request with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    pub status: StatusCode,
    /// `None`: nginx's HTML error page for the status where nginx has one, else no body (as
    /// `ngx.exit`). `Some`: this body, as
    /// `text/plain; charset=utf-8` unless `headers` name another content type (APISIX's JSON
    /// line already ends with `\n`).
    pub body: Option<Bytes>,
    /// Set on the answer after the gateway's own headers, each name replacing earlier values
    /// (`Location` of a redirect, a mock's `Content-Type`, an abort's headers).
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl Exit {
    /// An exit with nginx's page for `status`.
    pub fn status(status: StatusCode) -> Exit {
        Exit {
            status,
            body: None,
            headers: Vec::new(),
        }
    }

    /// An exit with `body`.
    pub fn body(status: StatusCode, body: impl Into<Bytes>) -> Exit {
        Exit {
            status,
            body: Some(body.into()),
            headers: Vec::new(),
        }
    }

    /// An exit with `{"error_msg":"<msg>"}\n`, encoded as APISIX's cjson does (no `/` escaping).
    pub fn error_msg(status: StatusCode, msg: &str) -> Exit {
        let mut body = String::with_capacity(msg.len() + 16);
        body.push_str("{\"error_msg\":");
        body.push_str(&ferrisix_config::schema::lua::cjson_encode(&Value::String(
            msg.to_owned(),
        )));
        body.push_str("}\n");
        Exit::body(status, body)
    }

    /// Adds a header to the answer.
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Exit {
        self.headers.push((name, value));
        self
    }

    /// The rejection most plugins configure: `rejected_code` (default `default_code`) with
    /// `rejected_msg` as `{"error_msg": ...}`, or nginx's page without a message.
    pub fn rejection(conf: &Map<String, Value>, default_code: u16) -> Result<Exit, String> {
        let code = conf
            .get("rejected_code")
            .and_then(Value::as_u64)
            .unwrap_or(u64::from(default_code));
        let code = u16::try_from(code)
            .ok()
            .and_then(|c| StatusCode::from_u16(c).ok())
            .ok_or_else(|| format!("invalid rejected_code {code}"))?;
        Ok(match conf.get("rejected_msg").and_then(Value::as_str) {
            Some(msg) => Exit::error_msg(code, msg),
            None => Exit::status(code),
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn error_msg_body_keeps_slashes() {
        let e = Exit::error_msg(StatusCode::TOO_MANY_REQUESTS, "a/b \"q\"");
        assert_eq!(e.body.unwrap(), "{\"error_msg\":\"a/b \\\"q\\\"\"}\n");
        assert_eq!(Exit::status(StatusCode::NOT_FOUND).body, None);
    }

    #[test]
    fn rejections() {
        let conf = json!({"rejected_code": 429, "rejected_msg": "slow"});
        let e = Exit::rejection(conf.as_object().unwrap(), 503).unwrap();
        assert_eq!(e.status, 429);
        assert_eq!(e.body.unwrap(), "{\"error_msg\":\"slow\"}\n");
        let e = Exit::rejection(&Map::new(), 503).unwrap();
        assert_eq!((e.status.as_u16(), e.body), (503, None));
        assert!(Exit::rejection(json!({"rejected_code": 1000}).as_object().unwrap(), 503).is_err());
    }
}
