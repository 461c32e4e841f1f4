//! Identity and access plugins through the gateway: acl and attach-consumer-label on
//! key-auth consumers' labels, openid-connect bearer tokens (signed here with the test key of
//! the plugin's unit tests), csrf's cookie round trip, jwe-decrypt, and ldap-auth /
//! ldap-auth-advanced against Debian's slapd.

use base64::Engine;
use serde_json::json;

use crate::support::slapd::{self, Slapd};
use crate::support::{get, request, Behaviour, Gateway, Upstream};

const PRIVATE: &str =
    include_str!("../../crates/plugins/src/auth/openid_connect/testdata/rsa_private.pem");
const PUBLIC: &str =
    include_str!("../../crates/plugins/src/auth/openid_connect/testdata/rsa_public.pem");

#[test]
fn acl_and_attach_consumer_label_follow_the_consumer_labels() {
    let up = Upstream::start("up", Behaviour::Echo);
    let conf = json!({
        "consumers": [
            {"username": "ops", "plugins": {"key-auth": {"key": "k-ops"}},
             "labels": {"team": "ops,infra", "role": "admin"}},
            {"username": "dev", "plugins": {"key-auth": {"key": "k-dev"}},
             "labels": {"team": "[\"dev\"]"}}
        ],
        "routes": [
            {"id": "ops", "uri": "/ops", "plugins": {
                "key-auth": {},
                "acl": {"allow_labels": {"team": ["infra"]}},
                "attach-consumer-label": {"headers": {"X-Team": "$team", "X-Role": "$role"}}},
             "upstream": {"nodes": {up.node(): 1}}},
            {"id": "no-dev", "uri": "/no-dev", "plugins": {
                "key-auth": {},
                "acl": {"deny_labels": {"team": ["dev"]}, "rejected_code": 451,
                        "rejected_msg": "not for dev"}},
             "upstream": {"nodes": {up.node(): 1}}}
        ]
    });
    let gw = Gateway::start(&conf.to_string());
    let r = request(gw.addr(), "GET", "/ops", &[("apikey", "k-ops")], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let echo = r.json();
    assert_eq!(echo["headers"]["x-team"], "ops,infra");
    assert_eq!(echo["headers"]["x-role"], "admin");
    let r = request(
        gw.addr(),
        "GET",
        "/ops",
        &[("apikey", "k-dev"), ("X-Role", "forged")],
        b"",
    );
    assert_eq!(r.status, 403);
    assert_eq!(r.text(), "{\"message\":\"The consumer is forbidden.\"}\n");
    let r = request(gw.addr(), "GET", "/no-dev", &[("apikey", "k-dev")], b"");
    assert_eq!(
        (r.status, r.text()),
        (451, "{\"message\":\"not for dev\"}\n".to_owned())
    );
    assert_eq!(
        request(gw.addr(), "GET", "/no-dev", &[("apikey", "k-ops")], b"").status,
        200
    );
    assert_eq!(up.hits(), 2, "refused requests never reached the upstream");
}

fn sign(claims: serde_json::Value, key: &str) -> String {
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(key.as_bytes()).unwrap();
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
        &claims,
        &key,
    )
    .unwrap()
}

#[test]
fn openid_connect_bearer_tokens() {
    let up = Upstream::start("up", Behaviour::Echo);
    let conf = json!({"routes": [{"id": "oidc", "uri": "/api", "plugins": {"openid-connect": {
        "client_id": "gw", "discovery": "http://127.0.0.1:1/.well-known/openid-configuration",
        "bearer_only": true, "public_key": PUBLIC, "token_signing_alg_values_expected": "RS256",
        "claim_validator": {"issuer": {"valid_issuers": ["https://idp"]},
                            "audience": {"match_with_client_id": true}}}},
        "upstream": {"nodes": {up.node(): 1}}}]});
    let gw = Gateway::start(&conf.to_string());
    let good = sign(
        json!({"iss": "https://idp", "aud": "gw", "sub": "alice", "exp": 4_102_444_800u64}),
        PRIVATE,
    );
    let bearer = format!("Bearer {good}");
    let r = request(
        gw.addr(),
        "GET",
        "/api",
        &[("Authorization", &bearer), ("X-Userinfo", "forged")],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let echo = r.json();
    assert_eq!(echo["headers"]["x-access-token"], good.as_str());
    let info = base64::engine::general_purpose::STANDARD
        .decode(echo["headers"]["x-userinfo"].as_str().unwrap())
        .unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info).unwrap();
    assert_eq!(info["sub"], "alice");

    let r = get(gw.addr(), "/api");
    assert_eq!(r.status, 401);
    assert_eq!(
        r.header("www-authenticate"),
        Some("Bearer realm=\"apisix\"")
    );
    let expired = sign(
        json!({"iss": "https://idp", "aud": "gw", "exp": 1_000}),
        PRIVATE,
    );
    let r = request(
        gw.addr(),
        "GET",
        "/api",
        &[("Authorization", &format!("Bearer {expired}"))],
        b"",
    );
    assert_eq!(r.status, 401);
    assert!(r
        .header("www-authenticate")
        .unwrap()
        .contains("JWT expired"));
    let other = sign(
        json!({"iss": "https://idp", "aud": "someone-else"}),
        PRIVATE,
    );
    let r = request(
        gw.addr(),
        "GET",
        "/api",
        &[("Authorization", &format!("Bearer {other}"))],
        b"",
    );
    assert_eq!(
        (r.status, r.text()),
        (403, "{\"error\":\"mismatched audience\"}".to_owned())
    );
    assert_eq!(up.hits(), 1);
}

