//! cas-auth (`apisix/plugins/cas-auth.lua`): single sign-on with a CAS server (the CAS 2/3
//! protocol). A request without a session is sent to `<idp_uri>/login?service=<callback>`,
//! the URI it asked for kept in the `CAS_REQUEST_URI` cookie (HMAC-SHA256 signed with
//! `cookie.secret`). CAS sends the browser back to `cas_callback_uri` with a `ticket`, which
//! is validated at `<idp_uri>/serviceValidate`; on `<cas:authenticationSuccess>` the ticket
//! becomes the session id (`CAS_SESSION_<sha256 of idp_uri|cas_callback_uri>` cookie; the
//! session kept by the gateway for an hour, renewed by each use) and the browser goes back to
//! the signed request URI, which must be a local path (no open redirect). `logout_uri` ends
//! the session and sends the browser to `<idp_uri>/logout`; a POST to the callback with a
//! SAML `<samlp:SessionIndex>` is the CAS server's single logout of a ticket. Answers and
//! messages are APISIX's.
//!
//! The sessions live in the gateway's memory, shared by every route and worker thread, as
//! APISIX's `cas_sessions` shared dictionary; they do not survive a restart.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use ferrisix_plugin_api::{
    BodyError, CheckCtx, Clock, CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef,
    PluginServices, SharedState, Step,
};
use http::header::{LOCATION, SET_COOKIE};
use http::{HeaderValue, Method, Request, StatusCode};
use ring::hmac;
use serde_json::{json, Value};

use crate::support::auth::{message_exit, secret_eq};

pub const NAME: &str = "cas-auth";

pub static DEF: PluginDef = PluginDef {
    version: 0.1,
    check: Some(check),
    encrypt_fields: &["cookie.secret"],
    ..PluginDef::new(NAME, 2597, schema, compile)
};

const REQUEST_URI_COOKIE: &str = "CAS_REQUEST_URI";
const COOKIE_PREFIX: &str = "CAS_SESSION_";
const SESSION_LIFETIME_MS: u64 = 3_600_000;
const EXPIRED: &str = "deleted; Max-Age=0";

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "max_req_body_size": {"type": "integer", "minimum": 1, "default": 67_108_864},
            "idp_uri": {"type": "string"},
            "cas_callback_uri": {"type": "string"},
            "logout_uri": {"type": "string"},
            "cookie": {
                "type": "object",
                "properties": {
                    "secret": {"type": "string", "minLength": 32},
                    "secure": {"type": "boolean", "default": true},
                    "samesite": {"type": "string", "enum": ["Lax", "None"], "default": "Lax"}
                },
                "required": ["secret"]
            }
        },
        "required": ["idp_uri", "cas_callback_uri", "logout_uri", "cookie"]
    })
}

fn is_absolute(uri: &str) -> bool {
    uri.starts_with("http://") || uri.starts_with("https://")
}

/// The callback's path: the relative `cas_callback_uri`, or the absolute one's path.
fn callback_path(uri: &str) -> String {
    if !is_absolute(uri) {
        return uri.to_owned();
    }
    let rest = uri.split_once("://").map_or(uri, |(_, r)| r);
    let path = rest.find('/').map_or("", |i| &rest[i..]);
    let path = path.split(['?', '#']).next().unwrap_or_default();
    if path.is_empty() {
        "/".into()
    } else {
        path.into()
    }
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    let cookie = cx.conf.get("cookie");
    let field = |k: &str| cookie.and_then(|c| c.get(k));
    if field("samesite").and_then(Value::as_str) == Some("None")
        && field("secure").and_then(Value::as_bool) == Some(false)
    {
        return Err("cookie.secure must be true when cookie.samesite is \"None\"".into());
    }
    let callback = cx
        .conf
        .get("cas_callback_uri")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !is_absolute(callback) {
        tracing::warn!(
            "cas-auth: cas_callback_uri is a relative path; the CAS service URL will be derived from the request Host header. Configure an absolute cas_callback_uri to avoid relying on it."
        );
    }
    Ok(())
}

/// The sessions of every cas-auth conf (by `<fingerprint>:<ticket>`: the user and when the
/// entry expires, epoch ms), as APISIX's `cas_sessions` shared dictionary.
#[derive(Default)]
pub struct CasSessions {
    map: Mutex<HashMap<String, (String, u64)>>,
}

