//! The embedded store: ferrisix's own [`Store`] for a single node that runs without etcd, kept
//! durably in one local file with [`redb`].
//!
//! It keeps etcd's semantics so the Admin API behaves the same on both stores: one store-wide
//! revision counter (persisted in the `meta` table, starting at 1 like a fresh etcd), per-key
//! `create_revision`/`mod_revision`, listings in byte-wise key order, compare-and-swap on
//! `mod_revision` (a missing key compares as 0), deletes that return the old value, a prefix
//! delete that costs one revision, and TTLs with etcd's rounding (whole seconds, at least
//! [`MIN_TTL`], as etcd's minimum lease).
//!
//! **Durability.** Every write is in a redb write transaction committed with
//! [`redb::Durability::Immediate`]: `commit()` returns only after the new pages and the commit
//! slot are on disk (fsync), and redb's copy-on-write B-trees never overwrite the last committed
//! state, so a process killed at any instant (`kill -9`, power loss with honest disks) reopens
//! at the last committed transaction. We answer a write only after its commit returned, so an
//! acknowledged write survives a crash; an unacknowledged one is either fully there or absent.
//! Concurrent puts share one transaction (group commit: one fsync for all the writers that
//! queued while the previous commit ran), each with its own revision.
//!
//! **TTL.** The expiry time (wall-clock milliseconds, so it survives restarts) is stored with
//! the value and indexed in the `expiry` table. Reads treat an expired key as absent at once; a
//! background task deletes expired keys (one revision per sweep, like a lease revocation) so the
//! published state and listings converge within [`SWEEP_INTERVAL`].
//!
//! **Threads.** redb calls block, so every operation runs on Tokio's blocking pool. Writes are
//! serialised by one mutex held across commit *and* publish, so the data plane sees states in
//! commit order. Reads use redb's MVCC read transactions and never wait for writers.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use redb::{Database, Durability, ReadableTable, TableDefinition};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{KeyValue, Page, PutOutcome, StateBuilder, Store, StoreError, StoreHealth};
use crate::state::ConfigState;
use by_creation::CreationIndex;

mod by_creation;

/// key → encoded [`Record`].
const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
/// `"revision"` → the store revision.
const META: TableDefinition<&str, i64> = TableDefinition::new("meta");
/// (expiry in Unix ms, key) → (): keys with a TTL, soonest first.
const EXPIRY: TableDefinition<(u64, &str), ()> = TableDefinition::new("expiry");

const REVISION: &str = "revision";

/// etcd's minimum lease TTL with default election settings (`ttl=1` is still readable at 2 s).
pub const MIN_TTL: Duration = Duration::from_secs(2);

/// How often the background task looks for expired keys.
pub const SWEEP_INTERVAL: Duration = Duration::from_millis(250);

/// etcd's default `--max-request-bytes` (1.5 MiB); a bigger value is refused with etcd's text so
/// the Admin API answers the same on both stores.
pub const MAX_VALUE_BYTES: usize = 1536 * 1024;

/// redb's page cache. Its default (1 GiB) ends up holding the whole file, which at 100,000
/// routes is a large part of the node's memory: every page the first load or a write touched
/// stays cached. Pages past this are read again through the kernel's page cache, fast enough
/// for how the store is read (one key per Admin read, a whole-prefix scan only at open and
/// for unpaged lists).
const CACHE_BYTES: usize = 4 * 1024 * 1024;

/// How long [`EmbeddedStore::open`] waits for a previous handle on the same file to close (a
/// restart overlapping the old process, or a sweep still finishing after a drop).
const OPEN_WAIT: Duration = Duration::from_secs(2);

/// Record layout version, so the encoding can change later.
const RECORD_V1: u8 = 1;
const HEADER_LEN: usize = 1 + 8 + 8 + 8;

/// A stored key's metadata and value.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    create_revision: i64,
    mod_revision: i64,
    /// Unix ms after which the key is gone; 0: no TTL.
    expires_at: u64,
    value: Vec<u8>,
}

