//! The HTTP client plugins call out with (forward-auth, the loggers, tracing exporters):
//! HTTP/1.1 over TCP, or TLS for `https` URIs (the server verified unless the call says
//! `ssl_verify` off), with keep-alive connections per scheme, `host:port` and verification,
//! every call bounded by a timeout. The connections' I/O runs on the gateway's [`Executor`].

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::exec::Executor;
use crate::tls_client::TlsClient;

/// Idle connections kept per `host:port`, and how long, unless a call says otherwise.
const IDLE_PER_HOST: usize = 8;
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// How a call's connection is kept for the next call to the same server, as lua-resty-http's
/// `set_keepalive(timeout, pool_size)`: idle at most `idle`, among at most `pool` idle
/// connections to that server (an idle connection beyond them is closed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeepAlive {
    pub idle: Duration,
    pub pool: usize,
}

impl KeepAlive {
    /// APISIX's `keepalive` (default true), `keepalive_timeout` (milliseconds, default 60000)
    /// and `keepalive_pool` (default `default_pool`) of a plugin's conf; `None` with
    /// `keepalive: false` (a connection per call).
    pub fn of_conf(
        conf: &serde_json::Map<String, serde_json::Value>,
        default_pool: usize,
    ) -> Option<KeepAlive> {
        use serde_json::Value;
        if conf.get("keepalive").and_then(Value::as_bool) == Some(false) {
            return None;
        }
        Some(KeepAlive {
            idle: Duration::from_millis(
                conf.get("keepalive_timeout")
                    .and_then(Value::as_u64)
                    .unwrap_or(60_000),
            ),
            pool: conf
                .get("keepalive_pool")
                .and_then(Value::as_u64)
                .map_or(default_pool, |n| n.max(1) as usize),
        })
    }
}

impl Default for KeepAlive {
    fn default() -> Self {
        KeepAlive {
            idle: IDLE_TIMEOUT,
            pool: IDLE_PER_HOST,
        }
    }
}
/// The largest response body read.
const MAX_RESPONSE_BODY: usize = 16 * 1024 * 1024;

/// Why a call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HttpError {
    InvalidUri(String),
    Unsupported(String),
    Connect(String),
    /// The TLS handshake of an `https` call failed (a certificate not verified, no TLS).
    Tls(String),
    Timeout,
    Protocol(String),
    BodyTooLarge,
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::InvalidUri(u) => write!(f, "invalid uri {u}"),
            HttpError::Unsupported(s) => f.write_str(s),
            HttpError::Connect(e) => write!(f, "connect failed: {e}"),
            HttpError::Tls(e) => write!(f, "TLS handshake failed: {e}"),
            HttpError::Timeout => f.write_str("timeout"),
            HttpError::Protocol(e) => write!(f, "{e}"),
            HttpError::BodyTooLarge => f.write_str("response body too large"),
        }
    }
}

impl std::error::Error for HttpError {}

type Sender = SendRequest<Full<Bytes>>;

/// The client of one gateway.
pub struct HttpClient {
    executor: Executor,
    tls: TlsClient,
    /// Per server, its idle connections and when each stops being kept.
    idle: Mutex<HashMap<String, Vec<(Sender, Instant)>>>,
}

impl fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HttpClient")
    }
}

impl HttpClient {
    /// `https` verified against the system's CA bundle.
    pub fn new(executor: Executor) -> HttpClient {
        HttpClient::with_tls(executor, &TlsClient::new(None))
    }

    /// `https` verified against `tls`'s roots.
    pub fn with_tls(executor: Executor, tls: &TlsClient) -> HttpClient {
        HttpClient {
            executor,
            tls: tls.for_alpn(&[b"http/1.1"]),
            idle: Mutex::new(HashMap::new()),
        }
    }

    fn take_idle(&self, authority: &str) -> Option<Sender> {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.get_mut(authority)?;
        // Kept past its time: dropped (closed) here, as the pool's timer would have.
        list.retain(|(s, until)| *until > now && !s.is_closed());
        list.pop().map(|(s, _)| s)
    }

