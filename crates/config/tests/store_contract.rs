//! The store contract: every [`Store`] (the in-memory test store, the embedded redb store, and
//! etcd) is held to the same cases, so the Admin API and the data plane can rely on etcd's
//! semantics whichever store is configured: revisions, create/mod revisions, listing in key
//! order, deletes, compare-and-swap, TTLs, refused writes, and the published state.
//!
//! Each case is one function over a [`Subject`]; the `contract!` macro runs every case once
//! per store (`memory::…`, `embedded::…`, `etcd::…`). The etcd runs start their own etcd
//! (Debian's `etcd-server`, installed by `scripts/test.sh`; without it they fail, naming it).
//! What is particular to one store (reopening a redb file, `kill -9`, etcd restarts,
//! compaction, failover...) is tested in `embedded.rs` and `etcd.rs`.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrisix_config::model::ResourceKind;
use ferrisix_config::state::ConfigState;
use ferrisix_config::store::embedded::{EmbeddedStore, MAX_VALUE_BYTES, MIN_TTL};
use ferrisix_config::store::etcd::EtcdStore;
use ferrisix_config::store::memory::MemoryStore;
use ferrisix_config::store::{Page, PutOutcome, Store, StoreError};
use support::{route, upstream};
use tokio::sync::watch;

/// One store under test, and what legitimately differs between stores.
struct Subject {
    store: Arc<dyn Store>,
    /// The state is published before a write returns (memory, embedded); etcd's arrives
    /// through its watch a moment later.
    publishes_on_write: bool,
    /// etcd's minimum lease (shorter TTLs last this long); `None`: TTLs are exact.
    lease_minimum: Option<Duration>,
    /// It reads a page of a directory without listing it (`list_page` answers `Some`).
    pages: bool,
    /// What must outlive the store: its directory, or the etcd process. Declared last, so
    /// it is dropped after the store.
    _keep: Box<dyn std::any::Any + Send>,
}

async fn memory() -> Option<Subject> {
    Some(Subject {
        store: Arc::new(MemoryStore::new("/apisix")),
        publishes_on_write: true,
        lease_minimum: None,
        pages: true,
        _keep: Box::new(()),
    })
}

async fn embedded() -> Option<Subject> {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&dir.path().join("data/ferrisix.redb"), "/apisix").unwrap();
    Some(Subject {
        store,
        publishes_on_write: true,
        lease_minimum: Some(MIN_TTL),
        pages: true,
        _keep: Box::new(dir),
    })
}

async fn etcd() -> Option<Subject> {
    let etcd = support::Etcd::start();
    let store = EtcdStore::connect(&support::settings(vec![etcd.endpoint()]), None)
        .await
        .unwrap();
    Some(Subject {
        store,
        publishes_on_write: false,
        // etcd's default election settings make its minimum lease 2 s.
        lease_minimum: Some(Duration::from_secs(2)),
        pages: true,
        _keep: Box::new(etcd),
    })
}

macro_rules! contract {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $case() {
                    let subject = super::memory().await.unwrap();
                    super::$case(subject).await;
                }
            )*
        }
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let subject = super::embedded().await.unwrap();
                    super::$case(subject).await;
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let Some(subject) = super::etcd().await else { return };
                    super::$case(subject).await;
                }
            )*
        }
    };
}

contract!(
    writes_and_revisions,
    lists_in_key_order,
    pages_in_creation_order,
    deletes,
    refuses_invalid_writes,
    compare_and_swap,
    ttl_expires_keys,
    publishes_every_change,
);

/// How long an asynchronous store may take to publish a change.
const WAIT: Duration = Duration::from_secs(15);

/// Writes `value` without a TTL; the store must accept it.
async fn put(store: &dyn Store, key: &str, value: Vec<u8>) -> PutOutcome {
    store.put(key, value, None).await.unwrap()
}

/// A page of a store that pages.
async fn page_of(store: &dyn Store, dir: &str, offset: usize, limit: usize) -> Page {
    store
        .list_page(dir, offset, limit)
        .await
        .unwrap()
        .expect("a page")
}

/// The store's current revision, as a read sees it.
async fn revision(store: &dyn Store) -> i64 {
    store.list("/apisix/").await.unwrap().1
}

