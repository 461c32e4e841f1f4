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

/// The user an SSO plugin authenticated without a consumer (APISIX's `ctx.external_user`:
/// the provider's userinfo), kept in the request's values for acl.
#[derive(Clone, Debug)]
pub struct ExternalUser(pub Value);

/// One step of a [`JsonPath`].
#[derive(Clone, Debug, PartialEq)]
enum PathStep {
    Key(String),
    Index(usize),
    /// `*` or `[*]`: every member or item.
    All,
}

/// A JSON path of the subset APISIX's label fields use: `$` (optional), then `.name`,
/// `['name']`, `[n]`, `.*` and `[*]` steps; a path without `$` starts with a name
/// (`groups`, `org.teams`).
#[derive(Clone, Debug, PartialEq)]
pub struct JsonPath(Vec<PathStep>);

impl JsonPath {
    pub fn parse(text: &str) -> Result<JsonPath, String> {
        let bad = || format!("unsupported JSON path {text:?}");
        let mut steps = Vec::new();
        let mut rest = text.strip_prefix('$').unwrap_or(text);
        if rest.len() == text.len() {
            // No `$`: the first step is a bare name.
            let end = rest.find(['.', '[']).unwrap_or(rest.len());
            if end == 0 {
                return Err(bad());
            }
            steps.push(PathStep::Key(rest[..end].to_owned()));
            rest = &rest[end..];
        }
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix('.') {
                let end = r.find(['.', '[']).unwrap_or(r.len());
                let name = &r[..end];
                if name.is_empty() {
                    return Err(bad());
                }
                steps.push(if name == "*" {
                    PathStep::All
                } else {
                    PathStep::Key(name.to_owned())
                });
                rest = &r[end..];
            } else if let Some(r) = rest.strip_prefix('[') {
                let end = r.find(']').ok_or_else(bad)?;
                let inner = r[..end].trim();
                steps.push(if inner == "*" {
                    PathStep::All
                } else if let Ok(i) = inner.parse::<usize>() {
                    PathStep::Index(i)
                } else if inner.len() >= 2
                    && ((inner.starts_with('\'') && inner.ends_with('\''))
                        || (inner.starts_with('"') && inner.ends_with('"')))
                {
                    PathStep::Key(inner[1..inner.len() - 1].to_owned())
                } else {
                    return Err(bad());
                });
                rest = &r[end + 1..];
            } else {
                return Err(bad());
            }
        }
        Ok(JsonPath(steps))
    }

    /// The values the path reaches in `doc`.
    pub fn query<'a>(&self, doc: &'a Value) -> Vec<&'a Value> {
        let mut now = vec![doc];
        for step in &self.0 {
            let mut next = Vec::new();
            for v in now {
                match (step, v) {
                    (PathStep::Key(k), Value::Object(m)) => next.extend(m.get(k)),
                    (PathStep::Index(i), Value::Array(a)) => next.extend(a.get(*i)),
                    (PathStep::All, Value::Object(m)) => next.extend(m.values()),
                    (PathStep::All, Value::Array(a)) => next.extend(a.iter()),
                    _ => {}
                }
            }
            now = next;
        }
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_paths() {
        let doc = json!({"groups": ["a", "b"], "org": {"teams": [{"n": "x"}, {"n": "y"}]}});
        let q = |p: &str| {
            JsonPath::parse(p)
                .unwrap()
                .query(&doc)
                .into_iter()
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(q("groups"), vec![json!(["a", "b"])]);
        assert_eq!(q("$.groups[1]"), vec![json!("b")]);
        assert_eq!(q("$.org.teams[*].n"), vec![json!("x"), json!("y")]);
        assert_eq!(q("$['org']['teams'][0].n"), vec![json!("x")]);
        assert!(q("$.nothing").is_empty());
        assert!(JsonPath::parse("$[[").is_err());
        assert!(JsonPath::parse("$.").is_err());
    }

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
