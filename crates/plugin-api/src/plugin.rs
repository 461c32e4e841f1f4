//! The plugin interface: APISIX's phases as trait methods.
//!
//! A plugin instance is compiled once per snapshot for one configuration on one route; the
//! request path only calls its phase methods. Phases that run before the response (`rewrite`,
//! `access`, `before_proxy`) may end the request with an [`Exit`] and may wait on I/O: they
//! answer [`Step::Done`] when they finished synchronously (the common case, which costs no
//! allocation) or [`Step::Wait`] with a boxed future (a Redis round trip, a body read).
//! `header_filter` runs on the response head of whatever answer ends the request and may
//! install body filters; `log` runs once the response is over, from an owned [`LogCtx`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::answer::UpstreamAnswer;
use crate::ctx::PluginCtx;
use crate::exit::Exit;
use crate::log::{LogCtx, LogNeeds};
use crate::response::ResponseHead;

/// A set of phases, as a bit set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Phases(u16);

impl Phases {
    pub const NONE: Phases = Phases(0);
    pub const REWRITE: Phases = Phases(1);
    pub const ACCESS: Phases = Phases(1 << 1);
    pub const BEFORE_PROXY: Phases = Phases(1 << 2);
    /// `header_filter`, which is also where body filters are installed.
    pub const HEADER_FILTER: Phases = Phases(1 << 3);
    /// The plugin answers in place of the upstream (ai-proxy): its `before_proxy` runs even on
    /// a route without an upstream, and ends the request with an exit that may carry a
    /// streamed body ([`crate::PluginCtx::set_exit_stream`]).
    pub const UPSTREAM: Phases = Phases(1 << 4);
    pub const LOG: Phases = Phases(1 << 5);
    /// `mask_log`: edits what the log phase's plugins see, before any of them runs.
    pub const LOG_MASK: Phases = Phases(1 << 6);
    /// `upstream_answer`: the upstream's answer is held back until the plugin is done with it
    /// (ext-plugin-post-resp).
    pub const UPSTREAM_ANSWER: Phases = Phases(1 << 7);
    /// The plugin's `before_proxy` sends the request to the upstream node itself (http-dubbo,
    /// dubbo-proxy): the proxy picks the node before that phase, as APISIX's balancer does
    /// before it, and hands it over ([`crate::PluginCtx::upstream_node`],
    /// [`crate::PluginCtx::upstream_timeouts`]). Other routes pick after it, at no cost here.
    pub const NODE: Phases = Phases(1 << 8);

    pub const fn union(self, other: Phases) -> Phases {
        Phases(self.0 | other.0)
    }

    pub const fn contains(self, other: Phases) -> bool {
        self.0 & other.0 == other.0 && other.0 != 0
    }

    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for Phases {
    type Output = Phases;
    fn bitor(self, rhs: Phases) -> Phases {
        self.union(rhs)
    }
}

/// What a phase decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Exit(Exit),
}

/// A phase that may still be waiting on I/O.
pub type PhaseFuture<'a> = Pin<Box<dyn Future<Output = Flow> + Send + 'a>>;

/// The answer of a request phase: done now, or a future to await.
pub enum Step<'a> {
    Done(Flow),
    Wait(PhaseFuture<'a>),
}

impl Step<'_> {
    pub const CONTINUE: Step<'static> = Step::Done(Flow::Continue);

    /// An exit, decided now.
    pub fn exit(exit: Exit) -> Step<'static> {
        Step::Done(Flow::Exit(exit))
    }
}

impl fmt::Debug for Step<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Done(flow) => f.debug_tuple("Done").field(flow).finish(),
            Step::Wait(_) => f.write_str("Wait(..)"),
        }
    }
}

/// One plugin configuration compiled for one route. Every phase has a no-op default; a plugin
/// lists the phases it implements in [`Plugin::phases`] so chains skip the others.
pub trait Plugin: Send + Sync + 'static {
    fn phases(&self) -> Phases;

    /// What `log` reads besides the fixed facts of [`LogCtx`], fixed at compile time so the
    /// proxy captures just that; the default: nothing.
    fn log_needs(&self) -> LogNeeds {
        LogNeeds::default()
    }

    /// Whether the request phases look consumers up ([`PluginCtx::consumers`]) although the
    /// plugin is not an auth plugin (public-api serving wolf-rbac's login); auth plugins get
    /// them by their kind.
    fn needs_consumers(&self) -> bool {
        false
    }

    fn rewrite<'a>(&'a self, _ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::CONTINUE
    }

    fn access<'a>(&'a self, _ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::CONTINUE
    }

    /// After the upstream node is picked, before the request goes to it (`before_proxy`).
    fn before_proxy<'a>(&'a self, _ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::CONTINUE
    }

    /// The upstream answered: its status, headers and body may be read and changed before any
    /// of it goes to the client (APISIX's ext-plugin-post-resp makes the upstream call itself
    /// in `before_proxy` to get there). Runs only on an upstream's answer, before
    /// `header_filter`; an exit replaces the answer.
    fn upstream_answer<'a>(
        &'a self,
        _ctx: &'a mut PluginCtx<'_>,
        _answer: &'a mut UpstreamAnswer,
    ) -> Step<'a> {
        Step::CONTINUE
    }

    /// The response head is known (the upstream's, an exit's or the gateway's own answer):
    /// its status and headers may be changed, its body replaced or filtered.
    fn header_filter(&self, _ctx: &mut PluginCtx<'_>, _resp: &mut ResponseHead<'_>) {}

    fn log(&self, _ctx: &LogCtx) {}

    /// Runs before every plugin's `log` and may change what they log (data-mask masks
    /// fields there, as APISIX's runs in the log phase at a priority above the loggers').
    fn mask_log(&self, _ctx: &mut LogCtx) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_sets() {
        let p = Phases::ACCESS | Phases::LOG;
        assert!(p.contains(Phases::ACCESS));
        assert!(p.contains(Phases::LOG));
        assert!(!p.contains(Phases::REWRITE));
        assert!(!Phases::NONE.contains(Phases::NONE));
    }
}
