//! The regexes of plugin confs. APISIX compiles them with PCRE (`ngx.re`, flags `jo`); ferrisix
//! uses the `regex` crate, whose matching time is linear in the subject whatever the pattern
//! (no backtracking), so a conf cannot hang a worker. The PCRE syntax the crate lacks
//! (look-around, backreferences, atomic groups, possessive quantifiers) is refused when the
//! conf is checked, with a message saying so, instead of being matched differently. Other
//! invalid patterns are refused in the form APISIX's check answers (`pcre_compile() failed:
//! <PCRE's words> in "<pattern>"`).
//!
//! Replacements are `ngx.re.sub`'s templates: `$0`..`$N` and `${N}` are captures, `$$` is a
//! dollar; anything else is literal (the `regex` crate's own `$name` syntax would read `$1_`
//! as a group named `1_`).

use regex::{Regex, RegexBuilder};

/// Compiles `pattern` as `ngx.re` would with `jo` (and `i` when `caseless`).
pub fn compile(pattern: &str, caseless: bool) -> Result<Regex, String> {
    RegexBuilder::new(pattern)
        .case_insensitive(caseless)
        .size_limit(1 << 22)
        .build()
        .map_err(|e| describe(pattern, &e))
}

/// A body regex compiled with `ngx.re` options that matches as PCRE does (response-rewrite's
/// `filters`).
///
/// The `regex` crate differs from PCRE where a body's last line is concerned, so the pattern
/// is translated first: PCRE's `$` (without `m`) and `\Z` match at the very end or before a
/// final newline, the crate's `$` only at the very end, so they become `(?:\z|(\n)\z)`; the
/// group shows when the newline was taken, and the match is then cut before it (PCRE's `$`
/// does not consume it). With `m`, PCRE's `^` does not match after the newline that ends the
/// body, the crate's does: an empty group marks where `^` matched and such a match is
/// refused. The groups added are not PCRE's: [`BodyRegex::group`] maps the numbers back.
/// Also: with `x`, whitespace and `#` inside a class are literal (the crate ignores them);
/// inside a class `[`, `&&` and `~~` are literal (set operations to the crate); with `u`,
/// `\d`, `\w`, `\s` and `\b` stay ASCII as in PCRE without UCP; `\Q...\E` quotes; `a`
/// anchors every match at the search's start, `gsub` included.
///
/// A `$` or `\Z` followed at once by one newline token (`\n`, a literal newline, or `\s`,
/// without a quantifier) can only match before the final newline and then take it, so the
/// pair becomes `\n\z` (`a$\n` matches `"a\n"`, as in PCRE). One PCRE reading is not kept:
/// a newline taken after a `$` in any other form (`a$\n?`, `a$(\n)`, `a$ \n` with `x`) does
/// not match, because the crate has no look-ahead to leave it unconsumed.
#[derive(Clone, Debug)]
pub struct BodyRegex {
    regex: regex::bytes::Regex,
    /// The crate's group for each of PCRE's.
    groups: Vec<usize>,
    /// The groups that hold the final newline a `$` matched before.
    dollars: Vec<usize>,
    /// The empty groups where a multi-line `^` matched.
    carets: Vec<usize>,
    anchored: bool,
    /// The longest match in bytes; `None`: no bound (`*`, `+`, `{n,}`).
    max_len: Option<usize>,
}

/// A match of a [`BodyRegex`]: `start..end` as PCRE reports it.
#[derive(Debug)]
pub struct BodyMatch<'h> {
    caps: regex::bytes::Captures<'h>,
    pub start: usize,
    pub end: usize,
}

