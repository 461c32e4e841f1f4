//! chaitin-waf (`apisix/plugins/chaitin-waf.lua`, with lua-resty-t1k): sends each request, or
//! those matching one of `match[].vars`, to a Chaitin SafeLine detection engine over the T1K
//! protocol and passes, monitors or blocks it by the engine's verdict.
//!
//! The engines are `plugin_metadata/chaitin-waf`'s `nodes`, picked in turn by resty.roundrobin;
//! the mode is the route's, else the metadata's, else `monitor`. The metadata's `config` holds
//! the socket settings; a route's own `config` replaces them all, a setting it leaves out
//! taking lua-resty-t1k's default. A request the engine blocks (a status and an event id in its
//! answer) gets that status and APISIX's JSON body in `block` mode and goes on in `monitor`
//! mode. An engine that cannot be reached, is slow or answers garbage fails the request with
//! 500 in `block` mode and lets it through in `monitor` mode. The `X-APISIX-CHAITIN-WAF*`
//! headers say what happened (`append_waf_resp_header`, `append_waf_debug_header`).

mod engine;
mod t1k;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferrisix_config::vars::compile_vars;
use ferrisix_plugin_api::roundrobin::InterleavedWrr;
use ferrisix_plugin_api::{
    BodyError, CheckCtx, Clock, CompileCtx, Exit, Flow, Lease, Phases, Plugin, PluginCtx,
    PluginDef, Retain, StateMap, Step,
};
use ferrisix_router::{Expr, VarSource};
use http::{HeaderName, HeaderValue, StatusCode, Version};
use serde_json::{json, Value};

use engine::{Pool, Target, Timeouts};

pub const NAME: &str = "chaitin-waf";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    metadata_schema: Some(metadata_schema),
    ..PluginDef::new(NAME, 2700, schema, compile)
};

const H_WAF: &str = "x-apisix-chaitin-waf";
const H_ERROR: &str = "x-apisix-chaitin-waf-error";
const H_TIME: &str = "x-apisix-chaitin-waf-time";
const H_STATUS: &str = "x-apisix-chaitin-waf-status";
const H_ACTION: &str = "x-apisix-chaitin-waf-action";
const H_SERVER: &str = "x-apisix-chaitin-waf-server";

/// lua-resty-t1k's defaults, for settings a route's `config` leaves out.
const DEFAULT_TIMEOUT_MS: i64 = 1000;
const DEFAULT_BODY_KB: i64 = 1024;
const DEFAULT_KEEPALIVE_SIZE: i64 = 256;
const DEFAULT_KEEPALIVE_MS: i64 = 60_000;
/// nginx's `lua_socket_*_timeout`, which a cosocket timeout of 0 falls back to.
const NGINX_SOCKET_TIMEOUT: Duration = Duration::from_secs(60);

fn config_schema(defaults: bool) -> Value {
    let int = |d: i64| {
        if defaults {
            json!({"type": "integer", "default": d})
        } else {
            json!({"type": "integer"})
        }
    };
    let mut real_ip = json!({"type": "boolean"});
    if defaults {
        real_ip["default"] = json!(true);
    }
    json!({
        "type": "object",
        "properties": {
            "connect_timeout": int(DEFAULT_TIMEOUT_MS),
            "send_timeout": int(DEFAULT_TIMEOUT_MS),
            "read_timeout": int(DEFAULT_TIMEOUT_MS),
            "req_body_size": int(DEFAULT_BODY_KB),
            "keepalive_size": int(DEFAULT_KEEPALIVE_SIZE),
            "keepalive_timeout": int(DEFAULT_KEEPALIVE_MS),
            "real_client_ip": real_ip
        }
    })
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "mode": {"type": "string", "enum": ["off", "monitor", "block"]},
            "match": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"vars": {"type": "array"}}
                }
            },
            "append_waf_resp_header": {"type": "boolean", "default": true},
            "append_waf_debug_header": {"type": "boolean", "default": false},
            "config": config_schema(false)
        }
    })
}

