//! The compile against the previous snapshot: quarantine of a bad resource, fallback to the
//! last good version, reuse of unchanged parts (the same `Arc`s across snapshots), rebuilding
//! exactly what a change touches, and the diffs a snapshot publishes.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use ferrisix_config::model::ResourceKind;
use ferrisix_config::state::ConfigState;
use ferrisix_config::store::{KeyValue, StateBuilder};
use ferrisix_plugins::PluginRegistry;
use ferrisix_router::{Method, RequestInfo, VarSource};
use serde_json::{json, Value};

use super::*;

/// A store's published states, written key by key.
struct Store {
    builder: StateBuilder,
    revision: i64,
}

impl Store {
    fn new() -> Store {
        Store {
            builder: StateBuilder::new("/apisix"),
            revision: 1,
        }
    }

    fn put(&mut self, key: &str, value: Value) -> &mut Store {
        self.revision += 1;
        let kv = KeyValue {
            key: format!("/apisix/{key}"),
            value: value.to_string().into_bytes(),
            create_revision: self.revision,
            mod_revision: self.revision,
        };
        self.builder
            .apply(&kv.key.clone(), Some(&kv), self.revision);
        self
    }

    fn delete(&mut self, key: &str) -> &mut Store {
        self.revision += 1;
        self.builder
            .apply(&format!("/apisix/{key}"), None, self.revision);
        self
    }

    fn state(&self) -> ConfigState {
        self.builder.state().clone()
    }
}

/// One set of options for every compile, as the binary has (compiles under other options
/// start over).
fn options() -> &'static CompileOptions {
    static OPTIONS: std::sync::OnceLock<CompileOptions> = std::sync::OnceLock::new();
    OPTIONS.get_or_init(CompileOptions::default)
}

/// A snapshot with the diff its compile returned.
struct Compiled(Snapshot, SnapshotDiff);

impl Compiled {
    fn diff(&self) -> &SnapshotDiff {
        &self.1
    }
}

impl std::ops::Deref for Compiled {
    type Target = Snapshot;
    fn deref(&self) -> &Snapshot {
        &self.0
    }
}

fn compile(store: &Store, previous: &Snapshot) -> Compiled {
    let (snapshot, diff) = Snapshot::compile_diffed(
        &store.state(),
        previous,
        options(),
        &PluginRegistry::builtin(),
    );
    Compiled(snapshot, diff)
}

fn first(store: &Store) -> Compiled {
    compile(store, &Snapshot::empty(options()))
}

struct NoVars;

impl VarSource for NoVars {
    fn var(&self, _name: &str) -> Option<std::borrow::Cow<'_, str>> {
        None
    }
}

/// The id of the route serving `GET path`, if any.
fn serving(snapshot: &Snapshot, path: &str) -> Option<String> {
    let req = RequestInfo {
        path,
        host: Some("example.com"),
        host_header: Some("example.com"),
        method: Some(Method::Get),
        remote_addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
    };
    snapshot
        .router
        .lookup(&req, &NoVars)
        .map(|m| m.value.info.id.to_string())
}

fn node(port: u16) -> Value {
    json!({"type": "roundrobin", "nodes": {format!("127.0.0.1:{port}"): 1}})
}

fn route(uri: &str, rest: Value) -> Value {
    let mut v = json!({"uri": uri});
    v.as_object_mut()
        .unwrap()
        .extend(rest.as_object().unwrap().clone());
    v
}

