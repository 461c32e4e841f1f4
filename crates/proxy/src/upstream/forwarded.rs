//! What the upstream is told about the client: the request headers sent upstream (spec
//! data-plane §3.2), hop-by-hop headers dropped, `X-Real-IP`, `X-Forwarded-For`, `-Proto`,
//! `-Host` and `-Port` set.

use std::net::IpAddr;

use http::header::{self, HeaderName, HeaderValue};
use http::HeaderMap;

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

/// The port of a Host header value, if it names one.
pub fn port_of_host(raw: &str) -> Option<&str> {
    let after = if raw.starts_with('[') {
        &raw[raw.find(']')? + 1..]
    } else {
        raw
    };
    // A byte search: `rsplit_once(':')` sets up a char searcher on every request.
    let colon = after.as_bytes().iter().rposition(|&b| b == b':')?;
    Some(&after[colon + 1..]).filter(|p| !p.is_empty())
}

/// An address as a header value, formatted on the stack.
pub fn ip_header(ip: IpAddr) -> HeaderValue {
    let mut buf = [0u8; 48];
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    let _ = std::io::Write::write_fmt(&mut cursor, format_args!("{ip}"));
    let n = cursor.position() as usize;
    HeaderValue::from_bytes(&buf[..n]).unwrap_or_else(|_| HeaderValue::from_static("-"))
}

/// The header values every request of one connection sends upstream, built once per
/// connection rather than once per request.
#[derive(Clone, Debug)]
pub struct ForwardedValues {
    peer_ip: IpAddr,
    /// The peer's IP (`X-Real-IP`, `X-Forwarded-For` when the realip rewrite kept it).
    peer_ip_value: HeaderValue,
    /// The local port (`X-Forwarded-Port` when the Host header names no other).
    local_port_value: HeaderValue,
    /// `X-Forwarded-Proto`: `https` on the TLS listeners.
    scheme: &'static str,
}

impl ForwardedValues {
    pub fn new(
        peer: std::net::SocketAddr,
        local: std::net::SocketAddr,
        scheme: &'static str,
    ) -> ForwardedValues {
        ForwardedValues {
            peer_ip: peer.ip(),
            peer_ip_value: ip_header(peer.ip()),
            local_port_value: HeaderValue::from(local.port()),
            scheme,
        }
    }
}

// Consts: `HeaderName::from_static` outside a const context validates the name on every call.
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PORT: HeaderName = HeaderName::from_static("x-forwarded-port");

/// The headers sent upstream, Host excepted (set per try). The client's headers are read in
/// one pass: the ones nginx drops are skipped there and the few read again (the first
/// `X-Forwarded-For`, and `Upgrade`/`Connection` for a WebSocket) are kept on the way.
pub fn upstream_headers(
    headers: &HeaderMap,
    remote_addr: IpAddr,
    host_value: Option<&HeaderValue>,
    conn: &ForwardedValues,
    websocket: bool,
) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(headers.len() + 6);
    let (mut prev_xff, mut upgrade, mut connection) = (None, None, None);
    for (name, value) in headers {
        if !is_dropped_request_header(name) {
            out.append(name.clone(), value.clone());
        } else if *name == X_FORWARDED_FOR {
            prev_xff.get_or_insert(value);
        } else if *name == header::UPGRADE {
            upgrade.get_or_insert(value);
        } else if *name == header::CONNECTION {
            connection.get_or_insert(value);
        }
    }
    if websocket {
        for (name, value) in [(header::UPGRADE, upgrade), (header::CONNECTION, connection)] {
            if let Some(v) = value {
                out.insert(name, v.clone());
            }
        }
    }
    let remote = if remote_addr == conn.peer_ip {
        conn.peer_ip_value.clone()
    } else {
        ip_header(remote_addr)
    };
    out.append(X_REAL_IP, remote.clone());
    let xff = match prev_xff {
        Some(prev) => {
            let mut v = Vec::with_capacity(prev.len() + 2 + 39);
            v.extend_from_slice(prev.as_bytes());
            v.extend_from_slice(b", ");
            v.extend_from_slice(remote.as_bytes());
            HeaderValue::from_bytes(&v).unwrap_or(remote)
        }
        None => remote,
    };
    out.append(X_FORWARDED_FOR, xff);
    out.append(X_FORWARDED_PROTO, HeaderValue::from_static(conn.scheme));
    let host_raw = host_value.and_then(|h| h.to_str().ok());
    if let Some(h) = host_value {
        out.append(X_FORWARDED_HOST, h.clone());
    }
    let port = match host_raw.and_then(port_of_host) {
        Some(p) if p.as_bytes() != conn.local_port_value.as_bytes() => {
            HeaderValue::from_str(p).unwrap_or_else(|_| conn.local_port_value.clone())
        }
        _ => conn.local_port_value.clone(),
    };
    out.append(X_FORWARDED_PORT, port);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> ForwardedValues {
        ForwardedValues::new(
            "10.0.0.9:5000".parse().unwrap(),
            "127.0.0.1:9080".parse().unwrap(),
            "http",
        )
    }

    #[test]
    fn upstream_headers_drop_hop_by_hop_and_add_the_forwarded_ones() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("user-agent", "wrk"),
            ("connection", "Upgrade"),
            ("connection", "keep-alive"),
            ("upgrade", "websocket"),
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "2.2.2.2"),
            ("x-real-ip", "3.3.3.3"),
            ("accept", "a"),
            ("accept", "b"),
            ("te", "trailers"),
            ("content-length", "3"),
            ("host", "h.com:8443"),
        ] {
            h.append(k, HeaderValue::from_static(v));
        }
        let host = HeaderValue::from_static("h.com:8443");
        let peer = "10.0.0.9".parse().unwrap();
        let out = upstream_headers(&h, peer, Some(&host), &values(), false);
        let pairs: Vec<(&str, &str)> = out
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("user-agent", "wrk"),
                ("accept", "a"),
                ("accept", "b"),
                ("x-real-ip", "10.0.0.9"),
                // The first X-Forwarded-For, as $http_x_forwarded_for gives it.
                ("x-forwarded-for", "1.1.1.1, 10.0.0.9"),
                ("x-forwarded-proto", "http"),
                ("x-forwarded-host", "h.com:8443"),
                ("x-forwarded-port", "8443"),
            ]
        );
        // A WebSocket route passes the first Upgrade and Connection on; another client
        // address (real-ip) is formatted for this request.
        let other = "192.168.1.2".parse().unwrap();
        let out = upstream_headers(&h, other, None, &values(), true);
        assert_eq!(out["upgrade"], "websocket");
        assert_eq!(out.get_all("connection").iter().count(), 1);
        assert_eq!(out["connection"], "Upgrade");
        assert_eq!(out["x-real-ip"], "192.168.1.2");
        assert_eq!(out["x-forwarded-port"], "9080");
        assert!(!out.contains_key("x-forwarded-host") && !out.contains_key("te"));
    }

    #[test]
    fn ports_of_hosts() {
        assert_eq!(port_of_host("a.com:8080"), Some("8080"));
        assert_eq!(port_of_host("a.com"), None);
        assert_eq!(port_of_host("[::1]:81"), Some("81"));
        assert_eq!(port_of_host("[::1]"), None);
        assert_eq!(port_of_host("a.com:"), None);
        assert_eq!(port_of_host("a:b:8"), Some("8"));
        assert_eq!(port_of_host("é:9"), Some("9"));
    }
}
