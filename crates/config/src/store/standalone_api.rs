//! The store of APISIX's API-driven standalone mode (`role: traditional` with
//! `role_traditional.config_provider: yaml`, APISIX 3.13+): the whole configuration lives in
//! memory and is replaced at once by `PUT /apisix/admin/configs`, the way the ingress
//! controller's and ADC's `apisix-standalone` backends drive it.
//!
//! It holds what APISIX's `admin/standalone.lua` keeps in its shared dict: every resource list
//! as sent, a `<resource>_conf_version` per resource type, the client's `X-Digest` and the
//! `X-Last-Modified` time of the last update. [`StandaloneApiStore::replace`] applies a
//! document that the Admin API has already validated, with APISIX's version rules: a type
//! whose version is not given moves on by one and takes the body's items (or none); a version
//! equal to the current one keeps that type as it is; a smaller one refuses the whole update.
//! Each applied update is published as one [`ConfigState`], which the data plane compiles as
//! it compiles any store's.
//!
//! As `core/config_yaml.lua` does, an item whose `modifiedIndex` is the one already loaded for
//! its id keeps serving the loaded version; items whose text did not change keep their stored
//! value, so the compile touches only what changed. The data plane gets items without their
//! `modifiedIndex`, a field only this mode's schemas allow. Consumer items whose id is
//! `<username>/credentials/<id>` are credentials. Nothing survives a restart: the node starts
//! empty and reports itself not ready until the first update, as APISIX does.
//!
//! It implements [`Store`] so that readers (the Admin API's checks, plugins that look at the
//! stored state) work unchanged; key writes are refused, since only whole documents change it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Number, Value};
use tokio::sync::watch;

use crate::model::ResourceKind;
use crate::shared_map::SharedMap;
use crate::state::{ConfigState, StoredItem, StoredValue};
use crate::store::{place_of, KeyPlace, KeyValue, PutOutcome, Store, StoreError, StoreHealth};

/// The resource types of a standalone document: APISIX's HTTP and stream etcd directories,
/// in the order ferrisix checks and writes them. Types ferrisix does not serve (`secrets`,
/// `plugins`) are still kept and returned by `GET`.
pub const RESOURCE_TYPES: [&str; 13] = [
    "routes",
    "services",
    "upstreams",
    "consumers",
    "consumer_groups",
    "ssls",
    "global_rules",
    "plugin_configs",
    "plugin_metadata",
    "stream_routes",
    "protos",
    "secrets",
    "plugins",
];

/// The header (and document key) naming the client's digest of its configuration.
pub const DIGEST: &str = "X-Digest";
/// The header (and document key) with the time of the last update, in epoch seconds. Not the
/// standard `Last-Modified`, so that clients' HTTP caches leave it alone.
pub const LAST_MODIFIED: &str = "X-Last-Modified";

/// `<resource>_conf_version`.
pub fn version_key(resource_type: &str) -> String {
    format!("{resource_type}_conf_version")
}

/// What the store holds for one resource type.
#[derive(Clone, Debug, Default)]
struct TypeEntry {
    version: Option<Number>,
    /// The items as sent (compact JSON), absent when the type had none.
    items: Option<Arc<Vec<StoredValue>>>,
}

/// The loaded document (APISIX's shared-dict `config`).
#[derive(Clone, Debug, Default)]
struct Document {
    types: BTreeMap<&'static str, TypeEntry>,
    digest: String,
    last_modified: i64,
}

#[derive(Debug, Default)]
struct Inner {
    doc: Option<Document>,
    /// What the data plane was last given.
    state: ConfigState,
    /// The `modifiedIndex` each served item was loaded with (its own, else its type's version).
    loaded_index: HashMap<(ResourceKind, String), f64>,
    /// The last insertion slot handed out ([`StoredItem::seq`]).
    next_seq: u64,
}

/// The outcome of [`StandaloneApiStore::replace`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replaced {
    /// The digest is the loaded one: nothing was done (APISIX answers 204).
    SameDigest,
    /// Applied and published, at this `X-Last-Modified`.
    Applied { last_modified: i64 },
}

