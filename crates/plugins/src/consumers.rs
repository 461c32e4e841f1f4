//! The consumers of one snapshot, compiled once: the [`ConsumerIndex`] auth plugins look
//! credentials up in, and each consumer's plugins (merged over its group's) as
//! [`ConsumerPlugins`], which the proxy merges over a route's chain once the consumer is
//! known.
//!
//! As APISIX's `consumer.plugin()`: every auth plugin's conf on a consumer, and on each of
//! its 3.x credentials (`/consumers/<username>/credentials/<id>`), is one credential; one
//! from a credential authenticates as its consumer with `credential_id` set. The fields the
//! plugin lists in `encrypt_fields` are decrypted with the data encryption keyring, and the
//! plugin's consumer schema fills in its defaults, before the plugin's key field indexes it.

use std::collections::HashMap;
use std::sync::Arc;

use ferrisix_config::encrypt::{process_fields, FieldOp, Keyring};
use ferrisix_config::model::ResourceKind;
use ferrisix_plugin_api::{Consumer, ConsumerIndex, Credential, Owner, PluginKind};
use serde_json::{Map, Value};

use crate::chain::{CompileEnv, ConsumerPlugins, PluginSource};
use crate::registry::PluginRegistry;

/// One stored consumer, consumer group or credential, by id.
pub type StoredDocs<'a> = &'a [(String, Arc<Value>)];

/// The consumers of one snapshot.
#[derive(Debug, Default)]
pub struct ConsumerSet {
    pub index: Arc<ConsumerIndex>,
    /// The plugins of consumers that have any besides auth plugins, by username.
    pub plugins: HashMap<String, Arc<ConsumerPlugins>>,
}

/// A consumer or credential the compile left out (or partly out), with why; no secret in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerProblem {
    pub kind: ResourceKind,
    pub id: String,
    pub error: String,
}

impl ConsumerSet {
    /// Compiles `consumers` (by username), `groups` (by id) and `credentials` (by
    /// `<username>/credentials/<id>`), each already checked against its schema.
    pub fn compile(
        consumers: StoredDocs<'_>,
        groups: StoredDocs<'_>,
        credentials: StoredDocs<'_>,
        keyring: &Keyring,
        env: CompileEnv<'_>,
    ) -> (ConsumerSet, Vec<ConsumerProblem>) {
        let mut problems = Vec::new();
        let groups: HashMap<&str, &Value> =
            groups.iter().map(|(id, v)| (id.as_str(), &**v)).collect();
        let mut index = ConsumerIndex::default();
        let mut plugins = HashMap::new();
        let mut by_name: HashMap<&str, Arc<Consumer>> = HashMap::new();
        for (username, doc) in consumers {
            let group_id = doc.get("group_id").and_then(id_text);
            let group = group_id.as_deref().and_then(|g| groups.get(g).copied());
            let own = doc.get("plugins").and_then(Value::as_object);
            let group_plugins = group
                .and_then(|g| g.get("plugins"))
                .and_then(Value::as_object);
            let consumer = Arc::new(Consumer {
                username: username.clone(),
                group_id: group_id.clone(),
                credential_id: None,
                custom_id: doc
                    .get("labels")
                    .and_then(|l| l.get("custom_id"))
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                plugins: merged_plugins(env.registry, group_plugins, own),
            });
            match compile_plugins(username, group_id.as_deref(), group_plugins, own, env) {
                Ok(Some(p)) => {
                    plugins.insert(username.clone(), Arc::new(p));
                }
                Ok(None) => {}
                Err(e) => problems.push(ConsumerProblem {
                    kind: ResourceKind::Consumers,
                    id: username.clone(),
                    error: e,
                }),
            }
            if let Some(own) = own {
                add_credentials(
                    &mut index,
                    &consumer,
                    own,
                    keyring,
                    env.registry,
                    ResourceKind::Consumers,
                    username,
                    &mut problems,
                );
            }
            index.add_consumer(consumer.clone());
            by_name.insert(username, consumer);
        }
        for (id, doc) in credentials {
            let Some((username, cred_id)) = id.split_once("/credentials/") else {
                continue;
            };
            let Some(owner) = by_name.get(username) else {
                // APISIX logs a credential without its consumer ("a wild credential").
                problems.push(ConsumerProblem {
                    kind: ResourceKind::Credentials,
                    id: id.clone(),
                    error: format!("the consumer [{username}] of the credential does not exist"),
                });
                continue;
            };
            let consumer = Arc::new(Consumer {
                credential_id: Some(cred_id.to_owned()),
                ..(**owner).clone()
            });
            if let Some(own) = doc.get("plugins").and_then(Value::as_object) {
                add_credentials(
                    &mut index,
                    &consumer,
                    own,
                    keyring,
                    env.registry,
                    ResourceKind::Credentials,
                    id,
                    &mut problems,
                );
            }
        }
        (
            ConsumerSet {
                index: Arc::new(index),
                plugins,
            },
            problems,
        )
    }
}

