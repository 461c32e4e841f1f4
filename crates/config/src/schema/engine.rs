//! A JSON-Schema validator that behaves like the api7 `jsonschema` Lua library APISIX uses:
//! same keywords, same check order, same first-error-wins messages, and the same Lua view of
//! JSON values (an empty `{}` and an empty `[]` are one and the same empty table).
//!
//! Like the Lua library it also writes the `default` of every absent property into the value
//! it checks. That matters beyond the defaults themselves: later checks (other branches of an
//! `anyOf`, APISIX's own checks after the schema) see the filled-in value.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, LazyLock, Mutex};

use regex::bytes::{Regex, RegexBuilder};
use serde_json::{Map, Value};

use super::lua;

/// Nesting limit, so a self-referencing `$ref` fails instead of overflowing the stack.
const MAX_DEPTH: usize = 256;

/// Checks `value` against `schema`; the error is api7's message (what APISIX puts after
/// `invalid configuration: `). The value is not modified.
pub fn validate(schema: &Value, value: &Value) -> Result<(), String> {
    let mut copy = value.clone();
    validate_and_fill(schema, &mut copy)
}

/// Like [`validate`], but writes schema defaults into `value` as APISIX's validator does (also
/// when validation fails part-way, and also from `anyOf`/`oneOf` branches that did not match).
pub fn validate_and_fill(schema: &Value, value: &mut Value) -> Result<(), String> {
    Engine {
        root: schema,
        quiet: false,
    }
    .check(schema, value, 0)
}

/// How Lua sees a decoded JSON table (api7's `tablekind`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum TableKind {
    /// A non-empty object.
    Hash,
    /// `{}` or `[]`: Lua cannot tell them apart.
    Empty,
    /// A non-empty array.
    Array,
}

fn table_kind(v: &Value) -> Option<TableKind> {
    match v {
        Value::Object(m) if m.is_empty() => Some(TableKind::Empty),
        Value::Object(_) => Some(TableKind::Hash),
        Value::Array(a) if a.is_empty() => Some(TableKind::Empty),
        Value::Array(_) => Some(TableKind::Array),
        _ => None,
    }
}

fn is_objectish(v: &Value) -> bool {
    matches!(table_kind(v), Some(TableKind::Hash | TableKind::Empty))
}

fn is_arrayish(v: &Value) -> bool {
    matches!(table_kind(v), Some(TableKind::Array | TableKind::Empty))
}

/// Maps up to this size are searched member by member: comparing a few short keys is cheaper
/// than hashing the key (SipHash), and most objects a schema sees are that small.
const LINEAR_LOOKUP: usize = 8;

fn get<'v>(v: &'v Value, key: &str) -> Option<&'v Value> {
    match v {
        Value::Object(m) if m.len() <= LINEAR_LOOKUP => {
            m.iter().find(|(k, _)| k.as_str() == key).map(|(_, v)| v)
        }
        Value::Object(m) => m.get(key),
        _ => None,
    }
}

fn get_mut<'v>(v: &'v mut Value, key: &str) -> Option<&'v mut Value> {
    match v {
        Value::Object(m) => {
            if m.len() <= LINEAR_LOOKUP {
                m.iter_mut()
                    .find(|(k, _)| k.as_str() == key)
                    .map(|(_, v)| v)
            } else {
                m.get_mut(key)
            }
        }
        _ => None,
    }
}

fn num(v: &Value) -> Option<f64> {
    v.as_f64()
}

/// The bounds `[min, max]` (keywords of `s`) on an object's properties or an array's items:
/// "expect <kind> to have at least (at most) <n> <unit>" when `count` is outside them.
fn check_count(
    [min, max]: [Option<&Value>; 2],
    count: usize,
    kind: &str,
    unit: &str,
) -> Result<(), String> {
    if let Some(min) = min.and_then(num) {
        if (count as f64) < min {
            return Err(format!(
                "expect {kind} to have at least {} {unit}",
                lua::number(min)
            ));
        }
    }
    if let Some(max) = max.and_then(num) {
        if (count as f64) > max {
            return Err(format!(
                "expect {kind} to have at most {} {unit}",
                lua::number(max)
            ));
        }
    }
    Ok(())
}

