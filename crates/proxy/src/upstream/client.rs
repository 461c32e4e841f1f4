//! The upstream client (HTTP/1.1, HTTP/2, over TCP or TLS): connect with a timeout, keep-alive pools per node, and request
//! bodies that are either replayable (buffered) or streamed.
//!
//! Pools are per worker thread, as nginx's `keepalive` cache is per worker: a worker never
//! touches another's connections, so checking a connection out or in takes no lock.

mod mux;
mod pool;
mod request_body;

use std::io;
use std::sync::Arc;
use std::time::Duration;

use ferrisix_tls::UpstreamTls;
use http::header::{self, HeaderValue};
use http::{Request, Response, Uri, Version};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

pub use mux::StreamSlot;
use pool::Sender;
pub use pool::{PoolKey, PoolLimits, PooledConn};
pub use request_body::{SendProgress, StreamSource, UpstreamBody};

use crate::error::{ErrorKind, ProxyError};

/// Per-try timeouts (`timeout.connect/send/read`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TryTimeouts {
    pub connect: Duration,
    pub send: Duration,
    pub read: Duration,
}

impl Default for TryTimeouts {
    fn default() -> Self {
        // nginx's defaults; APISIX sets none of its own.
        let d = Duration::from_secs(60);
        TryTimeouts {
            connect: d,
            send: d,
            read: d,
        }
    }
}

/// Opens a new connection for `key` and performs the HTTP/1.1 or HTTP/2 handshake; with `tls`
/// the TLS handshake comes first, sending `key.sni` (none for an address), all within `timeout`.
pub async fn connect(
    key: PoolKey,
    limits: PoolLimits,
    timeout: Duration,
    tls: Option<&UpstreamTls>,
) -> Result<PooledConn, ProxyError> {
    let (sender, _) = open(&key, timeout, tls).await?;
    Ok(PooledConn::new(key, limits, sender, false))
}

/// A new connection's request half, and for HTTP/2 what the server said in its first SETTINGS
/// (awaited within `timeout`). Over TLS an `h2` key speaks what the server picked by ALPN:
/// HTTP/1.1 when it picked that, or picked nothing while HTTP/1.1 was offered.
async fn open(
    key: &PoolKey,
    timeout: Duration,
    tls: Option<&UpstreamTls>,
) -> Result<(Sender, Option<Arc<mux::Peer>>), ProxyError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let stream = match tokio::time::timeout_at(deadline, TcpStream::connect(key.addr)).await {
        Err(_) => return Err(ErrorKind::ConnectTimeout.into()),
        Ok(Err(e)) => {
            tracing::debug!(addr = %key.addr, error = %e, "upstream connect failed");
            return Err(classify_connect_error(&e));
        }
        Ok(Ok(s)) => s,
    };
    let _ = stream.set_nodelay(true);
    match tls {
        None => handshake(stream, key.h2, deadline).await,
        Some(tls) => {
            let name = key
                .sni
                .as_deref()
                .and_then(ferrisix_tls::upstream::server_name)
                .unwrap_or_else(|| ServerName::IpAddress(key.addr.ip().into()));
            let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
            let stream = match tokio::time::timeout_at(deadline, connector.connect(name, stream))
                .await
            {
                Err(_) => return Err(ProxyError::new(ErrorKind::ConnectTimeout)),
                Ok(Err(e)) => {
                    // nginx: "SSL_do_handshake() failed ... while SSL handshaking to upstream".
                    tracing::error!(addr = %key.addr, sni = %ferrisix_net::clip(key.sni.as_deref().unwrap_or("")), error = %e, "SSL handshake with upstream failed");
                    return Err(ProxyError::new(ErrorKind::ConnectRefused));
                }
                Ok(Ok(s)) => s,
            };
            let h2 = key.h2
                && match stream.get_ref().1.alpn_protocol() {
                    Some(p) => p == b"h2",
                    None => !tls
                        .config
                        .alpn_protocols
                        .iter()
                        .any(|p| p.as_slice() == b"http/1.1"),
                };
            handshake(stream, h2, deadline).await
        }
    }
}

async fn handshake<IO>(
    io: IO,
    h2: bool,
    deadline: tokio::time::Instant,
) -> Result<(Sender, Option<Arc<mux::Peer>>), ProxyError>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    if h2 {
        let peer = mux::Peer::new();
        let io = TokioIo::new(mux::FrameWatch::new(io, peer.clone()));
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake(io)
            .await
            .map_err(|_| ProxyError::new(ErrorKind::ConnectRefused))?;
        let watched = peer.clone();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::trace!(error = %e, "upstream h2 connection ended");
            }
            watched.ended();
        });
        // The server's limit on streams is known before the connection is shared.
        match tokio::time::timeout_at(deadline, peer.settings()).await {
            Err(_) => return Err(ErrorKind::ConnectTimeout.into()),
            Ok(false) => {
                tracing::debug!("upstream closed the connection before its HTTP/2 settings");
                return Err(ErrorKind::ConnectRefused.into());
            }
            Ok(true) => {}
        }
        return Ok((Sender::H2(sender), Some(peer)));
    }
    let (sender, conn) = http1::Builder::new()
        .handshake(TokioIo::new(io))
        .await
        .map_err(|_| ProxyError::new(ErrorKind::ConnectRefused))?;
    tokio::spawn(async move {
        // Upgrades let a 101 answer turn into a websocket tunnel.
        if let Err(e) = conn.with_upgrades().await {
            tracing::trace!(error = %e, "upstream connection ended");
        }
    });
    Ok((Sender::H1(sender), None))
}

