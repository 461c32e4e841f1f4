//! The client protocols of APISIX's `ai-protocols/`: how a request body is recognised, what
//! is prepared before it goes out, where an answer keeps its usage and text, and the one
//! conversion APISIX makes, Anthropic Messages in, OpenAI chat out (and its answer back).

use serde_json::{json, Map, Value};

/// A protocol a request speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    OpenAiChat,
    OpenAiResponses,
    OpenAiEmbeddings,
    AnthropicMessages,
    BedrockConverse,
    Passthrough,
}

/// Token counts of one answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    /// The provider's own usage object, as it came.
    pub raw: Value,
}

fn num(v: Option<&Value>) -> u64 {
    v.and_then(Value::as_u64).unwrap_or(0)
}

impl Protocol {
    /// The names of `override.request_body`'s keys.
    pub const ALL: [Protocol; 6] = [
        Protocol::OpenAiChat,
        Protocol::OpenAiResponses,
        Protocol::OpenAiEmbeddings,
        Protocol::AnthropicMessages,
        Protocol::BedrockConverse,
        Protocol::Passthrough,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Protocol::OpenAiChat => "openai-chat",
            Protocol::OpenAiResponses => "openai-responses",
            Protocol::OpenAiEmbeddings => "openai-embeddings",
            Protocol::AnthropicMessages => "anthropic-messages",
            Protocol::BedrockConverse => "bedrock-converse",
            Protocol::Passthrough => "passthrough",
        }
    }

    /// APISIX's detection order: Bedrock Converse and Anthropic Messages by the URI, the
    /// Responses API by the URI and `input`, a chat by `messages`, embeddings by `input`, and
    /// any other non-empty object goes through as it is.
    pub fn detect(body: &Value, uri: &str) -> Option<Protocol> {
        let obj = body.as_object()?;
        if (uri.ends_with("/converse") || uri.ends_with("/converse-stream"))
            && obj.get("messages").is_some_and(Value::is_array)
        {
            return Some(Protocol::BedrockConverse);
        }
        if uri.ends_with("/v1/messages") {
            return Some(Protocol::AnthropicMessages);
        }
        if uri.ends_with("/v1/responses") && obj.get("input").is_some_and(|v| !v.is_null()) {
            return Some(Protocol::OpenAiResponses);
        }
        if obj
            .get("messages")
            .is_some_and(|m| m.is_array() || m.is_object())
        {
            return Some(Protocol::OpenAiChat);
        }
        if obj.get("input").is_some_and(|v| !v.is_null()) {
            return Some(Protocol::OpenAiEmbeddings);
        }
        (!obj.is_empty()).then_some(Protocol::Passthrough)
    }

    pub fn is_streaming(self, body: &Value) -> bool {
        match self {
            Protocol::OpenAiEmbeddings => false,
            _ => body.get("stream") == Some(&Value::Bool(true)),
        }
    }

    /// What the protocol changes before the body goes out: a streamed chat asks for the
    /// usage chunk (`stream_options.include_usage`). Whether it changed anything.
    pub fn prepare_outgoing(self, body: &mut Map<String, Value>) -> bool {
        if self == Protocol::OpenAiChat && body.get("stream").is_some_and(truthy) {
            body.insert("stream_options".into(), json!({"include_usage": true}));
            return true;
        }
        false
    }

    /// The usage of a complete answer.
    pub fn usage(self, resp: &Value) -> Option<Usage> {
        let u = resp.get("usage")?;
        if !u.is_object() {
            return None;
        }
        Some(match self {
            Protocol::OpenAiResponses | Protocol::AnthropicMessages => {
                let p = num(u.get("input_tokens"));
                let c = num(u.get("output_tokens"));
                Usage {
                    prompt_tokens: p,
                    completion_tokens: c,
                    total_tokens: u
                        .get("total_tokens")
                        .and_then(Value::as_u64)
                        .unwrap_or(p + c),
                    raw: u.clone(),
                }
            }
            Protocol::BedrockConverse => Usage {
                prompt_tokens: num(u.get("inputTokens")),
                completion_tokens: num(u.get("outputTokens")),
                total_tokens: num(u.get("totalTokens")),
                raw: u.clone(),
            },
            _ => {
                let p = num(u.get("prompt_tokens"));
                let c = num(u.get("completion_tokens"));
                Usage {
                    prompt_tokens: p,
                    completion_tokens: c,
                    total_tokens: u
                        .get("total_tokens")
                        .and_then(Value::as_u64)
                        .unwrap_or(p + c),
                    raw: u.clone(),
                }
            }
        })
    }

    /// The answer's text, its parts joined with spaces.
    pub fn response_text(self, resp: &Value) -> Option<String> {
        let texts: Vec<&str> = match self {
            Protocol::OpenAiChat => resp
                .get("choices")?
                .as_array()?
                .iter()
                .filter_map(|c| c.get("message")?.get("content")?.as_str())
                .collect(),
            Protocol::OpenAiResponses => resp
                .get("output")?
                .as_array()?
                .iter()
                .filter(|i| i.get("type").and_then(Value::as_str) == Some("message"))
                .filter_map(|i| i.get("content")?.as_array())
                .flatten()
                .filter(|p| p.get("type").and_then(Value::as_str) == Some("output_text"))
                .filter_map(|p| p.get("text")?.as_str())
                .collect(),
            Protocol::AnthropicMessages => resp
                .get("content")?
                .as_array()?
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text")?.as_str())
                .collect(),
            _ => return None,
        };
        (!texts.is_empty()).then(|| texts.join(" "))
    }

    /// Whether a complete answer (in this, the client's, protocol) asks for a tool
    /// (`has_tool_call` of APISIX's protocol modules; Bedrock, embeddings and passthrough
    /// answers have none).
    pub fn has_tool_call(self, resp: &Value) -> bool {
        let items = |k: &str| resp.get(k).and_then(Value::as_array).into_iter().flatten();
        match self {
            Protocol::OpenAiChat => items("choices").any(|c| {
                c.get("message")
                    .and_then(|m| m.get("tool_calls"))
                    .and_then(Value::as_array)
                    .is_some_and(|t| !t.is_empty())
            }),
            Protocol::OpenAiResponses => items("output")
                .any(|i| i.get("type").and_then(Value::as_str) == Some("function_call")),
            Protocol::AnthropicMessages => {
                items("content").any(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"))
            }
            _ => false,
        }
    }

    /// The request's conversation as `logging.payloads` records it.
    pub fn request_content(self, body: &Value) -> Value {
        match self {
            Protocol::OpenAiEmbeddings | Protocol::OpenAiResponses => {
                body.get("input").cloned().unwrap_or(Value::Null)
            }
            Protocol::Passthrough => Value::Null,
            _ => body.get("messages").cloned().unwrap_or(Value::Null),
        }
    }

    /// The request's messages as (role, text) for the guards: a chat's and Anthropic's
    /// `messages` (text parts joined), embeddings' and Responses' `input` as the user's.
    pub fn messages(self, body: &Value) -> Vec<(String, String)> {
        match self {
            Protocol::OpenAiChat | Protocol::AnthropicMessages | Protocol::BedrockConverse => body
                .get("messages")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|m| {
                    let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
                    (role.to_owned(), content_text(m.get("content")))
                })
                .collect(),
            Protocol::OpenAiEmbeddings | Protocol::OpenAiResponses => match body.get("input") {
                Some(Value::String(s)) => vec![("user".into(), s.clone())],
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|i| match i {
                        Value::String(s) => ("user".into(), s.clone()),
                        other => (
                            other
                                .get("role")
                                .and_then(Value::as_str)
                                .unwrap_or("user")
                                .to_owned(),
                            content_text(other.get("content")),
                        ),
                    })
                    .collect(),
                _ => Vec::new(),
            },
            Protocol::Passthrough => Vec::new(),
        }
    }
}

