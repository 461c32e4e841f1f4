//! Regex substitution over a streamed body (response-rewrite's `filters`) in bounded memory.
//!
//! APISIX holds the whole body (up to `max_resp_body_size`) and runs `ngx.re.sub`/`gsub` on it.
//! Here the body passes through a window: a stage keeps at most two windows of bytes, replaces
//! the matches that start in the older half and sends that half on. Whether a match starts at
//! a position, and which, depends only on the bytes a match from there can reach, plus one
//! for the assertions that look past its end (`\b`, `$`): with a window that long the answer
//! is the one the whole body gives. So a pattern with a longest match (`hello`, `a{1,8}`, most
//! filters) carries only that many bytes from one read to the next, and a match split across
//! reads is found as on the whole body.
//!
//! A pattern without a bound (`a*`, `.+`, `[^<]*`) could need the rest of the body: its stage
//! holds up to a limit (response-rewrite's: 16 MiB, or `max_resp_body_size` when smaller), so
//! on a body that fits it answers as APISIX does. Past the limit it falls back to a window of
//! half the limit, to keep memory bounded: a match that would reach further than that from its
//! start is cut at the window's end or, when what ends it has not come yet, not found.
//!
//! A few bytes already sent stay in front of the window as context, so `^`, `\b` and other
//! look-behind assertions see what came before.

use crate::support::pcre::{BodyRegex, Replacement};

/// How many already-sent bytes stay in front of the window for assertions.
const CONTEXT: usize = 8;

/// One `[regex, replacement]` stage.
#[derive(Debug)]
pub struct StreamSub {
    regex: BodyRegex,
    replacement: Replacement,
    /// `gsub` (every match) rather than `sub` (the first).
    global: bool,
    window: usize,
    buf: Vec<u8>,
    /// Bytes at the start of `buf` already sent (context only).
    context: usize,
    /// `sub` replaced its match: the rest passes unchanged.
    done: bool,
}

impl StreamSub {
    /// `hold`: the most a stage keeps when the pattern has no longest match.
    pub fn new(regex: BodyRegex, replacement: Replacement, global: bool, hold: usize) -> StreamSub {
        let unbounded = hold / 2;
        // The longest match and one byte more for the assertions after it.
        let window = regex
            .max_len()
            .map_or(unbounded, |len| len.saturating_add(1).min(unbounded));
        StreamSub {
            regex,
            replacement,
            global,
            window: window.max(1),
            buf: Vec::new(),
            context: 0,
            done: false,
        }
    }

