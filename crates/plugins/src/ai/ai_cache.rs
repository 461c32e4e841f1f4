//! ai-cache (`apisix/plugins/ai-cache.lua`, `ai-cache/`): answers an LLM request from Redis
//! when the same prompt (the exact layer, a key derived from what decides the answer: see
//! [`key`]) or, with `layers` naming `semantic`, a similar one (the semantic layer: the
//! prompt embedded and searched in a RediSearch vector index, see [`semantic`]) was answered
//! before. It runs in `access` after ai-proxy or ai-proxy-multi picked the instance (it
//! needs one: `fail_mode`); a miss is answered by the provider and, if it was a complete 200
//! (a stream only once its terminal event came, see [`stream`]) of at most
//! `max_cache_body_size` bytes, written to both layers in the background. Every failure of
//! Redis or of the embeddings API is a miss (fail-open). `X-AI-Cache-Status` (`HIT`, `MISS`,
//! `BYPASS`), `X-AI-Cache-Age` and `X-AI-Cache-Similarity` tell what happened
//! (`cache_headers`).

mod key;
mod semantic;
mod stream;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use ferrisix_plugin_api::{
    BodyChunk, BodyFilter, CheckCtx, CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef,
    PluginServices, ResponseHead, Step,
};
use ferrisix_router::VarSource;
use http::{header, HeaderName, HeaderValue, StatusCode};
use serde_json::{json, Value};

use crate::support::ai::protocol::Protocol;
use crate::support::ai::{AiRequest, PickedInstance};
use crate::support::redis::{self as redis_support, Remote};
use key::{KeyConf, ScopeFacts};
use semantic::{Document, Semantic};
use stream::Framing;

pub const NAME: &str = "ai-cache";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    encrypt_fields: &[
        "redis_password",
        "semantic.embedding.openai.api_key",
        "semantic.embedding.azure_openai.api_key",
    ],
    ..PluginDef::new(NAME, 1035, conf_schema, compile)
};

const STATUS_HEADER: HeaderName = HeaderName::from_static("x-ai-cache-status");
const AGE_HEADER: HeaderName = HeaderName::from_static("x-ai-cache-age");
const SIMILARITY_HEADER: HeaderName = HeaderName::from_static("x-ai-cache-similarity");

/// `ai-protocols/binding.lua`'s `fail_mode` property.
pub fn fail_mode_schema(default: &str) -> Value {
    json!({
        "type": "string",
        "enum": ["skip", "warn", "error"],
        "default": default,
        "description": "Behavior when the request protocol/format is not supported by this AI plugin (e.g. non-AI HTTP traffic on a Consumer-bound plugin, or a request that did not pass through ai-proxy). skip: pass the request through unchecked; warn: pass through and log a warning; error: reject the request."
    })
}

