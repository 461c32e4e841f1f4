//! basic-auth (`apisix/plugins/basic-auth.lua`): `Authorization: Basic base64(user:pass)`
//! names a consumer's credential by `username`; its `password` is compared in constant time.
//! A missing header is "Missing authorization in request", one that does not parse "Invalid
//! authorization in request", an unknown user or a wrong password "Invalid user
//! authorization", each a 401 with `WWW-Authenticate: Basic realm="<realm>"` unless
//! `anonymous_consumer` names the consumer to go on as. `hide_credentials` takes the
//! `Authorization` header out before the request goes upstream.

use std::sync::Arc;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use ferrisix_plugin_api::{CompileCtx, Phases, Plugin, PluginCtx, PluginDef, Step};
use http::header::AUTHORIZATION;
use http::HeaderValue;
use serde_json::{json, Value};

use crate::support::auth::{
    anonymous_consumer_schema, anonymous_or_401, challenge, realm_schema, secret_eq,
};

pub const NAME: &str = "basic-auth";

pub static DEF: PluginDef = PluginDef::new(NAME, 2520, schema, compile).with_credentials(
    consumer_schema,
    &["password"],
    "username",
    None,
);

fn schema() -> Value {
    json!({
        "type": "object",
        "title": "work with route or service object",
        "properties": {
            "hide_credentials": {"type": "boolean", "default": false},
            "realm": realm_schema("basic"),
            "anonymous_consumer": anonymous_consumer_schema()
        }
    })
}

fn consumer_schema() -> Value {
    json!({
        "type": "object",
        "title": "work with consumer object",
        "properties": {
            "username": {"type": "string"},
            "password": {"type": "string"}
        },
        "required": ["username", "password"]
    })
}

/// `ngx.decode_base64`: the standard alphabet, padding optional.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

#[derive(Debug)]
struct BasicAuth {
    hide_credentials: bool,
    anonymous_consumer: Option<String>,
    challenge: Option<HeaderValue>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let text = |name: &str| conf.get(name).and_then(Value::as_str).map(str::to_owned);
    Ok(Arc::new(BasicAuth {
        hide_credentials: conf.get("hide_credentials").and_then(Value::as_bool) == Some(true),
        anonymous_consumer: text("anonymous_consumer"),
        challenge: challenge("Basic", &text("realm").unwrap_or_else(|| "basic".into())),
    }))
}

/// APISIX's `extract_auth_header`: the first `basic` (any case) followed by a whitespace and
/// the base64 of `user:password`; the decoded text is split at every `:` and whitespace is
/// removed from the first two parts (a password with a `:` is cut there, as in APISIX).
fn parse(header: &[u8]) -> Option<(String, String)> {
    let lower = header.to_ascii_lowercase();
    let at = lower
        .windows(6)
        .position(|w| w[..5] == *b"basic" && w[5].is_ascii_whitespace())?;
    let encoded = &header[at + 6..];
    if encoded.is_empty() {
        return None;
    }
    let decoded = BASE64.decode(encoded).ok()?;
    let decoded = String::from_utf8_lossy(&decoded);
    let mut parts = decoded.split(':');
    let user = parts.next()?;
    let pass = parts.next()?;
    let strip = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
    Some((strip(user), strip(pass)))
}

impl BasicAuth {
    fn find(&self, ctx: &mut PluginCtx<'_>) -> Result<(), &'static str> {
        let header = ctx
            .headers()
            .get(AUTHORIZATION)
            .ok_or("Missing authorization in request")?;
        // Credentials are not logged, not even the ones that do not parse.
        let (user, pass) = parse(header.as_bytes()).ok_or("Invalid authorization in request")?;
        let cred = ctx
            .find_credential(NAME, &user)
            .ok_or("Invalid user authorization")?;
        let expected = cred.field("password").unwrap_or_default();
        if !secret_eq(expected.as_bytes(), pass.as_bytes()) {
            return Err("Invalid user authorization");
        }
        let consumer = cred.consumer.clone();
        ctx.attach_consumer(consumer);
        Ok(())
    }
}

impl Plugin for BasicAuth {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        if let Err(msg) = self.find(ctx) {
            let anonymous_consumer = self.anonymous_consumer.as_deref();
            let challenge = self.challenge.as_ref();
            if let Err(exit) = anonymous_or_401(ctx, NAME, anonymous_consumer, msg, challenge) {
                return Step::exit(exit);
            }
        }
        if self.hide_credentials {
            ctx.headers_mut().remove(AUTHORIZATION);
        }
        Step::CONTINUE
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::Flow;

