//! loki-logger (`apisix/plugins/loki-logger.lua`): batches pushed to Loki's
//! `endpoint_uri` (default `/loki/api/v1/push`) on one of `endpoint_addrs` picked at random,
//! as `{"streams": [{"stream": labels, "values": [[ns, line], ...]}]}`: entries with the same
//! labels (`log_labels`, `$var`s resolved per request) share a stream, each line is the
//! entry's JSON and its time the request's start in nanoseconds. `tenant_id` goes as
//! `X-Scope-OrgID`, `headers` with it; `timeout` in milliseconds; `https` endpoints checked
//! when `ssl_verify`. A connection is kept for the next batch (`keepalive`) at most
//! `keepalive_timeout` milliseconds idle, among at most `keepalive_pool` idle connections to
//! that server; with `keepalive: false` each batch has its own connection.

use std::sync::Arc;

use bytes::Bytes;
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{CompileCtx, LogCtx, Plugin, PluginDef, Template};
use http::{HeaderName, HeaderValue, Method};
use serde_json::{json, Map, Value};

use super::sink::http::{status_and_body, HttpTarget};
use super::sink::{self, conf, BatchSink, Logger, SendError, SendFuture};

pub const NAME: &str = "loki-logger";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &["headers"],
    ..sink::def(NAME, 414, schema, compile)
};

fn schema() -> Value {
    let strings =
        json!({"type": "object", "patternProperties": {".*": {"type": "string", "minLength": 1}}});
    let mut labels = strings.clone();
    labels["default"] = json!({"job": "apisix"});
    sink::schema(
        json!({
            "type": "object",
            "properties": {
                "endpoint_addrs": {"type": "array", "minItems": 1,
                    "items": {"type": "string", "pattern": r"^[^\/]+:\/\/([\da-zA-Z.-]+|\[[\da-fA-F:]+\])(:\d+)?"}},
                "endpoint_uri": {"type": "string", "minLength": 1, "default": "/loki/api/v1/push"},
                "tenant_id": {"type": "string", "default": "fake"},
                "headers": strings,
                "log_labels": labels,
                "ssl_verify": {"type": "boolean", "default": false},
                "timeout": {"type": "integer", "minimum": 1, "maximum": 60000, "default": 3000,
                    "description": "timeout in milliseconds"},
                "keepalive": {"type": "boolean", "default": true},
                "keepalive_timeout": {"type": "integer", "minimum": 1000, "default": 60000,
                    "description": "keepalive timeout in milliseconds"},
                "keepalive_pool": {"type": "integer", "minimum": 1, "default": 5}
            },
            "required": ["endpoint_addrs"]
        }),
        "loki logger",
    )
}

struct LokiSink {
    urls: Vec<String>,
    target: HttpTarget,
}

/// Groups encoded entries (`{"labels", "time", "line"}`) into Loki streams.
fn push_body(entries: &[Bytes]) -> Value {
    let mut streams: Vec<(Value, Vec<Value>)> = Vec::new();
    for e in entries {
        let Ok(v) = serde_json::from_slice::<Value>(e) else {
            continue;
        };
        let labels = v.get("labels").cloned().unwrap_or(Value::Null);
        let value = json!([v["time"], v["line"]]);
        match streams.iter_mut().find(|(l, _)| *l == labels) {
            Some((_, values)) => values.push(value),
            None => streams.push((labels, vec![value])),
        }
    }
    json!({"streams": streams
        .into_iter()
        .map(|(stream, values)| json!({"stream": stream, "values": values}))
        .collect::<Vec<_>>()})
}

impl LokiSink {
    async fn push(&self, entries: &[Bytes]) -> Result<(), SendError> {
        let body = Bytes::from(lua::cjson_encode(&push_body(entries)));
        let url = conf::pick(&self.urls);
        match self
            .target
            .call(self.target.request(Method::POST, url), body)
            .await
        {
            Ok(r) if r.status().as_u16() >= 300 => {
                let (status, body) = status_and_body(&r);
                Err(SendError::new(format!(
                    "loki server returned status: {status}, body: {body}"
                )))
            }
            Ok(_) => Ok(()),
            Err(e) => Err(e.into_send_error("")),
        }
    }
}