fn conf_schema() -> Value {
    let (redis, _, _) = redis_support::policy_schemas();
    let openai_like = |required: Value, model: bool| {
        let mut props = json!({
            "endpoint": {"type": "string"},
            "api_key": {"type": "string"},
            "dimensions": {"type": "integer", "minimum": 1},
            "ssl_verify": {"type": "boolean", "default": true},
            "timeout": {"type": "integer", "minimum": 1, "default": 5000}
        });
        if model {
            props["model"] = json!({"type": "string"});
        }
        json!({"type": "object", "properties": props, "required": required})
    };
    json!({
        "type": "object",
        "properties": {
            "exact": {
                "type": "object",
                "properties": {"ttl": {"type": "integer", "minimum": 1, "default": 3600}},
                "default": {}
            },
            "cache_key": {
                "type": "object",
                "properties": {
                    "share_across_routes": {"type": "boolean", "default": false},
                    "include_consumer": {"type": "boolean", "default": false},
                    "include_vars": {"type": "array", "items": {"type": "string"}, "default": []}
                },
                "default": {}
            },
            "max_cache_body_size": {"type": "integer", "minimum": 0, "default": 1048576},
            "cache_headers": {"type": "boolean", "default": true},
            "fail_mode": fail_mode_schema("skip"),
            "bypass_on": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {
                        "header": {"type": "string", "minLength": 1},
                        "equals": {"type": "string"}
                    },
                    "required": ["header", "equals"]
                }
            },
            "policy": {"type": "string", "enum": ["redis"], "default": "redis"},
            "layers": {
                "type": "array",
                "items": {"enum": ["exact", "semantic"]},
                "minItems": 1,
                "uniqueItems": true,
                "contains": {"const": "exact"},
                "default": ["exact"]
            },
            "semantic": {
                "type": "object",
                "properties": {
                    "similarity_threshold": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.95},
                    "top_k": {"type": "integer", "minimum": 1, "default": 1},
                    "distance_metric": {"enum": ["cosine"], "default": "cosine"},
                    "ttl": {"type": "integer", "minimum": 1, "default": 86400},
                    "match": {
                        "type": "object",
                        "properties": {
                            "message_countback": {"type": "integer", "minimum": 1, "default": 1},
                            "ignore_system_prompts": {"type": "boolean", "default": true},
                            "ignore_assistant_prompts": {"type": "boolean", "default": true},
                            "ignore_tool_prompts": {"type": "boolean", "default": true}
                        },
                        "default": {}
                    },
                    "embedding": {
                        "type": "object",
                        "properties": {
                            "openai": openai_like(json!(["model", "api_key"]), true),
                            "azure_openai": openai_like(json!(["endpoint", "api_key"]), false)
                        },
                        "oneOf": [{"required": ["openai"]}, {"required": ["azure_openai"]}]
                    },
                    "vector_search": {
                        "type": "object",
                        "properties": {
                            "redis": {
                                "type": "object",
                                "properties": {"index": {"type": "string", "default": "ai-cache"}},
                                "default": {}
                            }
                        },
                        "required": ["redis"]
                    }
                },
                "required": ["embedding", "vector_search"]
            }
        },
        "if": {"properties": {"policy": {"enum": ["redis"]}}},
        "then": redis,
        "allOf": [{
            "if": {"properties": {"layers": {"contains": {"const": "semantic"}}}, "required": ["layers"]},
            "then": {"required": ["semantic"]}
        }]
    })
}

fn has_layer(conf: &Value, name: &str) -> bool {
    match conf.get("layers").and_then(Value::as_array) {
        Some(l) => l.iter().any(|v| v == name),
        None => name == "exact",
    }
}

/// APISIX's `check_https` (a warning for a plain-http embeddings endpoint) and the warning
/// for a `semantic` block that `layers` does not enable.
fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    for p in ["openai", "azure_openai"] {
        let endpoint = cx
            .conf
            .pointer(&format!("/semantic/embedding/{p}/endpoint"))
            .and_then(Value::as_str);
        if endpoint.is_some_and(|e| !e.starts_with("https://")) {
            tracing::warn!(
                "Using {NAME} semantic.embedding.{p}.endpoint with no TLS is a security risk"
            );
        }
    }
    if cx.conf.get("semantic").is_some() && !has_layer(cx.conf, "semantic") {
        tracing::warn!(
            "ai-cache: 'semantic' is configured but not listed in 'layers'; the semantic (L2) cache is inactive"
        );
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FailMode {
    Skip,
    Warn,
    Error,
}

#[derive(Debug)]
struct AiCache {
    exact_ttl: u64,
    key: KeyConf,
    max_body: usize,
    cache_headers: bool,
    fail_mode: FailMode,
    bypass_on: Vec<(String, String)>,
    /// Only when `layers` names it.
    semantic: Option<Arc<Semantic>>,
    redis: Remote,
    services: Arc<PluginServices>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let obj = conf.as_object().ok_or("ai-cache conf is not an object")?;
    let redis = redis_support::policy_remote(NAME, obj, cx.services)?
        .ok_or("ai-cache needs a redis policy")?;
    let ck = conf.get("cache_key").cloned().unwrap_or(Value::Null);
    let semantic = match conf.get("semantic") {
        Some(s) if has_layer(&conf, "semantic") => Some(Arc::new(Semantic::from_conf(s)?)),
        _ => None,
    };
    Ok(Arc::new(AiCache {
        exact_ttl: conf
            .pointer("/exact/ttl")
            .and_then(Value::as_u64)
            .unwrap_or(3600),
        key: KeyConf {
            share_across_routes: ck
                .get("share_across_routes")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            include_consumer: ck
                .get("include_consumer")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            include_vars: ck
                .get("include_vars")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
        },
        max_body: conf
            .get("max_cache_body_size")
            .and_then(Value::as_u64)
            .map_or(1_048_576, |n| usize::try_from(n).unwrap_or(usize::MAX)),
        cache_headers: conf.get("cache_headers").and_then(Value::as_bool) != Some(false),
        fail_mode: match conf.get("fail_mode").and_then(Value::as_str) {
            Some("warn") => FailMode::Warn,
            Some("error") => FailMode::Error,
            _ => FailMode::Skip,
        },
        bypass_on: conf
            .get("bypass_on")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|r| {
                Some((
                    r.get("header")?.as_str()?.to_owned(),
                    r.get("equals")?.as_str()?.to_owned(),
                ))
            })
            .collect(),
        semantic,
        redis,
        services: cx.services.clone(),
    }))
}

