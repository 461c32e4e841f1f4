//! The request path as APISIX matches it: nginx's `$uri`.
//!
//! APISIX never matches the raw request target; it matches `$uri`, which nginx derives with its
//! "complex URI" parser: percent-escapes are decoded and the decoded bytes are then interpreted
//! as if they had been typed (so `%2F` is a slash that merges and `%2E%2E` is a `..` segment),
//! repeated slashes are merged (`merge_slashes on`), `.` and `..` segments are resolved, and a
//! `..` that would climb above the root makes the request a 400. Routing on anything else would
//! let `/admin%2F..%2Fpublic` or `//admin` reach a different route than in APISIX.
//!
//! Almost every real path needs none of this, so the scan that proves a path is already normal
//! is kept separate from the rewriting state machine, and the common case borrows.

use std::borrow::Cow;

/// nginx's `$uri` normalisation for matching: percent-decoding (%2F decodes to '/'), merging `//`, resolving `.` and `..`
/// (never above root), query string removed. Returns Cow::Borrowed when nothing changes (the common case must not allocate).
/// Returns None for a path nginx would reject with 400 (e.g. `..` escaping the root, or a path not starting with '/').
///
/// Decoded bytes that are not valid UTF-8 (e.g. `%FF`) are replaced with U+FFFD: no route
/// pattern can contain them, and prefix routes keep matching the valid part before them.
pub fn normalize_path(raw_path_without_query: &str) -> Option<Cow<'_, str>> {
    let b = raw_path_without_query.as_bytes();
    if b.first() != Some(&b'/') {
        return None;
    }
    if is_normal(b) {
        return Some(Cow::Borrowed(raw_path_without_query));
    }
    let out = rewrite(b)?;
    Some(match String::from_utf8(out) {
        Ok(s) => Cow::Owned(s),
        Err(e) => Cow::Owned(String::from_utf8_lossy(e.as_bytes()).into_owned()),
    })
}

/// True when the nginx parser would copy the path unchanged: no escapes, no `?`/`#`, no control
/// bytes (which nginx refuses), no `//`, and no `.`/`..` segment.
fn is_normal(b: &[u8]) -> bool {
    for (i, &c) in b.iter().enumerate() {
        match c {
            b'%' | b'?' | b'#' | 0..=0x20 | 0x7f => return false,
            b'/' => match b.get(i + 1) {
                Some(b'/') => return false,
                Some(b'.') => match b.get(i + 2) {
                    None | Some(b'/') => return false,
                    Some(b'.') if matches!(b.get(i + 3), None | Some(b'/')) => return false,
                    _ => {}
                },
                _ => {}
            },
            _ => {}
        }
    }
    true
}

/// Where the parser is relative to the last segment written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Inside an ordinary segment.
    Usual,
    /// Just wrote a `/`.
    Slash,
    /// Wrote `/.`: the segment is `.` if it ends here.
    Dot,
    /// Wrote `/..`: the segment is `..` if it ends here.
    DotDot,
}

/// The rewriting pass, byte for byte the behaviour of nginx's `ngx_http_parse_complex_uri`.
fn rewrite(b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(b.len());
    let mut state = State::Usual;
    let mut i = 0;
    while i < b.len() {
        let mut c = b[i];
        i += 1;
        match c {
            // nginx rejects these in the request line before it gets here.
            0..=0x20 | 0x7f => return None,
            b'%' => {
                let hi = hex(*b.get(i)?)?;
                let lo = hex(*b.get(i + 1)?)?;
                i += 2;
                c = (hi << 4) | lo;
                match c {
                    0 => return None,
                    // Decoded `%`, `#` and `?` are data, never syntax.
                    b'%' | b'#' | b'?' => {
                        out.push(c);
                        state = State::Usual;
                        continue;
                    }
                    // Any other decoded byte is handled as if it had been sent raw.
                    _ => {}
                }
            }
            // The path ends here (query or fragment): same as the end of input.
            b'?' | b'#' => break,
            _ => {}
        }
        state = step(&mut out, state, c)?;
    }
    match state {
        State::Dot => {
            out.pop();
        }
        State::DotDot => climb(&mut out)?,
        State::Usual | State::Slash => {}
    }
    Some(out)
}

fn step(out: &mut Vec<u8>, state: State, c: u8) -> Option<State> {
    Some(match (state, c) {
        (State::Usual, b'/') => {
            out.push(c);
            State::Slash
        }
        (State::Usual, _) => {
            out.push(c);
            State::Usual
        }
        // merge_slashes
        (State::Slash, b'/') => State::Slash,
        (State::Slash, b'.') => {
            out.push(c);
            State::Dot
        }
        (State::Dot, b'/') => {
            out.pop();
            State::Slash
        }
        (State::Dot, b'.') => {
            out.push(c);
            State::DotDot
        }
        (State::DotDot, b'/') => {
            climb(out)?;
            State::Slash
        }
        (_, _) => {
            out.push(c);
            State::Usual
        }
    })
}

