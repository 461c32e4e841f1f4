//! The explicit configuration diff a compile starts from (vector's `ConfigDiff` is the model):
//! per resource kind, which ids were added, changed and removed since the state the previous
//! snapshot compiled. The compile rebuilds only what a change touches, and publishes the
//! diffs it worked out ([`SnapshotDiff`]) so that a consumer applying snapshots incrementally
//! (the route table of a later issue) can turn them into inserts and removals.

use std::collections::{BTreeMap, BTreeSet};

use ferrisix_config::model::ResourceKind;
use ferrisix_config::state::{ConfigState, StoredItem};

/// Ids added, changed and removed between two versions of one set of things.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Difference {
    pub added: BTreeSet<String>,
    pub changed: BTreeSet<String>,
    pub removed: BTreeSet<String>,
}

impl Difference {
    /// Compares `old` and `new` (id → thing) with `same`.
    pub fn between<'a, T: 'a, U: 'a>(
        old: impl IntoIterator<Item = (&'a String, T)>,
        new: impl IntoIterator<Item = (&'a String, U)>,
        same: impl Fn(&T, &U) -> bool,
    ) -> Difference {
        let old: BTreeMap<&String, T> = old.into_iter().collect();
        let mut diff = Difference::default();
        let mut seen = BTreeSet::new();
        for (id, n) in new {
            seen.insert(id);
            match old.get(id) {
                None => {
                    diff.added.insert(id.clone());
                }
                Some(o) if !same(o, &n) => {
                    diff.changed.insert(id.clone());
                }
                Some(_) => {}
            }
        }
        diff.removed = old
            .keys()
            .filter(|id| !seen.contains(*id))
            .map(|id| (*id).clone())
            .collect();
        diff
    }

    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }

    /// Added, changed or removed.
    pub fn touches(&self, id: &str) -> bool {
        self.added.contains(id) || self.changed.contains(id) || self.removed.contains(id)
    }

    pub fn is_added(&self, id: &str) -> bool {
        self.added.contains(id)
    }

    pub fn is_changed(&self, id: &str) -> bool {
        self.changed.contains(id)
    }

    pub fn is_removed(&self, id: &str) -> bool {
        self.removed.contains(id)
    }

    /// What a consumer inserts (or replaces).
    pub fn changed_and_added(&self) -> impl Iterator<Item = &String> {
        self.changed.iter().chain(&self.added)
    }

    /// What a consumer takes out (before re-inserting the changed ones).
    pub fn removed_and_changed(&self) -> impl Iterator<Item = &String> {
        self.changed.iter().chain(&self.removed)
    }

    /// The difference the other way round (removed and added swapped).
    pub fn flip(&mut self) {
        std::mem::swap(&mut self.added, &mut self.removed);
    }
}

/// One [`Difference`] per resource kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigDiff {
    pub routes: Difference,
    pub services: Difference,
    pub upstreams: Difference,
    pub plugin_configs: Difference,
    pub global_rules: Difference,
    pub plugin_metadata: Difference,
    pub protos: Difference,
    pub consumers: Difference,
    pub consumer_groups: Difference,
    pub credentials: Difference,
    pub ssls: Difference,
    pub stream_routes: Difference,
    /// The secret managers' configurations: read by the secret resolution before the
    /// compile, which they do not reach otherwise.
    pub secrets: Difference,
}

impl ConfigDiff {
    /// What the store changed from `old` to `new`. An item is changed when its value differs
    /// or its place in the router's insertion order does (a delete and re-create between two
    /// states); writing an identical value again is no change.
    pub fn new(old: &ConfigState, new: &ConfigState) -> ConfigDiff {
        let same = |a: &StoredItem, b: &StoredItem| a.seq == b.seq && a.value == b.value;
        let mut diff = ConfigDiff::default();
        for kind in ResourceKind::ALL {
            // Only the shards the two states do not share can hold a difference.
            let d = diff.of_mut(kind);
            for id in old.candidates(new, kind) {
                match (old.get(kind, id), new.get(kind, id)) {
                    (None, Some(_)) => d.added.insert(id.clone()),
                    (Some(_), None) => d.removed.insert(id.clone()),
                    (Some(a), Some(b)) if !same(a, b) => d.changed.insert(id.clone()),
                    _ => false,
                };
            }
        }
        diff
    }

    /// Everything in `state` is added.
    pub fn initial(state: &ConfigState) -> ConfigDiff {
        ConfigDiff::new(&ConfigState::default(), state)
    }

    pub fn of(&self, kind: ResourceKind) -> &Difference {
        match kind {
            ResourceKind::Routes => &self.routes,
            ResourceKind::Services => &self.services,
            ResourceKind::Upstreams => &self.upstreams,
            ResourceKind::PluginConfigs => &self.plugin_configs,
            ResourceKind::GlobalRules => &self.global_rules,
            ResourceKind::PluginMetadata => &self.plugin_metadata,
            ResourceKind::Protos => &self.protos,
            ResourceKind::Consumers => &self.consumers,
            ResourceKind::ConsumerGroups => &self.consumer_groups,
            ResourceKind::Credentials => &self.credentials,
            ResourceKind::Ssls => &self.ssls,
            ResourceKind::StreamRoutes => &self.stream_routes,
            ResourceKind::Secrets => &self.secrets,
        }
    }

