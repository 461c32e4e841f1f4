//! The part of RocketMQ's remoting protocol a producer needs, as lua-resty-rocketmq speaks
//! it: frames of `[total length: u32][serialize type: u8 (0, JSON)][header length: u24]
//! [header JSON][body]` (big-endian, the total counting everything after itself), the header
//! `{"code", "language", "flag", "opaque", "serializeTypeCurrentRPC", "version", "extFields",
//! "remark"}`; `GET_ROUTEINFO_BY_TOPIC` (105) to a nameserver, whose answer's body is the
//! topic's route (fastjson's JSON, which writes integer map keys unquoted), and
//! `SEND_MESSAGE_V2` (310) to the broker of the chosen queue; with ACL, the `AccessKey` and
//! the `Signature` (base64 of HMAC-SHA1 with the secret key over the ext fields' values in
//! the order of their names, then the body) added to the ext fields.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Map, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub const GET_ROUTEINFO_BY_TOPIC: i64 = 105;
pub const SEND_MESSAGE_V2: i64 = 310;
/// The response bit of `flag`.
pub const RPC_TYPE: i64 = 1;
/// The version lua-resty-rocketmq announces (4.8.0).
const VERSION: i64 = 373;
/// The largest frame taken (the broker's own limit is far lower for messages).
const MAX_FRAME: usize = 64 << 20;

/// One command, request or response.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Command {
    pub code: i64,
    pub flag: i64,
    pub opaque: i64,
    pub remark: String,
    pub ext: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

/// RocketMQ's names of the response codes an answer may carry (the library's error words).
pub fn response_code_name(code: i64) -> Option<&'static str> {
    Some(match code {
        0 => "SUCCESS",
        1 => "SYSTEM_ERROR",
        2 => "SYSTEM_BUSY",
        3 => "REQUEST_CODE_NOT_SUPPORTED",
        10 => "FLUSH_DISK_TIMEOUT",
        11 => "SLAVE_NOT_AVAILABLE",
        12 => "FLUSH_SLAVE_TIMEOUT",
        13 => "MESSAGE_ILLEGAL",
        14 => "SERVICE_NOT_AVAILABLE",
        15 => "VERSION_NOT_SUPPORTED",
        16 => "NO_PERMISSION",
        17 => "TOPIC_NOT_EXIST",
        215 => "FLOW_CONTROL",
        _ => return None,
    })
}

impl Command {
    /// A request of `code` with `ext` and `body`.
    pub fn request(code: i64, opaque: i64, ext: BTreeMap<String, String>, body: Vec<u8>) -> Self {
        Command {
            code,
            opaque,
            ext,
            body,
            ..Command::default()
        }
    }

    /// The frame on the wire.
    pub fn encode(&self) -> Vec<u8> {
        let ext: Map<String, Value> = self
            .ext
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        let header = json!({
            "code": self.code,
            "language": "other",
            "flag": self.flag,
            "opaque": self.opaque,
            "serializeTypeCurrentRPC": "JSON",
            "version": VERSION,
            "extFields": ext,
            "remark": self.remark,
        })
        .to_string();
        let total = 4 + header.len() + self.body.len();
        let mut out = Vec::with_capacity(4 + total);
        out.extend_from_slice(&(total as u32).to_be_bytes());
        // Serialize type 0 (JSON), then the header's length in 24 bits.
        out.extend_from_slice(&(header.len() as u32 & 0x00ff_ffff).to_be_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(&self.body);
        out
    }

    /// Parses one frame's content (what follows its length).
    pub fn decode(frame: &[u8]) -> Result<Command, String> {
        if frame.len() < 4 {
            return Err("short frame".into());
        }
        if frame[0] != 0 {
            return Err(format!("unsupported serialize type {}", frame[0]));
        }
        let len = u32::from_be_bytes([0, frame[1], frame[2], frame[3]]) as usize;
        let header = frame
            .get(4..4 + len)
            .ok_or_else(|| "header longer than its frame".to_owned())?;
        let h: Value = serde_json::from_slice(header).map_err(|e| format!("bad header: {e}"))?;
        let int = |k: &str| h.get(k).and_then(Value::as_i64).unwrap_or(0);
        let ext = h
            .get("extFields")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .map(|(k, v)| {
                let v = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (k.clone(), v)
            })
            .collect();
        Ok(Command {
            code: int("code"),
            flag: int("flag"),
            opaque: int("opaque"),
            remark: h
                .get("remark")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            ext,
            body: frame[4 + len..].to_vec(),
        })
    }
}

/// Reads one frame.
pub async fn read_command<S: AsyncRead + Unpin>(s: &mut S) -> std::io::Result<Command> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!("frame of {len} bytes")));
    }
    let mut frame = vec![0u8; len];
    s.read_exact(&mut frame).await?;
    Command::decode(&frame).map_err(std::io::Error::other)
}

