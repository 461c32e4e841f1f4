//! syslog (`apisix/plugins/syslog.lua`): each entry's JSON as an RFC 5424 message
//! (`<46>1 <RFC 3339 UTC time> <$host> apisix <pid> - - <json>`, facility SYSLOG, severity
//! INFO), batches written over TCP (`sock_type` `tcp`, the default; one connection per
//! batch) or as one UDP datagram to `host:port`, `timeout` in milliseconds. `tls` makes the
//! TCP connection TLS, the certificate not verified and no SNI sent (lua-resty-logger-socket's
//! handshake without `sni_host` and `ssl_verify`). `flush_limit`, `drop_limit` and `pool_size`
//! belong to lua-resty-logger-socket's buffering, which the batch processor does here: they
//! are accepted without effect.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{CompileCtx, LogCtx, Plugin, PluginDef, VarNames};
use serde_json::{json, Value};

use super::sink::net::{self, NetError, Tls};
use super::sink::rfc5424;
use super::sink::{self, conf, BatchSink, Logger, SendError, SendFuture};

pub const NAME: &str = "syslog";

pub static DEF: PluginDef = sink::def(NAME, 401, schema, compile);

fn schema() -> Value {
    sink::host_port_schema(
        None,
        json!({
            "flush_limit": {"type": "integer", "minimum": 1, "default": 4096},
            "drop_limit": {"type": "integer", "default": 1048576},
            "timeout": {"type": "integer", "minimum": 1, "default": 3000},
            "sock_type": {"type": "string", "default": "tcp", "enum": ["tcp", "udp"]},
            "pool_size": {"type": "integer", "minimum": 5, "default": 5},
            "tls": {"type": "boolean", "default": false}
        }),
        "sys logger",
    )
}

/// `rfc5424.encode("SYSLOG", "INFO", host, "apisix", pid, msg)`.
fn rfc5424(ms: u64, host: Option<&str>, pid: u32, msg: &str) -> String {
    rfc5424::encode(
        rfc5424::FACILITY_SYSLOG,
        rfc5424::SEVERITY_INFO,
        ms,
        host,
        pid,
        msg,
        None,
    )
}

struct SyslogSink {
    host: String,
    port: u16,
    udp: bool,
    tls: Option<Tls>,
    timeout: Duration,
}

impl SyslogSink {
    async fn write(&self, data: Bytes) -> Result<(), SendError> {
        let (host, port) = (self.host.as_str(), self.port);
        let sent = if self.udp {
            net::udp(host, port, self.timeout, &data).await
        } else {
            net::tcp(host, port, self.timeout, self.tls.as_ref(), &data).await
        };
        sent.map_err(
            |(NetError::Connect(e) | NetError::Handshake(e) | NetError::Send(e))| {
                SendError::new(format!("failed to log message: {e}"))
            },
        )
    }
}

