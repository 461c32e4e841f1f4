//! proxy-wasm plugins (config.yaml's `wasm.plugins`) against modules built from source by
//! `tests/wasm/build.sh` (AssemblyScript and its proxy-wasm SDK, from npm), covering the
//! behaviours of APISIX's `t/wasm/`: logging, fault injection, forward-auth through
//! `proxy_http_call`, header and body rewriting, global rules, consumers; shared data, queues
//! and ticks; and the limits, with hand-written modules that loop or grow without end.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::support::{poll_until, request, Behaviour, Gateway, Launch, Upstream};

/// The built modules' directory; builds them (once per test run).
pub(crate) fn modules() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/wasm");
        let out = Command::new("bash")
            .arg(root.join("build.sh"))
            .output()
            .expect("run tests/wasm/build.sh");
        assert!(
            out.status.success(),
            "tests/wasm/build.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let build = root.join("build");
        for wat in ["loop", "grow"] {
            let bytes = wat::parse_file(root.join(format!("wat/{wat}.wat"))).unwrap();
            std::fs::write(build.join(format!("{wat}.wasm")), bytes).unwrap();
        }
        build
    })
}

/// A gateway with every test module loaded, its log captured.
struct WasmGateway(Gateway);

const PLUGINS: &[(&str, i64, &str, &str)] = &[
    ("wasm-log", 7999, "log", "access"),
    ("wasm-fault", 7998, "fault_injection", "access"),
    ("wasm-auth", 7997, "forward_auth", "rewrite"),
    ("wasm-rewrite", 7996, "rewrite", "access"),
    ("wasm-state", 7995, "state", "access"),
    ("wasm-loop", 7994, "loop", "access"),
    ("wasm-grow", 7993, "grow", "access"),
];

impl WasmGateway {
    fn start(apisix_yaml: &str) -> WasmGateway {
        Self::try_start(apisix_yaml, "").unwrap_or_else(|e| panic!("{e}"))
    }

    /// `wasm_extra` goes under `wasm.plugins` (another plugin entry).
    fn try_start(apisix_yaml: &str, wasm_extra: &str) -> Result<WasmGateway, String> {
        let build = modules();
        let mut plugins = String::new();
        for (name, priority, file, phase) in PLUGINS {
            plugins.push_str(&format!(
                "    - name: {name}\n      priority: {priority}\n      file: {}\n      http_request_phase: {phase}\n",
                build.join(format!("{file}.wasm")).display()
            ));
        }
        plugins.push_str(wasm_extra);
        // Compiling the modules at the start takes a while on a loaded machine.
        Launch::new(apisix_yaml)
            .workers(2)
            .extra_config(&format!(
                "wasm:\n  plugins:\n{plugins}ferrisix:\n  wasm:\n    timeout: 300ms\n    max_memory: 4194304\n"
            ))
            .rust_log("info")
            .stderr_to_file()
            .ready_within(Duration::from_secs(60))
            .try_start()
            .map(WasmGateway)
    }

    fn addr(&self) -> SocketAddr {
        self.0.addr()
    }

    fn log(&self) -> String {
        self.0.error_output()
    }

    /// Waits (bounded) for the log to contain `text`.
    fn wait_log(&self, text: &str) -> String {
        poll_until(Duration::from_secs(10), || self.log().contains(text));
        let log = self.log();
        assert!(log.contains(text), "log lacks {text:?}:\n{log}");
        log
    }
}

fn route(uri: &str, upstream: &Upstream, plugins: &str) -> String {
    let id = uri.trim_start_matches('/');
    format!(
        "  - id: {id}\n    uri: {uri}\n    plugins: {plugins}\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{}\": 1\n",
        upstream.node()
    )
}

