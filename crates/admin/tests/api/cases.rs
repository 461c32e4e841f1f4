//! The behaviours of the public conformance cases (`cases/admin/*.json`), admin side. Where a
//! case goes on to the data port, the test checks what the data plane would load: the state the
//! store publishes.

use ferrisix_config::model::ResourceKind;
use ferrisix_config::store::Store;
use serde_json::json;

use crate::support::*;

fn published(a: &Admin, kind: ResourceKind, id: &str) -> Option<serde_json::Value> {
    a.store
        .subscribe()
        .borrow()
        .get(kind, id)
        .map(|i| i.value.parse())
}

#[tokio::test]
async fn routes_put_get_delete_envelopes() {
    let a = Admin::new();
    let r = a.call("DELETE", "/apisix/admin/routes/101", None).await;
    assert!([200, 404].contains(&r.status));
    let body = json!({"uri": "/adm-c01", "desc": "c01 route", "methods": ["GET"],
        "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:8080": 1}}});
    let r = a
        .json("PUT", "/apisix/admin/routes/101", body.clone())
        .await;
    r.expect(201, json!({"key": "/apisix/routes/101", "value": {"id": "101", "uri": "/adm-c01", "desc": "c01 route",
        "methods": ["GET"], "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:8080": 1}}}}))
        .absent("action")
        .absent("node");
    assert!(r.json()["value"]["create_time"].is_i64());
    let r = a.call("GET", "/apisix/admin/routes/101", None).await;
    r.expect(
        200,
        json!({"key": "/apisix/routes/101", "value": {"id": "101", "uri": "/adm-c01"}}),
    );
    assert!(r.json()["createdIndex"].is_i64() && r.json()["modifiedIndex"].is_i64());
    assert_eq!(r.header("x-api-version"), Some("v3"));
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("application/json"));
    let r = a.call("DELETE", "/apisix/admin/routes/101", None).await;
    r.expect(200, json!({"deleted": "1", "key": "/apisix/routes/101"}))
        .absent("value")
        .absent("node");
    assert_eq!(
        r.text(),
        "{\"deleted\":\"1\",\"key\":\"/apisix/routes/101\"}\n"
    );
    a.call("GET", "/apisix/admin/routes/101", None)
        .await
        .expect(404, json!({"message": "Key not found"}));
}

#[tokio::test]
async fn routes_put_replace_returns_200() {
    let a = Admin::new();
    let mut body = route("/adm-c02");
    body["desc"] = json!("first");
    a.json("PUT", "/apisix/admin/routes/102", body.clone())
        .await
        .expect(201, json!({"value": {"desc": "first"}}));
    body["desc"] = json!("second");
    a.json("PUT", "/apisix/admin/routes/102", body)
        .await
        .expect(
            200,
            json!({"key": "/apisix/routes/102", "value": {"id": "102", "desc": "second"}}),
        );
    a.call("GET", "/apisix/admin/routes/102", None)
        .await
        .expect(200, json!({"value": {"desc": "second", "uri": "/adm-c02"}}));
}

#[tokio::test]
async fn routes_post_generates_20_digit_id() {
    let a = Admin::new();
    let mut body = route("/adm-c03");
    body["desc"] = json!("c03");
    let r = a.json("POST", "/apisix/admin/routes", body).await;
    r.expect(201, json!({"value": {"uri": "/adm-c03", "desc": "c03"}}))
        .absent("action")
        .absent("node");
    let v = r.json();
    let key = v["key"].as_str().unwrap();
    let id = v["value"]["id"].as_str().unwrap();
    assert_eq!(id.len(), 20);
    assert!(id.bytes().all(|b| b.is_ascii_digit()));
    assert_eq!(key, format!("/apisix/routes/{id}"));
    // Ids are increasing, not consecutive: each POST also rewrites gen_id.
    let r2 = a.json("POST", "/apisix/admin/routes", route("/x")).await;
    let id2 = r2.json()["value"]["id"].as_str().unwrap().to_string();
    assert!(id2.as_str() > id);
    assert_eq!(
        a.store.get("/apisix/gen_id").await.unwrap().unwrap().value,
        b"1"
    );
}

