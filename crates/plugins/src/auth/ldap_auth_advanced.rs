//! ldap-auth-advanced (`apisix/plugins/ldap-auth-advanced.lua`): search-then-bind LDAP
//! authentication. The credentials (`Proxy-Authorization` when it parses, else
//! `Authorization`: `<header_type> base64(username:password)`, `header_type` `ldap` or
//! `basic`) are checked on one connection to `ldap_uri` (`host[:port]`, port 636 with
//! `use_ldaps`, else 389; `use_starttls` upgrades a plain connection; `ssl_verify`): a bind
//! as `bind_dn`/`ldap_password` (anonymous without), a subtree search under `base_dn` for
//! `(<attribute>=<username>)` bounded by `size_limit` and `time_limit`, then a bind as the
//! one entry found with the user's password. With `consumer_required` (the default) the
//! entry's DN must be a consumer's `user_dn`, which becomes the request's consumer.
//!
//! Failures: 401 `{"message":"Authorization required"}` with `WWW-Authenticate: <ldap|Basic>
//! realm="<realm>"` (no usable credentials, no entry or several, a wrong password, no
//! consumer); 500 when the directory cannot be reached or refuses the search bind. The
//! identity headers a client sent (`X-Authenticated-Groups`, `X-Consumer-Username`,
//! `X-Credential-Identifier`, `X-Consumer-Custom-ID`) are removed first.
//!
//! Connections are not pooled (`keepalive*` are accepted and have no effect): each
//! authentication opens one and closes it.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef, PluginServices, Step,
};
use http::{HeaderValue, StatusCode};
use serde_json::{json, Value};

use crate::support::auth::{challenge, realm_schema, unauthorized};
use crate::support::ldap::{
    parse_addr, Connection, LdapError, Target, INVALID_CREDENTIALS, SIZE_LIMIT_EXCEEDED,
};

pub const NAME: &str = "ldap-auth-advanced";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    encrypt_fields: &["ldap_password"],
    ..PluginDef::new(NAME, 2541, schema, compile).with_credentials(
        consumer_schema,
        &[],
        "user_dn",
        None,
    )
};

/// RFC 4512 attribute descriptions: a name or a numeric OID, with `;option`s.
const ATTR_PATTERN: &str =
    "^(?:[A-Za-z][A-Za-z0-9-]*|(?:0|[1-9][0-9]*)(?:\\.(?:0|[1-9][0-9]*))+)(?:;[A-Za-z0-9-]+)*$";

fn schema() -> Value {
    let int =
        |min: u64, default: u64| json!({"type": "integer", "minimum": min, "default": default});
    json!({
        "type": "object",
        "title": "work with route or service object",
        "properties": {
            "ldap_uri": {"type": "string", "minLength": 1, "maxLength": 256},
            "use_ldaps": {"type": "boolean", "default": false},
            "use_starttls": {"type": "boolean", "default": false},
            "ssl_verify": {"type": "boolean", "default": true},
            "timeout": {"type": "integer", "minimum": 1, "maximum": 60000, "default": 10000},
            "keepalive": {"type": "boolean", "default": true},
            "keepalive_timeout": int(1000, 60000),
            "keepalive_pool_size": int(1, 5),
            "keepalive_pool_name": {"type": "string", "minLength": 1, "maxLength": 256},
            "base_dn": {"type": "string", "minLength": 1, "maxLength": 4096},
            "attribute": {"type": "string", "maxLength": 256, "default": "cn", "pattern": ATTR_PATTERN},
            "bind_dn": {"type": "string", "minLength": 1, "maxLength": 4096},
            "ldap_password": {"type": "string", "minLength": 1, "maxLength": 4096},
            "size_limit": int(2, 2),
            "time_limit": int(0, 5),
            "consumer_required": {"type": "boolean", "default": true},
            "header_type": {"type": "string", "enum": ["ldap", "basic"], "default": "ldap"},
            "realm": realm_schema("ldap")
        },
        "required": ["ldap_uri", "base_dn"]
    })
}

fn consumer_schema() -> Value {
    json!({
        "type": "object",
        "title": "work with consumer object",
        "properties": {"user_dn": {"type": "string", "minLength": 1, "maxLength": 4096}},
        "required": ["user_dn"]
    })
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    if cx.consumer {
        return Ok(());
    }
    let on = |k: &str| cx.conf.get(k).and_then(Value::as_bool) == Some(true);
    if on("use_ldaps") && on("use_starttls") {
        return Err("use_ldaps and use_starttls are mutually exclusive".into());
    }
    if cx.conf.get("bind_dn").is_some() && cx.conf.get("ldap_password").is_none() {
        return Err("ldap_password is required when bind_dn is set".into());
    }
    Ok(())
}

