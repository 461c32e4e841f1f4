//! Apache Dubbo 2's wire protocol, as http-dubbo and dubbo-proxy speak it to a provider: the
//! 16-byte frame header (magic `0xdabb`; a flag byte with the request, two-way and event bits
//! and the serialization id; the status; the request id; the body's length), the
//! serializations they use ([`hessian`] for Hessian 2, fastjson's line format is http-dubbo's
//! own), and one exchange over TCP under the try's timeouts, where a failure says which
//! answer the client gets.

pub mod hessian;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The first two bytes of every frame.
pub const MAGIC: u16 = 0xdabb;
/// The frame's length before its body.
pub const HEADER_LEN: usize = 16;
/// Flag bits: a request (else a response), one that expects an answer, an event
/// (heartbeat).
pub const FLAG_REQUEST: u8 = 0x80;
pub const FLAG_TWO_WAY: u8 = 0x40;
pub const FLAG_EVENT: u8 = 0x20;
/// Serialization ids (the flag's low five bits).
pub const SERIALIZATION_HESSIAN2: u8 = 2;
pub const SERIALIZATION_FASTJSON: u8 = 6;
/// The response status of a call that reached the provider's method.
pub const STATUS_OK: u8 = 20;
/// The Dubbo protocol version requests carry.
pub const DUBBO_VERSION: &str = "2.0.2";

/// The first value of a response body: what follows it.
pub const RESPONSE_WITH_EXCEPTION: i32 = 0;
pub const RESPONSE_VALUE: i32 = 1;
pub const RESPONSE_NULL_VALUE: i32 = 2;
pub const RESPONSE_WITH_EXCEPTION_WITH_ATTACHMENTS: i32 = 3;
pub const RESPONSE_VALUE_WITH_ATTACHMENTS: i32 = 4;
pub const RESPONSE_NULL_VALUE_WITH_ATTACHMENTS: i32 = 5;

/// A frame's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub flag: u8,
    pub status: u8,
    pub id: u64,
    pub body_len: u32,
}

impl Header {
    /// A two-way request's header.
    pub fn request(serialization: u8, id: u64, body_len: u32) -> Header {
        Header {
            flag: FLAG_REQUEST | FLAG_TWO_WAY | (serialization & 0x1f),
            status: 0,
            id,
            body_len,
        }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..2].copy_from_slice(&MAGIC.to_be_bytes());
        b[2] = self.flag;
        b[3] = self.status;
        b[4..12].copy_from_slice(&self.id.to_be_bytes());
        b[12..].copy_from_slice(&self.body_len.to_be_bytes());
        b
    }

    /// The header of `b`; an error when it is not a Dubbo frame.
    pub fn parse(b: &[u8; HEADER_LEN]) -> Result<Header, String> {
        let magic = u16::from_be_bytes([b[0], b[1]]);
        if magic != MAGIC {
            return Err(format!("not a dubbo frame (magic 0x{magic:04x})"));
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&b[4..12]);
        Ok(Header {
            flag: b[2],
            status: b[3],
            id: u64::from_be_bytes(id),
            body_len: u32::from_be_bytes([b[12], b[13], b[14], b[15]]),
        })
    }

    pub fn is_request(&self) -> bool {
        self.flag & FLAG_REQUEST != 0
    }

    pub fn is_event(&self) -> bool {
        self.flag & FLAG_EVENT != 0
    }

    pub fn serialization(&self) -> u8 {
        self.flag & 0x1f
    }
}

/// A whole frame: the header for `body`, then `body`.
pub fn frame(serialization: u8, id: u64, body: &[u8]) -> Vec<u8> {
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&Header::request(serialization, id, len).encode());
    out.extend_from_slice(body);
    out
}

/// The name of a response status, for the error log.
pub fn status_name(status: u8) -> &'static str {
    match status {
        20 => "OK",
        30 => "CLIENT_TIMEOUT",
        31 => "SERVER_TIMEOUT",
        35 => "CHANNEL_INACTIVE",
        40 => "BAD_REQUEST",
        50 => "BAD_RESPONSE",
        60 => "SERVICE_NOT_FOUND",
        70 => "SERVICE_ERROR",
        80 => "SERVER_ERROR",
        90 => "CLIENT_ERROR",
        100 => "SERVER_THREADPOOL_EXHAUSTED_ERROR",
        _ => "unknown status",
    }
}

/// The timeouts of one exchange (nginx's connect, send and read timeouts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    pub connect: Duration,
    pub send: Duration,
    pub read: Duration,
}

/// How an exchange failed.
#[derive(Debug)]
pub enum CallError {
    /// The connection could not be made (refused, unreachable, connect timeout).
    Connect(String),
    /// Writing the request failed or took longer than the send timeout.
    Send(String),
    /// No answer within the read timeout.
    ReadTimeout,
    /// The provider closed the connection or answered something that is not a frame.
    Read(String),
    /// A frame longer than the limit.
    TooLarge(u32),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Connect(e) => write!(f, "failed to connect to upstream: {e}"),
            CallError::Send(e) => write!(f, "failed to send to upstream: {e}"),
            CallError::ReadTimeout => f.write_str("upstream timed out"),
            CallError::Read(e) => write!(f, "failed to read from upstream: {e}"),
            CallError::TooLarge(n) => write!(f, "upstream sent a frame of {n} bytes, too large"),
        }
    }
}

