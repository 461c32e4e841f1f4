//! Integration tests of what is particular to the etcd store, against a real etcd (see
//! `support`): following another writer, reconnecting after a restart, a half-dead connection,
//! compaction, a wiped etcd, booting from the local copy, garbage values, authentication, TLS
//! and failover. The Store operations every store shares are in `store_contract.rs`.
//!
//! Each test starts its own etcd (Debian's `etcd-server`, installed by `scripts/test.sh`);
//! without an `etcd` binary they fail, naming the package.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{CompactionOptions, GetOptions};
use ferrisix_config::model::ResourceKind;
use ferrisix_config::state::ConfigState;
use ferrisix_config::store::etcd::{EtcdStore, LocalCopy};
use ferrisix_config::store::{KeyValue, StateBuilder, Store, StoreError};
use serde_json::Value;
use support::{copy_path, eventually, route, settings, upstream, Etcd, Proxy, TlsFiles};

const WAIT: Duration = Duration::from_secs(15);

/// A store following `endpoints` with the tests' short settings and no local copy.
async fn connect(endpoints: Vec<String>) -> Arc<EtcdStore> {
    EtcdStore::connect(&settings(endpoints), None)
        .await
        .unwrap()
}

/// Writes through the store, which must accept it.
async fn put(store: &EtcdStore, key: &str, value: Vec<u8>) {
    store.put(key, value, None).await.unwrap();
}

