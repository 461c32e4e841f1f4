//! forward-auth (`apisix/plugins/forward-auth.lua`): asks an authorization service (`uri`)
//! about each request before it goes upstream. The service gets `X-Forwarded-Proto`,
//! `-Method`, `-Host`, `-Uri` and `-For`, the `extra_headers` (variables resolved), the
//! client's `request_headers`, and with `request_method: POST` the body (up to
//! `max_req_body_size`). An answer of 300 or more is given to the client as it is, with the
//! service's `client_headers`; below 300 the service's `upstream_headers` are set on the
//! request sent upstream. When the service cannot be reached within `timeout`, the request
//! goes on with `allow_degradation`, else gets `status_on_error` (403).
//!
//! Calls go through the gateway's plugin HTTP client, the connection kept for the next call
//! at most `keepalive_timeout` ms idle among `keepalive_pool` idle ones (`keepalive: false`
//! closes it and asks the service to); an `https` `uri` is TLS, the service's certificate
//! checked when `ssl_verify` (the default) against the gateway's trusted CA bundle.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_plugin_api::{
    CompileCtx, Exit, Flow, HttpClient, KeepAlive, Phases, Plugin, PluginCtx, PluginDef,
    PluginServices, Step, Template,
};
use http::{HeaderName, HeaderValue, Method, Request, StatusCode};
use serde_json::{json, Value};

pub const NAME: &str = "forward-auth";

pub static DEF: PluginDef = PluginDef::new(NAME, 2002, schema, compile);

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "uri": {"type": "string"},
            "allow_degradation": {"type": "boolean", "default": false},
            "status_on_error": {"type": "integer", "minimum": 200, "maximum": 599, "default": 403},
            "ssl_verify": {"type": "boolean", "default": true},
            "request_method": {
                "type": "string",
                "default": "GET",
                "enum": ["GET", "POST"],
                "description": "the method for client to request the authorization service"
            },
            "max_req_body_size": {"type": "integer", "minimum": 1, "default": 67_108_864},
            "request_headers": {"type": "array", "default": [], "items": {"type": "string"}},
            "extra_headers": {
                "type": "object",
                "minProperties": 1,
                "patternProperties": {"^[^:]+$": {"type": "string"}}
            },
            "upstream_headers": {"type": "array", "default": [], "items": {"type": "string"}},
            "client_headers": {"type": "array", "default": [], "items": {"type": "string"}},
            "timeout": {"type": "integer", "minimum": 1, "maximum": 60000, "default": 3000},
            "keepalive": {"type": "boolean", "default": true},
            "keepalive_timeout": {"type": "integer", "minimum": 1000, "default": 60000},
            "keepalive_pool": {"type": "integer", "minimum": 1, "default": 5}
        },
        "required": ["uri"]
    })
}

struct ForwardAuth {
    uri: http::Uri,
    method: Method,
    allow_degradation: bool,
    status_on_error: StatusCode,
    max_req_body_size: usize,
    request_headers: Vec<HeaderName>,
    extra_headers: Vec<(HeaderName, Template)>,
    upstream_headers: Vec<HeaderName>,
    client_headers: Vec<HeaderName>,
    timeout: Duration,
    /// `keepalive*`: the connection kept for the next call (`None`: closed after it).
    keepalive: Option<KeepAlive>,
    ssl_verify: bool,
    services: Arc<PluginServices>,
}

fn names(conf: &Value, field: &str) -> Vec<HeaderName> {
    conf.get(field)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter_map(|h| HeaderName::from_bytes(h.as_bytes()).ok())
        .collect()
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let uri_text = conf.get("uri").and_then(Value::as_str).unwrap_or_default();
    let uri: http::Uri = uri_text
        .parse()
        .map_err(|_| format!("invalid uri {uri_text}"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(format!(
            "{uri_text}: only http:// and https:// authorization services are supported"
        ));
    }
    let int = |name: &str, default: u64| conf.get(name).and_then(Value::as_u64).unwrap_or(default);
    let extra_headers = conf
        .get("extra_headers")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(name, value)| {
            let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
            let text = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            Some((name, Template::parse(&text)))
        })
        .collect();
    Ok(Arc::new(ForwardAuth {
        uri,
        method: if conf.get("request_method").and_then(Value::as_str) == Some("POST") {
            Method::POST
        } else {
            Method::GET
        },
        allow_degradation: conf.get("allow_degradation").and_then(Value::as_bool) == Some(true),
        status_on_error: StatusCode::from_u16(int("status_on_error", 403) as u16)
            .map_err(|_| "invalid status_on_error")?,
        max_req_body_size: usize::try_from(int("max_req_body_size", 67_108_864))
            .unwrap_or(usize::MAX),
        request_headers: names(&conf, "request_headers"),
        extra_headers,
        upstream_headers: names(&conf, "upstream_headers"),
        client_headers: names(&conf, "client_headers"),
        timeout: Duration::from_millis(int("timeout", 3000)),
        keepalive: conf.as_object().and_then(|c| KeepAlive::of_conf(c, 5)),
        ssl_verify: conf.get("ssl_verify").and_then(Value::as_bool) != Some(false),
        services: cx.services.clone(),
    }))
}

