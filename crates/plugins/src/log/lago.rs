//! lago (`apisix/plugins/lago.lua`): one usage event per request for Lago, the billing
//! platform, batched by the batch processor (`batch_max_size` defaulting to 100, Lago's
//! limit per batch call) and POSTed to a random one of `endpoint_addrs` + `endpoint_uri`
//! (default `/api/v1/events/batch`) as `{"events": [...]}` with `Authorization: Bearer
//! <token>`.
//!
//! Each event is `{"transaction_id", "external_subscription_id", "code", "timestamp",
//! "properties"}`: `event_transaction_id` and `event_subscription_id` are templates of request
//! variables (`core.utils.resolve_var`: `$var`, `${var}`, `${var ?? default}`; an unset variable
//! becomes empty), `event_code` is taken as it is, the timestamp is the request's start in
//! seconds (milliseconds as the fraction, `ngx.req.start_time()`), and each of
//! `event_properties`' values is resolved the same way, kept as written when none of its
//! variables had a value (as APISIX's `n_resolved > 0`).
//!
//! `timeout` is in milliseconds for the whole call; `ssl_verify` (default on) checks an
//! `https` endpoint's certificate against the gateway's trusted bundle; an answer of 300 or
//! more fails the batch (`lago api returned status: <n>, body: <body>`), retried as the batch
//! processor says. A connection is kept for the next batch (`keepalive`) at most
//! `keepalive_timeout` milliseconds idle, among at most `keepalive_pool` idle connections to
//! that server; with `keepalive: false` each batch has its own connection.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, HttpError, LogCtx, Plugin, PluginDef, PluginServices, Template, VarNames,
};
use http::{header, HeaderValue, Method};
use serde_json::{json, Map, Value};

use super::batch_processor;
use super::sink::http::{status_and_body, CallError, HttpTarget};
use super::sink::{self, conf, BatchSink, Logger, SendError, SendFuture};

pub const NAME: &str = "lago";

pub static DEF: PluginDef = PluginDef {
    metadata_schema: Some(metadata_schema),
    check: Some(check),
    encrypt_fields: &["token"],
    ..PluginDef::new(NAME, 415, schema, compile)
};

/// `core.schema.uri_def`.
const URI_PATTERN: &str = r"^[^\/]+:\/\/([\da-zA-Z.-]+|\[[\da-fA-F:]+\])(:\d+)?";

fn schema() -> Value {
    let mut schema = sink::batch_schema(
        json!({
            "type": "object",
            "properties": {
                "endpoint_addrs": {
                    "type": "array",
                    "minItems": 1,
                    "items": {"type": "string", "pattern": URI_PATTERN},
                    "description": "Lago API address, like http://127.0.0.1:3000, it supports both self-hosted and cloud. If multiple endpoints are configured, the log will be pushed to a randomly determined endpoint from the list."
                },
                "endpoint_uri": {
                    "type": "string",
                    "minLength": 1,
                    "default": "/api/v1/events/batch",
                    "description": "Lago API endpoint, it needs to be set to the batch send endpoint."
                },
                "token": {"type": "string", "description": "Lago API key, create one for your organization on dashboard."},
                "event_transaction_id": {"type": "string"},
                "event_subscription_id": {"type": "string"},
                "event_code": {"type": "string"},
                "event_properties": {
                    "type": "object",
                    "patternProperties": {".*": {"type": "string", "minLength": 1}}
                },
                "ssl_verify": {"type": "boolean", "default": true},
                "timeout": {"type": "integer", "minimum": 1, "maximum": 60000, "default": 3000, "description": "timeout in milliseconds"},
                "keepalive": {"type": "boolean", "default": true},
                "keepalive_timeout": {"type": "integer", "minimum": 1000, "default": 60000, "description": "keepalive timeout in milliseconds"},
                "keepalive_pool": {"type": "integer", "minimum": 1, "default": 5}
            },
            "required": ["endpoint_addrs", "token", "event_transaction_id", "event_subscription_id", "event_code"]
        }),
        "lago logger",
    );
    // Lago takes at most 100 events per batch call.
    schema["properties"]["batch_max_size"]["default"] = json!(100);
    schema
}

