//! ai-proxy (`apisix/plugins/ai-proxy.lua`): sends the request to one LLM provider instead
//! of the upstream. `access` reads the body and detects its protocol (APISIX's 400s for a
//! body that is none), `before_proxy` calls the provider (`support::ai::call`) and answers
//! with what it said; `logging` puts the call's summary and payloads in the loggers'
//! entries.

use std::sync::Arc;

use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, Flow, Phases, Plugin, PluginCtx, PluginDef, PluginServices, Step,
};
use serde_json::Value;

use crate::support::ai::call::{self, CallConf, Instance};
use crate::support::ai::{self, schema, AiRequest, LlmRecord, Logging, PickedInstance};

pub const NAME: &str = "ai-proxy";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    version: 0.5,
    ..PluginDef::new(NAME, 1040, schema::ai_proxy, compile)
};

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    schema::check_gcp(cx.conf)?;
    schema::provider_requirements(cx.conf)
}

#[derive(Debug)]
struct AiProxy {
    instance: Instance,
    call: CallConf,
    max_body: usize,
    logging: Logging,
    services: Arc<PluginServices>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let provider = conf.get("provider").and_then(Value::as_str).unwrap_or("");
    let instance = Instance::from_conf(&conf, format!("ai-proxy-{provider}"))?;
    Ok(Arc::new(AiProxy {
        instance,
        call: CallConf::from_conf(&conf).with_active_connections(cx.services),
        max_body: conf
            .get("max_req_body_size")
            .and_then(Value::as_u64)
            .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX)),
        logging: Logging::from_conf(&conf),
        services: cx.services.clone(),
    }))
}

impl AiProxy {
    async fn access_async(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        if let Err(exit) = ai::start(ctx, self.max_body, self.logging).await {
            return Flow::Exit(exit);
        }
        ctx.insert(PickedInstance(
            self.instance.name.clone(),
            self.instance.identity.clone(),
        ));
        Flow::Continue
    }

    async fn proxy(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let (Some(req), Some(record)) = (
            ctx.get::<AiRequest>().cloned(),
            ctx.get::<Arc<LlmRecord>>().cloned(),
        ) else {
            return Flow::Continue;
        };
        let exit = call::call(
            ctx,
            &self.services,
            &self.instance,
            &self.call,
            &req,
            &record,
        )
        .await;
        Flow::Exit(exit)
    }
}

impl Plugin for AiProxy {
    fn phases(&self) -> Phases {
        Phases::ACCESS | Phases::BEFORE_PROXY | Phases::UPSTREAM
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.access_async(ctx)))
    }

    fn before_proxy<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.proxy(ctx)))
    }
}
