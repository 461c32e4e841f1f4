//! proxy-control (`apisix/plugins/proxy-control.lua`): `request_buffering` sets nginx's
//! `proxy_request_buffering` for the route: `true` (the default) reads small bodies before the
//! request goes upstream, `false` streams every body as it arrives.

use std::sync::Arc;

use ferrisix_plugin_api::{CompileCtx, Phases, Plugin, PluginCtx, PluginDef, Step};
use serde_json::{json, Value};

pub const NAME: &str = "proxy-control";

pub static DEF: PluginDef = PluginDef::new(NAME, 21990, schema, compile);

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "request_buffering": {"type": "boolean", "default": true}
        }
    })
}

#[derive(Debug)]
struct ProxyControl {
    request_buffering: bool,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(ProxyControl {
        request_buffering: cx.filled()["request_buffering"].as_bool().unwrap_or(true),
    }))
}

impl Plugin for ProxyControl {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        ctx.set_request_buffering(self.request_buffering);
        Step::CONTINUE
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_plugin_api::testing::TestRequest;

    use super::*;
    use crate::testing::Compiler;

    #[test]
    fn sets_buffering() {
        let c = Compiler::new();
        for (conf, want) in [
            (json!({}), true),
            (json!({"request_buffering": false}), false),
        ] {
            let p = (DEF.compile)(&c.cx(NAME, &conf, "pc", None)).unwrap();
            let mut req = TestRequest::get("/");
            let _ = p.rewrite(&mut req.ctx());
            assert_eq!(req.state.request_buffering(), Some(want));
        }
    }
}
