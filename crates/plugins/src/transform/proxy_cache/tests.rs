use std::sync::Arc;

use bytes::Bytes;
use ferrisix_config::settings::PluginAttr;
use ferrisix_plugin_api::testing::TestRequest;
use ferrisix_plugin_api::{
    BodyEdits, Clock, Consumer, Executor, Exit, Flow, Plugin, PluginServices, ResponseHead, Step,
};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use serde_json::{json, Value};

use super::{DEF, NAME};
use crate::testing::Compiler;

/// A gateway with a disk zone in a temporary directory, a memory zone, and a manual clock.
struct Gw {
    compiler: Compiler,
    clock: Clock,
    _dir: tempfile::TempDir,
}

fn gateway(memory_size: u64) -> Gw {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual(1_700_000_000_000);
    let mut zones = super::test_zones(dir.path());
    zones.zones[1].memory_size = memory_size;
    let services = PluginServices::new(PluginAttr::default(), Executor::current(), clock.clone())
        .with_proxy_cache(Some(zones));
    Gw {
        compiler: Compiler::with(Arc::new(services)),
        clock,
        _dir: dir,
    }
}

impl Gw {
    fn plugin(&self, conf: Value) -> Arc<dyn Plugin> {
        (DEF.compile)(&self.compiler.cx(NAME, &conf, "pc", None)).unwrap()
    }
}

/// What the client got, and whether (and how) the upstream was asked.
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Bytes,
    upstream_method: Option<Method>,
}

impl Answer {
    fn cache_status(&self) -> &str {
        self.headers
            .get("apisix-cache-status")
            .map_or("", |v| v.to_str().unwrap())
    }
}

/// Runs the plugin's phases on `req` as the proxy does; the upstream answers `upstream`.
fn run(
    p: &dyn Plugin,
    mut req: TestRequest,
    upstream: (u16, &[(&'static str, &'static str)], &str),
) -> Answer {
    let exit = {
        let mut ctx = req.ctx();
        let exit = match p.access(&mut ctx) {
            Step::Done(Flow::Exit(e)) => Some(e),
            Step::Done(Flow::Continue) => None,
            Step::Wait(_) => panic!("no other request fetches this key"),
        };
        exit
    };
    finish(p, req, exit, upstream)
}

/// The rest of a request after its access phase: the exit, or the upstream's answer.
fn finish(
    p: &dyn Plugin,
    mut req: TestRequest,
    exit: Option<Exit>,
    upstream: (u16, &[(&'static str, &'static str)], &str),
) -> Answer {
    let (mut status, mut headers, body, proxied, upstream_method) = match exit {
        Some(e) => {
            let mut h = HeaderMap::new();
            for (n, v) in e.headers {
                h.insert(n, v);
            }
            (e.status, h, e.body.unwrap_or_default(), false, None)
        }
        None => {
            let mut h = HeaderMap::new();
            for (n, v) in upstream.1 {
                h.append(*n, HeaderValue::from_static(v));
            }
            let method = req
                .state
                .upstream_edits()
                .method
                .clone()
                .unwrap_or(req.method.clone());
            (
                StatusCode::from_u16(upstream.0).unwrap(),
                h,
                Bytes::from(upstream.2.to_owned()),
                true,
                Some(method),
            )
        }
    };
    req.state.take_response_headers().apply(&mut headers);
    let mut edits = BodyEdits::default();
    {
        let mut head = ResponseHead::new(&mut status, &mut headers, proxied, &mut edits);
        p.header_filter(&mut req.ctx(), &mut head);
    }
    let mut filters = edits.filters;
    let body = edits.replacement.unwrap_or(body);
    // In two chunks, as a body streams.
    let half = body.len() / 2;
    let mut out = filters.run(body.slice(..half), false).data.to_vec();
    out.extend_from_slice(&filters.run(body.slice(half..), true).data);
    Answer {
        status: status.as_u16(),
        headers,
        body: Bytes::from(out),
        upstream_method,
    }
}

fn get(path: &str) -> TestRequest {
    let mut r = TestRequest::get(path);
    r.host = Some("c.test".into());
    r.header("host", "c.test")
}

