//! http-logger (`apisix/plugins/http-logger.lua`): batches of entries POSTed to `uri`, as a
//! JSON array (`concat_method` `json`; a lone object when `batch_max_size` is 1) or one entry
//! a line (`new_line`, `text/plain`), with `auth_header` as `Authorization` and `timeout`
//! seconds for the whole call. An `https` URI is TLS, the server's certificate checked when
//! `ssl_verify` (against the gateway's trusted CA bundle). An answer of 400 or more fails the
//! batch (retried as the batch processor says).

use std::sync::Arc;

use bytes::Bytes;
use ferrisix_plugin_api::{CompileCtx, HttpError, Plugin, PluginDef, PluginServices};
use http::{header, HeaderValue, Method, Uri};
use serde_json::{json, Map, Value};

use super::sink::http::{status_and_body, CallError, HttpTarget};
use super::sink::{self, conf, encode_batch, BatchSink, Concat, Logger, SendError, SendFuture};

pub const NAME: &str = "http-logger";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &["auth_header"],
    ..sink::def(NAME, 410, schema, compile)
};

fn schema() -> Value {
    sink::schema(
        json!({
            "type": "object",
            "properties": {
                "uri": {"type": "string", "pattern": r"^[^\/]+:\/\/([\da-zA-Z.-]+|\[[\da-fA-F:]+\])(:\d+)?"},
                "auth_header": {"type": "string"},
                "timeout": {"type": "integer", "minimum": 1, "default": 3},
                "concat_method": {"type": "string", "default": "json", "enum": ["json", "new_line"]},
                "ssl_verify": {"type": "boolean", "default": false}
            },
            "required": ["uri"]
        }),
        "http logger",
    )
}

/// POSTs batches to one URI.
struct HttpSink {
    uri: String,
    host: String,
    port: u16,
    concat: Concat,
    target: HttpTarget,
}

impl HttpSink {
    fn new(conf: &Map<String, Value>, services: &Arc<PluginServices>) -> Result<HttpSink, String> {
        let text = conf::text(conf, "uri");
        let uri: Uri = text
            .parse()
            .map_err(|e| format!("invalid uri {text}: {e}"))?;
        let host = uri.host().unwrap_or("").to_owned();
        let port = uri
            .port_u16()
            .unwrap_or(if uri.scheme_str() == Some("https") {
                443
            } else {
                80
            });
        let concat = match conf.get("concat_method").and_then(Value::as_str) {
            Some("new_line") => Concat::NewLine,
            _ => Concat::Json,
        };
        let mut headers = Vec::new();
        if let Ok(h) = HeaderValue::from_str(&host) {
            headers.push((header::HOST, h));
        }
        headers.push((
            header::CONTENT_TYPE,
            HeaderValue::from_static(match concat {
                Concat::Json => "application/json",
                Concat::NewLine | Concat::Space => "text/plain",
            }),
        ));
        if let Some(a) = conf
            .get("auth_header")
            .and_then(Value::as_str)
            .and_then(|a| HeaderValue::from_str(a).ok())
        {
            headers.push((header::AUTHORIZATION, a));
        }
        Ok(HttpSink {
            uri: uri.to_string(),
            host,
            port,
            concat,
            target: HttpTarget::new(
                services,
                conf::secs(conf, "timeout", 3),
                conf::flag(conf, "ssl_verify"),
                headers,
            ),
        })
    }

    async fn post(&self, body: Bytes) -> Result<(), SendError> {
        let (host, port) = (&self.host, self.port);
        match self
            .target
            .call(self.target.request(Method::POST, &self.uri), body)
            .await
        {
            Ok(resp) if resp.status().as_u16() >= 400 => {
                let (status, body) = status_and_body(&resp);
                Err(SendError::new(format!(
                    "server returned status code[{status}] host[{host}] port[{port}] body[{body}]"
                )))
            }
            Ok(_) => Ok(()),
            Err(CallError::Http(HttpError::Connect(e))) => Err(SendError::new(format!(
                "failed to connect to host[{host}] port[{port}] {e}"
            ))),
            Err(CallError::Http(HttpError::Tls(e))) => Err(SendError::new(format!(
                "failed to perform SSL with host[{host}] port[{port}] {e}"
            ))),
            Err(e) => Err(e.into_send_error(&format!(
                "error while sending data to [{host}] port[{port}] "
            ))),
        }
    }
}