/// Connects to `node` within the connect timeout.
pub async fn connect(node: SocketAddr, timeout: Duration) -> Result<TcpStream, CallError> {
    match tokio::time::timeout(timeout, TcpStream::connect(node)).await {
        Ok(Ok(s)) => {
            let _ = s.set_nodelay(true);
            Ok(s)
        }
        Ok(Err(e)) => Err(CallError::Connect(e.to_string())),
        Err(_) => Err(CallError::Connect("timed out".into())),
    }
}

/// Writes `bytes` within the send timeout.
pub async fn send(
    stream: &mut TcpStream,
    bytes: &[u8],
    timeout: Duration,
) -> Result<(), CallError> {
    match tokio::time::timeout(timeout, stream.write_all(bytes)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(CallError::Send(e.to_string())),
        Err(_) => Err(CallError::Send("timed out".into())),
    }
}

/// Reads frames from a connection: the next frame's header and body, each read waiting at
/// most the read timeout (nginx's `proxy_read_timeout` is between two reads).
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: BytesMut,
}

impl FrameReader {
    pub fn new() -> FrameReader {
        FrameReader::default()
    }

    async fn fill(
        &mut self,
        stream: &mut (impl AsyncReadExt + Unpin),
        want: usize,
        timeout: Duration,
    ) -> Result<(), CallError> {
        while self.buf.len() < want {
            // Reserved as it arrives: a header's length is the provider's word only.
            self.buf.reserve((want - self.buf.len()).min(64 * 1024));
            match tokio::time::timeout(timeout, stream.read_buf(&mut self.buf)).await {
                Err(_) => return Err(CallError::ReadTimeout),
                Ok(Err(e)) => return Err(CallError::Read(e.to_string())),
                Ok(Ok(0)) => {
                    return Err(CallError::Read(
                        "upstream prematurely closed connection".into(),
                    ))
                }
                Ok(Ok(_)) => {}
            }
        }
        Ok(())
    }

    /// The next frame, its body at most `max_body` bytes.
    pub async fn next(
        &mut self,
        stream: &mut (impl AsyncReadExt + Unpin),
        timeout: Duration,
        max_body: u32,
    ) -> Result<(Header, BytesMut), CallError> {
        self.fill(stream, HEADER_LEN, timeout).await?;
        let mut head = [0u8; HEADER_LEN];
        head.copy_from_slice(&self.buf[..HEADER_LEN]);
        let header = Header::parse(&head).map_err(CallError::Read)?;
        if header.body_len > max_body {
            return Err(CallError::TooLarge(header.body_len));
        }
        let len = header.body_len as usize;
        self.fill(stream, HEADER_LEN + len, timeout).await?;
        self.buf.advance(HEADER_LEN);
        Ok((header, self.buf.split_to(len)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout() {
        let h = Header::request(SERIALIZATION_HESSIAN2, 0x0102, 0x0a0b);
        let b = h.encode();
        assert_eq!(
            b,
            [0xda, 0xbb, 0xc2, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0x0a, 0x0b]
        );
        let back = Header::parse(&b).unwrap();
        assert_eq!(back, h);
        assert!(back.is_request() && !back.is_event());
        assert_eq!(back.serialization(), SERIALIZATION_HESSIAN2);
        let mut bad = b;
        bad[0] = b'H';
        assert!(Header::parse(&bad).is_err());
        // APISIX's http-dubbo header: request, two-way, fastjson.
        assert_eq!(
            frame(SERIALIZATION_FASTJSON, 1, b"x")[..4],
            [0xda, 0xbb, 0xc6, 0]
        );
    }

    #[tokio::test]
    async fn frames_are_read_whole_and_bounded() {
        let mut wire = frame(SERIALIZATION_HESSIAN2, 7, b"abc");
        wire.extend_from_slice(&frame(SERIALIZATION_HESSIAN2, 8, b""));
        let mut src = &wire[..];
        let mut r = FrameReader::new();
        let t = Duration::from_secs(1);
        let (h, body) = r.next(&mut src, t, 16).await.unwrap();
        assert_eq!((h.id, &body[..]), (7, &b"abc"[..]));
        let (h, body) = r.next(&mut src, t, 16).await.unwrap();
        assert_eq!((h.id, body.len()), (8, 0));
        assert!(matches!(
            r.next(&mut src, t, 16).await,
            Err(CallError::Read(_))
        ));
        let big = frame(SERIALIZATION_HESSIAN2, 1, &[0; 20]);
        assert!(matches!(
            FrameReader::new().next(&mut &big[..], t, 16).await,
            Err(CallError::TooLarge(20))
        ));
    }
}
