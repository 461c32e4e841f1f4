//! proxy-mirror (`apisix/plugins/proxy-mirror.lua`): a copy of each sampled request (method,
//! URI, headers, body) goes to `host`, and its answer is thrown away, as nginx's `mirror`
//! subrequest does. The URI is fixed in `rewrite` (priority 1010, so before proxy-rewrite):
//! `$upstream_uri` if a plugin set one, else `$uri` and the query; `path` replaces the path
//! (`replace`, the query kept) or goes before it (`prefix`). The copy leaves in `before_proxy`,
//! with the headers as they go upstream and the Host sent upstream.
//!
//! The copy runs as a background task on the gateway's executor: a mirror that is slow, hangs
//! or refuses costs the client nothing. Copies in flight are bounded ([`MAX_IN_FLIGHT`]); past
//! that, and for bodies over [`MAX_MIRROR_BODY`], the copy is dropped and counted in a warning.
//! Warnings that fire per copy are summarised (one line a second per kind, with `repeated`,
//! the count it stands for) and carry the URL cut short: it holds the client's URI.
//! `https`/`grpc(s)` hosts pass the schema but the plugin HTTP client speaks plain HTTP only:
//! such copies are dropped with an error in the log.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_net::{clip, Repeats};
use ferrisix_plugin_api::{CompileCtx, Phases, Plugin, PluginCtx, PluginDef, PluginServices, Step};
use http::{header, HeaderValue, Request};
use rand::Rng;
use serde_json::{json, Value};

pub const NAME: &str = "proxy-mirror";

pub static DEF: PluginDef = PluginDef::new(NAME, 1010, schema, compile);

/// Copies in flight at once, per gateway.
pub const MAX_IN_FLIGHT: usize = 1024;
/// The largest request body mirrored.
pub const MAX_MIRROR_BODY: usize = 8 * 1024 * 1024;
/// nginx's `proxy_*_timeout` defaults for the mirror location (APISIX's
/// `plugin_attr.proxy-mirror.timeout`: connect 60 s, send 60 s, read 60 s).
const MIRROR_TIMEOUT: Duration = Duration::from_secs(60);

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "host": {
                "type": "string",
                "pattern": r"^(http(s)?|grpc(s)?):\/\/([\da-zA-Z.-]+|\[[\da-fA-F:]+\])(:\d+)?$"
            },
            "path": {"type": "string", "pattern": "^/[^?&]+$"},
            "path_concat_mode": {
                "type": "string",
                "default": "replace",
                "enum": ["replace", "prefix"],
                "description": "the concatenation mode for custom path"
            },
            "sample_ratio": {"type": "number", "minimum": 0.00001, "maximum": 1, "default": 1}
        },
        "required": ["host"]
    })
}

/// Copies in flight, per gateway, and the summaries of the warnings that fire per copy: a
/// mirror that is down, or a burst past [`MAX_IN_FLIGHT`], would otherwise write one line for
/// every request.
#[derive(Debug)]
struct InFlight {
    count: AtomicUsize,
    /// Copies dropped before leaving (too many in flight, body not read).
    dropped: Repeats,
    /// Copies the mirror did not answer.
    failed: Repeats,
    /// Copies to a scheme the plugin HTTP client does not speak.
    unsupported: Repeats,
}

impl ferrisix_plugin_api::SharedState for InFlight {
    fn create(_: &PluginServices) -> Self {
        InFlight {
            count: AtomicUsize::new(0),
            dropped: Repeats::per_second(),
            failed: Repeats::per_second(),
            unsupported: Repeats::per_second(),
        }
    }
}

struct ProxyMirror {
    host: String,
    path: Option<String>,
    prefix: bool,
    sample_ratio: f64,
    services: Arc<PluginServices>,
    in_flight: Arc<InFlight>,
}

/// The mirror URL fixed in `rewrite` for `before_proxy`.
struct MirrorUri(String);

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let text = |k: &str| conf.get(k).and_then(Value::as_str).map(str::to_owned);
    Ok(Arc::new(ProxyMirror {
        host: text("host").ok_or("proxy-mirror needs a host")?,
        path: text("path"),
        prefix: conf.get("path_concat_mode").and_then(Value::as_str) == Some("prefix"),
        sample_ratio: conf
            .get("sample_ratio")
            .and_then(Value::as_f64)
            .unwrap_or(1.0),
        services: cx.services.clone(),
        in_flight: cx.services.shared::<InFlight>(),
    }))
}

