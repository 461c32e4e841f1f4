//! State that outlives snapshots, by key: limit-count's counters, limit-req's buckets,
//! limit-conn's counts, prometheus' series of one route.
//!
//! A compiled plugin holds a [`Lease`] on the state of its key (`<owner>:<conf version>`, or
//! a group). The next snapshot is compiled while the previous one is still alive, so an
//! unchanged conf leases the same state again and carries on. When the last lease on a key is
//! dropped (the last snapshot using it went away, in-flight requests included) the state is
//! released at once, unless it still holds something that must outlive its configuration
//! ([`Retain`]: a rate-limit window that is not over, a request still counted in flight):
//! then it lingers, as APISIX's shared dictionaries keep such keys until they expire, and a
//! later lease on the same key gets it back. Lingering states are dropped once they have
//! nothing left to keep (checked when leases come and go, at most once a second).

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// Whether a state no configuration leases any more must still be kept.
pub trait Retain {
    /// `true` while the state holds something that must outlive its configuration (the
    /// default: nothing).
    fn retain(&self) -> bool {
        false
    }
}

struct Entry<S: Retain> {
    state: Arc<S>,
    lease: Weak<LeaseGuard<S>>,
    id: u64,
}

struct Inner<S: Retain> {
    entries: HashMap<Box<str>, Entry<S>>,
    next_id: u64,
    lingering: usize,
    last_prune: Option<Instant>,
}

/// States of type `S` by key.
pub struct StateMap<S: Retain> {
    inner: Arc<Mutex<Inner<S>>>,
}

impl<S: Retain> Default for StateMap<S> {
    fn default() -> Self {
        StateMap {
            inner: Arc::new(Mutex::new(Inner {
                entries: HashMap::new(),
                next_id: 0,
                lingering: 0,
                last_prune: None,
            })),
        }
    }
}

/// One map per gateway and state type, as a shared state of [`crate::PluginServices`].
impl<S: Retain + Send + Sync + 'static> crate::SharedState for StateMap<S> {
    fn create(_: &crate::PluginServices) -> Self {
        StateMap::default()
    }
}

impl<S: Retain + Send + Sync + 'static> std::fmt::Debug for StateMap<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StateMap({})", self.len())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the map leaves plain bookkeeping behind: still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

const PRUNE_EVERY: Duration = Duration::from_secs(1);

impl<S: Retain + Send + Sync + 'static> StateMap<S> {
    /// A lease on the state of `key`: the live or lingering one, else a new one from `make`.
    pub fn lease(&self, key: &str, make: impl FnOnce() -> S) -> Lease<S> {
        let mut released = Vec::new();
        let lease = {
            let mut inner = lock(&self.inner);
            prune(&mut inner, false, &mut released);
            if let Some(e) = inner.entries.get(key) {
                if let Some(guard) = e.lease.upgrade() {
                    return Lease {
                        state: e.state.clone(),
                        guard,
                    };
                }
            }
            let id = inner.next_id;
            inner.next_id += 1;
            let guard = Arc::new(LeaseGuard {
                map: Arc::downgrade(&self.inner),
                key: key.into(),
                id,
            });
            let revived = inner.entries.get_mut(key).map(|e| {
                e.lease = Arc::downgrade(&guard);
                e.id = id;
                e.state.clone()
            });
            let state = match revived {
                Some(state) => {
                    inner.lingering = inner.lingering.saturating_sub(1);
                    state
                }
                None => {
                    let state = Arc::new(make());
                    inner.entries.insert(
                        key.into(),
                        Entry {
                            state: state.clone(),
                            lease: Arc::downgrade(&guard),
                            id,
                        },
                    );
                    state
                }
            };
            Lease { state, guard }
        };
        drop(released);
        lease
    }

    /// Every state held (leased or lingering), with its key.
    pub fn states(&self) -> Vec<(Box<str>, Arc<S>)> {
        lock(&self.inner)
            .entries
            .iter()
            .map(|(k, e)| (k.clone(), e.state.clone()))
            .collect()
    }

    pub fn len(&self) -> usize {
        lock(&self.inner).entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops lingering states with nothing left to keep, now.
    pub fn prune(&self) {
        let mut released = Vec::new();
        prune(&mut lock(&self.inner), true, &mut released);
    }
}