impl BatchSink for SyslogSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], _: usize) -> SendFuture<'a> {
        let mut all = BytesMut::new();
        for e in entries {
            all.extend_from_slice(e);
        }
        // The whole batch within `timeout`, as lua-resty-logger-socket's one flush.
        Box::pin(async move {
            tokio::time::timeout(self.timeout, self.write(all.freeze()))
                .await
                .unwrap_or_else(|_| Err(SendError::new("failed to log message: timeout")))
        })
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let tls_client = cx.services.tls().clone();
    let logger = Logger::compile(cx, NAME, false, |c| {
        let (host, port) = conf::host_port(c)?;
        Ok(Arc::new(SyslogSink {
            host,
            port,
            udp: conf::text(c, "sock_type") == "udp",
            tls: conf::flag(c, "tls").then(|| Tls {
                client: tls_client,
                server_name: None,
                verify: false,
            }),
            timeout: conf::millis(c, "timeout", 3000),
        }) as Arc<dyn BatchSink>)
    })?
    .with_vars(&VarNames::from(vec!["host".into()]));
    let pid = std::process::id();
    Ok(logger.encoded_by(move |entry, now_ms, ctx: &LogCtx| {
        let json = lua::cjson_encode(&Value::Object(entry));
        Bytes::from(rfc5424(now_ms, ctx.vars.get("host"), pid, &json))
    }))
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::LogVars;
    use tokio::io::AsyncReadExt;

    use super::*;
    use crate::log::sink::testing::tls_acceptor;
    use crate::testing::Compiler;

    struct V;
    impl ferrisix_router::VarSource for V {
        fn var(&self, name: &str) -> Option<std::borrow::Cow<'_, str>> {
            (name == "host").then_some(std::borrow::Cow::Borrowed("h.test"))
        }
    }

    #[test]
    fn rfc5424_lines() {
        assert_eq!(
            rfc5424(1_704_164_645_678, Some("gw.test"), 42, "{\"a\":1}"),
            "<46>1 2024-01-02T03:04:05.678Z gw.test apisix 42 - - {\"a\":1}\n"
        );
        assert!(rfc5424(0, None, 1, "m").starts_with("<46>1 1970-01-01T00:00:00.000Z - apisix"));
    }

    #[tokio::test]
    async fn batches_over_tcp() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let c = Compiler::new();
        let conf = json!({"host": "127.0.0.1", "port": port, "batch_max_size": 2,
            "log_format": {"s": "$status"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "sl-1", None)).unwrap();
        for status in [200, 404] {
            p.log(&LogCtx {
                status,
                vars: LogVars::capture(p.log_needs().vars.unwrap(), &V),
                ..Default::default()
            });
        }
        let (mut s, _) = listener.accept().await.unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).await.unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        for (line, status) in lines.iter().zip(["200", "404"]) {
            assert!(line.starts_with("<46>1 "), "{line}");
            let fields: Vec<&str> = line.splitn(8, ' ').collect();
            assert_eq!(fields[2], "h.test");
            assert_eq!(fields[3], "apisix");
            assert_eq!(fields[7], format!("{{\"s\":\"{status}\"}}"));
        }
    }

    #[tokio::test]
    async fn tls_over_tcp() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let c = Compiler::new();
        let conf = json!({"host": "127.0.0.1", "port": port, "batch_max_size": 1, "tls": true,
            "log_format": {"s": "$status"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "sl-tls", None)).unwrap();
        p.log(&LogCtx {
            status: 200,
            vars: LogVars::capture(p.log_needs().vars.unwrap(), &V),
            ..Default::default()
        });
        let (s, _) = listener.accept().await.unwrap();
        let mut s = tls_acceptor().accept(s).await.unwrap();
        assert_eq!(s.get_ref().1.server_name(), None, "an address sends no SNI");
        let mut text = String::new();
        s.read_to_string(&mut text).await.unwrap();
        assert!(text.starts_with("<46>1 "), "{text}");
        assert!(text.ends_with(" - - {\"s\":\"200\"}\n"), "{text}");
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        assert!(r
            .check(NAME, &json!({"host": "127.0.0.1", "port": 514}))
            .is_ok());
        assert!(r
            .check(
                NAME,
                &json!({"host": "127.0.0.1", "port": 514, "sock_type": "unix"})
            )
            .is_err());
        // lua-resty-logger-socket's buffering options: checked, accepted without effect.
        let buffering = json!({"host": "127.0.0.1", "port": 514, "flush_limit": 1,
            "drop_limit": 10, "pool_size": 5, "tls": true, "timeout": 1});
        assert!(r.check(NAME, &buffering).is_ok());
        let small_pool = json!({"host": "127.0.0.1", "port": 514, "pool_size": 4});
        assert!(r
            .check(NAME, &small_pool)
            .unwrap_err()
            .contains("pool_size"));
        let no_flush = json!({"host": "127.0.0.1", "port": 514, "flush_limit": 0});
        assert!(r
            .check(NAME, &no_flush)
            .unwrap_err()
            .contains("flush_limit"));
        let info = r.get(NAME).unwrap();
        assert_eq!(info.schema["properties"]["drop_limit"]["default"], 1048576);
        assert_eq!(r.get(NAME).unwrap().priority, 401);
    }
}
