//! The plugin registry: metadata and schemas of every plugin, and the enabled set.

use std::sync::Arc;

use ferrisix_config::schema;
use ferrisix_config::validate::PluginCheck;
use serde_json::{json, Value};

/// Which of a plugin's schemas a caller wants (`GET /apisix/admin/plugins/<name>?schema_type=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchemaType {
    Route,
    Consumer,
    Metadata,
}

/// What APISIX's `_meta`-injected plugin module exposes.
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
}

impl PluginInfo {
    fn new(name: &'static str, priority: i64, mut schema: Value) -> PluginInfo {
        if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
            props.insert("_meta".into(), schema::plugin_meta_schema().clone());
        }
        PluginInfo {
            name,
            priority,
            version: 0.1,
            schema,
            consumer_schema: None,
            metadata_schema: None,
            scope: None,
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

/// The enabled plugins, sorted by priority (highest first).
#[derive(Clone, Debug)]
pub struct PluginRegistry {
    plugins: Arc<Vec<PluginInfo>>,
}

impl PluginRegistry {
    /// The built-in registry, built once (for compilation, which needs priorities and schemas
    /// on every snapshot).
    pub fn builtin_shared() -> &'static PluginRegistry {
        static SHARED: std::sync::OnceLock<PluginRegistry> = std::sync::OnceLock::new();
        SHARED.get_or_init(PluginRegistry::builtin)
    }

    /// Every plugin ferrisix implements.
    pub fn builtin() -> PluginRegistry {
        let mut plugins = builtin_plugins();
        plugins.sort_by_key(|p| std::cmp::Reverse(p.priority));
        PluginRegistry {
            plugins: Arc::new(plugins),
        }
    }

    /// The subset named by config.yaml's `plugins` list (`None` = all). Unknown names are
    /// returned so the caller can warn about them.
    pub fn enabled(names: Option<&[String]>) -> (PluginRegistry, Vec<String>) {
        let all = Self::builtin();
        let Some(names) = names else {
            return (all, Vec::new());
        };
        let unknown = names
            .iter()
            .filter(|n| all.get(n).is_none())
            .cloned()
            .collect();
        let plugins = all
            .plugins
            .iter()
            .filter(|p| names.iter().any(|n| n == p.name))
            .cloned()
            .collect();
        (
            PluginRegistry {
                plugins: Arc::new(plugins),
            },
            unknown,
        )
    }

    /// Enabled plugins, highest priority first.
    pub fn list(&self) -> impl Iterator<Item = &PluginInfo> {
        self.plugins.iter()
    }

    pub fn get(&self, name: &str) -> Option<&PluginInfo> {
        self.plugins.iter().find(|p| p.name == name)
    }
}

impl PluginCheck for PluginRegistry {
    fn check(&self, name: &str, conf: &Value) -> Result<(), String> {
        let info = self
            .get(name)
            .ok_or_else(|| format!("unknown plugin [{name}]"))?;
        let fail =
            |e: String| format!("failed to check the configuration of plugin {name} err: {e}");
        if let Err(e) = schema::validate(&info.schema, conf) {
            // APISIX words the count/rules conflict itself instead of the oneOf failure.
            if name == crate::limit_count::NAME && e.contains("value should match only one schema")
            {
                crate::limit_count::check_conf(conf).map_err(fail)?;
            }
            return Err(fail(e));
        }
        if name == crate::limit_count::NAME {
            crate::limit_count::check_conf(conf).map_err(fail)?;
            if conf.get("group").is_some() {
                // Compared with the schema's defaults filled in, as APISIX's check_schema sees it.
                let mut filled = conf.clone();
                schema::validate_and_fill(&info.schema, &mut filled).map_err(fail)?;
                crate::limit_count::check_group(&filled, std::time::Instant::now())
                    .map_err(fail)?;
            }
        }
        Ok(())
    }

