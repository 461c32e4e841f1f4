//! ai-aws-content-moderation (`apisix/plugins/ai-aws-content-moderation.lua`): the text of
//! an AI request (the roles of `request_check_roles`, `request_check_mode`) and, with
//! `check_response`, of its answer is scored by AWS Comprehend's `DetectToxicContent`
//! (SigV4-signed, `support::cloud::sigv4`), cut into the segments and calls the service
//! takes; a toxicity or category score over its threshold refuses the request, or replaces
//! the answer, with a refusal in the client's protocol. A streamed answer is checked in
//! batches as it goes (`realtime`) or once assembled, its last events annotated with
//! `risk_level` (`final_packet`).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use ferrisix_plugin_api::{
    CompileCtx, Flow, Phases, Plugin, PluginCtx, PluginDef, PluginServices, Step,
};
use http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode};
use serde_json::{json, Value};

use crate::support::ai::call::Endpoint;
use crate::support::ai::guard::{
    self, Answer, Chunk, ChunkOut, DenyShape, FailMode, GuardFuture, ResponseGuard, ResponseGuards,
    Roles, StreamGuard,
};
use crate::support::ai::{AiRequest, LlmRecord, PickedInstance};
use crate::support::cloud::sigv4;

pub const NAME: &str = "ai-aws-content-moderation";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &["comprehend.secret_access_key"],
    ..PluginDef::new(NAME, 1031, schema, compile)
};

/// DetectToxicContent takes at most 10 segments of at most 1 KB each per call, the list
/// under 10 KB; `MAX_CALL_BYTES` keeps a margin under the list's cap, as APISIX does.
const MAX_SEGMENT_BYTES: usize = 1024;
const MAX_SEGMENTS_PER_CALL: usize = 10;
const MAX_CALL_BYTES: usize = 10000;
/// A UTF-8 character takes up to 4 bytes: a smaller segment could not hold one.
const MIN_SEGMENT_BYTES: usize = 4;

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "comprehend": {
                "type": "object",
                "properties": {
                    "access_key_id": {"type": "string"},
                    "secret_access_key": {"type": "string"},
                    "region": {"type": "string"},
                    "endpoint": {"type": "string", "pattern": "^https?://"},
                    "ssl_verify": {"type": "boolean", "default": true}
                },
                "required": ["access_key_id", "secret_access_key", "region"]
            },
            "moderation_categories": {
                "type": "object",
                "patternProperties": {
                    "^(PROFANITY|HATE_SPEECH|INSULT|HARASSMENT_OR_ABUSE|SEXUAL|VIOLENCE_OR_THREAT)$":
                        {"type": "number", "minimum": 0, "maximum": 1}
                },
                "additionalProperties": false
            },
            "moderation_threshold": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.5},
            "check_request": {"type": "boolean", "default": true},
            "check_response": {"type": "boolean", "default": false},
            "request_check_roles": {
                "type": "array",
                "items": {"type": "string", "enum": ["user", "tool", "system", "assistant"]},
                "minItems": 1,
                "uniqueItems": true,
                "default": ["user", "tool", "system", "assistant"]
            },
            "request_check_mode": {"type": "string", "enum": ["last", "all"], "default": "all"},
            "request_check_length_limit": {
                "type": "integer", "minimum": MIN_SEGMENT_BYTES, "maximum": MAX_SEGMENT_BYTES,
                "default": 1000
            },
            "response_check_length_limit": {
                "type": "integer", "minimum": MIN_SEGMENT_BYTES, "maximum": MAX_SEGMENT_BYTES,
                "default": 1000
            },
            "stream_check_mode": {
                "type": "string", "enum": ["realtime", "final_packet"], "default": "final_packet"
            },
            "stream_check_cache_size": {"type": "integer", "minimum": 1, "default": 128},
            "stream_check_interval": {"type": "number", "minimum": 0.1, "default": 3},
            "deny_code": {"type": "integer", "minimum": 200, "maximum": 599, "default": 200},
            "deny_message": {"type": "string"},
            "timeout": {"type": "integer", "minimum": 1, "default": 10000},
            "keepalive": {"type": "boolean", "default": true},
            "keepalive_timeout": {"type": "integer", "minimum": 1000, "default": 60000},
            "fail_mode": guard::fail_mode_schema()
        },
        "required": ["comprehend"]
    })
}

