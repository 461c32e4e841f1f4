//! proxy-buffering (`apisix/plugins/proxy-buffering.lua`): `disable_proxy_buffering` turns
//! nginx's `proxy_buffering` off for the route, so the upstream's answer reaches the client as
//! it arrives (server-sent events, long polls) instead of after nginx's buffers filled.
//!
//! ferrisix never buffers an answer before sending it on: every chunk is passed to the client
//! as the upstream sends it, which is what the option asks for, so the plugin checks its conf
//! and has nothing to do per request.

use ferrisix_plugin_api::PluginDef;
use serde_json::{json, Value};

use crate::support::inert;

pub const NAME: &str = "proxy-buffering";

/// Nothing per request: ferrisix never buffers answers.
pub static DEF: PluginDef = PluginDef::new(NAME, 21991, schema, inert::compile);

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "disable_proxy_buffering": {"type": "boolean", "default": false}
        }
    })
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use serde_json::json;

    use crate::registry::PluginRegistry;

    #[test]
    fn schema_refuses_a_non_boolean() {
        let r = PluginRegistry::builtin();
        assert!(r
            .check(super::NAME, &json!({"disable_proxy_buffering": true}))
            .is_ok());
        assert!(r.check(super::NAME, &json!({})).is_ok());
        assert_eq!(
            r.check(super::NAME, &json!({"disable_proxy_buffering": "yes"}))
                .unwrap_err(),
            "failed to check the configuration of plugin proxy-buffering err: property \
             \"disable_proxy_buffering\" validation failed: wrong type: expected boolean, got \
             string"
        );
    }
}
