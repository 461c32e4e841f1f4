//! splunk-hec-logging (`apisix/plugins/splunk-hec-logging.lua`): batches of events POSTed to
//! Splunk's HTTP Event Collector at `endpoint.uri`, the events' JSON objects one after the
//! other (HEC's batch format), with `Authorization: Splunk <endpoint.token>` and
//! `X-Splunk-Request-Channel: <endpoint.channel>` when set; `endpoint.timeout` seconds;
//! `ssl_verify` (default on) for `https`. Each event is `{"time": <s.ms>, "source":
//! "apache-apisix-splunk-hec-logging", "sourcetype": "_json", "host", "event"}`: with the
//! default entry the event is APISIX's selection of it (`request_url`, `request_method`,
//! `request_headers`, `request_query`, `request_size`, `response_headers`, `response_status`,
//! `response_size`, `latency`, `upstream`) plus the `log_format_extra` fields it lacks, and
//! `host` the entry's server hostname; with a `log_format` the event is that entry. Only an
//! answer of 200 succeeds; HEC's `{"text": ...}` is the error. A connection is kept for the
//! next batch at most `endpoint.keepalive_timeout` milliseconds idle.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{CompileCtx, LogCtx, Plugin, PluginDef, PluginServices};
use http::{header, HeaderName, HeaderValue, Method};
use serde_json::{json, Map, Value};

use super::log_entry;
use super::sink::http::HttpTarget;
use super::sink::{self, conf, BatchSink, EntryParts, Logger, SendError, SendFuture};

pub const NAME: &str = "splunk-hec-logging";

const SOURCE: &str = "apache-apisix-splunk-hec-logging";
const SOURCE_TYPE: &str = "_json";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &["endpoint.token"],
    ..sink::def(NAME, 409, schema, compile)
};

fn schema() -> Value {
    sink::batch_schema(
        json!({
            "type": "object",
            "properties": {
                "endpoint": {
                    "type": "object",
                    "properties": {
                        "uri": {"type": "string", "pattern": r"^[^\/]+:\/\/([\da-zA-Z.-]+|\[[\da-fA-F:]+\])(:\d+)?"},
                        "token": {"type": "string"},
                        "channel": {"type": "string"},
                        "timeout": {"type": "integer", "minimum": 1, "default": 10},
                        "keepalive_timeout": {"type": "integer", "minimum": 1000, "default": 60000,
                            "description": "keepalive timeout in milliseconds"}
                    },
                    "required": ["uri", "token"]
                },
                "ssl_verify": {"type": "boolean", "default": true},
                "log_format": {"type": "object"},
                "log_format_extra": {"type": "object"}
            },
            "required": ["endpoint"]
        }),
        NAME,
    )
}

/// The HEC event of one request (`get_logger_entry`).
fn event(parts: EntryParts, now_ms: u64, hostname: &str) -> Value {
    let EntryParts {
        entry,
        extra,
        customized,
    } = parts;
    let (host, event) = if customized {
        (Value::String(hostname.to_owned()), Value::Object(entry))
    } else {
        let get = |v: &Value, k: &str| v.get(k).cloned().unwrap_or(Value::Null);
        let req = entry.get("request").cloned().unwrap_or(Value::Null);
        let resp = entry.get("response").cloned().unwrap_or(Value::Null);
        let mut ev = Map::new();
        let mut put = |k: &str, v: Value| {
            // A Lua table drops nil fields.
            if !v.is_null() {
                ev.insert(k.to_owned(), v);
            }
        };
        put("request_url", get(&req, "url"));
        put("request_method", get(&req, "method"));
        put("request_headers", get(&req, "headers"));
        put("request_query", get(&req, "querystring"));
        put("request_size", get(&req, "size"));
        put("response_headers", get(&resp, "headers"));
        put("response_status", get(&resp, "status"));
        put("response_size", get(&resp, "size"));
        put(
            "latency",
            entry.get("latency").cloned().unwrap_or(Value::Null),
        );
        put(
            "upstream",
            entry.get("upstream").cloned().unwrap_or(Value::Null),
        );
        for (k, v) in extra.into_iter().flatten() {
            ev.entry(k).or_insert(v);
        }
        let host = entry
            .get("server")
            .and_then(|s| s.get("hostname"))
            .cloned()
            .unwrap_or(Value::Null);
        (host, Value::Object(ev))
    };
    let mut out = Map::new();
    out.insert("time".into(), json!(now_ms as f64 / 1000.0));
    out.insert("source".into(), Value::String(SOURCE.into()));
    out.insert("sourcetype".into(), Value::String(SOURCE_TYPE.into()));
    if !host.is_null() {
        out.insert("host".into(), host);
    }
    out.insert("event".into(), event);
    Value::Object(out)
}

