//! Chaitin's T1K protocol as lua-resty-t1k speaks it to a SafeLine detection engine.
//!
//! Both directions are a run of sections, each a one-byte tag, a four-byte little-endian
//! length and that many bytes. The tag's `0x40` bit marks the first section of a message and
//! its `0x80` bit the last. A request carries the HTTP head (`0x01`), the body (`0x02`, left
//! out when there is none), the extra facts (`0x03`: client and local address and port, server
//! name, scheme, proxy name, a request id, the start time) and the protocol version (`0x20`).
//! The engine's answer carries the verdict (`0x01`: `.` pass, `?` block), the status to block
//! with (`0x02`), headers to add to the response (`0x23`, `name:value\n` lines) and a body whose
//! HTML comment names the event id (`0x24`); other tags (`0x25`, the engine's context) are
//! read and ignored.

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub const TAG_HEAD: u8 = 0x01;
pub const TAG_BODY: u8 = 0x02;
pub const TAG_EXTRA: u8 = 0x03;
pub const TAG_VERSION: u8 = 0x20;
pub const TAG_EXTRA_HEADER: u8 = 0x23;
pub const TAG_EXTRA_BODY: u8 = 0x24;
pub const MASK_FIRST: u8 = 0x40;
pub const MASK_LAST: u8 = 0x80;
/// A section's head: the tag and the length.
pub const HEADER_SIZE: usize = 5;
/// The version section lua-resty-t1k sends.
pub const PROTO: &[u8] = b"Proto:3\n";

/// The keys of the extra section (each `key value \n`).
pub mod extra {
    pub const NEW_VER_FLAG: u8 = 0x01;
    pub const REMOTE_PORT: u8 = 0x11;
    pub const LOCAL_PORT: u8 = 0x12;
    pub const REMOTE_ADDR: u8 = 0x13;
    pub const LOCAL_ADDR: u8 = 0x14;
    pub const SERVER_NAME: u8 = 0x15;
    pub const SCHEME: u8 = 0x16;
    pub const PROXY_NAME: u8 = 0x17;
    pub const UUID: u8 = 0x18;
    pub const HAS_RSP_IF_OK: u8 = 0x19;
    pub const HAS_RSP_IF_BLOCK: u8 = 0x1a;
    pub const REQ_BEGIN_TIME: u8 = 0x1b;
}

/// The largest section accepted from an engine. Real answers are a few hundred bytes; the cap
/// keeps a corrupt length from making the gateway buffer without bound.
pub const MAX_SECTION: usize = 1 << 20;

/// The facts of the extra section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extra<'a> {
    pub remote_addr: &'a str,
    pub remote_port: &'a str,
    pub local_addr: &'a str,
    pub local_port: &'a str,
    pub server_name: &'a str,
    pub scheme: &'a str,
    pub proxy_name: &'a str,
    pub uuid: &'a str,
    /// Microseconds since the Unix epoch.
    pub begin_us: u64,
}

impl Extra<'_> {
    /// The section's bytes, in lua-resty-t1k's order. The gateway never reports responses, so
    /// both "has response" flags are `n`.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(160);
        let mut kv = |k: u8, v: &[u8]| {
            b.push(k);
            b.extend_from_slice(v);
            b.push(b'\n');
        };
        kv(extra::NEW_VER_FLAG, b"");
        kv(extra::REMOTE_PORT, self.remote_port.as_bytes());
        kv(extra::LOCAL_PORT, self.local_port.as_bytes());
        kv(extra::REMOTE_ADDR, self.remote_addr.as_bytes());
        kv(extra::LOCAL_ADDR, self.local_addr.as_bytes());
        kv(extra::SERVER_NAME, self.server_name.as_bytes());
        kv(extra::SCHEME, self.scheme.as_bytes());
        kv(extra::PROXY_NAME, self.proxy_name.as_bytes());
        kv(extra::UUID, self.uuid.as_bytes());
        kv(extra::HAS_RSP_IF_OK, b"n");
        kv(extra::HAS_RSP_IF_BLOCK, b"n");
        kv(extra::REQ_BEGIN_TIME, self.begin_us.to_string().as_bytes());
        b
    }
}

