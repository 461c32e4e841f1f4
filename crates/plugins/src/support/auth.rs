//! What the authentication plugins share: APISIX's `realm` and `anonymous_consumer` schemas,
//! the 401 answer with its `WWW-Authenticate` challenge, the anonymous consumer fallback,
//! secret comparison in constant time, and taking a credential out of the query.

use std::sync::Arc;

use ferrisix_plugin_api::{Consumer, Exit, PluginCtx};
use http::{HeaderName, HeaderValue, StatusCode};
use serde_json::{json, Value};
use subtle::ConstantTimeEq;

/// `schema_def.get_realm_schema(default)`: printable ASCII without `"` and `\`.
pub fn realm_schema(default: &str) -> Value {
    json!({
        "type": "string",
        "pattern": "^[\\x20-\\x21\\x23-\\x5B\\]-\\x7E]+$",
        "default": default,
        "minLength": 1,
        "maxLength": 128
    })
}

/// `schema_def.anonymous_consumer_schema`.
pub fn anonymous_consumer_schema() -> Value {
    json!({"type": "string", "minLength": 1})
}

/// `{"message":"<msg>"}\n` with `status`, as `return status, {message = msg}` answers.
pub fn message_exit(status: StatusCode, msg: &str) -> Exit {
    let body = ferrisix_config::schema::lua::cjson_encode(&json!({ "message": msg }));
    // nginx's default type, as APISIX's exit with a table body sets none.
    Exit::body(status, format!("{body}\n"))
}

/// The `WWW-Authenticate` challenge `<scheme> realm="<realm>"` (the realm's schema keeps it a
/// valid header value; one that is not leaves the challenge out).
pub fn challenge(scheme: &str, realm: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!("{scheme} realm=\"{realm}\"")).ok()
}

/// A 401 with `{"message": msg}` and the challenge, if any.
pub fn unauthorized(msg: &str, challenge: Option<&HeaderValue>) -> Exit {
    let exit = message_exit(StatusCode::UNAUTHORIZED, msg);
    match challenge {
        Some(c) => exit.with_header(HeaderName::from_static("www-authenticate"), c.clone()),
        None => exit,
    }
}

/// `consumer.get_anonymous_consumer(name)`: the consumer named by `anonymous_consumer`.
pub fn anonymous(ctx: &PluginCtx<'_>, name: &str) -> Option<Arc<Consumer>> {
    ctx.consumers()?.consumer(name).cloned()
}

/// After a failed authentication (`msg`): a 401 with `challenge`, unless `anonymous_consumer`
/// names the consumer to go on as, attached then; one that does not exist is logged as
/// `plugin`'s failure and answered 401 "Invalid user authorization" (key-auth, basic-auth and
/// jwt-auth alike).
pub fn anonymous_or_401(
    ctx: &mut PluginCtx<'_>,
    plugin: &str,
    anonymous_consumer: Option<&str>,
    msg: &str,
    challenge: Option<&HeaderValue>,
) -> Result<(), Exit> {
    let Some(name) = anonymous_consumer else {
        return Err(unauthorized(msg, challenge));
    };
    let Some(consumer) = anonymous(ctx, name) else {
        tracing::error!(
            "{plugin} failed to authenticate the request, code: 401. error: failed to get anonymous consumer {name}"
        );
        return Err(unauthorized("Invalid user authorization", challenge));
    };
    ctx.attach_consumer(consumer);
    Ok(())
}

/// Whether two secrets are equal, in time that depends on their lengths only.
pub fn secret_eq(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
}

/// `query` without the arguments named `name` (the others keep their text and order);
/// `None` when nothing is left.
pub fn query_without(query: &str, name: &str) -> Option<String> {
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let k = pair.split_once('=').map_or(*pair, |(k, _)| k);
            k != name && !pair.is_empty()
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

/// Takes argument `name` out of the query sent upstream.
pub fn hide_query_arg(ctx: &mut PluginCtx<'_>, name: &str) {
    let current = ctx.upstream_uri();
    let query = current.split_once('?').map(|(_, q)| q.to_owned());
    if let Some(q) = query {
        let rest = query_without(&q, name);
        ctx.set_upstream_query(rest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_without_keeps_the_rest() {
        assert_eq!(query_without("k=1&keep=1", "k").as_deref(), Some("keep=1"));
        assert_eq!(query_without("k=1", "k"), None);
        assert_eq!(
            query_without("a=1&k&b=2&k=3", "k").as_deref(),
            Some("a=1&b=2")
        );
    }

    #[test]
    fn answers() {
        let e = unauthorized(
            "Missing API key in request",
            challenge("apikey", "key").as_ref(),
        );
        assert_eq!(e.status, 401);
        assert_eq!(
            e.body.as_deref(),
            Some(&b"{\"message\":\"Missing API key in request\"}\n"[..])
        );
        assert!(e
            .headers
            .iter()
            .any(|(n, v)| n == "www-authenticate" && v == "apikey realm=\"key\""));
        assert!(secret_eq(b"abc", b"abc") && !secret_eq(b"abc", b"abd") && !secret_eq(b"a", b"ab"));
    }
}
