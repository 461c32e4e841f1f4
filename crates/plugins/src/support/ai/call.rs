//! One call to a provider, as APISIX's `ai-proxy/base.lua` `before_proxy` and
//! `ai-transport/http.lua` make it: the client's protocol routed to what the provider
//! speaks (natively, through the Anthropic converter, or passed through), the body shaped
//! (`options`, `override.llm_options`, `override.request_body`), the request built (endpoint,
//! auth headers and query, the client's headers), sent within `timeout`, and the answer
//! relayed: an error as the provider sent it, a stream event by event as it arrives (its
//! usage and text read on the way), a complete answer read, measured and, for a converted
//! request, converted back.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use ferrisix_plugin_api::{BodyError, Exit, HttpError, PluginCtx, PluginServices};
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use serde_json::{json, Map, Value};

use super::guard::{self, Answer, Chunk, ChunkOut, DenyShape, ResponseGuards, StreamGuard};
use super::protocol::{
    anthropic_to_openai_request, openai_to_anthropic_response, stream_facts, AnthropicStream,
    Protocol, SseParser, Usage,
};
use super::provider::{Provider, ProviderConf};
use super::{AiRequest, LlmRecord};
use crate::observe::prometheus::llm::{model_label, ActiveConnection, ActiveConnections};
use crate::support::cloud::gcp_token::{Account, Token};
use crate::support::cloud::sigv4::{self, Credentials};

/// `override.endpoint` taken apart as APISIX's `url.parse` does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub scheme: String,
    pub host: String,
    pub port: u16,
    /// `None` for scheme and host only: the provider's path is used.
    pub path: Option<String>,
    pub query: Vec<(String, String)>,
}

impl Endpoint {
    pub fn parse(text: &str) -> Option<Endpoint> {
        let (scheme, rest) = text.split_once("://")?;
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "http" && scheme != "https" {
            return None;
        }
        let (authority, tail) = match rest.find(['/', '?']) {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
                (h.to_owned(), p.parse::<u16>().ok()?)
            }
            _ => (
                authority.to_owned(),
                if scheme == "https" { 443 } else { 80 },
            ),
        };
        if host.is_empty() {
            return None;
        }
        let (path, query) = match tail.split_once('?') {
            Some((p, q)) => (p, q),
            None => (tail, ""),
        };
        Some(Endpoint {
            scheme,
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port,
            path: (!path.is_empty()).then(|| path.to_owned()),
            query: decode_args(query),
        })
    }
}

