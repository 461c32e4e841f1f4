//! Issue 8 (security and robustness), end to end against the binary: the Admin API's key
//! rules, connections that never send a request (also with the process out of descriptors),
//! idle and non-reading clients, nginx's request-head rules, and the wrong-key guard.
use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use support::*;

/// A `traditional` node on the embedded store whose whole `deployment.admin` and
/// `nginx_config.http` extras are given; every listener on its own random port.
struct Node {
    child: Child,
    dir: tempfile::TempDir,
    data: u16,
    admin: u16,
    control: u16,
    metrics: u16,
}

impl Node {
    fn config(admin_section: &str, http_extra: &str) -> (tempfile::TempDir, [u16; 4], String) {
        let dir = tempfile::tempdir().unwrap();
        let ports = [free_port(), free_port(), free_port(), free_port()];
        let text = format!(
            "apisix:\n  node_listen:\n    - ip: 127.0.0.1\n      port: {}\n  enable_control: true\n  control:\n    ip: 127.0.0.1\n    port: {}\n\
             deployment:\n  role: traditional\n  role_traditional:\n    config_provider: embedded\n  admin:\n    admin_listen:\n      ip: 127.0.0.1\n      port: {}\n{admin_section}\
             ferrisix:\n  data_dir: {}\n\
             plugin_attr:\n  prometheus:\n    export_addr:\n      ip: 127.0.0.1\n      port: {}\n\
             nginx_config:\n  worker_processes: 1\n  worker_shutdown_timeout: 1s\n  http:\n    access_log: \"off\"\n{http_extra}",
            ports[0],
            ports[2],
            ports[1],
            dir.path().join("data").display(),
            ports[3],
        );
        std::fs::write(dir.path().join("config.yaml"), &text).unwrap();
        (dir, ports, text)
    }

