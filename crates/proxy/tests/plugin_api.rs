//! The plugin API through the real proxy, with test plugins: what a plugin changes in the
//! request reaches the upstream (headers, method, path, query, Host, `$remote_addr`), the body
//! is read once and still forwarded, a body size limit answers 413, a plugin may send the
//! request to another upstream, exits carry headers, per-request state reaches the header
//! filter, body filters transform the response, and the log phase gets exactly what was
//! declared.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ferrisix_config::model::ResourceKind;
use ferrisix_plugin_api::{
    BodyChunk, BodyFilter, CompileCtx, Exit, Flow, LogCtx, LogNeeds, Phases, Plugin, PluginCtx,
    PluginDef, PluginServices, ResponseHead, Step, UpstreamRef,
};
use ferrisix_plugins::PluginRegistry;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use serde_json::{json, Value};

#[path = "support/gateway.rs"]
mod gateway;

use gateway::TestGateway;

fn name(n: &'static str) -> HeaderName {
    HeaderName::from_static(n)
}

fn value(v: &'static str) -> HeaderValue {
    HeaderValue::from_static(v)
}

fn schema() -> Value {
    json!({"type": "object"})
}

// ---- t-edit: changes the request that goes upstream.

struct Edit;

impl Plugin for Edit {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        ctx.headers_mut().insert(name("x-added"), value("yes"));
        ctx.headers_mut().remove("x-drop");
        ctx.set_upstream_method(Method::PUT);
        ctx.set_upstream_path("/edited".into());
        ctx.set_upstream_query(Some("q=1".into()));
        ctx.set_upstream_host(value("edited.host"));
        ctx.set_remote_addr("10.9.9.9".parse().unwrap());
        ctx.insert(Remembered("from rewrite"));
        Step::CONTINUE
    }
}

static EDIT: PluginDef = PluginDef::new("t-edit", 3000, schema, |_| Ok(Arc::new(Edit)));

// ---- t-body: reads the body up to 8 bytes and says how much it saw.

struct ReadBody;

impl Plugin for ReadBody {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(async move {
            let seen = match ctx.read_body(8).await {
                Ok(b) => format!("{}", b.len()),
                Err(e) => format!("{e}"),
            };
            let seen = HeaderValue::from_str(&seen).unwrap();
            ctx.response_headers_mut().insert(name("x-body-seen"), seen);
            Flow::Continue
        }))
    }
}

static READ_BODY: PluginDef = PluginDef::new("t-body", 2900, schema, |_| Ok(Arc::new(ReadBody)));

// ---- t-limit: client-control's `max_body_size`.

struct Limit(u64);

impl Plugin for Limit {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        ctx.set_max_body_size(self.0);
        Step::CONTINUE
    }
}

static LIMIT: PluginDef = PluginDef::new("t-limit", 2800, schema, |cx| {
    Ok(Arc::new(Limit(cx.conf["max"].as_u64().unwrap_or(5))))
});

// ---- t-choose: traffic-split's choice of an upstream by id, made at compile time.

struct Choose(UpstreamRef);

impl Plugin for Choose {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        ctx.choose_upstream(self.0.clone());
        Step::CONTINUE
    }
}

fn compile_choose(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let id = cx.conf["upstream_id"].as_str().ok_or("upstream_id")?;
    Ok(Arc::new(Choose(cx.upstreams.upstream_by_id(id)?)))
}

static CHOOSE: PluginDef = PluginDef::new("t-choose", 2700, schema, compile_choose);

// ---- t-exit: ends the request with headers; sets a header on whatever answer.

struct ExitWith;

impl Plugin for ExitWith {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        ctx.response_headers_mut().insert(name("x-any"), value("1"));
        Step::exit(
            Exit::body(StatusCode::IM_A_TEAPOT, "{\"short\":true}")
                .with_header(http::header::CONTENT_TYPE, value("application/json"))
                .with_header(name("location"), value("/elsewhere")),
        )
    }
}

static EXIT: PluginDef = PluginDef::new("t-exit", 2600, schema, |_| Ok(Arc::new(ExitWith)));

// ---- t-filter: per-request state to the header filter, and an upper-casing body filter.

