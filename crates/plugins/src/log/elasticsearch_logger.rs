//! elasticsearch-logger (`apisix/plugins/elasticsearch-logger.lua`): batches sent to the
//! `_bulk` API of `endpoint_addr` (or one of `endpoint_addrs` at random) as NDJSON, an
//! `index` action (`field.index`, with `{strftime}` parts and `$var`s resolved per request)
//! before each entry; `auth` as Basic, `headers`, `timeout` seconds. The server's major
//! version is asked once (`GET /`); for 5.x and 6.x the action names `_type: _doc`. Any
//! answer but 200 fails the batch. `https` endpoints are not built (so `ssl_verify` has
//! nothing to act on): their batches fail with that error.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, LogCtx, LogNeeds, Phases, Plugin, PluginDef, PluginServices, Template,
};
use http::{header, HeaderName, HeaderValue, Request};
use rand::Rng;
use serde_json::{json, Map, Value};

use super::batch_processor::{self, BatchSink, SendError, SendFuture};
use super::log_entry;
use super::logger::Logger;

pub const NAME: &str = "elasticsearch-logger";

pub static DEF: PluginDef = PluginDef {
    metadata_schema: Some(metadata_schema),
    check: Some(check),
    encrypt_fields: &["auth.password", "headers"],
    ..PluginDef::new(NAME, 413, schema, compile)
};

fn schema() -> Value {
    let mut props = Map::new();
    props.insert("endpoint_addr".into(), json!({"type": "string", "pattern": "[^/]$"}));
    props.insert(
        "endpoint_addrs".into(),
        json!({"type": "array", "minItems": 1, "items": {"type": "string", "pattern": "[^/]$"}}),
    );
    props.insert(
        "field".into(),
        json!({"type": "object", "properties": {"index": {"type": "string"}}, "required": ["index"]}),
    );
    props.insert(
        "auth".into(),
        json!({
            "type": "object",
            "properties": {
                "username": {"type": "string", "minLength": 1},
                "password": {"type": "string", "minLength": 1}
            },
            "oneOf": [{"required": ["username", "password"]}]
        }),
    );
    props.insert(
        "headers".into(),
        json!({"type": "object", "minProperties": 1,
            "patternProperties": {"^[^:]+$": {"type": "string", "minLength": 1}},
            "additionalProperties": false}),
    );
    props.insert(
        "timeout".into(),
        json!({"type": "integer", "minimum": 1, "default": 10}),
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
                {"required": ["endpoint_addr", "field"]},
                {"required": ["endpoint_addrs", "field"]}
            ]
        }),
        "elasticsearch-logger",
    )
}

fn metadata_schema() -> Value {
    batch_processor::wrap_metadata_schema(log_entry::metadata_schema())
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    cx.schema_result.clone()?;
    log_entry::check(cx.conf)
}

/// The server's major version once known (0: not yet).
type Version = Arc<AtomicU8>;

struct EsSink {
    endpoints: Vec<String>,
    headers: Vec<(HeaderName, HeaderValue)>,
    timeout: Duration,
    version: Version,
    services: Weak<PluginServices>,
}

impl EsSink {
    fn pick(&self) -> &str {
        &self.endpoints[rand::thread_rng().gen_range(0..self.endpoints.len())]
    }

    fn request(&self, builder: http::request::Builder) -> http::request::Builder {
        self.headers
            .iter()
            .fold(builder, |b, (k, v)| b.header(k, v))
    }

    /// `fetch_and_update_es_version`: asked until it is known.
    async fn learn_version(&self, services: &PluginServices) {
        if self.version.load(Ordering::Relaxed) != 0 {
            return;
        }
        let Ok(req) = self.request(Request::get(self.pick())).body(Bytes::new()) else {
            return;
        };
        let major = match services.http().send(req, self.timeout).await {
            Ok(r) if r.status() == 200 => serde_json::from_slice::<Value>(r.body())
                .ok()
                .and_then(|v| {
                    let n = v.pointer("/version/number")?.as_str()?.to_owned();
                    n.split('.').next()?.parse::<u8>().ok()
                }),
            Ok(r) => {
                tracing::error!(status = r.status().as_u16(), "failed to get Elasticsearch version");
                None
            }
            Err(e) => {
                tracing::error!(error = %e, "failed to get Elasticsearch version");
                None
            }
        };
        if let Some(m) = major {
            self.version.store(m, Ordering::Relaxed);
        }
    }

