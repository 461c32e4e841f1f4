//! References to secrets in confs, as APISIX's `apisix/secret.lua`: a string field may hold
//! `$env://NAME` (the environment variable; `$env://NAME/field`: the variable holds a JSON
//! object and the reference is its `field`; the prefix in any case) or
//! `$secret://<manager>/<id>/<key>` (a key of a `/secrets` resource: vault, aws, gcp).
//! References are resolved where the conf is compiled; one that cannot be resolved is kept
//! as it is and reported (by name, never with a value), as APISIX logs it.
//!
//! ferrisix does not store `/secrets` resources yet: a `$secret://` reference is always
//! reported unresolved.

use serde_json::Value;

use crate::env::EnvLookup;

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

/// A reference left unresolved, with why (no secret in either).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unresolved {
    /// The field holding it, as a JSON pointer (`/secret`, `/auth/password`).
    pub field: String,
    pub reference: String,
    pub error: String,
}

/// Resolves the references in the strings of `conf`, at any depth, in place. Answers the
/// ones left as they were.
pub fn resolve_refs(conf: &mut Value, env: EnvLookup<'_>) -> Vec<Unresolved> {
    let mut unresolved = Vec::new();
    walk(conf, &mut String::new(), env, &mut unresolved);
    unresolved
}

fn walk(v: &mut Value, path: &mut String, env: EnvLookup<'_>, out: &mut Vec<Unresolved>) {
    match v {
        Value::String(s) if s.starts_with('$') && is_secret_ref(s) => match fetch(s, env) {
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
                walk(child, path, env, out);
                path.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter_mut().enumerate() {
                let len = path.len();
                path.push('/');
                path.push_str(&i.to_string());
                walk(child, path, env, out);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

/// The value a reference stands for.
fn fetch(uri: &str, env: EnvLookup<'_>) -> Result<Value, String> {
    if !has_env_prefix(uri) {
        return Err("secret managers (/secrets) are not supported".into());
    }
    let path = &uri[ENV_PREFIX.len()..];
    let (name, field) = path.split_once('/').unwrap_or((path, ""));
    let value = env(name).ok_or_else(|| format!("no environment variable {name}"))?;
    if field.is_empty() {
        return Ok(Value::String(value));
    }
    let doc: Value = serde_json::from_str(&value)
        .map_err(|_| format!("the environment variable {name} is not JSON"))?;
    match doc.get(field) {
        Some(Value::Null) | None => Err(format!("no field {field} in {name}")),
        Some(v) => Ok(v.clone()),
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
}
