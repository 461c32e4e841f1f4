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
pub async fn follow(
    mut rx: tokio::sync::watch::Receiver<Arc<ConfigState>>,
    handle: SnapshotHandle,
    options: CompileOptions,
    plugins: Arc<PluginRegistry>,
) {
    loop {
        let state = rx.borrow_and_update().clone();
        let previous = handle.load_full();
        let started = std::time::Instant::now();
        let snapshot = Snapshot::compile(&state, &previous, &options, &plugins);
        tracing::info!(
            revision = snapshot.revision,
            routes = snapshot.router.len(),
            quarantined = snapshot.quarantine.len(),
            elapsed_us = started.elapsed().as_micros() as u64,
            "configuration applied"
        );
        handle.store(Arc::new(snapshot));
        // Let the replaced snapshot go now, not at the next change: what only it referenced
        // (plugin state of deleted routes) is released with it.
        drop(previous);
        if rx.changed().await.is_err() {
            return;
        }
    }
}