/// Lua truthiness of a JSON value: anything but `false` and `null`.
pub fn truthy(v: &Value) -> bool {
    !matches!(v, Value::Null | Value::Bool(false))
}

/// A message content as text: the string, or the `text` of its parts.
pub fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

/// An Anthropic `system` as an OpenAI system message: the string, or its text blocks joined.
fn convert_system(system: &Value) -> Option<Value> {
    let text = match system {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<String>(),
        _ => return None,
    };
    (!text.is_empty()).then(|| json!({"role": "system", "content": text}))
}

/// An Anthropic image or document block as an OpenAI `image_url` part.
fn convert_media(block: &Value) -> Option<Value> {
    let source = block.get("source")?;
    let kind = block.get("type").and_then(Value::as_str)?;
    match source.get("type").and_then(Value::as_str)? {
        "base64" => {
            let data = source
                .get("data")
                .and_then(Value::as_str)
                .filter(|d| !d.is_empty())?;
            let default = if kind == "document" {
                "application/pdf"
            } else {
                "image/png"
            };
            let media = source
                .get("media_type")
                .and_then(Value::as_str)
                .unwrap_or(default);
            Some(
                json!({"type": "image_url", "image_url": {"url": format!("data:{media};base64,{data}")}}),
            )
        }
        "url" if kind == "image" => {
            let url = source
                .get("url")
                .and_then(Value::as_str)
                .filter(|u| !u.is_empty())?;
            Some(json!({"type": "image_url", "image_url": {"url": url}}))
        }
        _ => None,
    }
}

