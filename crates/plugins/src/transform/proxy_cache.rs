//! proxy-cache (`apisix/plugins/proxy-cache/`): stores upstream answers by a cache key made of
//! variables (`cache_key`) and serves them again without the upstream, from a memory zone
//! (`cache_strategy: memory`, APISIX's shared-dictionary strategy) or a disk zone (`disk`, the
//! default, nginx's `proxy_cache` as APISIX configures it). The zones are config.yaml's
//! `apisix.proxy_cache.zones`; a conf naming another zone, or a zone of the other kind, is
//! refused with APISIX's messages.
//!
//! Every answer says what the cache did in `Apisix-Cache-Status`: `HIT` (served from the
//! zone), `MISS` (nothing stored, or a request the conf does not cache), `EXPIRED` (stored
//! but past its time: fetched again and stored anew), `STALE` (memory, `cache_control`: older
//! than the client accepts), `BYPASS` (`cache_bypass` said so, or, on disk, a method outside
//! `cache_method`; on memory a client's `no-cache`/`no-store` with `cache_control`). `PURGE`
//! deletes the request's entry (200, or 404 when there was none).
//!
//! The two strategies differ as they do in APISIX: the memory strategy stores for `cache_ttl`
//! (or, with `cache_control`, what the answer's `s-maxage`, `max-age` or `Expires` say) any
//! answer whose status is in `cache_http_status`, adds `Age` to hits and honours the client's
//! `Cache-Control` with `cache_control`; the disk strategy stores for what the answer's
//! `X-Accel-Expires`, `Cache-Control` or `Expires` say, else for the zones' `cache_ttl`, and a
//! `cache_bypass` request's answer replaces the stored one. Both refuse answers marked
//! `private`, `no-store` or `no-cache`, answers with `Set-Cookie` (memory: unless
//! `cache_set_cookie`) and with `Vary: *`. A `HEAD` on a cached path asks the upstream for a
//! `GET`, so the whole answer is stored (nginx's `proxy_cache_convert_head`).
//!
//! Answers with `Vary` are stored per variant, each strategy as its APISIX counterpart does
//! (see `memory` and `disk`). On disk an expired answer still serves within the stale windows
//! the answer's `Cache-Control` gave it (nginx's reading of `stale-while-revalidate` and
//! `stale-if-error`, with APISIX's `proxy_cache_use_stale off`): to the requests that come
//! while another fetches it anew (`UPDATING`), and in place of the upstream's error (`STALE`).
//! The memory strategy has no stale serving, as APISIX's.
//!
//! With `consumer_isolation` (the default) the authenticated consumer's name (else
//! `$remote_user`) is put before the key, unless the key already names the requester.
//!
//! Misses on one key make one upstream fetch: while a request fetches a key, the others that
//! miss it wait (up to APISIX's `proxy_cache_lock_timeout`, 5 s) and are served what it
//! stored (nginx's cache lock, which APISIX leaves off; it spares the upstream a stampede).

mod disk;
mod lru;
mod memory;
mod stored;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use ferrisix_config::settings::cache_levels;
use ferrisix_plugin_api::{
    BodyChunk, BodyFilter, CheckCtx, Clock, CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx,
    PluginDef, PluginServices, ResponseHead, SharedState, Step,
};
use ferrisix_router::VarSource;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use serde_json::{json, Value};
use tokio::sync::watch;

use disk::DiskZone;
use memory::{Lookup, MemoryZone};
use stored::{Directives, Freshness, StaleWindows, Stored};

pub const NAME: &str = "proxy-cache";

pub static DEF: PluginDef = PluginDef {
    version: 0.2,
    check: Some(check),
    ..PluginDef::new(NAME, 1085, schema, compile)
};