#[tokio::test]
async fn routes_post_rejects_id() {
    let a = Admin::new();
    a.json("POST", "/apisix/admin/routes/104", route("/adm-c04"))
        .await
        .expect(400, json!({"error_msg": "wrong route id, do not need it"}));
    let mut body = route("/adm-c04");
    body["id"] = json!("104");
    a.json("POST", "/apisix/admin/routes", body)
        .await
        .expect(400, json!({"error_msg": "wrong route id, do not need it"}));
    a.call("GET", "/apisix/admin/routes/104", None)
        .await
        .expect(404, json!({"message": "Key not found"}));
}

#[tokio::test]
async fn routes_put_rejects_mismatched_body_id() {
    let a = Admin::new();
    let mut body = route("/adm-c05");
    body["id"] = json!(995);
    a.json("PUT", "/apisix/admin/routes/105", body)
        .await
        .expect(400, json!({"error_msg": "wrong route id"}));
    a.call("GET", "/apisix/admin/routes/105", None)
        .await
        .expect(404, json!({"message": "Key not found"}));
    a.call("GET", "/apisix/admin/routes/995", None)
        .await
        .expect(404, json!({"message": "Key not found"}));
}

#[tokio::test]
async fn routes_list_envelope_label_filter() {
    let a = Admin::new();
    for (id, uri) in [("106", "/adm-c06/a"), ("206", "/adm-c06/b")] {
        let mut body = route(uri);
        body["labels"] = json!({"adm-c06": "yes"});
        a.json("PUT", &format!("/apisix/admin/routes/{id}"), body)
            .await
            .expect(201, json!({}));
    }
    a.json("PUT", "/apisix/admin/routes/306", route("/other"))
        .await;
    let r = a
        .call("GET", "/apisix/admin/routes?label=adm-c06", None)
        .await;
    r.expect(
        200,
        json!({"total": 2, "list": [
            {"key": "/apisix/routes/106", "value": {"id": "106", "uri": "/adm-c06/a", "labels": {"adm-c06": "yes"}}},
            {"key": "/apisix/routes/206", "value": {"id": "206", "uri": "/adm-c06/b"}}
        ]}),
    )
    .absent("node")
    .absent("action")
    .absent("count");
    let v = r.json();
    assert!(v["list"][0]["createdIndex"].is_i64() && v["list"][0]["modifiedIndex"].is_i64());
}

#[tokio::test]
async fn routes_list_paging() {
    let a = Admin::new();
    for (id, uri) in [
        ("107", "/adm-c07/1"),
        ("207", "/adm-c07/2"),
        ("307", "/adm-c07/3"),
    ] {
        let mut body = route(uri);
        body["labels"] = json!({"adm-c07": "p"});
        a.json("PUT", &format!("/apisix/admin/routes/{id}"), body)
            .await;
    }
    a.call("GET", "/apisix/admin/routes?label=adm-c07&page=1&page_size=10", None).await.expect(
        200,
        json!({"total": 3, "list": [{"value": {"id": "107"}}, {"value": {"id": "207"}}, {"value": {"id": "307"}}]}),
    );
    let r = a
        .call(
            "GET",
            "/apisix/admin/routes?label=adm-c07&page=2&page_size=10",
            None,
        )
        .await;
    r.expect(200, json!({"total": 3}));
    assert!(r.text().contains("\"list\":{}"), "{}", r.text());
    let r = a
        .call("GET", "/apisix/admin/routes?page=1&page_size=5", None)
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.text(), "page_size must be between 10 and 500");
    assert_eq!(r.header("content-type"), Some("application/json"));
}

#[tokio::test]
async fn routes_patch_merges_objects_replaces_arrays() {
    let a = Admin::new();
    let body = json!({"uri": "/adm-c08", "desc": "before", "methods": ["GET", "POST"],
        "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:8080": 1}}});
    a.json("PUT", "/apisix/admin/routes/108", body).await;
    let patch =
        json!({"desc": "after", "methods": ["PUT"], "upstream": {"nodes": {"127.0.0.1:8081": 2}}});
    let expected = json!({"id": "108", "uri": "/adm-c08", "desc": "after", "methods": ["PUT"],
        "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:8080": 1, "127.0.0.1:8081": 2}}});
    a.json("PATCH", "/apisix/admin/routes/108", patch)
        .await
        .expect(
            200,
            json!({"key": "/apisix/routes/108", "value": expected.clone()}),
        );
    a.call("GET", "/apisix/admin/routes/108", None)
        .await
        .expect(200, json!({"value": expected}));
}

