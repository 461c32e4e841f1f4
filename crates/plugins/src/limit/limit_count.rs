//! limit-count (spec data-plane §6): a fixed (or, 3.18, sliding) window per key, kept in the
//! process (`local`) or in Redis (`redis`, `redis-cluster`).
//!
//! The counter key is `<group>:<key>`, or `<resource key of the conf's owner>:<crc32 of the
//! conf>:<key>` (3.15+), so an unchanged conf keeps counting across snapshots and re-PUTs while
//! any change starts afresh. Everything that depends only on the conf (headers, the rejection,
//! the counter space or Redis pool) is prepared when the plugin is compiled.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrisix_plugin_api::{
    CheckCtx, Clock, CompileCtx, Exit, Flow, KeyRef, KeySpec, KeyValue, Lease, Phases, Plugin,
    PluginCtx, PluginDef, PluginServices, SharedState, Step, Template,
};
use http::{HeaderName, HeaderValue, StatusCode};
use serde_json::{json, Map, Value};

pub mod local;
pub mod redis;

use crate::support::limit::LimitCost;
use crate::support::redis::{self as redis_support, RedisPools, Remote, Target};
use local::{Outcome, Space, Spaces};

pub const NAME: &str = "limit-count";

pub static DEF: PluginDef = PluginDef {
    version: 0.5,
    metadata_schema: Some(metadata_schema),
    check: Some(check),
    schema_error: Some(schema_error),
    encrypt_fields: &["redis_password", "sentinel_password"],
    ..PluginDef::new(NAME, 1002, schema, compile)
};

/// `count` / `time_window`: a number, or (3.16+) a string resolved from request variables.
#[derive(Clone, Debug)]
pub(crate) enum Quota {
    Fixed(u64),
    Var(Template),
}

impl Quota {
    pub(crate) fn parse(v: Option<&Value>, what: &str) -> Result<Quota, String> {
        match v {
            Some(Value::Number(n)) => n
                .as_u64()
                .filter(|n| *n > 0)
                .map(Quota::Fixed)
                .ok_or_else(|| format!("{what} must be a positive integer")),
            Some(Value::String(s)) => Ok(Quota::Var(Template::parse(s))),
            _ => Err(format!("{what} is missing")),
        }
    }

    pub(crate) fn resolve(&self, ctx: &PluginCtx<'_>) -> Result<u64, String> {
        match self {
            Quota::Fixed(n) => Ok(*n),
            Quota::Var(t) => {
                let r = t.resolve(ctx);
                let v: f64 = r
                    .text
                    .trim()
                    .parse()
                    .map_err(|_| "resolved value is not a number".to_string())?;
                if v <= 0.0 {
                    return Err(format!(
                        "resolved value must be a positive number, got: {}",
                        r.text
                    ));
                }
                if v.fract() != 0.0 || v > 9_007_199_254_740_991.0 {
                    return Err(format!(
                        "resolved value must be an integer, got: {}",
                        r.text
                    ));
                }
                Ok(v as u64)
            }
        }
    }
}

/// The three response headers of one rule.
#[derive(Clone, Debug)]
pub(crate) struct HeaderNames {
    pub(crate) limit: HeaderName,
    pub(crate) remaining: HeaderName,
    pub(crate) reset: HeaderName,
}

impl HeaderNames {
    /// The names from plugin metadata (or the defaults), with `<prefix>-` inserted before the
    /// first `RateLimit-` for a rule's prefix.
    pub(crate) fn new(
        services: &PluginServices,
        metadata: Option<&Value>,
        prefix: Option<&str>,
    ) -> Result<HeaderNames, String> {
        let get = |field: &str, default: &str| -> Result<HeaderName, String> {
            let base = metadata
                .and_then(|m| m.get(field))
                .and_then(Value::as_str)
                .unwrap_or(default);
            let name = match prefix {
                Some(p) => base.replacen("RateLimit-", &format!("{p}-RateLimit-"), 1),
                None => base.to_owned(),
            };
            HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("invalid header name {name}"))?;
            Ok(HeaderName::from_static(
                services.static_text(&name.to_ascii_lowercase()),
            ))
        };
        Ok(HeaderNames {
            limit: get("limit_header", "X-RateLimit-Limit")?,
            remaining: get("remaining_header", "X-RateLimit-Remaining")?,
            reset: get("reset_header", "X-RateLimit-Reset")?,
        })
    }
}

