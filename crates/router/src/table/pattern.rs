//! The full-path check of non-exact patterns (`/a/*/b`, `/u/:id/*act`).
//!
//! lua-resty-radixtree builds a regex from the pattern by splitting it on `/`: a segment starting
//! with `:` becomes `([^/]+)`, one starting with `*` becomes `((.|\n)*)` (its name `:ext` when
//! bare), every other segment is pasted in *as regex text*, and the pieces are joined with `/`
//! (trailing empty segments dropped, one `/` re-added if the pattern ended with one). If no
//! segment is named, there is no check at all. Otherwise the regex is searched (unanchored) in
//! the path and the route passes only if the first match is the whole path. Captures are paired
//! with the names by group number, and since a `*` segment owns two groups, a name after a `*name`
//! segment receives the inner group (the star's last character). All of that is observable
//! through `uri_param_*`, so it is reproduced.
//!
//! Running a regex per candidate would allocate for captures and cost far more than the tree walk,
//! so the usual shapes (literal segments free of regex syntax other than `.`, at most one `*`
//! segment) go through a small matcher that follows the same backtracking order: literals and
//! `:` segments are deterministic (a `:` segment is always followed by `/` or the end, so its
//! longest run is the only one that can succeed) and the single star tries its longest extent
//! first. Everything else falls back to the `regex` crate, whose leftmost-first semantics equal
//! PCRE's for these patterns.

use regex::Regex;

use super::params::Params;

/// Most named segments the inline matcher tracks; longer patterns use the regex.
const MAX_SLOTS: usize = 8;

/// A compiled check for one pattern that has at least one named segment.
#[derive(Debug)]
pub(crate) struct ParamCheck {
    /// Capture names in segment order (`:ext` for a bare `*`).
    names: Box<[Box<str>]>,
    engine: Engine,
}

#[derive(Debug)]
enum Engine {
    Inline {
        toks: Box<[Tok]>,
        /// Regex group order: for each group, the named token (slot) it belongs to and whether it
        /// is a star's inner one-character group.
        groups: Box<[(u8, bool)]>,
    },
    Regex(Regex),
}

#[derive(Debug)]
enum Tok {
    /// Literal text; `.` matches any character but `\n`, as in the regex it stands for.
    Lit { text: Box<str>, dot: bool },
    /// `:name` — one or more non-`/` bytes.
    Seg,
    /// `*name` — anything, possibly empty.
    Rest,
}

/// Bytes that make a literal segment a real regex (`.` is handled inline).
fn is_regex_syntax(c: u8) -> bool {
    matches!(
        c,
        b'\\' | b'^' | b'$' | b'|' | b'?' | b'*' | b'+' | b'(' | b')' | b'[' | b']' | b'{' | b'}'
    )
}

impl ParamCheck {
    /// `Ok(None)` when the pattern names nothing, i.e. the radix tree skips the check.
    pub(crate) fn compile(pattern: &str) -> Result<Option<ParamCheck>, String> {
        let mut segs: Vec<&str> = pattern.split('/').collect();
        while segs.last() == Some(&"") {
            segs.pop();
        }
        let trailing_slash = pattern.ends_with('/');

        let mut names: Vec<Box<str>> = Vec::new();
        let mut rests = 0;
        let mut plain = true;
        for seg in &segs {
            if let Some(name) = seg.strip_prefix(':') {
                names.push(name.into());
            } else if let Some(name) = seg.strip_prefix('*') {
                names.push(if name.is_empty() { ":ext" } else { name }.into());
                rests += 1;
            } else if seg.bytes().any(is_regex_syntax) {
                plain = false;
            }
        }
        if names.is_empty() {
            return Ok(None);
        }

        let engine = if plain && rests <= 1 && names.len() <= MAX_SLOTS {
            Self::inline(&segs, trailing_slash)
        } else {
            let mut re = String::with_capacity(pattern.len() + 16 * names.len());
            for (i, seg) in segs.iter().enumerate() {
                if i > 0 {
                    re.push('/');
                }
                if seg.starts_with(':') {
                    re.push_str("([^/]+)");
                } else if seg.starts_with('*') {
                    re.push_str("((.|\n)*)");
                } else {
                    re.push_str(seg);
                }
            }
            if trailing_slash {
                re.push('/');
            }
            let re = Regex::new(&re).map_err(|e| format!("failed to compile uri regex: {e}"))?;
            Engine::Regex(re)
        };
        Ok(Some(ParamCheck {
            names: names.into_boxed_slice(),
            engine,
        }))
    }

