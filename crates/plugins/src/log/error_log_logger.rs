//! error-log-logger (`apisix/plugins/error-log-logger.lua`): the gateway's own error log
//! shipped, as its `plugin_metadata` says, to a TCP server (`tcp`: `host`, `port`, `tls`
//! with `tls_server_name` as the SNI, not verified; the lines one after the other, each
//! ending with a newline), SkyWalking (`skywalking.endpoint_addr`, default
//! `http://127.0.0.1:12900/v3/logs`: a JSON array of `{"service", "serviceInstance",
//! "endpoint": "", "body": {"text": {"text": <line>}}}`) or ClickHouse
//! (`clickhouse.endpoint_addr`: `INSERT INTO <logtable> FORMAT JSONEachRow {"data": <line>}
//! ...` with `X-ClickHouse-User`/`-Key`/`-Database`) or Kafka (`kafka`). Lines of `level` (default `WARN`) and
//! more severe ones are taken from the log once a second and batched by the batch processor
//! (the metadata's `batch_max_size`, `inactive_timeout`, ..., `timeout` seconds per send).
//! The old top-level `host`/`port` mean `tcp`.
//!
//! Not as APISIX: the plugin runs while a global rule holds it (`"error-log-logger": {}`;
//! APISIX starts it for the metadata alone, ferrisix compiles plugins for the resources that
//! hold them); the lines are ferrisix's log lines written as nginx's error log writes them
//! (`2024/01/02 03:04:05 [warn] <pid>#0: <message>, <field>: <value>`), only those the
//! process's log level lets through. `kafka` goes through kafka-logger's producer (`brokers`
//! with SASL PLAIN, `tls`, `kafka_topic`, `key`, `producer_type`, `meta_refresh_interval`;
//! the metadata's `timeout`), one message per line, the line JSON-encoded as a string as
//! APISIX's `core.json.encode` does; as in kafka-logger, the broker is always asked for all
//! acks (which satisfies `required_acks` 1; with 0 the answer is awaited all the same), and
//! `cluster_name` has nothing to keep apart since producers are per metadata.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::error_log::{self as level, ErrorLogTap};
use ferrisix_plugin_api::{
    CompileCtx, Lease, Phases, Plugin, PluginDef, PluginServices, Retain, Scope, SharedState,
    StateMap,
};
use http::{header, HeaderName, HeaderValue, Method};
use serde_json::{json, Map, Value};
use tokio::sync::Notify;

use super::batch_processor::{Backlogs, BatchConfig, BatchProcessor, DEFAULT_MAX_PENDING_ENTRIES};
use super::kafka_logger::KafkaSink;
use super::log_entry;
use super::sink::http::{status_and_body, HttpTarget};
use super::sink::net::{self, NetError, Tls};
use super::sink::{BatchSink, SendError, SendFuture};

pub const NAME: &str = "error-log-logger";

pub static DEF: PluginDef = PluginDef {
    scope: Scope::Global,
    metadata_schema: Some(metadata_schema),
    encrypt_fields: &["clickhouse.password", "kafka.brokers.sasl_config.password"],
    ..PluginDef::new(NAME, 1091, schema, compile)
};

fn schema() -> Value {
    json!({"type": "object"})
}

const LEVELS: [&str; 10] = [
    "STDERR", "EMERG", "ALERT", "CRIT", "ERR", "ERROR", "WARN", "NOTICE", "INFO", "DEBUG",
];