struct LdapAuthAdvanced {
    host: String,
    port: u16,
    ldaps: bool,
    starttls: bool,
    ssl_verify: bool,
    timeout: Duration,
    base_dn: String,
    attribute: String,
    bind: Option<(String, String)>,
    size_limit: i64,
    time_limit: i64,
    consumer_required: bool,
    header_type: &'static str,
    challenge: Option<HeaderValue>,
    services: Arc<PluginServices>,
}

impl std::fmt::Debug for LdapAuthAdvanced {
    /// The service account's password is not printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LdapAuthAdvanced")
            .field("host", &self.host)
            .field("base_dn", &self.base_dn)
            .finish_non_exhaustive()
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let s = |k: &str| conf.get(k).and_then(Value::as_str).map(str::to_owned);
    let b = |k: &str| conf.get(k).and_then(Value::as_bool).unwrap_or(false);
    let ldaps = b("use_ldaps");
    let (host, port) = parse_addr(&s("ldap_uri").unwrap_or_default());
    let basic = s("header_type").as_deref() == Some("basic");
    Ok(Arc::new(LdapAuthAdvanced {
        host,
        port: port.unwrap_or(if ldaps { 636 } else { 389 }),
        ldaps,
        starttls: b("use_starttls"),
        ssl_verify: conf["ssl_verify"].as_bool().unwrap_or(true),
        timeout: Duration::from_millis(conf["timeout"].as_u64().unwrap_or(10_000)),
        base_dn: s("base_dn").unwrap_or_default(),
        attribute: s("attribute").unwrap_or_else(|| "cn".into()),
        bind: s("bind_dn").map(|dn| (dn, s("ldap_password").unwrap_or_default())),
        size_limit: conf["size_limit"].as_i64().unwrap_or(2),
        time_limit: conf["time_limit"].as_i64().unwrap_or(5),
        consumer_required: conf["consumer_required"].as_bool().unwrap_or(true),
        header_type: if basic { "basic" } else { "ldap" },
        challenge: challenge(
            if basic { "Basic" } else { "ldap" },
            &s("realm").unwrap_or_else(|| "ldap".into()),
        ),
        services: cx.services.clone(),
    }))
}

/// One header's credentials: `<scheme> base64(user:password)`, split at the first `:`.
fn parse_credentials(scheme: &str, header: &str) -> Result<(String, String), &'static str> {
    let (word, rest) = header
        .split_once(char::is_whitespace)
        .ok_or("invalid authorization header format")?;
    if !word.eq_ignore_ascii_case(scheme) || rest.trim().is_empty() {
        return Err("invalid authorization header format");
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .map_err(|_| "failed to base64-decode authorization header")?;
    let text = String::from_utf8_lossy(&decoded).into_owned();
    let (user, password) = text
        .split_once(':')
        .ok_or("invalid credential: missing ':' separator")?;
    if password.is_empty() {
        return Err("empty password rejected before bind");
    }
    if user.is_empty() {
        return Err("empty username");
    }
    Ok((user.to_owned(), password.to_owned()))
}

impl LdapAuthAdvanced {
    fn failed(&self, reason: &str) -> Flow {
        tracing::warn!("{NAME}: {reason}");
        Flow::Exit(unauthorized(
            "Authorization required",
            self.challenge.as_ref(),
        ))
    }

