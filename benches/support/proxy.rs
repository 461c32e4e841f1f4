//! Shared harness of the whole-request-path benches (`single_upstream`, `two_plugins`).
//!
//! Everything runs in the bench process, on loopback:
//! - the upstream: a raw-TCP keep-alive HTTP/1.1 server on its own thread (one single-threaded
//!   tokio runtime), answering every request with the 10-byte body `1234567890`, like the
//!   OpenResty upstream of APISIX's benchmark (spec data-plane §8);
//! - the gateway: the real listener and worker (`ferrisix_proxy::server::start`, 1 worker, the
//!   default per-core model), serving a snapshot compiled from a `ConfigState` that holds the
//!   scenario's route, with the access log off;
//! - the client: N keep-alive connections driven by one single-threaded tokio runtime on the
//!   bench's own thread, each sending `GET /hello` and reading the whole response before the
//!   next (wrk's closed loop).
//!
//! One criterion iteration is one request; with N connections the reported time is wall time
//! divided by the requests completed, i.e. the inverse of the throughput at that concurrency.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use ferrisix_config::model::ResourceKind;
use ferrisix_config::settings::Settings;
use ferrisix_config::state::{ConfigState, StoredItem};
use ferrisix_plugin_api::PluginServices;
use ferrisix_plugins::PluginRegistry;
use ferrisix_proxy::log::access::{AccessLog, LogSink};
use ferrisix_proxy::snapshot::{self, Snapshot};
use ferrisix_proxy::{
    CompileOptions, Gateway, Listen, RealIpConfig, ServerHandle, ServerOptions, WorkerModel,
};
use ferrisix_router::RouterKind;
use http::HeaderValue;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The upstream's whole answer: status line, headers and the benchmark's 10-byte body.
const UPSTREAM_RESPONSE: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\n1234567890";

/// The connection counts measured: one (latency-bound) and wrk's 16.
pub const CONNECTIONS: [usize; 2] = [1, 16];

/// Starts the upstream on a random 127.0.0.1 port; it runs until the process exits.
pub fn start_upstream() -> u16 {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind upstream");
    let port = std_listener.local_addr().unwrap().port();
    std_listener.set_nonblocking(true).unwrap();
    std::thread::Builder::new()
        .name("bench-upstream".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = TcpListener::from_std(std_listener).unwrap();
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(upstream_connection(stream));
                }
            });
        })
        .expect("spawn upstream thread");
    port
}

/// Answers every request head on the connection (bodies are not expected: GET only).
async fn upstream_connection(mut stream: TcpStream) {
    let mut buf = Vec::with_capacity(4096);
    loop {
        while let Some(end) = find(&buf, b"\r\n\r\n") {
            buf.drain(..end + 4);
            if stream.write_all(UPSTREAM_RESPONSE).await.is_err() {
                return;
            }
        }
        match stream.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A running gateway; stopped (gracefully) when dropped.
pub struct Proxy {
    pub port: u16,
    /// Its plugins' services (the metrics registry among their shared states).
    pub services: Arc<PluginServices>,
    shutdown: tokio::sync::watch::Sender<bool>,
    server: Option<ServerHandle>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(server) = self.server.take() {
            server.wait();
        }
    }
}

/// Starts the gateway serving one route, `route_json` with `UPSTREAM_PORT` replaced by the
/// upstream's port, stored as route `1` (as `PUT /apisix/admin/routes/1` would).
pub fn start_proxy(route_json: &str, upstream_port: u16) -> Proxy {
    // What src/main.rs makes before the first compile (default plugin_attr).
    let services = Arc::new(PluginServices::default());
    let route: serde_json::Value =
        serde_json::from_str(&route_json.replace("UPSTREAM_PORT", &upstream_port.to_string()))
            .expect("route JSON");
    let mut state = ConfigState {
        revision: 1,
        ..Default::default()
    };
    state
        .resources
        .entry(ResourceKind::Routes)
        .or_default()
        .insert(
            "1".into(),
            StoredItem {
                id: "1".into(),
                value: (&route).into(),
                create_revision: 1,
                mod_revision: 1,
                seq: 0,
            },
        );
    // config.yaml's defaults, as APISIX's run.sh leaves everything but worker_processes.
    let settings = Settings::default();
    let options = CompileOptions {
        router: RouterKind::HostUri,
        ..CompileOptions::default()
    };
    let (registry, _) = PluginRegistry::new(services.clone(), settings.plugins.as_deref());
    let handle = snapshot::new_handle(&options);
    let compiled = Snapshot::compile(&state, &handle.load(), &options, &registry);
    assert!(
        compiled.quarantine.is_empty() && compiled.router.len() == 1,
        "route refused: {:?}",
        compiled.quarantine
    );
    handle.store(Arc::new(compiled));

    let http = &settings.nginx_config.http;
    let gateway = Arc::new(Gateway {
        legacy_admin: None,
        client_body_timeout: http.client_body_timeout,
        client_max_body_size: http.client_max_body_size,
        snapshot: handle,
        server_header: HeaderValue::from_static(concat!("ferrisix/", env!("CARGO_PKG_VERSION"))),
        real_ip: RealIpConfig::new(
            &http.real_ip_header,
            http.real_ip_from.nets.clone(),
            http.real_ip_recursive,
        ),
        show_upstream_status: false,
        // Off: the benches measure the request path, not the disk.
        access_log: Arc::new(AccessLog::new(LogSink::Off, &http.access_log_format)),
        stats: services.conn_stats().clone(),
    });

    // A free port can be taken between the probe and the bind: try a few.
    let mut last_error = None;
    for _ in 0..3 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let (shutdown, shutdown_rx) = tokio::sync::watch::channel(false);
        let options = ServerOptions {
            listen: vec![Listen::new(SocketAddr::from(([127, 0, 0, 1], port)))],
            workers: 1,
            model: WorkerModel::PerCore,
            shutdown_timeout: Duration::from_secs(1),
            limits: ferrisix_net::ConnLimits {
                header_timeout: http.client_header_timeout,
                keepalive_timeout: http.keepalive_timeout,
                send_timeout: http.send_timeout,
            },
            tls_listen: Vec::new(),
            http2: Default::default(),
        };
        match ferrisix_proxy::server::start(gateway.clone(), options, shutdown_rx) {
            Ok(server) => {
                return Proxy {
                    port,
                    services,
                    shutdown,
                    server: Some(server),
                }
            }
            Err(e) => last_error = Some(e),
        }
    }
    panic!("gateway did not start: {last_error:?}");
}