fn req(method: &str, path: &str) -> TestRequest {
    let mut r = TestRequest::new(Method::from_bytes(method.as_bytes()).unwrap(), path);
    r.host = Some("c.test".into());
    r.header("host", "c.test")
}

const OK: (u16, &[(&str, &str)], &str) = (200, &[("content-type", "text/plain")], "one");

fn ok(body: &'static str) -> (u16, &'static [(&'static str, &'static str)], &'static str) {
    (200, &[("content-type", "text/plain")], body)
}

fn memory(extra: Value) -> Value {
    let mut conf = json!({"cache_strategy": "memory", "cache_zone": "memory_cache",
        "cache_key": ["$host", "$uri"]});
    for (k, v) in extra.as_object().unwrap() {
        conf[k] = v.clone();
    }
    conf
}

#[test]
fn memory_miss_hit_age_and_purge() {
    let gw = gateway(1 << 20);
    let p = gw.plugin(memory(json!({})));
    let a = run(&*p, get("/a?n=1"), ok("first"));
    assert_eq!(
        (a.status, a.cache_status(), &a.body[..]),
        (200, "MISS", &b"first"[..])
    );
    gw.clock.advance(2_500);
    let a = run(&*p, get("/a?n=2"), ok("second"));
    assert_eq!((a.cache_status(), &a.body[..]), ("HIT", &b"first"[..]));
    assert_eq!(a.upstream_method, None, "served without the upstream");
    assert_eq!(a.headers["age"], "2");
    assert_eq!(a.headers["content-type"], "text/plain");
    assert_eq!(run(&*p, req("PURGE", "/a"), OK).status, 200);
    assert_eq!(run(&*p, req("PURGE", "/a"), OK).status, 404);
    assert_eq!(run(&*p, get("/a"), ok("third")).cache_status(), "MISS");
}

#[test]
fn memory_ttl_expires_and_is_stored_again() {
    let gw = gateway(1 << 20);
    let p = gw.plugin(memory(json!({"cache_ttl": 1})));
    run(&*p, get("/t"), ok("one"));
    gw.clock.advance(1_500);
    let a = run(&*p, get("/t"), ok("two"));
    assert_eq!((a.cache_status(), &a.body[..]), ("EXPIRED", &b"two"[..]));
    let a = run(&*p, get("/t"), ok("three"));
    assert_eq!((a.cache_status(), &a.body[..]), ("HIT", &b"two"[..]));
}

#[test]
fn memory_bypass_no_cache_methods_and_statuses() {
    let gw = gateway(1 << 20);
    let p = gw.plugin(memory(json!({"cache_bypass": ["$arg_bypass"],
        "no_cache": ["$arg_no_cache"], "cache_method": ["GET"], "cache_http_status": [200]})));
    assert_eq!(run(&*p, get("/b?no_cache=1"), OK).cache_status(), "MISS");
    assert_eq!(run(&*p, get("/b?bypass=1"), OK).cache_status(), "BYPASS");
    assert_eq!(run(&*p, get("/b?bypass=0"), OK).cache_status(), "MISS");
    let a = run(&*p, get("/b?bypass=1"), ok("bypassed"));
    assert_eq!(
        (a.cache_status(), &a.body[..]),
        ("BYPASS", &b"bypassed"[..])
    );
    assert_eq!(run(&*p, get("/b"), ok("x")).cache_status(), "HIT");
    // HEAD and POST are outside cache_method: MISS, never stored.
    let a = run(&*p, req("HEAD", "/h"), OK);
    assert_eq!(
        (a.cache_status(), a.upstream_method.clone()),
        ("MISS", Some(Method::HEAD))
    );
    assert_eq!(run(&*p, req("HEAD", "/h"), OK).cache_status(), "MISS");
    // A status outside cache_http_status is not stored.
    assert_eq!(
        run(&*p, get("/404"), (404, &[], "no")).cache_status(),
        "MISS"
    );
    assert_eq!(
        run(&*p, get("/404"), (404, &[], "no")).cache_status(),
        "MISS"
    );
    assert_eq!(run(&*p, req("PURGE", "/404"), OK).status, 404);
}

