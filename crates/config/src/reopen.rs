//! The signal to reopen log files (SIGUSR1, after logrotate moved them away, or the log-rotate
//! plugin's rotation), made once by the binary and handed to every writer of a file: the access
//! log, the error log, and plugins that log to files.
//!
//! A writer that reads the generation marks its write as in flight ([`LogReopen::writing`]) for
//! as long as it may still write to the file it chose, so that whoever moved a file away can
//! wait until nothing writes to it any more ([`LogReopen::settle`]) before compressing it: a
//! line written late to the moved file would otherwise be lost with it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// Clones share one signal. Writers either compare [`LogReopen::generation`] with the one
/// their file was opened at (a load, for hot paths) or wait on [`LogReopen::subscribe`].
#[derive(Clone, Debug)]
pub struct LogReopen {
    generation: Arc<AtomicU64>,
    tx: Arc<watch::Sender<u64>>,
    /// Writes that read a generation and may not have finished writing yet.
    in_flight: Arc<AtomicUsize>,
}

/// A write in flight (see [`LogReopen::writing`]); it ends when dropped.
#[derive(Debug)]
pub struct WriteInFlight<'a>(&'a AtomicUsize);

impl Drop for WriteInFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
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
            in_flight: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Marks a write in flight. Taken before the writer reads [`LogReopen::generation`] and
    /// held until its bytes are written: a writer that saw the generation before a
    /// [`LogReopen::trigger`] is then still counted when the trigger returns. One atomic add
    /// per write of a buffer, never a lock.
    pub fn writing(&self) -> WriteInFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        WriteInFlight(&self.in_flight)
    }

    /// After a [`LogReopen::trigger`]: waits (blocking, polling every millisecond) until no
    /// write that may have seen the earlier generation is in flight, for at most `timeout`.
    /// Every write after that goes to a file opened anew. `false` when the time ran out.
    ///
    /// Why a count of zero is enough: a write that read the earlier generation counted itself
    /// before reading it, so before the trigger; it stays counted until it has written. A
    /// moment after the trigger with nothing counted is a moment after each such write ended.
    pub fn settle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.in_flight.load(Ordering::SeqCst) == 0 {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Asks every writer to reopen its file.
    pub fn trigger(&self) {
        let g = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        self.tx.send_replace(g);
    }

    /// Whether `other` is a clone of this signal.
    pub fn same_signal(&self, other: &LogReopen) -> bool {
        Arc::ptr_eq(&self.generation, &other.generation)
    }

    /// How many times reopening was asked for.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
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

    #[test]
    fn settle_waits_for_the_writes_in_flight() {
        let signal = LogReopen::new();
        assert!(signal.settle(Duration::ZERO));
        let write = signal.writing();
        signal.trigger();
        assert!(!signal.settle(Duration::from_millis(20)));
        let waiter = {
            let signal = signal.clone();
            std::thread::spawn(move || signal.settle(Duration::from_secs(30)))
        };
        drop(write);
        assert!(waiter.join().unwrap());
    }
}
