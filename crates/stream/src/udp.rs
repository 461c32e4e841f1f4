//! UDP sessions: one per client address on each listener, each with a connected socket to
//! its node; a datagram either way keeps it alive, and it ends after the idle timeout (the
//! upstream's `timeout`, the larger of `send` and `read`, when it sets one). The
//! listener's own task owns the session map (no lock); sessions are capped per listener, a
//! datagram past the cap from a new address is dropped.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::mpsc;

use crate::plugins::{self, Preread, Session};
use crate::vars::ConnVars;
use crate::{connect, StreamHandle, StreamTimeouts};

/// Sessions per listener.
const MAX_SESSIONS: usize = 10_000;
/// Datagrams queued towards one session's node.
const QUEUE: usize = 256;
/// A UDP session with no datagram either way for this long ends.
const UDP_IDLE: Duration = Duration::from_secs(60);

pub async fn serve(
    socket: Arc<UdpSocket>,
    table: StreamHandle,
    timeouts: StreamTimeouts,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let Ok(local) = socket.local_addr() else {
        return;
    };
    let idle = timeouts.idle.min(UDP_IDLE);
    let mut sessions: HashMap<SocketAddr, mpsc::Sender<Vec<u8>>> = HashMap::new();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<SocketAddr>();
    let mut buf = vec![0u8; 65_536];
    let mut warned = false;
    loop {
        tokio::select! {
            r = socket.recv_from(&mut buf) => {
                let Ok((n, peer)) = r else { continue };
                let data = buf[..n].to_vec();
                let data = match sessions.get(&peer) {
                    Some(tx) => match tx.try_send(data) {
                        Ok(()) => continue,
                        // A full queue drops the datagram, as a full socket buffer would.
                        Err(mpsc::error::TrySendError::Full(_)) => continue,
                        Err(mpsc::error::TrySendError::Closed(d)) => d,
                    },
                    None => data,
                };
                if sessions.len() >= MAX_SESSIONS {
                    if !warned {
                        tracing::warn!(listener = %local, "stream: UDP session cap reached; datagrams from new clients dropped");
                        warned = true;
                    }
                    continue;
                }
                warned = false;
                let (tx, rx) = mpsc::channel(QUEUE);
                let _ = tx.try_send(data);
                sessions.insert(peer, tx);
                tokio::spawn(session(socket.clone(), peer, local, rx, table.clone(), idle, done_tx.clone()));
            }
            Some(peer) = done_rx.recv() => {
                if sessions.get(&peer).is_some_and(mpsc::Sender::is_closed) {
                    sessions.remove(&peer);
                }
            }
            _ = shutdown.changed() => return,
        }
    }
}

async fn session(
    socket: Arc<UdpSocket>,
    peer: SocketAddr,
    local: SocketAddr,
    mut rx: mpsc::Receiver<Vec<u8>>,
    handle: StreamHandle,
    idle: Duration,
    done: mpsc::UnboundedSender<SocketAddr>,
) {
    let mut vars = ConnVars::new(peer, local, "UDP");
    let route = handle.load().match_route(&vars).cloned();
    if let Some(route) = route {
        vars.route_id = Some(route.id.clone());
        vars.service_id = route.service_id.clone();
        let mut state = Session::default();
        if let Preread::Continue = plugins::preread(&route.plugins, &vars, &mut state).await {
            let up = state.upstream.clone().or_else(|| route.upstream.clone());
            match up {
                Some(up) => {
                    if let Some(node) = connect::udp(&up, &mut vars).await {
                        let idle = crate::StreamTimeouts::idle_for(idle, &up);
                        relay(&socket, peer, &node, &mut rx, &mut vars, idle).await;
                    }
                }
                None => {
                    tracing::error!(stream_route = %route.id, "stream: missing upstream configuration")
                }
            }
        }
        drop(state);
        plugins::log(&route.plugins, &vars);
    } else {
        tracing::info!(client = %peer, port = local.port(), "stream: not hit any route");
    }
    drop(rx);
    let _ = done.send(peer);
}

async fn relay(
    socket: &UdpSocket,
    peer: SocketAddr,
    node: &UdpSocket,
    rx: &mut mpsc::Receiver<Vec<u8>>,
    vars: &mut ConnVars,
    idle: Duration,
) {
    let mut buf = vec![0u8; 65_536];
    loop {
        tokio::select! {
            d = rx.recv() => match d {
                Some(d) => {
                    vars.bytes_received += d.len() as u64;
                    let _ = node.send(&d).await;
                }
                None => return,
            },
            r = node.recv(&mut buf) => {
                // An error is an ICMP one from the node (nothing listening): the session
                // goes on.
                if let Ok(n) = r {
                    vars.bytes_sent += n as u64;
                    let _ = socket.send_to(&buf[..n], peer).await;
                }
            }
            () = tokio::time::sleep(idle) => return,
        }
    }
}