/// See the module documentation.
pub struct StandaloneApiStore {
    prefix: String,
    inner: Mutex<Inner>,
    tx: watch::Sender<Arc<ConfigState>>,
}

impl std::fmt::Debug for StandaloneApiStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandaloneApiStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl StandaloneApiStore {
    /// An empty store: no document, nothing served, not ready.
    pub fn new(prefix: impl Into<String>) -> Arc<StandaloneApiStore> {
        let (tx, _) = watch::channel(Arc::new(ConfigState::default()));
        Arc::new(StandaloneApiStore {
            prefix: prefix.into(),
            inner: Mutex::new(Inner::default()),
            tx,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The loaded document's `X-Digest`, `None` before the first update.
    pub fn digest(&self) -> Option<String> {
        self.lock().doc.as_ref().map(|d| d.digest.clone())
    }

    /// The loaded document's `X-Last-Modified`, `None` before the first update.
    pub fn last_modified(&self) -> Option<i64> {
        self.lock().doc.as_ref().map(|d| d.last_modified)
    }

    /// The document as `GET /apisix/admin/configs` returns it, as JSON text: every
    /// `<resource>_conf_version` (all 0 before the first update), the resource lists that have
    /// items, and the `X-Last-Modified` and `X-Digest` keys once there was an update.
    pub fn document_json(&self) -> String {
        let inner = self.lock();
        let mut out = String::from("{");
        let mut first = true;
        let mut field = |out: &mut String, key: &str, value: &str| {
            if !first {
                out.push(',');
            }
            first = false;
            out.push_str(&Value::String(key.to_string()).to_string());
            out.push(':');
            out.push_str(value);
        };
        match &inner.doc {
            None => {
                for t in RESOURCE_TYPES {
                    field(&mut out, &version_key(t), "0");
                }
            }
            Some(doc) => {
                for t in RESOURCE_TYPES {
                    let Some(entry) = doc.types.get(t) else {
                        continue;
                    };
                    if let Some(v) = &entry.version {
                        field(&mut out, &version_key(t), &v.to_string());
                    }
                    if let Some(items) = &entry.items {
                        let mut list = String::from("[");
                        for (i, item) in items.iter().enumerate() {
                            if i > 0 {
                                list.push(',');
                            }
                            list.push_str(item.text());
                        }
                        list.push(']');
                        field(&mut out, t, &list);
                    }
                }
                field(&mut out, LAST_MODIFIED, &doc.last_modified.to_string());
                field(
                    &mut out,
                    DIGEST,
                    &Value::String(doc.digest.clone()).to_string(),
                );
            }
        }
        out.push('}');
        out
    }

    /// Whether a configuration was ever applied (`/status/ready`).
    pub fn received(&self) -> bool {
        self.lock().doc.is_some()
    }

    /// Applies `body`, a document the caller has validated (every `<resource>_conf_version`
    /// present is a number, every item an object), under `digest` at `now` (epoch seconds).
    /// `Err` is APISIX's `error_msg` for a version that goes backwards; nothing changes then.
    pub fn replace(
        &self,
        body: &Map<String, Value>,
        digest: &str,
        now: i64,
    ) -> Result<Replaced, String> {
        let mut inner = self.lock();
        if inner.doc.as_ref().is_some_and(|d| d.digest == digest) {
            return Ok(Replaced::SameDigest);
        }
        let old = inner.doc.clone().unwrap_or_default();
        let mut doc = Document {
            types: BTreeMap::new(),
            digest: digest.to_string(),
            last_modified: now,
        };
        // Which types take the body's items, with their new version.
        let mut renewed: Vec<(&'static str, f64)> = Vec::new();
        for t in RESOURCE_TYPES {
            let before = old.types.get(t).cloned().unwrap_or_default();
            let current = before.version.clone().unwrap_or_else(|| Number::from(0));
            let current_f = current.as_f64().unwrap_or(0.0);
            let given = body
                .get(&version_key(t))
                .and_then(Value::as_number)
                .cloned();
            let version = match given {
                Some(v) => {
                    if v.as_f64().unwrap_or(0.0) < current_f {
                        return Err(format!(
                            "{} must be greater than or equal to ({})",
                            version_key(t),
                            lua_number(&current)
                        ));
                    }
                    v
                }
                None => plus_one(&current),
            };
            let unchanged = version.as_f64() == Some(current_f);
            let items = if unchanged {
                before.items
            } else {
                match body.get(t) {
                    Some(Value::Array(items)) if !items.is_empty() => Some(Arc::new(
                        items
                            .iter()
                            .map(StoredValue::from_value)
                            .collect::<Vec<_>>(),
                    )),
                    _ => None,
                }
            };
            if !unchanged {
                renewed.push((t, version.as_f64().unwrap_or(0.0)));
            }
            doc.types.insert(
                t,
                TypeEntry {
                    version: Some(version),
                    items,
                },
            );
        }

        let revision = inner.state.revision + 1;
        let mut state = ConfigState {
            revision,
            resources: inner.state.resources.clone(),
            unreadable: BTreeMap::new(),
            written: BTreeMap::new(),
        };
        for (t, version) in renewed {
            let kinds: Vec<ResourceKind> = match t {
                "consumers" => vec![ResourceKind::Consumers, ResourceKind::Credentials],
                other => match ResourceKind::from_dir(other) {
                    Some(k) => vec![k],
                    None => continue,
                },
            };
            let items = doc.types.get(t).and_then(|e| e.items.clone());
            let mut maps: BTreeMap<ResourceKind, SharedMap<StoredItem>> =
                kinds.iter().map(|k| (*k, SharedMap::new())).collect();
            for (i, text) in items.iter().flat_map(|v| v.iter()).enumerate() {
                let mut value = text.parse();
                // 1-based, as the `arr_<n>` names of items without an id.
                let position = i + 1;
                let id = item_id(&value, position);
                let kind = if t == "consumers" && id.contains("/credentials/") {
                    ResourceKind::Credentials
                } else {
                    kinds[0]
                };
                let own_index = value.get("modifiedIndex").and_then(Value::as_f64);
                let index = own_index.unwrap_or(version);
                // `modifiedIndex` is this mode's own field: the data plane, which checks items
                // with the resource schemas, gets the item without it.
                let stripped = value
                    .as_object_mut()
                    .is_some_and(|m| m.remove("modifiedIndex").is_some());
                let served = if stripped {
                    StoredValue::from_value(&value)
                } else {
                    text.clone()
                };
                let previous = inner.state.get(kind, &id).cloned();
                let same_index = own_index.is_some()
                    && inner.loaded_index.get(&(kind, id.clone())) == Some(&index);
                // As APISIX's list: a known id keeps its slot, a new one goes last.
                let seq = match &previous {
                    Some(p) => p.seq,
                    None => {
                        inner.next_seq += 1;
                        inner.next_seq
                    }
                };
                let item = match previous {
                    // The loaded version stays: same modifiedIndex, or the same text.
                    Some(p) if same_index || p.value == served => p,
                    p => StoredItem {
                        id: id.clone(),
                        value: served,
                        create_revision: p.map_or(revision, |p| p.create_revision),
                        mod_revision: revision,
                        seq,
                    },
                };
                if !same_index {
                    inner.loaded_index.insert((kind, id.clone()), index);
                }
                if let Some(m) = maps.get_mut(&kind) {
                    m.insert(id, item);
                }
            }
            for (kind, map) in maps {
                inner
                    .loaded_index
                    .retain(|(k, id), _| *k != kind || map.contains_key(id));
                if map.is_empty() {
                    state.resources.remove(&kind);
                } else {
                    state.resources.insert(kind, map);
                }
            }
        }
        inner.doc = Some(doc);
        inner.state = state.clone();
        self.tx.send_replace(Arc::new(state));
        Ok(Replaced::Applied { last_modified: now })
    }

    fn key_of(&self, kind: ResourceKind, id: &str) -> String {
        match kind {
            ResourceKind::Credentials => format!("{}/consumers/{id}", self.prefix),
            k => format!("{}/{}/{id}", self.prefix, k.dir()),
        }
    }

    fn kv_of(&self, kind: ResourceKind, item: &StoredItem) -> KeyValue {
        KeyValue {
            key: self.key_of(kind, &item.id),
            value: item.value.text().as_bytes().to_vec(),
            create_revision: item.create_revision,
            mod_revision: item.mod_revision,
        }
    }

    fn refused() -> StoreError {
        StoreError::Invalid(
            "API-driven standalone mode: the configuration changes only through \
             PUT /apisix/admin/configs"
                .into(),
        )
    }
}

/// `item.id or item.username or "arr_" .. position`, as `core/config_yaml.lua` names items.
fn item_id(value: &Value, position: usize) -> String {
    let scalar = |v: Option<&Value>| match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(lua_number(n)),
        Some(other) => Some(other.to_string()),
    };
    scalar(value.get("id"))
        .or_else(|| scalar(value.get("username")))
        .unwrap_or_else(|| format!("arr_{position}"))
}

/// A number as Lua's `tostring` writes it: integral values without a fraction.
fn lua_number(n: &Number) -> String {
    match n.as_f64() {
        Some(f) if !n.is_i64() && !n.is_u64() && f.fract() == 0.0 && f.abs() < 1e15 => {
            format!("{}", f as i64)
        }
        _ => n.to_string(),
    }
}

/// `version + 1`, staying an integer when it is one.
fn plus_one(n: &Number) -> Number {
    if let Some(i) = n.as_i64() {
        return Number::from(i.saturating_add(1));
    }
    if let Some(u) = n.as_u64() {
        return Number::from(u.saturating_add(1));
    }
    let f = n.as_f64().unwrap_or(0.0) + 1.0;
    if f.fract() == 0.0 && f.abs() < 9e15 {
        Number::from(f as i64)
    } else {
        Number::from_f64(f).unwrap_or_else(|| Number::from(0))
    }
}

#[async_trait]
impl Store for StandaloneApiStore {
    fn prefix(&self) -> &str {
        &self.prefix
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let KeyPlace::Resource(kind, id) = place_of(&self.prefix, key) else {
            return Ok(None);
        };
        let inner = self.lock();
        Ok(inner
            .state
            .get(kind, &id)
            .map(|item| self.kv_of(kind, item)))
    }

    async fn list(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64), StoreError> {
        let inner = self.lock();
        let mut kvs: Vec<KeyValue> = inner
            .state
            .resources
            .iter()
            .flat_map(|(kind, items)| items.values().map(|item| self.kv_of(*kind, item)))
            .filter(|kv| kv.key.starts_with(prefix))
            .collect();
        kvs.sort_by(|a, b| a.key.cmp(&b.key));
        Ok((kvs, inner.state.revision))
    }

    async fn put(
        &self,
        _key: &str,
        _value: Vec<u8>,
        _ttl: Option<Duration>,
    ) -> Result<PutOutcome, StoreError> {
        Err(Self::refused())
    }

    async fn put_if_unmodified(
        &self,
        _key: &str,
        _value: Vec<u8>,
        _expected: i64,
        _ttl: Option<Duration>,
    ) -> Result<PutOutcome, StoreError> {
        Err(Self::refused())
    }

    async fn delete(&self, _key: &str) -> Result<Option<KeyValue>, StoreError> {
        Err(Self::refused())
    }

    async fn delete_prefix(&self, _prefix: &str) -> Result<u64, StoreError> {
        Err(Self::refused())
    }

    fn subscribe(&self) -> watch::Receiver<Arc<ConfigState>> {
        self.tx.subscribe()
    }

    fn health(&self) -> StoreHealth {
        let inner = self.lock();
        let received = inner.doc.is_some();
        StoreHealth {
            reachable: true,
            synced: received,
            revision: inner.state.revision,
            detail: if received {
                "API-driven standalone".to_string()
            } else {
                // APISIX's `/status/ready` answer while a worker has no configuration.
                "worker id: 0 has not received configuration".to_string()
            },
        }
    }
}

#[cfg(test)]
mod tests;
