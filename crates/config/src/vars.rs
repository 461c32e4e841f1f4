//! Turns a lua-resty-expr (v1) JSON rule list — a route's `vars`, a plugin's `_meta.filter` —
//! into the router's [`Expr`], refusing what lua-resty-expr refuses with its words.
//!
//! The parse follows lua-resty-expr's `new`/`compile` step by step, including its quirks: the
//! two-element form `[var, value]` compares with the *lower-cased* value (the library lower-cases
//! the second element before it knows it is a value), a five-element rule silently ignores its
//! tail, and a JSON object counts as an empty list. Where the Lua library would crash on a
//! malformed rule (a boolean where an operator belongs) the rule is refused as
//! `invalid expression` instead.

use std::net::{Ipv4Addr, Ipv6Addr};

use ferrisix_router::{CmpOp, Expr, ExprValue};
use serde_json::Value;

use crate::schema::lua;

/// The prefix APISIX puts before every expression error.
const PREFIX: &str = "failed to validate the 'vars' expression: ";

/// Compiles a rule list. The error is APISIX's full message, e.g.
/// `failed to validate the 'vars' expression: invalid operator '='`.
pub fn compile_vars(v: &Value) -> Result<Expr, String> {
    new_rule(v).map_err(|e| format!("{PREFIX}{e}"))
}

/// The route-only check APISIX runs after compiling `vars`: every `post_arg.<json path>`
/// variable must hold a JSON path its jsonpath library can parse. Same message prefix.
pub fn check_post_arg_paths(v: &Value) -> Result<(), String> {
    post_arg_paths(v).map_err(|e| format!("{PREFIX}{e}"))
}

const LOGIC_OPS: [&str; 4] = ["AND", "OR", "!AND", "!OR"];

/// The elements Lua's `ipairs` would walk, or `None` for a value that is not a table.
fn as_list(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(a) => Some(a),
        Value::Object(_) => Some(&[]),
        _ => None,
    }
}

/// `string.upper`/`string.lower` accept strings and numbers (a number is converted first).
fn lua_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(lua::json_number(n)),
        _ => None,
    }
}

fn new_rule(rule: &Value) -> Result<Expr, String> {
    let Some(items) = as_list(rule) else {
        return Err("rule should be wrapped inside brackets".to_string());
    };
    if items.is_empty() {
        return Ok(Expr::And(Vec::new()));
    }
    if !is_table(&items[0]) {
        let wrapped_logic = lua_string(&items[0])
            .is_some_and(|s| LOGIC_OPS.contains(&s.to_ascii_uppercase().as_str()));
        if !wrapped_logic {
            return Err("rule should be wrapped inside brackets".to_string());
        }
    }
    compile(rule)
}

fn is_table(v: &Value) -> bool {
    matches!(v, Value::Array(_) | Value::Object(_))
}

fn compile(rules: &Value) -> Result<Expr, String> {
    let items = match rules {
        Value::Array(a) => a.as_slice(),
        Value::Object(_) => &[],
        // The Lua library raises on these; refuse them instead.
        Value::String(s) if s.is_empty() => return Err("rule too short".to_string()),
        _ => return Err("invalid expression".to_string()),
    };
    if items.is_empty() {
        return Err("rule too short".to_string());
    }
    if is_table(&items[0]) {
        return items
            .iter()
            .map(compile)
            .collect::<Result<Vec<_>, _>>()
            .map(Expr::And);
    }
    let head = lua_string(&items[0]).ok_or_else(|| "invalid expression".to_string())?;
    let logic = head.to_ascii_uppercase();
    if LOGIC_OPS.contains(&logic.as_str()) {
        if items.len() <= 2 {
            return Err("rule too short".to_string());
        }
        let subs = items[1..]
            .iter()
            .map(compile)
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(match logic.as_str() {
            "AND" => Expr::And(subs),
            "OR" => Expr::Or(subs),
            "!AND" => Expr::Not(Box::new(Expr::And(subs))),
            _ => Expr::Not(Box::new(Expr::Or(subs))),
        });
    }
    compile_expr(items)
}

fn is_compare_op(op: &str) -> bool {
    matches!(
        op,
        "==" | "~=" | ">" | ">=" | "<" | "<=" | "~~" | "~*" | "in" | "has" | "ipmatch"
    )
}

