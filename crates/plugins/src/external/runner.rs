//! The client side of APISIX's runner protocol (`apisix/plugins/ext-plugin/init.lua`): the
//! conf token cache, the calls over the runner's unix socket with their extra-info
//! callbacks, and what the runner's answer does to the request.

pub mod proto;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ferrisix_plugin_api::{
    Clock, Exit, ExtRunner, Flow, PluginCtx, PluginServices, SharedState, UpstreamAnswer,
};
use ferrisix_router::VarSource;
use http::{HeaderName, HeaderValue, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::support::args::{encode_args, unescape};
use crate::support::uri::uri_safe_encode;
use proto::{Action, Info};

/// APISIX's `helper.get_conf_token_cache_time()`: a token is prepared again after an hour
/// (the runner is told the same through `APISIX_CONF_EXPIRE_TIME`).
pub const CONF_TOKEN_TTL: Duration = Duration::from_secs(3600);

/// Connecting to the runner (APISIX's `sock:settimeouts(1000, ...)`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Idle connections kept per gateway (APISIX's keepalive pool size).
const POOL_SIZE: usize = 32;

/// The schema the three plugins share.
pub fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "conf": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "maxLength": 128, "minLength": 1},
                        "value": {"type": "string"}
                    },
                    "required": ["name", "value"]
                },
                "minItems": 1
            },
            "allow_degradation": {"type": "boolean", "default": false}
        }
    })
}

/// Response headers a runner may not set through a rewrite (nor copied from the upstream by
/// post-resp when the runner sets none), as APISIX's `exclude_resp_header`.
const EXCLUDED_RESP_HEADERS: [&str; 10] = [
    "connection",
    "content-length",
    "transfer-encoding",
    "location",
    "server",
    "www-authenticate",
    "content-encoding",
    "content-type",
    "content-location",
    "content-language",
];

pub fn excluded_resp_header(name: &str) -> bool {
    EXCLUDED_RESP_HEADERS
        .iter()
        .any(|h| h.eq_ignore_ascii_case(name))
}

/// The connections to the runner, kept open between calls, and the call ids.
#[derive(Debug, Default)]
pub struct Connections {
    idle: Mutex<Vec<(u64, UnixStream)>>,
    next_id: AtomicU32,
}

impl SharedState for Connections {
    fn create(_: &PluginServices) -> Self {
        Connections::default()
    }
}

impl Connections {
    /// APISIX's ids count up to 2^22 and wrap (its worker id fills the high bits).
    fn id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed) % (1 << 22)
    }

    /// An idle connection the runner has not closed, of the runner's current generation.
    fn take(&self, generation: u64) -> Option<UnixStream> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some((g, s)) = idle.pop() {
            let mut probe = [0u8; 1];
            // A runner that closed its end (or restarted) leaves an end-of-file to read; a
            // live idle connection has nothing to read.
            let open = matches!(s.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
            if g == generation && open {
                return Some(s);
            }
        }
        None
    }

    fn put(&self, generation: u64, s: UnixStream) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < POOL_SIZE {
            idle.push((generation, s));
        }
    }
}

/// One connection for one call: given back to the pool only when the call went through.
struct Conn<'a> {
    stream: UnixStream,
    timeout: Duration,
    pool: &'a Connections,
    generation: u64,
}

impl Conn<'_> {
    async fn send(&mut self, ty: u8, data: &[u8], what: &str) -> Result<(), String> {
        let hdr =
            proto::header(ty, data.len()).map_err(|e| format!("failed to send {what}: {e}"))?;
        let io = async {
            self.stream.write_all(&hdr).await?;
            self.stream.write_all(data).await
        };
        match tokio::time::timeout(self.timeout, io).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("failed to send {what}: {e}")),
            Err(_) => Err(format!("failed to send {what}: timeout")),
        }
    }

    /// One frame: its type and payload; an `RPC_ERROR` frame is the runner's error message.
    async fn receive(&mut self, what: &str) -> Result<(u8, Vec<u8>), String> {
        let io = async {
            let mut hdr = [0u8; 4];
            self.stream.read_exact(&mut hdr).await?;
            let mut data = vec![0u8; proto::frame_len(hdr)];
            self.stream.read_exact(&mut data).await?;
            Ok::<_, std::io::Error>((hdr[0], data))
        };
        let (ty, data) = match tokio::time::timeout(self.timeout, io).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(format!("failed to receive {what}: closed"))
            }
            Ok(Err(e)) => return Err(format!("failed to receive {what}: {e}")),
            Err(_) => return Err(format!("failed to receive {what}: timeout")),
        };
        if ty == proto::RPC_ERROR {
            return Err(format!(
                "failed to receive {what}: {}",
                proto::err_to_msg(&data)
            ));
        }
        Ok((ty, data))
    }

    fn release(self) {
        self.pool.put(self.generation, self.stream);
    }
}