/// A request message: its bytes, and where each section ends (to name the section a failed
/// send was in, as lua-resty-t1k's error does).
#[derive(Debug)]
pub struct Message {
    pub bytes: Bytes,
    /// `(end offset, tag without the first/last bits)` per section, in order.
    pub sections: Vec<(usize, u8)>,
}

/// Frames a request: the head, the body when there is one, the extra facts and the version.
/// The first section's tag carries the first bit and the version's the last.
pub fn encode_request(head: &[u8], body: Option<&[u8]>, extra: &[u8]) -> Message {
    let mut parts: Vec<(u8, &[u8])> = vec![(TAG_HEAD, head)];
    if let Some(b) = body {
        parts.push((TAG_BODY, b));
    }
    parts.push((TAG_EXTRA, extra));
    parts.push((TAG_VERSION, PROTO));
    let total: usize = parts.iter().map(|(_, d)| HEADER_SIZE + d.len()).sum();
    let mut out = BytesMut::with_capacity(total);
    let mut sections = Vec::with_capacity(parts.len());
    let last = parts.len() - 1;
    for (i, (tag, data)) in parts.iter().enumerate() {
        let mut t = *tag;
        if i == 0 {
            t |= MASK_FIRST;
        }
        if i == last {
            t |= MASK_LAST;
        }
        out.put_u8(t);
        // Section lengths are 32-bit; a longer one cannot be framed, and the body is cut to
        // `req_body_size` long before that.
        out.put_u32_le(u32::try_from(data.len()).unwrap_or(u32::MAX));
        out.put_slice(data);
        sections.push((out.len(), *tag));
    }
    Message {
        bytes: out.freeze(),
        sections,
    }
}

/// What an engine answered: the last section of each tag it sent.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Answer {
    sections: Vec<(u8, Bytes)>,
}

impl Answer {
    pub fn get(&self, tag: u8) -> Option<&Bytes> {
        self.sections
            .iter()
            .rev()
            .find(|(t, _)| *t == tag)
            .map(|(_, d)| d)
    }

    /// The verdict: `.` passes, `?` blocks. (APISIX's plugin goes by the status and the event
    /// id alone.)
    #[cfg(test)]
    pub fn action(&self) -> Option<&Bytes> {
        self.get(TAG_HEAD)
    }

    /// The status the engine blocks with, as it sent it.
    pub fn status(&self) -> Option<String> {
        self.get(TAG_BODY)
            .map(|s| String::from_utf8_lossy(s).into_owned())
    }

    /// The event id named in the block page's `<!-- event_id: ... -->` comment.
    pub fn event_id(&self) -> Option<String> {
        self.get(TAG_EXTRA_BODY)
            .and_then(|b| event_id(&String::from_utf8_lossy(b)))
    }

    /// The response headers the engine asks for, `name:value` per line.
    pub fn extra_headers(&self) -> Vec<(String, String)> {
        self.get(TAG_EXTRA_HEADER)
            .map(|b| extra_headers(&String::from_utf8_lossy(b)))
            .unwrap_or_default()
    }
}

/// lua-resty-t1k's `<!-- event_id: ([A-Za-z0-9]+)(?: TYPE: [a-zA-Z])? -->`, the first match.
pub fn event_id(text: &str) -> Option<String> {
    const OPEN: &str = "<!-- event_id: ";
    let mut from = 0;
    while let Some(at) = text[from..].find(OPEN) {
        let start = from + at + OPEN.len();
        from = from + at + 1;
        let rest = &text[start..];
        let id_len = rest.bytes().take_while(u8::is_ascii_alphanumeric).count();
        if id_len == 0 {
            continue;
        }
        let tail = &rest[id_len..];
        let closes = tail.starts_with(" -->")
            || tail
                .strip_prefix(" TYPE: ")
                .and_then(|t| {
                    let mut c = t.chars();
                    c.next()
                        .filter(char::is_ascii_alphabetic)
                        .map(|_| c.as_str())
                })
                .is_some_and(|t| t.starts_with(" -->"));
        if closes {
            return Some(rest[..id_len].to_owned());
        }
    }
    None
}

