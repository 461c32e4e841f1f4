//! Per-worker keep-alive pools keyed by upstream address.
//!
//! Mirrors nginx's upstream `keepalive` cache: at most `size` idle connections per key, closed
//! after `idle_timeout` unused or after serving `requests` requests.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use ferrisix_net::coarse_monotonic_ms;

use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use tokio::time::Sleep;

use super::request_body::UpstreamBody;

/// What a pooled connection is keyed by (APISIX: `scheme#host#port`, plus the SNI and the
/// client certificate): a connection is reused only for requests it is right for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub addr: SocketAddr,
    /// 0 for plain TCP, else the fingerprint of the TLS client config (verification, client
    /// certificate, ALPN).
    pub tls: u64,
    /// The SNI sent (TLS only).
    pub sni: Option<Arc<str>>,
    /// HTTP/2 (gRPC and h2 upstreams).
    pub h2: bool,
    /// How often the node's health check marked it down: connections kept from before it went
    /// down are never reused (they expire with the idle timeout or when the node closes them).
    pub epoch: u32,
}

impl PoolKey {
    /// A plain HTTP/1.1 connection to `addr`.
    pub fn plain(addr: SocketAddr) -> PoolKey {
        PoolKey {
            addr,
            tls: 0,
            sni: None,
            h2: false,
            epoch: 0,
        }
    }
}

/// The request half of a connection.
pub enum Sender {
    H1(http1::SendRequest<UpstreamBody>),
    H2(http2::SendRequest<UpstreamBody>),
}

type SendFuture = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = Result<
                    Response<Incoming>,
                    hyper::client::conn::TrySendError<Request<UpstreamBody>>,
                >,
            > + Send,
    >,
>;

impl Sender {
    pub(crate) fn is_closed(&self) -> bool {
        match self {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }

    async fn ready(&mut self) -> Result<(), hyper::Error> {
        match self {
            Sender::H1(s) => s.ready().await,
            Sender::H2(s) => s.ready().await,
        }
    }

    pub(crate) fn send(&mut self, req: Request<UpstreamBody>) -> SendFuture {
        match self {
            Sender::H1(s) => Box::pin(s.try_send_request(req)),
            Sender::H2(s) => Box::pin(s.try_send_request(req)),
        }
    }
}

/// `keepalive_pool {size, idle_timeout, requests}` of an upstream.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolLimits {
    pub size: usize,
    pub idle_timeout: Duration,
    pub max_requests: u32,
}

impl Default for PoolLimits {
    fn default() -> Self {
        PoolLimits {
            size: 320,
            idle_timeout: Duration::from_secs(60),
            max_requests: 1000,
        }
    }
}

/// A connection checked out of the pool (or freshly opened) for one request.
pub struct PooledConn {
    key: PoolKey,
    limits: PoolLimits,
    sender: Sender,
    served: u32,
    reused: bool,
    timer: Option<HeadTimer>,
    /// Its stream's place on a multiplexed HTTP/2 connection, given back when this is dropped.
    slot: Option<super::StreamSlot>,
}

/// The response-head timer of an HTTP/1 connection, made on its first request and moved
/// later for each next one. Moving a registered tokio timer's deadline later is an atomic
/// update; a timer per request was a wheel insertion and removal on every request (what that
/// costs, `benches/e2e/instructions.py` counts). While the connection idles in the pool the
/// timer stays
/// registered and may fire once, waking the task that last waited on it for nothing.
type HeadTimer = Pin<Box<Sleep>>;

struct Idle {
    sender: Sender,
    /// When it went idle, in coarse monotonic milliseconds: a tick's error is nothing next to
    /// an idle timeout, and the request path reads this clock twice (release, checkout).
    since_ms: u64,
    served: u32,
    limits: PoolLimits,
    timer: Option<HeadTimer>,
}

/// Keyed by upstream addresses, SNIs and TLS fingerprints from the configuration, never by
/// anything a client sends, so the map needs no flood-resistant hash, and SipHash would cost
/// two hashings per request (checkout and release; `benches/e2e/instructions.py` counts
/// them).
type PoolMap = HashMap<PoolKey, Vec<Idle>, foldhash::fast::RandomState>;

thread_local! {
    static POOL: RefCell<PoolMap> = RefCell::new(PoolMap::default());
}

impl Idle {
    /// Idle for longer than its `idle_timeout` at `now_ms`.
    fn expired(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.since_ms) > self.limits.idle_timeout.as_millis() as u64
    }
}

impl PooledConn {
    pub(super) fn new(key: PoolKey, limits: PoolLimits, sender: Sender, reused: bool) -> Self {
        PooledConn {
            key,
            limits,
            sender,
            served: 0,
            reused,
            timer: None,
            slot: None,
        }
    }

    pub(super) fn with_slot(mut self, slot: super::StreamSlot) -> Self {
        self.slot = Some(slot);
        self
    }

    /// The connection's response-head timer, set to `deadline`.
    pub(super) fn head_timer(&mut self, deadline: tokio::time::Instant) -> Pin<&mut Sleep> {
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        timer.as_mut().reset(deadline);
        timer.as_mut()
    }

    pub(super) fn sender(&mut self) -> &mut Sender {
        &mut self.sender
    }

    pub(super) async fn ready(&mut self) -> Result<(), hyper::Error> {
        self.sender.ready().await
    }

    /// Whether this connection served an earlier request (a failure on it may just be the
    /// upstream closing an idle keep-alive connection).
    pub fn is_reused(&self) -> bool {
        self.reused
    }

    pub fn key(&self) -> &PoolKey {
        &self.key
    }

    /// Returns the connection to this worker's pool after a complete response.
    pub fn release(mut self) {
        if self.slot.is_some() {
            // A stream of a multiplexed connection, which stays in its pool.
            return;
        }
        self.served += 1;
        if self.served >= self.limits.max_requests || self.sender.is_closed() {
            return;
        }
        let idle = Idle {
            sender: self.sender,
            since_ms: coarse_monotonic_ms(),
            served: self.served,
            limits: self.limits,
            timer: self.timer,
        };
        POOL.with(|pool| {
            let mut pool = pool.borrow_mut();
            let list = pool.entry(self.key).or_default();
            if list.len() >= self.limits.size {
                // The oldest idle connection makes room, as nginx's LRU cache does.
                list.remove(0);
            }
            list.push(idle);
        });
    }
}

/// Takes the most recently used live idle connection for `key`.
pub(super) fn take_idle(key: &PoolKey) -> Option<PooledConn> {
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        let list = pool.get_mut(key)?;
        let now_ms = coarse_monotonic_ms();
        while let Some(idle) = list.pop() {
            if idle.sender.is_closed() || idle.expired(now_ms) {
                continue;
            }
            return Some(PooledConn {
                key: key.clone(),
                limits: idle.limits,
                sender: idle.sender,
                served: idle.served,
                reused: true,
                timer: idle.timer,
                slot: None,
            });
        }
        None
    })
}

/// Drops idle connections past their idle timeout; run periodically by each worker.
pub fn evict_expired() {
    POOL.with(|pool| {
        let now_ms = coarse_monotonic_ms();
        let mut pool = pool.borrow_mut();
        pool.retain(|_, list| {
            list.retain(|i| !i.sender.is_closed() && !i.expired(now_ms));
            !list.is_empty()
        });
    });
}
