//! The request path: normalise, route, pick a node, proxy with retries, relay the answer.
//!
//! It reads only the published snapshot (one atomic load), so it never waits on configuration
//! changes, and it allocates only what the upstream request itself needs.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use ferrisix_config::model::PassHost;
use ferrisix_router::{normalize_path, Method as RouteMethod, RequestInfo};
use http::header::{self, HeaderName, HeaderValue};
use http::request::Parts;
use http::{HeaderMap, Method, Request, Response, StatusCode, Version};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use ipnet::IpNet;
use smallvec::SmallVec;

use crate::access_log::{AccessLog, LogRecord};
use crate::balancer::PickState;
use crate::body::{ResponseBody, UpstreamResponse};
use crate::client::{self, PoolKey, SendOutcome, TryTimeouts, UpstreamBody};
use crate::error::{may_retry, UpstreamFailure};
use crate::phases::{self, PluginRun, UpstreamTrace};
use crate::responses;
use crate::snapshot::{CompiledRoute, CompiledUpstream, RouteTarget, SnapshotHandle};
use crate::upstream::HealthView;
use crate::vars::RequestVars;
use crate::websocket;

/// Bodies up to this size (with a known length) are read before proxying so that a failed
/// try can be replayed; larger ones stream.
const BUFFERED_BODY_LIMIT: u64 = 64 * 1024;
/// nginx's `large_client_header_buffers 4 8k`: a longer request line is refused with 414.
const MAX_REQUEST_URI: usize = 8192;

/// `real_ip_header`, `real_ip_from`, `real_ip_recursive`.
#[derive(Clone, Debug)]
pub struct RealIpConfig {
    pub header: HeaderName,
    pub trusted: Vec<IpNet>,
    pub recursive: bool,
}

impl RealIpConfig {
    fn trusts(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(&ip))
    }

    /// nginx's realip module: a trusted peer may name the client in the configured header.
    pub fn client_addr(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.trusts(peer) {
            return peer;
        }
        let Some(value) = headers.get(&self.header).and_then(|v| v.to_str().ok()) else {
            return peer;
        };
        let mut candidates = value.rsplit(',').map(str::trim);
        if !self.recursive {
            // Without recursion nginx takes the last address of the header.
            return candidates
                .next()
                .and_then(|a| a.parse().ok())
                .unwrap_or(peer);
        }
        let mut found = peer;
        for c in candidates {
            match c.parse::<IpAddr>() {
                Ok(ip) => {
                    found = ip;
                    if !self.trusts(ip) {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        found
    }
}

/// Everything the request path needs besides the snapshot.
pub struct Gateway {
    pub snapshot: SnapshotHandle,
    pub server_header: HeaderValue,
    pub real_ip: RealIpConfig,
    pub show_upstream_status: bool,
    pub access_log: Arc<AccessLog>,
    /// APISIX 2.x compatibility: `/apisix/admin` on the data port, for loopback clients only.
    pub legacy_admin: Option<LegacyAdmin>,
}

/// Answers `/apisix/admin/...` requests that arrive on the data port (APISIX 2.x served its
/// Admin API there). The binary plugs the Admin API in; the data plane only forwards to it.
pub type LegacyAdmin = Arc<
    dyn Fn(
            Request<Incoming>,
            IpAddr,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = Response<ResponseBody>> + Send>>
        + Send
        + Sync,
>;

/// The connection a request arrived on, with the header values every request on it sends
/// upstream, built once per connection rather than once per request.
#[derive(Clone, Debug)]
pub struct ConnInfo {
    pub peer: SocketAddr,
    pub local: SocketAddr,
    /// The peer's IP (`X-Real-IP`, `X-Forwarded-For` when the realip rewrite kept it).
    peer_ip_value: HeaderValue,
    /// The local port (`X-Forwarded-Port` when the Host header names no other).
    local_port_value: HeaderValue,
}

impl ConnInfo {
    pub fn new(peer: SocketAddr, local: SocketAddr) -> ConnInfo {
        ConnInfo {
            peer,
            local,
            peer_ip_value: ip_header(peer.ip()),
            local_port_value: HeaderValue::from(local.port()),
        }
    }
}

/// Headers nginx never forwards upstream (hop-by-hop, and what it recomputes).
fn is_dropped_request_header(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "expect"
            | "content-length"
            | "host"
            | "x-real-ip"
            | "x-forwarded-for"
            | "x-forwarded-proto"
            | "x-forwarded-host"
            | "x-forwarded-port"
            | "forwarded"
    )
}

fn is_dropped_response_header(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
    )
}

/// The host part of a Host header value, lower-cased, without the port; `None` if invalid.
fn host_without_port(raw: &str) -> Option<std::borrow::Cow<'_, str>> {
    let host = if raw.starts_with('[') {
        let end = raw.find(']')?;
        let rest = &raw[end + 1..];
        if !(rest.is_empty()
            || rest
                .strip_prefix(':')
                .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit())))
        {
            return None;
        }
        &raw[..=end]
    } else {
        match raw.rsplit_once(':') {
            Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
            Some(_) => return None,
            None => raw,
        }
    };
    // nginx refuses hosts with characters outside this set (and `..`, or a leading dot path).
    let valid = host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'[' | b']' | b':'))
        && !host.contains("..");
    if !valid {
        return None;
    }
    let host = host.trim_end_matches('.');
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Some(std::borrow::Cow::Owned(host.to_ascii_lowercase()))
    } else {
        Some(std::borrow::Cow::Borrowed(host))
    }
}

