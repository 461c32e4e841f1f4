//! Plugins that answer APIs of their own through `public-api`: batch-requests, whose
//! pipelines go back through the gateway to echo upstreams, and wolf-rbac, against an in-test
//! wolf server that follows wolf's HTTP API as APISIX's test server stands in for it
//! (`t/lib/server.lua`) and records what the gateway sent.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{free_port, get, request, request_raw, Behaviour, Gateway, Upstream};

fn route(id: &str, uri: &str, plugins: Value, up: &Upstream) -> Value {
    json!({"id": id, "uri": uri, "plugins": plugins, "upstream": {"nodes": {up.node(): 1}}})
}

fn batch(gw: &Gateway, headers: &[(&str, &str)], body: &Value) -> crate::support::Reply {
    request(
        gw.addr(),
        "POST",
        "/apisix/batch-requests",
        headers,
        body.to_string().as_bytes(),
    )
}

/// The echo upstream's JSON in one answer entry's body.
fn echoed(entry: &Value) -> Value {
    serde_json::from_str(entry["body"].as_str().expect("a body")).expect("the echo's JSON")
}

#[test]
fn batch_requests_send_each_entry_through_the_gateway() {
    let up = Upstream::start("up", Behaviour::Echo);
    let conf = json!({
        "routes": [
            {"id": "batch", "uri": "/apisix/batch-requests", "plugins": {"public-api": {}}},
            route("b", "/b", json!({}), &up),
            route("c", "/c", json!({}), &up),
            route("d", "/d", json!({}), &up),
            // Each entry goes through the route's plugins as a client's request would.
            route("auth", "/auth", json!({"key-auth": {}}), &up),
        ],
        "consumers": [{"username": "jack", "plugins": {"key-auth": {"key": "k-jack"}}}]
    });
    let gw = Gateway::start(&conf.to_string());
    let doc = json!({
        "query": {"base": "base_query", "conflict": "query_value"},
        "headers": {"Base-Header": "base", "ConflictHeader": "header_value",
                    "OuterConflict": "common_value", "X-Real-IP": "10.9.9.9"},
        "pipeline": [
            {"path": "/b", "headers": {"Header1": "hello", "ConflictHeader": "b-header-value"}},
            {"path": "/c", "method": "PUT", "body": "hello body", "version": 1.0},
            {"path": "/d", "query": {"one": "thing", "conflict": "d_value"}},
            {"path": "/nowhere"},
            {"path": "/auth"}
        ]
    });
    let r = batch(
        &gw,
        &[
            ("ConflictHeader", "outer_header"),
            ("OuterConflict", "outer_conflict"),
            ("Cookie", "request-cookies"),
            ("apikey", "k-jack"),
            ("Content-Type", "application/json"),
        ],
        &doc,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let list = r.json();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 5);

    let b = &list[0];
    assert_eq!(
        (b["status"].as_u64(), b["reason"].as_str()),
        (Some(200), Some("OK"))
    );
    assert_eq!(b["headers"]["X-Upstream"], "up");
    assert_eq!(b["headers"]["Content-Type"], "application/json");
    let echo = echoed(b);
    assert_eq!(echo["path"], "/b?base=base_query&conflict=query_value");
    let h = &echo["headers"];
    assert_eq!(h["header1"], "hello");
    assert_eq!(h["conflictheader"], "b-header-value");
    assert_eq!(h["outerconflict"], "common_value");
    assert_eq!(h["base-header"], "base");
    assert_eq!(h["cookie"], "request-cookies");
    // The client's address, not what the document said; no Content-* of the batch.
    assert_eq!(h["x-real-ip"], "127.0.0.1");
    assert!(h.get("content-type").is_none(), "{h}");

    let c = echoed(&list[1]);
    assert_eq!(c["method"], "PUT");
    assert_eq!(c["body"], "hello body");
    assert_eq!(c["headers"]["conflictheader"], "header_value");

    let d = echoed(&list[2]);
    assert_eq!(d["path"], "/d?one=thing&conflict=d_value&base=base_query");

    assert_eq!(list[3]["status"], 404);
    assert_eq!(list[3]["reason"], "Not Found");
    let auth = echoed(&list[4]);
    assert_eq!(auth["headers"]["x-consumer-username"], "jack");
    assert_eq!(up.hits(), 4);
}

