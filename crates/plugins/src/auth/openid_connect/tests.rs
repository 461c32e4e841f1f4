//! openid-connect's unit tests: bearer tokens signed by a test RSA key (testdata/, made for
//! these tests), verified with its public half.

use ferrisix_config::validate::PluginCheck;
use ferrisix_plugin_api::testing::TestRequest;
use ferrisix_plugin_api::Executor;
use jsonwebtoken::{encode, EncodingKey, Header};

use super::*;
use crate::testing::Compiler;

const PRIVATE: &str = include_str!("testdata/rsa_private.pem");
const PUBLIC: &str = include_str!("testdata/rsa_public.pem");
const NOW: u64 = 1_800_000_000;

fn token(claims: Value) -> String {
    let key = EncodingKey::from_rsa_pem(PRIVATE.as_bytes()).unwrap();
    encode(&Header::new(Algorithm::RS256), &claims, &key).unwrap()
}

fn base(extra: Value) -> Value {
    let mut conf = json!({
        "client_id": "cid",
        "discovery": "http://127.0.0.1:1/.well-known/openid-configuration",
        "bearer_only": true,
        "public_key": PUBLIC,
        "token_signing_alg_values_expected": "RS256",
        "claim_validator": {"issuer": {"valid_issuers": ["iss"]}}
    });
    for (k, v) in extra.as_object().unwrap() {
        conf[k] = v.clone();
    }
    conf
}

struct Answer {
    status: u16,
    body: String,
    challenge: Option<String>,
    req: TestRequest,
}

fn run(conf: Value, req: TestRequest) -> Answer {
    let services = Arc::new(PluginServices::new(
        Default::default(),
        Executor::current(),
        Clock::manual(NOW * 1000),
    ));
    let c = Compiler::with(services);
    let p = (DEF.compile)(&c.cx(NAME, &conf, "oidc", None)).unwrap();
    let mut req = req;
    let flow = match p.rewrite(&mut req.ctx()) {
        Step::Done(f) => f,
        // The session flow's deny and pass answers make no call: done on the first poll.
        Step::Wait(fut) => super::now_or_never(fut).expect("a local decision does not wait"),
    };
    let (status, body, challenge) = match flow {
        Flow::Continue => (200, String::new(), None),
        Flow::Exit(e) => (
            e.status.as_u16(),
            String::from_utf8_lossy(e.body.as_deref().unwrap_or_default()).into_owned(),
            e.headers
                .iter()
                .find(|(n, _)| n == "www-authenticate")
                .map(|(_, v)| v.to_str().unwrap().to_owned()),
        ),
    };
    Answer {
        status,
        body,
        challenge,
        req,
    }
}

fn with_token(t: &str) -> TestRequest {
    TestRequest::get("/").header("authorization", &format!("Bearer {t}"))
}

#[test]
fn a_valid_token_reaches_the_upstream_with_its_claims() {
    let t = token(json!({"iss": "iss", "sub": "alice", "exp": NOW + 60}));
    let a = run(
        base(json!({})),
        with_token(&t)
            .header("x-id-token", "forged")
            .header("x-userinfo", "forged"),
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.req.headers["x-access-token"], t.as_str());
    assert!(a.req.headers.get("x-id-token").is_none());
    let info = base64::engine::general_purpose::STANDARD
        .decode(a.req.headers["x-userinfo"].as_bytes())
        .unwrap();
    let info: Value = serde_json::from_slice(&info).unwrap();
    assert_eq!(info["sub"], "alice");
    // The token in Authorization instead, and no userinfo.
    let a = run(
        base(json!({"access_token_in_authorization_header": true, "set_userinfo_header": false})),
        with_token(&t),
    );
    assert_eq!(
        a.req.headers["authorization"],
        format!("Bearer {t}").as_str()
    );
    assert!(a.req.headers.get("x-access-token").is_none());
    assert!(a.req.headers.get("x-userinfo").is_none());
    // A client's X-Access-Token is the token when there is no Authorization.
    let a = run(
        base(json!({})),
        TestRequest::get("/").header("x-access-token", &t),
    );
    assert_eq!(a.status, 200);
}

