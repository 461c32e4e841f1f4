//! Spec §4-§5: envelopes, PUT, POST, PATCH, DELETE and `ttl`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use ferrisix_admin::AdminApi;
use ferrisix_config::state::ConfigState;
use ferrisix_config::store::memory::MemoryStore;
use ferrisix_config::store::{KeyValue, PutOutcome, Store, StoreError, StoreHealth};
use ferrisix_plugins::PluginRegistry;
use http_body_util::{BodyExt, Full};
use serde_json::json;
use tokio::sync::watch;

use crate::support::*;

#[tokio::test]
async fn put_id_rules() {
    let a = Admin::new();
    // No id anywhere.
    a.json("PUT", "/apisix/admin/routes", route("/a"))
        .await
        .expect(400, json!({"error_msg": "missing route id"}));
    a.json("PUT", "/apisix/admin/upstreams", json!({"nodes": {}}))
        .await
        .expect(400, json!({"error_msg": "missing upstream id"}));
    a.json("PUT", "/apisix/admin/services", json!({}))
        .await
        .expect(400, json!({"error_msg": "missing service id"}));
    // An id only in the body keeps its JSON type and names the key.
    let mut body = route("/a");
    body["id"] = json!(1);
    a.json("PUT", "/apisix/admin/routes", body)
        .await
        .expect(201, json!({"key": "/apisix/routes/1", "value": {"id": 1}}));
    // `1` and `"1"` are the same id; the path id wins the type.
    let mut body = route("/a");
    body["id"] = json!(1);
    a.json("PUT", "/apisix/admin/routes/1", body)
        .await
        .expect(200, json!({"value": {"id": "1"}}));
    // Bad ids fail the schema.
    a.json("PUT", "/apisix/admin/routes/a%20b", route("/a")).await.expect(
        400,
        json!({"error_msg": "invalid configuration: property \"id\" validation failed: object matches none of the required"}),
    );
    // Empty body.
    a.call("PUT", "/apisix/admin/routes/1", None)
        .await
        .expect(400, json!({"error_msg": "missing configurations"}));
    a.call("POST", "/apisix/admin/routes", None)
        .await
        .expect(400, json!({"error_msg": "missing configurations"}));
}

#[tokio::test]
async fn bookkeeping_fields() {
    let a = Admin::new();
    let mut body = route("/a");
    body["create_time"] = json!(1);
    a.json("PUT", "/apisix/admin/routes/1", body.clone())
        .await
        .expect(
            400,
            json!({"error_msg": "the property is forbidden:  create_time"}),
        );
    a.json("POST", "/apisix/admin/routes", body).await.expect(
        400,
        json!({"error_msg": "the property is forbidden:  create_time"}),
    );
    let mut body = route("/a");
    body["upstream"]["update_time"] = json!(1);
    a.json("PUT", "/apisix/admin/routes/1", body).await.expect(
        400,
        json!({"error_msg": "the property is forbidden:  upstream.update_time"}),
    );
    let mut body = route("/a");
    body["plugins"] = json!({"update_time": {}});
    a.json("PUT", "/apisix/admin/routes/1", body).await.expect(
        400,
        json!({"error_msg": "the property is forbidden:  plugins.update_time"}),
    );

    // create_time is kept across PUTs, update_time refreshed.
    let first = a
        .json("PUT", "/apisix/admin/routes/1", route("/a"))
        .await
        .json();
    let created = first["value"]["create_time"].as_i64().unwrap();
    a.store
        .put(
            "/apisix/routes/1",
            serde_json::to_vec(
                &json!({"uri": "/a", "id": "1", "create_time": 7, "update_time": 7,
                "upstream": {"nodes": {"127.0.0.1:1": 1}}}),
            )
            .unwrap(),
            None,
        )
        .await
        .unwrap();
    let second = a
        .json("PUT", "/apisix/admin/routes/1", route("/b"))
        .await
        .json();
    assert_eq!(second["value"]["create_time"], 7);
    assert!(second["value"]["update_time"].as_i64().unwrap() >= created);
    // A value read back and PUT unchanged is refused (APISIX 3.7+).
    let echoed = a.call("GET", "/apisix/admin/routes/1", None).await.json()["value"].clone();
    a.json("PUT", "/apisix/admin/routes/1", echoed)
        .await
        .expect(
            400,
            json!({"error_msg": "the property is forbidden:  create_time"}),
        );
}

