//! Running the plugin phases of a request (spec data-plane §1): global rules' and the route's
//! `rewrite` and `access` before proxying, `header_filter` on the response head, and `log` once
//! the response is over (from the response body's drop, see [`crate::body`]).
//!
//! Nothing here runs for a request whose route and global rules have no plugins; the request
//! path then costs what it cost before plugins existed.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use ferrisix_plugins::{
    union_var_names, Exit, Flow, LogCtx, LogVars, PluginChain, PluginCtx, RequestGuards,
    ResponseHeaders, ResponseSource, VarNames, Verdicts,
};
use ferrisix_router::VarSource;
use http::request::Parts;
use http::{HeaderValue, Response};
use smallvec::SmallVec;

use crate::body::ResponseBody;
use crate::responses;
use crate::snapshot::CompiledRoute;

/// The plugin side of one request, from routing to the log phase.
pub struct PluginRun {
    global: Arc<PluginChain>,
    /// `None` for a request that matched no route (or whose route ends before its plugins).
    route: Option<Arc<PluginChain>>,
    response_headers: ResponseHeaders,
    /// Request-scoped plugin state (limit-conn's in-flight count), dropped after the log
    /// phase, or with this run if the request is abandoned before its response.
    guards: RequestGuards,
    matched_uri: Option<u16>,
    matched_host: Option<u16>,
    /// The gateway answered itself (exit, 404, no upstream).
    own_answer: bool,
    /// `_meta.filter` verdicts for the phases after the response head.
    global_verdicts: Verdicts,
    route_verdicts: Verdicts,
    /// The request variables the log phase asked for, read while the request was at hand;
    /// empty (no allocation) when no plugin asked.
    log_vars: LogVars,
}

/// What the proxy did upstream, for the log phase.
#[derive(Clone, Debug, Default)]
pub struct UpstreamTrace {
    /// The last node tried.
    pub addr: Option<SocketAddr>,
    /// When the first try started.
    pub start: Option<Instant>,
    /// An upstream sent a response head.
    pub responded: bool,
    /// Keep every try's address and status (`$upstream_addr`, `$upstream_status`): set only
    /// when a log-phase plugin reads variables.
    pub detailed: bool,
    pub addrs: SmallVec<[SocketAddr; 2]>,
    pub statuses: SmallVec<[u16; 2]>,
}

/// nginx's list of tries, `a, b`; `None` (unset) without any.
fn tries<T: std::fmt::Display>(items: &[T]) -> Option<String> {
    if items.is_empty() {
        return None;
    }
    use std::fmt::Write as _;
    let mut s = String::new();
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let _ = write!(s, "{item}");
    }
    Some(s)
}

/// Reads the variables the chains' log phases want, if any.
fn capture_vars(
    global: Option<&VarNames>,
    route: Option<&VarNames>,
    ctx: &PluginCtx<'_>,
) -> LogVars {
    match union_var_names(global, route) {
        Some(names) => LogVars::capture(names, ctx),
        None => LogVars::default(),
    }
}

/// The answer for a plugin's exit.
pub fn exit_response(exit: Exit, server: &HeaderValue) -> Response<ResponseBody> {
    match exit.body {
        Some(body) => responses::text_response(exit.status, body, server),
        None => responses::error_page(exit.status, server),
    }
}

async fn run_request_phases(
    global: &PluginChain,
    route: Option<&PluginChain>,
    ctx: &mut PluginCtx<'_>,
) -> Flow {
    // 3.17+: global rewrite, route rewrite, global access, route access.
    if let Flow::Exit(e) = global.rewrite(ctx).await {
        return Flow::Exit(e);
    }
    if let Some(r) = route {
        if let Flow::Exit(e) = r.rewrite(ctx).await {
            return Flow::Exit(e);
        }
    }
    if let Flow::Exit(e) = global.access(ctx).await {
        return Flow::Exit(e);
    }
    if let Some(r) = route {
        if let Flow::Exit(e) = r.access(ctx).await {
            return Flow::Exit(e);
        }
    }
    Flow::Continue
}