#[test]
fn batch_requests_refuse_bad_documents_with_apisix_s_messages() {
    let up = Upstream::start("up", Behaviour::Echo);
    let conf = json!({
        "routes": [
            {"id": "batch", "uri": "/apisix/batch-requests", "plugins": {"public-api": {}}},
            route("b", "/b", json!({}), &up),
        ],
        "plugin_metadata": [{"id": "batch-requests", "max_body_size": 2048,
                             "max_pipeline_items": 2}]
    });
    let gw = Gateway::start(&conf.to_string());
    let refused = |body: &[u8], status: u16, msg: &str| {
        let r = request(gw.addr(), "POST", "/apisix/batch-requests", &[], body);
        assert_eq!(r.status, status, "{}", r.text());
        assert_eq!(r.json(), json!({"error_msg": msg}));
    };
    refused(
        b"",
        400,
        "no request body, you should give at least one pipeline setting",
    );
    refused(
        b"invalid json string",
        400,
        "invalid request body: invalid json string, err: Expected value but found invalid token at character 1",
    );
    refused(
        br#"{"pipeline1": [{"path": "/b"}]}"#,
        400,
        "bad request body: object matches none of the required: [\"pipeline\"]",
    );
    refused(
        br#"{"timeout": "200", "pipeline": [{"path": "/b"}]}"#,
        400,
        "bad request body: property \"timeout\" validation failed: wrong type: expected integer, got string",
    );
    refused(
        br#"{"pipeline": [{"path": "/c", "method": "put"}]}"#,
        400,
        "bad request body: property \"pipeline\" validation failed: failed to validate item 1: property \"method\" validation failed: matches none of the enum values",
    );
    refused(
        br#"{"pipeline": []}"#,
        400,
        "bad request body: property \"pipeline\" validation failed: expect array to have at least 1 items",
    );
    refused(
        br#"{"pipeline": [{"path": "/b"}, {"path": "/b"}, {"path": "/b"}]}"#,
        400,
        "too many pipeline requests, 3 exceeds the maximum of 2",
    );
    refused(
        &b"1234".repeat(1024),
        413,
        "request size 4096 is greater than the maximum size 2048 allowed",
    );
    // Without a length the body is read, and its own size reported.
    let mut raw = b"POST /apisix/batch-requests HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    for _ in 0..3 {
        raw.extend_from_slice(b"400\r\n");
        raw.extend_from_slice(&[b'1'; 0x400]);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    let r = request_raw(gw.addr(), &raw);
    assert_eq!(r.status, 413);
    assert_eq!(
        r.json(),
        json!({"error_msg": "request size 3072 is greater than the maximum size 2048 allowed"})
    );
    assert_eq!(up.hits(), 0);
    // Only POST is the API.
    assert_eq!(get(gw.addr(), "/apisix/batch-requests").status, 404);
}

