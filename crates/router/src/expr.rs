//! `vars` expressions with lua-resty-expr v1 semantics.
//!
//! APISIX evaluates a route's `vars` with lua-resty-expr, whose comparisons follow Lua's loose
//! typing: variables are strings (or absent), JSON numbers on the right make `==`/`~=` convert the
//! left side with `tonumber`, ordering operators convert both sides and are false when either is
//! not a number, and JSON `null` stands for "variable absent". Reproducing those rules — rather
//! than "sensible" typed comparisons — is what keeps a route matching the same requests here as in
//! APISIX. Regexes and CIDRs are compiled once when the expression is built so that evaluation
//! never fails and never allocates beyond what the variable source itself does.
//!
//! The JSON shape (`[var, op, value]`, `[var, "!", op, value]`, `["AND", ...]` ...) is parsed by
//! the configuration layer; this module only receives the resulting tree.

use std::borrow::Cow;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use regex::{Regex, RegexBuilder};

/// Where expression variables come from (the request, in practice).
pub trait VarSource {
    /// Value of a variable (`uri`, `host`, `http_x_foo`, `arg_a`, `cookie_c`, `remote_addr`, ...), None when absent.
    fn var(&self, name: &str) -> Option<Cow<'_, str>>;
}

/// A source with no variables at all; handy for routes without `vars` and for tests.
impl VarSource for () {
    fn var(&self, _name: &str) -> Option<Cow<'_, str>> {
        None
    }
}

/// Comparison operators of lua-resty-expr v1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
    Regex,
    RegexI,
    In,
    Has,
    IpMatch,
}

impl CmpOp {
    /// Parses an operator. lua-resty-expr lower-cases the operator before looking it up, so the
    /// word operators are accepted in any case (`IN`, `IPMATCH`).
    pub fn parse(op: &str) -> Option<CmpOp> {
        Some(match op {
            "==" => CmpOp::Eq,
            "~=" => CmpOp::Ne,
            ">" => CmpOp::Gt,
            ">=" => CmpOp::Ge,
            "<" => CmpOp::Lt,
            "<=" => CmpOp::Le,
            "~~" => CmpOp::Regex,
            "~*" => CmpOp::RegexI,
            _ if op.eq_ignore_ascii_case("in") => CmpOp::In,
            _ if op.eq_ignore_ascii_case("has") => CmpOp::Has,
            _ if op.eq_ignore_ascii_case("ipmatch") => CmpOp::IpMatch,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CmpOp::Eq => "==",
            CmpOp::Ne => "~=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Regex => "~~",
            CmpOp::RegexI => "~*",
            CmpOp::In => "in",
            CmpOp::Has => "has",
            CmpOp::IpMatch => "ipmatch",
        }
    }
}

impl fmt::Display for CmpOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The right-hand side of a comparison, as JSON gave it.
#[derive(Clone, Debug, PartialEq)]
pub enum ExprValue {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    List(Vec<ExprValue>),
}

/// A compiled `vars` expression.
#[derive(Clone, Debug)]
pub enum Expr {
    And(Vec<Expr>),
    Or(Vec<Expr>),
    /// For "!AND" / "!OR".
    Not(Box<Expr>),
    Compare(Comparison),
}

/// One `[var, op, value]` (or negated `[var, "!", op, value]`) comparison.
#[derive(Clone, Debug)]
pub struct Comparison {
    var: Box<str>,
    op: CmpOp,
    value: ExprValue,
    negate: bool,
    compiled: Compiled,
}

/// Work done once at build time so evaluation is a plain test.
#[derive(Clone, Debug)]
enum Compiled {
    None,
    /// `tonumber` of the right side, for the ordering operators.
    Number(Option<f64>),
    Regex(Regex),
    Nets(Box<[IpNet]>),
}

impl Comparison {
    pub fn var(&self) -> &str {
        &self.var
    }

    pub fn op(&self) -> CmpOp {
        self.op
    }

    pub fn value(&self) -> &ExprValue {
        &self.value
    }

    pub fn negate(&self) -> bool {
        self.negate
    }

    fn eval(&self, vars: &dyn VarSource) -> bool {
        let left = vars.var(&self.var);
        self.test(left.as_deref()) != self.negate
    }

