//! The Admin API exercised through `AdminApi::handle` on an in-memory store: every stage of the
//! pipeline, every method and resource, the plugin and schema endpoints, and the behaviours of
//! the public conformance cases.

#[path = "api/support.rs"]
mod support;

#[path = "api/auth.rs"]
mod auth;
#[path = "api/cases.rs"]
mod cases;
#[path = "api/lists.rs"]
mod lists;
#[path = "api/methods.rs"]
mod methods;
#[path = "api/pipeline.rs"]
mod pipeline;
#[path = "api/plugins.rs"]
mod plugins;
#[path = "api/resources.rs"]
mod resources;
#[path = "api/server.rs"]
mod server;
#[path = "api/standalone.rs"]
mod standalone;
