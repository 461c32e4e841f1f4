//! skywalking-logger (`apisix/plugins/skywalking-logger.lua`): batches POSTed to the
//! SkyWalking OAP's HTTP log receiver, `/v3/logs` on `endpoint_addr`'s host and port, as a
//! JSON array of SkyWalking `LogData`: `{"body": {"json": {"json": <the entry's JSON>}},
//! "service": service_name, "serviceInstance": service_instance_name ("$hostname": the
//! machine's name), "endpoint": $uri, "traceContext": {"traceId", "traceSegmentId",
//! "spanId"}}`, the trace context read from the request's `sw8` header (SkyWalking's
//! cross-process propagation header, 8 fields, the ids base64url-encoded). `timeout` seconds;
//! an `https` address is TLS (not verified, as APISIX's). The entry is the loggers' (default
//! or `log_format`, bodies).

use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{
    CompileCtx, HttpError, LogCtx, Plugin, PluginDef, PluginServices, VarNames,
};
use http::{header, HeaderValue, Method, Uri};
use serde_json::{json, Map, Value};

use super::log_entry;
use super::sink::http::{status_and_body, CallError, HttpTarget};
use super::sink::{self, conf, BatchSink, Concat, Logger, SendError, SendFuture};

pub const NAME: &str = "skywalking-logger";

pub static DEF: PluginDef = sink::def(NAME, 408, schema, compile);

fn schema() -> Value {
    sink::schema(
        json!({
            "type": "object",
            "properties": {
                "endpoint_addr": {"type": "string", "pattern": r"^[^\/]+:\/\/([\da-zA-Z.-]+|\[[\da-fA-F:]+\])(:\d+)?"},
                "service_name": {"type": "string", "default": "APISIX"},
                "service_instance_name": {"type": "string", "default": "APISIX Instance Name"},
                "timeout": {"type": "integer", "minimum": 1, "default": 3}
            },
            "required": ["endpoint_addr"]
        }),
        "skywalking logger",
    )
}

/// The trace context of an `sw8` header
/// (`1-TRACEID-SEGMENTID-SPANID-PARENT_SERVICE-PARENT_INSTANCE-PARENT_ENDPOINT-IPPORT`),
/// `None` when it has not 8 fields; an id that does not decode is left out.
fn trace_context(sw8: &str) -> Option<Value> {
    let ids: Vec<&str> = sw8.split('-').collect();
    if ids.len() != 8 {
        tracing::warn!("failed to parse trace_context header: {sw8}");
        return None;
    }
    let decode = |s: &str| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s.trim_end_matches('='))
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
    };
    let mut tc = Map::new();
    if let Some(t) = decode(ids[1]) {
        tc.insert("traceId".into(), Value::String(t));
    }
    if let Some(s) = decode(ids[2]) {
        tc.insert("traceSegmentId".into(), Value::String(s));
    }
    if let Ok(n) = ids[3].parse::<i64>() {
        tc.insert("spanId".into(), json!(n));
    }
    Some(Value::Object(tc))
}

struct OapSink {
    url: String,
    host: String,
    port: u16,
    target: HttpTarget,
}

impl OapSink {
    fn new(c: &Map<String, Value>, services: &Arc<PluginServices>) -> Result<OapSink, String> {
        let addr = conf::text(c, "endpoint_addr");
        let uri: Uri = addr
            .parse()
            .map_err(|e| format!("invalid endpoint_addr {addr}: {e}"))?;
        let https = uri.scheme_str() == Some("https");
        let host = uri.host().unwrap_or("").to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let authority = uri.authority().map(|a| a.as_str()).unwrap_or(&host);
        let url = format!(
            "{}://{authority}/v3/logs",
            if https { "https" } else { "http" }
        );
        let headers = vec![
            (
                header::HOST,
                HeaderValue::from_str(&host).map_err(|_| format!("invalid host {host}"))?,
            ),
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
        ];
        Ok(OapSink {
            url,
            host,
            port,
            target: HttpTarget::new(services, conf::secs(c, "timeout", 3), false, headers),
        })
    }

    async fn post(&self, body: Bytes) -> Result<(), SendError> {
        let (host, port) = (&self.host, self.port);
        match self
            .target
            .call(self.target.request(Method::POST, &self.url), body)
            .await
        {
            Ok(resp) if resp.status().as_u16() >= 400 => {
                let (status, body) = status_and_body(&resp);
                Err(SendError::new(format!(
                    "server returned status code[{status}] host[{host}] port[{port}] body[{body}]"
                )))
            }
            Ok(_) => Ok(()),
            Err(CallError::Http(HttpError::Connect(e))) => Err(SendError::new(format!(
                "failed to connect to host[{host}] port[{port}] {e}"
            ))),
            Err(e) => Err(e.into_send_error(&format!(
                "error while sending data to [{host}] port[{port}] "
            ))),
        }
    }
}

