//! rocketmq-logger (`apisix/plugins/rocketmq-logger.lua` on lua-resty-rocketmq's producer):
//! each batch of the batch processor becomes one RocketMQ message on `topic` (a JSON array of
//! entries; a lone entry unwrapped when `batch_max_size` is 1), with `key` as the message's
//! `KEYS` and `tag` as its `TAGS`.
//!
//! The producer speaks RocketMQ's remoting protocol itself ([`remoting`]; no maintained
//! pure-Rust client exists): the topic's route is asked of the `nameserver_list` entries in
//! turn (`GET_ROUTEINFO_BY_TOPIC`) and kept, each message goes to the master broker of the
//! next writable queue in turn (`SEND_MESSAGE_V2`, producer group `apisixLogProducer`,
//! properties `UNIQ_KEY`, `KEYS`, `TAGS`, `WAIT`), and the broker's answer decides the batch
//! (an answer other than `SUCCESS` fails it with the broker's remark, retried as the batch
//! processor says). With `access_key` set every request carries RocketMQ's ACL fields
//! (`AccessKey` and `Signature`, HMAC-SHA1 with `secret_key`); `use_tls` wraps the connections
//! in TLS (the certificate not checked, as APISIX's `sslhandshake(nil, nil, false)`);
//! `timeout` (seconds) bounds each step of a call. Entries are APISIX's default entry or
//! `log_format` (`meta_format: default`), or the raw request (`origin`).
//!
//! Connections are kept between calls, per address (lua-resty-rocketmq's cosocket keepalive
//! pool): one that the server closed while idle is left out before it is used, and one
//! whose call failed is closed. Not as APISIX: the route is asked again after a failed send
//! (lua-resty-rocketmq keeps the first one for the producer's life).

pub mod remoting;
#[cfg(any(test, feature = "test-support"))]
pub mod test_broker;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, LogCtx, LogNeeds, Phases, Plugin, PluginDef, TlsClient,
};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use self::remoting::{Command, Route};
use super::sink::{self, encode_batch, BatchSink, Concat, Logger, SendError, SendFuture};

pub const NAME: &str = "rocketmq-logger";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    encrypt_fields: &["secret_key"],
    ..sink::def(NAME, 402, schema, compile)
};

/// lua-resty-rocketmq's producer group for APISIX's logger.
const PRODUCER_GROUP: &str = "apisixLogProducer";

fn schema() -> Value {
    sink::schema(
        json!({
            "type": "object",
            "properties": {
                "meta_format": {"type": "string", "default": "default", "enum": ["default", "origin"]},
                "nameserver_list": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                "topic": {"type": "string"},
                "key": {"type": "string"},
                "tag": {"type": "string"},
                "log_format": {"type": "object"},
                "log_format_extra": {"type": "object"},
                "timeout": {"type": "integer", "minimum": 1, "default": 3},
                "use_tls": {"type": "boolean", "default": false},
                "access_key": {"type": "string", "default": ""},
                "secret_key": {"type": "string", "default": ""},
                "include_req_body": {"type": "boolean", "default": false},
                "include_req_body_expr": {"type": "array", "minItems": 1, "items": {"type": "array"}},
                "include_resp_body": {"type": "boolean", "default": false},
                "include_resp_body_expr": {"type": "array", "minItems": 1, "items": {"type": "array"}},
                "max_req_body_bytes": {"type": "integer", "minimum": 1, "default": 524288},
                "max_resp_body_bytes": {"type": "integer", "minimum": 1, "default": 524288}
            },
            "required": ["nameserver_list", "topic"]
        }),
        "rocketmq logger",
    )
}

/// The loggers' check, and APISIX's `check_tls_bool` warning for `use_tls`.
fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    if cx.conf.get("use_tls") != Some(&Value::Bool(true)) {
        tracing::warn!("Keeping use_tls disabled in {NAME} configuration is a security risk");
    }
    sink::check(cx)
}

/// A `host:port` of the nameserver list or a broker.
fn split_addr(addr: &str) -> Result<(&str, u16), String> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| format!("invalid address {addr}"))?;
    let port = port
        .parse()
        .map_err(|_| format!("invalid address {addr}"))?;
    Ok((host, port))
}

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// The producer of one conf.
struct Producer {
    nameservers: Vec<String>,
    topic: String,
    key: Option<String>,
    tag: Option<String>,
    /// `access_key` and `secret_key` when `access_key` is set.
    acl: Option<(String, String)>,
    tls: Option<Arc<TlsClient>>,
    timeout: Duration,
    /// The next nameserver to ask (`chooseNameserver`).
    next_nameserver: AtomicUsize,
    /// The next queue (`sendWhichQueue`).
    next_queue: AtomicUsize,
    next_opaque: AtomicI64,
    /// The topic's route, once asked (taken only by the batch processor's sends).
    route: Mutex<Option<Arc<Route>>>,
    /// Idle connections per address, kept for the next calls (taken only by the batch
    /// processor's sends, off the request path).
    idle: Mutex<HashMap<String, Vec<Box<dyn Stream>>>>,
}

