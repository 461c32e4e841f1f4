//! nginx's bound on chunk sizes, which hyper's HTTP/1.1 decoder lacks.
//!
//! nginx keeps a chunk's size in an `off_t`: a size line past 2^63 - 1 is "client sent invalid
//! chunked body" and the request gets 400 at once. hyper 1.x takes any size that fits a `u64`
//! and then waits for that many bytes, so `ffffffffffffffff` held the request until
//! `client_body_timeout` (408). hyper offers no hook: its chunked decoder is private, the body
//! it hands out reports no size hint for chunked messages, and its frames carry no chunk
//! boundaries. A scan of the raw bytes for a long hex line would misfire on body content.
//!
//! So [`FramingGuard`] follows the request framing of the bytes hyper reads, with the rules
//! hyper's server applies (httparse for the head, then `Transfer-Encoding` / `Content-Length`
//! as `proto::h1::role` decides them, then the chunked grammar of `proto::h1::decode`): it knows
//! where each head, body and chunk-size line is, as hyper does. The moment a chunk-size line
//! passes 2^63 - 1 it hands hyper only the bytes before that digit and fails the next read, so
//! hyper's body reports an error at once (the proxy answers 400, as for any broken body, and
//! the connection closes).
//!
//! It never refuses anything else. Whatever it cannot follow exactly (HTTP/2, an upgrade, a head
//! hyper refuses, a head past hyper's buffer) turns it off for the rest of the connection: at
//! worst the old behaviour, never a false refusal.

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// nginx's `NGX_MAX_OFF_T_VALUE`: the largest chunk size it takes.
pub const MAX_CHUNK_SIZE: u64 = i64::MAX as u64;

/// How many header fields a head may have (hyper's limit, [`crate::MAX_HEADERS`]).
const HEAD_FIELDS: usize = crate::MAX_HEADERS;

/// A partial head longer than hyper's read buffer is refused by hyper (431): not followed.
const MAX_HEAD: usize = 64 * 1024 + 1024;

/// What a read fails with once a chunk size passed [`MAX_CHUNK_SIZE`] (the `io::Error`'s
/// inner error, so callers can tell it from a broken connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkSizeTooLarge;

impl std::fmt::Display for ChunkSizeTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("client sent invalid chunked body: chunk size past 2^63-1")
    }
}

impl std::error::Error for ChunkSizeTooLarge {}

impl ChunkSizeTooLarge {
    fn io_error() -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, ChunkSizeTooLarge)
    }
}

/// Where the byte stream is, in hyper's chunked grammar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chunk {
    /// The first hex digit of a size line.
    Start,
    Size,
    /// Spaces or tabs after the size.
    SizeLws,
    Extension,
    SizeLf,
    /// Data bytes left in the chunk.
    Data(u64),
    DataCr,
    DataLf,
    /// After the last chunk: `\r` ends the message, anything else starts a trailer line.
    EndCr,
    Trailer,
    TrailerLf,
    EndLf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Reading a request head.
    Head,
    /// Body bytes left of a `Content-Length` body.
    Length(u64),
    Chunked(Chunk),
    /// Not followed any more (see the module docs).
    Off,
}

/// The request framing of one HTTP/1.1 connection's inbound bytes.
#[derive(Debug)]
pub struct RequestFraming {
    state: State,
    /// The size of the chunk whose size line is being read.
    size: u64,
    /// A head that did not arrive in one read, so far.
    head: Vec<u8>,
}

impl Default for RequestFraming {
    fn default() -> Self {
        RequestFraming {
            state: State::Head,
            size: 0,
            head: Vec::new(),
        }
    }
}

/// The outcome of [`RequestFraming::feed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feed {
    /// Everything is fine so far.
    Ok,
    /// The byte at this index of the input made a chunk size pass [`MAX_CHUNK_SIZE`].
    ChunkTooLarge(usize),
}

