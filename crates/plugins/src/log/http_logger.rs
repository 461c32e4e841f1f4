//! http-logger (`apisix/plugins/http-logger.lua`): batches of entries POSTed to `uri`, as a
//! JSON array (`concat_method` `json`; a lone object when `batch_max_size` is 1) or one entry
//! a line (`new_line`, `text/plain`), with `auth_header` as `Authorization` and `timeout`
//! seconds for the whole call. An answer of 400 or more fails the batch (retried as the batch
//! processor says).
//!
//! `https` URIs pass the schema, but the plugin HTTP client speaks plain HTTP only: their
//! batches fail with that error (`ssl_verify` has nothing to act on yet).

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, HttpError, LogCtx, LogNeeds, Phases, Plugin, PluginDef, PluginServices,
};
use http::{header, HeaderValue, Request, Uri};
use serde_json::{json, Map, Value};

use super::batch_processor::{self, BatchSink, SendError, SendFuture};
use super::log_entry;
use super::logger::{encode_batch, Concat, Logger};

pub const NAME: &str = "http-logger";

pub static DEF: PluginDef = PluginDef {
    metadata_schema: Some(metadata_schema),
    check: Some(check),
    encrypt_fields: &["auth_header"],
    ..PluginDef::new(NAME, 410, schema, compile)
};

fn schema() -> Value {
    let mut props = Map::new();
    props.insert(
        "uri".into(),
        json!({"type": "string", "pattern": r"^[^\/]+:\/\/([\da-zA-Z.-]+|\[[\da-fA-F:]+\])(:\d+)?"}),
    );
    props.insert("auth_header".into(), json!({"type": "string"}));
    props.insert(
        "timeout".into(),
        json!({"type": "integer", "minimum": 1, "default": 3}),
    );
    props.extend(log_entry::entry_properties());
    props.insert(
        "concat_method".into(),
        json!({"type": "string", "default": "json", "enum": ["json", "new_line"]}),
    );
    props.insert(
        "ssl_verify".into(),
        json!({"type": "boolean", "default": false}),
    );
    batch_processor::wrap_schema(
        json!({"type": "object", "properties": props, "required": ["uri"]}),
        "http logger",
    )
}

fn metadata_schema() -> Value {
    batch_processor::wrap_metadata_schema(log_entry::metadata_schema())
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    cx.schema_result.clone()?;
    log_entry::check(cx.conf)
}

/// POSTs batches to one URI.
struct HttpSink {
    uri: Uri,
    host: String,
    port: u16,
    host_header: Option<HeaderValue>,
    content_type: HeaderValue,
    auth: Option<HeaderValue>,
    timeout: Duration,
    concat: Concat,
    /// Weak: the services hold this sink (through the processor's state).
    services: Weak<PluginServices>,
}

impl HttpSink {
    fn new(conf: &Map<String, Value>, services: &Arc<PluginServices>) -> Result<HttpSink, String> {
        let text = conf.get("uri").and_then(Value::as_str).unwrap_or("");
        let uri: Uri = text
            .parse()
            .map_err(|e| format!("invalid uri {text}: {e}"))?;
        let host = uri.host().unwrap_or("").to_owned();
        let port = uri
            .port_u16()
            .unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
        let concat = match conf.get("concat_method").and_then(Value::as_str) {
            Some("new_line") => Concat::NewLine,
            _ => Concat::Json,
        };
        Ok(HttpSink {
            host_header: HeaderValue::from_str(&host).ok(),
            host,
            port,
            uri,
            content_type: HeaderValue::from_static(match concat {
                Concat::Json => "application/json",
                Concat::NewLine | Concat::Space => "text/plain",
            }),
            auth: conf
                .get("auth_header")
                .and_then(Value::as_str)
                .and_then(|a| HeaderValue::from_str(a).ok()),
            timeout: Duration::from_secs(conf.get("timeout").and_then(Value::as_u64).unwrap_or(3)),
            concat,
            services: Arc::downgrade(services),
        })
    }

    async fn post(&self, body: Bytes) -> Result<(), SendError> {
        let Some(services) = self.services.upgrade() else {
            return Err(SendError::new("the gateway is gone"));
        };
        let mut req = Request::post(self.uri.clone());
        if let Some(h) = &self.host_header {
            req = req.header(header::HOST, h.clone());
        }
        req = req.header(header::CONTENT_TYPE, self.content_type.clone());
        if let Some(a) = &self.auth {
            req = req.header(header::AUTHORIZATION, a.clone());
        }
        let req = req
            .body(body)
            .map_err(|e| SendError::new(format!("invalid request: {e}")))?;
        let (host, port) = (&self.host, self.port);
        match services.http().send(req, self.timeout).await {
            Ok(resp) if resp.status().as_u16() >= 400 => Err(SendError::new(format!(
                "server returned status code[{}] host[{host}] port[{port}] body[{}]",
                resp.status().as_u16(),
                String::from_utf8_lossy(resp.body())
            ))),
            Ok(_) => Ok(()),
            Err(HttpError::Connect(e)) => Err(SendError::new(format!(
                "failed to connect to host[{host}] port[{port}] {e}"
            ))),
            Err(e) => Err(SendError::new(format!(
                "error while sending data to [{host}] port[{port}] {e}"
            ))),
        }
    }
}

