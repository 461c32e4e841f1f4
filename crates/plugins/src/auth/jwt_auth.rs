//! jwt-auth (`apisix/plugins/jwt-auth.lua`): a JSON Web Token in the `header` (default
//! `Authorization`, with or without `Bearer `), else the `query` argument, else the `cookie`
//! (both `jwt`), whose `key_claim_name` claim (default `key`) names a consumer's credential.
//! The token's `alg` must be the credential's `algorithm` (default HS256: `alg: none` and a
//! token signed with an RSA public key as an HMAC secret are refused before any signature is
//! checked); the signature is checked with the credential's `secret` (`base64_secret`: it is
//! base64) or `public_key`, then `exp` and `nbf` (when present, or the ones
//! `claims_to_verify` requires) with the credential's `lifetime_grace_period`. Every
//! failure is a 401 with `WWW-Authenticate: Bearer realm="<realm>"` unless
//! `anonymous_consumer` names the consumer to go on as.
//!
//! Signatures are checked by the `jsonwebtoken` crate, ES512 (which it lacks) by RustCrypto's
//! `p521`; the decoding key of each credential is built once per snapshot.

use std::str::FromStr;
use std::sync::Arc;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use ferrisix_plugin_api::{
    CheckCtx, Clock, CompileCtx, Phases, Plugin, PluginCtx, PluginDef, Prepared, Step,
};
use ferrisix_router::VarSource;
use http::{HeaderName, HeaderValue};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::{json, Map, Value};

use crate::support::auth::{
    anonymous_consumer_schema, anonymous_or_401, challenge, hide_query_arg, realm_schema,
};

pub const NAME: &str = "jwt-auth";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    ..PluginDef::new(NAME, 2510, schema, compile).with_credentials(
        consumer_schema,
        &["secret"],
        "key",
        Some(prepare),
    )
};

const ALGORITHMS: [&str; 13] = [
    "HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256",
    "PS384", "PS512", "EdDSA",
];

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "header": {"type": "string", "default": "authorization"},
            "query": {"type": "string", "default": "jwt"},
            "cookie": {"type": "string", "default": "jwt"},
            "hide_credentials": {"type": "boolean", "default": false},
            "key_claim_name": {"type": "string", "default": "key", "minLength": 1},
            "store_in_ctx": {"type": "boolean", "default": false},
            "realm": realm_schema("jwt"),
            "anonymous_consumer": anonymous_consumer_schema(),
            "claims_to_verify": {
                "type": "array",
                "items": {"type": "string", "enum": ["exp", "nbf"]},
                "uniqueItems": true
            }
        }
    })
}

fn consumer_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "key": {"type": "string", "minLength": 1},
            "secret": {"type": "string", "minLength": 1},
            "public_key": {"type": "string", "minLength": 1},
            "algorithm": {"type": "string", "enum": ALGORITHMS, "default": "HS256"},
            "exp": {"type": "integer", "minimum": 1, "default": 86400},
            "base64_secret": {"type": "boolean", "default": false},
            "lifetime_grace_period": {"type": "integer", "minimum": 0, "default": 0}
        },
        "required": ["key"]
    })
}

/// `ngx.decode_base64`: the standard alphabet, padding optional.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// JWS segments: URL-safe base64, padding optional.
const BASE64URL: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

fn is_secret_ref(s: &str) -> bool {
    s.starts_with("$secret://") || s.starts_with("$env://")
}

/// The consumer conf's checks beyond its schema, in APISIX's words.
fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    if !cx.consumer {
        return Ok(());
    }
    let conf = cx.filled()?;
    let alg = conf
        .get("algorithm")
        .and_then(Value::as_str)
        .unwrap_or("HS256");
    let secret = conf.get("secret").and_then(Value::as_str);
    let is_hs = alg.starts_with("HS");
    if is_hs && secret.is_none() {
        return Err("property \"secret\" is required when using HS based algorithms".into());
    }
    if conf.get("base64_secret").and_then(Value::as_bool) == Some(true) {
        if let Some(s) = secret.filter(|s| !is_secret_ref(s)) {
            if BASE64.decode(s).is_err() {
                return Err("base64_secret required but the secret is not in base64 format".into());
            }
        }
    }
    if !is_hs && conf.get("public_key").is_none() {
        return Err("missing valid public key".into());
    }
    Ok(())
}

