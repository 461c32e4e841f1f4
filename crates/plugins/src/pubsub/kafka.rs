//! The Kafka backend of pub-sub (`apisix/pubsub/kafka.lua` on lua-resty-kafka's basic
//! consumer), on rskafka: `cmd_kafka_list_offset` (ListOffsets: `timestamp` -1 the partition's
//! next offset, -2 its first, else the first offset at or after that time, -1 when none is)
//! and `cmd_kafka_fetch` (Fetch from `offset`: the records with their offset, timestamp, key
//! and value, none before `offset`). The brokers are the upstream's nodes, with SASL/PLAIN from
//! kafka-proxy and TLS from the upstream's `tls` (`verify`).
//!
//! One connection to the cluster per WebSocket connection, made on the first command (and
//! again after a failure), as APISIX makes one consumer per connection. Failures are answered
//! as APISIX words them: `failed to list offset, topic: <t>, partition: <p>, err: <e>` (and
//! `failed to fetch message, ...`), where `<e>` is `not found topic` when no broker answered
//! the metadata request or the topic is unknown, `not found partition`, the broker's error
//! name (`OFFSET_OUT_OF_RANGE`), or `timeout` when a broker that accepted the connection
//! does not answer. rskafka retries a failing broker for 3 seconds (lua-resty-kafka's socket
//! timeout) before a command fails.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rskafka::chrono::{DateTime, Utc};
use rskafka::client::error::{Error as KafkaError, ProtocolError};
use rskafka::client::partition::{OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder, Credentials, SaslConfig};
use rskafka::BackoffConfig;
use rustls::ClientConfig;

use super::proto::{pub_sub_req, pub_sub_resp, KafkaFetchResp, KafkaListOffsetResp, KafkaMessage};
use super::Commands;

/// lua-resty-kafka's socket timeout: how long rskafka goes on retrying a broker call.
const TIMEOUT: Duration = Duration::from_secs(3);

/// The bound of each step of a command (connecting, reading the metadata, the call itself),
/// for brokers that accept and never answer; past rskafka's own retries, so that a broker
/// that refuses is reported as such rather than as a timeout.
const STEP_LIMIT: Duration = Duration::from_secs(6);

/// lua-resty-kafka's fetch: at most 10 MiB, waiting at most a second for them (it asks no
/// minimum, so the broker answers at once).
const FETCH_MAX_BYTES: i32 = 10 * 1024 * 1024;
const FETCH_MAX_WAIT_MS: i32 = 1000;

/// Where a kafka upstream's brokers are: compiled with the upstream.
#[derive(Debug, Clone)]
pub struct KafkaUpstream {
    /// `host:port` of each node.
    pub brokers: Vec<String>,
    /// The upstream's `tls`.
    pub tls: Option<Arc<ClientConfig>>,
}

/// kafka-proxy's `sasl`, kept for the request by its access phase.
#[derive(Clone)]
pub struct KafkaSasl {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for KafkaSasl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSasl")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// The consumer of one pub-sub connection.
pub struct KafkaConsumer {
    upstream: Arc<KafkaUpstream>,
    sasl: Option<KafkaSasl>,
    client: Option<Client>,
    partitions: HashMap<(String, i32), PartitionClient>,
}

impl KafkaConsumer {
    pub fn new(upstream: Arc<KafkaUpstream>, sasl: Option<KafkaSasl>) -> KafkaConsumer {
        KafkaConsumer {
            upstream,
            sasl,
            client: None,
            partitions: HashMap::new(),
        }
    }

