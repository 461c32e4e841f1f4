//! nginx's URI escapes as APISIX applies them to rewritten URIs.

use std::fmt::Write;

/// `ngx_escape_uri(.., NGX_ESCAPE_URI)` (APISIX's `core.utils.uri_safe_encode`): space, `#`,
/// `%`, `?`, control bytes and bytes above 0x7e become `%XX`.
pub fn uri_safe_encode(uri: &str) -> String {
    escape(uri, |b| {
        matches!(b, b' ' | b'#' | b'%' | b'?') || !(0x20..0x7f).contains(&b)
    })
}

/// `core.utils.escape_uri_control_chars`: only control bytes (CR and LF among them) become
/// `%XX`, so a query keeps its `?`, `=` and `&`.
pub fn escape_control_chars(uri: &str) -> String {
    escape(uri, |b| b < 0x20 || b == 0x7f)
}

fn escape(s: &str, needs: impl Fn(u8) -> bool) -> String {
    if !s.bytes().any(&needs) {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for (i, b) in s.bytes().enumerate() {
        if needs(b) {
            let _ = write!(out, "%{b:02X}");
        } else {
            // Copying by byte keeps multi-byte characters intact: their bytes are all >= 0x80,
            // so a byte copied here is ASCII.
            out.push_str(&s[i..i + 1]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        assert_eq!(uri_safe_encode("/a b#c%d?e"), "/a%20b%23c%25d%3Fe");
        assert_eq!(uri_safe_encode("/ä"), "/%C3%A4");
        assert_eq!(uri_safe_encode("/plain/path"), "/plain/path");
        assert_eq!(escape_control_chars("?a=1&b=\r\n"), "?a=1&b=%0D%0A");
    }
}
