//! End-to-end request and response headers (spec data-plane §3.1-§3.3): forwarded headers, real
//! IP, hop-by-hop headers, `pass_host`, the `Server` header, and method/query/body forwarding.
use crate::support;

use serde_json::{json, Value};
use support::*;

const SERVER: &str = concat!("ferrisix/", env!("CARGO_PKG_VERSION"));

/// A gateway with route `/*` to one echo upstream; `upstream` fields are merged into the
/// upstream object.
fn setup(upstream_extra: Value) -> (Gateway, Upstream) {
    let up = Upstream::start("echo", Behaviour::Echo);
    let mut upstream = json!({ "type": "roundrobin", "nodes": { up.node(): 1 } });
    for (k, v) in upstream_extra.as_object().unwrap() {
        upstream[k] = v.clone();
    }
    let doc = json!({ "routes": [{ "id": "r1", "uri": "/*", "upstream": upstream }] });
    (Gateway::start(&doc.to_string()), up)
}

/// The headers the upstream received.
fn upstream_headers(reply: &Reply) -> serde_json::Map<String, Value> {
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.json()["headers"].as_object().unwrap().clone()
}

fn h<'a>(headers: &'a serde_json::Map<String, Value>, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(Value::as_str)
}

#[test]
fn forwarded_headers() {
    let (gw, _up) = setup(json!({}));
    let port = gw.port.to_string();
    let reply = request(gw.addr(), "GET", "/fwd", &[("Host", "Shop.Example")], b"");
    let hs = upstream_headers(&reply);
    assert_eq!(h(&hs, "x-real-ip"), Some("127.0.0.1"));
    assert_eq!(h(&hs, "x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(h(&hs, "x-forwarded-proto"), Some("http"));
    assert_eq!(
        h(&hs, "x-forwarded-host"),
        Some("Shop.Example"),
        "client Host verbatim"
    );
    assert_eq!(
        h(&hs, "x-forwarded-port"),
        Some(port.as_str()),
        "no port in Host: the server port"
    );

    // With a port in Host, X-Forwarded-Host keeps it and X-Forwarded-Port takes it.
    let reply = request(
        gw.addr(),
        "GET",
        "/fwd",
        &[("Host", "shop.example:8443")],
        b"",
    );
    let hs = upstream_headers(&reply);
    assert_eq!(h(&hs, "x-forwarded-host"), Some("shop.example:8443"));
    assert_eq!(h(&hs, "x-forwarded-port"), Some("8443"));
}

#[test]
fn client_forwarded_values_are_replaced_but_xff_is_appended_to() {
    let (gw, _up) = setup(json!({}));
    let reply = request(
        gw.addr(),
        "GET",
        "/fwd",
        &[
            ("X-Forwarded-For", "1.1.1.1, 2.2.2.2"),
            ("X-Forwarded-Proto", "https"),
            ("X-Forwarded-Host", "spoofed.example"),
            ("X-Forwarded-Port", "1"),
            ("Forwarded", "for=9.9.9.9"),
        ],
        b"",
    );
    let hs = upstream_headers(&reply);
    assert_eq!(
        h(&hs, "x-forwarded-for"),
        Some("1.1.1.1, 2.2.2.2, 127.0.0.1")
    );
    assert_eq!(h(&hs, "x-forwarded-proto"), Some("http"));
    assert_eq!(h(&hs, "x-forwarded-host"), Some("test.local"));
    assert_eq!(
        h(&hs, "x-forwarded-port"),
        Some(gw.port.to_string().as_str())
    );
    assert_eq!(
        h(&hs, "forwarded"),
        None,
        "dropped from untrusted clients (3.18)"
    );
}

#[test]
fn x_real_ip_from_a_trusted_peer_sets_the_client_address() {
    let (gw, _up) = setup(json!({}));
    let reply = request(gw.addr(), "GET", "/ip", &[("X-Real-IP", "10.9.8.7")], b"");
    let hs = upstream_headers(&reply);
    assert_eq!(h(&hs, "x-real-ip"), Some("10.9.8.7"));
    assert_eq!(h(&hs, "x-forwarded-for"), Some("10.9.8.7"));

    let reply = request(
        gw.addr(),
        "GET",
        "/ip",
        &[("X-Real-IP", "10.9.8.7"), ("X-Forwarded-For", "1.1.1.1")],
        b"",
    );
    let hs = upstream_headers(&reply);
    assert_eq!(h(&hs, "x-forwarded-for"), Some("1.1.1.1, 10.9.8.7"));

    // Not an address: the peer's own address stays.
    let reply = request(gw.addr(), "GET", "/ip", &[("X-Real-IP", "not-an-ip")], b"");
    assert_eq!(h(&upstream_headers(&reply), "x-real-ip"), Some("127.0.0.1"));
}

#[test]
fn hop_by_hop_headers_are_not_forwarded_without_websocket() {
    let (gw, _up) = setup(json!({}));
    let raw = "GET /hop HTTP/1.1\r\nHost: test.local\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\
               TE: trailers\r\nUpgrade: websocket\r\nProxy-Connection: keep-alive\r\nExpect: 100-continue\r\n\
               X-Custom: one\r\nCookie: a=1; b=2\r\nUser-Agent: e2e-agent/1.0\r\nAuthorization: Bearer t0k\r\n\r\n";
    let reply = request_raw(gw.addr(), raw.as_bytes());
    let hs = upstream_headers(&reply);
    for dropped in [
        "connection",
        "keep-alive",
        "te",
        "upgrade",
        "proxy-connection",
        "expect",
    ] {
        assert_eq!(
            h(&hs, dropped),
            None,
            "{dropped} reached the upstream: {hs:?}"
        );
    }
    assert_eq!(h(&hs, "x-custom"), Some("one"));
    assert_eq!(h(&hs, "cookie"), Some("a=1; b=2"));
    assert_eq!(h(&hs, "user-agent"), Some("e2e-agent/1.0"));
    assert_eq!(h(&hs, "authorization"), Some("Bearer t0k"));
}

#[test]
fn pass_host_pass_sends_the_client_host_verbatim() {
    let (gw, _up) = setup(json!({ "pass_host": "pass" }));
    let reply = request(
        gw.addr(),
        "GET",
        "/h",
        &[("Host", "Mixed.Case.Example:8080")],
        b"",
    );
    assert_eq!(
        h(&upstream_headers(&reply), "host"),
        Some("Mixed.Case.Example:8080")
    );
    // Default is pass.
    let (gw, _up) = setup(json!({}));
    let reply = request(gw.addr(), "GET", "/h", &[("Host", "Other.Example")], b"");
    assert_eq!(h(&upstream_headers(&reply), "host"), Some("Other.Example"));
}

#[test]
fn pass_host_node_sends_the_node_address() {
    let (gw, up) = setup(json!({ "pass_host": "node" }));
    let reply = request(gw.addr(), "GET", "/h", &[("Host", "client.example")], b"");
    let expected = up.node();
    assert_eq!(
        h(&upstream_headers(&reply), "host"),
        Some(expected.as_str())
    );
}

#[test]
fn pass_host_node_follows_the_retried_node() {
    let up = Upstream::start("echo", Behaviour::Echo);
    let dead = dead_node();
    let (dead_host, dead_port) = dead.rsplit_once(':').unwrap();
    let doc = json!({ "routes": [{ "id": "r1", "uri": "/*", "upstream": {
        "pass_host": "node",
        "nodes": [
            { "host": dead_host, "port": dead_port.parse::<u16>().unwrap(), "weight": 1, "priority": 1 },
            { "host": "127.0.0.1", "port": up.addr.port(), "weight": 1, "priority": 0 },
        ],
    }}]});
    let gw = Gateway::start(&doc.to_string());
    let reply = get(gw.addr(), "/h");
    let expected = up.node();
    assert_eq!(
        h(&upstream_headers(&reply), "host"),
        Some(expected.as_str())
    );
}

#[test]
fn pass_host_rewrite_sends_upstream_host() {
    let (gw, _up) = setup(json!({ "pass_host": "rewrite", "upstream_host": "rewritten.example" }));
    let reply = request(gw.addr(), "GET", "/h", &[("Host", "client.example")], b"");
    let hs = upstream_headers(&reply);
    assert_eq!(h(&hs, "host"), Some("rewritten.example"));
    assert_eq!(
        h(&hs, "x-forwarded-host"),
        Some("client.example"),
        "still the client's"
    );
}

#[test]
fn server_header_replaces_the_upstreams() {
    let (gw, _up) = setup(json!({}));
    let reply = get(gw.addr(), "/s");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("Server"), Some(SERVER));
    assert_eq!(
        reply
            .headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("server"))
            .count(),
        1
    );
    // Other upstream headers are relayed.
    assert_eq!(reply.header("X-Upstream"), Some("echo"));
    assert_eq!(reply.header("Content-Type"), Some("application/json"));

    let failing = Upstream::start("failing", Behaviour::Status(503));
    let doc = json!({ "routes": [{ "id": "r1", "uri": "/*", "upstream": { "nodes": { failing.node(): 1 } } }] });
    let gw = Gateway::start(&doc.to_string());
    let reply = get(gw.addr(), "/s");
    assert_eq!(reply.status, 503);
    assert_eq!(reply.header("Server"), Some(SERVER));
}

