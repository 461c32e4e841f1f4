//! Plugin state across snapshots and gateways: a resource's state is released when the last
//! snapshot that uses it is dropped (not one change later), an unchanged conf keeps its state
//! across snapshots, and two gateways in one process share no counters.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use ferrisix_config::model::ResourceKind;
use ferrisix_config::state::{ConfigState, StoredItem};
use ferrisix_plugin_api::PluginServices;
use ferrisix_plugins::limit::limit_count::local::Spaces;
use ferrisix_plugins::observe::prometheus::Metrics;
use ferrisix_plugins::PluginRegistry;
use ferrisix_proxy::access_log::{AccessLog, LogSink};
use ferrisix_proxy::snapshot::{self, Snapshot};
use ferrisix_proxy::{CompileOptions, Gateway, RealIpConfig, ServerOptions, WorkerModel};
use http::{HeaderName, HeaderValue};
use serde_json::{json, Value};

fn state(routes: &[Value]) -> ConfigState {
    let mut state = ConfigState {
        revision: 1,
        ..Default::default()
    };
    let items = state.resources.entry(ResourceKind::Routes).or_default();
    for (seq, route) in routes.iter().enumerate() {
        let id = route["id"].as_str().unwrap().to_owned();
        items.insert(
            id.clone(),
            StoredItem {
                id,
                value: Arc::new(route.clone()),
                create_revision: 1,
                mod_revision: 1,
                seq: seq as u64,
            },
        );
    }
    state
}

fn route(id: &str, plugins: Value) -> Value {
    json!({"id": id, "uri": format!("/{id}"), "plugins": plugins,
        "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1980": 1}}})
}

fn registry() -> (PluginRegistry, Arc<PluginServices>) {
    let services = Arc::new(PluginServices::default());
    (PluginRegistry::new(services.clone(), None).0, services)
}

#[test]
fn state_goes_with_the_last_snapshot_that_uses_it() {
    let (registry, services) = registry();
    let options = CompileOptions::default();
    let lc = json!({"count": 5, "time_window": 60});
    let plugins = json!({"limit-count": lc, "prometheus": {}});
    let spaces = services.shared::<Spaces>();
    let metrics = services.shared::<Metrics>();

    let empty = Snapshot::empty(&options);
    let a = Snapshot::compile(
        &state(&[route("1", plugins.clone())]),
        &empty,
        &options,
        &registry,
    );
    assert!(a.quarantine.is_empty(), "{:?}", a.quarantine);
    assert_eq!((spaces.len(), metrics.group_count()), (1, 1));
    let (_, first) = spaces.states().pop().unwrap();

    // Compiled while `a` is alive: the unchanged conf leases the same counters again.
    let b = Snapshot::compile(
        &state(&[route("1", plugins.clone()), route("2", json!({}))]),
        &a,
        &options,
        &registry,
    );
    drop(a);
    assert_eq!(spaces.len(), 1);
    assert!(
        Arc::ptr_eq(&spaces.states()[0].1, &first),
        "the same counters"
    );
    drop(first);

    // Route 1 deleted: its state stays exactly as long as a snapshot that uses it.
    let c = Snapshot::compile(&state(&[route("2", json!({}))]), &b, &options, &registry);
    assert_eq!(
        (spaces.len(), metrics.group_count()),
        (1, 1),
        "`b` still serves route 1"
    );
    drop(b);
    assert_eq!(
        (spaces.len(), metrics.group_count()),
        (0, 0),
        "released with the last snapshot that used it, not at the next change"
    );

    // A changed conf is new state; the old one goes with the old snapshot.
    let d = Snapshot::compile(&state(&[route("1", plugins)]), &c, &options, &registry);
    let changed = json!({"limit-count": {"count": 6, "time_window": 60}});
    let e = Snapshot::compile(&state(&[route("1", changed)]), &d, &options, &registry);
    assert_eq!(spaces.len(), 2);
    drop(d);
    assert_eq!(spaces.len(), 1);
    drop((c, e));
    assert!(spaces.is_empty());
}

/// A loopback upstream answering every request with `ok`.
fn start_upstream() -> SocketAddr {
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

/// A gateway in this process serving `routes`, with services of its own.
struct InProcess {
    addr: SocketAddr,
    services: Arc<PluginServices>,
    shutdown: tokio::sync::watch::Sender<bool>,
    server: Option<ferrisix_proxy::ServerHandle>,
}

impl Drop for InProcess {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(s) = self.server.take() {
            s.wait();
        }
    }
}

fn start_gateway(routes: &[Value]) -> InProcess {
    let (registry, services) = registry();
    let options = CompileOptions::default();
    let handle = snapshot::new_handle(&options);
    let compiled = Snapshot::compile(&state(routes), &handle.load(), &options, &registry);
    assert!(compiled.quarantine.is_empty(), "{:?}", compiled.quarantine);
    handle.store(Arc::new(compiled));
    let gateway = Arc::new(Gateway {
        snapshot: handle,
        server_header: HeaderValue::from_static("ferrisix"),
        real_ip: RealIpConfig {
            header: HeaderName::from_static("x-real-ip"),
            trusted: Vec::new(),
            recursive: false,
        },
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
            listen: vec![addr],
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
    InProcess {
        addr,
        services,
        shutdown,
        server: Some(server),
    }
}

/// The status of `GET path`, on a connection of its own.
fn status(addr: SocketAddr, path: &str) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[test]
fn two_gateways_in_one_process_share_no_counters() {
    let up = start_upstream();
    let r = json!({"id": "1", "uri": "/1",
        "plugins": {"limit-count": {"count": 1, "time_window": 60, "rejected_code": 429},
            "prometheus": {}},
        "upstream": {"type": "roundrobin", "nodes": {up.to_string(): 1}}});
    let a = start_gateway(std::slice::from_ref(&r));
    let b = start_gateway(&[r]);
    assert_eq!(status(a.addr, "/1"), 200);
    assert_eq!(status(a.addr, "/1"), 429, "a's quota is spent");
    assert_eq!(status(b.addr, "/1"), 200, "b counts on its own");
    assert_eq!(status(b.addr, "/1"), 429);
    assert_eq!(status(b.addr, "/nope"), 404);

    let requests = |g: &InProcess| {
        // The log phase runs when the response is done; give the worker a moment.
        std::thread::sleep(Duration::from_millis(100));
        g.services.conn_stats().read().requests
    };
    assert_eq!((requests(&a), requests(&b)), (2, 3));
    let a_text = a.services.shared::<Metrics>().render();
    let b_text = b.services.shared::<Metrics>().render();
    let line = |code: u16| format!("apisix_http_status{{code=\"{code}\",route=\"1\",");
    let count = |text: &str, code: u16| {
        text.lines()
            .find(|l| l.starts_with(&line(code)))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_owned)
    };
    assert_eq!(count(&a_text, 200).as_deref(), Some("1"), "{a_text}");
    assert_eq!(count(&a_text, 429).as_deref(), Some("1"));
    assert_eq!(count(&b_text, 200).as_deref(), Some("1"), "{b_text}");
    assert!(
        a_text.contains("apisix_http_requests_total 2\n"),
        "{a_text}"
    );
    assert!(
        b_text.contains("apisix_http_requests_total 3\n"),
        "{b_text}"
    );
}