    /// Starts the node (under `ulimit -n` when given) and waits for its four ports.
    fn start(admin_section: &str, http_extra: &str, fd_limit: Option<u32>) -> Node {
        let (dir, [data, admin, control, metrics], _) = Self::config(admin_section, http_extra);
        let log = std::fs::File::create(dir.path().join("ferrisix.log")).unwrap();
        let bin = env!("CARGO_BIN_EXE_ferrisix");
        let config = dir.path().join("config.yaml");
        let mut cmd = match fd_limit {
            Some(n) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" -c \"$1\""))
                    .arg(bin)
                    .arg(&config);
                c
            }
            None => {
                let mut c = Command::new(bin);
                c.arg("-c").arg(&config);
                c
            }
        };
        let child = cmd
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut node = Node {
            child,
            dir,
            data,
            admin,
            control,
            metrics,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        for port in [control, admin, metrics, data] {
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                if let Ok(Some(status)) = node.child.try_wait() {
                    panic!("ferrisix exited ({status}):\n{}", node.log());
                }
                assert!(Instant::now() < deadline, "port {port} not listening");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        node
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ferrisix.log")).unwrap_or_default()
    }

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const ROUTE: &str =
    r#"{"uri":"/pwn","upstream":{"type":"roundrobin","nodes":{"127.0.0.1:1980":1}}}"#;

/// Finding 1: `admin_key: []` refuses every Admin request (APISIX's `check_token`), with a
/// warning at start; `-t` refuses it when the Admin API is reachable from beyond loopback;
/// `admin_key_required: false` opens the API with a warning at every start.
#[test]
fn empty_admin_key_list_refuses_everything() {
    let node = Node::start("    admin_key: []\n", "", None);
    let admin = Node::addr(node.admin);
    let r = request(
        admin,
        "PUT",
        "/apisix/admin/routes/pwn",
        &[],
        ROUTE.as_bytes(),
    );
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"error_msg": "failed to check token", "description": "missing apikey"})
    );
    for key in ["", "edd1c9f034335f136f87ad84b625c8f1"] {
        let r = request(
            admin,
            "PUT",
            "/apisix/admin/routes/pwn",
            &[("X-API-KEY", key)],
            ROUTE.as_bytes(),
        );
        assert_eq!(r.status, 401, "{}", r.text());
    }
    assert_eq!(get(Node::addr(node.data), "/pwn").status, 404);
    assert!(
        node.log()
            .contains("every Admin API request is refused with 401"),
        "{}",
        node.log()
    );

    let (dir, _, _) = Node::config("    admin_key: []\n    allow_admin: [0.0.0.0/0]\n", "");
    let out = Command::new(env!("CARGO_BIN_EXE_ferrisix"))
        .arg("-t")
        .arg("-c")
        .arg(dir.path().join("config.yaml"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("missing valid Admin API token"), "{stderr}");

    let open = Node::start(
        "    admin_key: []\n    admin_key_required: false\n",
        "",
        None,
    );
    let r = request(
        Node::addr(open.admin),
        "PUT",
        "/apisix/admin/routes/pwn",
        &[],
        ROUTE.as_bytes(),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert!(
        open.log().contains("Admin key is bypassed"),
        "{}",
        open.log()
    );
}

const KEY_SECTION: &str =
    "    admin_key:\n      - {name: admin, key: secret-admin-key, role: admin}\n";

/// Reads until the peer closes; true when it did within `limit`.
fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// Finding 2: on every listener, a connection that sends nothing or only part of the HTTP/2
/// preface is closed at client_header_timeout, and an idle keep-alive connection at
/// keepalive_timeout.
#[test]
fn silent_half_preface_and_idle_connections_are_closed_on_every_listener() {
    let node = Node::start(
        KEY_SECTION,
        "    client_header_timeout: 1s\n    keepalive_timeout: 1s\n",
        None,
    );
    for port in [node.data, node.admin, node.control, node.metrics] {
        for sent in [&b""[..], b"PRI * HTTP/2.0\r\n"] {
            let mut s = TcpStream::connect(Node::addr(port)).unwrap();
            s.write_all(sent).unwrap();
            assert!(
                closed_within(&mut s, Duration::from_secs(10)),
                "port {port} kept a connection that sent {sent:?}"
            );
        }
    }
    // Keep-alive: one answered request, then nothing.
    closed_after_one_request(&node, b"");
    // A later request's head that starts and never ends: closed after keepalive_timeout plus
    // client_header_timeout at most, never kept.
    closed_after_one_request(&node, b"GET /nothing HTTP/1.1\r\nHo");
}

/// One answered request on a new connection, then `then` sent: the connection is closed,
/// after the 1 s limit and within 10 s.
fn closed_after_one_request(node: &Node, then: &[u8]) {
    let mut s = TcpStream::connect(Node::addr(node.data)).unwrap();
    s.write_all(b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(read_reply(&mut s, false).status, 404);
    s.write_all(then).unwrap();
    let since = Instant::now();
    assert!(closed_within(&mut s, Duration::from_secs(10)), "{then:?}");
    assert!(
        since.elapsed() >= Duration::from_millis(900),
        "{then:?}: {:?}",
        since.elapsed()
    );
}

/// Finding 2, idle HTTP/2: a session with no stream open is closed at keepalive_timeout.
#[test]
fn idle_h2_session_is_closed() {
    let node = Node::start(KEY_SECTION, "    keepalive_timeout: 1s\n", None);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let stream = tokio::net::TcpStream::connect(Node::addr(node.data))
            .await
            .unwrap();
        let (mut send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await
        .unwrap();
        let conn = tokio::spawn(conn);
        let req = http::Request::get(format!("http://127.0.0.1:{}/none", node.data))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 404);
        drop(resp);
        let ended = tokio::time::timeout(Duration::from_secs(10), conn).await;
        assert!(
            ended.is_ok(),
            "the idle h2 session is still open after 10 s"
        );
    });
}

fn fd_soft_limit() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).map(str::to_owned))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024)
}

