//! The memory strategy's zones: stored answers by cache key, bounded by the zone's
//! `memory_size` (APISIX's `lua_shared_dict` of that size).
//!
//! Keys are spread over shards, each a short critical section around its own recency list,
//! so hits on different keys rarely meet. The zone's bytes are one budget across the shards:
//! storing an answer first evicts the least recently used entries (its own shard's first, then
//! the others' in turn) until it fits, as a full shared dictionary evicts. An entry past its
//! time stays until it is evicted or replaced, and is reported as expired meanwhile (the
//! dictionary's `get_stale`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use std::hash::BuildHasher;

use super::lru::Lru;
use super::stored::Stored;

const SHARDS: usize = 16;

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup {
    Fresh(Arc<Stored>),
    /// Found, but past its time (nginx's and APISIX's `EXPIRED`).
    Expired,
    Missing,
}

/// One shard's entries.
type Shard = Mutex<Lru<Box<str>, Arc<Stored>>>;

/// One memory zone.
pub struct MemoryZone {
    shards: Box<[Shard]>,
    hasher: foldhash::fast::FixedState,
    capacity: usize,
    used: AtomicUsize,
}

impl std::fmt::Debug for MemoryZone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemoryZone({} of {} bytes)", self.used(), self.capacity)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a shard leaves a consistent list behind (every change is made
    // before anything that could panic): still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MemoryZone {
    pub fn new(capacity: u64) -> MemoryZone {
        MemoryZone {
            shards: (0..SHARDS).map(|_| Mutex::new(Lru::default())).collect(),
            hasher: foldhash::fast::FixedState::default(),
            capacity: usize::try_from(capacity).unwrap_or(usize::MAX),
            used: AtomicUsize::new(0),
        }
    }

    fn shard(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) % SHARDS
    }

    /// The bytes the zone's entries take.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub fn get(&self, key: &str, now_ms: u64) -> Lookup {
        let mut shard = lock(&self.shards[self.shard(key)]);
        match shard.get(key) {
            None => Lookup::Missing,
            Some(s) if s.expires_ms <= now_ms => Lookup::Expired,
            Some(s) => Lookup::Fresh(s.clone()),
        }
    }

    /// Removes `key`; whether there was an entry (fresh or past its time).
    pub fn purge(&self, key: &str) -> bool {
        let mut shard = lock(&self.shards[self.shard(key)]);
        let weight_before = shard.weight();
        let found = shard.remove(key).is_some();
        self.used
            .fetch_sub(weight_before - shard.weight(), Ordering::Relaxed);
        found
    }

    /// Stores `value` under `key`, evicting the least recently used entries until it fits;
    /// `false` when it is larger than the whole zone (then nothing is evicted).
    pub fn set(&self, key: &str, value: Arc<Stored>) -> bool {
        let weight = value.weight() + key.len();
        if weight > self.capacity {
            // Still drop what the key held: it must not be served after a fresh answer.
            self.purge(key);
            return false;
        }
        let own = self.shard(key);
        self.purge(key);
        let mut turn = 0;
        while self.used() + weight > self.capacity && turn < SHARDS {
            let mut shard = lock(&self.shards[(own + turn) % SHARDS]);
            match shard.pop_lru() {
                Some((_, _, w)) => {
                    self.used.fetch_sub(w, Ordering::Relaxed);
                }
                None => turn += 1,
            }
        }
        let mut shard = lock(&self.shards[own]);
        let before = shard.weight();
        shard.insert(key.into(), value, weight);
        let after = shard.weight();
        // `insert` replaced an entry a concurrent request stored meanwhile, if any.
        if after >= before {
            self.used.fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.used.fetch_sub(before - after, Ordering::Relaxed);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::StatusCode;

    use super::*;

    fn answer(body: usize, expires_ms: u64) -> Arc<Stored> {
        Arc::new(Stored {
            status: StatusCode::OK,
            headers: Vec::new(),
            body: Bytes::from(vec![b'x'; body]),
            stored_ms: 0,
            expires_ms,
        })
    }

    #[test]
    fn fresh_expired_missing_and_purge() {
        let z = MemoryZone::new(1 << 20);
        assert!(matches!(z.get("k", 0), Lookup::Missing));
        assert!(z.set("k", answer(3, 1000)));
        assert!(matches!(z.get("k", 999), Lookup::Fresh(s) if s.body == "xxx"));
        assert!(matches!(z.get("k", 1000), Lookup::Expired));
        assert!(z.purge("k"), "an expired entry is still purged");
        assert!(!z.purge("k"));
        assert_eq!(z.used(), 0);
    }

    #[test]
    fn bounded_by_memory_size_evicting_the_least_recently_used() {
        let one = answer(1000, u64::MAX).weight() + 2;
        let z = MemoryZone::new(one as u64 * 3);
        for k in ["k1", "k2", "k3"] {
            assert!(z.set(k, answer(1000, u64::MAX)));
        }
        assert_eq!(z.used(), one * 3);
        // k1 was used last-but-one: k2 is the oldest when k4 comes.
        assert!(matches!(z.get("k1", 0), Lookup::Fresh(_)));
        assert!(z.set("k4", answer(1000, u64::MAX)));
        assert!(z.used() <= one * 3);
        let present: Vec<&str> = ["k1", "k2", "k3", "k4"]
            .into_iter()
            .filter(|k| matches!(z.get(k, 0), Lookup::Fresh(_)))
            .collect();
        assert_eq!(present.len(), 3, "{present:?}");
        assert!(present.contains(&"k4"));
        // Larger than the zone: not stored, and what the key held goes.
        assert!(!z.set("k4", answer(4000, u64::MAX)));
        assert!(matches!(z.get("k4", 0), Lookup::Missing));
        // Replacing an entry does not count it twice.
        let used = z.used();
        assert!(z.set("k1", answer(1000, u64::MAX)));
        assert!(z.used() <= used.max(one * 3));
    }
}