/// Compacts etcd's history up to `revision`, physically: what a resumed watch must survive.
async fn compact(client: &mut etcd_client::Client, revision: i64) {
    client
        .compact(revision, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();
}

/// Writes straight to etcd, as another writer would; the revision of the write.
async fn etcd_put(
    client: &mut etcd_client::Client,
    key: impl Into<Vec<u8>>,
    value: impl Into<Vec<u8>>,
) -> i64 {
    client
        .put(key, value, None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision()
}

fn has_route(store: &EtcdStore, id: &str, uri: &str) -> bool {
    store
        .subscribe()
        .borrow()
        .get(ResourceKind::Routes, id)
        .is_some_and(|r| r.value.parse()["uri"] == uri)
}

/// Waits until the store's state holds route `id` with `uri`.
async fn await_route(store: &EtcdStore, what: &str, id: &str, uri: &str) {
    eventually(what, WAIT, || has_route(store, id, uri)).await;
}

/// Whether the store's state holds the item.
fn holds(store: &EtcdStore, kind: ResourceKind, id: &str) -> bool {
    store.subscribe().borrow().get(kind, id).is_some()
}

/// A port nothing listens on: freshly freed.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A state's content without insertion order: (kind, id) → (value, create, mod).
fn content(state: &ConfigState) -> BTreeMap<(ResourceKind, String), (Value, i64, i64)> {
    state
        .resources
        .iter()
        .flat_map(|(kind, items)| {
            items.values().map(move |i| {
                (
                    (*kind, i.id.clone()),
                    (i.value.parse(), i.create_revision, i.mod_revision),
                )
            })
        })
        .collect()
}

/// Everything under `prefix` in etcd, and etcd's revision.
async fn etcd_listing(etcd: &Etcd, prefix: &str) -> (Vec<KeyValue>, i64) {
    let mut client = etcd.client().await;
    let response = client
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let kvs = response
        .kvs()
        .iter()
        .map(|kv| KeyValue {
            key: kv.key_str().unwrap().to_owned(),
            value: kv.value().to_vec(),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
        })
        .collect();
    (kvs, response.header().unwrap().revision())
}

/// What a fresh full listing of etcd gives.
async fn fresh_state(etcd: &Etcd) -> ConfigState {
    let (kvs, revision) = etcd_listing(etcd, "/apisix/").await;
    let mut builder = StateBuilder::new("/apisix");
    builder.reset(&kvs, revision);
    builder.state().clone()
}

/// The store's state holds what etcd holds, revisions included.
async fn assert_matches_etcd(store: &EtcdStore, etcd: &Etcd) {
    let fresh = fresh_state(etcd).await;
    assert_eq!(content(&store.subscribe().borrow()), content(&fresh));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_see_each_others_writes() {
    let etcd = Etcd::start();
    let a = connect(vec![etcd.endpoint()]).await;
    let b = connect(vec![etcd.endpoint()]).await;
    for i in 0..3 {
        let uri = format!("/from-a/{i}");
        put(&a, "/apisix/routes/a", route(&uri)).await;
        await_route(&b, "b sees a's write", "a", &uri).await;
        let uri = format!("/from-b/{i}");
        put(&b, "/apisix/routes/b", route(&uri)).await;
        await_route(&a, "a sees b's write", "b", &uri).await;
    }
    b.delete("/apisix/routes/a").await.unwrap();
    // Both stores learn of the delete through their own watch, so each converges on its own.
    eventually("both see b's delete", WAIT, || {
        [&a, &b]
            .iter()
            .all(|s| !holds(s, ResourceKind::Routes, "a"))
    })
    .await;
    assert_eq!(
        content(&a.subscribe().borrow()),
        content(&b.subscribe().borrow())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_after_etcd_restart() {
    let mut etcd = Etcd::start();
    let store = connect(vec![etcd.endpoint()]).await;
    put(&store, "/apisix/routes/1", route("/before")).await;
    await_route(&store, "the first route", "1", "/before").await;

    etcd.stop();
    eventually("health shows etcd unreachable", WAIT, || {
        !store.health().reachable
    })
    .await;
    // The data plane keeps the last state; writes fail fast with etcd's error.
    assert!(has_route(&store, "1", "/before"));
    let started = Instant::now();
    let error = store
        .put("/apisix/routes/2", route("/x"), None)
        .await
        .unwrap_err();
    assert!(
        matches!(error, StoreError::Unavailable(ref text) if !text.is_empty()),
        "{error:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "bounded by timeout: {:?}",
        started.elapsed()
    );

    etcd.restart();
    let mut other = etcd.client().await;
    etcd_put(&mut other, "/apisix/routes/1", route("/after")).await;
    await_route(
        &store,
        "the store reconnects and sees the new write",
        "1",
        "/after",
    )
    .await;
    eventually("healthy again", WAIT, || store.health().reachable).await;
    put(&store, "/apisix/routes/2", route("/mine")).await;
    await_route(
        &store,
        "its own write comes back through the watch",
        "2",
        "/mine",
    )
    .await;
    assert!(store.stats().reconnects >= 1);
    assert_matches_etcd(&store, &etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_while_watching() {
    let etcd = Etcd::start();
    let mut direct = etcd.client().await;

    // Connected: compaction of history the watch already delivered changes nothing.
    let store = connect(vec![etcd.endpoint()]).await;
    let mut last = 0;
    for i in 0..5 {
        last = etcd_put(&mut direct, format!("/apisix/routes/{i}"), route("/v1")).await;
    }
    compact(&mut direct, last).await;
    for i in 3..8 {
        etcd_put(&mut direct, format!("/apisix/routes/{i}"), route("/v2")).await;
    }
    await_route(&store, "the connected store converges", "7", "/v2").await;
    assert_matches_etcd(&store, &etcd).await;

    // Disconnected while etcd compacts past the store's revision: the resumed watch is
    // cancelled with compact_revision and the store re-lists.
    let proxy = Proxy::start(etcd.addr()).await;
    let store = connect(vec![proxy.endpoint()]).await;
    await_route(&store, "the proxied store loaded", "7", "/v2").await;
    proxy.cut();
    eventually("the store notices the cut", WAIT, || {
        !store.health().reachable
    })
    .await;
    direct.delete("/apisix/routes/0", None).await.unwrap();
    for i in 5..10 {
        last = etcd_put(&mut direct, format!("/apisix/routes/{i}"), route("/v3")).await;
    }
    compact(&mut direct, last).await;
    etcd_put(&mut direct, "/apisix/routes/10", route("/v4")).await;
    proxy.heal();
    await_route(&store, "the store re-lists after compaction", "10", "/v4").await;
    assert!(store.stats().compactions >= 1, "{:?}", store.stats());
    assert_matches_etcd(&store, &etcd).await;
    assert!(!holds(&store, ResourceKind::Routes, "0"));

    // Afterwards each write is applied exactly once.
    let before = store.stats();
    for i in 0..5 {
        etcd_put(&mut direct, format!("/apisix/routes/n{i}"), route("/n")).await;
    }
    await_route(&store, "five more writes", "n4", "/n").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = store.stats();
    assert_eq!(after.events - before.events, 5, "{before:?} -> {after:?}");
    // etcd may deliver several revisions in one response, published together.
    assert!(
        (1..=5).contains(&(after.publishes - before.publishes)),
        "{before:?} -> {after:?}"
    );
    assert_eq!(after.duplicates, 0);
    assert_matches_etcd(&store, &etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_watch_is_reconnected() {
    let etcd = Etcd::start();
    let proxy = Proxy::start(etcd.addr()).await;
    let mut s = settings(vec![proxy.endpoint()]);
    s.watch_timeout = 2;
    let store = EtcdStore::connect(&s, None).await.unwrap();
    put(&store, "/apisix/routes/1", route("/a")).await;
    await_route(&store, "the first route", "1", "/a").await;

    // An idle but healthy watch answers the progress requests: no reconnects.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(store.stats().reconnects, 0, "{:?}", store.stats());

    // The connection stays open but nothing gets through: without the silence check the store
    // would wait forever.
    proxy.blackhole_existing();
    let mut direct = etcd.client().await;
    etcd_put(&mut direct, "/apisix/routes/1", route("/b")).await;
    eventually(
        "the store re-watches on a new connection",
        Duration::from_secs(8),
        || has_route(&store, "1", "/b"),
    )
    .await;
    assert!(store.stats().reconnects >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_etcd_is_relisted() {
    let mut etcd = Etcd::start();
    let store = connect(vec![etcd.endpoint()]).await;
    for i in 0..6 {
        put(&store, &format!("/apisix/routes/{i}"), route("/old")).await;
    }
    eventually("six routes", WAIT, || store.subscribe().borrow().len() == 6).await;

    // A new etcd whose revision is behind ours: events from there must not be taken as
    // already applied.
    etcd.restart_wiped();
    let mut direct = etcd.client().await;
    etcd_put(&mut direct, "/apisix/routes/new", route("/new")).await;
    eventually("the store follows the new history", WAIT, || {
        let state = store.subscribe().borrow().clone();
        state.len() == 1 && state.get(ResourceKind::Routes, "new").is_some()
    })
    .await;
    etcd_put(&mut direct, "/apisix/routes/new", route("/newer")).await;
    await_route(&store, "and keeps following it", "new", "/newer").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boots_from_the_local_copy_and_converges() {
    let mut etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let copy = copy_path(dir.path());
    let s = {
        let mut s = settings(vec![etcd.endpoint()]);
        s.startup_retry = 3;
        s
    };
    {
        let store = EtcdStore::connect(&s, Some(copy.clone())).await.unwrap();
        assert_eq!(store.local_copy(), Some(copy.as_path()));
        put(&store, "/apisix/routes/1", route("/one")).await;
        put(&store, "/apisix/upstreams/u", upstream()).await;
        put(&store, "/apisix/gen_id", b"1".to_vec()).await;
        eventually("the local copy is written", WAIT, || {
            LocalCopy::read(&copy).is_ok_and(|c| c.kvs.len() == 2)
        })
        .await;
    }
    let saved = LocalCopy::read(&copy).unwrap();
    let keys: Vec<_> = saved.kvs.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(keys, ["/apisix/routes/1", "/apisix/upstreams/u"]);

    etcd.stop();
    let started = Instant::now();
    let store = EtcdStore::connect(&s, Some(copy.clone())).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "one attempt, not startup_retry: {:?}",
        started.elapsed()
    );
    let health = store.health();
    assert!(!health.synced && !health.reachable, "{health:?}");
    assert!(
        health.detail.starts_with("serving local copy"),
        "{}",
        health.detail
    );
    assert_eq!(health.revision, saved.revision);
    assert!(has_route(&store, "1", "/one"));
    assert!(holds(&store, ResourceKind::Upstreams, "u"));
    assert!(matches!(
        store.put("/apisix/routes/2", route("/x"), None).await,
        Err(StoreError::Unavailable(_))
    ));

    // Without a copy, an unreachable etcd is an error.
    let none = EtcdStore::connect(&s, Some(dir.path().join("missing.json"))).await;
    assert!(matches!(none, Err(StoreError::Unavailable(_))), "{none:?}");

    etcd.restart();
    let mut direct = etcd.client().await;
    etcd_put(&mut direct, "/apisix/routes/3", route("/three")).await;
    direct.delete("/apisix/upstreams/u", None).await.unwrap();
    eventually("the store converges with etcd", WAIT, || {
        has_route(&store, "3", "/three") && !holds(&store, ResourceKind::Upstreams, "u")
    })
    .await;
    eventually("and reports it", WAIT, || {
        let h = store.health();
        h.synced && h.reachable
    })
    .await;
    assert_matches_etcd(&store, &etcd).await;
    eventually("the local copy follows", WAIT, || {
        LocalCopy::read(&copy).is_ok_and(|c| c.kvs.iter().any(|kv| kv.key == "/apisix/routes/3"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_values_do_not_break_the_store() {
    let etcd = Etcd::start();
    let mut direct = etcd.client().await;
    etcd_put(&mut direct, "/apisix/routes/x", "garbage{").await;
    etcd_put(&mut direct, "/apisix/routes/", "init_dir").await;
    etcd_put(&mut direct, "/apisix/routes/ok", route("/ok")).await;

    // At the initial listing.
    let store = connect(vec![etcd.endpoint()]).await;
    assert!(has_route(&store, "ok", "/ok"));
    assert!(!holds(&store, ResourceKind::Routes, "x"));

    // Through the watch: skipped, others still update, an older valid version stays.
    etcd_put(&mut direct, "/apisix/routes/y", "\u{0}not json").await;
    etcd_put(&mut direct, "/apisix/routes/ok", route("/ok2")).await;
    await_route(&store, "the valid update", "ok", "/ok2").await;
    assert!(!holds(&store, ResourceKind::Routes, "y"));
    etcd_put(&mut direct, "/apisix/routes/x", route("/x")).await;
    await_route(&store, "x becomes valid", "x", "/x").await;
    etcd_put(&mut direct, "/apisix/routes/x", "garbage again").await;
    etcd_put(&mut direct, "/apisix/routes/z", route("/z")).await;
    await_route(&store, "z arrives", "z", "/z").await;
    assert!(
        has_route(&store, "x", "/x"),
        "the last valid version of x keeps serving"
    );
    assert!(store.health().synced);
    // The Admin API holds stores as trait objects.
    let _: Arc<dyn Store> = store;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_etcd_without_a_copy_is_an_error() {
    // Nothing listens on a freshly freed port.
    let port = free_port();
    let mut s = settings(vec![format!("http://127.0.0.1:{port}")]);
    s.startup_retry = 2;
    let started = Instant::now();
    let error = EtcdStore::connect(&s, None).await.unwrap_err();
    assert!(
        matches!(error, StoreError::Unavailable(ref text) if text.contains("cannot load")),
        "{error:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_endpoints_with_one_down() {
    let etcd = Etcd::start();
    let dead = free_port();
    let endpoints = vec![format!("http://127.0.0.1:{dead}"), etcd.endpoint()];
    let store = connect(endpoints).await;
    for i in 0..5 {
        put(&store, &format!("/apisix/routes/{i}"), route("/m")).await;
    }
    let mut direct = etcd.client().await;
    etcd_put(&mut direct, "/apisix/routes/d", route("/d")).await;
    await_route(&store, "the watch follows", "d", "/d").await;
    assert_eq!(store.subscribe().borrow().len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticates_with_user_and_password() {
    let etcd = Etcd::start();
    let mut admin = etcd.client().await;
    let _ = admin.role_add("root").await;
    admin.user_add("root", "s3cret", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();

    let mut s = settings(vec![etcd.endpoint()]);
    s.user = Some("root".into());
    s.password = Some("s3cret".into());
    let store = EtcdStore::connect(&s, None).await.unwrap();
    put(&store, "/apisix/routes/1", route("/auth")).await;
    await_route(&store, "the watch works with a token", "1", "/auth").await;

    s.password = Some("wrong".into());
    let refused = EtcdStore::connect(&s, None).await;
    assert!(
        matches!(refused, Err(StoreError::Unavailable(ref text)) if text.contains("authentication failed")),
        "{refused:?}"
    );
    s.user = None;
    s.password = None;
    let anonymous = EtcdStore::connect(&s, None).await;
    assert!(
        matches!(anonymous, Err(StoreError::Unavailable(_))),
        "{anonymous:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let files = TlsFiles::make(dir.path());
    let etcd = Etcd::start_tls(files.clone());
    let mut s = settings(vec![etcd.endpoint()]);
    s.startup_retry = 5;
    s.tls.cert = Some(files.client_cert.clone());
    s.tls.key = Some(files.client_key.clone());
    let store = EtcdStore::connect_with_ca(&s, None, Some(&files.ca))
        .await
        .unwrap();
    put(&store, "/apisix/routes/1", route("/tls")).await;
    await_route(&store, "the watch works over TLS", "1", "/tls").await;

    // The verified name can differ from the endpoint's host.
    let mut by_name = s.clone();
    by_name.tls.sni = Some("localhost".into());
    let store = EtcdStore::connect_with_ca(&by_name, None, Some(&files.ca))
        .await
        .unwrap();
    assert!(has_route(&store, "1", "/tls"));
    by_name.tls.sni = Some("not-the-server".into());
    assert!(EtcdStore::connect_with_ca(&by_name, None, Some(&files.ca))
        .await
        .is_err());

    // etcd requires the client certificate.
    let mut anonymous = s.clone();
    anonymous.startup_retry = 1;
    anonymous.tls.cert = None;
    anonymous.tls.key = None;
    assert!(
        EtcdStore::connect_with_ca(&anonymous, None, Some(&files.ca))
            .await
            .is_err()
    );
    // And the server certificate must chain to a trusted CA (not in the system roots).
    assert!(EtcdStore::connect(&anonymous, None).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_over_to_the_next_endpoint() {
    let etcd = Etcd::start();
    // Two ways to the same member, so one can be cut.
    let (a, b) = (
        Proxy::start(etcd.addr()).await,
        Proxy::start(etcd.addr()).await,
    );
    let store = connect(vec![a.endpoint(), b.endpoint()]).await;
    assert_eq!(
        store.health().detail,
        format!("following etcd at {}", a.endpoint())
    );
    a.cut();
    let mut direct = etcd.client().await;
    etcd_put(&mut direct, "/apisix/routes/1", route("/via-b")).await;
    await_route(&store, "the store follows through b", "1", "/via-b").await;
    eventually("and says so", WAIT, || {
        store.health().detail.contains(&b.endpoint())
    })
    .await;
    put(&store, "/apisix/routes/2", route("/write-b")).await;
    await_route(&store, "its write comes back", "2", "/write-b").await;
}

/// What a page of `/apisix/routes/` must be, from a full listing: the items directly under
/// the directory in creation order (create revision, then key).
async fn expected_page(etcd: &Etcd, offset: usize, limit: usize) -> (Vec<KeyValue>, usize) {
    let (mut kvs, _) = etcd_listing(etcd, "/apisix/routes/").await;
    kvs.retain(|kv| kv.key != "/apisix/routes/");
    kvs.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
    let total = kvs.len();
    (kvs.into_iter().skip(offset).take(limit).collect(), total)
}

/// Admin pages come from the followed state (a count-only read of etcd, no sorted range)
/// while it holds exactly the directory, and match what etcd holds, own writes and another
/// writer's alike; a key further down or a value that is not JSON sends them to etcd's range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_come_from_the_followed_state_while_it_matches_etcd() {
    let etcd = Etcd::start();
    let store = connect(vec![etcd.endpoint()]).await;
    let mut direct = etcd.client().await;
    etcd_put(&mut direct, "/apisix/routes/", "init_dir").await;
    for i in 0..40 {
        let id = (i * 17) % 40;
        put(
            &store,
            &format!("/apisix/routes/{id}"),
            route(&format!("/{id}")),
        )
        .await;
    }
    // Two keys created in one transaction share their create revision: key order then.
    let txn = etcd_client::Txn::new().and_then([
        etcd_client::TxnOp::put("/apisix/routes/tx-b", route("/b"), None),
        etcd_client::TxnOp::put("/apisix/routes/tx-a", route("/a"), None),
    ]);
    direct.txn(txn).await.unwrap();
    // Another writer's change, read back at once through this store: right whichever way the
    // page is made (from the followed state once it caught up, else from etcd's range).
    etcd_put(&mut direct, "/apisix/routes/17", route("/changed")).await;
    let page = store.list_page("/apisix/routes/", 0, 50).await.unwrap();
    let (kvs, total) = expected_page(&etcd, 0, 50).await;
    let page = page.expect("routes page");
    assert_eq!(
        (page.kvs, page.total),
        (kvs, total),
        "a page right after a write"
    );
    // Once the state has followed it, every page comes from the state. (How fast the watch
    // delivers is not this test's to bound: a busy machine can take longer than the page's
    // catch-up wait, and the page then rightly reads etcd.)
    await_route(&store, "the other writer's change", "17", "/changed").await;
    let before = store.stats().pages_from_state;
    for (offset, limit) in [(0, 10), (35, 10), (10, 25), (42, 10), (100, 10)] {
        let page = store
            .list_page("/apisix/routes/", offset, limit)
            .await
            .unwrap()
            .expect("routes page");
        let (kvs, total) = expected_page(&etcd, offset, limit).await;
        assert_eq!(page.total, total, "offset {offset}");
        assert_eq!(page.kvs, kvs, "offset {offset}, limit {limit}");
    }
    assert_eq!(store.stats().pages_from_state, before + 5);

    // A key further down: etcd's count includes it, the state does not hold it.
    etcd_put(&mut direct, "/apisix/routes/a/b", route("/deep")).await;
    let before = store.stats().pages_from_state;
    assert_eq!(
        store.list_page("/apisix/routes/", 0, 10).await.unwrap(),
        None,
        "the directory is listed whole"
    );
    assert_eq!(store.stats().pages_from_state, before);
    direct.delete("/apisix/routes/a/b", None).await.unwrap();

    // A value that is not JSON is listed as etcd holds it.
    etcd_put(&mut direct, "/apisix/routes/0garbage", "garbage{").await;
    let page = store
        .list_page("/apisix/routes/", 40, 10)
        .await
        .unwrap()
        .unwrap();
    let (kvs, total) = expected_page(&etcd, 40, 10).await;
    assert!(page
        .kvs
        .iter()
        .any(|kv| kv.key == "/apisix/routes/0garbage"));
    assert_eq!((page.kvs, page.total), (kvs, total));
    assert_eq!(store.stats().pages_from_state, before);

    // Deleted again: the state serves pages once more.
    direct
        .delete("/apisix/routes/0garbage", None)
        .await
        .unwrap();
    let page = store
        .list_page("/apisix/routes/", 0, 50)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(page.total, 42);
    assert_eq!(store.stats().pages_from_state, before + 1);
}

/// A config of many pages, compacted between two pages of the first listing: the pinned
/// revision is gone, the listing starts over from the newest revision (once, not in a loop),
/// every route is there, including the one written while the first try was read, and the
/// watch then follows from the listing's revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boots_in_pages_through_a_compaction_in_the_middle() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let etcd = Etcd::start();
    let mut direct = etcd.client().await;
    etcd_put(&mut direct, "/apisix/upstreams/u", upstream()).await;
    for i in 0..60 {
        etcd_put(
            &mut direct,
            format!("/apisix/routes/{i}"),
            route(&format!("/r{i}")),
        )
        .await;
    }
    let compacted = Arc::new(AtomicBool::new(false));
    let most_pages = Arc::new(AtomicU64::new(0));
    let endpoint = etcd.endpoint();
    let hook: ferrisix_config::store::etcd::PageHook = {
        let (compacted, most_pages) = (Arc::clone(&compacted), Arc::clone(&most_pages));
        Arc::new(move |pages, _revision| {
            most_pages.fetch_max(pages, Ordering::Relaxed);
            let first = pages == 5 && !compacted.swap(true, Ordering::Relaxed);
            let endpoint = endpoint.clone();
            Box::pin(async move {
                if first {
                    let mut client = etcd_client::Client::connect([endpoint], None)
                        .await
                        .unwrap();
                    let newest = etcd_put(&mut client, "/apisix/routes/mid", route("/mid")).await;
                    compact(&mut client, newest).await;
                }
            })
        })
    };
    let mut settings = settings(vec![etcd.endpoint()]);
    settings.page_size = 4;
    let store = EtcdStore::connect_with_page_hook(&settings, None, hook)
        .await
        .unwrap();
    assert!(compacted.load(Ordering::Relaxed), "the hook compacted");
    let stats = store.stats();
    assert_eq!(stats.list_restarts, 1, "{stats:?}");
    assert_eq!(stats.relists, 1, "{stats:?}");
    assert!(
        most_pages.load(Ordering::Relaxed) >= 15,
        "62 keys in pages of 4"
    );
    for i in 0..60 {
        assert!(has_route(&store, &i.to_string(), &format!("/r{i}")), "{i}");
    }
    assert!(has_route(&store, "mid", "/mid"));
    assert_matches_etcd(&store, &etcd).await;
    // The watch starts after the listing's revision: later changes arrive, none is missed.
    etcd_put(&mut direct, "/apisix/routes/late", route("/late")).await;
    etcd_put(&mut direct, "/apisix/routes/3", route("/r3b")).await;
    await_route(&store, "a write after the boot", "late", "/late").await;
    await_route(&store, "an update after the boot", "3", "/r3b").await;
    assert_matches_etcd(&store, &etcd).await;
    assert_eq!(store.stats().list_restarts, 1);
}

/// A value over `max_value_size` is quarantined alone: the pages around it load, an older
/// valid version keeps serving when one comes through the watch, and the Admin list of the
/// directory (read in pages too) still has every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_value_is_quarantined_alone() {
    let etcd = Etcd::start();
    let mut direct = etcd.client().await;
    let big = |uri: &str| {
        let hosts: Vec<String> = (0..200).map(|i| format!("\"h{i}.example.com\"")).collect();
        format!(
            r#"{{"uri":"{uri}","hosts":[{}],"upstream":{{"nodes":{{"127.0.0.1:1980":1}}}}}}"#,
            hosts.join(",")
        )
    };
    for i in 0..10 {
        etcd_put(
            &mut direct,
            format!("/apisix/routes/{i}"),
            route(&format!("/r{i}")),
        )
        .await;
    }
    etcd_put(&mut direct, "/apisix/routes/4b", big("/big")).await;
    let mut settings = settings(vec![etcd.endpoint()]);
    settings.page_size = 3;
    settings.max_value_size = 1000;
    let store = EtcdStore::connect(&settings, None).await.unwrap();
    for i in 0..10 {
        assert!(has_route(&store, &i.to_string(), &format!("/r{i}")), "{i}");
    }
    assert!(!holds(&store, ResourceKind::Routes, "4b"));
    let reason = store
        .subscribe()
        .borrow()
        .unreadable
        .get(&(ResourceKind::Routes, "4b".to_string()))
        .cloned();
    assert!(
        reason
            .as_deref()
            .is_some_and(|r| r.contains("over the limit of 1000 bytes")),
        "{reason:?}"
    );
    // Through the watch: the older valid version of 2 keeps serving.
    etcd_put(&mut direct, "/apisix/routes/2", big("/r2big")).await;
    etcd_put(&mut direct, "/apisix/routes/after", route("/after")).await;
    await_route(&store, "the write after", "after", "/after").await;
    assert!(has_route(&store, "2", "/r2"));
    // Fits again: served.
    etcd_put(&mut direct, "/apisix/routes/4b", route("/small")).await;
    await_route(&store, "4b fits now", "4b", "/small").await;
    let (listed, _) = store.list("/apisix/routes/").await.unwrap();
    assert_eq!(listed.len(), 12, "every key, in pages of 3");
}
