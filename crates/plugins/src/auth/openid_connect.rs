//! openid-connect (`apisix/plugins/openid-connect.lua`, over lua-resty-openidc): the gateway
//! as an OAuth 2.0 resource server for bearer tokens.
//!
//! First the identity headers a client may have sent (`X-Access-Token`, `X-Userinfo`,
//! `X-ID-Token`, `X-Refresh-Token`, `X-Raw-ID-Token`) are cleared; a client's
//! `X-Access-Token` is kept aside as the token when there is no `Authorization` header. With
//! `bearer_only`, `public_key`, `use_jwks` or `introspection_endpoint`, the bearer token is
//! verified: locally (`public_key`, or the provider's JWKS from the discovery document with
//! `use_jwks`; see [`jwt`]) or by the provider's token introspection endpoint (`client_secret_basic` or
//! `client_secret_post`; answers cached for `introspection_interval` seconds). Then
//! `required_scopes` and `claim_validator.audience` (`required`, `match_with_client_id`,
//! `claim`) are checked (403 `{"error": ...}`), `claim_schema` (401), and the upstream gets
//! the token (`X-Access-Token`, or `Authorization: Bearer` with
//! `access_token_in_authorization_header`) and the claims (`X-Userinfo`, base64 JSON).
//!
//! Without a token: `bearer_only` answers 401 with `WWW-Authenticate: Bearer realm=...`; else
//! `unauth_action` decides: `deny` 401, `pass` goes on unauthenticated. `auth` (the relying
//! party login flow with its session cookie) is not built: such a request answers 500, as
//! APISIX does when it cannot reach the provider. The discovery document and the JWKS are
//! fetched with `timeout` and `ssl_verify` and cached (`jwk_expires_in`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use base64::Engine;
use bytes::Bytes;
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{
    CheckCtx, Clock, CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef, PluginServices,
    Step,
};
use http::{HeaderName, HeaderValue, Method, Request, StatusCode};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::{json, Map, Value};

pub mod jwt;
pub mod login;

pub const NAME: &str = "openid-connect";

pub static DEF: PluginDef = PluginDef {
    version: 0.2,
    check: Some(check),
    schema_error: Some(schema_error),
    encrypt_fields: &[
        "client_secret",
        "client_rsa_private_key",
        "dpop.private_key",
        "session.secret",
        "session.redis.password",
    ],
    ..PluginDef::new(NAME, 2599, schema, compile)
};

fn session_schema() -> Value {
    let int =
        |min: u64, default: u64| json!({"type": "integer", "minimum": min, "default": default});
    json!({
        "type": "object",
        "properties": {
            "secret": {"type": "string", "minLength": 16},
            "cookie_name": {"type": "string"},
            "cookie_path": {"type": "string"},
            "cookie_domain": {"type": "string"},
            "cookie_secure": {"type": "boolean"},
            "cookie_http_only": {"type": "boolean"},
            "cookie_same_site": {"type": "string", "enum": ["Strict", "Lax", "None", "Default"]},
            "idling_timeout": {"type": "integer"},
            "rolling_timeout": {"type": "integer"},
            "absolute_timeout": {"type": "integer"},
            "cookie": {"type": "object", "properties": {"lifetime": {"type": "integer"}}},
            "storage": {"type": "string", "enum": ["cookie", "redis"], "default": "cookie"},
            "redis": {
                "type": "object",
                "properties": {
                    "host": {"type": "string", "minLength": 2, "default": "127.0.0.1"},
                    "port": int(1, 6379),
                    "username": {"type": "string", "minLength": 1},
                    "password": {"type": "string", "minLength": 0},
                    "database": int(0, 0),
                    "prefix": {"type": "string", "default": "sessions"},
                    "ssl": {"type": "boolean", "default": false},
                    "ssl_verify": {"type": "boolean", "default": true},
                    "server_name": {"type": "string"},
                    "connect_timeout": int(1, 1000),
                    "send_timeout": int(1, 1000),
                    "read_timeout": int(1, 1000),
                    "keepalive_timeout": int(1000, 10000)
                }
            }
        },
        "required": ["secret"],
        "if": {"properties": {"storage": {"enum": ["redis"]}}},
        "then": {"required": ["redis"]},
        "additionalProperties": false
    })
}

