//! End-to-end standalone reload: edits to apisix.yaml apply while serving; broken files are
//! refused whole; invalid routes are skipped one by one, an earlier valid version keeping serving.
//! No speed is asserted: waits poll generously and the measured latency is printed.
use crate::support;

use std::time::Duration;

use serde_json::{json, Value};
use support::*;

/// Generous bound for a reload to show (the gateway polls every 200 ms).
const RELOAD_LIMIT: Duration = Duration::from_secs(10);
/// How long to keep checking that a refused edit changed nothing.
const SETTLE: Duration = Duration::from_millis(1500);

fn route(id: &str, uri: &str, up: &Upstream) -> Value {
    json!({ "id": id, "uri": uri, "upstream": { "type": "roundrobin", "nodes": { up.node(): 1 } } })
}

fn doc(routes: Vec<Value>) -> String {
    json!({ "routes": routes }).to_string()
}

/// Which upstream served `path` (`"404"` when none).
fn served_by(gw: &Gateway, path: &str) -> String {
    let reply = get(gw.addr(), path);
    match reply.header("X-Upstream") {
        Some(name) => name.to_string(),
        None => reply.status.to_string(),
    }
}

/// Waits until `path` is served by `expected`; panics after [`RELOAD_LIMIT`].
fn wait_served(gw: &Gateway, path: &str, expected: &str, what: &str) -> Duration {
    let took = poll_until(RELOAD_LIMIT, || served_by(gw, path) == expected).unwrap_or_else(|| {
        panic!(
            "{what}: {path} still served by {} after {RELOAD_LIMIT:?}",
            served_by(gw, path)
        )
    });
    eprintln!("reload latency ({what}): {} ms", took.as_millis());
    took
}