impl Record {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.value.len());
        out.push(RECORD_V1);
        out.extend_from_slice(&self.create_revision.to_le_bytes());
        out.extend_from_slice(&self.mod_revision.to_le_bytes());
        out.extend_from_slice(&self.expires_at.to_le_bytes());
        out.extend_from_slice(&self.value);
        out
    }

    fn decode(bytes: &[u8]) -> Result<Record, StoreError> {
        if bytes.len() < HEADER_LEN || bytes[0] != RECORD_V1 {
            return Err(StoreError::Unavailable(
                "embedded store: corrupt record".into(),
            ));
        }
        let word = |at: usize| <[u8; 8]>::try_from(&bytes[at..at + 8]).expect("8 bytes");
        Ok(Record {
            create_revision: i64::from_le_bytes(word(1)),
            mod_revision: i64::from_le_bytes(word(9)),
            expires_at: u64::from_le_bytes(word(17)),
            value: bytes[HEADER_LEN..].to_vec(),
        })
    }

    fn live(&self, now: u64) -> bool {
        self.expires_at == 0 || self.expires_at > now
    }

    fn to_kv(&self, key: &str) -> KeyValue {
        KeyValue {
            key: key.to_owned(),
            value: self.value.clone(),
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
        }
    }
}

/// Wall-clock milliseconds: expiry times must survive a restart, which a monotonic clock
/// does not.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// etcd leases are whole seconds, and the server raises short ones to its minimum.
fn ttl_ms(ttl: Duration) -> u64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    secs.max(MIN_TTL.as_secs()) * 1000
}

fn db_err(e: impl Into<redb::Error>) -> StoreError {
    StoreError::Unavailable(format!("embedded store: {}", e.into()))
}

fn check_key(key: &str) -> Result<(), StoreError> {
    if key.is_empty() {
        return Err(StoreError::Invalid("key is empty".into()));
    }
    Ok(())
}

/// A put waiting for a group commit, with where to send its answer.
struct QueuedPut {
    key: String,
    value: Vec<u8>,
    ttl: Option<Duration>,
    expected: Option<i64>,
    done: mpsc::SyncSender<Result<PutOutcome, StoreError>>,
}

/// The state shared by the handle, blocking calls and the sweeper.
struct Core {
    /// `None` while suspended: a successor process holds the file.
    db: RwLock<Option<Database>>,
    path: PathBuf,
    prefix: String,
    /// Serialises writes and publishes in commit order.
    writer: Mutex<StateBuilder>,
    /// Puts waiting for the next group commit.
    queue: Mutex<Vec<QueuedPut>>,
    /// The keys under the prefix by directory in creation order (paged lists); changed with
    /// the writer lock held, after each commit.
    by_creation: Mutex<CreationIndex>,
    states: watch::Sender<Arc<ConfigState>>,
    revision: AtomicI64,
    /// The soonest expiry in the `expiry` table (u64::MAX: none), so idle sweeps cost nothing.
    next_expiry: AtomicU64,
}

/// ferrisix's single-node persistent store. See the module documentation.
pub struct EmbeddedStore {
    core: Arc<Core>,
    sweeper: JoinHandle<()>,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore")
            .field("path", &self.core.path)
            .field("prefix", &self.core.prefix)
            .field("revision", &self.core.revision.load(Ordering::Relaxed))
            .finish()
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        self.sweeper.abort();
    }
}