impl BodyRegex {
    /// The first match at or after `pos` (PCRE's `exec` from offset `pos`).
    pub fn captures_at<'h>(&self, hay: &'h [u8], pos: usize) -> Option<BodyMatch<'h>> {
        let mut from = pos;
        loop {
            let caps = self.regex.captures_at(hay, from)?;
            let m = caps.get(0)?;
            if self.anchored && m.start() != pos {
                // The leftmost match starts later, so none starts at `pos`.
                return None;
            }
            let n = hay.len();
            if n > 0
                && self
                    .carets
                    .iter()
                    .any(|&g| caps.get(g).is_some_and(|c| c.start() == n))
            {
                // `^` after the body's final newline: no line starts there for PCRE.
                if self.anchored || m.start() >= n {
                    return None;
                }
                from = m.start() + 1;
                continue;
            }
            let end = self
                .dollars
                .iter()
                .find_map(|&g| caps.get(g))
                .map_or(m.end(), |nl| nl.start());
            return Some(BodyMatch {
                start: m.start(),
                end,
                caps,
            });
        }
    }

    /// The longest match in bytes, `None` when the pattern has no bound. What a streamed body
    /// must hold back for a match still to be found ([`crate::support::stream_sub`]).
    pub fn max_len(&self) -> Option<usize> {
        self.max_len
    }

    /// `a`: a match starts where the search does, or there is none.
    pub fn anchored(&self) -> bool {
        self.anchored
    }

    /// Whether the regex matches anywhere in `hay`.
    pub fn is_match(&self, hay: &[u8]) -> bool {
        self.captures_at(hay, 0).is_some()
    }

    /// PCRE's group `n` of `m` (`0`: the whole match).
    pub fn group<'h>(&self, m: &BodyMatch<'h>, n: usize) -> Option<&'h [u8]> {
        if n == 0 {
            let whole = m.caps.get(0)?.as_bytes();
            return Some(&whole[..m.end - m.start]);
        }
        self.groups
            .get(n)
            .and_then(|&g| m.caps.get(g))
            .map(|c| c.as_bytes())
    }
}

/// Compiles a body regex with `ngx.re` options (`i` caseless, `m` multi-line, `s` dot-all,
/// `x` extended, `u`/`U` UTF-8, `a` anchored; `j`, `o`, `d`, `D`, `J` change nothing here).
/// Without `u` it matches bytes, as PCRE does.
pub fn compile_bytes(pattern: &str, options: &str) -> Result<BodyRegex, String> {
    if let Some(other) = options.chars().find(|o| !"imsxuUajoDJd".contains(*o)) {
        return Err(format!("unknown flag \"{other}\""));
    }
    let has = |o: char| options.contains(o);
    let utf8 = has('u') || has('U');
    let t = translate(pattern, has('m'), has('x'), utf8);
    let regex = regex::bytes::RegexBuilder::new(&t.source)
        .case_insensitive(has('i'))
        .multi_line(has('m'))
        .dot_matches_new_line(has('s'))
        .ignore_whitespace(has('x'))
        .unicode(utf8)
        .size_limit(1 << 22)
        .build()
        .map_err(|e| describe(pattern, &e))?;
    // The same reading as the regex's own, for its longest match.
    let max_len = regex_syntax::ParserBuilder::new()
        .case_insensitive(has('i'))
        .multi_line(has('m'))
        .dot_matches_new_line(has('s'))
        .ignore_whitespace(has('x'))
        .unicode(utf8)
        .utf8(false)
        .build()
        .parse(&t.source)
        .ok()
        .and_then(|hir| hir.properties().maximum_len());
    Ok(BodyRegex {
        regex,
        groups: t.groups,
        dollars: t.dollars,
        carets: t.carets,
        anchored: has('a'),
        max_len,
    })
}

/// A PCRE pattern as the `regex` crate reads it ([`BodyRegex`]).
#[derive(Debug, Default)]
struct Translated {
    source: String,
    groups: Vec<usize>,
    dollars: Vec<usize>,
    carets: Vec<usize>,
}

impl Translated {
    fn group(&mut self) -> usize {
        self.groups.len() + self.dollars.len() + self.carets.len()
    }

    fn dollar(&mut self) {
        let g = self.group();
        self.dollars.push(g);
        self.source.push_str("(?:\\z|(\\n)\\z)");
    }

