//! feishu-auth (`apisix/plugins/feishu-auth.lua`): sign-in with Feishu (Lark). A request whose
//! session (lua-resty-session's `feishu_session` cookie, keyed by `secret` and
//! `secret_fallbacks`, valid `cookie_expires_in` seconds from creation) holds the user goes
//! on with `X-Userinfo` (base64 JSON, `set_userinfo_header`). Otherwise the authorization code
//! (header `code_header`, else query argument `code_query`) is exchanged for a user access
//! token at `access_token_url` (OAuth 2.0 v2: `grant_type`, `client_id`, `client_secret`,
//! `redirect_uri` = `auth_redirect_uri`, `code`, as JSON), which fetches the user at
//! `userinfo_url` (`code` 0); token and user are kept in the session. Without a code the
//! browser is sent to `redirect_uri`. Answers and messages are APISIX's.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{
    Clock, CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef, PluginServices, Step,
};
use http::header::LOCATION;
use http::{HeaderName, HeaderValue, Method, Request, StatusCode};
use serde_json::{json, Value};

use crate::support::auth::message_exit;
use crate::support::session::{set_cookies, Session, SessionConf};

pub const NAME: &str = "feishu-auth";

pub static DEF: PluginDef = PluginDef {
    version: 0.1,
    encrypt_fields: &["app_secret", "secret", "secret_fallbacks"],
    ..PluginDef::new(NAME, 2420, schema, compile)
};

fn schema() -> Value {
    let text = || json!({"type": "string"});
    let secret = json!({"type": "string", "minLength": 8, "maxLength": 32});
    json!({
        "type": "object",
        "properties": {
            "app_id": {"type": "string", "minLength": 1},
            "app_secret": {"type": "string", "minLength": 1},
            "code_header": {"type": "string", "default": "X-Feishu-Code"},
            "code_query": {"type": "string", "default": "code"},
            "userinfo_url": {"type": "string",
                             "default": "https://open.feishu.cn/open-apis/authen/v1/user_info"},
            "access_token_url": {"type": "string",
                                 "default": "https://open.feishu.cn/open-apis/authen/v2/oauth/token"},
            "set_userinfo_header": {"type": "boolean", "default": true},
            "auth_redirect_uri": text(),
            "redirect_uri": text(),
            "timeout": {"type": "integer", "default": 6000},
            "ssl_verify": {"type": "boolean", "default": true},
            "secret": secret,
            "secret_fallbacks": {"type": "array", "items": secret},
            "cookie_expires_in": {"type": "integer", "default": 86400}
        },
        "required": ["app_id", "app_secret", "secret", "auth_redirect_uri", "redirect_uri"]
    })
}

struct Feishu {
    app_id: String,
    app_secret: String,
    code_header: Option<HeaderName>,
    code_query: String,
    userinfo_url: String,
    access_token_url: String,
    set_userinfo_header: bool,
    auth_redirect_uri: String,
    redirect_uri: String,
    timeout: Duration,
    ssl_verify: bool,
    session: SessionConf,
    services: Arc<PluginServices>,
    clock: Clock,
}

impl std::fmt::Debug for Feishu {
    /// The app secret is not printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feishu")
            .field("app_id", &self.app_id)
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
    let session = SessionConf::new(&json!({
        "secret": conf.get("secret"),
        "secret_fallbacks": conf.get("secret_fallbacks"),
        "cookie_name": "feishu_session",
        "absolute_timeout": conf.get("cookie_expires_in"),
    }));
    // A timeout below a millisecond would time every call out at once.
    let timeout = conf["timeout"].as_i64().unwrap_or(6000).max(1) as u64;
    Ok(Arc::new(Feishu {
        app_id: s("app_id"),
        app_secret: s("app_secret"),
        code_header: HeaderName::from_bytes(s("code_header").as_bytes()).ok(),
        code_query: s("code_query"),
        userinfo_url: s("userinfo_url"),
        access_token_url: s("access_token_url"),
        set_userinfo_header: conf["set_userinfo_header"].as_bool() != Some(false),
        auth_redirect_uri: s("auth_redirect_uri"),
        redirect_uri: s("redirect_uri"),
        timeout: Duration::from_millis(timeout),
        ssl_verify: conf["ssl_verify"].as_bool().unwrap_or(true),
        session,
        services: cx.services.clone(),
        clock: cx.services.clock().clone(),
    }))
}

fn redirect(to: &str) -> Flow {
    let mut exit = Exit::status(StatusCode::FOUND);
    if let Ok(v) = HeaderValue::from_str(to) {
        exit = exit.with_header(LOCATION, v);
    }
    Flow::Exit(exit)
}

fn invalid_code() -> Flow {
    Flow::Exit(message_exit(
        StatusCode::UNAUTHORIZED,
        "Invalid authorization code",
    ))
}

impl Feishu {
    async fn send(&self, req: Request<Bytes>) -> Result<(StatusCode, Bytes), String> {
        let resp = self
            .services
            .http()
            .send_verified(req, self.timeout, self.ssl_verify)
            .await
            .map_err(|e| e.to_string())?;
        Ok((resp.status(), resp.body().clone()))
    }

