//! mcp-bridge end to end: the gateway starts a real MCP server on stdio per session (written
//! with PyPI's official `mcp` SDK: tests/e2e/mcp_stdio_server.py) and bridges it over SSE to
//! clients: the SDK's own SSE client (tests/e2e/mcp_sse_client.py) listing and calling tools
//! on two sessions at once, and a raw client checking the stream's bytes, APISIX's answers to
//! bad messages and unknown sessions, and that every process ends, reaped, once its client
//! goes away.
use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

fn e2e_file(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/e2e")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// A route bridging `<base>/*` to the test's MCP server, which records its pid in `pidfile`
/// and answers `whoami` with `mark`.
fn mcp_route(id: &str, base: &str, pidfile: &Path, mark: &str) -> Value {
    json!({"id": id, "uri": format!("{base}/*"), "plugins": {"mcp-bridge": {
        "base_uri": base, "command": "python3",
        "args": [e2e_file("mcp_stdio_server.py"), pidfile.to_string_lossy(), mark]}}})
}

fn pids(pidfile: &Path) -> Vec<u32> {
    std::fs::read_to_string(pidfile)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Whether `pid` is gone: not running, and reaped (a zombie keeps its /proc entry).
fn gone(pid: u32) -> bool {
    !PathBuf::from(format!("/proc/{pid}")).exists()
}

fn assert_all_gone(pidfile: &Path, expected: usize) {
    let list = pids(pidfile);
    assert_eq!(list.len(), expected, "processes started: {list:?}");
    for pid in list {
        assert!(
            poll_until(Duration::from_secs(30), || gone(pid)).is_some(),
            "process {pid} still there (state: {:?})",
            std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()
        );
    }
}

/// The official `mcp` SDK's SSE client through the bridge: two sessions on one route at once
/// and one on another route, each with its own process (the `args` tell them apart).
#[test]
fn official_mcp_client_lists_and_calls_tools() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (dir.path().join("one.pids"), dir.path().join("two.pids"));
    let routes = json!({"routes": [
        mcp_route("a", "/mcp", &one, "mark-one"),
        mcp_route("b", "/tools/v1", &two, "mark-two"),
    ]});
    let gw = Gateway::start(&routes.to_string());
    let base = format!("http://{}", gw.addr());
    let out = std::process::Command::new("python3")
        .arg(e2e_file("mcp_sse_client.py"))
        .arg(format!("{base}/mcp/sse"))
        .arg(format!("{base}/mcp/sse"))
        .arg(format!("{base}/tools/v1/sse"))
        .output()
        .expect("python3 runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named 'mcp'"),
        "the mcp Python package is missing: scripts/test.sh installs it"
    );
    assert!(out.status.success(), "{stderr}");
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    let tools = json!(["add", "shout", "whoami"]);
    let expect = |add: &str, mark: &str| {
        json!({"server": "ferrisix-e2e", "tools": tools, "add": add, "whoami": mark,
               "shout": "SAY \"HI\""})
    };
    assert_eq!(
        got,
        json!([
            expect("42", "mark-one"),
            expect("43", "mark-one"),
            expect("44", "mark-two")
        ])
    );
    // The clients closed their streams: every process ends and is reaped.
    assert_all_gone(&one, 2);
    assert_all_gone(&two, 1);
}

/// A client reading an SSE stream on a raw connection (chunked transfer coding).
struct SseConn {
    stream: TcpStream,
    raw: Vec<u8>,
    text: String,
}

impl SseConn {
    fn open(addr: SocketAddr, path: &str) -> (Reply, SseConn) {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        write!(stream, "GET {path} HTTP/1.1\r\nHost: test.local\r\n\r\n").unwrap();
        let mut raw = Vec::new();
        let head_end = loop {
            if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut buf = [0u8; 4096];
            let n = stream.read(&mut buf).unwrap();
            assert!(n > 0, "closed before the head");
            raw.extend_from_slice(&buf[..n]);
        };
        let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers = lines
            .filter_map(|l| l.split_once(": "))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        raw.drain(..head_end);
        let reply = Reply {
            status,
            headers,
            body: Vec::new(),
        };
        let conn = SseConn {
            stream,
            raw,
            text: String::new(),
        };
        (reply, conn)
    }

