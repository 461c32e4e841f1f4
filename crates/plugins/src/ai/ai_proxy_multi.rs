//! ai-proxy-multi (`apisix/plugins/ai-proxy-multi.lua`): ai-proxy over several instances.
//! The instances of the highest `priority` share the requests by `weight` (resty's
//! roundrobin); `fallback_strategy` moves a request on to the next instance when one
//! answers 429 (`http_429`), 5xx or cannot be reached (`http_5xx`), or one of
//! `fallback_http_statuses`, and with `instance_health_and_rate_limiting` (or
//! `rate_limiting`) skips instances whose ai-rate-limiting budget is spent.

use std::sync::Arc;

use ferrisix_plugin_api::roundrobin::InterleavedWrr;
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef, PluginServices, Step,
};
use http::StatusCode;
use serde_json::Value;

use crate::support::ai::call::{self, CallConf, Instance};
use crate::support::ai::{schema, start, AiRequest, Budget, LlmRecord, Logging, PickedInstance};

pub const NAME: &str = "ai-proxy-multi";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    version: 0.5,
    ..PluginDef::new(NAME, 1041, schema::ai_proxy_multi, compile)
};

fn instances(conf: &Value) -> &[Value] {
    conf.get("instances")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    let mut seen: Vec<&str> = Vec::new();
    for (i, inst) in instances(cx.conf).iter().enumerate() {
        let name = inst.get("name").and_then(Value::as_str).unwrap_or("?");
        if let Some(j) = seen.iter().position(|n| *n == name) {
            return Err(format!(
                "duplicate instance name '{name}' at instances[{}] and instances[{}]",
                j + 1,
                i + 1
            ));
        }
        seen.push(name);
        if let Some(e) = inst
            .get("override")
            .and_then(|o| o.get("endpoint"))
            .and_then(Value::as_str)
        {
            if !schema::valid_endpoint(e) {
                return Err("invalid endpoint".into());
            }
        }
        schema::check_gcp(inst)?;
        schema::provider_requirements(inst).map_err(|e| format!("instance '{name}': {e}"))?;
    }
    let balancer = cx.conf.get("balancer");
    let algo = balancer
        .and_then(|b| b.get("algorithm"))
        .and_then(Value::as_str);
    if algo == Some("chash") {
        let hash_on = balancer
            .and_then(|b| b.get("hash_on"))
            .and_then(Value::as_str)
            .unwrap_or("vars");
        if hash_on != "consumer" && balancer.and_then(|b| b.get("key")).is_none() {
            return Err(
                "must configure `hash_key` when balancer `hash_on` is not set to cookie".into(),
            );
        }
    }
    if algo == Some("semantic") {
        return Err("the semantic balancer algorithm is not supported by ferrisix".into());
    }
    Ok(())
}

/// What `fallback_strategy` falls back on.
#[derive(Clone, Copy, Debug, Default)]
struct Fallback {
    on_429: bool,
    on_5xx: bool,
    rate_limiting: bool,
}

/// The instances of one priority, balanced by weight.
#[derive(Debug)]
struct Group {
    members: Vec<usize>,
    wrr: InterleavedWrr,
}

#[derive(Debug)]
struct AiProxyMulti {
    instances: Vec<Instance>,
    /// Highest priority first.
    groups: Vec<Group>,
    fallback: Fallback,
    max_retries: Option<u64>,
    retry_within: Option<std::time::Duration>,
    call: CallConf,
    max_body: usize,
    logging: Logging,
    services: Arc<PluginServices>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let list = instances(&conf)
        .iter()
        .map(|i| {
            let name = i
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            Instance::from_conf(i, name)
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut priorities: Vec<i64> = list.iter().map(|i| i.priority).collect();
    priorities.sort_unstable_by(|a, b| b.cmp(a));
    priorities.dedup();
    let groups = priorities
        .into_iter()
        .map(|p| {
            let members: Vec<usize> = (0..list.len()).filter(|&i| list[i].priority == p).collect();
            let weights = members.iter().map(|&i| list[i].weight).collect();
            Group {
                members,
                wrr: InterleavedWrr::new(weights, None),
            }
        })
        .collect();
    let has = |name: &str| match conf.get("fallback_strategy") {
        Some(Value::String(s)) => s == name,
        Some(Value::Array(a)) => a.iter().any(|v| v.as_str() == Some(name)),
        _ => false,
    };
    let fallback = Fallback {
        on_429: has("http_429"),
        on_5xx: has("http_5xx"),
        rate_limiting: has("instance_health_and_rate_limiting") || has("rate_limiting"),
    };
    Ok(Arc::new(AiProxyMulti {
        instances: list,
        groups,
        fallback,
        max_retries: conf.get("max_retries").and_then(Value::as_u64),
        retry_within: conf
            .get("retry_on_failure_within_ms")
            .and_then(Value::as_u64)
            .map(std::time::Duration::from_millis),
        call: CallConf::from_conf(&conf).with_active_connections(cx.services),
        max_body: conf
            .get("max_req_body_size")
            .and_then(Value::as_u64)
            .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX)),
        logging: Logging::from_conf(&conf),
        services: cx.services.clone(),
    }))
}

