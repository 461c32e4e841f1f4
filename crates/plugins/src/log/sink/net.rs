//! One batch over the network: written on a new TCP connection (optionally TLS) and closed,
//! or sent as one UDP datagram. Each step is bounded by the logger's timeout; the error
//! names the step so each logger words it as APISIX's does.

use std::sync::Arc;
use std::time::Duration;

use ferrisix_plugin_api::TlsClient;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// Where a send failed, with the cause.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetError {
    Connect(String),
    Handshake(String),
    Send(String),
}

/// TLS on a TCP log connection.
#[derive(Clone, Debug)]
pub struct Tls {
    pub client: Arc<TlsClient>,
    /// The SNI (and verified name); `None`: the host.
    pub server_name: Option<String>,
    pub verify: bool,
}

async fn bounded<T>(
    timeout: Duration,
    step: impl std::future::Future<Output = std::io::Result<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(timeout, step).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timeout".into()),
    }
}

async fn write_all<S: AsyncWrite + Unpin>(
    mut s: S,
    data: &[u8],
    timeout: Duration,
) -> Result<(), NetError> {
    bounded(timeout, async {
        s.write_all(data).await?;
        s.shutdown().await
    })
    .await
    .map_err(NetError::Send)
}

/// Writes `data` on a new connection to `host:port` (TLS when `tls`), then closes it.
pub async fn tcp(
    host: &str,
    port: u16,
    timeout: Duration,
    tls: Option<&Tls>,
    data: &[u8],
) -> Result<(), NetError> {
    let stream = bounded(timeout, TcpStream::connect((host, port)))
        .await
        .map_err(NetError::Connect)?;
    match tls {
        None => write_all(stream, data, timeout).await,
        Some(tls) => {
            let name = tls.server_name.as_deref().unwrap_or(host);
            let stream =
                match tokio::time::timeout(timeout, tls.client.connect(stream, name, tls.verify))
                    .await
                {
                    Ok(r) => r.map_err(NetError::Handshake)?,
                    Err(_) => return Err(NetError::Handshake("timeout".into())),
                };
            let mut stream = stream;
            bounded(timeout, async {
                stream.write_all(data).await?;
                stream.shutdown().await
            })
            .await
            .map_err(NetError::Send)?;
            // A TLS 1.3 server sends session tickets the client never asked to read; closing
            // with them unread turns the close into a reset, which can make the server drop
            // the tail of what it had not read yet. Reading to the server's close first (the
            // data is sent: how long the server takes to close is not an error) keeps it
            // whole.
            let mut sink = [0u8; 4096];
            let _ = tokio::time::timeout(timeout, async {
                while let Ok(n) = stream.read(&mut sink).await {
                    if n == 0 {
                        break;
                    }
                }
            })
            .await;
            Ok(())
        }
    }
}

/// Sends `data` as one datagram to `host:port` (resolved, from an ephemeral port).
pub async fn udp(host: &str, port: u16, timeout: Duration, data: &[u8]) -> Result<(), NetError> {
    let sock = bounded(timeout, async {
        let addr = tokio::net::lookup_host((host, port))
            .await?
            .next()
            .ok_or_else(|| std::io::Error::other("no address"))?;
        let sock = UdpSocket::bind(if addr.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        })
        .await?;
        sock.connect(addr).await?;
        Ok(sock)
    })
    .await
    .map_err(NetError::Connect)?;
    bounded(timeout, sock.send(data))
        .await
        .map(drop)
        .map_err(NetError::Send)
}
