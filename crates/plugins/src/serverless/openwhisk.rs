//! openwhisk (`apisix/plugins/openwhisk.lua`): the request's body (up to
//! `max_req_body_size`, else 413) POSTed to an Apache OpenWhisk action,
//! `<api_host>/api/v1/namespaces/<namespace>/actions/[<package>/]<action>?blocking=true&
//! result=<result>&timeout=<timeout>`, with `service_token` (`uuid:key`) as `Authorization:
//! Basic`; the action's answer, a JSON object, gives the response: its `headers`, its
//! `statusCode` (else the call's status) and its `body` (else the whole answer). An answer
//! that is not JSON, or an action that cannot be reached within `timeout` ms, is 503.
//! `ssl_verify` for `https` hosts; the connection is kept for the next call as `keepalive`,
//! `keepalive_timeout` and `keepalive_pool` say (`keepalive: false` asks the host to close).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{
    CompileCtx, Exit, Flow, KeepAlive, Phases, Plugin, PluginCtx, PluginDef, PluginServices, Step,
};
use http::{header, HeaderName, HeaderValue, Method, Request, StatusCode};
use serde_json::{json, Value};

pub const NAME: &str = "openwhisk";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &["service_token"],
    ..PluginDef::new(NAME, -1901, schema, compile)
};

/// OpenWhisk's entity names.
const NAME_PATTERN: &str = r"\A([\w]|[\w][\w@ .-]*[\w@.-]+)\z";

fn schema() -> Value {
    let name = json!({"type": "string", "maxLength": 256, "pattern": NAME_PATTERN});
    json!({
        "type": "object",
        "properties": {
            "max_req_body_size": {"type": "integer", "minimum": 1, "default": 67_108_864,
                "description": "maximum request body size in bytes buffered into memory; larger request bodies are rejected"},
            "api_host": {"type": "string"},
            "ssl_verify": {"type": "boolean", "default": true},
            "service_token": {"type": "string"},
            "namespace": name,
            "package": name,
            "action": name,
            "result": {"type": "boolean", "default": true},
            "timeout": {"type": "integer", "minimum": 1, "maximum": 60000, "default": 3000,
                "description": "timeout in milliseconds"},
            "keepalive": {"type": "boolean", "default": true},
            "keepalive_timeout": {"type": "integer", "minimum": 1000, "default": 60000},
            "keepalive_pool": {"type": "integer", "minimum": 1, "default": 5}
        },
        "required": ["api_host", "service_token", "namespace", "action"]
    })
}

struct OpenWhisk {
    url: String,
    authorization: HeaderValue,
    max_req_body_size: usize,
    timeout: Duration,
    ssl_verify: bool,
    /// `keepalive*`: how the connection is kept for the next call (`None`: closed).
    keepalive: Option<KeepAlive>,
    services: Arc<PluginServices>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let text = |k: &str| conf.get(k).and_then(Value::as_str);
    let int = |k: &str, d: u64| conf.get(k).and_then(Value::as_u64).unwrap_or(d);
    let package = text("package").map_or(String::new(), |p| format!("{p}/"));
    let timeout = int("timeout", 3000);
    let result = conf.get("result").and_then(Value::as_bool) != Some(false);
    let url = format!(
        "{}/api/v1/namespaces/{}/actions/{package}{}?blocking=true&result={result}&timeout={timeout}",
        text("api_host").unwrap_or(""),
        text("namespace").unwrap_or(""),
        text("action").unwrap_or(""),
    );
    url.parse::<http::Uri>()
        .map_err(|e| format!("invalid action URL {url}: {e}"))?;
    let token =
        base64::engine::general_purpose::STANDARD.encode(text("service_token").unwrap_or(""));
    Ok(Arc::new(OpenWhisk {
        url,
        authorization: HeaderValue::from_str(&format!("Basic {token}"))
            .map_err(|_| "invalid service_token".to_string())?,
        max_req_body_size: usize::try_from(int("max_req_body_size", 67_108_864))
            .unwrap_or(usize::MAX),
        timeout: Duration::from_millis(timeout),
        ssl_verify: conf.get("ssl_verify").and_then(Value::as_bool) != Some(false),
        keepalive: conf.as_object().and_then(|c| KeepAlive::of_conf(c, 5)),
        services: cx.services.clone(),
    }))
}