#[derive(Clone, Debug)]
struct Rule {
    count: Quota,
    window: Quota,
    key: KeySpec,
    headers: HeaderNames,
    /// `X-RateLimit-Limit`, and `X-RateLimit-Reset` of a window's first request, when
    /// `count` and `time_window` are numbers.
    fixed_values: Option<(HeaderValue, HeaderValue)>,
}

/// Where the counters live.
pub(crate) enum Backend {
    Local(Lease<Space>),
    Remote(Remote),
}

impl Backend {
    /// The counters of `policy` (`local`, else the Redis target of the conf's fields), local
    /// ones leased under `prefix`. ai-rate-limiting counts with these too, as APISIX's goes
    /// through limit-count.
    pub(crate) fn from_conf(
        policy: &str,
        conf: &Map<String, Value>,
        services: &PluginServices,
        prefix: &str,
    ) -> Result<Backend, String> {
        Ok(match (policy, Target::from_conf(policy, conf)?) {
            ("local", _) => {
                let clock = services.clock().clone();
                Backend::Local(
                    services
                        .shared::<Spaces>()
                        .lease(prefix, || Space::new(clock)),
                )
            }
            (_, Some(target)) => Backend::Remote(services.shared::<RedisPools>().get(target)?),
            // The schema's enum refuses any other policy before this.
            (other, None) => return Err(format!("unknown policy {other}")),
        })
    }
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Local(_) => "Local",
            Backend::Remote(_) => "Remote",
        })
    }
}

/// One compiled limit-count configuration.
pub struct LimitCount {
    /// `Some`: the one rule of a `count`/`time_window` conf. `None`: `rules` apply.
    single: Option<Rule>,
    rules: Vec<(Template, Quota, Quota, HeaderNames)>,
    sliding: bool,
    /// `<owner>:<crc32>` or the group.
    prefix: Arc<str>,
    backend: Backend,
    show_headers: bool,
    allow_degradation: bool,
    rejection: Exit,
    clock: Clock,
}

fn str_field<'a>(conf: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    conf.get(name).and_then(Value::as_str)
}

fn bool_field(conf: &Map<String, Value>, name: &str, default: bool) -> bool {
    conf.get(name).and_then(Value::as_bool).unwrap_or(default)
}

impl LimitCount {
    pub fn compile(cx: &CompileCtx<'_>) -> Result<LimitCount, String> {
        let c = cx.object()?;
        let (services, metadata) = (&**cx.services, cx.metadata);
        let static_number = |n: u64| HeaderValue::from_static(services.static_text(&n.to_string()));
        let key_type = str_field(c, "key_type").unwrap_or("var");
        let key = str_field(c, "key").unwrap_or("remote_addr");
        let (single, rules) = match c.get("rules").and_then(Value::as_array) {
            Some(list) => {
                let mut rules = Vec::with_capacity(list.len());
                for (i, r) in list.iter().enumerate() {
                    let prefix = match r.get("header_prefix").and_then(Value::as_str) {
                        Some(p) => p.to_owned(),
                        None => (i + 1).to_string(),
                    };
                    rules.push((
                        Template::parse(r.get("key").and_then(Value::as_str).unwrap_or("")),
                        Quota::parse(r.get("count"), "count")?,
                        Quota::parse(r.get("time_window"), "time_window")?,
                        HeaderNames::new(services, metadata, Some(&prefix))?,
                    ));
                }
                (None, rules)
            }
            None => {
                let count = Quota::parse(c.get("count"), "count")?;
                let window = Quota::parse(c.get("time_window"), "time_window")?;
                let fixed_values = match (&count, &window) {
                    (Quota::Fixed(c), Quota::Fixed(w)) => {
                        Some((static_number(*c), static_number(*w)))
                    }
                    _ => None,
                };
                let rule = Rule {
                    count,
                    window,
                    key: KeySpec::new(key_type, key),
                    headers: HeaderNames::new(services, metadata, None)?,
                    fixed_values,
                };
                (Some(rule), Vec::new())
            }
        };
        let prefix: Arc<str> = match str_field(c, "group") {
            Some(g) => g.into(),
            None => cx.state_key().into(),
        };
        let policy = str_field(c, "policy").unwrap_or("local");
        let backend = Backend::from_conf(policy, c, services, &prefix)?;
        let rejection = Exit::rejection(c, 503)?;
        Ok(LimitCount {
            single,
            rules,
            sliding: str_field(c, "window_type") == Some("sliding"),
            prefix,
            backend,
            show_headers: bool_field(c, "show_limit_quota_header", true),
            allow_degradation: bool_field(c, "allow_degradation", false),
            rejection,
            clock: services.clock().clone(),
        })
    }

