//! The plugin registry: every enabled plugin's definition, with what APISIX's `_meta`-injected
//! plugin module exposes (schemas, priority, version, scope, type), and the gateway's services
//! the plugins compile against. The Admin API's `/plugins/list`, `/plugins/<name>` and
//! `/schema/plugins/<name>`, validation ([`PluginCheck`]) and compilation all read it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use ferrisix_config::encrypt::{process_fields, FieldOp, Keyring};
use ferrisix_config::schema;
use ferrisix_config::validate::PluginCheck;
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, NoUpstreams, Owner, Plugin, PluginApis, PluginDef, PluginKind,
    PluginServices, RouteInfo, Scope,
};
use serde_json::Value;

/// Which of a plugin's schemas a caller wants (`GET /apisix/admin/plugins/<name>?schema_type=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchemaType {
    Route,
    Consumer,
    Metadata,
}

/// What APISIX's `_meta`-injected plugin module exposes, derived from the plugin's definition.
#[derive(Clone, Debug)]
pub struct PluginInfo {
    pub name: &'static str,
    /// Run order within a phase: higher runs first.
    pub priority: i64,
    pub version: f64,
    /// The configuration schema, with `_meta` injected as APISIX does.
    pub schema: Value,
    pub consumer_schema: Option<Value>,
    pub metadata_schema: Option<Value>,
    /// `global` for plugins that may only run as global rules; `None` otherwise.
    pub scope: Option<&'static str>,
    /// `auth` for authentication plugins (the only ones a consumer credential may carry).
    pub plugin_type: Option<&'static str>,
    pub def: &'static PluginDef,
}

impl PluginInfo {
    fn new(def: &'static PluginDef) -> PluginInfo {
        let mut schema = (def.schema)();
        if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
            props.insert("_meta".into(), schema::plugin_meta_schema().clone());
        }
        PluginInfo {
            name: def.name,
            priority: def.priority,
            version: def.version,
            schema,
            consumer_schema: def.consumer_schema.map(|f| f()),
            metadata_schema: def.metadata_schema.map(|f| f()),
            scope: (def.scope == Scope::Global).then_some("global"),
            plugin_type: (def.kind == PluginKind::Auth).then_some("auth"),
            def,
        }
    }

    pub fn schema_of(&self, kind: SchemaType) -> Option<&Value> {
        match kind {
            SchemaType::Route => Some(&self.schema),
            SchemaType::Consumer => self.consumer_schema.as_ref().or(Some(&self.schema)),
            SchemaType::Metadata => self.metadata_schema.as_ref(),
        }
    }
}

/// The enabled plugins, sorted by priority (highest first), and the services they share.
#[derive(Clone)]
pub struct PluginRegistry {
    plugins: Arc<Vec<PluginInfo>>,
    services: Arc<PluginServices>,
    apis: PluginApis,
    /// The keyring the plugins' `encrypt_fields` are decrypted with before they compile
    /// (see [`PluginRegistry::with_encrypted_fields`]).
    field_keyring: Option<Arc<Keyring>>,
}

impl std::fmt::Debug for PluginRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.plugins.iter().map(|p| p.name))
            .finish()
    }
}

impl PluginRegistry {
    /// The plugins named by config.yaml's `plugins` list (`None` = all), compiling against
    /// `services`. Unknown names are returned so the caller can warn about them.
    pub fn new(
        services: Arc<PluginServices>,
        names: Option<&[String]>,
    ) -> (PluginRegistry, Vec<String>) {
        let known = |n: &String| crate::builtin().any(|d| d.name == n);
        let unknown = names
            .into_iter()
            .flatten()
            .filter(|n| !known(n))
            .cloned()
            .collect();
        let defs = crate::builtin()
            .filter(|d| names.is_none_or(|names| names.iter().any(|n| n == d.name)));
        (Self::from_defs(services, defs), unknown)
    }