    fn put_idle(&self, authority: String, sender: Sender, keep: KeepAlive) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.entry(authority).or_default();
        let now = Instant::now();
        list.retain(|(s, until)| *until > now && !s.is_closed());
        if list.len() < keep.pool {
            list.push((sender, now + keep.idle));
        }
    }

    async fn connect(&self, host: &str, port: u16, tls: Option<bool>) -> Result<Sender, HttpError> {
        let stream = TcpStream::connect((host, port))
            .await
            .map_err(|e| HttpError::Connect(e.to_string()))?;
        let _ = stream.set_nodelay(true);
        match tls {
            None => self.handshake(stream).await,
            Some(verify) => {
                let stream = self
                    .tls
                    .connect(stream, host, verify)
                    .await
                    .map_err(HttpError::Tls)?;
                self.handshake(stream).await
            }
        }
    }

    async fn handshake<T>(&self, io: T) -> Result<Sender, HttpError>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, conn) = http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| HttpError::Connect(e.to_string()))?;
        self.executor
            .spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "http client connection ended");
                }
            })
            .map_err(HttpError::Connect)?;
        Ok(sender)
    }

    /// Sends `req` (an absolute `http://` or `https://` URI; the server's certificate
    /// verified) and reads the whole answer, all within `timeout`.
    pub async fn send(
        &self,
        req: Request<Bytes>,
        timeout: Duration,
    ) -> Result<Response<Bytes>, HttpError> {
        self.send_verified(req, timeout, true).await
    }

    /// [`HttpClient::send`] with `ssl_verify` given: off, an `https` server's certificate is
    /// not checked (encryption without authentication).
    pub async fn send_verified(
        &self,
        req: Request<Bytes>,
        timeout: Duration,
        ssl_verify: bool,
    ) -> Result<Response<Bytes>, HttpError> {
        self.send_kept(req, timeout, ssl_verify, Some(KeepAlive::default()))
            .await
    }

    /// [`HttpClient::send_verified`] with the connection kept for the next call as `keep`
    /// says, or (`None`) used for this call alone and closed after it (`keepalive: false`).
    pub async fn send_kept(
        &self,
        req: Request<Bytes>,
        timeout: Duration,
        ssl_verify: bool,
        keep: Option<KeepAlive>,
    ) -> Result<Response<Bytes>, HttpError> {
        tokio::time::timeout(timeout, self.send_inner(req, ssl_verify, keep))
            .await
            .map_err(|_| HttpError::Timeout)?
    }

    /// Sends `req` and answers as soon as the response head is there, within `timeout`; the
    /// body is read by the caller, as it arrives (an LLM's server-sent events). The
    /// connection serves this call alone and closes when the body is dropped.
    pub async fn send_streaming(
        &self,
        req: Request<Bytes>,
        timeout: Duration,
        ssl_verify: bool,
    ) -> Result<Response<hyper::body::Incoming>, HttpError> {
        tokio::time::timeout(timeout, async {
            let (sender, parts, body, _) = self.prepare(req, ssl_verify, false).await?;
            let mut sender = sender;
            sender
                .send_request(Request::from_parts(parts, Full::new(body)))
                .await
                .map_err(|e| HttpError::Protocol(e.to_string()))
        })
        .await
        .map_err(|_| HttpError::Timeout)?
    }

    /// A ready connection for `req` (an idle one when `reuse`) and the request to send on it.
    async fn prepare(
        &self,
        req: Request<Bytes>,
        ssl_verify: bool,
        reuse: bool,
    ) -> Result<(Sender, http::request::Parts, Bytes, String), HttpError> {
        let (mut parts, body) = req.into_parts();
        let uri = parts.uri.clone();
        let tls = match uri.scheme_str() {
            Some("http") => None,
            Some("https") => Some(ssl_verify),
            Some(other) => {
                return Err(HttpError::Unsupported(format!(
                    "{other} is not supported by the plugin HTTP client"
                )))
            }
            None => return Err(HttpError::InvalidUri(uri.to_string())),
        };
        let host = uri
            .host()
            .ok_or_else(|| HttpError::InvalidUri(uri.to_string()))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri
            .port_u16()
            .unwrap_or(if tls.is_some() { 443 } else { 80 });
        // Verified and unverified connections to one server are not interchangeable.
        let authority = match tls {
            None => format!("{host}:{port}"),
            Some(verify) => format!("https://{host}:{port}#{verify}"),
        };
        parts.uri = uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .parse::<Uri>()
            .map_err(|e| HttpError::InvalidUri(e.to_string()))?;
        if !parts.headers.contains_key(header::HOST) {
            if let Some(a) = uri.authority() {
                if let Ok(v) = HeaderValue::from_str(a.as_str()) {
                    parts.headers.insert(header::HOST, v);
                }
            }
        }
        let idle = if reuse {
            self.take_idle(&authority)
        } else {
            None
        };
        let mut sender = match idle {
            Some(s) => s,
            None => self.connect(&host, port, tls).await?,
        };
        sender
            .ready()
            .await
            .map_err(|e| HttpError::Protocol(e.to_string()))?;
        Ok((sender, parts, body, authority))
    }

    async fn send_inner(
        &self,
        req: Request<Bytes>,
        ssl_verify: bool,
        keep: Option<KeepAlive>,
    ) -> Result<Response<Bytes>, HttpError> {
        let (mut sender, parts, body, authority) =
            self.prepare(req, ssl_verify, keep.is_some()).await?;
        let resp = sender
            .send_request(Request::from_parts(parts, Full::new(body)))
            .await
            .map_err(|e| HttpError::Protocol(e.to_string()))?;
        let (head, body) = resp.into_parts();
        let body = Limited::new(body, MAX_RESPONSE_BODY)
            .collect()
            .await
            .map_err(|e| {
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
                {
                    HttpError::BodyTooLarge
                } else {
                    HttpError::Protocol(e.to_string())
                }
            })?
            .to_bytes();
        let closing = head
            .headers
            .get(header::CONNECTION)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        match keep {
            Some(keep) if !closing && !sender.is_closed() => self.put_idle(authority, sender, keep),
            // Dropping the last handle closes the connection once the call is done.
            _ => drop(sender),
        }
        Ok(Response::from_parts(head, body))
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn keep_alive_calls_and_errors() {
        let (port, accepted) = counting_server().await;
        let client = HttpClient::new(Executor::current());
        for _ in 0..3 {
            let req = Request::get(format!("http://127.0.0.1:{port}/x"))
                .body(Bytes::new())
                .unwrap();
            let resp = client.send(req, Duration::from_secs(5)).await.unwrap();
            assert_eq!(resp.status(), 200);
            assert_eq!(resp.body(), "ok");
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::Relaxed), 1);
        let ftp = Request::get("ftp://127.0.0.1/").body(Bytes::new()).unwrap();
        assert!(matches!(
            client.send(ftp, Duration::from_secs(1)).await,
            Err(HttpError::Unsupported(_))
        ));
    }

    /// `keepalive: false` uses a connection per call; a kept one is not reused past its idle
    /// time; at most `pool` idle connections per server are kept.
    #[tokio::test]
    async fn keep_alive_as_the_call_says() {
        let (port, accepted) = counting_server().await;
        let count = || accepted.load(std::sync::atomic::Ordering::Relaxed);
        let client = HttpClient::new(Executor::current());
        let call = |keep: Option<KeepAlive>| {
            let req = Request::get(format!("http://127.0.0.1:{port}/x"))
                .body(Bytes::new())
                .unwrap();
            let client = &client;
            async move {
                let resp = client
                    .send_kept(req, Duration::from_secs(5), true, keep)
                    .await
                    .unwrap();
                assert_eq!(resp.body(), "ok");
            }
        };
        for _ in 0..3 {
            call(None).await;
        }
        assert_eq!(count(), 3, "one connection per call");
        // Long enough that a loaded machine's pauses between two calls do not expire it.
        let short = KeepAlive {
            idle: Duration::from_millis(1500),
            pool: 1,
        };
        call(Some(short)).await;
        call(Some(short)).await;
        assert_eq!(count(), 4, "kept and reused");
        tokio::time::sleep(Duration::from_millis(1700)).await;
        call(Some(short)).await;
        assert_eq!(count(), 5, "not reused past its idle time");
        // Two at once need two connections; a pool of 1 keeps one of them.
        tokio::join!(call(Some(short)), call(Some(short)));
        assert_eq!(count(), 6);
        tokio::join!(call(Some(short)), call(Some(short)));
        assert_eq!(count(), 7, "one of the two was kept");
    }

    /// A keep-alive HTTP/1.1 server answering `ok` to every request; counts its connections.
    async fn counting_server() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut seen = Vec::new();
                    loop {
                        let n = s.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buf[..n]);
                        while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            seen.drain(..end + 4);
                            let _ = s
                                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                                .await;
                        }
                    }
                });
            }
        });
        (port, accepted)
    }
}
