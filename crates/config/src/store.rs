//! The key-value store behind the Admin API and the data plane, in APISIX's etcd layout.
//!
//! Every provider that accepts writes (the embedded store, etcd) implements [`Store`]; so does
//! API-driven standalone mode's store ([`standalone_api`]), which refuses key writes: it changes
//! only by whole documents. Keys are full etcd keys (`/apisix/routes/1`); values are the stored
//! bytes (JSON documents, or the `init_dir` placeholders APISIX writes for directories). Revisions
//! follow etcd's meaning: one store-wide counter bumped by every write, `create_revision` and
//! `mod_revision` per key.
//!
//! The data plane never calls the store on the request path: it follows [`Store::subscribe`],
//! a channel of whole [`ConfigState`]s that [`StateBuilder`] maintains from the key events.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::model::ResourceKind;
use crate::shared_map::SharedMap;
use crate::state::{ConfigState, StoredItem, StoredValue};

pub mod embedded;
pub mod etcd;
#[cfg(feature = "test-support")]
pub mod memory;
pub mod standalone_api;

/// One stored key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
}

/// One page of a directory ([`Store::list_page`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    pub kvs: Vec<KeyValue>,
    /// Keys directly under the directory, on every page.
    pub total: usize,
}

/// The result of a write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PutOutcome {
    /// The value the key held before, if any (201 vs 200 in the Admin API).
    pub previous: Option<KeyValue>,
    /// The store revision of this write (APISIX's POST ids come from it).
    pub revision: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached or refused the operation; the Admin API answers 503 with
    /// this text, as APISIX passes etcd's error through.
    #[error("{0}")]
    Unavailable(String),
    /// A compare-and-swap lost against a concurrent change.
    #[error("value changed before overwritten")]
    Conflict,
    /// The operation itself is invalid (bad key, value too large...).
    #[error("{0}")]
    Invalid(String),
}

/// How a store is doing, for readiness and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreHealth {
    /// The backend answered recently.
    pub reachable: bool,
    /// The published config reflects the backend (false while serving a local copy).
    pub synced: bool,
    /// The revision of the last published state.
    pub revision: i64,
    /// A human-readable note (last error, "serving local copy", ...).
    pub detail: String,
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The key prefix (`deployment.etcd.prefix`, default `/apisix`).
    fn prefix(&self) -> &str;

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError>;

    /// Every key under `prefix`, in key order, with the store revision of the read.
    async fn list(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64), StoreError>;

    /// One page of the keys directly under `dir` (`/apisix/routes/`: not the directory's own
    /// placeholder, not keys further down such as a consumer's credentials), in creation order
    /// (create revision, then key, as APISIX's Admin API pages), skipping `offset` and taking at
    /// most `limit`; with how many keys are directly under `dir` in all. `None` when this store
    /// cannot page without reading the whole directory: the caller lists it instead.
    async fn list_page(
        &self,
        dir: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Option<Page>, StoreError> {
        let _ = (dir, offset, limit);
        Ok(None)
    }

    /// Writes `value`; with `ttl` the key disappears after that long (an etcd lease).
    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> Result<PutOutcome, StoreError>;

    /// Writes only if the key's `mod_revision` is still `expected` ([`StoreError::Conflict`]
    /// otherwise), as APISIX's PATCH does.
    async fn put_if_unmodified(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: i64,
        ttl: Option<Duration>,
    ) -> Result<PutOutcome, StoreError>;

    /// Deletes one key; returns what it held.
    async fn delete(&self, key: &str) -> Result<Option<KeyValue>, StoreError>;

    /// Deletes every key under `prefix`; returns how many.
    async fn delete_prefix(&self, prefix: &str) -> Result<u64, StoreError>;

    /// The data plane's view: a new [`ConfigState`] after every applied change.
    fn subscribe(&self) -> watch::Receiver<Arc<ConfigState>>;

    fn health(&self) -> StoreHealth;
}

/// Where a key belongs in a [`ConfigState`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyPlace {
    /// `<prefix>/<dir>/<id>` of a resource kind the data plane compiles.
    Resource(ResourceKind, String),
    /// Anything else: directory placeholders, `gen_id`, credentials, kinds not compiled yet.
    Other,
}

