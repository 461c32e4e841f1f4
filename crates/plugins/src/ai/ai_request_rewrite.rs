//! ai-request-rewrite (`apisix/plugins/ai-request-rewrite.lua`): sends `prompt` (as the
//! system message) and the client's body (as the user's) to an LLM and sends the LLM's
//! answer upstream as the new request body. Any failure of the LLM answers 500.

use std::sync::Arc;

use bytes::Bytes;
use ferrisix_plugin_api::{
    CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef, PluginServices, SchemaErrorFn,
    Step,
};
use http::StatusCode;
use serde_json::{json, Value};

use crate::support::ai::call::{simple_chat, CallConf, Instance};
use crate::support::ai::{schema, set_body};

pub const NAME: &str = "ai-request-rewrite";

pub static DEF: PluginDef = PluginDef {
    schema_error: Some(endpoint_first as SchemaErrorFn),
    check: Some(check),
    ..PluginDef::new(NAME, 1073, conf_schema, compile)
};

fn conf_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "max_req_body_size": {"type": "integer", "minimum": 1, "default": 67108864},
            "prompt": {"type": "string"},
            "provider": {"type": "string", "enum": schema::providers()},
            "auth": schema::auth(),
            "options": schema::options(),
            "timeout": {"type": "integer", "minimum": 1, "maximum": 60000, "default": 30000},
            "keepalive": {"type": "boolean", "default": true},
            "keepalive_pool": {"type": "integer", "minimum": 1, "default": 30},
            "ssl_verify": {"type": "boolean", "default": true},
            "override": {"type": "object", "properties": {"endpoint": {"type": "string"}}}
        },
        "required": ["prompt", "provider", "auth"]
    })
}

/// APISIX checks openai-compatible's endpoint before the schema.
fn endpoint_missing(conf: &Value) -> bool {
    conf.get("provider").and_then(Value::as_str) == Some("openai-compatible")
        && conf
            .get("override")
            .and_then(|o| o.get("endpoint"))
            .is_none()
}

const ENDPOINT_REQUIRED: &str = "override.endpoint is required for openai-compatible provider";

fn endpoint_first(cx: &ferrisix_plugin_api::CheckCtx<'_>, schema_error: String) -> String {
    if endpoint_missing(cx.conf) {
        ENDPOINT_REQUIRED.into()
    } else {
        schema_error
    }
}

fn check(cx: &ferrisix_plugin_api::CheckCtx<'_>) -> Result<(), String> {
    if endpoint_missing(cx.conf) {
        return Err(ENDPOINT_REQUIRED.into());
    }
    Ok(())
}

#[derive(Debug)]
struct AiRequestRewrite {
    prompt: String,
    instance: Instance,
    call: CallConf,
    max_body: usize,
    services: Arc<PluginServices>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    Ok(Arc::new(AiRequestRewrite {
        prompt: conf
            .get("prompt")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        instance: Instance::from_conf(&conf, NAME.into())?,
        call: CallConf::from_conf(&conf),
        max_body: conf
            .get("max_req_body_size")
            .and_then(Value::as_u64)
            .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX)),
        services: cx.services.clone(),
    }))
}

impl AiRequestRewrite {
    async fn run(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let body = match ctx.read_body(self.max_body).await {
            Ok(b) if !b.is_empty() => b.clone(),
            _ => return Flow::Exit(Exit::status(StatusCode::BAD_REQUEST)),
        };
        let mut messages = Vec::new();
        if !self.prompt.is_empty() {
            messages.push(json!({"role": "system", "content": self.prompt}));
        }
        messages.push(json!({"role": "user", "content": String::from_utf8_lossy(&body)}));
        let chat = json!({ "messages": messages });
        match simple_chat(&self.services, &self.instance, &self.call, chat).await {
            Ok(text) => {
                set_body(ctx, Bytes::from(text));
                Flow::Continue
            }
            Err(e) => {
                tracing::error!("failed to request LLM: {e}");
                Flow::Exit(Exit::status(StatusCode::INTERNAL_SERVER_ERROR))
            }
        }
    }
}

impl Plugin for AiRequestRewrite {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.run(ctx)))
    }
}
