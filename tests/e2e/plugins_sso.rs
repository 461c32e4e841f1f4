//! Single sign-on through the gateway. openid-connect's relying-party login flow against a
//! real OpenID provider: npm's `oidc-provider` (which `scripts/test.sh` installs into
//! `tests/oidc/node_modules`), run by `tests/oidc/provider.mjs` on a random port with one
//! client; its interaction step logs "alice" in and consents at once. cas-auth against an
//! in-test CAS server. The tests are the browser: they follow each redirect by hand and keep
//! the cookies each side sets.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

use crate::support::debian::require;
use crate::support::{free_port, poll_until, request, Behaviour, Gateway, Reply, Upstream};

const CLIENT_SECRET: &str = "s3cret-of-the-gateway-client";
const SESSION_SECRET: &str = "a-session-secret-of-32-characters";

/// The provider process, killed on drop.
struct Provider {
    child: Child,
    port: u16,
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Provider {
    fn start(port: u16, redirect_uris: &[String], post_logout: &str) -> Provider {
        let node = require("node");
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/oidc");
        assert!(
            dir.join("node_modules/oidc-provider/package.json")
                .is_file(),
            "oidc-provider is not installed in tests/oidc: run scripts/test.sh, which installs it"
        );
        let child = Command::new(node)
            .current_dir(&dir)
            .arg("provider.mjs")
            .arg(port.to_string())
            .arg("gw")
            .arg(CLIENT_SECRET)
            .arg(redirect_uris.join(","))
            .arg(post_logout)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let provider = Provider { child, port };
        let up = poll_until(Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        assert!(up.is_some(), "oidc-provider did not start");
        provider
    }

    fn issuer(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// A browser: a cookie jar (127.0.0.1's cookies, whatever the port, as browsers keep them).
#[derive(Default, Clone)]
struct Browser {
    jar: HashMap<String, String>,
}

fn split_url(url: &str) -> (SocketAddr, String) {
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let addr = authority.parse().expect("a 127.0.0.1:<port> URL");
    (
        addr,
        if path.is_empty() {
            "/".into()
        } else {
            path.into()
        },
    )
}

impl Browser {
    fn cookie_header(&self) -> String {
        self.jar
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn keep(&mut self, reply: &Reply) {
        for (name, value) in &reply.headers {
            if !name.eq_ignore_ascii_case("set-cookie") {
                continue;
            }
            let pair = value.split(';').next().unwrap();
            let (k, v) = pair.split_once('=').unwrap();
            let gone = value.contains("Max-Age=0")
                || value
                    .to_ascii_lowercase()
                    .contains("expires=thu, 01 jan 1970");
            if gone || v.is_empty() {
                self.jar.remove(k);
            } else {
                self.jar.insert(k.to_owned(), v.to_owned());
            }
        }
    }

    fn send(&mut self, method: &str, url: &str, extra: &[(&str, &str)], body: &[u8]) -> Reply {
        let (addr, path) = split_url(url);
        let host = addr.to_string();
        let cookies = self.cookie_header();
        let mut headers = vec![("Host", host.as_str())];
        if !cookies.is_empty() {
            headers.push(("Cookie", cookies.as_str()));
        }
        headers.extend_from_slice(extra);
        let reply = request(addr, method, &path, &headers, body);
        self.keep(&reply);
        reply
    }

    fn get(&mut self, url: &str) -> Reply {
        self.send("GET", url, &[], b"")
    }

    /// Follows redirects until an answer that is not one, or one to a URL `stop` accepts.
    fn follow(&mut self, mut url: String, stop: impl Fn(&str) -> bool) -> (String, Reply) {
        for _ in 0..20 {
            let reply = self.get(&url);
            if !(300..400).contains(&reply.status) {
                return (url, reply);
            }
            let next = reply
                .header("location")
                .expect("a redirect's Location")
                .to_owned();
            let next = if next.starts_with('/') {
                let (addr, _) = split_url(&url);
                format!("http://{addr}{next}")
            } else {
                next
            };
            if stop(&next) {
                return (next, reply);
            }
            url = next;
        }
        panic!("too many redirects from {url}");
    }
}

fn query_param(url: &str, name: &str) -> Option<String> {
    let query = url.split_once('?')?.1;
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == name).then(|| percent_decode(v))
    })
}

fn percent_decode(v: &str) -> String {
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn b64_json(v: &str) -> Value {
    let raw = base64::engine::general_purpose::STANDARD.decode(v).unwrap();
    serde_json::from_slice(&raw).unwrap()
}

#[test]
fn openid_connect_login_flow_against_oidc_provider() {
    let up = Upstream::start("up", Behaviour::Echo);
    let op_port = free_port();
    let discovery = format!("http://127.0.0.1:{op_port}/.well-known/openid-configuration");
    let plugin = |extra: Value| {
        let mut conf = json!({
            "client_id": "gw", "client_secret": CLIENT_SECRET, "discovery": discovery,
            "scope": "openid email profile", "use_pkce": true, "use_nonce": true,
            "set_refresh_token_header": true, "set_raw_id_token_header": true,
            "post_logout_redirect_uri": "http://127.0.0.1:1/bye",
            "session": {"secret": SESSION_SECRET}
        });
        for (k, v) in extra.as_object().unwrap() {
            conf[k] = v.clone();
        }
        conf
    };
    let conf = json!({"routes": [
        {"id": "app", "uris": ["/app", "/app/*", "/logout"],
         "plugins": {"openid-connect": plugin(json!({}))},
         "upstream": {"nodes": {up.node(): 1}}},
        // Refreshes on every request: the token's lifetime is all leeway.
        {"id": "renew", "uris": ["/renew", "/renew/*"],
         "plugins": {"openid-connect": plugin(json!({"access_token_expires_leeway": 3600}))},
         "upstream": {"nodes": {up.node(): 1}}},
        // Another secret: the first route's cookie is foreign here.
        {"id": "other", "uris": ["/other", "/other/*"],
         "plugins": {"openid-connect": plugin(json!({
             "session": {"secret": "another-secret-of-32-characters!!"}}))},
         "upstream": {"nodes": {up.node(): 1}}},
        {"id": "deny", "uri": "/deny",
         "plugins": {"openid-connect": plugin(json!({"unauth_action": "deny"}))},
         "upstream": {"nodes": {up.node(): 1}}}
    ]});
    let gw = Gateway::start(&conf.to_string());
    let base = format!("http://{}", gw.addr());
    let op = Provider::start(
        op_port,
        &[
            format!("{base}/app/page/.apisix/redirect"),
            format!("{base}/renew/.apisix/redirect"),
            format!("{base}/other/.apisix/redirect"),
        ],
        "http://127.0.0.1:1/bye",
    );

    // Without a session: off to the provider, with state, nonce and the PKCE challenge. The
    // redirect URI is APISIX's default: the request's path and `/.apisix/redirect`.
    let mut browser = Browser::default();
    let r = browser.get(&format!("{base}/app/page?x=1"));
    assert_eq!(r.status, 302, "{}", r.text());
    let to_op = r.header("location").unwrap().to_owned();
    assert!(
        to_op.starts_with(&format!("{}/auth?", op.issuer())),
        "{to_op}"
    );
    assert_eq!(query_param(&to_op, "client_id").as_deref(), Some("gw"));
    assert_eq!(
        query_param(&to_op, "response_type").as_deref(),
        Some("code")
    );
    assert_eq!(
        query_param(&to_op, "redirect_uri"),
        Some(format!("{base}/app/page/.apisix/redirect"))
    );
    assert_eq!(
        query_param(&to_op, "code_challenge_method").as_deref(),
        Some("S256")
    );
    assert!(query_param(&to_op, "nonce").is_some());
    let state = query_param(&to_op, "state").unwrap();
    assert_eq!(
        r.header("cache-control"),
        Some("no-cache, no-store, max-age=0")
    );
    let set = r.header("set-cookie").unwrap();
    assert!(
        set.starts_with("session=") && set.ends_with("; Path=/; SameSite=Lax; HttpOnly"),
        "{set}"
    );
    let pending = browser.clone();

    // The provider logs in and consents, then sends the browser back with the code.
    let (callback, _) = browser.follow(to_op.clone(), |u| u.starts_with(&base));
    assert!(callback.starts_with(&format!("{base}/app/page/.apisix/redirect?")));
    assert_eq!(query_param(&callback, "state"), Some(state));
    let r = browser.get(&callback);
    assert_eq!(r.status, 302, "{}", r.text());
    assert_eq!(r.header("location"), Some("/app/page?x=1"));

    // Signed in: the upstream gets the tokens and the userinfo.
    let r = browser.get(&format!("{base}/app/page?x=1"));
    assert_eq!(r.status, 200, "{}", r.text());
    let echo = r.json();
    let h = &echo["headers"];
    let access = h["x-access-token"]
        .as_str()
        .expect("an access token")
        .to_owned();
    let id = b64_json(h["x-id-token"].as_str().unwrap());
    assert_eq!(id["sub"], "alice");
    assert_eq!(id["aud"], "gw");
    assert_eq!(id["iss"], op.issuer().as_str());
    let user = b64_json(h["x-userinfo"].as_str().unwrap());
    assert_eq!(user["email"], "alice@example.com");
    assert!(h["x-refresh-token"].as_str().is_some());
    assert_eq!(
        h["x-raw-id-token"].as_str().unwrap().split('.').count(),
        3,
        "the ID token as the provider signed it"
    );
    // A client cannot send its own identity headers.
    let r = browser.send(
        "GET",
        &format!("{base}/app/page"),
        &[("X-Userinfo", "forged")],
        b"",
    );
    assert_ne!(r.json()["headers"]["x-userinfo"], "forged");
    // The access token is the provider's: its userinfo endpoint accepts it.
    let (op_addr, _) = split_url(&op.issuer());
    let bearer = format!("Bearer {access}");
    let r = request(
        op_addr,
        "GET",
        "/me",
        &[("Authorization", &bearer), ("Host", &op_addr.to_string())],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["sub"], "alice");

    // A tampered cookie opens no session: back to the provider.
    let mut tampered = browser.clone();
    let v = tampered.jar.get_mut("session").unwrap();
    let last = v.pop().unwrap();
    v.push(if last == 'A' { 'B' } else { 'A' });
    let r = tampered.get(&format!("{base}/app/page"));
    assert_eq!(r.status, 302);
    assert!(r.header("location").unwrap().starts_with(&op.issuer()));
    // So does a cookie sealed with another route's secret, and `deny` answers 401.
    let r = browser.clone().get(&format!("{base}/other"));
    assert_eq!(r.status, 302);
    assert!(r.header("location").unwrap().starts_with(&op.issuer()));
    assert_eq!(Browser::default().get(&format!("{base}/deny")).status, 401);
    assert_eq!(
        up.hits(),
        2,
        "only the signed-in requests reached the upstream"
    );

    // A callback whose state is not the session's restarts the flow (APISIX), never signs in.
    let mut forged = pending.clone();
    let r = forged.get(&format!(
        "{base}/app/.apisix/redirect?code=stolen&state=not-the-state"
    ));
    assert_eq!(r.status, 302);
    assert_eq!(r.header("location"), Some("/app/page?x=1"));
    // A callback without a session: 500.
    let r = Browser::default().get(&format!("{base}/app/.apisix/redirect?code=c&state=s"));
    assert_eq!(r.status, 500);

    // Refresh: every request on this route renews the access token with the refresh token.
    let mut renewing = Browser::default();
    let (callback, _) = renewing.follow(format!("{base}/renew"), |u| {
        u.starts_with(&format!("{base}/renew/.apisix/redirect"))
    });
    assert_eq!(renewing.get(&callback).status, 302);
    let first = renewing.get(&format!("{base}/renew"));
    assert_eq!(first.status, 200, "{}", first.text());
    assert!(
        first.header("set-cookie").is_some(),
        "the renewed session is saved"
    );
    let second = renewing.get(&format!("{base}/renew"));
    assert_eq!(second.status, 200);
    let token = |r: &Reply| r.json()["headers"]["x-access-token"].clone();
    assert!(token(&first).is_string());
    assert_ne!(
        token(&first),
        token(&second),
        "a new access token each time"
    );

    // Logout: the session cookie is expired and the browser goes to the end-session endpoint.
    let r = browser.get(&format!("{base}/logout"));
    assert_eq!(r.status, 302, "{}", r.text());
    assert!(
        !browser.jar.contains_key("session"),
        "the cookie is expired"
    );
    let end = r.header("location").unwrap().to_owned();
    assert!(
        end.starts_with(&format!("{}/session/end?", op.issuer())),
        "{end}"
    );
    assert_eq!(
        query_param(&end, "post_logout_redirect_uri").as_deref(),
        Some("http://127.0.0.1:1/bye")
    );
    let hint = query_param(&end, "id_token_hint").unwrap();
    assert_eq!(hint.split('.').count(), 3);
    // The provider accepts the hint and, once confirmed, returns to the post-logout URI.
    let page = browser.get(&end);
    assert_eq!(page.status, 200, "{}", page.text());
    let html = page.text();
    let xsrf = html
        .split("name=\"xsrf\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("the logout form's xsrf field")
        .to_owned();
    let form = format!("xsrf={xsrf}&logout=yes");
    let r = browser.send(
        "POST",
        &format!("{}/session/end/confirm", op.issuer()),
        &[("Content-Type", "application/x-www-form-urlencoded")],
        form.as_bytes(),
    );
    assert_eq!(r.status, 303, "{}", r.text());
    assert_eq!(r.header("location"), Some("http://127.0.0.1:1/bye"));
    // Signed out: the next request goes to the provider again.
    let r = browser.get(&format!("{base}/app/page"));
    assert_eq!(r.status, 302);
}

/// An in-test CAS server (the CAS protocol 3.0's `/login`, `/serviceValidate`, `/logout`): its
/// login logs "alice" in at once and sends the browser to the service with a ticket; a ticket
/// validates once, for the service it was issued to.
struct Cas {
    addr: SocketAddr,
    validations: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Cas {
    fn start() -> Cas {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let validations = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = validations.clone();
        std::thread::spawn(move || {
            let mut tickets: HashMap<String, String> = HashMap::new();
            let mut next = 0;
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let target = head.split(' ').nth(1).unwrap_or("/").to_owned();
                let path = target.split('?').next().unwrap().to_owned();
                let (status, location, body) = match path.as_str() {
                    "/login" => {
                        next += 1;
                        let ticket = format!("ST-{next}-cas");
                        let service = query_param(&target, "service").unwrap_or_default();
                        tickets.insert(ticket.clone(), service.clone());
                        (302, format!("{service}?ticket={ticket}"), String::new())
                    }
                    "/serviceValidate" => {
                        seen.lock().unwrap().push(target.clone());
                        let ticket = query_param(&target, "ticket").unwrap_or_default();
                        let service = query_param(&target, "service").unwrap_or_default();
                        let ok = tickets.remove(&ticket).is_some_and(|s| s == service);
                        let body = if ok {
                            "<cas:serviceResponse xmlns:cas=\"http://www.yale.edu/tp/cas\">\n \
                             <cas:authenticationSuccess>\n  <cas:user>alice</cas:user>\n \
                             </cas:authenticationSuccess>\n</cas:serviceResponse>\n"
                        } else {
                            "<cas:serviceResponse xmlns:cas=\"http://www.yale.edu/tp/cas\">\n \
                             <cas:authenticationFailure code=\"INVALID_TICKET\">Ticket not \
                             recognized</cas:authenticationFailure>\n</cas:serviceResponse>\n"
                        };
                        (200, String::new(), body.to_owned())
                    }
                    _ => (200, String::new(), "logged out".to_owned()),
                };
                let mut reply =
                    format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\n", body.len());
                if !location.is_empty() {
                    reply.push_str(&format!("Location: {location}\r\n"));
                }
                reply.push_str("Connection: close\r\n\r\n");
                reply.push_str(&body);
                let _ = s.write_all(reply.as_bytes());
            }
        });
        Cas { addr, validations }
    }
}

#[test]
fn cas_auth_single_sign_on_with_an_in_test_cas_server() {
    let up = Upstream::start("up", Behaviour::Echo);
    let cas = Cas::start();
    let conf = json!({"routes": [{"id": "cas", "uris": ["/app/*", "/cas_callback", "/logout"],
        "plugins": {"cas-auth": {
            "idp_uri": format!("http://{}", cas.addr),
            "cas_callback_uri": "/cas_callback", "logout_uri": "/logout",
            "cookie": {"secret": "a-cookie-secret-of-32-characters", "secure": false}}},
        "upstream": {"nodes": {up.node(): 1}}}]});
    let gw = Gateway::start(&conf.to_string());
    let base = format!("http://{}", gw.addr());
    let service = format!("{base}/cas_callback");
    let mut browser = Browser::default();

    // No session: to the CAS login, the requested URI kept in a signed cookie.
    let r = browser.get(&format!("{base}/app/page?x=1"));
    assert_eq!(r.status, 302, "{}", r.text());
    let login = r.header("location").unwrap().to_owned();
    assert!(login.starts_with(&format!("http://{}/login?service=", cas.addr)));
    assert_eq!(query_param(&login, "service"), Some(service.clone()));
    let set = r.header("set-cookie").unwrap();
    assert!(set.starts_with("CAS_REQUEST_URI="), "{set}");
    assert!(set.ends_with("; Path=/; HttpOnly; SameSite=Lax"), "{set}");

    // A callback without the initiation cookie is refused.
    let r = Browser::default().get(&format!("{base}/cas_callback?ticket=ST-9-cas"));
    assert_eq!(r.status, 401);
    assert_eq!(r.text(), "{\"message\":\"invalid callback state\"}\n");
    // A forged initiation cookie (another secret) too.
    let mut forged = browser.clone();
    forged
        .jar
        .insert("CAS_REQUEST_URI".into(), "L2FkbWlu.AAAA".into());
    assert_eq!(
        forged
            .get(&format!("{base}/cas_callback?ticket=ST-9-cas"))
            .status,
        401
    );

    // CAS logs the user in and sends the ticket; the gateway validates it.
    let r = browser.get(&login);
    assert_eq!(r.status, 302);
    let callback = r.header("location").unwrap().to_owned();
    assert!(callback.starts_with(&format!("{service}?ticket=ST-")));
    let r = browser.get(&callback);
    assert_eq!(r.status, 302, "{}", r.text());
    assert_eq!(r.header("location"), Some("/app/page?x=1"));
    let validated = cas.validations.lock().unwrap().last().cloned().unwrap();
    assert_eq!(query_param(&validated, "service"), Some(service.clone()));
    let session = browser
        .jar
        .keys()
        .find(|k| k.starts_with("CAS_SESSION_"))
        .cloned()
        .expect("the session cookie");
    assert_eq!(session.len(), "CAS_SESSION_".len() + 64);
    assert!(!browser.jar.contains_key("CAS_REQUEST_URI"));

    // Signed in: the upstream is reached.
    let r = browser.get(&format!("{base}/app/page?x=1"));
    assert_eq!(r.status, 200, "{}", r.text());
    // The same ticket again (replayed callback): CAS refuses it.
    let mut replay = Browser::default();
    replay.get(&format!("{base}/app/other"));
    let r = replay.get(&callback);
    assert_eq!(r.status, 401);
    assert_eq!(r.text(), "{\"message\":\"invalid ticket\"}\n");
    // A made-up session id: back to CAS, the cookie cleared.
    let mut stranger = Browser::default();
    stranger.jar.insert(session.clone(), "ST-404-cas".into());
    let r = stranger.get(&format!("{base}/app/page"));
    assert_eq!(r.status, 302);
    assert!(r.header("location").unwrap().contains("/login?service="));

    // Single logout from CAS ends the session of that ticket.
    let mut other = Browser::default();
    let first = other.get(&format!("{base}/app/slo"));
    let (cb, _) = {
        let login = first.header("location").unwrap().to_owned();
        let r = other.get(&login);
        (r.header("location").unwrap().to_owned(), r)
    };
    assert_eq!(other.get(&cb).status, 302);
    assert_eq!(other.get(&format!("{base}/app/slo")).status, 200);
    let ticket = query_param(&cb, "ticket").unwrap();
    let slo = format!(
        "<samlp:LogoutRequest><samlp:SessionIndex>{ticket}</samlp:SessionIndex></samlp:LogoutRequest>"
    );
    let r = Browser::default().send("POST", &service, &[], slo.as_bytes());
    assert_eq!(r.status, 200);
    assert_eq!(other.get(&format!("{base}/app/slo")).status, 302);
    let r = Browser::default().send("POST", &service, &[], b"<nothing/>");
    assert_eq!(r.status, 400);
    assert_eq!(
        r.text(),
        "{\"message\":\"invalid logout request from IdP, no ticket\"}\n"
    );

    // Logout: the session ends and the browser goes to CAS's logout.
    let r = browser.get(&format!("{base}/logout"));
    assert_eq!(r.status, 302);
    assert_eq!(
        r.header("location"),
        Some(format!("http://{}/logout", cas.addr).as_str())
    );
    assert!(!browser.jar.contains_key(&session));
    assert_eq!(
        Browser::default().get(&format!("{base}/logout")).status,
        401
    );
    assert_eq!(up.hits(), 2, "only signed-in requests reached the upstream");
}

/// An in-test Casdoor (its OAuth API: `/login/oauth/authorize` logs in at once and redirects
/// with a code; `/api/login/oauth/access_token` exchanges a code for a token, checking the
/// client's credentials).
fn casdoor() -> SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut codes: Vec<String> = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut data = Vec::new();
            let mut byte = [0u8; 1];
            while !data.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
                data.push(byte[0]);
            }
            let head = String::from_utf8_lossy(&data).into_owned();
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap())
                })
                .unwrap_or(0);
            let mut body = vec![0u8; length];
            s.read_exact(&mut body).unwrap();
            let body = String::from_utf8_lossy(&body).into_owned();
            let target = head.split(' ').nth(1).unwrap_or("/").to_owned();
            let (status, location, answer) = if target.starts_with("/login/oauth/authorize") {
                let code = format!("code-{}", codes.len());
                codes.push(code.clone());
                let to = format!(
                    "{}?code={code}&state={}",
                    query_param(&target, "redirect_uri").unwrap(),
                    query_param(&target, "state").unwrap()
                );
                (302, to, String::new())
            } else {
                let form = format!("?{body}");
                let known = query_param(&form, "code").is_some_and(|c| codes.contains(&c));
                let client = query_param(&form, "client_id").as_deref() == Some("casdoor-app")
                    && query_param(&form, "client_secret").as_deref() == Some("casdoor-secret")
                    && query_param(&form, "grant_type").as_deref() == Some("authorization_code");
                let json = if known && client {
                    r#"{"access_token":"casdoor-token","expires_in":3600}"#
                } else {
                    r#"{"error":"invalid_grant"}"#
                };
                (200, String::new(), json.to_owned())
            };
            let mut reply = format!(
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n",
                answer.len()
            );
            if !location.is_empty() {
                reply.push_str(&format!("Location: {location}\r\n"));
            }
            reply.push_str("Connection: close\r\n\r\n");
            reply.push_str(&answer);
            let _ = s.write_all(reply.as_bytes());
        }
    });
    addr
}