/// Finding 2 with the descriptors gone: a gateway under `ulimit -n 1024` holding 1,500 silent
/// connections. As nginx: the accept loops back off instead of wedging, the silent ones are cut
/// at client_header_timeout, and a request sent while they are held is answered once they go
/// (within curl -m3's three seconds) on the data, Admin and control ports.
#[test]
fn fd_exhaustion_by_silent_connections_does_not_wedge_the_listeners() {
    // The test's own descriptors: 1,500 connections need more than a 1024 limit.
    let (gateway_limit, silent) = if fd_soft_limit() >= 2048 {
        (1024, 1500)
    } else {
        (256, 400)
    };
    let node = Node::start(
        KEY_SECTION,
        "    client_header_timeout: 1s\n",
        Some(gateway_limit),
    );
    let held: Vec<TcpStream> = (0..silent)
        .map(|_| TcpStream::connect(Node::addr(node.data)).unwrap())
        .collect();
    let probes: Vec<_> = [
        (node.data, "/probe".to_owned(), 404),
        (node.admin, "/apisix/admin/routes".to_owned(), 401),
        (node.control, "/status".to_owned(), 200),
    ]
    .into_iter()
    .map(|(port, path, want)| {
        std::thread::spawn(move || {
            let started = Instant::now();
            let mut s = TcpStream::connect(Node::addr(port)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            s.write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .unwrap();
            let reply = try_read_reply(&mut s, false);
            (port, want, reply.map(|r| r.status), started.elapsed())
        })
    })
    .collect();
    for p in probes {
        let (port, want, status, took) = p.join().unwrap();
        assert_eq!(
            status.as_ref().ok(),
            Some(&want),
            "port {port} not answered within 3 s ({took:?}): {status:?}"
        );
    }
    let mut closed = 0;
    for mut s in held {
        if closed_within(&mut s, Duration::from_secs(10)) {
            closed += 1;
        }
    }
    assert_eq!(closed, silent, "every silent connection is cut");
    assert_eq!(get(Node::addr(node.data), "/after").status, 404);
    assert!(
        node.log().contains("accept failed"),
        "the gateway did run out of descriptors"
    );
}

/// Finding 3: a client that stops reading a 50 MB response is cut off after send_timeout and
/// the upstream connection is released (the upstream's write fails).
#[test]
fn send_timeout_cuts_a_client_that_stops_reading() {
    const SIZE: u64 = 50 << 20;
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let up_addr = upstream.local_addr().unwrap();
    let released = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    {
        let (released, sent) = (released.clone(), sent.clone());
        std::thread::spawn(move || {
            let (mut s, _) = upstream.accept().unwrap();
            let mut head = [0u8; 4096];
            let _ = s.read(&mut head);
            let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Length: {SIZE}\r\n\r\n");
            let chunk = vec![b'x'; 64 * 1024];
            while sent.load(Ordering::SeqCst) < SIZE {
                if s.write_all(&chunk).is_err() {
                    released.store(true, Ordering::SeqCst);
                    return;
                }
                sent.fetch_add(chunk.len() as u64, Ordering::SeqCst);
            }
        });
    }
    let routes = json!({"routes": [{"uri": "/big", "upstream": {"type": "roundrobin", "nodes": {up_addr.to_string(): 1}}}]});
    let metrics = free_port();
    let gw = Gateway::start_with(
        &routes.to_string(),
        &format!("    send_timeout: 1s\nplugin_attr:\n  prometheus:\n    export_addr:\n      ip: 127.0.0.1\n      port: {metrics}\n"),
    );
    let mut s = TcpStream::connect(gw.addr()).unwrap();
    s.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 1024];
    let _ = s.read(&mut first).unwrap();
    // Stop reading. Within send_timeout of the buffers filling up, the gateway gives up.
    assert!(
        poll_until(Duration::from_secs(30), || released.load(Ordering::SeqCst)).is_some(),
        "the upstream connection is still held ({} bytes sent)",
        sent.load(Ordering::SeqCst)
    );
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = 0u64;
    let mut buf = vec![0u8; 1 << 16];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    assert!(got < SIZE, "the client got the whole body after stalling");
}

