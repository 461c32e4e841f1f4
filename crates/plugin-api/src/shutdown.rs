//! The gateway's graceful shutdown as background tasks see it: they learn when it starts, and
//! hold it open while they still have work that must not be lost (the loggers' batches). The
//! binary starts it once the workers finished their requests in flight, then waits (bounded)
//! for every holder to let go.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};

/// The shutdown of one gateway; clones share it.
#[derive(Clone, Debug)]
pub struct Shutdown(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    started: watch::Sender<bool>,
    holders: AtomicUsize,
    released: Notify,
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown::new()
    }
}

/// Work a shutdown waits for, until dropped.
#[derive(Debug)]
pub struct ShutdownHold(Arc<Inner>);

impl Drop for ShutdownHold {
    fn drop(&mut self) {
        if self.0.holders.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.released.notify_waiters();
        }
    }
}

impl Shutdown {
    pub fn new() -> Shutdown {
        Shutdown(Arc::new(Inner {
            started: watch::channel(false).0,
            holders: AtomicUsize::new(0),
            released: Notify::new(),
        }))
    }

    /// Whether the shutdown started.
    pub fn is_started(&self) -> bool {
        *self.0.started.borrow()
    }

    /// Resolves once the shutdown started.
    pub async fn started(&self) {
        let mut rx = self.0.started.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Holds the shutdown open until the hold is dropped.
    pub fn hold(&self) -> ShutdownHold {
        self.0.holders.fetch_add(1, Ordering::AcqRel);
        ShutdownHold(self.0.clone())
    }

    /// Starts the shutdown and waits up to `timeout` for every hold to be dropped; answers
    /// whether they all were.
    pub async fn drain(&self, timeout: Duration) -> bool {
        self.0.started.send_replace(true);
        let wait = async {
            loop {
                let released = self.0.released.notified();
                if self.0.holders.load(Ordering::Acquire) == 0 {
                    return;
                }
                released.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn drain_waits_for_holders() {
        let s = Shutdown::new();
        assert!(s.drain(Duration::from_millis(10)).await, "nothing held");
        let s = Shutdown::new();
        let hold = s.hold();
        let watcher = s.clone();
        let task = tokio::spawn(async move {
            watcher.started().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(hold);
        });
        assert!(!s.is_started());
        assert!(s.drain(Duration::from_secs(5)).await);
        assert!(s.is_started());
        task.await.unwrap();
        let stuck = Shutdown::new();
        let _hold = stuck.hold();
        assert!(!stuck.drain(Duration::from_millis(20)).await);
    }
}