const KEY_PATTERN: &str = r"(^[^\$].+$|^\$[0-9a-zA-Z_]+$)";

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "max_resp_body_size": {"type": "integer", "minimum": 1, "default": 67108864},
            "cache_zone": {
                "type": "string", "minLength": 1, "maxLength": 100,
                "default": "disk_cache_one"
            },
            "cache_strategy": {
                "type": "string", "enum": ["disk", "memory"], "default": "disk"
            },
            "cache_key": {
                "type": "array", "minItems": 1,
                "items": {"description": "a key for caching", "type": "string",
                          "pattern": KEY_PATTERN},
                "default": ["$host", "$request_uri"]
            },
            "cache_http_status": {
                "type": "array", "minItems": 1,
                "items": {"description": "http response status", "type": "integer",
                          "minimum": 200, "maximum": 599},
                "uniqueItems": true,
                "default": [200, 301, 404]
            },
            "cache_method": {
                "type": "array", "minItems": 1,
                "items": {"description": "supported http method", "type": "string",
                          "enum": ["GET", "POST", "HEAD"]},
                "uniqueItems": true,
                "default": ["GET", "HEAD"]
            },
            "hide_cache_headers": {"type": "boolean", "default": false},
            "cache_control": {"type": "boolean", "default": false},
            "cache_bypass": {
                "type": "array", "minItems": 1,
                "items": {"type": "string", "pattern": KEY_PATTERN}
            },
            "no_cache": {
                "type": "array", "minItems": 1,
                "items": {"type": "string", "pattern": KEY_PATTERN}
            },
            "cache_ttl": {"type": "integer", "minimum": 1, "default": 300},
            "consumer_isolation": {"type": "boolean", "default": true},
            "cache_set_cookie": {"type": "boolean", "default": false}
        }
    })
}

fn strings(conf: &Value, name: &str) -> Vec<String> {
    conf.get(name)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

/// APISIX's `check_schema`: `$request_method` cannot be part of the key, and the zone must be
/// one of config.yaml's, of the strategy's kind (a disk zone has `disk_path`).
fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    let conf = cx.filled()?;
    for key in strings(&conf, "cache_key") {
        if key == "$request_method" {
            return Err(format!("cache_key variable {key} unsupported"));
        }
    }
    check_zone(cx, &conf)
}

/// The conf's `cache_zone` is one of config.yaml's zones, of its `cache_strategy`'s kind (a
/// disk zone has `disk_path`); any name passes when config.yaml has no `apisix.proxy_cache`.
pub(super) fn check_zone(cx: &CheckCtx<'_>, conf: &Value) -> Result<(), String> {
    let Some(settings) = cx.services.proxy_cache() else {
        return Ok(());
    };
    let zone = conf["cache_zone"].as_str().unwrap_or_default();
    let strategy = conf["cache_strategy"].as_str().unwrap_or_default();
    match settings.zones.iter().find(|z| z.name == zone) {
        None => Err(format!("cache_zone {zone} not found")),
        Some(z) if (strategy == "memory") == z.disk_path.is_some() => Err(format!(
            "invalid or empty cache_zone for cache_strategy: {strategy}"
        )),
        Some(_) => Ok(()),
    }
}

/// A disk zone `disk_cache_one` in `dir` and a memory zone `memory_cache`, for the tests of
/// the plugins that store in zones.
#[cfg(test)]
pub(super) fn test_zones(dir: &std::path::Path) -> ferrisix_config::settings::ProxyCacheSettings {
    use ferrisix_config::settings::{CacheZone, ProxyCacheSettings};
    ProxyCacheSettings {
        cache_ttl: std::time::Duration::from_secs(10),
        zones: vec![
            CacheZone {
                name: "disk_cache_one".into(),
                memory_size: 1 << 20,
                disk_size: Some(1 << 30),
                disk_path: Some(dir.to_string_lossy().into_owned()),
                cache_levels: Some("1:2".into()),
            },
            CacheZone {
                name: "memory_cache".into(),
                memory_size: 1 << 20,
                disk_size: None,
                disk_path: None,
                cache_levels: None,
            },
        ],
    }
}

/// A zone, made once per gateway and name: where answers are stored, and the fetches in
/// flight for its keys.
#[derive(Clone, Debug)]
pub(super) struct Zone {
    store: Store,
    fills: Arc<Fills>,
}

#[derive(Clone, Debug)]
enum Store {
    Memory(Arc<MemoryZone>),
    Disk {
        zone: Arc<DiskZone>,
        /// The zones' `cache_ttl` (`proxy_cache_valid any`), in milliseconds.
        default_ttl_ms: u64,
    },
}

impl Zone {
    /// The answer for a request under `key` (its variant, when stored answers vary), and on
    /// disk the second file looked in.
    fn lookup(&self, key: &str, request: &HeaderMap, now_ms: u64) -> (Lookup, Option<[u8; 16]>) {
        match &self.store {
            Store::Memory(z) => (z.lookup(key, request, now_ms), None),
            Store::Disk { zone, .. } => zone.lookup(key, request, now_ms),
        }
    }

