//! One try on one node: a pooled connection (or a new one), the request sent on it and the
//! response head awaited within the try's timeouts. A stale keep-alive connection that fails
//! before the request left is replaced by a fresh one to the same node, without spending a
//! try.

use http::{Request, Response};
use hyper::body::Incoming;

use super::client::{self, PoolKey, PooledConn, SendOutcome, TryTimeouts, UpstreamBody};
use crate::error::{ErrorKind, ProxyError};
use crate::snapshot::CompiledUpstream;

/// How one try ended.
pub enum Attempt {
    /// The upstream answered: its response head, and the connection its body comes on.
    Answered(Response<Incoming>, PooledConn),
    /// The try failed; the request comes back when it was not sent, so that another try can
    /// send it as is.
    Failed(ProxyError, Option<Request<UpstreamBody>>),
}

/// Sends `req` to the node of `key`.
pub async fn send(
    key: &PoolKey,
    upstream: &CompiledUpstream,
    timeouts: TryTimeouts,
    req: Request<UpstreamBody>,
) -> Attempt {
    let mut attempt = Some(req);
    let mut fresh_retry_used = false;
    loop {
        let tls = upstream.tls.as_ref();
        let mut conn = match client::checkout(key, upstream.pool, timeouts.connect, tls).await {
            Ok(c) => c,
            Err(f) => return Attempt::Failed(f, attempt.take()),
        };
        let reused = conn.is_reused();
        let Some(req) = attempt.take() else {
            return Attempt::Failed(ErrorKind::ConnectionBroken.into(), None);
        };
        match client::send(&mut conn, req, timeouts).await {
            SendOutcome::Response(resp) => return Attempt::Answered(resp, conn),
            SendOutcome::NotSent(req, f) => {
                // A stale keep-alive connection: open a fresh one to the same node,
                // without spending a try, as the request never left.
                if reused && !fresh_retry_used {
                    fresh_retry_used = true;
                    attempt = Some(req);
                    continue;
                }
                return Attempt::Failed(f, Some(req));
            }
            SendOutcome::Failed(f) => return Attempt::Failed(f, None),
        }
    }
}
