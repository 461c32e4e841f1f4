//! End-to-end retries and timeouts (spec data-plane §3.4-§3.6): which failures move to another
//! node, the 502/504 answers, `X-APISIX-Upstream-Status`, `retries`, `retry_timeout` and the
//! route `timeout` override. Node order is forced with priority groups (§4.3), so the failing
//! node is always tried first.
use crate::support;

use std::time::Duration;

use serde_json::{json, Value};
use support::*;

fn node(addr: &str, priority: i64) -> Value {
    let (host, port) = addr.rsplit_once(':').unwrap();
    json!({ "host": host, "port": port.parse::<u16>().unwrap(), "weight": 1, "priority": priority })
}

/// Nodes tried in the given order: the first has the highest priority.
fn ordered(addrs: &[&str]) -> Value {
    let n = addrs.len() as i64;
    Value::Array(
        addrs
            .iter()
            .enumerate()
            .map(|(i, a)| node(a, n - i as i64))
            .collect(),
    )
}

fn gateway(upstream: Value) -> Gateway {
    gateway_route(json!({ "id": "r1", "uri": "/r", "upstream": upstream }))
}

fn gateway_route(route: Value) -> Gateway {
    Gateway::start(&json!({ "routes": [route] }).to_string())
}

/// `timeout` that gives up on a response head after 0.5 s.
fn short() -> Value {
    json!({ "connect": 1, "send": 1, "read": 0.5 })
}

#[test]
fn dead_node_then_live_one_succeeds_by_retry() {
    let live = Upstream::start("live", Behaviour::Echo);
    let dead = dead_node();
    let gw = gateway(json!({ "type": "roundrobin", "nodes": ordered(&[&dead, &live.node()]) }));
    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.header("X-Upstream"), Some("live"));
    assert_eq!(
        reply.header("X-APISIX-Upstream-Status"),
        None,
        "502, 200: last try not 5xx"
    );
    assert_eq!(live.hits(), 1);
}

#[test]
fn dead_and_live_nodes_in_one_group_always_answer() {
    let live = Upstream::start("live", Behaviour::Echo);
    let dead = dead_node();
    let gw = gateway(json!({ "type": "roundrobin", "nodes": { dead: 1, live.node(): 1 } }));
    for _ in 0..6 {
        let reply = get(gw.addr(), "/r");
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.header("X-APISIX-Upstream-Status"), None);
    }
    assert_eq!(live.hits(), 6);
}

#[test]
fn all_nodes_dead_is_502_listing_every_try() {
    let gw = gateway(json!({ "type": "roundrobin", "nodes": { dead_node(): 1, dead_node(): 1 } }));
    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 502);
    assert_eq!(reply.header("X-APISIX-Upstream-Status"), Some("502, 502"));
    assert!(reply.text().contains("502 Bad Gateway"), "{}", reply.text());
    assert_eq!(
        reply.header("Server"),
        Some(concat!("ferrisix/", env!("CARGO_PKG_VERSION")))
    );
}

#[test]
fn single_dead_node_is_502() {
    let gw = gateway(json!({ "type": "roundrobin", "nodes": { dead_node(): 1 } }));
    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 502);
    assert_eq!(reply.header("X-APISIX-Upstream-Status"), Some("502"));
}

#[test]
fn upstream_hanging_up_is_502_and_retried() {
    let hangup = Upstream::start("hangup", Behaviour::Hangup);
    let live = Upstream::start("live", Behaviour::Echo);
    let gw =
        gateway(json!({ "type": "roundrobin", "nodes": ordered(&[&hangup.node(), &live.node()]) }));
    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.header("X-Upstream"), Some("live"));
    assert_eq!(hangup.hits(), 1);

    let gw = gateway(json!({ "type": "roundrobin", "nodes": { hangup.node(): 1 } }));
    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 502);
    assert_eq!(reply.header("X-APISIX-Upstream-Status"), Some("502"));
}