    /// A registry of exactly `defs` (plugins of an embedder, test plugins of the API).
    pub fn from_defs(
        services: Arc<PluginServices>,
        defs: impl IntoIterator<Item = &'static PluginDef>,
    ) -> PluginRegistry {
        let mut plugins: Vec<PluginInfo> = defs.into_iter().map(PluginInfo::new).collect();
        plugins.sort_by_key(|p| std::cmp::Reverse(p.priority));
        let apis = PluginApis::new(
            plugins
                .iter()
                .filter_map(|p| p.def.apis)
                .flat_map(|apis| apis(&services))
                .collect(),
        );
        PluginRegistry {
            plugins: Arc::new(plugins),
            services,
            apis,
            field_keyring: None,
        }
    }

    /// This registry with `defs` added: plugins the configuration itself declares (config.yaml's
    /// `wasm.plugins`), enabled whatever the `plugins` list says, as APISIX loads them.
    pub fn with_plugins(self, defs: &[&'static PluginDef]) -> PluginRegistry {
        if defs.is_empty() {
            return self;
        }
        let all: Vec<&'static PluginDef> = self
            .plugins
            .iter()
            .map(|p| p.def)
            .chain(defs.iter().copied())
            .collect();
        PluginRegistry {
            field_keyring: self.field_keyring.clone(),
            ..Self::from_defs(self.services.clone(), all)
        }
    }

    /// The plugins' `encrypt_fields` are stored encrypted with `keyring` (APISIX's
    /// `data_encryption.enable_encrypt_fields` on a store the Admin API writes): the route,
    /// service, plugin config and global rule confs are decrypted with it before they compile,
    /// as APISIX's `plugin_checker` decrypts them when it loads them. A value that does not
    /// decrypt is kept as it is (one written before encryption was turned on).
    pub fn with_encrypted_fields(mut self, keyring: Keyring) -> PluginRegistry {
        self.field_keyring = (!keyring.is_empty()).then(|| Arc::new(keyring));
        self
    }

    /// `conf` of plugin `info` as it compiles: its `encrypt_fields` decrypted, where they are
    /// stored encrypted.
    pub(crate) fn decrypted<'c>(&self, info: &PluginInfo, conf: &'c Value) -> Cow<'c, Value> {
        let Some(keyring) = self.field_keyring.as_deref() else {
            return Cow::Borrowed(conf);
        };
        if info.def.encrypt_fields.is_empty() {
            return Cow::Borrowed(conf);
        }
        let mut plain = conf.clone();
        for failure in process_fields(
            keyring,
            &mut plain,
            info.def.encrypt_fields,
            FieldOp::Decrypt,
        ) {
            tracing::debug!(
                plugin = info.name,
                "failed to decrypt {failure}; kept as stored"
            );
        }
        Cow::Owned(plain)
    }

    /// Where the plugins' `encrypt_fields` are stored encrypted: the names of the plugins
    /// that have some, and what decrypts them in a `plugins` object (for the secret
    /// resolution, which must see a reference stored in such a field).
    pub fn field_decryptor(&self) -> Option<crate::secrets::Decryptor> {
        let keyring = self.field_keyring.clone()?;
        let fields: HashMap<String, &'static [&'static str]> = self
            .plugins
            .iter()
            .filter(|p| !p.def.encrypt_fields.is_empty())
            .map(|p| (p.name.to_owned(), p.def.encrypt_fields))
            .collect();
        let names = fields.keys().map(|n| format!("\"{n}\"")).collect();
        Some(crate::secrets::Decryptor {
            names,
            decrypt: Box::new(move |plugins: &mut Value| {
                let Some(map) = plugins.as_object_mut() else {
                    return;
                };
                for (name, conf) in map.iter_mut() {
                    if let Some(paths) = fields.get(name) {
                        // A field that does not decrypt is kept as stored, as the compile does.
                        let _ = process_fields(&keyring, conf, paths, FieldOp::Decrypt);
                    }
                }
            }),
        })
    }

    /// Every plugin ferrisix implements, with services of its own (tools and tests).
    pub fn builtin() -> PluginRegistry {
        Self::new(Arc::new(PluginServices::default()), None).0
    }

    /// [`PluginRegistry::new`] with services of its own (tools and tests).
    pub fn enabled(names: Option<&[String]>) -> (PluginRegistry, Vec<String>) {
        Self::new(Arc::new(PluginServices::default()), names)
    }

    /// Enabled plugins, highest priority first.
    pub fn list(&self) -> impl Iterator<Item = &PluginInfo> {
        self.plugins.iter()
    }

    pub fn get(&self, name: &str) -> Option<&PluginInfo> {
        self.plugins.iter().find(|p| p.name == name)
    }

    /// The services plugins compile against.
    pub fn services(&self) -> &Arc<PluginServices> {
        &self.services
    }

    /// The APIs the enabled plugins answer themselves.
    pub fn apis(&self) -> &PluginApis {
        &self.apis
    }

    /// Compiles one conf of plugin `name`, held by `owner`, outside a snapshot (benches and
    /// tools; no upstream can be chosen).
    pub fn compile_one(
        &self,
        name: &str,
        conf: &Value,
        owner: &Owner,
        route: Option<&RouteInfo>,
        metadata: Option<&Value>,
    ) -> Result<Arc<dyn Plugin>, String> {
        let info = self
            .get(name)
            .ok_or_else(|| format!("unknown plugin [{name}]"))?;
        let all_metadata: HashMap<String, Value> = metadata
            .map(|m| (info.name.to_owned(), m.clone()))
            .into_iter()
            .collect();
        (info.def.compile)(&CompileCtx {
            name: info.name,
            conf,
            owner,
            route,
            metadata,
            all_metadata: &all_metadata,
            services: &self.services,
            upstreams: &NoUpstreams,
            apis: &self.apis,
            schema: &info.schema,
            protos: &ferrisix_plugin_api::Protos::EMPTY,
        })
    }
}