/// Sends `req` and reads frames until the response to it (by `opaque`), each step within
/// `timeout`.
pub async fn call<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    req: &Command,
    timeout: Duration,
) -> Result<Command, String> {
    let step = |e: std::io::Error| e.to_string();
    tokio::time::timeout(timeout, s.write_all(&req.encode()))
        .await
        .map_err(|_| "timeout".to_owned())?
        .map_err(step)?;
    loop {
        let got = tokio::time::timeout(timeout, read_command(s))
            .await
            .map_err(|_| "timeout".to_owned())?
            .map_err(step)?;
        if got.opaque == req.opaque && got.flag & RPC_TYPE != 0 {
            return Ok(got);
        }
    }
}

/// `acl_rpchook`'s signature over `ext` (without `Signature`) and `body`.
pub fn signature(secret_key: &str, ext: &BTreeMap<String, String>, body: &[u8]) -> String {
    let key = ring::hmac::Key::new(
        ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        secret_key.as_bytes(),
    );
    let mut ctx = ring::hmac::Context::with_key(&key);
    for (k, v) in ext {
        if k != "Signature" && k != "_UNIQUE_KEY_QUERY" {
            ctx.update(v.as_bytes());
        }
    }
    ctx.update(body);
    base64::engine::general_purpose::STANDARD.encode(ctx.sign().as_ref())
}

/// Adds `AccessKey` and `Signature` to `ext`.
pub fn sign(access_key: &str, secret_key: &str, ext: &mut BTreeMap<String, String>, body: &[u8]) {
    ext.insert("AccessKey".into(), access_key.to_owned());
    let sig = signature(secret_key, ext, body);
    ext.insert("Signature".into(), sig);
}

/// fastjson writes integer map keys unquoted (`"brokerAddrs":{0:"host:port"}`): quotes them
/// so that the text is JSON.
pub fn quote_int_keys(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 8);
    let (mut in_str, mut escaped) = (false, false);
    // The last byte outside strings that was not white space.
    let mut last = b' ';
    // How much of `text` is in `out` already.
    let mut copied = 0;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if in_str {
            if escaped {
                escaped = false;
            } else if c == b'\\' {
                escaped = true;
            } else if c == b'"' {
                in_str = false;
                last = c;
            }
        } else if c == b'"' {
            in_str = true;
        } else if (c.is_ascii_digit() || c == b'-') && (last == b'{' || last == b',') {
            let end = i + 1 + b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
            if b[end..].iter().find(|c| !c.is_ascii_whitespace()) == Some(&b':') {
                // `i` and `end` are at ASCII bytes: the slices are whole characters.
                out.push_str(&text[copied..i]);
                out.push('"');
                out.push_str(&text[i..end]);
                out.push('"');
                copied = end;
                last = b'"';
                i = end;
                continue;
            }
            last = c;
        } else if !c.is_ascii_whitespace() {
            last = c;
        }
        i += 1;
    }
    out.push_str(&text[copied..]);
    out
}

/// One queue to send to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queue {
    pub broker_name: String,
    pub queue_id: u32,
}

/// A topic's route: its writable queues and each broker's master address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Route {
    pub queues: Vec<Queue>,
    pub masters: BTreeMap<String, String>,
}

/// The `PERM_WRITE` bit of a queue's `perm`.
const PERM_WRITE: i64 = 2;