impl RequestFraming {
    /// Whether it stopped following the connection.
    pub fn is_off(&self) -> bool {
        self.state == State::Off
    }

    /// Follows `data`, the next bytes of the connection.
    pub fn feed(&mut self, data: &[u8]) -> Feed {
        let mut pos = 0;
        while pos < data.len() {
            match self.state {
                State::Off => return Feed::Ok,
                State::Head => match self.head_from(&data[pos..]) {
                    Some(used) => pos += used,
                    None => return Feed::Ok,
                },
                State::Length(left) => {
                    let take = left.min((data.len() - pos) as u64);
                    pos += take as usize;
                    self.state = match left - take {
                        0 => State::Head,
                        n => State::Length(n),
                    };
                }
                State::Chunked(Chunk::Data(left)) => {
                    let take = left.min((data.len() - pos) as u64);
                    pos += take as usize;
                    self.state = State::Chunked(match left - take {
                        0 => Chunk::DataCr,
                        n => Chunk::Data(n),
                    });
                }
                State::Chunked(chunk) => {
                    match self.chunk_byte(chunk, data[pos]) {
                        Ok(next) => self.state = next,
                        Err(()) => return Feed::ChunkTooLarge(pos),
                    }
                    pos += 1;
                }
            }
        }
        Feed::Ok
    }

    /// Reads a head from `rest` (after what an earlier read left). `Some(n)`: the head ended
    /// `n` bytes into `rest` (the state is then its body's); `None`: all of `rest` was taken.
    ///
    /// A head is parsed only once an empty line may have ended it (and the empty lines httparse
    /// skips before a request line are skipped here), so a head trickled in byte by byte costs
    /// one parse, not one per read.
    fn head_from(&mut self, rest: &[u8]) -> Option<usize> {
        let carried = self.head.len();
        if carried == 0 {
            let skipped = rest
                .iter()
                .take_while(|b| matches!(b, b'\r' | b'\n'))
                .count();
            let rest = &rest[skipped..];
            if rest.is_empty() {
                return None;
            }
            return match scan_head(rest) {
                Head::Complete(len, next) => {
                    self.state = next;
                    self.size = 0;
                    Some(skipped + len)
                }
                Head::Partial => {
                    self.carry(rest);
                    None
                }
                Head::Unfollowable => {
                    self.turn_off();
                    None
                }
            };
        }
        self.head.extend_from_slice(rest);
        // The carried bytes held no empty line; one may straddle the read boundary.
        if !has_blank_line(&self.head[carried.saturating_sub(2)..]) {
            if self.head.len() > MAX_HEAD {
                self.turn_off();
            }
            return None;
        }
        match scan_head(&self.head) {
            Head::Complete(len, next) => {
                self.state = next;
                self.size = 0;
                // Release a large carry rather than hold it for the connection's life.
                if self.head.capacity() > 4096 {
                    self.head = Vec::new();
                } else {
                    self.head.clear();
                }
                // The carried bytes never held a whole head, so it ends in `rest`.
                Some(len - carried)
            }
            Head::Partial => {
                if self.head.len() > MAX_HEAD {
                    self.turn_off();
                }
                None
            }
            Head::Unfollowable => {
                self.turn_off();
                None
            }
        }
    }

    /// Keeps the start of a head that did not end in this read.
    fn carry(&mut self, part: &[u8]) {
        if part.len() > MAX_HEAD {
            self.turn_off();
        } else {
            self.head.extend_from_slice(part);
        }
    }

    fn turn_off(&mut self) {
        self.state = State::Off;
        self.head = Vec::new();
    }