    /// Deletes the answers stored under `key` (memory: every variant; disk: the key's file);
    /// false when there was none.
    pub(super) fn purge(&self, key: &str) -> bool {
        match &self.store {
            Store::Memory(z) => z.purge_all(key),
            Store::Disk { zone, .. } => zone.purge(key),
        }
    }
}

/// How long a request waits for another's fetch of its key (APISIX's
/// `proxy_cache_lock_timeout`) before it goes upstream itself.
const FILL_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The keys being fetched: a request that misses while another fetches its key waits for that
/// answer instead of asking the upstream too.
#[derive(Debug, Default)]
struct Fills(Mutex<HashMap<String, watch::Receiver<()>>>);

enum Claim {
    /// This request fetches; the guard ends the claim when the request is over.
    Mine(FillGuard),
    /// Another does: this ends when it is over.
    Wait(watch::Receiver<()>),
}

impl Fills {
    fn claim(self: &Arc<Self>, key: &str) -> Claim {
        let mut fills = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(done) = fills.get(key) {
            return Claim::Wait(done.clone());
        }
        let (tx, rx) = watch::channel(());
        fills.insert(key.to_owned(), rx);
        Claim::Mine(FillGuard {
            fills: self.clone(),
            key: key.to_owned(),
            _done: tx,
        })
    }
}

/// Held by the request fetching a key; dropped when it ends (its answer stored by then, if
/// it is stored), which wakes the waiters.
struct FillGuard {
    fills: Arc<Fills>,
    key: String,
    _done: watch::Sender<()>,
}

impl Drop for FillGuard {
    fn drop(&mut self) {
        let mut fills = self.fills.0.lock().unwrap_or_else(|e| e.into_inner());
        fills.remove(&self.key);
        // `_done` is dropped after this: the waiters' `changed()` ends.
    }
}

/// The gateway's zones, made when a conf first names them.
#[derive(Default)]
pub(super) struct Zones(Mutex<HashMap<String, Zone>>);

impl SharedState for Zones {
    fn create(_: &PluginServices) -> Self {
        Zones::default()
    }
}

impl Zones {
    pub(super) fn get(
        &self,
        services: &PluginServices,
        name: &str,
        memory: bool,
    ) -> Result<Zone, String> {
        let mut made = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(z) = made.get(name) {
            return Ok(z.clone());
        }
        let settings = services.proxy_cache();
        let conf = settings.and_then(|s| s.zones.iter().find(|z| z.name == name));
        let store = match (conf, memory) {
            (Some(c), false) => {
                let path = c
                    .disk_path
                    .as_deref()
                    .ok_or("invalid or empty cache_zone for cache_strategy: disk")?;
                let levels = match &c.cache_levels {
                    Some(l) => {
                        cache_levels(l).ok_or_else(|| format!("invalid cache_levels {l}"))?
                    }
                    None => Vec::new(),
                };
                let zone = Arc::new(DiskZone::new(
                    std::path::Path::new(path),
                    levels,
                    c.disk_size,
                    c.memory_size,
                ));
                load_in_background(services, &zone);
                Store::Disk {
                    zone,
                    default_ttl_ms: settings.map_or(10_000, |s| {
                        u64::try_from(s.cache_ttl.as_millis()).unwrap_or(u64::MAX)
                    }),
                }
            }
            (Some(c), true) => Store::Memory(Arc::new(MemoryZone::new(c.memory_size))),
            // No `apisix.proxy_cache` at all: APISIX accepts any name; a memory zone of
            // APISIX's default size serves it.
            (None, true) => Store::Memory(Arc::new(MemoryZone::new(50 << 20))),
            (None, false) => return Err(format!("cache_zone {name} not found")),
        };
        let zone = Zone {
            store,
            fills: Arc::default(),
        };
        made.insert(name.to_owned(), zone.clone());
        Ok(zone)
    }
}

/// Reads a disk zone's directory into its index off the request path (nginx's cache loader).
fn load_in_background(services: &PluginServices, zone: &Arc<DiskZone>) {
    let z = zone.clone();
    let spawned = services.executor().spawn(async move {
        let _ = tokio::task::spawn_blocking(move || z.load()).await;
    });
    if spawned.is_err() {
        zone.load();
    }
}

/// One piece of a key: text, or a variable's value.
#[derive(Debug)]
enum Part {
    Text(String),
    Var(String),
}