    /// A user access token for a code and its lifetime.
    async fn access_token(&self, code: &str) -> Result<(String, i64), String> {
        let body = json!({
            "grant_type": "authorization_code",
            "client_id": self.app_id,
            "client_secret": self.app_secret,
            "redirect_uri": self.auth_redirect_uri,
            "code": code,
        });
        let req = Request::builder()
            .method(Method::POST)
            .uri(&self.access_token_url)
            .header("content-type", "application/json")
            .body(Bytes::from(lua::cjson_encode(&body)))
            .map_err(|e| e.to_string())?;
        let (status, body) = self.send(req).await?;
        if status != StatusCode::OK {
            return Err(format!(
                "unexpected response status: {}, body: {}",
                status.as_u16(),
                String::from_utf8_lossy(&body)
            ));
        }
        let data: Value =
            serde_json::from_slice(&body).map_err(|e| format!("failed to decode response: {e}"))?;
        match (
            data.get("access_token").and_then(Value::as_str),
            data.get("expires_in").and_then(Value::as_f64),
        ) {
            (Some(t), Some(e)) => Ok((t.to_owned(), e as i64)),
            _ => Err("missing access_token or expires_in in response".into()),
        }
    }

    async fn userinfo(&self, token: &str) -> Result<Value, String> {
        let req = Request::get(&self.userinfo_url)
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {token}"))
            .body(Bytes::new())
            .map_err(|e| e.to_string())?;
        let (status, body) = self.send(req).await?;
        if status != StatusCode::OK {
            return Err(format!(
                "unexpected http response status: {}",
                status.as_u16()
            ));
        }
        let data: Value =
            serde_json::from_slice(&body).map_err(|e| format!("failed to decode response: {e}"))?;
        if data.get("code").and_then(Value::as_i64) != Some(0) {
            let code = data.get("code").map_or("nil".into(), |v| v.to_string());
            let msg = data.get("msg").and_then(Value::as_str).unwrap_or("nil");
            return Err(format!("unexpected error code: {code}, errmsg: {msg}"));
        }
        Ok(data.get("data").cloned().unwrap_or(Value::Null))
    }

    fn code(&self, ctx: &PluginCtx<'_>) -> Option<String> {
        self.code_header
            .as_ref()
            .and_then(|h| ctx.headers().get(h))
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .or_else(|| ctx.arg(&self.code_query).map(|c| c.into_owned()))
    }

    /// Signs the user of `code` in: the flow's answer, or the user.
    async fn sign_in(
        &self,
        ctx: &mut PluginCtx<'_>,
        session: &mut Session,
        code: &str,
        now: u64,
    ) -> Result<Value, Flow> {
        let mut token = session.get_str("access_token").map(str::to_owned);
        if token.is_some() {
            let expires_at = session
                .get("access_token_expires_at")
                .and_then(Value::as_i64);
            if expires_at.is_none_or(|e| (now as i64) >= e) {
                token = None;
                session.set("access_token", Value::Null);
                session.set("access_token_expires_at", Value::Null);
            }
        }
        let token = match token {
            Some(t) => t,
            None => match self.access_token(code).await {
                Ok((t, expires_in)) => {
                    session.set("access_token", json!(t));
                    session.set(
                        "access_token_expires_at",
                        json!(now as i64 + expires_in - 60),
                    );
                    t
                }
                Err(e) => {
                    tracing::warn!("failed to get feishu access token: {e}");
                    return Err(invalid_code());
                }
            },
        };
        let user = match self.userinfo(&token).await {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!("failed to get feishu userinfo: {e}");
                let gone = self.session.destroy(session);
                set_cookies(ctx, gone);
                return Err(invalid_code());
            }
        };
        session.set("userinfo", json!(lua::cjson_encode(&user)));
        match self.session.save(session, now) {
            Ok(c) => set_cookies(ctx, c),
            Err(e) => tracing::error!("failed to save session: {e}"),
        }
        tracing::info!("verified feishu user, app_id: {}", self.app_id);
        Ok(user)
    }

    async fn run(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        ctx.headers_mut().remove("x-userinfo");
        let now = self.clock.epoch_ms() / 1000;
        let (mut session, _) = self.session.open_request(ctx.headers(), now);
        let userinfo = match session.get_str("userinfo").map(str::to_owned) {
            Some(raw) => match serde_json::from_str::<Value>(&raw) {
                Ok(u) => u,
                Err(e) => {
                    let gone = self.session.destroy(&mut session);
                    set_cookies(ctx, gone);
                    tracing::error!("failed to decode userinfo in session: {e}");
                    return Flow::Exit(message_exit(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "Invalid userinfo in session",
                    ));
                }
            },
            None => {
                let Some(code) = self.code(ctx) else {
                    return redirect(&self.redirect_uri);
                };
                match self.sign_in(ctx, &mut session, &code, now).await {
                    Ok(u) => u,
                    Err(flow) => return flow,
                }
            }
        };
        if self.set_userinfo_header {
            let b64 =
                base64::engine::general_purpose::STANDARD.encode(lua::cjson_encode(&userinfo));
            if let Ok(v) = HeaderValue::from_str(&b64) {
                ctx.headers_mut()
                    .insert(HeaderName::from_static("x-userinfo"), v);
            }
        }
        Flow::Continue
    }
}

impl Plugin for Feishu {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.run(ctx)))
    }
}