impl EmbeddedStore {
    /// Opens (creating it and its directory if needed) the database at `path`, loads every key
    /// under `prefix` into the first published state, and starts the TTL sweeper.
    ///
    /// Must be called inside a Tokio runtime (the sweeper is spawned on it). It blocks while the
    /// file opens — after a crash redb repairs it first, which can take a moment on a large
    /// file — so call it at start-up or from `spawn_blocking`. Fails if another process holds
    /// the file.
    pub fn open(path: &Path, prefix: &str) -> Result<Arc<EmbeddedStore>, StoreError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            StoreError::Invalid("EmbeddedStore::open must be called inside a Tokio runtime".into())
        })?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                StoreError::Unavailable(format!("cannot create {}: {e}", dir.display()))
            })?;
        }
        let db = open_db(path)?;
        let prefix = prefix.trim_end_matches('/').to_owned();

        // Create the tables so read transactions never meet a missing one.
        let txn = db.begin_write().map_err(db_err)?;
        {
            let mut meta = txn.open_table(META).map_err(db_err)?;
            if meta.get(REVISION).map_err(db_err)?.is_none() {
                meta.insert(REVISION, 1).map_err(db_err)?;
            }
            txn.open_table(KV).map_err(db_err)?;
            txn.open_table(EXPIRY).map_err(db_err)?;
        }
        txn.commit().map_err(db_err)?;

        let (kvs, revision) = list_in(&db, &prefix)?;
        let mut builder = StateBuilder::new(prefix.clone());
        builder.reset(&kvs, revision);
        let mut by_creation = CreationIndex::default();
        for kv in &kvs {
            by_creation.insert(&kv.key, kv.create_revision);
        }
        let (states, _) = watch::channel(builder.snapshot());
        let core = Arc::new(Core {
            next_expiry: AtomicU64::new(first_expiry(&db)?),
            db: RwLock::new(Some(db)),
            path: path.to_owned(),
            prefix,
            writer: Mutex::new(builder),
            queue: Mutex::new(Vec::new()),
            by_creation: Mutex::new(by_creation),
            states,
            revision: AtomicI64::new(revision),
        });
        tracing::info!(
            path = %path.display(),
            revision,
            resources = core.writer().state().len(),
            "embedded store opened"
        );
        // The sweeper holds a weak reference so dropping the store closes the file.
        let sweeper = runtime.spawn(sweep_loop(Arc::downgrade(&core)));
        Ok(Arc::new(EmbeddedStore { core, sweeper }))
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.core.path
    }

    /// The current store revision.
    pub fn revision(&self) -> i64 {
        self.core.revision.load(Ordering::SeqCst)
    }

    /// Closes the file so that a successor process can open it (a binary upgrade or restart
    /// handing over): calls fail with [`StoreError::Unavailable`] until [`EmbeddedStore::resume`];
    /// the published state stays. Waits for a write in progress. Blocking.
    pub fn suspend(&self) {
        let _writer = self.core.writer();
        let db = self
            .core
            .db
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(db);
        tracing::info!(path = %self.core.path.display(), "embedded store closed for a successor");
    }

    /// Reopens the file after [`EmbeddedStore::suspend`] (the successor went away) and
    /// republishes what it holds, in case the successor changed it meanwhile. Blocking.
    pub fn resume(&self) -> Result<(), StoreError> {
        let mut builder = self.core.writer();
        let db = open_db(&self.core.path)?;
        let (kvs, revision) = list_in(&db, &self.core.prefix)?;
        self.core
            .next_expiry
            .store(first_expiry(&db)?, Ordering::SeqCst);
        *self.core.db.write().unwrap_or_else(|e| e.into_inner()) = Some(db);
        let before = builder.state().resources.clone();
        builder.reset(&kvs, revision);
        let mut by_creation = self.core.by_creation();
        by_creation.clear();
        for kv in &kvs {
            by_creation.insert(&kv.key, kv.create_revision);
        }
        drop(by_creation);
        let changed = builder.state().resources != before;
        self.core.publish(&builder, changed, revision);
        tracing::info!(path = %self.core.path.display(), revision, "embedded store reopened");
        Ok(())
    }
}

fn open_db(path: &Path) -> Result<Database, StoreError> {
    let deadline = Instant::now() + OPEN_WAIT;
    loop {
        match Database::builder().set_cache_size(CACHE_BYTES).create(path) {
            Ok(db) => return Ok(db),
            Err(redb::DatabaseError::DatabaseAlreadyOpen) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                return Err(StoreError::Unavailable(format!(
                    "cannot open the embedded store {}: {e}",
                    path.display()
                )))
            }
        }
    }
}

/// Every live key starting with `prefix`, in key order, and the revision of the read.
fn list_in(db: &Database, prefix: &str) -> Result<(Vec<KeyValue>, i64), StoreError> {
    let now = now_ms();
    let txn = db.begin_read().map_err(db_err)?;
    let revision = txn
        .open_table(META)
        .map_err(db_err)?
        .get(REVISION)
        .map_err(db_err)?
        .map(|v| v.value())
        .unwrap_or(1);
    let table = txn.open_table(KV).map_err(db_err)?;
    let mut out = Vec::new();
    // `&str` keys sort byte-wise, like etcd's; stop at the first key past the prefix.
    for entry in table.range(prefix..).map_err(db_err)? {
        let (k, v) = entry.map_err(db_err)?;
        let key = k.value();
        if !key.starts_with(prefix) {
            break;
        }
        let record = Record::decode(v.value())?;
        if record.live(now) {
            out.push(record.to_kv(key));
        }
    }
    Ok((out, revision))
}

fn first_expiry(db: &Database) -> Result<u64, StoreError> {
    let txn = db.begin_read().map_err(db_err)?;
    let table = txn.open_table(EXPIRY).map_err(db_err)?;
    let first = table.first().map_err(db_err)?;
    Ok(first.map(|(k, _)| k.value().0).unwrap_or(u64::MAX))
}

