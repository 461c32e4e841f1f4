//! ferrisix's Admin API: APISIX 3.x's `/apisix/admin` endpoints (routes, upstreams, services,
//! consumers and every other resource, plugins and schemas), answering with APISIX's exact
//! statuses, envelopes and messages. It validates writes with the config crate's checks and
//! writes only through a [`ferrisix_config::store::Store`]; the data plane follows the store,
//! so the Admin API never talks to it.
//!
//! Wiring: fill empty admin keys with [`keys::ensure_admin_keys`] (which saves them into
//! config.yaml), build an [`AdminApi`] from [`AdminOptions`], a store and the enabled
//! [`ferrisix_plugins::PluginRegistry`], call [`AdminApi::publish_plugin_list`] once, then run
//! [`serve`] on the admin listener. [`AdminApi::handle`] answers one request without a socket.
#![forbid(unsafe_code)]

mod api;
mod args;
mod auth;
mod body;
mod guard;
pub mod keys;
mod list;
mod merge;
mod path;
mod resources;
mod response;
mod server;
mod ui;

pub use api::{
    core_schema_catalog, http_plugin_catalog, stream_plugin_catalog, AdminApi, AdminOptions,
    ReloadHook, MAX_BODY,
};
pub use server::serve;