fn schema() -> Value {
    let flag = |default: bool| json!({"type": "boolean", "default": default});
    let text = || json!({"type": "string"});
    let mut properties = json!({
            "client_id": text(),
            "client_secret": text(),
            "discovery": text(),
            "scope": {"type": "string", "default": "openid"},
            "ssl_verify": flag(true),
            "timeout": {"type": "integer", "minimum": 1, "default": 3},
            "introspection_endpoint": text(),
            "introspection_endpoint_auth_method": {"type": "string", "default": "client_secret_basic"},
            "token_endpoint_auth_method": {"type": "string", "default": "client_secret_basic"},
            "bearer_only": flag(false),
            "session": session_schema(),
            "realm": {"type": "string", "default": "apisix"},
            "claim_validator": {
                "type": "object",
                "properties": {
                    "issuer": {
                        "type": "object",
                        "properties": {"valid_issuers": {"type": "array", "items": {"type": "string"}}}
                    },
                    "audience": {
                        "type": "object",
                        "properties": {
                            "claim": {"type": "string", "default": "aud"},
                            "required": flag(false),
                            "match_with_client_id": flag(false)
                        }
                    }
                }
            },
            "logout_path": {"type": "string", "default": "/logout"},
            "redirect_uri": text(),
            "post_logout_redirect_uri": text(),
            "unauth_action": {"type": "string", "default": "auth", "enum": ["auth", "deny", "pass"]},
            "public_key": text(),
            "use_jwks": flag(false),
            "token_signing_alg_values_expected": text(),
            "use_pkce": flag(false)
    });
    let more = json!({
            "par": {
                "type": "object",
                "properties": {
                    "enabled": flag(false),
                    "endpoint": text(),
                    "endpoint_auth_method": {
                        "type": "string",
                        "enum": ["client_secret_basic", "client_secret_post", "private_key_jwt",
                                 "client_secret_jwt"]
                    }
                },
                "additionalProperties": false
            },
            "dpop": {
                "type": "object",
                "properties": {
                    "enabled": flag(false),
                    "signing_alg": {"type": "string", "enum": ["ES256", "RS256", "PS256"], "default": "ES256"},
                    "private_key": text(),
                    "public_jwk": {
                        "type": "object",
                        "not": {"anyOf": [
                            {"required": ["d"]}, {"required": ["p"]}, {"required": ["q"]},
                            {"required": ["dp"]}, {"required": ["dq"]}, {"required": ["qi"]},
                            {"required": ["oth"]}, {"required": ["k"]}
                        ]}
                    }
                },
                "if": {"properties": {"enabled": {"const": true}}},
                "then": {"required": ["private_key", "public_jwk"]},
                "additionalProperties": false
            },
            "set_access_token_header": flag(true),
            "access_token_in_authorization_header": flag(false),
            "set_id_token_header": flag(true),
            "set_raw_id_token_header": flag(false),
            "set_userinfo_header": flag(true),
            "set_refresh_token_header": flag(false),
    });
    extend(&mut properties, more);
    let more = json!({
            "proxy_opts": {
                "type": "object",
                "properties": {
                    "http_proxy": text(),
                    "https_proxy": text(),
                    "http_proxy_authorization": text(),
                    "https_proxy_authorization": text(),
                    "no_proxy": text()
                }
            },
            "authorization_params": {"type": "object"},
            "client_rsa_private_key": text(),
            "client_rsa_private_key_id": text(),
            "client_jwt_assertion_expires_in": {"type": "integer", "default": 60},
            "client_jwt_assertion_alg": {
                "type": "string",
                "enum": ["HS256", "HS512", "RS256", "RS512", "ES256", "ES512"]
            },
            "client_jwt_assertion_audience": text(),
            "renew_access_token_on_expiry": flag(true),
            "access_token_expires_in": {"type": "integer"},
            "refresh_session_interval": {"type": "integer"},
            "iat_slack": {"type": "integer", "default": 120},
            "accept_none_alg": flag(false),
            "accept_unsupported_alg": flag(true),
            "access_token_expires_leeway": {"type": "integer", "default": 0},
            "force_reauthorize": flag(false),
            "use_nonce": flag(false),
            "revoke_tokens_on_logout": flag(false),
            "jwk_expires_in": {"type": "integer", "default": 86400},
            "jwt_verification_cache_ignore": flag(false),
            "cache_segment": text(),
            "introspection_interval": {"type": "integer", "default": 0},
            "introspection_expiry_claim": text(),
            "introspection_addon_headers": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "string", "pattern": "^[^:]+$"}
            },
            "required_scopes": {"type": "array", "items": {"type": "string"}},
            "claim_schema": {"type": "object"}
    });
    extend(&mut properties, more);
    json!({
        "type": "object",
        "properties": properties,
        "required": ["client_id", "discovery"]
    })
}

/// Adds `more`'s members to `to` (the schema is built in parts: one `json!` would be too
/// deep for the macro).
fn extend(to: &mut Value, more: Value) {
    if let (Some(to), Value::Object(more)) = (to.as_object_mut(), more) {
        to.extend(more);
    }
}

fn truthy(conf: &Value, key: &str) -> bool {
    !matches!(
        conf.get(key),
        None | Some(Value::Null) | Some(Value::Bool(false))
    )
}

fn text_of<'a>(conf: &'a Value, key: &str) -> Option<&'a str> {
    conf.get(key).and_then(Value::as_str)
}