    fn credentials(&self, ctx: &PluginCtx<'_>) -> Result<(String, String), &'static str> {
        let mut proxy_err = None;
        if let Some(h) = ctx.header("proxy-authorization") {
            match parse_credentials(self.header_type, h) {
                Ok(c) => return Ok(c),
                Err(e) => proxy_err = Some(e),
            }
        }
        match ctx.header("authorization") {
            Some(h) => parse_credentials(self.header_type, h),
            None => Err(proxy_err.unwrap_or("missing authorization header")),
        }
    }

    /// The DN of the user, bound with their password; `Err` is the answer.
    async fn resolve(&self, user: &str, password: &str) -> Result<String, Flow> {
        let target = Target {
            host: &self.host,
            port: self.port,
            ldaps: self.ldaps,
            starttls: self.starttls,
            verify: self.ssl_verify,
            timeout: self.timeout,
        };
        let outage = |what: &str, e: LdapError| {
            tracing::error!("{NAME}: {what}: {e}");
            Flow::Exit(Exit::status(StatusCode::INTERNAL_SERVER_ERROR))
        };
        let mut conn = Connection::open(&target, self.services.tls())
            .await
            .map_err(|e| outage("LDAP connect failed", e))?;
        let (dn, pw) = match &self.bind {
            Some((dn, pw)) => (dn.as_str(), pw.as_str()),
            None => ("", ""),
        };
        if let Err(e) = conn.bind(dn, pw).await {
            return Err(outage("LDAP search bind failed", e));
        }
        let found = conn
            .search(
                &self.base_dn,
                &self.attribute,
                user,
                self.size_limit,
                self.time_limit,
            )
            .await;
        let dns = match found {
            Ok(d) => d,
            Err(LdapError::Result {
                code: SIZE_LIMIT_EXCEEDED,
                ..
            }) => {
                return Err(self.failed(
                    "ambiguous user match (size limit exceeded); check attribute uniqueness",
                ))
            }
            Err(e) => return Err(outage("LDAP user search failed", e)),
        };
        let user_dn = match &dns[..] {
            [] => return Err(self.failed("user not found")),
            [one] => one.clone(),
            _ => {
                return Err(
                    self.failed("ambiguous user match (>1 entry); check attribute uniqueness")
                )
            }
        };
        match conn.bind(&user_dn, password).await {
            Ok(()) => {}
            Err(LdapError::Result {
                code: INVALID_CREDENTIALS,
                ..
            }) => return Err(self.failed("user authentication failed")),
            Err(e) => return Err(outage("LDAP authentication bind failed", e)),
        }
        conn.unbind().await;
        Ok(user_dn)
    }

    async fn authenticate(&self, ctx: &mut PluginCtx<'_>, user: String, password: String) -> Flow {
        let user_dn = match self.resolve(&user, &password).await {
            Ok(dn) => dn,
            Err(flow) => return flow,
        };
        if !self.consumer_required {
            return Flow::Continue;
        }
        let cred = ctx
            .consumers()
            .and_then(|c| c.find(NAME, &user_dn))
            .cloned();
        match cred {
            Some(cred) => {
                ctx.attach_consumer(cred.consumer.clone());
                Flow::Continue
            }
            None => self.failed("no Consumer maps to the authenticated user_dn"),
        }
    }
}

impl Plugin for LdapAuthAdvanced {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        for h in [
            "x-authenticated-groups",
            "x-consumer-username",
            "x-credential-identifier",
            "x-consumer-custom-id",
        ] {
            ctx.headers_mut().remove(h);
        }
        match self.credentials(ctx) {
            Ok((user, password)) => Step::Wait(Box::pin(self.authenticate(ctx, user, password))),
            Err(reason) => Step::Done(self.failed(reason)),
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;

    use super::*;
    use crate::testing::Compiler;

    #[test]
    fn credentials() {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let h = format!("ldap {}", b64("alice:pa:ss"));
        assert_eq!(
            parse_credentials("ldap", &h),
            Ok(("alice".into(), "pa:ss".into()))
        );
        assert_eq!(
            parse_credentials("ldap", &format!("LDAP {}", b64("useronly"))),
            Err("invalid credential: missing ':' separator")
        );
        assert_eq!(
            parse_credentials("ldap", &format!("ldap {}", b64("a:"))),
            Err("empty password rejected before bind")
        );
        assert!(parse_credentials("basic", &h).is_err());
    }

    #[test]
    fn refusals_and_schema() {
        let c = Compiler::new();
        let conf = json!({"ldap_uri": "127.0.0.1:1", "base_dn": "ou=u,dc=t"});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "ldap", None)).unwrap();
        let mut req = TestRequest::get("/").header("authorization", "ldap dXNlcm9ubHk=");
        let Step::Done(Flow::Exit(e)) = p.rewrite(&mut req.ctx()) else {
            panic!("refused at once")
        };
        assert_eq!(e.status, 401);
        assert_eq!(
            e.body.as_deref(),
            Some(&b"{\"message\":\"Authorization required\"}\n"[..])
        );
        assert!(e
            .headers
            .iter()
            .any(|(n, v)| n == "www-authenticate" && v == "ldap realm=\"ldap\""));
        let err = |conf: Value| c.registry.check(NAME, &conf).unwrap_err();
        let prefix = "failed to check the configuration of plugin ldap-auth-advanced err: ";
        assert_eq!(
            err(json!({"ldap_uri": "h", "base_dn": "b", "use_ldaps": true, "use_starttls": true})),
            format!("{prefix}use_ldaps and use_starttls are mutually exclusive")
        );
        assert_eq!(
            err(json!({"ldap_uri": "h", "base_dn": "b", "bind_dn": "cn=a"})),
            format!("{prefix}ldap_password is required when bind_dn is set")
        );
        assert_eq!(
            err(json!({"base_dn": "b"})),
            format!("{prefix}property \"ldap_uri\" is required")
        );
        assert!(
            err(json!({"ldap_uri": "h", "base_dn": "b", "attribute": "(cn=*)"}))
                .contains("attribute")
        );
    }
}
