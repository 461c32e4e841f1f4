//! Request bodies sent upstream.
//!
//! Small bodies are read completely first (as nginx's `proxy_request_buffering` does), so a
//! failed try can be replayed to the next node. Large or unknown-length bodies are streamed
//! frame by frame with backpressure, so a 1 GiB upload never sits in memory; such a request can
//! only be retried while nothing of it was sent.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use ferrisix_plugin_api::{BodyError, PendingBody};
use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

use crate::client_body::ClientBody;
use crate::error::{ErrorKind, ProxyError};

/// nginx's `client_body_timeout` default, until [`UpstreamBody::client_timeout`] sets the
/// gateway's.
const DEFAULT_CLIENT_GAP: Duration = Duration::from_secs(60);

/// What a streamed body fails with (the client's body broke, or passed the limit).
pub type StreamError = Box<dyn std::error::Error + Send + Sync>;

/// Tracks how far a streamed request body got, so the timeouts measure the gap between two
/// steps rather than the whole upload: the send timeout while the upstream is slow to take the
/// body, `client_body_timeout` while the client is slow to send it.
#[derive(Clone, Debug)]
pub struct SendProgress(Arc<ProgressInner>);

#[derive(Debug)]
struct ProgressInner {
    base: Instant,
    last_ms: AtomicU64,
    done: AtomicBool,
    /// The body passed the route's size limit while it streamed.
    too_large: AtomicBool,
    /// The client's body broke off while it streamed (a read error, a refused chunk size).
    client_broke: AtomicBool,
    /// The body was asked for its next frame and the client has not sent it yet (since
    /// `last_ms`).
    waiting_on_client: AtomicBool,
    /// nginx's `client_body_timeout`, in milliseconds: the longest such wait.
    client_gap_ms: AtomicU64,
}

impl SendProgress {
    fn new() -> SendProgress {
        SendProgress(Arc::new(ProgressInner {
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
            done: AtomicBool::new(false),
            too_large: AtomicBool::new(false),
            client_broke: AtomicBool::new(false),
            waiting_on_client: AtomicBool::new(false),
            client_gap_ms: AtomicU64::new(DEFAULT_CLIENT_GAP.as_millis() as u64),
        }))
    }

    fn touch(&self) {
        let ms = self.0.base.elapsed().as_millis() as u64;
        self.0.last_ms.store(ms, Ordering::Relaxed);
    }

    fn finish(&self) {
        self.touch();
        self.0.done.store(true, Ordering::Relaxed);
    }

    /// When the current phase times out, and which failure that is: the upstream's answer
    /// once the body is sent (`read`), the client's next part while the body waits on it
    /// (`client_body_timeout`, 408), else the upstream taking the body (`send`).
    pub fn deadline(&self, send: Duration, read: Duration) -> (Instant, ProxyError) {
        let p = &self.0;
        let last = p.base + Duration::from_millis(p.last_ms.load(Ordering::Relaxed));
        if p.done.load(Ordering::Relaxed) {
            (last + read, ErrorKind::ReadTimeout.into())
        } else if p.waiting_on_client.load(Ordering::Relaxed) {
            (last + self.client_gap(), ErrorKind::BodyTimeout.into())
        } else {
            (last + send, ErrorKind::SendTimeout.into())
        }
    }

    /// The longest wait for the client's next part (`client_body_timeout`).
    pub fn client_gap(&self) -> Duration {
        Duration::from_millis(self.0.client_gap_ms.load(Ordering::Relaxed))
    }

    /// A frame came (or the body ended): no longer waiting on the client.
    fn arrived(&self) {
        self.0.waiting_on_client.store(false, Ordering::Relaxed);
    }

    /// The body was asked for a frame the client has not sent: the wait starts now, unless
    /// it already started.
    fn waiting(&self) {
        if !self.0.waiting_on_client.load(Ordering::Relaxed) {
            self.touch();
            self.0.waiting_on_client.store(true, Ordering::Relaxed);
        }
    }

    /// Whether the body was cut off at the route's size limit.
    pub fn too_large(&self) -> bool {
        self.0.too_large.load(Ordering::Relaxed)
    }

    /// Whether the client's body failed while it streamed (the client's fault, not the
    /// upstream's: nginx answers 400 and tries no other node).
    pub fn client_broke(&self) -> bool {
        self.0.client_broke.load(Ordering::Relaxed)
    }
}

/// Where a streamed body comes from.
pub enum StreamSource {
    /// The client's body, untouched by plugins.
    Client(ClientBody),
    /// The rest of a body the request phases started to read.
    Pending(PendingBody),
}

impl std::fmt::Debug for StreamSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StreamSource::Client(_) => "Client",
            StreamSource::Pending(_) => "Pending",
        })
    }
}

