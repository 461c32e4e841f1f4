//! Spec §3: the resources other than routes, and the delete reference checks of §5.4.

use ferrisix_admin::AdminOptions;
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn upstream_delete_checks() {
    let a = Admin::new();
    a.json(
        "PUT",
        "/apisix/admin/upstreams/1",
        json!({"nodes": {"127.0.0.1:1": 1}}),
    )
    .await
    .expect(201, json!({}));
    a.json(
        "PUT",
        "/apisix/admin/services/5",
        json!({"upstream_id": "1"}),
    )
    .await
    .expect(201, json!({}));
    a.call("DELETE", "/apisix/admin/upstreams/1", None)
        .await
        .expect(
            400,
            json!({"error_msg": "can not delete this upstream, service [5] is still using it now"}),
        );
    // Any force value other than `true` still checks.
    a.call("DELETE", "/apisix/admin/upstreams/1?force=anyvalue", None)
        .await
        .expect(400, json!({}));
    a.call("DELETE", "/apisix/admin/services/5", None)
        .await
        .expect(200, json!({}));

    // traffic-split rules are looked at in plugin sets too (the plugin need not be enabled for
    // the check: it is stored under a key written directly).
    use ferrisix_config::store::Store;
    a.store
        .put(
            "/apisix/plugin_configs/7",
            serde_json::to_vec(&json!({"id": "7", "plugins": {"traffic-split": {"rules": [
                {"weighted_upstreams": [{"upstream_id": 1, "weight": 1}]}
            ]}}}))
            .unwrap(),
            None,
        )
        .await
        .unwrap();
    a.call("DELETE", "/apisix/admin/upstreams/1", None)
        .await
        .expect(400, json!({"error_msg": "can not delete this upstream, plugin in plugin_config [7] is still using it now"}));
    a.call("DELETE", "/apisix/admin/upstreams/1?force=true", None)
        .await
        .expect(200, json!({"deleted": "1", "key": "/apisix/upstreams/1"}));
}

#[tokio::test]
async fn plugin_config_delete_check_and_reference() {
    let a = Admin::new();
    a.json(
        "POST",
        "/apisix/admin/plugin_configs",
        json!({"plugins": {}}),
    )
    .await
    .expect(
        405,
        json!({"error_msg": "not supported `POST` method for plugin config"}),
    );
    a.json(
        "PUT",
        "/apisix/admin/plugin_configs/1",
        json!({"plugins": {"prometheus": {}}}),
    )
    .await
    .expect(201, json!({"value": {"id": "1"}}));
    a.json(
        "PUT",
        "/apisix/admin/routes/1",
        json!({"uri": "/a", "plugin_config_id": "1", "upstream": {"nodes": {"127.0.0.1:1": 1}}}),
    )
    .await
    .expect(201, json!({}));
    a.call("DELETE", "/apisix/admin/plugin_configs/1", None)
        .await
        .expect(400, json!({"error_msg": "can not delete this plugin config, route [1] is still using it now"}));
    a.call("DELETE", "/apisix/admin/plugin_configs/1?force=true", None)
        .await
        .expect(200, json!({}));
}