    use super::*;
    use crate::testing::{jack_and_anon, Compiler};

    fn run(conf: Value, mut req: TestRequest) -> (Flow, TestRequest) {
        req.state.set_consumers(jack_and_anon(
            NAME,
            "user",
            json!({"username": "user", "password": "pass"}),
        ));
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "ba", None)).unwrap();
        let Step::Done(flow) = p.rewrite(&mut req.ctx()) else {
            panic!("basic-auth does not wait")
        };
        (flow, req)
    }

    fn basic(user_pass: &str) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(user_pass)
        )
    }

    fn message(flow: &Flow) -> String {
        match flow {
            Flow::Exit(e) => {
                assert_eq!(e.status, 401);
                assert!(e.headers.iter().any(|(n, _)| n == "www-authenticate"));
                String::from_utf8_lossy(e.body.as_deref().unwrap()).into_owned()
            }
            Flow::Continue => "passed".into(),
        }
    }

    #[test]
    fn good_and_bad_credentials() {
        let ok = basic("user:pass");
        let (flow, req) = run(
            json!({}),
            TestRequest::get("/").header("authorization", &ok),
        );
        assert_eq!(flow, Flow::Continue);
        assert_eq!(req.headers["x-consumer-username"], "jack");
        assert!(req.headers.get("authorization").is_some());
        let lower = ok.replace("Basic", "bAsIc");
        let (flow, _) = run(
            json!({}),
            TestRequest::get("/").header("authorization", &lower),
        );
        assert_eq!(flow, Flow::Continue, "the scheme is case-insensitive");
        for (header, msg) in [
            (None, "Missing authorization in request"),
            (
                Some("Bearer abc".to_owned()),
                "Invalid authorization in request",
            ),
            (
                Some("Basic !!!".to_owned()),
                "Invalid authorization in request",
            ),
            (Some(basic("nocolon")), "Invalid authorization in request"),
            (Some(basic("user:wrong")), "Invalid user authorization"),
            (Some(basic("user:pas")), "Invalid user authorization"),
            (Some(basic("nobody:pass")), "Invalid user authorization"),
        ] {
            let mut req = TestRequest::get("/");
            if let Some(h) = &header {
                req = req.header("authorization", h);
            }
            let (flow, _) = run(json!({}), req);
            assert_eq!(
                message(&flow),
                format!("{{\"message\":\"{msg}\"}}\n"),
                "{header:?}"
            );
        }
        // Whitespace inside the decoded pair is dropped, as APISIX does.
        let (flow, _) = run(
            json!({}),
            TestRequest::get("/").header("authorization", &basic(" user : pass ")),
        );
        assert_eq!(flow, Flow::Continue);
    }

    #[test]
    fn hide_credentials_realm_and_anonymous() {
        let (flow, req) = run(
            json!({"hide_credentials": true}),
            TestRequest::get("/").header("authorization", &basic("user:pass")),
        );
        assert_eq!(flow, Flow::Continue);
        assert!(req.headers.get("authorization").is_none());
        let (flow, _) = run(json!({"realm": "mine"}), TestRequest::get("/"));
        let Flow::Exit(e) = flow else { panic!() };
        assert!(e
            .headers
            .iter()
            .any(|(n, v)| n == "www-authenticate" && v == "Basic realm=\"mine\""));
        let (flow, req) = run(json!({"anonymous_consumer": "anon"}), TestRequest::get("/"));
        assert_eq!(flow, Flow::Continue);
        assert_eq!(req.headers["x-consumer-username"], "anon");
        let (flow, _) = run(
            json!({"anonymous_consumer": "ghost"}),
            TestRequest::get("/"),
        );
        assert_eq!(
            message(&flow),
            "{\"message\":\"Invalid user authorization\"}\n"
        );
    }

    #[test]
    fn schemas() {
        let c = Compiler::new();
        assert_eq!(
            c.registry.check_consumer(NAME, &json!({"username": "u"})),
            Err("failed to check the configuration of plugin basic-auth err: property \"password\" is required".into())
        );
        assert!(c
            .registry
            .check(NAME, &json!({"hide_credentials": true}))
            .is_ok());
    }
}