#[test]
fn server_tokens_off_hides_the_version() {
    let up = Upstream::start("echo", Behaviour::Echo);
    let doc = json!({ "routes": [{ "id": "r1", "uri": "/s", "upstream": { "nodes": { up.node(): 1 } } }] });
    let gw = Gateway::start_full(&doc.to_string(), "enable_server_tokens: false", "");
    let reply = get(gw.addr(), "/s");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("Server"), Some("ferrisix"));
    let reply = get(gw.addr(), "/missing");
    assert_eq!(reply.status, 404);
    assert_eq!(reply.header("Server"), Some("ferrisix"));
}

#[test]
fn method_query_and_body_are_forwarded_unchanged() {
    let (gw, up) = setup(json!({}));
    for method in ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
        let body: &[u8] = if method == "GET" {
            b""
        } else {
            b"{\"k\":\"v\"}"
        };
        let reply = request(
            gw.addr(),
            method,
            "/items/1?b=2&a=1&e=%20x&e=y",
            &[("Content-Type", "application/json")],
            body,
        );
        assert_eq!(reply.status, 200, "{method}: {reply:?}");
        let echo = reply.json();
        assert_eq!(echo["method"], method);
        assert_eq!(echo["path"], "/items/1?b=2&a=1&e=%20x&e=y");
        assert_eq!(echo["body"], String::from_utf8_lossy(body).as_ref());
        assert_eq!(echo["body_len"], body.len());
        assert_eq!(echo["headers"]["content-type"], "application/json");
    }
    assert_eq!(up.hits(), 6);
}

