//! Spec §7: plugin and schema endpoints, reload, and the batch validator.

use ferrisix_config::store::Store;
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn plugin_list_by_priority() {
    let a = Admin::new();
    let r = a.call("GET", "/apisix/admin/plugins/list", None).await;
    assert_eq!(r.status, 200);
    let names: Vec<String> = serde_json::from_value(r.json()).unwrap();
    let registry = a.api.plugins();
    let mut expected: Vec<_> = registry
        .list()
        .map(|p| (p.priority, p.name.to_string()))
        .collect();
    expected.sort_by_key(|x| std::cmp::Reverse(x.0));
    assert_eq!(
        names,
        expected.into_iter().map(|(_, n)| n).collect::<Vec<_>>()
    );
    assert!(
        names.contains(&"limit-count".to_string()) && names.contains(&"prometheus".to_string())
    );
    assert_eq!(r.header("x-api-version"), None);
    a.call("GET", "/apisix/admin/plugins/list?subsystem=http", None)
        .await
        .expect(200, json!(names));
    // APISIX's default stream plugins, by priority.
    a.call("GET", "/apisix/admin/plugins/list?subsystem=stream", None)
        .await
        .expect(
            200,
            json!(["ip-restriction", "limit-conn", "mqtt-proxy", "syslog"]),
        );
    let r = a
        .call("GET", "/apisix/admin/plugins/list?subsystem=udp", None)
        .await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (400, "invalid subsystem passed")
    );
}

#[tokio::test]
async fn plugin_schema() {
    let a = Admin::new();
    let r = a
        .call("GET", "/apisix/admin/plugins/limit-count", None)
        .await;
    r.expect(
        200,
        json!({"type": "object", "$comment": "this is a mark for our injected plugin schema"}),
    );
    assert!(r.json()["properties"]["_meta"].is_object());
    assert_eq!(r.header("x-api-version"), Some("v3"));
    a.call("GET", "/apisix/admin/schema/plugins/prometheus", None)
        .await
        .expect(
            200,
            json!({"properties": {"prefer_name": {"type": "boolean"}}}),
        );
    a.call("GET", "/apisix/admin/plugins/nope", None)
        .await
        .expect(
            404,
            json!({"error_msg": "plugin not found in subsystem http"}),
        );
    a.call(
        "GET",
        "/apisix/admin/plugins/limit-count?subsystem=stream",
        None,
    )
    .await
    .expect(
        404,
        json!({"error_msg": "plugin not found in subsystem stream"}),
    );
    a.call("GET", "/apisix/admin/plugins/limit-count?subsystem=x", None)
        .await
        .expect(400, json!({"error_msg": "unsupported subsystem: x"}));
    a.call(
        "GET",
        "/apisix/admin/plugins/prometheus?schema_type=consumer",
        None,
    )
    .await
    .expect(400, json!({"error_msg": "not found schema"}));
    let all = a.call("GET", "/apisix/admin/plugins?all=true", None).await;
    all.expect(
        200,
        json!({"limit-count": {"priority": 1002}, "prometheus": {"priority": 500}}),
    );
    assert!(all.json()["limit-count"]["schema"].is_object());
}

#[tokio::test]
async fn core_schemas() {
    let a = Admin::new();
    a.call("GET", "/apisix/admin/schema/route", None)
        .await
        .expect(200, json!({"type": "object"}));
    a.call("GET", "/apisix/admin/schema/upstream", None)
        .await
        .expect(200, json!({"type": "object"}));
    a.call("GET", "/apisix/admin/schema/nope", None)
        .await
        .expect(400, json!({"error_msg": "not found schema: nope"}));
}

#[tokio::test]
async fn schema_validate() {
    let a = Admin::new();
    let r = a
        .json("POST", "/apisix/admin/schema/validate/routes", route("/a"))
        .await;
    assert_eq!((r.status, r.body.len()), (200, 0));
    assert_eq!(r.header("x-api-version"), None);
    a.json("POST", "/apisix/admin/schema/validate/routes", json!({"methods": ["GET"], "upstream": {"nodes": {}}}))
        .await
        .expect(400, json!({"error_msg": "allOf 1 failed: value should match only one schema, but matches none"}));
    // Schema only: references and plugins are not looked at.
    let r = a
        .json(
            "POST",
            "/apisix/admin/schema/validate/routes",
            json!({"uri": "/a", "upstream_id": "nope", "plugins": {"x": 1}}),
        )
        .await;
    assert_eq!(r.status, 200);
    a.json("POST", "/apisix/admin/schema/validate/upstreams", json!({"nodes": {"127.0.0.1:80": "1"}}))
        .await
        .expect(400, json!({"error_msg": "property \"nodes\" validation failed: object matches none of the required"}));
    a.json("POST", "/apisix/admin/schema/validate/nope", json!({}))
        .await
        .expect(404, json!({"error_msg": "Unsupported resource type: nope"}));
    a.call("POST", "/apisix/admin/schema/validate/routes", Some("{x"))
        .await
        .expect(400, json!({"error_msg": "invalid request body: Expected object key string but found invalid token at character 2", "req_body": "{x"}));
}