/// Whether the request carries a body to mirror.
fn has_body(ctx: &PluginCtx<'_>) -> bool {
    let h = ctx.headers();
    h.contains_key(header::TRANSFER_ENCODING)
        || h.get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0")
}

impl ProxyMirror {
    /// The mirror's URI for this request (`enable_mirror`).
    fn mirror_uri(&self, ctx: &PluginCtx<'_>) -> String {
        let args = match ctx.query() {
            Some(q) => format!("?{q}"),
            None => String::new(),
        };
        let uri = if ctx.upstream_edits().path.is_some() || ctx.upstream_edits().query.is_some() {
            ctx.upstream_uri().into_owned()
        } else {
            format!("{}{args}", ctx.uri())
        };
        let uri = match &self.path {
            Some(p) if self.prefix => format!("{p}{uri}"),
            Some(p) => format!("{p}{args}"),
            None => uri,
        };
        format!("{}{uri}", self.host)
    }

    fn send(&self, ctx: &PluginCtx<'_>, url: String, body: Bytes) {
        if !url.starts_with("http://") {
            if let Some(repeated) = self.in_flight.unsupported.hit() {
                tracing::error!(
                    url = %clip(&url),
                    repeated,
                    "proxy-mirror: only http:// mirrors are supported; copy dropped"
                );
            }
            return;
        }
        let mut req = Request::builder().method(ctx.method().clone()).uri(&url);
        for (name, value) in ctx.headers() {
            if name != header::HOST && name != header::CONNECTION {
                req = req.header(name, value);
            }
        }
        let host = ctx
            .upstream_edits()
            .host
            .clone()
            .or_else(|| ctx.headers().get(header::HOST).cloned())
            .or_else(|| ctx.host().and_then(|h| HeaderValue::from_str(h).ok()));
        if let Some(h) = host {
            req = req.header(header::HOST, h);
        }
        let req = match req.body(body) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(url = %clip(&url), error = %e, "proxy-mirror: invalid mirror request");
                return;
            }
        };
        if self.in_flight.count.fetch_add(1, Ordering::Relaxed) >= MAX_IN_FLIGHT {
            self.in_flight.count.fetch_sub(1, Ordering::Relaxed);
            if let Some(repeated) = self.in_flight.dropped.hit() {
                tracing::warn!(
                    url = %clip(&url),
                    repeated,
                    "proxy-mirror: too many copies in flight; copy dropped"
                );
            }
            return;
        }
        let services = self.services.clone();
        let in_flight = self.in_flight.clone();
        let spawned = self.services.executor().spawn(async move {
            if let Err(e) = services.http().send(req, MIRROR_TIMEOUT).await {
                if let Some(repeated) = in_flight.failed.hit() {
                    tracing::warn!(
                        url = %clip(&url),
                        repeated,
                        error = %e,
                        "proxy-mirror: mirror request failed"
                    );
                }
            }
            in_flight.count.fetch_sub(1, Ordering::Relaxed);
        });
        if let Err(e) = spawned {
            self.in_flight.count.fetch_sub(1, Ordering::Relaxed);
            tracing::error!(error = %e, "proxy-mirror: copy not sent");
        }
    }
}

impl Plugin for ProxyMirror {
    fn phases(&self) -> Phases {
        Phases::REWRITE | Phases::BEFORE_PROXY
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let sampled =
            self.sample_ratio >= 1.0 || rand::thread_rng().gen::<f64>() < self.sample_ratio;
        if sampled {
            let uri = self.mirror_uri(ctx);
            ctx.insert(MirrorUri(uri));
        }
        Step::CONTINUE
    }

