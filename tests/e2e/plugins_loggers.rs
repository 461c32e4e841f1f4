//! End-to-end loggers through the binary: http-logger under wrk logs every request exactly
//! once (the last partial batch flushed by the graceful shutdown), and with its sink down the
//! gateway keeps serving with bounded memory (the backlog drops what it cannot hold);
//! file-logger appends its lines and reopens its file on SIGUSR1.
use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{json, Value};
use support::*;

/// An HTTP log sink: counts the entries of every POSTed batch (a JSON array or one object)
/// by their `status` field, and keeps each batch's `Authorization` header.
struct Sink {
    addr: SocketAddr,
    statuses: Arc<Mutex<Vec<String>>>,
    batches: Arc<AtomicUsize>,
    auth: Arc<Mutex<Vec<String>>>,
}

impl Sink {
    fn start() -> Sink {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let statuses = Arc::new(Mutex::new(Vec::new()));
        let batches = Arc::new(AtomicUsize::new(0));
        let auth = Arc::new(Mutex::new(Vec::new()));
        let (st, b, a) = (statuses.clone(), batches.clone(), auth.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (st, b, a) = (st.clone(), b.clone(), a.clone());
                std::thread::spawn(move || serve_sink(stream, &st, &b, &a));
            }
        });
        Sink {
            addr,
            statuses,
            batches,
            auth,
        }
    }
}

fn serve_sink(
    mut s: TcpStream,
    statuses: &Mutex<Vec<String>>,
    batches: &AtomicUsize,
    auth: &Mutex<Vec<String>>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let raw_head = String::from_utf8_lossy(&buf[..end]).into_owned();
        if let Some(v) = raw_head.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("authorization")
                .then(|| value.trim().to_owned())
        }) {
            auth.lock().unwrap().push(v);
        }
        let head = raw_head.to_lowercase();
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
        let v: Value = serde_json::from_slice(&body).expect("a JSON batch");
        let entries = match v {
            Value::Array(a) => a,
            one => vec![one],
        };
        batches.fetch_add(1, Ordering::Relaxed);
        statuses.lock().unwrap().extend(
            entries
                .iter()
                .map(|e| e["status"].as_str().unwrap_or("?").to_owned()),
        );
        if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .is_err()
        {
            return;
        }
    }
}

