//! ai-rate-limiting (`apisix/plugins/ai-rate-limiting.lua`): token budgets for the AI
//! instances of ai-proxy and ai-proxy-multi. A budget is `limit` tokens per `time_window`
//! seconds, for every instance (`limit`) or one named instance (`instances`); `access`
//! refuses a request whose instance spent its budget (`rejected_code`, `rejected_msg`) and
//! tells what is left in `X-AI-RateLimit-{Limit,Remaining,Reset}-<instance>`; the log phase
//! spends the answer's total, prompt or completion tokens (`limit_strategy`), read from the
//! answer or from its stream's usage. ai-proxy-multi asks the same budgets before it picks an
//! instance (`Budget`). Budgets are kept per gateway, keyed by the route and the conf, in
//! windows that start with their first request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ferrisix_plugin_api::{
    CheckCtx, Clock, CompileCtx, Exit, LogCtx, Phases, Plugin, PluginCtx, PluginDef,
    PluginServices, SharedState, Step,
};
use http::{HeaderName, HeaderValue};
use serde_json::{json, Value};

use crate::support::ai::{Budget, InstanceBudget, LlmRecord, PickedInstance};

pub const NAME: &str = "ai-rate-limiting";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    ..PluginDef::new(NAME, 1030, schema, compile)
};

fn int_or_string() -> Value {
    json!({"oneOf": [{"type": "integer", "exclusiveMinimum": 0}, {"type": "string"}]})
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "limit": int_or_string(),
            "time_window": int_or_string(),
            "show_limit_quota_header": {"type": "boolean", "default": true},
            "limit_strategy": {
                "type": "string",
                "enum": ["total_tokens", "prompt_tokens", "completion_tokens", "expression"],
                "default": "total_tokens"
            },
            "cost_expr": {"type": "string", "minLength": 1},
            "instances": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "limit": {"oneOf": [{"type": "integer", "minimum": 1}, {"type": "string"}]},
                        "time_window": {"oneOf": [{"type": "integer", "minimum": 1}, {"type": "string"}]}
                    },
                    "required": ["name", "limit", "time_window"]
                }
            },
            "rejected_code": {"type": "integer", "minimum": 200, "maximum": 599, "default": 503},
            "rejected_msg": {"type": "string", "minLength": 1},
            "policy": {
                "type": "string",
                "enum": ["local", "redis", "redis-cluster", "redis-sentinel"],
                "default": "local"
            },
            "allow_degradation": {"type": "boolean", "default": false}
        },
        "dependencies": {"limit": ["time_window"], "time_window": ["limit"]},
        "anyOf": [{"required": ["limit", "time_window"]}, {"required": ["instances"]}]
    })
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    if cx.conf.get("limit_strategy").and_then(Value::as_str) == Some("expression") {
        return Err("limit_strategy 'expression' (cost_expr) is not supported by ferrisix".into());
    }
    if let Some(p) = cx
        .conf
        .get("policy")
        .and_then(Value::as_str)
        .filter(|p| *p != "local")
    {
        return Err(format!(
            "policy {p} is not supported by ferrisix (only local)"
        ));
    }
    if cx.conf.get("rules").is_some() {
        return Err("rules are not supported by ferrisix".into());
    }
    Ok(())
}