impl ForwardAuth {
    /// The request to the authorization service.
    fn auth_request(&self, ctx: &PluginCtx<'_>, body: Bytes) -> Request<Bytes> {
        let mut req = Request::builder()
            .method(self.method.clone())
            .uri(self.uri.clone())
            .body(body)
            .expect("a method and a parsed uri make a request");
        let h = req.headers_mut();
        let mut set = |name: &'static str, value: Option<&str>| {
            if let Some(v) = value.and_then(|v| HeaderValue::from_str(v).ok()) {
                h.insert(HeaderName::from_static(name), v);
            }
        };
        set("x-forwarded-proto", Some(ctx.head().conn.scheme()));
        set("x-forwarded-method", Some(ctx.method().as_str()));
        set("x-forwarded-host", ctx.host());
        set("x-forwarded-uri", Some(ctx.request_uri()));
        let client_ip = ctx.remote_addr().to_string();
        set("x-forwarded-for", Some(&client_ip));
        if self.method == Method::POST {
            set("content-encoding", ctx.header("content-encoding"));
        }
        for (name, template) in &self.extra_headers {
            let value = template.resolve(ctx).text;
            if let Ok(v) = HeaderValue::from_str(&value) {
                h.insert(name.clone(), v);
            }
        }
        for name in &self.request_headers {
            if h.contains_key(name) {
                continue;
            }
            if let Some(v) = ctx.headers().get(name) {
                h.insert(name.clone(), v.clone());
            }
        }
        if self.keepalive.is_none() {
            h.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        }
        req
    }

    async fn check(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let body = if self.method == Method::POST {
            match ctx.read_body(self.max_req_body_size).await {
                Ok(b) => b.clone(),
                Err(e) => {
                    tracing::error!("failed to read request body: {e}");
                    return Flow::Exit(Exit::status(StatusCode::PAYLOAD_TOO_LARGE));
                }
            }
        } else {
            Bytes::new()
        };
        let req = self.auth_request(ctx, body);
        let client: &HttpClient = self.services.http();
        let resp = match client
            .send_kept(req, self.timeout, self.ssl_verify, self.keepalive)
            .await
        {
            Ok(r) => r,
            Err(_) if self.allow_degradation => return Flow::Continue,
            Err(e) => {
                tracing::warn!("failed to process forward auth, err: {e}");
                return Flow::Exit(Exit::status(self.status_on_error));
            }
        };
        if resp.status().as_u16() >= 300 {
            let mut exit = Exit {
                status: resp.status(),
                body: Some(resp.body().clone()),
                headers: Vec::new(),
            };
            for name in &self.client_headers {
                if let Some(v) = resp.headers().get(name) {
                    exit.headers.push((name.clone(), v.clone()));
                }
            }
            return Flow::Exit(exit);
        }
        for name in &self.upstream_headers {
            // core.request.set_header with nil: an absent answer header removes the client's.
            match resp.headers().get(name) {
                Some(v) => {
                    ctx.headers_mut().insert(name.clone(), v.clone());
                }
                None => {
                    ctx.headers_mut().remove(name);
                }
            }
        }
        Flow::Continue
    }
}

