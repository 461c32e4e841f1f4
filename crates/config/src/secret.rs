//! References to secrets in confs, as APISIX's `apisix/secret.lua`: a string field may hold
//! `$env://NAME` (the environment variable; `$env://NAME/field`: the variable holds a JSON
//! object and the reference is its `field`; the prefix in any case) or
//! `$secret://<manager>/<id>/<key>` (a key read through the `/secrets/<manager>/<id>`
//! resource: vault, aws, gcp).
//!
//! This module is the part without I/O: the syntax, the managers' schemas, where references
//! are resolved, and [`StateResolver`], which rewrites a store's [`ConfigState`] with the
//! values a lookup answers. Fetching from the managers (HTTP, signing, tokens) and the cache
//! with its refresh live in `ferrisix-plugins`' `secrets` module, which drives this one.
//!
//! Where references are resolved (APISIX 3.18 resolves them in every plugin conf, in ssls and
//! in upstreams' client certificates): the `plugins` of routes, services, plugin configs,
//! global rules, consumer groups, consumers and credentials; every field of an ssl; the
//! `tls` of upstreams and of routes' and services' inline upstreams.
//!
//! Beyond APISIX, which keeps an unresolved reference as written (so the reference's own text
//! works as a key or password): a resource holding a reference that cannot be resolved is not
//! served in that form. It is quarantined with the reference and the field named (never a
//! value), and its last version that resolved keeps serving, if any.

use std::collections::{BTreeMap, HashMap};
use std::sync::LazyLock;

use serde_json::{json, Value};

use crate::env::EnvLookup;
use crate::model::ResourceKind;
use crate::state::{ConfigState, StoredItem, StoredValue};

const SECRET_PREFIX: &str = "$secret://";
const ENV_PREFIX: &str = "$ENV://";

/// Whether `s` is a secret reference (APISIX's `is_secret_ref`).
pub fn is_secret_ref(s: &str) -> bool {
    s.starts_with(SECRET_PREFIX) || has_env_prefix(s)
}

fn has_env_prefix(s: &str) -> bool {
    s.get(..ENV_PREFIX.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(ENV_PREFIX))
}

/// A `$secret://<manager>/<id>/<key>` reference taken apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretUri<'a> {
    pub manager: &'a str,
    /// The id under the manager (`/secrets/<manager>/<id>`).
    pub id: &'a str,
    /// The rest, which the manager reads (`<path>/<field>` for vault).
    pub key: &'a str,
}

/// Parses a `$secret://` reference, with APISIX's messages.
pub fn parse_secret_uri(uri: &str) -> Result<SecretUri<'_>, String> {
    let path = uri
        .strip_prefix(SECRET_PREFIX)
        .ok_or_else(|| format!("error secret_uri prefix: {uri}"))?;
    let (manager, rest) = path
        .split_once('/')
        .ok_or("error format: no secret manager")?;
    let (id, key) = rest
        .split_once('/')
        .ok_or("error format: no secret conf id")?;
    if key.is_empty() {
        return Err("error format: no secret key id".into());
    }
    Ok(SecretUri { manager, id, key })
}

/// The value of an `$env://` reference (APISIX's `core.env.fetch_by_uri`); `None` when `uri`
/// is not one.
pub fn fetch_env(uri: &str, env: EnvLookup<'_>) -> Option<Result<Value, String>> {
    if !has_env_prefix(uri) {
        return None;
    }
    let path = &uri[ENV_PREFIX.len()..];
    let (name, field) = path.split_once('/').unwrap_or((path, ""));
    let Some(value) = env(name) else {
        return Some(Err(format!("no environment variable {name}")));
    };
    if field.is_empty() {
        return Some(Ok(Value::String(value)));
    }
    let Ok(doc) = serde_json::from_str::<Value>(&value) else {
        return Some(Err(format!("the environment variable {name} is not JSON")));
    };
    Some(match doc.get(field) {
        Some(Value::Null) | None => Err(format!("no field {field} in {name}")),
        Some(v) => Ok(v.clone()),
    })
}

