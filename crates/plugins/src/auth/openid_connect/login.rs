//! The relying-party side (lua-resty-openidc's `authenticate`, as APISIX's `rewrite` calls it
//! when a request carries no bearer token): the session cookie ([`crate::support::session`]) holds
//! the login; without one the browser is sent to the provider's authorization endpoint
//! (authorization code flow: `state`, `nonce` with `use_nonce`, PKCE S256 with `use_pkce`,
//! `authorization_params`); the provider sends it back to `redirect_uri`, where the code is
//! exchanged at the token endpoint, the ID token verified (signature by the provider's JWKS or
//! the client secret, `iss` the discovery document's, `sub`, `nonce`, `iat`, `exp`, `aud`
//! holding the client id), userinfo fetched, and the browser redirected to where it started.
//! Later requests carry the session: its access token is renewed with the refresh token when
//! it expires (`renew_access_token_on_expiry`, `access_token_expires_in`,
//! `access_token_expires_leeway`), the provider is asked again silently (`prompt=none`) every
//! `refresh_session_interval` seconds, and the upstream gets the tokens and userinfo as
//! headers. `logout_path` ends the session and sends the browser to the provider's
//! end-session endpoint (`id_token_hint`, `post_logout_redirect_uri`) or, without one, to
//! `post_logout_redirect_uri`.

use base64::Engine;
use bytes::Bytes;
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{Exit, Flow, PluginCtx};
use http::header::{CACHE_CONTROL, CONTENT_TYPE, LOCATION, SET_COOKIE};
use http::{HeaderName, HeaderValue, Method, Request, StatusCode};
use ring::rand::SecureRandom;
use serde_json::{json, Map, Value};

use super::{jwt, OpenIdConnect};
use crate::support::session::{Session, SessionConf};

/// lua-resty-openidc's answer to a state that does not match the session's.
const STATE_MISMATCH: &str = "state from argument does not match state restored from session";
const UNHANDLED_REDIRECT: &str = "unhandled request to the redirect_uri";
/// Consecutive restarts of the flow after failed callbacks, as APISIX bounds them.
const MAX_AUTH_FLOW_RESTARTS: u64 = 3;

/// A 1x1 transparent PNG: the logout answer to a client that prefers images (an `<img>`
/// pointing at the logout path), as lua-resty-openidc's.
const PIXEL: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x04, 0x00, 0x00, 0x00, 0xb5, 0x1c, 0x0c,
    0x02, 0x00, 0x00, 0x00, 0x0b, 0x49, 0x44, 0x41, 0x54, 0x78, 0xda, 0x63, 0x60, 0x00, 0x02, 0x00,
    0x00, 0x05, 0x00, 0x01, 0xe9, 0xfa, 0xdc, 0xd8, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44,
    0xae, 0x42, 0x60, 0x82,
];

/// The login flow's options.
#[derive(Debug)]
pub struct Login {
    pub session: SessionConf,
    pub redirect_uri: Option<String>,
    pub logout_path: String,
    pub post_logout_redirect_uri: Option<String>,
    pub scope: String,
    pub use_pkce: bool,
    pub use_nonce: bool,
    pub authorization_params: Vec<(String, String)>,
    pub token_auth_post: bool,
    pub renew: bool,
    pub access_token_expires_in: Option<i64>,
    pub access_token_expires_leeway: i64,
    pub refresh_session_interval: Option<i64>,
    pub force_reauthorize: bool,
    pub revoke_tokens_on_logout: bool,
    pub set_id_token_header: bool,
    pub set_refresh_token_header: bool,
    pub set_raw_id_token_header: bool,
}

impl Login {
    pub fn new(conf: &Value) -> Option<Login> {
        let session = conf.get("session").filter(|s| s.is_object())?;
        let s = |k: &str| conf.get(k).and_then(Value::as_str).map(str::to_owned);
        let b = |k: &str, d: bool| conf.get(k).and_then(Value::as_bool).unwrap_or(d);
        let i = |k: &str| conf.get(k).and_then(Value::as_i64);
        let authorization_params = conf
            .get("authorization_params")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| {
                        let v = match v {
                            Value::String(s) => s.clone(),
                            other => lua::cjson_encode(other),
                        };
                        (k.clone(), v)
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(Login {
            session: SessionConf::new(session),
            redirect_uri: s("redirect_uri"),
            logout_path: s("logout_path").unwrap_or_else(|| "/logout".into()),
            post_logout_redirect_uri: s("post_logout_redirect_uri"),
            scope: s("scope").unwrap_or_else(|| "openid".into()),
            use_pkce: b("use_pkce", false),
            use_nonce: b("use_nonce", false),
            authorization_params,
            token_auth_post: s("token_endpoint_auth_method").as_deref()
                == Some("client_secret_post"),
            renew: b("renew_access_token_on_expiry", true),
            access_token_expires_in: i("access_token_expires_in"),
            access_token_expires_leeway: i("access_token_expires_leeway").unwrap_or(0),
            refresh_session_interval: i("refresh_session_interval"),
            force_reauthorize: b("force_reauthorize", false),
            revoke_tokens_on_logout: b("revoke_tokens_on_logout", false),
            set_id_token_header: b("set_id_token_header", true),
            set_refresh_token_header: b("set_refresh_token_header", false),
            set_raw_id_token_header: b("set_raw_id_token_header", false),
        })
    }
}

fn random(len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // The system's generator does not fail on the platforms ferrisix runs on; were it to, the
    // zero bytes would make a state no callback can match (refused), never a guessable one
    // that is accepted, because the state is compared with the session's.
    let _ = ring::rand::SystemRandom::new().fill(&mut out);
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// What `ngx.escape_uri` and `ngx.encode_args` leave as it is: letters, digits, `-._~`.
const COMPONENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, COMPONENT).to_string()
}

