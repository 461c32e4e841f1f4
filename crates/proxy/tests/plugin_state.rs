//! Plugin state across snapshots and gateways: a resource's state is released when the last
//! snapshot that uses it is dropped (not one change later), an unchanged conf keeps its state
//! across snapshots, two gateways in one process share no counters, and a consumer's plugins
//! merge over each route once per snapshot, their state the consumer's.

use std::sync::Arc;
use std::time::Duration;

use ferrisix_config::model::ResourceKind;
use ferrisix_config::state::ConfigState;
use ferrisix_plugins::limit::limit_count::local::Spaces;
use ferrisix_plugins::observe::prometheus::Metrics;
use ferrisix_proxy::snapshot::Snapshot;
use ferrisix_proxy::CompileOptions;
use serde_json::{json, Value};

#[path = "support/gateway.rs"]
mod gateway;

use gateway::{builtin_registry, start_ok_upstream, status, TestGateway};

fn state(routes: &[Value]) -> ConfigState {
    gateway::state(vec![(ResourceKind::Routes, routes.to_vec())])
}

fn route(id: &str, plugins: Value) -> Value {
    json!({"id": id, "uri": format!("/{id}"), "plugins": plugins,
        "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1980": 1}}})
}

#[test]
fn state_goes_with_the_last_snapshot_that_uses_it() {
    let (registry, services) = builtin_registry();
    let options = CompileOptions::default();
    let lc = json!({"count": 5, "time_window": 60});
    let plugins = json!({"limit-count": lc, "prometheus": {}});
    let spaces = services.shared::<Spaces>();
    let metrics = services.shared::<Metrics>();

    let empty = Snapshot::empty(&options);
    let a = Snapshot::compile(
        &state(&[route("1", plugins.clone())]),
        &empty,
        &options,
        &registry,
    );
    assert!(a.quarantine.is_empty(), "{:?}", a.quarantine);
    assert_eq!((spaces.len(), metrics.group_count()), (1, 1));
    let (_, first) = spaces.states().pop().unwrap();

    // Compiled while `a` is alive: the unchanged conf leases the same counters again.
    let b = Snapshot::compile(
        &state(&[route("1", plugins.clone()), route("2", json!({}))]),
        &a,
        &options,
        &registry,
    );
    drop(a);
    assert_eq!(spaces.len(), 1);
    assert!(
        Arc::ptr_eq(&spaces.states()[0].1, &first),
        "the same counters"
    );
    drop(first);

    // Route 1 deleted: its state stays exactly as long as a snapshot that uses it.
    let c = Snapshot::compile(&state(&[route("2", json!({}))]), &b, &options, &registry);
    assert_eq!(
        (spaces.len(), metrics.group_count()),
        (1, 1),
        "`b` still serves route 1"
    );
    drop(b);
    assert_eq!(
        (spaces.len(), metrics.group_count()),
        (0, 0),
        "released with the last snapshot that used it, not at the next change"
    );

    // A changed conf is new state; the old one goes with the old snapshot.
    let d = Snapshot::compile(&state(&[route("1", plugins)]), &c, &options, &registry);
    let changed = json!({"limit-count": {"count": 6, "time_window": 60}});
    let e = Snapshot::compile(&state(&[route("1", changed)]), &d, &options, &registry);
    assert_eq!(spaces.len(), 2);
    drop(d);
    assert_eq!(spaces.len(), 1);
    drop((c, e));
    assert!(spaces.is_empty());
}

fn start_gateway(routes: &[Value]) -> TestGateway {
    let (registry, services) = builtin_registry();
    gateway::serve(&state(routes), &registry, services)
}