/// How a credential's signatures are checked.
enum Verifier {
    Jwt {
        algorithm: Algorithm,
        key: DecodingKey,
    },
    /// ES512: ECDSA on P-521 with SHA-512.
    Es512(p521::ecdsa::VerifyingKey),
}

impl Verifier {
    /// Whether `signature` (base64url) signs `signing_input`.
    fn verify(&self, signing_input: &str, signature: &str) -> bool {
        match self {
            Verifier::Jwt { algorithm, key } => {
                jsonwebtoken::crypto::verify(signature, signing_input.as_bytes(), key, *algorithm)
                    .unwrap_or(false)
            }
            Verifier::Es512(key) => {
                use p521::ecdsa::signature::Verifier as _;
                let Ok(raw) = BASE64URL.decode(signature) else {
                    return false;
                };
                // JWS's ECDSA signature is R || S, 66 bytes each (RFC 7518 §3.4), not DER.
                let Ok(sig) = p521::ecdsa::Signature::from_slice(&raw) else {
                    return false;
                };
                key.verify(signing_input.as_bytes(), &sig).is_ok()
            }
        }
    }
}

/// What a credential compiles to: its algorithm and verifier, its grace period.
struct JwtKey {
    alg_name: String,
    verifier: Verifier,
    grace: i64,
}

/// A P-521 public key (PEM, SubjectPublicKeyInfo) as an ES512 verifier.
fn es512_key(pem: &str) -> Result<Verifier, String> {
    use p521::pkcs8::DecodePublicKey as _;
    let public = p521::PublicKey::from_public_key_pem(pem.trim())
        .map_err(|_| "invalid public key".to_owned())?;
    let key = p521::ecdsa::VerifyingKey::from_affine(*public.as_affine())
        .map_err(|_| "invalid public key".to_owned())?;
    Ok(Verifier::Es512(key))
}

fn prepare(conf: &Value) -> Result<Prepared, String> {
    let alg_name = conf
        .get("algorithm")
        .and_then(Value::as_str)
        .unwrap_or("HS256")
        .to_owned();
    let text = |name: &str| conf.get(name).and_then(Value::as_str);
    let grace = conf
        .get("lifetime_grace_period")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if alg_name == "ES512" {
        let pem = text("public_key").ok_or("missing valid public key")?;
        return Ok(Arc::new(JwtKey {
            alg_name,
            verifier: es512_key(pem)?,
            grace,
        }));
    }
    let algorithm = Algorithm::from_str(&alg_name)
        .map_err(|_| format!("algorithm {alg_name} is not supported"))?;
    let key = if alg_name.starts_with("HS") {
        let secret = text("secret").ok_or("missing secret")?;
        if conf.get("base64_secret").and_then(Value::as_bool) == Some(true) {
            let bytes = BASE64
                .decode(secret)
                .map_err(|_| "base64_secret required but the secret is not in base64 format")?;
            DecodingKey::from_secret(&bytes)
        } else {
            DecodingKey::from_secret(secret.as_bytes())
        }
    } else {
        let pem = text("public_key")
            .ok_or("missing valid public key")?
            .as_bytes();
        let made = if alg_name.starts_with("RS") || alg_name.starts_with("PS") {
            DecodingKey::from_rsa_pem(pem)
        } else if alg_name.starts_with("ES") {
            DecodingKey::from_ec_pem(pem)
        } else {
            DecodingKey::from_ed_pem(pem)
        };
        made.map_err(|_| "invalid public key".to_owned())?
    };
    Ok(Arc::new(JwtKey {
        alg_name,
        verifier: Verifier::Jwt { algorithm, key },
        grace,
    }))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    Exp,
    Nbf,
}

struct JwtAuth {
    header: Option<HeaderName>,
    query: String,
    cookie_var: String,
    cookie: String,
    hide_credentials: bool,
    key_claim_name: String,
    store_in_ctx: bool,
    anonymous_consumer: Option<String>,
    /// `None`: the default claims, checked when present.
    claims_to_verify: Option<Vec<Claim>>,
    challenge: Option<HeaderValue>,
    clock: Clock,
}

