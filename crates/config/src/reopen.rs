//! The signal to reopen log files (SIGUSR1, after logrotate moved them away), made once by the
//! binary and handed to every writer of a file: the access log, the error log, and plugins
//! that log to files.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

/// Clones share one signal. Writers either compare [`LogReopen::generation`] with the one
/// their file was opened at (a load, for hot paths) or wait on [`LogReopen::subscribe`].
#[derive(Clone, Debug)]
pub struct LogReopen {
    generation: Arc<AtomicU64>,
    tx: Arc<watch::Sender<u64>>,
}

impl Default for LogReopen {
    fn default() -> Self {
        LogReopen::new()
    }
}

impl LogReopen {
    pub fn new() -> LogReopen {
        LogReopen {
            generation: Arc::new(AtomicU64::new(0)),
            tx: Arc::new(watch::channel(0).0),
        }
    }

    /// Asks every writer to reopen its file.
    pub fn trigger(&self) {
        let g = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        self.tx.send_replace(g);
    }

    /// How many times reopening was asked for.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// A receiver that sees each new generation.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn subscribers_and_generation_see_each_trigger() {
        let signal = LogReopen::new();
        let mut rx = signal.subscribe();
        assert_eq!(signal.generation(), 0);
        signal.clone().trigger();
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow(), 1);
        assert_eq!(signal.generation(), 1);
    }
}
