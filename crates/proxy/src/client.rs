//! The upstream HTTP/1.1 client: connect with a timeout, keep-alive pools per node, and request
//! bodies that are either replayable (buffered) or streamed.
//!
//! Pools are per worker thread, as nginx's `keepalive` cache is per worker: a worker never
//! touches another's connections, so checking a connection out or in takes no lock.

mod body;
mod pool;

use std::io;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

pub use body::{SendProgress, UpstreamBody};
pub use pool::{evict_expired as evict_expired_idle, PoolKey, PoolLimits, PooledConn};

use crate::error::UpstreamFailure;

/// Per-try timeouts (`timeout.connect/send/read`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TryTimeouts {
    pub connect: Duration,
    pub send: Duration,
    pub read: Duration,
}

impl Default for TryTimeouts {
    fn default() -> Self {
        // nginx's defaults; APISIX sets none of its own.
        let d = Duration::from_secs(60);
        TryTimeouts {
            connect: d,
            send: d,
            read: d,
        }
    }
}

/// Opens a new connection to `addr` and performs the HTTP/1.1 handshake.
pub async fn connect(
    key: PoolKey,
    limits: PoolLimits,
    timeout: Duration,
) -> Result<PooledConn, UpstreamFailure> {
    let stream = match tokio::time::timeout(timeout, TcpStream::connect(key.addr)).await {
        Err(_) => return Err(UpstreamFailure::ConnectTimeout),
        Ok(Err(e)) => {
            tracing::debug!(addr = %key.addr, error = %e, "upstream connect failed");
            return Err(classify_connect_error(&e));
        }
        Ok(Ok(s)) => s,
    };
    let _ = stream.set_nodelay(true);
    let (sender, conn) = http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|_| UpstreamFailure::ConnectRefused)?;
    tokio::spawn(async move {
        // Upgrades let a 101 answer turn into a websocket tunnel.
        if let Err(e) = conn.with_upgrades().await {
            tracing::trace!(error = %e, "upstream connection ended");
        }
    });
    Ok(PooledConn::new(key, limits, sender))
}

fn classify_connect_error(e: &io::Error) -> UpstreamFailure {
    match e.kind() {
        io::ErrorKind::TimedOut => UpstreamFailure::ConnectTimeout,
        _ => UpstreamFailure::ConnectRefused,
    }
}

/// Outcome of sending one request on one connection.
pub enum SendOutcome {
    Response(Response<Incoming>),
    /// The connection failed before the request was written: it can be sent elsewhere as is.
    NotSent(Request<UpstreamBody>, UpstreamFailure),
    Failed(UpstreamFailure),
}

/// Sends `req` on `conn` and waits for the response head within the timeouts.
///
/// The read timeout runs from the moment the request is fully written; while a streamed body is
/// still being written, the send timeout bounds the gap between two writes, as nginx's
/// `proxy_send_timeout` does.
pub async fn send(
    conn: &mut PooledConn,
    req: Request<UpstreamBody>,
    timeouts: TryTimeouts,
) -> SendOutcome {
    let progress = req.body().progress();
    if conn.ready().await.is_err() {
        return SendOutcome::NotSent(req, UpstreamFailure::ConnectionBroken);
    }
    let fut = conn.sender().try_send_request(req);
    let result = match progress {
        None => match tokio::time::timeout(timeouts.read, fut).await {
            Ok(r) => r,
            Err(_) => return SendOutcome::Failed(UpstreamFailure::ReadTimeout),
        },
        Some(progress) => {
            let mut fut = std::pin::pin!(fut);
            loop {
                let (deadline, failure) = progress.deadline(timeouts.send, timeouts.read);
                match tokio::time::timeout_at(deadline, &mut fut).await {
                    Ok(r) => break r,
                    Err(_) => {
                        // Progress may have moved the deadline while we slept.
                        if progress.deadline(timeouts.send, timeouts.read).0 > deadline {
                            continue;
                        }
                        return SendOutcome::Failed(failure);
                    }
                }
            }
        }
    };
    match result {
        Ok(resp) => SendOutcome::Response(resp),
        Err(mut e) => {
            let failure = if e.error().is_parse() {
                UpstreamFailure::InvalidResponse
            } else {
                UpstreamFailure::ConnectionBroken
            };
            match e.take_message() {
                Some(req) => SendOutcome::NotSent(req, failure),
                None => SendOutcome::Failed(failure),
            }
        }
    }
}

/// Takes an idle pooled connection for `key`, or opens one.
pub async fn checkout(
    key: PoolKey,
    limits: PoolLimits,
    connect_timeout: Duration,
) -> Result<PooledConn, UpstreamFailure> {
    match pool::take_idle(key) {
        Some(conn) => Ok(conn),
        None => connect(key, limits, connect_timeout).await,
    }
}
