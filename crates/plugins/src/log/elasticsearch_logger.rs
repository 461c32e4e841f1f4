//! elasticsearch-logger (`apisix/plugins/elasticsearch-logger.lua`): batches sent to the
//! `_bulk` API of `endpoint_addr` (or one of `endpoint_addrs` at random) as NDJSON, an
//! `index` action (`field.index`, with `{strftime}` parts and `$var`s resolved per request)
//! before each entry; `auth` as Basic, `headers`, `timeout` seconds, `https` endpoints
//! checked when `ssl_verify` (the default). The server's major version is asked once
//! (`GET /`); for 5.x and 6.x the action names `_type: _doc`. Any answer but 200 fails the
//! batch.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::clock::CivilTime;
use ferrisix_plugin_api::{CompileCtx, LogCtx, Plugin, PluginDef, Template};
use http::{header, HeaderValue, Method};
use serde_json::{json, Value};

use super::sink::http::{status_and_body, HttpTarget};
use super::sink::{self, conf, BatchSink, Logger, SendError, SendFuture};

pub const NAME: &str = "elasticsearch-logger";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &["auth.password", "headers"],
    ..sink::def(NAME, 413, schema, compile)
};

fn schema() -> Value {
    sink::schema(
        json!({
            "type": "object",
            "properties": {
                "endpoint_addr": {"type": "string", "pattern": "[^/]$"},
                "endpoint_addrs": {"type": "array", "minItems": 1, "items": {"type": "string", "pattern": "[^/]$"}},
                "field": {"type": "object", "properties": {"index": {"type": "string"}}, "required": ["index"]},
                "auth": {
                    "type": "object",
                    "properties": {
                        "username": {"type": "string", "minLength": 1},
                        "password": {"type": "string", "minLength": 1}
                    },
                    "oneOf": [{"required": ["username", "password"]}]
                },
                "headers": {"type": "object", "minProperties": 1,
                    "patternProperties": {"^[^:]+$": {"type": "string", "minLength": 1}},
                    "additionalProperties": false},
                "timeout": {"type": "integer", "minimum": 1, "default": 10},
                "ssl_verify": {"type": "boolean", "default": true}
            },
            "oneOf": [
                {"required": ["endpoint_addr", "field"]},
                {"required": ["endpoint_addrs", "field"]}
            ]
        }),
        "elasticsearch-logger",
    )
}

/// The server's major version once known (0: not yet).
type Version = Arc<AtomicU8>;

struct EsSink {
    endpoints: Vec<String>,
    target: HttpTarget,
    version: Version,
}

impl EsSink {
    /// `fetch_and_update_es_version`: asked until it is known.
    async fn learn_version(&self) {
        if self.version.load(Ordering::Relaxed) != 0 {
            return;
        }
        let req = self
            .target
            .request(Method::GET, conf::pick(&self.endpoints).as_str());
        let major =
            match self.target.call(req, Bytes::new()).await {
                Ok(r) if r.status() == 200 => serde_json::from_slice::<Value>(r.body())
                    .ok()
                    .and_then(|v| {
                        let n = v.pointer("/version/number")?.as_str()?.to_owned();
                        n.split('.').next()?.parse::<u8>().ok()
                    }),
                Ok(r) => {
                    tracing::error!(
                        status = r.status().as_u16(),
                        "failed to get Elasticsearch version"
                    );
                    None
                }
                Err(e) => {
                    tracing::error!(error = ?e, "failed to get Elasticsearch version");
                    None
                }
            };
        if let Some(m) = major {
            self.version.store(m, Ordering::Relaxed);
        }
    }