/// A plugin's conf token, valid for one runner generation until it expires.
#[derive(Debug)]
struct TokenCache {
    /// `u64::MAX`: none.
    token: AtomicU64,
    expires_ms: AtomicU64,
    generation: AtomicU64,
}

impl TokenCache {
    fn new() -> TokenCache {
        TokenCache {
            token: AtomicU64::new(u64::MAX),
            expires_ms: AtomicU64::new(0),
            generation: AtomicU64::new(0),
        }
    }

    fn get(&self, now_ms: u64, generation: u64) -> Option<u32> {
        let token = self.token.load(Ordering::Acquire);
        let fresh = now_ms < self.expires_ms.load(Ordering::Acquire)
            && self.generation.load(Ordering::Acquire) == generation;
        (token != u64::MAX && fresh).then_some(token as u32)
    }

    fn set(&self, token: u32, now_ms: u64, generation: u64) {
        self.generation.store(generation, Ordering::Release);
        self.expires_ms.store(
            now_ms + CONF_TOKEN_TTL.as_millis() as u64,
            Ordering::Release,
        );
        self.token.store(u64::from(token), Ordering::Release);
    }
}

/// What the runner made of the upstream's answer (post-resp).
#[derive(Debug, Default)]
pub struct RespOutcome {
    /// The status to answer with, when the runner set one (or changed the body).
    pub status: Option<u16>,
    pub headers: Vec<(String, String)>,
    pub body: Option<Bytes>,
}

/// One of the three plugins' conf, compiled: what the runner is told and how failures end.
#[derive(Debug)]
pub struct RunnerClient {
    pub name: &'static str,
    key: String,
    conf: Vec<(String, String)>,
    pub allow_degradation: bool,
    runner: Arc<ExtRunner>,
    pool: Arc<Connections>,
    clock: Clock,
    token: TokenCache,
}