#[test]
fn logging_with_string_and_object_confs() {
    let up = Upstream::start("up", Behaviour::Echo);
    let yaml = format!(
        "routes:\n{}{}",
        route("/log", &up, r#"{"wasm-log": {"conf": "zzz"}}"#),
        route(
            "/obj",
            &up,
            r#"{"wasm-log": {"conf": {"body": "a/b", "n": 1}}}"#
        )
    );
    let gw = WasmGateway::start(&yaml);
    let r = request(gw.addr(), "GET", "/log", &[("x-test", "hello")], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["path"], "/log");
    let log = gw.wait_log("with conf zzz in http ctx");
    assert!(
        log.contains("request GET from 127.0.0.1 with x-test hello"),
        "{log}"
    );
    // An object conf is handed over JSON-encoded, as APISIX's cjson writes it.
    let r = request(gw.addr(), "GET", "/obj", &[], b"");
    assert_eq!(r.status, 200);
    gw.wait_log(r#"with conf {"body":"a/b","n":1} in http ctx"#);
    // One HTTP context per request. Each worker has its own instance of the module, which
    // numbers its contexts itself (as each nginx worker's VM does in APISIX), so an id can
    // repeat across the two workers but never within one: over five more requests, no id is
    // seen more than twice.
    let ctx_ids = |log: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.contains("with conf zzz in http ctx"))
            .filter_map(|l| l.rsplit(' ').next().map(str::to_owned))
            .collect()
    };
    let before = ctx_ids(&gw.log()).len();
    for _ in 0..5 {
        assert_eq!(request(gw.addr(), "GET", "/log", &[], b"").status, 200);
    }
    poll_until(Duration::from_secs(10), || {
        ctx_ids(&gw.log()).len() >= before + 5
    });
    let ids = ctx_ids(&gw.log());
    assert_eq!(ids.len(), before + 5, "{ids:?}");
    let mut seen: std::collections::BTreeMap<&str, usize> = Default::default();
    for id in &ids {
        *seen.entry(id.as_str()).or_default() += 1;
    }
    assert!(seen.values().all(|n| *n <= 2), "{ids:?}");
}

#[test]
fn fault_injection_answers_locally() {
    let up = Upstream::start("up", Behaviour::Echo);
    let yaml = format!(
        "routes:\n{}{}{}",
        route(
            "/hit",
            &up,
            r#"{"wasm-fault": {"conf": {"http_status": 401, "body": "HIT\n"}}}"#
        ),
        route(
            "/miss",
            &up,
            r#"{"wasm-fault": {"conf": {"http_status": 401, "body": "HIT\n", "percentage": 0}}}"#
        ),
        route(
            "/bad",
            &up,
            r#"{"wasm-fault": {"conf": {"http_status": 100}}}"#
        )
    );
    let gw = WasmGateway::start(&yaml);
    let r = request(gw.addr(), "GET", "/hit", &[], b"");
    assert_eq!((r.status, r.text().as_str()), (401, "HIT\n"));
    assert_eq!(up.hits(), 0);
    let r = request(gw.addr(), "GET", "/miss", &[], b"");
    assert_eq!(r.status, 200);
    assert_eq!(up.hits(), 1);
    // proxy_on_configure refuses the conf: APISIX's 503 and its log line.
    let r = request(gw.addr(), "GET", "/bad", &[], b"");
    assert_eq!(r.status, 503);
    let log = gw.wait_log("wasm-fault: failed to fetch wasm plugin ctx");
    assert!(log.contains("bad http_status"), "{log}");
}

/// An authorization service: `Authorization: ok` is allowed (with `X-User-ID`), anything else
/// is denied (with `X-Reason`). It keeps the heads it was sent.
fn auth_service() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { continue };
            let kept = kept.clone();
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match s.read(&mut b) {
                        Ok(1) => head.push(b[0]),
                        _ => return,
                    }
                }
                let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
                let allowed = head.contains("\r\nauthorization: ok\r\n");
                kept.lock().unwrap().push(head);
                let answer: &[u8] = if allowed {
                    b"HTTP/1.1 200 OK\r\nX-User-ID: u1\r\nContent-Length: 0\r\n\r\n"
                } else {
                    b"HTTP/1.1 403 Forbidden\r\nX-Reason: denied\r\nContent-Length: 0\r\n\r\n"
                };
                let _ = s.write_all(answer);
            });
        }
    });
    (addr, seen)
}