#[tokio::test]
async fn consumers_and_credentials() {
    let a = Admin::new();
    // The username is the id; PUT without a path id takes it from the body.
    let r = a
        .json(
            "PUT",
            "/apisix/admin/consumers",
            json!({"username": "jack", "desc": "d"}),
        )
        .await;
    r.expect(
        201,
        json!({"key": "/apisix/consumers/jack", "value": {"username": "jack", "desc": "d"}}),
    )
    .absent("value.id");
    a.json(
        "PUT",
        "/apisix/admin/consumers/rose",
        json!({"username": "jack"}),
    )
    .await
    .expect(400, json!({"error_msg": "wrong username"}));
    a.json("PUT", "/apisix/admin/consumers/jack", json!({"desc": "x"}))
        .await
        .expect(
            400,
            json!({"error_msg": "invalid configuration: property \"username\" is required"}),
        );
    a.json(
        "PUT",
        "/apisix/admin/consumers/jack",
        json!({"username": "jack", "plugins": {"nope": {}}}),
    )
    .await
    .expect(
        400,
        json!({"error_msg": "invalid plugins configuration: unknown plugin [nope]"}),
    );
    a.json("PUT", "/apisix/admin/consumers/jack", json!({"username": "jack", "group_id": "g"}))
        .await
        .expect(400, json!({"error_msg": "failed to fetch consumer group info by consumer group id [g], response code: 404"}));

    // Credentials.
    a.json(
        "PUT",
        "/apisix/admin/consumers/nobody/credentials/c1",
        json!({}),
    )
    .await
    .expect(404, json!({"error_msg": "consumer not found"}));
    a.json(
        "PUT",
        "/apisix/admin/consumers/jack/credentials",
        json!({"desc": "x"}),
    )
    .await
    .expect(400, json!({"error_msg": "missing credential id"}));
    a.json(
        "PUT",
        "/apisix/admin/consumers/jack/credentials/c1",
        json!({"plugins": {"prometheus": {}}}),
    )
    .await
    .expect(
        400,
        json!({"error_msg": "only supports auth type plugins in consumer credential"}),
    );
    a.call("GET", "/apisix/admin/consumers/jack/credentials", None)
        .await
        .expect(404, json!({"message": "Key not found"}));
    a.json("PUT", "/apisix/admin/consumers/jack/credentials/c1", json!({"desc": "first"}))
        .await
        .expect(201, json!({"key": "/apisix/consumers/jack/credentials/c1", "value": {"id": "c1", "desc": "first"}}));
    a.json(
        "PUT",
        "/apisix/admin/consumers/jack/credentials",
        json!({"id": "c2"}),
    )
    .await
    .expect(201, json!({"key": "/apisix/consumers/jack/credentials/c2"}));
    a.call("GET", "/apisix/admin/consumers/jack/credentials", None)
        .await
        .expect(
            200,
            json!({"total": 2, "list": [
                {"key": "/apisix/consumers/jack/credentials/c1"},
                {"key": "/apisix/consumers/jack/credentials/c2"}
            ]}),
        );
    a.call("GET", "/apisix/admin/consumers/jack/credentials/c1", None)
        .await
        .expect(200, json!({"value": {"desc": "first"}}));
    // The consumer list does not show credentials.
    a.call("GET", "/apisix/admin/consumers", None).await.expect(
        200,
        json!({"total": 1, "list": [{"key": "/apisix/consumers/jack"}]}),
    );
    a.call("GET", "/apisix/admin/consumers/jack", None)
        .await
        .expect(200, json!({"value": {"username": "jack"}}));
    a.call(
        "DELETE",
        "/apisix/admin/consumers/jack/credentials/c2",
        None,
    )
    .await
    .expect(
        200,
        json!({"deleted": "1", "key": "/apisix/consumers/jack/credentials/c2"}),
    );
    // Deleting the consumer deletes its credentials.
    a.call("DELETE", "/apisix/admin/consumers/jack", None)
        .await
        .expect(200, json!({"key": "/apisix/consumers/jack"}));
    a.call("GET", "/apisix/admin/consumers/jack/credentials/c1", None)
        .await
        .expect(404, json!({"message": "Key not found"}));
}

#[tokio::test]
async fn global_rules() {
    let a = Admin::new();
    a.json(
        "PUT",
        "/apisix/admin/global_rules/1",
        json!({"plugins": {"prometheus": {}}}),
    )
    .await
    .expect(201, json!({"value": {"id": "1"}}));
    a.json(
        "PUT",
        "/apisix/admin/global_rules/1",
        json!({"plugins": {"prometheus": {}}}),
    )
    .await
    .expect(200, json!({}));
    a.json(
        "PUT",
        "/apisix/admin/global_rules/2",
        json!({"plugins": {"prometheus": {}}}),
    )
    .await
    .expect(
        400,
        json!({"error_msg": "plugin 'prometheus' already exists in global rule with id '1'"}),
    );
    a.json("PUT", "/apisix/admin/global_rules/2", json!({}))
        .await
        .expect(
            400,
            json!({"error_msg": "invalid configuration: property \"plugins\" is required"}),
        );
    a.json(
        "PATCH",
        "/apisix/admin/global_rules/1",
        json!({"plugins": {"prometheus": {"prefer_name": true}}}),
    )
    .await
    .expect(
        200,
        json!({"value": {"plugins": {"prometheus": {"prefer_name": true}}}}),
    );
}

