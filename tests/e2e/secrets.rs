//! Secret references end to end: a real ferrisix on its embedded store, `/secrets` written
//! through the Admin API, and in-test servers that follow each store's documented HTTP API
//! and check what the gateway sends: Vault's KV v1 and v2 (`GET /v1/<path>` with
//! `X-Vault-Token`), AWS Secrets Manager's JSON API (`POST /` with
//! `X-Amz-Target: secretsmanager.GetSecretValue`, the SigV4 signature computed again here,
//! independently of the gateway's code) and Google's token endpoint (the JWT-bearer
//! assertion verified with the test account's public key) and Secret Manager
//! (`versions/latest:access` with the bearer token).

use crate::support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use support::{
    free_port, poll_until, request, Behaviour, StoreGateway, StoreGatewayBuilder, Upstream,
};

/// One request an in-test store received.
#[derive(Clone, Debug)]
struct Req {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Req {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

type Handler = dyn Fn(&Req) -> (u16, String) + Send + Sync;

/// A threaded HTTP/1.1 server answering each request with `handler`, keeping what it got.
struct Server {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Req>>>,
}

impl Server {
    fn start(handler: Arc<Handler>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kept = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (handler, kept) = (handler.clone(), kept.clone());
                std::thread::spawn(move || serve(stream, &*handler, &kept));
            }
        });
        Server { addr, seen }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<Req> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve(mut s: TcpStream, handler: &Handler, seen: &Mutex<Vec<Req>>) {
    loop {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p;
            }
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let mut first = lines.next().unwrap_or("").split(' ');
        let method = first.next().unwrap_or("").to_owned();
        let path = first.next().unwrap_or("").to_owned();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect();
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = buf[head_end + 4..].to_vec();
        while body.len() < len {
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => body.extend_from_slice(&chunk[..n]),
            }
        }
        let req = Req {
            method,
            path,
            headers,
            body,
        };
        let (status, text) = handler(&req);
        seen.lock().unwrap().push(req);
        let answer = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
            text.len()
        );
        if s.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// Short cache lifetimes, so rotations and recoveries are seen within the test.
const LRU: &str = "lru:\n  secret:\n    ttl: 1\n    neg_ttl: 1";

fn gateway(envs: &[(&str, &str)], apisix_keys: &str) -> StoreGateway {
    let mut b = StoreGatewayBuilder::embedded()
        .apisix_key(LRU)
        .log_filter("info");
    if !apisix_keys.is_empty() {
        b = b.apisix_key(apisix_keys);
    }
    for (k, v) in envs {
        b = b.env(k, v);
    }
    b.start()
}

fn put(gw: &StoreGateway, path: &str, body: &Value) {
    let r = gw.admin("PUT", path, &body.to_string());
    assert!(
        r.status == 200 || r.status == 201,
        "{path}: {} {}",
        r.status,
        r.text()
    );
}

fn with_key(gw: &StoreGateway, path: &str, key: &str) -> support::Reply {
    request(gw.data_addr(), "GET", path, &[("apikey", key)], b"")
}

fn wait_status(gw: &StoreGateway, path: &str, key: &str, status: u16) {
    let got = poll_until(Duration::from_secs(20), || {
        with_key(gw, path, key).status == status
    });
    assert!(
        got.is_some(),
        "{path} with {key} never answered {status}; log:\n{}",
        gw.log_text()
    );
}

/// Vault's KV engines: v1 at `kv/`, v2 at `kv2/` (`kv2/data/<path>` answers
/// `data.data`), both behind the token `root-token`; `up` off answers 503.
struct Vault {
    server: Server,
    kv: Arc<Mutex<HashMap<String, Value>>>,
    up: Arc<AtomicBool>,
}