/// A boolean `items` or `propertyNames` ends the schema's validation: `true` passes, `false`
/// passes an empty table only. `None` when the keyword is absent or not a boolean.
fn boolean_ends(keyword: Option<&Value>, v: &Value) -> Option<Result<(), String>> {
    match keyword? {
        Value::Bool(true) => Some(Ok(())),
        Value::Bool(false) if table_kind(v) == Some(TableKind::Empty) => Some(Ok(())),
        Value::Bool(false) => Some(Err("expect false always".to_string())),
        _ => None,
    }
}

/// Lua's `==` between two non-table values.
fn lua_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::String(x), Value::String(y)) => x == y,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Null, Value::Null) => true,
        _ => false,
    }
}

/// api7's `deepeq`: tables are equal when they have the same keys (array positions are integer
/// keys, object members string keys) with deep-equal values.
fn deep_eq(a: &Value, b: &Value) -> bool {
    match (table_kind(a), table_kind(b)) {
        (None, None) => lua_eq(a, b),
        (Some(_), Some(_)) => match (a, b) {
            _ if table_kind(a) == Some(TableKind::Empty)
                || table_kind(b) == Some(TableKind::Empty) =>
            {
                table_kind(a) == table_kind(b)
            }
            (Value::Array(x), Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| deep_eq(p, q))
            }
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len()
                    && x.iter()
                        .all(|(k, p)| y.get(k).is_some_and(|q| deep_eq(p, q)))
            }
            _ => false,
        },
        _ => false,
    }
}

/// api7's `unique_item_in_array`: scalars are compared while scanning (first duplicate wins),
/// tables pairwise afterwards. Returns the 1-based positions of the first equal pair.
fn duplicate_items(items: &[Value]) -> Option<(usize, usize)> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut tables: Vec<usize> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let pos = i + 1;
        let key = match item {
            Value::Array(_) | Value::Object(_) => {
                tables.push(pos);
                continue;
            }
            Value::Null => "u".to_string(),
            Value::Bool(b) => format!("b{b}"),
            Value::String(s) => format!("s{s}"),
            Value::Number(n) => {
                // Lua table keys: 0 and -0 are one key, every other number by value.
                let x = n.as_f64().unwrap_or(f64::NAN);
                let x = if x == 0.0 { 0.0 } else { x };
                format!("n{}", x.to_bits())
            }
        };
        if let Some(first) = seen.get(&key) {
            return Some((*first, pos));
        }
        seen.insert(key, pos);
    }
    for (a, &i) in tables.iter().enumerate() {
        for &j in &tables[a + 1..] {
            if deep_eq(&items[i - 1], &items[j - 1]) {
                return Some((i, j));
            }
        }
    }
    None
}

static REGEX_CACHE: LazyLock<Mutex<HashMap<String, Option<Arc<Regex>>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

thread_local! {
    /// This thread's view of [`REGEX_CACHE`]: a boot validates on every core, and every
    /// pattern search taking one lock made the threads wait on each other.
    static LOCAL_REGEXES: std::cell::RefCell<HashMap<String, Option<Arc<Regex>>>> =
        std::cell::RefCell::new(HashMap::new());
}

/// Compiles a schema pattern once. `ngx.re.find` without the `u` flag runs PCRE on bytes, so the
/// pattern is compiled for bytes with Unicode classes off (ASCII `\d`, `\s`, `.` = one byte);
/// patterns that need Unicode mode to compile (non-ASCII class members) fall back to it.
fn compiled(pattern: &str) -> Option<Arc<Regex>> {
    if let Some(r) = LOCAL_REGEXES.with(|local| local.borrow().get(pattern).cloned()) {
        return r;
    }
    let r = {
        let mut cache = REGEX_CACHE.lock().unwrap_or_else(|e| e.into_inner());
        match cache.get(pattern) {
            Some(r) => r.clone(),
            None => {
                let r = RegexBuilder::new(pattern)
                    .unicode(false)
                    .build()
                    .or_else(|_| RegexBuilder::new(pattern).build())
                    .ok()
                    .map(Arc::new);
                cache.insert(pattern.to_string(), r.clone());
                r
            }
        }
    };
    LOCAL_REGEXES.with(|local| {
        local.borrow_mut().insert(pattern.to_string(), r.clone());
    });
    r
}

