//! The Lua that body-transformer's templates run: a small interpreter for the subset of Lua
//! that lua-resty-template's `{{ }}`, `{* *}` and `{% %}` hold in APISIX's documentation and
//! tests: values (nil, booleans, numbers, strings, tables), every operator, field and index
//! access, calls of the helpers below and string methods (`s:upper()`), `local`, assignment,
//! `if`/`elseif`/`else`, numeric and generic `for` (`ipairs`, `pairs`), `while`, `do`,
//! `break`. Functions cannot be defined: a template that does so is refused when the conf is
//! written.
//!
//! Globals: the helpers the template gets (`_escape_xml`, `_escape_json`, `_ctx` with `var`
//! and `consumer`, `_body`), the decoded body's fields, `context`, and the library functions
//! `ipairs`, `pairs`, `tostring`, `tonumber`, `type`, `select`, `string.*` (`len`, `sub`,
//! `upper`, `lower`, `rep`, `reverse`, `format` with `%s %d %f %q %%`, `find` and `gsub`
//! with plain text), `table.concat`, `table.insert`, `math.floor`, `math.ceil`, `math.max`,
//! `math.min`, `math.abs`. A run is bounded in steps and output size.
//!
//! `require` gives the modules APISIX's documented templates load: `cjson` and `cjson.safe`
//! (`encode`, `decode`), `apisix.core` (`json.encode`, `json.decode`), `tinyyaml` (`parse`)
//! and `lyaml` (`load`); any other name fails the render as Lua's `require` does
//! (`module 'x' not found`).

use std::cell::RefCell;
use std::rc::Rc;

use ferrisix_config::schema::lua as lua_fmt;
use serde_json::Value as Json;

/// Steps one render may take (each expression and statement evaluated is one).
const MAX_STEPS: u64 = 5_000_000;
/// Nesting of expressions and blocks the parser accepts.
const MAX_NEST: usize = 200;

// ---------------------------------------------------------------- syntax

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Name(String),
    Num(f64),
    Str(String),
    Op(&'static str),
    Eof,
}

const OPS: [&str; 30] = [
    "...", "..", "==", "~=", "<=", ">=", "::", "+", "-", "*", "/", "%", "^", "#", "<", ">", "=",
    "(", ")", "{", "}", "[", "]", ";", ":", ",", ".", "&", "|", "~",
];

fn lex(src: &str) -> Result<Vec<(Tok, usize)>, String> {
    let b = src.as_bytes();
    let (mut i, mut line) = (0usize, 1usize);
    let mut out = Vec::new();
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line += 1;
            i += 1;
            continue;
        }
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if b[i..].starts_with(b"--") {
            if b[i + 2..].starts_with(b"[[") {
                let end = src[i..]
                    .find("]]")
                    .ok_or(format!("[string]:{line}: unfinished long comment"))?;
                line += src[i..i + end].matches('\n').count();
                i += end + 2;
            } else {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            continue;
        }
        if c == b'_' || c.is_ascii_alphabetic() {
            let s = i;
            while i < b.len() && (b[i] == b'_' || b[i].is_ascii_alphanumeric()) {
                i += 1;
            }
            out.push((Tok::Name(src[s..i].to_owned()), line));
            continue;
        }
        if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) {
            let s = i;
            if b[i..].starts_with(b"0x") || b[i..].starts_with(b"0X") {
                i += 2;
                while i < b.len() && b[i].is_ascii_hexdigit() {
                    i += 1;
                }
                let n = i64::from_str_radix(&src[s + 2..i], 16)
                    .map_err(|_| format!("[string]:{line}: malformed number"))?;
                out.push((Tok::Num(n as f64), line));
                continue;
            }
            while i < b.len()
                && (b[i].is_ascii_alphanumeric()
                    || b[i] == b'.'
                    || ((b[i] == b'+' || b[i] == b'-') && matches!(b[i - 1], b'e' | b'E')))
            {
                i += 1;
            }
            let n: f64 = src[s..i]
                .parse()
                .map_err(|_| format!("[string]:{line}: malformed number near '{}'", &src[s..i]))?;
            out.push((Tok::Num(n), line));
            continue;
        }
        if c == b'"' || c == b'\'' {
            i += 1;
            let mut s = Vec::new();
            loop {
                match b.get(i) {
                    None | Some(b'\n') => {
                        return Err(format!("[string]:{line}: unfinished string"))
                    }
                    Some(&q) if q == c => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') => {
                        let e = *b
                            .get(i + 1)
                            .ok_or(format!("[string]:{line}: unfinished string"))?;
                        i += 2;
                        match e {
                            b'n' => s.push(b'\n'),
                            b't' => s.push(b'\t'),
                            b'r' => s.push(b'\r'),
                            b'\\' => s.push(b'\\'),
                            b'"' => s.push(b'"'),
                            b'\'' => s.push(b'\''),
                            b'\n' => s.push(b'\n'),
                            d if d.is_ascii_digit() => {
                                let mut n = u32::from(d - b'0');
                                for _ in 0..2 {
                                    match b.get(i) {
                                        Some(x) if x.is_ascii_digit() => {
                                            n = n * 10 + u32::from(x - b'0');
                                            i += 1;
                                        }
                                        _ => break,
                                    }
                                }
                                s.push(u8::try_from(n).map_err(|_| {
                                    format!("[string]:{line}: escape sequence too large")
                                })?);
                            }
                            _ => return Err(format!("[string]:{line}: invalid escape sequence")),
                        }
                    }
                    Some(&x) => {
                        s.push(x);
                        i += 1;
                    }
                }
            }
            out.push((Tok::Str(String::from_utf8_lossy(&s).into_owned()), line));
            continue;
        }
        if b[i..].starts_with(b"[[") {
            let end = src[i + 2..]
                .find("]]")
                .ok_or(format!("[string]:{line}: unfinished long string"))?;
            let text = &src[i + 2..i + 2 + end];
            let text = text.strip_prefix('\n').unwrap_or(text);
            line += src[i..i + 2 + end].matches('\n').count();
            out.push((Tok::Str(text.to_owned()), line));
            i += end + 4;
            continue;
        }
        let op = OPS
            .iter()
            .find(|o| b[i..].starts_with(o.as_bytes()))
            .ok_or_else(|| format!("[string]:{line}: unexpected symbol near '{}'", c as char))?;
        out.push((Tok::Op(op), line));
        i += op.len();
    }
    out.push((Tok::Eof, line));
    Ok(out)
}