/// Idle connections kept per address: as many as the batch processor's sends to one address
/// may overlap, and no more.
const IDLE_PER_ADDR: usize = 4;

impl Producer {
    async fn connect(&self, addr: &str) -> Result<Box<dyn Stream>, String> {
        let (host, port) = split_addr(addr)?;
        let tcp = match tokio::time::timeout(self.timeout, TcpStream::connect((host, port))).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(format!("connect {host}:{port} fail:{e}")),
            Err(_) => return Err(format!("connect {host}:{port} fail:timeout")),
        };
        match &self.tls {
            None => Ok(Box::new(tcp)),
            Some(tls) => {
                match tokio::time::timeout(self.timeout, tls.connect(tcp, host, false)).await {
                    Ok(Ok(s)) => Ok(Box::new(s)),
                    Ok(Err(e)) => Err(format!("failed to do ssl handshake: {e}")),
                    Err(_) => Err("failed to do ssl handshake: timeout".into()),
                }
            }
        }
    }

    /// One request to `addr` on its own connection, signed when ACL is on.
    async fn request(
        &self,
        addr: &str,
        code: i64,
        mut ext: BTreeMap<String, String>,
        body: Vec<u8>,
    ) -> Result<Command, String> {
        if let Some((ak, sk)) = &self.acl {
            remoting::sign(ak, sk, &mut ext, &body);
        }
        let opaque = self.next_opaque.fetch_add(1, Ordering::Relaxed);
        let req = Command::request(code, opaque, ext, body);
        let mut s = match self.take_idle(addr) {
            Some(s) => s,
            None => self.connect(addr).await?,
        };
        let answer = remoting::call(&mut s, &req, self.timeout).await?;
        // Answered in full: the connection can carry the next call. One that failed is
        // dropped (closed), with whatever it had half read.
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let kept = idle.entry(addr.to_owned()).or_default();
        if kept.len() < IDLE_PER_ADDR {
            kept.push(s);
        }
        Ok(answer)
    }

    /// A kept connection to `addr` still open: the server has sent nothing on it since its
    /// last answer, so a read that would not wait means it closed it (or broke the protocol).
    fn take_idle(&self, addr: &str) -> Option<Box<dyn Stream>> {
        use futures_util::FutureExt;
        use tokio::io::AsyncReadExt;
        loop {
            let mut s = self
                .idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_mut(addr)?
                .pop()?;
            let mut probe = [0u8; 1];
            if s.read(&mut probe).now_or_never().is_none() {
                return Some(s);
            }
        }
    }

    /// The topic's route, asked of the next nameserver when not known yet.
    async fn route(&self) -> Result<Arc<Route>, String> {
        if let Some(r) = self.route.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(r);
        }
        let i = self.next_nameserver.fetch_add(1, Ordering::Relaxed) % self.nameservers.len();
        let mut ext = BTreeMap::new();
        ext.insert("topic".to_owned(), self.topic.clone());
        let resp = self
            .request(
                &self.nameservers[i],
                remoting::GET_ROUTEINFO_BY_TOPIC,
                ext,
                Vec::new(),
            )
            .await?;
        if resp.code != 0 {
            let name = remoting::response_code_name(resp.code)
                .map_or_else(|| resp.code.to_string(), str::to_owned);
            return Err(format!(
                "getTopicRouteInfoFromNameserver return {name}, {}",
                resp.remark
            ));
        }
        let route = Arc::new(Route::parse(&resp.body)?);
        *self.route.lock().unwrap_or_else(|e| e.into_inner()) = Some(route.clone());
        Ok(route)
    }

    /// `producer:send(topic, message, tag, key)`.
    async fn send(&self, message: Vec<u8>) -> Result<(), String> {
        if self.topic.len() >= 127 || message.len() >= 4_194_304 {
            return Err("invalid topic or message".into());
        }
        let route = self.route().await?;
        if route.queues.is_empty() {
            return Err("writable queue num is zero".into());
        }
        let n = self.next_queue.fetch_add(1, Ordering::Relaxed);
        let queue = &route.queues[n % route.queues.len()];
        let broker = route
            .masters
            .get(&queue.broker_name)
            .ok_or_else(|| format!("no master for broker {}", queue.broker_name))?;
        let uniq = unique_id(self.next_opaque.load(Ordering::Relaxed));
        let mut props: Vec<(&str, &str)> = vec![("UNIQ_KEY", uniq.as_str())];
        if let Some(k) = &self.key {
            props.push(("KEYS", k.as_str()));
        }
        if let Some(t) = &self.tag {
            props.push(("TAGS", t.as_str()));
        }
        props.push(("WAIT", "true"));
        let born = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let ext: BTreeMap<String, String> = [
            ("a", PRODUCER_GROUP.to_owned()),
            ("b", self.topic.clone()),
            ("c", "TBW102".to_owned()),
            ("d", "4".to_owned()),
            ("e", queue.queue_id.to_string()),
            ("f", "0".to_owned()),
            ("g", born.to_string()),
            ("h", "0".to_owned()),
            ("i", remoting::properties(&props)),
            ("j", "0".to_owned()),
            ("k", "false".to_owned()),
            ("l", "0".to_owned()),
            ("m", "false".to_owned()),
            ("n", queue.broker_name.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let resp = self
            .request(broker, remoting::SEND_MESSAGE_V2, ext, message)
            .await?;
        if resp.code != 0 {
            return Err(resp.remark);
        }
        tracing::debug!(
            queue = resp.ext.get("queueId").map(String::as_str),
            "rocketmq-logger: sent"
        );
        Ok(())
    }
}

/// A message id of the shape RocketMQ's clients make (`MessageClientIDSetter`: address,
/// process id, a random client hash, time and a counter, as 32 hex digits).
fn unique_id(counter: i64) -> String {
    let mut b = [0u8; 16];
    b[..4].copy_from_slice(&[127, 0, 0, 1]);
    b[4..6].copy_from_slice(&(std::process::id() as u16).to_be_bytes());
    b[6..10].copy_from_slice(&rand::random::<[u8; 4]>());
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u32);
    b[10..14].copy_from_slice(&ms.to_be_bytes());
    b[14..16].copy_from_slice(&(counter as u16).to_be_bytes());
    b.iter().map(|x| format!("{x:02X}")).collect()
}

