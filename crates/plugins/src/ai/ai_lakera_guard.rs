//! ai-lakera-guard (`apisix/plugins/ai-lakera-guard.lua`, `ai-lakera-guard/`): the
//! conversation of an AI request (`direction` `input`) and its answer (`output`, `both`) is
//! screened by Lakera Guard's `/v2/guard` (`messages` by role, `breakdown`, `project_id`,
//! `Authorization: Bearer`); a flagged verdict refuses the request or replaces the answer
//! with a refusal in the client's protocol (`action` `block`), or is only logged (`alert`).
//! Lakera failing denies (`fail_open` false) or lets through. A streamed answer is held back
//! (keep-alive comments go instead) until it is complete and screened, then released or
//! replaced; in `alert` mode with `fail_open` it goes on as it comes and is screened at its
//! end.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ferrisix_plugin_api::{
    CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef, PluginServices, Step,
};
use http::{header, HeaderValue, Request, StatusCode};
use serde_json::{json, Map, Value};

use crate::support::ai::guard::{
    self, Answer, Chunk, ChunkOut, DenyShape, FailMode, GuardFuture, ResponseGuard, ResponseGuards,
    StreamGuard,
};
use crate::support::ai::{AiRequest, LlmRecord, PickedInstance};

pub const NAME: &str = "ai-lakera-guard";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &["api_key"],
    ..PluginDef::new(NAME, 1028, schema, compile)
};

/// What a held-back stream sends meanwhile: an SSE comment, which keeps the connection
/// alive and carries nothing.
const KEEP_ALIVE: &[u8] = b":\n\n";

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "api_key": {"type": "string", "minLength": 1},
            "lakera_endpoint": {
                "type": "string", "pattern": "^https?://",
                "default": "https://api.lakera.ai/v2/guard"
            },
            "project_id": {"type": "string"},
            "direction": {"type": "string", "enum": ["input", "output", "both"], "default": "input"},
            "action": {"type": "string", "enum": ["block", "alert"], "default": "block"},
            "fail_open": {"type": "boolean", "default": false},
            "fail_mode": guard::fail_mode_schema(),
            "timeout": {"type": "integer", "minimum": 1, "default": 5000},
            "ssl_verify": {"type": "boolean", "default": true},
            "reveal_failure_categories": {"type": "boolean", "default": false},
            "deny_code": {"type": "integer", "minimum": 200, "maximum": 599, "default": 200},
            "request_failure_message": {
                "type": "string", "default": "Request blocked by Lakera Guard"
            },
            "response_failure_message": {
                "type": "string", "default": "Response blocked by Lakera Guard"
            }
        },
        "required": ["api_key"]
    })
}

#[derive(Debug)]
struct Conf {
    api_key: String,
    endpoint: String,
    project_id: Option<String>,
    input: bool,
    output: bool,
    alert: bool,
    fail_open: bool,
    fail_mode: FailMode,
    timeout: Duration,
    ssl_verify: bool,
    reveal: bool,
    deny_code: u16,
    request_message: String,
    response_message: String,
}

#[derive(Debug)]
struct Guard {
    conf: Conf,
    services: Arc<PluginServices>,
}

#[derive(Debug)]
struct LakeraGuard(Arc<Guard>);

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let text = |k: &str, d: &str| conf.get(k).and_then(Value::as_str).unwrap_or(d).to_owned();
    let direction = text("direction", "input");
    let endpoint = text("lakera_endpoint", "https://api.lakera.ai/v2/guard");
    endpoint
        .parse::<http::Uri>()
        .map_err(|_| "invalid lakera_endpoint")?;
    let conf = Conf {
        api_key: text("api_key", ""),
        endpoint,
        project_id: conf
            .get("project_id")
            .and_then(Value::as_str)
            .map(str::to_owned),
        input: direction != "output",
        output: direction != "input",
        alert: text("action", "block") == "alert",
        fail_open: conf.get("fail_open").and_then(Value::as_bool) == Some(true),
        fail_mode: FailMode::from_conf(&conf),
        timeout: Duration::from_millis(conf.get("timeout").and_then(Value::as_u64).unwrap_or(5000)),
        ssl_verify: conf.get("ssl_verify").and_then(Value::as_bool) != Some(false),
        reveal: conf
            .get("reveal_failure_categories")
            .and_then(Value::as_bool)
            == Some(true),
        deny_code: conf.get("deny_code").and_then(Value::as_u64).unwrap_or(200) as u16,
        request_message: text("request_failure_message", "Request blocked by Lakera Guard"),
        response_message: text(
            "response_failure_message",
            "Response blocked by Lakera Guard",
        ),
    };
    Ok(Arc::new(LakeraGuard(Arc::new(Guard {
        conf,
        services: cx.services.clone(),
    }))))
}