    /// One byte of the chunked framing, as hyper's `ChunkedState::step` reads it; `Err` when
    /// the size passes [`MAX_CHUNK_SIZE`]. What hyper refuses turns the guard off (hyper fails
    /// the body itself).
    fn chunk_byte(&mut self, chunk: Chunk, b: u8) -> Result<State, ()> {
        let off = Ok(State::Off);
        let to = |c| Ok(State::Chunked(c));
        match chunk {
            Chunk::Start | Chunk::Size => {
                if let Some(d) = hex(b) {
                    let size = self
                        .size
                        .checked_mul(16)
                        .and_then(|s| s.checked_add(d))
                        .filter(|s| *s <= MAX_CHUNK_SIZE)
                        .ok_or(())?;
                    self.size = size;
                    return to(Chunk::Size);
                }
                if chunk == Chunk::Start {
                    return off;
                }
                match b {
                    b'\t' | b' ' => to(Chunk::SizeLws),
                    b';' => to(Chunk::Extension),
                    b'\r' => to(Chunk::SizeLf),
                    _ => off,
                }
            }
            Chunk::SizeLws => match b {
                b'\t' | b' ' => to(Chunk::SizeLws),
                b';' => to(Chunk::Extension),
                b'\r' => to(Chunk::SizeLf),
                _ => off,
            },
            Chunk::Extension => match b {
                b'\r' => to(Chunk::SizeLf),
                b'\n' => off,
                _ => to(Chunk::Extension),
            },
            Chunk::SizeLf => match b {
                b'\n' => {
                    let size = std::mem::take(&mut self.size);
                    to(if size == 0 {
                        Chunk::EndCr
                    } else {
                        Chunk::Data(size)
                    })
                }
                _ => off,
            },
            // Handled in bulk by `feed`; a zero-length remainder cannot occur.
            Chunk::Data(_) => to(Chunk::DataCr),
            Chunk::DataCr => match b {
                b'\r' => to(Chunk::DataLf),
                _ => off,
            },
            Chunk::DataLf => match b {
                b'\n' => to(Chunk::Start),
                _ => off,
            },
            Chunk::EndCr => match b {
                b'\r' => to(Chunk::EndLf),
                _ => to(Chunk::Trailer),
            },
            Chunk::Trailer => match b {
                b'\r' => to(Chunk::TrailerLf),
                _ => to(Chunk::Trailer),
            },
            Chunk::TrailerLf => match b {
                b'\n' => to(Chunk::EndCr),
                _ => off,
            },
            Chunk::EndLf => match b {
                b'\n' => Ok(State::Head),
                _ => off,
            },
        }
    }
}

/// Whether `buf` holds an empty line (`\n\n` or `\n\r\n`), which is where a head ends.
fn has_blank_line(buf: &[u8]) -> bool {
    buf.iter().enumerate().any(|(i, &b)| {
        b == b'\n'
            && match buf.get(i + 1) {
                Some(b'\n') => true,
                Some(b'\r') => buf.get(i + 2) == Some(&b'\n'),
                _ => false,
            }
    })
}

fn hex(b: u8) -> Option<u64> {
    match b {
        b'0'..=b'9' => Some(u64::from(b - b'0')),
        b'a'..=b'f' => Some(u64::from(b - b'a' + 10)),
        b'A'..=b'F' => Some(u64::from(b - b'A' + 10)),
        _ => None,
    }
}

enum Head {
    /// The head's length and what follows it.
    Complete(usize, State),
    Partial,
    /// hyper refuses it, or it leaves HTTP/1.1 (HTTP/2's preface, an upgrade).
    Unfollowable,
}