#[test]
fn authz_casdoor_signs_in_with_an_in_test_casdoor() {
    let up = Upstream::start("up", Behaviour::Echo);
    let idp = casdoor();
    // Casdoor sends the browser to the callback URL's host, which the test maps to the gateway.
    let callback = "http://gw.test/anything/callback".to_owned();
    let conf = json!({"routes": [{"id": "casdoor", "uri": "/anything/*",
        "plugins": {"authz-casdoor": {
            "endpoint_addr": format!("http://{idp}"), "callback_url": callback,
            "client_id": "casdoor-app", "client_secret": "casdoor-secret"}},
        "upstream": {"nodes": {up.node(): 1}}}]});
    let gw = Gateway::start(&conf.to_string());
    let base = format!("http://{}", gw.addr());
    let mut browser = Browser::default();
    let r = browser.get(&format!("{base}/anything/page"));
    assert_eq!(r.status, 302, "{}", r.text());
    let to = r.header("location").unwrap().to_owned();
    assert!(
        to.starts_with(&format!("http://{idp}/login/oauth/authorize?")),
        "{to}"
    );
    assert_eq!(query_param(&to, "redirect_uri"), Some(callback.clone()));
    assert_eq!(query_param(&to, "scope").as_deref(), Some("read"));
    // A callback with another state is refused.
    let mut forged = browser.clone();
    let r = forged.get(&format!("{base}/anything/callback?code=code-0&state=1"));
    assert_eq!((r.status, r.text()), (400, "invalid state".to_owned()));
    let r = Browser::default().get(&format!("{base}/anything/callback?code=c&state=1"));
    assert_eq!(r.status, 503, "no session at the callback");
    // Casdoor signs in; the gateway exchanges the code and returns to the page.
    let r = browser.get(&to);
    let back = r
        .header("location")
        .unwrap()
        .replace("http://gw.test", &base);
    let r = browser.get(&back);
    assert_eq!(r.status, 302, "{}", r.text());
    assert_eq!(r.header("location"), Some("/anything/page"));
    let r = browser.get(&format!("{base}/anything/page"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(up.hits(), 1);
}

/// A one-request-per-connection HTTP server on 127.0.0.1 answering with `handler(head,
/// body)`: (status, JSON body).
fn serve(handler: impl Fn(&str, &str) -> (u16, String) + Send + 'static) -> SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut data = Vec::new();
            let mut byte = [0u8; 1];
            while !data.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
                data.push(byte[0]);
            }
            let head = String::from_utf8_lossy(&data).into_owned();
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap())
                })
                .unwrap_or(0);
            let mut body = vec![0u8; length];
            let _ = s.read_exact(&mut body);
            let (status, answer) = handler(&head, &String::from_utf8_lossy(&body));
            let reply = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                answer.len()
            );
            let _ = s.write_all(reply.as_bytes());
        }
    });
    addr
}

