//! A request from its head to its answer, stage by stage, in the order the stages run: the head
//! checked ([`head`]), the request routed ([`crate::routing`]), the plugins' request phases
//! ([`crate::plugins`]), the upstream tries ([`crate::upstream`]) or the gateway's own answer
//! ([`crate::response`]), the plugins' response phases, and the log phase ([`crate::log`])
//! handed to the response body. Each stage lives in its own module; this one only orders them.
//!
//! It reads only the published snapshot (one atomic load), so it never waits on configuration
//! changes, and it allocates only what the upstream request itself needs.

mod head;
pub(crate) mod host;
pub(crate) mod real_ip;

use std::future::Future;
use std::time::Instant;

use http::header::{self, HeaderValue};
use http::request::Parts;
use http::{Request, Response, Version};
use hyper::body::Incoming;

use crate::client_body::ClientBody;
use crate::ctx::RequestCtx;
use crate::error::{ErrorKind, ProxyError};
use crate::gateway::ConnInfo;
use crate::log::access::LogRecord;
use crate::log::{lengths, LogPhase};
use crate::response::body::ResponseBody;
use crate::response::canned;
use crate::snapshot::{CompiledUpstream, RouteTarget};
use crate::{plugins, routing, upstream};

impl ConnInfo {
    /// Serves one HTTP/1.1 or HTTP/2 request of this connection. A plain function handing
    /// back [`ConnInfo::handle_parts`]'s future: an `async fn` here would wrap that whole
    /// state machine in another one, which every request paid for in moves and polls.
    pub fn handle(
        &self,
        req: Request<Incoming>,
    ) -> impl Future<Output = Response<ResponseBody>> + '_ {
        let (parts, body) = req.into_parts();
        self.handle_parts(parts, ClientBody::Http(body))
    }

    /// Serves one request of this connection from its head and body, whatever the protocol
    /// (HTTP/3 comes in here).
    pub async fn handle_parts(&self, parts: Parts, mut body: ClientBody) -> Response<ResponseBody> {
        let gateway = &*self.gateway;
        if let Some(admin) = &gateway.legacy_admin {
            // Loopback only: this is a compatibility switch for local scripts, not an exposure
            // of the Admin API on the public port (HTTP/1.1 and h2 only).
            if self.peer().ip().is_loopback() && parts.uri.path().starts_with("/apisix/admin") {
                match body {
                    ClientBody::Http(b) => {
                        return admin(Request::from_parts(parts, b), self.peer().ip()).await
                    }
                    other => body = other,
                }
            }
        }
        let started = Instant::now();
        ferrisix_net::share_core(started);
        let remote_addr = match self.client_from_proxy_protocol() {
            Some(client) => client,
            None => gateway
                .real_ip
                .client_addr(self.peer().ip(), &parts.headers),
        };
        let record = gateway.access_log.enabled().then(|| {
            Box::new(LogRecord {
                start: started,
                remote_addr,
                server_port: self.local().port(),
                proxy_protocol: self.facts.proxy_protocol.map(|pp| pp.source),
                method: parts.method.clone(),
                uri: parts.uri.clone(),
                version: parts.version,
                headers: gateway
                    .access_log
                    .captured_headers()
                    .iter()
                    .map(|h| parts.headers.get(h).cloned())
                    .collect(),
                status: 0,
                request_length: if gateway.access_log.wants_request_length() {
                    lengths::request_length_of(&parts.method, &parts.uri, &parts.headers)
                } else {
                    0
                },
                body_bytes_sent: 0,
                route_id: None,
                consumer_name: None,
                values: None,
            })
        });
        let log = LogPhase::start(self.log.clone(), record);
        let mut ctx = RequestCtx::new(self, parts, body, remote_addr, started, log);
        let mut resp = match head::check(&mut ctx) {
            Ok(()) => serve(&mut ctx).await,
            Err(e) => canned::error_response(e, &gateway.server_header),
        };
        if resp.status() == http::StatusCode::PAYLOAD_TOO_LARGE
            && ctx.head.version < Version::HTTP_2
        {
            // nginx turns keep-alive off for 413 (the rest of the body is not read).
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        plugins::response_phases(&mut ctx, &mut resp);
        let RequestCtx { mut log, .. } = ctx;
        log.status = resp.status().as_u16();
        resp.body_mut().set_log(log);
        resp
    }
}

/// Routes the request, runs its request phases and proxies it (or answers for it).
async fn serve(ctx: &mut RequestCtx<'_>) -> Response<ResponseBody> {
    let conn = ctx.conn;
    let server = &conn.gateway.server_header;
    let routed = match routing::route(ctx) {
        Ok(routed) => routed,
        Err(e) => return canned::error_response(e, server),
    };
    let Some(matched) = routed else {
        if let Some(exit) = plugins::request_phases(ctx, false).await {
            return canned::exit_response(exit, server);
        }
        return canned::route_not_found(server);
    };
    // A plugin that answers in place of the upstream (ai-proxy) needs none configured.
    let proxying = matches!(matched.target, RouteTarget::Upstream(_))
        || ctx.plugins.as_ref().is_some_and(|r| {
            r.route
                .as_deref()
                .is_some_and(|c| c.has(ferrisix_plugin_api::Phases::UPSTREAM))
        });
    if let Some(exit) = plugins::request_phases(ctx, proxying).await {
        let stream = ctx
            .plugins
            .as_mut()
            .and_then(|r| r.state.take_exit_stream());
        return match stream {
            Some(body) => canned::exit_stream_response(exit, body, server),
            None => canned::exit_response(exit, server),
        };
    }
    let chosen = ctx
        .plugins
        .as_ref()
        .and_then(|r| r.state.chosen_upstream())
        .cloned();
    // A plugin sent the request to another upstream (traffic-split).
    let upstream = match chosen.as_ref().and_then(|h| h.get::<CompiledUpstream>()) {
        Some(u) => u,
        None => match &matched.target {
            RouteTarget::Upstream(u) => &**u,
            RouteTarget::Fail(status) => {
                let error = ProxyError::new(ErrorKind::Unservable(*status));
                return canned::error_response(error, server);
            }
        },
    };
    if !plugins::may_hold_upstream_answer(ctx) {
        // The common case ends here, the answer not held across another await.
        return upstream::proxy(ctx, upstream, matched.timeouts, matched.websocket).await;
    }
    let resp = upstream::proxy(ctx, upstream, matched.timeouts, matched.websocket).await;
    if !ctx.log.upstream.responded {
        return resp;
    }
    plugins::upstream_answer(ctx, resp).await
}