#[test]
fn memory_cache_control_directives() {
    let gw = gateway(1 << 20);
    let p = gw.plugin(memory(json!({"cache_control": true})));
    let cc = |path: &str, v: &str| get(path).header("cache-control", v);
    assert_eq!(run(&*p, cc("/c", "no-cache"), OK).cache_status(), "BYPASS");
    assert_eq!(run(&*p, cc("/c", "no-store"), OK).cache_status(), "BYPASS");
    assert_eq!(run(&*p, cc("/c", "only-if-cached"), OK).status, 504);
    // Without max-age from the upstream, nothing is stored.
    assert_eq!(run(&*p, get("/c"), OK).cache_status(), "MISS");
    assert_eq!(run(&*p, get("/c"), OK).cache_status(), "MISS");
    let fresh: (u16, &[(&str, &str)], &str) = (200, &[("cache-control", "max-age=60")], "m");
    run(&*p, get("/c"), fresh);
    assert_eq!(run(&*p, get("/c"), OK).cache_status(), "HIT");
    gw.clock.advance(10_000);
    assert_eq!(
        run(&*p, cc("/c", "max-age=5"), fresh).cache_status(),
        "STALE"
    );
    // The STALE fetch was stored again: fresh for the client now.
    assert_eq!(run(&*p, cc("/c", "max-age=5"), OK).cache_status(), "HIT");
    assert_eq!(
        run(&*p, cc("/c", "min-fresh=70"), OK).cache_status(),
        "STALE"
    );
    // The upstream's no-store is honoured even without cache_control.
    let p = gw.plugin(memory(json!({})));
    let private: (u16, &[(&str, &str)], &str) = (200, &[("cache-control", "private")], "p");
    run(&*p, get("/p"), private);
    assert_eq!(run(&*p, get("/p"), OK).cache_status(), "MISS");
}

#[test]
fn memory_hides_cache_headers_and_refuses_set_cookie() {
    let gw = gateway(1 << 20);
    let p = gw.plugin(memory(json!({"hide_cache_headers": true})));
    let up: (u16, &[(&str, &str)], &str) = (
        200,
        &[
            ("cache-control", "public, max-age=60"),
            ("expires", "Thu, 01 Jan 2099 00:00:00 GMT"),
            ("x-a", "1"),
        ],
        "h",
    );
    let a = run(&*p, get("/h"), up);
    assert!(a.headers.get("cache-control").is_none() && a.headers.get("expires").is_none());
    let a = run(&*p, get("/h"), OK);
    assert_eq!(a.cache_status(), "HIT");
    assert!(a.headers.get("cache-control").is_none());
    assert_eq!(a.headers["x-a"], "1");
    let cookie: (u16, &[(&str, &str)], &str) = (200, &[("set-cookie", "s=1")], "c");
    run(&*p, get("/cookie"), cookie);
    assert_eq!(run(&*p, get("/cookie"), OK).cache_status(), "MISS");
    let p = gw.plugin(memory(json!({"cache_set_cookie": true})));
    run(&*p, get("/cookie2"), cookie);
    assert_eq!(run(&*p, get("/cookie2"), OK).headers["set-cookie"], "s=1");
}

#[test]
fn memory_body_limits_and_zone_size() {
    let gw = gateway(1 << 20);
    let p = gw.plugin(memory(json!({"max_resp_body_size": 5})));
    run(&*p, get("/big"), ok("123456"));
    assert_eq!(run(&*p, get("/big"), OK).cache_status(), "MISS");
    run(&*p, get("/small"), ok("1234"));
    assert_eq!(run(&*p, get("/small"), OK).cache_status(), "HIT");
    // An answer larger than the zone is not stored, and the request is still answered.
    let gw = gateway(1000);
    let p = gw.plugin(memory(json!({})));
    let big = "x".repeat(2000);
    let big: &'static str = Box::leak(big.into_boxed_str());
    assert_eq!(run(&*p, get("/z"), ok(big)).body.len(), 2000);
    assert_eq!(run(&*p, get("/z"), OK).cache_status(), "MISS");
}

