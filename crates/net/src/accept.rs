//! Accepting connections without spinning or stalling when descriptors run out.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// nginx's `accept_mutex_delay` (500 ms): how long it stops accepting after `EMFILE`/`ENFILE`.
/// The back-off starts shorter and doubles up to it, so a brief shortage costs little.
const MAX_BACKOFF: Duration = Duration::from_millis(500);
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// Warnings about a failing accept are logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(1);

/// A listener's accept loop. [`Acceptor::accept`] only returns connections: errors that are
/// about one connection (reset before accept) are skipped at once; running out of file
/// descriptors or memory waits (a growing back-off), during which the runtime keeps serving
/// the open connections and, as they close, accepting resumes with the connections that
/// waited in the backlog.
#[derive(Debug)]
pub struct Acceptor {
    listener: TcpListener,
    name: &'static str,
    backoff: Duration,
    last_warning: Option<Instant>,
    suppressed: u64,
}

impl Acceptor {
    /// `name` says which listener it is in log lines ("data", "admin", ...).
    pub fn new(listener: TcpListener, name: &'static str) -> Acceptor {
        Acceptor {
            listener,
            name,
            backoff: FIRST_BACKOFF,
            last_warning: None,
            suppressed: 0,
        }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The next connection.
    pub async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            match self.listener.accept().await {
                Ok(conn) => {
                    self.backoff = FIRST_BACKOFF;
                    return conn;
                }
                Err(e) if is_per_connection(&e) => continue,
                Err(e) => {
                    self.warn(&e);
                    tokio::time::sleep(self.backoff).await;
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    fn warn(&mut self, e: &io::Error) {
        let now = Instant::now();
        if self
            .last_warning
            .is_some_and(|at| now.duration_since(at) < WARN_EVERY)
        {
            self.suppressed += 1;
            return;
        }
        tracing::warn!(
            listener = self.name,
            error = %e,
            repeated = self.suppressed,
            "accept failed; backing off, open connections are still served"
        );
        self.last_warning = Some(now);
        self.suppressed = 0;
    }
}

/// Errors about the one connection being accepted (it went away first): nothing to wait for.
fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aborted_connections_are_skipped_and_resource_errors_wait() {
        assert!(is_per_connection(&io::Error::from(
            io::ErrorKind::ConnectionAborted
        )));
        // EMFILE
        assert!(!is_per_connection(&io::Error::from_raw_os_error(24)));
    }
}