#[test]
fn a_slow_entry_is_apisix_s_504_and_the_others_answer() {
    let up = Upstream::start("up", Behaviour::DelayPath("/slow", Duration::from_secs(3)));
    let conf = json!({
        "routes": [
            {"id": "batch", "uri": "/apisix/batch-requests", "plugins": {"public-api": {}}},
            route("fast", "/fast", json!({}), &up),
            route("slow", "/slow", json!({}), &up),
        ]
    });
    let gw = Gateway::start(&conf.to_string());
    let r = batch(
        &gw,
        &[],
        &json!({"timeout": 300, "pipeline": [
            {"path": "/fast"}, {"path": "/slow"}, {"path": "/fast", "method": "HEAD"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let list = r.json();
    assert_eq!(list[0]["status"], 200);
    assert_eq!(
        list[1],
        json!({"status": 504, "reason": "upstream timeout"})
    );
    assert_eq!(list[2]["status"], 200);
    // A HEAD answer has no body.
    assert!(list[2].get("body").is_none(), "{}", list[2]);
}

#[test]
fn the_batch_api_moves_with_plugin_attr_and_follows_its_metadata() {
    let up = Upstream::start("up", Behaviour::Echo);
    let metrics = free_port();
    let routes = |max_items: u64| {
        json!({
            "routes": [
                {"id": "default", "uri": "/apisix/batch-requests", "plugins": {"public-api": {}}},
                {"id": "moved", "uri": "/foo/bar", "plugins": {"public-api": {}}},
                {"id": "aliased", "uri": "/br",
                 "plugins": {"public-api": {"uri": "/foo/bar"}}},
                route("b", "/b", json!({}), &up),
            ],
            "plugin_metadata": [{"id": "batch-requests", "max_pipeline_items": max_items}]
        })
        .to_string()
    };
    let gw = Gateway::start_with(
        &routes(5),
        &format!(
            "plugin_attr:\n  prometheus:\n    export_addr:\n      ip: 127.0.0.1\n      port: {metrics}\n  batch-requests:\n    uri: /foo/bar\n"
        ),
    );
    let doc = json!({"pipeline": [{"path": "/b"}, {"path": "/b"}]}).to_string();
    let post = |path: &str| request(gw.addr(), "POST", path, &[], doc.as_bytes());
    assert_eq!(post("/apisix/batch-requests").status, 404);
    let r = post("/foo/bar");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json().as_array().unwrap().len(), 2);
    assert_eq!(post("/br").status, 200);

    // New metadata reaches the API without a change to its routes.
    gw.rewrite_routes(&routes(1));
    let refused =
        crate::support::poll_until(Duration::from_secs(10), || post("/foo/bar").status == 400);
    assert!(
        refused.is_some(),
        "the new max_pipeline_items was not applied"
    );
    assert_eq!(
        post("/foo/bar").json(),
        json!({"error_msg": "too many pipeline requests, 2 exceeds the maximum of 1"})
    );
}

/// One request the wolf stand-in got.
#[derive(Clone, Debug)]
struct WolfCall {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl WolfCall {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A wolf server on a random port answering `login.rest`, `access_check`, `user_info` and
/// `change_pwd` as wolf documents them (and as APISIX's test server answers): user `admin`,
/// password `123456`, token `wolf-rbac-token`.
struct Wolf {
    addr: SocketAddr,
    calls: Arc<Mutex<Vec<WolfCall>>>,
}

impl Wolf {
    fn start() -> Wolf {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let log = calls.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let log = log.clone();
                std::thread::spawn(move || serve_wolf(stream, &log));
            }
        });
        Wolf { addr, calls }
    }

    fn server(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn calls(&self) -> Vec<WolfCall> {
        self.calls.lock().unwrap().clone()
    }
}

fn read_call(s: &mut TcpStream) -> Option<WolfCall> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        let n = s.read(&mut chunk).ok().filter(|n| *n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let method = request_line.next()?.to_owned();
    let target = request_line.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        let n = s.read(&mut chunk).ok().filter(|n| *n > 0)?;
        body.extend_from_slice(&chunk[..n]);
    }
    Some(WolfCall {
        method,
        target,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn serve_wolf(mut s: TcpStream, log: &Mutex<Vec<WolfCall>>) {
    let Some(call) = read_call(&mut s) else {
        return;
    };
    log.lock().unwrap().push(call.clone());
    let (path, query) = call.target.split_once('?').unwrap_or((&call.target, ""));
    let arg = |name: &str| {
        query.split('&').find_map(|p| {
            let (k, v) = p.split_once('=')?;
            (k == name).then(|| v.replace("%2F", "/"))
        })
    };
    let args: Value = serde_json::from_str(&call.body).unwrap_or(Value::Null);
    let token_ok = call.header("x-rbac-token") == Some("wolf-rbac-token");
    let user = json!({"nickname": "administrator", "username": "admin", "id": "100"});
    let (status, answer) = match path {
        "/wolf/rbac/login.rest" => {
            let answer = if args.get("username").is_none() {
                json!({"ok": false, "reason": "ERR_USERNAME_MISSING"})
            } else if args.get("password").is_none() {
                json!({"ok": false, "reason": "ERR_PASSWORD_MISSING"})
            } else if args["username"] != "admin" {
                json!({"ok": false, "reason": "ERR_USER_NOT_FOUND"})
            } else if args["password"] != "123456" {
                json!({"ok": false, "reason": "ERR_PASSWORD_ERROR"})
            } else {
                json!({"ok": true, "data": {"token": "wolf-rbac-token", "userInfo": user}})
            };
            (200, answer)
        }
        "/wolf/rbac/access_check" if !token_ok => {
            (401, json!({"ok": false, "reason": "ERR_TOKEN_INVALID"}))
        }
        "/wolf/rbac/access_check" => match arg("resName").as_deref() {
            Some("/hello") => (200, json!({"ok": true, "data": {"userInfo": user}})),
            Some("/hello/no_userinfo") => (200, json!({"ok": true, "data": {}})),
            Some("/hello/500") => (500, json!({"ok": false, "reason": "ERR_SERVER_ERROR"})),
            _ => (403, json!({"ok": false, "reason": "ERR_ACCESS_DENIED"})),
        },
        "/wolf/rbac/user_info" if token_ok => {
            (200, json!({"ok": true, "data": {"userInfo": user}}))
        }
        "/wolf/rbac/change_pwd" if token_ok && args["oldPassword"] == "123456" => {
            (200, json!({"ok": true, "data": {}}))
        }
        "/wolf/rbac/change_pwd" => (
            200,
            json!({"ok": false, "reason": "ERR_OLD_PASSWORD_INCORRECT"}),
        ),
        _ => (200, json!({"ok": false, "reason": "ERR_TOKEN_INVALID"})),
    };
    let body = answer.to_string();
    let _ = write!(
        s,
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

fn wolf_gateway(wolf: &Wolf, up: &Upstream) -> Gateway {
    let mut routes = vec![
        json!({"id": "hello", "uris": ["/hello*", "/wolf/rbac/*"],
               "plugins": {"wolf-rbac": {}}, "upstream": {"nodes": {up.node(): 1}}}),
        json!({"id": "prefixed", "uri": "/prefixed",
               "plugins": {"wolf-rbac": {}}, "upstream": {"nodes": {up.node(): 1}}}),
    ];
    for api in ["login", "user_info", "change_pwd"] {
        routes.push(json!({"id": format!("wolf-{api}"),
                           "uri": format!("/apisix/plugin/wolf-rbac/{api}"),
                           "plugins": {"public-api": {}}}));
    }
    let conf = json!({
        "routes": routes,
        "consumers": [
            {"username": "wolf_rbac_unit_test",
             "plugins": {"wolf-rbac": {"appid": "wolf-rbac-app", "server": wolf.server()}}},
            {"username": "wolf_prefixed",
             "plugins": {"wolf-rbac": {"appid": "wolf-prefixed-app", "server": wolf.server(),
                                        "header_prefix": "X-Wolf-"},
                         "echo": {"body": "consumer merge echo plugins\n"}}},
            {"username": "wolf_down",
             "plugins": {"wolf-rbac": {"appid": "wolf-down-app",
                                        "server": format!("http://{}", crate::support::dead_node())}}}
        ]
    });
    Gateway::start(&conf.to_string())
}

const FORM: (&str, &str) = ("Content-Type", "application/x-www-form-urlencoded");
const TOKEN: &str = "V1#wolf-rbac-app#wolf-rbac-token";

#[test]
fn wolf_rbac_login_answers_the_rbac_token() {
    let wolf = Wolf::start();
    let up = Upstream::start("up", Behaviour::Echo);
    let gw = wolf_gateway(&wolf, &up);
    let login = |headers: &[(&str, &str)], body: &str| {
        let r = request(
            gw.addr(),
            "POST",
            "/apisix/plugin/wolf-rbac/login",
            headers,
            body.as_bytes(),
        );
        (r.status, r.text())
    };
    let said = |msg: &str| format!("{{\"message\":\"{msg}\"}}\n");
    assert_eq!(
        login(&[FORM], "username=admin&password=123456"),
        (400, said("appid is missing"))
    );
    assert_eq!(
        login(&[FORM], "appid=not-found&username=admin&password=123456"),
        (400, said("appid not found"))
    );
    let failed = (200, said("request to wolf-server failed!"));
    assert_eq!(
        login(&[FORM], "appid=wolf-rbac-app&password=123456"),
        failed
    );
    assert_eq!(login(&[FORM], "appid=wolf-rbac-app&username=admin"), failed);
    assert_eq!(
        login(
            &[FORM],
            "appid=wolf-rbac-app&username=admin&password=wrong-password"
        ),
        failed
    );
    let (status, text) = login(
        &[("Content-Type", "application/json")],
        r#"{"appid": "wolf-rbac-app", "username": "admin", "password": "123456"}"#,
    );
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        json!({"rbac_token": TOKEN,
               "user_info": {"nickname": "administrator", "username": "admin", "id": "100"}})
    );
    let (status, text) = login(&[("Content-Type", "application/json")], "{not json");
    assert_eq!((status, text), (400, said("invalid request")));

    // What wolf got: the client's fields as JSON.
    let calls = wolf.calls();
    let last = calls.last().unwrap();
    assert_eq!(
        (last.method.as_str(), last.target.as_str()),
        ("POST", "/wolf/rbac/login.rest")
    );
    assert_eq!(
        last.header("content-type"),
        Some("application/json; charset=utf-8")
    );
    assert_eq!(
        serde_json::from_str::<Value>(&last.body).unwrap(),
        json!({"appid": "wolf-rbac-app", "username": "admin", "password": "123456"})
    );
    assert_eq!(up.hits(), 0);
}

#[test]
fn wolf_rbac_checks_every_request_with_wolf() {
    let wolf = Wolf::start();
    let up = Upstream::start("up", Behaviour::Echo);
    let gw = wolf_gateway(&wolf, &up);
    let said = |msg: &str| format!("{{\"message\":\"{msg}\"}}\n");
    let call = |path: &str, headers: &[(&str, &str)]| request(gw.addr(), "GET", path, headers, b"");

    let r = call("/hello", &[]);
    assert_eq!(
        (r.status, r.text()),
        (401, said("Missing rbac token in request"))
    );
    let r = call("/hello", &[("x-rbac-token", "invalid-rbac-token")]);
    assert_eq!(
        (r.status, r.text()),
        (401, said("invalid rbac token: parse failed"))
    );
    let r = call("/hello", &[("x-rbac-token", "V1#invalid-appid#rbac-token")]);
    assert_eq!(
        (r.status, r.text()),
        (401, said("Invalid appid in rbac token"))
    );
    let r = call("/hello1", &[("x-rbac-token", TOKEN)]);
    assert_eq!((r.status, r.text()), (403, said("ERR_ACCESS_DENIED")));
    let r = call(
        "/hello/401",
        &[("x-rbac-token", "V1#wolf-rbac-app#expired")],
    );
    assert_eq!((r.status, r.text()), (401, said("ERR_TOKEN_INVALID")));
    let before = wolf.calls().len();
    let r = call("/hello/500", &[("x-rbac-token", TOKEN)]);
    assert_eq!(
        (r.status, r.text()),
        (500, said("request to wolf-server failed, status:500"))
    );
    assert_eq!(wolf.calls().len() - before, 3, "a 5xx is tried three times");
    let r = call(
        "/hello",
        &[("x-rbac-token", "V1#wolf-down-app#wolf-rbac-token")],
    );
    assert_eq!(r.status, 500);
    assert!(
        r.text()
            .starts_with("{\"message\":\"request to wolf-server failed, err:"),
        "{}",
        r.text()
    );
    assert_eq!(up.hits(), 0);

    // The token in each place APISIX reads it from.
    let places: [(&str, Vec<(&str, &str)>); 4] = [
        (
            "/hello?rbac_token=V1%23wolf-rbac-app%23wolf-rbac-token",
            vec![],
        ),
        ("/hello", vec![("Authorization", TOKEN)]),
        ("/hello", vec![("x-rbac-token", TOKEN)]),
        (
            "/hello",
            vec![("Cookie", "x-rbac-token=V1#wolf-rbac-app#wolf-rbac-token")],
        ),
    ];
    for (path, headers) in places {
        let mut headers = headers;
        headers.push(("X-UserId", "spoofid007"));
        let r = call(path, &headers);
        assert_eq!(r.status, 200, "{path} {headers:?}: {}", r.text());
        assert_eq!(r.header("x-userid"), Some("100"));
        assert_eq!(r.header("x-username"), Some("admin"));
        assert_eq!(r.header("x-nickname"), Some("administrator"));
        let echo = r.json();
        assert_eq!(echo["headers"]["x-userid"], "100");
        assert_eq!(echo["headers"]["x-username"], "admin");
        assert_eq!(echo["headers"]["x-nickname"], "administrator");
        assert_eq!(
            echo["headers"]["x-consumer-username"],
            "wolf_rbac_unit_test"
        );
    }
    let check = wolf
        .calls()
        .into_iter()
        .rfind(|c| c.target.starts_with("/wolf/rbac/access_check"))
        .unwrap();
    assert_eq!(check.method, "GET");
    assert_eq!(check.header("x-rbac-token"), Some("wolf-rbac-token"));
    assert_eq!(
        check.target,
        "/wolf/rbac/access_check?appID=wolf-rbac-app&resName=%2Fhello&action=GET&clientIP=127.0.0.1"
    );

    // Allowed without user info: a client's own identity headers do not reach the upstream.
    let r = call(
        "/hello/no_userinfo",
        &[
            ("Authorization", TOKEN),
            ("X-UserId", "spoofid007"),
            ("X-Username", "spoofadmin"),
        ],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!r.text().contains("spoof"), "{}", r.text());

    // `header_prefix` names the headers; the consumer's own plugins run once it is known.
    let r = call(
        "/hello",
        &[("x-rbac-token", "V1#wolf-prefixed-app#wolf-rbac-token")],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-wolf-userid"), Some("100"));
    assert_eq!(r.header("x-wolf-username"), Some("admin"));
    assert_eq!(r.text(), "consumer merge echo plugins\n");
}

#[test]
fn wolf_rbac_user_info_and_change_pwd_relay_to_wolf() {
    let wolf = Wolf::start();
    let up = Upstream::start("up", Behaviour::Echo);
    let gw = wolf_gateway(&wolf, &up);
    let said = |msg: &str| format!("{{\"message\":\"{msg}\"}}\n");
    let cookie = ("Cookie", "x-rbac-token=V1#wolf-rbac-app#wolf-rbac-token");

    let r = get(gw.addr(), "/apisix/plugin/wolf-rbac/user_info");
    assert_eq!(
        (r.status, r.text()),
        (401, said("Missing rbac token in request"))
    );
    let r = request(
        gw.addr(),
        "GET",
        "/apisix/plugin/wolf-rbac/user_info",
        &[("x-rbac-token", "invalid-rbac-token")],
        b"",
    );
    assert_eq!(
        (r.status, r.text()),
        (401, said("invalid rbac token: parse failed"))
    );
    let r = request(
        gw.addr(),
        "GET",
        "/apisix/plugin/wolf-rbac/user_info",
        &[cookie],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"user_info": {"username": "admin", "id": "100", "nickname": "administrator"}})
    );
    let asked = wolf.calls().last().cloned().unwrap();
    assert_eq!(asked.target, "/wolf/rbac/user_info");
    assert_eq!(asked.header("x-rbac-token"), Some("wolf-rbac-token"));

    let change = |headers: &[(&str, &str)], body: &str| {
        let r = request(
            gw.addr(),
            "PUT",
            "/apisix/plugin/wolf-rbac/change_pwd",
            headers,
            body.as_bytes(),
        );
        (r.status, r.text())
    };
    let json_type = ("Content-Type", "application/json");
    assert_eq!(
        change(
            &[json_type, cookie],
            r#"{"oldPassword": "error", "newPassword": "abcdef"}"#
        ),
        (200, said("request to wolf-server failed!"))
    );
    let success = (200, said("success to change password"));
    assert_eq!(
        change(
            &[json_type, cookie],
            r#"{"oldPassword": "123456", "newPassword": "abcdef"}"#
        ),
        success
    );
    // A form body, with more than a hundred fields.
    let mut form: String = (1..=100).map(|i| format!("test{i}=test&")).collect();
    form.push_str("oldPassword=123456&newPassword=abcdef");
    assert_eq!(change(&[cookie], &form), success);
    let asked = wolf.calls().last().cloned().unwrap();
    assert_eq!(
        (asked.method.as_str(), asked.target.as_str()),
        ("POST", "/wolf/rbac/change_pwd")
    );
    let sent: Value = serde_json::from_str(&asked.body).unwrap();
    assert_eq!(sent["newPassword"], "abcdef");
    assert_eq!(sent["test100"], "test");
    assert_eq!(
        change(&[json_type], r#"{"oldPassword": "123456"}"#),
        (401, said("Missing rbac token in request"))
    );
}