/// What APISIX's `check_schema` checks before the schema: a session secret for the login
/// flow, and a client secret where the configured flow needs one.
fn before_schema(conf: &Value) -> Result<(), String> {
    let bearer_only = truthy(conf, "bearer_only");
    if !bearer_only && !truthy(conf, "session") {
        return Err("property \"session.secret\" is required when \"bearer_only\" is false".into());
    }
    let secret_optional = if bearer_only {
        truthy(conf, "public_key")
            || truthy(conf, "use_jwks")
            || text_of(conf, "introspection_endpoint_auth_method") == Some("private_key_jwt")
    } else {
        text_of(conf, "token_endpoint_auth_method") == Some("private_key_jwt")
            || truthy(conf, "use_pkce")
    };
    if !secret_optional && !truthy(conf, "client_secret") {
        return Err("property \"client_secret\" is required".into());
    }
    Ok(())
}

fn schema_error(cx: &CheckCtx<'_>, e: String) -> String {
    before_schema(cx.conf).err().unwrap_or(e)
}

/// The flat names the nested `par` and `dpop` objects own.
const RESERVED: &[(&str, &str)] = &[
    ("use_par", "par.enabled"),
    ("pushed_authorization_request_endpoint", "par.endpoint"),
    (
        "pushed_authorization_request_endpoint_auth_method",
        "par.endpoint_auth_method",
    ),
    ("use_dpop", "dpop.enabled"),
    ("dpop_signing_alg", "dpop.signing_alg"),
    ("dpop_private_key", "dpop.private_key"),
    ("dpop_public_jwk", "dpop.public_jwk"),
];

/// The credential each client authentication method needs.
fn method_credential(method: &str) -> Option<Option<&'static str>> {
    match method {
        "client_secret_basic" | "client_secret_post" => Some(None),
        "private_key_jwt" => Some(Some("client_rsa_private_key")),
        "client_secret_jwt" => Some(Some("client_secret")),
        _ => None,
    }
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    let conf = cx.conf;
    before_schema(conf)?;
    for (name, owner) in RESERVED {
        if conf.get(*name).is_some() {
            return Err(format!(
                "property \"{name}\" is not allowed, use \"{owner}\" instead"
            ));
        }
    }
    check_dpop_jwk(conf.get("dpop"))?;
    check_assertion_alg(conf)?;
    check_par_method(conf)
}

fn check_dpop_jwk(dpop: Option<&Value>) -> Result<(), String> {
    let Some(dpop) = dpop.filter(|d| d.get("enabled") == Some(&Value::Bool(true))) else {
        return Ok(());
    };
    let Some(jwk) = dpop.get("public_jwk") else {
        return Ok(());
    };
    let kty = jwk.get("kty").and_then(Value::as_str).unwrap_or_default();
    let required: &[&str] = match kty {
        "EC" => &["crv", "x", "y"],
        "RSA" => &["e", "n"],
        _ => {
            let shown = jwk.get("kty").map_or("nil".into(), |v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            });
            return Err(format!(
                "property \"dpop.public_jwk\" validation failed: kty \"{shown}\" is not supported"
            ));
        }
    };
    for member in required {
        match jwk.get(*member) {
            None | Some(Value::Null) => {
                return Err(format!(
                    "property \"dpop.public_jwk\" validation failed: kty \"{kty}\" requires {}",
                    required.join(", ")
                ))
            }
            Some(Value::String(s)) if !s.is_empty() => {}
            Some(_) => {
                return Err(format!(
                    "property \"dpop.public_jwk\" validation failed: \"{member}\" must be a non-empty string"
                ))
            }
        }
    }
    let alg = dpop
        .get("signing_alg")
        .and_then(Value::as_str)
        .unwrap_or("ES256");
    let (want_kty, want_crv) = match alg {
        "ES256" => ("EC", Some("P-256")),
        _ => ("RSA", None),
    };
    if want_kty != kty {
        return Err(format!(
            "property \"dpop.signing_alg\" \"{alg}\" requires an {want_kty} \"dpop.public_jwk\""
        ));
    }
    if let Some(crv) = want_crv {
        let got = jwk.get("crv").and_then(Value::as_str).unwrap_or("nil");
        if got != crv {
            return Err(format!(
                "property \"dpop.signing_alg\" \"{alg}\" requires \"dpop.public_jwk\" crv \"{crv}\", got \"{got}\""
            ));
        }
    }
    Ok(())
}

/// The endpoints the conf reaches with a client authentication method (name, method).
fn reachable_methods(conf: &Value) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let bearer_only = truthy(conf, "bearer_only");
    if !(truthy(conf, "public_key") || truthy(conf, "use_jwks"))
        && (bearer_only || truthy(conf, "introspection_endpoint"))
    {
        let m =
            text_of(conf, "introspection_endpoint_auth_method").unwrap_or("client_secret_basic");
        out.push(("introspection_endpoint_auth_method", m.to_owned()));
    }
    if !bearer_only {
        let m = text_of(conf, "token_endpoint_auth_method").unwrap_or("client_secret_basic");
        let usable = match method_credential(m) {
            None | Some(None) => true,
            Some(Some(field)) => truthy(conf, field),
        };
        if usable {
            out.push(("token_endpoint_auth_method", m.to_owned()));
        }
        let par = conf.get("par");
        if par.and_then(|p| p.get("enabled")) == Some(&Value::Bool(true)) {
            if let Some(m) = par
                .and_then(|p| p.get("endpoint_auth_method"))
                .and_then(Value::as_str)
            {
                out.push(("par.endpoint_auth_method", m.to_owned()));
            }
        }
    }
    out
}

