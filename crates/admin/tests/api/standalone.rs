//! API-driven standalone mode (`/apisix/admin/configs`) through `AdminApi::handle`, on the
//! standalone store: the answers the public cases do not pin down.

use std::sync::Arc;

use ferrisix_admin::AdminApi;
use ferrisix_config::store::memory::MemoryStore;
use ferrisix_config::store::standalone_api::StandaloneApiStore;
use ferrisix_config::store::Store;
use ferrisix_plugins::PluginRegistry;
use serde_json::{json, Value};

use crate::support::{body, local, options, req, Admin, Resp, KEY};

const CONFIGS: &str = "/apisix/admin/configs";

/// An Admin API in standalone mode. Its `store` field (a memory store) is not written: the
/// API writes only to the returned standalone store.
fn standalone() -> (Admin, Arc<StandaloneApiStore>) {
    let store = StandaloneApiStore::new("/apisix");
    let api = AdminApi::new(
        options(),
        store.clone() as Arc<dyn Store>,
        PluginRegistry::builtin(),
    )
    .with_standalone(store.clone());
    let admin = Admin {
        api: Arc::new(api),
        store: Arc::new(MemoryStore::new("/apisix")),
    };
    (admin, store)
}

async fn put(a: &Admin, digest: &str, doc: &Value) -> Resp {
    let r = req("PUT", CONFIGS)
        .header("X-API-KEY", KEY)
        .header("X-Digest", digest)
        .body(body(&doc.to_string()))
        .unwrap();
    a.send(r, local()).await
}

fn route(id: &str) -> Value {
    json!({"id": id, "uri": format!("/{id}"), "upstream": {"nodes": {"127.0.0.1:1980": 1}}})
}

#[tokio::test]
async fn before_the_first_put_every_version_is_zero() {
    let (a, _) = standalone();
    let got = a.call("GET", CONFIGS, None).await;
    assert_eq!(got.status, 200);
    assert!(got.header("X-Digest").is_none());
    let doc = got.json();
    for t in [
        "routes",
        "services",
        "upstreams",
        "consumers",
        "consumer_groups",
        "ssls",
        "global_rules",
        "plugin_configs",
        "plugin_metadata",
        "stream_routes",
        "protos",
        "secrets",
        "plugins",
    ] {
        assert_eq!(doc[format!("{t}_conf_version")], 0, "{t}");
    }
    let head = a.call("HEAD", CONFIGS, None).await;
    assert_eq!(head.status, 200);
    assert!(head.header("X-Last-Modified").is_none());
}

#[tokio::test]
async fn the_digest_is_compared_before_the_body_is_checked() {
    let (a, _) = standalone();
    assert_eq!(
        put(&a, "d1", &json!({"routes": [route("r1")]}))
            .await
            .status,
        202
    );
    let again = put(&a, "d1", &json!({"routes": [{"uri": 1}]})).await;
    assert_eq!(again.status, 204);
    assert!(again.body.is_empty());
}

#[tokio::test]
async fn yaml_in_and_out() {
    let (a, store) = standalone();
    let r = req("PUT", CONFIGS)
        .header("X-API-KEY", KEY)
        .header("X-Digest", "y1")
        .header("Content-Type", "application/yaml")
        .body(body(
            "routes:\n  - id: r1\n    uri: /r1\n    upstream:\n      nodes:\n        \"127.0.0.1:1980\": 1\n",
        ))
        .unwrap();
    assert_eq!(a.send(r, local()).await.status, 202);
    assert_eq!(store.digest().as_deref(), Some("y1"));
    let r = req("GET", CONFIGS)
        .header("X-API-KEY", KEY)
        .header("Accept", "application/yaml")
        .body(body(""))
        .unwrap();
    let got = a.send(r, local()).await;
    assert_eq!(got.header("Content-Type"), Some("application/yaml"));
    assert!(got.text().contains("id: r1"), "{}", got.text());
    let bad = req("PUT", CONFIGS)
        .header("X-API-KEY", KEY)
        .header("X-Digest", "y2")
        .header("Content-Type", "application/yaml")
        .body(body("routes: [unclosed"))
        .unwrap();
    a.send(bad, local()).await.expect(
        400,
        json!({"error_msg": "invalid request body: invalid yaml request body"}),
    );
}

#[tokio::test]
async fn modified_index_is_this_modes_field() {
    let (a, _) = standalone();
    let mut r = route("r1");
    r["modifiedIndex"] = json!(7);
    assert_eq!(
        put(&a, "m1", &json!({"routes": [r.clone()]})).await.status,
        202
    );
    r["modifiedIndex"] = json!("7");
    put(&a, "m2", &json!({"routes": [r]})).await.expect(
        400,
        json!({"error_msg": "invalid configuration: property \"modifiedIndex\" validation failed: wrong type: expected integer, got string"}),
    );
}

#[tokio::test]
async fn duplicates_and_collected_errors() {
    let (a, store) = standalone();
    let consumers = json!({"consumers": [
        {"username": "u"},
        {"id": "u/credentials/c1", "plugins": {"key-auth": {"key": "k1"}}},
        {"id": "u/credentials/c1", "plugins": {"key-auth": {"key": "k2"}}},
    ]});
    put(&a, "c1", &consumers).await.expect(
        400,
        json!({"error_msg": "found duplicate credential id u/credentials/c1 in consumers"}),
    );
    assert_eq!(store.digest(), None, "nothing applied");
    let r = a
        .json(
            "POST",
            "/apisix/admin/configs/validate",
            json!({"routes": [{"id": "a", "uri": 1}], "secrets": [{"id": "nomanager"}]}),
        )
        .await;
    let errors = r.json()["errors"].clone();
    assert_eq!(r.status, 400);
    assert_eq!(errors.as_array().map(Vec::len), Some(2), "{errors}");
    assert!(errors
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["error"] == "invalid secret id: nomanager"));
}

#[tokio::test]
async fn other_bodies_and_paths() {
    let (a, _) = standalone();
    put(&a, "n1", &json!(12)).await.expect(
        400,
        json!({"error_msg": "invalid request body: the configuration must be an object, got number"}),
    );
    // A JSON list holds no resource type: an empty configuration.
    assert_eq!(put(&a, "n2", &json!([])).await.status, 202);
    let post = a.json("POST", CONFIGS, json!({})).await;
    assert_eq!(post.status, 404);
    assert_eq!(post.header("Content-Type"), Some("text/html"));
    assert_eq!(
        a.call("GET", "/apisix/admin/routes", None).await.status,
        404
    );
    assert_eq!(a.call("HEAD", "/apisix/admin", None).await.status, 200);
}
