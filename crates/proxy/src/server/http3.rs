//! HTTP/3 over QUIC on the ssl listeners with `enable_http3` (nginx's `listen ... quic`).
//!
//! Each worker runs one quinn endpoint per such listener on a UDP socket of its own bound with
//! `SO_REUSEPORT` (the kernel spreads the clients' 4-tuples over the workers, as it spreads TCP
//! connections). quinn sends with UDP GSO and receives with GRO where the kernel has them
//! (quinn-udp probes both), and sets ECN and don't-fragment itself.
//!
//! A request takes the same path as over HTTP/1.1 and HTTP/2: its head and body go to
//! [`ConnInfo::handle_parts`], the body as a [`ClientBody::H3`]; the answer streams back as the
//! response body yields it, each DATA frame written only once QUIC's flow control takes it
//! (backpressure), trailers included. Certificates come from the current snapshot's `ssls` by
//! SNI ([`ferrisix_tls::quic`]).
//!
//! Limits follow nginx's HTTP/3 and the HTTP/2 settings: concurrent request streams as
//! `http2_max_concurrent_streams` (nginx's `http3_max_concurrent_streams` has the same default),
//! three unidirectional streams per peer (control and QPACK's two, as nginx), stream and
//! connection receive windows as HTTP/2's, the header section as HTTP/2's header list, the
//! idle timeout as `keepalive_timeout`, the handshake and request head bounded by
//! `client_header_timeout`, each DATA frame's send by `send_timeout`.
//!
//! On shutdown the endpoint stops taking handshakes, each connection sends GOAWAY (with the
//! last request it accepted), finishes the requests in flight, then closes with
//! `H3_NO_ERROR`; the worker's [`Drain`] counts QUIC connections as open until then.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use ferrisix_net::{ConnLimits, Drain};
use http::header::{self, HeaderName};
use http::{Method, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::task::JoinSet;

use super::{GatewayHandle, Http2Limits};
use crate::client_body::{ClientBody, H3Body, H3Recv};
use crate::gateway::ConnInfo;
use crate::response::body::ResponseBody;

type H3Send = h3::server::RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;
type Resolver = h3::server::RequestResolver<h3_quinn::Connection, Bytes>;

/// nginx's `http3`/`quic` unidirectional stream allowance: the control stream and QPACK's
/// encoder and decoder streams.
const MAX_UNI_STREAMS: u32 = 3;

/// How long a stopping worker waits for its QUIC connections' closes to go out.
const CLOSE_FLUSH: Duration = Duration::from_secs(2);

/// How long a draining connection whose requests are done waits for the client to close it
/// before closing it itself: a close discards what QUIC has not delivered yet, so the client
/// gets this long to acknowledge the last answers (nginx's `lingering_timeout` for TCP has the
/// same purpose).
const CLOSE_LINGER: Duration = Duration::from_secs(2);

/// The `Alt-Svc` value that TCP answers carry on a listener with an HTTP/3 twin.
pub fn alt_svc(port: u16) -> http::HeaderValue {
    http::HeaderValue::try_from(format!("h3=\":{port}\"; ma=86400"))
        .unwrap_or_else(|_| http::HeaderValue::from_static("clear"))
}

/// Binds the UDP socket of one worker's endpoint on `addr`. Always with `SO_REUSEPORT`: the
/// workers share the port, and a restart's successor binds its own sockets beside those of
/// the process it replaces (UDP sockets are not handed over).
pub fn bind(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        let _ = socket.set_only_v6(true);
    }
    socket.bind(&addr.into())?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// What every endpoint of a worker is configured from.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub limits: ConnLimits,
    pub http2: Http2Limits,
}