    fn check_consumer(&self, name: &str, conf: &Value) -> Result<(), String> {
        let info = self
            .get(name)
            .ok_or_else(|| format!("unknown plugin [{name}]"))?;
        let schema = info.schema_of(SchemaType::Consumer).unwrap_or(&info.schema);
        schema::validate(schema, conf)
            .map_err(|e| format!("failed to check the configuration of plugin {name} err: {e}"))
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

fn builtin_plugins() -> Vec<PluginInfo> {
    let mut limit_count = PluginInfo::new("limit-count", 1002, limit_count_schema());
    limit_count.version = 0.5;
    limit_count.metadata_schema = Some(json!({
        "type": "object",
        "properties": {
            "limit_header": {"type": "string", "default": "X-RateLimit-Limit"},
            "remaining_header": {"type": "string", "default": "X-RateLimit-Remaining"},
            "reset_header": {"type": "string", "default": "X-RateLimit-Reset"}
        }
    }));
    let mut prometheus = PluginInfo::new(
        "prometheus",
        500,
        json!({"type": "object", "properties": {"prefer_name": {"type": "boolean", "default": false}}}),
    );
    prometheus.version = 0.2;
    prometheus.metadata_schema = Some(prometheus_metadata_schema());
    let limit_req = PluginInfo::new("limit-req", 1001, limit_req_schema());
    let limit_conn = PluginInfo::new("limit-conn", 1003, limit_conn_schema());
    let public_api = PluginInfo::new(
        crate::public_api::NAME,
        501,
        json!({"type": "object", "properties": {"uri": {"type": "string"}}}),
    );
    vec![limit_count, limit_req, limit_conn, prometheus, public_api]
}

/// The `redis` / `redis-cluster` policy clauses of limit-req and limit-conn (their `policy`
/// enum has no sentinel).
fn redis_policy_clauses() -> Value {
    let (redis, cluster, _) = redis_policy_schemas();
    json!({
        "if": {"properties": {"policy": {"enum": ["redis"]}}},
        "then": redis,
        "else": {
            "if": {"properties": {"policy": {"enum": ["redis-cluster"]}}},
            "then": cluster
        }
    })
}

fn with_policy_clauses(mut schema: Value) -> Value {
    if let (Some(m), Value::Object(clauses)) = (schema.as_object_mut(), redis_policy_clauses()) {
        m.extend(clauses);
    }
    schema
}

/// apisix/plugins/limit-req.lua.
fn limit_req_schema() -> Value {
    with_policy_clauses(json!({
        "type": "object",
        "properties": {
            "rate": {"type": "number", "exclusiveMinimum": 0},
            "burst": {"type": "number", "minimum": 0},
            "key": {"type": "string"},
            "key_type": {"type": "string", "enum": ["var", "var_combination"], "default": "var"},
            "policy": {"type": "string", "enum": ["redis", "redis-cluster", "local"], "default": "local"},
            "rejected_code": {"type": "integer", "minimum": 200, "maximum": 599, "default": 503},
            "rejected_msg": {"type": "string", "minLength": 1},
            "nodelay": {"type": "boolean", "default": false},
            "allow_degradation": {"type": "boolean", "default": false}
        },
        "required": ["rate", "burst", "key"]
    }))
}

/// apisix/plugins/limit-conn.lua.
fn limit_conn_schema() -> Value {
    let mut schema = with_policy_clauses(json!({
        "type": "object",
        "properties": {
            "conn": {"type": "integer", "exclusiveMinimum": 0},
            "burst": {"type": "integer", "minimum": 0},
            "default_conn_delay": {"type": "number", "exclusiveMinimum": 0},
            "only_use_default_delay": {"type": "boolean", "default": false},
            "key": {"type": "string"},
            "key_type": {"type": "string", "enum": ["var", "var_combination"], "default": "var"},
            "policy": {"type": "string", "enum": ["redis", "redis-cluster", "local"], "default": "local"},
            "rejected_code": {"type": "integer", "minimum": 200, "maximum": 599, "default": 503},
            "rejected_msg": {"type": "string", "minLength": 1},
            "allow_degradation": {"type": "boolean", "default": false}
        },
        "required": ["conn", "burst", "default_conn_delay", "key"]
    }));
    // Both redis clauses add `key_ttl` (redis-schema.lua's `limit_conn_redis_schema`).
    let key_ttl = json!({"type": "integer", "default": 3600});
    schema["then"]["properties"]["key_ttl"] = key_ttl.clone();
    schema["else"]["then"]["properties"]["key_ttl"] = key_ttl;
    schema
}

/// `disabled_labels` per metric (3.18); a metric's identity labels (`code`, `type`) cannot be
/// disabled.
fn prometheus_metadata_schema() -> Value {
    let common = [
        "route",
        "service",
        "consumer",
        "node",
        "request_type",
        "request_llm_model",
        "llm_model",
    ];
    let list =
        |labels: &[&str]| json!({"type": "array", "items": {"type": "string", "enum": labels}});
    let status = [
        "route",
        "matched_uri",
        "matched_host",
        "service",
        "consumer",
        "node",
        "request_type",
        "request_llm_model",
        "llm_model",
        "response_source",
    ];
    json!({
        "type": "object",
        "properties": {
            "disabled_labels": {
                "type": "object",
                "properties": {
                    "http_status": list(&status),
                    "http_latency": list(&common),
                    "bandwidth": list(&common)
                },
                "additionalProperties": false
            }
        }
    })
}

/// The extra properties of the `redis`, `redis-cluster` and `redis-sentinel` policies
/// (apisix/utils/redis-schema.lua, limit-count/init.lua).
fn redis_policy_schemas() -> (Value, Value, Value) {
    let keepalive = json!({
        "redis_keepalive_timeout": {"type": "integer", "minimum": 1000, "default": 10000},
        "redis_keepalive_pool": {"type": "integer", "minimum": 1, "default": 100}
    });
    let with_keepalive = |mut v: Value| {
        if let (Some(m), Some(k)) = (v.as_object_mut(), keepalive.as_object()) {
            m.extend(k.clone());
        }
        v
    };
    let redis = with_keepalive(json!({
        "redis_host": {"type": "string", "minLength": 2},
        "redis_port": {"type": "integer", "minimum": 1, "default": 6379},
        "redis_username": {"type": "string", "minLength": 1},
        "redis_password": {"type": "string", "minLength": 0},
        "redis_database": {"type": "integer", "minimum": 0, "default": 0},
        "redis_timeout": {"type": "integer", "minimum": 1, "default": 1000},
        "redis_ssl": {"type": "boolean", "default": false},
        "redis_ssl_verify": {"type": "boolean", "default": false}
    }));
    let cluster = with_keepalive(json!({
        "redis_cluster_nodes": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "string", "minLength": 2, "maxLength": 100}
        },
        "redis_password": {"type": "string", "minLength": 0},
        "redis_timeout": {"type": "integer", "minimum": 1, "default": 1000},
        "redis_cluster_name": {"type": "string"},
        "redis_cluster_ssl": {"type": "boolean", "default": false},
        "redis_cluster_ssl_verify": {"type": "boolean", "default": false}
    }));
    let sentinel = json!({
        "properties": {
            "redis_sentinels": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {
                        "host": {"type": "string", "minLength": 2},
                        "port": {"type": "integer", "minimum": 1, "maximum": 65535}
                    },
                    "required": ["host", "port"],
                    "additionalProperties": false
                }
            },
            "redis_master_name": {"type": "string", "minLength": 1},
            "redis_role": {"type": "string", "enum": ["master", "slave"], "default": "master"},
            "redis_connect_timeout": {"type": "integer", "minimum": 1, "default": 1000},
            "redis_read_timeout": {"type": "integer", "minimum": 1, "default": 1000},
            "redis_keepalive_timeout": {"type": "integer", "minimum": 1, "default": 60000},
            "redis_database": {"type": "integer", "minimum": 0, "default": 0},
            "redis_username": {"type": "string", "minLength": 1},
            "redis_password": {"type": "string", "minLength": 0},
            "sentinel_username": {"type": "string", "minLength": 1},
            "sentinel_password": {"type": "string", "minLength": 0}
        },
        "required": ["redis_sentinels", "redis_master_name"]
    });
    (
        json!({"properties": redis, "required": ["redis_host"]}),
        json!({"properties": cluster, "required": ["redis_cluster_nodes", "redis_cluster_name"]}),
        sentinel,
    )
}