impl RunnerClient {
    /// `key` names the conf to the runner (APISIX sends its lrucache key).
    pub fn new(
        name: &'static str,
        key: String,
        conf: &Value,
        services: &PluginServices,
    ) -> RunnerClient {
        let list = conf
            .get("conf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|e| {
                let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
                (s("name"), s("value"))
            })
            .collect();
        RunnerClient {
            name,
            key,
            conf: list,
            allow_degradation: conf
                .get("allow_degradation")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            runner: services.ext_runner().clone(),
            pool: services.shared::<Connections>(),
            clock: services.clock().clone(),
            token: TokenCache::new(),
        }
    }

    async fn connect(&self) -> Result<Conn<'_>, String> {
        let generation = self.runner.generation();
        let path = self.runner.path();
        let stream = match self.pool.take(generation) {
            Some(s) => s,
            None => match tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(path)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    return Err(format!(
                        "failed to connect to the unix socket unix:{}: {e}",
                        path.display()
                    ))
                }
                Err(_) => {
                    return Err(format!(
                        "failed to connect to the unix socket unix:{}: timeout",
                        path.display()
                    ))
                }
            },
        };
        Ok(Conn {
            stream,
            timeout: self.runner.timeout(),
            pool: &self.pool,
            generation,
        })
    }

    /// The conf token: cached, else prepared over a connection of its own.
    async fn token(&self) -> Result<u32, String> {
        let generation = self.runner.generation();
        if let Some(t) = self.token.get(self.clock.mono_ms(), generation) {
            return Ok(t);
        }
        let mut conn = self.connect().await?;
        let entries: Vec<proto::Entry<'_>> = self
            .conf
            .iter()
            .map(|(n, v)| (n.as_str(), Some(v.as_str())))
            .collect();
        let msg = proto::prepare_conf(&self.key, &entries);
        conn.send(proto::RPC_PREPARE_CONF, &msg, "RPC_PREPARE_CONF")
            .await?;
        let (ty, data) = conn.receive("RPC_PREPARE_CONF").await?;
        if ty != proto::RPC_PREPARE_CONF {
            return Err(format!(
                "failed to receive RPC_PREPARE_CONF: unexpected type {ty}"
            ));
        }
        let token = proto::read_conf_token(&data)
            .map_err(|e| format!("failed to receive RPC_PREPARE_CONF: {e}"))?;
        conn.release();
        tracing::info!(
            plugin = self.name,
            token,
            "successfully obtained conf token"
        );
        self.token.set(token, self.clock.mono_ms(), generation);
        Ok(token)
    }

    /// Runs the call up to three times, preparing the conf again when the runner lost its
    /// token; a failure ends the request with 503 unless `allow_degradation` (APISIX's
    /// `communicate`).
    pub async fn communicate_req(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let mut err = String::new();
        for _ in 0..3 {
            match self.req_call(ctx).await {
                Ok(flow) => return flow,
                Err(e) if e.contains("conf token not found") => {
                    tracing::warn!(plugin = self.name, "refresh cache and try again");
                    self.runner.flush_tokens();
                    err = e;
                }
                Err(e) => return self.failed(&e, false),
            }
        }
        self.failed(&err, true)
    }

    /// The failure's answer: `None` to go on (degraded).
    fn failed(&self, err: &str, retried: bool) -> Flow {
        tracing::error!(plugin = self.name, "{err}");
        if self.allow_degradation {
            if retried {
                tracing::warn!("Plugin Runner is wrong after 3 times retry, allow degradation");
            } else {
                tracing::warn!("Plugin Runner is wrong, allow degradation");
            }
            return Flow::Continue;
        }
        Flow::Exit(Exit::status(StatusCode::SERVICE_UNAVAILABLE))
    }

    /// post-resp's calls: `Ok(None)` when the request goes on degraded, `Err(503)` on failure.
    pub async fn communicate_resp(
        &self,
        ctx: &mut PluginCtx<'_>,
        answer: &mut UpstreamAnswer,
    ) -> Result<Option<RespOutcome>, u16> {
        let mut err = String::new();
        for _ in 0..3 {
            match self.resp_call(ctx, answer).await {
                Ok(out) => return Ok(Some(out)),
                Err(e) if e.contains("conf token not found") => {
                    tracing::warn!(plugin = self.name, "refresh cache and try again");
                    self.runner.flush_tokens();
                    err = e;
                }
                Err(e) => {
                    err = e;
                    return match self.failed(&err, false) {
                        Flow::Continue => Ok(None),
                        Flow::Exit(_) => Err(503),
                    };
                }
            }
        }
        match self.failed(&err, true) {
            Flow::Continue => Ok(None),
            Flow::Exit(_) => Err(503),
        }
    }

    /// Answers the runner's extra-info questions until its answer of type `want` comes.
    async fn exchange(
        &self,
        conn: &mut Conn<'_>,
        ctx: &mut PluginCtx<'_>,
        mut answer: Option<&mut UpstreamAnswer>,
        what: &str,
        want: u8,
    ) -> Result<Vec<u8>, String> {
        loop {
            let (ty, data) = conn.receive(what).await?;
            if ty != proto::RPC_EXTRA_INFO {
                if ty != want {
                    return Err(format!("failed to receive {what}: unexpected type {ty}"));
                }
                return Ok(data);
            }
            let info = proto::read_extra_info_req(&data)
                .map_err(|e| format!("failed to handle RPC_EXTRA_INFO: {e}"))?;
            let result: Option<Vec<u8>> = match info {
                Info::Var(name) => ctx.var(name).map(|v| v.into_owned().into_bytes()),
                Info::ReqBody => match ctx.read_body(proto::MAX_DATA_SIZE).await {
                    Ok(b) => Some(b.to_vec()),
                    Err(e) => {
                        tracing::error!("failed to read request body: {e}");
                        None
                    }
                },
                Info::RespBody => match answer.as_deref_mut() {
                    // Read whole once: later questions and the client get the same bytes.
                    Some(a) => match a.read_body(proto::MAX_DATA_SIZE).await {
                        Ok(b) => Some(b.to_vec()),
                        Err(e) => {
                            tracing::error!("read response failed: {e}");
                            None
                        }
                    },
                    None => {
                        tracing::error!("failed to read response body: not exits");
                        None
                    }
                },
                Info::Other(t) => {
                    return Err(format!(
                        "failed to handle RPC_EXTRA_INFO: unsupported info type: {t}"
                    ))
                }
            };
            let out = proto::extra_info_resp(result.as_deref());
            conn.send(proto::RPC_EXTRA_INFO, &out, "RPC_EXTRA_INFO reply")
                .await
                .map_err(|e| e.replace("failed to send", "failed to reply"))?;
        }
    }

    async fn req_call(&self, ctx: &mut PluginCtx<'_>) -> Result<Flow, String> {
        let token = self.token().await?;
        // What APISIX sends: the upstream path (the client's `$uri` unless a plugin rewrote
        // it), the current arguments, the headers with `Host` as sent upstream.
        let edits = ctx.upstream_edits().clone();
        let path = edits.path.clone().unwrap_or_else(|| ctx.uri().to_owned());
        let query: Option<String> = match &edits.query {
            Some(q) => q.clone(),
            None => ctx.query().map(str::to_owned),
        };
        let args = parse_args(query.as_deref().unwrap_or(""));
        let upstream_host = edits
            .host
            .as_ref()
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned);
        let headers: Vec<(String, String)> = ctx
            .headers()
            .iter()
            .map(|(n, v)| {
                let value = match (n.as_str(), &upstream_host) {
                    ("host", Some(h)) => h.clone(),
                    _ => String::from_utf8_lossy(v.as_bytes()).into_owned(),
                };
                (n.as_str().to_owned(), value)
            })
            .collect();
        let src_ip = match ctx.remote_addr() {
            std::net::IpAddr::V4(a) => a.octets().to_vec(),
            std::net::IpAddr::V6(a) => a.octets().to_vec(),
        };
        let arg_entries: Vec<proto::Entry<'_>> = args
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_deref()))
            .collect();
        let header_entries: Vec<proto::Entry<'_>> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), Some(v.as_str())))
            .collect();
        let msg = proto::http_req_call(&proto::ReqCall {
            id: self.pool.id(),
            src_ip: &src_ip,
            method: proto::method_code(ctx.method().as_str()),
            path: &path,
            args: &arg_entries,
            headers: &header_entries,
            conf_token: token,
        });
        let mut conn = self.connect().await?;
        conn.send(proto::RPC_HTTP_REQ_CALL, &msg, "RPC_HTTP_REQ_CALL")
            .await?;
        let data = self
            .exchange(
                &mut conn,
                ctx,
                None,
                "RPC_HTTP_REQ_CALL",
                proto::RPC_HTTP_REQ_CALL,
            )
            .await?;
        let action = proto::read_req_call_resp(&data)
            .map_err(|e| format!("failed to receive RPC_HTTP_REQ_CALL: {e}"))?;
        let flow = match action {
            Action::None => Flow::Continue,
            Action::Stop(stop) => {
                set_response_headers(ctx, &stop.headers, false);
                let status = match stop.status {
                    // APISIX avoids 0 as the status.
                    0 => StatusCode::OK,
                    s => StatusCode::from_u16(s).map_err(|_| {
                        format!("failed to receive RPC_HTTP_REQ_CALL: invalid status {s}")
                    })?,
                };
                Flow::Exit(if stop.body.is_empty() {
                    Exit::status(status)
                } else {
                    Exit::body(status, Bytes::copy_from_slice(stop.body))
                })
            }
            Action::Rewrite(rw) => {
                apply_rewrite(ctx, &rw, args);
                Flow::Continue
            }
        };
        conn.release();
        Ok(flow)
    }

    async fn resp_call(
        &self,
        ctx: &mut PluginCtx<'_>,
        answer: &mut UpstreamAnswer,
    ) -> Result<RespOutcome, String> {
        let token = self.token().await?;
        let status = answer.status.as_u16();
        let headers: Vec<(String, String)> = answer
            .headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let entries: Vec<proto::Entry<'_>> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), Some(v.as_str())))
            .collect();
        let msg = proto::http_resp_call(self.pool.id(), status, &entries, token);
        let mut conn = self.connect().await?;
        conn.send(proto::RPC_HTTP_RESP_CALL, &msg, "RPC_HTTP_RESP_CALL")
            .await?;
        let data = self
            .exchange(
                &mut conn,
                ctx,
                Some(answer),
                "RPC_HTTP_RESP_CALL",
                proto::RPC_HTTP_RESP_CALL,
            )
            .await?;
        let resp = proto::read_resp_call_resp(&data)
            .map_err(|e| format!("failed to receive RPC_HTTP_RESP_CALL: {e}"))?;
        let body = (!resp.body.is_empty()).then(|| Bytes::copy_from_slice(resp.body));
        let status = match resp.status {
            // The runner changed the body only: the upstream's status goes with it.
            0 => body.as_ref().map(|_| status),
            s => Some(s),
        };
        let out = RespOutcome {
            status,
            headers: resp
                .headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), v.unwrap_or("").to_owned()))
                .collect(),
            body,
        };
        conn.release();
        Ok(out)
    }
}

