//! APISIX's Lua-only plugins (serverless-pre-function, serverless-post-function,
//! exit-transformer, inspect, example-plugin) ported to proxy-wasm modules, as docs/wasm.md
//! shows them: the modules are built from tests/wasm/src by `tests/wasm/build.sh` and loaded
//! through config.yaml's `wasm.plugins`; each does through the gateway what its example says.

use std::time::Duration;

use crate::support::{get, poll_until, request, Behaviour, Launch, Upstream};

fn route(id: &str, uri: &str, node: &str, plugins: &str) -> String {
    format!(
        "  - id: {id}\n    uri: {uri}\n    plugins: {plugins}\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{node}\": 1\n"
    )
}

#[test]
fn lua_only_plugins_ported_to_wasm() {
    let build = crate::wasm::modules();
    let up = Upstream::start("up", Behaviour::Echo);
    let denied = Upstream::start("denied", Behaviour::Status(401));
    let yaml = format!(
        "routes:\n{}{}{}{}{}{}",
        route("pre", "/pre", &up.node(), "{wasm-pre: {conf: {on: true}}}"),
        route(
            "post",
            "/post",
            &up.node(),
            "{wasm-post: {conf: {on: true}}}"
        ),
        route(
            "exit",
            "/exit",
            &denied.node(),
            "{wasm-exit: {conf: {body: \"{\\\"error\\\":\\\"forbidden\\\"}\"}}}"
        ),
        route(
            "inspect",
            "/inspect",
            &up.node(),
            "{wasm-inspect: {conf: {path: \"/inspect?x=1\"}}}"
        ),
        route(
            "example",
            "/example",
            &up.node(),
            "{wasm-example: {conf: {i: 1, s: hello}}}"
        ),
        route(
            "bad",
            "/bad-example",
            &up.node(),
            "{wasm-example: {conf: {s: no-i}}}"
        ),
    );
    let mut plugins = String::new();
    for (name, priority, file, phase) in [
        // serverless-pre-function's priority and phase; -post's in the log phase.
        ("wasm-pre", 10000, "serverless_pre", "rewrite"),
        ("wasm-post", -2000, "serverless_post", "access"),
        ("wasm-exit", 9000, "exit_transformer", "access"),
        ("wasm-inspect", 200, "inspect", "access"),
        ("wasm-example", 0, "example_plugin", "rewrite"),
    ] {
        plugins.push_str(&format!(
            "    - name: {name}\n      priority: {priority}\n      file: {}\n      http_request_phase: {phase}\n",
            build.join(format!("{file}.wasm")).display()
        ));
    }
    let gw = Launch::new(&yaml)
        .extra_config(&format!("wasm:\n  plugins:\n{plugins}"))
        .rust_log("info")
        .stderr_to_file()
        .ready_within(Duration::from_secs(60))
        .start();
    let wait_log = |text: &str| {
        poll_until(Duration::from_secs(10), || gw.error_output().contains(text));
        let log = gw.error_output();
        assert!(log.contains(text), "log lacks {text:?}:\n{log}");
    };

    // serverless-pre-function: refuses v0, sets the version it lacked.
    let r = request(gw.addr(), "GET", "/pre", &[("x-api-version", "v0")], b"");
    assert_eq!((r.status, r.text().as_str()), (410, "v0 is gone\n"));
    let r = get(gw.addr(), "/pre");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["headers"]["x-api-version"], "v2", "{}", r.text());

    // serverless-post-function: a line per request once it is served.
    assert_eq!(get(gw.addr(), "/post?n=7").status, 200);
    wait_log("served GET /post?n=7 200");

    // exit-transformer: the 401 goes out as a 403 with the conf's body.
    let r = get(gw.addr(), "/exit");
    assert_eq!(
        (r.status, r.text().as_str()),
        (403, "{\"error\":\"forbidden\"}")
    );

    // inspect: the breakpoint's path only.
    assert_eq!(get(gw.addr(), "/inspect?x=2").status, 200);
    assert_eq!(get(gw.addr(), "/inspect?x=1").status, 200);
    wait_log("inspect /inspect?x=1: from 127.0.0.1");
    assert!(!gw.error_output().contains("inspect /inspect?x=2"));

    // example-plugin: its conf logged; a conf without `i` refused by its check.
    assert_eq!(get(gw.addr(), "/example").status, 200);
    wait_log("plugin rewrite phase, conf: {");
    assert_eq!(get(gw.addr(), "/bad-example").status, 503);
    wait_log("example-plugin: property i is required");
}