/// The verified claims of the token, kept for later plugins when `store_in_ctx` is set
/// (APISIX's `ctx.jwt_auth_payload`).
#[derive(Debug, Clone, PartialEq)]
pub struct JwtAuthPayload(pub Map<String, Value>);

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let text = |name: &str, default: &str| {
        conf.get(name)
            .and_then(Value::as_str)
            .unwrap_or(default)
            .to_owned()
    };
    let header = text("header", "authorization");
    let cookie = text("cookie", "jwt");
    let claims_to_verify = conf
        .get("claims_to_verify")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
        .map(|a| {
            a.iter()
                .filter_map(|c| match c.as_str() {
                    Some("exp") => Some(Claim::Exp),
                    Some("nbf") => Some(Claim::Nbf),
                    _ => None,
                })
                .collect()
        });
    Ok(Arc::new(JwtAuth {
        header: HeaderName::from_bytes(header.to_ascii_lowercase().as_bytes()).ok(),
        query: text("query", "jwt"),
        cookie_var: format!("cookie_{cookie}"),
        cookie,
        hide_credentials: conf.get("hide_credentials").and_then(Value::as_bool) == Some(true),
        key_claim_name: text("key_claim_name", "key"),
        store_in_ctx: conf.get("store_in_ctx").and_then(Value::as_bool) == Some(true),
        anonymous_consumer: conf
            .get("anonymous_consumer")
            .and_then(Value::as_str)
            .map(str::to_owned),
        claims_to_verify,
        challenge: challenge("Bearer", &text("realm", "jwt")),
        clock: cx.services.clock().clone(),
    }))
}

/// APISIX's `remove_specified_cookie`: the `name=value` pairs of the Cookie header but `key`'s.
fn cookie_without(src: &str, key: &str) -> String {
    let is_key = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    let is_val = |c: char| is_key(c) || c == '.';
    let mut kept = Vec::new();
    for pair in src.split(';') {
        let pair = pair.trim();
        let Some((k, v)) = pair.split_once('=') else {
            continue;
        };
        if k.chars().all(is_key) && k != key {
            let v: String = v.chars().take_while(|c| is_val(*c)).collect();
            kept.push(format!("{k}={v}"));
        }
    }
    kept.join("; ")
}

/// A token split into its parts, its header and payload decoded.
struct Token<'t> {
    signing_input: &'t str,
    signature: &'t str,
    alg: Option<String>,
    payload: Map<String, Value>,
}

fn parse(token: &str) -> Option<Token<'_>> {
    let (signing_input, signature) = token.rsplit_once('.')?;
    let (header, payload) = signing_input.split_once('.')?;
    if payload.contains('.') {
        return None;
    }
    let header: Value = serde_json::from_slice(&BASE64URL.decode(header).ok()?).ok()?;
    let payload: Value = serde_json::from_slice(&BASE64URL.decode(payload).ok()?).ok()?;
    let Value::Object(payload) = payload else {
        return None;
    };
    Some(Token {
        signing_input,
        signature,
        alg: header.get("alg").and_then(Value::as_str).map(str::to_owned),
        payload,
    })
}

impl JwtAuth {
    /// The token, taken out of the request when `hide_credentials` is set.
    fn fetch(&self, ctx: &mut PluginCtx<'_>) -> Option<String> {
        if let Some(h) = &self.header {
            if let Some(v) = ctx.headers().get(h) {
                let token = String::from_utf8_lossy(v.as_bytes()).into_owned();
                if self.hide_credentials {
                    ctx.headers_mut().remove(h);
                }
                return Some(match token.get(..7) {
                    Some("Bearer " | "bearer ") => token[7..].to_owned(),
                    _ => token,
                });
            }
        }
        if let Some(t) = ctx.arg(&self.query) {
            let t = t.into_owned();
            if self.hide_credentials {
                hide_query_arg(ctx, &self.query);
            }
            return Some(t);
        }
        let val = ctx.var(&self.cookie_var)?.into_owned();
        if self.hide_credentials {
            let src = ctx.header("cookie").unwrap_or_default().to_owned();
            let rest = cookie_without(&src, &self.cookie);
            match HeaderValue::from_str(&rest) {
                Ok(v) if !rest.is_empty() => {
                    ctx.headers_mut().insert(http::header::COOKIE, v);
                }
                _ => {
                    ctx.headers_mut().remove(http::header::COOKIE);
                }
            }
        }
        Some(val)
    }