fn check_failed(name: &str, e: String) -> String {
    format!("failed to check the configuration of plugin {name} err: {e}")
}

impl PluginCheck for PluginRegistry {
    fn check(&self, name: &str, conf: &Value) -> Result<(), String> {
        let info = self
            .get(name)
            .ok_or_else(|| format!("unknown plugin [{name}]"))?;
        info.def
            .verdict(&CheckCtx {
                conf,
                schema: &info.schema,
                services: &self.services,
                now: Instant::now(),
                consumer: false,
            })
            .map_err(|e| check_failed(name, e))
    }

    fn check_consumer(&self, name: &str, conf: &Value) -> Result<(), String> {
        let info = self
            .get(name)
            .ok_or_else(|| format!("unknown plugin [{name}]"))?;
        let schema = info.schema_of(SchemaType::Consumer).unwrap_or(&info.schema);
        if info.def.kind == PluginKind::Auth {
            info.def.verdict(&CheckCtx {
                conf,
                schema,
                services: &self.services,
                now: Instant::now(),
                consumer: true,
            })
        } else {
            // Only auth plugins check their consumer confs beyond the schema.
            schema::validate(schema, conf)
        }
        .map_err(|e| check_failed(name, e))
    }

    fn check_metadata(&self, name: &str, conf: &Value) -> Result<(), String> {
        let info = self
            .get(name)
            .ok_or_else(|| "invalid plugin name".to_string())?;
        match &info.metadata_schema {
            Some(s) => schema::validate(s, conf).map_err(|e| format!("invalid configuration: {e}")),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn accept(_: &CheckCtx<'_>) -> Result<(), String> {
        Ok(())
    }

    fn count_schema() -> Value {
        json!({"type": "object", "properties": {"count": {"type": "integer"}}})
    }

    fn no_compile(_: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
        Err("not compiled in this test".into())
    }

    /// A plugin whose own check accepts everything.
    static LAX: PluginDef = PluginDef {
        check: Some(accept),
        ..PluginDef::new("lax", 1, count_schema, no_compile)
    };

    #[test]
    fn a_check_that_accepts_cannot_drop_the_schema_error() {
        let r = PluginRegistry::from_defs(Arc::new(PluginServices::default()), [&LAX]);
        assert_eq!(
            r.check("lax", &json!({"count": "many"})),
            Err("failed to check the configuration of plugin lax err: property \"count\" validation failed: wrong type: expected integer, got string".into())
        );
        assert!(r.check("lax", &json!({"count": 1})).is_ok());
    }

    #[test]
    fn every_plugin_reports_its_schema_errors() {
        let r = PluginRegistry::builtin();
        // `_meta` must be an object in every plugin schema that has properties.
        let bad = json!({"_meta": "not an object"});
        let mut checked = Vec::new();
        for p in r.list() {
            if p.schema["properties"].get("_meta").is_none() {
                continue;
            }
            let e = r.check(p.name, &bad).unwrap_err();
            let prefix = format!(
                "failed to check the configuration of plugin {} err: ",
                p.name
            );
            assert!(e.starts_with(&prefix), "{e}");
            checked.push(p.name);
        }
        // Every plugin with a check of its own was among them.
        for p in r.list().filter(|p| p.def.check.is_some()) {
            assert!(checked.contains(&p.name), "{} not checked", p.name);
        }
    }

    #[test]
    fn apisix_messages() {
        let r = PluginRegistry::builtin();
        assert_eq!(
            r.check("nope", &json!({})),
            Err("unknown plugin [nope]".into())
        );
        assert_eq!(
            r.check("limit-count", &json!({"count": -100, "time_window": 60})),
            Err("failed to check the configuration of plugin limit-count err: property \"count\" validation failed: value should match only one schema, but matches none".into())
        );
        assert_eq!(
            r.check("prometheus", &json!({"prefer_name": "yes"})),
            Err("failed to check the configuration of plugin prometheus err: property \"prefer_name\" validation failed: wrong type: expected boolean, got string".into())
        );
        assert!(r
            .check("limit-count", &json!({"count": 1, "time_window": 1}))
            .is_ok());
    }

    /// Issue 47, item 6: each plugin's `encrypt_fields` as APISIX 3.18 lists them in its
    /// schema (`apisix/plugins/<name>.lua`): the Admin API stores these encrypted and the data
    /// plane decrypts them, so a field missing here would reach the plugin as it was typed but
    /// be shown and exported unencrypted, and one too many would reach it as ciphertext.
    #[test]
    fn encrypt_fields_are_apisix_s() {
        let apisix: &[(&str, &[&str])] = &[
            ("http-logger", &["auth_header"]),
            ("kafka-logger", &["brokers.sasl_config.password"]),
            ("elasticsearch-logger", &["auth.password", "headers"]),
            ("loki-logger", &["headers"]),
            ("clickhouse-logger", &["password"]),
            ("limit-count", &["redis_password", "sentinel_password"]),
            (
                "graphql-limit-count",
                &[
                    "redis_password",
                    "sentinel_password",
                    "introspection_headers",
                ],
            ),
            ("limit-req", &["redis_password"]),
            ("limit-conn", &["redis_password"]),
            ("key-auth", &["key"]),
            ("basic-auth", &["password"]),
            ("jwt-auth", &["secret"]),
            ("hmac-auth", &["secret_key"]),
            ("jwe-decrypt", &["key", "secret"]),
            ("csrf", &["key"]),
            ("ldap-auth-advanced", &["ldap_password"]),
            ("authz-keycloak", &["client_secret"]),
            ("cas-auth", &["cookie.secret"]),
            ("authz-casdoor", &["client_secret"]),
            (
                "dingtalk-auth",
                &["app_secret", "secret", "secret_fallbacks"],
            ),
            ("feishu-auth", &["app_secret", "secret", "secret_fallbacks"]),
            ("loggly", &["customer_token"]),
            (
                "ai-aws-content-moderation",
                &["comprehend.secret_access_key"],
            ),
            ("ai-aliyun-content-moderation", &["access_key_secret"]),
            ("ai-lakera-guard", &["api_key"]),
            (
                "ai-cache",
                &[
                    "redis_password",
                    "semantic.embedding.openai.api_key",
                    "semantic.embedding.azure_openai.api_key",
                ],
            ),
            (
                "ai-rag",
                &[
                    "embeddings_provider.azure_openai.api_key",
                    "vector_search_provider.azure_ai_search.api_key",
                ],
            ),
            ("google-cloud-logging", &["auth_config.private_key"]),
            ("sls-logger", &["access_key_secret"]),
            ("splunk-hec-logging", &["endpoint.token"]),
            ("tencent-cloud-cls", &["secret_key"]),
            ("lago", &["token"]),
            ("rocketmq-logger", &["secret_key"]),
            ("kafka-proxy", &["sasl.password"]),
            ("ai-rate-limiting", &["redis_password", "sentinel_password"]),
            ("openwhisk", &["service_token"]),
            ("openfunction", &["authorization.service_token"]),
            ("azure-functions", &["authorization.apikey"]),
            (
                "aws-lambda",
                &[
                    "authorization.apikey",
                    "authorization.iam.accesskey",
                    "authorization.iam.secretkey",
                ],
            ),
            (
                "error-log-logger",
                &["clickhouse.password", "kafka.brokers.sasl_config.password"],
            ),
            (
                "openid-connect",
                &[
                    "client_secret",
                    "client_rsa_private_key",
                    "dpop.private_key",
                    "session.secret",
                    "session.redis.password",
                ],
            ),
        ];
        let r = PluginRegistry::builtin();
        for p in r.list() {
            let expected = apisix
                .iter()
                .find(|(name, _)| *name == p.name)
                .map_or(&[][..], |(_, fields)| *fields);
            assert_eq!(p.def.encrypt_fields, expected, "{}", p.name);
        }
    }

    #[test]
    fn limit_count_policies_and_extras() {
        let r = PluginRegistry::builtin();
        let lc = |v: Value| r.check("limit-count", &v);
        // APISIX's words for a policy's missing fields (t/plugin/limit-count-redis.t).
        let e = lc(json!({"count": 1, "time_window": 1, "policy": "redis"})).unwrap_err();
        assert!(e.ends_with("err: then clause did not match"), "{e}");
        assert!(lc(json!({"count": 1, "time_window": 1, "policy": "redis",
            "redis_host": "127.0.0.1"}))
        .is_ok());
        let e = lc(
            json!({"count": 1, "time_window": 1, "policy": "redis-cluster",
            "redis_cluster_nodes": ["127.0.0.1:1"]}),
        )
        .unwrap_err();
        assert!(e.ends_with("else clause did not match"), "{e}");
        assert_eq!(
            lc(json!({"count": 1, "time_window": 1,
                "rules": [{"count": 1, "time_window": 1, "key": "a"}]})),
            Err(
                "failed to check the configuration of plugin limit-count err: \
                 count/time_window and rules cannot be specified at the same time"
                    .into()
            )
        );
        assert!(r
            .check_metadata("limit-count", &json!({"limit_header": "X-L"}))
            .is_ok());
        assert!(r
            .check_metadata(
                "prometheus",
                &json!({"disabled_labels": {"http_status": ["code"]}})
            )
            .is_err());
    }

    #[test]
    fn priority_order() {
        let r = PluginRegistry::builtin();
        let names: Vec<_> = r.list().map(|p| p.name).collect();
        // The plugins of this test's time keep their order whatever is added later.
        let known = [
            "limit-conn",
            "limit-count",
            "limit-req",
            "public-api",
            "prometheus",
        ];
        let seen: Vec<_> = names
            .iter()
            .filter(|n| known.contains(n))
            .copied()
            .collect();
        assert_eq!(seen, known);
        let priorities: Vec<i64> = r.list().map(|p| p.priority).collect();
        assert!(priorities.windows(2).all(|w| w[0] >= w[1]), "{names:?}");
    }

    #[test]
    fn limit_req_and_conn_schemas() {
        let r = PluginRegistry::builtin();
        assert!(r
            .check(
                "limit-req",
                &json!({"rate": 1, "burst": 0, "key": "remote_addr"})
            )
            .is_ok());
        assert_eq!(
            r.check("limit-req", &json!({"rate": 0, "burst": 0, "key": "remote_addr"})),
            Err("failed to check the configuration of plugin limit-req err: property \"rate\" validation failed: expected 0 to be greater than 0".into())
        );
        assert_eq!(
            r.check("limit-req", &json!({"rate": 1, "key": "remote_addr"})),
            Err("failed to check the configuration of plugin limit-req err: property \"burst\" is required".into())
        );
        let e = r
            .check(
                "limit-req",
                &json!({"rate": 1, "burst": 0, "key": "k", "rejected_code": 600}),
            )
            .unwrap_err();
        assert!(e.contains("rejected_code"), "{e}");
        let e = r
            .check(
                "limit-req",
                &json!({"rate": 1, "burst": 0, "key": "k", "policy": "redis"}),
            )
            .unwrap_err();
        assert!(e.ends_with("then clause did not match"), "{e}");
        assert!(r
            .check(
                "limit-conn",
                &json!({"conn": 1, "burst": 0, "default_conn_delay": 0.1, "key": "remote_addr"})
            )
            .is_ok());
        assert_eq!(
            r.check(
                "limit-conn",
                &json!({"conn": 1.5, "burst": 0, "default_conn_delay": 0.1, "key": "k"})
            ),
            // 3.16+: `conn` is an integer or a string of variables.
            Err("failed to check the configuration of plugin limit-conn err: property \"conn\" validation failed: value should match only one schema, but matches none".into())
        );
        let e = r
            .check("limit-conn", &json!({"conn": 1, "burst": 0, "key": "k"}))
            .unwrap_err();
        // Neither `conn`/`burst`/`default_conn_delay`/`key` nor `default_conn_delay`/`rules`.
        assert!(
            e.ends_with("value should match only one schema, but matches none"),
            "{e}"
        );
        let info = r.get("limit-conn").unwrap();
        assert_eq!(info.priority, 1003);
        assert!(info.schema["properties"].get("_meta").is_some());
        // The redis policies of limit-conn default `key_ttl` to 3600; limit-req has none.
        for (plugin, policy, ttl) in [
            (
                "limit-conn",
                json!({"policy": "redis", "redis_host": "127.0.0.1"}),
                Some(3600),
            ),
            (
                "limit-conn",
                json!({"policy": "redis-cluster", "redis_cluster_nodes": ["127.0.0.1:1"],
                    "redis_cluster_name": "c"}),
                Some(3600),
            ),
            ("limit-conn", json!({"policy": "local"}), None),
            (
                "limit-req",
                json!({"policy": "redis", "redis_host": "127.0.0.1"}),
                None,
            ),
        ] {
            let mut conf = json!({"conn": 1, "rate": 1, "burst": 0, "default_conn_delay": 0.1,
                "key": "remote_addr"});
            conf.as_object_mut()
                .unwrap()
                .extend(policy.as_object().unwrap().clone());
            let schema = &r.get(plugin).unwrap().schema;
            ferrisix_config::schema::validate_and_fill(schema, &mut conf).unwrap();
            assert_eq!(
                conf.get("key_ttl").and_then(Value::as_u64),
                ttl,
                "{plugin} {conf}"
            );
        }
    }
}