impl Core {
    fn writer(&self) -> MutexGuard<'_, StateBuilder> {
        // A panic while holding it leaves the builder consistent with the last commit (the
        // builder is only touched after a commit succeeded), so carrying on is safe.
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the open database.
    fn with_db<T>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let db = self.db.read().unwrap_or_else(|e| e.into_inner());
        match db.as_ref() {
            Some(db) => f(db),
            None => Err(StoreError::Unavailable(
                "embedded store: closed while a successor process takes over".into(),
            )),
        }
    }

    fn begin_write(&self) -> Result<redb::WriteTransaction, StoreError> {
        let mut txn = self.with_db(|db| db.begin_write().map_err(db_err))?;
        // The default, stated because the crash guarantee depends on it.
        txn.set_durability(Durability::Immediate);
        Ok(txn)
    }

    /// Publishes the builder's state when `changed`; called with the writer lock held.
    fn publish(&self, builder: &StateBuilder, changed: bool, revision: i64) {
        self.revision.store(revision, Ordering::SeqCst);
        if changed {
            self.states.send_replace(builder.snapshot());
        }
    }

    fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let txn = self.with_db(|db| db.begin_read().map_err(db_err))?;
        let table = txn.open_table(KV).map_err(db_err)?;
        let Some(v) = table.get(key).map_err(db_err)? else {
            return Ok(None);
        };
        let record = Record::decode(v.value())?;
        Ok(record.live(now_ms()).then(|| record.to_kv(key)))
    }

    /// Puts `key`. Concurrent puts are committed in groups: each queues itself and takes the
    /// writer lock, and whoever gets the lock commits everything queued by then in one
    /// transaction (one fsync), so writers waiting on a commit share the next one. Every put
    /// still gets its own revision, and is answered only after the commit that holds it
    /// returned, so an acknowledged write is on disk.
    fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
        expected: Option<i64>,
    ) -> Result<PutOutcome, StoreError> {
        check_key(key)?;
        if value.len() > MAX_VALUE_BYTES {
            return Err(StoreError::Invalid(
                "etcdserver: request is too large".into(),
            ));
        }
        let (done, outcome) = mpsc::sync_channel(1);
        self.queued().push(QueuedPut {
            key: key.to_owned(),
            value,
            ttl,
            expected,
            done,
        });
        let mut builder = self.writer();
        // A leader that held the lock before us may have committed this put already: it
        // answers before it lets the lock go.
        if let Ok(answer) = outcome.try_recv() {
            return answer;
        }
        let group = std::mem::take(&mut *self.queued());
        self.commit_puts(&mut builder, group);
        drop(builder);
        outcome.recv().unwrap_or_else(|_| {
            Err(StoreError::Unavailable(
                "embedded store: the write was not answered".into(),
            ))
        })
    }

    fn by_creation(&self) -> MutexGuard<'_, CreationIndex> {
        // Every change to it is a single insert or remove: a panic leaves it whole.
        self.by_creation.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One page of `dir` from the creation index, the values read from the file. `None`
    /// while an expired key may still be in the index (the sweeper has not removed it yet):
    /// the total would count it.
    fn list_page(
        &self,
        dir: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Option<Page>, StoreError> {
        let now = now_ms();
        if self.next_expiry.load(Ordering::SeqCst) <= now {
            return Ok(None);
        }
        let (keys, total) = self.by_creation().page(dir, offset, limit);
        let txn = self.with_db(|db| db.begin_read().map_err(db_err))?;
        let table = txn.open_table(KV).map_err(db_err)?;
        let mut kvs = Vec::with_capacity(keys.len());
        for key in keys {
            // A key deleted since the index was read is left out of this page.
            if let Some(v) = table.get(key.as_str()).map_err(db_err)? {
                let record = Record::decode(v.value())?;
                if record.live(now) {
                    kvs.push(record.to_kv(&key));
                }
            }
        }
        Ok(Some(Page { kvs, total }))
    }

    fn queued(&self) -> MutexGuard<'_, Vec<QueuedPut>> {
        // Pushing and taking cannot leave the queue half-changed.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Commits a group of puts in one transaction (with the writer lock held) and answers
    /// each. A put whose compare-and-swap fails is answered `Conflict` and changes nothing;
    /// a failed transaction fails every put in it.
    fn commit_puts(&self, builder: &mut StateBuilder, group: Vec<QueuedPut>) {
        if group.is_empty() {
            return;
        }
        // Per put: what it replaced (if live), the new record, and the create revision of the
        // record it overwrote, live or expired (for the creation index).
        type Answer = Result<(Option<KeyValue>, Record, Option<i64>), StoreError>;
        let mut answers: Vec<Answer> = Vec::with_capacity(group.len());
        let committed = (|| -> Result<i64, StoreError> {
            let now = now_ms();
            let txn = self.begin_write()?;
            let revision = {
                let mut kv = txn.open_table(KV).map_err(db_err)?;
                let mut meta = txn.open_table(META).map_err(db_err)?;
                let mut expiry = txn.open_table(EXPIRY).map_err(db_err)?;
                let mut revision = meta.get(REVISION).map_err(db_err)?.map_or(1, |v| v.value());
                for put in &group {
                    let key = put.key.as_str();
                    // Later puts of the group read the earlier ones (the transaction's own
                    // writes), exactly as if they had been committed one by one.
                    let old = match kv.get(key).map_err(db_err)? {
                        Some(v) => Some(Record::decode(v.value())?),
                        None => None,
                    };
                    let previous = old.as_ref().filter(|r| r.live(now));
                    if let Some(expected) = put.expected {
                        if previous.map_or(0, |r| r.mod_revision) != expected {
                            answers.push(Err(StoreError::Conflict));
                            continue;
                        }
                    }
                    if let Some(old) = old.as_ref().filter(|r| r.expires_at != 0) {
                        expiry.remove((old.expires_at, key)).map_err(db_err)?;
                    }
                    revision += 1;
                    let record = Record {
                        create_revision: previous.map_or(revision, |r| r.create_revision),
                        mod_revision: revision,
                        expires_at: put.ttl.map_or(0, |t| now + ttl_ms(t)),
                        value: put.value.clone(),
                    };
                    kv.insert(key, record.encode().as_slice()).map_err(db_err)?;
                    if record.expires_at != 0 {
                        expiry
                            .insert((record.expires_at, key), ())
                            .map_err(db_err)?;
                    }
                    let overwritten = old.as_ref().map(|r| r.create_revision);
                    answers.push(Ok((previous.map(|r| r.to_kv(key)), record, overwritten)));
                }
                meta.insert(REVISION, revision).map_err(db_err)?;
                revision
            };
            txn.commit().map_err(db_err)?;
            Ok(revision)
        })();
        let revision = match committed {
            Ok(r) => r,
            Err(e) => {
                for put in group {
                    let _ = put.done.send(Err(e.clone()));
                }
                return;
            }
        };
        let mut changed = false;
        let mut by_creation = self.by_creation();
        for (put, answer) in group.iter().zip(&answers) {
            if let Ok((_, record, overwritten)) = answer {
                by_creation.replace(&put.key, *overwritten, record.create_revision);
                if record.expires_at != 0 {
                    self.next_expiry
                        .fetch_min(record.expires_at, Ordering::SeqCst);
                }
                changed |=
                    builder.apply(&put.key, Some(&record.to_kv(&put.key)), record.mod_revision);
            }
        }
        drop(by_creation);
        self.publish(builder, changed, revision);
        for (put, answer) in group.into_iter().zip(answers) {
            let answer = answer.map(|(previous, record, _)| PutOutcome {
                previous,
                revision: record.mod_revision,
            });
            // A writer that gave up waiting is gone; its put is committed all the same.
            let _ = put.done.send(answer);
        }
    }

    fn delete(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        check_key(key)?;
        let mut builder = self.writer();
        let now = now_ms();
        let txn = self.begin_write()?;
        let (previous, revision) = {
            let mut kv = txn.open_table(KV).map_err(db_err)?;
            let old = match kv.get(key).map_err(db_err)? {
                Some(v) => Record::decode(v.value())?,
                None => return Ok(None),
            };
            // An expired key is already gone for readers; the sweeper removes it.
            if !old.live(now) {
                return Ok(None);
            }
            let mut meta = txn.open_table(META).map_err(db_err)?;
            let mut expiry = txn.open_table(EXPIRY).map_err(db_err)?;
            kv.remove(key).map_err(db_err)?;
            if old.expires_at != 0 {
                expiry.remove((old.expires_at, key)).map_err(db_err)?;
            }
            let revision = meta.get(REVISION).map_err(db_err)?.map_or(1, |v| v.value()) + 1;
            meta.insert(REVISION, revision).map_err(db_err)?;
            (old.to_kv(key), revision)
        };
        txn.commit().map_err(db_err)?;
        self.by_creation().remove(key, previous.create_revision);
        let changed = builder.apply(key, None, revision);
        self.publish(&builder, changed, revision);
        Ok(Some(previous))
    }

    /// Deletes the keys `select` picks (it reads them in the write transaction, so nothing
    /// changes in between) under one new revision; returns how many. Used for prefix deletes
    /// (live keys) and TTL sweeps (expired keys).
    fn delete_where(
        &self,
        select: impl FnOnce(&redb::WriteTransaction, u64) -> Result<Vec<(String, Record)>, StoreError>,
    ) -> Result<u64, StoreError> {
        let mut builder = self.writer();
        let now = now_ms();
        let txn = self.begin_write()?;
        let doomed = select(&txn, now)?;
        if doomed.is_empty() {
            return Ok(0);
        }
        let revision = {
            let mut kv = txn.open_table(KV).map_err(db_err)?;
            let mut meta = txn.open_table(META).map_err(db_err)?;
            let mut expiry = txn.open_table(EXPIRY).map_err(db_err)?;
            for (key, record) in &doomed {
                kv.remove(key.as_str()).map_err(db_err)?;
                if record.expires_at != 0 {
                    expiry
                        .remove((record.expires_at, key.as_str()))
                        .map_err(db_err)?;
                }
            }
            let revision = meta.get(REVISION).map_err(db_err)?.map_or(1, |v| v.value()) + 1;
            meta.insert(REVISION, revision).map_err(db_err)?;
            revision
        };
        txn.commit().map_err(db_err)?;
        let mut changed = false;
        let mut by_creation = self.by_creation();
        for (key, record) in &doomed {
            by_creation.remove(key, record.create_revision);
            changed |= builder.apply(key, None, revision);
        }
        drop(by_creation);
        self.publish(&builder, changed, revision);
        Ok(doomed.len() as u64)
    }

    fn delete_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        self.delete_where(|txn, now| {
            let kv = txn.open_table(KV).map_err(db_err)?;
            let mut doomed = Vec::new();
            for entry in kv.range(prefix..).map_err(db_err)? {
                let (k, v) = entry.map_err(db_err)?;
                if !k.value().starts_with(prefix) {
                    break;
                }
                let record = Record::decode(v.value())?;
                if record.live(now) {
                    doomed.push((k.value().to_owned(), record));
                }
            }
            Ok(doomed)
        })
    }

    /// Deletes every expired key; returns how many.
    fn sweep(&self) -> Result<u64, StoreError> {
        let removed = self.delete_where(|txn, now| {
            let kv = txn.open_table(KV).map_err(db_err)?;
            let expiry = txn.open_table(EXPIRY).map_err(db_err)?;
            let mut doomed = Vec::new();
            for entry in expiry.range((0u64, "")..(now + 1, "")).map_err(db_err)? {
                let (k, _) = entry.map_err(db_err)?;
                let (at, key) = k.value();
                let Some(v) = kv.get(key).map_err(db_err)? else {
                    continue;
                };
                let record = Record::decode(v.value())?;
                if record.expires_at == at && !record.live(now) {
                    doomed.push((key.to_owned(), record));
                }
            }
            Ok(doomed)
        })?;
        self.next_expiry
            .store(self.with_db(first_expiry)?, Ordering::SeqCst);
        Ok(removed)
    }
}