#[tokio::test]
async fn routes_patch_null_removes_field() {
    let a = Admin::new();
    let body = json!({"uri": "/adm-c09", "desc": "to be removed",
        "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:8080": 1, "removeme:8080": 1}}});
    a.json("PUT", "/apisix/admin/routes/109", body).await;
    let patch = json!({"desc": null, "upstream": {"nodes": {"removeme:8080": null}}});
    a.json("PATCH", "/apisix/admin/routes/109", patch)
        .await
        .expect(200, json!({"value": {"uri": "/adm-c09", "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:8080": 1}}}}))
        .absent("value.desc")
        .absent("value.upstream.nodes.removeme:8080");
    a.call("GET", "/apisix/admin/routes/109", None)
        .await
        .expect(200, json!({"value": {"uri": "/adm-c09"}}))
        .absent("value.desc");
}

#[tokio::test]
async fn routes_patch_subpath_replaces() {
    let a = Admin::new();
    let body = json!({"uri": "/adm-c10", "methods": ["GET"],
        "upstream": {"type": "roundrobin", "nodes": {"removeme:8080": 1}}});
    a.json("PUT", "/apisix/admin/routes/110", body).await;
    a.call("PATCH", "/apisix/admin/routes/110/methods", Some("[\"POST\",\"PUT\"]"))
        .await
        .expect(200, json!({"key": "/apisix/routes/110", "value": {"uri": "/adm-c10", "methods": ["POST", "PUT"]}}));
    a.call(
        "PATCH",
        "/apisix/admin/routes/110/uri",
        Some("\"/adm-c10-new\""),
    )
    .await
    .expect(
        200,
        json!({"value": {"uri": "/adm-c10-new", "methods": ["POST", "PUT"]}}),
    );
    a.json(
        "PATCH",
        "/apisix/admin/routes/110/upstream/nodes",
        json!({"127.0.0.1:8080": 3}),
    )
    .await
    .expect(
        200,
        json!({"value": {"upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:8080": 3}}}}),
    )
    .absent("value.upstream.nodes.removeme:8080");
}

#[tokio::test]
async fn not_found_and_unsupported_resource() {
    let a = Admin::new();
    a.call("DELETE", "/apisix/admin/routes/111", None)
        .await
        .expect(404, json!({"message": "Key not found"}));
    a.call("GET", "/apisix/admin/upstreams/111", None)
        .await
        .expect(404, json!({"message": "Key not found"}));
    a.json("PUT", "/apisix/admin/routs/111", route("/adm-c11"))
        .await
        .expect(
            404,
            json!({"error_msg": "Unsupported resource type: routs"}),
        );
}

#[tokio::test]
async fn upstreams_crud_array_nodes() {
    let a = Admin::new();
    let r = a
        .call("DELETE", "/apisix/admin/upstreams/112?force=true", None)
        .await;
    assert!([200, 404].contains(&r.status));
    let nodes = json!([{"host": "127.0.0.1", "port": 8080, "weight": 1}]);
    a.json("PUT", "/apisix/admin/upstreams/112", json!({"type": "roundrobin", "desc": "c12", "nodes": nodes}))
        .await
        .expect(201, json!({"key": "/apisix/upstreams/112", "value": {"id": "112", "type": "roundrobin", "desc": "c12", "nodes": nodes}}))
        .absent("action");
    a.call("GET", "/apisix/admin/upstreams/112", None)
        .await
        .expect(
            200,
            json!({"key": "/apisix/upstreams/112", "value": {"id": "112", "nodes": nodes}}),
        );
    a.json("PATCH", "/apisix/admin/upstreams/112", json!({"desc": "c12 patched", "retries": 1}))
        .await
        .expect(200, json!({"value": {"desc": "c12 patched", "retries": 1, "type": "roundrobin", "nodes": nodes}}));
    a.call("DELETE", "/apisix/admin/upstreams/112", None)
        .await
        .expect(200, json!({"deleted": "1", "key": "/apisix/upstreams/112"}));
    a.call("GET", "/apisix/admin/upstreams/112", None)
        .await
        .expect(404, json!({"message": "Key not found"}));
}