impl BatchSink for HttpSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], batch_max_size: usize) -> SendFuture<'a> {
        Box::pin(self.post(encode_batch(entries, batch_max_size, self.concat)))
    }
}

struct HttpLogger(Logger);

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let services = cx.services;
    let logger = Logger::compile(cx, NAME, true, |conf| {
        Ok(Arc::new(HttpSink::new(conf, services)?) as Arc<dyn BatchSink>)
    })?;
    Ok(Arc::new(HttpLogger(logger)))
}

impl Plugin for HttpLogger {
    fn phases(&self) -> Phases {
        Phases::LOG
    }

    fn log_needs(&self) -> LogNeeds {
        self.0.needs()
    }

    fn log(&self, ctx: &LogCtx) {
        self.0.log(ctx);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::LogVars;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::testing::Compiler;

    /// A one-connection-at-a-time HTTP sink answering `status`; records request heads+bodies.
    async fn sink(status: u16) -> (u16, Arc<Mutex<Vec<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let record = record.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 8192];
                    loop {
                        let n = s.read(&mut chunk).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                            continue;
                        };
                        let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length: "))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        if buf.len() < end + 4 + len {
                            continue;
                        }
                        let req: Vec<u8> = buf.drain(..end + 4 + len).collect();
                        record.lock().unwrap().push(String::from_utf8_lossy(&req).into_owned());
                        let answer = format!("HTTP/1.1 {status} X\r\ncontent-length: 2\r\n\r\nok");
                        let _ = s.write_all(answer.as_bytes()).await;
                    }
                });
            }
        });
        (port, seen)
    }

    fn log_ctx(p: &dyn Plugin, n: usize) -> LogCtx {
        struct V(String);
        impl ferrisix_router::VarSource for V {
            fn var(&self, name: &str) -> Option<std::borrow::Cow<'_, str>> {
                match name {
                    "route_id" => Some("r1".into()),
                    "request_uri" => Some(std::borrow::Cow::Borrowed(&self.0)),
                    _ => None,
                }
            }
        }
        LogCtx {
            status: 200,
            vars: LogVars::capture(p.log_needs().vars.unwrap(), &V(format!("/x?n={n}"))),
            ..Default::default()
        }
    }

    async fn wait_for(seen: &Mutex<Vec<String>>, n: usize) {
        for _ in 0..200 {
            if seen.lock().unwrap().len() >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the sink got {} requests, not {n}", seen.lock().unwrap().len());
    }

    #[tokio::test]
    async fn batches_arrive_as_json_arrays_with_auth() {
        let (port, seen) = sink(200).await;
        let c = Compiler::new();
        let conf = json!({"uri": format!("http://127.0.0.1:{port}/log?a=1"), "batch_max_size": 2,
            "auth_header": "Basic x"});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "hl-1", None)).unwrap();
        for n in 0..4 {
            p.log(&log_ctx(&*p, n));
        }
        wait_for(&seen, 2).await;
        let reqs = seen.lock().unwrap().clone();
        assert!(reqs[0].starts_with("POST /log?a=1 HTTP/1.1\r\n"), "{}", reqs[0]);
        let lower = reqs[0].to_lowercase();
        assert!(lower.contains("content-type: application/json"));
        assert!(lower.contains("authorization: basic x"));
        assert!(lower.contains("host: 127.0.0.1\r\n"));
        let body = reqs[0].split("\r\n\r\n").nth(1).unwrap();
        let v: Value = serde_json::from_str(body).unwrap();
        assert_eq!(v[0]["request"]["uri"], "/x?n=0");
        assert_eq!(v[1]["request"]["querystring"]["n"], "1");
        assert_eq!(v[0]["route_id"], "r1");
    }

    #[tokio::test]
    async fn a_failing_sink_is_retried() {
        let (port, seen) = sink(500).await;
        let c = Compiler::new();
        let conf = json!({"uri": format!("http://127.0.0.1:{port}/"), "batch_max_size": 1,
            "max_retry_count": 1, "retry_delay": 0, "concat_method": "new_line"});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "hl-2", None)).unwrap();
        p.log(&log_ctx(&*p, 0));
        wait_for(&seen, 2).await;
        let reqs = seen.lock().unwrap().clone();
        assert!(reqs[0].to_lowercase().contains("content-type: text/plain"));
        let body = reqs[0].split("\r\n\r\n").nth(1).unwrap();
        assert!(body.starts_with('{'), "a lone entry: {body}");
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
        assert_eq!(r.get(NAME).unwrap().schema["properties"]["name"]["default"], "http logger");
    }
}
