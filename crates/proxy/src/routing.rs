//! Routing: the published snapshot's route table against the request, and what the request
//! path keeps of the match (the snapshot itself is let go right after).

use ferrisix_plugin_api::RequestVars;
use ferrisix_router::{Method as RouteMethod, RequestInfo};

use crate::ctx::RequestCtx;
use crate::error::{ErrorKind, ProxyError};
use crate::plugins::PluginRun;
use crate::snapshot::RouteTarget;
use crate::upstream::client::TryTimeouts;

/// Where a matched route sends the request.
pub struct Matched {
    pub target: RouteTarget,
    /// The route's own `timeout`, which replaces the upstream's.
    pub timeouts: Option<TryTimeouts>,
    /// A websocket upgrade the route allows.
    pub websocket: bool,
}

/// Looks the request up. A match records the route for the access log and, when any plugin
/// runs for it, keeps the route and starts the request's plugin side; so does a request that
/// matched no route when global rules exist (`Ok(None)` is returned then). On a TLS
/// connection, a client certificate policy may refuse the request first (400).
pub fn route(ctx: &mut RequestCtx<'_>) -> Result<Option<Matched>, ProxyError> {
    let snapshot = ctx.conn.gateway.snapshot.load();
    if let Some(tls) = &ctx.conn.tls {
        // APISIX's verify_https_client runs before routing and answers 400.
        if let Err(reason) =
            ferrisix_tls::mtls::check_request(tls, &snapshot.tls, ctx.head.path(), ctx.head.host())
        {
            tracing::error!(client = %ctx.conn.peer(), "{reason}");
            return Err(ErrorKind::BadRequest.into());
        }
    }
    let wants_id = ctx.log.record.is_some();
    let found = {
        let head = ctx.head.as_request_head(&ctx.conn.facts);
        let info = RequestInfo {
            path: head.path,
            host: head.host,
            host_header: ctx.head.host_value.as_ref().and_then(|v| v.to_str().ok()),
            method: RouteMethod::from_bytes(ctx.head.method.as_str().as_bytes()),
            remote_addr: ctx.remote_addr,
        };
        let vars = RequestVars {
            head: &head,
            headers: &ctx.headers,
            remote_addr: ctx.remote_addr,
            remote_port: None,
        };
        // Only what the rest of the request needs is taken from the match: a route without
        // plugins is not even referenced past this point.
        snapshot.router.lookup(&info, &vars).map(|m| {
            let route = m.value;
            let with_plugins = !route.chain.is_empty() || !route.global_chain.is_empty();
            let plugins = with_plugins.then(|| {
                let uri = route.info.uri_index(m.matched_uri).map(|i| i as u16);
                let host = m
                    .matched_host
                    .and_then(|h| route.info.host_index(h))
                    .map(|i| i as u16);
                (route.clone(), uri, host)
            });
            let matched = Matched {
                target: route.target.clone(),
                timeouts: route.timeout.as_deref().copied(),
                websocket: route.enable_websocket,
            };
            (matched, wants_id.then(|| route.info.id.clone()), plugins)
        })
    };
    let Some((mut matched, log_id, plugins)) = found else {
        if !snapshot.global_chain.is_empty() {
            // Global rules run for unmatched requests too, and may answer instead of the 404.
            let mut run = PluginRun::unmatched(snapshot.global_chain.clone(), ctx.remote_addr);
            run.give_consumers(&snapshot.consumers);
            ctx.plugins = Some(run);
        }
        return Ok(None);
    };
    // Only requests whose plugins authenticate take the consumers along.
    let consumers = plugins
        .as_ref()
        .filter(|(r, _, _)| r.chain.needs_consumers() || r.global_chain.needs_consumers())
        .map(|_| snapshot.consumers.clone());
    drop(snapshot);
    if matched.websocket {
        matched.websocket = ctx.headers.contains_key(http::header::UPGRADE);
    }
    if let Some(r) = ctx.log.record.as_deref_mut() {
        r.route_id = log_id;
    }
    if let Some((route, uri, host)) = plugins {
        let mut run = PluginRun::matched(&route, uri, host, ctx.remote_addr);
        if let Some(c) = &consumers {
            run.give_consumers(c);
        }
        ctx.plugins = Some(run);
        // The route outlives the snapshot while its plugins may wait on I/O.
        ctx.route = Some(route);
    }
    Ok(Some(matched))
}