impl Route {
    /// `topicRouteData2TopicPublishInfo`: the ordered topic's `orderTopicConf`
    /// (`broker:queues;...`), else the writable queues of the brokers that have a master,
    /// brokers by name from the last.
    pub fn parse(body: &[u8]) -> Result<Route, String> {
        let text = String::from_utf8_lossy(body);
        let v: Value = serde_json::from_str(&quote_int_keys(&text))
            .map_err(|e| format!("bad topic route: {e}"))?;
        let mut masters = BTreeMap::new();
        for bd in v["brokerDatas"].as_array().into_iter().flatten() {
            let (Some(name), Some(addr)) =
                (bd["brokerName"].as_str(), bd["brokerAddrs"]["0"].as_str())
            else {
                continue;
            };
            masters.insert(name.to_owned(), addr.to_owned());
        }
        let mut queues = Vec::new();
        if let Some(conf) = v["orderTopicConf"].as_str() {
            for broker in conf.split(';').filter(|s| !s.is_empty()) {
                let (name, n) = broker.split_once(':').unwrap_or((broker, "0"));
                for queue_id in 0..n.trim().parse::<u32>().unwrap_or(0) {
                    queues.push(Queue {
                        broker_name: name.to_owned(),
                        queue_id,
                    });
                }
            }
        } else {
            let mut qds: Vec<&Value> = v["queueDatas"].as_array().into_iter().flatten().collect();
            qds.sort_by(|a, b| b["brokerName"].as_str().cmp(&a["brokerName"].as_str()));
            for qd in qds {
                let name = qd["brokerName"].as_str().unwrap_or("");
                let writable = qd["perm"].as_i64().unwrap_or(0) & PERM_WRITE == PERM_WRITE;
                if !writable || !masters.contains_key(name) {
                    continue;
                }
                for queue_id in 0..qd["writeQueueNums"].as_u64().unwrap_or(0) as u32 {
                    queues.push(Queue {
                        broker_name: name.to_owned(),
                        queue_id,
                    });
                }
            }
        }
        Ok(Route { queues, masters })
    }
}

/// `messageProperties2String`: `key\x01value\x02` for each property.
pub fn properties(props: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (k, v) in props {
        out.push_str(k);
        out.push('\u{1}');
        out.push_str(v);
        out.push('\u{2}');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let mut ext = BTreeMap::new();
        ext.insert("topic".to_owned(), "logs".to_owned());
        let req = Command::request(GET_ROUTEINFO_BY_TOPIC, 7, ext, b"body".to_vec());
        let wire = req.encode();
        let total = u32::from_be_bytes(wire[..4].try_into().unwrap()) as usize;
        assert_eq!(total, wire.len() - 4);
        assert_eq!(wire[4], 0, "JSON serialization");
        let back = Command::decode(&wire[4..]).unwrap();
        assert_eq!(back, req);
        let header: Value = serde_json::from_slice(&wire[8..wire.len() - 4]).unwrap();
        assert_eq!(header["language"], "other");
        assert_eq!(header["version"], 373);
        assert_eq!(header["extFields"]["topic"], "logs");
        assert!(Command::decode(&[1, 0, 0, 0]).is_err());
    }

    #[test]
    fn signature_is_hmac_sha1_of_sorted_values_and_body() {
        let mut ext = BTreeMap::new();
        ext.insert("b".to_owned(), "2".to_owned());
        ext.insert("a".to_owned(), "1".to_owned());
        sign("ak", "sk", &mut ext, b"body");
        assert_eq!(ext["AccessKey"], "ak");
        // The names in byte order put `AccessKey` first: the values go "ak", "1", "2".
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, b"sk");
        let want = ring::hmac::sign(&key, b"ak12body");
        assert_eq!(
            ext["Signature"],
            base64::engine::general_purpose::STANDARD.encode(want.as_ref())
        );
    }

    #[test]
    fn routes_from_fastjson() {
        let body = br#"{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.1:10912"},"brokerName":"a","cluster":"c"},{"brokerAddrs":{1:"x:1"},"brokerName":"b"}],"queueDatas":[{"brokerName":"a","perm":6,"readQueueNums":4,"writeQueueNums":2,"topicSysFlag":0},{"brokerName":"b","perm":6,"writeQueueNums":3},{"brokerName":"z","perm":4,"writeQueueNums":3}],"name":"{0:\"kept\"}"}"#;
        let r = Route::parse(body).unwrap();
        assert_eq!(r.masters["a"], "127.0.0.1:10911");
        assert_eq!(r.queues.len(), 2);
        assert!(r.queues.iter().all(|q| q.broker_name == "a"));
        assert_eq!(
            quote_int_keys(r#"{"n":"{0:1}", 5 :[1,2]}"#),
            r#"{"n":"{0:1}", "5" :[1,2]}"#
        );
        let ordered =
            Route::parse(br#"{"brokerDatas":[],"queueDatas":[],"orderTopicConf":"a:2;b:1"}"#)
                .unwrap();
        assert_eq!(ordered.queues.len(), 3);
        assert_eq!(
            properties(&[("KEYS", "k"), ("WAIT", "true")]),
            "KEYS\u{1}k\u{2}WAIT\u{1}true\u{2}"
        );
    }
}
