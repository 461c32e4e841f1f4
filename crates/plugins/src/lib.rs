//! ferrisix plugins: the registry of every plugin ferrisix implements (names, priorities and
//! APISIX's schemas, used by the Admin API and by validation), the plugin interface with
//! APISIX's phases, the chains the proxy runs, and the plugins themselves (limit-count,
//! limit-req, limit-conn, prometheus, public-api).
//!
//! The registry answers what APISIX's `plugin.lua` answers: which plugins are enabled, their
//! run order (priority, highest first), and whether a configuration passes a plugin's schema
//! with APISIX's exact messages. The proxy compiles each route's plugins into a
//! [`PluginChain`] once per snapshot and calls its phases on the request path; state that must
//! outlive a snapshot (counters, metric series, Redis pools) lives in the process-wide
//! [`runtime::Runtime`].
#![forbid(unsafe_code)]

pub mod chain;
pub mod factory;
pub mod keyed;
pub mod limit_conn;
pub mod limit_count;
pub mod limit_req;
pub mod plugin;
pub mod prometheus;
pub mod public_api;
pub mod redis_client;
pub mod registry;
pub mod runtime;
pub mod template;

pub use chain::{CompileEnv, GlobalChains, GlobalRules, PluginChain, PluginSource, Verdicts};
pub use plugin::{
    union_var_names, Exit, Flow, LogCtx, LogVars, Owner, Phases, Plugin, PluginCtx, RequestGuards,
    ResponseHeaders, ResponseSource, RouteInfo, Step, VarNames,
};
pub use registry::{PluginInfo, PluginRegistry, SchemaType};
pub use runtime::{configure, runtime, PluginSettings};
