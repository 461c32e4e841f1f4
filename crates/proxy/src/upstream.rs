//! Sending the request upstream: the body made ready (buffered when small enough to be
//! replayed, streamed otherwise), then tries on the nodes the balancer picks until one answers
//! or the error and retry rules end it (spec data-plane §3), every try recorded once in the
//! request's [`crate::log::record::UpstreamRecord`].
//!
//! Each try is reported to the upstream's health checker as APISIX's balancer and log phase
//! report it: a failed try that another try follows counts as a TCP failure or a timeout
//! (passive, even without a `passive` block), the status the last try ended with counts when
//! `passive` is configured. A try holds its node (least_conn's count, ewma's timing) until its
//! response body or websocket tunnel ends.

pub mod balancer;
pub mod client;
pub mod dns;
pub(crate) mod forwarded;
pub mod health;
pub(crate) mod nodes;
mod relay;
mod websocket;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrisix_config::model::PassHost;
use ferrisix_plugin_api::{BodyError, RequestBody};
use http::header::{self, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, Version};
use http_body::Body as _;
use http_body_util::BodyExt;
use smallvec::SmallVec;

use crate::ctx::RequestCtx;
use crate::error::{ErrorKind, ErrorSource, ProxyError};
use crate::request::host::host_without_port;
use crate::response::body::ResponseBody;
use crate::response::canned;
use crate::snapshot::CompiledUpstream;
use crate::upstream::balancer::{HashOn, PickState};
use crate::upstream::client::{PoolKey, SendOutcome, StreamSource, TryTimeouts, UpstreamBody};
use crate::upstream::forwarded::upstream_headers;
use crate::upstream::nodes::HealthView;

/// Bodies up to this size (with a known length) are read before proxying so that a failed
/// try can be replayed; larger ones stream.
const BUFFERED_BODY_LIMIT: u64 = 64 * 1024;

fn body_error(e: &BodyError) -> ProxyError {
    match e {
        BodyError::Broken(_) => ErrorKind::BodyBroken.into(),
        BodyError::Timeout => ErrorKind::BodyTimeout.into(),
        BodyError::TooLarge(_) => ErrorKind::BodyTooLarge.into(),
    }
}

/// Reads a body of unknown length until it ends (a complete, replayable body) or passes
/// `limit` bytes (a stream that first sends what was read).
async fn read_up_to(
    mut body: StreamSource,
    limit: usize,
    between_reads: Duration,
) -> Result<UpstreamBody, ProxyError> {
    let mut buf = bytes::BytesMut::new();
    loop {
        match tokio::time::timeout(between_reads, body.frame()).await {
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
            Ok(Some(Err(_))) => return Err(ErrorKind::BodyBroken.into()),
            Err(_) => return Err(ErrorKind::BodyTimeout.into()),
        }
    }
}

/// Buffers small known-length bodies (replayable) and streams the rest; `timeout`: nginx's
/// `client_body_timeout`; `limit`: the body size limit, past which a chunked body is not read
/// on (the caller refuses it).
async fn unread_body(
    body: StreamSource,
    timeout: Duration,
    limit: Option<u64>,
) -> Result<UpstreamBody, ProxyError> {
    if body.is_end_stream() {
        return Ok(UpstreamBody::Empty);
    }
    match body.size_hint().exact() {
        Some(n) if n <= BUFFERED_BODY_LIMIT => {
            match tokio::time::timeout(timeout, body.collect()).await {
                Ok(Ok(collected)) => Ok(UpstreamBody::full(collected.to_bytes())),
                // The client went away or stalled (nginx logs 400/408).
                Ok(Err(_)) => Err(ErrorKind::BodyBroken.into()),
                Err(_) => Err(ErrorKind::BodyTimeout.into()),
            }
        }
        Some(_) => Ok(UpstreamBody::stream_after(None, body)),
        // Unknown length (chunked): nginx reads the whole body and sends it with
        // Content-Length. Do the same up to the buffering limit; past it, stream what was
        // read followed by the rest, so a huge upload never sits in memory.
        // With a smaller size limit, reading stops once the body passes it (nginx: 413 then).
        None => {
            let up_to = limit.map_or(BUFFERED_BODY_LIMIT, |l| l.min(BUFFERED_BODY_LIMIT));
            read_up_to(body, up_to as usize, timeout).await
        }
    }
}

