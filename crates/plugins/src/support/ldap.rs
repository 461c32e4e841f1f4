//! A small LDAPv3 client (RFC 4511) for ldap-auth and ldap-auth-advanced: simple bind,
//! a subtree search with an equality filter, StartTLS (RFC 4513) and LDAPS, over one
//! connection, every exchange bounded by a timeout. Messages are BER-encoded here: the
//! username travels as an octet string inside the filter's structure, never as filter text,
//! so no username can change the filter (no LDAP filter injection).

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use ferrisix_plugin_api::tls_client::TlsClient;

/// The largest message read (a search answer for one user is far smaller).
const MAX_MESSAGE: usize = 1 << 20;

/// LDAP result code `invalidCredentials`.
pub const INVALID_CREDENTIALS: u32 = 49;
/// LDAP result code `sizeLimitExceeded`.
pub const SIZE_LIMIT_EXCEEDED: u32 = 4;

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Why an operation failed.
#[derive(Debug, Clone, PartialEq)]
pub enum LdapError {
    /// The connection, TLS or the protocol failed (an outage).
    Transport(String),
    /// The directory answered with a result code other than success.
    Result { code: u32, message: String },
}

impl std::fmt::Display for LdapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LdapError::Transport(e) => f.write_str(e),
            LdapError::Result { code, message } => {
                write!(f, "result code {code}, details: {message}")
            }
        }
    }
}

fn transport(e: impl std::fmt::Display) -> LdapError {
    LdapError::Transport(e.to_string())
}

/// How to reach the directory.
pub struct Target<'a> {
    pub host: &'a str,
    pub port: u16,
    pub ldaps: bool,
    pub starttls: bool,
    pub verify: bool,
    pub timeout: Duration,
}

/// One connection to a directory.
pub struct Connection {
    io: Box<dyn Io>,
    next_id: i64,
    timeout: Duration,
}

// BER encoding.

fn len(out: &mut Vec<u8>, n: usize) {
    if n < 0x80 {
        out.push(n as u8);
    } else {
        let bytes = n.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
}

fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    len(&mut out, content.len());
    out.extend_from_slice(content);
    out
}

fn int(tag: u8, v: i64) -> Vec<u8> {
    let bytes = v.to_be_bytes();
    let mut i = 0;
    while i < 7
        && ((bytes[i] == 0 && bytes[i + 1] & 0x80 == 0)
            || (bytes[i] == 0xff && bytes[i + 1] & 0x80 != 0))
    {
        i += 1;
    }
    tlv(tag, &bytes[i..])
}

fn octets(v: &[u8]) -> Vec<u8> {
    tlv(0x04, v)
}

fn seq(tag: u8, parts: &[Vec<u8>]) -> Vec<u8> {
    tlv(tag, &parts.concat())
}

/// One decoded element: tag and content.
#[derive(Debug)]
struct Element<'a> {
    tag: u8,
    content: &'a [u8],
}

/// The elements of `data`, in order.
fn elements(mut data: &[u8]) -> Result<Vec<Element<'_>>, LdapError> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let (tag, content, rest) = split(data)?;
        out.push(Element { tag, content });
        data = rest;
    }
    Ok(out)
}

fn split(data: &[u8]) -> Result<(u8, &[u8], &[u8]), LdapError> {
    let bad = || transport("malformed LDAP message");
    let tag = *data.first().ok_or_else(bad)?;
    let first = *data.get(1).ok_or_else(bad)?;
    let (n, head) = if first < 0x80 {
        (first as usize, 2)
    } else {
        let k = (first & 0x7f) as usize;
        if k == 0 || k > 4 {
            return Err(bad());
        }
        let b = data.get(2..2 + k).ok_or_else(bad)?;
        (b.iter().fold(0usize, |a, x| (a << 8) | *x as usize), 2 + k)
    };
    let content = data.get(head..head + n).ok_or_else(bad)?;
    Ok((tag, content, &data[head + n..]))
}

fn uint(content: &[u8]) -> u32 {
    content
        .iter()
        .fold(0u32, |a, b| a.wrapping_shl(8) | u32::from(*b))
}

/// An `LDAPResult`'s code and diagnostic message.
fn result(content: &[u8]) -> Result<(u32, String), LdapError> {
    let parts = elements(content)?;
    let code = parts
        .first()
        .map(|e| uint(e.content))
        .ok_or_else(|| transport("malformed LDAP result"))?;
    let message = parts
        .get(2)
        .map(|e| String::from_utf8_lossy(e.content).into_owned())
        .unwrap_or_default();
    Ok((code, message))
}