fn compile_expr(expr: &[Value]) -> Result<Expr, String> {
    let (var, op, value, negate) = if expr.len() == 4 {
        if expr[1] != Value::String("!".to_string()) {
            return Err("bad 'not' expression".to_string());
        }
        (&expr[0], expr.get(2), expr.get(3), true)
    } else {
        (&expr[0], expr.get(1), expr.get(2), false)
    };

    let op = match op {
        None => None,
        Some(v) => Some(
            lua_string(v)
                .ok_or_else(|| "invalid expression".to_string())?
                .to_ascii_lowercase(),
        ),
    };

    // `[var, value]`: the (already lower-cased) second element becomes the value of `==`.
    let (op, value) = match (op, value) {
        (Some(op), None) if !is_compare_op(&op) => ("==".to_string(), Some(Value::String(op))),
        (None, None) => return Err("invalid expression".to_string()),
        (Some(op), value) => (op, value.cloned()),
        (None, Some(_)) => return Err("invalid expression".to_string()),
    };

    if !is_compare_op(&op) {
        return Err(format!("invalid operator '{op}'"));
    }
    let var = lua_string(var).ok_or_else(|| "invalid expression".to_string())?;
    let cmp = CmpOp::parse(&op).ok_or_else(|| format!("invalid operator '{op}'"))?;

    let value = if cmp == CmpOp::IpMatch {
        ip_list(value.as_ref())?
    } else {
        value.as_ref().map_or(ExprValue::Null, expr_value)
    };
    Expr::compare(var, cmp, value, negate)
}

fn expr_value(v: &Value) -> ExprValue {
    match v {
        Value::Null => ExprValue::Null,
        Value::Bool(b) => ExprValue::Bool(*b),
        Value::Number(n) => ExprValue::Num(n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => ExprValue::Str(s.clone()),
        Value::Array(a) => ExprValue::List(a.iter().map(expr_value).collect()),
        // A Lua hash table has no array part: `in` finds nothing in it, `==` never holds.
        Value::Object(_) => ExprValue::List(Vec::new()),
    }
}

/// `ipmatch`'s right side as resty.ipmatcher reads it: one address or a list, each an IPv4 or
/// IPv6 address (brackets allowed) with an optional `/mask`. A mask that is not a number is
/// ignored by ipmatcher (the whole address is matched), so it is dropped here too.
fn ip_list(value: Option<&Value>) -> Result<ExprValue, String> {
    let items: Vec<&Value> = match value {
        None => return Err("invalid ip address".to_string()),
        Some(Value::String(s)) if s.is_empty() => return Err("invalid ip address".to_string()),
        Some(Value::Array(a)) => a.iter().collect(),
        Some(Value::Object(_)) => Vec::new(),
        Some(single) => vec![single],
    };
    if items.is_empty() {
        return Err("invalid ip address".to_string());
    }
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let text = lua_string(item).unwrap_or_else(|| lua::cjson_encode(item));
        let (addr, mask) = match text.split_once('/') {
            Some((a, m)) => (a.to_string(), lua::tonumber(m)),
            None => (text.clone(), None),
        };
        let bare = addr
            .strip_prefix('[')
            .and_then(|a| a.strip_suffix(']'))
            .unwrap_or(&addr);
        let valid = addr.parse::<Ipv4Addr>().is_ok() || bare.parse::<Ipv6Addr>().is_ok();
        if !valid {
            return Err(format!("invalid ip address: {addr}"));
        }
        let ip = if addr.parse::<Ipv4Addr>().is_ok() {
            addr.as_str()
        } else {
            bare
        };
        out.push(ExprValue::Str(match mask {
            Some(m) => format!("{ip}/{}", lua::number(m)),
            None => ip.to_string(),
        }));
    }
    Ok(ExprValue::List(out))
}

fn post_arg_paths(node: &Value) -> Result<(), String> {
    let Value::Array(items) = node else {
        return Ok(());
    };
    if items.len() >= 3 {
        if let Some(Value::String(key)) = items.first() {
            if key.starts_with("post_arg.") {
                // APISIX takes the text from the 11th byte on, one past the end of
                // `post_arg.`; the first character of the path is dropped along with it.
                let rest = key.get(10..).unwrap_or("");
                return jsonpath::check(&format!("$.{rest}"));
            }
        }
    }
    items.iter().try_for_each(post_arg_paths)
}