#[test]
fn dingtalk_and_feishu_sign_in_with_in_test_servers() {
    let up = Upstream::start("up", Behaviour::Echo);
    // DingTalk: the app token endpoint, then the user of a code (errcode 0 for "good-code").
    let dingtalk = serve(|head, body| {
        let body: Value = serde_json::from_str(body).unwrap_or(Value::Null);
        if head.starts_with("POST /token ") {
            let ok = body == json!({"appKey": "ding-app", "appSecret": "ding-secret"});
            let answer = if ok {
                json!({"accessToken": "app-token", "expireIn": 7200})
            } else {
                json!({})
            };
            (200, answer.to_string())
        } else if head.starts_with("POST /user?access_token=app-token ") {
            if body["code"] == "good-code" {
                (
                    200,
                    json!({"errcode": 0, "result": {"userid": "u1", "name": "Ding"}}).to_string(),
                )
            } else {
                (
                    200,
                    json!({"errcode": 40078, "errmsg": "invalid code"}).to_string(),
                )
            }
        } else {
            (404, "{}".into())
        }
    });
    // Feishu: a user token for "good-code" (with the app's credentials), then the user.
    let feishu = serve(|head, body| {
        let body: Value = serde_json::from_str(body).unwrap_or(Value::Null);
        if head.starts_with("POST /token ") {
            let ok = body["code"] == "good-code"
                && body["client_id"] == "cli-app"
                && body["client_secret"] == "cli-secret"
                && body["grant_type"] == "authorization_code"
                && body["redirect_uri"] == "https://app.example/feishu";
            if ok {
                (
                    200,
                    json!({"access_token": "user-token", "expires_in": 7200}).to_string(),
                )
            } else {
                (
                    400,
                    json!({"code": 20003, "error": "invalid_grant"}).to_string(),
                )
            }
        } else if head.starts_with("GET /user ") && head.contains("Bearer user-token") {
            (
                200,
                json!({"code": 0, "data": {"open_id": "ou_1", "name": "Fei"}}).to_string(),
            )
        } else {
            (
                200,
                json!({"code": 99991663, "msg": "bad token"}).to_string(),
            )
        }
    });
    let conf = json!({"routes": [
        {"id": "ding", "uri": "/ding", "plugins": {"dingtalk-auth": {
            "app_key": "ding-app", "app_secret": "ding-secret", "secret": "ding-session-key",
            "redirect_uri": "https://login.example/ding",
            "access_token_url": format!("http://{dingtalk}/token"),
            "userinfo_url": format!("http://{dingtalk}/user")}},
         "upstream": {"nodes": {up.node(): 1}}},
        {"id": "feishu", "uri": "/feishu", "plugins": {"feishu-auth": {
            "app_id": "cli-app", "app_secret": "cli-secret", "secret": "feishu-session-key",
            "auth_redirect_uri": "https://app.example/feishu",
            "redirect_uri": "https://login.example/feishu",
            "access_token_url": format!("http://{feishu}/token"),
            "userinfo_url": format!("http://{feishu}/user")}},
         "upstream": {"nodes": {up.node(): 1}}}
    ]});
    let gw = Gateway::start(&conf.to_string());
    let base = format!("http://{}", gw.addr());
    for (path, login, user_key, user) in [
        ("/ding", "https://login.example/ding", "userid", "u1"),
        ("/feishu", "https://login.example/feishu", "open_id", "ou_1"),
    ] {
        let mut browser = Browser::default();
        // No session, no code: to the login page.
        let r = browser.get(&format!("{base}{path}"));
        assert_eq!(
            (r.status, r.header("location")),
            (302, Some(login)),
            "{path}"
        );
        // A code the provider refuses.
        let r = browser.get(&format!("{base}{path}?code=bad-code"));
        assert_eq!(r.status, 401, "{path}: {}", r.text());
        assert_eq!(r.text(), "{\"message\":\"Invalid authorization code\"}\n");
        // The good code signs in: the upstream gets the user, the session is kept.
        let r = browser.send(
            "GET",
            &format!("{base}{path}?code=good-code"),
            &[("X-Userinfo", "forged")],
            b"",
        );
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        let info = b64_json(r.json()["headers"]["x-userinfo"].as_str().unwrap());
        assert_eq!(info[user_key], user);
        let r = browser.get(&format!("{base}{path}"));
        assert_eq!(r.status, 200, "{path}: the session carries the user");
        assert_eq!(
            b64_json(r.json()["headers"]["x-userinfo"].as_str().unwrap())[user_key],
            user
        );
        // A tampered session cookie is no session.
        let name = browser
            .jar
            .keys()
            .find(|k| k.ends_with("_session"))
            .unwrap()
            .clone();
        let mut tampered = browser.clone();
        let v = tampered.jar.get_mut(&name).unwrap();
        let last = v.pop().unwrap();
        v.push(if last == 'A' { 'B' } else { 'A' });
        assert_eq!(tampered.get(&format!("{base}{path}")).status, 302, "{path}");
    }
    assert_eq!(up.hits(), 4);
}
