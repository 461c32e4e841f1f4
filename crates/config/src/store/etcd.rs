//! The etcd store: APISIX's own configuration backend, followed the way APISIX's data plane
//! follows it (spec §8.2), and written the way its Admin API writes it.
//!
//! **Following.** At start one range read of `<prefix>/` is applied with
//! [`StateBuilder::reset`] and published, and its header revision remembered. Then a single
//! watch on `<prefix>/` from that revision + 1 (with `prev_kv` and progress notifications)
//! feeds every PUT/DELETE to [`StateBuilder::apply`]; a state is published after each response
//! that changed something. Events at or below the applied revision are dropped, so nothing is
//! applied twice. The watch is re-created from the applied revision + 1 after any break, so
//! nothing is missed either; when etcd cannot serve that (the watch is cancelled with a
//! `compact_revision`), or the history went backwards (a header revision below ours, or another
//! cluster id: etcd restored or rebuilt), the prefix is listed again. A re-list keeps the `Arc`
//! of every unchanged item, so only real changes reach the data plane.
//!
//! **Failures.** The store talks to one endpoint at a time (tonic's balancer would keep sending
//! requests to a dead member). A broken connection or watch moves to the next endpoint with a
//! fresh client, at once while other endpoints are left to try, then with exponential backoff
//! ([`BACKOFF_START`] to [`BACKOFF_MAX`]) after each full round. A watch that
//! says nothing for `watch_timeout` (we ask etcd for a progress report halfway) is treated as
//! broken: a half-open TCP connection would otherwise stall updates forever. Meanwhile the last
//! published state stays (the data plane keeps serving), and writes fail with
//! [`StoreError::Unavailable`] carrying etcd's error text within `timeout`.
//!
//! **Local copy.** Every state published from etcd is also written, atomically (temporary file
//! then rename), to a local file. If etcd cannot be reached at start, the store boots from that
//! copy, reports `synced: false`, and converges by re-listing as soon as etcd answers.
//!
//! **TLS.** `https://` endpoints use rustls: the server certificate is verified against the CA
//! file given to [`EtcdStore::connect_with_ca`] (APISIX takes it from
//! `apisix.ssl.ssl_trusted_certificate`), else the system's trusted roots (`SSL_CERT_FILE`
//! is honoured); `deployment.etcd.tls.{cert,key}` is the client certificate and `tls.sni` the
//! name verified. `tls.verify: false` is refused: the client cannot switch verification off.
//!
//! Building needs `protoc` (Debian: `protobuf-compiler` and `libprotobuf-dev`) for
//! `etcd-client`'s generated gRPC code.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType, GetOptions, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, WatchOptions, WatchResponse,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{KeyValue, Page, PutOutcome, StateBuilder, Store, StoreError, StoreHealth};
use crate::model::ResourceKind;
use crate::settings::EtcdSettings;
use crate::state::{ConfigState, StoredItem};

/// First reconnect delay; doubled after each failure up to [`BACKOFF_MAX`].
pub const BACKOFF_START: Duration = Duration::from_millis(100);
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How long a page waits for the followed state to reach the revision of its count before
/// it reads etcd's sorted range instead. The watch is normally milliseconds behind; it stays
/// behind only when the newest revision changed keys outside the prefix (another cluster's
/// prefix in the same etcd), until etcd's next progress report.
const STATE_CATCH_UP: Duration = Duration::from_millis(50);

/// etcd's default `--max-txn-ops`: a page's values are read in transactions of at most this
/// many gets.
const MAX_TXN_OPS: usize = 128;

/// Largest gRPC message accepted: a full listing of a big configuration exceeds tonic's 4 MiB
/// default.
const MAX_MESSAGE: usize = 256 * 1024 * 1024;

/// HTTP/2 pings on the shared connection, so writes notice a dead peer. etcd refuses pings
/// more frequent than 5 s (`--grpc-keepalive-min-time`).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// What the local-copy file says it is.
const COPY_FORMAT: &str = "ferrisix-etcd-local-copy/1";

/// Counters of the sync loop, for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Full range reads applied (the first one included).
    pub relists: u64,
    /// Re-lists forced by a watch cancelled for compaction.
    pub compactions: u64,
    /// Sessions that ended in an error and were retried.
    pub reconnects: u64,
    /// Watch events applied.
    pub events: u64,
    /// Watch events dropped because their revision was already applied.
    pub duplicates: u64,
    /// States published.
    pub publishes: u64,
    /// Admin pages read from the followed state (the rest were read from etcd's sorted range).
    pub pages_from_state: u64,
}

#[derive(Default)]
struct Counters {
    relists: AtomicU64,
    compactions: AtomicU64,
    reconnects: AtomicU64,
    events: AtomicU64,
    duplicates: AtomicU64,
    publishes: AtomicU64,
    pages_from_state: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Settings turned into what the client needs.
#[derive(Clone)]
struct Config {
    endpoints: Vec<String>,
    options: ConnectOptions,
    /// `<prefix>` without a trailing slash.
    prefix: String,
    timeout: Duration,
    watch_timeout: Duration,
}

impl Config {
    fn new(settings: &EtcdSettings, trusted_ca: Option<&Path>) -> Result<Config, StoreError> {
        if settings.host.is_empty() {
            return Err(StoreError::Invalid("deployment.etcd.host is empty".into()));
        }
        let https = settings
            .host
            .iter()
            .filter(|h| h.starts_with("https://"))
            .count();
        if let Some(bad) = settings
            .host
            .iter()
            .find(|h| !h.starts_with("http://") && !h.starts_with("https://"))
        {
            return Err(StoreError::Invalid(format!(
                "deployment.etcd.host: {bad} must start with http:// or https://"
            )));
        }
        if https != 0 && https != settings.host.len() {
            return Err(StoreError::Invalid(
                "deployment.etcd.host: mixing http:// and https:// endpoints is not supported"
                    .into(),
            ));
        }
        let timeout = Duration::from_secs(settings.timeout.max(1));
        let mut options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_keep_alive(KEEPALIVE_INTERVAL, timeout)
            // etcd drops connections that ping without an open stream; ours always has the
            // watch, but pinging while idle buys nothing.
            .with_keep_alive_while_idle(false)
            // A member cut off from its leader cancels our watch instead of keeping it silent.
            .with_require_leader(true);
        if let Some(user) = &settings.user {
            options = options
                .with_user(user.clone(), settings.password.clone().unwrap_or_default())
                .with_auto_token_refresh(true);
        }
        if https != 0 {
            options = options.with_tls(tls_options(settings, trusted_ca)?);
        }
        Ok(Config {
            endpoints: settings.host.clone(),
            options,
            prefix: settings.prefix.trim_end_matches('/').to_owned(),
            timeout,
            watch_timeout: Duration::from_secs(settings.watch_timeout.max(1)),
        })
    }

