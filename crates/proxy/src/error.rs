//! Proxy errors that carry who is at fault and whether another node may be tried.
//!
//! Keeping the classification in one place means the 502-versus-504 choice, the retry decision
//! and the `X-APISIX-Upstream-Status` entry all come from the same value, as nginx derives them
//! from one `ngx_http_upstream_next` reason.

use std::fmt;

use http::StatusCode;

/// Who caused a failed request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The client sent something unusable or went away.
    Client,
    /// The upstream refused, reset, timed out or spoke garbage.
    Upstream,
    /// Our own configuration or state (no upstream, missing reference).
    Internal,
}

/// What went wrong on one upstream try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamFailure {
    /// TCP connect refused, unreachable, or reset before anything was sent.
    ConnectRefused,
    /// `timeout.connect` elapsed.
    ConnectTimeout,
    /// `timeout.send` elapsed while writing the request.
    SendTimeout,
    /// `timeout.read` elapsed waiting for the response header.
    ReadTimeout,
    /// The connection broke after the request was (partly) sent, before a response header.
    ConnectionBroken,
    /// The upstream answered with something that is not HTTP.
    InvalidResponse,
}

impl UpstreamFailure {
    pub fn is_timeout(self) -> bool {
        matches!(
            self,
            UpstreamFailure::ConnectTimeout
                | UpstreamFailure::SendTimeout
                | UpstreamFailure::ReadTimeout
        )
    }

    /// The status nginx records for this try in `$upstream_status` and answers with when it is
    /// the last one: timeouts are 504, every other failure is 502.
    pub fn status(self) -> StatusCode {
        if self.is_timeout() {
            StatusCode::GATEWAY_TIMEOUT
        } else {
            StatusCode::BAD_GATEWAY
        }
    }

    /// Whether the request may have reached the upstream. nginx never re-sends a
    /// non-idempotent request once it was sent (`proxy_next_upstream` excludes POST, LOCK, PATCH).
    pub fn request_was_sent(self) -> bool {
        !matches!(
            self,
            UpstreamFailure::ConnectRefused | UpstreamFailure::ConnectTimeout
        )
    }
}

impl fmt::Display for UpstreamFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UpstreamFailure::ConnectRefused => "connect() failed",
            UpstreamFailure::ConnectTimeout => "upstream timed out while connecting",
            UpstreamFailure::SendTimeout => "upstream timed out while sending request",
            UpstreamFailure::ReadTimeout => "upstream timed out while reading response header",
            UpstreamFailure::ConnectionBroken => "upstream prematurely closed connection",
            UpstreamFailure::InvalidResponse => "upstream sent invalid header",
        })
    }
}

/// A request that ends without an upstream response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyError {
    pub fault: Fault,
    pub status: StatusCode,
    pub reason: &'static str,
}

impl ProxyError {
    pub const fn internal(status: StatusCode, reason: &'static str) -> ProxyError {
        ProxyError {
            fault: Fault::Internal,
            status,
            reason,
        }
    }

    pub const fn client(status: StatusCode, reason: &'static str) -> ProxyError {
        ProxyError {
            fault: Fault::Client,
            status,
            reason,
        }
    }
}

/// Decides whether the next node may be tried after `failure`.
///
/// nginx's default `proxy_next_upstream error timeout`: errors and timeouts are retried, HTTP
/// statuses never are, and a request already sent is not repeated when its method is not
/// idempotent or its body cannot be replayed.
pub fn may_retry(failure: UpstreamFailure, idempotent: bool, body_replayable: bool) -> bool {
    if !failure.request_was_sent() {
        return true;
    }
    idempotent && body_replayable
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_504_and_errors_502() {
        assert_eq!(
            UpstreamFailure::ReadTimeout.status(),
            StatusCode::GATEWAY_TIMEOUT
        );
        assert_eq!(
            UpstreamFailure::ConnectTimeout.status(),
            StatusCode::GATEWAY_TIMEOUT
        );
        assert_eq!(
            UpstreamFailure::ConnectRefused.status(),
            StatusCode::BAD_GATEWAY
        );
        assert_eq!(
            UpstreamFailure::ConnectionBroken.status(),
            StatusCode::BAD_GATEWAY
        );
    }

    #[test]
    fn post_is_not_resent_but_refused_connect_is_retried() {
        assert!(!may_retry(UpstreamFailure::ReadTimeout, false, true));
        assert!(may_retry(UpstreamFailure::ConnectRefused, false, false));
        assert!(may_retry(UpstreamFailure::ReadTimeout, true, true));
        assert!(!may_retry(UpstreamFailure::ConnectionBroken, true, false));
    }
}
