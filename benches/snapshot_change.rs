//! The compile one Admin change costs at scale, in process (no other process competing for the
//! cores, unlike `benches/e2e/scale.py`'s figure): N routes of the scale benchmark's mix are
//! compiled once, then one route's uri changes and the next snapshot is compiled from that
//! state against the first one, as the data plane does for each store change. Each stage is
//! also timed on its own (`validate` covers the diff, the TLS store and the validation of the
//! changed route; then the routes' compile; then the table), so a slow stage is named.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use ferrisix_config::model::ResourceKind;
use ferrisix_config::shared_map::SharedMap;
use ferrisix_config::state::{ConfigState, StoredItem, StoredValue};
use ferrisix_plugins::PluginRegistry;
use ferrisix_proxy::snapshot::{CompileOptions, Snapshot};

#[path = "support/scale_mix.rs"]
mod scale_mix;

fn item(i: usize, uri: Option<&str>, revision: i64) -> StoredItem {
    StoredItem {
        id: i.to_string(),
        value: StoredValue::from_value(&scale_mix::route_body(i, uri, "127.0.0.1:1980")),
        create_revision: i as i64 + 1,
        mod_revision: revision,
        seq: i as u64,
    }
}

fn state_of(n: usize) -> ConfigState {
    let routes: SharedMap<StoredItem> = (0..n)
        .map(|i| (i.to_string(), item(i, None, i as i64 + 1)))
        .collect();
    let mut state = ConfigState {
        revision: n as i64,
        ..ConfigState::default()
    };
    state.resources.insert(ResourceKind::Routes, routes);
    state
}

/// `state` with route `i`'s uri changed (revision bumped), as the store publishes it.
fn changed(state: &ConfigState, i: usize, k: usize) -> ConfigState {
    let mut next = state.clone();
    next.revision += 1;
    let uri = format!("/churn{i}_{k}");
    next.resources
        .get_mut(&ResourceKind::Routes)
        .unwrap()
        .insert(i.to_string(), item(i, Some(&uri), next.revision));
    next
}

fn change(c: &mut Criterion) {
    let registry = PluginRegistry::builtin();
    let options = CompileOptions::default();
    let mut g = c.benchmark_group("snapshot_change");
    g.sample_size(30);
    g.measurement_time(Duration::from_secs(3));
    for n in [10_000, 100_000] {
        let state = state_of(n);
        let first = Snapshot::compile(&state, &Snapshot::empty(&options), &options, &registry);
        let nexts: Vec<ConfigState> = (0..64)
            .map(|k| changed(&state, 1 + k * 104_729 % (n - 1), k))
            .collect();
        // The stages of 64 changes, as the compile reports them (medians, µs).
        let mut stages: Vec<[Duration; 3]> = nexts
            .iter()
            .map(|next| {
                let (snap, _) = Snapshot::compile_diffed(next, &first, &options, &registry);
                let s = &snap.stages;
                [s.validate, s.routes, s.table]
            })
            .collect();
        let median = |k: usize, stages: &mut Vec<[Duration; 3]>| {
            stages.sort_by_key(|s| s[k]);
            stages[stages.len() / 2][k].as_micros()
        };
        eprintln!(
            "{n} routes, one route changed: validate {} µs, routes {} µs, table {} µs (medians of 64)",
            median(0, &mut stages),
            median(1, &mut stages),
            median(2, &mut stages)
        );
        let mut k = 0;
        g.bench_with_input(BenchmarkId::new("one_route", n), &n, |b, _| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let next = &nexts[k % nexts.len()];
                    k += 1;
                    let started = Instant::now();
                    let snap = Snapshot::compile(next, &first, &options, &registry);
                    total += started.elapsed();
                    // Freed outside the timed part: the old snapshot is freed off the
                    // request path too (by the last request holding it).
                    drop(black_box(snap));
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group!(benches, change);
criterion_main!(benches);