fn check_assertion_alg(conf: &Value) -> Result<(), String> {
    let Some(alg) = text_of(conf, "client_jwt_assertion_alg") else {
        return Ok(());
    };
    let methods = reachable_methods(conf);
    let by = |m: &str| methods.iter().find(|(_, x)| x == m).map(|(n, _)| *n);
    let (asym, sym) = (by("private_key_jwt"), by("client_secret_jwt"));
    if let (Some(a), Some(s)) = (asym, sym) {
        return Err(format!(
            "property \"client_jwt_assertion_alg\" is a single algorithm, but \"{a}\" selects private_key_jwt and \"{s}\" selects client_secret_jwt"
        ));
    }
    let symmetric = alg.starts_with("HS");
    if let (Some(a), true) = (asym, symmetric) {
        return Err(format!(
            "property \"client_jwt_assertion_alg\" \"{alg}\" is symmetric and cannot be used with the private_key_jwt selected by \"{a}\""
        ));
    }
    if let (Some(s), false) = (sym, symmetric) {
        return Err(format!(
            "property \"client_jwt_assertion_alg\" \"{alg}\" is asymmetric and cannot be used with the client_secret_jwt selected by \"{s}\""
        ));
    }
    Ok(())
}

fn check_par_method(conf: &Value) -> Result<(), String> {
    let par = conf.get("par");
    if truthy(conf, "bearer_only") || par.and_then(|p| p.get("enabled")) != Some(&Value::Bool(true))
    {
        return Ok(());
    }
    let Some(method) = par
        .and_then(|p| p.get("endpoint_auth_method"))
        .and_then(Value::as_str)
    else {
        return Ok(());
    };
    if let Some(Some(field)) = method_credential(method) {
        if !truthy(conf, field) {
            return Err(format!(
                "property \"par.endpoint_auth_method\" \"{method}\" requires \"{field}\" when \"par.enabled\" is true"
            ));
        }
    }
    Ok(())
}

/// The provider's signing keys (by `kid`, `None` for one without) and when they were fetched
/// (epoch ms).
type Jwks = (u64, Vec<(Option<String>, Value)>);

/// Introspection answers by token, with the epoch ms each expires at.
type Introspected = HashMap<String, (u64, Map<String, Value>)>;

/// What the provider's documents hold, fetched on demand and cached.
#[derive(Default)]
struct ProviderCache {
    /// (fetched at, epoch ms; the discovery document).
    discovery: ArcSwapOption<(u64, Value)>,
    /// (fetched at, epoch ms; the JWKS keys by `kid`, and those without one).
    jwks: ArcSwapOption<Jwks>,
    /// Introspection answers by token, with the epoch ms they expire at. Only the
    /// introspection path (a network call each miss) takes this lock.
    introspected: Mutex<Introspected>,
}

/// `public_key` parsed once for each key family its algorithms may name (a PEM holds one
/// key: the other families stay `None`).
struct PublicKeys {
    rsa: Option<Arc<DecodingKey>>,
    ec: Option<Arc<DecodingKey>>,
    ed: Option<Arc<DecodingKey>>,
}

impl PublicKeys {
    fn parse(pem: &str) -> PublicKeys {
        PublicKeys {
            rsa: jwt::pem_key(pem, Algorithm::RS256).map(Arc::new),
            ec: jwt::pem_key(pem, Algorithm::ES256).map(Arc::new),
            ed: jwt::pem_key(pem, Algorithm::EdDSA).map(Arc::new),
        }
    }

    fn key(&self, alg: Algorithm) -> Option<&Arc<DecodingKey>> {
        match alg {
            Algorithm::ES256 | Algorithm::ES384 => self.ec.as_ref(),
            Algorithm::EdDSA => self.ed.as_ref(),
            _ => self.rsa.as_ref(),
        }
    }
}

/// How the bearer token is verified.
enum Verifier {
    PublicKey(PublicKeys),
    Jwks,
    Introspection,
}

struct OpenIdConnect {
    client_id: String,
    client_secret: Option<String>,
    discovery: String,
    verifier: Option<Verifier>,
    bearer_only: bool,
    realm: String,
    challenge: Option<HeaderValue>,
    unauth_action: String,
    valid_issuers: Option<Vec<String>>,
    expected_alg: Option<String>,
    accept_none_alg: bool,
    iat_slack: i64,
    audience_claim: String,
    audience_required: bool,
    match_with_client_id: bool,
    required_scopes: Option<Vec<String>>,
    claim_schema: Option<Value>,
    set_access_token_header: bool,
    access_token_in_authorization_header: bool,
    set_userinfo_header: bool,
    introspection_endpoint: Option<String>,
    introspection_auth_post: bool,
    introspection_interval: u64,
    introspection_addon_headers: Vec<HeaderName>,
    jwk_expires_in: u64,
    timeout: Duration,
    ssl_verify: bool,
    services: Arc<PluginServices>,
    clock: Clock,
    cache: ProviderCache,
    /// The relying-party login flow (without `bearer_only`).
    login: Option<login::Login>,
}