/// The head at the start of `buf` (no empty lines before it) and its body's framing, as
/// hyper's `Server::parse` decides them; `Partial` while no empty line has ended it.
///
/// Most heads carry none of the fields that frame a body, so they are checked line by line
/// first, without a full parse: a head whose request line ends in `HTTP/1.1` or `HTTP/1.0`, whose
/// method is not `CONNECT`, and whose every field line has a name (before its first `:`, trailing
/// blanks aside) other than `Transfer-Encoding`, `Content-Length` and `Upgrade` ends at its
/// first empty line and has no body, for hyper as for httparse. Only a line whose first letter
/// is `t`, `c` or `u` can name one of those, so only such lines are looked into. Anything else
/// (those fields, such a line without a colon, an obsolete line fold, another version) goes to
/// [`parse_head`]. A head this check passes that hyper still refuses (a bad character
/// somewhere, a field line without a colon) ends the connection, so what the guard believes of
/// it never matters.
fn scan_head(buf: &[u8]) -> Head {
    let mut start = 0;
    let mut first = true;
    // One search over the head for its line ends, not one per line, and a second search (the
    // colon) only in the lines whose first letter can begin a framing field's name. (A search
    // eight bytes at a time, without vectors, cost more on a browser's long header lines than
    // memchr's vector loop: `benches/e2e/instructions.py --browser` counts it.)
    for nl in memchr::memchr_iter(b'\n', buf) {
        let line = &buf[start..nl];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        start = nl + 1;
        if first {
            first = false;
            let version = line.len() >= 9 && {
                let (rest, v) = line.split_at(line.len() - 9);
                !rest.is_empty() && (v == b" HTTP/1.1" || v == b" HTTP/1.0")
            };
            if !version || line.starts_with(b"CONNECT ") {
                return parse_head(buf);
            }
            continue;
        }
        let Some(&lead) = line.first() else {
            return Head::Complete(start, State::Head);
        };
        if matches!(lead, b' ' | b'\t') {
            return parse_head(buf);
        }
        // Transfer-Encoding, Content-Length and Upgrade: any other first letter is another
        // field (or a line hyper refuses, which ends the connection).
        if !matches!(lead | 0x20, b't' | b'c' | b'u') {
            continue;
        }
        let Some(colon) = memchr::memchr(b':', line) else {
            return parse_head(buf);
        };
        let name = line[..colon].trim_ascii_end();
        if name.eq_ignore_ascii_case(b"transfer-encoding")
            || name.eq_ignore_ascii_case(b"content-length")
            || name.eq_ignore_ascii_case(b"upgrade")
        {
            return parse_head(buf);
        }
    }
    Head::Partial
}

/// A request head and its body's framing, as hyper's `Server::parse` decides them.
fn parse_head(buf: &[u8]) -> Head {
    let mut fields = [MaybeUninit::<httparse::Header<'_>>::uninit(); HEAD_FIELDS];
    let mut req = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut req,
        buf,
        &mut fields,
    ) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Head::Partial,
        Err(_) => return Head::Unfollowable,
    };
    let http11 = req.version == Some(1);
    if req.method == Some("CONNECT") {
        return Head::Unfollowable;
    }
    let (mut te, mut te_chunked, mut length) = (false, false, None::<u64>);
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if !http11 {
                return Head::Unfollowable;
            }
            te = true;
            te_chunked = ends_with_chunked(h.value);
        } else if name.eq_ignore_ascii_case(b"content-length") {
            if te {
                continue;
            }
            let Some(n) = digits(h.value) else {
                return Head::Unfollowable;
            };
            if length.is_some_and(|l| l != n) {
                return Head::Unfollowable;
            }
            length = Some(n);
        } else if name.eq_ignore_ascii_case(b"upgrade") && http11 {
            // What follows a 101 is not HTTP.
            return Head::Unfollowable;
        }
    }
    let next = if te {
        if !te_chunked {
            return Head::Unfollowable;
        }
        State::Chunked(Chunk::Start)
    } else {
        match length {
            Some(n) if n > 0 => State::Length(n),
            _ => State::Head,
        }
    };
    Head::Complete(len, next)
}

/// hyper's `is_chunked_`: the value's last coding is `chunked` (a value that is not visible
/// ASCII is not).
fn ends_with_chunked(value: &[u8]) -> bool {
    if !value
        .iter()
        .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
    {
        return false;
    }
    let last = value.rsplit(|&b| b == b',').next().unwrap_or_default();
    last.trim_ascii().eq_ignore_ascii_case(b"chunked")
}