struct RocketSink {
    producer: Producer,
    /// `core.json.encode(conf.nameserver_list)`, for the error.
    nameservers_json: String,
}

impl RocketSink {
    async fn post(&self, data: Bytes) -> Result<(), SendError> {
        match self.producer.send(data.to_vec()).await {
            Ok(()) => Ok(()),
            Err(e) => {
                // Ask for the route again next time: the broker may have moved.
                *self
                    .producer
                    .route
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = None;
                Err(SendError::new(format!(
                    "failed to send data to rocketmq topic: {e}, nameserver_list: {}",
                    self.nameservers_json
                )))
            }
        }
    }
}

impl BatchSink for RocketSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], batch_max_size: usize) -> SendFuture<'a> {
        Box::pin(self.post(encode_batch(entries, batch_max_size, Concat::Json)))
    }
}

struct RocketmqLogger {
    logger: Logger,
    needs: LogNeeds,
    origin: bool,
    include_req_body: bool,
    /// `batch_max_size` 1: an origin entry is sent as it is, not as a JSON string.
    raw: bool,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let services = cx.services;
    let logger = Logger::compile(cx, NAME, false, |c| {
        let text = |k: &str| c.get(k).and_then(Value::as_str).map(str::to_owned);
        let nameservers: Vec<String> = c
            .get("nameserver_list")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        if nameservers.is_empty() {
            return Err("no nameserver".into());
        }
        let access_key = text("access_key").unwrap_or_default();
        let producer = Producer {
            topic: text("topic").unwrap_or_default(),
            key: text("key"),
            tag: text("tag"),
            acl: (!access_key.is_empty())
                .then(|| (access_key, text("secret_key").unwrap_or_default())),
            tls: (c.get("use_tls") == Some(&Value::Bool(true))).then(|| services.tls().clone()),
            timeout: Duration::from_secs(c.get("timeout").and_then(Value::as_u64).unwrap_or(3)),
            next_nameserver: AtomicUsize::new(0),
            next_queue: AtomicUsize::new(0),
            next_opaque: AtomicI64::new(1),
            route: Mutex::new(None),
            idle: Mutex::new(HashMap::new()),
            nameservers,
        };
        Ok(Arc::new(RocketSink {
            nameservers_json: lua::cjson_encode(&c["nameserver_list"]),
            producer,
        }) as Arc<dyn BatchSink>)
    })?;
    let conf = cx.filled();
    let origin = conf.get("meta_format").and_then(Value::as_str) == Some("origin");
    let mut needs = logger.needs();
    if origin {
        needs = needs.union(&super::logger::origin_needs(&conf));
    }
    Ok(Arc::new(RocketmqLogger {
        logger,
        needs,
        origin,
        include_req_body: conf.get("include_req_body").and_then(Value::as_bool) == Some(true),
        raw: conf.get("batch_max_size").and_then(Value::as_u64) == Some(1),
    }))
}