impl std::fmt::Debug for OpenIdConnect {
    /// The client secret is not printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenIdConnect")
            .field("client_id", &self.client_id)
            .field("discovery", &self.discovery)
            .finish_non_exhaustive()
    }
}

fn strings(v: Option<&Value>) -> Option<Vec<String>> {
    v.and_then(Value::as_array).map(|a| {
        a.iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect()
    })
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let s = |k: &str| text_of(&conf, k).map(str::to_owned);
    let b = |k: &str| conf.get(k).and_then(Value::as_bool).unwrap_or(false);
    let verifier = if let Some(pem) = s("public_key") {
        Some(Verifier::PublicKey(PublicKeys::parse(&pem)))
    } else if b("use_jwks") {
        Some(Verifier::Jwks)
    } else if b("bearer_only") || s("introspection_endpoint").is_some() {
        Some(Verifier::Introspection)
    } else {
        None
    };
    // Earlier releases stored the timeout in milliseconds: a whole number of seconds at or
    // above 1000 is read as milliseconds already.
    let timeout = conf["timeout"].as_u64().unwrap_or(3);
    let timeout_ms = if timeout >= 1000 && timeout % 1000 == 0 {
        timeout
    } else {
        timeout.saturating_mul(1000)
    };
    let realm = s("realm").unwrap_or_else(|| "apisix".into());
    let audience = conf.get("claim_validator").and_then(|c| c.get("audience"));
    let aud_flag = |k: &str| audience.and_then(|a| a.get(k)).and_then(Value::as_bool) == Some(true);
    Ok(Arc::new(OpenIdConnect {
        client_id: s("client_id").unwrap_or_default(),
        client_secret: s("client_secret"),
        discovery: s("discovery").unwrap_or_default(),
        verifier,
        bearer_only: b("bearer_only"),
        challenge: HeaderValue::from_str(&format!("Bearer realm=\"{realm}\"")).ok(),
        realm,
        unauth_action: s("unauth_action").unwrap_or_else(|| "auth".into()),
        valid_issuers: strings(
            conf.get("claim_validator")
                .and_then(|c| c.get("issuer"))
                .and_then(|i| i.get("valid_issuers")),
        ),
        expected_alg: s("token_signing_alg_values_expected"),
        accept_none_alg: b("accept_none_alg"),
        iat_slack: conf["iat_slack"].as_i64().unwrap_or(120),
        audience_claim: audience
            .and_then(|a| a.get("claim"))
            .and_then(Value::as_str)
            .unwrap_or("aud")
            .to_owned(),
        audience_required: aud_flag("required"),
        match_with_client_id: aud_flag("match_with_client_id"),
        required_scopes: strings(conf.get("required_scopes")),
        claim_schema: conf.get("claim_schema").cloned(),
        set_access_token_header: b("set_access_token_header"),
        access_token_in_authorization_header: b("access_token_in_authorization_header"),
        set_userinfo_header: b("set_userinfo_header"),
        introspection_endpoint: s("introspection_endpoint"),
        introspection_auth_post: s("introspection_endpoint_auth_method").as_deref()
            == Some("client_secret_post"),
        introspection_interval: conf["introspection_interval"].as_u64().unwrap_or(0),
        introspection_addon_headers: strings(conf.get("introspection_addon_headers"))
            .unwrap_or_default()
            .iter()
            .filter_map(|h| HeaderName::from_bytes(h.as_bytes()).ok())
            .collect(),
        jwk_expires_in: conf["jwk_expires_in"].as_u64().unwrap_or(86_400),
        timeout: Duration::from_millis(timeout_ms),
        ssl_verify: conf["ssl_verify"].as_bool().unwrap_or(true),
        services: cx.services.clone(),
        clock: cx.services.clock().clone(),
        cache: ProviderCache::default(),
        login: if b("bearer_only") {
            None
        } else {
            login::Login::new(&conf)
        },
    }))
}

/// The headers this plugin sends upstream: cleared first, so a client cannot send its own.
const IDENTITY_HEADERS: [&str; 5] = [
    "x-access-token",
    "x-userinfo",
    "x-id-token",
    "x-refresh-token",
    "x-raw-id-token",
];

/// Where the bearer token is, as `get_bearer_access_token` reads it.
enum Bearer {
    Token(String),
    None,
    /// An `Authorization` header without a space: 400.
    Malformed,
}

fn bearer(ctx: &PluginCtx<'_>, client_access_token: Option<String>) -> Bearer {
    let Some(auth) = ctx.header("authorization") else {
        return client_access_token.map_or(Bearer::None, Bearer::Token);
    };
    let Some((scheme, token)) = auth.split_once(' ') else {
        return Bearer::Malformed;
    };
    if scheme.eq_ignore_ascii_case("bearer") {
        Bearer::Token(token.to_owned())
    } else {
        Bearer::None
    }
}