fn tool_choice(tc: &Value) -> Option<Value> {
    match tc.get("type").and_then(Value::as_str)? {
        "auto" => Some(json!("auto")),
        "any" => Some(json!("required")),
        "none" => Some(json!("none")),
        "tool" => {
            let name = tc.get("name").and_then(Value::as_str)?;
            Some(json!({"type": "function", "function": {"name": name}}))
        }
        _ => None,
    }
}

/// Anthropic Messages request -> OpenAI chat request (APISIX's
/// `anthropic-messages-to-openai-chat` converter): the system prompt first, text and media
/// parts, tool uses and results, the sampling fields and tools.
pub fn anthropic_to_openai_request(req: &Value) -> Result<Value, String> {
    let obj = req.as_object().ok_or("request body must be a table")?;
    let messages = obj
        .get("messages")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or("missing messages")?;
    let mut out = Map::new();
    if let Some(m) = obj.get("model").filter(|m| m.is_string()) {
        out.insert("model".into(), m.clone());
    }
    if let Some(s) = obj.get("stream").filter(|s| !s.is_null()) {
        out.insert("stream".into(), s.clone());
        if truthy(s) {
            out.insert("stream_options".into(), json!({"include_usage": true}));
        }
    }
    if let Some(v) = obj.get("max_tokens").filter(|v| truthy(v)) {
        out.insert("max_completion_tokens".into(), v.clone());
    }
    for key in ["temperature", "top_p"] {
        if let Some(v) = obj.get(key).filter(|v| truthy(v)) {
            out.insert(key.into(), v.clone());
        }
    }
    if let Some(v) = obj.get("stop_sequences").filter(|v| v.is_array()) {
        out.insert("stop".into(), v.clone());
    }
    if let Some(tc) = obj.get("tool_choice") {
        if let Some(c) = tool_choice(tc) {
            out.insert("tool_choice".into(), c);
        }
        if tc.get("disable_parallel_tool_use") == Some(&Value::Bool(true)) {
            out.insert("parallel_tool_calls".into(), Value::Bool(false));
        }
    }
    if let Some(user) = obj
        .get("metadata")
        .and_then(|m| m.get("user_id"))
        .filter(|u| u.is_string())
    {
        out.insert("user".into(), user.clone());
    }
    if let Some(t) = obj.get("service_tier").filter(|t| t.is_string()) {
        out.insert("service_tier".into(), t.clone());
    }
    let tools: Vec<Value> = obj
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|t| {
            // Anthropic's built-in tools have no OpenAI counterpart.
            !t.get("type").and_then(Value::as_str).is_some_and(|ty| {
                [
                    "computer_",
                    "bash_",
                    "text_editor_",
                    "web_search",
                    "code_execution_",
                ]
                .iter()
                .any(|p| ty.starts_with(p))
            })
        })
        .filter_map(|t| {
            let name = t
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())?;
            Some(json!({"type": "function", "function": {
                "name": name,
                "description": t.get("description").cloned().unwrap_or(Value::Null),
                "parameters": t.get("input_schema").cloned().unwrap_or(Value::Null),
            }}))
        })
        .collect();
    if tools.is_empty() {
        out.remove("tool_choice");
        out.remove("parallel_tool_calls");
    } else {
        out.insert("tools".into(), Value::Array(tools));
    }
    let mut msgs = Vec::new();
    if let Some(sys) = obj.get("system").and_then(convert_system) {
        msgs.push(sys);
    }
    for (i, msg) in messages.iter().enumerate() {
        let role = msg
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("invalid message at index {}", i + 1))?;
        let blocks = match msg.get("content") {
            Some(Value::String(s)) => {
                msgs.push(json!({"role": role, "content": s}));
                continue;
            }
            Some(Value::Array(b)) => b,
            _ => return Err(format!("invalid message content at index {}", i + 1)),
        };
        let (mut parts, mut calls, mut results) = (Vec::new(), Vec::new(), Vec::new());
        for block in blocks {
            match block.get("type").and_then(Value::as_str) {
                Some("text") => {
                    if let Some(t) = block.get("text").and_then(Value::as_str) {
                        parts.push(json!({"type": "text", "text": t}));
                    }
                }
                Some("image" | "document") => parts.extend(convert_media(block)),
                Some("tool_use") => {
                    if let (Some(id), Some(name)) = (
                        block.get("id").and_then(Value::as_str),
                        block.get("name").and_then(Value::as_str),
                    ) {
                        let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                        calls.push(json!({"id": id, "type": "function", "function": {
                            "name": name, "arguments": input.to_string()}}));
                    }
                }
                Some("tool_result") => {
                    if let Some(id) = block.get("tool_use_id").and_then(Value::as_str) {
                        let content = match block.get("content") {
                            Some(Value::String(s)) => Value::String(s.clone()),
                            Some(Value::Array(subs)) => {
                                let media: Vec<Value> =
                                    subs.iter().filter_map(convert_media).collect();
                                if media.is_empty() {
                                    Value::String(
                                        subs.iter()
                                            .filter_map(|s| s.get("text").and_then(Value::as_str))
                                            .collect(),
                                    )
                                } else {
                                    Value::Array(
                                        subs.iter()
                                            .filter_map(|s| {
                                                match s.get("text").and_then(Value::as_str) {
                                                    Some(t) => {
                                                        Some(json!({"type": "text", "text": t}))
                                                    }
                                                    None => convert_media(s),
                                                }
                                            })
                                            .collect(),
                                    )
                                }
                            }
                            _ => Value::String(String::new()),
                        };
                        results
                            .push(json!({"role": "tool", "tool_call_id": id, "content": content}));
                    }
                }
                _ => {}
            }
        }
        let text_of = |parts: &[Value]| -> String {
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect()
        };
        if !results.is_empty() {
            msgs.extend(results);
            if !parts.is_empty() {
                msgs.push(json!({"role": role, "content": parts}));
            }
            continue;
        }
        let mut m = Map::new();
        m.insert("role".into(), Value::String(role.into()));
        if !calls.is_empty() {
            let text = text_of(&parts);
            if !text.is_empty() {
                m.insert("content".into(), Value::String(text));
            }
            m.insert("tool_calls".into(), Value::Array(calls));
        } else if parts.is_empty() {
            m.insert("content".into(), Value::String(String::new()));
        } else if role == "assistant" {
            m.insert("content".into(), Value::String(text_of(&parts)));
        } else {
            m.insert("content".into(), Value::Array(parts));
        }
        msgs.push(Value::Object(m));
    }
    out.insert("messages".into(), Value::Array(msgs));
    Ok(Value::Object(out))
}