impl Plugin for RocketmqLogger {
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
    use tokio::sync::mpsc;

    use super::test_broker::{cluster, Cluster, Sent};
    use super::*;
    use crate::testing::Compiler;

    fn log_ctx(p: &dyn Plugin, n: usize) -> LogCtx {
        crate::log::sink::testing::log_ctx_with_request(p, n)
    }

    async fn next(rx: &mut mpsc::UnboundedReceiver<Sent>) -> Sent {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a message in time")
            .unwrap()
    }

    fn compile(c: &Compiler, conf: &Value, owner: &str) -> Arc<dyn Plugin> {
        (DEF.compile)(&c.cx(NAME, conf, owner, None)).unwrap()
    }

    #[tokio::test]
    async fn batches_go_to_the_topics_queues_in_turn() {
        let mut b: Cluster = cluster("logs", 2, None).await;
        let c = Compiler::new();
        let conf = json!({"nameserver_list": [format!("127.0.0.1:{}", b.nameserver_port)],
            "topic": "logs", "key": "k1", "tag": "t1", "batch_max_size": 2});
        let p = compile(&c, &conf, "rmq-1");
        for n in 0..4 {
            p.log(&log_ctx(&*p, n));
        }
        let (first, second) = (next(&mut b.sent).await, next(&mut b.sent).await);
        for m in [&first, &second] {
            assert_eq!(m.topic, "logs");
            assert_eq!(m.keys.as_deref(), Some("k1"));
            assert_eq!(m.tags.as_deref(), Some("t1"));
            assert_eq!(m.producer_group, "apisixLogProducer");
            assert_eq!(m.broker_name, "broker-a");
            assert_eq!(m.uniq_key.len(), 32);
            assert!(m.signature_ok.is_none());
        }
        assert_ne!(first.queue_id, second.queue_id, "queues taken in turn");
        let entries: Value = serde_json::from_slice(&first.body).unwrap();
        assert_eq!(entries[0]["request"]["uri"], "/x?n=0");
        assert_eq!(entries[1]["request"]["uri"], "/x?n=1");
        assert_eq!(entries[0]["route_id"], "r1");
        // The two batches went out together and may each have asked for the route; once
        // known it is kept.
        let asked = b.route_queries();
        assert!((1..=2).contains(&asked), "{asked}");
        for n in 4..6 {
            p.log(&log_ctx(&*p, n));
        }
        let third = next(&mut b.sent).await;
        assert_eq!(third.topic, "logs");
        assert_eq!(b.route_queries(), asked);
        // The connections are kept: one a call at most while two batches overlapped, and
        // none more for the batches after.
        let opened = b.connections();
        assert!(opened <= 4, "{opened}");
        for n in (6..12).step_by(2) {
            p.log(&log_ctx(&*p, n));
            p.log(&log_ctx(&*p, n + 1));
            let m = next(&mut b.sent).await;
            assert_eq!(m.topic, "logs");
        }
        assert_eq!(
            b.connections(),
            opened,
            "no new connection for later batches"
        );
    }

    #[tokio::test]
    async fn acl_signs_every_request_and_origin_entries_go_raw() {
        let mut b = cluster("raw", 1, Some(("ak", "sk"))).await;
        let c = Compiler::new();
        let conf = json!({"nameserver_list": [format!("127.0.0.1:{}", b.nameserver_port)],
            "topic": "raw", "access_key": "ak", "secret_key": "sk", "meta_format": "origin",
            "include_req_body": true, "batch_max_size": 1});
        let p = compile(&c, &conf, "rmq-2");
        p.log(&log_ctx(&*p, 7));
        let m = next(&mut b.sent).await;
        assert_eq!(m.signature_ok, Some(true));
        assert_eq!(m.access_key.as_deref(), Some("ak"));
        assert!(m.keys.is_none() && m.tags.is_none());
        assert_eq!(
            String::from_utf8(m.body).unwrap(),
            "POST /x?n=7 HTTP/1.1\r\nhost: gw.test\r\n\r\n{\"a\":1}"
        );
    }