fn metadata_schema() -> Value {
    let mut config = config_schema(true);
    config["default"] = json!({});
    json!({
        "type": "object",
        "properties": {
            "mode": {"type": "string", "enum": ["off", "monitor", "block"]},
            "nodes": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "host": {"type": "string", "pattern": "^\\*?[0-9a-zA-Z-._\\[\\]:/]+$"},
                        "port": {"type": "integer", "minimum": 1, "default": 80}
                    },
                    "required": ["host"]
                },
                "minItems": 1
            },
            "config": config
        },
        "required": ["nodes"]
    })
}

/// The `match[].vars` expressions, compiled (an entry without `vars` matches every request).
fn matches(conf: &Value) -> Result<Vec<Expr>, String> {
    conf.get("match")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|m| compile_vars(m.get("vars").unwrap_or(&Value::Array(Vec::new()))))
        .collect()
}

/// APISIX's `check_schema`: every `vars` expression compiles.
fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    matches(cx.conf).map(|_| ())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Off,
    Monitor,
    Block,
}

fn mode(v: Option<&Value>) -> Option<Mode> {
    match v?.as_str()? {
        "off" => Some(Mode::Off),
        "monitor" => Some(Mode::Monitor),
        "block" => Some(Mode::Block),
        _ => None,
    }
}

/// The settings of one request to the engine: APISIX's `get_conf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Settings {
    mode: Mode,
    timeouts: Timeouts,
    /// `req_body_size` in bytes.
    body_limit: usize,
    keepalive_size: usize,
    /// `None`: idle connections are kept until the engine closes them.
    keepalive: Option<Duration>,
    real_client_ip: bool,
}

/// A cosocket timeout: 0 is nginx's default; a negative one is taken as 0.
fn timeout(ms: i64) -> Duration {
    if ms <= 0 {
        NGINX_SOCKET_TIMEOUT
    } else {
        Duration::from_millis(ms.unsigned_abs())
    }
}

fn settings(conf: &Value, meta: &Value) -> Settings {
    let meta_config = meta.get("config").filter(|c| c.is_object());
    // The route's `config` replaces the metadata's whole (a setting it leaves out is
    // lua-resty-t1k's default), except `real_client_ip`, which it overrides only when set.
    let source = conf.get("config").filter(|c| c.is_object()).or(meta_config);
    let int = |k: &str, d: i64| {
        source
            .and_then(|c| c.get(k))
            .and_then(Value::as_i64)
            .unwrap_or(d)
    };
    let real_client_ip = conf
        .get("config")
        .and_then(|c| c.get("real_client_ip"))
        .or_else(|| meta_config.and_then(|c| c.get("real_client_ip")))
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let keepalive_ms = int("keepalive_timeout", DEFAULT_KEEPALIVE_MS);
    Settings {
        mode: mode(conf.get("mode"))
            .or_else(|| mode(meta.get("mode")))
            .unwrap_or(Mode::Monitor),
        timeouts: Timeouts {
            connect: timeout(int("connect_timeout", DEFAULT_TIMEOUT_MS)),
            send: timeout(int("send_timeout", DEFAULT_TIMEOUT_MS)),
            read: timeout(int("read_timeout", DEFAULT_TIMEOUT_MS)),
        },
        body_limit: usize::try_from(int("req_body_size", DEFAULT_BODY_KB).max(0))
            .unwrap_or(usize::MAX)
            .saturating_mul(1024),
        keepalive_size: usize::try_from(int("keepalive_size", DEFAULT_KEEPALIVE_SIZE).max(0))
            .unwrap_or(0),
        keepalive: (keepalive_ms > 0).then(|| Duration::from_millis(keepalive_ms.unsigned_abs())),
        real_client_ip,
    }
}

/// One engine node of the metadata.
#[derive(Debug)]
struct Node {
    /// The host as configured (`X-APISIX-CHAITIN-WAF-SERVER`).
    host: HeaderValue,
    target: Target,
    /// How errors name it: `host:port`, or the `unix:` path.
    server: String,
    pool: Lease<Pool>,
}

/// The picker over the nodes, shared by every route using the same node list.
struct Picker(InterleavedWrr);

impl Retain for Picker {}

#[derive(Debug)]
struct Engines {
    nodes: Vec<Node>,
    picker: Lease<Picker>,
}

impl std::fmt::Debug for Picker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Picker")
    }
}