fn stop_reason(finish: Option<&str>) -> &'static str {
    match finish {
        Some("length") => "max_tokens",
        Some("tool_calls" | "function_call") => "tool_use",
        _ => "end_turn",
    }
}

/// OpenAI chat answer -> Anthropic message: its text and tool calls as content blocks, the
/// finish reason as `stop_reason`, the usage as input and output tokens; `model` is the
/// model the request named.
pub fn openai_to_anthropic_response(resp: &Value, model: Option<&str>) -> Result<Value, String> {
    let obj = resp.as_object().ok_or("response body must be a table")?;
    if let Some(err) = obj.get("error") {
        let kind = err
            .get("type")
            .or_else(|| err.get("code"))
            .cloned()
            .unwrap_or_else(|| json!("api_error"));
        let message = match err {
            Value::String(s) => s.clone(),
            e => e
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        };
        return Ok(json!({"type": "error", "error": {"type": kind, "message": message}}));
    }
    let choice = obj
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or("no choices in response")?;
    let msg = choice.get("message");
    let mut content = Vec::new();
    if let Some(r) = msg
        .and_then(|m| m.get("reasoning_content").or_else(|| m.get("reasoning")))
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
    {
        content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
    }
    if let Some(t) = msg
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        content.push(json!({"type": "text", "text": t}));
    }
    for tc in msg
        .and_then(|m| m.get("tool_calls"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let f = tc.get("function");
        let input = f
            .and_then(|f| f.get("arguments"))
            .and_then(Value::as_str)
            .and_then(|a| serde_json::from_str::<Value>(a).ok())
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        content.push(json!({
            "type": "tool_use",
            "id": tc.get("id").and_then(Value::as_str).unwrap_or_default(),
            "name": f.and_then(|f| f.get("name")).and_then(Value::as_str).unwrap_or_default(),
            "input": input,
        }));
    }
    if content.is_empty() {
        content.push(json!({"type": "text", "text": ""}));
    }
    let mut usage = Map::new();
    let u = obj.get("usage");
    let prompt = num(u.and_then(|u| u.get("prompt_tokens")));
    let completion = num(u.and_then(|u| u.get("completion_tokens")));
    match u
        .and_then(|u| u.get("prompt_tokens_details"))
        .filter(|d| d.is_object())
    {
        Some(d) => {
            let cached = num(d.get("cached_tokens"));
            usage.insert("input_tokens".into(), json!(prompt.saturating_sub(cached)));
            usage.insert("output_tokens".into(), json!(completion));
            usage.insert("cache_read_input_tokens".into(), json!(cached));
            if let Some(c) = d.get("cache_creation_input_tokens") {
                usage.insert("cache_creation_input_tokens".into(), c.clone());
            }
        }
        None => {
            usage.insert("input_tokens".into(), json!(prompt));
            usage.insert("output_tokens".into(), json!(completion));
        }
    }
    let finish = choice.get("finish_reason").and_then(Value::as_str);
    Ok(json!({
        "id": obj.get("id").cloned().unwrap_or(Value::Null),
        "type": "message",
        "role": "assistant",
        "model": model.map_or_else(|| obj.get("model").cloned().unwrap_or(Value::Null), |m| json!(m)),
        "content": content,
        "stop_reason": stop_reason(finish),
        "stop_sequence": Value::Null,
        "usage": usage,
    }))
}