/// Waits until the published state satisfies `check`.
async fn published(
    states: &mut watch::Receiver<Arc<ConfigState>>,
    what: &str,
    check: impl Fn(&ConfigState) -> bool,
) {
    tokio::time::timeout(WAIT, async {
        while !check(&states.borrow_and_update()) {
            states.changed().await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out after {WAIT:?} waiting for {what}"));
}

async fn writes_and_revisions(subject: Subject) {
    let store = subject.store.as_ref();
    assert_eq!(store.prefix(), "/apisix");
    let health = store.health();
    assert!(health.reachable && health.synced, "{health:?}");
    let start = revision(store).await;

    let first = put(store, "/apisix/routes/1", route("/a")).await;
    assert_eq!(first.previous, None);
    assert_eq!(first.revision, start + 1, "every write is one revision");
    let second = put(store, "/apisix/routes/1", route("/b")).await;
    assert_eq!(second.revision, first.revision + 1);
    let previous = second.previous.unwrap();
    assert_eq!(previous.value, route("/a"));
    assert_eq!(
        (previous.create_revision, previous.mod_revision),
        (first.revision, first.revision)
    );

    let got = store.get("/apisix/routes/1").await.unwrap().unwrap();
    assert_eq!(got.value, route("/b"));
    assert_eq!(
        (got.create_revision, got.mod_revision),
        (first.revision, second.revision)
    );
    assert_eq!(store.get("/apisix/routes/2").await.unwrap(), None);

    // The gen_id pattern: every put returns a fresh, increasing revision.
    let g1 = put(store, "/apisix/gen_id", b"1".to_vec()).await.revision;
    let g2 = put(store, "/apisix/gen_id", b"1".to_vec()).await.revision;
    assert!(g2 > g1);
}

async fn lists_in_key_order(subject: Subject) {
    let store = subject.store.as_ref();
    for id in ["2", "10", "3", "1"] {
        put(store, &format!("/apisix/routes/{id}"), route("/x")).await;
    }
    // A sibling with the same leading characters is not under `routes/`.
    let last = put(store, "/apisix/routes2/zz", b"{}".to_vec()).await;
    let (kvs, revision) = store.list("/apisix/routes/").await.unwrap();
    let keys: Vec<_> = kvs.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "/apisix/routes/1",
            "/apisix/routes/10",
            "/apisix/routes/2",
            "/apisix/routes/3"
        ]
    );
    assert_eq!(
        revision, last.revision,
        "a listing carries the read revision"
    );
    if subject.publishes_on_write {
        assert_eq!(store.health().revision, revision);
    }
    assert!(kvs.iter().all(|k| k.mod_revision < revision));
}

/// APISIX's Admin API pages a directory in creation order (create revision), not key order;
/// a store that can page answers the same pages a full list cut up would.
async fn pages_in_creation_order(subject: Subject) {
    let store = subject.store.as_ref();
    // The directory's placeholder (APISIX's `init_dir`) is no item of it.
    put(store, "/apisix/routes/", b"init_dir".to_vec()).await;
    // Created in an order unlike the key order; more than one transaction of gets (128).
    let ids: Vec<String> = (0..150).map(|i| format!("{}", (i * 37) % 150)).collect();
    for id in &ids {
        put(
            store,
            &format!("/apisix/routes/{id}"),
            route(&format!("/{id}")),
        )
        .await;
    }
    // Neither a sibling directory nor an update moves anything.
    put(store, "/apisix/routes2/0", b"{}".to_vec()).await;
    put(store, "/apisix/routes/0", route("/changed")).await;
    let page = store.list_page("/apisix/routes/", 0, 10).await.unwrap();
    let Some(page) = page else {
        assert!(!subject.pages, "this store pages");
        return;
    };
    assert!(subject.pages);
    let keys = |p: &Page| -> Vec<String> {
        p.kvs
            .iter()
            .map(|kv| kv.key["/apisix/routes/".len()..].to_owned())
            .collect()
    };
    assert_eq!(keys(&page), ids[..10], "the ten created first");
    assert_eq!(
        page.total, 150,
        "the placeholder and the sibling are not counted"
    );
    assert_eq!(page.kvs[0].value, route("/changed"), "the current value");
    let deep = page_of(store, "/apisix/routes/", 140, 10).await;
    assert_eq!(keys(&deep), ids[140..]);
    let big = page_of(store, "/apisix/routes/", 5, 140).await;
    assert_eq!(keys(&big), ids[5..145], "a page of more than 128 keys");
    let past = page_of(store, "/apisix/routes/", 150, 10).await;
    assert!(past.kvs.is_empty());
    assert_eq!(past.total, 150);
    let empty = page_of(store, "/apisix/upstreams/", 0, 10).await;
    assert_eq!((empty.kvs.len(), empty.total), (0, 0));

    // Deleted and created again: it goes to the end.
    store.delete("/apisix/routes/0").await.unwrap();
    put(store, "/apisix/routes/0", route("/again")).await;
    let last = page_of(store, "/apisix/routes/", 149, 10).await;
    assert_eq!(keys(&last), ["0"]);
    assert_eq!(last.total, 150);
}

async fn deletes(subject: Subject) {
    let store = subject.store.as_ref();
    put(store, "/apisix/routes/1", route("/b")).await;
    for id in ["2", "10", "3"] {
        put(store, &format!("/apisix/routes/{id}"), route("/x")).await;
    }
    put(store, "/apisix/routes2/zz", b"{}".to_vec()).await;

    // A delete of a missing key changes nothing, not even the revision.
    let before = revision(store).await;
    assert_eq!(store.delete("/apisix/routes/404").await.unwrap(), None);
    assert_eq!(revision(store).await, before);
    let deleted = store.delete("/apisix/routes/1").await.unwrap().unwrap();
    assert_eq!(deleted.value, route("/b"));
    assert_eq!(revision(store).await, before + 1);
    assert_eq!(store.get("/apisix/routes/1").await.unwrap(), None);

    // A prefix delete is one revision, and leaves siblings alone.
    assert_eq!(store.delete_prefix("/apisix/routes/").await.unwrap(), 3);
    assert_eq!(revision(store).await, before + 2);
    assert!(store.list("/apisix/routes/").await.unwrap().0.is_empty());
    assert_eq!(store.delete_prefix("/apisix/routes/").await.unwrap(), 0);
    assert_eq!(revision(store).await, before + 2);
    assert!(store.get("/apisix/routes2/zz").await.unwrap().is_some());

    // Re-created keys start a new life.
    let again = put(store, "/apisix/routes/1", route("/c")).await;
    assert_eq!(again.previous, None);
    let got = store.get("/apisix/routes/1").await.unwrap().unwrap();
    assert_eq!(
        (got.create_revision, got.mod_revision),
        (again.revision, again.revision)
    );
}

async fn refuses_invalid_writes(subject: Subject) {
    let store = subject.store.as_ref();
    let before = revision(store).await;
    assert!(matches!(
        store.put("", vec![], None).await,
        Err(StoreError::Invalid(_))
    ));
    // Over etcd's default request limit (1.5 MiB), with etcd's own message.
    let huge = vec![b' '; MAX_VALUE_BYTES + 1024];
    assert_eq!(
        store.put("/apisix/routes/big", huge.clone(), None).await,
        Err(StoreError::Invalid(
            "etcdserver: request is too large".into()
        ))
    );
    assert_eq!(
        store
            .put_if_unmodified("/apisix/routes/big", huge, 0, None)
            .await,
        Err(StoreError::Invalid(
            "etcdserver: request is too large".into()
        ))
    );
    assert_eq!(
        revision(store).await,
        before,
        "a refused write writes nothing"
    );
    assert_eq!(store.get("/apisix/routes/big").await.unwrap(), None);
}

async fn compare_and_swap(subject: Subject) {
    let store = subject.store.as_ref();
    let created = put(store, "/apisix/routes/1", route("/a")).await.revision;

    let stale = created - 1;
    assert_eq!(
        store
            .put_if_unmodified("/apisix/routes/1", route("/b"), stale, None)
            .await,
        Err(StoreError::Conflict)
    );
    assert_eq!(
        store.get("/apisix/routes/1").await.unwrap().unwrap().value,
        route("/a")
    );
    assert_eq!(revision(store).await, created, "a lost CAS writes nothing");

    let ok = store
        .put_if_unmodified("/apisix/routes/1", route("/b"), created, None)
        .await
        .unwrap();
    assert_eq!(ok.previous.unwrap().value, route("/a"));
    assert_eq!(ok.revision, created + 1);
    assert_eq!(
        store
            .put_if_unmodified("/apisix/routes/1", route("/c"), created, None)
            .await,
        Err(StoreError::Conflict),
        "the first swap moved mod_revision on"
    );
    // A missing key has mod_revision 0, as in etcd.
    assert_eq!(
        store
            .put_if_unmodified("/apisix/routes/2", route("/n"), 5, None)
            .await,
        Err(StoreError::Conflict)
    );
    let fresh = store
        .put_if_unmodified("/apisix/routes/2", route("/n"), 0, None)
        .await
        .unwrap();
    assert_eq!(fresh.previous, None);
}

async fn ttl_expires_keys(subject: Subject) {
    let store = subject.store.as_ref();
    let mut states = store.subscribe();
    let start = Instant::now();
    let ttl = Some(Duration::from_secs(1));
    // The last write of `detached` has no TTL: that detaches the key from its TTL, as a put
    // without lease does in etcd.
    for (id, uri, ttl) in [
        ("t", "/ttl", ttl),
        ("keep", "/keep", None),
        ("detached", "/d", ttl),
        ("detached", "/d", None),
    ] {
        store
            .put(&format!("/apisix/routes/{id}"), route(uri), ttl)
            .await
            .unwrap();
    }
    assert!(store.get("/apisix/routes/t").await.unwrap().is_some());
    published(&mut states, "the TTL route", |s| {
        s.get(ResourceKind::Routes, "t").is_some()
    })
    .await;

    if let Some(minimum) = subject.lease_minimum {
        // etcd's minimum lease: a 1 s TTL is still there after 1.5 s.
        tokio::time::sleep(Duration::from_millis(1500).saturating_sub(start.elapsed())).await;
        assert!(store.get("/apisix/routes/t").await.unwrap().is_some());
        assert!(minimum > Duration::from_millis(1500));
    }
    let expected = subject.lease_minimum.unwrap_or(Duration::from_secs(1));
    let bound = expected + if subject.publishes_on_write { 2 } else { 6 } * Duration::from_secs(1);
    while store.get("/apisix/routes/t").await.unwrap().is_some() {
        assert!(start.elapsed() < bound, "the TTL key must expire");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(start.elapsed() >= expected, "{:?}", start.elapsed());
    // The data plane sees it go.
    published(&mut states, "the expired route to leave", |s| {
        s.get(ResourceKind::Routes, "t").is_none()
    })
    .await;
    let (kvs, _) = store.list("/apisix/routes/").await.unwrap();
    let keys: Vec<_> = kvs.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(keys, ["/apisix/routes/detached", "/apisix/routes/keep"]);
}

async fn publishes_every_change(subject: Subject) {
    let store = subject.store.as_ref();
    let mut states = store.subscribe();
    assert!(states.borrow_and_update().is_empty());

    let rev = put(store, "/apisix/routes/1", route("/a")).await.revision;
    if subject.publishes_on_write {
        assert!(states.has_changed().unwrap());
    }
    published(&mut states, "the route", |s| {
        s.get(ResourceKind::Routes, "1").is_some()
    })
    .await;
    {
        let state = states.borrow_and_update();
        let item = state.get(ResourceKind::Routes, "1").unwrap();
        assert_eq!(item.value.parse()["uri"], "/a");
        assert_eq!(item.mod_revision, rev);
        assert_eq!(state.revision, rev);
    }
    put(store, "/apisix/upstreams/u", upstream()).await;
    published(&mut states, "the upstream", |s| {
        s.get(ResourceKind::Upstreams, "u").is_some()
    })
    .await;

    // Keys the data plane does not compile publish nothing.
    put(store, "/apisix/gen_id", b"1".to_vec()).await;
    put(store, "/apisix/routes/", b"init_dir".to_vec()).await;
    if subject.publishes_on_write {
        assert!(!states.has_changed().unwrap());
    }

    store.delete("/apisix/routes/1").await.unwrap();
    published(&mut states, "the route to leave", |s| {
        s.get(ResourceKind::Routes, "1").is_none()
    })
    .await;
    store.delete_prefix("/apisix/upstreams/").await.unwrap();
    published(&mut states, "an empty state", ConfigState::is_empty).await;
    assert_eq!(
        states.borrow().len(),
        0,
        "directory placeholders are not items"
    );
}