#[test]
fn two_gateways_in_one_process_share_no_counters() {
    let up = start_ok_upstream();
    let r = json!({"id": "1", "uri": "/1",
        "plugins": {"limit-count": {"count": 1, "time_window": 60, "rejected_code": 429},
            "prometheus": {}},
        "upstream": {"type": "roundrobin", "nodes": {up.to_string(): 1}}});
    let a = start_gateway(std::slice::from_ref(&r));
    let b = start_gateway(&[r]);
    assert_eq!(status(a.addr, "/1", ""), 200);
    assert_eq!(status(a.addr, "/1", ""), 429, "a's quota is spent");
    assert_eq!(status(b.addr, "/1", ""), 200, "b counts on its own");
    assert_eq!(status(b.addr, "/1", ""), 429);
    assert_eq!(status(b.addr, "/nope", ""), 404);

    let requests = |g: &TestGateway| {
        // The log phase runs when the response is done; give the worker a moment.
        std::thread::sleep(Duration::from_millis(100));
        g.services.conn_stats().read().requests
    };
    assert_eq!((requests(&a), requests(&b)), (2, 3));
    let a_text = a.services.shared::<Metrics>().render();
    let b_text = b.services.shared::<Metrics>().render();
    let line = |code: u16| format!("apisix_http_status{{code=\"{code}\",route=\"1\",");
    let count = |text: &str, code: u16| {
        text.lines()
            .find(|l| l.starts_with(&line(code)))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_owned)
    };
    assert_eq!(count(&a_text, 200).as_deref(), Some("1"), "{a_text}");
    assert_eq!(count(&a_text, 429).as_deref(), Some("1"));
    assert_eq!(count(&b_text, 200).as_deref(), Some("1"), "{b_text}");
    assert!(
        a_text.contains("apisix_http_requests_total 2\n"),
        "{a_text}"
    );
    assert!(
        b_text.contains("apisix_http_requests_total 3\n"),
        "{b_text}"
    );
}

/// APISIX 3.15+ keys limit-count's counter by the resource holding the conf: a consumer's
/// limit-count counts that consumer's requests on every route it calls (≤ 3.14 counted per
/// route and consumer). Each (route, consumer) chain is merged once per snapshot.
#[test]
fn a_consumers_plugins_merge_per_route_and_count_per_consumer() {
    let up = start_ok_upstream();
    let route = |id: &str, plugins: Value| {
        json!({"id": id, "uri": format!("/{id}"), "plugins": plugins,
            "upstream": {"type": "roundrobin", "nodes": {up.to_string(): 1}}})
    };
    let routes = vec![
        route("c1", json!({"key-auth": {}, "prometheus": {}})),
        // The consumer's limit-count replaces the route's.
        route(
            "c2",
            json!({"key-auth": {}, "limit-count": {"count": 5, "time_window": 60}}),
        ),
    ];
    let consumers = vec![
        json!({"username": "jack", "plugins": {"key-auth": {"key": "jack-key"},
            "limit-count": {"count": 2, "time_window": 60, "rejected_code": 429}}}),
        json!({"username": "rose", "plugins": {"key-auth": {"key": "rose-key"}}}),
    ];
    let (registry, services) = builtin_registry();
    let gw = gateway::serve(
        &gateway::state(vec![
            (ResourceKind::Routes, routes),
            (ResourceKind::Consumers, consumers),
        ]),
        &registry,
        services,
    );
    let (jack, rose) = ("apikey: jack-key\r\n", "apikey: rose-key\r\n");
    assert_eq!(status(gw.addr, "/c1", jack), 200);
    assert_eq!(status(gw.addr, "/c2", jack), 200);
    assert_eq!(
        status(gw.addr, "/c1", jack),
        429,
        "one quota on both routes"
    );
    assert_eq!(status(gw.addr, "/c2", jack), 429);
    assert_eq!(status(gw.addr, "/c2", "apikey: nobody\r\n"), 401);
    for _ in 0..6 {
        assert_eq!(status(gw.addr, "/c1", rose), 200, "rose has no limit on c1");
    }
    assert_eq!(
        status(gw.addr, "/c2", rose),
        200,
        "the route's own limit for rose"
    );
    // Two pairs merged (rose has no plugins to merge).
    assert_eq!(gw.snapshot.load().consumers.cached(), 2);

    // The consumer label of the route's prometheus.
    std::thread::sleep(Duration::from_millis(100));
    let text = gw.services.shared::<Metrics>().render();
    let count = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_owned)
    };
    let c1 = "apisix_http_status{code=\"200\",route=\"c1\",matched_uri=\"/c1\",matched_host=\"\",service=\"\",consumer=";
    assert_eq!(
        count(&format!("{c1}\"jack\"")).as_deref(),
        Some("1"),
        "{text}"
    );
    assert_eq!(
        count(&format!("{c1}\"rose\"")).as_deref(),
        Some("6"),
        "{text}"
    );
}
