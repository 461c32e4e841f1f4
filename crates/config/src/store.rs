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
    /// Values longer than this are quarantined, not parsed (see [`StateBuilder::with_max_value`]).
    max_value: Option<usize>,
}

/// A full listing being read page by page, in key order, into the next state: from
/// [`StateBuilder::start_listing`] to [`StateBuilder::finish_listing`]. Until it is finished
/// the builder's state is untouched, so a listing given up half way (its revision compacted,
/// the connection lost) leaves nothing behind.
#[derive(Debug)]
pub struct Listing {
    old: BTreeMap<ResourceKind, SharedMap<StoredItem>>,
    resources: BTreeMap<ResourceKind, SharedMap<StoredItem>>,
    unreadable: BTreeMap<(ResourceKind, String), String>,
    /// Keys read so far.
    pub keys: usize,
    /// The last key read, so pages out of key order are caught.
    last_key: Option<String>,
}

impl StateBuilder {
    pub fn new(prefix: impl Into<String>) -> StateBuilder {
        StateBuilder {
            prefix: prefix.into(),
            state: ConfigState::default(),
            next_seq: 0,
            max_value: None,
        }
    }

    /// Values longer than `bytes` are quarantined: listed as unreadable (reported, never
    /// served; an older valid version keeps serving) with a log line, and not parsed, so one
    /// huge value (a route with a million hosts) costs neither the memory nor the time of its
    /// parse and compile. `None`: no limit.
    pub fn with_max_value(mut self, bytes: Option<usize>) -> StateBuilder {
        self.max_value = bytes;
        self
    }

    /// Replaces everything with a full listing (start-up, or a re-list after compaction).
    /// Items whose value is unchanged keep their `Arc` and slot, so the compiler can tell
    /// what a re-list actually changed.
    pub fn reset(&mut self, kvs: &[KeyValue], revision: i64) {
        let mut sorted: Vec<&KeyValue> = kvs.iter().collect();
        sorted.sort_by(|a, b| a.key.cmp(&b.key));
        let mut listing = self.start_listing();
        self.add_page(&mut listing, &sorted);
        self.finish_listing(listing, revision);
    }

    /// Starts a listing read in pages (see [`Listing`]).
    pub fn start_listing(&self) -> Listing {
        Listing {
            // Shared maps: a few pointers are copied.
            old: self.state.resources.clone(),
            resources: BTreeMap::new(),
            unreadable: BTreeMap::new(),
            keys: 0,
            last_key: None,
        }
    }

    /// Adds a page of the listing: keys in key order, after those of the pages before. Each
    /// value is parsed once to check it (most of a listing's cost at 100,000 routes): on
    /// every core when there are many.
    pub fn add_page(&mut self, listing: &mut Listing, kvs: &[&KeyValue]) {
        debug_assert!(
            kvs.windows(2).all(|w| w[0].key < w[1].key)
                && match (&listing.last_key, kvs.first()) {
                    (Some(last), Some(first)) => *last < first.key,
                    _ => true,
                },
            "a listing's pages come in key order"
        );
        listing.keys += kvs.len();
        if let Some(last) = kvs.last() {
            listing.last_key = Some(last.key.clone());
        }
        let max_value = self.max_value;
        let parsed = crate::parallel::map(kvs, |kv| match place_of(&self.prefix, &kv.key) {
            KeyPlace::Resource(kind, id) => Some((kind, id, checked_value(kv, max_value))),
            KeyPlace::Other => None,
        });
        for (kv, place) in kvs.iter().zip(parsed) {
            let Some((kind, id, value)) = place else {
                continue;
            };
            let value = match value {
                Ok(value) => value,
                Err(reason) => {
                    // Set aside, and an older valid version (if known) keeps serving.
                    tracing::error!(key = %kv.key, "{reason}; ignored");
                    self.quarantine_in(listing, kind, id, reason);
                    continue;
                }
            };
            let previous = listing.old.get(&kind).and_then(|m| m.get(&id));
            let item = match previous {
                Some(p) if p.value == value && p.mod_revision == kv.mod_revision => p.clone(),
                Some(p) => StoredItem {
                    id: id.clone(),
                    value,
                    create_revision: kv.create_revision,
                    mod_revision: kv.mod_revision,
                    seq: p.seq,
                },
                None => {
                    self.next_seq += 1;
                    StoredItem {
                        id: id.clone(),
                        value,
                        create_revision: kv.create_revision,
                        mod_revision: kv.mod_revision,
                        seq: self.next_seq,
                    }
                }
            };
            listing.resources.entry(kind).or_default().insert(id, item);
        }
    }

    /// Records a key of the listing whose value could not be read at all (larger than what
    /// the client accepts in one message): quarantined as a value over the limit would be.
    pub fn quarantine(&mut self, listing: &mut Listing, key: &str, reason: String) {
        listing.keys += 1;
        listing.last_key = Some(key.to_owned());
        if let KeyPlace::Resource(kind, id) = place_of(&self.prefix, key) {
            tracing::error!(key, "{reason}; ignored");
            self.quarantine_in(listing, kind, id, reason);
        }
    }

    fn quarantine_in(&self, listing: &mut Listing, kind: ResourceKind, id: String, reason: String) {
        if let Some(p) = listing.old.get(&kind).and_then(|m| m.get(&id)) {
            listing
                .resources
                .entry(kind)
                .or_default()
                .insert(id.clone(), p.clone());
        }
        listing.unreadable.insert((kind, id), reason);
    }

