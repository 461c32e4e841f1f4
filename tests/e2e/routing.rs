//! End-to-end routing: the path patterns of spec data-plane §2.2, the match precedence of §2.3
//! and the conditions of §2.4, against the real binary with each router of §2.1.
use crate::support;

use serde_json::{json, Value};
use support::*;

/// A gateway whose routes each proxy to an echo upstream of their own, named after the route id
/// (so the `X-Upstream` answer header tells which route matched).
struct Routes {
    gw: Gateway,
    _upstreams: Vec<Upstream>,
}

impl Routes {
    fn start(routes: Value) -> Routes {
        Self::start_with(json!({ "routes": routes }), "")
    }

    /// `doc` is the whole standalone file; routes without an upstream or service get one.
    /// `apisix_keys` go inside config.yaml's `apisix:` section.
    fn start_with(mut doc: Value, apisix_keys: &str) -> Routes {
        let mut upstreams = Vec::new();
        for route in doc["routes"].as_array_mut().unwrap() {
            if route.get("upstream").is_none() && route.get("service_id").is_none() {
                let up = Upstream::start(route["id"].as_str().unwrap(), Behaviour::Echo);
                route["upstream"] = json!({ "type": "roundrobin", "nodes": { up.node(): 1 } });
                upstreams.push(up);
            }
        }
        let gw = Gateway::start_full(&doc.to_string(), apisix_keys, "");
        Routes {
            gw,
            _upstreams: upstreams,
        }
    }