fn form(params: &[(String, String)]) -> String {
    params
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// `uri` with `params` added to its query.
fn combine(uri: &str, params: &[(String, String)]) -> String {
    if params.is_empty() {
        return uri.to_owned();
    }
    let sep = if uri.contains('?') { '&' } else { '?' };
    format!("{uri}{sep}{}", form(params))
}

fn redirect(to: &str) -> Exit {
    let mut exit = Exit::status(StatusCode::FOUND);
    if let Ok(v) = HeaderValue::from_str(to) {
        exit = exit.with_header(LOCATION, v);
    }
    exit
}

fn arg(ctx: &PluginCtx<'_>, name: &str) -> Option<String> {
    ctx.arg(name).map(|v| v.into_owned())
}

/// A parameter of the first `Forwarded` element (RFC 7239), as lua-resty-openidc reads it.
fn forwarded(ctx: &PluginCtx<'_>, name: &str) -> Option<String> {
    let first = ctx.header("forwarded")?.split(',').next()?;
    first.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().trim_matches('"').to_owned())
    })
}

fn first_header(ctx: &PluginCtx<'_>, name: &str) -> Option<String> {
    ctx.header(name)
        .and_then(|v| v.split(',').next())
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// What `authenticate` ends with.
enum Outcome {
    /// An answer of its own (a redirect, the logout page).
    Exit(Exit),
    /// Authenticated: the ID token claims, the access token, the userinfo.
    Granted {
        id_token: Option<Value>,
        access_token: Option<String>,
        user: Option<Value>,
    },
    /// A failure, with the URL the flow started from.
    Failed(String, Option<String>),
}

impl OpenIdConnect {
    /// The absolute redirect URI: the configured one, else (APISIX's default) the request's
    /// path with `/.apisix/redirect` appended; a relative one gets the request's scheme and
    /// host (`Forwarded`, `X-Forwarded-Proto`/`-Host`, else the connection and `Host`).
    fn redirect_uri(&self, login: &Login, ctx: &PluginCtx<'_>) -> Result<String, Exit> {
        let path = match &login.redirect_uri {
            Some(u) if !u.starts_with('/') => return Ok(u.clone()),
            Some(u) => u.clone(),
            None => default_redirect_path(ctx.uri()),
        };
        let scheme = forwarded(ctx, "proto")
            .or_else(|| first_header(ctx, "x-forwarded-proto"))
            .unwrap_or_else(|| ctx.head().conn.scheme().to_owned());
        let host = forwarded(ctx, "host")
            .or_else(|| first_header(ctx, "x-forwarded-host"))
            .or_else(|| ctx.header("host").map(str::to_owned))
            .ok_or_else(|| Exit::status(StatusCode::BAD_REQUEST))?;
        Ok(format!("{scheme}://{host}{path}"))
    }

    /// The session flow: the answer, with the session's cookies set on it.
    pub(super) async fn session_flow(&self, ctx: &mut PluginCtx<'_>, login: &Login) -> Flow {
        let now = self.now_ms() / 1000;
        // The logout path needs the discovery document before anything else (APISIX: 503).
        let mut redirect_after_logout = None;
        if ctx.request_uri() == login.logout_path {
            match self.discovery_doc().await {
                Err(e) => {
                    tracing::error!("OIDC access discovery url failed : {e}");
                    return Flow::Exit(Exit::status(StatusCode::SERVICE_UNAVAILABLE));
                }
                Ok(doc) => {
                    if doc.get("end_session_endpoint").is_none() {
                        redirect_after_logout = login.post_logout_redirect_uri.clone();
                    }
                }
            }
        }
        let (mut session, why) = {
            let cookies: Vec<&str> = ctx
                .headers()
                .get_all(http::header::COOKIE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect();
            login.session.open(cookies.iter().copied(), now)
        };
        if let Some(why) = why.filter(|w| w != "missing session cookie") {
            tracing::info!("openid-connect: session not opened: {why}");
        }
        let mut cookies = match login.session.refresh(&mut session) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("openid-connect: session refresh failed: {e}");
                Vec::new()
            }
        };
        let outcome = self
            .authenticate(
                ctx,
                login,
                &mut session,
                &mut cookies,
                now,
                redirect_after_logout,
            )
            .await;
        let flow = self.conclude(ctx, login, &mut session, &mut cookies, now, outcome);
        for c in cookies {
            if let Ok(v) = HeaderValue::from_str(&c) {
                ctx.response_headers_mut().append(SET_COOKIE, v);
            }
        }
        flow
    }

    fn save(&self, login: &Login, session: &mut Session, cookies: &mut Vec<String>, now: u64) {
        match login.session.save(session, now) {
            Ok(set) => {
                // A saved session replaces what a refresh wrote for the same cookies.
                cookies.clear();
                cookies.extend(set);
            }
            Err(e) => tracing::warn!("unable to save session: {e}"),
        }
    }

    /// APISIX's handling of `authenticate`'s result.
    fn conclude(
        &self,
        ctx: &mut PluginCtx<'_>,
        login: &Login,
        session: &mut Session,
        cookies: &mut Vec<String>,
        now: u64,
        outcome: Outcome,
    ) -> Flow {
        match outcome {
            Outcome::Exit(exit) => Flow::Exit(exit),
            Outcome::Failed(err, _) if err == "unauthorized request" => {
                if self.unauth_action == "pass" {
                    Flow::Continue
                } else {
                    Flow::Exit(Exit::status(StatusCode::UNAUTHORIZED))
                }
            }
            Outcome::Failed(err, target) => {
                let mut restart: Option<(String, Option<String>)> = None;
                if err == STATE_MISMATCH {
                    restart = Some((
                        "state mismatch (replayed or pruned callback)".into(),
                        target.clone(),
                    ));
                } else if session.present() && err.starts_with(UNHANDLED_REDIRECT) {
                    let state = arg(ctx, "state");
                    if arg(ctx, "error").as_deref() == Some("temporarily_unavailable")
                        && state.is_some()
                        && state.as_deref() == session.get_str("state")
                    {
                        let detail = arg(ctx, "error_description")
                            .map(|d| format!(" ({d})"))
                            .unwrap_or_default();
                        restart = Some((
                            format!("authorization callback reported a temporarily unavailable identity provider{detail}"),
                            session.get_str("original_url").map(str::to_owned).or(target.clone()),
                        ));
                    }
                }
                if let Some((reason, Some(url))) = restart {
                    if session.present() && *ctx.method() == Method::GET {
                        let restarts = session
                            .get("auth_flow_restarts")
                            .and_then(Value::as_u64)
                            .unwrap_or(0);
                        if restarts < MAX_AUTH_FLOW_RESTARTS {
                            session.set("auth_flow_restarts", json!(restarts + 1));
                            self.save(login, session, cookies, now);
                            tracing::warn!("OIDC {reason}, restarting the authentication flow");
                            return Flow::Exit(redirect(&url));
                        }
                        tracing::error!(
                            "OIDC authentication failed: {err} (giving up after {restarts} restarts of the authentication flow)"
                        );
                        return Flow::Exit(Exit::status(StatusCode::INTERNAL_SERVER_ERROR));
                    }
                }
                tracing::error!("OIDC authentication failed: {err}");
                Flow::Exit(Exit::status(StatusCode::INTERNAL_SERVER_ERROR))
            }
            Outcome::Granted {
                id_token,
                access_token,
                user,
            } => {
                if let Some(schema) = &self.claim_schema {
                    let data =
                        json!({"user": user, "access_token": access_token, "id_token": id_token});
                    let mut data = data;
                    if let Value::Object(m) = &mut data {
                        m.retain(|_, v| !v.is_null());
                    }
                    if let Err(e) = ferrisix_config::schema::validate(schema, &data) {
                        tracing::error!("OIDC claim validation failed: {e}");
                        return self.invalid_token(&e);
                    }
                }
                if let Some(required) = &self.required_scopes {
                    let Some(granted) = session_scopes(access_token.as_deref(), id_token.as_ref())
                    else {
                        tracing::error!(
                            "OIDC authentication failed: the scopes granted to the session are unknown, so required scopes {} cannot be checked",
                            required.join(", ")
                        );
                        return Flow::Exit(Exit::body(
                            StatusCode::FORBIDDEN,
                            lua::cjson_encode(&json!({"error": "required scopes not present"})),
                        ));
                    };
                    if !required.iter().all(|r| granted.contains(r)) {
                        tracing::error!("OIDC authentication failed: required scopes not present");
                        return Flow::Exit(Exit::body(
                            StatusCode::FORBIDDEN,
                            lua::cjson_encode(&json!({
                                "error": format!("required scopes {} not present", required.join(", "))
                            })),
                        ));
                    }
                }
                let headers = ctx.headers_mut();
                let mut set = |name: &'static str, value: &str| {
                    if let Ok(v) = HeaderValue::from_str(value) {
                        headers.insert(HeaderName::from_static(name), v);
                    }
                };
                if let (Some(token), true) = (&access_token, self.set_access_token_header) {
                    if self.access_token_in_authorization_header {
                        set("authorization", &format!("Bearer {token}"));
                    } else {
                        set("x-access-token", token);
                    }
                }
                let b64 = |v: &Value| {
                    base64::engine::general_purpose::STANDARD.encode(lua::cjson_encode(v))
                };
                if let (Some(id), true) = (&id_token, login.set_id_token_header) {
                    set("x-id-token", &b64(id));
                }
                if let (Some(u), true) = (&user, self.set_userinfo_header) {
                    set("x-userinfo", &b64(u));
                }
                if let (Some(t), true) = (
                    session.get_str("refresh_token"),
                    login.set_refresh_token_header,
                ) {
                    set("x-refresh-token", t);
                }
                if let (Some(t), true) = (
                    session.get_str("enc_id_token"),
                    login.set_raw_id_token_header,
                ) {
                    set("x-raw-id-token", t);
                }
                if session.get("auth_flow_restarts").is_some() {
                    session.set("auth_flow_restarts", Value::Null);
                    self.save(login, session, cookies, now);
                }
                Flow::Continue
            }
        }
    }

    /// lua-resty-openidc's `authenticate` with APISIX's `unauth_action` (`pass` and `deny`
    /// both as `deny` there).
    async fn authenticate(
        &self,
        ctx: &mut PluginCtx<'_>,
        login: &Login,
        session: &mut Session,
        cookies: &mut Vec<String>,
        now: u64,
        redirect_after_logout: Option<String>,
    ) -> Outcome {
        let target = ctx.request_uri().to_owned();
        let path = target.split('?').next().unwrap_or_default().to_owned();
        // Only the paths that send it need the absolute URI (and a Host to build it from).
        let redirect_uri = self.redirect_uri(login, ctx);
        let redirect_path = match &login.redirect_uri {
            Some(u) => uri_path(u),
            None => default_redirect_path(ctx.uri()),
        };
        let deny = self.unauth_action != "auth";
        if path == redirect_path {
            if !session.present() {
                return Outcome::Failed(
                    "request to the redirect_uri path but there's no session state found".into(),
                    Some(target),
                );
            }
            let redirect_uri = match redirect_uri {
                Ok(u) => u,
                Err(exit) => return Outcome::Exit(exit),
            };
            return self
                .authorization_response(ctx, login, session, cookies, now, &redirect_uri)
                .await;
        }
        if path == login.logout_path {
            if let Err(e) = self.discovery_doc().await {
                return Outcome::Failed(e, session.get_str("original_url").map(str::to_owned));
            }
            return Outcome::Exit(
                self.logout(ctx, login, session, cookies, redirect_after_logout)
                    .await,
            );
        }
        let authenticated = session.get("authenticated") == Some(&Value::Bool(true));
        let mut token_expired = false;
        let mut access_token = None;
        if session.present() && authenticated {
            match self
                .access_token(login, session, cookies, now, login.renew)
                .await
            {
                Ok(t) => access_token = t,
                Err(e) => tracing::error!("lost access token:{e}"),
            }
            if access_token.is_none() {
                token_expired = true;
            }
        }
        let id_token = session.get("id_token").cloned();
        if !session.present()
            || !(id_token.is_some() || authenticated)
            || login.force_reauthorize
            || (login.renew && token_expired)
        {
            if deny {
                return Outcome::Failed("unauthorized request".into(), Some(target));
            }
            let redirect_uri = match redirect_uri {
                Ok(u) => u,
                Err(exit) => return Outcome::Exit(exit),
            };
            return self
                .authorize(login, session, cookies, now, &target, &redirect_uri, None)
                .await;
        }
        if let Some(interval) = login.refresh_session_interval {
            let last = session.get("last_authenticated").and_then(Value::as_i64);
            if last.is_none_or(|l| l + interval < now as i64) {
                let redirect_uri = match redirect_uri {
                    Ok(u) => u,
                    Err(exit) => return Outcome::Exit(exit),
                };
                return self
                    .authorize(
                        login,
                        session,
                        cookies,
                        now,
                        &target,
                        &redirect_uri,
                        Some("none"),
                    )
                    .await;
            }
        }
        Outcome::Granted {
            id_token,
            access_token,
            user: session.get("user").cloned(),
        }
    }

    /// Sends the browser to the authorization endpoint, the flow's secrets kept in the
    /// session.
    #[allow(clippy::too_many_arguments)]
    async fn authorize(
        &self,
        login: &Login,
        session: &mut Session,
        cookies: &mut Vec<String>,
        now: u64,
        target: &str,
        redirect_uri: &str,
        prompt: Option<&str>,
    ) -> Outcome {
        let doc = match self.discovery_doc().await {
            Ok(d) => d,
            Err(e) => {
                return Outcome::Failed(e, session.get_str("original_url").map(str::to_owned))
            }
        };
        let Some(endpoint) = doc.get("authorization_endpoint").and_then(Value::as_str) else {
            return Outcome::Failed(
                "no authorization_endpoint in the discovery document".into(),
                None,
            );
        };
        let state = hex(&random(16));
        let nonce = login.use_nonce.then(|| hex(&random(16)));
        let verifier = login.use_pkce.then(|| b64url(&random(32)));
        let mut params: Vec<(String, String)> = vec![
            ("client_id".into(), self.client_id.clone()),
            ("response_type".into(), "code".into()),
            ("scope".into(), login.scope.clone()),
            ("redirect_uri".into(), redirect_uri.to_owned()),
            ("state".into(), state.clone()),
        ];
        if let Some(n) = &nonce {
            params.push(("nonce".into(), n.clone()));
        }
        if let Some(p) = prompt {
            params.push(("prompt".into(), p.into()));
        }
        if let Some(v) = &verifier {
            let challenge = ring::digest::digest(&ring::digest::SHA256, v.as_bytes());
            params.push(("code_challenge_method".into(), "S256".into()));
            params.push(("code_challenge".into(), b64url(challenge.as_ref())));
        }
        for (k, v) in &login.authorization_params {
            params.retain(|(n, _)| n != k);
            params.push((k.clone(), v.clone()));
        }
        session.set("original_url", json!(target));
        session.set("state", json!(state));
        session.set("nonce", nonce.map_or(Value::Null, Value::String));
        session.set("code_verifier", verifier.map_or(Value::Null, Value::String));
        session.set("last_authenticated", json!(now));
        self.save(login, session, cookies, now);
        let exit = redirect(&combine(endpoint, &params)).with_header(
            CACHE_CONTROL,
            HeaderValue::from_static("no-cache, no-store, max-age=0"),
        );
        Outcome::Exit(exit)
    }

    /// The provider's answer at the redirect URI: the code for tokens.
    async fn authorization_response(
        &self,
        ctx: &mut PluginCtx<'_>,
        login: &Login,
        session: &mut Session,
        cookies: &mut Vec<String>,
        now: u64,
        redirect_uri: &str,
    ) -> Outcome {
        let original = session.get_str("original_url").map(str::to_owned);
        let (Some(code), Some(state)) = (arg(ctx, "code"), arg(ctx, "state")) else {
            return Outcome::Failed(
                format!("{UNHANDLED_REDIRECT}: {}", ctx.request_uri()),
                original,
            );
        };
        let expected = session.get_str("state").map(str::to_owned);
        // Constant time: the state is the callback's proof that this browser began the flow.
        let matches = expected.as_deref().is_some_and(|e| {
            bool::from(subtle::ConstantTimeEq::ct_eq(
                e.as_bytes(),
                state.as_bytes(),
            ))
        });
        if !matches {
            tracing::error!(
                "state from argument: {state} does not match state restored from session: {}",
                expected.as_deref().unwrap_or("nil")
            );
            return Outcome::Failed(STATE_MISMATCH.into(), original);
        }
        let doc = match self.discovery_doc().await {
            Ok(d) => d,
            Err(e) => return Outcome::Failed(e, original),
        };
        let issuer = doc
            .get("issuer")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if let Some(iss) = arg(ctx, "iss") {
            if iss != issuer {
                tracing::error!(
                    "iss from argument: {iss} does not match expected issuer: {issuer}"
                );
                return Outcome::Failed(
                    "iss from argument does not match expected issuer".into(),
                    original,
                );
            }
        }
        if let Some(client_id) = arg(ctx, "client_id") {
            if client_id != self.client_id {
                return Outcome::Failed(
                    "client_id from argument does not match expected client_id".into(),
                    original,
                );
            }
        }
        let mut body = vec![
            ("grant_type".to_owned(), "authorization_code".to_owned()),
            ("code".to_owned(), code),
            ("redirect_uri".to_owned(), redirect_uri.to_owned()),
            ("state".to_owned(), state),
        ];
        if let Some(v) = session.get_str("code_verifier") {
            body.push(("code_verifier".into(), v.to_owned()));
        }
        let tokens = match self.token_endpoint(login, &doc, body).await {
            Ok(t) => t,
            Err(e) => return Outcome::Failed(e, original),
        };
        let raw_id_token = tokens
            .get("id_token")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let nonce = session.get_str("nonce").map(str::to_owned);
        let id_token = match self
            .verify_id_token(raw_id_token, issuer, nonce.as_deref(), now)
            .await
        {
            Ok(c) => c,
            Err(e) => return Outcome::Failed(e, original),
        };
        session.set("authenticated", json!(true));
        session.set("nonce", Value::Null);
        session.set("state", Value::Null);
        session.set("code_verifier", Value::Null);
        session.set("id_token", Value::Object(id_token.clone()));
        let access_token = tokens
            .get("access_token")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        match self.userinfo(&doc, &access_token).await {
            Err(e) => tracing::error!("error calling userinfo endpoint: {e}"),
            Ok(None) => {}
            Ok(Some(user)) => {
                if id_token.get("sub") != user.get("sub") {
                    tracing::error!(
                        "\"sub\" claim in id_token is not equal to the \"sub\" claim returned from the userinfo endpoint"
                    );
                } else {
                    session.set("user", user);
                }
            }
        }
        session.set("enc_id_token", json!(raw_id_token));
        session.set("access_token", json!(access_token));
        session.set(
            "access_token_expiration",
            json!(now as i64 + self.expires_in(login, tokens.get("expires_in"))),
        );
        if let Some(r) = tokens.get("refresh_token").filter(|r| !r.is_null()) {
            session.set("refresh_token", r.clone());
        }
        self.save(login, session, cookies, now);
        let to = session.get_str("original_url").unwrap_or("/").to_owned();
        Outcome::Exit(redirect(&to))
    }

    fn expires_in(&self, login: &Login, expires_in: Option<&Value>) -> i64 {
        let given = expires_in.and_then(|v| match v {
            Value::Number(n) => n.as_i64(),
            Value::String(s) => s.parse().ok(),
            _ => None,
        });
        given.or(login.access_token_expires_in).unwrap_or(3600)
            - 1
            - login.access_token_expires_leeway
    }

    /// The session's access token, renewed with the refresh token when it has expired.
    async fn access_token(
        &self,
        login: &Login,
        session: &mut Session,
        cookies: &mut Vec<String>,
        now: u64,
        renew: bool,
    ) -> Result<Option<String>, String> {
        let Some(token) = session.get_str("access_token").map(str::to_owned) else {
            return Ok(None);
        };
        let expiration = session
            .get("access_token_expiration")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if (now as i64) < expiration {
            return Ok(Some(token));
        }
        if !renew {
            return Err("token expired".into());
        }
        let Some(refresh) = session.get_str("refresh_token").map(str::to_owned) else {
            return Err("token expired and no refresh token available".into());
        };
        let doc = self.discovery_doc().await?;
        let body = vec![
            ("grant_type".to_owned(), "refresh_token".to_owned()),
            ("refresh_token".to_owned(), refresh),
            ("scope".to_owned(), login.scope.clone()),
        ];
        let tokens = self.token_endpoint(login, &doc, body).await?;
        let issuer = doc
            .get("issuer")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let mut id_token = None;
        if let Some(raw) = tokens.get("id_token").and_then(Value::as_str) {
            match self.verify_id_token(raw, issuer, None, now).await {
                Ok(c) => id_token = Some((raw.to_owned(), c)),
                Err(e) => {
                    tracing::error!(
                        "invalid id token, discarding tokens returned while refreshing"
                    );
                    return Err(e);
                }
            }
        }
        let access = tokens
            .get("access_token")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        session.set("access_token", json!(access));
        session.set(
            "access_token_expiration",
            json!(now as i64 + self.expires_in(login, tokens.get("expires_in"))),
        );
        if let Some(r) = tokens.get("refresh_token").filter(|r| !r.is_null()) {
            session.set("refresh_token", r.clone());
        }
        if let Some((raw, claims)) = id_token {
            session.set("enc_id_token", json!(raw));
            session.set("id_token", Value::Object(claims));
        }
        self.save(login, session, cookies, now);
        Ok(Some(access))
    }

    /// Ends the session; the browser goes to the provider's end-session endpoint or the
    /// logout redirect.
    async fn logout(
        &self,
        ctx: &mut PluginCtx<'_>,
        login: &Login,
        session: &mut Session,
        cookies: &mut Vec<String>,
        redirect_after_logout: Option<String>,
    ) -> Exit {
        let id_token = session.get_str("enc_id_token").map(str::to_owned);
        let access = session.get_str("access_token").map(str::to_owned);
        let refresh = session.get_str("refresh_token").map(str::to_owned);
        if session.present() {
            cookies.clear();
            cookies.extend(login.session.destroy(session));
        }
        let doc = self.discovery_doc().await.unwrap_or(Value::Null);
        if login.revoke_tokens_on_logout {
            for (hint, token) in [("refresh_token", refresh), ("access_token", access)] {
                if let Some(token) = token {
                    if let Err(e) = self.revoke(login, &doc, hint, &token).await {
                        tracing::error!("revoking {hint} failed: {e}");
                    }
                }
            }
        }
        if prefers_png(ctx.header("accept")) {
            let mut exit = Exit::body(StatusCode::OK, Bytes::from_static(PIXEL));
            for (name, value) in [
                ("cache-control", "no-cache, no-store"),
                ("pragma", "no-cache"),
                ("p3p", "CAO PSA OUR"),
                ("expires", "0"),
                ("x-frame-options", "DENY"),
                ("content-type", "image/png"),
            ] {
                exit = exit.with_header(
                    HeaderName::from_static(name),
                    HeaderValue::from_static(value),
                );
            }
            return exit;
        }
        let end_session = doc.get("end_session_endpoint").and_then(Value::as_str);
        if let Some(uri) = redirect_after_logout.as_deref().or(end_session) {
            let mut params = Vec::new();
            if redirect_after_logout.is_none() {
                if let Some(t) = id_token {
                    params.push(("id_token_hint".to_owned(), t));
                }
            }
            if let Some(p) = &login.post_logout_redirect_uri {
                params.push(("post_logout_redirect_uri".to_owned(), p.clone()));
            }
            return redirect(&combine(uri, &params));
        }
        if let Some(ping) = doc.get("ping_end_session_endpoint").and_then(Value::as_str) {
            let params: Vec<(String, String)> = login
                .post_logout_redirect_uri
                .iter()
                .map(|p| ("TargetResource".to_owned(), p.clone()))
                .collect();
            return redirect(&combine(ping, &params));
        }
        Exit::body(StatusCode::OK, "<html><body>Logged Out</body></html>\n")
            .with_header(CONTENT_TYPE, HeaderValue::from_static("text/html"))
    }

    /// A POST to the token endpoint with the client's authentication.
    async fn token_endpoint(
        &self,
        login: &Login,
        doc: &Value,
        body: Vec<(String, String)>,
    ) -> Result<Map<String, Value>, String> {
        let endpoint = doc
            .get("token_endpoint")
            .and_then(Value::as_str)
            .ok_or("no endpoint URI for token")?;
        self.post_form(login.token_auth_post, endpoint, "token", body)
            .await
    }

    async fn post_form(
        &self,
        auth_post: bool,
        endpoint: &str,
        name: &str,
        mut body: Vec<(String, String)>,
    ) -> Result<Map<String, Value>, String> {
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(endpoint)
            .header("content-type", "application/x-www-form-urlencoded");
        let secret = self.client_secret.as_deref();
        if auth_post {
            body.push(("client_id".into(), self.client_id.clone()));
            if let Some(s) = secret {
                body.push(("client_secret".into(), s.to_owned()));
            }
        } else {
            let basic = base64::engine::general_purpose::STANDARD.encode(format!(
                "{}:{}",
                enc(&self.client_id),
                secret.map(enc).unwrap_or_default()
            ));
            req = req.header("authorization", format!("Basic {basic}"));
        }
        let req = req
            .body(Bytes::from(form(&body)))
            .map_err(|e| e.to_string())?;
        let resp = self
            .services
            .http()
            .send_verified(req, self.timeout, self.ssl_verify)
            .await
            .map_err(|e| format!("accessing {name} endpoint ({endpoint}) failed: {e}"))?;
        if resp.status() != StatusCode::OK {
            return Err(format!(
                "response indicates failure, status={}, body={}",
                resp.status().as_u16(),
                String::from_utf8_lossy(resp.body())
            ));
        }
        let json: Map<String, Value> = serde_json::from_slice(resp.body())
            .map_err(|e| format!("JSON decoding failed: {e}"))?;
        if let Some(e) = json.get("error") {
            return Err(format!("response indicates failure: {e}"));
        }
        Ok(json)
    }

    async fn revoke(
        &self,
        login: &Login,
        doc: &Value,
        hint: &str,
        token: &str,
    ) -> Result<(), String> {
        let endpoint = doc
            .get("revocation_endpoint")
            .and_then(Value::as_str)
            .ok_or("no revocation endpoint supplied")?;
        let body = vec![
            ("token".to_owned(), token.to_owned()),
            ("token_type_hint".to_owned(), hint.to_owned()),
        ];
        // An empty success body is not JSON: only the status matters here.
        match self
            .post_form(login.token_auth_post, endpoint, "revocation", body)
            .await
        {
            Err(e) if e.starts_with("JSON decoding failed") => Ok(()),
            other => other.map(|_| ()),
        }
    }

    async fn userinfo(&self, doc: &Value, token: &str) -> Result<Option<Value>, String> {
        let Some(endpoint) = doc.get("userinfo_endpoint").and_then(Value::as_str) else {
            return Ok(None);
        };
        let req = Request::get(endpoint)
            .header("authorization", format!("Bearer {token}"))
            .body(Bytes::new())
            .map_err(|e| e.to_string())?;
        let resp = self
            .services
            .http()
            .send_verified(req, self.timeout, self.ssl_verify)
            .await
            .map_err(|e| format!("accessing ({endpoint}) failed: {e}"))?;
        if resp.status() != StatusCode::OK {
            return Err(format!(
                "response indicates failure, status={}, body={}",
                resp.status().as_u16(),
                String::from_utf8_lossy(resp.body())
            ));
        }
        serde_json::from_slice(resp.body())
            .map(Some)
            .map_err(|e| format!("JSON decoding failed: {e}"))
    }

    /// The ID token's signature (the provider's JWKS, or the client secret for HS*), then
    /// lua-resty-openidc's claim checks. Each failure is logged; the error is theirs.
    async fn verify_id_token(
        &self,
        raw: &str,
        issuer: &str,
        nonce: Option<&str>,
        now: u64,
    ) -> Result<Map<String, Value>, String> {
        let issuers = vec![issuer.to_owned()];
        let claims = match self.verify_signed(raw, &issuers).await {
            Ok(c) => c,
            Err(e) => {
                let alg = jwt::load(raw)
                    .ok()
                    .and_then(|l| {
                        l.header
                            .get("alg")
                            .and_then(Value::as_str)
                            .map(str::to_owned)
                    })
                    .unwrap_or_default();
                tracing::error!("id_token '{alg}' signature verification failed: {e}");
                return Err(e);
            }
        };
        let fail = |why: String| {
            tracing::error!("{why}");
            Err("id_token validation failed".to_owned())
        };
        if claims.get("iss").and_then(Value::as_str) != Some(issuer) {
            return fail(format!(
                "issuer in id_token is not equal to the issuer from the discovery document \"{issuer}\""
            ));
        }
        if claims.get("sub").is_none() {
            return fail("no \"sub\" claim found in id_token".into());
        }
        if let Some(n) = nonce {
            if claims.get("nonce").and_then(Value::as_str) != Some(n) {
                return fail(
                    "nonce in id_token is not equal to the nonce that was sent in the request"
                        .into(),
                );
            }
        }
        let now = now as i64;
        let slack = self.iat_slack;
        match claims.get("iat").and_then(Value::as_i64) {
            None => return fail("no \"iat\" claim found in id_token".into()),
            Some(iat) if iat > now + slack => {
                return fail(format!("id_token not yet valid: id_token.iat={iat}"))
            }
            _ => {}
        }
        match claims.get("exp").and_then(Value::as_i64) {
            None => return fail("no \"exp\" claim found in id_token".into()),
            Some(exp) if exp + slack < now => {
                return fail(format!("token expired: id_token.exp={exp}"))
            }
            _ => {}
        }
        match claims.get("aud") {
            None | Some(Value::Null) => return fail("no \"aud\" claim found in id_token".into()),
            Some(Value::Array(list))
                if !list.iter().any(|a| a.as_str() == Some(&self.client_id)) =>
            {
                return fail(format!(
                    "no match found token audience array: client_id={}",
                    self.client_id
                ));
            }
            Some(Value::String(a)) if *a != self.client_id => {
                return fail(format!(
                    "token audience does not match: id_token.aud={a}, client_id={}",
                    self.client_id
                ));
            }
            _ => {}
        }
        Ok(claims)
    }
}

