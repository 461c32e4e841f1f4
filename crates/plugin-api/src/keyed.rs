//! The sharded per-key map behind the limit plugins' local state (APISIX's
//! `plugin-limit-count`, `plugin-limit-req` and `plugin-limit-conn` shared dicts, which every
//! nginx worker of a node shares).
//!
//! Keys are sharded over short critical sections (a hash lookup and a few integer updates).
//! Keys from `remote_addr` are stored as addresses, so the common path formats and allocates
//! nothing; text that is the canonical form of an address is stored as that address, so both
//! spellings share an entry as they do in APISIX. Idle entries (finished windows, drained
//! buckets) are dropped per shard at most once a second, when that shard is touched.

use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;

use hashbrown::HashTable;
use std::sync::{Mutex, MutexGuard};

const SHARDS: usize = 32;

/// A key: the address itself for `remote_addr`, text otherwise.
#[derive(Clone, Copy, Debug)]
pub enum KeyRef<'a> {
    Ip(IpAddr),
    Text(&'a str),
}

impl KeyRef<'_> {
    /// The text spelling of an address is the address.
    pub fn normalized(self) -> Self {
        match self {
            KeyRef::Text(t) => match t.parse::<IpAddr>() {
                Ok(ip) if ip.to_string() == t => KeyRef::Ip(ip),
                _ => self,
            },
            ip => ip,
        }
    }
}

impl std::fmt::Display for KeyRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyRef::Ip(ip) => write!(f, "{ip}"),
            KeyRef::Text(t) => f.write_str(t),
        }
    }
}

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

/// What to do with a key's entry after looking at it.
#[derive(Debug)]
pub enum Slot<V> {
    /// Keep it (changed in place, or absent and left absent).
    Keep,
    Remove,
    /// Store this value (for an absent key: its first entry).
    Insert(V),
}

struct Shard<V> {
    ip: HashTable<(IpAddr, V)>,
    text: HashTable<(Box<str>, V)>,
    /// When idle entries were last dropped (monotonic ms).
    swept_ms: u64,
}

impl<V> Default for Shard<V> {
    fn default() -> Self {
        Shard {
            ip: HashTable::new(),
            text: HashTable::new(),
            swept_ms: 0,
        }
    }
}

impl<V> Shard<V> {
    fn len(&self) -> usize {
        self.ip.len() + self.text.len()
    }

    fn drop_idle(&mut self, idle: &impl Fn(&V) -> bool) {
        self.ip.retain(|(_, v)| !idle(v));
        self.text.retain(|(_, v)| !idle(v));
    }
}

/// Per-key values of type `V`, sharded.
///
/// Each key is hashed once, with std's randomly keyed SipHash (the keys come from clients):
/// the hash picks the shard and is the shard's table hash too.
pub struct Keyed<V> {
    shards: Box<[Mutex<Shard<V>>]>,
    hasher: RandomState,
}

impl<V> Default for Keyed<V> {
    fn default() -> Self {
        Keyed {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: Default::default(),
        }
    }
}

impl<V> std::fmt::Debug for Keyed<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keyed({})", self.len())
    }
}

/// The shard of a hash: bits the tables do not use (they index with the low bits and tag
/// with the top seven), so one shard's keys still spread over its whole table.
fn shard_index(hash: u64) -> usize {
    (hash >> 40) as usize % SHARDS
}

/// [`Keyed::update`] on one table: `key` finds the entry, `owned` makes its key when `f`
/// inserts one, `rehash` hashes a stored key when the table grows.
fn update_entry<K, V, R>(
    table: &mut HashTable<(K, V)>,
    hash: u64,
    key: impl Fn(&K) -> bool,
    owned: impl FnOnce() -> K,
    rehash: impl Fn(&K) -> u64,
    f: impl FnOnce(Option<&mut V>) -> (Slot<V>, R),
) -> R {
    match table.find_entry(hash, |e| key(&e.0)) {
        Ok(mut entry) => {
            let (slot, r) = f(Some(&mut entry.get_mut().1));
            match slot {
                Slot::Keep => {}
                Slot::Remove => {
                    entry.remove();
                }
                Slot::Insert(v) => entry.get_mut().1 = v,
            }
            r
        }
        Err(_) => {
            let (slot, r) = f(None);
            if let Slot::Insert(v) = slot {
                table.insert_unique(hash, (owned(), v), |e| rehash(&e.0));
            }
            r
        }
    }
}

