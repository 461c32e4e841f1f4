//! End-to-end HTTP/3: a real ferrisix with `enable_http3` on its ssl listener, driven by
//! aioquic (PyPI), a real QUIC and HTTP/3 client (`tests/e2e/http3_client.py`; Debian's curl is
//! built without HTTP/3), with certificates from tests/data/tls. The same routes are asked over
//! HTTP/1.1 where the answer must be the same.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{free_port, Behaviour, Gateway, Upstream};

const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/http3_client.py");

fn cert_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tls")
}

fn pem(name: &str) -> String {
    std::fs::read_to_string(cert_dir().join(name)).unwrap()
}

fn block(text: &str, indent: usize) -> String {
    let pad = " ".repeat(indent);
    let mut out = String::from("|\n");
    for line in text.lines() {
        out.push_str(&pad);
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn ssl_yaml(id: &str, sni: &str, cert: &str, key: &str) -> String {
    format!(
        "  - id: \"{id}\"\n    sni: \"{sni}\"\n    cert: {}    key: {}",
        block(&pem(cert), 6),
        block(&pem(key), 6)
    )
}

fn ssls() -> String {
    ssl_yaml("1", "server.local", "server.crt", "server.key")
        + &ssl_yaml("2", "other.local", "other.crt", "other.key")
}

fn route(id: &str, uri: &str, node: &str, plugins: &str) -> String {
    format!(
        "  - id: \"{id}\"\n    uri: \"{uri}\"\n{plugins}    upstream:\n      type: roundrobin\n      nodes:\n        \"{node}\": 1\n"
    )
}

struct H3Gateway {
    gw: Gateway,
    tls_port: u16,
}

/// A gateway whose ssl listener has HTTP/3 on, and a second ssl listener without it.
fn start(rest: &str, ferrisix_keys: &str) -> (H3Gateway, u16) {
    let tls_port = free_port();
    let plain_tls_port = free_port();
    let gw = Gateway::start_tuned(
        &format!("ssls:\n{}{rest}", ssls()),
        &format!(
            "ssl:\n  listen:\n    - ip: 127.0.0.1\n      port: {tls_port}\n      enable_http3: true\n    - ip: 127.0.0.1\n      port: {plain_tls_port}\n"
        ),
        ferrisix_keys,
        1,
        "",
    );
    let t = H3Gateway { gw, tls_port };
    // The snapshot with the ssls is published as the gateway starts; wait for a handshake.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = h3(&t, "server.local", &[json!({"path": "/__ready"})]);
        if out["error"].is_null() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    (t, plain_tls_port)
}

/// Runs the client: `requests` over one connection with `sni`.
fn h3(t: &H3Gateway, sni: &str, requests: &[Value]) -> Value {
    h3_port(t.tls_port, sni, requests)
}

fn h3_port(port: u16, sni: &str, requests: &[Value]) -> Value {
    let job = json!({
        "host": "127.0.0.1",
        "port": port,
        "sni": sni,
        "ca": cert_dir().join("ca.crt"),
        "requests": requests,
    });
    let mut child = Command::new("python3")
        .arg(CLIENT)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 with aioquic (scripts/test.sh installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(job.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "client output is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The one answer of a run, which must have succeeded.
fn only(out: &Value) -> &Value {
    assert!(out["error"].is_null(), "{out}");
    &out["responses"][0]
}

fn header<'a>(resp: &'a Value, name: &str) -> Option<&'a str> {
    resp["headers"]
        .as_array()?
        .iter()
        .find(|h| h[0].as_str() == Some(name))
        .and_then(|h| h[1].as_str())
}

fn body_json(resp: &Value) -> Value {
    serde_json::from_str(resp["body"].as_str().unwrap()).unwrap_or(Value::Null)
}

#[test]
fn get_and_post_reach_the_upstream_through_a_route() {
    let up = Upstream::start("echo", Behaviour::Echo);
    let (t, _) = start(
        &format!("routes:\n{}", route("1", "/echo/*", &up.node(), "")),
        "",
    );
    let out = h3(
        &t,
        "server.local",
        &[
            json!({"path": "/echo/get?a=1"}),
            json!({"method": "POST", "path": "/echo/post", "body": "hello over h3"}),
            json!({"method": "POST", "path": "/echo/sized", "body": "with a length",
                   "headers": [["content-length", "13"]]}),
            json!({"method": "PUT", "path": "/echo/big", "body_size": 300_000}),
        ],
    );
    assert!(out["error"].is_null(), "{out}");
    let r = &out["responses"];
    assert_eq!(r[0]["status"], 200, "{out}");
    let echo = body_json(&r[0]);
    assert_eq!(echo["method"], "GET");
    assert_eq!(echo["path"], "/echo/get?a=1");
    assert_eq!(
        echo["headers"]["host"],
        format!("server.local:{}", t.tls_port)
    );
    assert_eq!(echo["body_len"], 0);
    // An empty GET goes up without a body, as it would over HTTP/1.1.
    assert!(echo["headers"].get("transfer-encoding").is_none(), "{echo}");
    assert_eq!(header(&r[0], "x-upstream"), Some("echo"));

    let echo = body_json(&r[1]);
    assert_eq!(r[1]["status"], 200);
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["body"], "hello over h3");
    assert_eq!(echo["body_len"], 13);

    let echo = body_json(&r[2]);
    assert_eq!(echo["body"], "with a length");
    assert_eq!(echo["headers"]["content-length"], "13");

    let echo = body_json(&r[3]);
    assert_eq!(r[3]["status"], 200);
    assert_eq!(echo["method"], "PUT");
    assert_eq!(
        echo["body_len"], 300_000,
        "a body of many DATA frames arrives whole"
    );
    assert_eq!(up.hits(), 4);
}

#[test]
fn the_sni_picks_the_certificate_as_on_tcp() {
    let up = Upstream::start("echo", Behaviour::Echo);
    let (t, _) = start(
        &format!("routes:\n{}", route("1", "/*", &up.node(), "")),
        "",
    );
    let out = h3(&t, "other.local", &[json!({"path": "/x"})]);
    assert_eq!(only(&out)["status"], 200, "{out}");
    assert!(
        out["peer_cn"]
            .as_str()
            .unwrap_or("")
            .contains("other.local"),
        "{out}"
    );
    let out = h3(&t, "server.local", &[json!({"path": "/x"})]);
    assert_eq!(only(&out)["status"], 200, "{out}");
    assert!(
        out["peer_cn"]
            .as_str()
            .unwrap_or("")
            .contains("server.local"),
        "{out}"
    );
    // No ssl for this name: the handshake fails, as on TCP.
    let out = h3(&t, "nothing.local", &[json!({"path": "/x"})]);
    assert!(!out["error"].is_null(), "{out}");
    assert!(out["responses"].as_array().unwrap().is_empty(), "{out}");
}

#[test]
fn plugins_answer_as_over_http1() {
    let up = Upstream::start("echo", Behaviour::Echo);
    let plugins = "    plugins:\n      key-auth: {}\n      proxy-rewrite:\n        regex_uri: [\"^/api/(.*)\", \"/v2/$1\"]\n        headers:\n          set:\n            X-Via: gateway\n";
    let rest = format!(
        "routes:\n{}consumers:\n  - username: jack\n    plugins:\n      key-auth:\n        key: jack-key\n",
        route("1", "/api/*", &up.node(), plugins)
    );
    let (t, _) = start(&rest, "");
    let out = h3(
        &t,
        "server.local",
        &[
            json!({"path": "/api/items"}),
            json!({"path": "/api/items", "headers": [["apikey", "wrong"]]}),
            json!({"path": "/api/items", "headers": [["apikey", "jack-key"]]}),
        ],
    );
    assert!(out["error"].is_null(), "{out}");
    let r = &out["responses"];
    let addr = t.gw.addr();
    let over_h1 = [
        support::request(addr, "GET", "/api/items", &[], b""),
        support::request(addr, "GET", "/api/items", &[("apikey", "wrong")], b""),
        support::request(addr, "GET", "/api/items", &[("apikey", "jack-key")], b""),
    ];
    for (i, h1) in over_h1.iter().enumerate() {
        assert_eq!(r[i]["status"], h1.status, "request {i}: {out}");
        if h1.status != 200 {
            assert_eq!(r[i]["body"], h1.text(), "request {i}");
        }
    }
    assert_eq!(r[0]["status"], 401);
    assert_eq!(r[1]["status"], 401);
    let echo = body_json(&r[2]);
    assert_eq!(echo["path"], "/v2/items");
    assert_eq!(echo["headers"]["x-via"], "gateway");
    assert_eq!(echo["headers"]["x-consumer-username"], "jack");
}

#[test]
fn tcp_answers_on_the_h3_listener_carry_alt_svc() {
    let up = Upstream::start("echo", Behaviour::Echo);
    let (t, plain_tls_port) = start(
        &format!("routes:\n{}", route("1", "/*", &up.node(), "")),
        "",
    );
    let curl = |port: u16| {
        let out = Command::new("curl")
            .args(["-sS", "-D", "-", "-o", "/dev/null", "--cacert"])
            .arg(cert_dir().join("ca.crt"))
            .arg("--resolve")
            .arg(format!("server.local:{port}:127.0.0.1"))
            .arg(format!("https://server.local:{port}/x"))
            .output()
            .expect("curl");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).to_ascii_lowercase()
    };
    let head = curl(t.tls_port);
    assert!(
        head.contains(&format!("alt-svc: h3=\":{}\"; ma=86400", t.tls_port)),
        "{head}"
    );
    // The ssl listener without HTTP/3 and the plain port advertise nothing.
    assert!(!curl(plain_tls_port).contains("alt-svc"));
    let plain = support::get(t.gw.addr(), "/x");
    assert_eq!(plain.status, 200);
    assert!(plain.header("alt-svc").is_none());
    // Nor do answers over HTTP/3 itself.
    let out = h3(&t, "server.local", &[json!({"path": "/x"})]);
    assert!(header(only(&out), "alt-svc").is_none(), "{out}");
}

/// An upstream answering every request with `total` bytes (`i % 251`), chunked, in 64 KiB
/// writes.
fn big_upstream(total: usize) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
                );
                let body: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
                for chunk in body.chunks(64 * 1024) {
                    let _ = write!(s, "{:x}\r\n", chunk.len());
                    let _ = s.write_all(chunk);
                    let _ = s.write_all(b"\r\n");
                }
                let _ = s.write_all(b"0\r\n\r\n");
            });
        }
    });
    addr
}