fn forbidden(error: &str) -> Flow {
    let body = lua::cjson_encode(&json!({ "error": error }));
    Flow::Exit(Exit::body(StatusCode::FORBIDDEN, body))
}

impl OpenIdConnect {
    fn now_ms(&self) -> u64 {
        self.clock.epoch_ms()
    }

    /// 401 with `WWW-Authenticate: Bearer realm="...", error="invalid_token",
    /// error_description="<err>"`.
    fn invalid_token(&self, err: &str) -> Flow {
        let challenge = format!(
            "Bearer realm=\"{}\", error=\"invalid_token\", error_description=\"{err}\"",
            self.realm
        );
        let mut exit = Exit::status(StatusCode::UNAUTHORIZED);
        if let Ok(v) = HeaderValue::from_str(&challenge) {
            exit = exit.with_header(HeaderName::from_static("www-authenticate"), v);
        }
        Flow::Exit(exit)
    }

    async fn get_json(&self, url: &str) -> Result<Value, String> {
        let req = Request::get(url)
            .header("accept", "application/json")
            .body(Bytes::new())
            .map_err(|e| e.to_string())?;
        let resp = self
            .services
            .http()
            .send_verified(req, self.timeout, self.ssl_verify)
            .await
            .map_err(|e| format!("accessing {url} failed: {e}"))?;
        if resp.status() != StatusCode::OK {
            return Err(format!(
                "response indicates failure, status={}",
                resp.status().as_u16()
            ));
        }
        serde_json::from_slice(resp.body()).map_err(|e| format!("JSON decoding failed: {e}"))
    }

    /// The discovery document, cached for a day as lua-resty-openidc caches it.
    async fn discovery_doc(&self) -> Result<Value, String> {
        let now = self.now_ms();
        if let Some(c) = self.cache.discovery.load_full() {
            if now.saturating_sub(c.0) < 86_400_000 {
                return Ok(c.1.clone());
            }
        }
        let doc = self.get_json(&self.discovery).await?;
        self.cache
            .discovery
            .store(Some(Arc::new((now, doc.clone()))));
        Ok(doc)
    }