    #[tokio::test]
    async fn a_wrong_secret_or_unknown_topic_fails_the_batch() {
        let b = cluster("t", 1, Some(("ak", "sk"))).await;
        let producer = |topic: &str, sk: &str| Producer {
            nameservers: vec![format!("127.0.0.1:{}", b.nameserver_port)],
            topic: topic.into(),
            key: None,
            tag: None,
            acl: Some(("ak".into(), sk.into())),
            tls: None,
            timeout: Duration::from_secs(3),
            next_nameserver: AtomicUsize::new(0),
            next_queue: AtomicUsize::new(0),
            next_opaque: AtomicI64::new(1),
            route: Mutex::new(None),
            idle: Mutex::new(HashMap::new()),
        };
        let err = producer("t", "wrong")
            .send(b"x".to_vec())
            .await
            .unwrap_err();
        assert_eq!(
            err,
            "getTopicRouteInfoFromNameserver return NO_PERMISSION, signature mismatch"
        );
        let err = producer("other", "sk")
            .send(b"x".to_vec())
            .await
            .unwrap_err();
        assert_eq!(err, "getTopicRouteInfoFromNameserver return TOPIC_NOT_EXIST, No topic route info in name server for the topic: other");
        let sink = RocketSink {
            producer: producer("t", "sk"),
            nameservers_json: "[\"127.0.0.1:1\"]".into(),
        };
        sink.post(Bytes::from_static(b"ok")).await.unwrap();
        let dead = RocketSink {
            producer: Producer {
                nameservers: vec!["127.0.0.1:1".into()],
                ..producer("t", "sk")
            },
            nameservers_json: "[\"127.0.0.1:1\"]".into(),
        };
        let err = dead.post(Bytes::from_static(b"x")).await.unwrap_err();
        assert!(
            err.message
                .starts_with("failed to send data to rocketmq topic: connect 127.0.0.1:1 fail:"),
            "{}",
            err.message
        );
        assert!(err
            .message
            .ends_with(", nameserver_list: [\"127.0.0.1:1\"]"));
    }

    #[tokio::test]
    async fn use_tls_reaches_a_tls_cluster_without_checking_its_certificate() {
        const CERT: &str = include_str!("../../../../tests/data/tls/server.crt");
        const KEY: &str = include_str!("../../../../tests/data/tls/server.key");
        let mut b = test_broker::tls_cluster("secure", 1, CERT, KEY).await;
        let c = Compiler::new();
        let nameservers = json!([format!("127.0.0.1:{}", b.nameserver_port)]);
        let plain = compile(
            &c,
            &json!({"nameserver_list": nameservers, "topic": "secure", "batch_max_size": 1,
                "max_retry_count": 0}),
            "rmq-4",
        );
        plain.log(&log_ctx(&*plain, 1));
        let tls = compile(
            &c,
            &json!({"nameserver_list": nameservers, "topic": "secure", "batch_max_size": 1,
                "use_tls": true}),
            "rmq-5",
        );
        tls.log(&log_ctx(&*tls, 2));
        // Only the TLS producer got through: the plain one's frames were no handshake.
        let m = next(&mut b.sent).await;
        let entry: Value = serde_json::from_slice(&m.body).unwrap();
        assert_eq!(entry["request"]["uri"], "/x?n=2");
        let more = tokio::time::timeout(Duration::from_millis(500), b.sent.recv()).await;
        assert!(more.is_err(), "{more:?}");
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        assert_eq!(
            r.check(NAME, &json!({"topic": "t"})).unwrap_err(),
            "failed to check the configuration of plugin rocketmq-logger err: property \"nameserver_list\" is required"
        );
        assert_eq!(
            r.check(NAME, &json!({"topic": "t", "nameserver_list": []})).unwrap_err(),
            "failed to check the configuration of plugin rocketmq-logger err: property \"nameserver_list\" validation failed: expect array to have at least 1 items"
        );
        assert!(r
            .check(
                NAME,
                &json!({"topic": "t", "nameserver_list": ["127.0.0.1:9876"]})
            )
            .is_ok());
        let info = r.get(NAME).unwrap();
        assert_eq!(info.priority, 402);
        let props = &info.schema["properties"];
        assert_eq!(props["name"]["default"], "rocketmq logger");
        assert_eq!(props["timeout"]["default"], 3);
        assert_eq!(props["access_key"]["default"], "");
        assert_eq!(props["meta_format"]["default"], "default");
        assert_eq!(unique_id(1).len(), 32);
    }
}