fn echo_gateway(http_extra: &str) -> (Gateway, Upstream) {
    let up = Upstream::start("echo", Behaviour::Echo);
    let doc = json!({"routes": [{"uri": "/*", "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}]});
    let metrics = free_port();
    let gw = Gateway::start_with(
        &doc.to_string(),
        &format!("{http_extra}plugin_attr:\n  prometheus:\n    export_addr:\n      ip: 127.0.0.1\n      port: {metrics}\n"),
    );
    (gw, up)
}

/// The next answer on `s` is `status`, it came within `within` of `started`, and the gateway
/// then closed the connection.
fn answered_and_closed(
    s: &mut TcpStream,
    status: u16,
    started: Instant,
    within: Duration,
    what: &str,
) {
    let r = read_reply(s, false);
    assert_eq!(r.status, status, "{what}: {}", r.text());
    let took = started.elapsed();
    assert!(took < within, "{what}: answered after {took:?}");
    assert!(
        closed_within(s, Duration::from_secs(5)),
        "{what}: kept open"
    );
}

/// Findings 5-8 and 10: nginx's request-head rules.
#[test]
fn request_heads_as_nginx() {
    let (gw, up) = echo_gateway("    client_body_timeout: 1s\n");
    let addr = gw.addr();
    let port = gw.port.to_string();

    // 5: HTTP/1.0 without Host goes upstream with the node's Host (nginx's `$proxy_host`).
    let r = request_raw(addr, b"GET /old HTTP/1.0\r\n\r\n");
    assert_eq!(r.status, 200, "{}", r.text());
    let hs = r.json()["headers"].clone();
    assert_eq!(hs["host"], up.node());
    assert_eq!(hs["x-forwarded-host"], up.node());
    assert_eq!(hs["x-forwarded-port"], port.as_str());

    // 6: duplicate or empty Host.
    for raw in [
        &b"GET / HTTP/1.1\r\nHost: a.com\r\nHost: b.com\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: a.com\r\nHost: a.com\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost:\r\n\r\n",
        b"GET http://a.com/ HTTP/1.1\r\nHost: bad host\r\n\r\n",
    ] {
        assert_eq!(
            request_raw(addr, raw).status,
            400,
            "{}",
            String::from_utf8_lossy(raw)
        );
    }

    // 7: APISIX 3.18's `$var_x_forwarded_port` / `$var_x_forwarded_host` maps (ngx_tpl.lua):
    // the Host's port when it has one, else the server port; Host as sent.
    let r = request(addr, "GET", "/f", &[("Host", "fwd.example")], b"");
    assert_eq!(r.json()["headers"]["x-forwarded-port"], port.as_str());
    assert_eq!(r.json()["headers"]["x-forwarded-host"], "fwd.example");
    let r = request(addr, "GET", "/f", &[("Host", "fwd.example:8443")], b"");
    assert_eq!(r.json()["headers"]["x-forwarded-port"], "8443");

    // 8: a coding other than chunked is 501 and never reaches the upstream.
    let hits = up.hits();
    let r = request_raw(
        addr,
        b"POST /te HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    );
    assert_eq!(r.status, 501);
    assert_eq!(up.hits(), hits);

    // 10: methods.
    assert_eq!(request(addr, "TRACE", "/m", &[], b"").status, 405);
    assert_eq!(request(addr, "get", "/m", &[], b"").status, 400);
    assert_eq!(request(addr, "PROPFIND", "/m", &[], b"").status, 200);

    // 10: 150 small header fields, as nginx's buffers take them.
    let many: Vec<(String, String)> = (0..150)
        .map(|i| (format!("X-H-{i:03}"), format!("v{i}")))
        .collect();
    let refs: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let r = request(addr, "GET", "/many", &refs, b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["headers"]["x-h-149"], "v149");

    // 10: a chunk size past 2^63 - 1 (nginx's off_t) is 400 at once, not 408 after
    // client_body_timeout (1 s here) as when hyper's decoder waited for 2^64-1 bytes; the
    // connection is not kept.
    for size in ["ffffffffffffffff", "8000000000000000", "1ffffffffffffffff"] {
        let started = Instant::now();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let hits = up.hits();
        s.write_all(
            format!("POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{size}\r\n")
                .as_bytes(),
        )
        .unwrap();
        answered_and_closed(&mut s, 400, started, Duration::from_millis(900), size);
        assert_eq!(up.hits(), hits);
    }
    // 2^63 - 1 is a size nginx takes: the gateway waits for the data (408 at the timeout).
    let r = request_raw(
        addr,
        b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n7fffffffffffffff\r\nabc",
    );
    assert_eq!(r.status, 408);
    // A hex run in a chunk's data is data: an upload of such text goes through, and so does
    // the next request on the connection.
    let text = "ffffffffffffffffffffffffffffffff\r\n".repeat(4);
    let mut raw = format!(
        "POST /hex HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{text}\r\n0\r\n\r\n",
        text.len()
    );
    raw.push_str("GET /next HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    // Both answers can arrive in one read.
    let mut pending = Vec::new();
    let r = read_pipelined(&mut s, &mut pending, false);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["body_len"], text.len());
    let r = read_pipelined(&mut s, &mut pending, false);
    assert_eq!((r.status, r.json()["path"].as_str()), (200, Some("/next")));
    // Past the 64 KiB the gateway buffers, the body streams upstream: a refused size there is
    // still the client's fault (400), not a broken upstream (502).
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"POST /big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n11170\r\n")
        .unwrap();
    s.write_all(&[b'a'; 70_000]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    s.write_all(b"\r\nffffffffffffffff\r\n").unwrap();
    let r = read_reply(&mut s, false);
    assert_eq!(r.status, 400, "{}", r.text());
}

/// `client_body_timeout` bounds every wait for the client's body, also once the body is past
/// the 64 KiB read first and streams upstream (there the upstream's 60 s send timeout used to
/// be the only bound): 408, and the upstream never gets a whole request.
#[test]
fn client_body_timeout_bounds_a_streamed_body() {
    let (gw, up) = echo_gateway("    client_body_timeout: 1s\n");
    let addr = gw.addr();
    for head in [
        "POST /len HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n",
        "POST /chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n30d40\r\n",
    ] {
        let started = Instant::now();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(&[b'a'; 70_000]).unwrap();
        answered_and_closed(&mut s, 408, started, Duration::from_secs(20), head);
    }
    assert_eq!(up.hits(), 0);
    // A client that keeps sending, each part within the timeout, is not cut off.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
        .unwrap();
    for _ in 0..4 {
        s.write_all(&[b'a'; 25_000]).unwrap();
        std::thread::sleep(Duration::from_millis(600));
    }
    let r = read_reply(&mut s, false);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["body_len"], 100_000);
}

/// `nginx_config.http.client_max_body_size`: a declared length over it is 413 before routing
/// (also on a route whose client-control allows more, as nginx checks it first); a chunked
/// body gets 413 once it passes it, and the connection is closed. client-control's
/// `max_body_size` replaces it for the body read (0 lifts it).
#[test]
fn client_max_body_size_is_enforced() {
    let up = Upstream::start("echo", Behaviour::Echo);
    let node = up.node();
    let upstream = json!({"type": "roundrobin", "nodes": {node.clone(): 1}});
    let doc = json!({"routes": [
        {"id": "1", "uri": "/*", "upstream": upstream},
        {"id": "2", "uri": "/raised", "plugins": {"client-control": {"max_body_size": 100}}, "upstream": upstream},
        {"id": "3", "uri": "/lifted", "plugins": {"client-control": {"max_body_size": 0}}, "upstream": upstream},
    ]});
    let gw = Gateway::start_tuned(&doc.to_string(), "", "", 1, "client_max_body_size: 10");
    let addr = gw.addr();
    let chunked = |path: &str, chunks: &[&str]| {
        let mut raw =
            format!("POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
        for c in chunks {
            raw.push_str(&format!("{:x}\r\n{c}\r\n", c.len()));
        }
        raw.push_str("0\r\n\r\n");
        raw
    };
    let hits = up.hits();

    // Content-Length: at the limit passes, one byte over is 413 (the body unread, the
    // connection closed).
    let r = request(addr, "POST", "/a", &[], &[b'x'; 10]);
    assert_eq!((r.status, r.json()["body_len"].as_u64()), (200, Some(10)));
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n")
        .unwrap();
    let r = read_reply(&mut s, false);
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(
        r.text().contains("413 Request Entity Too Large"),
        "{}",
        r.text()
    );
    assert_eq!(r.header("connection"), Some("close"));
    assert!(closed_within(&mut s, Duration::from_secs(5)));
    // Checked before the route's plugins: client-control's larger limit does not lift it.
    assert_eq!(
        request(addr, "POST", "/raised", &[], &[b'x'; 50]).status,
        413
    );

    // Chunked: within the limit passes; past it is 413 and the connection is closed.
    let r = request_raw(addr, chunked("/a", &["12345", "67890"]).as_bytes());
    assert_eq!((r.status, r.json()["body_len"].as_u64()), (200, Some(10)));
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(chunked("/a", &["12345", "678901"]).as_bytes())
        .unwrap();
    let r = read_reply(&mut s, false);
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.header("connection"), Some("close"));
    assert!(closed_within(&mut s, Duration::from_secs(5)));
    // A large chunked upload is cut off at the limit, not read to its end first.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n100000\r\n")
        .unwrap();
    s.write_all(&[b'a'; 100]).unwrap();
    let r = read_reply(&mut s, false);
    assert_eq!(r.status, 413, "{}", r.text());

    // client-control replaces it for chunked bodies: 100 on /raised, none on /lifted.
    let r = request_raw(
        addr,
        chunked("/raised", &["x".repeat(60).as_str()]).as_bytes(),
    );
    assert_eq!((r.status, r.json()["body_len"].as_u64()), (200, Some(60)));
    let r = request_raw(
        addr,
        chunked("/raised", &["x".repeat(101).as_str()]).as_bytes(),
    );
    assert_eq!(r.status, 413);
    let r = request_raw(
        addr,
        chunked("/lifted", &["x".repeat(5000).as_str()]).as_bytes(),
    );
    assert_eq!((r.status, r.json()["body_len"].as_u64()), (200, Some(5000)));
    // Only the bodies that fit reached the upstream.
    assert_eq!(up.hits(), hits + 4);
}

/// Findings 10 and 11: failed authentications are logged with the client, and past a burst of
/// wrong keys the address gets 429 for them; the right key still gets through (issue 47,
/// item 18).
#[test]
fn wrong_keys_are_logged_with_the_client_and_throttled() {
    let gw = StoreGatewayBuilder::embedded().start();
    let admin = gw.admin_addr();
    let wrong = |key: &str| {
        request(
            admin,
            "GET",
            "/apisix/admin/routes",
            &[("X-API-KEY", key)],
            b"",
        )
        .status
    };
    for _ in 0..10 {
        assert_eq!(wrong("guess"), 401);
    }
    assert_eq!(wrong("guess"), 429);
    assert_eq!(wrong(ADMIN_KEY), 200);
    assert_eq!(wrong("guess"), 429);
    let log = gw.log_text();
    assert!(
        log.contains("failed to check token") && log.contains("client=127.0.0.1"),
        "{log}"
    );
}

/// Finding 10: an Admin body with invalid UTF-8 is refused as APISIX refuses invalid JSON.
#[test]
fn invalid_utf8_admin_body_is_refused() {
    let gw = StoreGatewayBuilder::embedded().start();
    let body = b"{\"uri\":\"/a\xff\",\"upstream\":{\"type\":\"roundrobin\",\"nodes\":{\"127.0.0.1:1980\":1}}}";
    let r = request(
        gw.admin_addr(),
        "PUT",
        "/apisix/admin/routes/u",
        &[("X-API-KEY", ADMIN_KEY)],
        body,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(
        r.json()["error_msg"],
        "invalid request body: Expected value but found invalid token at character 11"
    );
    assert_eq!(gw.admin("GET", "/apisix/admin/routes/u", "").status, 404);
}
