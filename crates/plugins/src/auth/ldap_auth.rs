//! ldap-auth (`apisix/plugins/ldap-auth.lua`): HTTP Basic credentials checked by an LDAP
//! simple bind as `<uid>=<username>,<base_dn>` (the username escaped as RFC 4514 says) at
//! `ldap_uri` (`host[:port]`, port 389), over LDAPS with `use_tls` (certificate checked with
//! `tls_verify`). The bound DN names the consumer whose ldap-auth credential has it as
//! `user_dn`. Answers, each 401 with `WWW-Authenticate: Basic realm="<realm>"`: "Missing
//! authorization in request", "Invalid authorization in request" (not Basic, not base64, no
//! `:`), "Invalid user authorization" (the bind failed, or no consumer has that DN), "Missing
//! related consumer" (no consumer has an ldap-auth credential). `hide_credentials` takes the
//! `Authorization` header out before the request goes upstream.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use ferrisix_plugin_api::{
    CompileCtx, Flow, Phases, Plugin, PluginCtx, PluginDef, PluginServices, Step,
};
use http::HeaderValue;
use serde_json::{json, Value};

use crate::support::auth::{challenge, realm_schema, unauthorized};
use crate::support::ldap::{escape_dn_value, parse_addr, Connection, Target};

pub const NAME: &str = "ldap-auth";

pub static DEF: PluginDef = PluginDef::new(NAME, 2540, schema, compile).with_credentials(
    consumer_schema,
    &[],
    "user_dn",
    None,
);

fn schema() -> Value {
    json!({
        "type": "object",
        "title": "work with route or service object",
        "properties": {
            "base_dn": {"type": "string"},
            "ldap_uri": {"type": "string"},
            "use_tls": {"type": "boolean", "default": false},
            "tls_verify": {"type": "boolean", "default": false},
            "uid": {"type": "string", "default": "cn"},
            "hide_credentials": {"type": "boolean", "default": false},
            "realm": realm_schema("ldap")
        },
        "required": ["base_dn", "ldap_uri"]
    })
}

fn consumer_schema() -> Value {
    json!({
        "type": "object",
        "title": "work with consumer object",
        "properties": {"user_dn": {"type": "string"}},
        "required": ["user_dn"]
    })
}

struct LdapAuth {
    base_dn: String,
    host: String,
    port: u16,
    use_tls: bool,
    tls_verify: bool,
    uid: String,
    hide_credentials: bool,
    challenge: Option<HeaderValue>,
    services: Arc<PluginServices>,
}

impl std::fmt::Debug for LdapAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LdapAuth")
            .field("host", &self.host)
            .field("base_dn", &self.base_dn)
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
    let (host, port) = parse_addr(&s("ldap_uri"));
    Ok(Arc::new(LdapAuth {
        base_dn: s("base_dn"),
        host,
        port: port.unwrap_or(389),
        use_tls: conf["use_tls"].as_bool().unwrap_or(false),
        tls_verify: conf["tls_verify"].as_bool().unwrap_or(false),
        uid: s("uid"),
        hide_credentials: conf["hide_credentials"].as_bool().unwrap_or(false),
        challenge: challenge("Basic", &s("realm")),
        services: cx.services.clone(),
    }))
}

/// `extract_auth_header`: the Basic credentials, spaces removed from both halves.
fn basic_credentials(header: &str) -> Option<(String, String)> {
    let (scheme, rest) = header.split_once(char::is_whitespace)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let rest = rest.trim_start();
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(rest.trim_end())
        .ok()?;
    let text = String::from_utf8_lossy(&decoded).into_owned();
    let mut parts = text.split(':');
    let user = parts.next()?;
    let pass = parts.next()?;
    let strip = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
    Some((strip(user), strip(pass)))
}

impl LdapAuth {
    fn refuse(&self, msg: &str) -> Flow {
        Flow::Exit(unauthorized(msg, self.challenge.as_ref()))
    }

