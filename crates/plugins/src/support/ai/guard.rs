//! What the AI guard plugins share (ai-aws-content-moderation, ai-aliyun-content-moderation,
//! ai-lakera-guard), as APISIX's `ai-protocols/` gives it to them: the text of a request by
//! role (`extract_system_content`, `extract_turn_content`, `get_messages`,
//! `extract_request_content`), the refusal in the client's protocol (`build_deny_response`),
//! `fail_mode` (`ai-protocols/binding.lua`), and the hooks through which a guard sees the
//! answer (APISIX's `lua_body_filter`, run by ai-proxy on the answer): [`ResponseGuard`]s set
//! in `access` are asked by `call::call` about a complete answer, and their
//! [`StreamGuard`]s about each chunk of a streamed one.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use ferrisix_plugin_api::{Exit, PluginCtx};
use http::{header, HeaderValue, StatusCode};
use rand::RngCore;
use serde_json::{json, Map, Value};

use super::protocol::{Protocol, SseEvent, SseParser};
use super::LlmRecord;

/// `binding.schema_property("skip")`.
pub fn fail_mode_schema() -> Value {
    json!({"type": "string", "enum": ["skip", "warn", "error"], "default": "skip"})
}

/// What a guard does with a request it cannot check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailMode {
    Skip,
    Warn,
    Error,
}

impl FailMode {
    pub fn from_conf(conf: &Value) -> FailMode {
        match conf.get("fail_mode").and_then(Value::as_str) {
            Some("warn") => FailMode::Warn,
            Some("error") => FailMode::Error,
            _ => FailMode::Skip,
        }
    }

    /// `binding.on_unsupported`: `error` refuses with `status` and `body`; `skip` and `warn`
    /// let the request through (logged at info or warn).
    pub fn unsupported(self, plugin: &str, reason: &str, status: u16, body: &str) -> Option<Exit> {
        if self == FailMode::Error {
            return Some(Exit::body(
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                body.to_owned(),
            ));
        }
        // The reason may carry the client's Content-Type: no control characters, and short.
        let mut safe: String = reason
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        if safe.len() > 256 {
            let mut cut = 256;
            while !safe.is_char_boundary(cut) {
                cut -= 1;
            }
            safe.truncate(cut);
        }
        if self == FailMode::Warn {
            tracing::warn!("{plugin} skipped: {safe}");
        } else {
            tracing::info!("{plugin} skipped: {safe}");
        }
        None
    }
}

/// `request_check_roles` as a set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Roles {
    pub system: bool,
    pub user: bool,
    pub tool: bool,
    pub assistant: bool,
}

impl Roles {
    pub fn from_conf(conf: &Value) -> Roles {
        let mut r = Roles::default();
        for role in conf
            .get("request_check_roles")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            match role {
                "system" => r.system = true,
                "user" => r.user = true,
                "tool" => r.tool = true,
                "assistant" => r.assistant = true,
                _ => {}
            }
        }
        r
    }

    pub fn has_turn_roles(self) -> bool {
        self.user || self.tool || self.assistant
    }

    fn turn(self, role: &str) -> bool {
        match role {
            "user" => self.user,
            "tool" => self.tool,
            "assistant" => self.assistant,
            _ => false,
        }
    }
}

/// A chat message's or Anthropic message's text: the string, or its `type: text` parts.
fn message_text(out: &mut Vec<String>, message: &Value) {
    match message.get("content") {
        Some(Value::String(s)) => out.push(s.clone()),
        Some(Value::Array(parts)) => out.extend(
            parts
                .iter()
                .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .map(str::to_owned),
        ),
        _ => {}
    }
}

/// Bedrock content blocks' `text`.
fn block_texts(out: &mut Vec<String>, blocks: Option<&Value>) {
    out.extend(
        blocks
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .map(str::to_owned),
    );
}