    fn verify_claims(&self, payload: &Map<String, Value>, grace: i64) -> Result<(), String> {
        let now = (self.clock.epoch_ms() / 1000) as f64;
        let grace = grace as f64;
        let check = |claim: Claim, required: bool| -> Result<(), String> {
            let name = match claim {
                Claim::Exp => "exp",
                Claim::Nbf => "nbf",
            };
            let Some(v) = payload.get(name) else {
                return if required {
                    Err(format!("claim {name} is missing"))
                } else {
                    Ok(())
                };
            };
            let Some(t) = v.as_f64() else {
                return Err(format!("claim {name} is not a number"));
            };
            match claim {
                Claim::Exp if t > now - grace => Ok(()),
                Claim::Exp => Err("'exp' claim expired".into()),
                Claim::Nbf if t < now + grace => Ok(()),
                Claim::Nbf => Err("'nbf' claim not valid yet".into()),
            }
        };
        match &self.claims_to_verify {
            None => {
                check(Claim::Nbf, false)?;
                check(Claim::Exp, false)
            }
            Some(claims) => claims.iter().try_for_each(|c| check(*c, true)),
        }
    }

    fn find(&self, ctx: &mut PluginCtx<'_>) -> Result<(), &'static str> {
        let token = self.fetch(ctx).ok_or("Missing JWT token in request")?;
        let parsed = parse(&token).ok_or_else(|| {
            tracing::warn!("JWT token invalid");
            "JWT token invalid"
        })?;
        let user_key = match parsed.payload.get(&self.key_claim_name) {
            None | Some(Value::Null) => return Err("missing user key in JWT token"),
            Some(Value::String(s)) => s.as_str(),
            // Keys are strings: no credential has a non-string one.
            Some(_) => return Err("Invalid user key in JWT token"),
        };
        let Some(cred) = ctx.find_credential(NAME, user_key).cloned() else {
            tracing::warn!("failed to find consumer: invalid user key");
            return Err("Invalid user key in JWT token");
        };
        let Some(key) = cred.prepared::<JwtKey>() else {
            return Err("failed to verify jwt");
        };
        // The algorithm is the credential's, never the token's choice: this refuses
        // `alg: none` and an RSA public key used as an HMAC secret.
        if parsed.alg.as_deref() != Some(key.alg_name.as_str()) {
            tracing::warn!(
                "failed to verify jwt: algorithm mismatch, expected {}",
                key.alg_name
            );
            return Err("failed to verify jwt");
        }
        if !key.verifier.verify(parsed.signing_input, parsed.signature) {
            tracing::warn!("failed to verify jwt: signature mismatch");
            return Err("failed to verify jwt");
        }
        if let Err(e) = self.verify_claims(&parsed.payload, key.grace) {
            tracing::error!("failed to verify jwt: {e}");
            return Err("failed to verify jwt");
        }
        if self.store_in_ctx {
            ctx.insert(JwtAuthPayload(parsed.payload));
        }
        ctx.attach_consumer(cred.consumer.clone());
        Ok(())
    }
}

impl Plugin for JwtAuth {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let Err(msg) = self.find(ctx) else {
            return Step::CONTINUE;
        };
        let anonymous_consumer = self.anonymous_consumer.as_deref();
        match anonymous_or_401(ctx, NAME, anonymous_consumer, msg, self.challenge.as_ref()) {
            Ok(()) => Step::CONTINUE,
            Err(exit) => Step::exit(exit),
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::{Consumer, ConsumerIndex, Credential, Flow, PluginServices};
    use jsonwebtoken::{encode, EncodingKey, Header};

    use super::*;
    use crate::testing::Compiler;

    const RSA_KEY: &str = include_str!("../../testdata/jwt/rsa.key");
    const RSA_PUB: &str = include_str!("../../testdata/jwt/rsa.pub");
    const RSA2_PUB: &str = include_str!("../../testdata/jwt/rsa2.pub");
    const RSA2_KEY: &str = include_str!("../../testdata/jwt/rsa2.key");
    const EC_KEY: &str = include_str!("../../testdata/jwt/ec.key");
    const EC_PUB: &str = include_str!("../../testdata/jwt/ec.pub");
    const ED_KEY: &str = include_str!("../../testdata/jwt/ed.key");
    const ED_PUB: &str = include_str!("../../testdata/jwt/ed.pub");
    /// A P-521 public key and, one a line, ES512 tokens made with PyJWT 2.15 (on Python's
    /// `cryptography`): `{"key": "k-es512", "exp": 4102444800}` signed by its private key,
    /// the same claims signed by another P-521 key, and `exp` 1000000000 (long expired).
    const ES512_PUB: &str = include_str!("../../testdata/jwt/es512.pub");
    const ES512_TOKENS: &str = include_str!("../../testdata/jwt/es512-tokens.txt");

    /// Now, as the tests' manual clock says.
    const NOW: i64 = 1_700_000_000;

    fn index() -> Arc<ConsumerIndex> {
        let mut index = ConsumerIndex::default();
        let creds = [
            ("jack", json!({"key": "k-hs", "secret": "my-secret"})),
            (
                "b64",
                json!({"key": "k-b64", "secret": "c2VjcmV0LWJ5dGVz", "base64_secret": true,
                    "algorithm": "HS512"}),
            ),
            (
                "rsa",
                json!({"key": "k-rs", "algorithm": "RS256", "public_key": RSA_PUB}),
            ),
            (
                "ps",
                json!({"key": "k-ps", "algorithm": "PS256", "public_key": RSA_PUB}),
            ),
            (
                "ec",
                json!({"key": "k-es", "algorithm": "ES256", "public_key": EC_PUB}),
            ),
            (
                "ed",
                json!({"key": "k-ed", "algorithm": "EdDSA", "public_key": ED_PUB}),
            ),
            (
                "es512",
                json!({"key": "k-es512", "algorithm": "ES512", "public_key": ES512_PUB}),
            ),
            (
                "grace",
                json!({"key": "k-grace", "secret": "s", "lifetime_grace_period": 100}),
            ),
        ];
        for (name, mut conf) in creds {
            let consumer = Arc::new(Consumer {
                username: name.into(),
                ..Default::default()
            });
            let schema = consumer_schema();
            ferrisix_config::schema::validate_and_fill(&schema, &mut conf).unwrap();
            let key = conf["key"].as_str().unwrap().to_owned();
            index.add_consumer(consumer.clone());
            index.add_credential(
                NAME,
                key,
                Credential {
                    consumer,
                    prepared: Some(prepare(&conf).unwrap()),
                    conf,
                },
            );
        }
        index.add_consumer(Arc::new(Consumer {
            username: "anon".into(),
            ..Default::default()
        }));
        Arc::new(index)
    }

    fn run(conf: Value, mut req: TestRequest) -> (Flow, TestRequest) {
        let services = Arc::new(PluginServices::new(
            Default::default(),
            ferrisix_plugin_api::Executor::current(),
            Clock::manual(NOW as u64 * 1000),
        ));
        let c = Compiler::with(services);
        let p = (DEF.compile)(&c.cx(NAME, &conf, "jwt", None)).unwrap();
        req.state.set_consumers(index());
        let Step::Done(flow) = p.rewrite(&mut req.ctx()) else {
            panic!("jwt-auth does not wait")
        };
        (flow, req)
    }

    fn hs(claims: Value, secret: &str) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    }

