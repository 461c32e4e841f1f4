//! graphql-proxy-cache (`apisix/plugins/graphql-proxy-cache.lua`): proxy-cache for GraphQL
//! queries. A `GET` carries the query in its `query` argument, a `POST` in its body (the query
//! itself with `application/graphql`, or `{"query": ...}` with `application/json`); any other
//! method is refused with 405, a request that is not a readable query with 400 and APISIX's
//! messages. The cache key is the MD5 of the conf's version, the host, the route and service
//! ids, the consumer (with `consumer_isolation`, the default; else `$remote_user`) and the raw
//! query string or body, so two routes sharing a conf never share answers. It is sent back in
//! `APISIX-Cache-Key`, which the purge API takes.
//!
//! Queries are looked up and stored by proxy-cache's own strategies (memory or disk, in the
//! zones of config.yaml's `apisix.proxy_cache`), as APISIX runs its handlers: only 200s are
//! stored, for `cache_ttl` on a memory zone and for what the answer's headers say (else the
//! zones' `cache_ttl`) on a disk zone, with `Apisix-Cache-Status` on every answer. A document
//! holding a mutation is never looked up nor stored (`Apisix-Cache-Status: BYPASS`).
//!
//! `PURGE /apisix/plugin/graphql-proxy-cache/{disk|memory}/{route_id}/{key}` (through
//! public-api) deletes an entry of the route's conf: 200, or 404 when the route has no such
//! conf or (disk) nothing is stored under the key, 400 for a bad strategy or a missing part.
//! Unlike APISIX, a route that has this plugin through its service is found even when the
//! route has plugins of its own; and a disk strategy naming a memory zone is refused when the
//! conf is written, as proxy-cache refuses it, rather than failing at request time.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use ferrisix_config::schema::cjson;
use ferrisix_plugin_api::{
    ApiHandler, CheckCtx, CompileCtx, Exit, Flow, Phases, Plugin, PluginApi, PluginCtx, PluginDef,
    PluginServices, ResponseHead, SharedState, Step,
};
use ferrisix_router::VarSource;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use md5::{Digest, Md5};
use serde_json::{json, Value};

use super::proxy_cache::{check_zone, PresetKey, ProxyCache, Zone, Zones};
use crate::support::auth::message_exit;
use crate::support::graphql;

pub const NAME: &str = "graphql-proxy-cache";

pub static DEF: PluginDef = PluginDef {
    version: 0.1,
    check: Some(check),
    apis: Some(apis),
    ..PluginDef::new(NAME, 1009, schema, compile)
};

const CACHE_KEY_HEADER: HeaderName = HeaderName::from_static("apisix-cache-key");
const STATUS_HEADER: HeaderName = HeaderName::from_static("apisix-cache-status");

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "cache_zone": {
                "type": "string", "minLength": 1, "maxLength": 100,
                "default": "disk_cache_one"
            },
            "cache_strategy": {
                "type": "string", "enum": ["disk", "memory"], "default": "disk"
            },
            "cache_ttl": {"type": "integer", "minimum": 1, "default": 300},
            "consumer_isolation": {"type": "boolean", "default": true},
            "cache_set_cookie": {"type": "boolean", "default": false}
        }
    })
}

/// APISIX's `check_schema`: the zone must be one of config.yaml's; and, as proxy-cache
/// checks, of the strategy's kind.
fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    check_zone(cx, &cx.filled()?)
}

/// A conf compiled for a route, as the purge API finds it.
#[derive(Debug)]
struct RouteCache {
    memory: bool,
    zone: Zone,
}

/// The compiled confs by route id, for the purge API. An entry lives as long as the snapshot
/// that holds its route: when the route changes or goes, the next compile's entry (or none)
/// is what is found.
#[derive(Default)]
struct RouteCaches(Mutex<HashMap<Arc<str>, Vec<Weak<RouteCache>>>>);

impl SharedState for RouteCaches {
    fn create(_: &PluginServices) -> Self {
        RouteCaches::default()
    }
}

impl RouteCaches {
    fn register(&self, route: &Arc<str>, cache: &Arc<RouteCache>) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|_, list| {
            list.retain(|w| w.strong_count() > 0);
            !list.is_empty()
        });
        all.entry(route.clone())
            .or_default()
            .push(Arc::downgrade(cache));
    }

    /// The newest live conf of `route`.
    fn find(&self, route: &str) -> Option<Arc<RouteCache>> {
        let all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.get(route)?.iter().rev().find_map(Weak::upgrade)
    }
}