    /// Decodes the complete chunks read so far into `text`.
    fn decode(&mut self) {
        loop {
            let Some(eol) = self.raw.windows(2).position(|w| w == b"\r\n") else {
                return;
            };
            let size = usize::from_str_radix(String::from_utf8_lossy(&self.raw[..eol]).trim(), 16)
                .unwrap();
            if self.raw.len() < eol + 2 + size + 2 {
                return;
            }
            let data = self.raw[eol + 2..eol + 2 + size].to_vec();
            self.raw.drain(..eol + 2 + size + 2);
            self.text.push_str(&String::from_utf8_lossy(&data));
        }
    }

    /// The next event, as `(type, data)`.
    fn next(&mut self) -> (String, String) {
        loop {
            self.decode();
            if let Some(i) = self.text.find("\n\n") {
                let ev: String = self.text.drain(..i + 2).collect();
                let mut kind = String::new();
                let mut data = String::new();
                for line in ev.lines() {
                    if let Some(k) = line.strip_prefix("event: ") {
                        kind = k.to_owned();
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data = d.to_owned();
                    }
                }
                return (kind, data);
            }
            let mut buf = [0u8; 4096];
            let n = self.stream.read(&mut buf).unwrap();
            assert!(n > 0, "the stream ended; left: {:?}", self.text);
            self.raw.extend_from_slice(&buf[..n]);
        }
    }

