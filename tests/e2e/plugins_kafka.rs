//! End-to-end kafka-logger through the binary, against the in-test Kafka broker (Debian
//! packages no Kafka): every request's entry arrives exactly once on the topic with the key,
//! and a broker that accepts connections but never answers leaves the requests untouched.
use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use ferrisix_plugins::log::kafka_logger::test_broker::{broker, Stored};
use serde_json::{json, Value};
use support::*;

#[test]
fn every_request_is_logged_once_on_the_topic() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut b = rt.block_on(broker("access", 2, false));
    let up = Upstream::start("u", Behaviour::Echo);
    let routes = json!({"routes": [{"id": "kl", "uri": "/logged", "plugins": {"kafka-logger": {
        "brokers": [{"host": "127.0.0.1", "port": b.port}], "kafka_topic": "access",
        "key": "gw", "batch_max_size": 5, "inactive_timeout": 1}},
        "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}]});
    let gw = Gateway::start(&routes.to_string());
    for n in 0..23 {
        assert_eq!(get(gw.addr(), &format!("/logged?n={n}")).status, 200);
    }
    let mut seen = Vec::new();
    rt.block_on(async {
        while seen.len() < 23 {
            let r: Stored = tokio::time::timeout(Duration::from_secs(15), b.records.recv())
                .await
                .expect("records in time")
                .unwrap();
            assert_eq!(r.topic, "access");
            assert_eq!(r.key.as_deref(), Some(&b"gw"[..]));
            let batch: Value = serde_json::from_slice(&r.value).unwrap();
            for e in batch.as_array().unwrap() {
                assert_eq!(e["route_id"], "kl");
                assert_eq!(e["response"]["status"], 200);
                seen.push(
                    e["request"]["querystring"]["n"]
                        .as_str()
                        .unwrap()
                        .to_owned(),
                );
            }
        }
        // Nothing more comes.
        let more = tokio::time::timeout(Duration::from_millis(1500), b.records.recv()).await;
        assert!(more.is_err(), "an entry sent twice: {more:?}");
    });
    let distinct: BTreeSet<&String> = seen.iter().collect();
    assert_eq!((seen.len(), distinct.len()), (23, 23), "{seen:?}");
}

#[test]
fn a_hung_broker_leaves_requests_untouched() {
    // Accepts connections and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().flatten() {
            held.push(s);
        }
    });
    let up = Upstream::start("u", Behaviour::Echo);
    let routes = json!({"routes": [
        {"id": "sync", "uri": "/sync", "plugins": {"kafka-logger": {
            "brokers": [{"host": "127.0.0.1", "port": port}], "kafka_topic": "t",
            "producer_type": "sync", "batch_max_size": 1, "timeout": 5}},
         "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}},
        {"id": "async", "uri": "/async", "plugins": {"kafka-logger": {
            "brokers": [{"host": "127.0.0.1", "port": port}], "kafka_topic": "t",
            "batch_max_size": 1, "timeout": 5}},
         "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}]});
    let gw = Gateway::start(&routes.to_string());
    // Each broker call waits its 5 s timeout; the requests do not.
    for n in 0..50 {
        for path in ["/sync", "/async"] {
            let r = request(gw.addr(), "GET", &format!("{path}?n={n}"), &[], b"");
            assert_eq!(r.status, 200, "{path}");
        }
    }
}
