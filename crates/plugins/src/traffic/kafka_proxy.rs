//! kafka-proxy (`apisix/plugins/kafka-proxy.lua`): on a route whose upstream has
//! `scheme: kafka`, `sasl` (`username`, `password`) makes the pub-sub connection to the
//! brokers authenticate with SASL/PLAIN. Its access phase keeps the credentials for the
//! request; the proxy's kafka path (`crate::pubsub::kafka`) reads them. `sasl.password` is
//! stored encrypted with `data_encryption`.

use std::sync::Arc;

use ferrisix_plugin_api::{CompileCtx, Phases, Plugin, PluginCtx, PluginDef, Step};
use serde_json::{json, Value};

use crate::pubsub::kafka::KafkaSasl;

pub const NAME: &str = "kafka-proxy";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &["sasl.password"],
    ..PluginDef::new(NAME, 508, schema, compile)
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "sasl": {
                "type": "object",
                "properties": {
                    "username": {"type": "string"},
                    "password": {"type": "string"}
                },
                "required": ["username", "password"]
            }
        }
    })
}

#[derive(Debug)]
struct KafkaProxy {
    sasl: Option<KafkaSasl>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let sasl = conf.get("sasl").map(|s| {
        let text = |k: &str| s[k].as_str().unwrap_or_default().to_owned();
        KafkaSasl {
            username: text("username"),
            password: text("password"),
        }
    });
    Ok(Arc::new(KafkaProxy { sasl }))
}

impl Plugin for KafkaProxy {
    fn phases(&self) -> Phases {
        if self.sasl.is_some() {
            Phases::ACCESS
        } else {
            Phases::NONE
        }
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        if let Some(sasl) = &self.sasl {
            ctx.insert(sasl.clone());
        }
        Step::CONTINUE
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_plugin_api::testing::TestRequest;

    use super::*;
    use crate::testing::Compiler;

    #[test]
    fn schema_as_apisix() {
        let schema = schema();
        for (conf, want) in [
            (json!({}), Ok(())),
            (json!({"sasl": {"username": "user", "password": "pwd"}}), Ok(())),
            (
                json!({"sasl": {"username": "user"}}),
                Err("property \"sasl\" validation failed: property \"password\" is required"),
            ),
            (
                json!({"sasl": {"username": "user", "password": 1234}}),
                Err("property \"sasl\" validation failed: property \"password\" validation failed: wrong type: expected string, got number"),
            ),
        ] {
            let got = ferrisix_config::schema::validate(&schema, &conf);
            assert_eq!(got.as_ref().map_err(|e| e.as_str()), want.as_ref().map_err(|e| *e), "{conf}");
        }
    }

    #[test]
    fn keeps_the_credentials() {
        let c = Compiler::new();
        let conf = json!({"sasl": {"username": "admin", "password": "admin-secret"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "kp", None)).unwrap();
        assert!(p.phases().contains(Phases::ACCESS));
        let mut req = TestRequest::get("/");
        let _ = p.access(&mut req.ctx());
        let sasl = req.state.value::<KafkaSasl>().unwrap();
        assert_eq!(
            (&*sasl.username, &*sasl.password),
            ("admin", "admin-secret")
        );

        let p = (DEF.compile)(&c.cx(NAME, &json!({}), "kp", None)).unwrap();
        assert!(p.phases().is_empty());
    }
}
