//! TCP (and TLS-terminated) sessions: accept (the PROXY protocol header read first where
//! the port requires one), match, preread, connect (a v1 header sent first where the port
//! says so), relay, log.
//!
//! The relay copies each direction on its own (so a slow reader on one side holds back only
//! that side's sender: back-pressure), and the session ends, as APISIX's does (nginx's
//! `proxy_half_close off`), once either side has closed and what it sent has been passed on.
//! A session with no byte either way for the idle timeout (the upstream's `timeout`, the
//! larger of `send` and `read`, else nginx's `proxy_timeout` default) is closed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrisix_net::proxy_protocol;
use ipnet::IpNet;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::plugins::{self, MqttRead, Preread, Session};
use crate::vars::ConnVars;
use crate::{connect, StreamHandle, StreamTimeouts};

/// The most bytes mqtt-proxy reads looking for a whole CONNECT packet.
const MAX_PREREAD: usize = 64 * 1024;

/// What a TCP stream port does besides relaying.
#[derive(Debug)]
pub struct TcpPort {
    /// TLS terminated here.
    pub tls: bool,
    /// A PROXY protocol header (v1 or v2) opens each connection.
    pub proxy_protocol: bool,
    /// A v1 header goes to the node before any byte of the session.
    pub proxy_protocol_to_upstream: bool,
    /// The peers whose PROXY header names the client (`nginx_config.stream.real_ip_from`).
    pub real_ip_from: Arc<[IpNet]>,
}

pub async fn serve(
    listener: TcpListener,
    port: Arc<TcpPort>,
    table: StreamHandle,
    timeouts: StreamTimeouts,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.changed() => return,
        };
        let (stream, remote) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors, most often: wait a little rather than spin.
                tracing::error!(error = %e, "stream: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        tokio::spawn(session(
            stream,
            remote,
            port.clone(),
            table.clone(),
            timeouts,
        ));
    }
}

async fn session(
    mut stream: TcpStream,
    remote: SocketAddr,
    port: Arc<TcpPort>,
    handle: StreamHandle,
    timeouts: StreamTimeouts,
) {
    let Ok(local) = stream.local_addr() else {
        return;
    };
    let _ = stream.set_nodelay(true);
    let mut vars = ConnVars::new(remote, local, "TCP");
    if port.proxy_protocol {
        match proxy_protocol::read_header_with_tlvs(&mut stream, timeouts.preread).await {
            Ok((header, tlvs)) => {
                vars.take_proxy_protocol(header, &port.real_ip_from);
                vars.proxy_protocol_tlvs = tlvs.map(Arc::from);
            }
            Err(e) => {
                tracing::info!(client = %remote, "stream: {e}");
                return;
            }
        }
    }
    let to_upstream = port.proxy_protocol_to_upstream;
    if !port.tls {
        return run(stream, vars, handle, timeouts, to_upstream).await;
    }
    let certs = handle.load().tls.clone();
    match ferrisix_tls::accept(stream, move || certs, false, timeouts.preread).await {
        Ok((mut stream, info)) => {
            if let Err(why) = client_verified(&info) {
                tracing::error!(client = %remote, ssl = %info.ssl.id, "stream: {why}");
                // The handshake finished (an ssl with `skip_mtls_uri_regex` asks without
                // requiring): the client gets its close_notify, then the FIN.
                let _ = tokio::time::timeout(Duration::from_secs(1), stream.shutdown()).await;
                return;
            }
            vars.sni = info.sni.clone();
            run(stream, vars, handle, timeouts, to_upstream).await;
        }
        Err(e) => tracing::info!(client = %remote, error = %e, "stream: TLS handshake failed"),
    }
}

/// APISIX's `verify_tls_client` (stream preread): an ssl with `client` lets a session in
/// only with a verified client certificate. `skip_mtls_uri_regex` has no URI to match on a
/// stream port, so it exempts nothing here.
fn client_verified(info: &ferrisix_tls::accept::TlsConnInfo) -> Result<(), String> {
    use ferrisix_tls::accept::ClientVerify;
    if info.ssl.client.is_none() {
        return Ok(());
    }
    match &info.client_verify {
        ClientVerify::Success => Ok(()),
        ClientVerify::None => Err("client certificate was not present".into()),
        ClientVerify::Failed(e) => Err(format!(
            "client certificate verification is not passed: {e}"
        )),
    }
}

