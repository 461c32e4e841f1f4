//! limit-conn: APISIX's `limit-conn` plugin (`apisix/plugins/limit-conn/init.lua` over
//! lua-resty-limit-traffic's `resty.limit.conn`), kept in the process (`local`) or in Redis
//! (`redis`, `redis-cluster`).
//!
//! On access the key's in-flight count goes up by one; above `conn + burst` the request is
//! rejected (and the count goes back down); above `conn` it is delayed by
//! `unit_delay * floor((count - 1) / conn)` seconds, `unit_delay` starting at
//! `default_conn_delay`. APISIX decrements in the log phase; here the increment is owned by a
//! [`ConnGuard`] put in the request's guards ([`PluginCtx::add_guard`]), which the proxy drops
//! right after the log phase (when the response body is dropped: completed or the client went
//! away) or with the request if it is abandoned earlier, so the decrement happens exactly
//! once. Unless `only_use_default_delay`, leaving also averages the request's latency into
//! `unit_delay` (`leaving(key, latency)`), as APISIX does.
//!
//! With a redis policy (`apisix/plugins/limit-conn/util.lua`) the in-flight requests of a key
//! are the members of the sorted set `limit_conn:<owner>:<crc32 of the conf>:<key>`, one per
//! request (a random id) scored with its expiry (`now + key_ttl`, epoch seconds). One script
//! drops expired members, counts the rest, and adds this request's unless `conn + burst` are
//! already there, so every gateway using that Redis shares the count, and the slots of a
//! gateway that died without releasing them lapse after `key_ttl` (default 3600 s). Leaving
//! removes the request's member from the Redis thread, detached from the request (APISIX's
//! `ngx.timer.at(0, ...)`): the worker never waits for it. A request abandoned while its
//! increment is in flight still releases its slot once the increment is answered. The unit
//! delay is kept and adapted per process, as the local policy's (it is not shared state in
//! APISIX either).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrisix_plugin_api::{
    Clock, CompileCtx, Exit, Flow, KeyRef, KeySpec, KeyValue, Keyed, Lease, OwnedKey, Phases,
    Plugin, PluginCtx, PluginDef, Retain, Slot, StateMap, Step, Template,
};
use ferrisix_router::VarSource;
use http::StatusCode;
use serde_json::{json, Value};

use crate::support::redis::{self as redis_support, Remote, RemoteError};

pub const NAME: &str = "limit-conn";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &["redis_password"],
    ..PluginDef::new(NAME, 1003, schema, compile)
};

/// apisix/plugins/limit-conn.lua.
fn schema() -> Value {
    // A number, or (3.16+) a string of request variables resolved per request.
    let conn = json!({"oneOf": [{"type": "integer", "exclusiveMinimum": 0}, {"type": "string"}]});
    let burst = json!({"oneOf": [{"type": "integer", "minimum": 0}, {"type": "string"}]});
    let mut schema = redis_support::with_policy_clauses(json!({
        "type": "object",
        "properties": {
            "conn": conn.clone(),
            "burst": burst.clone(),
            "default_conn_delay": {"type": "number", "exclusiveMinimum": 0},
            "only_use_default_delay": {"type": "boolean", "default": false},
            "key": {"type": "string"},
            "key_type": {"type": "string", "enum": ["var", "var_combination"], "default": "var"},
            "policy": {"type": "string", "enum": ["redis", "redis-cluster", "local"], "default": "local"},
            "rejected_code": {"type": "integer", "minimum": 200, "maximum": 599, "default": 503},
            "rejected_msg": {"type": "string", "minLength": 1},
            "allow_degradation": {"type": "boolean", "default": false},
            "rules": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"conn": conn, "burst": burst, "key": {"type": "string"}},
                    "required": ["conn", "burst", "key"]
                }
            }
        },
        "oneOf": [
            {"required": ["conn", "burst", "default_conn_delay", "key"]},
            {"required": ["default_conn_delay", "rules"]}
        ]
    }));
    // Both redis clauses add `key_ttl` (redis-schema.lua's `limit_conn_redis_schema`).
    let key_ttl = json!({"type": "integer", "default": 3600});
    schema["then"]["properties"]["key_ttl"] = key_ttl.clone();
    schema["else"]["then"]["properties"]["key_ttl"] = key_ttl;
    schema
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(LimitConn::compile(cx)?))
}

/// After a Redis error: pass with `allow_degradation`, else 500 (`return 500`: nginx's page).
fn backend_failure(allow_degradation: bool) -> Flow {
    if allow_degradation {
        return Flow::Continue;
    }
    Flow::Exit(Exit::status(StatusCode::INTERNAL_SERVER_ERROR))
}

/// The in-flight counts of one configuration, and its current unit delay.
pub struct ConnSpace {
    counts: Keyed<u64>,
    clock: Clock,
    /// Seconds, as `f64` bits (lua-resty-limit-traffic's `self.unit_delay`).
    unit_delay: AtomicU64,
}

