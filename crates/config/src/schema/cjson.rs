//! Request-body decoding as APISIX does it (lua-cjson under LuaJIT), with lua-cjson's error texts.
//!
//! APISIX answers an undecodable body with `invalid request body: <decoder error>` (and plugins
//! such as request-validation with the bare decoder error), and clients
//! compare that text (`Expected object key string but found invalid token at character 2`). This
//! decoder walks the input with lua-cjson's tokenizer rules so that the first error, its wording
//! and its 1-based position match. It also accepts what lua-cjson accepts and serde_json does not
//! (hexadecimal and `+`-signed numbers, leading zeros, a NUL byte ending the document), and it
//! never recurses: nesting is tracked on a heap stack and refused past lua-cjson's depth limit,
//! so a hostile body cannot overflow the thread's stack.

use serde_json::{Map, Number, Value};

/// lua-cjson's `decode_max_depth` default.
const MAX_DEPTH: usize = 1000;

/// Decodes `input` as lua-cjson would. The error is lua-cjson's message.
pub fn decode(input: &[u8]) -> Result<Value, String> {
    // lua-cjson looks at the first two bytes to refuse UTF-16/UTF-32 input.
    if input.len() >= 2 && (input[0] == 0 || input[1] == 0) {
        return Err("JSON parser does not support UTF-16 or UTF-32".to_string());
    }
    Parser {
        data: input,
        pos: 0,
        depth: 0,
    }
    .run()
}

#[derive(Debug)]
enum Kind {
    ObjBegin,
    ObjEnd,
    ArrBegin,
    ArrEnd,
    Str(String),
    Num(f64),
    Bool(bool),
    Null,
    Colon,
    Comma,
    End,
    /// lua-cjson's `T_ERROR` with its description.
    Error(&'static str),
}

impl Kind {
    /// lua-cjson's `json_token_type_name`.
    fn name(&self) -> &'static str {
        match self {
            Kind::ObjBegin => "T_OBJ_BEGIN",
            Kind::ObjEnd => "T_OBJ_END",
            Kind::ArrBegin => "T_ARR_BEGIN",
            Kind::ArrEnd => "T_ARR_END",
            Kind::Str(_) => "T_STRING",
            Kind::Num(_) => "T_NUMBER",
            Kind::Bool(_) => "T_BOOLEAN",
            Kind::Null => "T_NULL",
            Kind::Colon => "T_COLON",
            Kind::Comma => "T_COMMA",
            Kind::End => "T_END",
            Kind::Error(e) => e,
        }
    }
}

struct Token {
    kind: Kind,
    /// 0-based offset where the token (or the error) starts.
    index: usize,
}

enum Frame {
    Array(Vec<Value>),
    Object(Map<String, Value>, String),
}

struct Parser<'a> {
    data: &'a [u8],
    pos: usize,
    depth: usize,
}

fn parse_error(expected: &str, token: &Token) -> String {
    format!(
        "Expected {expected} but found {} at character {}",
        token.kind.name(),
        token.index + 1
    )
}

