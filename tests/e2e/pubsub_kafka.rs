//! End-to-end `scheme: kafka` upstreams (APISIX's pub-sub, `t/pubsub/kafka.t`): a WebSocket
//! client speaks pubsub.proto to the binary, which consumes from the in-test Kafka broker
//! (Debian packages no Kafka; the broker answers ListOffsets and Fetch with real record
//! batches and records what it was asked). The client's protobuf is its own: the .proto in
//! tests/data/pubsub compiled at test time and encoded by reflection.
use crate::support;

use std::time::Duration;

use ferrisix_plugins::log::kafka_logger::test_broker::{broker, tls_broker, Broker};
use futures_util::{SinkExt, StreamExt};
use prost_reflect::{DescriptorPool, DynamicMessage, ReflectMessage, Value as PbValue};
use serde_json::json;
use support::*;
use tokio_tungstenite::tungstenite::Message;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn pool() -> DescriptorPool {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/pubsub");
    let mut c = protox::Compiler::new([dir]).unwrap();
    c.open_file("pubsub.proto").unwrap();
    c.descriptor_pool()
}

/// A command as the test writes it.
enum Cmd<'a> {
    Ping(&'a [u8]),
    Empty,
    ListOffset(&'a str, i32, i64),
    Fetch(&'a str, i32, i64),
}

/// A response as the test reads it.
#[derive(Debug, PartialEq)]
enum Resp {
    Error(i32, String),
    Pong(Vec<u8>),
    Offset(i64),
    /// offset, timestamp, key, value of each message.
    Messages(Vec<(i64, i64, Vec<u8>, Vec<u8>)>),
}

fn err(message: &str) -> Resp {
    Resp::Error(0, message.into())
}

struct Client {
    ws: Ws,
    pool: DescriptorPool,
}

impl Client {
    async fn connect(gw: &Gateway, path: &str) -> Client {
        let url = format!("ws://127.0.0.1:{}{path}", gw.port);
        let (ws, resp) = tokio_tungstenite::connect_async(url)
            .await
            .expect("the pub-sub handshake");
        assert_eq!(resp.status(), 101);
        Client { ws, pool: pool() }
    }

    fn message(&self, name: &str) -> DynamicMessage {
        DynamicMessage::new(self.pool.get_message_by_name(name).unwrap())
    }

    fn encode(&self, sequence: i64, cmd: Cmd<'_>) -> Vec<u8> {
        let mut req = self.message("PubSubReq");
        req.set_field_by_name("sequence", PbValue::I64(sequence));
        let (field, body) = match cmd {
            Cmd::Ping(state) => {
                let mut m = self.message("CmdPing");
                m.set_field_by_name("state", PbValue::Bytes(state.to_vec().into()));
                ("cmd_ping", m)
            }
            Cmd::Empty => ("cmd_empty", self.message("CmdEmpty")),
            Cmd::ListOffset(topic, partition, timestamp) => {
                let mut m = self.message("CmdKafkaListOffset");
                m.set_field_by_name("topic", PbValue::String(topic.into()));
                m.set_field_by_name("partition", PbValue::I32(partition));
                m.set_field_by_name("timestamp", PbValue::I64(timestamp));
                ("cmd_kafka_list_offset", m)
            }
            Cmd::Fetch(topic, partition, offset) => {
                let mut m = self.message("CmdKafkaFetch");
                m.set_field_by_name("topic", PbValue::String(topic.into()));
                m.set_field_by_name("partition", PbValue::I32(partition));
                m.set_field_by_name("offset", PbValue::I64(offset));
                ("cmd_kafka_fetch", m)
            }
        };
        req.set_field_by_name(field, PbValue::Message(body));
        prost::Message::encode_to_vec(&req)
    }

    async fn send_raw(&mut self, frame: Message) {
        self.ws.send(frame).await.unwrap();
    }

    async fn recv(&mut self) -> (i64, Resp) {
        let frame = tokio::time::timeout(Duration::from_secs(15), self.ws.next())
            .await
            .expect("an answer in time")
            .expect("an open connection")
            .unwrap();
        let Message::Binary(data) = frame else {
            panic!("not a binary frame: {frame:?}");
        };
        let desc = self.pool.get_message_by_name("PubSubResp").unwrap();
        let m = DynamicMessage::decode(desc, data.as_ref()).unwrap();
        let sequence = m.get_field_by_name("sequence").unwrap().as_i64().unwrap();
        let sub = |name: &str| {
            m.has_field_by_name(name).then(|| {
                m.get_field_by_name(name)
                    .unwrap()
                    .as_message()
                    .unwrap()
                    .clone()
            })
        };
        let int = |m: &DynamicMessage, f: &str| m.get_field_by_name(f).unwrap().as_i64().unwrap();
        let bytes = |m: &DynamicMessage, f: &str| {
            m.get_field_by_name(f).unwrap().as_bytes().unwrap().to_vec()
        };
        let resp = if let Some(e) = sub("error_resp") {
            Resp::Error(
                e.get_field_by_name("code").unwrap().as_i32().unwrap(),
                e.get_field_by_name("message")
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .to_owned(),
            )
        } else if let Some(p) = sub("pong_resp") {
            Resp::Pong(bytes(&p, "state"))
        } else if let Some(o) = sub("kafka_list_offset_resp") {
            Resp::Offset(int(&o, "offset"))
        } else if let Some(f) = sub("kafka_fetch_resp") {
            let list = f.get_field_by_name("messages").unwrap();
            let messages = list
                .as_list()
                .unwrap()
                .iter()
                .map(|v| {
                    let m = v.as_message().unwrap();
                    assert_eq!(m.descriptor().name(), "KafkaMessage");
                    (
                        int(m, "offset"),
                        int(m, "timestamp"),
                        bytes(m, "key"),
                        bytes(m, "value"),
                    )
                })
                .collect();
            Resp::Messages(messages)
        } else {
            panic!("a response without a body: {m:?}");
        };
        (sequence, resp)
    }

    async fn ask(&mut self, sequence: i64, cmd: Cmd<'_>) -> (i64, Resp) {
        let frame = self.encode(sequence, cmd);
        self.send_raw(Message::binary(frame)).await;
        self.recv().await
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// 30 messages `testmsg1`..`testmsg30` at offsets 0..29, one record batch each but the last
/// three, which share one (as APISIX's CI produces its topic).
fn fill(b: &Broker, topic: &str, at: i64) {
    for n in 1..=27 {
        let key = format!("key{n}").into_bytes();
        let value = format!("testmsg{n}").into_bytes();
        b.append(topic, 0, vec![(Some(key), Some(value), at + n)]);
    }
    let batch = (28..=30)
        .map(|n| (None, Some(format!("testmsg{n}").into_bytes()), at + n))
        .collect();
    b.append(topic, 0, batch);
}

fn kafka_route(id: &str, port: u16, extra: serde_json::Value) -> serde_json::Value {
    let mut route = json!({"id": id, "uri": format!("/{id}"), "upstream": {
        "nodes": {format!("127.0.0.1:{port}"): 1}, "type": "none", "scheme": "kafka"}});
    for (k, v) in extra.as_object().unwrap() {
        if k == "tls" {
            route["upstream"]["tls"] = v.clone();
        } else {
            route[k] = v.clone();
        }
    }
    route
}

fn launch(routes: serde_json::Value) -> Gateway {
    Launch::new(&json!({ "routes": routes }).to_string())
        .stderr_to_file()
        .start()
}

#[test]
fn list_offset_and_fetch_as_apisix_answers_them() {
    let rt = runtime();
    let mut b = rt.block_on(broker("test-consumer", 1, false));
    let at = now_ms();
    fill(&b, "test-consumer", at);
    let gw = launch(json!([kafka_route("kafka", b.port, json!({}))]));
    rt.block_on(async {
        let mut c = Client::connect(&gw, "/kafka").await;
        // t/pubsub/kafka.t's commands, in its order.
        assert_eq!(
            c.ask(0, Cmd::ListOffset("not-exist", 0, -1)).await,
            (
                0,
                err("failed to list offset, topic: not-exist, partition: 0, err: not found topic")
            )
        );
        assert_eq!(
            c.ask(1, Cmd::Fetch("not-exist", 0, 0)).await,
            (
                1,
                err("failed to fetch message, topic: not-exist, partition: 0, err: not found topic")
            )
        );
        let topic = "test-consumer";
        assert_eq!(c.ask(2, Cmd::ListOffset(topic, 0, -2)).await, (2, Resp::Offset(0)));
        assert_eq!(c.ask(3, Cmd::ListOffset(topic, 0, -1)).await, (3, Resp::Offset(30)));
        assert_eq!(
            c.ask(4, Cmd::ListOffset(topic, 0, 9_999_999_999_999)).await,
            (4, Resp::Offset(-1))
        );
        assert_eq!(
            c.ask(5, Cmd::ListOffset(topic, 0, 1_500_000_000_000)).await,
            (5, Resp::Offset(0))
        );
        // The first record at or after a time.
        assert_eq!(
            c.ask(55, Cmd::ListOffset(topic, 0, at + 20)).await,
            (55, Resp::Offset(19))
        );
        let (seq, Resp::Messages(got)) = c.ask(6, Cmd::Fetch(topic, 0, 14)).await else {
            panic!("messages expected");
        };
        assert_eq!(seq, 6);
        assert_eq!(got.len(), 16);
        assert_eq!(
            got[0],
            (14, at + 15, b"key15".to_vec(), b"testmsg15".to_vec())
        );
        assert_eq!(b.fetches.recv().await, Some((topic.into(), 0, 14)));
        // From the middle of the last batch: the batch comes whole from the broker, the
        // records before the offset are left out; a null key arrives as no bytes.
        assert_eq!(
            c.ask(8, Cmd::Fetch(topic, 0, 29)).await,
            (8, Resp::Messages(vec![(29, at + 30, vec![], b"testmsg30".to_vec())]))
        );
        assert_eq!(b.fetches.recv().await, Some((topic.into(), 0, 29)));
        assert_eq!(
            c.ask(9, Cmd::Fetch(topic, 0, 30)).await,
            (9, Resp::Messages(vec![]))
        );
        assert_eq!(
            c.ask(7, Cmd::Fetch(topic, 0, 999)).await,
            (
                7,
                err("failed to fetch message, topic: test-consumer, partition: 0, err: OFFSET_OUT_OF_RANGE")
            )
        );
        assert_eq!(
            c.ask(10, Cmd::Fetch(topic, 3, 0)).await,
            (
                10,
                err("failed to fetch message, topic: test-consumer, partition: 3, err: not found partition")
            )
        );
        // A later message is seen by the same connection.
        b.append(topic, 0, vec![(None, Some(b"late".to_vec()), at + 100)]);
        assert_eq!(c.ask(11, Cmd::ListOffset(topic, 0, -1)).await, (11, Resp::Offset(31)));
    });
}

#[test]
fn ping_unknown_commands_and_bad_frames() {
    let rt = runtime();
    let b = rt.block_on(broker("t", 1, false));
    let gw = launch(json!([kafka_route("kafka", b.port, json!({}))]));
    rt.block_on(async {
        let mut c = Client::connect(&gw, "/kafka").await;
        assert_eq!(
            c.ask(i64::MAX, Cmd::Ping(b"state-1")).await,
            (i64::MAX, Resp::Pong(b"state-1".to_vec()))
        );
        assert_eq!(c.ask(-5, Cmd::Ping(b"")).await, (-5, Resp::Pong(vec![])));
        assert_eq!(c.ask(3, Cmd::Empty).await, (3, err("unknown command")));
        // Not protobuf: answered with sequence 0.
        c.send_raw(Message::binary(vec![0x0a, 0x05, 0x01])).await;
        assert_eq!(c.recv().await, (0, err("wrong command")));
        // A request without a command, and a text frame: no answer; the next command is
        // answered.
        c.send_raw(Message::binary(c.encode(4, Cmd::Empty)[..2].to_vec()))
            .await;
        c.send_raw(Message::text("hello")).await;
        assert_eq!(
            c.ask(5, Cmd::Ping(b"after")).await,
            (5, Resp::Pong(b"after".to_vec()))
        );
        // Past lua-resty-websocket's 65535-byte frames, the connection ends.
        c.send_raw(Message::binary(vec![0u8; 70_000])).await;
        let end = tokio::time::timeout(Duration::from_secs(15), c.ws.next())
            .await
            .expect("the connection ends in time");
        assert!(
            matches!(end, None | Some(Err(_)) | Some(Ok(Message::Close(_)))),
            "{end:?}"
        );
        // The gateway goes on serving.
        let mut c = Client::connect(&gw, "/kafka").await;
        assert_eq!(
            c.ask(1, Cmd::Ping(b"x")).await,
            (1, Resp::Pong(b"x".to_vec()))
        );
        c.ws.close(None).await.unwrap();
    });
    let log = gw.error_output();
    assert!(
        log.contains("pubsub server receives undecodable data"),
        "{log}"
    );
    assert!(
        log.contains("pubsub callback handler not registered for the command, command: cmd_empty"),
        "{log}"
    );
}

#[test]
fn a_plain_request_is_answered_400_and_unreachable_brokers_are_not_found_topic() {
    let rt = runtime();
    let dead = dead_node();
    let port: u16 = dead.rsplit(':').next().unwrap().parse().unwrap();
    let gw = launch(json!([kafka_route("kafka-invalid", port, json!({}))]));
    let r = get(gw.addr(), "/kafka-invalid");
    assert_eq!(r.status, 400);
    assert!(r.text().contains("400 Bad Request"), "{}", r.text());
    rt.block_on(async {
        let mut c = Client::connect(&gw, "/kafka-invalid").await;
        assert_eq!(
            c.ask(0, Cmd::ListOffset("test-consumer", 0, -2)).await,
            (
                0,
                err("failed to list offset, topic: test-consumer, partition: 0, err: not found topic")
            )
        );
    });
    let log = gw.error_output();
    assert!(
        log.contains(
            "failed to initialize pubsub module, err: bad \"upgrade\" request header: nil"
        ),
        "{log}"
    );
    assert!(
        log.contains("all brokers failed in fetch topic metadata"),
        "{log}"
    );
}

#[test]
fn kafka_proxy_authenticates_with_sasl_plain() {
    let rt = runtime();
    let mut b = rt.block_on(broker("test-consumer", 1, true));
    fill(&b, "test-consumer", now_ms());
    let sasl = |user: &str, password: &str| json!({"plugins": {"kafka-proxy": {"sasl": {"username": user, "password": password}}}});
    let gw = launch(json!([
        kafka_route("kafka-sasl", b.port, sasl("user", "pass")),
        kafka_route("kafka-wrong", b.port, sasl("user", "wrong")),
    ]));
    rt.block_on(async {
        let mut c = Client::connect(&gw, "/kafka-sasl").await;
        assert_eq!(
            c.ask(0, Cmd::ListOffset("test-consumer", 0, -1)).await,
            (0, Resp::Offset(30))
        );
        // Every connection to the broker (bootstrap, partition leader) authenticates.
        assert_eq!(b.auths.recv().await.unwrap(), b"\0user\0pass");
        while let Ok(auth) = b.auths.try_recv() {
            assert_eq!(auth, b"\0user\0pass");
        }
        let mut c = Client::connect(&gw, "/kafka-wrong").await;
        assert_eq!(
            c.ask(0, Cmd::ListOffset("test-consumer", 0, -1)).await,
            (
                0,
                err("failed to list offset, topic: test-consumer, partition: 0, err: not found topic")
            )
        );
        assert_eq!(b.auths.recv().await.unwrap(), b"\0user\0wrong");
    });
}

#[test]
fn upstream_tls_with_and_without_verification() {
    let rt = runtime();
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tls/");
    let read = |f: &str| std::fs::read_to_string(format!("{data}{f}")).unwrap();
    let b = rt.block_on(tls_broker(
        "test-consumer",
        1,
        &read("server.crt"),
        &read("server.key"),
    ));
    fill(&b, "test-consumer", now_ms());
    let routes = json!([
        kafka_route("kafka-tls", b.port, json!({"tls": {"verify": false}})),
        kafka_route("kafka-tlsv", b.port, json!({"tls": {"verify": true}})),
    ]);
    let offset = |gw: &Gateway, path: &'static str| {
        rt.block_on(async {
            let mut c = Client::connect(gw, path).await;
            c.ask(0, Cmd::ListOffset("test-consumer", 0, -1)).await
        })
    };
    let gw = launch(routes.clone());
    assert_eq!(offset(&gw, "/kafka-tls"), (0, Resp::Offset(30)));
    // The test CA is none of the system's roots.
    assert_eq!(
        offset(&gw, "/kafka-tlsv"),
        (
            0,
            err("failed to list offset, topic: test-consumer, partition: 0, err: not found topic")
        )
    );
    // With the CA as `ssl_trusted_certificate`, the broker (named by its IP, which the
    // certificate lists) is verified.
    let gw = Launch::new(&json!({ "routes": routes }).to_string())
        .apisix_keys(&format!(
            "ssl:\n  enable: false\n  ssl_trusted_certificate: {data}ca.crt"
        ))
        .start();
    assert_eq!(offset(&gw, "/kafka-tlsv"), (0, Resp::Offset(30)));
}
