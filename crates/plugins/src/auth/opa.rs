//! opa (`apisix/plugins/opa.lua`, `opa/helper.lua`): asks an Open Policy Agent for a
//! decision. The request (`type`, `request` with scheme, method, host, port, path, headers
//! and query arguments, `var` with the addresses and the time; with `with_route`,
//! `with_consumer`, `with_service` what the gateway knows of them) is POSTed as
//! `{"input": ...}` to `<host>/v1/data/<policy>` (OPA's Data API) within `timeout` ms. A
//! decision whose `result.allow` is true lets the request through, with the headers named in
//! `send_headers_upstream` set from `result.headers` (or removed); otherwise the answer is
//! `result.status_code` (403), `result.headers`, and `result.reason` as the body (JSON when
//! it is an object). OPA unreachable: 403; an answer without `result`: 503.
//!
//! With `with_route` the route's id, name, uris and hosts are sent, with `with_service` the
//! service's id and name: ferrisix's data plane keeps no copy of the whole stored documents.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{
    CompileCtx, Exit, Flow, KeepAlive, Phases, Plugin, PluginCtx, PluginDef, PluginServices, Step,
};
use ferrisix_router::VarSource;
use http::{HeaderName, HeaderValue, Request, StatusCode};
use serde_json::{json, Map, Value};

pub const NAME: &str = "opa";

pub static DEF: PluginDef = PluginDef::new(NAME, 2001, schema, compile);

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "host": {"type": "string"},
            "ssl_verify": {"type": "boolean", "default": true},
            "policy": {"type": "string"},
            "timeout": {"type": "integer", "minimum": 1, "maximum": 60000, "default": 3000},
            "keepalive": {"type": "boolean", "default": true},
            "send_headers_upstream": {"type": "array", "minItems": 1, "items": {"type": "string"}},
            "keepalive_timeout": {"type": "integer", "minimum": 1000, "default": 60000},
            "keepalive_pool": {"type": "integer", "minimum": 1, "default": 5},
            "with_route": {"type": "boolean", "default": false},
            "with_service": {"type": "boolean", "default": false},
            "with_consumer": {"type": "boolean", "default": false}
        },
        "required": ["host", "policy"]
    })
}

struct Opa {
    endpoint: String,
    ssl_verify: bool,
    /// `keepalive*`: the connection kept for the next call (`None`: closed after it).
    keepalive: Option<KeepAlive>,
    timeout: Duration,
    send_headers_upstream: Vec<HeaderName>,
    with_route: bool,
    with_service: bool,
    with_consumer: bool,
    services: Arc<PluginServices>,
}

impl std::fmt::Debug for Opa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opa")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let b = |k: &str| conf.get(k).and_then(Value::as_bool).unwrap_or(false);
    Ok(Arc::new(Opa {
        endpoint: format!(
            "{}/v1/data/{}",
            conf["host"].as_str().unwrap_or_default(),
            conf["policy"].as_str().unwrap_or_default()
        ),
        ssl_verify: conf["ssl_verify"].as_bool().unwrap_or(true),
        keepalive: conf.as_object().and_then(|c| KeepAlive::of_conf(c, 5)),
        timeout: Duration::from_millis(conf["timeout"].as_u64().unwrap_or(3000)),
        send_headers_upstream: conf
            .get("send_headers_upstream")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|h| HeaderName::from_bytes(h.as_str()?.as_bytes()).ok())
            .collect(),
        with_route: b("with_route"),
        with_service: b("with_service"),
        with_consumer: b("with_consumer"),
        services: cx.services.clone(),
    }))
}

/// A multi-valued header or argument as a list, a single one as its text.
fn push(map: &mut Map<String, Value>, key: String, value: String) {
    match map.get_mut(&key) {
        Some(Value::Array(list)) => list.push(Value::String(value)),
        Some(old) => {
            let first = old.take();
            *old = Value::Array(vec![first, Value::String(value)]);
        }
        None => {
            map.insert(key, Value::String(value));
        }
    }
}