/// The request body as it goes upstream: the client's own, or what the plugins left of it;
/// a route's body size limit refuses a larger one (413) or cuts a stream off at it.
async fn prepare_body(ctx: &mut RequestCtx<'_>) -> Result<UpstreamBody, ProxyError> {
    let (body, limit, buffering) = match ctx.plugins.as_mut() {
        Some(run) => {
            let limit = run.state.max_body_size();
            let buffering = run.state.request_buffering();
            let body = match run.state.take_body() {
                RequestBody::Empty => match ctx.body.take() {
                    Some(b) => StreamBody::Unread(StreamSource::Client(b)),
                    None => StreamBody::Ready(UpstreamBody::Empty),
                },
                RequestBody::Unread(b) => StreamBody::Unread(StreamSource::Pending(b)),
                RequestBody::Buffered(b) => StreamBody::Ready(UpstreamBody::full(b)),
                RequestBody::Partial { read, rest } => StreamBody::Ready(
                    UpstreamBody::stream_after(Some(read), StreamSource::Pending(rest)),
                ),
                RequestBody::Failed(e) => return Err(body_error(&e)),
            };
            (body, limit, buffering)
        }
        None => match ctx.body.take() {
            Some(b) => (StreamBody::Unread(StreamSource::Client(b)), None, None),
            None => (StreamBody::Ready(UpstreamBody::Empty), None, None),
        },
    };
    // The route's client-control limit, else the gateway's `client_max_body_size`.
    let global = ctx.conn.gateway.client_max_body_size;
    let limit = limit.or((global != 0).then_some(global));
    if let Some(max) = limit {
        let declared = ctx
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max) {
            return Err(ErrorKind::BodyTooLarge.into());
        }
    }
    let body = match body {
        StreamBody::Ready(b) => b,
        // proxy-control's `request_buffering: false`: the body goes up as it arrives.
        StreamBody::Unread(b) if buffering == Some(false) && !b.is_end_stream() => {
            UpstreamBody::stream_after(None, b)
        }
        StreamBody::Unread(b) => {
            unread_body(b, ctx.conn.gateway.client_body_timeout, limit).await?
        }
    };
    let body = body.client_timeout(ctx.conn.gateway.client_body_timeout);
    match limit {
        Some(max) => body.limit(max),
        None => Ok(body),
    }
}

enum StreamBody {
    Unread(StreamSource),
    Ready(UpstreamBody),
}

