//! ai-rate-limiting (`apisix/plugins/ai-rate-limiting.lua`): token budgets for the AI
//! instances of ai-proxy and ai-proxy-multi, counted by limit-count's fixed windows
//! (its `local` counter spaces, or its Redis scripts for the `redis`, `redis-cluster` and
//! `redis-sentinel` policies), as APISIX runs them through `limit-count.rate_limit`.
//!
//! A budget is `limit` tokens per `time_window` seconds, for every instance (`limit`), one
//! named instance (`instances`), or, with `rules`, one per rule whose `key` (a template of
//! request variables) names the counter. `access` checks without spending (a dry run of cost 1)
//! and refuses a request whose budget is spent (`rejected_code`, `rejected_msg`), telling what
//! is left in `X-AI-RateLimit-{Limit,Remaining,Reset}-<instance>` (or, per rule,
//! `X-AI-<header_prefix>-RateLimit-*`); the log phase spends the answer's total, prompt or
//! completion tokens (`limit_strategy`), or the `cost_expr` computed from the provider's raw
//! usage (`expression`). ai-proxy-multi asks the same budgets before it picks an instance
//! (`Budget`).

mod cost_expr;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, Exit, Flow, KeyRef, LogCtx, Phases, Plugin, PluginCtx, PluginDef,
    PluginServices, Step, Template,
};
use http::{HeaderName, HeaderValue, StatusCode};
use serde_json::{json, Map, Value};

use crate::limit::limit_count::local::Outcome;
use crate::limit::limit_count::{reset_value, Backend, HeaderNames, Quota};
use crate::support::ai::{Budget, InstanceBudget, LlmRecord, PickedInstance};
use crate::support::redis as redis_support;
use cost_expr::CostExpr;

pub const NAME: &str = "ai-rate-limiting";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    encrypt_fields: &["redis_password", "sentinel_password"],
    ..PluginDef::new(NAME, 1030, schema, compile)
};

fn int_or_string() -> Value {
    json!({"oneOf": [{"type": "integer", "exclusiveMinimum": 0}, {"type": "string"}]})
}

fn schema() -> Value {
    let (redis, cluster, sentinel) = redis_support::policy_schemas();
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
            "allow_degradation": {"type": "boolean", "default": false},
            "rules": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "count": int_or_string(),
                        "time_window": int_or_string(),
                        "key": {"type": "string"},
                        "header_prefix": {"type": "string"}
                    },
                    "required": ["count", "time_window", "key"]
                }
            }
        },
        "dependencies": {"limit": ["time_window"], "time_window": ["limit"]},
        "oneOf": [
            {"anyOf": [{"required": ["limit", "time_window"]}, {"required": ["instances"]}]},
            {"required": ["rules"]}
        ],
        "if": {"properties": {"policy": {"enum": ["redis"]}}},
        "then": redis,
        "else": {
            "if": {"properties": {"policy": {"enum": ["redis-cluster"]}}},
            "then": cluster,
            "else": {
                "if": {"properties": {"policy": {"enum": ["redis-sentinel"]}}},
                "then": sentinel
            }
        }
    })
}

/// APISIX's `check_schema` after the schema: the expression must be there and load.
fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    if cx.conf.get("limit_strategy").and_then(Value::as_str) == Some("expression") {
        let Some(expr) = cx
            .conf
            .get("cost_expr")
            .and_then(Value::as_str)
            .filter(|e| !e.is_empty())
        else {
            return Err("cost_expr is required when limit_strategy is 'expression'".into());
        };
        CostExpr::parse(expr).map_err(|e| format!("invalid cost_expr: {e}"))?;
    }
    Ok(())
}

/// What one answer spends.
#[derive(Clone, Debug)]
enum Strategy {
    Total,
    Prompt,
    Completion,
    Expression(CostExpr),
}

/// A rule: its counter's key is a template of request variables.
#[derive(Debug)]
struct Rule {
    key: Template,
    count: Quota,
    window: Quota,
    /// `X-AI-<header_prefix>-RateLimit-*`.
    names: HeaderNames,
}

/// A listed instance's budget.
#[derive(Debug)]
struct InstanceLimit {
    name: String,
    count: Quota,
    window: Quota,
    /// `X-AI-RateLimit-*-<name>`.
    names: HeaderNames,
}