    fn inline(segs: &[&str], trailing_slash: bool) -> Engine {
        let mut toks = Vec::new();
        let mut groups = Vec::new();
        let mut lit = String::new();
        let flush = |lit: &mut String, toks: &mut Vec<Tok>| {
            if !lit.is_empty() {
                toks.push(Tok::Lit {
                    dot: lit.contains('.'),
                    text: std::mem::take(lit).into_boxed_str(),
                });
            }
        };
        let mut slot = 0u8;
        for (i, seg) in segs.iter().enumerate() {
            if i > 0 {
                lit.push('/');
            }
            if seg.starts_with(':') {
                flush(&mut lit, &mut toks);
                toks.push(Tok::Seg);
                groups.push((slot, false));
                slot += 1;
            } else if seg.starts_with('*') {
                flush(&mut lit, &mut toks);
                toks.push(Tok::Rest);
                groups.push((slot, false));
                groups.push((slot, true));
                slot += 1;
            } else {
                lit.push_str(seg);
            }
        }
        if trailing_slash {
            lit.push('/');
        }
        flush(&mut lit, &mut toks);
        Engine::Inline {
            toks: toks.into_boxed_slice(),
            groups: groups.into_boxed_slice(),
        }
    }

    /// Runs the check on the (normalised) path, adding the captures to `params` on success.
    pub(crate) fn check<'a>(&'a self, path: &'a str, params: &mut Params<'a>) -> bool {
        match &self.engine {
            Engine::Inline { toks, groups } => {
                let mut spans = [(0usize, 0usize); MAX_SLOTS];
                if !run(toks, path, &mut spans) {
                    return false;
                }
                for (name, &(slot, inner)) in self.names.iter().zip(groups.iter()) {
                    let (s, e) = spans[usize::from(slot)];
                    let v = &path[s..e];
                    if !inner {
                        params.push(name, v);
                    } else if let Some(c) = v.chars().next_back() {
                        params.push(name, &v[v.len() - c.len_utf8()..]);
                    }
                }
                true
            }
            Engine::Regex(re) => {
                let Some(caps) = re.captures(path) else {
                    return false;
                };
                let whole = caps.get(0).map(|m| (m.start(), m.end()));
                if whole != Some((0, path.len())) {
                    return false;
                }
                for (i, name) in self.names.iter().enumerate() {
                    if let Some(m) = caps.get(i + 1) {
                        params.push(name, m.as_str());
                    }
                }
                true
            }
        }
    }
}

/// The first match at position 0 in backtracking order must cover the whole path.
fn run(toks: &[Tok], path: &str, spans: &mut [(usize, usize); MAX_SLOTS]) -> bool {
    let rest = toks.iter().position(|t| matches!(t, Tok::Rest));
    let head = &toks[..rest.unwrap_or(toks.len())];
    let mut pos = 0;
    let mut slot = 0;
    if !run_fixed(head, path, &mut pos, spans, &mut slot) {
        return false;
    }
    if let Some(r) = rest {
        let tail = &toks[r + 1..];
        let star = slot;
        slot += 1;
        if tail.is_empty() {
            spans[star] = (pos, path.len());
            pos = path.len();
        } else {
            // Greedy: the longest extent whose continuation matches wins.
            let mut found = false;
            for end in (pos..=path.len()).rev() {
                if !path.is_char_boundary(end) {
                    continue;
                }
                let (mut p, mut s) = (end, slot);
                if run_fixed(tail, path, &mut p, spans, &mut s) {
                    spans[star] = (pos, end);
                    pos = p;
                    found = true;
                    break;
                }
            }
            if !found {
                return false;
            }
        }
    }
    pos == path.len()
}