#[tokio::test]
async fn values_are_stored_as_sent() {
    let a = Admin::new();
    let body = json!({"uri": "/a", "desc": "x/y", "upstream": {"nodes": {"127.0.0.1:8080": 1}}});
    let r = a.json("PUT", "/apisix/admin/routes/1", body).await;
    // Key order kept; id and the times appended; `/` not escaped.
    assert!(r.text().starts_with("{\"key\":\"/apisix/routes/1\",\"value\":{\"uri\":\"/a\",\"desc\":\"x/y\",\"upstream\":{\"nodes\":{\"127.0.0.1:8080\":1}},\"id\":\"1\",\"create_time\":"), "{}", r.text());
    assert!(r.text().ends_with("}}\n"));
    let stored = a.stored("/apisix/routes/1").await.unwrap();
    let keys: Vec<_> = stored.as_object().unwrap().keys().cloned().collect();
    assert_eq!(
        keys,
        [
            "uri",
            "desc",
            "upstream",
            "id",
            "create_time",
            "update_time"
        ]
    );
    assert!(
        stored["upstream"].get("type").is_none(),
        "no defaults written"
    );
    // Empty arrays print as `{}` (Lua tables), as APISIX answers them.
    let r = a
        .json("PUT", "/apisix/admin/upstreams/1", json!({"nodes": []}))
        .await;
    r.expect(201, json!({"value": {"nodes": {}}}));
}

#[tokio::test]
async fn post_ids_and_not_supported() {
    let a = Admin::new();
    let r = a
        .json(
            "POST",
            "/apisix/admin/upstreams",
            json!({"nodes": {"127.0.0.1:1": 1}}),
        )
        .await;
    r.expect(201, json!({}));
    let id = r.json()["value"]["id"].as_str().unwrap().to_string();
    let rev_of_gen = a
        .store
        .get("/apisix/gen_id")
        .await
        .unwrap()
        .unwrap()
        .mod_revision;
    assert_eq!(id, format!("{rev_of_gen:020}"));
    let r = a.json("POST", "/apisix/admin/services", json!({})).await;
    r.expect(201, json!({}));
    for (res, kind) in [
        ("consumers", "consumer"),
        ("global_rules", "global rule"),
        ("plugin_configs", "plugin config"),
        ("plugin_metadata", "plugin_metadata"),
        ("consumer_groups", "consumer group"),
        ("secrets", "secret"),
        ("consumers/jack/credentials", "credential"),
    ] {
        let r = a
            .json("POST", &format!("/apisix/admin/{res}"), json!({}))
            .await;
        r.expect(
            405,
            json!({"error_msg": format!("not supported `POST` method for {kind}")}),
        );
        assert_eq!(r.header("x-api-version"), Some("v3"));
    }
    for (res, kind) in [
        ("consumers/jack", "consumer"),
        ("plugin_metadata/prometheus", "plugin_metadata"),
        ("protos/1", "proto"),
        ("consumers/jack/credentials/c", "credential"),
    ] {
        a.json("PATCH", &format!("/apisix/admin/{res}"), json!({}))
            .await
            .expect(
                405,
                json!({"error_msg": format!("not supported `PATCH` method for {kind}")}),
            );
    }
}

#[tokio::test]
async fn patch_rules() {
    let a = Admin::new();
    a.json("PATCH", "/apisix/admin/routes", json!({"desc": "x"}))
        .await
        .expect(400, json!({"error_msg": "missing route id"}));
    a.call("PATCH", "/apisix/admin/routes/1", None)
        .await
        .expect(400, json!({"error_msg": "missing new configuration"}));
    a.call("PATCH", "/apisix/admin/routes/1", Some("\"x\""))
        .await
        .expect(400, json!({"error_msg": "invalid configuration"}));
    a.call("PATCH", "/apisix/admin/routes/1", Some("null"))
        .await
        .expect(400, json!({"error_msg": "invalid configuration"}));
    a.json("PATCH", "/apisix/admin/routes/1", json!({"desc": "x"}))
        .await
        .expect(404, json!({"message": "Key not found"}));

    let mut body = route("/a");
    body["plugins"] = json!({"prometheus": {}});
    body["hosts"] = json!(["a.com", "b.com"]);
    a.json("PUT", "/apisix/admin/routes/1", body).await;
    let before = a.stored("/apisix/routes/1").await.unwrap();
    // `{}` clears an object (Lua's empty table is an array); arrays replace.
    let r = a
        .json(
            "PATCH",
            "/apisix/admin/routes/1",
            json!({"plugins": {}, "hosts": ["c.com"]}),
        )
        .await;
    r.expect(
        200,
        json!({"value": {"plugins": {}, "hosts": ["c.com"], "create_time": before["create_time"]}}),
    );
    // The merged result is fully re-validated; a refused PATCH changes nothing.
    a.json("PATCH", "/apisix/admin/routes/1", json!({"uri": 1}))
        .await
        .expect(400, json!({"error_msg": "invalid configuration: property \"uri\" validation failed: wrong type: expected string, got number"}));
    a.json("PATCH", "/apisix/admin/routes/1", json!({"id": "2"}))
        .await
        .expect(400, json!({"error_msg": "wrong route id"}));
    assert_eq!(a.stored("/apisix/routes/1").await.unwrap()["uri"], "/a");
    // A PATCH may set the times; update_time is otherwise refreshed.
    a.json(
        "PATCH",
        "/apisix/admin/routes/1",
        json!({"update_time": 5, "create_time": 3}),
    )
    .await
    .expect(200, json!({"value": {"update_time": 5, "create_time": 3}}));
    let r = a
        .json("PATCH", "/apisix/admin/routes/1", json!({"desc": "d"}))
        .await;
    assert!(r.json()["value"]["update_time"].as_i64().unwrap() > 5);
    assert_eq!(r.json()["value"]["create_time"], 3);
    // Sub-path PATCH always refreshes update_time and creates missing objects.
    a.json("PATCH", "/apisix/admin/routes/1/update_time", json!(9))
        .await;
    let r = a
        .json("PATCH", "/apisix/admin/routes/1/labels/env", json!("prod"))
        .await;
    r.expect(200, json!({"value": {"labels": {"env": "prod"}}}));
    assert!(r.json()["value"]["update_time"].as_i64().unwrap() > 9);
    let r = a
        .json("PATCH", "/apisix/admin/routes/1/uri/x", json!(1))
        .await;
    assert_eq!(r.status, 400);
    assert!(r.error_msg().starts_with("invalid sub-path: /"));
    // A sub-path value is validated too.
    a.json("PATCH", "/apisix/admin/routes/1/methods", json!(["NOPE"]))
        .await
        .expect(400, json!({"error_msg": "invalid configuration: property \"methods\" validation failed: failed to validate item 1: matches none of the enum values"}));
}