#[test]
fn csrf_cookie_round_trip() {
    let up = Upstream::start("up", Behaviour::Echo);
    let conf = json!({"routes": [{"id": "csrf", "uri": "/form", "plugins": {"csrf": {
        "key": "a-secret-key"}}, "upstream": {"nodes": {up.node(): 1}}}]});
    let gw = Gateway::start(&conf.to_string());
    let r = get(gw.addr(), "/form");
    assert_eq!(r.status, 200);
    let cookie = r.header("set-cookie").unwrap().to_owned();
    let token = cookie
        .strip_prefix("apisix-csrf-token=")
        .and_then(|c| c.split(';').next())
        .unwrap()
        .to_owned();
    let r = request(
        gw.addr(),
        "POST",
        "/form",
        &[
            ("apisix-csrf-token", &token),
            ("Cookie", &format!("apisix-csrf-token={token}")),
        ],
        b"x",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = request(gw.addr(), "POST", "/form", &[], b"x");
    assert_eq!(r.status, 401);
    assert_eq!(r.text(), "{\"error_msg\":\"no csrf token in headers\"}\n");
    // Even a refusal hands out a fresh token.
    assert!(r.header("set-cookie").is_some());
}

#[test]
fn ldap_auth_binds_against_slapd() {
    let dir = Slapd::start(&(slapd::user("alice", "alice-pw") + &slapd::user("bob", "bob-pw")));
    let up = Upstream::start("up", Behaviour::Echo);
    let alice_dn = format!("cn=alice,ou=users,{}", slapd::SUFFIX);
    let conf = json!({
        "consumers": [{"username": "alice", "plugins": {"ldap-auth": {"user_dn": alice_dn}}}],
        "routes": [{"id": "ldap", "uri": "/ldap", "plugins": {"ldap-auth": {
            "ldap_uri": dir.uri(), "base_dn": format!("ou=users,{}", slapd::SUFFIX),
            "uid": "cn", "hide_credentials": true}},
            "upstream": {"nodes": {up.node(): 1}}}]
    });
    let gw = Gateway::start(&conf.to_string());
    let basic = |u: &str, p: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
        )
    };
    let r = request(
        gw.addr(),
        "GET",
        "/ldap",
        &[("Authorization", &basic("alice", "alice-pw"))],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let echo = r.json();
    assert_eq!(echo["headers"]["x-consumer-username"], "alice");
    assert!(
        echo["headers"].get("authorization").is_none(),
        "hide_credentials"
    );
    let r = request(
        gw.addr(),
        "GET",
        "/ldap",
        &[("Authorization", &basic("alice", "wrong"))],
        b"",
    );
    assert_eq!(
        (r.status, r.text()),
        (
            401,
            "{\"message\":\"Invalid user authorization\"}\n".to_owned()
        )
    );
    // bob binds, but no consumer has his DN.
    let r = request(
        gw.addr(),
        "GET",
        "/ldap",
        &[("Authorization", &basic("bob", "bob-pw"))],
        b"",
    );
    assert_eq!(r.status, 401);
    // A DN-injection attempt in the username binds as nobody.
    let r = request(
        gw.addr(),
        "GET",
        "/ldap",
        &[("Authorization", &basic("alice,ou=users", "alice-pw"))],
        b"",
    );
    assert_eq!(r.status, 401);
}

#[test]
fn ldap_auth_advanced_searches_then_binds_against_slapd() {
    let dir = Slapd::start(&(slapd::user("carol", "carol-pw") + &slapd::user("dave", "dave-pw")));
    let up = Upstream::start("up", Behaviour::Echo);
    let carol_dn = format!("cn=carol,ou=users,{}", slapd::SUFFIX);
    let conf = json!({
        "consumers": [{"username": "carol",
                       "plugins": {"ldap-auth-advanced": {"user_dn": carol_dn}}}],
        "routes": [
            {"id": "adv", "uri": "/adv", "plugins": {"ldap-auth-advanced": {
                "ldap_uri": dir.uri(), "base_dn": slapd::SUFFIX, "attribute": "cn",
                "bind_dn": slapd::ADMIN_DN, "ldap_password": slapd::ADMIN_PASSWORD}},
             "upstream": {"nodes": {up.node(): 1}}},
            {"id": "down", "uri": "/down", "plugins": {"ldap-auth-advanced": {
                "ldap_uri": "127.0.0.1:1", "base_dn": slapd::SUFFIX, "timeout": 1000}},
             "upstream": {"nodes": {up.node(): 1}}}
        ]
    });
    let gw = Gateway::start(&conf.to_string());
    let cred = |u: &str, p: &str| {
        format!(
            "ldap {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
        )
    };
    let r = request(
        gw.addr(),
        "GET",
        "/adv",
        &[("Authorization", &cred("carol", "carol-pw"))],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["headers"]["x-consumer-username"], "carol");
    for (u, p) in [
        ("carol", "nope"),
        ("dave", "dave-pw"),
        ("nobody", "x"),
        ("*", "carol-pw"),
    ] {
        let r = request(
            gw.addr(),
            "GET",
            "/adv",
            &[("Authorization", &cred(u, p))],
            b"",
        );
        assert_eq!(r.status, 401, "{u}");
        assert_eq!(r.text(), "{\"message\":\"Authorization required\"}\n");
        assert_eq!(r.header("www-authenticate"), Some("ldap realm=\"ldap\""));
    }
    let r = request(
        gw.addr(),
        "GET",
        "/down",
        &[("Authorization", &cred("carol", "carol-pw"))],
        b"",
    );
    assert_eq!(r.status, 500);
    assert_eq!(up.hits(), 1);
}