    /// The id of the route that served `method path` with these headers, or `"404"`.
    fn hit(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> String {
        let reply = request(self.gw.addr(), method, path, headers, b"");
        match reply.header("X-Upstream") {
            Some(name) => {
                assert_eq!(reply.status, 200, "{method} {path}: {}", reply.text());
                name.to_string()
            }
            None => {
                assert_eq!(
                    reply.status, 404,
                    "{method} {path}: unexpected answer {reply:?}"
                );
                "404".to_string()
            }
        }
    }

    fn get(&self, path: &str) -> String {
        self.hit("GET", path, &[])
    }

    fn get_host(&self, path: &str, host: &str) -> String {
        self.hit("GET", path, &[("Host", host)])
    }
}

#[test]
fn exact_path_beats_prefix_even_with_higher_priority() {
    let r = Routes::start(json!([
        { "id": "prefix", "uri": "/foo*", "priority": 100 },
        { "id": "exact", "uri": "/foo", "priority": 0 },
    ]));
    assert_eq!(r.get("/foo"), "exact");
    assert_eq!(r.get("/foo?x=1"), "exact", "the query string takes no part");
    assert_eq!(r.get("/foobar"), "prefix");
    assert_eq!(r.get("/foo/"), "prefix");
}

#[test]
fn exact_route_failing_its_filters_falls_back_to_prefixes() {
    let r = Routes::start(json!([
        { "id": "exact_put", "uri": "/api/v1/x", "methods": ["PUT"] },
        { "id": "prefix", "uri": "/api/*" },
    ]));
    assert_eq!(r.hit("PUT", "/api/v1/x", &[]), "exact_put");
    assert_eq!(r.get("/api/v1/x"), "prefix");
}

#[test]
fn longest_prefix_first_with_fallback_to_shorter() {
    let r = Routes::start(json!([
        { "id": "short", "uri": "/api/*" },
        { "id": "long_post", "uri": "/api/v1/*", "methods": ["POST"] },
        { "id": "long_vars", "uri": "/api/v2/*", "vars": [["arg_beta", "==", "1"]] },
        { "id": "long_lan", "uri": "/api/v3/*", "remote_addrs": ["10.0.0.0/8"] },
        { "id": "longest", "uri": "/api/v1/deep/*" },
    ]));
    // Longest stored prefix wins when its conditions hold ...
    assert_eq!(r.hit("POST", "/api/v1/x", &[]), "long_post");
    assert_eq!(r.get("/api/v1/deep/x"), "longest");
    assert_eq!(r.hit("POST", "/api/v1/deep/x", &[]), "longest");
    // ... and each failing condition falls back to the shorter prefix.
    assert_eq!(r.get("/api/v1/x"), "short", "methods fail");
    assert_eq!(r.get("/api/v2/x?beta=1"), "long_vars");
    assert_eq!(r.get("/api/v2/x?beta=2"), "short", "vars fail");
    assert_eq!(
        r.hit("GET", "/api/v3/x", &[("X-Real-IP", "10.1.2.3")]),
        "long_lan"
    );
    assert_eq!(
        r.hit("GET", "/api/v3/x", &[("X-Real-IP", "192.168.1.1")]),
        "short",
        "remote_addrs fail"
    );
    assert_eq!(r.get("/api/v3/x"), "short", "127.0.0.1 is outside 10/8");
    assert_eq!(r.get("/api"), "404", "/api/* does not match /api");
}

#[test]
fn star_suffix_is_a_character_prefix() {
    let r = Routes::start(json!([{ "id": "star", "uri": "/foo*" }]));
    for path in ["/foo", "/foo/", "/foobar", "/foo/a/b"] {
        assert_eq!(r.get(path), "star", "{path}");
    }
    assert_eq!(r.get("/fo"), "404");
}

#[test]
fn slash_star_needs_the_slash() {
    let r = Routes::start(json!([{ "id": "slash", "uri": "/foo/*" }]));
    for path in ["/foo/", "/foo/a/b"] {
        assert_eq!(r.get(path), "slash", "{path}");
    }
    for path in ["/foo", "/foobar"] {
        assert_eq!(r.get(path), "404", "{path}");
    }
}

#[test]
fn star_and_slash_star_together_longer_prefix_first() {
    let r = Routes::start(json!([
        { "id": "star", "uri": "/foo*", "priority": 10 },
        { "id": "slash", "uri": "/foo/*" },
    ]));
    assert_eq!(r.get("/foo"), "star");
    assert_eq!(r.get("/foobar"), "star");
    assert_eq!(
        r.get("/foo/"),
        "slash",
        "prefix /foo/ is longer than /foo, priority aside"
    );
    assert_eq!(r.get("/foo/a/b"), "slash");
}

#[test]
fn inner_star_spans_segments_and_exact_paths_are_exact() {
    let r = Routes::start(json!([
        { "id": "inner", "uri": "/a/*/b" },
        { "id": "exact", "uri": "/e" },
    ]));
    assert_eq!(r.get("/a/x/b"), "inner");
    assert_eq!(r.get("/a/x/y/b"), "inner");
    assert_eq!(r.get("/a/x/c"), "404");
    assert_eq!(r.get("/e"), "exact");
    assert_eq!(r.get("/e/"), "404", "trailing slash is significant");
    assert_eq!(r.get("/e2"), "404");
}

#[test]
fn same_entry_ties_go_to_the_longer_pattern() {
    // Both are stored at prefix `/a/`; equal priority, so the longer pattern is tried first.
    let r = Routes::start(json!([
        { "id": "short", "uri": "/a/*" },
        { "id": "long", "uri": "/a/*/b" },
    ]));
    assert_eq!(r.get("/a/x/b"), "long");
    assert_eq!(r.get("/a/x/c"), "short");
}

#[test]
fn priority_then_file_order_among_the_same_uri() {
    let r = Routes::start(json!([
        { "id": "first", "uri": "/same" },
        { "id": "second", "uri": "/same" },
        { "id": "low", "uri": "/prio*", "priority": -5 },
        { "id": "mid", "uri": "/prio*" },
        { "id": "high", "uri": "/prio*", "priority": 5 },
    ]));
    assert_eq!(
        r.get("/same"),
        "first",
        "equal priority: earlier in the file wins"
    );
    assert_eq!(r.get("/prio/x"), "high");
}

#[test]
fn priority_orders_exact_duplicates() {
    let r = Routes::start(json!([
        { "id": "early_low", "uri": "/p", "priority": 1 },
        { "id": "late_high", "uri": "/p", "priority": 2 },
        { "id": "post_only", "uri": "/p", "priority": 3, "methods": ["POST"] },
    ]));
    assert_eq!(r.get("/p"), "late_high");
    assert_eq!(r.hit("POST", "/p", &[]), "post_only");
}

#[test]
fn host_routes_before_hostless_whatever_the_priority() {
    let r = Routes::start(json!([
        { "id": "hostless", "uri": "/api/users", "priority": 100 },
        { "id": "host", "uri": "/api/*", "hosts": ["*.ex.com"] },
        { "id": "host_only_path", "uri": "/only", "host": "ex.com" },
        { "id": "fallback", "uri": "/*" },
    ]));
    assert_eq!(r.get_host("/api/users", "a.ex.com"), "host");
    assert_eq!(r.get_host("/api/users", "other.com"), "hostless");
    // Host matches but the URI does not: on to the hostless routes.
    assert_eq!(r.get_host("/api/users", "ex.com"), "hostless");
    assert_eq!(r.get_host("/only", "ex.com"), "host_only_path");
    assert_eq!(r.get_host("/only", "a.ex.com"), "fallback");
    assert_eq!(r.get_host("/nothing", "a.ex.com"), "fallback");
}

#[test]
fn exact_host_before_wildcard_host() {
    let r = Routes::start(json!([
        { "id": "wild", "uri": "/p", "hosts": ["*.ex.com"], "priority": 100 },
        { "id": "exact", "uri": "/p", "host": "api.ex.com" },
        { "id": "wild_long", "uri": "/q", "host": "*.b.ex.com" },
        { "id": "wild_short", "uri": "/q", "host": "*.ex.com", "priority": 100 },
    ]));
    assert_eq!(r.get_host("/p", "api.ex.com"), "exact");
    assert_eq!(r.get_host("/p", "www.ex.com"), "wild");
    // Wildcards by longest suffix first.
    assert_eq!(r.get_host("/q", "a.b.ex.com"), "wild_long");
    assert_eq!(r.get_host("/q", "a.c.ex.com"), "wild_short");
}

#[test]
fn wildcard_host_matching() {
    let r = Routes::start(json!([{ "id": "wild", "uri": "/w", "hosts": ["*.ex.com"] }]));
    assert_eq!(r.get_host("/w", "a.ex.com"), "wild");
    assert_eq!(r.get_host("/w", "a.b.ex.com"), "wild");
    assert_eq!(r.get_host("/w", "ex.com"), "404");
    assert_eq!(r.get_host("/w", "aex.com"), "404");
    assert_eq!(r.get_host("/w", "a.ex.com.evil"), "404");
}

#[test]
fn host_is_case_insensitive_and_port_is_ignored() {
    let r = Routes::start(json!([
        { "id": "lower", "uri": "/h", "host": "api.ex.com" },
        { "id": "upper", "uri": "/u", "hosts": ["Mixed.EX.com"] },
    ]));
    assert_eq!(r.get_host("/h", "API.Ex.COM"), "lower");
    assert_eq!(r.get_host("/h", "api.ex.com:8080"), "lower");
    assert_eq!(r.get_host("/h", "API.EX.COM:1"), "lower");
    assert_eq!(
        r.get_host("/u", "mixed.ex.com"),
        "upper",
        "route hosts are lower-cased on load"
    );
    assert_eq!(r.get_host("/h", "other.ex.com"), "404");
}

#[test]
fn methods_filter() {
    let r = Routes::start(json!([
        { "id": "get", "uri": "/m", "methods": ["GET"] },
        { "id": "post_put", "uri": "/m", "methods": ["POST", "PUT"] },
    ]));
    assert_eq!(r.get("/m"), "get");
    assert_eq!(r.hit("POST", "/m", &[]), "post_put");
    assert_eq!(r.hit("PUT", "/m", &[]), "post_put");
    assert_eq!(r.hit("DELETE", "/m", &[]), "404");
    // HEAD is not GET.
    let head = request(r.gw.addr(), "HEAD", "/m", &[], b"");
    assert_eq!(head.status, 404);
    assert_eq!(head.header("X-Upstream"), None);
}

#[test]
fn remote_addrs_with_cidr_and_trusted_x_real_ip() {
    let r = Routes::start(json!([
        { "id": "lan", "uri": "/ip", "remote_addrs": ["10.0.0.0/8", "192.168.7.7"] },
        { "id": "other", "uri": "/ip", "priority": -1 },
        { "id": "single", "uri": "/one", "remote_addr": "172.16.0.1" },
    ]));
    assert_eq!(r.hit("GET", "/ip", &[("X-Real-IP", "10.200.3.4")]), "lan");
    assert_eq!(r.hit("GET", "/ip", &[("X-Real-IP", "192.168.7.7")]), "lan");
    assert_eq!(
        r.hit("GET", "/ip", &[("X-Real-IP", "192.168.7.8")]),
        "other"
    );
    assert_eq!(r.hit("GET", "/ip", &[("X-Real-IP", "11.0.0.1")]), "other");
    assert_eq!(r.get("/ip"), "other", "the peer 127.0.0.1 itself");
    assert_eq!(
        r.hit("GET", "/one", &[("X-Real-IP", "172.16.0.1")]),
        "single"
    );
    assert_eq!(r.get("/one"), "404");
}

#[test]
fn vars_expressions() {
    let r = Routes::start(json!([
        { "id": "eq", "uri": "/v/eq", "vars": [["arg_name", "==", "jack"]] },
        { "id": "re", "uri": "/v/re", "vars": [["http_x_ver", "~~", "^v[0-9]+$"]] },
        { "id": "in", "uri": "/v/in", "vars": [["arg_k", "in", ["a", "b"]]] },
        { "id": "not", "uri": "/v/not", "vars": [["http_x_tag", "!", "==", "no"]] },
        { "id": "or", "uri": "/v/or", "vars": ["OR", ["arg_a", "==", "1"], ["arg_b", "==", "2"]] },
        { "id": "and", "uri": "/v/and", "vars": [["arg_a", "==", "1"], ["cookie_c", "==", "x"]] },
        { "id": "fallback", "uri": "/v/*", "priority": -1 },
    ]));
    assert_eq!(r.get("/v/eq?name=jack"), "eq");
    assert_eq!(r.get("/v/eq?name=rose"), "fallback");
    assert_eq!(r.get("/v/eq"), "fallback");

    assert_eq!(r.hit("GET", "/v/re", &[("X-Ver", "v12")]), "re");
    assert_eq!(
        r.hit("GET", "/v/re", &[("X-Ver", "V12")]),
        "fallback",
        "~~ is case-sensitive"
    );
    assert_eq!(r.hit("GET", "/v/re", &[("X-Ver", "v1x")]), "fallback");
    assert_eq!(r.get("/v/re"), "fallback", "absent variable");

    assert_eq!(r.get("/v/in?k=a"), "in");
    assert_eq!(r.get("/v/in?k=b"), "in");
    assert_eq!(r.get("/v/in?k=c"), "fallback");

    assert_eq!(r.hit("GET", "/v/not", &[("X-Tag", "yes")]), "not");
    assert_eq!(r.get("/v/not"), "not", "absent is not equal to \"no\"");
    assert_eq!(r.hit("GET", "/v/not", &[("X-Tag", "no")]), "fallback");

    assert_eq!(r.get("/v/or?a=1"), "or");
    assert_eq!(r.get("/v/or?b=2"), "or");
    assert_eq!(r.get("/v/or?a=2&b=1"), "fallback");

    assert_eq!(r.hit("GET", "/v/and?a=1", &[("Cookie", "c=x; d=y")]), "and");
    assert_eq!(r.get("/v/and?a=1"), "fallback");
}

#[test]
fn service_hosts_are_inherited_unless_the_route_has_its_own() {
    let svc_up = Upstream::start("svc_up", Behaviour::Echo);
    let r = Routes::start_with(
        json!({
            "services": [{
                "id": "s1",
                "hosts": ["svc.com"],
                "upstream": { "type": "roundrobin", "nodes": { svc_up.node(): 1 } },
            }],
            "routes": [
                { "id": "inherits", "uri": "/x", "service_id": "s1" },
                { "id": "own_host", "uri": "/y", "service_id": "s1", "host": "own.com" },
                { "id": "hostless", "uri": "/*", "priority": 100 },
            ],
        }),
        "",
    );
    assert_eq!(
        r.get_host("/x", "svc.com"),
        "svc_up",
        "the service's hosts file the route"
    );
    assert_eq!(r.get_host("/x", "other.com"), "hostless");
    assert_eq!(r.get_host("/y", "own.com"), "svc_up");
    assert_eq!(
        r.get_host("/y", "svc.com"),
        "hostless",
        "route's own host replaces the service's"
    );
}

#[test]
fn disabled_route_is_not_loaded() {
    let r = Routes::start(json!([
        { "id": "off", "uri": "/off", "status": 0 },
        { "id": "on", "uri": "/on", "status": 1 },
    ]));
    assert_eq!(r.get("/off"), "404");
    assert_eq!(r.get("/on"), "on");
}

#[test]
fn no_match_is_the_plain_text_json_line() {
    let r = Routes::start(json!([{ "id": "only", "uri": "/only" }]));
    let reply = get(r.gw.addr(), "/nowhere");
    assert_eq!(reply.status, 404);
    assert_eq!(reply.body, b"{\"error_msg\":\"404 Route Not Found\"}\n");
    assert_eq!(reply.body.len(), 36);
    assert_eq!(
        reply.header("Content-Type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(
        reply.header("Server"),
        Some(concat!("ferrisix/", env!("CARGO_PKG_VERSION")))
    );
    assert_eq!(reply.header("X-APISIX-Upstream-Status"), None);
}

#[test]
fn decoded_path_is_matched_and_raw_path_is_forwarded() {
    let r = Routes::start(json!([
        { "id": "hello", "uri": "/hello" },
        { "id": "ab", "uri": "/a/b" },
    ]));
    let reply = get(r.gw.addr(), "/hel%6Co");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("X-Upstream"), Some("hello"));
    assert_eq!(
        reply.json()["path"],
        "/hel%6Co",
        "the upstream gets the raw request URI"
    );

    let reply = get(r.gw.addr(), "/hel%6Co?q=%20x");
    assert_eq!(reply.header("X-Upstream"), Some("hello"));
    assert_eq!(reply.json()["path"], "/hel%6Co?q=%20x");

    let reply = get(r.gw.addr(), "//hello");
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("X-Upstream"), Some("hello"));
    assert_eq!(reply.json()["path"], "//hello");

