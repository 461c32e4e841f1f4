//! Service discovery (issue 42) against in-test registries that follow each product's
//! documented HTTP API: Consul's blocking queries (`index`/`wait`, `X-Consul-Index`) for
//! `consul` and `consul_kv`, the Kubernetes API server's list and chunked watch stream,
//! Nacos' instance list with login, and Eureka's `apps`. Each test checks what the gateway
//! asks for, follows node changes through served traffic, and survives faults (a registry
//! answering 500 or garbage, a watch cut mid-event, 410 Gone, a registry that is down) with
//! the last good nodes serving. APISIX's documented discovery route bodies are served too.
use crate::support;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};
use support::*;

// ---------------------------------------------------------------------------------------------
// A gateway with the control and status APIs on.

struct Gw {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
    control: u16,
    status: u16,
}

impl Gw {
    fn start(routes: &Value, discovery: &str) -> Gw {
        Gw::start_keys(routes, discovery, "")
    }

    /// [`Gw::start`] with `apisix_keys` (lines indented for inside `apisix:`) added.
    fn start_keys(routes: &Value, discovery: &str, apisix_keys: &str) -> Gw {
        let dir = tempfile::tempdir().unwrap();
        let (port, control, status, metrics) = (free_port(), free_port(), free_port(), free_port());
        let config = format!(
            "apisix:\n  node_listen:\n    - ip: 127.0.0.1\n      port: {port}\n  enable_admin: false\n  enable_control: true\n  control:\n    ip: 127.0.0.1\n    port: {control}\n  status:\n    ip: 127.0.0.1\n    port: {status}\n  ssl:\n    enable: false\n{apisix_keys}\
             deployment:\n  role: data_plane\n  role_data_plane:\n    config_provider: yaml\n\
             plugin_attr:\n  prometheus:\n    export_addr:\n      ip: 127.0.0.1\n      port: {metrics}\n\
             nginx_config:\n  worker_processes: 1\n  worker_shutdown_timeout: 1s\n  http:\n    access_log: \"off\"\n\
             discovery:\n{discovery}"
        );
        std::fs::write(dir.path().join("config.yaml"), config).unwrap();
        std::fs::write(
            dir.path().join("apisix.yaml"),
            format!("{}\n#END\n", routes),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("ferrisix.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_ferrisix"))
            .arg("-c")
            .arg(dir.path().join("config.yaml"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut gw = Gw {
            child,
            dir,
            port,
            control,
            status,
        };
        let up = poll_until(Duration::from_secs(20), || {
            if let Ok(Some(s)) = gw.child.try_wait() {
                panic!("ferrisix exited ({s}): {}", gw.log());
            }
            TcpStream::connect(("127.0.0.1", port)).is_ok()
                && TcpStream::connect(("127.0.0.1", control)).is_ok()
        });
        assert!(up.is_some(), "gateway not listening: {}", gw.log());
        gw
    }

    fn addr(&self) -> SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    fn control(&self, path: &str) -> Reply {
        get(([127, 0, 0, 1], self.control).into(), path)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ferrisix.log")).unwrap_or_default()
    }

    /// Who answered `n` requests for `path` (`status N` for a non-200).
    fn seen(&self, path: &str, n: usize) -> BTreeMap<String, usize> {
        self.seen_at(self.addr(), path, n)
    }

    /// [`Gw::seen`] through `addr` (a stream port).
    fn seen_at(&self, addr: SocketAddr, path: &str, n: usize) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for _ in 0..n {
            // A stream port closes the connection while its route has no node yet.
            let who = match try_request(addr, "GET", path, &[], b"") {
                Ok(r) if r.status == 200 => r.header("X-Upstream").unwrap_or("-").to_string(),
                Ok(r) => format!("status {}", r.status),
                Err(e) => format!("closed: {}", e.kind()),
            };
            *out.entry(who).or_default() += 1;
        }
        out
    }

    /// Waits until the answers for `path` come from exactly `names`.
    fn wait_for(&self, path: &str, names: &[&str]) {
        self.wait_for_at(self.addr(), path, names)
    }

    /// [`Gw::wait_for`] through `addr` (a stream port).
    fn wait_for_at(&self, addr: SocketAddr, path: &str, names: &[&str]) {
        let mut last = BTreeMap::new();
        let ok = poll_until(Duration::from_secs(30), || {
            last = self.seen_at(addr, path, 2 * names.len().max(1) + 2);
            let mut keys: Vec<&str> = last.keys().map(String::as_str).collect();
            keys.sort();
            let mut want = names.to_vec();
            want.sort();
            keys == want
        });
        assert!(
            ok.is_some(),
            "{path}: wanted {names:?}, last saw {last:?}\n{}",
            self.log()
        );
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An upstream answering 200 with `X-Upstream: <name>`; returns its port.
fn named(name: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut pending = Vec::new();
                loop {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => pending.extend_from_slice(&buf[..n]),
                    }
                    while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                        pending.drain(..end + 4);
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Upstream: {name}\r\n\r\nok"
                        );
                        let _ = s.write_all(reply.as_bytes());
                    }
                }
            });
        }
    });
    port
}

// ---------------------------------------------------------------------------------------------
// A tiny registry server: each request is recorded and handed to the test's handler.

#[derive(Clone, Debug)]
struct Req {
    method: String,
    path: String,
    query: HashMap<String, String>,
    headers: HashMap<String, String>,
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

type Handler = Arc<dyn Fn(&Req, &mut TcpStream) -> bool + Send + Sync>;

struct Registry {
    port: u16,
    requests: Arc<Mutex<Vec<Req>>>,
    /// Down: connections are closed without an answer.
    down: Arc<AtomicBool>,
}

impl Registry {
    fn start(handler: Handler) -> Registry {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let down = Arc::new(AtomicBool::new(false));
        let (rq, dn) = (requests.clone(), down.clone());
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(s) = s else { continue };
                if dn.load(Ordering::SeqCst) {
                    drop(s);
                    continue;
                }
                let (h, rq, dn) = (handler.clone(), rq.clone(), dn.clone());
                std::thread::spawn(move || serve(s, h, rq, dn));
            }
        });
        Registry {
            port,
            requests,
            down,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn requests(&self, path_prefix: &str) -> Vec<Req> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path.starts_with(path_prefix))
            .cloned()
            .collect()
    }
}