fn parts(list: &[String]) -> Vec<Part> {
    list.iter()
        .map(|p| match p.strip_prefix('$') {
            Some(var) => Part::Var(var.to_owned()),
            None => Part::Text(p.clone()),
        })
        .collect()
}

/// APISIX's `generate_complex_value`: the pieces joined, a missing variable as nothing.
fn complex_value(parts: &[Part], ctx: &PluginCtx<'_>) -> String {
    let mut out = String::new();
    for p in parts {
        match p {
            Part::Text(t) => out.push_str(t),
            Part::Var(v) => {
                if let Some(value) = ctx.var(v) {
                    out.push_str(&value);
                }
            }
        }
    }
    out
}

/// `cache_bypass` and `no_cache` are on unless empty or `0`.
fn truthy(value: &str) -> bool {
    !value.is_empty() && value != "0"
}

/// Entries of the key that already say who is asking: consumer isolation then adds nothing.
const IDENTITY_VARS: [&str; 4] = [
    "$consumer_name",
    "$consumer_group_id",
    "$remote_user",
    "$http_authorization",
];

/// Where a request's key comes from.
#[derive(Debug)]
enum KeySpec {
    /// `cache_key`'s pieces.
    Parts(Vec<Part>),
    /// A [`PresetKey`] the calling plugin put in the request's context.
    Preset,
}

/// The key of a request, made by a plugin that runs proxy-cache's strategies with a key of
/// its own (graphql-proxy-cache, APISIX's `upstream_cache_key` set before the handlers run).
#[derive(Debug)]
pub(super) struct PresetKey(pub String);

#[derive(Debug)]
pub(super) struct ProxyCache {
    zone: Zone,
    key: KeySpec,
    isolate: bool,
    bypass: Option<Vec<Part>>,
    no_cache: Option<Vec<Part>>,
    methods: Vec<Method>,
    statuses: Vec<u16>,
    hide_cache_headers: bool,
    cache_control: bool,
    ttl_ms: u64,
    max_body: usize,
    cache_set_cookie: bool,
    clock: Clock,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let memory = conf["cache_strategy"] == "memory";
    let zone_name = conf["cache_zone"].as_str().unwrap_or("disk_cache_one");
    let zone = cx
        .services
        .shared::<Zones>()
        .get(cx.services, zone_name, memory)?;
    let key = strings(&conf, "cache_key");
    let optional = |name: &str| conf.get(name).map(|_| parts(&strings(&conf, name)));
    Ok(Arc::new(ProxyCache {
        zone,
        isolate: conf["consumer_isolation"].as_bool().unwrap_or(true)
            && !key.iter().any(|k| IDENTITY_VARS.contains(&k.as_str())),
        key: KeySpec::Parts(parts(&key)),
        bypass: optional("cache_bypass"),
        no_cache: optional("no_cache"),
        methods: strings(&conf, "cache_method")
            .iter()
            .filter_map(|m| Method::from_bytes(m.as_bytes()).ok())
            .collect(),
        statuses: conf["cache_http_status"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
            .filter_map(|s| u16::try_from(s).ok())
            .collect(),
        hide_cache_headers: conf["hide_cache_headers"].as_bool().unwrap_or(false),
        cache_control: conf["cache_control"].as_bool().unwrap_or(false),
        ttl_ms: conf["cache_ttl"]
            .as_u64()
            .unwrap_or(300)
            .saturating_mul(1000),
        max_body: conf["max_resp_body_size"]
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(usize::MAX),
        cache_set_cookie: conf["cache_set_cookie"].as_bool().unwrap_or(false),
        clock: cx.services.clock().clone(),
    }))
}

const STATUS_HEADER: HeaderName = HeaderName::from_static("apisix-cache-status");

fn status_value(s: &'static str) -> HeaderValue {
    HeaderValue::from_static(s)
}

/// The memory strategy's status goes on whatever answer ends the request, as APISIX sets it
/// in the access phase.
fn set_status(ctx: &mut PluginCtx<'_>, s: &'static str) {
    ctx.response_headers_mut()
        .insert(STATUS_HEADER, status_value(s));
}

/// What the request phase decided, for the response phase.
#[derive(Debug)]
struct Pending {
    /// The key the answer is stored under; `None`: it is not stored.
    key: Option<String>,
    /// The disk strategy's `Apisix-Cache-Status`, set on the upstream's answer; `None`: no
    /// status (a method nginx does not cache).
    disk_status: Option<&'static str>,
    /// Disk: the second file the lookup looked in (where the answer may go).
    looked: Option<[u8; 16]>,
    /// Disk: the expired answer, served in place of an upstream error within its
    /// `stale-if-error` window.
    stale: Option<Arc<Stored>>,
}

impl Pending {
    fn new(key: Option<String>, disk_status: Option<&'static str>) -> Pending {
        Pending {
            key,
            disk_status,
            looked: None,
            stale: None,
        }
    }
}

/// The request was answered from the cache.
#[derive(Debug)]
struct Hit;

impl ProxyCache {
    /// The cache graphql-proxy-cache runs (APISIX's `graphql_cache_conf`): `GET` and `POST`,
    /// only 200s stored, the key made by the caller, no bypass, no `Cache-Control` reading.
    pub(super) fn with_preset_key(
        zone: Zone,
        ttl_s: u64,
        cache_set_cookie: bool,
        clock: Clock,
    ) -> ProxyCache {
        ProxyCache {
            zone,
            key: KeySpec::Preset,
            isolate: false,
            bypass: None,
            no_cache: None,
            methods: vec![Method::GET, Method::POST],
            statuses: vec![200],
            hide_cache_headers: false,
            cache_control: false,
            ttl_ms: ttl_s.saturating_mul(1000),
            max_body: usize::MAX,
            cache_set_cookie,
            clock,
        }
    }