/// A Responses API input item's text (a string, its content, its text, a tool's output).
fn item_text(out: &mut Vec<String>, item: &Value) {
    match item {
        Value::String(s) => out.push(s.clone()),
        Value::Object(o) => match o.get("content") {
            Some(Value::String(s)) => out.push(s.clone()),
            Some(Value::Array(parts)) => out.extend(
                parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .map(str::to_owned),
            ),
            Some(_) => {}
            None => match (o.get("text"), o.get("output")) {
                (Some(Value::String(t)), _) => out.push(t.clone()),
                (_, Some(Value::String(t))) => out.push(t.clone()),
                (_, Some(Value::Array(parts))) => out.extend(
                    parts
                        .iter()
                        .filter_map(|p| p.get("text").and_then(Value::as_str))
                        .map(str::to_owned),
                ),
                _ => {}
            },
        },
        _ => {}
    }
}

fn is_system(role: Option<&str>) -> bool {
    matches!(role, Some("system" | "developer"))
}

/// `extract_system_content`: the system prompt's texts, `None` for a protocol without it.
pub fn system_content(p: Protocol, body: &Value) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let messages = body.get("messages").and_then(Value::as_array);
    match p {
        Protocol::OpenAiChat => {
            for m in messages.into_iter().flatten() {
                if is_system(m.get("role").and_then(Value::as_str)) {
                    message_text(&mut out, m);
                }
            }
        }
        Protocol::AnthropicMessages => match body.get("system") {
            Some(Value::String(s)) => out.push(s.clone()),
            Some(Value::Array(blocks)) => out.extend(
                blocks
                    .iter()
                    .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                    .filter_map(|b| b.get("text").and_then(Value::as_str))
                    .map(str::to_owned),
            ),
            _ => {}
        },
        Protocol::OpenAiResponses => {
            if let Some(s) = body.get("instructions").and_then(Value::as_str) {
                out.push(s.to_owned());
            }
            for item in body
                .get("input")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if is_system(item.get("role").and_then(Value::as_str)) {
                    item_text(&mut out, item);
                }
            }
        }
        Protocol::BedrockConverse => block_texts(&mut out, body.get("system")),
        Protocol::OpenAiEmbeddings => {}
        Protocol::Passthrough => return None,
    }
    Some(out)
}

/// The index the turns start at: 0 for `all`, else the first of the last run of messages
/// whose role is selected (`None`: the last message is of no selected role).
fn turn_start<T>(items: &[T], all: bool, selected: impl Fn(&T) -> bool) -> Option<usize> {
    if all {
        return Some(0);
    }
    let mut start = None;
    for (i, item) in items.iter().enumerate().rev() {
        if selected(item) {
            start = Some(i);
        } else {
            break;
        }
    }
    start
}

