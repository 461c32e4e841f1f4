//! APISIX's batch processor (`apisix/utils/batch-processor.lua` with its manager,
//! `batch-processor-manager.lua`): the loggers' entries are buffered per conf and sent in
//! batches of `batch_max_size`, or when no entry came for `inactive_timeout` seconds, or when
//! the oldest entry waited `buffer_duration` seconds; a failed batch is tried again
//! `max_retry_count` times, `retry_delay` seconds apart, then dropped (a sink that reports
//! the first entry that failed gets only the rest again).
//!
//! Memory is bounded as the manager bounds it: every processor of one plugin shares one
//! backlog count (entries pushed and not yet sent or dropped), and while it is at
//! `max_pending_entries` (`plugin_metadata`, default 8192) new entries are dropped and
//! counted, with one error a second saying how many. Pushing never waits: the log phase of a
//! request costs a lock and a vector push whatever the sink does.
//!
//! Everything runs on the gateway's executor: one timer task per processor and one task per
//! batch being sent. On the gateway's graceful shutdown the buffer is flushed at once, batches
//! waiting for a retry are tried once more without waiting, and the shutdown waits for them.
//! A processor whose conf is gone (its last snapshot dropped) flushes what it holds too.
//!
//! A log server that is down fails every batch: its error lines are summarised, one a second
//! per processor with the count they stand for (`repeated`), as the discards are.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use ferrisix_net::Repeats;
use ferrisix_plugin_api::{Executor, PluginServices, SharedState, Shutdown};
use serde_json::{json, Map, Value};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The manager's `DEFAULT_MAX_PENDING_ENTRIES`.
pub const DEFAULT_MAX_PENDING_ENTRIES: usize = 8192;

/// Adds the batch processor's properties to a logger's schema (the manager's `wrap_schema`),
/// `name` defaulting to `name_default`.
pub fn wrap_schema(mut schema: Value, name_default: &str) -> Value {
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        let bp = [
            ("name", json!({"type": "string", "default": name_default})),
            (
                "max_retry_count",
                json!({"type": "integer", "minimum": 0, "default": 0}),
            ),
            (
                "retry_delay",
                json!({"type": "integer", "minimum": 0, "default": 1}),
            ),
            (
                "buffer_duration",
                json!({"type": "integer", "minimum": 1, "default": 60}),
            ),
            (
                "inactive_timeout",
                json!({"type": "integer", "minimum": 1, "default": 5}),
            ),
            (
                "batch_max_size",
                json!({"type": "integer", "minimum": 1, "default": 1000}),
            ),
        ];
        for (k, v) in bp {
            props.entry(k).or_insert(v);
        }
    }
    schema
}

/// Adds `max_pending_entries` to a logger's metadata schema (`wrap_metadata_schema`).
pub fn wrap_metadata_schema(mut schema: Value) -> Value {
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        props.insert(
            "max_pending_entries".into(),
            json!({
                "type": "integer",
                "minimum": 1,
                "default": DEFAULT_MAX_PENDING_ENTRIES,
                "description": "maximum number of entries waiting to be processed; new entries are discarded while the backlog exceeds it"
            }),
        );
    }
    schema
}

/// A processor's settings, from a conf with its defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchConfig {
    pub name: String,
    pub batch_max_size: usize,
    pub inactive_timeout: Duration,
    pub buffer_duration: Duration,
    pub max_retry_count: u32,
    pub retry_delay: Duration,
}

impl BatchConfig {
    pub fn from_conf(conf: &Map<String, Value>) -> BatchConfig {
        let int = |k: &str, d: u64| conf.get(k).and_then(Value::as_u64).unwrap_or(d);
        BatchConfig {
            name: conf
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("log buffer")
                .to_owned(),
            batch_max_size: int("batch_max_size", 1000).max(1) as usize,
            inactive_timeout: Duration::from_secs(int("inactive_timeout", 5).max(1)),
            buffer_duration: Duration::from_secs(int("buffer_duration", 60).max(1)),
            max_retry_count: u32::try_from(int("max_retry_count", 0)).unwrap_or(u32::MAX),
            retry_delay: Duration::from_secs(int("retry_delay", 1)),
        }
    }
}

