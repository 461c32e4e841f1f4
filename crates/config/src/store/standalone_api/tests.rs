use serde_json::json;

use super::*;

fn body(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => unreachable!("test bodies are objects"),
    }
}

fn doc(store: &StandaloneApiStore) -> Value {
    serde_json::from_str(&store.document_json()).expect("the document is JSON")
}

fn route(id: &str, uri: &str) -> Value {
    json!({"id": id, "uri": uri, "upstream": {"nodes": {"127.0.0.1:1980": 1}}})
}

#[test]
fn empty_until_the_first_update() {
    let store = StandaloneApiStore::new("/apisix");
    assert!(!store.received());
    assert!(!store.health().synced);
    assert_eq!(store.digest(), None);
    let d = doc(&store);
    assert_eq!(d["routes_conf_version"], 0);
    assert_eq!(d["stream_routes_conf_version"], 0);
    assert!(d.get(DIGEST).is_none());
}

#[test]
fn versions_move_on_by_one_or_as_given() {
    let store = StandaloneApiStore::new("/apisix");
    let rx = store.subscribe();
    let out = store
        .replace(
            &body(json!({"routes_conf_version": 10, "routes": [route("1", "/a")]})),
            "d1",
            100,
        )
        .unwrap();
    assert_eq!(out, Replaced::Applied { last_modified: 100 });
    assert!(store.health().synced);
    let d = doc(&store);
    assert_eq!(d["routes_conf_version"], 10);
    assert_eq!(d["upstreams_conf_version"], 1);
    assert_eq!(d["routes"][0]["uri"], "/a");
    assert!(
        d.get("upstreams").is_none(),
        "a type without items is absent"
    );
    assert_eq!(d[DIGEST], "d1");
    assert_eq!(d[LAST_MODIFIED], 100);
    assert!(rx.borrow().get(ResourceKind::Routes, "1").is_some());

    store.replace(&body(json!({})), "d2", 101).unwrap();
    let d = doc(&store);
    assert_eq!(d["routes_conf_version"], 11);
    assert!(d.get("routes").is_none());
    assert!(rx.borrow().get(ResourceKind::Routes, "1").is_none());
}

#[test]
fn a_version_going_back_is_refused_and_changes_nothing() {
    let store = StandaloneApiStore::new("/apisix");
    store
        .replace(
            &body(json!({"routes_conf_version": 1062, "routes": [route("1", "/a")]})),
            "d1",
            1,
        )
        .unwrap();
    let err = store
        .replace(
            &body(json!({"routes_conf_version": 1061, "routes": [route("1", "/b")]})),
            "d2",
            2,
        )
        .unwrap_err();
    assert_eq!(
        err,
        "routes_conf_version must be greater than or equal to (1062)"
    );
    assert_eq!(store.digest().as_deref(), Some("d1"));
    assert_eq!(doc(&store)["routes"][0]["uri"], "/a");
}

#[test]
fn an_equal_version_keeps_the_loaded_items() {
    let store = StandaloneApiStore::new("/apisix");
    let rx = store.subscribe();
    store
        .replace(
            &body(json!({"routes_conf_version": 5, "routes": [route("1", "/a")]})),
            "d1",
            1,
        )
        .unwrap();
    store
        .replace(
            &body(json!({"routes_conf_version": 5, "routes": [route("2", "/b")]})),
            "d2",
            2,
        )
        .unwrap();
    assert_eq!(doc(&store)["routes"][0]["id"], "1");
    assert!(rx.borrow().get(ResourceKind::Routes, "1").is_some());
    assert!(rx.borrow().get(ResourceKind::Routes, "2").is_none());
}

#[test]
fn the_same_digest_does_nothing() {
    let store = StandaloneApiStore::new("/apisix");
    store
        .replace(&body(json!({"routes": [route("1", "/a")]})), "d", 1)
        .unwrap();
    let out = store
        .replace(&body(json!({"routes": [route("2", "/b")]})), "d", 2)
        .unwrap();
    assert_eq!(out, Replaced::SameDigest);
    assert_eq!(store.last_modified(), Some(1));
    assert_eq!(doc(&store)["routes"][0]["id"], "1");
}

