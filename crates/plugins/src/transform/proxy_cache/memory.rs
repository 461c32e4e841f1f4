//! The memory strategy's zones: stored answers by cache key, bounded by the zone's
//! `memory_size` (APISIX's `lua_shared_dict` of that size).
//!
//! Keys are spread over shards, each a short critical section around its own recency list,
//! so hits on different keys rarely meet. The zone's bytes are one budget across the shards:
//! storing an answer first evicts the least recently used entries (its own shard's first, then
//! the others' in turn) until it fits, as a full shared dictionary evicts. An entry past its
//! time stays until it is evicted or replaced, and is reported as expired meanwhile (the
//! dictionary's `get_stale`).
//!
//! Answers with `Vary` are kept as APISIX's memory strategy keeps them: per cache key an index
//! (the sorted header names and the signatures stored, at most 64, the oldest dropped first)
//! and one entry per signature, the MD5 of the request's values of those headers. Every key
//! derived from a cache key starts with the cache key's length, so no cache key a client can
//! make names another's variant.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use std::hash::BuildHasher;

use http::HeaderMap;
use md5::{Digest, Md5};

use super::lru::Lru;
use super::stored::Stored;

/// The most variants an index keeps (APISIX's `MAX_VARIANTS`).
const MAX_VARIANTS: usize = 64;

const SHARDS: usize = 16;

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup {
    Fresh(Arc<Stored>),
    /// Found, but past its time (nginx's and APISIX's `EXPIRED`); the disk zones give the
    /// answer, which may still be served within its stale windows.
    Expired(Option<Arc<Stored>>),
    Missing,
}

/// The variants stored for one cache key.
#[derive(Debug)]
pub struct VaryIndex {
    /// The request headers the answers vary on, lower-cased and sorted.
    pub vary: Vec<String>,
    /// The signatures stored, oldest first.
    pub variants: Vec<String>,
    pub expires_ms: u64,
}

impl VaryIndex {
    fn weight(&self) -> usize {
        64 + self.vary.iter().map(|v| v.len() + 24).sum::<usize>() + self.variants.len() * 56
    }
}

/// What a key holds: an answer, or the index of a cache key's variants.
#[derive(Clone, Debug)]
enum Slot {
    Answer(Arc<Stored>),
    Index(Arc<VaryIndex>),
}

/// One shard's entries.
type Shard = Mutex<Lru<Box<str>, Slot>>;

/// The key of a cache key's own entry (APISIX's `entry_key`).
fn entry_key(base: &str) -> String {
    format!("{}:{base}", base.len())
}

/// The key of one variant (APISIX's `variant_key`).
fn variant_key(base: &str, signature: &str) -> String {
    format!("{}:{base}::{signature}", base.len())
}

/// The key of the variant index (APISIX's `index_key`).
fn index_key(base: &str) -> String {
    format!("{}:{base}::__vary", base.len())
}

