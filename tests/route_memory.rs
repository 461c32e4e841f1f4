//! The heap a route of `benches/e2e/scale.py`'s mix costs once compiled, held to a budget so a
//! change that makes every route heavier fails here rather than in the next 100,000-route run.
//! The breakdown by allocation site is `examples/route_memory.rs`'s.

use ferrisix_config::store::{KeyValue, StateBuilder};
use ferrisix_plugins::PluginRegistry;
use ferrisix_proxy::snapshot::{CompileOptions, Snapshot};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

const ROUTES: usize = 5_000;

#[path = "../benches/support/scale_mix.rs"]
mod scale_mix;

fn route(i: usize) -> KeyValue {
    let body = scale_mix::route_body(i, None, "127.0.0.1:1980");
    KeyValue {
        key: format!("/apisix/routes/{i}"),
        value: body.to_string().into_bytes(),
        create_revision: i as i64 + 2,
        mod_revision: i as i64 + 2,
    }
}

#[test]
fn a_route_of_the_scale_mix_stays_within_its_heap_budget() {
    let registry = PluginRegistry::builtin();
    let options = CompileOptions::default();
    let empty = Snapshot::empty(&options);
    let _profiler = dhat::Profiler::builder().testing().build();
    let live = || dhat::HeapStats::get().curr_bytes;

    let base = live();
    let mut builder = StateBuilder::new("/apisix");
    for i in 0..ROUTES {
        let kv = route(i);
        builder.apply(&kv.key.clone(), Some(&kv), kv.mod_revision);
    }
    let state = builder.state().clone();
    let stored = (live() - base) / ROUTES;
    let before = live();
    let snapshot = Snapshot::compile(&state, &empty, &options, &registry);
    assert_eq!(snapshot.router.len(), ROUTES);
    assert!(snapshot.quarantine.is_empty(), "{:?}", snapshot.quarantine);
    let compiled = (live() - before) / ROUTES;
    eprintln!("heap bytes per route: {stored} stored, {compiled} compiled");
    // The stored JSON is kept as text once (a parsed tree took 1.7 KB), and the compiled
    // route, its upstream and its table entry about 1.2 KB (7 KB before issue 15's cuts; 3.9
    // KB before equal inline upstreams were shared; 1.85 KB while the typed route was kept).
    // Headroom of about a tenth for the hash tables' growth steps.
    dhat::assert!(stored <= 400, "stored {stored} B per route");
    dhat::assert!(compiled <= 1_100, "compiled {compiled} B per route");
    drop(snapshot);
}
