//! Precedence and matching cases of spec §2.2–2.4 and §10, in all three modes.

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::IpAddr;

use super::*;
use crate::expr::{CmpOp, ExprValue};

const MODES: [RouterKind; 3] = [
    RouterKind::HostUri,
    RouterKind::Uri,
    RouterKind::UriWithParameter,
];

struct Vars(HashMap<String, String>);

impl VarSource for Vars {
    fn var(&self, name: &str) -> Option<Cow<'_, str>> {
        self.0.get(name).map(|v| Cow::Borrowed(v.as_str()))
    }
}

fn no_vars() -> Vars {
    Vars(HashMap::new())
}

/// A route named `id` on the given paths.
fn r(id: &'static str, paths: &[&str]) -> RouteEntry<&'static str> {
    RouteEntry::new(paths.iter().map(|p| p.to_string()).collect(), id)
}

fn with_hosts(mut e: RouteEntry<&'static str>, hosts: &[&str]) -> RouteEntry<&'static str> {
    e.hosts = hosts.iter().map(|h| h.to_string()).collect();
    e
}

fn with_priority(mut e: RouteEntry<&'static str>, p: i64) -> RouteEntry<&'static str> {
    e.priority = p;
    e
}

fn with_methods(mut e: RouteEntry<&'static str>, m: &[&str]) -> RouteEntry<&'static str> {
    e.methods = MethodSet::from_names(m.iter().copied()).unwrap();
    e
}

fn table(kind: RouterKind, entries: Vec<RouteEntry<&'static str>>) -> RouteTable<&'static str> {
    let (t, errors) = RouteTable::new(kind, entries);
    assert!(errors.is_empty(), "{errors:?}");
    t
}

/// A request builder with defaults: GET from 127.0.0.1, no Host.
#[derive(Clone, Copy)]
struct Req<'a> {
    path: &'a str,
    host: Option<&'a str>,
    host_header: Option<&'a str>,
    method: Option<Method>,
    addr: &'a str,
}

fn req(path: &str) -> Req<'_> {
    Req {
        path,
        host: None,
        host_header: None,
        method: Some(Method::Get),
        addr: "127.0.0.1",
    }
}

impl<'a> Req<'a> {
    fn host(mut self, h: &'a str) -> Self {
        self.host = Some(h);
        self
    }
    fn host_header(mut self, h: &'a str) -> Self {
        self.host_header = Some(h);
        self
    }
    fn method(mut self, m: Option<Method>) -> Self {
        self.method = m;
        self
    }
    fn addr(mut self, a: &'a str) -> Self {
        self.addr = a;
        self
    }
    fn info(&self) -> RequestInfo<'a> {
        RequestInfo {
            path: self.path,
            host: self.host,
            host_header: self.host_header,
            method: self.method,
            remote_addr: self.addr.parse::<IpAddr>().unwrap(),
        }
    }
}

/// The id of the matching route, or None.
fn hit(t: &RouteTable<&'static str>, q: Req<'_>) -> Option<&'static str> {
    hit_vars(t, q, &no_vars())
}

fn hit_vars(t: &RouteTable<&'static str>, q: Req<'_>, vars: &Vars) -> Option<&'static str> {
    let info = q.info();
    t.lookup(&info, vars).map(|m| *m.value)
}