    /// The watched and listed range: the directory under the prefix (not `/apisix2/...`).
    fn dir(&self) -> String {
        format!("{}/", self.prefix)
    }
}

fn tls_options(
    settings: &EtcdSettings,
    trusted_ca: Option<&Path>,
) -> Result<etcd_client::TlsOptions, StoreError> {
    let tls = &settings.tls;
    if !tls.verify {
        return Err(StoreError::Invalid(
            "deployment.etcd.tls.verify: false is not supported: ferrisix always verifies etcd's \
             certificate (against the system's trusted roots)"
                .into(),
        ));
    }
    let read = |p: &Path| {
        std::fs::read(p)
            .map_err(|e| StoreError::Invalid(format!("etcd TLS: cannot read {}: {e}", p.display())))
    };
    let mut options = etcd_client::TlsOptions::new();
    options = match trusted_ca {
        Some(ca) => options.ca_certificate(etcd_client::Certificate::from_pem(read(ca)?)),
        None => options.with_native_roots(),
    };
    if let Some(sni) = &tls.sni {
        options = options.domain_name(sni.clone());
    }
    match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            options = options.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
        }
        (None, None) => {}
        _ => {
            return Err(StoreError::Invalid(
                "deployment.etcd.tls: cert and key must be given together".into(),
            ))
        }
    }
    Ok(options)
}

/// What the store handle, the sync task and the writes share.
struct Shared {
    config: Config,
    /// The current client; replaced by the sync task on every reconnect, so writes use a
    /// fresh connection too. `None` until one could be built (with auth, that needs etcd).
    client: RwLock<Option<Client>>,
    states: watch::Sender<Arc<ConfigState>>,
    /// The etcd revision the published state is known to reflect: of the last listing, of
    /// the last event applied, or of a progress report (after which etcd sends only newer
    /// events). A page read from the state waits for it to reach the revision of its count.
    followed: watch::Sender<i64>,
    /// Keys under a resource directory that are no items of it (`routes/a/b`): the state
    /// does not hold them, and a page of such a directory lists it whole. Kept by the sync
    /// loop with the state, before it says how far it followed.
    nested: Mutex<std::collections::BTreeSet<String>>,
    health: Mutex<StoreHealth>,
    counters: Counters,
    /// States published from etcd, for the local-copy writer.
    copies: watch::Sender<Option<Arc<ConfigState>>>,
    local_copy: Option<PathBuf>,
}

impl Shared {
    fn set_health(&self, f: impl FnOnce(&mut StoreHealth)) {
        f(&mut self.health.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn client(&self) -> Option<Client> {
        self.client
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_client(&self, client: Option<Client>) {
        *self.client.write().unwrap_or_else(|e| e.into_inner()) = client;
    }
}

/// An [`etcd`](https://etcd.io) v3 cluster as the [`Store`]. See the module documentation.
pub struct EtcdStore {
    shared: Arc<Shared>,
    sync_task: JoinHandle<()>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.shared.config.endpoints)
            .field("prefix", &self.shared.config.prefix)
            .field("local_copy", &self.shared.local_copy)
            .finish()
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        // The local-copy writer ends by itself once the last state is written and the shared
        // part (its channel's sender) is gone.
        self.sync_task.abort();
    }
}

impl EtcdStore {
    /// Loads the configuration from etcd and starts following it (see the module
    /// documentation). Must run inside a Tokio runtime.
    ///
    /// An attempt tries each endpoint once (each step bounded by `timeout`). With
    /// `local_copy` naming an existing file, one attempt is made; if it fails the store boots
    /// from the copy, reports `synced: false`, and keeps retrying in the background. Otherwise
    /// `startup_retry` attempts are made (at least one) and the last error is returned. States
    /// published from etcd are written to `local_copy`.
    pub async fn connect(
        settings: &EtcdSettings,
        local_copy: Option<PathBuf>,
    ) -> Result<Arc<EtcdStore>, StoreError> {
        EtcdStore::connect_with_ca(settings, local_copy, None).await
    }

    /// [`EtcdStore::connect`], verifying `https://` endpoints against the CA certificates in
    /// `trusted_ca` (PEM) instead of the system's roots.
    pub async fn connect_with_ca(
        settings: &EtcdSettings,
        local_copy: Option<PathBuf>,
        trusted_ca: Option<&Path>,
    ) -> Result<Arc<EtcdStore>, StoreError> {
        let config = Config::new(settings, trusted_ca)?;
        let (states, _) = watch::channel(Arc::new(ConfigState::default()));
        let (copies, copies_rx) = watch::channel(None);
        let shared = Arc::new(Shared {
            client: RwLock::new(None),
            states,
            followed: watch::channel(0).0,
            nested: Mutex::default(),
            health: Mutex::new(StoreHealth {
                reachable: false,
                synced: false,
                revision: 0,
                detail: "connecting to etcd".into(),
            }),
            counters: Counters::default(),
            copies,
            local_copy: local_copy.clone(),
            config,
        });
        let mut syncer = Syncer::new(Arc::clone(&shared));

        let copy_file = local_copy.as_deref().filter(|p| p.exists());
        let attempts = if copy_file.is_some() {
            1
        } else {
            settings.startup_retry.max(1)
        };
        let mut backoff = Backoff::default();
        let mut last_error = String::new();
        let mut loaded = false;
        for attempt in 1..=attempts {
            match syncer.start().await {
                Ok(()) => {
                    loaded = true;
                    break;
                }
                Err(e) => {
                    tracing::warn!(
                        attempt,
                        attempts,
                        "cannot load the configuration from etcd: {e}"
                    );
                    last_error = e;
                    if attempt < attempts {
                        tokio::time::sleep(backoff.next()).await;
                    }
                }
            }
        }
        if !loaded {
            let endpoints = shared.config.endpoints.join(", ");
            let Some(path) = copy_file else {
                return Err(StoreError::Unavailable(format!(
                    "cannot load the configuration from etcd ({endpoints}): {last_error}"
                )));
            };
            let copy = LocalCopy::read(path).map_err(|e| {
                StoreError::Unavailable(format!(
                    "cannot load the configuration from etcd ({endpoints}): {last_error}; \
                     and the local copy is unusable: {e}"
                ))
            })?;
            if copy.prefix != shared.config.prefix {
                return Err(StoreError::Unavailable(format!(
                    "cannot load the configuration from etcd ({endpoints}): {last_error}; and the \
                     local copy {} holds prefix {}, not {}",
                    path.display(),
                    copy.prefix,
                    shared.config.prefix
                )));
            }
            tracing::warn!(
                path = %path.display(),
                revision = copy.revision,
                "etcd unreachable: serving the local copy of the last applied configuration"
            );
            syncer.boot_from_copy(copy, path, &last_error);
        }

        if let Some(path) = local_copy {
            tokio::spawn(copy_writer(path, shared.config.prefix.clone(), copies_rx));
        }
        let sync_task = tokio::spawn(syncer.run());
        Ok(Arc::new(EtcdStore { shared, sync_task }))
    }