impl Body for StreamSource {
    type Data = Bytes;
    type Error = StreamError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StreamError>>> {
        match self.get_mut() {
            StreamSource::Client(b) => Pin::new(b).poll_frame(cx).map_err(|e| e.into()),
            StreamSource::Pending(b) => b.as_mut().poll_frame(cx).map_err(|e| e.into()),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            StreamSource::Client(b) => b.is_end_stream(),
            StreamSource::Pending(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            StreamSource::Client(b) => b.size_hint(),
            StreamSource::Pending(b) => b.size_hint(),
        }
    }
}

/// The body of a request sent upstream.
#[derive(Debug)]
pub enum UpstreamBody {
    Empty,
    /// A complete body; `None` once it was yielded.
    Full(Option<Bytes>),
    Stream {
        /// What was read before deciding to stream (sent first).
        prefix: Option<Bytes>,
        inner: StreamSource,
        progress: SendProgress,
        /// Whether any frame was taken from the client yet (after that, no replay).
        started: bool,
        /// Bytes left before the route's size limit; `None`: no limit.
        left: Option<u64>,
    },
}

impl UpstreamBody {
    pub fn full(bytes: Bytes) -> UpstreamBody {
        if bytes.is_empty() {
            UpstreamBody::Empty
        } else {
            UpstreamBody::Full(Some(bytes))
        }
    }

    pub fn stream(inner: ClientBody) -> UpstreamBody {
        Self::stream_after(None, StreamSource::Client(inner))
    }

    /// Streams `inner` after sending `prefix`, the part already read from the client.
    pub fn stream_after(prefix: Option<Bytes>, inner: StreamSource) -> UpstreamBody {
        UpstreamBody::Stream {
            prefix: prefix.filter(|p| !p.is_empty()),
            inner,
            progress: SendProgress::new(),
            started: false,
            left: None,
        }
    }

    /// Holds the body to `limit` bytes in all: what is already read is checked now, the rest
    /// of a stream is cut off when it passes the limit.
    pub fn limit(mut self, limit: u64) -> Result<UpstreamBody, ProxyError> {
        let read = match &self {
            UpstreamBody::Empty => 0,
            UpstreamBody::Full(b) => b.as_ref().map_or(0, |b| b.len() as u64),
            UpstreamBody::Stream { prefix, .. } => prefix.as_ref().map_or(0, |p| p.len() as u64),
        };
        if read > limit {
            return Err(ErrorKind::BodyTooLarge.into());
        }
        if let UpstreamBody::Stream { left, .. } = &mut self {
            *left = Some(limit - read);
        }
        Ok(self)
    }

    /// Bounds each wait for the client's next part of a streamed body by `gap` (nginx's
    /// `client_body_timeout`, which holds for a body however it is read).
    pub fn client_timeout(self, gap: Duration) -> UpstreamBody {
        if let UpstreamBody::Stream { progress, .. } = &self {
            let ms = u64::try_from(gap.as_millis()).unwrap_or(u64::MAX);
            progress.0.client_gap_ms.store(ms, Ordering::Relaxed);
        }
        self
    }

    /// A copy for another try, when the body can be replayed.
    pub fn try_clone(&self) -> Option<UpstreamBody> {
        match self {
            UpstreamBody::Empty => Some(UpstreamBody::Empty),
            UpstreamBody::Full(b) => Some(UpstreamBody::Full(b.clone())),
            UpstreamBody::Stream { .. } => None,
        }
    }

    pub fn is_replayable(&self) -> bool {
        !matches!(self, UpstreamBody::Stream { .. })
    }