/// hyper's `from_digits`: decimal digits only, within a `u64`.
fn digits(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0u64, |n, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

pin_project_lite::pin_project! {
    /// A stream whose reads follow the request framing (see the module docs) and fail once a
    /// chunk size passes what nginx takes.
    #[derive(Debug)]
    pub struct FramingGuard<T> {
        #[pin]
        inner: T,
        framing: RequestFraming,
        // The next read fails (the bytes from the offending digit on were withheld).
        refused: bool,
    }
}

impl<T> FramingGuard<T> {
    pub fn new(inner: T) -> FramingGuard<T> {
        FramingGuard {
            inner,
            framing: RequestFraming::default(),
            refused: false,
        }
    }

    pub fn get_ref(&self) -> &T {
        &self.inner
    }
}

impl<T: AsyncRead> AsyncRead for FramingGuard<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        if *this.refused {
            return Poll::Ready(Err(ChunkSizeTooLarge::io_error()));
        }
        let before = buf.filled().len();
        std::task::ready!(this.inner.poll_read(cx, buf))?;
        if this.framing.is_off() {
            return Poll::Ready(Ok(()));
        }
        match this.framing.feed(&buf.filled()[before..]) {
            Feed::Ok => Poll::Ready(Ok(())),
            // Nothing before the digit to hand over: fail now (an empty read is EOF).
            Feed::ChunkTooLarge(0) => {
                *this.refused = true;
                Poll::Ready(Err(ChunkSizeTooLarge::io_error()))
            }
            Feed::ChunkTooLarge(at) => {
                // hyper gets the bytes before the digit and waits for the rest of the size
                // line, which is the failing read.
                buf.set_filled(before + at);
                *this.refused = true;
                Poll::Ready(Ok(()))
            }
        }
    }
}