    /// A page from the state the sync loop follows, when it is known to hold what etcd holds
    /// in `dir`: one read of a single key gives etcd's revision (a sorted range reads every
    /// key of the directory, 200 ms at 100,000 routes); once the state is followed through
    /// that revision (normally at once: the watch delivers this node's own writes before
    /// their acknowledgment is read here, and others' within milliseconds), holds no
    /// unreadable item of the directory, and no key further down is known there, the page is
    /// cut from it.
    async fn page_from_state(
        &self,
        dir: &str,
        offset: usize,
        limit: usize,
    ) -> Result<StatePage, StoreError> {
        let prefix = format!("{}/", self.shared.config.prefix);
        let Some(kind) = dir
            .strip_prefix(&prefix)
            .and_then(|d| d.strip_suffix('/'))
            .and_then(ResourceKind::from_dir)
        else {
            return Ok(StatePage::Unknown);
        };
        // etcd's current revision, from the cheapest read there is (one key, counted): a count
        // of the directory walks etcd's index of all its keys (30 ms at 100,000 routes).
        let mut kv = self.client()?.kv_client();
        let response = self
            .call(kv.get(dir, Some(GetOptions::new().with_count_only())))
            .await?;
        let revision = header_revision(response.header());
        let mut followed = self.shared.followed.subscribe();
        let caught_up =
            tokio::time::timeout(STATE_CATCH_UP, followed.wait_for(|r| *r >= revision)).await;
        if !matches!(caught_up, Ok(Ok(_))) {
            return Ok(StatePage::Unknown);
        }
        let state = self.shared.states.borrow().clone();
        let nested = self
            .shared
            .nested
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .range(dir.to_string()..)
            .next()
            .is_some_and(|k| k.starts_with(dir));
        if nested {
            // Keys further down, which the state does not hold: the whole directory.
            return Ok(StatePage::WholeDirectory);
        }
        let items = state.resources.get(&kind);
        let unreadable = state
            .unreadable
            .range((kind, String::new())..)
            .next()
            .is_some_and(|((k, _), _)| *k == kind);
        if unreadable {
            // etcd's range lists such a value as stored.
            return Ok(StatePage::Unknown);
        }
        let total = items.map_or(0, |m| m.len());
        let Some(items) = items else {
            return Ok(StatePage::Page(Page {
                kvs: Vec::new(),
                total,
            }));
        };
        Ok(StatePage::Page(Page {
            kvs: creation_order_page(items.values(), offset, limit)
                .into_iter()
                .map(|item| KeyValue {
                    key: format!("{dir}{}", item.id),
                    value: item.value.text().as_bytes().to_vec(),
                    create_revision: item.create_revision,
                    mod_revision: item.mod_revision,
                })
                .collect(),
            total,
        }))
    }

    /// A page without reading the directory's values: one range of the directory's keys
    /// only, sorted by create revision and cut at the page's end, with its count and the
    /// directory placeholder's in the same transaction; then the page's values by key. etcd
    /// sorts the whole range server-side, but only the keys up to the page's end and the
    /// page's values cross the wire and are parsed.
    async fn page_from_sorted_range(
        &self,
        dir: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Option<Page>, StoreError> {
        let mut kv = self
            .client()?
            .kv_client()
            .max_decoding_message_size(MAX_MESSAGE);
        // One more than the page's end: the placeholder may be among them.
        let window = offset.saturating_add(limit).saturating_add(1);
        let keys = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(i64::try_from(window).unwrap_or(i64::MAX));
        let placeholder = GetOptions::new().with_count_only();
        let txn = Txn::new().and_then([
            TxnOp::get(dir, Some(keys)),
            TxnOp::get(dir, Some(placeholder)),
        ]);
        let responses = self.call(kv.txn(txn)).await?.op_responses();
        let (Some(TxnOpResponse::Get(listed)), Some(TxnOpResponse::Get(own))) =
            (responses.first(), responses.get(1))
        else {
            return Err(StoreError::Unavailable(
                "etcd: unexpected answer to a page's range".into(),
            ));
        };
        let mut names: Vec<(i64, &[u8])> = Vec::with_capacity(listed.kvs().len());
        for kv in listed.kvs() {
            let key = kv.key();
            if key == dir.as_bytes() {
                continue;
            }
            // A key further down is not an item of this directory, and the count above
            // included it: list the directory whole instead.
            if key[dir.len()..].contains(&b'/') {
                return Ok(None);
            }
            names.push((kv.create_revision(), key));
        }
        // Creation order, then key order for keys created in one transaction (etcd leaves
        // their order open), as the embedded store pages.
        names.sort();
        let total = usize::try_from(listed.count() - own.count()).unwrap_or(0);
        let page: Vec<Vec<u8>> = names
            .into_iter()
            .skip(offset)
            .take(limit)
            .map(|(_, key)| key.to_vec())
            .collect();
        let mut kvs = Vec::with_capacity(page.len());
        for chunk in page.chunks(MAX_TXN_OPS) {
            let gets: Vec<TxnOp> = chunk.iter().map(|k| TxnOp::get(k.clone(), None)).collect();
            let responses = self.call(kv.txn(Txn::new().and_then(gets))).await?;
            for response in responses.op_responses() {
                // A key deleted since the range was read is left out of this page.
                if let TxnOpResponse::Get(got) = response {
                    kvs.extend(got.kvs().first().map(kv_of));
                }
            }
        }
        Ok(Some(Page { kvs, total }))
    }

    /// The sync loop's counters.
    pub fn stats(&self) -> SyncStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SyncStats {
            relists: get(&c.relists),
            compactions: get(&c.compactions),
            reconnects: get(&c.reconnects),
            events: get(&c.events),
            duplicates: get(&c.duplicates),
            publishes: get(&c.publishes),
            pages_from_state: get(&c.pages_from_state),
        }
    }