async fn sweep_loop(core: Weak<Core>) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(core) = core.upgrade() else { return };
        let suspended = core.db.read().map_or(true, |db| db.is_none());
        if suspended || core.next_expiry.load(Ordering::SeqCst) > now_ms() {
            continue;
        }
        let result = tokio::task::spawn_blocking(move || core.sweep()).await;
        match result {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::debug!(keys = n, "embedded store: expired keys removed"),
            Ok(Err(e)) => tracing::warn!("embedded store: TTL sweep failed: {e}"),
            Err(e) => tracing::warn!("embedded store: TTL sweep task failed: {e}"),
        }
    }
}

/// Runs a blocking store call on Tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Unavailable(format!("embedded store task failed: {e}")))?
}

#[async_trait]
impl Store for EmbeddedStore {
    fn prefix(&self) -> &str {
        &self.core.prefix
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let (core, key) = (Arc::clone(&self.core), key.to_owned());
        blocking(move || core.get(&key)).await
    }

    async fn list(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64), StoreError> {
        let (core, prefix) = (Arc::clone(&self.core), prefix.to_owned());
        blocking(move || core.with_db(|db| list_in(db, &prefix))).await
    }

    async fn list_page(
        &self,
        dir: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Option<Page>, StoreError> {
        let (core, dir) = (Arc::clone(&self.core), dir.to_owned());
        blocking(move || core.list_page(&dir, offset, limit)).await
    }

    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> Result<PutOutcome, StoreError> {
        let (core, key) = (Arc::clone(&self.core), key.to_owned());
        blocking(move || core.put(&key, value, ttl, None)).await
    }

    async fn put_if_unmodified(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: i64,
        ttl: Option<Duration>,
    ) -> Result<PutOutcome, StoreError> {
        let (core, key) = (Arc::clone(&self.core), key.to_owned());
        blocking(move || core.put(&key, value, ttl, Some(expected))).await
    }

    async fn delete(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let (core, key) = (Arc::clone(&self.core), key.to_owned());
        blocking(move || core.delete(&key)).await
    }

    async fn delete_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        let (core, prefix) = (Arc::clone(&self.core), prefix.to_owned());
        blocking(move || core.delete_prefix(&prefix)).await
    }

