//! loggly (`apisix/plugins/loggly.lua`): entries to Loggly, where and how its
//! `plugin_metadata` says (`host` default `logs-01.loggly.com`, `port` 514, `protocol`
//! `syslog`, `http` or `https`, `timeout` ms, read when a batch is sent, as APISIX's):
//!
//! - `syslog`: each entry one UDP datagram to `host:port`, an RFC 5424 line
//!   `<8+severity>1 <time> <$host> apisix <pid> - [<customer_token>@41058 tag="a" ...] <json>`,
//!   the severity `severity` or, for the response's status, `severity_map`'s;
//! - `http`/`https`: the batch's JSON entries, one a line, POSTed to Loggly's bulk endpoint
//!   `<host>/bulk/<customer_token>/tag/bulk` (`host` taken as a URL when it starts with
//!   `http`), each of `tags` an `X-LOGGLY-TAG` header; `ssl_verify` for `https`. Only 200
//!   succeeds.
//!
//! The entry is the loggers' (default or `log_format`, `include_req_body(_expr)`,
//! `include_resp_body(_expr)`, body limits). Batches go where the metadata said when the conf
//! compiled: a metadata change starts a new batch processor.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, LogCtx, Plugin, PluginDef, PluginServices, VarNames,
};
use http::{header, HeaderName, HeaderValue, Method};
use serde_json::{json, Map, Value};

use super::sink::http::HttpTarget;
use super::sink::net::{self, NetError};
use super::sink::{self, conf, rfc5424, BatchSink, Logger, SendError, SendFuture};

pub const NAME: &str = "loggly";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &["customer_token"],
    metadata_schema: Some(metadata_schema),
    schema_error: Some(schema_error),
    ..sink::def(NAME, 411, schema, compile)
};

/// Syslog severities by name (`EMEGR` as APISIX spells it).
const SEVERITIES: [(&str, u32); 8] = [
    ("EMEGR", 0),
    ("ALERT", 1),
    ("CRIT", 2),
    ("ERR", 3),
    ("WARNING", 4),
    ("NOTICE", 5),
    ("INFO", 6),
    ("DEBUG", 7),
];

/// APISIX's tag pattern, `^(?!tag=)[ -~]*`: a look-ahead, which the schema's regex engine
/// lacks; [`TAG_PATTERN`] accepts the same strings (those not starting with `tag=`), and
/// the schema's message names APISIX's.
const APISIX_TAG_PATTERN: &str = "^(?!tag=)[ -~]*";
const TAG_PATTERN: &str = "^(?:$|[^t]|t$|t[^a]|ta$|ta[^g]|tag$|tag[^=])";

fn severity_enum() -> Value {
    SEVERITIES
        .iter()
        .flat_map(|(n, _)| [Value::from(*n), Value::from(n.to_lowercase())])
        .collect()
}

fn severity_of(name: &str) -> u32 {
    SEVERITIES
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map_or(6, |(_, v)| *v)
}

fn schema() -> Value {
    sink::schema(
        json!({
            "type": "object",
            "properties": {
                "customer_token": {"type": "string"},
                "severity": {"type": "string", "default": "INFO", "enum": severity_enum(),
                    "description": "base severity log level"},
                "tags": {"type": "array", "minItems": 1,
                    "items": {"type": "string", "pattern": TAG_PATTERN}, "default": ["apisix"]},
                "ssl_verify": {"type": "boolean", "default": true},
                "severity_map": {
                    "type": "object",
                    "description": "upstream response code vs syslog severity mapping",
                    "patternProperties": {
                        "^[1-5][0-9]{2}$": {"description": "keys are HTTP status code, values are severity",
                            "type": "string", "enum": severity_enum()}
                    },
                    "additionalProperties": false
                }
            },
            "required": ["customer_token"]
        }),
        NAME,
    )
}

fn metadata_schema() -> Value {
    let mut s = sink::metadata_schema();
    let props = s["properties"].as_object_mut().expect("an object schema");
    for (k, v) in [
        (
            "host",
            json!({"type": "string", "default": "logs-01.loggly.com"}),
        ),
        ("port", json!({"type": "integer", "default": 514})),
        (
            "protocol",
            json!({"type": "string", "default": "syslog", "enum": ["syslog", "http", "https"]}),
        ),
        (
            "timeout",
            json!({"type": "integer", "minimum": 1, "default": 5000}),
        ),
    ] {
        props.insert(k.into(), v);
    }
    s
}