#[derive(Debug)]
struct Remembered(&'static str);

struct Upper;

impl BodyFilter for Upper {
    fn filter(&mut self, chunk: &mut BodyChunk) {
        chunk.data = Bytes::from(chunk.data.to_ascii_uppercase());
    }
}

struct Filter;

impl Plugin for Filter {
    fn phases(&self) -> Phases {
        Phases::HEADER_FILTER
    }

    fn header_filter(&self, ctx: &mut PluginCtx<'_>, resp: &mut ResponseHead<'_>) {
        let seen = ctx.get::<Remembered>().map_or("nothing", |r| r.0);
        resp.headers_mut()
            .insert(name("x-remembered"), HeaderValue::from_static(seen));
        let from_upstream = value(if resp.from_upstream() { "1" } else { "0" });
        resp.headers_mut()
            .insert(name("x-from-upstream"), from_upstream);
        resp.clear_headers_as_body_modified();
        resp.add_body_filter(Box::new(Upper));
    }
}

static FILTER: PluginDef = PluginDef::new("t-filter", 100, schema, |_| Ok(Arc::new(Filter)));

// ---- t-log: declares what it reads in `log`.

static LOGGED: Mutex<Vec<LogCtx>> = Mutex::new(Vec::new());

struct Log;

impl Plugin for Log {
    fn phases(&self) -> Phases {
        Phases::LOG
    }

    fn log_needs(&self) -> LogNeeds {
        LogNeeds {
            vars: Some(vec!["uri".into(), "upstream_addr".into()].into()),
            request_headers: true,
            response_headers: true,
            request_body: Some(4),
            response_body: Some(5),
        }
    }

    fn log(&self, ctx: &LogCtx) {
        LOGGED.lock().unwrap().push(ctx.clone());
    }
}

static LOG: PluginDef = PluginDef::new("t-log", 50, schema, |_| Ok(Arc::new(Log)));

// ---- the harness

/// An upstream answering with what it received: `METHOD TARGET`, the headers, then the body.
fn start_upstream(tag: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve(stream, tag));
        }
    });
    addr
}

fn serve(mut s: TcpStream, tag: &str) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0);
        while buf.len() < end + 4 + length {
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + length]).into_owned();
        buf.drain(..end + 4 + length);
        let answer = format!("{tag}\n{head}\n\n{body}");
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nETag: \"x\"\r\n\r\n{answer}",
            answer.len()
        );
        if s.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

fn start(routes: Vec<Value>, upstreams: Vec<Value>) -> TestGateway {
    let services = Arc::new(PluginServices::default());
    let registry = PluginRegistry::from_defs(
        services.clone(),
        [&EDIT, &READ_BODY, &LIMIT, &CHOOSE, &EXIT, &FILTER, &LOG],
    );
    let state = gateway::state(vec![
        (ResourceKind::Routes, routes),
        (ResourceKind::Upstreams, upstreams),
    ]);
    gateway::serve(&state, &registry, services)
}

/// A response: status, lower-cased headers, body (close-delimited or by length).
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, n: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.as_str())
    }
}

fn send(addr: SocketAddr, raw: &str) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Reply {
        status,
        headers,
        body,
    }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = &rest[n + 2..];
    }
    out
}

fn get(addr: SocketAddr, path: &str, extra: &str) -> Reply {
    send(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: client.host\r\n{extra}Connection: close\r\n\r\n"),
    )
}