    fn subscribe(&self) -> watch::Receiver<Arc<ConfigState>> {
        self.core.states.subscribe()
    }

    fn health(&self) -> StoreHealth {
        StoreHealth {
            reachable: true,
            synced: true,
            revision: self.core.revision.load(Ordering::SeqCst),
            detail: format!("embedded store {}", self.core.path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips() {
        let r = Record {
            create_revision: 3,
            mod_revision: -4,
            expires_at: 99,
            value: b"{\"a\":1}".to_vec(),
        };
        assert_eq!(Record::decode(&r.encode()).unwrap(), r);
        assert!(Record::decode(&[RECORD_V1, 0]).is_err());
        assert!(
            Record::decode(&[9; HEADER_LEN]).is_err(),
            "an unknown layout is refused"
        );
    }

    #[test]
    fn ttl_rounds_up_to_whole_seconds_with_etcds_minimum() {
        assert_eq!(ttl_ms(Duration::from_secs(1)), 2000);
        assert_eq!(ttl_ms(Duration::ZERO), 2000);
        assert_eq!(ttl_ms(Duration::from_millis(2001)), 3000);
        assert_eq!(ttl_ms(Duration::from_secs(60)), 60_000);
    }

    #[test]
    fn liveness_follows_expiry() {
        let mut r = Record {
            create_revision: 1,
            mod_revision: 1,
            expires_at: 0,
            value: vec![],
        };
        assert!(r.live(u64::MAX));
        r.expires_at = 10;
        assert!(r.live(9));
        assert!(!r.live(10));
    }

    #[test]
    fn concurrent_puts_commit_in_groups_each_with_its_own_revision() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let store = rt
            .block_on(async { EmbeddedStore::open(&dir.path().join("db"), "/apisix") })
            .unwrap();
        let core = store.core.clone();
        let writers: Vec<_> = (0..16)
            .map(|w| {
                let core = core.clone();
                std::thread::spawn(move || {
                    (0..40)
                        .map(|i| {
                            let key = format!("/apisix/routes/{w}-{i}");
                            let put = core.put(&key, b"{}".to_vec(), None, None).unwrap();
                            assert!(put.previous.is_none());
                            // A compare-and-swap on what was just written wins; a stale one loses.
                            let again = core
                                .put(&key, b"{\"a\":1}".to_vec(), None, Some(put.revision))
                                .unwrap();
                            assert_eq!(again.previous.unwrap().mod_revision, put.revision);
                            let stale = core.put(&key, b"{}".to_vec(), None, Some(put.revision));
                            assert_eq!(stale.unwrap_err(), StoreError::Conflict);
                            vec![put.revision, again.revision]
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut revisions: Vec<i64> = writers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .flatten()
            .collect();
        revisions.sort_unstable();
        let n = revisions.len();
        revisions.dedup();
        assert_eq!(revisions.len(), n, "every put has its own revision");
        assert_eq!(revisions.first(), Some(&2));
        assert_eq!(
            revisions.last(),
            Some(&(n as i64 + 1)),
            "no revision is skipped"
        );
        assert_eq!(core.writer().state().len(), 16 * 40);
        // What was acknowledged is in the file.
        let (kvs, revision) = core.with_db(|db| list_in(db, "/apisix")).unwrap();
        assert_eq!((kvs.len(), revision), (16 * 40, n as i64 + 1));
        assert!(kvs.iter().all(|kv| kv.value == b"{\"a\":1}"));
    }

    #[test]
    fn pages_are_read_from_the_creation_index_and_match_the_whole_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let names =
            |page: &Page| -> Vec<String> { page.kvs.iter().map(|kv| kv.key.clone()).collect() };
        // Every page of `dir`, as listing the whole directory and sorting it gives.
        let by_listing = |core: &Core, dir: &str, offset: usize, limit: usize| {
            let (mut kvs, _) = core.with_db(|db| list_in(db, dir)).unwrap();
            kvs.retain(|kv| kv.key.len() > dir.len() && !kv.key[dir.len()..].contains('/'));
            kvs.sort_by_key(|kv| kv.create_revision);
            let total = kvs.len();
            let page = kvs.into_iter().skip(offset).take(limit).collect();
            Page { kvs: page, total }
        };
        rt.block_on(async {
            let store = EmbeddedStore::open(&path, "/apisix").unwrap();
            let core = store.core.clone();
            core.put("/apisix/routes/", b"init_dir".to_vec(), None, None)
                .unwrap();
            for i in (0..30).rev() {
                core.put(
                    &format!("/apisix/routes/{i:02}"),
                    b"{}".to_vec(),
                    None,
                    None,
                )
                .unwrap();
            }
            core.put("/apisix/consumers/u", b"{}".to_vec(), None, None)
                .unwrap();
            core.put(
                "/apisix/consumers/u/credentials/c",
                b"{}".to_vec(),
                None,
                None,
            )
            .unwrap();
            // An update keeps its place; a delete and re-create moves to the end.
            core.put("/apisix/routes/29", b"{\"a\":1}".to_vec(), None, None)
                .unwrap();
            core.delete("/apisix/routes/28").unwrap();
            core.put("/apisix/routes/28", b"{}".to_vec(), None, None)
                .unwrap();
            core.delete("/apisix/routes/10").unwrap();
            core.delete_prefix("/apisix/routes/0").unwrap();

            let page = store
                .list_page("/apisix/routes/", 0, 10)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(page.total, 19);
            assert_eq!(
                names(&page)[..3],
                [
                    "/apisix/routes/29",
                    "/apisix/routes/27",
                    "/apisix/routes/26"
                ]
            );
            assert_eq!(page.kvs[0].value, b"{\"a\":1}");
            for offset in [0, 5, 10, 18, 19, 40] {
                let got = store
                    .list_page("/apisix/routes/", offset, 10)
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(
                    got,
                    by_listing(&core, "/apisix/routes/", offset, 10),
                    "{offset}"
                );
            }
            let last = store
                .list_page("/apisix/routes/", 18, 10)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(names(&last), ["/apisix/routes/28"]);
            let consumers = store
                .list_page("/apisix/consumers/", 0, 10)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(
                (names(&consumers), consumers.total),
                (vec!["/apisix/consumers/u".to_owned()], 1)
            );
            let none = store
                .list_page("/apisix/upstreams/", 0, 10)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(none.total, 0);

            // A key with a TTL that has expired but is not swept yet: the caller lists instead.
            core.put(
                "/apisix/routes/ttl",
                b"{}".to_vec(),
                Some(Duration::from_secs(1)),
                None,
            )
            .unwrap();
            assert_eq!(
                store
                    .list_page("/apisix/routes/", 0, 10)
                    .await
                    .unwrap()
                    .unwrap()
                    .total,
                20
            );
            // Called directly: awaiting would let the sweeper run and move `next_expiry` on.
            core.next_expiry.store(now_ms(), Ordering::SeqCst);
            assert_eq!(core.list_page("/apisix/routes/", 0, 10).unwrap(), None);
            core.delete("/apisix/routes/ttl").unwrap();
            core.next_expiry.store(u64::MAX, Ordering::SeqCst);
            drop(core);
            drop(store);

            // Reopened: the index is built from the file, in the same order.
            let store = EmbeddedStore::open(&path, "/apisix").unwrap();
            for offset in [0, 10] {
                let got = store
                    .list_page("/apisix/routes/", offset, 10)
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(got, by_listing(&store.core, "/apisix/routes/", offset, 10));
            }
        });
    }
}