#[tokio::test]
async fn plugin_metadata() {
    let a = Admin::new();
    a.json("PUT", "/apisix/admin/plugin_metadata/no-such", json!({}))
        .await
        .expect(400, json!({"error_msg": "invalid plugin name"}));
    a.json("PUT", "/apisix/admin/plugin_metadata", json!({}))
        .await
        .expect(400, json!({"error_msg": "missing plugin name"}));
    let r = a
        .json(
            "PUT",
            "/apisix/admin/plugin_metadata/prometheus",
            json!({"a": 1}),
        )
        .await;
    r.expect(
        201,
        json!({"key": "/apisix/plugin_metadata/prometheus", "value": {"a": 1, "id": "prometheus"}}),
    )
    .absent("value.create_time")
    .absent("value.update_time");
    a.json(
        "PUT",
        "/apisix/admin/plugin_metadata/prometheus",
        json!({"create_time": 1}),
    )
    .await
    .expect(
        400,
        json!({"error_msg": "the property is forbidden:  create_time"}),
    );
    a.call("DELETE", "/apisix/admin/plugin_metadata/prometheus", None)
        .await
        .expect(200, json!({}));
}

#[tokio::test]
async fn ssls_hide_private_keys() {
    let a = Admin::new();
    let cert = include_str!("../../../../tests/data/tls/server.crt");
    let key = include_str!("../../../../tests/data/tls/server.key");
    let ssl = json!({"cert": cert, "key": key, "snis": ["a.com"]});
    let r = a.json("PUT", "/apisix/admin/ssls/1", ssl).await;
    assert!([200, 201].contains(&r.status), "{}", r.text());
    a.call("GET", "/apisix/admin/ssls/1", None)
        .await
        .expect(200, json!({"value": {"snis": ["a.com"]}}))
        .absent("value.key");
    let r = a.call("GET", "/apisix/admin/ssls", None).await;
    assert!(r.json()["list"][0]["value"].get("key").is_none());
    // Stored encrypted with the default keyring, as APISIX stores it; PUT answers with the
    // stored value.
    let r = a
        .json(
            "PUT",
            "/apisix/admin/ssls/1",
            json!({"cert": cert, "key": key, "snis": ["a.com"]}),
        )
        .await;
    let stored = r.json()["value"]["key"].as_str().unwrap().to_owned();
    assert!(!stored.starts_with("---"));
    assert_eq!(
        ferrisix_config::encrypt::Keyring::apisix_default()
            .decrypt_pkey(&stored)
            .unwrap(),
        key
    );
    // A PATCH that does not touch the key leaves the ciphertext as it is.
    let r = a
        .json("PATCH", "/apisix/admin/ssls/1", json!({"status": 0}))
        .await;
    assert_eq!(r.json()["value"]["key"], stored.as_str());
}

/// ocsp-stapling adds `ocsp_stapling` to the ssl schema (`enabled`, `skip_verify`, `cache_ttl`
/// of 60 or more): with the plugin enabled it is checked; without it the schema has no such
/// field, as APISIX answers (`t/plugin/ocsp-stapling.t`).
#[tokio::test]
async fn ssls_take_ocsp_stapling_only_with_the_plugin() {
    use std::sync::Arc;
    let cert = include_str!("../../../../tests/data/tls/server.crt");
    let key = include_str!("../../../../tests/data/tls/server.key");
    let ssl = |ocsp: serde_json::Value| json!({"cert": cert, "key": key, "snis": ["a.com"], "ocsp_stapling": ocsp});
    let a = Admin::new();
    let r = a
        .json("PUT", "/apisix/admin/ssls/1", ssl(json!({"enabled": true})))
        .await;
    assert!([200, 201].contains(&r.status), "{}", r.text());
    let r = a
        .json(
            "PUT",
            "/apisix/admin/ssls/1",
            ssl(json!({"enabled": true, "cache_ttl": 59})),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error_msg"],
        "invalid configuration: property \"ocsp_stapling\" validation failed: property \"cache_ttl\" validation failed: expected 59 to be at least 60"
    );
    let r = a
        .json(
            "PUT",
            "/apisix/admin/ssls/1",
            ssl(json!({"skip_verify": "yes"})),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());

    let store = Arc::new(ferrisix_config::store::memory::MemoryStore::new("/apisix"));
    let (without, _) = ferrisix_plugins::PluginRegistry::enabled(Some(&["prometheus".to_string()]));
    let a = Admin {
        api: Arc::new(ferrisix_admin::AdminApi::new(
            options(),
            store.clone(),
            without,
        )),
        store,
    };
    let r = a
        .json("PUT", "/apisix/admin/ssls/1", ssl(json!({"enabled": true})))
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error_msg"],
        "invalid configuration: additional properties forbidden, found ocsp_stapling"
    );
    let r = a
        .json(
            "PUT",
            "/apisix/admin/ssls/1",
            json!({"cert": cert, "key": key, "snis": ["a.com"]}),
        )
        .await;
    assert!([200, 201].contains(&r.status), "{}", r.text());
}

