//! An in-memory [`Store`] for tests (feature `test-support`): etcd's semantics (one revision
//! counter, create/mod revisions, compare-and-swap, leases as expiry times, etcd's request size
//! limit) without persistence. The Admin API's tests run on it, and the store contract suite
//! (`tests/store_contract.rs`) holds it to the same cases as the embedded store and etcd.
//! Expired leases are removed (and published as deletes) at the next call on the store, not by
//! a timer; TTLs are exact (no etcd minimum), so tests of lease handling stay fast.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::watch;

use crate::state::ConfigState;
use crate::store::embedded::MAX_VALUE_BYTES;
use crate::store::{KeyValue, Page, PutOutcome, StateBuilder, Store, StoreError, StoreHealth};

#[derive(Clone, Debug)]
struct Entry {
    kv: KeyValue,
    expires: Option<Instant>,
}

#[derive(Debug)]
struct Inner {
    revision: i64,
    keys: BTreeMap<String, Entry>,
    builder: StateBuilder,
    /// Set by [`MemoryStore::set_unavailable`]: every call fails with this text.
    down: Option<String>,
}

/// See the module documentation.
pub struct MemoryStore {
    prefix: String,
    inner: Mutex<Inner>,
    tx: watch::Sender<Arc<ConfigState>>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl MemoryStore {
    pub fn new(prefix: impl Into<String>) -> MemoryStore {
        let prefix = prefix.into();
        let builder = StateBuilder::new(prefix.clone());
        let (tx, _) = watch::channel(builder.snapshot());
        MemoryStore {
            prefix,
            inner: Mutex::new(Inner {
                revision: 1,
                keys: BTreeMap::new(),
                builder,
                down: None,
            }),
            tx,
        }
    }

    /// Makes every call fail with `StoreError::Unavailable(text)` (`None` heals it), to
    /// exercise the callers' handling of an unreachable backend.
    pub fn set_unavailable(&self, text: Option<&str>) {
        self.lock().down = text.map(str::to_string);
    }

    /// The current revision.
    pub fn revision(&self) -> i64 {
        self.lock().revision
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Locks, refuses when down, and drops expired keys (a lease ending is a delete event).
    fn ready(&self) -> Result<std::sync::MutexGuard<'_, Inner>, StoreError> {
        let mut inner = self.lock();
        if let Some(text) = &inner.down {
            return Err(StoreError::Unavailable(text.clone()));
        }
        let now = Instant::now();
        let expired: Vec<String> = inner
            .keys
            .iter()
            .filter(|(_, e)| e.expires.is_some_and(|t| t <= now))
            .map(|(k, _)| k.clone())
            .collect();
        if !expired.is_empty() {
            inner.revision += 1;
            let rev = inner.revision;
            let mut changed = false;
            for key in expired {
                inner.keys.remove(&key);
                changed |= inner.builder.apply(&key, None, rev);
            }
            self.publish(&inner, changed);
        }
        Ok(inner)
    }

    /// What etcd refuses before writing anything.
    fn check_write(key: &str, value: &[u8]) -> Result<(), StoreError> {
        if key.is_empty() {
            return Err(StoreError::Invalid("key is empty".into()));
        }
        if value.len() > MAX_VALUE_BYTES {
            return Err(StoreError::Invalid(
                "etcdserver: request is too large".into(),
            ));
        }
        Ok(())
    }

    /// Publishes the state when a resource changed: keys the data plane does not compile
    /// (`gen_id`, directory placeholders) publish nothing, as with etcd and the embedded store.
    fn publish(&self, inner: &Inner, changed: bool) {
        if !changed {
            return;
        }
        self.tx.send_replace(inner.builder.snapshot());
    }

    fn write(
        &self,
        inner: &mut Inner,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> PutOutcome {
        inner.revision += 1;
        let rev = inner.revision;
        let previous = inner.keys.get(key).map(|e| e.kv.clone());
        let create_revision = previous.as_ref().map_or(rev, |p| p.create_revision);
        let kv = KeyValue {
            key: key.to_string(),
            value,
            create_revision,
            mod_revision: rev,
        };
        let changed = inner.builder.apply(key, Some(&kv), rev);
        inner.keys.insert(
            key.to_string(),
            Entry {
                kv,
                expires: ttl.map(|t| Instant::now() + t),
            },
        );
        self.publish(inner, changed);
        PutOutcome {
            previous,
            revision: rev,
        }
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn prefix(&self) -> &str {
        &self.prefix
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        Ok(self.ready()?.keys.get(key).map(|e| e.kv.clone()))
    }

    async fn list(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64), StoreError> {
        let inner = self.ready()?;
        let kvs = inner
            .keys
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, e)| e.kv.clone())
            .collect();
        Ok((kvs, inner.revision))
    }

    /// Pages as the embedded store does (by reading the directory: this store is for tests,
    /// which then go through the Admin API's paged path too).
    async fn list_page(
        &self,
        dir: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Option<Page>, StoreError> {
        let inner = self.ready()?;
        let mut kvs: Vec<KeyValue> = inner
            .keys
            .range(dir.to_string()..)
            .take_while(|(k, _)| k.starts_with(dir))
            .filter(|(k, _)| {
                let name = &k[dir.len()..];
                !name.is_empty() && !name.contains('/')
            })
            .map(|(_, e)| e.kv.clone())
            .collect();
        kvs.sort_by_key(|kv| kv.create_revision);
        let total = kvs.len();
        let kvs = kvs.into_iter().skip(offset).take(limit).collect();
        Ok(Some(Page { kvs, total }))
    }

    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> Result<PutOutcome, StoreError> {
        let mut inner = self.ready()?;
        Self::check_write(key, &value)?;
        Ok(self.write(&mut inner, key, value, ttl))
    }

    async fn put_if_unmodified(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: i64,
        ttl: Option<Duration>,
    ) -> Result<PutOutcome, StoreError> {
        let mut inner = self.ready()?;
        Self::check_write(key, &value)?;
        // etcd compares a missing key's mod_revision as 0.
        let current = inner.keys.get(key).map_or(0, |e| e.kv.mod_revision);
        if current != expected {
            return Err(StoreError::Conflict);
        }
        Ok(self.write(&mut inner, key, value, ttl))
    }

    async fn delete(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let mut inner = self.ready()?;
        let Some(old) = inner.keys.remove(key) else {
            return Ok(None);
        };
        inner.revision += 1;
        let rev = inner.revision;
        let changed = inner.builder.apply(key, None, rev);
        self.publish(&inner, changed);
        Ok(Some(old.kv))
    }

    async fn delete_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        let mut inner = self.ready()?;
        let doomed: Vec<String> = inner
            .keys
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, _)| k.clone())
            .collect();
        if doomed.is_empty() {
            return Ok(0);
        }
        inner.revision += 1;
        let rev = inner.revision;
        let mut changed = false;
        for key in &doomed {
            inner.keys.remove(key);
            changed |= inner.builder.apply(key, None, rev);
        }
        self.publish(&inner, changed);
        Ok(doomed.len() as u64)
    }

    fn subscribe(&self) -> watch::Receiver<Arc<ConfigState>> {
        self.tx.subscribe()
    }

    fn health(&self) -> StoreHealth {
        let inner = self.lock();
        StoreHealth {
            reachable: inner.down.is_none(),
            synced: true,
            revision: inner.revision,
            detail: inner.down.clone().unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unavailable() {
        let s = MemoryStore::new("/apisix");
        s.set_unavailable(Some("connection refused"));
        assert_eq!(
            s.get("/apisix/x").await,
            Err(StoreError::Unavailable("connection refused".into()))
        );
        s.set_unavailable(None);
        assert!(s.get("/apisix/x").await.unwrap().is_none());
    }
}
