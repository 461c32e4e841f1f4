//! The upstream side of a session: the node picked by the upstream's balancer (health and
//! retries as on the HTTP side), then a TCP connection, TLS over it for `scheme: tls`, or a
//! connected UDP socket for `scheme: udp`.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ferrisix_config::model::Scheme;
use ferrisix_proxy::error::{ErrorKind, ProxyError};
use ferrisix_proxy::snapshot::CompiledUpstream;
use ferrisix_proxy::upstream::balancer::PickState;
use ferrisix_proxy::upstream::nodes::HealthView;
use ferrisix_router::VarSource;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpStream, UdpSocket};
use tokio_rustls::client::TlsStream;

use crate::vars::ConnVars;

/// The SNI nginx's stream module sends a TLS upstream when the client sent none.
const DEFAULT_SNI: &str = "apisix_backend";

/// A connection to a node: plain or TLS.
pub enum Upstream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Upstream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Upstream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Upstream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Upstream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Upstream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Upstream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Upstream::Plain(s) => Pin::new(s).poll_flush(cx),
            Upstream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Upstream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Upstream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The chash key of this session (APISIX's `fetch_chash_hash_key` over stream variables).
fn hash_key<'a>(up: &CompiledUpstream, vars: &'a ConnVars) -> Cow<'a, str> {
    match &up.hash_on {
        Some(h) => h.key(&|n| vars.var(n), None),
        None => Cow::Borrowed(""),
    }
}

fn connect_timeout(up: &CompiledUpstream) -> Duration {
    let t = up.timeouts.connect;
    if t.is_zero() {
        Duration::from_secs(60)
    } else {
        t
    }
}

/// Connects to a node of `up`, trying the next node on a failure while tries are left. With
/// `proxy_protocol`, a v1 PROXY header naming the client (`$remote_addr`, after the realip
/// rewrite) and the address it connected to goes first, before a TLS handshake too, as
/// nginx's stream `proxy_protocol on` sends it.
pub async fn tcp(
    up: &CompiledUpstream,
    vars: &mut ConnVars,
    proxy_protocol: bool,
) -> Option<Upstream> {
    let set = up.nodes.ready(connect_timeout(up)).await;
    let key = hash_key(up, vars).into_owned();
    let mut state = PickState::new(Cow::Owned(key));
    let mut tried = Vec::new();
    let mut health = HealthView::default();
    let max = up.max_tries(&set);
    while tried.len() < max {
        let node = set.pick(&mut state, &tried, &mut health)?;
        tried.push(node);
        let target = &set.nodes[node];
        let addr = target.addr;
        vars.upstream_addr = Some(addr);
        let connected =
            match tokio::time::timeout(connect_timeout(up), TcpStream::connect(addr)).await {
                Ok(Ok(s)) => Ok(s),
                Ok(Err(_)) => Err(ErrorKind::ConnectRefused),
                Err(_) => Err(ErrorKind::ConnectTimeout),
            };
        let mut stream = match connected {
            Ok(s) => s,
            Err(kind) => {
                tracing::warn!(upstream = %addr, error = ?kind, "stream: connecting to the upstream failed");
                set.report_retry(node, ProxyError::new(kind));
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        if proxy_protocol {
            let header = ferrisix_net::proxy_protocol::v1_header(vars.remote, vars.local);
            let sent =
                tokio::time::timeout(connect_timeout(up), stream.write_all(header.as_bytes()))
                    .await;
            if !matches!(sent, Ok(Ok(()))) {
                tracing::warn!(upstream = %addr, "stream: sending the PROXY protocol header to the upstream failed");
                set.report_retry(node, ProxyError::new(ErrorKind::ConnectionBroken));
                continue;
            }
        }
        if up.scheme != Scheme::Tls {
            return Some(Upstream::Plain(stream));
        }
        let tls = up.tls.as_ref()?;
        let sni = vars.sni.clone().unwrap_or_else(|| DEFAULT_SNI.to_string());
        let name = ferrisix_tls::upstream::server_name(&sni)?;
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(&tls.config));
        match tokio::time::timeout(connect_timeout(up), connector.connect(name, stream)).await {
            Ok(Ok(s)) => return Some(Upstream::Tls(Box::new(s))),
            Ok(Err(e)) => {
                tracing::warn!(upstream = %addr, error = %e, "stream: TLS handshake with the upstream failed");
                set.report_retry(node, ProxyError::new(ErrorKind::ConnectionBroken));
            }
            Err(_) => {
                tracing::warn!(upstream = %addr, "stream: TLS handshake with the upstream timed out");
                set.report_retry(node, ProxyError::new(ErrorKind::ConnectTimeout));
            }
        }
    }
    None
}

/// A UDP socket connected to a node of `up` (UDP cannot tell a dead node: no retry).
pub async fn udp(up: &CompiledUpstream, vars: &mut ConnVars) -> Option<UdpSocket> {
    let set = up.nodes.ready(connect_timeout(up)).await;
    let key = hash_key(up, vars).into_owned();
    let mut state = PickState::new(Cow::Owned(key));
    let mut health = HealthView::default();
    let node = set.pick(&mut state, &[], &mut health)?;
    let addr: SocketAddr = set.nodes[node].addr;
    vars.upstream_addr = Some(addr);
    let bind: SocketAddr = if addr.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(bind).await.ok()?;
    socket.connect(addr).await.ok()?;
    Some(socket)
}
