//! kafka-logger (`apisix/plugins/kafka-logger.lua` on lua-resty-kafka's producer): each batch
//! of the batch processor becomes one Kafka message on `kafka_topic` (a JSON array of entries;
//! a lone entry unwrapped when `batch_max_size` is 1), with `key` as the record key, sent by
//! rskafka (pure Rust) to the partition's leader among `brokers` (or the deprecated
//! `broker_list`), with SASL (`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`) when a broker has a
//! `sasl_config`, over TLS with `tls`.
//!
//! Entries are APISIX's default entry or `log_format` (`meta_format: default`), or the raw
//! request (`origin`: the request line, the headers and, with `include_req_body`, the body).
//!
//! The producer is lua-resty-kafka's. `sync` sends the message and waits for the broker's
//! answer, so a failure fails the batch (retried as the batch processor says). `async` (the
//! default) buffers messages, at most `producer_max_buffering` (more are refused, which fails
//! the batch), and a background task sends them per partition in requests of at most
//! `producer_batch_num` messages and `producer_batch_size` bytes, when that many are waiting or
//! every `producer_time_linger` seconds; a request that fails is tried 3 times, 100 ms apart
//! (lua-resty-kafka's `max_retry` and `retry_backoff`), then its messages are dropped and
//! counted in the error log. The partition is the key's CRC-32 modulo the topic's partitions,
//! or a rotating counter without a key (lua-resty-kafka's default partitioner); partitions are
//! re-read every `meta_refresh_interval` seconds. Every broker call is bounded by `timeout`
//! seconds. Nothing of this runs on the request path: a broker that is down costs a request
//! only the push of its entry.
//!
//! Producers are kept per conf (the batch processor's), so `cluster_name`, which keeps
//! lua-resty-kafka's producers of different clusters apart, has nothing more to separate.
//! Differences: rskafka always asks for `acks: all` (-1), which also satisfies
//! `required_acks: 1`, and speaks Produce v3+ with record batches (`api_version` 0-2 are
//! accepted; the broker stores each record's timestamp, as `api_version: 2`). `tls` is the
//! gateway's TLS client: `verify` against `apisix.ssl.ssl_trusted_certificate` (default the
//! system's bundle), else any certificate. Beyond APISIX: `compression` (`none`, `gzip`,
//! `snappy`; absent: none, as lua-resty-kafka sends) compresses each record batch; lz4 and
//! zstd are not offered, their codecs being C libraries.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{
    CompileCtx, LogCtx, LogNeeds, Phases, Plugin, PluginDef, PluginServices, Shutdown, TlsClient,
};
use rskafka::chrono::{DateTime, Utc};
use rskafka::client::partition::{Compression, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder, Credentials, SaslConfig};
use rskafka::record::Record;
use rskafka::BackoffConfig;
use rustls::ClientConfig;
use serde_json::{json, Map, Value};
use tokio::sync::Notify;

use super::sink::{self, encode_batch, BatchSink, Concat, Logger, SendError, SendFuture};

#[cfg(any(test, feature = "test-support"))]
pub mod test_broker;

pub const NAME: &str = "kafka-logger";

pub static DEF: PluginDef = PluginDef {
    metadata_schema: Some(sink::metadata_schema),
    check: Some(sink::check),
    encrypt_fields: &["brokers.sasl_config.password"],
    ..PluginDef::new(NAME, 403, schema, compile)
};

/// lua-resty-kafka's `max_retry` and `retry_backoff` for the async producer's requests.
const ASYNC_TRIES: u32 = 3;
const ASYNC_RETRY_BACKOFF: Duration = Duration::from_millis(100);