/// `extract_turn_content`: the texts of the selected turn roles, every message (`all`) or
/// the latest run of them; `None` for a protocol without it.
pub fn turn_content(p: Protocol, body: &Value, all: bool, roles: Roles) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let role_of = |m: &Value| {
        m.get("role")
            .and_then(Value::as_str)
            .is_some_and(|r| roles.turn(r))
    };
    match p {
        Protocol::OpenAiChat | Protocol::AnthropicMessages | Protocol::BedrockConverse => {
            let Some(messages) = body.get("messages").and_then(Value::as_array) else {
                return Some(out);
            };
            let Some(start) = turn_start(messages, all, |m| role_of(m)) else {
                return Some(out);
            };
            for m in &messages[start..] {
                if role_of(m) {
                    if p == Protocol::BedrockConverse {
                        block_texts(&mut out, m.get("content"));
                    } else {
                        message_text(&mut out, m);
                    }
                }
            }
        }
        Protocol::OpenAiResponses => {
            let matches = |item: &Value| match item {
                Value::String(_) => roles.user,
                Value::Object(o) => match o.get("role") {
                    Some(r) => r.as_str().is_some_and(|r| roles.turn(r)),
                    None => {
                        roles.tool
                            && o.get("type").and_then(Value::as_str) == Some("function_call_output")
                    }
                },
                _ => false,
            };
            match body.get("input") {
                Some(Value::String(s)) if roles.user => out.push(s.clone()),
                Some(Value::Array(items)) => {
                    if let Some(start) = turn_start(items, all, |i| matches(i)) {
                        for item in &items[start..] {
                            if matches(item) {
                                item_text(&mut out, item);
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        Protocol::OpenAiEmbeddings => {
            if roles.user {
                out = request_content(p, body);
            }
        }
        Protocol::Passthrough => return None,
    }
    Some(out)
}

/// `extract_request_content`: every text of the request.
pub fn request_content(p: Protocol, body: &Value) -> Vec<String> {
    let mut out = Vec::new();
    match p {
        Protocol::OpenAiChat | Protocol::AnthropicMessages => {
            for m in body
                .get("messages")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                message_text(&mut out, m);
            }
        }
        Protocol::OpenAiResponses => {
            match body.get("input") {
                Some(Value::String(s)) => out.push(s.clone()),
                Some(Value::Array(items)) => items.iter().for_each(|i| item_text(&mut out, i)),
                _ => {}
            }
            if let Some(s) = body.get("instructions").and_then(Value::as_str) {
                out.push(s.to_owned());
            }
        }
        Protocol::BedrockConverse => {
            block_texts(&mut out, body.get("system"));
            for m in body
                .get("messages")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                block_texts(&mut out, m.get("content"));
            }
        }
        Protocol::OpenAiEmbeddings => match body.get("input") {
            Some(Value::String(s)) => out.push(s.clone()),
            Some(Value::Array(items)) => {
                out.extend(items.iter().filter_map(Value::as_str).map(str::to_owned))
            }
            _ => {}
        },
        Protocol::Passthrough => {}
    }
    out
}

/// `get_messages`: the conversation as (role, text), messages without text left out.
pub fn messages(p: Protocol, body: &Value) -> Vec<(Option<String>, String)> {
    let mut out = Vec::new();
    let role = |m: &Value| m.get("role").and_then(Value::as_str).map(str::to_owned);
    match p {
        Protocol::OpenAiChat | Protocol::AnthropicMessages => {
            if p == Protocol::AnthropicMessages {
                if let Some(s) = body.get("system").and_then(Value::as_str) {
                    out.push((Some("system".into()), s.to_owned()));
                }
            }
            for m in body
                .get("messages")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let mut texts = Vec::new();
                message_text(&mut texts, m);
                if !texts.is_empty() {
                    out.push((role(m), texts.join(" ")));
                }
            }
        }
        Protocol::OpenAiResponses => {
            if let Some(s) = body.get("instructions").and_then(Value::as_str) {
                out.push((Some("system".into()), s.to_owned()));
            }
            match body.get("input") {
                Some(Value::String(s)) => out.push((Some("user".into()), s.clone())),
                Some(Value::Array(items)) => {
                    for item in items {
                        let r = item
                            .get("role")
                            .and_then(Value::as_str)
                            .unwrap_or("user")
                            .to_owned();
                        let mut texts = Vec::new();
                        item_text(&mut texts, item);
                        if !texts.is_empty() {
                            out.push((Some(r), texts.join(" ")));
                        }
                    }
                }
                _ => {}
            }
        }
        Protocol::BedrockConverse => {
            let mut system = Vec::new();
            block_texts(&mut system, body.get("system"));
            if !system.is_empty() {
                out.push((Some("system".into()), system.join(" ")));
            }
            for m in body
                .get("messages")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let mut texts = Vec::new();
                block_texts(&mut texts, m.get("content"));
                if !texts.is_empty() {
                    out.push((role(m), texts.join(" ")));
                }
            }
        }
        Protocol::OpenAiEmbeddings => {
            if let Some(s) = body.get("input").and_then(Value::as_str) {
                out.push((Some("user".into()), s.to_owned()));
            }
        }
        Protocol::Passthrough => {}
    }
    out
}

/// A v4 UUID, the id of a refusal.
pub fn uuid_v4() -> String {
    let mut b = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// `empty_usage`: the protocol's usage object with nothing counted.
pub fn empty_usage(p: Protocol) -> Value {
    match p {
        Protocol::AnthropicMessages => json!({"input_tokens": 0, "output_tokens": 0}),
        Protocol::OpenAiResponses => {
            json!({"input_tokens": 0, "output_tokens": 0, "total_tokens": 0})
        }
        Protocol::BedrockConverse => {
            json!({"inputTokens": 0, "outputTokens": 0, "totalTokens": 0})
        }
        _ => json!({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}),
    }
}

/// `sse.encode` of one event.
fn sse_event(kind: &str, data: &str) -> String {
    let mut parts = Vec::new();
    if kind != "message" {
        parts.push(format!("event: {kind}"));
    }
    for line in data.split('\n') {
        parts.push(format!("data: {line}"));
    }
    parts.join("\n") + "\n\n"
}

/// What a refusal is built from: the client's protocol, the model it asked for, the usage
/// (the answer's once there is one, else the protocol's empty one), streamed or not.
#[derive(Clone, Debug)]
pub struct DenyShape {
    pub protocol: Protocol,
    pub model: Option<String>,
    pub usage: Option<Value>,
    pub stream: bool,
}

fn put_model(obj: &mut Map<String, Value>, model: &Option<String>) {
    if let Some(m) = model {
        obj.insert("model".into(), Value::String(m.clone()));
    }
}

impl DenyShape {
    /// `build_deny_response`: `text` as an answer of the client's protocol.
    pub fn body(&self, text: &str) -> String {
        let usage = self
            .usage
            .clone()
            .unwrap_or_else(|| empty_usage(self.protocol));
        let model = &self.model;
        match self.protocol {
            Protocol::OpenAiChat => {
                let mut obj = Map::new();
                obj.insert("id".into(), json!(uuid_v4()));
                if self.stream {
                    obj.insert("object".into(), json!("chat.completion.chunk"));
                    put_model(&mut obj, model);
                    obj.insert(
                        "choices".into(),
                        json!([{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}]),
                    );
                    obj.insert("usage".into(), usage);
                    format!("data: {}\n\ndata: [DONE]", Value::Object(obj))
                } else {
                    obj.insert("object".into(), json!("chat.completion"));
                    put_model(&mut obj, model);
                    obj.insert(
                        "choices".into(),
                        json!([{"index": 0, "message": {"role": "assistant", "content": text},
                                "finish_reason": "stop"}]),
                    );
                    obj.insert("usage".into(), usage);
                    Value::Object(obj).to_string()
                }
            }
            Protocol::AnthropicMessages => {
                let id = uuid_v4();
                if self.stream {
                    let mut message = Map::new();
                    message.insert("id".into(), json!(id));
                    message.insert("type".into(), json!("message"));
                    message.insert("role".into(), json!("assistant"));
                    put_model(&mut message, model);
                    message.insert("content".into(), json!([]));
                    message.insert("usage".into(), usage.clone());
                    [
                        sse_event(
                            "message_start",
                            &json!({"type": "message_start", "message": message}).to_string(),
                        ),
                        sse_event(
                            "content_block_start",
                            &json!({"type": "content_block_start", "index": 0,
                                    "content_block": {"type": "text", "text": ""}})
                            .to_string(),
                        ),
                        sse_event(
                            "content_block_delta",
                            &json!({"type": "content_block_delta", "index": 0,
                                    "delta": {"type": "text_delta", "text": text}})
                            .to_string(),
                        ),
                        sse_event(
                            "content_block_stop",
                            &json!({"type": "content_block_stop", "index": 0}).to_string(),
                        ),
                        sse_event(
                            "message_delta",
                            &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                    "usage": usage})
                            .to_string(),
                        ),
                        sse_event("message_stop", "{}"),
                    ]
                    .concat()
                } else {
                    let mut obj = Map::new();
                    obj.insert("id".into(), json!(id));
                    obj.insert("type".into(), json!("message"));
                    obj.insert("role".into(), json!("assistant"));
                    put_model(&mut obj, model);
                    obj.insert("content".into(), json!([{"type": "text", "text": text}]));
                    obj.insert("stop_reason".into(), json!("end_turn"));
                    obj.insert("usage".into(), usage);
                    Value::Object(obj).to_string()
                }
            }
            Protocol::OpenAiResponses => {
                let mut obj = Map::new();
                obj.insert("id".into(), json!(uuid_v4()));
                obj.insert("object".into(), json!("response"));
                obj.insert("status".into(), json!("completed"));
                put_model(&mut obj, model);
                obj.insert(
                    "output".into(),
                    json!([{"type": "message", "role": "assistant",
                            "content": [{"type": "output_text", "text": text}]}]),
                );
                obj.insert("usage".into(), usage);
                let response = Value::Object(obj);
                if self.stream {
                    format!(
                        "event: response.output_text.delta\ndata: {}\n\nevent: response.completed\ndata: {}\n\n",
                        json!({"type": "response.output_text.delta", "delta": text}),
                        json!({"type": "response.completed", "response": response})
                    )
                } else {
                    response.to_string()
                }
            }
            Protocol::BedrockConverse => json!({
                "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
                "stopReason": "end_turn",
                "usage": usage,
            })
            .to_string(),
            Protocol::OpenAiEmbeddings => {
                json!({"error": {"message": text, "type": "content_policy_violation"}}).to_string()
            }
            Protocol::Passthrough => String::new(),
        }
    }

    /// A refusal of the request: `status`, the body, and the Content-Type of the protocol's
    /// answers (server-sent events for a stream).
    pub fn request_exit(&self, status: u16, text: &str) -> Exit {
        let ct = if self.stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        Exit::body(
            StatusCode::from_u16(status).unwrap_or(StatusCode::OK),
            self.body(text),
        )
        .with_header(header::CONTENT_TYPE, HeaderValue::from_static(ct))
    }
}