impl BatchSink for HttpSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], batch_max_size: usize) -> SendFuture<'a> {
        Box::pin(self.post(encode_batch(entries, batch_max_size, self.concat)))
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let services = cx.services;
    let logger = Logger::compile(cx, NAME, true, |conf| {
        Ok(Arc::new(HttpSink::new(conf, services)?) as Arc<dyn BatchSink>)
    })?;
    Ok(logger.into_plugin())
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;

    use super::*;
    use crate::log::sink::testing::{
        answer, http_server, https_server, log_ctx, next, test_ca, Captured,
    };
    use crate::testing::Compiler;

    fn ok(_: &Captured) -> Vec<u8> {
        answer(200, "ok")
    }

    #[tokio::test]
    async fn batches_arrive_as_json_arrays_with_auth() {
        let (port, mut rx) = http_server(ok).await;
        let c = Compiler::new();
        let conf = json!({"uri": format!("http://127.0.0.1:{port}/log?a=1"), "batch_max_size": 2,
            "auth_header": "Basic x"});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "hl-1", None)).unwrap();
        for n in 0..4 {
            p.log(&log_ctx(&*p, n));
        }
        let req = next(&mut rx).await;
        next(&mut rx).await;
        assert!(
            req.head.starts_with("POST /log?a=1 HTTP/1.1\r\n"),
            "{}",
            req.head
        );
        let lower = req.lower();
        assert!(lower.contains("content-type: application/json"));
        assert!(lower.contains("authorization: basic x"));
        assert!(lower.contains("host: 127.0.0.1\r\n"));
        let v: Value = serde_json::from_slice(&req.body).unwrap();
        assert_eq!(v[0]["request"]["uri"], "/x?n=0");
        assert_eq!(v[1]["request"]["querystring"]["n"], "1");
        assert_eq!(v[0]["route_id"], "r1");
    }

    #[tokio::test]
    async fn a_failing_sink_is_retried() {
        fn failing(_: &Captured) -> Vec<u8> {
            answer(500, "no")
        }
        let (port, mut rx) = http_server(failing).await;
        let c = Compiler::new();
        let conf = json!({"uri": format!("http://127.0.0.1:{port}/"), "batch_max_size": 1,
            "max_retry_count": 1, "retry_delay": 0, "concat_method": "new_line"});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "hl-2", None)).unwrap();
        p.log(&log_ctx(&*p, 0));
        let req = next(&mut rx).await;
        next(&mut rx).await;
        assert!(req.lower().contains("content-type: text/plain"));
        assert!(req.text().starts_with('{'), "a lone entry: {}", req.text());
    }

    fn sink_of(services: &Arc<PluginServices>, conf: Value) -> HttpSink {
        HttpSink::new(conf.as_object().unwrap(), services).unwrap()
    }

    #[tokio::test]
    async fn https_with_and_without_verification() {
        let (port, mut rx) = https_server(ok).await;
        let uri = format!("https://127.0.0.1:{port}/tls");
        // Verification off: the test certificate is accepted.
        let services = Arc::new(PluginServices::default());
        let plain = sink_of(&services, json!({"uri": uri, "ssl_verify": false}));
        plain.post(Bytes::from_static(b"{\"a\":1}")).await.unwrap();
        let req = next(&mut rx).await;
        assert!(req.head.starts_with("POST /tls HTTP/1.1"), "{}", req.head);
        assert_eq!(req.text(), "{\"a\":1}");
        // Verification on against the system's bundle: the test CA is not in it.
        let verified = sink_of(&services, json!({"uri": uri, "ssl_verify": true}));
        let err = verified.post(Bytes::from_static(b"{}")).await.unwrap_err();
        assert!(
            err.message.starts_with(&format!(
                "failed to perform SSL with host[127.0.0.1] port[{port}] "
            )),
            "{}",
            err.message
        );
        assert!(err.message.contains("certificate"), "{}", err.message);
        // Verification on against a bundle holding the test CA (`ssl_trusted_certificate`).
        let trusting = Arc::new(PluginServices::default().with_tls_roots(test_ca()));
        let verified = sink_of(&trusting, json!({"uri": uri, "ssl_verify": true}));
        verified.post(Bytes::from_static(b"{}")).await.unwrap();
        assert_eq!(next(&mut rx).await.text(), "{}");
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        let err = |c: Value| r.check(NAME, &c).unwrap_err();
        assert_eq!(err(json!({"batch_max_size": 1})), "failed to check the configuration of plugin http-logger err: property \"uri\" is required");
        assert_eq!(err(json!({"uri": "http://127.0.0.1/x", "concat_method": "csv"})), "failed to check the configuration of plugin http-logger err: property \"concat_method\" validation failed: matches none of the enum values");
        assert_eq!(err(json!({"uri": "http://127.0.0.1/x", "batch_max_size": 0})), "failed to check the configuration of plugin http-logger err: property \"batch_max_size\" validation failed: expected 0 to be at least 1");
        assert_eq!(
            r.check_metadata(NAME, &json!({"log_format": "'$host'"})),
            Err("invalid configuration: property \"log_format\" validation failed: wrong type: expected object, got string".into())
        );
        assert!(r.check(NAME, &json!({"uri": "127.0.0.1"})).is_err());
        assert_eq!(r.get(NAME).unwrap().priority, 410);
        assert_eq!(
            r.get(NAME).unwrap().schema["properties"]["name"]["default"],
            "http logger"
        );
    }
}