/// Why a batch was not (completely) sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendError {
    pub message: String,
    /// 1-based index of the first entry that was not sent; those before it were.
    pub first_fail: Option<usize>,
}

impl SendError {
    pub fn new(message: impl Into<String>) -> SendError {
        SendError {
            message: message.into(),
            first_fail: None,
        }
    }
}

/// A batch on its way to the sink.
pub type SendFuture<'a> = Pin<Box<dyn Future<Output = Result<(), SendError>> + Send + 'a>>;

/// Where a processor's batches go: each entry is one encoded log entry.
pub trait BatchSink: Send + Sync + 'static {
    /// Sends `entries`; `batch_max_size` is the conf's (loggers send a lone entry unwrapped
    /// when it is 1).
    fn send<'a>(&'a self, entries: &'a [Bytes], batch_max_size: usize) -> SendFuture<'a>;
}

/// One plugin's backlog, shared by its processors.
#[derive(Debug, Default)]
pub struct Backlog {
    pending: AtomicUsize,
    discarded: AtomicU64,
    discarded_total: AtomicU64,
    last_report_s: AtomicU64,
}

impl Backlog {
    /// Entries pushed and not yet sent or dropped.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Entries dropped because the backlog was full, since the start.
    pub fn discarded(&self) -> u64 {
        self.discarded_total.load(Ordering::Relaxed)
    }

    fn done(&self, n: usize) {
        self.pending.fetch_sub(n, Ordering::Relaxed);
    }
}

/// The backlogs of a gateway's loggers, by plugin name.
#[derive(Debug, Default)]
pub struct Backlogs(Mutex<HashMap<&'static str, Arc<Backlog>>>);

impl SharedState for Backlogs {
    fn create(_: &PluginServices) -> Self {
        Backlogs::default()
    }
}

impl Backlogs {
    pub fn of(&self, plugin: &'static str) -> Arc<Backlog> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(plugin)
            .or_default()
            .clone()
    }
}

#[derive(Debug)]
struct Buffer {
    entries: Vec<Bytes>,
    first: Instant,
    last: Instant,
}

/// APISIX's `batch_process_entries` gauge (`set_metrics` of batch-processor.lua): per
/// processor labelled `name`, `route_id` and `server_addr` (of the first request that logged
/// to it), the entries its buffer holds, 0 once they are handed on to be sent. The prometheus
/// exporter renders them.
#[derive(Default)]
pub struct BatchGauges(Mutex<BTreeMap<[String; 3], Arc<AtomicU64>>>);

impl SharedState for BatchGauges {
    fn create(_: &PluginServices) -> Self {
        BatchGauges::default()
    }
}

impl BatchGauges {
    /// The gauge of these labels (kept for the life of the gateway, as APISIX's are).
    fn gauge(&self, labels: [String; 3]) -> Arc<AtomicU64> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(labels).or_default().clone()
    }

    /// Every gauge: (`name`, `route_id`, `server_addr`) and its value.
    pub fn values(&self) -> Vec<([String; 3], u64)> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.iter()
            .map(|(k, v)| (k.clone(), v.load(Ordering::Relaxed)))
            .collect()
    }
}

struct Shared {
    config: BatchConfig,
    sink: Arc<dyn BatchSink>,
    buffer: Mutex<Buffer>,
    wake: Notify,
    closed: AtomicBool,
    backlog: Arc<Backlog>,
    max_pending: usize,
    executor: Executor,
    shutdown: Shutdown,
    /// Entries sent successfully (for tests and figures).
    sent: AtomicU64,
    /// Failed tries and dropped batches: one line a second each, with the count, however
    /// many batches a dead log server fails.
    failures: Repeats,
    drops: Repeats,
    gauges: Arc<BatchGauges>,
    /// This processor's `batch_process_entries`, once a request gave its labels.
    gauge: OnceLock<Arc<AtomicU64>>,
}