#[test]
fn head_request_is_forwarded_as_head() {
    let (gw, up) = setup(json!({}));
    let reply = request(gw.addr(), "HEAD", "/head", &[], b"");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, b"");
    assert_eq!(up.hits(), 1);
}

#[test]
fn chunked_request_body_is_forwarded() {
    let (gw, _up) = setup(json!({}));
    let raw = "POST /chunked HTTP/1.1\r\nHost: test.local\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
               5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
    let reply = request_raw(gw.addr(), raw.as_bytes());
    assert_eq!(reply.status, 200, "{reply:?}");
    let echo = reply.json();
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["body"], "hello world");
    assert_eq!(echo["body_len"], 11);
    // nginx reads a small chunked body whole and sends it with Content-Length (spec §3.1).
    assert_eq!(echo["headers"]["content-length"], "11");
    assert!(echo["headers"].get("transfer-encoding").is_none(), "{echo}");
}

#[test]
fn large_body_is_forwarded_whole() {
    let (gw, _up) = setup(json!({}));
    let body = vec![b'x'; 300 * 1024];
    let reply = request(gw.addr(), "POST", "/big", &[], &body);
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["body_len"], body.len());
}

/// A gateway whose access log has `log_keys` (`nginx_config.http` lines), with route `uri` to
/// an echo upstream.
fn logging_gateway(uri: &str, log_keys: &str) -> (Gateway, Upstream) {
    let up = Upstream::start("echo", Behaviour::Echo);
    let doc = json!({ "routes": [{ "id": "r1", "uri": uri,
        "upstream": { "type": "roundrobin", "nodes": { up.node(): 1 } } }] });
    (
        Gateway::start_tuned(&doc.to_string(), "", "", 1, log_keys),
        up,
    )
}

/// The access log once it holds `lines` lines (it is flushed within a second).
fn access_log_lines(gw: &Gateway, lines: usize) -> String {
    let log = access_log(gw);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.lines().count() >= lines {
            return text;
        }
        assert!(std::time::Instant::now() < deadline, "access log: {text:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// nginx's `$request_length` in the access log: request line, headers and body, for a
/// proxied request and for one no route matches (it was the body's length alone, and 0 for
/// what was not proxied).
#[test]
fn the_access_log_request_length_counts_line_headers_and_body() {
    let (gw, _up) = logging_gateway(
        "/len",
        "access_log_format: \"$request_uri $request_length\"",
    );
    let raw = |head: &str| {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(gw.addr()).unwrap();
        s.write_all(head.as_bytes()).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        assert!(
            out.starts_with(b"HTTP/1.1 "),
            "{}",
            String::from_utf8_lossy(&out)
        );
    };
    let post = "POST /len HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc";
    raw(post);
    let miss = "GET /nowhere?a=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    raw(miss);
    let text = access_log_lines(&gw, 2);
    // Each head as sent, with the body: the lengths of what the client wrote.
    assert!(text.contains(&format!("/len {}\n", post.len())), "{text}");
    assert!(
        text.contains(&format!("/nowhere?a=1 {}\n", miss.len())),
        "{text}"
    );
}

/// `access_log_format_escape` reaches the log: with `json` a quote in a header is `\"` and a
/// variable without a value is empty (nginx's `escape=json`).
#[test]
fn the_access_log_escapes_values_as_configured() {
    let (gw, _up) = logging_gateway(
        "/esc",
        "access_log_format: \"{\\\"ua\\\":\\\"$http_user_agent\\\",\\\"user\\\":\\\"$remote_user\\\"}\"\naccess_log_format_escape: json",
    );
    let reply = request(gw.addr(), "GET", "/esc", &[("User-Agent", "a\"b\\c")], b"");
    assert_eq!(reply.status, 200);
    let text = access_log_lines(&gw, 1);
    let line: Value = serde_json::from_str(text.lines().next().unwrap()).expect("a JSON line");
    assert_eq!(line["ua"], "a\"b\\c");
    assert_eq!(line["user"], "");
}