/// Lakera's verdict.
#[derive(Debug, PartialEq)]
struct Scan {
    flagged: bool,
    breakdown: Option<Vec<Value>>,
    request_uuid: Option<String>,
}

/// The detectors that fired, for the client's refusal: `detector_type (result)`.
fn format_breakdown(breakdown: &[Value]) -> Vec<String> {
    breakdown
        .iter()
        .filter(|e| e.get("detected") == Some(&Value::Bool(true)))
        .filter_map(|e| {
            let kind = e.get("detector_type")?.as_str()?;
            Some(match e.get("result").and_then(Value::as_str) {
                Some(r) if !r.is_empty() => format!("{kind} ({r})"),
                _ => kind.to_owned(),
            })
        })
        .collect()
}

impl Guard {
    /// `client.scan`: the conversation to Lakera, its verdict or why there is none.
    async fn scan(&self, messages: &[(String, String)]) -> Result<Scan, String> {
        let c = &self.conf;
        let mut body = Map::new();
        body.insert(
            "messages".into(),
            Value::Array(
                messages
                    .iter()
                    .map(|(role, content)| json!({"role": role, "content": content}))
                    .collect(),
            ),
        );
        body.insert("breakdown".into(), Value::Bool(true));
        if let Some(p) = &c.project_id {
            body.insert("project_id".into(), Value::String(p.clone()));
        }
        let mut req = Request::post(&c.endpoint)
            .body(Bytes::from(Value::Object(body).to_string()))
            .map_err(|e| format!("failed to request Lakera Guard: {e}"))?;
        let headers = req.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if !c.api_key.is_empty() {
            let v = HeaderValue::from_str(&format!("Bearer {}", c.api_key))
                .map_err(|_| "failed to request Lakera Guard: invalid api_key".to_owned())?;
            headers.insert(header::AUTHORIZATION, v);
        }
        let resp = self
            .services
            .http()
            .send_verified(req, c.timeout, c.ssl_verify)
            .await
            .map_err(|e| format!("failed to request Lakera Guard: {e}"))?;
        if resp.status() != StatusCode::OK {
            return Err(format!(
                "Lakera Guard returned status {}",
                resp.status().as_u16()
            ));
        }
        let data: Value = serde_json::from_slice(resp.body())
            .map_err(|e| format!("failed to decode Lakera Guard response: {e}"))?;
        let Value::Object(data) = data else {
            return Err("unexpected Lakera Guard response: expected a JSON object".into());
        };
        Ok(Scan {
            flagged: data.get("flagged") == Some(&Value::Bool(true)),
            breakdown: data.get("breakdown").and_then(Value::as_array).cloned(),
            request_uuid: data
                .get("metadata")
                .and_then(|m| m.get("request_uuid"))
                .and_then(Value::as_str)
                .map(str::to_owned),
        })
    }

    /// The refusal: `message`, with the detectors that fired when they are revealed.
    fn deny(&self, shape: &DenyShape, message: &str, breakdown: Option<&[Value]>) -> String {
        let mut text = message.to_owned();
        if self.conf.reveal {
            let parts = format_breakdown(breakdown.unwrap_or(&[]));
            if !parts.is_empty() {
                text = format!("{text}. Flagged categories: {}", parts.join(", "));
            }
        }
        shape.body(&text)
    }