/// `HIT`, `MISS` or `BYPASS` (`ctx.ai_cache_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheStatus {
    Hit,
    Miss,
    Bypass,
}

impl CacheStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Hit => "HIT",
            CacheStatus::Miss => "MISS",
            CacheStatus::Bypass => "BYPASS",
        }
    }
}

/// What ai-cache decided for the request, kept among its values (the log phase's metrics
/// read it: `ai_cache_status`, `ai_cache_hit_layer`, `ai_cache_embedding_latency`).
#[derive(Clone, Debug)]
pub struct AiCacheState {
    pub status: CacheStatus,
    /// `exact` or `semantic`, on a hit.
    pub hit_layer: Option<&'static str>,
    pub embedding_latency: Option<Duration>,
    /// What a miss is written back with.
    miss: Option<Arc<MissWrite>>,
}

impl AiCacheState {
    /// A decision with nothing to write back.
    pub fn decided(
        status: CacheStatus,
        hit_layer: Option<&'static str>,
        embedding_latency: Option<Duration>,
    ) -> AiCacheState {
        AiCacheState {
            status,
            hit_layer,
            embedding_latency,
            miss: None,
        }
    }
}

/// A miss's write-back: where, and what the semantic layer needs.
#[derive(Debug)]
struct MissWrite {
    key: String,
    fingerprint: String,
    /// The instance the key was computed for: a fallback's answer is not stored under it.
    picked: String,
    protocol: Protocol,
    stream: bool,
    /// The embedding and partition, when the prompt was embedded.
    l2: Option<(Vec<f32>, String)>,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn envelope(body: &[u8], created_at: u64, format: &str) -> String {
    json!({
        "body": String::from_utf8_lossy(body),
        "created_at": created_at,
        "format": format
    })
    .to_string()
}

/// A stored entry.
struct Entry {
    body: Bytes,
    created_at: Option<u64>,
    format: Option<String>,
}

impl AiCache {
    fn bypass(ctx: &mut PluginCtx<'_>) -> Flow {
        ctx.insert(AiCacheState {
            status: CacheStatus::Bypass,
            hit_layer: None,
            embedding_latency: None,
            miss: None,
        });
        Flow::Continue
    }

    fn serve_hit(&self, ctx: &mut PluginCtx<'_>, entry: Entry, similarity: Option<f64>) -> Flow {
        let layer = if similarity.is_some() {
            "semantic"
        } else {
            "exact"
        };
        let mut exit = Exit::body(StatusCode::OK, entry.body);
        if self.cache_headers {
            let now = now_secs();
            let age = now.saturating_sub(entry.created_at.unwrap_or(now));
            exit = exit
                .with_header(STATUS_HEADER, HeaderValue::from_static("HIT"))
                .with_header(AGE_HEADER, HeaderValue::from(age));
            if let Some(s) = similarity {
                if let Ok(v) = HeaderValue::from_str(&format!("{s:.4}")) {
                    exit = exit.with_header(SIMILARITY_HEADER, v);
                }
            }
        }
        let ct = if entry.format.as_deref() == Some(stream::FORMAT_SSE) {
            "text/event-stream"
        } else {
            "application/json"
        };
        exit = exit.with_header(header::CONTENT_TYPE, HeaderValue::from_static(ct));
        ctx.insert(AiCacheState {
            status: CacheStatus::Hit,
            hit_layer: Some(layer),
            embedding_latency: ctx.get::<AiCacheState>().and_then(|s| s.embedding_latency),
            miss: None,
        });
        Flow::Exit(exit)
    }