impl Opa {
    fn input(&self, ctx: &PluginCtx<'_>) -> Value {
        let mut headers = Map::new();
        for (name, value) in ctx.headers() {
            push(
                &mut headers,
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            );
        }
        let mut query = Map::new();
        for pair in ctx
            .query()
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let dec = |s: &str| {
                percent_encoding::percent_decode_str(&s.replace('+', " "))
                    .decode_utf8_lossy()
                    .into_owned()
            };
            push(&mut query, dec(k), dec(v));
        }
        let var = |n: &str| ctx.var(n).map(|v| v.into_owned());
        let port = var("server_port").and_then(|p| p.parse::<u64>().ok());
        let mut input = json!({
            "type": "http",
            "request": {
                "scheme": var("scheme"),
                "method": ctx.method().as_str(),
                "host": var("host"),
                "port": port,
                "path": ctx.uri(),
                "headers": headers,
                "query": query
            },
            "var": {
                "server_addr": var("server_addr"),
                "server_port": var("server_port"),
                "remote_addr": var("remote_addr"),
                "remote_port": var("remote_port"),
                "timestamp": self.services.clock().epoch_ms() / 1000
            }
        });
        let route = ctx.route();
        if self.with_route {
            if let Some(r) = route {
                input["route"] = json!({"id": &*r.id, "name": r.name.as_deref(),
                    "uris": r.uris.to_vec(), "hosts": r.hosts.to_vec(),
                    "service_id": r.service_id.as_deref()});
            }
        }
        if self.with_service {
            if let Some(id) = route.and_then(|r| r.service_id.as_deref()) {
                input["service"] =
                    json!({"id": id, "name": route.and_then(|r| r.service_name.as_deref())});
            }
        }
        if self.with_consumer {
            if let Some(c) = ctx.consumer() {
                input["consumer"] = json!({"username": c.username, "group_id": c.group_id,
                    "labels": c.labels, "plugins": c.plugins});
            }
        }
        json!({ "input": input })
    }

    async fn decide(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let body = lua::cjson_encode(&self.input(ctx));
        let req = match Request::post(&self.endpoint)
            .header("content-type", "application/json")
            .body(Bytes::from(body))
        {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("failed to process OPA decision, err: {e}");
                return Flow::Exit(Exit::status(StatusCode::FORBIDDEN));
            }
        };
        let resp = match self
            .services
            .http()
            .send_kept(req, self.timeout, self.ssl_verify, self.keepalive)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                // The decision is unavailable: blocked.
                tracing::error!("failed to process OPA decision, err: {e}");
                return Flow::Exit(Exit::status(StatusCode::FORBIDDEN));
            }
        };
        let Ok(data) = serde_json::from_slice::<Value>(resp.body()) else {
            tracing::error!("invalid response body from OPA");
            return Flow::Exit(Exit::status(StatusCode::SERVICE_UNAVAILABLE));
        };
        let result = match data.get("result") {
            None | Some(Value::Null) | Some(Value::Bool(false)) => {
                tracing::error!("invalid OPA decision format: `result` field does not exist");
                return Flow::Exit(Exit::status(StatusCode::SERVICE_UNAVAILABLE));
            }
            Some(r) => r,
        };
        let allowed = matches!(result.get("allow"), Some(v) if !matches!(v, Value::Null | Value::Bool(false)));
        let headers = result.get("headers").and_then(Value::as_object);
        if !allowed {
            let status = result
                .get("status_code")
                .and_then(Value::as_u64)
                .and_then(|c| u16::try_from(c).ok())
                .and_then(|c| StatusCode::from_u16(c).ok())
                .unwrap_or(StatusCode::FORBIDDEN);
            let mut exit = match result.get("reason") {
                Some(Value::String(s)) => Exit::body(status, s.clone()),
                Some(r @ (Value::Object(_) | Value::Array(_))) => {
                    Exit::body(status, lua::cjson_encode(r))
                }
                Some(Value::Number(n)) => Exit::body(status, lua::json_number(n)),
                _ => Exit::status(status),
            };
            for (k, v) in headers.into_iter().flatten() {
                let text = match v {
                    Value::String(s) => s.clone(),
                    other => lua::force_encode_scalar(other),
                };
                if let (Ok(n), Ok(v)) = (
                    HeaderName::from_bytes(k.as_bytes()),
                    HeaderValue::from_str(&text),
                ) {
                    exit = exit.with_header(n, v);
                }
            }
            return Flow::Exit(exit);
        }
        for name in &self.send_headers_upstream {
            let value = headers
                .and_then(|h| {
                    h.get(name.as_str()).or_else(|| {
                        h.iter()
                            .find(|(k, _)| k.eq_ignore_ascii_case(name.as_str()))
                            .map(|(_, v)| v)
                    })
                })
                .and_then(Value::as_str)
                .and_then(|v| HeaderValue::from_str(v).ok());
            match value {
                Some(v) => {
                    ctx.headers_mut().insert(name.clone(), v);
                }
                None => {
                    ctx.headers_mut().remove(name);
                }
            }
        }
        Flow::Continue
    }
}