    fn before_proxy<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let Some(MirrorUri(url)) = ctx.get::<MirrorUri>() else {
            return Step::CONTINUE;
        };
        let url = url.clone();
        if !has_body(ctx) {
            self.send(ctx, url, Bytes::new());
            return Step::CONTINUE;
        }
        // nginx's mirror reads the whole body too (still forwarded upstream).
        Step::Wait(Box::pin(async move {
            match ctx.read_body(MAX_MIRROR_BODY).await {
                Ok(body) => {
                    let body = body.clone();
                    self.send(ctx, url, body);
                }
                Err(e) => {
                    if let Some(repeated) = self.in_flight.dropped.hit() {
                        tracing::warn!(
                            url = %clip(&url),
                            repeated,
                            error = %e,
                            "proxy-mirror: body not mirrored; copy dropped"
                        )
                    }
                }
            }
            ferrisix_plugin_api::Flow::Continue
        }))
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use tokio::io::AsyncReadExt;

    use super::*;
    use crate::testing::Compiler;

    fn uri_of(conf: Value, uri: &str) -> Option<String> {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "pm", None)).unwrap();
        let mut req = TestRequest::get(uri);
        let mut ctx = req.ctx();
        assert!(matches!(p.rewrite(&mut ctx), Step::Done(_)));
        ctx.get::<MirrorUri>().map(|m| m.0.clone())
    }

    #[test]
    fn mirror_uris() {
        let host = "http://127.0.0.1:1986";
        assert_eq!(
            uri_of(json!({"host": host}), "/a/b?x=1").unwrap(),
            "http://127.0.0.1:1986/a/b?x=1"
        );
        assert_eq!(
            uri_of(json!({"host": host, "path": "/m"}), "/a/b?x=1").unwrap(),
            "http://127.0.0.1:1986/m?x=1"
        );
        assert_eq!(
            uri_of(
                json!({"host": host, "path": "/m", "path_concat_mode": "prefix"}),
                "/a/b"
            )
            .unwrap(),
            "http://127.0.0.1:1986/m/a/b"
        );
        let sampled = (0..2000)
            .filter(|_| uri_of(json!({"host": host, "sample_ratio": 0.5}), "/").is_some())
            .count();
        assert!((700..1300).contains(&sampled), "{sampled}");
    }

    #[tokio::test]
    async fn copies_go_out_in_the_background() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !seen.ends_with(b"hello") {
                let n = s.read(&mut buf).await.unwrap();
                seen.extend_from_slice(&buf[..n]);
            }
            tx.send(String::from_utf8(seen).unwrap()).unwrap();
            // Never answers: the client's request must not care.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            drop(s);
        });
        let c = Compiler::new();
        let conf = json!({"host": format!("http://127.0.0.1:{port}")});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "pm2", None)).unwrap();
        let mut req = TestRequest::new(http::Method::POST, "/p?q=1")
            .header("host", "m.test")
            .header("content-length", "5");
        req.state
            .set_body(ferrisix_plugin_api::RequestBody::Buffered(Bytes::from(
                "hello",
            )));
        let mut ctx = req.ctx();
        assert!(matches!(p.rewrite(&mut ctx), Step::Done(_)));
        let flow = match p.before_proxy(&mut ctx) {
            Step::Done(f) => f,
            Step::Wait(f) => tokio::time::timeout(Duration::from_secs(1), f)
                .await
                .unwrap(),
        };
        assert_eq!(flow, ferrisix_plugin_api::Flow::Continue);
        let seen = rx.recv().await.unwrap();
        assert!(seen.starts_with("POST /p?q=1 HTTP/1.1\r\n"), "{seen}");
        assert!(seen.contains("host: m.test\r\n"), "{seen}");
        assert_eq!(ctx.body().unwrap(), "hello", "still forwarded");
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        assert!(r
            .check(NAME, &json!({"host": "http://127.0.0.1:1999"}))
            .is_ok());
        let e = r.check(NAME, &json!({"host": "http://a/b"})).unwrap_err();
        assert!(e.contains("property \"host\" validation failed"), "{e}");
        let e = r
            .check(NAME, &json!({"host": "http://a", "path": "/a?b"}))
            .unwrap_err();
        assert!(e.contains("property \"path\" validation failed"), "{e}");
        assert_eq!(r.get(NAME).unwrap().priority, 1010);
    }
}
