//! ferrisix plugins: the registry of every plugin ferrisix implements (names, priorities and
//! APISIX's schemas, used by the Admin API and by validation), and the plugins themselves.
//!
//! The registry answers what APISIX's `plugin.lua` answers: which plugins are enabled, their
//! run order (priority, highest first), and whether a configuration passes a plugin's schema
//! with APISIX's exact messages.
#![forbid(unsafe_code)]

pub mod registry;

pub use registry::{PluginInfo, PluginRegistry, SchemaType};