    pub fn progress(&self) -> Option<SendProgress> {
        match self {
            UpstreamBody::Stream { progress, .. } => Some(progress.clone()),
            _ => None,
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = StreamError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StreamError>>> {
        match self.get_mut() {
            UpstreamBody::Empty => Poll::Ready(None),
            UpstreamBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            UpstreamBody::Stream {
                prefix,
                inner,
                progress,
                started,
                left,
            } => {
                if let Some(p) = prefix.take() {
                    *started = true;
                    progress.touch();
                    return Poll::Ready(Some(Ok(Frame::data(p))));
                }
                let polled = Pin::new(&mut *inner).poll_frame(cx);
                if polled.is_pending() {
                    progress.waiting();
                } else {
                    progress.arrived();
                }
                match &polled {
                    Poll::Ready(Some(Err(e))) => {
                        *started = true;
                        // A plugin's body read that stalled stays a timeout.
                        if !matches!(e.downcast_ref::<BodyError>(), Some(BodyError::Timeout)) {
                            progress.0.client_broke.store(true, Ordering::Relaxed);
                        }
                    }
                    Poll::Ready(Some(frame)) => {
                        *started = true;
                        progress.touch();
                        let len = frame
                            .as_ref()
                            .ok()
                            .and_then(Frame::data_ref)
                            .map_or(0, |d| d.len() as u64);
                        if let Some(left) = left {
                            if len > *left {
                                progress.0.too_large.store(true, Ordering::Relaxed);
                                let error = BodyError::TooLarge(len as usize);
                                return Poll::Ready(Some(Err(error.into())));
                            }
                            *left -= len;
                        }
                    }
                    Poll::Ready(None) => progress.finish(),
                    Poll::Pending => {}
                }
                polled
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Empty => true,
            UpstreamBody::Full(b) => b.is_none(),
            UpstreamBody::Stream { prefix, inner, .. } => prefix.is_none() && inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Empty => SizeHint::with_exact(0),
            UpstreamBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            UpstreamBody::Stream { prefix, inner, .. } => {
                let extra = prefix.as_ref().map_or(0, |p| p.len() as u64);
                let inner = inner.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower() + extra);
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper + extra);
                }
                hint
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    /// A client body of ready chunks, which then ends, or (`stalls`) sends nothing more.
    struct Chunks {
        parts: std::collections::VecDeque<Bytes>,
        stalls: bool,
    }

    impl Body for Chunks {
        type Data = Bytes;
        type Error = BodyError;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
            let this = self.get_mut();
            match this.parts.pop_front() {
                Some(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
                None if this.stalls => Poll::Pending,
                None => Poll::Ready(None),
            }
        }
    }

    fn stream(prefix: &'static str, chunks: &[&'static str]) -> UpstreamBody {
        let body: PendingBody = Box::pin(Chunks {
            parts: chunks
                .iter()
                .map(|c| Bytes::from_static(c.as_bytes()))
                .collect(),
            stalls: false,
        });
        UpstreamBody::stream_after(
            Some(Bytes::from_static(prefix.as_bytes())),
            StreamSource::Pending(body),
        )
    }

    #[tokio::test]
    async fn a_limit_cuts_a_stream_off_and_says_so() {
        let body = stream("ab", &["cd", "ef"]).limit(6).unwrap();
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abcdef");

        let body = stream("ab", &["cd", "ef"]).limit(5).unwrap();
        let progress = body.progress().unwrap();
        assert!(body.collect().await.is_err());
        assert!(progress.too_large());

        // What was read already is checked at once.
        assert!(stream("abcdef", &[]).limit(5).is_err());
        assert!(UpstreamBody::full(Bytes::from_static(b"abcdef"))
            .limit(5)
            .is_err());
        assert!(UpstreamBody::full(Bytes::from_static(b"abc"))
            .limit(5)
            .is_ok());
    }

    /// The send timeout bounds the upstream taking the body, `client_body_timeout` the client
    /// sending it, and the read timeout the answer once it is all sent.
    #[tokio::test(start_paused = true)]
    async fn each_wait_gets_its_own_timeout() {
        let (send, read, gap) = (
            Duration::from_secs(60),
            Duration::from_secs(30),
            Duration::from_secs(2),
        );
        let source: PendingBody = Box::pin(Chunks {
            parts: [Bytes::from_static(b"abc")].into(),
            stalls: true,
        });
        let mut body =
            UpstreamBody::stream_after(None, StreamSource::Pending(source)).client_timeout(gap);
        let progress = body.progress().unwrap();
        assert_eq!(progress.client_gap(), gap);
        let kind = |p: &SendProgress| p.deadline(send, read).1.kind;
        let start = Instant::now();
        // Not yet asked for anything: the upstream has not taken the body.
        assert_eq!(kind(&progress), ErrorKind::SendTimeout);
        assert!(body.frame().await.unwrap().is_ok());
        assert_eq!(kind(&progress), ErrorKind::SendTimeout);
        // Asked for the next part, which the client does not send.
        tokio::time::advance(Duration::from_secs(5)).await;
        let waited = tokio::time::timeout(Duration::from_millis(10), body.frame()).await;
        assert!(waited.is_err());
        let (deadline, failure) = progress.deadline(send, read);
        assert_eq!(failure.kind, ErrorKind::BodyTimeout);
        assert_eq!(deadline - start, Duration::from_secs(5) + gap);
        // Asked again later: the wait still counts from its start.
        tokio::time::advance(Duration::from_secs(1)).await;
        let waited = tokio::time::timeout(Duration::from_millis(10), body.frame()).await;
        assert!(waited.is_err());
        assert_eq!(progress.deadline(send, read).0, deadline);
        // Streams with no wait on the client keep the default.
        let other = stream("ab", &[]).progress().unwrap();
        assert_eq!(other.client_gap(), DEFAULT_CLIENT_GAP);
    }
}