/// A store whose compare-and-swap always loses, as if another writer got there first.
struct Racing(MemoryStore);

#[async_trait]
impl Store for Racing {
    fn prefix(&self) -> &str {
        self.0.prefix()
    }
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        self.0.get(key).await
    }
    async fn list(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64), StoreError> {
        self.0.list(prefix).await
    }
    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> Result<PutOutcome, StoreError> {
        self.0.put(key, value, ttl).await
    }
    async fn put_if_unmodified(
        &self,
        key: &str,
        _: Vec<u8>,
        _: i64,
        _: Option<Duration>,
    ) -> Result<PutOutcome, StoreError> {
        // Someone else writes between our read and our swap.
        self.0
            .put(key, b"{\"uri\":\"/other\"}".to_vec(), None)
            .await?;
        Err(StoreError::Conflict)
    }
    async fn delete(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        self.0.delete(key).await
    }
    async fn delete_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        self.0.delete_prefix(prefix).await
    }
    fn subscribe(&self) -> watch::Receiver<Arc<ConfigState>> {
        self.0.subscribe()
    }
    fn health(&self) -> StoreHealth {
        self.0.health()
    }
}

#[tokio::test]
async fn patch_conflict_is_503() {
    let store = Arc::new(Racing(MemoryStore::new("/apisix")));
    let api = AdminApi::new(options(), store.clone(), PluginRegistry::builtin());
    store
        .0
        .put(
            "/apisix/routes/1",
            serde_json::to_vec(&route("/a")).unwrap(),
            None,
        )
        .await
        .unwrap();
    let req = req("PATCH", "/apisix/admin/routes/1")
        .header("X-API-KEY", KEY)
        .body(Full::new(Bytes::from("{\"desc\":\"x\"}")))
        .unwrap();
    let resp = api.handle(req, local()).await;
    assert_eq!(resp.status(), 503);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        &body[..],
        b"{\"error_msg\":\"value changed before overwritten\"}\n"
    );
}

#[tokio::test]
async fn delete_rules() {
    let a = Admin::new();
    a.call("DELETE", "/apisix/admin/routes", None)
        .await
        .expect(400, json!({"error_msg": "missing route id"}));
    a.call("DELETE", "/apisix/admin/upstreams/", None)
        .await
        .expect(400, json!({"error_msg": "missing upstream id"}));
    a.call("DELETE", "/apisix/admin/routes/9", None)
        .await
        .expect(404, json!({"message": "Key not found"}));
}

#[tokio::test]
async fn ttl_attaches_a_lease() {
    let a = Admin::new();
    a.json("PUT", "/apisix/admin/routes/1?ttl=0.05", route("/a"))
        .await
        .expect(201, json!({}));
    a.call("GET", "/apisix/admin/routes/1", None)
        .await
        .expect(200, json!({}));
    let r = a
        .json("POST", "/apisix/admin/routes?ttl=0.05", route("/b"))
        .await;
    let key = r.json()["key"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(120)).await;
    a.call("GET", "/apisix/admin/routes/1", None)
        .await
        .expect(404, json!({"message": "Key not found"}));
    assert!(a.store.get(&key).await.unwrap().is_none());
    // Without ttl the key stays.
    a.json("PUT", "/apisix/admin/routes/2", route("/a")).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    a.call("GET", "/apisix/admin/routes/2", None)
        .await
        .expect(200, json!({}));
}