#[derive(Debug)]
struct ChaitinWaf {
    matches: Vec<Expr>,
    resp_header: bool,
    debug_header: bool,
    settings: Settings,
    /// `None`: no `plugin_metadata/chaitin-waf` (every request fails with 500).
    engines: Option<Engines>,
    /// `$hostname`, the engine's proxy name.
    hostname: String,
    clock: Clock,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let meta = cx.metadata.filter(|m| m.get("nodes").is_some());
    let meta_filled = meta.map(|m| {
        let mut m = m.clone();
        let _ = ferrisix_config::schema::validate_and_fill(&metadata_schema(), &mut m);
        m
    });
    let settings = settings(&conf, meta_filled.as_ref().unwrap_or(&Value::Null));
    let engines = meta_filled.as_ref().map(|m| {
        // resty.roundrobin over `host:port` keys: a node listed twice is one node.
        let mut nodes: Vec<Node> = Vec::new();
        for n in m["nodes"].as_array().into_iter().flatten() {
            let host = n.get("host").and_then(Value::as_str).unwrap_or_default();
            let port = n.get("port").and_then(Value::as_u64).unwrap_or(80);
            let port = u16::try_from(port).unwrap_or(u16::MAX);
            let target = Target::new(host, port);
            let server = match &target {
                Target::Unix(_) => host.to_owned(),
                Target::Tcp { .. } => format!("{host}:{port}"),
            };
            if nodes.iter().any(|x| x.server == server) {
                continue;
            }
            let pool = cx
                .services
                .shared::<StateMap<Pool>>()
                .lease(&format!("{server}#{}", settings.keepalive_size), || {
                    Pool::new(settings.keepalive_size)
                });
            nodes.push(Node {
                host: HeaderValue::from_str(host).unwrap_or_else(|_| HeaderValue::from_static("")),
                target,
                server,
                pool,
            });
        }
        let key = nodes
            .iter()
            .map(|n| n.server.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let count = nodes.len();
        let picker = cx
            .services
            .shared::<StateMap<Picker>>()
            .lease(&key, || Picker(InterleavedWrr::new(vec![1; count], None)));
        Engines { nodes, picker }
    });
    Ok(Arc::new(ChaitinWaf {
        matches: matches(&conf)?,
        resp_header: conf["append_waf_resp_header"].as_bool().unwrap_or(true),
        debug_header: conf["append_waf_debug_header"].as_bool().unwrap_or(false),
        settings,
        engines,
        hostname: crate::log::log_entry::hostname(),
        clock: cx.services.clock().clone(),
    }))
}

/// The `X-APISIX-CHAITIN-WAF*` headers of one request, set together at the end as APISIX does.
#[derive(Default)]
struct Report {
    waf: Option<&'static str>,
    error: Option<String>,
    time: Option<u128>,
    status: Option<String>,
    action: Option<&'static str>,
    server: Option<HeaderValue>,
}

/// A header value from text the engine or an error made up; unprintable bytes are dropped.
fn value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| {
        let clean: String = text
            .chars()
            .filter(|c| *c == '\t' || (' '..='~').contains(c))
            .collect();
        HeaderValue::from_str(&clean).unwrap_or_else(|_| HeaderValue::from_static(""))
    })
}

