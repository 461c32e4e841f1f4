//! ai-prompt-template (`apisix/plugins/ai-prompt-template.lua`): the request body names one
//! of `templates` in `template_name`; the body becomes that template, each `{{ name }}` in
//! its texts filled with the body's field `name`.

use std::sync::Arc;

use bytes::Bytes;
use ferrisix_plugin_api::{CompileCtx, Flow, Phases, Plugin, PluginCtx, PluginDef, Step};
use http::StatusCode;
use serde_json::{json, Map, Value};

use crate::support::ai::{json_body, message_exit, prompt_schema, set_body};

pub const NAME: &str = "ai-prompt-template";

pub static DEF: PluginDef = PluginDef::new(NAME, 1071, schema, compile);

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "max_req_body_size": {"type": "integer", "minimum": 1, "default": 67108864},
            "templates": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "template": {
                            "type": "object",
                            "properties": {
                                "model": {"type": "string", "minLength": 1},
                                "messages": {"type": "array", "minItems": 1, "items": prompt_schema()}
                            }
                        }
                    },
                    "required": ["name", "template"]
                }
            }
        },
        "required": ["templates"]
    })
}

#[derive(Debug)]
struct AiPromptTemplate {
    templates: Vec<(String, Value)>,
    max_body: usize,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let templates = conf
        .get("templates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| {
            Some((
                t.get("name")?.as_str()?.to_owned(),
                t.get("template")?.clone(),
            ))
        })
        .collect();
    Ok(Arc::new(AiPromptTemplate {
        templates,
        max_body: conf
            .get("max_req_body_size")
            .and_then(Value::as_u64)
            .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX)),
    }))
}

/// `text` with each `{{ name }}` replaced by the body's `name` (a string as it is, another
/// value as JSON, nothing when absent).
fn fill(text: &str, vars: &Map<String, Value>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let Some(end) = rest[start + 2..].find("}}") else {
            break;
        };
        out.push_str(&rest[..start]);
        let name = rest[start + 2..start + 2 + end].trim();
        match vars.get(name) {
            Some(Value::String(s)) => out.push_str(s),
            Some(Value::Null) | None => {}
            Some(v) => out.push_str(&v.to_string()),
        }
        rest = &rest[start + 2 + end + 2..];
    }
    out.push_str(rest);
    out
}

fn render(template: &Value, vars: &Map<String, Value>) -> Value {
    match template {
        Value::String(s) => Value::String(fill(s, vars)),
        Value::Array(a) => Value::Array(a.iter().map(|v| render(v, vars)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), render(v, vars)))
                .collect(),
        ),
        other => other.clone(),
    }
}

impl AiPromptTemplate {
    async fn run(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let body = match json_body(ctx, self.max_body).await {
            Ok((b, _)) => b,
            Err(e) => return Flow::Exit(e),
        };
        let empty = Map::new();
        let vars = body.as_object().unwrap_or(&empty);
        let Some(name) = vars.get("template_name").and_then(Value::as_str) else {
            return Flow::Exit(message_exit(
                StatusCode::BAD_REQUEST,
                "template name is missing in request.",
            ));
        };
        let Some((_, template)) = self.templates.iter().find(|(n, _)| n == name) else {
            return Flow::Exit(message_exit(
                StatusCode::BAD_REQUEST,
                &format!("template: {name} not configured."),
            ));
        };
        let rendered = render(template, vars);
        set_body(ctx, Bytes::from(rendered.to_string()));
        Flow::Continue
    }
}

impl Plugin for AiPromptTemplate {
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
    fn placeholders_filled_from_the_body() {
        let vars = json!({"language": "python", "n": 3})
            .as_object()
            .cloned()
            .unwrap();
        assert_eq!(
            fill("a {{ language }} / {{n}} / {{ missing }}.", &vars),
            "a python / 3 / ."
        );
        let t = json!({"model": "m", "messages": [{"role": "user", "content": "{{ language }}"}]});
        assert_eq!(render(&t, &vars)["messages"][0]["content"], "python");
    }
}
