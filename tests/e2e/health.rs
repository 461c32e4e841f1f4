//! End-to-end health checks through several worker threads: a node marked down by an active
//! probe or by passive counting is avoided by every worker, and a node that comes back gets
//! traffic again. Connections are opened one after another so the kernel spreads them over the
//! workers' `SO_REUSEPORT` listeners.
use crate::support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use support::*;

const WORKERS: usize = 4;

fn gateway(upstream: serde_json::Value) -> Gateway {
    let routes = json!({ "routes": [{ "id": "h1", "uri": "/h", "upstream": upstream }] });
    Gateway::start_workers(&routes.to_string(), "", "", WORKERS)
}

/// Statuses of `conns` fresh connections × `per_conn` requests.
fn statuses(gw: &Gateway, conns: usize, per_conn: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..conns {
        let mut c = Conn::open(gw.addr());
        for _ in 0..per_conn {
            out.push(c.get("/h").status);
        }
    }
    out
}

#[test]
fn active_probe_takes_a_dead_node_out_for_every_worker() {
    let live = Upstream::start("live", Behaviour::Echo);
    let dead = dead_node();
    let gw = gateway(json!({
        "type": "roundrobin",
        "retries": 0,
        "nodes": { live.node(): 1, dead.clone(): 1 },
        "checks": { "active": {
            "http_path": "/",
            "healthy": { "interval": 1, "successes": 1 },
            "unhealthy": { "interval": 1, "tcp_failures": 1 }
        }}
    }));
    // Before the first probe the dead node still gets its share.
    let waited = poll_until(Duration::from_secs(15), || {
        statuses(&gw, 4, 4).iter().all(|s| *s == 200)
    });
    assert!(waited.is_some(), "the dead node was never taken out");
    let all = statuses(&gw, 32, 8);
    assert!(
        all.iter().all(|s| *s == 200),
        "a worker still sent requests to the dead node: {all:?}"
    );
}

#[test]
fn passive_failures_seen_by_one_worker_take_the_node_out_of_all() {
    let live = Upstream::start("live", Behaviour::Echo);
    let dead = dead_node();
    let gw = gateway(json!({
        "type": "roundrobin",
        "retries": 0,
        "nodes": { live.node(): 1, dead.clone(): 1 },
        "checks": {
            "active": { "healthy": { "interval": 100 }, "unhealthy": { "interval": 100 } },
            "passive": { "unhealthy": { "http_statuses": [502], "http_failures": 1 } }
        }
    }));
    // One connection (one worker) meets the dead node once...
    let mut c = Conn::open(gw.addr());
    let mut failures = 0;
    for _ in 0..4 {
        if c.get("/h").status == 502 {
            failures += 1;
        }
    }
    assert_eq!(failures, 1, "the node should be out after its first 502");
    // ...and no worker sends to it any more.
    let all = statuses(&gw, 32, 8);
    assert!(all.iter().all(|s| *s == 200), "{all:?}");
}

#[test]
fn retried_failures_count_passively_even_with_active_checks_only() {
    // APISIX's balancer reports a failed try before retrying it elsewhere, with
    // resty.healthcheck's passive defaults (2 TCP failures) when `passive` is not configured.
    let live = Upstream::start("live", Behaviour::Echo);
    // Accepts, reads the request, hangs up: a TCP-level failure, retried on the live node.
    let broken = Upstream::start("broken", Behaviour::Hangup);
    let gw = gateway(json!({
        "type": "roundrobin",
        "nodes": { live.node(): 1, broken.node(): 1 },
        "checks": { "active": { "healthy": { "interval": 100 }, "unhealthy": { "interval": 100 } } }
    }));
    let mut c = Conn::open(gw.addr());
    for _ in 0..8 {
        assert_eq!(c.get("/h").status, 200);
    }
    assert_eq!(
        broken.hits(),
        2,
        "down after tcp_failures (2) retried failures"
    );
    for _ in 0..20 {
        assert_eq!(c.get("/h").status, 200);
    }
    assert_eq!(broken.hits(), 2, "a node marked down was tried again");
}

/// A node on a fixed port that can be started later (it is "dead" until then).
struct LateNode {
    port: u16,
    hits: Arc<AtomicUsize>,
}

