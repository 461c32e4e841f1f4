//! The key a limit plugin counts by: APISIX's `key` with `key_type` `var` (one variable,
//! `remote_addr` by default), `var_combination` (a template of variables) or `constant`.

use std::borrow::Cow;
use std::net::IpAddr;

use ferrisix_router::VarSource;

use crate::ctx::PluginCtx;
use crate::keyed::KeyRef;
use crate::template::Template;

/// How the per-request key is found, parsed at compile time.
#[derive(Clone, Debug)]
pub enum KeySpec {
    /// `key_type: var` with `remote_addr` (the default): no formatting at all.
    RemoteAddr,
    Var(String),
    Combination(Template),
    Constant(String),
}

/// A key value: borrowed when possible.
#[derive(Debug)]
pub enum KeyValue<'a> {
    Ip(IpAddr),
    Text(Cow<'a, str>),
}

impl KeyValue<'_> {
    pub fn as_ref(&self) -> KeyRef<'_> {
        match self {
            KeyValue::Ip(ip) => KeyRef::Ip(*ip),
            KeyValue::Text(t) => KeyRef::Text(t),
        }
    }

    /// The text APISIX puts in a key (`remote_addr` as written).
    pub fn into_text(self) -> String {
        match self {
            KeyValue::Ip(ip) => ip.to_string(),
            KeyValue::Text(t) => t.into_owned(),
        }
    }
}

impl KeySpec {
    pub fn new(key_type: &str, key: &str) -> KeySpec {
        match key_type {
            "constant" => KeySpec::Constant(key.to_owned()),
            "var_combination" => KeySpec::Combination(Template::parse(key)),
            _ if key == "remote_addr" => KeySpec::RemoteAddr,
            _ => KeySpec::Var(key.to_owned()),
        }
    }

    /// This request's key. A missing variable (or a combination that resolves none) falls
    /// back to the client address, as APISIX does.
    pub fn resolve<'a>(&'a self, ctx: &'a PluginCtx<'_>) -> KeyValue<'a> {
        let found = match self {
            KeySpec::RemoteAddr => None,
            KeySpec::Constant(k) => Some(KeyValue::Text(Cow::Borrowed(k.as_str()))),
            KeySpec::Var(name) => ctx.var(name).map(KeyValue::Text),
            KeySpec::Combination(t) => {
                let r = t.resolve(ctx);
                (r.resolved > 0).then_some(KeyValue::Text(Cow::Owned(r.text)))
            }
        };
        found.unwrap_or(KeyValue::Ip(ctx.remote_addr()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestRequest;

    #[test]
    fn key_types() {
        let mut req = TestRequest::get("/").header("x-user", "alice");
        let ctx = req.ctx();
        let text = |k: KeyValue<'_>| k.into_text();
        assert_eq!(
            text(KeySpec::new("var", "remote_addr").resolve(&ctx)),
            "127.0.0.1"
        );
        assert_eq!(
            text(KeySpec::new("var", "http_x_user").resolve(&ctx)),
            "alice"
        );
        assert_eq!(
            text(KeySpec::new("var", "http_x_none").resolve(&ctx)),
            "127.0.0.1"
        );
        assert_eq!(text(KeySpec::new("constant", "k").resolve(&ctx)), "k");
        assert_eq!(
            text(KeySpec::new("var_combination", "$http_x_user-$nope").resolve(&ctx)),
            "alice-"
        );
        assert_eq!(
            text(KeySpec::new("var_combination", "$nope").resolve(&ctx)),
            "127.0.0.1"
        );
    }
}