/// Drops lingering entries that have nothing left to keep; `released` takes the states so they
/// are dropped after the lock is let go.
fn prune<S: Retain>(inner: &mut Inner<S>, now: bool, released: &mut Vec<Arc<S>>) {
    if inner.lingering == 0 {
        return;
    }
    let due = inner.last_prune.is_none_or(|t| t.elapsed() >= PRUNE_EVERY);
    if !now && !due {
        return;
    }
    inner.last_prune = Some(Instant::now());
    let mut lingering = 0;
    inner.entries.retain(|_, e| {
        if e.lease.strong_count() > 0 {
            return true;
        }
        if Arc::strong_count(&e.state) > 1 || e.state.retain() {
            lingering += 1;
            return true;
        }
        released.push(e.state.clone());
        false
    });
    inner.lingering = lingering;
}

/// A compiled plugin's hold on its state; the state is released (or left lingering) when the
/// last lease on its key goes.
pub struct Lease<S: Retain> {
    // Declared first: dropped before the guard, so the guard sees only the map's reference.
    state: Arc<S>,
    guard: Arc<LeaseGuard<S>>,
}

impl<S: Retain> Clone for Lease<S> {
    fn clone(&self) -> Self {
        Lease {
            state: self.state.clone(),
            guard: self.guard.clone(),
        }
    }
}

impl<S: Retain> Deref for Lease<S> {
    type Target = S;
    fn deref(&self) -> &S {
        &self.state
    }
}

impl<S: Retain> Lease<S> {
    /// The state itself, for holders that must not keep the configuration's lease (a request
    /// still counted in flight keeps its space, not its conf).
    pub fn state(&self) -> &Arc<S> {
        &self.state
    }

    pub fn key(&self) -> &str {
        &self.guard.key
    }
}

impl<S: Retain> std::fmt::Debug for Lease<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Lease").field(&self.guard.key).finish()
    }
}

struct LeaseGuard<S: Retain> {
    map: Weak<Mutex<Inner<S>>>,
    key: Box<str>,
    id: u64,
}

impl<S: Retain> Drop for LeaseGuard<S> {
    fn drop(&mut self) {
        let Some(map) = self.map.upgrade() else {
            return;
        };
        let mut released = Vec::new();
        {
            let mut inner = lock(&map);
            let Some(e) = inner.entries.get(&self.key) else {
                return;
            };
            // Another lease took this key over since (this one's count had reached zero).
            if e.id != self.id {
                return;
            }
            if Arc::strong_count(&e.state) > 1 || e.state.retain() {
                inner.lingering += 1;
            } else if let Some(e) = inner.entries.remove(&self.key) {
                released.push(e.state);
            }
            prune(&mut inner, false, &mut released);
        }
        drop(released);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[derive(Default)]
    struct Counts {
        live: AtomicBool,
    }

    impl Retain for Counts {
        fn retain(&self) -> bool {
            self.live.load(Ordering::Relaxed)
        }
    }

    #[test]
    fn released_with_the_last_lease_unless_retained() {
        let map: StateMap<Counts> = StateMap::default();
        let a = map.lease("r1:1", Counts::default);
        let b = map.lease("r1:1", || panic!("exists"));
        assert!(Arc::ptr_eq(a.state(), b.state()));
        drop(a);
        assert_eq!(map.len(), 1, "b still leases it");
        drop(b);
        assert!(map.is_empty(), "released with the last lease");

        // A state with something to keep lingers and comes back on the next lease.
        let c = map.lease("r2:1", Counts::default);
        c.live.store(true, Ordering::Relaxed);
        let kept = c.state().clone();
        drop(c);
        assert_eq!(map.len(), 1);
        let d = map.lease("r2:1", || panic!("lingering"));
        assert!(Arc::ptr_eq(d.state(), &kept));
        drop(kept);
        d.live.store(false, Ordering::Relaxed);
        drop(d);
        assert!(map.is_empty());

        // A holder outside the lease (a request in flight) keeps the state until it goes.
        let e = map.lease("r3:1", Counts::default);
        let in_flight = e.state().clone();
        drop(e);
        assert_eq!(map.len(), 1);
        drop(in_flight);
        map.prune();
        assert!(map.is_empty());
    }

    #[test]
    fn a_lease_after_the_release_starts_afresh() {
        let map: StateMap<Counts> = StateMap::default();
        let a = map.lease("k", Counts::default);
        let b = map.lease("k", Counts::default);
        drop((a, b));
        let c = map.lease("k", Counts::default);
        assert_eq!(map.len(), 1);
        assert_eq!(c.key(), "k");
        assert_eq!(map.states().len(), 1);
    }
}
