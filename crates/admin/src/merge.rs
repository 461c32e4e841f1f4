//! PATCH: APISIX's `core.table.merge` (whole-object PATCH) and `core.table.patch` (sub-path
//! PATCH), with the Lua table semantics clients observe.

use serde_json::{Map, Value};

/// LuaJIT's `table.isarray` on a decoded JSON value: arrays, and empty objects (an empty Lua
/// table cannot be told from an empty array).
fn is_lua_array(v: &Value) -> bool {
    match v {
        Value::Array(_) => true,
        Value::Object(m) => m.is_empty(),
        _ => false,
    }
}

/// A JSON value seen as a Lua table: arrays become objects keyed `"1"`, `"2"`, ...
fn as_table(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        Value::Array(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| ((i + 1).to_string(), item))
            .collect(),
        _ => Map::new(),
    }
}

/// Merges `patch` into `origin` key by key: `null` removes, an object merges into an object,
/// anything else (arrays, scalars, `{}`, objects over non-objects) replaces.
pub fn merge(origin: &mut Map<String, Value>, patch: Map<String, Value>) {
    for (key, value) in patch {
        match value {
            Value::Null => {
                origin.shift_remove(&key);
            }
            Value::Object(_) | Value::Array(_) => {
                let both_tables = origin
                    .get(&key)
                    .is_some_and(|o| matches!(o, Value::Object(_) | Value::Array(_)));
                if both_tables && !is_lua_array(&origin[&key]) && !is_lua_array(&value) {
                    if let (Some(Value::Object(inner)), Value::Object(value)) =
                        (origin.get_mut(&key), value)
                    {
                        merge(inner, value);
                    }
                } else {
                    // Replaced wholesale, nulls inside included (Lua assigns the table as is).
                    origin.insert(key, value);
                }
            }
            scalar => {
                origin.insert(key, scalar);
            }
        }
    }
}

/// The body of a whole-object PATCH as a Lua table (an array body patches keys `"1"`, ...).
pub fn patch_table(body: Value) -> Map<String, Value> {
    as_table(body)
}

/// Replaces the value at `sub_path` (`a/b/c`) in `node`, creating missing objects on the way.
/// The error is APISIX's `invalid sub-path: /...` text, including its garbling: the segments
/// from the failing one on are joined with `1` (`table.concat` is called with `1` as the
/// separator).
pub fn patch_path(node: &mut Value, sub_path: &[String], value: Value) -> Result<(), String> {
    let Some((last, parents)) = sub_path.split_last() else {
        *node = value;
        return Ok(());
    };
    let mut current = node;
    for (i, name) in parents.iter().enumerate() {
        let table = tableize(current);
        let next = table
            .entry(name.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if !matches!(next, Value::Object(_) | Value::Array(_)) {
            return Err(format!("invalid sub-path: /{}", sub_path[i..].join("1")));
        }
        current = next;
    }
    if !matches!(current, Value::Object(_) | Value::Array(_)) {
        return Err(format!("invalid sub-path: /{}", sub_path.join("/")));
    }
    tableize(current).insert(last.clone(), value);
    Ok(())
}

/// Makes `v` an object in place (an array is re-keyed `"1"`, `"2"`, ... as Lua would index it
/// with string keys).
fn tableize(v: &mut Value) -> &mut Map<String, Value> {
    if !v.is_object() {
        let taken = std::mem::take(v);
        *v = Value::Object(as_table(taken));
    }
    match v {
        Value::Object(m) => m,
        _ => unreachable!("just made an object"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn merged(origin: Value, patch: Value) -> Value {
        let mut o = as_table(origin);
        merge(&mut o, as_table(patch));
        Value::Object(o)
    }

    #[test]
    fn merge_rules() {
        let origin = json!({
            "uri": "/a", "desc": "d", "methods": ["GET", "POST"],
            "upstream": {"type": "roundrobin", "nodes": {"a:1": 1, "b:1": 1}},
            "plugins": {"p": {"x": 1}}, "labels": {}
        });
        let out = merged(
            origin,
            json!({
                "desc": null, "methods": ["PUT"],
                "upstream": {"nodes": {"b:1": null, "c:1": 2}},
                "plugins": {}, "labels": {"k": "v"}, "status": 0
            }),
        );
        assert_eq!(
            out,
            json!({
                "uri": "/a", "methods": ["PUT"],
                "upstream": {"type": "roundrobin", "nodes": {"a:1": 1, "c:1": 2}},
                "plugins": {}, "labels": {"k": "v"}, "status": 0
            })
        );
    }

    #[test]
    fn replaced_objects_keep_their_nulls() {
        let out = merged(json!({"a": 1}), json!({"o": {"x": null}}));
        assert_eq!(out, json!({"a": 1, "o": {"x": null}}));
    }

    #[test]
    fn sub_path() {
        let mut v = json!({"uri": "/a", "upstream": {"nodes": {"a:1": 1}}});
        patch_path(
            &mut v,
            &["upstream".into(), "nodes".into()],
            json!({"b:1": 2}),
        )
        .unwrap();
        assert_eq!(v["upstream"]["nodes"], json!({"b:1": 2}));
        patch_path(&mut v, &["x".into(), "y".into()], json!(1)).unwrap();
        assert_eq!(v["x"], json!({"y": 1}));
        let e = patch_path(&mut v, &["uri".into(), "a".into(), "b".into()], json!(1)).unwrap_err();
        assert_eq!(e, "invalid sub-path: /uri1a1b");
    }
}
