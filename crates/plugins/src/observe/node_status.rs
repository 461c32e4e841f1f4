//! node-status (`apisix/plugins/node-status.lua`): the API `GET /apisix/status` (served on a
//! data-plane route through `public-api`, as APISIX's plugin APIs are) answering the
//! gateway's connection counters as nginx's stub_status has them, `{"id": <node id>,
//! "status": {"active", "accepted", "handled", "total", "reading", "writing", "waiting"}}`,
//! each count a string as APISIX reads them out of the status page. The plugin has no conf
//! of its own (an empty schema); enabling it is what adds the API.
//!
//! Not as APISIX: the node id is a UUID made when the gateway starts (APISIX keeps one in
//! `conf/apisix.uid` across restarts).

use std::sync::Arc;

use bytes::Bytes;
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{
    ApiAnswer, ApiHandler, ConnStats, PluginApi, PluginDef, PluginServices, Scope, SharedState,
};
use http::{HeaderValue, Method, StatusCode};
use serde_json::{json, Value};

use crate::support::inert;

pub const NAME: &str = "node-status";

/// Nothing per request: enabling it is what adds the API.
pub static DEF: PluginDef = PluginDef {
    scope: Scope::Global,
    apis: Some(apis),
    ..PluginDef::new(NAME, 1000, schema, inert::compile)
};

fn schema() -> Value {
    json!({"type": "object"})
}

/// This gateway's node id.
pub struct NodeId(pub String);

impl SharedState for NodeId {
    fn create(_: &PluginServices) -> NodeId {
        let r: u128 = rand::random();
        // UUID version 4, variant 10.
        let v = (r & !(0xf << 76) & !(0x3 << 62)) | (0x4 << 76) | (0x2 << 62);
        NodeId(format!(
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            (v >> 96) as u32,
            (v >> 80) as u16,
            (v >> 64) as u16,
            (v >> 48) as u16,
            (v & 0xffff_ffff_ffff) as u64
        ))
    }
}

/// The status document of a gateway with connection counters `stats` now.
fn status(stats: &ConnStats, id: &str) -> Value {
    let t = stats.read();
    json!({
        "id": id,
        "status": {
            "active": t.active.to_string(),
            "accepted": t.accepted.to_string(),
            "handled": t.handled.to_string(),
            "total": t.requests.to_string(),
            "reading": t.reading.to_string(),
            "writing": t.writing.to_string(),
            "waiting": t.waiting.to_string(),
        }
    })
}

fn apis(services: &PluginServices) -> Vec<PluginApi> {
    let id = services.shared::<NodeId>();
    let stats = services.conn_stats().clone();
    vec![PluginApi {
        methods: &[Method::GET],
        uri: "/apisix/status".into(),
        handler: ApiHandler::Answer(Arc::new(move |_: &Method, _: &str| {
            let body = status(&stats, &id.0);
            ApiAnswer {
                status: StatusCode::OK,
                content_type: HeaderValue::from_static("application/json"),
                body: Bytes::from(lua::cjson_encode(&body)),
            }
        })),
    }]
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;

    use super::*;

    #[test]
    fn status_reads_the_connection_counters() {
        let services = PluginServices::default();
        let stats = services.conn_stats();
        for _ in 0..3 {
            stats.connection_opened();
        }
        for _ in 0..5 {
            stats.request_started();
        }
        for _ in 0..4 {
            stats.request_finished();
        }
        stats.connection_closed();
        let list = apis(&services);
        assert_eq!(list.len(), 1);
        assert!(list[0].matches(&Method::GET, "/apisix/status"));
        assert!(!list[0].matches(&Method::POST, "/apisix/status"));
        let ApiHandler::Answer(handler) = &list[0].handler else {
            panic!("node-status answers from the URI alone")
        };
        let answer = handler(&Method::GET, "/apisix/status");
        assert_eq!(answer.status, StatusCode::OK);
        let v: Value = serde_json::from_slice(&answer.body).unwrap();
        let id = services.shared::<NodeId>();
        assert_eq!(v, status(stats, &id.0));
        assert_eq!(v["status"]["accepted"], "3");
        assert_eq!(v["status"]["handled"], "3");
        assert_eq!(v["status"]["total"], "5");
        assert_eq!(v["status"]["active"], "2");
        assert_eq!(v["status"]["writing"], "1");
        assert_eq!(v["status"]["waiting"], "1");
        assert_eq!(v["id"].as_str().unwrap().len(), 36);
    }

    #[test]
    fn schema_and_scope() {
        let r = crate::PluginRegistry::builtin();
        assert!(r.check(NAME, &json!({})).is_ok());
        let info = r.get(NAME).unwrap();
        assert_eq!(info.priority, 1000);
    }
}