fn path(t: &RouteTable<&'static str>, p: &str) -> Option<&'static str> {
    hit(t, req(p))
}

// ---------------------------------------------------------------- §2.2 path patterns

#[test]
fn exact_pattern() {
    for kind in MODES {
        let t = table(kind, vec![r("foo", &["/foo"])]);
        assert_eq!(path(&t, "/foo"), Some("foo"), "{kind:?}");
        assert_eq!(path(&t, "/foo/"), None);
        assert_eq!(path(&t, "/foo2"), None);
        assert_eq!(path(&t, "/fo"), None);
    }
}

#[test]
fn character_prefix_pattern() {
    for kind in MODES {
        let t = table(kind, vec![r("foo*", &["/foo*"])]);
        for p in ["/foo", "/foo/", "/foobar", "/foo/a/b"] {
            assert_eq!(path(&t, p), Some("foo*"), "{kind:?} {p}");
        }
        assert_eq!(path(&t, "/fo"), None);
        assert_eq!(path(&t, "/bar/foo"), None);
    }
}

#[test]
fn slash_star_pattern() {
    for kind in MODES {
        let t = table(kind, vec![r("foo/*", &["/foo/*"])]);
        assert_eq!(path(&t, "/foo/"), Some("foo/*"));
        assert_eq!(path(&t, "/foo/a/b"), Some("foo/*"));
        assert_eq!(path(&t, "/foo"), None, "{kind:?}");
        assert_eq!(path(&t, "/foobar"), None);
    }
}

#[test]
fn inner_star_pattern() {
    for kind in MODES {
        let t = table(kind, vec![r("a*b", &["/a/*/b"])]);
        assert_eq!(path(&t, "/a/x/b"), Some("a*b"));
        assert_eq!(path(&t, "/a/x/y/b"), Some("a*b"));
        assert_eq!(path(&t, "/a/x/c"), None, "{kind:?}");
        assert_eq!(path(&t, "/a/b"), None);
        assert_eq!(path(&t, "/a/x/b/c"), None);
    }
}

#[test]
fn star_inside_a_segment_is_a_plain_prefix() {
    // No named segment: the radix tree skips the regex check entirely.
    let t = table(RouterKind::Uri, vec![r("x", &["/foo*bar"])]);
    assert_eq!(path(&t, "/foo"), Some("x"));
    assert_eq!(path(&t, "/fooqux"), Some("x"));
}

#[test]
fn parameter_patterns() {
    let t = table(
        RouterKind::UriWithParameter,
        vec![r("id", &["/u/:id"]), r("act", &["/v/:id/*act"])],
    );
    assert_eq!(path(&t, "/u/7"), Some("id"));
    assert_eq!(path(&t, "/u/"), None);
    assert_eq!(path(&t, "/u/7/x"), None);
    assert_eq!(path(&t, "/u//"), None);
    assert_eq!(path(&t, "/v/7/"), Some("act"));
    assert_eq!(path(&t, "/v/7/send/x"), Some("act"));
    assert_eq!(path(&t, "/v/7"), None);

    let info = req("/v/7/send/x").info();
    let m = t.lookup(&info, &no_vars()).unwrap();
    assert_eq!(m.params.get("id"), Some("7"));
    assert_eq!(m.params.get("act"), Some("send/x"));
    assert_eq!(m.params.get("nope"), None);
    assert_eq!(m.matched_uri, "/v/:id/*act");
    assert_eq!(
        m.params.iter().collect::<Vec<_>>(),
        [("id", "7"), ("act", "send/x")]
    );

    let info = req("/u/42").info();
    let m = t.lookup(&info, &no_vars()).unwrap();
    assert_eq!(m.params.get("id"), Some("42"));
    assert!(!m.params.is_empty());
}

#[test]
fn many_params_spill_past_inline_storage() {
    let t = table(
        RouterKind::UriWithParameter,
        vec![r("p", &["/:a/:b/:c/:d/:e/:f"])],
    );
    let info = req("/1/2/3/4/5/6").info();
    let m = t.lookup(&info, &no_vars()).unwrap();
    let got: Vec<_> = m.params.iter().collect();
    assert_eq!(
        got,
        [
            ("a", "1"),
            ("b", "2"),
            ("c", "3"),
            ("d", "4"),
            ("e", "5"),
            ("f", "6")
        ]
    );
    assert_eq!(m.params.get("f"), Some("6"));
}

#[test]
fn colon_is_literal_outside_the_parameter_router() {
    for kind in [RouterKind::HostUri, RouterKind::Uri] {
        let t = table(kind, vec![r("file", &["/file:list"]), r("u", &["/u/:id"])]);
        assert_eq!(path(&t, "/file:list"), Some("file"));
        assert_eq!(path(&t, "/file:other"), None);
        assert_eq!(path(&t, "/u/:id"), Some("u"));
        assert_eq!(path(&t, "/u/7"), None, "{kind:?}");
    }
    let t = table(RouterKind::UriWithParameter, vec![r("u", &["/u/:id"])]);
    assert_eq!(path(&t, "/u/:id"), Some("u"));
    assert_eq!(path(&t, "/u/7"), Some("u"));
}

#[test]
fn parameter_router_prefix_is_before_the_first_colon() {
    // `:` not at a segment start still cuts the prefix but names nothing: no check follows.
    let t = table(RouterKind::UriWithParameter, vec![r("bc", &["/a/b:c"])]);
    assert_eq!(path(&t, "/a/b"), Some("bc"));
    assert_eq!(path(&t, "/a/bzzz"), Some("bc"));
    assert_eq!(path(&t, "/a/"), None);
}

#[test]
fn bare_star_params_in_every_mode() {
    for kind in MODES {
        let t = table(kind, vec![r("s", &["/s/*"])]);
        let info = req("/s/a/b").info();
        let m = t.lookup(&info, &no_vars()).unwrap();
        assert_eq!(m.params.get(":ext"), Some("a/b"), "{kind:?}");
    }
    let t = table(RouterKind::Uri, vec![r("e", &["/e"])]);
    let info = req("/e").info();
    assert!(t.lookup(&info, &no_vars()).unwrap().params.is_empty());
}

#[test]
fn catch_all_patterns() {
    for kind in MODES {
        let t = table(kind, vec![r("all", &["/*"]), r("star", &["*"])]);
        assert_eq!(path(&t, "/"), Some("all"));
        assert_eq!(path(&t, "/x/y"), Some("all"));
        // `*` stores the empty prefix: the last resort.
        let t = table(kind, vec![r("star", &["*"]), r("x", &["/x*"])]);
        assert_eq!(path(&t, "/x/y"), Some("x"));
        assert_eq!(path(&t, "/y"), Some("star"));
    }
}

#[test]
fn trailing_slash_is_significant() {
    for kind in MODES {
        let t = table(kind, vec![r("a", &["/a"]), r("a/", &["/a/"])]);
        assert_eq!(path(&t, "/a"), Some("a"));
        assert_eq!(path(&t, "/a/"), Some("a/"));
    }
}

#[test]
fn several_uris_register_each() {
    for kind in MODES {
        let t = table(kind, vec![r("multi", &["/one", "/two/*", "/three*"])]);
        for (p, uri) in [
            ("/one", "/one"),
            ("/two/x", "/two/*"),
            ("/threes", "/three*"),
        ] {
            let info = req(p).info();
            let m = t.lookup(&info, &no_vars()).unwrap();
            assert_eq!(*m.value, "multi");
            assert_eq!(m.matched_uri, uri, "{kind:?}");
        }
        assert_eq!(path(&t, "/two"), None);
    }
}

// ---------------------------------------------------------------- §2.3 precedence

#[test]
fn exact_beats_prefix_regardless_of_priority() {
    for kind in MODES {
        let t = table(
            kind,
            vec![
                with_priority(r("prefix", &["/api/*"]), 100),
                r("exact", &["/api/users"]),
            ],
        );
        assert_eq!(path(&t, "/api/users"), Some("exact"), "{kind:?}");
        assert_eq!(path(&t, "/api/other"), Some("prefix"));
    }
}

#[test]
fn failing_exact_falls_back_to_prefixes() {
    for kind in MODES {
        let t = table(
            kind,
            vec![
                with_methods(r("exact", &["/api/users"]), &["POST"]),
                r("prefix", &["/api/*"]),
            ],
        );
        assert_eq!(path(&t, "/api/users"), Some("prefix"));
        assert_eq!(
            hit(&t, req("/api/users").method(Some(Method::Post))),
            Some("exact")
        );
    }
}

#[test]
fn longest_prefix_first_with_fallback() {
    for kind in MODES {
        let t = table(
            kind,
            vec![
                r("short", &["/a*"]),
                with_priority(r("mid", &["/a/*"]), -5),
                with_methods(r("long", &["/a/b/*"]), &["POST"]),
            ],
        );
        // Longest stored prefix wins even with a lower priority than shorter ones.
        assert_eq!(
            hit(&t, req("/a/b/c").method(Some(Method::Post))),
            Some("long")
        );
        // Its filter fails: fall back to the next shorter prefix.
        assert_eq!(path(&t, "/a/b/c"), Some("mid"), "{kind:?}");
        assert_eq!(path(&t, "/a/x"), Some("mid"));
        assert_eq!(path(&t, "/abc"), Some("short"));
        assert_eq!(path(&t, "/a"), Some("short"));
    }
}

#[test]
fn prefix_param_check_failure_falls_back() {
    for kind in MODES {
        let t = table(kind, vec![r("short", &["/a/*"]), r("inner", &["/a/b/*/z"])]);
        assert_eq!(path(&t, "/a/b/x/z"), Some("inner"));
        assert_eq!(path(&t, "/a/b/x/y"), Some("short"), "{kind:?}");
    }
}

#[test]
fn same_path_entry_priority_then_length_then_insertion() {
    for kind in MODES {
        // Same stored prefix `/p/`: priority first.
        let t = table(
            kind,
            vec![
                r("first", &["/p/*"]),
                with_priority(r("high", &["/p/*"]), 5),
                with_priority(r("low", &["/p/*"]), -1),
            ],
        );
        assert_eq!(path(&t, "/p/x"), Some("high"), "{kind:?}");

        // Equal priority: the longer original pattern first.
        let t = table(kind, vec![r("short", &["/p/*"]), r("long", &["/p/*/x"])]);
        assert_eq!(path(&t, "/p/q/x"), Some("long"));
        assert_eq!(path(&t, "/p/q/y"), Some("short"));

        // Equal priority and length: insertion order.
        let t = table(kind, vec![r("one", &["/p/*"]), r("two", &["/p/*"])]);
        assert_eq!(path(&t, "/p/x"), Some("one"));

        // Exact entries: priority, then insertion order.
        let t = table(
            kind,
            vec![
                r("one", &["/e"]),
                r("two", &["/e"]),
                with_priority(r("three", &["/e"]), 1),
            ],
        );
        assert_eq!(path(&t, "/e"), Some("three"));
        let t = table(kind, vec![r("one", &["/e"]), r("two", &["/e"])]);
        assert_eq!(path(&t, "/e"), Some("one"));
    }
}

#[test]
fn priority_only_orders_one_path_entry() {
    for kind in MODES {
        let t = table(
            kind,
            vec![
                with_priority(r("short", &["/a*"]), 1000),
                r("long", &["/a/b*"]),
            ],
        );
        assert_eq!(path(&t, "/a/bc"), Some("long"), "{kind:?}");
    }
}

#[test]
fn filters_in_order_and_next_candidate_on_failure() {
    for kind in MODES {
        let mut blocked = with_priority(r("blocked", &["/f"]), 10);
        blocked.remote_addrs = vec!["10.0.0.0/8".parse().unwrap()];
        let mut vars_route = with_priority(r("vars", &["/f"]), 5);
        vars_route.vars =
            Some(Expr::compare("arg_k", CmpOp::Eq, ExprValue::Str("v".into()), false).unwrap());
        let t = table(kind, vec![blocked, vars_route, r("plain", &["/f"])]);
        assert_eq!(path(&t, "/f"), Some("plain"), "{kind:?}");
        assert_eq!(hit(&t, req("/f").addr("10.1.1.1")), Some("blocked"));
        let v = Vars(
            [("arg_k".to_string(), "v".to_string())]
                .into_iter()
                .collect(),
        );
        assert_eq!(hit_vars(&t, req("/f"), &v), Some("vars"));
    }
}

#[test]
fn method_filter_runs_before_vars() {
    use std::cell::Cell;
    struct Counting(Cell<usize>);
    impl VarSource for Counting {
        fn var(&self, _: &str) -> Option<Cow<'_, str>> {
            self.0.set(self.0.get() + 1);
            Some(Cow::Borrowed("x"))
        }
    }
    let mut e = with_methods(r("m", &["/m"]), &["POST"]);
    e.vars = Some(Expr::compare("a", CmpOp::Eq, ExprValue::Str("x".into()), false).unwrap());
    let t = table(RouterKind::Uri, vec![e]);
    let counting = Counting(Cell::new(0));
    let info = req("/m").info();
    assert!(t.lookup(&info, &counting).is_none());
    assert_eq!(
        counting.0.get(),
        0,
        "vars must not be evaluated when methods fail"
    );
    let info = req("/m").method(Some(Method::Post)).info();
    assert!(t.lookup(&info, &counting).is_some());
    assert_eq!(counting.0.get(), 1);
}

