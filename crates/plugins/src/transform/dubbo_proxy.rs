//! dubbo-proxy (`apisix/plugins/dubbo-proxy.lua`, which hands the call to Tengine's
//! `mod_dubbo`): the request becomes a Dubbo 2 call with Hessian 2 serialization of
//! `service_name`/`service_version`/`method` (by default the URI without its leading `/`) on
//! the upstream node the balancer picked, and the map the provider returns the answer.
//!
//! The call's one argument is a `java.util.Map` (`Ljava/util/Map;`) of the request headers
//! (lower-case names, repeated headers joined with `, `) and `body`, the request body as
//! bytes; its attachments name the service (`path`, `interface`) and `version`. The answer
//! map's `status` (a string or a number; 200 when absent) is the status, its `body` (a
//! string or bytes) the body, and every other entry a response header. The try runs under
//! the route's (else the upstream's) connect, send and read timeouts.
//!
//! Failures answer as nginx's upstream module does: a connection that cannot be made, a
//! provider that closes the connection or answers something that is not a Dubbo frame, a
//! Dubbo status other than OK (a version or group mismatch: no such service), an exception or
//! an answer that is not a map 502; no answer within the read timeout 504.
//!
//! Calls to one node share its connections: each carries up to
//! `plugin_attr.dubbo-proxy.upstream_multiplex_count` calls at a time, told apart by their
//! request ids ([`pool`]).

mod pool;

use std::net::SocketAddr;
use std::sync::Arc;

use ferrisix_plugin_api::{
    CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef, SharedState, Step,
};
use http::header::{HeaderName, HeaderValue};
use http::StatusCode;
use serde_json::{json, Value};

use self::pool::Pools;
use crate::support::dubbo::hessian::{self, Reader, Writer};
use crate::support::dubbo::{self, CallError, STATUS_OK};

pub const NAME: &str = "dubbo-proxy";

pub static DEF: PluginDef = PluginDef::new(NAME, 507, schema, compile);

/// `plugin_attr.dubbo-proxy.upstream_multiplex_count`'s default.
const DEFAULT_MULTIPLEX: usize = 32;

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "service_name": {"type": "string", "minLength": 1},
            "service_version": {"type": "string", "pattern": "^\\d+\\.\\d+\\.\\d+"},
            "method": {"type": "string", "minLength": 1}
        },
        "required": ["service_name", "service_version"]
    })
}

#[derive(Debug)]
struct DubboProxy {
    service: String,
    version: String,
    method: Option<String>,
    pools: Arc<Pools>,
}

/// The gateway's Dubbo connections, shared by every route's dubbo-proxy and kept across
/// configuration changes.
impl SharedState for Pools {
    fn create(services: &ferrisix_plugin_api::PluginServices) -> Self {
        let count = services
            .plugin_attr()
            .others
            .get(NAME)
            .and_then(|a| a.get("upstream_multiplex_count"))
            .and_then(Value::as_f64)
            .filter(|n| *n >= 1.0)
            .map_or(DEFAULT_MULTIPLEX, |n| n as usize);
        Pools::new(count)
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.object()?;
    let text = |k: &str| conf.get(k).and_then(Value::as_str).map(str::to_owned);
    Ok(Arc::new(DubboProxy {
        service: text("service_name").unwrap_or_default(),
        version: text("service_version").unwrap_or_default(),
        method: text("method"),
        pools: cx.services.shared::<Pools>(),
    }))
}

/// The request body of a call: Dubbo's version, the service, its version, the method, the
/// parameter types, the argument map and the attachments.
fn request_body(
    service: &str,
    version: &str,
    method: &str,
    headers: &http::HeaderMap,
    body: &[u8],
) -> Vec<u8> {
    let mut w = Writer::new();
    w.string(dubbo::DUBBO_VERSION);
    w.string(service);
    w.string(version);
    w.string(method);
    w.string("Ljava/util/Map;");
    let mut args: Vec<(hessian::Value, hessian::Value)> = Vec::new();
    for name in headers.keys() {
        let joined = headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()))
            .collect::<Vec<_>>()
            .join(", ");
        args.push((
            hessian::Value::String(name.as_str().to_owned()),
            hessian::Value::String(joined),
        ));
    }
    args.push((
        hessian::Value::String("body".into()),
        hessian::Value::Binary(body.to_vec()),
    ));
    w.value(&hessian::Value::Map(None, args));
    let attachment = |k: &str, v: &str| {
        (
            hessian::Value::String(k.into()),
            hessian::Value::String(v.into()),
        )
    };
    w.value(&hessian::Value::Map(
        None,
        vec![
            attachment("path", service),
            attachment("interface", service),
            attachment("version", version),
        ],
    ));
    w.into_bytes()
}