#[derive(Debug)]
struct Conf {
    creds: sigv4::Credentials,
    /// `scheme://host[:port]/`, where the calls go.
    uri: String,
    /// `scheme://host`, as the errors name it.
    endpoint: String,
    host: HeaderValue,
    ssl_verify: bool,
    categories: Vec<(String, f64)>,
    threshold: f64,
    check_request: bool,
    check_response: bool,
    roles: Roles,
    all: bool,
    request_limit: usize,
    response_limit: usize,
    realtime: bool,
    cache_size: usize,
    interval: Duration,
    deny_code: u16,
    deny_message: Option<String>,
    timeout: Duration,
    keepalive: bool,
    fail_mode: FailMode,
}

/// The Comprehend client of one conf.
#[derive(Debug)]
struct Moderator {
    conf: Conf,
    services: Arc<PluginServices>,
}

#[derive(Debug)]
struct AwsContentModeration(Arc<Moderator>);

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let c = &conf["comprehend"];
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let region = text(c, "region");
    let endpoint_text = c.get("endpoint").and_then(Value::as_str).map_or_else(
        || format!("https://comprehend.{region}.amazonaws.com"),
        str::to_owned,
    );
    let ep = Endpoint::parse(&endpoint_text).ok_or("invalid comprehend.endpoint")?;
    let default_port = if ep.scheme == "https" { 443 } else { 80 };
    let authority = if ep.host.contains(':') {
        format!("[{}]", ep.host)
    } else {
        ep.host.clone()
    };
    let host = if ep.port == default_port {
        authority.clone()
    } else {
        format!("{authority}:{}", ep.port)
    };
    let num = |k: &str, d: u64| conf.get(k).and_then(Value::as_u64).unwrap_or(d);
    let mut categories: Vec<(String, f64)> = conf
        .get("moderation_categories")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_f64()?)))
        .collect();
    categories.sort_by(|a, b| a.0.cmp(&b.0));
    let conf = Conf {
        creds: sigv4::Credentials {
            access_key: text(c, "access_key_id"),
            secret_key: text(c, "secret_access_key"),
            session_token: c
                .get("session_token")
                .and_then(Value::as_str)
                .map(str::to_owned),
            region,
            service: "comprehend".into(),
        },
        uri: format!("{}://{}:{}/", ep.scheme, authority, ep.port),
        endpoint: format!("{}://{}", ep.scheme, ep.host),
        host: HeaderValue::from_str(&host).map_err(|_| "invalid comprehend.endpoint")?,
        ssl_verify: c.get("ssl_verify").and_then(Value::as_bool) != Some(false),
        categories,
        threshold: conf
            .get("moderation_threshold")
            .and_then(Value::as_f64)
            .unwrap_or(0.5),
        check_request: conf.get("check_request").and_then(Value::as_bool) != Some(false),
        check_response: conf.get("check_response").and_then(Value::as_bool) == Some(true),
        roles: Roles::from_conf(&conf),
        all: conf.get("request_check_mode").and_then(Value::as_str) != Some("last"),
        request_limit: num("request_check_length_limit", 1000) as usize,
        response_limit: num("response_check_length_limit", 1000) as usize,
        realtime: conf.get("stream_check_mode").and_then(Value::as_str) == Some("realtime"),
        cache_size: num("stream_check_cache_size", 128) as usize,
        interval: Duration::from_secs_f64(
            conf.get("stream_check_interval")
                .and_then(Value::as_f64)
                .unwrap_or(3.0),
        ),
        deny_code: num("deny_code", 200) as u16,
        deny_message: conf
            .get("deny_message")
            .and_then(Value::as_str)
            .map(str::to_owned),
        timeout: Duration::from_millis(num("timeout", 10000)),
        keepalive: conf.get("keepalive").and_then(Value::as_bool) != Some(false),
        fail_mode: FailMode::from_conf(&conf),
    };
    Ok(Arc::new(AwsContentModeration(Arc::new(Moderator {
        conf,
        services: cx.services.clone(),
    }))))
}

/// The end of the segment of `content` starting at `from`: at most `limit` bytes, cut
/// before a UTF-8 character it would tear (on the byte when the text is no UTF-8).
fn segment_end(content: &[u8], from: usize, limit: usize) -> usize {
    let last = from + limit;
    if last >= content.len() {
        return content.len();
    }
    let is_cont = |b: u8| (0x80..0xC0).contains(&b);
    let mut cut = last;
    for _ in 0..3 {
        if !is_cont(content[cut]) {
            break;
        }
        cut -= 1;
    }
    if cut <= from || is_cont(content[cut]) {
        return last;
    }
    cut
}