fn port_of_host(raw: &str) -> Option<&str> {
    let after = if raw.starts_with('[') {
        &raw[raw.find(']')? + 1..]
    } else {
        raw
    };
    after
        .rsplit_once(':')
        .map(|(_, p)| p)
        .filter(|p| !p.is_empty())
}

impl Gateway {
    pub async fn handle(&self, req: Request<Incoming>, conn: &ConnInfo) -> Response<ResponseBody> {
        if let Some(admin) = &self.legacy_admin {
            // Loopback only: this is a compatibility switch for local scripts, not an exposure
            // of the Admin API on the public port.
            if conn.peer.ip().is_loopback() && req.uri().path().starts_with("/apisix/admin") {
                return admin(req, conn.peer.ip()).await;
            }
        }
        let started = Instant::now();
        let started_wall = SystemTime::now();
        let (mut parts, body) = req.into_parts();
        let remote_addr = self.real_ip.client_addr(conn.peer.ip(), &parts.headers);
        let mut record = self.access_log.enabled().then(|| {
            Box::new(LogRecord {
                log: self.access_log.clone(),
                start: started,
                start_wall: started_wall,
                remote_addr,
                server_port: conn.local.port(),
                method: parts.method.clone(),
                uri: parts.uri.clone(),
                version: parts.version,
                headers: self
                    .access_log
                    .captured_headers()
                    .iter()
                    .map(|h| parts.headers.get(h).cloned())
                    .collect(),
                status: 0,
                request_length: 0,
                body_bytes_sent: 0,
                route_id: None,
                upstream_addrs: SmallVec::new(),
                upstream_statuses: SmallVec::new(),
                upstream_start: None,
                upstream_host: None,
            })
        });
        let stats = ferrisix_plugins::prometheus::node::conn_stats();
        stats.request_started();
        let mut plugins: Option<PluginRun> = None;
        let mut trace = UpstreamTrace::default();
        let mut resp = self
            .route_and_proxy(
                &mut parts,
                body,
                conn,
                remote_addr,
                record.as_deref_mut(),
                &mut plugins,
                &mut trace,
            )
            .await;
        resp.body_mut().count_request();
        if let Some(run) = plugins {
            run.finish(&mut resp, started, phases::request_length(&parts), &trace);
        }
        if let Some(mut record) = record {
            record.status = resp.status().as_u16();
            resp.body_mut().set_log(record);
        }
        resp
    }