    /// The local-copy file, if one was configured.
    pub fn local_copy(&self) -> Option<&Path> {
        self.shared.local_copy.as_deref()
    }

    fn client(&self) -> Result<Client, StoreError> {
        self.shared.client().ok_or_else(|| {
            let detail = self
                .shared
                .health
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .detail
                .clone();
            StoreError::Unavailable(format!("etcd is not connected: {detail}"))
        })
    }

    /// Runs one request, bounded by `timeout`.
    async fn call<T>(
        &self,
        request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, StoreError> {
        let timeout = self.shared.config.timeout;
        match tokio::time::timeout(timeout, request).await {
            Ok(Ok(v)) => Ok(v),
            // gRPC INVALID_ARGUMENT (3): etcd refused the request itself ("etcdserver: request
            // is too large"), which no retry or other endpoint changes.
            Ok(Err(etcd_client::Error::GRpcStatus(status))) if status.code() as i32 == 3 => {
                Err(StoreError::Invalid(status.message().to_owned()))
            }
            Ok(Err(e)) => Err(StoreError::Unavailable(e.to_string())),
            Err(_) => Err(StoreError::Unavailable(format!(
                "etcd request timed out after {}s",
                timeout.as_secs()
            ))),
        }
    }

    async fn write(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
        expected: Option<i64>,
    ) -> Result<PutOutcome, StoreError> {
        check_key(key)?;
        let mut client = self.client()?;
        self.call(async move {
            let mut options = PutOptions::new().with_prev_key();
            if let Some(ttl) = ttl {
                let lease = client.lease_grant(lease_secs(ttl), None).await?;
                options = options.with_lease(lease.id());
            }
            let Some(expected) = expected else {
                let response = client.put(key, value, Some(options)).await?;
                return Ok(Ok(PutOutcome {
                    previous: response.prev_key().map(kv_of),
                    revision: header_revision(response.header()),
                }));
            };
            let txn = Txn::new()
                .when([Compare::mod_revision(key, CompareOp::Equal, expected)])
                .and_then([TxnOp::put(key, value, Some(options))]);
            let response = client.txn(txn).await?;
            if !response.succeeded() {
                return Ok(Err(StoreError::Conflict));
            }
            let previous = response.op_responses().into_iter().find_map(|r| match r {
                TxnOpResponse::Put(p) => Some(p.prev_key().map(kv_of)),
                _ => None,
            });
            Ok(Ok(PutOutcome {
                previous: previous.flatten(),
                revision: header_revision(response.header()),
            }))
        })
        .await?
    }
}

/// etcd leases are whole seconds (the server raises short ones to its minimum).
fn lease_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

fn check_key(key: &str) -> Result<(), StoreError> {
    if key.is_empty() {
        return Err(StoreError::Invalid("key is empty".into()));
    }
    Ok(())
}

fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> i64 {
    header.map_or(0, |h| h.revision())
}

pub(crate) fn kv_of(kv: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
    }
}

#[async_trait]
impl Store for EtcdStore {
    fn prefix(&self) -> &str {
        &self.shared.config.prefix
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        check_key(key)?;
        let mut client = self.client()?;
        let response = self.call(client.get(key, None)).await?;
        Ok(response.kvs().first().map(kv_of))
    }

    async fn list(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64), StoreError> {
        let mut kv = self
            .client()?
            .kv_client()
            .max_decoding_message_size(MAX_MESSAGE);
        let response = self
            .call(kv.get(prefix, Some(GetOptions::new().with_prefix())))
            .await?;
        // etcd answers in key order.
        Ok((
            response.kvs().iter().map(kv_of).collect(),
            header_revision(response.header()),
        ))
    }

    /// A page in creation order (APISIX's page order), without reading the directory from
    /// etcd when the followed state can say it: see [`EtcdStore::page_from_state`]; else
    /// [`EtcdStore::page_from_sorted_range`].
    async fn list_page(
        &self,
        dir: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Option<Page>, StoreError> {
        // etcd counts a prefix whole: consumers hold their credentials one level down
        // (`consumers/<name>/credentials/<id>`), so their pages need the whole directory.
        if dir.ends_with("/consumers/") || !dir.ends_with('/') {
            return Ok(None);
        }
        match self.page_from_state(dir, offset, limit).await? {
            StatePage::Page(page) => {
                bump(&self.shared.counters.pages_from_state);
                Ok(Some(page))
            }
            StatePage::WholeDirectory => Ok(None),
            StatePage::Unknown => self.page_from_sorted_range(dir, offset, limit).await,
        }
    }

    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> Result<PutOutcome, StoreError> {
        self.write(key, value, ttl, None).await
    }

    async fn put_if_unmodified(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: i64,
        ttl: Option<Duration>,
    ) -> Result<PutOutcome, StoreError> {
        self.write(key, value, ttl, Some(expected)).await
    }

    async fn delete(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        check_key(key)?;
        let mut client = self.client()?;
        let response = self
            .call(client.delete(key, Some(DeleteOptions::new().with_prev_key())))
            .await?;
        Ok(response.prev_kvs().first().map(kv_of))
    }

    async fn delete_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        let mut client = self.client()?;
        let response = self
            .call(client.delete(prefix, Some(DeleteOptions::new().with_prefix())))
            .await?;
        Ok(u64::try_from(response.deleted()).unwrap_or(0))
    }

