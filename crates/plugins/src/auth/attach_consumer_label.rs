//! attach-consumer-label (`apisix/plugins/attach-consumer-label.lua`): before the request goes
//! upstream, each configured header (`headers`: name -> `$label`) is set to the value of the
//! authenticated consumer's label, or removed when the consumer has no such label or there is
//! no consumer, so a client cannot pass its own copy.

use std::sync::Arc;

use ferrisix_plugin_api::{CompileCtx, Phases, Plugin, PluginCtx, PluginDef, Step};
use http::{HeaderName, HeaderValue};
use serde_json::{json, Value};

pub const NAME: &str = "attach-consumer-label";

pub static DEF: PluginDef = PluginDef::new(NAME, 2399, schema, compile);

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "headers": {
                "type": "object",
                "additionalProperties": {"type": "string", "pattern": "^\\$.*"},
                "minProperties": 1
            }
        },
        "required": ["headers"]
    })
}

#[derive(Debug)]
struct AttachConsumerLabel {
    /// (header, label name without its `$`); a header name no request can carry is left out.
    headers: Vec<(HeaderName, String)>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let headers = cx
        .conf
        .get("headers")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(name, label)| {
            let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
            let label = label.as_str()?.strip_prefix('$')?.to_owned();
            Some((name, label))
        })
        .collect();
    Ok(Arc::new(AttachConsumerLabel { headers }))
}

impl Plugin for AttachConsumerLabel {
    fn phases(&self) -> Phases {
        Phases::BEFORE_PROXY
    }

    fn before_proxy<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let consumer = ctx.consumer().cloned();
        let headers = ctx.headers_mut();
        for (name, label) in &self.headers {
            let value = consumer
                .as_ref()
                .and_then(|c| c.labels.get(label))
                .and_then(Value::as_str)
                .and_then(|v| HeaderValue::from_str(v).ok());
            match value {
                Some(v) => {
                    headers.insert(name.clone(), v);
                }
                None => {
                    headers.remove(name);
                }
            }
        }
        Step::CONTINUE
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::Consumer;

    use super::*;
    use crate::testing::Compiler;

    #[test]
    fn labels_become_headers_and_client_copies_go() {
        let c = Compiler::new();
        let conf = json!({"headers": {"X-Dept": "$department", "X-Role": "$role"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "acl", None)).unwrap();
        let mut req = TestRequest::get("/")
            .header("x-role", "admin")
            .header("x-dept", "x");
        {
            let mut ctx = req.ctx();
            ctx.attach_consumer(Arc::new(Consumer {
                username: "jack".into(),
                labels: json!({"department": "devops"})
                    .as_object()
                    .cloned()
                    .unwrap(),
                ..Default::default()
            }));
            let _ = p.before_proxy(&mut ctx);
        }
        assert_eq!(req.headers["x-dept"], "devops");
        assert!(req.headers.get("x-role").is_none());
        // No consumer: every configured header goes.
        let mut req = TestRequest::get("/").header("x-dept", "forged");
        let _ = p.before_proxy(&mut req.ctx());
        assert!(req.headers.get("x-dept").is_none());
    }

    #[test]
    fn schema_messages() {
        let c = Compiler::new();
        assert_eq!(
            c.registry.check(NAME, &json!({})).unwrap_err(),
            "failed to check the configuration of plugin attach-consumer-label err: property \"headers\" is required"
        );
        assert!(c
            .registry
            .check(NAME, &json!({"headers": {"X-A": "nodollar"}}))
            .is_err());
    }
}
