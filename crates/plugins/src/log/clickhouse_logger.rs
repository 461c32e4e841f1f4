//! clickhouse-logger (`apisix/plugins/clickhouse-logger.lua`): batches inserted over
//! ClickHouse's HTTP interface, `INSERT INTO <logtable> FORMAT JSONEachRow` followed by the
//! entries (space-separated), with `X-ClickHouse-User`/`-Key`/`-Database`, to `endpoint_addr`
//! or one of `endpoint_addrs` picked at random per batch. `https` endpoints are not built
//! (the plugin HTTP client speaks plain HTTP): their batches fail with that error.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, LogCtx, LogNeeds, Phases, Plugin, PluginDef, PluginServices,
};
use http::{header, HeaderValue, Request, Uri};
use rand::Rng;
use serde_json::{json, Map, Value};

use super::batch_processor::{self, BatchSink, SendError, SendFuture};
use super::log_entry;
use super::logger::{encode_batch, Concat, Logger};

pub const NAME: &str = "clickhouse-logger";

pub static DEF: PluginDef = PluginDef {
    metadata_schema: Some(metadata_schema),
    check: Some(check),
    encrypt_fields: &["password"],
    ..PluginDef::new(NAME, 398, schema, compile)
};

fn uri_def() -> Value {
    json!({"type": "string", "pattern": r"^[^\/]+:\/\/([\da-zA-Z.-]+|\[[\da-fA-F:]+\])(:\d+)?"})
}

fn schema() -> Value {
    let mut props = Map::new();
    props.insert("endpoint_addr".into(), uri_def());
    props.insert(
        "endpoint_addrs".into(),
        json!({"items": uri_def(), "type": "array", "minItems": 1}),
    );
    for k in ["user", "password", "database", "logtable"] {
        props.insert(k.into(), json!({"type": "string", "default": ""}));
    }
    props.insert(
        "timeout".into(),
        json!({"type": "integer", "minimum": 1, "default": 3}),
    );
    props.insert(
        "name".into(),
        json!({"type": "string", "default": "clickhouse logger"}),
    );
    props.insert(
        "ssl_verify".into(),
        json!({"type": "boolean", "default": true}),
    );
    props.extend(log_entry::entry_properties());
    batch_processor::wrap_schema(
        json!({
            "type": "object",
            "properties": props,
            "oneOf": [
                {"required": ["endpoint_addr", "user", "password", "database", "logtable"]},
                {"required": ["endpoint_addrs", "user", "password", "database", "logtable"]}
            ]
        }),
        "clickhouse logger",
    )
}

fn metadata_schema() -> Value {
    batch_processor::wrap_metadata_schema(log_entry::metadata_schema())
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    cx.schema_result.clone()?;
    log_entry::check(cx.conf)
}

struct ClickHouseSink {
    endpoints: Vec<Uri>,
    logtable: String,
    headers: Vec<(&'static str, HeaderValue)>,
    timeout: Duration,
    services: Weak<PluginServices>,
}

impl ClickHouseSink {
    async fn insert(&self, rows: Bytes) -> Result<(), SendError> {
        let Some(services) = self.services.upgrade() else {
            return Err(SendError::new("the gateway is gone"));
        };
        let uri = &self.endpoints[rand::thread_rng().gen_range(0..self.endpoints.len())];
        let host = uri.host().unwrap_or("").to_owned();
        let port = uri.port_u16().unwrap_or(80);
        let mut body = BytesMut::with_capacity(rows.len() + self.logtable.len() + 40);
        body.put_slice(b"INSERT INTO ");
        body.put_slice(self.logtable.as_bytes());
        body.put_slice(b" FORMAT JSONEachRow ");
        body.put_slice(&rows);
        let mut req = Request::post(uri.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::HOST, host.as_str());
        for (k, v) in &self.headers {
            req = req.header(*k, v.clone());
        }
        let req = req
            .body(body.freeze())
            .map_err(|e| SendError::new(format!("invalid request: {e}")))?;
        match services.http().send(req, self.timeout).await {
            Ok(r) if r.status().as_u16() >= 400 => Err(SendError::new(format!(
                "server returned status code[{}] host[{host}] port[{port}] body[{}]",
                r.status().as_u16(),
                String::from_utf8_lossy(r.body())
            ))),
            Ok(_) => Ok(()),
            Err(e) => Err(SendError::new(format!(
                "error while sending data to [{host}] port[{port}] {e}"
            ))),
        }
    }
}

impl BatchSink for ClickHouseSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], batch_max_size: usize) -> SendFuture<'a> {
        Box::pin(self.insert(encode_batch(entries, batch_max_size, Concat::Space)))
    }
}