/// Classifies `key` under `prefix`. Ids may not contain `/`, except a credential's
/// (`consumers/<u>/credentials/<id>`, id `<u>/credentials/<id>`), which is not a consumer.
pub fn place_of(prefix: &str, key: &str) -> KeyPlace {
    let Some(rest) = key.strip_prefix(prefix).and_then(|r| r.strip_prefix('/')) else {
        return KeyPlace::Other;
    };
    let Some((dir, id)) = rest.split_once('/') else {
        return KeyPlace::Other;
    };
    if dir == "consumers" {
        // `<username>/credentials/<id>`: a credential, named by its path under the directory.
        let mut segs = id.split('/');
        if let (Some(user), Some("credentials"), Some(cred), None) =
            (segs.next(), segs.next(), segs.next(), segs.next())
        {
            if !user.is_empty() && !cred.is_empty() {
                return KeyPlace::Resource(ResourceKind::Credentials, id.to_string());
            }
        }
    }
    if dir == "secrets" {
        // `<manager>/<id>`: a secret manager's configuration.
        return match id.split_once('/') {
            Some((manager, sid))
                if !manager.is_empty() && !sid.is_empty() && !sid.contains('/') =>
            {
                KeyPlace::Resource(ResourceKind::Secrets, id.to_string())
            }
            _ => KeyPlace::Other,
        };
    }
    if id.is_empty() || id.contains('/') {
        return KeyPlace::Other;
    }
    match ResourceKind::from_dir(dir) {
        Some(kind) => KeyPlace::Resource(kind, id.to_string()),
        None => KeyPlace::Other,
    }
}

/// Maintains a [`ConfigState`] from key events, with APISIX's insertion order: key order for
/// the initial load, then creation order; an update keeps its slot.
#[derive(Clone, Debug)]
pub struct StateBuilder {
    prefix: String,
    state: ConfigState,
    next_seq: u64,
}

impl StateBuilder {
    pub fn new(prefix: impl Into<String>) -> StateBuilder {
        StateBuilder {
            prefix: prefix.into(),
            state: ConfigState::default(),
            next_seq: 0,
        }
    }

    /// Replaces everything with a full listing (start-up, or a re-list after compaction).
    /// Items whose value is unchanged keep their `Arc` and slot, so the compiler can tell
    /// what a re-list actually changed.
    pub fn reset(&mut self, kvs: &[KeyValue], revision: i64) {
        let old = std::mem::take(&mut self.state.resources);
        let mut sorted: Vec<&KeyValue> = kvs.iter().collect();
        sorted.sort_by(|a, b| a.key.cmp(&b.key));
        let mut resources: BTreeMap<ResourceKind, SharedMap<StoredItem>> = BTreeMap::new();
        let mut unreadable = BTreeMap::new();
        // Each value is parsed once to check it (most of a listing's cost at 100,000 routes):
        // on every core when there are many.
        let parsed = crate::parallel::map(&sorted, |kv| match place_of(&self.prefix, &kv.key) {
            KeyPlace::Resource(kind, id) => Some((kind, id, parse_value(&kv.value))),
            KeyPlace::Other => None,
        });
        for (kv, place) in sorted.into_iter().zip(parsed) {
            let Some((kind, id, value)) = place else {
                continue;
            };
            let Some(value) = value else {
                // Not JSON: set aside, and an older valid version (if known) keeps serving.
                tracing::error!(key = %kv.key, "stored value is not JSON; ignored");
                if let Some(p) = old.get(&kind).and_then(|m| m.get(&id)) {
                    resources
                        .entry(kind)
                        .or_default()
                        .insert(id.clone(), p.clone());
                }
                unreadable.insert((kind, id), NOT_JSON.to_string());
                continue;
            };
            let previous = old.get(&kind).and_then(|m| m.get(&id));
            let item = match previous {
                Some(p) if p.value == value && p.mod_revision == kv.mod_revision => p.clone(),
                Some(p) => StoredItem {
                    id: id.clone(),
                    value: value.clone(),
                    create_revision: kv.create_revision,
                    mod_revision: kv.mod_revision,
                    seq: p.seq,
                },
                None => {
                    self.next_seq += 1;
                    StoredItem {
                        id: id.clone(),
                        value: value.clone(),
                        create_revision: kv.create_revision,
                        mod_revision: kv.mod_revision,
                        seq: self.next_seq,
                    }
                }
            };
            resources.entry(kind).or_default().insert(id, item);
        }
        self.state.resources = resources;
        self.state.unreadable = unreadable;
        self.state.revision = revision;
    }

    /// Applies one put (`Some`) or delete (`None`) of `key`. Returns whether the state changed.
    pub fn apply(&mut self, key: &str, kv: Option<&KeyValue>, revision: i64) -> bool {
        self.state.revision = self.state.revision.max(revision);
        let KeyPlace::Resource(kind, id) = place_of(&self.prefix, key) else {
            return false;
        };
        let was_unreadable = self.state.unreadable.remove(&(kind, id.clone())).is_some();
        match kv {
            None => {
                let removed = self
                    .state
                    .resources
                    .get_mut(&kind)
                    .is_some_and(|m| m.remove(&id).is_some());
                removed || was_unreadable
            }
            Some(kv) => {
                let Some(value) = parse_value(&kv.value) else {
                    // Not JSON: APISIX logs and skips it, keeping any older valid version; it
                    // is listed so the data plane reports it as quarantined.
                    tracing::error!(key, "stored value is not JSON; ignored");
                    self.state
                        .unreadable
                        .insert((kind, id), NOT_JSON.to_string());
                    return true;
                };
                let map = self.state.resources.entry(kind).or_default();
                let seq = match map.get(&id) {
                    Some(p) => p.seq,
                    None => {
                        self.next_seq += 1;
                        self.next_seq
                    }
                };
                map.insert(
                    id.clone(),
                    StoredItem {
                        id,
                        value: value.clone(),
                        create_revision: kv.create_revision,
                        mod_revision: kv.mod_revision,
                        seq,
                    },
                );
                true
            }
        }
    }

