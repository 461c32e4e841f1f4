//! End-to-end skywalking, lago and rocketmq-logger through the binary: an in-test SkyWalking
//! OAP decoding the segments and instance reports the gateway POSTs, an in-test Lago checking
//! the bearer token and the batches of usage events, and the in-test RocketMQ nameserver and
//! broker (Apache RocketMQ is Java; Debian packages none) checking the frames, the ACL
//! signature included.
use crate::support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::Duration;

use base64::Engine;
use ferrisix_plugins::log::rocketmq_logger::test_broker::{cluster, Sent};
use serde_json::{json, Value};
use support::*;

/// One request an in-test HTTP server got: the request line and headers (lower case) and
/// the JSON body.
#[derive(Debug)]
struct Got {
    head: String,
    body: Value,
}

impl Got {
    fn path(&self) -> &str {
        self.head.split(' ').nth(1).unwrap_or("")
    }
}

/// An HTTP server decoding every request's JSON body, answering with `status(head)`.
fn json_server(status: fn(&str) -> u16) -> (String, mpsc::Receiver<Got>) {
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
                    let code = status(&head);
                    let _ = tx.send(Got {
                        head,
                        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
                    });
                    let reply = format!("HTTP/1.1 {code} X\r\ncontent-length: 2\r\n\r\n{{}}");
                    if s.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, rx)
}

/// config.yaml's `plugin_attr` with `skywalking` (YAML lines under it) and the prometheus
/// export on a free port (the harness picks one only when the test sets no `plugin_attr`).
fn plugin_attr(skywalking: &str) -> String {
    format!(
        "plugin_attr:\n  prometheus:\n    export_addr:\n      ip: 127.0.0.1\n      port: {}\n  skywalking:\n{skywalking}",
        free_port()
    )
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn unb64(s: &str) -> String {
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(s).unwrap()).unwrap()
}

/// The next request whose path starts with `prefix` (others are skipped).
fn next_at(rx: &mpsc::Receiver<Got>, prefix: &str) -> Got {
    loop {
        let got = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("a request to {prefix} in time"));
        if got.path().starts_with(prefix) {
            return got;
        }
    }
}