fn metadata_schema() -> Value {
    batch_processor::wrap_metadata_schema(json!({"type": "object", "properties": {}}))
}

/// APISIX's `check_https` and `check_tls_bool`: warnings, never refusals.
fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    let plain = cx
        .conf
        .get("endpoint_addrs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|a| !a.starts_with("https://"));
    if plain {
        tracing::warn!("Using {NAME} endpoint_addrs with no TLS is a security risk");
    }
    if cx.conf.get("ssl_verify") == Some(&Value::Bool(false)) {
        tracing::warn!("Keeping ssl_verify disabled in {NAME} configuration is a security risk");
    }
    Ok(())
}

/// POSTs batches of events to one of the endpoints.
struct LagoSink {
    /// Each endpoint with `endpoint_uri`.
    urls: Vec<String>,
    target: HttpTarget,
}

impl LagoSink {
    fn new(c: &Map<String, Value>, services: &Arc<PluginServices>) -> Result<LagoSink, String> {
        let uri = conf::text(c, "endpoint_uri");
        let urls = conf::endpoints(c, NAME)?
            .into_iter()
            .map(|a| format!("{a}{uri}"))
            .collect();
        let token = format!("Bearer {}", conf::text(c, "token"));
        let headers = vec![
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (
                header::AUTHORIZATION,
                HeaderValue::from_str(&token).map_err(|_| "invalid token".to_owned())?,
            ),
        ];
        Ok(LagoSink {
            urls,
            target: HttpTarget::new(
                services,
                conf::millis(c, "timeout", 3000),
                c.get("ssl_verify").and_then(Value::as_bool).unwrap_or(true),
                headers,
            )
            .with_keepalive_of(c, 5),
        })
    }

    async fn post(&self, body: Bytes) -> Result<(), SendError> {
        let url = conf::pick(&self.urls);
        match self
            .target
            .call(self.target.request(Method::POST, url), body)
            .await
        {
            Ok(resp) if resp.status().as_u16() >= 300 => {
                let (status, body) = status_and_body(&resp);
                Err(SendError::new(format!(
                    "lago api returned status: {status}, body: {body}"
                )))
            }
            Ok(_) => Ok(()),
            Err(CallError::Http(HttpError::Connect(e))) => Err(SendError::new(e.to_string())),
            Err(e) => Err(e.into_send_error("")),
        }
    }
}

/// `{"events": [<event>, ...]}`.
fn events_body(entries: &[Bytes]) -> Bytes {
    let len: usize = entries.iter().map(|e| e.len() + 1).sum::<usize>() + 13;
    let mut out = BytesMut::with_capacity(len);
    out.put_slice(b"{\"events\":[");
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.put_u8(b',');
        }
        out.put_slice(e);
    }
    out.put_slice(b"]}");
    out.freeze()
}

impl BatchSink for LagoSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], _: usize) -> SendFuture<'a> {
        Box::pin(self.post(events_body(entries)))
    }
}

/// The event's templates, parsed once.
struct Event {
    transaction_id: Template,
    subscription_id: Template,
    code: String,
    /// `event_properties`: each key with its template and its text as written.
    properties: Option<Vec<(String, Template, String)>>,
}

impl Event {
    fn new(c: &Map<String, Value>) -> Event {
        Event {
            transaction_id: Template::parse(conf::text(c, "event_transaction_id")),
            subscription_id: Template::parse(conf::text(c, "event_subscription_id")),
            code: conf::text(c, "event_code").to_owned(),
            properties: c
                .get("event_properties")
                .and_then(Value::as_object)
                .map(|props| {
                    props
                        .iter()
                        .filter_map(|(k, v)| {
                            let text = v.as_str()?;
                            Some((k.clone(), Template::parse(text), text.to_owned()))
                        })
                        .collect()
                }),
        }
    }