    /// Makes the listing, read at `revision`, the state.
    pub fn finish_listing(&mut self, listing: Listing, revision: i64) {
        self.state.resources = listing.resources;
        self.state.unreadable = listing.unreadable;
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
                let value = match checked_value(kv, self.max_value) {
                    Ok(value) => value,
                    Err(reason) => {
                        // Not JSON (APISIX logs and skips it) or over the size limit: any
                        // older valid version keeps serving; it is listed so the data plane
                        // reports it as quarantined.
                        tracing::error!(key, "{reason}; ignored");
                        self.state.unreadable.insert((kind, id), reason);
                        return true;
                    }
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

/// The parsed value of `kv`, or why it is quarantined.
fn checked_value(kv: &KeyValue, max_value: Option<usize>) -> Result<StoredValue, String> {
    if let Some(max) = max_value.filter(|max| kv.value.len() > *max) {
        return Err(format!(
            "stored value of {} bytes is over the limit of {max} bytes",
            kv.value.len()
        ));
    }
    StoredValue::from_json(&kv.value).ok_or_else(|| NOT_JSON.to_string())
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
    fn a_listing_in_pages_is_the_listing_at_once() {
        let kvs: Vec<KeyValue> = (0..40)
            .map(|i| kv(&format!("/apisix/routes/{i:02}"), r#"{"uri":"/a"}"#, i + 1))
            .chain([kv("/apisix/upstreams/u", "{}", 50)])
            .collect();
        let mut whole = StateBuilder::new("/apisix");
        whole.reset(&kvs, 60);
        let mut paged = StateBuilder::new("/apisix");
        // A listing given up half way leaves the state as it was.
        let mut abandoned = paged.start_listing();
        let refs: Vec<&KeyValue> = kvs.iter().collect();
        paged.add_page(&mut abandoned, &refs[..7]);
        assert!(paged.state().resources.is_empty());
        let mut listing = paged.start_listing();
        for page in refs.chunks(7) {
            paged.add_page(&mut listing, page);
        }
        assert_eq!(listing.keys, 41);
        paged.finish_listing(listing, 60);
        // The same items (the abandoned listing used up insertion numbers, not their order).
        let items = |b: &StateBuilder| -> Vec<(ResourceKind, String, i64, i64)> {
            b.state()
                .resources
                .iter()
                .flat_map(|(kind, m)| {
                    m.values()
                        .map(|i| (*kind, i.id.clone(), i.create_revision, i.mod_revision))
                })
                .collect()
        };
        let (mut got, mut want) = (items(&paged), items(&whole));
        got.sort();
        want.sort();
        assert_eq!(got, want);
        assert_eq!(paged.state().revision, 60);
        let ids = |b: &StateBuilder| -> Vec<String> {
            b.state()
                .items_in_order(ResourceKind::Routes)
                .iter()
                .map(|i| i.id.clone())
                .collect()
        };
        assert_eq!(ids(&paged), ids(&whole));
    }

    #[test]
    fn values_over_the_limit_are_quarantined_alone() {
        let big = format!(r#"{{"uri":"/big","desc":"{}"}}"#, "x".repeat(200));
        let mut b = StateBuilder::new("/apisix").with_max_value(Some(100));
        b.reset(
            &[
                kv("/apisix/routes/1", r#"{"uri":"/1"}"#, 1),
                kv("/apisix/routes/2", &big, 2),
                kv("/apisix/routes/3", r#"{"uri":"/3"}"#, 3),
            ],
            3,
        );
        assert!(b.state().get(ResourceKind::Routes, "1").is_some());
        assert!(b.state().get(ResourceKind::Routes, "2").is_none());
        assert!(b.state().get(ResourceKind::Routes, "3").is_some());
        let reason = &b.state().unreadable[&(ResourceKind::Routes, "2".to_string())];
        assert!(reason.contains("over the limit of 100 bytes"), "{reason}");
        // Through a change: the older valid version stays, and is reported set aside.
        assert!(b.apply(
            "/apisix/routes/1",
            Some(&kv("/apisix/routes/1", &big, 4)),
            4
        ));
        assert_eq!(
            b.state()
                .get(ResourceKind::Routes, "1")
                .unwrap()
                .mod_revision,
            1
        );
        assert!(b
            .state()
            .unreadable
            .contains_key(&(ResourceKind::Routes, "1".to_string())));
        // Without a limit the same value is read.
        let mut unlimited = StateBuilder::new("/apisix");
        unlimited.reset(&[kv("/apisix/routes/2", &big, 2)], 2);
        assert!(unlimited.state().get(ResourceKind::Routes, "2").is_some());
    }

    #[test]
    fn an_unreadable_key_of_a_listing_is_quarantined() {
        let mut b = StateBuilder::new("/apisix");
        b.reset(&[kv("/apisix/routes/1", r#"{"uri":"/1"}"#, 1)], 1);
        let mut listing = b.start_listing();
        b.quarantine(&mut listing, "/apisix/routes/1", "too large to read".into());
        b.add_page(
            &mut listing,
            &[&kv("/apisix/routes/2", r#"{"uri":"/2"}"#, 2)],
        );
        b.finish_listing(listing, 2);
        // The older valid version keeps serving, and is reported.
        assert!(b.state().get(ResourceKind::Routes, "1").is_some());
        assert_eq!(
            b.state().unreadable[&(ResourceKind::Routes, "1".to_string())],
            "too large to read"
        );
        assert!(b.state().get(ResourceKind::Routes, "2").is_some());
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