/// One keep-alive client connection.
struct Conn {
    stream: TcpStream,
    request: Vec<u8>,
    buf: Vec<u8>,
}

/// A parsed response: status, headers (lower-cased names) and body.
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Conn {
    async fn open(port: u16) -> Conn {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect to the gateway");
        stream.set_nodelay(true).unwrap();
        Conn {
            stream,
            // What wrk sends.
            request: format!("GET /hello HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").into_bytes(),
            buf: Vec::with_capacity(4096),
        }
    }

    /// Sends one request and reads its whole response (Content-Length framing).
    async fn exchange(&mut self) -> Answer {
        self.stream.write_all(&self.request).await.expect("send");
        let head_end = loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                break end;
            }
            self.fill().await;
        };
        let head = std::str::from_utf8(&self.buf[..head_end]).expect("response head");
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .expect("status line");
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let length: usize = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_else(|| panic!("response without Content-Length: {head}"));
        let total = head_end + 4 + length;
        while self.buf.len() < total {
            self.fill().await;
        }
        let body = self.buf[head_end + 4..total].to_vec();
        self.buf.drain(..total);
        Answer {
            status,
            headers,
            body,
        }
    }

    async fn fill(&mut self) {
        let n = self.stream.read_buf(&mut self.buf).await.expect("read");
        assert!(n > 0, "the gateway closed the connection");
    }

    /// `n` requests in a row.
    async fn run(&mut self, n: u64) {
        for _ in 0..n {
            let a = self.exchange().await;
            debug_assert_eq!(a.status, 200);
        }
    }
}

/// N client connections on a single-threaded runtime of the calling thread.
pub struct Clients {
    rt: tokio::runtime::Runtime,
    conns: Vec<Conn>,
}

impl Clients {
    pub fn connect(port: u16, n: usize) -> Clients {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let conns = rt.block_on(async {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(Conn::open(port).await);
            }
            v
        });
        Clients { rt, conns }
    }

    /// One request on the first connection, for checking the answer.
    pub fn probe(&mut self) -> Answer {
        let conn = &mut self.conns[0];
        self.rt.block_on(conn.exchange())
    }

    /// `total` requests spread over the connections, all running at once; the wall time.
    pub fn run(&mut self, total: u64) -> Duration {
        let n = self.conns.len() as u64;
        let conns = &mut self.conns;
        self.rt.block_on(async move {
            let started = Instant::now();
            futures_util::future::join_all(
                conns
                    .iter_mut()
                    .enumerate()
                    .map(|(i, c)| c.run(total / n + u64::from((i as u64) < total % n))),
            )
            .await;
            started.elapsed()
        })
    }
}

/// Criterion settings for these benches: few samples, short windows (loopback round trips on
/// a shared 2-core machine are noisy anyway).
pub fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

/// The group `name`: the scenario's route behind a fresh gateway, measured at each of
/// [`CONNECTIONS`]. Two probe requests go first; `verify` checks the second's answer (by then
/// the first one's log phase has run: a connection's requests are served in order).
pub fn bench_scenario(
    c: &mut Criterion,
    name: &str,
    route_json: &str,
    verify: fn(&Proxy, &Answer),
) {
    let upstream = start_upstream();
    let proxy = start_proxy(route_json, upstream);
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(1));
    for n in CONNECTIONS {
        let mut clients = Clients::connect(proxy.port, n);
        clients.probe();
        let answer = clients.probe();
        assert_eq!(answer.status, 200);
        assert_eq!(answer.body, b"1234567890");
        verify(&proxy, &answer);
        g.bench_with_input(BenchmarkId::new("connections", n), &n, |b, _| {
            b.iter_custom(|iters| clients.run(iters))
        });
    }
    g.finish();
}
