//! limit-req: APISIX's `limit-req` plugin, the leaky bucket of lua-resty-limit-traffic's
//! `resty.limit.req`, kept in the process (`local`) or in Redis (`redis`, `redis-cluster`).
//!
//! Each key's bucket holds `excess` (requests above the rate) and the time of the last
//! accepted request. A request computes `excess = max(prev - rate * elapsed + 1, 0)`: above
//! `burst` it is rejected (and not recorded); otherwise it is recorded and, unless `nodelay`,
//! delayed by `excess / rate` seconds. The bucket key is `<owner>:<crc32 of the conf>:<key>`,
//! so an unchanged conf keeps its buckets across snapshots.
//!
//! With a redis policy (`apisix/plugins/limit-req/util.lua`) the bucket is the hash
//! `limit_req:<bucket key>` with fields `excess` and `last` (epoch ms), read, decayed and
//! written by one script (one round trip, atomic), so every gateway using that Redis shares
//! the bucket; the arithmetic is the local one. A Redis error answers 500, or lets the request
//! through with `allow_degradation`.
//!
//! Not the `governor` crate: its GCRA has integer burst cells and no fractional excess/delay,
//! so it cannot reproduce `excess > burst` and `excess / rate` exactly; APISIX's semantics win.

use std::sync::Arc;
use std::time::Duration;

use ferrisix_plugin_api::{
    Clock, CompileCtx, Exit, Flow, KeyRef, KeySpec, Keyed, Lease, Phases, Plugin, PluginCtx,
    PluginDef, Retain, Slot, StateMap, Step,
};
use http::StatusCode;
use serde_json::{json, Map, Value};

use crate::support::redis::{self as redis_support, Remote, RemoteError};

pub const NAME: &str = "limit-req";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &["redis_password"],
    ..PluginDef::new(NAME, 1001, schema, compile)
};

/// apisix/plugins/limit-req.lua.
fn schema() -> Value {
    redis_support::with_policy_clauses(json!({
        "type": "object",
        "properties": {
            "rate": {"type": "number", "exclusiveMinimum": 0},
            "burst": {"type": "number", "minimum": 0},
            "key": {"type": "string"},
            "key_type": {"type": "string", "enum": ["var", "var_combination"], "default": "var"},
            "policy": {"type": "string", "enum": ["redis", "redis-cluster", "local"], "default": "local"},
            "rejected_code": {"type": "integer", "minimum": 200, "maximum": 599, "default": 503},
            "rejected_msg": {"type": "string", "minLength": 1},
            "nodelay": {"type": "boolean", "default": false},
            "allow_degradation": {"type": "boolean", "default": false}
        },
        "required": ["rate", "burst", "key"]
    }))
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(LimitReq::compile(cx)?))
}

/// One key's bucket, in lua-resty-limit-traffic's units (requests × 1000, milliseconds).
#[derive(Clone, Copy, Debug)]
struct Bucket {
    excess: f64,
    last_ms: u64,
}

/// The buckets of one configuration.
pub struct ReqSpace {
    buckets: Keyed<Bucket>,
    /// `rate * 1000`, to know when a bucket has drained (sweeping).
    rate: f64,
    clock: Clock,
}

impl std::fmt::Debug for ReqSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReqSpace")
    }
}

/// What one request did to its bucket.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decision {
    Rejected,
    /// Accepted; the delay in seconds (`excess / rate`).
    Accepted(f64),
}

impl ReqSpace {
    pub fn new(rate: f64, clock: Clock) -> ReqSpace {
        ReqSpace {
            buckets: Keyed::default(),
            rate: rate * 1000.0,
            clock,
        }
    }

    /// A bucket whose next request would find excess 0 is the same as no bucket.
    fn drained(rate: f64, now_ms: u64) -> impl Fn(&Bucket) -> bool {
        move |b: &Bucket| {
            b.excess + 1000.0 - rate * now_ms.saturating_sub(b.last_ms) as f64 / 1000.0 <= 0.0
        }
    }

