//! One batch as an HTTP request through the gateway's HTTP client (`http` or `https`, the
//! certificate checked as the conf's `ssl_verify` says).

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use ferrisix_plugin_api::{HttpError, KeepAlive, PluginServices};
use http::{HeaderName, HeaderValue, Request, Response};
use serde_json::{Map, Value};

use super::super::batch_processor::SendError;

/// Why a call got no answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallError {
    /// The gateway (its services) is gone: nothing to send with.
    Gone,
    /// The request could not be made (a header or URI the conf let through).
    Invalid(String),
    Http(HttpError),
}

impl CallError {
    /// The batch's error: `prefix` before the client's own words.
    pub fn into_send_error(self, prefix: &str) -> SendError {
        match self {
            CallError::Gone => SendError::new("the gateway is gone"),
            CallError::Invalid(e) => SendError::new(format!("invalid request: {e}")),
            CallError::Http(e) => SendError::new(format!("{prefix}{e}")),
        }
    }
}

/// A log server reached over HTTP.
pub struct HttpTarget {
    /// Weak: the services hold the sink (through the processor's state).
    services: Weak<PluginServices>,
    timeout: Duration,
    ssl_verify: bool,
    /// Sent with every request.
    headers: Vec<(HeaderName, HeaderValue)>,
    /// How a connection is kept between batches; `None`: one connection per batch.
    keepalive: Option<KeepAlive>,
}

impl HttpTarget {
    pub fn new(
        services: &Arc<PluginServices>,
        timeout: Duration,
        ssl_verify: bool,
        headers: Vec<(HeaderName, HeaderValue)>,
    ) -> HttpTarget {
        HttpTarget {
            services: Arc::downgrade(services),
            timeout,
            ssl_verify,
            headers,
            keepalive: Some(KeepAlive::default()),
        }
    }

    /// The connections kept as `keepalive`, `keepalive_timeout` (milliseconds) and
    /// `keepalive_pool` of `conf` say (loki-logger's and lago's keys; splunk's `endpoint` has
    /// the timeout alone), each optional: true, 60000 and `default_pool`.
    pub fn with_keepalive_of(
        mut self,
        conf: &Map<String, Value>,
        default_pool: usize,
    ) -> HttpTarget {
        self.keepalive = KeepAlive::of_conf(conf, default_pool);
        self
    }

    /// A request to `uri` carrying the target's headers; `method` POST or GET.
    pub fn request(&self, method: http::Method, uri: &str) -> http::request::Builder {
        self.headers
            .iter()
            .fold(Request::builder().method(method).uri(uri), |b, (k, v)| {
                b.header(k, v)
            })
    }

    /// Sends `req` (`builder` and `body`): the answer, whatever its status.
    pub async fn call(
        &self,
        builder: http::request::Builder,
        body: Bytes,
    ) -> Result<Response<Bytes>, CallError> {
        let services = self.services.upgrade().ok_or(CallError::Gone)?;
        let req = builder
            .body(body)
            .map_err(|e| CallError::Invalid(e.to_string()))?;
        services
            .http()
            .send_kept(req, self.timeout, self.ssl_verify, self.keepalive)
            .await
            .map_err(CallError::Http)
    }
}

/// `status code[..] ... body[..]`'s parts of an answer: its status and its body as text.
pub fn status_and_body(resp: &Response<Bytes>) -> (u16, std::borrow::Cow<'_, str>) {
    (resp.status().as_u16(), String::from_utf8_lossy(resp.body()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(conf: serde_json::Value, default_pool: usize) -> Option<KeepAlive> {
        let services = Arc::new(PluginServices::default());
        HttpTarget::new(&services, Duration::from_secs(1), true, Vec::new())
            .with_keepalive_of(conf.as_object().unwrap(), default_pool)
            .keepalive
    }

    /// lago's and loki-logger's `keepalive*` keys, splunk's `endpoint.keepalive_timeout`.
    #[test]
    fn keepalive_options() {
        use serde_json::json;
        assert_eq!(
            kept(json!({}), 5),
            Some(KeepAlive {
                idle: Duration::from_secs(60),
                pool: 5
            })
        );
        assert_eq!(
            kept(json!({"keepalive_timeout": 1000, "keepalive_pool": 2}), 5),
            Some(KeepAlive {
                idle: Duration::from_secs(1),
                pool: 2
            })
        );
        assert_eq!(
            kept(json!({"keepalive": false, "keepalive_timeout": 1000}), 5),
            None
        );
        assert_eq!(
            kept(json!({"keepalive_timeout": 3000}), 30),
            Some(KeepAlive {
                idle: Duration::from_secs(3),
                pool: 30
            })
        );
    }
}
