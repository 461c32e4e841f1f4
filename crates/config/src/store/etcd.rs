//! The etcd store: APISIX's own configuration backend, followed the way APISIX's data plane
//! follows it (spec §8.2), and written the way its Admin API writes it.
//!
//! **Following.** At start `<prefix>/` is listed in pages of `deployment.etcd.page_size`
//! keys, every page at the revision of the first (`listing`), so that they form one snapshot
//! however big the configuration; the pages go through
//! [`StateBuilder::add_page`](super::StateBuilder::add_page), the listing is published and its
//! revision remembered. Then a single watch on `<prefix>/` from that revision + 1 (with
//! `prev_kv` and progress notifications) feeds every PUT/DELETE to
//! [`StateBuilder::apply`](super::StateBuilder::apply); a state is published after each
//! response that changed something. Events at or below the applied revision are dropped, so
//! nothing is applied twice. The watch is re-created from the applied revision + 1 after any
//! break, so nothing is missed either; when etcd cannot serve that (the watch is cancelled with
//! a `compact_revision`), or the history went backwards (a header revision below ours, or
//! another cluster id: etcd restored or rebuilt), the prefix is listed again. A listing whose
//! own revision is compacted before its last page is read starts over from the newest
//! revision. A re-list keeps the `Arc` of every unchanged item, so only real changes reach the
//! data plane.
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
//! **Layout.** This file is the store: settings, the shared part, connecting, and the reads,
//! writes, transactions and leases of [`Store`]. The sync loop (listing, watch, progress,
//! re-list, reconnects) is in `sync`; full listings read in pages at one revision in
//! `listing`; Admin list pages cut from the followed state or from etcd's sorted range in
//! `pages`; the local copy on disk in `local_copy`.

mod listing;
mod local_copy;
mod pages;
mod sync;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, PutOptions, Txn, TxnOp,
    TxnOpResponse,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{KeyValue, Page, PutOutcome, Store, StoreError, StoreHealth};
use crate::settings::EtcdSettings;
use crate::state::ConfigState;
use listing::{ListError, ListPage, PagedListing};
use local_copy::copy_writer;
pub use local_copy::LocalCopy;
use pages::StatePage;
use sync::{Backoff, Syncer};
pub use sync::{BACKOFF_MAX, BACKOFF_START};

/// Largest gRPC message accepted: a full listing of a big configuration exceeds tonic's 4 MiB
/// default.
const MAX_MESSAGE: usize = 256 * 1024 * 1024;

/// HTTP/2 pings on the shared connection, so writes notice a dead peer. etcd refuses pings
/// more frequent than 5 s (`--grpc-keepalive-min-time`).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

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
    /// Listings started over because etcd compacted their revision while their pages were
    /// read.
    pub list_restarts: u64,
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
    list_restarts: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Called by a listing after each page it read, before it asks for the next, with the pages
/// read so far and the listing's pinned revision: for tests that change etcd in the middle of
/// a listing (see [`EtcdStore::connect_with_page_hook`]).
pub type PageHook = Arc<
    dyn Fn(u64, i64) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        + Send
        + Sync,
>;

/// Settings turned into what the client needs.
#[derive(Clone)]
struct Config {
    endpoints: Vec<String>,
    options: ConnectOptions,
    /// `<prefix>` without a trailing slash.
    prefix: String,
    timeout: Duration,
    watch_timeout: Duration,
    /// Keys per page of a full listing (`deployment.etcd.page_size`).
    page_size: usize,
    /// Values longer than this are quarantined (`deployment.etcd.max_value_size`).
    max_value: Option<usize>,
    page_hook: Option<PageHook>,
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
            page_size: usize::try_from(settings.page_size.max(1)).unwrap_or(usize::MAX),
            max_value: (settings.max_value_size > 0)
                .then(|| usize::try_from(settings.max_value_size).unwrap_or(usize::MAX)),
            page_hook: None,
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
        EtcdStore::start(Config::new(settings, trusted_ca)?, local_copy, settings).await
    }

    /// [`EtcdStore::connect`], calling `hook` between the pages of every listing: a test's
    /// way to compact or change etcd in the middle of one.
    pub async fn connect_with_page_hook(
        settings: &EtcdSettings,
        local_copy: Option<PathBuf>,
        hook: PageHook,
    ) -> Result<Arc<EtcdStore>, StoreError> {
        let mut config = Config::new(settings, None)?;
        config.page_hook = Some(hook);
        EtcdStore::start(config, local_copy, settings).await
    }

    async fn start(
        config: Config,
        local_copy: Option<PathBuf>,
        settings: &EtcdSettings,
    ) -> Result<Arc<EtcdStore>, StoreError> {
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
            list_restarts: get(&c.list_restarts),
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

    /// Read in pages at one revision, as the sync loop lists (see `listing`).
    async fn list(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64), StoreError> {
        let config = &self.shared.config;
        let mut restarts = 0;
        'listing: loop {
            let mut pages = PagedListing::new(
                self.client()?.kv_client(),
                prefix,
                config.page_size,
                config.timeout,
            );
            let mut kvs = Vec::new();
            loop {
                match pages.next().await {
                    Ok(Some(ListPage::Kvs(page))) => kvs.extend(page),
                    Ok(Some(ListPage::TooLarge { key, reason })) => {
                        tracing::error!(key, "{reason}; left out of the list");
                    }
                    Ok(None) => break,
                    Err(ListError::Compacted) if restarts < sync::LIST_RESTARTS => {
                        restarts += 1;
                        continue 'listing;
                    }
                    Err(e) => return Err(StoreError::Unavailable(e.to_string())),
                }
            }
            // etcd answers in key order.
            return Ok((kvs, pages.revision().unwrap_or(0)));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