/// `a=1&b=2` as (name, value) pairs, percent-decoded.
pub fn decode_args(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (unescape(k), unescape(v)),
            None => (unescape(p), String::new()),
        })
        .collect()
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16)
                {
                    Ok(v) => {
                        out.push(v);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `ngx.escape_uri`: everything but the unreserved characters percent-encoded.
pub fn escape_uri(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One AI instance: ai-proxy's conf, or one of ai-proxy-multi's `instances`.
#[derive(Clone, Debug)]
pub struct Instance {
    pub name: String,
    pub provider: Provider,
    pub provider_conf: ProviderConf,
    /// `auth.header`, names lower-cased.
    pub auth_header: Vec<(HeaderName, HeaderValue)>,
    pub auth_query: Vec<(String, String)>,
    pub options: Map<String, Value>,
    pub endpoint: Option<Endpoint>,
    /// `override.llm_options.max_tokens`.
    pub max_tokens: Option<Value>,
    /// `override.request_body`: target protocol name -> patch.
    pub request_body: Map<String, Value>,
    pub force_override: bool,
    /// `auth.gcp`: an access token of the service account goes as `Authorization`.
    pub gcp: Option<Arc<GcpAuth>>,
    /// `auth.aws`: the request is signed with SigV4 (bedrock only, as APISIX's
    /// `aws_sigv4` providers); the region is `provider_conf.region`.
    pub aws: Option<Credentials>,
    pub priority: i64,
    pub weight: u32,
    /// What decides the instance's answers besides the request, as ai-cache's key
    /// (`ai-cache/key.lua`) folds it in: `provider`, `options`, and `override`'s
    /// `llm_options`, `request_body`, `request_body_force_override` and `endpoint`.
    pub identity: Arc<Value>,
}

impl Instance {
    /// From a conf that passed the schema (ai-proxy's or an instance of ai-proxy-multi's).
    pub fn from_conf(conf: &Value, name: String) -> Result<Instance, String> {
        let provider_name = conf.get("provider").and_then(Value::as_str).unwrap_or("");
        let provider = Provider::parse(provider_name)
            .ok_or_else(|| format!("ai provider: {provider_name} is not supported."))?;
        let auth = conf.get("auth");
        let pairs = |key: &str| -> Vec<(String, String)> {
            auth.and_then(|a| a.get(key))
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        };
        let auth_header = pairs("header")
            .into_iter()
            .map(|(k, v)| {
                let name = HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes())
                    .map_err(|_| format!("invalid auth header name {k}"))?;
                let value =
                    HeaderValue::from_str(&v).map_err(|_| format!("invalid auth header {k}"))?;
                Ok((name, value))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let over = conf.get("override");
        let endpoint = match over.and_then(|o| o.get("endpoint")).and_then(Value::as_str) {
            Some(e) => Some(Endpoint::parse(e).ok_or("invalid endpoint")?),
            None => None,
        };
        let field = |k: &str| over.and_then(|o| o.get(k)).cloned();
        let mut identity = Map::new();
        identity.insert("provider".into(), Value::String(provider_name.to_owned()));
        for (k, v) in [
            ("options", conf.get("options").cloned()),
            ("llm_options", field("llm_options")),
            ("request_body", field("request_body")),
            (
                "request_body_force_override",
                field("request_body_force_override"),
            ),
            ("endpoint", field("endpoint")),
        ] {
            if let Some(v) = v {
                identity.insert(k.into(), v);
            }
        }
        let provider_conf = ProviderConf::from_conf(conf.get("provider_conf"));
        let gcp = auth
            .and_then(|a| a.get("gcp"))
            .map(|g| Arc::new(GcpAuth::from_conf(g)));
        let aws = auth
            .and_then(|a| a.get("aws"))
            .filter(|_| provider == Provider::Bedrock)
            .map(|a| {
                let text = |k: &str| a.get(k).and_then(Value::as_str).map(str::to_owned);
                Credentials {
                    access_key: text("access_key_id").unwrap_or_default(),
                    secret_key: text("secret_access_key").unwrap_or_default(),
                    session_token: text("session_token"),
                    region: provider_conf.region.clone().unwrap_or_default(),
                    service: "bedrock".into(),
                }
            });
        Ok(Instance {
            identity: Arc::new(Value::Object(identity)),
            name,
            provider,
            provider_conf,
            gcp,
            aws,
            auth_header,
            auth_query: pairs("query"),
            options: conf
                .get("options")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
            endpoint,
            max_tokens: over
                .and_then(|o| o.get("llm_options"))
                .and_then(|l| l.get("max_tokens"))
                .cloned(),
            request_body: over
                .and_then(|o| o.get("request_body"))
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
            force_override: over
                .and_then(|o| o.get("request_body_force_override"))
                .and_then(Value::as_bool)
                .unwrap_or(false),
            priority: conf.get("priority").and_then(Value::as_i64).unwrap_or(0),
            weight: conf
                .get("weight")
                .and_then(Value::as_u64)
                .map_or(1, |w| u32::try_from(w).unwrap_or(u32::MAX)),
        })
    }
}

/// The environment variable holding a service account's JSON when the conf has none
/// (APISIX reads the same).
const GCP_SERVICE_ACCOUNT_ENV: &str = "GCP_SERVICE_ACCOUNT";

/// `auth.gcp` (`ai-transport/auth.lua`): the service account (`service_account_json`, else
/// `$GCP_SERVICE_ACCOUNT`), exchanged for an access token (an RS256 JWT at its `token_uri`,
/// `support::cloud::gcp_token`) kept for the token's `expires_in` (3600 without one) less
/// `expire_early_secs` (default 60), at most `max_ttl`.
pub struct GcpAuth {
    /// The account, or why there is none usable.
    account: Result<Account, String>,
    expire_early: u64,
    max_ttl: Option<u64>,
    /// The token and the second it is kept until; swapped whole, read without a lock.
    token: ArcSwapOption<(String, u64)>,
}

impl std::fmt::Debug for GcpAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key nor the token.
        f.debug_struct("GcpAuth")
            .field("expire_early", &self.expire_early)
            .field("max_ttl", &self.max_ttl)
            .finish_non_exhaustive()
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl GcpAuth {
    pub fn from_conf(conf: &Value) -> GcpAuth {
        let sa = conf
            .get("service_account_json")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| std::env::var(GCP_SERVICE_ACCOUNT_ENV).ok());
        let account = match sa.filter(|s| !s.is_empty()) {
            // APISIX then asks google-cloud-oauth with no account, which cannot sign.
            None => Err("failed to get google oauth token".to_owned()),
            Some(sa) => serde_json::from_str::<Value>(&sa)
                .map(|v| Account::from_auth(&v))
                .map_err(|e| format!("invalid gcp service account json: {e}")),
        };
        GcpAuth {
            account,
            expire_early: conf
                .get("expire_early_secs")
                .and_then(Value::as_u64)
                .unwrap_or(60),
            max_ttl: conf.get("max_ttl").and_then(Value::as_u64),
            token: ArcSwapOption::empty(),
        }
    }

    /// The access token: the kept one, else a new one from the token URI.
    async fn token(&self, services: &PluginServices, conf: &CallConf) -> Result<String, String> {
        let now = now_secs();
        if let Some(t) = self.token.load_full() {
            if now < t.1 {
                return Ok(t.0.clone());
            }
        }
        let account = self.account.as_ref().map_err(Clone::clone)?;
        let failed = |why: String| {
            tracing::error!("failed to get google oauth token: {why}");
            "failed to get google oauth token".to_owned()
        };
        let body = account.exchange_body(now).map_err(failed)?;
        let req = Request::builder()
            .method(Method::POST)
            .uri(&account.token_uri)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Bytes::from(body))
            .map_err(|e| failed(e.to_string()))?;
        let resp = services
            .http()
            .send_verified(req, conf.timeout, conf.ssl_verify)
            .await
            .map_err(|e| failed(e.to_string()))?;
        if resp.status() != StatusCode::OK {
            return Err(failed(format!(
                "{}: {}",
                resp.status(),
                String::from_utf8_lossy(resp.body())
            )));
        }
        let token = Token::from_answer(resp.body(), now).map_err(failed)?;
        let mut ttl = match token.expires_at.saturating_sub(now) {
            0 => 3600,
            t => t,
        };
        if ttl > self.expire_early {
            ttl -= self.expire_early;
        }
        if let Some(max) = self.max_ttl {
            ttl = ttl.min(max);
        }
        self.token
            .store(Some(Arc::new((token.value.clone(), now + ttl))));
        Ok(token.value)
    }
}

/// `normalize_and_encode_path` of APISIX's SigV4 helper: each segment between slashes
/// decoded, then encoded `times` times (once for the wire, twice for the canonical URI).
fn encode_path(path: &str, times: usize) -> String {
    path.split('/')
        .map(|seg| {
            if seg.is_empty() {
                return String::new();
            }
            let mut s = unescape(seg);
            for _ in 0..times {
                s = escape_uri(&s);
            }
            s
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Signs `req` for Bedrock (`ai-transport/auth-aws.lua`): its path sent once-encoded, the
/// canonical URI twice-encoded, and only `Host`, `X-Amz-Date` and `X-Amz-Security-Token`
/// signed (APISIX signs with no other header), with the body's hash.
fn sign_aws(req: &mut Request<Bytes>, creds: &Credentials) -> Result<(), String> {
    if creds.region.is_empty() {
        return Err(
            "missing region for AWS SigV4 signing (provider_conf.region required for bedrock)"
                .into(),
        );
    }
    let uri = req.uri().clone();
    let authority = uri
        .authority()
        .map(|a| a.as_str().to_owned())
        .ok_or("failed to sign AWS request: no host")?;
    let wire = encode_path(uri.path(), 1);
    let canonical = encode_path(uri.path(), 2);
    let query = uri.query().map(str::to_owned);
    let mut signed = HeaderMap::new();
    let host = HeaderValue::from_str(&authority).map_err(|e| e.to_string())?;
    signed.insert(header::HOST, host.clone());
    let method = req.method().clone();
    sigv4::sign(
        &mut sigv4::Request {
            method: &method,
            path: &canonical,
            query: query.as_deref(),
            headers: &mut signed,
            body: req.body(),
        },
        creds,
        now_secs(),
    );
    if wire != uri.path() {
        let mut text = format!(
            "{}://{authority}{wire}",
            uri.scheme_str().unwrap_or("https")
        );
        if let Some(q) = &query {
            text.push('?');
            text.push_str(q);
        }
        *req.uri_mut() = text
            .parse()
            .map_err(|e: http::uri::InvalidUri| e.to_string())?;
    }
    let headers = req.headers_mut();
    headers.insert(header::HOST, host);
    for (name, value) in signed {
        if let Some(name) = name {
            headers.insert(name, value);
        }
    }
    Ok(())
}

/// `auth.gcp`'s token and `auth.aws`'s signature put on the built request (in APISIX's
/// order: the token among the headers, the signature last, over the final body); a failure
/// is APISIX's 500 with `error_msg`.
async fn authorize(
    req: &mut Request<Bytes>,
    inst: &Instance,
    services: &PluginServices,
    conf: &CallConf,
) -> Result<(), Exit> {
    if let Some(gcp) = &inst.gcp {
        let token = gcp.token(services, conf).await.map_err(|e| {
            json_exit(
                500,
                &json!({"error_msg": format!("failed to get gcp access token: {e}")}),
            )
        })?;
        let value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
            json_exit(
                500,
                &json!({"error_msg": "failed to get gcp access token: invalid token"}),
            )
        })?;
        req.headers_mut().insert(header::AUTHORIZATION, value);
    }
    if let Some(creds) = &inst.aws {
        sign_aws(req, creds).map_err(|e| {
            let msg = if e.starts_with("missing region") {
                e
            } else {
                format!("failed to sign AWS request: {e}")
            };
            tracing::error!("failed to build request: {msg}");
            json_exit(500, &json!({ "error_msg": msg }))
        })?;
    }
    Ok(())
}

/// What a call is bounded by.
#[derive(Clone, Debug)]
pub struct CallConf {
    pub timeout: Duration,
    pub ssl_verify: bool,
    /// `fallback_http_statuses`: answers read as errors besides 429 and 5xx.
    pub fallback_statuses: Vec<u16>,
    /// The gateway's `llm_active_connections`, counted per call (ai-proxy and
    /// ai-proxy-multi).
    pub active: Option<Arc<ActiveConnections>>,
    /// `max_response_bytes`: the most read from the provider for one answer, whole or
    /// streamed (unset: no cap).
    pub max_response_bytes: Option<u64>,
    /// `max_stream_duration_ms`: how long a stream may go on from the call's start, checked
    /// as each chunk arrives (unset: no cap).
    pub max_stream_duration: Option<Duration>,
}

impl CallConf {
    pub fn from_conf(conf: &Value) -> CallConf {
        CallConf {
            timeout: Duration::from_millis(
                conf.get("timeout")
                    .and_then(Value::as_u64)
                    .unwrap_or(30_000),
            ),
            ssl_verify: conf.get("ssl_verify").and_then(Value::as_bool) != Some(false),
            fallback_statuses: conf
                .get("fallback_http_statuses")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_u64().and_then(|s| u16::try_from(s).ok()))
                .collect(),
            active: None,
            max_response_bytes: conf.get("max_response_bytes").and_then(Value::as_u64),
            max_stream_duration: conf
                .get("max_stream_duration_ms")
                .and_then(Value::as_u64)
                .map(Duration::from_millis),
        }
    }

    /// Counts this plugin's calls in the gateway's `llm_active_connections`.
    pub fn with_active_connections(mut self, services: &PluginServices) -> CallConf {
        let metrics = services.shared::<crate::observe::prometheus::Metrics>();
        self.active = Some(metrics.llm_active());
        self
    }
}

/// Counts a call to `inst` in: exporter.lua's `inc_llm_active_connections` labels as they
/// are when the call goes (the route's name and id, the matched uri and host, the service's
/// name and id, the consumer, the instance as `node`, the AI labels) and the extra labels'
/// variables.
fn track_active(
    active: &ActiveConnections,
    ctx: &PluginCtx<'_>,
    inst: &Instance,
    record: &LlmRecord,
) -> ActiveConnection {
    let (request_type, request_model, model) = record.read(|f| {
        (
            f.request_type(),
            model_label(f.request_model.as_deref()),
            model_label(f.model.as_deref()),
        )
    });
    let route = ctx.route();
    let service_id = route.and_then(|r| r.service_id.as_deref()).unwrap_or("");
    let service_name = route
        .and_then(|r| r.service_name.as_deref())
        .filter(|_| !service_id.is_empty())
        .unwrap_or("");
    let consumer = ctx
        .consumer()
        .map(|c| c.username.clone())
        .unwrap_or_default();
    let extra = active
        .vars()
        .iter()
        .map(|v| {
            ferrisix_router::VarSource::var(ctx, v)
                .map(|v| v.into_owned())
                .unwrap_or_default()
        })
        .collect();
    active.track(
        [
            route.and_then(|r| r.name.as_deref()).unwrap_or(""),
            route.map_or("", |r| &*r.id),
            ctx.matched_uri(),
            ctx.matched_host(),
            service_name,
            service_id,
            &consumer,
            &inst.name,
            request_type,
            &request_model,
            &model,
        ],
        extra,
    )
}

/// `override.request_body` merged into the body: objects recursively, anything else
/// replaced; with `force` the patch wins, else the client's fields do.
pub fn deep_merge(body: &mut Value, patch: &Value, force: bool) {
    match (body, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                match b.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => {
                        deep_merge(existing, v, force)
                    }
                    Some(existing) => {
                        if force {
                            *existing = v.clone();
                        }
                    }
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, p) => {
            if force {
                *b = p.clone();
            }
        }
    }
}

/// Client headers never forwarded: the body is the gateway's own, and the connection too.
const DROPPED: [&str; 11] = [
    "host",
    "content-length",
    "accept-encoding",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
    "expect",
];

/// The request for `inst`, and what its answer needs.
struct Outgoing {
    request: Request<Bytes>,
    target: Protocol,
    converted: bool,
}

fn text_exit(status: u16, text: &str) -> Exit {
    Exit::body(
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        text.to_owned(),
    )
}

/// `{"error_msg": msg}` as APISIX's JSON answer.
fn json_exit(status: u16, body: &Value) -> Exit {
    Exit::body(
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        body.to_string(),
    )
    .with_header(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    )
}

fn build(
    ctx: &PluginCtx<'_>,
    inst: &Instance,
    req: &AiRequest,
    record: &LlmRecord,
) -> Result<Outgoing, Exit> {
    let caps = inst.provider.capabilities();
    let (target, converted, passthrough_path) = if caps.contains(&req.protocol) {
        (req.protocol, false, None)
    } else if req.protocol == Protocol::Passthrough {
        (Protocol::Passthrough, false, Some(ctx.uri().to_owned()))
    } else if req.protocol == Protocol::AnthropicMessages && caps.contains(&Protocol::OpenAiChat) {
        (Protocol::OpenAiChat, true, None)
    } else {
        let names: Vec<&str> = caps.iter().map(|p| p.name()).collect();
        return Err(text_exit(
            400,
            &format!(
                "provider {} does not support {} protocol (supported: {})",
                inst.provider.name(),
                req.protocol.name(),
                names.join(", ")
            ),
        ));
    };
    let model = inst
        .options
        .get("model")
        .and_then(Value::as_str)
        .or_else(|| req.body.get("model").and_then(Value::as_str))
        .map(str::to_owned);
    let mut body = if converted {
        anthropic_to_openai_request(&req.body)
            .map_err(|e| json_exit(400, &json!({"error_msg": e})))?
    } else {
        req.body.clone()
    };
    if let Some(obj) = body.as_object_mut() {
        target.prepare_outgoing(obj);
        for (k, v) in &inst.options {
            obj.insert(k.clone(), v.clone());
        }
        if let Some(max) = &inst.max_tokens {
            inst.provider.set_max_tokens(target, obj, max);
        }
    }
    if let Some(patch) = inst.request_body.get(target.name()) {
        deep_merge(&mut body, patch, inst.force_override);
    }
    let passthrough = target == Protocol::Passthrough;
    let mut client_args = Vec::new();
    if passthrough {
        for (k, v) in decode_args(ctx.query().unwrap_or("")) {
            if !inst.auth_query.iter().any(|(n, _)| *n == k) {
                client_args.push((k, v));
            }
        }
    }
    let uri = request_uri(
        inst,
        target,
        passthrough_path,
        model.as_deref(),
        req.stream,
        client_args,
    )?;
    let method = if passthrough {
        ctx.method().clone()
    } else {
        Method::POST
    };
    let mut headers = HeaderMap::new();
    for (name, value) in ctx.headers() {
        if !DROPPED.contains(&name.as_str()) {
            headers.append(name.clone(), value.clone());
        }
    }
    for (name, value) in &inst.auth_header {
        headers.insert(name.clone(), value.clone());
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    record.update(|f| {
        f.model = model.clone();
        f.stream = req.stream;
        f.tool_count = body
            .get("tools")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        f.end_user_id = body.get("user").and_then(Value::as_str).map(str::to_owned);
        f.request_messages = req.protocol.request_content(&req.body);
    });
    let bytes = serde_json::to_vec(&body).unwrap_or_default();
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .body(Bytes::from(bytes))
        .map_err(|e| json_exit(500, &json!({"error_msg": e.to_string()})))?;
    *request.headers_mut() = headers;
    Ok(Outgoing {
        request,
        target,
        converted,
    })
}

/// The provider's URL for `target`: `override.endpoint`'s scheme, host and port (else the
/// provider's own over https), its path (else `path`, else the provider's path of `target`),
/// and the query of `auth.query`, the endpoint and `extra` (a passthrough's client query).
fn request_uri(
    inst: &Instance,
    target: Protocol,
    path: Option<String>,
    model: Option<&str>,
    stream: bool,
    extra: Vec<(String, String)>,
) -> Result<String, Exit> {
    let (scheme, host, port, endpoint_path, mut query) = match &inst.endpoint {
        Some(e) => (
            e.scheme.as_str(),
            e.host.clone(),
            e.port,
            e.path.clone(),
            e.query.clone(),
        ),
        None => {
            let host = inst.provider.host(&inst.provider_conf).ok_or_else(|| {
                json_exit(
                    500,
                    &json!({"error_msg": format!("no host for provider {}", inst.provider.name())}),
                )
            })?;
            ("https", host, 443, None, Vec::new())
        }
    };
    for (k, v) in inst.auth_query.iter().rev() {
        query.retain(|(n, _)| n != k);
        query.insert(0, (k.clone(), v.clone()));
    }
    query.extend(extra);
    let path = endpoint_path
        .or(path)
        .or_else(|| inst.provider.path(target, &inst.provider_conf, model, stream))
        .ok_or_else(|| {
            json_exit(
                400,
                &json!({"error_msg": "could not resolve upstream path: ensure the route or request body specifies a model, or that override.endpoint includes a path"}),
            )
        })?;
    let mut uri = format!("{scheme}://");
    if host.contains(':') {
        uri.push_str(&format!("[{host}]:{port}"));
    } else {
        uri.push_str(&format!("{host}:{port}"));
    }
    uri.push_str(&path);
    if !query.is_empty() {
        let q: Vec<String> = query
            .iter()
            .map(|(k, v)| format!("{}={}", escape_uri(k), escape_uri(v)))
            .collect();
        uri.push('?');
        uri.push_str(&q.join("&"));
    }
    Ok(uri)
}

/// A chat of the gateway's own (ai-request-rewrite's): `body` (an OpenAI chat, `options`
/// merged) to the provider's chat path with only the instance's auth, the answer's text.
pub async fn simple_chat(
    services: &PluginServices,
    inst: &Instance,
    conf: &CallConf,
    mut body: Value,
) -> Result<String, String> {
    if let Some(obj) = body.as_object_mut() {
        for (k, v) in &inst.options {
            obj.insert(k.clone(), v.clone());
        }
    }
    let model = body.get("model").and_then(Value::as_str).map(str::to_owned);
    let uri = request_uri(
        inst,
        Protocol::OpenAiChat,
        None,
        model.as_deref(),
        false,
        Vec::new(),
    )
    .map_err(|_| "could not resolve the LLM endpoint".to_owned())?;
    let mut request = Request::post(uri)
        .body(Bytes::from(body.to_string()))
        .map_err(|e| e.to_string())?;
    let headers = request.headers_mut();
    for (name, value) in &inst.auth_header {
        headers.insert(name.clone(), value.clone());
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if authorize(&mut request, inst, services, conf).await.is_err() {
        return Err("failed to authorize the request to the LLM service".to_owned());
    }
    let resp = services
        .http()
        .send_verified(request, conf.timeout, conf.ssl_verify)
        .await
        .map_err(|e| e.to_string())?;
    if resp.status() != StatusCode::OK {
        return Err(format!(
            "LLM service returned error status: {}",
            resp.status().as_u16()
        ));
    }
    let answer: Value = serde_json::from_slice(resp.body())
        .map_err(|e| format!("failed to decode LLM response: {e}"))?;
    Protocol::OpenAiChat
        .response_text(&answer)
        .ok_or_else(|| "failed to extract text from LLM response".to_owned())
}

/// Whether an answer of `status` is an error the provider's body is passed on for (and a
/// fallback of ai-proxy-multi may retry).
pub fn is_error_status(conf: &CallConf, status: u16) -> bool {
    status == 429 || (500..600).contains(&status) || conf.fallback_statuses.contains(&status)
}

/// Calls the provider of `inst` for `req` and answers the exit that ends the request: the
/// provider's answer (a stream is set on `ctx` and relayed as it arrives), its error, or
/// the gateway's 502/504 when it could not be reached in time.
pub async fn call(
    ctx: &mut PluginCtx<'_>,
    services: &PluginServices,
    inst: &Instance,
    conf: &CallConf,
    req: &AiRequest,
    record: &Arc<LlmRecord>,
) -> Exit {
    let mut out = match build(ctx, inst, req, record) {
        Ok(o) => o,
        Err(exit) => return exit,
    };
    if let Err(exit) = authorize(&mut out.request, inst, services, conf).await {
        return exit;
    }
    let guards = ctx
        .get::<ResponseGuards>()
        .filter(|g| !g.0.is_empty())
        .cloned();
    let shape = |usage: Option<Value>| DenyShape {
        protocol: req.protocol,
        model: req
            .body
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_owned),
        usage,
        stream: req.stream,
    };
    // Counted until the answer is over: dropped on return, or with the relayed stream.
    let active = conf
        .active
        .as_ref()
        .map(|a| track_active(a, ctx, inst, record));
    let started = Instant::now();
    let resp = services
        .http()
        .send_streaming(out.request, conf.timeout, conf.ssl_verify)
        .await;
    let resp = match resp {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("failed to send request to LLM server: {e}");
            let status = if e == HttpError::Timeout {
                StatusCode::GATEWAY_TIMEOUT
            } else {
                StatusCode::BAD_GATEWAY
            };
            record.update(|f| f.upstream_response_time = Some(started.elapsed()));
            return Exit::status(status);
        }
    };
    let status = resp.status();
    let ct = resp.headers().get(header::CONTENT_TYPE).cloned();
    let with_ct = |exit: Exit| match &ct {
        Some(v) => exit.with_header(header::CONTENT_TYPE, v.clone()),
        None => exit,
    };
    let body = resp.into_body();
    if is_error_status(conf, status.as_u16()) {
        let read = tokio::time::timeout(conf.timeout, body.collect()).await;
        let bytes = match read {
            Ok(Ok(b)) => b.to_bytes(),
            _ => Bytes::new(),
        };
        // The error body is all the provider produced: its time is the first token's
        // (APISIX's `set_error_latency_vars`).
        let took = started.elapsed();
        record.update(|f| {
            f.upstream_response_time = Some(took);
            f.time_to_first_token = Some(took);
        });
        return with_ct(Exit::body(status, bytes));
    }
    let streaming = ct.as_ref().and_then(|v| v.to_str().ok()).is_some_and(|v| {
        v.contains("text/event-stream") || v.contains("application/vnd.amazon.eventstream")
    });
    if streaming {
        let model = req
            .body
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let relay = StreamRelay {
            inner: body,
            parser: SseParser::default(),
            target: out.target,
            convert: out
                .converted
                .then(|| AnthropicStream::new(model.or_else(|| record.get().model))),
            record: record.clone(),
            gap: conf.timeout,
            idle: None,
            started,
            usage: Usage::default(),
            first_chunk: false,
            ended: false,
            guards: Vec::new(),
            guarded: false,
            pending: None,
            done: false,
            eof: false,
            closed: false,
            response_text: None,
            limits: StreamLimits {
                max_bytes: conf.max_response_bytes,
                deadline: conf.max_stream_duration.map(|d| started + d),
                read: 0,
                hit: None,
            },
            _active: active,
        };
        let mut relay = relay;
        if let Some(g) = guards.filter(|_| status.as_u16() < 400) {
            relay.guarded = true;
            relay.guards =
                g.0.iter()
                    .map(|g| g.clone().stream(shape(None), record.clone()))
                    .collect();
        }
        ctx.set_exit_stream(Box::pin(relay));
        let mut exit = with_ct(Exit::status(status));
        if out.converted {
            exit.headers.retain(|(n, _)| n != header::CONTENT_TYPE);
            exit.headers.push((
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            ));
        }
        return exit;
    }
    let bytes = match read_answer(body, conf).await {
        Ok(b) => b,
        Err(Err(exit)) => return with_ct(exit),
        Err(Ok(status)) => return Exit::status(status),
    };
    // A whole answer's first token is its end, as APISIX times it once the body is read.
    let took = started.elapsed();
    record.update(|f| {
        f.upstream_response_time = Some(took);
        f.time_to_first_token = Some(took);
    });
    let Ok(answer) = serde_json::from_slice::<Value>(&bytes) else {
        return with_ct(Exit::body(status, bytes));
    };
    let usage = out.target.usage(&answer);
    let text = out.target.response_text(&answer);
    let raw_usage = usage.as_ref().map(|u| u.raw.clone());
    record.update(|f| {
        if let Some(u) = usage {
            f.usage = Some(u);
        }
        f.response_text = text.clone();
    });
    let (body, client_usage) = if out.converted {
        let model = req.body.get("model").and_then(Value::as_str);
        match openai_to_anthropic_response(&answer, model) {
            Ok(a) => {
                if req.protocol.has_tool_call(&a) {
                    record.update(|f| f.has_tool_calls = true);
                }
                (
                    Bytes::from(a.to_string()),
                    a.get("usage").filter(|u| u.is_object()).cloned(),
                )
            }
            Err(e) => return json_exit(500, &json!({"error_msg": e})),
        }
    } else {
        // Judged in the client's protocol, as APISIX does after converting.
        if req.protocol.has_tool_call(&answer) {
            record.update(|f| f.has_tool_calls = true);
        }
        (bytes, raw_usage)
    };
    if let Some(guards) = guards.filter(|_| status.as_u16() < 400) {
        let shape = shape(client_usage);
        for g in &guards.0 {
            let answer = Answer {
                text: text.as_deref(),
                shape: &shape,
                record,
            };
            if let Some((code, deny)) = g.check_answer(answer).await {
                let code = StatusCode::from_u16(code).unwrap_or(status);
                return with_ct(Exit::body(code, deny));
            }
        }
    }
    with_ct(Exit::body(status, body))
}

/// A whole answer's body, read within the call's timeout and `max_response_bytes` (a
/// `Content-Length` over it is refused before reading). `Err(Ok(status))`: the gateway's
/// 502/504; `Err(Err(exit))`: the cap's 502, `max_response_bytes exceeded`, as APISIX answers.
async fn read_answer(body: Incoming, conf: &CallConf) -> Result<Bytes, Result<StatusCode, Exit>> {
    let exceeded = |read: String| {
        tracing::warn!("aborting AI response: {read} exceeds max_response_bytes");
        Err(Err(Exit::body(
            StatusCode::BAD_GATEWAY,
            Bytes::from_static(b"max_response_bytes exceeded"),
        )))
    };
    let Some(max) = conf.max_response_bytes else {
        return match tokio::time::timeout(conf.timeout, body.collect()).await {
            Ok(Ok(b)) => Ok(b.to_bytes()),
            Ok(Err(e)) => {
                tracing::warn!("failed to read the LLM answer: {e}");
                Err(Ok(StatusCode::BAD_GATEWAY))
            }
            Err(_) => Err(Ok(StatusCode::GATEWAY_TIMEOUT)),
        };
    };
    if let Some(len) = body.size_hint().exact().filter(|l| *l > max) {
        return exceeded(format!("Content-Length {len}"));
    }
    let limited = Limited::new(body, usize::try_from(max).unwrap_or(usize::MAX));
    match tokio::time::timeout(conf.timeout, limited.collect()).await {
        Ok(Ok(b)) => Ok(b.to_bytes()),
        Ok(Err(e)) if e.is::<LengthLimitError>() => exceeded(format!("body over {max} bytes")),
        Ok(Err(e)) => {
            tracing::warn!("failed to read the LLM answer: {e}");
            Err(Ok(StatusCode::BAD_GATEWAY))
        }
        Err(_) => Err(Ok(StatusCode::GATEWAY_TIMEOUT)),
    }
}

/// The guards' run over one chunk, giving them back.
type GuardRun = Pin<Box<dyn Future<Output = (Vec<Box<dyn StreamGuard>>, ChunkOut)> + Send>>;

/// A provider's stream on its way to the client: relayed as it arrives (converted to
/// Anthropic events for a converted request), its usage and text read on the way, each
/// read waiting at most the call's timeout.
struct StreamRelay {
    inner: Incoming,
    parser: SseParser,
    target: Protocol,
    convert: Option<AnthropicStream>,
    record: Arc<LlmRecord>,
    gap: Duration,
    idle: Option<Pin<Box<tokio::time::Sleep>>>,
    started: Instant,
    usage: Usage,
    /// The first chunk came (the time to first token is taken).
    first_chunk: bool,
    ended: bool,
    /// The guards' checks of this stream (taken while `pending` runs them).
    guards: Vec<Box<dyn StreamGuard>>,
    /// Guards were set: the stream ends when they let it (`closed`), not with the upstream.
    guarded: bool,
    pending: Option<GuardRun>,
    /// `llm_request_done`.
    done: bool,
    /// The upstream's stream is over.
    eof: bool,
    /// Nothing more goes to the client.
    closed: bool,
    /// `llm_response_text`: the text so far, as of the last usage event.
    response_text: Option<String>,
    /// `max_response_bytes` and `max_stream_duration_ms`.
    limits: StreamLimits,
    /// The call counted in `llm_active_connections` while the stream lasts.
    _active: Option<ActiveConnection>,
}

/// A stream's runaway-upstream caps, checked after each chunk is relayed (the chunk that
/// crosses one still reaches the client); the stream then ends there, the provider's
/// connection dropped.
struct StreamLimits {
    max_bytes: Option<u64>,
    deadline: Option<Instant>,
    /// Bytes read from the provider so far.
    read: u64,
    /// The cap that ended the stream.
    hit: Option<&'static str>,
}

impl StreamLimits {
    /// Counts a chunk; answers the cap it crossed, if one.
    fn count(&mut self, len: usize) -> Option<&'static str> {
        self.read += len as u64;
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            self.hit = Some("max_stream_duration_ms");
        } else if self.max_bytes.is_some_and(|m| self.read > m) {
            self.hit = Some("max_response_bytes");
        }
        self.hit
    }
}