#[derive(Clone, Debug)]
pub enum Expr {
    Nil,
    True,
    False,
    Num(f64),
    Str(String),
    Name(String),
    Index(Box<Expr>, Box<Expr>),
    Call(Box<Expr>, Vec<Expr>),
    Method(Box<Expr>, String, Vec<Expr>),
    Bin(&'static str, Box<Expr>, Box<Expr>),
    Un(&'static str, Box<Expr>),
    Table(Vec<(Option<Expr>, Expr)>),
}

#[derive(Clone, Debug)]
pub enum Stat {
    Local(Vec<String>, Vec<Expr>),
    Assign(Vec<Expr>, Vec<Expr>),
    Call(Expr),
    If(Vec<(Expr, Vec<Stat>)>, Option<Vec<Stat>>),
    NumFor(String, Expr, Expr, Option<Expr>, Vec<Stat>),
    GenFor(Vec<String>, Vec<Expr>, Vec<Stat>),
    While(Expr, Vec<Stat>),
    Do(Vec<Stat>),
    Break,
    Return,
}

struct Parser {
    toks: Vec<(Tok, usize)>,
    pos: usize,
    nest: usize,
}

type PResult<T> = Result<T, String>;

const KEYWORDS: [&str; 21] = [
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if", "in",
    "local", "nil", "not", "or", "repeat", "return", "then", "true", "until",
];

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos].0
    }

    fn line(&self) -> usize {
        self.toks[self.pos].1
    }

    fn near(&self) -> String {
        match self.peek() {
            Tok::Name(n) => n.clone(),
            Tok::Num(n) => lua_fmt::number(*n),
            Tok::Str(s) => s.clone(),
            Tok::Op(o) => (*o).to_owned(),
            Tok::Eof => "<eof>".to_owned(),
        }
    }

    fn err<T>(&self, what: &str) -> PResult<T> {
        Err(format!(
            "[string]:{}: {what} near '{}'",
            self.line(),
            self.near()
        ))
    }

    fn is_op(&self, o: &str) -> bool {
        matches!(self.peek(), Tok::Op(x) if *x == o)
    }

    fn is_kw(&self, k: &str) -> bool {
        matches!(self.peek(), Tok::Name(x) if x == k)
    }

    fn eat_op(&mut self, o: &str) -> bool {
        if self.is_op(o) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn eat_kw(&mut self, k: &str) -> bool {
        if self.is_kw(k) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect_op(&mut self, o: &str) -> PResult<()> {
        if self.eat_op(o) {
            Ok(())
        } else {
            self.err(&format!("'{o}' expected"))
        }
    }

    fn expect_kw(&mut self, k: &str) -> PResult<()> {
        if self.eat_kw(k) {
            Ok(())
        } else {
            self.err(&format!("'{k}' expected"))
        }
    }

    fn name(&mut self) -> PResult<String> {
        match self.peek().clone() {
            Tok::Name(n) if !KEYWORDS.contains(&n.as_str()) => {
                self.pos += 1;
                Ok(n)
            }
            _ => self.err("<name> expected"),
        }
    }

    fn enter(&mut self) -> PResult<()> {
        self.nest += 1;
        if self.nest > MAX_NEST {
            return self.err("chunk has too many syntax levels");
        }
        Ok(())
    }

    fn block(&mut self) -> PResult<Vec<Stat>> {
        self.enter()?;
        let mut out = Vec::new();
        loop {
            if self.eat_op(";") {
                continue;
            }
            match self.peek() {
                Tok::Eof => break,
                Tok::Name(k) if matches!(k.as_str(), "end" | "else" | "elseif" | "until") => break,
                _ => {}
            }
            let s = self.statement()?;
            let last = matches!(s, Stat::Return | Stat::Break);
            out.push(s);
            if last && matches!(out.last(), Some(Stat::Return)) {
                break;
            }
        }
        self.nest -= 1;
        Ok(out)
    }

    fn statement(&mut self) -> PResult<Stat> {
        if self.eat_kw("local") {
            if self.is_kw("function") {
                return self.err("functions cannot be defined in a template");
            }
            let mut names = vec![self.name()?];
            while self.eat_op(",") {
                names.push(self.name()?);
            }
            let values = if self.eat_op("=") {
                self.exprs()?
            } else {
                Vec::new()
            };
            return Ok(Stat::Local(names, values));
        }
        if self.eat_kw("if") {
            let mut arms = Vec::new();
            let cond = self.expr()?;
            self.expect_kw("then")?;
            arms.push((cond, self.block()?));
            let mut otherwise = None;
            loop {
                if self.eat_kw("elseif") {
                    let c = self.expr()?;
                    self.expect_kw("then")?;
                    arms.push((c, self.block()?));
                } else if self.eat_kw("else") {
                    otherwise = Some(self.block()?);
                    self.expect_kw("end")?;
                    break;
                } else {
                    self.expect_kw("end")?;
                    break;
                }
            }
            return Ok(Stat::If(arms, otherwise));
        }
        if self.eat_kw("for") {
            let first = self.name()?;
            if self.eat_op("=") {
                let from = self.expr()?;
                self.expect_op(",")?;
                let to = self.expr()?;
                let step = if self.eat_op(",") {
                    Some(self.expr()?)
                } else {
                    None
                };
                self.expect_kw("do")?;
                let body = self.block()?;
                self.expect_kw("end")?;
                return Ok(Stat::NumFor(first, from, to, step, body));
            }
            let mut names = vec![first];
            while self.eat_op(",") {
                names.push(self.name()?);
            }
            self.expect_kw("in")?;
            let exprs = self.exprs()?;
            self.expect_kw("do")?;
            let body = self.block()?;
            self.expect_kw("end")?;
            return Ok(Stat::GenFor(names, exprs, body));
        }
        if self.eat_kw("while") {
            let c = self.expr()?;
            self.expect_kw("do")?;
            let body = self.block()?;
            self.expect_kw("end")?;
            return Ok(Stat::While(c, body));
        }
        if self.eat_kw("do") {
            let body = self.block()?;
            self.expect_kw("end")?;
            return Ok(Stat::Do(body));
        }
        if self.eat_kw("break") {
            return Ok(Stat::Break);
        }
        if self.eat_kw("return") {
            if !matches!(self.peek(), Tok::Eof) && !self.is_kw("end") && !self.is_op(";") {
                self.exprs()?;
            }
            return Ok(Stat::Return);
        }
        if self.is_kw("function") || self.is_kw("goto") || self.is_kw("repeat") {
            return self.err("this construct is not supported in a template");
        }
        let first = self.suffixed()?;
        if self.is_op("=") || self.is_op(",") {
            let mut targets = vec![first];
            while self.eat_op(",") {
                targets.push(self.suffixed()?);
            }
            self.expect_op("=")?;
            for t in &targets {
                if !matches!(t, Expr::Name(_) | Expr::Index(..)) {
                    return self.err("syntax error");
                }
            }
            return Ok(Stat::Assign(targets, self.exprs()?));
        }
        match first {
            Expr::Call(..) | Expr::Method(..) => Ok(Stat::Call(first)),
            _ => self.err("syntax error"),
        }
    }

    fn exprs(&mut self) -> PResult<Vec<Expr>> {
        let mut out = vec![self.expr()?];
        while self.eat_op(",") {
            out.push(self.expr()?);
        }
        Ok(out)
    }

    pub fn expr(&mut self) -> PResult<Expr> {
        self.enter()?;
        let e = self.binary(0);
        self.nest -= 1;
        e
    }

    fn binop(&self) -> Option<(&'static str, u8, u8)> {
        // (operator, left priority, right priority), as Lua's parser.
        let op: &'static str = match self.peek() {
            Tok::Op(o) => o,
            Tok::Name(n) if n == "and" => "and",
            Tok::Name(n) if n == "or" => "or",
            _ => return None,
        };
        Some(match op {
            "or" => ("or", 1, 1),
            "and" => ("and", 2, 2),
            "<" | ">" | "<=" | ">=" | "~=" | "==" => (op, 3, 3),
            ".." => ("..", 5, 4),
            "+" | "-" => (op, 6, 6),
            "*" | "/" | "%" => (op, 7, 7),
            "^" => ("^", 10, 9),
            _ => return None,
        })
    }

    fn binary(&mut self, limit: u8) -> PResult<Expr> {
        let mut left = if self.is_kw("not") || self.is_op("-") || self.is_op("#") {
            let op = if self.eat_kw("not") {
                "not"
            } else if self.eat_op("-") {
                "-"
            } else {
                self.pos += 1;
                "#"
            };
            self.enter()?;
            let e = self.binary(8)?;
            self.nest -= 1;
            Expr::Un(op, Box::new(e))
        } else {
            self.simple()?
        };
        while let Some((op, l, r)) = self.binop() {
            if l <= limit {
                break;
            }
            self.pos += 1;
            self.enter()?;
            let right = self.binary(r)?;
            self.nest -= 1;
            left = Expr::Bin(op, Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn simple(&mut self) -> PResult<Expr> {
        let e = match self.peek().clone() {
            Tok::Num(n) => Expr::Num(n),
            Tok::Str(s) => Expr::Str(s),
            Tok::Name(n) if n == "nil" => Expr::Nil,
            Tok::Name(n) if n == "true" => Expr::True,
            Tok::Name(n) if n == "false" => Expr::False,
            Tok::Name(n) if n == "function" => {
                return self.err("functions cannot be defined in a template")
            }
            Tok::Op("{") => return self.table(),
            Tok::Op("...") => return self.err("cannot use '...' outside a vararg function"),
            _ => return self.suffixed(),
        };
        self.pos += 1;
        Ok(e)
    }

    fn table(&mut self) -> PResult<Expr> {
        self.expect_op("{")?;
        let mut items = Vec::new();
        while !self.eat_op("}") {
            if self.eat_op("[") {
                let k = self.expr()?;
                self.expect_op("]")?;
                self.expect_op("=")?;
                items.push((Some(k), self.expr()?));
            } else if matches!(self.peek(), Tok::Name(_))
                && matches!(self.toks.get(self.pos + 1), Some((Tok::Op("="), _)))
            {
                let k = self.name()?;
                self.pos += 1;
                items.push((Some(Expr::Str(k)), self.expr()?));
            } else {
                items.push((None, self.expr()?));
            }
            if !self.eat_op(",") && !self.eat_op(";") {
                self.expect_op("}")?;
                break;
            }
        }
        Ok(Expr::Table(items))
    }

    fn args(&mut self) -> PResult<Vec<Expr>> {
        match self.peek().clone() {
            Tok::Str(s) => {
                self.pos += 1;
                Ok(vec![Expr::Str(s)])
            }
            Tok::Op("{") => Ok(vec![self.table()?]),
            _ => {
                self.expect_op("(")?;
                if self.eat_op(")") {
                    return Ok(Vec::new());
                }
                let a = self.exprs()?;
                self.expect_op(")")?;
                Ok(a)
            }
        }
    }

    fn suffixed(&mut self) -> PResult<Expr> {
        let mut e = if self.eat_op("(") {
            let e = self.expr()?;
            self.expect_op(")")?;
            e
        } else {
            match self.peek() {
                Tok::Name(_) => Expr::Name(self.name()?),
                _ => return self.err("unexpected symbol"),
            }
        };
        loop {
            if self.eat_op(".") {
                e = Expr::Index(Box::new(e), Box::new(Expr::Str(self.name()?)));
            } else if self.eat_op("[") {
                let k = self.expr()?;
                self.expect_op("]")?;
                e = Expr::Index(Box::new(e), Box::new(k));
            } else if self.eat_op(":") {
                let m = self.name()?;
                let a = self.args()?;
                e = Expr::Method(Box::new(e), m, a);
            } else if self.is_op("(") || matches!(self.peek(), Tok::Str(_)) || self.is_op("{") {
                let a = self.args()?;
                e = Expr::Call(Box::new(e), a);
            } else {
                return Ok(e);
            }
        }
    }
}

/// Parses a chunk of statements.
pub fn parse_chunk(src: &str) -> Result<Vec<Stat>, String> {
    let mut p = Parser {
        toks: lex(src)?,
        pos: 0,
        nest: 0,
    };
    let b = p.block()?;
    if !matches!(p.peek(), Tok::Eof) {
        return p.err("'<eof>' expected");
    }
    Ok(b)
}

// ---------------------------------------------------------------- values

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Key {
    Int(i64),
    Str(String),
}

#[derive(Debug, Default)]
pub struct Table {
    pub entries: Vec<(Key, Val)>,
}

impl Table {
    fn get(&self, k: &Key) -> Val {
        self.entries
            .iter()
            .find(|(x, _)| x == k)
            .map_or(Val::Nil, |(_, v)| v.clone())
    }

    fn set(&mut self, k: Key, v: Val) {
        match self.entries.iter().position(|(x, _)| *x == k) {
            Some(i) if matches!(v, Val::Nil) => {
                self.entries.remove(i);
            }
            Some(i) => self.entries[i].1 = v,
            None if matches!(v, Val::Nil) => {}
            None => self.entries.push((k, v)),
        }
    }

    /// The border `#t`: the count of 1, 2, ... present.
    fn len(&self) -> i64 {
        let mut n = 0;
        while self.entries.iter().any(|(k, _)| *k == Key::Int(n + 1)) {
            n += 1;
        }
        n
    }
}

/// The helpers a template calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Builtin {
    EscapeXml,
    EscapeJson,
    Ipairs,
    Pairs,
    Next,
    Tostring,
    Tonumber,
    Type,
    Select,
    StrLen,
    StrSub,
    StrUpper,
    StrLower,
    StrRep,
    StrReverse,
    StrFormat,
    StrFind,
    StrGsub,
    TabConcat,
    TabInsert,
    MathFloor,
    MathCeil,
    MathMax,
    MathMin,
    MathAbs,
    /// `require` and what the modules it gives hold.
    Require,
    JsonEncode,
    /// cjson's `decode`: an error on bad JSON.
    JsonDecode,
    /// `cjson.safe`'s and `core.json`'s `decode`: nil and the message on bad JSON.
    JsonDecodeSafe,
    YamlLoad,
    /// The iterator `ipairs` returns.
    IpairsIter,
    /// The template's writers: its text number N, a value escaped, a value as it is.
    WriteText,
    WriteEscaped,
    WriteRaw,
}

#[derive(Clone, Debug)]
pub enum Val {
    Nil,
    Bool(bool),
    Num(f64),
    Str(Rc<str>),
    Table(Rc<RefCell<Table>>),
    Func(Builtin),
}

impl Val {
    pub fn str(s: &str) -> Val {
        Val::Str(Rc::from(s))
    }

    fn truthy(&self) -> bool {
        !matches!(self, Val::Nil | Val::Bool(false))
    }

    fn type_name(&self) -> &'static str {
        match self {
            Val::Nil => "nil",
            Val::Bool(_) => "boolean",
            Val::Num(_) => "number",
            Val::Str(_) => "string",
            Val::Table(_) => "table",
            Val::Func(_) => "function",
        }
    }

    pub fn table(entries: Vec<(Key, Val)>) -> Val {
        Val::Table(Rc::new(RefCell::new(Table { entries })))
    }

    /// A decoded JSON value as Lua holds it (JSON null as nil); with `int_keys`, object keys
    /// that are integers become integer keys (the text of a decoded XML element).
    pub fn from_json(v: &Json, int_keys: bool) -> Val {
        match v {
            Json::Null => Val::Nil,
            Json::Bool(b) => Val::Bool(*b),
            Json::Number(n) => Val::Num(n.as_f64().unwrap_or(0.0)),
            Json::String(s) => Val::str(s),
            Json::Array(a) => Val::table(
                a.iter()
                    .enumerate()
                    .map(|(i, x)| (Key::Int(i as i64 + 1), Val::from_json(x, int_keys)))
                    .filter(|(_, v)| !matches!(v, Val::Nil))
                    .collect(),
            ),
            Json::Object(m) => Val::table(
                m.iter()
                    .map(|(k, x)| {
                        let key = match k.parse::<i64>() {
                            Ok(i) if int_keys && i.to_string() == *k => Key::Int(i),
                            _ => Key::Str(k.clone()),
                        };
                        (key, Val::from_json(x, int_keys))
                    })
                    .filter(|(_, v)| !matches!(v, Val::Nil))
                    .collect(),
            ),
        }
    }

    /// As cjson encodes it: a table of 1..n is an array, any other an object.
    pub fn to_json(&self, depth: usize) -> Json {
        match self {
            Val::Nil => Json::Null,
            Val::Bool(b) => Json::Bool(*b),
            Val::Num(n) => number_json(*n),
            Val::Str(s) => Json::String(s.to_string()),
            Val::Func(_) => Json::Null,
            Val::Table(t) if depth > 100 => {
                let _ = t;
                Json::Null
            }
            Val::Table(t) => {
                let t = t.borrow();
                let n = t.len();
                if n > 0 && n as usize == t.entries.len() {
                    let mut items: Vec<(i64, Json)> = t
                        .entries
                        .iter()
                        .filter_map(|(k, v)| match k {
                            Key::Int(i) => Some((*i, v.to_json(depth + 1))),
                            Key::Str(_) => None,
                        })
                        .collect();
                    items.sort_by_key(|(i, _)| *i);
                    Json::Array(items.into_iter().map(|(_, v)| v).collect())
                } else {
                    Json::Object(
                        t.entries
                            .iter()
                            .map(|(k, v)| {
                                let k = match k {
                                    Key::Int(i) => i.to_string(),
                                    Key::Str(s) => s.clone(),
                                };
                                (k, v.to_json(depth + 1))
                            })
                            .collect(),
                    )
                }
            }
        }
    }
}

fn number_json(n: f64) -> Json {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        Json::from(n as i64)
    } else {
        serde_json::Number::from_f64(n).map_or(Json::Null, Json::Number)
    }
}