/// quinn's server config: TLS by SNI from the gateway's current snapshot, nginx's limits.
fn server_config(
    gateways: &GatewayHandle,
    settings: &Settings,
) -> Result<quinn::ServerConfig, String> {
    let source = gateways.clone();
    let store: ferrisix_tls::quic::StoreSource =
        Arc::new(move || source.load().snapshot.load().tls.clone());
    let tls = ferrisix_tls::quic::server_config(store).map_err(|e| e.to_string())?;
    let crypto =
        quinn::crypto::rustls::QuicServerConfig::try_from(tls).map_err(|e| e.to_string())?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    let h2 = settings.http2;
    transport
        .max_concurrent_bidi_streams(h2.max_concurrent_streams.into())
        .max_concurrent_uni_streams(MAX_UNI_STREAMS.into())
        .stream_receive_window(h2.initial_stream_window_size.into())
        .receive_window(h2.initial_connection_window_size.into());
    // keepalive_timeout 0 turns keep-alive off in nginx; a QUIC connection has no request-less
    // state to fall back on, so the header timeout bounds its quiet time instead.
    let idle = match settings.limits.keepalive_timeout {
        d if d.is_zero() => settings.limits.header_timeout,
        d => d,
    };
    transport.max_idle_timeout(quinn::IdleTimeout::try_from(idle).ok());
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// One worker's endpoint on `socket`: serves until `stop`, then answers with the endpoint so
/// the worker can flush its closes once the connections drained ([`close`]).
pub async fn serve(
    socket: std::net::UdpSocket,
    gateways: GatewayHandle,
    settings: Settings,
    drain: Drain,
    mut stop: tokio::sync::broadcast::Receiver<()>,
) -> Option<quinn::Endpoint> {
    let local = socket.local_addr().ok()?;
    let config = match server_config(&gateways, &settings) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(%local, "HTTP/3: cannot configure QUIC: {e}");
            return None;
        }
    };
    let endpoint = match quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        Some(config),
        socket,
        Arc::new(quinn::TokioRuntime),
    ) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(%local, error = %e, "HTTP/3: cannot start the QUIC endpoint");
            return None;
        }
    };
    loop {
        tokio::select! {
            _ = stop.recv() => break,
            incoming = endpoint.accept() => {
                let Some(incoming) = incoming else { break };
                let gateway = gateways.load_full();
                tokio::spawn(connection(incoming, gateway, local, settings, drain.clone()));
            }
        }
    }
    // No new handshakes; the connections drain on their own.
    endpoint.set_server_config(None);
    Some(endpoint)
}

/// Waits (briefly) for the closes of a stopped endpoint's connections to go out.
pub async fn close(endpoint: quinn::Endpoint) {
    endpoint.close(0u32.into(), b"");
    let _ = tokio::time::timeout(CLOSE_FLUSH, endpoint.wait_idle()).await;
}

/// What the connection loop acts on next.
enum Event {
    Request(Result<Option<Box<Resolver>>, h3::error::ConnectionError>),
    Drain,
    Finished,
}

async fn connection(
    incoming: quinn::Incoming,
    gateway: Arc<crate::gateway::Gateway>,
    local: SocketAddr,
    settings: Settings,
    drain: Drain,
) {
    let _open = drain.enter();
    let peer = incoming.remote_address();
    let conn = match tokio::time::timeout(settings.limits.header_timeout, incoming).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::info!(client = %peer, "QUIC handshake failed: {e}");
            return;
        }
        Err(_) => {
            tracing::info!(client = %peer, "QUIC handshake timed out");
            return;
        }
    };
    let sni = conn
        .handshake_data()
        .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|d| d.server_name);
    let tls = match ferrisix_tls::quic::conn_info(&gateway.snapshot.load().tls, sni) {
        Ok(tls) => tls,
        Err(e) => {
            tracing::error!(client = %peer, "{e}");
            conn.close(0x0101u32.into(), b"");
            return;
        }
    };
    let stats = gateway.stats.clone();
    let info = Arc::new(ConnInfo::new(gateway, peer, local).with_tls(tls));
    let quic = conn.clone();
    let mut builder = h3::server::builder();
    builder.max_field_section_size(settings.http2.max_header_list_size.into());
    let mut h3 = match builder.build(h3_quinn::Connection::new(conn)).await {
        Ok(h3) => h3,
        Err(e) => {
            tracing::debug!(client = %peer, "HTTP/3 connection setup failed: {e}");
            return;
        }
    };
    stats.connection_opened();
    let mut requests = JoinSet::new();
    let mut draining = false;
    loop {
        let event = tokio::select! {
            r = h3.accept() => Event::Request(r.map(|r| r.map(Box::new))),
            _ = drain.started(), if !draining => Event::Drain,
            Some(_) = requests.join_next(), if !requests.is_empty() => Event::Finished,
        };
        match event {
            Event::Request(Ok(Some(resolver))) => {
                requests.spawn(request(*resolver, info.clone(), settings.limits));
            }
            Event::Request(Ok(None)) => break,
            Event::Request(Err(e)) => {
                if !e.is_h3_no_error() {
                    tracing::debug!(client = %peer, "HTTP/3 connection ended: {e}");
                }
                break;
            }
            Event::Drain => {
                draining = true;
                // GOAWAY naming the last request taken: later ones are refused
                // (H3_REQUEST_REJECTED), so the client retries them elsewhere.
                if let Err(e) = h3.shutdown(0).await {
                    tracing::debug!(client = %peer, "HTTP/3 GOAWAY failed: {e}");
                }
            }
            Event::Finished => {}
        }
        if draining && requests.is_empty() {
            break;
        }
    }
    while requests.join_next().await.is_some() {}
    if draining {
        let _ = tokio::time::timeout(CLOSE_LINGER, quic.closed()).await;
    }
    // Dropping the connection closes it with H3_NO_ERROR.
    drop(h3);
    stats.connection_closed();
}

