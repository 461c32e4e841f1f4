//! tencent-cloud-cls (`apisix/plugins/tencent-cloud-cls.lua` and its `cls-sdk.lua`):
//! batches to Tencent Cloud Log Service's structured-log API, `POST
//! <scheme>://<cls_host>/structuredlog?topic_id=<cls_topic>`, the body CLS's protobuf
//! `LogGroupList` (one `LogGroup` whose `source` is this machine's IP, a `Log` per entry
//! with the send time in ms and the entry's fields as key/value contents: strings as they
//! are, numbers as Lua prints them, tables as JSON, each value cut at 1 MiB; groups split
//! at 5 MB), signed with Tencent Cloud's CLS signature (`Authorization:
//! q-sign-algorithm=sha1&q-ak=<secret_id>&q-sign-time=<t>;<t+60>&...&q-signature=<hmac>`).
//! `global_tag`'s fields are set on every entry; `sample_ratio` logs that share of the
//! requests. An answer other than 200 fails the batch, except 401, 403, 404 and 413,
//! which CLS will not accept on a retry either (logged, the batch dropped). `ssl_verify`
//! for `https` (the default scheme). The entry is the loggers' (default or `log_format`,
//! bodies).
//!
//! Not as APISIX: a request not sampled still has its body read when `include_req_body` is
//! set (the sample is drawn in the log phase).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{
    CompileCtx, LogCtx, LogNeeds, Phases, Plugin, PluginDef, PluginServices,
};
use http::{header, HeaderValue, Method};
use prost::Message;
use rand::Rng;
use ring::{digest, hmac};
use serde_json::{json, Map, Value};

use super::sink::http::HttpTarget;
use super::sink::{self, BatchSink, Logger, SendError, SendFuture};

pub const NAME: &str = "tencent-cloud-cls";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &["secret_key"],
    ..sink::def(NAME, 397, schema, compile)
};

const API_PATH: &str = "/structuredlog";
/// Seconds a signature is valid for.
const AUTH_EXPIRE: u64 = 60;
const MAX_SINGLE_VALUE_SIZE: usize = 1024 * 1024;
const MAX_LOG_GROUP_VALUE_SIZE: usize = 5 * 1024 * 1024;

fn schema() -> Value {
    sink::schema(
        json!({
            "type": "object",
            "properties": {
                "cls_host": {"type": "string"},
                "cls_topic": {"type": "string"},
                "scheme": {"type": "string", "enum": ["http", "https"], "default": "https"},
                "ssl_verify": {"type": "boolean", "default": true},
                "secret_id": {"type": "string"},
                "secret_key": {"type": "string"},
                "sample_ratio": {"type": "number", "minimum": 0.00001, "maximum": 1, "default": 1},
                "global_tag": {"type": "object"}
            },
            "required": ["cls_host", "cls_topic", "secret_id", "secret_key"]
        }),
        NAME,
    )
}

