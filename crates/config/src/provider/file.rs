//! [`FileProvider`]: loads the standalone file at start, then watches it and publishes every
//! good version on a `tokio::sync::watch` channel.
//!
//! APISIX re-reads `apisix.yaml` when its mtime changes, checked every second. We poll every
//! 200 ms so a change applies within a second, and compare length and mtime first so an idle
//! file costs one `stat` per tick. Because mtime granularity can hide two writes within the same
//! tick, a file modified in the last two seconds is also re-read and compared by content hash.
//! A version that does not parse is logged once and skipped; the last good state stays live.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::standalone::{carry_revisions, parse_standalone_with, Format, Standalone};
use crate::env;
use crate::state::ConfigState;

/// Re-read a file this recently modified even when length and mtime look unchanged.
const RACY_WINDOW: Duration = Duration::from_secs(2);

/// The channel end a data plane compiles from, and the watcher task.
pub type Started = (watch::Receiver<Arc<ConfigState>>, JoinHandle<()>);

/// Watches one standalone file.
#[derive(Clone, Debug)]
pub struct FileProvider {
    path: PathBuf,
    format: Format,
    poll_interval: Duration,
}

impl FileProvider {
    /// How often the file is checked.
    pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

    pub fn new(path: impl Into<PathBuf>, format: Format) -> FileProvider {
        FileProvider {
            path: path.into(),
            format,
            poll_interval: Self::POLL_INTERVAL,
        }
    }

    /// Overrides [`FileProvider::POLL_INTERVAL`] (tests use a shorter one).
    pub fn poll_interval(mut self, every: Duration) -> FileProvider {
        self.poll_interval = every;
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `FileProvider::new(path, format).spawn()`.
    pub fn start(path: impl Into<PathBuf>, format: Format) -> Result<Started, String> {
        FileProvider::new(path, format).spawn()
    }

    /// Loads the file (revision 1) and spawns the watcher on the current Tokio runtime. Fails
    /// when the first read or parse fails, or when called outside a runtime. The task ends when
    /// every receiver is dropped.
    pub fn spawn(self) -> Result<Started, String> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| "FileProvider must be started inside a Tokio runtime".to_string())?;
        let bytes = std::fs::read(&self.path)
            .map_err(|e| format!("failed to read {}: {e}", self.path.display()))?;
        let stamp = std::fs::metadata(&self.path).ok().map(|m| Stamp::of(&m));
        let doc = self
            .parse(&bytes, 1)
            .map_err(|e| format!("failed to parse {}: {e}", self.path.display()))?;
        self.log_loaded(&doc);
        let state = Arc::new(doc.state);
        let (tx, rx) = watch::channel(Arc::clone(&state));
        let watcher = Watcher {
            provider: self,
            stamp,
            hash: content_hash(&bytes),
            current: state,
            last_problem: None,
        };
        Ok((rx, runtime.spawn(watcher.run(tx))))
    }

    fn parse(&self, bytes: &[u8], revision: i64) -> Result<Standalone, String> {
        let text = std::str::from_utf8(bytes).map_err(|e| format!("not valid UTF-8: {e}"))?;
        parse_standalone_with(text, self.format, revision, &env::process_env)
    }

    fn log_loaded(&self, doc: &Standalone) {
        for w in &doc.warnings {
            tracing::warn!(file = %self.path.display(), "{w}");
        }
        if doc.plugins.is_some() {
            // ConfigState has no place for it yet.
            tracing::warn!(file = %self.path.display(), "the `plugins` list in the standalone file is not applied yet");
        }
        tracing::info!(
            file = %self.path.display(),
            revision = doc.state.revision,
            resources = doc.state.len(),
            "loaded standalone config"
        );
    }
}

/// What a `stat` tells about the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        Stamp {
            len: meta.len(),
            modified: meta.modified().ok(),
        }
    }

    /// Recent enough that a second write might share the same mtime; unknown counts as recent.
    fn is_racy(&self) -> bool {
        match self.modified {
            Some(t) => SystemTime::now()
                .duration_since(t)
                .map_or(true, |age| age < RACY_WINDOW),
            None => true,
        }
    }
}

fn content_hash(bytes: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

struct Watcher {
    provider: FileProvider,
    stamp: Option<Stamp>,
    /// Hash of the content last looked at, good or bad, so neither is parsed twice.
    hash: u64,
    current: Arc<ConfigState>,
    /// The last problem logged, so a persisting one is logged once, not five times a second.
    last_problem: Option<String>,
}

impl Watcher {
    async fn run(mut self, tx: watch::Sender<Arc<ConfigState>>) {
        let mut ticker = tokio::time::interval(self.provider.poll_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await; // the first tick is immediate; the file was just read
        loop {
            ticker.tick().await;
            if tx.is_closed() {
                return;
            }
            if let Some(state) = self.poll().await {
                if tx.send(state).is_err() {
                    return;
                }
            }
        }
    }

    fn problem(&mut self, message: String) {
        if self.last_problem.as_ref() != Some(&message) {
            tracing::error!(
                file = %self.provider.path.display(),
                "{message}; keeping the last good configuration (revision {})",
                self.current.revision
            );
            self.last_problem = Some(message);
        }
    }

    /// One tick: the new state to publish, if the file changed into a good one.
    async fn poll(&mut self) -> Option<Arc<ConfigState>> {
        let path = self.provider.path.clone();
        let stamp = match tokio::fs::metadata(&path).await {
            Ok(m) => Stamp::of(&m),
            Err(e) => {
                self.stamp = None;
                self.problem(format!("failed to read {}: {e}", path.display()));
                return None;
            }
        };
        if self.stamp == Some(stamp) && !stamp.is_racy() {
            return None;
        }
        self.stamp = Some(stamp);
        let bytes = match tokio::fs::read(&path).await {
            Ok(b) => b,
            Err(e) => {
                self.problem(format!("failed to read {}: {e}", path.display()));
                return None;
            }
        };
        let hash = content_hash(&bytes);
        if hash == self.hash {
            return None;
        }
        self.hash = hash;

        let revision = self.current.revision + 1;
        let mut doc = match self.provider.parse(&bytes, revision) {
            Ok(doc) => doc,
            Err(e) => {
                self.problem(format!("failed to parse {}: {e}", path.display()));
                return None;
            }
        };
        self.last_problem = None;
        carry_revisions(&self.current, &mut doc.state);
        if doc.state.resources == self.current.resources {
            // Back to what is already live (e.g. a broken edit undone): nothing to publish.
            tracing::info!(file = %path.display(), "standalone config unchanged");
            return None;
        }
        self.provider.log_loaded(&doc);
        let state = Arc::new(doc.state);
        self.current = Arc::clone(&state);
        Some(state)
    }
}