/// A future of a guard's check.
pub type GuardFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A complete (not streamed) answer, as the guards see it.
pub struct Answer<'a> {
    /// `llm_response_text`.
    pub text: Option<&'a str>,
    pub shape: &'a DenyShape,
    pub record: &'a LlmRecord,
}

/// A guard's check of the answer (APISIX's `lua_body_filter` of the guard plugins), set on
/// the request in `access`.
pub trait ResponseGuard: Send + Sync {
    /// A complete answer: `Some((status, body))` replaces it.
    fn check_answer<'a>(&'a self, answer: Answer<'a>) -> GuardFuture<'a, Option<(u16, String)>>;

    /// The check of a streamed answer, made for each stream.
    fn stream(self: Arc<Self>, shape: DenyShape, record: Arc<LlmRecord>) -> Box<dyn StreamGuard>;
}

/// The request's guards, in their plugins' order.
#[derive(Clone, Default)]
pub struct ResponseGuards(pub Vec<Arc<dyn ResponseGuard>>);

impl ResponseGuards {
    /// Adds `guard` to the request's list (made on the first).
    pub fn add(ctx: &mut PluginCtx<'_>, guard: Arc<dyn ResponseGuard>) {
        match ctx.get_mut::<ResponseGuards>() {
            Some(list) => list.0.push(guard),
            None => ctx.insert(ResponseGuards(vec![guard])),
        }
    }
}