fn post(addr: SocketAddr, path: &str, body: &str) -> Reply {
    send(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: client.host\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

fn route(id: &str, plugins: Value, up: SocketAddr) -> Value {
    json!({"id": id, "uri": format!("/{id}"), "plugins": plugins,
        "upstream": {"type": "roundrobin", "nodes": {up.to_string(): 1}}})
}

#[test]
fn request_edits_reach_the_upstream_and_state_reaches_the_header_filter() {
    let up = start_upstream("up");
    let gw = start(
        vec![route("edit", json!({"t-edit": {}, "t-filter": {}}), up)],
        vec![],
    );
    let r = get(gw.addr, "/edit?orig=1", "X-Drop: gone\r\n");
    assert_eq!(r.status, 200);
    // The body filter upper-cased what the upstream said it received.
    assert!(
        r.body.starts_with("UP\nPUT /EDITED?Q=1 HTTP/1.1"),
        "{}",
        r.body
    );
    assert!(r.body.contains("\nHOST: EDITED.HOST"), "{}", r.body);
    assert!(r.body.contains("\nX-ADDED: YES"), "{}", r.body);
    assert!(!r.body.contains("X-DROP"), "{}", r.body);
    assert!(r.body.contains("\nX-REAL-IP: 10.9.9.9"), "{}", r.body);
    assert_eq!(r.header("x-remembered"), Some("from rewrite"));
    assert_eq!(r.header("x-from-upstream"), Some("1"));
    assert_eq!(r.header("etag"), None);
}

#[test]
fn the_body_is_read_once_and_still_forwarded_and_a_limit_answers_413() {
    let up = start_upstream("up");
    let gw = start(
        vec![
            route("body", json!({"t-body": {}}), up),
            route("limit", json!({"t-limit": {"max": 5}, "t-body": {}}), up),
        ],
        vec![],
    );
    let r = post(gw.addr, "/body", "abc");
    assert_eq!(r.header("x-body-seen"), Some("3"));
    assert!(r.body.ends_with("\n\nabc"), "{}", r.body);
    // Past the reading limit: still forwarded whole.
    let r = post(gw.addr, "/body", "0123456789");
    assert!(r
        .header("x-body-seen")
        .unwrap()
        .contains("larger than the limit"));
    assert!(r.body.ends_with("\n\n0123456789"), "{}", r.body);
    // The size limit: within it passes, past it is the client's 413.
    assert_eq!(post(gw.addr, "/limit", "abc").status, 200);
    let r = post(gw.addr, "/limit", "0123456789");
    assert_eq!(r.status, 413);
    let chunked = send(
        gw.addr,
        "POST /limit HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\n01234\r\n5\r\n56789\r\n0\r\n\r\n",
    );
    assert_eq!(chunked.status, 413);
}

#[test]
fn a_plugin_chooses_another_upstream_and_exits_carry_headers() {
    let (a, b) = (start_upstream("route's"), start_upstream("chosen"));
    let gw = start(
        vec![
            route("choose", json!({"t-choose": {"upstream_id": "b"}}), a),
            route("plain", json!({}), a),
            route("exit", json!({"t-exit": {}, "t-filter": {}}), a),
        ],
        vec![json!({"id": "b", "type": "roundrobin", "nodes": {b.to_string(): 1}})],
    );
    assert!(get(gw.addr, "/choose", "").body.starts_with("chosen\n"));
    assert!(get(gw.addr, "/plain", "").body.starts_with("route's\n"));
    let r = get(gw.addr, "/exit", "");
    assert_eq!(r.status, 418);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("location"), Some("/elsewhere"));
    assert_eq!(r.header("x-any"), Some("1"));
    assert_eq!(r.header("x-from-upstream"), Some("0"));
    assert_eq!(r.body, "{\"SHORT\":TRUE}");
}

#[test]
fn the_log_phase_gets_what_was_declared() {
    let up = start_upstream("up");
    let gw = start(vec![route("log", json!({"t-log": {}}), up)], vec![]);
    let r = post(gw.addr, "/log", "0123456789");
    assert_eq!(r.status, 200);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let logged = loop {
        if let Some(l) = LOGGED.lock().unwrap().pop() {
            break l;
        }
        assert!(std::time::Instant::now() < deadline, "no log phase");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(logged.status, 200);
    assert_eq!(logged.vars.get("uri"), Some("/log"));
    assert_eq!(
        logged.vars.get("upstream_addr"),
        Some(up.to_string().as_str())
    );
    let req_headers = logged.request_headers.unwrap();
    assert_eq!(req_headers["host"], "client.host");
    assert_eq!(logged.response_headers.unwrap()["etag"], "\"x\"");
    assert_eq!(logged.request_body.as_deref(), Some(&b"0123"[..]));
    assert_eq!(logged.response_body.as_deref(), Some(&b"up\nPO"[..]));
    assert!(logged.bytes_sent > r.body.len() as u64);
}