    /// The provider's signing keys, cached for `jwk_expires_in`; `refresh` fetches anew (a
    /// `kid` not found: the provider may have rotated its keys).
    async fn jwks(&self, refresh: bool) -> Result<Arc<Jwks>, String> {
        let now = self.now_ms();
        if !refresh {
            if let Some(c) = self.cache.jwks.load_full() {
                if now.saturating_sub(c.0) < self.jwk_expires_in.saturating_mul(1000) {
                    return Ok(c);
                }
            }
        }
        let doc = self.discovery_doc().await?;
        let uri = doc
            .get("jwks_uri")
            .and_then(Value::as_str)
            .ok_or("no jwks_uri in the discovery document")?;
        let set = self.get_json(uri).await?;
        let keys = set
            .get("keys")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|k| (k.get("kid").and_then(Value::as_str).map(str::to_owned), k))
            .collect();
        let fresh = Arc::new((now, keys));
        self.cache.jwks.store(Some(fresh.clone()));
        Ok(fresh)
    }

    fn verify_with(
        &self,
        token: &str,
        issuers: &[String],
        key_for: &jwt::KeyFor<'_>,
    ) -> Result<Map<String, Value>, String> {
        let opts = jwt::Verify {
            expected_alg: self.expected_alg.as_deref(),
            accept_none_alg: self.accept_none_alg,
            symmetric: self.client_secret.as_deref().map(str::as_bytes),
            valid_issuers: issuers,
            iat_slack: self.iat_slack,
            now: i64::try_from(self.now_ms() / 1000).unwrap_or(i64::MAX),
        };
        jwt::verify(token, &opts, key_for)
    }

    /// Local verification: the public key, or the JWKS key of the token's `kid`.
    async fn verify_locally(&self, token: &str) -> Result<Map<String, Value>, Flow> {
        let issuers = match &self.valid_issuers {
            Some(list) => list.clone(),
            None => match self.discovery_doc().await {
                Ok(doc) => doc
                    .get("issuer")
                    .and_then(Value::as_str)
                    .map(|i| vec![i.to_owned()])
                    .unwrap_or_default(),
                Err(e) => {
                    // Without the discovery document there is no trusted issuer: fail closed.
                    tracing::error!("OIDC access discovery url failed : {e}");
                    return Err(self.invalid_token("issuer validation unavailable"));
                }
            },
        };
        self.verify_signed(token, &issuers)
            .await
            .map_err(|e| self.invalid_token(&e))
    }

    /// A token's signature (the public key, else the provider's JWKS key of its `kid`) and
    /// claims.
    async fn verify_signed(
        &self,
        token: &str,
        issuers: &[String],
    ) -> Result<Map<String, Value>, String> {
        match &self.verifier {
            Some(Verifier::PublicKey(keys)) => {
                let key_for = |alg: Algorithm, _: &Map<String, Value>| {
                    keys.key(alg)
                        .cloned()
                        .ok_or_else(|| "invalid public key".to_owned())
                };
                self.verify_with(token, issuers, &key_for)
            }
            _ => {
                let kid = jwt::load(token).ok().and_then(|l| {
                    l.header
                        .get("kid")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                });
                let mut keys = self.jwks(false).await;
                let known = |keys: &Jwks| {
                    kid.is_none() || keys.1.iter().any(|(k, _)| k.as_deref() == kid.as_deref())
                };
                if matches!(&keys, Ok(k) if !known(k.as_ref())) {
                    keys = self.jwks(true).await;
                }
                match keys {
                    Ok(keys) => {
                        let key_for = |_: Algorithm, _: &Map<String, Value>| {
                            let jwk = keys
                                .1
                                .iter()
                                .find(|(k, _)| kid.is_none() || k.as_deref() == kid.as_deref())
                                .map(|(_, j)| j)
                                .ok_or_else(|| "no matching key in the JWKS".to_owned())?;
                            let jwk: jsonwebtoken::jwk::Jwk =
                                serde_json::from_value(jwk.clone())
                                    .map_err(|e| format!("invalid JWK: {e}"))?;
                            DecodingKey::from_jwk(&jwk)
                                .map(Arc::new)
                                .map_err(|e| e.to_string())
                        };
                        self.verify_with(token, issuers, &key_for)
                    }
                    Err(e) => Err(format!("jwt signature verification failed: {e}")),
                }
            }
        }
    }

    /// Token introspection (RFC 7662) at the configured or discovered endpoint.
    async fn introspect(
        &self,
        addon_headers: Vec<(HeaderName, HeaderValue)>,
        token: &str,
    ) -> Result<Map<String, Value>, String> {
        let now = self.now_ms();
        if self.introspection_interval > 0 {
            let cached = self
                .cache
                .introspected
                .lock()
                .ok()
                .and_then(|m| m.get(token).cloned());
            if let Some((until, claims)) = cached {
                if now < until {
                    return Ok(claims);
                }
            }
        }
        let endpoint = match &self.introspection_endpoint {
            Some(e) => e.clone(),
            None => {
                let doc = self.discovery_doc().await?;
                doc.get("introspection_endpoint")
                    .and_then(Value::as_str)
                    .ok_or("no introspection endpoint found")?
                    .to_owned()
            }
        };
        let enc = |s: &str| {
            percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
        };
        let mut body = format!("token={}&token_type_hint=access_token", enc(token));
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(&endpoint)
            .header("content-type", "application/x-www-form-urlencoded");
        let secret = self.client_secret.as_deref().unwrap_or_default();
        if self.introspection_auth_post {
            body.push_str(&format!(
                "&client_id={}&client_secret={}",
                enc(&self.client_id),
                enc(secret)
            ));
        } else {
            let basic = base64::engine::general_purpose::STANDARD.encode(format!(
                "{}:{}",
                enc(&self.client_id),
                enc(secret)
            ));
            req = req.header("authorization", format!("Basic {basic}"));
        }
        for (name, value) in addon_headers {
            req = req.header(name, value);
        }
        let req = req.body(Bytes::from(body)).map_err(|e| e.to_string())?;
        let resp = self
            .services
            .http()
            .send_verified(req, self.timeout, self.ssl_verify)
            .await
            .map_err(|e| format!("accessing introspection endpoint ({endpoint}) failed: {e}"))?;
        if resp.status() != StatusCode::OK {
            return Err(format!(
                "response indicates failure, status={}, body={}",
                resp.status().as_u16(),
                String::from_utf8_lossy(resp.body())
            ));
        }
        let claims: Map<String, Value> = serde_json::from_slice(resp.body())
            .map_err(|e| format!("JSON decoding failed: {e}"))?;
        if claims.get("active") != Some(&Value::Bool(true)) {
            return Err("invalid token".into());
        }
        if self.introspection_interval > 0 {
            let until = now + self.introspection_interval * 1000;
            if let Ok(mut m) = self.cache.introspected.lock() {
                m.retain(|_, (u, _)| *u > now);
                m.insert(token.to_owned(), (until, claims.clone()));
            }
        }
        Ok(claims)
    }

    /// The request's `introspection_addon_headers`, passed on to the introspection call.
    fn addon_headers(&self, ctx: &PluginCtx<'_>) -> Vec<(HeaderName, HeaderValue)> {
        self.introspection_addon_headers
            .iter()
            .filter_map(|n| Some((n.clone(), ctx.headers().get(n)?.clone())))
            .collect()
    }

    /// The checks on a verified token's claims, then the headers sent upstream.
    fn accept(&self, ctx: &mut PluginCtx<'_>, token: &str, claims: &Map<String, Value>) -> Flow {
        if let Some(required) = &self.required_scopes {
            let granted: Vec<&str> = claims
                .get("scope")
                .and_then(Value::as_str)
                .map(|s| s.split_whitespace().collect())
                .unwrap_or_default();
            if !required.iter().all(|r| granted.contains(&r.as_str())) {
                tracing::error!("OIDC introspection failed: required scopes not present");
                return forbidden(&format!(
                    "required scopes {} not present",
                    required.join(", ")
                ));
            }
        }
        let audience = claims
            .get(&self.audience_claim)
            .filter(|v| !matches!(v, Value::Null | Value::Bool(false)));
        if (self.audience_required || self.match_with_client_id) && audience.is_none() {
            tracing::error!(
                "OIDC introspection failed: required audience ({}) not present",
                self.audience_claim
            );
            return forbidden("required audience claim not present");
        }
        if self.match_with_client_id {
            let matched = match audience {
                Some(Value::Array(list)) => {
                    list.iter().any(|v| v.as_str() == Some(&self.client_id))
                }
                Some(Value::Object(_)) => false,
                Some(v) => v.as_str() == Some(self.client_id.as_str()),
                None => false,
            };
            if !matched {
                tracing::error!("OIDC introspection failed: audience does not match the client id");
                return forbidden("mismatched audience");
            }
        }
        if let Some(schema) = &self.claim_schema {
            if let Err(e) =
                ferrisix_config::schema::validate(schema, &Value::Object(claims.clone()))
            {
                tracing::error!("OIDC claim validation failed: {e}");
                return self.invalid_token(&e);
            }
        }
        if self.set_access_token_header {
            let (name, value) = if self.access_token_in_authorization_header {
                ("authorization", format!("Bearer {token}"))
            } else {
                ("x-access-token", token.to_owned())
            };
            if let Ok(v) = HeaderValue::from_str(&value) {
                ctx.headers_mut().insert(HeaderName::from_static(name), v);
            }
        }
        if self.set_userinfo_header {
            let json = lua::cjson_encode(&Value::Object(claims.clone()));
            let b64 = base64::engine::general_purpose::STANDARD.encode(json);
            if let Ok(v) = HeaderValue::from_str(&b64) {
                ctx.headers_mut()
                    .insert(HeaderName::from_static("x-userinfo"), v);
            }
        }
        Flow::Continue
    }

    async fn run(&self, ctx: &mut PluginCtx<'_>, client_access_token: Option<String>) -> Flow {
        if self.verifier.is_some() {
            match bearer(ctx, client_access_token) {
                Bearer::Malformed => {
                    tracing::error!(
                        "OIDC introspection failed: Invalid Authorization header format."
                    );
                    return Flow::Exit(Exit::status(StatusCode::BAD_REQUEST));
                }
                Bearer::Token(token) => {
                    let claims = match self.verifier {
                        Some(Verifier::Introspection) => {
                            match self.introspect(self.addon_headers(ctx), &token).await {
                                Ok(c) => c,
                                Err(e) => {
                                    tracing::error!("OIDC introspection failed: {e}");
                                    return self.invalid_token(&e);
                                }
                            }
                        }
                        _ => match self.verify_locally(&token).await {
                            Ok(c) => c,
                            Err(flow) => {
                                tracing::error!("OIDC introspection failed: invalid token");
                                return flow;
                            }
                        },
                    };
                    return self.accept(ctx, &token, &claims);
                }
                Bearer::None if self.bearer_only => {
                    let mut exit = Exit::status(StatusCode::UNAUTHORIZED);
                    if let Some(c) = &self.challenge {
                        exit = exit
                            .with_header(HeaderName::from_static("www-authenticate"), c.clone());
                    }
                    return Flow::Exit(exit);
                }
                Bearer::None => {}
            }
        }
        // No token: the session flow.
        match &self.login {
            Some(login) => self.session_flow(ctx, login).await,
            None if self.unauth_action == "pass" => Flow::Continue,
            None => Flow::Exit(Exit::status(StatusCode::UNAUTHORIZED)),
        }
    }
}

