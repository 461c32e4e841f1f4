//! Listeners and worker runtimes.
//!
//! The default model mirrors nginx: `worker_processes` threads, each running its own
//! single-threaded tokio runtime with its own `SO_REUSEPORT` listener, upstream pools and log
//! buffer. A request never crosses threads, so there are no cross-core wake-ups and no shared
//! mutable state on the hot path. The alternative (one multi-threaded runtime, one listener) is
//! kept selectable for measurement.
//!
//! HTTPS listeners with `enable_http3` also serve HTTP/3 over QUIC on the same port
//! ([`http3`]); their TCP answers advertise it with `Alt-Svc`.

pub mod http3;

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use ferrisix_net::{Acceptor, ConnLimits, ConnWatch, Drain, Graceful, ListenerSet};
use ferrisix_plugin_api::ConnStats;
use hyper::service::service_fn;
use hyper_util::rt::TokioExecutor;
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::gateway::{ConnInfo, Gateway};
use crate::log::access;
use crate::upstream::client;

/// How request handling is spread over threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WorkerModel {
    /// N single-threaded runtimes with one `SO_REUSEPORT` listener each (nginx's model).
    #[default]
    PerCore,
    /// One multi-threaded runtime with N workers and one listener per address.
    Shared,
}

#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// HTTP listeners (`apisix.node_listen`).
    pub listen: Vec<Listen>,
    pub workers: usize,
    pub model: WorkerModel,
    /// How long in-flight requests may run after a shutdown signal.
    pub shutdown_timeout: Duration,
    /// nginx's `client_header_timeout`, `keepalive_timeout` and `send_timeout`.
    pub limits: ConnLimits,
    /// HTTPS listeners (`apisix.ssl.listen`), certificates from the snapshot's `ssls`. Their
    /// handshakes are bounded by `client_header_timeout`, as nginx bounds them.
    pub tls_listen: Vec<Listen>,
    /// HTTP/2 limits for every listener.
    pub http2: Http2Limits,
}

/// One listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listen {
    pub addr: SocketAddr,
    /// HTTP/2 served: on an HTTPS listener `h2` offered by ALPN, on a plain one h2c with prior
    /// knowledge (APISIX's `http2 on;`). Without it a listener speaks HTTP/1 alone.
    pub http2: bool,
    /// Each connection must open with a PROXY protocol header (v1 or v2), read within
    /// `client_header_timeout` before anything else (the TLS handshake on an HTTPS
    /// listener): nginx's `listen ... proxy_protocol`, APISIX's `apisix.proxy_protocol`.
    pub proxy_protocol: bool,
    /// HTTP/3 over QUIC on the same address (UDP) beside this HTTPS listener
    /// (`apisix.ssl.listen[].enable_http3`, nginx's `listen ... quic`).
    pub http3: bool,
}

impl Listen {
    /// `addr` with HTTP/2 on, APISIX's default.
    pub fn new(addr: SocketAddr) -> Listen {
        Listen {
            addr,
            http2: true,
            proxy_protocol: false,
            http3: false,
        }
    }
}

/// nginx's HTTP/2 limits (`http2_max_concurrent_streams` 128, header list 32 KiB ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Http2Limits {
    pub max_concurrent_streams: u32,
    pub max_header_list_size: u32,
    pub initial_stream_window_size: u32,
    pub initial_connection_window_size: u32,
    pub max_frame_size: u32,
}

impl Default for Http2Limits {
    fn default() -> Self {
        Http2Limits {
            max_concurrent_streams: 128,
            max_header_list_size: 32 * 1024,
            initial_stream_window_size: 64 * 1024,
            initial_connection_window_size: 1024 * 1024,
            max_frame_size: 16 * 1024,
        }
    }
}

/// A bound socket, whether it is HTTPS, whether it serves HTTP/2, and whether its
/// connections open with a PROXY protocol header.
type Bound = (std::net::TcpListener, Kind);

#[derive(Clone, Copy, Debug)]
struct Kind {
    tls: bool,
    http2: bool,
    proxy_protocol: bool,
    /// An HTTP/3 endpoint serves the same port: answers say so (`Alt-Svc`).
    http3: bool,
}

/// One worker's sockets: its TCP listeners and the UDP sockets of its HTTP/3 endpoints.
#[derive(Default)]
struct WorkerSockets {
    tcp: Vec<Bound>,
    udp: Vec<std::net::UdpSocket>,
}

/// The two connection builders: hyper-util's auto-detecting one where HTTP/2 is on, hyper's
/// HTTP/1 one where it is off (no detection step, and an h2c preface is refused).
struct Builders {
    auto: auto::Builder<TokioExecutor>,
    http1: hyper::server::conn::http1::Builder,
}

