//! wolf-rbac (`apisix/plugins/wolf-rbac.lua`): authorization by a [wolf](https://github.com/iGeeky/wolf)
//! RBAC server. A consumer's conf names the wolf application (`appid`, the credential's key),
//! its `server` and the `header_prefix` of the user headers; routes enable the plugin with `{}`.
//!
//! A request's rbac token is taken from the `rbac_token` query argument, else `Authorization`,
//! else `x-rbac-token`, else the `x-rbac-token` cookie. It is `V1#<appid>#<wolf token>`: the
//! appid picks the consumer, and the wolf token goes to `<server>/wolf/rbac/access_check`
//! (`appID`, `resName` = `$uri`, `action` = the method, `clientIP` = `$remote_addr`; retried up to
//! three times while wolf answers 5xx). Wolf's `data.userInfo` becomes the `<prefix>UserId`,
//! `<prefix>Username` and `<prefix>Nickname` headers of the request sent upstream and of the
//! answer (the ones a client sent are dropped first); a status other than 200 is the answer,
//! with wolf's `reason` as the message. Answers and messages are APISIX's.
//!
//! The plugin also has the APIs `POST /apisix/plugin/wolf-rbac/login`,
//! `PUT /apisix/plugin/wolf-rbac/change_pwd` and `GET /apisix/plugin/wolf-rbac/user_info`
//! (served through `public-api`), which relay to wolf's `login.rest`, `change_pwd` and
//! `user_info`; login answers the rbac token. Their bodies are JSON or a form, read up to
//! [`MAX_API_BODY`] bytes.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_config::schema::{cjson, lua};
use ferrisix_net::clip;
use ferrisix_plugin_api::{
    ApiHandler, BodyError, CheckCtx, CompileCtx, Credential, Exit, Flow, Phases, Plugin, PluginApi,
    PluginCtx, PluginDef, PluginServices, Step,
};
use ferrisix_router::VarSource;
use http::{header, HeaderName, HeaderValue, Method, Request, StatusCode};
use serde_json::{json, Map, Value};

use crate::support::args::{decode_form, encode_args};
use crate::support::auth::message_exit;

pub const NAME: &str = "wolf-rbac";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    apis: Some(apis),
    ..PluginDef::new(NAME, 2555, schema, compile)
}
.with_credentials(schema, &[], "appid", None);

/// The version tag of the rbac tokens the gateway makes and reads.
const TOKEN_VERSION: &str = "V1";
/// The largest body the APIs read.
pub const MAX_API_BODY: usize = 1024 * 1024;
const ACCESS_CHECK_TIMEOUT: Duration = Duration::from_secs(10);
const API_TIMEOUT: Duration = Duration::from_secs(5);
const ACCESS_CHECK_TRIES: usize = 3;
const WOLF_FAILED: &str = "request to wolf-server failed!";

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "appid": {"type": "string", "default": "unset"},
            "server": {"type": "string", "default": "http://127.0.0.1:12180"},
            "header_prefix": {"type": "string", "default": "X-"},
            "ssl_verify": {"type": "boolean"}
        }
    })
}

/// APISIX's `check_https` and `check_tls_bool`: warnings, never refusals.
fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    let server = cx.conf.get("server").and_then(Value::as_str);
    if server.is_some_and(|s| !s.starts_with("https://")) {
        tracing::warn!("Using {NAME} server with no TLS is a security risk");
    }
    if cx.conf.get("ssl_verify").is_some_and(|v| v != &json!(true)) {
        tracing::warn!("Keeping ssl_verify disabled in {NAME} configuration is a security risk");
    }
    Ok(())
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(WolfRbac {
        services: cx.services.clone(),
    }))
}

/// The rbac token of a request, where APISIX's `fetch_rbac_token` looks.
fn fetch_token(ctx: &PluginCtx<'_>) -> Option<String> {
    if let Some(t) = ctx.arg("rbac_token") {
        return Some(t.into_owned());
    }
    for var in [
        "http_authorization",
        "http_x_rbac_token",
        "cookie_x-rbac-token",
    ] {
        if let Some(t) = ctx.var(var) {
            return Some(t.into_owned());
        }
    }
    None
}

