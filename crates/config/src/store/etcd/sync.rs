//! The sync loop: the first listing, the watch from the applied revision with its progress
//! reports, the re-list after a compaction or a restore, and the reconnects with backoff (the
//! parent module's **Following** and **Failures**).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, EventType, WatchOptions, WatchResponse};

use super::listing::{ListError, ListPage, PagedListing};
use super::{bump, kv_of, LocalCopy, Shared, MAX_MESSAGE};
use crate::model::ResourceKind;
use crate::store::{KeyValue, Listing, StateBuilder, StoreHealth};

/// First reconnect delay; doubled after each failure up to [`BACKOFF_MAX`].
pub const BACKOFF_START: Duration = Duration::from_millis(100);
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How many times one listing starts over because etcd compacted its revision meanwhile.
pub(super) const LIST_RESTARTS: u32 = 3;

#[derive(Debug)]
pub(super) struct Backoff {
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
    pub(super) fn next(&mut self) -> Duration {
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
pub(super) struct Syncer {
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
    pub(super) fn new(shared: Arc<Shared>) -> Syncer {
        Syncer {
            builder: StateBuilder::new(shared.config.prefix.clone())
                .with_max_value(shared.config.max_value),
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
    pub(super) async fn start(&mut self) -> Result<(), String> {
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

    pub(super) fn boot_from_copy(&mut self, copy: LocalCopy, path: &Path, error: &str) {
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

    /// Reads the whole prefix, in pages at one revision, and makes it the state. When etcd
    /// compacts that revision before the last page is read, the listing starts over from the
    /// newest revision, a few times (a history compacted faster than it can be listed is an
    /// error, retried with the session's backoff, not a tight loop).
    async fn relist(&mut self, client: &Client) -> Result<(), String> {
        let mut restarts = 0;
        loop {
            match self.list_in_pages(client).await {
                Ok(()) => return Ok(()),
                Err(ListError::Compacted) if restarts < LIST_RESTARTS => {
                    restarts += 1;
                    bump(&self.shared.counters.list_restarts);
                    tracing::warn!(
                        restarts,
                        "etcd compacted the revision of the listing while its pages were read; \
                         listing again from the newest revision"
                    );
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    async fn list_in_pages(&mut self, client: &Client) -> Result<(), ListError> {
        let shared = Arc::clone(&self.shared);
        let config = &shared.config;
        let mut pages = PagedListing::new(
            client.kv_client(),
            &config.dir(),
            config.page_size,
            self.timeout(),
        );
        let mut listing = self.builder.start_listing();
        let mut nested = BTreeSet::new();
        let mut page = pages.next().await?;
        let mut returned = 0u64;
        while let Some(current) = page {
            returned += 1;
            if let Some(hook) = &config.page_hook {
                hook(returned, pages.revision().unwrap_or(0)).await;
            }
            // The next page is asked for before this one is parsed: etcd reads it while the
            // values here are checked.
            let (next, ()) = tokio::join!(pages.next(), async {
                self.absorb(&mut listing, &mut nested, current)
            });
            page = next?;
        }
        let revision = pages
            .revision()
            .ok_or_else(|| ListError::Failed("etcd answered without a header".into()))?;
        let keys = listing.keys;
        *self.shared.nested.lock().unwrap_or_else(|e| e.into_inner()) = nested;
        self.builder.finish_listing(listing, revision);
        self.applied = revision;
        self.cluster = Some(pages.cluster());
        bump(&self.shared.counters.relists);
        self.from_copy = None;
        // Unchanged items kept their `Arc`s, so this comparison is mostly pointer checks.
        let changed = self.shared.states.borrow().resources != self.builder.state().resources;
        tracing::info!(
            revision,
            keys,
            pages = returned,
            reads = pages.pages,
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

    /// Adds a page of a listing to the next state.
    fn absorb(&mut self, listing: &mut Listing, nested: &mut BTreeSet<String>, page: ListPage) {
        match page {
            ListPage::Kvs(kvs) => {
                let prefix = &self.shared.config.prefix;
                nested.extend(
                    kvs.iter()
                        .filter(|kv| is_nested(prefix, &kv.key))
                        .map(|kv| kv.key.clone()),
                );
                let refs: Vec<&KeyValue> = kvs.iter().collect();
                self.builder.add_page(listing, &refs);
            }
            ListPage::TooLarge { key, reason } => self.builder.quarantine(listing, &key, reason),
        }
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

    pub(super) async fn run(mut self) {
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
        && matches!(
            crate::store::place_of(prefix, key),
            crate::store::KeyPlace::Other
        )
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn backoff_doubles_to_the_cap() {
        let mut b = Backoff::default();
        let delays: Vec<_> = (0..8).map(|_| b.next().as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
    }
}
