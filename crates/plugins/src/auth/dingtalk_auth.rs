//! dingtalk-auth (`apisix/plugins/dingtalk-auth.lua`): sign-in with DingTalk. A request whose
//! session (lua-resty-session's `dingtalk_session` cookie, keyed by `secret` and
//! `secret_fallbacks`, valid `cookie_expires_in` seconds from creation) holds the user goes
//! on with `X-Userinfo` (base64 JSON, `set_userinfo_header`). Otherwise the authorization code
//! (header `code_header`, else query argument `code_query`) is exchanged: the app's access
//! token from `access_token_url` (`{"appKey", "appSecret"}`, cached for 7000 s), then the user
//! from `userinfo_url?access_token=` (`{"code"}`; `errcode` 0), kept in the session. Without a
//! code the browser is sent to `redirect_uri`. Answers and messages are APISIX's.

use std::sync::{Arc, Mutex};
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
use crate::support::session::{set_cookies, SessionConf};

pub const NAME: &str = "dingtalk-auth";

pub static DEF: PluginDef = PluginDef {
    version: 0.1,
    encrypt_fields: &["app_secret", "secret", "secret_fallbacks"],
    ..PluginDef::new(NAME, 2430, schema, compile)
};

const TOKEN_TTL_MS: u64 = 7_000_000;

/// What `ngx.encode_args` leaves as it is: letters, digits, `-._~`.
const COMPONENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn schema() -> Value {
    let text = || json!({"type": "string", "minLength": 1});
    let secret = json!({"type": "string", "minLength": 8, "maxLength": 32});
    json!({
        "type": "object",
        "properties": {
            "app_key": text(),
            "app_secret": text(),
            "code_header": {"type": "string", "minLength": 1, "default": "X-DingTalk-Code"},
            "code_query": {"type": "string", "minLength": 1, "default": "code"},
            "userinfo_url": {"type": "string", "minLength": 1,
                             "default": "https://oapi.dingtalk.com/topapi/v2/user/getuserinfo"},
            "access_token_url": {"type": "string", "minLength": 1,
                                 "default": "https://api.dingtalk.com/v1.0/oauth2/accessToken"},
            "set_userinfo_header": {"type": "boolean", "default": true},
            "redirect_uri": text(),
            "timeout": {"type": "integer", "minimum": 1, "default": 6000},
            "ssl_verify": {"type": "boolean", "default": true},
            "secret": secret,
            "secret_fallbacks": {"type": "array", "items": secret},
            "cookie_expires_in": {"type": "integer", "minimum": 1, "default": 86400}
        },
        "required": ["app_key", "app_secret", "secret", "redirect_uri"]
    })
}

struct DingTalk {
    app_key: String,
    app_secret: String,
    code_header: Option<HeaderName>,
    code_query: String,
    userinfo_url: String,
    access_token_url: String,
    set_userinfo_header: bool,
    redirect_uri: String,
    timeout: Duration,
    ssl_verify: bool,
    session: SessionConf,
    /// The app's access token and when it expires (epoch ms).
    token: Mutex<Option<(String, u64)>>,
    services: Arc<PluginServices>,
    clock: Clock,
}