fn metadata_schema() -> Value {
    let host = ferrisix_config::schema::defs::host();
    json!({
        "type": "object",
        "properties": {
            "tcp": {
                "type": "object",
                "properties": {
                    "host": host,
                    "port": {"type": "integer", "minimum": 0},
                    "tls": {"type": "boolean", "default": false},
                    "tls_server_name": {"type": "string"}
                },
                "required": ["host", "port"]
            },
            "skywalking": {
                "type": "object",
                "properties": {
                    "endpoint_addr": {"default": "http://127.0.0.1:12900/v3/logs"},
                    "service_name": {"type": "string", "default": "APISIX"},
                    "service_instance_name": {"type": "string", "default": "APISIX Service Instance"}
                }
            },
            "clickhouse": {
                "type": "object",
                "properties": {
                    "endpoint_addr": {"default": "http://127.0.0.1:8123"},
                    "user": {"type": "string", "default": "default"},
                    "password": {"type": "string", "default": ""},
                    "database": {"type": "string", "default": ""},
                    "logtable": {"type": "string", "default": ""}
                },
                "required": ["endpoint_addr", "user", "password", "database", "logtable"]
            },
            "kafka": {
                "type": "object",
                "properties": {
                    "brokers": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "properties": {
                                "host": {"type": "string", "description": "the host of kafka broker"},
                                "port": {"type": "integer", "minimum": 1, "maximum": 65535,
                                    "description": "the port of kafka broker"},
                                "sasl_config": {
                                    "type": "object",
                                    "description": "sasl config",
                                    "properties": {
                                        "mechanism": {"type": "string", "default": "PLAIN", "enum": ["PLAIN"]},
                                        "user": {"type": "string", "description": "user"},
                                        "password": {"type": "string", "description": "password"}
                                    },
                                    "required": ["user", "password"]
                                }
                            },
                            "required": ["host", "port"]
                        },
                        "uniqueItems": true
                    },
                    "tls": {
                        "type": "object",
                        "description": "tls config for connecting to kafka brokers",
                        "properties": {"verify": {"type": "boolean", "default": false}}
                    },
                    "kafka_topic": {"type": "string"},
                    "producer_type": {"type": "string", "default": "async", "enum": ["async", "sync"]},
                    "required_acks": {"type": "integer", "default": 1, "enum": [0, 1, -1]},
                    "key": {"type": "string"},
                    "cluster_name": {"type": "integer", "minimum": 1, "default": 1},
                    "meta_refresh_interval": {"type": "integer", "minimum": 1, "default": 30}
                },
                "required": ["brokers", "kafka_topic"]
            },
            "name": {"type": "string", "default": NAME},
            "level": {"type": "string", "default": "WARN", "enum": LEVELS},
            "timeout": {"type": "integer", "minimum": 1, "default": 3},
            "keepalive": {"type": "integer", "minimum": 1, "default": 30},
            "batch_max_size": {"type": "integer", "minimum": 0, "default": 1000},
            "max_retry_count": {"type": "integer", "minimum": 0, "default": 0},
            "retry_delay": {"type": "integer", "minimum": 0, "default": 1},
            "buffer_duration": {"type": "integer", "minimum": 1, "default": 60},
            "inactive_timeout": {"type": "integer", "minimum": 1, "default": 3}
        },
        "oneOf": [
            {"required": ["skywalking"]},
            {"required": ["tcp"]},
            {"required": ["clickhouse"]},
            {"required": ["kafka"]},
            {"required": ["host", "port"]}
        ]
    })
}

/// The tap level of a metadata `level` (nginx's severities onto the log's levels).
fn rank(name: &str) -> u8 {
    match name {
        "WARN" => level::WARN,
        "NOTICE" | "INFO" => level::INFO,
        "DEBUG" => level::DEBUG,
        _ => level::ERROR,
    }
}

/// Where the lines go.
enum Destination {
    Tcp {
        host: String,
        port: u16,
        tls: Option<Tls>,
    },
    SkyWalking {
        url: String,
        service: String,
        instance: String,
        target: HttpTarget,
    },
    ClickHouse {
        url: String,
        table: String,
        target: HttpTarget,
    },
    /// kafka-logger's producer: each line one message, JSON-encoded as a string.
    Kafka(KafkaSink),
}

struct LineSink {
    dest: Destination,
    timeout: Duration,
}