/// A value as header text or body bytes.
fn text_of(v: &hessian::Value) -> Option<Vec<u8>> {
    Some(match v {
        hessian::Value::String(s) => s.clone().into_bytes(),
        hessian::Value::Binary(b) => b.clone(),
        hessian::Value::Int(i) => i.to_string().into_bytes(),
        hessian::Value::Long(l) => l.to_string().into_bytes(),
        hessian::Value::Double(d) => d.to_string().into_bytes(),
        hessian::Value::Bool(b) => b.to_string().into_bytes(),
        _ => return None,
    })
}

/// The HTTP answer of a response body; the reason when it has none.
fn answer(body: &[u8]) -> Result<Exit, String> {
    let mut r = Reader::new(body);
    let kind = r.read_int().map_err(|e| e.to_string())?;
    let value = match kind {
        dubbo::RESPONSE_VALUE | dubbo::RESPONSE_VALUE_WITH_ATTACHMENTS => {
            r.read().map_err(|e| e.to_string())?
        }
        dubbo::RESPONSE_NULL_VALUE | dubbo::RESPONSE_NULL_VALUE_WITH_ATTACHMENTS => {
            return Err("the provider returned null".into())
        }
        dubbo::RESPONSE_WITH_EXCEPTION | dubbo::RESPONSE_WITH_EXCEPTION_WITH_ATTACHMENTS => {
            let e = r.read().map_err(|e| e.to_string())?;
            let msg = e
                .get("detailMessage")
                .and_then(hessian::Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let class = match &e {
                hessian::Value::Object(c, _) => c.as_str(),
                _ => "exception",
            };
            return Err(format!("the provider threw {class}: {msg}"));
        }
        other => return Err(format!("unknown response type {other}")),
    };
    let hessian::Value::Map(_, entries) = value else {
        return Err("the provider's answer is not a map".into());
    };
    let mut exit = Exit::status(StatusCode::OK);
    for (k, v) in &entries {
        let Some(key) = k.as_str() else { continue };
        match key {
            "status" => {
                let code = text_of(v)
                    .and_then(|t| String::from_utf8(t).ok())
                    .and_then(|t| t.trim().parse::<u16>().ok())
                    .and_then(|c| StatusCode::from_u16(c).ok())
                    .ok_or_else(|| format!("invalid status {v:?}"))?;
                exit.status = code;
            }
            "body" => exit.body = text_of(v).map(Into::into),
            name => {
                let (Ok(name), Some(Ok(value))) = (
                    HeaderName::from_bytes(name.as_bytes()),
                    text_of(v).map(|t| HeaderValue::from_bytes(&t)),
                ) else {
                    continue;
                };
                exit.headers.push((name, value));
            }
        }
    }
    if exit.body.is_none() {
        exit.body = Some(bytes::Bytes::new());
    }
    Ok(exit)
}

impl DubboProxy {
    async fn call(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let (Some(node), Some(t)) = (ctx.upstream_node(), ctx.upstream_timeouts()) else {
            return Flow::Continue;
        };
        let method = match &self.method {
            Some(m) => m.clone(),
            None => ctx.uri().strip_prefix('/').unwrap_or(ctx.uri()).to_owned(),
        };
        let body = match ctx.read_body(usize::MAX).await {
            Ok(b) => b.clone(),
            Err(e) => {
                tracing::error!("dubbo-proxy: {e}");
                let status = match e {
                    ferrisix_plugin_api::BodyError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
                    ferrisix_plugin_api::BodyError::Timeout => StatusCode::REQUEST_TIMEOUT,
                    ferrisix_plugin_api::BodyError::Broken(_) => StatusCode::BAD_REQUEST,
                };
                return Flow::Exit(Exit::status(status));
            }
        };
        let payload = request_body(&self.service, &self.version, &method, ctx.headers(), &body);
        let timeouts = dubbo::Timeouts {
            connect: t.connect,
            send: t.send,
            read: t.read,
        };
        let bad_gateway = Flow::Exit(Exit::status(StatusCode::BAD_GATEWAY));
        let (header, body) = match self.pools.call(node, timeouts, payload).await {
            Ok(a) => a,
            Err(CallError::ReadTimeout) => {
                tracing::error!(
                    "upstream timed out while reading response from dubbo upstream {node}"
                );
                return Flow::Exit(Exit::status(StatusCode::GATEWAY_TIMEOUT));
            }
            Err(e) => {
                log_failure(&e, node);
                return bad_gateway;
            }
        };
        if header.status != STATUS_OK {
            tracing::error!(
                "dubbo upstream {node} answered {} ({}) to {}:{}.{method}: may be version or group mismatch",
                header.status,
                dubbo::status_name(header.status),
                self.service,
                self.version,
            );
            return bad_gateway;
        }
        match answer(&body) {
            Ok(exit) => Flow::Exit(exit),
            Err(e) => {
                tracing::error!("dubbo upstream {node}: {e}");
                bad_gateway
            }
        }
    }
}

fn log_failure(e: &CallError, node: SocketAddr) {
    tracing::error!("dubbo-proxy: {e} (upstream {node})");
}

impl Plugin for DubboProxy {
    fn phases(&self) -> Phases {
        Phases::BEFORE_PROXY | Phases::NODE
    }

    fn before_proxy<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.call(ctx)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::dubbo::hessian::Value as H;

    fn body(kind: i32, value: Option<H>) -> Vec<u8> {
        let mut w = Writer::new();
        w.int(kind);
        if let Some(v) = value {
            w.value(&v);
        }
        w.into_bytes()
    }

    fn map(entries: &[(&str, H)]) -> H {
        H::Map(
            None,
            entries
                .iter()
                .map(|(k, v)| (H::String((*k).into()), v.clone()))
                .collect(),
        )
    }

    #[test]
    fn the_answer_map_becomes_the_http_answer() {
        let e = answer(&body(
            1,
            Some(map(&[
                ("status", H::String("201".into())),
                ("body", H::String("hi".into())),
                ("x-a", H::Int(7)),
                ("bad name", H::String("dropped".into())),
            ])),
        ))
        .unwrap();
        assert_eq!(e.status, StatusCode::CREATED);
        assert_eq!(e.body.as_deref(), Some(&b"hi"[..]));
        assert_eq!(e.headers.len(), 1);
        assert_eq!(e.headers[0].0, "x-a");
        assert_eq!(e.headers[0].1, "7");
        // A numeric status, bytes as the body; with attachments after the value.
        let mut b = body(
            4,
            Some(map(&[
                ("status", H::Int(404)),
                ("body", H::Binary(vec![0, 1])),
            ])),
        );
        b.extend_from_slice(b"HZ");
        let e = answer(&b).unwrap();
        assert_eq!(
            (e.status, e.body.as_deref()),
            (StatusCode::NOT_FOUND, Some(&[0u8, 1][..]))
        );
        // No status: 200 with an empty body.
        let e = answer(&body(1, Some(map(&[])))).unwrap();
        assert_eq!(
            (e.status, e.body.as_deref()),
            (StatusCode::OK, Some(&b""[..]))
        );
    }

    #[test]
    fn answers_without_a_map_are_errors() {
        assert!(answer(&body(2, None)).is_err());
        assert!(answer(&body(1, Some(H::String("x".into())))).is_err());
        assert!(answer(&body(1, Some(map(&[("status", H::String("abc".into()))])))).is_err());
        let exception = H::Object(
            "java.lang.RuntimeException".into(),
            vec![("detailMessage".into(), H::String("boom".into()))],
        );
        let e = answer(&body(0, Some(exception))).unwrap_err();
        assert!(e.contains("java.lang.RuntimeException: boom"), "{e}");
        assert!(answer(b"").is_err());
        assert!(answer(&body(9, None)).is_err());
    }

    #[test]
    fn the_request_carries_the_headers_and_body_as_one_map() {
        let mut headers = http::HeaderMap::new();
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_static("2"));
        let b = request_body("svc", "1.0.0", "m", &headers, b"\x00");
        let mut r = Reader::new(&b);
        let strings: Vec<String> = (0..5).map(|_| r.read_string().unwrap()).collect();
        assert_eq!(strings, ["2.0.2", "svc", "1.0.0", "m", "Ljava/util/Map;"]);
        assert_eq!(
            r.read().unwrap(),
            map(&[
                ("x-a", H::String("1, 2".into())),
                ("body", H::Binary(vec![0]))
            ])
        );
        assert_eq!(
            r.read().unwrap(),
            map(&[
                ("path", H::String("svc".into())),
                ("interface", H::String("svc".into())),
                ("version", H::String("1.0.0".into())),
            ])
        );
        assert!(r.at_end());
    }
}
