//! Multiplexed HTTP/2 upstream connections: a connection carries as many requests at once as
//! the server's `SETTINGS_MAX_CONCURRENT_STREAMS` allows, and one more is opened only when
//! every connection to the node is full.
//!
//! Per worker thread, like the HTTP/1 pools: a worker's requests share its connections. A
//! connection is opened by a task of its own, so that the request that asked for it may be
//! cancelled without failing the others that joined it meanwhile; the handshake is over once
//! the server's first SETTINGS frame has come, so the limit is known before the connection is
//! shared. A connection the server sent GOAWAY on, one that broke, and one that served
//! `keepalive_pool.requests` streams take no more streams: the next request opens another.

mod frames;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ferrisix_net::coarse_monotonic_ms;
use ferrisix_tls::UpstreamTls;
use hyper::client::conn::{http1, http2};
use tokio::sync::watch;

pub(super) use frames::{FrameWatch, Peer};

use super::pool::{PoolKey, PoolLimits, PooledConn, Sender};
use super::request_body::UpstreamBody;
use crate::error::{ErrorKind, ProxyError};

/// One HTTP/2 connection (or one being opened) shared by the requests of a worker.
pub(super) struct H2Conn {
    sender: OnceLock<http2::SendRequest<UpstreamBody>>,
    /// The server's settings and GOAWAY, as its frames go by.
    peer: OnceLock<Arc<Peer>>,
    /// When the server chose HTTP/1.1 by ALPN: the connection, for the request that opened it.
    h1: Mutex<Option<http1::SendRequest<UpstreamBody>>>,
    /// `true` once the opening ended, either way.
    done: watch::Receiver<bool>,
    failed: AtomicBool,
    /// Why the opening failed.
    error: Mutex<Option<ProxyError>>,
    /// Streams open now, and ever.
    in_flight: AtomicU32,
    opened: AtomicU32,
    /// Coarse monotonic milliseconds when the last stream ended.
    idle_since_ms: AtomicU64,
    /// The upstream's `keepalive_pool` when it was opened.
    limits: PoolLimits,
}

/// A stream's place on a connection, given back when the request's answer ends (or is
/// dropped).
pub struct StreamSlot(Arc<H2Conn>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0
                .idle_since_ms
                .store(coarse_monotonic_ms(), Ordering::Relaxed);
        }
    }
}

type MuxMap = HashMap<PoolKey, Vec<Arc<H2Conn>>, foldhash::fast::RandomState>;

thread_local! {
    static MUX: RefCell<MuxMap> = RefCell::new(MuxMap::default());
}

impl H2Conn {
    fn opening(&self) -> bool {
        self.sender.get().is_none() && !self.failed.load(Ordering::Acquire)
    }

    /// Whether it can take no more streams, ever.
    fn spent(&self, limits: &PoolLimits) -> bool {
        if self.failed.load(Ordering::Acquire) {
            return true;
        }
        if self.opened.load(Ordering::Relaxed) >= limits.max_requests {
            return true;
        }
        if let Some(peer) = self.peer.get() {
            if peer.goaway() {
                return true;
            }
        }
        self.sender.get().is_some_and(|s| s.is_closed())
    }

    fn max_streams(&self) -> u32 {
        self.peer.get().map_or(u32::MAX, |p| p.max_streams())
    }

    /// Whether a request may join it now: an opening one takes every request (their order
    /// decides which stay once the limit is known), an open one up to the server's limit.
    fn has_room(&self) -> bool {
        self.opening() || self.in_flight.load(Ordering::Acquire) < self.max_streams()
    }

    fn idle_expired(&self, now_ms: u64, limits: &PoolLimits) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
            && now_ms.saturating_sub(self.idle_since_ms.load(Ordering::Relaxed))
                > limits.idle_timeout.as_millis() as u64
    }

    /// Takes a stream on it; `ticket`: how many streams it had then.
    fn join(self: &Arc<Self>) -> (StreamSlot, u32) {
        let ticket = self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.opened.fetch_add(1, Ordering::Relaxed);
        (StreamSlot(self.clone()), ticket)
    }
}