/// Global rules for a request that matched no route: `rewrite` and `access` run before the
/// 404 (and may answer instead).
pub async fn unmatched(
    global: Arc<PluginChain>,
    parts: &Parts,
    path: &str,
    remote_addr: IpAddr,
    vars: &(dyn VarSource + Sync),
) -> (PluginRun, Option<Exit>) {
    let mut ctx = PluginCtx::new(&parts.method, path, &parts.headers, remote_addr, vars);
    let flow = run_request_phases(&global, None, &mut ctx).await;
    let run = PluginRun {
        log_vars: capture_vars(global.log_vars(), None, &ctx),
        global_verdicts: global.verdicts(&ctx),
        route_verdicts: Verdicts::ALL,
        global,
        route: None,
        response_headers: ctx.response_headers,
        guards: ctx.guards,
        matched_uri: None,
        matched_host: None,
        own_answer: true,
    };
    match flow {
        Flow::Exit(e) => (run, Some(e)),
        Flow::Continue => (run, None),
    }
}

/// The plugins of a matched route.
#[allow(clippy::too_many_arguments)]
pub async fn matched(
    route: &Arc<CompiledRoute>,
    matched_uri: &str,
    matched_host: Option<&str>,
    proxying: bool,
    parts: &Parts,
    path: &str,
    remote_addr: IpAddr,
    vars: &(dyn VarSource + Sync),
) -> (PluginRun, Option<Exit>) {
    let info = &route.info;
    let uri_idx = info.uri_index(matched_uri);
    let host_idx = matched_host.and_then(|h| info.host_index(h));
    let mut ctx = PluginCtx::new(&parts.method, path, &parts.headers, remote_addr, vars);
    ctx.route = Some(info);
    ctx.matched_uri = uri_idx.map_or("", |i| info.uris[i].as_str());
    ctx.matched_host = host_idx.map_or("", |i| info.hosts[i].as_str());
    let mut flow = Flow::Continue;
    if route.plugins_run {
        flow = run_request_phases(&route.global_chain, Some(&route.chain), &mut ctx).await;
        if flow == Flow::Continue && proxying {
            flow = route.global_chain.before_proxy(&mut ctx).await;
            if flow == Flow::Continue {
                flow = route.chain.before_proxy(&mut ctx).await;
            }
        }
    }
    let run = PluginRun {
        log_vars: capture_vars(
            route.global_chain.log_vars(),
            route.chain.log_vars().filter(|_| route.plugins_run),
            &ctx,
        ),
        global_verdicts: route.global_chain.verdicts(&ctx),
        route_verdicts: route.chain.verdicts(&ctx),
        global: route.global_chain.clone(),
        route: route.plugins_run.then(|| route.chain.clone()),
        response_headers: ctx.response_headers,
        guards: ctx.guards,
        matched_uri: uri_idx.map(|i| i as u16),
        matched_host: host_idx.map(|i| i as u16),
        own_answer: !proxying,
    };
    match flow {
        Flow::Exit(e) => (
            PluginRun {
                own_answer: true,
                ..run
            },
            Some(e),
        ),
        Flow::Continue => (run, None),
    }
}

/// nginx's `$request_length`: request line, headers and body.
pub fn request_length(parts: &Parts) -> u64 {
    let line = parts.method.as_str().len()
        + parts.uri.path_and_query().map_or(1, |p| p.as_str().len())
        + " HTTP/1.1\r\n".len()
        + 1;
    let headers: usize = parts
        .headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    let body: u64 = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    (line + headers + 2) as u64 + body
}

/// The response head's size on the wire, as well as it can be known before hyper writes it
/// (it adds `date`, and `content-length` when the body's size is known).
fn head_length<B: http_body::Body>(resp: &Response<B>) -> u64 {
    let mut n = "HTTP/1.1 200 OK\r\n".len() + "date: Mon, 01 Jan 2024 00:00:00 GMT\r\n".len() + 2;
    n += resp
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum::<usize>();
    if !resp.headers().contains_key(http::header::CONTENT_LENGTH) {
        if let Some(len) = resp.body().size_hint().exact() {
            n += "content-length: \r\n".len() + len.to_string().len();
        }
    }
    n as u64
}