#[test]
fn read_timeout_is_504() {
    let slow = Upstream::start("slow", Behaviour::Delay(Duration::from_secs(2)));
    let gw =
        gateway(json!({ "type": "roundrobin", "timeout": short(), "nodes": { slow.node(): 1 } }));
    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 504);
    assert_eq!(reply.header("X-APISIX-Upstream-Status"), Some("504"));
    assert!(
        reply.text().contains("504 Gateway Time-out"),
        "{}",
        reply.text()
    );
}

/// An upstream keep-alive connection keeps one response-head timer across its requests:
/// moved for each, it neither fires early on a request after one that idled past the read
/// timeout in the pool, nor fails to fire on a slow one.
#[test]
fn a_reused_connection_times_out_each_request_on_its_own() {
    let up = Upstream::start("up", Behaviour::DelayPath("slow", Duration::from_secs(2)));
    let gw = gateway_route(json!({
        "id": "r1",
        "uri": "/r/*",
        "upstream": { "type": "roundrobin", "timeout": short(), "nodes": { up.node(): 1 } },
    }));
    for _ in 0..3 {
        assert_eq!(get(gw.addr(), "/r/fast").status, 200);
    }
    // Longer than the read timeout: the timer's last deadline passes while the connection
    // idles in the pool.
    std::thread::sleep(Duration::from_millis(800));
    let started = std::time::Instant::now();
    let reply = get(gw.addr(), "/r/fast");
    assert_eq!(reply.status, 200, "{reply:?}");
    let reply = get(gw.addr(), "/r/slow");
    assert_eq!(reply.status, 504, "{reply:?}");
    assert_eq!(reply.header("X-APISIX-Upstream-Status"), Some("504"));
    assert!(started.elapsed() < Duration::from_millis(1900));
    // The next request opens a new connection (the timed-out one is closed) and is served.
    assert_eq!(get(gw.addr(), "/r/fast").status, 200);
    assert_eq!(up.hits(), 6);
}

#[test]
fn two_timeouts_list_both() {
    let slow1 = Upstream::start("slow1", Behaviour::Delay(Duration::from_secs(2)));
    let slow2 = Upstream::start("slow2", Behaviour::Delay(Duration::from_secs(2)));
    let gw = gateway(json!({
        "type": "roundrobin",
        "timeout": short(),
        "nodes": { slow1.node(): 1, slow2.node(): 1 },
    }));
    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 504);
    assert_eq!(reply.header("X-APISIX-Upstream-Status"), Some("504, 504"));
    assert_eq!((slow1.hits(), slow2.hits()), (1, 1));
}

#[test]
fn route_timeout_replaces_the_upstreams() {
    let slow = Upstream::start("slow", Behaviour::Delay(Duration::from_millis(1500)));
    // The upstream alone would time out ...
    let gw =
        gateway(json!({ "type": "roundrobin", "timeout": short(), "nodes": { slow.node(): 1 } }));
    assert_eq!(get(gw.addr(), "/r").status, 504);
    // ... the route's longer timeout wins over it ...
    let gw = gateway_route(json!({
        "id": "r1",
        "uri": "/r",
        "timeout": { "connect": 5, "send": 5, "read": 10 },
        "upstream": { "type": "roundrobin", "timeout": short(), "nodes": { slow.node(): 1 } },
    }));
    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 200, "{reply:?}");
    // ... and a shorter route timeout cuts the upstream's default of 60 s.
    let gw = gateway_route(json!({
        "id": "r1",
        "uri": "/r",
        "timeout": short(),
        "upstream": { "type": "roundrobin", "nodes": { slow.node(): 1 } },
    }));
    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 504);
    assert_eq!(reply.header("X-APISIX-Upstream-Status"), Some("504"));
}

