//! tcp-logger (`apisix/plugins/tcp-logger.lua`): each batch written on a new TCP connection
//! to `host:port` (a JSON array; a lone object when `batch_max_size` is 1), then closed;
//! `timeout` (milliseconds) bounds the connect and the write.
//!
//! `tls` (and `tls_options`) pass the schema but TLS to the log server is not built: such
//! batches fail with that error.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_plugin_api::{CheckCtx, CompileCtx, LogCtx, LogNeeds, Phases, Plugin, PluginDef};
use serde_json::{json, Map, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::batch_processor::{self, BatchSink, SendError, SendFuture};
use super::log_entry;
use super::logger::{encode_batch, Concat, Logger};

pub const NAME: &str = "tcp-logger";

pub static DEF: PluginDef = PluginDef {
    metadata_schema: Some(metadata_schema),
    check: Some(check),
    ..PluginDef::new(NAME, 405, schema, compile)
};

fn schema() -> Value {
    let mut props = Map::new();
    props.insert("host".into(), json!({"type": "string"}));
    props.insert("port".into(), json!({"type": "integer", "minimum": 0}));
    props.insert("tls".into(), json!({"type": "boolean", "default": false}));
    props.insert("tls_options".into(), json!({"type": "string"}));
    props.insert(
        "timeout".into(),
        json!({"type": "integer", "minimum": 1, "default": 1000}),
    );
    props.extend(log_entry::entry_properties());
    batch_processor::wrap_schema(
        json!({"type": "object", "properties": props, "required": ["host", "port"]}),
        "tcp logger",
    )
}

fn metadata_schema() -> Value {
    batch_processor::wrap_metadata_schema(log_entry::metadata_schema())
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    cx.schema_result.clone()?;
    log_entry::check(cx.conf)
}

struct TcpSink {
    host: String,
    port: u16,
    tls: bool,
    timeout: Duration,
}

impl TcpSink {
    async fn write(&self, data: Bytes) -> Result<(), SendError> {
        let (host, port) = (&self.host, self.port);
        if self.tls {
            return Err(SendError::new(format!(
                "failed to perform TLS handshake to TCP server: host[{host}] port[{port}] err: TLS to log servers is not supported"
            )));
        }
        let mut stream = tokio::time::timeout(self.timeout, TcpStream::connect((host.as_str(), port)))
            .await
            .map_err(|_| "timeout".to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|e| {
                SendError::new(format!(
                    "failed to connect to TCP server: host[{host}] port[{port}] err: {e}"
                ))
            })?;
        let sent = tokio::time::timeout(self.timeout, async {
            stream.write_all(&data).await?;
            stream.shutdown().await
        })
        .await;
        match sent {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("timeout".into()),
        }
        .map_err(|e| {
            SendError::new(format!(
                "failed to send data to TCP server: host[{host}] port[{port}] err: {e}"
            ))
        })
    }
}

impl BatchSink for TcpSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], batch_max_size: usize) -> SendFuture<'a> {
        Box::pin(self.write(encode_batch(entries, batch_max_size, Concat::Json)))
    }
}

struct TcpLogger(Logger);

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let logger = Logger::compile(cx, NAME, false, |conf| {
        let port = conf.get("port").and_then(Value::as_u64).unwrap_or(0);
        Ok(Arc::new(TcpSink {
            host: conf
                .get("host")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            port: u16::try_from(port).map_err(|_| format!("invalid port {port}"))?,
            tls: conf.get("tls").and_then(Value::as_bool).unwrap_or(false),
            timeout: Duration::from_millis(
                conf.get("timeout").and_then(Value::as_u64).unwrap_or(1000),
            ),
        }) as Arc<dyn BatchSink>)
    })?;
    Ok(Arc::new(TcpLogger(logger)))
}

impl Plugin for TcpLogger {
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
    use tokio::io::AsyncReadExt;

    use super::*;
    use crate::testing::Compiler;

    #[tokio::test]
    async fn each_batch_on_its_own_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let c = Compiler::new();
        let meta = json!({"log_format": {"case": "meta", "code": "$status"}});
        let conf = json!({"host": "127.0.0.1", "port": port, "batch_max_size": 1});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "tl-1", Some(&meta))).unwrap();
        for status in [200, 404] {
            p.log(&LogCtx {
                status,
                ..Default::default()
            });
        }
        let mut got = Vec::new();
        for _ in 0..2 {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut text = String::new();
            s.read_to_string(&mut text).await.unwrap();
            got.push(serde_json::from_str::<Value>(&text).unwrap());
        }
        got.sort_by_key(|v| v["code"].as_str().unwrap().to_owned());
        assert_eq!(got, vec![json!({"case": "meta", "code": "200"}), json!({"case": "meta", "code": "404"})]);
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        assert_eq!(
            r.check(NAME, &json!({"host": "127.0.0.1"})),
            Err("failed to check the configuration of plugin tcp-logger err: property \"port\" is required".into())
        );
        assert!(r.check(NAME, &json!({"host": "127.0.0.1", "port": 1})).is_ok());
        assert_eq!(r.get(NAME).unwrap().priority, 405);
    }
}
