//! The AI gateway's shared parts, split as APISIX splits them: [`provider`] (each
//! provider's host, paths and body rules: `ai-providers/`), [`protocol`] (the client
//! protocols, their detection, usage and text, and the Anthropic Messages <-> OpenAI chat
//! conversion: `ai-protocols/`) and [`call`] (the request to a provider and its answer
//! relayed: `ai-proxy/base.lua`, `ai-transport/`); here, what the AI plugins of one request
//! share: the request as read ([`AiRequest`]), the instance picked ([`PickedInstance`]),
//! ai-rate-limiting's budget check ([`Budget`]), what the call leaves for the log phase
//! ([`LlmRecord`], which the loggers read for `logging.summaries` and `logging.payloads`),
//! and what the guard plugins share ([`guard`]).

pub mod call;
pub mod guard;
pub mod protocol;
pub mod provider;
pub mod schema;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ferrisix_plugin_api::{BodyError, Exit, LateVarSource, LateVars, PluginCtx};
use http::{header, HeaderValue, StatusCode};
use serde_json::{json, Map, Value};

use protocol::{Protocol, Usage};

/// The request as ai-proxy or ai-proxy-multi read it in `access`.
#[derive(Clone, Debug)]
pub struct AiRequest {
    pub protocol: Protocol,
    pub body: Value,
    pub stream: bool,
}

/// The instance the request goes to (APISIX's `ctx.picked_ai_instance_name`):
/// `ai-proxy-<provider>` for ai-proxy, the instance's name for ai-proxy-multi; with what
/// decides its answer besides the request ([`call::Instance::identity`]: ai-cache's key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PickedInstance(pub String, pub Arc<Value>);

/// ai-rate-limiting's check of an instance's budget, which ai-proxy-multi asks before it
/// picks an instance (`fallback_strategy` `instance_health_and_rate_limiting`).
pub trait InstanceBudget: Send + Sync {
    /// Whether `instance` has budget left; sets the `X-AI-RateLimit-*` headers of it. A
    /// future: the budgets of the Redis policies are asked over the network.
    fn allows<'a>(
        &'a self,
        ctx: &'a mut PluginCtx<'_>,
        instance: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + 'a>>;
}

/// The request's [`InstanceBudget`], set by ai-rate-limiting in `rewrite`.
#[derive(Clone)]
pub struct Budget(pub Arc<dyn InstanceBudget>);

/// `logging` of ai-proxy and ai-proxy-multi.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Logging {
    pub summaries: bool,
    pub payloads: bool,
}

impl Logging {
    pub fn from_conf(conf: &Value) -> Logging {
        let flag = |k: &str| {
            conf.get("logging")
                .and_then(|l| l.get(k))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        };
        Logging {
            summaries: flag("summaries"),
            payloads: flag("payloads"),
        }
    }
}

/// What the call to the provider found, for the log phase.
#[derive(Clone, Debug, Default)]
pub struct LlmFields {
    /// The model the client asked for.
    pub request_model: Option<String>,
    /// The model sent to the provider.
    pub model: Option<String>,
    pub usage: Option<Usage>,
    pub stream: bool,
    pub tool_count: usize,
    /// `$llm_has_tool_calls`: the answer asked for a tool.
    pub has_tool_calls: bool,
    pub end_user_id: Option<String>,
    pub response_text: Option<String>,
    /// The client's conversation (`messages`, `input`).
    pub request_messages: Value,
    pub time_to_first_token: Option<Duration>,
    pub upstream_response_time: Option<Duration>,
    pub logging: Logging,
    /// `$llm_content_risk_level`, as the content moderation plugins judged.
    pub risk_level: Option<String>,
}

/// [`LlmFields`] of one request, filled as the answer goes by (a stream's usage comes last),
/// read in the log phase once the answer is over.
#[derive(Debug, Default)]
pub struct LlmRecord(Mutex<LlmFields>);

