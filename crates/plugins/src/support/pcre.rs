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

/// Compiles a body regex with `ngx.re` options (`i` caseless, `m` multi-line, `s` dot-all,
/// `x` extended, `u` UTF-8, `a` anchored; `j`, `o`, `D`, `J` change nothing here). It matches
/// bytes as PCRE does without `u`.
pub fn compile_bytes(pattern: &str, options: &str) -> Result<regex::bytes::Regex, String> {
    if let Some(other) = options.chars().find(|o| !"imsxuUajoDJd".contains(*o)) {
        return Err(format!("unknown flag \"{other}\""));
    }
    let has = |o: char| options.contains(o);
    let anchored;
    let source = if has('a') {
        // `a`: a match must start where the search does.
        anchored = format!("\\A(?:{pattern})");
        anchored.as_str()
    } else {
        pattern
    };
    regex::bytes::RegexBuilder::new(source)
        .case_insensitive(has('i'))
        .multi_line(has('m'))
        .dot_matches_new_line(has('s'))
        .ignore_whitespace(has('x'))
        .unicode(has('u') || has('U'))
        .size_limit(1 << 22)
        .build()
        .map_err(|e| describe(pattern, &e))
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

    /// [`Replacement::expand`] for a byte regex.
    pub fn expand_bytes(&self, caps: &regex::bytes::Captures<'_>, out: &mut Vec<u8>) {
        for p in &self.0 {
            match p {
                Piece::Text(t) => out.extend_from_slice(t.as_bytes()),
                Piece::Group(n) => {
                    out.extend_from_slice(caps.get(*n).map_or(&[][..], |m| m.as_bytes()))
                }
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