// ---------------------------------------------------------------- host stage (radixtree_host_uri)

#[test]
fn host_route_beats_hostless_even_with_priority() {
    let t = table(
        RouterKind::HostUri,
        vec![
            with_priority(r("hostless", &["/api/users"]), 100),
            with_hosts(r("host", &["/api/*"]), &["*.ex.com"]),
        ],
    );
    let info = req("/api/users").host("a.ex.com").info();
    let m = t.lookup(&info, &no_vars()).unwrap();
    assert_eq!(*m.value, "host");
    assert_eq!(m.matched_host, Some("*.ex.com"));
    assert_eq!(m.matched_uri, "/api/*");
    // Other hosts see the hostless route.
    assert_eq!(hit(&t, req("/api/users").host("b.org")), Some("hostless"));
    assert_eq!(hit(&t, req("/api/users")), Some("hostless"));
}

#[test]
fn exact_host_beats_wildcard_whatever_priorities() {
    let t = table(
        RouterKind::HostUri,
        vec![
            with_priority(with_hosts(r("wild", &["/x"]), &["*.ex.com"]), 100),
            with_hosts(r("exact", &["/x"]), &["api.ex.com"]),
        ],
    );
    assert_eq!(hit(&t, req("/x").host("api.ex.com")), Some("exact"));
    assert_eq!(hit(&t, req("/x").host("web.ex.com")), Some("wild"));
}