struct SplunkSink {
    uri: String,
    target: HttpTarget,
}

impl SplunkSink {
    fn new(c: &Map<String, Value>, services: &Arc<PluginServices>) -> Result<SplunkSink, String> {
        let endpoint = c
            .get("endpoint")
            .and_then(Value::as_object)
            .ok_or("splunk-hec-logging needs an endpoint")?;
        let uri = conf::text(endpoint, "uri").to_owned();
        uri.parse::<http::Uri>()
            .map_err(|e| format!("invalid uri {uri}: {e}"))?;
        let mut headers = vec![(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )];
        let token = format!("Splunk {}", conf::text(endpoint, "token"));
        headers.push((
            header::AUTHORIZATION,
            HeaderValue::from_str(&token).map_err(|_| "invalid endpoint.token".to_string())?,
        ));
        if let Some(ch) = endpoint.get("channel").and_then(Value::as_str) {
            headers.push((
                HeaderName::from_static("x-splunk-request-channel"),
                HeaderValue::from_str(ch).map_err(|_| "invalid endpoint.channel".to_string())?,
            ));
        }
        Ok(SplunkSink {
            uri,
            target: HttpTarget::new(
                services,
                conf::secs(endpoint, "timeout", 10),
                c.get("ssl_verify").and_then(Value::as_bool).unwrap_or(true),
                headers,
            )
            // lua-resty-http's `request_uri` with `keepalive_timeout` and nginx's default pool
            // size (`lua_socket_pool_size`).
            .with_keepalive_of(endpoint, 30),
        })
    }

    async fn post(&self, body: Bytes) -> Result<(), SendError> {
        let resp = self
            .target
            .call(self.target.request(Method::POST, &self.uri), body)
            .await
            .map_err(|e| e.into_send_error("failed to write log to splunk, "))?;
        if resp.status().as_u16() == 200 {
            return Ok(());
        }
        // HEC answers errors as `{"text": "...", "code": n}`.
        let text = serde_json::from_slice::<Value>(resp.body())
            .ok()
            .filter(|v| !v.is_null())
            .map(|v| match v.get("text") {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => "nil".into(),
            });
        Err(SendError::new(match text {
            Some(t) => format!("failed to send splunk, {t}"),
            None => format!(
                "failed to send splunk, http status code: {}",
                resp.status().as_u16()
            ),
        }))
    }
}

