//! Node-level numbers: nginx's `stub_status` counters as ferrisix keeps them, and what the
//! configuration store reports.
//!
//! The connection counters are bumped by the proxy on every accept, close and request, from
//! every worker thread; each thread writes its own cache-line-padded shard, so the bumps never
//! contend. Reading sums the shards.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

const SHARDS: usize = 64;

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

fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    INDEX.with(|i| *i)
}

/// The process' counters.
pub fn conn_stats() -> &'static ConnStats {
    static STATS: OnceLock<ConnStats> = OnceLock::new();
    STATS.get_or_init(|| ConnStats {
        shards: (0..SHARDS).map(|_| Shard::default()).collect(),
    })
}

impl ConnStats {
    fn shard(&self) -> &Shard {
        &self.shards[shard_index()]
    }

    /// A client connection was accepted.
    pub fn connection_opened(&self) {
        self.shard().accepted.fetch_add(1, Ordering::Relaxed);
    }

    /// A client connection was closed.
    pub fn connection_closed(&self) {
        self.shard().closed.fetch_add(1, Ordering::Relaxed);
    }

    /// A request arrived (nginx counts it in `requests` and in `writing` until it is answered).
    pub fn request_started(&self) {
        self.shard().requests.fetch_add(1, Ordering::Relaxed);
    }

    /// A request's response is complete (or the client went away).
    pub fn request_finished(&self) {
        self.shard().finished.fetch_add(1, Ordering::Relaxed);
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

/// What the configuration store and the data plane say, for `apisix_etcd_reachable`,
/// `apisix_etcd_modify_indexes` and `apisix_upstream_status`.
pub trait NodeSource: Send + Sync {
    /// `None`: not applicable (reported as reachable, as a file provider always is).
    fn etcd_reachable(&self) -> Option<bool> {
        None
    }

    /// `(key, index)` pairs (`routes`, `services`, ..., `max_modify_index`); empty when the
    /// store has no such indexes (standalone files).
    fn modify_indexes(&self) -> Vec<(String, i64)> {
        Vec::new()
    }

    /// `apisix_upstream_status`: `(checker name, ip, port, healthy)` of every health-checked
    /// node.
    fn upstream_status(&self) -> Vec<(String, String, u16, bool)> {
        Vec::new()
    }
}

/// The local host name (`apisix_node_info{hostname}`).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals() {
        let s = ConnStats {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        };
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
}