impl PluginRun {
    /// Whether the log phase reads variables, so the proxy should keep every upstream try.
    pub fn wants_upstream_detail(&self) -> bool {
        !self.log_vars.is_empty()
    }

    /// Applies what the plugins set on the response, runs `header_filter`, and hands the log
    /// phase to the response body, which runs it when the response is over.
    pub fn finish(
        mut self,
        resp: &mut Response<ResponseBody>,
        start: Instant,
        request_length: u64,
        trace: &UpstreamTrace,
    ) {
        std::mem::take(&mut self.response_headers).apply(resp.headers_mut());
        let status = resp.status();
        self.global
            .header_filter(status, resp.headers_mut(), self.global_verdicts);
        if let Some(r) = &self.route {
            r.header_filter(status, resp.headers_mut(), self.route_verdicts);
        }
        let has_log = self.global.has(ferrisix_plugins::Phases::LOG)
            || self
                .route
                .as_ref()
                .is_some_and(|r| r.has(ferrisix_plugins::Phases::LOG));
        if !has_log && self.guards.is_empty() {
            return;
        }
        let proxied = trace.start.is_some() && !self.own_answer;
        let mut vars = std::mem::take(&mut self.log_vars);
        if !vars.is_empty() {
            vars.set("upstream_addr", || tries(&trace.addrs));
            vars.set("upstream_status", || tries(&trace.statuses));
        }
        let ctx = LogCtx {
            status: status.as_u16(),
            matched_uri: self.matched_uri,
            matched_host: self.matched_host,
            node: if proxied {
                trace.addr.map(|a| a.ip())
            } else {
                None
            },
            request_length,
            bytes_sent: head_length(resp),
            request_time: Default::default(),
            upstream_time: None,
            response_source: if !proxied {
                ResponseSource::Apisix
            } else if trace.responded {
                ResponseSource::Upstream
            } else {
                ResponseSource::Nginx
            },
            vars,
        };
        resp.body_mut().set_plugin_log(Box::new(PendingLog {
            global: self.global,
            route: self.route,
            verdicts: (self.global_verdicts, self.route_verdicts),
            _guards: self.guards,
            ctx,
            start,
            upstream_start: if proxied { trace.start } else { None },
        }));
    }
}

/// The log phase, waiting for the response to end.
pub struct PendingLog {
    global: Arc<PluginChain>,
    route: Option<Arc<PluginChain>>,
    verdicts: (Verdicts, Verdicts),
    /// Dropped with this (after [`PendingLog::run`]): limit-conn decrements here.
    _guards: RequestGuards,
    ctx: LogCtx,
    start: Instant,
    upstream_start: Option<Instant>,
}

impl PendingLog {
    /// Runs the log phase: global rules first, then the route's plugins.
    pub fn run(&mut self, body_bytes: u64) {
        self.ctx.bytes_sent += body_bytes;
        self.ctx.request_time = self.start.elapsed();
        self.ctx.upstream_time = self.upstream_start.map(|s| s.elapsed());
        self.global.log(&self.ctx, self.verdicts.0);
        if let Some(r) = &self.route {
            r.log(&self.ctx, self.verdicts.1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // "POST /a?b=1 HTTP/1.1\r\n" + "host: x\r\n" + "content-length: 5\r\n" + "\r\n" + 5
        assert_eq!(request_length(&parts), 22 + 9 + 19 + 2 + 5);
    }

    #[test]
    fn tries_are_listed_as_nginx_does() {
        let addrs: [SocketAddr; 2] = [
            "127.0.0.1:1980".parse().unwrap(),
            "[::1]:81".parse().unwrap(),
        ];
        assert_eq!(tries(&addrs).as_deref(), Some("127.0.0.1:1980, [::1]:81"));
        assert_eq!(tries(&[502u16, 200]).as_deref(), Some("502, 200"));
        assert_eq!(tries::<u16>(&[]), None);
    }
}
