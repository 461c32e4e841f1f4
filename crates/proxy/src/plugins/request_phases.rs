//! The plugins' request phases (spec data-plane §1): global rules' and the route's `rewrite`
//! and `access` before proxying, `before_proxy` when proxying, and what the log phase needs
//! of the request read while the request is at hand.

use std::sync::Arc;

use ferrisix_plugin_api::{
    BodyError, Exit, Flow, LogCtx, LogVars, NodeTimeouts, Phases, RequestBody,
};
use ferrisix_plugins::{ConsumerChains, PluginChain, Verdicts};
use http_body::Body as _;

use super::{log_needs, PluginRun};
use crate::ctx::{plugin_view, RequestCtx};
use crate::log::lengths::request_length;
use crate::log::PendingLog;
use crate::snapshot::{CompiledUpstream, RouteTarget};

/// The request phases: 3.17+ order, global rewrite, route rewrite, global access, route
/// access, then (when proxying) `before_proxy`. Answers the exit that ends the request, if
/// any.
pub async fn request_phases(ctx: &mut RequestCtx<'_>, proxying: bool) -> Option<Exit> {
    let run = ctx.plugins.as_mut()?;
    let route_info = ctx.route.as_deref().map(|r| &r.info);
    run.state
        .set_body_timeout(ctx.conn.gateway.client_body_timeout);
    if let Some(body) = ctx.body.take() {
        if body.is_end_stream() {
            ctx.body = Some(body);
        } else {
            // Plugins may read the body (once; it is still forwarded from here).
            run.state.set_body(RequestBody::Unread(Box::pin(
                http_body_util::BodyExt::map_err(body, |e| BodyError::Broken(e.to_string())),
            )));
        }
    }
    let PluginRun {
        global,
        route,
        runs,
        state,
        consumers,
        ..
    } = run;
    let mut view = plugin_view(
        &ctx.head,
        &ctx.conn.facts,
        &mut ctx.headers,
        route_info,
        state,
    );
    let mut flow = Flow::Continue;
    if *runs {
        flow = run_phases(global, route, consumers.as_deref(), &mut view).await;
    }
    let proceed = *runs && flow == Flow::Continue && proxying;
    let needs_node = proceed
        && (global.has(Phases::NODE) || route.as_deref().is_some_and(|r| r.has(Phases::NODE)));
    let verdicts = if needs_node {
        if let Some(exit) = pick_node(ctx).await {
            flow = Flow::Exit(exit);
        }
        // The pick needed the whole request: the view is made again after it.
        let route_info = ctx.route.as_deref().map(|r| &r.info);
        let PluginRun {
            global,
            route,
            state,
            ..
        } = ctx.plugins.as_mut()?;
        let mut view = plugin_view(
            &ctx.head,
            &ctx.conn.facts,
            &mut ctx.headers,
            route_info,
            state,
        );
        before_proxy(global, route.as_deref(), &mut view, &mut flow, proceed).await
    } else {
        before_proxy(global, route.as_deref(), &mut view, &mut flow, proceed).await
    };
    let route_info = ctx.route.as_deref().map(|r| &r.info);
    let run = ctx.plugins.as_mut()?;
    run.verdicts = verdicts;
    // Plugins may have changed who the client is (real-ip): the upstream hears it too.
    ctx.remote_addr = run.state.remote_addr();
    if let (Some(record), Some(consumer)) = (ctx.log.record.as_deref_mut(), run.state.consumer()) {
        record.consumer_name = Some(consumer.username.clone());
    }
    let needs = log_needs(&run.global, run.route.as_deref());
    if let Some(names) = needs.vars.clone() {
        let view = plugin_view(
            &ctx.head,
            &ctx.conn.facts,
            &mut ctx.headers,
            route_info,
            &mut run.state,
        );
        run.log_vars = LogVars::capture(names, &view);
    }
    if let (Some(limit), Flow::Continue) = (needs.request_body, &flow) {
        // Read before proxying, as APISIX's log-util reads it, and still forwarded.
        let gap = run.state.body_timeout();
        let body = run.state.body_mut();
        let _ = body.read(limit, gap).await;
        run.request_body = match body {
            RequestBody::Buffered(b) => Some(b.slice(..b.len().min(limit))),
            RequestBody::Partial { read, .. } => Some(read.slice(..read.len().min(limit))),
            _ => None,
        };
    }
    if run.has(Phases::LOG) {
        // The plugins' log phase runs even if the client goes away before the answer
        // (nginx's 499): it waits in the log phase, which the response phases complete.
        let (matched_uri, matched_host) = run.state.matched();
        ctx.log.plugins = Some(Box::new(PendingLog {
            global: run.global.clone(),
            route: run.route.clone(),
            verdicts: run.verdicts,
            guards: Default::default(),
            ctx: LogCtx {
                status: 499,
                matched_uri,
                matched_host,
                request_length: request_length(&ctx.head, &ctx.headers),
                consumer: run.state.consumer().cloned(),
                vars: std::mem::take(&mut run.log_vars),
                request_headers: needs.request_headers.then(|| ctx.headers.clone()),
                request_body: run.request_body.take(),
                ..LogCtx::default()
            },
            start: ctx.started,
            body_limit: None,
            body: Default::default(),
            abandoned: true,
        }));
    }
    match flow {
        Flow::Exit(e) => {
            run.own_answer = true;
            Some(e)
        }
        Flow::Continue => None,
    }
}

