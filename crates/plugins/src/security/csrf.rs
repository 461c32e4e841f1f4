//! csrf (`apisix/plugins/csrf.lua`): the double-submit cookie defence. Every answer sets the
//! cookie `name` (default `apisix-csrf-token`) to a fresh token, `base64({"random": R,
//! "expires": T, "sign": S})` with `S` the hex SHA-256 of `{expires:T,random:R,key:KEY}`;
//! a request other than GET, HEAD and OPTIONS must carry the same token in the header `name`
//! and the cookie, signed with the plugin's `key` and no older than `expires` seconds (0: no
//! age limit), else 401 with `{"error_msg": ...}`. Tokens are compared in constant time.

use std::sync::Arc;

use base64::Engine;
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::clock::CivilTime;
use ferrisix_plugin_api::{
    Clock, CompileCtx, Exit, Phases, Plugin, PluginCtx, PluginDef, ResponseHead, Step,
};
use ferrisix_router::VarSource;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use serde_json::{json, Value};

use crate::support::auth::secret_eq;

pub const NAME: &str = "csrf";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &["key"],
    ..PluginDef::new(NAME, 2980, schema, compile)
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "key": {"type": "string"},
            "expires": {"type": "integer", "default": 7200},
            "name": {"type": "string", "default": "apisix-csrf-token"}
        },
        "required": ["key"]
    })
}

struct Csrf {
    key: String,
    expires: i64,
    name: String,
    /// The header carrying the token; `None` for a name no request can carry.
    header: Option<HeaderName>,
    cookie_var: String,
    clock: Clock,
}

impl std::fmt::Debug for Csrf {
    /// The key is a secret: not printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Csrf")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let name = conf["name"]
        .as_str()
        .unwrap_or("apisix-csrf-token")
        .to_owned();
    Ok(Arc::new(Csrf {
        key: conf["key"].as_str().unwrap_or_default().to_owned(),
        expires: conf["expires"].as_i64().unwrap_or(7200),
        header: HeaderName::from_bytes(name.as_bytes()).ok(),
        cookie_var: format!("cookie_{name}"),
        name,
        clock: cx.services.clock().clone(),
    }))
}

/// `gen_sign`: hex SHA-256 of `{expires:E,random:R,key:K}` (the values as Lua prints them).
fn sign(random: &str, expires: &str, key: &str) -> String {
    let text = format!("{{expires:{expires},random:{random},key:{key}}}");
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// A token field as Lua's `..` prints it: numbers as `tostring` does, strings as they are.
fn lua_text(v: &Value) -> Option<String> {
    match v {
        Value::Number(n) => Some(lua::json_number(n)),
        Value::String(s) => Some(s.clone()),
        _ => None,
    }
}

/// nginx's `ngx.cookie_time`: `Thu, 01-Jan-2099 00:00:00 GMT`.
fn cookie_time(secs: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    let t = CivilTime::from_unix_secs(secs);
    format!(
        "{}, {:02}-{}-{:04} {:02}:{:02}:{:02} GMT",
        DAYS[((secs / 86_400) % 7) as usize],
        t.day,
        t.month_abbr(),
        t.year,
        t.hour,
        t.minute,
        t.second
    )
}

impl Csrf {
    fn now(&self) -> i64 {
        i64::try_from(self.clock.epoch_ms() / 1000).unwrap_or(i64::MAX)
    }

    /// `gen_csrf_token`: a fresh token signed now.
    fn token(&self) -> String {
        let random = lua::number(rand::random::<f64>());
        let now = self.now().to_string();
        let body = format!(
            "{{\"random\":{random},\"expires\":{now},\"sign\":\"{}\"}}",
            sign(&random, &now, &self.key)
        );
        base64::engine::general_purpose::STANDARD.encode(body)
    }

    /// `check_csrf_token`: the token decodes, is young enough and carries our signature.
    fn valid(&self, token: &str) -> bool {
        let Ok(raw) =
            base64::engine::general_purpose::STANDARD_NO_PAD.decode(token.trim_end_matches('='))
        else {
            tracing::error!("csrf token base64 decode error");
            return false;
        };
        let Ok(Value::Object(t)) = serde_json::from_slice::<Value>(&raw) else {
            tracing::error!("decode token error");
            return false;
        };
        let (Some(random), Some(expires)) = (
            t.get("random").and_then(lua_text),
            t.get("expires").and_then(lua_text),
        ) else {
            tracing::error!("no random or expires in token");
            return false;
        };
        let Some(issued) = lua::tonumber(&expires) else {
            return false;
        };
        if self.expires > 0 && (self.now() as f64) - issued > self.expires as f64 {
            tracing::error!("token has expired");
            return false;
        }
        let want = sign(&random, &expires, &self.key);
        let got = t.get("sign").and_then(Value::as_str).unwrap_or_default();
        if !secret_eq(got.as_bytes(), want.as_bytes()) {
            tracing::error!("Invalid signatures");
            return false;
        }
        true
    }
}

fn refuse(msg: &str) -> Step<'static> {
    Step::exit(Exit::error_msg(StatusCode::UNAUTHORIZED, msg))
}

