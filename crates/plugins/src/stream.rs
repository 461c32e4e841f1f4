//! The stream subsystem's plugins as the Admin API and the stream proxy's compile see them:
//! their names, priorities and schemas, and APISIX's `stream_check_schema` over a stream
//! route's `plugins`. What they do on a connection is the stream proxy's (`ferrisix-stream`).
//!
//! ip-restriction, traffic-split and syslog take the HTTP plugin's schema and checks, as
//! APISIX's stream modules reuse the HTTP ones; limit-conn, mqtt-proxy and prometheus have
//! stream schemas of their own.

use ferrisix_config::schema;
use ferrisix_plugin_api::CheckCtx;
use serde_json::{json, Value};

use crate::PluginRegistry;

/// Every stream plugin ferrisix has, with APISIX's priority.
pub const STREAM_PLUGINS: [(&str, i64); 6] = [
    ("ip-restriction", 3000),
    ("limit-conn", 1003),
    ("mqtt-proxy", 1000),
    ("traffic-split", 966),
    ("prometheus", 500),
    ("syslog", 401),
];

/// APISIX's default `stream_plugins` (conf/config.yaml.example).
pub const DEFAULT_STREAM_PLUGINS: [&str; 4] =
    ["ip-restriction", "limit-conn", "mqtt-proxy", "syslog"];

/// The enabled stream plugins, highest priority first.
#[derive(Clone, Debug)]
pub struct StreamPlugins {
    enabled: Vec<(&'static str, i64)>,
    /// The HTTP plugins whose schemas and checks the stream variants share.
    http: PluginRegistry,
}

impl StreamPlugins {
    /// The plugins `names` lists (`None`: APISIX's default list); names ferrisix has no
    /// stream plugin for are returned for a warning.
    pub fn new(names: Option<&[String]>) -> (StreamPlugins, Vec<String>) {
        let wanted: Vec<String> = match names {
            Some(n) => n.to_vec(),
            None => DEFAULT_STREAM_PLUGINS
                .iter()
                .map(|s| s.to_string())
                .collect(),
        };
        let unknown = wanted
            .iter()
            .filter(|n| !STREAM_PLUGINS.iter().any(|(k, _)| k == n))
            .cloned()
            .collect();
        let enabled = STREAM_PLUGINS
            .into_iter()
            .filter(|(k, _)| wanted.iter().any(|n| n == k))
            .collect();
        let shared: Vec<String> = ["ip-restriction", "traffic-split", "syslog"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (http, _) = PluginRegistry::enabled(Some(&shared));
        (StreamPlugins { enabled, http }, unknown)
    }

    /// Enabled names, highest priority first.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.enabled.iter().map(|(n, _)| *n)
    }

    pub fn priority(&self, name: &str) -> Option<i64> {
        self.enabled
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, p)| *p)
    }

    /// The schema `GET /apisix/admin/plugins/<name>?subsystem=stream` shows.
    pub fn schema(&self, name: &str) -> Option<Value> {
        self.priority(name)?;
        Some(match name {
            "limit-conn" => limit_conn_schema(),
            "mqtt-proxy" => mqtt_proxy_schema(),
            "prometheus" => prometheus_schema(),
            other => self.http.get(other)?.schema.clone(),
        })
    }

    /// One plugin's conf against its stream schema (defaults filled in, as APISIX's check
    /// does); the error is the schema's or the plugin's message.
    pub fn check_one(&self, name: &str, conf: &mut Value) -> Result<(), String> {
        match name {
            "limit-conn" => {
                schema::validate_and_fill(&limit_conn_schema(), conf)?;
                // APISIX's stream schema does not close its properties, and
                // limit-conn/init.lua, which both subsystems share, acts on `policy`: a
                // `redis` / `redis-cluster` conf counts in Redis on stream routes too. Its
                // keys are checked (and defaulted) as the HTTP plugin's.
                if conf.get("policy").is_some() {
                    schema::validate_and_fill(&limit_conn_policy_schema(), conf)?;
                }
                Ok(())
            }
            "mqtt-proxy" | "prometheus" => {
                let schema = self.schema(name).unwrap_or_else(|| json!({}));
                schema::validate_and_fill(&schema, conf)
            }
            other => {
                let info = self
                    .http
                    .get(other)
                    .ok_or_else(|| format!("unknown plugin [{other}]"))?;
                info.def.verdict(&CheckCtx {
                    conf,
                    schema: &info.schema,
                    services: self.http.services(),
                    now: std::time::Instant::now(),
                    consumer: false,
                })
            }
        }
    }

    /// APISIX's `stream_check_schema` over a stream route's `plugins` (unknown and
    /// non-object confs refused; a failing conf refused unless `_meta.disable` is true).
    pub fn check(&self, plugins: &Value) -> Result<(), String> {
        let Some(map) = plugins.as_object() else {
            return Ok(());
        };
        for (name, conf) in map {
            if !conf.is_object() {
                return Err(format!(
                    "invalid plugin conf {} for plugin [{name}]",
                    schema::lua::cjson_encode(conf)
                ));
            }
            if self.priority(name).is_none() {
                return Err(format!("unknown plugin [{name}]"));
            }
            let mut filled = conf.clone();
            if let Err(e) = self.check_one(name, &mut filled) {
                let disabled = conf
                    .get("_meta")
                    .and_then(|m| m.get("disable"))
                    .and_then(Value::as_bool)
                    == Some(true);
                if !disabled {
                    return Err(format!(
                        "failed to check the configuration of stream plugin [{name}]: {e}"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// apisix/stream/plugins/limit-conn.lua (no `policy`, no `rejected_code`: see
/// [`limit_conn_policy_schema`]).
fn limit_conn_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "conn": {"type": "integer", "exclusiveMinimum": 0},
            "burst": {"type": "integer", "minimum": 0},
            "default_conn_delay": {"type": "number", "exclusiveMinimum": 0},
            "only_use_default_delay": {"type": "boolean", "default": false},
            "key": {"type": "string"},
            "key_type": {"type": "string", "enum": ["var", "var_combination"], "default": "var"}
        },
        "required": ["conn", "burst", "default_conn_delay", "key"]
    })
}

/// The HTTP limit-conn's `policy` and its Redis keys (redis-schema.lua's
/// `limit_conn_redis_schema`), checked on a stream conf that sets `policy`.
fn limit_conn_policy_schema() -> Value {
    let mut schema = crate::support::redis::with_policy_clauses(json!({
        "type": "object",
        "properties": {
            "policy": {"type": "string", "enum": ["redis", "redis-cluster", "local"]},
            "allow_degradation": {"type": "boolean", "default": false}
        }
    }));
    let key_ttl = json!({"type": "integer", "default": 3600});
    schema["then"]["properties"]["key_ttl"] = key_ttl.clone();
    schema["else"]["then"]["properties"]["key_ttl"] = key_ttl;
    schema
}

/// apisix/stream/plugins/mqtt-proxy.lua.
fn mqtt_proxy_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "protocol_name": {"type": "string", "default": "MQTT"},
            "protocol_level": {"type": "integer"}
        },
        "required": ["protocol_level"]
    })
}