impl<V> Keyed<V> {
    fn lock(&self, hash: u64) -> MutexGuard<'_, Shard<V>> {
        // A panic while holding a shard leaves plain numbers behind: still usable.
        self.shards[shard_index(hash)]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the entry of `key` (`None` if there is none) under its shard's lock; `f`
    /// changes it in place and says what to do with it ([`Slot`]). `idle` tells entries that
    /// may be dropped when the shard is swept (at most once a second, at `now_ms`).
    pub fn update<R>(
        &self,
        key: KeyRef<'_>,
        now_ms: u64,
        idle: impl Fn(&V) -> bool,
        f: impl FnOnce(Option<&mut V>) -> (Slot<V>, R),
    ) -> R {
        let key = key.normalized();
        let hash = match key {
            KeyRef::Ip(ip) => self.hasher.hash_one(ip),
            KeyRef::Text(t) => self.hasher.hash_one(t),
        };
        let mut guard = self.lock(hash);
        let shard = &mut *guard;
        if now_ms >= shard.swept_ms + 1000 && shard.len() > 0 {
            shard.swept_ms = now_ms;
            shard.drop_idle(&idle);
        }
        match key {
            KeyRef::Ip(ip) => update_entry(
                &mut shard.ip,
                hash,
                |k| *k == ip,
                || ip,
                |k| self.hasher.hash_one(k),
                f,
            ),
            KeyRef::Text(t) => update_entry(
                &mut shard.text,
                hash,
                |k| &**k == t,
                || t.into(),
                |k| self.hasher.hash_one(&**k),
                f,
            ),
        }
    }

    /// Drops idle entries now; answers whether any entry is left.
    pub fn sweep(&self, idle: impl Fn(&V) -> bool) -> bool {
        let mut left = false;
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            shard.drop_idle(&idle);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn incr(v: Option<&mut u64>) -> (Slot<u64>, u64) {
        match v {
            Some(n) => {
                *n += 1;
                (Slot::Keep, *n)
            }
            None => (Slot::Insert(1), 1),
        }
    }

    #[test]
    fn update_inserts_changes_and_removes() {
        let k: Keyed<u64> = Keyed::default();
        let ip = KeyRef::Ip("1.2.3.4".parse().unwrap());
        assert_eq!(k.update(ip, 0, |_| false, incr), 1);
        // The text spelling of an address is the address.
        assert_eq!(k.update(KeyRef::Text("1.2.3.4"), 0, |_| false, incr), 2);
        assert_eq!(k.update(KeyRef::Text("a"), 0, |_| false, incr), 1);
        assert_eq!(k.update(KeyRef::Text("a"), 0, |_| false, incr), 2);
        assert_eq!(k.len(), 2);
        k.update(KeyRef::Text("a"), 0, |_| false, |_| (Slot::Remove, ()));
        assert_eq!(k.len(), 1);
        assert!(!k.sweep(|_| true));
        assert!(k.is_empty());
    }

    #[test]
    fn many_keys_grow_every_shard_and_keep_their_own_counts() {
        let k: Keyed<u64> = Keyed::default();
        let ips: Vec<IpAddr> = (0..5000u32)
            .map(|i| IpAddr::from(i.to_be_bytes()))
            .collect();
        let texts: Vec<String> = (0..5000).map(|i| format!("user-{i}")).collect();
        for round in 1..=2 {
            for ip in &ips {
                assert_eq!(k.update(KeyRef::Ip(*ip), 0, |_| false, incr), round);
            }
            for t in &texts {
                assert_eq!(k.update(KeyRef::Text(t), 0, |_| false, incr), round);
            }
        }
        assert_eq!(k.len(), 10_000);
        for t in texts.iter().step_by(2) {
            k.update(KeyRef::Text(t), 0, |_| false, |_| (Slot::Remove, ()));
        }
        assert_eq!(k.len(), 7_500);
        // Removed keys start again; the others kept their counts.
        assert_eq!(k.update(KeyRef::Text("user-0"), 0, |_| false, incr), 1);
        assert_eq!(k.update(KeyRef::Text("user-1"), 0, |_| false, incr), 3);
        // Every shard took keys.
        assert!(k.shards.iter().all(|s| s.lock().unwrap().len() > 100));
    }

    #[test]
    fn idle_entries_go_at_most_once_a_second() {
        let k: Keyed<u64> = Keyed::default();
        let key = KeyRef::Text("x");
        k.update(key, 1000, |_| false, incr);
        // Swept at 1500 (the entry was idle), then not again before 2500.
        assert_eq!(k.update(key, 1500, |_| true, incr), 1);
        assert_eq!(k.update(key, 2000, |_| true, incr), 2);
        assert_eq!(k.update(key, 2500, |_| true, incr), 1);
        assert_eq!(
            OwnedKey::from_ref(KeyRef::Text("10.0.0.1")),
            OwnedKey::Ip("10.0.0.1".parse().unwrap())
        );
    }
}
