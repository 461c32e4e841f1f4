//! The ferrisix data plane.
//!
//! It compiles a store's configuration into an immutable [`snapshot::Snapshot`] (route table,
//! upstreams with their balancers), publishes it with `arc-swap`, and serves HTTP/1.1 and
//! cleartext HTTP/2 with APISIX's proxy semantics. The request path reads only the snapshot:
//! no locks, no store calls.
//!
//! The modules follow a request, in the order it runs:
//!
//! - [`server`] accepts connections and hands each request, with its connection's
//!   [`gateway::ConnInfo`], to `request`, which orders the stages below. One context per
//!   request (`ctx`) goes through all of them.
//! - `request`: the head checks nginx makes (`request/head.rs`, `request/host.rs`) and who the
//!   client is (`request/real_ip.rs`, nginx's realip module).
//! - `routing`: the snapshot's route table against the request.
//! - `plugins`: the plugins' request phases (`rewrite`, `access`, `before_proxy`) and
//!   response phases (`header_filter`, and the plugins' side of the log phase).
//! - [`upstream`]: the tries, one stage per module (the body made ready, the request built,
//!   the node picked, one try, the retry decision, the answer relayed), and what they rest on:
//!   the upstream client with its pools ([`upstream::client`]), every APISIX balancer
//!   ([`upstream::balancer`]), health checks shared by all workers ([`upstream::health`]),
//!   domain nodes and DNS discovery resolved off the workers ([`upstream::dns`]), and
//!   websocket tunnels; for a `kafka` upstream, `pubsub` instead (APISIX's pub-sub over the
//!   client's WebSocket, consuming from the upstream's Kafka brokers).
//! - [`response`]: the response body relayed to the client, and the answers the gateway
//!   makes itself.
//! - [`log`]: the log phase, run once however the request ends, with the access log and
//!   the record of the upstream tries.
//!
//! Beside the request path: [`snapshot`] (store → diff → accept → compile → publish),
//! [`error`] (who is at fault and whether a retry is allowed), and [`control`] (APISIX's
//! control API).
#![forbid(unsafe_code)]

pub mod client_body;
pub mod control;
mod ctx;
pub mod error;
pub mod gateway;
pub mod log;
mod plugins;
mod pubsub;
mod request;
pub mod response;
mod routing;
pub mod server;
pub mod snapshot;
pub mod upstream;

pub use gateway::{ConnInfo, Gateway, LegacyAdmin};
pub use request::real_ip::RealIpConfig;
pub use response::body::ResponseBody;
pub use server::{Listen, ServerHandle, ServerOptions, WorkerModel};
pub use snapshot::{CompileOptions, Snapshot, SnapshotHandle};
pub use upstream::nodes::UpstreamServices;