/// A string that may be an `$env://` reference (the managers' own credentials may be one, as
/// APISIX's vault `token` and aws keys): its value, or the string itself.
pub fn env_or_plain(s: &str, env: EnvLookup<'_>) -> String {
    match fetch_env(s, env) {
        Some(Ok(Value::String(v))) => v,
        Some(Ok(other)) => other.to_string(),
        _ => s.to_owned(),
    }
}

static URI: &str = r"^[^\/]+:\/\/([\da-zA-Z.-]+|\[[\da-fA-F:]+\])(:\d+)?";

/// The configuration schema of a secret manager APISIX ships (`apisix/secret/<name>.lua`).
pub fn manager_schema(manager: &str) -> Option<&'static Value> {
    static VAULT: LazyLock<Value> = LazyLock::new(|| {
        json!({
            "type": "object",
            "properties": {
                "uri": {"type": "string", "pattern": URI},
                "prefix": {"type": "string"},
                "token": {"type": "string"},
                "namespace": {"type": "string"}
            },
            "required": ["uri", "prefix", "token"]
        })
    });
    static AWS: LazyLock<Value> = LazyLock::new(|| {
        json!({
            "type": "object",
            "properties": {
                "access_key_id": {"type": "string"},
                "secret_access_key": {"type": "string"},
                "session_token": {"type": "string"},
                "region": {"type": "string", "default": "us-east-1"},
                "endpoint_url": {"type": "string", "pattern": URI}
            },
            "required": ["access_key_id", "secret_access_key"]
        })
    });
    static GCP: LazyLock<Value> = LazyLock::new(|| {
        json!({
            "type": "object",
            "properties": {
                "auth_config": {
                    "type": "object",
                    "properties": {
                        "client_email": {"type": "string"},
                        "private_key": {"type": "string"},
                        "project_id": {"type": "string"},
                        "token_uri": {"type": "string", "default": "https://oauth2.googleapis.com/token"},
                        "scope": {
                            "type": "array",
                            "items": {"type": "string"},
                            "default": ["https://www.googleapis.com/auth/cloud-platform"]
                        },
                        "entries_uri": {"type": "string", "default": "https://secretmanager.googleapis.com/v1"}
                    },
                    "required": ["client_email", "private_key", "project_id"]
                },
                "ssl_verify": {"type": "boolean", "default": true},
                "auth_file": {"type": "string"}
            },
            "oneOf": [{"required": ["auth_config"]}, {"required": ["auth_file"]}]
        })
    });
    match manager {
        "vault" => Some(&VAULT),
        "aws" => Some(&AWS),
        "gcp" => Some(&GCP),
        _ => None,
    }
}

/// A stored `/secrets/<manager>/<id>` checked as APISIX's `check_secret`, with the schema's
/// defaults filled in.
pub fn manager_conf(id: &str, value: &Value) -> Result<(String, Value), String> {
    let (manager, _) = id.split_once('/').ok_or("no secret id")?;
    let schema = manager_schema(manager)
        .ok_or_else(|| format!("secret manager not exits, manager: {manager}"))?;
    let mut conf = value.clone();
    crate::schema::validate_and_fill(schema, &mut conf).map_err(|e| e.to_string())?;
    Ok((manager.to_owned(), conf))
}

/// A reference left unresolved, with why (no secret in either).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unresolved {
    /// The field holding it, as a JSON pointer (`/secret`, `/auth/password`).
    pub field: String,
    pub reference: String,
    pub error: String,
}

/// What a `$secret://` reference stands for, as the cache holds it: `Ok(value)` or why not.
/// `None`: not known (not fetched yet).
pub type SecretLookup<'a> = &'a dyn Fn(&str) -> Option<Result<Value, String>>;

/// Resolves the `$env://` references in the strings of `conf`, at any depth, in place
/// (a `$secret://` one is reported unresolved). Answers the ones left as they were.
pub fn resolve_refs(conf: &mut Value, env: EnvLookup<'_>) -> Vec<Unresolved> {
    resolve_refs_with(conf, env, &|_| None)
}

