//! End-to-end zipkin through the binary, against a Zipkin collector decoding the v2 JSON: the
//! request continues the client's B3 trace, the upstream is sent the proxy span's context, and
//! the three spans of span version 2 carry APISIX's names, parents, tags, endpoints and the
//! request's timing.
use crate::support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use support::*;

/// Decodes the JSON body of every POST it gets and hands the spans over.
fn collector() -> (String, mpsc::Receiver<(String, Value)>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 16384];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match s.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    while buf.len() < end + 4 + len {
                        match s.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body: Vec<u8> = buf.drain(..end + 4 + len).skip(end + 4).collect();
                    let _ = tx.send((head, serde_json::from_slice(&body).unwrap()));
                    if s.write_all(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (addr, rx)
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

#[test]
fn b3_traces_continue_upstream_and_spans_reach_the_collector() {
    let (collector, spans) = collector();
    let up = Upstream::start("u", Behaviour::Delay(Duration::from_millis(30)));
    let routes = json!({"routes": [{"id": "zk1", "uri": "/traced", "plugins": {"zipkin": {
        "endpoint": format!("http://{collector}/api/v2/spans"), "sample_ratio": 1,
        "service_name": "edge"}},
        "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}]});
    let gw = Gateway::start(&routes.to_string());
    let trace = "80f198ee56343ba864fe8b2a57d3eff7";
    let before = now_us();
    let r = request(
        gw.addr(),
        "GET",
        "/traced?k=v",
        &[("b3", &format!("{trace}-e457b5a2e4d86bd1-1"))],
        b"",
    );
    let after = now_us();
    assert_eq!(r.status, 200);
    let sent = &r.json()["headers"];
    assert_eq!(sent["x-b3-traceid"], trace);
    assert_eq!(sent["x-b3-sampled"], "1");
    assert!(
        sent.get("b3").is_none(),
        "b3 is not passed upstream: {sent}"
    );
    // One batch, after the reporter's 5 s of inactivity.
    let (head, body) = spans
        .recv_timeout(Duration::from_secs(15))
        .expect("spans at the collector");
    assert!(head.starts_with("post /api/v2/spans "), "{head}");
    assert!(head.contains("content-type: application/json"), "{head}");
    let spans = body.as_array().unwrap();
    let by_name = |n: &str| {
        spans
            .iter()
            .find(|s| s["name"] == n)
            .unwrap_or_else(|| panic!("no {n} in {spans:?}"))
    };
    let (request, proxy, response) = (
        by_name("apisix.request"),
        by_name("apisix.proxy"),
        by_name("apisix.response_span"),
    );
    assert_eq!(spans.len(), 3);
    assert_eq!(request["parentId"], "e457b5a2e4d86bd1");
    assert_eq!(proxy["parentId"], request["id"]);
    assert_eq!(response["parentId"], request["id"]);
    assert_eq!(sent["x-b3-spanid"], proxy["id"]);
    assert_eq!(sent["x-b3-parentspanid"], request["id"]);
    assert_eq!(request["kind"], "SERVER");
    assert_eq!(request["tags"]["http.url"], "/traced?k=v");
    assert_eq!(request["tags"]["http.method"], "GET");
    assert_eq!(request["tags"]["http.status_code"], "200");
    assert_eq!(request["tags"]["apisix.response_source"], "upstream");
    assert_eq!(request["remoteEndpoint"]["ipv4"], "127.0.0.1");
    assert_eq!(
        request["localEndpoint"],
        json!({"serviceName": "edge", "ipv4": "127.0.0.1", "port": gw.addr().port()})
    );
    let ts = |s: &Value| s["timestamp"].as_u64().unwrap();
    let dur = |s: &Value| s["duration"].as_u64().unwrap();
    assert!(before <= ts(request) && ts(request) + dur(request) <= after);
    // The upstream took 30 ms, inside the proxy span.
    assert!(dur(proxy) >= 30_000, "{proxy}");
    assert!(ts(proxy) + dur(proxy) <= ts(response));
}
