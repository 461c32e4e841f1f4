//! nginx's `send_timeout` on a connection's writes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::lifetime::HeadSignal;

pin_project_lite::pin_project! {
    /// A stream whose writes fail with `TimedOut` once one has made no progress for
    /// `send_timeout` (nginx: "the timeout is set only between two successive write
    /// operations"). The timer exists only while a write is blocked, so a client that reads
    /// costs nothing; 0 disables it.
    #[derive(Debug)]
    pub struct TimedIo<T> {
        #[pin]
        inner: T,
        send_timeout: Duration,
        // Created at the first blocked write and reset, not reallocated, after that.
        stall: Option<Pin<Box<Sleep>>>,
        stalled: bool,
        head: Option<HeadSignal>,
    }
}

impl<T> TimedIo<T> {
    pub fn new(inner: T, send_timeout: Duration) -> TimedIo<T> {
        TimedIo {
            inner,
            send_timeout,
            stall: None,
            stalled: false,
            head: None,
        }
    }

    /// Reports reads to a [`crate::ConnWatch`], which then bounds a later request's head by
    /// client_header_timeout.
    pub fn with_head_signal(mut self, head: HeadSignal) -> TimedIo<T> {
        self.head = Some(head);
        self
    }

    pub fn get_ref(&self) -> &T {
        &self.inner
    }
}

/// What a write poll returns, with the stall timer kept: disarmed on progress, armed (once)
/// when blocked, and an error when it fires.
fn watch<R>(
    cx: &mut Context<'_>,
    send_timeout: Duration,
    stall: &mut Option<Pin<Box<Sleep>>>,
    stalled: &mut bool,
    polled: Poll<io::Result<R>>,
) -> Poll<io::Result<R>> {
    match polled {
        Poll::Ready(r) => {
            *stalled = false;
            Poll::Ready(r)
        }
        Poll::Pending if send_timeout.is_zero() => Poll::Pending,
        Poll::Pending => {
            let deadline = Instant::now() + send_timeout;
            let timer = match stall {
                Some(t) => {
                    if !*stalled {
                        t.as_mut().reset(deadline);
                    }
                    t
                }
                None => stall.insert(Box::pin(tokio::time::sleep_until(deadline))),
            };
            *stalled = true;
            if timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "client timed out (send_timeout) while the response was sent",
                )));
            }
            Poll::Pending
        }
    }
}

impl<T: AsyncRead> AsyncRead for TimedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let polled = this.inner.poll_read(cx, buf);
        if let Some(head) = this.head {
            if buf.filled().len() > before {
                head.bytes_read();
            }
        }
        polled
    }
}

impl<T: AsyncWrite> AsyncWrite for TimedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let polled = this.inner.poll_write(cx, buf);
        watch(cx, *this.send_timeout, this.stall, this.stalled, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let polled = this.inner.poll_write_vectored(cx, bufs);
        watch(cx, *this.send_timeout, this.stall, this.stalled, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.project();
        let polled = this.inner.poll_flush(cx);
        watch(cx, *this.send_timeout, this.stall, this.stalled, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.project();
        let polled = this.inner.poll_shutdown(cx);
        watch(cx, *this.send_timeout, this.stall, this.stalled, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// Issue 8, finding 3: a peer that stops reading fails the write after `send_timeout`.
    #[tokio::test(start_paused = true)]
    async fn a_blocked_write_times_out() {
        let (client, _server) = tokio::io::duplex(16);
        let mut io = TimedIo::new(client, Duration::from_secs(10));
        let started = Instant::now();
        let err = io.write_all(&[0u8; 1024]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    /// Progress resets the timer: a slow reader is not cut off.
    #[tokio::test(start_paused = true)]
    async fn progress_resets_the_timer() {
        let (client, mut server) = tokio::io::duplex(16);
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 16];
            let mut total = 0;
            while total < 256 {
                tokio::time::sleep(Duration::from_secs(6)).await;
                total += tokio::io::AsyncReadExt::read(&mut server, &mut buf)
                    .await
                    .unwrap();
            }
            total
        });
        let mut io = TimedIo::new(client, Duration::from_secs(10));
        io.write_all(&[0u8; 256]).await.unwrap();
        assert!(reader.await.unwrap() >= 240);
    }

    #[tokio::test(start_paused = true)]
    async fn zero_disables_it() {
        let (client, _server) = tokio::io::duplex(16);
        let mut io = TimedIo::new(client, Duration::ZERO);
        let write = io.write_all(&[0u8; 1024]);
        assert!(tokio::time::timeout(Duration::from_secs(3600), write)
            .await
            .is_err());
    }
}