impl Plugin for ForwardAuth {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.check(ctx)))
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::testing::Compiler;

    /// An authorization service: answers 200 with `X-User` when the request carries
    /// `Authorization: ok`, else 401 with `X-Reason`; keeps the heads it got.
    async fn service() -> (SocketAddr, Arc<std::sync::Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let s = s.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    let mut got = Vec::new();
                    loop {
                        let n = conn.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        got.extend_from_slice(&buf[..n]);
                        let text = String::from_utf8_lossy(&got).to_string();
                        let Some(end) = text.find("\r\n\r\n") else {
                            continue;
                        };
                        let head = text[..end].to_ascii_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length: "))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if got.len() < end + 4 + len {
                            continue;
                        }
                        s.lock().unwrap().push(text.clone());
                        got.clear();
                        let resp = if head.contains("\r\nauthorization: ok") {
                            "HTTP/1.1 200 OK\r\nX-User: jack\r\nContent-Length: 0\r\n\r\n"
                        } else {
                            "HTTP/1.1 401 Unauthorized\r\nX-Reason: nope\r\nX-Other: x\r\nContent-Length: 6\r\n\r\ndenied"
                        };
                        if conn.write_all(resp.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, seen)
    }

    async fn run(conf: Value, mut req: TestRequest) -> (Flow, TestRequest) {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "fa", None)).unwrap();
        let flow = match p.access(&mut req.ctx()) {
            Step::Done(f) => f,
            Step::Wait(fut) => fut.await,
        };
        (flow, req)
    }

    #[tokio::test]
    async fn allows_refuses_and_passes_headers() {
        let (addr, seen) = service().await;
        let conf = json!({
            "uri": format!("http://{addr}/auth"),
            "request_headers": ["Authorization"],
            "upstream_headers": ["X-User"],
            "client_headers": ["X-Reason"],
            "extra_headers": {"X-Route": "r-$arg_a"}
        });
        let req = TestRequest::get("/p?a=1")
            .header("authorization", "ok")
            .header("x-user", "forged");
        let (flow, req) = run(conf.clone(), req).await;
        assert_eq!(flow, Flow::Continue);
        assert_eq!(req.headers["x-user"], "jack");
        let head = seen.lock().unwrap().last().unwrap().to_ascii_lowercase();
        assert!(head.starts_with("get /auth http/1.1"), "{head}");
        for line in [
            "x-forwarded-method: get",
            "x-forwarded-uri: /p?a=1",
            "x-forwarded-proto: http",
            "x-forwarded-for: 127.0.0.1",
            "x-route: r-1",
            "authorization: ok",
        ] {
            assert!(head.contains(line), "{line} in {head}");
        }
        let (flow, _) = run(conf, TestRequest::get("/p")).await;
        let Flow::Exit(e) = flow else {
            panic!("refused")
        };
        assert_eq!(e.status, 401);
        assert_eq!(e.body.as_deref(), Some(&b"denied"[..]));
        assert_eq!(e.headers.len(), 1, "only the client_headers");
        assert_eq!(e.headers[0].0, "x-reason");
    }

    #[tokio::test]
    async fn post_body_and_errors() {
        let (addr, seen) = service().await;
        let conf = json!({"uri": format!("http://{addr}/auth"), "request_method": "POST",
            "request_headers": ["authorization"]});
        let mut req = TestRequest::new(Method::POST, "/").header("authorization", "ok");
        req.state
            .set_body(ferrisix_plugin_api::RequestBody::Buffered(
                Bytes::from_static(b"hello"),
            ));
        let (flow, _) = run(conf, req).await;
        assert_eq!(flow, Flow::Continue);
        assert!(seen
            .lock()
            .unwrap()
            .last()
            .unwrap()
            .ends_with("\r\n\r\nhello"));
        // Nobody listens on the port of a closed listener.
        let dead = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let (flow, _) = run(
            json!({"uri": format!("http://{dead}/")}),
            TestRequest::get("/"),
        )
        .await;
        assert_eq!(flow, Flow::Exit(Exit::status(StatusCode::FORBIDDEN)));
        let (flow, _) = run(
            json!({"uri": format!("http://{dead}/"), "status_on_error": 503}),
            TestRequest::get("/"),
        )
        .await;
        assert_eq!(
            flow,
            Flow::Exit(Exit::status(StatusCode::SERVICE_UNAVAILABLE))
        );
        let (flow, _) = run(
            json!({"uri": format!("http://{dead}/"), "allow_degradation": true}),
            TestRequest::get("/"),
        )
        .await;
        assert_eq!(flow, Flow::Continue);
    }

    #[test]
    fn schema_and_compile_checks() {
        let c = Compiler::new();
        assert!(c.registry.check(NAME, &json!({})).is_err());
        assert!(c
            .registry
            .check(NAME, &json!({"uri": "http://a", "request_method": "PUT"}))
            .is_err());
        assert!(c
            .registry
            .check(NAME, &json!({"uri": "http://a", "timeout": 0}))
            .is_err());
        let conf = json!({"uri": "https://auth.example", "ssl_verify": false});
        assert!((DEF.compile)(&c.cx(NAME, &conf, "fa2", None)).is_ok());
        let conf = json!({"uri": "ftp://auth.example"});
        assert!((DEF.compile)(&c.cx(NAME, &conf, "fa3", None)).is_err());
    }
}
