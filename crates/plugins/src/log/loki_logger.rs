//! loki-logger (`apisix/plugins/loki-logger.lua`): batches pushed to Loki's
//! `endpoint_uri` (default `/loki/api/v1/push`) on one of `endpoint_addrs` picked at random,
//! as `{"streams": [{"stream": labels, "values": [[ns, line], ...]}]}`: entries with the same
//! labels (`log_labels`, `$var`s resolved per request) share a stream, each line is the
//! entry's JSON and its time the request's start in nanoseconds. `tenant_id` goes as
//! `X-Scope-OrgID`, `headers` with it; `timeout` in milliseconds. The plugin HTTP client
//! keeps its own connections alive (`keepalive*` are accepted; the pool is the client's).
//! `https` endpoints are not built: their batches fail with that error.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, LogCtx, LogNeeds, Phases, Plugin, PluginDef, PluginServices, Template,
};
use http::{HeaderName, HeaderValue, Request};
use rand::Rng;
use serde_json::{json, Map, Value};

use super::batch_processor::{self, BatchSink, SendError, SendFuture};
use super::log_entry;
use super::logger::Logger;

pub const NAME: &str = "loki-logger";

pub static DEF: PluginDef = PluginDef {
    metadata_schema: Some(metadata_schema),
    check: Some(check),
    encrypt_fields: &["headers"],
    ..PluginDef::new(NAME, 414, schema, compile)
};

fn schema() -> Value {
    let mut props = Map::new();
    let strings = json!({"type": "object", "patternProperties": {".*": {"type": "string", "minLength": 1}}});
    props.insert(
        "endpoint_addrs".into(),
        json!({"type": "array", "minItems": 1,
            "items": {"type": "string", "pattern": r"^[^\/]+:\/\/([\da-zA-Z.-]+|\[[\da-fA-F:]+\])(:\d+)?"}}),
    );
    props.insert(
        "endpoint_uri".into(),
        json!({"type": "string", "minLength": 1, "default": "/loki/api/v1/push"}),
    );
    props.insert("tenant_id".into(), json!({"type": "string", "default": "fake"}));
    props.insert("headers".into(), strings.clone());
    let mut labels = strings;
    labels["default"] = json!({"job": "apisix"});
    props.insert("log_labels".into(), labels);
    props.insert("ssl_verify".into(), json!({"type": "boolean", "default": false}));
    props.insert(
        "timeout".into(),
        json!({"type": "integer", "minimum": 1, "maximum": 60000, "default": 3000,
            "description": "timeout in milliseconds"}),
    );
    props.insert("keepalive".into(), json!({"type": "boolean", "default": true}));
    props.insert(
        "keepalive_timeout".into(),
        json!({"type": "integer", "minimum": 1000, "default": 60000,
            "description": "keepalive timeout in milliseconds"}),
    );
    props.insert(
        "keepalive_pool".into(),
        json!({"type": "integer", "minimum": 1, "default": 5}),
    );
    props.extend(log_entry::entry_properties());
    batch_processor::wrap_schema(
        json!({"type": "object", "properties": props, "required": ["endpoint_addrs"]}),
        "loki logger",
    )
}

fn metadata_schema() -> Value {
    batch_processor::wrap_metadata_schema(log_entry::metadata_schema())
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    cx.schema_result.clone()?;
    log_entry::check(cx.conf)
}

struct LokiSink {
    urls: Vec<String>,
    headers: Vec<(HeaderName, HeaderValue)>,
    timeout: Duration,
    services: Weak<PluginServices>,
}

/// Groups encoded entries (`{"labels", "time", "line"}`) into Loki streams.
fn push_body(entries: &[Bytes]) -> Value {
    let mut streams: Vec<(Value, Vec<Value>)> = Vec::new();
    for e in entries {
        let Ok(v) = serde_json::from_slice::<Value>(e) else {
            continue;
        };
        let labels = v.get("labels").cloned().unwrap_or(Value::Null);
        let value = json!([v["time"], v["line"]]);
        match streams.iter_mut().find(|(l, _)| *l == labels) {
            Some((_, values)) => values.push(value),
            None => streams.push((labels, vec![value])),
        }
    }
    json!({"streams": streams
        .into_iter()
        .map(|(stream, values)| json!({"stream": stream, "values": values}))
        .collect::<Vec<_>>()})
}

impl LokiSink {
    async fn push(&self, entries: &[Bytes]) -> Result<(), SendError> {
        let Some(services) = self.services.upgrade() else {
            return Err(SendError::new("the gateway is gone"));
        };
        let url = &self.urls[rand::thread_rng().gen_range(0..self.urls.len())];
        let mut req = Request::post(url.as_str());
        for (k, v) in &self.headers {
            req = req.header(k, v);
        }
        let body = lua::cjson_encode(&push_body(entries));
        let req = req
            .body(Bytes::from(body))
            .map_err(|e| SendError::new(format!("invalid request: {e}")))?;
        match services.http().send(req, self.timeout).await {
            Ok(r) if r.status().as_u16() >= 300 => Err(SendError::new(format!(
                "loki server returned status: {}, body: {}",
                r.status().as_u16(),
                String::from_utf8_lossy(r.body())
            ))),
            Ok(_) => Ok(()),
            Err(e) => Err(SendError::new(e.to_string())),
        }
    }
}