impl SharedState for CasSessions {
    fn create(_: &PluginServices) -> Self {
        CasSessions::default()
    }
}

impl CasSessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, u64)>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The live entry of `key`, its lifetime renewed.
    fn touch(&self, key: &str, now: u64) -> Option<String> {
        let mut map = self.lock();
        match map.get_mut(key) {
            Some((entry, until)) if *until > now => {
                *until = now + SESSION_LIFETIME_MS;
                Some(entry.clone())
            }
            Some(_) => {
                map.remove(key);
                None
            }
            None => None,
        }
    }

    /// Adds an entry; `false` when a live one exists (a ticket validated twice).
    fn add(&self, key: String, entry: String, now: u64) -> bool {
        let mut map = self.lock();
        map.retain(|_, (_, until)| *until > now);
        if map.contains_key(&key) {
            return false;
        }
        map.insert(key, (entry, now + SESSION_LIFETIME_MS));
        true
    }

    fn delete(&self, key: &str) -> Option<String> {
        self.lock().remove(key).map(|(e, _)| e)
    }
}

struct CasAuth {
    idp_uri: String,
    callback: String,
    callback_path: String,
    logout_uri: String,
    secret: String,
    attrs: String,
    cookie_name: String,
    fingerprint: String,
    max_body: usize,
    sessions: Arc<CasSessions>,
    services: Arc<PluginServices>,
    clock: Clock,
}

impl std::fmt::Debug for CasAuth {
    /// The cookie secret is not printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CasAuth")
            .field("idp_uri", &self.idp_uri)
            .finish_non_exhaustive()
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let s = |k: &str| {
        conf.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let cookie = conf.get("cookie").cloned().unwrap_or(Value::Null);
    let secure = cookie.get("secure").and_then(Value::as_bool) != Some(false);
    let samesite = cookie
        .get("samesite")
        .and_then(Value::as_str)
        .unwrap_or("Lax");
    let mut attrs = "; Path=/; HttpOnly".to_owned();
    if secure {
        attrs.push_str("; Secure");
    }
    attrs.push_str("; SameSite=");
    attrs.push_str(samesite);
    let (idp_uri, callback) = (s("idp_uri"), s("cas_callback_uri"));
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{idp_uri}|{callback}").as_bytes(),
    );
    let fingerprint: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    Ok(Arc::new(CasAuth {
        callback_path: callback_path(&callback),
        idp_uri,
        callback,
        logout_uri: s("logout_uri"),
        secret: cookie
            .get("secret")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        attrs,
        cookie_name: format!("{COOKIE_PREFIX}{fingerprint}"),
        fingerprint,
        max_body: conf["max_req_body_size"].as_u64().unwrap_or(67_108_864) as usize,
        sessions: cx.services.shared::<CasSessions>(),
        services: cx.services.clone(),
        clock: cx.services.clock().clone(),
    }))
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(bytes)
}

fn unb64(text: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(text.trim_end_matches('='))
        .ok()
}

/// A local path: no scheme, no `//host`, no backslash, no line break.
fn is_safe_redirect(uri: &str) -> bool {
    uri.starts_with('/')
        && !uri.starts_with("//")
        && !uri.contains('\\')
        && !uri.contains(['\r', '\n'])
}

