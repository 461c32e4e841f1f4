//! Equal inline upstreams share one copy. At 100,000 routes most inline upstreams are alike
//! (one node, the same service behind many paths), and each route kept its own definition and
//! compiled form: about 1.2 KiB a route. [`InternPool`] hands out one `Arc` per distinct value
//! while any holder keeps it alive; it is used only by compiles (never by the request path),
//! so its shard locks are taken on the blocking pool alone.
//!
//! The pool holds weak references: it keeps nothing alive. A dead entry still keeps its
//! allocation (a `Weak` pins the block), so entries whose holders may have gone are counted
//! ([`InternPool::released`]) and the pool is swept once they reach an eighth of its size:
//! its garbage stays bounded and a burst of deletions gives the memory back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

type Shard<T> = HashMap<u64, Weak<T>, foldhash::fast::RandomState>;

const SHARDS: usize = 64;

pub struct InternPool<T> {
    shards: Box<[Mutex<Shard<T>>]>,
    /// Holders dropped or replaced since the last sweep (an upper bound on dead entries).
    released: AtomicUsize,
    /// Entries over all shards, as of their last change.
    len: AtomicUsize,
}

impl<T> Default for InternPool<T> {
    fn default() -> Self {
        InternPool {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            released: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
        }
    }
}

impl<T> std::fmt::Debug for InternPool<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InternPool")
            .field("len", &self.len.load(Ordering::Relaxed))
            .finish()
    }
}

impl<T> InternPool<T> {
    fn shard(&self, key: u64) -> MutexGuard<'_, Shard<T>> {
        // Keys are hashes or addresses (whose high bits are all alike): mixed, then the high
        // bits pick the shard.
        self.shards[(key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58) as usize % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The pooled value under `key` that `same` accepts, else the one `make` gives (pooled
    /// under `key` unless a different live value holds that key: then it is returned
    /// unshared, which is always correct). `make` runs under the shard's lock, so equal
    /// values asked for on several threads at once are made once.
    pub fn get_or_make<E>(
        &self,
        key: u64,
        same: impl Fn(&T) -> bool,
        make: impl FnOnce() -> Result<Arc<T>, E>,
    ) -> Result<Arc<T>, E> {
        let mut shard = self.shard(key);
        let live = shard.get(&key).and_then(Weak::upgrade);
        if let Some(v) = live.as_ref().filter(|v| same(v)) {
            return Ok(v.clone());
        }
        let made = make()?;
        if live.is_none() {
            let before = shard.len();
            shard.insert(key, Arc::downgrade(&made));
            if shard.len() > before {
                self.len.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(made)
    }

    /// `value`, or the pooled value under `key` that `same` finds equal to it.
    pub fn share(&self, key: u64, value: Arc<T>, same: impl Fn(&T, &T) -> bool) -> Arc<T> {
        let candidate = value.clone();
        self.get_or_make::<std::convert::Infallible>(key, |v| same(v, &candidate), || Ok(value))
            .unwrap_or_else(|never| match never {})
    }

    /// `n` holders of pooled values were dropped or replaced.
    pub fn released(&self, n: usize) {
        if n > 0 {
            self.released.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Whether enough holders went since the last sweep for one to be worth its cost.
    pub fn sweep_due(&self) -> bool {
        let released = self.released.load(Ordering::Relaxed);
        released > 0 && released * 8 >= self.len.load(Ordering::Relaxed)
    }

    /// Drops the entries nothing holds any more (O(entries): called when [`Self::sweep_due`]).
    pub fn sweep(&self) {
        self.released.store(0, Ordering::Relaxed);
        let mut len = 0;
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            shard.retain(|_, v| v.strong_count() > 0);
            if shard.capacity() > 4 * shard.len().max(16) {
                shard.shrink_to_fit();
            }
            len += shard.len();
        }
        self.len.store(len, Ordering::Relaxed);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_allocation_while_held() {
        let pool = InternPool::<String>::default();
        let a = pool.share(1, Arc::new("x".to_string()), |a, b| a == b);
        let b = pool.share(1, Arc::new("x".to_string()), |a, b| a == b);
        assert!(Arc::ptr_eq(&a, &b));
        drop((a, b));
        // Nothing holds it: the next one is pooled in its place.
        let c = pool.share(1, Arc::new("x".to_string()), |a, b| a == b);
        assert_eq!(Arc::strong_count(&c), 1);
        assert_eq!(pool.len(), 1);
    }

    #[test]
    fn a_different_value_under_a_taken_key_is_returned_unshared() {
        let pool = InternPool::<String>::default();
        let a = pool.share(7, Arc::new("a".to_string()), |a, b| a == b);
        let b = pool.share(7, Arc::new("b".to_string()), |a, b| a == b);
        assert_eq!((a.as_str(), b.as_str()), ("a", "b"));
        let a2 = pool.share(7, Arc::new("a".to_string()), |a, b| a == b);
        assert!(Arc::ptr_eq(&a, &a2));
        let b2 = pool.share(7, Arc::new("b".to_string()), |a, b| a == b);
        assert!(!Arc::ptr_eq(&b, &b2));
    }

    #[test]
    fn make_runs_once_per_live_value_and_its_error_pools_nothing() {
        let pool = InternPool::<u32>::default();
        let mut made = 0;
        let a = pool
            .get_or_make::<()>(
                3,
                |v| *v == 3,
                || {
                    made += 1;
                    Ok(Arc::new(3))
                },
            )
            .unwrap();
        let b = pool
            .get_or_make::<()>(3, |v| *v == 3, || unreachable!("pooled"))
            .unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(made, 1);
        assert!(pool.get_or_make(9, |_| true, || Err("bad")).is_err());
        assert_eq!(pool.len(), 1);
    }

    #[test]
    fn a_sweep_due_after_releases_frees_the_dead_entries() {
        let pool = InternPool::<u64>::default();
        let mut kept: Vec<Arc<u64>> = (0..100u64)
            .map(|i| pool.share(i, Arc::new(i), |a, b| a == b))
            .collect();
        assert_eq!(pool.len(), 100);
        assert!(!pool.sweep_due());
        let gone = kept.split_off(90);
        pool.released(gone.len());
        assert!(!pool.sweep_due(), "10 of 100 is below an eighth");
        drop(gone);
        pool.released(5);
        assert!(pool.sweep_due());
        pool.sweep();
        assert_eq!(pool.len(), 90);
        assert!(!pool.sweep_due());
        assert!(kept.iter().all(|v| Arc::strong_count(v) == 1));
    }
}
