//! A map keyed by resource id whose clones share their storage: cloning one is a reference
//! count, and a change to a clone copies only the shard holding the key (about a
//! thousandth of the map), never the whole map.
//!
//! The configuration is held in such maps so that publishing a new state after one change
//! and compiling it cost what the change touched, not the size of the configuration (100,000
//! routes). Two versions are compared shard by shard: a shard that is still the same
//! allocation in both holds nothing that differs, so a diff after one change looks at one
//! shard.

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;

/// Shards per map: at 100,000 entries a change copies about a hundred of them.
const SHARDS: usize = 1024;

/// foldhash, seeded at random per map and per shard: ids are chosen by whoever writes the
/// store, so the seed must not be predictable; SipHash (std's) was a visible share of a
/// 100,000-route boot (`benches/e2e/boot_ab.py` times the boot).
type RandomState = foldhash::fast::RandomState;

type Shard<V> = Option<Arc<HashMap<String, V, RandomState>>>;

pub struct SharedMap<V> {
    /// Which shard a key is in. Seeded once per map and kept by its clones (a random seed, so
    /// ids chosen to land in one shard cannot be computed ahead).
    hasher: Arc<RandomState>,
    shards: Arc<Vec<Shard<V>>>,
    len: usize,
}

impl<V> Clone for SharedMap<V> {
    fn clone(&self) -> Self {
        SharedMap {
            hasher: self.hasher.clone(),
            shards: self.shards.clone(),
            len: self.len,
        }
    }
}

impl<V> Default for SharedMap<V> {
    fn default() -> Self {
        SharedMap {
            hasher: Arc::new(RandomState::default()),
            shards: Arc::new(vec![None; SHARDS]),
            len: 0,
        }
    }
}

impl<V: fmt::Debug> fmt::Debug for SharedMap<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// Equal when they hold the same entries (whatever their shards).
impl<V: PartialEq> PartialEq for SharedMap<V> {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().all(|(k, v)| other.get(k) == Some(v))
    }
}

impl<V: Clone> FromIterator<(String, V)> for SharedMap<V> {
    fn from_iter<I: IntoIterator<Item = (String, V)>>(iter: I) -> Self {
        let mut m = SharedMap::default();
        for (k, v) in iter {
            m.insert(k, v);
        }
        m
    }
}

impl<V> SharedMap<V> {
    pub fn new() -> SharedMap<V> {
        SharedMap::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn shard_of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) % SHARDS
    }

    pub fn get(&self, key: &str) -> Option<&V> {
        self.shards[self.shard_of(key)].as_ref()?.get(key)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Entries in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &V)> {
        self.shards.iter().flatten().flat_map(|s| s.iter())
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    /// The keys whose entries may differ between `self` and `other`: every key of the shards
    /// that are not the same allocation in both (all keys, if the two maps are unrelated).
    /// The caller compares the values.
    pub fn candidates<'a>(&'a self, other: &'a SharedMap<V>) -> Vec<&'a String> {
        if Arc::ptr_eq(&self.shards, &other.shards) {
            return Vec::new();
        }
        let related = self.same_seed(other);
        if !related {
            return self.keys().chain(other.keys()).collect();
        }
        let mut out = Vec::new();
        for (a, b) in self.shards.iter().zip(other.shards.iter()) {
            let same = match (a, b) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            };
            if !same {
                out.extend(a.iter().flat_map(|s| s.keys()));
                out.extend(b.iter().flat_map(|s| s.keys()));
            }
        }
        out
    }

    /// Whether both place keys alike (one is a clone of the other, or of a common ancestor).
    fn same_seed(&self, other: &SharedMap<V>) -> bool {
        Arc::ptr_eq(&self.hasher, &other.hasher)
    }
}

impl<V: Clone> SharedMap<V> {
    fn shard_mut(&mut self, i: usize) -> &mut HashMap<String, V, RandomState> {
        let shards = Arc::make_mut(&mut self.shards);
        Arc::make_mut(shards[i].get_or_insert_with(Default::default))
    }

    pub fn insert(&mut self, key: String, value: V) -> Option<V> {
        let i = self.shard_of(&key);
        let old = self.shard_mut(i).insert(key, value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub fn remove(&mut self, key: &str) -> Option<V> {
        let i = self.shard_of(key);
        self.shards[i].as_ref()?.get(key)?;
        let shard = self.shard_mut(i);
        let old = shard.remove(key);
        if shard.is_empty() {
            Arc::make_mut(&mut self.shards)[i] = None;
        }
        self.len -= 1;
        old
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_shares_and_a_change_copies_one_shard() {
        let mut a: SharedMap<u32> = (0..5000).map(|i| (i.to_string(), i)).collect();
        assert_eq!(a.len(), 5000);
        let before = a.clone();
        assert!(a.candidates(&before).is_empty());
        a.insert("17".into(), 1700);
        a.insert("new".into(), 1);
        assert_eq!(a.remove("18"), Some(18));
        assert_eq!(a.remove("18"), None);
        assert_eq!(a.len(), 5000);
        // The clone is untouched.
        assert_eq!(before.get("17"), Some(&17));
        assert_eq!(before.get("18"), Some(&18));
        assert_eq!(before.get("new"), None);
        assert_eq!(a.get("17"), Some(&1700));
        // Only the shards of the three keys differ.
        let c = a.candidates(&before);
        for k in ["17", "18", "new"] {
            assert!(c.iter().any(|x| *x == k), "{k}");
        }
        assert!(c.len() < 100, "{}", c.len());
        assert_ne!(a, before);
        let mut back = a.clone();
        back.insert("17".into(), 17);
        back.insert("18".into(), 18);
        back.remove("new");
        assert_eq!(back, before);
        // Unrelated maps are compared whole.
        let other: SharedMap<u32> = before.iter().map(|(k, v)| (k.clone(), *v)).collect();
        assert_eq!(other, before);
        assert_eq!(other.candidates(&before).len(), 10000);
    }

    #[test]
    fn emptied_shards_are_released() {
        let mut m: SharedMap<u8> = SharedMap::new();
        m.insert("a".into(), 1);
        assert!(m.contains_key("a") && !m.is_empty());
        m.remove("a");
        assert!(m.is_empty());
        assert!(m.shards.iter().all(Option::is_none));
        assert_eq!(m.iter().count(), 0);
    }
}