/// A stream on a multiplexed connection to `key`'s node: on one with room, else on a new one.
pub(super) async fn checkout(
    key: &PoolKey,
    limits: PoolLimits,
    connect_timeout: Duration,
    tls: Option<&UpstreamTls>,
) -> Result<PooledConn, ProxyError> {
    loop {
        let joined = MUX.with(|mux| {
            let mut mux = mux.borrow_mut();
            let list = mux.get_mut(key)?;
            let now_ms = coarse_monotonic_ms();
            // A spent connection leaves the list (its streams keep their own handles), and so
            // does one idle for too long.
            list.retain(|c| !c.spent(&limits) && !c.idle_expired(now_ms, &limits));
            list.iter().find(|c| c.has_room()).cloned()
        });
        let (conn, reused) = match joined {
            Some(c) => (c, true),
            None => (open(key, limits, connect_timeout, tls), false),
        };
        let (slot, ticket) = conn.join();
        let mut done = conn.done.clone();
        if done.wait_for(|d| *d).await.is_err() {
            return Err(ErrorKind::ConnectRefused.into());
        }
        if let Some(sender) = conn.sender.get() {
            if ticket > 0 && ticket >= conn.max_streams() {
                // Joined while it was opening, past the limit it turned out to have. (Its
                // opener stays, even under a limit of 0: hyper then holds the stream until
                // the server allows one.)
                drop(slot);
                continue;
            }
            let sender = Sender::H2(sender.clone());
            return Ok(PooledConn::new(key.clone(), limits, sender, reused).with_slot(slot));
        }
        let h1 = conn.h1.lock().ok().and_then(|mut h| h.take());
        if let Some(h1) = h1 {
            // The server chose HTTP/1.1: an ordinary pooled connection, for one request.
            drop(slot);
            return Ok(PooledConn::new(key.clone(), limits, Sender::H1(h1), false));
        }
        if reused {
            // Joined an opening that failed or went to HTTP/1.1 for its opener: try on.
            drop(slot);
            continue;
        }
        let error = conn.error.lock().ok().and_then(|mut e| e.take());
        return Err(error.unwrap_or_else(|| ErrorKind::ConnectRefused.into()));
    }
}

/// Starts opening a connection to `key`'s node, listed at once so that the requests that come
/// meanwhile join it.
fn open(
    key: &PoolKey,
    limits: PoolLimits,
    connect_timeout: Duration,
    tls: Option<&UpstreamTls>,
) -> Arc<H2Conn> {
    let (tx, rx) = watch::channel(false);
    let conn = Arc::new(H2Conn {
        sender: OnceLock::new(),
        peer: OnceLock::new(),
        h1: Mutex::new(None),
        done: rx,
        failed: AtomicBool::new(false),
        error: Mutex::new(None),
        in_flight: AtomicU32::new(0),
        opened: AtomicU32::new(0),
        idle_since_ms: AtomicU64::new(coarse_monotonic_ms()),
        limits,
    });
    MUX.with(|mux| {
        let mut mux = mux.borrow_mut();
        mux.entry(key.clone()).or_default().push(conn.clone());
    });
    let task_conn = conn.clone();
    let key = key.clone();
    let tls = tls.cloned();
    tokio::spawn(async move {
        let conn = task_conn;
        match super::open(&key, connect_timeout, tls.as_ref()).await {
            Ok((Sender::H2(sender), peer)) => {
                if let Some(peer) = peer {
                    let _ = conn.peer.set(peer);
                }
                let _ = conn.sender.set(sender);
            }
            Ok((Sender::H1(h1), _)) => {
                if let Ok(mut slot) = conn.h1.lock() {
                    *slot = Some(h1);
                }
                conn.failed.store(true, Ordering::Release);
            }
            Err(e) => {
                if let Ok(mut slot) = conn.error.lock() {
                    *slot = Some(e);
                }
                conn.failed.store(true, Ordering::Release);
            }
        }
        let _ = tx.send(true);
    });
    conn
}

/// Drops spent connections, those idle past their `keepalive_pool.idle_timeout`, and the
/// oldest idle ones beyond `keepalive_pool.size` per node.
pub(super) fn evict_expired() {
    MUX.with(|mux| {
        let now_ms = coarse_monotonic_ms();
        let mut mux = mux.borrow_mut();
        mux.retain(|_, list| {
            list.retain(|c| {
                c.opening() || !(c.spent(&c.limits) || c.idle_expired(now_ms, &c.limits))
            });
            let idle = |c: &Arc<H2Conn>| !c.opening() && c.in_flight.load(Ordering::Acquire) == 0;
            let size = list.first().map_or(usize::MAX, |c| c.limits.size);
            // The list is in opening order: the oldest idle ones go first.
            let mut excess = list.iter().filter(|c| idle(c)).count().saturating_sub(size);
            list.retain(|c| {
                if excess > 0 && idle(c) {
                    excess -= 1;
                    return false;
                }
                true
            });
            !list.is_empty()
        });
    });
}