fn cookie<'a>(ctx: &'a PluginCtx<'_>, name: &str) -> Option<&'a str> {
    ctx.headers()
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|h| h.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

fn found(to: &str) -> Flow {
    let mut exit = Exit::status(StatusCode::FOUND);
    if let Ok(v) = HeaderValue::from_str(to) {
        exit = exit.with_header(LOCATION, v);
    }
    Flow::Exit(exit)
}

impl CasAuth {
    fn now(&self) -> u64 {
        self.clock.epoch_ms()
    }

    fn set_cookie(&self, ctx: &mut PluginCtx<'_>, name: &str, value: &str) {
        if let Ok(v) = HeaderValue::from_str(&format!("{name}={value}{}", self.attrs)) {
            ctx.response_headers_mut().append(SET_COOKIE, v);
        }
    }

    fn sign(&self, value: &str) -> String {
        let key = hmac::Key::new(hmac::HMAC_SHA256, self.secret.as_bytes());
        let sig = hmac::sign(&key, value.as_bytes());
        format!("{}.{}", b64(value.as_bytes()), b64(sig.as_ref()))
    }

    fn verify(&self, signed: Option<&str>) -> Option<String> {
        let (value, sig) = signed?.split_once('.')?;
        let (value, sig) = (unb64(value)?, unb64(sig)?);
        let key = hmac::Key::new(hmac::HMAC_SHA256, self.secret.as_bytes());
        let expected = hmac::sign(&key, &value);
        if !secret_eq(expected.as_ref(), &sig) {
            return None;
        }
        String::from_utf8(value).ok()
    }

    /// The CAS service URL: the absolute callback, or the relative one on this request's
    /// scheme, host and port.
    fn service(&self, ctx: &PluginCtx<'_>) -> String {
        if is_absolute(&self.callback) {
            return self.callback.clone();
        }
        let head = ctx.head();
        format!(
            "{}://{}:{}{}",
            head.conn.scheme(),
            head.host.unwrap_or_default(),
            head.conn.local.port(),
            self.callback
        )
    }

    fn first_access(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let service = self.service(ctx);
        let login = format!(
            "{}/login?service={}",
            self.idp_uri,
            percent_encoding::utf8_percent_encode(&service, percent_encoding::NON_ALPHANUMERIC)
        );
        let signed = self.sign(ctx.request_uri());
        self.set_cookie(ctx, REQUEST_URI_COOKIE, &signed);
        found(&login)
    }

    fn key(&self, session_id: &str) -> String {
        format!("{}:{session_id}", self.fingerprint)
    }

    fn with_session(&self, ctx: &mut PluginCtx<'_>, session_id: &str) -> Flow {
        let entry = self.sessions.touch(&self.key(session_id), self.now());
        let ours = entry
            .as_deref()
            .and_then(|e| e.split_once('|'))
            .is_some_and(|(fp, _)| fp == self.fingerprint);
        if !ours {
            let name = self.cookie_name.clone();
            self.set_cookie(ctx, &name, EXPIRED);
            return self.first_access(ctx);
        }
        Flow::Continue
    }

    /// `<idp_uri>/serviceValidate`: the user of a valid ticket.
    async fn validate(&self, service: String, ticket: &str) -> Option<String> {
        let enc = |s: &str| {
            percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
        };
        let url = format!(
            "{}/serviceValidate?ticket={}&service={}",
            self.idp_uri,
            enc(ticket),
            enc(&service)
        );
        let req = Request::get(&url).body(Bytes::new()).ok()?;
        let resp = self
            .services
            .http()
            .send_verified(req, Duration::from_secs(60), true)
            .await;
        match resp {
            Ok(r) if r.status() == StatusCode::OK => {
                let body = String::from_utf8_lossy(r.body());
                if !body.contains("<cas:authenticationSuccess>") {
                    tracing::info!("CAS serviceValidate did not return authenticationSuccess");
                    return None;
                }
                let start = body.find("<cas:user>")? + "<cas:user>".len();
                let end = body[start..].find("</cas:user>")?;
                Some(body[start..start + end].to_owned())
            }
            Ok(r) => {
                tracing::error!(
                    "validate ticket failed: status={}, has_body=true, err=nil",
                    r.status().as_u16()
                );
                None
            }
            Err(e) => {
                tracing::error!("validate ticket failed: status=nil, has_body=false, err={e}");
                None
            }
        }
    }

    async fn validate_with_cas(&self, ctx: &mut PluginCtx<'_>, ticket: &str) -> Flow {
        let request_uri = self
            .verify(cookie(ctx, REQUEST_URI_COOKIE))
            .filter(|u| is_safe_redirect(u));
        let Some(request_uri) = request_uri else {
            tracing::warn!("cas-auth: callback rejected, missing or invalid initiation cookie");
            return Flow::Exit(message_exit(
                StatusCode::UNAUTHORIZED,
                "invalid callback state",
            ));
        };
        let service = self.service(ctx);
        if let Some(user) = self.validate(service, ticket).await {
            let entry = format!("{}|{user}", self.fingerprint);
            if self.sessions.add(self.key(ticket), entry, self.now()) {
                let name = self.cookie_name.clone();
                self.set_cookie(ctx, &name, ticket);
                self.set_cookie(ctx, REQUEST_URI_COOKIE, EXPIRED);
                tracing::info!("cas-auth: validation succeeded for user={user}");
                return found(&request_uri);
            }
            tracing::error!("Same CAS ticket validated twice, this should never happen!");
        }
        Flow::Exit(message_exit(StatusCode::UNAUTHORIZED, "invalid ticket"))
    }

    fn logout(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let Some(session_id) = cookie(ctx, &self.cookie_name).map(str::to_owned) else {
            return Flow::Exit(Exit::status(StatusCode::UNAUTHORIZED));
        };
        self.sessions.delete(&self.key(&session_id));
        let name = self.cookie_name.clone();
        self.set_cookie(ctx, &name, EXPIRED);
        found(&format!("{}/logout", self.idp_uri))
    }

    /// The CAS server's single logout: the session of the ticket in `<samlp:SessionIndex>`.
    async fn single_logout(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let body = match ctx.read_body(self.max_body).await {
            Ok(b) => b.clone(),
            Err(BodyError::TooLarge(_)) => {
                return Flow::Exit(Exit::status(StatusCode::PAYLOAD_TOO_LARGE))
            }
            Err(_) => Bytes::new(),
        };
        let text = String::from_utf8_lossy(&body);
        let ticket = text
            .find("<samlp:SessionIndex>")
            .map(|i| &text[i + "<samlp:SessionIndex>".len()..])
            .and_then(|rest| rest.rfind("</samlp:SessionIndex>").map(|j| &rest[..j]))
            .filter(|t| !t.is_empty());
        let Some(ticket) = ticket else {
            return Flow::Exit(message_exit(
                StatusCode::BAD_REQUEST,
                "invalid logout request from IdP, no ticket",
            ));
        };
        if let Some(entry) = self.sessions.delete(&self.key(ticket)) {
            let user = entry.split_once('|').map_or("<unknown>", |(_, u)| u);
            tracing::info!("cas-auth: SLO session deleted for user={user}");
        }
        Flow::Exit(Exit::status(StatusCode::OK))
    }

    async fn run(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let uri = ctx.uri().to_owned();
        let method = ctx.method().clone();
        if method == Method::GET && uri == self.logout_uri {
            return self.logout(ctx);
        }
        if method == Method::POST && uri == self.callback_path {
            return self.single_logout(ctx).await;
        }
        if let Some(session_id) = cookie(ctx, &self.cookie_name).map(str::to_owned) {
            return self.with_session(ctx, &session_id);
        }
        match ctx.arg("ticket").map(|t| t.into_owned()) {
            Some(ticket) if uri == self.callback_path => self.validate_with_cas(ctx, &ticket).await,
            _ => self.first_access(ctx),
        }
    }
}

impl Plugin for CasAuth {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.run(ctx)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callback_paths_and_safe_redirects() {
        assert_eq!(callback_path("/cas_callback"), "/cas_callback");
        assert_eq!(
            callback_path("https://app.example.com/cb?x=1"),
            "/cb".to_owned()
        );
        assert_eq!(callback_path("https://app.example.com"), "/");
        assert!(is_safe_redirect("/a?b=1"));
        for bad in [
            "",
            "https://evil",
            "//evil",
            "/\\evil",
            "/a\r\nSet-Cookie: x",
        ] {
            assert!(!is_safe_redirect(bad), "{bad:?}");
        }
    }

    #[test]
    fn sessions_expire_and_refuse_a_second_ticket() {
        let s = CasSessions::default();
        assert!(s.add("fp:t".into(), "fp|alice".into(), 1_000));
        assert!(!s.add("fp:t".into(), "fp|bob".into(), 2_000));
        assert_eq!(s.touch("fp:t", 3_000).as_deref(), Some("fp|alice"));
        // Renewed at 3 s: alive until 3 s + an hour.
        assert!(s.touch("fp:t", 3_000 + SESSION_LIFETIME_MS - 1).is_some());
        assert!(s.touch("fp:t", 10 * SESSION_LIFETIME_MS).is_none());
    }
}
