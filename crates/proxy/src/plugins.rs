//! The plugin side of one request: the chains that run for it ([`PluginRun`]), the plugins'
//! request state, and the phases they run in, in the order they run: the request phases
//! ([`request_phases`]: `rewrite`, `access`, `before_proxy`), the upstream's answer held back
//! for the plugins that want it whole ([`upstream_answer`]), and the response phases
//! ([`response_phases`]: `header_filter`, then the plugins' `log`, handed to [`crate::log`]).
//!
//! Nothing here runs for a request whose route and global rules have no plugins; the request
//! path then costs what it cost before plugins existed.

mod request_phases;
mod response_phases;
mod upstream_answer;

pub use request_phases::request_phases;
pub use response_phases::response_phases;
pub use upstream_answer::{may_hold_upstream_answer, upstream_answer};

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use ferrisix_plugin_api::{LogNeeds, LogVars, Phases, RequestState};
use ferrisix_plugins::{ConsumerChains, PluginChain, Verdicts};

use crate::snapshot::{CompiledRoute, RouteTarget};

/// The plugin side of one request, from routing to the log phase.
pub struct PluginRun {
    pub global: Arc<PluginChain>,
    /// `None` for a request that matched no route (or whose route ends before its plugins).
    pub route: Option<Arc<PluginChain>>,
    /// Whether the request phases run (not for a route APISIX ends before its plugins).
    pub runs: bool,
    /// What the plugins keep and change of the request.
    pub state: RequestState,
    /// The gateway answered itself (exit, 404, no upstream).
    pub own_answer: bool,
    /// `_meta.filter` verdicts for the phases after the response head.
    pub verdicts: (Verdicts, Verdicts),
    /// The request variables the log phase asked for, read while the request was at hand;
    /// empty (no allocation) when no plugin asked.
    pub log_vars: LogVars,
    /// The request body as read for the log phase, when a plugin asked for it.
    pub request_body: Option<Bytes>,
    /// The snapshot's consumers, when a plugin of the request authenticates: the consumer's
    /// plugins are merged over the route's once it is known (each pair once per snapshot).
    pub consumers: Option<Arc<ConsumerChains>>,
}

impl PluginRun {
    /// Global rules for a request that matched no route: `rewrite` and `access` run before
    /// the 404 (and may answer instead).
    pub fn unmatched(global: Arc<PluginChain>, remote_addr: std::net::IpAddr) -> PluginRun {
        PluginRun {
            global,
            route: None,
            runs: true,
            state: RequestState::new(remote_addr),
            own_answer: true,
            verdicts: (Verdicts::ALL, Verdicts::ALL),
            log_vars: LogVars::default(),
            request_body: None,
            consumers: None,
        }
    }

    /// The plugins of a matched route; `uri` and `host` index the patterns that matched.
    pub fn matched(
        route: &CompiledRoute,
        uri: Option<u16>,
        host: Option<u16>,
        remote_addr: std::net::IpAddr,
    ) -> PluginRun {
        let mut state = RequestState::new(remote_addr);
        state.set_matched(uri, host);
        PluginRun {
            global: route.global_chain.clone(),
            route: route.plugins_run.then(|| route.chain.clone()),
            runs: route.plugins_run,
            state,
            own_answer: !matches!(route.target, RouteTarget::Upstream(_)),
            verdicts: (Verdicts::ALL, Verdicts::ALL),
            log_vars: LogVars::default(),
            request_body: None,
            consumers: None,
        }
    }

    /// Hands the snapshot's consumers to a request whose chains authenticate.
    pub fn give_consumers(&mut self, consumers: &Arc<ConsumerChains>) {
        let needs = self.global.needs_consumers()
            || self.route.as_ref().is_some_and(|r| r.needs_consumers());
        if needs {
            self.state.set_consumers(consumers.set.index.clone());
            self.consumers = Some(consumers.clone());
        }
    }

    pub fn chains(&self) -> impl Iterator<Item = &PluginChain> {
        std::iter::once(&*self.global).chain(self.route.as_deref())
    }

    pub fn has(&self, phase: Phases) -> bool {
        self.chains().any(|c| c.has(phase))
    }
}

/// What the chains' log phases read: borrowed unless both chains read something (then the
/// union is built per request; global rules that log are rare). A function of the two
/// chains, not of the run, so it borrows only them.
pub fn log_needs<'a>(global: &'a PluginChain, route: Option<&'a PluginChain>) -> Cow<'a, LogNeeds> {
    let global_needs = global.log_needs();
    match route {
        Some(r) if !global_needs.is_empty() => Cow::Owned(global_needs.union(r.log_needs())),
        Some(r) => Cow::Borrowed(r.log_needs()),
        None => Cow::Borrowed(global_needs),
    }
}