impl LineSink {
    fn new(meta: &Map<String, Value>, services: &Arc<PluginServices>) -> Result<LineSink, String> {
        let timeout = Duration::from_secs(meta.get("timeout").and_then(Value::as_u64).unwrap_or(3));
        let text =
            |v: &Value, k: &str, d: &str| v.get(k).and_then(Value::as_str).unwrap_or(d).to_owned();
        let dest = if let Some(sw) = meta.get("skywalking") {
            let mut instance = text(sw, "service_instance_name", "APISIX Service Instance");
            if instance == "$hostname" {
                instance = log_entry::hostname();
            }
            Destination::SkyWalking {
                url: text(sw, "endpoint_addr", "http://127.0.0.1:12900/v3/logs"),
                service: text(sw, "service_name", "APISIX"),
                instance,
                target: HttpTarget::new(
                    services,
                    timeout,
                    false,
                    vec![(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    )],
                ),
            }
        } else if let Some(ch) = meta.get("clickhouse") {
            let mut headers = vec![(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )];
            for (name, key) in [
                ("x-clickhouse-user", "user"),
                ("x-clickhouse-key", "password"),
                ("x-clickhouse-database", "database"),
            ] {
                let v = HeaderValue::from_str(&text(ch, key, ""))
                    .map_err(|_| format!("invalid clickhouse.{key}"))?;
                headers.push((HeaderName::from_static(name), v));
            }
            Destination::ClickHouse {
                url: text(ch, "endpoint_addr", "http://127.0.0.1:8123"),
                table: text(ch, "logtable", ""),
                target: HttpTarget::new(services, timeout, false, headers),
            }
        } else if let Some(kafka) = meta.get("kafka").and_then(Value::as_object) {
            // The producer's keys are the `kafka` block's, its timeout the metadata's.
            let mut conf = kafka.clone();
            conf.insert("timeout".into(), json!(timeout.as_secs()));
            Destination::Kafka(KafkaSink::new(&conf, services)?)
        } else {
            // `tcp`, or the old top-level `host` and `port`.
            let tcp = meta
                .get("tcp")
                .cloned()
                .unwrap_or_else(|| Value::Object(meta.clone()));
            let port = tcp.get("port").and_then(Value::as_i64).unwrap_or(0);
            let port = u16::try_from(port).map_err(|_| format!("invalid port {port}"))?;
            Destination::Tcp {
                host: text(&tcp, "host", ""),
                port,
                tls: (tcp.get("tls").and_then(Value::as_bool) == Some(true)).then(|| Tls {
                    client: services.tls().clone(),
                    server_name: tcp
                        .get("tls_server_name")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                    verify: false,
                }),
            }
        };
        Ok(LineSink { dest, timeout })
    }

    async fn ship(&self, lines: &[Bytes]) -> Result<(), SendError> {
        match &self.dest {
            Destination::Tcp { host, port, tls } => {
                let mut data = BytesMut::new();
                for l in lines {
                    data.extend_from_slice(l);
                    data.extend_from_slice(b"\n");
                }
                net::tcp(host, *port, self.timeout, tls.as_ref(), &data)
                    .await
                    .map_err(|e| {
                        SendError::new(match e {
                            NetError::Connect(e) => format!(
                                "failed to connect the TCP server: host[{host}] port[{port}] err: {e}"
                            ),
                            NetError::Handshake(e) => format!(
                                "failed to perform TLS handshake to TCP server: host[{host}] port[{port}] err: {e}"
                            ),
                            NetError::Send(e) => format!(
                                "failed to send data to TCP server: host[{host}] port[{port}] err: {e}"
                            ),
                        })
                    })
            }
            Destination::SkyWalking {
                url,
                service,
                instance,
                target,
            } => {
                let entries: Vec<Value> = lines
                    .iter()
                    .map(|l| {
                        json!({"service": service, "serviceInstance": instance, "endpoint": "",
                            "body": {"text": {"text": String::from_utf8_lossy(l)}}})
                    })
                    .collect();
                let body = Bytes::from(lua::cjson_encode(&Value::Array(entries)));
                post(target, url, body, "skywalking").await
            }
            Destination::ClickHouse { url, table, target } => {
                let rows: Vec<String> = lines
                    .iter()
                    .map(|l| lua::cjson_encode(&json!({"data": String::from_utf8_lossy(l)})))
                    .collect();
                let body = format!("INSERT INTO {table} FORMAT JSONEachRow {}", rows.join(" "));
                post(target, url, Bytes::from(body), "clickhouse").await
            }
            Destination::Kafka(sink) => {
                // One message per line, as APISIX's `prod:send` per entry; a failure fails
                // the batch (retried whole, as the batch processor says).
                for l in lines {
                    let line = Value::String(String::from_utf8_lossy(l).into_owned());
                    sink.send_batch(Bytes::from(lua::cjson_encode(&line)))
                        .await?;
                }
                Ok(())
            }
        }
    }
}