    async fn client(&mut self) -> Result<&Client, String> {
        if self.client.is_none() {
            let mut b = ClientBuilder::new(self.upstream.brokers.clone())
                .client_id("ferrisix")
                .backoff_config(BackoffConfig {
                    deadline: Some(TIMEOUT),
                    ..BackoffConfig::default()
                });
            if let Some(s) = &self.sasl {
                b = b.sasl_config(SaslConfig::Plain(Credentials::new(
                    s.username.clone(),
                    s.password.clone(),
                )));
            }
            if let Some(t) = &self.upstream.tls {
                b = b.tls_config(t.clone());
            }
            match tokio::time::timeout(STEP_LIMIT, b.build()).await {
                Ok(Ok(c)) => self.client = Some(c),
                Ok(Err(e)) => {
                    tracing::error!("all brokers failed in fetch topic metadata: {e}");
                    return Err("not found topic".into());
                }
                Err(_) => {
                    tracing::error!("all brokers failed in fetch topic metadata: timeout");
                    return Err("not found topic".into());
                }
            }
        }
        Ok(self.client.as_ref().expect("just made"))
    }

    /// The client of the partition's leader (lua-resty-kafka's `choose_broker`).
    async fn partition(
        &mut self,
        topic: &str,
        partition: i32,
    ) -> Result<&PartitionClient, Failure> {
        let key = (topic.to_owned(), partition);
        if !self.partitions.contains_key(&key) {
            let client = self.client().await.map_err(Failure::Answer)?;
            let topics = match tokio::time::timeout(STEP_LIMIT, client.list_topics()).await {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => {
                    tracing::error!("all brokers failed in fetch topic metadata: {e}");
                    return Err(Failure::Broken("not found topic".into()));
                }
                Err(_) => {
                    let e = "timeout";
                    tracing::error!("all brokers failed in fetch topic metadata: {e}");
                    return Err(Failure::Broken("not found topic".into()));
                }
            };
            let Some(t) = topics.iter().find(|t| t.name == topic) else {
                return Err(Failure::Answer("not found topic".into()));
            };
            if !t.partitions.contains(&partition) {
                return Err(Failure::Answer("not found partition".into()));
            }
            let pc = client.partition_client(topic, partition, UnknownTopicHandling::Error);
            let pc = tokio::time::timeout(STEP_LIMIT, pc)
                .await
                .map_err(|_| Failure::Broken("timeout".into()))?
                .map_err(Failure::of)?;
            self.partitions.insert(key.clone(), pc);
        }
        Ok(&self.partitions[&key])
    }

    /// The offset for `timestamp` (-1 latest, -2 earliest, else milliseconds).
    pub async fn list_offset(
        &mut self,
        topic: &str,
        partition: i32,
        timestamp: i64,
    ) -> Result<i64, String> {
        let at = match timestamp {
            -1 => OffsetAt::Latest,
            -2 => OffsetAt::Earliest,
            ms => OffsetAt::Timestamp(timestamp_of(ms)),
        };
        let r = self
            .bounded(topic, partition, |pc| Box::pin(pc.get_offset(at)))
            .await;
        r.map_err(|e| {
            format!("failed to list offset, topic: {topic}, partition: {partition}, err: {e}")
        })
    }

