//! client-control (`apisix/plugins/client-control.lua`): `max_body_size` sets nginx's
//! `client_max_body_size` for the route: a declared `Content-Length` above it is refused with
//! 413 at once, a streamed body when it passes the limit; 0 lifts every limit.

use std::sync::Arc;

use ferrisix_plugin_api::{CompileCtx, Exit, Phases, Plugin, PluginCtx, PluginDef, Step};
use http::StatusCode;
use serde_json::{json, Value};

pub const NAME: &str = "client-control";

pub static DEF: PluginDef = PluginDef::new(NAME, 22000, schema, compile);

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "max_body_size": {
                "type": "integer",
                "minimum": 0,
                "description": "Maximum message body size in bytes. No restriction when set to 0."
            }
        }
    })
}

#[derive(Debug)]
struct ClientControl {
    max_body_size: Option<u64>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(ClientControl {
        max_body_size: cx.conf.get("max_body_size").and_then(Value::as_u64),
    }))
}

impl Plugin for ClientControl {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let Some(max) = self.max_body_size else {
            return Step::CONTINUE;
        };
        let declared = ctx
            .header("content-length")
            .and_then(|v| v.trim().parse::<u64>().ok());
        if max != 0 && declared.is_some_and(|n| n > max) {
            return Step::exit(Exit::status(StatusCode::PAYLOAD_TOO_LARGE));
        }
        // nginx's client_max_body_size 0: no limit at all, also not the gateway's own.
        ctx.set_max_body_size(if max == 0 { u64::MAX } else { max });
        Step::CONTINUE
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::Flow;

    use super::*;
    use crate::testing::Compiler;

    fn run(conf: Value, mut req: TestRequest) -> (Option<Exit>, Option<u64>) {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "cc", None)).unwrap();
        let exit = match p.rewrite(&mut req.ctx()) {
            Step::Done(Flow::Exit(e)) => Some(e),
            _ => None,
        };
        (exit, req.state.max_body_size())
    }

    #[test]
    fn limits() {
        let (exit, limit) = run(
            json!({"max_body_size": 5}),
            TestRequest::get("/").header("content-length", "5"),
        );
        assert_eq!((exit, limit), (None, Some(5)));
        let (exit, _) = run(
            json!({"max_body_size": 5}),
            TestRequest::get("/").header("content-length", "6"),
        );
        assert_eq!(exit.unwrap().status, 413);
        let (exit, limit) = run(
            json!({"max_body_size": 0}),
            TestRequest::get("/").header("content-length", "60"),
        );
        assert_eq!((exit, limit), (None, Some(u64::MAX)));
        assert_eq!(run(json!({}), TestRequest::get("/")), (None, None));
        let r = crate::PluginRegistry::builtin();
        assert!(r.check(NAME, &json!({"max_body_size": -1})).is_err());
        assert!(r.check(NAME, &json!({"max_body_size": "1"})).is_err());
    }
}