fn check((code, message): (u32, String)) -> Result<(), LdapError> {
    if code == 0 {
        Ok(())
    } else {
        Err(LdapError::Result { code, message })
    }
}

async fn write_message<S: Io + ?Sized>(
    io: &mut S,
    id: i64,
    op: Vec<u8>,
    timeout: Duration,
) -> Result<(), LdapError> {
    let msg = seq(0x30, &[int(0x02, id), op]);
    tokio::time::timeout(timeout, io.write_all(&msg))
        .await
        .map_err(|_| transport("timeout"))?
        .map_err(transport)
}

/// Reads one LDAPMessage: (protocolOp tag, its content).
async fn read_message<S: Io + ?Sized>(
    io: &mut S,
    timeout: Duration,
) -> Result<(u8, Vec<u8>), LdapError> {
    let read = async {
        let mut head = [0u8; 2];
        io.read_exact(&mut head).await.map_err(transport)?;
        let n = if head[1] < 0x80 {
            head[1] as usize
        } else {
            let k = (head[1] & 0x7f) as usize;
            if k == 0 || k > 4 {
                return Err(transport("malformed LDAP message"));
            }
            let mut b = [0u8; 4];
            io.read_exact(&mut b[..k]).await.map_err(transport)?;
            b[..k].iter().fold(0usize, |a, x| (a << 8) | *x as usize)
        };
        if n > MAX_MESSAGE {
            return Err(transport("LDAP message too large"));
        }
        let mut body = vec![0u8; n];
        io.read_exact(&mut body).await.map_err(transport)?;
        Ok(body)
    };
    let body = tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| transport("timeout"))??;
    let parts = elements(&body)?;
    let op = parts
        .get(1)
        .ok_or_else(|| transport("malformed LDAP message"))?;
    Ok((op.tag, op.content.to_vec()))
}

impl Connection {
    /// Connects (TLS from the start with `ldaps`, or after StartTLS with `starttls`).
    pub async fn open(target: &Target<'_>, tls: &TlsClient) -> Result<Connection, LdapError> {
        let tcp = tokio::time::timeout(
            target.timeout,
            TcpStream::connect((target.host, target.port)),
        )
        .await
        .map_err(|_| transport("timeout"))?
        .map_err(|e| {
            transport(format!(
                "failed to connect to {}:{}: {e}",
                target.host, target.port
            ))
        })?;
        if target.ldaps {
            let stream =
                tokio::time::timeout(target.timeout, tls.connect(tcp, target.host, target.verify))
                    .await
                    .map_err(|_| transport("timeout"))?
                    .map_err(transport)?;
            return Ok(Connection {
                io: Box::new(stream),
                next_id: 1,
                timeout: target.timeout,
            });
        }
        let mut tcp = tcp;
        if target.starttls {
            // StartTLS: the extended operation in the clear, then the handshake on the same
            // TCP connection.
            let oid = tlv(0x80, b"1.3.6.1.4.1.1466.20037");
            write_message(&mut tcp, 1, seq(0x77, &[oid]), target.timeout).await?;
            let (tag, content) = read_message(&mut tcp, target.timeout).await?;
            if tag != 0x78 {
                return Err(transport("unexpected StartTLS answer"));
            }
            check(result(&content)?)?;
            let stream =
                tokio::time::timeout(target.timeout, tls.connect(tcp, target.host, target.verify))
                    .await
                    .map_err(|_| transport("timeout"))?
                    .map_err(transport)?;
            return Ok(Connection {
                io: Box::new(stream),
                next_id: 2,
                timeout: target.timeout,
            });
        }
        Ok(Connection {
            io: Box::new(tcp),
            next_id: 1,
            timeout: target.timeout,
        })
    }

    async fn send(&mut self, op: Vec<u8>) -> Result<i64, LdapError> {
        let id = self.next_id;
        self.next_id += 1;
        write_message(&mut *self.io, id, op, self.timeout).await?;
        Ok(id)
    }

    async fn read(&mut self) -> Result<(u8, Vec<u8>), LdapError> {
        read_message(&mut *self.io, self.timeout).await
    }

    /// Sends `op` and reads answers up to the one that ends the operation.
    async fn exchange(&mut self, op: Vec<u8>) -> Result<Vec<(u8, Vec<u8>)>, LdapError> {
        self.send(op).await?;
        let mut out = Vec::new();
        loop {
            let (tag, content) = self.read().await?;
            // Search entries (0x64) and references (0x73) precede the search's end (0x65).
            let last = !matches!(tag, 0x64 | 0x73);
            out.push((tag, content));
            if last {
                return Ok(out);
            }
        }
    }