async fn post(target: &HttpTarget, url: &str, body: Bytes, what: &str) -> Result<(), SendError> {
    match target.call(target.request(Method::POST, url), body).await {
        Ok(r) if r.status().as_u16() >= 400 => {
            let (status, body) = status_and_body(&r);
            Err(SendError::new(format!(
                "server returned status code[{status}] {what}[{url}] body[{body}]"
            )))
        }
        Ok(_) => Ok(()),
        Err(e) => Err(e.into_send_error(&format!("error while sending data to {what}[{url}] "))),
    }
}

impl BatchSink for LineSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], _: usize) -> SendFuture<'a> {
        Box::pin(self.ship(entries))
    }
}

/// The levels the live shippers ask of the tap, so that one going away leaves the others'.
#[derive(Default)]
struct Wanted {
    next: AtomicU64,
    levels: Mutex<HashMap<u64, u8>>,
}

impl SharedState for Wanted {
    fn create(_: &PluginServices) -> Wanted {
        Wanted::default()
    }
}

impl Wanted {
    fn set(&self, tap: &ErrorLogTap, id: u64, level: Option<u8>) {
        let mut levels = self.levels.lock().unwrap_or_else(|e| e.into_inner());
        match level {
            Some(l) => levels.insert(id, l),
            None => levels.remove(&id),
        };
        tap.want(levels.values().copied().max().unwrap_or(0));
    }
}

/// One metadata's shipping: a task moving the tap's lines into the batch processor every
/// second, stopped when the last snapshot holding it goes.
struct Shipper {
    id: u64,
    stop: Arc<Notify>,
    wanted: Arc<Wanted>,
    tap: Arc<ErrorLogTap>,
}

impl Retain for Shipper {}

impl Drop for Shipper {
    fn drop(&mut self) {
        self.stop.notify_one();
        self.wanted.set(&self.tap, self.id, None);
    }
}

