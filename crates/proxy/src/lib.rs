//! The ferrisix data plane.
//!
//! It compiles a store's configuration into an immutable [`snapshot::Snapshot`] (route table,
//! upstreams with their balancers), publishes it with `arc-swap`, and serves HTTP/1.1 and
//! cleartext HTTP/2 with APISIX's proxy semantics: routing, every APISIX balancer (roundrobin,
//! chash, least_conn, ewma) with priority groups, health checks shared by all workers
//! ([`health`]), domain nodes and DNS discovery resolved off the workers ([`dns`], `nodes`),
//! retries, timeouts, forwarded headers, websocket tunnelling, a buffered access log, and
//! graceful shutdown. The request path reads only the snapshot: no locks, no store calls.
//!
//! One context per request (`ctx`) goes through the steps in order: head checks (`head`),
//! routing (`routing`), the plugins' request phases (`phases`), the upstream tries
//! (`upstream`, with the headers of `forwarded` and the answers of `relay`), the plugins'
//! response phases, and the log phase ([`log`]) handed to the response body ([`body`]).
//! Errors carry who is at fault and whether a retry is allowed ([`error`]).
#![forbid(unsafe_code)]

pub mod access_log;
pub mod balancer;
pub mod body;
pub mod client;
pub mod control;
mod ctx;
pub mod dns;
pub mod error;
mod forwarded;
pub mod gateway;
mod handler;
mod head;
pub mod health;
pub mod log;
mod nodes;
mod phases;
pub mod record;
mod relay;
mod request_head;
pub mod responses;
mod routing;
mod run;
pub mod server;
pub mod snapshot;
mod upstream;
mod websocket;

pub use forwarded::RealIpConfig;
pub use gateway::{ConnInfo, Gateway, LegacyAdmin};
pub use nodes::UpstreamServices;
pub use server::{Listen, ServerHandle, ServerOptions, WorkerModel};
pub use snapshot::{CompileOptions, Snapshot, SnapshotHandle};
