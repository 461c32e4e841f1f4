//! Per-worker keep-alive pools keyed by upstream address.
//!
//! Mirrors nginx's upstream `keepalive` cache: at most `size` idle connections per key, closed
//! after `idle_timeout` unused or after serving `requests` requests.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hyper::client::conn::http1::SendRequest;

use super::UpstreamBody;

/// What a pooled connection is keyed by (`scheme#host#port` in APISIX; plain HTTP only here).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub addr: SocketAddr,
    /// How often the node's health check marked it down: connections kept from before it went
    /// down are never reused (they expire with the idle timeout or when the node closes them).
    pub epoch: u32,
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
    sender: SendRequest<UpstreamBody>,
    served: u32,
    reused: bool,
}

struct Idle {
    sender: SendRequest<UpstreamBody>,
    since: Instant,
    served: u32,
    limits: PoolLimits,
}

thread_local! {
    static POOL: RefCell<HashMap<PoolKey, Vec<Idle>>> = RefCell::new(HashMap::new());
}

impl PooledConn {
    pub(super) fn new(key: PoolKey, limits: PoolLimits, sender: SendRequest<UpstreamBody>) -> Self {
        PooledConn {
            key,
            limits,
            sender,
            served: 0,
            reused: false,
        }
    }

    pub(super) fn sender(&mut self) -> &mut SendRequest<UpstreamBody> {
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

    pub fn key(&self) -> PoolKey {
        self.key
    }

    /// Returns the connection to this worker's pool after a complete response.
    pub fn release(mut self) {
        self.served += 1;
        if self.served >= self.limits.max_requests || self.sender.is_closed() {
            return;
        }
        let idle = Idle {
            sender: self.sender,
            since: Instant::now(),
            served: self.served,
            limits: self.limits,
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
pub(super) fn take_idle(key: PoolKey) -> Option<PooledConn> {
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        let list = pool.get_mut(&key)?;
        let now = Instant::now();
        while let Some(idle) = list.pop() {
            if idle.sender.is_closed() || now.duration_since(idle.since) > idle.limits.idle_timeout
            {
                continue;
            }
            return Some(PooledConn {
                key,
                limits: idle.limits,
                sender: idle.sender,
                served: idle.served,
                reused: true,
            });
        }
        None
    })
}

/// Drops idle connections past their idle timeout; run periodically by each worker.
pub fn evict_expired() {
    POOL.with(|pool| {
        let now = Instant::now();
        let mut pool = pool.borrow_mut();
        pool.retain(|_, list| {
            list.retain(|i| {
                !i.sender.is_closed() && now.duration_since(i.since) <= i.limits.idle_timeout
            });
            !list.is_empty()
        });
    });
}
