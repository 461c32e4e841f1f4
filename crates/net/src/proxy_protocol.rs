//! The PROXY protocol (HAProxy's `proxy-protocol.txt`, versions 1 and 2), as nginx's
//! `listen ... proxy_protocol` reads it and its stream `proxy_protocol on` writes it.
//!
//! * [`parse`]: one header at the start of a buffer, version 1 (text) or 2 (binary), told
//!   apart by their first bytes as nginx does. It answers [`Parsed::Incomplete`] while the
//!   bytes so far can still become a header, so a header split across reads is read whole.
//! * [`read_header`]: reads exactly the header off a fresh TCP connection (peeking, so no
//!   byte of what follows is consumed: the TLS handshake or the HTTP request is read by its
//!   own code afterwards), within a deadline and a size bound.
//! * [`v1_header`]: the text header nginx's stream module sends an upstream.
//! * [`read_header_with_tlvs`] and [`tlv`]: a v2 header's TLVs, as nginx's
//!   `$proxy_protocol_tlv_<name>` variables read them.
//!
//! A v2 `LOCAL` command (a health check from the balancer itself), a v1 `UNKNOWN`, and v2
//! address families other than IPv4 and IPv6 (`AF_UNIX`, `AF_UNSPEC`) carry no client
//! address: the connection keeps its peer's, as in nginx (which then keeps no TLVs either).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// nginx's `NGX_PROXY_PROTOCOL_V1_MAX_HEADER`: the longest v1 line, CRLF included.
pub const V1_MAX_HEADER: usize = 107;
/// nginx's `NGX_PROXY_PROTOCOL_MAX_HEADER`: the longest header read (a v2 header with its
/// TLVs); a longer one closes the connection.
pub const MAX_HEADER: usize = 4096;

/// The 12 bytes every v2 header starts with.
const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// The fixed part of a v2 header: signature, version and command, family, length.
const V2_FIXED: usize = 16;

/// What a header said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyHeader {
    /// A proxied TCP connection: the client's address and the one it connected to.
    Proxied {
        source: SocketAddr,
        destination: SocketAddr,
    },
    /// v2 `LOCAL`: the proxy's own connection; the peer is the client.
    Local,
    /// v1 `UNKNOWN`, or v2 with an address family other than IPv4 and IPv6 (`AF_UNIX`,
    /// `AF_UNSPEC`): no address to take.
    Unknown,
}

impl ProxyHeader {
    /// The client's and the destination's addresses, when the header carried them.
    pub fn addresses(&self) -> Option<(SocketAddr, SocketAddr)> {
        match *self {
            ProxyHeader::Proxied {
                source,
                destination,
            } => Some((source, destination)),
            ProxyHeader::Local | ProxyHeader::Unknown => None,
        }
    }
}

/// The outcome of [`parse`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A whole header, and how many bytes it took.
    Header(ProxyHeader, usize),
    /// What there is so far may still become a header.
    Incomplete,
    /// Not a PROXY header (or a broken one): the connection is closed.
    Invalid(&'static str),
}

/// Reads one header from the start of `buf`.
pub fn parse(buf: &[u8]) -> Parsed {
    let Some(&first) = buf.first() else {
        return Parsed::Incomplete;
    };
    if first == V2_SIGNATURE[0] {
        parse_v2(buf)
    } else {
        parse_v1(buf)
    }
}