/// `$uri` with `/.apisix/redirect` appended (its trailing `/` dropped first), or `$uri` when
/// it already ends so: APISIX's redirect URI when none is configured.
pub fn default_redirect_path(uri: &str) -> String {
    const SUFFIX: &str = "/.apisix/redirect";
    if uri.ends_with(SUFFIX) {
        uri.to_owned()
    } else {
        format!("{}{SUFFIX}", uri.strip_suffix('/').unwrap_or(uri))
    }
}

/// The path of an absolute or relative URI, without its query.
fn uri_path(uri: &str) -> String {
    let rest = match uri.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => uri,
    };
    rest.split(['?', '#']).next().unwrap_or("/").to_owned()
}

/// lua-resty-openidc's Accept check: the most preferred of `text/html` and `image/png`.
fn prefers_png(accept: Option<&str>) -> bool {
    let Some(accept) = accept else {
        return false;
    };
    let mut ranges: Vec<(f32, &str)> = accept
        .split(',')
        .map(|r| {
            let mut parts = r.split(';');
            let media = parts.next().unwrap_or_default().trim();
            let q = parts
                .find_map(|p| p.trim().strip_prefix("q="))
                .and_then(|q| q.trim().parse().ok())
                .unwrap_or(1.0);
            (q, media)
        })
        .collect();
    ranges.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal));
    for (_, media) in ranges {
        if media.contains("text/html") || media.contains("application/xhtml+xml") {
            return false;
        }
        if media.contains("image/png") {
            return true;
        }
    }
    false
}