impl LateNode {
    fn new() -> LateNode {
        LateNode {
            port: free_port(),
            hits: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn node(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts answering every request with 200 `late`, except `GET /probe` with 500.
    fn start(&self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).unwrap();
        let hits = self.hits.clone();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(mut s) = s else { continue };
                let hits = hits.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    let mut pending = Vec::new();
                    loop {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => pending.extend_from_slice(&buf[..n]),
                        }
                        while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                            let probe = pending.starts_with(b"GET /probe ");
                            pending.drain(..end + 4);
                            if probe {
                                let _ = s.write_all(
                                    b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n",
                                );
                                continue;
                            }
                            hits.fetch_add(1, Ordering::SeqCst);
                            let _ = s.write_all(
                                b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nX-Upstream: late\r\n\r\nlate",
                            );
                        }
                    }
                });
            }
        });
    }
}

#[test]
fn a_node_that_comes_back_gets_traffic_again() {
    let live = Upstream::start("live", Behaviour::Echo);
    let late = LateNode::new();
    let gw = gateway(json!({
        "type": "roundrobin",
        "retries": 0,
        "nodes": { live.node(): 1, late.node(): 1 },
        "checks": { "active": {
            "healthy": { "interval": 1, "successes": 2 },
            "unhealthy": { "interval": 1, "tcp_failures": 1 }
        }}
    }));
    assert!(
        poll_until(Duration::from_secs(15), || statuses(&gw, 2, 4)
            .iter()
            .all(|s| *s == 200))
        .is_some(),
        "the dead node was never taken out"
    );
    late.start();
    let started = Instant::now();
    // healthy.interval × successes = 2 s; allow for probe timing and a slow CI machine.
    let back = poll_until(Duration::from_secs(15), || {
        statuses(&gw, 2, 4);
        late.hits.load(Ordering::SeqCst) > 0
    });
    assert!(back.is_some(), "the node that came back never got traffic");
    eprintln!(
        "node back in traffic {:?} after it started listening",
        started.elapsed()
    );
}

#[test]
fn every_node_down_means_every_node_is_used() {
    // One node fails its probe (500 on /probe) but serves requests; the other is dead. Once
    // both are down APISIX uses them all: answers from the first, 502s from the second (with
    // no fall-back every request would be refused with 502).
    let probe_fails = LateNode::new();
    probe_fails.start();
    let dead = dead_node();
    let gw = gateway(json!({
        "type": "roundrobin",
        "retries": 0,
        "nodes": { probe_fails.node(): 1, dead.clone(): 1 },
        "checks": { "active": {
            "http_path": "/probe",
            "healthy": { "interval": 1, "successes": 1 },
            "unhealthy": { "interval": 1, "http_failures": 1, "tcp_failures": 1 }
        }}
    }));
    // Both are probed within the first interval; give them three.
    std::thread::sleep(Duration::from_secs(3));
    let s = statuses(&gw, 4, 4);
    assert!(s.contains(&200) && s.contains(&502), "{s:?}");
}

/// nginx as an HTTPS upstream with the test CA's `server.local` certificate.
fn cert_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tls")
}