impl LlmRecord {
    pub fn update(&self, f: impl FnOnce(&mut LlmFields)) {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Reads the fields in place (the log phase's metrics need a few, not a copy).
    pub fn read<R>(&self, f: impl FnOnce(&LlmFields) -> R) -> R {
        f(&self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn get(&self) -> LlmFields {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The log entry's `llm_summary`, `llm_request` and `llm_response_text`, as
    /// `logging` asks.
    pub fn log_fields(&self) -> Vec<(&'static str, Value)> {
        let f = self.get();
        let mut out = Vec::new();
        let ms = |d: Option<Duration>| d.map(|d| json!(d.as_millis() as u64));
        if f.logging.summaries {
            let mut s = Map::new();
            let mut put = |k: &str, v: Option<Value>| {
                if let Some(v) = v {
                    s.insert(k.into(), v);
                }
            };
            put("request_model", f.request_model.clone().map(Value::String));
            put("model", f.model.clone().map(Value::String));
            put("duration", ms(f.time_to_first_token));
            let u = f.usage.clone().unwrap_or_default();
            put("prompt_tokens", Some(json!(u.prompt_tokens)));
            put("completion_tokens", Some(json!(u.completion_tokens)));
            put("total_tokens", Some(json!(u.total_tokens)));
            put("upstream_response_time", ms(f.upstream_response_time));
            put(
                "stream",
                Some(json!(if f.stream { "true" } else { "false" })),
            );
            put("tool_count", Some(json!(f.tool_count)));
            put(
                "has_tool_calls",
                Some(json!(if f.has_tool_calls { "true" } else { "false" })),
            );
            put("end_user_id", f.end_user_id.clone().map(Value::String));
            out.push(("llm_summary", Value::Object(s)));
        }
        if f.logging.payloads {
            out.push((
                "llm_request",
                json!({"messages": f.request_messages, "stream": f.stream}),
            ));
            let mut text = Map::new();
            if let Some(t) = f.response_text {
                text.insert("content".into(), Value::String(t));
            }
            out.push(("llm_response_text", Value::Object(text)));
        }
        out
    }
}

impl LlmFields {
    /// `$request_type`: `ai_stream` or `ai_chat`.
    pub fn request_type(&self) -> &'static str {
        if self.stream {
            "ai_stream"
        } else {
            "ai_chat"
        }
    }

    /// A count of the provider's usage object (`prompt_tokens_details.cached_tokens` of
    /// OpenAI, `cache_read_input_tokens` of Anthropic ...), 0 when it sent none.
    fn raw_usage(&self, paths: &[&[&str]]) -> u64 {
        let Some(raw) = self.usage.as_ref().map(|u| &u.raw) else {
            return 0;
        };
        paths
            .iter()
            .find_map(|path| {
                path.iter()
                    .try_fold(raw, |v, k| v.get(*k))
                    .and_then(Value::as_u64)
            })
            .unwrap_or(0)
    }
}

/// The `$llm_*` variables and `$request_type` ai-proxy sets (`ai-proxy/base.lua`,
/// `ai-providers/base.lua`), as the answer has filled them so far.
impl LateVars for LlmRecord {
    fn late_var(&self, name: &str) -> Option<String> {
        let f = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let ms = |d: Duration| (d.as_millis() as u64).to_string();
        let usage = f.usage.clone().unwrap_or_default();
        Some(match name {
            "request_type" => f.request_type().to_owned(),
            "request_llm_model" => f.request_model.clone().unwrap_or_default(),
            "llm_model" => f.model.clone().unwrap_or_default(),
            "llm_time_to_first_token" => ms(f.time_to_first_token?),
            // ai-proxy keeps it in milliseconds (nginx's own is in seconds).
            "apisix_upstream_response_time" => ms(f.upstream_response_time?),
            "llm_prompt_tokens" => usage.prompt_tokens.to_string(),
            "llm_completion_tokens" => usage.completion_tokens.to_string(),
            "llm_total_tokens" => usage.total_tokens.to_string(),
            "llm_stream" => f.stream.to_string(),
            "llm_tool_count" => f.tool_count.to_string(),
            "llm_has_tool_calls" => f.has_tool_calls.to_string(),
            "llm_end_user_id" => f.end_user_id.clone()?,
            "llm_content_risk_level" => f.risk_level.clone()?,
            "llm_cache_read_input_tokens" => f
                .raw_usage(&[
                    &["prompt_tokens_details", "cached_tokens"],
                    &["cache_read_input_tokens"],
                ])
                .to_string(),
            "llm_cache_creation_input_tokens" => f
                .raw_usage(&[
                    &["prompt_tokens_details", "cache_creation_input_tokens"],
                    &["cache_creation_input_tokens"],
                ])
                .to_string(),
            "llm_reasoning_tokens" => f
                .raw_usage(&[&["completion_tokens_details", "reasoning_tokens"]])
                .to_string(),
            _ => return None,
        })
    }
}

/// `{"message": text}`, as APISIX answers a table.
pub fn message_exit(status: StatusCode, text: &str) -> Exit {
    Exit::body(status, json!({ "message": text }).to_string()).with_header(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    )
}

/// The request body as JSON (`core.request.get_json_request_body_table`), or the 400 (413
/// past `max`) APISIX answers.
pub async fn json_body(ctx: &mut PluginCtx<'_>, max: usize) -> Result<(Value, Bytes), Exit> {
    let bytes = match ctx.read_body(max).await {
        Ok(b) => b.clone(),
        Err(BodyError::TooLarge(_)) => {
            return Err(message_exit(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("request size is greater than the maximum size {max} allowed"),
            ))
        }
        Err(e) => {
            return Err(message_exit(
                StatusCode::BAD_REQUEST,
                &format!("could not get body: {e}"),
            ))
        }
    };
    if bytes.is_empty() {
        return Err(message_exit(
            StatusCode::BAD_REQUEST,
            "could not get body: request body is empty",
        ));
    }
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(v) => Ok((v, bytes)),
        Err(e) => Err(message_exit(
            StatusCode::BAD_REQUEST,
            &format!("could not parse JSON request body: {e}"),
        )),
    }
}

/// ai-proxy's `detect_request_type`: a JSON body (by Content-Type, JSON when absent) of a
/// protocol APISIX knows.
pub async fn detect(ctx: &mut PluginCtx<'_>, max: usize) -> Result<AiRequest, Exit> {
    let ct = ctx.header("content-type").unwrap_or("application/json");
    if !ct.starts_with("application/json") {
        return Err(Exit::body(
            StatusCode::BAD_REQUEST,
            format!("unsupported content-type: {ct}, only application/json is supported"),
        ));
    }
    let (body, _) = json_body(ctx, max).await?;
    let protocol = Protocol::detect(&body, ctx.uri()).ok_or_else(|| {
        Exit::body(
            StatusCode::BAD_REQUEST,
            "no matching AI protocol for the request",
        )
    })?;
    Ok(AiRequest {
        stream: protocol.is_streaming(&body),
        protocol,
        body,
    })
}

/// Replaces the request body (APISIX's `ngx.req.set_body_data`), its length with it.
pub fn set_body(ctx: &mut PluginCtx<'_>, body: Bytes) {
    let len = HeaderValue::from(body.len());
    let headers = ctx.headers_mut();
    headers.remove(header::TRANSFER_ENCODING);
    headers.insert(header::CONTENT_LENGTH, len);
    ctx.replace_body(body);
}

/// ai-proxy's and ai-proxy-multi's `access`: the request read and detected, the record for
/// the log phase started.
pub async fn start(ctx: &mut PluginCtx<'_>, max_body: usize, logging: Logging) -> Result<(), Exit> {
    let req = detect(ctx, max_body).await?;
    let record = Arc::new(LlmRecord::default());
    record.update(|f| {
        f.request_model = req
            .body
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_owned);
        f.logging = logging;
        f.stream = req.stream;
    });
    ctx.insert(LateVarSource(record.clone()));
    ctx.insert(record);
    ctx.insert(req);
    Ok(())
}

/// A message of a prompt template or decoration: `role` and `content`.
pub fn prompt_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "role": {"type": "string", "enum": ["system", "user", "assistant"]},
            "content": {"type": "string", "minLength": 1}
        },
        "required": ["role", "content"]
    })
}