impl ChaitinWaf {
    /// APISIX's `_M.access` tail: the debug headers only when asked for, all of them only with
    /// `append_waf_resp_header`.
    fn finish(&self, ctx: &mut PluginCtx<'_>, r: Report, flow: Flow) -> Flow {
        if self.resp_header {
            let h = ctx.response_headers_mut();
            let mut set = |name: &'static str, v: HeaderValue| {
                h.insert(HeaderName::from_static(name), v);
            };
            if let Some(w) = r.waf {
                set(H_WAF, HeaderValue::from_static(w));
            }
            if let Some(t) = r.time {
                set(
                    H_TIME,
                    HeaderValue::from(u64::try_from(t).unwrap_or(u64::MAX)),
                );
            }
            if let Some(s) = &r.status {
                set(H_STATUS, value(s));
            }
            if let Some(a) = r.action {
                set(H_ACTION, HeaderValue::from_static(a));
            }
            if self.debug_header {
                if let Some(e) = &r.error {
                    set(H_ERROR, value(e));
                }
                if let Some(s) = r.server {
                    set(H_SERVER, s);
                }
            }
        }
        flow
    }

    /// The T1K request head: the request line and headers (for HTTP/2 and 3 written as
    /// lua-resty-t1k writes them, `HTTP/2.0`).
    fn head(ctx: &PluginCtx<'_>) -> Vec<u8> {
        let version = match ctx.head().version {
            Version::HTTP_09 => "0.9",
            Version::HTTP_10 => "1.0",
            Version::HTTP_11 => "1.1",
            Version::HTTP_2 => "2.0",
            _ => "3.0",
        };
        let mut h = Vec::with_capacity(512);
        h.extend_from_slice(ctx.method().as_str().as_bytes());
        h.push(b' ');
        h.extend_from_slice(ctx.request_uri().as_bytes());
        h.extend_from_slice(b" HTTP/");
        h.extend_from_slice(version.as_bytes());
        h.extend_from_slice(b"\r\n");
        for (name, v) in ctx.headers() {
            h.extend_from_slice(name.as_str().as_bytes());
            h.extend_from_slice(b": ");
            h.extend_from_slice(v.as_bytes());
            h.extend_from_slice(b"\r\n");
        }
        h.extend_from_slice(b"\r\n");
        h
    }

    /// The body lua-resty-t1k sends: none without `Content-Length` or `Transfer-Encoding`
    /// or when empty, else its first `req_body_size` bytes.
    async fn body(&self, ctx: &mut PluginCtx<'_>) -> Result<Option<Bytes>, Exit> {
        let declared = ctx
            .header("content-length")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
            > 0
            || ctx.header("transfer-encoding").is_some();
        if !declared {
            return Ok(None);
        }
        let limit = self.settings.body_limit;
        let read = match ctx.read_body(limit).await {
            Ok(b) => b.clone(),
            Err(BodyError::TooLarge(_)) => ctx.body_read().cloned().unwrap_or_default(),
            Err(BodyError::Timeout) => return Err(Exit::status(StatusCode::REQUEST_TIMEOUT)),
            Err(BodyError::Broken(_)) => return Err(Exit::status(StatusCode::BAD_REQUEST)),
        };
        // An empty body is none (nginx has no body data for it).
        Ok((!read.is_empty()).then(|| read.slice(..limit.min(read.len()))))
    }

    fn extra(&self, ctx: &PluginCtx<'_>) -> Vec<u8> {
        let var = |n: &str| ctx.var(n).map(|v| v.into_owned()).unwrap_or_default();
        let remote_addr = if self.settings.real_client_ip {
            var("remote_addr")
        } else {
            var("realip_remote_addr")
        };
        tracing::info!("chaitin-waf client_ip: {remote_addr}");
        let uuid = uuid_v4();
        t1k::Extra {
            remote_addr: &remote_addr,
            remote_port: &var("remote_port"),
            local_addr: &var("server_addr"),
            local_port: &var("server_port"),
            // APISIX's http server block is `server_name _`.
            server_name: "_",
            scheme: ctx.head().conn.scheme(),
            proxy_name: &self.hostname,
            uuid: &uuid,
            begin_us: self.clock.epoch_ms().saturating_mul(1000),
        }
        .encode()
    }

    async fn inspect(&self, ctx: &mut PluginCtx<'_>, node: &Node, mut r: Report) -> Flow {
        let mode = self.settings.mode;
        let body = match self.body(ctx).await {
            Ok(b) => b,
            Err(exit) => return Flow::Exit(exit),
        };
        let msg = t1k::encode_request(&Self::head(ctx), body.as_deref(), &self.extra(ctx));
        let started = Instant::now();
        let answer = engine::exchange(
            &node.pool,
            &node.target,
            &node.server,
            &msg,
            &self.settings.timeouts,
            self.settings.keepalive,
        )
        .await;
        r.time = Some(started.elapsed().as_millis());
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                let e = format!("lua-resty-t1k: failed to detect the request: {e}");
                r.waf = Some(if e.contains("timeout") {
                    "timeout"
                } else {
                    "waf-err"
                });
                let flow = if mode == Mode::Monitor {
                    tracing::warn!("chaitin-waf monitor mode: detected waf error - {e}");
                    Flow::Continue
                } else {
                    tracing::error!("chaitin-waf: {e}");
                    Flow::Exit(Exit::status(StatusCode::INTERNAL_SERVER_ERROR))
                };
                r.error = Some(e);
                return self.finish(ctx, r, flow);
            }
        };
        r.waf = Some("yes");
        r.action = Some("pass");
        r.status = Some("200".into());
        // The engine's own response headers (its session cookie), in `block` mode only; they
        // go on whatever answer ends the request, whatever `append_waf_resp_header` says.
        if mode == Mode::Block {
            for (k, v) in answer.extra_headers() {
                if let (Ok(k), Ok(v)) = (
                    HeaderName::from_bytes(k.as_bytes()),
                    HeaderValue::from_str(&v),
                ) {
                    ctx.response_headers_mut().insert(k, v);
                }
            }
        }
        let (Some(status), Some(event_id)) = (answer.status(), answer.event_id()) else {
            return self.finish(ctx, r, Flow::Continue);
        };
        r.status = Some(status.clone());
        r.action = Some("reject");
        if mode == Mode::Monitor {
            tracing::warn!(
                "chaitin-waf monitor mode: request would have been rejected, event_id: {event_id}"
            );
            return self.finish(ctx, r, Flow::Continue);
        }
        tracing::error!("request rejected by chaitin-waf, event_id: {event_id}");
        // Lua's `tonumber` of the engine's status; one that is no status fails the request.
        let code = status
            .trim()
            .parse::<u16>()
            .ok()
            .and_then(|c| StatusCode::from_u16(c).ok());
        let exit = match code {
            Some(code) => {
                let body = format!(
                    "{{\"code\": {status}, \"success\":false, \"message\": \"blocked by Chaitin \
                     SafeLine Web Application Firewall\", \"event_id\": \"{event_id}\"}}\n"
                );
                Exit::body(code, body)
            }
            None => Exit::status(StatusCode::INTERNAL_SERVER_ERROR),
        };
        self.finish(ctx, r, Flow::Exit(exit))
    }
}

