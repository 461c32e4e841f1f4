//! authz-casdoor (`apisix/plugins/authz-casdoor.lua`): sign-in with Casdoor (OAuth 2.0
//! authorization code). Without a session the browser is sent to
//! `<endpoint_addr>/login/oauth/authorize` (`response_type=code`, `scope=read`, a random
//! `state`, `client_id`, `redirect_uri` the `callback_url`), the URI it asked for and the state
//! kept in the session cookie `authz_casdoor_session_<sha256 of client_id>`. At the callback's
//! path the state is checked, the code exchanged at `<endpoint_addr>/api/login/oauth/access_token`
//! and the session given the access token, bound to its `expires_in`; the browser goes back to
//! where it started. A session with an unexpired token of this `client_id` passes.
//!
//! The cookie is lua-resty-session's ([`crate::support::session`]). APISIX configures no
//! secret for it, so lua-resty-session keys it with random bytes made at start; ferrisix keys
//! it with a random key made once per gateway: sessions do not survive a restart.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_plugin_api::{
    CheckCtx, Clock, CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef, PluginServices,
    Step,
};
use http::header::{LOCATION, SET_COOKIE};
use http::{HeaderValue, Method, Request, StatusCode};
use ring::rand::SecureRandom;
use serde_json::{json, Value};

use crate::support::session::{GatewaySessionKey, SessionConf};

pub const NAME: &str = "authz-casdoor";

pub static DEF: PluginDef = PluginDef {
    version: 0.1,
    check: Some(check),
    encrypt_fields: &["client_secret"],
    ..PluginDef::new(NAME, 2559, schema, compile)
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "endpoint_addr": {"type": "string", "pattern": "^[^%?]+[^/]$"},
            "client_id": {"type": "string"},
            "client_secret": {"type": "string"},
            "callback_url": {"type": "string", "pattern": "^[^%?]+[^/]$"}
        },
        "required": ["callback_url", "endpoint_addr", "client_id", "client_secret"]
    })
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    for field in ["endpoint_addr", "callback_url"] {
        let v = cx
            .conf
            .get(field)
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !v.starts_with("https://") {
            tracing::warn!("Using {NAME} {field} with no TLS is a security risk");
        }
    }
    Ok(())
}

struct Casdoor {
    endpoint: String,
    client_id: String,
    client_secret: String,
    callback_url: String,
    /// The callback URL's path (`.+//[^/]+(/.*)`); `None`: every request answers 503.
    callback_path: Option<String>,
    session: SessionConf,
    services: Arc<PluginServices>,
    clock: Clock,
}

