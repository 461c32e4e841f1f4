//! The gateway's own error log as plugins may read it (APISIX's `ngx.errlog` capture, which
//! error-log-logger ships): while a plugin asks for lines up to a level
//! ([`ErrorLogTap::want`]), the binary's log hands each such line to the tap, which keeps at
//! most [`CAPACITY`] of them until a reader takes them. Nothing is formatted or kept while
//! no plugin asks (one atomic load per log event).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

/// Lines kept unread at most; older ones are dropped (and counted) past it.
pub const CAPACITY: usize = 8192;

/// Severities, most severe first, as `tracing`'s levels.
pub const ERROR: u8 = 1;
pub const WARN: u8 = 2;
pub const INFO: u8 = 3;
pub const DEBUG: u8 = 4;
pub const TRACE: u8 = 5;

#[derive(Debug, Default)]
pub struct ErrorLogTap {
    /// The least severe level asked for (0: none, nothing is captured).
    wanted: AtomicU8,
    lines: Mutex<VecDeque<(u8, String)>>,
    dropped: AtomicU64,
}

impl ErrorLogTap {
    pub fn new() -> ErrorLogTap {
        ErrorLogTap::default()
    }

    /// Whether a line of `level` is wanted now (the log formats it only then).
    pub fn wants(&self, level: u8) -> bool {
        level <= self.wanted.load(Ordering::Relaxed)
    }

    /// Asks for the lines of `level` and more severe ones (0: none).
    pub fn want(&self, level: u8) {
        self.wanted.store(level, Ordering::Relaxed);
    }

    /// A line of the log, at `level`.
    pub fn push(&self, level: u8, line: String) {
        if !self.wants(level) {
            return;
        }
        let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        if lines.len() == CAPACITY {
            lines.pop_front();
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        lines.push_back((level, line));
    }

    /// The lines kept so far, oldest first, with their levels.
    pub fn take(&self) -> Vec<(u8, String)> {
        let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        lines.drain(..).collect()
    }

    /// Lines dropped because no reader took them in time.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_kept_only_when_wanted_and_bounded() {
        let tap = ErrorLogTap::new();
        tap.push(ERROR, "before".into());
        assert!(tap.take().is_empty());
        tap.want(WARN);
        tap.push(INFO, "info".into());
        tap.push(WARN, "warn".into());
        tap.push(ERROR, "error".into());
        assert_eq!(
            tap.take(),
            vec![(WARN, "warn".to_owned()), (ERROR, "error".to_owned())]
        );
        for i in 0..CAPACITY + 2 {
            tap.push(ERROR, i.to_string());
        }
        let kept = tap.take();
        assert_eq!(kept.len(), CAPACITY);
        assert_eq!(kept[0].1, "2");
        assert_eq!(tap.dropped(), 2);
    }
}