/// The response an action's answer describes.
fn response(status: StatusCode, body: &Bytes) -> Flow {
    let result: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            tracing::error!("failed to parse openwhisk response data: {e}");
            return Flow::Exit(Exit::status(StatusCode::SERVICE_UNAVAILABLE));
        }
    };
    let mut headers = Vec::new();
    for (k, v) in result
        .get("headers")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let value = match v {
            Value::String(s) => s.clone(),
            other => lua::cjson_encode(other),
        };
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            headers.push((k, v));
        }
    }
    let status = result
        .get("statusCode")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .and_then(|c| StatusCode::from_u16(c).ok())
        .unwrap_or(status);
    let body = match result.get("body") {
        None | Some(Value::Null) => body.clone(),
        Some(Value::String(s)) => Bytes::from(s.clone()),
        // core.response.exit encodes a table body as JSON.
        Some(other) => Bytes::from(lua::cjson_encode(other)),
    };
    Flow::Exit(Exit {
        status,
        body: Some(body),
        headers,
    })
}

impl OpenWhisk {
    async fn run(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let body = match ctx.read_body(self.max_req_body_size).await {
            Ok(b) => b.clone(),
            Err(e) => {
                tracing::error!("failed to get request body: {e}");
                return Flow::Exit(Exit::status(StatusCode::PAYLOAD_TOO_LARGE));
            }
        };
        let mut builder = Request::builder()
            .method(Method::POST)
            .uri(&self.url)
            .header(header::AUTHORIZATION, self.authorization.clone())
            .header(header::CONTENT_TYPE, "application/json");
        if self.keepalive.is_none() {
            builder = builder.header(header::CONNECTION, "close");
        }
        let req = builder.body(body).expect("a checked URL makes a request");
        match self
            .services
            .http()
            .send_kept(req, self.timeout, self.ssl_verify, self.keepalive)
            .await
        {
            Ok(resp) => response(resp.status(), resp.body()),
            Err(e) => {
                tracing::error!("failed to process openwhisk action, err: {e}");
                Flow::Exit(Exit::status(StatusCode::SERVICE_UNAVAILABLE))
            }
        }
    }
}

