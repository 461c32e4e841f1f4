//! Regex substitution over a streamed body (response-rewrite's `filters`) in bounded memory.
//!
//! APISIX holds the whole body (up to `max_resp_body_size`) and runs `ngx.re.sub`/`gsub` on it.
//! Here the body passes through a window: a stage keeps at most two windows of bytes, replaces
//! the matches that start in the older half (a match up to a window long is seen whole) and
//! sends that half on. Matches longer than the window are not found; every shorter one is
//! replaced exactly as on the whole body. A few bytes already sent stay in front of the window
//! as context, so `^`, `\b` and other look-behind assertions see what came before.

use regex::bytes::Regex;

use crate::support::pcre::Replacement;

/// How many already-sent bytes stay in front of the window for assertions.
const CONTEXT: usize = 8;

/// One `[regex, replacement]` stage.
#[derive(Debug)]
pub struct StreamSub {
    regex: Regex,
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
    pub fn new(regex: Regex, replacement: Replacement, global: bool, window: usize) -> StreamSub {
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
            let Some(caps) = self.regex.captures_at(&self.buf, pos) else {
                break;
            };
            let Some(m) = caps.get(0) else { break };
            if m.start() >= safe && !end {
                break;
            }
            out.extend_from_slice(&self.buf[pos..m.start()]);
            self.replacement.expand_bytes(&caps, &mut out);
            pos = m.end();
            if !self.global {
                self.done = true;
                break;
            }
            if m.is_empty() {
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

    fn stage(re: &str, rep: &str, global: bool, window: usize) -> StreamSub {
        StreamSub::new(
            compile_bytes(re, "jo").unwrap(),
            Replacement::parse(rep),
            global,
            window,
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
        let mut s = stage(r"\bcat\b", "dog", true, 4);
        assert_eq!(
            stream(&mut s, b"cat concat cat cats cat", 2),
            b"dog concat dog cats dog"
        );
        let mut s = stage("x*", "-", true, 4);
        assert_eq!(stream(&mut s, b"abc", 1), b"-a-b-c-");
        let mut s = stage("z", "y", true, 4);
        assert_eq!(stream(&mut s, b"", 1), b"");
    }

    #[test]
    fn memory_stays_bounded() {
        let mut s = stage("needle", "pin", true, 1024);
        let chunk = vec![b'a'; 16 * 1024];
        for _ in 0..200 {
            let _ = s.push(&chunk, false);
            assert!(s.buf.len() <= 2 * 1024 + chunk.len() + CONTEXT);
        }
    }
}