fn parse_v1(buf: &[u8]) -> Parsed {
    const PREFIX: &[u8] = b"PROXY ";
    let n = buf.len().min(PREFIX.len());
    if buf[..n] != PREFIX[..n] {
        return Parsed::Invalid("broken header: not a PROXY protocol header");
    }
    let window = &buf[..buf.len().min(V1_MAX_HEADER)];
    let Some(lf) = window.iter().position(|&b| b == b'\n') else {
        if buf.len() >= V1_MAX_HEADER {
            return Parsed::Invalid("too long PROXY protocol v1 header");
        }
        return Parsed::Incomplete;
    };
    if lf == 0 || window[lf - 1] != b'\r' {
        return Parsed::Invalid("broken header: the v1 line does not end in CRLF");
    }
    let Ok(line) = std::str::from_utf8(&window[PREFIX.len()..lf - 1]) else {
        return Parsed::Invalid("broken header: the v1 line is not text");
    };
    let used = lf + 1;
    let mut fields = line.split(' ');
    let family = fields.next().unwrap_or("");
    if family == "UNKNOWN" {
        // Anything may follow UNKNOWN up to the CRLF; the receiver ignores it.
        return Parsed::Header(ProxyHeader::Unknown, used);
    }
    let v6 = match family {
        "TCP4" => false,
        "TCP6" => true,
        _ => return Parsed::Invalid("broken header: unknown v1 protocol family"),
    };
    let fields: Vec<&str> = fields.collect();
    let [src, dst, sport, dport] = fields[..] else {
        return Parsed::Invalid("broken header: a v1 line needs two addresses and two ports");
    };
    let ip = |text: &str| -> Option<IpAddr> {
        if v6 {
            text.parse::<Ipv6Addr>().ok().map(IpAddr::V6)
        } else {
            text.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
        }
    };
    // Ports are decimal without a sign or leading zeros, as the specification writes them.
    let port = |text: &str| -> Option<u16> {
        let plain = !text.is_empty()
            && text.bytes().all(|b| b.is_ascii_digit())
            && (text == "0" || !text.starts_with('0'));
        plain.then(|| text.parse().ok()).flatten()
    };
    match (ip(src), ip(dst), port(sport), port(dport)) {
        (Some(s), Some(d), Some(sp), Some(dp)) => Parsed::Header(
            ProxyHeader::Proxied {
                source: SocketAddr::new(s, sp),
                destination: SocketAddr::new(d, dp),
            },
            used,
        ),
        _ => Parsed::Invalid("broken header: a bad v1 address or port"),
    }
}

fn parse_v2(buf: &[u8]) -> Parsed {
    let n = buf.len().min(V2_SIGNATURE.len());
    if buf[..n] != V2_SIGNATURE[..n] {
        return Parsed::Invalid("broken header: not a PROXY protocol header");
    }
    if buf.len() < V2_FIXED {
        return Parsed::Incomplete;
    }
    let version = buf[12] >> 4;
    let command = buf[12] & 0x0f;
    if version != 2 {
        return Parsed::Invalid("unknown PROXY protocol version");
    }
    let family = buf[13] >> 4;
    let len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    let total = V2_FIXED + len;
    if total > MAX_HEADER {
        return Parsed::Invalid("too long PROXY protocol v2 header");
    }
    if command > 1 {
        return Parsed::Invalid("unknown PROXY protocol v2 command");
    }
    if buf.len() < total {
        return Parsed::Incomplete;
    }
    if command == 0 {
        // LOCAL: whatever the block holds is ignored.
        return Parsed::Header(ProxyHeader::Local, total);
    }
    let block = &buf[V2_FIXED..total];
    let header = match family {
        // AF_INET: source, destination, source port, destination port.
        1 => {
            if block.len() < 12 {
                return Parsed::Invalid("broken header: a short v2 IPv4 address block");
            }
            let ip =
                |at: usize| IpAddr::from([block[at], block[at + 1], block[at + 2], block[at + 3]]);
            let port = |at: usize| u16::from_be_bytes([block[at], block[at + 1]]);
            ProxyHeader::Proxied {
                source: SocketAddr::new(ip(0), port(8)),
                destination: SocketAddr::new(ip(4), port(10)),
            }
        }
        // AF_INET6: the same with 16-byte addresses.
        2 => {
            if block.len() < 36 {
                return Parsed::Invalid("broken header: a short v2 IPv6 address block");
            }
            let ip = |at: usize| {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(&block[at..at + 16]);
                IpAddr::from(octets)
            };
            let port = |at: usize| u16::from_be_bytes([block[at], block[at + 1]]);
            ProxyHeader::Proxied {
                source: SocketAddr::new(ip(0), port(32)),
                destination: SocketAddr::new(ip(16), port(34)),
            }
        }
        // AF_UNSPEC, AF_UNIX: nginx keeps the connection's own addresses.
        0 | 3 => ProxyHeader::Unknown,
        _ => return Parsed::Invalid("broken header: unknown v2 address family"),
    };
    Parsed::Header(header, total)
}