#[tokio::test]
async fn services_crud() {
    let a = Admin::new();
    let up = json!({"type": "roundrobin", "nodes": {"127.0.0.1:8080": 1}});
    a.json("PUT", "/apisix/admin/services/113", json!({"desc": "c13", "labels": {"adm-c13": "s"}, "upstream": up}))
        .await
        .expect(201, json!({"key": "/apisix/services/113", "value": {"id": "113", "desc": "c13", "upstream": up}}));
    let r = a.call("GET", "/apisix/admin/services/113", None).await;
    r.expect(200, json!({"key": "/apisix/services/113", "value": {"id": "113", "desc": "c13", "upstream": up}}));
    a.call("GET", "/apisix/admin/services?label=adm-c13", None)
        .await
        .expect(
            200,
            json!({"total": 1, "list": [{"key": "/apisix/services/113", "value": {"id": "113"}}]}),
        );
    a.json("PATCH", "/apisix/admin/services/113", json!({"desc": "c13 patched", "plugins": {"prometheus": {}}}))
        .await
        .expect(200, json!({"value": {"id": "113", "desc": "c13 patched", "upstream": up, "plugins": {"prometheus": {}}}}));
    a.call("DELETE", "/apisix/admin/services/113", None)
        .await
        .expect(200, json!({"deleted": "1", "key": "/apisix/services/113"}));
    a.call("GET", "/apisix/admin/services/113", None)
        .await
        .expect(404, json!({"message": "Key not found"}));
}

#[tokio::test]
async fn validate_upstream_bad_node() {
    let a = Admin::new();
    let nodes_msg = "invalid configuration: property \"nodes\" validation failed: object matches none of the required";
    a.json(
        "PUT",
        "/apisix/admin/upstreams/118",
        json!({"nodes": {"127.0.0.1:8080": "1"}, "type": "roundrobin"}),
    )
    .await
    .expect(400, json!({"error_msg": nodes_msg}));
    a.json(
        "PUT",
        "/apisix/admin/upstreams/118",
        json!({"nodes": [{"host": "127.0.0.1", "port": 0, "weight": 1}], "type": "roundrobin"}),
    )
    .await
    .expect(400, json!({"error_msg": nodes_msg}));
    a.json(
        "PUT",
        "/apisix/admin/routes/118",
        json!({"uri": "/adm-c18", "upstream": {"nodes": {"127.0.0.1:8080": -100}, "type": "roundrobin"}}),
    )
    .await
    .expect(400, json!({"error_msg": "invalid configuration: property \"upstream\" validation failed: property \"nodes\" validation failed: object matches none of the required"}));
    a.call("GET", "/apisix/admin/upstreams/118", None)
        .await
        .expect(404, json!({"message": "Key not found"}));
}

#[tokio::test]
async fn validate_route_messages() {
    let a = Admin::new();
    a.json("PUT", "/apisix/admin/routes/116", json!({"methods": ["GET"], "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:8080": 1}}}))
        .await
        .expect(400, json!({"error_msg": "invalid configuration: allOf 1 failed: value should match only one schema, but matches none"}));
    a.call("GET", "/apisix/admin/routes/116", None)
        .await
        .expect(404, json!({"message": "Key not found"}));
    a.json("PUT", "/apisix/admin/routes/117", json!({"methods": ["invalid_method"], "uri": "/index.html"}))
        .await
        .expect(400, json!({"error_msg": "invalid configuration: property \"methods\" validation failed: failed to validate item 1: matches none of the enum values"}));
    let mut wrong = route("/x");
    wrong["uri"] = json!(123);
    a.json("PUT", "/apisix/admin/routes/123", wrong)
        .await
        .expect(400, json!({"error_msg": "invalid configuration: property \"uri\" validation failed: wrong type: expected string, got number"}));
    let mut plugins = route("/adm-c23");
    plugins["plugins"] = json!("limit-count");
    a.json("PUT", "/apisix/admin/routes/123", plugins)
        .await
        .expect(400, json!({"error_msg": "invalid configuration: property \"plugins\" validation failed: wrong type: expected object, got string"}));
    a.call("GET", "/apisix/admin/routes/123", None)
        .await
        .expect(404, json!({"message": "Key not found"}));
}

