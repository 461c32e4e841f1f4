//! ai-prompt-decorator (`apisix/plugins/ai-prompt-decorator.lua`): puts the `prepend`
//! messages before the request's `messages` and the `append` ones after them, on every
//! request anew; the body's other fields stay.

use std::sync::Arc;

use bytes::Bytes;
use ferrisix_plugin_api::{CompileCtx, Flow, Phases, Plugin, PluginCtx, PluginDef, Step};
use serde_json::{json, Value};

use crate::support::ai::{json_body, prompt_schema, set_body};

pub const NAME: &str = "ai-prompt-decorator";

pub static DEF: PluginDef = PluginDef::new(NAME, 1070, schema, compile);

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "max_req_body_size": {"type": "integer", "minimum": 1, "default": 67108864},
            "prepend": {"type": "array", "items": prompt_schema()},
            "append": {"type": "array", "items": prompt_schema()}
        },
        "anyOf": [
            {"required": ["prepend"]},
            {"required": ["append"]},
            {"required": ["append", "prepend"]}
        ]
    })
}

#[derive(Debug)]
struct AiPromptDecorator {
    prepend: Vec<Value>,
    append: Vec<Value>,
    max_body: usize,
}

fn messages(conf: &Value, key: &str) -> Vec<Value> {
    conf.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|m| json!({"role": m.get("role"), "content": m.get("content")}))
        .collect()
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    Ok(Arc::new(AiPromptDecorator {
        prepend: messages(&conf, "prepend"),
        append: messages(&conf, "append"),
        max_body: conf
            .get("max_req_body_size")
            .and_then(Value::as_u64)
            .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX)),
    }))
}

impl AiPromptDecorator {
    fn decorate(&self, body: &mut Value) {
        let Some(obj) = body.as_object_mut() else {
            return;
        };
        if self.prepend.is_empty() && self.append.is_empty() {
            return;
        }
        let old = match obj.remove("messages") {
            Some(Value::Array(a)) => a,
            _ => Vec::new(),
        };
        let mut list = self.prepend.clone();
        list.extend(old);
        list.extend(self.append.iter().cloned());
        obj.insert("messages".into(), Value::Array(list));
    }

    async fn run(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let mut body = match json_body(ctx, self.max_body).await {
            Ok((b, _)) => b,
            Err(e) => return Flow::Exit(e),
        };
        self.decorate(&mut body);
        set_body(ctx, Bytes::from(body.to_string()));
        Flow::Continue
    }
}

impl Plugin for AiPromptDecorator {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.run(ctx)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepends_and_appends_around_the_chat() {
        let conf = json!({"prepend": [{"role": "system", "content": "S"}],
                          "append": [{"role": "user", "content": "A"}]});
        let d = AiPromptDecorator {
            prepend: messages(&conf, "prepend"),
            append: messages(&conf, "append"),
            max_body: 1024,
        };
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "Q"}]});
        d.decorate(&mut body);
        assert_eq!(
            body,
            json!({"model": "m", "messages": [{"role": "system", "content": "S"},
                {"role": "user", "content": "Q"}, {"role": "user", "content": "A"}]})
        );
    }
}