impl BatchSink for LokiSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], _: usize) -> SendFuture<'a> {
        Box::pin(self.push(entries))
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let services = cx.services;
    let filled = cx.filled();
    // Name, template text, parsed template.
    let labels: Vec<(String, String, Template)> = filled
        .get("log_labels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| {
            let text = v.as_str()?;
            Some((k.clone(), text.to_owned(), Template::parse(text)))
        })
        .collect();
    let label_vars: Vec<Box<str>> = labels
        .iter()
        .flat_map(|(_, _, t)| t.var_names())
        .map(Into::into)
        .collect();
    let logger = Logger::compile(cx, NAME, true, |c| {
        let uri = conf::text(c, "endpoint_uri");
        let urls: Vec<String> = c
            .get("endpoint_addrs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|a| format!("{a}{uri}"))
            .collect();
        if urls.is_empty() {
            return Err("loki-logger needs an endpoint".into());
        }
        let mut headers = conf::headers(c, "headers");
        let tenant = c.get("tenant_id").and_then(Value::as_str).unwrap_or("fake");
        headers.push((
            HeaderName::from_static("x-scope-orgid"),
            HeaderValue::from_str(tenant).map_err(|_| "invalid tenant_id".to_string())?,
        ));
        headers.push((
            HeaderName::from_static("content-type"),
            HeaderValue::from_static("application/json"),
        ));
        Ok(Arc::new(LokiSink {
            urls,
            target: HttpTarget::new(
                services,
                conf::millis(c, "timeout", 3000),
                conf::flag(c, "ssl_verify"),
                headers,
            )
            .with_keepalive_of(c, 5),
        }) as Arc<dyn BatchSink>)
    })?
    .with_vars(&label_vars);
    Ok(logger.encoded_by(move |entry, now_ms, ctx: &LogCtx| {
        let start_ms = now_ms.saturating_sub(ctx.request_time.as_millis() as u64);
        let mut resolved = Map::new();
        for (k, text, t) in &labels {
            // A label none of whose variables resolved keeps its text, as APISIX's.
            let r = t.resolve(ctx);
            let v = if r.resolved > 0 { r.text } else { text.clone() };
            resolved.insert(k.clone(), Value::String(v));
        }
        let line = lua::cjson_encode(&Value::Object(entry));
        Bytes::from(lua::cjson_encode(&json!({
            "labels": resolved,
            "time": format!("{start_ms}000000"),
            "line": line,
        })))
    }))
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::PluginServices;

    use super::*;
    use crate::log::sink::testing::{http_server, https_server, next, Captured};
    use crate::testing::Compiler;

    fn no_content(_: &Captured) -> Vec<u8> {
        b"HTTP/1.1 204 No Content\r\n\r\n".to_vec()
    }

    #[tokio::test]
    async fn entries_are_grouped_into_streams_by_labels() {
        let (port, mut rx) = http_server(no_content).await;
        let c = Compiler::new();
        let conf = json!({"endpoint_addrs": [format!("http://127.0.0.1:{port}")], "tenant_id": "t1",
            "log_labels": {"job": "gw", "code": "$status"}, "batch_max_size": 3,
            "log_format": {"s": "$status"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "lk-1", None)).unwrap();
        for status in [200, 500, 200] {
            p.log(&LogCtx {
                status,
                ..Default::default()
            });
        }
        let req = next(&mut rx).await;
        let (head, body): (String, Value) =
            (req.lower(), serde_json::from_slice(&req.body).unwrap());
        assert!(
            head.starts_with("post /loki/api/v1/push http/1.1"),
            "{head}"
        );
        assert!(head.contains("x-scope-orgid: t1"));
        let streams = body["streams"].as_array().unwrap();
        assert_eq!(streams.len(), 2);
        assert_eq!(streams[0]["stream"], json!({"job": "gw", "code": "200"}));
        assert_eq!(streams[0]["values"].as_array().unwrap().len(), 2);
        let line: Value =
            serde_json::from_str(streams[1]["values"][0][1].as_str().unwrap()).unwrap();
        assert_eq!(line, json!({"s": "500", "route_id": "no-matched"}));
        assert!(streams[1]["values"][0][0]
            .as_str()
            .unwrap()
            .ends_with("000000"));
    }

    #[tokio::test]
    async fn endpoint_uri_headers_and_the_keepalive_options() {
        let (port, mut rx) = http_server(no_content).await;
        let c = Compiler::new();
        // The keepalive options pass the schema (their effect: sink/http.rs's tests).
        let conf = json!({"endpoint_addrs": [format!("http://127.0.0.1:{port}")],
            "endpoint_uri": "/custom/push", "headers": {"X-Extra": "yes"}, "timeout": 2000,
            "keepalive": false, "keepalive_timeout": 1000, "keepalive_pool": 2,
            "batch_max_size": 1, "log_format": {"s": "$status"}});
        let r = crate::PluginRegistry::builtin();
        assert!(r.check(NAME, &conf).is_ok());
        let p = (DEF.compile)(&c.cx(NAME, &conf, "lk-uri", None)).unwrap();
        p.log(&LogCtx {
            status: 201,
            ..Default::default()
        });
        let req = next(&mut rx).await;
        let head = req.lower();
        assert!(head.starts_with("post /custom/push http/1.1"), "{head}");
        assert!(head.contains("x-extra: yes"), "{head}");
        // Without `tenant_id`, Loki's default tenant.
        assert!(head.contains("x-scope-orgid: fake"), "{head}");
        let body: Value = serde_json::from_slice(&req.body).unwrap();
        let line: Value =
            serde_json::from_str(body["streams"][0]["values"][0][1].as_str().unwrap()).unwrap();
        assert_eq!(line["s"], "201");
    }

    #[tokio::test]
    async fn https_endpoints_as_ssl_verify_says() {
        let (port, mut rx) = https_server(no_content).await;
        let services = Arc::new(PluginServices::default());
        let c = Compiler::with(services);
        let conf = json!({"endpoint_addrs": [format!("https://127.0.0.1:{port}")], "batch_max_size": 1,
            "log_format": {"s": "$status"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "lk-tls", None)).unwrap();
        p.log(&LogCtx {
            status: 200,
            ..Default::default()
        });
        let body: Value = serde_json::from_slice(&next(&mut rx).await.body).unwrap();
        assert_eq!(body["streams"][0]["stream"], json!({"job": "apisix"}));
        // Verified against the system's bundle, the test certificate fails.
        let sink = LokiSink {
            urls: vec![format!("https://127.0.0.1:{port}/loki/api/v1/push")],
            target: HttpTarget::new(
                c.registry.services(),
                std::time::Duration::from_secs(3),
                true,
                Vec::new(),
            ),
        };
        let err = sink.push(&[Bytes::from_static(b"{}")]).await.unwrap_err();
        assert!(
            err.message.starts_with("TLS handshake failed: "),
            "{}",
            err.message
        );
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        assert!(r
            .check(NAME, &json!({"endpoint_addrs": ["http://127.0.0.1:3100"]}))
            .is_ok());
        assert!(r.check(NAME, &json!({"endpoint_addrs": []})).is_err());
        assert_eq!(r.get(NAME).unwrap().priority, 414);
    }
}