fn vault() -> Vault {
    let kv: Arc<Mutex<HashMap<String, Value>>> = Arc::default();
    let up = Arc::new(AtomicBool::new(true));
    let (store, on) = (kv.clone(), up.clone());
    let server = Server::start(Arc::new(move |req: &Req| {
        if !on.load(Ordering::SeqCst) {
            return (503, r#"{"errors":["Vault is sealed"]}"#.into());
        }
        if req.method != "GET" || req.header("x-vault-token") != Some("root-token") {
            return (403, r#"{"errors":["permission denied"]}"#.into());
        }
        let Some(path) = req.path.strip_prefix("/v1/") else {
            return (404, r#"{"errors":[]}"#.into());
        };
        let kv = store.lock().unwrap();
        if let Some(rest) = path.strip_prefix("kv2/data/") {
            return match kv.get(&format!("kv2/{rest}")) {
                Some(v) => (
                    200,
                    json!({"data": {"data": v, "metadata": {"version": 1}}}).to_string(),
                ),
                None => (404, r#"{"errors":[]}"#.into()),
            };
        }
        match kv.get(path) {
            Some(v) => (
                200,
                json!({"data": v, "lease_duration": 2764800}).to_string(),
            ),
            None => (404, r#"{"errors":[]}"#.into()),
        }
    }));
    Vault { server, kv, up }
}

impl Vault {
    fn set(&self, path: &str, value: Value) {
        self.kv.lock().unwrap().insert(path.into(), value);
    }
}

#[test]
fn vault_kv1_and_kv2_in_plugin_confs_and_credentials_and_rotation() {
    let v = vault();
    v.set("kv/apisix/jack", json!({"key": "jack-v1"}));
    v.set("kv2/apisix/headers", json!({"value": "from-kv2"}));
    let up = Upstream::start("up", Behaviour::Echo);
    let gw = gateway(&[("E2E_VAULT_TOKEN", "root-token")], "");
    // The token itself may be an `$env://` reference, as in APISIX.
    put(
        &gw,
        "/apisix/admin/secrets/vault/1",
        &json!({"uri": v.server.url(), "prefix": "kv/apisix", "token": "$env://E2E_VAULT_TOKEN"}),
    );
    put(
        &gw,
        "/apisix/admin/secrets/vault/2",
        &json!({"uri": v.server.url(), "prefix": "kv2/data/apisix", "token": "root-token"}),
    );
    put(&gw, "/apisix/admin/consumers", &json!({"username": "jack"}));
    put(
        &gw,
        "/apisix/admin/consumers/jack/credentials/c1",
        &json!({"plugins": {"key-auth": {"key": "$secret://vault/1/jack/key"}}}),
    );
    put(
        &gw,
        "/apisix/admin/routes/1",
        &json!({"uri": "/r", "plugins": {
            "key-auth": {},
            "proxy-rewrite": {"headers": {"set": {"X-Secret": "$secret://vault/2/headers/value"}}}
        }, "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}),
    );
    wait_status(&gw, "/r", "jack-v1", 200);
    let echo = with_key(&gw, "/r", "jack-v1").json();
    assert_eq!(echo["headers"]["x-secret"], "from-kv2", "{echo}");
    assert_eq!(
        with_key(&gw, "/r", "$secret://vault/1/jack/key").status,
        401
    );
    let seen = v.server.seen();
    assert!(
        seen.iter().any(|r| r.path == "/v1/kv/apisix/jack"),
        "{seen:?}"
    );
    assert!(seen.iter().any(|r| r.path == "/v1/kv2/data/apisix/headers"));
    assert!(seen
        .iter()
        .all(|r| r.header("x-vault-token") == Some("root-token")));

    // Rotation: the store's new value reaches new requests, the old one stops working.
    v.set("kv/apisix/jack", json!({"key": "jack-v2"}));
    wait_status(&gw, "/r", "jack-v2", 200);
    assert_eq!(with_key(&gw, "/r", "jack-v1").status, 401);
    v.set("kv2/apisix/headers", json!({"value": "rotated"}));
    let rotated = poll_until(Duration::from_secs(20), || {
        with_key(&gw, "/r", "jack-v2").json()["headers"]["x-secret"] == "rotated"
    });
    assert!(rotated.is_some(), "{}", gw.log_text());

    // The store down after boot: the last values keep serving.
    v.up.store(false, Ordering::SeqCst);
    let before = v.server.seen().len();
    poll_until(Duration::from_secs(20), || {
        v.server.seen().len() > before + 2
    });
    assert_eq!(with_key(&gw, "/r", "jack-v2").status, 200);
    let log = gw.log_text();
    assert!(log.contains("failed to refresh secret reference: $secret://vault/1/jack/key"));
    assert!(!log.contains("jack-v2"), "a value reached the log");

    // The secret deleted at the store: the consumer's key stops working (fail closed).
    v.up.store(true, Ordering::SeqCst);
    v.kv.lock().unwrap().remove("kv/apisix/jack");
    wait_status(&gw, "/r", "jack-v2", 401);
}

#[test]
fn an_unresolved_key_auth_reference_lets_nobody_in() {
    let v = vault();
    v.set("kv/apisix/rose", json!({"key": "rose-key"}));
    let up = Upstream::start("up", Behaviour::Echo);
    let gw = gateway(&[], "");
    put(
        &gw,
        "/apisix/admin/secrets/vault/1",
        &json!({"uri": v.server.url(), "prefix": "kv/apisix", "token": "root-token"}),
    );
    // A missing secret, and a manager that does not exist.
    put(
        &gw,
        "/apisix/admin/consumers",
        &json!({"username": "jack", "plugins": {"key-auth": {"key": "$secret://vault/1/jack/key"}}}),
    );
    put(
        &gw,
        "/apisix/admin/consumers",
        &json!({"username": "tom", "plugins": {"key-auth": {"key": "$secret://vault/9/tom/key"}}}),
    );
    put(
        &gw,
        "/apisix/admin/consumers",
        &json!({"username": "rose", "plugins": {"key-auth": {"key": "$secret://vault/1/rose/key"}}}),
    );
    put(
        &gw,
        "/apisix/admin/routes/1",
        &json!({"uri": "/r", "plugins": {"key-auth": {}},
            "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}),
    );
    // The rest of the configuration serves.
    wait_status(&gw, "/r", "rose-key", 200);
    // APISIX would keep the reference as the key: the client sending its text is let in.
    assert_eq!(
        with_key(&gw, "/r", "$secret://vault/1/jack/key").status,
        401
    );
    assert_eq!(with_key(&gw, "/r", "$secret://vault/9/tom/key").status, 401);
    let log = gw.log_text();
    assert!(
        log.contains(
            "failed to resolve secret reference: $secret://vault/1/jack/key, field: /plugins/key-auth/key"
        ),
        "{log}"
    );
    assert!(log.contains(
        "failed to resolve secret reference: $secret://vault/9/tom/key, field: /plugins/key-auth/key, err: no secret conf, secret_uri: $secret://vault/9/tom/key"
    ));
    assert!(!log.contains("rose-key"), "a value reached the log");
    // The control API lists both consumers as quarantined, with the field named.
    let config = request(gw.control_addr(), "GET", "/v1/config", &[], b"").json();
    let quarantined: Vec<&Value> = config["quarantined"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|q| q["kind"] == "consumers")
        .collect();
    assert_eq!(quarantined.len(), 2, "{config}");
    assert!(quarantined.iter().all(|q| q["error"]
        .as_str()
        .unwrap()
        .contains("field: /plugins/key-auth/key")));
}

#[test]
fn a_store_down_at_boot_refuses_what_uses_it_and_the_rest_serves() {
    let v = vault();
    v.set("kv/apisix/hdr", json!({"value": "h1"}));
    v.up.store(false, Ordering::SeqCst);
    let up = Upstream::start("up", Behaviour::Echo);
    let mut gw = gateway(&[], "");
    put(
        &gw,
        "/apisix/admin/secrets/vault/1",
        &json!({"uri": v.server.url(), "prefix": "kv/apisix", "token": "root-token"}),
    );
    let upstream = json!({"type": "roundrobin", "nodes": {up.node(): 1}});
    put(
        &gw,
        "/apisix/admin/routes/1",
        &json!({"uri": "/secret", "plugins": {"proxy-rewrite": {"headers": {"set": {
            "X-Secret": "$secret://vault/1/hdr/value"}}}}, "upstream": upstream}),
    );
    put(
        &gw,
        "/apisix/admin/routes/2",
        &json!({"uri": "/plain", "upstream": upstream}),
    );
    gw.stop();
    gw.restart();
    assert_eq!(
        request(gw.data_addr(), "GET", "/plain", &[], b"").status,
        200
    );
    assert_eq!(
        request(gw.data_addr(), "GET", "/secret", &[], b"").status,
        404
    );
    let log = gw.log_text();
    assert!(
        log.contains("resource refused")
            && log.contains(
                "failed to resolve secret reference: $secret://vault/1/hdr/value, field: /plugins/proxy-rewrite/headers/set/X-Secret"
            ),
        "{log}"
    );
    // The store comes back: the route serves with the value, without a restart.
    v.up.store(true, Ordering::SeqCst);
    let served = poll_until(Duration::from_secs(20), || {
        let r = request(gw.data_addr(), "GET", "/secret", &[], b"");
        r.status == 200 && r.json()["headers"]["x-secret"] == "h1"
    });
    assert!(served.is_some(), "{}", gw.log_text());
}

/// SigV4 computed here from AWS's documented algorithm (not the gateway's code).
mod sigv4_check {
    use ring::{digest, hmac};

    fn hex(b: &[u8]) -> String {
        b.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn mac(key: &[u8], msg: &[u8]) -> Vec<u8> {
        hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), msg)
            .as_ref()
            .to_vec()
    }

    /// The signature of a request with no query, path `/`, as AWS's documentation builds it.
    pub fn signature(
        secret: &str,
        method: &str,
        headers: &[(String, String)],
        signed: &str,
        body: &[u8],
        amz_date: &str,
        scope: &str,
    ) -> String {
        let mut canonical_headers = String::new();
        for name in signed.split(';') {
            let value = headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.trim().to_owned())
                .collect::<Vec<_>>()
                .join(",");
            canonical_headers.push_str(&format!("{name}:{value}\n"));
        }
        let canonical = format!(
            "{method}\n/\n\n{canonical_headers}\n{signed}\n{}",
            hex(digest::digest(&digest::SHA256, body).as_ref())
        );
        let sts = format!(
            "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
            hex(digest::digest(&digest::SHA256, canonical.as_bytes()).as_ref())
        );
        let mut parts = scope.split('/');
        let (date, region, service) = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap(),
        );
        let k = mac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
        let k = mac(&k, region.as_bytes());
        let k = mac(&k, service.as_bytes());
        let k = mac(&k, b"aws4_request");
        hex(&mac(&k, sts.as_bytes()))
    }

    /// AWS's get-vanilla test vector, through this implementation.
    #[test]
    fn the_checker_agrees_with_aws_test_suite() {
        let headers = vec![
            ("host".to_owned(), "example.amazonaws.com".to_owned()),
            ("x-amz-date".to_owned(), "20150830T123600Z".to_owned()),
        ];
        assert_eq!(
            signature(
                "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
                "GET",
                &headers,
                "host;x-amz-date",
                b"",
                "20150830T123600Z",
                "20150830/us-east-1/service/aws4_request"
            ),
            "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
    }
}

/// AWS Secrets Manager for the key `AKIDTEST` / `aws-secret`: the signature checked, the
/// session token required, `ResourceNotFoundException` for unknown ids.
fn aws(secrets: HashMap<String, String>) -> Server {
    Server::start(Arc::new(move |req: &Req| {
        let deny = |m: &str| {
            (
                403,
                json!({"__type": "InvalidSignatureException", "message": m}).to_string(),
            )
        };
        if req.method != "POST"
            || req.path != "/"
            || req.header("x-amz-target") != Some("secretsmanager.GetSecretValue")
            || req.header("content-type") != Some("application/x-amz-json-1.1")
        {
            return (400, r#"{"__type":"UnknownOperationException"}"#.into());
        }
        if req.header("x-amz-security-token") != Some("session-1") {
            return deny("no session token");
        }
        let Some(auth) = req.header("authorization") else {
            return deny("no authorization");
        };
        let field = |name: &str| {
            auth.split([' ', ','])
                .find_map(|p| p.trim().strip_prefix(name))
                .unwrap_or("")
                .to_owned()
        };
        let credential = field("Credential=");
        let Some(scope) = credential.strip_prefix("AKIDTEST/") else {
            return deny("unknown access key");
        };
        if !scope.ends_with("/eu-west-1/secretsmanager/aws4_request") {
            return deny("wrong scope");
        }
        let signed = field("SignedHeaders=");
        if !signed.split(';').any(|h| h == "x-amz-security-token") {
            return deny("token not signed");
        }
        let want = sigv4_check::signature(
            "aws-secret",
            "POST",
            &req.headers,
            &signed,
            &req.body,
            req.header("x-amz-date").unwrap_or(""),
            scope,
        );
        if field("Signature=") != want {
            return deny("signature mismatch");
        }
        let body: Value = serde_json::from_slice(&req.body).unwrap_or_default();
        assert_eq!(body["VersionStage"], "AWSCURRENT");
        match body["SecretId"].as_str().and_then(|id| secrets.get(id)) {
            Some(s) => (
                200,
                json!({"Name": body["SecretId"], "SecretString": s, "VersionStages": ["AWSCURRENT"]})
                    .to_string(),
            ),
            None => (
                400,
                json!({"__type": "ResourceNotFoundException",
                    "message": "Secrets Manager can't find the specified secret."})
                .to_string(),
            ),
        }
    }))
}

fn cert_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tls")
}

#[test]
fn aws_signed_requests_resolve_an_ssl_certificate_and_key() {
    let pem = |n: &str| std::fs::read_to_string(cert_dir().join(n)).unwrap();
    // A secret name holding `/`, whose JSON fields are the certificate and key: the gateway
    // tries `tls/server/cert`, is told it does not exist, then reads `cert` of `tls/server`.
    let secrets = HashMap::from([(
        "tls/server".to_owned(),
        json!({"cert": pem("server.crt"), "key": pem("server.key")}).to_string(),
    )]);
    let store = aws(secrets);
    let up = Upstream::start("up", Behaviour::Echo);
    let tls_port = free_port();
    let gw = gateway(
        &[("E2E_AWS_SESSION", "session-1")],
        &format!("ssl:\n  listen:\n    - ip: 127.0.0.1\n      port: {tls_port}"),
    );
    put(
        &gw,
        "/apisix/admin/secrets/aws/1",
        &json!({"access_key_id": "AKIDTEST", "secret_access_key": "aws-secret",
            "session_token": "$env://E2E_AWS_SESSION", "region": "eu-west-1",
            "endpoint_url": store.url()}),
    );
    put(
        &gw,
        "/apisix/admin/ssls/1",
        &json!({"snis": ["server.local"], "cert": "$secret://aws/1/tls/server/cert",
            "key": "$secret://aws/1/tls/server/key"}),
    );
    put(
        &gw,
        "/apisix/admin/routes/1",
        &json!({"uri": "/tls", "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}),
    );
    let curl = || {
        Command::new(support::debian::require("curl"))
            .args(["-s", "--max-time", "5", "--cacert"])
            .arg(cert_dir().join("ca.crt"))
            .arg("--resolve")
            .arg(format!("server.local:{tls_port}:127.0.0.1"))
            .arg(format!("https://server.local:{tls_port}/tls"))
            .output()
            .unwrap()
    };
    let ok = poll_until(Duration::from_secs(20), || curl().status.success());
    assert!(
        ok.is_some(),
        "no TLS with the resolved key; log:\n{}",
        gw.log_text()
    );
    let seen = store.seen();
    let ids: Vec<String> = seen
        .iter()
        .map(|r| {
            serde_json::from_slice::<Value>(&r.body).unwrap()["SecretId"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert!(ids.contains(&"tls/server/cert".to_owned()), "{ids:?}");
    assert!(ids.contains(&"tls/server".to_owned()), "{ids:?}");
    let log = gw.log_text();
    assert!(!log.contains("InvalidSignatureException"), "{log}");
    assert!(!log.contains("BEGIN"), "a key reached the log");
}

/// Google's token endpoint and Secret Manager in one server.
fn google(token_uri: Arc<Mutex<String>>, secrets: HashMap<String, String>) -> Server {
    const PUBLIC: &str = include_str!("../data/tls/dual-rsa.pub");
    Server::start(Arc::new(move |req: &Req| {
        if req.method == "POST" && req.path == "/token" {
            let form: HashMap<String, String> = String::from_utf8_lossy(&req.body)
                .split('&')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), percent_decode(v)))
                .collect();
            if form.get("grant_type").map(String::as_str)
                != Some("urn:ietf:params:oauth:grant-type:jwt-bearer")
            {
                return (400, r#"{"error":"unsupported_grant_type"}"#.into());
            }
            let key = jsonwebtoken::DecodingKey::from_rsa_pem(PUBLIC.as_bytes()).unwrap();
            let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
            v.set_audience(&[token_uri.lock().unwrap().clone()]);
            let assertion = form.get("assertion").map_or("", String::as_str);
            return match jsonwebtoken::decode::<Value>(assertion, &key, &v) {
                Ok(t)
                    if t.claims["iss"] == "gw@p1.iam.gserviceaccount.com"
                        && t.claims["scope"]
                            == "https://www.googleapis.com/auth/cloud-platform" =>
                {
                    (
                        200,
                        r#"{"access_token":"ya29.e2e","expires_in":3599,"token_type":"Bearer"}"#
                            .into(),
                    )
                }
                _ => (400, r#"{"error":"invalid_grant"}"#.into()),
            };
        }
        if req.header("authorization") != Some("Bearer ya29.e2e") {
            return (401, r#"{"error":{"code":401}}"#.into());
        }
        let name = req
            .path
            .strip_prefix("/v1/projects/p1/secrets/")
            .and_then(|p| p.strip_suffix("/versions/latest:access"));
        match name.and_then(|n| secrets.get(n)) {
            Some(s) => (
                200,
                json!({"name": req.path, "payload": {
                    "data": base64::engine::general_purpose::STANDARD.encode(s)}})
                .to_string(),
            ),
            None => (404, r#"{"error":{"code":404,"status":"NOT_FOUND"}}"#.into()),
        }
    }))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn gcp_service_account_tokens_and_env_references() {
    const PRIVATE: &str = include_str!("../data/tls/dual-rsa.key");
    let token_uri = Arc::new(Mutex::new(String::new()));
    let store = google(
        token_uri.clone(),
        HashMap::from([(
            "creds".to_owned(),
            r#"{"user":"svc","password":"gcp-pw"}"#.to_owned(),
        )]),
    );
    *token_uri.lock().unwrap() = format!("{}/token", store.url());
    let up = Upstream::start("up", Behaviour::Echo);
    let gw = gateway(
        &[
            ("E2E_JSON_ENV", r#"{"tag": "from-env-json"}"#),
            ("E2E_PLAIN_ENV", "from-env"),
        ],
        "",
    );
    // The account as a key file (`auth_file`), as a service account's JSON key.
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("sa.json");
    std::fs::write(
        &key_file,
        json!({"type": "service_account", "client_email": "gw@p1.iam.gserviceaccount.com",
            "private_key": PRIVATE, "project_id": "p1",
            "token_uri": format!("{}/token", store.url()),
            "entries_uri": format!("{}/v1", store.url())})
        .to_string(),
    )
    .unwrap();
    put(
        &gw,
        "/apisix/admin/secrets/gcp/1",
        &json!({"auth_config": {"client_email": "gw@p1.iam.gserviceaccount.com",
            "private_key": PRIVATE, "project_id": "p1", "token_uri": format!("{}/token", store.url()),
            "entries_uri": format!("{}/v1", store.url())}}),
    );
    put(
        &gw,
        "/apisix/admin/secrets/gcp/2",
        &json!({"auth_file": key_file.to_str().unwrap(), "ssl_verify": false}),
    );
    put(
        &gw,
        "/apisix/admin/routes/1",
        &json!({"uri": "/g", "plugins": {"proxy-rewrite": {"headers": {"set": {
            "X-Password": "$secret://gcp/1/creds/password",
            "X-User": "$secret://gcp/2/creds/user",
            "X-Env-Json": "$env://E2E_JSON_ENV/tag",
            "X-Env": "$ENV://E2E_PLAIN_ENV"}}}},
            "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}),
    );
    let served = poll_until(Duration::from_secs(20), || {
        let r = request(gw.data_addr(), "GET", "/g", &[], b"");
        r.status == 200 && r.json()["headers"]["x-password"] == "gcp-pw"
    });
    assert!(served.is_some(), "{}", gw.log_text());
    let echo = request(gw.data_addr(), "GET", "/g", &[], b"").json();
    assert_eq!(echo["headers"]["x-env-json"], "from-env-json");
    assert_eq!(echo["headers"]["x-env"], "from-env");
    assert_eq!(echo["headers"]["x-user"], "svc");
    // The value is fetched again as its time runs out; the token is kept until it expires.
    poll_until(Duration::from_secs(20), || {
        store
            .seen()
            .iter()
            .filter(|r| r.path.ends_with(":access"))
            .count()
            >= 3
    });
    let seen = store.seen();
    let tokens = seen.iter().filter(|r| r.path == "/token").count();
    let reads = seen.iter().filter(|r| r.path.ends_with(":access")).count();
    assert_eq!(tokens, 1, "one token exchange for {reads} reads");
    assert!(reads >= 3);
}