/// The headers that belong to a hop of HTTP/1.1 and are malformed in HTTP/3 (RFC 9114 4.2).
static HOP_HEADERS: [HeaderName; 4] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("keep-alive"),
];

async fn request(resolver: Resolver, info: Arc<ConnInfo>, limits: ConnLimits) {
    let resolved = tokio::time::timeout(limits.header_timeout, resolver.resolve_request()).await;
    let (req, stream) = match resolved {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::debug!(client = %info.peer(), "HTTP/3 request refused: {e}");
            return;
        }
        Err(_) => return,
    };
    let (mut send, recv) = stream.split();
    let (parts, ()) = req.into_parts();
    let head_only = parts.method == Method::HEAD;
    let declared = match parts.headers.get(header::CONTENT_LENGTH) {
        None => None,
        Some(v) => match v.to_str().ok().and_then(|s| s.parse::<u64>().ok()) {
            Some(n) => Some(n),
            None => {
                let _ = respond_bad_request(&mut send).await;
                return;
            }
        },
    };
    let body = match declared {
        Some(n) => H3Body::new(recv, Some(n), None, false),
        None => match first_chunk(recv, limits.header_timeout).await {
            Some(body) => body,
            None => return,
        },
    };
    let resp = info
        .handle_parts(parts, ClientBody::H3(Box::new(body)))
        .await;
    if let Err(e) = send_response(&mut send, resp, head_only, limits.send_timeout).await {
        tracing::debug!(client = %info.peer(), "HTTP/3 response not sent whole: {e}");
        send.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
    }
}

/// A body without Content-Length: HTTP/3 has no end-of-body flag on the head, so the first
/// DATA frame (or the stream's end) is awaited, to tell an empty body (the usual GET) from one
/// that streams, as HTTP/1.1's framing and HTTP/2's END_STREAM tell at once. `None`: the
/// stream broke.
async fn first_chunk(mut recv: H3Recv, timeout: Duration) -> Option<H3Body> {
    let first = match tokio::time::timeout(timeout, recv.recv_data()).await {
        Err(_) => return Some(H3Body::new(recv, None, None, false)),
        Ok(Err(e)) => {
            tracing::debug!("HTTP/3 request body broke: {e}");
            return None;
        }
        Ok(Ok(None)) => None,
        Ok(Ok(Some(mut buf))) => Some(buf.copy_to_bytes(buf.remaining())),
    };
    let ended = first.is_none();
    Some(H3Body::new(recv, None, first, ended))
}

async fn respond_bad_request(send: &mut H3Send) -> Result<(), h3::error::StreamError> {
    let resp = Response::builder()
        .status(StatusCode::BAD_REQUEST)
        .body(())
        .unwrap_or_default();
    send.send_response(resp).await?;
    send.finish().await
}

#[derive(Debug)]
enum SendError {
    Stream(h3::error::StreamError),
    Body(String),
    Timeout,
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Stream(e) => e.fmt(f),
            SendError::Body(e) => write!(f, "response body: {e}"),
            SendError::Timeout => f.write_str("send_timeout passed"),
        }
    }
}

async fn timed<T>(
    limit: Duration,
    f: impl std::future::Future<Output = Result<T, h3::error::StreamError>>,
) -> Result<T, SendError> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r.map_err(SendError::Stream),
        Err(_) => Err(SendError::Timeout),
    }
}

/// Sends the head, then the body frame by frame: each DATA frame waits until QUIC takes it.
async fn send_response(
    send: &mut H3Send,
    resp: Response<ResponseBody>,
    head_only: bool,
    send_timeout: Duration,
) -> Result<(), SendError> {
    let (mut parts, body) = resp.into_parts();
    for name in &HOP_HEADERS {
        parts.headers.remove(name);
    }
    let bodyless = head_only
        || parts.status.is_informational()
        || parts.status == StatusCode::NO_CONTENT
        || parts.status == StatusCode::NOT_MODIFIED;
    timed(
        send_timeout,
        send.send_response(Response::from_parts(parts, ())),
    )
    .await?;
    if !bodyless {
        let mut body = std::pin::pin!(body);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| SendError::Body(e.to_string()))?;
            match frame.into_data() {
                Ok(data) => {
                    if !data.is_empty() {
                        timed(send_timeout, send.send_data(data)).await?;
                    }
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        timed(send_timeout, send.send_trailers(trailers)).await?;
                        break;
                    }
                }
            }
        }
    } else {
        // The log phase runs when the body goes, as for a HEAD answer over TCP.
        drop(body);
    }
    timed(send_timeout, send.finish()).await
}
