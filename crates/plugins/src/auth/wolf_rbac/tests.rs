use std::net::SocketAddr;
use std::sync::Mutex;

use ferrisix_config::validate::PluginCheck;
use ferrisix_plugin_api::testing::TestRequest;
use ferrisix_plugin_api::Step;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::testing::{jack_and_anon, Compiler};

/// What the wolf stand-in was asked: method, path and query, the `x-rbac-token`, the body.
type Seen = Arc<Mutex<Vec<(String, String, String)>>>;

/// A wolf stand-in answering as APISIX's test server does (`t/lib/server.lua`): the access
/// check allows `/hello` with user info, answers 500 for `/hello/500` and 403 otherwise; the
/// token must be `wolf-rbac-token`.
async fn wolf() -> (SocketAddr, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let (head, body) = loop {
                    let n = s.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    let Some((head, body)) = text.split_once("\r\n\r\n") else {
                        continue;
                    };
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap_or(0);
                    if body.len() >= len {
                        break (head.to_owned(), body.to_owned());
                    }
                };
                let target = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                let token = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("x-rbac-token")
                            .then(|| v.trim().to_owned())
                    })
                    .unwrap_or_default();
                log.lock()
                    .unwrap()
                    .push((target.clone(), token.clone(), body));
                let res_name = target
                    .split_once("resName=")
                    .map(|(_, r)| r.split('&').next().unwrap_or("").to_owned())
                    .unwrap_or_default();
                let (status, answer) = if token != "wolf-rbac-token" {
                    (200, r#"{"ok":false,"reason":"ERR_TOKEN_INVALID"}"#)
                } else if res_name == "%2Fhello" {
                    (
                        200,
                        r#"{"ok":true,"data":{"userInfo":{"nickname":"administrator x","username":"admin","id":"100"}}}"#,
                    )
                } else if res_name == "%2Fhello%2F500" {
                    (500, r#"{"ok":false,"reason":"ERR_SERVER_ERROR"}"#)
                } else {
                    (403, r#"{"ok":false,"reason":"ERR_ACCESS_DENIED"}"#)
                };
                let resp = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                    answer.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    (addr, seen)
}

async fn rewrite(req: &mut TestRequest) -> Flow {
    let c = Compiler::new();
    let p = (DEF.compile)(&c.cx(NAME, &json!({}), "w", None)).unwrap();
    let mut ctx = req.ctx();
    let step = p.rewrite(&mut ctx);
    match step {
        Step::Done(flow) => flow,
        Step::Wait(f) => f.await,
    }
}

fn exit_of(flow: Flow) -> (u16, String) {
    match flow {
        Flow::Exit(e) => (
            e.status.as_u16(),
            String::from_utf8(e.body.map(|b| b.to_vec()).unwrap_or_default()).unwrap(),
        ),
        Flow::Continue => panic!("expected an exit"),
    }
}

fn consumers(server: &str) -> Arc<ferrisix_plugin_api::ConsumerIndex> {
    jack_and_anon(
        NAME,
        "wolf-rbac-app",
        json!({"appid": "wolf-rbac-app", "server": server, "header_prefix": "X-"}),
    )
}

#[test]
fn schema_defaults_and_messages() {
    let r = crate::PluginRegistry::builtin();
    let e = r.check(NAME, &json!({"appid": 123})).unwrap_err();
    assert!(
        e.contains("property \"appid\" validation failed: wrong type: expected string, got number"),
        "{e}"
    );
    assert!(r.check(NAME, &json!({"ssl_verify": "true"})).is_err());
    assert!(r.check(NAME, &json!({})).is_ok());
    let info = r.get(NAME).unwrap();
    assert_eq!(info.priority, 2555);
    let mut conf = json!({});
    ferrisix_config::schema::validate_and_fill(&info.schema, &mut conf).unwrap();
    assert_eq!(
        conf,
        json!({"appid": "unset", "server": "http://127.0.0.1:12180", "header_prefix": "X-"})
    );
}

#[test]
fn tokens() {
    assert_eq!(
        parse_token("V1#wolf-rbac-app#wolf-rbac-token"),
        Some(("wolf-rbac-app", "wolf-rbac-token"))
    );
    assert_eq!(parse_token("V1#app#a#b"), Some(("app", "a#b")));
    assert_eq!(parse_token("invalid-rbac-token"), None);
    assert_eq!(parse_token("V2#app#t"), None);
    assert_eq!(parse_token("V1#app"), None);
    assert_eq!(
        escape_uri("administrator x/é"),
        "administrator%20x%2F%C3%A9"
    );
}

#[test]
fn the_token_is_looked_for_where_apisix_looks() {
    let mut req = TestRequest::get("/hello?rbac_token=V1%23a%23q")
        .header("authorization", "V1#a#h")
        .header("x-rbac-token", "V1#a#x")
        .header("cookie", "x-rbac-token=V1#a#c");
    assert_eq!(fetch_token(&req.ctx()).as_deref(), Some("V1#a#q"));
    let mut req = TestRequest::get("/hello")
        .header("authorization", "V1#a#h")
        .header("x-rbac-token", "V1#a#x");
    assert_eq!(fetch_token(&req.ctx()).as_deref(), Some("V1#a#h"));
    let mut req = TestRequest::get("/hello")
        .header("x-rbac-token", "V1#a#x")
        .header("cookie", "x-rbac-token=V1#a#c");
    assert_eq!(fetch_token(&req.ctx()).as_deref(), Some("V1#a#x"));
    let mut req = TestRequest::get("/hello").header("cookie", "a=b; x-rbac-token=V1#a#c");
    assert_eq!(fetch_token(&req.ctx()).as_deref(), Some("V1#a#c"));
    assert_eq!(fetch_token(&TestRequest::get("/hello").ctx()), None);
}

#[tokio::test]
async fn refusals_before_wolf_is_asked() {
    let mut req = TestRequest::get("/hello");
    assert_eq!(
        exit_of(rewrite(&mut req).await),
        (
            401,
            "{\"message\":\"Missing rbac token in request\"}\n".into()
        )
    );
    let mut req = TestRequest::get("/hello").header("x-rbac-token", "invalid-rbac-token");
    assert_eq!(
        exit_of(rewrite(&mut req).await),
        (
            401,
            "{\"message\":\"invalid rbac token: parse failed\"}\n".into()
        )
    );
    let mut req = TestRequest::get("/hello").header("x-rbac-token", "V1#wolf-rbac-app#t");
    assert_eq!(
        exit_of(rewrite(&mut req).await),
        (401, "{\"message\":\"Missing related consumer\"}\n".into())
    );
    let mut req = TestRequest::get("/hello").header("x-rbac-token", "V1#invalid-appid#t");
    req.state.set_consumers(consumers("http://127.0.0.1:1"));
    assert_eq!(
        exit_of(rewrite(&mut req).await),
        (
            401,
            "{\"message\":\"Invalid appid in rbac token\"}\n".into()
        )
    );
}

#[tokio::test]
async fn wolf_decides() {
    let (addr, seen) = wolf().await;
    let server = format!("http://{addr}");
    // Allowed: the user headers go upstream and on the answer, the consumer is attached.
    let mut req = TestRequest::get("/hello")
        .from("192.0.2.10")
        .header("authorization", "V1#wolf-rbac-app#wolf-rbac-token")
        .header("x-userid", "spoofed");
    req.state.set_consumers(consumers(&server));
    assert_eq!(rewrite(&mut req).await, Flow::Continue);
    let ctx = req.ctx();
    assert_eq!(ctx.header("x-userid"), Some("100"));
    assert_eq!(ctx.header("x-username"), Some("admin"));
    assert_eq!(ctx.header("x-nickname"), Some("administrator%20x"));
    assert_eq!(ctx.response_headers()["x-userid"], "100");
    assert_eq!(ctx.response_headers()["x-nickname"], "administrator%20x");
    assert_eq!(ctx.consumer().unwrap().username, "jack");
    let (target, token, _) = seen.lock().unwrap()[0].clone();
    assert_eq!(token, "wolf-rbac-token");
    assert_eq!(
        target,
        "/wolf/rbac/access_check?appID=wolf-rbac-app&resName=%2Fhello&action=GET&clientIP=192.0.2.10"
    );

    // Refused: wolf's status and reason; client identity headers dropped all the same.
    let mut req = TestRequest::get("/hello1")
        .header("x-rbac-token", "V1#wolf-rbac-app#wolf-rbac-token")
        .header("x-username", "spoofadmin");
    req.state.set_consumers(consumers(&server));
    assert_eq!(
        exit_of(rewrite(&mut req).await),
        (403, "{\"message\":\"ERR_ACCESS_DENIED\"}\n".into())
    );
    assert_eq!(req.ctx().header("x-username"), None);

    // 5xx: retried three times, then APISIX's 500.
    seen.lock().unwrap().clear();
    let mut req =
        TestRequest::get("/hello/500").header("x-rbac-token", "V1#wolf-rbac-app#wolf-rbac-token");
    req.state.set_consumers(consumers(&server));
    assert_eq!(
        exit_of(rewrite(&mut req).await),
        (
            500,
            "{\"message\":\"request to wolf-server failed, status:500\"}\n".into()
        )
    );
    assert_eq!(seen.lock().unwrap().len(), 3);

    // Wolf is down.
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let mut req =
        TestRequest::get("/hello").header("x-rbac-token", "V1#wolf-rbac-app#wolf-rbac-token");
    req.state
        .set_consumers(consumers(&format!("http://{dead_addr}")));
    let (status, body) = exit_of(rewrite(&mut req).await);
    assert_eq!(status, 500);
    assert!(
        body.starts_with("{\"message\":\"request to wolf-server failed, err:"),
        "{body}"
    );
}

#[test]
fn failure_bodies_list_what_is_known() {
    assert_eq!(
        message_body(
            Some("ERR"),
            &[("username", Some(json!("admin"))), ("nickname", None)]
        ),
        "{\"message\":\"ERR\",\"username\":\"admin\"}\n"
    );
    assert_eq!(message_body(None, &[]), "{}\n");
}

#[test]
fn the_apis_need_consumers() {
    let list = apis(&PluginServices::default());
    let uris: Vec<&str> = list.iter().map(|a| a.uri.as_str()).collect();
    assert_eq!(
        uris,
        [
            "/apisix/plugin/wolf-rbac/login",
            "/apisix/plugin/wolf-rbac/change_pwd",
            "/apisix/plugin/wolf-rbac/user_info"
        ]
    );
    assert!(list[0].matches(&Method::POST, "/apisix/plugin/wolf-rbac/login"));
    assert!(list[1].matches(&Method::PUT, "/apisix/plugin/wolf-rbac/change_pwd"));
    assert!(list[2].matches(&Method::GET, "/apisix/plugin/wolf-rbac/user_info"));
    let ApiHandler::Request { plugin, make } = &list[0].handler else {
        panic!("login handles the whole request")
    };
    assert_eq!(*plugin, NAME);
    let handler = make(None, &Arc::new(PluginServices::default()));
    assert!(handler.needs_consumers());
}
