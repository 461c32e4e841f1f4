//! The external plugin runners (`ext-plugin-pre-req`, `ext-plugin-post-req`,
//! `ext-plugin-post-resp`) against a real runner: `tests/e2e/ext_plugin_runner.py`, built on
//! the protocol's published Python definitions (`a6pluginprotos` from PyPI, installed by
//! `scripts/test.sh`), started and supervised by the gateway through `ext-plugin.cmd`.

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{get, poll_until, request, Behaviour, Gateway, Reply, Upstream};

const RUNNER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/e2e/ext_plugin_runner.py"
);

fn require_python() {
    let out = Command::new("python3")
        .args(["-c", "import A6.HTTPReqCall.Req, flatbuffers"])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "the runner needs a6pluginprotos (scripts/test.sh installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// config.yaml's runner keys: the test runner under `ext-plugin.cmd`, with a short wait on it.
fn runner_config() -> String {
    format!(
        "ext-plugin:\n  cmd: [\"python3\", \"{RUNNER}\"]\nferrisix:\n  ext_plugin_timeout: 1s\n"
    )
}

fn conf(pairs: &[(&str, &str)]) -> Value {
    Value::Array(
        pairs
            .iter()
            .map(|(n, v)| json!({"name": n, "value": v}))
            .collect(),
    )
}

fn route(id: &str, uri: &str, plugins: Value, node: &str) -> Value {
    json!({"id": id, "uri": uri, "plugins": plugins, "upstream": {"nodes": {node: 1}}})
}

/// A gateway with the runner, once the runner answers (`/stats` must be among the routes).
fn start(routes: Vec<Value>) -> RunnerGateway {
    require_python();
    let gw = Gateway::start_with(&json!({ "routes": routes }).to_string(), &runner_config());
    let up = poll_until(Duration::from_secs(20), || {
        get(gw.addr(), "/stats").status == 200
    });
    assert!(up.is_some(), "the runner never answered");
    RunnerGateway(gw)
}

fn stats_route(node: &str) -> Value {
    route(
        "stats",
        "/stats",
        json!({"ext-plugin-pre-req": {"conf": conf(&[("mode", "stats")])}}),
        node,
    )
}

/// Stops the gateway with SIGTERM, so that it stops its runner, as a service manager would.
struct RunnerGateway(Gateway);

impl RunnerGateway {
    fn stop(mut self) -> std::process::ExitStatus {
        self.0.signal("TERM");
        self.0.child.wait().unwrap()
    }
}

impl Drop for RunnerGateway {
    fn drop(&mut self) {
        if let Ok(None) = self.0.child.try_wait() {
            self.0.signal("TERM");
            let _ = self.0.child.wait();
        }
    }
}

impl std::ops::Deref for RunnerGateway {
    type Target = Gateway;
    fn deref(&self) -> &Gateway {
        &self.0
    }
}

fn header_values(r: &Reply, name: &str) -> Vec<String> {
    r.headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.clone())
        .collect()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

#[test]
fn pre_req_stops_and_rewrites() {
    let up = Upstream::start("up", Behaviour::Echo);
    let node = up.node();
    let gw = start(vec![
        stats_route(&node),
        route(
            "stop",
            "/stop",
            json!({"ext-plugin-pre-req": {"conf": conf(&[("mode", "stop"), ("status", "403"), ("body", "denied")])}}),
            &node,
        ),
        route(
            "stop-empty",
            "/stop-empty",
            json!({"ext-plugin-pre-req": {"conf": conf(&[("mode", "stop")])}}),
            &node,
        ),
        route(
            "rw",
            "/rw",
            json!({"ext-plugin-pre-req": {"conf": conf(&[("mode", "rewrite"), ("path", "/rewritten")])}}),
            &node,
        ),
        route(
            "rw-body",
            "/rw-body",
            json!({"ext-plugin-pre-req": {"conf": conf(&[("mode", "rewrite"), ("body", "newbody")])}}),
            &node,
        ),
        route(
            "go-on",
            "/go-on",
            json!({"ext-plugin-pre-req": {"conf": conf(&[("mode", "continue")])}}),
            &node,
        ),
    ]);
    let r = get(gw.addr(), "/stop");
    assert_eq!(r.status, 403);
    assert_eq!(r.text(), "denied");
    assert_eq!(header_values(&r, "x-runner"), vec!["a", "b"]);
    // Status 0 is 200, as APISIX has it.
    assert_eq!(get(gw.addr(), "/stop-empty").status, 200);
    assert_eq!(up.hits(), 0, "a stopped request never goes upstream");

    let r = request(
        gw.addr(),
        "GET",
        "/rw?drop=1&keep=2",
        &[("X-Remove", "bye"), ("Host", "client.example")],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let echo = r.json();
    assert_eq!(echo["path"], "/rewritten?keep=2&added=1&multi=x&multi=y");
    assert_eq!(echo["headers"]["x-added"], "yes");
    assert_eq!(echo["headers"]["x-seen-path"], "/rw");
    assert!(echo["headers"].get("x-remove").is_none(), "{echo}");
    assert_eq!(header_values(&r, "x-resp"), vec!["r1", "r2"]);
    assert_ne!(
        r.header("content-type"),
        Some("text/evil"),
        "a runner may not set Content-Type"
    );

    let r = request(gw.addr(), "POST", "/rw-body", &[], b"old");
    assert_eq!(r.status, 200, "{}", r.text());
    let echo = r.json();
    assert_eq!(echo["body"], "newbody");
    assert_eq!(echo["path"], "/rw-body?added=1&multi=x&multi=y");

    // An answer with no action: the request goes upstream as it came.
    let hits = up.hits();
    let r = request(gw.addr(), "POST", "/go-on?a=1", &[("X-Kept", "1")], b"same");
    assert_eq!(r.status, 200, "{}", r.text());
    let echo = r.json();
    assert_eq!(echo["path"], "/go-on?a=1");
    assert_eq!(echo["headers"]["x-kept"], "1");
    assert_eq!(echo["body"], "same");
    assert_eq!(up.hits(), hits + 1);

    // What the runner was told about a request.
    let r = request(gw.addr(), "PUT", "/stats?a=1&flag&b=x%20y", &[], b"");
    let s = r.json();
    assert_eq!(s["path"], "/stats");
    assert_eq!(s["args"], json!([["a", "1"], ["flag", null], ["b", "x y"]]));
    assert_eq!(s["method"], 3, "PUT in A6.Method");
    assert_eq!(s["src_ip"], json!([127, 0, 0, 1]));
    assert_eq!(s["host"], "test.local");
    gw.stop();
}

#[test]
fn post_req_sees_the_request_after_the_other_plugins() {
    let up = Upstream::start("up", Behaviour::Echo);
    let node = up.node();
    let gw = start(vec![
        stats_route(&node),
        route(
            "post",
            "/post",
            json!({
                "proxy-rewrite": {"uri": "/from-proxy-rewrite"},
                "ext-plugin-post-req": {"conf": conf(&[("mode", "rewrite")])}
            }),
            &node,
        ),
        route(
            "post-stop",
            "/post-stop",
            json!({"ext-plugin-post-req": {"conf": conf(&[("mode", "stop"), ("status", "401"), ("body", "no")])}}),
            &node,
        ),
    ]);
    let r = get(gw.addr(), "/post");
    assert_eq!(r.status, 200, "{}", r.text());
    let echo = r.json();
    // post-req (access, -3000) runs after proxy-rewrite (rewrite phase): the runner is told
    // the rewritten path.
    assert_eq!(echo["headers"]["x-seen-path"], "/from-proxy-rewrite");
    assert_eq!(echo["path"], "/from-proxy-rewrite?added=1&multi=x&multi=y");
    let r = get(gw.addr(), "/post-stop");
    assert_eq!((r.status, r.text().as_str()), (401, "no"));
    gw.stop();
}

#[test]
fn extra_info_vars_and_request_body() {
    let up = Upstream::start("up", Behaviour::Echo);
    let node = up.node();
    let gw = start(vec![
        stats_route(&node),
        route(
            "var",
            "/var",
            json!({"ext-plugin-pre-req": {"conf": conf(&[("mode", "var"), ("vars", "remote_addr,uri,arg_x,http_x_h,arg_missing")])}}),
            &node,
        ),
        route(
            "body",
            "/body",
            json!({"ext-plugin-pre-req": {"conf": conf(&[("mode", "body")])}}),
            &node,
        ),
    ]);
    let r = request(gw.addr(), "GET", "/var?x=1", &[("X-H", "hv")], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "127.0.0.1|/var|1|hv|<none>");
    let r = request(gw.addr(), "POST", "/body", &[], b"hello runner");
    assert_eq!(r.text(), "body:hello runner");
    gw.stop();
}

#[test]
fn conf_token_not_found_prepares_again() {
    let up = Upstream::start("up", Behaviour::Echo);
    let node = up.node();
    let gw = start(vec![
        stats_route(&node),
        route(
            "forget",
            "/forget",
            json!({"ext-plugin-pre-req": {"conf": conf(&[("mode", "stats"), ("forget", "1")])}}),
            &node,
        ),
    ]);
    let before = get(gw.addr(), "/stats").json();
    let r = get(gw.addr(), "/forget");
    assert_eq!(r.status, 200, "{}", r.text());
    let s = r.json();
    // The conf was prepared, the runner forgot its token, the gateway flushed its tokens and
    // prepared it again: two prepares for one request.
    let prepares = s["prepares"].as_u64().unwrap() - before["prepares"].as_u64().unwrap();
    assert_eq!(prepares, 2, "{s}");
    let again = get(gw.addr(), "/forget").json();
    assert_eq!(again["prepares"], s["prepares"], "the new token is cached");
    let after = get(gw.addr(), "/stats").json();
    assert_eq!(
        after["prepares"].as_u64().unwrap(),
        s["prepares"].as_u64().unwrap() + 1,
        "the flush dropped every conf's token"
    );
    gw.stop();
}

#[test]
fn a_runner_killed_mid_request_is_restarted() {
    let up = Upstream::start("up", Behaviour::Echo);
    let node = up.node();
    let gw = start(vec![
        stats_route(&node),
        route(
            "die",
            "/die",
            json!({"ext-plugin-pre-req": {"conf": conf(&[("mode", "die")])}}),
            &node,
        ),
    ]);
    let first = get(gw.addr(), "/stats").json()["pid"].as_u64().unwrap() as u32;
    let r = get(gw.addr(), "/die");
    assert_eq!(r.status, 503);
    assert!(!alive(first) || poll_until(Duration::from_secs(5), || !alive(first)).is_some());
    // The supervisor starts it again; its tokens are prepared again.
    let mut second = 0;
    let back = poll_until(Duration::from_secs(20), || {
        let r = get(gw.addr(), "/stats");
        if r.status == 200 {
            second = r.json()["pid"].as_u64().unwrap() as u32;
        }
        r.status == 200
    });
    assert!(back.is_some(), "the runner was not restarted");
    assert_ne!(first, second);
    assert_eq!(up.hits(), 0);
    // On shutdown the gateway stops its runner.
    assert!(gw.stop().success());
    assert!(
        poll_until(Duration::from_secs(5), || !alive(second)).is_some(),
        "the runner outlived the gateway"
    );
}

#[test]
fn garbage_slow_and_down_runners_get_503_or_degrade() {
    let up = Upstream::start("up", Behaviour::Echo);
    let node = up.node();
    let pre = |pairs: &[(&str, &str)], degrade: bool| json!({"ext-plugin-pre-req": {"conf": conf(pairs), "allow_degradation": degrade}});
    let gw = start(vec![
        stats_route(&node),
        route(
            "garbage",
            "/garbage",
            pre(&[("mode", "garbage")], false),
            &node,
        ),
        route(
            "badtype",
            "/badtype",
            pre(&[("mode", "badtype")], false),
            &node,
        ),
        route(
            "slow",
            "/slow",
            pre(&[("mode", "slow"), ("delay", "3")], false),
            &node,
        ),
        route(
            "garbage-ok",
            "/garbage-ok",
            pre(&[("mode", "garbage")], true),
            &node,
        ),
        route(
            "slow-ok",
            "/slow-ok",
            pre(&[("mode", "slow"), ("delay", "3")], true),
            &node,
        ),
    ]);
    for path in ["/garbage", "/badtype", "/slow"] {
        let r = get(gw.addr(), path);
        assert_eq!(r.status, 503, "{path}: {}", r.text());
    }
    assert_eq!(up.hits(), 0);
    for path in ["/garbage-ok", "/slow-ok"] {
        let r = get(gw.addr(), path);
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(r.json()["path"], path);
    }
    // The runner still serves after all that.
    assert_eq!(get(gw.addr(), "/stats").status, 200);
    gw.stop();

    // No runner on the socket at all.
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("none.sock");
    let routes = json!({"routes": [
        route("down", "/down", pre(&[("mode", "stop")], false), &node),
        route("down-ok", "/down-ok", pre(&[("mode", "stop")], true), &node),
    ]});
    let gw = Gateway::start_with(
        &routes.to_string(),
        &format!("ext-plugin:\n  path_for_test: {}\n", sock.display()),
    );
    assert_eq!(get(gw.addr(), "/down").status, 503);
    assert_eq!(get(gw.addr(), "/down-ok").status, 200);
}

fn post_resp(pairs: &[(&str, &str)], degrade: bool) -> Value {
    json!({"ext-plugin-post-resp": {"conf": conf(pairs), "allow_degradation": degrade}})
}

#[test]
fn post_resp_changes_the_upstreams_answer() {
    let up = Upstream::start("up", Behaviour::Echo);
    let node = up.node();
    let gw = start(vec![
        stats_route(&node),
        route(
            "resp",
            "/resp",
            post_resp(&[("mode", "resp")], false),
            &node,
        ),
        route(
            "resp-201",
            "/resp-201",
            post_resp(&[("mode", "resp"), ("status", "201")], false),
            &node,
        ),
        route(
            "keep",
            "/keep",
            post_resp(&[("mode", "resp_keep")], false),
            &node,
        ),
        route(
            "status",
            "/status",
            post_resp(&[("mode", "resp_status"), ("status", "202")], false),
            &node,
        ),
        route(
            "req",
            "/req",
            post_resp(&[("mode", "resp_req")], false),
            &node,
        ),
    ]);

    // The runner read the body and answered it upper-cased, with headers of its own: the
    // upstream's headers are gone, the status stays the upstream's.
    let r = get(gw.addr(), "/resp");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().starts_with("{\"UPSTREAM\":\"UP\""), "{}", r.text());
    assert_eq!(header_values(&r, "x-post-resp"), vec!["yes"]);
    assert_eq!(header_values(&r, "x-upstream-status"), vec!["200"]);
    assert_eq!(header_values(&r, "content-type"), vec!["text/plain"]);
    assert!(header_values(&r, "x-upstream").is_empty());
    assert_eq!(
        header_values(&r, "content-length"),
        vec![r.body.len().to_string()]
    );
    let r = get(gw.addr(), "/resp-201");
    assert_eq!(r.status, 201);
    assert!(r.text().contains("\"PATH\":\"/RESP-201\""), "{}", r.text());

    // Nothing from the runner: the upstream's answer, without the headers APISIX excludes.
    let r = get(gw.addr(), "/keep");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["path"], "/keep");
    assert_eq!(header_values(&r, "x-upstream"), vec!["up"]);
    assert_eq!(header_values(&r, "content-type"), vec!["text/plain"]);

    // A status alone: the upstream's body goes on, unread by anyone.
    let r = get(gw.addr(), "/status");
    assert_eq!(r.status, 202);
    assert_eq!(r.json()["path"], "/status");

    // The request body and variables are there for the runner once the answer is back.
    let r = request(gw.addr(), "POST", "/req", &[], b"hello runner");
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "req:hello runner|uri:/req|upstream:200");
    assert_eq!(up.hits(), 5);
    gw.stop();
}

