//! The response body sent to clients: a complete buffer, or an upstream body relayed frame by
//! frame, through the plugins' body filters when a `header_filter` installed some.
//!
//! Relaying returns the upstream connection to its pool once the body ended cleanly, enforces
//! the read timeout between two upstream reads, counts the bytes sent, and carries the
//! request's log phase, which runs when the body is dropped (the response completed or the
//! client went away).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use ferrisix_plugin_api::{BodyError, BodyFilters, PendingBody};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::log::LogPhase;
use crate::upstream::balancer::TryGuard;
use crate::upstream::client::PooledConn;

/// Errors while relaying: the upstream broke off or stalled mid-body.
#[derive(Debug)]
pub enum RelayError {
    Upstream(hyper::Error),
    ReadTimeout,
    /// The body a plugin answers with in place of the upstream broke off.
    Plugin(BodyError),
}

impl std::fmt::Display for RelayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RelayError::Upstream(e) => write!(f, "upstream body: {e}"),
            RelayError::ReadTimeout => {
                f.write_str("upstream timed out while reading response body")
            }
            RelayError::Plugin(e) => write!(f, "plugin answer body: {e}"),
        }
    }
}

impl std::error::Error for RelayError {}

pin_project! {
    /// An upstream response body on its way to the client.
    pub struct UpstreamResponse {
        inner: Incoming,
        // proxy_read_timeout between two reads. Made and armed only when a read blocks after
        // progress, so a body that is already there (most responses: it came with the head)
        // never touches the timer wheel; boxed, because every move of the answer copies this
        // struct and an unarmed tokio `Sleep` would be most of it.
        idle: Option<Pin<Box<Sleep>>>,
        armed: bool,
        read_timeout: Duration,
        conn: Option<PooledConn>,
        // The upstream try this body relays (least_conn's count, ewma's timing): it ends with
        // the body.
        try_guard: Option<TryGuard>,
    }
}

impl UpstreamResponse {
    pub fn new(inner: Incoming, conn: Option<PooledConn>, read_timeout: Duration) -> Self {
        UpstreamResponse {
            inner,
            idle: None,
            armed: false,
            read_timeout,
            conn,
            try_guard: None,
        }
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind {
        Full { data: Option<Bytes> },
        Upstream { #[pin] body: UpstreamResponse },
        // A plugin's answer in place of the upstream, relayed as it arrives.
        Stream { body: PendingBody },
    }
}

pin_project! {
    /// What the server sends back for every request.
    pub struct ResponseBody {
        #[pin]
        kind: Kind,
        // The plugins' body filters; `None` without any.
        filters: Option<Box<BodyFilters>>,
        // The filters ended the body (their last chunk went out).
        filtered_end: bool,
        // The request's log phase, run when this body is dropped. Boxed: the answer is moved
        // from future to future on its way out, several times per request, and inline the
        // phase would make every one of those copies larger than the rest of the answer.
        log: Option<Box<LogPhase>>,
    }
}

impl ResponseBody {
    pub fn full(data: Bytes) -> ResponseBody {
        ResponseBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
            filters: None,
            filtered_end: false,
            log: None,
        }
    }

    pub fn empty() -> ResponseBody {
        ResponseBody::full(Bytes::new())
    }

    pub fn upstream(body: UpstreamResponse) -> ResponseBody {
        ResponseBody {
            kind: Kind::Upstream { body },
            filters: None,
            filtered_end: false,
            log: None,
        }
    }

    /// The body of a plugin's answer in place of the upstream, relayed as it arrives.
    pub fn stream(body: PendingBody) -> ResponseBody {
        ResponseBody {
            kind: Kind::Stream { body },
            filters: None,
            filtered_end: false,
            log: None,
        }
    }

    /// Hands the request's log phase to this body: it runs when the body is done.
    pub fn set_log(&mut self, log: LogPhase) {
        self.log = Some(Box::new(log));
    }

    pub fn log_mut(&mut self) -> Option<&mut LogPhase> {
        self.log.as_deref_mut()
    }

    /// Keeps the upstream try open until this body is done (or dropped unread).
    pub fn hold_try(&mut self, guard: TryGuard) {
        if let Kind::Upstream { body } = &mut self.kind {
            body.try_guard = Some(guard);
        }
    }

    /// Runs the body through `filters` on its way out.
    pub fn set_filters(&mut self, filters: BodyFilters) {
        if !filters.is_empty() {
            self.filters = Some(Box::new(filters));
        }
    }

    /// Replaces the body with `data` (an upstream body is dropped unread, its connection
    /// closed).
    pub fn replace(&mut self, data: Bytes) {
        self.kind = Kind::Full {
            data: (!data.is_empty()).then_some(data),
        };
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = RelayError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        let mut this = self.project();
        if *this.filtered_end {
            // The upstream's trailers, as the filters left them, follow the last chunk.
            let trailers = this
                .filters
                .as_deref_mut()
                .and_then(BodyFilters::take_trailers);
            return Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t))));
        }
        loop {
            let polled = poll_kind(this.kind.as_mut(), cx);
            let Some(filters) = this.filters.as_deref_mut() else {
                if let Poll::Ready(Some(Ok(frame))) = &polled {
                    if let (Some(d), Some(log)) = (frame.data_ref(), this.log.as_mut()) {
                        log.sent(d);
                    }
                }
                return polled;
            };
            // Through the filters: each data chunk, then the end of the stream once.
            let (data, end) = match polled {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        let end = this.kind.as_ref().is_end();
                        (data, end)
                    }
                    // Trailers go to the filters, then after the last chunk.
                    Err(frame) => match frame.into_trailers() {
                        Ok(trailers) => {
                            filters.trailers(trailers);
                            continue;
                        }
                        Err(frame) => return Poll::Ready(Some(Ok(frame))),
                    },
                },
                Poll::Ready(None) => (Bytes::new(), true),
                other => return other,
            };
            let chunk = filters.run(data, end);
            if chunk.end {
                *this.filtered_end = true;
                // A filter may end the body early: what the upstream still sends is dropped,
                // and so is its connection.
                this.kind.as_mut().abandon();
            }
            if !chunk.data.is_empty() {
                if let Some(log) = this.log.as_mut() {
                    log.sent(&chunk.data);
                }
                return Poll::Ready(Some(Ok(Frame::data(chunk.data))));
            }
            if chunk.end {
                let trailers = filters.take_trailers();
                return Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        if self.filters.is_some() {
            return self.filtered_end;
        }
        self.kind.is_end()
    }

    fn size_hint(&self) -> SizeHint {
        if self.filters.is_some() {
            // Filters may change the length: unknown until the end.
            return SizeHint::default();
        }
        match &self.kind {
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Upstream { body } => body.inner.size_hint(),
            Kind::Stream { body } => body.size_hint(),
        }
    }
}