/// The schema's message with APISIX's tag pattern (as the message writes patterns, its
/// backslashes doubled).
fn schema_error(_: &CheckCtx<'_>, err: String) -> String {
    let escaped = |p: &str| p.replace('\\', "\\\\");
    err.replace(&escaped(TAG_PATTERN), &escaped(APISIX_TAG_PATTERN))
}

/// Where batches go, from the metadata (its defaults when there is none).
#[derive(Clone, Debug, PartialEq)]
struct Target {
    host: String,
    port: u16,
    protocol: String,
    timeout: Duration,
}

impl Target {
    fn from_metadata(meta: Option<&Value>) -> Target {
        let m = meta.and_then(Value::as_object);
        let get = |k: &str| m.and_then(|m| m.get(k));
        Target {
            host: get("host")
                .and_then(Value::as_str)
                .unwrap_or("logs-01.loggly.com")
                .to_owned(),
            port: get("port")
                .and_then(Value::as_u64)
                .and_then(|p| u16::try_from(p).ok())
                .unwrap_or(514),
            protocol: get("protocol")
                .and_then(Value::as_str)
                .unwrap_or("syslog")
                .to_owned(),
            timeout: Duration::from_millis(get("timeout").and_then(Value::as_u64).unwrap_or(5000)),
        }
    }

    fn syslog(&self) -> bool {
        self.protocol == "syslog"
    }

    /// The bulk endpoint (`path.join(host, "bulk", token, "tag", "bulk")`, the scheme added
    /// unless `host` has one).
    fn bulk_url(&self, token: &str) -> String {
        let sep = if self.host.ends_with('/') { "" } else { "/" };
        let joined = format!("{}{sep}bulk/{token}/tag/bulk", self.host);
        if self.host.starts_with("http") {
            joined
        } else if self.protocol == "http" {
            format!("http://{joined}")
        } else {
            format!("https://{joined}")
        }
    }
}

enum LogglySink {
    Udp {
        host: String,
        port: u16,
        timeout: Duration,
    },
    Bulk {
        url: String,
        target: HttpTarget,
    },
}

impl LogglySink {
    fn new(
        c: &Map<String, Value>,
        t: &Target,
        services: &Arc<PluginServices>,
    ) -> Result<LogglySink, String> {
        if t.syslog() {
            return Ok(LogglySink::Udp {
                host: t.host.clone(),
                port: t.port,
                timeout: t.timeout,
            });
        }
        let url = t.bulk_url(conf::text(c, "customer_token"));
        url.parse::<http::Uri>()
            .map_err(|e| format!("invalid loggly endpoint {url}: {e}"))?;
        let mut headers = vec![(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )];
        for tag in c
            .get("tags")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if let Ok(v) = HeaderValue::from_str(tag) {
                headers.push((HeaderName::from_static("x-loggly-tag"), v));
            }
        }
        Ok(LogglySink::Bulk {
            url,
            target: HttpTarget::new(
                services,
                t.timeout,
                c.get("ssl_verify").and_then(Value::as_bool).unwrap_or(true),
                headers,
            ),
        })
    }

    async fn datagrams(
        entries: &[Bytes],
        host: &str,
        port: u16,
        timeout: Duration,
    ) -> Result<(), SendError> {
        for (i, e) in entries.iter().enumerate() {
            if let Err(err) = net::udp(host, port, timeout, e).await {
                return Err(SendError {
                    message: match err {
                        NetError::Send(e) => format!(
                            "failed to send data to UDP server: host[{host}] port[{port}] err:{e}"
                        ),
                        NetError::Connect(e) | NetError::Handshake(e) => format!(
                            "failed to connect to UDP server: host[{host}] port[{port}] err: {e}"
                        ),
                    },
                    first_fail: Some(i + 1),
                });
            }
        }
        Ok(())
    }

    async fn bulk(url: &str, target: &HttpTarget, entries: &[Bytes]) -> Result<(), SendError> {
        let body = Bytes::from(entries.join(&b'\n'));
        let resp = target
            .call(target.request(Method::POST, url), body)
            .await
            .map_err(|e| e.into_send_error("failed to write log to loggly, "))?;
        let status = resp.status().as_u16();
        if status == 200 {
            return Ok(());
        }
        let is_json = serde_json::from_slice::<Value>(resp.body()).is_ok_and(|v| !v.is_null());
        Err(SendError::new(if is_json {
            format!(
                "failed to send log to loggly, http status code: {status} response body: {}",
                String::from_utf8_lossy(resp.body())
            )
        } else {
            format!("failed to send log to loggly, http status code: {status}")
        }))
    }
}