/// Issue 47, item 1: APISIX's `check_ssl_conf` and `check_upstream_conf` decrypt a key that
/// is not PEM with the keyring before parsing it (`aes_decrypt_pkey`), so a key that is neither
/// PEM nor the keyring's ciphertext is refused, and so is a client CA that is no certificate;
/// on `ssls` and in an upstream's `tls` alike (`t/node/client-mtls.t` TEST 3,
/// `t/node/upstream-mtls.t` TEST 4, `t/router/radixtree-sni2.t`).
#[tokio::test]
async fn ssl_and_upstream_tls_keys_and_ca_are_parsed() {
    let a = Admin::new();
    let cert = include_str!("../../../../tests/data/tls/server.crt");
    let key = include_str!("../../../../tests/data/tls/server.key");
    let keyring = ferrisix_config::encrypt::Keyring::apisix_default();
    let garbage = "AAA".repeat(128);
    let ssl = |key: &str| json!({"cert": cert, "key": key, "snis": ["a.com"]});
    let decrypt = json!({"error_msg": "failed to decrypt previous encrypted key"});
    let bad_key = json!({"error_msg": "failed to parse key: PEM_read_bio_PrivateKey() failed"});
    a.json("PUT", "/apisix/admin/ssls/1", ssl(&garbage))
        .await
        .expect(400, decrypt.clone());
    a.json(
        "PUT",
        "/apisix/admin/ssls/1",
        ssl(&keyring.encrypt(&"not a key ".repeat(8))),
    )
    .await
    .expect(400, bad_key.clone());
    let mut pairs = ssl(key);
    pairs["certs"] = json!([cert]);
    pairs["keys"] = json!([garbage]);
    a.json("PUT", "/apisix/admin/ssls/1", pairs)
        .await
        .expect(
            400,
            json!({"error_msg": "failed to handle cert-key pair[1]: failed to decrypt previous encrypted key"}),
        );
    let mut ca = ssl(key);
    ca["client"] = json!({"ca": "test.com".repeat(128)});
    a.json("PUT", "/apisix/admin/ssls/1", ca)
        .await
        .expect(
            400,
            json!({"error_msg": "failed to validate client_cert: failed to parse cert: PEM_read_bio_X509_AUX() failed"}),
        );
    // The keyring's ciphertext of a key is a key (an object copied from another node).
    a.json("PUT", "/apisix/admin/ssls/1", ssl(&keyring.encrypt(key)))
        .await
        .expect(201, json!({}));

    let upstream = |key: &str| {
        json!({"scheme": "https", "nodes": {"127.0.0.1:1983": 1},
            "tls": {"client_cert": cert, "client_key": key}})
    };
    a.json("PUT", "/apisix/admin/upstreams/1", upstream(&garbage))
        .await
        .expect(400, decrypt.clone());
    a.json(
        "PUT",
        "/apisix/admin/routes/1",
        json!({"uri": "/hello", "upstream": upstream(&garbage)}),
    )
    .await
    .expect(400, decrypt);
    a.json(
        "PUT",
        "/apisix/admin/upstreams/1",
        upstream(&keyring.encrypt(&"not a key ".repeat(8))),
    )
    .await
    .expect(400, bad_key);
    a.json("PUT", "/apisix/admin/upstreams/1", upstream(key))
        .await
        .expect(201, json!({}));
    // PATCH checks the stored ciphertext with the keyring too.
    a.json("PATCH", "/apisix/admin/upstreams/1", json!({"retries": 1}))
        .await
        .expect(200, json!({}));

    // Without a keyring the key is parsed as it is.
    let plain = Admin::with(|o| o.keyring = ferrisix_config::encrypt::Keyring::default());
    plain
        .json("PUT", "/apisix/admin/ssls/1", ssl(&garbage))
        .await
        .expect(
            400,
            json!({"error_msg": "failed to parse key: PEM_read_bio_PrivateKey() failed"}),
        );
}