    /// A simple bind as `dn` with `password` (both empty: anonymous).
    pub async fn bind(&mut self, dn: &str, password: &str) -> Result<(), LdapError> {
        let op = seq(
            0x60,
            &[
                int(0x02, 3),
                octets(dn.as_bytes()),
                tlv(0x80, password.as_bytes()),
            ],
        );
        let answer = self.exchange(op).await?;
        match answer.last() {
            Some((0x61, content)) => check(result(content)?),
            _ => Err(transport("unexpected bind answer")),
        }
    }

    /// The DNs of the entries under `base` (whole subtree) whose `attribute` equals `value`.
    pub async fn search(
        &mut self,
        base: &str,
        attribute: &str,
        value: &str,
        size_limit: i64,
        time_limit: i64,
    ) -> Result<Vec<String>, LdapError> {
        let filter = seq(
            0xa3,
            &[octets(attribute.as_bytes()), octets(value.as_bytes())],
        );
        let op = seq(
            0x63,
            &[
                octets(base.as_bytes()),
                int(0x0a, 2),
                int(0x0a, 3),
                int(0x02, size_limit),
                int(0x02, time_limit),
                tlv(0x01, &[0]),
                filter,
                // "1.1": no attributes, the DNs only.
                seq(0x30, &[octets(b"1.1")]),
            ],
        );
        let answer = self.exchange(op).await?;
        let mut dns = Vec::new();
        for (tag, content) in &answer {
            match tag {
                0x64 => {
                    let parts = elements(content)?;
                    if let Some(dn) = parts.first() {
                        dns.push(String::from_utf8_lossy(dn.content).into_owned());
                    }
                }
                0x65 => check(result(content)?)?,
                _ => {}
            }
        }
        Ok(dns)
    }

    /// Ends the session politely (errors do not matter: the connection is dropped).
    pub async fn unbind(mut self) {
        let _ = self.send(tlv(0x42, &[])).await;
    }
}

/// `core.utils.parse_addr`: `host`, `host:port` or `[v6]:port`.
pub fn parse_addr(addr: &str) -> (String, Option<u16>) {
    if let Some(rest) = addr.strip_prefix('[') {
        if let Some((host, tail)) = rest.split_once(']') {
            let port = tail.strip_prefix(':').and_then(|p| p.parse().ok());
            return (host.to_owned(), port);
        }
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => match port.parse() {
            Ok(p) => (host.to_owned(), Some(p)),
            Err(_) => (addr.to_owned(), None),
        },
        _ => (addr.to_owned(), None),
    }
}

/// RFC 4514 escaping of an attribute value put in a DN.
pub fn escape_dn_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let last = v.chars().count().saturating_sub(1);
    for (i, c) in v.chars().enumerate() {
        match c {
            ',' | '+' | '"' | '\\' | '<' | '>' | ';' | '=' => {
                out.push('\\');
                out.push(c);
            }
            '\0' => out.push_str("\\00"),
            ' ' if i == 0 || i == last => out.push_str("\\ "),
            '#' if i == 0 => out.push_str("\\#"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ber_round_trip() {
        assert_eq!(int(0x02, 3), vec![0x02, 0x01, 0x03]);
        assert_eq!(int(0x02, 128), vec![0x02, 0x02, 0x00, 0x80]);
        assert_eq!(int(0x02, -1), vec![0x02, 0x01, 0xff]);
        let long = octets(&[7u8; 300]);
        assert_eq!(&long[..4], &[0x04, 0x82, 0x01, 0x2c]);
        let (tag, content, rest) = split(&long).unwrap();
        assert_eq!((tag, content.len(), rest.len()), (0x04, 300, 0));
        let r = seq(0x61, &[int(0x0a, 49), octets(b""), octets(b"bad")]);
        let (_, content, _) = split(&r).unwrap();
        assert_eq!(result(content).unwrap(), (49, "bad".into()));
        assert!(split(&[0x04, 0x05, 1]).is_err());
    }

    #[test]
    fn addresses() {
        assert_eq!(parse_addr("h:1389"), ("h".into(), Some(1389)));
        assert_eq!(parse_addr("h"), ("h".into(), None));
        assert_eq!(parse_addr("[::1]:636"), ("::1".into(), Some(636)));
    }

    #[test]
    fn dn_values_are_escaped() {
        assert_eq!(escape_dn_value("a,b=c"), "a\\,b\\=c");
        assert_eq!(escape_dn_value(" #x "), "\\ #x\\ ");
        assert_eq!(escape_dn_value("#x"), "\\#x");
    }
}