#[tokio::test]
async fn validate_plugins() {
    let a = Admin::new();
    let mut r = route("/adm-c19");
    r["plugins"] = json!({"no-such-plugin": {}});
    a.json("PUT", "/apisix/admin/routes/119", r)
        .await
        .expect(400, json!({"error_msg": "unknown plugin [no-such-plugin]"}));
    a.json(
        "PUT",
        "/apisix/admin/services/119",
        json!({"plugins": {"no-such-plugin": {}}}),
    )
    .await
    .expect(400, json!({"error_msg": "unknown plugin [no-such-plugin]"}));
    a.call("GET", "/apisix/admin/routes/119", None)
        .await
        .expect(404, json!({"message": "Key not found"}));

    let limit_msg = "failed to check the configuration of plugin limit-count err: property \"count\" validation failed: value should match only one schema, but matches none";
    let mut lc = route("/adm-c20");
    lc["plugins"] = json!({"limit-count": {"count": -100, "time_window": 60, "rejected_code": 503, "key": "remote_addr"}});
    a.json("PUT", "/apisix/admin/routes/120", lc.clone())
        .await
        .expect(400, json!({"error_msg": limit_msg}));
    a.json("POST", "/apisix/admin/routes", lc)
        .await
        .expect(400, json!({"error_msg": limit_msg}));

    let mut p = route("/adm-c21");
    p["plugins"] = json!({"prometheus": {"prefer_name": "yes"}});
    a.json("PUT", "/apisix/admin/routes/121", p).await.expect(
        400,
        json!({"error_msg": "failed to check the configuration of plugin prometheus err: property \"prefer_name\" validation failed: wrong type: expected boolean, got string"}),
    );
    a.call("GET", "/apisix/admin/routes/121", None)
        .await
        .expect(404, json!({"message": "Key not found"}));
    let mut ok = route("/adm-c21");
    ok["plugins"] = json!({"prometheus": {}});
    let r = a.json("PUT", "/apisix/admin/routes/121", ok).await;
    r.expect(201, json!({"value": {"plugins": {"prometheus": {}}}}));
    // Stored as sent: no schema defaults.
    assert_eq!(
        a.stored("/apisix/routes/121").await.unwrap()["plugins"],
        json!({"prometheus": {}})
    );
    assert!(a
        .stored("/apisix/routes/121")
        .await
        .unwrap()
        .get("priority")
        .is_none());
}

#[tokio::test]
async fn reference_checks_on_write() {
    let a = Admin::new();
    a.json("PUT", "/apisix/admin/routes/124", json!({"uri": "/adm-c24", "upstream_id": "998"}))
        .await
        .expect(400, json!({"error_msg": "failed to fetch upstream info by upstream id [998], response code: 404"}));
    a.call("GET", "/apisix/admin/routes/124", None)
        .await
        .expect(404, json!({"message": "Key not found"}));
    a.json("PUT", "/apisix/admin/routes/125", json!({"uri": "/adm-c25", "service_id": "997"}))
        .await
        .expect(400, json!({"error_msg": "failed to fetch service info by service id [997], response code: 404"}));
    a.json("PUT", "/apisix/admin/services/125", json!({"upstream_id": "998"}))
        .await
        .expect(400, json!({"error_msg": "failed to fetch upstream info by upstream id [998], response code: 404"}));
    a.call("GET", "/apisix/admin/services/125", None)
        .await
        .expect(404, json!({"message": "Key not found"}));
    a.json("PUT", "/apisix/admin/routes/126", json!({"uri": "/x", "plugin_config_id": 5, "upstream": {"nodes": {}}}))
        .await
        .expect(400, json!({"error_msg": "failed to fetch plugin config info by plugin config id [5], response code: 404"}));
}

