//! The plugins ferrisix implements, in families (`auth/`, `encode/`, `limit/`, `log/`,
//! `observe/`, `request/`, `restriction/`, `security/`, `traffic/`, `transform/`), each a
//! [`PluginDef`] built on the plugin API (`ferrisix-plugin-api`) and registered by one line in
//! its family's list; plus the [`PluginRegistry`] every consumer of plugins derives from (the
//! Admin API's listing and schemas, validation, compilation) and the [`PluginChain`]s the proxy
//! runs.
//!
//! Plugin modules import the plugin API and the shared support modules ([`support`]), never
//! each other. How to add one, step by step with a real plugin: `docs/adding-a-plugin.md`.
#![forbid(unsafe_code)]

/// Declares a family's plugin modules (`<family>/<name>.rs`, each with a `pub static DEF`)
/// and the family's list of definitions, in one place.
macro_rules! family {
    ($($plugin:ident),* $(,)?) => {
        $(pub mod $plugin;)*

        /// The definitions of this family's plugins.
        pub(crate) static PLUGINS: &[&ferrisix_plugin_api::PluginDef] = &[$(&$plugin::DEF),*];
    };
}

#[cfg(test)]
mod boundary;
pub mod chain;
pub mod consumers;
#[cfg(test)]
mod guide;
pub mod pubsub;
pub mod registry;
pub mod secrets;
pub mod stream;
pub mod support;
#[cfg(test)]
mod testing;

pub mod ai;
pub mod auth;
pub mod encode;
pub mod external;
pub mod limit;
pub mod log;
pub mod observe;
pub mod request;
pub mod restriction;
pub mod security;
pub mod serverless;
pub mod traffic;
pub mod transform;

pub use chain::{
    CompileEnv, ConsumerPlugins, GlobalChains, GlobalRules, PluginChain, PluginSource, Verdicts,
};
pub use consumers::{ConsumerChains, ConsumerProblem, ConsumerSet};
pub use ferrisix_plugin_api::{PluginDef, PluginKind};
pub use registry::{PluginInfo, PluginRegistry, SchemaType};

/// Every plugin ferrisix implements, family by family.
pub fn builtin() -> impl Iterator<Item = &'static PluginDef> {
    [
        ai::PLUGINS,
        auth::PLUGINS,
        encode::PLUGINS,
        external::PLUGINS,
        limit::PLUGINS,
        log::PLUGINS,
        observe::PLUGINS,
        request::PLUGINS,
        restriction::PLUGINS,
        security::PLUGINS,
        serverless::PLUGINS,
        traffic::PLUGINS,
        transform::PLUGINS,
    ]
    .into_iter()
    .flatten()
    .copied()
}
