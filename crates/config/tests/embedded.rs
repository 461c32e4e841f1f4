//! Integration tests of the embedded (redb) store: etcd-like revisions, compare-and-swap, TTL,
//! the published state, reopening, and durability of acknowledged writes across `kill -9`.
//!
//! The crash test re-runs this test binary as the writer: with `FERRISIX_CRASH_WRITER` set, the
//! otherwise empty `crash_writer_child` test writes keys and prints each acknowledged one.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrisix_config::model::ResourceKind;
use ferrisix_config::store::embedded::EmbeddedStore;
use ferrisix_config::store::{Store, StoreError};

const CRASH_ENV: &str = "FERRISIX_CRASH_WRITER";

fn open(dir: &Path) -> Arc<EmbeddedStore> {
    EmbeddedStore::open(&dir.join("data/ferrisix.redb"), "/apisix").unwrap()
}

fn route(uri: &str) -> Vec<u8> {
    format!(r#"{{"uri":"{uri}","upstream":{{"nodes":{{"127.0.0.1:1980":1}}}}}}"#).into_bytes()
}

#[tokio::test]
async fn crud_and_revisions() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    assert_eq!(store.prefix(), "/apisix");
    let start = store.health().revision;

    let first = store
        .put("/apisix/routes/1", route("/a"), None)
        .await
        .unwrap();
    assert_eq!(first.previous, None);
    assert_eq!(first.revision, start + 1);
    let second = store
        .put("/apisix/routes/1", route("/b"), None)
        .await
        .unwrap();
    let previous = second.previous.unwrap();
    assert_eq!(previous.value, route("/a"));
    assert_eq!(
        (previous.create_revision, previous.mod_revision),
        (start + 1, start + 1)
    );
    assert_eq!(second.revision, start + 2);

    let got = store.get("/apisix/routes/1").await.unwrap().unwrap();
    assert_eq!(got.value, route("/b"));
    assert_eq!(
        (got.create_revision, got.mod_revision),
        (start + 1, start + 2)
    );
    assert_eq!(store.get("/apisix/routes/2").await.unwrap(), None);

    // The gen_id pattern: every put returns a fresh, increasing revision.
    let g1 = store
        .put("/apisix/gen_id", b"1".to_vec(), None)
        .await
        .unwrap()
        .revision;
    let g2 = store
        .put("/apisix/gen_id", b"1".to_vec(), None)
        .await
        .unwrap()
        .revision;
    assert!(g2 > g1);

    for id in ["2", "10", "3"] {
        store
            .put(&format!("/apisix/routes/{id}"), route("/x"), None)
            .await
            .unwrap();
    }
    store
        .put("/apisix/routes2/zz", b"{}".to_vec(), None)
        .await
        .unwrap();
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
    assert_eq!(revision, store.health().revision);

    // A delete of a missing key changes nothing, not even the revision.
    let before = store.health().revision;
    assert_eq!(store.delete("/apisix/routes/404").await.unwrap(), None);
    assert_eq!(store.health().revision, before);
    let deleted = store.delete("/apisix/routes/1").await.unwrap().unwrap();
    assert_eq!(deleted.value, route("/b"));
    assert_eq!(store.health().revision, before + 1);
    assert_eq!(store.get("/apisix/routes/1").await.unwrap(), None);

    // A prefix delete is one revision.
    assert_eq!(store.delete_prefix("/apisix/routes/").await.unwrap(), 3);
    assert_eq!(store.health().revision, before + 2);
    assert_eq!(store.delete_prefix("/apisix/routes/").await.unwrap(), 0);
    assert_eq!(store.health().revision, before + 2);
    assert!(store.get("/apisix/routes2/zz").await.unwrap().is_some());

    // Re-created keys start a new life.
    let again = store
        .put("/apisix/routes/1", route("/c"), None)
        .await
        .unwrap();
    assert_eq!(again.previous, None);
    let got = store.get("/apisix/routes/1").await.unwrap().unwrap();
    assert_eq!(got.create_revision, again.revision);

    assert!(matches!(
        store.put("", vec![], None).await,
        Err(StoreError::Invalid(_))
    ));
    let huge = vec![b' '; 2 * 1024 * 1024];
    assert_eq!(
        store.put("/apisix/routes/big", huge, None).await,
        Err(StoreError::Invalid(
            "etcdserver: request is too large".into()
        ))
    );
    let health = store.health();
    assert!(health.reachable && health.synced);
    // The Admin API holds stores as trait objects.
    let _: Arc<dyn Store> = store;
}