/// Server-sent events cut from a byte stream: each complete event's type (`message`
/// without an `event:` line) and its data lines joined.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
}

/// One server-sent event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SseEvent {
    pub kind: String,
    pub data: String,
}

impl SseParser {
    /// Feeds `chunk`; answers the events it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(chunk);
        let mut events = Vec::new();
        loop {
            let text = &self.buf;
            let end = find_blank_line(text);
            let Some((at, len)) = end else { break };
            let raw = String::from_utf8_lossy(&text[..at]).into_owned();
            self.buf.drain(..at + len);
            let mut kind = String::from("message");
            let mut data: Vec<&str> = Vec::new();
            for line in raw.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    kind = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.strip_prefix(' ').unwrap_or(v));
                }
            }
            if !data.is_empty() || kind != "message" {
                events.push(SseEvent {
                    kind,
                    data: data.join("\n"),
                });
            }
        }
        events
    }
}

fn find_blank_line(b: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < b.len() {
        if b[i] == b'\n' && b[i + 1] == b'\n' {
            return Some((i, 2));
        }
        if i + 3 < b.len() && &b[i..i + 4] == b"\r\n\r\n" {
            return Some((i, 4));
        }
        i += 1;
    }
    None
}

/// What one streamed event of `protocol` tells: text, usage, the end, a tool call.
#[derive(Debug, Default, PartialEq)]
pub struct StreamFacts {
    pub text: Option<String>,
    pub usage: Option<Usage>,
    pub done: bool,
    /// The event asks for a tool (`parse_sse_event`'s `has_tool_call`).
    pub tool_call: bool,
}