#[test]
fn missing_malformed_and_bad_tokens() {
    let a = run(base(json!({})), TestRequest::get("/"));
    assert_eq!(
        (a.status, a.challenge.as_deref()),
        (401, Some("Bearer realm=\"apisix\""))
    );
    let a = run(
        base(json!({})),
        TestRequest::get("/").header("authorization", "Basic eA=="),
    );
    assert_eq!(a.status, 401);
    let a = run(
        base(json!({})),
        TestRequest::get("/").header("authorization", "foo"),
    );
    assert_eq!(a.status, 400);
    let a = run(base(json!({})), with_token("not-a-jwt"));
    assert_eq!(a.status, 401);
    assert!(a.challenge.unwrap().starts_with(
        "Bearer realm=\"apisix\", error=\"invalid_token\", error_description=\"invalid jwt"
    ));
    let expired = token(json!({"iss": "iss", "exp": NOW - 121}));
    let a = run(base(json!({})), with_token(&expired));
    assert!(a
        .challenge
        .unwrap()
        .ends_with("error_description=\"JWT expired\""));
    let evil = token(json!({"iss": "evil"}));
    let a = run(base(json!({})), with_token(&evil));
    assert!(a
        .challenge
        .unwrap()
        .contains("Claim 'iss' ('evil') returned failure"));
    // HS256 signed with the public key as its secret (key confusion) is refused.
    let confused = encode(
        &Header::new(Algorithm::HS256),
        &json!({"iss": "iss"}),
        &EncodingKey::from_secret(PUBLIC.as_bytes()),
    )
    .unwrap();
    let a = run(
        base(json!({"token_signing_alg_values_expected": null})),
        with_token(&confused),
    );
    assert_eq!(a.status, 401);
}

#[test]
fn audience_and_scopes() {
    let conf = base(
        json!({"claim_validator": {"issuer": {"valid_issuers": ["iss"]},
        "audience": {"match_with_client_id": true}}}),
    );
    let other = token(json!({"iss": "iss", "aud": "other"}));
    let a = run(conf.clone(), with_token(&other));
    assert_eq!(
        (a.status, a.body.as_str()),
        (403, "{\"error\":\"mismatched audience\"}")
    );
    let none = token(json!({"iss": "iss"}));
    let a = run(conf.clone(), with_token(&none));
    assert_eq!(
        (a.status, a.body.as_str()),
        (403, "{\"error\":\"required audience claim not present\"}")
    );
    let list = token(json!({"iss": "iss", "aud": ["other", "cid"]}));
    assert_eq!(run(conf.clone(), with_token(&list)).status, 200);
    let scoped = base(json!({"required_scopes": ["read", "write"]}));
    let t = token(json!({"iss": "iss", "scope": "read"}));
    let a = run(scoped.clone(), with_token(&t));
    assert_eq!(
        (a.status, a.body.as_str()),
        (
            403,
            "{\"error\":\"required scopes read, write not present\"}"
        )
    );
    let t = token(json!({"iss": "iss", "scope": "write read"}));
    assert_eq!(run(scoped, with_token(&t)).status, 200);
}

#[test]
fn unauth_actions_without_a_token() {
    let session = json!({"client_id": "cid", "client_secret": "s",
        "discovery": "http://127.0.0.1:1/d", "session": {"secret": "0123456789abcdef"}});
    let mut deny = session.clone();
    deny["unauth_action"] = json!("deny");
    assert_eq!(run(deny, TestRequest::get("/")).status, 401);
    let mut pass = session.clone();
    pass["unauth_action"] = json!("pass");
    let a = run(
        pass,
        TestRequest::get("/")
            .header("x-access-token", "forged")
            .header("x-refresh-token", "f"),
    );
    assert_eq!(a.status, 200);
    assert!(a.req.headers.get("x-access-token").is_none());
    assert!(a.req.headers.get("x-refresh-token").is_none());
}

#[test]
fn schema_messages_in_apisix_order() {
    let c = Compiler::new();
    let err = |conf: Value| c.registry.check(NAME, &conf).unwrap_err();
    let prefix = "failed to check the configuration of plugin openid-connect err: ";
    assert_eq!(
        err(json!({"client_id": "c", "client_secret": "s", "discovery": "d"})),
        format!("{prefix}property \"session.secret\" is required when \"bearer_only\" is false")
    );
    assert_eq!(
        err(json!({"client_id": "c", "discovery": "d", "bearer_only": true})),
        format!("{prefix}property \"client_secret\" is required")
    );
    assert_eq!(
        err(json!({"discovery": "d", "bearer_only": true, "public_key": "k"})),
        format!("{prefix}property \"client_id\" is required")
    );
    assert_eq!(
        err(json!({"client_id": "c", "client_secret": "s", "discovery": "d",
            "session": {"secret": "short"}})),
        format!("{prefix}property \"session\" validation failed: property \"secret\" validation failed: string too short, expected at least 16, got 5")
    );
    assert_eq!(
        err(
            json!({"client_id": "c", "discovery": "d", "bearer_only": true, "public_key": "k",
            "use_dpop": true})
        ),
        format!("{prefix}property \"use_dpop\" is not allowed, use \"dpop.enabled\" instead")
    );
    assert!(c
        .registry
        .check(
            NAME,
            &json!({"client_id": "c", "discovery": "d", "bearer_only": true,
            "use_jwks": true})
        )
        .is_ok());
}