#[test]
fn route_timeout_replaces_the_services() {
    let slow = Upstream::start("slow", Behaviour::Delay(Duration::from_millis(1500)));
    let doc = json!({
        "services": [{ "id": "s1", "upstream": { "type": "roundrobin", "timeout": short(), "nodes": { slow.node(): 1 } } }],
        "routes": [
            { "id": "plain", "uri": "/plain", "service_id": "s1" },
            { "id": "long", "uri": "/long", "service_id": "s1", "timeout": { "connect": 5, "send": 5, "read": 10 } },
        ],
    });
    let gw = Gateway::start(&doc.to_string());
    assert_eq!(get(gw.addr(), "/plain").status, 504);
    assert_eq!(get(gw.addr(), "/long").status, 200);
}

#[test]
fn retries_zero_disables_retry() {
    let live = Upstream::start("live", Behaviour::Echo);
    let dead = dead_node();
    let gw = gateway(json!({
        "type": "roundrobin",
        "retries": 0,
        "nodes": ordered(&[&dead, &live.node()]),
    }));
    for _ in 0..3 {
        let reply = get(gw.addr(), "/r");
        assert_eq!(reply.status, 502);
        assert_eq!(reply.header("X-APISIX-Upstream-Status"), Some("502"));
    }
    assert_eq!(live.hits(), 0);
}

#[test]
fn explicit_retries_limit_the_tries() {
    let live = Upstream::start("live", Behaviour::Echo);
    let (d1, d2) = (dead_node(), dead_node());
    let gw = gateway(json!({
        "type": "roundrobin",
        "retries": 1,
        "nodes": ordered(&[&d1, &d2, &live.node()]),
    }));
    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 502);
    assert_eq!(reply.header("X-APISIX-Upstream-Status"), Some("502, 502"));
    assert_eq!(live.hits(), 0);
}

#[test]
fn more_retries_than_nodes_tries_each_node_once() {
    let live = Upstream::start("live", Behaviour::Echo);
    let dead = dead_node();
    let gw = gateway(json!({
        "type": "roundrobin",
        "retries": 5,
        "nodes": ordered(&[&dead, &live.node()]),
    }));
    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(live.hits(), 1);

    let (d1, d2) = (dead_node(), dead_node());
    let gw = gateway(json!({ "type": "roundrobin", "retries": 5, "nodes": { d1: 1, d2: 1 } }));
    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 502);
}

#[test]
fn single_node_with_explicit_retries_is_retried_itself() {
    // A one-node upstream skips the balancer on every try, so `retries` repeats that node.
    let slow = Upstream::start("slow", Behaviour::Delay(Duration::from_secs(2)));
    let gw = gateway(
        json!({ "type": "roundrobin", "retries": 1, "timeout": short(), "nodes": { slow.node(): 1 } }),
    );
    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 504);
    assert_eq!(reply.header("X-APISIX-Upstream-Status"), Some("504, 504"));
    assert_eq!(slow.hits(), 2);

    let gw = gateway(json!({ "type": "roundrobin", "retries": 2, "nodes": { dead_node(): 1 } }));
    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 502);
    assert_eq!(
        reply.header("X-APISIX-Upstream-Status"),
        Some("502, 502, 502")
    );
}

#[test]
fn a_lone_refusing_node_is_retried_under_every_balancer() {
    // APISIX's balancer skips the picker for one node except under least_conn, and least_conn
    // then leaves the node untried (`after_balance(ctx, false)`): every balancer retries the
    // lone node `retries` times.
    let mut seen = Vec::new();
    for (kind, extra) in [
        ("roundrobin", json!({})),
        ("chash", json!({ "hash_on": "vars", "key": "remote_addr" })),
        ("least_conn", json!({})),
        ("ewma", json!({})),
    ] {
        let mut up = json!({ "type": kind, "retries": 2, "nodes": { dead_node(): 1 } });
        for (k, v) in extra.as_object().unwrap() {
            up[k] = v.clone();
        }
        let gw = gateway(up);
        let reply = get(gw.addr(), "/r");
        let tries = reply.header("X-APISIX-Upstream-Status").map(str::to_owned);
        seen.push((kind, reply.status, tries));
    }
    let want = Some("502, 502, 502".to_owned());
    assert!(
        seen.iter()
            .all(|(_, status, tries)| *status == 502 && *tries == want),
        "{seen:?}"
    );
}