    /// The un-negated comparison, following lua-resty-expr's `compare_funcs` case by case.
    fn test(&self, left: Option<&str>) -> bool {
        match self.op {
            CmpOp::Eq => match &self.value {
                // `null` on the right is Lua `nil`: equal only to an absent variable.
                ExprValue::Null => left.is_none(),
                ExprValue::Num(n) => left.and_then(lua_tonumber) == Some(*n),
                ExprValue::Str(s) => left == Some(s.as_str()),
                // A Lua string never equals a boolean or a table.
                ExprValue::Bool(_) | ExprValue::List(_) => false,
            },
            CmpOp::Ne => match &self.value {
                ExprValue::Null => left.is_some(),
                // A left side that is not a number is "not equal" to any number.
                ExprValue::Num(n) => left.and_then(lua_tonumber) != Some(*n),
                ExprValue::Str(s) => left != Some(s.as_str()),
                ExprValue::Bool(_) | ExprValue::List(_) => true,
            },
            CmpOp::Gt | CmpOp::Ge | CmpOp::Lt | CmpOp::Le => {
                let Compiled::Number(Some(r)) = self.compiled else {
                    return false;
                };
                let Some(l) = left.and_then(lua_tonumber) else {
                    return false;
                };
                match self.op {
                    CmpOp::Gt => l > r,
                    CmpOp::Ge => l >= r,
                    CmpOp::Lt => l < r,
                    _ => l <= r,
                }
            }
            CmpOp::Regex | CmpOp::RegexI => match (&self.compiled, left) {
                (Compiled::Regex(re), Some(l)) => re.is_match(l),
                _ => false,
            },
            CmpOp::In => match (&self.value, left) {
                // Lua `==` between a string and a number is false, so only string elements count.
                (ExprValue::List(items), Some(l)) => items
                    .iter()
                    .any(|v| matches!(v, ExprValue::Str(s) if s == l)),
                _ => false,
            },
            // `has` wants the left side to be an array; variables here are always strings.
            CmpOp::Has => false,
            CmpOp::IpMatch => match (&self.compiled, left) {
                (Compiled::Nets(nets), Some(l)) => match l.parse::<IpAddr>() {
                    Ok(ip) => nets.iter().any(|n| n.contains(&ip)),
                    Err(_) => false,
                },
                _ => false,
            },
        }
    }
}

impl Expr {
    /// Builds a comparison; compiles regexes (`~~`, `~*`) and CIDRs (`ipmatch`, value a string or list of strings) up front.
    /// Errors are human-readable (e.g. "failed to compile regex ...", "invalid ip address: ...").
    pub fn compare(
        var: impl Into<String>,
        op: CmpOp,
        value: ExprValue,
        negate: bool,
    ) -> Result<Expr, String> {
        let compiled = match op {
            CmpOp::Gt | CmpOp::Ge | CmpOp::Lt | CmpOp::Le => Compiled::Number(match &value {
                ExprValue::Num(n) => Some(*n),
                ExprValue::Str(s) => lua_tonumber(s),
                _ => None,
            }),
            CmpOp::Regex | CmpOp::RegexI => {
                // ngx.re.find coerces a number pattern to its string form; anything else would
                // raise at request time in APISIX, so it is refused here instead.
                let pattern = match &value {
                    ExprValue::Str(s) => Cow::Borrowed(s.as_str()),
                    ExprValue::Num(n) => Cow::Owned(lua_number_to_string(*n)),
                    other => return Err(format!("invalid regex: {other:?} is not a string")),
                };
                let re = RegexBuilder::new(&pattern)
                    .case_insensitive(op == CmpOp::RegexI)
                    .build()
                    .map_err(|e| format!("failed to compile regex {pattern:?}: {e}"))?;
                Compiled::Regex(re)
            }
            CmpOp::IpMatch => Compiled::Nets(compile_nets(&value)?),
            CmpOp::Eq | CmpOp::Ne | CmpOp::In | CmpOp::Has => Compiled::None,
        };
        Ok(Expr::Compare(Comparison {
            var: var.into().into_boxed_str(),
            op,
            value,
            negate,
            compiled,
        }))
    }