fn logged_route(up: &Upstream, sink: &str) -> String {
    json!({"routes": [{"id": "1", "uri": "/hello", "plugins": {"http-logger": {
        "uri": format!("http://{sink}/log"), "batch_max_size": 1000,
        "log_format": {"status": "$status", "uri": "$uri"}}},
        "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}]})
    .to_string()
}

fn ensure_wrk() {
    debian::require("wrk");
}

/// wrk's completed requests and its output.
fn wrk(addr: SocketAddr, secs: u64) -> (usize, String) {
    let out = std::process::Command::new("wrk")
        .args(["-t", "2", "-c", "16", "-d", &format!("{secs}s")])
        .arg(format!("http://{addr}/hello"))
        .output()
        .expect("run wrk");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let total = text
        .lines()
        .find_map(|l| l.trim().split_once(" requests in "))
        .and_then(|(n, _)| n.parse::<usize>().ok())
        .unwrap_or_else(|| panic!("no request count in wrk's output:\n{text}"));
    (total, text)
}

#[test]
fn http_logger_logs_every_request_exactly_once_under_wrk() {
    ensure_wrk();
    let up = Upstream::start("u", Behaviour::Echo);
    let sink = Sink::start();
    let mut gw = Gateway::start(&logged_route(&up, &sink.addr.to_string()));
    let (total, text) = wrk(gw.addr(), 10);
    // The graceful shutdown sends the last, partial batch.
    gw.signal("TERM");
    let status = gw.child.wait().expect("the gateway exits");
    assert!(status.success(), "{status:?}");
    let statuses = sink.statuses.lock().unwrap().clone();
    let ok = statuses.iter().filter(|s| *s == "200").count();
    eprintln!(
        "wrk -c 16 -d 10: {total} requests completed; the upstream served {}; the sink got {} entries in {} batches ({ok} of 200)",
        up.hits(),
        statuses.len(),
        sink.batches.load(Ordering::Relaxed),
    );
    // Every request the gateway served is logged exactly once: one entry per upstream hit.
    assert_eq!(statuses.len(), up.hits(), "{text}");
    // wrk counts only the answers it read before its deadline; the requests still in flight
    // on its 16 connections then were served (and logged) all the same.
    assert!(
        ok >= total && ok - total <= 16,
        "{ok} logged, {total} completed\n{text}"
    );
    assert!(
        statuses.iter().all(|s| s == "200" || s == "499"),
        "{:?}",
        statuses.iter().filter(|s| *s != "200").collect::<Vec<_>>()
    );
}

#[test]
fn http_logger_with_its_sink_down_keeps_memory_bounded() {
    ensure_wrk();
    let secs: u64 = std::env::var("FERRISIX_SINK_DOWN_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let up = Upstream::start("u", Behaviour::Echo);
    // Nothing listens there: every batch fails to connect and is retried, then dropped.
    let gw = Gateway::start(&logged_route(&up, &dead_node()));
    let (warm, _) = wrk(gw.addr(), 2);
    let before = gw.rss_kib();
    let started = Instant::now();
    let (total, text) = wrk(gw.addr(), secs);
    let after = gw.rss_kib();
    eprintln!(
        "sink down, wrk -c 16 -d {secs}: {total} requests ({warm} warm-up) in {:?}; RSS {before} KiB before, {after} KiB after",
        started.elapsed()
    );
    assert!(total > 1000, "the gateway kept serving: {text}");
    assert!(
        after < before + 64 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
    // Still answering at once.
    let r = get(gw.addr(), "/hello");
    assert_eq!(r.status, 200);
}

/// Issue 47, item 6: http-logger's `auth_header` is one of its `encrypt_fields`, stored
/// encrypted by the Admin API; the data plane decrypts it, so the log server gets the value
/// configured, not the stored ciphertext.
#[test]
fn http_logger_sends_the_auth_header_configured_not_its_stored_form() {
    let up = Upstream::start("u", Behaviour::Echo);
    let sink = Sink::start();
    let gw = StoreGatewayBuilder::embedded().start();
    let secret = "Bearer s3cr3t-token";
    gw.put_route(
        "1",
        &json!({"uri": "/hello", "plugins": {"http-logger": {
            "uri": format!("http://{}/log", sink.addr), "auth_header": secret,
            "batch_max_size": 1, "log_format": {"status": "$status"}}},
            "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}),
    );
    // Stored encrypted (the Admin API shows it decrypted).
    let stored = gw.admin("GET", "/apisix/admin/routes/1", "");
    assert_eq!(
        stored.json()["value"]["plugins"]["http-logger"]["auth_header"],
        secret
    );
    poll_until(std::time::Duration::from_secs(10), || {
        get(gw.data_addr(), "/hello").status == 200
    })
    .expect("the route is served");
    poll_until(std::time::Duration::from_secs(10), || {
        !sink.auth.lock().unwrap().is_empty()
    })
    .expect("a batch reached the sink");
    let auth = sink.auth.lock().unwrap().clone();
    assert!(auth.iter().all(|a| a == secret), "{auth:?}");
}

/// The lines of `path` once it has `n` of them (within 10 s).
fn file_lines(path: &std::path::Path, n: usize) -> Vec<Value> {
    let mut text = String::new();
    poll_until(std::time::Duration::from_secs(10), || {
        text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines().count() >= n
    })
    .unwrap_or_else(|| panic!("{} has not {n} lines:\n{text}", path.display()));
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn file_logger_appends_lines_and_reopens_its_file_on_sigusr1() {
    let up = Upstream::start("u", Behaviour::Echo);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("file.log");
    let routes = json!({"routes": [{"id": "1", "uri": "/hello", "plugins": {"file-logger": {
        "path": path.to_str().unwrap(), "log_format": {"status": "$status", "args": "$args"},
        "match": [[["arg_skip", "!", "==", "yes"]]]}},
        "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}]})
    .to_string();
    let gw = Gateway::start(&routes);
    assert_eq!(get(gw.addr(), "/hello?n=1").status, 200);
    assert_eq!(get(gw.addr(), "/hello?skip=yes").status, 200);
    assert_eq!(get(gw.addr(), "/hello?n=2").status, 200);
    let first = file_lines(&path, 2);
    assert_eq!(
        first[0],
        json!({"status": "200", "args": "n=1", "route_id": "1"})
    );
    assert_eq!(first[1]["args"], "n=2");
    // logrotate: the file moved away, then SIGUSR1; the next lines go to a new file.
    let rotated = dir.path().join("file.log.1");
    std::fs::rename(&path, &rotated).unwrap();
    gw.signal("USR1");
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(get(gw.addr(), "/hello?n=3").status, 200);
    let after = file_lines(&path, 1);
    assert_eq!(
        after,
        vec![json!({"status": "200", "args": "n=3", "route_id": "1"})]
    );
    assert_eq!(file_lines(&rotated, 2).len(), 2);
}
