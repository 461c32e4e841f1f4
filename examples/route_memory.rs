//! Where the heap bytes of one route go: loads N routes of `benches/e2e/scale.py`'s mix (half
//! exact `/r<i>/exact`, half prefix `/p<i>/*`, a host on every fifth, `methods` on every
//! seventh, an inline roundrobin upstream each) into the embedded store as the Admin API
//! writes them, compiles the first snapshot from the state the store publishes, and reports
//! the live heap bytes per route of each stage and of each allocation site (dhat).
//!
//! ```sh
//! cargo run --example route_memory -- 10000            # stages and sites
//! cargo run --example route_memory -- 10000 --sites 40  # more sites
//! cargo run --example route_memory -- 10000 --distinct  # a different upstream node per route
//! cargo run --example route_memory -- 10000 --delete    # then every route deleted
//! cargo run --example route_memory -- 10000 --reopen --delete  # the store read as a boot reads it
//! ```
//!
//! With `--delete` every route is then deleted from the store and the next snapshot compiled
//! from the state it publishes, as a burst of Admin DELETEs does; the first snapshot and state
//! are dropped, and the sites report what is still live.
//!
//! The mix's routes all send to one node, so their inline upstreams are equal and share one
//! compiled form; `--distinct` gives every route its own node (no two upstreams alike), the
//! other end of what real configurations hold.
//!
//! Bytes are what the code asked the allocator for; mimalloc's size classes and free pages
//! come on top of them in the process' RSS.

use std::collections::HashMap;

use ferrisix_config::store::embedded::EmbeddedStore;
use ferrisix_config::store::Store;
use ferrisix_plugins::PluginRegistry;
use ferrisix_proxy::snapshot::{CompileOptions, Snapshot};
use serde_json::Value;

#[path = "../benches/support/scale_mix.rs"]
mod scale_mix;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// A route of the mix, as the Admin API stores it (with its id and timestamps); `distinct`:
/// its upstream node is its own.
fn route_body(i: usize, distinct: bool) -> Value {
    let node = if distinct {
        format!("127.0.{}.{}:1980", i / 250 % 250, i % 250 + 1)
    } else {
        "127.0.0.1:1980".to_string()
    };
    scale_mix::route_body(i, None, &node)
}

fn live() -> u64 {
    dhat::HeapStats::get().curr_bytes as u64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let sites: usize = args
        .iter()
        .position(|a| a == "--sites")
        .and_then(|i| args.get(i + 1))
        .and_then(|a| a.parse().ok())
        .unwrap_or(25);
    let distinct = args.iter().any(|a| a == "--distinct");
    let delete = args.iter().any(|a| a == "--delete");
    let reopen = args.iter().any(|a| a == "--reopen");
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("dhat-heap.json");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let registry = PluginRegistry::builtin();
    let options = CompileOptions::default();
    let empty = Snapshot::empty(&options);

    let profiler = dhat::Profiler::builder()
        .file_name(&profile)
        .trim_backtraces(Some(64))
        .build();
    let base = live();
    let store = runtime.block_on(async {
        let store = EmbeddedStore::open(&dir.path().join("store.redb"), "/apisix").unwrap();
        // 64 writers at a time, so the store's group commits keep the load short.
        let mut next = 0;
        while next < n {
            let batch: Vec<_> = (next..(next + 64).min(n))
                .map(|i| {
                    let store = store.clone();
                    let value = route_body(i, distinct).to_string().into_bytes();
                    async move {
                        store
                            .put(&format!("/apisix/routes/{i}"), value, None)
                            .await
                            .unwrap()
                    }
                })
                .collect();
            for task in batch {
                task.await;
            }
            next += 64;
        }
        store
    });
    // With `--reopen`, the store is closed and opened again, as a restart reads it.
    let store = if reopen {
        let path = store.path().to_owned();
        drop(store);
        runtime.block_on(async { EmbeddedStore::open(&path, "/apisix").unwrap() })
    } else {
        store
    };
    let state = store.subscribe().borrow().clone();
    let stored = live();
    let snapshot = Snapshot::compile(&state, &empty, &options, &registry);
    let compiled = live();
    assert_eq!(snapshot.router.len(), n, "every route is in the table");
    let per = |b: u64| b as f64 / n as f64;
    println!("{n} routes, live heap bytes per route:");
    println!(
        "  embedded store with its published state: {:>8.0}",
        per(stored - base)
    );
    println!(
        "  first snapshot compiled from it:         {:>8.0}",
        per(compiled - stored)
    );
    println!(
        "  total:                                   {:>8.0}",
        per(compiled - base)
    );
    // With `--delete`, what stays is what the emptied state and its snapshot hold.
    let held = if delete {
        runtime.block_on(async {
            for i in 0..n {
                store.delete(&format!("/apisix/routes/{i}")).await.unwrap();
            }
        });
        let emptied = store.subscribe().borrow().clone();
        let after = Snapshot::compile(&emptied, &snapshot, &options, &registry);
        assert_eq!(after.router.len(), 0, "every route is gone");
        drop((snapshot, state));
        println!(
            "  still live after every route was deleted: {:>8.0}",
            per(live().saturating_sub(base))
        );
        (after, emptied)
    } else {
        (snapshot, state)
    };
    // Written with `held` still alive, so its end-of-run bytes are what a route holds.
    drop(profiler);
    report_sites(&profile, n, sites);
    drop((held, store));
}

