//! Process lifecycle: graceful shutdown finishes in-flight requests, `-t` checks a config,
//! and malformed requests get nginx's status codes without hurting the process.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use support::{Behaviour, Gateway, Upstream};

fn one_route(node: &str) -> String {
    format!(
        "routes:\n  - id: r1\n    uri: /*\n    upstream:\n      nodes:\n        \"{node}\": 1\n"
    )
}

#[test]
fn sigterm_finishes_the_slow_request_in_flight_then_exits_zero() {
    let up = Upstream::start("slow", Behaviour::Delay(Duration::from_millis(1500)));
    // handover_wait 0: the listeners close at SIGTERM, as nginx's (by default they stay open
    // a while for a successor: tests/e2e/restart.rs).
    let mut gw = Gateway::start_with(&one_route(&up.node()), "ferrisix:\n  handover_wait: 0\n");
    let addr = gw.addr();
    let in_flight = std::thread::spawn(move || support::get(addr, "/slow"));
    // Let the request reach the upstream, then ask the gateway to stop.
    let deadline = Instant::now() + Duration::from_secs(10);
    while up.hits() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    gw.signal("TERM");
    std::thread::sleep(Duration::from_millis(200));
    // New connections are no longer accepted while the old request finishes.
    assert!(
        TcpStream::connect(addr).is_err(),
        "the listener should be closed after SIGTERM"
    );
    let reply = in_flight.join().unwrap();
    assert_eq!(reply.status, 200, "the in-flight request completed");
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = gw.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "gateway did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exit status {status:?}");
}

#[test]
fn after_sigterm_with_no_successor_a_new_connection_is_answered_not_reset() {
    // The sockets stay open `handover_wait` (default 5 s) for a successor; a connection made
    // meanwhile with none coming must get its answer, neither wait out the whole wait nor be
    // reset when the sockets close.
    let up = Upstream::start("up", Behaviour::Echo);
    let mut gw = Gateway::start_with(&one_route(&up.node()), "");
    let addr = gw.addr();
    gw.signal("TERM");
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let reply = support::try_request(addr, "GET", "/after-term", &[], b"");
    let took = started.elapsed();
    assert!(
        matches!(&reply, Ok(r) if r.status == 200),
        "{reply:?} after {took:?}"
    );
    assert!(took < Duration::from_secs(2), "answered after {took:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = gw.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "gateway did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exit status {status:?}");
    assert!(
        TcpStream::connect(addr).is_err(),
        "the listener is closed once the process ended"
    );
}

#[test]
fn config_test_flag_reports_bad_resources() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        "deployment:\n  role: data_plane\n  role_data_plane:\n    config_provider: yaml\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("apisix.yaml"),
        "routes:\n  - id: ok\n    uri: /a\n    upstream:\n      nodes:\n        \"127.0.0.1:1\": 1\n  - id: bad\n    uri: /b\n    methods: [FETCH]\n    upstream:\n      nodes:\n        \"127.0.0.1:1\": 1\n#END\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ferrisix"))
        .args(["-t", "-c"])
        .arg(dir.path().join("config.yaml"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("route bad"), "{stderr}");
    assert!(
        stderr.contains("property \"methods\" validation failed"),
        "{stderr}"
    );

    std::fs::write(
        dir.path().join("apisix.yaml"),
        "routes:\n  - id: ok\n    uri: /a\n    upstream:\n      nodes:\n        \"127.0.0.1:1\": 1\n#END\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ferrisix"))
        .args(["-t", "-c"])
        .arg(dir.path().join("config.yaml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    std::fs::write(
        dir.path().join("config.yaml"),
        "apisix:\n  node_listen: [\"x\"]\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ferrisix"))
        .args(["-t", "-c"])
        .arg(dir.path().join("config.yaml"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("apisix.node_listen"), "{stderr}");
}

/// Sends raw bytes and returns the status code of the answer (0 if the connection closed).
fn raw_status(addr: std::net::SocketAddr, bytes: &[u8]) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(bytes);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let text = String::from_utf8_lossy(&buf);
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[test]
fn malformed_requests_get_nginx_statuses_and_the_gateway_keeps_serving() {
    let up = Upstream::start("ok", Behaviour::Echo);
    let gw = Gateway::start(&one_route(&up.node()));
    let addr = gw.addr();

    assert_eq!(raw_status(addr, b"GARBAGE\r\n\r\n"), 400);
    assert_eq!(
        raw_status(addr, b"GET /x HTTP/1.1\r\nHost: a b\r\n\r\n"),
        400
    );
    assert_eq!(
        raw_status(addr, b"GET /x HTTP/1.1\r\nHost: a/b\r\n\r\n"),
        400
    );
    assert_eq!(
        raw_status(addr, b"GET /x HTTP/1.1\r\n\r\n"),
        400,
        "HTTP/1.1 without Host"
    );
    assert_eq!(
        raw_status(addr, b"GET /../../etc/passwd HTTP/1.1\r\nHost: a\r\n\r\n"),
        400
    );
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(10_000));
    assert_eq!(raw_status(addr, long_uri.as_bytes()), 414);
    let big_header = format!(
        "GET /x HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "b".repeat(100_000)
    );
    assert_eq!(raw_status(addr, big_header.as_bytes()), 431);
    // Both framings at once: hyper follows RFC 9112 (chunked wins, Content-Length dropped
    // before forwarding) where nginx answers 400; either way nothing can be smuggled.
    let both = request_smuggling_probe(addr);
    assert!(both == 200 || both == 400, "got {both}");
    // A half-sent request must not wedge the worker: others are still served.
    let mut stalled = TcpStream::connect(addr).unwrap();
    stalled.write_all(b"GET /x HTTP/1.1\r\nHo").unwrap();
    let reply = support::get(addr, "/still-alive");
    assert_eq!(reply.status, 200);
    assert!(up.hits() <= 2, "only valid requests reached the upstream");
}

/// Sends a request carrying both Content-Length and chunked framing, followed by a second
/// request hidden in what Content-Length would claim; only one request may come out.
fn request_smuggling_probe(addr: std::net::SocketAddr) -> u16 {
    raw_status(
        addr,
        b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n",
    )
}

/// `ferrisix -V | head -1` and `ferrisix --help | head`: the reader goes away before the text
/// is written. The binary exits 0 without a panic's backtrace.
#[test]
fn version_and_help_into_a_closed_pipe_exit_quietly() {
    for flag in ["-V", "--help"] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let out = Command::new(env!("CARGO_BIN_EXE_ferrisix"))
            .arg(flag)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("ferrisix runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{flag}: {:?} {stderr}", out.status);
        assert!(!stderr.contains("panicked"), "{flag}: {stderr}");
    }
}
