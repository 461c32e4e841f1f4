//! Every route of a table by its key, to find what a removal takes out.
//!
//! A persistent hash index in shards: each shard is a table of the routes themselves (the key
//! is read from the route, so it is stored once), shared between versions; a change copies the
//! one shard it touches (pointers to the routes, a few hundred at 100,000 routes) and a clone
//! copies the list of shards. A radix tree over the keys did the same job at about 140 bytes
//! per route; this one costs about twelve.

use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::HashTable;

/// Shards per index: at 100,000 routes a change copies about 400 pointers.
const SHARDS: usize = 256;

/// foldhash, randomly seeded per index (route keys carry ids chosen by whoever writes the
/// store, so where they land must not be predictable) and kept by the index's versions.
type Hasher = foldhash::fast::RandomState;

/// What the index can read a route's key from.
pub(crate) trait Keyed {
    fn key(&self) -> &[u8];
}

/// One shard: the routes whose key's hash picks it.
type Shard<V> = Option<Arc<HashTable<Arc<V>>>>;

pub(crate) struct RouteIndex<V> {
    hasher: Hasher,
    /// `None` until a route lands in it: a table of a few routes allocates a few shards.
    shards: Arc<[Shard<V>]>,
}

impl<V> Clone for RouteIndex<V> {
    fn clone(&self) -> Self {
        RouteIndex {
            hasher: self.hasher.clone(),
            shards: self.shards.clone(),
        }
    }
}

impl<V> Default for RouteIndex<V> {
    fn default() -> Self {
        RouteIndex {
            hasher: Hasher::default(),
            shards: (0..SHARDS).map(|_| None).collect(),
        }
    }
}

impl<V: Keyed> RouteIndex<V> {
    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    fn shard_of(hash: u64) -> usize {
        // The table inside the shard uses the low bits: pick the shard with the high ones.
        (hash >> 56) as usize % SHARDS
    }

    pub(crate) fn get(&self, key: &[u8]) -> Option<&Arc<V>> {
        let hash = self.hash(key);
        self.shards[Self::shard_of(hash)]
            .as_ref()?
            .find(hash, |v| v.key() == key)
    }

    /// The shard `hash` falls in, ready to change: copied first when another version holds
    /// it.
    fn shard_mut(&mut self, hash: u64) -> &mut HashTable<Arc<V>> {
        if Arc::get_mut(&mut self.shards).is_none() {
            self.shards = self.shards.iter().cloned().collect();
        }
        let shards = Arc::get_mut(&mut self.shards).expect("a fresh copy is not shared");
        let shard = shards[Self::shard_of(hash)].get_or_insert_with(Default::default);
        Arc::make_mut(shard)
    }

    /// Puts `route` under its key, replacing what was there.
    pub(crate) fn insert(&mut self, route: Arc<V>) {
        let hash = self.hash(route.key());
        let hasher = self.hasher.clone();
        let shard = self.shard_mut(hash);
        match shard.find_mut(hash, |v| v.key() == route.key()) {
            Some(slot) => *slot = route,
            None => {
                shard.insert_unique(hash, route, |v| hasher.hash_one(v.key()));
            }
        }
    }

    /// Whether no route is kept (every shard is empty).
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.shards.iter().flatten().all(|s| s.is_empty())
    }

    /// Takes out the route under `key`.
    pub(crate) fn remove(&mut self, key: &[u8]) -> Option<Arc<V>> {
        let hash = self.hash(key);
        self.shards[Self::shard_of(hash)].as_ref()?;
        let hasher = self.hasher.clone();
        let shard = self.shard_mut(hash);
        let found = shard.find_entry(hash, |v| v.key() == key).ok()?;
        let removed = found.remove().0;
        // A hash table keeps its capacity as it empties, and a copied shard keeps it too: after
        // 100,000 routes were deleted the index still held room for all of them. An empty
        // shard is dropped and a quarter-full one shrunk, so it costs what it holds.
        if shard.is_empty() {
            let shards = Arc::get_mut(&mut self.shards).expect("shard_mut left it unshared");
            shards[Self::shard_of(hash)] = None;
        } else if shard.len() * 4 <= shard.capacity() {
            shard.shrink_to_fit(|v| hasher.hash_one(v.key()));
        }
        Some(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Item(Vec<u8>, u32);

    impl Keyed for Item {
        fn key(&self) -> &[u8] {
            &self.0
        }
    }

    fn item(k: &str, v: u32) -> Arc<Item> {
        Arc::new(Item(k.as_bytes().to_vec(), v))
    }

    #[test]
    fn versions_share_what_a_change_did_not_touch() {
        let mut a = RouteIndex::default();
        for i in 0..2000 {
            a.insert(item(&i.to_string(), i));
        }
        let mut b = a.clone();
        b.insert(item("7", 70));
        assert_eq!(b.remove(b"8").map(|v| v.1), Some(8));
        assert!(b.remove(b"8").is_none());
        b.insert(item("new", 1));
        // The older version is unchanged.
        assert_eq!(a.get(b"7").map(|v| v.1), Some(7));
        assert_eq!(a.get(b"8").map(|v| v.1), Some(8));
        assert!(a.get(b"new").is_none());
        assert_eq!(b.get(b"7").map(|v| v.1), Some(70));
        assert!(b.get(b"8").is_none());
        assert_eq!(b.get(b"new").map(|v| v.1), Some(1));
        // Shards the changes did not touch are the same allocation in both (or empty in both:
        // 2,000 keys leave one of the 256 shards empty in about one seeding of ten).
        let same = (a.shards.iter().zip(b.shards.iter()))
            .filter(|(x, y)| match (x, y) {
                (Some(x), Some(y)) => Arc::ptr_eq(x, y),
                (None, None) => true,
                _ => false,
            })
            .count();
        assert!(same >= SHARDS - 3, "{same} shards shared");
        for i in 0..2000u32 {
            let want = match i {
                7 => Some(70),
                8 => None,
                i => Some(i),
            };
            assert_eq!(b.get(i.to_string().as_bytes()).map(|v| v.1), want);
        }
    }

    /// Room the shards hold, in routes.
    fn capacity<V>(index: &RouteIndex<V>) -> usize {
        index.shards.iter().flatten().map(|s| s.capacity()).sum()
    }

    #[test]
    fn removals_give_back_the_room_they_freed() {
        let mut index = RouteIndex::default();
        for i in 0..20_000 {
            index.insert(item(&i.to_string(), i));
        }
        let full = capacity(&index);
        assert!(full >= 20_000, "{full}");
        // An older version holding every shard: the removals copy them, as a compile does.
        let older = index.clone();
        for i in 0..19_000 {
            assert_eq!(index.remove(i.to_string().as_bytes()).map(|v| v.1), Some(i));
        }
        let left = capacity(&index);
        assert!(
            left <= 4 * 1_000 + SHARDS * 4,
            "{left} of {full} kept for 1,000 routes"
        );
        for i in 0..20_000u32 {
            let want = (i >= 19_000).then_some(i);
            assert_eq!(index.get(i.to_string().as_bytes()).map(|v| v.1), want);
            assert_eq!(older.get(i.to_string().as_bytes()).map(|v| v.1), Some(i));
        }
        for i in 19_000..20_000 {
            index.remove(i.to_string().as_bytes());
        }
        assert_eq!(capacity(&index), 0);
        assert!(index.shards.iter().all(Option::is_none));
    }
}