#[test]
fn an_unchanged_modified_index_keeps_the_loaded_item() {
    let store = StandaloneApiStore::new("/apisix");
    let rx = store.subscribe();
    let mut r = route("r1", "/r1");
    r["modifiedIndex"] = json!(1);
    store
        .replace(&body(json!({"routes": [r]})), "1", 1)
        .unwrap();
    let mut r2 = route("r1", "/r2");
    r2["modifiedIndex"] = json!(1);
    store
        .replace(&body(json!({"routes": [r2.clone()]})), "2", 2)
        .unwrap();
    let served = rx.borrow().get(ResourceKind::Routes, "r1").unwrap().clone();
    assert_eq!(served.value.parse()["uri"], "/r1");
    assert!(
        served.value.parse().get("modifiedIndex").is_none(),
        "the data plane's schemas do not know the field"
    );
    assert_eq!(
        doc(&store)["routes"][0]["uri"],
        "/r2",
        "GET shows what was sent"
    );
    r2["modifiedIndex"] = json!(2);
    store
        .replace(&body(json!({"routes": [r2]})), "3", 3)
        .unwrap();
    let served = rx.borrow().get(ResourceKind::Routes, "r1").unwrap().clone();
    assert_eq!(served.value.parse()["uri"], "/r2");
}

#[test]
fn unchanged_items_keep_their_value_and_slot() {
    let store = StandaloneApiStore::new("/apisix");
    let rx = store.subscribe();
    store
        .replace(
            &body(json!({"routes": [route("a", "/a"), route("b", "/b")]})),
            "1",
            1,
        )
        .unwrap();
    let before = rx.borrow().get(ResourceKind::Routes, "b").unwrap().clone();
    store
        .replace(
            &body(json!({"routes": [route("c", "/c"), route("b", "/b")]})),
            "2",
            2,
        )
        .unwrap();
    let state = rx.borrow().clone();
    let after = state.get(ResourceKind::Routes, "b").unwrap();
    assert!(after.value.ptr_eq(&before.value));
    assert_eq!(after.mod_revision, before.mod_revision);
    assert!(state.get(ResourceKind::Routes, "a").is_none());
    assert!(state.get(ResourceKind::Routes, "c").unwrap().seq > after.seq);
}

#[test]
fn consumers_credentials_and_unnamed_items() {
    let store = StandaloneApiStore::new("/apisix");
    let rx = store.subscribe();
    store
        .replace(
            &body(json!({
                "consumers": [
                    {"username": "jack"},
                    {"id": "jack/credentials/c1", "plugins": {"key-auth": {"key": "k"}}}
                ],
                "global_rules": [{"plugins": {}}],
            })),
            "1",
            1,
        )
        .unwrap();
    let state = rx.borrow().clone();
    assert!(state.get(ResourceKind::Consumers, "jack").is_some());
    assert!(state
        .get(ResourceKind::Credentials, "jack/credentials/c1")
        .is_some());
    assert!(state.get(ResourceKind::GlobalRules, "arr_1").is_some());
}

#[tokio::test]
async fn reads_follow_the_state_and_writes_are_refused() {
    let store = StandaloneApiStore::new("/apisix");
    store
        .replace(
            &body(json!({
                "routes": [route("1", "/a")],
                "consumers": [{"username": "jack"}, {"id": "jack/credentials/c1"}],
            })),
            "1",
            1,
        )
        .unwrap();
    assert!(store.get("/apisix/routes/1").await.unwrap().is_some());
    assert!(store
        .get("/apisix/consumers/jack/credentials/c1")
        .await
        .unwrap()
        .is_some());
    let (kvs, _) = store.list("/apisix/consumers/").await.unwrap();
    assert_eq!(kvs.len(), 2);
    assert!(matches!(
        store.put("/apisix/routes/2", b"{}".to_vec(), None).await,
        Err(StoreError::Invalid(_))
    ));
}