    async fn bind(&self, dn: &str, password: &str) -> Result<(), String> {
        let target = Target {
            host: &self.host,
            port: self.port,
            ldaps: self.use_tls,
            starttls: false,
            verify: self.tls_verify,
            timeout: Duration::from_secs(10),
        };
        let mut conn = Connection::open(&target, self.services.tls())
            .await
            .map_err(|e| e.to_string())?;
        let r = conn.bind(dn, password).await.map_err(|e| e.to_string());
        conn.unbind().await;
        r
    }

    async fn authenticate(&self, ctx: &mut PluginCtx<'_>, user: String, password: String) -> Flow {
        let dn = format!("{}={},{}", self.uid, escape_dn_value(&user), self.base_dn);
        // An empty password would be an unauthenticated bind (RFC 4513), which directories
        // accept: it proves nothing.
        let bound = if password.is_empty() {
            Err("empty password".to_owned())
        } else {
            self.bind(&dn, &password).await
        };
        if let Err(e) = bound {
            tracing::warn!("ldap-auth failed: {e}");
            return self.refuse("Invalid user authorization");
        }
        let Some(index) = ctx.consumers() else {
            return self.refuse("Missing related consumer");
        };
        if !index.has_plugin(NAME) {
            return self.refuse("Missing related consumer");
        }
        let Some(cred) = index.find(NAME, &dn).cloned() else {
            return self.refuse("Invalid user authorization");
        };
        ctx.attach_consumer(cred.consumer.clone());
        if self.hide_credentials {
            ctx.headers_mut().remove(http::header::AUTHORIZATION);
        }
        Flow::Continue
    }
}

impl Plugin for LdapAuth {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let Some(header) = ctx.header("authorization").map(str::to_owned) else {
            return Step::Done(self.refuse("Missing authorization in request"));
        };
        let Some((user, password)) = basic_credentials(&header) else {
            tracing::warn!("ldap-auth: invalid authorization header");
            return Step::Done(self.refuse("Invalid authorization in request"));
        };
        Step::Wait(Box::pin(self.authenticate(ctx, user, password)))
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;

    use super::*;
    use crate::testing::Compiler;

    #[test]
    fn credentials_and_addresses() {
        assert_eq!(
            basic_credentials("Basic Zm9vOmJhcg=="),
            Some(("foo".into(), "bar".into()))
        );
        assert_eq!(
            basic_credentials("basic Zm9vOiBiYXIg"),
            Some(("foo".into(), "bar".into()))
        );
        assert_eq!(basic_credentials("Basic Zm9v"), None, "no colon");
        assert_eq!(basic_credentials("Bad_header Zm9vOmZvbwo="), None);
    }

    #[test]
    fn refusals_before_any_directory_call() {
        let c = Compiler::new();
        let conf = json!({"ldap_uri": "127.0.0.1:1", "base_dn": "ou=u,dc=t"});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "ldap", None)).unwrap();
        for (header, msg) in [
            (None, "Missing authorization in request"),
            (
                Some("Bad_header Zm9vOmZvbwo="),
                "Invalid authorization in request",
            ),
            (Some("Basic Zm9v"), "Invalid authorization in request"),
        ] {
            let mut req = TestRequest::get("/");
            if let Some(h) = header {
                req = req.header("authorization", h);
            }
            let Step::Done(Flow::Exit(e)) = p.rewrite(&mut req.ctx()) else {
                panic!("refused at once")
            };
            assert_eq!(e.status, 401);
            assert_eq!(
                e.body.as_deref(),
                Some(format!("{{\"message\":\"{msg}\"}}\n").as_bytes())
            );
            assert!(e
                .headers
                .iter()
                .any(|(n, v)| n == "www-authenticate" && v == "Basic realm=\"ldap\""));
        }
    }

    #[test]
    fn schemas() {
        let c = Compiler::new();
        assert_eq!(
            c.registry.check(NAME, &json!({"ldap_uri": "h"})).unwrap_err(),
            "failed to check the configuration of plugin ldap-auth err: property \"base_dn\" is required"
        );
        assert_eq!(
            c.registry.check_consumer(NAME, &json!({})).unwrap_err(),
            "failed to check the configuration of plugin ldap-auth err: property \"user_dn\" is required"
        );
    }
}