    pub fn of_mut(&mut self, kind: ResourceKind) -> &mut Difference {
        match kind {
            ResourceKind::Routes => &mut self.routes,
            ResourceKind::Services => &mut self.services,
            ResourceKind::Upstreams => &mut self.upstreams,
            ResourceKind::PluginConfigs => &mut self.plugin_configs,
            ResourceKind::GlobalRules => &mut self.global_rules,
            ResourceKind::PluginMetadata => &mut self.plugin_metadata,
            ResourceKind::Protos => &mut self.protos,
            ResourceKind::Consumers => &mut self.consumers,
            ResourceKind::ConsumerGroups => &mut self.consumer_groups,
            ResourceKind::Credentials => &mut self.credentials,
            ResourceKind::Ssls => &mut self.ssls,
            ResourceKind::StreamRoutes => &mut self.stream_routes,
            ResourceKind::Secrets => &mut self.secrets,
        }
    }

    pub fn is_empty(&self) -> bool {
        ResourceKind::ALL.iter().all(|k| self.of(*k).is_empty())
    }

    /// The diff the other way round.
    pub fn flip(&mut self) {
        for kind in ResourceKind::ALL {
            self.of_mut(kind).flip();
        }
    }
}

/// What one compile changed, published with the snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotDiff {
    /// What the store changed since the state the previous snapshot compiled.
    pub config: ConfigDiff,
    /// What changed in the served configuration after validation: an update that was
    /// refused keeps the previous version serving, and is no change here.
    pub applied: ConfigDiff,
    /// The route table's entries (compiled routes by route id): added, rebuilt, removed.
    /// Unchanged entries are the same `Arc<CompiledRoute>` as in the previous snapshot.
    pub routes: Difference,
    /// Compiled upstreams by id, likewise.
    pub upstreams: Difference,
}

#[cfg(test)]
mod tests {

    use ferrisix_config::store::{KeyValue, StateBuilder};
    use serde_json::json;

    use super::*;

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    fn put(b: &mut StateBuilder, key: &str, value: serde_json::Value, rev: i64) {
        let kv = KeyValue {
            key: format!("/apisix/{key}"),
            value: value.to_string().into_bytes(),
            create_revision: rev,
            mod_revision: rev,
        };
        b.apply(&kv.key.clone(), Some(&kv), rev);
    }

    #[test]
    fn differences_by_id() {
        let old: BTreeMap<String, i32> = [("a", 1), ("b", 2), ("c", 3)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let new: BTreeMap<String, i32> = [("b", 2), ("c", 30), ("d", 4)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let mut d = Difference::between(&old, &new, |a, b| a == b);
        assert_eq!(d.added, set(&["d"]));
        assert_eq!(d.changed, set(&["c"]));
        assert_eq!(d.removed, set(&["a"]));
        assert!(d.touches("a") && d.touches("c") && d.touches("d") && !d.touches("b"));
        assert_eq!(d.changed_and_added().collect::<Vec<_>>(), ["c", "d"]);
        assert_eq!(d.removed_and_changed().collect::<Vec<_>>(), ["c", "a"]);
        d.flip();
        assert_eq!((d.added, d.removed), (set(&["a"]), set(&["d"])));
        assert!(Difference::between(&old, &old, |a, b| a == b).is_empty());
    }

    #[test]
    fn config_diff_per_kind() {
        let mut b = StateBuilder::new("/apisix");
        put(&mut b, "routes/1", json!({"uri": "/a"}), 2);
        put(&mut b, "routes/2", json!({"uri": "/b"}), 3);
        put(&mut b, "upstreams/u", json!({"nodes": {}}), 4);
        put(&mut b, "plugin_metadata/limit-count", json!({}), 5);
        let first = b.state().clone();
        let initial = ConfigDiff::initial(&first);
        assert_eq!(initial.routes.added, set(&["1", "2"]));
        assert_eq!(initial.upstreams.added, set(&["u"]));
        assert_eq!(initial.plugin_metadata.added, set(&["limit-count"]));
        assert!(initial.services.is_empty() && !initial.is_empty());

        // An identical value written again is no change; a new value is.
        put(&mut b, "routes/1", json!({"uri": "/a"}), 6);
        put(&mut b, "routes/2", json!({"uri": "/B"}), 7);
        b.apply("/apisix/upstreams/u", None, 8);
        put(&mut b, "services/s", json!({}), 9);
        let second = b.state().clone();
        let diff = ConfigDiff::new(&first, &second);
        assert!(diff.routes.added.is_empty() && diff.routes.removed.is_empty());
        assert_eq!(diff.routes.changed, set(&["2"]));
        assert_eq!(diff.upstreams.removed, set(&["u"]));
        assert_eq!(diff.services.added, set(&["s"]));
        assert!(diff.plugin_metadata.is_empty() && diff.consumers.is_empty());
        assert_eq!(diff.of(ResourceKind::Routes), &diff.routes);
        let mut back = diff.clone();
        back.flip();
        assert_eq!(back.upstreams.added, set(&["u"]));
        assert_eq!(back.services.removed, set(&["s"]));
        assert!(ConfigDiff::new(&second, &second).is_empty());
    }

    #[test]
    fn a_new_slot_in_the_insertion_order_is_a_change() {
        let mut b = StateBuilder::new("/apisix");
        put(&mut b, "routes/1", json!({"uri": "/a"}), 2);
        let first = b.state().clone();
        // Deleted and created again between two published states: same value, later slot.
        b.apply("/apisix/routes/1", None, 3);
        put(&mut b, "routes/1", json!({"uri": "/a"}), 4);
        let second = b.state().clone();
        let item = |s: &ConfigState| s.get(ResourceKind::Routes, "1").unwrap().clone();
        assert_eq!(item(&first).value, item(&second).value);
        assert!(!item(&first).value.ptr_eq(&item(&second).value));
        assert_eq!(ConfigDiff::new(&first, &second).routes.changed, set(&["1"]));
    }
}