/// CLS's `cls.proto` (https://www.tencentcloud.com/document/product/614/42787).
pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Content {
        #[prost(string, required, tag = "1")]
        pub key: String,
        #[prost(string, required, tag = "2")]
        pub value: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Log {
        #[prost(int64, required, tag = "1")]
        pub time: i64,
        #[prost(message, repeated, tag = "2")]
        pub contents: Vec<Content>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LogTag {
        #[prost(string, required, tag = "1")]
        pub key: String,
        #[prost(string, required, tag = "2")]
        pub value: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LogGroup {
        #[prost(message, repeated, tag = "1")]
        pub logs: Vec<Log>,
        #[prost(string, optional, tag = "2")]
        pub context_flow: Option<String>,
        #[prost(string, optional, tag = "3")]
        pub filename: Option<String>,
        #[prost(string, optional, tag = "4")]
        pub source: Option<String>,
        #[prost(message, repeated, tag = "5")]
        pub log_tags: Vec<LogTag>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LogGroupList {
        #[prost(message, repeated, tag = "1")]
        pub log_group_list: Vec<LogGroup>,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hmac_sha1_hex(key: &[u8], msg: &[u8]) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, key);
    hex(hmac::sign(&key, msg).as_ref())
}

/// The `Authorization` of a request signed at `now` (seconds), CLS's signature of `POST
/// /structuredlog` without signed headers or parameters.
pub fn sign(secret_id: &str, secret_key: &str, now: u64) -> String {
    let request_info = format!("post\n{API_PATH}\n\n\n");
    let sign_time = format!("{now};{}", now + AUTH_EXPIRE);
    let request_sha1 =
        hex(digest::digest(&digest::SHA1_FOR_LEGACY_USE_ONLY, request_info.as_bytes()).as_ref());
    let string_to_sign = format!("sha1\n{sign_time}\n{request_sha1}\n");
    let sign_key = hmac_sha1_hex(secret_key.as_bytes(), sign_time.as_bytes());
    let signature = hmac_sha1_hex(sign_key.as_bytes(), string_to_sign.as_bytes());
    [
        "q-sign-algorithm=sha1".to_owned(),
        format!("q-ak={secret_id}"),
        format!("q-sign-time={sign_time}"),
        format!("q-key-time={sign_time}"),
        "q-header-list=".to_owned(),
        "q-url-param-list=".to_owned(),
        format!("q-signature={signature}"),
    ]
    .join("&")
}

/// `normalize_log`: an entry's fields as CLS contents, and their size.
fn contents(entry: &Map<String, Value>) -> (Vec<proto::Content>, usize) {
    let mut size = 4;
    let out = entry
        .iter()
        .map(|(k, v)| {
            let mut value = match v {
                Value::String(s) => s.clone(),
                Value::Array(_) | Value::Object(_) => lua::cjson_encode(v),
                other => lua::cjson_encode(other),
            };
            if value.len() > MAX_SINGLE_VALUE_SIZE {
                tracing::warn!("{k} value size over {MAX_SINGLE_VALUE_SIZE} , truncated");
                let mut cut = MAX_SINGLE_VALUE_SIZE;
                while !value.is_char_boundary(cut) {
                    cut -= 1;
                }
                value.truncate(cut);
            }
            size += k.len() + value.len();
            proto::Content {
                key: k.clone(),
                value,
            }
        })
        .collect();
    (out, size)
}

struct ClsSink {
    url: String,
    secret_id: String,
    secret_key: String,
    target: HttpTarget,
}

/// This machine's IP (the log group's `source`), as the SDK resolves its hostname.
async fn host_ip() -> Result<String, String> {
    let name = super::log_entry::hostname();
    let mut addrs = tokio::net::lookup_host((name.as_str(), 0))
        .await
        .map_err(|e| e.to_string())?;
    addrs
        .next()
        .map(|a| a.ip().to_string())
        .ok_or_else(|| format!("no address for {name}"))
}

fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

impl ClsSink {
    async fn request(&self, groups: proto::LogGroupList) -> Result<(), SendError> {
        let auth = sign(&self.secret_id, &self.secret_key, now().as_secs());
        let builder = self.target.request(Method::POST, &self.url).header(
            header::AUTHORIZATION,
            HeaderValue::from_str(&auth).map_err(|e| SendError::new(e.to_string()))?,
        );
        let resp = self
            .target
            .call(builder, Bytes::from(groups.encode_to_vec()))
            .await
            .map_err(|e| e.into_send_error(""))?;
        let status = resp.status().as_u16();
        if status == 200 {
            return Ok(());
        }
        let headers: Map<String, Value> = resp
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()),
                )
            })
            .collect();
        let err = format!(
            "got wrong status: {status}, headers: {}, body, {}",
            lua::cjson_encode(&Value::Object(headers)),
            String::from_utf8_lossy(resp.body())
        );
        if matches!(status, 401 | 403 | 404 | 413) {
            tracing::error!("{err}, not retryable");
            return Ok(());
        }
        Err(SendError::new(err))
    }

    async fn send_all(&self, entries: &[Bytes]) -> Result<(), SendError> {
        let source = host_ip().await.map_err(SendError::new)?;
        let time = i64::try_from(now().as_millis()).unwrap_or(i64::MAX);
        let group = |logs: Vec<proto::Log>| proto::LogGroupList {
            log_group_list: vec![proto::LogGroup {
                logs,
                source: Some(source.clone()),
                ..Default::default()
            }],
        };
        let mut logs = Vec::new();
        let mut total = 0;
        let mut group_start = 1;
        for (i, e) in entries.iter().enumerate() {
            let Ok(Value::Object(entry)) = serde_json::from_slice::<Value>(e) else {
                continue;
            };
            let (contents, size) = contents(&entry);
            if size > MAX_LOG_GROUP_VALUE_SIZE {
                tracing::error!("size of log is over 5MB, dropped");
                continue;
            }
            total += size;
            if total > MAX_LOG_GROUP_VALUE_SIZE {
                self.request(group(std::mem::take(&mut logs)))
                    .await
                    .map_err(|e| SendError {
                        first_fail: Some(group_start),
                        ..e
                    })?;
                group_start = i + 1;
                total = 0;
            }
            logs.push(proto::Log { time, contents });
        }
        self.request(group(logs)).await.map_err(|e| SendError {
            first_fail: Some(group_start),
            ..e
        })
    }
}