    /// `moderate`: screens `messages`; `Some((status, refusal))` when they must be stopped.
    async fn moderate(
        &self,
        shape: &DenyShape,
        messages: &[(String, String)],
        label: &str,
        failure: &str,
    ) -> Option<(u16, String)> {
        if messages.is_empty() {
            return None;
        }
        let c = &self.conf;
        let scan = match self.scan(messages).await {
            Ok(s) => s,
            Err(e) if c.fail_open => {
                tracing::warn!("ai-lakera-guard: {e}; fail_open=true, allowing {label}");
                return None;
            }
            Err(e) => {
                tracing::error!("ai-lakera-guard: {e}; fail_open=false, blocking {label}");
                return Some((c.deny_code, self.deny(shape, failure, None)));
            }
        };
        if !scan.flagged {
            return None;
        }
        let breakdown = scan.breakdown.as_ref().map_or_else(
            || "null".to_owned(),
            |b| Value::Array(b.clone()).to_string(),
        );
        tracing::warn!(
            "ai-lakera-guard: {label} flagged by Lakera Guard, breakdown: {breakdown}, request_uuid: {}",
            scan.request_uuid.as_deref().unwrap_or("")
        );
        if c.alert {
            return None;
        }
        Some((
            c.deny_code,
            self.deny(shape, failure, scan.breakdown.as_deref()),
        ))
    }

    async fn moderate_response(&self, shape: &DenyShape, text: &str) -> Option<(u16, String)> {
        self.moderate(
            shape,
            &[("assistant".to_owned(), text.to_owned())],
            "response",
            &self.conf.response_message,
        )
        .await
    }
}

impl LakeraGuard {
    async fn access_async(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let g = &self.0;
        let c = &g.conf;
        let unsupported = |reason: &str, status: u16, body: &str| match c
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
                "no ai instance picked, ai-lakera-guard plugin must be used with ai-proxy or ai-proxy-multi plugin",
            );
        }
        if c.output {
            let guard: Arc<dyn ResponseGuard> = g.clone();
            ResponseGuards::add(ctx, guard);
        }
        if !c.input {
            return Flow::Continue;
        }
        let Some(req) = ctx.get::<AiRequest>().cloned() else {
            return unsupported(
                "failed to read request body: unknown error",
                500,
                "failed to read request body: unknown error",
            );
        };
        let mut messages: Vec<(String, String)> = guard::messages(req.protocol, &req.body)
            .into_iter()
            .filter_map(|(role, content)| Some((role?, content)))
            .filter(|(_, content)| !content.is_empty())
            .collect();
        if messages.is_empty() {
            // No role-preserving form of this body: its text as one user message.
            let text = guard::request_content(req.protocol, &req.body).join(" ");
            if !text.is_empty() {
                messages.push(("user".into(), text));
            }
        }
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
        match g
            .moderate(&shape, &messages, "request", &c.request_message)
            .await
        {
            Some((code, body)) => {
                let ct = if req.stream {
                    "text/event-stream"
                } else {
                    "application/json"
                };
                Flow::Exit(
                    Exit::body(StatusCode::from_u16(code).unwrap_or(StatusCode::OK), body)
                        .with_header(header::CONTENT_TYPE, HeaderValue::from_static(ct)),
                )
            }
            None => Flow::Continue,
        }
    }
}

impl Plugin for LakeraGuard {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.access_async(ctx)))
    }
}

impl ResponseGuard for Guard {
    fn check_answer<'a>(&'a self, answer: Answer<'a>) -> GuardFuture<'a, Option<(u16, String)>> {
        Box::pin(async move {
            match answer.text {
                Some(t) if !t.is_empty() => self.moderate_response(answer.shape, t).await,
                _ => None,
            }
        })
    }

    fn stream(self: Arc<Self>, shape: DenyShape, _record: Arc<LlmRecord>) -> Box<dyn StreamGuard> {
        Box::new(LakeraStream {
            g: self,
            shape,
            buffer: BytesMut::new(),
            decided: None,
        })
    }
}