impl Plugin for OpenWhisk {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.run(ctx)))
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;

    use super::super::generic_upstream::testing::{call, platform};
    use super::*;
    use crate::testing::Compiler;

    /// An OpenWhisk controller: `POST /api/v1/namespaces/guest/actions/<action>` with the
    /// guest key, blocking, runs the action: `hello` answers `{"hello": <name param>}`,
    /// `web` a web-action style `{"statusCode", "headers", "body"}`; `raw` answers plain
    /// text; a wrong key gets 401 as OpenWhisk's JSON.
    fn controller(s: &Value) -> (u16, String) {
        // guest's default key `23bc46b1-71f6-4ed5-8c54-816aa4f8c502:123zO3xZCLrMN6v2BKK1dXYFpXlPkccOFqm12CdAsMgRU4VrNZ9lyGVCGuMDGIwP`.
        let key = "MjNiYzQ2YjEtNzFmNi00ZWQ1LThjNTQtODE2YWE0ZjhjNTAyOjEyM3pPM3haQ0xyTU42djJCS0sxZFhZRnBYbFBrY2NPRnFtMTJDZEFzTWdSVTRWck5aOWx5R1ZDR3VNREdJd1A=";
        if s["headers"]["authorization"] != format!("Basic {key}") {
            return (
                401,
                r#"{"error":"The supplied authentication is invalid"}"#.into(),
            );
        }
        if s["method"] != "POST" || s["query"] != "blocking=true&result=true&timeout=3000" {
            return (400, "{}".into());
        }
        let name = serde_json::from_str::<Value>(s["body"].as_str().unwrap_or(""))
            .ok()
            .and_then(|b| b.get("name").cloned())
            .unwrap_or(json!("stranger"));
        match s["path"].as_str().unwrap_or("") {
            "/api/v1/namespaces/guest/actions/hello" => (200, json!({"hello": name}).to_string()),
            "/api/v1/namespaces/guest/actions/pkg/web" => (
                200,
                json!({"statusCode": 201, "headers": {"x-action": "web"}, "body": {"made": name}})
                    .to_string(),
            ),
            "/api/v1/namespaces/guest/actions/raw" => (200, "not json".into()),
            _ => (
                404,
                r#"{"error":"The requested resource does not exist."}"#.into(),
            ),
        }
    }

    const TOKEN: &str = "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:123zO3xZCLrMN6v2BKK1dXYFpXlPkccOFqm12CdAsMgRU4VrNZ9lyGVCGuMDGIwP";

    fn post(body: &'static str) -> TestRequest {
        let mut r = TestRequest::new(Method::POST, "/hello");
        r.state.set_body(ferrisix_plugin_api::RequestBody::Buffered(
            Bytes::from_static(body.as_bytes()),
        ));
        r
    }

    #[tokio::test]
    async fn actions_answer_the_request() {
        let addr = platform(controller).await;
        let c = Compiler::new();
        let conf = |action: &str, package: Option<&str>| {
            let mut v = json!({"api_host": format!("http://{addr}"), "service_token": TOKEN,
                "namespace": "guest", "action": action});
            if let Some(p) = package {
                v["package"] = json!(p);
            }
            v
        };
        let p = (DEF.compile)(&c.cx(NAME, &conf("hello", None), "ow-1", None)).unwrap();
        let e = call(&*p, post(r#"{"name": "world"}"#)).await;
        assert_eq!(e.status, 200);
        assert_eq!(e.body.as_deref(), Some(&br#"{"hello":"world"}"#[..]));
        let p = (DEF.compile)(&c.cx(NAME, &conf("web", Some("pkg")), "ow-2", None)).unwrap();
        let e = call(&*p, post(r#"{"name": "x"}"#)).await;
        assert_eq!(e.status, 201);
        assert_eq!(e.body.as_deref(), Some(&br#"{"made":"x"}"#[..]));
        assert!(e.headers.iter().any(|(k, v)| k == "x-action" && v == "web"));
        let p = (DEF.compile)(&c.cx(NAME, &conf("raw", None), "ow-3", None)).unwrap();
        assert_eq!(call(&*p, post("{}")).await.status, 503);
        let p = (DEF.compile)(&c.cx(NAME, &conf("missing", None), "ow-4", None)).unwrap();
        let e = call(&*p, post("{}")).await;
        assert_eq!(e.status, 404);
        assert_eq!(
            e.body.as_deref(),
            Some(&br#"{"error":"The requested resource does not exist."}"#[..])
        );
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        let pre = "failed to check the configuration of plugin openwhisk err: ";
        let ok = json!({"api_host": "http://127.0.0.1:3233", "service_token": "a:b", "namespace": "guest", "action": "hello"});
        assert!(r.check(NAME, &ok).is_ok());
        let mut bad = ok.clone();
        bad["action"] = json!("-bad");
        assert_eq!(
            r.check(NAME, &bad).unwrap_err(),
            format!("{pre}property \"action\" validation failed: failed to match pattern \"{}\" with \"-bad\"", NAME_PATTERN.replace('\\', "\\\\"))
        );
        bad["action"] = json!("good name.v1");
        assert!(r.check(NAME, &bad).is_ok());
        bad.as_object_mut().unwrap().remove("namespace");
        assert_eq!(
            r.check(NAME, &bad).unwrap_err(),
            format!("{pre}property \"namespace\" is required")
        );
        assert_eq!(r.get(NAME).unwrap().priority, -1901);
    }
}