/// `ngx.req.get_uri_args()` as a list in the query's order (`None`: a field without `=`).
fn parse_args(query: &str) -> Vec<(String, Option<String>)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) => (unescape(k.as_bytes()), Some(unescape(v.as_bytes()))),
            None => (unescape(pair.as_bytes()), None),
        })
        .collect()
}

/// Sets headers on whatever answer ends the request: a name's first value replaces, later
/// ones add (APISIX's `set_header` then `add_header`). `filtered`: a rewrite's `resp_headers`,
/// which may not touch the excluded ones.
pub fn set_response_headers(
    ctx: &mut PluginCtx<'_>,
    list: &[(&str, Option<&str>)],
    filtered: bool,
) {
    let mut seen: Vec<String> = Vec::new();
    for (name, value) in list {
        let lower = name.to_ascii_lowercase();
        if filtered && excluded_resp_header(&lower) {
            continue;
        }
        let (Ok(n), Some(Ok(v))) = (
            HeaderName::from_bytes(lower.as_bytes()),
            value.map(HeaderValue::from_str),
        ) else {
            continue;
        };
        if seen.contains(&lower) {
            ctx.response_headers_mut().append(n, v);
        } else {
            ctx.response_headers_mut().insert(n, v);
            seen.push(lower);
        }
    }
}

