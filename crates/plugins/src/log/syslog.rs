//! syslog (`apisix/plugins/syslog.lua`): each entry's JSON as an RFC 5424 message
//! (`<46>1 <RFC 3339 UTC time> <$host> apisix <pid> - - <json>`, facility SYSLOG, severity
//! INFO), batches written over TCP (`sock_type` `tcp`, the default; one connection per
//! batch) or as one UDP datagram to `host:port`, `timeout` in milliseconds. `flush_limit`,
//! `drop_limit` and `pool_size` belong to lua-resty-logger-socket's buffering, which the
//! batch processor does here: they are accepted without effect. `tls` is not built: such
//! batches fail with that error.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, LogCtx, LogNeeds, Phases, Plugin, PluginDef, VarNames,
};
use serde_json::{json, Map, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UdpSocket};

use super::batch_processor::{self, BatchSink, SendError, SendFuture};
use super::log_entry;
use super::logger::Logger;

pub const NAME: &str = "syslog";

pub static DEF: PluginDef = PluginDef {
    metadata_schema: Some(metadata_schema),
    check: Some(check),
    ..PluginDef::new(NAME, 401, schema, compile)
};

fn schema() -> Value {
    let mut props = Map::new();
    props.insert("host".into(), json!({"type": "string"}));
    props.insert("port".into(), json!({"type": "integer"}));
    props.insert("flush_limit".into(), json!({"type": "integer", "minimum": 1, "default": 4096}));
    props.insert("drop_limit".into(), json!({"type": "integer", "default": 1048576}));
    props.insert("timeout".into(), json!({"type": "integer", "minimum": 1, "default": 3000}));
    props.insert(
        "sock_type".into(),
        json!({"type": "string", "default": "tcp", "enum": ["tcp", "udp"]}),
    );
    props.insert("pool_size".into(), json!({"type": "integer", "minimum": 5, "default": 5}));
    props.insert("tls".into(), json!({"type": "boolean", "default": false}));
    props.extend(log_entry::entry_properties());
    batch_processor::wrap_schema(
        json!({"type": "object", "properties": props, "required": ["host", "port"]}),
        "sys logger",
    )
}

fn metadata_schema() -> Value {
    batch_processor::wrap_metadata_schema(log_entry::metadata_schema())
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    cx.schema_result.clone()?;
    log_entry::check(cx.conf)
}

/// log-util's `get_rfc3339_zulu_timestamp`: `2024-01-02T03:04:05.678Z`.
fn rfc3339_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// `rfc5424.encode("SYSLOG", "INFO", host, "apisix", pid, msg)`.
fn rfc5424(ms: u64, host: Option<&str>, pid: u32, msg: &str) -> String {
    const PRI: u32 = 5 * 8 + 6;
    let host = host.filter(|h| !h.is_empty()).unwrap_or("-");
    format!("<{PRI}>1 {} {host} apisix {pid} - - {msg}\n", rfc3339_ms(ms))
}

struct SyslogSink {
    host: String,
    port: u16,
    udp: bool,
    tls: bool,
    timeout: Duration,
}

impl SyslogSink {
    async fn write(&self, data: Bytes) -> Result<(), SendError> {
        let (host, port) = (self.host.as_str(), self.port);
        let failed = |e: String| SendError::new(format!("failed to log message{e}"));
        if self.tls {
            return Err(failed(": TLS to syslog servers is not supported".into()));
        }
        let io = async {
            if self.udp {
                let addr = tokio::net::lookup_host((host, port))
                    .await?
                    .next()
                    .ok_or_else(|| std::io::Error::other("no address"))?;
                let sock =
                    UdpSocket::bind(if addr.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }).await?;
                sock.connect(addr).await?;
                sock.send(&data).await?;
            } else {
                let mut s = TcpStream::connect((host, port)).await?;
                s.write_all(&data).await?;
                s.shutdown().await?;
            }
            Ok::<_, std::io::Error>(())
        };
        match tokio::time::timeout(self.timeout, io).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(failed(format!(": {e}"))),
            Err(_) => Err(failed(": timeout".into())),
        }
    }
}

impl BatchSink for SyslogSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], _: usize) -> SendFuture<'a> {
        let mut all = BytesMut::new();
        for e in entries {
            all.extend_from_slice(e);
        }
        Box::pin(self.write(all.freeze()))
    }
}

struct Syslog {
    logger: Logger,
    pid: u32,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let logger = Logger::compile(cx, NAME, false, |conf| {
        let port = conf.get("port").and_then(Value::as_i64).unwrap_or(0);
        Ok(Arc::new(SyslogSink {
            host: conf
                .get("host")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            port: u16::try_from(port).map_err(|_| format!("invalid port {port}"))?,
            udp: conf.get("sock_type").and_then(Value::as_str) == Some("udp"),
            tls: conf.get("tls").and_then(Value::as_bool).unwrap_or(false),
            timeout: Duration::from_millis(
                conf.get("timeout").and_then(Value::as_u64).unwrap_or(3000),
            ),
        }) as Arc<dyn BatchSink>)
    })?
    .with_vars(&VarNames::from(vec!["host".into()]));
    Ok(Arc::new(Syslog {
        logger,
        pid: std::process::id(),
    }))
}

impl Plugin for Syslog {
    fn phases(&self) -> Phases {
        Phases::LOG
    }

    fn log_needs(&self) -> LogNeeds {
        self.logger.needs()
    }

    fn log(&self, ctx: &LogCtx) {
        self.logger.log_with(ctx, |entry, now_ms| {
            let json = lua::cjson_encode(&Value::Object(entry));
            Bytes::from(rfc5424(now_ms, ctx.vars.get("host"), self.pid, &json))
        });
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::LogVars;
    use tokio::io::AsyncReadExt;

    use super::*;
    use crate::testing::Compiler;

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
        struct V;
        impl ferrisix_router::VarSource for V {
            fn var(&self, name: &str) -> Option<std::borrow::Cow<'_, str>> {
                (name == "host").then_some(std::borrow::Cow::Borrowed("h.test"))
            }
        }
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

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        assert!(r.check(NAME, &json!({"host": "127.0.0.1", "port": 514})).is_ok());
        assert!(r
            .check(NAME, &json!({"host": "127.0.0.1", "port": 514, "sock_type": "unix"}))
            .is_err());
        assert_eq!(r.get(NAME).unwrap().priority, 401);
    }
}