impl Shipper {
    fn start(meta: &Map<String, Value>, services: &Arc<PluginServices>) -> Result<Shipper, String> {
        let sink: Arc<dyn BatchSink> = Arc::new(LineSink::new(meta, services)?);
        let processor = BatchProcessor::new(
            BatchConfig::from_conf(meta),
            sink,
            services.shared::<Backlogs>().of(NAME),
            DEFAULT_MAX_PENDING_ENTRIES,
            services,
        );
        let level = rank(meta.get("level").and_then(Value::as_str).unwrap_or("WARN"));
        let tap = services.error_log().clone();
        let wanted = services.shared::<Wanted>();
        let id = wanted.next.fetch_add(1, Ordering::Relaxed);
        wanted.set(&tap, id, Some(level));
        let stop = Arc::new(Notify::new());
        let (task_tap, task_stop) = (tap.clone(), stop.clone());
        services.executor().spawn(async move {
            loop {
                // Stopped: what the tap holds is left to the shippers that replace this one.
                tokio::select! {
                    _ = task_stop.notified() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                for (rank, line) in task_tap.take() {
                    // Lines of a level asked for by another shipper only are not this one's.
                    if rank <= level {
                        processor.push(Bytes::from(line));
                    }
                }
            }
        })?;
        Ok(Shipper {
            id,
            stop,
            wanted,
            tap,
        })
    }
}

/// The plugin on a global rule: it does nothing per request; it holds the shipping.
struct ErrorLogLogger {
    _shipper: Option<Lease<Shipper>>,
}

impl Plugin for ErrorLogLogger {
    fn phases(&self) -> Phases {
        Phases::NONE
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let Some(meta) = cx.metadata.and_then(Value::as_object) else {
        tracing::info!("please set the correct plugin_metadata for {NAME}");
        return Ok(Arc::new(ErrorLogLogger { _shipper: None }));
    };
    let mut filled = Value::Object(meta.clone());
    let _ = ferrisix_config::schema::validate_and_fill(&metadata_schema(), &mut filled);
    let filled = filled.as_object().cloned().unwrap_or_default();
    if !["tcp", "skywalking", "clickhouse", "kafka"]
        .iter()
        .any(|k| filled.contains_key(*k))
    {
        let host = filled.get("host").and_then(Value::as_str).unwrap_or("");
        let port = filled.get("port").map(Value::to_string).unwrap_or_default();
        tracing::warn!(
            "The schema is out of date. Please update to the new configuration, for example: {{\"tcp\": {{\"host\": \"{host}\", \"port\": \"{port}\"}}}}"
        );
    }
    // One shipping per metadata, whichever global rules hold the plugin: the lines are taken
    // from the tap once.
    let key = format!(
        "{NAME}:{:08x}",
        crc32fast::hash(lua::cjson_encode(&Value::Object(filled.clone())).as_bytes())
    );
    let services = cx.services;
    let map = services.shared::<StateMap<Shipper>>();
    let mut failed = None;
    let lease = map.lease(&key, || match Shipper::start(&filled, services) {
        Ok(s) => s,
        Err(e) => {
            failed = Some(e);
            Shipper {
                id: u64::MAX,
                stop: Arc::new(Notify::new()),
                wanted: services.shared::<Wanted>(),
                tap: services.error_log().clone(),
            }
        }
    });
    if let Some(e) = failed {
        tracing::error!("{NAME}: {e}");
    }
    Ok(Arc::new(ErrorLogLogger {
        _shipper: Some(lease),
    }))
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use tokio::io::AsyncReadExt;

    use super::*;
    use crate::log::sink::testing::{answer, http_server, next, Captured};
    use crate::testing::Compiler;

    #[tokio::test]
    async fn lines_of_the_level_go_to_a_tcp_server() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let c = Compiler::new();
        let tap = c.registry.services().error_log().clone();
        let meta = json!({"tcp": {"host": "127.0.0.1", "port": port}, "level": "WARN",
            "batch_max_size": 2});
        let p = (DEF.compile)(&c.cx(NAME, &json!({}), "ell-1", Some(&meta))).unwrap();
        assert!(tap.wants(level::WARN) && !tap.wants(level::INFO));
        tap.push(
            level::INFO,
            "2024/01/01 00:00:00 [info] 1#0: not shipped".into(),
        );
        tap.push(
            level::WARN,
            "2024/01/01 00:00:00 [warn] 1#0: shipped".into(),
        );
        tap.push(
            level::ERROR,
            "2024/01/01 00:00:00 [error] 1#0: also shipped".into(),
        );
        let (mut s, _) = tokio::time::timeout(Duration::from_secs(5), listener.accept())
            .await
            .unwrap()
            .unwrap();
        let mut got = String::new();
        s.read_to_string(&mut got).await.unwrap();
        assert_eq!(
            got,
            "2024/01/01 00:00:00 [warn] 1#0: shipped\n2024/01/01 00:00:00 [error] 1#0: also shipped\n"
        );
        drop(p);
        // The last holder gone, nothing more is asked of the log.
        assert!(!tap.wants(level::ERROR));
    }

    fn ok(_: &Captured) -> Vec<u8> {
        answer(200, "")
    }

    #[tokio::test]
    async fn skywalking_and_clickhouse_bodies() {
        let (port, mut rx) = http_server(ok).await;
        let c = Compiler::new();
        let tap = c.registry.services().error_log().clone();
        let meta = json!({"skywalking": {"endpoint_addr": format!("http://127.0.0.1:{port}/v3/logs"),
            "service_instance_name": "gw-1"}, "level": "ERROR", "batch_max_size": 1});
        let p = (DEF.compile)(&c.cx(NAME, &json!({}), "ell-2", Some(&meta))).unwrap();
        tap.push(level::ERROR, "boom".into());
        let req = next(&mut rx).await;
        assert!(req.head.starts_with("POST /v3/logs "), "{}", req.head);
        let v: Value = serde_json::from_slice(&req.body).unwrap();
        assert_eq!(
            v,
            json!([{"service": "APISIX", "serviceInstance": "gw-1", "endpoint": "",
                "body": {"text": {"text": "boom"}}}])
        );
        drop(p);
        let meta = json!({"clickhouse": {"endpoint_addr": format!("http://127.0.0.1:{port}/"),
            "user": "u", "password": "pw", "database": "db", "logtable": "t"}, "level": "ERROR",
            "batch_max_size": 2});
        let _p = (DEF.compile)(&c.cx(NAME, &json!({}), "ell-3", Some(&meta))).unwrap();
        tap.push(level::ERROR, "one".into());
        tap.push(level::ERROR, "two \"quoted\"".into());
        let req = next(&mut rx).await;
        let head = req.lower();
        assert!(head.contains("x-clickhouse-user: u") && head.contains("x-clickhouse-key: pw"));
        assert!(head.contains("x-clickhouse-database: db"));
        assert_eq!(
            req.text(),
            r#"INSERT INTO t FORMAT JSONEachRow {"data":"one"} {"data":"two \"quoted\""}"#
        );
    }