impl Plugin for OpenIdConnect {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let client_access_token = ctx.header("x-access-token").map(str::to_owned);
        for h in IDENTITY_HEADERS {
            ctx.headers_mut().remove(h);
        }
        // The cases decided without the provider answer now, without a future.
        let local =
            matches!(self.verifier, Some(Verifier::PublicKey(_))) && self.valid_issuers.is_some();
        if self.login.is_none() && (self.verifier.is_none() || local) {
            let fut = self.run(ctx, client_access_token);
            return match now_or_never(fut) {
                Some(flow) => Step::Done(flow),
                None => unreachable_wait(),
            };
        }
        Step::Wait(Box::pin(self.run(ctx, client_access_token)))
    }
}

/// Polls a future once: the paths that make no call finish on the first poll.
fn now_or_never<F: std::future::Future>(fut: F) -> Option<F::Output> {
    let waker = futures_noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

fn futures_noop_waker() -> std::task::Waker {
    std::task::Waker::noop().clone()
}

fn unreachable_wait() -> Step<'static> {
    // A local path never waits; were it to, refusing is the safe answer.
    tracing::error!("openid-connect: a local verification waited");
    Step::exit(Exit::status(StatusCode::INTERNAL_SERVER_ERROR))
}

#[cfg(test)]
mod tests;