    fn key(&self, ctx: &PluginCtx<'_>) -> String {
        let key = match &self.key {
            KeySpec::Parts(parts) => complex_value(parts, ctx),
            KeySpec::Preset => ctx
                .get::<PresetKey>()
                .map(|k| k.0.clone())
                .unwrap_or_default(),
        };
        if !self.isolate {
            return key;
        }
        let identity = ctx
            .var("consumer_name")
            .filter(|n| !n.is_empty())
            .or_else(|| ctx.var("remote_user").filter(|n| !n.is_empty()));
        match identity {
            // The separator is outside what a consumer's name may hold.
            Some(id) => format!("{id}\u{1}{key}"),
            None => key,
        }
    }

    fn on(&self, list: &Option<Vec<Part>>, ctx: &PluginCtx<'_>) -> bool {
        list.as_deref()
            .is_some_and(|parts| truthy(&complex_value(parts, ctx)))
    }

    /// The answer served from the cache.
    fn hit(&self, stored: &Stored, extra: &[(HeaderName, HeaderValue)]) -> Exit {
        let mut headers = Vec::with_capacity(stored.headers.len() + extra.len());
        for (n, v) in &stored.headers {
            if !(self.hide_cache_headers && stored::is_cache_header(n)) {
                headers.push((n.clone(), v.clone()));
            }
        }
        headers.extend_from_slice(extra);
        Exit {
            status: stored.status,
            body: Some(stored.body.clone()),
            headers,
        }
    }

    /// What a request does before the lookup: `Err` when it is answered or passed on
    /// without one, else its key and (memory, `cache_control`) the client's directives.
    fn before_lookup(
        &self,
        ctx: &mut PluginCtx<'_>,
    ) -> Result<(String, Directives), Step<'static>> {
        let method = ctx.method().clone();
        let memory = matches!(self.zone.store, Store::Memory(_));
        let purge = method.as_str() == "PURGE";
        let cc = if memory && self.cache_control {
            Directives::parse(ctx.headers().get_all(header::CACHE_CONTROL).iter())
        } else {
            Directives::default()
        };
        if memory && !purge {
            if !self.methods.contains(&method) {
                set_status(ctx, "MISS");
                return Err(Step::CONTINUE);
            }
            if self.on(&self.bypass, ctx) || (self.cache_control && (cc.no_store || cc.no_cache)) {
                set_status(ctx, "BYPASS");
                return Err(Step::CONTINUE);
            }
        }
        let key = self.key(ctx);
        if purge {
            let found = self.zone.purge(&key);
            return Err(Step::exit(Exit::status(if found {
                StatusCode::OK
            } else {
                StatusCode::NOT_FOUND
            })));
        }
        if !memory {
            // nginx's `proxy_cache_methods GET HEAD POST`: other methods never meet the cache.
            if !(method == Method::GET || method == Method::HEAD || method == Method::POST) {
                ctx.insert(Pending::new(None, None));
                return Err(Step::CONTINUE);
            }
            if method == Method::HEAD {
                ctx.set_upstream_method(Method::GET);
            }
            if self.on(&self.bypass, ctx) || !self.methods.contains(&method) {
                ctx.insert(Pending::new(Some(key), Some("BYPASS")));
                return Err(Step::CONTINUE);
            }
        }
        Ok((key, cc))
    }

