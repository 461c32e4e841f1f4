//! JSON and request arguments to protobuf messages and back, as APISIX's grpc-transcode does
//! with lua-protobuf (`grpc-transcode/util.lua`'s `map_message`, `pb.encode`, `pb.decode` and
//! `core.json.encode`), by reflection over the proto's descriptors.
//!
//! Request side: each field of the input message takes the argument of its name; a message
//! field takes an object (recursively), a repeated field a list, a map field an object. As
//! Lua coerces them, numeric strings are numbers and numbers are strings where the field wants
//! one; booleans are Lua's truth (anything but `false` and `null` is true, so `?b=false` is
//! true as in APISIX); enums take their name or number. What cannot be encoded is an error
//! (APISIX answers 400).
//!
//! Response side: `pb_option` decides enum names or numbers, 64-bit integers as numbers or, out
//! of `[-2^31, 2^32)`, as `"#<decimal>"` / `"#0x<HEX>"` strings (lua-protobuf's forms), and
//! whether absent fields appear with their default values (proto3 under
//! `auto_default_values`, any syntax under `use_default_values`): scalars and enums with their
//! default, repeated fields as `[]`, maps as `{}`; message fields and oneof members stay out.
//! Large 64-bit numbers are written exactly (APISIX's cjson writes 14 significant digits).

use std::collections::HashMap;

use prost_reflect::{
    DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor, ReflectMessage, Syntax,
    Value as Pb,
};
use serde_json::{Map, Number, Value};

/// How 64-bit integers are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int64As {
    Number,
    String,
    HexString,
}

/// Whether absent fields are written with their defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Defaults {
    /// proto3: with defaults; others: without.
    Auto,
    /// Absent fields are left out (`no_default_values`, and `use_default_metatable`, whose
    /// defaults live in a metatable JSON encoding does not see).
    Without,
    With,
}

/// The decoding options of `pb_option`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    pub enum_as_name: bool,
    pub int64: Int64As,
    pub defaults: Defaults,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            enum_as_name: true,
            int64: Int64As::Number,
            defaults: Defaults::Auto,
        }
    }
}

impl Options {
    /// The options of `pb_option`, applied in order (a later one of a kind wins, as
    /// lua-protobuf's `pb.option` calls). `enable_hooks`/`disable_hooks` change nothing here:
    /// hooks are Lua functions, which ferrisix has none of.
    pub fn of(list: &[String]) -> Options {
        let mut o = Options::default();
        for opt in list {
            match opt.as_str() {
                "enum_as_name" => o.enum_as_name = true,
                "enum_as_value" => o.enum_as_name = false,
                "int64_as_number" => o.int64 = Int64As::Number,
                "int64_as_string" => o.int64 = Int64As::String,
                "int64_as_hexstring" => o.int64 = Int64As::HexString,
                "auto_default_values" => o.defaults = Defaults::Auto,
                "no_default_values" | "use_default_metatable" => o.defaults = Defaults::Without,
                "use_default_values" => o.defaults = Defaults::With,
                _ => {}
            }
        }
        o
    }
}

/// A number as Lua's `tonumber` reads it from a string (decimal or `0x` hex), or a JSON number.
fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => {
            let t = s.trim();
            if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                return i64::from_str_radix(hex, 16).ok().map(|n| n as f64);
            }
            t.parse::<f64>().ok()
        }
        _ => None,
    }
}

/// An integer: a JSON integer, a numeric string with an integral value, or lua-protobuf's
/// `#<n>` string form.
fn integer(v: &Value) -> Result<i128, String> {
    if let Value::Number(n) = v {
        if let Some(i) = n.as_i64() {
            return Ok(i.into());
        }
        if let Some(u) = n.as_u64() {
            return Ok(u.into());
        }
    }
    if let Value::String(s) = v {
        let t = s.trim().trim_start_matches('#');
        if let Ok(i) = t.parse::<i128>() {
            return Ok(i);
        }
    }
    match number(v) {
        Some(f) if f.fract() == 0.0 && f.is_finite() => Ok(f as i128),
        _ => Err(format!("integer expected, got {v}")),
    }
}