/// The `name:value\n` lines of an extra-header section; parsing stops at a line without
/// its `:` or its newline, as lua-resty-t1k's does.
pub fn extra_headers(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let Some(colon) = rest.find(':') else { break };
        let key = &rest[..colon];
        let after = &rest[colon + 1..];
        let Some(nl) = after.find('\n') else { break };
        out.push((key.to_owned(), after[..nl].to_owned()));
        rest = &after[nl + 1..];
    }
    out
}

/// Why an answer could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The answer's first section lacks the first bit.
    NotFirst,
    /// A section longer than [`MAX_SECTION`].
    TooLong(usize),
}

/// Where the decoder is within the current section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// A section head.
    Header,
    /// A section's data.
    Data,
}

/// Decodes an answer from bytes as they arrive, whatever way the reads split them.
#[derive(Debug, Default)]
pub struct Decoder {
    first_seen: bool,
    /// The section being read: its tag, whether it is the last, its length.
    current: Option<(u8, bool, usize)>,
    answer: Answer,
}

impl Decoder {
    /// What the decoder waits for next.
    pub fn wants(&self) -> Want {
        if self.current.is_some() {
            Want::Data
        } else {
            Want::Header
        }
    }

    /// Consumes what `buf` holds of the answer; `Some` once the last section is complete.
    pub fn feed(&mut self, buf: &mut BytesMut) -> Result<Option<Answer>, DecodeError> {
        loop {
            match self.current {
                None => {
                    if buf.len() < HEADER_SIZE {
                        return Ok(None);
                    }
                    let t = buf[0];
                    if !self.first_seen {
                        if t & MASK_FIRST == 0 {
                            return Err(DecodeError::NotFirst);
                        }
                        self.first_seen = true;
                    }
                    let len = u32::from_le_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
                    if len > MAX_SECTION {
                        return Err(DecodeError::TooLong(len));
                    }
                    buf.advance(HEADER_SIZE);
                    let last = t & MASK_LAST != 0;
                    let tag = t & !(MASK_FIRST | MASK_LAST);
                    self.current = Some((tag, last, len));
                }
                Some((tag, last, len)) => {
                    if buf.len() < len {
                        return Ok(None);
                    }
                    let data = buf.split_to(len).freeze();
                    if len > 0 {
                        self.answer.sections.push((tag, data));
                    }
                    self.current = None;
                    if last {
                        return Ok(Some(std::mem::take(&mut self.answer)));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(tag: u8, data: &[u8]) -> Vec<u8> {
        let mut v = vec![tag];
        v.extend_from_slice(&(data.len() as u32).to_le_bytes());
        v.extend_from_slice(data);
        v
    }

    /// APISIX's test engine's block answer (t/lib/chaitin_waf_server.lua's `reject`).
    fn block_answer() -> Vec<u8> {
        [
            section(0x41, b"?"),
            section(0x02, b"403"),
            section(
                0x25,
                b"{\"event_id\":\"b3c6\",\"request_hit_whitelist\":false}",
            ),
            section(0x23, b"Set-Cookie:sl-session=abc; Path=/\n"),
            section(0xa4, b"<!-- event_id: b3c6ce574dc24f09a01f634a39dca83b -->"),
        ]
        .concat()
    }

    fn decode_split(bytes: &[u8], step: usize) -> Result<Option<Answer>, DecodeError> {
        let mut d = Decoder::default();
        let mut buf = BytesMut::new();
        for chunk in bytes.chunks(step) {
            buf.extend_from_slice(chunk);
            if let Some(a) = d.feed(&mut buf)? {
                return Ok(Some(a));
            }
        }
        Ok(None)
    }

    #[test]
    fn decodes_whatever_the_reads_split() {
        let bytes = block_answer();
        for step in [1, 2, 3, 4, 5, 6, 7, 13, bytes.len()] {
            let a = decode_split(&bytes, step).unwrap().expect("complete");
            assert_eq!(a.action().unwrap(), "?", "step {step}");
            assert_eq!(a.status().as_deref(), Some("403"));
            assert_eq!(
                a.event_id().as_deref(),
                Some("b3c6ce574dc24f09a01f634a39dca83b")
            );
            assert_eq!(
                a.extra_headers(),
                [("Set-Cookie".to_owned(), "sl-session=abc; Path=/".to_owned())]
            );
        }
        // One byte short of the last section: not complete yet.
        assert_eq!(decode_split(&bytes[..bytes.len() - 1], 1).unwrap(), None);
    }

    #[test]
    fn pass_answer_and_bytes_after_the_last_section() {
        let mut bytes = [section(0x41, b"."), section(0xa5, b"{}")].concat();
        bytes.extend_from_slice(b"trailing");
        let mut buf = BytesMut::from(&bytes[..]);
        let a = Decoder::default().feed(&mut buf).unwrap().unwrap();
        assert_eq!(a.action().unwrap(), ".");
        assert_eq!(a.status(), None);
        assert_eq!(a.event_id(), None);
        assert_eq!(&buf[..], b"trailing", "left for the caller");
    }

    #[test]
    fn refuses_a_missing_first_bit_and_huge_sections() {
        let mut buf = BytesMut::from(&section(0x01, b".")[..]);
        assert_eq!(
            Decoder::default().feed(&mut buf),
            Err(DecodeError::NotFirst)
        );
        let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\n"[..]);
        assert_eq!(
            Decoder::default().feed(&mut buf),
            Err(DecodeError::TooLong(0x2f50_5454)),
            "H (0x48) has the first bit; TTP/ is the length"
        );
        let mut buf = BytesMut::from(&[0xc1, 0xff, 0xff, 0xff, 0xff][..]);
        assert_eq!(
            Decoder::default().feed(&mut buf),
            Err(DecodeError::TooLong(u32::MAX as usize))
        );
    }

    #[test]
    fn request_framing() {
        let m = encode_request(b"GET / HTTP/1.1\r\n\r\n", Some(b"abc"), b"x");
        let b = &m.bytes[..];
        assert_eq!(b[0], 0x41);
        assert_eq!(&b[1..5], &18u32.to_le_bytes());
        let body_at = 5 + 18;
        assert_eq!(b[body_at], 0x02);
        assert_eq!(&b[body_at + 5..body_at + 8], b"abc");
        let extra_at = body_at + 8;
        assert_eq!(b[extra_at], 0x03);
        let ver_at = extra_at + 6;
        assert_eq!(b[ver_at], 0xa0);
        assert_eq!(&b[ver_at + 5..], PROTO);
        assert_eq!(
            m.sections,
            [
                (body_at, TAG_HEAD),
                (extra_at, TAG_BODY),
                (ver_at, TAG_EXTRA),
                (b.len(), TAG_VERSION)
            ]
        );
        // Without a body there is no body section.
        let m = encode_request(b"h", None, b"x");
        assert_eq!(
            m.sections.iter().map(|s| s.1).collect::<Vec<_>>(),
            [1, 3, 0x20]
        );
    }

    #[test]
    fn extra_section() {
        let e = Extra {
            remote_addr: "1.2.3.4",
            remote_port: "5555",
            local_addr: "127.0.0.1",
            local_port: "9080",
            server_name: "_",
            scheme: "http",
            proxy_name: "host",
            uuid: "u",
            begin_us: 17,
        };
        assert_eq!(
            e.encode(),
            b"\x01\n\x115555\n\x129080\n\x131.2.3.4\n\x14127.0.0.1\n\x15_\n\x16http\n\x17host\n\x18u\n\x19n\n\x1an\n\x1b17\n"
        );
    }

    #[test]
    fn event_ids() {
        assert_eq!(event_id("<!-- event_id: ab12 -->").as_deref(), Some("ab12"));
        assert_eq!(
            event_id("x<!-- event_id: -->y<!-- event_id: cd TYPE: A -->").as_deref(),
            Some("cd")
        );
        assert_eq!(event_id("<!-- event_id: ab12 TYPE: 1 -->"), None);
        assert_eq!(event_id("<!-- event_id: ab-12 -->"), None);
        assert_eq!(event_id("no comment"), None);
    }

    #[test]
    fn extra_header_lines() {
        assert_eq!(
            extra_headers("A:1\nB: two\nbroken"),
            [("A".into(), "1".into()), ("B".into(), " two".into())]
        );
        assert!(extra_headers("").is_empty());
    }
}
