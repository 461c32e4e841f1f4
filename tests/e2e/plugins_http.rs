//! End-to-end request and response plugins through the binary: gzip and response-rewrite
//! `filters` on a 100 MB streamed response keep the gateway's memory flat, a realistic route
//! (real-ip, proxy-rewrite headers, cors, request-id, ip-restriction) works together, and
//! client-control / proxy-control shape the request body; uri-blocker, the worked example of
//! `docs/adding-a-plugin.md`, refuses what its rules match.
use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use support::*;

const BODY: u64 = 100 << 20;
/// One line of the streamed body (32 bytes).
const LINE: &[u8] = b"needle haystack 0123456789abcd\r\n";

/// An upstream that answers every request with `BODY` bytes of `LINE`s, chunked, written in
/// 64 KiB pieces (backpressure holds it to the client's pace).
fn start_streamer() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || stream_body(stream));
        }
    });
    addr
}

fn stream_body(mut s: TcpStream) {
    let mut buf = [0u8; 4096];
    let mut head = Vec::new();
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let piece: Vec<u8> = LINE.repeat(2048);
    let mut out = Vec::with_capacity(piece.len() + 16);
    if s.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n",
    )
    .is_err()
    {
        return;
    }
    let mut sent = 0u64;
    while sent < BODY {
        out.clear();
        out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        out.extend_from_slice(&piece);
        out.extend_from_slice(b"\r\n");
        if s.write_all(&out).is_err() {
            return;
        }
        sent += piece.len() as u64;
    }
    let _ = s.write_all(b"0\r\n\r\n");
}

