//! Sending the request upstream, stage by stage, one stage per module in the order they run:
//! the body made ready ([`prepare`]: buffered when small enough to be replayed, streamed
//! otherwise), the request every try sends ([`request`], with the headers of [`forwarded`]),
//! then, try after try, the node the balancer picks ([`pick`]), one try on it ([`attempt`]), and
//! after a failure whether another follows ([`retry`]), until one answers ([`relay`]) or the
//! error and retry rules end it (spec data-plane §3). Every try is recorded once in the
//! request's [`crate::log::record::UpstreamRecord`].
//!
//! Each try is reported to the upstream's health checker as APISIX's balancer and log phase
//! report it: a failed try that another try follows counts as a TCP failure or a timeout
//! (passive, even without a `passive` block), the status the last try ended with counts when
//! `passive` is configured. A try holds its node (least_conn's count, ewma's timing) until its
//! response body or websocket tunnel ends.
//!
//! What the tries rest on: the node sets ([`nodes`], names resolved by [`dns`]), the
//! balancers ([`balancer`]), the health checks ([`health`]), the upstream client with its
//! pools and request bodies ([`client`]), and the websocket tunnel ([`websocket`]).

// The stages, in the order a request goes through them.
mod attempt;
mod pick;
mod prepare;
mod relay;
mod request;
mod retry;

// What the stages rest on.
pub mod balancer;
pub mod client;
pub mod discovery;
pub mod dns;
pub(crate) mod forwarded;
pub mod health;
pub mod nodes;
mod websocket;

use std::time::Instant;

use http::{Response, StatusCode};

use self::attempt::Attempt;
use self::client::TryTimeouts;
use self::pick::Tries;
use self::request::Outgoing;
use self::retry::{Resend, Spare};
use crate::ctx::RequestCtx;
use crate::error::{ErrorKind, ErrorSource, ProxyError};
use crate::response::body::ResponseBody;
use crate::response::canned;
use crate::snapshot::CompiledUpstream;

