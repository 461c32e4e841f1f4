//! The raw configuration a store holds: every resource as stored JSON, with its revisions.
//!
//! Every provider (the `apisix.yaml` file, the embedded store, etcd) publishes whole
//! `ConfigState`s through a `tokio::sync::watch` channel; the data plane compiles each one into a
//! serving snapshot. Each kind's items are a [`SharedMap`], so publishing a new state after one
//! change copies one shard of one kind, and the compile finds what changed by comparing shards.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use crate::model::ResourceKind;
use crate::shared_map::SharedMap;

/// A stored value kept as its JSON text, known to parse.
///
/// The text is the one copy of what a store holds that stays in memory: a parsed
/// `serde_json::Value` of a route of the scale mix takes about 1.7 KB of heap (an ordered map
/// per object, 80-byte values), its text about 200 bytes. The data plane parses it when it
/// compiles the item (the typed model is what serves), the few readers of whole documents
/// (plugin metadata, consumers, the control API) when they need it. Clones share the text.
#[derive(Clone)]
pub struct StoredValue(Arc<str>);

impl StoredValue {
    /// `bytes` as a stored value, `None` when they are not one JSON document.
    pub fn from_json(bytes: &[u8]) -> Option<StoredValue> {
        // Parsed whole, as `Value` parses (skipping a value does not check what parsing
        // does: a number out of range), so that `parse` never meets text it refuses; but
        // into nothing, so nothing is built and dropped.
        serde_json::from_slice::<Accepted>(bytes).ok()?;
        let text = std::str::from_utf8(bytes).ok()?;
        Some(StoredValue(Arc::from(text)))
    }

    /// The compact text of `value`.
    pub fn from_value(value: &Value) -> StoredValue {
        StoredValue(Arc::from(value.to_string()))
    }

    /// The parsed document.
    pub fn parse(&self) -> Value {
        // `from_json` and `from_value` only keep text this parser accepted: the fallback is
        // never taken.
        serde_json::from_str(&self.0).unwrap_or(Value::Null)
    }

    /// The stored JSON text.
    pub fn text(&self) -> &str {
        &self.0
    }

    /// Whether both are the same allocation (a clone of one another).
    pub fn ptr_eq(&self, other: &StoredValue) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A JSON document read the way [`Value`] reads it (every value through `deserialize_any`,
/// numbers as `Value` takes them, keys as strings) and kept nowhere: what it accepts is what
/// `Value` accepts.
struct Accepted;

impl<'de> serde::Deserialize<'de> for Accepted {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Accepted, D::Error> {
        d.deserialize_any(AcceptedVisitor)
    }
}

struct AcceptedVisitor;

impl<'de> serde::de::Visitor<'de> for AcceptedVisitor {
    type Value = Accepted;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Accepted, E> {
        Ok(Accepted)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Accepted, E> {
        Ok(Accepted)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Accepted, E> {
        Ok(Accepted)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Accepted, E> {
        Ok(Accepted)
    }

    fn visit_str<E>(self, _: &str) -> Result<Accepted, E> {
        Ok(Accepted)
    }

    fn visit_unit<E>(self) -> Result<Accepted, E> {
        Ok(Accepted)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Accepted, A::Error> {
        while seq.next_element::<Accepted>()?.is_some() {}
        Ok(Accepted)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Accepted, A::Error> {
        while map.next_key::<Accepted>()?.is_some() {
            map.next_value::<Accepted>()?;
        }
        Ok(Accepted)
    }
}

/// Equal when the texts are: the same document written with other spacing or key order
/// compares unequal, which costs a compile of an item that did not change, never a change
/// that goes unseen.
impl PartialEq for StoredValue {
    fn eq(&self, other: &StoredValue) -> bool {
        self.ptr_eq(other) || self.0 == other.0
    }
}

impl Eq for StoredValue {}

impl fmt::Debug for StoredValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&Value> for StoredValue {
    fn from(value: &Value) -> StoredValue {
        StoredValue::from_value(value)
    }
}

impl From<Value> for StoredValue {
    fn from(value: Value) -> StoredValue {
        StoredValue::from_value(&value)
    }
}

/// One stored resource.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredItem {
    /// The id taken from the key (`/apisix/routes/<id>`); it overrides any `id` in the value.
    pub id: String,
    pub value: StoredValue,
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
    /// The stored values, as written, of the items whose secret references were replaced by
    /// their values (`crate::secret::StateResolver`): what is shown of them (the control
    /// API's dumps), so no value is.
    pub written: BTreeMap<(ResourceKind, String), StoredValue>,
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
        for (key, kind) in [
            ("routes", Some(ResourceKind::Routes)),
            ("services", Some(ResourceKind::Services)),
            ("ssls", Some(ResourceKind::Ssls)),
            ("consumers", Some(ResourceKind::Consumers)),
            ("global_rules", Some(ResourceKind::GlobalRules)),
            ("upstreams", Some(ResourceKind::Upstreams)),
            ("stream_routes", Some(ResourceKind::StreamRoutes)),
            ("protos", Some(ResourceKind::Protos)),
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

    #[test]
    fn stored_values_are_what_value_accepts() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let cases = [
            r#"{"uri":"/a","upstream":{"nodes":{"127.0.0.1:1980":1}},"n":[1,-2,3.5e3,null,true]}"#
                .to_string(),
            r#"{"a":1,"a":2}"#.into(),
            r#""\u00e9\n""#.into(),
            r#""\ud800""#.into(),
            "1e400".into(),
            "-1e-400".into(),
            "18446744073709551616".into(),
            "[1,]".into(),
            "{\"a\" 1}".into(),
            "01".into(),
            "".into(),
            "{} {}".into(),
            "\"\u{1}\"".into(),
            deep(100),
            deep(200),
        ];
        for text in &cases {
            let by_value = serde_json::from_str::<Value>(text).is_ok();
            assert_eq!(
                StoredValue::from_json(text.as_bytes()).is_some(),
                by_value,
                "{text:?}"
            );
        }
        assert!(StoredValue::from_json(b"\"\xff\"").is_none(), "not UTF-8");
    }

    #[test]
    fn stored_values_keep_the_text_and_parse_it() {
        let v = StoredValue::from_json(br#"{"uri":"/a","n":[1,2.5,{"x":null}]}"#).unwrap();
        assert_eq!(v.text(), r#"{"uri":"/a","n":[1,2.5,{"x":null}]}"#);
        assert_eq!(
            v.parse(),
            serde_json::json!({"uri": "/a", "n": [1, 2.5, {"x": null}]})
        );
        for bad in [&b"{"[..], b"", b"{} {}", b"\xff", b"[1e400]"] {
            assert!(StoredValue::from_json(bad).is_none(), "{bad:?}");
        }
        let doc = serde_json::json!({"b": 1, "a": [true]});
        let w = StoredValue::from_value(&doc);
        assert_eq!(w.parse(), doc, "key order kept");
        assert_eq!(w, w.clone());
        assert!(w.ptr_eq(&w.clone()));
        assert_eq!(
            w,
            StoredValue::from_value(&doc),
            "same text, other allocation"
        );
        assert_ne!(w, v);
    }

    fn item(id: &str, mod_revision: i64) -> StoredItem {
        StoredItem {
            id: id.to_owned(),
            value: StoredValue::from_value(&Value::Null),
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