fn key_of(v: &Val) -> Option<Key> {
    match v {
        Val::Num(n) if n.fract() == 0.0 => Some(Key::Int(*n as i64)),
        Val::Num(n) => Some(Key::Str(lua_fmt::number(*n))),
        Val::Str(s) => Some(Key::Str(s.to_string())),
        Val::Bool(b) => Some(Key::Str(b.to_string())),
        _ => None,
    }
}

fn key_val(k: &Key) -> Val {
    match k {
        Key::Int(i) => Val::Num(*i as f64),
        Key::Str(s) => Val::str(s),
    }
}

/// Lua's `tostring`.
pub fn tostring(v: &Val) -> String {
    match v {
        Val::Nil => "nil".into(),
        Val::Bool(b) => b.to_string(),
        Val::Num(n) => lua_fmt::number(*n),
        Val::Str(s) => s.to_string(),
        Val::Table(t) => format!("table: {:p}", Rc::as_ptr(t)),
        Val::Func(f) => format!("builtin: {f:?}"),
    }
}

fn tonumber(v: &Val) -> Option<f64> {
    match v {
        Val::Num(n) => Some(*n),
        Val::Str(s) => lua_fmt::tonumber(s),
        _ => None,
    }
}

/// What the template's `{{ }}` does: HTML-escapes the value's text, nil as nothing.
pub fn escape_html(v: &Val) -> String {
    let s = match v {
        Val::Nil => return String::new(),
        other => tostring(other),
    };
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '/' => out.push_str("&#47;"),
            c => out.push(c),
        }
    }
    out
}