/// Proxies the request to `upstream`; `route_timeouts` replace the upstream's.
pub(crate) async fn proxy(
    ctx: &mut RequestCtx<'_>,
    upstream: &CompiledUpstream,
    route_timeouts: Option<TryTimeouts>,
    websocket: bool,
) -> Response<ResponseBody> {
    if let Some(kafka) = &upstream.kafka {
        // APISIX hands a kafka upstream to pub-sub before the balancer.
        return crate::pubsub::kafka(ctx, kafka);
    }
    let gateway = &*ctx.conn.gateway;
    if let Some(error) = upstream.client_cert_error() {
        // APISIX checks the client ssl before the balancer and ends the request itself.
        tracing::error!("failed to get ssl cert: {error}");
        let error = ProxyError::new(ErrorKind::Unservable(StatusCode::BAD_GATEWAY));
        return canned::error_response(error, &gateway.server_header);
    }
    let body = match prepare::prepare_body(ctx).await {
        Ok(b) => b,
        Err(e) => return canned::error_response(e, &gateway.server_header),
    };
    let replayable = body.is_replayable();
    let (outgoing, headers) = Outgoing::of(ctx, upstream, route_timeouts, websocket);
    let timeouts = outgoing.timeouts;

    let first_try = Instant::now();
    ctx.log.upstream.start = Some(first_try);
    // The node set as resolved now; a name whose first lookup is under way is awaited (on the
    // resolver's tasks, the worker only waits) up to the connect timeout.
    let set = upstream.nodes.ready(timeouts.connect).await;
    if set.nodes.is_empty() {
        // APISIX: "no valid upstream node".
        let error = ProxyError::new(ErrorKind::Unservable(StatusCode::SERVICE_UNAVAILABLE));
        return canned::error_response(error, &gateway.server_header);
    }
    if let Some(kind) = upstream.unknown_balancer().filter(|_| set.nodes.len() > 1) {
        // APISIX skips the balancer for one node; for more it `require`s the balancer's
        // module, whose absence is a Lua runtime error: nginx answers 500.
        tracing::error!(
            "runtime error: module 'apisix.balancer.{kind}' not found (invalid balancer type)"
        );
        let error = ProxyError::new(ErrorKind::Unservable(StatusCode::INTERNAL_SERVER_ERROR));
        return canned::error_response(error, &gateway.server_header);
    }
    let mut tries = Tries::new(ctx, upstream, &set, first_try);
    let client_host = ctx.head.host_value.as_ref();
    let record = &mut ctx.log.upstream;
    let mut next = Resend { headers, body };
    // When the try now under way began: the first at `first_try`, each later one when the one
    // before it failed. Only a failed try's time is recorded here (an answered one's ends with
    // its answer), so the clock is read on failures alone.
    let mut try_start = first_try;
    while let Some(node_idx) = tries.next_node() {
        let node = &set.nodes[node_idx];
        record.addrs.push(node.addr);
        let epoch = set.down_epoch(node_idx);
        let (req, key) = outgoing.to_node(node, epoch, client_host, next, &mut record.host);
        // Copies for another try, when this one could fail after sending.
        let spare = Spare::keep(tries.more_left(), replayable, &req);
        let mut try_guard = set.picker.begin(node_idx);
        match attempt::send(&key, upstream, timeouts, req).await {
            Attempt::Answered(resp, upstream_conn) => {
                record.responded = true;
                let status = resp.status().as_u16();
                record.statuses.push(status);
                try_guard.answered();
                set.report_final(node_idx, status);
                return relay::answer(
                    gateway,
                    resp,
                    upstream_conn,
                    try_guard,
                    outgoing.upgrade,
                    &record.statuses,
                    timeouts,
                );
            }
            Attempt::Failed(failure, returned) => {
                drop(try_guard);
                if failure.source() == ErrorSource::Client {
                    // The client's fault (its body passed the limit or broke off), found while
                    // it streamed: no other try.
                    return canned::error_response(failure, &gateway.server_header);
                }
                tracing::warn!(upstream = %node.addr, "{failure} while proxying");
                record.statuses.push(failure.status().as_u16());
                let failed_at = Instant::now();
                record.times.push(failed_at - try_start);
                try_start = failed_at;
                tries.failed(node_idx, failure);
                let idempotent = outgoing.idempotent;
                match retry::resend(failure, returned, spare, idempotent, replayable) {
                    Some(resend) => next = resend,
                    None => break,
                }
            }
        }
    }
    let tried_any = !record.statuses.is_empty();
    let error = relay::final_error(tries.last_failure(), tried_any, tries.refused());
    // The log phase's passive check sees the status the client gets, on the last node.
    if let Some(last) = tries.last() {
        set.report_final(last, error.status().as_u16());
    }
    let grpc = upstream.h2 && request::is_grpc(&ctx.headers);
    relay::failed(gateway, error, &record.statuses, grpc)
}

/// The node the balancer picks for a plugin that sends the request itself in `before_proxy`
/// ([`ferrisix_plugin_api::Phases::NODE`]: http-dubbo, dubbo-proxy), with the timeouts of a
/// try on it. APISIX's balancer picks it before that phase (`ctx.picked_server`) and the
/// plugin's answer ends the request, so this is the request's only pick. The error is the
/// answer when no node can be picked.
pub(crate) async fn pick_ahead(
    ctx: &mut RequestCtx<'_>,
    upstream: &CompiledUpstream,
    route_timeouts: Option<TryTimeouts>,
) -> Result<(std::net::SocketAddr, TryTimeouts), ProxyError> {
    let timeouts = route_timeouts.unwrap_or(upstream.timeouts);
    let set = upstream.nodes.ready(timeouts.connect).await;
    if set.nodes.is_empty() {
        return Err(ProxyError::new(ErrorKind::Unservable(
            StatusCode::SERVICE_UNAVAILABLE,
        )));
    }
    let mut tries = Tries::new(ctx, upstream, &set, Instant::now());
    match tries.next_node() {
        Some(idx) => Ok((set.nodes[idx].addr, timeouts)),
        None => Err(ProxyError::new(ErrorKind::Unservable(
            StatusCode::BAD_GATEWAY,
        ))),
    }
}
