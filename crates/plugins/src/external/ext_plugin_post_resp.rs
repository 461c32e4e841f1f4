//! ext-plugin-post-resp (`apisix/plugins/ext-plugin-post-resp.lua`): in `before_proxy`
//! (priority -4000) it sends the request to the picked upstream node itself, reads the whole
//! answer, and lets the runner change its status, headers and body before the client gets
//! it. As APISIX's, it speaks plain HTTP to the node, and the client's answer is built from
//! the runner's: the runner's headers when it set some, else the upstream's but the ones a
//! runner may not set (`Content-Type`, `Content-Length`, `Location` ...).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_plugin_api::{
    CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef, PluginServices, Step,
};
use http::{HeaderValue, Request, StatusCode};
use serde_json::Value;

use super::runner::{self, excluded_resp_header, set_response_headers, RunnerClient, Upstream};

pub const NAME: &str = "ext-plugin-post-resp";

pub static DEF: PluginDef = PluginDef::new(NAME, -4000, schema, compile);

/// lua-resty-http's socket timeout, which APISIX leaves as it is.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(60);

fn schema() -> Value {
    runner::schema()
}

struct PostResp {
    client: RunnerClient,
    services: Arc<PluginServices>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let key = format!("{}#{NAME}", cx.state_key());
    Ok(Arc::new(PostResp {
        client: RunnerClient::new(NAME, key, &cx.filled(), cx.services),
        services: cx.services.clone(),
    }))
}

impl PostResp {
    async fn fetch(&self, ctx: &mut PluginCtx<'_>) -> Result<Upstream, String> {
        let node = ctx
            .upstream_node()
            .ok_or_else(|| "no upstream node picked".to_owned())?;
        let uri = format!("http://{node}{}", ctx.upstream_uri());
        let method = ctx
            .upstream_edits()
            .method
            .clone()
            .unwrap_or_else(|| ctx.method().clone());
        let mut headers = ctx.headers().clone();
        if let Some(h) = ctx.upstream_edits().host.clone() {
            headers.insert(http::header::HOST, h);
        }
        let body = ctx
            .read_body(usize::MAX)
            .await
            .map_err(|e| e.to_string())?
            .clone();
        if !body.is_empty() {
            headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(body.len()));
            headers.remove(http::header::TRANSFER_ENCODING);
        }
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .body(body)
            .map_err(|e| e.to_string())?;
        *req.headers_mut() = headers;
        let resp = self
            .services
            .http()
            .send(req, UPSTREAM_TIMEOUT)
            .await
            .map_err(|e| e.to_string())?;
        let (parts, body) = resp.into_parts();
        Ok(Upstream {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    }

    async fn run(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let up = match self.fetch(ctx).await {
            Ok(up) => up,
            Err(e) => {
                tracing::error!(plugin = NAME, "failed to request: {e}");
                return Flow::Exit(Exit::status(StatusCode::BAD_GATEWAY));
            }
        };
        let (status, body) = match self.client.communicate_resp(ctx, &up).await {
            Ok(Some(out)) => {
                if out.headers.is_empty() {
                    let list: Vec<(&str, Option<&str>)> = up
                        .headers
                        .iter()
                        .filter(|(n, _)| !excluded_resp_header(n.as_str()))
                        .map(|(n, v)| (n.as_str(), v.to_str().ok()))
                        .collect();
                    set_response_headers(ctx, &list, false);
                } else {
                    let list: Vec<(&str, Option<&str>)> = out
                        .headers
                        .iter()
                        .map(|(n, v)| (n.as_str(), Some(v.as_str())))
                        .collect();
                    set_response_headers(ctx, &list, false);
                }
                (out.status.unwrap_or(up.status), out.body.unwrap_or(up.body))
            }
            // Degraded: the upstream's status and body, as APISIX sends them.
            Ok(None) => (up.status, up.body),
            // A failed runner: APISIX's 503 goes out with the upstream's body.
            Err(code) => (code, up.body),
        };
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
        Flow::Exit(exit_with(status, body))
    }
}

/// An exit whose body is sent as it is, even empty (`Exit::status` would send nginx's page).
fn exit_with(status: StatusCode, body: Bytes) -> Exit {
    Exit::body(status, body)
}

impl Plugin for PostResp {
    fn phases(&self) -> Phases {
        Phases::BEFORE_PROXY
    }

    fn before_proxy<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.run(ctx)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definition_as_apisix() {
        assert_eq!(DEF.priority, -4000);
        assert_eq!(DEF.name, "ext-plugin-post-resp");
    }
}
