//! limit-req: APISIX's `limit-req` plugin, the leaky bucket of lua-resty-limit-traffic's
//! `resty.limit.req`, kept in the process (`local`).
//!
//! Each key's bucket holds `excess` (requests above the rate) and the time of the last
//! accepted request. A request computes `excess = max(prev - rate * elapsed + 1, 0)`: above
//! `burst` it is rejected (and not recorded); otherwise it is recorded and, unless `nodelay`,
//! delayed by `excess / rate` seconds. The bucket key is `<owner>:<crc32 of the conf>:<key>`,
//! so an unchanged conf keeps its buckets across snapshots.
//!
//! Not the `governor` crate: its GCRA has integer burst cells and no fractional excess/delay,
//! so it cannot reproduce `excess > burst` and `excess / rate` exactly; APISIX's semantics win.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use serde_json::{Map, Value};

use crate::keyed::{Keyed, SpaceMap};
use crate::limit_count::local::mono_ms;
use crate::limit_count::{resolve_key, KeySpec};
use crate::plugin::{Exit, Flow, Owner, Phases, Plugin, PluginCtx, Step};

pub const NAME: &str = "limit-req";

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
    pub fn new(rate: f64) -> ReqSpace {
        ReqSpace {
            buckets: Keyed::default(),
            rate: rate * 1000.0,
        }
    }

    /// A bucket whose next request would find excess 0 is the same as no bucket.
    fn drained(rate: f64, now_ms: u64) -> impl Fn(&Bucket) -> bool {
        move |b: &Bucket| {
            b.excess + 1000.0 - rate * now_ms.saturating_sub(b.last_ms) as f64 / 1000.0 <= 0.0
        }
    }

    /// `resty.limit.req`'s `incoming(key, true)` at `now_ms`.
    pub fn incoming(
        &self,
        key: crate::limit_count::local::KeyRef<'_>,
        burst: f64,
        now_ms: u64,
    ) -> Decision {
        let rate = self.rate;
        let burst = burst * 1000.0;
        self.buckets
            .update(key, now_ms, Self::drained(rate, now_ms), |prev| {
                let excess = match prev {
                    Some(b) => {
                        let elapsed = now_ms.abs_diff(b.last_ms) as f64;
                        let excess = (b.excess - rate * elapsed / 1000.0 + 1000.0).max(0.0);
                        if excess > burst {
                            return (Some(*b), Decision::Rejected);
                        }
                        excess
                    }
                    None => 0.0,
                };
                let keep = Bucket {
                    excess,
                    last_ms: now_ms,
                };
                (Some(keep), Decision::Accepted(excess / rate))
            })
    }

    /// Whether any bucket still holds excess.
    pub fn live(&self) -> bool {
        self.buckets.sweep(Self::drained(self.rate, mono_ms()))
    }
}

/// Every limit-req space.
pub type ReqSpaces = SpaceMap<ReqSpace>;

/// One compiled limit-req configuration.
pub struct LimitReq {
    space: Arc<ReqSpace>,
    burst: f64,
    key: KeySpec,
    nodelay: bool,
    rejection: Exit,
}

fn field<'a>(c: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    c.get(name)
}

/// The rejection of limit-req and limit-conn: `rejected_code` with `rejected_msg` as
/// `{"error_msg": ...}`, or nginx's page.
pub(crate) fn rejection(c: &Map<String, Value>) -> Result<Exit, String> {
    let code = field(c, "rejected_code")
        .and_then(Value::as_u64)
        .unwrap_or(503);
    let code = StatusCode::from_u16(code as u16).map_err(|_| "invalid rejected_code")?;
    Ok(match field(c, "rejected_msg").and_then(Value::as_str) {
        Some(msg) => Exit::error_msg(code, msg),
        None => Exit::status(code),
    })
}

/// The redis policies are accepted by the schema but not implemented: such a conf fails to
/// compile (the route is quarantined) rather than run unlimited.
pub(crate) fn check_policy(plugin: &str, c: &Map<String, Value>) -> Result<(), String> {
    match field(c, "policy")
        .and_then(Value::as_str)
        .unwrap_or("local")
    {
        "local" => Ok(()),
        other => Err(format!(
            "{plugin} policy \"{other}\" is not supported yet by ferrisix (only \"local\")"
        )),
    }
}