/// The scopes granted to a session: the access token's `scope` claim when it is a JWT, else
/// the ID token's (APISIX's `session_scopes`).
fn session_scopes(access_token: Option<&str>, id_token: Option<&Value>) -> Option<Vec<String>> {
    let from_access = access_token
        .and_then(|t| jwt::load(t).ok())
        .and_then(|l| l.claims.get("scope").cloned());
    let scope = from_access.or_else(|| id_token.and_then(|i| i.get("scope").cloned()))?;
    scope
        .as_str()
        .map(|s| s.split_whitespace().map(str::to_owned).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_redirect_paths() {
        assert_eq!(default_redirect_path("/api"), "/api/.apisix/redirect");
        assert_eq!(default_redirect_path("/api/"), "/api/.apisix/redirect");
        assert_eq!(
            default_redirect_path("/api/.apisix/redirect"),
            "/api/.apisix/redirect"
        );
        assert_eq!(uri_path("https://gw.example/cb?x=1"), "/cb");
        assert_eq!(uri_path("/cb"), "/cb");
        assert_eq!(uri_path("https://gw.example"), "/");
    }

    #[test]
    fn png_preference() {
        assert!(prefers_png(Some("image/png")));
        assert!(!prefers_png(Some("text/html,image/png")));
        assert!(prefers_png(Some("text/html;q=0.5,image/png")));
        assert!(!prefers_png(None));
    }

    #[test]
    fn scopes_from_tokens() {
        assert_eq!(
            session_scopes(None, Some(&json!({"scope": "openid email"}))),
            Some(vec!["openid".to_owned(), "email".to_owned()])
        );
        assert_eq!(session_scopes(Some("opaque"), None), None);
    }

    #[test]
    fn combined_uris() {
        let p = vec![("a".to_owned(), "x y".to_owned())];
        assert_eq!(combine("https://op/auth", &p), "https://op/auth?a=x%20y");
        assert_eq!(
            combine("https://op/auth?z=1", &p),
            "https://op/auth?z=1&a=x%20y"
        );
    }
}