#[test]
fn consumers_get_their_own_entries() {
    let gw = gateway(1 << 20);
    let as_user = |name: &str| {
        let mut r = get("/me");
        r.ctx().attach_consumer(Arc::new(Consumer {
            username: name.into(),
            ..Default::default()
        }));
        r
    };
    let p = gw.plugin(memory(json!({})));
    run(&*p, as_user("jack"), ok("jack's"));
    let a = run(&*p, as_user("rose"), ok("rose's"));
    assert_eq!((a.cache_status(), &a.body[..]), ("MISS", &b"rose's"[..]));
    assert_eq!(&run(&*p, as_user("jack"), OK).body[..], b"jack's");
    // Turned off, or a key naming the consumer already: one shared entry per key.
    let p = gw.plugin(memory(
        json!({"consumer_isolation": false, "cache_key": ["$uri", "-x"]}),
    ));
    run(&*p, as_user("jack"), ok("shared"));
    assert_eq!(&run(&*p, as_user("rose"), OK).body[..], b"shared");
}

fn disk(extra: Value) -> Value {
    let mut conf = json!({"cache_key": ["$host", "$uri"]});
    for (k, v) in extra.as_object().unwrap() {
        conf[k] = v.clone();
    }
    conf
}

#[test]
fn disk_miss_hit_bypass_and_purge() {
    let gw = gateway(1 << 20);
    let p = gw.plugin(disk(
        json!({"cache_bypass": ["$arg_bypass"], "cache_method": ["GET"],
        "cache_http_status": [200]}),
    ));
    assert_eq!(run(&*p, req("PURGE", "/d"), OK).status, 404);
    assert_eq!(run(&*p, get("/d?n=1"), ok("first")).cache_status(), "MISS");
    let a = run(&*p, get("/d?n=2"), ok("second"));
    assert_eq!(
        (a.cache_status(), &a.body[..], a.upstream_method.clone()),
        ("HIT", &b"first"[..], None)
    );
    assert!(a.headers.get("age").is_none());
    // HEAD outside cache_method: BYPASS, asked as GET (nginx's proxy_cache_convert_head).
    let a = run(&*p, req("HEAD", "/d"), OK);
    assert_eq!(
        (a.cache_status(), a.upstream_method.clone()),
        ("BYPASS", Some(Method::GET))
    );
    assert_eq!(&run(&*p, get("/d"), OK).body[..], b"first");
    // A bypassed request's answer replaces the stored one.
    assert_eq!(
        run(&*p, get("/d?bypass=1"), ok("new")).cache_status(),
        "BYPASS"
    );
    assert_eq!(&run(&*p, get("/d"), OK).body[..], b"new");
    // Methods nginx never caches have no status.
    assert_eq!(run(&*p, req("PUT", "/d"), OK).cache_status(), "");
    assert_eq!(run(&*p, req("PURGE", "/d"), OK).status, 200);
    assert_eq!(run(&*p, req("PURGE", "/d"), OK).status, 404);
    assert_eq!(run(&*p, get("/d"), OK).cache_status(), "MISS");
}

#[test]
fn disk_times_follow_the_answer_then_the_zone() {
    let gw = gateway(1 << 20);
    let p = gw.plugin(disk(json!({"no_cache": ["$arg_nc"]})));
    run(&*p, get("/z"), OK);
    gw.clock.advance(9_000);
    assert_eq!(run(&*p, get("/z"), OK).cache_status(), "HIT");
    gw.clock.advance(1_000);
    assert_eq!(run(&*p, get("/z"), ok("again")).cache_status(), "EXPIRED");
    assert_eq!(&run(&*p, get("/z"), OK).body[..], b"again");
    let long: (u16, &[(&str, &str)], &str) = (200, &[("cache-control", "max-age=100")], "l");
    run(&*p, get("/long"), long);
    gw.clock.advance(50_000);
    assert_eq!(run(&*p, get("/long"), OK).cache_status(), "HIT");
    let never: (u16, &[(&str, &str)], &str) = (200, &[("cache-control", "no-store")], "n");
    run(&*p, get("/never"), never);
    assert_eq!(run(&*p, get("/never"), OK).cache_status(), "MISS");
    run(&*p, get("/nc?nc=1"), OK);
    assert_eq!(run(&*p, get("/nc"), OK).cache_status(), "MISS");
    // hide_cache_headers hides them on every answer, the stored ones too.
    let p = gw.plugin(disk(json!({"hide_cache_headers": true})));
    let a = run(&*p, get("/long"), OK);
    assert_eq!(a.cache_status(), "HIT");
    assert!(a.headers.get("cache-control").is_none());
    assert!(run(&*p, get("/fresh"), long)
        .headers
        .get("cache-control")
        .is_none());
}

