//! The consumers of one snapshot, compiled once: the [`ConsumerIndex`] auth plugins look
//! credentials up in, and each consumer's plugins (merged over its group's) as
//! [`ConsumerPlugins`], which the proxy merges over a route's chain once the consumer is
//! known, each (route, consumer) pair once per snapshot ([`ConsumerChains`]).
//!
//! As APISIX's `consumer.plugin()`: every auth plugin's conf on a consumer, and on each of
//! its 3.x credentials (`/consumers/<username>/credentials/<id>`), is one credential; one
//! from a credential authenticates as its consumer with `credential_id` set. The fields the
//! plugin lists in `encrypt_fields` are decrypted with the data encryption keyring, its
//! secret references (`$env://`, [`ferrisix_config::secret`]) resolved, and the plugin's
//! consumer schema fills in its defaults, before the plugin's key field indexes it.

use std::collections::HashMap;
use std::sync::Arc;

use ferrisix_config::encrypt::{process_fields, FieldOp, Keyring};
use ferrisix_config::env::EnvLookup;
use ferrisix_config::model::ResourceKind;
use ferrisix_plugin_api::{Consumer, ConsumerIndex, Credential, Owner, PluginKind};
use serde_json::{Map, Value};

use crate::chain::{CompileEnv, ConsumerPlugins, PluginSource};
use crate::registry::PluginRegistry;

mod chains;

pub use chains::ConsumerChains;

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
    /// `<username>/credentials/<id>`), each already checked against its schema; `$env://`
    /// references in credentials are looked up in `vars`.
    pub fn compile(
        consumers: StoredDocs<'_>,
        groups: StoredDocs<'_>,
        credentials: StoredDocs<'_>,
        keyring: &Keyring,
        vars: EnvLookup<'_>,
        env: CompileEnv<'_>,
    ) -> (ConsumerSet, Vec<ConsumerProblem>) {
        let mut problems = Vec::new();
        let reader = CredentialReader {
            keyring,
            vars,
            registry: env.registry,
        };
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
                labels: doc
                    .get("labels")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default(),
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
                    &reader,
                    &mut index,
                    &consumer,
                    own,
                    (ResourceKind::Consumers, username),
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
                    &reader,
                    &mut index,
                    &consumer,
                    own,
                    (ResourceKind::Credentials, id),
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

/// What reading an auth plugin's conf as a credential needs: the same for every consumer and
/// credential of one compile.
struct CredentialReader<'a> {
    keyring: &'a Keyring,
    /// Where `$env://` references are looked up.
    vars: EnvLookup<'a>,
    registry: &'a PluginRegistry,
}