/// The data plane's gateway, swapped whole when config.yaml is re-read (SIGHUP): each new
/// connection takes the current one, so the request path reads no shared settings.
pub type GatewayHandle = Arc<ArcSwap<Gateway>>;

/// Each worker's listeners: `groups` of them, one per worker (per-core model) or one.
fn take_all(
    options: &ServerOptions,
    sockets: &mut ListenerSet,
    groups: usize,
    reuse_port: bool,
) -> io::Result<Vec<Vec<Bound>>> {
    let mut out: Vec<Vec<Bound>> = (0..groups).map(|_| Vec::new()).collect();
    let plain = options.listen.iter().map(|l| (l, false));
    let tls = options.tls_listen.iter().map(|l| (l, true));
    for (listen, tls) in plain.chain(tls) {
        let addr = listen.addr;
        let kind = Kind {
            tls,
            http2: listen.http2,
            proxy_protocol: listen.proxy_protocol,
            http3: tls && listen.http3,
        };
        let taken = sockets
            .take(addr, groups, reuse_port)
            .map_err(|e| io::Error::new(e.kind(), format!("{addr}: {e}")))?;
        for (group, listeners) in out.iter_mut().zip(taken) {
            group.extend(listeners.into_iter().map(|l| (l, kind)));
        }
    }
    Ok(out)
}

/// Each worker's HTTP/3 sockets, beside [`take_all`]'s: one per worker (`groups`) and
/// `enable_http3` listener. UDP sockets are bound anew by each process (a restart's successor
/// binds its own beside them).
fn bind_udp(options: &ServerOptions, groups: usize) -> io::Result<Vec<Vec<std::net::UdpSocket>>> {
    let mut out: Vec<Vec<std::net::UdpSocket>> = (0..groups).map(|_| Vec::new()).collect();
    for listen in options.tls_listen.iter().filter(|l| l.http3) {
        let addr = listen.addr;
        for group in out.iter_mut() {
            let socket = http3::bind(addr)
                .map_err(|e| io::Error::new(e.kind(), format!("{addr} (UDP, HTTP/3): {e}")))?;
            group.push(socket);
        }
    }
    Ok(out)
}

/// [`take_all`] and [`bind_udp`] together, per worker.
fn take_sockets(
    options: &ServerOptions,
    sockets: &mut ListenerSet,
    groups: usize,
    reuse_port: bool,
) -> io::Result<Vec<WorkerSockets>> {
    let tcp = take_all(options, sockets, groups, reuse_port)?;
    let udp = bind_udp(options, groups)?;
    Ok(tcp
        .into_iter()
        .zip(udp)
        .map(|(tcp, udp)| WorkerSockets { tcp, udp })
        .collect())
}

