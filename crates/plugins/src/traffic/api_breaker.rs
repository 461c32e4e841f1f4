//! api-breaker (`apisix/plugins/api-breaker.lua`): counts the upstream statuses of
//! `unhealthy.http_statuses` per `$host` + `$uri` in the log phase and, each time the count
//! reaches a multiple of `unhealthy.failures`, opens the breaker for `2^(count / failures)`
//! seconds (at most `max_breaker_sec`): `access` then answers `break_response_code` (with
//! `break_response_body` and `break_response_headers`) without proxying. `healthy.successes`
//! statuses of `healthy.http_statuses` in a row close it again.
//!
//! The counters are one per gateway, not per route or conf (APISIX's `plugin-api-breaker`
//! shared dict), sharded per key as the limit plugins' ([`Keyed`]), and bounded: past
//! [`MAX_KEYS`] host+uri pairs new pairs are not tracked, as a full shared dict refuses new
//! keys.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use ferrisix_plugin_api::{
    Clock, CompileCtx, Exit, KeyRef, Keyed, LogCtx, LogNeeds, Phases, Plugin, PluginCtx, PluginDef,
    PluginServices, SharedState, Slot, Step, Template, VarNames,
};
use ferrisix_router::VarSource;
use http::{HeaderName, HeaderValue, StatusCode};
use serde_json::{json, Value};

pub const NAME: &str = "api-breaker";

pub static DEF: PluginDef = PluginDef::new(NAME, 1005, schema, compile);

/// The most host+uri pairs tracked at once.
pub const MAX_KEYS: usize = 100_000;

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "break_response_code": {"type": "integer", "minimum": 200, "maximum": 599},
            "break_response_body": {"type": "string"},
            "break_response_headers": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "key": {"type": "string", "minLength": 1},
                        "value": {"type": "string", "minLength": 1}
                    },
                    "required": ["key", "value"]
                }
            },
            "max_breaker_sec": {"type": "integer", "minimum": 3, "default": 300},
            "unhealthy": {
                "type": "object",
                "properties": {
                    "http_statuses": {
                        "type": "array",
                        "minItems": 1,
                        "items": {"type": "integer", "minimum": 500, "maximum": 599},
                        "uniqueItems": true,
                        "default": [500]
                    },
                    "failures": {"type": "integer", "minimum": 1, "default": 3}
                },
                "default": {"http_statuses": [500], "failures": 3}
            },
            "healthy": {
                "type": "object",
                "properties": {
                    "http_statuses": {
                        "type": "array",
                        "minItems": 1,
                        "items": {"type": "integer", "minimum": 200, "maximum": 499},
                        "uniqueItems": true,
                        "default": [200]
                    },
                    "successes": {"type": "integer", "minimum": 1, "default": 3}
                },
                "default": {"http_statuses": [200], "successes": 3}
            }
        },
        "required": ["break_response_code"]
    })
}

/// The three shared-dict keys of one host+uri.
#[derive(Debug, Default)]
struct Counters {
    unhealthy: Option<u64>,
    healthy: Option<u64>,
    /// When the breaker last opened (`ngx.time()` seconds) and when that record expires.
    last_open: Option<(u64, u64)>,
}

/// The gateway's breaker counters by `host + uri`.
#[derive(Debug, Default)]
pub struct Breakers {
    counters: Keyed<Counters>,
    /// How many keys `counters` holds (kept beside it: [`Keyed::len`] visits every shard).
    keys: AtomicUsize,
}

/// The shared dict keeps api-breaker's keys until they are deleted: never idle.
fn never_idle(_: &Counters) -> bool {
    false
}