impl std::fmt::Debug for Casdoor {
    /// The client secret is not printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Casdoor")
            .field("endpoint", &self.endpoint)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

/// The path after `scheme://host` (greedy, as APISIX's `.+//[^/]+(/.*)`).
fn callback_path(url: &str) -> Option<String> {
    let at = url.rfind("//")?;
    if at == 0 {
        return None;
    }
    let rest = &url[at + 2..];
    let slash = rest.find('/')?;
    if slash == 0 {
        return None;
    }
    Some(rest[slash..].to_owned())
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let s = |k: &str| {
        conf.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let client_id = s("client_id");
    let digest = ring::digest::digest(&ring::digest::SHA256, client_id.as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    let key = cx.services.shared::<GatewaySessionKey>();
    Ok(Arc::new(Casdoor {
        endpoint: s("endpoint_addr"),
        callback_path: callback_path(&s("callback_url")),
        callback_url: s("callback_url"),
        session: SessionConf::with_ikm(&format!("authz_casdoor_session_{hex}"), key.0),
        client_id,
        client_secret: s("client_secret"),
        services: cx.services.clone(),
        clock: cx.services.clock().clone(),
    }))
}

fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

fn unavailable() -> Flow {
    Flow::Exit(Exit::status(StatusCode::SERVICE_UNAVAILABLE))
}

fn bad_request(msg: &str) -> Flow {
    tracing::error!("{msg}");
    Flow::Exit(Exit::body(StatusCode::BAD_REQUEST, msg.to_owned()))
}

impl Casdoor {
    /// The access token and its lifetime for a code.
    async fn fetch_access_token(&self, code: &str) -> Result<(String, i64), String> {
        let url = format!("{}/api/login/oauth/access_token", self.endpoint);
        let body = format!(
            "code={}&grant_type=authorization_code&client_id={}&client_secret={}",
            enc(code),
            enc(&self.client_id),
            enc(&self.client_secret)
        );
        let req = Request::builder()
            .method(Method::POST)
            .uri(&url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Bytes::from(body))
            .map_err(|e| e.to_string())?;
        let resp = self
            .services
            .http()
            .send_verified(req, Duration::from_secs(60), true)
            .await
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(resp.body());
        let data: Value = serde_json::from_slice(resp.body())
            .map_err(|e| format!("failed to parse casdoor response data: {e}, body: {text}"))?;
        let token = data
            .get("access_token")
            .and_then(Value::as_str)
            .ok_or("failed when accessing token: no access_token contained")?;
        // Casdoor marks an invalid token with expires_in 0.
        let expires_in = match data.get("expires_in") {
            Some(Value::Number(n)) => n.as_f64(),
            Some(Value::String(s)) => s.parse().ok(),
            _ => None,
        }
        .filter(|e| *e > 0.0)
        .ok_or("failed when accessing token: invalid access_token")?;
        Ok((token.to_owned(), expires_in as i64))
    }

    async fn run(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let now = self.clock.epoch_ms() / 1000;
        let uri = ctx.uri().to_owned();
        let (mut session, why) = {
            let cookies: Vec<&str> = ctx
                .headers()
                .get_all(http::header::COOKIE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect();
            self.session.open(cookies.iter().copied(), now)
        };
        let mut set_cookies = self.session.refresh(&mut session).unwrap_or_default();
        let Some(callback_path) = &self.callback_path else {
            tracing::error!("the callback_url has no path");
            return unavailable();
        };
        let flow = if uri == *callback_path {
            self.callback(ctx, &mut session, &mut set_cookies, why, now)
                .await
        } else {
            let expires_at = session
                .get("access_token_expires_at")
                .and_then(Value::as_i64);
            let valid = session.present()
                && session.get("access_token").is_some()
                && session.get_str("client_id") == Some(self.client_id.as_str())
                && expires_at.is_none_or(|e| e > now as i64);
            if valid {
                Flow::Continue
            } else {
                let mut bytes = [0u8; 4];
                let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
                let state = u32::from_le_bytes(bytes) & 0x7fff_ffff;
                session.set("original_uri", json!(uri));
                session.set("state", json!(state));
                self.save(&mut session, &mut set_cookies, now);
                let to = format!(
                    "{}/login/oauth/authorize?response_type=code&scope=read&state={state}&client_id={}&redirect_uri={}",
                    self.endpoint,
                    enc(&self.client_id),
                    enc(&self.callback_url)
                );
                found(&to)
            }
        };
        for c in set_cookies {
            if let Ok(v) = HeaderValue::from_str(&c) {
                ctx.response_headers_mut().append(SET_COOKIE, v);
            }
        }
        flow
    }

    fn save(
        &self,
        session: &mut crate::support::session::Session,
        out: &mut Vec<String>,
        now: u64,
    ) {
        match self.session.save(session, now) {
            Ok(c) => *out = c,
            Err(e) => tracing::error!("{NAME}: unable to save session: {e}"),
        }
    }

    async fn callback(
        &self,
        ctx: &mut PluginCtx<'_>,
        session: &mut crate::support::session::Session,
        set_cookies: &mut Vec<String>,
        why: Option<String>,
        now: u64,
    ) -> Flow {
        if !session.present() {
            tracing::error!(
                "no session found: {}",
                why.as_deref().unwrap_or("missing session cookie")
            );
            return unavailable();
        }
        let Some(expected) = session.get("state").cloned() else {
            tracing::error!("no state found in session");
            return unavailable();
        };
        let code = ctx.arg("code").map(|c| c.into_owned());
        let state = ctx.arg("state").map(|c| c.into_owned());
        let (Some(code), Some(state)) = (code, state) else {
            return bad_request("failed when accessing token. Invalid code or state");
        };
        let expected = match expected {
            Value::String(s) => s,
            other => other.to_string(),
        };
        if state != expected {
            return bad_request("invalid state");
        }
        let (token, lifetime) = match self.fetch_access_token(&code).await {
            Ok(t) => t,
            Err(e) => {
                tracing::error!("{e}");
                return unavailable();
            }
        };
        let Some(original) = session.get_str("original_uri").map(str::to_owned) else {
            tracing::error!("no original_url found in session");
            return unavailable();
        };
        session.set("access_token", json!(token));
        session.set("client_id", json!(self.client_id));
        session.set("access_token_expires_at", json!(now as i64 + lifetime));
        self.save(session, set_cookies, now);
        found(&original)
    }
}

fn found(to: &str) -> Flow {
    let mut exit = Exit::status(StatusCode::FOUND);
    if let Ok(v) = HeaderValue::from_str(to) {
        exit = exit.with_header(LOCATION, v);
    }
    Flow::Exit(exit)
}

impl Plugin for Casdoor {
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
    fn callback_paths() {
        assert_eq!(
            callback_path("http://127.0.0.1:9080/anything/callback").as_deref(),
            Some("/anything/callback")
        );
        assert_eq!(callback_path("http://127.0.0.1:9080"), None);
        assert_eq!(callback_path("no-scheme/path"), None);
    }
}
