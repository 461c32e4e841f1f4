//! clickhouse-logger (`apisix/plugins/clickhouse-logger.lua`): batches inserted over
//! ClickHouse's HTTP interface, `INSERT INTO <logtable> FORMAT JSONEachRow` followed by the
//! entries (space-separated), with `X-ClickHouse-User`/`-Key`/`-Database`, to `endpoint_addr`
//! or one of `endpoint_addrs` picked at random per batch; `https` endpoints checked when
//! `ssl_verify` (the default).

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use ferrisix_plugin_api::{CompileCtx, Plugin, PluginDef};
use http::{header, HeaderName, HeaderValue, Method, Uri};
use serde_json::{json, Value};

use super::sink::http::{status_and_body, HttpTarget};
use super::sink::{self, conf, encode_batch, BatchSink, Concat, Logger, SendError, SendFuture};

pub const NAME: &str = "clickhouse-logger";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &["password"],
    ..sink::def(NAME, 398, schema, compile)
};

fn schema() -> Value {
    let uri = json!({"type": "string", "pattern": r"^[^\/]+:\/\/([\da-zA-Z.-]+|\[[\da-fA-F:]+\])(:\d+)?"});
    let text = json!({"type": "string", "default": ""});
    sink::schema(
        json!({
            "type": "object",
            "properties": {
                "endpoint_addr": uri,
                "endpoint_addrs": {"items": uri, "type": "array", "minItems": 1},
                "user": text,
                "password": text,
                "database": text,
                "logtable": text,
                "timeout": {"type": "integer", "minimum": 1, "default": 3},
                "name": {"type": "string", "default": "clickhouse logger"},
                "ssl_verify": {"type": "boolean", "default": true}
            },
            "oneOf": [
                {"required": ["endpoint_addr", "user", "password", "database", "logtable"]},
                {"required": ["endpoint_addrs", "user", "password", "database", "logtable"]}
            ]
        }),
        "clickhouse logger",
    )
}

struct ClickHouseSink {
    endpoints: Vec<Uri>,
    logtable: String,
    target: HttpTarget,
}

impl ClickHouseSink {
    async fn insert(&self, rows: Bytes) -> Result<(), SendError> {
        let uri = conf::pick(&self.endpoints);
        let host = uri.host().unwrap_or("");
        let port = uri
            .port_u16()
            .unwrap_or(if uri.scheme_str() == Some("https") {
                443
            } else {
                80
            });
        let mut body = BytesMut::with_capacity(rows.len() + self.logtable.len() + 40);
        body.put_slice(b"INSERT INTO ");
        body.put_slice(self.logtable.as_bytes());
        body.put_slice(b" FORMAT JSONEachRow ");
        body.put_slice(&rows);
        let req = self
            .target
            .request(Method::POST, &uri.to_string())
            .header(header::HOST, host);
        match self.target.call(req, body.freeze()).await {
            Ok(r) if r.status().as_u16() >= 400 => {
                let (status, body) = status_and_body(&r);
                Err(SendError::new(format!(
                    "server returned status code[{status}] host[{host}] port[{port}] body[{body}]"
                )))
            }
            Ok(_) => Ok(()),
            Err(e) => Err(e.into_send_error(&format!(
                "error while sending data to [{host}] port[{port}] "
            ))),
        }
    }
}