impl fmt::Debug for ResponseGuards {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ResponseGuards({})", self.0.len())
    }
}

/// One chunk of a streamed answer on its way to the client.
#[derive(Clone, Debug, Default)]
pub struct Chunk {
    /// The texts the upstream chunk this chunk came from carried
    /// (`llm_response_contents_in_chunk`); empty on the further chunks of a converted one.
    pub texts: String,
    /// `llm_response_text`: the whole answer's text, once its usage came.
    pub text: Option<String>,
    /// `llm_request_done`: the stream's end was seen.
    pub done: bool,
}

/// What a guard does with a chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChunkOut {
    /// This goes on (to the next guard, then the client).
    Send(Bytes),
    /// This is sent last, and the stream ends (APISIX's `return ngx.OK, body`).
    End(Bytes),
}

/// A guard's state across one stream.
pub trait StreamGuard: Send {
    fn chunk<'a>(&'a mut self, chunk: &'a Chunk, body: Bytes) -> GuardFuture<'a, ChunkOut>;
}

/// Runs the guards on one chunk in order; gives them back with the outcome.
pub async fn run_stream_guards(
    mut guards: Vec<Box<dyn StreamGuard>>,
    chunk: Chunk,
    body: Bytes,
) -> (Vec<Box<dyn StreamGuard>>, ChunkOut) {
    let mut body = body;
    for g in guards.iter_mut() {
        match g.chunk(&chunk, body).await {
            ChunkOut::Send(b) => body = b,
            end @ ChunkOut::End(_) => return (guards, end),
        }
    }
    (guards, ChunkOut::Send(body))
}