    /// `resty.limit.req`'s `incoming(key, true)` at `now_ms`.
    pub fn incoming(&self, key: KeyRef<'_>, burst: f64, now_ms: u64) -> Decision {
        let rate = self.rate;
        let burst = burst * 1000.0;
        let fresh = Bucket {
            excess: 0.0,
            last_ms: now_ms,
        };
        self.buckets.update(
            key,
            now_ms,
            Self::drained(rate, now_ms),
            |prev| match prev {
                Some(b) => {
                    let elapsed = now_ms.abs_diff(b.last_ms) as f64;
                    let excess = (b.excess - rate * elapsed / 1000.0 + 1000.0).max(0.0);
                    if excess > burst {
                        return (Slot::Keep, Decision::Rejected);
                    }
                    *b = Bucket {
                        excess,
                        last_ms: now_ms,
                    };
                    (Slot::Keep, Decision::Accepted(excess / rate))
                }
                None => (Slot::Insert(fresh), Decision::Accepted(0.0)),
            },
        )
    }
}

impl Retain for ReqSpace {
    /// A bucket still holding excess outlives its configuration.
    fn retain(&self) -> bool {
        self.buckets
            .sweep(Self::drained(self.rate, self.clock.mono_ms()))
    }
}

/// The limit-req spaces of one gateway.
pub type ReqSpaces = StateMap<ReqSpace>;

/// The bucket script (`apisix/plugins/limit-req/util.lua`'s commit path). KEYS[1]: the
/// bucket hash; ARGV: rate and burst (both × 1000), now (epoch ms), TTL (s). Answers
/// `{1, excess}` (recorded) or `{0, excess}` (rejected, nothing written); excess as a string,
/// since Redis truncates Lua numbers to integers in replies.
fn bucket_script() -> &'static redis::Script {
    static S: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        redis::Script::new(
            "local rate = tonumber(ARGV[1])\n\
             local burst = tonumber(ARGV[2])\n\
             local now = tonumber(ARGV[3])\n\
             local state = redis.call('hmget', KEYS[1], 'excess', 'last')\n\
             local excess = 0\n\
             if state[1] and state[2] then\n\
               local elapsed = math.abs(now - tonumber(state[2]))\n\
               excess = math.max(tonumber(state[1]) - rate * elapsed / 1000 + 1000, 0)\n\
               if excess > burst then return {0, tostring(excess)} end\n\
             end\n\
             redis.call('hset', KEYS[1], 'excess', excess, 'last', now)\n\
             redis.call('expire', KEYS[1], ARGV[4])\n\
             return {1, tostring(excess)}\n",
        )
    })
}

/// The bucket's expiry: APISIX's `ceil(burst / rate) + 1` seconds, but never before the bucket
/// has drained (`(burst + 1) / rate`), which APISIX's falls short of for rates below 1/s and
/// would then forget excess the local policy still holds.
fn bucket_ttl(rate: f64, burst: f64) -> u64 {
    let apisix = (burst / rate).ceil() + 1.0;
    let drained = ((burst + 1.0) / rate).ceil();
    apisix.max(drained).min(u32::MAX as f64) as u64
}

/// One request against the bucket `key` (`limit_req:...`) in Redis at `now_ms` (epoch).
pub async fn remote_incoming(
    remote: &Remote,
    key: &str,
    rate: f64,
    burst: f64,
    now_ms: u64,
) -> Result<Decision, RemoteError> {
    let (recorded, excess): (i64, String) = remote
        .invoke(
            bucket_script()
                .key(key)
                .arg(rate * 1000.0)
                .arg(burst * 1000.0)
                .arg(now_ms)
                .arg(bucket_ttl(rate, burst)),
        )
        .await?;
    let excess: f64 = excess.trim().parse().map_err(|_| RemoteError {
        message: format!("limit-req script answered excess {excess:?}"),
        maybe_applied: true,
    })?;
    Ok(if recorded == 0 {
        Decision::Rejected
    } else {
        Decision::Accepted(excess / (rate * 1000.0))
    })
}

/// Where the buckets live.
enum Backend {
    Local(Lease<ReqSpace>),
    /// The Redis pool and `<owner>:<crc32 of the conf>`.
    Remote(Remote, Arc<str>),
}

/// One compiled limit-req configuration.
pub struct LimitReq {
    backend: Backend,
    rate: f64,
    burst: f64,
    key: KeySpec,
    nodelay: bool,
    allow_degradation: bool,
    rejection: Exit,
    clock: Clock,
}

fn field<'a>(c: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    c.get(name)
}

/// After a Redis error: pass with `allow_degradation`, else 500 (`return 500`: nginx's page).
fn backend_failure(allow_degradation: bool) -> Flow {
    if allow_degradation {
        return Flow::Continue;
    }
    Flow::Exit(Exit::status(StatusCode::INTERNAL_SERVER_ERROR))
}

