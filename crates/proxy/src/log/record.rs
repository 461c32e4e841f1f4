//! What happened upstream for one request: one record, written by the upstream tries, read by
//! the access log and the plugins' log phase.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http::HeaderValue;
use smallvec::SmallVec;

/// The upstream side of one request.
#[derive(Clone, Debug, Default)]
pub struct UpstreamRecord {
    /// When the first try started (`$upstream_response_time` counts from here).
    pub start: Option<Instant>,
    /// Every node tried, in order (`$upstream_addr`).
    pub addrs: SmallVec<[SocketAddr; 2]>,
    /// Every try's status, in order (`$upstream_status`).
    pub statuses: SmallVec<[u16; 2]>,
    /// How long each finished try took, in order: every try but one whose answer is still
    /// being relayed (`$upstream_response_time` in the response phases).
    pub times: SmallVec<[Duration; 2]>,
    /// The `Host` sent on the last try (`$upstream_host`).
    pub host: Option<HeaderValue>,
    /// An upstream sent a response head.
    pub responded: bool,
}

impl UpstreamRecord {
    /// The last node tried.
    pub fn last_addr(&self) -> Option<SocketAddr> {
        self.addrs.last().copied()
    }

    /// Whether any node was tried.
    pub fn proxied(&self) -> bool {
        self.start.is_some()
    }
}

/// nginx's list of tries, `a, b`; `None` (unset) without any.
pub fn tries<T: std::fmt::Display>(items: &[T]) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