#[test]
fn zones_are_checked_as_apisix_does() {
    let gw = gateway(1 << 20);
    let r = &gw.compiler.registry;
    use ferrisix_config::validate::PluginCheck;
    let err = |conf: Value| r.check(NAME, &conf).unwrap_err();
    let prefix = "failed to check the configuration of plugin proxy-cache err: ";
    assert_eq!(
        err(json!({"cache_strategy": "network"})),
        format!("{prefix}property \"cache_strategy\" validation failed: matches none of the enum values")
    );
    assert_eq!(
        err(json!({"cache_strategy": "memory", "cache_zone": "nope"})),
        format!("{prefix}cache_zone nope not found")
    );
    assert_eq!(
        err(json!({"cache_strategy": "memory"})),
        format!("{prefix}invalid or empty cache_zone for cache_strategy: memory")
    );
    assert_eq!(
        err(json!({"cache_zone": "memory_cache"})),
        format!("{prefix}invalid or empty cache_zone for cache_strategy: disk")
    );
    assert_eq!(
        err(json!({"cache_key": ["$host", "$request_method"]})),
        format!("{prefix}cache_key variable $request_method unsupported")
    );
    assert!(r.check(NAME, &json!({"cache_key": ["$"]})).is_err());
    assert!(r.check(NAME, &json!({})).is_ok());
    assert!(r
        .check(
            NAME,
            &json!({"cache_strategy": "memory", "cache_zone": "memory_cache"})
        )
        .is_ok());
}

#[tokio::test]
async fn concurrent_misses_make_one_fetch() {
    let gw = gateway(1 << 20);
    for conf in [memory(json!({})), disk(json!({}))] {
        let p = gw.plugin(conf);
        let mut first = get("/l");
        {
            let mut ctx = first.ctx();
            assert!(matches!(p.access(&mut ctx), Step::Done(Flow::Continue)));
        }
        let mut second = get("/l");
        let mut ctx = second.ctx();
        let Step::Wait(waiting) = p.access(&mut ctx) else {
            panic!("the second miss waits for the first's fetch")
        };
        assert_eq!(&finish(&*p, first, None, ok("once")).body[..], b"once");
        let Flow::Exit(e) = waiting.await else {
            panic!("served what the first fetched")
        };
        assert_eq!(e.body.as_deref(), Some(&b"once"[..]));
        assert!(e
            .headers
            .iter()
            .any(|(n, v)| n == "apisix-cache-status" && v == "HIT"));
        assert_eq!(run(&*p, req("PURGE", "/l"), OK).status, 200);
    }
}

fn with(r: TestRequest, name: &'static str, value: &'static str) -> TestRequest {
    r.header(name, value)
}

const VARY_LANG: &[(&str, &str)] = &[("content-type", "text/plain"), ("vary", "X-Lang")];

