//! `cost_expr` of `limit_strategy: expression`: APISIX loads it as a Lua expression
//! (`return <cost_expr>`) in an environment of the answer's raw usage fields (a missing one
//! reads 0) and a few math functions. ferrisix parses the same expression language — Lua's
//! arithmetic (`+ - * / % ^`, unary minus), comparisons, `and` / `or` / `not`, parentheses and
//! calls of `abs`, `ceil`, `floor`, `max`, `min` and the `math.*` functions — once, when the
//! plugin is checked and compiled, and evaluates the tree per answer. Strings, tables and
//! statements are not expressions of a token cost and are refused as Lua's parser would refuse
//! an unexpected symbol.

use serde_json::Value;

/// A parsed `cost_expr`.
#[derive(Clone, Debug, PartialEq)]
pub struct CostExpr(Node);

#[derive(Clone, Debug, PartialEq)]
enum Node {
    Num(f64),
    Bool(bool),
    Nil,
    Var(String),
    /// `math.<name>` or a bare name, called.
    Call(Callee, Vec<Node>),
    /// `math.<name>` read as a value (`math.huge`, `math.pi`).
    MathField(String),
    Neg(Box<Node>),
    Not(Box<Node>),
    Bin(Op, Box<Node>, Box<Node>),
}

#[derive(Clone, Debug, PartialEq)]
enum Callee {
    Bare(String),
    Math(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Pow,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Num(f64),
    Name(String),
    Sym(&'static str),
    Eof,
}

impl Tok {
    /// How Lua names the token in "near ..." errors.
    fn near(&self) -> String {
        match self {
            Tok::Num(n) => format!("'{n}'"),
            Tok::Name(n) => format!("'{n}'"),
            Tok::Sym(s) => format!("'{s}'"),
            Tok::Eof => "<eof>".into(),
        }
    }
}

fn syntax(msg: &str, near: &Tok) -> String {
    format!("[string \"cost_expr\"]:1: {msg} near {}", near.near())
}

fn lex(src: &str) -> Result<Vec<Tok>, String> {
    const SYMS: [&str; 17] = [
        "==", "~=", "<=", ">=", "<", ">", "+", "-", "*", "/", "%", "^", "(", ")", ",", ".", "#",
    ];
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) {
            let start = i;
            if c == b'0' && matches!(b.get(i + 1), Some(b'x' | b'X')) {
                i += 2;
                while i < b.len() && b[i].is_ascii_hexdigit() {
                    i += 1;
                }
                let n = u64::from_str_radix(&src[start + 2..i], 16)
                    .map_err(|_| syntax("malformed number", &Tok::Name(src[start..i].into())))?;
                out.push(Tok::Num(n as f64));
                continue;
            }
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                // An exponent's sign belongs to the number.
                if matches!(b[i], b'e' | b'E') && matches!(b.get(i + 1), Some(b'+' | b'-')) {
                    i += 1;
                }
                i += 1;
            }
            let text = &src[start..i];
            let n: f64 = text
                .parse()
                .map_err(|_| syntax("malformed number", &Tok::Name(text.into())))?;
            out.push(Tok::Num(n));
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Tok::Name(src[start..i].into()));
            continue;
        }
        match SYMS.iter().find(|s| src[i..].starts_with(**s)) {
            Some(s) => {
                out.push(Tok::Sym(s));
                i += s.len();
            }
            None => {
                let ch = src[i..].chars().next().unwrap_or('?');
                return Err(syntax("unexpected symbol", &Tok::Name(ch.to_string())));
            }
        }
    }
    out.push(Tok::Eof);
    Ok(out)
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

/// Lua's binary priorities (left, right): `^` is right-associative.
fn binary(t: &Tok) -> Option<(Op, u8, u8)> {
    Some(match t {
        Tok::Name(n) if n == "or" => (Op::Or, 1, 1),
        Tok::Name(n) if n == "and" => (Op::And, 2, 2),
        Tok::Sym("<") => (Op::Lt, 3, 3),
        Tok::Sym(">") => (Op::Gt, 3, 3),
        Tok::Sym("<=") => (Op::Le, 3, 3),
        Tok::Sym(">=") => (Op::Ge, 3, 3),
        Tok::Sym("~=") => (Op::Ne, 3, 3),
        Tok::Sym("==") => (Op::Eq, 3, 3),
        Tok::Sym("+") => (Op::Add, 6, 6),
        Tok::Sym("-") => (Op::Sub, 6, 6),
        Tok::Sym("*") => (Op::Mul, 7, 7),
        Tok::Sym("/") => (Op::Div, 7, 7),
        Tok::Sym("%") => (Op::Mod, 7, 7),
        Tok::Sym("^") => (Op::Pow, 10, 9),
        _ => return None,
    })
}

