//! The L4 stream proxy: APISIX's `stream_routes` over TCP, TLS and UDP, a sibling of the HTTP
//! data plane.
//!
//! It shares the HTTP side's configuration flow: every snapshot the HTTP side publishes
//! carries the store's `stream_routes`, and [`follow`] compiles them into a [`StreamTable`]
//! against that snapshot's upstreams, services and certificates (`table`). The listeners
//! (`tcp`, `udp`) read only the published table: no locks, no store calls per connection.
//!
//! The modules, in the order a connection meets them:
//!
//! - `tcp` / `udp`: accept (a PROXY protocol header read first on `proxy_protocol` ports;
//!   TLS terminated on `tls: true` ports with the `ssls` certificate for the SNI), match a
//!   route (`table`), run the plugins' preread phase (`plugins`), pick
//!   and connect a node through the route's upstream (`connect`), relay, then the log phase.
//! - `xrpc`: a route with `protocol` (redis) reads the session as that protocol's requests
//!   instead of relaying it (after the preread phase, in place of `connect` and the relay).
//! - `vars`: the nginx stream variables a connection answers (`remote_addr`, `server_port`,
//!   `route_id`, `mqtt_client_id` ...), for plugins, chash keys and log formats.
#![forbid(unsafe_code)]

mod connect;
mod plugins;
mod table;
mod tcp;
mod udp;
mod vars;
mod xrpc;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use ferrisix_config::settings::StreamListen;
use ferrisix_plugin_api::PluginServices;
use ferrisix_plugins::stream::StreamPlugins;
use ferrisix_proxy::SnapshotHandle;
use ipnet::IpNet;

pub use table::{StreamRoute, StreamTable};

/// The published stream table, swapped whole.
pub type StreamHandle = Arc<ArcSwap<StreamTable>>;

/// What compiling stream routes needs beside the HTTP snapshot.
#[derive(Clone)]
pub struct StreamEnv {
    pub plugins: StreamPlugins,
    pub services: Arc<PluginServices>,
    /// `xrpc.protocols`: the protocols a route's `protocol` may name.
    pub xrpc: ferrisix_config::xrpc::XrpcProtocols,
}

/// Timeouts of the relay, nginx stream's defaults where an upstream sets none.
#[derive(Clone, Copy, Debug)]
pub struct StreamTimeouts {
    /// `proxy_timeout` (nginx: 10 min): a TCP session with no byte either way for this long
    /// is closed; a UDP session likewise.
    pub idle: Duration,
    /// A TLS handshake, a preread (mqtt-proxy's CONNECT), or a PROXY protocol header
    /// (nginx's `proxy_protocol_timeout`, 30 s) must finish within this.
    pub preread: Duration,
}

impl StreamTimeouts {
    /// The idle timeout of a session to `up`: APISIX's stream balancer hands the upstream's
    /// `timeout` to nginx (`set_timeouts`), whose stream module has one `proxy_timeout` for
    /// both directions and takes the larger of `send` and `read` for it; an upstream
    /// without `timeout` keeps `default`. (`timeout.connect` bounds each connect, see
    /// `connect`.)
    pub fn idle_for(
        default: Duration,
        up: &ferrisix_proxy::snapshot::CompiledUpstream,
    ) -> Duration {
        match up.configured_timeout() {
            Some(t) => {
                let secs = |s: f64| Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX);
                secs(t.send).max(secs(t.read))
            }
            None => default,
        }
    }
}

impl Default for StreamTimeouts {
    fn default() -> Self {
        StreamTimeouts {
            idle: Duration::from_secs(600),
            preread: Duration::from_secs(30),
        }
    }
}

/// Compiles the stream table for every snapshot the HTTP side publishes, until `changes`
/// ends. `changes` fires after each publish (see `ferrisix_proxy::snapshot::follow`).
pub async fn follow(
    snapshots: SnapshotHandle,
    mut changes: tokio::sync::watch::Receiver<i64>,
    handle: StreamHandle,
    env: Arc<StreamEnv>,
) {
    loop {
        let snapshot = snapshots.load_full();
        let previous = handle.load_full();
        let env2 = env.clone();
        let compiled =
            tokio::task::spawn_blocking(move || StreamTable::compile(&snapshot, &previous, &env2))
                .await;
        match compiled {
            Ok(table) => {
                for (id, why) in &table.quarantine {
                    tracing::warn!(stream_route = %id, error = %why, "stream route quarantined");
                }
                handle.store(Arc::new(table));
            }
            Err(e) => tracing::error!("stream route compile failed: {e}"),
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

/// The stream listeners of `config.yaml`, bound and serving on the current runtime.
pub struct Listeners {
    pub tcp: Vec<(StreamListen, std::net::TcpListener)>,
    pub udp: Vec<(StreamListen, std::net::UdpSocket)>,
    /// `nginx_config.stream.real_ip_from`: the peers whose PROXY header names the client.
    pub real_ip_from: Arc<[IpNet]>,
}

impl Listeners {
    /// Binds every listener (the process fails to start when one cannot be). `real_ip_from`
    /// is `nginx_config.stream.real_ip_from`.
    pub fn bind(
        tcp: &[StreamListen],
        udp: &[StreamListen],
        real_ip_from: &[IpNet],
    ) -> Result<Listeners, String> {
        let mut out = Listeners {
            tcp: Vec::new(),
            udp: Vec::new(),
            real_ip_from: real_ip_from.into(),
        };
        for l in tcp {
            let addr = SocketAddr::new(l.ip, l.port);
            let s = std::net::TcpListener::bind(addr)
                .map_err(|e| format!("stream_proxy.tcp {addr}: {e}"))?;
            s.set_nonblocking(true)
                .map_err(|e| format!("stream_proxy.tcp {addr}: {e}"))?;
            out.tcp.push((*l, s));
        }
        for l in udp {
            let addr = SocketAddr::new(l.ip, l.port);
            let s = std::net::UdpSocket::bind(addr)
                .map_err(|e| format!("stream_proxy.udp {addr}: {e}"))?;
            s.set_nonblocking(true)
                .map_err(|e| format!("stream_proxy.udp {addr}: {e}"))?;
            out.udp.push((*l, s));
        }
        Ok(out)
    }

    /// Serves every listener on the current tokio runtime until `shutdown` turns true.
    pub fn serve(
        self,
        table: StreamHandle,
        timeouts: StreamTimeouts,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Result<(), String> {
        for (listen, socket) in self.tcp {
            let listener = tokio::net::TcpListener::from_std(socket)
                .map_err(|e| format!("stream_proxy.tcp: {e}"))?;
            let port = tcp::TcpPort {
                tls: listen.tls,
                proxy_protocol: listen.accepts_proxy_protocol(),
                proxy_protocol_to_upstream: listen.sends_proxy_protocol(),
                real_ip_from: self.real_ip_from.clone(),
            };
            tokio::spawn(tcp::serve(
                listener,
                Arc::new(port),
                table.clone(),
                timeouts,
                shutdown.clone(),
            ));
        }
        for (_, socket) in self.udp {
            let socket = tokio::net::UdpSocket::from_std(socket)
                .map_err(|e| format!("stream_proxy.udp: {e}"))?;
            tokio::spawn(udp::serve(
                Arc::new(socket),
                table.clone(),
                timeouts,
                shutdown.clone(),
            ));
        }
        Ok(())
    }
}