fn scalar(kind: &Kind, v: &Value) -> Result<Pb, String> {
    let int = |lo: i128, hi: i128| {
        let i = integer(v)?;
        if i < lo || i > hi {
            return Err(format!("integer out of range: {i}"));
        }
        Ok(i)
    };
    Ok(match kind {
        Kind::Double => Pb::F64(number(v).ok_or_else(|| format!("number expected, got {v}"))?),
        Kind::Float => {
            Pb::F32(number(v).ok_or_else(|| format!("number expected, got {v}"))? as f32)
        }
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
            Pb::I32(int(i32::MIN.into(), u32::MAX.into())? as i32)
        }
        Kind::Uint32 | Kind::Fixed32 => Pb::U32(int(i32::MIN.into(), u32::MAX.into())? as u32),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => {
            Pb::I64(int(i64::MIN.into(), u64::MAX.into())? as i64)
        }
        Kind::Uint64 | Kind::Fixed64 => Pb::U64(int(i64::MIN.into(), u64::MAX.into())? as u64),
        Kind::Bool => Pb::Bool(!matches!(v, Value::Null | Value::Bool(false))),
        Kind::String => Pb::String(text(v)?),
        Kind::Bytes => Pb::Bytes(text(v)?.into_bytes().into()),
        Kind::Enum(e) => {
            if let Value::String(name) = v {
                if let Some(value) = e.get_value_by_name(name) {
                    return Ok(Pb::EnumNumber(value.number()));
                }
            }
            match v {
                Value::Number(_) | Value::String(_) => {
                    let n = integer(v).map_err(|_| format!("unknown enum value {v}"))?;
                    Pb::EnumNumber(
                        i32::try_from(n).map_err(|_| format!("enum value out of range: {n}"))?,
                    )
                }
                _ => return Err(format!("unknown enum value {v}")),
            }
        }
        Kind::Message(m) => Pb::Message(message(m, v)?),
    })
}

/// A string field's value: strings, and numbers as Lua turns them into strings.
fn text(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        other => Err(format!("string expected, got {other}")),
    }
}

fn map_key(kind: &Kind, key: &str) -> Result<MapKey, String> {
    let v = Value::String(key.to_owned());
    Ok(match scalar(kind, &v)? {
        Pb::Bool(b) => MapKey::Bool(key != "false" && b),
        Pb::I32(i) => MapKey::I32(i),
        Pb::I64(i) => MapKey::I64(i),
        Pb::U32(u) => MapKey::U32(u),
        Pb::U64(u) => MapKey::U64(u),
        Pb::String(s) => MapKey::String(s),
        _ => return Err(format!("bad map key {key}")),
    })
}

fn field_value(field: &FieldDescriptor, v: &Value) -> Result<Pb, String> {
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            return Err("map without an entry type".into());
        };
        let Value::Object(obj) = v else {
            return Err(format!("table expected for field {}", field.name()));
        };
        let key_kind = entry.map_entry_key_field().kind();
        let value_kind = entry.map_entry_value_field().kind();
        let mut out = HashMap::with_capacity(obj.len());
        for (k, item) in obj {
            out.insert(map_key(&key_kind, k)?, scalar(&value_kind, item)?);
        }
        return Ok(Pb::Map(out));
    }
    if field.is_list() {
        let Value::Array(items) = v else {
            return Err(format!("table expected for field {}", field.name()));
        };
        let kind = field.kind();
        return items
            .iter()
            .map(|item| scalar(&kind, item))
            .collect::<Result<Vec<_>, _>>()
            .map(Pb::List);
    }
    scalar(&field.kind(), v)
}