fn ids(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

fn same_route(a: &Snapshot, b: &Snapshot, id: &str) -> bool {
    Arc::ptr_eq(a.route(id).unwrap(), b.route(id).unwrap())
}

fn target(s: &Snapshot, id: &str) -> Arc<CompiledUpstream> {
    match &s.route(id).unwrap().target {
        RouteTarget::Upstream(u) => u.clone(),
        RouteTarget::Fail(status) => panic!("route {id} fails with {status}"),
    }
}

/// Four routes over every kind of reference: an upstream by id, an inline upstream, a
/// service, a plugin config.
fn base() -> Store {
    let mut s = Store::new();
    s.put("upstreams/u1", node(1981))
        .put("upstreams/u2", node(1982))
        .put("services/s1", json!({"upstream_id": "u2"}))
        .put(
            "plugin_configs/pc1",
            json!({"plugins": {"limit-count": {"count": 5, "time_window": 60}}}),
        )
        .put(
            "routes/by-id",
            route("/by-id", json!({"upstream_id": "u1"})),
        )
        .put(
            "routes/inline",
            route("/inline", json!({"upstream": node(1983)})),
        )
        .put(
            "routes/service",
            route("/service", json!({"service_id": "s1"})),
        )
        .put(
            "routes/pc",
            route(
                "/pc",
                json!({"plugin_config_id": "pc1", "upstream_id": "u1"}),
            ),
        );
    s
}

const ALL: [&str; 4] = ["by-id", "inline", "service", "pc"];

#[test]
fn a_bad_resource_is_quarantined_on_its_own() {
    let mut s = base();
    s.put(
        "routes/bad",
        route("/bad", json!({"methods": ["FETCH"], "upstream_id": "u1"})),
    )
    .put(
        "upstreams/bad-scheme",
        // More chash ring points than an upstream may have.
        json!({"type": "chash", "key": "remote_addr", "nodes": {"127.0.0.1:1": 1_000_000, "127.0.0.1:2": 1}}),
    );
    let snap = first(&s);
    for id in ALL {
        assert_eq!(serving(&snap, &format!("/{id}")).as_deref(), Some(id));
    }
    assert_eq!(serving(&snap, "/bad"), None);
    let mut quarantined: Vec<_> = snap
        .quarantine
        .iter()
        .map(|q| (q.kind, q.id.as_str(), q.serving_previous))
        .collect();
    quarantined.sort();
    assert_eq!(
        quarantined,
        [
            (ResourceKind::Upstreams, "bad-scheme", false),
            (ResourceKind::Routes, "bad", false),
        ]
    );
    assert!(!snap.upstreams.contains_key("bad-scheme"));
    assert!(snap.upstreams.contains_key("u1"));
}

#[test]
fn the_last_good_version_keeps_serving() {
    let mut s = base();
    let v1 = first(&s);
    // An invalid update of a route: the previous version still serves /by-id.
    s.put(
        "routes/by-id",
        route(
            "/by-id-v2",
            json!({"upstream_id": "u1", "priority": "high"}),
        ),
    );
    let v2 = compile(&s, &v1);
    assert_eq!(serving(&v2, "/by-id").as_deref(), Some("by-id"));
    assert_eq!(serving(&v2, "/by-id-v2"), None);
    assert_eq!(v2.quarantine.len(), 1, "{:?}", v2.quarantine);
    let q = &v2.quarantine[0];
    assert_eq!(
        (q.kind, q.id.as_str(), q.serving_previous),
        (ResourceKind::Routes, "by-id", true)
    );
    assert!(
        same_route(&v1, &v2, "by-id"),
        "the held version is not rebuilt"
    );
    assert!(v2.diff().config.routes.is_changed("by-id"));
    assert!(
        v2.diff().applied.is_empty(),
        "a refused update changes nothing served"
    );
    assert!(v2.diff().routes.is_empty());
    // The stored value is the refused one; what is applied (control API) is the old one.
    let applied = v2.applied(ResourceKind::Routes);
    let by_id = &applied.iter().find(|(id, _)| id == "by-id").unwrap().1;
    assert_eq!(by_id["uri"], "/by-id");

    // An unrelated change later: the refused version is still reported, still not served.
    s.put("routes/new", route("/new", json!({"upstream_id": "u1"})));
    let v3 = compile(&s, &v2);
    assert_eq!(v3.quarantine, v2.quarantine);
    assert_eq!(serving(&v3, "/by-id").as_deref(), Some("by-id"));
    assert_eq!(serving(&v3, "/new").as_deref(), Some("new"));

    // A fixed version replaces it; a deleted route stops serving.
    s.put(
        "routes/by-id",
        route("/by-id-v2", json!({"upstream_id": "u1"})),
    );
    s.delete("routes/new");
    let v4 = compile(&s, &v3);
    assert!(v4.quarantine.is_empty(), "{:?}", v4.quarantine);
    assert_eq!(serving(&v4, "/by-id-v2").as_deref(), Some("by-id"));
    assert_eq!(serving(&v4, "/by-id"), None);
    assert_eq!(serving(&v4, "/new"), None);
    assert_eq!(v4.diff().routes.changed, ids(&["by-id"]));
    assert_eq!(v4.diff().routes.removed, ids(&["new"]));

    // An upstream that stops validating keeps its last good version too.
    s.put("upstreams/u1", json!({"nodes": "nope"}));
    let v5 = compile(&s, &v4);
    assert!(Arc::ptr_eq(&v4.upstreams["u1"], &v5.upstreams["u1"]));
    assert!(v5
        .quarantine
        .iter()
        .any(|q| q.id == "u1" && q.serving_previous));
    assert!(same_route(&v4, &v5, "by-id"));
}

#[test]
fn unchanged_parts_are_reused() {
    let mut s = base();
    let v1 = first(&s);
    assert_eq!(v1.diff().config.routes.added, ids(&ALL));
    assert_eq!(v1.diff().routes.added, ids(&ALL));
    assert_eq!(v1.diff().upstreams.added, ids(&["u1", "u2"]));

    // The same state again (the first compile at start, then the follow loop's): all reused.
    let again = compile(&s, &v1);
    for id in ALL {
        assert!(same_route(&v1, &again, id), "{id}");
    }
    assert!(Arc::ptr_eq(&v1.upstreams["u1"], &again.upstreams["u1"]));
    assert_eq!(again.diff(), &SnapshotDiff::default());

    // One route changes: only it is rebuilt; its inline upstream's definition is the same, so
    // that keeps its compiled form (and balancer) too.
    s.put(
        "routes/inline",
        route(
            "/inline",
            json!({"upstream": node(1983), "name": "renamed"}),
        ),
    );
    let v2 = compile(&s, &v1);
    assert!(!same_route(&v1, &v2, "inline"));
    assert!(Arc::ptr_eq(&target(&v1, "inline"), &target(&v2, "inline")));
    for id in ["by-id", "service", "pc"] {
        assert!(same_route(&v1, &v2, id), "{id}");
    }
    assert_eq!(v2.diff().config.routes.changed, ids(&["inline"]));
    assert_eq!(v2.diff().routes.changed, ids(&["inline"]));
    assert!(v2.diff().upstreams.is_empty());
    assert!(Arc::ptr_eq(&v1.upstreams["u1"], &v2.upstreams["u1"]));
}

#[test]
fn a_change_rebuilds_what_depends_on_it() {
    let mut s = base();
    let v1 = first(&s);

    // An upstream: the routes that use it, nothing else.
    s.put("upstreams/u1", node(1991));
    let v2 = compile(&s, &v1);
    assert_eq!(v2.diff().upstreams.changed, ids(&["u1"]));
    assert_eq!(v2.diff().routes.changed, ids(&["by-id", "pc"]));
    assert!(Arc::ptr_eq(&target(&v2, "by-id"), &v2.upstreams["u1"]));
    assert_eq!(target(&v2, "by-id").nodes.load().nodes[0].port, 1991);
    assert!(Arc::ptr_eq(&v1.upstreams["u2"], &v2.upstreams["u2"]));
    assert!(same_route(&v1, &v2, "service") && same_route(&v1, &v2, "inline"));

    // A service: its routes.
    s.put("services/s1", json!({"upstream_id": "u2", "name": "svc"}));
    let v3 = compile(&s, &v2);
    assert_eq!(v3.diff().applied.services.changed, ids(&["s1"]));
    assert_eq!(v3.diff().routes.changed, ids(&["service"]));
    assert_eq!(
        v3.route("service").unwrap().info.service_name.as_deref(),
        Some("svc")
    );

    // A plugin config: its routes.
    s.put(
        "plugin_configs/pc1",
        json!({"plugins": {"limit-count": {"count": 9, "time_window": 60}}}),
    );
    let v4 = compile(&s, &v3);
    assert_eq!(v4.diff().routes.changed, ids(&["pc"]));

    // Metadata of a plugin: the routes running it.
    s.put(
        "plugin_metadata/limit-count",
        json!({"limit_header": "X-Limit"}),
    );
    let v5 = compile(&s, &v4);
    assert_eq!(
        v5.diff().applied.plugin_metadata.added,
        ids(&["limit-count"])
    );
    assert_eq!(v5.diff().routes.changed, ids(&["pc"]));

    // A global rule: every route's global chain.
    s.put(
        "global_rules/g1",
        json!({"plugins": {"limit-count": {"count": 100, "time_window": 60}}}),
    );
    let v6 = compile(&s, &v5);
    assert_eq!(v6.diff().routes.changed, ids(&ALL));
    assert_eq!(v6.global_chain.len(), 1);
    for id in ALL {
        assert_eq!(v6.route(id).unwrap().global_chain.len(), 1, "{id}");
    }

    // Then metadata of a global rule's plugin: every route again; of a plugin nobody runs:
    // nothing.
    s.put(
        "plugin_metadata/limit-count",
        json!({"limit_header": "X-L"}),
    );
    let v7 = compile(&s, &v6);
    assert_eq!(v7.diff().routes.changed, ids(&ALL));
    s.put("plugin_metadata/prometheus", json!({}));
    let v8 = compile(&s, &v7);
    assert!(v8.diff().routes.is_empty());
    assert_eq!(
        v8.diff().applied.plugin_metadata.added,
        ids(&["prometheus"])
    );
}

/// public-api builds other plugins' APIs from their metadata (batch-requests' limits): its
/// routes are built again whenever any plugin metadata changes, the others are kept.
#[test]
fn public_api_routes_follow_every_plugin_metadata() {
    let mut s = Store::new();
    s.put(
        "routes/api",
        route(
            "/apisix/batch-requests",
            json!({"plugins": {"public-api": {}}}),
        ),
    )
    .put(
        "routes/plain",
        route("/p", json!({"upstream": {"nodes": {"127.0.0.1:1980": 1}}})),
    );
    let v1 = first(&s);
    s.put(
        "plugin_metadata/batch-requests",
        json!({"max_body_size": 2048}),
    );
    let v2 = compile(&s, &v1);
    assert_eq!(v2.diff().routes.changed, ids(&["api"]));
    assert!(same_route(&v1, &v2, "plain"));
    // In a global rule: the global chains, and so every route.
    s.put("global_rules/g", json!({"plugins": {"public-api": {}}}));
    let v3 = compile(&s, &v2);
    s.put(
        "plugin_metadata/batch-requests",
        json!({"max_body_size": 4096}),
    );
    let v4 = compile(&s, &v3);
    assert_eq!(v4.diff().routes.changed, ids(&["api", "plain"]));
}

#[test]
fn a_missing_reference_is_followed_when_it_appears() {
    let mut s = Store::new();
    s.put("routes/r", route("/r", json!({"upstream_id": "later"})))
        .put("routes/s", route("/s", json!({"service_id": "svc-later"})));
    let v1 = first(&s);
    let fails = |snap: &Snapshot, id: &str| match snap.route(id).unwrap().target {
        RouteTarget::Fail(status) => status.as_u16(),
        RouteTarget::Upstream(_) => 0,
    };
    assert_eq!(fails(&v1, "r"), 502);
    assert_eq!(fails(&v1, "s"), 404);

    s.put("upstreams/later", node(1984));
    let v2 = compile(&s, &v1);
    assert_eq!(fails(&v2, "r"), 0);
    assert!(same_route(&v1, &v2, "s"));
    s.put("services/svc-later", json!({"upstream_id": "later"}));
    let v3 = compile(&s, &v2);
    assert_eq!(fails(&v3, "s"), 0);
    assert!(same_route(&v2, &v3, "r"));

    // Gone again: the routes that used it fail again.
    s.delete("upstreams/later");
    let v4 = compile(&s, &v3);
    assert_eq!(v4.diff().upstreams.removed, ids(&["later"]));
    assert_eq!(fails(&v4, "r"), 502);
    assert_eq!(fails(&v4, "s"), 502);
}

#[test]
fn disabled_routes_leave_the_table() {
    let mut s = base();
    let v1 = first(&s);
    s.put(
        "routes/by-id",
        route("/by-id", json!({"upstream_id": "u1", "status": 0})),
    );
    let v2 = compile(&s, &v1);
    assert_eq!(serving(&v2, "/by-id"), None);
    assert!(v2.route("by-id").is_none());
    assert_eq!(v2.diff().routes.removed, ids(&["by-id"]));
    assert_eq!(v2.router.len(), 3);
}

#[test]
fn a_node_list_change_keeps_the_checker_and_the_state_of_unchanged_nodes() {
    let checks = json!({"active": {"unhealthy": {"tcp_failures": 1}}});
    let mut s = Store::new();
    s.put(
        "upstreams/u1",
        json!({"type": "roundrobin", "checks": checks,
               "nodes": {"127.0.0.1:1": 1, "127.0.0.1:2": 1}}),
    );
    let s1 = first(&s);
    assert!(s1.quarantine.is_empty(), "{:?}", s1.quarantine);
    assert_eq!(s1.checkers.len(), 1);
    let checker = s1.checkers[0].checker.clone();
    assert_eq!(checker.name, "/apisix/upstreams/u1");
    let targets = checker.targets();
    targets[1].report(false, crate::upstream::health::Counter::Tcp, 1);
    assert!(!targets[1].is_up());
    assert!(checker.any_down());
    drop(targets);

    // Only the node list changes (through the config diff): the same checker, and the node
    // that stays keeps its state.
    s.put(
        "upstreams/u1",
        json!({"type": "roundrobin", "checks": checks,
               "nodes": {"127.0.0.1:2": 1, "127.0.0.1:3": 1}}),
    );
    let s2 = compile(&s, &s1);
    assert_eq!(s2.diff().upstreams.changed, ids(&["u1"]));
    assert!(Arc::ptr_eq(&s2.checkers[0].checker, &checker));
    let now = s2.checkers[0].checker.targets();
    assert_eq!(now.len(), 2);
    assert_eq!(now[0].port, 2);
    assert!(!now[0].is_up(), "the unchanged node lost its state");
    assert!(now[1].is_up());
    drop(now);

    // An unrelated change hands the upstream (and its checker) on untouched.
    s.put("routes/r", route("/r", json!({"upstream_id": "u1"})));
    let s3 = compile(&s, &s2);
    assert!(Arc::ptr_eq(&s3.upstreams["u1"], &s2.upstreams["u1"]));
    assert_eq!(s3.checkers.len(), 1);

    // Changed checks: a new checker that still knows the node is down; the old one retires.
    let other = json!({"active": {"http_path": "/other", "unhealthy": {"tcp_failures": 1}}});
    s.put(
        "upstreams/u1",
        json!({"type": "roundrobin", "checks": other,
               "nodes": {"127.0.0.1:2": 1, "127.0.0.1:3": 1}}),
    );
    let s4 = compile(&s, &s3);
    let renewed = s4.checkers[0].checker.clone();
    assert!(!Arc::ptr_eq(&renewed, &checker));
    assert!(!renewed.targets()[0].is_up());
    assert!(renewed.any_down());

    // A chash ring too big to build is refused, not allocated (and, as any upstream that does
    // not compile, left out: its checker with it).
    s.put(
        "upstreams/u1",
        json!({"type": "chash", "key": "uri", "checks": other,
               "nodes": {"127.0.0.1:2": 1_000_000_000u64, "127.0.0.1:3": 1}}),
    );
    let refused = compile(&s, &s4);
    assert_eq!(refused.quarantine.len(), 1, "{:?}", refused.quarantine);
    assert!(refused.checkers.is_empty());
    drop(refused);

    // The upstream goes: so does its checker.
    s.delete("routes/r").delete("upstreams/u1");
    let s5 = compile(&s, &s4);
    assert!(s5.checkers.is_empty());
    drop((s1, s2, s3, s4));
    assert_eq!(
        Arc::strong_count(&checker),
        1,
        "the checker outlived its upstream"
    );
    assert_eq!(
        Arc::strong_count(&renewed),
        1,
        "the checker outlived its upstream"
    );
}

#[test]
fn inline_upstreams_are_checked_under_their_holder() {
    let checks = json!({"active": {"healthy": {"interval": 100}}});
    let mut s = Store::new();
    s.put(
        "services/s1",
        json!({"upstream": {"type": "least_conn", "checks": checks,
                            "nodes": {"127.0.0.1:1": 1}}}),
    );
    s.put(
        "routes/r1",
        route(
            "/a",
            json!({"upstream": {"type": "ewma", "checks": checks,
                                          "nodes": {"127.0.0.1:2": 1}}}),
        ),
    );
    let v1 = first(&s);
    let names: Vec<&str> = v1
        .checkers
        .iter()
        .map(|c| c.checker.name.as_str())
        .collect();
    assert_eq!(names, ["/apisix/routes/r1", "/apisix/services/s1"]);
}

#[test]
fn a_route_change_touches_that_route_only_and_refusals_stay_reported() {
    let mut store = Store::new();
    for i in 0..300 {
        store.put(
            &format!("routes/{i}"),
            route(&format!("/r{i}/*"), json!({"upstream": node(1980)})),
        );
    }
    // Valid for the schema, refused by the route table (a host the router cannot file).
    store.put(
        "routes/bad",
        route("/bad", json!({"hosts": ["a b"], "upstream": node(1980)})),
    );
    let a = first(&store);
    assert_eq!(a.router.len(), 300);
    let refused = |s: &Snapshot| s.quarantine.iter().filter(|q| q.id == "bad").count();
    assert_eq!(refused(&a), 1);

    store.put(
        "routes/7",
        route("/moved/*", json!({"upstream": node(1980)})),
    );
    store.delete("routes/8");
    store.put(
        "routes/new",
        route("/r7/*", json!({"priority": 1, "upstream": node(1980)})),
    );
    let b = compile(&store, &a);
    assert_eq!(b.diff().routes.changed, ids(&["7"]));
    assert_eq!(b.diff().routes.removed, ids(&["8"]));
    assert_eq!(b.diff().routes.added, ids(&["new"]));
    assert_eq!(b.diff().config.routes.changed, ids(&["7"]));
    assert_eq!(serving(&b, "/moved/x").as_deref(), Some("7"));
    assert_eq!(serving(&b, "/r7/x").as_deref(), Some("new"));
    assert_eq!(serving(&b, "/r8/x"), None);
    assert_eq!(serving(&b, "/r9/x").as_deref(), Some("9"));
    // The previous snapshot still serves what it served.
    assert_eq!(serving(&a, "/r7/x").as_deref(), Some("7"));
    assert_eq!(serving(&a, "/r8/x").as_deref(), Some("8"));
    assert!(same_route(&a, &b, "9"));
    // The refused route is still reported although nothing about it changed.
    assert_eq!(refused(&b), 1);
    assert_eq!(b.router.len(), 300);

    // Fixing it puts it in the table and ends the report.
    store.put("routes/bad", route("/bad", json!({"upstream": node(1980)})));
    let c = compile(&store, &b);
    assert_eq!(refused(&c), 0);
    assert_eq!(serving(&c, "/bad").as_deref(), Some("bad"));
    assert_eq!(c.diff().routes.added, ids(&["bad"]));
    assert!(same_route(&b, &c, "9"));
}

#[test]
fn a_consumer_change_compiles_the_consumer_set_again_and_a_route_change_does_not() {
    let mut s = Store::new();
    s.put("consumers/jack", json!({"username": "jack"}));
    s.put(
        "consumers/jack/credentials/c1",
        json!({"plugins": {"key-auth": {"key": "k1"}}}),
    );
    s.put("routes/r", route("/r", json!({"upstream": node(1980)})));
    let a = first(&s);
    assert!(a.quarantine.is_empty(), "{:?}", a.quarantine);
    assert!(a.consumers.set.index.find("key-auth", "k1").is_some());

    // A route change hands the consumer set on as it was.
    s.put("routes/r2", route("/r2", json!({"upstream": node(1980)})));
    let b = compile(&s, &a);
    assert!(Arc::ptr_eq(&a.consumers.set, &b.consumers.set));

    // A credential, a consumer and a group each compile it again.
    s.put(
        "consumers/jack/credentials/c2",
        json!({"plugins": {"key-auth": {"key": "k2"}}}),
    );
    let c = compile(&s, &b);
    assert!(!Arc::ptr_eq(&b.consumers.set, &c.consumers.set));
    assert!(c.consumers.set.index.find("key-auth", "k2").is_some());
    s.put("consumers/rose", json!({"username": "rose"}));
    let d = compile(&s, &c);
    assert!(d.consumers.set.index.consumer("rose").is_some());
    s.put("consumer_groups/g", json!({"plugins": {}}));
    s.put(
        "consumers/rose",
        json!({"username": "rose", "group_id": "g"}),
    );
    let e = compile(&s, &d);
    assert!(!Arc::ptr_eq(&d.consumers.set, &e.consumers.set));
    s.delete("consumers/jack/credentials/c1");
    let f = compile(&s, &e);
    assert!(f.consumers.set.index.find("key-auth", "k1").is_none());
    assert!(f.consumers.set.index.find("key-auth", "k2").is_some());
}

#[test]
fn route_checkers_follow_the_routes_a_compile_touches() {
    let checks = json!({"active": {"healthy": {"interval": 100}}});
    let up = |port: u16| {
        json!({"upstream": {"type": "roundrobin", "checks": checks,
                            "nodes": {format!("127.0.0.1:{port}"): 1}}})
    };
    let mut s = Store::new();
    s.put("routes/a", route("/a", up(1)));
    s.put("routes/b", route("/b", json!({"upstream": node(1980)})));
    let v1 = first(&s);
    let names = |v: &Snapshot| -> Vec<String> {
        v.checkers.iter().map(|c| c.checker.name.clone()).collect()
    };
    assert_eq!(names(&v1), ["/apisix/routes/a"]);
    // A route that gains checks gets a checker; one that is untouched keeps its own.
    s.put("routes/b", route("/b", up(2)));
    let v2 = compile(&s, &v1);
    assert_eq!(names(&v2), ["/apisix/routes/a", "/apisix/routes/b"]);
    assert!(Arc::ptr_eq(
        &v1.checkers[0].checker,
        &v2.checkers[0].checker
    ));
    // Disabled, deleted: gone.
    s.put(
        "routes/a",
        route("/a", json!({"status": 0, "upstream": up(1)["upstream"]})),
    );
    let v3 = compile(&s, &v2);
    assert_eq!(names(&v3), ["/apisix/routes/b"]);
    s.delete("routes/b");
    let v4 = compile(&s, &v3);
    assert!(v4.checkers.is_empty());
}

/// The active checks of [`health_checked_split`]'s upstream.
fn split_checks() -> Value {
    json!({"active": {"healthy": {"interval": 100}}})
}

/// A traffic-split conf sending half the requests to a health-checked inline upstream on
/// `port`, the other half to the route's own upstream.
fn health_checked_split(port: u16) -> Value {
    json!({"traffic-split": {"rules": [{"weighted_upstreams": [
        {"upstream": {"type": "roundrobin", "checks": split_checks(),
                      "nodes": {format!("127.0.0.1:{port}"): 1}}, "weight": 1},
        {"weight": 1}
    ]}]}})
}

/// Issue 11: traffic-split's inline upstreams are checked, and listed under APISIX's resource
/// path for a plugin's upstream, beside their holder; a route compiled again with the same
/// conf keeps the same upstream (its nodes' health), and a service's conf merged into two
/// routes has one checker.
#[test]
fn plugins_inline_upstreams_are_listed_under_their_resource_path() {
    let split = health_checked_split;
    let checks = split_checks();
    let mut s = Store::new();
    s.put("services/s1", json!({"plugins": split(3)}));
    s.put(
        "routes/r1",
        route(
            "/a",
            json!({"plugins": split(4),
                   "upstream": {"type": "roundrobin", "checks": checks, "nodes": {"127.0.0.1:2": 1}}}),
        ),
    );
    s.put(
        "routes/r2",
        route("/b", json!({"service_id": "s1", "upstream": node(5)})),
    );
    s.put(
        "routes/r3",
        route("/c", json!({"service_id": "s1", "upstream": node(6)})),
    );
    let v1 = first(&s);
    let listed: Vec<(ResourceKind, &str, &str)> = v1
        .checkers
        .iter()
        .map(|c| (c.kind, c.id.as_str(), c.checker.name.as_str()))
        .collect();
    let path = "#plugins['traffic-split'].rules[0].weighted_upstreams[0].upstream";
    let r1 = format!("/apisix/routes/r1{path}");
    let s1 = format!("/apisix/services/s1{path}");
    assert_eq!(
        listed,
        [
            (ResourceKind::Routes, "r1", "/apisix/routes/r1"),
            (ResourceKind::Routes, &*format!("r1{path}"), r1.as_str()),
            (ResourceKind::Services, &*format!("s1{path}"), s1.as_str()),
        ]
    );
    let info = crate::control::health_infos(&v1);
    assert_eq!(info[1]["name"], r1.as_str());
    assert_eq!(info[1]["type"], "http");
    assert_eq!(info[1]["nodes"][0]["port"], 4);
    let checker = v1.checkers[1].checker.clone();

    // r1 compiled again (another uri), its traffic-split conf unchanged: the same checker.
    s.put(
        "routes/r1",
        route(
            "/a2",
            json!({"plugins": split(4),
                   "upstream": {"type": "roundrobin", "checks": checks, "nodes": {"127.0.0.1:2": 1}}}),
        ),
    );
    let v2 = compile(&s, &v1);
    assert!(Arc::ptr_eq(&v2.checkers[1].checker, &checker));
    // Its node list changed: a checker of the same name, still listed once.
    s.put(
        "routes/r1",
        route("/a2", json!({"plugins": split(7), "upstream": node(2)})),
    );
    let v3 = compile(&s, &v2);
    let names: Vec<&str> = v3
        .checkers
        .iter()
        .map(|c| c.checker.name.as_str())
        .collect();
    assert_eq!(names, [r1.as_str(), s1.as_str()]);
    assert_eq!(crate::control::health_infos(&v3)[0]["nodes"][0]["port"], 7);
    // The plugin gone, its checker goes.
    s.put("routes/r1", route("/a2", json!({"upstream": node(2)})));
    let v4 = compile(&s, &v3);
    let names: Vec<&str> = v4
        .checkers
        .iter()
        .map(|c| c.checker.name.as_str())
        .collect();
    assert_eq!(names, [s1.as_str()]);
}

/// A boot's compile of many routes runs on several threads: its snapshot is the one a compile
/// of the same routes a few at a time (on one thread) gives: the same routes serving, the
/// same checkers (a service's traffic-split upstream shared by its routes listed once, each
/// route's own listed under it), the same refusals.
#[test]
fn routes_compiled_on_several_threads_match_one_at_a_time() {
    let split = health_checked_split;
    let n = 4 * ferrisix_config::parallel::PARALLEL_FROM;
    let body = |i: usize| match i % 5 {
        0 => route(
            &format!("/r{i}"),
            json!({"service_id": "s1", "upstream": node(5)}),
        ),
        1 => route(
            &format!("/r{i}"),
            json!({"plugins": split(6), "upstream": node(7)}),
        ),
        // Refused.
        2 if i % 3 == 0 => route(
            &format!("/r{i}"),
            json!({"methods": ["FETCH"], "upstream": node(4)}),
        ),
        3 => route(
            &format!("/r{i}/*"),
            json!({"upstream": node(8), "status": 0}),
        ),
        _ => route(&format!("/r{i}"), json!({"upstream": node(9)})),
    };
    let mut all = Store::new();
    all.put("services/s1", json!({"plugins": split(3)}));
    let mut few = Store::new();
    few.put("services/s1", json!({"plugins": split(3)}));
    let mut stepwise = first(&few);
    for i in 0..n {
        all.put(&format!("routes/{i}"), body(i));
        few.put(&format!("routes/{i}"), body(i));
        if i % 100 == 99 {
            stepwise = compile(&few, &stepwise);
        }
    }
    let stepwise = compile(&few, &stepwise);
    let boot = first(&all);
    for i in 0..n {
        let path = format!("/r{i}");
        assert_eq!(serving(&boot, &path), serving(&stepwise, &path), "{path}");
    }
    let names = |s: &Snapshot| -> Vec<String> {
        let mut v: Vec<String> = s.checkers.iter().map(|c| c.checker.name.clone()).collect();
        v.sort();
        v
    };
    let listed = names(&boot);
    assert_eq!(listed, names(&stepwise));
    let service_split =
        "/apisix/services/s1#plugins['traffic-split'].rules[0].weighted_upstreams[0].upstream";
    assert_eq!(listed.iter().filter(|c| *c == service_split).count(), 1);
    let own_splits = listed
        .iter()
        .filter(|c| c.starts_with("/apisix/routes/") && c.contains("traffic-split"))
        .count();
    assert_eq!(own_splits, (0..n).filter(|i| i % 5 == 1).count());
    let refused =
        |s: &Snapshot| -> BTreeSet<String> { s.quarantine.iter().map(|q| q.id.clone()).collect() };
    assert_eq!(refused(&boot), refused(&stepwise));
    assert!(!refused(&boot).is_empty());
}

#[test]
fn equal_inline_upstreams_share_what_no_route_could_tell_apart() {
    // Options of its own: the pools are the process' (one per `UpstreamServices`).
    let opts = CompileOptions::default();
    let registry = PluginRegistry::builtin();
    let compile =
        |store: &Store, prev: &Snapshot| Snapshot::compile(&store.state(), prev, &opts, &registry);
    let one = json!({"type": "roundrobin", "nodes": {"127.0.0.1:1980": 1}});
    let two = json!({"type": "roundrobin", "nodes": {"127.0.0.1:1980": 1, "127.0.0.1:1981": 1}});
    let checked = json!({"type": "roundrobin", "nodes": {"127.0.0.1:1980": 1},
        "checks": {"active": {"unhealthy": {"tcp_failures": 1}}}});
    let named = json!({"type": "roundrobin", "nodes": {"localhost:1980": 1}});
    let mut store = Store::new();
    for (id, up) in [
        ("a", &one),
        ("b", &one),
        ("c", &two),
        ("d", &two),
        ("e", &checked),
        ("f", &checked),
        ("g", &named),
        ("h", &named),
    ] {
        store.put(
            &format!("routes/{id}"),
            json!({"uri": format!("/{id}"), "upstream": up}),
        );
    }
    let s1 = compile(&store, &Snapshot::empty(&opts));
    let up = |s: &Snapshot, id: &str| match &s.route(id).unwrap().target {
        RouteTarget::Upstream(u) => u.clone(),
        RouteTarget::Fail(status) => panic!("route {id} fails with {status}"),
    };
    assert!(
        Arc::ptr_eq(&up(&s1, "a"), &up(&s1, "b")),
        "one node by address"
    );
    for (x, y, why) in [
        (
            "c",
            "d",
            "roundrobin over two nodes keeps a position per route",
        ),
        ("e", "f", "a checker is named after its route"),
        ("g", "h", "a name is resolved per upstream"),
    ] {
        assert!(!Arc::ptr_eq(&up(&s1, x), &up(&s1, y)), "{why}");
        // The typed definitions are one all the same.
        assert!(
            Arc::ptr_eq(&up(&s1, x).source, &up(&s1, y).source),
            "{x} {y}"
        );
    }
    assert!(!Arc::ptr_eq(&up(&s1, "a").source, &up(&s1, "e").source));

    // A route added later with an equal definition joins the shared form; one changed to
    // another definition leaves it.
    store
        .put("routes/i", json!({"uri": "/i", "upstream": one}))
        .put("routes/b", json!({"uri": "/b", "upstream": two}));
    let s2 = compile(&store, &s1);
    assert!(Arc::ptr_eq(&up(&s2, "i"), &up(&s1, "a")));
    assert!(
        Arc::ptr_eq(&up(&s2, "a"), &up(&s1, "a")),
        "unchanged route, same form"
    );
    assert!(!Arc::ptr_eq(&up(&s2, "b"), &up(&s2, "a")));
    assert_eq!(serving(&s2, "/i").as_deref(), Some("i"));

    // Every holder gone: once the snapshots that held them are, a sweep empties the pools.
    for id in ["a", "b", "c", "d", "e", "f", "g", "h", "i"] {
        store.delete(&format!("routes/{id}"));
    }
    let s3 = compile(&store, &s2);
    drop((s1, s2));
    let inline = &opts.upstreams.inline;
    assert!(inline.sweep_due());
    inline.sweep();
    assert_eq!(inline.len(), (0, 0));
    assert_eq!(s3.router.len(), 0);
}

#[test]
fn a_route_whose_plugin_config_is_gone_fails_before_its_service_is_merged() {
    let mut store = Store::new();
    store
        .put(
            "services/s1",
            json!({"name": "svc", "upstream": {"nodes": {"127.0.0.1:1980": 1}}}),
        )
        .put(
            "routes/r",
            json!({"uri": "/r", "service_id": "s1", "plugin_config_id": "gone"}),
        )
        .put("routes/ok", json!({"uri": "/ok", "service_id": "s1"}));
    let s = first(&store);
    let r = s.route("r").unwrap();
    assert!(matches!(r.target, RouteTarget::Fail(s) if s == 503));
    // As in APISIX, which answers 503 before the service merge: no service name to log.
    assert_eq!(r.info.service_name, None);
    assert_eq!(r.info.service_id.as_deref(), Some("s1"));
    assert_eq!(
        s.route("ok").unwrap().info.service_name.as_deref(),
        Some("svc")
    );
}

#[test]
fn a_dependency_change_builds_a_held_route_from_its_accepted_version() {
    let mut s = base();
    s.put("services/s1", json!({"upstream_id": "u2", "name": "one"}));
    let v1 = first(&s);
    // The route's update is refused: its first version keeps serving.
    s.put(
        "routes/service",
        route(
            "/service-v2",
            json!({"service_id": "s1", "priority": "high"}),
        ),
    );
    let v2 = compile(&s, &v1);
    assert!(same_route(&v1, &v2, "service"));
    // The service changes: the route is built again, from the version that was accepted
    // (the compile keeps its text, not its typed form), and takes the new service.
    s.put("services/s1", json!({"upstream_id": "u1", "name": "two"}));
    let v3 = compile(&s, &v2);
    assert!(!same_route(&v2, &v3, "service"));
    assert_eq!(serving(&v3, "/service").as_deref(), Some("service"));
    assert_eq!(serving(&v3, "/service-v2"), None);
    let r = v3.route("service").unwrap();
    assert_eq!(r.info.service_name.as_deref(), Some("two"));
    assert!(Arc::ptr_eq(&target(&v3, "service"), &v3.upstreams["u1"]));
    assert!(v3
        .quarantine
        .iter()
        .any(|q| q.id == "service" && q.serving_previous));
    // A disabled route leaves the table and stays out across dependency changes.
    s.put(
        "routes/service",
        route("/service", json!({"service_id": "s1", "status": 0})),
    );
    let v4 = compile(&s, &v3);
    assert_eq!(serving(&v4, "/service"), None);
    s.put("services/s1", json!({"upstream_id": "u2", "name": "three"}));
    let v5 = compile(&s, &v4);
    assert_eq!(serving(&v5, "/service"), None);
    assert!(v5.route("service").is_none());
}

#[test]
fn a_refused_route_is_held_or_left_out_until_its_next_change() {
    let mut s = base();
    let v1 = first(&s);
    // A new route that is refused serves nothing, and is not listed as applied, across a
    // dependency change.
    s.put("routes/bad", route("/bad", json!({"priority": "high"})));
    let v2 = compile(&s, &v1);
    assert_eq!(serving(&v2, "/bad"), None);
    assert!(v2.diff().applied.routes.is_empty());
    s.put("services/s1", json!({"upstream_id": "u1"}));
    let v3 = compile(&s, &v2);
    assert_eq!(serving(&v3, "/bad"), None);
    let listed = |v: &Snapshot| -> Vec<String> {
        v.applied(ResourceKind::Routes)
            .into_iter()
            .map(|(id, _)| id)
            .collect()
    };
    assert!(!listed(&v3).contains(&"bad".to_string()));
    assert!(v3
        .quarantine
        .iter()
        .any(|q| q.id == "bad" && !q.serving_previous));
    // A refused update of a served route lists (and serves) the accepted version.
    s.put(
        "routes/by-id",
        route(
            "/by-id-v2",
            json!({"upstream_id": "u1", "priority": "high"}),
        ),
    );
    let v4 = compile(&s, &v3);
    let accepted = v4.applied(ResourceKind::Routes);
    let (_, held) = accepted.iter().find(|(id, _)| id == "by-id").unwrap();
    assert_eq!(held["uri"], "/by-id");
    // Deleting the held route removes it; stored again valid, it serves its new version.
    s.delete("routes/by-id");
    let v5 = compile(&s, &v4);
    assert_eq!(v5.diff().applied.routes.removed, ids(&["by-id"]));
    assert_eq!(serving(&v5, "/by-id"), None);
    assert!(!listed(&v5).contains(&"by-id".to_string()));
    assert!(v5.quarantine.iter().all(|q| q.id != "by-id"));
    s.put(
        "routes/by-id",
        route("/by-id-v3", json!({"upstream_id": "u1"})),
    );
    let v6 = compile(&s, &v5);
    assert_eq!(v6.diff().applied.routes.added, ids(&["by-id"]));
    assert_eq!(serving(&v6, "/by-id-v3").as_deref(), Some("by-id"));
    // The refused new route, fixed, is added.
    s.put("routes/bad", route("/bad", json!({"upstream_id": "u2"})));
    let v7 = compile(&s, &v6);
    assert_eq!(v7.diff().applied.routes.added, ids(&["bad"]));
    assert_eq!(serving(&v7, "/bad").as_deref(), Some("bad"));
}

/// The control API puts the stream routes' checkers after the routes' (their own and their
/// plugins') and before the services' and upstreams', as APISIX's `_get_health_checkers`
/// lists them; `/v1/healthcheck/stream_routes/{id}` answers one, or APISIX's 404s.
#[tokio::test]
async fn control_lists_stream_route_checkers_after_the_routes() {
    use http_body_util::BodyExt;
    let split = health_checked_split;
    let checks = split_checks();
    let mut s = Store::new();
    s.put(
        "routes/r1",
        route(
            "/a",
            json!({"plugins": split(4),
                   "upstream": {"type": "roundrobin", "checks": checks, "nodes": {"127.0.0.1:2": 1}}}),
        ),
    );
    s.put(
        "upstreams/u1",
        json!({"type": "roundrobin", "checks": checks, "nodes": {"127.0.0.1:3": 1}}),
    );
    let v1 = first(&s);
    assert_eq!(v1.checkers.len(), 3);
    // The upstream's checker stands in for a stream route's own.
    let stream_checker = v1.checkers[2].checker.clone();
    let Compiled(v1, _) = v1;
    let handle = crate::snapshot::new_handle(options());
    handle.store(Arc::new(v1));
    let api = crate::control::ControlApi {
        snapshot: handle,
        health: Arc::new(|| ferrisix_config::store::StoreHealth {
            reachable: true,
            synced: true,
            revision: 0,
            detail: String::new(),
        }),
        stream: Some(Arc::new(move || {
            vec![
                ("s1".to_string(), Some(stream_checker.clone())),
                ("s2".to_string(), None),
            ]
        })),
        schema: None,
    };
    let get = |path: &str| {
        let resp = api.handle(&http::Method::GET, path);
        let status = resp.status().as_u16();
        (status, resp.into_body())
    };
    let json_of = |body: http_body_util::Full<bytes::Bytes>| async move {
        let bytes = body.collect().await.unwrap().to_bytes();
        serde_json::from_slice::<Value>(&bytes).unwrap()
    };
    let (status, body) = get("/v1/healthcheck");
    assert_eq!(status, 200);
    let list = json_of(body).await;
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    let split_name =
        "/apisix/routes/r1#plugins['traffic-split'].rules[0].weighted_upstreams[0].upstream";
    assert_eq!(
        names,
        [
            "/apisix/routes/r1",
            split_name,
            "/apisix/upstreams/u1",
            "/apisix/upstreams/u1"
        ]
    );
    let (status, body) = get("/v1/healthcheck/stream_routes/s1");
    assert_eq!(status, 200);
    assert_eq!(json_of(body).await["name"], "/apisix/upstreams/u1");
    for (path, message) in [
        (
            "/v1/healthcheck/stream_routes/s2",
            "no checker for stream_routes[s2]",
        ),
        (
            "/v1/healthcheck/stream_routes/s3",
            "stream_routes[s3] not found",
        ),
        (
            "/v1/healthcheck/stream_routes/",
            "missing src id for src type stream_routes",
        ),
    ] {
        let (status, body) = get(path);
        assert_eq!(status, 404, "{path}");
        assert_eq!(json_of(body).await["error_msg"], message, "{path}");
    }
}