    /// A stored answer, unless the client (memory, `cache_control`) wants a fresher one.
    fn usable(&self, stored: &Stored, cc: &Directives, now: u64) -> Result<Exit, ()> {
        let age = now.saturating_sub(stored.stored_ms) as f64 / 1000.0;
        let memory = matches!(self.zone.store, Store::Memory(_));
        if memory && self.cache_control {
            let ttl = stored.expires_ms.saturating_sub(stored.stored_ms) as f64 / 1000.0;
            if cc.max_age.is_some_and(|m| age > m)
                || cc.max_stale.is_some_and(|m| age - ttl > m)
                || cc.min_fresh.is_some_and(|m| ttl - age < m)
            {
                return Err(());
            }
        }
        let hit = (STATUS_HEADER, status_value("HIT"));
        if !memory {
            return Ok(self.hit(stored, &[hit]));
        }
        let mut age_text = itoa::Buffer::new();
        let age = HeaderValue::from_str(age_text.format(age.floor() as u64))
            .unwrap_or(HeaderValue::from_static("0"));
        Ok(self.hit(stored, &[(header::AGE, age), hit]))
    }

    /// The request goes upstream; its answer may be stored under `key`. `found` is what the
    /// lookup found (disk: the second file looked in, the expired answer).
    fn miss(
        &self,
        ctx: &mut PluginCtx<'_>,
        key: String,
        status: &'static str,
        found: (Option<[u8; 16]>, Option<Arc<Stored>>),
    ) -> Flow {
        match self.zone.store {
            Store::Memory(_) => {
                set_status(ctx, status);
                if ctx.method() == Method::HEAD {
                    ctx.set_upstream_method(Method::GET);
                }
                ctx.insert(Pending::new(Some(key), None));
            }
            Store::Disk { .. } => {
                let now = self.clock.epoch_ms();
                ctx.insert(Pending {
                    key: Some(key),
                    disk_status: Some(status),
                    looked: found.0,
                    // nginx decides when it reads the file whether the error window is open.
                    stale: found
                        .1
                        .filter(|s| within(s.expires_ms, s.stale.error_ms, now)),
                })
            }
        }
        Flow::Continue
    }

    /// nginx's `UPDATING`: an expired disk answer within its `stale-while-revalidate` window,
    /// served while another request fetches it anew.
    fn updating(&self, stale: Option<&Arc<Stored>>, now: u64) -> Option<Exit> {
        let stale = stale?;
        if !matches!(self.zone.store, Store::Disk { .. })
            || !within(stale.expires_ms, stale.stale.updating_ms, now)
        {
            return None;
        }
        Some(self.hit(stale, &[(STATUS_HEADER, status_value("UPDATING"))]))
    }
    /// Whether the answer is to be stored, for how long (milliseconds) and with which stale
    /// windows.
    fn storable(
        &self,
        ctx: &PluginCtx<'_>,
        resp: &ResponseHead<'_>,
        disk_default: Option<u64>,
    ) -> Option<(u64, StaleWindows)> {
        if !self.statuses.contains(&resp.status().as_u16()) || self.on(&self.no_cache, ctx) {
            return None;
        }
        let headers = resp.headers();
        let now = self.clock.epoch_ms();
        if let Some(default) = disk_default {
            if !resp.from_upstream() || !self.methods.contains(ctx.method()) {
                return None;
            }
            let (fresh, windows) = stored::nginx_caching(headers, now);
            return match fresh {
                Freshness::Never => None,
                Freshness::For(ms) => Some((ms, windows)),
                Freshness::Default => Some((default, windows)),
            };
        }
        let cc = Directives::parse(headers.get_all(header::CACHE_CONTROL).iter());
        if cc.private || cc.no_store || cc.no_cache {
            return None;
        }
        if !self.cache_set_cookie && headers.contains_key(header::SET_COOKIE) {
            return None;
        }
        stored::vary_list(headers)?;
        let none = StaleWindows::default();
        if self.cache_control {
            let ttl = stored::resource_ttl_ms(&cc, headers, now);
            return (ttl > 0).then_some((ttl, none));
        }
        Some((self.ttl_ms, none))
    }
}

