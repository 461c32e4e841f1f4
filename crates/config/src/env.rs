//! `${{VAR}}` / `${{VAR:=default}}` environment substitution, shared by `config.yaml` and the
//! standalone `apisix.yaml` / `apisix.json` files.
//!
//! APISIX uses the doubled braces because `$var` and `${var}` already mean nginx variables.
//! Two flavours exist, as in APISIX: on a parsed document (config.yaml and apisix.json), where a
//! string that used a variable is turned into a number or boolean when the result looks like
//! one; and on raw text before parsing (apisix.yaml), where the YAML parser decides the type.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use regex::{Captures, Regex};

/// Looks an environment variable up; tests pass a map instead of touching the process env.
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn pattern() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    // Name is `[A-Za-z0-9_]+` like APISIX's `[%w_]+`; the default runs lazily to the closing
    // braces and is trimmed. `.` does not cross lines, so a stray `${{` cannot eat a document.
    RE.get_or_init(|| {
        Regex::new(r"\$\{\{\s*([A-Za-z0-9_]+)\s*(?::=(.*?))?\s*\}\}").expect("static regex")
    })
}

/// Substitutes every `${{...}}` in `s`. Returns the new string and whether any variable was
/// used; unknown variables without a default are added to `missing`.
fn substitute_str(s: &str, env: EnvLookup<'_>, missing: &mut BTreeSet<String>) -> (String, bool) {
    if !s.contains("${{") {
        return (s.to_owned(), false);
    }
    let mut used = false;
    let out = pattern().replace_all(s, |caps: &Captures<'_>| {
        let name = &caps[1];
        match env(name).or_else(|| caps.get(2).map(|d| d.as_str().trim().to_owned())) {
            Some(v) => {
                used = true;
                v
            }
            None => {
                missing.insert(name.to_owned());
                String::new()
            }
        }
    });
    (out.into_owned(), used)
}

fn missing_error(missing: BTreeSet<String>) -> Result<(), Vec<String>> {
    if missing.is_empty() {
        return Ok(());
    }
    // APISIX's wording, one line per variable.
    Err(missing
        .into_iter()
        .map(|name| {
            format!("failed to handle configuration: can't find environment variable {name}")
        })
        .collect())
}

/// Text-level substitution (apisix.yaml). Whole-line comments are left alone: APISIX would
/// substitute there too and refuse the file over a variable named in a comment, which helps
/// nobody.
pub fn substitute_text(text: &str, env: EnvLookup<'_>) -> Result<String, Vec<String>> {
    if !text.contains("${{") {
        return Ok(text.to_owned());
    }
    let mut missing = BTreeSet::new();
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        if line.trim_start().starts_with('#') {
            out.push_str(line);
        } else {
            out.push_str(&substitute_str(line, env, &mut missing).0);
        }
    }
    missing_error(missing)?;
    Ok(out)
}

/// What a substituted string becomes: APISIX turns numeric-looking results into numbers and
/// `true`/`false` into booleans, but only when a variable was actually used.
enum Coerced {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
}

fn coerce(s: String) -> Coerced {
    if let Ok(i) = s.trim().parse::<i64>() {
        return Coerced::Int(i);
    }
    if let Ok(f) = s.trim().parse::<f64>() {
        if f.is_finite() {
            return Coerced::Float(f);
        }
    }
    match s.as_str() {
        "true" => Coerced::Bool(true),
        "false" => Coerced::Bool(false),
        _ => Coerced::Str(s),
    }
}

/// Substitutes in every string value and string key of a parsed YAML document (config.yaml).
pub fn substitute_yaml(
    value: &mut serde_yaml::Value,
    env: EnvLookup<'_>,
) -> Result<(), Vec<String>> {
    let mut missing = BTreeSet::new();
    walk_yaml(value, env, &mut missing);
    missing_error(missing)
}

fn walk_yaml(value: &mut serde_yaml::Value, env: EnvLookup<'_>, missing: &mut BTreeSet<String>) {
    use serde_yaml::Value;
    match value {
        Value::String(s) => {
            let (new, used) = substitute_str(s, env, missing);
            if used {
                *value = match coerce(new) {
                    Coerced::Int(i) => Value::Number(i.into()),
                    Coerced::Float(f) => Value::Number(f.into()),
                    Coerced::Bool(b) => Value::Bool(b),
                    Coerced::Str(s) => Value::String(s),
                };
            }
        }
        Value::Sequence(seq) => seq.iter_mut().for_each(|v| walk_yaml(v, env, missing)),
        Value::Mapping(map) => {
            let renamed = map
                .keys()
                .any(|k| k.as_str().is_some_and(|k| k.contains("${{")));
            if renamed {
                // Rebuild so renamed keys keep their position.
                let old = std::mem::take(map);
                for (k, v) in old {
                    let k = match k {
                        Value::String(s) => Value::String(substitute_str(&s, env, missing).0),
                        other => other,
                    };
                    map.insert(k, v);
                }
            }
            map.values_mut().for_each(|v| walk_yaml(v, env, missing));
        }
        Value::Tagged(t) => walk_yaml(&mut t.value, env, missing),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// Substitutes in every string value and key of a parsed JSON document (apisix.json).
pub fn substitute_json(
    value: &mut serde_json::Value,
    env: EnvLookup<'_>,
) -> Result<(), Vec<String>> {
    let mut missing = BTreeSet::new();
    walk_json(value, env, &mut missing);
    missing_error(missing)
}

fn walk_json(value: &mut serde_json::Value, env: EnvLookup<'_>, missing: &mut BTreeSet<String>) {
    use serde_json::Value;
    match value {
        Value::String(s) => {
            let (new, used) = substitute_str(s, env, missing);
            if used {
                *value = match coerce(new) {
                    Coerced::Int(i) => Value::from(i),
                    Coerced::Float(f) => Value::from(f),
                    Coerced::Bool(b) => Value::Bool(b),
                    Coerced::Str(s) => Value::String(s),
                };
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| walk_json(v, env, missing)),
        Value::Object(map) => {
            if map.keys().any(|k| k.contains("${{")) {
                let old = std::mem::take(map);
                for (k, v) in old {
                    map.insert(substitute_str(&k, env, missing).0, v);
                }
            }
            map.values_mut().for_each(|v| walk_json(v, env, missing));
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "PORT" => Some("9081".into()),
            "HOST" => Some("example.com".into()),
            "FLAG" => Some("false".into()),
            _ => None,
        }
    }

    #[test]
    fn text_substitution_and_defaults() {
        let out =
            substitute_text("a: ${{PORT}}\nb: ${{ HOST }}\nc: ${{NOPE:= x y }}\n", &env).unwrap();
        assert_eq!(out, "a: 9081\nb: example.com\nc: x y\n");
    }

    #[test]
    fn text_substitution_reports_every_missing_variable() {
        let err = substitute_text("a: ${{A}}\nb: ${{B}}\n# ${{IN_COMMENT}}\n", &env).unwrap_err();
        assert_eq!(
            err,
            vec![
                "failed to handle configuration: can't find environment variable A".to_string(),
                "failed to handle configuration: can't find environment variable B".to_string(),
            ]
        );
    }

    #[test]
    fn json_substitution_coerces_only_substituted_strings() {
        let mut v =
            serde_json::json!({"p": "${{PORT}}", "f": "${{FLAG}}", "s": "9081", "k${{HOST}}": 1});
        substitute_json(&mut v, &env).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"p": 9081, "f": false, "s": "9081", "kexample.com": 1})
        );
    }
}
