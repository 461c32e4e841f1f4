//! ai-aliyun-content-moderation (`apisix/plugins/ai-aliyun-content-moderation.lua`): the text
//! of an AI request (the roles of `request_check_roles`, `request_check_mode`) and, with
//! `check_response`, of its answer goes to Aliyun's text moderation (`TextModerationPlus`,
//! an RPC call signed with HMAC-SHA1 over the sorted, percent-encoded parameters), cut into
//! pieces of the length limits; a `RiskLevel` at or over `risk_level_bar` refuses the request
//! or replaces the answer with a refusal in the client's protocol (the service's advice, or
//! `deny_message`). The service failing lets the content through, as APISIX does. A
//! streamed answer is checked in batches as it goes (`realtime`) or once assembled, its
//! last events annotated with `risk_level` (`final_packet`).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use bytes::Bytes;
use ferrisix_plugin_api::clock::CivilTime;
use ferrisix_plugin_api::{
    CompileCtx, Flow, KeepAlive, Phases, Plugin, PluginCtx, PluginDef, PluginServices, Step,
};
use http::{header, HeaderValue, Request};
use ring::hmac;
use serde_json::{json, Value};

use crate::support::ai::call::Endpoint;
use crate::support::ai::guard::{
    self, Answer, Chunk, ChunkOut, DenyShape, FailMode, GuardFuture, ResponseGuard, ResponseGuards,
    Roles, StreamGuard,
};
use crate::support::ai::{AiRequest, LlmRecord, PickedInstance};

pub const NAME: &str = "ai-aliyun-content-moderation";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &["access_key_secret"],
    ..PluginDef::new(NAME, 1029, schema, compile)
};

const DEFAULT_DENY: &str = "Your request violate our content policy.";

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "stream_check_mode": {
                "type": "string", "enum": ["realtime", "final_packet"], "default": "final_packet"
            },
            "stream_check_cache_size": {"type": "integer", "minimum": 1, "default": 128},
            "stream_check_interval": {"type": "number", "minimum": 0.1, "default": 3},
            "endpoint": {"type": "string", "minLength": 1},
            "region_id": {"type": "string", "minLength": 1},
            "access_key_id": {"type": "string", "minLength": 1},
            "access_key_secret": {"type": "string", "minLength": 1},
            "fail_mode": guard::fail_mode_schema(),
            "check_request": {"type": "boolean", "default": true},
            "check_response": {"type": "boolean", "default": false},
            "request_check_mode": {"type": "string", "enum": ["last", "all"], "default": "last"},
            "request_check_roles": {
                "type": "array",
                "items": {"type": "string", "enum": ["user", "tool", "system"]},
                "minItems": 1,
                "uniqueItems": true,
                "default": ["user"]
            },
            "request_check_service": {
                "type": "string", "minLength": 1, "default": "llm_query_moderation"
            },
            "request_check_length_limit": {"type": "integer", "minimum": 1, "default": 2000},
            "response_check_service": {
                "type": "string", "minLength": 1, "default": "llm_response_moderation"
            },
            "response_check_length_limit": {"type": "integer", "minimum": 1, "default": 5000},
            "risk_level_bar": {
                "type": "string", "enum": ["none", "low", "medium", "high", "max"],
                "default": "high"
            },
            "deny_code": {"type": "integer", "minimum": 200, "maximum": 599, "default": 200},
            "deny_message": {"type": "string"},
            "timeout": {"type": "integer", "minimum": 1, "default": 10000},
            "keepalive_pool": {"type": "integer", "minimum": 1, "default": 30},
            "keepalive": {"type": "boolean", "default": true},
            "keepalive_timeout": {"type": "integer", "minimum": 1000, "default": 60000},
            "ssl_verify": {"type": "boolean", "default": true}
        },
        "required": ["endpoint", "region_id", "access_key_id", "access_key_secret"]
    })
}