/// limit-count's schema as of APISIX 3.18 (spec data-plane §6.1).
fn limit_count_schema() -> Value {
    let (redis, cluster, sentinel) = redis_policy_schemas();
    let count_like =
        json!({"oneOf": [{"type": "integer", "exclusiveMinimum": 0}, {"type": "string"}]});
    json!({
        "type": "object",
        "properties": {
            "count": count_like,
            "time_window": count_like,
            "window_type": {"type": "string", "enum": ["fixed", "sliding"], "default": "fixed"},
            "rules": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "count": count_like,
                        "time_window": count_like,
                        "key": {"type": "string"},
                        "header_prefix": {"type": "string"}
                    },
                    "required": ["count", "time_window", "key"]
                }
            },
            "group": {"type": "string"},
            "key": {"type": "string", "default": "remote_addr"},
            "key_type": {"type": "string", "enum": ["var", "var_combination", "constant"], "default": "var"},
            "rejected_code": {"type": "integer", "minimum": 200, "maximum": 599, "default": 503},
            "rejected_msg": {"type": "string", "minLength": 1},
            "policy": {"type": "string", "enum": ["local", "redis", "redis-cluster", "redis-sentinel"], "default": "local"},
            "allow_degradation": {"type": "boolean", "default": false},
            "show_limit_quota_header": {"type": "boolean", "default": true},
            "sync_interval": {"type": "number", "default": -1}
        },
        "oneOf": [{"required": ["count", "time_window"]}, {"required": ["rules"]}],
        "if": {"properties": {"policy": {"enum": ["redis"]}}},
        "then": redis,
        "else": {
            "if": {"properties": {"policy": {"enum": ["redis-cluster"]}}},
            "then": cluster,
            "else": {
                "if": {"properties": {"policy": {"enum": ["redis-sentinel"]}}},
                "then": sentinel
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            names,
            [
                "limit-conn",
                "limit-count",
                "limit-req",
                "public-api",
                "prometheus"
            ]
        );
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
            Err("failed to check the configuration of plugin limit-conn err: property \"conn\" validation failed: wrong type: expected integer, got number".into())
        );
        let e = r
            .check("limit-conn", &json!({"conn": 1, "burst": 0, "key": "k"}))
            .unwrap_err();
        assert!(
            e.ends_with("property \"default_conn_delay\" is required"),
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