/// `is_data_event` of the protocol.
fn is_data_event(p: Protocol, ev: &SseEvent) -> bool {
    match p {
        Protocol::OpenAiChat => ev.kind == "message" && ev.data != "[DONE]",
        Protocol::AnthropicMessages => {
            ev.kind == "content_block_delta" || ev.kind == "message_delta"
        }
        Protocol::OpenAiResponses => ev.kind == "response.completed",
        _ => false,
    }
}

fn is_done_event(p: Protocol, ev: &SseEvent) -> bool {
    match p {
        Protocol::OpenAiChat => ev.data == "[DONE]",
        Protocol::AnthropicMessages => ev.kind == "message_stop",
        Protocol::OpenAiResponses => ev.kind == "response.completed",
        _ => false,
    }
}

fn done_event(p: Protocol) -> &'static str {
    match p {
        Protocol::AnthropicMessages => "event: message_stop\ndata: {}\n\n",
        Protocol::OpenAiResponses => {
            "event: response.completed\ndata: {\"response\":{\"output\":[],\"status\":\"completed\"},\"type\":\"response.completed\"}\n\n"
        }
        Protocol::OpenAiEmbeddings => "",
        _ => "data: [DONE]",
    }
}

/// `final_packet`'s annotation of a chunk of the assembled stream: each data event's JSON
/// object gets `risk_level` (when `risk_level` is known), a missing end event is added once
/// the stream is over, and the events are joined with `sep`. `None`: the protocol has no
/// data events and the chunk goes as it is.
pub fn annotate(
    p: Protocol,
    body: &[u8],
    risk_level: Option<&str>,
    done: bool,
    sep: &str,
) -> Option<Bytes> {
    if !matches!(
        p,
        Protocol::OpenAiChat | Protocol::AnthropicMessages | Protocol::OpenAiResponses
    ) {
        return None;
    }
    let mut parser = SseParser::default();
    let mut events = parser.feed(body);
    // An event not ended by a blank line still counts (APISIX decodes the chunk whole).
    let rest = parser.feed(b"\n\n");
    events.extend(rest);
    let mut raw = Vec::new();
    let mut has_done = false;
    for ev in &events {
        let mut data = ev.data.clone();
        if let Some(level) = risk_level {
            if is_data_event(p, ev) {
                if let Ok(Value::Object(mut obj)) = serde_json::from_str::<Value>(&ev.data) {
                    obj.insert("risk_level".into(), Value::String(level.to_owned()));
                    data = Value::Object(obj).to_string();
                }
            }
        }
        has_done |= is_done_event(p, ev);
        raw.push(sse_event(&ev.kind, &data));
    }
    if !has_done && done {
        raw.push(done_event(p).to_owned());
    }
    Some(Bytes::from(raw.join(sep)))
}

