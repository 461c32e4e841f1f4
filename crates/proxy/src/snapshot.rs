//! Compiling a store's `ConfigState` into the immutable `Snapshot` the request path reads, and
//! publishing it.
//!
//! Each resource is validated on its own. One that fails is quarantined: it is logged, left
//! out, and if an earlier version of it was accepted, that version keeps serving (as APISIX
//! keeps the older valid item). Nothing else is held back. A compile starts from the explicit
//! diff against the state the previous snapshot compiled ([`ConfigDiff`]) and rebuilds only
//! what a change touches; everything else is handed on as the same compiled value, so a
//! balancer keeps its position and plugin state its handles across unrelated changes.
//!
//! - `diff`: the per-kind diff and what a compile changed ([`SnapshotDiff`]);
//! - `accept`: validation, quarantine and fallback to the last good version;
//! - `upstreams`: compiled upstreams;
//! - `intern`: the pool that lets equal inline upstreams share one copy;
//! - `routes`: compiled routes and what each depends on;
//! - `ssls`: the certificate store the TLS listeners read;
//! - `parallel`: the first compile's validation spread over the cores;
//! - `compile`: the [`Snapshot`] and the compile that ties them together;
//! - `publish`: the atomically swapped handle and the follow loop.

mod accept;
mod compile;
mod diff;
mod intern;
mod publish;
mod routes;
mod ssls;
mod upstreams;

pub use accept::Quarantined;
pub use compile::{CheckerEntry, CompileOptions, CompileStages, Snapshot};
pub use diff::{ConfigDiff, Difference, SnapshotDiff};
pub use publish::{follow, new_handle, SnapshotHandle};
pub use routes::{CompiledRoute, RouteTarget};
pub use upstreams::{CompiledUpstream, InlineUpstreams};

#[cfg(test)]
mod tests;
