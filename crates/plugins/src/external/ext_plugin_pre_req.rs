//! ext-plugin-pre-req (`apisix/plugins/ext-plugin-pre-req.lua`): asks the runner about the
//! request in the rewrite phase, before every other plugin (priority 12000); its answer stops
//! the request or rewrites it.

use std::sync::Arc;

use ferrisix_plugin_api::{CompileCtx, Phases, Plugin, PluginCtx, PluginDef, Step};
use serde_json::Value;

use super::runner::{self, RunnerClient};

pub const NAME: &str = "ext-plugin-pre-req";

pub static DEF: PluginDef = PluginDef::new(NAME, 12000, schema, compile);

fn schema() -> Value {
    runner::schema()
}

struct PreReq(RunnerClient);

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let key = format!("{}#{NAME}", cx.state_key());
    Ok(Arc::new(PreReq(RunnerClient::new(
        NAME,
        key,
        &cx.filled(),
        cx.services,
    ))))
}

impl Plugin for PreReq {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.0.communicate_req(ctx)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::PluginRegistry;
    use ferrisix_config::validate::PluginCheck;
    use serde_json::json;

    #[test]
    fn schema_as_apisix() {
        let r = PluginRegistry::builtin();
        assert!(r
            .check(NAME, &json!({"conf": [{"name": "a", "value": "b"}]}))
            .is_ok());
        assert!(r.check(NAME, &json!({})).is_ok());
        for bad in [
            json!({"conf": []}),
            json!({"conf": [{"name": "a"}]}),
            json!({"conf": [{"name": "", "value": "b"}]}),
            json!({"allow_degradation": "yes"}),
        ] {
            assert!(r.check(NAME, &bad).is_err(), "{bad}");
        }
        assert_eq!(DEF.priority, 12000);
    }
}
