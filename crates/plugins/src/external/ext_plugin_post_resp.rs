//! ext-plugin-post-resp (`apisix/plugins/ext-plugin-post-resp.lua`, priority -4000): the
//! runner is told the upstream's answer (status and headers; the body when it asks) before
//! any of it goes to the client, and may replace the status, headers and body.
//!
//! APISIX makes the upstream call itself in `before_proxy` with an HTTP client of its own
//! (to the node the balancer picked, no retries, the client's headers as they came) so that
//! it can hold the answer back; ferrisix holds back the answer of its own proxying instead
//! ([`Phases::UPSTREAM_ANSWER`]), so the upstream's scheme, TLS, `pass_host`, retries, timeouts
//! and health checks apply as on any route. What the client gets follows APISIX's rules: the
//! runner's headers when it gives any (the upstream's are then dropped), else the upstream's
//! without the ones APISIX excludes; the runner's body with its status (the upstream's when it
//! sets none), else the upstream's body, unread unless the runner asked for it.

use std::sync::Arc;

use ferrisix_plugin_api::{
    CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef, Step, UpstreamAnswer,
};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::Value;

use super::runner::{self, proto, RespOutcome, RunnerClient};

pub const NAME: &str = "ext-plugin-post-resp";

pub static DEF: PluginDef = PluginDef::new(NAME, -4000, schema, compile);

fn schema() -> Value {
    runner::schema()
}

struct PostResp(RunnerClient);

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let key = format!("{}#{NAME}", cx.state_key());
    Ok(Arc::new(PostResp(RunnerClient::new(
        NAME,
        key,
        &cx.filled(),
        cx.services,
    ))))
}

impl Plugin for PostResp {
    fn phases(&self) -> Phases {
        Phases::BEFORE_PROXY | Phases::UPSTREAM_ANSWER
    }

    /// APISIX reads the request body whole to send it upstream itself; the runner may ask
    /// for it (`ExtraInfo.ReqBody`) once the answer is back, so it is kept here (it is still
    /// forwarded).
    fn before_proxy<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let has_body = ctx
            .header("content-length")
            .is_some_and(|l| l.trim() != "0")
            || ctx.header("transfer-encoding").is_some();
        if !has_body {
            return Step::CONTINUE;
        }
        Step::Wait(Box::pin(async move {
            if let Err(e) = ctx.read_body(proto::MAX_DATA_SIZE).await {
                tracing::error!(plugin = NAME, "failed to read request body: {e}");
            }
            Flow::Continue
        }))
    }

    fn upstream_answer<'a>(
        &'a self,
        ctx: &'a mut PluginCtx<'_>,
        answer: &'a mut UpstreamAnswer,
    ) -> Step<'a> {
        Step::Wait(Box::pin(async move {
            match self.0.communicate_resp(ctx, answer).await {
                Ok(Some(outcome)) => {
                    apply(answer, outcome);
                    Flow::Continue
                }
                // Degraded: the upstream's answer goes on as it came.
                Ok(None) => Flow::Continue,
                Err(status) => Flow::Exit(Exit::status(
                    StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
                )),
            }
        }))
    }
}