fn serve(s: TcpStream, handler: Handler, requests: Arc<Mutex<Vec<Req>>>, down: Arc<AtomicBool>) {
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let mut s = s;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let target = parts.next().unwrap_or("").to_string();
        let mut headers = HashMap::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        if let Some(n) = headers
            .get("content-length")
            .and_then(|v| v.parse::<usize>().ok())
        {
            let mut body = vec![0u8; n];
            let _ = reader.read_exact(&mut body);
        }
        if down.load(Ordering::SeqCst) {
            return;
        }
        let (path, q) = target.split_once('?').unwrap_or((&target, ""));
        let query = q
            .split('&')
            .filter(|kv| !kv.is_empty())
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                (decode(k), decode(v))
            })
            .collect();
        let req = Req {
            method,
            path: decode(path),
            query,
            headers,
        };
        requests.lock().unwrap().push(req.clone());
        if !handler(&req, &mut s) {
            return;
        }
    }
}

fn respond(s: &mut TcpStream, status: u16, headers: &[(&str, String)], body: &str) -> bool {
    let mut head = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).is_ok() && s.write_all(body.as_bytes()).is_ok()
}

/// Shared registry contents the test changes; waiters are woken on each change.
struct Shared<T> {
    state: Mutex<T>,
    changed: Condvar,
}

impl<T> Shared<T> {
    fn new(t: T) -> Arc<Shared<T>> {
        Arc::new(Shared {
            state: Mutex::new(t),
            changed: Condvar::new(),
        })
    }

    fn change(&self, f: impl FnOnce(&mut T)) {
        f(&mut self.state.lock().unwrap());
        self.changed.notify_all();
    }
}

fn wait_secs(q: &HashMap<String, String>) -> u64 {
    q.get("wait")
        .and_then(|w| w.trim_end_matches('s').parse().ok())
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// Consul

struct Consul {
    index: u64,
    /// service → node ports on 127.0.0.1
    services: BTreeMap<String, Vec<u16>>,
    /// The next this many requests answer 500.
    fail: usize,
    /// Answer this text (not JSON) to the next service reads.
    garbage: usize,
}

fn consul_server(shared: Arc<Shared<Consul>>) -> Registry {
    Registry::start(Arc::new(move |req: &Req, s: &mut TcpStream| {
        let mut st = shared.state.lock().unwrap();
        if st.fail > 0 {
            st.fail -= 1;
            return respond(s, 500, &[], "boom");
        }
        // A blocking query: held until the index moves past the one asked for, or `wait`.
        if let Some(i) = req.query.get("index").and_then(|i| i.parse::<u64>().ok()) {
            let deadline = Instant::now() + Duration::from_secs(wait_secs(&req.query));
            while i != 0 && st.index == i && Instant::now() < deadline {
                st = shared
                    .changed
                    .wait_timeout(st, deadline - Instant::now())
                    .unwrap()
                    .0;
            }
        }
        let index = vec![("X-Consul-Index", st.index.to_string())];
        match req.path.as_str() {
            "/v1/catalog/services" => {
                let mut body = serde_json::Map::new();
                body.insert("consul".into(), json!([]));
                for k in st.services.keys() {
                    body.insert(k.clone(), json!(["tag"]));
                }
                respond(s, 200, &index, &Value::Object(body).to_string())
            }
            "/v1/health/state/any" => respond(s, 200, &index, "[]"),
            p if p.starts_with("/v1/health/service/") => {
                if st.garbage > 0 {
                    st.garbage -= 1;
                    return respond(s, 200, &index, "<html>not json");
                }
                let name = &p["/v1/health/service/".len()..];
                let entries: Vec<Value> = st
                    .services
                    .get(name)
                    .into_iter()
                    .flatten()
                    .map(|port| {
                        json!({"Node": {"Node": "n1", "Address": "127.0.0.1"},
                               "Service": {"ID": format!("{name}-{port}"), "Service": name,
                                           "Address": "127.0.0.1", "Port": port},
                               "Checks": []})
                    })
                    .collect();
                respond(s, 200, &index, &json!(entries).to_string())
            }
            _ => respond(s, 404, &index, ""),
        }
    }))
}

#[test]
fn consul_follows_changes_and_keeps_nodes_through_faults() {
    let (a, b, fallback) = (named("a"), named("b"), named("fallback"));
    let shared = Shared::new(Consul {
        index: 10,
        services: BTreeMap::from([
            ("service_a".to_string(), vec![a]),
            ("skipped".to_string(), vec![b]),
        ]),
        fail: 0,
        garbage: 0,
    });
    let consul = consul_server(shared.clone());
    let dump = tempfile::tempdir().unwrap();
    let dump_path = dump.path().join("consul.dump");
    // APISIX's documented route body (docs/en/latest/discovery/consul.md), and one for a
    // service Consul does not list (the default service answers it).
    let routes = json!({"routes": [
        {"id": "1", "uri": "/*", "upstream": {"service_name": "service_a", "type": "roundrobin", "discovery_type": "consul"}},
        {"id": "2", "uri": "/none", "upstream": {"service_name": "unknown", "type": "roundrobin", "discovery_type": "consul"}}
    ]});
    let gw = Gw::start(
        &routes,
        &format!(
            "  consul:\n    servers:\n      - \"{}\"\n    token: \"secret-token\"\n    skip_services:\n      - skipped\n    timeout:\n      wait: 3\n    sort_type: port_sort\n    weight: 2\n    dump:\n      path: \"{}\"\n    default_service:\n      host: 127.0.0.1\n      port: {fallback}\n",
            consul.url(),
            dump_path.display()
        ),
    );
    gw.wait_for("/x", &["a"]);
    gw.wait_for("/none", &["fallback"]);

    // What the gateway asked: the token on every call, passing nodes only, never the skipped
    // services, and blocking queries from the last index.
    let calls = consul.requests("/v1/");
    assert!(
        calls
            .iter()
            .all(|r| r.query.get("token").map(String::as_str) == Some("secret-token")),
        "{calls:?}"
    );
    let reads = consul.requests("/v1/health/service/");
    assert!(reads
        .iter()
        .all(|r| r.query.get("passing").map(String::as_str) == Some("true")));
    assert!(
        reads.iter().all(|r| r.path.ends_with("/service_a")),
        "{reads:?}"
    );
    assert!(poll_until(Duration::from_secs(10), || {
        consul.requests("/v1/catalog/services").iter().any(|r| {
            r.query.get("index").map(String::as_str) == Some("10")
                && r.query.get("wait").map(String::as_str) == Some("3s")
        })
    })
    .is_some());

    // A node joins, then the first leaves: traffic follows.
    shared.change(|c| {
        c.services.insert("service_a".into(), vec![a, b]);
        c.index = 11;
    });
    gw.wait_for("/x", &["a", "b"]);
    shared.change(|c| {
        c.services.insert("service_a".into(), vec![b]);
        c.index = 12;
    });
    gw.wait_for("/x", &["b"]);

    // The dump file has what was fetched; the control API shows it, and the dump.
    assert!(
        poll_until(Duration::from_secs(5), || std::fs::read_to_string(
            &dump_path
        )
        .is_ok_and(|t| t.contains(&b.to_string())))
        .is_some()
    );
    let shown = gw.control("/v1/discovery/consul/show_dump_file");
    assert_eq!(shown.status, 200);
    let doc: Value = serde_json::from_slice(&shown.body).unwrap();
    assert_eq!(doc["services"]["service_a"][0]["port"], json!(b));
    assert!(doc["last_update"].as_i64().unwrap() > 0);
    let dumped = gw.control("/v1/discovery/consul/dump").json();
    assert_eq!(
        dumped["services"]["service_a"],
        json!([{"host": "127.0.0.1", "port": b, "weight": 2}])
    );
    assert_eq!(dumped["config"]["token"], json!("secret-token"));

    // Faults: 500s and garbage while nodes change; the last good nodes keep serving.
    shared.change(|c| {
        c.fail = 2;
        c.garbage = 0;
        c.services.insert("service_a".into(), vec![a]);
        c.index = 13;
    });
    assert_eq!(gw.seen("/x", 6).get("b"), Some(&6));
    gw.wait_for("/x", &["a"]);
    let stats = gw.control("/v1/discovery").json();
    assert!(
        stats["consul"]["failures"].as_u64().unwrap() >= 1,
        "{stats}"
    );
    // A service read answering garbage keeps that service's last good nodes (APISIX drops
    // them); the next change brings the new ones.
    shared.change(|c| {
        c.garbage = 1;
        c.services.insert("service_a".into(), vec![a, b]);
        c.index = 14;
    });
    assert!(poll_until(Duration::from_secs(10), || shared
        .state
        .lock()
        .unwrap()
        .garbage
        == 0)
    .is_some());
    assert_eq!(gw.seen("/x", 4).get("a"), Some(&4));
    shared.change(|c| c.index = 15);
    gw.wait_for("/x", &["a", "b"]);

    // Consul down: the last good nodes serve.
    consul.down.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_secs(2));
    let seen = gw.seen("/x", 6);
    assert_eq!(seen.values().sum::<usize>(), 6);
    assert!(seen.keys().all(|k| k == "a" || k == "b"), "{seen:?}");
    assert!(gw.log().contains("registry fetch failed"), "{}", gw.log());
}

