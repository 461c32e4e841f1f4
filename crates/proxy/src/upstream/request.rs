//! The request every try sends, made once per request ([`Outgoing`]: the method and target,
//! the headers that say who the client is, from [`super::forwarded`], the tries' timeouts),
//! and its form for each node: the `Host` chosen for it (`pass_host`), the pooled connections
//! it may use, and HTTP/1.1 or HTTP/2.

use std::sync::Arc;
use std::time::Duration;

use ferrisix_config::model::{PassHost, Scheme};
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Uri, Version};
use hyper::upgrade::OnUpgrade;

use super::client::{PoolKey, TryTimeouts, UpstreamBody};
use super::forwarded::upstream_headers;
use super::nodes::NodeTarget;
use super::retry::Resend;
use crate::ctx::RequestCtx;
use crate::request::host::host_without_port;
use crate::snapshot::CompiledUpstream;

/// What every try of one request sends.
pub struct Outgoing<'u> {
    upstream: &'u CompiledUpstream,
    /// The route's timeouts, else the upstream's, bounded by a gRPC deadline.
    pub timeouts: TryTimeouts,
    method: Method,
    uri: Uri,
    /// The `Host` a plugin asked for (proxy-rewrite).
    host_edit: Option<HeaderValue>,
    /// Whether a try that failed after sending may be resent to another node (nginx's
    /// `proxy_next_upstream` leaves out non-idempotent methods).
    pub idempotent: bool,
    /// The client's side of a websocket upgrade the route allows.
    pub upgrade: Option<OnUpgrade>,
}

impl<'u> Outgoing<'u> {
    /// The request as the client and the plugins left it, for `upstream`, with the headers of
    /// its first try (Host excepted); `route_timeouts` replace the upstream's.
    pub fn of(
        ctx: &mut RequestCtx<'_>,
        upstream: &'u CompiledUpstream,
        route_timeouts: Option<TryTimeouts>,
        websocket: bool,
    ) -> (Outgoing<'u>, HeaderMap) {
        let mut timeouts = route_timeouts.unwrap_or(upstream.timeouts);
        if matches!(upstream.scheme, Scheme::Grpc | Scheme::Grpcs) {
            // A gRPC deadline bounds the wait for the upstream's answer.
            if let Some(deadline) = ctx.headers.get("grpc-timeout").and_then(grpc_timeout) {
                timeouts.read = timeouts.read.min(deadline);
                timeouts.connect = timeouts.connect.min(deadline);
            }
        }
        let edits = ctx.plugins.as_ref().map(|r| r.state.upstream_edits());
        let method = edits
            .and_then(|e| e.method.clone())
            .unwrap_or_else(|| ctx.head.method.clone());
        let host_edit = edits.and_then(|e| e.host.clone());
        let idempotent =
            !matches!(method, Method::POST | Method::PATCH) && method.as_str() != "LOCK";
        let upgrade = if websocket {
            ctx.extensions.remove::<OnUpgrade>()
        } else {
            None
        };
        let headers = upstream_headers(
            &ctx.headers,
            ctx.remote_addr,
            ctx.head.host_value.as_ref(),
            &ctx.conn.forwarded,
            websocket,
        );
        let outgoing = Outgoing {
            upstream,
            timeouts,
            method,
            uri: upstream_uri(ctx),
            host_edit,
            idempotent,
            upgrade,
        };
        (outgoing, headers)
    }

    /// The request for `node` (its connections opened since it last went down: `epoch`), with
    /// the pooled connections it may use. `client_host`: `$http_host`; the `Host` chosen is
    /// recorded in `sent_host`.
    pub fn to_node(
        &self,
        node: &NodeTarget,
        epoch: u32,
        client_host: Option<&HeaderValue>,
        next: Resend,
        sent_host: &mut Option<HeaderValue>,
    ) -> (Request<UpstreamBody>, PoolKey) {
        let upstream = self.upstream;
        let Resend { mut headers, body } = next;
        let host = upstream_host(self.host_edit.as_ref(), upstream, node, client_host);
        *sent_host = host.clone();
        set_host(&mut headers, host, client_host.is_some());
        let host = sent_host.as_ref();
        // A websocket upgrade is HTTP/1.1's: an h2c upstream takes it on an HTTP/1.1
        // connection (over TLS, ALPN decides, and the server picks HTTP/2).
        let h2 = upstream.h2 && (self.upgrade.is_none() || upstream.scheme != Scheme::Http);
        let key = pool_key(upstream, node, epoch, host, h2);
        let req = if h2 {
            let target = H2Target {
                upstream,
                host,
                node_host: &node.host_header,
            };
            h2_request(target, &self.method, &self.uri, headers, body)
        } else {
            build_request(&self.method, &self.uri, headers, body)
        };
        (req, key)
    }
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

pub fn is_grpc(headers: &HeaderMap) -> bool {
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
            tracing::warn!(uri = %ferrisix_net::clip(&target), "invalid upstream uri set by a plugin; the client's is sent");
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

/// The `Host` sent to `node`: a plugin's, else as `pass_host` says.
fn upstream_host(
    host_edit: Option<&HeaderValue>,
    upstream: &CompiledUpstream,
    node: &NodeTarget,
    client_host: Option<&HeaderValue>,
) -> Option<HeaderValue> {
    match host_edit {
        Some(h) => Some(h.clone()),
        None => match upstream.pass_host {
            // `$http_host` verbatim (port and case kept); HTTP/2 takes :authority. An
            // HTTP/1.0 request may come without one; it still goes upstream as HTTP/1.1,
            // which needs a Host: the node's, as nginx's default `$proxy_host`.
            PassHost::Pass => client_host
                .cloned()
                .or_else(|| Some(node.host_header.clone())),
            PassHost::Node => Some(node.host_header.clone()),
            PassHost::Rewrite => upstream.upstream_host.clone(),
        },
    }
}

/// Puts the try's `Host` on its headers; without a host from the client, `X-Forwarded-Host`
/// names the one the upstream is asked for (nginx's `$host` falls back to the server's name).
fn set_host(headers: &mut HeaderMap, host: Option<HeaderValue>, client_sent_host: bool) {
    // The value moves into the request: each clone of a parsed header's bytes is a locked
    // reference count up, and its drop one down.
    match host {
        Some(h) => {
            if !client_sent_host {
                headers.insert(HeaderName::from_static("x-forwarded-host"), h.clone());
            }
            headers.insert(header::HOST, h);
        }
        None => {
            headers.remove(header::HOST);
        }
    }
}

/// The pooled connections a try to `node` may use: same address, TLS settings, SNI and
/// protocol, and opened since the node last went down (`epoch`).
fn pool_key(
    upstream: &CompiledUpstream,
    node: &NodeTarget,
    epoch: u32,
    host: Option<&HeaderValue>,
    h2: bool,
) -> PoolKey {
    PoolKey {
        addr: node.addr,
        tls: upstream.tls.as_ref().map_or(0, |t| t.fingerprint),
        // proxy_ssl_name $upstream_host: the Host sent, without its port (none for an
        // address, which `server_name` turns into no SNI).
        sni: upstream.tls.as_ref().map(|_| {
            let h = host
                .and_then(|h| h.to_str().ok())
                .and_then(host_without_port)
                .map(|h| h.into_owned())
                .unwrap_or_else(|| node.host.clone());
            Arc::from(h.trim_start_matches('[').trim_end_matches(']'))
        }),
        h2,
        epoch,
    }
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
