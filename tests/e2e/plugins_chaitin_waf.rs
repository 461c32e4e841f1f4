//! chaitin-waf end to end: the gateway asks an in-test SafeLine detection engine about each
//! request over T1K. The engine decodes what it gets with its own reader of the protocol (a
//! five-byte head per section: tag with the first/last bits, little-endian length) and checks
//! the sections (the request head, the body cut to `req_body_size`, the extra facts with the
//! client and local addresses, the version), then answers pass, block, nothing, or garbage.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{self, get, request, Behaviour, Gateway, Upstream};

const BLOCK_BODY: &str = "{\"code\": 403, \"success\":false, \"message\": \"blocked by Chaitin SafeLine Web Application Firewall\", \"event_id\": \"b3c6ce574dc24f09a01f634a39dca83b\"}\n";

/// What the engine answers.
#[derive(Clone)]
enum Verdict {
    Pass,
    /// `?`, status 403, a session cookie and the block page naming the event id.
    Block,
    /// Reads the request and never answers.
    Silent,
    /// These bytes, then the connection is closed.
    Raw(Vec<u8>),
}

/// One request as the engine decoded it: its sections, tags as sent (first/last bits kept).
#[derive(Debug, Clone)]
struct Msg {
    sections: Vec<(u8, Vec<u8>)>,
}

impl Msg {
    fn section(&self, tag: u8) -> Option<&[u8]> {
        self.sections
            .iter()
            .find(|(t, _)| t & 0x3f == tag)
            .map(|(_, d)| d.as_slice())
    }

    fn head(&self) -> String {
        String::from_utf8_lossy(self.section(0x01).expect("a head section")).into_owned()
    }

    fn body(&self) -> Option<Vec<u8>> {
        self.section(0x02).map(<[u8]>::to_vec)
    }

    /// The extra section's `key value \n` entries.
    fn extra(&self) -> HashMap<u8, String> {
        let data = self.section(0x03).expect("an extra section");
        data.split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| (l[0], String::from_utf8_lossy(&l[1..]).into_owned()))
            .collect()
    }
}

fn frame(tag: u8, data: &[u8]) -> Vec<u8> {
    let mut v = vec![tag];
    v.extend_from_slice(&(data.len() as u32).to_le_bytes());
    v.extend_from_slice(data);
    v
}

/// Reads one T1K message: sections until the one with the last bit; `None` at the end of the
/// connection.
fn read_msg(s: &mut impl Read) -> Option<Msg> {
    let mut sections = Vec::new();
    loop {
        let mut head = [0u8; 5];
        s.read_exact(&mut head).ok()?;
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut data = vec![0u8; len];
        s.read_exact(&mut data).ok()?;
        sections.push((head[0], data));
        if head[0] & 0x80 != 0 {
            return Some(Msg { sections });
        }
    }
}

fn answer(v: &Verdict) -> Vec<u8> {
    match v {
        Verdict::Pass => [frame(0x41, b"."), frame(0xa5, b"{\"event_id\":\"1e90\"}")].concat(),
        Verdict::Block => [
            frame(0x41, b"?"),
            frame(0x02, b"403"),
            frame(0x25, b"{\"event_id\":\"b3c6ce574dc24f09a01f634a39dca83b\"}"),
            frame(
                0x23,
                b"Set-Cookie:sl-session=ulgbPfMSuWRNsi/u7Aj9aA==; Path=/; Max-Age=86400\n",
            ),
            frame(0xa4, b"<!-- event_id: b3c6ce574dc24f09a01f634a39dca83b -->"),
        ]
        .concat(),
        Verdict::Silent => Vec::new(),
        Verdict::Raw(b) => b.clone(),
    }
}

/// An in-test detection engine on TCP or a Unix socket.
struct Engine {
    /// The metadata node: `{"host": ..., "port": ...}`.
    node: Value,
    seen: Arc<Mutex<Vec<Msg>>>,
    conns: Arc<AtomicUsize>,
    _dir: Option<tempfile::TempDir>,
}

fn serve<S: Read + Write>(mut s: S, verdict: &Verdict, seen: &Mutex<Vec<Msg>>) {
    while let Some(m) = read_msg(&mut s) {
        seen.lock().unwrap().push(m);
        match verdict {
            Verdict::Silent => {
                std::thread::sleep(Duration::from_secs(5));
                return;
            }
            Verdict::Raw(_) => {
                let _ = s.write_all(&answer(verdict));
                return;
            }
            _ => {
                if s.write_all(&answer(verdict)).is_err() {
                    return;
                }
            }
        }
    }
}