    /// An error of the counter backend (or of resolving the rules): pass, or 500.
    fn failure(&self, body: bool) -> Flow {
        if self.allow_degradation {
            return Flow::Continue;
        }
        Flow::Exit(if body {
            Exit::error_msg(StatusCode::INTERNAL_SERVER_ERROR, "failed to limit count")
        } else {
            Exit::status(StatusCode::INTERNAL_SERVER_ERROR)
        })
    }

    fn apply(&self, ctx: &mut PluginCtx<'_>, o: Outcome, limit: u64, names: &HeaderNames) -> Flow {
        self.apply_with(ctx, o, limit, names, None)
    }

    /// Sets the headers (reusing the values that do not change between requests, when
    /// known: `(limit, window, window seconds)`) and turns a rejection into the exit.
    fn apply_with(
        &self,
        ctx: &mut PluginCtx<'_>,
        o: Outcome,
        limit: u64,
        names: &HeaderNames,
        fixed: Option<(&HeaderValue, &HeaderValue, u64)>,
    ) -> Flow {
        if self.show_headers {
            let limit_value = match fixed {
                Some((v, _, _)) => v.clone(),
                None => HeaderValue::from(limit),
            };
            let reset = match fixed {
                Some((_, whole, window)) if o.reset_centis == window * 100 => whole.clone(),
                _ => reset_value(o.reset_centis),
            };
            let remaining = if o.rejected { 0 } else { o.remaining };
            let h = ctx.response_headers_mut();
            h.insert(names.limit.clone(), limit_value);
            h.insert(names.remaining.clone(), number_value(remaining));
            h.insert(names.reset.clone(), reset);
        }
        if o.rejected {
            Flow::Exit(self.rejection.clone())
        } else {
            Flow::Continue
        }
    }