impl LimitReq {
    pub fn compile(cx: &CompileCtx<'_>) -> Result<LimitReq, String> {
        let c = cx.object()?;
        let rate = field(c, "rate")
            .and_then(Value::as_f64)
            .filter(|r| *r > 0.0)
            .ok_or("rate must be a number greater than 0")?;
        let burst = field(c, "burst")
            .and_then(Value::as_f64)
            .filter(|b| *b >= 0.0)
            .ok_or("burst must be a number not less than 0")?;
        let key = field(c, "key")
            .and_then(Value::as_str)
            .ok_or("key is missing")?;
        let key_type = field(c, "key_type")
            .and_then(Value::as_str)
            .unwrap_or("var");
        let prefix = cx.state_key();
        let services = cx.services;
        let backend = match redis_support::policy_remote(NAME, c, services)? {
            Some(remote) => Backend::Remote(remote, prefix.into()),
            None => {
                let clock = services.clock().clone();
                Backend::Local(
                    services
                        .shared::<ReqSpaces>()
                        .lease(&prefix, || ReqSpace::new(rate, clock)),
                )
            }
        };
        Ok(LimitReq {
            backend,
            rate,
            burst,
            key: KeySpec::new(key_type, key),
            nodelay: field(c, "nodelay").and_then(Value::as_bool) == Some(true),
            allow_degradation: field(c, "allow_degradation").and_then(Value::as_bool) == Some(true),
            rejection: Exit::rejection(c, 503)?,
            clock: services.clock().clone(),
        })
    }

    /// What a decision does to the request (the delay is only awaited when there is one).
    fn decided(&self, decision: Decision) -> Result<Flow, f64> {
        match decision {
            Decision::Rejected => Ok(Flow::Exit(self.rejection.clone())),
            Decision::Accepted(delay) if delay >= 0.001 && !self.nodelay => Err(delay),
            Decision::Accepted(_) => Ok(Flow::Continue),
        }
    }

    async fn run_remote(&self, remote: &Remote, prefix: &str, key: String) -> Flow {
        let key = format!("limit_req:{prefix}:{key}");
        let now = self.clock.epoch_ms();
        match remote_incoming(remote, &key, self.rate, self.burst, now).await {
            Ok(decision) => match self.decided(decision) {
                Ok(flow) => flow,
                Err(delay) => {
                    tokio::time::sleep(Duration::from_secs_f64(delay)).await;
                    Flow::Continue
                }
            },
            Err(e) => {
                tracing::error!("failed to limit req: {e}");
                backend_failure(self.allow_degradation)
            }
        }
    }
}