struct GraphqlProxyCache {
    cache: ProxyCache,
    /// APISIX's `plugin.conf_version`, first in the key, so a changed conf starts afresh.
    conf_version: u32,
    consumer_isolation: bool,
    /// config.yaml's `graphql.max_size`.
    max_size: usize,
    /// Kept alive with this compiled conf, so the purge API finds it.
    _registered: Option<Arc<RouteCache>>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let memory = conf["cache_strategy"] == "memory";
    let zone_name = conf["cache_zone"].as_str().unwrap_or("disk_cache_one");
    let zone = cx
        .services
        .shared::<Zones>()
        .get(cx.services, zone_name, memory)?;
    let registered = cx.route.map(|route| {
        let entry = Arc::new(RouteCache {
            memory,
            zone: zone.clone(),
        });
        cx.services
            .shared::<RouteCaches>()
            .register(&route.id, &entry);
        entry
    });
    Ok(Arc::new(GraphqlProxyCache {
        cache: ProxyCache::with_preset_key(
            zone,
            conf["cache_ttl"].as_u64().unwrap_or(300),
            conf["cache_set_cookie"].as_bool().unwrap_or(false),
            cx.services.clock().clone(),
        ),
        conf_version: cx.conf_version(),
        consumer_isolation: conf["consumer_isolation"].as_bool().unwrap_or(true),
        max_size: cx.services.graphql_max_size(),
        _registered: registered,
    }))
}

fn bad_request(msg: &str) -> Flow {
    Flow::Exit(message_exit(StatusCode::BAD_REQUEST, msg))
}

const NO_BODY: &str = "Invalid graphql request: can't get graphql request body";

impl GraphqlProxyCache {
    /// The request's raw query text (GET: its query string; POST: its body) and the GraphQL
    /// query in it, or the answer refusing it.
    async fn query(&self, ctx: &mut PluginCtx<'_>) -> Result<(Vec<u8>, String), Flow> {
        if *ctx.method() == Method::GET {
            let args = ctx.query().unwrap_or("");
            if args.is_empty() {
                tracing::error!("failed to read graphql data, args has zero size");
                return Err(bad_request(NO_BODY));
            }
            if args.len() > self.max_size {
                tracing::error!(
                    "failed to read graphql data, args size {} is greater than the maximum size {} allowed",
                    args.len(),
                    self.max_size
                );
                return Err(bad_request(NO_BODY));
            }
            let raw = args.as_bytes().to_vec();
            let Some(query) = ctx.arg("query") else {
                let msg = "invalid graphql request, args[query] is nil";
                tracing::error!("{msg}");
                return Err(bad_request(msg));
            };
            return Ok((raw, query.into_owned()));
        }
        let body = match ctx.read_body(self.max_size).await {
            Ok(b) if !b.is_empty() => b.clone(),
            Ok(_) => {
                tracing::error!("failed to read graphql data, request body has zero size");
                return Err(bad_request(NO_BODY));
            }
            Err(e) => {
                tracing::error!("failed to read graphql data, {e}");
                return Err(bad_request(NO_BODY));
            }
        };
        let content_type = ctx.header("content-type").unwrap_or("").to_owned();
        if content_type.starts_with("application/json") {
            let doc = cjson::decode(&body).map_err(|e| {
                let msg = format!("invalid graphql request, {e}");
                tracing::error!("{msg}");
                bad_request(&msg)
            })?;
            let query = match doc.get("query") {
                None | Some(Value::Null | Value::Bool(false)) => {
                    let msg = "invalid graphql request, json body[query] is nil";
                    tracing::error!("{msg}");
                    return Err(bad_request(msg));
                }
                Some(Value::String(q)) => q.clone(),
                // Not a text: the GraphQL parser refuses it.
                Some(_) => return Err(Flow::Exit(unparsable("the query is not a string"))),
            };
            return Ok((body.to_vec(), query));
        }
        if content_type.starts_with("application/graphql") {
            let query = String::from_utf8_lossy(&body).into_owned();
            return Ok((body.to_vec(), query));
        }
        let msg = format!("invalid graphql request, error content-type: {content_type}");
        tracing::error!("{msg}");
        Err(bad_request(&msg))
    }

    /// APISIX's key: MD5 of the conf version, host, route, service, identity and raw query,
    /// joined by `\x01` (outside what any of them may hold but the query, which is last).
    fn key(&self, ctx: &PluginCtx<'_>, raw: &[u8]) -> String {
        let var = |name: &str| ctx.var(name).map(|v| v.into_owned()).unwrap_or_default();
        let identity = if self.consumer_isolation {
            ctx.var("consumer_name")
                .filter(|n| !n.is_empty())
                .or_else(|| ctx.var("remote_user"))
                .map(|v| v.into_owned())
                .unwrap_or_default()
        } else {
            String::new()
        };
        let mut md5 = Md5::new();
        md5.update(self.conf_version.to_string());
        for part in [var("host"), var("route_id"), var("service_id"), identity] {
            md5.update(b"\x01");
            md5.update(part);
        }
        md5.update(b"\x01");
        md5.update(raw);
        crate::support::cloud::sigv4::hex(&md5.finalize())
    }