    async fn exact_lookup(&self, key: &str) -> Result<Option<Entry>, String> {
        let mut get = redis::cmd("GET");
        get.arg(key);
        let raw: Option<Vec<u8>> = self.redis.query(&get).await.map_err(String::from)?;
        let Some(raw) = raw else {
            return Ok(None);
        };
        let entry: Option<Value> = serde_json::from_slice(&raw).ok();
        match entry
            .as_ref()
            .and_then(|e| Some((e, e.get("body")?.as_str()?)))
        {
            Some((e, body)) => Ok(Some(Entry {
                body: Bytes::from(body.to_owned()),
                created_at: e
                    .get("created_at")
                    .and_then(Value::as_f64)
                    .map(|c| c as u64),
                format: e.get("format").and_then(Value::as_str).map(str::to_owned),
            })),
            None => {
                tracing::warn!("ai-cache: discarding malformed cache entry for {key}");
                Ok(None)
            }
        }
    }

    async fn access_async(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let picked = ctx.get::<PickedInstance>().cloned();
        let (Some(PickedInstance(picked, identity)), Some(req)) = (picked, ctx.get::<AiRequest>())
        else {
            let reason =
                "no ai instance picked (request did not pass through ai-proxy/ai-proxy-multi)";
            match self.fail_mode {
                FailMode::Error => {
                    return Flow::Exit(Exit::body(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "ai-cache must be used with the ai-proxy or ai-proxy-multi plugin",
                    ))
                }
                FailMode::Warn => tracing::warn!("{NAME} skipped: {reason}"),
                FailMode::Skip => tracing::info!("{NAME} skipped: {reason}"),
            }
            return Self::bypass(ctx);
        };
        // A Bedrock stream (an AWS event stream) is never stored, so it is not looked up.
        if req.stream && identity.get("provider").and_then(Value::as_str) == Some("bedrock") {
            return Self::bypass(ctx);
        }
        if self
            .bypass_on
            .iter()
            .any(|(h, v)| ctx.header(h) == Some(v.as_str()))
        {
            return Self::bypass(ctx);
        }
        let protocol = req.protocol;
        let stream = req.stream;
        let fingerprint = key::fingerprint(protocol, &req.body, &identity);
        let vars = self
            .key
            .include_vars
            .iter()
            .map(|n| ctx.var(n).map(|v| v.into_owned()))
            .collect();
        let consumer = ctx.consumer().map(|c| c.username.clone());
        let scope = key::scope(
            &self.key,
            &ScopeFacts {
                route_id: ctx.route().map(|r| &*r.id),
                consumer: consumer.as_deref(),
                vars,
            },
        );
        let cache_key = key::build(&scope, &fingerprint);
        // What the semantic layer needs, while the body is at hand.
        let semantic_input = self.semantic.as_ref().and_then(|s| {
            if !semantic::protocol_supported(protocol) || semantic::has_nontext(&req.body) {
                return None;
            }
            let messages = key::messages(protocol, &req.body);
            let text = semantic::embed_text(&messages, &s.matching);
            if text.is_empty() {
                return None;
            }
            let context = semantic::context_messages(&messages, &s.matching);
            let partition = key::partition(
                &scope,
                protocol,
                &req.body,
                &identity,
                (!context.is_empty()).then_some(context.as_slice()),
            );
            Some((text, partition))
        });

        let mut state = AiCacheState {
            status: CacheStatus::Miss,
            hit_layer: None,
            embedding_latency: None,
            miss: None,
        };
        let mut l2 = None;
        match self.exact_lookup(&cache_key).await {
            Err(e) => {
                tracing::warn!("ai-cache: L1 lookup failed, fail-open as MISS: {e}");
                ctx.insert(state);
                return Flow::Continue;
            }
            Ok(Some(entry)) => return self.serve_hit(ctx, entry, None),
            Ok(None) => {}
        }
        if let (Some(sem), Some((text, partition))) = (&self.semantic, semantic_input) {
            let started = Instant::now();
            let embedded = sem.embed(&self.services, &text).await;
            state.embedding_latency = Some(started.elapsed());
            match embedded {
                Err(e) => tracing::warn!("ai-cache: embedding failed, fail-open as MISS: {e}"),
                Ok(vec) => {
                    match self
                        .semantic_lookup(sem, &cache_key, &partition, &vec)
                        .await
                    {
                        Some((entry, similarity)) => {
                            ctx.insert(state);
                            return self.serve_hit(ctx, entry, Some(similarity));
                        }
                        None => l2 = Some((vec, partition)),
                    }
                }
            }
        }
        state.miss = Some(Arc::new(MissWrite {
            key: cache_key,
            fingerprint,
            picked,
            protocol,
            stream,
            l2,
        }));
        ctx.insert(state);
        Flow::Continue
    }