#[test]
fn consul_keepalive_off_polls_every_fetch_interval() {
    let a = named("a");
    let b = named("b");
    let shared = Shared::new(Consul {
        index: 5,
        services: BTreeMap::from([("svc".to_string(), vec![a])]),
        fail: 0,
        garbage: 0,
    });
    let consul = consul_server(shared.clone());
    let routes = json!({"routes": [{"id": "1", "uri": "/p", "upstream": {
        "service_name": "svc", "type": "roundrobin", "discovery_type": "consul"}}]});
    let gw = Gw::start(
        &routes,
        &format!(
            "  consul:\n    servers:\n      - \"{}\"\n    keepalive: false\n    fetch_interval: 1\n",
            consul.url()
        ),
    );
    gw.wait_for("/p", &["a"]);
    shared.change(|c| {
        c.services.insert("svc".into(), vec![b]);
        c.index = 6;
    });
    gw.wait_for("/p", &["b"]);
    // No blocking queries, and no token argument when none is configured.
    let calls = consul.requests("/v1/");
    assert!(
        calls
            .iter()
            .all(|r| !r.query.contains_key("index") && !r.query.contains_key("token")),
        "{calls:?}"
    );
}

/// A stream route's upstream found by `discovery_type` + `service_name`: the same registry
/// client as the HTTP side's, its node changes followed by new sessions.
#[test]
fn consul_discovers_a_stream_routes_nodes() {
    let (a, b) = (named("a"), named("b"));
    let shared = Shared::new(Consul {
        index: 5,
        services: BTreeMap::from([("svc".to_string(), vec![a])]),
        fail: 0,
        garbage: 0,
    });
    let consul = consul_server(shared.clone());
    let tcp = free_port();
    let routes = json!({"stream_routes": [{"id": "s1", "server_port": tcp, "upstream": {
        "service_name": "svc", "type": "roundrobin", "discovery_type": "consul"}}]});
    let gw = Gw::start_keys(
        &routes,
        &format!(
            "  consul:\n    servers:\n      - \"{}\"\n    timeout:\n      wait: 3\n",
            consul.url()
        ),
        &format!(
            "  proxy_mode: http&stream\n  stream_proxy:\n    tcp:\n      - \"127.0.0.1:{tcp}\"\n"
        ),
    );
    let stream: SocketAddr = ([127, 0, 0, 1], tcp).into();
    gw.wait_for_at(stream, "/", &["a"]);
    shared.change(|c| {
        c.services.insert("svc".into(), vec![a, b]);
        c.index = 6;
    });
    gw.wait_for_at(stream, "/", &["a", "b"]);
    shared.change(|c| {
        c.services.insert("svc".into(), vec![b]);
        c.index = 7;
    });
    gw.wait_for_at(stream, "/", &["b"]);
}