/// Live bytes at the end by the innermost two ferrisix frames of their allocation site.
fn report_sites(profile: &std::path::Path, n: usize, top: usize) {
    let doc: Value = serde_json::from_slice(&std::fs::read(profile).unwrap()).unwrap();
    let frames: Vec<&str> = doc["ftbl"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap_or(""))
        .collect();
    let mut by_site: HashMap<String, (u64, u64)> = HashMap::new();
    for pp in doc["pps"].as_array().unwrap() {
        let bytes = pp["eb"].as_u64().unwrap_or(0);
        if bytes == 0 {
            continue;
        }
        let blocks = pp["ebk"].as_u64().unwrap_or(0);
        let ours: Vec<String> = pp["fs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|i| frames.get(i.as_u64()? as usize))
            .filter_map(|f| {
                let f = f.split_once(": ").map_or(*f, |(_, rest)| rest);
                f.starts_with("ferrisix").then(|| {
                    let (func, at) = f.split_once(" (").unwrap_or((f, ""));
                    // `file:line:column`: the column dropped.
                    let line = at
                        .trim_end_matches(')')
                        .rsplit_once(':')
                        .map_or("", |(l, _)| l);
                    let func = func.split("::{{closure}}").next().unwrap_or(func);
                    format!("{func} ({})", line.rsplit("src/").next().unwrap_or(line))
                })
            })
            .take(2)
            .collect();
        let key = if ours.is_empty() {
            "(outside ferrisix)".to_string()
        } else {
            ours.join("  <-  ")
        };
        let e = by_site.entry(key).or_default();
        e.0 += bytes;
        e.1 += blocks;
    }
    let mut sites: Vec<_> = by_site.into_iter().collect();
    sites.sort_by_key(|s| std::cmp::Reverse(s.1 .0));
    println!("\nlive bytes / blocks per route by allocation site (innermost ferrisix frames):");
    for (site, (bytes, blocks)) in sites.iter().take(top) {
        println!(
            "{:>7.0} B {:>5.1} blk  {site}",
            *bytes as f64 / n as f64,
            *blocks as f64 / n as f64
        );
    }
    let rest: u64 = sites.iter().skip(top).map(|s| s.1 .0).sum();
    println!(
        "{:>7.0} B            (the other sites)",
        rest as f64 / n as f64
    );
}