/// A request's signature for the headers `vary` names (APISIX's `compute_signature`): the MD5
/// of their values joined by NUL, a missing header as nothing, several of one name joined by
/// `, ` as nginx's `$http_` variables join them.
pub fn signature(vary: &[String], request: &HeaderMap) -> String {
    if vary.is_empty() {
        return String::new();
    }
    let mut md5 = Md5::new();
    for (i, name) in vary.iter().enumerate() {
        if i > 0 {
            md5.update(b"\0");
        }
        for (j, v) in request.get_all(name.as_str()).iter().enumerate() {
            if j > 0 {
                md5.update(b", ");
            }
            md5.update(v.as_bytes());
        }
    }
    let digest: [u8; 16] = md5.finalize().into();
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

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

    fn slot(&self, key: &str) -> Option<Slot> {
        lock(&self.shards[self.shard(key)]).get(key).cloned()
    }

    /// The answer stored under `key` itself.
    pub fn get(&self, key: &str, now_ms: u64) -> Lookup {
        match self.slot(key) {
            Some(Slot::Answer(s)) if s.expires_ms <= now_ms => Lookup::Expired(None),
            Some(Slot::Answer(s)) => Lookup::Fresh(s),
            _ => Lookup::Missing,
        }
    }

    /// The index of `base`'s variants; an expired one only when `stale` (APISIX reads it
    /// stale to purge or rebuild, never to look up).
    fn index(&self, base: &str, now_ms: u64, stale: bool) -> Option<Arc<VaryIndex>> {
        match self.slot(&index_key(base)) {
            Some(Slot::Index(i)) if stale || i.expires_ms > now_ms => Some(i),
            _ => None,
        }
    }

    /// The answer for a request under the cache key `base`: its variant when the key's index
    /// says the answers vary, else the key's own entry (APISIX's `lookup_storage_key`).
    pub fn lookup(&self, base: &str, request: &HeaderMap, now_ms: u64) -> Lookup {
        match self.index(base, now_ms, false) {
            Some(index) if !index.vary.is_empty() => {
                self.get(&variant_key(base, &signature(&index.vary, request)), now_ms)
            }
            _ => self.get(&entry_key(base), now_ms),
        }
    }

    /// Stores the answer for the cache key `base`: under its variant when it varies on
    /// headers (the index updated, the key's own entry dropped), else under the key's own
    /// entry (the variants of an earlier answer dropped), as APISIX's `body_filter` does.
    pub fn store(
        &self,
        base: &str,
        vary: &[String],
        signature: &str,
        stored: Arc<Stored>,
        now_ms: u64,
    ) -> bool {
        if vary.is_empty() {
            if self.index(base, now_ms, false).is_some() {
                self.purge_all(base);
            }
            return self.set(&entry_key(base), stored);
        }
        let expires_ms = stored.expires_ms;
        let ok = self.set(&variant_key(base, signature), stored);
        self.update_index(base, vary, signature, expires_ms);
        self.purge(&entry_key(base));
        ok
    }

    /// APISIX's `update_vary_index`: the signature joins the index when the index varies on
    /// the same headers (the oldest dropped past 64), else the old variants go and a new index
    /// starts.
    fn update_index(&self, base: &str, vary: &[String], signature: &str, expires_ms: u64) {
        let current = self.index(base, 0, true);
        let variants = match current {
            Some(c) if c.vary == vary => {
                let mut variants = c.variants.clone();
                if !variants.iter().any(|s| s == signature) {
                    while variants.len() >= MAX_VARIANTS {
                        let old = variants.remove(0);
                        self.purge(&variant_key(base, &old));
                    }
                    variants.push(signature.to_owned());
                }
                variants
            }
            other => {
                for old in other.iter().flat_map(|c| c.variants.iter()) {
                    self.purge(&variant_key(base, old));
                }
                vec![signature.to_owned()]
            }
        };
        let index = Arc::new(VaryIndex {
            vary: vary.to_vec(),
            variants,
            expires_ms,
        });
        self.set_slot(&index_key(base), Slot::Index(index));
    }

    /// APISIX's PURGE: every variant, the index and the key's own entry go; whether there was
    /// an entry or an index (fresh or expired).
    pub fn purge_all(&self, base: &str) -> bool {
        let index = self.index(base, 0, true);
        for sig in index.iter().flat_map(|i| i.variants.iter()) {
            self.purge(&variant_key(base, sig));
        }
        let had_index = self.purge(&index_key(base));
        self.purge(&entry_key(base)) || had_index
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
        self.set_slot(key, Slot::Answer(value))
    }

    fn set_slot(&self, key: &str, value: Slot) -> bool {
        let weight = key.len()
            + match &value {
                Slot::Answer(s) => s.weight(),
                Slot::Index(i) => i.weight(),
            };
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
            stale: Default::default(),
        })
    }

    #[test]
    fn fresh_expired_missing_and_purge() {
        let z = MemoryZone::new(1 << 20);
        assert!(matches!(z.get("k", 0), Lookup::Missing));
        assert!(z.set("k", answer(3, 1000)));
        assert!(matches!(z.get("k", 999), Lookup::Fresh(s) if s.body == "xxx"));
        assert!(matches!(z.get("k", 1000), Lookup::Expired(_)));
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