    fn message(flow: &Flow) -> String {
        match flow {
            Flow::Continue => "passed".into(),
            Flow::Exit(e) => {
                assert_eq!(e.status, 401);
                assert!(e
                    .headers
                    .iter()
                    .any(|(n, v)| n == "www-authenticate" && v == "Bearer realm=\"jwt\""));
                let body: Value = serde_json::from_slice(e.body.as_deref().unwrap()).unwrap();
                body["message"].as_str().unwrap().to_owned()
            }
        }
    }

    fn bearer(token: &str) -> TestRequest {
        TestRequest::get("/").header("authorization", &format!("Bearer {token}"))
    }

    #[test]
    fn token_places_and_consumer() {
        let t = hs(json!({"key": "k-hs", "exp": NOW + 60}), "my-secret");
        let (flow, req) = run(json!({}), bearer(&t));
        assert_eq!(flow, Flow::Continue);
        assert_eq!(req.headers["x-consumer-username"], "jack");
        for req in [
            TestRequest::get("/").header("authorization", &format!("bearer {t}")),
            TestRequest::get("/").header("authorization", &t),
            TestRequest::get(&format!("/?jwt={t}")),
            TestRequest::get("/").header("cookie", &format!("a=1; jwt={t}")),
        ] {
            assert_eq!(message(&run(json!({}), req).0), "passed");
        }
        assert_eq!(
            message(&run(json!({}), TestRequest::get("/")).0),
            "Missing JWT token in request"
        );
        // Custom places.
        let conf = json!({"header": "X-Token", "query": "t", "cookie": "c"});
        let req = TestRequest::get("/").header("x-token", &t);
        assert_eq!(message(&run(conf.clone(), req).0), "passed");
        let req = TestRequest::get(&format!("/?t={t}"));
        assert_eq!(message(&run(conf.clone(), req).0), "passed");
        assert_eq!(
            message(&run(conf, bearer(&t)).0),
            "Missing JWT token in request"
        );
    }