/// `before_proxy` (global rules', then the route's) when `proceed` and nothing ended the
/// request yet, then the `_meta.filter` verdicts for the phases after the response head.
async fn before_proxy(
    global: &PluginChain,
    route: Option<&PluginChain>,
    view: &mut ferrisix_plugin_api::PluginCtx<'_>,
    flow: &mut Flow,
    proceed: bool,
) -> (Verdicts, Verdicts) {
    if proceed && *flow == Flow::Continue {
        if global.has(Phases::BEFORE_PROXY) {
            *flow = global.before_proxy(view).await;
        }
        if *flow == Flow::Continue {
            if let Some(r) = route.filter(|r| r.has(Phases::BEFORE_PROXY)) {
                *flow = r.before_proxy(view).await;
            }
        }
    }
    (
        global.verdicts(view),
        route.map_or(Verdicts::ALL, |r| r.verdicts(view)),
    )
}

/// Picks the upstream node ahead of `before_proxy` for a plugin that sends the request to it
/// itself, and hands it to the plugins; the exit when none can be picked.
async fn pick_node(ctx: &mut RequestCtx<'_>) -> Option<Exit> {
    // Owned handles: the pick borrows the request mutably (a shared borrow is not `Send`).
    let chosen = ctx
        .plugins
        .as_ref()
        .and_then(|r| r.state.chosen_upstream())
        .cloned();
    let route = ctx.route.clone()?;
    let upstream = match chosen.as_ref().and_then(|h| h.get::<CompiledUpstream>()) {
        Some(u) => u,
        None => match &route.target {
            RouteTarget::Upstream(u) => &**u,
            RouteTarget::Fail(_) => return None,
        },
    };
    let route_timeouts = route.timeout.as_deref().copied();
    match crate::upstream::pick_ahead(ctx, upstream, route_timeouts).await {
        Ok((node, t)) => {
            let state = &mut ctx.plugins.as_mut()?.state;
            state.set_upstream_node(node);
            state.set_upstream_timeouts(NodeTimeouts {
                connect: t.connect,
                send: t.send,
                read: t.read,
            });
            None
        }
        Err(e) => {
            tracing::error!("failed to pick server: {e}");
            Some(Exit::status(e.status()))
        }
    }
}

/// Each chain's phase is awaited only when one of its plugins implements it: a chain without
/// it would still build and poll a future to find out, and a route with plugins makes six
/// such calls (`benches/e2e/instructions.py --scenario s2` counts them).
async fn run_phases(
    global: &PluginChain,
    route: &mut Option<Arc<PluginChain>>,
    consumers: Option<&ConsumerChains>,
    ctx: &mut ferrisix_plugin_api::PluginCtx<'_>,
) -> Flow {
    if global.has(Phases::REWRITE) {
        if let Flow::Exit(e) = global.rewrite(ctx).await {
            return Flow::Exit(e);
        }
    }
    if let Some(r) = route.as_deref().filter(|r| r.has(Phases::REWRITE)) {
        if let Flow::Exit(e) = r.rewrite(ctx).await {
            return Flow::Exit(e);
        }
    }
    // APISIX's merge_consumer_route: once a consumer is known, its (and its group's) plugins
    // join the route's, run their rewrite, and the merged chain runs from here to the log.
    // Each (route, consumer) pair is merged once per snapshot, as APISIX caches the merge.
    let merge = consumers.and_then(|chains| {
        let cp = chains.plugins_of(&ctx.consumer()?.username)?;
        Some(chains.merged(route.as_ref()?, cp))
    });
    if let Some(merged) = merge {
        *route = Some(merged.clone());
        if let Flow::Exit(e) = merged.rewrite_in_consumer(ctx).await {
            return Flow::Exit(e);
        }
    }
    if global.has(Phases::ACCESS) {
        if let Flow::Exit(e) = global.access(ctx).await {
            return Flow::Exit(e);
        }
    }
    if let Some(r) = route.as_deref().filter(|r| r.has(Phases::ACCESS)) {
        if let Flow::Exit(e) = r.access(ctx).await {
            return Flow::Exit(e);
        }
    }
    Flow::Continue
}