impl Engine {
    fn start(verdict: Verdict) -> Engine {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let conns = Arc::new(AtomicUsize::new(0));
        let (s2, c2) = (seen.clone(), conns.clone());
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                c2.fetch_add(1, Ordering::SeqCst);
                let (v, seen) = (verdict.clone(), s2.clone());
                std::thread::spawn(move || serve(s, &v, &seen));
            }
        });
        Engine {
            node: json!({"host": "127.0.0.1", "port": port}),
            seen,
            conns,
            _dir: None,
        }
    }

    fn start_unix(verdict: Verdict) -> Engine {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("safeline.sock");
        let l = UnixListener::bind(&path).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let conns = Arc::new(AtomicUsize::new(0));
        let (s2, c2) = (seen.clone(), conns.clone());
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                c2.fetch_add(1, Ordering::SeqCst);
                let (v, seen) = (verdict.clone(), s2.clone());
                std::thread::spawn(move || serve(s, &v, &seen));
            }
        });
        Engine {
            node: json!({"host": format!("unix:{}", path.display()), "port": 8000}),
            seen,
            conns,
            _dir: Some(dir),
        }
    }

    fn seen(&self) -> Vec<Msg> {
        self.seen.lock().unwrap().clone()
    }

    fn server(&self) -> String {
        format!(
            "{}:{}",
            self.node["host"].as_str().unwrap(),
            self.node["port"]
        )
    }
}