    #[tokio::test]
    async fn kafka_gets_one_json_string_message_per_line() {
        use crate::log::kafka_logger::test_broker::{broker, Stored};
        async fn next(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Stored>) -> Stored {
            tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("a record in time")
                .unwrap()
        }
        let mut b = broker("errs", 3, false).await;
        let c = Compiler::new();
        let tap = c.registry.services().error_log().clone();
        // sync: each line sent and answered before the batch is done.
        let meta = json!({"kafka": {"brokers": [{"host": "127.0.0.1", "port": b.port}],
            "kafka_topic": "errs", "key": "gw", "producer_type": "sync", "required_acks": -1},
            "level": "ERROR", "batch_max_size": 2});
        let p = (DEF.compile)(&c.cx(NAME, &json!({}), "ell-k1", Some(&meta))).unwrap();
        tap.push(level::ERROR, "one/1".into());
        tap.push(level::WARN, "not shipped".into());
        tap.push(level::ERROR, "two \"2\"".into());
        let (first, second) = (next(&mut b.records).await, next(&mut b.records).await);
        for r in [&first, &second] {
            assert_eq!(r.topic, "errs");
            assert_eq!(r.key.as_deref(), Some(&b"gw"[..]));
            // lua-resty-kafka's partitioner: crc32(key) % partitions.
            assert_eq!(r.partition, (crc32fast::hash(b"gw") % 3) as i32);
        }
        // `core.json.encode` of the line: a JSON string (APISIX's cjson leaves `/` as it is).
        assert_eq!(String::from_utf8_lossy(&first.value), r#""one/1""#);
        assert_eq!(String::from_utf8_lossy(&second.value), r#""two \"2\"""#);
        drop(p);
        // async (the default): buffered, then sent by the producer's task; no key.
        let meta = json!({"kafka": {"brokers": [{"host": "127.0.0.1", "port": b.port}],
            "kafka_topic": "errs", "meta_refresh_interval": 5, "cluster_name": 2},
            "level": "WARN", "batch_max_size": 1});
        let _p = (DEF.compile)(&c.cx(NAME, &json!({}), "ell-k2", Some(&meta))).unwrap();
        tap.push(level::WARN, "async line".into());
        let r = next(&mut b.records).await;
        assert_eq!(r.value, br#""async line""#);
        assert!(r.key.is_none());
    }

    #[test]
    fn metadata_schema_messages() {
        let r = crate::PluginRegistry::builtin();
        assert!(r.check(NAME, &json!({})).is_ok());
        assert!(r
            .check_metadata(NAME, &json!({"tcp": {"host": "127.0.0.1", "port": 1999}}))
            .is_ok());
        assert!(r
            .check_metadata(NAME, &json!({"host": "127.0.0.1", "port": 1999}))
            .is_ok());
        assert_eq!(
            r.check_metadata(NAME, &json!({})).unwrap_err(),
            "invalid configuration: value should match only one schema, but matches none"
        );
        assert!(r
            .check_metadata(
                NAME,
                &json!({"tcp": {"host": "127.0.0.1", "port": 1}, "level": "FATAL"})
            )
            .is_err());
        let info = r.get(NAME).unwrap();
        assert_eq!(info.priority, 1091);
    }
}