fn schema() -> Value {
    let mut props = Map::new();
    props.insert(
        "meta_format".into(),
        json!({"type": "string", "default": "default", "enum": ["default", "origin"]}),
    );
    props.insert(
        "broker_list".into(),
        json!({
            "type": "object",
            "minProperties": 1,
            "patternProperties": {
                ".*": {"description": "the port of kafka broker", "type": "integer", "minimum": 1, "maximum": 65535}
            }
        }),
    );
    props.insert(
        "brokers".into(),
        json!({
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "host": {"type": "string", "description": "the host of kafka broker"},
                    "port": {"type": "integer", "minimum": 1, "maximum": 65535, "description": "the port of kafka broker"},
                    "sasl_config": {
                        "type": "object",
                        "description": "sasl config",
                        "properties": {
                            "mechanism": {"type": "string", "default": "PLAIN", "enum": ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]},
                            "user": {"type": "string", "description": "user"},
                            "password": {"type": "string", "description": "password"}
                        },
                        "required": ["user", "password"]
                    }
                },
                "required": ["host", "port"]
            },
            "uniqueItems": true
        }),
    );
    props.insert(
        "tls".into(),
        json!({
            "type": "object",
            "description": "tls config for connecting to kafka brokers",
            "properties": {"verify": {"type": "boolean", "default": false}}
        }),
    );
    props.insert("kafka_topic".into(), json!({"type": "string"}));
    props.insert(
        "producer_type".into(),
        json!({"type": "string", "default": "async", "enum": ["async", "sync"]}),
    );
    props.insert(
        "required_acks".into(),
        json!({"type": "integer", "default": 1, "enum": [1, -1]}),
    );
    props.insert("key".into(), json!({"type": "string"}));
    props.insert(
        "timeout".into(),
        json!({"type": "integer", "minimum": 1, "default": 3}),
    );
    let int =
        |min: u64, default: u64| json!({"type": "integer", "minimum": min, "default": default});
    props.insert("cluster_name".into(), int(1, 1));
    props.insert("producer_batch_num".into(), int(1, 200));
    props.insert("producer_batch_size".into(), int(0, 1_048_576));
    props.insert("producer_max_buffering".into(), int(1, 50_000));
    props.insert("producer_time_linger".into(), int(1, 1));
    props.insert("meta_refresh_interval".into(), int(1, 30));
    // Beyond APISIX (lua-resty-kafka sends uncompressed): the record batches' codec. No
    // default, so a conf written without it stays as APISIX stores it.
    props.insert(
        "compression".into(),
        json!({"type": "string", "enum": ["none", "gzip", "snappy"]}),
    );
    props.insert(
        "api_version".into(),
        json!({"type": "integer", "default": 1, "enum": [0, 1, 2]}),
    );
    sink::schema(
        json!({
            "type": "object",
            "properties": props,
            "oneOf": [
                {"required": ["broker_list", "kafka_topic"]},
                {"required": ["brokers", "kafka_topic"]}
            ]
        }),
        "kafka logger",
    )
}

/// What the producer was configured with.
#[derive(Clone, Debug)]
struct ProducerConf {
    brokers: Vec<String>,
    sasl: Option<SaslConfig>,
    tls: Option<Arc<ClientConfig>>,
    timeout: Duration,
    sync: bool,
    batch_num: usize,
    batch_size: usize,
    max_buffering: usize,
    linger: Duration,
    refresh: Duration,
    compression: Compression,
}

impl ProducerConf {
    /// `tls` takes the gateway's TLS client configs: `verify` against the trusted bundle
    /// (`apisix.ssl.ssl_trusted_certificate`, default the system's), else any certificate.
    fn new(conf: &Map<String, Value>, tls: &TlsClient) -> Result<ProducerConf, String> {
        let int = |k: &str, d: u64| conf.get(k).and_then(Value::as_u64).unwrap_or(d);
        let mut brokers = Vec::new();
        let mut sasl = None;
        for b in conf
            .get("brokers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let host = b.get("host").and_then(Value::as_str).unwrap_or("");
            let port = b.get("port").and_then(Value::as_u64).unwrap_or(9092);
            brokers.push(broker_addr(host, port));
            if let Some(s) = b.get("sasl_config") {
                let text = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
                let credentials = Credentials::new(text("user"), text("password"));
                sasl = Some(match s.get("mechanism").and_then(Value::as_str) {
                    Some("SCRAM-SHA-256") => SaslConfig::ScramSha256(credentials),
                    Some("SCRAM-SHA-512") => SaslConfig::ScramSha512(credentials),
                    _ => SaslConfig::Plain(credentials),
                });
            }
        }
        for (host, port) in conf
            .get("broker_list")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            brokers.push(broker_addr(host, port.as_u64().unwrap_or(9092)));
        }
        if brokers.is_empty() {
            return Err("no kafka broker configured".into());
        }
        let tls = match conf.get("tls") {
            Some(t) => Some(
                tls.config(t.get("verify").and_then(Value::as_bool) == Some(true))
                    .map_err(|e| format!("tls: {e}"))?,
            ),
            None => None,
        };
        Ok(ProducerConf {
            brokers,
            sasl,
            tls,
            timeout: Duration::from_secs(int("timeout", 3).max(1)),
            sync: conf.get("producer_type").and_then(Value::as_str) == Some("sync"),
            batch_num: int("producer_batch_num", 200).max(1) as usize,
            batch_size: int("producer_batch_size", 1_048_576) as usize,
            max_buffering: int("producer_max_buffering", 50_000).max(1) as usize,
            linger: Duration::from_secs(int("producer_time_linger", 1).max(1)),
            refresh: Duration::from_secs(int("meta_refresh_interval", 30).max(1)),
            compression: match conf.get("compression").and_then(Value::as_str) {
                Some("gzip") => Compression::Gzip,
                Some("snappy") => Compression::Snappy,
                _ => Compression::NoCompression,
            },
        })
    }
}