/// The next batch of segments from `cursor`, within the per-segment, per-list and per-call
/// limits; and where the next batch starts.
fn next_batch(content: &[u8], mut cursor: usize, limit: usize) -> (Vec<&[u8]>, usize) {
    let mut segments = Vec::new();
    let mut bytes = 0;
    while cursor < content.len() && segments.len() < MAX_SEGMENTS_PER_CALL {
        let stop = segment_end(content, cursor, limit);
        let piece = &content[cursor..stop];
        if !segments.is_empty() && bytes + piece.len() > MAX_CALL_BYTES {
            break;
        }
        segments.push(piece);
        bytes += piece.len();
        cursor = stop;
    }
    (segments, cursor)
}

/// `set_risk_level`: a hit is `high`; a clean verdict `none` unless a hit was seen before.
fn set_risk_level(record: &LlmRecord, flagged: bool) {
    record.update(|f| {
        if flagged {
            f.risk_level = Some("high".into());
        } else if f.risk_level.as_deref() != Some("high") {
            f.risk_level = Some("none".into());
        }
    });
}

impl Moderator {
    /// The signed DetectToxicContent request for `segments`.
    fn request(&self, segments: &[&[u8]], secs: u64) -> Result<Request<Bytes>, String> {
        let texts: Vec<Value> = segments
            .iter()
            .map(|s| json!({"Text": String::from_utf8_lossy(s)}))
            .collect();
        let body = json!({"LanguageCode": "en", "TextSegments": texts}).to_string();
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, self.conf.host.clone());
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-amz-json-1.1"),
        );
        headers.insert(
            "x-amz-target",
            HeaderValue::from_static("Comprehend_20171127.DetectToxicContent"),
        );
        let method = Method::POST;
        let mut signed = sigv4::Request {
            method: &method,
            path: "/",
            query: None,
            headers: &mut headers,
            body: body.as_bytes(),
        };
        sigv4::sign(&mut signed, &self.conf.creds, secs);
        if !self.conf.keepalive {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        let mut req = Request::post(&self.conf.uri)
            .body(Bytes::from(body))
            .map_err(|e| e.to_string())?;
        *req.headers_mut() = headers;
        Ok(req)
    }

    /// Scores one batch: the deny reason of a score over its threshold, or the error.
    async fn detect_batch(
        &self,
        segments: &[&[u8]],
        subject: &str,
    ) -> Result<Option<String>, String> {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let fail = |e: String| format!("failed to send request to {}: {e}", self.conf.endpoint);
        let req = self.request(segments, secs).map_err(fail)?;
        let resp = self
            .services
            .http()
            .send_verified(req, self.conf.timeout, self.conf.ssl_verify)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let body: Value = serde_json::from_slice(resp.body()).unwrap_or(Value::Null);
        let results = body
            .get("ResultList")
            .and_then(Value::as_array)
            .filter(|r| !r.is_empty())
            .ok_or("failed to get moderation results from response")?;
        for result in results {
            if !self.conf.categories.is_empty() {
                for label in result
                    .get("Labels")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let name = label.get("Name").and_then(Value::as_str).unwrap_or("");
                    let score = label.get("Score").and_then(Value::as_f64).unwrap_or(0.0);
                    if let Some((_, t)) = self.conf.categories.iter().find(|(n, _)| n == name) {
                        if score > *t {
                            return Ok(Some(format!("{subject} exceeds {name} threshold")));
                        }
                    }
                }
            }
            let toxicity = result
                .get("Toxicity")
                .and_then(Value::as_f64)
                .unwrap_or(0.0);
            if toxicity > self.conf.threshold {
                return Ok(Some(format!("{subject} exceeds toxicity threshold")));
            }
        }
        Ok(None)
    }

    /// Scores `content` in as few calls as its segments fit: the deny reason of the first
    /// score over its threshold, `None` when clean, or the service's error.
    async fn detect_toxic(
        &self,
        record: &LlmRecord,
        content: &str,
        subject: &str,
        limit: usize,
    ) -> Result<Option<String>, String> {
        let bytes = content.as_bytes();
        let mut cursor = 0;
        while cursor < bytes.len() {
            let (segments, next) = next_batch(bytes, cursor, limit);
            cursor = next;
            if let Some(reason) = self.detect_batch(&segments, subject).await? {
                set_risk_level(record, true);
                return Ok(Some(reason));
            }
        }
        set_risk_level(record, false);
        Ok(None)
    }

    /// Checks answer text: `Ok(Some(body))` is a refusal, `Err` the service's error.
    async fn moderate_response(
        &self,
        record: &LlmRecord,
        shape: &DenyShape,
        content: &str,
    ) -> Result<Option<String>, String> {
        if content.is_empty() {
            set_risk_level(record, false);
            return Ok(None);
        }
        match self
            .detect_toxic(record, content, "response body", self.conf.response_limit)
            .await
        {
            Err(e) => {
                tracing::error!("{e}");
                Err(e)
            }
            Ok(Some(reason)) => Ok(Some(
                shape.body(self.conf.deny_message.as_deref().unwrap_or(&reason)),
            )),
            Ok(None) => Ok(None),
        }
    }
}