#[test]
fn longer_wildcard_suffix_first() {
    let t = table(
        RouterKind::HostUri,
        vec![
            with_hosts(r("any", &["/x"]), &["*"]),
            with_hosts(r("com", &["/x"]), &["*.com"]),
            with_hosts(r("ex", &["/x"]), &["*.ex.com"]),
        ],
    );
    assert_eq!(hit(&t, req("/x").host("a.ex.com")), Some("ex"));
    assert_eq!(hit(&t, req("/x").host("a.other.com")), Some("com"));
    assert_eq!(hit(&t, req("/x").host("a.org")), Some("any"));
    // No Host at all: no host route can match.
    assert_eq!(hit(&t, req("/x")), None);
}

#[test]
fn host_route_uri_miss_falls_through() {
    let t = table(
        RouterKind::HostUri,
        vec![
            with_hosts(r("exact-host", &["/only"]), &["api.ex.com"]),
            with_hosts(r("wild-host", &["/wild/*"]), &["*.ex.com"]),
            r("hostless", &["/*"]),
        ],
    );
    assert_eq!(hit(&t, req("/only").host("api.ex.com")), Some("exact-host"));
    // Exact host entry misses on URI → wildcard host entries → hostless.
    assert_eq!(
        hit(&t, req("/wild/1").host("api.ex.com")),
        Some("wild-host")
    );
    assert_eq!(hit(&t, req("/other").host("api.ex.com")), Some("hostless"));
    let info = req("/other").host("api.ex.com").info();
    assert_eq!(t.lookup(&info, &no_vars()).unwrap().matched_host, None);
}

