//! Test support shared by the workspace's tests (feature `test-support`, never in the binary):
//! a throwaway etcd on random ports ([`etcd::Etcd`], with TLS and a blocking client for direct
//! reads and writes, as APISIX or an operator would do them) and the list of programs the tests
//! run, with the Debian packages that hold them ([`debian`]).
//!
//! The in-memory store the Admin API's tests run on is [`crate::store::memory::MemoryStore`],
//! behind the same feature.

pub mod debian;
pub mod etcd;

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// The ports [`free_port`] hands out: below Linux's ephemeral range (32768–60999), so an
/// outgoing connection or another `bind(:0)` never takes one between the pick and its use.
const PORTS: std::ops::Range<u32> = 20_000..32_000;

/// A 127.0.0.1 port, free when picked and never handed out before in this process.
///
/// `bind(:0)` and let go is not enough: the kernel may give the same ephemeral port to the
/// next caller (two listeners of one node collided that way in CI) or to a client socket.
/// A process-wide cursor over [`PORTS`], started at a point drawn from the pid and the
/// clock, keeps the picks of one test process apart and different processes unlikely to meet.
pub fn free_port() -> u16 {
    static CURSOR: AtomicU32 = AtomicU32::new(u32::MAX);
    let span = PORTS.end - PORTS.start;
    if CURSOR.load(Ordering::Relaxed) == u32::MAX {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let seed = std::process::id().wrapping_mul(7919).wrapping_add(nanos) % span;
        let _ = CURSOR.compare_exchange(u32::MAX, seed, Ordering::Relaxed, Ordering::Relaxed);
    }
    for _ in 0..span {
        let offset = CURSOR.fetch_add(1, Ordering::Relaxed) % span;
        let port = (PORTS.start + offset) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free 127.0.0.1 port in {PORTS:?}");
}

/// A 127.0.0.1 port `p` with `p + offset` free too (a redis cluster node listens on `p` and
/// its cluster bus on `p + 10000`), both below [`PORTS`] so that [`free_port`] never hands
/// either out; never the same `p` twice in this process.
pub fn free_port_and(offset: u16) -> u16 {
    static CURSOR: AtomicU32 = AtomicU32::new(u32::MAX);
    let offset = u32::from(offset);
    assert!(offset < PORTS.start - 2048, "offset {offset} too large");
    let low = 1024..PORTS.start - offset;
    let span = low.end - low.start;
    if CURSOR.load(Ordering::Relaxed) == u32::MAX {
        let seed = std::process::id().wrapping_mul(7919) % span;
        let _ = CURSOR.compare_exchange(u32::MAX, seed, Ordering::Relaxed, Ordering::Relaxed);
    }
    for _ in 0..span {
        let port = low.start + CURSOR.fetch_add(1, Ordering::Relaxed) % span;
        let free = |p: u32| TcpListener::bind(("127.0.0.1", p as u16)).is_ok();
        if free(port) && free(port + offset) {
            return port as u16;
        }
    }
    panic!(
        "no free 127.0.0.1 port pair {offset} apart below {}",
        PORTS.start
    );
}

#[cfg(test)]
mod tests {
    use super::{free_port, free_port_and};

    #[test]
    fn port_pairs_are_free_and_below_the_single_ports() {
        let a = free_port_and(10_000);
        let b = free_port_and(10_000);
        assert_ne!(a, b);
        for p in [a, b] {
            assert!(u32::from(p) + 10_000 < 20_000);
            assert!(std::net::TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok());
        }
    }

    #[test]
    fn picks_are_distinct_bindable_and_outside_the_ephemeral_range() {
        let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len());
        assert!(ports.iter().all(|p| (20_000..32_000).contains(p)));
        assert!(std::net::TcpListener::bind(("127.0.0.1", ports[0])).is_ok());
    }
}