/// A number of the conf: an integer, or a string holding one.
fn number(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// One budget: `limit` tokens per `window_ms`.
#[derive(Clone, Debug)]
struct Limit {
    limit: u64,
    window_ms: u64,
    /// Which counter: the instance's own, or `#global` for the plugin's `limit`.
    key: String,
}

/// The budgets' windows of one gateway.
#[derive(Debug, Default)]
struct Budgets {
    windows: Mutex<HashMap<String, Window>>,
}

#[derive(Clone, Copy, Debug)]
struct Window {
    ends_ms: u64,
    used: u64,
}

impl SharedState for Budgets {
    fn create(_: &PluginServices) -> Self {
        Budgets::default()
    }
}

impl Budgets {
    /// The tokens used in the window of `key` and when it ends (a new window when the last
    /// one ended).
    fn state(&self, key: &str, window_ms: u64, now: u64, spend: u64) -> Window {
        let mut map = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() > 100_000 {
            map.retain(|_, w| w.ends_ms > now);
        }
        let w = map.entry(key.to_owned()).or_insert(Window {
            ends_ms: now + window_ms,
            used: 0,
        });
        if w.ends_ms <= now {
            *w = Window {
                ends_ms: now + window_ms,
                used: 0,
            };
        }
        w.used = w.used.saturating_add(spend);
        *w
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Strategy {
    Total,
    Prompt,
    Completion,
}

#[derive(Debug)]
struct Inner {
    global: Option<(u64, u64)>,
    instances: Vec<(String, Limit)>,
    strategy: Strategy,
    show_headers: bool,
    rejection: Exit,
    budgets: Arc<Budgets>,
    clock: Clock,
    state_key: String,
}

impl Inner {
    fn limit_of(&self, instance: &str) -> Option<Limit> {
        if let Some((_, l)) = self.instances.iter().find(|(n, _)| n == instance) {
            return Some(l.clone());
        }
        let (limit, window) = self.global?;
        Some(Limit {
            limit,
            window_ms: window * 1000,
            key: "#global".into(),
        })
    }

    fn counter(&self, l: &Limit) -> String {
        format!("{}#{}", self.state_key, l.key)
    }

    /// Whether `instance` has budget left, its headers set on the answer.
    fn check(&self, ctx: &mut PluginCtx<'_>, instance: &str) -> bool {
        let Some(l) = self.limit_of(instance) else {
            return true;
        };
        let now = self.clock.mono_ms();
        let w = self.budgets.state(&self.counter(&l), l.window_ms, now, 0);
        let remaining = l.limit.saturating_sub(w.used);
        if self.show_headers {
            let reset = (w.ends_ms.saturating_sub(now)).div_ceil(1000);
            let headers = ctx.response_headers_mut();
            for (prefix, value) in [
                ("x-ai-ratelimit-limit-", l.limit),
                ("x-ai-ratelimit-remaining-", remaining),
                ("x-ai-ratelimit-reset-", reset),
            ] {
                let name = format!("{prefix}{}", instance.to_ascii_lowercase());
                if let Ok(name) = HeaderName::from_bytes(name.as_bytes()) {
                    headers.insert(name, HeaderValue::from(value));
                }
            }
        }
        remaining > 0
    }
}

impl InstanceBudget for Inner {
    fn allows(&self, ctx: &mut PluginCtx<'_>, instance: &str) -> bool {
        self.check(ctx, instance)
    }
}

#[derive(Debug)]
struct AiRateLimiting {
    inner: Arc<Inner>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let global = match (number(conf.get("limit")), number(conf.get("time_window"))) {
        (Some(l), Some(w)) => Some((l, w)),
        _ => None,
    };
    let instances = conf
        .get("instances")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|i| {
            let name = i.get("name")?.as_str()?.to_owned();
            let limit = Limit {
                limit: number(i.get("limit"))?,
                window_ms: number(i.get("time_window"))? * 1000,
                key: name.clone(),
            };
            Some((name, limit))
        })
        .collect();
    let strategy = match conf.get("limit_strategy").and_then(Value::as_str) {
        Some("prompt_tokens") => Strategy::Prompt,
        Some("completion_tokens") => Strategy::Completion,
        _ => Strategy::Total,
    };
    Ok(Arc::new(AiRateLimiting {
        inner: Arc::new(Inner {
            global,
            instances,
            strategy,
            show_headers: conf.get("show_limit_quota_header").and_then(Value::as_bool)
                != Some(false),
            rejection: Exit::rejection(conf.as_object().ok_or("conf is not an object")?, 503)?,
            budgets: cx.services.shared::<Budgets>(),
            clock: cx.services.clock().clone(),
            state_key: cx.state_key(),
        }),
    }))
}

impl Plugin for AiRateLimiting {
    fn phases(&self) -> Phases {
        Phases::REWRITE | Phases::ACCESS | Phases::LOG
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        ctx.insert(Budget(self.inner.clone()));
        Step::CONTINUE
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let Some(PickedInstance(name, _)) = ctx.get::<PickedInstance>().cloned() else {
            return Step::CONTINUE;
        };
        if self.inner.check(ctx, &name) {
            Step::CONTINUE
        } else {
            Step::exit(self.inner.rejection.clone())
        }
    }

    fn log(&self, ctx: &LogCtx) {
        let (Some(PickedInstance(name, _)), Some(record)) =
            (ctx.value::<PickedInstance>(), ctx.value::<Arc<LlmRecord>>())
        else {
            return;
        };
        let Some(l) = self.inner.limit_of(name) else {
            return;
        };
        let Some(usage) = record.get().usage else {
            return;
        };
        let spent = match self.inner.strategy {
            Strategy::Total => usage.total_tokens,
            Strategy::Prompt => usage.prompt_tokens,
            Strategy::Completion => usage.completion_tokens,
        };
        let now = self.inner.clock.mono_ms();
        self.inner
            .budgets
            .state(&self.inner.counter(&l), l.window_ms, now, spent);
    }
}
