//! Log lines that cannot flood the log.
//!
//! * [`Repeats`]: a warning that can fire on every request (a dropped mirror copy, a failed
//!   log batch) is written once per interval with the count of occurrences it stands for.
//!   Each component that logs holds its own, so nothing is shared across the process.
//! * [`clip`]: text a client chose (SNI, Host, URI, header values) is cut to
//!   [`CLIENT_TEXT_MAX`] bytes in a log line, with the length it had.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::coarse_monotonic_ms;

/// The most bytes of client-supplied text a log line carries.
pub const CLIENT_TEXT_MAX: usize = 256;

/// `text` for a log line: whole up to [`CLIENT_TEXT_MAX`] bytes, else its start (cut on a
/// character boundary) and how long it was.
pub fn clip(text: &str) -> Clipped<'_> {
    Clipped(text)
}

/// See [`clip`].
#[derive(Clone, Copy, Debug)]
pub struct Clipped<'a>(&'a str);

impl fmt::Display for Clipped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0;
        if text.len() <= CLIENT_TEXT_MAX {
            return f.write_str(text);
        }
        let mut end = CLIENT_TEXT_MAX;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        write!(f, "{}... ({} bytes)", &text[..end], text.len())
    }
}

/// Counts a repeated event and says when to log it: the first occurrence at once, then at
/// most one line per interval, carrying how many occurrences it stands for (the ones since
/// the last line written, this one included). Occurrences after the last line are reported
/// with the next one.
#[derive(Debug)]
pub struct Repeats {
    interval_ms: u64,
    /// When the last line was written; `NEVER` before the first.
    last_ms: AtomicU64,
    /// Occurrences not yet reported.
    pending: AtomicU64,
}

const NEVER: u64 = u64::MAX;

impl Repeats {
    /// One line per `interval` at most.
    pub fn new(interval: Duration) -> Repeats {
        Repeats {
            interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
            last_ms: AtomicU64::new(NEVER),
            pending: AtomicU64::new(0),
        }
    }

    /// One line a second at most.
    pub fn per_second() -> Repeats {
        Repeats::new(Duration::from_secs(1))
    }

    /// Counts one occurrence; `Some(count)` when a line is due now, for `count` occurrences.
    pub fn hit(&self) -> Option<u64> {
        self.hit_at(coarse_monotonic_ms())
    }

    /// [`Repeats::hit`] at `now_ms` on the monotonic clock.
    pub fn hit_at(&self, now_ms: u64) -> Option<u64> {
        self.pending.fetch_add(1, Ordering::Relaxed);
        let last = self.last_ms.load(Ordering::Relaxed);
        if last != NEVER && now_ms < last.saturating_add(self.interval_ms) {
            return None;
        }
        // One caller wins the line; the others' occurrences go into it or the next one.
        self.last_ms
            .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
            .ok()?;
        Some(self.pending.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_within_an_interval_make_one_line_with_their_count() {
        let r = Repeats::new(Duration::from_secs(1));
        assert_eq!(r.hit_at(10_000), Some(1), "the first one is logged at once");
        for i in 1..1000 {
            assert_eq!(r.hit_at(10_000 + i), None, "call {i} within the interval");
        }
        assert_eq!(
            r.hit_at(11_000),
            Some(1000),
            "the next line counts the 999 held back and itself"
        );
        assert_eq!(r.hit_at(11_500), None);
        assert_eq!(r.hit_at(13_000), Some(2));
        assert_eq!(r.hit_at(13_001), None);
    }

    #[test]
    fn repeats_from_many_threads_are_all_counted() {
        let r = std::sync::Arc::new(Repeats::new(Duration::from_secs(3600)));
        let logged: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let r = r.clone();
                    s.spawn(move || (0..1000).filter_map(|_| r.hit_at(5)).sum::<u64>())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert!(logged >= 1, "one line for the first");
        assert_eq!(
            r.hit_at(5 + 3_600_000).unwrap() + logged,
            4001,
            "every occurrence is reported once"
        );
    }

    #[test]
    fn client_text_is_clipped_on_a_character_boundary() {
        assert_eq!(clip("a.test").to_string(), "a.test");
        let exact = "x".repeat(CLIENT_TEXT_MAX);
        assert_eq!(clip(&exact).to_string(), exact);
        let long = "é".repeat(10_000);
        let shown = clip(&long).to_string();
        assert!(shown.ends_with("... (20000 bytes)"), "{shown}");
        let kept = shown.trim_end_matches("... (20000 bytes)");
        assert!(kept.len() <= CLIENT_TEXT_MAX && kept.len() >= CLIENT_TEXT_MAX - 1);
        assert!(kept.chars().all(|c| c == 'é'));
    }
}
