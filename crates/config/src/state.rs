//! The raw configuration a store holds: every resource as stored JSON, with its revisions.
//!
//! Every provider (the `apisix.yaml` file, the embedded store, etcd) publishes whole
//! `ConfigState`s through a `tokio::sync::watch` channel; the data plane compiles each one into a
//! serving snapshot. Each kind's items are a [`SharedMap`], so publishing a new state after one
//! change copies one shard of one kind, and the compile finds what changed by comparing shards.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::model::ResourceKind;
use crate::shared_map::SharedMap;

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
    pub resources: BTreeMap<ResourceKind, SharedMap<StoredItem>>,
    /// Keys whose stored value is not JSON at all, with the reason. They never reach
    /// `resources` (an older valid version there keeps serving); the data plane lists them as
    /// quarantined.
    pub unreadable: BTreeMap<(ResourceKind, String), String>,
}

impl ConfigState {
    /// Items of one kind in id order.
    pub fn items(&self, kind: ResourceKind) -> impl Iterator<Item = &StoredItem> {
        let mut v: Vec<&StoredItem> = self.items_unordered(kind).collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v.into_iter()
    }

    /// Items of one kind in no particular order (no sort).
    pub fn items_unordered(&self, kind: ResourceKind) -> impl Iterator<Item = &StoredItem> {
        self.resources
            .get(&kind)
            .into_iter()
            .flat_map(|m| m.values())
    }

    /// Items of one kind that may differ between `self` and `other` (see
    /// [`SharedMap::candidates`]): the caller compares them.
    pub fn candidates<'a>(&'a self, other: &'a ConfigState, kind: ResourceKind) -> Vec<&'a String> {
        match (self.resources.get(&kind), other.resources.get(&kind)) {
            (Some(a), Some(b)) => a.candidates(b),
            (Some(m), None) | (None, Some(m)) => m.keys().collect(),
            (None, None) => Vec::new(),
        }
    }

    pub fn get(&self, kind: ResourceKind, id: &str) -> Option<&StoredItem> {
        self.resources.get(&kind).and_then(|m| m.get(id))
    }

    /// Items of one kind in router insertion order.
    pub fn items_in_order(&self, kind: ResourceKind) -> Vec<&StoredItem> {
        let mut v: Vec<&StoredItem> = self.items_unordered(kind).collect();
        v.sort_by_key(|i| i.seq);
        v
    }

    pub fn len(&self) -> usize {
        self.resources.values().map(|m| m.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// APISIX's `etcd_modify_index()` (the `apisix_etcd_modify_indexes` metric): per resource
    /// directory, the highest modify index of its items (0 when empty), their maximum, and the
    /// store's current revision (`x_etcd_index`, which APISIX reads from etcd's `X-Etcd-Index`
    /// header), in APISIX's order.
    pub fn modify_indexes(&self) -> Vec<(String, i64)> {
        let mut out = Vec::with_capacity(11);
        let mut max = 0;
        // stream_routes and protos are resources ferrisix does not load: always 0.
        for (key, kind) in [
            ("routes", Some(ResourceKind::Routes)),
            ("services", Some(ResourceKind::Services)),
            ("ssls", Some(ResourceKind::Ssls)),
            ("consumers", Some(ResourceKind::Consumers)),
            ("global_rules", Some(ResourceKind::GlobalRules)),
            ("upstreams", Some(ResourceKind::Upstreams)),
            ("stream_routes", None),
            ("protos", None),
        ] {
            let idx = kind
                .and_then(|k| self.items_unordered(k).map(|i| i.mod_revision).max())
                .unwrap_or(0);
            max = max.max(idx);
            out.push((key.to_owned(), idx));
            if key == "global_rules" && self.items(ResourceKind::GlobalRules).next().is_some() {
                // APISIX's global_rules config `prev_index`: the store revision its watch has seen.
                out.push(("prev_index".to_owned(), self.revision));
            }
        }
        out.push(("max_modify_index".to_owned(), max));
        out.push(("x_etcd_index".to_owned(), self.revision));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: &str, mod_revision: i64) -> StoredItem {
        StoredItem {
            id: id.to_owned(),
            value: Arc::new(Value::Null),
            create_revision: 1,
            mod_revision,
            seq: 0,
        }
    }

    fn with(mut state: ConfigState, kind: ResourceKind, items: &[(&str, i64)]) -> ConfigState {
        let map = state.resources.entry(kind).or_default();
        for (id, rev) in items {
            map.insert((*id).to_owned(), item(id, *rev));
        }
        state
    }

    #[test]
    fn modify_indexes_in_apisix_order() {
        let state = ConfigState {
            revision: 40,
            ..ConfigState::default()
        };
        let names = |v: &[(String, i64)]| v.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
        let empty = state.modify_indexes();
        assert_eq!(
            names(&empty),
            [
                "routes",
                "services",
                "ssls",
                "consumers",
                "global_rules",
                "upstreams",
                "stream_routes",
                "protos",
                "max_modify_index",
                "x_etcd_index"
            ]
        );
        assert!(empty[..9].iter().all(|(_, v)| *v == 0));
        assert_eq!(empty[9], ("x_etcd_index".to_owned(), 40));

        let state = with(state, ResourceKind::Routes, &[("1", 7), ("2", 31)]);
        let state = with(state, ResourceKind::Upstreams, &[("u", 12)]);
        let state = with(state, ResourceKind::GlobalRules, &[("g", 3)]);
        let got: std::collections::BTreeMap<_, _> = state.modify_indexes().into_iter().collect();
        assert_eq!(got["routes"], 31, "the highest of the directory");
        assert_eq!(got["upstreams"], 12);
        assert_eq!(got["global_rules"], 3);
        assert_eq!(
            got["prev_index"], 40,
            "only listed when there are global rules"
        );
        assert_eq!(got["services"], 0);
        assert_eq!(got["max_modify_index"], 31);
        assert_eq!(got["x_etcd_index"], 40);
    }
}