impl BatchSink for OapSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], _: usize) -> SendFuture<'a> {
        // `core.json.encode(entries)`: always an array.
        Box::pin(self.post(sink::encode_batch(entries, usize::MAX, Concat::Json)))
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let services = cx.services;
    let filled = cx.filled();
    let service = conf::text(
        filled.as_object().ok_or("conf is not an object")?,
        "service_name",
    )
    .to_owned();
    let mut instance = filled
        .get("service_instance_name")
        .and_then(Value::as_str)
        .unwrap_or("APISIX Instance Name")
        .to_owned();
    if instance == "$hostname" {
        instance = log_entry::hostname();
    }
    let logger = Logger::compile(cx, NAME, false, |c| {
        Ok(Arc::new(OapSink::new(c, services)?) as Arc<dyn BatchSink>)
    })?
    .with_vars(&VarNames::from(vec!["http_sw8".into(), "uri".into()]));
    Ok(logger.encoded_by(move |entry, _, ctx: &LogCtx| {
        let mut log = Map::new();
        if let Some(tc) = ctx.vars.get("http_sw8").and_then(trace_context) {
            log.insert("traceContext".into(), tc);
        }
        let body = lua::cjson_encode(&Value::Object(entry));
        log.insert("body".into(), json!({"json": {"json": body}}));
        log.insert("service".into(), Value::String(service.clone()));
        log.insert("serviceInstance".into(), Value::String(instance.clone()));
        if let Some(uri) = ctx.vars.get("uri") {
            log.insert("endpoint".into(), Value::String(uri.into()));
        }
        Bytes::from(lua::cjson_encode(&Value::Object(log)))
    }))
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::LogVars;

    use super::*;
    use crate::log::sink::testing::{answer, http_server, next, Captured};
    use crate::testing::Compiler;

    /// SkyWalking's OAP HTTP receiver: `POST /v3/logs` takes a JSON array of `LogData`.
    fn oap(req: &Captured) -> Vec<u8> {
        let ok = req.head.starts_with("POST /v3/logs HTTP/1.1")
            && serde_json::from_slice::<Value>(&req.body).is_ok_and(|v| v.is_array());
        if ok {
            answer(200, "")
        } else {
            answer(400, "bad log data")
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

    const SW8: &str = "1-YWU3MDk3NjktNmUyMC00YzY4LTk3MzMtMTBmNDU1MjE2Y2M1-YWU3MDk3NjktNmUyMC00YzY4LTk3MzMtMTBmNDU1MjE2Y2M1-1-QVBJU0lY-QVBJU0lYIEluc3RhbmNlIE5hbWU=-L2dldA==-dXBzdHJlYW0gc2VydmljZQ==";

    #[tokio::test]
    async fn log_data_with_trace_context() {
        let (port, mut rx) = http_server(oap).await;
        let c = Compiler::new();
        let conf = json!({"endpoint_addr": format!("http://127.0.0.1:{port}/ignored"),
            "service_name": "gw", "service_instance_name": "$hostname", "batch_max_size": 1,
            "log_format": {"s": "$status"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "sw-1", None)).unwrap();
        let vars = V(vec![("http_sw8", SW8), ("uri", "/get"), ("route_id", "1")]);
        p.log(&LogCtx {
            status: 200,
            vars: LogVars::capture(p.log_needs().vars.unwrap(), &vars),
            ..Default::default()
        });
        let req = next(&mut rx).await;
        assert!(req.lower().contains("host: 127.0.0.1\r\n"), "{}", req.head);
        let v: Value = serde_json::from_slice(&req.body).unwrap();
        let log = &v[0];
        assert_eq!(
            log["traceContext"],
            json!({"traceId": "ae709769-6e20-4c68-9733-10f455216cc5",
                "traceSegmentId": "ae709769-6e20-4c68-9733-10f455216cc5", "spanId": 1})
        );
        assert_eq!(log["service"], "gw");
        assert_eq!(log["serviceInstance"], log_entry::hostname());
        assert_eq!(log["endpoint"], "/get");
        let body: Value =
            serde_json::from_str(log["body"]["json"]["json"].as_str().unwrap()).unwrap();
        assert_eq!(body, json!({"s": "200", "route_id": "1"}));
    }

    #[tokio::test]
    async fn errors_as_apisix_words_them() {
        fn refuse(_: &Captured) -> Vec<u8> {
            answer(503, "down")
        }
        let (port, _rx) = http_server(refuse).await;
        let services = Arc::new(PluginServices::default());
        let c = json!({"endpoint_addr": format!("http://127.0.0.1:{port}")});
        let s = OapSink::new(c.as_object().unwrap(), &services).unwrap();
        let err = s.post(Bytes::from_static(b"[]")).await.unwrap_err();
        assert_eq!(
            err.message,
            format!("server returned status code[503] host[127.0.0.1] port[{port}] body[down]")
        );
        assert!(trace_context("1-a-b").is_none());
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        assert_eq!(
            r.check(NAME, &json!({})).unwrap_err(),
            "failed to check the configuration of plugin skywalking-logger err: property \"endpoint_addr\" is required"
        );
        assert!(r
            .check(NAME, &json!({"endpoint_addr": "http://127.0.0.1:12800"}))
            .is_ok());
        assert!(r
            .check(
                NAME,
                &json!({"endpoint_addr": "http://127.0.0.1:12800", "timeout": 0})
            )
            .is_err());
        let info = r.get(NAME).unwrap();
        assert_eq!(info.priority, 408);
        assert_eq!(
            info.schema["properties"]["name"]["default"],
            "skywalking logger"
        );
    }
}