#[test]
fn skywalking_continues_the_callers_trace_and_reports_to_the_oap() {
    // SkyWalking's OAP receiver: 200 for its three endpoints.
    fn oap(head: &str) -> u16 {
        let known = [
            "/v3/segments",
            "/v3/management/reportProperties",
            "/v3/management/keepAlive",
        ]
        .iter()
        .any(|p| head.starts_with(&format!("post {} ", p.to_lowercase())));
        if known && head.contains("content-type: application/json") {
            200
        } else {
            404
        }
    }
    let (oap_addr, got) = json_server(oap);
    let up = Upstream::start("u", Behaviour::Echo);
    let failing = Upstream::start("f", Behaviour::Status(503));
    let routes = json!({"routes": [
        {"id": "sw", "uri": "/traced", "plugins": {"skywalking": {"sample_ratio": 1}},
         "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}},
        {"id": "sw-fail", "uri": "/failing", "plugins": {"skywalking": {}},
         "upstream": {"type": "roundrobin", "nodes": {failing.node(): 1}}}]});
    let gw = Gateway::start_with(
        &routes.to_string(),
        &plugin_attr(&format!(
            "    endpoint_addr: http://{oap_addr}\n    service_name: edge\n    service_instance_name: edge-1\n    report_interval: 1\n"
        )),
    );
    let sw8 = format!(
        "1-{}-{}-3-{}-{}-{}-{}",
        b64("trace.caller.1"),
        b64("segment.caller.1"),
        b64("caller"),
        b64("caller-1"),
        b64("/checkout"),
        b64("gw:9080")
    );
    let r = request(gw.addr(), "GET", "/traced?k=v", &[("sw8", &sw8)], b"");
    assert_eq!(r.status, 200);
    let sent = r.json()["headers"]["sw8"].as_str().unwrap().to_owned();
    let parts: Vec<&str> = sent.split('-').collect();
    assert_eq!(parts.len(), 8, "{sent}");
    assert_eq!(unb64(parts[1]), "trace.caller.1", "the trace continues");
    assert_eq!(parts[3], "1", "the exit span");
    assert_eq!(unb64(parts[4]), "edge");
    assert_eq!(unb64(parts[5]), "edge-1");
    assert_eq!(unb64(parts[6]), "/traced");
    assert_eq!(unb64(parts[7]), "upstream service");
    let segment_id = unb64(parts[2]);
    assert_eq!(request(gw.addr(), "GET", "/failing", &[], b"").status, 503);

    // Everything the OAP gets until both segments and a keep-alive arrived, in order.
    let mut all = Vec::new();
    let mut segments = Vec::new();
    while segments.len() < 2
        || !all
            .iter()
            .any(|g: &Got| g.path() == "/v3/management/keepalive")
    {
        let one = got
            .recv_timeout(Duration::from_secs(20))
            .expect("the OAP's requests in time");
        if one.path() == "/v3/segments" {
            segments.extend(one.body.as_array().unwrap().iter().cloned());
        }
        all.push(one);
    }
    let traced = segments
        .iter()
        .find(|s| s["traceSegmentId"] == segment_id.as_str())
        .expect("the first request's segment");
    assert_eq!(traced["traceId"], "trace.caller.1");
    assert_eq!(traced["service"], "edge");
    assert_eq!(traced["serviceInstance"], "edge-1");
    let (exit, entry) = (&traced["spans"][0], &traced["spans"][1]);
    assert_eq!(entry["spanType"], "Entry");
    assert_eq!(entry["spanId"], 0);
    assert_eq!(entry["parentSpanId"], -1);
    assert_eq!(entry["operationName"], "/traced");
    assert_eq!(entry["componentId"], 6002);
    assert_eq!(entry["spanLayer"], "Http");
    assert_eq!(entry["isError"], false);
    assert_eq!(
        entry["refs"],
        json!([{"refType": "CrossProcess", "traceId": "trace.caller.1",
            "parentTraceSegmentId": "segment.caller.1", "parentSpanId": 3,
            "parentService": "caller", "parentServiceInstance": "caller-1",
            "parentEndpoint": "/checkout", "networkAddressUsedAtPeer": "gw:9080"}])
    );
    let tags = entry["tags"].as_array().unwrap();
    assert_eq!(tags[0], json!({"key": "http.method", "value": "GET"}));
    assert_eq!(tags[1]["key"], "http.params");
    assert!(
        tags[1]["value"].as_str().unwrap().ends_with("/traced?k=v"),
        "{tags:?}"
    );
    assert_eq!(tags[2], json!({"key": "http.status_code", "value": "200"}));
    assert_eq!(exit["spanType"], "Exit");
    assert_eq!(exit["spanId"], 1);
    assert_eq!(exit["parentSpanId"], 0);
    assert_eq!(exit["peer"], "upstream service");
    assert_eq!(
        exit["tags"],
        json!([{"key": "http.status_code", "value": 200}])
    );

    let failed = segments
        .iter()
        .find(|s| s["spans"][1]["operationName"] == "/failing")
        .expect("the failing request's segment");
    assert_eq!(failed["traceId"], failed["traceSegmentId"], "a new trace");
    assert!(failed["spans"][1].get("refs").is_none());
    assert_eq!(failed["spans"][1]["isError"], true);
    assert_eq!(
        failed["spans"][0]["tags"],
        json!([{"key": "http.status_code", "value": 503}])
    );

    // The instance: its properties first, then keep-alives.
    let management: Vec<&Got> = all
        .iter()
        .filter(|g| g.path().starts_with("/v3/management/"))
        .collect();
    assert_eq!(management[0].path(), "/v3/management/reportproperties");
    assert_eq!(
        management[0].body,
        json!({"service": "edge", "serviceInstance": "edge-1",
            "properties": [{"key": "language", "value": "lua"}]})
    );
    let ping = management.last().unwrap();
    assert_eq!(ping.path(), "/v3/management/keepalive");
    assert_eq!(
        ping.body,
        json!({"service": "edge", "serviceInstance": "edge-1"})
    );
}

#[test]
fn skywalking_leaves_unsampled_requests_alone() {
    let (oap_addr, got) = json_server(|_| 200);
    let up = Upstream::start("u", Behaviour::Echo);
    let routes = json!({"routes": [
        {"id": "sw", "uri": "/rare", "plugins": {"skywalking": {"sample_ratio": 0.00001}},
         "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}]});
    let gw = Gateway::start_with(
        &routes.to_string(),
        &plugin_attr(&format!(
            "    endpoint_addr: http://{oap_addr}\n    report_interval: 1\n"
        )),
    );
    let r = request(gw.addr(), "GET", "/rare", &[("sw8", "1-a-b-c")], b"");
    assert_eq!(r.status, 200);
    // Not sampled (one in 100000): the client's header passes as it came.
    assert_eq!(r.json()["headers"]["sw8"], "1-a-b-c");
    assert!(got.recv_timeout(Duration::from_secs(3)).is_err());
}

#[test]
fn lago_batches_usage_events_with_the_bearer_token() {
    fn lago(head: &str) -> u16 {
        if !head.starts_with("post /api/v1/events/batch ") {
            404
        } else if head.contains("authorization: bearer lago-key") {
            200
        } else {
            401
        }
    }
    let (lago_addr, got) = json_server(lago);
    let up = Upstream::start("u", Behaviour::Echo);
    let routes = json!({"routes": [{"id": "billed", "uri": "/billed", "plugins": {"lago": {
        "endpoint_addrs": [format!("http://{lago_addr}")], "token": "lago-key",
        "event_transaction_id": "tx_${http_x_txn}", "event_subscription_id": "sub_$arg_customer",
        "event_code": "api_calls", "event_properties": {"status": "$status", "plan": "pro"},
        "batch_max_size": 3, "inactive_timeout": 1, "ssl_verify": false}},
        "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}},
        {"id": "wrong", "uri": "/wrong", "plugins": {"lago": {
        "endpoint_addrs": [format!("http://{lago_addr}")], "token": "other",
        "event_transaction_id": "x", "event_subscription_id": "y", "event_code": "z",
        "batch_max_size": 1}},
        "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}]});
    let gw = Gateway::start(&routes.to_string());
    for n in 0..3 {
        let txn = format!("t{n}");
        let r = request(
            gw.addr(),
            "GET",
            &format!("/billed?customer=c{n}"),
            &[("x-txn", &txn)],
            b"",
        );
        assert_eq!(r.status, 200);
    }
    let batch = next_at(&got, "/api/v1/events/batch");
    assert!(batch.head.contains("authorization: bearer lago-key"));
    assert!(batch.head.contains("content-type: application/json"));
    let events = batch.body["events"].as_array().unwrap();
    assert_eq!(events.len(), 3, "{events:?}");
    for (n, e) in events.iter().enumerate() {
        assert_eq!(e["transaction_id"], format!("tx_t{n}"));
        assert_eq!(e["external_subscription_id"], format!("sub_c{n}"));
        assert_eq!(e["code"], "api_calls");
        assert_eq!(e["properties"], json!({"status": "200", "plan": "pro"}));
        assert!(e["timestamp"].as_f64().unwrap() > 1.6e9);
    }
    // A wrong token is refused by Lago; the request is served all the same.
    assert_eq!(request(gw.addr(), "GET", "/wrong", &[], b"").status, 200);
    let refused = next_at(&got, "/api/v1/events/batch");
    assert!(refused.head.contains("authorization: bearer other"));
    assert_eq!(refused.body["events"][0]["code"], "z");
}

#[test]
fn rocketmq_logger_sends_signed_messages_to_the_topic() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut mq = rt.block_on(cluster("access", 4, Some(("ak1", "sk1"))));
    let up = Upstream::start("u", Behaviour::Echo);
    let routes = json!({"routes": [{"id": "rmq", "uri": "/logged", "plugins": {"rocketmq-logger": {
        "nameserver_list": [format!("127.0.0.1:{}", mq.nameserver_port)], "topic": "access",
        "key": "gw-key", "tag": "gw-tag", "access_key": "ak1", "secret_key": "sk1",
        "batch_max_size": 2, "inactive_timeout": 1,
        "log_format": {"uri": "$uri", "n": "$arg_n", "status": "$status"}}},
        "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}]});
    let gw = Gateway::start(&routes.to_string());
    for n in 0..4 {
        assert_eq!(get(gw.addr(), &format!("/logged?n={n}")).status, 200);
    }
    let mut seen = Vec::new();
    let mut queues = Vec::new();
    rt.block_on(async {
        while seen.len() < 4 {
            let m: Sent = tokio::time::timeout(Duration::from_secs(15), mq.sent.recv())
                .await
                .expect("messages in time")
                .unwrap();
            assert_eq!(m.topic, "access");
            assert_eq!(m.keys.as_deref(), Some("gw-key"));
            assert_eq!(m.tags.as_deref(), Some("gw-tag"));
            assert_eq!(m.producer_group, "apisixLogProducer");
            assert_eq!(m.access_key.as_deref(), Some("ak1"));
            assert_eq!(m.signature_ok, Some(true));
            queues.push(m.queue_id);
            let batch: Value = serde_json::from_slice(&m.body).unwrap();
            for e in batch.as_array().unwrap() {
                assert_eq!(e["uri"], "/logged");
                assert_eq!(e["status"], "200");
                seen.push(e["n"].as_str().unwrap().to_owned());
            }
        }
    });
    seen.sort();
    assert_eq!(seen, ["0", "1", "2", "3"]);
    assert_ne!(queues[0], queues[1], "queues in turn: {queues:?}");
    // Batches sent together may each ask for the route; never more than one a batch.
    assert!((1..=2).contains(&mq.route_queries()));
}