impl Plugin for Csrf {
    fn phases(&self) -> Phases {
        Phases::ACCESS | Phases::HEADER_FILTER
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let m = ctx.method();
        if m == Method::GET || m == Method::HEAD || m == Method::OPTIONS {
            return Step::CONTINUE;
        }
        let header = self
            .header
            .as_ref()
            .and_then(|h| ctx.headers().get(h))
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .filter(|v| !v.is_empty());
        let Some(header) = header else {
            return refuse("no csrf token in headers");
        };
        let Some(cookie) = ctx.var(&self.cookie_var) else {
            return refuse("no csrf cookie");
        };
        if !secret_eq(header.as_bytes(), cookie.as_bytes()) {
            return refuse("csrf token mismatch");
        }
        if !self.valid(&cookie) {
            return refuse("Failed to verify the csrf token signature");
        }
        Step::CONTINUE
    }

    fn header_filter(&self, _ctx: &mut PluginCtx<'_>, resp: &mut ResponseHead<'_>) {
        let expires = u64::try_from(self.now() + self.expires).unwrap_or(0);
        let cookie = format!(
            "{}={};path=/;SameSite=Lax;Expires={}",
            self.name,
            self.token(),
            cookie_time(expires)
        );
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            resp.headers_mut().append(http::header::SET_COOKIE, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::{Flow, PluginServices};

    use super::*;
    use crate::testing::Compiler;

    fn verdict(p: &dyn Plugin, req: TestRequest) -> (u16, String) {
        let mut req = req;
        let out = match p.access(&mut req.ctx()) {
            Step::Done(Flow::Continue) => (200, String::new()),
            Step::Done(Flow::Exit(e)) => (
                e.status.as_u16(),
                String::from_utf8_lossy(e.body.as_deref().unwrap_or_default()).into_owned(),
            ),
            Step::Wait(_) => panic!("csrf does not wait"),
        };
        out
    }

    fn token(random: &str, expires: u64, key: &str) -> String {
        let body = format!(
            "{{\"random\":{random},\"expires\":{expires},\"sign\":\"{}\"}}",
            sign(random, &expires.to_string(), key)
        );
        base64::engine::general_purpose::STANDARD.encode(body)
    }

    #[test]
    fn tokens_are_checked() {
        let services = Arc::new(PluginServices::new(
            Default::default(),
            ferrisix_plugin_api::Executor::current(),
            Clock::manual(1_700_000_000_000),
        ));
        let c = Compiler::with(services);
        let conf = json!({"key": "k", "expires": 100});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "r", None)).unwrap();
        let post = |h: Option<&str>, cookie: Option<&str>| {
            let mut r = TestRequest::new(Method::POST, "/");
            if let Some(h) = h {
                r = r.header("apisix-csrf-token", h);
            }
            if let Some(c) = cookie {
                r = r.header("cookie", &format!("apisix-csrf-token={c}"));
            }
            r
        };
        assert_eq!(verdict(&*p, TestRequest::get("/")).0, 200);
        let msg = |m: &str| (401, format!("{{\"error_msg\":\"{m}\"}}\n"));
        assert_eq!(
            verdict(&*p, post(None, None)),
            msg("no csrf token in headers")
        );
        assert_eq!(verdict(&*p, post(Some("a"), None)), msg("no csrf cookie"));
        assert_eq!(
            verdict(&*p, post(Some("a"), Some("b"))),
            msg("csrf token mismatch")
        );
        let bad = msg("Failed to verify the csrf token signature");
        assert_eq!(verdict(&*p, post(Some("a"), Some("a"))), bad);
        let good = token("0.25", 1_699_999_950, "k");
        assert_eq!(verdict(&*p, post(Some(&good), Some(&good))).0, 200);
        let old = token("0.25", 1_699_999_800, "k");
        assert_eq!(verdict(&*p, post(Some(&old), Some(&old))), bad);
        let other = token("0.25", 1_699_999_950, "other");
        assert_eq!(verdict(&*p, post(Some(&other), Some(&other))), bad);
        // The plugin's own tokens pass.
        let csrf = Csrf {
            key: "k".into(),
            expires: 100,
            name: "n".into(),
            header: None,
            cookie_var: "cookie_n".into(),
            clock: Clock::manual(1_700_000_000_000),
        };
        assert!(csrf.valid(&csrf.token()));
    }

    #[test]
    fn cookie_time_is_nginx_s() {
        assert_eq!(cookie_time(0), "Thu, 01-Jan-1970 00:00:00 GMT");
        assert_eq!(cookie_time(4_102_444_800), "Fri, 01-Jan-2100 00:00:00 GMT");
    }
}