/// Checks for [`SETTLE`] that `path` keeps being served by `expected`.
fn stays_served(gw: &Gateway, path: &str, expected: &str, what: &str) {
    let start = std::time::Instant::now();
    while start.elapsed() < SETTLE {
        assert_eq!(served_by(gw, path), expected, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn edit_changes_routing_while_serving() {
    let a = Upstream::start("a", Behaviour::Echo);
    let b = Upstream::start("b", Behaviour::Echo);
    let gw = Gateway::start(&doc(vec![route("r1", "/x", &a)]));
    assert_eq!(served_by(&gw, "/x"), "a");
    assert_eq!(served_by(&gw, "/y"), "404");

    // Change the upstream of a route and add one.
    gw.rewrite_routes(&doc(vec![route("r1", "/x", &b), route("r2", "/y", &a)]));
    wait_served(&gw, "/x", "b", "upstream changed");
    assert_eq!(
        served_by(&gw, "/y"),
        "a",
        "the same file brought the new route"
    );

    // Remove a route.
    gw.rewrite_routes(&doc(vec![route("r2", "/y", &a)]));
    wait_served(&gw, "/x", "404", "route removed");
    assert_eq!(served_by(&gw, "/y"), "a");

    // Empty configuration.
    gw.rewrite_routes("");
    wait_served(&gw, "/y", "404", "all routes removed");
}

#[test]
fn quick_successive_edits_end_on_the_last() {
    let ups: Vec<Upstream> = (0..5)
        .map(|i| Upstream::start(&format!("u{i}"), Behaviour::Echo))
        .collect();
    let gw = Gateway::start(&doc(vec![route("r1", "/x", &ups[0])]));
    for up in &ups[1..] {
        gw.rewrite_routes(&doc(vec![route("r1", "/x", up)]));
        std::thread::sleep(Duration::from_millis(30));
    }
    wait_served(&gw, "/x", "u4", "last of quick edits");
    stays_served(&gw, "/x", "u4", "no older edit comes back");
}

#[test]
fn yaml_syntax_error_is_refused_and_old_routes_keep_serving() {
    let a = Upstream::start("a", Behaviour::Echo);
    let b = Upstream::start("b", Behaviour::Echo);
    let gw = Gateway::start(&doc(vec![route("r1", "/x", &a)]));
    gw.rewrite_routes(&format!(
        "routes:\n  - id: r1\n    uri: /x\n    upstream: {{ nodes: {{ \"{}\": 1 }}\n      bad: [\n",
        b.node()
    ));
    stays_served(
        &gw,
        "/x",
        "a",
        "a YAML syntax error must not change anything",
    );
    // The watcher is still alive: a good edit applies.
    gw.rewrite_routes(&doc(vec![route("r1", "/x", &b)]));
    wait_served(&gw, "/x", "b", "good edit after a broken one");
}

#[test]
fn file_without_end_flag_is_refused() {
    let a = Upstream::start("a", Behaviour::Echo);
    let b = Upstream::start("b", Behaviour::Echo);
    let gw = Gateway::start(&doc(vec![route("r1", "/x", &a)]));
    // Complete and valid otherwise, but a half-written file is indistinguishable without #END.
    gw.rewrite_raw(&format!("{}\n", doc(vec![route("r1", "/x", &b)])));
    stays_served(&gw, "/x", "a", "missing #END");
    gw.rewrite_raw(&format!("{}\n#EN", doc(vec![route("r1", "/x", &b)])));
    stays_served(&gw, "/x", "a", "truncated #END");
    gw.rewrite_raw(&format!("{}\n#END\n", doc(vec![route("r1", "/x", &b)])));
    wait_served(&gw, "/x", "b", "same file with #END");
}

#[test]
fn wrong_shape_is_refused_whole() {
    let a = Upstream::start("a", Behaviour::Echo);
    let gw = Gateway::start(&doc(vec![route("r1", "/x", &a)]));
    gw.rewrite_routes("routes: {\"r1\": {\"uri\": \"/x\"}}");
    stays_served(&gw, "/x", "a", "routes must be a list");
    gw.rewrite_routes("- just\n- a list\n");
    stays_served(&gw, "/x", "a", "top level must be a mapping");
}

#[test]
fn invalid_routes_are_skipped_while_the_others_update() {
    let a = Upstream::start("a", Behaviour::Echo);
    let b = Upstream::start("b", Behaviour::Echo);
    let gw = Gateway::start(&doc(vec![route("r1", "/x", &a)]));

    let mut bad_methods = route("bad_methods", "/m", &b);
    bad_methods["methods"] = json!(["FETCH"]);
    let mut no_uri = route("no_uri", "/unused", &b);
    no_uri.as_object_mut().unwrap().remove("uri");
    let mut bad_upstream = route("bad_upstream", "/u", &b);
    bad_upstream["upstream"]["nodes"] = json!({ b.node(): -1 });
    let mut bad_vars = route("bad_vars", "/v", &b);
    bad_vars["vars"] = json!(["arg_a", "==", "1"]);
    gw.rewrite_routes(&doc(vec![
        route("r1", "/x", &b),
        bad_methods,
        no_uri,
        bad_upstream,
        bad_vars,
        route("r2", "/y", &a),
    ]));
    wait_served(&gw, "/x", "b", "valid route updated next to invalid ones");
    assert_eq!(
        served_by(&gw, "/y"),
        "a",
        "valid route added next to invalid ones"
    );
    for path in ["/m", "/unused", "/u", "/v", "/v?a=1"] {
        assert_eq!(
            served_by(&gw, path),
            "404",
            "{path} comes from an invalid route"
        );
    }
}

#[test]
fn invalid_route_at_start_is_skipped() {
    let a = Upstream::start("a", Behaviour::Echo);
    let mut bad = route("bad", "/bad", &a);
    bad["methods"] = json!("GET");
    let gw = Gateway::start(&doc(vec![bad, route("good", "/good", &a)]));
    assert_eq!(served_by(&gw, "/good"), "a");
    assert_eq!(served_by(&gw, "/bad"), "404");
}

#[test]
fn route_made_invalid_keeps_serving_its_old_version() {
    let a = Upstream::start("a", Behaviour::Echo);
    let b = Upstream::start("b", Behaviour::Echo);
    let gw = Gateway::start(&doc(vec![route("r1", "/x", &a), route("r2", "/y", &a)]));
    assert_eq!(served_by(&gw, "/x"), "a");

    // r1 now points to b but has a bad methods value; r2 changes validly.
    let mut broken = route("r1", "/x", &b);
    broken["methods"] = json!(["GET", "FETCH"]);
    gw.rewrite_routes(&doc(vec![broken, route("r2", "/y", &b)]));
    wait_served(&gw, "/y", "b", "valid sibling updated");
    stays_served(&gw, "/x", "a", "the previous version of r1 keeps serving");

    // Missing uri: same.
    let mut no_uri = route("r1", "/x", &b);
    no_uri.as_object_mut().unwrap().remove("uri");
    gw.rewrite_routes(&doc(vec![no_uri, route("r2", "/y", &a)]));
    wait_served(&gw, "/y", "a", "valid sibling updated again");
    assert_eq!(served_by(&gw, "/x"), "a");

    // Fixed: the new version applies.
    gw.rewrite_routes(&doc(vec![route("r1", "/x", &b), route("r2", "/y", &a)]));
    wait_served(&gw, "/x", "b", "r1 fixed");
}

#[test]
fn upstream_made_invalid_keeps_serving_its_old_version() {
    let a = Upstream::start("a", Behaviour::Echo);
    let b = Upstream::start("b", Behaviour::Echo);
    let upstreams =
        |up: &Upstream, weight: i64| json!([{ "id": "u1", "nodes": { up.node(): weight } }]);
    let routes = json!([
        { "id": "r1", "uri": "/x", "upstream_id": "u1" },
        route("r2", "/y", &a),
    ]);
    let gw =
        Gateway::start(&json!({ "upstreams": upstreams(&a, 1), "routes": routes }).to_string());
    assert_eq!(served_by(&gw, "/x"), "a");

    let routes2 = json!([{ "id": "r1", "uri": "/x", "upstream_id": "u1" }, route("r2", "/y", &b)]);
    gw.rewrite_routes(&json!({ "upstreams": upstreams(&b, -1), "routes": routes2 }).to_string());
    wait_served(&gw, "/y", "b", "sibling route updated");
    stays_served(&gw, "/x", "a", "old upstream u1 keeps serving");
}