#[test]
fn host_entry_runs_the_full_uri_procedure() {
    let t = table(
        RouterKind::HostUri,
        vec![
            with_hosts(r("prefix", &["/a/*"]), &["h.com"]),
            with_hosts(with_priority(r("p", &["/a/*"]), 3), &["h.com"]),
            with_hosts(r("exact", &["/a/b"]), &["h.com"]),
        ],
    );
    assert_eq!(hit(&t, req("/a/b").host("h.com")), Some("exact"));
    assert_eq!(hit(&t, req("/a/c").host("h.com")), Some("p"));
}

#[test]
fn route_with_several_hosts_is_filed_under_each() {
    let t = table(
        RouterKind::HostUri,
        vec![with_hosts(
            r("multi", &["/m"]),
            &["a.com", "*.b.com", "A.com"],
        )],
    );
    assert_eq!(hit(&t, req("/m").host("a.com")), Some("multi"));
    assert_eq!(hit(&t, req("/m").host("x.b.com")), Some("multi"));
    assert_eq!(hit(&t, req("/m").host("c.com")), None);
    let info = req("/m").host("x.b.com").info();
    assert_eq!(
        t.lookup(&info, &no_vars()).unwrap().matched_host,
        Some("*.b.com")
    );
}

#[test]
fn host_with_port_never_matches_in_host_uri() {
    let t = table(
        RouterKind::HostUri,
        vec![with_hosts(r("port", &["/p"]), &["foo.com:8080"])],
    );
    // `$host` never carries a port, so the host entry keyed `foo.com:8080` is unreachable.
    assert_eq!(
        hit(&t, req("/p").host("foo.com").host_header("foo.com:8080")),
        None
    );
    // An IPv6 literal is a host with ':' that `$host` does carry (brackets, no port): APISIX's
    // host tree compares it like any other key.
    let t = table(
        RouterKind::HostUri,
        vec![with_hosts(r("v6", &["/p"]), &["[::1]"])],
    );
    assert_eq!(
        hit(&t, req("/p").host("[::1]").host_header("[::1]:9080")),
        Some("v6")
    );
}

