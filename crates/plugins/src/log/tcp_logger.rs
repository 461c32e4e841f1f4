//! tcp-logger (`apisix/plugins/tcp-logger.lua`): each batch written on a new TCP connection
//! to `host:port` (a JSON array; a lone object when `batch_max_size` is 1), then closed;
//! `timeout` (milliseconds) bounds the connect, the handshake and the write. `tls` makes it a
//! TLS connection, `tls_options` its SNI, the certificate not verified (APISIX's
//! `sslhandshake(true, tls_options, false)`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_plugin_api::{CompileCtx, Plugin, PluginDef};
use serde_json::{json, Value};

use super::sink::net::{self, NetError, Tls};
use super::sink::{self, conf, encode_batch, BatchSink, Concat, Logger, SendError, SendFuture};

pub const NAME: &str = "tcp-logger";

pub static DEF: PluginDef = sink::def(NAME, 405, schema, compile);

fn schema() -> Value {
    sink::host_port_schema(
        Some(0),
        json!({
            "tls": {"type": "boolean", "default": false},
            "tls_options": {"type": "string"},
            "timeout": {"type": "integer", "minimum": 1, "default": 1000}
        }),
        "tcp logger",
    )
}

struct TcpSink {
    host: String,
    port: u16,
    tls: Option<Tls>,
    timeout: Duration,
}

impl TcpSink {
    async fn write(&self, data: Bytes) -> Result<(), SendError> {
        let (host, port) = (&self.host, self.port);
        net::tcp(host, port, self.timeout, self.tls.as_ref(), &data)
            .await
            .map_err(|e| {
                SendError::new(match e {
                    NetError::Connect(e) => format!(
                        "failed to connect to TCP server: host[{host}] port[{port}] err: {e}"
                    ),
                    NetError::Handshake(e) => format!(
                        "failed to perform TLS handshake to TCP server: host[{host}] port[{port}] err: {e}"
                    ),
                    NetError::Send(e) => format!(
                        "failed to send data to TCP server: host[{host}] port[{port}] err: {e}"
                    ),
                })
            })
    }
}

impl BatchSink for TcpSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], batch_max_size: usize) -> SendFuture<'a> {
        Box::pin(self.write(encode_batch(entries, batch_max_size, Concat::Json)))
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let tls_client = cx.services.tls().clone();
    let logger = Logger::compile(cx, NAME, false, |c| {
        let (host, port) = conf::host_port(c)?;
        Ok(Arc::new(TcpSink {
            host,
            port,
            tls: conf::flag(c, "tls").then(|| Tls {
                client: tls_client,
                server_name: c
                    .get("tls_options")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                verify: false,
            }),
            timeout: conf::millis(c, "timeout", 1000),
        }) as Arc<dyn BatchSink>)
    })?;
    Ok(logger.into_plugin())
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::LogCtx;
    use tokio::io::AsyncReadExt;

    use super::*;
    use crate::log::sink::testing::tls_acceptor;
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
        assert_eq!(
            got,
            vec![
                json!({"case": "meta", "code": "200"}),
                json!({"case": "meta", "code": "404"})
            ]
        );
    }

    #[tokio::test]
    async fn tls_batches_use_the_sni_of_tls_options() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let c = Compiler::new();
        // The test certificate is not trusted by the system: APISIX's tcp-logger never verifies.
        let conf = json!({"host": "127.0.0.1", "port": port, "batch_max_size": 1, "tls": true,
            "tls_options": "logs.example", "log_format": {"s": "$status"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "tl-tls", None)).unwrap();
        p.log(&LogCtx {
            status: 201,
            ..Default::default()
        });
        let (s, _) = listener.accept().await.unwrap();
        let mut s = tls_acceptor().accept(s).await.unwrap();
        assert_eq!(s.get_ref().1.server_name(), Some("logs.example"));
        let mut text = String::new();
        s.read_to_string(&mut text).await.unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&text).unwrap(),
            json!({"s": "201"})
        );
    }

    #[tokio::test]
    async fn a_plain_server_fails_the_tls_handshake() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let _ = tokio::io::AsyncWriteExt::write_all(&mut s, b"HTTP/1.1 400 Bad\r\n\r\n").await;
        });
        let c = Compiler::new();
        let conf = serde_json::from_value(json!({"host": "127.0.0.1", "port": port, "tls": true}))
            .unwrap();
        let sink = TcpSink {
            host: "127.0.0.1".into(),
            port,
            tls: Some(Tls {
                client: c.registry.services().tls().clone(),
                server_name: None,
                verify: false,
            }),
            timeout: conf::millis(&conf, "timeout", 1000),
        };
        let err = sink.write(Bytes::from_static(b"{}")).await.unwrap_err();
        assert!(
            err.message.starts_with(&format!(
                "failed to perform TLS handshake to TCP server: host[127.0.0.1] port[{port}] err: "
            )),
            "{}",
            err.message
        );
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        assert_eq!(
            r.check(NAME, &json!({"host": "127.0.0.1"})),
            Err("failed to check the configuration of plugin tcp-logger err: property \"port\" is required".into())
        );
        assert!(r
            .check(NAME, &json!({"host": "127.0.0.1", "port": 1}))
            .is_ok());
        assert_eq!(r.get(NAME).unwrap().priority, 405);
    }
}