#[tokio::test]
async fn compare_and_swap() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let created = store
        .put("/apisix/routes/1", route("/a"), None)
        .await
        .unwrap()
        .revision;

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
    assert_eq!(
        store.health().revision,
        created,
        "a lost CAS writes nothing"
    );

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
    assert!(store
        .put_if_unmodified("/apisix/routes/2", route("/n"), 0, None)
        .await
        .is_ok());
}

#[tokio::test]
async fn ttl_expires_keys() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut states = store.subscribe();
    let start = Instant::now();
    store
        .put(
            "/apisix/routes/t",
            route("/ttl"),
            Some(Duration::from_secs(1)),
        )
        .await
        .unwrap();
    store
        .put("/apisix/routes/keep", route("/keep"), None)
        .await
        .unwrap();
    // Overwriting without a TTL detaches the key from its TTL, as a put without lease in etcd.
    store
        .put(
            "/apisix/routes/detached",
            route("/d"),
            Some(Duration::from_secs(1)),
        )
        .await
        .unwrap();
    store
        .put("/apisix/routes/detached", route("/d"), None)
        .await
        .unwrap();
    assert!(states
        .borrow_and_update()
        .get(ResourceKind::Routes, "t")
        .is_some());

    // etcd's minimum lease: a 1 s TTL is still there after 1.5 s.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(store.get("/apisix/routes/t").await.unwrap().is_some());

    loop {
        if store.get("/apisix/routes/t").await.unwrap().is_none() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(4),
            "the TTL key must expire"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(start.elapsed() >= Duration::from_secs(2));
    // The sweeper deletes it for good, and the data plane sees it go.
    tokio::time::timeout(Duration::from_secs(2), async {
        while states
            .borrow_and_update()
            .get(ResourceKind::Routes, "t")
            .is_some()
        {
            states.changed().await.unwrap();
        }
    })
    .await
    .expect("the expired route leaves the published state");
    let (kvs, _) = store.list("/apisix/routes/").await.unwrap();
    let keys: Vec<_> = kvs.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(keys, ["/apisix/routes/detached", "/apisix/routes/keep"]);
}

#[tokio::test]
async fn watch_publishes_every_change() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut states = store.subscribe();
    assert!(states.borrow_and_update().is_empty());

    let rev = store
        .put("/apisix/routes/1", route("/a"), None)
        .await
        .unwrap()
        .revision;
    assert!(states.has_changed().unwrap());
    {
        let state = states.borrow_and_update();
        let item = state.get(ResourceKind::Routes, "1").unwrap();
        assert_eq!(item.value["uri"], "/a");
        assert_eq!(item.mod_revision, rev);
        assert_eq!(state.revision, rev);
    }
    store
        .put(
            "/apisix/upstreams/u",
            br#"{"nodes":{"127.0.0.1:1":1}}"#.to_vec(),
            None,
        )
        .await
        .unwrap();
    assert!(states
        .borrow_and_update()
        .get(ResourceKind::Upstreams, "u")
        .is_some());

    // Keys the data plane does not compile publish nothing.
    store
        .put("/apisix/gen_id", b"1".to_vec(), None)
        .await
        .unwrap();
    store
        .put("/apisix/routes/", b"init_dir".to_vec(), None)
        .await
        .unwrap();
    assert!(!states.has_changed().unwrap());

    store.delete("/apisix/routes/1").await.unwrap();
    assert!(states
        .borrow_and_update()
        .get(ResourceKind::Routes, "1")
        .is_none());
    store.delete_prefix("/apisix/upstreams/").await.unwrap();
    assert!(states.borrow_and_update().is_empty());
}

