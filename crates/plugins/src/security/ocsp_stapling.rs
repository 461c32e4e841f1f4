//! ocsp-stapling (`apisix/plugins/ocsp-stapling.lua`): enabling it lets ssls carry
//! `ocsp_stapling` (`enabled`, `skip_verify`, `cache_ttl`), and the OCSP answers of those that
//! enable it are fetched, cached, checked and stapled to their handshakes. That work is TLS's
//! (`ferrisix_tls::ocsp`, given a stapler by the binary when this plugin is enabled); the
//! plugin itself has an empty conf and does nothing per request, as APISIX's.

use ferrisix_plugin_api::PluginDef;
use serde_json::{json, Value};

use crate::support::inert;

pub const NAME: &str = "ocsp-stapling";

/// Nothing per request: the answer is stapled in the handshake.
pub static DEF: PluginDef = PluginDef::new(NAME, -44, schema, inert::compile);

fn schema() -> Value {
    json!({"type": "object", "properties": {}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_has_apisix_s_priority_and_an_empty_schema() {
        assert_eq!((DEF.name, DEF.priority), ("ocsp-stapling", -44));
        assert_eq!((DEF.schema)(), json!({"type": "object", "properties": {}}));
    }
}
