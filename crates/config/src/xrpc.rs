//! xRPC protocols as the Admin API and the stream proxy's compile check them: which
//! protocols `config.yaml`'s `xrpc.protocols` enables, and a stream route's `protocol`
//! against them (APISIX's `apisix/stream/xrpc.lua` `check_schema`).
//!
//! ferrisix builds the `redis` protocol. APISIX's other protocol, `dubbo`, is not built:
//! enabling it is reported at startup and a route naming it is refused as an unknown
//! protocol.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::schema;

/// The protocols ferrisix has.
pub const BUILT: [&str; 1] = ["redis"];

/// APISIX's protocols ferrisix does not have.
pub const NOT_BUILT: [&str; 1] = ["dubbo"];

/// The enabled protocols a stream route may name.
#[derive(Clone, Debug, Default)]
pub struct XrpcProtocols {
    enabled: Arc<[String]>,
}

impl XrpcProtocols {
    /// The protocols of `xrpc.protocols` ferrisix has; the names it lacks come back apart
    /// for the caller to report (APISIX fails to load a protocol module it lacks).
    pub fn new(names: &[String]) -> (XrpcProtocols, Vec<String>) {
        let mut enabled = Vec::new();
        let mut missing = Vec::new();
        for n in names {
            if BUILT.contains(&n.as_str()) {
                if !enabled.contains(n) {
                    enabled.push(n.clone());
                }
            } else {
                missing.push(n.clone());
            }
        }
        (
            XrpcProtocols {
                enabled: enabled.into(),
            },
            missing,
        )
    }

    pub fn is_enabled(&self, name: &str) -> bool {
        self.enabled.iter().any(|n| n == name)
    }

    /// A stream route's `protocol` (already valid against the stream route schema):
    /// `unknown protocol [name]` unless enabled, then `conf` against the protocol's schema.
    pub fn check(&self, protocol: &Value) -> Result<(), String> {
        let name = match protocol.get("name") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => return Ok(()),
        };
        if !self.is_enabled(&name) {
            return Err(format!("unknown protocol [{name}]"));
        }
        match protocol.get("conf") {
            None => Ok(()),
            Some(conf) => schema::validate(&conf_schema(&name), conf),
        }
    }
}

/// The schema of a protocol's `conf`.
pub fn conf_schema(name: &str) -> Value {
    match name {
        "redis" => redis_schema(),
        _ => json!({"type": "object"}),
    }
}

/// APISIX's `apisix/stream/xrpc/protocols/redis/schema.lua`.
fn redis_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "faults": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {
                        "commands": {
                            "type": "array",
                            "minItems": 1,
                            "items": {"type": "string"}
                        },
                        "key": {"type": "string", "minLength": 1},
                        "delay": {
                            "type": "number",
                            "description": "additional delay in seconds"
                        }
                    },
                    "required": ["commands", "delay"]
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_enabled_and_built_protocols_pass() {
        let (none, _) = XrpcProtocols::new(&[]);
        assert_eq!(
            none.check(&json!({"name": "redis"})).unwrap_err(),
            "unknown protocol [redis]"
        );
        let (p, missing) = XrpcProtocols::new(&["redis".into(), "dubbo".into()]);
        assert_eq!(missing, vec!["dubbo".to_string()]);
        assert!(p.check(&json!({"name": "redis"})).is_ok());
        assert_eq!(
            p.check(&json!({"name": "dubbo"})).unwrap_err(),
            "unknown protocol [dubbo]"
        );
        assert!(p
            .check(
                &json!({"name": "redis", "conf": {"faults": [{"commands": ["get"], "delay": 1}]}})
            )
            .is_ok());
        let err = p
            .check(&json!({"name": "redis", "conf": {"faults": []}}))
            .unwrap_err();
        assert!(err.contains("faults"), "{err}");
        let err = p
            .check(&json!({"name": "redis", "conf": {"faults": [{"commands": ["get"]}]}}))
            .unwrap_err();
        assert!(err.contains("delay"), "{err}");
    }
}
