//! Accepting a TLS connection: the ClientHello is read first, its SNI (or `fallback_sni`)
//! chooses the ssl and so the server config (certificates, protocols, client verification),
//! then the handshake completes, all within the handshake timeout.
//!
//! Bad input is answered as nginx answers it: plain HTTP on the TLS port gets nginx's
//! `400 The plain HTTP request was sent to HTTPS port`, anything else that is not a TLS
//! handshake, an SNI without a certificate, or a stalled handshake is cut off. rustls bounds the
//! ClientHello's size and refuses renegotiation, so a connection costs its buffers only.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::UnixTime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::LazyConfigAcceptor;

use crate::store::{CertStore, SslEntry};

/// The result of client-certificate verification, as nginx's `$ssl_client_verify`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientVerify {
    /// No certificate asked for or none sent.
    None,
    Success,
    Failed(String),
}

/// What the request path knows about a TLS connection.
#[derive(Clone, Debug)]
pub struct TlsConnInfo {
    /// The SNI the client sent (lower-case), `None` when it sent none.
    pub sni: Option<String>,
    /// The ssl that served the handshake.
    pub ssl: Arc<SslEntry>,
    pub client_verify: ClientVerify,
    /// `h2` was negotiated by ALPN.
    pub h2: bool,
}

#[derive(Debug)]
pub enum AcceptError {
    /// Plain HTTP was sent to the TLS port; nginx's 400 was written.
    PlainHttp,
    /// Not a TLS handshake, or the handshake failed.
    Handshake(String),
    /// No ssl for this SNI (or no SNI and no `fallback_sni`).
    NoCertificate(Option<String>),
    /// The ssl exists but cannot serve (its key does not match its certificate).
    Unusable(String),
    Timeout,
}

impl std::fmt::Display for AcceptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AcceptError::PlainHttp => f.write_str("plain HTTP request sent to the HTTPS port"),
            AcceptError::Handshake(e) => write!(f, "TLS handshake failed: {e}"),
            // The SNI is the client's, logged before any authentication.
            AcceptError::NoCertificate(Some(sni)) => {
                write!(
                    f,
                    "failed to match any SSL certificate by SNI: {}",
                    ferrisix_net::clip(sni)
                )
            }
            AcceptError::NoCertificate(None) => f.write_str(
                "failed to find SNI: the client sent none and no fallback_sni is set \
                 (it may be requesting by IP)",
            ),
            AcceptError::Unusable(e) => write!(f, "failed to set the ssl's certificate: {e}"),
            AcceptError::Timeout => f.write_str("TLS handshake timed out"),
        }
    }
}

/// nginx's answer to plain HTTP on an `ssl` listener.
const PLAIN_HTTP_ANSWER: &[u8] = b"HTTP/1.1 400 Bad Request\r\n\
Content-Type: text/html\r\nContent-Length: 220\r\nConnection: close\r\n\r\n\
<html>\r\n<head><title>400 The plain HTTP request was sent to HTTPS port</title></head>\r\n\
<body>\r\n<center><h1>400 Bad Request</h1></center>\r\n\
<center>The plain HTTP request was sent to HTTPS port</center>\r\n</body>\r\n</html>\r\n";

/// Accepts one connection. `store` is read once the ClientHello is in, so a certificate change
/// applies to every handshake that starts after it.
pub async fn accept(
    stream: TcpStream,
    store: impl FnOnce() -> Arc<CertStore>,
    http2: bool,
    timeout: Duration,
) -> Result<(TlsStream<TcpStream>, TlsConnInfo), AcceptError> {
    let deadline = Instant::now() + timeout;
    let remaining = || deadline.saturating_duration_since(Instant::now());
    let mut stream = stream;
    let mut first = [0u8; 1];
    match tokio::time::timeout(remaining(), stream.peek(&mut first)).await {
        Err(_) => return Err(AcceptError::Timeout),
        Ok(Err(e)) => return Err(AcceptError::Handshake(e.to_string())),
        Ok(Ok(0)) => return Err(AcceptError::Handshake("connection closed".into())),
        Ok(Ok(_)) => {}
    }
    // 0x16 is a TLS handshake record; an upper-case letter starts an HTTP method.
    if first[0] != 0x16 {
        if first[0].is_ascii_uppercase() {
            answer_plain_http(&mut stream, remaining().min(Duration::from_secs(5))).await;
            return Err(AcceptError::PlainHttp);
        }
        return Err(AcceptError::Handshake("not a TLS handshake".into()));
    }
    let start = match tokio::time::timeout(
        remaining(),
        LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream),
    )
    .await
    {
        Err(_) => return Err(AcceptError::Timeout),
        Ok(Err(e)) => return Err(AcceptError::Handshake(e.to_string())),
        Ok(Ok(s)) => s,
    };
    let store = store();
    let client_sni = start
        .client_hello()
        .server_name()
        .map(|s| s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase());
    let Some(sni) = store.effective_sni(client_sni.as_deref()) else {
        return Err(AcceptError::NoCertificate(None));
    };
    let Some(entry) = store.lookup(&sni).cloned() else {
        return Err(AcceptError::NoCertificate(Some(sni)));
    };
    let config = entry
        .config(http2)
        .map_err(|e| AcceptError::Unusable(format!("ssl {}: {e}", entry.id)))?;
    let tls = match tokio::time::timeout(remaining(), start.into_stream(config)).await {
        Err(_) => return Err(AcceptError::Timeout),
        Ok(Err(e)) => return Err(AcceptError::Handshake(e.to_string())),
        Ok(Ok(t)) => t,
    };
    let (_, conn) = tls.get_ref();
    let h2 = conn.alpn_protocol() == Some(b"h2");
    let client_verify = match (&entry.client, conn.peer_certificates()) {
        (None, _) => ClientVerify::None,
        (Some(_), None) => ClientVerify::None,
        (Some(_), Some([])) => ClientVerify::None,
        (Some(policy), Some([leaf, rest @ ..])) => {
            match policy.verifier.verify_chain(leaf, rest, UnixTime::now()) {
                Ok(()) => ClientVerify::Success,
                Err(e) => ClientVerify::Failed(e),
            }
        }
    };
    Ok((
        tls,
        TlsConnInfo {
            sni: client_sni,
            ssl: entry,
            client_verify,
            h2,
        },
    ))
}

/// Reads what the client sent (up to the end of its request head, 8 KiB, or the timeout),
/// then answers as nginx does and closes.
async fn answer_plain_http(stream: &mut TcpStream, timeout: Duration) {
    let mut buf = vec![0u8; 8192];
    let mut len = 0;
    let _ = tokio::time::timeout(timeout, async {
        while len < buf.len() {
            match stream.read(&mut buf[len..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    len += n;
                    if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    let _ = tokio::time::timeout(timeout, async {
        let _ = stream.write_all(PLAIN_HTTP_ANSWER).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

#[cfg(test)]
mod tests {
    #[test]
    fn plain_http_answer_length() {
        let text = std::str::from_utf8(super::PLAIN_HTTP_ANSWER).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
    }
}