    /// The semantic layer's answer for `vec` above the threshold, written back to the
    /// exact layer under `cache_key`.
    async fn semantic_lookup(
        &self,
        sem: &Semantic,
        cache_key: &str,
        partition: &str,
        vec: &[f32],
    ) -> Option<(Entry, f64)> {
        if let Err(e) = sem.ensure_index(&self.redis, vec.len()).await {
            tracing::warn!("ai-cache: ensure_index failed, fail-open as MISS: {e}");
            return None;
        }
        let hit = match sem.knn_search(&self.redis, partition, vec).await {
            Ok(h) => h?,
            Err(e) => {
                tracing::warn!("ai-cache: knn search failed, fail-open as MISS: {e}");
                return None;
            }
        };
        let similarity = 1.0 - hit.distance;
        if similarity < sem.threshold {
            return None;
        }
        let format = hit.format.clone().unwrap_or_default();
        let created = hit.created_at.unwrap_or_else(now_secs);
        let mut set = redis::cmd("SET");
        set.arg(cache_key)
            .arg(envelope(&hit.response, created, &format))
            .arg("EX")
            .arg(self.exact_ttl);
        if let Err(e) = self.redis.query::<redis::Value>(&set).await {
            tracing::warn!("ai-cache: L1 backfill SET failed: {e}");
        }
        Some((
            Entry {
                body: hit.response,
                created_at: hit.created_at,
                format: hit.format,
            },
            similarity,
        ))
    }
}

/// Keeps a missed answer as it goes by and, once it ended complete, stores it.
struct Capture {
    buf: BytesMut,
    oversized: bool,
    max: usize,
    framing: Framing,
    miss: Arc<MissWrite>,
    store: Arc<Store>,
}

/// What a write-back needs from the plugin instance.
#[derive(Debug)]
struct Store {
    redis: Remote,
    exact_ttl: u64,
    semantic: Option<Arc<Semantic>>,
}

impl BodyFilter for Capture {
    fn filter(&mut self, chunk: &mut BodyChunk) {
        if !self.oversized && !chunk.data.is_empty() {
            self.buf.extend_from_slice(&chunk.data);
            if self.buf.len() > self.max {
                self.oversized = true;
                self.buf = BytesMut::new();
            }
        }
        if !chunk.end || self.oversized || self.buf.is_empty() {
            return;
        }
        let body = std::mem::take(&mut self.buf).freeze();
        let Some(format) = stream::capture_format(self.framing, self.miss.protocol, &body) else {
            return;
        };
        let (miss, store) = (self.miss.clone(), self.store.clone());
        let spawned = store.redis.clone().spawn(async move {
            if let Err(e) = store.write(&miss, &body, format).await {
                tracing::warn!("ai-cache: cache write failed: {e}");
            }
        });
        if let Err(e) = spawned {
            tracing::warn!("ai-cache: failed to schedule cache write: {e}");
        }
    }
}

impl Store {
    async fn write(&self, miss: &MissWrite, body: &Bytes, format: &str) -> Result<(), String> {
        let now = now_secs();
        let mut set = redis::cmd("SET");
        set.arg(&miss.key)
            .arg(envelope(body, now, format))
            .arg("EX")
            .arg(self.exact_ttl);
        self.redis
            .query::<redis::Value>(&set)
            .await
            .map_err(String::from)?;
        if let (Some(sem), Some((vec, partition))) = (&self.semantic, &miss.l2) {
            let doc = Document {
                partition,
                fingerprint: &miss.fingerprint,
                embedding: vec,
                created_at: now,
                format,
            };
            if let Err(e) = sem.write(&self.redis, &doc, body).await {
                tracing::warn!("ai-cache: L2 upsert failed: {e}");
            }
        }
        Ok(())
    }
}

impl Plugin for AiCache {
    fn phases(&self) -> Phases {
        Phases::ACCESS | Phases::HEADER_FILTER
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.access_async(ctx)))
    }

    fn header_filter(&self, ctx: &mut PluginCtx<'_>, resp: &mut ResponseHead<'_>) {
        let Some(state) = ctx.get::<AiCacheState>() else {
            return;
        };
        if self.cache_headers {
            resp.headers_mut().insert(
                STATUS_HEADER,
                HeaderValue::from_static(state.status.as_str()),
            );
        }
        let Some(miss) = state.miss.clone() else {
            return;
        };
        // Only a 200 of the instance the key was made for is stored.
        if resp.status() != StatusCode::OK
            || ctx.get::<PickedInstance>().map(|p| p.0.as_str()) != Some(miss.picked.as_str())
        {
            return;
        }
        let ct = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        let framing = Framing::of(ct, miss.stream);
        if framing == Framing::Other {
            return;
        }
        resp.add_body_filter(Box::new(Capture {
            buf: BytesMut::new(),
            oversized: false,
            max: self.max_body,
            framing,
            miss,
            store: Arc::new(Store {
                redis: self.redis.clone(),
                exact_ttl: self.exact_ttl,
                semantic: self.semantic.clone(),
            }),
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_as_apisix() {
        let schema = conf_schema();
        let ok = |c: Value| ferrisix_config::schema::validate(&schema, &c).err();
        assert_eq!(ok(json!({"redis_host": "127.0.0.1"})), None);
        assert_eq!(ok(json!({})).as_deref(), Some("then clause did not match"));
        assert!(ok(json!({"redis_host": "127.0.0.1", "layers": ["semantic"]})).is_some());
        assert!(ok(json!({"redis_host": "127.0.0.1", "layers": ["exact", "exact"]})).is_some());
        // semantic in layers needs the block.
        assert!(ok(json!({"redis_host": "127.0.0.1", "layers": ["exact", "semantic"]})).is_some());
        let sem = json!({"embedding": {"openai": {"model": "m", "api_key": "k"}},
            "vector_search": {"redis": {}}});
        assert_eq!(
            ok(
                json!({"redis_host": "127.0.0.1", "layers": ["exact", "semantic"], "semantic": sem})
            ),
            None
        );
        let both = json!({"embedding": {"openai": {"model": "m", "api_key": "k"},
            "azure_openai": {"endpoint": "http://e", "api_key": "k"}},
            "vector_search": {"redis": {}}});
        assert!(ok(json!({"redis_host": "127.0.0.1", "semantic": both})).is_some());
        assert!(ok(json!({"redis_host": "127.0.0.1", "fail_mode": "loud"})).is_some());
        assert!(ok(json!({"redis_host": "127.0.0.1", "bypass_on": []})).is_some());
        assert!(ok(json!({"redis_host": "127.0.0.1", "exact": {"ttl": 0}})).is_some());
        assert!(ok(json!({"redis_host": "127.0.0.1", "policy": "redis-cluster"})).is_some());
    }
}
