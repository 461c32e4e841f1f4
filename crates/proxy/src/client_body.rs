//! The client's request body, whichever protocol brought it: hyper's body for HTTP/1.1 and
//! HTTP/2, the request stream's for HTTP/3. An enum rather than a generic request path: the
//! gateway's stages are compiled once, and an HTTP/1.1 body costs one match per poll.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// The HTTP/3 request stream's receiving half.
pub type H3Recv = h3::server::RequestStream<h3_quinn::RecvStream, Bytes>;

/// A request body.
pub enum ClientBody {
    /// HTTP/1.1 or HTTP/2 (hyper).
    Http(Incoming),
    /// HTTP/3.
    H3(Box<H3Body>),
}

impl std::fmt::Debug for ClientBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientBody::Http(b) => b.fmt(f),
            ClientBody::H3(_) => f.write_str("H3Body"),
        }
    }
}

/// Why a client body stopped.
#[derive(Debug)]
pub enum ClientBodyError {
    Http(hyper::Error),
    H3(h3::error::StreamError),
    /// The HTTP/3 body's DATA frames did not add up to its Content-Length (hyper checks the
    /// same for HTTP/1.1 and HTTP/2).
    Length,
}

impl std::fmt::Display for ClientBodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientBodyError::Http(e) => e.fmt(f),
            ClientBodyError::H3(e) => write!(f, "HTTP/3 request stream: {e}"),
            ClientBodyError::Length => {
                f.write_str("request body length does not match its Content-Length")
            }
        }
    }
}

impl std::error::Error for ClientBodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClientBodyError::Http(e) => Some(e),
            ClientBodyError::H3(e) => Some(e),
            ClientBodyError::Length => None,
        }
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        match self.get_mut() {
            ClientBody::Http(b) => Pin::new(b).poll_frame(cx).map_err(ClientBodyError::Http),
            ClientBody::H3(b) => b.poll_frame(cx),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Http(b) => b.is_end_stream(),
            ClientBody::H3(b) => b.is_end_stream(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Http(b) => b.size_hint(),
            ClientBody::H3(b) => b.size_hint(),
        }
    }
}

/// An HTTP/3 request body: the stream's DATA frames, then its trailers.
pub struct H3Body {
    stream: H3Recv,
    /// A chunk read before the request was handed on (see [`H3Body::new`]).
    first: Option<Bytes>,
    /// The declared Content-Length less what was read; `None` without one.
    left: Option<u64>,
    /// No more DATA frames; trailers may follow.
    data_done: bool,
    /// Nothing more at all.
    ended: bool,
}

impl H3Body {
    /// A body of `declared` bytes (Content-Length) whose first chunk, if any, was already read
    /// (`first`; `ended` when the stream had ended before any data).
    pub fn new(stream: H3Recv, declared: Option<u64>, first: Option<Bytes>, ended: bool) -> H3Body {
        let mut body = H3Body {
            stream,
            first: None,
            left: declared,
            data_done: ended,
            ended,
        };
        if let Some(chunk) = first.filter(|c| !c.is_empty()) {
            body.first = Some(chunk);
        }
        if ended && body.first.is_none() && declared.unwrap_or(0) == 0 {
            body.left = Some(0);
        }
        body
    }

    /// Counts `n` bytes against the declared length.
    fn take(&mut self, n: usize) -> Result<(), ClientBodyError> {
        if let Some(left) = &mut self.left {
            *left = left.checked_sub(n as u64).ok_or(ClientBodyError::Length)?;
        }
        Ok(())
    }

    fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        if let Some(chunk) = self.first.take() {
            return Poll::Ready(Some(self.take(chunk.len()).map(|()| Frame::data(chunk))));
        }
        if self.ended {
            return Poll::Ready(None);
        }
        while !self.data_done {
            match ready!(self.stream.poll_recv_data(cx)) {
                Ok(Some(mut buf)) => {
                    let chunk = buf.copy_to_bytes(buf.remaining());
                    if chunk.is_empty() {
                        continue;
                    }
                    return Poll::Ready(Some(self.take(chunk.len()).map(|()| Frame::data(chunk))));
                }
                Ok(None) => {
                    self.data_done = true;
                    if self.left.is_some_and(|l| l != 0) {
                        self.ended = true;
                        return Poll::Ready(Some(Err(ClientBodyError::Length)));
                    }
                }
                Err(e) => {
                    self.ended = true;
                    return Poll::Ready(Some(Err(ClientBodyError::H3(e))));
                }
            }
        }
        let trailers = ready!(self.stream.poll_recv_trailers(cx));
        self.ended = true;
        match trailers {
            Ok(Some(t)) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(ClientBodyError::H3(e)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && (self.ended || self.left == Some(0))
    }

    fn size_hint(&self) -> SizeHint {
        let buffered = self.first.as_ref().map_or(0, |c| c.len() as u64);
        match self.left {
            Some(left) => SizeHint::with_exact(left),
            None if self.ended => SizeHint::with_exact(buffered),
            None => {
                let mut hint = SizeHint::new();
                hint.set_lower(buffered);
                hint
            }
        }
    }
}