    async fn run(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let method = ctx.method().clone();
        // APISIX leaves PURGE on the route to do (its purge is the plugin API).
        if method != Method::GET && method != Method::POST {
            return Flow::Exit(Exit::status(StatusCode::METHOD_NOT_ALLOWED));
        }
        let (raw, query) = match self.query(ctx).await {
            Ok(q) => q,
            Err(flow) => return flow,
        };
        let doc = match graphql::parse(&query) {
            Ok(d) => d,
            Err(_) if graphql::is_blank(&query) => graphql::Document {
                definitions: Vec::new(),
            },
            Err(e) => return Flow::Exit(unparsable(&e)),
        };
        if doc.definitions.is_empty() {
            tracing::error!("failed to parse graphql: empty query");
            return bad_request("Invalid graphql request: empty graphql query");
        }
        if doc.has_mutation() {
            ctx.response_headers_mut()
                .insert(STATUS_HEADER, HeaderValue::from_static("BYPASS"));
            return Flow::Continue;
        }
        let key = self.key(ctx, &raw);
        if let Ok(value) = HeaderValue::from_str(&key) {
            ctx.response_headers_mut().insert(CACHE_KEY_HEADER, value);
        }
        ctx.insert(PresetKey(key));
        match self.cache.access(ctx) {
            Step::Done(flow) => flow,
            Step::Wait(fut) => fut.await,
        }
    }
}

fn unparsable(err: &str) -> Exit {
    tracing::error!("failed to parse graphql: {err}");
    message_exit(
        StatusCode::BAD_REQUEST,
        "Invalid graphql request: failed to parse graphql query",
    )
}

impl Plugin for GraphqlProxyCache {
    fn phases(&self) -> Phases {
        Phases::ACCESS | Phases::HEADER_FILTER
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.run(ctx)))
    }

    fn header_filter(&self, ctx: &mut PluginCtx<'_>, resp: &mut ResponseHead<'_>) {
        // Nothing to store for a request that never set a key (a mutation, a refused query).
        if ctx.get::<PresetKey>().is_some() {
            self.cache.header_filter(ctx, resp);
        }
    }
}

static PURGE: LazyLock<[Method; 1]> =
    LazyLock::new(|| [Method::from_bytes(b"PURGE").unwrap_or(Method::DELETE)]);

fn apis(_: &PluginServices) -> Vec<PluginApi> {
    vec![PluginApi {
        methods: &*PURGE,
        uri: "/apisix/plugin/graphql-proxy-cache/*".to_owned(),
        handler: ApiHandler::Request {
            plugin: NAME,
            make: Arc::new(|_, services| {
                Arc::new(PurgeApi {
                    services: services.clone(),
                })
            }),
        },
    }]
}

/// `PURGE /apisix/plugin/graphql-proxy-cache/{strategy}/{route_id}/{key}`.
struct PurgeApi {
    services: Arc<PluginServices>,
}

impl PurgeApi {
    fn answer(&self, uri: &str) -> StatusCode {
        // The segments after `/apisix/plugin/graphql-proxy-cache/`; more are ignored.
        let mut segs = uri.split('/').skip(4);
        let (strategy, route, key) = (
            segs.next().unwrap_or(""),
            segs.next().unwrap_or(""),
            segs.next().unwrap_or(""),
        );
        if strategy != "disk" && strategy != "memory" {
            tracing::error!("invalid strategy in purge request: {strategy}");
            return StatusCode::BAD_REQUEST;
        }
        if route.is_empty() || key.is_empty() {
            tracing::error!("missing route_id or cache_key in purge request");
            return StatusCode::BAD_REQUEST;
        }
        let Some(conf) = self.services.shared::<RouteCaches>().find(route) else {
            tracing::error!("failed to find graphql-proxy-cache conf, route_id: {route}");
            return StatusCode::NOT_FOUND;
        };
        let configured = if conf.memory { "memory" } else { "disk" };
        if strategy != configured {
            tracing::error!(
                "strategy mismatch: request strategy is {strategy} but route is configured with {configured}"
            );
            return StatusCode::BAD_REQUEST;
        }
        let found = conf.zone.purge(key);
        // APISIX purges a memory key's entries without asking whether there were any.
        if found || conf.memory {
            StatusCode::OK
        } else {
            tracing::error!("failed to purge graphql cache, nothing stored under {key}");
            StatusCode::NOT_FOUND
        }
    }
}

impl Plugin for PurgeApi {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let status = self.answer(ctx.uri());
        Step::exit(Exit::status(status))
    }
}

#[cfg(test)]
mod tests;