#[test]
fn every_node_tried_with_tries_left_is_502() {
    // Two timeouts, and retries allow more: the balancer finds no untried node and ends the
    // request with 502 (spec §3.5), where a used-up try budget would answer the last 504.
    let slow1 = Upstream::start("slow1", Behaviour::Delay(Duration::from_secs(2)));
    let slow2 = Upstream::start("slow2", Behaviour::Delay(Duration::from_secs(2)));
    let gw = gateway(json!({
        "type": "roundrobin",
        "retries": 3,
        "timeout": short(),
        "nodes": { slow1.node(): 1, slow2.node(): 1 },
    }));
    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 502, "{reply:?}");
    assert_eq!((slow1.hits(), slow2.hits()), (1, 1));
}

#[test]
fn post_is_not_resent_after_a_timeout_but_get_is() {
    let slow = Upstream::start("slow", Behaviour::Delay(Duration::from_secs(2)));
    let live = Upstream::start("live", Behaviour::Echo);
    let gw = gateway(json!({
        "type": "roundrobin",
        "timeout": short(),
        "nodes": ordered(&[&slow.node(), &live.node()]),
    }));
    let reply = request(gw.addr(), "POST", "/r", &[], b"payload");
    assert_eq!(reply.status, 504);
    assert_eq!(reply.header("X-APISIX-Upstream-Status"), Some("504"));
    assert_eq!(
        live.hits(),
        0,
        "POST was sent to the slow node: not repeated elsewhere"
    );

    let reply = request(gw.addr(), "PATCH", "/r", &[], b"payload");
    assert_eq!(reply.status, 504);
    assert_eq!(live.hits(), 0, "PATCH is not idempotent either");

    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.header("X-Upstream"), Some("live"));
    assert_eq!(reply.header("X-APISIX-Upstream-Status"), None, "504, 200");
    assert_eq!(live.hits(), 1);

    let reply = request(gw.addr(), "PUT", "/r", &[], b"payload");
    assert_eq!(reply.status, 200, "PUT is idempotent: {reply:?}");
    assert_eq!(reply.json()["body"], "payload");
    assert_eq!(live.hits(), 2);
}

#[test]
fn post_is_retried_when_the_connection_was_refused() {
    let live = Upstream::start("live", Behaviour::Echo);
    let dead = dead_node();
    let gw = gateway(json!({ "type": "roundrobin", "nodes": ordered(&[&dead, &live.node()]) }));
    let reply = request(gw.addr(), "POST", "/r", &[], b"sent once");
    assert_eq!(reply.status, 200, "{reply:?}");
    let echo = reply.json();
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["body"], "sent once");
    assert_eq!(live.hits(), 1);
}

#[test]
fn upstream_5xx_answers_are_passed_through_not_retried() {
    for code in [500u16, 503] {
        let failing = Upstream::start("failing", Behaviour::Status(code));
        let live = Upstream::start("live", Behaviour::Echo);
        let gw = gateway(json!({
            "type": "roundrobin",
            "nodes": ordered(&[&failing.node(), &live.node()]),
        }));
        let reply = get(gw.addr(), "/r");
        assert_eq!(reply.status, code);
        assert_eq!(
            reply.header("X-Upstream"),
            Some("failing"),
            "the upstream's own answer"
        );
        let expected = code.to_string();
        assert_eq!(
            reply.header("X-APISIX-Upstream-Status"),
            Some(expected.as_str())
        );
        assert_eq!(live.hits(), 0);
        assert_eq!(failing.hits(), 1);
    }
}

#[test]
fn upstream_4xx_and_2xx_carry_no_status_header() {
    let not_found = Upstream::start("nf", Behaviour::Status(404));
    let gw = gateway(json!({ "type": "roundrobin", "nodes": { not_found.node(): 1 } }));
    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 404);
    assert_eq!(reply.header("X-Upstream"), Some("nf"));
    assert_eq!(reply.header("X-APISIX-Upstream-Status"), None);
}