#[test]
fn forward_auth_through_http_call() {
    let up = Upstream::start("up", Behaviour::Echo);
    let (auth, seen) = auth_service();
    let conf = format!(
        r#"{{"wasm-auth": {{"conf": {{"uri": "http://{auth}/check", "request_headers": ["Authorization"], "upstream_headers": ["X-User-ID"], "client_headers": ["X-Reason"], "timeout": 2000}}}}}}"#
    );
    let yaml = format!("routes:\n{}", route("/private", &up, &conf));
    let gw = WasmGateway::start(&yaml);
    let r = request(
        gw.addr(),
        "GET",
        "/private?a=1",
        &[("Authorization", "ok")],
        b"",
    );
    assert_eq!(
        r.status,
        200,
        "{} {:?} {}",
        r.text(),
        seen.lock().unwrap(),
        gw.log()
    );
    assert_eq!(r.json()["headers"]["x-user-id"], "u1");
    {
        let seen = seen.lock().unwrap();
        let head = &seen[0];
        assert!(head.starts_with("get /check http/1.1"), "{head}");
        assert!(head.contains("x-forwarded-uri: /private?a=1"), "{head}");
        assert!(head.contains("x-forwarded-method: get"), "{head}");
        assert!(head.contains("x-forwarded-for: 127.0.0.1"), "{head}");
    }
    let r = request(
        gw.addr(),
        "GET",
        "/private",
        &[("Authorization", "no")],
        b"",
    );
    assert_eq!(r.status, 403);
    assert_eq!(r.header("x-reason"), Some("denied"));
    assert_eq!(up.hits(), 1);
    // The service down: the callback sees no answer and denies.
    drop(gw);
    let conf = r#"{"wasm-auth": {"conf": {"uri": "http://127.0.0.1:1/check", "timeout": 500}}}"#;
    let gw = WasmGateway::start(&format!("routes:\n{}", route("/private", &up, conf)));
    let r = request(gw.addr(), "GET", "/private", &[], b"");
    assert_eq!(r.status, 403);
}