#[tokio::test]
async fn reopen_keeps_data_revisions_and_ttls() {
    let dir = tempfile::tempdir().unwrap();
    let (revision, ttl_set_at) = {
        let store = open(dir.path());
        store
            .put("/apisix/routes/1", route("/a"), None)
            .await
            .unwrap();
        store
            .put("/apisix/routes/1", route("/b"), None)
            .await
            .unwrap();
        store
            .put("/apisix/services/s", br#"{"name":"s"}"#.to_vec(), None)
            .await
            .unwrap();
        store
            .put(
                "/apisix/routes/t",
                route("/ttl"),
                Some(Duration::from_secs(2)),
            )
            .await
            .unwrap();
        (store.health().revision, Instant::now())
    };
    let store = open(dir.path());
    assert_eq!(store.health().revision, revision);
    let got = store.get("/apisix/routes/1").await.unwrap().unwrap();
    assert_eq!(got.value, route("/b"));
    assert!(got.create_revision < got.mod_revision);
    let state = store.subscribe().borrow().clone();
    assert_eq!(state.revision, revision);
    assert_eq!(
        state.get(ResourceKind::Routes, "1").unwrap().value["uri"],
        "/b"
    );
    assert!(state.get(ResourceKind::Services, "s").is_some());
    // The next write continues the counter.
    assert_eq!(
        store
            .put("/apisix/gen_id", b"1".to_vec(), None)
            .await
            .unwrap()
            .revision,
        revision + 1
    );

    // The TTL survived the restart too.
    tokio::time::sleep(
        Duration::from_secs(2).saturating_sub(ttl_set_at.elapsed()) + Duration::from_millis(100),
    )
    .await;
    assert_eq!(store.get("/apisix/routes/t").await.unwrap(), None);
}

#[tokio::test]
async fn a_second_open_of_the_same_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _store = open(dir.path());
    let second = EmbeddedStore::open(&dir.path().join("data/ferrisix.redb"), "/apisix");
    assert!(
        matches!(second, Err(StoreError::Unavailable(_))),
        "{second:?}"
    );
}

/// Run as a child process by `acknowledged_writes_survive_kill_9`; does nothing otherwise.
#[test]
fn crash_writer_child() {
    let Ok(path) = std::env::var(CRASH_ENV) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = EmbeddedStore::open(Path::new(&path), "/apisix").unwrap();
        for i in 0..1000 {
            let key = format!("/apisix/routes/{i}");
            store
                .put(&key, route(&format!("/{i}")), None)
                .await
                .unwrap();
            // println! flushes each line: stdout is line-buffered.
            println!("ACK {key}");
        }
        println!("DONE");
    });
}

#[test]
fn acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.redb");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash_writer_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CRASH_ENV, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut acked = Vec::new();
    let mut finished = false;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        // libtest may have printed `test crash_writer_child ... ` on the same line.
        if let Some(key) = line.find("ACK ").map(|at| &line[at + 4..]) {
            acked.push(key.to_owned());
            if acked.len() == 150 {
                // SIGKILL in the middle of the burst.
                child.kill().unwrap();
            }
        } else if line.ends_with("DONE") {
            finished = true;
        }
    }
    child.wait().unwrap();
    assert!(acked.len() >= 150);
    if finished {
        eprintln!("note: the writer finished before the kill; the check still holds");
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = EmbeddedStore::open(&path, "/apisix").unwrap();
        let (kvs, revision) = store.list("/apisix/routes/").await.unwrap();
        let present: std::collections::HashSet<_> = kvs.iter().map(|k| k.key.clone()).collect();
        for key in &acked {
            assert!(
                present.contains(key),
                "acknowledged {key} lost after kill -9"
            );
        }
        // Nothing else, except perhaps the put in flight when the kill landed.
        let extra: Vec<_> = kvs
            .iter()
            .filter(|k| !acked.contains(&k.key))
            .map(|k| k.key.as_str())
            .collect();
        assert!(extra.len() <= 1, "unacknowledged keys present: {extra:?}");
        assert_eq!(revision, 1 + kvs.len() as i64);
        let state = store.subscribe().borrow().clone();
        assert_eq!(state.len(), kvs.len());
        // And the store still takes writes.
        store
            .put("/apisix/routes/after", route("/after"), None)
            .await
            .unwrap();
    });
}
