//! The ferrisix data plane.
//!
//! It compiles a store's configuration into an immutable [`snapshot::Snapshot`] (route table,
//! upstreams with their balancers), publishes it with `arc-swap`, and serves HTTP/1.1 and
//! cleartext HTTP/2 with APISIX's proxy semantics: routing, every APISIX balancer (roundrobin,
//! chash, least_conn, ewma) with priority groups, health checks shared by all workers, domain
//! nodes and DNS discovery resolved off the workers, retries, timeouts, forwarded headers,
//! websocket tunnelling, a buffered access log, and graceful shutdown. The request path reads
//! only the snapshot: no locks, no store calls.
#![forbid(unsafe_code)]

pub mod access_log;
pub mod balancer;
pub mod body;
pub mod client;
pub mod control;
pub mod dns;
pub mod error;
pub mod handler;
pub mod health;
pub mod phases;
pub mod responses;
pub mod server;
pub mod snapshot;
pub mod upstream;
mod vars;
mod websocket;

pub use handler::{ConnInfo, Gateway, RealIpConfig};
pub use server::{ServerHandle, ServerOptions, WorkerModel};
pub use snapshot::{CompileOptions, Snapshot, SnapshotHandle};
pub use upstream::UpstreamEnv;