    /// The resolved rules of this request: (key, limit, window, header names).
    fn resolve_rules<'a>(
        &'a self,
        ctx: &'a PluginCtx<'_>,
    ) -> Result<Vec<(KeyValue<'a>, u64, u64, &'a HeaderNames)>, String> {
        if let Some(rule) = &self.single {
            let limit = rule.count.resolve(ctx)?;
            let window = rule.window.resolve(ctx)?;
            return Ok(vec![(rule.key.resolve(ctx), limit, window, &rule.headers)]);
        }
        let mut out = Vec::with_capacity(self.rules.len());
        for (key, count, window, names) in &self.rules {
            let k = key.resolve(ctx);
            // A rule keyed on variables this request lacks does not apply.
            if key.has_vars() && k.resolved == 0 {
                continue;
            }
            let limit = count.resolve(ctx)?;
            let window = window.resolve(ctx)?;
            out.push((
                KeyValue::Text(std::borrow::Cow::Owned(k.text)),
                limit,
                window,
                names,
            ));
        }
        if out.is_empty() {
            return Err("no rule applies".into());
        }
        Ok(out)
    }

    fn run_local(&self, space: &Space, ctx: &mut PluginCtx<'_>) -> Flow {
        let cost = LimitCost::of(ctx);
        // The common case: one rule with fixed numbers, nothing to allocate.
        if let Some(Rule {
            count: Quota::Fixed(limit),
            window: Quota::Fixed(window),
            key,
            headers,
            fixed_values: Some((limit_value, window_value)),
        }) = &self.single
        {
            let k = key.resolve(ctx);
            let o = self.count_local(space, k.as_ref(), *limit, *window, cost);
            drop(k);
            let fixed = Some((limit_value, window_value, *window));
            return self.apply_with(ctx, o, *limit, headers, fixed);
        }
        let resolved: Vec<(String, bool, u64, u64, HeaderNames)> = match self.resolve_rules(ctx) {
            Ok(rules) => rules
                .into_iter()
                .map(|(k, l, w, n)| match k {
                    KeyValue::Ip(ip) => (ip.to_string(), true, l, w, n.clone()),
                    KeyValue::Text(t) => (t.into_owned(), false, l, w, n.clone()),
                })
                .collect(),
            Err(e) => {
                tracing::error!("failed to get rate limit rules: {e}");
                return self.failure(false);
            }
        };
        for (key, is_ip, limit, window, names) in resolved {
            let k = if is_ip {
                KeyRef::Ip(key.parse().unwrap_or(ctx.remote_addr()))
            } else {
                KeyRef::Text(&key)
            };
            let o = self.count_local(space, k, limit, window, cost);
            if let Flow::Exit(e) = self.apply(ctx, o, limit, &names) {
                return Flow::Exit(e);
            }
        }
        Flow::Continue
    }

    fn count_local(
        &self,
        space: &Space,
        key: KeyRef<'_>,
        limit: u64,
        window: u64,
        cost: u64,
    ) -> Outcome {
        if self.sliding {
            space.sliding(key, limit, window, cost)
        } else {
            space.fixed(key, limit, window, cost)
        }
    }

    async fn run_remote(&self, remote: &Remote, ctx: &mut PluginCtx<'_>) -> Flow {
        let cost = LimitCost::of(ctx);
        let resolved: Vec<(String, u64, u64, HeaderNames)> = match self.resolve_rules(ctx) {
            Ok(rules) => rules
                .into_iter()
                .map(|(k, l, w, n)| {
                    let key = match k {
                        KeyValue::Ip(ip) => ip.to_string(),
                        KeyValue::Text(t) => t.into_owned(),
                    };
                    (key, l, w, n.clone())
                })
                .collect(),
            Err(e) => {
                tracing::error!("failed to get rate limit rules: {e}");
                return self.failure(false);
            }
        };
        for (key, limit, window, names) in resolved {
            let result = if self.sliding {
                remote
                    .sliding(
                        &format!("plugin-limit-count:{}:{key}", self.prefix),
                        limit,
                        window,
                        cost,
                        self.clock.epoch_ms(),
                    )
                    .await
            } else {
                remote
                    .fixed(
                        &format!("plugin-limit-count:v1:{}:{key}", self.prefix),
                        limit,
                        window,
                        cost,
                    )
                    .await
            };
            match result {
                Ok(o) => {
                    if let Flow::Exit(e) = self.apply(ctx, o, limit, &names) {
                        return Flow::Exit(e);
                    }
                }
                Err(e) => {
                    tracing::error!("failed to limit count: {e}");
                    return self.failure(true);
                }
            }
        }
        Flow::Continue
    }
}

/// `X-RateLimit-Reset`: seconds, with up to two decimals (3.18), e.g. `60`, `59.98`, `4.5`.
/// Written with itoa on the stack: `fmt`'s machinery is far more work for a number, on every
/// request of a limited route (`benches/limit_count.rs` times the access phase).
pub(crate) fn reset_value(centis: u64) -> HeaderValue {
    let (whole, frac) = (centis / 100, (centis % 100) as u8);
    let mut buf = [0u8; 24];
    let mut digits = itoa::Buffer::new();
    let w = digits.format(whole).as_bytes();
    buf[..w.len()].copy_from_slice(w);
    let mut n = w.len();
    if frac != 0 {
        buf[n] = b'.';
        buf[n + 1] = b'0' + frac / 10;
        n += 2;
        if frac % 10 != 0 {
            buf[n] = b'0' + frac % 10;
            n += 1;
        }
    }
    HeaderValue::from_bytes(&buf[..n]).unwrap_or_else(|_| HeaderValue::from_static("0"))
}

/// A count as a header value (http formats integers with itoa, without validating again).
fn number_value(n: u64) -> HeaderValue {
    HeaderValue::from(n)
}

impl Plugin for LimitCount {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        match &self.backend {
            Backend::Local(space) => Step::Done(self.run_local(space, ctx)),
            Backend::Remote(remote) => Step::Wait(Box::pin(self.run_remote(remote, ctx))),
        }
    }
}