impl std::fmt::Debug for ConnSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnSpace")
    }
}

impl ConnSpace {
    pub fn new(default_delay: f64, clock: Clock) -> ConnSpace {
        ConnSpace {
            counts: Keyed::default(),
            clock,
            unit_delay: AtomicU64::new(default_delay.to_bits()),
        }
    }

    pub fn unit_delay(&self) -> f64 {
        f64::from_bits(self.unit_delay.load(Ordering::Relaxed))
    }

    /// `resty.limit.conn`'s `incoming(key, true)`: `None` when rejected (the count is left
    /// as it was), else the count including this request.
    pub fn incoming(&self, key: KeyRef<'_>, max: u64) -> Option<u64> {
        self.counts.update(
            key,
            self.clock.mono_ms(),
            |_| false,
            |prev| match prev {
                Some(n) if *n >= max => (Slot::Keep, None),
                Some(n) => {
                    *n += 1;
                    (Slot::Keep, Some(*n))
                }
                None if max == 0 => (Slot::Keep, None),
                None => (Slot::Insert(1), Some(1)),
            },
        )
    }

    /// `leaving(key)`: one request of `key` is over.
    pub fn leaving(&self, key: KeyRef<'_>) {
        self.counts.update(
            key,
            self.clock.mono_ms(),
            |_| false,
            |prev| match prev {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    (Slot::Keep, ())
                }
                Some(_) => (Slot::Remove, ()),
                None => (Slot::Keep, ()),
            },
        );
    }

    /// The in-flight count of `key`.
    pub fn count(&self, key: KeyRef<'_>) -> u64 {
        self.counts
            .update(
                key,
                self.clock.mono_ms(),
                |_| false,
                |prev| (Slot::Keep, prev.copied()),
            )
            .unwrap_or(0)
    }

    /// `self.unit_delay = (req_latency + unit_delay) / 2`.
    fn adapt(&self, latency: f64) {
        let _ = self
            .unit_delay
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some(((latency + f64::from_bits(bits)) / 2.0).to_bits())
            });
    }

    /// Whether any request is in flight.
    pub fn live(&self) -> bool {
        !self.counts.is_empty()
    }
}

impl Retain for ConnSpace {
    /// A request still in flight keeps its space (it decrements it when it ends).
    fn retain(&self) -> bool {
        self.live()
    }
}

/// The limit-conn spaces of one gateway.
pub type ConnSpaces = StateMap<ConnSpace>;

/// The increment script (`apisix/plugins/limit-conn/util.lua`). KEYS[1]: the sorted set;
/// ARGV: the most requests in flight (`conn + burst`), `key_ttl` (s), now (epoch s), this
/// request's member. Answers `{1, count with this request}` or `{0, count}` (rejected).
fn incoming_script() -> &'static redis::Script {
    static S: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        redis::Script::new(
            "local max = tonumber(ARGV[1])\n\
             local ttl = tonumber(ARGV[2])\n\
             local now = tonumber(ARGV[3])\n\
             redis.call('zremrangebyscore', KEYS[1], 0, now)\n\
             local count = redis.call('zcard', KEYS[1])\n\
             if count >= max then return {0, count} end\n\
             redis.call('zadd', KEYS[1], now + ttl, ARGV[4])\n\
             redis.call('expire', KEYS[1], ttl)\n\
             return {1, count + 1}\n",
        )
    })
}

/// A random request id in UUID v4 form (APISIX's member is `uuid.generate_v4()` when the
/// request has no id).
fn request_id() -> String {
    let r: u128 = rand::random();
    // Version 4, variant 10.
    let v = (r & !(0xf << 76) & !(0x3 << 62)) | (0x4 << 76) | (0x2 << 62);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        (v >> 96) as u32,
        (v >> 80) as u16,
        (v >> 64) as u16,
        (v >> 48) as u16,
        (v & 0xffff_ffff_ffff) as u64
    )
}

/// One request's member in a Redis sorted set; dropping it removes the member from the Redis
/// thread without waiting.
pub struct RemoteSlot {
    remote: Remote,
    key: String,
    /// Empty once disarmed.
    member: String,
}

impl RemoteSlot {
    /// The member was never added: nothing to remove.
    fn disarm(mut self) {
        self.member.clear();
    }
}

impl Drop for RemoteSlot {
    fn drop(&mut self) {
        if self.member.is_empty() {
            return;
        }
        let remote = self.remote.clone();
        let key = std::mem::take(&mut self.key);
        let member = std::mem::take(&mut self.member);
        let release = async move {
            let cmd = redis::cmd("ZREM").arg(&key).arg(&member).clone();
            if let Err(e) = remote.query::<i64>(&cmd).await {
                tracing::error!("failed to record the connection leaving request: {e}");
            }
        };
        if let Err(e) = self.remote.spawn(release) {
            tracing::error!("failed to record the connection leaving request: {e}");
        }
    }
}