/// Both strategies keep one answer per variant of the request headers `Vary` names.
#[test]
fn answers_with_vary_are_kept_per_variant() {
    let gw = gateway(1 << 20);
    for conf in [memory(json!({})), disk(json!({}))] {
        let p = gw.plugin(conf.clone());
        let a = || with(get("/v"), "x-lang", "a");
        let b = || with(get("/v"), "x-lang", "b");
        assert_eq!(
            run(&*p, a(), (200, VARY_LANG, "for a")).cache_status(),
            "MISS"
        );
        let r = run(&*p, a(), (200, VARY_LANG, "wrong"));
        assert_eq!(
            (r.cache_status(), &r.body[..]),
            ("HIT", &b"for a"[..]),
            "{conf}"
        );
        assert_eq!(r.headers["vary"], "X-Lang");
        assert_eq!(
            run(&*p, b(), (200, VARY_LANG, "for b")).cache_status(),
            "MISS",
            "{conf}"
        );
        let r = run(&*p, b(), (200, VARY_LANG, "wrong"));
        assert_eq!(
            (r.cache_status(), &r.body[..]),
            ("HIT", &b"for b"[..]),
            "{conf}"
        );
        let r = run(&*p, a(), (200, VARY_LANG, "wrong"));
        assert_eq!(
            (r.cache_status(), &r.body[..]),
            ("HIT", &b"for a"[..]),
            "{conf}"
        );
        // A request without the header is a variant of its own.
        assert_eq!(
            run(&*p, get("/v"), (200, VARY_LANG, "none")).cache_status(),
            "MISS"
        );
        assert_eq!(&run(&*p, get("/v"), OK).body[..], b"none", "{conf}");
        assert_eq!(run(&*p, req("PURGE", "/v"), OK).status, 200, "{conf}");
        // `Vary: *` is never stored.
        let star: (u16, &[(&str, &str)], &str) = (200, &[("vary", "*")], "star");
        assert_eq!(run(&*p, get("/star"), star).cache_status(), "MISS");
        assert_eq!(
            run(&*p, get("/star"), star).cache_status(),
            "MISS",
            "{conf}"
        );
    }
}

/// The memory strategy as APISIX's: an answer without `Vary` drops the key's variants, a
/// purge drops them all, and header names are compared whatever their case and order.
#[test]
fn memory_variants_follow_apisix_index() {
    let gw = gateway(1 << 20);
    let p = gw.plugin(memory(json!({})));
    let two: (u16, &[(&str, &str)], &str) = (200, &[("vary", "X-B, x-a")], "ab");
    let r = || with(with(get("/i"), "x-a", "1"), "x-b", "2");
    run(&*p, r(), two);
    let swapped: (u16, &[(&str, &str)], &str) = (200, &[("vary", "x-a,X-B")], "x");
    assert_eq!(run(&*p, r(), swapped).cache_status(), "HIT");
    // A different value of one header: another variant.
    let other = with(with(get("/i"), "x-a", "1"), "x-b", "3");
    assert_eq!(run(&*p, other, two).cache_status(), "MISS");
    // The next answer has no Vary: the variants go, every request gets it.
    let c = with(get("/i"), "x-a", "9");
    assert_eq!(run(&*p, c, ok("plain")).cache_status(), "MISS");
    let r2 = run(&*p, r(), OK);
    assert_eq!((r2.cache_status(), &r2.body[..]), ("HIT", &b"plain"[..]));
    assert_eq!(run(&*p, req("PURGE", "/i"), OK).status, 200);
    assert_eq!(run(&*p, req("PURGE", "/i"), OK).status, 404);
    // Only variants stored: PURGE still finds them.
    run(&*p, r(), two);
    assert_eq!(run(&*p, req("PURGE", "/i"), OK).status, 200);
    assert_eq!(run(&*p, r(), two).cache_status(), "MISS");
}

