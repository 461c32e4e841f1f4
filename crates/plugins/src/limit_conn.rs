//! limit-conn: APISIX's `limit-conn` plugin (`apisix/plugins/limit-conn/init.lua` over
//! lua-resty-limit-traffic's `resty.limit.conn`), kept in the process (`local`).
//!
//! On access the key's in-flight count goes up by one; above `conn + burst` the request is
//! rejected (and the count goes back down); above `conn` it is delayed by
//! `unit_delay * floor((count - 1) / conn)` seconds, `unit_delay` starting at
//! `default_conn_delay`. APISIX decrements in the log phase; here the increment is owned by a
//! [`ConnGuard`] put in the request's [`crate::plugin::RequestGuards`], which the proxy drops
//! right after the log phase (when the response body is dropped: completed or the client went
//! away) or with the request if it is abandoned earlier, so the decrement happens exactly
//! once. Unless `only_use_default_delay`, leaving also averages the request's latency into
//! `unit_delay` (`leaving(key, latency)`), as APISIX does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::keyed::{Keyed, OwnedKey, SpaceMap};
use crate::limit_count::local::{mono_ms, KeyRef};
use crate::limit_count::{resolve_key, KeySpec};
use crate::limit_req::{check_policy, rejection};
use crate::plugin::{Exit, Flow, Owner, Phases, Plugin, PluginCtx, Step};

pub const NAME: &str = "limit-conn";

/// The in-flight counts of one configuration, and its current unit delay.
pub struct ConnSpace {
    counts: Keyed<u64>,
    /// Seconds, as `f64` bits (lua-resty-limit-traffic's `self.unit_delay`).
    unit_delay: AtomicU64,
}

impl std::fmt::Debug for ConnSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnSpace")
    }
}

impl ConnSpace {
    pub fn new(default_delay: f64) -> ConnSpace {
        ConnSpace {
            counts: Keyed::default(),
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
            mono_ms(),
            |_| false,
            |prev| {
                let prev = prev.copied().unwrap_or(0);
                let conn = prev + 1;
                if conn > max {
                    (Some(prev).filter(|n| *n > 0), None)
                } else {
                    (Some(conn), Some(conn))
                }
            },
        )
    }

    /// `leaving(key)`: one request of `key` is over.
    pub fn leaving(&self, key: KeyRef<'_>) {
        self.counts.update(
            key,
            mono_ms(),
            |_| false,
            |prev| {
                let n = prev.copied().unwrap_or(0).saturating_sub(1);
                ((n > 0).then_some(n), ())
            },
        );
    }

    /// The in-flight count of `key`.
    pub fn count(&self, key: KeyRef<'_>) -> u64 {
        self.counts
            .update(
                key,
                mono_ms(),
                |_| false,
                |prev| (prev.copied(), prev.copied()),
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

/// Every limit-conn space.
pub type ConnSpaces = SpaceMap<ConnSpace>;

/// One request counted in flight; dropping it is APISIX's `decrease` (log phase).
pub struct ConnGuard {
    space: Arc<ConnSpace>,
    key: OwnedKey,
    start: Instant,
    /// The delay this request was given, subtracted from its latency.
    delay: f64,
    adapt: bool,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.space.leaving(self.key.as_ref());
        if self.adapt {
            // APISIX uses `$upstream_response_time` for proxied requests and
            // `$request_time - delay` otherwise; the guard knows the latter.
            let latency = (self.start.elapsed().as_secs_f64() - self.delay).max(0.0);
            self.space.adapt(latency);
        }
    }
}

/// One compiled limit-conn configuration.
pub struct LimitConn {
    space: Arc<ConnSpace>,
    conn: u64,
    burst: u64,
    key: KeySpec,
    only_default_delay: bool,
    rejection: Exit,
}

impl LimitConn {
    pub fn compile(
        conf: &Value,
        owner: &Owner,
        runtime: &crate::runtime::Runtime,
    ) -> Result<LimitConn, String> {
        let c = conf.as_object().ok_or("conf is not an object")?;
        check_policy(NAME, c)?;
        let conn = c
            .get("conn")
            .and_then(Value::as_u64)
            .filter(|n| *n > 0)
            .ok_or("conn must be an integer greater than 0")?;
        let burst = c
            .get("burst")
            .and_then(Value::as_u64)
            .ok_or("burst must be an integer not less than 0")?;
        let default_delay = c
            .get("default_conn_delay")
            .and_then(Value::as_f64)
            .filter(|d| *d > 0.0)
            .ok_or("default_conn_delay must be a number greater than 0")?;
        let key = c
            .get("key")
            .and_then(Value::as_str)
            .ok_or("key is missing")?;
        let key_type = c.get("key_type").and_then(Value::as_str).unwrap_or("var");
        let prefix = format!(
            "{}:{}",
            owner.key,
            crate::limit_count::conf_version_of(NAME, conf)
        );
        Ok(LimitConn {
            space: runtime.conn.get(&prefix, || ConnSpace::new(default_delay)),
            conn,
            burst,
            key: KeySpec::new(key_type, key),
            only_default_delay: c.get("only_use_default_delay").and_then(Value::as_bool)
                == Some(true),
            rejection: rejection(c)?,
        })
    }

    pub fn space(&self) -> &Arc<ConnSpace> {
        &self.space
    }
}

impl Plugin for LimitConn {
    fn name(&self) -> &'static str {
        NAME
    }

    /// `log` is the guard's drop (see the module docs), so only `access` is run by chains.
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let key = OwnedKey::from_ref(resolve_key(&self.key, ctx).as_ref());
        let Some(count) = self
            .space
            .incoming(key.as_ref(), self.conn.saturating_add(self.burst))
        else {
            return Step::Done(Flow::Exit(self.rejection.clone()));
        };
        let delay = if count > self.conn {
            self.space.unit_delay() * ((count - 1) / self.conn) as f64
        } else {
            0.0
        };
        ctx.guards.push(Box::new(ConnGuard {
            space: self.space.clone(),
            key,
            start: Instant::now(),
            delay,
            adapt: !self.only_default_delay,
        }));
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
    use std::borrow::Cow;

    use ferrisix_config::model::ResourceKind;
    use ferrisix_router::VarSource;
    use http::{HeaderMap, Method, StatusCode};
    use serde_json::json;

    use super::*;
    use crate::plugin::RequestGuards;

    struct NoVars;
    impl VarSource for NoVars {
        fn var(&self, _: &str) -> Option<Cow<'_, str>> {
            None
        }
    }

    fn compile(conf: Value, owner: &str) -> LimitConn {
        LimitConn::compile(
            &conf,
            &Owner::new(ResourceKind::Routes, owner),
            crate::runtime::runtime(),
        )
        .unwrap()
    }

    /// Runs access for client `ip`; answers the flow (delays are not awaited) and the guards.
    fn run(lc: &LimitConn, ip: &str) -> (Flow, bool, RequestGuards) {
        let (method, headers) = (Method::GET, HeaderMap::new());
        let mut ctx = PluginCtx::new(&method, "/", &headers, ip.parse().unwrap(), &NoVars);
        let (flow, delayed) = match lc.access(&mut ctx) {
            Step::Done(f) => (f, false),
            Step::Wait(_) => (Flow::Continue, true),
        };
        (flow, delayed, std::mem::take(&mut ctx.guards))
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
        let s = ConnSpace::new(0.5);
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
        let s = Arc::new(ConnSpace::new(0.1));
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
            let (method, headers) = (Method::GET, HeaderMap::new());
            let mut ctx =
                PluginCtx::new(&method, "/", &headers, "10.0.0.9".parse().unwrap(), &NoVars);
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
}