/// APISIX's `group_conf_lru`: the first conf seen for a group is remembered (a plugin-type
/// lrucache: 8 groups, 5 minutes from when it was cached) and every conf of that group checked
/// meanwhile must equal it field by field, or it is refused with "group conf mismatched".
/// APISIX keeps this per worker process; ferrisix keeps one per gateway, whose Admin API and
/// data plane share it as APISIX's worker does.
#[derive(Default)]
pub struct GroupConfs(Mutex<Vec<CachedGroup>>);

struct CachedGroup {
    group: String,
    conf: Value,
    since: Instant,
}

impl SharedState for GroupConfs {
    fn create(_: &PluginServices) -> Self {
        GroupConfs::default()
    }
}

impl GroupConfs {
    /// Checks `conf` (its defaults filled in) against its group's first conf at `now`.
    pub fn check(&self, conf: &Value, now: Instant) -> Result<(), String> {
        const GROUPS: usize = 8;
        const TTL: Duration = Duration::from_secs(5 * 60);
        let Some(group) = conf.get("group").and_then(Value::as_str) else {
            return Ok(());
        };
        let mut cache = self.0.lock().unwrap_or_else(|e| e.into_inner());
        cache.retain(|c| now.duration_since(c.since) < TTL);
        // Most recently used last.
        let prev = match cache.iter().position(|c| c.group == group) {
            Some(i) => cache.remove(i),
            None => CachedGroup {
                group: group.to_owned(),
                conf: conf.clone(),
                since: now,
            },
        };
        // Fields injected by APISIX itself (`_meta`, `_vid`) are not part of the comparison.
        let fields = |v: &Value| -> Vec<(String, Value)> {
            v.as_object()
                .map(|m| {
                    let mut f: Vec<_> = m
                        .iter()
                        .filter(|(k, _)| !k.starts_with('_'))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    f.sort_by(|a, b| a.0.cmp(&b.0));
                    f
                })
                .unwrap_or_default()
        };
        let same = fields(&prev.conf) == fields(conf);
        cache.push(prev);
        if cache.len() > GROUPS {
            cache.remove(0);
        }
        if same {
            Ok(())
        } else {
            tracing::error!(
                group,
                "limit-count group conf mismatched with the group's first conf"
            );
            Err("group conf mismatched".into())
        }
    }
}

/// The checks APISIX runs after the schema (`limit-count/init.lua` `check_schema`), worded as
/// APISIX words them.
fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    check_conf(cx.conf)?;
    if cx.conf.get("group").is_some() {
        // Compared with the schema's defaults filled in, as APISIX's check_schema sees it.
        let filled = cx.filled()?;
        cx.services.shared::<GroupConfs>().check(&filled, cx.now)?;
    }
    Ok(())
}

/// APISIX words the count/rules conflict itself instead of the `oneOf` failure.
fn schema_error(cx: &CheckCtx<'_>, schema: String) -> String {
    if schema.contains("value should match only one schema") {
        if let Err(e) = check_conf(cx.conf) {
            return e;
        }
    }
    schema
}

fn metadata_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "limit_header": {"type": "string", "default": "X-RateLimit-Limit"},
            "remaining_header": {"type": "string", "default": "X-RateLimit-Remaining"},
            "reset_header": {"type": "string", "default": "X-RateLimit-Reset"}
        }
    })
}

/// limit-count's schema as of APISIX 3.18 (spec data-plane §6.1).
fn schema() -> Value {
    let (redis, cluster, sentinel) = redis_support::policy_schemas();
    let count_like =
        json!({"oneOf": [{"type": "integer", "exclusiveMinimum": 0}, {"type": "string"}]});
    json!({
        "type": "object",
        "properties": {
            "count": count_like,
            "time_window": count_like,
            "window_type": {"type": "string", "enum": ["fixed", "sliding"], "default": "fixed"},
            "rules": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "count": count_like,
                        "time_window": count_like,
                        "key": {"type": "string"},
                        "header_prefix": {"type": "string"}
                    },
                    "required": ["count", "time_window", "key"]
                }
            },
            "group": {"type": "string"},
            "key": {"type": "string", "default": "remote_addr"},
            "key_type": {"type": "string", "enum": ["var", "var_combination", "constant"], "default": "var"},
            "rejected_code": {"type": "integer", "minimum": 200, "maximum": 599, "default": 503},
            "rejected_msg": {"type": "string", "minLength": 1},
            "policy": {"type": "string", "enum": ["local", "redis", "redis-cluster", "redis-sentinel"], "default": "local"},
            "allow_degradation": {"type": "boolean", "default": false},
            "show_limit_quota_header": {"type": "boolean", "default": true},
            "sync_interval": {"type": "number", "default": -1}
        },
        "oneOf": [{"required": ["count", "time_window"]}, {"required": ["rules"]}],
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

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(LimitCount::compile(cx)?))
}

