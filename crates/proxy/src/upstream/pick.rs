//! Picking the node for each try: the balancer's choice among the nodes not tried yet
//! (healthy ones first), within the upstream's try budget and `retry_timeout`, and the failed
//! node reported to the health checker once it is known that another try follows (APISIX
//! reports it from the balancer, before the retry).

use std::borrow::Cow;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::balancer::{HashOn, PickState};
use super::nodes::{HealthView, NodeSet};
use crate::ctx::RequestCtx;
use crate::error::{ErrorKind, ProxyError};
use crate::snapshot::CompiledUpstream;

/// chash's key (`fetch_chash_hash_key`) from the request's variables and the consumer an auth
/// plugin attached.
fn chash_key(ctx: &RequestCtx<'_>, hash_on: &HashOn) -> String {
    let head = ctx.head.as_request_head(&ctx.conn.facts);
    let state = ctx.plugins.as_ref().map(|r| &r.state);
    let vars = ferrisix_plugin_api::RequestVars {
        head: &head,
        headers: &ctx.headers,
        remote_addr: state.map_or(ctx.remote_addr, |s| s.remote_addr()),
        remote_port: state.and_then(|s| s.remote_port()),
    };
    let var = |name: &str| vars.get(name);
    let consumer = state
        .and_then(|s| s.consumer())
        .map(|c| c.username.as_str());
    hash_on.key(&var, consumer).into_owned()
}

/// The tries of one request on one node set.
pub struct Tries<'s> {
    set: &'s NodeSet,
    max: usize,
    retry_timeout: Option<Duration>,
    first: Instant,
    tried: SmallVec<[usize; 4]>,
    pick: PickState<'static>,
    health: HealthView,
    /// The node of the last failed try, reported once the next try is known to follow.
    failed_on: Option<usize>,
    last_failure: ProxyError,
    /// Set when APISIX's balancer phase would end a retry itself with
    /// `core.response.exit(502)` (spec data-plane §3.5): `retry_timeout` passed, or no untried
    /// node is left while the try budget is not spent. The answer is then 502, not the last
    /// try's status (a 504 after timeouts).
    refused: bool,
}

impl<'s> Tries<'s> {
    /// The tries of `ctx` on `set`; `first`: when the first try started (`retry_timeout`
    /// counts from it).
    pub fn new(
        ctx: &RequestCtx<'_>,
        upstream: &CompiledUpstream,
        set: &'s NodeSet,
        first: Instant,
    ) -> Tries<'s> {
        let hash_key = upstream.hash_on.as_ref().map(|h| chash_key(ctx, h));
        Tries {
            set,
            max: upstream.max_tries(set),
            retry_timeout: upstream.retry_timeout,
            first,
            tried: SmallVec::new(),
            pick: PickState::new(Cow::Owned(hash_key.unwrap_or_default())),
            health: HealthView::default(),
            failed_on: None,
            last_failure: ProxyError::new(ErrorKind::ConnectRefused),
            refused: false,
        }
    }

    /// The node of the next try; `None` once the tries are over.
    pub fn next_node(&mut self) -> Option<usize> {
        if self.tried.len() >= self.max {
            return None;
        }
        if let Some(limit) = self.retry_timeout {
            if !self.tried.is_empty() && self.first.elapsed() > limit {
                self.refused = true;
                return None;
            }
        }
        if let Some(prev) = self.failed_on.take() {
            self.set.report_retry(prev, self.last_failure);
        }
        let Some(node) = self.set.pick(&mut self.pick, &self.tried, &mut self.health) else {
            self.refused = !self.tried.is_empty();
            return None;
        };
        self.tried.push(node);
        Some(node)
    }

    /// Whether another try may follow the current one.
    pub fn more_left(&self) -> bool {
        self.tried.len() < self.max
    }

    /// The current try on `node` failed with `failure`.
    pub fn failed(&mut self, node: usize, failure: ProxyError) {
        self.last_failure = failure;
        self.failed_on = Some(node);
    }

    /// The node of the last try.
    pub fn last(&self) -> Option<usize> {
        self.tried.last().copied()
    }

    /// How the last try failed (a refused connection before any try).
    pub fn last_failure(&self) -> ProxyError {
        self.last_failure
    }

    /// Whether the balancer ended the tries itself (then the answer is 502).
    pub fn refused(&self) -> bool {
        self.refused
    }
}