/// One conf's processor. Dropping it flushes what it holds.
pub struct BatchProcessor {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for BatchProcessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchProcessor")
            .field("name", &self.shared.config.name)
            .finish_non_exhaustive()
    }
}

impl ferrisix_plugin_api::Retain for BatchProcessor {}

impl BatchProcessor {
    /// A processor sending to `sink`, counting its entries in `backlog` (bounded by
    /// `max_pending`), its tasks on `services`' executor.
    pub fn new(
        config: BatchConfig,
        sink: Arc<dyn BatchSink>,
        backlog: Arc<Backlog>,
        max_pending: usize,
        services: &PluginServices,
    ) -> BatchProcessor {
        let now = Instant::now();
        let shared = Arc::new(Shared {
            config,
            sink,
            buffer: Mutex::new(Buffer {
                entries: Vec::new(),
                first: now,
                last: now,
            }),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
            backlog,
            max_pending: max_pending.max(1),
            executor: services.executor().clone(),
            shutdown: services.shutdown().clone(),
            sent: AtomicU64::new(0),
            failures: Repeats::per_second(),
            drops: Repeats::per_second(),
            gauges: services.shared::<BatchGauges>(),
            gauge: OnceLock::new(),
        });
        if shared.config.batch_max_size > 1 {
            let timer = shared.clone();
            let hold = shared.shutdown.hold();
            if let Err(e) = shared.executor.spawn(async move {
                timer.run_timer().await;
                drop(hold);
            }) {
                tracing::error!(error = %e, "batch processor: no timer task");
            }
        }
        BatchProcessor { shared }
    }

    /// Whether the processor still needs the labels of its `batch_process_entries` gauge
    /// ([`BatchProcessor::label`]); a processor sending each entry alone has none, as APISIX's.
    pub fn wants_labels(&self) -> bool {
        self.shared.config.batch_max_size > 1 && self.shared.gauge.get().is_none()
    }

    /// Labels the gauge with the request's `route_id` and `server_addr` (the first call wins).
    pub fn label(&self, route_id: &str, server_addr: &str) {
        let s = &self.shared;
        let _ = s.gauge.get_or_init(|| {
            s.gauges.gauge([
                s.config.name.clone(),
                route_id.to_owned(),
                server_addr.to_owned(),
            ])
        });
    }

    /// Adds one encoded entry (never waits). Answers `false` when the backlog was full and
    /// the entry was dropped.
    pub fn push(&self, entry: Bytes) -> bool {
        let s = &self.shared;
        if s.backlog.pending.fetch_add(1, Ordering::Relaxed) >= s.max_pending {
            s.backlog.pending.fetch_sub(1, Ordering::Relaxed);
            s.report_discard();
            return false;
        }
        if s.config.batch_max_size == 1 {
            s.execute(vec![entry]);
            return true;
        }
        let now = Instant::now();
        let (full, first) = {
            let mut b = s.buffer.lock().unwrap_or_else(|e| e.into_inner());
            if b.entries.is_empty() {
                b.first = now;
            }
            b.last = now;
            b.entries.push(entry);
            let full = b.entries.len() >= s.config.batch_max_size
                || s.shutdown.is_started()
                || s.closed.load(Ordering::Relaxed);
            let first = b.entries.len() == 1;
            if let Some(g) = s.gauge.get() {
                g.store(
                    if full { 0 } else { b.entries.len() as u64 },
                    Ordering::Relaxed,
                );
            }
            (full.then(|| std::mem::take(&mut b.entries)), first)
        };
        match full {
            Some(batch) => s.execute(batch),
            None if first => s.wake.notify_one(),
            None => {}
        }
        true
    }