#[test]
fn post_resp_failures() {
    let up = Upstream::start("up", Behaviour::Echo);
    let node = up.node();
    let hangup = Upstream::start("hangup", Behaviour::Hangup);
    let gw = start(vec![
        stats_route(&node),
        route(
            "garbage",
            "/garbage",
            post_resp(&[("mode", "resp_garbage")], false),
            &node,
        ),
        route(
            "garbage-ok",
            "/garbage-ok",
            post_resp(&[("mode", "resp_garbage")], true),
            &node,
        ),
        route(
            "hangup",
            "/hangup",
            post_resp(&[("mode", "resp")], false),
            &hangup.node(),
        ),
    ]);
    // The runner's answer is not the protocol: 503, or the upstream's answer as it came.
    let r = get(gw.addr(), "/garbage");
    assert_eq!(r.status, 503, "{}", r.text());
    let r = get(gw.addr(), "/garbage-ok");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["path"], "/garbage-ok");
    assert_eq!(header_values(&r, "content-type"), vec!["application/json"]);
    let before = get(gw.addr(), "/stats").json()["calls"].as_u64().unwrap();
    // The upstream never answered: the gateway's 502, the runner not asked.
    let r = get(gw.addr(), "/hangup");
    assert_eq!(r.status, 502);
    let after = get(gw.addr(), "/stats").json()["calls"].as_u64().unwrap();
    assert_eq!(after, before + 1, "only the /stats call itself");
    gw.stop();
}