    /// A `$` (or `\Z`) that ends at `next`: when one unquantified newline token follows, the
    /// pair is `\n\z` and the index after that token is returned; else a plain [`dollar`].
    ///
    /// [`dollar`]: Translated::dollar
    fn dollar_at(&mut self, chars: &[char], next: usize, extended: bool) -> Option<usize> {
        let after = match (chars.get(next), chars.get(next + 1)) {
            (Some('\\'), Some('n' | 's')) => next + 2,
            // With `x`, a literal newline is white space, not a token.
            (Some('\n'), _) if !extended => next + 1,
            _ => {
                self.dollar();
                return None;
            }
        };
        if matches!(chars.get(after), Some('?' | '*' | '+' | '{')) {
            self.dollar();
            return None;
        }
        self.source.push_str("\\n\\z");
        Some(after)
    }
}

/// `\d`, `\w`, `\s` (and their negations) as PCRE's ASCII classes, for inside a class.
fn ascii_class(escape: char) -> Option<&'static str> {
    Some(match escape {
        'd' => "[:digit:]",
        'D' => "[:^digit:]",
        'w' => "[:word:]",
        'W' => "[:^word:]",
        's' => "[:space:]",
        'S' => "[:^space:]",
        _ => return None,
    })
}

fn translate(pattern: &str, multi_line: bool, extended: bool, utf8: bool) -> Translated {
    let chars: Vec<char> = pattern.chars().collect();
    let at = |i: usize| chars.get(i).copied();
    let mut t = Translated {
        groups: vec![0],
        ..Default::default()
    };
    // The `m` and `x` flags in force, and those of each open group's surroundings.
    let (mut m, mut x) = (multi_line, extended);
    let mut scopes: Vec<(bool, bool)> = Vec::new();
    let mut i = 0;
    while let Some(c) = at(i) {
        match c {
            '\\' => {
                let Some(d) = at(i + 1) else {
                    t.source.push('\\');
                    break;
                };
                i += 2;
                match d {
                    'Z' => {
                        if let Some(after) = t.dollar_at(&chars, i, x) {
                            i = after;
                        }
                    }
                    'Q' => {
                        while let Some(q) = at(i) {
                            if q == '\\' && at(i + 1) == Some('E') {
                                i += 2;
                                break;
                            }
                            t.source
                                .push_str(&regex::escape(q.encode_utf8(&mut [0; 4])));
                            i += 1;
                        }
                    }
                    'b' | 'B' if utf8 => {
                        t.source
                            .push_str(if d == 'b' { "(?-u:\\b)" } else { "(?-u:\\B)" })
                    }
                    _ => match ascii_class(d).filter(|_| utf8) {
                        Some(class) => {
                            t.source.push('[');
                            t.source.push_str(class);
                            t.source.push(']');
                        }
                        None => {
                            t.source.push('\\');
                            t.source.push(d);
                        }
                    },
                }
                continue;
            }
            '[' => {
                i = class(&chars, i, utf8, &mut t.source);
                continue;
            }
            '(' if at(i + 1) == Some('?') => {
                let named = match (at(i + 2), at(i + 3)) {
                    (Some('P'), Some('<')) => Some(i + 4),
                    (Some('<'), Some(n)) if n != '=' && n != '!' => Some(i + 3),
                    (Some('\''), _) => Some(i + 3),
                    _ => None,
                };
                if at(i + 2) == Some('#') {
                    // A comment, to its `)`.
                    while at(i).is_some_and(|c| c != ')') {
                        i += 1;
                    }
                    i += 1;
                    continue;
                }
                if let Some(name_start) = named {
                    let mut j = name_start;
                    while at(j).is_some_and(|c| c != '>' && c != '\'') {
                        j += 1;
                    }
                    let name: String = chars[name_start..j.min(chars.len())].iter().collect();
                    let g = t.group();
                    t.groups.push(g);
                    scopes.push((m, x));
                    t.source.push_str("(?P<");
                    t.source.push_str(&name);
                    t.source.push('>');
                    i = j + 1;
                    continue;
                }
                let mut j = i + 2;
                let (mut m2, mut x2, mut on) = (m, x, true);
                while let Some(f) = at(j).filter(|f| f.is_ascii_alphabetic() || *f == '-') {
                    match f {
                        '-' => on = false,
                        'm' => m2 = on,
                        'x' => x2 = on,
                        _ => {}
                    }
                    j += 1;
                }
                match at(j) {
                    Some(')') if j > i + 2 => {
                        // `(?flags)`: for the rest of the enclosing group.
                        (m, x) = (m2, x2);
                    }
                    Some(':') => {
                        scopes.push((m, x));
                        (m, x) = (m2, x2);
                    }
                    _ => {
                        // `(?=`, `(?!`, `(?<=`, `(?>`...: a group of its own kind (the crate
                        // refuses the PCRE-only ones).
                        scopes.push((m, x));
                        t.source.push_str("(?");
                        i += 2;
                        continue;
                    }
                }
                t.source.extend(&chars[i..=j]);
                i = j + 1;
                continue;
            }
            '(' => {
                if at(i + 1) != Some('*') {
                    let g = t.group();
                    t.groups.push(g);
                }
                scopes.push((m, x));
                t.source.push('(');
            }
            ')' => {
                if let Some(outer) = scopes.pop() {
                    (m, x) = outer;
                }
                t.source.push(')');
            }
            '$' if !m => {
                if let Some(after) = t.dollar_at(&chars, i + 1, x) {
                    i = after;
                    continue;
                }
            }
            '^' if m => {
                let g = t.group();
                t.carets.push(g);
                t.source.push_str("(?:^())");
            }
            '#' if x => {
                while at(i).is_some_and(|c| c != '\n') {
                    i += 1;
                }
                continue;
            }
            _ => t.source.push(c),
        }
        i += 1;
    }
    t
}