/// apisix/stream/plugins/prometheus.lua.
fn prometheus_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "prefer_name": {"type": "boolean", "default": false}
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> StreamPlugins {
        let names: Vec<String> = STREAM_PLUGINS.iter().map(|(n, _)| n.to_string()).collect();
        StreamPlugins::new(Some(&names)).0
    }

    #[test]
    fn default_list_and_order() {
        let (p, unknown) = StreamPlugins::new(None);
        assert!(unknown.is_empty());
        assert_eq!(
            p.names().collect::<Vec<_>>(),
            ["ip-restriction", "limit-conn", "mqtt-proxy", "syslog"]
        );
        let (_, unknown) = StreamPlugins::new(Some(&["key-auth".to_string()]));
        assert_eq!(unknown, ["key-auth"]);
    }

    #[test]
    fn checks_as_apisix() {
        let p = all();
        assert_eq!(
            p.check(&json!({"mqttt-proxy": {}})).unwrap_err(),
            "unknown plugin [mqttt-proxy]"
        );
        assert_eq!(
            p.check(&json!({"ip-restriction": "127.0.0.1"}))
                .unwrap_err(),
            "invalid plugin conf \"127.0.0.1\" for plugin [ip-restriction]"
        );
        assert_eq!(
            p.check(&json!({"mqtt-proxy": {"protocol_name": "MQTT"}})).unwrap_err(),
            "failed to check the configuration of stream plugin [mqtt-proxy]: property \"protocol_level\" is required"
        );
        assert!(p
            .check(&json!({"limit-conn": {"conn": 1, "burst": 0, "default_conn_delay": 0.1, "key": "remote_addr"}}))
            .is_ok());
        assert!(p
            .check(&json!({"mqtt-proxy": {"_meta": {"disable": true}}}))
            .is_ok());
    }

    #[test]
    fn limit_conn_redis_policy_checked_and_defaulted() {
        let p = all();
        let base = json!({"conn": 1, "burst": 0, "default_conn_delay": 0.1, "key": "remote_addr"});
        let with = |extra: Value| {
            let mut c = base.clone();
            c.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            c
        };
        let mut redis = with(json!({"policy": "redis", "redis_host": "127.0.0.1"}));
        p.check_one("limit-conn", &mut redis).unwrap();
        assert_eq!(redis["redis_port"], 6379);
        assert_eq!(redis["key_ttl"], 3600);
        assert_eq!(redis["allow_degradation"], false);
        let mut cluster = with(json!({"policy": "redis-cluster"}));
        assert!(p.check_one("limit-conn", &mut cluster).is_err());
        let mut bad = with(json!({"policy": "memcached"}));
        assert!(p.check_one("limit-conn", &mut bad).is_err());
        // Without `policy` the conf is the stream schema's alone.
        let mut local = base.clone();
        p.check_one("limit-conn", &mut local).unwrap();
        assert!(local.get("allow_degradation").is_none());
    }
}