/// Why [`read_header`] gave up; the connection is to be closed.
#[derive(Debug)]
pub enum ReadError {
    /// Nothing whole arrived within the deadline.
    Timeout,
    /// The peer closed (or reset) before a whole header.
    Closed(io::Error),
    /// The bytes are not a PROXY header.
    Invalid(&'static str),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Timeout => f.write_str("PROXY protocol header not received in time"),
            ReadError::Closed(e) => write!(f, "closed before a whole PROXY protocol header: {e}"),
            ReadError::Invalid(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for ReadError {}

/// Reads the PROXY header that must open `stream`, consuming exactly its bytes, within
/// `timeout` (nginx: `client_header_timeout` on HTTP listeners, `proxy_protocol_timeout` on
/// stream ones).
pub async fn read_header(
    stream: &mut TcpStream,
    timeout: Duration,
) -> Result<ProxyHeader, ReadError> {
    read_header_with_tlvs(stream, timeout)
        .await
        .map(|(header, _)| header)
}

/// [`read_header`], also answering the TLVs of a v2 `PROXY` header with IPv4 or IPv6
/// addresses (the bytes after its address block; `None` when there are none), for [`tlv`].
pub async fn read_header_with_tlvs(
    stream: &mut TcpStream,
    timeout: Duration,
) -> Result<(ProxyHeader, Option<Box<[u8]>>), ReadError> {
    match tokio::time::timeout(timeout, read_header_untimed(stream)).await {
        Ok(r) => r,
        Err(_) => Err(ReadError::Timeout),
    }
}

/// The TLV bytes of a whole header (as [`parse`] measured it): after the address block of a
/// v2 `PROXY` command over IPv4 or IPv6, where nginx keeps them; none for anything else.
pub fn tlvs_of(header: &[u8]) -> Option<&[u8]> {
    if header.len() <= V2_FIXED || header[..V2_SIGNATURE.len()] != V2_SIGNATURE {
        return None;
    }
    if header[12] & 0x0f != 1 {
        return None;
    }
    let addresses = match header[13] >> 4 {
        1 => 12,
        2 => 36,
        _ => return None,
    };
    let tlvs = header.get(V2_FIXED + addresses..)?;
    (!tlvs.is_empty()).then_some(tlvs)
}

/// The TLV types nginx names (`$proxy_protocol_tlv_alpn` ...), the rest by `0x<hex>`.
const TLV_NAMES: [(&str, u32); 5] = [
    ("alpn", 0x01),
    ("authority", 0x02),
    ("unique_id", 0x05),
    ("ssl", 0x20),
    ("netns", 0x30),
];
/// The sub-TLVs of `PP2_TYPE_SSL` nginx names (`$proxy_protocol_tlv_ssl_version` ...).
const TLV_SSL_NAMES: [(&str, u32); 5] = [
    ("version", 0x21),
    ("cn", 0x22),
    ("cipher", 0x23),
    ("sig_alg", 0x24),
    ("key_alg", 0x25),
];
/// `PP2_TYPE_SSL`'s fixed part before its sub-TLVs: `client` (1 byte), `verify` (4 bytes).
const TLV_SSL_FIXED: usize = 5;

/// The value of the TLV `name` in `tlvs` (the part after `$proxy_protocol_tlv_`), as nginx's
/// `ngx_proxy_protocol_get_tlv` answers it: a type name (`alpn`, `authority`, `unique_id`,
/// `ssl`, `netns`) or `0x<hex type>`; with the `ssl_` prefix the same within the SSL TLV
/// (`ssl_version`, `ssl_cn`, `ssl_cipher`, `ssl_sig_alg`, `ssl_key_alg`, `ssl_0x<hex>`), and
/// `ssl_verify` its `verify` field in decimal. The first TLV of the type wins. An unknown
/// name, a bad hex type, a TLV list that runs past its end, or a type not present: `None`.
pub fn tlv<'a>(tlvs: &'a [u8], name: &str) -> Option<std::borrow::Cow<'a, [u8]>> {
    use std::borrow::Cow;
    let (list, names, name) = match name.strip_prefix("ssl_") {
        Some(rest) => {
            let ssl = find_tlv(tlvs, 0x20)?;
            if ssl.len() < TLV_SSL_FIXED {
                return None;
            }
            if rest == "verify" {
                let verify = u32::from_be_bytes([ssl[1], ssl[2], ssl[3], ssl[4]]);
                return Some(Cow::Owned(verify.to_string().into_bytes()));
            }
            (&ssl[TLV_SSL_FIXED..], &TLV_SSL_NAMES, rest)
        }
        None => (tlvs, &TLV_NAMES, name),
    };
    let kind = match name.strip_prefix("0x") {
        Some(hex) if !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            u32::from_str_radix(hex, 16).ok()?
        }
        Some(_) => return None,
        None => names.iter().find(|(n, _)| *n == name)?.1,
    };
    find_tlv(list, kind).map(Cow::Borrowed)
}