pub fn check_conf(conf: &Value) -> Result<(), String> {
    let Some(c) = conf.as_object() else {
        return Ok(());
    };
    let has_quota = c.contains_key("count") || c.contains_key("time_window");
    if c.contains_key("rules") && has_quota {
        return Err("count/time_window and rules cannot be specified at the same time".into());
    }
    if c.contains_key("group") && c.contains_key("rules") {
        return Err("group and rules cannot be specified at the same time".into());
    }
    let policy = str_field(c, "policy").unwrap_or("local");
    if policy != "local" {
        if let Some(si) = c.get("sync_interval").and_then(Value::as_f64) {
            if si != -1.0 {
                if si < 0.1 {
                    return Err("sync_interval should not be smaller than 0.1".into());
                }
                if c.get("time_window")
                    .and_then(Value::as_f64)
                    .is_some_and(|tw| si >= tw)
                {
                    return Err("sync_interval should be smaller than time_window".into());
                }
            }
        }
    }
    let mut keys: HashMap<&str, ()> = HashMap::new();
    for rule in c
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(k) = rule.get("key").and_then(Value::as_str) {
            if keys.insert(k, ()).is_some() {
                return Err(format!("duplicate key '{k}' in rules"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use ferrisix_plugin_api::ResponseHeaders;

    use super::*;
    use crate::support::redis::test_server;
    use crate::testing::{request, Compiler};

    /// Request variables (`http_*` only: they travel as headers).
    struct Vars(Vec<(&'static str, &'static str)>);

    /// One gateway for the module's tests, as the process-wide runtime was; every test uses
    /// owners of its own.
    fn compiler() -> &'static Compiler {
        static C: OnceLock<Compiler> = OnceLock::new();
        C.get_or_init(Compiler::new)
    }

    fn compile(conf: Value, owner: &str) -> LimitCount {
        LimitCount::compile(&compiler().cx(NAME, &conf, owner, None)).unwrap()
    }

    fn run(lc: &LimitCount, ip: &str, vars: &Vars) -> (Flow, ResponseHeaders) {
        let mut req = request(ip, &vars.0);
        let mut ctx = req.ctx();
        let Step::Done(flow) = lc.access(&mut ctx) else {
            panic!("local is synchronous")
        };
        (flow, req.state.take_response_headers())
    }

    #[test]
    fn headers_and_rejection() {
        let lc = compile(
            json!({"count": 2, "time_window": 60, "rejected_code": 429, "rejected_msg": "a/b"}),
            "lc-t1",
        );
        let v = Vars(vec![]);
        let (f, h) = run(&lc, "10.0.0.1", &v);
        assert_eq!(f, Flow::Continue);
        assert_eq!(
            (
                &h["x-ratelimit-limit"],
                &h["x-ratelimit-remaining"],
                &h["x-ratelimit-reset"]
            ),
            (
                &"2".parse::<HeaderValue>().unwrap(),
                &"1".parse::<HeaderValue>().unwrap(),
                &"60".parse::<HeaderValue>().unwrap()
            )
        );
        let (f, h) = run(&lc, "10.0.0.1", &v);
        assert_eq!(f, Flow::Continue);
        assert_eq!(h["x-ratelimit-remaining"], "0");
        let (f, h) = run(&lc, "10.0.0.1", &v);
        let Flow::Exit(e) = f else { panic!() };
        assert_eq!(e.status, 429);
        assert_eq!(e.body.unwrap(), "{\"error_msg\":\"a/b\"}\n");
        assert_eq!(h["x-ratelimit-remaining"], "0");
        // Another client.
        assert_eq!(run(&lc, "10.0.0.2", &v).0, Flow::Continue);
    }

    #[test]
    fn same_conf_same_counter_changed_conf_new_counter() {
        let conf = json!({"count": 1, "time_window": 60});
        let a = compile(conf.clone(), "lc-t2");
        let v = Vars(vec![]);
        assert_eq!(run(&a, "1.1.1.1", &v).0, Flow::Continue);
        // Recompiled (next snapshot) with defaults spelled out: the same counter.
        let b = compile(
            json!({"time_window": 60, "count": 1, "rejected_code": 503}),
            "lc-t2",
        );
        assert!(matches!(run(&b, "1.1.1.1", &v).0, Flow::Exit(_)));
        let c = compile(json!({"count": 1, "time_window": 61}), "lc-t2");
        assert_eq!(run(&c, "1.1.1.1", &v).0, Flow::Continue);
        // Another owner with the same conf counts apart.
        let d = compile(conf, "lc-t2-other");
        assert_eq!(run(&d, "1.1.1.1", &v).0, Flow::Continue);
    }

    #[test]
    fn key_types() {
        let v = Vars(vec![("http_x_user", "alice")]);
        let constant = compile(
            json!({"count": 1, "time_window": 60, "key_type": "constant", "key": "k"}),
            "lc-t3",
        );
        assert_eq!(run(&constant, "1.1.1.1", &v).0, Flow::Continue);
        assert!(matches!(run(&constant, "2.2.2.2", &v).0, Flow::Exit(_)));

        let by_var = compile(
            json!({"count": 1, "time_window": 60, "key": "http_x_user"}),
            "lc-t4",
        );
        assert_eq!(run(&by_var, "1.1.1.1", &v).0, Flow::Continue);
        assert!(
            matches!(run(&by_var, "2.2.2.2", &v).0, Flow::Exit(_)),
            "same user"
        );
        // Missing variable: the client address.
        let none = Vars(vec![]);
        assert_eq!(run(&by_var, "3.3.3.3", &none).0, Flow::Continue);
        assert!(matches!(run(&by_var, "3.3.3.3", &none).0, Flow::Exit(_)));

        let combo = compile(
            json!({"count": 1, "time_window": 60, "key_type": "var_combination", "key": "$http_x_user $nope"}),
            "lc-t5",
        );
        assert_eq!(run(&combo, "1.1.1.1", &v).0, Flow::Continue);
        assert!(matches!(run(&combo, "2.2.2.2", &v).0, Flow::Exit(_)));
    }

    #[test]
    fn group_shares_across_owners() {
        let conf = json!({"count": 1, "time_window": 60, "group": "lc-group-t6"});
        let a = compile(conf.clone(), "lc-t6a");
        let b = compile(conf, "lc-t6b");
        let v = Vars(vec![]);
        assert_eq!(run(&a, "1.1.1.1", &v).0, Flow::Continue);
        assert!(matches!(run(&b, "1.1.1.1", &v).0, Flow::Exit(_)));
    }

    #[test]
    fn group_confs_must_match_the_first_one_for_five_minutes() {
        let groups = GroupConfs::default();
        let check_group = |conf: &Value, now| groups.check(conf, now);
        let t0 = std::time::Instant::now();
        let a = json!({"count": 1, "time_window": 60, "group": "lc-grp-check", "_meta": {"x": 1}});
        assert_eq!(check_group(&a, t0), Ok(()));
        // `_meta` is not compared; any other field is.
        let same = json!({"count": 1, "time_window": 60, "group": "lc-grp-check"});
        assert_eq!(check_group(&same, t0), Ok(()));
        let other = json!({"count": 2, "time_window": 60, "group": "lc-grp-check"});
        assert_eq!(
            check_group(&other, t0),
            Err("group conf mismatched".to_string())
        );
        let extra =
            json!({"count": 1, "time_window": 60, "group": "lc-grp-check", "rejected_code": 429});
        assert!(check_group(&extra, t0).is_err());
        // The first conf is forgotten 5 minutes after it was cached.
        let later = t0 + std::time::Duration::from_secs(301);
        assert_eq!(check_group(&other, later), Ok(()));
        assert!(check_group(&a, later).is_err());
    }

    #[test]
    fn rules_and_var_quotas() {
        let conf = json!({"rules": [
            {"count": 1, "time_window": 60, "key": "${http_x_user}"},
            {"count": "$http_x_quota", "time_window": 60, "key": "$http_x_team", "header_prefix": "team"}
        ]});
        let lc = compile(conf, "lc-t7");
        let v = Vars(vec![("http_x_team", "t1"), ("http_x_quota", "2")]);
        let (f, h) = run(&lc, "1.1.1.1", &v);
        assert_eq!(f, Flow::Continue);
        assert_eq!(h["x-team-ratelimit-limit"], "2");
        assert!(
            h.get("x-1-ratelimit-limit").is_none(),
            "rule 1 lacks its variable"
        );
        let v2 = Vars(vec![
            ("http_x_user", "u"),
            ("http_x_team", "t2"),
            ("http_x_quota", "2"),
        ]);
        let (_, h) = run(&lc, "1.1.1.1", &v2);
        assert_eq!(h["x-1-ratelimit-limit"], "1");
        // A bad resolved quota is an error: 500 without body.
        let bad = Vars(vec![("http_x_team", "t3"), ("http_x_quota", "x")]);
        let Flow::Exit(e) = run(&lc, "1.1.1.1", &bad).0 else {
            panic!()
        };
        assert_eq!((e.status.as_u16(), e.body), (500, None));
    }

    #[test]
    fn metadata_renames_headers_and_quota_header_off() {
        let meta = json!({"limit_header": "X-Limit", "remaining_header": "X-Remaining", "reset_header": "X-Reset"});
        let conf = json!({"count": 3, "time_window": 60});
        let lc = LimitCount::compile(&compiler().cx(NAME, &conf, "lc-t8", Some(&meta))).unwrap();
        let (_, h) = run(&lc, "1.1.1.1", &Vars(vec![]));
        assert_eq!(h["x-limit"], "3");
        assert_eq!(h["x-reset"], "60");
        let quiet = compile(
            json!({"count": 3, "time_window": 60, "show_limit_quota_header": false}),
            "lc-t9",
        );
        assert!(run(&quiet, "1.1.1.1", &Vars(vec![])).1.is_empty());
    }

    #[test]
    fn reset_formatting() {
        assert_eq!(reset_value(6000), "60");
        assert_eq!(reset_value(5998), "59.98");
        assert_eq!(reset_value(450), "4.5");
        assert_eq!(reset_value(5), "0.05");
        assert_eq!(reset_value(0), "0");
        assert_eq!(reset_value(10), "0.1");
        assert_eq!(reset_value(u64::MAX), "184467440737095516.15");
        assert_eq!(number_value(0), "0");
        assert_eq!(number_value(2_000_000_000_000), "2000000000000");
    }

    #[test]
    fn schema_extras() {
        assert!(check_conf(&json!({"count": 1, "time_window": 1, "rules": []})).is_err());
        assert_eq!(
            check_conf(&json!({"rules": [{"key": "a"}, {"key": "a"}]})).unwrap_err(),
            "duplicate key 'a' in rules"
        );
        assert_eq!(
            check_conf(
                &json!({"count": 1, "time_window": 1, "policy": "redis", "sync_interval": 0.05})
            )
            .unwrap_err(),
            "sync_interval should not be smaller than 0.1"
        );
        assert!(check_conf(&json!({"count": 1, "time_window": 1})).is_ok());
    }

    #[tokio::test]
    async fn unreachable_redis_degrades_or_fails() {
        let port = test_server::free_port();
        let base = json!({"count": 1, "time_window": 60, "policy": "redis", "redis_host": "127.0.0.1", "redis_port": port, "redis_timeout": 200});
        let mut degrade = base.clone();
        degrade["allow_degradation"] = json!(true);
        for (conf, expect_pass) in [(base, false), (degrade, true)] {
            let lc = compile(conf, "lc-t10");
            let mut req = request("1.1.1.1", &[]);
            let mut ctx = req.ctx();
            let Step::Wait(fut) = lc.access(&mut ctx) else {
                panic!("redis waits")
            };
            let flow = fut.await;
            if expect_pass {
                assert_eq!(flow, Flow::Continue);
            } else {
                let Flow::Exit(e) = flow else { panic!() };
                assert_eq!(e.status, 500);
                assert_eq!(
                    e.body.unwrap(),
                    "{\"error_msg\":\"failed to limit count\"}\n"
                );
            }
            assert!(ctx.response_headers().is_empty());
        }
    }
}