#[tokio::test]
async fn reference_delete_upstream_used_by_route() {
    let a = Admin::new();
    a.json(
        "PUT",
        "/apisix/admin/upstreams/126",
        json!({"type": "roundrobin", "nodes": {"127.0.0.1:8080": 1}}),
    )
    .await
    .expect(201, json!({}));
    a.json(
        "PUT",
        "/apisix/admin/routes/126",
        json!({"uri": "/adm-c26", "upstream_id": 126}),
    )
    .await
    .expect(201, json!({}));
    a.call("DELETE", "/apisix/admin/upstreams/126", None)
        .await
        .expect(
            400,
            json!({"error_msg": "can not delete this upstream, route [126] is still using it now"}),
        );
    a.call("GET", "/apisix/admin/upstreams/126", None)
        .await
        .expect(200, json!({"value": {"id": "126"}}));
    a.call("DELETE", "/apisix/admin/routes/126", None)
        .await
        .expect(200, json!({}));
    a.call("DELETE", "/apisix/admin/upstreams/126", None)
        .await
        .expect(200, json!({"deleted": "1", "key": "/apisix/upstreams/126"}));
}

#[tokio::test]
async fn reference_delete_service_used_by_route() {
    let a = Admin::new();
    a.json(
        "PUT",
        "/apisix/admin/services/127",
        json!({"upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:8080": 1}}}),
    )
    .await
    .expect(201, json!({}));
    a.json(
        "PUT",
        "/apisix/admin/routes/127",
        json!({"uri": "/adm-c27", "service_id": 127}),
    )
    .await
    .expect(201, json!({}));
    a.call("DELETE", "/apisix/admin/services/127", None)
        .await
        .expect(400, json!({"error_msg": "can not delete this service directly, route [127] is still using it now"}));
    a.call("DELETE", "/apisix/admin/routes/127", None)
        .await
        .expect(200, json!({}));
    a.call("DELETE", "/apisix/admin/services/127", None)
        .await
        .expect(200, json!({"deleted": "1", "key": "/apisix/services/127"}));
}

#[tokio::test]
async fn dataplane_route_created_then_deleted() {
    let a = Admin::new();
    a.json("PUT", "/apisix/admin/routes/128", route("/adm-c28"))
        .await
        .expect(201, json!({}));
    assert_eq!(
        published(&a, ResourceKind::Routes, "128").unwrap()["uri"],
        "/adm-c28"
    );
    a.call("DELETE", "/apisix/admin/routes/128", None)
        .await
        .expect(200, json!({}));
    assert!(published(&a, ResourceKind::Routes, "128").is_none());
}

#[tokio::test]
async fn dataplane_route_status_toggle() {
    let a = Admin::new();
    a.json("PUT", "/apisix/admin/routes/130", route("/adm-c30"))
        .await;
    a.json("PATCH", "/apisix/admin/routes/130", json!({"status": 0}))
        .await
        .expect(200, json!({"value": {"status": 0}}));
    assert_eq!(
        published(&a, ResourceKind::Routes, "130").unwrap()["status"],
        0
    );
    a.call("PATCH", "/apisix/admin/routes/130/status", Some("1"))
        .await
        .expect(200, json!({"value": {"status": 1}}));
    assert_eq!(
        published(&a, ResourceKind::Routes, "130").unwrap()["status"],
        1
    );
}

#[tokio::test]
async fn dataplane_route_upstream_id_and_service_id() {
    let a = Admin::new();
    a.json(
        "PUT",
        "/apisix/admin/upstreams/129",
        json!({"type": "roundrobin", "nodes": {"127.0.0.1:1981": 1}}),
    )
    .await
    .expect(201, json!({}));
    a.json(
        "PUT",
        "/apisix/admin/services/129",
        json!({"upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1982": 1}}}),
    )
    .await
    .expect(201, json!({}));
    a.json(
        "PUT",
        "/apisix/admin/routes/129",
        json!({"uri": "/adm-c29/*", "upstream_id": "129"}),
    )
    .await
    .expect(201, json!({}));
    a.json(
        "PUT",
        "/apisix/admin/routes/229",
        json!({"uri": "/adm-c29s", "service_id": "129"}),
    )
    .await
    .expect(201, json!({}));
    for id in ["129", "229"] {
        assert!(published(&a, ResourceKind::Routes, id).is_some());
    }
    for path in ["routes/229", "routes/129", "services/129", "upstreams/129"] {
        a.call("DELETE", &format!("/apisix/admin/{path}"), None)
            .await
            .expect(200, json!({"deleted": "1"}));
    }
}