#[derive(Debug)]
struct Conf {
    /// `scheme://host:port/`: the calls go to the endpoint's root, as APISIX's do.
    uri: String,
    region_id: String,
    access_key_id: String,
    access_key_secret: String,
    fail_mode: FailMode,
    check_request: bool,
    check_response: bool,
    all: bool,
    roles: Roles,
    request_service: String,
    request_limit: usize,
    response_service: String,
    response_limit: usize,
    risk_bar: i32,
    deny_code: u16,
    deny_message: Option<String>,
    timeout: Duration,
    /// `keepalive*`: the connection kept for the next call (`None`: closed after it).
    keepalive: Option<KeepAlive>,
    ssl_verify: bool,
    realtime: bool,
    cache_size: usize,
    interval: Duration,
}

#[derive(Debug)]
struct Moderator {
    conf: Conf,
    services: Arc<PluginServices>,
}

#[derive(Debug)]
struct AliyunContentModeration(Arc<Moderator>);

fn risk_level_to_int(level: &str) -> i32 {
    match level {
        "max" => 4,
        "high" => 3,
        "medium" => 2,
        "low" => 1,
        "none" => 0,
        _ => -1,
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let text = |k: &str| conf.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let num = |k: &str, d: u64| conf.get(k).and_then(Value::as_u64).unwrap_or(d);
    let ep = Endpoint::parse(&text("endpoint")).ok_or("invalid endpoint")?;
    let host = if ep.host.contains(':') {
        format!("[{}]", ep.host)
    } else {
        ep.host.clone()
    };
    let conf = Conf {
        uri: format!("{}://{}:{}/", ep.scheme, host, ep.port),
        region_id: text("region_id"),
        access_key_id: text("access_key_id"),
        access_key_secret: text("access_key_secret"),
        fail_mode: FailMode::from_conf(&conf),
        check_request: conf.get("check_request").and_then(Value::as_bool) != Some(false),
        check_response: conf.get("check_response").and_then(Value::as_bool) == Some(true),
        all: conf.get("request_check_mode").and_then(Value::as_str) == Some("all"),
        roles: Roles::from_conf(&conf),
        request_service: text("request_check_service"),
        request_limit: num("request_check_length_limit", 2000) as usize,
        response_service: text("response_check_service"),
        response_limit: num("response_check_length_limit", 5000) as usize,
        risk_bar: risk_level_to_int(
            conf.get("risk_level_bar")
                .and_then(Value::as_str)
                .unwrap_or("high"),
        ),
        deny_code: num("deny_code", 200) as u16,
        deny_message: conf
            .get("deny_message")
            .and_then(Value::as_str)
            .map(str::to_owned),
        timeout: Duration::from_millis(num("timeout", 10000)),
        keepalive: conf.as_object().and_then(|c| KeepAlive::of_conf(c, 30)),
        ssl_verify: conf.get("ssl_verify").and_then(Value::as_bool) != Some(false),
        realtime: conf.get("stream_check_mode").and_then(Value::as_str) == Some("realtime"),
        cache_size: num("stream_check_cache_size", 128) as usize,
        interval: Duration::from_secs_f64(
            conf.get("stream_check_interval")
                .and_then(Value::as_f64)
                .unwrap_or(3.0),
        ),
    };
    Ok(Arc::new(AliyunContentModeration(Arc::new(Moderator {
        conf,
        services: cx.services.clone(),
    }))))
}

/// Aliyun's percent-encoding (RFC 3986): everything but `A-Z a-z 0-9 - _ . ~`.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The string an RPC call signs: the method, `/`, and the `name=value` pairs (encoded)
/// sorted and joined, each part encoded once more.
pub fn string_to_sign(method: &str, params: &[(&str, String)]) -> String {
    let mut pairs: Vec<String> = params
        .iter()
        .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
        .collect();
    pairs.sort();
    format!("{method}&%2F&{}", percent_encode(&pairs.join("&")))
}

/// The `Signature`: HMAC-SHA1 keyed by the secret and `&`, in base64.
pub fn sign(secret: &str, string_to_sign: &str) -> String {
    let key = hmac::Key::new(
        hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        format!("{secret}&").as_bytes(),
    );
    base64::engine::general_purpose::STANDARD.encode(hmac::sign(&key, string_to_sign.as_bytes()))
}

/// `2006-01-02T15:04:05Z` of `secs`.
fn timestamp(secs: u64) -> String {
    let t = CivilTime::from_unix_secs(secs);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

/// What one piece's check found.
enum Verdict {
    /// Under the bar (or nothing to check).
    Pass,
    /// At or over it, with the service's advice.
    Hit(Option<String>),
}

impl Moderator {
    /// The signed form of a check of `content` with `service`.
    fn form(&self, session: &str, content: &str, service: &str, secs: u64) -> String {
        let c = &self.conf;
        let mut params: Vec<(&str, String)> = vec![
            ("AccessKeyId", c.access_key_id.clone()),
            ("Action", "TextModerationPlus".into()),
            ("Format", "JSON".into()),
            ("RegionId", c.region_id.clone()),
            ("Service", service.to_owned()),
            (
                "ServiceParameters",
                json!({"sessionId": session, "content": content}).to_string(),
            ),
            ("SignatureMethod", "HMAC-SHA1".into()),
            ("SignatureNonce", guard::uuid_v4()),
            ("SignatureVersion", "1.0".into()),
            ("Timestamp", timestamp(secs)),
            ("Version", "2022-03-02".into()),
        ];
        let signature = sign(&c.access_key_secret, &string_to_sign("POST", &params));
        params.push(("Signature", signature));
        params
            .iter()
            .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
            .collect::<Vec<_>>()
            .join("&")
    }

    /// `check_single_content`.
    async fn check_single(
        &self,
        record: &LlmRecord,
        session: &str,
        content: &str,
        service: &str,
    ) -> Result<Verdict, String> {
        if content.trim().is_empty() {
            return Ok(Verdict::Pass);
        }
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut req = Request::post(&self.conf.uri)
            .body(Bytes::from(self.form(session, content, service, secs)))
            .map_err(|e| format!("failed to request: {e}"))?;
        req.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        if self.conf.keepalive.is_none() {
            req.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        let resp = self
            .services
            .http()
            .send_kept(
                req,
                self.conf.timeout,
                self.conf.ssl_verify,
                self.conf.keepalive,
            )
            .await
            .map_err(|e| format!("failed to request: {e}"))?;
        let request_id = resp
            .headers()
            .get("x-acs-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let raw = String::from_utf8_lossy(resp.body()).into_owned();
        if resp.status().as_u16() != 200 {
            return Err(format!(
                "failed to request aliyun text moderation service, status: {}, x-acs-request-id: {request_id}, body: {raw}",
                resp.status().as_u16()
            ));
        }
        let answer: Value = serde_json::from_str(&raw).map_err(|e| {
            format!(
                "failed to decode response, , x-acs-request-id: {request_id}, err{e}, body: {raw}"
            )
        })?;
        let data = answer.get("Data");
        let level = data
            .and_then(|d| d.get("RiskLevel"))
            .and_then(Value::as_str)
            .ok_or_else(|| format!("failed to get risk level: {raw}"))?;
        record.update(|f| f.risk_level = Some(level.to_owned()));
        if risk_level_to_int(level) < self.conf.risk_bar {
            return Ok(Verdict::Pass);
        }
        Ok(Verdict::Hit(
            data.and_then(|d| d.get("Advice"))
                .and_then(|a| a.get(0))
                .and_then(|a| a.get("Answer"))
                .and_then(Value::as_str)
                .map(str::to_owned),
        ))
    }

    /// `content_moderation`: `content` checked whole when it fits `limit` bytes, else in
    /// pieces of `limit` characters; the refusal of the first hit. A failed check is logged
    /// and the content let through.
    async fn moderate(
        &self,
        record: &LlmRecord,
        shape: &DenyShape,
        session: &str,
        content: &str,
        limit: usize,
        service: &str,
    ) -> Option<(u16, String)> {
        if content.is_empty() {
            return None;
        }
        let pieces = if content.len() <= limit {
            vec![content]
        } else {
            guard::char_pieces(content, limit)
        };
        for piece in pieces {
            match self.check_single(record, session, piece, service).await {
                Ok(Verdict::Hit(advice)) => {
                    let text = self
                        .conf
                        .deny_message
                        .clone()
                        .or(advice)
                        .unwrap_or_else(|| DEFAULT_DENY.to_owned());
                    return Some((self.conf.deny_code, shape.body(&text)));
                }
                Ok(Verdict::Pass) => {}
                Err(e) => tracing::error!("failed to check content: {e}"),
            }
        }
        None
    }
}

/// The checks of one request's answer: the conf's client and the request's session.
struct RequestGuard {
    m: Arc<Moderator>,
    session: String,
}

impl AliyunContentModeration {
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
                "no ai instance picked, ai-aliyun-content-moderation plugin must be used with ai-proxy or ai-proxy-multi plugin",
            );
        }
        // One session id for every check of the request, the answer's too.
        let session = guard::uuid_v4();
        if conf.check_response {
            let g: Arc<dyn ResponseGuard> = Arc::new(RequestGuard {
                m: m.clone(),
                session: session.clone(),
            });
            ResponseGuards::add(ctx, g);
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
        let turn_roles = Roles {
            system: false,
            assistant: false,
            ..conf.roles
        };
        let turns = if turn_roles.user || turn_roles.tool {
            guard::turn_content(req.protocol, &req.body, conf.all, turn_roles)
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
        let shape = DenyShape {
            protocol: req.protocol,
            model: req
                .body
                .get("model")
                .and_then(Value::as_str)
                .map(str::to_owned),
            usage: None,
            stream: req.stream,
        };
        match m
            .moderate(
                &record,
                &shape,
                &session,
                &content,
                conf.request_limit,
                &conf.request_service,
            )
            .await
        {
            Some((code, body)) => {
                let ct = if req.stream {
                    "text/event-stream"
                } else {
                    "application/json"
                };
                Flow::Exit(
                    ferrisix_plugin_api::Exit::body(
                        http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::OK),
                        body,
                    )
                    .with_header(header::CONTENT_TYPE, HeaderValue::from_static(ct)),
                )
            }
            None => Flow::Continue,
        }
    }
}

impl Plugin for AliyunContentModeration {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.access_async(ctx)))
    }
}

