//! Resource validation as APISIX's Admin API does it, and conversion of valid resources into
//! the typed model.
//!
//! A resource is checked in APISIX's order — the few checks APISIX runs before the schema
//! (`host` with `hosts`), the schema, then the resource's own checks (upstream ports and hash
//! keys, plugins, `vars`) — and the first failure is reported with APISIX's exact `error_msg`.
//! Checks that need other stored resources (does `upstream_id` exist?) run only when a
//! [`ReferenceLookup`] is given, at the point APISIX runs them; without one the caller gets the
//! references from [`references`] and checks them itself.
//!
//! Plugin configurations are checked through [`PluginCheck`], implemented by the plugins crate;
//! [`AcceptAnyPlugin`] stands in until then.

mod addr;
mod checks;
mod convert;

pub use checks::{
    check_forbidden_properties, check_global_rule_conflicts, check_plugins, check_resource,
    check_resource_with_keyring, check_resource_with_refs, missing_reference_message, references,
    AcceptAnyPlugin, PluginCheck, ReferenceLookup, ValidationError,
};
pub use convert::{
    global_rule_from_value, plugin_config_from_value, route_from_value, service_from_value,
    ssl_from_value, upstream_from_value, Document,
};

#[cfg(test)]
mod tests;