async fn run<C>(
    mut client: C,
    mut vars: ConnVars,
    handle: StreamHandle,
    timeouts: StreamTimeouts,
    proxy_protocol_to_upstream: bool,
) where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let table = handle.load_full();
    let Some(route) = table.match_route(&vars).cloned() else {
        tracing::info!(client = %vars.remote, port = vars.local.port(), "stream: not hit any route");
        // A TLS client gets its close_notify, then the FIN.
        let _ = tokio::time::timeout(Duration::from_secs(1), client.shutdown()).await;
        return;
    };
    drop(table);
    vars.route_id = Some(route.id.clone());
    vars.service_id = route.service_id.clone();
    let mut session = Session::default();
    let served = serve_session(
        &mut client,
        &mut vars,
        &route,
        &mut session,
        timeouts,
        proxy_protocol_to_upstream,
    )
    .await;
    if !served {
        let _ = tokio::time::timeout(Duration::from_secs(1), client.shutdown()).await;
    }
    // The limit-conn tickets go before the log phase runs, as APISIX's log decrements.
    drop(session);
    plugins::log(&route.plugins, &vars);
}

/// The session after its route matched: `false` when it was closed before any relay.
async fn serve_session<C>(
    client: &mut C,
    vars: &mut ConnVars,
    route: &crate::StreamRoute,
    session: &mut Session,
    timeouts: StreamTimeouts,
    proxy_protocol_to_upstream: bool,
) -> bool
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    if let Preread::Close = plugins::preread(&route.plugins, vars, session).await {
        return false;
    }
    if let Some((name, level)) = session.mqtt.clone() {
        let mut buf = Vec::with_capacity(256);
        let read = tokio::time::timeout(timeouts.preread, async {
            loop {
                match plugins::check_mqtt_connect(&buf, &name, level) {
                    MqttRead::Incomplete if buf.len() < MAX_PREREAD => {}
                    MqttRead::Incomplete => return Err("packet too large"),
                    MqttRead::Bad(why) => return Err(why),
                    MqttRead::Connect(id) => return Ok(id),
                }
                let mut chunk = [0u8; 4096];
                match client.read(&mut chunk).await {
                    Ok(0) | Err(_) => return Err("closed before a whole CONNECT"),
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
        })
        .await;
        match read {
            Ok(Ok(id)) => {
                vars.mqtt_client_id = Some(id);
                vars.bytes_received += buf.len() as u64;
                session.preread = buf;
            }
            Ok(Err(why)) => {
                tracing::info!(client = %vars.remote, "stream: mqtt-proxy: {why}");
                return false;
            }
            Err(_) => return false,
        }
    }
    let Some(up) = session.upstream.clone().or_else(|| route.upstream.clone()) else {
        tracing::error!(stream_route = %route.id, "stream: missing upstream configuration");
        return false;
    };
    let idle = StreamTimeouts::idle_for(timeouts.idle, &up);
    if let Some(x) = &route.xrpc {
        // The protocol reads the session (APISIX's `xrpc.run_protocol` after preread).
        crate::xrpc::redis::serve(client, vars, x, &up, idle, session.preread.clone()).await;
        return true;
    }
    let Some(mut server) = connect::tcp(&up, vars, proxy_protocol_to_upstream).await else {
        return false;
    };
    if !session.preread.is_empty() && server.write_all(&session.preread).await.is_err() {
        return false;
    }
    let (up_bytes, down_bytes) = relay(client, server, idle).await;
    vars.bytes_received += up_bytes;
    vars.bytes_sent += down_bytes;
    true
}

/// Copies both ways until either side closes (its FIN passed on first) or nothing moved
/// for `idle`; answers the bytes sent upstream and downstream.
async fn relay<C, S>(client: &mut C, server: S, idle: Duration) -> (u64, u64)
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let start = Instant::now();
    let last = AtomicU64::new(0);
    let up = AtomicU64::new(0);
    let down = AtomicU64::new(0);
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut sr, mut sw) = tokio::io::split(server);
    tokio::select! {
        () = pump(&mut cr, &mut sw, &last, &up, start, idle) => {}
        () = pump(&mut sr, &mut cw, &last, &down, start, idle) => {}
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), cw.shutdown()).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), sw.shutdown()).await;
    (up.load(Ordering::Relaxed), down.load(Ordering::Relaxed))
}

async fn pump<R, W>(
    r: &mut R,
    w: &mut W,
    last: &AtomicU64,
    total: &AtomicU64,
    start: Instant,
    idle: Duration,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    let now_ms = || u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    loop {
        let n = match tokio::time::timeout(idle, r.read(&mut buf)).await {
            Err(_) => {
                // Idle only when the other direction was idle too.
                let since = now_ms().saturating_sub(last.load(Ordering::Relaxed));
                if u128::from(since) < idle.as_millis() {
                    continue;
                }
                return;
            }
            Ok(Ok(0)) | Ok(Err(_)) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), w.shutdown()).await;
                return;
            }
            Ok(Ok(n)) => n,
        };
        last.store(now_ms(), Ordering::Relaxed);
        match tokio::time::timeout(idle, w.write_all(&buf[..n])).await {
            Ok(Ok(())) => {}
            _ => return,
        }
        total.fetch_add(n as u64, Ordering::Relaxed);
    }
}
