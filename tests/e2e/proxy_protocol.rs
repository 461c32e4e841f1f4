//! The PROXY protocol end to end: the HTTP and HTTPS listeners of `apisix.proxy_protocol`
//! (v1 and v2 headers, the `$proxy_protocol_*` variables in proxy-rewrite, route `vars`, the
//! access log and file-logger, `real_ip_header: proxy_protocol`), and the stream ports'
//! `proxy_protocol` / `proxy_protocol_to_upstream` with `nginx_config.stream.real_ip_from`:
//! a stream route matched on the header's client, and the v1 header a test upstream reads.
//! Bad headers (none, malformed, cut short, too long) close the connection unanswered.

use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::{free_port, poll_until, read_reply, Behaviour, Gateway, Launch, Reply, Upstream};

const V1: &str = "PROXY TCP4 198.51.100.7 10.0.0.1 56324 9181\r\n";

/// A v2 PROXY header for a TCP over IPv4 connection from `src` to `dst`.
fn v2_tcp4(src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let (SocketAddr::V4(s), SocketAddr::V4(d)) = (src, dst) else {
        panic!("IPv4 addresses expected");
    };
    let mut out = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    out.extend_from_slice(&[0x21, 0x11, 0, 12]);
    out.extend_from_slice(&s.ip().octets());
    out.extend_from_slice(&d.ip().octets());
    out.extend_from_slice(&s.port().to_be_bytes());
    out.extend_from_slice(&d.port().to_be_bytes());
    out
}

/// Sends `prefix` then a GET of `path`, and reads the answer.
fn get_with(port: u16, prefix: &[u8], path: &str) -> Reply {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut bytes = prefix.to_vec();
    bytes.extend_from_slice(format!("GET {path} HTTP/1.1\r\nHost: pp.test\r\n\r\n").as_bytes());
    s.write_all(&bytes).unwrap();
    read_reply(&mut s, false)
}

/// Sends `bytes` and answers whether the gateway closed the connection without answering.
fn closed_unanswered(port: u16, bytes: &[u8]) -> bool {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(bytes);
    let mut buf = [0u8; 256];
    matches!(s.read(&mut buf), Ok(0) | Err(_))
}

/// The echo upstream's view of a request's headers.
fn echoed(reply: &Reply) -> Value {
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()["headers"].clone()
}

/// `path`'s lines once there are at least `n` of them.
fn lines_of(path: &Path, n: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let done = poll_until(Duration::from_secs(10), || {
        lines = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        lines.len() >= n
    });
    assert!(done.is_some(), "{} has {lines:?}", path.display());
    lines
}