impl StreamRelay {
    /// Reads one chunk: what goes to the client instead of it (a converted stream's events)
    /// and the texts it carried.
    fn read(&mut self, data: &Bytes) -> (Option<Bytes>, String) {
        let events = self.parser.feed(data);
        let mut converted = String::new();
        let mut text = String::new();
        for ev in &events {
            let facts = stream_facts(self.target, ev);
            if facts.done {
                self.done = true;
            }
            if facts.tool_call {
                self.record.update(|f| f.has_tool_calls = true);
            }
            if let Some(u) = facts.usage {
                if u.prompt_tokens > 0 {
                    self.usage.prompt_tokens = u.prompt_tokens;
                }
                if u.completion_tokens > 0 {
                    self.usage.completion_tokens = u.completion_tokens;
                }
                self.usage.total_tokens = if u.total_tokens > 0 {
                    u.total_tokens
                } else {
                    self.usage.prompt_tokens + self.usage.completion_tokens
                };
                self.usage.raw = u.raw;
                let usage = self.usage.clone();
                self.record.update(|f| f.usage = Some(usage));
                if self.guarded {
                    let mut so_far = self.record.get().response_text.unwrap_or_default();
                    so_far.push_str(&text);
                    self.response_text = Some(so_far);
                }
            }
            if let Some(t) = facts.text {
                text.push_str(&t);
            }
            if let Some(c) = self.convert.as_mut() {
                converted.push_str(&c.convert(ev));
            }
        }
        if !text.is_empty() {
            self.record.update(|f| {
                f.response_text
                    .get_or_insert_with(String::new)
                    .push_str(&text);
            });
        }
        (self.convert.is_some().then(|| Bytes::from(converted)), text)
    }