    #[allow(clippy::too_many_arguments)]
    async fn route_and_proxy(
        &self,
        parts: &mut Parts,
        body: Incoming,
        conn: &ConnInfo,
        remote_addr: IpAddr,
        mut record: Option<&mut LogRecord>,
        plugins: &mut Option<PluginRun>,
        trace: &mut UpstreamTrace,
    ) -> Response<ResponseBody> {
        let server = &self.server_header;
        let raw_uri_len = parts.uri.path_and_query().map_or(0, |p| p.as_str().len());
        if raw_uri_len > MAX_REQUEST_URI {
            return responses::error_page(StatusCode::URI_TOO_LONG, server);
        }
        // HTTP/2 carries the host in :authority; an absolute-form request line overrides Host.
        let host_raw: Option<&str> = match parts.uri.authority() {
            Some(a) => Some(a.as_str()),
            None => match parts.headers.get(header::HOST) {
                Some(h) => match h.to_str() {
                    Ok(s) => Some(s),
                    Err(_) => return responses::error_page(StatusCode::BAD_REQUEST, server),
                },
                None => None,
            },
        };
        if host_raw.is_none() && parts.version == Version::HTTP_11 {
            // nginx: "client sent HTTP/1.1 request without "Host" header".
            return responses::error_page(StatusCode::BAD_REQUEST, server);
        }
        let host = match host_raw {
            Some(raw) if !raw.is_empty() => match host_without_port(raw) {
                Some(h) => Some(h),
                None => return responses::error_page(StatusCode::BAD_REQUEST, server),
            },
            _ => None,
        };
        let Some(path) = normalize_path(parts.uri.path()) else {
            return responses::error_page(StatusCode::BAD_REQUEST, server);
        };

        let snapshot = self.snapshot.load();
        let vars = RequestVars {
            parts,
            uri: &path,
            host: host.as_deref(),
            remote_addr,
            peer: conn.peer,
            local: conn.local,
        };
        let info = RequestInfo {
            path: &path,
            host: host.as_deref(),
            host_header: host_raw,
            method: RouteMethod::from_bytes(parts.method.as_str().as_bytes()),
            remote_addr,
        };
        let Some(matched) = snapshot.router.lookup(&info, &vars) else {
            let global = snapshot.global_chain.clone();
            drop(snapshot);
            if !global.is_empty() {
                // Global rules run for unmatched requests too, and may answer instead of the 404.
                let (run, exit) = phases::unmatched(global, parts, &path, remote_addr, &vars).await;
                *plugins = Some(run);
                if let Some(exit) = exit {
                    return phases::exit_response(exit, server);
                }
            }
            return responses::route_not_found(server);
        };
        let route: &CompiledRoute = matched.value;
        if let Some(r) = record.as_deref_mut() {
            r.route_id = Some(route.log_id.clone());
        }
        let target = route.target.clone();
        let route_timeouts = route.timeout;
        let websocket = route.enable_websocket && is_upgrade(&parts.headers);
        // The route outlives the snapshot guard while its plugins may wait on I/O.
        let with_plugins = (!route.chain.is_empty() || !route.global_chain.is_empty()).then(|| {
            (
                matched.value.clone(),
                matched.matched_uri.to_owned(),
                matched.matched_host.map(str::to_owned),
            )
        });
        drop(snapshot);
        if let Some((route, matched_uri, matched_host)) = with_plugins {
            let proxying = matches!(target, RouteTarget::Upstream(_));
            let (run, exit) = phases::matched(
                &route,
                &matched_uri,
                matched_host.as_deref(),
                proxying,
                parts,
                &path,
                remote_addr,
                &vars,
            )
            .await;
            trace.detailed = run.wants_upstream_detail();
            *plugins = Some(run);
            if let Some(exit) = exit {
                return phases::exit_response(exit, server);
            }
        }
        let upstream = match target {
            RouteTarget::Upstream(u) => u,
            RouteTarget::Fail(status) => return responses::error_page(status, server),
        };
        // chash's key (`fetch_chash_hash_key`), read before the request parts move on. No
        // consumer is known to the proxy yet, so `hash_on: consumer` falls back to
        // `remote_addr` as APISIX does for an anonymous request.
        let hash_key = upstream.hash_on.as_ref().map(|h| {
            let var = |n: &str| {
                ferrisix_router::VarSource::var(&vars, n).map(|v| Cow::Owned(v.into_owned()))
            };
            h.key(&var, None).into_owned()
        });
        // `$http_host` as a header value: the client's own when it sent a Host header (sharing
        // its bytes costs no copy), else built from :authority or an absolute-form URI.
        let host_value = match parts.uri.authority() {
            None => parts.headers.get(header::HOST).cloned(),
            Some(a) => HeaderValue::from_str(a.as_str()).ok(),
        };
        self.proxy(
            parts,
            body,
            conn,
            remote_addr,
            host_value,
            &upstream,
            hash_key,
            route_timeouts,
            websocket,
            record,
            trace,
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn proxy(
        &self,
        parts: &mut Parts,
        body: Incoming,
        conn: &ConnInfo,
        remote_addr: IpAddr,
        host_value: Option<HeaderValue>,
        upstream: &CompiledUpstream,
        hash_key: Option<String>,
        route_timeouts: Option<TryTimeouts>,
        websocket: bool,
        mut record: Option<&mut LogRecord>,
        trace: &mut UpstreamTrace,
    ) -> Response<ResponseBody> {
        let server = &self.server_header;
        let timeouts = route_timeouts.unwrap_or(upstream.timeouts);
        let idempotent = !matches!(parts.method, Method::POST | Method::PATCH)
            && parts.method.as_str() != "LOCK";

        // Request body: buffer small known-length bodies (replayable), stream the rest.
        let mut pending_body = if body.is_end_stream() {
            Some(UpstreamBody::Empty)
        } else {
            match body.size_hint().exact() {
                Some(n) if n <= BUFFERED_BODY_LIMIT => {
                    match tokio::time::timeout(std::time::Duration::from_secs(60), body.collect())
                        .await
                    {
                        Ok(Ok(collected)) => Some(UpstreamBody::full(collected.to_bytes())),
                        // The client went away or stalled (nginx logs 400/408).
                        Ok(Err(_)) => {
                            return responses::error_page(StatusCode::BAD_REQUEST, server)
                        }
                        Err(_) => {
                            return responses::error_page(StatusCode::REQUEST_TIMEOUT, server)
                        }
                    }
                }
                Some(_) => Some(UpstreamBody::stream(body)),
                // Unknown length (chunked): nginx reads the whole body and sends it with
                // Content-Length. Do the same up to the buffering limit; past it, stream what
                // was read followed by the rest, so a huge upload never sits in memory.
                None => match read_up_to(body, BUFFERED_BODY_LIMIT as usize).await {
                    Ok(b) => Some(b),
                    Err(status) => return responses::error_page(status, server),
                },
            }
        };
        let replayable = pending_body
            .as_ref()
            .is_some_and(UpstreamBody::is_replayable);
        if let Some(r) = record.as_deref_mut() {
            r.request_length = parts
                .headers
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(0);
        }

        let upgrade = if websocket {
            parts.extensions.remove::<hyper::upgrade::OnUpgrade>()
        } else {
            None
        };
        let mut headers =
            Some(self.upstream_headers(parts, remote_addr, host_value.as_ref(), conn, websocket));

        let mut tried: SmallVec<[usize; 4]> = SmallVec::new();
        let mut statuses: SmallVec<[u16; 2]> = SmallVec::new();
        let mut last_failure = UpstreamFailure::ConnectRefused;
        let first_try = Instant::now();
        // The upstream gets the client's raw path and query. An origin-form URI is exactly
        // that (cloning it copies a pointer); an absolute-form one loses its scheme and host.
        let uri: http::Uri = if parts.uri.scheme().is_none() && parts.uri.authority().is_none() {
            parts.uri.clone()
        } else {
            parts
                .uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .parse()
                .unwrap_or_else(|_| http::Uri::from_static("/"))
        };
        if let Some(r) = record.as_deref_mut() {
            r.upstream_start = Some(first_try);
        }
        trace.start = Some(first_try);

        // Set when APISIX's balancer phase would end a retry itself with `core.response.exit(502)`
        // (spec data-plane §3.5): `retry_timeout` passed, or no untried node is left while the
        // try budget is not spent. The answer is then 502, not the last try's status (a 504
        // after timeouts).
        let mut balancer_refused = false;
        // The node set as resolved now; a name whose first lookup is under way is awaited (on
        // the resolver's tasks, the worker only waits) up to the connect timeout.
        let set = upstream.nodes.ready(timeouts.connect).await;
        if set.nodes.is_empty() {
            // APISIX: "no valid upstream node".
            return responses::error_page(StatusCode::SERVICE_UNAVAILABLE, server);
        }
        let max_tries = upstream.max_tries(&set);
        let mut pick = PickState::new(Cow::Owned(hash_key.unwrap_or_default()));
        let mut health = HealthView::default();
        // The node of the last failed try, reported to the health checker once we know whether
        // another try follows (APISIX reports it from the balancer, before the retry).
        let mut failed_on: Option<usize> = None;
        while tried.len() < max_tries {
            if let Some(limit) = upstream.retry_timeout {
                if !tried.is_empty() && first_try.elapsed() > limit {
                    balancer_refused = true;
                    break;
                }
            }
            if let Some(prev) = failed_on.take() {
                set.report_retry(prev, last_failure);
            }
            let Some(node_idx) = set.pick(&mut pick, &tried, &mut health) else {
                balancer_refused = !tried.is_empty();
                break;
            };
            tried.push(node_idx);
            let node = &set.nodes[node_idx];
            let addr = node.addr;
            if let Some(r) = record.as_deref_mut() {
                r.upstream_addrs.push(addr);
            }
            trace.addr = Some(addr);
            if trace.detailed {
                trace.addrs.push(addr);
            }
            let more_tries_left = tried.len() < max_tries;
            let mut req_headers = match headers.take() {
                Some(h) => h,
                None => break,
            };
            let upstream_host = match upstream.pass_host {
                // `$http_host` verbatim (port and case kept); HTTP/2 takes :authority.
                PassHost::Pass => host_value.clone(),
                PassHost::Node => Some(node.host_header.clone()),
                PassHost::Rewrite => upstream.upstream_host.clone(),
            };
            match &upstream_host {
                Some(h) => {
                    req_headers.insert(header::HOST, h.clone());
                }
                None => {
                    req_headers.remove(header::HOST);
                }
            }
            if let Some(r) = record.as_deref_mut() {
                r.upstream_host = upstream_host;
            }
            // Keep a copy when a failed try could still be replayed on another node.
            let spare = (more_tries_left && replayable).then(|| req_headers.clone());
            let Some(req_body) = pending_body.take() else {
                break;
            };
            let spare_body = if more_tries_left {
                req_body.try_clone()
            } else {
                None
            };

            let key = PoolKey {
                addr,
                epoch: set.down_epoch(node_idx),
            };
            let mut try_guard = set.picker.begin(node_idx);
            let mut attempt = Some(build_request(&parts.method, &uri, req_headers, req_body));
            let mut fresh_retry_used = false;
            let outcome = loop {
                let mut conn = match client::checkout(key, upstream.pool, timeouts.connect).await {
                    Ok(c) => c,
                    Err(f) => break Err((f, attempt.take())),
                };
                let reused = conn.is_reused();
                let Some(req) = attempt.take() else {
                    break Err((UpstreamFailure::ConnectionBroken, None));
                };
                match client::send(&mut conn, req, timeouts).await {
                    SendOutcome::Response(resp) => break Ok((resp, conn)),
                    SendOutcome::NotSent(req, f) => {
                        // A stale keep-alive connection: open a fresh one to the same node,
                        // without spending a try, as the request never left.
                        if reused && !fresh_retry_used {
                            fresh_retry_used = true;
                            attempt = Some(req);
                            continue;
                        }
                        break Err((f, Some(req)));
                    }
                    SendOutcome::Failed(f) => break Err((f, None)),
                }
            };
            match outcome {
                Ok((mut resp, conn)) => {
                    trace.responded = true;
                    let status = resp.status();
                    statuses.push(status.as_u16());
                    try_guard.answered();
                    set.report_final(node_idx, status.as_u16());
                    if let Some(r) = record.as_deref_mut() {
                        r.upstream_statuses = statuses.clone();
                    }
                    if trace.detailed {
                        trace.statuses = statuses.clone();
                    }
                    if status == StatusCode::SWITCHING_PROTOCOLS {
                        if let Some(client_upgrade) = upgrade {
                            let upstream_upgrade = hyper::upgrade::on(&mut resp);
                            // The tunnel holds the try: least_conn counts it while it is open.
                            websocket::tunnel(client_upgrade, upstream_upgrade, try_guard);
                        }
                        drop(conn);
                        return self.relay_head(resp, None, &statuses, timeouts, true);
                    }
                    let mut out = self.relay_head(resp, Some(conn), &statuses, timeouts, false);
                    out.body_mut().hold_try(try_guard);
                    return out;
                }
                Err((failure, returned)) => {
                    tracing::warn!(upstream = %addr, "{failure} while proxying");
                    drop(try_guard);
                    statuses.push(failure.status().as_u16());
                    last_failure = failure;
                    failed_on = Some(node_idx);
                    // Recover what the next try needs.
                    match returned {
                        Some(req) => {
                            let (p, b) = req.into_parts();
                            headers = Some(p.headers);
                            pending_body = Some(b);
                        }
                        None => {
                            headers = spare;
                            pending_body = spare_body;
                            if !may_retry(failure, idempotent, replayable) {
                                break;
                            }
                        }
                    }
                    if headers.is_none() || pending_body.is_none() {
                        break;
                    }
                }
            }
        }
        if let Some(r) = record {
            r.upstream_statuses = statuses.clone();
        }
        if trace.detailed {
            trace.statuses = statuses.clone();
        }
        let status = if statuses.is_empty() || balancer_refused {
            StatusCode::BAD_GATEWAY
        } else {
            last_failure.status()
        };
        // The log phase's passive check sees the status the client gets, on the last node.
        if let Some(last) = tried.last() {
            set.report_final(*last, status.as_u16());
        }
        let mut resp = responses::error_page(status, server);
        if !statuses.is_empty() {
            resp.headers_mut().insert(
                HeaderName::from_static("x-apisix-upstream-status"),
                status_list(&statuses),
            );
        }
        resp
    }

    /// Turns the upstream's response head into ours.
    fn relay_head(
        &self,
        resp: Response<Incoming>,
        conn: Option<client::PooledConn>,
        statuses: &[u16],
        timeouts: TryTimeouts,
        upgrade: bool,
    ) -> Response<ResponseBody> {
        let (mut head, body) = resp.into_parts();
        if !upgrade {
            let dropped: SmallVec<[HeaderName; 4]> = head
                .headers
                .keys()
                .filter(|k| is_dropped_response_header(k))
                .cloned()
                .collect();
            for k in dropped {
                head.headers.remove(&k);
            }
        }
        head.headers
            .insert(header::SERVER, self.server_header.clone());
        let last = statuses.last().copied().unwrap_or(0);
        if self.show_upstream_status || (500..600).contains(&last) {
            head.headers.insert(
                HeaderName::from_static("x-apisix-upstream-status"),
                status_list(statuses),
            );
        }
        let body = if upgrade {
            ResponseBody::empty()
        } else {
            ResponseBody::upstream(UpstreamResponse::new(body, conn, timeouts.read))
        };
        Response::from_parts(head, body)
    }

    /// The headers sent upstream (spec data-plane §3.2), Host excepted (set per try).
    fn upstream_headers(
        &self,
        parts: &Parts,
        remote_addr: IpAddr,
        host_value: Option<&HeaderValue>,
        conn: &ConnInfo,
        websocket: bool,
    ) -> HeaderMap {
        let mut out = HeaderMap::with_capacity(parts.headers.len() + 6);
        for (name, value) in &parts.headers {
            if !is_dropped_request_header(name) {
                out.append(name.clone(), value.clone());
            }
        }
        if websocket {
            for h in [header::UPGRADE, header::CONNECTION] {
                if let Some(v) = parts.headers.get(&h) {
                    out.insert(h, v.clone());
                }
            }
        }
        let remote = if remote_addr == conn.peer.ip() {
            conn.peer_ip_value.clone()
        } else {
            ip_header(remote_addr)
        };
        out.insert(HeaderName::from_static("x-real-ip"), remote.clone());
        let xff = match parts
            .headers
            .get(HeaderName::from_static("x-forwarded-for"))
        {
            Some(prev) => {
                let mut v = Vec::with_capacity(prev.len() + 2 + 39);
                v.extend_from_slice(prev.as_bytes());
                v.extend_from_slice(b", ");
                v.extend_from_slice(remote.as_bytes());
                HeaderValue::from_bytes(&v).unwrap_or(remote)
            }
            None => remote,
        };
        out.insert(HeaderName::from_static("x-forwarded-for"), xff);
        out.insert(
            HeaderName::from_static("x-forwarded-proto"),
            HeaderValue::from_static("http"),
        );
        let host_raw = host_value.and_then(|h| h.to_str().ok());
        if let Some(h) = host_value {
            out.insert(HeaderName::from_static("x-forwarded-host"), h.clone());
        }
        let port = match host_raw.and_then(port_of_host) {
            Some(p) if p.as_bytes() != conn.local_port_value.as_bytes() => {
                HeaderValue::from_str(p).unwrap_or_else(|_| conn.local_port_value.clone())
            }
            _ => conn.local_port_value.clone(),
        };
        out.insert(HeaderName::from_static("x-forwarded-port"), port);
        out
    }
}

fn ip_header(ip: IpAddr) -> HeaderValue {
    let mut buf = [0u8; 48];
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    let _ = std::io::Write::write_fmt(&mut cursor, format_args!("{ip}"));
    let n = cursor.position() as usize;
    HeaderValue::from_bytes(&buf[..n]).unwrap_or_else(|_| HeaderValue::from_static("-"))
}

fn status_list(statuses: &[u16]) -> HeaderValue {
    let mut s = String::with_capacity(statuses.len() * 5);
    for (i, st) in statuses.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        s.push_str(&st.to_string());
    }
    HeaderValue::from_str(&s).unwrap_or_else(|_| HeaderValue::from_static("502"))
}

fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
}