/// Matches tokens that have a single possible extent (no star), recording `:` spans.
fn run_fixed(
    toks: &[Tok],
    path: &str,
    pos: &mut usize,
    spans: &mut [(usize, usize); MAX_SLOTS],
    slot: &mut usize,
) -> bool {
    for t in toks {
        match t {
            Tok::Lit { text, dot } => match lit_at(path, *pos, text, *dot) {
                Some(end) => *pos = end,
                None => return false,
            },
            Tok::Seg => {
                let rest = &path.as_bytes()[*pos..];
                let run = rest.iter().position(|&c| c == b'/').unwrap_or(rest.len());
                if run == 0 {
                    return false;
                }
                spans[*slot] = (*pos, *pos + run);
                *slot += 1;
                *pos += run;
            }
            Tok::Rest => {
                unreachable!("the inline matcher handles at most one star, outside run_fixed")
            }
        }
    }
    true
}

/// Where literal `text` ends if it matches at `pos`.
fn lit_at(path: &str, pos: usize, text: &str, dot: bool) -> Option<usize> {
    let rest = &path[pos..];
    if !dot {
        return rest.starts_with(text).then_some(pos + text.len());
    }
    let mut chars = rest.char_indices();
    for want in text.chars() {
        let (_, got) = chars.next()?;
        if want == '.' {
            if got == '\n' {
                return None;
            }
        } else if want != got {
            return None;
        }
    }
    Some(pos + chars.next().map_or(rest.len(), |(i, _)| i))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the check and returns the captures, or None when it fails.
    fn cap(pattern: &str, path: &str) -> Option<Vec<(String, String)>> {
        let check = ParamCheck::compile(pattern)
            .unwrap()
            .expect("pattern has names");
        let mut p = Params::new();
        check.check(path, &mut p).then(|| {
            p.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
    }

    fn kv(pairs: &[(&str, &str)]) -> Option<Vec<(String, String)>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    /// The same pattern compiled for the regex engine, to compare against the inline matcher.
    fn regex_engine(pattern: &str) -> ParamCheck {
        let mut check = ParamCheck::compile(pattern).unwrap().unwrap();
        let mut segs: Vec<&str> = pattern.split('/').collect();
        while segs.last() == Some(&"") {
            segs.pop();
        }
        let mut re = String::new();
        for (i, seg) in segs.iter().enumerate() {
            if i > 0 {
                re.push('/');
            }
            if seg.starts_with(':') {
                re.push_str("([^/]+)");
            } else if seg.starts_with('*') {
                re.push_str("((.|\n)*)");
            } else {
                re.push_str(seg);
            }
        }
        if pattern.ends_with('/') {
            re.push('/');
        }
        check.engine = Engine::Regex(Regex::new(&re).unwrap());
        check
    }

    #[test]
    fn unnamed_patterns_need_no_check() {
        for p in ["/foo*", "/foo*bar", "/a/b:c", "/a/b", "", "/x/y*z/"] {
            assert!(ParamCheck::compile(p).unwrap().is_none(), "{p}");
        }
    }

    #[test]
    fn spec_param_table() {
        assert_eq!(cap("/u/:id", "/u/7"), kv(&[("id", "7")]));
        assert_eq!(cap("/u/:id", "/u/"), None);
        assert_eq!(cap("/u/:id", "/u/7/x"), None);
        assert_eq!(cap("/u/:id", "/u//"), None);
        assert_eq!(cap("/u/:id/*act", "/u/7/"), kv(&[("id", "7"), ("act", "")]));
        assert_eq!(
            cap("/u/:id/*act", "/u/7/send/x"),
            kv(&[("id", "7"), ("act", "send/x")])
        );
        assert_eq!(cap("/u/:id/*act", "/u/7"), None);
    }

    #[test]
    fn star_spans_segments() {
        assert_eq!(cap("/a/*/b", "/a/x/b"), kv(&[(":ext", "x")]));
        assert_eq!(cap("/a/*/b", "/a/x/y/b"), kv(&[(":ext", "x/y")]));
        assert_eq!(cap("/a/*/b", "/a//b"), kv(&[(":ext", "")]));
        assert_eq!(cap("/a/*/b", "/a/x/c"), None);
        assert_eq!(cap("/a/*/b", "/a/b"), None);
        assert_eq!(cap("/a/*/b", "/a/x/b/c"), None);
        // Greedy: the star takes as much as it can.
        assert_eq!(cap("/a/*/b", "/a/b/b/b"), kv(&[(":ext", "b/b")]));
        assert_eq!(cap("/foo/*", "/foo/a/b"), kv(&[(":ext", "a/b")]));
        assert_eq!(cap("/foo/*", "/foo/"), kv(&[(":ext", "")]));
    }

    #[test]
    fn name_after_star_gets_inner_group() {
        // `((.|\n)*)` owns two groups, so `y` pairs with the star's last character.
        assert_eq!(cap("/a/*x/:y", "/a/pq/r"), kv(&[("x", "pq"), ("y", "q")]));
        // An empty star leaves the inner group unset: the name is not set at all.
        assert_eq!(cap("/a/*x/:y", "/a//r"), kv(&[("x", "")]));
    }

    #[test]
    fn literal_dot_is_any_char() {
        assert_eq!(cap("/a/*/f.js", "/a/x/f.js"), kv(&[(":ext", "x")]));
        assert_eq!(cap("/a/*/f.js", "/a/x/fXjs"), kv(&[(":ext", "x")]));
        assert_eq!(cap("/a/*/f.js", "/a/x/f/js"), kv(&[(":ext", "x")]));
        assert_eq!(cap("/a/*/f.js", "/a/x/fjs"), None);
    }

    #[test]
    fn regex_fallback() {
        // Two stars and regex syntax in a literal segment go to the regex engine.
        assert!(matches!(
            ParamCheck::compile("/a/*/*/b").unwrap().unwrap().engine,
            Engine::Regex(_)
        ));
        assert_eq!(cap("/a/*x/*y", "/a/1/2/3"), kv(&[("x", "1/2"), ("y", "2")]));
        assert_eq!(cap("/v+/:id", "/vvv/7"), kv(&[("id", "7")]));
        assert_eq!(cap("/v+/:id", "/v+/7"), None);
        assert!(ParamCheck::compile("/a(/:id").is_err());
    }

    #[test]
    fn duplicate_names_last_wins() {
        assert_eq!(cap("/:a/:a", "/x/y"), kv(&[("a", "y")]));
    }

    #[test]
    fn trailing_slash_and_empty_segments() {
        assert_eq!(cap("/u/:id/", "/u/7/"), kv(&[("id", "7")]));
        assert_eq!(cap("/u/:id/", "/u/7"), None);
        // Trailing empty segments collapse to a single `/`, as ngx.re.split drops them.
        assert_eq!(cap("/u/:id//", "/u/7/"), kv(&[("id", "7")]));
        assert_eq!(cap("/u//:id", "/u//7"), kv(&[("id", "7")]));
        assert_eq!(cap("*", "/any/thing"), kv(&[(":ext", "/any/thing")]));
    }

    #[test]
    fn inline_matches_regex_engine() {
        let patterns = [
            "/u/:id",
            "/u/:id/*act",
            "/a/*/b",
            "/a/*x/:y",
            "/a/:b/*/c/:d",
            "/:a/:b/",
            "/x.y/*/z.w",
            "/*",
            "*",
            "/a/*/",
            "/u/:id//",
        ];
        let paths = [
            "/",
            "/u",
            "/u/",
            "/u/7",
            "/u/7/",
            "/u/7/x",
            "/u/7/x/y",
            "/a/b",
            "/a/x/b",
            "/a/x/y/b",
            "/a/b/b",
            "/a//b",
            "/a/q/c/d",
            "/a/q/r/c/d",
            "/a/q/c/",
            "/x.y/1/z.w",
            "/xzy/1/2/zqw",
            "/p/q/",
            "/p/q",
            "/caf\u{e9}/\u{e9}",
            "/a/\u{e9}\u{e9}/\u{e9}",
        ];
        for pat in patterns {
            let inline = ParamCheck::compile(pat).unwrap().unwrap();
            assert!(matches!(inline.engine, Engine::Inline { .. }), "{pat}");
            let re = regex_engine(pat);
            for path in paths {
                let (mut a, mut b) = (Params::new(), Params::new());
                let ra = inline.check(path, &mut a);
                let rb = re.check(path, &mut b);
                assert_eq!(ra, rb, "{pat} on {path}");
                assert_eq!(
                    a.iter().collect::<Vec<_>>(),
                    b.iter().collect::<Vec<_>>(),
                    "{pat} on {path}"
                );
            }
        }
    }
}
