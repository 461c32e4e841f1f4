//! ai-prompt-guard (`apisix/plugins/ai-prompt-guard.lua`): checks the request's prompt
//! against `allow_patterns` (one must match) and `deny_patterns` (none may), by default the
//! last message and only when it is the user's (`match_all_conversation_history`,
//! `match_all_roles` widen it). A body that is no AI request is let through (`fail_mode`
//! `skip`, `warn`) or refused (`error`).

use std::sync::Arc;

use ferrisix_plugin_api::{CheckCtx, CompileCtx, Flow, Phases, Plugin, PluginCtx, PluginDef, Step};
use http::StatusCode;
use regex::Regex;
use serde_json::{json, Value};

use crate::support::ai::message_exit;
use crate::support::ai::protocol::Protocol;
use crate::support::pcre;

pub const NAME: &str = "ai-prompt-guard";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    ..PluginDef::new(NAME, 1072, schema, compile)
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "max_req_body_size": {"type": "integer", "minimum": 1, "default": 67108864},
            "match_all_roles": {"type": "boolean", "default": false},
            "match_all_conversation_history": {"type": "boolean", "default": false},
            "allow_patterns": {"type": "array", "items": {"type": "string"}, "default": []},
            "deny_patterns": {"type": "array", "items": {"type": "string"}, "default": []},
            "fail_mode": {"type": "string", "enum": ["skip", "warn", "error"], "default": "skip"}
        }
    })
}

fn patterns<'a>(conf: &'a Value, key: &str) -> Vec<&'a str> {
    conf.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    for p in patterns(cx.conf, "allow_patterns") {
        pcre::compile(p, false).map_err(|_| format!("invalid allow_pattern: {p}"))?;
    }
    for p in patterns(cx.conf, "deny_patterns") {
        pcre::compile(p, false).map_err(|_| format!("invalid deny_pattern: {p}"))?;
    }
    Ok(())
}

#[derive(Debug)]
struct AiPromptGuard {
    allow: Vec<Regex>,
    deny: Vec<Regex>,
    all_roles: bool,
    all_history: bool,
    fail_error: bool,
    max_body: usize,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let compile_all = |key: &str| -> Result<Vec<Regex>, String> {
        patterns(&conf, key)
            .into_iter()
            .map(|p| pcre::compile(p, false))
            .collect()
    };
    Ok(Arc::new(AiPromptGuard {
        allow: compile_all("allow_patterns")?,
        deny: compile_all("deny_patterns")?,
        all_roles: conf.get("match_all_roles").and_then(Value::as_bool) == Some(true),
        all_history: conf
            .get("match_all_conversation_history")
            .and_then(Value::as_bool)
            == Some(true),
        fail_error: conf.get("fail_mode").and_then(Value::as_str) == Some("error"),
        max_body: conf
            .get("max_req_body_size")
            .and_then(Value::as_u64)
            .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX)),
    }))
}

/// The verdict on a prompt.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Pass,
    NotAllowed,
    Denied,
}

impl AiPromptGuard {
    fn judge(&self, protocol: Protocol, body: &Value) -> Verdict {
        let mut messages = protocol.messages(body);
        if protocol != Protocol::OpenAiResponses && !self.all_history {
            let last = messages.pop();
            messages = last.into_iter().collect();
        }
        if !self.all_roles {
            messages.retain(|(role, _)| role == "user");
        }
        if messages.is_empty() {
            return Verdict::Pass;
        }
        let text = messages
            .iter()
            .map(|(_, c)| c.as_str())
            .collect::<Vec<_>>()
            .join(" ");
        if !self.allow.is_empty() && !self.allow.iter().any(|r| r.is_match(&text)) {
            return Verdict::NotAllowed;
        }
        if self.deny.iter().any(|r| r.is_match(&text)) {
            return Verdict::Denied;
        }
        Verdict::Pass
    }

    async fn run(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let bytes = match ctx.read_body(self.max_body).await {
            Ok(b) if !b.is_empty() => b.clone(),
            _ => return Flow::Exit(message_exit(StatusCode::BAD_REQUEST, "Empty request body")),
        };
        let body = match serde_json::from_slice::<Value>(&bytes) {
            Ok(b) => b,
            Err(e) if self.fail_error => {
                return Flow::Exit(message_exit(StatusCode::BAD_REQUEST, &e.to_string()))
            }
            Err(_) => return Flow::Continue,
        };
        let protocol = match Protocol::detect(&body, ctx.uri()) {
            Some(p) if p != Protocol::Passthrough => p,
            _ if self.fail_error => {
                return Flow::Exit(message_exit(
                    StatusCode::BAD_REQUEST,
                    "Request format not recognized by ai-prompt-guard",
                ))
            }
            _ => return Flow::Continue,
        };
        match self.judge(protocol, &body) {
            Verdict::Pass => Flow::Continue,
            Verdict::NotAllowed => Flow::Exit(message_exit(
                StatusCode::BAD_REQUEST,
                "Request doesn't match allow patterns",
            )),
            Verdict::Denied => Flow::Exit(message_exit(
                StatusCode::BAD_REQUEST,
                "Request contains prohibited content",
            )),
        }
    }
}

impl Plugin for AiPromptGuard {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.run(ctx)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(allow: &[&str], deny: &[&str]) -> AiPromptGuard {
        AiPromptGuard {
            allow: allow
                .iter()
                .map(|p| pcre::compile(p, false).unwrap())
                .collect(),
            deny: deny
                .iter()
                .map(|p| pcre::compile(p, false).unwrap())
                .collect(),
            all_roles: false,
            all_history: false,
            fail_error: false,
            max_body: 1024,
        }
    }

    #[test]
    fn last_user_message_judged() {
        let g = guard(&["^Hi"], &["password"]);
        let chat = |m: Value| json!({"messages": m});
        let one = |t: &str| chat(json!([{"role": "user", "content": t}]));
        assert_eq!(
            g.judge(Protocol::OpenAiChat, &one("Hi there")),
            Verdict::Pass
        );
        assert_eq!(
            g.judge(Protocol::OpenAiChat, &one("hello")),
            Verdict::NotAllowed
        );
        assert_eq!(
            g.judge(Protocol::OpenAiChat, &one("Hi, password")),
            Verdict::Denied
        );
        let history = chat(json!([{"role": "user", "content": "password"},
                                  {"role": "user", "content": "Hi"}]));
        assert_eq!(g.judge(Protocol::OpenAiChat, &history), Verdict::Pass);
        let assistant_last = chat(json!([{"role": "assistant", "content": "password"}]));
        assert_eq!(
            g.judge(Protocol::OpenAiChat, &assistant_last),
            Verdict::Pass
        );
    }
}