impl Parser<'_> {
    /// The byte at `i`, with the C string's NUL terminator past the end.
    fn at(&self, i: usize) -> u8 {
        self.data.get(i).copied().unwrap_or(0)
    }

    fn run(mut self) -> Result<Value, String> {
        let mut stack: Vec<Frame> = Vec::new();
        let mut token = self.next_token();
        loop {
            // Parse one value starting at `token`; containers push a frame and go round again.
            let mut value = match token.kind {
                Kind::Str(s) => Value::String(s),
                Kind::Num(n) => number_value(n, &token)?,
                Kind::Bool(b) => Value::Bool(b),
                Kind::Null => Value::Null,
                Kind::ObjBegin => {
                    self.descend()?;
                    let t = self.next_token();
                    if matches!(t.kind, Kind::ObjEnd) {
                        self.depth -= 1;
                        Value::Object(Map::new())
                    } else {
                        let key = self.object_key(t)?;
                        stack.push(Frame::Object(Map::new(), key));
                        token = self.next_token();
                        continue;
                    }
                }
                Kind::ArrBegin => {
                    self.descend()?;
                    let t = self.next_token();
                    if matches!(t.kind, Kind::ArrEnd) {
                        self.depth -= 1;
                        Value::Array(Vec::new())
                    } else {
                        stack.push(Frame::Array(Vec::new()));
                        token = t;
                        continue;
                    }
                }
                _ => return Err(parse_error("value", &token)),
            };
            // Hand the finished value to its container, closing containers as they end.
            loop {
                match stack.last_mut() {
                    None => {
                        let t = self.next_token();
                        if !matches!(t.kind, Kind::End) {
                            return Err(parse_error("the end", &t));
                        }
                        return Ok(value);
                    }
                    Some(Frame::Array(items)) => {
                        items.push(value);
                        let t = self.next_token();
                        match t.kind {
                            Kind::ArrEnd => {
                                self.depth -= 1;
                                let Some(Frame::Array(items)) = stack.pop() else {
                                    unreachable!("top frame is an array")
                                };
                                value = Value::Array(items);
                            }
                            Kind::Comma => {
                                token = self.next_token();
                                break;
                            }
                            _ => return Err(parse_error("comma or array end", &t)),
                        }
                    }
                    Some(Frame::Object(map, key)) => {
                        // A repeated key overwrites, as Lua's rawset does.
                        map.insert(std::mem::take(key), value);
                        let t = self.next_token();
                        match t.kind {
                            Kind::ObjEnd => {
                                self.depth -= 1;
                                let Some(Frame::Object(map, _)) = stack.pop() else {
                                    unreachable!("top frame is an object")
                                };
                                value = Value::Object(map);
                            }
                            Kind::Comma => {
                                let t = self.next_token();
                                *key = self.object_key(t)?;
                                token = self.next_token();
                                break;
                            }
                            _ => return Err(parse_error("comma or object end", &t)),
                        }
                    }
                }
            }
        }
    }

    /// A key and its colon.
    fn object_key(&mut self, token: Token) -> Result<String, String> {
        let Kind::Str(key) = token.kind else {
            return Err(parse_error("object key string", &token));
        };
        let colon = self.next_token();
        if !matches!(colon.kind, Kind::Colon) {
            return Err(parse_error("colon", &colon));
        }
        Ok(key)
    }

    fn descend(&mut self) -> Result<(), String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(format!(
                "Found too many nested data structures ({}) at character {}",
                self.depth, self.pos
            ));
        }
        Ok(())
    }

    fn next_token(&mut self) -> Token {
        while matches!(self.at(self.pos), b' ' | b'\t' | b'\n' | b'\r') {
            self.pos += 1;
        }
        let index = self.pos;
        let single = |kind| Token { kind, index };
        let ch = self.at(self.pos);
        let kind = match ch {
            0 => return single(Kind::End),
            b'{' => Kind::ObjBegin,
            b'}' => Kind::ObjEnd,
            b'[' => Kind::ArrBegin,
            b']' => Kind::ArrEnd,
            b',' => Kind::Comma,
            b':' => Kind::Colon,
            b'"' => return self.string_token(),
            b'-' | b'0'..=b'9' => return self.number_token(),
            b'f' | b'i' | b'I' | b'n' | b'N' | b't' | b'+' => {
                let rest = &self.data[self.pos..];
                for (word, kind) in [
                    (&b"true"[..], Kind::Bool(true)),
                    (&b"false"[..], Kind::Bool(false)),
                    (&b"null"[..], Kind::Null),
                ] {
                    if rest.starts_with(word) {
                        self.pos += word.len();
                        return single(kind);
                    }
                }
                // lua-cjson's `decode_invalid_numbers` (on by default) hands `+1`, `inf` and
                // `nan` to strtod.
                if self.invalid_number_start() {
                    return self.number_token();
                }
                return single(Kind::Error("invalid token"));
            }
            _ => return single(Kind::Error("invalid token")),
        };
        self.pos += 1;
        single(kind)
    }

    /// lua-cjson's `json_is_invalid_number` for the characters that are not `-` or a digit.
    fn invalid_number_start(&self) -> bool {
        let p = self.pos;
        if self.at(p) == b'+' {
            return true;
        }
        let word: Vec<u8> = (0..3)
            .map(|i| self.at(p + i).to_ascii_lowercase())
            .collect();
        word == b"inf" || word == b"nan"
    }

    fn number_token(&mut self) -> Token {
        let index = self.pos;
        match strtod(self.data, self.pos) {
            Some((value, len)) => {
                self.pos += len;
                Token {
                    kind: Kind::Num(value),
                    index,
                }
            }
            None => Token {
                kind: Kind::Error("invalid number"),
                index,
            },
        }
    }

    fn string_token(&mut self) -> Token {
        let start = self.pos;
        self.pos += 1;
        let mut out: Vec<u8> = Vec::new();
        loop {
            let ch = self.at(self.pos);
            match ch {
                b'"' => break,
                0 => {
                    return Token {
                        kind: Kind::Error("unexpected end of string"),
                        index: self.pos,
                    };
                }
                b'\\' => {
                    let esc = self.at(self.pos + 1);
                    let plain = match esc {
                        b'"' => b'"',
                        b'\\' => b'\\',
                        b'/' => b'/',
                        b'b' => 8,
                        b'f' => 12,
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'u' => match self.unicode_escape() {
                            Some((c, len)) => {
                                let mut buf = [0u8; 4];
                                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                                self.pos += len;
                                continue;
                            }
                            None => {
                                return Token {
                                    kind: Kind::Error("invalid unicode escape code"),
                                    index: self.pos,
                                };
                            }
                        },
                        _ => {
                            return Token {
                                kind: Kind::Error("invalid escape code"),
                                index: self.pos,
                            };
                        }
                    };
                    out.push(plain);
                    self.pos += 2;
                }
                _ => {
                    out.push(ch);
                    self.pos += 1;
                }
            }
        }
        let end = self.pos;
        self.pos += 1;
        let s = match String::from_utf8(out) {
            Ok(s) => s,
            // Lua strings are bytes and lua-cjson copies them as they are; here values are
            // JSON text, and replacing the bytes with U+FFFD would store something the client
            // did not send. Refused as lua-cjson refuses any other bad token, at the first
            // byte that is not UTF-8 (escapes are ASCII, so the raw slice tells where).
            Err(_) => {
                let raw = &self.data[start + 1..end];
                let bad = std::str::from_utf8(raw)
                    .err()
                    .map_or(0, |e| e.valid_up_to());
                return Token {
                    kind: Kind::Error("invalid token"),
                    index: start + 1 + bad,
                };
            }
        };
        Token {
            kind: Kind::Str(s),
            index: start,
        }
    }

    /// `\uXXXX` (with a following low surrogate for a high one) at `self.pos`; the character
    /// and the escape's length.
    fn unicode_escape(&self) -> Option<(char, usize)> {
        let hex4 = |at: usize| -> Option<u32> {
            (0..4).try_fold(0u32, |acc, i| {
                let d = (self.at(at + i) as char).to_digit(16)?;
                Some(acc * 16 + d)
            })
        };
        let first = hex4(self.pos + 2)?;
        if first & 0xF800 != 0xD800 {
            return char::from_u32(first).map(|c| (c, 6));
        }
        if first & 0x400 != 0 {
            return None;
        }
        if self.at(self.pos + 6) != b'\\' || self.at(self.pos + 7) != b'u' {
            return None;
        }
        let low = hex4(self.pos + 8)?;
        if low & 0xFC00 != 0xDC00 {
            return None;
        }
        let code = (((first & 0x3FF) << 10) | (low & 0x3FF)) + 0x10000;
        char::from_u32(code).map(|c| (c, 12))
    }
}