    /// Entries this processor sent successfully.
    pub fn sent(&self) -> u64 {
        self.shared.sent.load(Ordering::Relaxed)
    }
}

impl Drop for BatchProcessor {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Relaxed);
        self.shared.wake.notify_one();
    }
}

impl Shared {
    fn report_discard(&self) {
        self.backlog.discarded.fetch_add(1, Ordering::Relaxed);
        self.backlog.discarded_total.fetch_add(1, Ordering::Relaxed);
        let now_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last = self.backlog.last_report_s.load(Ordering::Relaxed);
        if now_s > last
            && self
                .backlog
                .last_report_s
                .compare_exchange(last, now_s, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::error!(
                name = %self.config.name,
                pending = self.backlog.pending(),
                max_pending_entries = self.max_pending,
                discarded_entries = self.backlog.discarded.swap(0, Ordering::Relaxed),
                "max pending entries limit exceeded. discarding entry."
            );
        }
    }

    fn take(&self) -> Vec<Bytes> {
        let mut b = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = self.gauge.get() {
            g.store(0, Ordering::Relaxed);
        }
        std::mem::take(&mut b.entries)
    }

    /// The buffer's flush time: `inactive_timeout` after the last entry or `buffer_duration`
    /// after the first, whichever comes first; `None` when empty.
    fn deadline(&self) -> Option<Instant> {
        let b = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
        if b.entries.is_empty() {
            return None;
        }
        Some((b.last + self.config.inactive_timeout).min(b.first + self.config.buffer_duration))
    }