    #[test]
    fn hide_credentials_everywhere() {
        let t = hs(json!({"key": "k-hs"}), "my-secret");
        let conf = json!({"hide_credentials": true});
        let (flow, req) = run(conf.clone(), bearer(&t));
        assert_eq!(flow, Flow::Continue);
        assert!(req.headers.get("authorization").is_none());
        let (_, mut req) = run(conf.clone(), TestRequest::get(&format!("/p?jwt={t}&a=1")));
        assert_eq!(req.ctx().upstream_uri(), "/p?a=1");
        let (_, req) = run(
            conf,
            TestRequest::get("/").header("cookie", &format!("a=1; jwt={t}; b=2")),
        );
        assert_eq!(req.headers["cookie"], "a=1; b=2");
    }

    #[test]
    fn bad_tokens() {
        let good = hs(json!({"key": "k-hs", "exp": NOW + 60}), "my-secret");
        let cases = [
            ("not-a-jwt".to_owned(), "JWT token invalid"),
            (format!("x{good}"), "JWT token invalid"),
            ("a.b".to_owned(), "JWT token invalid"),
            (
                hs(json!({"key": "k-hs"}), "other-secret"),
                "failed to verify jwt",
            ),
            (
                hs(json!({"key": "k-hs", "exp": NOW - 1}), "my-secret"),
                "failed to verify jwt",
            ),
            (
                hs(json!({"key": "k-hs", "nbf": NOW + 60}), "my-secret"),
                "failed to verify jwt",
            ),
            (
                hs(json!({"key": "k-hs", "exp": "tomorrow"}), "my-secret"),
                "failed to verify jwt",
            ),
            (
                hs(json!({"key": "nobody"}), "my-secret"),
                "Invalid user key in JWT token",
            ),
            (
                hs(json!({"key": 12}), "my-secret"),
                "Invalid user key in JWT token",
            ),
            (
                hs(json!({"exp": NOW + 60}), "my-secret"),
                "missing user key in JWT token",
            ),
        ];
        for (token, msg) in cases {
            assert_eq!(message(&run(json!({}), bearer(&token)).0), msg, "{token}");
        }
        // A 1 MB token is refused like any other that does not parse.
        let huge = "a".repeat(1 << 20);
        assert_eq!(
            message(&run(json!({}), bearer(&huge)).0),
            "JWT token invalid"
        );
        let huge_sig = format!("{good}{}", "A".repeat(1 << 20));
        assert_eq!(
            message(&run(json!({}), bearer(&huge_sig)).0),
            "failed to verify jwt"
        );
    }