impl std::fmt::Debug for DingTalk {
    /// The app secret is not printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DingTalk")
            .field("app_key", &self.app_key)
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
        "cookie_name": "dingtalk_session",
        "absolute_timeout": conf.get("cookie_expires_in"),
    }));
    Ok(Arc::new(DingTalk {
        app_key: s("app_key"),
        app_secret: s("app_secret"),
        code_header: HeaderName::from_bytes(s("code_header").as_bytes()).ok(),
        code_query: s("code_query"),
        userinfo_url: s("userinfo_url"),
        access_token_url: s("access_token_url"),
        set_userinfo_header: conf["set_userinfo_header"].as_bool().unwrap_or(true),
        redirect_uri: s("redirect_uri"),
        timeout: Duration::from_millis(conf["timeout"].as_u64().unwrap_or(6000)),
        ssl_verify: conf["ssl_verify"].as_bool().unwrap_or(true),
        session,
        token: Mutex::new(None),
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

impl DingTalk {
    async fn post_json(&self, url: &str, body: Value) -> Result<Value, String> {
        let req = Request::builder()
            .method(Method::POST)
            .uri(url)
            .header("content-type", "application/json")
            .body(Bytes::from(lua::cjson_encode(&body)))
            .map_err(|e| e.to_string())?;
        let resp = self
            .services
            .http()
            .send_verified(req, self.timeout, self.ssl_verify)
            .await
            .map_err(|e| e.to_string())?;
        if resp.status() != StatusCode::OK {
            tracing::error!(
                "unexpected http response status from dingtalk: {}",
                resp.status().as_u16()
            );
            return Err(format!(
                "unexpected response status: {}",
                resp.status().as_u16()
            ));
        }
        serde_json::from_slice(resp.body()).map_err(|e| format!("failed to decode response: {e}"))
    }

    async fn access_token(&self) -> Result<String, String> {
        let now = self.clock.epoch_ms();
        if let Some((token, until)) = self.token.lock().ok().and_then(|t| t.clone()) {
            if now < until {
                return Ok(token);
            }
        }
        let data = self
            .post_json(
                &self.access_token_url,
                json!({"appKey": self.app_key, "appSecret": self.app_secret}),
            )
            .await?;
        let token = data
            .get("accessToken")
            .and_then(Value::as_str)
            .ok_or("dingtalk token response missing accessToken")?
            .to_owned();
        if let Ok(mut t) = self.token.lock() {
            *t = Some((token.clone(), now + TOKEN_TTL_MS));
        }
        Ok(token)
    }

    /// The user of a code; `Err((message, is the code's fault))`.
    async fn userinfo(&self, token: &str, code: &str) -> Result<Value, (String, bool)> {
        let sep = if self.userinfo_url.contains('?') {
            '&'
        } else {
            '?'
        };
        let url = format!(
            "{}{sep}access_token={}",
            self.userinfo_url,
            percent_encoding::utf8_percent_encode(token, COMPONENT)
        );
        let data = self
            .post_json(&url, json!({"code": code}))
            .await
            .map_err(|e| (e, false))?;
        if data.get("errcode").and_then(Value::as_i64) != Some(0) {
            let code = data.get("errcode").map_or("nil".into(), |v| v.to_string());
            let msg = data.get("errmsg").and_then(Value::as_str).unwrap_or("nil");
            return Err((
                format!("unexpected error code: {code}, errmsg: {msg}"),
                true,
            ));
        }
        Ok(data.get("result").cloned().unwrap_or(Value::Null))
    }

    fn code(&self, ctx: &PluginCtx<'_>) -> Option<String> {
        self.code_header
            .as_ref()
            .and_then(|h| ctx.headers().get(h))
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .or_else(|| ctx.arg(&self.code_query).map(|c| c.into_owned()))
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
                    return redirect(&self.redirect_uri);
                }
            },
            None => {
                let Some(code) = self.code(ctx) else {
                    return redirect(&self.redirect_uri);
                };
                let token = match self.access_token().await {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::error!("failed to get dingtalk access token: {e}");
                        return Flow::Exit(message_exit(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "Failed to obtain access token",
                        ));
                    }
                };
                let user = match self.userinfo(&token, &code).await {
                    Ok(u) => u,
                    Err((e, code_fault)) => {
                        tracing::warn!("failed to get dingtalk userinfo: {e}");
                        return Flow::Exit(if code_fault {
                            message_exit(StatusCode::UNAUTHORIZED, "Invalid authorization code")
                        } else {
                            message_exit(
                                StatusCode::SERVICE_UNAVAILABLE,
                                "Failed to obtain user info from DingTalk",
                            )
                        });
                    }
                };
                session.set("userinfo", json!(lua::cjson_encode(&user)));
                match self.session.save(&mut session, now) {
                    Ok(c) => set_cookies(ctx, c),
                    Err(e) => {
                        tracing::error!("failed to save session: {e}");
                        return Flow::Exit(message_exit(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "Failed to save session",
                        ));
                    }
                }
                tracing::info!("verified dingtalk user, app_key: {}", self.app_key);
                user
            }
        };
        if self.set_userinfo_header && !userinfo.is_null() {
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

impl Plugin for DingTalk {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.run(ctx)))
    }
}