impl Plugin for ProxyCache {
    fn phases(&self) -> Phases {
        Phases::ACCESS | Phases::HEADER_FILTER
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let (key, cc) = match self.before_lookup(ctx) {
            Ok(k) => k,
            Err(step) => return step,
        };
        let now = self.clock.epoch_ms();
        let (found, looked) = self.zone.lookup(&key, ctx.headers(), now);
        let (status, stale) = match found {
            Lookup::Fresh(stored) => match self.usable(&stored, &cc, now) {
                Ok(exit) => {
                    ctx.insert(Hit);
                    return Step::exit(exit);
                }
                // Only the client finds it stale: no one else waits for this fetch.
                Err(()) => return Step::Done(self.miss(ctx, key, "STALE", (looked, None))),
            },
            Lookup::Missing if self.cache_control && cc.only_if_cached => {
                set_status(ctx, "MISS");
                return Step::exit(Exit::status(StatusCode::GATEWAY_TIMEOUT));
            }
            Lookup::Missing => ("MISS", None),
            Lookup::Expired(stale) => ("EXPIRED", stale),
        };
        // One fetch per key at a time (nginx's cache lock): the others wait for its answer.
        match self.zone.fills.claim(&key) {
            Claim::Mine(guard) => {
                ctx.add_guard(Box::new(guard));
                Step::Done(self.miss(ctx, key, status, (looked, stale)))
            }
            Claim::Wait(mut done) => {
                if let Some(exit) = self.updating(stale.as_ref(), now) {
                    ctx.insert(Hit);
                    return Step::exit(exit);
                }
                Step::Wait(Box::pin(async move {
                    let _ = tokio::time::timeout(FILL_WAIT, done.changed()).await;
                    let now = self.clock.epoch_ms();
                    let (found, looked) = self.zone.lookup(&key, ctx.headers(), now);
                    let stale = match found {
                        Lookup::Fresh(stored) => {
                            if let Ok(exit) = self.usable(&stored, &cc, now) {
                                ctx.insert(Hit);
                                return Flow::Exit(exit);
                            }
                            None
                        }
                        Lookup::Expired(stale) => stale,
                        Lookup::Missing => None,
                    };
                    self.miss(ctx, key, status, (looked, stale))
                }))
            }
        }
    }

    fn header_filter(&self, ctx: &mut PluginCtx<'_>, resp: &mut ResponseHead<'_>) {
        if ctx.get::<Hit>().is_some() {
            return;
        }
        let disk_default = match &self.zone.store {
            Store::Disk { default_ttl_ms, .. } => Some(*default_ttl_ms),
            Store::Memory(_) => None,
        };
        let Some(pending) = ctx.get::<Pending>() else {
            if disk_default.is_some() && self.hide_cache_headers {
                hide(resp);
            }
            return;
        };
        if let Some(stale) = pending.stale.clone().filter(|_| upstream_failed(resp)) {
            self.serve_stale(resp, &stale);
            return;
        }
        if disk_default.is_some() {
            let status = pending.disk_status.filter(|_| resp.from_upstream());
            match status {
                Some(s) => {
                    resp.headers_mut().insert(STATUS_HEADER, status_value(s));
                }
                None => {
                    resp.headers_mut().remove(STATUS_HEADER);
                }
            }
        }
        let key = pending.key.clone();
        let looked = pending.looked;
        // What the upstream sent is stored; hiding is for the client.
        let ttl = key
            .as_ref()
            .and_then(|_| self.storable(ctx, resp, disk_default));
        let headers: Vec<(HeaderName, HeaderValue)> = match ttl {
            Some(_) => resp
                .headers()
                .iter()
                .filter(|(n, _)| stored::storable(n))
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect(),
            None => Vec::new(),
        };
        if self.hide_cache_headers {
            hide(resp);
        }
        let (Some(key), Some((ttl, stale))) = (key, ttl) else {
            return;
        };
        let now = self.clock.epoch_ms();
        let place = match &self.zone.store {
            Store::Memory(_) => {
                let vary = stored::vary_list(resp.headers()).unwrap_or_default();
                let signature = memory::signature(&vary, ctx.headers());
                Place::Memory { vary, signature }
            }
            Store::Disk { .. } => {
                let vary = stored::nginx_vary(resp.headers())
                    .ok()
                    .flatten()
                    .map(str::to_owned);
                let (file, variant) =
                    DiskZone::target(&key, looked, vary.as_deref(), ctx.headers());
                Place::Disk {
                    file,
                    vary,
                    variant,
                }
            }
        };
        resp.add_body_filter(Box::new(Capture {
            buf: BytesMut::new(),
            limit: self.max_body,
            over: false,
            entry: Some(Entry {
                zone: self.zone.clone(),
                key,
                place,
                stored: Stored {
                    status: resp.status(),
                    headers,
                    body: Bytes::new(),
                    stored_ms: now,
                    expires_ms: now.saturating_add(ttl),
                    stale,
                },
            }),
        }));
    }
}