/// A rewrite action: the path, request headers, body, response headers and arguments.
fn apply_rewrite(
    ctx: &mut PluginCtx<'_>,
    rw: &proto::Rewrite<'_>,
    mut args: Vec<(String, Option<String>)>,
) {
    let path = rw.path.map(uri_safe_encode);
    if let Some(p) = &path {
        ctx.set_upstream_path(p.clone());
    }
    for (name, value) in &rw.headers {
        let Ok(n) = HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes()) else {
            continue;
        };
        match value.map(HeaderValue::from_str) {
            Some(Ok(v)) => {
                if n == http::header::HOST {
                    ctx.set_upstream_host(v.clone());
                }
                ctx.headers_mut().insert(n, v);
            }
            Some(Err(_)) => {}
            None => {
                ctx.headers_mut().remove(n);
            }
        }
    }
    if !rw.body.is_empty() {
        ctx.set_body(Bytes::copy_from_slice(rw.body));
    }
    set_response_headers(ctx, &rw.resp_headers, true);
    if !rw.args.is_empty() {
        let mut changed: Vec<&str> = Vec::new();
        for (name, value) in &rw.args {
            match value {
                None => args.retain(|(n, _)| n != name),
                Some(v) => {
                    if !changed.contains(name) {
                        args.retain(|(n, _)| n != name);
                        changed.push(*name);
                    }
                    args.push(((*name).to_owned(), Some((*v).to_owned())));
                }
            }
        }
        let q = encode_args(&args);
        ctx.set_upstream_query(if q.is_empty() { None } else { Some(q) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_cache_expires_and_follows_the_generation() {
        let c = TokenCache::new();
        assert_eq!(c.get(0, 0), None);
        c.set(7, 1_000, 0);
        assert_eq!(c.get(1_000, 0), Some(7));
        let ttl = CONF_TOKEN_TTL.as_millis() as u64;
        assert_eq!(c.get(1_000 + ttl - 1, 0), Some(7));
        assert_eq!(c.get(1_000 + ttl, 0), None, "expired after the TTL");
        assert_eq!(c.get(1_001, 1), None, "a flush forgets it");
    }

    #[test]
    fn args_parse_as_openresty_decodes_them() {
        assert_eq!(
            parse_args("a=1&b&c=x%20y&&a=2"),
            vec![
                ("a".to_owned(), Some("1".to_owned())),
                ("b".to_owned(), None),
                ("c".to_owned(), Some("x y".to_owned())),
                ("a".to_owned(), Some("2".to_owned())),
            ]
        );
        assert!(excluded_resp_header("Content-Type"));
        assert!(!excluded_resp_header("x-a"));
    }
}