/// The message `desc` from `table` (a JSON object; a request's arguments made into one).
pub fn message(desc: &MessageDescriptor, table: &Value) -> Result<DynamicMessage, String> {
    let Value::Object(obj) = table else {
        return Err(format!(
            "table expected for {}, got {table}",
            desc.full_name()
        ));
    };
    let mut msg = DynamicMessage::new(desc.clone());
    for field in desc.fields() {
        let Some(v) = obj.get(field.name()) else {
            continue;
        };
        if v.is_null() {
            continue;
        }
        let value = field_value(&field, v).map_err(|e| format!("{}: {e}", field.name()))?;
        msg.try_set_field(&field, value)
            .map_err(|e| format!("{}: {e}", field.name()))?;
    }
    Ok(msg)
}

/// lua-protobuf's 64-bit integer in `mode`: a number within `[-2^31, 2^32)`, else `#`-strings.
fn int64(n: i128, mode: Int64As) -> Value {
    if mode == Int64As::Number || (i128::from(i32::MIN)..=i128::from(u32::MAX)).contains(&n) {
        return if n < 0 {
            Value::from(n as i64)
        } else {
            Value::from(n as u64)
        };
    }
    let abs = n.unsigned_abs();
    let digits = match mode {
        Int64As::HexString => format!("0x{abs:X}"),
        _ => abs.to_string(),
    };
    Value::String(format!("#{}{digits}", if n < 0 { "-" } else { "" }))
}

fn float(f: f64) -> Value {
    Number::from_f64(f).map_or(Value::Null, Value::Number)
}

fn to_json(v: &Pb, kind: &Kind, o: Options) -> Value {
    match v {
        Pb::Bool(b) => Value::Bool(*b),
        Pb::I32(i) => Value::from(*i),
        Pb::U32(u) => Value::from(*u),
        Pb::I64(i) => int64((*i).into(), o.int64),
        Pb::U64(u) => int64((*u).into(), o.int64),
        Pb::F32(f) => float(f64::from(*f)),
        Pb::F64(f) => float(*f),
        Pb::String(s) => Value::String(s.clone()),
        Pb::Bytes(b) => Value::String(String::from_utf8_lossy(b).into_owned()),
        Pb::EnumNumber(n) => match kind {
            Kind::Enum(e) if o.enum_as_name => e
                .get_value(*n)
                .map_or(Value::from(*n), |v| Value::String(v.name().to_owned())),
            _ => Value::from(*n),
        },
        Pb::Message(m) => message_json(m, o),
        Pb::List(items) => Value::Array(items.iter().map(|i| to_json(i, kind, o)).collect()),
        Pb::Map(entries) => {
            let value_kind = match kind {
                Kind::Message(entry) => entry.map_entry_value_field().kind(),
                other => other.clone(),
            };
            let mut keys: Vec<&MapKey> = entries.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (key_text(k), to_json(&entries[k], &value_kind, o)))
                    .collect(),
            )
        }
    }
}

fn key_text(k: &MapKey) -> String {
    match k {
        MapKey::Bool(b) => b.to_string(),
        MapKey::I32(i) => i.to_string(),
        MapKey::I64(i) => i.to_string(),
        MapKey::U32(u) => u.to_string(),
        MapKey::U64(u) => u.to_string(),
        MapKey::String(s) => s.clone(),
    }
}