/// [`resolve_refs`], with `$secret://` references answered by `secrets`.
pub fn resolve_refs_with(
    conf: &mut Value,
    env: EnvLookup<'_>,
    secrets: SecretLookup<'_>,
) -> Vec<Unresolved> {
    let mut unresolved = Vec::new();
    let lookup = |s: &str| -> Result<Value, String> {
        if let Some(v) = fetch_env(s, env) {
            return v;
        }
        secrets(s).unwrap_or_else(|| {
            Err(match parse_secret_uri(s) {
                Err(e) => e,
                Ok(_) => "not fetched".into(),
            })
        })
    };
    walk(conf, &mut String::new(), &lookup, &mut unresolved);
    unresolved
}

fn walk(
    v: &mut Value,
    path: &mut String,
    lookup: &dyn Fn(&str) -> Result<Value, String>,
    out: &mut Vec<Unresolved>,
) {
    match v {
        Value::String(s) if s.starts_with('$') && is_secret_ref(s) => match lookup(s) {
            Ok(value) => *v = value,
            Err(error) => out.push(Unresolved {
                field: path.clone(),
                reference: s.clone(),
                error,
            }),
        },
        Value::Object(map) => {
            for (k, child) in map.iter_mut() {
                let len = path.len();
                path.push('/');
                path.push_str(k);
                walk(child, path, lookup, out);
                path.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter_mut().enumerate() {
                let len = path.len();
                path.push('/');
                path.push_str(&i.to_string());
                walk(child, path, lookup, out);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

fn collect(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) if s.starts_with('$') && is_secret_ref(s) => out.push(s.clone()),
        Value::Object(map) => map.values().for_each(|c| collect(c, out)),
        Value::Array(items) => items.iter().for_each(|c| collect(c, out)),
        _ => {}
    }
}

/// The kinds whose stored values may hold references, and where in them (JSON pointers; ""
/// is the whole value).
pub fn ref_fields(kind: ResourceKind) -> &'static [&'static str] {
    match kind {
        ResourceKind::Routes | ResourceKind::Services => &["/plugins", "/upstream/tls"],
        ResourceKind::PluginConfigs
        | ResourceKind::GlobalRules
        | ResourceKind::ConsumerGroups
        | ResourceKind::Consumers
        | ResourceKind::Credentials => &["/plugins"],
        ResourceKind::Ssls => &[""],
        ResourceKind::Upstreams => &["/tls"],
        _ => &[],
    }
}

/// A quick look at a stored text: whether it may hold a reference at all.
fn may_hold_refs(text: &str) -> bool {
    text.contains(SECRET_PREFIX)
        || text
            .as_bytes()
            .windows(ENV_PREFIX.len())
            .any(|w| w.eq_ignore_ascii_case(ENV_PREFIX.as_bytes()))
}

/// The references in the places of `value` that [`ref_fields`] names for `kind`.
pub fn refs_of(kind: ResourceKind, value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for field in ref_fields(kind) {
        if let Some(v) = value.pointer(field) {
            collect(v, &mut out);
        }
    }
    out
}

/// A resource left out (or serving its last resolved version) because a reference in it did
/// not resolve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub kind: ResourceKind,
    pub id: String,
    pub unresolved: Vec<Unresolved>,
}

impl Refused {
    /// The quarantine message: each reference, its field and why (never a value).
    pub fn message(&self) -> String {
        self.unresolved
            .iter()
            .map(|u| {
                format!(
                    "failed to resolve secret reference: {}, field: {}, err: {}",
                    u.reference, u.field, u.error
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Rewrites a store's states with their references resolved, as the compile should see them.
///
/// It keeps, between states, which items hold references (found again only in the shards a
/// state changed, so a state of many routes without references costs a pointer comparison
/// per shard) and each item's last version that resolved whole.
#[derive(Default)]
pub struct StateResolver {
    /// Where plugins' fields are stored encrypted: what reveals them in a `plugins` object
    /// (a reference may be stored in such a field), and the quoted names of the plugins that
    /// have such fields (an item naming none needs no look).
    reveal: Option<(Vec<String>, RevealFn)>,
    input: ConfigState,
    /// The items holding references, with the references.
    with_refs: BTreeMap<(ResourceKind, String), Vec<String>>,
    /// Each item's last version whose references all resolved: the stored value it was
    /// resolved from, and the resolved item.
    last_good: HashMap<(ResourceKind, String), (StoredValue, StoredItem)>,
}

/// Decrypts the stored-encrypted fields of a `plugins` object in place.
pub type RevealFn = Box<dyn Fn(&mut Value) + Send + Sync>;

/// The kinds [`ref_fields`] names.
const REF_KINDS: [ResourceKind; 9] = [
    ResourceKind::Routes,
    ResourceKind::Services,
    ResourceKind::PluginConfigs,
    ResourceKind::GlobalRules,
    ResourceKind::ConsumerGroups,
    ResourceKind::Consumers,
    ResourceKind::Credentials,
    ResourceKind::Ssls,
    ResourceKind::Upstreams,
];

impl StateResolver {
    /// A resolver that first decrypts the plugins' stored-encrypted fields (`names`: the
    /// quoted names of the plugins that have them).
    pub fn with_reveal(names: Vec<String>, reveal: RevealFn) -> StateResolver {
        StateResolver {
            reveal: Some((names, reveal)),
            ..StateResolver::default()
        }
    }

    /// `value` of `kind` as stored, its plugins' encrypted fields decrypted.
    fn parse(&self, kind: ResourceKind, item: &StoredItem) -> Value {
        let mut value = item.value.parse();
        if let Some((_, reveal)) = &self.reveal {
            if ref_fields(kind).contains(&"/plugins") {
                if let Some(plugins) = value.get_mut("plugins") {
                    reveal(plugins);
                }
            }
        }
        value
    }

    fn may_hold_refs(&self, text: &str) -> bool {
        may_hold_refs(text)
            || self
                .reveal
                .as_ref()
                .is_some_and(|(names, _)| names.iter().any(|n| text.contains(n.as_str())))
    }

    /// Takes `input` as the newest state, finding the references of what changed.
    pub fn update(&mut self, input: &ConfigState) {
        for kind in REF_KINDS {
            let ids: Vec<String> = input
                .candidates(&self.input, kind)
                .into_iter()
                .cloned()
                .collect();
            for id in ids {
                let key = (kind, id);
                let refs = match input.get(kind, &key.1) {
                    Some(item) if self.may_hold_refs(item.value.text()) => {
                        refs_of(kind, &self.parse(kind, item))
                    }
                    _ => Vec::new(),
                };
                if refs.is_empty() {
                    self.with_refs.remove(&key);
                    self.last_good.remove(&key);
                } else {
                    self.with_refs.insert(key, refs);
                }
            }
        }
        self.input = input.clone();
    }

    /// Every `$secret://` reference of the newest state, each once.
    pub fn secret_refs(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self
            .with_refs
            .values()
            .flatten()
            .filter(|r| r.starts_with(SECRET_PREFIX))
            .map(String::as_str)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The newest state with its references resolved by `env` and `secrets`. An item whose
    /// references do not all resolve is refused (the state lists it as unreadable, so it is
    /// reported quarantined): an earlier definition of it that resolved takes its place, as
    /// a refused change leaves the previous version serving; the same definition with a
    /// value it no longer resolves to never does, and without an earlier one it is left out.
    pub fn resolve(
        &mut self,
        env: EnvLookup<'_>,
        secrets: SecretLookup<'_>,
    ) -> (ConfigState, Vec<Refused>) {
        let mut out = self.input.clone();
        let mut refused = Vec::new();
        for key in self.with_refs.keys() {
            let (kind, id) = (key.0, &key.1);
            let Some(item) = self.input.get(kind, id) else {
                continue;
            };
            let mut value = self.parse(kind, item);
            let mut unresolved = Vec::new();
            for field in ref_fields(kind) {
                if let Some(v) = value.pointer_mut(field) {
                    for mut u in resolve_refs_with(v, env, secrets) {
                        u.field = format!("{field}{}", u.field);
                        unresolved.push(u);
                    }
                }
            }
            let map = out.resources.entry(kind).or_default();
            if unresolved.is_empty() {
                let resolved = StoredItem {
                    value: StoredValue::from_value(&value),
                    ..item.clone()
                };
                map.insert(id.clone(), resolved.clone());
                out.written.insert(key.clone(), item.value.clone());
                self.last_good
                    .insert(key.clone(), (item.value.clone(), resolved));
            } else {
                match self.last_good.get(key) {
                    Some((source, good)) if *source != item.value => {
                        out.written.insert(key.clone(), source.clone());
                        map.insert(id.clone(), good.clone())
                    }
                    _ => map.remove(id),
                };
                let r = Refused {
                    kind,
                    id: id.clone(),
                    unresolved,
                };
                out.unreadable.insert((kind, id.clone()), r.message());
                refused.push(r);
            }
        }
        (out, refused)
    }
}
#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "JACK_KEY" => Some("jack-key".into()),
            "CREDS" => Some(r#"{"password": "p4ss", "n": 3}"#.into()),
            "PLAIN" => Some("not json".into()),
            _ => None,
        }
    }

    #[test]
    fn env_references_resolve_and_the_rest_is_reported() {
        let mut conf = json!({
            "key": "$env://JACK_KEY",
            "upper": "$ENV://JACK_KEY",
            "nested": {"password": "$env://CREDS/password", "n": "$env://CREDS/n"},
            "list": ["$env://JACK_KEY", "plain", "$notaref"],
            "missing": "$env://NOPE",
            "field": "$env://CREDS/absent",
            "plain_json": "$env://PLAIN/x",
            "vault": "$secret://vault/1/jack/key",
            "number": 1
        });
        let unresolved = resolve_refs(&mut conf, &env);
        assert_eq!(conf["key"], "jack-key");
        assert_eq!(conf["upper"], "jack-key");
        assert_eq!(conf["nested"]["password"], "p4ss");
        assert_eq!(conf["nested"]["n"], 3);
        assert_eq!(conf["list"], json!(["jack-key", "plain", "$notaref"]));
        assert_eq!(conf["missing"], "$env://NOPE", "kept as it was");
        let mut fields: Vec<&str> = unresolved.iter().map(|u| u.field.as_str()).collect();
        fields.sort_unstable();
        assert_eq!(fields, ["/field", "/missing", "/plain_json", "/vault"]);
        assert!(unresolved.iter().all(|u| !u.error.contains("p4ss")));
        assert!(is_secret_ref("$Env://X") && !is_secret_ref("$envx") && !is_secret_ref("env://X"));
    }

    fn item(id: &str, value: Value, seq: u64) -> StoredItem {
        StoredItem {
            id: id.into(),
            value: StoredValue::from_value(&value),
            create_revision: 1,
            mod_revision: 1,
            seq,
        }
    }

    fn state(items: &[(ResourceKind, &str, Value)]) -> ConfigState {
        let mut s = ConfigState::default();
        for (seq, (kind, id, v)) in items.iter().enumerate() {
            s.resources
                .entry(*kind)
                .or_default()
                .insert((*id).into(), item(id, v.clone(), seq as u64));
        }
        s
    }

    #[test]
    fn uris_parse_as_apisix_does() {
        let u = parse_secret_uri("$secret://aws/1/a/b/c").unwrap();
        assert_eq!((u.manager, u.id, u.key), ("aws", "1", "a/b/c"));
        assert_eq!(
            parse_secret_uri("$secret://vault").unwrap_err(),
            "error format: no secret manager"
        );
        assert_eq!(
            parse_secret_uri("$secret://vault/1").unwrap_err(),
            "error format: no secret conf id"
        );
        assert_eq!(
            parse_secret_uri("$secret://vault/1/").unwrap_err(),
            "error format: no secret key id"
        );
        assert_eq!(env_or_plain("$env://JACK_KEY", &env), "jack-key");
        assert_eq!(env_or_plain("literal", &env), "literal");
        let (m, conf) = manager_conf(
            "aws/1",
            &json!({"access_key_id": "a", "secret_access_key": "s"}),
        )
        .unwrap();
        assert_eq!((m.as_str(), &conf["region"]), ("aws", &json!("us-east-1")));
        assert_eq!(
            manager_conf("nope/1", &json!({})).unwrap_err(),
            "secret manager not exits, manager: nope"
        );
    }

    #[test]
    fn states_are_resolved_and_unresolved_items_fail_closed() {
        let key = "$secret://vault/1/jack/key";
        let consumer = json!({"username": "jack", "plugins": {"key-auth": {"key": key}}});
        let route = json!({"uri": "/r", "plugins": {"p": {"h": "$env://JACK_KEY"}},
            "upstream": {"tls": {"client_key": "$env://JACK_KEY"}}, "name": "$env://JACK_KEY"});
        let input = state(&[
            (ResourceKind::Consumers, "jack", consumer.clone()),
            (ResourceKind::Routes, "1", route),
            (ResourceKind::Routes, "2", json!({"uri": "/plain"})),
        ]);
        let mut r = StateResolver::default();
        r.update(&input);
        assert_eq!(r.secret_refs(), [key]);
        let value = |v: &str| Some(Ok(Value::String(v.into())));
        let (out, refused) = r.resolve(&env, &|u| (u == key).then(|| value("v1")).flatten());
        assert!(refused.is_empty());
        let jack = out
            .get(ResourceKind::Consumers, "jack")
            .unwrap()
            .value
            .parse();
        assert_eq!(jack["plugins"]["key-auth"]["key"], "v1");
        assert_eq!(
            out.written[&(ResourceKind::Consumers, "jack".into())].parse(),
            consumer
        );
        let route = out.get(ResourceKind::Routes, "1").unwrap().value.parse();
        assert_eq!(route["plugins"]["p"]["h"], "jack-key");
        assert_eq!(route["upstream"]["tls"]["client_key"], "jack-key");
        // Outside the places APISIX resolves: kept.
        assert_eq!(route["name"], "$env://JACK_KEY");
        assert!(out.get(ResourceKind::Routes, "2").is_some());

        // Gone at the store: the same definition is not served with the old value.
        let (out, refused) = r.resolve(&env, &|_| Some(Err("no value".into())));
        assert!(out.get(ResourceKind::Consumers, "jack").is_none());
        assert_eq!(refused.len(), 1);
        let msg = &out.unreadable[&(ResourceKind::Consumers, "jack".into())];
        assert_eq!(
            msg,
            "failed to resolve secret reference: $secret://vault/1/jack/key, field: /plugins/key-auth/key, err: no value"
        );

        // A new definition that does not resolve: the earlier one that did keeps serving.
        let (_, _) = r.resolve(&env, &|_| value("v1"));
        let changed = json!({"username": "jack", "plugins": {"key-auth": {"key": "$secret://vault/1/x/key"}}});
        let next = state(&[(ResourceKind::Consumers, "jack", changed)]);
        r.update(&next);
        let (out, _) = r.resolve(&env, &|u| (u == key).then(|| value("v1")).flatten());
        let jack = out
            .get(ResourceKind::Consumers, "jack")
            .unwrap()
            .value
            .parse();
        assert_eq!(jack["plugins"]["key-auth"]["key"], "v1");
        assert!(out
            .unreadable
            .contains_key(&(ResourceKind::Consumers, "jack".into())));

        // References gone from the state are forgotten.
        r.update(&state(&[(
            ResourceKind::Routes,
            "2",
            json!({"uri": "/plain"}),
        )]));
        assert!(r.secret_refs().is_empty());
        let (out, refused) = r.resolve(&env, &|_| None);
        assert!(refused.is_empty() && out.unreadable.is_empty());
    }
}