#[test]
fn retry_after_a_5xx_answer_from_a_retried_try_lists_both() {
    // A refused first node, then a node answering 503: "502, 503", the 503 passed through.
    let failing = Upstream::start("failing", Behaviour::Status(503));
    let dead = dead_node();
    let gw = gateway(json!({ "type": "roundrobin", "nodes": ordered(&[&dead, &failing.node()]) }));
    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 503);
    assert_eq!(reply.header("X-APISIX-Upstream-Status"), Some("502, 503"));
}

#[test]
fn retry_timeout_stops_further_tries() {
    let slow1 = Upstream::start("slow1", Behaviour::Delay(Duration::from_secs(2)));
    let slow2 = Upstream::start("slow2", Behaviour::Delay(Duration::from_secs(2)));
    let live = Upstream::start("live", Behaviour::Echo);
    let nodes = ordered(&[&slow1.node(), &slow2.node(), &live.node()]);

    // Without retry_timeout the third node answers after two timeouts.
    let gw = gateway(json!({ "type": "roundrobin", "timeout": short(), "nodes": nodes }));
    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.header("X-Upstream"), Some("live"));
    assert_eq!((slow1.hits(), slow2.hits(), live.hits()), (1, 1, 1));
    drop(gw);

    // With it, the first try (0.5 s) already outlasts the 0.2 s budget: the retry is refused
    // with 502 (APISIX's balancer exits with 502 once the deadline passed).
    let gw = gateway(json!({
        "type": "roundrobin",
        "timeout": short(),
        "retry_timeout": 0.2,
        "nodes": nodes,
    }));
    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 502, "{reply:?}");
    assert_eq!(
        (slow1.hits(), slow2.hits(), live.hits()),
        (2, 1, 1),
        "no retry was made"
    );
}

#[test]
fn retry_timeout_leaves_fast_failures_alone() {
    let live = Upstream::start("live", Behaviour::Echo);
    let dead = dead_node();
    // A refused connection fails at once, well inside the budget.
    let gw = gateway(json!({
        "type": "roundrobin",
        "retry_timeout": 5,
        "nodes": ordered(&[&dead, &live.node()]),
    }));
    let reply = get(gw.addr(), "/r");
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(live.hits(), 1);
}

/// proxy_read_timeout also bounds the body: an upstream that sends the head and half its body,
/// then stalls, has the client connection cut `read` after its last byte, not held forever;
/// a body that arrives in slow pieces, each within the timeout, goes through whole.
#[test]
fn read_timeout_bounds_a_stalled_body_but_not_a_slow_one() {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let n = s.read(&mut buf).unwrap_or(0);
                let slow = String::from_utf8_lossy(&buf[..n]).contains("/slow");
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345");
                if slow {
                    for b in [b"6", b"7", b"8", b"9", b"0"] {
                        std::thread::sleep(Duration::from_millis(300));
                        let _ = s.write_all(b);
                    }
                }
                std::thread::sleep(Duration::from_secs(30));
            });
        }
    });
    let gw = gateway_route(json!({
        "id": "r1", "uris": ["/stall", "/slow"],
        "timeout": { "connect": 1, "send": 1, "read": 1 },
        "upstream": { "type": "roundrobin", "nodes": { upstream.to_string(): 1 } }
    }));
    let fetch = |path: &str| {
        let mut s = TcpStream::connect(gw.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        let started = std::time::Instant::now();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    if got.ends_with(b"1234567890") {
                        break;
                    }
                }
            }
        }
        (
            String::from_utf8_lossy(&got).into_owned(),
            started.elapsed(),
        )
    };
    let (stalled, took) = fetch("/stall");
    assert!(stalled.starts_with("HTTP/1.1 200"), "{stalled}");
    assert!(stalled.ends_with("12345"), "{stalled}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(10),
        "{took:?}"
    );
    let (slow, took) = fetch("/slow");
    assert!(slow.ends_with("1234567890"), "{slow}");
    assert!(took >= Duration::from_millis(1400), "{took:?}");
}