/// A random version-4 UUID as 32 hex digits (lua-resty-t1k's request id).
fn uuid_v4() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let mut s = String::with_capacity(32);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

impl Plugin for ChaitinWaf {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let mut r = Report::default();
        let Some(engines) = &self.engines else {
            r.waf = Some("err");
            r.error = Some("missing metadata".into());
            let exit = Exit::status(StatusCode::INTERNAL_SERVER_ERROR);
            return Step::Done(self.finish(ctx, r, Flow::Exit(exit)));
        };
        let Some(node) = engines.picker.0.next().and_then(|i| engines.nodes.get(i)) else {
            r.waf = Some("unhealthy");
            r.error = Some("no healthy nodes".into());
            let exit = Exit::status(StatusCode::INTERNAL_SERVER_ERROR);
            return Step::Done(self.finish(ctx, r, Flow::Exit(exit)));
        };
        r.server = Some(node.host.clone());
        if self.settings.mode == Mode::Off {
            r.waf = Some("off");
            return Step::Done(self.finish(ctx, r, Flow::Continue));
        }
        if !self.matches.is_empty() && !self.matches.iter().any(|e| e.eval(&*ctx)) {
            r.waf = Some("no");
            return Step::Done(self.finish(ctx, r, Flow::Continue));
        }
        Step::Wait(Box::pin(self.inspect(ctx, node, r)))
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Mutex;

    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use http::Method;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::testing::Compiler;

    fn section(tag: u8, data: &[u8]) -> Vec<u8> {
        let mut v = vec![tag];
        v.extend_from_slice(&(data.len() as u32).to_le_bytes());
        v.extend_from_slice(data);
        v
    }

    fn block_answer() -> Vec<u8> {
        [
            section(0x41, b"?"),
            section(0x02, b"403"),
            section(0x23, b"Set-Cookie:sl-session=abc\n"),
            section(0xa4, b"<!-- event_id: e1d2 -->"),
        ]
        .concat()
    }