    assert_eq!(r.get("/a%2Fb"), "ab", "%2F is decoded before matching");
    assert_eq!(r.get("/x/../hello"), "hello", "dot segments are resolved");
}

#[test]
fn colon_is_literal_in_the_default_router() {
    let r = Routes::start(
        json!([{ "id": "lit", "uri": "/file:list" }, { "id": "u", "uri": "/u/:id" }]),
    );
    assert_eq!(r.get("/file:list"), "lit");
    assert_eq!(r.get("/u/:id"), "u");
    assert_eq!(r.get("/u/7"), "404");
}

#[test]
fn radixtree_uri_treats_hosts_as_a_filter() {
    let r = Routes::start_with(
        json!({ "routes": [
            { "id": "hostless", "uri": "/api/users", "priority": 100 },
            { "id": "host", "uri": "/api/*", "hosts": ["*.ex.com"] },
            { "id": "low", "uri": "/h", "host": "a.ex.com" },
            { "id": "high", "uri": "/h", "host": "*.ex.com", "priority": 10 },
            { "id": "with_port", "uri": "/port", "host": "a.ex.com:8080" },
        ]}),
        "router:\n  http: radixtree_uri",
    );
    // One URI tree: the exact hostless path wins over the host route's prefix.
    assert_eq!(r.get_host("/api/users", "a.ex.com"), "hostless");
    assert_eq!(r.get_host("/api/other", "a.ex.com"), "host");
    assert_eq!(r.get_host("/api/other", "b.com"), "404");
    // Hosts only filter candidates of one path entry: priority decides, not host exactness.
    assert_eq!(r.get_host("/h", "a.ex.com"), "high");
    assert_eq!(r.get_host("/h", "b.ex.com"), "high");
    // A route host with a port is compared with the raw Host header.
    assert_eq!(r.get_host("/port", "a.ex.com:8080"), "with_port");
    assert_eq!(r.get_host("/port", "a.ex.com"), "404");
}