// ---------------------------------------------------------------------------------------------
// Consul KV

#[test]
fn consul_kv_follows_keys_with_blocking_queries() {
    let (a, b) = (named("a"), named("b"));
    let keys = Shared::new((
        1u64,
        vec![(a, json!({"weight": 1, "max_fails": 2, "fail_timeout": 1}))],
        0usize,
    ));
    let k2 = keys.clone();
    let kv = Registry::start(Arc::new(move |req: &Req, s: &mut TcpStream| {
        let mut st = k2.state.lock().unwrap();
        if st.2 > 0 {
            st.2 -= 1;
            return respond(s, 500, &[], "");
        }
        if let Some(i) = req.query.get("index").and_then(|i| i.parse::<u64>().ok()) {
            let deadline = Instant::now() + Duration::from_secs(wait_secs(&req.query));
            while i != 0 && st.0 == i && Instant::now() < deadline {
                st = k2
                    .changed
                    .wait_timeout(st, deadline - Instant::now())
                    .unwrap()
                    .0;
            }
        }
        if req.path != "/v1/kv/upstreams" {
            return respond(s, 404, &[], "");
        }
        let list: Vec<Value> =
            st.1.iter()
                .map(|(port, v)| {
                    json!({"Key": format!("upstreams/webpages/127.0.0.1:{port}"),
                       "Value": base64::engine::general_purpose::STANDARD.encode(v.to_string()),
                       "CreateIndex": 1, "ModifyIndex": st.0, "Flags": 0, "LockIndex": 0})
                })
                .collect();
        respond(
            s,
            200,
            &[("X-Consul-Index", st.0.to_string())],
            &json!(list).to_string(),
        )
    }));
    let service = format!("{}/v1/kv/upstreams/webpages/", kv.url());
    // APISIX's documented route body, with this server's address.
    let routes = json!({"routes": [{"id": "1", "uri": "/*", "upstream": {
        "service_name": service, "type": "roundrobin", "discovery_type": "consul_kv"}}]});
    let gw = Gw::start(
        &routes,
        &format!(
            "  consul_kv:\n    servers:\n      - \"{}\"\n    prefix: upstreams\n    timeout:\n      wait: 3\n",
            kv.url()
        ),
    );
    gw.wait_for("/kv", &["a"]);
    let calls = kv.requests("/v1/kv/upstreams");
    assert!(calls
        .iter()
        .all(|r| r.query.get("recurse").map(String::as_str) == Some("true")));
    keys.change(|k| {
        k.0 = 2;
        k.1.push((b, json!({"weight": 1})));
    });
    gw.wait_for("/kv", &["a", "b"]);
    // A node marked unhealthy leaves.
    keys.change(|k| {
        k.0 = 3;
        k.1[0].1 = json!({"weight": 1, "check_status": false});
    });
    gw.wait_for("/kv", &["b"]);
    // Errors: the last good nodes serve.
    keys.change(|k| k.2 = 2);
    keys.change(|k| k.0 = 4);
    assert_eq!(gw.seen("/kv", 4).get("b"), Some(&4));
    let dumped = gw.control("/v1/discovery/consul_kv/dump").json();
    assert_eq!(
        dumped["services"][&service][0]["port"],
        json!(b),
        "{dumped}"
    );
    assert!(kv
        .requests("/v1/kv/")
        .iter()
        .any(|r| r.query.get("index").map(String::as_str) == Some("3")));
    // No dump configured: APISIX's answer.
    let shown = gw.control("/v1/discovery/consul_kv/show_dump_file");
    assert_eq!(
        (shown.status, shown.text()),
        (503, "dump params is nil".to_string())
    );
}

// ---------------------------------------------------------------------------------------------
// Kubernetes

enum WatchCmd {
    Event(Value),
    /// Half an event, then the connection drops.
    Cut(Value),
    /// The watch ends cleanly.
    Close,
}

struct Kube {
    version: u64,
    /// "ns/name" → the Endpoints object.
    objects: BTreeMap<String, Value>,
    list_fails: usize,
    /// Commands for the open watch, each delivered once (from `cursor` on).
    log: Vec<WatchCmd>,
    cursor: usize,
    /// The newest watch connection. The gateway holds one watch at a time, and a connection it
    /// dropped (after a 410, say) is only noticed on the next write: its handler must not take
    /// a command meant for the newer watch.
    watch_generation: u64,
}

fn endpoints(ns: &str, name: &str, version: u64, ports: &[u16]) -> Value {
    let subsets: Vec<Value> = ports
        .iter()
        .map(|p| {
            json!({"addresses": [{"ip": "127.0.0.1"}], "notReadyAddresses": [{"ip": "127.0.0.9"}],
                         "ports": [{"name": "http", "port": p, "protocol": "TCP"}]})
        })
        .collect();
    json!({"kind": "Endpoints", "apiVersion": "v1",
           "metadata": {"namespace": ns, "name": name, "resourceVersion": version.to_string()},
           "subsets": subsets})
}