#[test]
fn http_listener_takes_v1_and_v2_headers_into_the_variables() {
    let up = Upstream::start("u", Behaviour::Echo);
    let pp = free_port();
    let dir = tempfile::tempdir().unwrap();
    let file_log = dir.path().join("file.log");
    let routes = json!({"routes": [
        {"id": "only-proxied", "uri": "/only", "vars": [["proxy_protocol_addr", "==", "198.51.100.7"]],
         "plugins": {"proxy-rewrite": {"headers": {"set": {"X-Route": "only"}}}},
         "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}},
        {"id": "pp", "uris": ["/pp", "/only"],
         "plugins": {
            "proxy-rewrite": {"headers": {"set": {
                "X-PP": "$proxy_protocol_addr:$proxy_protocol_port",
                "X-PP-Server": "$proxy_protocol_server_addr:$proxy_protocol_server_port",
                "X-Client": "$remote_addr:$remote_port"}}},
            "file-logger": {"path": file_log.to_str().unwrap(),
                "log_format": {"pp": "$proxy_protocol_addr", "client": "$remote_addr"}}},
         "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}
    ]})
    .to_string();
    let gw = Gateway::start_tuned(
        &routes,
        &format!("proxy_protocol:\n  listen_http_port: {pp}"),
        "",
        1,
        "access_log_format: \"$remote_addr $proxy_protocol_addr $proxy_protocol_port $status\"",
    );

    // v1: the header's client is $proxy_protocol_addr; $remote_addr stays the peer, as
    // APISIX's default real_ip_header (X-Real-IP) leaves it.
    let h = echoed(&get_with(pp, V1.as_bytes(), "/pp"));
    assert_eq!(h["x-pp"], "198.51.100.7:56324");
    assert_eq!(h["x-pp-server"], "10.0.0.1:9181");
    assert!(
        h["x-client"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{h}"
    );
    assert_eq!(h["x-real-ip"], "127.0.0.1");

    // v2, with the request in the same segment.
    let header = v2_tcp4(
        "203.0.113.9:4000".parse().unwrap(),
        "10.0.0.2:443".parse().unwrap(),
    );
    let h = echoed(&get_with(pp, &header, "/pp"));
    assert_eq!(h["x-pp"], "203.0.113.9:4000");
    assert_eq!(h["x-pp-server"], "10.0.0.2:443");

    // Route vars see the variable: only the v1 client matches the first route.
    let h = echoed(&get_with(pp, V1.as_bytes(), "/only"));
    assert_eq!(h["x-route"], "only");
    let h = echoed(&get_with(pp, &header, "/only"));
    assert_eq!(h.get("x-route"), None, "{h}");

    // The plain listener has no header: the variables are empty.
    let h = echoed(&get_with(gw.port, b"", "/pp"));
    assert_eq!(h["x-pp"], ":");

    // Loggers: the access log and file-logger.
    let access = lines_of(&support::access_log(&gw), 5);
    assert!(
        access[0].starts_with("127.0.0.1 198.51.100.7 56324 200"),
        "{access:?}"
    );
    assert!(access[1].starts_with("127.0.0.1 203.0.113.9 4000 200"));
    assert!(access[4].starts_with("127.0.0.1 - - 200"), "{access:?}");
    // (The v1 request to /only went to the route without file-logger.)
    let logged: Vec<Value> = lines_of(&file_log, 4)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(logged[0]["pp"], "198.51.100.7");
    assert_eq!(logged[0]["client"], "127.0.0.1");
    assert_eq!(logged[1]["pp"], "203.0.113.9");
    // An unset variable is left out of the entry, as APISIX leaves out a nil.
    assert_eq!(logged[3].get("pp"), None, "{}", logged[3]);

    // Without a header, or with a broken one, the connection closes unanswered.
    for bad in [
        &b"GET /pp HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        b"PROXY TCP4 198.51.100.7 10.0.0.1 56324\r\nGET /pp HTTP/1.1\r\n\r\n",
        b"PROXY TCP4 300.51.100.7 10.0.0.1 1 2\r\nGET /pp HTTP/1.1\r\n\r\n",
        b"\r\n\r\n\0\r\nQUIT\n\x13\x11\x00\x0c",
    ] {
        assert!(
            closed_unanswered(pp, bad),
            "{:?} was answered",
            String::from_utf8_lossy(bad)
        );
    }
    // A v1 line past 107 bytes.
    let mut long = b"PROXY UNKNOWN ".to_vec();
    long.resize(200, b'x');
    assert!(closed_unanswered(pp, &long));
    // The listener still serves after all that.
    assert_eq!(
        echoed(&get_with(pp, V1.as_bytes(), "/pp"))["x-pp"],
        "198.51.100.7:56324"
    );
}

#[test]
fn a_v2_local_header_and_unknown_keep_the_peer() {
    let up = Upstream::start("u", Behaviour::Echo);
    let pp = free_port();
    let routes = json!({"routes": [{"id": "pp", "uri": "/pp",
        "plugins": {"proxy-rewrite": {"headers": {"set": {
            "X-PP": "$proxy_protocol_addr", "X-Client": "$remote_addr"}}}},
        "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}]})
    .to_string();
    let _gw = Gateway::start_tuned(
        &routes,
        &format!("proxy_protocol:\n  listen_http_port: {pp}"),
        "",
        1,
        "real_ip_header: proxy_protocol",
    );
    // LOCAL (a health check from the balancer itself), with an address block it ignores.
    let mut local = v2_tcp4(
        "203.0.113.9:4000".parse().unwrap(),
        "10.0.0.2:443".parse().unwrap(),
    );
    local[12] = 0x20;
    for header in [local, b"PROXY UNKNOWN\r\n".to_vec()] {
        let h = echoed(&get_with(pp, &header, "/pp"));
        // The variable is unset: proxy-rewrite sets no header from it.
        assert_eq!(h.get("x-pp"), None, "{h}");
        assert_eq!(h["x-client"], "127.0.0.1");
    }
}

#[test]
fn real_ip_header_proxy_protocol_names_the_client_from_a_trusted_peer() {
    let up = Upstream::start("u", Behaviour::Echo);
    let pp = free_port();
    let routes = json!({"routes": [{"id": "pp", "uri": "/pp",
        "plugins": {"proxy-rewrite": {"headers": {"set": {"X-Client": "$remote_addr:$remote_port"}}},
                    "ip-restriction": {"blacklist": ["203.0.113.0/24"]}},
        "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}]})
    .to_string();
    let _gw = Gateway::start_tuned(
        &routes,
        &format!("proxy_protocol:\n  listen_http_port: {pp}"),
        "",
        1,
        "real_ip_header: proxy_protocol",
    );
    // 127.0.0.1 is in APISIX's default real_ip_from.
    let h = echoed(&get_with(pp, V1.as_bytes(), "/pp"));
    assert_eq!(h["x-client"], "198.51.100.7:56324");
    assert_eq!(h["x-real-ip"], "198.51.100.7");
    assert_eq!(h["x-forwarded-for"], "198.51.100.7");
    // ip-restriction reads the same address.
    let header = v2_tcp4(
        "203.0.113.9:4000".parse().unwrap(),
        "10.0.0.2:443".parse().unwrap(),
    );
    assert_eq!(get_with(pp, &header, "/pp").status, 403);
}

/// Relays one connection from a local port to `target`, sending `header` first: what a
/// balancer in front of the gateway does, for clients (curl) that cannot write the header
/// themselves.
fn proxy_in_front(target: u16, header: Vec<u8>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            let Ok(mut server) = TcpStream::connect(("127.0.0.1", target)) else {
                return;
            };
            if server.write_all(&header).is_err() {
                return;
            }
            let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s2, &mut c2);
                let _ = c2.shutdown(std::net::Shutdown::Write);
            });
            let _ = std::io::copy(&mut client, &mut server);
            let _ = server.shutdown(std::net::Shutdown::Write);
        }
    });
    port
}

fn tls_data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tls")
}

/// A YAML block scalar holding the PEM file `name`, indented for a list item's field.
fn pem_block(name: &str) -> String {
    let text = std::fs::read_to_string(tls_data().join(name)).unwrap();
    let mut out = String::from("|\n");
    for line in text.lines() {
        out.push_str("      ");
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[test]
fn https_listener_reads_the_header_before_the_handshake() {
    let up = Upstream::start("u", Behaviour::Echo);
    let pps = free_port();
    let routes = format!(
        "ssls:\n  - id: \"1\"\n    sni: \"server.local\"\n    cert: {}    key: {}\
         routes:\n  - id: pp\n    uri: /pp\n    plugins:\n      proxy-rewrite:\n        headers:\n          set:\n            X-PP: \"$proxy_protocol_addr $scheme\"\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{}\": 1\n",
        pem_block("server.crt"),
        pem_block("server.key"),
        up.node()
    );
    let _gw = Gateway::start_full(
        &routes,
        &format!("proxy_protocol:\n  listen_https_port: {pps}"),
        "",
    );
    let front = proxy_in_front(
        pps,
        v2_tcp4(
            "198.51.100.7:56324".parse().unwrap(),
            "10.0.0.1:443".parse().unwrap(),
        ),
    );
    let mut body = String::new();
    let ok = poll_until(Duration::from_secs(10), || {
        let out = Command::new(support::debian::require("curl"))
            .args(["-sk", "--max-time", "5", "--resolve"])
            .arg(format!("server.local:{front}:127.0.0.1"))
            .arg(format!("https://server.local:{front}/pp"))
            .stderr(Stdio::null())
            .output()
            .unwrap();
        body = String::from_utf8_lossy(&out.stdout).into_owned();
        out.status.success() && !body.is_empty()
    });
    assert!(
        ok.is_some(),
        "no answer through the HTTPS PROXY listener: {body}"
    );
    let echoed: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echoed["headers"]["x-pp"], "198.51.100.7 https");
    // A TLS client without the header is closed before any handshake.
    assert!(closed_unanswered(pps, b"\x16\x03\x01\x00\x05hello"));
}

/// A TCP upstream that reads the PROXY v1 line the gateway sends, then answers
/// `<name> saw <the line>` and echoes what follows.
fn pp_upstream(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    return;
                }
                let mut conn = conn;
                let _ = conn.write_all(format!("{name} saw {}\n", line.trim_end()).as_bytes());
                let mut buf = [0u8; 1024];
                while let Ok(n) = reader.read(&mut buf) {
                    if n == 0 || conn.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A gateway with stream listeners: `stream_keys` inside `apisix:` (with `proxy_mode` set) and
/// `nginx_stream` inside `nginx_config.stream` (unindented lines).
fn start_stream_gateway(stream_keys: &str, nginx_stream: &str, apisix_yaml: &str) -> Gateway {
    let stream: String = nginx_stream.lines().map(|l| format!("  {l}\n")).collect();
    Launch::new(apisix_yaml)
        .apisix_keys(&format!("proxy_mode: http&stream\n{stream_keys}"))
        .nginx_keys(&format!("stream:\n{stream}"))
        .start()
}

/// A connection to `port` from the client address `ip` (a loopback address other than
/// 127.0.0.1: a peer outside `real_ip_from`).
fn connect_from(ip: &str, port: u16) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stream = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::new(ip.parse().unwrap(), 0))
            .unwrap();
        socket
            .connect(SocketAddr::from(([127, 0, 0, 1], port)))
            .await
            .unwrap()
    });
    let stream = stream.into_std().unwrap();
    stream.set_nonblocking(false).unwrap();
    stream
}

/// Sends `bytes` on `s` and reads the first line answered (empty when the connection
/// closes first).
fn first_line_on(mut s: TcpStream, bytes: &[u8]) -> String {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(bytes);
    let mut line = String::new();
    let _ = BufReader::new(s).read_line(&mut line);
    line.trim_end().to_string()
}

fn first_line(port: u16, bytes: &[u8]) -> String {
    first_line_on(TcpStream::connect(("127.0.0.1", port)).unwrap(), bytes)
}

#[test]
fn stream_routes_match_the_proxy_client_and_the_upstream_reads_its_header() {
    let (a, b) = (pp_upstream("A"), pp_upstream("B"));
    let (both, plain) = (free_port(), free_port());
    let routes = format!(
        "stream_routes:\n  - id: by-client\n    remote_addr: 198.51.100.0/24\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{a}\": 1\n\
         \x20 - id: others\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{b}\": 1\n"
    );
    // Port `both` accepts and sends the header; `plain` takes the global defaults (accept
    // only). Only 127.0.0.1 is trusted to name the client.
    let stream_keys = format!(
        "proxy_protocol:\n  enable_tcp_pp: true\nstream_proxy:\n  tcp:\n\
         \x20   - addr: \"127.0.0.1:{both}\"\n      proxy_protocol_to_upstream: true\n\
         \x20   - \"127.0.0.1:{plain}\"\n"
    );
    let _gw = start_stream_gateway(&stream_keys, "real_ip_from:\n  - 127.0.0.1\n", &routes);

    let from = |ip: &str, port: u16| format!("PROXY TCP4 {ip} 10.0.0.1 56324 {port}\r\nping\n");
    let ready = poll_until(Duration::from_secs(10), || {
        !first_line(both, from("198.51.100.7", both).as_bytes()).is_empty()
    });
    assert!(ready.is_some(), "the stream route never answered");

    // The header's client matches `remote_addr`, and the upstream's header names it.
    assert_eq!(
        first_line(both, from("198.51.100.7", both).as_bytes()),
        format!("A saw PROXY TCP4 198.51.100.7 127.0.0.1 56324 {both}")
    );
    assert_eq!(
        first_line(both, from("203.0.113.5", both).as_bytes()),
        format!("B saw PROXY TCP4 203.0.113.5 127.0.0.1 56324 {both}")
    );
    // A v2 header, the bytes after it relayed.
    let mut v2 = v2_tcp4(
        "198.51.100.9:1000".parse().unwrap(),
        "10.0.0.1:9100".parse().unwrap(),
    );
    v2.extend_from_slice(b"ping\n");
    let mut s = TcpStream::connect(("127.0.0.1", both)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&v2).unwrap();
    let mut reader = BufReader::new(s);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert_eq!(
        line.trim_end(),
        format!("A saw PROXY TCP4 198.51.100.9 127.0.0.1 1000 {both}")
    );
    line.clear();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line, "ping\n");

    // From a peer outside real_ip_from the claim is not taken: the peer is the client, in
    // route matching and in the header sent on.
    let seen = first_line_on(
        connect_from("127.0.0.2", both),
        from("198.51.100.7", both).as_bytes(),
    );
    assert!(
        seen.starts_with("B saw PROXY TCP4 127.0.0.2 127.0.0.1 "),
        "{seen}"
    );
    assert!(seen.ends_with(&format!(" {both}")), "{seen}");

    // `plain` reads the header (the global default) and sends none.
    assert_eq!(
        first_line(plain, from("198.51.100.7", plain).as_bytes()),
        "A saw ping"
    );

    // Bad headers close the connection before any route runs.
    for bad in [
        &b"ping\n"[..],
        b"PROXY TCP4 198.51.100.7\r\n",
        b"PROXY TCP9 198.51.100.7 10.0.0.1 1 2\r\n",
    ] {
        assert_eq!(
            first_line(both, bad),
            "",
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
    let mut long = b"PROXY UNKNOWN ".to_vec();
    long.resize(300, b'x');
    assert_eq!(first_line(both, &long), "");
}

/// The stream relay's idle time follows the upstream's `timeout` (the larger of `send` and
/// `read`, as nginx's single stream `proxy_timeout`), not the 10-minute default.
#[test]
fn a_stream_session_idles_out_at_the_upstreams_timeout() {
    let node = pp_upstream("N");
    let port = free_port();
    let routes = format!(
        "stream_routes:\n  - id: s\n    upstream:\n      type: roundrobin\n      timeout:\n        connect: 2\n        send: 1\n        read: 2\n      nodes:\n        \"{node}\": 1\n"
    );
    let stream_keys = format!("stream_proxy:\n  tcp:\n    - \"127.0.0.1:{port}\"\n");
    let _gw = start_stream_gateway(&stream_keys, "real_ip_from: []\n", &routes);
    let ready = poll_until(Duration::from_secs(10), || {
        first_line(port, b"hello\n") == "N saw hello"
    });
    assert!(ready.is_some(), "the stream route never answered");
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"hello\n").unwrap();
    // Far below the 10-minute default: a session left at it would keep the read waiting.
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut reader = BufReader::new(s);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line, "N saw hello\n");
    // Silent both ways: the gateway closes after the idle time.
    let mut rest = Vec::new();
    let closed = reader.read_to_end(&mut rest);
    assert!(matches!(closed, Ok(0)), "{closed:?}");
}

/// ip-restriction reads the client a trusted balancer named, and limit-conn counts by
/// `$proxy_protocol_addr` (APISIX's `t/stream-plugin/limit-conn.t` key).
#[test]
fn stream_plugins_see_the_proxy_client() {
    let node = pp_upstream("N");
    let (guarded, limited) = (free_port(), free_port());
    let routes = format!(
        "stream_routes:\n  - id: guarded\n    server_port: {guarded}\n    plugins:\n      ip-restriction:\n        blacklist: [198.51.100.0/24]\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{node}\": 1\n\
         \x20 - id: limited\n    server_port: {limited}\n    plugins:\n      limit-conn:\n        conn: 1\n        burst: 0\n        default_conn_delay: 0.1\n        key: \"$proxy_protocol_addr\"\n        key_type: var_combination\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{node}\": 1\n"
    );
    let stream_keys = format!(
        "proxy_protocol:\n  enable_tcp_pp: true\nstream_proxy:\n  tcp:\n    - \"127.0.0.1:{guarded}\"\n    - \"127.0.0.1:{limited}\"\n"
    );
    let _gw = start_stream_gateway(&stream_keys, "real_ip_from:\n  - 127.0.0.1\n", &routes);
    let from = |ip: &str| format!("PROXY TCP4 {ip} 10.0.0.1 1000 2000\r\nping\n");
    let ready = poll_until(Duration::from_secs(10), || {
        first_line(guarded, from("203.0.113.5").as_bytes()) == "N saw ping"
    });
    assert!(ready.is_some(), "the stream route never answered");
    assert_eq!(first_line(guarded, from("198.51.100.7").as_bytes()), "");

    // One session from 192.0.2.1 held open: a second one from the same claimed client is
    // refused, one from another claimed client is not.
    let mut held = TcpStream::connect(("127.0.0.1", limited)).unwrap();
    held.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    held.write_all(from("192.0.2.1").as_bytes()).unwrap();
    let mut reader = BufReader::new(held.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line, "N saw ping\n");
    assert_eq!(first_line(limited, from("192.0.2.1").as_bytes()), "");
    assert_eq!(
        first_line(limited, from("192.0.2.2").as_bytes()),
        "N saw ping"
    );
    drop(reader);
    drop(held);
}

/// On a `tls: true` stream port the header comes before the handshake; with
/// `proxy_protocol_to_upstream` the node gets the trusted client's address in clear.
#[test]
fn a_tls_stream_port_reads_the_header_before_the_handshake() {
    let node = pp_upstream("N");
    let port = free_port();
    let apisix_yaml = format!(
        "ssls:\n  - id: \"1\"\n    sni: \"server.local\"\n    cert: {}    key: {}\
         stream_routes:\n  - id: s\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{node}\": 1\n",
        pem_block("server.crt"),
        pem_block("server.key"),
    );
    let stream_keys = format!(
        "stream_proxy:\n  tcp:\n    - addr: \"127.0.0.1:{port}\"\n      tls: true\n      proxy_protocol: true\n      proxy_protocol_to_upstream: true\n"
    );
    let _gw = start_stream_gateway(&stream_keys, "real_ip_from:\n  - 127.0.0.1\n", &apisix_yaml);
    let front = proxy_in_front(
        port,
        v2_tcp4(
            "198.51.100.7:56324".parse().unwrap(),
            "10.0.0.1:9100".parse().unwrap(),
        ),
    );
    // curl speaks TLS through the balancer; the node's answer is not HTTP, so --http0.9.
    let mut body = String::new();
    let ok = poll_until(Duration::from_secs(10), || {
        let out = Command::new(support::debian::require("curl"))
            .args(["-sk", "--http0.9", "--max-time", "3", "--resolve"])
            .arg(format!("server.local:{front}:127.0.0.1"))
            .arg(format!("https://server.local:{front}/"))
            .stderr(Stdio::null())
            .output()
            .unwrap();
        body = String::from_utf8_lossy(&out.stdout).into_owned();
        !body.is_empty()
    });
    assert!(ok.is_some(), "no answer through the TLS stream port");
    assert_eq!(
        body.lines().next(),
        Some(format!("N saw PROXY TCP4 198.51.100.7 127.0.0.1 56324 {port}").as_str()),
        "{body}"
    );
    assert!(body.contains("GET / HTTP/1.1"), "{body}");
}

/// One TLV: type, 16-bit length, value.
fn tlv(kind: u8, value: &[u8]) -> Vec<u8> {
    let mut out = vec![kind];
    out.extend_from_slice(&u16::try_from(value.len()).unwrap().to_be_bytes());
    out.extend_from_slice(value);
    out
}

/// nginx's `$proxy_protocol_tlv_<name>` on a stream port: a v2 header's TLVs, by name, by
/// `0x<type>` and within the SSL TLV, in a stream syslog entry's `log_format`.
#[test]
fn stream_log_format_reads_the_v2_tlvs() {
    let up = pp_upstream("A");
    let port = free_port();
    let syslog = UdpSocket::bind("127.0.0.1:0").unwrap();
    syslog
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let routes = format!(
        "stream_routes:\n  - id: tlv\n    plugins:\n      syslog:\n        host: 127.0.0.1\n        port: {syslog}\n        sock_type: udp\n        batch_max_size: 1\n        log_format:\n          alpn: $proxy_protocol_tlv_alpn\n          authority: $proxy_protocol_tlv_0x02\n          cn: $proxy_protocol_tlv_ssl_cn\n          verify: $proxy_protocol_tlv_ssl_verify\n          custom: $proxy_protocol_tlv_0xe0\n          missing: $proxy_protocol_tlv_netns\n          client: $proxy_protocol_addr\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{up}\": 1\n",
        syslog = syslog.local_addr().unwrap().port(),
    );
    let stream_keys = format!(
        "stream_proxy:\n  tcp:\n    - addr: \"127.0.0.1:{port}\"\n      proxy_protocol: true\n"
    );
    let _gw = start_stream_gateway(&stream_keys, "", &routes);

    // PP2_TYPE_SSL: client flags, verify 0, then the CN sub-TLV.
    let mut ssl = vec![0x07, 0, 0, 0, 0];
    ssl.extend(tlv(0x22, b"client.example"));
    let mut tlvs = tlv(0x01, b"h2");
    tlvs.extend(tlv(0x02, b"svc.example"));
    tlvs.extend(tlv(0x20, &ssl));
    tlvs.extend(tlv(0xe0, b"custom-value"));
    let mut header = v2_tcp4(
        "198.51.100.9:1000".parse().unwrap(),
        "10.0.0.1:9100".parse().unwrap(),
    );
    let len = u16::from_be_bytes([header[14], header[15]]) + u16::try_from(tlvs.len()).unwrap();
    header[14..16].copy_from_slice(&len.to_be_bytes());
    header.extend_from_slice(&tlvs);
    header.extend_from_slice(b"ping\n");
    let answered = poll_until(Duration::from_secs(10), || {
        first_line(port, &header) == "A saw ping"
    });
    assert!(answered.is_some(), "the stream route never answered");

    let mut buf = vec![0u8; 65536];
    let n = syslog.recv(&mut buf).expect("a syslog entry");
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    let json = text
        .split_once(" - - ")
        .map(|(_, j)| j.trim())
        .unwrap_or("");
    let entry: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(entry["alpn"], "h2", "{entry}");
    assert_eq!(entry["authority"], "svc.example", "{entry}");
    assert_eq!(entry["cn"], "client.example", "{entry}");
    assert_eq!(entry["verify"], "0", "{entry}");
    assert_eq!(entry["custom"], "custom-value", "{entry}");
    assert!(entry.get("missing").is_none_or(Value::is_null), "{entry}");
    assert_eq!(entry["client"], "198.51.100.9", "{entry}");
}