/// Copies the class opening at `chars[start]` as the crate reads it; answers where it ends.
fn class(chars: &[char], start: usize, utf8: bool, out: &mut String) -> usize {
    let at = |i: usize| chars.get(i).copied();
    let mut i = start + 1;
    out.push('[');
    if at(i) == Some('^') {
        out.push('^');
        i += 1;
    }
    if at(i) == Some(']') {
        // A `]` first is a member.
        out.push_str("\\]");
        i += 1;
    }
    while let Some(c) = at(i) {
        match c {
            ']' => {
                out.push(']');
                return i + 1;
            }
            '\\' => {
                let Some(d) = at(i + 1) else {
                    out.push('\\');
                    return i + 1;
                };
                match ascii_class(d).filter(|_| utf8) {
                    Some(class) => out.push_str(class),
                    None => {
                        out.push('\\');
                        out.push(d);
                    }
                }
                i += 2;
                continue;
            }
            '[' if at(i + 1) == Some(':') => {
                // A POSIX class, `[:alpha:]`, to its `:]`.
                let close = (i + 2..chars.len().saturating_sub(1))
                    .find(|&j| chars[j] == ':' && chars[j + 1] == ']');
                match close {
                    Some(j) => {
                        out.extend(&chars[i..j + 2]);
                        i = j + 2;
                        continue;
                    }
                    None => out.push_str("\\["),
                }
            }
            // Literal in PCRE; a nested class or a set operation to the crate.
            '[' | '&' | '~' => {
                out.push('\\');
                out.push(c);
            }
            '-' if at(i + 1) == Some('-') => out.push_str("\\-"),
            // Literal in PCRE's classes even with `x`.
            ' ' => out.push_str("\\x20"),
            '#' => out.push_str("\\#"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\u{b}' => out.push_str("\\x0B"),
            '\u{c}' => out.push_str("\\x0C"),
            _ => out.push(c),
        }
        i += 1;
    }
    i
}

fn describe(pattern: &str, e: &regex::Error) -> String {
    let text = e.to_string();
    let unsupported = ["look-around", "backreferences", "(?>", "possessive"];
    if unsupported.iter().any(|u| text.contains(u))
        || pattern.contains("(?>")
        || pattern.contains("*+")
        || pattern.contains("++")
    {
        return format!(
            "invalid regex \"{pattern}\": look-around, backreferences, atomic groups and \
             possessive quantifiers (PCRE) are not supported by ferrisix's linear-time regex engine"
        );
    }
    // The crate's message spans lines (the pattern with a caret under the error).
    let last = text
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("error:"))
        .map_or("invalid pattern", str::trim);
    // `re_match_compile`'s answer, which APISIX passes on as the check's error.
    format!(
        "pcre_compile() failed: {} in \"{pattern}\"",
        pcre_words(last)
    )
}