// ---------------------------------------------------------------- §2.4 hosts as a filter

#[test]
fn wildcard_host_semantics_in_every_mode() {
    for kind in MODES {
        let t = table(kind, vec![with_hosts(r("w", &["/h"]), &["*.foo.com"])]);
        for h in ["a.foo.com", "a.b.foo.com", ".foo.com"] {
            assert_eq!(hit(&t, req("/h").host(h)), Some("w"), "{kind:?} {h}");
        }
        for h in ["foo.com", "afoo.com", "foo.com.evil"] {
            assert_eq!(hit(&t, req("/h").host(h)), None, "{kind:?} {h}");
        }
        assert_eq!(hit(&t, req("/h")), None);

        let t = table(kind, vec![with_hosts(r("any", &["/h"]), &["*"])]);
        assert_eq!(hit(&t, req("/h").host("whatever.org")), Some("any"));

        let t = table(kind, vec![with_hosts(r("exact", &["/h"]), &["Foo.COM"])]);
        assert_eq!(hit(&t, req("/h").host("foo.com")), Some("exact"));
        assert_eq!(hit(&t, req("/h").host("a.foo.com")), None);
    }
}

#[test]
fn uri_router_host_filter() {
    for kind in [RouterKind::Uri, RouterKind::UriWithParameter] {
        let t = table(
            kind,
            vec![
                with_priority(r("hostless", &["/api/users"]), 100),
                with_hosts(r("host", &["/api/users"]), &["a.ex.com"]),
            ],
        );
        // Hosts are only a filter: priority decides within the entry.
        assert_eq!(
            hit(&t, req("/api/users").host("a.ex.com")),
            Some("hostless")
        );
        let t = table(
            kind,
            vec![
                with_hosts(r("host", &["/api/*"]), &["*.ex.com"]),
                r("hostless", &["/api/users"]),
            ],
        );
        // ... and exact paths come first whatever the hosts.
        assert_eq!(
            hit(&t, req("/api/users").host("a.ex.com")),
            Some("hostless")
        );
        let info = req("/api/x").host("a.ex.com").info();
        let m = t.lookup(&info, &no_vars()).unwrap();
        assert_eq!(m.matched_host, Some("*.ex.com"));
        assert_eq!(hit(&t, req("/api/x").host("b.org")), None);
    }
}

#[test]
fn uri_router_host_with_port_uses_host_header() {
    for kind in [RouterKind::Uri, RouterKind::UriWithParameter] {
        let t = table(
            kind,
            vec![with_hosts(r("port", &["/p"]), &["foo.com:8080", "bar.com"])],
        );
        assert_eq!(
            hit(&t, req("/p").host("foo.com").host_header("foo.com:8080")),
            Some("port"),
            "{kind:?}"
        );
        assert_eq!(
            hit(&t, req("/p").host("foo.com").host_header("foo.com:9090")),
            None
        );
        assert_eq!(
            hit(&t, req("/p").host("foo.com").host_header("foo.com")),
            None
        );
        assert_eq!(
            hit(&t, req("/p").host("bar.com").host_header("bar.com:8080")),
            Some("port")
        );
    }
}