/// A decoded number as a JSON value. Lua numbers are doubles, so an integral value is written
/// as an integer (cjson prints `1.0` as `1`); infinities and NaN have no JSON form.
fn number_value(n: f64, token: &Token) -> Result<Value, String> {
    if !n.is_finite() {
        return Err(parse_error(
            "value",
            &Token {
                kind: Kind::Error("invalid number"),
                index: token.index,
            },
        ));
    }
    if n.fract() == 0.0 && (-9.0e18..9.0e18).contains(&n) {
        return Ok(Value::from(n as i64));
    }
    Ok(Number::from_f64(n).map_or(Value::Null, Value::Number))
}

/// C's `strtod` on the bytes at `start`: the value and how many bytes it used, `None` when no
/// number starts there.
fn strtod(data: &[u8], start: usize) -> Option<(f64, usize)> {
    let at = |i: usize| data.get(i).copied().unwrap_or(0);
    let mut i = start;
    let negative = at(i) == b'-';
    if matches!(at(i), b'+' | b'-') {
        i += 1;
    }
    let sign = if negative { -1.0 } else { 1.0 };
    let lower = |i: usize, n: usize| -> Vec<u8> {
        (0..n).map(|k| at(i + k).to_ascii_lowercase()).collect()
    };
    if lower(i, 3) == b"inf" {
        let len = if lower(i + 3, 5) == b"inity" { 8 } else { 3 };
        return Some((sign * f64::INFINITY, i + len - start));
    }
    if lower(i, 3) == b"nan" {
        let mut j = i + 3;
        if at(j) == b'(' {
            let mut k = j + 1;
            while at(k).is_ascii_alphanumeric() || at(k) == b'_' {
                k += 1;
            }
            if at(k) == b')' {
                j = k + 1;
            }
        }
        return Some((f64::NAN, j - start));
    }
    if at(i) == b'0' && at(i + 1) | 0x20 == b'x' {
        let digits_from = i + 2;
        let hex_ok = at(digits_from).is_ascii_hexdigit()
            || (at(digits_from) == b'.' && at(digits_from + 1).is_ascii_hexdigit());
        if hex_ok {
            let (v, end) = hex_float(data, digits_from);
            return Some((sign * v, end - start));
        }
        // "0x" without digits: strtod reads the "0".
        return Some((0.0, i + 1 - start));
    }
    let mut j = i;
    let mut digits = 0;
    while at(j).is_ascii_digit() {
        j += 1;
        digits += 1;
    }
    if at(j) == b'.' {
        j += 1;
        while at(j).is_ascii_digit() {
            j += 1;
            digits += 1;
        }
    }
    if digits == 0 {
        return None;
    }
    if at(j) | 0x20 == b'e' {
        let mut k = j + 1;
        if matches!(at(k), b'+' | b'-') {
            k += 1;
        }
        if at(k).is_ascii_digit() {
            while at(k).is_ascii_digit() {
                k += 1;
            }
            j = k;
        }
    }
    let text = std::str::from_utf8(&data[i..j]).ok()?;
    // Rust's parser wants a digit before the exponent or after a bare point in some forms.
    let mut owned = text.to_string();
    if owned.starts_with('.') {
        owned.insert(0, '0');
    }
    if let Some(p) = owned.find('.') {
        if !owned[p + 1..].starts_with(|c: char| c.is_ascii_digit()) {
            owned.insert(p + 1, '0');
        }
    }
    let v: f64 = owned.parse().ok()?;
    Some((sign * v, j - start))
}

/// A hexadecimal float body (after `0x`): digits, optional fraction, optional `p` exponent.
fn hex_float(data: &[u8], from: usize) -> (f64, usize) {
    let at = |i: usize| data.get(i).copied().unwrap_or(0);
    let mut j = from;
    let mut v = 0f64;
    while let Some(d) = (at(j) as char).to_digit(16) {
        v = v * 16.0 + f64::from(d);
        j += 1;
    }
    if at(j) == b'.' {
        j += 1;
        let mut scale = 1.0 / 16.0;
        while let Some(d) = (at(j) as char).to_digit(16) {
            v += f64::from(d) * scale;
            scale /= 16.0;
            j += 1;
        }
    }
    if at(j) | 0x20 == b'p' {
        let mut k = j + 1;
        let neg = at(k) == b'-';
        if matches!(at(k), b'+' | b'-') {
            k += 1;
        }
        if at(k).is_ascii_digit() {
            let mut e: i32 = 0;
            while at(k).is_ascii_digit() {
                e = e.saturating_mul(10).saturating_add(i32::from(at(k) - b'0'));
                k += 1;
            }
            v *= 2f64.powi(if neg { -e } else { e });
            j = k;
        }
    }
    (v, j)
}

#[cfg(test)]
mod tests;