/// PCRE's words (its `pcre_compile` error texts) for the syntax errors both engines refuse;
/// an error PCRE has no counterpart for keeps the regex crate's words.
fn pcre_words(regex_crate: &str) -> &str {
    match regex_crate {
        "unclosed group" => "missing )",
        "unopened group" => "unmatched parentheses",
        "unclosed character class" => "missing terminating ] for character class",
        "repetition operator missing expression" => "nothing to repeat",
        "invalid repetition count range, the start must be <= the end" => {
            "numbers out of order in {} quantifier"
        }
        "invalid character class range, the start must be <= the end" => {
            "range out of order in character class"
        }
        "incomplete escape sequence, reached end of pattern prematurely" => "\\ at end of pattern",
        other => other,
    }
}

/// One piece of a replacement template.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Text(String),
    Group(usize),
}

/// An `ngx.re.sub` replacement, parsed once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replacement(Vec<Piece>);

impl Replacement {
    pub fn parse(template: &str) -> Replacement {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut chars = template.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            if c != '$' {
                text.push(c);
                continue;
            }
            let rest = &template[i + 1..];
            if rest.starts_with('$') {
                text.push('$');
                chars.next();
                continue;
            }
            let (digits, skip) = match rest.strip_prefix('{') {
                Some(inner) => match inner.find('}') {
                    Some(end) if end > 0 && inner[..end].bytes().all(|b| b.is_ascii_digit()) => {
                        (&inner[..end], end + 2)
                    }
                    _ => ("", 0),
                },
                None => {
                    let n = rest.bytes().take_while(u8::is_ascii_digit).count();
                    (&rest[..n], n)
                }
            };
            match digits.parse::<usize>() {
                Ok(n) => {
                    if !text.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut text)));
                    }
                    pieces.push(Piece::Group(n));
                    for _ in 0..skip {
                        chars.next();
                    }
                }
                Err(_) => text.push('$'),
            }
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Replacement(pieces)
    }

    /// The highest group the template names.
    pub fn max_group(&self) -> usize {
        self.0
            .iter()
            .filter_map(|p| match p {
                Piece::Group(n) => Some(*n),
                Piece::Text(_) => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// [`Replacement::expand`] for a body regex's match.
    pub fn expand_body(&self, regex: &BodyRegex, m: &BodyMatch<'_>, out: &mut Vec<u8>) {
        for p in &self.0 {
            match p {
                Piece::Text(t) => out.extend_from_slice(t.as_bytes()),
                Piece::Group(n) => out.extend_from_slice(regex.group(m, *n).unwrap_or_default()),
            }
        }
    }

    /// Appends the expansion for `caps` to `out` (a group that did not take part is empty).
    pub fn expand(&self, caps: &regex::Captures<'_>, out: &mut String) {
        for p in &self.0 {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Group(n) => out.push_str(caps.get(*n).map_or("", |m| m.as_str())),
            }
        }
    }
}

/// A compiled `[regex, replacement]` pair, checked as `ngx.re.sub` checks it: a template that
/// names a group the regex lacks is refused.
#[derive(Clone, Debug)]
pub struct Substitution {
    pub regex: Regex,
    pub replacement: Replacement,
}

impl Substitution {
    pub fn new(pattern: &str, replacement: &str) -> Result<Substitution, String> {
        let regex = compile(pattern, false)?;
        let replacement = Replacement::parse(replacement);
        if replacement.max_group() >= regex.captures_len() {
            return Err("invalid capturing variable name".into());
        }
        Ok(Substitution { regex, replacement })
    }

    /// `ngx.re.sub`: the first match replaced; `None` when the regex does not match.
    pub fn sub_first(&self, subject: &str) -> Option<String> {
        let caps = self.regex.captures(subject)?;
        let m = caps.get(0)?;
        let mut out = String::with_capacity(subject.len() + 16);
        out.push_str(&subject[..m.start()]);
        self.replacement.expand(&caps, &mut out);
        out.push_str(&subject[m.end()..]);
        Some(out)
    }

    /// `ngx.re.gsub`: every match replaced.
    pub fn sub_all(&self, subject: &str) -> String {
        let mut out = String::with_capacity(subject.len());
        let mut last = 0;
        for caps in self.regex.captures_iter(subject) {
            let Some(m) = caps.get(0) else { continue };
            out.push_str(&subject[last..m.start()]);
            self.replacement.expand(&caps, &mut out);
            last = m.end();
        }
        out.push_str(&subject[last..]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_as_ngx_re_sub_reads_them() {
        let s = Substitution::new("^/a/(.*)/(.*)", "/b/$1_$2-${1}x$$").unwrap();
        assert_eq!(s.sub_first("/a/x/y").unwrap(), "/b/x_y-xx$");
        assert_eq!(s.sub_first("/c"), None);
        assert_eq!(
            Substitution::new("^/(a)", "$2").unwrap_err(),
            "invalid capturing variable name"
        );
        let all = Substitution::new("o", "0").unwrap();
        assert_eq!(all.sub_all("foo boo"), "f00 b00");
        assert_eq!(Replacement::parse("$x ${y}").max_group(), 0);
    }

    #[test]
    fn pcre_only_syntax_is_refused_clearly() {
        for p in ["(?<=a)b", "a(?!b)", r"(a)\1", "(?>a)"] {
            let e = compile(p, false).unwrap_err();
            assert!(
                e.contains("not supported by ferrisix's linear-time regex engine"),
                "{e}"
            );
        }
        assert!(compile("^/API", true).unwrap().is_match("/api"));
        let r = compile_bytes("HELLO.", "jois").unwrap();
        assert!(r.is_match(b"xhello\n"));
        assert!(compile_bytes("a", "jz")
            .unwrap_err()
            .contains("unknown flag"));
        assert!(!compile_bytes("b", "a").unwrap().is_match(b"ab"));
        // Without `u`, bytes match as bytes (invalid UTF-8 included).
        assert!(compile_bytes("a.b", "").unwrap().is_match(b"a\xffb"));
    }

    /// A pattern PCRE refuses too is refused as `re_match_compile` words it
    /// (`t/plugin/uri-blocker.t`: `pcre_compile() failed: missing ) in ".+("`).
    #[test]
    fn syntax_errors_in_pcre_words() {
        let cases = [
            (".+(", "missing )"),
            ("^b(", "missing )"),
            ("a)", "unmatched parentheses"),
            ("[ab", "missing terminating ] for character class"),
            ("*a", "nothing to repeat"),
            ("a{3,1}", "numbers out of order in {} quantifier"),
            ("[z-a]", "range out of order in character class"),
            ("ab\\", "\\ at end of pattern"),
        ];
        for (pattern, message) in cases {
            let expected = format!("pcre_compile() failed: {message} in \"{pattern}\"");
            assert_eq!(compile(pattern, false).unwrap_err(), expected);
            assert_eq!(compile_bytes(pattern, "jo").unwrap_err(), expected);
        }
    }

    #[test]
    fn catastrophic_patterns_stay_linear() {
        // (a+)+$ backtracks exponentially in PCRE on "aaaa...b"; here it is one pass.
        let r = compile("(a+)+$", false).unwrap();
        let subject = format!("{}b", "a".repeat(50_000));
        assert!(!r.is_match(&subject));
    }
}