fn deny_shape(req: &AiRequest, usage: Option<Value>) -> DenyShape {
    DenyShape {
        protocol: req.protocol,
        model: req
            .body
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_owned),
        usage,
        stream: req.stream,
    }
}

impl AwsContentModeration {
    async fn access_async(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let m = &self.0;
        let conf = &m.conf;
        let unsupported = |reason: &str, status: u16, body: &str| match conf
            .fail_mode
            .unsupported(NAME, reason, status, body)
        {
            Some(exit) => Flow::Exit(exit),
            None => Flow::Continue,
        };
        if ctx.get::<PickedInstance>().is_none() {
            return unsupported(
                "no ai instance picked (request did not pass through ai-proxy/ai-proxy-multi)",
                500,
                "no ai instance picked, ai-aws-content-moderation plugin must be used with ai-proxy or ai-proxy-multi plugin",
            );
        }
        if conf.check_response {
            let guard: Arc<dyn ResponseGuard> = m.clone();
            ResponseGuards::add(ctx, guard);
        }
        if !conf.check_request {
            tracing::info!("skip request check for this request");
            return Flow::Continue;
        }
        if let Some(ct) = ctx.header("content-type").map(str::to_ascii_lowercase) {
            if !ct.starts_with("application/json") {
                return unsupported(
                    &format!("unsupported content-type: {ct}"),
                    400,
                    &format!("unsupported content-type: {ct}, only application/json is supported"),
                );
            }
        }
        let (Some(req), Some(record)) = (
            ctx.get::<AiRequest>().cloned(),
            ctx.get::<Arc<LlmRecord>>().cloned(),
        ) else {
            return Flow::Continue;
        };
        let system = if conf.roles.system {
            guard::system_content(req.protocol, &req.body)
        } else {
            Some(Vec::new())
        };
        let turns = if conf.roles.has_turn_roles() {
            guard::turn_content(req.protocol, &req.body, conf.all, conf.roles)
        } else {
            Some(Vec::new())
        };
        let (Some(mut contents), Some(turns)) = (system, turns) else {
            return unsupported(
                "protocol cannot extract configured request_check_roles",
                500,
                &format!(
                    "protocol {} cannot moderate the configured request_check_roles",
                    req.protocol.name()
                ),
            );
        };
        contents.extend(turns);
        let content = contents.join(" ");
        if content.is_empty() {
            return Flow::Continue;
        }
        match m
            .detect_toxic(&record, &content, "request body", conf.request_limit)
            .await
        {
            Err(e) => {
                tracing::error!("{e}");
                Flow::Exit(ferrisix_plugin_api::Exit::body(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    e,
                ))
            }
            Ok(Some(reason)) => {
                let text = conf.deny_message.as_deref().unwrap_or(&reason);
                Flow::Exit(deny_shape(&req, None).request_exit(conf.deny_code, text))
            }
            Ok(None) => Flow::Continue,
        }
    }
}

impl Plugin for AwsContentModeration {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.access_async(ctx)))
    }
}

impl ResponseGuard for Moderator {
    fn check_answer<'a>(&'a self, answer: Answer<'a>) -> GuardFuture<'a, Option<(u16, String)>> {
        Box::pin(async move {
            let text = answer.text.unwrap_or("");
            match self
                .moderate_response(answer.record, answer.shape, text)
                .await
            {
                // The answer has not gone yet: fail closed, as the request side does.
                Err(e) => Some((500, e)),
                Ok(Some(body)) => Some((self.conf.deny_code, body)),
                Ok(None) => None,
            }
        })
    }

    fn stream(self: Arc<Self>, shape: DenyShape, record: Arc<LlmRecord>) -> Box<dyn StreamGuard> {
        Box::new(AwsStream {
            m: self,
            shape,
            record,
            moderated: false,
            scored: false,
            cache: String::new(),
            last_check: None,
        })
    }
}