struct ClickHouseLogger(Logger);

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let services = cx.services;
    let logger = Logger::compile(cx, NAME, false, |conf| {
        let text = |k: &str| conf.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        let endpoints: Vec<Uri> = match conf.get("endpoint_addr").and_then(Value::as_str) {
            Some(one) => vec![one],
            None => conf
                .get("endpoint_addrs")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect(),
        }
        .into_iter()
        .map(|u| u.parse::<Uri>().map_err(|e| format!("invalid endpoint {u}: {e}")))
        .collect::<Result<_, _>>()?;
        if endpoints.is_empty() {
            return Err("clickhouse-logger needs an endpoint".into());
        }
        let mut headers = Vec::new();
        for (name, field) in [
            ("x-clickhouse-user", "user"),
            ("x-clickhouse-key", "password"),
            ("x-clickhouse-database", "database"),
        ] {
            let v = HeaderValue::from_str(&text(field))
                .map_err(|_| format!("invalid {field}: not a header value"))?;
            headers.push((name, v));
        }
        Ok(Arc::new(ClickHouseSink {
            endpoints,
            logtable: text("logtable"),
            headers,
            timeout: Duration::from_secs(conf.get("timeout").and_then(Value::as_u64).unwrap_or(3)),
            services: Arc::downgrade(services),
        }) as Arc<dyn BatchSink>)
    })?;
    Ok(Arc::new(ClickHouseLogger(logger)))
}

impl Plugin for ClickHouseLogger {
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
    use ferrisix_config::validate::PluginCheck;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::testing::Compiler;

    /// ClickHouse's HTTP interface, as far as inserts go: answers 200 to each POST and hands
    /// over its head and body.
    async fn clickhouse() -> (u16, tokio::sync::mpsc::UnboundedReceiver<(String, String)>) {
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
                        let body = String::from_utf8_lossy(&req[end + 4..]).into_owned();
                        tx.send((head, body)).unwrap();
                        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
                    }
                });
            }
        });
        (port, rx)
    }

    #[tokio::test]
    async fn rows_are_inserted_as_json_each_row() {
        let (port, mut rx) = clickhouse().await;
        let c = Compiler::new();
        let conf = json!({"endpoint_addrs": [format!("http://127.0.0.1:{port}")], "user": "default",
            "password": "pw", "database": "logs", "logtable": "t", "batch_max_size": 2,
            "log_format": {"s": "$status"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "ch-1", None)).unwrap();
        for status in [200, 500] {
            p.log(&LogCtx {
                status,
                ..Default::default()
            });
        }
        let (head, body) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(head.starts_with("post / http/1.1"), "{head}");
        assert!(head.contains("x-clickhouse-user: default"));
        assert!(head.contains("x-clickhouse-key: pw"));
        assert!(head.contains("x-clickhouse-database: logs"));
        assert_eq!(body, "INSERT INTO t FORMAT JSONEachRow {\"s\":\"200\"} {\"s\":\"500\"}");
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        assert!(r
            .check(NAME, &json!({"endpoint_addr": "http://127.0.0.1:8123", "user": "u",
                "password": "p", "database": "d", "logtable": "t"}))
            .is_ok());
        // user, password, database and logtable have defaults; an endpoint has none.
        assert!(r.check(NAME, &json!({"user": "u"})).is_err());
        assert_eq!(r.get(NAME).unwrap().priority, 398);
    }
}