    /// Feeds `data`; answers what can be sent now (all of it once `end`).
    pub fn push(&mut self, data: &[u8], end: bool) -> Vec<u8> {
        if self.done {
            let mut out = std::mem::take(&mut self.buf);
            out.drain(..self.context);
            self.context = 0;
            out.extend_from_slice(data);
            return out;
        }
        self.buf.extend_from_slice(data);
        let pending = self.buf.len() - self.context;
        if !end && pending < 2 * self.window {
            return Vec::new();
        }
        // Matches starting before `safe` are final.
        let safe = if end {
            self.buf.len()
        } else {
            self.buf.len() - self.window
        };
        let mut out = Vec::with_capacity(safe - self.context + 64);
        let mut pos = self.context;
        while pos <= self.buf.len() {
            let Some(m) = self.regex.captures_at(&self.buf, pos) else {
                // Anchored, nothing matches where the last match ended: PCRE's `gsub` stops
                // there, and no later search may start further on.
                if self.regex.anchored() && (end || pos < safe) {
                    self.done = true;
                }
                break;
            };
            if m.start >= safe && !end {
                break;
            }
            out.extend_from_slice(&self.buf[pos..m.start]);
            self.replacement.expand_body(&self.regex, &m, &mut out);
            pos = m.end;
            if !self.global {
                self.done = true;
                break;
            }
            if m.start == m.end {
                // An empty match: step over one byte so the search moves on.
                match self.buf.get(pos) {
                    Some(b) => {
                        out.push(*b);
                        pos += 1;
                    }
                    None => break,
                }
            }
        }
        let cut = if self.done || end {
            self.buf.len()
        } else {
            pos.max(safe)
        };
        out.extend_from_slice(&self.buf[pos.min(cut)..cut]);
        // Keep the unsent rest, behind a little of what was sent.
        let keep_from = cut
            .saturating_sub(CONTEXT)
            .max(if self.done { cut } else { 0 });
        self.buf.drain(..keep_from);
        self.context = cut - keep_from;
        if end {
            self.buf.clear();
            self.context = 0;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::pcre::compile_bytes;

    fn stage(re: &str, rep: &str, global: bool, hold: usize) -> StreamSub {
        StreamSub::new(
            compile_bytes(re, "jo").unwrap(),
            Replacement::parse(rep),
            global,
            hold,
        )
    }

    /// Streams `body` in chunks of `chunk` bytes through `s`.
    fn stream(s: &mut StreamSub, body: &[u8], chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let chunks: Vec<&[u8]> = body.chunks(chunk).collect();
        for (i, c) in chunks.iter().enumerate() {
            out.extend(s.push(c, i + 1 == chunks.len()));
        }
        if chunks.is_empty() {
            out.extend(s.push(b"", true));
        }
        out
    }

    #[test]
    fn same_as_whole_body_for_matches_within_the_window() {
        let body: Vec<u8> = (0..5000)
            .flat_map(|i| format!("line {i}: hello world\n").into_bytes())
            .collect();
        let whole_global = regex::bytes::Regex::new("(?-u)hello (w)orld")
            .unwrap()
            .replace_all(&body, &b"bye ${1}0rld"[..])
            .into_owned();
        for chunk in [1, 7, 100, 4096, body.len()] {
            let mut g = stage("hello (w)orld", "bye ${1}0rld", true, 64);
            assert_eq!(stream(&mut g, &body, chunk), whole_global, "chunk {chunk}");
            let mut once = stage("world", "W", false, 64);
            let out = stream(&mut once, &body, chunk);
            assert_eq!(out.len(), body.len() - 4);
            assert!(out.starts_with(b"line 0: hello W\nline 1: hello world"));
        }
    }

    #[test]
    fn anchors_see_the_bytes_before() {
        let mut s = stage("^a", "X", true, 4);
        assert_eq!(
            stream(&mut s, b"aaaaaaaaaaaaaaaaaaaa", 3),
            b"Xaaaaaaaaaaaaaaaaaaa"
        );
        let mut s = stage(r"\bcat\b", "dog", true, 8);
        assert_eq!(
            stream(&mut s, b"cat concat cat cats cat", 2),
            b"dog concat dog cats dog"
        );
        let mut s = stage("x*", "-", true, 4);
        assert_eq!(stream(&mut s, b"abc", 1), b"-a-b-c-");
        let mut s = stage("z", "y", true, 4);
        assert_eq!(stream(&mut s, b"", 1), b"");
    }

    /// `ngx.re.sub`/`gsub` over a whole body, as response-rewrite's `filters` run it.
    fn whole(re: &str, options: &str, rep: &str, global: bool, body: &[u8]) -> String {
        let mut s = StreamSub::new(
            compile_bytes(re, options).unwrap(),
            Replacement::parse(rep),
            global,
            1 << 20,
        );
        String::from_utf8(s.push(body, true)).unwrap()
    }

    /// PCRE's answers (ngx.re, no `m`): `$` and `\Z` match at the very end or before a final
    /// newline, `\z` only at the very end.
    #[test]
    fn dollar_as_pcre() {
        let g = |re: &str, opts: &str, rep: &str, body: &str| {
            whole(re, opts, rep, true, body.as_bytes())
        };
        let once = |re: &str, opts: &str, rep: &str, body: &str| {
            whole(re, opts, rep, false, body.as_bytes())
        };
        assert_eq!(g("o$", "jo", "0", "hello\n"), "hell0\n");
        assert_eq!(g("o$", "jo", "0", "hello"), "hell0");
        assert_eq!(g("o$", "jo", "0", "foo\nfoo\n"), "foo\nfo0\n");
        assert_eq!(
            g("o$", "jo", "0", "foo\n\n"),
            "foo\n\n",
            "only before the last newline"
        );
        assert_eq!(once("$", "jo", "X", "a\n"), "aX\n");
        assert_eq!(g("$", "jo", "X", "a\n"), "aX\nX");
        assert_eq!(g("o\\Z", "jo", "0", "foo\n"), "fo0\n");
        assert_eq!(g("o\\z", "jo", "0", "foo\n"), "foo\n");
        assert_eq!(
            g("\\n$", "jo", "N", "a\n"),
            "aN",
            "the final newline itself, ending at the end"
        );
        // A newline taken right after `$`: only the final one, as PCRE.
        assert_eq!(g("a$\\n", "jo", "X", "a\n"), "X");
        assert_eq!(g("a$\\n", "jo", "X", "a\na\n"), "a\nX");
        assert_eq!(g("a\\Z\\s", "jo", "X", "a\n"), "X");
        assert_eq!(g("a$\n", "jo", "X", "a\n"), "X");
        assert_eq!(g("a$\\nb", "jo", "X", "a\nb"), "a\nb");
        assert_eq!(g("(a$\\n)", "jo", "[$1]", "a\n"), "[a\n]");
        // Captures keep PCRE's numbers.
        assert_eq!(once("(l+)(o)$", "jo", "$2$1", "hello\n"), "heoll\n");
        assert_eq!(once("(l+)(o)$", "jo", "${0}!", "hello\n"), "hello!\n");
        // `$` inside a class or escaped is a dollar.
        assert_eq!(g("[$]|\\$", "jo", "D", "$1 $\n"), "D1 D\n");
        // With `m`, before every newline (and at the end).
        assert_eq!(g("o$", "jom", "0", "foo\nfoo\n"), "fo0\nfo0\n");
        assert_eq!(g("(?m)o$", "jo", "0", "foo\nfoo\n"), "fo0\nfo0\n");
        assert_eq!(g("(?m:o$)|x$", "jo", "0", "foo\nfox\n"), "fo0\nfo0\n");
    }

    /// The other options and PCRE's reading of the pattern.
    #[test]
    fn options_as_pcre() {
        let g = |re: &str, opts: &str, rep: &str, body: &str| {
            whole(re, opts, rep, true, body.as_bytes())
        };
        // `^` with `m`: after internal newlines, not after the one that ends the body.
        assert_eq!(g("^", "jom", ">", "a\nb\n"), ">a\n>b\n");
        assert_eq!(g("^", "jo", ">", "a\nb\n"), ">a\nb\n");
        // `x`: whitespace and comments ignored, but not inside a class.
        assert_eq!(g("a b # a comment", "jox", "X", "ab a b"), "X a b");
        assert_eq!(g("[ ]", "jox", "_", "a b"), "a_b");
        // `.` stops at a newline unless `s`.
        assert_eq!(g("a.b", "jo", "X", "a\nb axb"), "a\nb X");
        assert_eq!(g("a.b", "jos", "X", "a\nb"), "X");
        // `i`.
        assert_eq!(g("HeLLo", "joi", "X", "hello HELLO"), "X X");
        // `a`: every match starts where the search does.
        assert_eq!(g("a", "joa", "b", "aaxa"), "bbxa");
        // `u`: `.` is one character; `\w` and `\d` stay ASCII as in PCRE without UCP.
        assert_eq!(g("^.", "jou", "X", "éa"), "Xa");
        assert_eq!(g("\\w+", "jou", "W", "éa1_ é"), "éW é");
        assert_eq!(g("\\d", "jou", "D", "\u{663}3"), "\u{663}D");
        // A class's literal `[` and PCRE's literal `&&`.
        assert_eq!(g("[[a]", "jo", "X", "[ab"), "XXb");
        assert_eq!(g("[a&&b]", "jo", "X", "&c"), "Xc");
    }

    /// A pattern with a longest match sends on at once all but that many bytes (and one for
    /// the assertions after a match), so a streamed body goes on as it comes, in flat memory.
    #[test]
    fn bounded_patterns_carry_only_their_longest_match() {
        let mut s = stage("needle|pin", "thread", true, 1 << 20);
        let mut out = s.push(b"a needle and a pi", false);
        assert_eq!(out, b"a thread a", "the last 7 bytes held");
        out.extend(s.push(b"n and more", false));
        out.extend(s.push(b"", true));
        assert_eq!(out, b"a thread and a thread and more");
        // `\b` and `$` at the edge of what has come wait for the next byte.
        let mut s = stage(r"cat\b", "dog", true, 1 << 20);
        let mut out = s.push(b"a cat", false);
        out.extend(s.push(b"s cat", false));
        out.extend(s.push(b"\n", true));
        assert_eq!(out, b"a cats dog\n");
        let mut s = stage("o$", "0", true, 1 << 20);
        let mut out = s.push(b"foo", false);
        out.extend(s.push(b"\n", false));
        out.extend(s.push(b"", true));
        assert_eq!(out, b"fo0\n");
        let mut s = stage("ab", "X", true, 1 << 20);
        assert_eq!(stream(&mut s, &b"ab".repeat(1000), 1), b"X".repeat(1000));
    }

    /// A pattern without a longest match sees the whole body (up to the stage's limit), as
    /// APISIX's gsub over the held body does: here a match of 3 MiB split across reads.
    #[test]
    fn unbounded_patterns_see_the_whole_body() {
        let mut body = b"<start>".to_vec();
        body.extend(std::iter::repeat_n(b'a', 3 << 20));
        body.extend(b"<end>\n");
        let mut s = stage("<start>a*<end>", "X", true, 16 << 20);
        assert_eq!(stream(&mut s, &body, 64 * 1024), b"X\n");
        let mut s = stage("<start>.*$", "X", false, 16 << 20);
        assert_eq!(stream(&mut s, &body, 64 * 1024), b"X\n");
    }

    /// `a` (anchored): `gsub` replaces matches only while each starts where the last ended,
    /// and stops at the first place that does not match, however the body is cut.
    #[test]
    fn anchored_stops_at_the_first_miss() {
        for chunk in [1, 2, 3, 100] {
            let mut s = StreamSub::new(
                compile_bytes("a", "joa").unwrap(),
                Replacement::parse("b"),
                true,
                1 << 20,
            );
            assert_eq!(
                stream(&mut s, b"aaxaaaaaaaaaaaaaaaaa", chunk),
                b"bbxaaaaaaaaaaaaaaaaa",
                "chunk {chunk}"
            );
            let mut s = StreamSub::new(
                compile_bytes("a", "joa").unwrap(),
                Replacement::parse("b"),
                false,
                1 << 20,
            );
            assert_eq!(
                stream(&mut s, b"xaaaaaaaaaaaaaaaaaa", chunk),
                b"xaaaaaaaaaaaaaaaaaa",
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn memory_stays_bounded() {
        // `needle`: 6 bytes and one are carried, whatever came.
        let mut s = stage("needle", "pin", true, 1024);
        let chunk = vec![b'a'; 16 * 1024];
        for _ in 0..200 {
            let _ = s.push(&chunk, false);
            assert!(s.buf.len() <= 7 + CONTEXT, "{}", s.buf.len());
        }
        // Without a bound: the stage's limit, then windows of half of it.
        let mut s = stage("a+", "b", true, 4096);
        for _ in 0..200 {
            let _ = s.push(&chunk[..1000], false);
            assert!(s.buf.len() <= 4096 + 1000 + CONTEXT, "{}", s.buf.len());
        }
    }
}
