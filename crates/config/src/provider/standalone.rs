//! Reading the standalone file: its text into a [`ConfigState`], as APISIX's
//! `core/config_yaml.lua` reads it.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::env;
use crate::model::ResourceKind;
use crate::state::{ConfigState, StoredItem, StoredValue};

/// The standalone file's syntax.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    Yaml,
    Json,
}

impl Format {
    /// From the file extension: `.yaml`/`.yml` or `.json`.
    pub fn from_path(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()? {
            "yaml" | "yml" => Some(Format::Yaml),
            "json" => Some(Format::Json),
            _ => None,
        }
    }

    /// `apisix.yaml` or `apisix.json`: the file APISIX looks for beside config.yaml.
    pub fn default_file_name(self) -> &'static str {
        match self {
            Format::Yaml => "apisix.yaml",
            Format::Json => "apisix.json",
        }
    }
}

/// Everything one standalone file says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Standalone {
    pub state: ConfigState,
    /// The file's `plugins` list (HTTP plugin names; `stream: true` entries left out), which
    /// replaces the enabled-plugin list from config.yaml. `None` when the file has none.
    pub plugins: Option<Vec<String>>,
    /// Things that were ignored; the file is still applied.
    pub warnings: Vec<String>,
}

/// Parses a standalone file with the process environment; warnings are logged. Every item gets
/// `revision` as its create and mod revision.
pub fn parse_standalone(text: &str, format: Format, revision: i64) -> Result<ConfigState, String> {
    let doc = parse_standalone_with(text, format, revision, &env::process_env)?;
    for w in &doc.warnings {
        tracing::warn!("standalone config: {w}");
    }
    Ok(doc.state)
}