    async fn bulk(&self, entries: &[Bytes]) -> Result<(), SendError> {
        let Some(services) = self.services.upgrade() else {
            return Err(SendError::new("the gateway is gone"));
        };
        self.learn_version(&services).await;
        let mut body = BytesMut::new();
        for e in entries {
            body.extend_from_slice(e);
        }
        let req = self
            .request(
                Request::post(format!("{}/_bulk", self.pick()))
                    .header(header::CONTENT_TYPE, "application/x-ndjson")
                    .header(header::ACCEPT, "application/vnd.elasticsearch+json"),
            )
            .body(body.freeze())
            .map_err(|e| SendError::new(format!("invalid request: {e}")))?;
        match services.http().send(req, self.timeout).await {
            Ok(r) if r.status() != 200 => Err(SendError::new(format!(
                "elasticsearch server returned status: {}, body: {}",
                r.status().as_u16(),
                String::from_utf8_lossy(r.body())
            ))),
            Ok(_) => Ok(()),
            Err(e) => Err(SendError::new(e.to_string())),
        }
    }
}

impl BatchSink for EsSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], _: usize) -> SendFuture<'a> {
        Box::pin(self.bulk(entries))
    }
}

/// `field.index`: `{strftime}` parts (UTC) and `$var`s.
struct Index {
    template: Template,
}

/// The `{...}` parts of an index name with `%Y %m %d %H %M %S %y %j` resolved at `secs`.
fn strftime_parts(index: &str, secs: u64) -> String {
    let (y, mo, d, h, mi, s, yday) = civil(secs);
    let mut out = String::new();
    let mut rest = index;
    while let Some(open) = rest.find('{') {
        // `${var}` is a variable, not a time format.
        if open > 0 && rest.as_bytes()[open - 1] == b'$' {
            out.push_str(&rest[..=open]);
            rest = &rest[open + 1..];
            continue;
        }
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        out.push_str(&rest[..open]);
        let fmt = &rest[open + 1..open + close];
        let mut chars = fmt.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('Y') => out.push_str(&format!("{y:04}")),
                Some('y') => out.push_str(&format!("{:02}", y % 100)),
                Some('m') => out.push_str(&format!("{mo:02}")),
                Some('d') => out.push_str(&format!("{d:02}")),
                Some('H') => out.push_str(&format!("{h:02}")),
                Some('M') => out.push_str(&format!("{mi:02}")),
                Some('S') => out.push_str(&format!("{s:02}")),
                Some('j') => out.push_str(&format!("{yday:03}")),
                Some('%') => out.push('%'),
                Some(other) => {
                    out.push('%');
                    out.push(other);
                }
                None => out.push('%'),
            }
        }
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}

/// UTC year, month, day, hour, minute, second and day of the year of `secs`.
fn civil(secs: u64) -> (i64, u32, u32, u64, u64, u64, u32) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let before: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = before[(m - 1) as usize] + d + u32::from(leap && m > 2);
    (y, m, d, rem / 3600, rem % 3600 / 60, rem % 60, yday)
}

struct EsLogger {
    logger: Logger,
    index: Index,
    version: Version,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let services = cx.services;
    let filled = cx.filled();
    let index_text = filled
        .pointer("/field/index")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let index = Index {
        template: Template::parse(&index_text),
    };
    let index_vars: Vec<Box<str>> = index.template.var_names().map(Into::into).collect();
    let version: Version = Arc::default();
    let shared_version = version.clone();
    let logger = Logger::compile(cx, NAME, false, |conf| {
        let endpoints: Vec<String> = match conf.get("endpoint_addr").and_then(Value::as_str) {
            Some(one) => vec![one.to_owned()],
            None => conf
                .get("endpoint_addrs")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
        };
        if endpoints.is_empty() {
            return Err("elasticsearch-logger needs an endpoint".into());
        }
        let mut headers = Vec::new();
        if let (Some(u), Some(p)) = (
            conf.get("auth")
                .and_then(|a| a.get("username"))
                .and_then(Value::as_str),
            conf.get("auth")
                .and_then(|a| a.get("password"))
                .and_then(Value::as_str),
        ) {
            let token = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
            headers.push((
                header::AUTHORIZATION,
                HeaderValue::from_str(&format!("Basic {token}"))
                    .map_err(|_| "invalid auth".to_string())?,
            ));
        }
        for (k, v) in conf
            .get("headers")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            if let (Ok(k), Some(Ok(v))) = (
                HeaderName::from_bytes(k.as_bytes()),
                v.as_str().map(HeaderValue::from_str),
            ) {
                headers.push((k, v));
            }
        }
        Ok(Arc::new(EsSink {
            endpoints,
            headers,
            timeout: Duration::from_secs(conf.get("timeout").and_then(Value::as_u64).unwrap_or(10)),
            version: shared_version,
            services: Arc::downgrade(services),
        }) as Arc<dyn BatchSink>)
    })?
    .with_vars(&index_vars);
    Ok(Arc::new(EsLogger {
        logger,
        index,
        version,
    }))
}