    /// Starts the guards' run over `body`.
    fn guard(&mut self, body: Bytes, texts: String) {
        let chunk = Chunk {
            texts,
            text: self.response_text.clone(),
            done: self.done,
        };
        let guards = std::mem::take(&mut self.guards);
        self.pending = Some(Box::pin(guard::run_stream_guards(guards, chunk, body)));
    }

    fn end(&mut self) {
        if !self.ended {
            self.ended = true;
            let took = self.started.elapsed();
            self.record
                .update(|f| f.upstream_response_time = Some(took));
        }
    }
}

impl Body for StreamRelay {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        loop {
            if let Some(run) = this.pending.as_mut() {
                let (guards, out) = match run.as_mut().poll(cx) {
                    Poll::Ready(r) => r,
                    Poll::Pending => return Poll::Pending,
                };
                this.pending = None;
                this.guards = guards;
                let data = match out {
                    ChunkOut::Send(b) => {
                        this.closed = this.eof;
                        b
                    }
                    ChunkOut::End(b) => {
                        this.closed = true;
                        this.end();
                        b
                    }
                };
                if !data.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                continue;
            }
            if this.closed {
                return Poll::Ready(None);
            }
            // Once a cap is crossed the provider's stream is over for the client: what
            // follows is the end of a stream (the guards' last pass included).
            let next = if this.limits.hit.is_some() {
                Poll::Ready(None)
            } else {
                Pin::new(&mut this.inner).poll_frame(cx)
            };
            match next {
                Poll::Ready(Some(Ok(frame))) => {
                    this.idle = None;
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    if let Some(limit) = this.limits.count(data.len()) {
                        tracing::warn!(
                            bytes = this.limits.read,
                            duration_ms = this.started.elapsed().as_millis() as u64,
                            "aborting AI stream: {limit} exceeded"
                        );
                    }
                    // A stream's first token is its first chunk (APISIX times it there,
                    // not at the answer's head).
                    if !this.first_chunk && !data.is_empty() {
                        this.first_chunk = true;
                        let took = this.started.elapsed();
                        this.record.update(|f| f.time_to_first_token = Some(took));
                    }
                    let (out, texts) = this.read(&data);
                    if this.guarded {
                        this.guard(out.unwrap_or(data), texts);
                        continue;
                    }
                    match out {
                        Some(out) if out.is_empty() => continue,
                        Some(out) => return Poll::Ready(Some(Ok(Frame::data(out)))),
                        None => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    tracing::error!("LLM stream broke off: {e}");
                    this.end();
                    return Poll::Ready(Some(Err(BodyError::Broken(e.to_string()))));
                }
                Poll::Ready(None) => {
                    this.end();
                    if this.guarded {
                        // The guards' last pass, once the stream is known to be over
                        // (APISIX's filter run with `llm_request_done` set at the end).
                        this.eof = true;
                        if this.done {
                            this.closed = true;
                        } else {
                            this.done = true;
                            if this.response_text.is_none() {
                                this.response_text = this.record.get().response_text;
                            }
                            this.guard(Bytes::new(), String::new());
                        }
                        continue;
                    }
                    return Poll::Ready(None);
                }
                Poll::Pending => {
                    let gap = this.gap;
                    let idle = this
                        .idle
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(gap)));
                    return match idle.as_mut().poll(cx) {
                        Poll::Ready(()) => {
                            tracing::error!("LLM stream timed out");
                            this.end();
                            Poll::Ready(Some(Err(BodyError::Timeout)))
                        }
                        Poll::Pending => Poll::Pending,
                    };
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        if self.guarded {
            return self.closed;
        }
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigv4_paths_and_signature() {
        let once = "/model/anthropic.claude-3%3A0/converse";
        assert_eq!(encode_path("/model/anthropic.claude-3:0/converse", 1), once);
        // Idempotent over a once-encoded path.
        assert_eq!(encode_path(once, 1), once);
        assert_eq!(
            encode_path(once, 2),
            "/model/anthropic.claude-3%253A0/converse"
        );
        let creds = Credentials {
            access_key: "AKID".into(),
            secret_key: "secret".into(),
            session_token: Some("tok".into()),
            region: "us-east-1".into(),
            service: "bedrock".into(),
        };
        let mut req =
            Request::post("https://bedrock-runtime.us-east-1.amazonaws.com:443/model/a:b/converse")
                .header("x-client", "kept, not signed")
                .body(Bytes::from_static(b"{}"))
                .unwrap();
        sign_aws(&mut req, &creds).unwrap();
        assert_eq!(req.uri().path(), "/model/a%3Ab/converse");
        let h = req.headers();
        assert_eq!(h["host"], "bedrock-runtime.us-east-1.amazonaws.com:443");
        assert_eq!(h["x-amz-security-token"], "tok");
        let auth = h["authorization"].to_str().unwrap();
        assert!(auth.contains("/us-east-1/bedrock/aws4_request, SignedHeaders=host;x-amz-date;x-amz-security-token, Signature="), "{auth}");
        let no_region = Credentials {
            region: String::new(),
            ..creds
        };
        assert!(sign_aws(&mut req, &no_region)
            .unwrap_err()
            .starts_with("missing region"));
    }

    #[test]
    fn gcp_accounts_from_the_conf() {
        let bad = GcpAuth::from_conf(&json!({"service_account_json": "{not json"}));
        assert!(bad
            .account
            .unwrap_err()
            .starts_with("invalid gcp service account json"));
        let ok = GcpAuth::from_conf(
            &json!({"service_account_json": "{\"client_email\": \"a@b\"}",
            "max_ttl": 30}),
        );
        assert_eq!(ok.account.unwrap().client_email, "a@b");
        assert_eq!((ok.expire_early, ok.max_ttl), (60, Some(30)));
    }

    #[test]
    fn endpoints_as_apisix_parses_them() {
        let e = Endpoint::parse("http://127.0.0.1:1988").unwrap();
        assert_eq!((e.host.as_str(), e.port, e.path), ("127.0.0.1", 1988, None));
        let e = Endpoint::parse("https://h/v1/x/chat?api-version=1&k=a%20b").unwrap();
        assert_eq!(e.port, 443);
        assert_eq!(e.path.as_deref(), Some("/v1/x/chat"));
        assert_eq!(
            e.query,
            vec![
                ("api-version".into(), "1".into()),
                ("k".into(), "a b".into())
            ]
        );
        assert!(Endpoint::parse("http//127.0.0.1:1999").is_none());
        assert!(Endpoint::parse("ftp://h").is_none());
    }

    #[test]
    fn request_body_override_merges() {
        let mut body = json!({"temperature": 0.9, "metadata": {"user": "u"}, "stop": ["A"]});
        let patch = json!({"temperature": 0.2, "metadata": {"team": "t"}, "stop": ["B"], "n": 1});
        let mut forced = body.clone();
        deep_merge(&mut body, &patch, false);
        assert_eq!(
            body,
            json!({"temperature": 0.9, "metadata": {"user": "u", "team": "t"}, "stop": ["A"], "n": 1})
        );
        deep_merge(&mut forced, &patch, true);
        assert_eq!(forced["temperature"], 0.2);
        assert_eq!(forced["stop"], json!(["B"]));
    }
}
