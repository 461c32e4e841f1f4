//! The raw configuration a store holds: every resource as stored JSON, with its revisions.
//!
//! Every provider (the `apisix.yaml` file, the embedded store, etcd) publishes whole
//! `ConfigState`s through a `tokio::sync::watch` channel; the data plane compiles each one into a
//! serving snapshot. Values are shared (`Arc`), so publishing a new state after one change copies
//! pointers, not documents.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::model::ResourceKind;

/// One stored resource.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredItem {
    /// The id taken from the key (`/apisix/routes/<id>`); it overrides any `id` in the value.
    pub id: String,
    pub value: Arc<Value>,
    pub create_revision: i64,
    pub mod_revision: i64,
    /// Insertion order as APISIX's router sees it: key order at load, then creation order.
    /// An update keeps its slot.
    pub seq: u64,
}

/// Everything a store holds at one revision.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConfigState {
    /// The store revision this state reflects (etcd revision, embedded store revision, or a
    /// counter of file reloads).
    pub revision: i64,
    pub resources: BTreeMap<ResourceKind, BTreeMap<String, StoredItem>>,
    /// Keys whose stored value is not JSON at all, with the reason. They never reach
    /// `resources` (an older valid version there keeps serving); the data plane lists them as
    /// quarantined.
    pub unreadable: BTreeMap<(ResourceKind, String), String>,
}

impl ConfigState {
    pub fn items(&self, kind: ResourceKind) -> impl Iterator<Item = &StoredItem> {
        self.resources
            .get(&kind)
            .into_iter()
            .flat_map(|m| m.values())
    }

    pub fn get(&self, kind: ResourceKind, id: &str) -> Option<&StoredItem> {
        self.resources.get(&kind).and_then(|m| m.get(id))
    }

    /// Items of one kind in router insertion order.
    pub fn items_in_order(&self, kind: ResourceKind) -> Vec<&StoredItem> {
        let mut v: Vec<&StoredItem> = self.items(kind).collect();
        v.sort_by_key(|i| i.seq);
        v
    }

    pub fn len(&self) -> usize {
        self.resources.values().map(|m| m.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