/// A streamed answer's screening.
struct LakeraStream {
    g: Arc<Guard>,
    shape: DenyShape,
    /// What was held back.
    buffer: BytesMut,
    /// `Some(true)`: blocked; `Some(false)`: clean (or screened in alert mode).
    decided: Option<bool>,
}

impl StreamGuard for LakeraStream {
    fn chunk<'a>(&'a mut self, chunk: &'a Chunk, body: Bytes) -> GuardFuture<'a, ChunkOut> {
        Box::pin(async move {
            let g = self.g.clone();
            let c = &g.conf;
            if c.alert && c.fail_open {
                // Nothing can block: the stream goes on, and is screened at its end.
                if chunk.done && self.decided.is_none() {
                    self.decided = Some(false);
                    match chunk.text.as_deref() {
                        Some(t) if !t.is_empty() => {
                            let _ = g.moderate_response(&self.shape, t).await;
                        }
                        _ => tracing::info!(
                            "ai-lakera-guard: alert mode could not scan the streamed response (no assembled completion)"
                        ),
                    }
                }
                return ChunkOut::Send(body);
            }
            match self.decided {
                Some(true) => return ChunkOut::Send(Bytes::from_static(KEEP_ALIVE)),
                Some(false) => return ChunkOut::Send(body),
                None => {}
            }
            self.buffer.extend_from_slice(&body);
            if !chunk.done {
                return ChunkOut::Send(Bytes::from_static(KEEP_ALIVE));
            }
            let held = std::mem::take(&mut self.buffer).freeze();
            match chunk.text.as_deref() {
                Some("") => {
                    self.decided = Some(false);
                    ChunkOut::Send(held)
                }
                None if c.fail_open => {
                    tracing::warn!(
                        "ai-lakera-guard: streamed response ended without an assembled completion (no upstream usage event?); fail_open=true, releasing unscanned"
                    );
                    self.decided = Some(false);
                    ChunkOut::Send(held)
                }
                None => {
                    tracing::error!(
                        "ai-lakera-guard: streamed response ended without an assembled completion (no upstream usage event?); fail_open=false, blocking response"
                    );
                    self.decided = Some(true);
                    ChunkOut::End(Bytes::from(g.deny(&self.shape, &c.response_message, None)))
                }
                Some(text) => match g.moderate_response(&self.shape, text).await {
                    Some((_, deny)) => {
                        self.decided = Some(true);
                        ChunkOut::End(Bytes::from(deny))
                    }
                    None => {
                        self.decided = Some(false);
                        ChunkOut::Send(held)
                    }
                },
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;

    use super::*;

    #[test]
    fn breakdown_shows_what_fired() {
        let b = vec![
            json!({"detector_type": "prompt_attack", "detected": true, "result": "l1_confident"}),
            json!({"detector_type": "pii/email", "detected": true}),
            json!({"detector_type": "moderated_content/hate", "detected": false}),
            json!("junk"),
        ];
        assert_eq!(
            format_breakdown(&b),
            vec!["prompt_attack (l1_confident)", "pii/email"]
        );
    }

    #[test]
    fn schema_rules() {
        let r = crate::PluginRegistry::builtin();
        let pre = "failed to check the configuration of plugin ai-lakera-guard err: ";
        assert!(r.check(NAME, &json!({"api_key": "k"})).is_ok());
        assert_eq!(
            r.check(NAME, &json!({})).unwrap_err(),
            format!("{pre}property \"api_key\" is required")
        );
        assert!(r.check(NAME, &json!({"api_key": ""})).is_err());
        assert!(r
            .check(NAME, &json!({"api_key": "k", "lakera_endpoint": "ftp://x"}))
            .is_err());
        assert!(r
            .check(NAME, &json!({"api_key": "k", "direction": "sideways"}))
            .is_err());
        assert!(r
            .check(NAME, &json!({"api_key": "k", "timeout": 0}))
            .is_err());
        assert_eq!(r.get(NAME).unwrap().priority, 1028);
    }
}