fn escape_xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\'', "&apos;")
        .replace('"', "&quot;")
}

// ---------------------------------------------------------------- running

/// A lookup the template's globals fall back to (`_ctx.var.*`).
pub trait Globals {
    fn global(&self, name: &str) -> Val;
}

pub struct Machine<'g> {
    scopes: Vec<Vec<(String, Val)>>,
    globals: Table,
    fallback: &'g dyn Globals,
    steps: u64,
    pub out: String,
    max_out: usize,
    texts: Vec<String>,
}

enum Flow {
    Normal,
    Break,
    Return,
}

type RResult<T> = Result<T, String>;

impl<'g> Machine<'g> {
    pub fn new(fallback: &'g dyn Globals, max_out: usize) -> Machine<'g> {
        let mut globals = Table::default();
        let lib = |entries: &[(&str, Builtin)]| {
            Val::table(
                entries
                    .iter()
                    .map(|(n, f)| (Key::Str((*n).into()), Val::Func(*f)))
                    .collect(),
            )
        };
        for (n, f) in [
            ("_escape_xml", Builtin::EscapeXml),
            ("_escape_json", Builtin::EscapeJson),
            ("ipairs", Builtin::Ipairs),
            ("pairs", Builtin::Pairs),
            ("next", Builtin::Next),
            ("tostring", Builtin::Tostring),
            ("tonumber", Builtin::Tonumber),
            ("type", Builtin::Type),
            ("select", Builtin::Select),
            ("require", Builtin::Require),
        ] {
            globals.set(Key::Str(n.into()), Val::Func(f));
        }
        globals.set(Key::Str("string".into()), string_lib());
        globals.set(
            Key::Str("table".into()),
            lib(&[
                ("concat", Builtin::TabConcat),
                ("insert", Builtin::TabInsert),
            ]),
        );
        globals.set(
            Key::Str("math".into()),
            lib(&[
                ("floor", Builtin::MathFloor),
                ("ceil", Builtin::MathCeil),
                ("max", Builtin::MathMax),
                ("min", Builtin::MathMin),
                ("abs", Builtin::MathAbs),
            ]),
        );
        Machine {
            scopes: Vec::new(),
            globals,
            fallback,
            steps: 0,
            out: String::new(),
            max_out,
            texts: Vec::new(),
        }
    }

    /// Installs the template writers under these names, with the template's texts.
    pub fn set_texts(&mut self, texts: &[String], text: &str, escaped: &str, raw: &str) {
        self.texts = texts.to_vec();
        self.set_global(text, Val::Func(Builtin::WriteText));
        self.set_global(escaped, Val::Func(Builtin::WriteEscaped));
        self.set_global(raw, Val::Func(Builtin::WriteRaw));
    }

    pub fn set_global(&mut self, name: &str, v: Val) {
        self.globals.set(Key::Str(name.into()), v);
    }

    fn step(&mut self) -> RResult<()> {
        self.steps += 1;
        if self.steps > MAX_STEPS {
            return Err("the template ran too long".into());
        }
        Ok(())
    }

    pub fn emit(&mut self, s: &str) -> RResult<()> {
        if self.out.len() + s.len() > self.max_out {
            return Err("the template's output is too large".into());
        }
        self.out.push_str(s);
        Ok(())
    }

    fn lookup(&self, name: &str) -> Val {
        for scope in self.scopes.iter().rev() {
            if let Some((_, v)) = scope.iter().rev().find(|(n, _)| n == name) {
                return v.clone();
            }
        }
        match self.globals.get(&Key::Str(name.into())) {
            Val::Nil => self.fallback.global(name),
            v => v,
        }
    }

    fn assign(&mut self, name: &str, v: Val) {
        for scope in self.scopes.iter_mut().rev() {
            if let Some(slot) = scope.iter_mut().rev().find(|(n, _)| n == name) {
                slot.1 = v;
                return;
            }
        }
        self.globals.set(Key::Str(name.into()), v);
    }

    pub fn run(&mut self, block: &[Stat]) -> RResult<()> {
        self.block(block).map(|_| ())
    }

    fn block(&mut self, block: &[Stat]) -> RResult<Flow> {
        self.scopes.push(Vec::new());
        let r = self.stats(block);
        self.scopes.pop();
        r
    }

    fn stats(&mut self, block: &[Stat]) -> RResult<Flow> {
        for s in block {
            match self.stat(s)? {
                Flow::Normal => {}
                other => return Ok(other),
            }
        }
        Ok(Flow::Normal)
    }

    fn stat(&mut self, s: &Stat) -> RResult<Flow> {
        self.step()?;
        match s {
            Stat::Local(names, exprs) => {
                let vals = self.values(exprs)?;
                for (i, n) in names.iter().enumerate() {
                    let v = vals.get(i).cloned().unwrap_or(Val::Nil);
                    if let Some(scope) = self.scopes.last_mut() {
                        scope.push((n.clone(), v));
                    }
                }
            }
            Stat::Assign(targets, exprs) => {
                let vals = self.values(exprs)?;
                for (i, t) in targets.iter().enumerate() {
                    let v = vals.get(i).cloned().unwrap_or(Val::Nil);
                    match t {
                        Expr::Name(n) => self.assign(n, v),
                        Expr::Index(obj, key) => {
                            let o = self.eval(obj)?;
                            let k = self.eval(key)?;
                            let Val::Table(t) = o else {
                                return Err(format!("attempt to index a {} value", o.type_name()));
                            };
                            let k = key_of(&k).ok_or("table index is nil")?;
                            t.borrow_mut().set(k, v);
                        }
                        _ => return Err("cannot assign".into()),
                    }
                }
            }
            Stat::Call(e) => {
                self.eval_multi(e)?;
            }
            Stat::If(arms, otherwise) => {
                for (c, body) in arms {
                    if self.eval(c)?.truthy() {
                        return self.block(body);
                    }
                }
                if let Some(b) = otherwise {
                    return self.block(b);
                }
            }
            Stat::NumFor(var, from, to, step, body) => {
                let num = |m: &mut Self, e: &Expr, what: &str| -> RResult<f64> {
                    tonumber(&m.eval(e)?).ok_or_else(|| format!("'for' {what} must be a number"))
                };
                let (a, b) = (num(self, from, "initial value")?, num(self, to, "limit")?);
                let st = match step {
                    Some(s) => num(self, s, "step")?,
                    None => 1.0,
                };
                if st == 0.0 {
                    return Err("'for' step is zero".into());
                }
                let mut i = a;
                while (st > 0.0 && i <= b) || (st < 0.0 && i >= b) {
                    self.scopes.push(vec![(var.clone(), Val::Num(i))]);
                    let f = self.block(body);
                    self.scopes.pop();
                    match f? {
                        Flow::Break => break,
                        Flow::Return => return Ok(Flow::Return),
                        Flow::Normal => {}
                    }
                    i += st;
                    self.step()?;
                }
            }
            Stat::GenFor(names, exprs, body) => {
                let vals = self.values(exprs)?;
                let f = vals.first().cloned().unwrap_or(Val::Nil);
                let state = vals.get(1).cloned().unwrap_or(Val::Nil);
                let mut ctl = vals.get(2).cloned().unwrap_or(Val::Nil);
                loop {
                    self.step()?;
                    let r = self.call(&f, vec![state.clone(), ctl.clone()])?;
                    let first = r.first().cloned().unwrap_or(Val::Nil);
                    if matches!(first, Val::Nil) {
                        break;
                    }
                    ctl = first;
                    let scope = names
                        .iter()
                        .enumerate()
                        .map(|(i, n)| (n.clone(), r.get(i).cloned().unwrap_or(Val::Nil)))
                        .collect();
                    self.scopes.push(scope);
                    let fl = self.block(body);
                    self.scopes.pop();
                    match fl? {
                        Flow::Break => break,
                        Flow::Return => return Ok(Flow::Return),
                        Flow::Normal => {}
                    }
                }
            }
            Stat::While(c, body) => {
                while self.eval(c)?.truthy() {
                    match self.block(body)? {
                        Flow::Break => break,
                        Flow::Return => return Ok(Flow::Return),
                        Flow::Normal => {}
                    }
                }
            }
            Stat::Do(body) => return self.block(body),
            Stat::Break => return Ok(Flow::Break),
            Stat::Return => return Ok(Flow::Return),
        }
        Ok(Flow::Normal)
    }

    fn values(&mut self, exprs: &[Expr]) -> RResult<Vec<Val>> {
        let mut out = Vec::new();
        for (i, e) in exprs.iter().enumerate() {
            if i + 1 == exprs.len() {
                out.extend(self.eval_multi(e)?);
            } else {
                out.push(self.eval(e)?);
            }
        }
        Ok(out)
    }

    /// An expression's values (a call gives all its results).
    fn eval_multi(&mut self, e: &Expr) -> RResult<Vec<Val>> {
        match e {
            Expr::Call(f, args) => {
                let fv = self.eval(f)?;
                if !matches!(fv, Val::Func(_)) {
                    return Err(format!(
                        "attempt to call {} (a {} value)",
                        describe(f),
                        fv.type_name()
                    ));
                }
                let a = self.values(args)?;
                self.call(&fv, a)
            }
            Expr::Method(obj, name, args) => {
                let o = self.eval(obj)?;
                let f = match &o {
                    Val::Str(_) => string_lib_get(name),
                    Val::Table(t) => t.borrow().get(&Key::Str(name.clone())),
                    _ => Val::Nil,
                };
                if !matches!(f, Val::Func(_)) {
                    return Err(format!(
                        "attempt to call method '{name}' (a {} value)",
                        f.type_name()
                    ));
                }
                let mut a = vec![o];
                a.extend(self.values(args)?);
                self.call(&f, a)
            }
            other => Ok(vec![self.eval(other)?]),
        }
    }

    pub fn eval(&mut self, e: &Expr) -> RResult<Val> {
        self.step()?;
        Ok(match e {
            Expr::Nil => Val::Nil,
            Expr::True => Val::Bool(true),
            Expr::False => Val::Bool(false),
            Expr::Num(n) => Val::Num(*n),
            Expr::Str(s) => Val::str(s),
            Expr::Name(n) => self.lookup(n),
            Expr::Index(obj, key) => {
                let o = self.eval(obj)?;
                let k = self.eval(key)?;
                index(&o, &k)
                    .map_err(|t| format!("attempt to index {} (a {t} value)", describe(obj)))?
            }
            Expr::Call(..) | Expr::Method(..) => {
                self.eval_multi(e)?.into_iter().next().unwrap_or(Val::Nil)
            }
            Expr::Un(op, x) => {
                let v = self.eval(x)?;
                match *op {
                    "not" => Val::Bool(!v.truthy()),
                    "-" => Val::Num(-tonumber(&v).ok_or_else(|| {
                        format!(
                            "attempt to perform arithmetic on {} (a {} value)",
                            describe(x),
                            v.type_name()
                        )
                    })?),
                    _ => match &v {
                        Val::Str(s) => Val::Num(s.len() as f64),
                        Val::Table(t) => Val::Num(t.borrow().len() as f64),
                        other => {
                            return Err(format!(
                                "attempt to get length of {} (a {} value)",
                                describe(x),
                                other.type_name()
                            ))
                        }
                    },
                }
            }
            Expr::Bin("and", l, r) => {
                let a = self.eval(l)?;
                if a.truthy() {
                    self.eval(r)?
                } else {
                    a
                }
            }
            Expr::Bin("or", l, r) => {
                let a = self.eval(l)?;
                if a.truthy() {
                    a
                } else {
                    self.eval(r)?
                }
            }
            Expr::Bin(op, l, r) => {
                let a = self.eval(l)?;
                let b = self.eval(r)?;
                binary(op, &a, &b, l, r)?
            }
            Expr::Table(items) => {
                let mut t = Table::default();
                let mut n = 0;
                for (i, (k, v)) in items.iter().enumerate() {
                    match k {
                        Some(k) => {
                            let k = self.eval(k)?;
                            let v = self.eval(v)?;
                            t.set(key_of(&k).ok_or("table index is nil")?, v);
                        }
                        None if i + 1 == items.len() => {
                            for v in self.eval_multi(v)? {
                                n += 1;
                                t.set(Key::Int(n), v);
                            }
                        }
                        None => {
                            n += 1;
                            let v = self.eval(v)?;
                            t.set(Key::Int(n), v);
                        }
                    }
                }
                Val::Table(Rc::new(RefCell::new(t)))
            }
        })
    }

    fn call(&mut self, f: &Val, args: Vec<Val>) -> RResult<Vec<Val>> {
        let Val::Func(b) = f else {
            return Err(format!("attempt to call a {} value", f.type_name()));
        };
        let arg = |i: usize| args.get(i).cloned().unwrap_or(Val::Nil);
        let text = |i: usize, fname: &str| -> RResult<String> {
            match arg(i) {
                Val::Str(s) => Ok(s.to_string()),
                Val::Num(n) => Ok(lua_fmt::number(n)),
                other => Err(format!(
                    "bad argument #{} to '{fname}' (string expected, got {})",
                    i + 1,
                    if matches!(other, Val::Nil) {
                        "no value"
                    } else {
                        other.type_name()
                    }
                )),
            }
        };
        let int = |i: usize, fname: &str| -> RResult<i64> {
            tonumber(&arg(i)).map(|n| n.floor() as i64).ok_or_else(|| {
                format!(
                    "bad argument #{} to '{fname}' (number expected, got {})",
                    i + 1,
                    arg(i).type_name()
                )
            })
        };
        let one = |v: Val| Ok(vec![v]);
        match b {
            Builtin::WriteText => {
                let i = tonumber(&arg(0)).unwrap_or(0.0) as usize;
                let t = self.texts.get(i).cloned().unwrap_or_default();
                self.emit(&t)?;
                Ok(Vec::new())
            }
            Builtin::WriteEscaped => {
                self.emit(&escape_html(&arg(0)))?;
                Ok(Vec::new())
            }
            Builtin::WriteRaw => {
                let v = arg(0);
                let t = if matches!(v, Val::Nil) {
                    String::new()
                } else {
                    tostring(&v)
                };
                self.emit(&t)?;
                Ok(Vec::new())
            }
            Builtin::Require => one(module(&text(0, "require")?)?),
            Builtin::JsonEncode => one(Val::str(&lua_fmt::cjson_encode(&arg(0).to_json(0)))),
            Builtin::JsonDecode | Builtin::JsonDecodeSafe => {
                let src = text(0, "decode")?;
                match serde_json::from_str::<Json>(&src) {
                    Ok(v) => one(Val::from_json(&v, false)),
                    Err(e) if *b == Builtin::JsonDecodeSafe => {
                        Ok(vec![Val::Nil, Val::str(&json_error(&e))])
                    }
                    Err(e) => Err(json_error(&e)),
                }
            }
            Builtin::YamlLoad => {
                let src = text(0, "load")?;
                match serde_yaml::from_str::<Json>(&src) {
                    Ok(v) => one(Val::from_json(&v, false)),
                    Err(e) => Err(format!("failed to parse YAML: {e}")),
                }
            }
            Builtin::EscapeXml => one(Val::str(&escape_xml(&text(0, "_escape_xml")?))),
            Builtin::EscapeJson => one(Val::str(&lua_fmt::cjson_encode(&arg(0).to_json(0)))),
            Builtin::Ipairs => match arg(0) {
                t @ Val::Table(_) => Ok(vec![Val::Func(Builtin::IpairsIter), t, Val::Num(0.0)]),
                other => Err(format!(
                    "bad argument #1 to 'ipairs' (table expected, got {})",
                    if matches!(other, Val::Nil) {
                        "nil"
                    } else {
                        other.type_name()
                    }
                )),
            },
            Builtin::IpairsIter => {
                let i = tonumber(&arg(1)).unwrap_or(0.0) as i64 + 1;
                match index(&arg(0), &Val::Num(i as f64)).unwrap_or(Val::Nil) {
                    Val::Nil => one(Val::Nil),
                    v => Ok(vec![Val::Num(i as f64), v]),
                }
            }
            Builtin::Pairs => match arg(0) {
                t @ Val::Table(_) => Ok(vec![Val::Func(Builtin::Next), t, Val::Nil]),
                other => Err(format!(
                    "bad argument #1 to 'pairs' (table expected, got {})",
                    if matches!(other, Val::Nil) {
                        "nil"
                    } else {
                        other.type_name()
                    }
                )),
            },
            Builtin::Next => {
                let Val::Table(t) = arg(0) else {
                    return Err("bad argument #1 to 'next' (table expected)".into());
                };
                let t = t.borrow();
                let pos = match key_of(&arg(1)) {
                    None => 0,
                    Some(k) => match t.entries.iter().position(|(x, _)| *x == k) {
                        Some(p) => p + 1,
                        None => return Err("invalid key to 'next'".into()),
                    },
                };
                match t.entries.get(pos) {
                    Some((k, v)) => Ok(vec![key_val(k), v.clone()]),
                    None => one(Val::Nil),
                }
            }
            Builtin::Tostring => one(Val::str(&tostring(&arg(0)))),
            Builtin::Tonumber => one(tonumber(&arg(0)).map_or(Val::Nil, Val::Num)),
            Builtin::Type => one(Val::str(arg(0).type_name())),
            Builtin::Select => match arg(0) {
                Val::Str(s) if &*s == "#" => one(Val::Num((args.len() - 1) as f64)),
                _ => {
                    let n = int(0, "select")?.max(1) as usize;
                    Ok(args.into_iter().skip(n).collect())
                }
            },
            Builtin::StrLen => one(Val::Num(text(0, "len")?.len() as f64)),
            Builtin::StrSub => {
                let s = text(0, "sub")?;
                let len = s.len() as i64;
                let norm = |i: i64| {
                    if i < 0 {
                        (len + i + 1).max(1)
                    } else {
                        i.max(1)
                    }
                };
                let from = norm(int(1, "sub").unwrap_or(1));
                let to = match arg(2) {
                    Val::Nil => len,
                    _ => {
                        let t = int(2, "sub")?;
                        if t < 0 {
                            len + t + 1
                        } else {
                            t.min(len)
                        }
                    }
                };
                let out = if from > to {
                    String::new()
                } else {
                    String::from_utf8_lossy(&s.as_bytes()[(from - 1) as usize..to as usize])
                        .into_owned()
                };
                one(Val::str(&out))
            }
            Builtin::StrUpper => one(Val::str(&text(0, "upper")?.to_uppercase())),
            Builtin::StrLower => one(Val::str(&text(0, "lower")?.to_lowercase())),
            Builtin::StrReverse => one(Val::str(
                &text(0, "reverse")?.chars().rev().collect::<String>(),
            )),
            Builtin::StrRep => {
                let s = text(0, "rep")?;
                let n = int(1, "rep")?.max(0) as usize;
                if s.len().saturating_mul(n) > self.max_out {
                    return Err("the template's output is too large".into());
                }
                one(Val::str(&s.repeat(n)))
            }
            Builtin::StrFormat => one(Val::str(&format_lua(&args)?)),
            Builtin::StrFind => {
                let s = text(0, "find")?;
                let p = text(1, "find")?;
                let init = match arg(2) {
                    Val::Nil => 1,
                    _ => int(2, "find")?.max(1),
                } as usize;
                match s.get(init - 1..).and_then(|rest| rest.find(&p)) {
                    Some(i) => {
                        let start = init - 1 + i;
                        Ok(vec![
                            Val::Num((start + 1) as f64),
                            Val::Num((start + p.len()) as f64),
                        ])
                    }
                    None => one(Val::Nil),
                }
            }
            Builtin::StrGsub => {
                let s = text(0, "gsub")?;
                let p = text(1, "gsub")?;
                let r = text(2, "gsub")?;
                if p.is_empty() || p.bytes().any(|c| b"^$()%.[]*+-?".contains(&c)) {
                    return Err("string.gsub: only plain text patterns are supported".into());
                }
                let n = s.matches(&p).count();
                Ok(vec![Val::str(&s.replace(&p, &r)), Val::Num(n as f64)])
            }
            Builtin::TabConcat => {
                let Val::Table(t) = arg(0) else {
                    return Err("bad argument #1 to 'concat' (table expected)".into());
                };
                let sep = match arg(1) {
                    Val::Nil => String::new(),
                    _ => text(1, "concat")?,
                };
                let t = t.borrow();
                let mut parts = Vec::new();
                for i in 1..=t.len() {
                    match t.get(&Key::Int(i)) {
                        Val::Str(s) => parts.push(s.to_string()),
                        Val::Num(n) => parts.push(lua_fmt::number(n)),
                        other => {
                            return Err(format!(
                                "invalid value (at index {i}) in table for 'concat' (a {} value)",
                                other.type_name()
                            ))
                        }
                    }
                }
                one(Val::str(&parts.join(&sep)))
            }
            Builtin::TabInsert => {
                let Val::Table(t) = arg(0) else {
                    return Err("bad argument #1 to 'insert' (table expected)".into());
                };
                let mut t = t.borrow_mut();
                let n = t.len();
                if args.len() >= 3 {
                    let pos = int(1, "insert")?;
                    for i in (pos..=n).rev() {
                        let v = t.get(&Key::Int(i));
                        t.set(Key::Int(i + 1), v);
                    }
                    t.set(Key::Int(pos), arg(2));
                } else {
                    t.set(Key::Int(n + 1), arg(1));
                }
                Ok(Vec::new())
            }
            Builtin::MathFloor => one(Val::Num(num_arg(&arg(0), "floor")?.floor())),
            Builtin::MathCeil => one(Val::Num(num_arg(&arg(0), "ceil")?.ceil())),
            Builtin::MathAbs => one(Val::Num(num_arg(&arg(0), "abs")?.abs())),
            Builtin::MathMax | Builtin::MathMin => {
                let mut best = num_arg(&arg(0), "max")?;
                for a in &args[1..] {
                    let x = num_arg(a, "max")?;
                    if (*b == Builtin::MathMax && x > best) || (*b == Builtin::MathMin && x < best)
                    {
                        best = x;
                    }
                }
                one(Val::Num(best))
            }
        }
    }
}

fn num_arg(v: &Val, f: &str) -> RResult<f64> {
    tonumber(v).ok_or_else(|| {
        format!(
            "bad argument #1 to '{f}' (number expected, got {})",
            v.type_name()
        )
    })
}

fn string_lib_get(name: &str) -> Val {
    match string_lib() {
        Val::Table(t) => t.borrow().get(&Key::Str(name.into())),
        _ => Val::Nil,
    }
}

/// A table of functions by name.
fn functions(entries: &[(&str, Builtin)]) -> Val {
    Val::table(
        entries
            .iter()
            .map(|(n, f)| (Key::Str((*n).into()), Val::Func(*f)))
            .collect(),
    )
}

/// What `require(name)` gives.
fn module(name: &str) -> RResult<Val> {
    Ok(match name {
        "cjson" => functions(&[
            ("encode", Builtin::JsonEncode),
            ("decode", Builtin::JsonDecode),
        ]),
        "cjson.safe" => functions(&[
            ("encode", Builtin::JsonEncode),
            ("decode", Builtin::JsonDecodeSafe),
        ]),
        "apisix.core" => Val::table(vec![(
            Key::Str("json".into()),
            functions(&[
                ("encode", Builtin::JsonEncode),
                ("decode", Builtin::JsonDecodeSafe),
            ]),
        )]),
        "tinyyaml" => functions(&[("parse", Builtin::YamlLoad)]),
        "lyaml" => functions(&[("load", Builtin::YamlLoad)]),
        _ => return Err(format!("module '{name}' not found")),
    })
}

/// cjson's message for JSON it cannot decode.
fn json_error(e: &serde_json::Error) -> String {
    format!(
        "Expected value but found invalid token at character {}",
        e.column().max(1)
    )
}

fn string_lib() -> Val {
    Val::table(
        [
            ("len", Builtin::StrLen),
            ("sub", Builtin::StrSub),
            ("upper", Builtin::StrUpper),
            ("lower", Builtin::StrLower),
            ("rep", Builtin::StrRep),
            ("reverse", Builtin::StrReverse),
            ("format", Builtin::StrFormat),
            ("find", Builtin::StrFind),
            ("gsub", Builtin::StrGsub),
        ]
        .iter()
        .map(|(n, f)| (Key::Str((*n).into()), Val::Func(*f)))
        .collect(),
    )
}

fn format_lua(args: &[Val]) -> RResult<String> {
    let fmt = match args.first() {
        Some(Val::Str(s)) => s.to_string(),
        _ => return Err("bad argument #1 to 'format' (string expected)".into()),
    };
    let mut out = String::new();
    let mut next = 1;
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let spec = chars.next().ok_or("invalid conversion '%' to 'format'")?;
        if spec == '%' {
            out.push('%');
            continue;
        }
        let v = args.get(next).cloned().unwrap_or(Val::Nil);
        next += 1;
        match spec {
            's' => out.push_str(&tostring(&v)),
            'd' | 'i' => out.push_str(&(num_arg(&v, "format")? as i64).to_string()),
            'f' => out.push_str(&format!("{:.6}", num_arg(&v, "format")?)),
            'q' => out.push_str(&lua_fmt::quote(&tostring(&v))),
            other => return Err(format!("invalid conversion '%{other}' to 'format'")),
        }
    }
    Ok(out)
}