/// `ngx.re.find(subject, pattern, "jo")` as a boolean: an unanchored search. A pattern that does
/// not compile matches nothing (ngx returns an error, which the validator reads as no match).
pub fn pattern_search(pattern: &str, subject: &str) -> bool {
    compiled(pattern).is_some_and(|r| r.is_match(subject.as_bytes()))
}

/// APISIX's secret references (`$secret://...`, `$env://...`) skip validation of fields whose
/// schema accepts strings: they are resolved at run time.
fn is_secret_ref(v: &Value, schema_type: Option<&Value>) -> bool {
    let Value::String(s) = v else { return false };
    if !s.starts_with('$') {
        return false;
    }
    if let Some(t) = schema_type {
        if t != "string" {
            return false;
        }
    }
    s.starts_with("$secret://") || s.to_ascii_uppercase().starts_with("$ENV://")
}

fn format_ok(format: &str, s: &str) -> Option<bool> {
    static OTHER: LazyLock<HashMap<&'static str, Regex>> = LazyLock::new(|| {
        let defs: [(&str, &str); 6] = [
            (
                "email",
                r"^[A-Za-z0-9_.\-]+@[A-Za-z0-9_.\-]+\.[A-Za-z]{2,4}$",
            ),
            ("hostname", r"^[a-zA-Z0-9.\-]+$"),
            (
                "uuid",
                r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
            ),
            ("date", r"^\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])$"),
            (
                "date-time",
                r"^\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])[Tt](?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d+)?(?:[Zz]|[+-](?:[01]\d|2[0-3]):[0-5]\d)$",
            ),
            ("uri", r"^[a-zA-Z][a-zA-Z0-9+.\-]*:\S*$"),
        ];
        defs.into_iter()
            .filter_map(|(k, p)| {
                RegexBuilder::new(p)
                    .unicode(false)
                    .build()
                    .ok()
                    .map(|r| (k, r))
            })
            .collect()
    });
    match format {
        // Under OpenResty the library checks these two with inet_pton.
        "ipv4" => Some(s.parse::<Ipv4Addr>().is_ok()),
        "ipv6" => Some(s.parse::<Ipv6Addr>().is_ok()),
        other => OTHER.get(other).map(|r| r.is_match(s.as_bytes())),
    }
}

/// The keywords of one schema object, gathered in one pass over its members: the checks ask
/// for some thirty keywords per schema node, and a hashed lookup of each (serde_json's maps
/// hash with SipHash) was most of the time a boot with 100,000 routes spent validating.
#[derive(Default)]
struct Keywords<'s> {
    ref_: Option<&'s Value>,
    type_: Option<&'s Value>,
    properties: Option<&'s Value>,
    additional_properties: Option<&'s Value>,
    pattern_properties: Option<&'s Value>,
    min_properties: Option<&'s Value>,
    max_properties: Option<&'s Value>,
    dependencies: Option<&'s Value>,
    required: Option<&'s Value>,
    items: Option<&'s Value>,
    min_items: Option<&'s Value>,
    max_items: Option<&'s Value>,
    unique_items: Option<&'s Value>,
    additional_items: Option<&'s Value>,
    min_length: Option<&'s Value>,
    max_length: Option<&'s Value>,
    pattern: Option<&'s Value>,
    minimum: Option<&'s Value>,
    exclusive_minimum: Option<&'s Value>,
    maximum: Option<&'s Value>,
    exclusive_maximum: Option<&'s Value>,
    multiple_of: Option<&'s Value>,
    enum_: Option<&'s Value>,
    all_of: Option<&'s Value>,
    any_of: Option<&'s Value>,
    one_of: Option<&'s Value>,
    if_: Option<&'s Value>,
    then: Option<&'s Value>,
    else_: Option<&'s Value>,
    not: Option<&'s Value>,
    property_names: Option<&'s Value>,
    format: Option<&'s Value>,
    const_: Option<&'s Value>,
    contains: Option<&'s Value>,
}