/// A gateway with `metadata` (`None`: none) and route `/*` with chaitin-waf `conf` to `up`.
fn gateway(up: &Upstream, conf: Value, metadata: Option<Value>) -> Gateway {
    let mut c = json!({"routes": [{"id": "1", "uri": "/*",
        "plugins": {"chaitin-waf": conf},
        "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}]});
    if let Some(mut m) = metadata {
        m["id"] = json!("chaitin-waf");
        c["plugin_metadata"] = json!([m]);
    }
    Gateway::start(&c.to_string())
}

fn meta(engines: &[&Engine], extra: Value) -> Value {
    let mut m = json!({"nodes": engines.iter().map(|e| e.node.clone()).collect::<Vec<_>>()});
    for (k, v) in extra.as_object().unwrap() {
        m[k] = v.clone();
    }
    m
}

fn waf(r: &support::Reply) -> (Option<&str>, Option<&str>, Option<&str>) {
    (
        r.header("x-apisix-chaitin-waf"),
        r.header("x-apisix-chaitin-waf-status"),
        r.header("x-apisix-chaitin-waf-action"),
    )
}

#[test]
fn passes_and_sends_the_engine_the_request() {
    let up = Upstream::start("up", Behaviour::Echo);
    let engine = Engine::start(Verdict::Pass);
    let gw = gateway(&up, json!({}), Some(meta(&[&engine], json!({}))));

    let r = request(gw.addr(), "GET", "/hello?a=1", &[("X-Test", "v1")], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(waf(&r), (Some("yes"), Some("200"), Some("pass")));
    let time = r
        .header("x-apisix-chaitin-waf-time")
        .expect("a time header");
    assert!(time.parse::<u64>().is_ok(), "{time}");
    assert_eq!(
        r.header("x-apisix-chaitin-waf-server"),
        None,
        "debug headers off"
    );
    assert_eq!(r.header("x-apisix-chaitin-waf-error"), None);

    let seen = engine.seen();
    assert_eq!(seen.len(), 1);
    let m = &seen[0];
    // Head, extra, version; no body section for a GET without one. The first bit on the
    // first section only, the last bit on the last only.
    let tags: Vec<u8> = m.sections.iter().map(|s| s.0).collect();
    assert_eq!(tags, [0x41, 0x03, 0xa0]);
    assert_eq!(m.section(0x20), Some(&b"Proto:3\n"[..]));
    let head = m.head();
    assert!(head.starts_with("GET /hello?a=1 HTTP/1.1\r\n"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("\r\nx-test: v1\r\n"),
        "{head}"
    );
    assert!(head.ends_with("\r\n\r\n"), "{head}");
    let extra = m.extra();
    assert_eq!(extra.get(&0x01).map(String::as_str), Some(""));
    assert_eq!(extra[&0x13], "127.0.0.1", "remote addr");
    assert!(extra[&0x11].parse::<u16>().unwrap() > 0, "remote port");
    assert_eq!(extra[&0x14], "127.0.0.1", "local addr");
    assert_eq!(extra[&0x12], gw.addr().port().to_string(), "local port");
    assert_eq!(extra[&0x15], "_");
    assert_eq!(extra[&0x16], "http");
    assert!(!extra[&0x17].is_empty(), "proxy name");
    let uuid = &extra[&0x18];
    assert!(
        uuid.len() == 32 && uuid.bytes().all(|b| b.is_ascii_hexdigit()),
        "{uuid}"
    );
    assert_eq!((extra[&0x19].as_str(), extra[&0x1a].as_str()), ("n", "n"));
    assert!(extra[&0x1b].parse::<u64>().unwrap() > 1_600_000_000_000_000);

    // A body goes in its own section, and upstream whole.
    let r = request(gw.addr(), "POST", "/form", &[], b"a=1 and 1=1");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["body_len"], json!(11), "{}", r.text());
    let m = engine.seen().pop().unwrap();
    assert_eq!(m.body().as_deref(), Some(&b"a=1 and 1=1"[..]));
    assert!(m.head().starts_with("POST /form HTTP/1.1\r\n"));
    assert_eq!(m.sections.first().unwrap().0, 0x41);
    // Requests one after the other reuse the engine connection.
    get(gw.addr(), "/again");
    assert_eq!(engine.conns.load(Ordering::SeqCst), 1);
    assert_eq!(up.hits(), 3);
}

#[test]
fn block_mode_answers_the_engine_verdict() {
    let up = Upstream::start("up", Behaviour::Echo);
    let engine = Engine::start(Verdict::Block);
    let gw = gateway(
        &up,
        json!({"append_waf_debug_header": true}),
        Some(meta(&[&engine], json!({"mode": "block"}))),
    );
    let r = get(gw.addr(), "/hello");
    assert_eq!(r.status, 403);
    assert_eq!(r.text(), BLOCK_BODY);
    assert_eq!(waf(&r), (Some("yes"), Some("403"), Some("reject")));
    assert!(r.header("x-apisix-chaitin-waf-time").is_some());
    assert_eq!(r.header("x-apisix-chaitin-waf-server"), Some("127.0.0.1"));
    // The engine's session cookie goes on the answer.
    assert_eq!(
        r.header("set-cookie"),
        Some("sl-session=ulgbPfMSuWRNsi/u7Aj9aA==; Path=/; Max-Age=86400")
    );
    assert_eq!(up.hits(), 0);
}

#[test]
fn route_mode_wins_over_the_metadata_mode() {
    let up = Upstream::start("up", Behaviour::Echo);
    let engine = Engine::start(Verdict::Block);
    // The metadata blocks, the route only monitors.
    let gw = gateway(
        &up,
        json!({"mode": "monitor"}),
        Some(meta(&[&engine], json!({"mode": "block"}))),
    );
    let r = get(gw.addr(), "/hello");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(waf(&r), (Some("yes"), Some("403"), Some("reject")));
    assert_eq!(
        r.header("set-cookie"),
        None,
        "the engine's headers only when blocking"
    );
    assert_eq!(up.hits(), 1);

    // Neither sets a mode: monitor.
    let gw = gateway(&up, json!({}), Some(meta(&[&engine], json!({}))));
    let r = get(gw.addr(), "/hello");
    assert_eq!(r.status, 200);
    assert_eq!(waf(&r).2, Some("reject"));

    // The metadata blocks and the route says nothing: block.
    let gw = gateway(
        &up,
        json!({}),
        Some(meta(&[&engine], json!({"mode": "block"}))),
    );
    assert_eq!(get(gw.addr(), "/hello").status, 403);
}

#[test]
fn match_off_and_the_header_switches() {
    let up = Upstream::start("up", Behaviour::Echo);
    let engine = Engine::start(Verdict::Block);
    let m = meta(&[&engine], json!({"mode": "block"}));
    let gw = gateway(
        &up,
        json!({"match": [{"vars": [["http_waf", "==", "true"]]}, {"vars": [["arg_check", "==", "1"]]}]}),
        Some(m.clone()),
    );
    let r = get(gw.addr(), "/hello");
    assert_eq!(r.status, 200);
    assert_eq!(waf(&r), (Some("no"), None, None));
    assert!(engine.seen().is_empty(), "not sent to the engine");
    let r = request(gw.addr(), "GET", "/hello", &[("waf", "true")], b"");
    assert_eq!(r.status, 403);
    assert_eq!(
        get(gw.addr(), "/hello?check=1").status,
        403,
        "any match entry"
    );
    assert_eq!(engine.seen().len(), 2);

    let gw = gateway(
        &up,
        json!({"mode": "off", "append_waf_debug_header": true}),
        Some(m.clone()),
    );
    let r = get(gw.addr(), "/hello");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-apisix-chaitin-waf"), Some("off"));
    assert_eq!(r.header("x-apisix-chaitin-waf-server"), Some("127.0.0.1"));
    assert_eq!(engine.seen().len(), 2, "off sends nothing");

    // No headers at all without append_waf_resp_header, whatever the debug switch says; the
    // engine's own headers still go on a block.
    let gw = gateway(
        &up,
        json!({"append_waf_resp_header": false, "append_waf_debug_header": true}),
        Some(m),
    );
    let r = get(gw.addr(), "/hello");
    assert_eq!(r.status, 403);
    assert!(
        r.headers
            .iter()
            .all(|(k, _)| !k.to_ascii_lowercase().starts_with("x-apisix-chaitin-waf")),
        "{:?}",
        r.headers
    );
    assert!(r.header("set-cookie").is_some());
}

#[test]
fn engine_down_slow_or_garbled() {
    let up = Upstream::start("up", Behaviour::Echo);
    let dead: Value = {
        let d = support::dead_node();
        let (h, p) = d.rsplit_once(':').unwrap();
        json!({"host": h, "port": p.parse::<u16>().unwrap()})
    };
    let dead_server = format!("{}:{}", dead["host"].as_str().unwrap(), dead["port"]);
    let debug = json!({"append_waf_debug_header": true});

    // Down: block fails the request with 500, monitor lets it through.
    let gw = gateway(
        &up,
        debug.clone(),
        Some(json!({"nodes": [dead], "mode": "block"})),
    );
    let r = get(gw.addr(), "/hello");
    assert_eq!(r.status, 500);
    assert_eq!(r.header("x-apisix-chaitin-waf"), Some("waf-err"));
    assert_eq!(
        r.header("x-apisix-chaitin-waf-error"),
        Some(
            format!("lua-resty-t1k: failed to detect the request: failed to get socket: failed to connect to t1k server {dead_server}: connection refused")
                .as_str()
        )
    );
    assert!(r.header("x-apisix-chaitin-waf-time").is_some());
    assert_eq!(r.header("x-apisix-chaitin-waf-action"), None);
    let gw = gateway(&up, json!({}), Some(json!({"nodes": [dead]})));
    let r = get(gw.addr(), "/hello");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-apisix-chaitin-waf"), Some("waf-err"));

    // Slow: past read_timeout.
    let slow = Engine::start(Verdict::Silent);
    let mut conf = debug.clone();
    conf["config"] = json!({"read_timeout": 200});
    let gw = gateway(&up, conf.clone(), Some(meta(&[&slow], json!({}))));
    let r = get(gw.addr(), "/hello");
    assert_eq!(r.status, 200, "monitor passes");
    assert_eq!(r.header("x-apisix-chaitin-waf"), Some("timeout"));
    assert_eq!(
        r.header("x-apisix-chaitin-waf-error"),
        Some(
            format!(
                "lua-resty-t1k: failed to detect the request: failed to receive info packet from t1k server {}: timeout",
                slow.server()
            )
            .as_str()
        )
    );
    conf["mode"] = json!("block");
    let gw = gateway(&up, conf, Some(meta(&[&slow], json!({}))));
    let r = get(gw.addr(), "/hello");
    assert_eq!(r.status, 500);
    assert_eq!(r.header("x-apisix-chaitin-waf"), Some("timeout"));

    // Garbage: a section without the first bit, an HTTP answer, a cut section.
    let block = json!({"mode": "block", "append_waf_debug_header": true});
    for (bytes, error) in [
        (
            frame(0x81, b"."),
            "first packet is not MASK_FIRST from t1k server",
        ),
        (b"HTTP/1.1 200 OK\r\n\r\n".to_vec(), "is too long"),
        (
            vec![0xc1, 9, 0, 0, 0, b'.'],
            "failed to receive data from t1k server",
        ),
    ] {
        let bad = Engine::start(Verdict::Raw(bytes));
        let gw = gateway(&up, block.clone(), Some(meta(&[&bad], json!({}))));
        let r = get(gw.addr(), "/hello");
        assert_eq!(r.status, 500, "{error}");
        assert_eq!(r.header("x-apisix-chaitin-waf"), Some("waf-err"));
        let e = r.header("x-apisix-chaitin-waf-error").unwrap();
        assert!(
            e.starts_with("lua-resty-t1k: failed to detect the request: "),
            "{e}"
        );
        assert!(e.contains(error), "{e}");
    }
    // The gateway itself is fine.
    let gw = gateway(&up, json!({}), Some(json!({"nodes": [dead]})));
    assert_eq!(get(gw.addr(), "/hello").status, 200);
}

#[test]
fn a_body_over_req_body_size_is_cut_for_the_engine_only() {
    let up = Upstream::start("up", Behaviour::Echo);
    let engine = Engine::start(Verdict::Pass);
    // The metadata's config, 1 KB.
    let gw = gateway(
        &up,
        json!({}),
        Some(meta(&[&engine], json!({"config": {"req_body_size": 1}}))),
    );
    let body: Vec<u8> = (0..5000).map(|i| b'a' + (i % 26) as u8).collect();
    let r = request(gw.addr(), "POST", "/upload", &[], &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["body_len"],
        json!(5000),
        "the upstream gets all of it"
    );
    let m = engine.seen().pop().unwrap();
    assert_eq!(m.body().unwrap(), &body[..1024]);
    // A route `config` replaces the metadata's: its default is 1024 KB.
    let gw = gateway(
        &up,
        json!({"config": {"read_timeout": 1000}}),
        Some(meta(&[&engine], json!({"config": {"req_body_size": 1}}))),
    );
    let r = request(gw.addr(), "POST", "/upload", &[], &body);
    assert_eq!(r.status, 200);
    assert_eq!(engine.seen().pop().unwrap().body().unwrap(), body);
}

#[test]
fn nodes_in_turn_unix_sockets_and_missing_metadata() {
    let up = Upstream::start("up", Behaviour::Echo);
    let a = Engine::start(Verdict::Pass);
    let b = Engine::start_unix(Verdict::Pass);
    let gw = gateway(
        &up,
        json!({"append_waf_debug_header": true}),
        Some(meta(&[&a, &b], json!({}))),
    );
    let mut servers = Vec::new();
    for _ in 0..4 {
        let r = get(gw.addr(), "/hello");
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-apisix-chaitin-waf"), Some("yes"));
        servers.push(r.header("x-apisix-chaitin-waf-server").unwrap().to_owned());
    }
    assert_eq!((a.seen().len(), b.seen().len()), (2, 2), "{servers:?}");
    assert!(servers.contains(&b.node["host"].as_str().unwrap().to_owned()));

    let gw = gateway(&up, json!({"append_waf_debug_header": true}), None);
    let r = get(gw.addr(), "/hello");
    assert_eq!(r.status, 500);
    assert_eq!(r.header("x-apisix-chaitin-waf"), Some("err"));
    assert_eq!(
        r.header("x-apisix-chaitin-waf-error"),
        Some("missing metadata")
    );
}

#[test]
fn real_client_ip_picks_the_address_sent() {
    let up = Upstream::start("up", Behaviour::Echo);
    let engine = Engine::start(Verdict::Pass);
    let m = meta(&[&engine], json!({}));
    for (real, want) in [(true, "192.0.2.10"), (false, "127.0.0.1")] {
        let c = json!({"routes": [{"id": "1", "uri": "/*",
            "plugins": {
                "real-ip": {"source": "http_x_forwarded_for", "trusted_addresses": ["127.0.0.1"]},
                "chaitin-waf": {"config": {"real_client_ip": real}}},
            "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}],
            "plugin_metadata": [{"id": "chaitin-waf", "nodes": m["nodes"]}]});
        let gw = Gateway::start(&c.to_string());
        let r = request(
            gw.addr(),
            "GET",
            "/hello",
            &[("X-Forwarded-For", "192.0.2.10")],
            b"",
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let extra = engine.seen().pop().unwrap().extra();
        assert_eq!(extra[&0x13], want, "real_client_ip {real}");
    }
}