// ---------------------------------------------------------------- §2.4 methods, remote_addrs, vars

#[test]
fn methods_filter() {
    for kind in MODES {
        let t = table(kind, vec![with_methods(r("get", &["/m"]), &["GET"])]);
        assert_eq!(hit(&t, req("/m")), Some("get"));
        assert_eq!(
            hit(&t, req("/m").method(Some(Method::Head))),
            None,
            "HEAD is not GET"
        );
        assert_eq!(hit(&t, req("/m").method(None)), None, "unknown method");

        let all_ten: Vec<&str> = Method::LIST.iter().map(|m| m.as_str()).collect();
        let t = table(
            kind,
            vec![with_methods(r("ten", &["/m"]), &all_ten), r("any", &["/m"])],
        );
        assert_eq!(hit(&t, req("/m").method(Some(Method::Purge))), Some("ten"));
        assert_eq!(hit(&t, req("/m").method(None)), Some("any"));

        let mut empty = r("empty", &["/m"]);
        empty.methods = MethodSet::empty();
        let t = table(kind, vec![empty]);
        assert_eq!(hit(&t, req("/m").method(None)), Some("empty"));
    }
}

#[test]
fn remote_addrs_filter() {
    for kind in MODES {
        let mut e = r("ra", &["/r"]);
        e.remote_addrs = vec![
            "192.168.1.0/24".parse().unwrap(),
            "10.0.0.7/32".parse().unwrap(),
            "2001:db8::/32".parse().unwrap(),
        ];
        let t = table(kind, vec![e]);
        assert_eq!(hit(&t, req("/r").addr("192.168.1.77")), Some("ra"));
        assert_eq!(hit(&t, req("/r").addr("10.0.0.7")), Some("ra"));
        assert_eq!(hit(&t, req("/r").addr("2001:db8::1")), Some("ra"));
        assert_eq!(hit(&t, req("/r").addr("10.0.0.8")), None);
        assert_eq!(hit(&t, req("/r").addr("192.168.2.1")), None);
        assert_eq!(hit(&t, req("/r").addr("::1")), None);
    }
}