impl Plugin for Opa {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.decide(ctx)))
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use std::net::SocketAddr;

    use ferrisix_plugin_api::testing::TestRequest;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::testing::Compiler;

    /// An OPA stand-in following its Data API: `POST /v1/data/<policy>` answers a decision
    /// made from the input (allow when the `x-user` header is `admin`), and keeps the
    /// requests it got.
    async fn opa() -> (SocketAddr, Arc<std::sync::Mutex<Vec<Value>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let log = log.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let n = s.read(&mut chunk).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buf).to_string();
                        let Some((head, body)) = text.split_once("\r\n\r\n") else {
                            continue;
                        };
                        let len: usize = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse().unwrap())
                            })
                            .unwrap_or(0);
                        if body.len() < len {
                            continue;
                        }
                        let path = head
                            .split_whitespace()
                            .nth(1)
                            .unwrap_or_default()
                            .to_owned();
                        let input: Value = serde_json::from_str(body).unwrap_or(Value::Null);
                        log.lock()
                            .unwrap()
                            .push(json!({"path": path, "body": input.clone()}));
                        let user = input["input"]["request"]["headers"]["x-user"]
                            .as_str()
                            .unwrap_or_default();
                        let answer = (if path.ends_with("/broken") {
                            json!({"nothing": 1})
                        } else if user == "admin" {
                            json!({"result": {"allow": true, "headers": {"X-Role": "root"}}})
                        } else {
                            json!({"result": {"allow": false, "status_code": 401,
                                "headers": {"X-Why": "nope"}, "reason": {"msg": "denied"}}})
                        })
                        .to_string();
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
                            answer.len()
                        );
                        let _ = s.write_all(reply.as_bytes()).await;
                        buf.clear();
                    }
                });
            }
        });
        (addr, seen)
    }

    async fn run(conf: Value, req: TestRequest) -> (Flow, TestRequest) {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "opa", None)).unwrap();
        let mut req = req;
        let flow = match p.access(&mut req.ctx()) {
            Step::Done(f) => f,
            Step::Wait(f) => f.await,
        };
        (flow, req)
    }

    #[tokio::test]
    async fn decisions() {
        let (addr, seen) = opa().await;
        let conf = json!({"host": format!("http://{addr}"), "policy": "example/allow",
            "send_headers_upstream": ["X-Role"]});
        let (flow, req) = run(
            conf.clone(),
            TestRequest::get("/p?a=1&a=2")
                .header("x-user", "admin")
                .header("x-role", "forged"),
        )
        .await;
        assert_eq!(flow, Flow::Continue);
        assert_eq!(req.headers["x-role"], "root");
        let got = seen.lock().unwrap()[0].clone();
        assert_eq!(got["path"], "/v1/data/example/allow");
        assert_eq!(
            got["body"]["input"]["request"]["query"]["a"],
            json!(["1", "2"])
        );
        assert_eq!(got["body"]["input"]["type"], "http");
        let (flow, _) = run(conf.clone(), TestRequest::get("/p")).await;
        let Flow::Exit(e) = flow else {
            panic!("denied")
        };
        assert_eq!(e.status, 401);
        assert_eq!(e.body.as_deref(), Some(&b"{\"msg\":\"denied\"}"[..]));
        assert!(e.headers.iter().any(|(n, v)| n == "x-why" && v == "nope"));
        let broken = json!({"host": format!("http://{addr}"), "policy": "broken"});
        let (flow, _) = run(broken, TestRequest::get("/")).await;
        assert!(matches!(flow, Flow::Exit(e) if e.status == 503));
        let down = json!({"host": "http://127.0.0.1:1", "policy": "x", "timeout": 500});
        let (flow, _) = run(down, TestRequest::get("/")).await;
        assert!(matches!(flow, Flow::Exit(e) if e.status == 403));
    }

    #[test]
    fn schema_messages() {
        let c = Compiler::new();
        let err = |conf: Value| c.registry.check(NAME, &conf).unwrap_err();
        let prefix = "failed to check the configuration of plugin opa err: ";
        assert_eq!(
            err(json!({"host": "http://h"})),
            format!("{prefix}property \"policy\" is required")
        );
        assert_eq!(
            err(json!({"host": 3233, "policy": "p"})),
            format!("{prefix}property \"host\" validation failed: wrong type: expected string, got number")
        );
        assert_eq!(
            err(json!({"host": "h", "policy": "p", "timeout": 0})),
            format!("{prefix}property \"timeout\" validation failed: expected 0 to be at least 1")
        );
    }
}