impl Breakers {
    /// Runs `f` on the counters of `key` under its shard's lock (see [`Keyed::update`]).
    /// The time given to the map is 0, so it never sweeps: nothing here is idle.
    fn update<R>(
        &self,
        key: &str,
        f: impl FnOnce(Option<&mut Counters>) -> (Slot<Counters>, R),
    ) -> R {
        self.counters.update(KeyRef::Text(key), 0, never_idle, |c| {
            let had = c.is_some();
            let (slot, r) = f(c);
            match (&slot, had) {
                (Slot::Insert(_), false) => {
                    self.keys.fetch_add(1, Ordering::Relaxed);
                }
                (Slot::Remove, true) => {
                    self.keys.fetch_sub(1, Ordering::Relaxed);
                }
                _ => {}
            }
            (slot, r)
        })
    }

    fn full(&self) -> bool {
        self.keys.load(Ordering::Relaxed) >= MAX_KEYS
    }
}

impl SharedState for Breakers {
    fn create(_: &PluginServices) -> Self {
        Breakers::default()
    }
}

#[derive(Debug)]
struct ApiBreaker {
    code: StatusCode,
    body: Option<Bytes>,
    headers: Vec<(HeaderName, Template)>,
    max_breaker_sec: u64,
    unhealthy_statuses: Vec<u16>,
    failures: u64,
    healthy_statuses: Vec<u16>,
    successes: u64,
    breakers: Arc<Breakers>,
    clock: Clock,
    log_vars: VarNames,
}

fn statuses(v: Option<&Value>) -> Vec<u16> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_u64().and_then(|s| u16::try_from(s).ok()))
        .collect()
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let code = conf
        .get("break_response_code")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let code = u16::try_from(code)
        .ok()
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or_else(|| format!("invalid break_response_code {code}"))?;
    let mut headers = Vec::new();
    for h in conf
        .get("break_response_headers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(k), Some(v)) = (
            h.get("key").and_then(Value::as_str),
            h.get("value").and_then(Value::as_str),
        ) else {
            continue;
        };
        match HeaderName::from_bytes(k.as_bytes()) {
            Ok(name) => headers.push((name, Template::parse(v))),
            Err(_) => tracing::warn!(header = k, "api-breaker: invalid header name"),
        }
    }
    let num = |p: &str, default: u64| conf.pointer(p).and_then(Value::as_u64).unwrap_or(default);
    Ok(Arc::new(ApiBreaker {
        code,
        body: conf
            .get("break_response_body")
            .and_then(Value::as_str)
            .map(|s| Bytes::from(s.to_owned())),
        headers,
        max_breaker_sec: num("/max_breaker_sec", 300),
        unhealthy_statuses: statuses(conf.pointer("/unhealthy/http_statuses")),
        failures: num("/unhealthy/failures", 3).max(1),
        healthy_statuses: statuses(conf.pointer("/healthy/http_statuses")),
        successes: num("/healthy/successes", 3).max(1),
        breakers: cx.services.shared::<Breakers>(),
        clock: cx.services.clock().clone(),
        log_vars: vec!["host".into(), "uri".into(), "upstream_status".into()].into(),
    }))
}

/// The breaker key the access phase used, for the log phase to count under.
struct BreakerKey(String);

fn key(host: Option<&str>, uri: &str) -> String {
    let host = host.unwrap_or("");
    let mut k = String::with_capacity(host.len() + uri.len());
    k.push_str(host);
    k.push_str(uri);
    k
}

impl ApiBreaker {
    fn now(&self) -> u64 {
        self.clock.epoch_ms() / 1000
    }

    /// Whether the breaker of `key` is open now.
    fn open(&self, key: &str) -> bool {
        let now = self.now();
        let read = self.breakers.update(key, |c| {
            let read = c.and_then(|c| c.unhealthy.zip(c.last_open));
            (Slot::Keep, read)
        });
        let Some((count, (last, expires))) = read else {
            return false;
        };
        if expires < now {
            return false;
        }
        let failure_times = (count / self.failures).max(1);
        let breaker_time = 2u64
            .checked_pow(u32::try_from(failure_times).unwrap_or(u32::MAX))
            .unwrap_or(u64::MAX)
            .min(self.max_breaker_sec);
        last.saturating_add(breaker_time) >= now
    }

