//! The proxy's one error type: what went wrong, who is at fault and whether another try may
//! follow (pingora-error's `ErrorSource` and `RetryType`).
//!
//! Keeping the classification in one place means the 400/408/413/414, 502-versus-504 choice,
//! the retry decision and the `X-APISIX-Upstream-Status` entry all come from the same value,
//! as nginx derives them from one `ngx_http_upstream_next` reason.

use std::fmt;

use http::StatusCode;

/// Who caused a failed request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorSource {
    /// The client sent something unusable, stalled or went away.
    Client,
    /// The upstream refused, reset, timed out or spoke garbage.
    Upstream,
    /// The gateway's own configuration or state (no upstream, nothing left to try).
    Internal,
}

/// Whether another try may follow a failed one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryType {
    /// Never (the client's fault, or nothing left to try).
    Never,
    /// The request never reached the upstream: any request may go to the next node.
    Safe,
    /// The request may have reached the upstream: only an idempotent request with a replayable
    /// body goes again (nginx never re-sends POST, LOCK or PATCH once sent).
    IfIdempotent,
}

/// What went wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    // The client's.
    /// A request head nginx refuses (no Host on HTTP/1.1, an invalid Host, a bad path).
    BadRequest,
    /// TRACE and CONNECT.
    MethodNotAllowed,
    /// A transfer coding other than chunked.
    UnknownCoding,
    /// nginx's `large_client_header_buffers`: the request line is too long.
    UriTooLong,
    /// The client went away mid-body or sent a broken one.
    BodyBroken,
    /// The client stalled sending the body.
    BodyTimeout,
    /// The body is larger than the route allows (`client_max_body_size`).
    BodyTooLarge,
    // The upstream's.
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
    // The gateway's.
    /// APISIX's balancer ends retries itself (`retry_timeout` passed, no untried node left).
    NoMoreTries,
    /// The route cannot be served (missing service or upstream, no nodes): this status.
    Unservable(StatusCode),
}

/// A request that ends without an upstream response, or one failed try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProxyError {
    pub kind: ErrorKind,
}

impl From<ErrorKind> for ProxyError {
    fn from(kind: ErrorKind) -> ProxyError {
        ProxyError { kind }
    }
}

impl ProxyError {
    pub const fn new(kind: ErrorKind) -> ProxyError {
        ProxyError { kind }
    }

    pub fn source(&self) -> ErrorSource {
        use ErrorKind::*;
        match self.kind {
            BadRequest | MethodNotAllowed | UnknownCoding | UriTooLong | BodyBroken
            | BodyTimeout | BodyTooLarge => ErrorSource::Client,
            ConnectRefused | ConnectTimeout | SendTimeout | ReadTimeout | ConnectionBroken
            | InvalidResponse => ErrorSource::Upstream,
            NoMoreTries | Unservable(_) => ErrorSource::Internal,
        }
    }

    pub fn is_timeout(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::ConnectTimeout | ErrorKind::SendTimeout | ErrorKind::ReadTimeout
        )
    }

    pub fn retry(&self) -> RetryType {
        use ErrorKind::*;
        match self.kind {
            ConnectRefused | ConnectTimeout => RetryType::Safe,
            SendTimeout | ReadTimeout | ConnectionBroken | InvalidResponse => {
                RetryType::IfIdempotent
            }
            _ => RetryType::Never,
        }
    }

    /// Whether the next node may be tried: nginx's default `proxy_next_upstream error
    /// timeout`, where errors and timeouts are retried, HTTP statuses never are, and a request
    /// already sent is not repeated when its method is not idempotent or its body cannot be
    /// replayed.
    pub fn may_retry(&self, idempotent: bool, body_replayable: bool) -> bool {
        match self.retry() {
            RetryType::Never => false,
            RetryType::Safe => true,
            RetryType::IfIdempotent => idempotent && body_replayable,
        }
    }

    /// The status answered (and recorded in `$upstream_status` for a try): nginx's for each
    /// kind; upstream timeouts are 504, every other upstream failure 502.
    pub fn status(&self) -> StatusCode {
        use ErrorKind::*;
        match self.kind {
            BadRequest | BodyBroken => StatusCode::BAD_REQUEST,
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            UnknownCoding => StatusCode::NOT_IMPLEMENTED,
            UriTooLong => StatusCode::URI_TOO_LONG,
            BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ConnectTimeout | SendTimeout | ReadTimeout => StatusCode::GATEWAY_TIMEOUT,
            ConnectRefused | ConnectionBroken | InvalidResponse | NoMoreTries => {
                StatusCode::BAD_GATEWAY
            }
            Unservable(status) => status,
        }
    }
}

impl fmt::Display for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ErrorKind::*;
        f.write_str(match self.kind {
            BadRequest => "client sent invalid request",
            MethodNotAllowed => "client sent a method nginx refuses",
            UnknownCoding => "client sent unknown Transfer-Encoding",
            UriTooLong => "client sent too long URI",
            BodyBroken => "client prematurely closed connection",
            BodyTimeout => "client timed out",
            BodyTooLarge => "client intended to send too large body",
            ConnectRefused => "connect() failed",
            ConnectTimeout => "upstream timed out while connecting",
            SendTimeout => "upstream timed out while sending request",
            ReadTimeout => "upstream timed out while reading response header",
            ConnectionBroken => "upstream prematurely closed connection",
            InvalidResponse => "upstream sent invalid header",
            NoMoreTries => "no upstream node left to try",
            Unservable(_) => "the route cannot be served",
        })
    }
}

impl std::error::Error for ProxyError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(kind: ErrorKind) -> ProxyError {
        ProxyError::new(kind)
    }

    #[test]
    fn timeouts_are_504_and_errors_502() {
        assert_eq!(
            e(ErrorKind::ReadTimeout).status(),
            StatusCode::GATEWAY_TIMEOUT
        );
        assert_eq!(
            e(ErrorKind::ConnectTimeout).status(),
            StatusCode::GATEWAY_TIMEOUT
        );
        assert_eq!(
            e(ErrorKind::ConnectRefused).status(),
            StatusCode::BAD_GATEWAY
        );
        assert_eq!(
            e(ErrorKind::ConnectionBroken).status(),
            StatusCode::BAD_GATEWAY
        );
    }

    #[test]
    fn post_is_not_resent_but_refused_connect_is_retried() {
        assert!(!e(ErrorKind::ReadTimeout).may_retry(false, true));
        assert!(e(ErrorKind::ConnectRefused).may_retry(false, false));
        assert!(e(ErrorKind::ReadTimeout).may_retry(true, true));
        assert!(!e(ErrorKind::ConnectionBroken).may_retry(true, false));
    }

    #[test]
    fn who_is_at_fault() {
        assert_eq!(e(ErrorKind::UriTooLong).source(), ErrorSource::Client);
        assert_eq!(e(ErrorKind::UriTooLong).status(), StatusCode::URI_TOO_LONG);
        assert_eq!(
            e(ErrorKind::BodyTimeout).status(),
            StatusCode::REQUEST_TIMEOUT
        );
        assert_eq!(
            e(ErrorKind::BodyTooLarge).status(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
        assert!(!e(ErrorKind::BodyBroken).may_retry(true, true));
        assert_eq!(
            e(ErrorKind::InvalidResponse).source(),
            ErrorSource::Upstream
        );
        assert_eq!(e(ErrorKind::NoMoreTries).source(), ErrorSource::Internal);
        assert_eq!(
            e(ErrorKind::Unservable(StatusCode::SERVICE_UNAVAILABLE)).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