impl BatchSink for ClickHouseSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], batch_max_size: usize) -> SendFuture<'a> {
        Box::pin(self.insert(encode_batch(entries, batch_max_size, Concat::Space)))
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let services = cx.services;
    let logger = Logger::compile(cx, NAME, false, |c| {
        let endpoints: Vec<Uri> = conf::endpoints(c, NAME)?
            .into_iter()
            .map(|u| {
                u.parse::<Uri>()
                    .map_err(|e| format!("invalid endpoint {u}: {e}"))
            })
            .collect::<Result<_, _>>()?;
        let mut headers = vec![(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )];
        for (name, field) in [
            ("x-clickhouse-user", "user"),
            ("x-clickhouse-key", "password"),
            ("x-clickhouse-database", "database"),
        ] {
            let v = HeaderValue::from_str(conf::text(c, field))
                .map_err(|_| format!("invalid {field}: not a header value"))?;
            headers.push((HeaderName::from_static(name), v));
        }
        Ok(Arc::new(ClickHouseSink {
            endpoints,
            logtable: conf::text(c, "logtable").to_owned(),
            target: HttpTarget::new(
                services,
                conf::secs(c, "timeout", 3),
                conf::flag(c, "ssl_verify"),
                headers,
            ),
        }) as Arc<dyn BatchSink>)
    })?;
    Ok(logger.into_plugin())
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::LogCtx;

    use super::*;
    use crate::log::sink::testing::{answer, http_server, https_server, next, Captured};
    use crate::testing::Compiler;

    fn ok(_: &Captured) -> Vec<u8> {
        answer(200, "")
    }

    #[tokio::test]
    async fn rows_are_inserted_as_json_each_row() {
        let (port, mut rx) = http_server(ok).await;
        let c = Compiler::new();
        let conf = json!({"endpoint_addrs": [format!("http://127.0.0.1:{port}")], "user": "default",
            "password": "pw", "database": "logs", "logtable": "t", "batch_max_size": 2,
            "log_format": {"s": "$status"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "ch-1", None)).unwrap();
        for status in [200, 500] {
            p.log(&LogCtx {
                status,
                ..Default::default()
            });
        }
        let req = next(&mut rx).await;
        let (head, body) = (req.lower(), req.text());
        assert!(head.starts_with("post / http/1.1"), "{head}");
        assert!(head.contains("x-clickhouse-user: default"));
        assert!(head.contains("x-clickhouse-key: pw"));
        assert!(head.contains("x-clickhouse-database: logs"));
        assert_eq!(
            body,
            "INSERT INTO t FORMAT JSONEachRow {\"s\":\"200\"} {\"s\":\"500\"}"
        );
    }

    #[tokio::test]
    async fn https_endpoints_verified_by_default() {
        let (port, mut rx) = https_server(ok).await;
        let c = Compiler::new();
        let conf = json!({"endpoint_addr": format!("https://127.0.0.1:{port}"), "user": "u",
            "password": "p", "database": "d", "logtable": "t", "batch_max_size": 1,
            "log_format": {"s": "$status"}, "ssl_verify": false});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "ch-tls", None)).unwrap();
        p.log(&LogCtx {
            status: 200,
            ..Default::default()
        });
        assert_eq!(
            next(&mut rx).await.text(),
            "INSERT INTO t FORMAT JSONEachRow {\"s\":\"200\"}"
        );
        // `ssl_verify` defaults to true: the test certificate is not in the system's bundle.
        let schema = &c.registry.get(NAME).unwrap().schema;
        assert_eq!(schema["properties"]["ssl_verify"]["default"], true);
        let sink = ClickHouseSink {
            endpoints: vec![format!("https://127.0.0.1:{port}").parse().unwrap()],
            logtable: "t".into(),
            target: HttpTarget::new(
                c.registry.services(),
                std::time::Duration::from_secs(3),
                true,
                Vec::new(),
            ),
        };
        let err = sink.insert(Bytes::from_static(b"{}")).await.unwrap_err();
        assert!(
            err.message.starts_with(&format!(
                "error while sending data to [127.0.0.1] port[{port}] TLS handshake failed: "
            )),
            "{}",
            err.message
        );
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        assert!(r
            .check(
                NAME,
                &json!({"endpoint_addr": "http://127.0.0.1:8123", "user": "u",
                "password": "p", "database": "d", "logtable": "t"})
            )
            .is_ok());
        // user, password, database and logtable have defaults; an endpoint has none.
        assert!(r.check(NAME, &json!({"user": "u"})).is_err());
        assert_eq!(r.get(NAME).unwrap().priority, 398);
    }
}
