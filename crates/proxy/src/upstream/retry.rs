//! Whether a failed try is followed by another, and with what: a request that never left
//! comes back whole; one that was sent is resent only from the copies kept before it went
//! (its body replayable), and only when the failure and the method allow it (spec data-plane
//! §3).

use http::{HeaderMap, Request};

use super::client::UpstreamBody;
use crate::error::ProxyError;

/// What the next try sends.
pub struct Resend {
    pub headers: HeaderMap,
    pub body: UpstreamBody,
}

/// Copies of a try's headers and body, kept while another try may follow and the body can be
/// replayed (a request that was not sent comes back whole and needs none).
pub struct Spare {
    headers: Option<HeaderMap>,
    body: Option<UpstreamBody>,
}

impl Spare {
    pub fn keep(more_tries_left: bool, replayable: bool, req: &Request<UpstreamBody>) -> Spare {
        Spare {
            headers: (more_tries_left && replayable).then(|| req.headers().clone()),
            body: if more_tries_left {
                req.body().try_clone()
            } else {
                None
            },
        }
    }
}

/// What the next try sends after a try failed with `failure`; `None`: no other try.
/// `returned`: the request, when it was not sent.
pub fn resend(
    failure: ProxyError,
    returned: Option<Request<UpstreamBody>>,
    spare: Spare,
    idempotent: bool,
    replayable: bool,
) -> Option<Resend> {
    match returned {
        Some(req) => {
            let (parts, body) = req.into_parts();
            Some(Resend {
                headers: parts.headers,
                body,
            })
        }
        None => {
            if !failure.may_retry(idempotent, replayable) {
                return None;
            }
            Some(Resend {
                headers: spare.headers?,
                body: spare.body?,
            })
        }
    }
}