impl<T: AsyncWrite> AsyncWrite for FramingGuard<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `data` in pieces of `step` bytes; the index of a refusal in the whole input.
    fn feed_in(data: &[u8], step: usize) -> (Option<usize>, RequestFraming) {
        let mut f = RequestFraming::default();
        let mut base = 0;
        for piece in data.chunks(step) {
            if let Feed::ChunkTooLarge(at) = f.feed(piece) {
                return (Some(base + at), f);
            }
            base += piece.len();
        }
        (None, f)
    }

    fn every_split(data: &[u8]) -> Vec<(Option<usize>, RequestFraming)> {
        (1..=data.len()).map(|s| feed_in(data, s)).collect()
    }

    const HEAD: &[u8] = b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";

    /// A head as a comparable value: `Some((length, framing))`, `None` while partial, and
    /// `Some((0, Off))` for what a full parse finds unfollowable.
    fn outcome(h: Head) -> Option<(usize, State)> {
        match h {
            Head::Complete(len, next) => Some((len, next)),
            Head::Partial => None,
            Head::Unfollowable => Some((0, State::Off)),
        }
    }

    /// The line check agrees with the full parse on every head the full parse follows, cut
    /// at every length: same end, same framing, partial alike. Where the full parse gives up
    /// (hyper refuses the head or leaves HTTP/1.1), the check either gives up too or passes a
    /// head that hyper refuses, which closes the connection.
    #[test]
    fn the_line_check_agrees_with_the_full_parse() {
        let request_lines: &[&[u8]] = &[
            b"GET /hello HTTP/1.1",
            b"POST /a?b=1 HTTP/1.0",
            b"CONNECT a.com:443 HTTP/1.1",
            b"connect a.com:443 HTTP/1.1",
            b"PRI * HTTP/2.0",
            b"GET / HTTP/1.2",
            b"GET /HTTP/1.1",
            b" HTTP/1.1",
            b"GET / http/1.1",
        ];
        let fields: &[&[u8]] = &[
            b"Host: a",
            b"host:a.com:9080",
            b"Connection: keep-alive",
            b"Cookie: c=1; d=2",
            b"Content-Type: text/plain",
            b"Content-Length: 5",
            b"content-length:0",
            b"CONTENT-LENGTH: 12",
            b"Content-Length: 5, 5",
            b"Content-Length : 5",
            b"Transfer-Encoding: chunked",
            b"transfer-encoding: gzip, chunked",
            b"Transfer-Encoding: gzip",
            b"Transfer-Encoding\t: chunked",
            b"Upgrade: websocket",
            b"X-Upgrade: 1",
            b"Content-Lengths: 9",
            b"no colon here",
            b" folded: line",
            b"\tfolded",
            b"X: a\rb",
            b":empty-name",
            b"Bad Name: 1",
        ];
        let mut checked = 0;
        for (i, line) in request_lines.iter().enumerate() {
            for (j, a) in fields.iter().enumerate() {
                for b in fields.iter().skip(j % 5).step_by(4) {
                    for (k, eol) in [&b"\r\n"[..], b"\n"].into_iter().enumerate() {
                        let mut head = line.to_vec();
                        for f in [*a, *b] {
                            head.extend_from_slice(eol);
                            head.extend_from_slice(f);
                        }
                        // Mixed endings on some, and the body's first bytes after the head.
                        head.extend_from_slice(if (i + j + k) % 3 == 0 {
                            b"\r\n\r\n"
                        } else {
                            eol
                        });
                        if (i + j + k) % 3 != 0 {
                            head.extend_from_slice(eol);
                        }
                        head.extend_from_slice(b"5\r\nhello");
                        for cut in 1..=head.len() {
                            let buf = &head[..cut];
                            let full = outcome(parse_head(buf));
                            let fast = outcome(scan_head(buf));
                            if full != Some((0, State::Off)) {
                                assert_eq!(fast, full, "{:?}", String::from_utf8_lossy(buf));
                            } else if fast != full {
                                // Passed by the line check: hyper refuses it.
                                let mut fields = [httparse::EMPTY_HEADER; 8];
                                let parsed = httparse::Request::new(&mut fields).parse(buf);
                                assert!(parsed.is_err(), "{:?}", String::from_utf8_lossy(buf));
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 50_000, "{checked}");
    }

    /// Issue 8, finding 10: a size past 2^63 - 1 is refused at its 16th digit, wherever the
    /// reads split the bytes.
    #[test]
    fn a_size_past_off_t_is_refused_at_its_digit() {
        let mut data = HEAD.to_vec();
        data.extend_from_slice(b"ffffffffffffffff\r\n");
        for (at, _) in every_split(&data) {
            assert_eq!(at, Some(HEAD.len() + 15));
        }
        // 2^63 - 1 is still a size nginx takes; 2^63 is not.
        let mut ok = HEAD.to_vec();
        ok.extend_from_slice(b"7fffffffffffffff\r\nabc");
        assert_eq!(feed_in(&ok, 7).0, None);
        let mut bad = HEAD.to_vec();
        bad.extend_from_slice(b"8000000000000000\r\n");
        assert_eq!(feed_in(&bad, 1000).0, Some(HEAD.len() + 15));
        // Leading zeros do not count.
        let mut zeros = HEAD.to_vec();
        zeros.extend_from_slice(b"00000000000000000000003\r\nabc\r\n0\r\n\r\n");
        assert_eq!(feed_in(&zeros, 5).0, None);
    }

    /// The chunk data, however it looks, is skipped by its length: a long hex run inside a
    /// chunk, a Content-Length body or a header is not a size line.
    #[test]
    fn hex_runs_in_bodies_and_heads_are_not_size_lines() {
        let run = b"ffffffffffffffffffffffffffff\r\n";
        let mut data = HEAD.to_vec();
        data.extend_from_slice(format!("{:x}\r\n", run.len()).as_bytes());
        data.extend_from_slice(run);
        data.extend_from_slice(b"\r\n0\r\nX-Trailer: ffffffffffffffffffff\r\n\r\n");
        data.extend_from_slice(
            format!(
                "POST /l HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
                run.len()
            )
            .as_bytes(),
        );
        data.extend_from_slice(run);
        data.extend_from_slice(b"GET /h HTTP/1.1\r\nHost: x\r\nX-A: ffffffffffffffffffff\r\n\r\n");
        for (at, f) in every_split(&data) {
            assert_eq!(at, None);
            assert_eq!(f.state, State::Head, "{:?}", f.state);
        }
        // The next request on the connection is followed again.
        let mut more = data.clone();
        more.extend_from_slice(HEAD);
        // 2^64: refused at its 17th digit.
        more.extend_from_slice(b"10000000000000000\r\n");
        assert_eq!(feed_in(&more, 9).0, Some(data.len() + HEAD.len() + 16));
    }

    /// hyper's framing rules: Transfer-Encoding wins over Content-Length, its last coding must
    /// be chunked, extensions and trailers are skipped.
    #[test]
    fn framing_follows_hyper() {
        let cl_then_te = b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n1;ext=ffffffffffffffffff\r\na\r\n0\r\n\r\n";
        let (at, f) = feed_in(cl_then_te, 3);
        assert_eq!((at, f.state), (None, State::Head));
        let te_gzip_chunked =
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, CHUNKED \r\n\r\nffffffffffffffff1";
        assert!(feed_in(te_gzip_chunked, 100).0.is_some());
        // What hyper refuses is not followed (hyper answers 400 itself).
        for refused in [
            &b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\nffffffffffffffff1"[..],
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff1",
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: +1\r\n\r\n",
        ] {
            let (at, f) = feed_in(refused, 4);
            assert_eq!(at, None);
            assert!(f.is_off());
        }
    }

    /// HTTP/2, upgrades and CONNECT leave HTTP/1.1: their bytes are never read as framing.
    #[test]
    fn other_protocols_turn_it_off() {
        for raw in [
            &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..],
            b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
            b"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n",
        ] {
            let mut data = raw.to_vec();
            data.extend_from_slice(b"ffffffffffffffffffff\r\n");
            let (at, f) = feed_in(&data, 6);
            assert_eq!(at, None);
            assert!(f.is_off());
        }
    }

    /// Empty lines before a request line are skipped (as httparse skips them), and a head
    /// split anywhere, even inside its final empty line, is found.
    #[test]
    fn heads_split_anywhere_and_leading_empty_lines() {
        let mut data = b"\r\n\r\n".to_vec();
        data.extend_from_slice(HEAD);
        data.extend_from_slice(b"5\r\nabcde\r\n0\r\n\r\n\r\n");
        data.extend_from_slice(HEAD);
        data.extend_from_slice(b"ffffffffffffffff\r\n");
        let at = data.len() - 3;
        for (refused, _) in every_split(&data) {
            assert_eq!(refused, Some(at));
        }
    }

    /// A head that never ends is given up at hyper's buffer size, not held in memory.
    #[test]
    fn an_endless_head_is_given_up() {
        let mut f = RequestFraming::default();
        f.feed(b"GET / HTTP/1.1\r\n");
        for _ in 0..100 {
            f.feed(&[b'a'; 1024]);
        }
        assert!(f.is_off());
        assert_eq!(f.head.capacity(), 0);
    }

    #[tokio::test]
    async fn the_read_after_the_digit_fails() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, server) = tokio::io::duplex(1024);
        let mut data = HEAD.to_vec();
        data.extend_from_slice(b"ffffffffffffffff\r\n");
        client.write_all(&data).await.unwrap();
        let mut guard = FramingGuard::new(server);
        let mut got = vec![0u8; 4096];
        let n = guard.read(&mut got).await.unwrap();
        assert_eq!(&got[..n], &data[..HEAD.len() + 15]);
        let err = guard.read(&mut got).await.unwrap_err();
        assert!(err.get_ref().unwrap().is::<ChunkSizeTooLarge>());
    }
}
