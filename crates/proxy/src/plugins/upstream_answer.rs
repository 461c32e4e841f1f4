//! The plugins' `upstream_answer` phase: the upstream's answer held back for the plugins
//! that act on it whole (ext-plugin-post-resp) before `header_filter` runs on it. Global
//! rules first, then the route, as APISIX runs `before_proxy` where that plugin does its work.
//! Nothing here runs for a request whose plugins do not implement the phase.

use ferrisix_plugin_api::{AnswerBody, BodyError, Flow, Phases, UpstreamAnswer};
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;

use crate::ctx::{plugin_view, RequestCtx};
use crate::response::body::ResponseBody;
use crate::response::canned;

/// Whether some plugin of the request may hold the upstream's answer back: checked before
/// proxying, so the other requests' answers are not kept across another await.
pub fn may_hold_upstream_answer(ctx: &RequestCtx<'_>) -> bool {
    ctx.plugins
        .as_ref()
        .is_some_and(|r| r.runs && r.has(Phases::UPSTREAM_ANSWER))
}

/// Runs the phase on `resp`, an upstream's answer some plugin holds back
/// ([`may_hold_upstream_answer`]); answers what the client gets.
pub async fn upstream_answer(
    ctx: &mut RequestCtx<'_>,
    resp: Response<ResponseBody>,
) -> Response<ResponseBody> {
    let server = &ctx.conn.gateway.server_header;
    let (mut parts, body) = resp.into_parts();
    let body: ferrisix_plugin_api::PendingBody =
        Box::pin(body.map_err(|e| BodyError::Broken(e.to_string())));
    let mut answer = UpstreamAnswer::new(parts.status, std::mem::take(&mut parts.headers), body);
    let route_info = ctx.route.as_deref().map(|r| &r.info);
    let Some(run) = ctx.plugins.as_mut() else {
        unreachable!("checked above")
    };
    let mut view = plugin_view(
        &ctx.head,
        &ctx.conn.facts,
        &mut ctx.headers,
        route_info,
        &mut run.state,
    );
    let mut flow = run.global.upstream_answer(&mut view, &mut answer).await;
    if flow == Flow::Continue {
        if let Some(route) = run.route.as_deref() {
            flow = route.upstream_answer(&mut view, &mut answer).await;
        }
    }
    if let Flow::Exit(exit) = flow {
        // The answer is the plugin's now: header_filter sees an exit, as in APISIX, where
        // the plugin ends the request in before_proxy.
        run.own_answer = true;
        return canned::exit_response(exit, server);
    }
    let (status, headers, body) = answer.into_parts();
    parts.status = status;
    parts.headers = headers;
    let body = match body {
        AnswerBody::Stream(pending) => ResponseBody::stream(pending),
        AnswerBody::Full(bytes) => {
            parts.headers.remove(header::TRANSFER_ENCODING);
            parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
            ResponseBody::full(bytes)
        }
        AnswerBody::Broken => {
            run.own_answer = true;
            return canned::error_page(StatusCode::BAD_GATEWAY, server);
        }
    };
    Response::from_parts(parts, body)
}