/// The decoded message as APISIX's answer writes it.
pub fn message_json(msg: &DynamicMessage, o: Options) -> Value {
    let desc = msg.descriptor();
    let with_defaults = match o.defaults {
        Defaults::With => true,
        Defaults::Without => false,
        Defaults::Auto => desc.parent_file().syntax() == Syntax::Proto3,
    };
    let mut out = Map::new();
    for field in desc.fields() {
        let kind = field.kind();
        if msg.has_field(&field) {
            out.insert(
                field.name().to_owned(),
                to_json(&msg.get_field(&field), &kind, o),
            );
            continue;
        }
        if !with_defaults || field.containing_oneof().is_some() {
            continue;
        }
        let v = if field.is_map() {
            Value::Object(Map::new())
        } else if field.is_list() {
            Value::Array(Vec::new())
        } else if matches!(kind, Kind::Message(_)) {
            continue;
        } else {
            to_json(&field.default_value(), &kind, o)
        };
        out.insert(field.name().to_owned(), v);
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap as Map2;
    use std::sync::Arc;

    use prost::Message;
    use serde_json::json;

    use super::*;

    const PROTO: &str = r#"syntax = "proto3";
package t;
enum Gender { GENDER_UNKNOWN = 0; GENDER_MALE = 1; GENDER_FEMALE = 2; }
message Person { string name = 1; int32 age = 2; }
message Req {
  string name = 1;
  repeated string items = 2;
  Gender gender = 3;
  Person person = 4;
  int64 big = 5;
  bool flag = 6;
  map<string, int32> counts = 7;
  double ratio = 8;
  uint64 ubig = 9;
}"#;

    fn desc() -> MessageDescriptor {
        let pool = ferrisix_config::proto::compile("t", PROTO, &Arc::new(Map2::new())).unwrap();
        pool.get_message_by_name("t.Req").unwrap()
    }

    fn round(table: Value, o: Options) -> Value {
        let d = desc();
        let m = message(&d, &table).unwrap();
        let bytes = m.encode_to_vec();
        message_json(&DynamicMessage::decode(d, bytes.as_slice()).unwrap(), o)
    }

    #[test]
    fn defaults_enums_and_coercions() {
        let o = Options::default();
        let got = round(
            json!({"name": "w", "person": {"name": "Joe", "age": "3"},
            "gender": 2, "big": "7", "flag": "false", "ratio": "0.5"}),
            o,
        );
        assert_eq!(
            got,
            json!({"name": "w", "items": [], "gender": "GENDER_FEMALE",
                "person": {"name": "Joe", "age": 3}, "big": 7, "flag": true,
                "counts": {}, "ratio": 0.5, "ubig": 0})
        );
        let o = Options::of(&["enum_as_value".into(), "no_default_values".into()]);
        let got = round(
            json!({"name": "w", "gender": "GENDER_MALE", "items": ["a"]}),
            o,
        );
        assert_eq!(got, json!({"name": "w", "items": ["a"], "gender": 1}));
        let o = Options::of(&["use_default_metatable".into()]);
        assert_eq!(round(json!({}), o), json!({}));
        assert!(message(&desc(), &json!({"gender": "GENDER_MA"})).is_err());
        assert!(message(&desc(), &json!({"person": "x"})).is_err());
        assert!(message(&desc(), &json!({"items": "x"})).is_err());
        assert!(message(&desc(), &json!({"big": "x"})).is_err());
    }

    #[test]
    fn int64_forms() {
        let no = |s: &str| Options {
            int64: match s {
                "s" => Int64As::String,
                "h" => Int64As::HexString,
                _ => Int64As::Number,
            },
            defaults: Defaults::Without,
            enum_as_name: true,
        };
        let big = json!({"big": 2251799813685261_i64, "ubig": "18446744073709551615"});
        assert_eq!(
            round(big.clone(), no("s")),
            json!({"big": "#2251799813685261", "ubig": "#18446744073709551615"})
        );
        assert_eq!(
            round(big.clone(), no("h")),
            json!({"big": "#0x800000000000D", "ubig": "#0xFFFFFFFFFFFFFFFF"})
        );
        assert_eq!(
            round(big, no("n")),
            json!({"big": 2251799813685261_i64, "ubig": 18446744073709551615_u64})
        );
        assert_eq!(round(json!({"big": -5}), no("s")), json!({"big": -5}));
        assert_eq!(
            round(json!({"big": "-4294967296"}), no("s")),
            json!({"big": "#-4294967296"})
        );
    }

    #[test]
    fn maps_and_options() {
        let o = Options::of(&["no_default_values".into()]);
        assert_eq!(
            round(json!({"counts": {"b": 2, "a": "1"}}), o),
            json!({"counts": {"a": 1, "b": 2}})
        );
        assert_eq!(
            Options::of(&["int64_as_string".into(), "enum_as_name".into()]),
            Options {
                int64: Int64As::String,
                ..Options::default()
            }
        );
    }
}