impl Kind {
    fn is_end(&self) -> bool {
        match self {
            Kind::Full { data } => data.is_none(),
            Kind::Upstream { body } => body.inner.is_end_stream(),
            Kind::Stream { body } => body.is_end_stream(),
        }
    }

    /// Stops reading: an upstream connection whose body was not read to its end is closed.
    fn abandon(self: Pin<&mut Self>) {
        if let KindProj::Upstream { body } = self.project() {
            body.project().conn.take();
        }
    }
}

fn poll_kind(
    kind: Pin<&mut Kind>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
    {
        match kind.project() {
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Stream { body } => match body.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(RelayError::Plugin(e)))),
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
            KindProj::Upstream { body } => {
                let up = body.project();
                match Pin::new(&mut *up.inner).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        *up.armed = false;
                        // The server stops polling once the length is reached, so the
                        // connection goes back to the pool with the last frame.
                        if up.inner.is_end_stream() {
                            if let Some(conn) = up.conn.take() {
                                conn.release();
                            }
                            // The try is over with its last frame.
                            up.try_guard.take();
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
                        up.try_guard.take();
                        Poll::Ready(None)
                    }
                    Poll::Pending => {
                        let idle = match up.idle {
                            Some(idle) if *up.armed => idle,
                            Some(idle) => {
                                idle.as_mut().reset(Instant::now() + *up.read_timeout);
                                *up.armed = true;
                                idle
                            }
                            None => {
                                *up.armed = true;
                                up.idle
                                    .insert(Box::pin(tokio::time::sleep(*up.read_timeout)))
                            }
                        };
                        match idle.as_mut().poll(cx) {
                            Poll::Ready(()) => {
                                up.conn.take();
                                Poll::Ready(Some(Err(RelayError::ReadTimeout)))
                            }
                            Poll::Pending => Poll::Pending,
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_plugin_api::{BodyChunk, BodyFilter};
    use http_body_util::BodyExt;

    use super::*;

    /// Wraps the body and, with `stop`, ends it at the first chunk.
    struct Wrap {
        stop: bool,
        started: bool,
    }

    impl BodyFilter for Wrap {
        fn filter(&mut self, chunk: &mut BodyChunk) {
            let mut out = Vec::new();
            if !self.started {
                out.extend_from_slice(b"<");
                self.started = true;
            }
            out.extend_from_slice(&chunk.data);
            if self.stop {
                chunk.end = true;
            }
            if chunk.end {
                out.extend_from_slice(b">");
            }
            chunk.data = Bytes::from(out);
        }
    }

    fn filtered(body: &'static str, stop: bool) -> ResponseBody {
        let mut b = ResponseBody::full(Bytes::from_static(body.as_bytes()));
        let mut filters = BodyFilters::default();
        filters.push(Box::new(Wrap {
            stop,
            started: false,
        }));
        b.set_filters(filters);
        b
    }

    #[tokio::test]
    async fn filters_run_on_the_way_out() {
        let b = filtered("abc", false);
        assert_eq!(b.size_hint().exact(), None, "the length may change");
        assert_eq!(b.collect().await.unwrap().to_bytes(), "<abc>");
        // An empty body still gets the end of the stream through the filters.
        assert_eq!(
            filtered("", false).collect().await.unwrap().to_bytes(),
            "<>"
        );
        assert_eq!(
            filtered("abc", true).collect().await.unwrap().to_bytes(),
            "<abc>"
        );
        // Replacing the body: the filters see the replacement.
        let mut b = filtered("abc", false);
        b.replace(Bytes::from_static(b"xyz"));
        assert_eq!(b.collect().await.unwrap().to_bytes(), "<xyz>");
        // Without filters the length is known.
        assert_eq!(
            ResponseBody::full(Bytes::from_static(b"abc"))
                .size_hint()
                .exact(),
            Some(3)
        );
    }
}