fn kube_server(shared: Arc<Shared<Kube>>, token: &'static str) -> Registry {
    Registry::start(Arc::new(move |req: &Req, s: &mut TcpStream| {
        if req.headers.get("authorization").map(String::as_str) != Some(&format!("Bearer {token}"))
        {
            return respond(s, 401, &[], r#"{"kind":"Status","code":401}"#);
        }
        if req.path != "/api/v1/endpoints" {
            return respond(s, 404, &[], "");
        }
        if req.query.get("watch").map(String::as_str) != Some("true") {
            let mut st = shared.state.lock().unwrap();
            if st.list_fails > 0 {
                st.list_fails -= 1;
                return respond(s, 500, &[], "apiserver busy");
            }
            // Pages of one item, to follow `continue`.
            let start: usize = req
                .query
                .get("continue")
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let items: Vec<&Value> = st.objects.values().collect();
            let page: Vec<&Value> = items.iter().skip(start).take(1).copied().collect();
            let cont = if start + 1 < items.len() {
                (start + 1).to_string()
            } else {
                String::new()
            };
            let body = json!({"kind": "EndpointsList", "apiVersion": "v1",
                "metadata": {"resourceVersion": st.version.to_string(), "continue": cont},
                "items": page});
            return respond(s, 200, &[], &body.to_string());
        }
        let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
        if s.write_all(head.as_bytes()).is_err() {
            return false;
        }
        let mut st = shared.state.lock().unwrap();
        st.watch_generation += 1;
        let generation = st.watch_generation;
        loop {
            if st.watch_generation != generation {
                return false;
            }
            while st.cursor < st.log.len() {
                let next = st.cursor;
                st.cursor += 1;
                let chunk = |s: &mut TcpStream, text: &str| {
                    s.write_all(format!("{:x}\r\n{text}\r\n", text.len()).as_bytes())
                        .is_ok()
                };
                match &st.log[next] {
                    WatchCmd::Event(e) => {
                        if !chunk(s, &format!("{e}\n")) {
                            return false;
                        }
                    }
                    WatchCmd::Cut(e) => {
                        let text = e.to_string();
                        let _ = chunk(s, &text[..text.len() / 2]);
                        let _ = s.shutdown(std::net::Shutdown::Both);
                        return false;
                    }
                    WatchCmd::Close => {
                        let _ = s.write_all(b"0\r\n\r\n");
                        return false;
                    }
                }
            }
            st = shared
                .changed
                .wait_timeout(st, Duration::from_secs(1))
                .unwrap()
                .0;
        }
    }))
}

#[test]
fn kubernetes_list_watch_follows_endpoints_and_recovers() {
    let (a, b, c) = (named("a"), named("b"), named("c"));
    let shared = Shared::new(Kube {
        version: 100,
        objects: BTreeMap::from([
            ("ns1/web".to_string(), endpoints("ns1", "web", 100, &[a])),
            (
                "ns1/other".to_string(),
                endpoints("ns1", "other", 100, &[c]),
            ),
        ]),
        list_fails: 1,
        log: Vec::new(),
        cursor: 0,
        watch_generation: 0,
    });
    let kube = kube_server(shared.clone(), "tok-1");
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("token");
    std::fs::write(&token_file, "tok-1\n").unwrap();
    let routes = json!({"routes": [
        {"id": "1", "uri": "/web", "upstream": {"service_name": "ns1/web:http", "type": "roundrobin", "discovery_type": "kubernetes"}},
        {"id": "2", "uri": "/other", "upstream": {"service_name": "ns1/other:http", "type": "roundrobin", "discovery_type": "kubernetes"}}
    ]});
    let gw = Gw::start(
        &routes,
        &format!(
            "  kubernetes:\n    service:\n      schema: http\n      host: 127.0.0.1\n      port: \"{}\"\n    client:\n      token_file: \"{}\"\n    label_selector: \"app=web\"\n    default_weight: 10\n",
            kube.port,
            token_file.display()
        ),
    );
    // The first lists fail: not ready (APISIX 3.15's readiness check).
    let status: SocketAddr = ([127, 0, 0, 1], gw.status).into();
    let first = get(status, "/status/ready");
    if first.status == 503 {
        assert_eq!(
            first.json()["error"],
            json!("kubernetes discovery not ready")
        );
    }
    gw.wait_for("/web", &["a"]);
    gw.wait_for("/other", &["c"]);
    assert_eq!(get(status, "/status/ready").status, 200);
    let lists: Vec<Req> = kube
        .requests("/api/v1/endpoints")
        .into_iter()
        .filter(|r| !r.query.contains_key("watch"))
        .collect();
    assert!(lists
        .iter()
        .all(|r| r.query.get("limit").map(String::as_str) == Some("120")
            && r.query.get("labelSelector").map(String::as_str) == Some("app=web")));
    assert!(
        lists
            .iter()
            .any(|r| r.query.get("continue").map(String::as_str) == Some("1")),
        "{lists:?}"
    );
    assert!(poll_until(Duration::from_secs(10), || {
        kube.requests("/api/v1/endpoints").iter().any(|r| {
            r.query.get("watch").map(String::as_str) == Some("true")
                && r.query.get("allowWatchBookmarks").map(String::as_str) == Some("true")
                && r.query.get("resourceVersion").map(String::as_str) == Some("100")
        })
    })
    .is_some());

    // A watch event adds a node; another removes the first.
    shared.change(|k| {
        k.log.push(WatchCmd::Event(
            json!({"type": "MODIFIED", "object": endpoints("ns1", "web", 101, &[a, b])}),
        ))
    });
    gw.wait_for("/web", &["a", "b"]);
    shared.change(|k| {
        k.log.push(WatchCmd::Event(
            json!({"type": "MODIFIED", "object": endpoints("ns1", "web", 102, &[b])}),
        ))
    });
    gw.wait_for("/web", &["b"]);
    let dumped = gw.control("/v1/discovery/kubernetes/dump").json();
    let eps = &dumped["endpoints"][0]["endpoints"];
    let web = eps
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "ns1/web")
        .unwrap();
    let value: Value = serde_json::from_str(web["value"].as_str().unwrap()).unwrap();
    assert_eq!(
        value,
        json!({"http": [{"host": "127.0.0.1", "port": b, "weight": 10}]})
    );

    // A bookmark moves the version on; a clean end of the watch resumes from it.
    shared.change(|k| {
        k.log.push(WatchCmd::Event(json!({"type": "BOOKMARK", "object": {"kind": "Endpoints", "metadata": {"resourceVersion": "150"}}})));
        k.log.push(WatchCmd::Close);
    });
    assert!(poll_until(Duration::from_secs(10), || {
        kube.requests("/api/v1/endpoints")
            .iter()
            .any(|r| r.query.get("resourceVersion").map(String::as_str) == Some("150"))
    })
    .is_some());

    // A watch cut mid-event: the nodes stay; the gateway lists again and sees the current
    // state (the event that was cut is in it).
    shared.change(|k| {
        k.version = 160;
        k.objects
            .insert("ns1/web".into(), endpoints("ns1", "web", 160, &[a]));
        k.log.push(WatchCmd::Cut(
            json!({"type": "MODIFIED", "object": endpoints("ns1", "web", 160, &[a])}),
        ));
    });
    assert!(!gw.seen("/web", 3).keys().any(|k| k.starts_with("status")));
    gw.wait_for("/web", &["a"]);

    // 410 Gone: list again. What changed meanwhile (no event for it) is picked up, and an
    // object deleted meanwhile goes away.
    shared.change(|k| {
        k.version = 170;
        k.objects.insert("ns1/web".into(), endpoints("ns1", "web", 170, &[c]));
        k.objects.remove("ns1/other");
        k.log.push(WatchCmd::Event(json!({"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}})));
    });
    gw.wait_for("/web", &["c"]);
    gw.wait_for("/other", &["status 503"]);

    // A rotated token is read from the file for the next request; the API server down
    // (and a token it rejects) keeps the last good endpoints.
    std::fs::write(&token_file, "tok-2\n").unwrap();
    shared.change(|k| k.log.push(WatchCmd::Close));
    assert!(poll_until(Duration::from_secs(10), || {
        kube.requests("/api/")
            .iter()
            .any(|r| r.headers.get("authorization").map(String::as_str) == Some("Bearer tok-2"))
    })
    .is_some());
    assert_eq!(gw.seen("/web", 2).get("c"), Some(&2));
    kube.down.store(true, Ordering::SeqCst);
    assert_eq!(gw.seen("/web", 4).get("c"), Some(&4));
    assert!(
        gw.control("/v1/discovery").json()["kubernetes"]["failures"]
            .as_u64()
            .unwrap()
            >= 1
    );
}

#[test]
fn kubernetes_several_clusters_and_endpoint_slices() {
    let (a, b) = (named("a"), named("b"));
    // An API server serving EndpointSlices: one ready endpoint, one not ready.
    let slices = Shared::new(vec![
        json!({"kind": "EndpointSlice", "metadata": {"namespace": "prod", "name": "web-abc", "resourceVersion": "5",
               "labels": {"kubernetes.io/service-name": "web"}},
               "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
               "ports": [{"name": "http", "port": a}]}),
        json!({"kind": "EndpointSlice", "metadata": {"namespace": "prod", "name": "web-def", "resourceVersion": "5",
               "labels": {"kubernetes.io/service-name": "web"}},
               "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": false}}],
               "ports": [{"name": "http", "port": b}]}),
        json!({"kind": "EndpointSlice", "metadata": {"namespace": "kube-system", "name": "dns", "resourceVersion": "5",
               "labels": {"kubernetes.io/service-name": "web"}},
               "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
               "ports": [{"name": "http", "port": b}]}),
    ]);
    let s2 = slices.clone();
    let api = Registry::start(Arc::new(move |req: &Req, s: &mut TcpStream| {
        if req.path != "/apis/discovery.k8s.io/v1/endpointslices" {
            return respond(s, 404, &[], "");
        }
        if req.query.contains_key("watch") {
            // Watches end at once (the list is what this test reads).
            std::thread::sleep(Duration::from_millis(200));
            return respond(s, 200, &[], "");
        }
        let items = s2.state.lock().unwrap().clone();
        respond(s, 200, &[], &json!({"kind": "EndpointSliceList", "metadata": {"resourceVersion": "5"}, "items": items}).to_string())
    }));
    let routes = json!({"routes": [{"id": "1", "uri": "/s", "upstream": {
        "service_name": "east/prod/web:http", "type": "roundrobin", "discovery_type": "kubernetes"}}]});
    let gw = Gw::start(
        &routes,
        &format!(
            "  kubernetes:\n    - id: east\n      service:\n        schema: http\n        host: 127.0.0.1\n        port: \"{}\"\n      client:\n        token: east-token\n      watch_endpoint_slices: true\n      namespace_selector:\n        match:\n          - \"prod.*\"\n",
            api.port
        ),
    );
    gw.wait_for("/s", &["a"]);
    // The not-ready endpoint and the other namespace are left out.
    assert_eq!(gw.seen("/s", 6).get("a"), Some(&6));
    let r = &api.requests("/apis/")[0];
    assert_eq!(
        r.headers.get("authorization").map(String::as_str),
        Some("Bearer east-token")
    );
    // The slice becomes ready (the next list sees it).
    slices.change(|l| l[1]["endpoints"][0]["conditions"]["ready"] = json!(true));
    gw.wait_for("/s", &["a", "b"]);
    let dumped = gw.control("/v1/discovery/kubernetes/dump").json();
    assert_eq!(dumped["endpoints"][0]["id"], json!("east"));
}

// ---------------------------------------------------------------------------------------------
// Nacos

#[test]
fn nacos_reads_the_named_services_with_login_namespace_and_group() {
    let (a, b) = (named("a"), named("b"));
    // (namespace, group, service) → ports; and the number of 500s to answer.
    type Services = BTreeMap<(String, String, String), Vec<u16>>;
    let shared = Shared::new((
        Services::from([
            (
                (
                    "public".into(),
                    "DEFAULT_GROUP".into(),
                    "APISIX-NACOS".into(),
                ),
                vec![a],
            ),
            (
                ("test_ns".into(), "test_group".into(), "APISIX-NACOS".into()),
                vec![b],
            ),
        ]),
        0usize,
    ));
    let s2 = shared.clone();
    let nacos = Registry::start(Arc::new(move |req: &Req, s: &mut TcpStream| {
        let mut st = s2.state.lock().unwrap();
        if req.path == "/nacos/v1/auth/login" {
            let ok = req.query.get("username").map(String::as_str) == Some("nacos")
                && req.query.get("password").map(String::as_str) == Some("nacos-pw");
            return if ok && req.method == "POST" {
                respond(
                    s,
                    200,
                    &[],
                    r#"{"accessToken":"tk-123","tokenTtl":18000,"globalAdmin":true}"#,
                )
            } else {
                respond(s, 403, &[], "unknown user!")
            };
        }
        if st.1 > 0 {
            st.1 -= 1;
            return respond(s, 500, &[], "server error");
        }
        if req.path != "/nacos/v1/ns/instance/list" {
            return respond(s, 404, &[], "");
        }
        if req.query.get("accessToken").map(String::as_str) != Some("tk-123") {
            return respond(s, 403, &[], "token invalid!");
        }
        let q = |k: &str| req.query.get(k).cloned().unwrap_or_default();
        let hosts: Vec<Value> = st
            .0
            .get(&(q("namespaceId"), q("groupName"), q("serviceName")))
            .into_iter()
            .flatten()
            .map(|p| json!({"ip": "127.0.0.1", "port": p, "weight": 1.0, "healthy": true, "enabled": true, "metadata": {}}))
            .collect();
        respond(
            s,
            200,
            &[],
            &json!({"name": q("serviceName"), "hosts": hosts, "cacheMillis": 3000}).to_string(),
        )
    }));
    // APISIX's documented route bodies (docs/en/latest/discovery/nacos.md): the default
    // namespace and group, and discovery_args naming both.
    let routes = json!({"routes": [
        {"id": "1", "uri": "/nacos/*", "upstream": {"service_name": "APISIX-NACOS", "type": "roundrobin", "discovery_type": "nacos"}},
        {"id": "2", "uri": "/nacosWithNamespaceIdAndGroupName/*", "upstream": {"service_name": "APISIX-NACOS", "type": "roundrobin",
            "discovery_type": "nacos", "discovery_args": {"namespace_id": "test_ns", "group_name": "test_group"}}}
    ]});
    let gw = Gw::start(
        &routes,
        &format!(
            "  nacos:\n    host:\n      - \"http://nacos:nacos-pw@127.0.0.1:{}\"\n    prefix: \"/nacos/v1/\"\n    fetch_interval: 1\n    weight: 100\n    timeout:\n      connect: 2000\n      send: 2000\n      read: 5000\n",
            nacos.port
        ),
    );
    gw.wait_for("/nacos/x", &["a"]);
    gw.wait_for("/nacosWithNamespaceIdAndGroupName/x", &["b"]);
    let reads = nacos.requests("/nacos/v1/ns/instance/list");
    assert!(reads
        .iter()
        .all(|r| r.query.get("healthyOnly").map(String::as_str) == Some("true")));
    // A node joins the default group's service.
    shared.change(|st| {
        st.0.get_mut(&(
            "public".into(),
            "DEFAULT_GROUP".into(),
            "APISIX-NACOS".into(),
        ))
        .unwrap()
        .push(b);
    });
    gw.wait_for("/nacos/x", &["a", "b"]);
    // Nacos failing: the last good nodes serve.
    shared.change(|st| st.1 = 1_000_000);
    std::thread::sleep(Duration::from_secs(2));
    let seen = gw.seen("/nacos/x", 4);
    assert_eq!(seen.values().sum::<usize>(), 4);
    assert!(!seen.keys().any(|k| k.starts_with("status")), "{seen:?}");
    let dumped = gw.control("/v1/discovery/nacos/dump").json();
    assert!(
        dumped["services"]["default/test_ns/test_group/APISIX-NACOS"]["nodes"].is_array(),
        "{dumped}"
    );
    assert!(
        gw.control("/v1/discovery").json()["nacos"]["failures"]
            .as_u64()
            .unwrap()
            >= 1
    );
}

// ---------------------------------------------------------------------------------------------
// Eureka

#[test]
fn eureka_reads_the_registry_with_basic_auth() {
    let (a, b) = (named("a"), named("b"));
    let instance = |port: u16, status: &str| {
        json!({"instanceId": format!("i-{port}"), "app": "USER-SERVICE", "ipAddr": "127.0.0.1", "status": status,
               "overriddenStatus": "UNKNOWN", "port": {"$": port, "@enabled": "true"},
               "securePort": {"$": 443, "@enabled": "false"}, "metadata": {"management.port": "8761"}})
    };
    let shared = Shared::new((vec![instance(a, "UP"), instance(b, "DOWN")], false));
    let s2 = shared.clone();
    let eureka = Registry::start(Arc::new(move |req: &Req, s: &mut TcpStream| {
        let st = s2.state.lock().unwrap();
        let auth = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("eu:pw")
        );
        if req.headers.get("authorization") != Some(&auth) {
            return respond(s, 401, &[], "");
        }
        if st.1 {
            return respond(s, 200, &[], "{\"applications\": garbage");
        }
        if req.path != "/eureka/apps/" && req.path != "/eureka/apps" {
            return respond(s, 404, &[], "");
        }
        let body = json!({"applications": {"versions__delta": "1", "apps__hashcode": "UP_1_",
            "application": [{"name": "USER-SERVICE", "instance": st.0}]}});
        respond(s, 200, &[], &body.to_string())
    }));
    // APISIX's documented route body (docs/en/latest/discovery.md).
    let routes = json!({"routes": [{"id": "1", "uri": "/user/*", "upstream": {
        "service_name": "USER-SERVICE", "type": "roundrobin", "discovery_type": "eureka"}}]});
    let gw = Gw::start(
        &routes,
        &format!(
            "  eureka:\n    host:\n      - \"http://eu:pw@127.0.0.1:{}\"\n    prefix: \"/eureka/\"\n    fetch_interval: 1\n    weight: 100\n",
            eureka.port
        ),
    );
    gw.wait_for("/user/1", &["a"]);
    shared.change(|st| st.0[1]["status"] = json!("UP"));
    gw.wait_for("/user/1", &["a", "b"]);
    // Garbage: the last good nodes serve.
    shared.change(|st| st.1 = true);
    std::thread::sleep(Duration::from_secs(2));
    let seen = gw.seen("/user/1", 4);
    assert!(seen.keys().all(|k| k == "a" || k == "b"), "{seen:?}");
    let dumped = gw.control("/v1/discovery/eureka/dump").json();
    assert_eq!(
        dumped["services"]["USER-SERVICE"].as_array().unwrap().len(),
        2,
        "{dumped}"
    );
    assert!(
        gw.control("/v1/discovery").json()["eureka"]["failures"]
            .as_u64()
            .unwrap()
            >= 1
    );
    assert_eq!(gw.control("/v1/discovery/nacos/dump").status, 404);
}