    #[test]
    fn alg_none_and_confusion_are_refused() {
        let b64 = |v: &Value| BASE64URL.encode(v.to_string());
        let none = format!(
            "{}.{}.",
            b64(&json!({"alg": "none", "typ": "JWT"})),
            b64(&json!({"key": "k-hs"}))
        );
        assert_eq!(
            message(&run(json!({}), bearer(&none)).0),
            "failed to verify jwt"
        );
        // HS256 signed with the RSA consumer's public key as the secret.
        let confused = encode(
            &Header::new(Algorithm::HS256),
            &json!({"key": "k-rs"}),
            &EncodingKey::from_secret(RSA_PUB.as_bytes()),
        )
        .unwrap();
        assert_eq!(
            message(&run(json!({}), bearer(&confused)).0),
            "failed to verify jwt"
        );
        // The RS consumer with a token of another RSA key.
        let other = encode(
            &Header::new(Algorithm::RS256),
            &json!({"key": "k-rs"}),
            &EncodingKey::from_rsa_pem(RSA2_KEY.as_bytes()).unwrap(),
        )
        .unwrap();
        assert_eq!(
            message(&run(json!({}), bearer(&other)).0),
            "failed to verify jwt"
        );
        let _ = RSA2_PUB;
    }

    #[test]
    fn asymmetric_algorithms_and_base64_secret() {
        let sign = |alg: Algorithm, key: EncodingKey, claim: &str| {
            encode(&Header::new(alg), &json!({"key": claim}), &key).unwrap()
        };
        let tokens = [
            sign(
                Algorithm::RS256,
                EncodingKey::from_rsa_pem(RSA_KEY.as_bytes()).unwrap(),
                "k-rs",
            ),
            sign(
                Algorithm::PS256,
                EncodingKey::from_rsa_pem(RSA_KEY.as_bytes()).unwrap(),
                "k-ps",
            ),
            sign(
                Algorithm::ES256,
                EncodingKey::from_ec_pem(EC_KEY.as_bytes()).unwrap(),
                "k-es",
            ),
            sign(
                Algorithm::EdDSA,
                EncodingKey::from_ed_pem(ED_KEY.as_bytes()).unwrap(),
                "k-ed",
            ),
            sign(
                Algorithm::HS512,
                EncodingKey::from_secret(b"secret-bytes"),
                "k-b64",
            ),
        ];
        for t in tokens {
            assert_eq!(message(&run(json!({}), bearer(&t)).0), "passed", "{t}");
        }
        // An RS256 token for the PS256 consumer: the algorithm is the consumer's.
        let rs_for_ps = sign(
            Algorithm::RS256,
            EncodingKey::from_rsa_pem(RSA_KEY.as_bytes()).unwrap(),
            "k-ps",
        );
        assert_eq!(
            message(&run(json!({}), bearer(&rs_for_ps)).0),
            "failed to verify jwt"
        );
    }

    #[test]
    fn claims_grace_and_anonymous() {
        // Expired 50 s ago, within the consumer's 100 s grace period.
        let t = hs(json!({"key": "k-grace", "exp": NOW - 50}), "s");
        assert_eq!(message(&run(json!({}), bearer(&t)).0), "passed");
        let t = hs(json!({"key": "k-grace", "exp": NOW - 150}), "s");
        assert_eq!(
            message(&run(json!({}), bearer(&t)).0),
            "failed to verify jwt"
        );
        // claims_to_verify makes the listed claims required.
        let no_exp = hs(json!({"key": "k-hs"}), "my-secret");
        assert_eq!(message(&run(json!({}), bearer(&no_exp)).0), "passed");
        assert_eq!(
            message(&run(json!({"claims_to_verify": ["exp"]}), bearer(&no_exp)).0),
            "failed to verify jwt"
        );
        let (flow, req) = run(
            json!({"anonymous_consumer": "anon"}),
            bearer(&hs(json!({"key": "k-hs"}), "bad")),
        );
        assert_eq!(flow, Flow::Continue);
        assert_eq!(req.headers["x-consumer-username"], "anon");
        // store_in_ctx keeps the payload for later plugins.
        let (_, mut req) = run(json!({"store_in_ctx": true}), bearer(&no_exp));
        assert_eq!(
            req.ctx()
                .get::<JwtAuthPayload>()
                .map(|p| p.0["key"].clone()),
            Some(json!("k-hs"))
        );
        // A custom key claim.
        let t = hs(json!({"iss": "k-hs"}), "my-secret");
        assert_eq!(
            message(&run(json!({"key_claim_name": "iss"}), bearer(&t)).0),
            "passed"
        );
    }