/// `out` ends with `/..`: drop it and the segment before it, keeping that segment's leading
/// slash. `None` when there is no segment left to drop (the request climbs above the root).
fn climb(out: &mut Vec<u8>) -> Option<()> {
    let end = out.len().checked_sub(3)?;
    let keep = out[..end].iter().rposition(|&c| c == b'/')? + 1;
    out.truncate(keep);
    Some(())
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(p: &str) -> Option<String> {
        normalize_path(p).map(Cow::into_owned)
    }

    fn is_borrowed(p: &str) -> bool {
        matches!(normalize_path(p), Some(Cow::Borrowed(_)))
    }

    #[test]
    fn spec_cases() {
        assert_eq!(norm("/hel%6Co").as_deref(), Some("/hello"));
        assert_eq!(norm("/a%2Fb").as_deref(), Some("/a/b"));
        assert_eq!(norm("//hello").as_deref(), Some("/hello"));
        assert_eq!(norm("/a/./b/../c").as_deref(), Some("/a/c"));
    }

    #[test]
    fn common_paths_borrow() {
        for p in [
            "/",
            "/hello",
            "/a/b/c/",
            "/a.b/c..d/.hidden/..e/...",
            "/file:list",
            "/caf\u{e9}",
            "/a+b",
        ] {
            assert!(is_borrowed(p), "{p}");
            assert_eq!(norm(p).as_deref(), Some(p));
        }
        for p in [
            "/a//b", "/a/./b", "/a/../b", "/a/.", "/a/..", "/%41", "/a?b", "/a#b",
        ] {
            assert!(!is_borrowed(p), "{p}");
        }
    }

    #[test]
    fn dots_and_slashes() {
        assert_eq!(norm("/a/.").as_deref(), Some("/a/"));
        assert_eq!(norm("/a/..").as_deref(), Some("/"));
        assert_eq!(norm("/a/b/..").as_deref(), Some("/a/"));
        assert_eq!(norm("/a/b/../").as_deref(), Some("/a/"));
        assert_eq!(norm("/.").as_deref(), Some("/"));
        assert_eq!(norm("/./a").as_deref(), Some("/a"));
        assert_eq!(norm("///a///b//").as_deref(), Some("/a/b/"));
        assert_eq!(norm("/a//../b").as_deref(), Some("/b"));
        assert_eq!(norm("/a/b/.././../c").as_deref(), Some("/c"));
        assert_eq!(norm("/a/...").as_deref(), Some("/a/..."));
        assert_eq!(norm("/a/..b/c").as_deref(), Some("/a/..b/c"));
    }

    #[test]
    fn climbing_above_root_is_rejected() {
        assert_eq!(norm("/.."), None);
        assert_eq!(norm("/../a"), None);
        assert_eq!(norm("/a/../.."), None);
        assert_eq!(norm("//../a"), None);
        assert_eq!(norm("/%2e%2e/a"), None);
        assert_eq!(norm("/a/%2E%2E/%2e%2E"), None);
    }

    #[test]
    fn decoding() {
        // Decoded slashes and dots are syntax, like raw ones.
        assert_eq!(norm("/a%2F%2Fb").as_deref(), Some("/a/b"));
        assert_eq!(norm("/a%2F..%2Fb").as_deref(), Some("/b"));
        assert_eq!(norm("/a/%2e/b").as_deref(), Some("/a/b"));
        assert_eq!(norm("/a%2fb").as_deref(), Some("/a/b"));
        // Decoded `%`, `#`, `?` are data.
        assert_eq!(norm("/a%25b").as_deref(), Some("/a%b"));
        assert_eq!(norm("/a%252F").as_deref(), Some("/a%2F"));
        assert_eq!(norm("/a%23b").as_deref(), Some("/a#b"));
        assert_eq!(norm("/a%3Fb").as_deref(), Some("/a?b"));
        assert_eq!(norm("/a%3fb").as_deref(), Some("/a?b"));
        // Other decoded bytes, including ones nginx refuses raw.
        assert_eq!(norm("/a%20b").as_deref(), Some("/a b"));
        assert_eq!(norm("/caf%C3%A9").as_deref(), Some("/caf\u{e9}"));
        assert_eq!(norm("/a%FF").as_deref(), Some("/a\u{fffd}"));
    }

    #[test]
    fn bad_escapes_and_bytes_are_rejected() {
        assert_eq!(norm("/a%"), None);
        assert_eq!(norm("/a%2"), None);
        assert_eq!(norm("/a%zz"), None);
        assert_eq!(norm("/a%2g"), None);
        assert_eq!(norm("/a%00b"), None);
        assert_eq!(norm("/a b"), None);
        assert_eq!(norm("/a\tb"), None);
        assert_eq!(norm("/a\x7f"), None);
    }

    #[test]
    fn must_start_with_slash() {
        assert_eq!(norm(""), None);
        assert_eq!(norm("a/b"), None);
        assert_eq!(norm("*"), None);
        assert_eq!(norm("%2Fa"), None);
    }

    #[test]
    fn query_and_fragment_end_the_path() {
        assert_eq!(norm("/a?x=1").as_deref(), Some("/a"));
        assert_eq!(norm("/a#frag").as_deref(), Some("/a"));
        assert_eq!(norm("/a/.?x").as_deref(), Some("/a/"));
        assert_eq!(norm("/a/b/..#x").as_deref(), Some("/a/"));
        assert_eq!(norm("/..?x"), None);
    }
}