    async fn run_timer(self: Arc<Self>) {
        loop {
            if self.closed.load(Ordering::Relaxed) || self.shutdown.is_started() {
                let rest = self.take();
                if !rest.is_empty() {
                    self.clone().execute(rest);
                }
                return;
            }
            match self.deadline() {
                Some(at) if at <= Instant::now() => {
                    let batch = self.take();
                    if !batch.is_empty() {
                        self.clone().execute(batch);
                    }
                }
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = self.wake.notified() => {}
                        _ = self.shutdown.started() => {}
                    }
                }
                None => {
                    tokio::select! {
                        _ = self.wake.notified() => {}
                        _ = self.shutdown.started() => {}
                    }
                }
            }
        }
    }

    /// Sends `batch` on its own task, with its retries.
    fn execute(self: &Arc<Self>, batch: Vec<Bytes>) {
        let n = batch.len();
        let me = self.clone();
        let hold = self.shutdown.hold();
        let spawned = self.executor.spawn(async move {
            me.send_with_retries(batch).await;
            drop(hold);
        });
        if let Err(e) = spawned {
            tracing::error!(name = %self.config.name, error = %e, "batch processor: batch dropped");
            self.backlog.done(n);
        }
    }

    async fn send_with_retries(&self, mut entries: Vec<Bytes>) {
        let name = &self.config.name;
        let mut retry_count = 0u32;
        loop {
            match self.sink.send(&entries, self.config.batch_max_size).await {
                Ok(()) => {
                    self.sent.fetch_add(entries.len() as u64, Ordering::Relaxed);
                    self.backlog.done(entries.len());
                    return;
                }
                Err(e) => {
                    let first = e.first_fail.filter(|f| (1..=entries.len()).contains(f));
                    if let Some(repeated) = self.failures.hit() {
                        match first {
                            Some(first) => tracing::error!(
                                repeated,
                                "Batch Processor[{name}] failed to process entries [{}/{}]: {}",
                                entries.len() + 1 - first,
                                entries.len(),
                                e.message
                            ),
                            None => tracing::error!(
                                repeated,
                                "Batch Processor[{name}] failed to process entries: {}",
                                e.message
                            ),
                        }
                    }
                    if let Some(first) = first {
                        self.sent.fetch_add(first as u64 - 1, Ordering::Relaxed);
                        self.backlog.done(first - 1);
                        entries.drain(..first - 1);
                    }
                    retry_count += 1;
                    if retry_count <= self.config.max_retry_count && !entries.is_empty() {
                        if !self.shutdown.is_started() {
                            tokio::select! {
                                _ = tokio::time::sleep(self.config.retry_delay) => {}
                                _ = self.shutdown.started() => {}
                            }
                        } else if retry_count > 1 {
                            // Shutting down: one last try without waiting, then give up.
                            retry_count = self.config.max_retry_count + 1;
                        }
                        if retry_count <= self.config.max_retry_count || self.shutdown.is_started()
                        {
                            continue;
                        }
                    }
                    if let Some(repeated) = self.drops.hit() {
                        tracing::error!(
                            repeated,
                            "Batch Processor[{name}] exceeded the max_retry_count[{retry_count}] dropping the entries"
                        );
                    }
                    self.backlog.done(entries.len());
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink recording batches; fails while `down` is set.
    #[derive(Default)]
    struct Recorder {
        batches: Mutex<Vec<Vec<Bytes>>>,
        down: AtomicBool,
        attempts: AtomicUsize,
    }

    impl BatchSink for Recorder {
        fn send<'a>(&'a self, entries: &'a [Bytes], _: usize) -> SendFuture<'a> {
            Box::pin(async move {
                self.attempts.fetch_add(1, Ordering::Relaxed);
                if self.down.load(Ordering::Relaxed) {
                    return Err(SendError::new("connection refused"));
                }
                self.batches.lock().unwrap().push(entries.to_vec());
                Ok(())
            })
        }
    }

    fn config(size: usize) -> BatchConfig {
        BatchConfig::from_conf(
            json!({"batch_max_size": size, "inactive_timeout": 2, "buffer_duration": 10,
                "max_retry_count": 2, "retry_delay": 1})
            .as_object()
            .unwrap(),
        )
    }

    fn entry(i: usize) -> Bytes {
        Bytes::from(i.to_string())
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    /// A processor of batches of `size` (the rest of `config`) sending to a new recorder.
    fn recorded(
        services: &PluginServices,
        size: usize,
        backlog: Arc<Backlog>,
        max_pending: usize,
    ) -> (Arc<Recorder>, BatchProcessor) {
        let sink = Arc::new(Recorder::default());
        let p = BatchProcessor::new(config(size), sink.clone(), backlog, max_pending, services);
        (sink, p)
    }

    #[tokio::test(start_paused = true)]
    async fn full_batches_and_inactive_flush() {
        let services = PluginServices::default();
        let backlog = Arc::new(Backlog::default());
        let (sink, p) = recorded(&services, 3, backlog.clone(), 100);
        for i in 0..4 {
            assert!(p.push(entry(i)));
        }
        settle().await;
        assert_eq!(sink.batches.lock().unwrap().len(), 1, "one full batch");
        assert_eq!(backlog.pending(), 1);
        tokio::time::sleep(Duration::from_millis(1900)).await;
        settle().await;
        assert_eq!(sink.batches.lock().unwrap().len(), 1, "not inactive yet");
        tokio::time::sleep(Duration::from_millis(200)).await;
        settle().await;
        let batches = sink.batches.lock().unwrap().clone();
        assert_eq!(
            batches,
            vec![vec![entry(0), entry(1), entry(2)], vec![entry(3)]]
        );
        assert_eq!((backlog.pending(), p.sent()), (0, 4));
    }

    /// `batch_process_entries`: labelled by the first request, the buffer's count while
    /// entries wait, 0 when they are handed on (full batch or timer); none for batches of 1.
    #[tokio::test(start_paused = true)]
    async fn the_gauge_counts_what_the_buffer_holds() {
        let services = PluginServices::default();
        let gauges = services.shared::<BatchGauges>();
        let (_, p) = recorded(&services, 3, Arc::new(Backlog::default()), 100);
        assert!(p.wants_labels());
        assert!(p.push(entry(0)));
        assert!(gauges.values().is_empty(), "no labels yet: no series");
        p.label("r1", "127.0.0.1");
        p.label("r2", "10.0.0.1");
        assert!(!p.wants_labels());
        let key = [
            "log buffer".to_owned(),
            "r1".to_owned(),
            "127.0.0.1".to_owned(),
        ];
        assert!(p.push(entry(1)));
        assert_eq!(gauges.values(), vec![(key.clone(), 2)]);
        assert!(p.push(entry(2)));
        assert_eq!(gauges.values(), vec![(key.clone(), 0)], "a full batch went");
        assert!(p.push(entry(3)));
        assert_eq!(gauges.values(), vec![(key.clone(), 1)]);
        tokio::time::sleep(Duration::from_millis(2100)).await;
        settle().await;
        assert_eq!(gauges.values(), vec![(key, 0)], "flushed by the timer");
        let (_, alone) = recorded(&services, 1, Arc::new(Backlog::default()), 100);
        assert!(!alone.wants_labels());
    }

    #[tokio::test(start_paused = true)]
    async fn buffer_duration_bounds_a_steady_trickle() {
        let services = PluginServices::default();
        let (sink, p) = recorded(&services, 1000, Default::default(), 10_000);
        for i in 0..11 {
            p.push(entry(i));
            tokio::time::sleep(Duration::from_secs(1)).await;
            settle().await;
        }
        // Entries every second never leave it inactive; the 10 s buffer_duration flushes.
        let batches = sink.batches.lock().unwrap().clone();
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].len(), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_then_drops_and_the_backlog_bounds_memory() {
        let services = PluginServices::default();
        let backlog = Arc::new(Backlog::default());
        let (sink, p) = recorded(&services, 1, backlog.clone(), 5);
        sink.down.store(true, Ordering::Relaxed);
        let accepted = (0..8).filter(|i| p.push(entry(*i))).count();
        assert_eq!(accepted, 5);
        assert_eq!(backlog.discarded(), 3);
        settle().await;
        assert_eq!(sink.attempts.load(Ordering::Relaxed), 5);
        tokio::time::sleep(Duration::from_millis(1100)).await;
        settle().await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
        settle().await;
        // The first try and max_retry_count (2) more, then dropped.
        assert_eq!(sink.attempts.load(Ordering::Relaxed), 15);
        assert_eq!(backlog.pending(), 0);
        sink.down.store(false, Ordering::Relaxed);
        assert!(p.push(entry(9)));
        settle().await;
        assert_eq!(sink.batches.lock().unwrap().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_flushes_the_buffer() {
        let services = PluginServices::default();
        let (sink, p) = recorded(&services, 1000, Default::default(), 10_000);
        for i in 0..7 {
            p.push(entry(i));
        }
        assert!(services.shutdown().drain(Duration::from_secs(5)).await);
        assert_eq!(sink.batches.lock().unwrap()[0].len(), 7);
        // After the shutdown started, entries go out at once.
        p.push(entry(8));
        settle().await;
        assert_eq!(sink.batches.lock().unwrap().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_processor_flushes() {
        let services = PluginServices::default();
        let (sink, p) = recorded(&services, 1000, Default::default(), 10_000);
        p.push(entry(1));
        drop(p);
        settle().await;
        assert_eq!(sink.batches.lock().unwrap().len(), 1);
    }

    #[test]
    fn schema_wrapping() {
        let s = wrap_schema(
            json!({"type": "object", "properties": {"uri": {"type": "string"}}}),
            "http logger",
        );
        assert_eq!(s["properties"]["name"]["default"], "http logger");
        assert_eq!(s["properties"]["batch_max_size"]["minimum"], 1);
        let m = wrap_metadata_schema(json!({"type": "object", "properties": {}}));
        assert_eq!(m["properties"]["max_pending_entries"]["default"], 8192);
    }
}
