//! What the server says about a multiplexed connection, read off its frames as hyper reads
//! them: `SETTINGS_MAX_CONCURRENT_STREAMS` and GOAWAY. hyper's client keeps the peer's settings
//! to itself; the pool needs them to know when a connection is full and when it takes no more
//! streams. Only frame headers are looked at (and SETTINGS payloads), no byte is changed.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;

const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const FLAG_ACK: u8 = 0x1;
const MAX_CONCURRENT_STREAMS: u16 = 0x3;

const WAITING: u8 = 0;
const SETTINGS_SEEN: u8 = 1;
const ENDED: u8 = 2;

/// The server's side of a connection, as far as the pool cares.
pub struct Peer {
    /// RFC 9113: no limit until the server says one.
    max_streams: AtomicU32,
    goaway: AtomicBool,
    /// [`WAITING`] until the server's first SETTINGS frame ([`SETTINGS_SEEN`]) or the end of
    /// the connection ([`ENDED`]), whichever comes first.
    settings: watch::Sender<u8>,
}

impl Peer {
    pub fn new() -> Arc<Peer> {
        Arc::new(Peer {
            max_streams: AtomicU32::new(u32::MAX),
            goaway: AtomicBool::new(false),
            settings: watch::Sender::new(WAITING),
        })
    }

    pub fn max_streams(&self) -> u32 {
        self.max_streams.load(Ordering::Relaxed)
    }

    pub fn goaway(&self) -> bool {
        self.goaway.load(Ordering::Acquire)
    }

    /// Waits for the server's first SETTINGS frame (its connection preface); `false` when the
    /// connection ended first (a server that does not speak HTTP/2).
    pub async fn settings(&self) -> bool {
        let mut rx = self.settings.subscribe();
        matches!(
            rx.wait_for(|s| *s != WAITING).await.map(|s| *s),
            Ok(SETTINGS_SEEN)
        )
    }

    /// The connection ended.
    pub fn ended(&self) {
        self.settings.send_if_modified(|s| {
            let first = *s == WAITING;
            if first {
                *s = ENDED;
            }
            first
        });
    }
}

/// The connection's I/O with its incoming frames watched.
pub struct FrameWatch<IO> {
    io: IO,
    peer: Arc<Peer>,
    head: [u8; 9],
    head_len: usize,
    /// Payload bytes of the current frame still to come (its header is complete).
    left: u32,
    /// Whether the current payload is a SETTINGS one (not an ACK).
    in_settings: bool,
    entry: [u8; 6],
    entry_len: usize,
}

impl<IO> FrameWatch<IO> {
    pub fn new(io: IO, peer: Arc<Peer>) -> Self {
        FrameWatch {
            io,
            peer,
            head: [0; 9],
            head_len: 0,
            left: 0,
            in_settings: false,
            entry: [0; 6],
            entry_len: 0,
        }
    }

    fn scan(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.left == 0 {
                let n = (9 - self.head_len).min(bytes.len());
                self.head[self.head_len..self.head_len + n].copy_from_slice(&bytes[..n]);
                self.head_len += n;
                bytes = &bytes[n..];
                if self.head_len == 9 {
                    self.head_len = 0;
                    self.frame_head();
                }
                continue;
            }
            let n = (self.left as usize).min(bytes.len());
            if self.in_settings {
                for &b in &bytes[..n] {
                    self.entry[self.entry_len] = b;
                    self.entry_len += 1;
                    if self.entry_len == 6 {
                        self.entry_len = 0;
                        self.setting();
                    }
                }
            }
            self.left -= n as u32;
            bytes = &bytes[n..];
            if self.left == 0 {
                self.frame_end();
            }
        }
    }

    fn frame_head(&mut self) {
        let h = self.head;
        let len = u32::from_be_bytes([0, h[0], h[1], h[2]]);
        let (kind, flags) = (h[3], h[4]);
        self.in_settings = kind == SETTINGS && flags & FLAG_ACK == 0;
        self.entry_len = 0;
        if kind == GOAWAY {
            self.peer.goaway.store(true, Ordering::Release);
        }
        self.left = len;
        if len == 0 {
            self.frame_end();
        }
    }

    fn setting(&mut self) {
        let e = self.entry;
        let id = u16::from_be_bytes([e[0], e[1]]);
        if id == MAX_CONCURRENT_STREAMS {
            let value = u32::from_be_bytes([e[2], e[3], e[4], e[5]]);
            self.peer.max_streams.store(value, Ordering::Relaxed);
        }
    }

    fn frame_end(&mut self) {
        if self.in_settings {
            self.in_settings = false;
            self.peer.settings.send_if_modified(|s| {
                let first = *s != SETTINGS_SEEN;
                *s = SETTINGS_SEEN;
                first
            });
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for FrameWatch<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            this.scan(&buf.filled()[before..]);
        }
        r
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for FrameWatch<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut f = len.to_be_bytes()[1..].to_vec();
        f.extend([kind, flags, 0, 0, 0, 0]);
        f.extend(payload);
        f
    }

    #[test]
    fn settings_and_goaway_across_reads() {
        let peer = Peer::new();
        let mut w = FrameWatch::new((), peer.clone());
        let mut bytes = frame(SETTINGS, 0, &[0, 4, 0, 0, 255, 255, 0, 3, 0, 0, 0, 7]);
        bytes.extend(frame(0x8, 0, &[0, 0, 1, 0]));
        bytes.extend(frame(SETTINGS, FLAG_ACK, &[]));
        // One byte at a time: frames and settings split anywhere.
        for b in &bytes[..bytes.len() - 1] {
            w.scan(std::slice::from_ref(b));
        }
        assert_eq!(peer.max_streams(), 7);
        assert_eq!(*peer.settings.borrow(), SETTINGS_SEEN);
        assert!(!peer.goaway());
        // A later SETTINGS changes the limit; an ACK's payload is none.
        w.scan(&bytes[bytes.len() - 1..]);
        w.scan(&frame(SETTINGS, 0, &[0, 3, 0, 0, 0, 2]));
        assert_eq!(peer.max_streams(), 2);
        // A DATA frame whose payload looks like a SETTINGS entry is skipped.
        w.scan(&frame(0x0, 0, &[0, 3, 0, 0, 0, 9]));
        assert_eq!(peer.max_streams(), 2);
        w.scan(&frame(GOAWAY, 0, &[0, 0, 0, 1, 0, 0, 0, 0]));
        assert!(peer.goaway());
    }

    #[test]
    fn no_limit_until_the_server_says() {
        let peer = Peer::new();
        let mut w = FrameWatch::new((), peer.clone());
        w.scan(&frame(SETTINGS, 0, &[]));
        assert_eq!(peer.max_streams(), u32::MAX);
        assert_eq!(*peer.settings.borrow(), SETTINGS_SEEN);
        // Once seen, the connection's end changes nothing.
        peer.ended();
        assert_eq!(*peer.settings.borrow(), SETTINGS_SEEN);
    }

    #[test]
    fn a_connection_that_ends_before_settings() {
        let peer = Peer::new();
        peer.ended();
        assert_eq!(*peer.settings.borrow(), ENDED);
    }
}
