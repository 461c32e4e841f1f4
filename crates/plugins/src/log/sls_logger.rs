//! sls-logger (`apisix/plugins/sls-logger.lua`): entries to Alibaba Cloud Log Service's
//! syslog endpoint: each an RFC 5424 line (facility SYSLOG, severity INFO, `$host`,
//! `apisix`, the pid) whose structured data `[logservice project="..." logstore="..."
//! access-key-id="..." access-key-secret="..."]` names the project, the logstore and the
//! credentials SLS checks, the message the entry's JSON. A batch's lines are written over
//! one TLS connection to `host:port` (SNI `host`, the certificate checked when `ssl_verify`,
//! the default), `timeout` ms per step. The entry is the loggers' (default or `log_format`,
//! bodies).

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{CompileCtx, LogCtx, Plugin, PluginDef, VarNames};
use serde_json::{json, Value};

use super::sink::net::{self, NetError, Tls};
use super::sink::{self, conf, rfc5424, BatchSink, Logger, SendError, SendFuture};

pub const NAME: &str = "sls-logger";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &["access_key_secret"],
    ..sink::def(NAME, 406, schema, compile)
};

fn schema() -> Value {
    sink::schema(
        json!({
            "type": "object",
            "properties": {
                "timeout": {"type": "integer", "minimum": 1, "default": 5000},
                "host": {"type": "string"},
                "port": {"type": "integer"},
                "project": {"type": "string"},
                "logstore": {"type": "string"},
                "access_key_id": {"type": "string"},
                "access_key_secret": {"type": "string"},
                "ssl_verify": {"type": "boolean", "default": true}
            },
            "required": ["host", "port", "project", "logstore", "access_key_id", "access_key_secret"]
        }),
        NAME,
    )
}

struct SlsSink {
    host: String,
    port: u16,
    tls: Tls,
    timeout: Duration,
}

impl SlsSink {
    async fn write(&self, data: Bytes) -> Result<(), SendError> {
        let (host, port) = (self.host.as_str(), self.port);
        net::tcp(host, port, self.timeout, Some(&self.tls), &data)
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

impl BatchSink for SlsSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], _: usize) -> SendFuture<'a> {
        // `combine_syslog`: the lines one after the other (each ends with a newline).
        let mut all = BytesMut::new();
        for e in entries {
            all.extend_from_slice(e);
        }
        Box::pin(self.write(all.freeze()))
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let tls_client = cx.services.tls().clone();
    let filled = cx.filled();
    let text = |k: &str| {
        filled
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let params = [
        ("project", text("project")),
        ("logstore", text("logstore")),
        ("access-key-id", text("access_key_id")),
        ("access-key-secret", text("access_key_secret")),
    ];
    let logger = Logger::compile(cx, NAME, false, |c| {
        let (host, port) = conf::host_port(c)?;
        Ok(Arc::new(SlsSink {
            tls: Tls {
                client: tls_client,
                server_name: Some(host.clone()),
                verify: c.get("ssl_verify").and_then(Value::as_bool).unwrap_or(true),
            },
            host,
            port,
            timeout: conf::millis(c, "timeout", 5000),
        }) as Arc<dyn BatchSink>)
    })?
    .with_vars(&VarNames::from(vec!["host".into()]));
    let pid = std::process::id();
    Ok(logger.encoded_by(move |entry, now_ms, ctx: &LogCtx| {
        let json = lua::cjson_encode(&Value::Object(entry));
        let sd: Vec<(&str, &str)> = params.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Bytes::from(rfc5424::encode(
            rfc5424::FACILITY_SYSLOG,
            rfc5424::SEVERITY_INFO,
            now_ms,
            ctx.vars.get("host"),
            pid,
            &json,
            Some(&sd),
        ))
    }))
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::{LogVars, PluginServices};
    use tokio::io::AsyncReadExt;

    use super::*;
    use crate::log::sink::testing::{test_ca, tls_acceptor};
    use crate::testing::Compiler;

    struct V;
    impl ferrisix_router::VarSource for V {
        fn var(&self, name: &str) -> Option<std::borrow::Cow<'_, str>> {
            match name {
                "host" => Some("gw.test".into()),
                "route_id" => Some("1".into()),
                _ => None,
            }
        }
    }

    /// An SLS syslog endpoint: TLS with the test certificate, the lines of each connection.
    async fn sls_server() -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let acceptor = tls_acceptor();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    if let Ok(mut s) = acceptor.accept(s).await {
                        let mut all = String::new();
                        let _ = s.read_to_string(&mut all).await;
                        let _ = tx.send(all);
                    }
                });
            }
        });
        (port, rx)
    }

    #[tokio::test]
    async fn rfc5424_lines_over_verified_tls() {
        let (port, mut rx) = sls_server().await;
        // The certificate is for 127.0.0.1, signed by the test CA the gateway trusts.
        let c = Compiler::with(Arc::new(
            PluginServices::default().with_tls_roots(test_ca()),
        ));
        let conf = json!({"host": "127.0.0.1", "port": port, "project": "proj", "logstore": "store",
            "access_key_id": "AKID", "access_key_secret": "SECRET", "batch_max_size": 2,
            "log_format": {"s": "$status"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "sls-1", None)).unwrap();
        for status in [200, 404] {
            p.log(&LogCtx {
                status,
                vars: LogVars::capture(p.log_needs().vars.unwrap(), &V),
                ..Default::default()
            });
        }
        let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        let lines: Vec<&str> = got.lines().collect();
        assert_eq!(lines.len(), 2, "{got}");
        let re = regex::Regex::new(&format!(
            r#"^<46>1 \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{{3}}Z gw\.test apisix {} - \[logservice project="proj" logstore="store" access-key-id="AKID" access-key-secret="SECRET"\] (\{{.*\}})$"#,
            std::process::id()
        ))
        .unwrap();
        let json = re
            .captures(lines[1])
            .unwrap_or_else(|| panic!("{}", lines[1]))[1]
            .to_owned();
        assert_eq!(
            serde_json::from_str::<Value>(&json).unwrap(),
            json!({"s": "404", "route_id": "1"})
        );
    }

    #[tokio::test]
    async fn unverified_certificates_are_refused_when_verifying() {
        let (port, _rx) = sls_server().await;
        let services = PluginServices::default();
        let sink = SlsSink {
            host: "127.0.0.1".into(),
            port,
            tls: Tls {
                client: services.tls().clone(),
                server_name: Some("127.0.0.1".into()),
                verify: true,
            },
            timeout: Duration::from_secs(3),
        };
        let err = sink.write(Bytes::from_static(b"x\n")).await.unwrap_err();
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
        let ok = json!({"host": "h", "port": 10009, "project": "p", "logstore": "l",
            "access_key_id": "i", "access_key_secret": "s"});
        assert!(r.check(NAME, &ok).is_ok());
        let mut missing = ok.clone();
        missing.as_object_mut().unwrap().remove("logstore");
        assert_eq!(
            r.check(NAME, &missing).unwrap_err(),
            "failed to check the configuration of plugin sls-logger err: property \"logstore\" is required"
        );
        let info = r.get(NAME).unwrap();
        assert_eq!(info.priority, 406);
        assert_eq!(info.schema["properties"]["name"]["default"], NAME);
    }
}