/// A quota of this request: `(count, time_window)`, or why it has none.
type Quotas = Result<(u64, u64), String>;

fn quotas(ctx: &PluginCtx<'_>, count: &Quota, window: &Quota) -> Quotas {
    Ok((count.resolve(ctx)?, window.resolve(ctx)?))
}

/// The conf's quotas and rule keys as this request resolved them (once, when access or
/// ai-proxy-multi's pick first asks), kept for the log phase, which resolves no variables.
#[derive(Clone, Debug)]
struct Resolved {
    /// Each rule's key (`None`: the request lacks its variables) and quota.
    rules: Vec<(Option<String>, Quotas)>,
    /// Beside [`Inner::instances`].
    instances: Vec<Quotas>,
    global: Option<Quotas>,
}

/// A counter of this request, its quota and key resolved.
#[derive(Clone, Debug)]
struct Counter {
    key: String,
    limit: u64,
    window: u64,
    names: HeaderNames,
}

const GLOBAL_KEY: &str = "ai-rate-limiting#global";

#[derive(Debug)]
struct Inner {
    /// `rules`: every rule applies to every AI request.
    rules: Vec<Rule>,
    instances: Vec<InstanceLimit>,
    /// The plugin-wide `limit` / `time_window`.
    global: Option<(Quota, Quota)>,
    strategy: Strategy,
    show_headers: bool,
    allow_degradation: bool,
    rejection: Exit,
    backend: Backend,
    /// `ai-rate-limiting:<owner>:<crc32 of the conf>`: an unchanged conf keeps counting
    /// across snapshots and re-PUTs, any change starts afresh.
    prefix: String,
    services: Arc<PluginServices>,
}

/// The header names of an instance's budget (`X-AI-RateLimit-Limit-<instance>`...).
fn instance_names(services: &PluginServices, instance: &str) -> Result<HeaderNames, String> {
    let name = |base: &str| -> Result<HeaderName, String> {
        let text = format!("{base}-{instance}").to_ascii_lowercase();
        HeaderName::from_bytes(text.as_bytes())
            .map_err(|_| format!("invalid header name {text}"))?;
        Ok(HeaderName::from_static(services.static_text(&text)))
    };
    Ok(HeaderNames {
        limit: name("X-AI-RateLimit-Limit")?,
        remaining: name("X-AI-RateLimit-Remaining")?,
        reset: name("X-AI-RateLimit-Reset")?,
    })
}

impl Inner {
    /// This request's [`Resolved`], resolved on first use.
    fn resolved(&self, ctx: &mut PluginCtx<'_>) -> Resolved {
        if let Some(r) = ctx.get::<Resolved>() {
            return r.clone();
        }
        let view: &PluginCtx<'_> = ctx;
        let rules = self
            .rules
            .iter()
            .map(|r| {
                let key = r.key.resolve(view);
                if key.resolved == 0 {
                    (None, Err("no variable".to_string()))
                } else {
                    (Some(key.text), quotas(view, &r.count, &r.window))
                }
            })
            .collect();
        let r = Resolved {
            rules,
            instances: self
                .instances
                .iter()
                .map(|i| quotas(view, &i.count, &i.window))
                .collect(),
            global: self.global.as_ref().map(|(c, w)| quotas(view, c, w)),
        };
        ctx.insert(r.clone());
        r
    }

    /// The counters of `instance`: every applying rule, or the instance's own budget, or the
    /// plugin-wide one; none when nothing limits the instance.
    fn counters(&self, r: &Resolved, instance: &str) -> Result<Vec<Counter>, String> {
        if !self.rules.is_empty() {
            let mut out = Vec::with_capacity(self.rules.len());
            for (rule, (key, q)) in self.rules.iter().zip(&r.rules) {
                let Some(key) = key else { continue };
                let (limit, window) = q.clone()?;
                out.push(Counter {
                    key: key.clone(),
                    limit,
                    window,
                    names: rule.names.clone(),
                });
            }
            if out.is_empty() {
                return Err("no rule applies".into());
            }
            return Ok(out);
        }
        if let Some(i) = self.instances.iter().position(|i| i.name == instance) {
            let (limit, window) = r.instances[i].clone()?;
            return Ok(vec![Counter {
                key: instance.to_owned(),
                limit,
                window,
                names: self.instances[i].names.clone(),
            }]);
        }
        match &r.global {
            Some(q) => {
                let (limit, window) = q.clone()?;
                Ok(vec![Counter {
                    key: GLOBAL_KEY.to_owned(),
                    limit,
                    window,
                    names: instance_names(&self.services, instance)?,
                }])
            }
            None => Ok(Vec::new()),
        }
    }

