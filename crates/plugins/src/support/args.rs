//! Request arguments and headers as OpenResty's functions return them to Lua
//! (`ngx.req.get_headers`, `ngx.decode_args`, `ngx.unescape_uri`, `ngx.encode_args`), for plugins that validate
//! or rewrite them as tables.

use ferrisix_plugin_api::PluginCtx;
use serde_json::{Map, Value};

/// The request headers as `ngx.req.get_headers()` returns them.
pub fn headers_table(ctx: &PluginCtx<'_>) -> Value {
    let mut m = Map::new();
    for (name, value) in ctx.headers() {
        let v = Value::String(String::from_utf8_lossy(value.as_bytes()).into_owned());
        match m.get_mut(name.as_str()) {
            Some(Value::Array(list)) => list.push(v),
            Some(prev) => {
                let first = prev.take();
                *prev = Value::Array(vec![first, v]);
            }
            None => {
                m.insert(name.as_str().to_owned(), v);
            }
        }
    }
    Value::Object(m)
}

/// `ngx.decode_args`: each field once as a string, a repeated one as the list of its values,
/// a field without `=` as `true`.
pub fn decode_form(body: &[u8]) -> Value {
    let mut m = Map::new();
    for pair in body.split(|&b| b == b'&').filter(|p| !p.is_empty()) {
        let (k, v) = match pair.iter().position(|&b| b == b'=') {
            Some(i) => (&pair[..i], Some(&pair[i + 1..])),
            None => (pair, None),
        };
        let key = unescape(k);
        let value = v.map_or(Value::Bool(true), |v| Value::String(unescape(v)));
        match m.get_mut(&key) {
            Some(Value::Array(list)) => list.push(value),
            Some(prev) => {
                let first = prev.take();
                *prev = Value::Array(vec![first, value]);
            }
            None => {
                m.insert(key, value);
            }
        }
    }
    Value::Object(m)
}

/// `ngx.unescape_uri`: `%XX` decoded, `+` as a space.
pub fn unescape(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < raw.len() => {
                let hex = std::str::from_utf8(&raw[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `ngx.encode_args`' escaping of a name or a value.
fn escape(s: &str, out: &mut String) {
    for b in s.bytes() {
        let keep = b.is_ascii_alphanumeric() || b"-._~!$()*".contains(&b);
        if keep {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

/// `ngx.encode_args` of fields in their order (`None`: a field without `=`).
pub fn encode_args(args: &[(String, Option<String>)]) -> String {
    let mut out = String::new();
    for (k, v) in args {
        if !out.is_empty() {
            out.push('&');
        }
        escape(k, &mut out);
        if let Some(v) = v {
            out.push('=');
            escape(v, &mut out);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn form_decoding() {
        assert_eq!(
            decode_form(b"a=1&a=2&b&c=x%20y+z&d=%zz"),
            json!({"a": ["1", "2"], "b": true, "c": "x y z", "d": "%zz"})
        );
        let args = [
            ("q".to_string(), Some("{ a }*".to_string())),
            ("f".to_string(), None),
        ];
        assert_eq!(encode_args(&args), "q=%7B%20a%20%7D*&f");
    }
}
