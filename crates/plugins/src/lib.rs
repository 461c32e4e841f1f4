//! The plugins ferrisix implements, in families (`limit/`, `observe/`, `transform/`), each a
//! [`PluginDef`] built on the plugin API (`ferrisix-plugin-api`) and registered by one line in
//! its family's list; plus the [`PluginRegistry`] every consumer of plugins derives from (the
//! Admin API's listing and schemas, validation, compilation) and the [`PluginChain`]s the proxy
//! runs.
//!
//! Plugin modules import the plugin API and the shared support modules ([`support`]), never
//! each other. Adding a plugin is one file in its family's folder and its name in the family's
//! `family!` list.
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

pub mod chain;
pub mod registry;
pub mod support;
#[cfg(test)]
mod testing;

pub mod limit;
pub mod observe;
pub mod transform;

pub use chain::{CompileEnv, GlobalChains, GlobalRules, PluginChain, PluginSource, Verdicts};
pub use ferrisix_plugin_api::PluginDef;
pub use registry::{PluginInfo, PluginRegistry, SchemaType};

/// Every plugin ferrisix implements, family by family.
pub fn builtin() -> impl Iterator<Item = &'static PluginDef> {
    [limit::PLUGINS, observe::PLUGINS, transform::PLUGINS]
        .into_iter()
        .flatten()
        .copied()
}
