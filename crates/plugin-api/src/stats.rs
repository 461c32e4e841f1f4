//! Connection and request counters: nginx's `stub_status` numbers as ferrisix keeps them,
//! written by the proxy core and read by prometheus (`apisix_nginx_http_current_connections`,
//! `apisix_http_requests_total`).
//!
//! The counters are bumped on every accept, close and request, from every worker thread; each
//! thread writes its own cache-line-padded shard, so the bumps never contend, and a thread
//! that has a shard to itself bumps it with a plain load and store: a locked add is a full
//! barrier, and every request would make two (`benches/e2e/instructions.py --atomics` counts
//! them). Reading sums the shards. One value per gateway
//! ([`crate::PluginServices::conn_stats`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Shards owned by one thread each; the threads after them share one more.
const OWNED_SHARDS: usize = 64;

#[derive(Default)]
#[repr(align(128))]
struct Shard {
    accepted: AtomicU64,
    closed: AtomicU64,
    requests: AtomicU64,
    finished: AtomicU64,
}

/// Connection and request counters (`apisix_nginx_http_current_connections`,
/// `apisix_http_requests_total`).
pub struct ConnStats {
    shards: Box<[Shard]>,
}

impl std::fmt::Debug for ConnStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnStats")
            .field("totals", &self.read())
            .finish()
    }
}

/// The summed counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnTotals {
    pub accepted: u64,
    pub handled: u64,
    pub active: u64,
    pub reading: u64,
    pub writing: u64,
    pub waiting: u64,
    pub requests: u64,
}

/// This thread's shard: the first threads to count own one each, in the order they first
/// count; later ones share the last (only the numbering is process-wide; every gateway's
/// counts are its own).
fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed).min(OWNED_SHARDS);
    }
    INDEX.with(|i| *i)
}

/// Adds one to a counter of the shard at `index`: only this thread writes an owned shard.
fn bump(counter: &AtomicU64, index: usize) {
    if index < OWNED_SHARDS {
        counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    } else {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

impl Default for ConnStats {
    fn default() -> Self {
        ConnStats::new()
    }
}

impl ConnStats {
    pub fn new() -> ConnStats {
        ConnStats {
            shards: (0..=OWNED_SHARDS).map(|_| Shard::default()).collect(),
        }
    }

    /// Adds one to the counter `field` picks in this thread's shard.
    fn bump(&self, field: impl Fn(&Shard) -> &AtomicU64) {
        let index = shard_index();
        bump(field(&self.shards[index]), index);
    }

    /// A client connection was accepted.
    pub fn connection_opened(&self) {
        self.bump(|s| &s.accepted);
    }

    /// A client connection was closed.
    pub fn connection_closed(&self) {
        self.bump(|s| &s.closed);
    }

    /// A request arrived (nginx counts it in `requests` and in `writing` until it is answered).
    pub fn request_started(&self) {
        self.bump(|s| &s.requests);
    }

    /// A request's response is complete (or the client went away).
    pub fn request_finished(&self) {
        self.bump(|s| &s.finished);
    }

    pub fn read(&self) -> ConnTotals {
        let mut accepted = 0u64;
        let mut closed = 0u64;
        let mut requests = 0u64;
        let mut finished = 0u64;
        for s in self.shards.iter() {
            accepted += s.accepted.load(Ordering::Relaxed);
            closed += s.closed.load(Ordering::Relaxed);
            requests += s.requests.load(Ordering::Relaxed);
            finished += s.finished.load(Ordering::Relaxed);
        }
        let active = accepted.saturating_sub(closed);
        let writing = requests.saturating_sub(finished).min(active.max(1));
        ConnTotals {
            accepted,
            handled: accepted,
            active,
            // hyper reads request heads without telling; nginx's `reading` is rarely non-zero.
            reading: 0,
            writing,
            waiting: active.saturating_sub(writing),
            requests,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals() {
        let s = ConnStats::new();
        s.connection_opened();
        s.connection_opened();
        s.request_started();
        let t = s.read();
        assert_eq!(
            (t.accepted, t.active, t.writing, t.waiting, t.requests),
            (2, 2, 1, 1, 1)
        );
        s.request_finished();
        s.connection_closed();
        let t = s.read();
        assert_eq!((t.active, t.writing, t.waiting, t.handled), (1, 0, 1, 2));
    }

    /// Many threads, more than there are owned shards, counting at once: no count is lost
    /// (the threads past the owned shards share one, with locked adds).
    #[test]
    fn every_thread_counts_exactly() {
        const THREADS: usize = OWNED_SHARDS + 16;
        const EACH: u64 = 100_000;
        let s = std::sync::Arc::new(ConnStats::new());
        let start = std::sync::Arc::new(std::sync::Barrier::new(THREADS));
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                let (s, start) = (s.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    for _ in 0..EACH {
                        s.request_started();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(s.read().requests, THREADS as u64 * EACH);
    }
}