    async fn bulk(&self, entries: &[Bytes]) -> Result<(), SendError> {
        self.learn_version().await;
        let mut body = BytesMut::new();
        for e in entries {
            body.extend_from_slice(e);
        }
        let req = self
            .target
            .request(
                Method::POST,
                &format!("{}/_bulk", conf::pick(&self.endpoints).as_str()),
            )
            .header(header::CONTENT_TYPE, "application/x-ndjson")
            .header(header::ACCEPT, "application/vnd.elasticsearch+json");
        match self.target.call(req, body.freeze()).await {
            Ok(r) if r.status() != 200 => {
                let (status, body) = status_and_body(&r);
                Err(SendError::new(format!(
                    "elasticsearch server returned status: {status}, body: {body}"
                )))
            }
            Ok(_) => Ok(()),
            Err(e) => Err(e.into_send_error("")),
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
    let t = CivilTime::from_unix_secs(secs);
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
                Some('Y') => out.push_str(&format!("{:04}", t.year)),
                Some('y') => out.push_str(&format!("{:02}", t.year % 100)),
                Some('m') => out.push_str(&format!("{:02}", t.month)),
                Some('d') => out.push_str(&format!("{:02}", t.day)),
                Some('H') => out.push_str(&format!("{:02}", t.hour)),
                Some('M') => out.push_str(&format!("{:02}", t.minute)),
                Some('S') => out.push_str(&format!("{:02}", t.second)),
                Some('j') => out.push_str(&format!("{:03}", t.day_of_year())),
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

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let services = cx.services;
    let filled = cx.filled();
    let index_text = filled
        .pointer("/field/index")
        .and_then(Value::as_str)
        .unwrap_or("");
    let index = Index {
        template: Template::parse(index_text),
    };
    let index_vars: Vec<Box<str>> = index.template.var_names().map(Into::into).collect();
    let version: Version = Arc::default();
    let shared_version = version.clone();
    let logger = Logger::compile(cx, NAME, false, |c| {
        let endpoints = conf::endpoints(c, NAME)?;
        let mut headers = Vec::new();
        let auth = |k: &str| c.get("auth").and_then(|a| a.get(k)).and_then(Value::as_str);
        if let (Some(u), Some(p)) = (auth("username"), auth("password")) {
            let token = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
            headers.push((
                header::AUTHORIZATION,
                HeaderValue::from_str(&format!("Basic {token}"))
                    .map_err(|_| "invalid auth".to_string())?,
            ));
        }
        headers.extend(conf::headers(c, "headers"));
        Ok(Arc::new(EsSink {
            endpoints,
            target: HttpTarget::new(
                services,
                conf::secs(c, "timeout", 10),
                conf::flag(c, "ssl_verify"),
                headers,
            ),
            version: shared_version,
        }) as Arc<dyn BatchSink>)
    })?
    .with_vars(&index_vars);
    Ok(logger.encoded_by(move |entry, now_ms, ctx: &LogCtx| {
        let name = index.template.resolve(ctx).text;
        let name = strftime_parts(&name, now_ms / 1000);
        let mut action = json!({"index": {"_index": name}});
        if matches!(version.load(Ordering::Relaxed), 5 | 6) {
            action["index"]["_type"] = json!("_doc");
        }
        let mut out = lua::cjson_encode(&action);
        out.push('\n');
        out.push_str(&lua::cjson_encode(&Value::Object(entry)));
        out.push('\n');
        Bytes::from(out)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::sink::testing::{answer, http_server, https_server, next, Captured};
    use crate::testing::Compiler;
    use ferrisix_config::validate::PluginCheck;

    /// Elasticsearch's root (version 6.8.0) and `_bulk` APIs.
    fn elasticsearch(req: &Captured) -> Vec<u8> {
        if req.head.starts_with("GET / ") {
            answer(200, "{\"version\":{\"number\":\"6.8.0\"}}")
        } else {
            answer(200, "{\"errors\":false}")
        }
    }

    /// The next `_bulk` request.
    async fn next_bulk(
        rx: &mut tokio::sync::mpsc::UnboundedReceiver<Captured>,
    ) -> (String, String) {
        loop {
            let req = next(rx).await;
            if !req.head.starts_with("GET / ") {
                return (req.lower(), req.text());
            }
        }
    }

    #[tokio::test]
    async fn bulk_ndjson_with_index_and_version() {
        let (port, mut rx) = http_server(elasticsearch).await;
        let c = Compiler::new();
        let conf = json!({"endpoint_addr": format!("http://127.0.0.1:{port}"),
            "field": {"index": "gw-{%Y}"}, "auth": {"username": "u", "password": "p"},
            "batch_max_size": 1, "log_format": {"s": "$status"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "es-1", None)).unwrap();
        p.log(&LogCtx {
            status: 200,
            ..Default::default()
        });
        let (head, body) = next_bulk(&mut rx).await;
        assert!(head.starts_with("post /_bulk http/1.1"), "{head}");
        assert!(head.contains("content-type: application/x-ndjson"));
        assert!(head.contains("authorization: basic dtpw"), "{head}");
        let lines: Vec<&str> = body.lines().collect();
        let action: Value = serde_json::from_str(lines[0]).unwrap();
        assert!(action["index"]["_index"]
            .as_str()
            .unwrap()
            .starts_with("gw-20"));
        assert_eq!(
            serde_json::from_str::<Value>(lines[1]).unwrap(),
            json!({"s": "200"})
        );
        // The version is known now: 6.x actions name the type.
        p.log(&LogCtx {
            status: 201,
            ..Default::default()
        });
        let (_, body) = next_bulk(&mut rx).await;
        assert!(body.starts_with("{\"index\":{\"_index\":\"gw-20"), "{body}");
        assert!(body.contains("\"_type\":\"_doc\""), "{body}");
    }

    #[tokio::test]
    async fn https_endpoints() {
        let (port, mut rx) = https_server(elasticsearch).await;
        let c = Compiler::new();
        let conf = json!({"endpoint_addr": format!("https://127.0.0.1:{port}"), "ssl_verify": false,
            "field": {"index": "i"}, "batch_max_size": 1, "log_format": {"s": "$status"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "es-tls", None)).unwrap();
        p.log(&LogCtx {
            status: 200,
            ..Default::default()
        });
        let (head, body) = next_bulk(&mut rx).await;
        assert!(head.starts_with("post /_bulk http/1.1"), "{head}");
        assert!(body.ends_with("{\"s\":\"200\"}\n"), "{body}");
        let verified = EsSink {
            endpoints: vec![format!("https://127.0.0.1:{port}")],
            target: HttpTarget::new(
                c.registry.services(),
                std::time::Duration::from_secs(3),
                true,
                Vec::new(),
            ),
            version: Arc::new(AtomicU8::new(7)),
        };
        let err = verified
            .bulk(&[Bytes::from_static(b"{}\n")])
            .await
            .unwrap_err();
        assert!(
            err.message.starts_with("TLS handshake failed: "),
            "{}",
            err.message
        );
    }

    #[test]
    fn index_time_formats() {
        // 2024-01-02T03:04:05Z
        assert_eq!(
            strftime_parts("a-{%Y.%m.%d}-b", 1_704_164_645),
            "a-2024.01.02-b"
        );
        assert_eq!(
            strftime_parts("x{%H:%M:%S}{%j}", 1_704_164_645),
            "x03:04:05002"
        );
        assert_eq!(strftime_parts("plain", 0), "plain");
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        assert!(r
            .check(
                NAME,
                &json!({"endpoint_addr": "http://127.0.0.1:9200", "field": {"index": "i"}})
            )
            .is_ok());
        assert!(r
            .check(NAME, &json!({"endpoint_addr": "http://127.0.0.1:9200"}))
            .is_err());
        assert!(r
            .check(
                NAME,
                &json!({"endpoint_addr": "http://127.0.0.1:9200/", "field": {"index": "i"}})
            )
            .is_err());
        assert_eq!(r.get(NAME).unwrap().priority, 413);
    }
}
