//! End-to-end limit-req and limit-conn: the leaky bucket rejects an immediate second request,
//! limit-conn rejects a concurrent request while one is in flight and admits again once it is
//! over, including after a client went away mid-request.
mod support;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

fn route(id: &str, uri: &str, up: &Upstream, plugins: Value) -> Value {
    json!({"id": id, "uri": uri, "plugins": plugins,
        "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}})
}

#[test]
fn limit_req_rejects_immediate_second_request() {
    let up = Upstream::start("u", Behaviour::Echo);
    let gw = Gateway::start_with(
        &json!({"routes": [
            route("1", "/r", &up, json!({"limit-req": {"rate": 1, "burst": 0, "key": "remote_addr"}})),
            route("2", "/m", &up, json!({"limit-req": {"rate": 1, "burst": 0, "key": "remote_addr",
                "rejected_code": 429, "rejected_msg": "too many"}}))
        ]})
        .to_string(),
        "",
    );
    assert_eq!(get(gw.addr(), "/r").status, 200);
    let r = get(gw.addr(), "/r");
    assert_eq!(r.status, 503);
    assert!(r.text().contains("503 Service Temporarily Unavailable"));
    assert_eq!(
        up.hits(),
        1,
        "the rejected request never reached the upstream"
    );
    assert_eq!(get(gw.addr(), "/m").status, 200);
    let r = get(gw.addr(), "/m");
    assert_eq!(r.status, 429);
    assert_eq!(r.text(), "{\"error_msg\":\"too many\"}\n");
    // One second later the bucket has leaked one request.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(get(gw.addr(), "/r").status, 200);
}

#[test]
fn limit_conn_rejects_concurrent_request_until_first_finishes() {
    let up = Upstream::start("slow", Behaviour::Delay(Duration::from_millis(800)));
    let gw = Gateway::start_with(
        &json!({"routes": [route("1", "/c", &up, json!({"limit-conn": {
            "conn": 1, "burst": 0, "default_conn_delay": 0.1, "key": "remote_addr"}}))]})
        .to_string(),
        "",
    );
    let addr = gw.addr();
    let first = std::thread::spawn(move || get(addr, "/c").status);
    assert!(
        poll_until(Duration::from_secs(5), || up.hits() == 1).is_some(),
        "the first request reached the upstream"
    );
    let r = get(addr, "/c");
    assert_eq!(r.status, 503);
    assert_eq!(first.join().unwrap(), 200);
    assert_eq!(get(addr, "/c").status, 200, "the count went back down");

    // A client that goes away while its request is in flight does not leak its slot.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /c HTTP/1.1\r\nHost: test.local\r\n\r\n")
        .unwrap();
    let hits = up.hits();
    assert!(poll_until(Duration::from_secs(5), || up.hits() == hits + 1).is_some());
    drop(s);
    assert!(
        poll_until(Duration::from_secs(5), || get(addr, "/c").status == 200).is_some(),
        "the abandoned request's slot is released"
    );
    // And released once only: still exactly one slot.
    let addr2 = gw.addr();
    let slow = std::thread::spawn(move || get(addr2, "/c").status);
    let hits = up.hits();
    assert!(poll_until(Duration::from_secs(5), || up.hits() == hits + 1).is_some());
    assert_eq!(get(addr, "/c").status, 503);
    assert_eq!(slow.join().unwrap(), 200);
}