/// The value of the first TLV of `kind` in `list`; `None` when absent or the list is broken
/// before it.
fn find_tlv(mut list: &[u8], kind: u32) -> Option<&[u8]> {
    while !list.is_empty() {
        if list.len() < 3 {
            return None;
        }
        let len = usize::from(u16::from_be_bytes([list[1], list[2]]));
        let value = list.get(3..3 + len)?;
        if u32::from(list[0]) == kind {
            return Some(value);
        }
        list = &list[3 + len..];
    }
    None
}

async fn read_header_untimed(
    stream: &mut TcpStream,
) -> Result<(ProxyHeader, Option<Box<[u8]>>), ReadError> {
    // What was consumed so far: always a prefix of the header, never more.
    let mut taken: Vec<u8> = Vec::with_capacity(V1_MAX_HEADER);
    let mut peeked = vec![0u8; MAX_HEADER];
    loop {
        let room = MAX_HEADER - taken.len();
        let n = stream
            .peek(&mut peeked[..room])
            .await
            .map_err(ReadError::Closed)?;
        if n == 0 {
            return Err(ReadError::Closed(io::ErrorKind::UnexpectedEof.into()));
        }
        let mut seen = taken.clone();
        seen.extend_from_slice(&peeked[..n]);
        match parse(&seen) {
            Parsed::Header(header, used) => {
                let tlvs = tlvs_of(&seen[..used]).map(Box::from);
                let rest = used - taken.len();
                stream
                    .read_exact(&mut peeked[..rest])
                    .await
                    .map_err(ReadError::Closed)?;
                return Ok((header, tlvs));
            }
            Parsed::Invalid(why) => return Err(ReadError::Invalid(why)),
            Parsed::Incomplete if seen.len() >= MAX_HEADER => {
                return Err(ReadError::Invalid("too long PROXY protocol header"))
            }
            Parsed::Incomplete => {
                // All of it belongs to the header: take it, so the next peek waits for more
                // instead of answering the same bytes again.
                stream
                    .read_exact(&mut peeked[..n])
                    .await
                    .map_err(ReadError::Closed)?;
                taken.extend_from_slice(&peeked[..n]);
            }
        }
    }
}

/// The v1 header nginx's stream `proxy_protocol on` sends an upstream: the client's address
/// (after the realip rewrite) and the address it connected to. Mixed families are written
/// as IPv6 (an IPv4 address mapped), so the line is always well formed.
pub fn v1_header(source: SocketAddr, destination: SocketAddr) -> String {
    match (source.ip(), destination.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => format!(
            "PROXY TCP4 {s} {d} {} {}\r\n",
            source.port(),
            destination.port()
        ),
        (s, d) => {
            let v6 = |ip: IpAddr| match ip {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            format!(
                "PROXY TCP6 {} {} {} {}\r\n",
                v6(s),
                v6(d),
                source.port(),
                destination.port()
            )
        }
    }
}

#[cfg(test)]
mod tests;