/// Reads a body of unknown length until it ends (a complete, replayable body) or passes
/// `limit` bytes (a stream that first sends what was read).
async fn read_up_to(mut body: Incoming, limit: usize) -> Result<UpstreamBody, StatusCode> {
    let mut buf = bytes::BytesMut::new();
    loop {
        match tokio::time::timeout(std::time::Duration::from_secs(60), body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                    if buf.len() > limit {
                        return Ok(UpstreamBody::stream_after(Some(buf.freeze()), body));
                    }
                }
            }
            Ok(None) => return Ok(UpstreamBody::full(buf.freeze())),
            // The client went away mid-body (nginx: 400) or stalled (408).
            Ok(Some(Err(_))) => return Err(StatusCode::BAD_REQUEST),
            Err(_) => return Err(StatusCode::REQUEST_TIMEOUT),
        }
    }
}

fn build_request(
    method: &Method,
    uri: &http::Uri,
    headers: HeaderMap,
    body: UpstreamBody,
) -> Request<UpstreamBody> {
    let mut req = Request::new(body);
    *req.method_mut() = method.clone();
    *req.uri_mut() = uri.clone();
    *req.version_mut() = Version::HTTP_11;
    *req.headers_mut() = headers;
    req
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_parsing() {
        assert_eq!(
            host_without_port("Foo.COM:8080").as_deref(),
            Some("foo.com")
        );
        assert_eq!(host_without_port("[::1]:80").as_deref(), Some("[::1]"));
        assert_eq!(host_without_port("a.com").as_deref(), Some("a.com"));
        assert_eq!(host_without_port("bad host"), None);
        assert_eq!(host_without_port("a/b"), None);
        assert_eq!(host_without_port("a.com:x"), None);
        assert_eq!(port_of_host("a.com:8080"), Some("8080"));
        assert_eq!(port_of_host("a.com"), None);
        assert_eq!(port_of_host("[::1]:81"), Some("81"));
    }

    #[test]
    fn real_ip_from_trusted_peer_only() {
        let cfg = RealIpConfig {
            header: HeaderName::from_static("x-real-ip"),
            trusted: vec!["127.0.0.1/32".parse().unwrap()],
            recursive: false,
        };
        let mut h = HeaderMap::new();
        h.insert("x-real-ip", HeaderValue::from_static("10.1.1.1"));
        assert_eq!(
            cfg.client_addr("127.0.0.1".parse().unwrap(), &h),
            "10.1.1.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            cfg.client_addr("127.0.0.2".parse().unwrap(), &h),
            "127.0.0.2".parse::<IpAddr>().unwrap()
        );
        h.insert("x-real-ip", HeaderValue::from_static("garbage"));
        assert_eq!(
            cfg.client_addr("127.0.0.1".parse().unwrap(), &h),
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn recursive_xff_skips_trusted_hops() {
        let cfg = RealIpConfig {
            header: HeaderName::from_static("x-forwarded-for"),
            trusted: vec![
                "127.0.0.0/8".parse().unwrap(),
                "10.0.0.0/8".parse().unwrap(),
            ],
            recursive: true,
        };
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            HeaderValue::from_static("1.2.3.4, 10.0.0.2, 127.0.0.5"),
        );
        assert_eq!(
            cfg.client_addr("127.0.0.1".parse().unwrap(), &h),
            "1.2.3.4".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn status_lists() {
        assert_eq!(status_list(&[502, 504]), "502, 504");
        assert_eq!(status_list(&[502]), "502");
    }
}