/// Cuts `text` into pieces of at most `limit` characters (`utf8.offset` windows).
pub fn char_pieces(text: &str, limit: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let end = rest
            .char_indices()
            .nth(limit)
            .map_or(rest.len(), |(i, _)| i);
        out.push(&rest[..end]);
        rest = &rest[end..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roles(list: &[&str]) -> Roles {
        Roles::from_conf(&json!({ "request_check_roles": list }))
    }

    #[test]
    fn chat_turns_and_system() {
        let body = json!({"messages": [
            {"role": "system", "content": "sys"},
            {"role": "developer", "content": [{"type": "text", "text": "dev"}]},
            {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "a1"},
            {"role": "user", "content": [{"type": "text", "text": "u2"}, {"type": "image_url"}]},
            {"role": "tool", "content": "t1"}
        ]});
        let p = Protocol::OpenAiChat;
        assert_eq!(system_content(p, &body).unwrap(), vec!["sys", "dev"]);
        let last = turn_content(p, &body, false, roles(&["user", "tool"])).unwrap();
        assert_eq!(last, vec!["u2", "t1"]);
        let all = turn_content(p, &body, true, roles(&["user"])).unwrap();
        assert_eq!(all, vec!["u1", "u2"]);
        // the last message is no selected role: nothing in the latest turn
        assert!(turn_content(p, &body, false, roles(&["user"]))
            .unwrap()
            .is_empty());
        assert!(turn_content(Protocol::Passthrough, &body, true, roles(&["user"])).is_none());
        assert_eq!(
            messages(p, &body)[4],
            (Some("user".to_owned()), "u2".to_owned())
        );
    }

    #[test]
    fn other_protocols() {
        let anthropic = json!({"system": [{"type": "text", "text": "s"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"},
                {"type": "tool_result", "content": "hidden"}]}]});
        let p = Protocol::AnthropicMessages;
        assert_eq!(system_content(p, &anthropic).unwrap(), vec!["s"]);
        assert_eq!(
            turn_content(p, &anthropic, false, roles(&["user"])).unwrap(),
            vec!["hi"]
        );
        let responses = json!({"instructions": "be nice", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "q"}]},
            {"type": "function_call_output", "output": "out"}]});
        let p = Protocol::OpenAiResponses;
        assert_eq!(system_content(p, &responses).unwrap(), vec!["be nice"]);
        assert_eq!(
            turn_content(p, &responses, false, roles(&["user", "tool"])).unwrap(),
            vec!["q", "out"]
        );
        let bedrock = json!({"system": [{"text": "S"}],
            "messages": [{"role": "user", "content": [{"text": "B"}]}]});
        assert_eq!(
            request_content(Protocol::BedrockConverse, &bedrock),
            vec!["S", "B"]
        );
        let emb = json!({"input": ["a", 1, "b"]});
        assert_eq!(
            turn_content(Protocol::OpenAiEmbeddings, &emb, false, roles(&["system"])).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(
            turn_content(Protocol::OpenAiEmbeddings, &emb, false, roles(&["user"])).unwrap(),
            vec!["a", "b"]
        );
    }

    #[test]
    fn refusals_in_each_protocol() {
        let shape = |p, stream| DenyShape {
            protocol: p,
            model: Some("gpt".into()),
            usage: None,
            stream,
        };
        let chat: Value =
            serde_json::from_str(&shape(Protocol::OpenAiChat, false).body("no")).unwrap();
        assert_eq!(chat["choices"][0]["message"]["content"], "no");
        assert_eq!(chat["object"], "chat.completion");
        assert_eq!(chat["usage"]["total_tokens"], 0);
        let stream = shape(Protocol::OpenAiChat, true).body("no");
        assert!(stream.starts_with("data: {"));
        assert!(stream.ends_with("\n\ndata: [DONE]"));
        let a = shape(Protocol::AnthropicMessages, true).body("no");
        assert!(a.starts_with("event: message_start\ndata: "));
        assert!(a.ends_with("event: message_stop\ndata: {}\n\n"));
        let e: Value =
            serde_json::from_str(&shape(Protocol::OpenAiEmbeddings, false).body("no")).unwrap();
        assert_eq!(e["error"]["type"], "content_policy_violation");
        assert_eq!(shape(Protocol::Passthrough, false).body("no"), "");
    }

    #[test]
    fn annotation_of_the_last_chunks() {
        let body = b"data: {\"choices\":[],\"usage\":{\"total_tokens\":3}}\n\ndata: [DONE]\n\n";
        let out = annotate(Protocol::OpenAiChat, body, Some("high"), true, "").unwrap();
        let text = std::str::from_utf8(&out).unwrap();
        assert!(text.contains("\"risk_level\":\"high\""));
        assert!(text.ends_with("data: [DONE]\n\n"));
        let out = annotate(Protocol::OpenAiChat, b"data: {\"a\":1}\n\n", None, true, "").unwrap();
        assert_eq!(&out[..], b"data: {\"a\":1}\n\ndata: [DONE]");
    }

    #[test]
    fn pieces_by_characters() {
        assert_eq!(char_pieces("abcde", 2), vec!["ab", "cd", "e"]);
        assert_eq!(char_pieces("ééé", 2), vec!["éé", "é"]);
        assert!(char_pieces("", 3).is_empty());
    }
}