    fn record(&self, key: &str, status: u16) {
        let now = self.now();
        if self.unhealthy_statuses.contains(&status) {
            let full = self.breakers.full();
            self.breakers.update(key, |c| {
                let unhealthy = |c: &mut Counters| {
                    let count = c.unhealthy.unwrap_or(0) + 1;
                    c.unhealthy = Some(count);
                    c.healthy = None;
                    if count % self.failures == 0 {
                        c.last_open = Some((now, now + self.max_breaker_sec));
                    }
                };
                match c {
                    Some(c) => unhealthy(c),
                    None if full => return (Slot::Keep, ()),
                    None => {
                        let mut c = Counters::default();
                        unhealthy(&mut c);
                        return (Slot::Insert(c), ());
                    }
                }
                (Slot::Keep, ())
            });
            return;
        }
        if !self.healthy_statuses.contains(&status) {
            return;
        }
        self.breakers.update(key, |c| {
            let Some(c) = c else {
                return (Slot::Keep, ());
            };
            if c.unhealthy.is_none() {
                return (Slot::Keep, ());
            }
            let healthy = c.healthy.unwrap_or(0) + 1;
            c.healthy = Some(healthy);
            if healthy >= self.successes {
                return (Slot::Remove, ());
            }
            (Slot::Keep, ())
        });
    }
}

impl Plugin for ApiBreaker {
    fn phases(&self) -> Phases {
        Phases::ACCESS | Phases::LOG
    }

    fn log_needs(&self) -> LogNeeds {
        LogNeeds {
            vars: Some(self.log_vars.clone()),
            ..LogNeeds::default()
        }
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        // APISIX keys by `ctx.var.uri`, which its variable cache holds from routing: the
        // client's normalised path, even after proxy-rewrite's `ngx.req.set_uri`.
        let k = key(ctx.host(), ctx.head().path);
        let open = self.open(&k);
        ctx.insert(BreakerKey(k));
        if !open {
            return Step::CONTINUE;
        }
        let Some(body) = &self.body else {
            return Step::exit(Exit::status(self.code));
        };
        let mut exit = Exit::body(self.code, body.clone());
        for (name, value) in &self.headers {
            if let Ok(v) = HeaderValue::from_str(&value.resolve(&*ctx).text) {
                exit.headers.push((name.clone(), v));
            }
        }
        Step::exit(exit)
    }

