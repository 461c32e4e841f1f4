//! The plugins' response phases, run on whatever answer ends the request (the upstream's or
//! the gateway's own): what the plugins set on the response goes on it, `header_filter` runs
//! (installing its body filters), and the plugins' side of the log phase is made ready for
//! [`crate::log`], which runs it once the response is over.

use ferrisix_plugin_api::{BodyEdits, LogCtx, Phases, ResponseHead, ResponseSource, UpstreamTries};
use http::Response;

use super::log_needs;
use crate::ctx::{plugin_view, RequestCtx};
use crate::log::lengths::{head_length, request_length};
use crate::log::record::tries;
use crate::log::PendingLog;
use crate::response::body::ResponseBody;

/// The response phases: what the plugins set on the response goes on it, `header_filter`
/// runs (its body edits applied), and the plugins' log phase joins the request's.
pub fn response_phases(ctx: &mut RequestCtx<'_>, resp: &mut Response<ResponseBody>) {
    let Some(mut run) = ctx.plugins.take() else {
        return;
    };
    run.state.take_response_headers().apply(resp.headers_mut());
    let proxied = ctx.log.upstream.proxied() && !run.own_answer;
    if run.has(Phases::HEADER_FILTER) {
        let route_info = ctx.route.as_deref().map(|r| &r.info);
        let taken = std::mem::replace(resp, Response::new(ResponseBody::empty()));
        let (mut head, mut body) = taken.into_parts();
        let mut edits = BodyEdits::default();
        {
            let from_upstream = proxied && ctx.log.upstream.responded;
            let mut response = ResponseHead::new(
                &mut head.status,
                &mut head.headers,
                from_upstream,
                &mut edits,
            );
            // `$balancer_ip`, `$upstream_addr`, ...: the tries behind this answer.
            let tries = UpstreamTries {
                addrs: &ctx.log.upstream.addrs,
                statuses: &ctx.log.upstream.statuses,
                times: &ctx.log.upstream.times,
            };
            let mut view = plugin_view(
                &ctx.head,
                &ctx.conn.facts,
                &mut ctx.headers,
                route_info,
                &mut run.state,
            )
            .with_upstream_tries(tries);
            run.global
                .header_filter(&mut view, &mut response, run.verdicts.0);
            if let Some(r) = &run.route {
                r.header_filter(&mut view, &mut response, run.verdicts.1);
            }
        }
        if let Some(replacement) = edits.replacement {
            body.replace(replacement);
        }
        body.set_filters(edits.filters);
        *resp = Response::from_parts(head, body);
    }
    if !run.has(Phases::LOG) && !run.state.has_guards() {
        return;
    }
    let needs = log_needs(&run.global, run.route.as_deref());
    // What the request phases already captured for the log phase; its box is reused.
    let mut early = ctx.log.plugins.take();
    let record = &ctx.log.upstream;
    let (mut vars, request_body, request_length) = match early.as_deref_mut() {
        Some(e) => (
            std::mem::take(&mut e.ctx.vars),
            e.ctx.request_body.take(),
            e.ctx.request_length,
        ),
        None => (
            std::mem::take(&mut run.log_vars),
            run.request_body.take(),
            request_length(&ctx.head, &ctx.headers),
        ),
    };
    if !vars.is_empty() {
        vars.set("upstream_addr", || tries(&record.addrs));
        vars.set("upstream_status", || tries(&record.statuses));
    }
    let (matched_uri, matched_host) = run.state.matched();
    let log = LogCtx {
        status: resp.status().as_u16(),
        matched_uri,
        matched_host,
        node: if proxied {
            record.last_addr().map(|a| a.ip())
        } else {
            None
        },
        request_length,
        bytes_sent: head_length(resp),
        request_time: Default::default(),
        upstream_time: None,
        response_source: if !proxied {
            ResponseSource::Apisix
        } else if record.responded {
            ResponseSource::Upstream
        } else {
            ResponseSource::Nginx
        },
        consumer: run.state.consumer().cloned(),
        vars,
        request_headers: needs.request_headers.then(|| ctx.headers.clone()),
        response_headers: needs.response_headers.then(|| resp.headers().clone()),
        request_body,
        response_body: None,
        values: run.state.take_values(),
    };
    let body_limit = needs.response_body;
    let pending = PendingLog {
        global: run.global,
        route: run.route,
        verdicts: run.verdicts,
        guards: run.state.take_guards(),
        ctx: log,
        start: ctx.started,
        body_limit,
        body: Default::default(),
        abandoned: false,
    };
    ctx.log.plugins = Some(match early {
        Some(mut boxed) => {
            *boxed = pending;
            boxed
        }
        None => Box::new(pending),
    });
}