impl BatchSink for ClsSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], _: usize) -> SendFuture<'a> {
        Box::pin(self.send_all(entries))
    }
}

/// The logger with its sample ratio and global tags.
struct Cls {
    logger: Logger,
    sample_ratio: f64,
    global_tag: Map<String, Value>,
}

impl Plugin for Cls {
    fn phases(&self) -> Phases {
        Phases::LOG
    }

    fn log_needs(&self) -> LogNeeds {
        self.logger.needs()
    }

    fn log(&self, ctx: &LogCtx) {
        if self.sample_ratio < 1.0 && rand::thread_rng().gen::<f64>() >= self.sample_ratio {
            return;
        }
        self.logger.log_with(ctx, |mut entry, _| {
            for (k, v) in &self.global_tag {
                entry.insert(k.clone(), v.clone());
            }
            Bytes::from(lua::cjson_encode(&Value::Object(entry)))
        });
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let services = cx.services;
    let filled = cx.filled();
    let logger = Logger::compile(cx, NAME, false, |c| {
        Ok(Arc::new(ClsSink::new(c, services)) as Arc<dyn BatchSink>)
    })?;
    Ok(Arc::new(Cls {
        logger,
        sample_ratio: filled
            .get("sample_ratio")
            .and_then(Value::as_f64)
            .unwrap_or(1.0),
        global_tag: filled
            .get("global_tag")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default(),
    }))
}

impl ClsSink {
    fn new(c: &Map<String, Value>, services: &Arc<PluginServices>) -> ClsSink {
        let text = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        let host = text("cls_host");
        let scheme = c.get("scheme").and_then(Value::as_str).unwrap_or("https");
        let mut headers = vec![(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        )];
        if let Ok(h) = HeaderValue::from_str(&host) {
            headers.push((header::HOST, h));
        }
        ClsSink {
            url: format!("{scheme}://{host}{API_PATH}?topic_id={}", text("cls_topic")),
            secret_id: text("secret_id"),
            secret_key: text("secret_key"),
            // The SDK's read and send timeouts.
            target: HttpTarget::new(
                services,
                Duration::from_secs(10),
                c.get("ssl_verify").and_then(Value::as_bool).unwrap_or(true),
                headers,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;

    use super::*;
    use crate::log::sink::testing::{answer, http_server, log_ctx, next, Captured};
    use crate::testing::Compiler;

    /// CLS's check of a request's `Authorization` for key id `AKID`, secret `SKEY`: the
    /// signing key is HMAC-SHA1(secret, key time) in hex, the signature HMAC-SHA1(signing
    /// key, "sha1\n<sign time>\n<sha1 hex of the request info>\n") in hex, the request
    /// info the method, path, parameters and headers each followed by a newline.
    fn authorized(auth: &str) -> bool {
        let fields: std::collections::HashMap<&str, &str> = auth
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .collect();
        let (Some(t), Some(sig)) = (fields.get("q-key-time"), fields.get("q-signature")) else {
            return false;
        };
        let key = hmac::Key::new(hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, b"SKEY");
        let signing_key = hex(hmac::sign(&key, t.as_bytes()).as_ref());
        let info = digest::digest(
            &digest::SHA1_FOR_LEGACY_USE_ONLY,
            b"post\n/structuredlog\n\n\n",
        );
        let to_sign = format!("sha1\n{t}\n{}\n", hex(info.as_ref()));
        let key = hmac::Key::new(hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, signing_key.as_bytes());
        fields.get("q-ak") == Some(&"AKID")
            && fields.get("q-sign-algorithm") == Some(&"sha1")
            && *sig == hex(hmac::sign(&key, to_sign.as_bytes()).as_ref())
    }

    fn authorization(req: &Captured) -> String {
        req.head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(": ")?;
                k.eq_ignore_ascii_case("authorization")
                    .then(|| v.to_owned())
            })
            .unwrap_or_default()
    }

    /// A CLS endpoint: `POST /structuredlog?topic_id=...` with a valid signature and a
    /// protobuf body is taken; a bad signature gets 401, an unknown topic 500.
    fn cls(req: &Captured) -> Vec<u8> {
        if !authorized(&authorization(req)) {
            return answer(401, r#"{"errorcode":"Unauthorized"}"#);
        }
        if !req
            .head
            .starts_with("POST /structuredlog?topic_id=topic-1 ")
        {
            return answer(500, "no such topic");
        }
        match proto::LogGroupList::decode(&req.body[..]) {
            Ok(_) => answer(200, ""),
            Err(_) => answer(400, "bad body"),
        }
    }

    #[tokio::test]
    async fn signed_protobuf_log_groups() {
        let (port, mut rx) = http_server(cls).await;
        let c = Compiler::new();
        let conf = json!({"cls_host": format!("127.0.0.1:{port}"), "cls_topic": "topic-1",
            "scheme": "http", "secret_id": "AKID", "secret_key": "SKEY", "batch_max_size": 2,
            "global_tag": {"env": "test", "n": 1}, "log_format": {"s": "$status", "u": "$request_uri"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "cls-1", None)).unwrap();
        for n in 0..2 {
            p.log(&log_ctx(&*p, n));
        }
        let req = next(&mut rx).await;
        assert!(req.lower().contains("content-type: application/x-protobuf"));
        assert!(authorized(&authorization(&req)));
        let list = proto::LogGroupList::decode(&req.body[..]).unwrap();
        let group = &list.log_group_list[0];
        assert!(group.source.as_deref().is_some_and(|s| !s.is_empty()));
        assert_eq!(group.logs.len(), 2);
        let log = &group.logs[1];
        assert!(log.time > 1_700_000_000_000, "ms: {}", log.time);
        let fields: std::collections::HashMap<&str, &str> = log
            .contents
            .iter()
            .map(|c| (c.key.as_str(), c.value.as_str()))
            .collect();
        assert_eq!(fields["u"], "/x?n=1");
        assert_eq!(fields["s"], "200");
        assert_eq!(fields["env"], "test");
        assert_eq!(fields["n"], "1");
        assert_eq!(fields["route_id"], "r1");
    }

    #[tokio::test]
    async fn refusals_retryable_or_not() {
        let (port, _rx) = http_server(cls).await;
        let services = Arc::new(PluginServices::default());
        let sink = |topic: &str, key: &str| {
            ClsSink::new(
                json!({"cls_host": format!("127.0.0.1:{port}"), "cls_topic": topic, "scheme": "http",
                    "secret_id": "AKID", "secret_key": key})
                .as_object()
                .unwrap(),
                &services,
            )
        };
        let entry = [Bytes::from_static(b"{\"a\":1}")];
        // A bad key: 401, not retried (the batch is dropped).
        assert!(sink("topic-1", "wrong").send_all(&entry).await.is_ok());
        let err = sink("other", "SKEY").send_all(&entry).await.unwrap_err();
        assert!(
            err.message.starts_with("got wrong status: 500, headers: {"),
            "{}",
            err.message
        );
        assert!(
            err.message.ends_with("body, no such topic"),
            "{}",
            err.message
        );
    }

    #[test]
    fn contents_as_the_sdk_normalises_them() {
        let e = json!({"s": "x", "n": 1.5, "t": {"a": [1]}, "b": true});
        let (c, size) = contents(e.as_object().unwrap());
        let m: std::collections::HashMap<_, _> = c
            .iter()
            .map(|c| (c.key.as_str(), c.value.as_str()))
            .collect();
        assert_eq!(m["s"], "x");
        assert_eq!(m["n"], "1.5");
        assert_eq!(m["t"], "{\"a\":[1]}");
        assert_eq!(m["b"], "true");
        // 4, then each key's and value's length.
        assert_eq!(size, 4 + (1 + 1) + (1 + 3) + (1 + 9) + (1 + 4));
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        let pre = "failed to check the configuration of plugin tencent-cloud-cls err: ";
        assert_eq!(
            r.check(
                NAME,
                &json!({"cls_host": "h", "cls_topic": "t", "secret_id": "i"})
            )
            .unwrap_err(),
            format!("{pre}property \"secret_key\" is required")
        );
        let ok = json!({"cls_host": "h", "cls_topic": "t", "secret_id": "i", "secret_key": "k"});
        assert!(r.check(NAME, &ok).is_ok());
        let mut bad = ok.clone();
        bad["sample_ratio"] = json!(0);
        assert_eq!(
            r.check(NAME, &bad).unwrap_err(),
            format!(
                "{pre}property \"sample_ratio\" validation failed: expected 0 to be at least 1e-05"
            )
        );
        bad["sample_ratio"] = json!(0.5);
        bad["scheme"] = json!("ftp");
        assert!(r.check(NAME, &bad).is_err());
        assert_eq!(r.get(NAME).unwrap().priority, 397);
    }
}