/// A running server; `wait` returns when every worker has stopped.
pub struct ServerHandle {
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl ServerHandle {
    pub fn wait(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Binds every listener and starts the workers on `gateway`, which stays the same for the
/// server's life; see [`start_with`].
pub fn start(
    gateway: Arc<Gateway>,
    options: ServerOptions,
    shutdown: watch::Receiver<bool>,
) -> io::Result<ServerHandle> {
    start_with(
        Arc::new(ArcSwap::new(gateway)),
        options,
        &mut ListenerSet::new(),
        shutdown,
        None,
    )
}

/// Takes every listener from `sockets` (a predecessor's, else freshly bound) and starts the
/// workers; each new connection uses the gateway `gateway` holds then. Fails (before serving
/// anything) when an address cannot be bound. Workers stop accepting when `shutdown` turns
/// true, then drain their connections (see [`ferrisix_net::Drain`]) for up to
/// `shutdown_timeout`. With `linger`, the connections drain from `shutdown` on but the workers
/// go on accepting (and answering, each connection closed after its answer) until `linger`
/// turns true: a stopping process whose listening sockets stay open for a successor answers
/// the connections that arrive meanwhile instead of leaving them queued. The sockets stay open
/// while `sockets` holds them.
pub fn start_with(
    gateway: GatewayHandle,
    options: ServerOptions,
    sockets: &mut ListenerSet,
    shutdown: watch::Receiver<bool>,
    linger: Option<watch::Receiver<bool>>,
) -> io::Result<ServerHandle> {
    let workers = options.workers.max(1);
    let mut threads = Vec::new();
    match options.model {
        WorkerModel::PerCore => {
            // Take all sockets first so a busy port fails the start, not a worker.
            let per_worker = take_sockets(&options, sockets, workers, true)?;
            for (i, listeners) in per_worker.into_iter().enumerate() {
                let gateway = gateway.clone();
                let options = options.clone();
                let shutdown = shutdown.clone();
                let linger = linger.clone();
                threads.push(
                    std::thread::Builder::new()
                        .name(format!("ferrisix-worker-{i}"))
                        .spawn(move || {
                            let rt = match tokio::runtime::Builder::new_current_thread()
                                .enable_all()
                                .build()
                            {
                                Ok(rt) => rt,
                                Err(e) => {
                                    tracing::error!(error = %e, "cannot start worker runtime");
                                    return;
                                }
                            };
                            rt.block_on(serve(gateway, listeners, options, shutdown, linger, true));
                        })?,
                );
            }
        }
        WorkerModel::Shared => {
            let listeners = take_sockets(&options, sockets, 1, false)?
                .pop()
                .unwrap_or_default();
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(workers)
                .thread_name("ferrisix-worker")
                .enable_all()
                .build()?;
            threads.push(
                std::thread::Builder::new()
                    .name("ferrisix-server".into())
                    .spawn(move || {
                        rt.block_on(serve(gateway, listeners, options, shutdown, linger, false));
                    })?,
            );
        }
    }
    Ok(ServerHandle { threads })
}

async fn serve(
    gateway: GatewayHandle,
    sockets: WorkerSockets,
    options: ServerOptions,
    mut shutdown: watch::Receiver<bool>,
    linger: Option<watch::Receiver<bool>>,
    per_core: bool,
) {
    let mut auto = ferrisix_net::http_builder(&options.limits);
    let h2 = options.http2;
    auto.http2()
        .max_concurrent_streams(h2.max_concurrent_streams)
        .max_header_list_size(h2.max_header_list_size)
        .initial_stream_window_size(h2.initial_stream_window_size)
        .initial_connection_window_size(h2.initial_connection_window_size)
        .max_frame_size(h2.max_frame_size);
    // Shared: a TLS connection takes them to its handshake task.
    let builders = Arc::new(Builders {
        auto,
        http1: ferrisix_net::http1_builder(&options.limits),
    });
    let limits = options.limits;
    let drain = Drain::new();

    // Per-worker housekeeping: log buffers out every second, expired pool entries dropped.
    if per_core {
        tokio::spawn(async {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                access::flush_worker();
                client::evict_expired_idle();
            }
        });
    }

    let (stop_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let h3_settings = http3::Settings {
        limits,
        http2: options.http2,
    };
    let h3_tasks: Vec<_> = sockets
        .udp
        .into_iter()
        .map(|socket| {
            tokio::spawn(http3::serve(
                socket,
                gateway.clone(),
                h3_settings,
                drain.clone(),
                stop_tx.subscribe(),
            ))
        })
        .collect();
    let mut accept_tasks = Vec::new();
    for (std_listener, kind) in sockets.tcp {
        let listener = match TcpListener::from_std(std_listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "cannot register listener");
                continue;
            }
        };
        let gateways = gateway.clone();
        let builders = builders.clone();
        let drain = drain.clone();
        let mut stop = stop_tx.subscribe();
        accept_tasks.push(tokio::spawn(async move {
            let local = listener.local_addr().ok();
            let alt_svc = local.filter(|_| kind.http3).map(|l| http3::alt_svc(l.port()));
            let mut acceptor = Acceptor::new(listener, "data");
            loop {
                tokio::select! {
                    _ = stop.recv() => break,
                    (stream, peer) = acceptor.accept() => {
                        let local = local.or_else(|| stream.local_addr().ok());
                        let Some(local) = local else { continue };
                        let info = ConnInfo::new(gateways.load_full(), peer, local);
                        if !kind.tls && !kind.proxy_protocol {
                            let _ = stream.set_nodelay(true);
                            serve_connection(&builders, kind.http2, &drain, &limits, stream, info, None);
                            continue;
                        }
                        let http2 = kind.http2;
                        let alt_svc = alt_svc.clone();
                        let builders = builders.clone();
                        let drain = drain.clone();
                        tokio::spawn(async move {
                            let mut stream = stream;
                            let _ = stream.set_nodelay(true);
                            let info = if kind.proxy_protocol {
                                match ferrisix_net::proxy_protocol::read_header(&mut stream, limits.header_timeout).await {
                                    Ok(header) => info.with_proxy_protocol(header),
                                    Err(e) => {
                                        // Closed either way; at info (nginx: error for a
                                        // broken header) since any client can send one
                                        // and the error log must not be its to fill.
                                        tracing::info!(client = %peer, "{e}");
                                        return;
                                    }
                                }
                            } else {
                                info
                            };
                            if !kind.tls {
                                serve_connection(&builders, http2, &drain, &limits, stream, info, None);
                                return;
                            }
                            let snapshot = info.gateway.snapshot.clone();
                            let store = move || snapshot.load().tls.clone();
                            match ferrisix_tls::accept(stream, store, http2, limits.header_timeout).await {
                                Ok((tls_stream, conn)) => serve_connection(&builders, http2, &drain, &limits, tls_stream, info.with_tls(conn), alt_svc),
                                Err(e @ (ferrisix_tls::AcceptError::NoCertificate(_) | ferrisix_tls::AcceptError::Unusable(_))) => {
                                    tracing::error!(client = %peer, "{e}");
                                }
                                Err(e) => tracing::info!(client = %peer, "{e}"),
                            }
                        });
                    }
                }
            }
        }));
    }

    let _ = shutdown.wait_for(|stop| *stop).await;
    if let Some(mut linger) = linger {
        drain.start();
        // A dropped sender ends the lingering too.
        let _ = linger.wait_for(|stop| *stop).await;
    }
    let _ = stop_tx.send(());
    for t in accept_tasks {
        let _ = t.await;
    }
    let mut endpoints = Vec::new();
    for t in h3_tasks {
        if let Ok(Some(endpoint)) = t.await {
            endpoints.push(endpoint);
        }
    }
    // The listeners are closed here (or live on in a successor that took them over).
    drain.start();
    if tokio::time::timeout(options.shutdown_timeout, drain.finished())
        .await
        .is_err()
    {
        tracing::warn!(
            connections = drain.open_connections(),
            "worker_shutdown_timeout reached with connections still open"
        );
    }
    for endpoint in endpoints {
        http3::close(endpoint).await;
    }
    access::flush_worker();
}

/// Serves one TCP connection; `alt_svc` is the `Alt-Svc` its answers carry (an HTTPS listener
/// with an HTTP/3 twin), chosen once here so that other listeners' requests pay nothing for it.
fn serve_connection<IO>(
    builders: &Builders,
    http2: bool,
    drain: &Drain,
    limits: &ConnLimits,
    stream: IO,
    conn: ConnInfo,
    alt_svc: Option<http::HeaderValue>,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // What ferrisix_net::wrap does for TCP, for any stream (TLS too; nodelay is set on the
    // socket at accept).
    let conn_watch = ferrisix_net::ConnWatch::new(*limits).with_drain(drain);
    let io = ferrisix_net::served_io(stream, limits, &conn_watch);
    // nginx's stub_status counters (prometheus' apisix_nginx_http_current_connections).
    let stats = conn.gateway.stats.clone();
    // One shared value per connection: each request clones a single Arc.
    let ctx = Arc::new((conn, conn_watch.clone()));
    stats.connection_opened();
    // The connection served with `$service`, by hyper's HTTP/1 builder or the auto-detecting
    // one (a macro: the two services below are different closure types).
    macro_rules! serve_with {
        ($service:expr) => {
            if http2 {
                let connection = builders
                    .auto
                    .serve_connection_with_upgrades(io, $service)
                    .into_owned();
                spawn_served(conn_watch, connection, stats);
            } else {
                let connection = builders
                    .http1
                    .serve_connection(io, $service)
                    .with_upgrades();
                spawn_served(conn_watch, connection, stats);
            }
        };
    }
    match alt_svc {
        None => serve_with!(service_fn(
            move |req: hyper::Request<hyper::body::Incoming>| {
                let ctx = ctx.clone();
                let in_flight = ctx.1.begin();
                let version = req.version();
                async move {
                    let resp = ctx.0.handle(req).await;
                    Ok::<_, Infallible>(ctx.1.respond(resp, in_flight, version))
                }
            }
        )),
        Some(alt_svc) => serve_with!(service_fn(
            move |req: hyper::Request<hyper::body::Incoming>| {
                let ctx = ctx.clone();
                let alt_svc = alt_svc.clone();
                let in_flight = ctx.1.begin();
                let version = req.version();
                async move {
                    let mut resp = ctx.0.handle(req).await;
                    // As nginx's `add_header Alt-Svc ... always`, unless a plugin set one.
                    resp.headers_mut()
                        .entry(http::header::ALT_SVC)
                        .or_insert(alt_svc);
                    Ok::<_, Infallible>(ctx.1.respond(resp, in_flight, version))
                }
            }
        )),
    }
}

/// Runs a client connection on a task of its own until it ends, and counts it closed then.
fn spawn_served<C, E>(conn_watch: ConnWatch, connection: C, stats: Arc<ConnStats>)
where
    C: Graceful<Output = Result<(), E>> + Send + 'static,
    E: std::fmt::Display,
{
    tokio::spawn(async move {
        // Closed early (None) when client_header_timeout or keepalive_timeout passes.
        if let Some(Err(e)) = conn_watch.serve(connection).await {
            tracing::debug!(error = %e, "client connection ended with an error");
        }
        stats.connection_closed();
    });
}