#[test]
fn radixtree_host_uri_never_matches_a_host_with_port() {
    let r = Routes::start(json!([{ "id": "with_port", "uri": "/port", "host": "a.ex.com:8080" }]));
    assert_eq!(r.get_host("/port", "a.ex.com:8080"), "404");
    assert_eq!(r.get_host("/port", "a.ex.com"), "404");
}

#[test]
fn radixtree_uri_with_parameter() {
    let r = Routes::start_with(
        json!({ "routes": [
            { "id": "param", "uri": "/u/:id" },
            { "id": "rest", "uri": "/r/:id/*act" },
            { "id": "exact", "uri": "/u/me" },
            { "id": "star", "uri": "/s/*" },
        ]}),
        "router:\n  http: radixtree_uri_with_parameter",
    );
    assert_eq!(r.get("/u/7"), "param");
    assert_eq!(r.get("/u/abc"), "param");
    assert_eq!(r.get("/u/me"), "exact");
    assert_eq!(r.get("/u/"), "404");
    assert_eq!(r.get("/u/7/x"), "404");
    assert_eq!(r.get("/u//"), "404");
    assert_eq!(r.get("/r/7/"), "rest");
    assert_eq!(r.get("/r/7/send/x"), "rest");
    assert_eq!(r.get("/r/7"), "404");
    assert_eq!(r.get("/s/anything/here"), "star");
}
