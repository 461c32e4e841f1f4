//! udp-logger (`apisix/plugins/udp-logger.lua`): each batch sent as one datagram to
//! `host:port` (a JSON array; a lone object when `batch_max_size` is 1); `timeout` seconds.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_plugin_api::{CompileCtx, Plugin, PluginDef};
use serde_json::{json, Value};

use super::sink::net::{self, NetError};
use super::sink::{self, conf, encode_batch, BatchSink, Concat, Logger, SendError, SendFuture};

pub const NAME: &str = "udp-logger";

pub static DEF: PluginDef = sink::def(NAME, 400, schema, compile);

fn schema() -> Value {
    sink::host_port_schema(
        Some(0),
        json!({"timeout": {"type": "integer", "minimum": 1, "default": 3}}),
        "udp logger",
    )
}

struct UdpSink {
    host: String,
    port: u16,
    timeout: Duration,
}

impl UdpSink {
    async fn datagram(&self, data: Bytes) -> Result<(), SendError> {
        let (host, port) = (&self.host, self.port);
        net::udp(host, port, self.timeout, &data)
            .await
            .map_err(|e| {
                SendError::new(match e {
                    NetError::Send(e) => format!(
                        "failed to send data to UDP server: host[{host}] port[{port}] err:{e}"
                    ),
                    NetError::Connect(e) | NetError::Handshake(e) => format!(
                        "failed to connect to UDP server: host[{host}] port[{port}] err: {e}"
                    ),
                })
            })
    }
}

impl BatchSink for UdpSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], batch_max_size: usize) -> SendFuture<'a> {
        Box::pin(self.datagram(encode_batch(entries, batch_max_size, Concat::Json)))
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let logger = Logger::compile(cx, NAME, false, |c| {
        let (host, port) = conf::host_port(c)?;
        Ok(Arc::new(UdpSink {
            host,
            port,
            timeout: conf::secs(c, "timeout", 3),
        }) as Arc<dyn BatchSink>)
    })?;
    Ok(logger.into_plugin())
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;

    use ferrisix_plugin_api::LogCtx;
    use tokio::net::UdpSocket;

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
        assert!(r
            .check(NAME, &json!({"host": "127.0.0.1", "port": 1}))
            .is_ok());
        assert!(r.check(NAME, &json!({"port": 1})).is_err());
        assert_eq!(r.get(NAME).unwrap().priority, 400);
    }
}