impl Plugin for EsLogger {
    fn phases(&self) -> Phases {
        Phases::LOG
    }

    fn log_needs(&self) -> LogNeeds {
        self.logger.needs()
    }

    fn log(&self, ctx: &LogCtx) {
        self.logger.log_with(ctx, |entry, now_ms| {
            let index = self.index.template.resolve(ctx).text;
            let index = strftime_parts(&index, now_ms / 1000);
            let mut action = json!({"index": {"_index": index}});
            if matches!(self.version.load(Ordering::Relaxed), 5 | 6) {
                action["index"]["_type"] = json!("_doc");
            }
            let mut out = lua::cjson_encode(&action);
            out.push('\n');
            out.push_str(&lua::cjson_encode(&Value::Object(entry)));
            out.push('\n');
            Bytes::from(out)
        });
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::testing::Compiler;

    /// Elasticsearch's root (version 6.8.0) and `_bulk` APIs: hands over each bulk body.
    async fn elasticsearch() -> (u16, tokio::sync::mpsc::UnboundedReceiver<(String, String)>) {
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
                        let answer: &[u8] = if head.starts_with("get / ") {
                            b"{\"version\":{\"number\":\"6.8.0\"}}"
                        } else {
                            let body = String::from_utf8_lossy(&req[end + 4..]).into_owned();
                            tx.send((head, body)).unwrap();
                            b"{\"errors\":false}"
                        };
                        let resp = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", answer.len());
                        let _ = s.write_all(resp.as_bytes()).await;
                        let _ = s.write_all(answer).await;
                    }
                });
            }
        });
        (port, rx)
    }

    #[tokio::test]
    async fn bulk_ndjson_with_index_and_version() {
        let (port, mut rx) = elasticsearch().await;
        let c = Compiler::new();
        let conf = json!({"endpoint_addr": format!("http://127.0.0.1:{port}"),
            "field": {"index": "gw-{%Y}"}, "auth": {"username": "u", "password": "p"},
            "batch_max_size": 1, "log_format": {"s": "$status"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "es-1", None)).unwrap();
        p.log(&LogCtx {
            status: 200,
            ..Default::default()
        });
        let (head, body) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(head.starts_with("post /_bulk http/1.1"), "{head}");
        assert!(head.contains("content-type: application/x-ndjson"));
        assert!(head.contains("authorization: basic dtpw"), "{head}");
        let lines: Vec<&str> = body.lines().collect();
        let action: Value = serde_json::from_str(lines[0]).unwrap();
        assert!(action["index"]["_index"].as_str().unwrap().starts_with("gw-20"));
        assert_eq!(serde_json::from_str::<Value>(lines[1]).unwrap(), json!({"s": "200"}));
        // The version is known now: 6.x actions name the type.
        p.log(&LogCtx {
            status: 201,
            ..Default::default()
        });
        let (_, body) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(body.starts_with("{\"index\":{\"_index\":\"gw-20"), "{body}");
        assert!(body.contains("\"_type\":\"_doc\""), "{body}");
    }

    #[test]
    fn index_time_formats() {
        // 2024-01-02T03:04:05Z
        assert_eq!(strftime_parts("a-{%Y.%m.%d}-b", 1_704_164_645), "a-2024.01.02-b");
        assert_eq!(strftime_parts("x{%H:%M:%S}{%j}", 1_704_164_645), "x03:04:05002");
        assert_eq!(strftime_parts("plain", 0), "plain");
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        assert!(r
            .check(NAME, &json!({"endpoint_addr": "http://127.0.0.1:9200", "field": {"index": "i"}}))
            .is_ok());
        assert!(r.check(NAME, &json!({"endpoint_addr": "http://127.0.0.1:9200"})).is_err());
        assert!(r
            .check(NAME, &json!({"endpoint_addr": "http://127.0.0.1:9200/", "field": {"index": "i"}}))
            .is_err());
        assert_eq!(r.get(NAME).unwrap().priority, 413);
    }
}