/// `V1#<appid>#<wolf token>` (the wolf token may hold `#`).
fn parse_token(token: &str) -> Option<(&str, &str)> {
    let mut parts = token.splitn(3, '#');
    let (version, appid, wolf) = (parts.next()?, parts.next()?, parts.next()?);
    (version == TOKEN_VERSION).then_some((appid, wolf))
}

/// `ngx.escape_uri`: everything but letters, digits and `-._~` as `%XX`.
fn escape_uri(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A JSON scalar as Lua's `tostring` writes it into a header.
fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(lua::json_number(n)),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The consumer credential of `appid`, as APISIX's `consumers_kv(..., "appid")` finds it.
enum Lookup {
    /// No consumer has wolf-rbac at all.
    NoConsumers,
    Unknown,
    Credential(Arc<Credential>),
}

fn find_consumer(ctx: &PluginCtx<'_>, appid: &str) -> Lookup {
    match ctx.consumers() {
        Some(index) if index.has_plugin(NAME) => match index.find(NAME, appid) {
            Some(c) => Lookup::Credential(c.clone()),
            None => Lookup::Unknown,
        },
        _ => Lookup::NoConsumers,
    }
}

/// What wolf's access check said.
#[derive(Debug, PartialEq)]
struct Verdict {
    status: u16,
    err: Option<String>,
    user_info: Option<Value>,
}

/// The consumer conf's wolf server and `ssl_verify` (verified only when set to true).
fn server_of(cred: &Credential) -> (String, bool) {
    let server = cred.field("server").unwrap_or("http://127.0.0.1:12180");
    let verify = cred.conf.get("ssl_verify").and_then(Value::as_bool) == Some(true);
    (server.trim_end_matches('/').to_owned(), verify)
}

fn wolf_request(
    method: Method,
    url: &str,
    wolf_token: Option<&str>,
    body: Bytes,
) -> Result<Request<Bytes>, String> {
    let mut req = Request::builder().method(method).uri(url).header(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    if let Some(t) = wolf_token {
        let v = HeaderValue::from_str(t).map_err(|_| "invalid wolf token".to_owned())?;
        req = req.header("x-rbac-token", v);
    }
    req.body(body).map_err(|e| e.to_string())
}

/// APISIX's `check_url_permission`.
async fn check_permission(
    services: &PluginServices,
    server: &str,
    ssl_verify: bool,
    query: &[(String, Option<String>)],
    wolf_token: &str,
) -> Verdict {
    let url = format!("{server}/wolf/rbac/access_check?{}", encode_args(query));
    let mut last: Result<http::Response<Bytes>, String> = Err("no attempt".into());
    for attempt in 1..=ACCESS_CHECK_TRIES {
        let req = match wolf_request(Method::GET, &url, Some(wolf_token), Bytes::new()) {
            Ok(r) => r,
            Err(e) => {
                last = Err(e);
                break;
            }
        };
        let sent = services
            .http()
            .send_verified(req, ACCESS_CHECK_TIMEOUT, ssl_verify)
            .await;
        match sent {
            Err(e) => {
                last = Err(e.to_string());
                break;
            }
            Ok(resp) => {
                let retry = resp.status().is_server_error() && attempt < ACCESS_CHECK_TRIES;
                last = Ok(resp);
                if !retry {
                    break;
                }
                tracing::info!("{NAME}: access check answered 5xx, retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let resp = match last {
        Ok(resp) => resp,
        Err(e) => {
            tracing::error!("{NAME}: access check request to {server} failed: {e}");
            return Verdict {
                status: 500,
                err: Some(format!("request to wolf-server failed, err:{e}")),
                user_info: None,
            };
        }
    };
    let status = resp.status().as_u16();
    if status >= 500 {
        return Verdict {
            status: 500,
            err: Some(format!("request to wolf-server failed, status:{status}")),
            user_info: None,
        };
    }
    match cjson::decode(resp.body()) {
        Ok(Value::Object(body)) => Verdict {
            status,
            err: body.get("reason").and_then(text),
            user_info: body.get("data").and_then(|d| d.get("userInfo")).cloned(),
        },
        _ => {
            tracing::error!("{NAME}: the access check's answer is not a JSON object");
            Verdict {
                status,
                err: Some("check permission failed! parse response json failed!".into()),
                user_info: None,
            }
        }
    }
}

/// `{"message": msg, ...}` as APISIX's `fail_response` builds it (absent fields left out).
fn message_body(msg: Option<&str>, extra: &[(&str, Option<Value>)]) -> String {
    let mut m = Map::new();
    if let Some(msg) = msg {
        m.insert("message".into(), json!(msg));
    }
    for (k, v) in extra {
        if let Some(v) = v {
            m.insert((*k).to_owned(), v.clone());
        }
    }
    let mut body = lua::cjson_encode(&Value::Object(m));
    body.push('\n');
    body
}

fn status_of(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

struct WolfRbac {
    services: Arc<PluginServices>,
}

impl WolfRbac {
    async fn run(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let Some(token) = fetch_token(ctx) else {
            tracing::info!("{NAME}: no rbac token in the request, need login");
            return Flow::Exit(message_exit(
                StatusCode::UNAUTHORIZED,
                "Missing rbac token in request",
            ));
        };
        let Some((appid, wolf_token)) = parse_token(&token) else {
            return Flow::Exit(message_exit(
                StatusCode::UNAUTHORIZED,
                "invalid rbac token: parse failed",
            ));
        };
        let cred = match find_consumer(ctx, appid) {
            Lookup::NoConsumers => {
                return Flow::Exit(message_exit(
                    StatusCode::UNAUTHORIZED,
                    "Missing related consumer",
                ))
            }
            Lookup::Unknown => {
                tracing::error!("consumer [{}] not found", clip(appid));
                return Flow::Exit(message_exit(
                    StatusCode::UNAUTHORIZED,
                    "Invalid appid in rbac token",
                ));
            }
            Lookup::Credential(c) => c,
        };
        let (server, ssl_verify) = server_of(&cred);
        let action = ctx.method().as_str().to_owned();
        let url = ctx.uri().to_owned();
        let query = vec![
            ("appID".to_owned(), Some(appid.to_owned())),
            ("resName".to_owned(), Some(url.clone())),
            ("action".to_owned(), Some(action.clone())),
            ("clientIP".to_owned(), Some(ctx.remote_addr().to_string())),
        ];
        let verdict =
            check_permission(&self.services, &server, ssl_verify, &query, wolf_token).await;

        let prefix = cred.field("header_prefix").unwrap_or("");
        let names = ["UserId", "Username", "Nickname"]
            .map(|n| HeaderName::from_bytes(format!("{prefix}{n}").as_bytes()).ok());
        // A client's own identity headers never reach the upstream.
        for name in names.iter().flatten() {
            ctx.headers_mut().remove(name);
        }
        let mut username = None;
        let mut nickname = None;
        if let Some(Value::Object(info)) = &verdict.user_info {
            username = info.get("username").cloned();
            nickname = info
                .get("nickname")
                .filter(|v| !v.is_null())
                .or(info.get("username"))
                .cloned();
            let values = [
                info.get("id").and_then(text),
                username.as_ref().and_then(text),
                nickname.as_ref().and_then(text).map(|n| escape_uri(&n)),
            ];
            for (name, value) in names.iter().zip(values) {
                let (Some(name), Some(value)) = (name, value) else {
                    continue;
                };
                if let Ok(v) = HeaderValue::from_str(&value) {
                    ctx.response_headers_mut().insert(name.clone(), v.clone());
                    ctx.headers_mut().insert(name.clone(), v);
                }
            }
        }
        if verdict.status != 200 {
            tracing::error!(
                "{NAME}: check_url_permission(appid: {}, action: {action}, url: {}) failed, res status: {}, err: {}",
                clip(appid),
                clip(&url),
                verdict.status,
                verdict.err.as_deref().unwrap_or("nil")
            );
            let body = message_body(
                verdict.err.as_deref(),
                &[("username", username), ("nickname", nickname)],
            );
            return Flow::Exit(Exit::body(status_of(verdict.status), body));
        }
        ctx.attach_consumer(cred.consumer.clone());
        Flow::Continue
    }
}

impl Plugin for WolfRbac {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.run(ctx)))
    }
}

/// The plugin's APIs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    Login,
    ChangePwd,
    UserInfo,
}

fn apis(_: &PluginServices) -> Vec<PluginApi> {
    let api = |methods: &'static [Method], path: &str, api: Api| PluginApi {
        methods,
        uri: format!("/apisix/plugin/wolf-rbac/{path}"),
        handler: ApiHandler::Request {
            plugin: NAME,
            make: Arc::new(move |_, services| {
                Arc::new(WolfApi {
                    api,
                    services: services.clone(),
                })
            }),
        },
    };
    vec![
        api(&[Method::POST], "login", Api::Login),
        api(&[Method::PUT], "change_pwd", Api::ChangePwd),
        api(&[Method::GET], "user_info", Api::UserInfo),
    ]
}

struct WolfApi {
    api: Api,
    services: Arc<PluginServices>,
}

/// An API's early answer.
type Answer = Result<Value, Exit>;

fn fail(status: StatusCode, msg: &str) -> Exit {
    message_exit(status, msg)
}

impl WolfApi {
    /// APISIX's `get_args`: the body as JSON when the Content-Type says so (`None` when it is
    /// not JSON), else as a form.
    async fn args(ctx: &mut PluginCtx<'_>) -> Result<Option<Value>, Exit> {
        let json = ctx
            .header("content-type")
            .is_some_and(|ct| ct.contains("application/json"));
        let body = match ctx.read_body(MAX_API_BODY).await {
            Ok(b) => b.clone(),
            Err(BodyError::TooLarge(_)) => return Err(Exit::status(StatusCode::PAYLOAD_TOO_LARGE)),
            Err(BodyError::Timeout) => return Err(Exit::status(StatusCode::REQUEST_TIMEOUT)),
            Err(BodyError::Broken(_)) => return Err(Exit::status(StatusCode::BAD_REQUEST)),
        };
        if json {
            return Ok(match cjson::decode(&body) {
                Ok(v) => Some(v),
                Err(e) => {
                    tracing::error!("{NAME}: the request body is not JSON: {e}");
                    None
                }
            });
        }
        Ok(Some(decode_form(&body)))
    }

    /// The rbac token of an API request (`get_wolf_token`).
    fn token(ctx: &PluginCtx<'_>) -> Result<(String, String), Exit> {
        let Some(token) = fetch_token(ctx) else {
            return Err(fail(
                StatusCode::UNAUTHORIZED,
                "Missing rbac token in request",
            ));
        };
        match parse_token(&token) {
            Some((appid, wolf)) => Ok((appid.to_owned(), wolf.to_owned())),
            None => Err(fail(
                StatusCode::UNAUTHORIZED,
                "invalid rbac token: parse failed",
            )),
        }
    }

    /// `get_consumer`: 500 without any wolf-rbac consumer, 400 for an unknown appid.
    fn consumer(ctx: &PluginCtx<'_>, appid: &str) -> Result<Arc<Credential>, Exit> {
        match find_consumer(ctx, appid) {
            Lookup::Credential(c) => Ok(c),
            Lookup::NoConsumers => Err(Exit::status(StatusCode::INTERNAL_SERVER_ERROR)),
            Lookup::Unknown => {
                tracing::info!("{NAME}: request appid [{}] not found", clip(appid));
                Err(fail(StatusCode::BAD_REQUEST, "appid not found"))
            }
        }
    }

    /// `request_to_wolf_server`: wolf's answer when it is a JSON object with `ok` true.
    async fn call(
        &self,
        cred: &Credential,
        method: Method,
        path: &str,
        wolf_token: Option<&str>,
        body: &Value,
    ) -> Answer {
        let (server, ssl_verify) = server_of(cred);
        let url = format!("{server}{path}");
        let failed = |why: String| {
            tracing::error!("{NAME}: request [{method} {url}] failed! {why}");
            fail(StatusCode::INTERNAL_SERVER_ERROR, WOLF_FAILED)
        };
        let encoded = Bytes::from(lua::cjson_encode(body));
        let req = wolf_request(method.clone(), &url, wolf_token, encoded).map_err(&failed)?;
        let resp = self
            .services
            .http()
            .send_verified(req, API_TIMEOUT, ssl_verify)
            .await
            .map_err(|e| failed(format!("err: {e}")))?;
        if resp.status() != StatusCode::OK {
            return Err(failed(format!("status: {}", resp.status().as_u16())));
        }
        let body = match cjson::decode(resp.body()) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => return Err(failed("err: not a JSON object".into())),
            Err(e) => return Err(failed(format!("err: {e}"))),
        };
        if body.get("ok") != Some(&json!(true)) {
            let reason = body.get("reason").and_then(text).unwrap_or_default();
            tracing::error!(
                "{NAME}: request [{method} {url}] failed! reason: {}",
                clip(&reason)
            );
            return Err(fail(StatusCode::OK, WOLF_FAILED));
        }
        Ok(body)
    }

    async fn run(&self, ctx: &mut PluginCtx<'_>) -> Result<Value, Exit> {
        match self.api {
            Api::Login => {
                let Some(args) = Self::args(ctx).await? else {
                    return Err(fail(StatusCode::BAD_REQUEST, "invalid request"));
                };
                let Some(appid) = args.get("appid").filter(|a| !a.is_null()) else {
                    return Err(fail(StatusCode::BAD_REQUEST, "appid is missing"));
                };
                let appid = text(appid).unwrap_or_default();
                let cred = Self::consumer(ctx, &appid)?;
                let body = self
                    .call(&cred, Method::POST, "/wolf/rbac/login.rest", None, &args)
                    .await?;
                let data = &body["data"];
                let Some(wolf_token) = data.get("token").and_then(text) else {
                    tracing::error!("{NAME}: wolf's login answer has no data.token");
                    return Err(fail(StatusCode::INTERNAL_SERVER_ERROR, WOLF_FAILED));
                };
                let mut out = Map::new();
                out.insert(
                    "rbac_token".into(),
                    json!(format!("{TOKEN_VERSION}#{appid}#{wolf_token}")),
                );
                if let Some(info) = data.get("userInfo").filter(|v| !v.is_null()) {
                    out.insert("user_info".into(), info.clone());
                }
                Ok(Value::Object(out))
            }
            Api::ChangePwd => {
                let args = Self::args(ctx).await?.unwrap_or(Value::Null);
                let (appid, wolf_token) = Self::token(ctx)?;
                let cred = Self::consumer(ctx, &appid)?;
                self.call(
                    &cred,
                    Method::POST,
                    "/wolf/rbac/change_pwd",
                    Some(&wolf_token),
                    &args,
                )
                .await?;
                Ok(json!({"message": "success to change password"}))
            }
            Api::UserInfo => {
                let (appid, wolf_token) = Self::token(ctx)?;
                let cred = Self::consumer(ctx, &appid)?;
                let body = self
                    .call(
                        &cred,
                        Method::GET,
                        "/wolf/rbac/user_info",
                        Some(&wolf_token),
                        &json!({}),
                    )
                    .await?;
                let mut out = Map::new();
                if let Some(info) = body["data"].get("userInfo").filter(|v| !v.is_null()) {
                    out.insert("user_info".into(), info.clone());
                }
                Ok(Value::Object(out))
            }
        }
    }
}

impl Plugin for WolfApi {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn needs_consumers(&self) -> bool {
        true
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(async move {
            let exit = match self.run(ctx).await {
                Ok(body) => {
                    let mut text = lua::cjson_encode(&body);
                    text.push('\n');
                    Exit::body(StatusCode::OK, text)
                }
                Err(exit) => exit,
            };
            Flow::Exit(exit)
        }))
    }
}

#[cfg(test)]
mod tests;