/// The check of one streamed answer.
struct AwsStream {
    m: Arc<Moderator>,
    shape: DenyShape,
    record: Arc<LlmRecord>,
    /// `final_packet`: the assembled text was checked.
    moderated: bool,
    /// ... and Comprehend answered.
    scored: bool,
    /// `realtime`: the text not checked yet, and when the last batch was.
    cache: String,
    last_check: Option<Instant>,
}

impl StreamGuard for AwsStream {
    fn chunk<'a>(&'a mut self, chunk: &'a Chunk, body: Bytes) -> GuardFuture<'a, ChunkOut> {
        Box::pin(async move {
            let m = self.m.clone();
            let mut shape = self.shape.clone();
            shape.usage = self
                .record
                .read(|f| f.usage.as_ref().map(|u| u.raw.clone()));
            if !m.conf.realtime {
                // final_packet: the text is there once the stream is assembled; the events
                // before went as they were.
                let Some(text) = chunk.text.as_deref() else {
                    return ChunkOut::Send(body);
                };
                if !self.moderated {
                    self.moderated = true;
                    self.scored = m
                        .moderate_response(&self.record, &shape, text)
                        .await
                        .is_ok();
                }
                if !self.scored {
                    tracing::warn!(
                        "response was not scored, streaming without a risk_level annotation"
                    );
                }
                let level = self
                    .scored
                    .then(|| self.record.read(|f| f.risk_level.clone()))
                    .flatten();
                return match guard::annotate(
                    shape.protocol,
                    &body,
                    level.as_deref(),
                    chunk.done,
                    "",
                ) {
                    Some(b) => ChunkOut::Send(b),
                    None => ChunkOut::Send(body),
                };
            }
            self.cache.push_str(&chunk.texts);
            let now = Instant::now();
            let last = *self.last_check.get_or_insert(now);
            if self.cache.len() < m.conf.cache_size
                && now.duration_since(last) < m.conf.interval
                && !chunk.done
            {
                return ChunkOut::Send(body);
            }
            self.last_check = Some(now);
            let cache = std::mem::take(&mut self.cache);
            // The head is gone: a hit replaces the rest of the stream; an error lets it on.
            if let Ok(Some(deny)) = m.moderate_response(&self.record, &shape, &cache).await {
                return ChunkOut::End(Bytes::from(deny));
            }
            ChunkOut::Send(body)
        })
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;

    use super::*;

    #[test]
    fn segments_cut_on_characters_within_limits() {
        let text = "aé".repeat(10);
        let b = text.as_bytes();
        // "aé" is 3 bytes: a 4-byte segment must not split "é"
        let (segs, next) = next_batch(b, 0, 4);
        assert_eq!(segs.len(), 10);
        assert!(segs.iter().all(|s| std::str::from_utf8(s).is_ok()));
        assert_eq!(segs[0], "aéa".as_bytes());
        assert_eq!(segs.concat(), &b[..next], "nothing skipped");
        let long = "x".repeat(25_000);
        let (segs, next) = next_batch(long.as_bytes(), 0, 1024);
        assert_eq!(segs.len(), 9, "the call stays under its byte cap");
        assert_eq!(next, 9 * 1024);
        assert_eq!(segment_end(b"\xff\xff\xff\xff\xff", 0, 2), 2);
    }

    #[test]
    fn schema_rules() {
        let r = crate::PluginRegistry::builtin();
        let pre = "failed to check the configuration of plugin ai-aws-content-moderation err: ";
        let check = |conf: Value| r.check(NAME, &conf);
        let creds = json!({"access_key_id": "a", "secret_access_key": "s", "region": "us-east-1"});
        assert!(check(json!({"comprehend": creds})).is_ok());
        assert_eq!(
            check(json!({})).unwrap_err(),
            format!("{pre}property \"comprehend\" is required")
        );
        assert!(
            check(json!({"comprehend": creds, "moderation_categories": {"PROFANITY": 0.5}}))
                .is_ok()
        );
        assert!(
            check(json!({"comprehend": creds, "moderation_categories": {"OTHER": 0.5}})).is_err()
        );
        assert!(check(json!({"comprehend": creds, "moderation_threshold": 1.5})).is_err());
        assert!(check(json!({"comprehend": creds, "request_check_length_limit": 3})).is_err());
        assert!(check(json!({"comprehend": creds, "request_check_roles": []})).is_err());
        assert!(check(json!({"comprehend": creds, "deny_code": 600})).is_err());
        let mut bad = creds.clone();
        bad["endpoint"] = json!("ftp://x");
        assert!(check(json!({"comprehend": bad})).is_err());
        let info = r.get(NAME).unwrap();
        assert_eq!(info.priority, 1031);
    }
}
