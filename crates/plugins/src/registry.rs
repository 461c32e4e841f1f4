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
    /// Every plugin ferrisix implements.
    pub fn builtin() -> PluginRegistry {
        let mut plugins = builtin_plugins();
        plugins.sort_by(|a, b| b.priority.cmp(&a.priority));
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
        schema::validate(&info.schema, conf)
            .map_err(|e| format!("failed to check the configuration of plugin {name} err: {e}"))
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
    vec![
        PluginInfo::new("limit-count", 1002, limit_count_schema()),
        PluginInfo::new(
            "prometheus",
            500,
            json!({"type": "object", "properties": {"prefer_name": {"type": "boolean", "default": false}}}),
        ),
    ]
}

/// limit-count's schema as of APISIX 3.18 (spec data-plane §6.1).
fn limit_count_schema() -> Value {
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
        "oneOf": [{"required": ["count", "time_window"]}, {"required": ["rules"]}]
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
    fn priority_order() {
        let r = PluginRegistry::builtin();
        let names: Vec<_> = r.list().map(|p| p.name).collect();
        assert_eq!(names, ["limit-count", "prometheus"]);
    }
}