fn describe(e: &Expr) -> String {
    match e {
        Expr::Name(n) => format!("global '{n}'"),
        Expr::Index(_, k) => match &**k {
            Expr::Str(s) => format!("field '{s}'"),
            _ => "a value".to_owned(),
        },
        _ => "a value".to_owned(),
    }
}

fn index(o: &Val, k: &Val) -> Result<Val, &'static str> {
    match o {
        Val::Table(t) => Ok(key_of(k).map_or(Val::Nil, |k| t.borrow().get(&k))),
        Val::Str(_) => Ok(match k {
            Val::Str(name) => string_lib_get(name),
            _ => Val::Nil,
        }),
        other => Err(other.type_name()),
    }
}

fn binary(op: &str, a: &Val, b: &Val, l: &Expr, r: &Expr) -> RResult<Val> {
    let arith = |f: fn(f64, f64) -> f64| -> RResult<Val> {
        match (tonumber(a), tonumber(b)) {
            (Some(x), Some(y)) => Ok(Val::Num(f(x, y))),
            (None, _) => Err(format!(
                "attempt to perform arithmetic on {} (a {} value)",
                describe(l),
                a.type_name()
            )),
            _ => Err(format!(
                "attempt to perform arithmetic on {} (a {} value)",
                describe(r),
                b.type_name()
            )),
        }
    };
    let cmp = || -> RResult<std::cmp::Ordering> {
        match (a, b) {
            (Val::Num(x), Val::Num(y)) => x.partial_cmp(y).ok_or_else(|| "NaN".to_string()),
            (Val::Str(x), Val::Str(y)) => Ok(x.cmp(y)),
            _ => Err(format!(
                "attempt to compare {} with {}",
                a.type_name(),
                b.type_name()
            )),
        }
    };
    Ok(match op {
        "+" => arith(|x, y| x + y)?,
        "-" => arith(|x, y| x - y)?,
        "*" => arith(|x, y| x * y)?,
        "/" => arith(|x, y| x / y)?,
        "%" => arith(|x, y| x - (x / y).floor() * y)?,
        "^" => arith(f64::powf)?,
        ".." => {
            let part = |v: &Val, e: &Expr| -> RResult<String> {
                match v {
                    Val::Str(s) => Ok(s.to_string()),
                    Val::Num(n) => Ok(lua_fmt::number(*n)),
                    other => Err(format!(
                        "attempt to concatenate {} (a {} value)",
                        describe(e),
                        other.type_name()
                    )),
                }
            };
            Val::str(&(part(a, l)? + &part(b, r)?))
        }
        "==" => Val::Bool(equal(a, b)),
        "~=" => Val::Bool(!equal(a, b)),
        "<" => Val::Bool(cmp()?.is_lt()),
        "<=" => Val::Bool(cmp()?.is_le()),
        ">" => Val::Bool(cmp()?.is_gt()),
        ">=" => Val::Bool(cmp()?.is_ge()),
        other => return Err(format!("unsupported operator '{other}'")),
    })
}