fn id_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn is_auth(registry: &PluginRegistry, name: &str) -> bool {
    registry
        .get(name)
        .is_some_and(|i| i.def.kind == PluginKind::Auth)
}

/// The group's plugins with the consumer's replacing them by name, auth plugins (whose confs
/// are credentials, secrets included) left out: what `Consumer::plugins` shows.
fn merged_plugins(
    registry: &PluginRegistry,
    group: Option<&Map<String, Value>>,
    own: Option<&Map<String, Value>>,
) -> Map<String, Value> {
    let mut out = Map::new();
    for (name, conf) in group.into_iter().chain(own).flatten() {
        if !is_auth(registry, name) {
            out.insert(name.clone(), conf.clone());
        }
    }
    out
}

/// The consumer's non-auth plugins over its group's, compiled; `None` when there are none.
/// Both are held by the consumer: what they count (limit-count) is counted per consumer.
fn compile_plugins(
    username: &str,
    group_id: Option<&str>,
    group: Option<&Map<String, Value>>,
    own: Option<&Map<String, Value>>,
    env: CompileEnv<'_>,
) -> Result<Option<ConsumerPlugins>, String> {
    let owner = Owner::new(ResourceKind::Consumers, username);
    let group_owner = group_id.map(|g| {
        let mut o = owner.clone();
        // Distinct from the consumer's own conf of the same plugin.
        o.key.push_str(&format!("#group:{g}"));
        o
    });
    let mut sources = Vec::new();
    for (name, conf) in group.into_iter().flatten() {
        sources.push(PluginSource {
            name,
            conf,
            owner: group_owner.as_ref().unwrap_or(&owner),
        });
    }
    for (name, conf) in own.into_iter().flatten() {
        sources.push(PluginSource {
            name,
            conf,
            owner: &owner,
        });
    }
    if sources.iter().all(|s| is_auth(env.registry, s.name)) {
        return Ok(None);
    }
    let compiled = ConsumerPlugins::compile(&sources, env)?;
    Ok((!compiled.is_empty()).then_some(compiled))
}

/// Indexes the auth plugins' confs in `plugins` as credentials of `consumer`.
#[allow(clippy::too_many_arguments)]
fn add_credentials(
    index: &mut ConsumerIndex,
    consumer: &Arc<Consumer>,
    plugins: &Map<String, Value>,
    keyring: &Keyring,
    registry: &PluginRegistry,
    kind: ResourceKind,
    id: &str,
    problems: &mut Vec<ConsumerProblem>,
) {
    for (name, conf) in plugins {
        let Some(info) = registry.get(name) else {
            continue;
        };
        let Some(auth) = info.def.auth else {
            continue;
        };
        if crate::chain::is_disabled(conf) {
            continue;
        }
        let mut conf = conf.clone();
        for failure in process_fields(
            keyring,
            &mut conf,
            info.def.encrypt_fields,
            FieldOp::Decrypt,
        ) {
            // The value is kept as stored (APISIX does the same), so a field written before
            // encryption was enabled still works.
            tracing::debug!(
                plugin = info.name,
                "{kind:?} {id}: failed to decrypt {failure}"
            );
        }
        if let Some(schema) = info.schema_of(crate::registry::SchemaType::Consumer) {
            let _ = ferrisix_config::schema::validate_and_fill(schema, &mut conf);
        }
        let Some(key) = conf.get(auth.key_field).and_then(Value::as_str) else {
            continue;
        };
        let key = key.to_owned();
        let prepared = match auth.prepare {
            None => None,
            Some(prepare) => match prepare(&conf) {
                Ok(p) => Some(p),
                Err(e) => {
                    problems.push(ConsumerProblem {
                        kind,
                        id: id.to_owned(),
                        error: format!("plugin {}: {e}", info.name),
                    });
                    continue;
                }
            },
        };
        index.add_credential(
            info.name,
            key,
            Credential {
                consumer: consumer.clone(),
                conf,
                prepared,
            },
        );
    }
}