    /// An engine answering every message with `answer`; keeps the messages it got.
    async fn engine(answer: Vec<u8>) -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                let answer = answer.clone();
                let seen = s2.clone();
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    let mut buf = vec![0u8; 4096];
                    loop {
                        while !got.ends_with(b"Proto:3\n") {
                            let n = s.read(&mut buf).await.unwrap_or(0);
                            if n == 0 {
                                return;
                            }
                            got.extend_from_slice(&buf[..n]);
                        }
                        seen.lock().unwrap().push(std::mem::take(&mut got));
                        s.write_all(&answer).await.unwrap();
                    }
                });
            }
        });
        (addr, seen)
    }

    async fn run(p: &Arc<dyn Plugin>, req: &mut TestRequest) -> Flow {
        match p.access(&mut req.ctx()) {
            Step::Done(f) => f,
            Step::Wait(fut) => fut.await,
        }
    }

    fn header<'a>(req: &'a TestRequest, name: &str) -> Option<&'a str> {
        req.state
            .response_headers()
            .get(name)
            .map(|v| v.to_str().unwrap())
    }

    #[test]
    fn schema_messages_and_priority() {
        let r = crate::PluginRegistry::builtin();
        assert_eq!(
            r.check_metadata(NAME, &json!({"nodes": []})).unwrap_err(),
            "invalid configuration: property \"nodes\" validation failed: expect array to have at least 1 items"
        );
        assert_eq!(
            r.check_metadata(NAME, &json!({"nodes": [{}]})).unwrap_err(),
            "invalid configuration: property \"nodes\" validation failed: failed to validate item 1: property \"host\" is required"
        );
        for host in [
            "127.0.0.1",
            "unix:/tmp/safeline-snserver.sock",
            "[::1]",
            "waf.local",
        ] {
            let meta = json!({"nodes": [{"host": host, "port": 8000}]});
            assert!(r.check_metadata(NAME, &meta).is_ok(), "{host}");
        }
        assert!(r
            .check_metadata(NAME, &json!({"nodes": [{"host": "a b"}]}))
            .is_err());
        assert!(r
            .check_metadata(NAME, &json!({"nodes": [{"host": "h"}], "mode": "strict"}))
            .is_err());
        assert!(r.check(NAME, &json!({})).is_ok());
        assert!(r
            .check(
                NAME,
                &json!({"match": [{"vars": [["http_waf", "==", "true"]]}]})
            )
            .is_ok());
        assert_eq!(
            r.check(NAME, &json!({"match": [{"vars": [["http_waf", "=", "true"]]}]}))
                .unwrap_err(),
            "failed to check the configuration of plugin chaitin-waf err: failed to validate the 'vars' expression: invalid operator '='"
        );
        assert!(r
            .check(NAME, &json!({"config": {"read_timeout": "1"}}))
            .is_err());
        assert_eq!(r.get(NAME).unwrap().priority, 2700);
    }

    #[test]
    fn route_config_replaces_the_metadata_config() {
        let meta = json!({"nodes": [{"host": "h"}], "mode": "block",
            "config": {"connect_timeout": 5, "send_timeout": 6, "read_timeout": 7,
                "req_body_size": 2, "keepalive_size": 3, "keepalive_timeout": 0,
                "real_client_ip": false}});
        let s = settings(&json!({}), &meta);
        assert_eq!(s.mode, Mode::Block);
        assert_eq!(s.timeouts.connect, Duration::from_millis(5));
        assert_eq!(s.timeouts.read, Duration::from_millis(7));
        assert_eq!((s.body_limit, s.keepalive_size), (2048, 3));
        assert_eq!(s.keepalive, None);
        assert!(!s.real_client_ip);
        // A route `config`: what it leaves out is lua-resty-t1k's default, not the metadata's,
        // except real_client_ip.
        let s = settings(
            &json!({"mode": "off", "config": {"read_timeout": 9}}),
            &meta,
        );
        assert_eq!(s.mode, Mode::Off);
        assert_eq!(s.timeouts.read, Duration::from_millis(9));
        assert_eq!(s.timeouts.connect, Duration::from_millis(1000));
        assert_eq!((s.body_limit, s.keepalive_size), (1024 * 1024, 256));
        assert_eq!(s.keepalive, Some(Duration::from_secs(60)));
        assert!(!s.real_client_ip);
        let s = settings(&json!({"config": {"real_client_ip": true}}), &meta);
        assert!(s.real_client_ip);
        // Without a mode anywhere: monitor.
        assert_eq!(
            settings(&json!({}), &json!({"nodes": []})).mode,
            Mode::Monitor
        );
        assert_eq!(
            settings(&json!({"config": {"connect_timeout": 0}}), &meta)
                .timeouts
                .connect,
            NGINX_SOCKET_TIMEOUT
        );
    }

    #[tokio::test]
    async fn blocks_with_the_engine_status_and_event_id() {
        let (addr, seen) = engine(block_answer()).await;
        let meta = json!({"mode": "block", "nodes": [{"host": "127.0.0.1", "port": addr.port()}]});
        let c = Compiler::new();
        let conf = json!({"append_waf_debug_header": true});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "cw", Some(&meta))).unwrap();
        let mut req = TestRequest::with_body(Method::POST, "/p?q=1", "a=1 and 1=1")
            .header("content-length", "11")
            .header("x-test", "v");
        let Flow::Exit(e) = run(&p, &mut req).await else {
            panic!("blocked")
        };
        assert_eq!(e.status, 403);
        assert_eq!(
            e.body.unwrap(),
            "{\"code\": 403, \"success\":false, \"message\": \"blocked by Chaitin SafeLine Web Application Firewall\", \"event_id\": \"e1d2\"}\n"
        );
        assert_eq!(header(&req, H_WAF), Some("yes"));
        assert_eq!(header(&req, H_STATUS), Some("403"));
        assert_eq!(header(&req, H_ACTION), Some("reject"));
        assert_eq!(header(&req, H_SERVER), Some("127.0.0.1"));
        assert!(header(&req, H_TIME).is_some());
        assert_eq!(header(&req, "set-cookie"), Some("sl-session=abc"));
        let got = seen.lock().unwrap()[0].clone();
        let text = String::from_utf8_lossy(&got);
        assert!(text.contains("POST /p?q=1 HTTP/1.1\r\n"), "{text}");
        assert!(text.contains("x-test: v\r\n"), "{text}");
        assert!(text.contains("a=1 and 1=1"), "{text}");

        // Monitor mode: the same verdict lets the request through, and the engine's headers
        // are not added.
        let conf = json!({"mode": "monitor"});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "cw", Some(&meta))).unwrap();
        let mut req = TestRequest::get("/");
        assert_eq!(run(&p, &mut req).await, Flow::Continue);
        assert_eq!(header(&req, H_ACTION), Some("reject"));
        assert_eq!(header(&req, H_STATUS), Some("403"));
        assert_eq!(header(&req, "set-cookie"), None);
        assert_eq!(header(&req, H_SERVER), None, "debug headers are off");
    }

    #[tokio::test]
    async fn missing_metadata_match_and_off() {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &json!({}), "cw", None)).unwrap();
        let mut req = TestRequest::get("/");
        let Flow::Exit(e) = run(&p, &mut req).await else {
            panic!("fails")
        };
        assert_eq!((e.status.as_u16(), e.body), (500, None));
        assert_eq!(header(&req, H_WAF), Some("err"));
        assert_eq!(header(&req, H_ERROR), None);

        let meta = json!({"nodes": [{"host": "127.0.0.1", "port": 1}]});
        let conf = json!({"match": [{"vars": [["http_waf", "==", "true"]]}]});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "cw", Some(&meta))).unwrap();
        let mut req = TestRequest::get("/");
        assert_eq!(run(&p, &mut req).await, Flow::Continue);
        assert_eq!(header(&req, H_WAF), Some("no"));

        let conf = json!({"mode": "off", "append_waf_resp_header": false});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "cw", Some(&meta))).unwrap();
        let mut req = TestRequest::get("/");
        assert_eq!(run(&p, &mut req).await, Flow::Continue);
        assert_eq!(header(&req, H_WAF), None, "no headers at all");
    }

    #[test]
    fn uuids_are_version_4() {
        let u = uuid_v4();
        assert_eq!(u.len(), 32);
        assert_eq!(&u[12..13], "4");
        assert!(matches!(&u[16..17], "8" | "9" | "a" | "b"));
        assert_ne!(u, uuid_v4());
    }
}