    /// The records from `offset` on.
    pub async fn fetch(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<Vec<KafkaMessage>, String> {
        let r = self
            .bounded(topic, partition, |pc| {
                Box::pin(pc.fetch_records(offset, 0..FETCH_MAX_BYTES, FETCH_MAX_WAIT_MS))
            })
            .await;
        match r {
            Ok((records, _high_watermark)) => Ok(records
                .into_iter()
                .map(|r| KafkaMessage {
                    offset: r.offset,
                    timestamp: r.record.timestamp.timestamp_millis(),
                    key: r.record.key.unwrap_or_default(),
                    value: r.record.value.unwrap_or_default(),
                })
                .collect()),
            Err(e) => Err(format!(
                "failed to fetch message, topic: {topic}, partition: {partition}, err: {e}"
            )),
        }
    }

    /// Runs `op` on the partition's leader within the timeout. A failure other than the
    /// broker's answer forgets the connection, so the next command starts afresh.
    async fn bounded<T>(
        &mut self,
        topic: &str,
        partition: i32,
        op: impl for<'a> FnOnce(&'a PartitionClient) -> KafkaFuture<'a, T>,
    ) -> Result<T, String> {
        let attempt = async {
            let pc = self.partition(topic, partition).await?;
            match tokio::time::timeout(STEP_LIMIT, op(pc)).await {
                Ok(r) => r.map_err(Failure::of),
                Err(_) => Err(Failure::Broken("timeout".into())),
            }
        };
        let broken = match attempt.await {
            Ok(v) => return Ok(v),
            Err(Failure::Answer(e)) => return Err(e),
            Err(Failure::Broken(e)) => e,
        };
        self.client = None;
        self.partitions.clear();
        Err(broken)
    }
}

type KafkaFuture<'a, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, KafkaError>> + Send + 'a>>;

/// Why a command failed: the cluster's answer, or a broken connection (forgotten then).
enum Failure {
    Answer(String),
    Broken(String),
}

impl Failure {
    fn of(e: KafkaError) -> Failure {
        match e {
            KafkaError::ServerError { protocol_error, .. } => {
                Failure::Answer(protocol_error_name(protocol_error))
            }
            KafkaError::Timeout => Failure::Broken("timeout".into()),
            other => Failure::Broken(other.to_string()),
        }
    }
}

impl Commands for KafkaConsumer {
    async fn handle(
        &mut self,
        cmd: pub_sub_req::Req,
    ) -> Option<Result<pub_sub_resp::Resp, String>> {
        Some(match cmd {
            pub_sub_req::Req::CmdKafkaListOffset(c) => self
                .list_offset(&c.topic, c.partition, c.timestamp)
                .await
                .map(|offset| {
                    pub_sub_resp::Resp::KafkaListOffsetResp(KafkaListOffsetResp { offset })
                }),
            pub_sub_req::Req::CmdKafkaFetch(c) => self
                .fetch(&c.topic, c.partition, c.offset)
                .await
                .map(|messages| pub_sub_resp::Resp::KafkaFetchResp(KafkaFetchResp { messages })),
            _ => return None,
        })
    }
}

/// A timestamp in milliseconds; ones beyond what a date can hold are taken as the farthest
/// date (the broker's answer is the same: no record is that old or that new).
fn timestamp_of(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(if ms < 0 {
        DateTime::<Utc>::MIN_UTC
    } else {
        DateTime::<Utc>::MAX_UTC
    })
}

/// Kafka's name of a protocol error (`OFFSET_OUT_OF_RANGE`), from rskafka's variant name.
fn protocol_error_name(e: ProtocolError) -> String {
    if let ProtocolError::Unknown(code) = e {
        return format!("UNKNOWN_ERROR_CODE_{code}");
    }
    let camel = format!("{e:?}");
    let mut out = String::with_capacity(camel.len() + 8);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::kafka_logger::test_broker::broker;

    fn consumer(port: u16, sasl: Option<(&str, &str)>) -> KafkaConsumer {
        let upstream = KafkaUpstream {
            brokers: vec![format!("127.0.0.1:{port}")],
            tls: None,
        };
        let sasl = sasl.map(|(u, p)| KafkaSasl {
            username: u.into(),
            password: p.into(),
        });
        KafkaConsumer::new(Arc::new(upstream), sasl)
    }

    fn rec(value: &str, ts: i64) -> (Option<Vec<u8>>, Option<Vec<u8>>, i64) {
        (Some(b"key".to_vec()), Some(value.as_bytes().to_vec()), ts)
    }

    #[tokio::test]
    async fn lists_offsets_and_fetches_records() {
        let mut b = broker("test-consumer", 2, false).await;
        b.append("test-consumer", 0, vec![rec("m0", 1_000), rec("m1", 2_000)]);
        b.append(
            "test-consumer",
            0,
            vec![(None, Some(b"m2".to_vec()), 3_000), rec("m3", 4_000)],
        );
        let mut c = consumer(b.port, None);
        assert_eq!(c.list_offset("test-consumer", 0, -2).await, Ok(0));
        assert_eq!(c.list_offset("test-consumer", 0, -1).await, Ok(4));
        assert_eq!(c.list_offset("test-consumer", 0, 1_500).await, Ok(1));
        assert_eq!(
            c.list_offset("test-consumer", 0, 9_999_999_999_999).await,
            Ok(-1)
        );
        assert_eq!(c.list_offset("test-consumer", 1, -1).await, Ok(0));

        // Offset 3 sits in the second batch, which the broker sends whole: its record at
        // offset 2 is left out.
        let got = c.fetch("test-consumer", 0, 3).await.unwrap();
        assert_eq!(
            got,
            vec![KafkaMessage {
                offset: 3,
                timestamp: 4_000,
                key: b"key".to_vec(),
                value: b"m3".to_vec()
            }]
        );
        assert_eq!(b.fetches.recv().await, Some(("test-consumer".into(), 0, 3)));
        let got = c.fetch("test-consumer", 0, 0).await.unwrap();
        let values: Vec<_> = got.iter().map(|m| (m.offset, m.value.clone())).collect();
        assert_eq!(
            values,
            [
                (0, b"m0".to_vec()),
                (1, b"m1".to_vec()),
                (2, b"m2".to_vec()),
                (3, b"m3".to_vec())
            ]
        );
        assert!(got[2].key.is_empty(), "a null key is sent as no bytes");
        assert_eq!(c.fetch("test-consumer", 0, 4).await, Ok(vec![]));

        assert_eq!(
            c.fetch("test-consumer", 0, 999).await,
            Err("failed to fetch message, topic: test-consumer, partition: 0, err: OFFSET_OUT_OF_RANGE".into())
        );
        assert_eq!(
            c.list_offset("not-exist", 0, -1).await,
            Err(
                "failed to list offset, topic: not-exist, partition: 0, err: not found topic"
                    .into()
            )
        );
        assert_eq!(
            c.fetch("test-consumer", 5, 0).await,
            Err("failed to fetch message, topic: test-consumer, partition: 5, err: not found partition".into())
        );

        b.trim("test-consumer", 0, 2);
        assert_eq!(c.list_offset("test-consumer", 0, -2).await, Ok(2));
    }

    #[tokio::test]
    async fn sasl_and_unreachable_brokers() {
        let mut b = broker("t", 1, true).await;
        b.append("t", 0, vec![rec("a", 1)]);
        let mut c = consumer(b.port, Some(("user", "pass")));
        assert_eq!(c.list_offset("t", 0, -1).await, Ok(1));
        assert_eq!(b.auths.recv().await.unwrap(), b"\0user\0pass");

        let mut c = consumer(b.port, Some(("user", "wrong")));
        assert_eq!(
            c.list_offset("t", 0, -1).await,
            Err("failed to list offset, topic: t, partition: 0, err: not found topic".into())
        );

        let port = ferrisix_config::test_support::free_port();
        let mut c = consumer(port, None);
        assert_eq!(
            c.fetch("t", 0, 0).await,
            Err("failed to fetch message, topic: t, partition: 0, err: not found topic".into())
        );
    }

    #[tokio::test]
    async fn a_broker_that_never_answers() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let mut c = consumer(port, None);
        assert_eq!(
            c.list_offset("t", 0, -1).await,
            Err("failed to list offset, topic: t, partition: 0, err: not found topic".into())
        );
    }

    #[test]
    fn kafka_error_names() {
        assert_eq!(
            protocol_error_name(ProtocolError::OffsetOutOfRange),
            "OFFSET_OUT_OF_RANGE"
        );
        assert_eq!(
            protocol_error_name(ProtocolError::UnknownTopicOrPartition),
            "UNKNOWN_TOPIC_OR_PARTITION"
        );
        assert_eq!(
            protocol_error_name(ProtocolError::Unknown(999)),
            "UNKNOWN_ERROR_CODE_999"
        );
    }

    #[test]
    fn timestamps_beyond_dates() {
        assert_eq!(
            timestamp_of(1_500_000_000_000).timestamp_millis(),
            1_500_000_000_000
        );
        assert_eq!(timestamp_of(i64::MAX), DateTime::<Utc>::MAX_UTC);
        assert_eq!(timestamp_of(i64::MIN), DateTime::<Utc>::MIN_UTC);
    }
}