fn classify_connect_error(e: &io::Error) -> ProxyError {
    match e.kind() {
        io::ErrorKind::TimedOut => ErrorKind::ConnectTimeout.into(),
        _ => ErrorKind::ConnectRefused.into(),
    }
}

/// Outcome of sending one request on one connection.
pub enum SendOutcome {
    Response(Response<Incoming>),
    /// The connection failed before the request was written: it can be sent elsewhere as is.
    NotSent(Request<UpstreamBody>, ProxyError),
    Failed(ProxyError),
}

/// Sends `req` on `conn` and waits for the response head within the timeouts.
///
/// The read timeout runs from the moment the request is fully written; while a streamed body is
/// still being written, the send timeout bounds the gap between two writes, as nginx's
/// `proxy_send_timeout` does.
pub async fn send(
    conn: &mut PooledConn,
    req: Request<UpstreamBody>,
    timeouts: TryTimeouts,
) -> SendOutcome {
    let progress = req.body().progress();
    if conn.ready().await.is_err() {
        return SendOutcome::NotSent(req, ErrorKind::ConnectionBroken.into());
    }
    let h1 = matches!(conn.sender(), Sender::H1(_));
    // An upstream that offers HTTP/2 by ALPN, on a connection where the server chose
    // HTTP/1.1: the request goes in that form.
    let req = if h1 && req.version() == Version::HTTP_2 {
        to_h1(req)
    } else {
        req
    };
    let fut = conn.sender().send(req);
    let result = match &progress {
        // HTTP/1: one request at a time, so the connection's own timer serves.
        None if h1 => {
            let timer = conn.head_timer(tokio::time::Instant::now() + timeouts.read);
            tokio::select! {
                biased;
                r = fut => r,
                () = timer => return SendOutcome::Failed(ErrorKind::ReadTimeout.into()),
            }
        }
        None => match tokio::time::timeout(timeouts.read, fut).await {
            Ok(r) => r,
            Err(_) => return SendOutcome::Failed(ErrorKind::ReadTimeout.into()),
        },
        Some(progress) => {
            let mut fut = std::pin::pin!(fut);
            // Progress moves the deadline, and the phase can change while this sleeps (the
            // body starts waiting on the client, whose timeout may be the shorter): look again
            // at least once per the shorter of the two. `client_body_timeout: 0` fails any
            // wait on the client at once; it must not make this loop spin meanwhile.
            let step = timeouts
                .send
                .min(progress.client_gap())
                .max(Duration::from_millis(1));
            loop {
                let (deadline, failure) = progress.deadline(timeouts.send, timeouts.read);
                let now = tokio::time::Instant::now();
                if deadline <= now {
                    return SendOutcome::Failed(failure);
                }
                if let Ok(r) = tokio::time::timeout_at(deadline.min(now + step), &mut fut).await {
                    break r;
                }
            }
        }
    };
    match result {
        Ok(resp) => SendOutcome::Response(resp),
        Err(mut e) => {
            let failure = if progress.as_ref().is_some_and(SendProgress::too_large) {
                // The client's body passed the route's limit: its fault, no other try.
                ErrorKind::BodyTooLarge.into()
            } else if progress.as_ref().is_some_and(SendProgress::client_broke) {
                ErrorKind::BodyBroken.into()
            } else if e.error().is_parse() {
                ProxyError::new(ErrorKind::InvalidResponse)
            } else {
                ProxyError::new(ErrorKind::ConnectionBroken)
            };
            match e.take_message() {
                Some(req) => SendOutcome::NotSent(req, failure),
                None => SendOutcome::Failed(failure),
            }
        }
    }
}

/// An HTTP/2 request in HTTP/1.1's form: the authority as `Host`, an origin-form target.
fn to_h1(mut req: Request<UpstreamBody>) -> Request<UpstreamBody> {
    if let Some(host) = req
        .uri()
        .authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    {
        req.headers_mut().insert(header::HOST, host);
    }
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    if let Ok(uri) = path.parse::<Uri>() {
        *req.uri_mut() = uri;
    }
    *req.version_mut() = Version::HTTP_11;
    req
}

/// Takes an idle pooled connection for `key`, or opens one; for HTTP/2, a stream on a
/// multiplexed connection (an HTTP/1.1 one kept when the server chose that by ALPN first).
pub async fn checkout(
    key: &PoolKey,
    limits: PoolLimits,
    connect_timeout: Duration,
    tls: Option<&UpstreamTls>,
) -> Result<PooledConn, ProxyError> {
    match pool::take_idle(key) {
        Some(conn) => Ok(conn),
        None if key.h2 => mux::checkout(key, limits, connect_timeout, tls).await,
        None => connect(key.clone(), limits, connect_timeout, tls).await,
    }
}

/// Drops the idle connections past their timeouts; run periodically by each worker.
pub fn evict_expired_idle() {
    pool::evict_expired();
    mux::evict_expired();
}