#[test]
fn header_and_body_rewriting() {
    let up = Upstream::start("up", Behaviour::Echo);
    let req_conf = r#"{"wasm-rewrite": {"conf": {"req_headers": [{"name": "x-added", "value": "1"}], "remove_req_headers": ["x-drop"], "req_body": "replaced", "processReqBody": true}}}"#;
    let resp_conf = r#"{"wasm-rewrite": {"conf": {"headers": [{"name": "x-wasm", "value": "yes"}], "body": "new body\n"}}}"#;
    let yaml = format!(
        "routes:\n{}{}",
        route("/req", &up, req_conf),
        route("/resp", &up, resp_conf)
    );
    let gw = WasmGateway::start(&yaml);
    let r = request(
        gw.addr(),
        "POST",
        "/req",
        &[("x-drop", "1"), ("x-kept", "2")],
        b"original",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let echo = r.json();
    assert_eq!(echo["headers"]["x-added"], "1");
    assert_eq!(echo["headers"]["x-kept"], "2");
    assert!(echo["headers"].get("x-drop").is_none(), "{echo}");
    assert_eq!(echo["body"], "replaced");
    assert_eq!(echo["body_len"], 8);
    gw.wait_log("request get body: original");

    let r = request(gw.addr(), "GET", "/resp", &[], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-wasm"), Some("yes"));
    assert_eq!(r.text(), "new body\n");
}

#[test]
fn global_rules_and_consumers() {
    let up = Upstream::start("up", Behaviour::Echo);
    let yaml = format!(
        "routes:\n{}{}\
         global_rules:\n  - id: 1\n    plugins:\n      wasm-log:\n        conf: global\n\
         consumers:\n  - username: jack\n    plugins:\n      key-auth:\n        key: k1\n      wasm-fault:\n        conf:\n          http_status: 418\n          body: consumer\n",
        route("/open", &up, r#"{"wasm-log": {"conf": "route"}}"#),
        route("/auth", &up, r#"{"key-auth": {}}"#)
    );
    let gw = WasmGateway::start(&yaml);
    let r = request(gw.addr(), "GET", "/open", &[], b"");
    assert_eq!(r.status, 200);
    let log = gw.wait_log("with conf route in http ctx");
    assert!(log.contains("with conf global in http ctx"), "{log}");
    // A request no route matches still runs the global rule.
    let r = request(gw.addr(), "GET", "/nowhere", &[], b"");
    assert_eq!(r.status, 404);
    poll_until(Duration::from_secs(10), || {
        gw.log().matches("with conf global in http ctx").count() >= 2
    });
    assert_eq!(gw.log().matches("with conf global in http ctx").count(), 2);
    // The consumer's wasm plugin runs once key-auth found it.
    let r = request(gw.addr(), "GET", "/auth", &[("apikey", "k1")], b"");
    assert_eq!((r.status, r.text().as_str()), (418, "consumer"));
    assert_eq!(up.hits(), 1);
}

#[test]
fn shared_data_queues_and_ticks() {
    let up = Upstream::start("up", Behaviour::Echo);
    let yaml = format!(
        "routes:\n{}",
        route("/state", &up, r#"{"wasm-state": {"conf": "s"}}"#)
    );
    let gw = WasmGateway::start(&yaml);
    let count = |body: &str, key: &str| -> u64 {
        body.split(' ')
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {body}"))
    };
    for n in 1..=6u64 {
        let r = request(gw.addr(), "GET", "/state", &[], b"");
        assert_eq!(r.status, 200);
        let body = r.text();
        // Counted across both workers' instances, with compare-and-swap.
        assert_eq!(count(&body, "hits"), n, "{body}");
        // Each earlier request's event was dequeued by its queue's owner.
        assert_eq!(count(&body, "dequeued"), n - 1, "{body}");
    }
    let ticked = poll_until(Duration::from_secs(10), || {
        count(
            &request(gw.addr(), "GET", "/state", &[], b"").text(),
            "ticks",
        ) > 0
    });
    assert!(ticked.is_some(), "no tick counted");
    assert_eq!(up.hits(), 0);
}

/// A module that never returns, or that grows its memory without bound, answers 503 within
/// the limit while a concurrent request is served; the worker keeps serving afterwards.
fn runaway(plugin: &str, reason: &str) {
    let up = Upstream::start("up", Behaviour::Echo);
    let yaml = format!(
        "routes:\n{}{}",
        route(
            "/runaway",
            &up,
            &format!(r#"{{"{plugin}": {{"conf": "x"}}}}"#)
        ),
        route("/normal", &up, r#"{"wasm-log": {"conf": "normal"}}"#)
    );
    let gw = WasmGateway::start(&yaml);
    let addr = gw.addr();
    let runaway = std::thread::spawn(move || request(addr, "GET", "/runaway", &[], b""));
    let normal = request(addr, "GET", "/normal", &[], b"");
    assert_eq!(normal.status, 200);
    let r = runaway.join().unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    let log = gw.wait_log(&format!("{plugin}: failed to run wasm plugin"));
    assert!(log.contains(reason), "{log}");
    // Both workers keep serving, the runaway module (afresh) as well as the others.
    for _ in 0..4 {
        assert_eq!(request(addr, "GET", "/normal", &[], b"").status, 200);
        assert_eq!(request(addr, "GET", "/runaway", &[], b"").status, 503);
    }
    assert_eq!(up.hits(), 5);
}

#[test]
fn endless_loop_meets_the_deadline() {
    runaway("wasm-loop", "interrupt");
}

#[test]
fn unbounded_memory_meets_the_limit() {
    runaway("wasm-grow", "memory");
}

#[test]
fn a_module_that_is_not_proxy_wasm_fails_the_boot() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("empty.wasm");
    std::fs::write(&file, wat::parse_str("(module)").unwrap()).unwrap();
    let extra = format!(
        "    - name: not-proxy-wasm\n      priority: 1\n      file: {}\n",
        file.display()
    );
    let err = WasmGateway::try_start("routes: []", &extra)
        .err()
        .expect("the gateway refuses the module");
    assert!(
        err.contains("not-proxy-wasm") && err.contains("not a proxy-wasm module"),
        "{err}"
    );
}