/// `grpc-timeout: 100m` (at most 8 digits, then H, M, S, m, u or n).
fn grpc_timeout(v: &HeaderValue) -> Option<Duration> {
    let s = v.to_str().ok()?;
    let (digits, unit) = s.split_at(s.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// Where an HTTP/2 request goes: the upstream (its scheme), the `Host` it would have had
/// (`$upstream_host`) and the node's, when there is none.
struct H2Target<'a> {
    upstream: &'a CompiledUpstream,
    host: Option<&'a HeaderValue>,
    node_host: &'a HeaderValue,
}

/// A request for an HTTP/2 upstream: `:scheme` and `:authority` in the URI, and for gRPC
/// `te: trailers`, as APISIX's `@grpc_pass` location sets them.
fn h2_request(
    target: H2Target<'_>,
    method: &Method,
    uri: &Uri,
    mut headers: HeaderMap,
    body: UpstreamBody,
) -> Request<UpstreamBody> {
    let authority = target.host.unwrap_or(target.node_host);
    let scheme = if target.upstream.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let full = authority
        .to_str()
        .ok()
        .and_then(|a| format!("{scheme}://{a}{path}").parse::<Uri>().ok())
        .unwrap_or_else(|| uri.clone());
    headers.remove(header::HOST);
    if is_grpc(&headers) {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
    let mut req = Request::new(body);
    *req.method_mut() = method.clone();
    *req.uri_mut() = full;
    *req.version_mut() = Version::HTTP_2;
    *req.headers_mut() = headers;
    req
}

fn build_request(
    method: &Method,
    uri: &Uri,
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

/// The upstream's request target: the client's raw path and query, or what plugins changed.
fn upstream_uri(ctx: &RequestCtx<'_>) -> Uri {
    let uri = &ctx.head.uri;
    if let Some(edits) = ctx.plugins.as_ref().map(|r| r.state.upstream_edits()) {
        if edits.path.is_some() || edits.query.is_some() {
            let path = edits.path.as_deref().unwrap_or(uri.path());
            let query = match &edits.query {
                Some(q) => q.as_deref(),
                None => uri.query(),
            };
            let target = match query {
                Some(q) => format!("{path}?{q}"),
                None => path.to_owned(),
            };
            if let Ok(u) = target.parse() {
                return u;
            }
            tracing::warn!(uri = %target, "invalid upstream uri set by a plugin; the client's is sent");
        }
    }
    // An origin-form URI is exactly that (cloning it copies a pointer); an absolute-form one
    // loses its scheme and host.
    if uri.scheme().is_none() && uri.authority().is_none() {
        uri.clone()
    } else {
        uri.path_and_query()
            .map_or("/", |p| p.as_str())
            .parse()
            .unwrap_or_else(|_| Uri::from_static("/"))
    }
}

/// chash's key (`fetch_chash_hash_key`) from the request's variables and the consumer an auth
/// plugin attached.
fn chash_key(ctx: &RequestCtx<'_>, hash_on: &HashOn) -> String {
    let head = ctx.head.as_request_head(&ctx.conn.facts);
    let state = ctx.plugins.as_ref().map(|r| &r.state);
    let vars = ferrisix_plugin_api::RequestVars {
        head: &head,
        headers: &ctx.headers,
        remote_addr: state.map_or(ctx.remote_addr, |s| s.remote_addr()),
        remote_port: state.and_then(|s| s.remote_port()),
    };
    let var = |name: &str| vars.get(name);
    let consumer = state
        .and_then(|s| s.consumer())
        .map(|c| c.username.as_str());
    hash_on.key(&var, consumer).into_owned()
}

/// Proxies the request to `upstream`; `route_timeouts` replace the upstream's.
pub(crate) async fn proxy(
    ctx: &mut RequestCtx<'_>,
    upstream: &CompiledUpstream,
    route_timeouts: Option<TryTimeouts>,
    websocket: bool,
) -> Response<ResponseBody> {
    let conn = ctx.conn;
    let gateway = &*conn.gateway;
    let mut timeouts = route_timeouts.unwrap_or(upstream.timeouts);
    if upstream.h2 {
        // A gRPC deadline bounds the wait for the upstream's answer.
        if let Some(deadline) = ctx.headers.get("grpc-timeout").and_then(grpc_timeout) {
            timeouts.read = timeouts.read.min(deadline);
            timeouts.connect = timeouts.connect.min(deadline);
        }
    }
    let hash_key = upstream.hash_on.as_ref().map(|h| chash_key(ctx, h));
    let edits = ctx.plugins.as_ref().map(|r| r.state.upstream_edits());
    let method = edits
        .and_then(|e| e.method.clone())
        .unwrap_or_else(|| ctx.head.method.clone());
    let host_edit = edits.and_then(|e| e.host.clone());
    let idempotent = !matches!(method, Method::POST | Method::PATCH) && method.as_str() != "LOCK";

    let mut pending_body = match prepare_body(ctx).await {
        Ok(b) => Some(b),
        Err(e) => return canned::error_response(e, &gateway.server_header),
    };
    let replayable = pending_body
        .as_ref()
        .is_some_and(UpstreamBody::is_replayable);

    let upgrade = if websocket {
        ctx.extensions.remove::<hyper::upgrade::OnUpgrade>()
    } else {
        None
    };
    let mut headers = Some(upstream_headers(
        &ctx.headers,
        ctx.remote_addr,
        ctx.head.host_value.as_ref(),
        &conn.forwarded,
        websocket,
    ));
    let uri = upstream_uri(ctx);

    let mut tried: SmallVec<[usize; 4]> = SmallVec::new();
    let mut last_failure = ProxyError::new(ErrorKind::ConnectRefused);
    let first_try = Instant::now();
    let record = &mut ctx.log.upstream;
    record.start = Some(first_try);

    // Set when APISIX's balancer phase would end a retry itself with `core.response.exit(502)`
    // (spec data-plane §3.5): `retry_timeout` passed, or no untried node is left while the
    // try budget is not spent. The answer is then 502, not the last try's status (a 504
    // after timeouts).
    let mut balancer_refused = false;
    // The node set as resolved now; a name whose first lookup is under way is awaited (on the
    // resolver's tasks, the worker only waits) up to the connect timeout.
    let set = upstream.nodes.ready(timeouts.connect).await;
    if set.nodes.is_empty() {
        // APISIX: "no valid upstream node".
        let error = ProxyError::new(ErrorKind::Unservable(StatusCode::SERVICE_UNAVAILABLE));
        return canned::error_response(error, &gateway.server_header);
    }
    let max_tries = upstream.max_tries(&set);
    let mut pick = PickState::new(Cow::Owned(hash_key.unwrap_or_default()));
    let mut health = HealthView::default();
    // The node of the last failed try, reported to the health checker once it is known that
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
        record.addrs.push(addr);
        let more_tries_left = tried.len() < max_tries;
        let Some(mut req_headers) = headers.take() else {
            break;
        };
        let upstream_host: Option<HeaderValue> = match &host_edit {
            Some(h) => Some(h.clone()),
            None => match upstream.pass_host {
                // `$http_host` verbatim (port and case kept); HTTP/2 takes :authority. An
                // HTTP/1.0 request may come without one; it still goes upstream as HTTP/1.1,
                // which needs a Host: the node's, as nginx's default `$proxy_host`.
                PassHost::Pass => ctx
                    .head
                    .host_value
                    .clone()
                    .or_else(|| Some(node.host_header.clone())),
                PassHost::Node => Some(node.host_header.clone()),
                PassHost::Rewrite => upstream.upstream_host.clone(),
            },
        };
        record.host = upstream_host.clone();
        // The value moves into the request: each clone of a parsed header's bytes is a
        // locked reference count up, and its drop one down.
        match upstream_host {
            Some(h) => {
                if ctx.head.host_value.is_none() {
                    // No host from the client: X-Forwarded-Host names the one the upstream
                    // is asked for (nginx's `$host` falls back to the server's name).
                    req_headers.insert(
                        http::header::HeaderName::from_static("x-forwarded-host"),
                        h.clone(),
                    );
                }
                req_headers.insert(header::HOST, h);
            }
            None => {
                req_headers.remove(header::HOST);
            }
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
            tls: upstream.tls.as_ref().map_or(0, |t| t.fingerprint),
            // proxy_ssl_name $upstream_host: the Host sent, without its port (none for an
            // address, which `server_name` turns into no SNI).
            sni: upstream.tls.as_ref().map(|_| {
                let h = record
                    .host
                    .as_ref()
                    .and_then(|h| h.to_str().ok())
                    .and_then(host_without_port)
                    .map(|h| h.into_owned())
                    .unwrap_or_else(|| node.host.clone());
                Arc::from(h.trim_start_matches('[').trim_end_matches(']'))
            }),
            h2: upstream.h2,
            epoch: set.down_epoch(node_idx),
        };
        let mut try_guard = set.picker.begin(node_idx);
        let req = if upstream.h2 {
            h2_request(
                H2Target {
                    upstream,
                    host: record.host.as_ref(),
                    node_host: &node.host_header,
                },
                &method,
                &uri,
                req_headers,
                req_body,
            )
        } else {
            build_request(&method, &uri, req_headers, req_body)
        };
        let mut attempt = Some(req);
        let mut fresh_retry_used = false;
        let outcome = loop {
            let tls = upstream.tls.as_ref();
            let mut conn = match client::checkout(&key, upstream.pool, timeouts.connect, tls).await
            {
                Ok(c) => c,
                Err(f) => break Err((f, attempt.take())),
            };
            let reused = conn.is_reused();
            let Some(req) = attempt.take() else {
                break Err((ErrorKind::ConnectionBroken.into(), None));
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
                record.responded = true;
                let status = resp.status().as_u16();
                record.statuses.push(status);
                try_guard.answered();
                set.report_final(node_idx, status);
                if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
                    if let Some(client_upgrade) = upgrade {
                        let upstream_upgrade = hyper::upgrade::on(&mut resp);
                        // The tunnel holds the try: least_conn counts it while it is open.
                        websocket::tunnel(client_upgrade, upstream_upgrade, try_guard);
                    }
                    drop(conn);
                    return relay::relay_head(
                        gateway,
                        resp,
                        None,
                        &record.statuses,
                        timeouts,
                        true,
                    );
                }
                let mut out =
                    relay::relay_head(gateway, resp, Some(conn), &record.statuses, timeouts, false);
                out.body_mut().hold_try(try_guard);
                return out;
            }
            Err((failure, returned)) => {
                drop(try_guard);
                if failure.source() == ErrorSource::Client {
                    // The client's fault (its body passed the limit or broke off), found while
                    // it streamed: no other try.
                    return canned::error_response(failure, &gateway.server_header);
                }
                tracing::warn!(upstream = %addr, "{failure} while proxying");
                record.statuses.push(failure.status().as_u16());
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
                        if !failure.may_retry(idempotent, replayable) {
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
    let error = relay::final_error(last_failure, !record.statuses.is_empty(), balancer_refused);
    // The log phase's passive check sees the status the client gets, on the last node.
    if let Some(last) = tried.last() {
        set.report_final(*last, error.status().as_u16());
    }
    let grpc = upstream.h2 && is_grpc(&ctx.headers);
    relay::failed(gateway, error, &record.statuses, grpc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts() {
        let t = |s: &'static str| grpc_timeout(&HeaderValue::from_static(s));
        assert_eq!(t("100m"), Some(Duration::from_millis(100)));
        assert_eq!(t("2S"), Some(Duration::from_secs(2)));
        assert_eq!(t("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(t("123456789S"), None);
        assert_eq!(t("5x"), None);
        assert_eq!(t("S"), None);
    }
}