/// One request against the sorted set `key` at `now_s` (epoch seconds): its slot, with the
/// count including it, or `None` when `max` requests are in flight already. The script runs
/// on the Redis thread, so an abandoned caller cannot leave an increment without its release.
pub async fn remote_incoming(
    remote: &Remote,
    key: String,
    max: u64,
    key_ttl: i64,
    now_s: u64,
) -> Result<Option<(u64, RemoteSlot)>, RemoteError> {
    let slot = RemoteSlot {
        remote: remote.clone(),
        key,
        member: request_id(),
    };
    let job = remote
        .spawn(async move {
            let answer = slot
                .remote
                .invoke::<(i64, i64)>(
                    incoming_script()
                        .key(&slot.key)
                        .arg(max)
                        .arg(key_ttl)
                        .arg(now_s)
                        .arg(&slot.member),
                )
                .await;
            match answer {
                Ok((1, count)) => Ok(Some((count.max(1) as u64, slot))),
                Ok(_) => {
                    // Rejected: nothing was added.
                    slot.disarm();
                    Ok(None)
                }
                Err(e) => {
                    // The member may have been added after all: removing it is harmless if not.
                    if !e.maybe_applied {
                        slot.disarm();
                    }
                    Err(e)
                }
            }
        })
        .map_err(|message| RemoteError {
            message,
            maybe_applied: false,
        })?;
    job.await.unwrap_or_else(|e| {
        Err(RemoteError {
            message: format!("limit-conn redis task: {e}"),
            maybe_applied: false,
        })
    })
}

/// Where one request's slot is held.
enum Held {
    Local(OwnedKey),
    /// Released by its own drop.
    Remote {
        _release: RemoteSlot,
    },
}

/// One request counted in flight; dropping it is APISIX's `decrease` (log phase).
pub struct ConnGuard {
    space: Arc<ConnSpace>,
    slot: Held,
    start: Instant,
    /// The delay this request was given, subtracted from its latency.
    delay: f64,
    adapt: bool,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        if let Held::Local(key) = &self.slot {
            self.space.leaving(key.as_ref());
        }
        if self.adapt {
            // APISIX uses `$upstream_response_time` for proxied requests and
            // `$request_time - delay` otherwise; the guard knows the latter.
            let latency = (self.start.elapsed().as_secs_f64() - self.delay).max(0.0);
            self.space.adapt(latency);
        }
    }
}

/// The Redis side of a `redis` / `redis-cluster` conf.
struct RemoteConn {
    remote: Remote,
    /// `<owner>:<crc32 of the conf>`.
    prefix: Arc<str>,
    key_ttl: i64,
}

/// `conn` or `burst`: a number, or (3.16+) a string resolved from request variables.
#[derive(Clone, Debug)]
enum Amount {
    Fixed(u64),
    Var(Template),
}

impl Amount {
    /// `min` is 1 for `conn`, 0 for `burst`, as the schema has them.
    fn parse(v: Option<&Value>, what: &str, min: u64) -> Result<Amount, String> {
        match v {
            Some(Value::Number(n)) => n
                .as_u64()
                .filter(|n| *n >= min)
                .map(Amount::Fixed)
                .ok_or_else(|| format!("{what} must be an integer not less than {min}")),
            Some(Value::String(s)) => Ok(Amount::Var(Template::parse(s))),
            _ => Err(format!("{what} is missing")),
        }
    }

    /// `resolve_var` of `limit-conn/init.lua`, with its messages: the resolved text must be an
    /// integer, positive (`conn`) or not negative (`burst`, `allow_zero`).
    fn resolve(&self, vars: &dyn VarSource, allow_zero: bool) -> Result<u64, String> {
        let t = match self {
            Amount::Fixed(n) => return Ok(*n),
            Amount::Var(t) => t,
        };
        let resolved = t.resolve(vars).text;
        let Ok(v) = resolved.trim().parse::<f64>() else {
            return Err(format!("resolved value is not a number: {resolved}"));
        };
        if allow_zero && v < 0.0 {
            return Err(format!(
                "resolved value must be a non-negative number, got: {resolved}"
            ));
        }
        if !allow_zero && v <= 0.0 {
            return Err(format!(
                "resolved value must be a positive number, got: {resolved}"
            ));
        }
        if v.fract() != 0.0 {
            return Err(format!(
                "resolved value must be an integer, got: {resolved}"
            ));
        }
        if v > 9_007_199_254_740_991.0 {
            return Err(format!(
                "resolved value exceeds safe integer range (2^53-1), got: {resolved}"
            ));
        }
        Ok(v as u64)
    }
}

/// What a conf limits.
enum Limits {
    /// `conn`, `burst` and `key` (by `key_type`).
    Single {
        conn: Amount,
        burst: Amount,
        key: KeySpec,
    },
    /// (3.16+) `rules`, each counted apart and all applied in order; a rule whose key has no
    /// variable with a value, or whose numbers do not resolve, is skipped.
    Rules(Vec<ConnRule>),
}

