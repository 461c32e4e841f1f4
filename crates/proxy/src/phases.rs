//! Running the plugin phases of a request (spec data-plane §1): global rules' and the route's
//! `rewrite` and `access` before proxying (and `before_proxy` when proxying), `header_filter`
//! on the response head of whatever answer ends the request (installing its body filters),
//! and the plugins' side of the log phase, which [`crate::log`] runs once the response is over.
//!
//! Nothing here runs for a request whose route and global rules have no plugins; the request
//! path then costs what it cost before plugins existed.

use std::sync::Arc;

use ferrisix_plugin_api::{
    BodyEdits, BodyError, Exit, Flow, LogCtx, LogVars, Phases, RequestBody, ResponseHead,
    ResponseSource,
};
use ferrisix_plugins::{ConsumerChains, PluginChain, Verdicts};
use http::{HeaderMap, Response};
use http_body::Body as _;

use crate::body::ResponseBody;
use crate::ctx::{plugin_view, ClientHead, RequestCtx};
use crate::log::PendingLog;
use crate::record::tries;
use crate::run::{log_needs, PluginRun};

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
        if flow == Flow::Continue && proxying {
            if global.has(Phases::BEFORE_PROXY) {
                flow = global.before_proxy(&mut view).await;
            }
            if flow == Flow::Continue {
                if let Some(r) = route.as_deref().filter(|r| r.has(Phases::BEFORE_PROXY)) {
                    flow = r.before_proxy(&mut view).await;
                }
            }
        }
    }
    let verdicts = (
        global.verdicts(&view),
        route.as_ref().map_or(Verdicts::ALL, |r| r.verdicts(&view)),
    );
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

/// Each chain's phase is awaited only when one of its plugins implements it: a chain without
/// it would still build and poll a future to find out (~90 instructions a call, and a route
/// with plugins makes six such calls).
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

/// nginx's `$request_length`: request line, headers and body.
pub fn request_length(head: &ClientHead, headers: &HeaderMap) -> u64 {
    request_length_of(&head.method, &head.uri, headers)
}

/// [`request_length`] from the request's own parts (the access log's record takes it before
/// the head is checked).
pub fn request_length_of(method: &http::Method, uri: &http::Uri, headers: &HeaderMap) -> u64 {
    let line = method.as_str().len()
        + uri.path_and_query().map_or(1, |p| p.as_str().len())
        + " HTTP/1.1\r\n".len()
        + 1;
    // One pass: the body's length is the first Content-Length value met (`get`'s answer),
    // without a second, hashed lookup.
    let mut body: Option<&http::HeaderValue> = None;
    let header_bytes: usize = headers
        .iter()
        .map(|(k, v)| {
            if body.is_none() && k == http::header::CONTENT_LENGTH {
                body = Some(v);
            }
            k.as_str().len() + v.len() + 4
        })
        .sum();
    let body: u64 = body
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    (line + header_bytes + 2) as u64 + body
}

/// The response head's size on the wire, as well as it can be known before hyper writes it
/// (it adds `date`, and `content-length` when the body's size is known).
fn head_length<B: http_body::Body>(resp: &Response<B>) -> u64 {
    let mut n = "HTTP/1.1 200 OK\r\n".len() + "date: Mon, 01 Jan 2024 00:00:00 GMT\r\n".len() + 2;
    let mut has_length = false;
    n += resp
        .headers()
        .iter()
        .map(|(k, v)| {
            has_length |= k == http::header::CONTENT_LENGTH;
            k.as_str().len() + v.len() + 4
        })
        .sum::<usize>();
    if !has_length {
        if let Some(len) = resp.body().size_hint().exact() {
            n += "content-length: \r\n".len() + len.to_string().len();
        }
    }
    n as u64
}

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
            let mut view = plugin_view(
                &ctx.head,
                &ctx.conn.facts,
                &mut ctx.headers,
                route_info,
                &mut run.state,
            );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctx::HostName;
    use http::HeaderValue;

    #[test]
    fn request_length_counts_line_headers_and_body() {
        let req = http::Request::builder()
            .method("POST")
            .uri("/a?b=1")
            .header("host", "x")
            .header("content-length", "5")
            .body(())
            .unwrap();
        let (parts, _) = req.into_parts();
        let head = ClientHead {
            method: parts.method,
            uri: parts.uri,
            version: parts.version,
            path: None,
            host: HostName::Absent,
            host_value: None,
        };
        // "POST /a?b=1 HTTP/1.1\r\n" + "host: x\r\n" + "content-length: 5\r\n" + "\r\n" + 5
        assert_eq!(request_length(&head, &parts.headers), 22 + 9 + 19 + 2 + 5);
        // The body is the first Content-Length value, as `get` reads it; no valid one is 0.
        let mut headers = parts.headers.clone();
        headers.append("content-length", HeaderValue::from_static("7"));
        headers.append("x-a", HeaderValue::from_static("1"));
        let n = request_length_of(&head.method, &head.uri, &headers);
        assert_eq!(n, 22 + 9 + 19 + 19 + 8 + 2 + 5);
        headers.insert("content-length", HeaderValue::from_static("x"));
        let n = request_length_of(&head.method, &head.uri, &headers);
        assert_eq!(n, 22 + 9 + 19 + 8 + 2);
    }

    #[test]
    fn head_length_counts_a_content_length_once() {
        let sized = Response::builder()
            .header("content-length", "3")
            .body(ResponseBody::empty())
            .unwrap();
        let base =
            "HTTP/1.1 200 OK\r\n".len() + "date: Mon, 01 Jan 2024 00:00:00 GMT\r\n".len() + 2;
        assert_eq!(
            head_length(&sized),
            (base + "content-length: 3\r\n".len()) as u64
        );
    }
}