impl<'s> Keywords<'s> {
    fn of(s: &'s Map<String, Value>) -> Keywords<'s> {
        let mut k = Keywords::default();
        for (name, value) in s {
            let slot = match name.as_str() {
                "$ref" => &mut k.ref_,
                "type" => &mut k.type_,
                "properties" => &mut k.properties,
                "additionalProperties" => &mut k.additional_properties,
                "patternProperties" => &mut k.pattern_properties,
                "minProperties" => &mut k.min_properties,
                "maxProperties" => &mut k.max_properties,
                "dependencies" => &mut k.dependencies,
                "required" => &mut k.required,
                "items" => &mut k.items,
                "minItems" => &mut k.min_items,
                "maxItems" => &mut k.max_items,
                "uniqueItems" => &mut k.unique_items,
                "additionalItems" => &mut k.additional_items,
                "minLength" => &mut k.min_length,
                "maxLength" => &mut k.max_length,
                "pattern" => &mut k.pattern,
                "minimum" => &mut k.minimum,
                "exclusiveMinimum" => &mut k.exclusive_minimum,
                "maximum" => &mut k.maximum,
                "exclusiveMaximum" => &mut k.exclusive_maximum,
                "multipleOf" => &mut k.multiple_of,
                "enum" => &mut k.enum_,
                "allOf" => &mut k.all_of,
                "anyOf" => &mut k.any_of,
                "oneOf" => &mut k.one_of,
                "if" => &mut k.if_,
                "then" => &mut k.then,
                "else" => &mut k.else_,
                "not" => &mut k.not,
                "propertyNames" => &mut k.property_names,
                "format" => &mut k.format,
                "const" => &mut k.const_,
                "contains" => &mut k.contains,
                _ => continue,
            };
            *slot = Some(value);
        }
        k
    }

    /// Any keyword that applies to objects.
    fn has_object_keywords(&self) -> bool {
        self.properties.is_some()
            || self.additional_properties.is_some()
            || self.pattern_properties.is_some()
            || self.min_properties.is_some()
            || self.max_properties.is_some()
            || self.dependencies.is_some()
            || self.required.is_some()
    }

    /// Any keyword that applies to arrays.
    fn has_array_keywords(&self) -> bool {
        self.items.is_some()
            || self.min_items.is_some()
            || self.max_items.is_some()
            || self.unique_items.is_some()
    }
}

struct Engine<'s> {
    root: &'s Value,
    /// See [`Engine::quiet`].
    quiet: bool,
}