#[test]
fn unconfigured_discovery_type_is_quarantined_with_apisix_message() {
    let a = named("a");
    let routes = json!({"routes": [
        {"id": "1", "uri": "/n", "upstream": {"service_name": "svc", "type": "roundrobin", "discovery_type": "nacos"}},
        {"id": "2", "uri": "/ok", "upstream": {"nodes": {format!("127.0.0.1:{a}"): 1}, "type": "roundrobin"}}
    ]});
    let gw = Gw::start(&routes, "  dns:\n    servers:\n      - \"127.0.0.1:53\"\n");
    gw.wait_for("/ok", &["a"]);
    let config = gw.control("/v1/config").json();
    let text = config["quarantined"].to_string();
    assert!(text.contains("discovery nacos is uninitialized"), "{text}");
}

// ---------------------------------------------------------------------------------------------
// Change → served traffic, at 1,000 services (a measurement, not a check: run with
// `cargo test --test e2e discovery::change_to_traffic -- --ignored --nocapture`).

/// How long after each registry change the service's route answers from the new node.
fn measure(gw: &Gw, rounds: usize, mut change: impl FnMut(usize, bool)) -> Vec<Duration> {
    let mut out = Vec::new();
    let mut conn = Conn::open(gw.addr());
    for i in 0..rounds {
        let svc = (i * 37) % 1000;
        let to_b = (i / 1000) % 2 == 0;
        let want = if to_b { "b" } else { "a" };
        let start = Instant::now();
        change(svc, to_b);
        loop {
            let r = conn.get(&format!("/s{svc}"));
            if r.header("X-Upstream") == Some(want) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no change seen for svc{svc}"
            );
        }
        out.push(start.elapsed());
    }
    out.sort();
    out
}