impl ResponseGuard for RequestGuard {
    fn check_answer<'a>(&'a self, answer: Answer<'a>) -> GuardFuture<'a, Option<(u16, String)>> {
        Box::pin(async move {
            let c = &self.m.conf;
            self.m
                .moderate(
                    answer.record,
                    answer.shape,
                    &self.session,
                    answer.text.unwrap_or(""),
                    c.response_limit,
                    &c.response_service,
                )
                .await
        })
    }

    fn stream(self: Arc<Self>, shape: DenyShape, record: Arc<LlmRecord>) -> Box<dyn StreamGuard> {
        Box::new(AliyunStream {
            g: self,
            shape,
            record,
            moderated: false,
            cache: String::new(),
            last_check: None,
        })
    }
}

/// The check of one streamed answer.
struct AliyunStream {
    g: Arc<RequestGuard>,
    shape: DenyShape,
    record: Arc<LlmRecord>,
    moderated: bool,
    cache: String,
    last_check: Option<Instant>,
}

impl StreamGuard for AliyunStream {
    fn chunk<'a>(&'a mut self, chunk: &'a Chunk, body: Bytes) -> GuardFuture<'a, ChunkOut> {
        Box::pin(async move {
            let g = self.g.clone();
            let c = &g.m.conf;
            let mut shape = self.shape.clone();
            shape.usage = self
                .record
                .read(|f| f.usage.as_ref().map(|u| u.raw.clone()));
            if !c.realtime {
                let Some(text) = chunk.text.as_deref() else {
                    return ChunkOut::Send(body);
                };
                if !self.moderated {
                    self.moderated = true;
                    // final_packet only reports the verdict: the answer went already.
                    let _ =
                        g.m.moderate(
                            &self.record,
                            &shape,
                            &g.session,
                            text,
                            c.response_limit,
                            &c.response_service,
                        )
                        .await;
                }
                let level = self.record.read(|f| f.risk_level.clone());
                return match guard::annotate(
                    shape.protocol,
                    &body,
                    level.as_deref(),
                    chunk.done,
                    "\n",
                ) {
                    Some(b) => ChunkOut::Send(b),
                    None => ChunkOut::Send(body),
                };
            }
            self.cache.push_str(&chunk.texts);
            let now = Instant::now();
            let last = *self.last_check.get_or_insert(now);
            if self.cache.len() < c.cache_size
                && now.duration_since(last) < c.interval
                && !chunk.done
            {
                return ChunkOut::Send(body);
            }
            self.last_check = Some(now);
            let cache = std::mem::take(&mut self.cache);
            if let Some((_, deny)) =
                g.m.moderate(
                    &self.record,
                    &shape,
                    &g.session,
                    &cache,
                    c.response_limit,
                    &c.response_service,
                )
                .await
            {
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

    /// The example of Alibaba Cloud's RPC signature documentation (signature version 1.0):
    /// `DescribeRegions` signed with the secret `testsecret`.
    #[test]
    fn published_signature_example() {
        let params: Vec<(&str, String)> = vec![
            ("AccessKeyId", "testid".into()),
            ("Action", "DescribeRegions".into()),
            ("Format", "XML".into()),
            ("SignatureMethod", "HMAC-SHA1".into()),
            (
                "SignatureNonce",
                "3ee8c1b8-83d3-44af-a94f-4e0ad82fd6cf".into(),
            ),
            ("SignatureVersion", "1.0".into()),
            ("Timestamp", "2016-02-23T12:46:24Z".into()),
            ("Version", "2014-05-26".into()),
        ];
        let sts = string_to_sign("GET", &params);
        assert_eq!(
            sts,
            "GET&%2F&AccessKeyId%3Dtestid%26Action%3DDescribeRegions%26Format%3DXML%26SignatureMethod%3DHMAC-SHA1%26SignatureNonce%3D3ee8c1b8-83d3-44af-a94f-4e0ad82fd6cf%26SignatureVersion%3D1.0%26Timestamp%3D2016-02-23T12%253A46%253A24Z%26Version%3D2014-05-26"
        );
        assert_eq!(sign("testsecret", &sts), "OLeaidS1JvxuMvnyHOwuJ+uX5qY=");
    }

    #[test]
    fn encoding_and_levels() {
        assert_eq!(percent_encode("a b*(!)'~"), "a%20b%2A%28%21%29%27~");
        assert_eq!(percent_encode("é"), "%C3%A9");
        assert!(risk_level_to_int("max") > risk_level_to_int("high"));
        assert_eq!(risk_level_to_int("other"), -1);
        assert_eq!(timestamp(1_456_231_584), "2016-02-23T12:46:24Z");
    }

    #[test]
    fn schema_rules() {
        let r = crate::PluginRegistry::builtin();
        let pre = "failed to check the configuration of plugin ai-aliyun-content-moderation err: ";
        let base = json!({"endpoint": "https://green.example.com", "region_id": "cn-shanghai",
            "access_key_id": "id", "access_key_secret": "secret"});
        assert!(r.check(NAME, &base).is_ok());
        assert_eq!(
            r.check(
                NAME,
                &json!({"region_id": "r", "access_key_id": "i", "access_key_secret": "s"})
            )
            .unwrap_err(),
            format!("{pre}property \"endpoint\" is required")
        );
        let with = |k: &str, v: Value| {
            let mut c = base.clone();
            c[k] = v;
            r.check(NAME, &c)
        };
        assert!(with("risk_level_bar", json!("extreme")).is_err());
        assert!(with("request_check_roles", json!(["assistant"])).is_err());
        assert!(with("stream_check_interval", json!(0.05)).is_err());
        assert!(with("deny_code", json!(199)).is_err());
        assert!(with("fail_mode", json!("error")).is_ok());
        assert_eq!(r.get(NAME).unwrap().priority, 1029);
    }
}