/// Samples a process' peak RSS (KiB) until dropped.
struct RssPeak {
    done: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssPeak {
    fn start(pid: u32) -> RssPeak {
        let done = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let (d, p) = (done.clone(), peak.clone());
        let thread = std::thread::spawn(move || {
            while !d.load(Ordering::SeqCst) {
                if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                    if let Some(kb) = status
                        .lines()
                        .find_map(|l| l.strip_prefix("VmRSS:"))
                        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                    {
                        p.fetch_max(kb, Ordering::SeqCst);
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        RssPeak {
            done,
            peak,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> u64 {
        self.done.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peak.load(Ordering::SeqCst)
    }
}

/// GETs `path` as HTTP/1.0 (the answer ends with the connection) with `headers`, streaming
/// the body into `sink`; answers the response head.
fn stream_get(addr: SocketAddr, path: &str, headers: &str, sink: &mut dyn Write) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: t\r\n{headers}\r\n").unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let mut head = Vec::new();
    let body_start = loop {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "connection closed before the head");
        head.extend_from_slice(&buf[..n]);
        if let Some(p) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    sink.write_all(&head[body_start..]).unwrap();
    head.truncate(body_start);
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        sink.write_all(&buf[..n]).unwrap();
    }
    String::from_utf8_lossy(&head).to_lowercase()
}

/// Counts bytes and checks each `needle` became `pin`.
#[derive(Default)]
struct Count {
    bytes: u64,
    needles: u64,
}

impl Write for Count {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.bytes += b.len() as u64;
        self.needles += b.windows(6).filter(|w| *w == b"needle").count() as u64;
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn streamed_100_mb_through_gzip_and_filters_keeps_memory_flat() {
    let up = start_streamer();
    let routes = json!({"routes": [
        {"id": "gz", "uri": "/gz", "plugins": {"gzip": {"types": ["text/plain"], "http_version": 1.0}},
         "upstream": {"nodes": {up.to_string(): 1}}},
        // Past max_resp_body_size (64 MiB by default) APISIX cuts the body; allow all of it.
        {"id": "rw", "uri": "/rw", "plugins": {"response-rewrite": {"max_resp_body_size": 2 * BODY,
            "filters": [{"regex": "needle", "replace": "pin", "scope": "global"}]}},
         "upstream": {"nodes": {up.to_string(): 1}}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    let baseline = gw.rss_kib();

    let rss = RssPeak::start(gw.pid());
    let mut plain = flate2::write::GzDecoder::new(Count::default());
    let head = stream_get(gw.addr(), "/gz", "Accept-Encoding: gzip\r\n", &mut plain);
    let plain = plain.finish().unwrap();
    let gz_peak = rss.stop();
    assert!(head.contains("content-encoding: gzip"), "{head}");
    assert_eq!(plain.bytes, BODY, "the whole body, decompressed");

    let rss = RssPeak::start(gw.pid());
    let mut filtered = Count::default();
    let head = stream_get(gw.addr(), "/rw", "", &mut filtered);
    let rw_peak = rss.stop();
    assert!(head.starts_with("http/1.0 200"), "{head}");
    let lines = BODY / LINE.len() as u64;
    assert_eq!(filtered.needles, 0, "every needle replaced");
    assert_eq!(
        filtered.bytes,
        BODY - 3 * lines,
        "needle (6) became pin (3) on each line"
    );

    eprintln!("100 MB streamed: RSS baseline {baseline} KiB, peak {gz_peak} KiB (gzip), {rw_peak} KiB (filters)");
    for peak in [gz_peak, rw_peak] {
        assert!(
            peak.saturating_sub(baseline) < 32 * 1024,
            "gateway RSS grew from {baseline} to {peak} KiB on a 100 MB streamed response"
        );
    }
}

#[test]
fn realistic_route() {
    let up = Upstream::start("up", Behaviour::Echo);
    let routes = json!({"routes": [
        {"id": "r", "uri": "/api/*", "plugins": {
            "real-ip": {"source": "http_x_client_ip", "trusted_addresses": ["127.0.0.1"]},
            "proxy-rewrite": {"regex_uri": ["^/api/(.*)", "/v2/$1"],
                "headers": {"set": {"X-Api-Version": "v2", "X-Client": "$remote_addr"}, "remove": ["X-Drop"]}},
            "cors": {"allow_origins": "http://app.example,http://admin.example"},
            "request-id": {},
            "ip-restriction": {"whitelist": ["10.0.0.0/8", "127.0.0.1"]}},
         "upstream": {"nodes": {up.node(): 1}}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    let r = request(
        gw.addr(),
        "GET",
        "/api/users?page=2",
        &[
            ("Origin", "http://app.example"),
            ("X-Client-Ip", "10.1.2.3"),
            ("X-Drop", "1"),
        ],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let echo = r.json();
    assert_eq!(echo["path"], "/v2/users?page=2", "{echo}");
    assert_eq!(echo["headers"]["x-api-version"], "v2");
    assert_eq!(echo["headers"]["x-client"], "10.1.2.3", "real-ip ran first");
    assert!(echo["headers"].get("x-drop").is_none());
    let id = r
        .header("X-Request-Id")
        .expect("request id answered")
        .to_owned();
    assert_eq!(echo["headers"]["x-request-id"], id.as_str());
    assert_eq!(
        r.header("Access-Control-Allow-Origin"),
        Some("http://app.example")
    );
    assert_eq!(r.header("Vary"), Some("Origin"));

    // The real address decides ip-restriction; the refusal still carries cors and the id.
    let r = request(
        gw.addr(),
        "GET",
        "/api/users",
        &[
            ("Origin", "http://admin.example"),
            ("X-Client-Ip", "192.168.1.1"),
        ],
        b"",
    );
    assert_eq!(r.status, 403);
    assert_eq!(
        r.text(),
        "{\"message\":\"Your IP address is not allowed\"}\n"
    );
    assert_eq!(
        r.header("Access-Control-Allow-Origin"),
        Some("http://admin.example")
    );
    assert!(r.header("X-Request-Id").is_some());

    // A preflight is answered by cors alone.
    let r = request(
        gw.addr(),
        "OPTIONS",
        "/api/users",
        &[("Origin", "http://app.example")],
        b"",
    );
    assert_eq!((r.status, r.text()), (200, String::new()));
    assert_eq!(
        r.header("Access-Control-Allow-Origin"),
        Some("http://app.example")
    );
}

#[test]
fn body_size_and_buffering() {
    let up = Upstream::start("up", Behaviour::Echo);
    let routes = json!({"routes": [
        {"id": "stream", "uri": "/stream", "plugins": {"proxy-control": {"request_buffering": false}},
         "upstream": {"nodes": {up.node(): 1}}},
        {"id": "buffer", "uri": "/buffer", "upstream": {"nodes": {up.node(): 1}}},
        {"id": "small", "uri": "/small", "plugins": {"client-control": {"max_body_size": 5}},
         "upstream": {"nodes": {up.node(): 1}}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    let chunked = |path: &str, body: &str| {
        let raw = format!(
            "POST {path} HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
            body.len()
        );
        request_raw(gw.addr(), raw.as_bytes())
    };
    // Buffered (the default): a small chunked body goes up with its length.
    let r = chunked("/buffer", "hello");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["headers"]["content-length"], "5", "{}", r.text());
    // proxy-control request_buffering false: it streams up as it came.
    let r = chunked("/stream", "hello");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.json()["headers"].get("content-length").is_none(),
        "{}",
        r.text()
    );
    assert_eq!(r.json()["body_len"], 5);
    // client-control: a declared or streamed body past max_body_size is refused with 413.
    let r = request(gw.addr(), "POST", "/small", &[], b"123456");
    assert_eq!(r.status, 413);
    assert_eq!(chunked("/small", "123456").status, 413);
    assert_eq!(chunked("/small", "12345").status, 200);
}

#[test]
fn uri_blocker_refuses_matching_uris() {
    let up = Upstream::start("up", Behaviour::Echo);
    let routes = json!({"routes": [
        {"id": "blocked", "uri": "/files/*", "plugins": {"uri-blocker": {
            "block_rules": ["\\.exe$", "passwd"], "rejected_code": 410,
            "rejected_msg": "access is not allowed"}},
         "upstream": {"nodes": {up.node(): 1}}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    let r = get(gw.addr(), "/files/setup.exe");
    assert_eq!(r.status, 410);
    assert_eq!(r.text(), "{\"error_msg\":\"access is not allowed\"}\n");
    // The rules see the query string too.
    assert_eq!(get(gw.addr(), "/files/x?f=/etc/passwd").status, 410);
    let r = get(gw.addr(), "/files/readme.txt");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(up.hits(), 1, "only the allowed request went upstream");
}

/// `$balancer_ip`, `$balancer_port`, `$upstream_addr`, `$upstream_status` and
/// `$upstream_response_time` in response-rewrite's headers: the last node tried, and every
/// try.
#[test]
fn response_rewrite_headers_see_the_upstream_tries() {
    let up = Upstream::start("up", Behaviour::Echo);
    let dead = dead_node();
    let routes = json!({"routes": [
        {"id": "rw", "uri": "/rw", "plugins": {"response-rewrite": {"headers": {"set": {
            "X-Balancer": "$balancer_ip:$balancer_port", "X-Addr": "$upstream_addr",
            "X-Status": "$upstream_status", "X-Time": "$upstream_response_time",
            "X-Remote": "from $remote_addr"}}}},
         "upstream": {"nodes": {dead.clone(): 1, up.node(): 1}, "retries": 1}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    let mut retried = 0;
    for _ in 0..4 {
        let r = get(gw.addr(), "/rw");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("X-Balancer"), Some(up.node().as_str()));
        assert_eq!(r.header("X-Remote"), Some("from 127.0.0.1"));
        let addr = r.header("X-Addr").unwrap_or_default();
        // nginx: the try whose answer is on its way has no response time yet ("-").
        let time = r.header("X-Time").unwrap_or_default();
        if addr == up.node() {
            assert_eq!(r.header("X-Status"), Some("200"));
            assert_eq!(time, "-");
        } else {
            retried += 1;
            assert_eq!(addr, format!("{dead}, {}", up.node()));
            assert_eq!(r.header("X-Status"), Some("502, 200"));
            let (first, last) = time.split_once(", ").unwrap_or_else(|| panic!("{time:?}"));
            assert!(
                first.parse::<f64>().is_ok_and(|t| (0.0..5.0).contains(&t)),
                "{time}"
            );
            assert_eq!(
                first.split_once('.').map(|(_, ms)| ms.len()),
                Some(3),
                "{time}"
            );
            assert_eq!(last, "-");
        }
    }
    assert!(
        retried > 0,
        "round robin tried the dead node first at least once"
    );
}

/// An upstream that answers each request with a chunked body written in `pieces`, flushing
/// and pausing after each, so the gateway reads them one by one.
fn start_piecewise(pieces: Vec<Vec<u8>>) -> SocketAddr {
    let pieces = Arc::new(pieces);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let pieces = pieces.clone();
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
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n",
                );
                for p in pieces.iter() {
                    let _ = s.write_all(format!("{:x}\r\n", p.len()).as_bytes());
                    let _ = s.write_all(p);
                    let _ = s.write_all(b"\r\n");
                    let _ = s.flush();
                    std::thread::sleep(Duration::from_millis(50));
                }
                let _ = s.write_all(b"0\r\n\r\n");
            });
        }
    });
    addr
}

/// APISIX runs `filters` over the whole body: a match split across the upstream's writes is
/// still replaced, a match of 4 MiB too, and `$` sees the body's end.
#[test]
fn filters_match_across_reads() {
    let half = "a".repeat(2 << 20);
    let pieces = [
        "say hel".to_owned(),
        "lo to ".to_owned(),
        "the world\n".to_owned(),
        format!("<p>{half}"),
        half.clone(),
        "</p>\n".to_owned(),
        "of x".to_owned(),
        "yz\n".to_owned(),
    ];
    let up = start_piecewise(pieces.map(String::into_bytes).to_vec());
    let routes = json!({"routes": [
        {"id": "rw", "uri": "/rw", "plugins": {"response-rewrite": {"filters": [
            {"regex": "hello", "replace": "bye"},
            {"regex": "to the", "replace": "2", "scope": "global"},
            {"regex": "<p>a*</p>", "replace": "P"},
            {"regex": "x[^\\n]*$", "replace": "end"}]}},
         "upstream": {"nodes": {up.to_string(): 1}}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    let r = get(gw.addr(), "/rw");
    assert_eq!(r.status, 200);
    let text = r.text();
    assert!(
        text == "say bye 2 world\nP\nof end\n",
        "{} bytes: {:?} ... {:?}",
        text.len(),
        &text[..text.len().min(40)],
        &text[text.len().saturating_sub(40)..]
    );
}
