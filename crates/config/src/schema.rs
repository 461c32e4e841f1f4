//! JSON-Schema validation with APISIX's exact error texts, and the core resource schemas.
//!
//! APISIX validates every resource with the api7 `jsonschema` Lua library and sends its first
//! error back verbatim (`invalid configuration: property "uri" validation failed: wrong type:
//! expected string, got number`). Clients and tests compare those texts, so [`validate`]
//! reproduces the library's keyword order, message wording and Lua view of JSON values rather
//! than using a general-purpose validator. The schemas are built once and shared; the Admin API
//! serves them on `GET /apisix/admin/schema/<name>`.

use std::sync::LazyLock;

use serde_json::Value;

use crate::model::ResourceKind;

pub mod cjson;
pub mod defs;
mod engine;
pub mod lua;

pub use engine::{pattern_search, validate, validate_and_fill};

macro_rules! schema_static {
    ($($name:ident => $build:expr),* $(,)?) => {
        $(static $name: LazyLock<Value> = LazyLock::new(|| $build);)*
    };
}

schema_static! {
    ROUTE => defs::route(),
    UPSTREAM => defs::upstream(),
    SERVICE => defs::service(),
    PLUGIN_CONFIG => defs::plugin_config(),
    GLOBAL_RULE => defs::global_rule(),
    CONSUMER => defs::consumer(),
    SSL => defs::ssl(),
    PLUGIN_METADATA => defs::plugin_metadata(),
    CREDENTIAL => defs::credential(),
    CONSUMER_GROUP => defs::consumer_group(),
    PROTO => defs::proto(),
    STREAM_ROUTE => defs::stream_route(),
    PLUGIN_LIST => defs::plugin_list(),
    PLUGIN_META => defs::plugin_meta(),
    ID => defs::id(),
    HOST => defs::host(),
    METHOD => defs::method(),
    LABEL_VALUE => defs::label_value(),
    IP_ALTERNATIVES => defs::ip_alternatives(),
    NODES => defs::nodes(),
    HEALTH_CHECKER => defs::health_checker(),
    HEALTH_CHECKER_ACTIVE => defs::health_checker_active(),
    HEALTH_CHECKER_PASSIVE => defs::health_checker_passive(),
    HASH_VARS => defs::upstream_hash_vars(),
    HASH_HEADER => defs::upstream_hash_header(),
    HASH_VARS_COMBINATIONS => defs::upstream_hash_vars_combinations(),
}

/// The schema a resource kind is validated against (the inline `upstream` of routes and
/// services is the upstream schema). Plugin metadata has no core schema; it gets a bare
/// object schema and is checked by the owning plugin.
pub fn resource_schema(kind: ResourceKind) -> &'static Value {
    match kind {
        ResourceKind::Routes => &ROUTE,
        ResourceKind::Upstreams => &UPSTREAM,
        ResourceKind::Services => &SERVICE,
        ResourceKind::PluginConfigs => &PLUGIN_CONFIG,
        ResourceKind::GlobalRules => &GLOBAL_RULE,
        ResourceKind::ConsumerGroups => &CONSUMER_GROUP,
        ResourceKind::Consumers => &CONSUMER,
        ResourceKind::Credentials => &CREDENTIAL,
        ResourceKind::Ssls => &SSL,
        ResourceKind::PluginMetadata => &PLUGIN_METADATA,
        ResourceKind::Protos => &PROTO,
        ResourceKind::StreamRoutes => &STREAM_ROUTE,
        // Checked by the manager's own schema (`secret::manager_schema`).
        ResourceKind::Secrets => &PLUGIN_METADATA,
    }
}

/// A schema by the name APISIX's `core.schema` table uses, for
/// `GET /apisix/admin/schema/<name>` (unknown names answer `not found schema: <name>`).
pub fn schema_by_name(name: &str) -> Option<&'static Value> {
    Some(match name {
        "route" => &ROUTE,
        "upstream" => &UPSTREAM,
        "service" => &SERVICE,
        "plugin_config" => &PLUGIN_CONFIG,
        "global_rule" => &GLOBAL_RULE,
        "consumer" => &CONSUMER,
        "ssl" => &SSL,
        "credential" => &CREDENTIAL,
        "consumer_group" => &CONSUMER_GROUP,
        "proto" => &PROTO,
        "stream_route" => &STREAM_ROUTE,
        "plugins" => &PLUGIN_LIST,
        "id_schema" => &ID,
        "host_def" => &HOST,
        "method_schema" => &METHOD,
        "ip_def" => &IP_ALTERNATIVES,
        "label_value_def" => &LABEL_VALUE,
        "discovery_nodes" | "nodes" => &NODES,
        "health_checker" => &HEALTH_CHECKER,
        "health_checker_active" => &HEALTH_CHECKER_ACTIVE,
        "health_checker_passive" => &HEALTH_CHECKER_PASSIVE,
        "upstream_hash_vars_schema" => &HASH_VARS,
        "upstream_hash_header_schema" => &HASH_HEADER,
        "upstream_hash_vars_combinations_schema" => &HASH_VARS_COMBINATIONS,
        _ => return None,
    })
}

/// The `_meta` schema every plugin schema accepts as a property (`disable`, `error_response`,
/// `priority`, `filter`, `pre_function`; nothing else).
pub fn plugin_meta_schema() -> &'static Value {
    &PLUGIN_META
}

/// The schema a `chash` upstream's `key` must match for its `hash_on`; `None` for `consumer`
/// (no key needed), `Err` for an unknown `hash_on`.
pub fn chash_key_schema(hash_on: &str) -> Result<Option<&'static Value>, String> {
    match hash_on {
        "vars" => Ok(Some(&HASH_VARS)),
        "header" | "cookie" => Ok(Some(&HASH_HEADER)),
        "consumer" => Ok(None),
        "vars_combinations" => Ok(Some(&HASH_VARS_COMBINATIONS)),
        other => Err(format!("invalid hash_on type {other}")),
    }
}

#[cfg(test)]
mod tests;