impl BatchSink for LokiSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], _: usize) -> SendFuture<'a> {
        Box::pin(self.push(entries))
    }
}

struct LokiLogger {
    logger: Logger,
    /// Name, template text, parsed template.
    labels: Vec<(String, String, Template)>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let services = cx.services;
    let filled = cx.filled();
    let labels: Vec<(String, String, Template)> = filled
        .get("log_labels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| {
            let text = v.as_str()?;
            Some((k.clone(), text.to_owned(), Template::parse(text)))
        })
        .collect();
    let label_vars: Vec<Box<str>> = labels
        .iter()
        .flat_map(|(_, _, t)| t.var_names())
        .map(Into::into)
        .collect();
    let logger = Logger::compile(cx, NAME, true, |conf| {
        let uri = conf
            .get("endpoint_uri")
            .and_then(Value::as_str)
            .unwrap_or("/loki/api/v1/push");
        let urls: Vec<String> = conf
            .get("endpoint_addrs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|a| format!("{a}{uri}"))
            .collect();
        if urls.is_empty() {
            return Err("loki-logger needs an endpoint".into());
        }
        let mut headers: Vec<(HeaderName, HeaderValue)> = conf
            .get("headers")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| {
                Some((
                    HeaderName::from_bytes(k.as_bytes()).ok()?,
                    HeaderValue::from_str(v.as_str()?).ok()?,
                ))
            })
            .collect();
        let tenant = conf.get("tenant_id").and_then(Value::as_str).unwrap_or("fake");
        headers.push((
            HeaderName::from_static("x-scope-orgid"),
            HeaderValue::from_str(tenant).map_err(|_| "invalid tenant_id".to_string())?,
        ));
        headers.push((
            HeaderName::from_static("content-type"),
            HeaderValue::from_static("application/json"),
        ));
        Ok(Arc::new(LokiSink {
            urls,
            headers,
            timeout: Duration::from_millis(
                conf.get("timeout").and_then(Value::as_u64).unwrap_or(3000),
            ),
            services: Arc::downgrade(services),
        }) as Arc<dyn BatchSink>)
    })?
    .with_vars(&label_vars);
    Ok(Arc::new(LokiLogger { logger, labels }))
}

impl Plugin for LokiLogger {
    fn phases(&self) -> Phases {
        Phases::LOG
    }

    fn log_needs(&self) -> LogNeeds {
        self.logger.needs()
    }

    fn log(&self, ctx: &LogCtx) {
        self.logger.log_with(ctx, |entry, now_ms| {
            let start_ms = now_ms.saturating_sub(ctx.request_time.as_millis() as u64);
            let mut labels = Map::new();
            for (k, text, t) in &self.labels {
                // A label none of whose variables resolved keeps its text, as APISIX's.
                let r = t.resolve(ctx);
                let v = if r.resolved > 0 { r.text } else { text.clone() };
                labels.insert(k.clone(), Value::String(v));
            }
            let line = lua::cjson_encode(&Value::Object(entry));
            Bytes::from(lua::cjson_encode(&json!({
                "labels": labels,
                "time": format!("{start_ms}000000"),
                "line": line,
            })))
        });
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::testing::Compiler;

    /// Loki's push API: answers 204 and hands over each pushed body.
    async fn loki() -> (u16, tokio::sync::mpsc::UnboundedReceiver<(String, Value)>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let tx = tx.clone();
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
                        let body: Value = serde_json::from_slice(&req[end + 4..]).unwrap();
                        tx.send((head, body)).unwrap();
                        let _ = s.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await;
                    }
                });
            }
        });
        (port, rx)
    }

    #[tokio::test]
    async fn entries_are_grouped_into_streams_by_labels() {
        let (port, mut rx) = loki().await;
        let c = Compiler::new();
        let conf = json!({"endpoint_addrs": [format!("http://127.0.0.1:{port}")], "tenant_id": "t1",
            "log_labels": {"job": "gw", "code": "$status"}, "batch_max_size": 3,
            "log_format": {"s": "$status"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "lk-1", None)).unwrap();
        for status in [200, 500, 200] {
            p.log(&LogCtx {
                status,
                ..Default::default()
            });
        }
        let (head, body) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(head.starts_with("post /loki/api/v1/push http/1.1"), "{head}");
        assert!(head.contains("x-scope-orgid: t1"));
        let streams = body["streams"].as_array().unwrap();
        assert_eq!(streams.len(), 2);
        assert_eq!(streams[0]["stream"], json!({"job": "gw", "code": "200"}));
        assert_eq!(streams[0]["values"].as_array().unwrap().len(), 2);
        let line: Value = serde_json::from_str(streams[1]["values"][0][1].as_str().unwrap()).unwrap();
        assert_eq!(line, json!({"s": "500", "route_id": "no-matched"}));
        assert!(streams[1]["values"][0][0].as_str().unwrap().ends_with("000000"));
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        assert!(r.check(NAME, &json!({"endpoint_addrs": ["http://127.0.0.1:3100"]})).is_ok());
        assert!(r.check(NAME, &json!({"endpoint_addrs": []})).is_err());
        assert_eq!(r.get(NAME).unwrap().priority, 414);
    }
}