#[tokio::test]
async fn consumer_groups_protos_secrets() {
    let a = Admin::new();
    a.json(
        "PUT",
        "/apisix/admin/consumer_groups/g",
        json!({"plugins": {"nope": {}}}),
    )
    .await
    .expect(400, json!({"error_msg": "unknown plugin [nope]"}));
    a.json(
        "PUT",
        "/apisix/admin/consumer_groups/g",
        json!({"plugins": {"prometheus": {}}}),
    )
    .await
    .expect(201, json!({"value": {"id": "g"}}));
    a.json(
        "PUT",
        "/apisix/admin/consumers/jack",
        json!({"username": "jack", "group_id": "g"}),
    )
    .await
    .expect(201, json!({}));
    a.call("DELETE", "/apisix/admin/consumer_groups/g", None)
        .await
        .expect(400, json!({"error_msg": "can not delete this consumer group, consumer [jack] is still using it now"}));

    a.json("PUT", "/apisix/admin/protos/1", json!({}))
        .await
        .expect(
            400,
            json!({"error_msg": "invalid configuration: property \"content\" is required"}),
        );
    a.json(
        "PUT",
        "/apisix/admin/protos/1",
        json!({"content": "syntax = \"proto3\";"}),
    )
    .await
    .expect(201, json!({"key": "/apisix/protos/1"}));

    a.json("PUT", "/apisix/admin/secrets/nope/1", json!({}))
        .await
        .expect(400, json!({"error_msg": "invalid secret manager: nope"}));
    a.json(
        "PUT",
        "/apisix/admin/secrets/vault/1",
        json!({"uri": "http://127.0.0.1:8200"}),
    )
    .await
    .expect(
        400,
        json!({"error_msg": "invalid configuration: property \"prefix\" is required"}),
    );
    a.json(
        "PUT",
        "/apisix/admin/secrets/vault/1",
        json!({"uri": "http://127.0.0.1:8200", "prefix": "kv/apisix", "token": "t"}),
    )
    .await
    .expect(
        201,
        json!({"key": "/apisix/secrets/vault/1", "value": {"id": "vault/1"}}),
    );
    a.json(
        "PATCH",
        "/apisix/admin/secrets/vault/1",
        json!({"token": "u"}),
    )
    .await
    .expect(200, json!({"value": {"token": "u", "id": "vault/1"}}));
    a.json("PATCH", "/apisix/admin/secrets/vault/1/token", json!("v"))
        .await
        .expect(200, json!({"value": {"token": "v"}}));
    a.call("GET", "/apisix/admin/secrets/vault/1", None)
        .await
        .expect(200, json!({"value": {"token": "v"}}));
    a.call("GET", "/apisix/admin/secrets", None)
        .await
        .expect(200, json!({"total": 1}));
    a.call("DELETE", "/apisix/admin/secrets/vault/1", None)
        .await
        .expect(200, json!({"key": "/apisix/secrets/vault/1"}));
}

