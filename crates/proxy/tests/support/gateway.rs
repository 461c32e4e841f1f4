//! A gateway served in the test process, for the proxy's integration tests: a [`ConfigState`]
//! built from JSON resources, compiled once with the test's registry, served on a loopback
//! port picked at random, and shut down when the handle is dropped. Included by each test
//! file with `#[path = "support/gateway.rs"] mod gateway;`: not every file uses every helper.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use ferrisix_config::model::ResourceKind;
use ferrisix_config::state::{ConfigState, StoredItem};
use ferrisix_plugin_api::PluginServices;
use ferrisix_plugins::PluginRegistry;
use ferrisix_proxy::log::access::{AccessLog, LogSink};
use ferrisix_proxy::snapshot::{self, Snapshot};
use ferrisix_proxy::{CompileOptions, Gateway, Listen, RealIpConfig, ServerOptions, WorkerModel};
use http::HeaderValue;
use serde_json::Value;

/// One stored resource, as the store would hand it over (`seq`: its place in the listing).
pub fn item(id: &str, value: Value, seq: u64) -> StoredItem {
    StoredItem {
        id: id.into(),
        value: (&value).into(),
        create_revision: 1,
        mod_revision: 1,
        seq,
    }
}

/// A config state holding `resources`, each by its `id` field (a consumer by its
/// `username`; a credential by `<username>/credentials/<id>`, given as its `id`).
pub fn state(resources: Vec<(ResourceKind, Vec<Value>)>) -> ConfigState {
    let mut state = ConfigState {
        revision: 1,
        ..Default::default()
    };
    for (kind, list) in resources {
        let items = state.resources.entry(kind).or_default();
        for (seq, v) in list.into_iter().enumerate() {
            let id = v["id"]
                .as_str()
                .or_else(|| v["username"].as_str())
                .expect("an id or a username")
                .to_owned();
            items.insert(id.clone(), item(&id, v, seq as u64));
        }
    }
    state
}

/// A gateway serving one snapshot, with the plugin services it was compiled against.
pub struct TestGateway {
    pub addr: SocketAddr,
    pub services: Arc<PluginServices>,
    /// What the gateway serves.
    pub snapshot: snapshot::SnapshotHandle,
    shutdown: tokio::sync::watch::Sender<bool>,
    server: Option<ferrisix_proxy::ServerHandle>,
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(s) = self.server.take() {
            s.wait();
        }
    }
}

/// Compiles `state` with `registry` (whose services are `services`) and serves it; a
/// quarantined resource fails the test.
pub fn serve(
    state: &ConfigState,
    registry: &PluginRegistry,
    services: Arc<PluginServices>,
) -> TestGateway {
    let options = CompileOptions::default();
    let handle = snapshot::new_handle(&options);
    let compiled = Snapshot::compile(state, &handle.load(), &options, registry);
    assert!(compiled.quarantine.is_empty(), "{:?}", compiled.quarantine);
    handle.store(Arc::new(compiled));
    let gateway = Arc::new(Gateway {
        snapshot: handle.clone(),
        server_header: HeaderValue::from_static("ferrisix"),
        real_ip: RealIpConfig::new("X-Real-IP", Vec::new(), false),
        show_upstream_status: false,
        access_log: Arc::new(AccessLog::new(LogSink::Off, "")),
        stats: services.conn_stats().clone(),
        legacy_admin: None,
        client_body_timeout: Duration::from_secs(60),
        client_max_body_size: 0,
    });
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let (shutdown, rx) = tokio::sync::watch::channel(false);
    let server = ferrisix_proxy::server::start(
        gateway,
        ServerOptions {
            listen: vec![Listen::new(addr)],
            workers: 1,
            model: WorkerModel::PerCore,
            shutdown_timeout: Duration::from_secs(1),
            limits: ferrisix_net::ConnLimits {
                header_timeout: Duration::from_secs(5),
                keepalive_timeout: Duration::from_secs(60),
                send_timeout: Duration::from_secs(60),
            },
            tls_listen: Vec::new(),
            http2: Default::default(),
        },
        rx,
    )
    .unwrap();
    TestGateway {
        addr,
        services,
        snapshot: handle,
        shutdown,
        server: Some(server),
    }
}

/// The builtin plugins, with services of their own (no state shared with another gateway).
pub fn builtin_registry() -> (PluginRegistry, Arc<PluginServices>) {
    let services = Arc::new(PluginServices::default());
    (PluginRegistry::new(services.clone(), None).0, services)
}

/// A loopback upstream answering every request with `200 ok`.
pub fn start_ok_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = stream;
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                loop {
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        if s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                            .is_err()
                        {
                            return;
                        }
                        continue;
                    }
                    match s.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    addr
}

/// The status of `GET path` with `extra` header lines, on a connection of its own.
pub fn status(addr: SocketAddr, path: &str, extra: &str) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\n{extra}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}
