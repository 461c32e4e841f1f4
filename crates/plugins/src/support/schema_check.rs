//! Whether a JSON schema written by a user (request-validation's `body_schema`, oas-validator's
//! schemas) is one the validator can run, as APISIX's `core.schema.valid` compiles it when the
//! plugin's conf is written: an unknown `type` and a pattern that does not compile are refused
//! then, with the api7 validator's message, rather than met at the first request.

use serde_json::Value;

use crate::support::pcre;

const TYPES: [&str; 8] = [
    "object", "array", "table", "integer", "number", "string", "boolean", "null",
];

/// Nesting limit, so a hostile schema cannot overflow the stack.
const MAX_DEPTH: usize = 64;

/// `Ok` when `schema` can be validated against; else the reason, in the validator's words.
pub fn valid(schema: &Value) -> Result<(), String> {
    walk(schema, 0)
}

fn check_type(t: &Value) -> Result<(), String> {
    match t {
        Value::String(s) if TYPES.contains(&s.as_str()) => Ok(()),
        Value::String(s) => Err(format!("invalid JSON type: {s}")),
        Value::Array(list) => list.iter().try_for_each(check_type),
        _ => Err("invalid JSON type".to_string()),
    }
}

fn walk(schema: &Value, depth: usize) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err("schema nesting too deep".to_string());
    }
    let Value::Object(s) = schema else {
        return Ok(());
    };
    if let Some(t) = s.get("type") {
        check_type(t)?;
    }
    if let Some(p) = s.get("pattern").and_then(Value::as_str) {
        pcre::compile(p, false)?;
    }
    for key in [
        "properties",
        "patternProperties",
        "definitions",
        "dependencies",
    ] {
        if let Some(Value::Object(m)) = s.get(key) {
            for (name, sub) in m {
                if key == "patternProperties" {
                    pcre::compile(name, false)?;
                }
                walk(sub, depth + 1)?;
            }
        }
    }
    for key in [
        "items",
        "additionalProperties",
        "additionalItems",
        "not",
        "contains",
    ] {
        match s.get(key) {
            Some(Value::Array(list)) => list.iter().try_for_each(|v| walk(v, depth + 1))?,
            Some(v) => walk(v, depth + 1)?,
            None => {}
        }
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(list)) = s.get(key) {
            list.iter().try_for_each(|v| walk(v, depth + 1))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn types_and_patterns() {
        assert_eq!(
            valid(&json!({"type": "test"})).unwrap_err(),
            "invalid JSON type: test"
        );
        assert!(
            valid(&json!({"properties": {"a": {"items": {"type": ["string", "x"]}}}})).is_err()
        );
        assert!(valid(&json!({"properties": {"a": {"pattern": "("}}})).is_err());
        assert!(valid(&json!({"type": "object", "properties": {"a": {"type": "string"}}})).is_ok());
    }
}