    fn subscribe(&self) -> watch::Receiver<Arc<ConfigState>> {
        self.shared.states.subscribe()
    }

    fn health(&self) -> StoreHealth {
        self.shared
            .health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: BACKOFF_START,
        }
    }
}

impl Backoff {
    fn next(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        delay
    }
}

/// Why a watch ended without an error.
enum WatchEnd {
    /// The history we follow is gone (compaction, restore): list again.
    Relist,
}

/// The sync loop's own state: only it touches the builder.
struct Syncer {
    shared: Arc<Shared>,
    builder: StateBuilder,
    /// The revision the builder reflects: of the last listing or the last applied event.
    applied: i64,
    /// The cluster the builder's state came from; `None`: list before watching.
    cluster: Option<u64>,
    client: Option<Client>,
    /// Set while serving a local copy, until etcd is listed.
    from_copy: Option<PathBuf>,
    /// When the current session's watch was created (a healthy session resets the backoff).
    watching_since: Option<Instant>,
    /// Index in `endpoints` of the one in use.
    endpoint: usize,
}

impl Syncer {
    fn new(shared: Arc<Shared>) -> Syncer {
        Syncer {
            builder: StateBuilder::new(shared.config.prefix.clone()),
            shared,
            applied: 0,
            cluster: None,
            client: None,
            from_copy: None,
            watching_since: None,
            endpoint: 0,
        }
    }

    fn endpoint(&self) -> &str {
        let endpoints = &self.shared.config.endpoints;
        &endpoints[self.endpoint % endpoints.len()]
    }

    /// Drops the client and moves to the next endpoint.
    fn next_endpoint(&mut self) {
        self.client = None;
        self.endpoint = (self.endpoint + 1) % self.shared.config.endpoints.len();
    }

    fn timeout(&self) -> Duration {
        self.shared.config.timeout
    }

    /// A connected client and the first listing, trying each endpoint once.
    async fn start(&mut self) -> Result<(), String> {
        let mut errors = Vec::new();
        for _ in 0..self.shared.config.endpoints.len() {
            let result = match self.client().await {
                Ok(client) => self.relist(&client).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => return Ok(()),
                Err(e) if self.shared.config.endpoints.len() == 1 => errors.push(e),
                Err(e) => errors.push(format!("{}: {e}", self.endpoint())),
            }
            self.next_endpoint();
        }
        Err(errors.join("; "))
    }

    fn boot_from_copy(&mut self, copy: LocalCopy, path: &Path, error: &str) {
        self.builder.reset(&copy.kvs, copy.revision);
        self.applied = copy.revision;
        self.cluster = None;
        self.from_copy = Some(path.to_owned());
        let snapshot = self.builder.snapshot();
        self.shared.states.send_replace(snapshot);
        bump(&self.shared.counters.publishes);
        self.shared.set_health(|h| {
            *h = StoreHealth {
                reachable: false,
                synced: false,
                revision: copy.revision,
                detail: self.unreachable_detail(error),
            }
        });
    }

    fn unreachable_detail(&self, error: &str) -> String {
        match &self.from_copy {
            Some(path) => format!(
                "serving local copy {} (revision {}); etcd unreachable: {error}",
                path.display(),
                self.builder.state().revision
            ),
            None => format!("etcd unreachable: {error}"),
        }
    }