impl BatchSink for LogglySink {
    fn send<'a>(&'a self, entries: &'a [Bytes], _: usize) -> SendFuture<'a> {
        match self {
            LogglySink::Udp {
                host,
                port,
                timeout,
            } => Box::pin(Self::datagrams(entries, host, *port, *timeout)),
            LogglySink::Bulk { url, target } => Box::pin(Self::bulk(url, target, entries)),
        }
    }
}

/// The syslog line's fixed parts: `<token>@41058 tag="a" tag="b"`, the base severity and
/// the severity per status.
struct SyslogHead {
    structured: String,
    severity: u32,
    by_status: Vec<(u16, u32)>,
}

impl SyslogHead {
    fn new(c: &Value) -> SyslogHead {
        let tags: Vec<String> = c
            .get("tags")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|t| format!("tag=\"{t}\""))
            .collect();
        let token = c
            .get("customer_token")
            .and_then(Value::as_str)
            .unwrap_or("");
        SyslogHead {
            structured: format!("[{token}@41058 {}]", tags.join(" ")),
            severity: severity_of(c.get("severity").and_then(Value::as_str).unwrap_or("INFO")),
            by_status: c
                .get("severity_map")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| Some((k.parse().ok()?, severity_of(v.as_str()?))))
                .collect(),
        }
    }

    fn line(&self, status: u16, ms: u64, host: Option<&str>, pid: u32, json: &str) -> String {
        let severity = self
            .by_status
            .iter()
            .find(|(s, _)| *s == status)
            .map_or(self.severity, |(_, v)| *v);
        // Facility LOG_USER (1).
        format!(
            "<{}>1 {} {} apisix {pid} - {} {json}",
            8 + severity,
            rfc5424::timestamp(ms),
            host.unwrap_or("-"),
            self.structured
        )
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let services = cx.services;
    let target = Target::from_metadata(cx.metadata);
    let logger = Logger::compile_with_metadata(cx, NAME, |c| {
        Ok(Arc::new(LogglySink::new(c, &target, services)?) as Arc<dyn BatchSink>)
    })?;
    if !target.syslog() {
        return Ok(logger.into_plugin());
    }
    let head = SyslogHead::new(&cx.filled());
    let pid = std::process::id();
    Ok(logger
        .with_vars(&VarNames::from(vec!["host".into()]))
        .encoded_by(move |entry, now_ms, ctx: &LogCtx| {
            let json = lua::cjson_encode(&Value::Object(entry));
            Bytes::from(head.line(ctx.status, now_ms, ctx.vars.get("host"), pid, &json))
        }))
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use tokio::net::UdpSocket;

    use super::*;
    use crate::log::sink::testing::{answer, http_server, log_ctx, next, Captured};
    use crate::testing::Compiler;

    async fn recv(sock: &UdpSocket) -> String {
        let mut buf = [0u8; 65536];
        let n = tokio::time::timeout(Duration::from_secs(5), sock.recv(&mut buf))
            .await
            .expect("a datagram within 5 s")
            .unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[tokio::test]
    async fn syslog_datagrams_with_tags_and_severity_map() {
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let port = sock.local_addr().unwrap().port();
        let meta = json!({"host": "127.0.0.1", "port": port});
        let c = Compiler::new();
        let conf = json!({"customer_token": "tok", "tags": ["abc", "def"], "batch_max_size": 2,
            "severity": "notice", "severity_map": {"503": "ERR"}, "log_format": {"s": "$status"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "lg-1", Some(&meta))).unwrap();
        for status in [200, 503] {
            let mut ctx = log_ctx(&*p, 1);
            ctx.status = status;
            p.log(&ctx);
        }
        // One datagram per entry, as Loggly's syslog endpoint takes them.
        let first = recv(&sock).await;
        let second = recv(&sock).await;
        let re = regex::Regex::new(&format!(
            r#"^<13>1 \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{{3}}Z - apisix {} - \[tok@41058 tag="abc" tag="def"\] (\{{.*\}})$"#,
            std::process::id()
        ))
        .unwrap();
        let json = re.captures(&first).unwrap_or_else(|| panic!("{first}"))[1].to_owned();
        assert_eq!(
            serde_json::from_str::<Value>(&json).unwrap(),
            json!({"s": "200", "route_id": "r1"})
        );
        assert!(second.starts_with("<11>1 "), "{second}");
    }

    /// Loggly's bulk endpoint: `/bulk/<token>/tag/bulk` takes entries one a line; token
    /// `bad` gets 403 with a JSON body.
    fn bulk(req: &Captured) -> Vec<u8> {
        if req.head.starts_with("POST /bulk/bad/tag/bulk ") {
            return answer(403, r#"{"response":"forbidden"}"#);
        }
        if req.head.starts_with("POST /bulk/tok/tag/bulk ") {
            return answer(200, r#"{"response":"ok"}"#);
        }
        answer(404, "not found")
    }

    #[tokio::test]
    async fn http_bulk_with_tag_headers() {
        let (port, mut rx) = http_server(bulk).await;
        let meta = json!({"host": format!("http://127.0.0.1:{port}"), "protocol": "http",
            "timeout": 1000});
        let c = Compiler::new();
        let conf = json!({"customer_token": "tok", "tags": ["abc", "def"], "batch_max_size": 3});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "lg-2", Some(&meta))).unwrap();
        for n in 0..3 {
            p.log(&log_ctx(&*p, n));
        }
        let req = next(&mut rx).await;
        let lower = req.lower();
        assert!(lower.contains("x-loggly-tag: abc\r\n"), "{lower}");
        assert!(lower.contains("x-loggly-tag: def"), "{lower}");
        assert!(lower.contains("content-type: application/json"));
        let lines: Vec<Value> = req
            .text()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[2]["request"]["querystring"]["n"], "2");
        // A refused batch: the status and Loggly's JSON answer.
        let services = Arc::new(PluginServices::default());
        let t = Target::from_metadata(Some(&meta));
        let sink = LogglySink::new(
            json!({"customer_token": "bad"}).as_object().unwrap(),
            &t,
            &services,
        )
        .unwrap();
        let err = sink
            .send(&[Bytes::from_static(b"{}")], 1)
            .await
            .unwrap_err();
        assert_eq!(
            err.message,
            "failed to send log to loggly, http status code: 403 response body: {\"response\":\"forbidden\"}"
        );
    }

    #[test]
    fn bulk_urls() {
        let t = |host: &str, protocol: &str| Target {
            host: host.into(),
            port: 514,
            protocol: protocol.into(),
            timeout: Duration::from_secs(5),
        };
        assert_eq!(
            t("logs-01.loggly.com", "https").bulk_url("k"),
            "https://logs-01.loggly.com/bulk/k/tag/bulk"
        );
        assert_eq!(
            t("logs-01.loggly.com", "http").bulk_url("k"),
            "http://logs-01.loggly.com/bulk/k/tag/bulk"
        );
        assert_eq!(
            t("http://127.0.0.1:1/", "https").bulk_url("k"),
            "http://127.0.0.1:1/bulk/k/tag/bulk"
        );
        assert_eq!(Target::from_metadata(None).port, 514);
        assert!(Target::from_metadata(None).syslog());
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        let pre = "failed to check the configuration of plugin loggly err: ";
        let err = |c: Value| r.check(NAME, &c).unwrap_err();
        assert_eq!(
            err(json!({})),
            format!("{pre}property \"customer_token\" is required")
        );
        assert_eq!(
            err(json!({"customer_token": "t", "tags": ["tag=x"]})),
            format!("{pre}property \"tags\" validation failed: failed to validate item 1: failed to match pattern \"^(?!tag=)[ -~]*\" with \"tag=x\"")
        );
        assert!(r
            .check(
                NAME,
                &json!({"customer_token": "t", "tags": ["ta", "tagx", "x", ""]})
            )
            .is_ok());
        assert!(r
            .check(
                NAME,
                &json!({"customer_token": "t", "severity_map": {"600": "INFO"}})
            )
            .is_err());
        assert!(r
            .check(
                NAME,
                &json!({"customer_token": "t", "severity": "crit", "severity_map": {"502": "err"}})
            )
            .is_ok());
        assert!(r.check_metadata(NAME, &json!({"protocol": "tcp"})).is_err());
        assert_eq!(r.get(NAME).unwrap().priority, 411);
    }
}