/// Unary operators bind tighter than every binary one but `^`.
const UNARY: u8 = 8;

const KEYWORDS: [&str; 21] = [
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in", "local",
    "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
];

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos]
    }

    fn next(&mut self) -> Tok {
        let t = self.toks[self.pos].clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn expect(&mut self, sym: &'static str) -> Result<(), String> {
        if *self.peek() == Tok::Sym(sym) {
            self.next();
            Ok(())
        } else {
            Err(syntax(&format!("'{sym}' expected"), self.peek()))
        }
    }

    fn expr(&mut self, limit: u8) -> Result<Node, String> {
        let mut left = match self.peek().clone() {
            Tok::Sym("-") => {
                self.next();
                Node::Neg(Box::new(self.expr(UNARY)?))
            }
            Tok::Name(n) if n == "not" => {
                self.next();
                Node::Not(Box::new(self.expr(UNARY)?))
            }
            _ => self.simple()?,
        };
        while let Some((op, l, r)) = binary(self.peek()) {
            if l <= limit {
                break;
            }
            self.next();
            let right = self.expr(r)?;
            left = Node::Bin(op, Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn args(&mut self) -> Result<Vec<Node>, String> {
        self.expect("(")?;
        let mut args = Vec::new();
        if *self.peek() != Tok::Sym(")") {
            loop {
                args.push(self.expr(0)?);
                if *self.peek() == Tok::Sym(",") {
                    self.next();
                    continue;
                }
                break;
            }
        }
        self.expect(")")?;
        Ok(args)
    }

    fn simple(&mut self) -> Result<Node, String> {
        let t = self.next();
        match t {
            Tok::Num(n) => Ok(Node::Num(n)),
            Tok::Name(n) if n == "true" => Ok(Node::Bool(true)),
            Tok::Name(n) if n == "false" => Ok(Node::Bool(false)),
            Tok::Name(n) if n == "nil" => Ok(Node::Nil),
            Tok::Name(n) if KEYWORDS.contains(&n.as_str()) => {
                Err(syntax("unexpected symbol", &Tok::Name(n)))
            }
            Tok::Name(n) if n == "math" && *self.peek() == Tok::Sym(".") => {
                self.next();
                let field = match self.next() {
                    Tok::Name(f) if !KEYWORDS.contains(&f.as_str()) => f,
                    other => return Err(syntax("<name> expected", &other)),
                };
                if *self.peek() == Tok::Sym("(") {
                    Ok(Node::Call(Callee::Math(field), self.args()?))
                } else {
                    Ok(Node::MathField(field))
                }
            }
            Tok::Name(n) => {
                if *self.peek() == Tok::Sym("(") {
                    Ok(Node::Call(Callee::Bare(n), self.args()?))
                } else {
                    Ok(Node::Var(n))
                }
            }
            Tok::Sym("(") => {
                let inner = self.expr(0)?;
                self.expect(")")?;
                Ok(inner)
            }
            other => Err(syntax("unexpected symbol", &other)),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Val {
    Num(f64),
    Bool(bool),
    Nil,
}

impl Val {
    fn truthy(self) -> bool {
        !matches!(self, Val::Nil | Val::Bool(false))
    }

    fn type_name(self) -> &'static str {
        match self {
            Val::Num(_) => "number",
            Val::Bool(_) => "boolean",
            Val::Nil => "nil",
        }
    }
}

/// The math functions of the expression's environment, as Lua computes them.
fn math(name: &str, args: &[f64]) -> Result<f64, String> {
    let arg = |i: usize| -> Result<f64, String> {
        args.get(i).copied().ok_or_else(|| {
            format!(
                "bad argument #{} to '{name}' (number expected, got no value)",
                i + 1
            )
        })
    };
    Ok(match name {
        "abs" => arg(0)?.abs(),
        "ceil" => arg(0)?.ceil(),
        "floor" => arg(0)?.floor(),
        "sqrt" => arg(0)?.sqrt(),
        "exp" => arg(0)?.exp(),
        "log" => match args.get(1) {
            Some(base) => arg(0)?.ln() / base.ln(),
            None => arg(0)?.ln(),
        },
        "log10" => arg(0)?.log10(),
        "pow" => arg(0)?.powf(arg(1)?),
        "fmod" => arg(0)? % arg(1)?,
        "max" | "min" => {
            let mut acc = arg(0)?;
            for &v in &args[1..] {
                acc = if name == "max" {
                    acc.max(v)
                } else {
                    acc.min(v)
                };
            }
            acc
        }
        other => return Err(format!("attempt to call field '{other}' (a nil value)")),
    })
}

impl CostExpr {
    /// Parses `src` as Lua would load `return <src>`; the error is Lua's wording.
    pub fn parse(src: &str) -> Result<CostExpr, String> {
        let mut p = Parser {
            toks: lex(src)?,
            pos: 0,
        };
        let node = p.expr(0)?;
        if *p.peek() != Tok::Eof {
            return Err(syntax("'<eof>' expected", p.peek()));
        }
        Ok(CostExpr(node))
    }

    /// The cost of an answer whose raw usage is `raw`: its top-level numeric fields are the
    /// variables, any other name reads 0. Rounded to the nearest integer, never negative.
    pub fn eval(&self, raw: &Value) -> Result<u64, String> {
        let var = |name: &str| -> f64 {
            if matches!(name, "abs" | "ceil" | "floor" | "max" | "min" | "math") {
                return f64::NAN;
            }
            raw.get(name).and_then(Value::as_f64).unwrap_or(0.0)
        };
        let v = eval(&self.0, &var).map_err(|e| format!("failed to evaluate cost_expr: {e}"))?;
        let Val::Num(n) = v else {
            return Err(format!(
                "cost_expr must return a number, got: {}",
                v.type_name()
            ));
        };
        if !n.is_finite() {
            return Err("cost_expr returned non-finite value".into());
        }
        Ok((n.max(0.0) + 0.5).floor() as u64)
    }
}

fn num(v: Val, what: &str) -> Result<f64, String> {
    match v {
        Val::Num(n) => Ok(n),
        other => Err(format!(
            "attempt to perform arithmetic on {what} (a {} value)",
            other.type_name()
        )),
    }
}

fn eval(n: &Node, var: &dyn Fn(&str) -> f64) -> Result<Val, String> {
    Ok(match n {
        Node::Num(v) => Val::Num(*v),
        Node::Bool(b) => Val::Bool(*b),
        Node::Nil => Val::Nil,
        Node::Var(name) => {
            let v = var(name);
            if v.is_nan() {
                return Err(format!(
                    "attempt to perform arithmetic on global '{name}' (a non-number value)"
                ));
            }
            Val::Num(v)
        }
        Node::MathField(f) => match f.as_str() {
            "huge" => Val::Num(f64::INFINITY),
            "pi" => Val::Num(std::f64::consts::PI),
            _ => Val::Nil,
        },
        Node::Call(callee, args) => {
            let name = match callee {
                Callee::Math(f) => f.as_str(),
                Callee::Bare(f)
                    if matches!(f.as_str(), "abs" | "ceil" | "floor" | "max" | "min") =>
                {
                    f.as_str()
                }
                Callee::Bare(f) => {
                    return Err(format!("attempt to call global '{f}' (a number value)"))
                }
            };
            let mut values = Vec::with_capacity(args.len());
            for (i, a) in args.iter().enumerate() {
                match eval(a, var)? {
                    Val::Num(v) => values.push(v),
                    other => {
                        return Err(format!(
                            "bad argument #{} to '{name}' (number expected, got {})",
                            i + 1,
                            other.type_name()
                        ))
                    }
                }
            }
            Val::Num(math(name, &values)?)
        }
        Node::Neg(inner) => Val::Num(-num(eval(inner, var)?, "a value")?),
        Node::Not(inner) => Val::Bool(!eval(inner, var)?.truthy()),
        Node::Bin(Op::And, l, r) => {
            let l = eval(l, var)?;
            if l.truthy() {
                eval(r, var)?
            } else {
                l
            }
        }
        Node::Bin(Op::Or, l, r) => {
            let l = eval(l, var)?;
            if l.truthy() {
                l
            } else {
                eval(r, var)?
            }
        }
        Node::Bin(op, l, r) => {
            let (l, r) = (eval(l, var)?, eval(r, var)?);
            match op {
                Op::Eq => return Ok(Val::Bool(l == r)),
                Op::Ne => return Ok(Val::Bool(l != r)),
                _ => {}
            }
            let (a, b) = (num(l, "a value")?, num(r, "a value")?);
            match op {
                Op::Add => Val::Num(a + b),
                Op::Sub => Val::Num(a - b),
                Op::Mul => Val::Num(a * b),
                Op::Div => Val::Num(a / b),
                // Lua's modulo takes the divisor's sign: a - floor(a / b) * b.
                Op::Mod => Val::Num(a - (a / b).floor() * b),
                Op::Pow => Val::Num(a.powf(b)),
                Op::Lt => Val::Bool(a < b),
                Op::Le => Val::Bool(a <= b),
                Op::Gt => Val::Bool(a > b),
                Op::Ge => Val::Bool(a >= b),
                Op::Eq | Op::Ne | Op::And | Op::Or => unreachable!("handled above"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn cost(src: &str, raw: Value) -> Result<u64, String> {
        CostExpr::parse(src)?.eval(&raw)
    }

    #[test]
    fn arithmetic_over_the_raw_usage() {
        let raw = json!({"input_tokens": 10, "cache_creation_input_tokens": 4, "output_tokens": 6,
            "cache_read_input_tokens": 100, "server_tool_use": {"web_search_requests": 1}});
        assert_eq!(
            cost(
                "input_tokens + cache_creation_input_tokens + output_tokens",
                raw.clone()
            ),
            Ok(20)
        );
        // A cheaper rate for cached reads, rounded half up.
        assert_eq!(
            cost(
                "input_tokens + cache_read_input_tokens * 0.1 + output_tokens * 3",
                raw.clone()
            ),
            Ok(38)
        );
        assert_eq!(
            cost("output_tokens / 4", raw.clone()),
            Ok(2),
            "1.5 rounds to 2"
        );
        // A missing field, or one that is not a number, reads 0.
        assert_eq!(cost("missing + server_tool_use + 1", raw.clone()), Ok(1));
        assert_eq!(
            cost("-2^2 + 10", json!({})),
            Ok(6),
            "^ binds before unary minus"
        );
        assert_eq!(cost("2^3^2", json!({})), Ok(512), "^ is right-associative");
        assert_eq!(cost("-7 % 3", json!({})), Ok(2), "Lua's modulo");
        assert_eq!(cost("(1 + 2) * 3", json!({})), Ok(9));
        assert_eq!(cost("0x10 + 1e1 + .5", json!({})), Ok(27));
        assert_eq!(
            cost("max(input_tokens, 50) + min(1, 2, 3)", raw.clone()),
            Ok(51)
        );
        assert_eq!(
            cost("math.floor(2.7) + math.ceil(0.1) + abs(-3)", json!({})),
            Ok(6)
        );
        assert_eq!(cost("math.sqrt(16) + math.pow(2, 2)", json!({})), Ok(8));
        assert_eq!(cost("input_tokens > 5 and 100 or 1", raw.clone()), Ok(100));
        assert_eq!(
            cost("not missing and 3 or 4", raw),
            Ok(4),
            "0 is true in Lua"
        );
        assert_eq!(cost("1 - 10", json!({})), Ok(0), "a negative cost is 0");
    }

    #[test]
    fn errors_as_apisix_words_them() {
        let e = CostExpr::parse("input_tokens +").unwrap_err();
        assert_eq!(e, "[string \"cost_expr\"]:1: unexpected symbol near <eof>");
        assert!(CostExpr::parse("a b")
            .unwrap_err()
            .contains("'<eof>' expected near 'b'"));
        assert!(CostExpr::parse("(1 + 2")
            .unwrap_err()
            .contains("')' expected"));
        assert!(CostExpr::parse("'x'")
            .unwrap_err()
            .contains("unexpected symbol"));
        assert!(CostExpr::parse("os.exit()").is_err(), "no field but math's");
        assert_eq!(
            cost("1 / 0", json!({})).unwrap_err(),
            "cost_expr returned non-finite value"
        );
        assert_eq!(
            cost("1 > 0", json!({})).unwrap_err(),
            "cost_expr must return a number, got: boolean"
        );
        assert!(cost("math.nope(1)", json!({}))
            .unwrap_err()
            .starts_with("failed to evaluate cost_expr: "));
        assert!(cost("tokens(1)", json!({"tokens": 3})).is_err());
    }
}
