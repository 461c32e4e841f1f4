//! Per-key state shared by every worker thread (APISIX's `plugin-limit-req` and
//! `plugin-limit-conn` shared dicts), for limit-req and limit-conn.
//!
//! Like limit-count's local counters: a [`Keyed`] map is sharded by key over short critical
//! sections, keys from `remote_addr` are stored as addresses (no formatting on the common
//! path), and [`SpaceMap`] hands out one space per `<owner key>:<crc32 of the conf>` prefix so
//! an unchanged configuration keeps its state across snapshots.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::limit_count::local::KeyRef;

const SHARDS: usize = 32;

/// An owned key, for state that must find its entry again later (limit-conn's decrement).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum OwnedKey {
    Ip(IpAddr),
    Text(Box<str>),
}

impl OwnedKey {
    pub fn as_ref(&self) -> KeyRef<'_> {
        match self {
            OwnedKey::Ip(ip) => KeyRef::Ip(*ip),
            OwnedKey::Text(t) => KeyRef::Text(t),
        }
    }

    pub fn from_ref(key: KeyRef<'_>) -> OwnedKey {
        match key.normalized() {
            KeyRef::Ip(ip) => OwnedKey::Ip(ip),
            KeyRef::Text(t) => OwnedKey::Text(t.into()),
        }
    }
}

struct Shard<V> {
    ip: HashMap<IpAddr, V>,
    text: HashMap<Box<str>, V>,
    /// When idle entries were last dropped (monotonic ms).
    swept_ms: u64,
}

impl<V> Default for Shard<V> {
    fn default() -> Self {
        Shard {
            ip: HashMap::new(),
            text: HashMap::new(),
            swept_ms: 0,
        }
    }
}

impl<V> Shard<V> {
    fn len(&self) -> usize {
        self.ip.len() + self.text.len()
    }
}

/// Per-key values of type `V`, sharded.
pub struct Keyed<V> {
    shards: Box<[Mutex<Shard<V>>]>,
    hasher: std::collections::hash_map::RandomState,
}

impl<V> Default for Keyed<V> {
    fn default() -> Self {
        Keyed {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: Default::default(),
        }
    }
}

impl<V> Keyed<V> {
    fn shard(&self, key: KeyRef<'_>) -> MutexGuard<'_, Shard<V>> {
        let mut h = self.hasher.build_hasher();
        match key {
            KeyRef::Ip(ip) => ip.hash(&mut h),
            KeyRef::Text(t) => t.hash(&mut h),
        }
        let i = (h.finish() as usize) % SHARDS;
        // A panic while holding a shard leaves plain numbers behind: still usable.
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the entry of `key` (`None` if there is none) under its shard's lock. `f`
    /// answers the entry to keep (`None` removes it) and a result. `idle` tells entries that
    /// may be dropped when the shard is swept (at most once a second).
    pub fn update<R>(
        &self,
        key: KeyRef<'_>,
        now_ms: u64,
        idle: impl Fn(&V) -> bool,
        f: impl FnOnce(Option<&V>) -> (Option<V>, R),
    ) -> R {
        let key = key.normalized();
        let mut guard = self.shard(key);
        let shard = &mut *guard;
        if now_ms >= shard.swept_ms + 1000 && shard.len() > 0 {
            shard.swept_ms = now_ms;
            shard.ip.retain(|_, v| !idle(v));
            shard.text.retain(|_, v| !idle(v));
        }
        match key {
            KeyRef::Ip(ip) => {
                let (keep, r) = f(shard.ip.get(&ip));
                match keep {
                    Some(v) => {
                        shard.ip.insert(ip, v);
                    }
                    None => {
                        shard.ip.remove(&ip);
                    }
                }
                r
            }
            KeyRef::Text(t) => {
                let (keep, r) = f(shard.text.get(t));
                match keep {
                    Some(v) => match shard.text.get_mut(t) {
                        Some(slot) => *slot = v,
                        None => {
                            shard.text.insert(t.into(), v);
                        }
                    },
                    None => {
                        shard.text.remove(t);
                    }
                }
                r
            }
        }
    }

    /// Drops idle entries now; answers whether any entry is left.
    pub fn sweep(&self, idle: impl Fn(&V) -> bool) -> bool {
        let mut left = false;
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            shard.ip.retain(|_, v| !idle(v));
            shard.text.retain(|_, v| !idle(v));
            left |= shard.len() > 0;
        }
        left
    }

    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Spaces of type `S` by prefix.
pub struct SpaceMap<S> {
    map: Mutex<HashMap<Box<str>, Arc<S>>>,
}

impl<S> Default for SpaceMap<S> {
    fn default() -> Self {
        SpaceMap {
            map: Mutex::new(HashMap::new()),
        }
    }
}

impl<S> std::fmt::Debug for SpaceMap<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpaceMap")
    }
}

impl<S> SpaceMap<S> {
    /// The space for `prefix`, made by `make` if there is none.
    pub fn get(&self, prefix: &str, make: impl FnOnce() -> S) -> Arc<S> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = map.get(prefix) {
            return s.clone();
        }
        let s = Arc::new(make());
        map.insert(prefix.into(), s.clone());
        s
    }

    /// Drops spaces nothing references and for which `live` says no state is left.
    pub fn sweep(&self, live: impl Fn(&S) -> bool) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, s| Arc::strong_count(s) > 1 || live(s));
    }

    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_inserts_replaces_and_removes() {
        let k: Keyed<u64> = Keyed::default();
        let ip = KeyRef::Ip("1.2.3.4".parse().unwrap());
        let incr = |v: Option<&u64>| {
            let n = v.copied().unwrap_or(0) + 1;
            (Some(n), n)
        };
        assert_eq!(k.update(ip, 0, |_| false, incr), 1);
        // The text spelling of an address is the address.
        assert_eq!(k.update(KeyRef::Text("1.2.3.4"), 0, |_| false, incr), 2);
        assert_eq!(k.update(KeyRef::Text("a"), 0, |_| false, incr), 1);
        assert_eq!(k.len(), 2);
        k.update(KeyRef::Text("a"), 0, |_| false, |_| (None, ()));
        assert_eq!(k.len(), 1);
        assert!(!k.sweep(|_| true));
        assert!(k.is_empty());
    }
}