impl Plugin for LimitReq {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let key = self.key.resolve(ctx);
        match &self.backend {
            Backend::Local(space) => {
                let now = self.clock.mono_ms();
                match self.decided(space.incoming(key.as_ref(), self.burst, now)) {
                    Ok(flow) => Step::Done(flow),
                    Err(delay) => Step::Wait(Box::pin(async move {
                        tokio::time::sleep(Duration::from_secs_f64(delay)).await;
                        Flow::Continue
                    })),
                }
            }
            Backend::Remote(remote, prefix) => {
                let key = key.into_text();
                Step::Wait(Box::pin(self.run_remote(remote, prefix, key)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use super::*;
    use crate::support::redis::test_server::{self, remote};
    use crate::testing::{request, Compiler};

    fn compiler() -> &'static Compiler {
        static C: OnceLock<Compiler> = OnceLock::new();
        C.get_or_init(Compiler::new)
    }

    fn compile(conf: Value, owner: &str) -> Result<LimitReq, String> {
        LimitReq::compile(&compiler().cx(NAME, &conf, owner, None))
    }

    #[test]
    fn leaky_bucket_burst_and_delay() {
        let s = ReqSpace::new(2.0, Clock::system());
        let k = KeyRef::Text("k");
        // rate 2/s, burst 1: first passes undelayed, second has excess 1 → 0.5 s delay.
        assert_eq!(s.incoming(k, 1.0, 10_000), Decision::Accepted(0.0));
        assert_eq!(s.incoming(k, 1.0, 10_000), Decision::Accepted(0.5));
        // Third at the same instant: excess 2 > burst 1 → rejected, and not recorded.
        assert_eq!(s.incoming(k, 1.0, 10_000), Decision::Rejected);
        // 250 ms later half a request has leaked: excess 1 - 0.5 + 1 = 1.5 > 1.
        assert_eq!(s.incoming(k, 1.0, 10_250), Decision::Rejected);
        // 500 ms later: 1 - 1 + 1 = 1 → accepted with a 0.5 s delay.
        assert_eq!(s.incoming(k, 1.0, 10_500), Decision::Accepted(0.5));
        // Another key has its own bucket.
        assert_eq!(
            s.incoming(KeyRef::Text("other"), 1.0, 10_500),
            Decision::Accepted(0.0)
        );
        // Drained after a long pause.
        assert_eq!(s.incoming(k, 1.0, 20_000), Decision::Accepted(0.0));
    }

    #[test]
    fn rejection_with_and_without_message() {
        let lr = compile(
            json!({"rate": 1, "burst": 0, "key": "remote_addr"}),
            "lr-t1",
        )
        .unwrap();
        let run = |lr: &LimitReq| {
            let mut req = request("10.0.0.1", &[]);
            let mut ctx = req.ctx();
            let step = lr.access(&mut ctx);
            match step {
                Step::Done(f) => f,
                Step::Wait(_) => panic!("no delay expected"),
            }
        };
        assert_eq!(run(&lr), Flow::Continue);
        assert_eq!(
            run(&lr),
            Flow::Exit(Exit::status(StatusCode::SERVICE_UNAVAILABLE))
        );
        let lr = compile(
            json!({"rate": 1, "burst": 0, "key": "remote_addr", "rejected_code": 429, "rejected_msg": "slow down"}),
            "lr-t2",
        )
        .unwrap();
        assert_eq!(run(&lr), Flow::Continue);
        let Flow::Exit(e) = run(&lr) else { panic!() };
        assert_eq!(e.status, 429);
        assert_eq!(e.body.unwrap(), "{\"error_msg\":\"slow down\"}\n");
    }

    #[tokio::test(start_paused = true)]
    async fn delay_vs_nodelay() {
        for (nodelay, owner) in [(false, "lr-t3"), (true, "lr-t4")] {
            let lr = compile(
                json!({"rate": 10, "burst": 5, "key": "remote_addr", "nodelay": nodelay}),
                owner,
            )
            .unwrap();
            let mut req = request("10.0.0.1", &[]);
            let mut ctx = req.ctx();
            assert!(matches!(lr.access(&mut ctx), Step::Done(Flow::Continue)));
            let step = lr.access(&mut ctx);
            match step {
                Step::Wait(fut) => {
                    assert!(!nodelay);
                    let start = tokio::time::Instant::now();
                    assert_eq!(fut.await, Flow::Continue);
                    // excess ≈ 1 request at 10/s: about 100 ms.
                    let waited = start.elapsed();
                    assert!(
                        waited >= Duration::from_millis(90) && waited <= Duration::from_millis(101),
                        "{waited:?}"
                    );
                }
                Step::Done(f) => {
                    assert!(nodelay);
                    assert_eq!(f, Flow::Continue);
                }
            }
        }
    }

    fn space(lr: &LimitReq) -> &Arc<ReqSpace> {
        match &lr.backend {
            Backend::Local(s) => s.state(),
            Backend::Remote(..) => panic!("local expected"),
        }
    }

    #[test]
    fn same_conf_keeps_buckets() {
        let conf = json!({"rate": 1, "burst": 0, "key": "remote_addr"});
        let a = compile(conf.clone(), "lr-t5").unwrap();
        let b = compile(
            json!({"rate": 1, "burst": 0, "key": "remote_addr", "rejected_code": 503}),
            "lr-t5",
        )
        .unwrap();
        assert!(Arc::ptr_eq(space(&a), space(&b)));
        let c = compile(conf, "lr-t5-other").unwrap();
        assert!(!Arc::ptr_eq(space(&a), space(&c)));
    }

    #[test]
    fn bucket_ttl_is_apisix_or_the_drain_time() {
        // APISIX's ceil(burst / rate) + 1 where that outlasts the excess.
        assert_eq!(bucket_ttl(1.0, 0.0), 1);
        assert_eq!(bucket_ttl(10.0, 5.0), 2);
        assert_eq!(bucket_ttl(2.0, 99.0), 51);
        // Below 1/s the excess takes longer to drain than APISIX's TTL.
        assert_eq!(bucket_ttl(0.1, 0.0), 10);
        assert_eq!(bucket_ttl(0.001, 99.0), 100_000);
    }

    /// Runs access once; awaits any future (delays included).
    async fn run_async(lr: &LimitReq, ip: &str) -> Flow {
        let mut req = request(ip, &[]);
        let mut ctx = req.ctx();
        let step = lr.access(&mut ctx);
        let flow = match step {
            Step::Done(f) => f,
            Step::Wait(fut) => fut.await,
        };
        flow
    }

    #[tokio::test]
    async fn unreachable_redis_fails_or_degrades() {
        let port = test_server::free_port();
        for degrade in [false, true] {
            let lr = compile(
                json!({"rate": 1, "burst": 0, "key": "remote_addr", "policy": "redis",
                    "redis_host": "127.0.0.1", "redis_port": port, "redis_timeout": 200,
                    "allow_degradation": degrade}),
                "lr-t7",
            )
            .unwrap();
            let flow = run_async(&lr, "10.0.0.1").await;
            if degrade {
                assert_eq!(flow, Flow::Continue);
            } else {
                // APISIX's `return 500`: nginx's page, no JSON body.
                assert_eq!(
                    flow,
                    Flow::Exit(Exit::status(StatusCode::INTERNAL_SERVER_ERROR))
                );
            }
        }
    }

    /// The script makes the local policy's decisions, step for step.
    #[tokio::test]
    async fn redis_bucket_decides_as_the_local_one() {
        let server = test_server::TestRedis::start();
        let r = remote(server.port);
        let local = ReqSpace::new(2.0, Clock::system());
        let steps = [
            ("k", 10_000),
            ("k", 10_000),
            ("k", 10_000),
            ("k", 10_250),
            ("k", 10_500),
            ("other", 10_500),
            ("k", 10_600),
            ("k", 20_000),
            ("k", 19_990),
        ];
        for (key, now) in steps {
            let want = local.incoming(KeyRef::Text(key), 1.0, now);
            let got = remote_incoming(&r, &format!("limit_req:t:{key}"), 2.0, 1.0, now)
                .await
                .unwrap();
            assert_eq!(got, want, "{key} at {now}");
        }
        // Fractional rates and bursts keep their fractions (excess comes back as text).
        for (now, want) in [
            (0, Decision::Accepted(0.0)),
            (0, Decision::Accepted(1.0 / 0.4)),
            (0, Decision::Rejected),
        ] {
            let got = remote_incoming(&r, "limit_req:t:frac", 0.4, 1.5, now)
                .await
                .unwrap();
            assert_eq!(got, want);
        }
    }

    #[tokio::test]
    async fn redis_policy_end_to_end_in_process() {
        let server = test_server::TestRedis::start();
        let conf = json!({"rate": 0.001, "burst": 1, "key": "remote_addr", "nodelay": true,
            "policy": "redis", "redis_host": "127.0.0.1", "redis_port": server.port,
            "rejected_code": 429});
        // Two compiled instances (two gateways, or two snapshots) share the bucket.
        let a = compile(conf.clone(), "lr-t8").unwrap();
        let b = compile(conf.clone(), "lr-t8").unwrap();
        assert_eq!(run_async(&a, "10.0.0.1").await, Flow::Continue);
        assert_eq!(run_async(&b, "10.0.0.1").await, Flow::Continue);
        let Flow::Exit(e) = run_async(&a, "10.0.0.1").await else {
            panic!("rejected")
        };
        assert_eq!(e.status, 429);
        assert_eq!(run_async(&b, "10.0.0.2").await, Flow::Continue);
        // APISIX's key: limit_req:<owner>:<conf version>:<key>, with an expiry.
        let key = format!(
            "limit_req:/apisix/routes/lr-t8:{}:10.0.0.1",
            compiler().cx(NAME, &conf, "lr-t8", None).conf_version()
        );
        let r = remote(server.port);
        let (excess, ttl): (Option<f64>, i64) = (
            r.query(redis::cmd("HGET").arg(&key).arg("excess"))
                .await
                .unwrap(),
            r.query(redis::cmd("TTL").arg(&key)).await.unwrap(),
        );
        // One request above the rate, less what leaked (at 0.001/s) between the requests.
        assert!(
            excess.is_some_and(|e| e > 990.0 && e <= 1000.0),
            "{excess:?}"
        );
        assert!(ttl > 0, "{ttl}");
    }

    #[test]
    fn shared_across_threads() {
        // rate tiny, burst 99: exactly 100 requests get through whatever the interleaving.
        let s = Arc::new(ReqSpace::new(0.000_001, Clock::system()));
        let passed = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (s, passed) = (s.clone(), passed.clone());
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        if s.incoming(KeyRef::Text("shared"), 99.0, 5_000) != Decision::Rejected {
                            passed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(passed.load(std::sync::atomic::Ordering::Relaxed), 100);
    }
}
