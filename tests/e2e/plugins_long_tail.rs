//! End-to-end, through the binary, plugins of the long tail (issue 45): splunk-hec-logging
//! under wrk logs every request exactly once to an in-test HEC endpoint; node-status answers
//! `/apisix/status` through public-api; azure-functions forwards the route's wildcard part to
//! the function; error-log-logger ships the gateway's own warnings to a TCP server.
use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

/// Reads one HTTP/1.1 request (head, body) from `s`; `None` at the end of the connection.
pub(crate) fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(String, Vec<u8>)> {
    let mut chunk = [0u8; 65536];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let len: usize = head
                .to_lowercase()
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            while buf.len() < end + 4 + len {
                let n = s.read(&mut chunk).ok().filter(|n| *n > 0)?;
                buf.extend_from_slice(&chunk[..n]);
            }
            let body = buf[end + 4..end + 4 + len].to_vec();
            buf.drain(..end + 4 + len);
            return Some((head, body));
        }
        let n = s.read(&mut chunk).ok().filter(|n| *n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// An HTTP server on 127.0.0.1 calling `handle` for each request (head, body) and
/// answering what it returns (status, body).
pub(crate) fn http_server(
    handle: impl Fn(&str, &[u8]) -> (u16, String) + Send + Sync + 'static,
) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = Arc::new(handle);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let handle = handle.clone();
            std::thread::spawn(move || {
                let mut s = stream;
                let mut buf = Vec::new();
                while let Some((head, body)) = read_request(&mut s, &mut buf) {
                    let (status, text) = handle(&head, &body);
                    let resp = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{text}",
                        text.len()
                    );
                    if s.write_all(resp.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

pub(crate) fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[test]
fn splunk_hec_logging_logs_every_request_exactly_once_under_wrk() {
    debian::require("wrk");
    let up = Upstream::start("u", Behaviour::Echo);
    // Splunk's HEC: `/services/collector` with the token, the events one after the other.
    let events = Arc::new(Mutex::new(Vec::<Value>::new()));
    let seen = events.clone();
    let hec = http_server(move |head, body| {
        if !head.starts_with("POST /services/collector ")
            || header(head, "authorization") != Some("Splunk 11111111-2222-3333-4444-555555555555")
        {
            return (403, r#"{"text":"Invalid token","code":4}"#.into());
        }
        let got: Vec<Value> = serde_json::Deserializer::from_slice(body)
            .into_iter::<Value>()
            .map(Result::unwrap)
            .collect();
        seen.lock().unwrap().extend(got);
        (200, r#"{"text":"Success","code":0}"#.into())
    });
    let routes = json!({"routes": [{"id": "1", "uri": "/hello", "plugins": {"splunk-hec-logging": {
        "endpoint": {"uri": format!("http://{hec}/services/collector"),
            "token": "11111111-2222-3333-4444-555555555555"}, "batch_max_size": 500}},
        "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}]});
    let mut gw = Gateway::start(&routes.to_string());
    let out = std::process::Command::new("wrk")
        .args(["-t", "2", "-c", "16", "-d", "5s"])
        .arg(format!("http://{}/hello", gw.addr()))
        .output()
        .expect("run wrk");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // The graceful shutdown sends the last, partial batch.
    gw.signal("TERM");
    assert!(gw.child.wait().expect("the gateway exits").success());
    let events = events.lock().unwrap();
    eprintln!(
        "{} events for {} upstream hits\n{text}",
        events.len(),
        up.hits()
    );
    assert!(up.hits() > 100, "{text}");
    assert_eq!(events.len(), up.hits(), "one event per request served");
    let e = &events[0];
    assert_eq!(e["source"], "apache-apisix-splunk-hec-logging");
    assert_eq!(e["sourcetype"], "_json");
    assert_eq!(e["event"]["request_method"], "GET");
}

#[test]
fn node_status_answers_through_public_api() {
    let up = Upstream::start("u", Behaviour::Echo);
    let routes = json!({"routes": [
        {"id": "status", "uri": "/apisix/status", "plugins": {"public-api": {}}},
        {"id": "1", "uri": "/hello", "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}
    ]});
    let gw = Gateway::start(&routes.to_string());
    for _ in 0..3 {
        assert_eq!(get(gw.addr(), "/hello").status, 200);
    }
    let r = get(gw.addr(), "/apisix/status");
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["id"].as_str().map(str::len), Some(36), "{v}");
    let count = |k: &str| v["status"][k].as_str().unwrap().parse::<u64>().unwrap();
    // The three requests and this one.
    assert!(count("total") >= 4, "{v}");
    assert!(
        count("accepted") >= 1 && count("handled") == count("accepted"),
        "{v}"
    );
    assert!(count("active") >= 1 && count("writing") >= 1, "{v}");
}

#[test]
fn azure_functions_gets_the_routes_wildcard_part() {
    // An Azure Functions host: `/api/<function>` with the function key.
    let function = http_server(|head, body| {
        let path = head.split(' ').nth(1).unwrap_or("").to_owned();
        if header(head, "x-functions-key") != Some("fn-key") {
            return (401, "{}".into());
        }
        (
            200,
            json!({"path": path, "host": header(head, "host"), "body": String::from_utf8_lossy(body)})
                .to_string(),
        )
    });
    let routes = json!({"routes": [{"id": "1", "uri": "/azure/*", "plugins": {"azure-functions": {
        "function_uri": format!("http://{function}/api"), "authorization": {"apikey": "fn-key"}}}}]});
    let gw = Gateway::start(&routes.to_string());
    let r = request(gw.addr(), "POST", "/azure/hello?name=x", &[], b"payload");
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["path"], "/api/hello?name=x");
    assert_eq!(v["host"], "127.0.0.1");
    assert_eq!(v["body"], "payload");
}

#[test]
fn error_log_logger_ships_the_gateways_warnings() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let got = lines.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                got.lock().unwrap().push(line);
            }
        }
    });
    let conf = json!({
        "routes": [{"id": "1", "uri": "/down", "upstream": {"type": "roundrobin",
            "nodes": {dead_node(): 1}}}],
        "global_rules": [{"id": "1", "plugins": {"error-log-logger": {}}}],
        "plugin_metadata": [{"id": "error-log-logger", "tcp": {"host": "127.0.0.1", "port": port},
            "level": "WARN", "batch_max_size": 1, "inactive_timeout": 1}]
    });
    let gw = Gateway::start(&conf.to_string());
    // An upstream that refuses connections: the gateway logs a warning for it.
    assert_eq!(get(gw.addr(), "/down").status, 502);
    let shipped = poll_until(Duration::from_secs(10), || {
        lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains(" [warn] ") && l.contains("connect() failed"))
    });
    let lines = lines.lock().unwrap();
    assert!(shipped.is_some(), "no warning shipped: {lines:?}");
    // nginx's error log line: `2024/01/02 03:04:05 [warn] <pid>#0: <message>`, warnings
    // and errors only.
    let nginx_like = |l: &str| {
        let rest = l.get(19..).unwrap_or("");
        let rest = rest
            .strip_prefix(" [warn] ")
            .or_else(|| rest.strip_prefix(" [error] "));
        l.as_bytes()[..4].iter().all(u8::is_ascii_digit)
            && &l[4..5] == "/"
            && rest.is_some_and(|r| {
                r.split_once("#0: ")
                    .is_some_and(|(pid, _)| pid.parse::<u32>().is_ok())
            })
    };
    assert!(lines.iter().all(|l| nginx_like(l)), "{lines:?}");
}