/// Reads one event of a stream of `protocol`.
pub fn stream_facts(protocol: Protocol, ev: &SseEvent) -> StreamFacts {
    let mut facts = StreamFacts::default();
    if protocol == Protocol::OpenAiChat && ev.data.trim() == "[DONE]" {
        facts.done = true;
        return facts;
    }
    let Ok(data) = serde_json::from_str::<Value>(&ev.data) else {
        return facts;
    };
    match protocol {
        Protocol::OpenAiChat => {
            let text: String = data
                .get("choices")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|c| c.get("delta")?.get("content")?.as_str())
                .collect();
            if !text.is_empty() {
                facts.text = Some(text);
            }
            facts.tool_call = data
                .get("choices")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|c| {
                    c.get("delta")
                        .and_then(|d| d.get("tool_calls"))
                        .and_then(Value::as_array)
                        .is_some_and(|t| !t.is_empty())
                });
            facts.usage = Protocol::OpenAiChat.usage(&data);
        }
        Protocol::OpenAiResponses => match ev.kind.as_str() {
            "response.output_text.delta" => {
                facts.text = data.get("delta").and_then(Value::as_str).map(str::to_owned);
            }
            "response.completed" => {
                facts.done = true;
                let resp = data.get("response").filter(|r| r.is_object());
                facts.usage = resp.and_then(|r| Protocol::OpenAiResponses.usage(r));
                facts.tool_call = resp.is_some_and(|r| Protocol::OpenAiResponses.has_tool_call(r));
            }
            "response.failed" | "response.incomplete" | "error" => facts.done = true,
            _ => {}
        },
        Protocol::AnthropicMessages => match ev.kind.as_str() {
            "message_start" => {
                let u = data.get("message").and_then(|m| m.get("usage"));
                facts.usage = u.map(|u| Usage {
                    prompt_tokens: num(u.get("input_tokens")),
                    completion_tokens: num(u.get("output_tokens")),
                    total_tokens: num(u.get("input_tokens")) + num(u.get("output_tokens")),
                    raw: u.clone(),
                });
            }
            "content_block_start" => {
                facts.tool_call = data
                    .get("content_block")
                    .and_then(|b| b.get("type"))
                    .and_then(Value::as_str)
                    == Some("tool_use");
            }
            "content_block_delta" => {
                facts.text = data
                    .get("delta")
                    .and_then(|d| d.get("text"))
                    .and_then(Value::as_str)
                    .map(str::to_owned);
            }
            "message_delta" => {
                // Only the output count: merged with message_start's input count.
                facts.usage = data.get("usage").map(|u| Usage {
                    prompt_tokens: 0,
                    completion_tokens: num(u.get("output_tokens")),
                    total_tokens: 0,
                    raw: u.clone(),
                });
            }
            "message_stop" => facts.done = true,
            _ => {}
        },
        _ => {}
    }
    facts
}

/// Turns an OpenAI chat stream into Anthropic Messages events, chunk by chunk.
#[derive(Debug, Default)]
pub struct AnthropicStream {
    started: bool,
    block_open: bool,
    stop: Option<&'static str>,
    finished: bool,
    model: Option<String>,
}

