//! The response body sent to clients: a complete buffer, or an upstream body relayed frame by
//! frame.
//!
//! Relaying returns the upstream connection to its pool once the body ended cleanly, enforces
//! the read timeout between two upstream reads, counts the bytes sent, and writes the access
//! log line when the response is over (whether it completed or the client went away).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::access_log::LogRecord;
use crate::balancer::TryGuard;
use crate::client::PooledConn;
use crate::phases::PendingLog;

/// Errors while relaying: the upstream broke off or stalled mid-body.
#[derive(Debug)]
pub enum RelayError {
    Upstream(hyper::Error),
    ReadTimeout,
}

impl std::fmt::Display for RelayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RelayError::Upstream(e) => write!(f, "upstream body: {e}"),
            RelayError::ReadTimeout => {
                f.write_str("upstream timed out while reading response body")
            }
        }
    }
}

impl std::error::Error for RelayError {}

pin_project! {
    /// An upstream response body on its way to the client.
    pub struct UpstreamResponse {
        inner: Incoming,
        #[pin]
        idle: Sleep,
        read_timeout: Duration,
        conn: Option<PooledConn>,
    }
}

impl UpstreamResponse {
    pub fn new(inner: Incoming, conn: Option<PooledConn>, read_timeout: Duration) -> Self {
        UpstreamResponse {
            inner,
            idle: tokio::time::sleep(read_timeout),
            read_timeout,
            conn,
        }
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind {
        Full { data: Option<Bytes> },
        Upstream { #[pin] body: UpstreamResponse },
    }
}

pin_project! {
    /// What the server sends back for every request.
    pub struct ResponseBody {
        #[pin]
        kind: Kind,
        log: LogOnDrop,
    }
}

/// Writes the access log line when the response is dropped: after the last frame, or when the
/// client disconnects early.
#[derive(Default)]
struct LogOnDrop {
    record: Option<Box<LogRecord>>,
    bytes: u64,
    /// The plugins' log phase (prometheus ...).
    plugin_log: Option<Box<PendingLog>>,
    /// Counts the request as finished in the connection statistics.
    count_request: bool,
    /// The upstream try this body relays (least_conn's count, ewma's timing).
    try_guard: Option<TryGuard>,
}

impl Drop for LogOnDrop {
    fn drop(&mut self) {
        // The try ends with the body: ewma times it to here.
        drop(self.try_guard.take());
        if let Some(mut log) = self.plugin_log.take() {
            log.run(self.bytes);
        }
        if self.count_request {
            ferrisix_plugins::prometheus::node::conn_stats().request_finished();
        }
        if let Some(mut record) = self.record.take() {
            record.body_bytes_sent = self.bytes;
            record.finish();
        }
    }
}

impl ResponseBody {
    pub fn full(data: Bytes) -> ResponseBody {
        ResponseBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
            log: LogOnDrop::default(),
        }
    }

    pub fn empty() -> ResponseBody {
        ResponseBody::full(Bytes::new())
    }

    pub fn upstream(body: UpstreamResponse) -> ResponseBody {
        ResponseBody {
            kind: Kind::Upstream { body },
            log: LogOnDrop::default(),
        }
    }

    /// Attaches the access log record written when this body is done.
    pub fn set_log(&mut self, record: Box<LogRecord>) {
        self.log.record = Some(record);
    }

    /// Attaches the plugins' log phase, run when this body is done.
    pub fn set_plugin_log(&mut self, log: Box<PendingLog>) {
        self.log.plugin_log = Some(log);
    }

    /// Keeps the upstream try open until this body is done.
    pub fn hold_try(&mut self, guard: TryGuard) {
        self.log.try_guard = Some(guard);
    }

    /// Makes the end of this body count as the end of a request (`writing` connections).
    pub fn count_request(&mut self) {
        self.log.count_request = true;
    }

    pub fn log_mut(&mut self) -> Option<&mut LogRecord> {
        self.log.record.as_deref_mut()
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = RelayError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        let this = self.project();
        let polled = match this.kind.project() {
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Upstream { body } => {
                let up = body.project();
                match Pin::new(&mut *up.inner).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        up.idle.reset(Instant::now() + *up.read_timeout);
                        // The server stops polling once the length is reached, so the
                        // connection goes back to the pool with the last frame.
                        if up.inner.is_end_stream() {
                            if let Some(conn) = up.conn.take() {
                                conn.release();
                            }
                        }
                        Poll::Ready(Some(Ok(frame)))
                    }
                    Poll::Ready(Some(Err(e))) => {
                        up.conn.take();
                        Poll::Ready(Some(Err(RelayError::Upstream(e))))
                    }
                    Poll::Ready(None) => {
                        // A complete body leaves the connection reusable.
                        if let Some(conn) = up.conn.take() {
                            conn.release();
                        }
                        Poll::Ready(None)
                    }
                    Poll::Pending => match up.idle.poll(cx) {
                        Poll::Ready(()) => {
                            up.conn.take();
                            Poll::Ready(Some(Err(RelayError::ReadTimeout)))
                        }
                        Poll::Pending => Poll::Pending,
                    },
                }
            }
        };
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(d) = frame.data_ref() {
                this.log.bytes += d.len() as u64;
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { data } => data.is_none(),
            Kind::Upstream { body } => body.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Upstream { body } => body.inner.size_hint(),
        }
    }
}
