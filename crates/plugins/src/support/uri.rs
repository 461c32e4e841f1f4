//! nginx's URI escapes as APISIX applies them to rewritten URIs.

use std::io::Write;

/// `ngx_escape_uri(.., NGX_ESCAPE_URI)` (APISIX's `core.utils.uri_safe_encode`): space, `#`,
/// `%`, `?`, control bytes and bytes above 0x7e become `%XX`.
pub fn uri_safe_encode(uri: &str) -> String {
    escape(uri, |b| {
        matches!(b, b' ' | b'#' | b'%' | b'?') || !(0x20..0x7f).contains(&b)
    })
}

/// [`uri_safe_encode`] for a path sent upstream: also `<`, `>` and `` ` ``, which nginx would
/// send as they are but a request line may not carry (the HTTP client refuses them, and the
/// upstream decodes `%XX` to the same bytes).
pub fn upstream_path(path: &str) -> String {
    escape(path, |b| {
        matches!(b, b' ' | b'#' | b'%' | b'?' | b'<' | b'>' | b'`') || !(0x20..0x7f).contains(&b)
    })
}

/// A query sent upstream: APISIX's `core.utils.escape_uri_control_chars` (control bytes, CR and
/// LF among them, so a query keeps its `?`, `=` and `&`), and the bytes a request line's query
/// may not carry (space, `"`, `#`, `<`, `>`).
pub fn upstream_query(query: &str) -> String {
    escape(query, |b| {
        matches!(b, b' ' | b'"' | b'#' | b'<' | b'>') || b < 0x20 || b == 0x7f
    })
}

fn escape(s: &str, needs: impl Fn(u8) -> bool) -> String {
    if !s.bytes().any(&needs) {
        return s.to_owned();
    }
    let mut out = Vec::with_capacity(s.len() + 8);
    for b in s.bytes() {
        if needs(b) {
            let _ = write!(out, "%{b:02X}");
        } else {
            out.push(b);
        }
    }
    // Every escape treats all bytes of a multi-byte character alike (all >= 0x80), so the
    // result is UTF-8 again.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        assert_eq!(uri_safe_encode("/a b#c%d?e"), "/a%20b%23c%25d%3Fe");
        assert_eq!(uri_safe_encode("/ä"), "/%C3%A4");
        assert_eq!(upstream_query("q=ä b"), "q=ä%20b");
        assert_eq!(uri_safe_encode("/plain/path"), "/plain/path");
        assert_eq!(upstream_query("a=1&b=\r\n"), "a=1&b=%0D%0A");
        assert_eq!(upstream_path("/a<b>`c\"{}"), "/a%3Cb%3E%60c\"{}");
        assert_eq!(
            upstream_query("a=1 2&b=<\"#>\n"),
            "a=1%202&b=%3C%22%23%3E%0A"
        );
        let p = "/a<b>`c\"{}|^\\ ä?#%";
        let uri = format!("{}?{}", upstream_path(p), upstream_query("x=<\"# >"));
        assert!(uri.parse::<http::Uri>().is_ok(), "{uri}");
    }
}