struct ConnRule {
    conn: Amount,
    burst: Amount,
    key: Template,
}

/// The rules of one request; the common single conf without an allocation.
type AppliedRules<'a> = smallvec::SmallVec<[Applied<'a>; 1]>;

/// One rule as it applies to a request: its key, `conn` and `burst`.
struct Applied<'a> {
    key: KeyValue<'a>,
    conn: u64,
    burst: u64,
}

/// One compiled limit-conn configuration.
pub struct LimitConn {
    /// The local counts (unused with a redis policy) and the unit delay (both policies).
    space: Lease<ConnSpace>,
    remote: Option<RemoteConn>,
    limits: Limits,
    only_default_delay: bool,
    allow_degradation: bool,
    rejection: Exit,
    clock: Clock,
}

impl LimitConn {
    pub fn compile(cx: &CompileCtx<'_>) -> Result<LimitConn, String> {
        let c = cx.object()?;
        let limits = match c.get("rules").and_then(Value::as_array) {
            Some(rules) => Limits::Rules(
                rules
                    .iter()
                    .map(|r| {
                        Ok(ConnRule {
                            conn: Amount::parse(r.get("conn"), "conn", 1)?,
                            burst: Amount::parse(r.get("burst"), "burst", 0)?,
                            key: Template::parse(
                                r.get("key").and_then(Value::as_str).unwrap_or(""),
                            ),
                        })
                    })
                    .collect::<Result<_, String>>()?,
            ),
            None => {
                let key = c
                    .get("key")
                    .and_then(Value::as_str)
                    .ok_or("key is missing")?;
                let key_type = c.get("key_type").and_then(Value::as_str).unwrap_or("var");
                Limits::Single {
                    conn: Amount::parse(c.get("conn"), "conn", 1)?,
                    burst: Amount::parse(c.get("burst"), "burst", 0)?,
                    key: KeySpec::new(key_type, key),
                }
            }
        };
        let default_delay = c
            .get("default_conn_delay")
            .and_then(Value::as_f64)
            .filter(|d| *d > 0.0)
            .ok_or("default_conn_delay must be a number greater than 0")?;
        let prefix = cx.state_key();
        let services = cx.services;
        let remote = redis_support::policy_remote(NAME, c, services)?.map(|remote| RemoteConn {
            remote,
            prefix: prefix.as_str().into(),
            key_ttl: c.get("key_ttl").and_then(Value::as_i64).unwrap_or(3600),
        });
        Ok(LimitConn {
            space: services.shared::<ConnSpaces>().lease(&prefix, || {
                ConnSpace::new(default_delay, services.clock().clone())
            }),
            remote,
            limits,
            only_default_delay: c.get("only_use_default_delay").and_then(Value::as_bool)
                == Some(true),
            allow_degradation: c.get("allow_degradation").and_then(Value::as_bool) == Some(true),
            rejection: Exit::rejection(c, 503)?,
            clock: services.clock().clone(),
        })
    }

    /// `resty.limit.conn`'s delay for the `count`-th request in flight under `conn`.
    fn delay_for(&self, count: u64, conn: u64) -> f64 {
        if count > conn {
            self.space.unit_delay() * ((count - 1) / conn) as f64
        } else {
            0.0
        }
    }

    /// `get_rules` of `limit-conn/init.lua`: the rules that apply to this request. An error
    /// (the single conf's numbers do not resolve) or no rule at all fails the request.
    fn applied<'a>(&'a self, ctx: &'a PluginCtx<'_>) -> Result<AppliedRules<'a>, String> {
        match &self.limits {
            Limits::Single { conn, burst, key } => Ok(smallvec::smallvec![Applied {
                conn: conn.resolve(ctx, false)?,
                burst: burst.resolve(ctx, true)?,
                key: key.resolve(ctx),
            }]),
            Limits::Rules(rules) => Ok(rules
                .iter()
                .filter_map(|r| {
                    let conn = r.conn.resolve(ctx, false).ok()?;
                    let burst = r.burst.resolve(ctx, true).ok()?;
                    let key = r.key.resolve(ctx);
                    // APISIX skips a rule whose key resolved no variable (a key without
                    // variables included).
                    (key.resolved > 0).then_some(Applied {
                        key: KeyValue::Text(std::borrow::Cow::Owned(key.text)),
                        conn,
                        burst,
                    })
                })
                .collect()),
        }
    }

    fn guard(&self, slot: Held, delay: f64) -> Box<ConnGuard> {
        Box::new(ConnGuard {
            space: self.space.state().clone(),
            slot,
            start: Instant::now(),
            delay,
            adapt: !self.only_default_delay,
        })
    }

    /// The rules in order against Redis, each delay slept before the next rule, as APISIX.
    async fn run_remote(
        &self,
        r: &RemoteConn,
        rules: Vec<(String, u64, u64)>,
        ctx: &mut PluginCtx<'_>,
    ) -> Flow {
        for (key, conn, burst) in rules {
            let key = format!("limit_conn:{}:{key}", r.prefix);
            let now_s = self.clock.epoch_ms() / 1000;
            match remote_incoming(&r.remote, key, conn.saturating_add(burst), r.key_ttl, now_s)
                .await
            {
                Ok(Some((count, slot))) => {
                    let delay = self.delay_for(count, conn);
                    ctx.add_guard(self.guard(Held::Remote { _release: slot }, delay));
                    if delay >= 0.001 {
                        tokio::time::sleep(Duration::from_secs_f64(delay)).await;
                    }
                }
                Ok(None) => return Flow::Exit(self.rejection.clone()),
                Err(e) => {
                    tracing::error!("failed to limit conn: {e}");
                    return backend_failure(self.allow_degradation);
                }
            }
        }
        Flow::Continue
    }

    pub fn space(&self) -> &Arc<ConnSpace> {
        self.space.state()
    }
}