fn equal(a: &Val, b: &Val) -> bool {
    match (a, b) {
        (Val::Nil, Val::Nil) => true,
        (Val::Bool(x), Val::Bool(y)) => x == y,
        (Val::Num(x), Val::Num(y)) => x == y,
        (Val::Str(x), Val::Str(y)) => x == y,
        (Val::Table(x), Val::Table(y)) => Rc::ptr_eq(x, y),
        (Val::Func(x), Val::Func(y)) => x == y,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoGlobals;

    impl Globals for NoGlobals {
        fn global(&self, _: &str) -> Val {
            Val::Nil
        }
    }

    fn eval(src: &str) -> Result<String, String> {
        let mut m = Machine::new(&NoGlobals, 1 << 20);
        let chunk = parse_chunk(&format!("__r = {src}"))?;
        m.run(&chunk)?;
        Ok(tostring(&m.lookup("__r")))
    }

    #[test]
    fn expressions() {
        assert_eq!(eval("1 + 2 * 3").unwrap(), "7");
        assert_eq!(eval("\"a\" .. 1 .. \"b\"").unwrap(), "a1b");
        assert_eq!(eval("2 ^ 3 ^ 2").unwrap(), "512");
        assert_eq!(eval("not nil and 1 or 2").unwrap(), "1");
        assert_eq!(eval("#{1, 2, 3}").unwrap(), "3");
        assert_eq!(eval("(\"abc\"):upper()").unwrap(), "ABC");
        assert_eq!(
            eval("string.gsub(\"a not b\", \"not \", \"\")").unwrap(),
            "a b"
        );
        assert_eq!(eval("string.format(\"%s=%d\", \"x\", 3.7)").unwrap(), "x=3");
        assert_eq!(eval("_escape_json({a = {1, 2}})").unwrap(), "{\"a\":[1,2]}");
        assert!(eval("name()")
            .unwrap_err()
            .contains("attempt to call global 'name'"));
        assert!(eval("x.y")
            .unwrap_err()
            .contains("attempt to index global 'x'"));
    }

    #[test]
    fn statements_and_bounds() {
        let mut m = Machine::new(&NoGlobals, 1 << 20);
        let chunk = parse_chunk(
            "local s = 0 for i = 1, 10 do if i % 2 == 0 then s = s + i elseif i == 5 then \
             break end end r = s for _, v in ipairs({\"a\", \"b\"}) do r = r .. v end",
        )
        .unwrap();
        m.run(&chunk).unwrap();
        assert_eq!(tostring(&m.lookup("r")), "6ab");
        let mut m = Machine::new(&NoGlobals, 1 << 20);
        let forever = parse_chunk("while true do end").unwrap();
        assert_eq!(m.run(&forever).unwrap_err(), "the template ran too long");
        assert!(parse_chunk("local function f() end").is_err());
        assert!(parse_chunk("if x then").is_err());
    }
}