impl LimitReq {
    pub fn compile(
        conf: &Value,
        owner: &Owner,
        runtime: &crate::runtime::Runtime,
    ) -> Result<LimitReq, String> {
        let c = conf.as_object().ok_or("conf is not an object")?;
        check_policy(NAME, c)?;
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
        let prefix = format!(
            "{}:{}",
            owner.key,
            crate::limit_count::conf_version_of(NAME, conf)
        );
        Ok(LimitReq {
            space: runtime.req.get(&prefix, || ReqSpace::new(rate)),
            burst,
            key: KeySpec::new(key_type, key),
            nodelay: field(c, "nodelay").and_then(Value::as_bool) == Some(true),
            rejection: rejection(c)?,
        })
    }
}

impl Plugin for LimitReq {
    fn name(&self) -> &'static str {
        NAME
    }

    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let key = resolve_key(&self.key, ctx);
        match self.space.incoming(key.as_ref(), self.burst, mono_ms()) {
            Decision::Rejected => Step::Done(Flow::Exit(self.rejection.clone())),
            Decision::Accepted(delay) if delay >= 0.001 && !self.nodelay => {
                Step::Wait(Box::pin(async move {
                    tokio::time::sleep(Duration::from_secs_f64(delay)).await;
                    Flow::Continue
                }))
            }
            Decision::Accepted(_) => Step::CONTINUE,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use ferrisix_config::model::ResourceKind;
    use ferrisix_router::VarSource;
    use http::{HeaderMap, Method};
    use serde_json::json;

    use super::*;
    use crate::limit_count::local::KeyRef;

    struct NoVars;
    impl VarSource for NoVars {
        fn var(&self, _: &str) -> Option<Cow<'_, str>> {
            None
        }
    }

    fn compile(conf: Value, owner: &str) -> Result<LimitReq, String> {
        LimitReq::compile(
            &conf,
            &Owner::new(ResourceKind::Routes, owner),
            crate::runtime::runtime(),
        )
    }

    #[test]
    fn leaky_bucket_burst_and_delay() {
        let s = ReqSpace::new(2.0);
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
        let (method, headers) = (Method::GET, HeaderMap::new());
        let lr = compile(
            json!({"rate": 1, "burst": 0, "key": "remote_addr"}),
            "lr-t1",
        )
        .unwrap();
        let run = |lr: &LimitReq| {
            let mut ctx =
                PluginCtx::new(&method, "/", &headers, "10.0.0.1".parse().unwrap(), &NoVars);
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
        let (method, headers) = (Method::GET, HeaderMap::new());
        for (nodelay, owner) in [(false, "lr-t3"), (true, "lr-t4")] {
            let lr = compile(
                json!({"rate": 10, "burst": 5, "key": "remote_addr", "nodelay": nodelay}),
                owner,
            )
            .unwrap();
            let mut ctx =
                PluginCtx::new(&method, "/", &headers, "10.0.0.1".parse().unwrap(), &NoVars);
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

    #[test]
    fn same_conf_keeps_buckets_and_redis_is_quarantined() {
        let conf = json!({"rate": 1, "burst": 0, "key": "remote_addr"});
        let a = compile(conf.clone(), "lr-t5").unwrap();
        let b = compile(
            json!({"rate": 1, "burst": 0, "key": "remote_addr", "rejected_code": 503}),
            "lr-t5",
        )
        .unwrap();
        assert!(Arc::ptr_eq(&a.space, &b.space));
        let c = compile(conf, "lr-t5-other").unwrap();
        assert!(!Arc::ptr_eq(&a.space, &c.space));
        let e = compile(
            json!({"rate": 1, "burst": 0, "key": "remote_addr", "policy": "redis", "redis_host": "127.0.0.1"}),
            "lr-t6",
        )
        .err()
        .unwrap();
        assert!(e.contains("not supported yet"), "{e}");
    }

    #[test]
    fn shared_across_threads() {
        // rate tiny, burst 99: exactly 100 requests get through whatever the interleaving.
        let s = Arc::new(ReqSpace::new(0.000_001));
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
