//! Integration tests of what is particular to the embedded (redb) store: reopening (data,
//! revisions and TTLs survive), the single-writer file lock, and durability of acknowledged
//! writes across `kill -9`. What every store must do is in `store_contract.rs`.
//!
//! The crash test re-runs this test binary as the writer: with `FERRISIX_CRASH_WRITER` set, the
//! otherwise empty `crash_writer_child` test writes keys and prints each acknowledged one.

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrisix_config::model::ResourceKind;
use ferrisix_config::store::embedded::EmbeddedStore;
use ferrisix_config::store::{Store, StoreError};
use support::route;

const CRASH_ENV: &str = "FERRISIX_CRASH_WRITER";

fn open(dir: &Path) -> Arc<EmbeddedStore> {
    EmbeddedStore::open(&dir.join("data/ferrisix.redb"), "/apisix").unwrap()
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
        state.get(ResourceKind::Routes, "1").unwrap().value.parse()["uri"],
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

/// The hand-over of a binary upgrade: the old process suspends its store, the new one opens
/// the file and writes; when the old one resumes (its successor went away) it serves what the
/// file holds now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspended_store_lets_a_successor_open_the_file_and_resumes_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let old = open(dir.path());
    old.put("/apisix/routes/1", route("/a"), None)
        .await
        .unwrap();
    let suspended = old.clone();
    tokio::task::spawn_blocking(move || suspended.suspend())
        .await
        .unwrap();
    assert!(matches!(
        old.get("/apisix/routes/1").await,
        Err(StoreError::Unavailable(_))
    ));
    // The data plane keeps the state it had.
    assert!(old
        .subscribe()
        .borrow()
        .get(ResourceKind::Routes, "1")
        .is_some());
    {
        let new = open(dir.path());
        new.put("/apisix/routes/2", route("/b"), None)
            .await
            .unwrap();
    }
    let resumed = old.clone();
    tokio::task::spawn_blocking(move || resumed.resume())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        old.get("/apisix/routes/2").await.unwrap().unwrap().value,
        route("/b")
    );
    assert!(old
        .subscribe()
        .borrow()
        .get(ResourceKind::Routes, "2")
        .is_some());
    let rev = old.health().revision;
    assert_eq!(
        old.put("/apisix/routes/3", route("/c"), None)
            .await
            .unwrap()
            .revision,
        rev + 1
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