impl ProxyCache {
    /// nginx's stale answer in place of the upstream's error (`Apisix-Cache-Status: STALE`):
    /// the stored status, headers and body replace the error's.
    fn serve_stale(&self, resp: &mut ResponseHead<'_>, stale: &Stored) {
        resp.set_status(stale.status);
        let headers = resp.headers_mut();
        for name in [
            header::CONTENT_LENGTH,
            header::CONTENT_TYPE,
            header::CONTENT_ENCODING,
            header::TRANSFER_ENCODING,
            header::ETAG,
            header::LAST_MODIFIED,
            header::CACHE_CONTROL,
            header::EXPIRES,
            header::VARY,
        ] {
            headers.remove(name);
        }
        for (n, _) in &stale.headers {
            headers.remove(n);
        }
        for (n, v) in &stale.headers {
            if !(self.hide_cache_headers && stored::is_cache_header(n)) {
                headers.append(n.clone(), v.clone());
            }
        }
        headers.insert(STATUS_HEADER, status_value("STALE"));
        resp.replace_body(stale.body.clone());
    }
}

/// Whether `ms` past `expires_ms` reaches `now` (nginx: `valid_sec + window >= now`).
fn within(expires_ms: u64, window_ms: u64, now: u64) -> bool {
    window_ms > 0 && expires_ms.saturating_add(window_ms) >= now
}

/// The failures nginx serves a stale answer for under `stale-if-error`: the upstream's 500,
/// 502, 503, 504, 403, 404 and 429 (`proxy_next_upstream`'s statuses), and the gateway's own
/// 502 and 504 when the upstream could not be reached or timed out.
fn upstream_failed(resp: &ResponseHead<'_>) -> bool {
    let s = resp.status().as_u16();
    if resp.from_upstream() {
        matches!(s, 500 | 502 | 503 | 504 | 403 | 404 | 429)
    } else {
        matches!(s, 502 | 504)
    }
}

/// Where an answer goes in its zone.
enum Place {
    /// Under its variant when it varies (APISIX's index of variants).
    Memory {
        vary: Vec<String>,
        signature: String,
    },
    /// In the file chosen at lookup, with its `Vary` and variant (nginx's).
    Disk {
        file: [u8; 16],
        vary: Option<String>,
        variant: [u8; 16],
    },
}

fn hide(resp: &mut ResponseHead<'_>) {
    resp.headers_mut().remove(header::CACHE_CONTROL);
    resp.headers_mut().remove(header::EXPIRES);
}

/// The answer to store once its body is complete.
struct Entry {
    zone: Zone,
    key: String,
    place: Place,
    stored: Stored,
}

/// Passes the body through and keeps a copy; stores the answer when the body ended whole and
/// within `max_resp_body_size` (a larger one, or one cut short, is not stored).
struct Capture {
    buf: BytesMut,
    limit: usize,
    over: bool,
    entry: Option<Entry>,
}

impl BodyFilter for Capture {
    fn filter(&mut self, chunk: &mut BodyChunk) {
        if !self.over {
            if self.buf.len() + chunk.data.len() >= self.limit {
                self.over = true;
                self.buf = BytesMut::new();
            } else {
                self.buf.extend_from_slice(&chunk.data);
            }
        }
        if !chunk.end || self.over {
            return;
        }
        let Some(mut entry) = self.entry.take() else {
            return;
        };
        entry.stored.body = std::mem::take(&mut self.buf).freeze();
        match (&entry.zone.store, entry.place) {
            (Store::Memory(z), Place::Memory { vary, signature }) => {
                let now = entry.stored.stored_ms;
                z.store(&entry.key, &vary, &signature, Arc::new(entry.stored), now);
            }
            (
                Store::Disk { zone, .. },
                Place::Disk {
                    file,
                    vary,
                    variant,
                },
            ) => zone.set_at(file, &entry.key, &entry.stored, vary.as_deref(), variant),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