fn broker_addr(host: &str, port: u64) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The connection to the cluster, made on first use and again after a failure.
#[derive(Default)]
struct Cluster {
    client: Option<Arc<Client>>,
    /// Partitions of each topic, and when they were read.
    partitions: HashMap<String, (Vec<i32>, Instant)>,
    leaders: HashMap<(String, i32), Arc<PartitionClient>>,
}

/// A message as the async producer's buffer holds it: topic, key, value.
type Message = (Arc<str>, Option<Vec<u8>>, Bytes);

/// One message of the async producer, placed on its partition.
struct Pending {
    topic: Arc<str>,
    partition: i32,
    record: Record,
}

/// lua-resty-kafka's producer for one conf.
struct Producer {
    conf: ProducerConf,
    cluster: tokio::sync::Mutex<Cluster>,
    /// `correlation_id`, which places keyless messages.
    next: AtomicU32,
    buffer: Mutex<VecDeque<Message>>,
    buffered: AtomicUsize,
    wake: Notify,
    closed: AtomicBool,
}

fn kafka_error(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Producer {
    fn new(conf: ProducerConf) -> Producer {
        Producer {
            conf,
            cluster: tokio::sync::Mutex::new(Cluster::default()),
            next: AtomicU32::new(0),
            buffer: Mutex::new(VecDeque::new()),
            buffered: AtomicUsize::new(0),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
        }
    }

    fn client_builder(&self) -> ClientBuilder {
        let mut b = ClientBuilder::new(self.conf.brokers.clone())
            .client_id("ferrisix")
            .backoff_config(BackoffConfig {
                // rskafka retries until a deadline; ours is the conf's timeout.
                deadline: Some(self.conf.timeout),
                ..BackoffConfig::default()
            });
        if let Some(s) = &self.conf.sasl {
            b = b.sasl_config(s.clone());
        }
        if let Some(t) = &self.conf.tls {
            b = b.tls_config(t.clone());
        }
        b
    }

    /// The topic's partitions and the one for `key`.
    async fn partition(
        &self,
        cluster: &mut Cluster,
        topic: &str,
        key: Option<&[u8]>,
    ) -> Result<i32, String> {
        let client = match &cluster.client {
            Some(c) => c.clone(),
            None => {
                let c = Arc::new(self.client_builder().build().await.map_err(kafka_error)?);
                cluster.client = Some(c.clone());
                c
            }
        };
        let fresh = cluster
            .partitions
            .get(topic)
            .is_some_and(|(_, at)| at.elapsed() < self.conf.refresh);
        if !fresh {
            let topics = client.list_topics().await.map_err(kafka_error)?;
            for t in topics {
                let parts: Vec<i32> = t.partitions.into_iter().collect();
                cluster.partitions.insert(t.name, (parts, Instant::now()));
            }
        }
        let Some((parts, _)) = cluster.partitions.get(topic).filter(|(p, _)| !p.is_empty()) else {
            return Err(format!("not found topic {topic}"));
        };
        let id = match key {
            Some(k) => crc32fast::hash(k),
            None => self.next.fetch_add(1, Ordering::Relaxed),
        };
        Ok(parts[id as usize % parts.len()])
    }

    async fn leader(
        &self,
        cluster: &mut Cluster,
        topic: &str,
        partition: i32,
    ) -> Result<Arc<PartitionClient>, String> {
        let k = (topic.to_owned(), partition);
        if let Some(c) = cluster.leaders.get(&k) {
            return Ok(c.clone());
        }
        let client = cluster.client.clone().ok_or("no kafka client")?;
        let c = Arc::new(
            client
                .partition_client(topic, partition, UnknownTopicHandling::Error)
                .await
                .map_err(kafka_error)?,
        );
        cluster.leaders.insert(k, c.clone());
        Ok(c)
    }

    /// Places and sends `records` (all for `topic`, with `key`), bounded by the timeout; a
    /// failure forgets the connection so the next call starts afresh.
    async fn send_now(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        values: Vec<Bytes>,
    ) -> Result<(), String> {
        let attempt = async {
            let mut cluster = self.cluster.lock().await;
            let mut by_partition: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
            for v in values {
                let p = self.partition(&mut cluster, topic, key).await?;
                by_partition.entry(p).or_default().push(record(key, &v));
            }
            for (p, records) in by_partition {
                let leader = self.leader(&mut cluster, topic, p).await?;
                for chunk in self.chunks(records) {
                    if let Err(e) = leader.produce(chunk, self.conf.compression).await {
                        cluster.leaders.remove(&(topic.to_owned(), p));
                        return Err(kafka_error(e));
                    }
                }
            }
            Ok(())
        };
        match tokio::time::timeout(self.conf.timeout, attempt).await {
            Ok(r) => r,
            Err(_) => Err("timeout".into()),
        }
        .inspect_err(|_| {
            if let Ok(mut c) = self.cluster.try_lock() {
                *c = Cluster::default();
            }
        })
    }

    /// Requests of at most `producer_batch_num` records and `producer_batch_size` bytes.
    fn chunks(&self, records: Vec<Record>) -> Vec<Vec<Record>> {
        let mut out: Vec<Vec<Record>> = Vec::new();
        let mut size = 0;
        for r in records {
            let n = r.approximate_size();
            let start = match out.last() {
                None => true,
                Some(last) => {
                    last.len() >= self.conf.batch_num
                        || (self.conf.batch_size > 0 && size + n > self.conf.batch_size)
                }
            };
            if start {
                out.push(Vec::new());
                size = 0;
            }
            size += n;
            if let Some(last) = out.last_mut() {
                last.push(r);
            }
        }
        out
    }

    /// The async producer's `send`: buffers, or refuses when the buffer is full.
    fn buffer(&self, topic: Arc<str>, key: Option<Vec<u8>>, value: Bytes) -> Result<(), String> {
        if self.buffered.fetch_add(1, Ordering::Relaxed) >= self.conf.max_buffering {
            self.buffered.fetch_sub(1, Ordering::Relaxed);
            return Err("buffer overflow".into());
        }
        let n = {
            let mut b = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
            b.push_back((topic, key, value));
            b.len()
        };
        if n >= self.conf.batch_num {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Sends what the buffer holds, partition by partition; answers how many were dropped.
    async fn flush(&self) -> usize {
        let taken: Vec<_> = {
            let mut b = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
            b.drain(..).collect()
        };
        if taken.is_empty() {
            return 0;
        }
        self.buffered.fetch_sub(taken.len(), Ordering::Relaxed);
        // Placed first, so a retry goes to the same partition.
        let mut placed: Vec<Pending> = Vec::with_capacity(taken.len());
        let mut dropped = 0;
        {
            let mut cluster = self.cluster.lock().await;
            // One failure to reach the cluster drops the rest of this flush too, rather
            // than waiting `timeout` again for each message.
            let mut unreachable: Option<String> = None;
            for (topic, key, value) in taken {
                if unreachable.is_some() {
                    dropped += 1;
                    continue;
                }
                let p = tokio::time::timeout(
                    self.conf.timeout,
                    self.partition(&mut cluster, &topic, key.as_deref()),
                )
                .await
                .unwrap_or_else(|_| Err("timeout".into()));
                match p {
                    Ok(partition) => placed.push(Pending {
                        record: record(key.as_deref(), &value),
                        topic,
                        partition,
                    }),
                    Err(e) => {
                        *cluster = Cluster::default();
                        dropped += 1;
                        unreachable = Some(e);
                    }
                }
            }
            if let Some(e) = unreachable {
                tracing::error!(error = %e, messages = dropped,
                    "kafka-logger: failed to reach kafka, messages dropped");
            }
        }
        let mut groups: BTreeMap<(Arc<str>, i32), Vec<Record>> = BTreeMap::new();
        for p in placed {
            groups
                .entry((p.topic, p.partition))
                .or_default()
                .push(p.record);
        }
        for ((topic, partition), records) in groups {
            for chunk in self.chunks(records) {
                let n = chunk.len();
                let mut last = String::new();
                let mut sent = false;
                for attempt in 0..ASYNC_TRIES {
                    if attempt > 0 {
                        tokio::time::sleep(ASYNC_RETRY_BACKOFF).await;
                    }
                    match self.produce(&topic, partition, chunk.clone()).await {
                        Ok(()) => {
                            sent = true;
                            break;
                        }
                        Err(e) => last = e,
                    }
                }
                if !sent {
                    dropped += n;
                    tracing::error!(error = %last, %topic, partition, messages = n,
                        "kafka-logger: failed to send messages to kafka, dropped");
                }
            }
        }
        dropped
    }

    async fn produce(
        &self,
        topic: &str,
        partition: i32,
        records: Vec<Record>,
    ) -> Result<(), String> {
        let attempt = async {
            let mut cluster = self.cluster.lock().await;
            if cluster.client.is_none() {
                self.partition(&mut cluster, topic, None).await?;
            }
            let leader = self.leader(&mut cluster, topic, partition).await?;
            drop(cluster);
            leader
                .produce(records, self.conf.compression)
                .await
                .map(|_| ())
                .map_err(kafka_error)
        };
        let r = match tokio::time::timeout(self.conf.timeout, attempt).await {
            Ok(r) => r,
            Err(_) => Err("timeout".into()),
        };
        if r.is_err() {
            *self.cluster.lock().await = Cluster::default();
        }
        r
    }

    /// The async producer's task: flushes every `producer_time_linger`, when
    /// `producer_batch_num` messages wait, and at shutdown; ends when the conf is gone.
    async fn run(self: Arc<Self>, shutdown: Shutdown) {
        loop {
            let done = self.closed.load(Ordering::Relaxed) || shutdown.is_started();
            if !done {
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(self.conf.linger) => {}
                    _ = shutdown.started() => {}
                }
            }
            self.flush().await;
            if done && self.buffered.load(Ordering::Relaxed) == 0 {
                return;
            }
        }
    }
}

/// The wall clock as a record timestamp (rskafka builds chrono without its clock).
fn now() -> DateTime<Utc> {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

fn record(key: Option<&[u8]>, value: &[u8]) -> Record {
    Record {
        key: key.map(<[u8]>::to_vec),
        value: Some(value.to_vec()),
        headers: BTreeMap::new(),
        timestamp: now(),
    }
}

/// Sends each batch as one message.
pub(super) struct KafkaSink {
    topic: Arc<str>,
    key: Option<Vec<u8>>,
    producer: Arc<Producer>,
    shutdown: Shutdown,
}

impl Drop for KafkaSink {
    fn drop(&mut self) {
        self.producer.closed.store(true, Ordering::Relaxed);
        self.producer.wake.notify_one();
    }
}

impl KafkaSink {
    /// A producer for `conf` (kafka-logger's keys: `brokers`, `tls`, `kafka_topic`, `key`,
    /// `producer_type`, `timeout`, `meta_refresh_interval`, ...), its async task started.
    /// error-log-logger's `kafka` sends through it too.
    pub(super) fn new(
        conf: &Map<String, Value>,
        services: &PluginServices,
    ) -> Result<KafkaSink, String> {
        let producer = Arc::new(Producer::new(ProducerConf::new(conf, services.tls())?));
        if !producer.conf.sync {
            let task = producer.clone().run(services.shutdown().clone());
            let hold = services.shutdown().hold();
            services
                .executor()
                .spawn(async move {
                    task.await;
                    drop(hold);
                })
                .map_err(|e| format!("no kafka producer task: {e}"))?;
        }
        Ok(KafkaSink {
            topic: conf
                .get("kafka_topic")
                .and_then(Value::as_str)
                .unwrap_or("")
                .into(),
            key: conf
                .get("key")
                .and_then(Value::as_str)
                .map(|k| k.as_bytes().to_vec()),
            producer,
            shutdown: services.shutdown().clone(),
        })
    }

    /// Sends one message (sync) or buffers it (async).
    pub(super) async fn send_batch(&self, message: Bytes) -> Result<(), SendError> {
        let p = &self.producer;
        // At shutdown the async task may be gone: the last batches are sent at once.
        let r = if p.conf.sync || self.shutdown.is_started() {
            p.send_now(&self.topic, self.key.as_deref(), vec![message])
                .await
        } else {
            p.buffer(self.topic.clone(), self.key.clone(), message)
        };
        r.map_err(|e| {
            SendError::new(format!(
                "failed to send data to Kafka topic: {e}, brokers: {}",
                lua::cjson_encode(&json!(p.conf.brokers))
            ))
        })
    }
}

impl BatchSink for KafkaSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], batch_max_size: usize) -> SendFuture<'a> {
        Box::pin(self.send_batch(encode_batch(entries, batch_max_size, Concat::Json)))
    }
}