    /// Evaluates the expression. `And([])` is true, like an empty `vars` list in APISIX.
    pub fn eval(&self, vars: &dyn VarSource) -> bool {
        match self {
            Expr::And(list) => list.iter().all(|e| e.eval(vars)),
            Expr::Or(list) => list.iter().any(|e| e.eval(vars)),
            Expr::Not(inner) => !inner.eval(vars),
            Expr::Compare(c) => c.eval(vars),
        }
    }
}

/// `ipmatch` accepts one address/CIDR or a list of them, like resty.ipmatcher.
fn compile_nets(value: &ExprValue) -> Result<Box<[IpNet]>, String> {
    let items: &[ExprValue] = match value {
        ExprValue::List(items) => items,
        single => std::slice::from_ref(single),
    };
    if items.is_empty() {
        return Err("invalid ip address: empty list".to_string());
    }
    items
        .iter()
        .map(|item| match item {
            ExprValue::Str(s) => parse_net(s).ok_or_else(|| format!("invalid ip address: {s}")),
            other => Err(format!("invalid ip address: {other:?}")),
        })
        .collect()
}

/// An address or a CIDR; a bare address is a host-length network.
pub(crate) fn parse_net(s: &str) -> Option<IpNet> {
    if s.contains('/') {
        s.parse::<IpNet>().ok()
    } else {
        s.parse::<IpAddr>().ok().map(IpNet::from)
    }
}

/// Lua's `tonumber` on a string (LuaJIT flavour): surrounding whitespace allowed, optional sign,
/// decimal with optional fraction/exponent, `0x` hex integers, `inf`/`nan`.
pub(crate) fn lua_tonumber(s: &str) -> Option<f64> {
    let t = s.trim_matches(|c: char| matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c'));
    let (neg, body) = match t.as_bytes().first()? {
        b'-' => (true, &t[1..]),
        b'+' => (false, &t[1..]),
        _ => (false, t),
    };
    let hex = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X"));
    let v = if let Some(digits) = hex {
        if digits.is_empty() {
            return None;
        }
        let mut v = 0f64;
        for c in digits.chars() {
            v = v * 16.0 + f64::from(c.to_digit(16)?);
        }
        v
    } else {
        // Rust's float grammar would also take a second sign ("+-1"); Lua does not.
        if body.starts_with(['+', '-']) {
            return None;
        }
        body.parse::<f64>().ok()?
    };
    Some(if neg { -v } else { v })
}

/// `tostring` of a Lua number (`%.14g`), close enough for regex patterns given as numbers.
fn lua_number_to_string(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        format!("{n}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Vars(HashMap<&'static str, &'static str>);

    impl VarSource for Vars {
        fn var(&self, name: &str) -> Option<Cow<'_, str>> {
            self.0.get(name).map(|v| Cow::Borrowed(*v))
        }
    }

    fn vars(pairs: &[(&'static str, &'static str)]) -> Vars {
        Vars(pairs.iter().copied().collect())
    }

    fn s(v: &str) -> ExprValue {
        ExprValue::Str(v.to_string())
    }

    fn cmp(var: &str, op: &str, value: ExprValue) -> Expr {
        Expr::compare(var, CmpOp::parse(op).unwrap(), value, false).unwrap()
    }

    fn ncmp(var: &str, op: &str, value: ExprValue) -> Expr {
        Expr::compare(var, CmpOp::parse(op).unwrap(), value, true).unwrap()
    }

    /// Evaluates `[var, op, value]` with `var` set to `left` (or absent).
    fn check(left: Option<&'static str>, op: &str, value: ExprValue) -> bool {
        let v = match left {
            Some(l) => vars(&[("x", l)]),
            None => vars(&[]),
        };
        let plain = cmp("x", op, value.clone()).eval(&v);
        // Negation must always be the exact inverse.
        assert_eq!(ncmp("x", op, value).eval(&v), !plain);
        plain
    }

    #[test]
    fn parse_ops() {
        for op in [
            "==", "~=", ">", ">=", "<", "<=", "~~", "~*", "in", "has", "ipmatch",
        ] {
            assert_eq!(CmpOp::parse(op).unwrap().as_str(), op);
        }
        assert_eq!(CmpOp::parse("IN"), Some(CmpOp::In));
        assert_eq!(CmpOp::parse("IpMatch"), Some(CmpOp::IpMatch));
        assert_eq!(CmpOp::parse("!="), None);
        assert_eq!(CmpOp::parse("="), None);
        assert_eq!(CmpOp::parse(""), None);
    }

    #[test]
    fn eq_strings_and_absent() {
        assert!(check(Some("a"), "==", s("a")));
        assert!(!check(Some("a"), "==", s("b")));
        assert!(!check(Some("A"), "==", s("a")));
        assert!(!check(None, "==", s("x")));
        assert!(check(Some(""), "==", s("")));
        assert!(!check(None, "==", s("")));
    }

    #[test]
    fn eq_number_uses_tonumber() {
        assert!(check(Some("10"), "==", ExprValue::Num(10.0)));
        assert!(check(Some("10.0"), "==", ExprValue::Num(10.0)));
        assert!(check(Some(" 1e1 "), "==", ExprValue::Num(10.0)));
        assert!(check(Some("0x10"), "==", ExprValue::Num(16.0)));
        assert!(!check(Some("abc"), "==", ExprValue::Num(10.0)));
        assert!(!check(None, "==", ExprValue::Num(10.0)));
        // A string right side is compared as a string.
        assert!(!check(Some("10.0"), "==", s("10")));
    }

    #[test]
    fn eq_null_bool_list() {
        assert!(check(None, "==", ExprValue::Null));
        assert!(!check(Some("x"), "==", ExprValue::Null));
        assert!(!check(Some("true"), "==", ExprValue::Bool(true)));
        assert!(!check(Some("a"), "==", ExprValue::List(vec![s("a")])));
    }

    #[test]
    fn ne_semantics() {
        assert!(check(Some("a"), "~=", s("b")));
        assert!(!check(Some("a"), "~=", s("a")));
        // An absent variable is "not equal" to any string.
        assert!(check(None, "~=", s("a")));
        // Non-numeric left with a numeric right is "not equal".
        assert!(check(Some("abc"), "~=", ExprValue::Num(1.0)));
        assert!(check(None, "~=", ExprValue::Num(1.0)));
        assert!(!check(Some("1"), "~=", ExprValue::Num(1.0)));
        assert!(check(Some("2"), "~=", ExprValue::Num(1.0)));
        // `~= null` means "present".
        assert!(check(Some(""), "~=", ExprValue::Null));
        assert!(!check(None, "~=", ExprValue::Null));
        assert!(check(Some("true"), "~=", ExprValue::Bool(true)));
    }

    #[test]
    fn ordering_is_numeric_only() {
        assert!(check(Some("10"), ">", ExprValue::Num(9.0)));
        assert!(!check(Some("9"), ">", ExprValue::Num(10.0)));
        // Both sides converted: "9" > "10" is false (numerically), not true (lexically).
        assert!(!check(Some("9"), ">", s("10")));
        assert!(check(Some("10"), ">", s("9")));
        assert!(check(Some("10"), ">=", ExprValue::Num(10.0)));
        assert!(!check(Some("9.5"), ">=", ExprValue::Num(10.0)));
        assert!(check(Some("-1"), "<", ExprValue::Num(0.0)));
        assert!(check(Some("3"), "<=", ExprValue::Num(3.0)));
        assert!(!check(Some("4"), "<=", ExprValue::Num(3.0)));
        // Not numbers: always false (and so the negation is true).
        assert!(!check(Some("abc"), ">", ExprValue::Num(1.0)));
        assert!(!check(Some("abc"), "<", ExprValue::Num(1.0)));
        assert!(!check(None, "<", ExprValue::Num(1.0)));
        assert!(!check(Some("5"), "<", s("abc")));
        assert!(!check(Some("5"), "<", ExprValue::Null));
        assert!(!check(Some("5"), "<", ExprValue::Bool(true)));
    }

    #[test]
    fn regex_ops() {
        assert!(check(Some("/api/v1"), "~~", s("^/api/v[0-9]+$")));
        assert!(check(Some("xx-abc-yy"), "~~", s("abc")));
        assert!(!check(Some("ABC"), "~~", s("abc")));
        assert!(check(Some("ABC"), "~*", s("abc")));
        assert!(!check(Some("xyz"), "~*", s("abc")));
        assert!(!check(None, "~~", s(".*")));
        assert!(!check(None, "~*", s(".*")));
        assert!(check(Some("a123"), "~~", ExprValue::Num(123.0)));
        let err = Expr::compare("x", CmpOp::Regex, s("("), false).unwrap_err();
        assert!(err.starts_with("failed to compile regex"), "{err}");
        assert!(Expr::compare("x", CmpOp::Regex, ExprValue::Null, false).is_err());
    }

    #[test]
    fn in_and_has() {
        let list = ExprValue::List(vec![s("a"), s("b"), ExprValue::Num(1.0), ExprValue::Null]);
        assert!(check(Some("a"), "in", list.clone()));
        assert!(check(Some("b"), "in", list.clone()));
        assert!(!check(Some("c"), "in", list.clone()));
        // Lua: "1" == 1 is false.
        assert!(!check(Some("1"), "in", list.clone()));
        assert!(!check(None, "in", list.clone()));
        assert!(!check(Some("a"), "in", s("a")));
        // `has` needs an array on the left; variables are strings.
        assert!(!check(Some("a"), "has", s("a")));
        assert!(!check(None, "has", ExprValue::Null));
    }

    #[test]
    fn ipmatch() {
        assert!(check(Some("10.1.2.3"), "ipmatch", s("10.0.0.0/8")));
        assert!(!check(Some("11.1.2.3"), "ipmatch", s("10.0.0.0/8")));
        assert!(check(Some("127.0.0.1"), "ipmatch", s("127.0.0.1")));
        let list = ExprValue::List(vec![s("192.168.0.0/16"), s("::1"), s("2001:db8::/32")]);
        assert!(check(Some("192.168.3.4"), "ipmatch", list.clone()));
        assert!(check(Some("::1"), "ipmatch", list.clone()));
        assert!(check(Some("2001:db8::5"), "ipmatch", list.clone()));
        assert!(!check(Some("10.0.0.1"), "ipmatch", list.clone()));
        assert!(!check(Some("not-an-ip"), "ipmatch", list.clone()));
        assert!(!check(None, "ipmatch", list));
        for bad in [s("foo"), s(""), ExprValue::List(vec![]), ExprValue::Null] {
            let err = Expr::compare("x", CmpOp::IpMatch, bad, false).unwrap_err();
            assert!(err.starts_with("invalid ip address"), "{err}");
        }
        let err = Expr::compare("x", CmpOp::IpMatch, s("1.2.3.4/40"), false).unwrap_err();
        assert_eq!(err, "invalid ip address: 1.2.3.4/40");
    }

    #[test]
    fn logic_operators() {
        let v = vars(&[("a", "1"), ("b", "2")]);
        let a1 = || cmp("a", "==", s("1"));
        let b2 = || cmp("b", "==", s("2"));
        let b3 = || cmp("b", "==", s("3"));
        assert!(Expr::And(vec![a1(), b2()]).eval(&v));
        assert!(!Expr::And(vec![a1(), b3()]).eval(&v));
        assert!(Expr::Or(vec![b3(), a1()]).eval(&v));
        assert!(!Expr::Or(vec![b3(), b3()]).eval(&v));
        // "!AND" / "!OR"
        assert!(Expr::Not(Box::new(Expr::And(vec![a1(), b3()]))).eval(&v));
        assert!(!Expr::Not(Box::new(Expr::And(vec![a1(), b2()]))).eval(&v));
        assert!(Expr::Not(Box::new(Expr::Or(vec![b3(), b3()]))).eval(&v));
        assert!(!Expr::Not(Box::new(Expr::Or(vec![b3(), a1()]))).eval(&v));
        // Nesting and negated leaves.
        let nested = Expr::And(vec![
            Expr::Or(vec![b3(), ncmp("a", "==", s("2"))]),
            Expr::Not(Box::new(Expr::Or(vec![
                b3(),
                cmp("c", "~=", ExprValue::Null),
            ]))),
        ]);
        assert!(nested.eval(&v));
        assert!(Expr::And(vec![]).eval(&v));
        assert!(!Expr::Or(vec![]).eval(&v));
    }

    #[test]
    fn accessors() {
        let Expr::Compare(c) = ncmp("arg_a", "in", ExprValue::List(vec![])) else {
            unreachable!()
        };
        assert_eq!(c.var(), "arg_a");
        assert_eq!(c.op(), CmpOp::In);
        assert!(c.negate());
        assert_eq!(c.value(), &ExprValue::List(vec![]));
    }

    #[test]
    fn tonumber_cases() {
        assert_eq!(lua_tonumber("42"), Some(42.0));
        assert_eq!(lua_tonumber("  -3.5\t"), Some(-3.5));
        assert_eq!(lua_tonumber("1e3"), Some(1000.0));
        assert_eq!(lua_tonumber(".5"), Some(0.5));
        assert_eq!(lua_tonumber("5."), Some(5.0));
        assert_eq!(lua_tonumber("0xff"), Some(255.0));
        assert_eq!(lua_tonumber("-0x10"), Some(-16.0));
        assert_eq!(lua_tonumber(""), None);
        assert_eq!(lua_tonumber("   "), None);
        assert_eq!(lua_tonumber("1a"), None);
        assert_eq!(lua_tonumber("0x"), None);
        assert_eq!(lua_tonumber("+-1"), None);
        assert_eq!(lua_tonumber("."), None);
        assert_eq!(lua_number_to_string(123.0), "123");
        assert_eq!(lua_number_to_string(1.5), "1.5");
    }
}