fn anthropic_event(kind: &str, data: Value) -> String {
    format!("event: {kind}\ndata: {data}\n\n")
}

impl AnthropicStream {
    pub fn new(model: Option<String>) -> AnthropicStream {
        AnthropicStream {
            model,
            ..Default::default()
        }
    }

    /// The Anthropic events for one OpenAI event.
    pub fn convert(&mut self, ev: &SseEvent) -> String {
        let mut out = String::new();
        if self.finished {
            return out;
        }
        if ev.data.trim() == "[DONE]" {
            self.finish(&mut out, None);
            return out;
        }
        let Ok(data) = serde_json::from_str::<Value>(&ev.data) else {
            return out;
        };
        if !self.started {
            self.started = true;
            let model = self
                .model
                .clone()
                .map(Value::String)
                .or_else(|| data.get("model").cloned())
                .unwrap_or(Value::Null);
            out.push_str(&anthropic_event(
                "message_start",
                json!({"type": "message_start", "message": {
                    "id": data.get("id").cloned().unwrap_or(Value::Null),
                    "type": "message", "role": "assistant", "model": model,
                    "content": [], "stop_reason": Value::Null, "stop_sequence": Value::Null,
                    "usage": {"input_tokens": 0, "output_tokens": 0}}}),
            ));
        }
        for choice in data
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(t) = choice
                .get("delta")
                .and_then(|d| d.get("content"))
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
            {
                if !self.block_open {
                    self.block_open = true;
                    out.push_str(&anthropic_event(
                        "content_block_start",
                        json!({"type": "content_block_start", "index": 0,
                               "content_block": {"type": "text", "text": ""}}),
                    ));
                }
                out.push_str(&anthropic_event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "text_delta", "text": t}}),
                ));
            }
            if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
                self.stop = Some(stop_reason(Some(f)));
            }
        }
        if let Some(u) = Protocol::OpenAiChat.usage(&data) {
            self.finish(&mut out, Some(u));
        }
        out
    }

    fn finish(&mut self, out: &mut String, usage: Option<Usage>) {
        if self.block_open {
            self.block_open = false;
            out.push_str(&anthropic_event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ));
        }
        let u = usage.unwrap_or_default();
        out.push_str(&anthropic_event(
            "message_delta",
            json!({"type": "message_delta",
                   "delta": {"stop_reason": self.stop.unwrap_or("end_turn"), "stop_sequence": Value::Null},
                   "usage": {"input_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens}}),
        ));
        out.push_str(&anthropic_event(
            "message_stop",
            json!({"type": "message_stop"}),
        ));
        self.finished = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_order() {
        let chat = json!({"messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(Protocol::detect(&chat, "/x"), Some(Protocol::OpenAiChat));
        assert_eq!(
            Protocol::detect(&chat, "/a/v1/messages"),
            Some(Protocol::AnthropicMessages)
        );
        let input = json!({"input": "hi"});
        assert_eq!(
            Protocol::detect(&input, "/x"),
            Some(Protocol::OpenAiEmbeddings)
        );
        assert_eq!(
            Protocol::detect(&input, "/v1/responses"),
            Some(Protocol::OpenAiResponses)
        );
        assert_eq!(
            Protocol::detect(&json!({"prompt": "fox"}), "/img"),
            Some(Protocol::Passthrough)
        );
        assert_eq!(Protocol::detect(&json!({}), "/x"), None);
        assert_eq!(Protocol::detect(&json!("text"), "/x"), None);
    }

    #[test]
    fn anthropic_request_and_answer_convert() {
        let req = json!({"model": "claude", "system": "Be terse", "max_tokens": 64,
            "stop_sequences": ["X"], "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"},
                    {"type": "image", "source": {"type": "url", "url": "http://i/p.png"}}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "42"}]}]});
        let out = anthropic_to_openai_request(&req).unwrap();
        assert_eq!(out["max_completion_tokens"], 64);
        assert_eq!(out["stop"], json!(["X"]));
        let msgs = out["messages"].as_array().unwrap();
        assert_eq!(msgs[0], json!({"role": "system", "content": "Be terse"}));
        assert_eq!(msgs[1]["content"][1]["image_url"]["url"], "http://i/p.png");
        assert_eq!(
            msgs[2]["tool_calls"][0]["function"]["arguments"],
            "{\"a\":1}"
        );
        assert_eq!(
            msgs[3],
            json!({"role": "tool", "tool_call_id": "t1", "content": "42"})
        );
        assert_eq!(
            anthropic_to_openai_request(&json!({"messages": []})).unwrap_err(),
            "missing messages"
        );

        let answer = json!({"id": "c1", "choices": [{"message": {"content": "yes"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1}});
        let a = openai_to_anthropic_response(&answer, Some("claude")).unwrap();
        assert_eq!(a["content"], json!([{"type": "text", "text": "yes"}]));
        assert_eq!(a["stop_reason"], "max_tokens");
        assert_eq!(a["model"], "claude");
        assert_eq!(a["usage"], json!({"input_tokens": 3, "output_tokens": 1}));
    }

    #[test]
    fn sse_events_across_chunks_and_stream_conversion() {
        let mut p = SseParser::default();
        assert!(p
            .feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"he")
            .is_empty());
        let evs = p.feed(b"llo\"}}]}\n\ndata: [DONE]\n\n");
        assert_eq!(evs.len(), 2);
        assert_eq!(
            stream_facts(Protocol::OpenAiChat, &evs[0]).text.as_deref(),
            Some("hello")
        );
        assert!(stream_facts(Protocol::OpenAiChat, &evs[1]).done);
        let mut conv = AnthropicStream::new(Some("claude".into()));
        let first = conv.convert(&evs[0]);
        assert!(first.starts_with("event: message_start\n"));
        assert!(first.contains("\"text_delta\""));
        let last = conv.convert(&evs[1]);
        assert!(last.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));
    }

    #[test]
    fn tool_calls_found_in_answers_and_stream_events() {
        let call = json!({"choices": [{"message": {"tool_calls": [{"id": "t"}]}}]});
        assert!(Protocol::OpenAiChat.has_tool_call(&call));
        let none = json!({"choices": [{"message": {"content": "x", "tool_calls": []}}]});
        assert!(!Protocol::OpenAiChat.has_tool_call(&none));
        assert!(Protocol::OpenAiResponses
            .has_tool_call(&json!({"output": [{"type": "message"}, {"type": "function_call"}]})));
        assert!(!Protocol::OpenAiResponses.has_tool_call(&json!({"output": [{"type": "message"}]})));
        assert!(Protocol::AnthropicMessages
            .has_tool_call(&json!({"content": [{"type": "text"}, {"type": "tool_use"}]})));
        assert!(!Protocol::BedrockConverse.has_tool_call(&call));
        // The Anthropic answer converted from an OpenAI tool call carries its tool_use.
        let a = openai_to_anthropic_response(
            &json!({"choices": [{"message": {"tool_calls": [{"id": "t", "type": "function",
                "function": {"name": "f", "arguments": "{}"}}]}, "finish_reason": "tool_calls"}]}),
            None,
        )
        .unwrap();
        assert!(Protocol::AnthropicMessages.has_tool_call(&a), "{a}");

        let ev = |kind: &str, data: Value| SseEvent {
            kind: kind.into(),
            data: data.to_string(),
        };
        let chunk = json!({"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]});
        assert!(stream_facts(Protocol::OpenAiChat, &ev("", chunk)).tool_call);
        let text = json!({"choices": [{"delta": {"content": "hi"}}]});
        assert!(!stream_facts(Protocol::OpenAiChat, &ev("", text)).tool_call);
        let start = json!({"content_block": {"type": "tool_use"}});
        assert!(
            stream_facts(
                Protocol::AnthropicMessages,
                &ev("content_block_start", start)
            )
            .tool_call
        );
        let done = json!({"response": {"output": [{"type": "function_call"}]}});
        let facts = stream_facts(Protocol::OpenAiResponses, &ev("response.completed", done));
        assert!(facts.tool_call && facts.done);
    }
}