#[test]
fn vars_filter_with_logic() {
    for kind in MODES {
        let mut e = r("v", &["/v"]);
        e.vars = Some(Expr::And(vec![
            Expr::compare("http_x_a", CmpOp::Eq, ExprValue::Str("1".into()), false).unwrap(),
            Expr::Or(vec![
                Expr::compare("arg_n", CmpOp::Gt, ExprValue::Num(10.0), false).unwrap(),
                Expr::compare("cookie_c", CmpOp::Regex, ExprValue::Str("^x".into()), true).unwrap(),
            ]),
        ]));
        let t = table(kind, vec![e]);
        let vars = |pairs: &[(&str, &str)]| {
            Vars(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        assert_eq!(
            hit_vars(&t, req("/v"), &vars(&[("http_x_a", "1"), ("arg_n", "11")])),
            Some("v")
        );
        assert_eq!(
            hit_vars(
                &t,
                req("/v"),
                &vars(&[("http_x_a", "1"), ("arg_n", "9"), ("cookie_c", "xy")])
            ),
            None
        );
        // Absent cookie: `~~` is false, negated true.
        assert_eq!(
            hit_vars(&t, req("/v"), &vars(&[("http_x_a", "1"), ("arg_n", "9")])),
            Some("v")
        );
        assert_eq!(hit_vars(&t, req("/v"), &vars(&[("arg_n", "11")])), None);
    }
}

// ---------------------------------------------------------------- build errors and misc

#[test]
fn bad_entries_are_skipped_and_reported() {
    let entries = vec![
        r("ok1", &["/ok1"]),
        with_hosts(r("badhost", &["/bh"]), &["bad host"]),
        r("nouri", &[]),
        r("emptyuri", &["/x", ""]),
        with_hosts(r("star-mid", &["/sm"]), &["a.*.com"]),
        r("badre", &["/a(/*x/*y"]),
        r("ok2", &["/ok2/*"]),
    ];
    for kind in MODES {
        let (t, errors) = RouteTable::new(kind, entries.clone());
        let idx: Vec<usize> = errors.iter().map(|e| e.index).collect();
        assert_eq!(idx, [1, 2, 3, 4, 5], "{kind:?} {errors:?}");
        assert!(errors[0].message.contains("invalid host"));
        assert!(errors[0].to_string().starts_with("route entry #1: "));
        assert_eq!(t.len(), 2);
        assert!(!t.is_empty());
        assert_eq!(t.kind(), kind);
        assert_eq!(path(&t, "/ok1"), Some("ok1"));
        assert_eq!(path(&t, "/ok2/z"), Some("ok2"));
        assert_eq!(path(&t, "/x"), None);
    }
}

#[test]
fn empty_table() {
    for kind in MODES {
        let (t, errors) = RouteTable::<()>::new(kind, vec![]);
        assert!(errors.is_empty());
        assert!(t.is_empty());
        let info = req("/").host("a.com").info();
        assert!(t.lookup(&info, &no_vars()).is_none());
    }
}

#[test]
fn valid_host_forms() {
    for h in [
        "*",
        "*.a.com",
        "a.com",
        "*a.com",
        "a-b_c.d",
        "[::1]",
        "foo.com:80",
        "1.2.3.4",
        "*.",
    ] {
        assert!(HostPat::parse(h).is_ok(), "{h}");
    }
    for h in ["", "**", "a.*.com", "a com", "a/b", "\u{e4}.com", "*a*"] {
        assert!(HostPat::parse(h).is_err(), "{h}");
    }
}

#[test]
fn table_is_send_and_sync() {
    fn assert_send_sync<X: Send + Sync>() {}
    assert_send_sync::<RouteTable<String>>();
    assert_send_sync::<RouteTable<std::sync::Arc<u32>>>();
}

#[test]
fn large_table_matches_every_route() {
    let n = 20_000;
    let mut entries = Vec::with_capacity(n);
    let names: Vec<String> = (0..n).map(|i| format!("/svc{i}/v1")).collect();
    for (i, name) in names.iter().enumerate() {
        let mut e = RouteEntry::new(vec![name.clone(), format!("{name}/items/*")], i);
        if i % 3 == 0 {
            e.hosts = vec![format!("h{i}.example.com")];
        }
        entries.push(e);
    }
    for kind in MODES {
        let (t, errors) = RouteTable::new(kind, entries.clone());
        assert!(errors.is_empty());
        for i in (0..n).step_by(331) {
            let host = format!("h{i}.example.com");
            let exact = RequestInfo {
                path: &names[i],
                host: Some(&host),
                host_header: None,
                method: Some(Method::Get),
                remote_addr: "127.0.0.1".parse().unwrap(),
            };
            assert_eq!(t.lookup(&exact, &no_vars()).map(|m| *m.value), Some(i));
            let deep = format!("{}/items/42/x", names[i]);
            let prefix = RequestInfo {
                path: &deep,
                ..exact
            };
            let m = t.lookup(&prefix, &no_vars()).unwrap();
            assert_eq!(*m.value, i);
            assert!(m.matched_uri.ends_with("/items/*"));
            if i % 3 == 0 {
                assert_eq!(m.matched_host, Some(host.as_str()));
                let wrong = RequestInfo {
                    host: Some("nope.example.com"),
                    ..prefix
                };
                assert!(t.lookup(&wrong, &no_vars()).is_none(), "{kind:?}");
            }
        }
    }
}

#[test]
fn matching_uses_the_normalised_path() {
    for kind in MODES {
        let t = table(kind, vec![r("hello", &["/hello"]), r("ab", &["/a/b"])]);
        for (raw, want) in [
            ("/hel%6Co", Some("hello")),
            ("//hello", Some("hello")),
            ("/a%2Fb", Some("ab")),
            ("/a/./x/../b", Some("ab")),
            ("/hello/", None),
        ] {
            let p = crate::normalize_path(raw).unwrap();
            assert_eq!(path(&t, &p), want, "{kind:?} {raw}");
        }
    }
}