    /// The next event that is not a ping, as JSON.
    fn next_message(&mut self) -> Value {
        loop {
            let (kind, data) = self.next();
            assert_eq!(kind, "message");
            let v: Value = serde_json::from_str(&data).unwrap();
            if v["method"] != "ping" {
                return v;
            }
        }
    }
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    request(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
}

/// The stream's bytes as APISIX writes them, a session driven by hand (the server's stderr
/// arriving as notifications), APISIX's answers to what is not a session's message, and the
/// process ending once the client hangs up.
#[test]
fn raw_session_answers_and_hang_up() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("raw.pids");
    let routes = json!({"routes": [
        mcp_route("a", "/mcp", &pidfile, "raw"),
        {"id": "bad", "uri": "/bad/*", "plugins": {"mcp-bridge": {
            "base_uri": "/bad", "command": "/nonexistent/mcp-server"}}},
        {"id": "root", "uri": "/*", "plugins": {"mcp-bridge": {"command": "true"}}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    let addr = gw.addr();

    let (head, mut sse) = SseConn::open(addr, "/mcp/sse");
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-type"), Some("text/event-stream"));
    assert_eq!(head.header("cache-control"), Some("no-cache"));
    let (kind, endpoint) = sse.next();
    assert_eq!(kind, "endpoint");
    let id = endpoint
        .strip_prefix("/mcp/message?sessionId=")
        .unwrap_or_else(|| panic!("{endpoint}"))
        .to_owned();
    assert_eq!(id.len(), 36, "a UUID: {id}");
    // A ping at once, as APISIX's server loop sends its first.
    assert_eq!(
        sse.next(),
        (
            "message".to_owned(),
            "{\"jsonrpc\": \"2.0\",\"method\": \"ping\",\"id\":\"ping:1\"}".to_owned()
        )
    );

    let r = post(
        addr,
        &endpoint,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2024-11-05", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}),
    );
    assert_eq!(r.status, 202);
    assert!(r.body.is_empty(), "{}", r.text());
    let init = sse.next_message();
    assert_eq!(init["id"], 1);
    assert_eq!(init["result"]["serverInfo"]["name"], "ferrisix-e2e");
    let r = post(
        addr,
        &endpoint,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    assert_eq!(r.status, 202);
    let r = post(
        addr,
        &endpoint,
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "shout", "arguments": {"text": "a \"quoted\" word"}}}),
    );
    assert_eq!(r.status, 202);
    // The tool writes to stderr before it answers; both come, in whatever order the
    // gateway read the two pipes.
    let got = [sse.next_message(), sse.next_message()];
    let note = got
        .iter()
        .find(|m| m["method"] == "notifications/stderr")
        .expect("the stderr line as a notification");
    assert_eq!(note["params"]["content"], "a \"quoted\" word");
    let answer = got
        .iter()
        .find(|m| m["id"] == 2)
        .expect("the tool's answer");
    assert_eq!(answer["result"]["content"][0]["text"], "A \"QUOTED\" WORD");

    // APISIX's answers: an empty body is 400; unknown sessions and a missing id take the
    // message (202) and it goes nowhere; other methods and paths are 404.
    let r = request(addr, "POST", &endpoint, &[], b"");
    assert_eq!(r.status, 400);
    let unknown = "/mcp/message?sessionId=00000000-0000-4000-8000-000000000000";
    assert_eq!(post(addr, unknown, &json!({"jsonrpc": "2.0"})).status, 202);
    assert_eq!(
        post(addr, "/mcp/message", &json!({"jsonrpc": "2.0"})).status,
        202
    );
    assert_eq!(get(addr, &endpoint).status, 404);
    assert_eq!(post(addr, "/mcp/sse", &json!({})).status, 404);
    assert_eq!(get(addr, "/mcp/other").status, 404);
    assert_eq!(get(addr, "/mcp/sse/more").status, 404);
    // Without base_uri the endpoints sit at the root.
    assert_eq!(
        post(addr, "/message", &json!({"jsonrpc": "2.0"})).status,
        202
    );
    assert_eq!(get(addr, "/elsewhere/sse").status, 404);
    // A command that cannot start: 500.
    assert_eq!(get(addr, "/bad/sse").status, 500);

    // The session still works after all that.
    let r = post(
        addr,
        &endpoint,
        &json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": "whoami", "arguments": {}}}),
    );
    assert_eq!(r.status, 202);
    let who = sse.next_message();
    assert_eq!(who["id"], 3);
    assert_eq!(who["result"]["content"][0]["text"], "raw");

    // The client hangs up: the process is ended and reaped; its session is no more (a
    // message for it is taken and goes nowhere).
    drop(sse);
    assert_all_gone(&pidfile, 1);
    assert_eq!(
        post(addr, &endpoint, &json!({"jsonrpc": "2.0"})).status,
        202
    );
}

/// A gateway stopping (SIGTERM) with a session open: it stops (the open stream holds the
/// drain until `worker_shutdown_timeout`), and the session's process does not outlive it.
#[test]
fn stopping_gateway_ends_the_sessions_processes() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("stop.pids");
    let routes = json!({"routes": [mcp_route("a", "/mcp", &pidfile, "stop")]});
    let mut gw = Gateway::start(&routes.to_string());
    let (head, mut sse) = SseConn::open(gw.addr(), "/mcp/sse");
    assert_eq!(head.status, 200);
    let (kind, endpoint) = sse.next();
    assert_eq!(kind, "endpoint");
    // The process is up once it answers.
    let r = post(
        gw.addr(),
        &endpoint,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2024-11-05", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}),
    );
    assert_eq!(r.status, 202);
    assert_eq!(sse.next_message()["id"], 1);
    let pid = pids(&pidfile)[0];
    gw.signal("TERM");
    let stopped = poll_until(Duration::from_secs(60), || {
        matches!(gw.child.try_wait(), Ok(Some(_)))
    });
    assert!(stopped.is_some(), "the gateway did not stop");
    assert!(gone(pid), "process {pid} outlived the gateway");
}