fn report(what: &str, samples: &[Duration]) {
    let p =
        |q: f64| samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1];
    println!(
        "{what}: {} changes, p50 {:?}, p99 {:?}, max {:?} ({} build)",
        samples.len(),
        p(0.50),
        p(0.99),
        samples[samples.len() - 1],
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
}

fn thousand_routes(kind: &str, name: impl Fn(usize) -> String) -> Value {
    let routes: Vec<Value> = (0..1000)
        .map(|i| {
            json!({"id": format!("r{i}"), "uri": format!("/s{i}"), "upstream": {
            "service_name": name(i), "type": "roundrobin", "discovery_type": kind}})
        })
        .collect();
    json!({ "routes": routes })
}

#[test]
#[ignore = "a measurement; run by hand"]
fn change_to_traffic_consul_1000_services() {
    let (a, b) = (named("a"), named("b"));
    let shared = Shared::new(Consul {
        index: 1,
        services: (0..1000).map(|i| (format!("svc{i}"), vec![a])).collect(),
        fail: 0,
        garbage: 0,
    });
    let consul = consul_server(shared.clone());
    let gw = Gw::start(
        &thousand_routes("consul", |i| format!("svc{i}")),
        &format!(
            "  consul:\n    servers:\n      - \"{}\"\n    timeout:\n      wait: 30\n",
            consul.url()
        ),
    );
    gw.wait_for("/s999", &["a"]);
    let samples = measure(&gw, 100, |svc, to_b| {
        shared.change(|c| {
            c.services
                .insert(format!("svc{svc}"), vec![if to_b { b } else { a }]);
            c.index += 1;
        })
    });
    report("consul, 1,000 services", &samples);
}