    /// The session's client, building one (and handing it to writers) if needed.
    async fn client(&mut self) -> Result<Client, String> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let options = self.shared.config.options.clone();
        let connect = Client::connect([self.endpoint()], Some(options));
        let client = match tokio::time::timeout(self.timeout(), connect).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => {
                return Err(format!(
                    "connecting timed out after {}s",
                    self.timeout().as_secs()
                ))
            }
        };
        self.shared.set_client(Some(client.clone()));
        self.client = Some(client.clone());
        Ok(client)
    }

    /// Reads the whole prefix and makes it the state.
    async fn relist(&mut self, client: &Client) -> Result<(), String> {
        let mut kv = client.kv_client().max_decoding_message_size(MAX_MESSAGE);
        let request = kv.get(
            self.shared.config.dir(),
            Some(GetOptions::new().with_prefix()),
        );
        let response = match tokio::time::timeout(self.timeout(), request).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => {
                return Err(format!(
                    "listing timed out after {}s",
                    self.timeout().as_secs()
                ))
            }
        };
        let header = response.header().ok_or("etcd answered without a header")?;
        let (revision, cluster) = (header.revision(), header.cluster_id());
        let kvs: Vec<KeyValue> = response.kvs().iter().map(kv_of).collect();
        let nested = kvs
            .iter()
            .filter(|kv| is_nested(&self.shared.config.prefix, &kv.key))
            .map(|kv| kv.key.clone())
            .collect();
        *self.shared.nested.lock().unwrap_or_else(|e| e.into_inner()) = nested;
        self.builder.reset(&kvs, revision);
        self.applied = revision;
        self.cluster = Some(cluster);
        bump(&self.shared.counters.relists);
        self.from_copy = None;
        // Unchanged items kept their `Arc`s, so this comparison is mostly pointer checks.
        let changed = self.shared.states.borrow().resources != self.builder.state().resources;
        tracing::info!(
            revision,
            keys = kvs.len(),
            changed,
            "loaded the configuration from etcd"
        );
        if changed || self.shared.counters.publishes.load(Ordering::Relaxed) == 0 {
            self.publish();
        }
        self.followed_through(revision);
        let detail = format!("following etcd at {}", self.endpoint());
        self.shared.set_health(|h| {
            *h = StoreHealth {
                reachable: true,
                synced: true,
                revision: self.builder.state().revision,
                detail,
            }
        });
        Ok(())
    }

    /// Records that the published state reflects etcd through `revision`.
    fn followed_through(&self, revision: i64) {
        self.shared.followed.send_if_modified(|r| {
            let newer = revision > *r;
            *r = (*r).max(revision);
            newer
        });
    }

    fn publish(&self) {
        let snapshot = self.builder.snapshot();
        let revision = snapshot.revision;
        self.shared.states.send_replace(Arc::clone(&snapshot));
        self.shared.copies.send_replace(Some(snapshot));
        bump(&self.shared.counters.publishes);
        self.shared.set_health(|h| h.revision = revision);
    }

    /// Follows the prefix from `applied + 1` until the watch breaks (`Err`) or the history
    /// must be re-read.
    async fn watch(&mut self, client: &Client) -> Result<WatchEnd, String> {
        let config = self.shared.config.clone();
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(self.applied + 1)
            .with_prev_key()
            .with_progress_notify();
        let mut watcher = client.watch_client().max_decoding_message_size(MAX_MESSAGE);
        let mut stream =
            match tokio::time::timeout(self.timeout(), watcher.watch(config.dir(), Some(options)))
                .await
            {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return Err(e.to_string()),
                Err(_) => {
                    return Err(format!(
                        "starting the watch timed out after {}s",
                        self.timeout().as_secs()
                    ))
                }
            };
        // Ask for a progress report halfway, so that only a dead watch stays silent.
        let nudge_after = config.watch_timeout / 2;
        let mut last_heard = Instant::now();
        loop {
            let response = match tokio::time::timeout(nudge_after, stream.message()).await {
                Ok(Ok(Some(r))) => r,
                Ok(Ok(None)) => return Err("etcd closed the watch".into()),
                Ok(Err(e)) => return Err(format!("watch failed: {e}")),
                Err(_) => {
                    if last_heard.elapsed() >= config.watch_timeout {
                        return Err(format!(
                            "watch silent for {}s, treated as broken",
                            config.watch_timeout.as_secs()
                        ));
                    }
                    stream
                        .request_progress()
                        .await
                        .map_err(|e| format!("watch failed: {e}"))?;
                    continue;
                }
            };
            last_heard = Instant::now();
            if let Some(end) = self.on_response(&response)? {
                return Ok(end);
            }
        }
    }

    fn on_response(&mut self, response: &WatchResponse) -> Result<Option<WatchEnd>, String> {
        if response.canceled() {
            if response.compact_revision() > 0 {
                bump(&self.shared.counters.compactions);
                tracing::warn!(
                    applied = self.applied,
                    compacted = response.compact_revision(),
                    "etcd compacted the history the watch needed; re-listing"
                );
                return Ok(Some(WatchEnd::Relist));
            }
            return Err(format!(
                "etcd cancelled the watch: {}",
                response.cancel_reason()
            ));
        }
        if let Some(header) = response.header() {
            if self.cluster.is_some_and(|c| c != header.cluster_id()) {
                tracing::warn!("etcd answers for another cluster now; re-listing");
                return Ok(Some(WatchEnd::Relist));
            }
            if header.revision() < self.applied {
                tracing::warn!(
                    applied = self.applied,
                    etcd = header.revision(),
                    "etcd's revision went backwards; re-listing"
                );
                return Ok(Some(WatchEnd::Relist));
            }
        }
        if response.created() && self.watching_since.is_none() {
            self.watching_since = Some(Instant::now());
            let detail = format!("following etcd at {}", self.endpoint());
            self.shared.set_health(|h| {
                h.reachable = true;
                h.detail = detail;
            });
        }
        // All events of one revision come in one response, so the floor is the revision
        // applied before this response (a transaction's events share their revision).
        let floor = self.applied;
        let mut changed = false;
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            let revision = kv.mod_revision();
            if revision <= floor {
                bump(&self.shared.counters.duplicates);
                continue;
            }
            self.applied = self.applied.max(revision);
            bump(&self.shared.counters.events);
            let Ok(key) = std::str::from_utf8(kv.key()) else {
                tracing::warn!("etcd key is not UTF-8; ignored");
                continue;
            };
            if is_nested(&self.shared.config.prefix, key) {
                let mut nested = self.shared.nested.lock().unwrap_or_else(|e| e.into_inner());
                match event.event_type() {
                    EventType::Put => nested.insert(key.to_string()),
                    EventType::Delete => nested.remove(key),
                };
            }
            changed |= match event.event_type() {
                EventType::Put => self.builder.apply(key, Some(&kv_of(kv)), revision),
                EventType::Delete => self.builder.apply(key, None, revision),
            };
        }
        if changed {
            self.publish();
        }
        // A progress report (no events) promises only newer events from here on; a response
        // with events is followed through the newest of them.
        let progress = !response.created() && response.events().is_empty();
        match response.header() {
            Some(header) if progress => self.followed_through(header.revision()),
            _ => self.followed_through(self.applied),
        }
        Ok(None)
    }

    /// One connection's life: list if needed, then watch, until something breaks.
    async fn session(&mut self) -> Result<(), String> {
        let client = self.client().await?;
        loop {
            if self.cluster.is_none() {
                self.relist(&client).await?;
            }
            match self.watch(&client).await? {
                WatchEnd::Relist => self.cluster = None,
            }
        }
    }

    async fn run(mut self) {
        let mut backoff = Backoff::default();
        let mut failures = 0usize;
        loop {
            self.watching_since = None;
            let Err(error) = self.session().await else {
                continue;
            };
            bump(&self.shared.counters.reconnects);
            tracing::warn!(endpoint = self.endpoint(), "etcd: {error}; reconnecting");
            let detail = self.unreachable_detail(&error);
            self.shared.set_health(|h| {
                h.reachable = false;
                h.detail = detail;
            });
            // A new client next time, on the next endpoint: the old connection or member may
            // be the broken part.
            self.next_endpoint();
            if self
                .watching_since
                .is_some_and(|t| t.elapsed() > BACKOFF_MAX)
            {
                backoff = Backoff::default();
                failures = 0;
            }
            failures += 1;
            if failures % self.shared.config.endpoints.len() == 0 {
                tokio::time::sleep(backoff.next()).await;
            }
        }
    }
}

/// The local copy of the last configuration applied from etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalCopy {
    pub prefix: String,
    pub revision: i64,
    /// Resource keys in key order, values as JSON text.
    pub kvs: Vec<KeyValue>,
}

#[derive(Serialize, Deserialize)]
struct CopyFile {
    format: String,
    prefix: String,
    revision: i64,
    items: Vec<CopyItem>,
}

#[derive(Serialize, Deserialize)]
struct CopyItem {
    key: String,
    create_revision: i64,
    mod_revision: i64,
    value: Value,
}