struct KafkaLogger {
    logger: Logger,
    needs: LogNeeds,
    origin: bool,
    include_req_body: bool,
    /// Entries are JSON strings inside a batch; a lone one (`batch_max_size` 1) goes raw.
    raw: bool,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let services = cx.services;
    let logger = Logger::compile(cx, NAME, false, |conf| {
        Ok(Arc::new(KafkaSink::new(conf, services)?) as Arc<dyn BatchSink>)
    })?;
    let conf = cx.filled();
    let origin = conf.get("meta_format").and_then(Value::as_str) == Some("origin");
    let include_req_body = conf.get("include_req_body").and_then(Value::as_bool) == Some(true);
    let mut needs = logger.needs();
    if origin {
        needs = needs.union(&super::logger::origin_needs(&conf));
    }
    Ok(Arc::new(KafkaLogger {
        logger,
        needs,
        origin,
        include_req_body,
        raw: conf.get("batch_max_size").and_then(Value::as_u64) == Some(1),
    }))
}

impl Plugin for KafkaLogger {
    fn phases(&self) -> Phases {
        Phases::LOG
    }

    fn log_needs(&self) -> LogNeeds {
        self.needs.clone()
    }

    fn log(&self, ctx: &LogCtx) {
        if !self.origin {
            self.logger.log(ctx);
            return;
        }
        super::logger::log_original(&self.logger, ctx, self.include_req_body, self.raw);
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    use super::test_broker::{broker, tls_broker, Stored};
    use super::*;
    use crate::testing::Compiler;

    fn log_ctx(p: &dyn Plugin, n: usize) -> LogCtx {
        crate::log::sink::testing::log_ctx_with_request(p, n)
    }

    async fn next(rx: &mut mpsc::UnboundedReceiver<Stored>) -> Stored {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a record in time")
            .unwrap()
    }

    fn compile(c: &Compiler, conf: &Value, owner: &str) -> Arc<dyn Plugin> {
        (DEF.compile)(&c.cx(NAME, conf, owner, None)).unwrap()
    }

    /// Beyond APISIX: `compression` reaches the broker as the batches' codec, and they
    /// decode to the entries.
    #[tokio::test]
    async fn compressed_batches() {
        for (codec, code) in [("gzip", 1), ("snappy", 2), ("none", 0)] {
            let mut b = broker("zipped", 1, false).await;
            let c = Compiler::new();
            let conf = json!({"brokers": [{"host": "127.0.0.1", "port": b.port}],
                "kafka_topic": "zipped", "producer_type": "sync", "batch_max_size": 1,
                "compression": codec});
            let p = compile(&c, &conf, &format!("kl-zip-{codec}"));
            p.log(&log_ctx(&*p, 7));
            let r = next(&mut b.records).await;
            assert_eq!(r.compression, code, "{codec}");
            let entry: Value = serde_json::from_slice(&r.value).unwrap();
            assert_eq!(entry["request"]["uri"], "/x?n=7", "{codec}");
        }
        let r = crate::PluginRegistry::builtin();
        let bad = json!({"broker_list": {"127.0.0.1": 9092}, "kafka_topic": "t",
            "compression": "lz4"});
        assert!(r.check(NAME, &bad).is_err());
    }

    /// The async producer sends fewer than `producer_batch_num` messages when
    /// `producer_time_linger` seconds have passed (its flush timer, as lua-resty-kafka's), and
    /// re-reads the topic's partitions once they are `meta_refresh_interval` seconds old;
    /// `cluster_name` is accepted (producers are per conf already).
    #[tokio::test]
    async fn linger_and_metadata_refresh() {
        for (refresh, fresh_reads) in [(1, true), (30, false)] {
            let mut b = broker("slow", 1, false).await;
            let c = Compiler::new();
            let conf = json!({"brokers": [{"host": "127.0.0.1", "port": b.port}],
                "kafka_topic": "slow", "batch_max_size": 1, "producer_batch_num": 100,
                "producer_time_linger": 2, "meta_refresh_interval": refresh,
                "cluster_name": 2});
            let compiled = Instant::now();
            let p = compile(&c, &conf, &format!("kl-linger-{refresh}"));
            p.log(&log_ctx(&*p, 1));
            next(&mut b.records).await;
            // Never before the linger (an early send would be the defect; later is load).
            assert!(
                compiled.elapsed() >= Duration::from_millis(1900),
                "sent after {:?}",
                compiled.elapsed()
            );
            let reads = || {
                b.metadata_requests
                    .load(std::sync::atomic::Ordering::Relaxed)
            };
            let before = reads();
            tokio::time::sleep(Duration::from_millis(1100)).await;
            p.log(&log_ctx(&*p, 2));
            next(&mut b.records).await;
            // The second send reads the partitions again only when they are older than the
            // interval (the leader's connection is kept either way).
            assert_eq!(
                reads() > before,
                fresh_reads,
                "refresh {refresh}: {before} then {} metadata reads",
                reads()
            );
        }
    }

    #[tokio::test]
    async fn sync_batches_reach_the_topic_with_their_key() {
        let mut b = broker("logs", 3, false).await;
        let c = Compiler::new();
        let conf = json!({"brokers": [{"host": "127.0.0.1", "port": b.port}], "kafka_topic": "logs",
            "key": "k1", "producer_type": "sync", "batch_max_size": 2, "required_acks": -1});
        let p = compile(&c, &conf, "kl-1");
        for n in 0..4 {
            p.log(&log_ctx(&*p, n));
        }
        let (first, second) = (next(&mut b.records).await, next(&mut b.records).await);
        for r in [&first, &second] {
            assert_eq!(r.topic, "logs");
            assert_eq!(r.key.as_deref(), Some(&b"k1"[..]));
            // lua-resty-kafka's partitioner: crc32(key) % partitions.
            assert_eq!(r.partition, (crc32fast::hash(b"k1") % 3) as i32);
            assert_eq!(r.acks, -1);
        }
        let entries: Value = serde_json::from_slice(&first.value).unwrap();
        assert_eq!(entries[0]["request"]["uri"], "/x?n=0");
        assert_eq!(entries[1]["request"]["uri"], "/x?n=1");
        assert_eq!(entries[0]["route_id"], "r1");
        let entries: Value = serde_json::from_slice(&second.value).unwrap();
        assert_eq!(entries.as_array().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn async_producer_spreads_keyless_messages_and_sends_origin_requests() {
        let mut b = broker("raw", 2, false).await;
        let c = Compiler::new();
        let conf = json!({"broker_list": {"127.0.0.1": b.port}, "kafka_topic": "raw",
            "meta_format": "origin", "include_req_body": true, "batch_max_size": 1,
            "producer_batch_num": 2});
        let p = compile(&c, &conf, "kl-2");
        for n in 0..4 {
            p.log(&log_ctx(&*p, n));
        }
        let mut got = Vec::new();
        for _ in 0..4 {
            got.push(next(&mut b.records).await);
        }
        got.sort_by_key(|r| r.value.clone());
        assert_eq!(
            String::from_utf8(got[0].value.clone()).unwrap(),
            "POST /x?n=0 HTTP/1.1\r\nhost: gw.test\r\n\r\n{\"a\":1}"
        );
        assert!(got.iter().all(|r| r.key.is_none() && r.topic == "raw"));
        let on_0 = got.iter().filter(|r| r.partition == 0).count();
        assert_eq!(
            on_0, 2,
            "keyless messages rotate over the partitions: {got:?}"
        );
    }

    #[tokio::test]
    async fn tls_brokers_get_the_records_and_verify_refuses_an_unknown_ca() {
        let data = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/tls/");
        let read = |f: &str| std::fs::read_to_string(format!("{data}{f}")).unwrap();
        let mut b = tls_broker("sec", 1, &read("server.crt"), &read("server.key")).await;
        let c = Compiler::new();
        let conf = |verify: bool| {
            json!({"brokers": [{"host": "127.0.0.1", "port": b.port}], "kafka_topic": "sec",
                "producer_type": "sync", "batch_max_size": 1, "timeout": 1, "tls": {"verify": verify}})
        };
        let p = compile(&c, &conf(false), "kl-5");
        p.log(&log_ctx(&*p, 3));
        let r = next(&mut b.records).await;
        let entry: Value = serde_json::from_slice(&r.value).unwrap();
        assert_eq!(entry["request"]["uri"], "/x?n=3");
        // The test CA is none of the system's roots: nothing is sent.
        let p = compile(&c, &conf(true), "kl-6");
        p.log(&log_ctx(&*p, 4));
        assert!(
            tokio::time::timeout(Duration::from_millis(1500), b.records.recv())
                .await
                .is_err()
        );
        // Verified against a trusted bundle that holds it (the gateway's
        // `ssl_trusted_certificate`), the same connection goes through: the broker is named
        // by its IP, which the certificate lists.
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::CertificateDer;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(read("ca.crt").as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let trusted = TlsClient::new(Some(Arc::new(roots)));
        let pc = ProducerConf::new(conf(true).as_object().unwrap(), &trusted).unwrap();
        let producer = Producer::new(pc);
        producer
            .send_now("sec", None, vec![Bytes::from("verified")])
            .await
            .unwrap();
        assert_eq!(next(&mut b.records).await.value, b"verified");
    }

    #[tokio::test]
    async fn sasl_plain_authenticates_before_producing() {
        let mut b = broker("secure", 1, true).await;
        let c = Compiler::new();
        let conf = json!({"brokers": [{"host": "127.0.0.1", "port": b.port,
                "sasl_config": {"user": "user", "password": "pass"}}],
            "kafka_topic": "secure", "batch_max_size": 1, "producer_type": "sync"});
        let p = compile(&c, &conf, "kl-3");
        p.log(&log_ctx(&*p, 7));
        let r = next(&mut b.records).await;
        let entry: Value = serde_json::from_slice(&r.value).unwrap();
        assert_eq!(
            entry["request"]["uri"], "/x?n=7",
            "a lone entry is not wrapped"
        );
        assert_eq!(b.auths.recv().await.unwrap(), b"\0user\0pass");
    }

    #[tokio::test]
    async fn a_hung_broker_costs_the_log_phase_nothing_and_the_backlog_stays_bounded() {
        // Accepts connections and never answers.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let c = Compiler::new();
        let meta = json!({"max_pending_entries": 100});
        for (i, kind) in ["sync", "async"].iter().enumerate() {
            let conf = json!({"brokers": [{"host": "127.0.0.1", "port": port}], "kafka_topic": "t",
                "producer_type": kind, "batch_max_size": 10, "timeout": 1});
            let p = (DEF.compile)(&c.cx(NAME, &conf, &format!("kl-4-{i}"), Some(&meta))).unwrap();
            let backlog = c
                .registry
                .services()
                .shared::<super::super::batch_processor::Backlogs>()
                .of(NAME);
            let discarded = backlog.discarded();
            // Pushes only: if the log phase waited for the broker this would hang.
            for n in 0..1000 {
                p.log(&log_ctx(&*p, n));
            }
            assert!(backlog.pending() <= 100, "{kind}: {}", backlog.pending());
            assert!(
                backlog.discarded() - discarded >= 800,
                "{kind}: {}",
                backlog.discarded()
            );
        }
    }

    #[test]
    fn schema_and_check() {
        let r = crate::PluginRegistry::builtin();
        let ok = json!({"brokers": [{"host": "127.0.0.1", "port": 9092}], "kafka_topic": "t"});
        assert!(r.check(NAME, &ok).is_ok());
        assert!(r
            .check(
                NAME,
                &json!({"broker_list": {"127.0.0.1": 9092}, "kafka_topic": "t"})
            )
            .is_ok());
        assert!(r.check(NAME, &json!({"kafka_topic": "t"})).is_err());
        assert!(r
            .check(
                NAME,
                &json!({"brokers": [{"host": "127.0.0.1", "port": 9092}]})
            )
            .is_err());
        let bad_port = json!({"brokers": [{"host": "127.0.0.1", "port": 0}], "kafka_topic": "t"});
        assert!(r.check(NAME, &bad_port).unwrap_err().contains("port"));
        let bad_acks =
            json!({"brokers": [{"host": "a", "port": 1}], "kafka_topic": "t", "required_acks": 0});
        assert!(r
            .check(NAME, &bad_acks)
            .unwrap_err()
            .contains("required_acks"));
        let tls = json!({"brokers": [{"host": "a", "port": 1}], "kafka_topic": "t", "tls": {"verify": true}});
        assert!(r.check(NAME, &tls).is_ok());
        let info = r.get(NAME).unwrap();
        assert_eq!(info.priority, 403);
        assert_eq!(info.schema["properties"]["name"]["default"], "kafka logger");
        assert_eq!(
            info.schema["properties"]["producer_max_buffering"]["default"],
            50000
        );
    }

    #[tokio::test]
    async fn the_async_buffer_is_bounded_and_dropped_when_kafka_is_down() {
        let port = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let conf = json!({"broker_list": {"127.0.0.1": port}, "timeout": 1,
            "producer_max_buffering": 2});
        let p = Producer::new(
            ProducerConf::new(conf.as_object().unwrap(), &TlsClient::new(None)).unwrap(),
        );
        let topic: Arc<str> = "t".into();
        assert_eq!(p.buffer(topic.clone(), None, Bytes::from("a")), Ok(()));
        assert_eq!(p.buffer(topic.clone(), None, Bytes::from("b")), Ok(()));
        assert_eq!(
            p.buffer(topic.clone(), None, Bytes::from("c")),
            Err("buffer overflow".into())
        );
        let start = Instant::now();
        assert_eq!(p.flush().await, 2, "both dropped");
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "one timeout, not one per message"
        );
        assert_eq!(p.buffered.load(Ordering::Relaxed), 0);
        assert_eq!(
            p.buffer(topic, None, Bytes::from("d")),
            Ok(()),
            "room again"
        );
    }

    #[test]
    fn chunks_respect_batch_num_and_size() {
        let mut conf = ProducerConf::new(
            json!({"broker_list": {"h": 1}}).as_object().unwrap(),
            &TlsClient::new(None),
        )
        .unwrap();
        conf.batch_num = 2;
        conf.batch_size = 10;
        let p = Producer::new(conf);
        let recs = |sizes: &[usize]| {
            sizes
                .iter()
                .map(|n| record(None, &vec![b'x'; *n]))
                .collect()
        };
        let lens = |c: Vec<Vec<Record>>| c.iter().map(Vec::len).collect::<Vec<_>>();
        assert_eq!(lens(p.chunks(recs(&[1, 1, 1, 1, 1]))), [2, 2, 1]);
        assert_eq!(lens(p.chunks(recs(&[6, 6, 3]))), [1, 2]);
        assert_eq!(
            lens(p.chunks(recs(&[20]))),
            [1],
            "an oversized message still goes alone"
        );
        assert_eq!(broker_addr("::1", 9092), "[::1]:9092");
    }
}
