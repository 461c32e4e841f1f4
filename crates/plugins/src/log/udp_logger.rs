//! udp-logger (`apisix/plugins/udp-logger.lua`): each batch sent as one datagram to
//! `host:port` (a JSON array; a lone object when `batch_max_size` is 1); `timeout` seconds.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_plugin_api::{CheckCtx, CompileCtx, LogCtx, LogNeeds, Phases, Plugin, PluginDef};
use serde_json::{json, Map, Value};
use tokio::net::UdpSocket;

use super::batch_processor::{self, BatchSink, SendError, SendFuture};
use super::log_entry;
use super::logger::{encode_batch, Concat, Logger};

pub const NAME: &str = "udp-logger";

pub static DEF: PluginDef = PluginDef {
    metadata_schema: Some(metadata_schema),
    check: Some(check),
    ..PluginDef::new(NAME, 400, schema, compile)
};

fn schema() -> Value {
    let mut props = Map::new();
    props.insert("host".into(), json!({"type": "string"}));
    props.insert("port".into(), json!({"type": "integer", "minimum": 0}));
    props.insert(
        "timeout".into(),
        json!({"type": "integer", "minimum": 1, "default": 3}),
    );
    props.extend(log_entry::entry_properties());
    batch_processor::wrap_schema(
        json!({"type": "object", "properties": props, "required": ["host", "port"]}),
        "udp logger",
    )
}

fn metadata_schema() -> Value {
    batch_processor::wrap_metadata_schema(log_entry::metadata_schema())
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    cx.schema_result.clone()?;
    log_entry::check(cx.conf)
}

struct UdpSink {
    host: String,
    port: u16,
    timeout: Duration,
}

impl UdpSink {
    async fn datagram(&self, data: Bytes) -> Result<(), SendError> {
        let (host, port) = (&self.host, self.port);
        let connect = async {
            let addr = tokio::net::lookup_host((host.as_str(), port))
                .await?
                .next()
                .ok_or_else(|| std::io::Error::other("no address"))?;
            let local = if addr.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
            let sock = UdpSocket::bind(local).await?;
            sock.connect(addr).await?;
            Ok::<_, std::io::Error>(sock)
        };
        let sock = tokio::time::timeout(self.timeout, connect)
            .await
            .map_err(|_| "timeout".to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|e| {
                SendError::new(format!(
                    "failed to connect to UDP server: host[{host}] port[{port}] err: {e}"
                ))
            })?;
        match tokio::time::timeout(self.timeout, sock.send(&data)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("timeout".into()),
        }
        .map_err(|e| {
            SendError::new(format!(
                "failed to send data to UDP server: host[{host}] port[{port}] err:{e}"
            ))
        })
    }
}

impl BatchSink for UdpSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], batch_max_size: usize) -> SendFuture<'a> {
        Box::pin(self.datagram(encode_batch(entries, batch_max_size, Concat::Json)))
    }
}

struct UdpLogger(Logger);

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let logger = Logger::compile(cx, NAME, false, |conf| {
        let port = conf.get("port").and_then(Value::as_u64).unwrap_or(0);
        Ok(Arc::new(UdpSink {
            host: conf
                .get("host")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            port: u16::try_from(port).map_err(|_| format!("invalid port {port}"))?,
            timeout: Duration::from_secs(conf.get("timeout").and_then(Value::as_u64).unwrap_or(3)),
        }) as Arc<dyn BatchSink>)
    })?;
    Ok(Arc::new(UdpLogger(logger)))
}

impl Plugin for UdpLogger {
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

    use super::*;
    use crate::testing::Compiler;

    #[tokio::test]
    async fn batches_are_datagrams() {
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let port = sock.local_addr().unwrap().port();
        let c = Compiler::new();
        let conf = json!({"host": "127.0.0.1", "port": port, "batch_max_size": 2,
            "log_format": {"s": "$status"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "ul-1", None)).unwrap();
        for status in [201, 202] {
            p.log(&LogCtx {
                status,
                ..Default::default()
            });
        }
        let mut buf = [0u8; 2048];
        let n = tokio::time::timeout(Duration::from_secs(5), sock.recv(&mut buf))
            .await
            .unwrap()
            .unwrap();
        let v: Value = serde_json::from_slice(&buf[..n]).unwrap();
        assert_eq!(v, json!([{"s": "201"}, {"s": "202"}]));
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        assert!(r.check(NAME, &json!({"host": "127.0.0.1", "port": 1})).is_ok());
        assert!(r.check(NAME, &json!({"port": 1})).is_err());
        assert_eq!(r.get(NAME).unwrap().priority, 400);
    }
}