    fn remote_key(&self, key: &str) -> String {
        format!("plugin-{NAME}:v1:{}:{key}", self.prefix)
    }

    /// Counts `cost` on one counter (0: reads it).
    async fn count(&self, c: &Counter, cost: u64) -> Result<Outcome, String> {
        match &self.backend {
            Backend::Local(space) => Ok(space.fixed(KeyRef::Text(&c.key), c.limit, c.window, cost)),
            Backend::Remote(remote) => {
                remote
                    .fixed(&self.remote_key(&c.key), c.limit, c.window, cost)
                    .await
            }
        }
    }

    /// limit-count's dry run of cost 1 over the counters of `instance`: the first spent
    /// budget refuses; the headers tell each counter's state.
    async fn dry_run(&self, ctx: &mut PluginCtx<'_>, instance: &str) -> Flow {
        let resolved = self.resolved(ctx);
        let counters = match self.counters(&resolved, instance) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("failed to get rate limit rules: {e}");
                if self.allow_degradation {
                    return Flow::Continue;
                }
                return Flow::Exit(Exit::status(StatusCode::INTERNAL_SERVER_ERROR));
            }
        };
        for c in &counters {
            let o = match self.count(c, 0).await {
                Ok(o) => o,
                Err(e) => {
                    tracing::error!("failed to limit count: {e}");
                    if self.allow_degradation {
                        return Flow::Continue;
                    }
                    return Flow::Exit(Exit::error_msg(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "failed to limit count",
                    ));
                }
            };
            let rejected = o.rejected || o.remaining < 1;
            if self.show_headers {
                let h = ctx.response_headers_mut();
                h.insert(c.names.limit.clone(), HeaderValue::from(c.limit));
                h.insert(
                    c.names.remaining.clone(),
                    HeaderValue::from(if rejected { 0 } else { o.remaining }),
                );
                h.insert(c.names.reset.clone(), reset_value(o.reset_centis));
            }
            if rejected {
                return Flow::Exit(self.rejection.clone());
            }
        }
        Flow::Continue
    }

    /// The tokens an answer spent, as `limit_strategy` counts them.
    fn spent(&self, record: &LlmRecord) -> Option<u64> {
        let usage = record.read(|f| f.usage.clone())?;
        match &self.strategy {
            Strategy::Total => Some(usage.total_tokens),
            Strategy::Prompt => Some(usage.prompt_tokens),
            Strategy::Completion => Some(usage.completion_tokens),
            Strategy::Expression(expr) => match expr.eval(&usage.raw) {
                Ok(n) => Some(n),
                Err(e) => {
                    tracing::error!("{e}");
                    None
                }
            },
        }
    }
}

impl InstanceBudget for Inner {
    fn allows<'a>(
        &'a self,
        ctx: &'a mut PluginCtx<'_>,
        instance: &'a str,
    ) -> Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
        Box::pin(async move {
            // APISIX's check_instance_status knows only the instances' budgets: with `rules`
            // every instance is available.
            if !self.rules.is_empty() {
                return true;
            }
            match self.dry_run(ctx, instance).await {
                Flow::Continue => true,
                Flow::Exit(_) => {
                    tracing::info!("rate limit for instance: {instance}");
                    false
                }
            }
        })
    }
}

#[derive(Debug)]
struct AiRateLimiting {
    inner: Arc<Inner>,
}

