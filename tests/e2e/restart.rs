//! Restarts under load lose no request: `wrk -c 64 -d 20` against a node on the embedded
//! store (2 workers, so 2 `SO_REUSEPORT` sockets per address) while it is replaced, once by a
//! binary upgrade (a second process started beside it takes the sockets over) and once by a
//! plain SIGTERM followed by a start. wrk must report no non-2xx answer and no socket error.
//! Also: SIGHUP applies a live key and SIGUSR1 reopens the access log.

use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::debian::require;
use support::{Behaviour, StoreGateway, StoreGatewayBuilder, Upstream};

fn route(node: &str) -> serde_json::Value {
    serde_json::json!({
        "uri": "/hello",
        "upstream": {"type": "roundrobin", "nodes": {node: 1}}
    })
}

/// wrk's figures: requests, non-2xx answers, socket errors (connect, read, write, timeout).
#[derive(Debug)]
struct WrkReport {
    requests: u64,
    non_2xx: u64,
    socket_errors: u64,
    text: String,
}

fn parse_wrk(text: &str) -> WrkReport {
    let mut report = WrkReport {
        requests: 0,
        non_2xx: 0,
        socket_errors: 0,
        text: text.to_owned(),
    };
    for line in text.lines().map(str::trim) {
        if let Some((n, _)) = line.split_once(" requests in ") {
            report.requests = n.trim().parse().unwrap_or(0);
        } else if let Some(n) = line.strip_prefix("Non-2xx or 3xx responses:") {
            report.non_2xx = n.trim().parse().unwrap_or(u64::MAX);
        } else if let Some(rest) = line.strip_prefix("Socket errors:") {
            report.socket_errors = rest
                .split(',')
                .filter_map(|part| part.split_whitespace().last()?.parse::<u64>().ok())
                .sum();
        }
    }
    report
}

/// Runs `wrk -c 64 -d 20` on `/hello` while `replace` runs (after 4 s).
fn under_wrk(gw: &mut StoreGateway, replace: impl FnOnce(&mut StoreGateway)) -> WrkReport {
    let url = format!("http://{}/hello", gw.data_addr());
    let wrk = Command::new("wrk")
        .args(["-t", "2", "-c", "64", "-d", "20", "--timeout", "10", &url])
        .output();
    // wrk runs on its own thread; the replacement happens meanwhile.
    let wrk = std::thread::spawn(move || wrk);
    std::thread::sleep(Duration::from_secs(4));
    replace(gw);
    let out = wrk.join().unwrap().expect("run wrk");
    parse_wrk(&String::from_utf8_lossy(&out.stdout))
}

fn node_under_load() -> (Upstream, StoreGateway) {
    require("wrk");
    let up = Upstream::start("up", Behaviour::Echo);
    let gw = StoreGatewayBuilder::embedded()
        .workers(2)
        .log_filter("info")
        .start();
    gw.put_route("1", &route(&up.node()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while gw.status_of("/hello") != 200 {
        assert!(Instant::now() < deadline, "the route was not served");
        std::thread::sleep(Duration::from_millis(20));
    }
    (up, gw)
}

fn assert_nothing_lost(what: &str, report: &WrkReport) {
    eprintln!("{what}: {report:?}");
    assert!(
        report.requests > 1000,
        "{what}: too few requests: {}",
        report.text
    );
    assert_eq!(
        report.non_2xx, 0,
        "{what}: non-2xx answers: {}",
        report.text
    );
    assert_eq!(
        report.socket_errors, 0,
        "{what}: socket errors: {}",
        report.text
    );
}

#[test]
fn a_binary_upgrade_under_wrk_loses_no_request() {
    let (_up, mut gw) = node_under_load();
    let old = gw.pid().unwrap();
    let report = under_wrk(&mut gw, |gw| {
        let took = gw.restart_in_place(false);
        eprintln!("upgrade: the old process exited {took:?} after the new one started");
    });
    assert_ne!(gw.pid().unwrap(), old);
    assert_nothing_lost("binary upgrade", &report);
    // The successor has the Admin API and the store: a write is served.
    let mut next = route(&_up.node());
    next["uri"] = "/after".into();
    gw.put_route("2", &next);
    let deadline = Instant::now() + Duration::from_secs(10);
    while gw.status_of("/after") != 200 {
        assert!(
            Instant::now() < deadline,
            "the write after the upgrade was not served"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_then_start_under_wrk_loses_no_request() {
    let (_up, mut gw) = node_under_load();
    let report = under_wrk(&mut gw, |gw| {
        let took = gw.restart_in_place(true);
        eprintln!("SIGTERM + start: the old process exited {took:?} after SIGTERM");
    });
    assert_nothing_lost("SIGTERM + start", &report);
    assert!(
        gw.log_text()
            .contains("listening sockets handed to a successor"),
        "{}",
        gw.log_text()
    );
}

#[test]
fn wrk_report_parsing() {
    let text = "Running 20s test @ http://127.0.0.1:1/hello\n  2 threads and 64 connections\n  \
                123456 requests in 20.01s, 20.00MB read\n  Socket errors: connect 1, read 2, write 3, timeout 4\n  \
                Non-2xx or 3xx responses: 5\nRequests/sec:   6170.00\n";
    let r = parse_wrk(text);
    assert_eq!((r.requests, r.non_2xx, r.socket_errors), (123456, 5, 10));
    let clean = parse_wrk("  10 requests in 1.00s, 1.00KB read\n");
    assert_eq!(
        (clean.requests, clean.non_2xx, clean.socket_errors),
        (10, 0, 0)
    );
}

/// SIGHUP re-reads config.yaml: a live key (`enable_server_tokens`) applies to the next
/// connection; SIGUSR1 after the access log was moved away starts a new file.
#[test]
fn sighup_applies_live_keys_and_sigusr1_reopens_the_access_log() {
    let up = Upstream::start("up", Behaviour::Echo);
    let gw = support::Gateway::start(&format!(
        "routes:\n  - uri: /hello\n    upstream:\n      nodes:\n        \"{}\": 1\n      type: roundrobin",
        up.node()
    ));
    let first = support::get(gw.addr(), "/hello");
    assert_eq!(first.status, 200);
    assert_eq!(first.header("server"), Some("ferrisix/0.1.0"));

    let config = gw.config_dir().join("config.yaml");
    let text = std::fs::read_to_string(&config).unwrap();
    let edited = text.replacen("apisix:\n", "apisix:\n  enable_server_tokens: false\n", 1);
    assert_ne!(text, edited);
    std::fs::write(&config, edited).unwrap();
    gw.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = support::get(gw.addr(), "/hello");
        if reply.header("server") == Some("ferrisix") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "SIGHUP did not apply enable_server_tokens"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // logrotate: move the file, signal, and the next lines go to a new file at the path.
    let log = support::access_log(&gw);
    let wait_for = |path: &std::path::Path, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(path).is_ok_and(|t| t.contains("/hello")) {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_for(&log, "no access log line before the rotation");
    let rotated = log.with_extension("log.1");
    std::fs::rename(&log, &rotated).unwrap();
    gw.signal("USR1");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(support::get(gw.addr(), "/hello").status, 200);
    // Lines are buffered for up to a second per worker.
    wait_for(&log, "SIGUSR1 did not reopen the access log at its path");
}
