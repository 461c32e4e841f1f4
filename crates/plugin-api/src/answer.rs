//! The upstream's answer held back before any of it goes to the client, for the plugins of
//! [`crate::Phases::UPSTREAM_ANSWER`] (ext-plugin-post-resp): they may change its status and
//! headers, read its body whole (once, up to a limit) or replace it. A body no plugin read is
//! relayed as it arrives, so holding the head back costs no buffering by itself.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use crate::ctx::{BodyError, PendingBody};

/// The upstream's answer as plugins see it in [`crate::Plugin::upstream_answer`].
pub struct UpstreamAnswer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    body: AnswerBody,
}

/// What becomes of the answer's body.
pub enum AnswerBody {
    /// Not read: relayed as it arrives (with what a read past its limit took, first).
    Stream(PendingBody),
    /// Read whole, or replaced.
    Full(Bytes),
    /// The upstream broke off while a plugin read it: the client gets the gateway's 502.
    Broken,
}

impl UpstreamAnswer {
    /// The proxy's constructor.
    pub fn new(status: StatusCode, headers: HeaderMap, body: PendingBody) -> UpstreamAnswer {
        UpstreamAnswer {
            status,
            headers,
            body: AnswerBody::Stream(body),
        }
    }

    /// The body, read whole up to `limit` bytes. Past the limit the answer is
    /// [`BodyError::TooLarge`] and nothing is lost: what was read is relayed first if the
    /// answer goes on. The upstream's read timeout bounds each wait.
    pub async fn read_body(&mut self, limit: usize) -> Result<&Bytes, BodyError> {
        if let AnswerBody::Stream(_) = &self.body {
            let AnswerBody::Stream(mut body) =
                std::mem::replace(&mut self.body, AnswerBody::Broken)
            else {
                unreachable!("checked above")
            };
            let mut buf = BytesMut::new();
            loop {
                match body.frame().await {
                    Some(Ok(frame)) => {
                        // Trailers have no place in a body read whole; they go with it.
                        if let Ok(data) = frame.into_data() {
                            buf.extend_from_slice(&data);
                            if buf.len() > limit {
                                let read = buf.len();
                                self.body = AnswerBody::Stream(Box::pin(Prefixed {
                                    first: Some(buf.freeze()),
                                    rest: body,
                                }));
                                return Err(BodyError::TooLarge(read));
                            }
                        }
                    }
                    None => {
                        self.body = AnswerBody::Full(buf.freeze());
                        break;
                    }
                    Some(Err(e)) => return Err(e),
                }
            }
        }
        match &self.body {
            AnswerBody::Full(b) if b.len() <= limit => Ok(b),
            AnswerBody::Full(b) => Err(BodyError::TooLarge(b.len())),
            AnswerBody::Stream(_) => Err(BodyError::TooLarge(limit + 1)),
            AnswerBody::Broken => Err(BodyError::Broken("the upstream's body broke off".into())),
        }
    }

    /// Replaces the body (the proxy sets its length).
    pub fn set_body(&mut self, body: Bytes) {
        self.body = AnswerBody::Full(body);
    }

    /// The proxy's side: the answer as the plugins left it.
    pub fn into_parts(self) -> (StatusCode, HeaderMap, AnswerBody) {
        (self.status, self.headers, self.body)
    }
}

/// A body whose first bytes were already read.
struct Prefixed {
    first: Option<Bytes>,
    rest: PendingBody,
}

impl Body for Prefixed {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        self.rest.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.size_hint();
        let first = self.first.as_ref().map_or(0, |b| b.len() as u64);
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + first);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + first);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Frames handed out one per poll, errors included.
    struct Frames(VecDeque<Result<Bytes, BodyError>>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = BodyError;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
            Poll::Ready(self.get_mut().0.pop_front().map(|r| r.map(Frame::data)))
        }
    }

    fn chunks(parts: &[&'static str]) -> PendingBody {
        Box::pin(Frames(
            parts
                .iter()
                .map(|p| Ok(Bytes::from_static(p.as_bytes())))
                .collect(),
        ))
    }

    async fn drain(body: AnswerBody) -> Vec<u8> {
        match body {
            AnswerBody::Stream(b) => b.collect().await.unwrap().to_bytes().to_vec(),
            AnswerBody::Full(b) => b.to_vec(),
            AnswerBody::Broken => panic!("broken"),
        }
    }

    #[tokio::test]
    async fn read_whole_then_replaced() {
        let mut a = UpstreamAnswer::new(StatusCode::OK, HeaderMap::new(), chunks(&["ab", "cd"]));
        assert_eq!(a.read_body(10).await.unwrap().as_ref(), b"abcd");
        // A second read answers the same body.
        assert_eq!(a.read_body(4).await.unwrap().as_ref(), b"abcd");
        assert!(matches!(a.read_body(3).await, Err(BodyError::TooLarge(4))));
        a.set_body(Bytes::from_static(b"new"));
        let (_, _, body) = a.into_parts();
        assert_eq!(drain(body).await, b"new");
    }

    #[tokio::test]
    async fn past_the_limit_nothing_is_lost() {
        let mut a = UpstreamAnswer::new(
            StatusCode::OK,
            HeaderMap::new(),
            chunks(&["abc", "def", "gh"]),
        );
        assert!(matches!(a.read_body(4).await, Err(BodyError::TooLarge(6))));
        let (_, _, body) = a.into_parts();
        assert_eq!(drain(body).await, b"abcdefgh");
    }

    #[tokio::test]
    async fn unread_bodies_stream_through() {
        let a = UpstreamAnswer::new(
            StatusCode::CREATED,
            HeaderMap::new(),
            chunks(&["as", " is"]),
        );
        let (status, _, body) = a.into_parts();
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(drain(body).await, b"as is");
    }

    #[tokio::test]
    async fn a_broken_body_is_reported() {
        let body: PendingBody = Box::pin(Frames(VecDeque::from([
            Ok(Bytes::from_static(b"a")),
            Err(BodyError::Broken("reset".into())),
        ])));
        let mut a = UpstreamAnswer::new(StatusCode::OK, HeaderMap::new(), body);
        assert!(matches!(a.read_body(10).await, Err(BodyError::Broken(_))));
        assert!(matches!(a.into_parts().2, AnswerBody::Broken));
    }
}