impl LocalCopy {
    /// The resources of `state` (the only keys the data plane uses; they are JSON).
    pub fn from_state(prefix: &str, state: &ConfigState) -> LocalCopy {
        let kvs = keyed_items(prefix, state)
            .into_iter()
            .map(|(key, item)| KeyValue {
                key,
                value: item.value.text().as_bytes().to_vec(),
                create_revision: item.create_revision,
                mod_revision: item.mod_revision,
            })
            .collect();
        LocalCopy {
            prefix: prefix.to_owned(),
            revision: state.revision,
            kvs,
        }
    }

    pub fn read(path: &Path) -> Result<LocalCopy, String> {
        let bytes =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let file: CopyFile = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{} is not a local copy: {e}", path.display()))?;
        if file.format != COPY_FORMAT {
            return Err(format!(
                "{} has format {:?}, not {COPY_FORMAT:?}",
                path.display(),
                file.format
            ));
        }
        let kvs = file
            .items
            .into_iter()
            .map(|i| KeyValue {
                value: serde_json::to_vec(&i.value).unwrap_or_default(),
                key: i.key,
                create_revision: i.create_revision,
                mod_revision: i.mod_revision,
            })
            .collect();
        Ok(LocalCopy {
            prefix: file.prefix,
            revision: file.revision,
            kvs,
        })
    }

    /// Writes the copy atomically: a reader (or a crash) sees the old file or the new one.
    /// A value that is not JSON is refused (the file holds values as JSON).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let invalid = |e| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let mut items = Vec::with_capacity(self.kvs.len());
        for kv in &self.kvs {
            serde_json::from_slice::<serde::de::IgnoredAny>(&kv.value)?;
            let text = std::str::from_utf8(&kv.value).map_err(invalid)?;
            items.push((kv.key.as_str(), kv.create_revision, kv.mod_revision, text));
        }
        write_copy_file(path, &self.prefix, self.revision, items.into_iter())
    }

    /// [`LocalCopy::from_state`] written, without the copy: keys are formatted and sorted,
    /// the values streamed as the state holds them (JSON text, checked when stored). At
    /// 100,000 routes the copy and a parse of every value took ~170 MB and most of a core
    /// per write.
    pub fn write_state(prefix: &str, state: &ConfigState, path: &Path) -> std::io::Result<()> {
        let items = keyed_items(prefix, state);
        let items = items.iter().map(|(key, item)| {
            let text = item.value.text();
            (key.as_str(), item.create_revision, item.mod_revision, text)
        });
        write_copy_file(path, prefix, state.revision, items)
    }
}

/// The resources of `state` with their etcd keys, in key order.
fn keyed_items<'s>(prefix: &str, state: &'s ConfigState) -> Vec<(String, &'s StoredItem)> {
    let mut items: Vec<(String, &StoredItem)> = state
        .resources
        .iter()
        .flat_map(|(kind, items)| {
            items
                .values()
                .map(move |item| (format!("{prefix}/{}/{}", kind.dir(), item.id), item))
        })
        .collect();
    items.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    items
}

/// Streams a [`CopyFile`] (key, create and mod revision, value as JSON text, per item) to a
/// temporary file, syncs it and renames it over `path`.
fn write_copy_file<'a>(
    path: &Path,
    prefix: &str,
    revision: i64,
    items: impl Iterator<Item = (&'a str, i64, i64, &'a str)>,
) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    let tmp = dir.join(name);
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::fs::File::create(&tmp)?);
    // The fields in `CopyFile`'s and `CopyItem`'s order.
    out.write_all(b"{\"format\":")?;
    serde_json::to_writer(&mut out, COPY_FORMAT)?;
    out.write_all(b",\"prefix\":")?;
    serde_json::to_writer(&mut out, prefix)?;
    write!(out, ",\"revision\":{revision},\"items\":[")?;
    for (i, (key, create_revision, mod_revision, value)) in items.enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        out.write_all(b"{\"key\":")?;
        serde_json::to_writer(&mut out, key)?;
        write!(
            out,
            ",\"create_revision\":{create_revision},\"mod_revision\":{mod_revision},\"value\":"
        )?;
        out.write_all(value.as_bytes())?;
        out.write_all(b"}")?;
    }
    out.write_all(b"]}")?;
    let out = out.into_inner().map_err(|e| e.into_error())?;
    out.sync_all()?;
    drop(out);
    std::fs::rename(&tmp, path)?;
    // Make the rename itself durable; not every platform can sync a directory.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// At most one local-copy write per this long, and per [`COPY_SPACING`] times the last
/// write's duration: under a steady stream of changes a large configuration is not rewritten
/// (and synced) for each one, and the writer takes at most a twentieth of a core and of the
/// disk (at 100,000 routes a write is a 30 MB file). The copy lags etcd by at most that much;
/// the last state of a burst is always written.
const COPY_INTERVAL: Duration = Duration::from_secs(1);
const COPY_SPACING: u32 = 20;

/// Writes each state published from etcd to the local copy, coalescing bursts (the channel
/// keeps only the latest; see [`COPY_INTERVAL`]). Ends once the store is gone and the last
/// state is written.
async fn copy_writer(
    path: PathBuf,
    prefix: String,
    mut states: watch::Receiver<Option<Arc<ConfigState>>>,
) {
    while states.changed().await.is_ok() {
        let Some(state) = states.borrow_and_update().clone() else {
            continue;
        };
        let (target, prefix) = (path.clone(), prefix.clone());
        let started = Instant::now();
        let result =
            tokio::task::spawn_blocking(move || LocalCopy::write_state(&prefix, &state, &target))
                .await;
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(path = %path.display(), "cannot write the local copy: {e}")
            }
            Err(e) => tracing::warn!("local copy writer failed: {e}"),
        }
        tokio::time::sleep(COPY_INTERVAL.max(started.elapsed() * COPY_SPACING)).await;
    }
}

/// Whether `key` is under a resource directory of `prefix` without being an item of it
/// (`<prefix>/routes/a/b`; not the directory's placeholder `<prefix>/routes/`, not a
/// consumer's credential).
fn is_nested(prefix: &str, key: &str) -> bool {
    let Some((dir, rest)) = key
        .strip_prefix(prefix)
        .and_then(|k| k.strip_prefix('/'))
        .and_then(|k| k.split_once('/'))
    else {
        return false;
    };
    !rest.is_empty()
        && ResourceKind::from_dir(dir).is_some()
        && matches!(super::place_of(prefix, key), super::KeyPlace::Other)
}