    fn log(&self, ctx: &LogCtx) {
        // `core.response.get_upstream_status`: the last try's status.
        let Some(status) = ctx.vars.get("upstream_status").and_then(|s| {
            let tail = &s[s.len().saturating_sub(3)..];
            tail.trim().parse::<u16>().ok()
        }) else {
            return;
        };
        match ctx.value::<BreakerKey>() {
            Some(BreakerKey(k)) => self.record(k, status),
            None => self.record(
                &key(ctx.vars.get("host"), &ctx.var("uri").unwrap_or_default()),
                status,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::{Flow, LogVars};

    use super::*;
    use crate::testing::Compiler;

    struct Vars(&'static [(&'static str, &'static str)]);

    impl VarSource for Vars {
        fn var(&self, name: &str) -> Option<std::borrow::Cow<'_, str>> {
            self.0
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| std::borrow::Cow::Borrowed(*v))
        }
    }

    fn answer(p: &dyn Plugin, status: &'static str) -> Option<Exit> {
        let mut req = TestRequest::get("/s").header("host", "a.test");
        req.host = Some("a.test".into());
        let flow = match p.access(&mut req.ctx()) {
            Step::Done(f) => f,
            Step::Wait(_) => unreachable!(),
        };
        if let Flow::Exit(e) = flow {
            return Some(e);
        }
        let vars = [
            ("host", "a.test"),
            ("uri", "/s"),
            ("upstream_status", status),
        ];
        let vars: &'static [_] = Box::leak(Box::new(vars));
        let log = LogCtx {
            vars: LogVars::capture(p.log_needs().vars.unwrap(), &Vars(vars)),
            ..Default::default()
        };
        p.log(&log);
        None
    }

    #[test]
    fn breaks_at_multiples_of_failures_for_growing_times() {
        let services = Arc::new(PluginServices::new(
            Default::default(),
            Default::default(),
            Clock::manual(1_000_000),
        ));
        let c = Compiler::with(services.clone());
        let conf = json!({"break_response_code": 502, "break_response_body": "open",
            "break_response_headers": [{"key": "X-Host", "value": "$host"}],
            "max_breaker_sec": 3, "unhealthy": {"failures": 2, "http_statuses": [500, 503]}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "ab", None)).unwrap();
        assert!(answer(&*p, "500").is_none());
        assert!(
            answer(&*p, "200").is_none(),
            "healthy only counts once unhealthy"
        );
        assert!(answer(&*p, "502, 503").is_none());
        let e = answer(&*p, "500").expect("open after 2 failures");
        assert_eq!(
            (e.status.as_u16(), e.body.unwrap()),
            (502, Bytes::from("open"))
        );
        assert_eq!(e.headers[0].1, "a.test");
        // 2^1 = 2 s, then it lets requests through.
        services.clock().advance(3_000);
        assert!(answer(&*p, "500").is_none());
        assert!(answer(&*p, "500").is_none());
        // Count 4: 2^2 = 4 s, capped at 3.
        assert!(answer(&*p, "200").is_some());
        services.clock().advance(3_000);
        assert!(answer(&*p, "200").is_some());
        services.clock().advance(1_000);
        // Three successes close it for good.
        for _ in 0..3 {
            assert!(answer(&*p, "200").is_none());
        }
        let breakers = services.shared::<Breakers>();
        assert!(breakers.counters.is_empty());
        assert_eq!(breakers.keys.load(Ordering::Relaxed), 0);
        // Statuses in neither list change nothing.
        assert!(answer(&*p, "504").is_none());
        assert!(breakers.counters.is_empty());
    }

    #[test]
    fn past_max_keys_new_pairs_are_not_tracked() {
        let services = Arc::new(PluginServices::new(
            Default::default(),
            Default::default(),
            Clock::manual(1_000_000),
        ));
        let breakers = services.shared::<Breakers>();
        for i in 0..MAX_KEYS {
            let key = format!("h/{i}");
            breakers.update(&key, |_| (Slot::Insert(Counters::default()), ()));
        }
        assert_eq!(breakers.keys.load(Ordering::Relaxed), MAX_KEYS);
        let c = Compiler::with(services.clone());
        let conf = json!({"break_response_code": 502, "unhealthy": {"failures": 1}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "ab-full", None)).unwrap();
        // One failure would open it; the dict is full, so a.test/s is not counted.
        assert!(answer(&*p, "500").is_none());
        assert!(answer(&*p, "500").is_none());
        assert_eq!(breakers.keys.load(Ordering::Relaxed), MAX_KEYS);
        // A tracked pair still counts, and its removal frees room for the new one.
        breakers.update("h/0", |_| (Slot::Remove, ()));
        assert!(answer(&*p, "500").is_none());
        assert!(answer(&*p, "500").is_some(), "tracked now: open");
        assert_eq!(breakers.keys.load(Ordering::Relaxed), MAX_KEYS);
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        assert_eq!(
            r.check(NAME, &json!({"break_response_code": 199})),
            Err("failed to check the configuration of plugin api-breaker err: property \"break_response_code\" validation failed: expected 199 to be at least 200".into())
        );
        assert_eq!(
            r.check(NAME, &json!({"unhealthy": {"failures": 2}})),
            Err("failed to check the configuration of plugin api-breaker err: property \"break_response_code\" is required".into())
        );
        assert_eq!(r.get(NAME).unwrap().priority, 1005);
    }
}