#[tokio::test]
async fn stream_routes_need_stream_mode() {
    let a = Admin::new();
    for method in ["GET", "PUT", "DELETE"] {
        let r = a
            .json(method, "/apisix/admin/stream_routes/1", json!({}))
            .await;
        r.expect(
            400,
            json!({"error_msg": "stream mode is disabled, can not add stream routes"}),
        );
        assert_eq!(r.header("x-api-version"), None);
    }
    let s = Admin::with(|o: &mut AdminOptions| o.stream_mode = true);
    s.json("PUT", "/apisix/admin/stream_routes/1", json!({"server_port": 9100, "upstream_id": "9"}))
        .await
        .expect(400, json!({"error_msg": "failed to fetch upstream info by upstream id [9], response code: 404"}));
    s.json(
        "PUT",
        "/apisix/admin/stream_routes/1",
        json!({"server_port": 9100, "upstream": {"nodes": {"127.0.0.1:1": 1}}}),
    )
    .await
    .expect(201, json!({}));
    s.json("PATCH", "/apisix/admin/stream_routes/1", json!({}))
        .await
        .expect(
            405,
            json!({"error_msg": "not supported `PATCH` method for stream route"}),
        );
    // A service used by a stream route cannot go.
    s.json("PUT", "/apisix/admin/services/1", json!({}))
        .await
        .expect(201, json!({}));
    s.json(
        "PUT",
        "/apisix/admin/stream_routes/2",
        json!({"service_id": "1"}),
    )
    .await
    .expect(201, json!({}));
    s.call("DELETE", "/apisix/admin/services/1", None)
        .await
        .expect(400, json!({"error_msg": "can not delete this service directly, stream_route [2] is still using it now"}));
}

/// A stream route's `protocol`: a protocol `xrpc.protocols` does not enable is unknown, an
/// enabled one's `conf` is checked by its schema, and a subordinate route may name an
/// existing superior of the same protocol.
#[tokio::test]
async fn stream_route_protocols_follow_xrpc_protocols() {
    let up = json!({"nodes": {"127.0.0.1:6379": 1}});
    let none = Admin::with(|o: &mut AdminOptions| o.stream_mode = true);
    none.json(
        "PUT",
        "/apisix/admin/stream_routes/1",
        json!({"protocol": {"name": "redis"}, "upstream": up}),
    )
    .await
    .expect(400, json!({"error_msg": "unknown protocol [redis]"}));
    let redis = Admin::with(|o: &mut AdminOptions| {
        o.stream_mode = true;
        o.xrpc = ferrisix_config::xrpc::XrpcProtocols::new(&["redis".into(), "dubbo".into()]).0;
    });
    redis
        .json(
            "PUT",
            "/apisix/admin/stream_routes/1",
            json!({"protocol": {"name": "dubbo"}, "upstream": up}),
        )
        .await
        .expect(400, json!({"error_msg": "unknown protocol [dubbo]"}));
    let r = redis
        .json(
            "PUT",
            "/apisix/admin/stream_routes/1",
            json!({"protocol": {"name": "redis", "conf": {"faults": [{"commands": ["get"]}]}}, "upstream": up}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.json()["error_msg"].as_str().unwrap().contains("delay"),
        "{}",
        r.text()
    );
    redis
        .json(
            "PUT",
            "/apisix/admin/stream_routes/1",
            json!({"protocol": {"name": "redis", "conf": {"faults": [{"commands": ["get"], "key": "k", "delay": 0.1}]}, "metric": {"enable": true}}, "upstream": up}),
        )
        .await
        .expect(201, json!({}));
    redis
        .json(
            "PUT",
            "/apisix/admin/stream_routes/2",
            json!({"protocol": {"name": "redis", "superior_id": "1"}, "upstream": up}),
        )
        .await
        .expect(201, json!({}));
    redis
        .call("DELETE", "/apisix/admin/stream_routes/1", None)
        .await
        .expect(400, json!({"error_msg": "can not delete this stream route directly, stream route [2] is still using it as superior_id"}));
}

/// Issue 8, finding 10: `PUT /routes/a/b`. APISIX's router passes `b` as the sub path, which
/// only PATCH (and secrets) read: the PUT writes route `a`, as here. Kept on purpose.
#[tokio::test]
async fn put_with_extra_segments_writes_the_first_id_as_apisix() {
    let a = Admin::new();
    a.call(
        "PUT",
        "/apisix/admin/routes/a/b",
        Some(&route("/ab").to_string()),
    )
    .await
    .expect(201, json!({"key": "/apisix/routes/a"}));
    a.call("GET", "/apisix/admin/routes/a/b", None)
        .await
        .expect(200, json!({"key": "/apisix/routes/a"}));
}