impl Plugin for LimitConn {
    /// `log` is the guard's drop (see the module docs), so only `access` is run by chains.
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let rules = match self.applied(ctx) {
            Ok(rules) if !rules.is_empty() => rules,
            Ok(_) => {
                tracing::error!("failed to get limit conn rules: nil");
                return Step::Done(backend_failure(self.allow_degradation));
            }
            Err(e) => {
                tracing::error!("failed to get limit conn rules: {e}");
                return Step::Done(backend_failure(self.allow_degradation));
            }
        };
        if let Some(r) = &self.remote {
            let rules = rules
                .into_iter()
                .map(|a| (a.key.into_text(), a.conn, a.burst))
                .collect();
            return Step::Wait(Box::pin(self.run_remote(r, rules, ctx)));
        }
        // Locally every rule is counted at once and the delays are slept together: APISIX
        // sleeps after each rule, which only moves the later rules' counts later. A rule
        // that rejects leaves the earlier rules' slots to be released with the request.
        let owned: smallvec::SmallVec<[(OwnedKey, u64, u64); 1]> = rules
            .into_iter()
            .map(|r| (OwnedKey::from_ref(r.key.as_ref()), r.conn, r.burst))
            .collect();
        let mut delay = 0.0;
        for (key, conn, burst) in owned {
            let Some(count) = self
                .space
                .incoming(key.as_ref(), conn.saturating_add(burst))
            else {
                return Step::Done(Flow::Exit(self.rejection.clone()));
            };
            let d = self.delay_for(count, conn);
            ctx.add_guard(self.guard(Held::Local(key), d));
            if d >= 0.001 {
                delay += d;
            }
        }
        if delay >= 0.001 {
            return Step::Wait(Box::pin(async move {
                tokio::time::sleep(Duration::from_secs_f64(delay)).await;
                Flow::Continue
            }));
        }
        Step::CONTINUE
    }
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use ferrisix_plugin_api::RequestGuards;

    use super::*;
    use crate::support::redis::test_server::{self, remote};
    use crate::testing::{request, Compiler};

    fn compiler() -> &'static Compiler {
        static C: OnceLock<Compiler> = OnceLock::new();
        C.get_or_init(Compiler::new)
    }

    fn compile(conf: Value, owner: &str) -> LimitConn {
        LimitConn::compile(&compiler().cx(NAME, &conf, owner, None)).unwrap()
    }

    /// Runs access for client `ip`; answers the flow (delays are not awaited) and the guards.
    fn run(lc: &LimitConn, ip: &str) -> (Flow, bool, RequestGuards) {
        let mut req = request(ip, &[]);
        let mut ctx = req.ctx();
        let (flow, delayed) = match lc.access(&mut ctx) {
            Step::Done(f) => (f, false),
            Step::Wait(_) => (Flow::Continue, true),
        };
        (flow, delayed, req.state.take_guards())
    }

    #[test]
    fn reject_delay_and_decrement_on_drop() {
        let lc = compile(
            json!({"conn": 1, "burst": 1, "default_conn_delay": 0.1, "key": "remote_addr",
                   "only_use_default_delay": true, "rejected_msg": "busy"}),
            "lcn-t1",
        );
        let key = KeyRef::Ip("10.0.0.1".parse().unwrap());
        let (f1, d1, g1) = run(&lc, "10.0.0.1");
        assert_eq!((f1, d1), (Flow::Continue, false));
        // Second is within burst: delayed by unit_delay * floor(1 / 1).
        let (f2, d2, g2) = run(&lc, "10.0.0.1");
        assert_eq!((f2, d2), (Flow::Continue, true));
        assert_eq!(lc.space.count(key), 2);
        // Third is over conn + burst: rejected, count unchanged, no guard.
        let (f3, _, g3) = run(&lc, "10.0.0.1");
        let Flow::Exit(e) = f3 else { panic!() };
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.body.unwrap(), "{\"error_msg\":\"busy\"}\n");
        assert!(g3.is_empty());
        assert_eq!(lc.space.count(key), 2);
        // Another client is counted apart.
        let (f4, d4, g4) = run(&lc, "10.0.0.2");
        assert_eq!((f4, d4), (Flow::Continue, false));
        drop(g4);
        // Finishing requests (dropping their guards) decrements exactly once each.
        drop(g2);
        assert_eq!(lc.space.count(key), 1);
        drop(g1);
        assert_eq!(lc.space.count(key), 0);
        assert!(!lc.space.live(), "empty entries are removed");
        assert_eq!(lc.space.unit_delay(), 0.1, "only_use_default_delay");
        assert_eq!(run(&lc, "10.0.0.1").0, Flow::Continue);
    }

    #[test]
    fn delay_scales_with_count_and_adapts() {
        let s = ConnSpace::new(0.5, Clock::system());
        let k = KeyRef::Text("k");
        let counts: Vec<_> = (0..5).map(|_| s.incoming(k, 2 + 10)).collect();
        assert_eq!(counts, [Some(1), Some(2), Some(3), Some(4), Some(5)]);
        // resty.limit.conn: unit_delay * floor((conn - 1) / max) with max 2.
        let delay = |c: u64| s.unit_delay() * ((c - 1) / 2) as f64;
        assert_eq!((delay(3), delay(4), delay(5)), (0.5, 0.5, 1.0));
        s.adapt(0.1);
        assert!((s.unit_delay() - 0.3).abs() < 1e-9);
    }

    #[test]
    fn concurrent_counts_with_threads() {
        let s = Arc::new(ConnSpace::new(0.1, Clock::system()));
        let admitted = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (s, admitted) = (s.clone(), admitted.clone());
                std::thread::spawn(move || {
                    let mut held = 0;
                    for _ in 0..100 {
                        if s.incoming(KeyRef::Text("shared"), 50).is_some() {
                            held += 1;
                        }
                    }
                    admitted.fetch_add(held, Ordering::Relaxed);
                    held
                })
            })
            .collect();
        let held: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(admitted.load(Ordering::Relaxed), 50, "exactly conn + burst");
        assert_eq!(s.count(KeyRef::Text("shared")), 50);
        // Everyone leaves from several threads: back to zero.
        let threads: Vec<_> = held
            .into_iter()
            .map(|n| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..n {
                        s.leaving(KeyRef::Text("shared"));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(s.count(KeyRef::Text("shared")), 0);
    }

    /// Runs access with the request headers `vars` (`http_*`).
    fn run_with(lc: &LimitConn, vars: &[(&'static str, &'static str)]) -> (Flow, RequestGuards) {
        let mut req = request("10.1.0.1", vars);
        let mut ctx = req.ctx();
        let flow = match lc.access(&mut ctx) {
            Step::Done(f) => f,
            Step::Wait(_) => Flow::Continue,
        };
        (flow, req.state.take_guards())
    }

    fn status(f: &Flow) -> Option<u16> {
        match f {
            Flow::Exit(e) => Some(e.status.as_u16()),
            _ => None,
        }
    }

    /// 3.16's `rules`: each rule counts its own key, every rule that applies must admit the
    /// request, and a rule whose key resolves no variable (or whose numbers do not resolve)
    /// is skipped; with no rule left the request fails (500, or passes with
    /// `allow_degradation`).
    #[test]
    fn rules_count_their_own_keys_and_skip_what_does_not_resolve() {
        let lc = compile(
            json!({"default_conn_delay": 0.1, "rejected_code": 429, "rules": [
                {"key": "${http_x_sub}", "conn": "${http_x_conn ?? 2}", "burst": 0},
                {"key": "trial-${http_x_trial}", "conn": 1, "burst": 0},
                {"key": "constant", "conn": 1, "burst": 0}
            ]}),
            "lcn-rules",
        );
        // The subscription's rule: 2 in flight (the default of `${http_x_conn ?? 2}`).
        let (f1, g1) = run_with(&lc, &[("http_x_sub", "s1")]);
        let (f2, g2) = run_with(&lc, &[("http_x_sub", "s1")]);
        let (f3, g3) = run_with(&lc, &[("http_x_sub", "s1")]);
        assert_eq!(
            (status(&f1), status(&f2), status(&f3)),
            (None, None, Some(429))
        );
        assert!(g3.is_empty());
        // The header raises this request's own limit.
        let (f4, g4) = run_with(&lc, &[("http_x_sub", "s1"), ("http_x_conn", "3")]);
        assert_eq!(status(&f4), None);
        drop((g1, g2, g4));
        // Both rules apply: the trial's limit of 1 rejects the second, though the
        // subscription's would admit it; the guards of the rules passed are released.
        let (f5, g5) = run_with(&lc, &[("http_x_sub", "s2"), ("http_x_trial", "t")]);
        let (f6, g6) = run_with(&lc, &[("http_x_sub", "s2"), ("http_x_trial", "t")]);
        assert_eq!((status(&f5), status(&f6)), (None, Some(429)));
        drop(g6);
        assert_eq!(lc.space.count(KeyRef::Text("s2")), 1);
        assert_eq!(lc.space.count(KeyRef::Text("trial-t")), 1);
        drop(g5);
        assert!(!lc.space.live());
        // A conn that resolves to no number skips its rule; the constant key never applies
        // (it resolves no variable): nothing is left, so the request fails.
        let (f7, _) = run_with(&lc, &[("http_x_sub", "s3"), ("http_x_conn", "many")]);
        assert_eq!(status(&f7), Some(500));
        let (f8, _) = run_with(&lc, &[]);
        assert_eq!(status(&f8), Some(500));
        let degrade = compile(
            json!({"default_conn_delay": 0.1, "allow_degradation": true,
                   "rules": [{"key": "${http_x_sub}", "conn": 1, "burst": 0}]}),
            "lcn-rules-2",
        );
        assert_eq!(run_with(&degrade, &[]).0, Flow::Continue);
    }

    /// `conn` and `burst` as variables on the single conf: resolved per request, and a value
    /// that is no integer in range fails the request with APISIX's reason.
    #[test]
    fn conn_and_burst_resolve_per_request() {
        let lc = compile(
            json!({"conn": "${http_x_conn}", "burst": "${http_x_burst ?? 0}",
                   "default_conn_delay": 0.1, "key": "remote_addr"}),
            "lcn-vars",
        );
        let (f1, g1) = run_with(&lc, &[("http_x_conn", "1")]);
        let (f2, _) = run_with(&lc, &[("http_x_conn", "1")]);
        assert_eq!((status(&f1), status(&f2)), (None, Some(503)));
        let (f3, _g3) = run_with(&lc, &[("http_x_conn", "1"), ("http_x_burst", "1")]);
        assert_eq!(status(&f3), None, "within the burst (delayed)");
        drop(g1);
        for bad in ["0", "1.5", "x", "-1"] {
            let bad: &'static str = Box::leak(bad.to_owned().into_boxed_str());
            let (f, _) = run_with(&lc, &[("http_x_conn", bad)]);
            assert_eq!(status(&f), Some(500), "conn {bad}");
        }
        let a = Amount::Var(Template::parse("${http_x_conn}"));
        let mut req = request("10.1.0.1", &[("http_x_conn", "1.5")]);
        let ctx = req.ctx();
        assert_eq!(
            a.resolve(&ctx, false).unwrap_err(),
            "resolved value must be an integer, got: 1.5"
        );
        assert_eq!(
            Amount::Var(Template::parse("-1"))
                .resolve(&ctx, true)
                .unwrap_err(),
            "resolved value must be a non-negative number, got: -1"
        );
    }

    #[tokio::test]
    async fn abandoned_request_decrements() {
        let lc = compile(
            json!({"conn": 1, "burst": 1, "default_conn_delay": 30, "key": "remote_addr"}),
            "lcn-t2",
        );
        let key = KeyRef::Ip("10.0.0.9".parse().unwrap());
        let (_, _, g1) = run(&lc, "10.0.0.9");
        {
            // The second request waits 30 s; the client goes away during the delay: the
            // request's future and context (with its guard) are dropped.
            let mut req = request("10.0.0.9", &[]);
            let mut ctx = req.ctx();
            let Step::Wait(fut) = lc.access(&mut ctx) else {
                panic!("delayed")
            };
            assert!(tokio::time::timeout(Duration::from_millis(10), fut)
                .await
                .is_err());
            assert_eq!(lc.space.count(key), 2);
        }
        assert_eq!(lc.space.count(key), 1);
        drop(g1);
        assert_eq!(lc.space.count(key), 0);
    }

    #[test]
    fn request_ids_are_uuid_v4() {
        let (a, b) = (request_id(), request_id());
        assert_ne!(a, b);
        let parts: Vec<&str> = a.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('4'), "{a}");
        assert!(matches!(&parts[3][..1], "8" | "9" | "a" | "b"), "{a}");
    }

    /// Runs access for `ip`, awaiting any future (delays included); answers the flow and guards.
    async fn run_async(lc: &LimitConn, ip: &str) -> (Flow, RequestGuards) {
        let mut req = request(ip, &[]);
        let mut ctx = req.ctx();
        let flow = match lc.access(&mut ctx) {
            Step::Done(f) => f,
            Step::Wait(fut) => fut.await,
        };
        (flow, req.state.take_guards())
    }

    #[tokio::test]
    async fn unreachable_redis_fails_or_degrades() {
        let port = test_server::free_port();
        for degrade in [false, true] {
            let lc = compile(
                json!({"conn": 1, "burst": 0, "default_conn_delay": 0.1, "key": "remote_addr",
                    "policy": "redis", "redis_host": "127.0.0.1", "redis_port": port,
                    "redis_timeout": 200, "allow_degradation": degrade}),
                "lcn-t3",
            );
            let (flow, guards) = run_async(&lc, "10.0.0.1").await;
            assert!(guards.is_empty(), "nothing to release");
            if degrade {
                assert_eq!(flow, Flow::Continue);
            } else {
                assert_eq!(
                    flow,
                    Flow::Exit(Exit::status(StatusCode::INTERNAL_SERVER_ERROR))
                );
            }
        }
    }

    async fn zcard(r: &Remote, key: &str) -> u64 {
        r.query(redis::cmd("ZCARD").arg(key)).await.unwrap()
    }

    /// Polls `check` every 10 ms for up to 10 s: the releases are asynchronous.
    async fn eventually(mut check: impl AsyncFnMut() -> bool) -> bool {
        for _ in 0..1000 {
            if check().await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    #[tokio::test]
    async fn redis_counts_delays_rejects_and_releases() {
        let server = test_server::TestRedis::start();
        let conf = json!({"conn": 1, "burst": 1, "default_conn_delay": 0.01, "key": "remote_addr",
            "only_use_default_delay": true, "rejected_code": 429, "policy": "redis",
            "redis_host": "127.0.0.1", "redis_port": server.port});
        // Two instances: two gateways sharing the count.
        let a = compile(conf.clone(), "lcn-t4");
        let b = compile(conf.clone(), "lcn-t4");
        let key = format!(
            "limit_conn:/apisix/routes/lcn-t4:{}:10.0.0.1",
            compiler().cx(NAME, &conf, "lcn-t4", None).conf_version()
        );
        let r = remote(server.port);
        let (f1, g1) = run_async(&a, "10.0.0.1").await;
        assert_eq!((f1, g1.len()), (Flow::Continue, 1));
        // The second is within burst (delayed by unit_delay); the third is over.
        let (f2, g2) = run_async(&b, "10.0.0.1").await;
        assert_eq!((f2, g2.len()), (Flow::Continue, 1));
        let (f3, g3) = run_async(&a, "10.0.0.1").await;
        let Flow::Exit(e) = f3 else {
            panic!("rejected")
        };
        assert_eq!(e.status, 429);
        assert!(g3.is_empty());
        assert_eq!(zcard(&r, &key).await, 2);
        // The members expire with key_ttl (default 3600 s), and so does the key.
        let ttl: i64 = r.query(redis::cmd("TTL").arg(&key)).await.unwrap();
        assert!(ttl > 3500 && ttl <= 3600, "{ttl}");
        // Another client counts apart.
        let (f4, g4) = run_async(&b, "10.0.0.2").await;
        assert_eq!((f4, g4.len()), (Flow::Continue, 1));
        drop((g1, g4));
        assert!(eventually(async || zcard(&r, &key).await == 1).await);
        drop(g2);
        assert!(eventually(async || zcard(&r, &key).await == 0).await);
        assert!(a.space.counts.is_empty(), "the local counts stay unused");
        assert_eq!(run_async(&a, "10.0.0.1").await.0, Flow::Continue);
    }

    #[tokio::test]
    async fn redis_increment_of_an_abandoned_request_is_released() {
        let server = test_server::TestRedis::start();
        let r = remote(server.port);
        let key = "limit_conn:t:abandoned".to_string();
        {
            let fut = std::pin::pin!(remote_incoming(
                &r,
                key.clone(),
                5,
                3600,
                Clock::system().epoch_ms() / 1000
            ));
            // Polled once (the increment is under way on the Redis thread), then dropped.
            assert!(futures_poll_once(fut).is_none());
        }
        // The increment completed and its slot was released: one ZREM, nothing left.
        let released = eventually(async || {
            let stats: String = r
                .query(redis::cmd("INFO").arg("commandstats"))
                .await
                .unwrap();
            stats.contains("cmdstat_zrem:calls=1,")
        })
        .await;
        assert!(released);
        assert_eq!(zcard(&r, &key).await, 0);
    }

    /// Polls a future once with a no-op waker.
    fn futures_poll_once<F: std::future::Future>(fut: std::pin::Pin<&mut F>) -> Option<F::Output> {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match fut.poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }

    #[tokio::test]
    async fn redis_slots_of_a_lost_gateway_lapse_after_key_ttl() {
        let server = test_server::TestRedis::start();
        let lc = compile(
            json!({"conn": 1, "burst": 0, "default_conn_delay": 0.01, "key": "remote_addr",
                "key_ttl": 1, "policy": "redis", "redis_host": "127.0.0.1",
                "redis_port": server.port}),
            "lcn-t5",
        );
        let (f1, g1) = run_async(&lc, "10.0.0.1").await;
        assert_eq!(f1, Flow::Continue);
        assert!(matches!(run_async(&lc, "10.0.0.1").await.0, Flow::Exit(_)));
        // The holder never releases (a gateway that died): its member lapses after key_ttl.
        std::mem::forget(g1);
        let admitted = eventually(async || {
            let (f, _) = run_async(&lc, "10.0.0.1").await;
            f == Flow::Continue
        })
        .await;
        assert!(admitted);
    }
}