/// Disk: nginx's `stale-if-error`: an expired answer within the window is served in place of
/// the upstream's error, marked `STALE`; past the window, or without one, the error passes.
#[test]
fn disk_serves_stale_on_upstream_errors_within_stale_if_error() {
    let gw = gateway(1 << 20);
    let p = gw.plugin(disk(json!({})));
    let fresh: (u16, &[(&str, &str)], &str) = (
        200,
        &[
            ("content-type", "text/plain"),
            ("cache-control", "max-age=1, stale-if-error=60"),
        ],
        "kept",
    );
    let broken: (u16, &[(&str, &str)], &str) = (503, &[("content-type", "text/html")], "down");
    run(&*p, get("/e"), fresh);
    gw.clock.advance(2_000);
    let r = run(&*p, get("/e"), broken);
    assert_eq!(
        (r.status, r.cache_status(), &r.body[..]),
        (200, "STALE", &b"kept"[..])
    );
    assert_eq!(r.headers["content-type"], "text/plain");
    // An answer that is not an error replaces it as usual.
    let r = run(&*p, get("/e"), (404, &[], "gone"));
    assert_eq!((r.status, r.cache_status()), (200, "STALE"));
    let r = run(&*p, get("/e"), (400, &[], "bad"));
    assert_eq!((r.status, r.cache_status()), (400, "EXPIRED"));
    // Past the window the error passes.
    gw.clock.advance(60_000);
    let r = run(&*p, get("/e"), broken);
    assert_eq!(
        (r.status, r.cache_status(), &r.body[..]),
        (503, "EXPIRED", &b"down"[..])
    );
    // Without the extension nginx passes the error (APISIX's proxy_cache_use_stale off).
    let short: (u16, &[(&str, &str)], &str) = (200, &[("cache-control", "max-age=1")], "s");
    run(&*p, get("/s"), short);
    gw.clock.advance(2_000);
    let r = run(&*p, get("/s"), broken);
    assert_eq!((r.status, r.cache_status()), (503, "EXPIRED"));
    // stale-while-revalidate opens the error window too.
    let swr: (u16, &[(&str, &str)], &str) = (
        200,
        &[("cache-control", "max-age=1, stale-while-revalidate=10")],
        "w",
    );
    run(&*p, get("/w"), swr);
    gw.clock.advance(5_000);
    let r = run(&*p, get("/w"), (502, &[], ""));
    assert_eq!(
        (r.status, r.cache_status(), &r.body[..]),
        (200, "STALE", &b"w"[..])
    );
}

/// The memory strategy serves nothing stale, as APISIX's: an expired entry is fetched again
/// and the upstream's error passes.
#[test]
fn memory_has_no_stale_serving() {
    let gw = gateway(1 << 20);
    let p = gw.plugin(memory(json!({"cache_control": true})));
    let fresh: (u16, &[(&str, &str)], &str) = (
        200,
        &[(
            "cache-control",
            "max-age=1, stale-if-error=60, stale-while-revalidate=60",
        )],
        "m",
    );
    run(&*p, get("/m"), fresh);
    gw.clock.advance(2_000);
    let r = run(&*p, get("/m"), (502, &[], "err"));
    assert_eq!((r.status, r.cache_status()), (502, "EXPIRED"));
}

/// Disk: nginx's `stale-while-revalidate`: while one request fetches an expired answer anew,
/// the others within the window are served the old one, marked `UPDATING`.
#[tokio::test]
async fn disk_serves_updating_within_stale_while_revalidate() {
    let gw = gateway(1 << 20);
    let p = gw.plugin(disk(json!({})));
    let swr: (u16, &[(&str, &str)], &str) = (
        200,
        &[("cache-control", "max-age=1, stale-while-revalidate=30")],
        "old",
    );
    run(&*p, get("/u"), swr);
    gw.clock.advance(2_000);
    let mut first = get("/u");
    {
        let mut ctx = first.ctx();
        assert!(matches!(p.access(&mut ctx), Step::Done(Flow::Continue)));
    }
    let mut second = get("/u");
    let Step::Done(Flow::Exit(e)) = p.access(&mut second.ctx()) else {
        panic!("served the stale answer at once")
    };
    assert_eq!(e.body.as_deref(), Some(&b"old"[..]));
    assert!(e
        .headers
        .iter()
        .any(|(n, v)| n == "apisix-cache-status" && v == "UPDATING"));
    let a = finish(&*p, first, None, ok("new"));
    assert_eq!((a.cache_status(), &a.body[..]), ("EXPIRED", &b"new"[..]));
    assert_eq!(&run(&*p, get("/u"), OK).body[..], b"new");
    // Past the window the others wait for the fetch, as without it.
    let short: (u16, &[(&str, &str)], &str) = (
        200,
        &[("cache-control", "max-age=1, stale-while-revalidate=1")],
        "o",
    );
    run(&*p, get("/p"), short);
    gw.clock.advance(5_000);
    let mut first = get("/p");
    {
        let mut ctx = first.ctx();
        assert!(matches!(p.access(&mut ctx), Step::Done(Flow::Continue)));
    }
    let mut second = get("/p");
    assert!(matches!(p.access(&mut second.ctx()), Step::Wait(_)));
    drop(first);
}