    pub fn state(&self) -> &ConfigState {
        &self.state
    }

    /// A shareable copy to publish (the item maps are shared: this copies a few pointers).
    pub fn snapshot(&self) -> Arc<ConfigState> {
        Arc::new(self.state.clone())
    }
}

const NOT_JSON: &str = "stored value is not JSON";

fn parse_value(bytes: &[u8]) -> Option<StoredValue> {
    StoredValue::from_json(bytes)
}

/// A pair for the stores' tests: `key` holding `value`, created and last modified at `rev`.
#[cfg(test)]
pub(crate) fn kv(key: &str, value: &str, rev: i64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: value.as_bytes().to_vec(),
        create_revision: rev,
        mod_revision: rev,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_keys() {
        assert_eq!(
            place_of("/apisix", "/apisix/routes/1"),
            KeyPlace::Resource(ResourceKind::Routes, "1".into())
        );
        assert_eq!(place_of("/apisix", "/apisix/routes/"), KeyPlace::Other);
        assert_eq!(place_of("/apisix", "/apisix/gen_id"), KeyPlace::Other);
        assert_eq!(
            place_of("/apisix", "/apisix/consumers/u/credentials/c"),
            KeyPlace::Resource(ResourceKind::Credentials, "u/credentials/c".into())
        );
        assert_eq!(
            place_of("/apisix", "/apisix/consumers/u/credentials/"),
            KeyPlace::Other
        );
        assert_eq!(
            place_of("/apisix", "/apisix/consumers/u/other/c"),
            KeyPlace::Other
        );
        assert_eq!(
            place_of("/apisix", "/apisix/consumer_groups/g"),
            KeyPlace::Resource(ResourceKind::ConsumerGroups, "g".into())
        );
        assert_eq!(place_of("/apisix", "/other/routes/1"), KeyPlace::Other);
    }

    #[test]
    fn initial_order_is_key_order_then_creation_order() {
        let mut b = StateBuilder::new("/apisix");
        b.reset(
            &[
                kv("/apisix/routes/2", "{}", 3),
                kv("/apisix/routes/10", "{}", 2),
                kv("/apisix/routes/", "init_dir", 1),
            ],
            5,
        );
        let ids: Vec<_> = b
            .state()
            .items_in_order(ResourceKind::Routes)
            .iter()
            .map(|i| i.id.clone())
            .collect();
        assert_eq!(ids, ["10", "2"]);
        assert!(b.apply(
            "/apisix/routes/1",
            Some(&kv("/apisix/routes/1", "{}", 6)),
            6
        ));
        assert!(b.apply(
            "/apisix/routes/10",
            Some(&kv("/apisix/routes/10", "{\"a\":1}", 7)),
            7
        ));
        let ids: Vec<_> = b
            .state()
            .items_in_order(ResourceKind::Routes)
            .iter()
            .map(|i| i.id.clone())
            .collect();
        assert_eq!(
            ids,
            ["10", "2", "1"],
            "an update keeps its slot; a creation is appended"
        );
        assert!(b.apply("/apisix/routes/2", None, 8));
        assert_eq!(b.state().revision, 8);
        // Not JSON: listed as unreadable (so it is reported), never served.
        assert!(b.apply(
            "/apisix/routes/3",
            Some(&kv("/apisix/routes/3", "not json", 9)),
            9
        ));
        assert!(b.state().get(ResourceKind::Routes, "3").is_none());
        assert!(b
            .state()
            .unreadable
            .contains_key(&(ResourceKind::Routes, "3".into())));
        assert!(b.apply(
            "/apisix/routes/3",
            Some(&kv("/apisix/routes/3", "{}", 10)),
            10
        ));
        assert!(b.state().unreadable.is_empty(), "a valid write clears it");
    }

    #[test]
    fn relist_keeps_unchanged_items() {
        let mut b = StateBuilder::new("/apisix");
        b.reset(&[kv("/apisix/routes/1", "{}", 2)], 2);
        let before = b
            .state()
            .get(ResourceKind::Routes, "1")
            .unwrap()
            .value
            .clone();
        b.reset(
            &[
                kv("/apisix/routes/1", "{}", 2),
                kv("/apisix/routes/0", "{}", 9),
            ],
            9,
        );
        let after = b.state().get(ResourceKind::Routes, "1").unwrap();
        assert!(before.ptr_eq(&after.value));
        let ids: Vec<_> = b
            .state()
            .items_in_order(ResourceKind::Routes)
            .iter()
            .map(|i| i.id.clone())
            .collect();
        assert_eq!(
            ids,
            ["1", "0"],
            "a re-list appends new keys after the known ones"
        );
    }
}