/// A syntax check of JSON paths as lua-jsonpath's grammar reads them, reporting where parsing
/// stopped the way that library does.
mod jsonpath {
    pub fn check(expr: &str) -> Result<(), String> {
        let mut p = Parser {
            s: expr.as_bytes(),
            pos: 0,
        };
        p.spaces();
        if !p.path() {
            return Err(format!("invalid expression \"{expr}\""));
        }
        p.spaces();
        if p.pos != p.s.len() {
            return Err(format!(
                "invalid expression \"{expr}\" near \"{}\"",
                &expr[p.pos..]
            ));
        }
        Ok(())
    }

    struct Parser<'a> {
        s: &'a [u8],
        pos: usize,
    }

    impl Parser<'_> {
        fn peek(&self) -> Option<u8> {
            self.s.get(self.pos).copied()
        }

        fn eat(&mut self, lit: &str) -> bool {
            if self.s[self.pos..].starts_with(lit.as_bytes()) {
                self.pos += lit.len();
                true
            } else {
                false
            }
        }

        fn spaces(&mut self) {
            while matches!(self.peek(), Some(b' ' | b'\t' | b'\n')) {
                self.pos += 1;
            }
        }

        /// Runs `f`, rewinding when it fails (PEG ordered choice).
        fn attempt(&mut self, f: impl FnOnce(&mut Self) -> bool) -> bool {
            let start = self.pos;
            if f(self) {
                true
            } else {
                self.pos = start;
                false
            }
        }

        fn path(&mut self) -> bool {
            let first = self
                .attempt(|p| p.eat("$") && (p.eat("..") || p.eat(".")) && p.child_name())
                || self.attempt(|p| p.eat("$") && p.subscript())
                || self.eat("$")
                || self.attempt(|p| p.subscript() || p.child_name());
            if !first {
                return false;
            }
            loop {
                let more = self.attempt(|p| (p.eat("..") || p.eat(".")) && p.child_name())
                    || self.attempt(|p| p.eat("..") && p.subscript())
                    || self.attempt(|p| p.subscript());
                if !more {
                    return true;
                }
            }
        }

        fn child_name(&mut self) -> bool {
            let ok = self.index() || self.name() || self.eat("*");
            if ok {
                self.spaces();
            }
            ok
        }

        fn index(&mut self) -> bool {
            self.attempt(|p| {
                if matches!(p.peek(), Some(b'+' | b'-')) {
                    p.pos += 1;
                }
                let start = p.pos;
                while p.peek().is_some_and(|c| c.is_ascii_digit()) {
                    p.pos += 1;
                }
                let ok = p.pos > start;
                if ok {
                    p.spaces();
                }
                ok
            })
        }

        fn name(&mut self) -> bool {
            if !self
                .peek()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
            {
                return false;
            }
            while self
                .peek()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_')
            {
                self.pos += 1;
            }
            true
        }

        fn subscript(&mut self) -> bool {
            self.attempt(|p| p.eat("[") && p.subscript_expr() && p.eat("]"))
        }

        fn subscript_expr(&mut self) -> bool {
            self.eat("*")
                || self.attempt(|p| p.union_item() && p.more_union_items())
                || self.attempt(|p| p.eat("(") && p.balanced(b')'))
                || self.attempt(|p| p.slice())
                || self.attempt(|p| {
                    p.eat("?") && {
                        p.spaces();
                        p.eat("(") && p.balanced(b')')
                    }
                })
        }

        fn more_union_items(&mut self) -> bool {
            loop {
                let more = self.attempt(|p| {
                    p.eat(",") && {
                        p.spaces();
                        p.union_item()
                    }
                });
                if !more {
                    return true;
                }
            }
        }

        fn union_item(&mut self) -> bool {
            self.attempt(|p| p.slice()) || self.string() || self.index()
        }

        fn slice(&mut self) -> bool {
            self.index();
            if !self.eat(":") {
                return false;
            }
            self.spaces();
            self.index();
            self.attempt(|p| {
                p.eat(":") && {
                    p.spaces();
                    p.index()
                }
            });
            true
        }

        fn string(&mut self) -> bool {
            let Some(q @ (b'\'' | b'"')) = self.peek() else {
                return false;
            };
            self.attempt(|p| {
                p.pos += 1;
                while let Some(c) = p.peek() {
                    p.pos += 1;
                    if c == b'\\' {
                        p.pos += 1;
                    } else if c == q {
                        p.spaces();
                        return true;
                    }
                }
                false
            })
        }

        /// Skips to the closing bracket, honouring nesting and quoted strings.
        fn balanced(&mut self, close: u8) -> bool {
            let mut depth = 1usize;
            while let Some(c) = self.peek() {
                match c {
                    b'\'' | b'"' => {
                        if !self.string() {
                            return false;
                        }
                        continue;
                    }
                    b'(' => depth += 1,
                    c if c == close => {
                        depth -= 1;
                        if depth == 0 {
                            self.pos += 1;
                            self.spaces();
                            return true;
                        }
                    }
                    _ => {}
                }
                self.pos += 1;
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrisix_router::VarSource;
    use serde_json::json;
    use std::borrow::Cow;
    use std::collections::HashMap;

    fn err(v: Value) -> String {
        compile_vars(&v).unwrap_err()
    }

    struct Vars(HashMap<&'static str, &'static str>);

    impl VarSource for Vars {
        fn var(&self, name: &str) -> Option<Cow<'_, str>> {
            self.0.get(name).map(|v| Cow::Borrowed(*v))
        }
    }

    fn eval(rule: Value, vars: &[(&'static str, &'static str)]) -> bool {
        compile_vars(&rule)
            .unwrap()
            .eval(&Vars(vars.iter().copied().collect()))
    }

    #[test]
    fn unwrapped_rule_is_refused() {
        assert_eq!(
            err(json!(["arg_x", "==", "1"])),
            "failed to validate the 'vars' expression: rule should be wrapped inside brackets"
        );
        assert_eq!(
            err(json!([1, 2])),
            "failed to validate the 'vars' expression: rule should be wrapped inside brackets"
        );
    }

    #[test]
    fn operator_errors() {
        assert_eq!(
            err(json!([["arg_x", "=", "1"]])),
            "failed to validate the 'vars' expression: invalid operator '='"
        );
        assert_eq!(
            err(json!([["arg_x", "*=", "1"]])),
            "failed to validate the 'vars' expression: invalid operator '*='"
        );
        assert_eq!(
            err(json!([["arg_x", 123, "1"]])),
            "failed to validate the 'vars' expression: invalid operator '123'"
        );
        // The operator is lower-cased before the lookup and in the message.
        assert_eq!(
            err(json!([["arg_x", "EQ", "1"]])),
            "failed to validate the 'vars' expression: invalid operator 'eq'"
        );
        assert!(compile_vars(&json!([["arg_x", "IN", ["a"]]])).is_ok());
    }

    #[test]
    fn shape_errors() {
        assert_eq!(
            err(json!([[]])),
            "failed to validate the 'vars' expression: rule too short"
        );
        assert_eq!(
            err(json!(["AND", ["a", "==", "1"]])),
            "failed to validate the 'vars' expression: rule too short"
        );
        assert_eq!(
            err(json!([["OR"]])),
            "failed to validate the 'vars' expression: rule too short"
        );
        assert_eq!(
            err(json!([["arg_x"]])),
            "failed to validate the 'vars' expression: invalid expression"
        );
        assert_eq!(
            err(json!([["arg_x", "=", "!", "1"]])),
            "failed to validate the 'vars' expression: bad 'not' expression"
        );
        assert_eq!(
            err(json!([["arg_x", true, "1"]])),
            "failed to validate the 'vars' expression: invalid expression"
        );
    }

    #[test]
    fn ipmatch_errors() {
        assert_eq!(
            err(json!([["remote_addr", "ipmatch", ""]])),
            "failed to validate the 'vars' expression: invalid ip address"
        );
        assert_eq!(
            err(json!([["remote_addr", "ipmatch", []]])),
            "failed to validate the 'vars' expression: invalid ip address"
        );
        assert_eq!(
            err(json!([["remote_addr", "ipmatch"]])),
            "failed to validate the 'vars' expression: invalid ip address"
        );
        assert_eq!(
            err(json!([[
                "remote_addr",
                "ipmatch",
                ["127.0.0.1", "300.0.0.1/8"]
            ]])),
            "failed to validate the 'vars' expression: invalid ip address: 300.0.0.1"
        );
        assert!(compile_vars(&json!([["remote_addr", "ipmatch", "::1"]])).is_ok());
        assert!(eval(
            json!([["remote_addr", "ipmatch", ["10.0.0.0/8"]]]),
            &[("remote_addr", "10.1.2.3")]
        ));
        assert!(!eval(
            json!([["remote_addr", "ipmatch", ["10.0.0.0/8"]]]),
            &[("remote_addr", "11.1.2.3")]
        ));
    }

    #[test]
    fn empty_rule_matches_everything() {
        assert!(eval(json!([]), &[]));
        assert!(eval(json!({}), &[]));
    }

    #[test]
    fn forms_and_semantics() {
        let rule = json!([["arg_name", "==", "json"], ["arg_age", ">", 18]]);
        assert!(eval(
            rule.clone(),
            &[("arg_name", "json"), ("arg_age", "20")]
        ));
        assert!(!eval(rule, &[("arg_name", "json"), ("arg_age", "9")]));

        // `[var, value]` compares with the lower-cased value.
        assert!(eval(json!([["arg_x", "ABC"]]), &[("arg_x", "abc")]));
        assert!(!eval(json!([["arg_x", "ABC"]]), &[("arg_x", "ABC")]));

        // Negation.
        assert!(eval(json!([["arg_x", "!", "==", "a"]]), &[("arg_x", "b")]));
        assert!(!eval(json!([["arg_x", "!", "==", "a"]]), &[("arg_x", "a")]));

        // Logic operators and nesting.
        let or = json!(["OR", ["arg_a", "==", "1"], ["arg_b", "==", "1"]]);
        assert!(eval(or.clone(), &[("arg_b", "1")]));
        assert!(!eval(or, &[]));
        let not_and = json!([["!AND", ["arg_a", "==", "1"], ["arg_b", "==", "1"]]]);
        assert!(eval(not_and.clone(), &[("arg_a", "1")]));
        assert!(!eval(not_and, &[("arg_a", "1"), ("arg_b", "1")]));
        assert!(eval(json!([[["arg_a", "==", "1"]]]), &[("arg_a", "1")]));

        // `null` means "absent"; the `==` with no value does too.
        assert!(eval(json!([["http_x", "==", null]]), &[]));
        assert!(eval(json!([["http_x", "=="]]), &[]));
        assert!(!eval(json!([["http_x", "==", null]]), &[("http_x", "1")]));

        // A five-element rule ignores its tail.
        assert!(eval(
            json!([["arg_x", "==", "1", "x", "y"]]),
            &[("arg_x", "1")]
        ));

        // in / regex.
        assert!(eval(
            json!([["arg_x", "in", ["a", "b"]]]),
            &[("arg_x", "b")]
        ));
        assert!(eval(json!([["uri", "~~", "^/a"]]), &[("uri", "/abc")]));
        assert!(eval(json!([["uri", "~*", "^/A"]]), &[("uri", "/abc")]));
    }

    #[test]
    fn post_arg_paths_are_checked() {
        assert!(check_post_arg_paths(&json!([["post_arg.model", "==", "x"]])).is_ok());
        assert!(
            check_post_arg_paths(&json!([["post_arg.messages[*].content", "has", "x"]])).is_ok()
        );
        assert!(check_post_arg_paths(&json!([["post_arg.a.b[0]", "==", "x"]])).is_ok());
        let e = check_post_arg_paths(&json!([[[
            "post_arg.messages[.content[*].type",
            "has",
            "image_url"
        ]]]))
        .unwrap_err();
        assert!(
            e.starts_with("failed to validate the 'vars' expression: invalid expression"),
            "{e}"
        );
        assert!(check_post_arg_paths(&json!(null)).is_ok());
    }
}