/// Parses a standalone file, looking `${{VAR}}` up with `env`, and returns the `plugins` list
/// and warnings too.
pub fn parse_standalone_with(
    text: &str,
    format: Format,
    revision: i64,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Standalone, String> {
    let root = match format {
        Format::Yaml => {
            if !has_end_flag(text) {
                return Err("missing valid end flag: the file must end with a line `#END`".into());
            }
            // Substituted before parsing, as APISIX does, so quoting decides the type:
            // `"${{PORT}}"` stays a string, `${{PORT}}` becomes a number.
            let text = env::substitute_text(text, env).map_err(|e| e.join("; "))?;
            crate::nesting::check_yaml_depth(&text).map_err(|e| format!("invalid YAML: {e}"))?;
            serde_yaml::from_str::<Value>(&text).map_err(|e| format!("invalid YAML: {e}"))?
        }
        Format::Json => {
            let mut v =
                serde_json::from_str::<Value>(text).map_err(|e| format!("invalid JSON: {e}"))?;
            env::substitute_json(&mut v, env).map_err(|e| e.join("; "))?;
            v
        }
    };
    let top = match root {
        // `#END` alone: an empty configuration.
        Value::Null => {
            return Ok(Standalone {
                state: ConfigState {
                    revision,
                    ..ConfigState::default()
                },
                ..Standalone::default()
            })
        }
        Value::Object(map) => map,
        other => {
            return Err(format!(
                "the top level must be a mapping of resource lists, found {}",
                type_name(&other)
            ))
        }
    };

    let mut out = Standalone {
        state: ConfigState {
            revision,
            ..ConfigState::default()
        },
        ..Standalone::default()
    };
    for (key, value) in top {
        if let Some(kind) = ResourceKind::from_dir(&key) {
            let items = match value {
                Value::Null => continue,
                Value::Array(items) => items,
                other => {
                    return Err(format!(
                        "{key}: expected a list, found {}",
                        type_name(&other)
                    ))
                }
            };
            let map = collect_items(kind, items, revision, &mut out.warnings);
            if !map.is_empty() {
                out.state.resources.insert(kind, map.into_iter().collect());
            }
        } else if key == "plugins" {
            out.plugins = parse_plugins(value, &mut out.warnings)?;
        } else if key.ends_with("_conf_version") {
            // Written by APISIX's API-driven standalone mode (`GET /apisix/admin/configs`), so a
            // dumped config can be used as a file; file mode has no use for them.
        } else {
            out.warnings
                .push(format!("unknown top-level key `{key}` ignored"));
        }
    }
    Ok(out)
}

/// APISIX reads the last 10 bytes and looks for `#END` followed only by whitespace.
fn has_end_flag(text: &str) -> bool {
    let bytes = text.as_bytes();
    let tail = &bytes[bytes.len().saturating_sub(10)..];
    let end = tail
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    tail[..end].ends_with(b"#END")
}

fn collect_items(
    kind: ResourceKind,
    items: Vec<Value>,
    revision: i64,
    warnings: &mut Vec<String>,
) -> BTreeMap<String, StoredItem> {
    let mut map: BTreeMap<String, StoredItem> = BTreeMap::new();
    for (i, value) in items.into_iter().enumerate() {
        let position = i + 1;
        let id = item_id(kind, &value, position);
        if let Some(previous) = map.get(&id) {
            // APISIX keeps both in its list but every lookup by id finds the later one; one id
            // can only name one resource here, so the later one wins.
            warnings.push(format!(
                "{}: items {} and {position} have the same id `{id}`; the later one is used",
                kind.dir(),
                previous.seq
            ));
        }
        let item = StoredItem {
            id: id.clone(),
            value: StoredValue::from_value(&value),
            create_revision: revision,
            mod_revision: revision,
            seq: position as u64,
        };
        map.insert(id, item);
    }
    map
}

/// `id`, else `username` (consumers), else `arr_<1-based position>` — APISIX's
/// `item.id or item.username or "arr_" .. idx`.
fn item_id(kind: ResourceKind, value: &Value, position: usize) -> String {
    let scalar = |v: Option<&Value>| match v {
        // Lua's `or` skips nil and false only.
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(number_id(n)),
        // A non-scalar id cannot be a valid id; keep its text so validation names it.
        Some(other) => Some(other.to_string()),
    };
    let from_value = scalar(value.get("id")).or_else(|| match kind {
        ResourceKind::Consumers => scalar(value.get("username")),
        _ => None,
    });
    from_value.unwrap_or_else(|| format!("arr_{position}"))
}

/// A numeric id as Lua's `tostring` writes it: integral floats without `.0`.
fn number_id(n: &serde_json::Number) -> String {
    match n.as_f64() {
        Some(f) if !n.is_i64() && !n.is_u64() && f.fract() == 0.0 && f.abs() < 1e15 => {
            format!("{}", f as i64)
        }
        _ => n.to_string(),
    }
}

/// `plugins: [{name, stream?}]` (APISIX's form) or plain names.
fn parse_plugins(value: Value, warnings: &mut Vec<String>) -> Result<Option<Vec<String>>, String> {
    let items = match value {
        Value::Null => return Ok(None),
        Value::Array(items) => items,
        other => {
            return Err(format!(
                "plugins: expected a list, found {}",
                type_name(&other)
            ))
        }
    };
    let mut names = Vec::new();
    for (i, item) in items.iter().enumerate() {
        match item {
            Value::String(name) => names.push(name.clone()),
            Value::Object(o) => {
                if o.get("stream").and_then(Value::as_bool) == Some(true) {
                    continue;
                }
                match o.get("name").and_then(Value::as_str) {
                    Some(name) => names.push(name.to_owned()),
                    None => warnings.push(format!("plugins[{i}]: no `name`; ignored")),
                }
            }
            other => warnings.push(format!(
                "plugins[{i}]: expected {{name, stream}}, found {}; ignored",
                type_name(other)
            )),
        }
    }
    Ok(Some(names))
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// Carries revisions over from the previous state: an item whose value did not change keeps its
/// revisions (and shares the stored value), a changed one keeps its create revision. Consumers
/// can then tell which items a reload really touched.
pub(super) fn carry_revisions(prev: &ConfigState, next: &mut ConfigState) {
    for (kind, items) in next.resources.iter_mut() {
        let carried: Vec<StoredItem> = items
            .values()
            .filter_map(|item| {
                let old = prev.get(*kind, &item.id)?;
                let mut item = item.clone();
                item.create_revision = old.create_revision;
                if old.value == item.value {
                    item.value = old.value.clone();
                    item.mod_revision = old.mod_revision;
                }
                Some(item)
            })
            .collect();
        for item in carried {
            items.insert(item.id.clone(), item);
        }
    }
}