/// Indexes the auth plugins' confs in `plugins` as credentials of `consumer`; `(kind, id)`:
/// the consumer or credential they were read from, for the problems reported.
fn add_credentials(
    reader: &CredentialReader<'_>,
    index: &mut ConsumerIndex,
    consumer: &Arc<Consumer>,
    plugins: &Map<String, Value>,
    (kind, id): (ResourceKind, &str),
    problems: &mut Vec<ConsumerProblem>,
) {
    let CredentialReader {
        keyring,
        vars,
        registry,
    } = *reader;
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
        // APISIX's `fill_consumer_secret`. The references are resolved before the compile
        // (`crate::secrets`); what is left here is `$env://` only where that did not run.
        // Beyond APISIX, which keeps an unresolved reference as written (so its text would
        // work as the key or password): the credential is left out, fail closed.
        let unresolved = ferrisix_config::secret::resolve_refs(&mut conf, vars);
        if !unresolved.is_empty() {
            let fields: Vec<String> = unresolved
                .iter()
                .map(|u| {
                    format!(
                        "failed to resolve secret reference: {}, field: {}, err: {}",
                        u.reference, u.field, u.error
                    )
                })
                .collect();
            problems.push(ConsumerProblem {
                kind,
                id: id.to_owned(),
                error: format!("plugin {}: {}", info.name, fields.join("; ")),
            });
            continue;
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::{Flow, NoUpstreams, Owner, Phases, Plugin, PluginDef};
    use serde_json::json;

    use super::*;
    use crate::chain::PluginChain;
    use crate::testing::env;

    fn no_vars(_: &str) -> Option<String> {
        None
    }

    fn docs(items: &[(&str, Value)]) -> Vec<(String, Arc<Value>)> {
        items
            .iter()
            .map(|(id, v)| ((*id).to_owned(), Arc::new(v.clone())))
            .collect()
    }

    #[test]
    fn consumers_credentials_and_groups() {
        let keyring = Keyring::apisix_default();
        let consumers = docs(&[
            (
                "jack",
                json!({"username": "jack", "group_id": "g", "labels": {"custom_id": "c-1"},
                    "plugins": {"key-auth": {"key": keyring.encrypt("jack-key")},
                        "limit-count": {"count": 1, "time_window": 60}}}),
            ),
            ("rose", json!({"username": "rose"})),
        ]);
        let groups = docs(&[(
            "g",
            json!({"id": "g", "plugins": {"limit-count": {"count": 9, "time_window": 60},
                "consumer-restriction": {"whitelist": ["jack"]}}}),
        )]);
        let credentials = docs(&[
            (
                "rose/credentials/c1",
                json!({"id": "c1", "plugins": {"basic-auth": {"username": "r", "password": "p"}}}),
            ),
            (
                "ghost/credentials/c2",
                json!({"id": "c2", "plugins": {"key-auth": {"key": "ghost-key"}}}),
            ),
            (
                "rose/credentials/bad",
                json!({"id": "bad", "plugins": {"jwt-auth": {"key": "j", "algorithm": "RS256",
                    "public_key": "not a key"}}}),
            ),
        ]);
        let (set, problems) =
            ConsumerSet::compile(&consumers, &groups, &credentials, &keyring, &no_vars, env());
        // The stored ciphertext was decrypted before indexing.
        let jack = set
            .index
            .find("key-auth", "jack-key")
            .expect("decrypted key");
        assert_eq!(jack.consumer.username, "jack");
        assert_eq!(jack.consumer.group_id.as_deref(), Some("g"));
        assert_eq!(jack.consumer.custom_id.as_deref(), Some("c-1"));
        assert_eq!(jack.consumer.credential_id, None);
        // Auth confs are not among the consumer's plugins (they hold secrets).
        assert!(jack.consumer.plugins.get("key-auth").is_none());
        assert_eq!(jack.consumer.plugins["limit-count"]["count"], 1);
        let rose = set.index.find("basic-auth", "r").unwrap();
        assert_eq!(rose.consumer.credential_id.as_deref(), Some("c1"));
        assert_eq!(rose.field("password"), Some("p"));
        assert!(set.index.find("key-auth", "ghost-key").is_none());
        assert!(set.index.find("jwt-auth", "j").is_none());
        let ids: Vec<&str> = problems.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["ghost/credentials/c2", "rose/credentials/bad"]);
        assert!(problems.iter().all(|p| !p.error.contains("not a key")));
        // The consumer's plugins over its group's; none for rose.
        let jack_plugins = &set.plugins["jack"];
        let mut names: Vec<_> = jack_plugins.names().collect();
        names.sort();
        assert_eq!(names, ["consumer-restriction", "limit-count"]);
        assert!(!set.plugins.contains_key("rose"));
        assert!(set.index.consumer("rose").is_some());
    }

    #[test]
    fn env_references_in_credentials() {
        let consumers = docs(&[(
            "jack",
            json!({"username": "jack", "plugins": {"key-auth": {"key": "$env://JACK_KEY"}}}),
        )]);
        let credentials = docs(&[
            (
                "jack/credentials/b",
                json!({"id": "b", "plugins": {"basic-auth": {"username": "jack",
                    "password": "$ENV://JACK_CREDS/password"}}}),
            ),
            (
                "jack/credentials/v",
                json!({"id": "v", "plugins": {"key-auth": {"key": "$secret://vault/1/jack/key"}}}),
            ),
        ]);
        let vars = |name: &str| match name {
            "JACK_KEY" => Some("key-from-env".to_owned()),
            "JACK_CREDS" => Some(r#"{"password": "pw-from-env"}"#.to_owned()),
            _ => None,
        };
        let (set, problems) = ConsumerSet::compile(
            &consumers,
            &[],
            &credentials,
            &Keyring::default(),
            &vars,
            env(),
        );
        // Beyond APISIX: the unresolved reference fails closed, named with its field.
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].id, "jack/credentials/v");
        assert_eq!(
            problems[0].error,
            "plugin key-auth: failed to resolve secret reference: $secret://vault/1/jack/key, field: /key, err: not fetched"
        );
        let jack = set
            .index
            .find("key-auth", "key-from-env")
            .expect("resolved key");
        assert_eq!(jack.consumer.username, "jack");
        assert!(set.index.find("key-auth", "$env://JACK_KEY").is_none());
        let basic = set.index.find("basic-auth", "jack").unwrap();
        assert_eq!(basic.field("password"), Some("pw-from-env"));
        // The reference's own text lets nobody in.
        assert!(set
            .index
            .find("key-auth", "$secret://vault/1/jack/key")
            .is_none());
    }

    /// A test plugin that marks in a header the requests whose rewrite it ran.
    struct Mark;

    impl Plugin for Mark {
        fn phases(&self) -> Phases {
            Phases::REWRITE
        }

        fn rewrite<'a>(
            &'a self,
            ctx: &'a mut ferrisix_plugin_api::PluginCtx<'_>,
        ) -> ferrisix_plugin_api::Step<'a> {
            ctx.headers_mut()
                .append("x-mark", http::HeaderValue::from_static("1"));
            ferrisix_plugin_api::Step::CONTINUE
        }
    }

    static MARK: PluginDef = PluginDef::new(
        "mark",
        10,
        || json!({"type": "object"}),
        |_| Ok(Arc::new(Mark)),
    );

    #[tokio::test]
    async fn merged_chain_runs_the_consumers_new_plugins_rewrite() {
        let registry: &'static PluginRegistry = Box::leak(Box::new(PluginRegistry::from_defs(
            Arc::new(Default::default()),
            crate::builtin().chain([&MARK]),
        )));
        let metadata: &'static HashMap<String, Value> = Box::leak(Box::default());
        let env = CompileEnv {
            metadata,
            registry,
            upstreams: &NoUpstreams,
            protos: &ferrisix_plugin_api::Protos::EMPTY,
        };
        let owner = Owner::new(ResourceKind::Routes, "merge-1");
        let ka = json!({});
        let lc = json!({"count": 5, "time_window": 60});
        let route = PluginChain::compile(
            &[
                PluginSource {
                    name: "key-auth",
                    conf: &ka,
                    owner: &owner,
                },
                PluginSource {
                    name: "limit-count",
                    conf: &lc,
                    owner: &owner,
                },
            ],
            None,
            env,
        )
        .unwrap();
        assert!(route.needs_consumers());
        let consumers = docs(&[(
            "jack",
            json!({"username": "jack", "plugins": {"key-auth": {"key": "k"}, "mark": {},
                "limit-count": {"count": 1, "time_window": 60}}}),
        )]);
        let (set, problems) =
            ConsumerSet::compile(&consumers, &[], &[], &Keyring::default(), &no_vars, env);
        assert!(problems.is_empty(), "{problems:?}");
        let merged = route.with_consumer(&set.plugins["jack"]);
        let mut names: Vec<_> = merged.names().collect();
        names.sort();
        assert_eq!(names, ["key-auth", "limit-count", "mark"]);
        let mut req = TestRequest::get("/");
        let mut ctx = req.ctx();
        assert_eq!(merged.rewrite_in_consumer(&mut ctx).await, Flow::Continue);
        // The consumer's limit-count (count 1) replaced the route's.
        assert_eq!(merged.access(&mut ctx).await, Flow::Continue);
        assert_eq!(ctx.response_headers()["x-ratelimit-limit"], "1");
        assert_eq!(
            req.headers["x-mark"], "1",
            "the new plugin's rewrite ran once"
        );
    }
}