impl<'s> Engine<'s> {
    /// This engine for a check whose error is not reported (a branch of `anyOf`, `oneOf`,
    /// `if`, `not`): its messages are not built. Defaults are still written.
    fn quiet(&self) -> Engine<'s> {
        Engine {
            root: self.root,
            quiet: true,
        }
    }

    /// An error message, built only when it may be reported: most branches of `anyOf` and
    /// `oneOf` fail by design, and formatting their messages was a tenth of validating a
    /// route.
    fn fail(&self, message: impl FnOnce() -> String) -> String {
        if self.quiet {
            String::new()
        } else {
            message()
        }
    }

    fn resolve(&self, reference: &str) -> Result<&'s Value, String> {
        let pointer = reference
            .strip_prefix('#')
            .ok_or_else(|| self.fail(|| format!("failed to resolve reference {reference}")))?;
        if pointer.is_empty() {
            return Ok(self.root);
        }
        self.root
            .pointer(pointer)
            .ok_or_else(|| self.fail(|| format!("failed to resolve reference {reference}")))
    }

    fn check(&self, schema: &'s Value, v: &mut Value, depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(self.fail(|| "schema nesting too deep".to_string()));
        }
        let s = match schema {
            Value::Bool(true) => return Ok(()),
            Value::Bool(false) => return Err(self.fail(|| "expect false always".to_string())),
            Value::Object(s) => Keywords::of(s),
            _ => return Ok(()),
        };
        let k = &s;
        if let Some(Value::String(r)) = k.ref_ {
            let target = self.resolve(r)?;
            return self.check(target, v, depth + 1);
        }
        if is_secret_ref(v, k.type_) {
            return Ok(());
        }
        let d = depth + 1;

        self.check_type(k, v)?;

        if k.has_object_keywords() {
            if is_objectish(v) {
                self.check_object(k, v, d)?;
            }
            // `required: []` means "must be an empty table".
            if let Some(Value::Array(req)) = k.required {
                if req.is_empty() && table_kind(v) != Some(TableKind::Empty) {
                    return Err(self.fail(|| "the input data should be an empty table".to_string()));
                }
            }
        }

        if k.has_array_keywords() {
            // Boolean `items` ends validation of this schema outright, as the library does.
            if let Some(end) = boolean_ends(k.items, v) {
                return end;
            }
            if is_arrayish(v) {
                self.check_array(k, v, d)?;
            }
        }

        if let Value::String(text) = &*v {
            check_string(k, text)?;
        }
        if let Value::Number(n) = &*v {
            check_number(k, n.as_f64().unwrap_or(f64::NAN))?;
        }

        if let Some(Value::Array(values)) = k.enum_ {
            let hit = values.iter().any(|e| match e {
                Value::Array(_) | Value::Object(_) => deep_eq(v, e),
                Value::Null => false,
                _ => lua_eq(v, e),
            });
            if !hit {
                return Err(self.fail(|| "matches none of the enum values".to_string()));
            }
        }

        if let Some(Value::Array(subs)) = k.all_of {
            for (i, sub) in subs.iter().enumerate() {
                self.check(sub, v, d)
                    .map_err(|e| self.fail(|| format!("allOf {} failed: {e}", i + 1)))?;
            }
        }

        if let Some(Value::Array(subs)) = k.any_of {
            let mut matched = false;
            for sub in subs {
                if self.quiet().check(sub, v, d).is_ok() {
                    matched = true;
                    break;
                }
            }
            if !matched {
                // Built only when reported (`anyOf` branches of a quiet check fail by design).
                return Err(self.fail(|| {
                    let requires: Vec<String> = subs
                        .iter()
                        .filter_map(|sub| get(sub, "required"))
                        .map(lua::cjson_encode)
                        .collect();
                    if requires.is_empty() {
                        "object matches none of the required".to_string()
                    } else {
                        format!(
                            "object matches none of the required: {}",
                            requires.join(" or ")
                        )
                    }
                }));
            }
        }

        if let Some(Value::Array(subs)) = k.one_of {
            let mut matched: Option<usize> = None;
            for (i, sub) in subs.iter().enumerate() {
                if self.quiet().check(sub, v, d).is_ok() {
                    if let Some(first) = matched {
                        return Err(self.fail(|| format!(
                            "value should match only one schema, but matches both schemas {first} and {}",
                            i + 1
                        )));
                    }
                    matched = Some(i + 1);
                }
            }
            if matched.is_none() {
                return Err(self
                    .fail(|| "value should match only one schema, but matches none".to_string()));
            }
        }

        if let Some(cond) = k.if_ {
            let ok = self.quiet().check(cond, v, d).is_ok();
            if ok {
                if let Some(then) = k.then {
                    if self.quiet().check(then, v, d).is_err() {
                        return Err(self.fail(|| "then clause did not match".to_string()));
                    }
                }
            } else if let Some(otherwise) = k.else_ {
                if self.quiet().check(otherwise, v, d).is_err() {
                    return Err(self.fail(|| "else clause did not match".to_string()));
                }
            }
        }

        if let Some(not) = k.not {
            if self.quiet().check(not, v, d).is_ok() {
                return Err(self.fail(|| "value wasn't supposed to match schema".to_string()));
            }
        }

        // Only the boolean forms of `propertyNames` are implemented by the library, and both end
        // validation early.
        if let Some(end) = boolean_ends(k.property_names, v) {
            return end;
        }

        if let (Some(Value::String(format)), Value::String(text)) = (k.format, &*v) {
            if format_ok(format, text) == Some(false) {
                return Err(self.fail(|| format!("expect valid {format} format but got: {text}")));
            }
        }

        if let Some(c) = k.const_ {
            if !deep_eq(v, c) {
                return Err(self.fail(|| "failed to check const value".to_string()));
            }
        }

        match k.contains {
            None => {}
            Some(Value::Bool(true)) => {
                return if table_kind(v) == Some(TableKind::Array) {
                    Ok(())
                } else {
                    Err(self.fail(|| "check contains: expect array table".to_string()))
                };
            }
            Some(Value::Bool(false)) => {
                return if table_kind(v).is_none() {
                    Ok(())
                } else {
                    Err(self.fail(|| "check contains: expect table".to_string()))
                };
            }
            Some(sub) => {
                if table_kind(v) == Some(TableKind::Empty) {
                    return Err(self.fail(|| "check contains: empty array is invalid".to_string()));
                }
                if let Value::Array(items) = v {
                    let n = items.len();
                    let mut misses = 0;
                    for item in items.iter_mut() {
                        if self.check(sub, item, d).is_err() {
                            misses += 1;
                        }
                    }
                    if n > 0 && misses == n {
                        return Err(self.fail(|| "failed to check contains".to_string()));
                    }
                }
            }
        }

        Ok(())
    }

    fn check_type(&self, k: &Keywords<'s>, v: &Value) -> Result<(), String> {
        match k.type_ {
            None => Ok(()),
            Some(Value::String(t)) => {
                if type_matches(t, v)? {
                    Ok(())
                } else {
                    Err(self
                        .fail(|| format!("wrong type: expected {t}, got {}", lua::type_name(v))))
                }
            }
            Some(Value::Array(types)) => {
                let mut names = Vec::with_capacity(types.len());
                let mut hit = false;
                for t in types {
                    let t = t.as_str().ok_or_else(|| "invalid JSON type".to_string())?;
                    hit |= type_matches(t, v)?;
                    names.push(t);
                }
                if hit {
                    Ok(())
                } else {
                    Err(self.fail(|| {
                        format!(
                            "wrong type: expected one of {}, got {}",
                            names.join(", "),
                            lua::type_name(v)
                        )
                    }))
                }
            }
            Some(other) => {
                Err(self.fail(|| format!("invalid \"type\" type: got {}", lua::type_name(other))))
            }
        }
    }

    fn check_object(&self, k: &Keywords<'s>, v: &mut Value, d: usize) -> Result<(), String> {
        let props = k.properties.and_then(Value::as_object);
        let deps = k.dependencies.and_then(Value::as_object);
        let required: Vec<&str> = k
            .required
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        // Which of `required` the properties' loop has seen (a few names: no hashing).
        let mut required_done = vec![false; required.len()];

        if let Some(props) = props {
            for (name, sub) in props {
                let present = match get_mut(v, name) {
                    Some(pv) => {
                        self.check(sub, pv, d).map_err(|e| {
                            self.fail(|| format!("property \"{name}\" validation failed: {e}"))
                        })?;
                        true
                    }
                    None => false,
                };
                if present {
                    if let Some(dep) = deps.and_then(|m| m.get(name)) {
                        self.check_dependency(name, dep, v, d)?;
                    }
                }
                if let Some(i) = required.iter().position(|r| *r == name.as_str()) {
                    if !present {
                        return Err(self.fail(|| format!("property \"{name}\" is required")));
                    }
                    required_done[i] = true;
                }
                if !present {
                    if let Some(default) = get(sub, "default") {
                        if !default.is_null() {
                            insert(v, name, default.clone());
                        }
                    }
                }
            }
        }

        for (name, done) in required.iter().zip(required_done) {
            if !done && get(v, name).is_none() {
                return Err(self.fail(|| format!("property \"{name}\" is required")));
            }
        }

        if let Some(deps) = deps {
            for (name, dep) in deps {
                if props.is_some_and(|p| p.contains_key(name)) {
                    continue;
                }
                if get(v, name).is_some() {
                    self.check_dependency(name, dep, v, d)?;
                }
            }
        }

        let additional = k.additional_properties;
        let restricted = matches!(additional, Some(a) if a != &Value::Bool(true));
        let patterns = k.pattern_properties.and_then(Value::as_object);
        if restricted || patterns.is_some() {
            // Only the keys a pattern or `additionalProperties` applies to are copied (their
            // values are checked mutably); a declared property needs nothing here.
            let keys: Vec<String> = v
                .as_object()
                .map(|m| {
                    m.keys()
                        .filter(|key| {
                            patterns.is_some_and(|ps| ps.keys().any(|p| pattern_search(p, key)))
                                || (restricted && !props.is_some_and(|p| p.contains_key(*key)))
                        })
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            for key in keys {
                let mut matched = false;
                if let Some(patterns) = patterns {
                    for (pattern, sub) in patterns {
                        if pattern_search(pattern, &key) {
                            if let Some(pv) = get_mut(v, &key) {
                                self.check(sub, pv, d).map_err(|e| {
                                    self.fail(|| {
                                        format!(
                                        "failed to validate {key} (matching \"{pattern}\"): {e}"
                                    )
                                    })
                                })?;
                            }
                            matched = true;
                        }
                    }
                }
                let declared = props.is_some_and(|p| p.contains_key(&key));
                if restricted && !declared && !matched {
                    match additional {
                        Some(sub @ Value::Object(_)) => {
                            if let Some(pv) = get_mut(v, &key) {
                                self.check(sub, pv, d).map_err(|e| {
                                    self.fail(|| {
                                        format!("failed to validate additional property {key}: {e}")
                                    })
                                })?;
                            }
                        }
                        _ => {
                            return Err(self
                                .fail(|| format!("additional properties forbidden, found {key}")))
                        }
                    }
                }
            }
        }

        let count = v.as_object().map_or(0, Map::len);
        check_count(
            [k.min_properties, k.max_properties],
            count,
            "object",
            "properties",
        )
    }

    fn check_dependency(
        &self,
        name: &str,
        dep: &'s Value,
        v: &mut Value,
        d: usize,
    ) -> Result<(), String> {
        match dep {
            Value::Array(list) if !list.is_empty() => {
                for other in list.iter().filter_map(Value::as_str) {
                    if get(v, other).is_none() {
                        return Err(self.fail(|| {
                            format!("property \"{other}\" is required when \"{name}\" is set")
                        }));
                    }
                }
                Ok(())
            }
            schema => self.check(schema, v, d).map_err(|e| {
                self.fail(|| format!("failed to validate dependent schema for \"{name}\": {e}"))
            }),
        }
    }

    fn check_array(&self, k: &Keywords<'s>, v: &mut Value, d: usize) -> Result<(), String> {
        let len = v.as_array().map_or(0, Vec::len);
        check_count([k.min_items, k.max_items], len, "array", "items")?;
        if let Value::Array(items) = v {
            match k.items {
                Some(Value::Array(tuple)) if !tuple.is_empty() => {
                    let mut complete = true;
                    for (i, sub) in tuple.iter().enumerate() {
                        let Some(item) = items.get_mut(i) else {
                            complete = false;
                            break;
                        };
                        self.check(sub, item, d).map_err(|e| {
                            self.fail(|| format!("failed to validate item {}: {e}", i + 1))
                        })?;
                    }
                    if complete {
                        match k.additional_items {
                            Some(Value::Bool(false)) if items.len() > tuple.len() => {
                                return Err(self
                                    .fail(|| "found unexpected extra items in array".to_string()));
                            }
                            Some(sub @ Value::Object(_)) => {
                                for (i, item) in items.iter_mut().enumerate().skip(tuple.len()) {
                                    self.check(sub, item, d).map_err(|e| {
                                        self.fail(|| {
                                            format!(
                                                "failed to validate additional item {}: {e}",
                                                i + 1
                                            )
                                        })
                                    })?;
                                }
                            }
                            _ => {}
                        }
                    }
                }
                Some(sub) => {
                    for (i, item) in items.iter_mut().enumerate() {
                        self.check(sub, item, d).map_err(|e| {
                            self.fail(|| format!("failed to validate item {}: {e}", i + 1))
                        })?;
                    }
                }
                None => {}
            }
            if k.unique_items
                .is_some_and(|u| !matches!(u, Value::Bool(false) | Value::Null))
            {
                if let Some((i, j)) = duplicate_items(items) {
                    return Err(self.fail(|| {
                        format!("expected unique items but items {i} and {j} are equal")
                    }));
                }
            }
        }
        Ok(())
    }
}

fn insert(v: &mut Value, key: &str, value: Value) {
    // Lua stores the default into the table even when it was decoded from `[]`.
    if matches!(v, Value::Array(a) if a.is_empty()) {
        *v = Value::Object(Map::new());
    }
    if let Value::Object(m) = v {
        m.insert(key.to_string(), value);
    }
}

fn type_matches(t: &str, v: &Value) -> Result<bool, String> {
    Ok(match t {
        "object" => is_objectish(v),
        "array" => is_arrayish(v),
        "table" => table_kind(v).is_some(),
        "integer" => v.as_f64().is_some_and(|x| x % 1.0 == 0.0),
        "number" => v.is_number(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "function" => false,
        other => return Err(format!("invalid JSON type: {other}")),
    })
}

fn check_string(k: &Keywords<'_>, text: &str) -> Result<(), String> {
    let needs_len = k.min_length.is_some() || k.max_length.is_some();
    let len = if needs_len { text.chars().count() } else { 0 };
    if let Some(min) = k.min_length.and_then(num) {
        if (len as f64) < min {
            return Err(format!(
                "string too short, expected at least {}, got {len}",
                min as i64
            ));
        }
    }
    if let Some(max) = k.max_length.and_then(num) {
        if (len as f64) > max {
            return Err(format!(
                "string too long, expected at most {}, got {len}",
                max as i64
            ));
        }
    }
    if let Some(Value::String(p)) = k.pattern {
        if !pattern_search(p, text) {
            return Err(format!(
                "failed to match pattern {} with {}",
                lua::quote(p),
                lua::quote(text)
            ));
        }
    }
    Ok(())
}

fn check_number(k: &Keywords<'_>, x: f64) -> Result<(), String> {
    let fail = |what: &str, b: f64| {
        Err(format!(
            "expected {} to be {what} {}",
            lua::number(x),
            lua::number(b)
        ))
    };
    if let Some(b) = k.minimum.and_then(num) {
        if x < b {
            return fail("at least", b);
        }
    }
    if let Some(b) = k.exclusive_minimum.and_then(num) {
        if x <= b {
            return fail("greater than", b);
        }
    }
    if let Some(b) = k.maximum.and_then(num) {
        if x > b {
            return fail("at most", b);
        }
    }
    if let Some(b) = k.exclusive_maximum.and_then(num) {
        if x >= b {
            return fail("smaller than", b);
        }
    }
    if let Some(m) = k.multiple_of.and_then(num) {
        let off = if m.fract() == 0.0 {
            // Lua's floored modulo.
            x - (x / m).floor() * m != 0.0
        } else {
            // Relative tolerance, so 1.13 is a multiple of 0.01.
            let q = x / m;
            let rounded = (q + 0.5).floor();
            let tol = 1e-12 * if rounded == 0.0 { 1.0 } else { rounded.abs() };
            (q - rounded).abs() > tol
        };
        if off {
            return Err(format!(
                "expected {} to be a multiple of {}",
                lua::number(x),
                lua::number(m)
            ));
        }
    }
    Ok(())
}