    #[test]
    fn consumer_checks() {
        let c = Compiler::new();
        let r = &c.registry;
        let err = |conf: Value| r.check_consumer(NAME, &conf).unwrap_err();
        assert!(err(json!({"key": "k"}))
            .ends_with("property \"secret\" is required when using HS based algorithms"));
        assert!(
            err(json!({"key": "k", "secret": "!!", "base64_secret": true}))
                .ends_with("base64_secret required but the secret is not in base64 format")
        );
        assert!(
            err(json!({"key": "k", "algorithm": "RS256"})).ends_with("missing valid public key")
        );
        assert!(err(json!({"key": "k", "algorithm": "XX", "secret": "s"})).contains("algorithm"));
        assert!(r
            .check_consumer(NAME, &json!({"key": "k", "secret": "s"}))
            .is_ok());
        // The route conf has none of the consumer's rules.
        assert!(r.check(NAME, &json!({})).is_ok());
        assert!(r
            .check(NAME, &json!({"claims_to_verify": ["iat"]}))
            .is_err());
        // A key of another curve for ES512, and a public key that is not one, are refused
        // when compiled.
        assert!(prepare(&json!({"key": "k", "algorithm": "ES512", "public_key": EC_PUB})).is_err());
        assert!(prepare(&json!({"key": "k", "algorithm": "ES512", "public_key": "nope"})).is_err());
        assert!(prepare(&json!({"key": "k", "algorithm": "RS256", "public_key": "nope"})).is_err());
        assert!(
            prepare(&json!({"key": "k", "algorithm": "ES512", "public_key": ES512_PUB})).is_ok()
        );
    }

    #[test]
    fn es512_tokens_from_another_library() {
        let tokens: Vec<&str> = ES512_TOKENS.lines().collect();
        let [good, other_key, expired] = tokens[..] else {
            panic!("three tokens")
        };
        let (flow, req) = run(json!({}), bearer(good));
        assert_eq!(message(&flow), "passed");
        assert_eq!(req.headers["x-consumer-username"], "es512");
        assert_eq!(
            message(&run(json!({}), bearer(other_key)).0),
            "failed to verify jwt"
        );
        assert_eq!(
            message(&run(json!({}), bearer(expired)).0),
            "failed to verify jwt"
        );
        // A flipped bit of the signature, a signature cut short, a DER-encoded one.
        let (input, sig) = good.rsplit_once('.').unwrap();
        let mut raw = BASE64URL.decode(sig).unwrap();
        raw[10] ^= 1;
        let flipped = format!("{input}.{}", BASE64URL.encode(&raw));
        assert_eq!(
            message(&run(json!({}), bearer(&flipped)).0),
            "failed to verify jwt"
        );
        let short = format!("{input}.{}", BASE64URL.encode(&raw[..100]));
        assert_eq!(
            message(&run(json!({}), bearer(&short)).0),
            "failed to verify jwt"
        );
        // The consumer's algorithm wins: an HS512 token naming the ES512 consumer, signed
        // with its public key as the secret, is refused.
        let confused = encode(
            &Header::new(Algorithm::HS512),
            &json!({"key": "k-es512"}),
            &EncodingKey::from_secret(ES512_PUB.as_bytes()),
        )
        .unwrap();
        assert_eq!(
            message(&run(json!({}), bearer(&confused)).0),
            "failed to verify jwt"
        );
    }

    #[test]
    fn cookie_rewrite() {
        assert_eq!(cookie_without("a=1; jwt=x.y.z; b=2", "jwt"), "a=1; b=2");
        assert_eq!(cookie_without("jwt=x", "jwt"), "");
    }
}