/// The runner's answer applied as APISIX applies it.
fn apply(answer: &mut UpstreamAnswer, outcome: RespOutcome) {
    // The upstream's framing stays with an upstream body that is relayed unread.
    let framing = match outcome.body {
        Some(_) => Vec::new(),
        None => answer_framing(&answer.headers),
    };
    answer.headers = if outcome.headers.is_empty() {
        let mut kept = std::mem::take(&mut answer.headers);
        let excluded: Vec<HeaderName> = kept
            .keys()
            .filter(|n| runner::excluded_resp_header(n.as_str()))
            .cloned()
            .collect();
        for n in excluded {
            kept.remove(n);
        }
        kept
    } else {
        // A name's first value replaces, later ones add (`set_header` then `add_header`).
        let mut set = HeaderMap::new();
        for (name, value) in &outcome.headers {
            let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes()),
                HeaderValue::from_str(value),
            ) else {
                continue;
            };
            set.append(n, v);
        }
        set
    };
    for (n, v) in framing {
        answer.headers.insert(n, v);
    }
    // APISIX answers from Lua here, and lua-nginx-module gives an answer without a type
    // nginx's `default_type` (text/plain).
    if !answer.headers.contains_key(http::header::CONTENT_TYPE) {
        answer.headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain"),
        );
    }
    if let Some(status) = outcome.status.and_then(|s| StatusCode::from_u16(s).ok()) {
        answer.status = status;
    }
    if let Some(body) = outcome.body {
        answer.set_body(body);
    }
}

/// The headers that describe how the upstream's body is framed: they go with that body when
/// it is relayed (APISIX streams it with nginx's own framing).
fn answer_framing(headers: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    [
        http::header::CONTENT_LENGTH,
        http::header::TRANSFER_ENCODING,
    ]
    .into_iter()
    .filter_map(|n| headers.get(&n).cloned().map(|v| (n, v)))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::PluginRegistry;
    use bytes::Bytes;
    use ferrisix_config::validate::PluginCheck;
    use serde_json::json;

    fn answer(headers: &[(&str, &str)]) -> UpstreamAnswer {
        let mut map = HeaderMap::new();
        for (n, v) in headers {
            map.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        let body: ferrisix_plugin_api::PendingBody = Box::pin(http_body_util::BodyExt::map_err(
            http_body_util::Full::new(Bytes::from_static(b"upstream")),
            |never| match never {},
        ));
        UpstreamAnswer::new(StatusCode::OK, map, body)
    }

    #[test]
    fn schema_and_priority_as_apisix() {
        let r = PluginRegistry::builtin();
        assert!(r.check(NAME, &json!({})).is_ok());
        assert!(r
            .check(
                NAME,
                &json!({"conf": [{"name": "a", "value": "b"}], "allow_degradation": true})
            )
            .is_ok());
        assert!(r.check(NAME, &json!({"conf": []})).is_err());
        assert_eq!(DEF.priority, -4000);
    }

    #[test]
    fn without_runner_headers_the_upstreams_stay_but_the_excluded() {
        let mut a = answer(&[
            ("content-type", "text/html"),
            ("content-length", "8"),
            ("x-up", "1"),
            ("server", "up"),
        ]);
        apply(
            &mut a,
            RespOutcome {
                status: Some(304),
                ..RespOutcome::default()
            },
        );
        assert_eq!(a.status, StatusCode::NOT_MODIFIED);
        assert_eq!(a.headers.get("x-up").unwrap(), "1");
        // The upstream's type is excluded; nginx's default_type takes its place.
        assert_eq!(a.headers.get("content-type").unwrap(), "text/plain");
        assert!(a.headers.get("server").is_none());
        // The body is relayed unread, so its length stays.
        assert_eq!(a.headers.get("content-length").unwrap(), "8");
    }

    #[test]
    fn runner_headers_replace_the_upstreams() {
        let mut a = answer(&[("x-up", "1"), ("content-length", "8")]);
        apply(
            &mut a,
            RespOutcome {
                status: Some(200),
                headers: vec![
                    ("X-A".into(), "1".into()),
                    ("x-a".into(), "2".into()),
                    ("Content-Type".into(), "text/plain".into()),
                ],
                body: Some(Bytes::from_static(b"NEW")),
            },
        );
        assert!(a.headers.get("x-up").is_none());
        let values: Vec<_> = a.headers.get_all("x-a").iter().collect();
        assert_eq!(values, ["1", "2"]);
        assert_eq!(a.headers.get("content-type").unwrap(), "text/plain");
        assert!(
            a.headers.get("content-length").is_none(),
            "set from the new body"
        );
    }
}
