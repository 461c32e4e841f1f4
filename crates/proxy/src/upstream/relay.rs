//! Relaying the answer: what the upstream answered (or that nothing usable came back) turned
//! into the client's response, hop-by-hop headers dropped, `Server` and
//! `X-APISIX-Upstream-Status` set; a 101 turned into a websocket tunnel.

use http::header::{self, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use smallvec::SmallVec;

use super::balancer::TryGuard;
use super::client::{PooledConn, TryTimeouts};
use super::websocket;
use crate::error::ProxyError;
use crate::gateway::Gateway;
use crate::response::body::{ResponseBody, UpstreamResponse};
use crate::response::canned;

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

/// `X-APISIX-Upstream-Status`: every try's status, as `$upstream_status` lists them.
pub fn status_list(statuses: &[u16]) -> HeaderValue {
    let mut s = String::with_capacity(statuses.len() * 5);
    for (i, st) in statuses.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        s.push_str(&st.to_string());
    }
    HeaderValue::from_str(&s).unwrap_or_else(|_| HeaderValue::from_static("502"))
}

fn upstream_status_header() -> HeaderName {
    HeaderName::from_static("x-apisix-upstream-status")
}

/// The client's response to the upstream's answer `resp` on `conn`; `try_guard`, the try,
/// is held until the body (or, after a 101, the websocket tunnel) ends.
pub fn answer(
    gateway: &Gateway,
    mut resp: Response<Incoming>,
    conn: PooledConn,
    try_guard: TryGuard,
    upgrade: Option<OnUpgrade>,
    statuses: &[u16],
    timeouts: TryTimeouts,
) -> Response<ResponseBody> {
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_upgrade) = upgrade {
            let upstream_upgrade = hyper::upgrade::on(&mut resp);
            // The tunnel holds the try: least_conn counts it while it is open.
            websocket::tunnel(client_upgrade, upstream_upgrade, try_guard);
        }
        drop(conn);
        return relay_head(gateway, resp, None, statuses, timeouts, true);
    }
    let mut out = relay_head(gateway, resp, Some(conn), statuses, timeouts, false);
    out.body_mut().hold_try(try_guard);
    out
}

/// The upstream's response head as ours; its body relayed (an upgrade has none: the
/// connection becomes a tunnel).
fn relay_head(
    gateway: &Gateway,
    resp: Response<Incoming>,
    conn: Option<PooledConn>,
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
        .insert(header::SERVER, gateway.server_header.clone());
    let last = statuses.last().copied().unwrap_or(0);
    if gateway.show_upstream_status || (500..600).contains(&last) {
        head.headers
            .insert(upstream_status_header(), status_list(statuses));
    }
    let body = if upgrade {
        ResponseBody::empty()
    } else {
        ResponseBody::upstream(UpstreamResponse::new(body, conn, timeouts.read))
    };
    Response::from_parts(head, body)
}

/// The answer after every try failed (or none could be made): nginx's page for the error (a
/// gRPC error to a gRPC client), with the tries' statuses.
pub fn failed(
    gateway: &Gateway,
    error: ProxyError,
    statuses: &[u16],
    grpc: bool,
) -> Response<ResponseBody> {
    let mut resp = if grpc {
        canned::grpc_error(error.status(), &gateway.server_header)
    } else {
        canned::error_page(error.status(), &gateway.server_header)
    };
    if !statuses.is_empty() {
        resp.headers_mut()
            .insert(upstream_status_header(), status_list(statuses));
    }
    resp
}

/// The status answered when the tries ended with `last` after `statuses`: a balancer that
/// refused to go on answers 502 whatever the last try was (spec data-plane §3.5).
pub fn final_error(last: ProxyError, tried_any: bool, balancer_refused: bool) -> ProxyError {
    if !tried_any || balancer_refused {
        return crate::error::ErrorKind::NoMoreTries.into();
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lists() {
        assert_eq!(status_list(&[502, 504]), "502, 504");
        assert_eq!(status_list(&[502]), "502");
    }
}