#[test]
#[ignore = "a measurement; run by hand"]
fn change_to_traffic_kubernetes_1000_services() {
    let (a, b) = (named("a"), named("b"));
    let shared = Shared::new(Kube {
        version: 1,
        objects: (0..1000)
            .map(|i| {
                (
                    format!("default/svc{i}"),
                    endpoints("default", &format!("svc{i}"), 1, &[a]),
                )
            })
            .collect(),
        list_fails: 0,
        log: Vec::new(),
        cursor: 0,
        watch_generation: 0,
    });
    let kube = kube_server(shared.clone(), "t");
    let gw = Gw::start(
        &thousand_routes("kubernetes", |i| format!("default/svc{i}:http")),
        &format!(
            "  kubernetes:\n    service:\n      schema: http\n      host: 127.0.0.1\n      port: \"{}\"\n    client:\n      token: t\n",
            kube.port
        ),
    );
    gw.wait_for("/s999", &["a"]);
    let samples = measure(&gw, 100, |svc, to_b| {
        shared.change(|k| {
            k.version += 1;
            let obj = endpoints(
                "default",
                &format!("svc{svc}"),
                k.version,
                &[if to_b { b } else { a }],
            );
            k.log
                .push(WatchCmd::Event(json!({"type": "MODIFIED", "object": obj})));
        })
    });
    report("kubernetes, 1,000 services", &samples);
}