/// What the followed state says of a page ([`EtcdStore::page_from_state`]).
enum StatePage {
    Page(Page),
    /// The directory holds keys that are no items of it: list it whole.
    WholeDirectory,
    /// The state cannot say (not caught up, a value that is not JSON, no resource directory).
    Unknown,
}

/// Items `offset..offset + limit` in creation order (create revision, then id: keys created in
/// one transaction share their revision), without sorting the whole directory.
fn creation_order_page<'a>(
    items: impl Iterator<Item = &'a StoredItem>,
    offset: usize,
    limit: usize,
) -> Vec<&'a StoredItem> {
    fn order<'i>(i: &&'i StoredItem) -> (i64, &'i str) {
        (i.create_revision, i.id.as_str())
    }
    let mut all: Vec<&StoredItem> = items.collect();
    let end = offset.saturating_add(limit).min(all.len());
    if offset >= end {
        return Vec::new();
    }
    if end < all.len() {
        all.select_nth_unstable_by_key(end - 1, order);
        all.truncate(end);
    }
    all.sort_unstable_by_key(order);
    all.drain(..offset);
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::kv;

    #[test]
    fn local_copy_round_trips() {
        let mut b = StateBuilder::new("/apisix");
        b.reset(
            &[
                kv("/apisix/routes/2", r#"{"uri":"/2"}"#, 3),
                kv("/apisix/upstreams/u", r#"{"nodes":{}}"#, 4),
                kv("/apisix/gen_id", "1", 5),
                kv("/apisix/routes/bad", "not json", 6),
            ],
            7,
        );
        let copy = LocalCopy::from_state("/apisix", b.state());
        let keys: Vec<_> = copy.kvs.iter().map(|k| k.key.as_str()).collect();
        assert_eq!(keys, ["/apisix/routes/2", "/apisix/upstreams/u"]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/copy.json");
        copy.write(&path).unwrap();
        assert_eq!(LocalCopy::read(&path).unwrap(), copy);
        // Written straight from the state: the same file, byte for byte.
        let direct = dir.path().join("direct.json");
        LocalCopy::write_state("/apisix", b.state(), &direct).unwrap();
        assert_eq!(
            std::fs::read(&direct).unwrap(),
            std::fs::read(&path).unwrap()
        );
        // A copy whose value is not JSON is refused, and the file it would replace kept.
        let mut broken = copy.clone();
        broken.kvs[0].value = b"{\"uri\":".to_vec();
        assert!(broken.write(&path).is_err());
        assert_eq!(LocalCopy::read(&path).unwrap(), copy);
        let mut again = StateBuilder::new("/apisix");
        again.reset(&copy.kvs, copy.revision);
        // The copy keeps what was served; unreadable keys are reported, not copied.
        assert_eq!(again.state().resources, b.state().resources);
        assert_eq!(again.state().revision, b.state().revision);
        assert!(again.state().unreadable.is_empty());

        std::fs::write(&path, "{}").unwrap();
        assert!(LocalCopy::read(&path).is_err());
    }

    #[test]
    fn settings_are_checked() {
        let mut s = EtcdSettings::default();
        assert!(Config::new(&s, None).is_ok());
        assert_eq!(Config::new(&s, None).unwrap().dir(), "/apisix/");
        s.host = vec!["127.0.0.1:2379".into()];
        assert!(matches!(Config::new(&s, None), Err(StoreError::Invalid(_))));
        s.host = vec!["http://a:2379".into(), "https://b:2379".into()];
        assert!(matches!(Config::new(&s, None), Err(StoreError::Invalid(_))));
        s.host = vec!["https://b:2379".into()];
        s.tls.verify = false;
        assert!(matches!(Config::new(&s, None), Err(StoreError::Invalid(_))));
        s.tls.verify = true;
        assert!(Config::new(&s, None).is_ok());
        s.host.clear();
        assert!(Config::new(&s, None).is_err());
    }

    #[test]
    fn lease_ttl_is_whole_seconds() {
        assert_eq!(lease_secs(Duration::from_millis(1)), 1);
        assert_eq!(lease_secs(Duration::ZERO), 1);
        assert_eq!(lease_secs(Duration::from_millis(1500)), 2);
        assert_eq!(lease_secs(Duration::from_secs(60)), 60);
    }

    #[test]
    fn keys_further_down_a_resource_directory_are_nested() {
        for (key, nested) in [
            ("/apisix/routes/a/b", true),
            ("/apisix/upstreams/1/x/y", true),
            ("/apisix/routes/a", false),
            ("/apisix/routes/", false),
            ("/apisix/consumers/jack/credentials/k", false),
            ("/apisix/data_plane/server_info/x", false),
            ("/other/routes/a/b", false),
        ] {
            assert_eq!(is_nested("/apisix", key), nested, "{key}");
        }
    }

    #[test]
    fn creation_order_pages_match_a_full_sort() {
        use crate::state::StoredValue;
        // Create revisions with repeats (one transaction's keys), ids out of order.
        let items: Vec<StoredItem> = (0..97u32)
            .map(|i| StoredItem {
                id: format!("r{}", (i * 31) % 97),
                value: StoredValue::from_json(b"{}").unwrap(),
                create_revision: i64::from((i * 7) % 50),
                mod_revision: 0,
                seq: 0,
            })
            .collect();
        let mut sorted: Vec<&StoredItem> = items.iter().collect();
        sorted.sort_by_key(|i| (i.create_revision, i.id.clone()));
        for (offset, limit) in [
            (0, 10),
            (0, 97),
            (5, 200),
            (90, 10),
            (96, 1),
            (97, 10),
            (200, 5),
        ] {
            let page = creation_order_page(items.iter(), offset, limit);
            let want: Vec<&StoredItem> = sorted.iter().skip(offset).take(limit).copied().collect();
            let ids = |v: &[&StoredItem]| v.iter().map(|i| i.id.clone()).collect::<Vec<_>>();
            assert_eq!(ids(&page), ids(&want), "offset {offset}, limit {limit}");
        }
    }

    #[test]
    fn backoff_doubles_to_the_cap() {
        let mut b = Backoff::default();
        let delays: Vec<_> = (0..8).map(|_| b.next().as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
    }
}
