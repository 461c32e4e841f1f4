//! Draining a server's connections without failing a request.
//!
//! A server that stops (SIGTERM, or a successor took its listeners over) has open connections
//! with requests in flight, kept-alive HTTP/1.1 connections whose client may be sending the
//! next request at this very moment, and HTTP/2 sessions. Closing an idle HTTP/1.1 connection
//! races with that next request: the client sees the connection end before an answer, which a
//! load generator counts as a socket error and a non-idempotent request cannot safely retry.
//! So a draining connection is closed only where no request can be lost:
//!
//! * HTTP/1.1: every response whose head is written after the drain began carries
//!   `Connection: close` (hyper then closes after it), so a busy connection ends right after its
//!   next answer; one that stays idle for [`IDLE_GRACE`] is closed (a client silent that long
//!   is between conversations, as keep-alive clients that retry expect).
//! * HTTP/2: GOAWAY at once; streams in flight finish, the client opens new ones elsewhere.
//!
//! [`Drain::finished`] resolves when every connection of the server has ended.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

/// How long a draining HTTP/1.1 connection with no request in flight stays open for its
/// client's next request.
pub const IDLE_GRACE: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct State {
    draining: AtomicBool,
    started: Notify,
    live: AtomicUsize,
    ended: Notify,
}

/// One server's drain signal and its count of open connections. Clones share both.
#[derive(Clone, Debug, Default)]
pub struct Drain {
    state: Arc<State>,
}

impl Drain {
    pub fn new() -> Drain {
        Drain::default()
    }

    /// Begins draining every connection of the server (idempotent).
    pub fn start(&self) {
        if !self.state.draining.swap(true, Ordering::AcqRel) {
            self.state.started.notify_waiters();
        }
    }

    pub fn is_draining(&self) -> bool {
        self.state.draining.load(Ordering::Acquire)
    }

    /// Resolves once [`Drain::start`] was called.
    pub async fn started(&self) {
        loop {
            let notified = self.state.started.notified();
            tokio::pin!(notified);
            // Registered before the check, so a start in between is not missed.
            notified.as_mut().enable();
            if self.is_draining() {
                return;
            }
            notified.await;
        }
    }

    /// Counts a connection as open until the guard is dropped.
    pub fn enter(&self) -> Open {
        self.state.live.fetch_add(1, Ordering::AcqRel);
        Open {
            state: self.state.clone(),
        }
    }

    /// Open connections.
    pub fn open_connections(&self) -> usize {
        self.state.live.load(Ordering::Acquire)
    }

    /// Resolves when no connection of the server is open.
    pub async fn finished(&self) {
        loop {
            let notified = self.state.ended.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.open_connections() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// An open connection of a [`Drain`]'s server.
#[derive(Debug)]
pub struct Open {
    state: Arc<State>,
}

impl Drop for Open {
    fn drop(&mut self) {
        if self.state.live.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.state.ended.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn finished_waits_for_every_open_connection() {
        let drain = Drain::new();
        let a = drain.enter();
        let b = drain.enter();
        assert_eq!(drain.open_connections(), 2);
        let waiter = tokio::spawn({
            let drain = drain.clone();
            async move { drain.finished().await }
        });
        drop(a);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(b);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn started_resolves_for_waiters_before_and_after() {
        let drain = Drain::new();
        let early = tokio::spawn({
            let drain = drain.clone();
            async move { drain.started().await }
        });
        tokio::task::yield_now().await;
        drain.start();
        drain.start();
        tokio::time::timeout(Duration::from_secs(5), early)
            .await
            .unwrap()
            .unwrap();
        drain.started().await;
        assert!(drain.is_draining());
    }
}