/// `apisix_upstream_status` of one checker's node, from the metrics port.
fn upstream_status(gw: &Gateway, checker: &str, node: &str) -> Option<u8> {
    let metrics = get(
        std::net::SocketAddr::from(([127, 0, 0, 1], gw.metrics_port)),
        "/apisix/prometheus/metrics",
    )
    .text();
    let (ip, port) = node.rsplit_once(':').unwrap();
    let series =
        format!("apisix_upstream_status{{name=\"{checker}\",ip=\"{ip}\",port=\"{port}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn https_active_probes_handshake_verify_and_take_a_node_out() {
    let tls = support::nginx::NginxTls::start(false, "", "tls");
    let tls_node = format!("127.0.0.1:{}", tls.port);
    // Speaks plain HTTP: it waits for a request head and never answers a ClientHello, so the
    // handshakes of probes and of requests time out.
    let plain = Upstream::start("plain", Behaviour::Echo);
    // `checks.active.host` is the probes' Host and SNI (the nodes are addresses).
    let https_checks = |host: &str, verify: bool| {
        json!({ "active": {
            "type": "https",
            "host": host,
            "https_verify_certificate": verify,
            "healthy": { "interval": 1, "successes": 1 },
            "timeout": 0.5,
            "unhealthy": { "interval": 1, "tcp_failures": 1, "timeouts": 1 }
        }})
    };
    let https = |nodes: serde_json::Value, checks: serde_json::Value| {
        json!({ "type": "roundrobin", "scheme": "https", "retries": 0,
                "timeout": { "connect": 1, "send": 1, "read": 1 },
                "nodes": nodes, "checks": checks })
    };
    let routes = json!({ "routes": [
        { "id": "h", "uri": "/h", "upstream": https(
            json!({ tls_node.clone(): 1, plain.node(): 1 }),
            https_checks("server.local", true)) },
        // The certificate is not for wrong.local: verified, the probe fails...
        { "id": "v", "uri": "/v", "upstream": https(
            json!({ tls_node.clone(): 1 }), https_checks("wrong.local", true)) },
        // ...unverified, it succeeds.
        { "id": "n", "uri": "/n", "upstream": https(
            json!({ tls_node.clone(): 1 }), https_checks("wrong.local", false)) },
    ]});
    let gw = Gateway::start_workers(
        &routes.to_string(),
        &format!(
            "ssl:\n  enable: false\n  ssl_trusted_certificate: {}/ca.crt",
            cert_dir().display()
        ),
        "",
        WORKERS,
    );
    // Before the first probes the plain node gets its share (and fails: it speaks no TLS).
    let out = poll_until(Duration::from_secs(15), || {
        statuses(&gw, 4, 4).iter().all(|s| *s == 200)
    });
    assert!(
        out.is_some(),
        "the node failing its https probe was never taken out"
    );
    let all = statuses(&gw, 16, 4);
    assert!(all.iter().all(|s| *s == 200), "{all:?}");
    assert_eq!(
        upstream_status(&gw, "/apisix/routes/h", &plain.node()),
        Some(0)
    );
    assert_eq!(upstream_status(&gw, "/apisix/routes/h", &tls_node), Some(1));
    let settled = poll_until(Duration::from_secs(10), || {
        upstream_status(&gw, "/apisix/routes/v", &tls_node) == Some(0)
    });
    assert!(
        settled.is_some(),
        "a certificate for another name passed verification"
    );
    assert_eq!(upstream_status(&gw, "/apisix/routes/n", &tls_node), Some(1));
}

/// Issue 11: traffic-split's inline upstreams are checked (a dead node is taken out of the
/// split) and reported under APISIX's resource path for a plugin's upstream.
#[test]
fn traffic_split_inline_upstreams_are_checked_and_reported() {
    let live = Upstream::start("split-live", Behaviour::Echo);
    let dead = dead_node();
    let route = Upstream::start("route", Behaviour::Echo);
    let routes = json!({ "routes": [{
        "id": "s1",
        "uri": "/h",
        "plugins": { "traffic-split": { "rules": [{ "weighted_upstreams": [{
            "weight": 1,
            "upstream": {
                "type": "roundrobin",
                "retries": 0,
                "nodes": { live.node(): 1, dead.clone(): 1 },
                "checks": { "active": {
                    "http_path": "/",
                    "healthy": { "interval": 1, "successes": 1 },
                    "unhealthy": { "interval": 1, "tcp_failures": 1 }
                }}
            }
        }]}]}},
        "upstream": { "type": "roundrobin", "nodes": { route.node(): 1 } }
    }]});
    let gw = Gateway::start_workers(&routes.to_string(), "", "", 1);
    let name = "/apisix/routes/s1#plugins['traffic-split'].rules[0].weighted_upstreams[0].upstream";
    assert!(
        poll_until(Duration::from_secs(15), || upstream_status(
            &gw, name, &dead
        ) == Some(0))
        .is_some(),
        "the dead node of the split was never reported down"
    );
    assert_eq!(upstream_status(&gw, name, &live.node()), Some(1));
    let all = statuses(&gw, 4, 8);
    assert!(all.iter().all(|s| *s == 200), "{all:?}");
    assert_eq!(route.hits(), 0, "the split upstream was not used");
}