/// This plugin refused the request in access: its log phase spends nothing.
#[derive(Clone, Copy, Debug)]
struct Refused;

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let filled = cx.filled();
    let conf: &Map<String, Value> = filled.as_object().ok_or("conf is not an object")?;
    let services = cx.services;
    let rule_names = json!({
        "limit_header": "X-AI-RateLimit-Limit",
        "remaining_header": "X-AI-RateLimit-Remaining",
        "reset_header": "X-AI-RateLimit-Reset"
    });
    let mut rules = Vec::new();
    for (i, r) in conf
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let prefix = match r.get("header_prefix").and_then(Value::as_str) {
            Some(p) => p.to_owned(),
            None => (i + 1).to_string(),
        };
        rules.push(Rule {
            key: Template::parse(r.get("key").and_then(Value::as_str).unwrap_or("")),
            count: Quota::parse(r.get("count"), "count")?,
            window: Quota::parse(r.get("time_window"), "time_window")?,
            names: HeaderNames::new(services, Some(&rule_names), Some(&prefix))?,
        });
    }
    let mut instances = Vec::new();
    let mut global = None;
    if rules.is_empty() {
        for i in conf
            .get("instances")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let name = i.get("name").and_then(Value::as_str).unwrap_or("");
            instances.push(InstanceLimit {
                name: name.to_owned(),
                count: Quota::parse(i.get("limit"), "limit")?,
                window: Quota::parse(i.get("time_window"), "time_window")?,
                names: instance_names(services, name)?,
            });
        }
        if conf.contains_key("limit") {
            global = Some((
                Quota::parse(conf.get("limit"), "limit")?,
                Quota::parse(conf.get("time_window"), "time_window")?,
            ));
        }
    }
    let strategy = match conf.get("limit_strategy").and_then(Value::as_str) {
        Some("prompt_tokens") => Strategy::Prompt,
        Some("completion_tokens") => Strategy::Completion,
        Some("expression") => Strategy::Expression(
            CostExpr::parse(conf.get("cost_expr").and_then(Value::as_str).unwrap_or(""))
                .map_err(|e| format!("invalid cost_expr: {e}"))?,
        ),
        _ => Strategy::Total,
    };
    let prefix = format!("{NAME}:{}", cx.state_key());
    let policy = conf
        .get("policy")
        .and_then(Value::as_str)
        .unwrap_or("local");
    let backend = Backend::from_conf(policy, conf, services, &prefix)?;
    Ok(Arc::new(AiRateLimiting {
        inner: Arc::new(Inner {
            rules,
            instances,
            global,
            strategy,
            show_headers: conf.get("show_limit_quota_header").and_then(Value::as_bool)
                != Some(false),
            allow_degradation: conf.get("allow_degradation").and_then(Value::as_bool) == Some(true),
            rejection: Exit::rejection(conf, 503)?,
            backend,
            prefix,
            services: services.clone(),
        }),
    }))
}

impl AiRateLimiting {
    async fn access_async(&self, ctx: &mut PluginCtx<'_>, instance: String) -> Flow {
        let flow = self.inner.dry_run(ctx, &instance).await;
        if let Flow::Exit(_) = flow {
            ctx.insert(Refused);
        }
        flow
    }
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
        Step::Wait(Box::pin(self.access_async(ctx, name)))
    }

    fn log(&self, ctx: &LogCtx) {
        let inner = &self.inner;
        // The instance that answered: ai-proxy-multi may have fallen back since access.
        let (Some(PickedInstance(name, _)), Some(record), Some(resolved)) = (
            ctx.value::<PickedInstance>(),
            ctx.value::<Arc<LlmRecord>>(),
            ctx.value::<Resolved>(),
        ) else {
            return;
        };
        if ctx.value::<Refused>().is_some() {
            return;
        }
        let Some(spent) = inner.spent(record) else {
            tracing::error!("failed to get token usage for llm service");
            return;
        };
        if spent == 0 {
            return;
        }
        let counters = match inner.counters(resolved, name) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("failed to get rate limit rules: {e}");
                return;
            }
        };
        tracing::info!("instance name: {name} used tokens: {spent}");
        match &inner.backend {
            Backend::Local(space) => {
                // APISIX's loop over the rules returns at the first counter that goes over.
                for c in &counters {
                    if space
                        .fixed(KeyRef::Text(&c.key), c.limit, c.window, spent)
                        .rejected
                    {
                        break;
                    }
                }
            }
            Backend::Remote(remote) => {
                let inner = self.inner.clone();
                let spawned = remote.spawn(async move {
                    for c in &counters {
                        if let Err(e) = inner.count(c, spent).await {
                            tracing::error!("failed to spend the tokens in redis: {e}");
                        }
                    }
                });
                if let Err(e) = spawned {
                    tracing::error!("failed to spend the tokens in redis: {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