#[test]
fn a_large_response_streams_back_whole() {
    let total = 8 << 20;
    let up = big_upstream(total);
    let (t, _) = start(
        &format!("routes:\n{}", route("1", "/big", &up.to_string(), "")),
        "",
    );
    let out = h3(&t, "server.local", &[json!({"path": "/big"})]);
    let r = only(&out);
    assert_eq!(r["status"], 200, "{out}");
    assert_eq!(r["body_len"], total);
    let body: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
    let digest = ring::digest::digest(&ring::digest::SHA256, &body);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(r["body_sha256"], hex);
}

#[test]
fn no_matching_route_is_apisix_404() {
    let up = Upstream::start("echo", Behaviour::Echo);
    let (t, _) = start(
        &format!("routes:\n{}", route("1", "/only", &up.node(), "")),
        "",
    );
    let out = h3(&t, "server.local", &[json!({"path": "/missing"})]);
    let r = only(&out);
    let h1 = support::get(t.gw.addr(), "/missing");
    assert_eq!(r["status"], 404);
    assert_eq!(r["body"], "{\"error_msg\":\"404 Route Not Found\"}\n");
    assert_eq!(r["body"], h1.text());
    assert_eq!(header(r, "server"), h1.header("server"));
    assert_eq!(up.hits(), 0);
}

#[test]
fn a_stop_finishes_the_request_in_flight() {
    let up = Upstream::start("slow", Behaviour::Delay(Duration::from_millis(1500)));
    let (mut t, _) = start(
        &format!("routes:\n{}", route("1", "/slow", &up.node(), "")),
        "ferrisix:\n  handover_wait: 0\n",
    );
    let port = t.tls_port;
    let in_flight =
        std::thread::spawn(move || h3_port(port, "server.local", &[json!({"path": "/slow"})]));
    let deadline = Instant::now() + Duration::from_secs(10);
    while up.hits() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(up.hits(), 1, "the request reached the upstream");
    t.gw.signal("TERM");
    let out = in_flight.join().unwrap();
    let r = only(&out);
    assert_eq!(r["status"], 200, "{out}");
    assert_eq!(body_json(r)["path"], "/slow");
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = t.gw.child.try_wait().unwrap() {
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