    /// Every variable the templates read (captured for the log phase).
    fn var_names(&self) -> Vec<Box<str>> {
        let mut names: Vec<Box<str>> = Vec::new();
        let props = self.properties.iter().flatten().map(|(_, t, _)| t);
        for t in [&self.transaction_id, &self.subscription_id]
            .into_iter()
            .chain(props)
        {
            for n in t.var_names() {
                if !names.iter().any(|x| &**x == n) {
                    names.push(n.into());
                }
            }
        }
        names
    }

    /// The request's event, `now_ms` the wall clock.
    fn encode(&self, ctx: &LogCtx, now_ms: u64) -> Bytes {
        let mut e = Map::new();
        e.insert(
            "transaction_id".into(),
            Value::String(self.transaction_id.resolve(ctx).text),
        );
        e.insert(
            "external_subscription_id".into(),
            Value::String(self.subscription_id.resolve(ctx).text),
        );
        e.insert("code".into(), Value::String(self.code.clone()));
        // ngx.req.start_time(): seconds with the milliseconds as the fraction.
        let start_ms = now_ms.saturating_sub(ctx.request_time.as_millis() as u64);
        e.insert("timestamp".into(), json!(start_ms as f64 / 1000.0));
        if let Some(props) = &self.properties {
            let mut out = Map::new();
            for (k, t, text) in props {
                let r = t.resolve(ctx);
                let v = if r.resolved > 0 { r.text } else { text.clone() };
                out.insert(k.clone(), Value::String(v));
            }
            e.insert("properties".into(), Value::Object(out));
        }
        Bytes::from(lua::cjson_encode(&Value::Object(e)))
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let services = cx.services;
    let filled = cx.filled();
    let event = Event::new(filled.as_object().ok_or("conf is not an object")?);
    let logger = Logger::compile_own_entry(cx, NAME, |c| {
        Ok(Arc::new(LagoSink::new(c, services)?) as Arc<dyn BatchSink>)
    })?
    .with_vars(&VarNames::from(event.var_names()));
    Ok(logger.encoded_by(move |_, now, ctx: &LogCtx| event.encode(ctx, now)))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::LogVars;

    use super::*;
    use crate::log::sink::testing::{answer, http_server, next, Captured};
    use crate::testing::Compiler;

    /// Lago's batch endpoint: the bearer token checked, `{"events": [...]}` taken.
    fn lago(req: &Captured) -> Vec<u8> {
        let authed = req.lower().contains("authorization: bearer secret-key\r\n")
            || req.lower().ends_with("authorization: bearer secret-key");
        let body = serde_json::from_slice::<Value>(&req.body).ok();
        let events = body.as_ref().and_then(|b| b["events"].as_array());
        match (authed, events) {
            (false, _) => answer(401, "{\"status\":401,\"error\":\"Unauthorized\"}"),
            (true, Some(_)) => answer(200, ""),
            (true, None) => answer(422, "{\"status\":422}"),
        }
    }

    struct V(Vec<(&'static str, &'static str)>);
    impl ferrisix_router::VarSource for V {
        fn var(&self, name: &str) -> Option<std::borrow::Cow<'_, str>> {
            self.0
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).into())
        }
    }

    fn ctx_of(p: &dyn Plugin, vars: Vec<(&'static str, &'static str)>) -> LogCtx {
        LogCtx {
            status: 201,
            request_time: Duration::from_millis(1500),
            vars: LogVars::capture(p.log_needs().vars.unwrap(), &V(vars)),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn events_are_batched_with_the_token() {
        let (port, mut rx) = http_server(lago).await;
        let c = Compiler::new();
        let conf = json!({"endpoint_addrs": [format!("http://127.0.0.1:{port}")], "token": "secret-key",
            "event_transaction_id": "req_${request_id}", "event_subscription_id": "cus_$consumer_name",
            "event_code": "api_call", "batch_max_size": 2,
            "event_properties": {"status": "$status", "tier": "gold", "missing": "$nothing_here"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "lago-1", None)).unwrap();
        p.log(&ctx_of(
            &*p,
            vec![("request_id", "r1"), ("consumer_name", "jack")],
        ));
        p.log(&ctx_of(&*p, vec![("request_id", "r2")]));
        let req = next(&mut rx).await;
        assert!(
            req.head.starts_with("POST /api/v1/events/batch HTTP/1.1"),
            "{}",
            req.head
        );
        assert!(req.lower().contains("content-type: application/json"));
        let v: Value = serde_json::from_slice(&req.body).unwrap();
        let events = v["events"].as_array().unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0]["transaction_id"], "req_r1");
        assert_eq!(events[0]["external_subscription_id"], "cus_jack");
        assert_eq!(events[1]["external_subscription_id"], "cus_");
        assert_eq!(events[0]["code"], "api_call");
        assert_eq!(
            events[0]["properties"],
            json!({"status": "201", "tier": "gold", "missing": "$nothing_here"})
        );
        let ts = events[0]["timestamp"].as_f64().unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(ts < now - 1.0 && ts > now - 60.0, "{ts} against {now}");
    }

    #[tokio::test]
    async fn a_refused_batch_names_the_status_and_body() {
        let (port, mut rx) = http_server(lago).await;
        let services = Arc::new(PluginServices::default());
        let c = json!({"endpoint_addrs": [format!("http://127.0.0.1:{port}")], "token": "wrong",
            "endpoint_uri": "/custom", "timeout": 3000, "ssl_verify": false});
        let s = LagoSink::new(c.as_object().unwrap(), &services).unwrap();
        let err = s.post(events_body(&[])).await.unwrap_err();
        assert_eq!(
            err.message,
            "lago api returned status: 401, body: {\"status\":401,\"error\":\"Unauthorized\"}"
        );
        let req = next(&mut rx).await;
        assert!(
            req.head.starts_with("POST /custom HTTP/1.1"),
            "{}",
            req.head
        );
        assert_eq!(req.text(), "{\"events\":[]}");
    }

    #[test]
    fn schema_defaults_and_messages() {
        let r = crate::PluginRegistry::builtin();
        let ok = json!({"endpoint_addrs": ["http://127.0.0.1:3000"], "token": "t",
            "event_transaction_id": "x", "event_subscription_id": "y", "event_code": "z"});
        assert!(r.check(NAME, &ok).is_ok());
        assert_eq!(
            r.check(NAME, &json!({"endpoint_addrs": ["http://127.0.0.1:3000"]}))
                .unwrap_err(),
            "failed to check the configuration of plugin lago err: property \"token\" is required"
        );
        let mut bad = ok.clone();
        bad["endpoint_addrs"] = json!([]);
        assert_eq!(
            r.check(NAME, &bad).unwrap_err(),
            "failed to check the configuration of plugin lago err: property \"endpoint_addrs\" validation failed: expect array to have at least 1 items"
        );
        let mut bad = ok.clone();
        bad["event_properties"] = json!({"a": ""});
        assert!(r.check(NAME, &bad).is_err());
        let info = r.get(NAME).unwrap();
        assert_eq!(info.priority, 415);
        let props = &info.schema["properties"];
        assert_eq!(props["batch_max_size"]["default"], 100);
        assert_eq!(props["name"]["default"], "lago logger");
        assert_eq!(props["endpoint_uri"]["default"], "/api/v1/events/batch");
        assert_eq!(props["timeout"]["default"], 3000);
        assert!(r
            .check_metadata(NAME, &json!({"max_pending_entries": 10}))
            .is_ok());
    }
}
