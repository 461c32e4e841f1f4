//! Publishing: the snapshot handle the request path reads (swapped atomically, never locked)
//! and the loop that compiles and publishes each state a store sends.

use std::sync::Arc;

use arc_swap::ArcSwap;
use ferrisix_config::state::ConfigState;
use ferrisix_plugins::PluginRegistry;

use super::compile::{CompileOptions, Snapshot};

/// The published snapshot, swapped atomically; readers never lock.
pub type SnapshotHandle = Arc<ArcSwap<Snapshot>>;

pub fn new_handle(options: &CompileOptions) -> SnapshotHandle {
    Arc::new(ArcSwap::from_pointee(Snapshot::empty(options)))
}

/// Follows a store's states, compiling and publishing each one, until the sender goes away.
///
/// Bursts coalesce: the channel keeps only the newest state, so every change that lands while
/// a compile runs is applied by the next one, as one publish. No change waits for more than
/// the compile in progress (well under a millisecond for one route at 100,000 routes); nothing
/// is held back on purpose. The compile runs on the blocking pool, so a worker keeps serving
/// requests meanwhile. `published` gets each published snapshot's revision (the stream
/// proxy compiles its routes from every snapshot).
pub async fn follow(
    mut rx: tokio::sync::watch::Receiver<Arc<ConfigState>>,
    handle: SnapshotHandle,
    options: CompileOptions,
    plugins: Arc<PluginRegistry>,
    published: tokio::sync::watch::Sender<i64>,
) {
    let options = Arc::new(options);
    loop {
        let state = rx.borrow_and_update().clone();
        let previous = handle.load_full();
        let (opts, plugs) = (options.clone(), plugins.clone());
        let woken = std::time::Instant::now();
        let compiled = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let cpu = ferrisix_net::thread_cpu_time();
            let snapshot = Snapshot::compile(&state, &previous, &opts, &plugs);
            let cpu = ferrisix_net::thread_cpu_time().saturating_sub(cpu);
            (snapshot, started, started.elapsed(), cpu, previous)
        })
        .await;
        let (snapshot, started, elapsed, cpu, previous) = match compiled {
            Ok(done) => done,
            // A panic in a compile is a bug; the last good snapshot keeps serving.
            Err(e) => {
                tracing::error!("configuration compile failed: {e}");
                if rx.changed().await.is_err() {
                    return;
                }
                continue;
            }
        };
        let stages = snapshot.stages;
        let (revision, routes) = (snapshot.revision, snapshot.router.len());
        let quarantined = snapshot.quarantine.len();
        handle.store(Arc::new(snapshot));
        published.send_replace(revision);
        // `elapsed_us` is the compile's wall time (at nice +10 it stretches while requests keep
        // the cores busy) and `cpu_us` what it cost; `validate_us`, `routes_us` and `table_us`
        // its stages; `queued_us` the wait for a blocking thread, and `applied_us` the store's
        // change to the snapshot serving (both waits and the publish included).
        tracing::info!(
            revision,
            routes,
            quarantined,
            elapsed_us = micros(elapsed),
            cpu_us = micros(cpu),
            validate_us = micros(stages.validate),
            routes_us = micros(stages.routes),
            table_us = micros(stages.table),
            queued_us = micros(started - woken),
            applied_us = micros(woken.elapsed()),
            "configuration applied"
        );
        // Let the replaced snapshot go now, not at the next change: what only it referenced
        // (plugin state of deleted routes) is released with it.
        drop(previous);
        // Shared inline upstreams that only the replaced snapshot held are dead entries now;
        // once there are enough of them they are swept (off the workers).
        if options.upstreams.inline.sweep_due() {
            let opts = options.clone();
            tokio::task::spawn_blocking(move || opts.upstreams.inline.sweep());
        }
        // Once the changes stop for a while, one allocator nudge (see `settle`); none while
        // they keep coming, and no timer while idle.
        let changed = tokio::select! {
            changed = rx.changed() => changed,
            () = tokio::time::sleep(SETTLE_AFTER) => {
                tokio::task::spawn_blocking(settle);
                rx.changed().await
            }
        };
        if changed.is_err() {
            return;
        }
    }
}

/// How long after the last publish the allocator is nudged: past mimalloc's purge delay (1 s).
const SETTLE_AFTER: std::time::Duration = std::time::Duration::from_millis(1500);

/// Allocates and frees one block large enough to get pages of its own. mimalloc hands freed
/// pages back to the system only once they have been free for its purge delay, and only when
/// some thread frees pages after that; a gateway that goes quiet after a burst of changes
/// would keep what the compiles freed (all 100,000 routes deleted: 63-69 MiB resident, 26
/// once anything freed again). This free is that next one. Safe code, no allocator
/// API: `unsafe` is banned here and the nudge is harmless under any allocator.
fn settle() {
    const LARGE: usize = 8 << 20;
    drop(std::hint::black_box(Vec::<u8>::with_capacity(LARGE)));
}

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