#[tokio::test]
async fn reload_and_plugin_list_key() {
    let a = Admin::new();
    a.api.publish_plugin_list().await.unwrap();
    let stored = a.stored("/apisix/plugins").await.unwrap();
    let expected: Vec<_> = a
        .api
        .plugins()
        .list()
        .map(|p| json!({"name": p.name}))
        .collect();
    assert_eq!(stored, json!(expected));
    // Unchanged: not rewritten.
    let rev = a
        .store
        .get("/apisix/plugins")
        .await
        .unwrap()
        .unwrap()
        .mod_revision;
    a.api.publish_plugin_list().await.unwrap();
    assert_eq!(
        a.store
            .get("/apisix/plugins")
            .await
            .unwrap()
            .unwrap()
            .mod_revision,
        rev
    );

    let r = a.call("PUT", "/apisix/admin/plugins/reload", None).await;
    assert_eq!((r.status, r.text().as_str()), (200, "done"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert!(
        a.store
            .get("/apisix/plugins")
            .await
            .unwrap()
            .unwrap()
            .mod_revision
            > rev
    );
    for method in ["GET", "POST", "DELETE", "PATCH"] {
        a.call(method, "/apisix/admin/plugins/reload", None).await.expect(
            405,
            json!({"error_msg": format!("please use PUT method to reload the plugins, {method} method is not allowed.")}),
        );
    }
}

#[tokio::test]
async fn reload_hook_replaces_the_registry() {
    use std::sync::Arc;
    let store = Arc::new(ferrisix_config::store::memory::MemoryStore::new("/apisix"));
    let (only_prometheus, _) =
        ferrisix_plugins::PluginRegistry::enabled(Some(&["prometheus".to_string()]));
    let api = ferrisix_admin::AdminApi::new(
        options(),
        store.clone(),
        ferrisix_plugins::PluginRegistry::builtin(),
    )
    .with_reload_hook(Arc::new(move || Some(only_prometheus.clone())));
    let a = Admin {
        api: Arc::new(api),
        store,
    };
    a.call("PUT", "/apisix/admin/plugins/reload", None).await;
    a.call("GET", "/apisix/admin/plugins/list", None)
        .await
        .expect(200, json!(["prometheus"]));
    assert_eq!(
        a.stored("/apisix/plugins").await.unwrap(),
        json!([{"name": "prometheus"}])
    );
    let mut r = route("/a");
    r["plugins"] = json!({"limit-count": {"count": 1, "time_window": 1}});
    a.json("PUT", "/apisix/admin/routes/1", r)
        .await
        .expect(400, json!({"error_msg": "unknown plugin [limit-count]"}));
}

#[tokio::test]
async fn configs_validate() {
    let a = Admin::new();
    a.call("POST", "/apisix/admin/configs/validate", None)
        .await
        .expect(
            400,
            json!({"error_msg": "invalid request body: empty request body"}),
        );
    a.json(
        "POST",
        "/apisix/admin/configs/validate",
        json!({"routes": [route("/a")], "upstreams": []}),
    )
    .await
    .expect(200, json!({}));
    let r = a
        .json(
            "POST",
            "/apisix/admin/configs/validate",
            json!({"routes": [{"id": "1", "uri": 1}, {"id": "1", "uri": "/b", "upstream_id": "missing-is-fine"}], "routes_conf_version": "x"}),
        )
        .await;
    r.expect(
        400,
        json!({"error_msg": "Configuration validation failed", "errors": [
            {"resource_type": "routes", "error": "routes_conf_version must be a number, got string"},
            {"resource_type": "routes", "resource_id": "1", "index": 0,
             "error": "invalid configuration: property \"uri\" validation failed: wrong type: expected string, got number"},
            {"resource_type": "routes", "resource_id": "1", "index": 1, "error": "found duplicate id 1 in routes"}
        ]}),
    );
    // Nothing is written.
    assert!(a.store.list("/apisix/routes/").await.unwrap().0.is_empty());
    let yaml = req("POST", "/apisix/admin/configs/validate")
        .header("X-API-KEY", KEY)
        .header("Content-Type", "application/yaml")
        .body(body(
            "routes:\n  - uri: /a\n    upstream:\n      nodes:\n        \"127.0.0.1:1\": 1\n",
        ))
        .unwrap();
    a.send(yaml, local()).await.expect(200, json!({}));
}

#[tokio::test]
async fn limit_count_group_confs_must_match() {
    let a = Admin::new();
    let route = |count: u64| {
        json!({"uri": "/g", "upstream": {"nodes": {"127.0.0.1:1980": 1}},
            "plugins": {"limit-count": {"count": count, "time_window": 60, "group": "admin-grp"}}})
    };
    a.json("PUT", "/apisix/admin/routes/g1", route(10))
        .await
        .expect(201, json!({}));
    // The same conf (defaults included) joins the group.
    a.json("PUT", "/apisix/admin/routes/g2", route(10))
        .await
        .expect(201, json!({}));
    a.json("PUT", "/apisix/admin/routes/g3", route(11))
        .await
        .expect(400, json!({"error_msg": "failed to check the configuration of plugin limit-count err: group conf mismatched"}));
    assert!(a.store.get("/apisix/routes/g3").await.unwrap().is_none());
}
