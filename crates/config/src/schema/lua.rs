//! How OpenResty's LuaJIT and lua-cjson print values, so messages built from user input read
//! exactly as APISIX's do.
//!
//! APISIX builds its error texts with `tostring`, `string.format("%q")` and `cjson.encode`; a
//! message that embeds a number or a quoted string only matches byte for byte if it is printed
//! the same way (`1` not `1.0`, `1e+15` not `1000000000000000`, control bytes as `\13`).

use serde_json::Value;

/// Lua's `tostring` of a number (LuaJIT formats numbers with `%.14g`).
pub fn number(x: f64) -> String {
    if x.is_nan() {
        return if x.is_sign_negative() { "-nan" } else { "nan" }.to_string();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    // `%.14g`: 14 significant digits, scientific notation when the decimal exponent is below
    // -4 or at least 14, trailing zeros removed either way.
    let sci = format!("{x:.13e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..14).contains(&exp) {
        let m = strip_fraction_zeros(mantissa);
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{m}e{sign}{:02}", exp.unsigned_abs())
    } else {
        let precision = (13 - exp) as usize;
        strip_fraction_zeros(&format!("{x:.precision$}")).to_string()
    }
}

fn strip_fraction_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// Lua's `tostring` of a JSON number.
pub fn json_number(n: &serde_json::Number) -> String {
    number(n.as_f64().unwrap_or(f64::NAN))
}

/// LuaJIT's `string.format("%q", s)`: double quotes around, `"` `\` and newline escaped with a
/// backslash, other control bytes as the shortest decimal escape (three digits when a digit
/// follows, so the escape cannot swallow it).
pub fn quote(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(bytes.len() + 2);
    out.push(b'"');
    for (i, &c) in bytes.iter().enumerate() {
        match c {
            b'"' | b'\\' | b'\n' => {
                out.push(b'\\');
                out.push(c);
            }
            0..=31 | 127 => {
                out.push(b'\\');
                let next_is_digit = bytes.get(i + 1).is_some_and(|b| b.is_ascii_digit());
                if c >= 100 || next_is_digit {
                    out.extend_from_slice(format!("{c:03}").as_bytes());
                } else {
                    out.extend_from_slice(c.to_string().as_bytes());
                }
            }
            _ => out.push(c),
        }
    }
    out.push(b'"');
    // Only ASCII bytes were inserted, so the result is still UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

/// The Lua `type()` of a value decoded by lua-cjson: every number is a `number`, objects and
/// arrays are `table`, and `null` is the lightuserdata `cjson.null`.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "userdata",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) | Value::Object(_) => "table",
    }
}

/// `cjson.encode` as APISIX configures it (forward slashes not escaped, numbers `%.14g`, an
/// empty table encoded as `{}`).
pub fn cjson_encode(v: &Value) -> String {
    let mut out = String::new();
    encode_into(v, &mut out);
    out
}

fn encode_into(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&json_number(n)),
        Value::String(s) => encode_string(s, out),
        // Lua cannot tell an empty array from an empty object; cjson writes `{}`.
        Value::Array(a) if a.is_empty() => out.push_str("{}"),
        Value::Array(a) => {
            out.push('[');
            for (i, item) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                encode_into(item, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            for (i, (k, item)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                encode_string(k, out);
                out.push(':');
                encode_into(item, out);
            }
            out.push('}');
        }
    }
}

fn encode_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `core.json.encode(v, true)` on a value that is not a table: APISIX's forced encoder first
/// turns userdata (JSON `null`) into its `tostring` text, then encodes that.
pub fn force_encode_scalar(v: &Value) -> String {
    match v {
        Value::Null => cjson_encode(&Value::String("userdata: NULL".to_string())),
        other => cjson_encode(other),
    }
}

/// Lua's `tonumber` on a string: decimal integers and floats (surrounding whitespace allowed)
/// and `0x` hexadecimal integers.
pub fn tonumber(s: &str) -> Option<f64> {
    let t = s.trim_matches(|c: char| c == ' ' || ('\t'..='\r').contains(&c));
    if t.is_empty() {
        return None;
    }
    let (neg, body) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    if let Some(hex) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let v = hex.bytes().fold(0f64, |acc, b| {
            acc * 16.0 + f64::from((b as char).to_digit(16).unwrap_or(0))
        });
        return Some(if neg { -v } else { v });
    }
    // Rust's float parser also takes `inf`, `nan` and `infinity`, which Lua does not.
    let plain = body
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'));
    if !plain || !body.bytes().any(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: f64 = body.parse().ok()?;
    Some(if neg { -v } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_print_like_luajit() {
        assert_eq!(number(1.0), "1");
        assert_eq!(number(-1.0), "-1");
        assert_eq!(number(0.5), "0.5");
        assert_eq!(number(65536.0), "65536");
        assert_eq!(number(1e15), "1e+15");
        assert_eq!(number(1e14), "1e+14");
        assert_eq!(number(99999999999999.0), "99999999999999");
        assert_eq!(number(0.0001), "0.0001");
        assert_eq!(number(0.00001), "1e-05");
        assert_eq!(number(1.0 / 3.0), "0.33333333333333");
        assert_eq!(number(-0.0), "-0");
        assert_eq!(number(123.456), "123.456");
    }

    #[test]
    fn quote_escapes_like_luajit() {
        assert_eq!(quote(r"^\*$"), r#""^\\*$""#);
        assert_eq!(quote("a\"b"), r#""a\"b""#);
        assert_eq!(quote("a\nb"), "\"a\\\nb\"");
        assert_eq!(quote("a\rb"), r#""a\13b""#);
        assert_eq!(quote("a\r1"), r#""a\0131""#);
        assert_eq!(quote("\u{0}"), r#""\0""#);
        assert_eq!(quote("\u{7f}"), r#""\127""#);
        assert_eq!(quote("é"), "\"é\"");
    }

    #[test]
    fn cjson_encoding() {
        assert_eq!(
            cjson_encode(&json!(["plugins", "uri"])),
            r#"["plugins","uri"]"#
        );
        assert_eq!(cjson_encode(&json!("a/b\u{1}")), r#""a/b\u0001""#);
        assert_eq!(cjson_encode(&json!(1.0)), "1");
        assert_eq!(cjson_encode(&json!([])), "{}");
        assert_eq!(force_encode_scalar(&Value::Null), r#""userdata: NULL""#);
        assert_eq!(force_encode_scalar(&json!(true)), "true");
    }

    #[test]
    fn tonumber_like_lua() {
        assert_eq!(tonumber("80"), Some(80.0));
        assert_eq!(tonumber(" 80 "), Some(80.0));
        assert_eq!(tonumber("0x10"), Some(16.0));
        assert_eq!(tonumber("1e3"), Some(1000.0));
        assert_eq!(tonumber("abc"), None);
        assert_eq!(tonumber("inf"), None);
        assert_eq!(tonumber(""), None);
        assert_eq!(tonumber("-5"), Some(-5.0));
    }
}