/// The instances this request tried, and the one it is on.
#[derive(Debug, Default)]
struct Tries {
    tried: Vec<usize>,
    current: usize,
}

impl AiProxyMulti {
    /// The next instance by priority and weight among those not tried; with a rate-limiting
    /// fallback, one whose budget is spent counts as tried.
    fn pick(&self, ctx: &mut PluginCtx<'_>, tried: &mut Vec<usize>) -> Option<usize> {
        let budget = if self.fallback.rate_limiting {
            ctx.get::<Budget>().cloned()
        } else {
            None
        };
        for group in &self.groups {
            for _ in 0..group.members.len() * 2 + 2 {
                if group.members.iter().all(|m| tried.contains(m)) {
                    break;
                }
                let Some(i) = group.wrr.next() else { break };
                let idx = group.members[i];
                if tried.contains(&idx) {
                    continue;
                }
                if let Some(b) = &budget {
                    if !b.0.allows(ctx, &self.instances[idx].name) {
                        tracing::warn!(
                            "ai instance: {} is not available, try to pick another one",
                            self.instances[idx].name
                        );
                        tried.push(idx);
                        continue;
                    }
                }
                return Some(idx);
            }
        }
        None
    }

    async fn access_async(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        if let Err(exit) = start(ctx, self.max_body, self.logging).await {
            return Flow::Exit(exit);
        }
        let mut tried = Vec::new();
        let Some(idx) = self.pick(ctx, &mut tried) else {
            return Flow::Exit(Exit::body(
                StatusCode::SERVICE_UNAVAILABLE,
                "all servers tried",
            ));
        };
        ctx.insert(PickedInstance(
            self.instances[idx].name.clone(),
            self.instances[idx].identity.clone(),
        ));
        ctx.insert(Tries {
            tried,
            current: idx,
        });
        Flow::Continue
    }

    fn retries(&self, status: u16) -> bool {
        (status == 429 && self.fallback.on_429)
            || ((500..600).contains(&status) && self.fallback.on_5xx)
            || self.call.fallback_statuses.contains(&status)
    }

    async fn proxy(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let (Some(req), Some(record)) = (
            ctx.get::<AiRequest>().cloned(),
            ctx.get::<Arc<LlmRecord>>().cloned(),
        ) else {
            return Flow::Continue;
        };
        let Some(mut tries) = ctx.get_mut::<Tries>().map(std::mem::take) else {
            return Flow::Continue;
        };
        let started = std::time::Instant::now();
        let mut retried = 0;
        loop {
            let inst = &self.instances[tries.current];
            let exit = call::call(ctx, &self.services, inst, &self.call, &req, &record).await;
            let status = exit.status.as_u16();
            if !self.retries(status) {
                return Flow::Exit(exit);
            }
            if self.retry_within.is_some_and(|w| started.elapsed() > w) {
                return Flow::Exit(exit);
            }
            retried += 1;
            if self.max_retries.is_some_and(|m| retried > m) {
                return Flow::Exit(exit);
            }
            tries.tried.push(tries.current);
            let Some(next) = self.pick(ctx, &mut tries.tried) else {
                tracing::error!("failed to pick new AI instance: all servers tried");
                return Flow::Exit(Exit::status(StatusCode::BAD_GATEWAY));
            };
            tracing::warn!(
                "ai instance {} returned status {status}, falling back to {}",
                inst.name,
                self.instances[next].name
            );
            tries.current = next;
            ctx.insert(PickedInstance(
                self.instances[next].name.clone(),
                self.instances[next].identity.clone(),
            ));
        }
    }
}

impl Plugin for AiProxyMulti {
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