impl BatchSink for SplunkSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], _: usize) -> SendFuture<'a> {
        // HEC takes a batch as event objects one after the other, without separator.
        let mut body = BytesMut::with_capacity(entries.iter().map(Bytes::len).sum());
        for e in entries {
            body.extend_from_slice(e);
        }
        Box::pin(self.post(body.freeze()))
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let services = cx.services;
    let logger = Logger::compile(cx, NAME, false, |c| {
        Ok(Arc::new(SplunkSink::new(c, services)?) as Arc<dyn BatchSink>)
    })?;
    let hostname = log_entry::hostname();
    Ok(logger.encoded_by_parts(move |parts, now_ms, _: &LogCtx| {
        Bytes::from(lua::cjson_encode(&event(parts, now_ms, &hostname)))
    }))
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;

    use super::*;
    use crate::log::sink::testing::{answer, http_server, log_ctx, next, Captured};
    use crate::testing::Compiler;

    /// A HEC endpoint: `/services/collector` with token `t0k` is accepted, as Splunk answers
    /// it; another token gets HEC's 403.
    fn hec(req: &Captured) -> Vec<u8> {
        if !req.head.starts_with("POST /services/collector ") {
            return answer(
                404,
                r#"{"text":"The requested URL was not found on this server.","code":404}"#,
            );
        }
        if !req.lower().contains("\r\nauthorization: splunk t0k") {
            return answer(403, r#"{"text":"Invalid token","code":4}"#);
        }
        answer(200, r#"{"text":"Success","code":0}"#)
    }

    /// The events of a HEC batch: JSON objects one after the other.
    fn events(body: &[u8]) -> Vec<Value> {
        serde_json::Deserializer::from_slice(body)
            .into_iter::<Value>()
            .map(Result::unwrap)
            .collect()
    }

    #[tokio::test]
    async fn default_events_with_token_and_channel() {
        let (port, mut rx) = http_server(hec).await;
        let c = Compiler::new();
        let conf = json!({"endpoint": {"uri": format!("http://127.0.0.1:{port}/services/collector"),
            "token": "t0k", "channel": "FE0ECFAD-13D5-401B-847D-77833BD77131"},
            "batch_max_size": 2, "log_format_extra": {"route": "$route_id", "request_url": "x"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "sp-1", None)).unwrap();
        for n in 0..2 {
            p.log(&log_ctx(&*p, n));
        }
        let req = next(&mut rx).await;
        let head = req.lower();
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(head.contains("x-splunk-request-channel: fe0ecfad-13d5-401b-847d-77833bd77131"));
        let evs = events(&req.body);
        assert_eq!(evs.len(), 2);
        let e = &evs[1];
        assert_eq!(e["source"], SOURCE);
        assert_eq!(e["sourcetype"], "_json");
        assert_eq!(e["host"], log_entry::hostname());
        assert!(e["time"].as_f64().unwrap() > 1.7e9, "{e}");
        assert_eq!(e["event"]["response_status"], 200);
        assert_eq!(e["event"]["request_query"]["n"], "1");
        // An extra field the event has already is not replaced; others are added.
        assert!(e["event"]["request_url"]
            .as_str()
            .unwrap()
            .ends_with("/x?n=1"));
        assert_eq!(e["event"]["route"], "r1");
        assert!(
            e["event"].get("server").is_none(),
            "only APISIX's selection"
        );
    }

    #[tokio::test]
    async fn log_format_events_and_hec_errors() {
        let (port, mut rx) = http_server(hec).await;
        let services = Arc::new(PluginServices::default());
        let c = Compiler::with(services.clone());
        let conf = json!({"endpoint": {"uri": format!("http://127.0.0.1:{port}/services/collector"),
            "token": "t0k"}, "batch_max_size": 1, "log_format": {"u": "$request_uri"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "sp-2", None)).unwrap();
        p.log(&log_ctx(&*p, 7));
        let req = next(&mut rx).await;
        assert!(!req.lower().contains("x-splunk-request-channel"));
        let e = &events(&req.body)[0];
        assert_eq!(e["event"], json!({"u": "/x?n=7", "route_id": "r1"}));
        assert_eq!(e["host"], log_entry::hostname());
        // HEC's error text, and the status when the body is no JSON.
        let filled = |token: &str, path: &str| {
            json!({"endpoint": {"uri": format!("http://127.0.0.1:{port}{path}"), "token": token},
                "ssl_verify": true})
        };
        let bad = SplunkSink::new(
            filled("nope", "/services/collector").as_object().unwrap(),
            &services,
        )
        .unwrap();
        let err = bad.post(Bytes::from_static(b"{}")).await.unwrap_err();
        assert_eq!(err.message, "failed to send splunk, Invalid token");
        fn not_json(_: &Captured) -> Vec<u8> {
            answer(503, "busy")
        }
        let (port2, _rx2) = http_server(not_json).await;
        let busy = SplunkSink::new(
            json!({"endpoint": {"uri": format!("http://127.0.0.1:{port2}/"), "token": "t"}})
                .as_object()
                .unwrap(),
            &services,
        )
        .unwrap();
        let err = busy.post(Bytes::from_static(b"{}")).await.unwrap_err();
        assert_eq!(err.message, "failed to send splunk, http status code: 503");
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        let err = |c: Value| r.check(NAME, &c).unwrap_err();
        let pre = "failed to check the configuration of plugin splunk-hec-logging err: ";
        assert_eq!(
            err(json!({})),
            format!("{pre}property \"endpoint\" is required")
        );
        assert_eq!(
            err(json!({"endpoint": {"uri": "http://127.0.0.1:8088"}})),
            format!("{pre}property \"endpoint\" validation failed: property \"token\" is required")
        );
        assert_eq!(
            err(json!({"endpoint": {"uri": "http://127.0.0.1:8088", "token": "t", "timeout": 0}})),
            format!("{pre}property \"endpoint\" validation failed: property \"timeout\" validation failed: expected 0 to be at least 1")
        );
        assert!(r
            .check(NAME, &json!({"endpoint": {"uri": "http://127.0.0.1:8088/services/collector", "token": "t"}}))
            .is_ok());
        let info = r.get(NAME).unwrap();
        assert_eq!(info.priority, 409);
        assert_eq!(info.schema["properties"]["name"]["default"], NAME);
        assert!(info.schema["properties"].get("include_req_body").is_none());
    }
}
