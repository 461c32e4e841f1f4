//! redirect (`apisix/plugins/redirect.lua`): answers with a redirect (`ret_code`, 302 by
//! default) to `uri` (with `$var` / `${var}`; `\$var` stays literal) or to the first match of
//! `regex_uri` on `$uri` (no redirect when it does not match). `http_to_https` sends plain-HTTP
//! requests (by `X-Forwarded-Proto`, else the connection) to `https://$host[:port]$request_uri`
//! with 301 for GET and HEAD, 308 otherwise; the port is `plugin_attr.redirect.https_port`,
//! else one of the gateway's TLS ports (none for 443). `encode_uri` escapes the path of the
//! target; `append_query_string` adds the client's query string.

use std::borrow::Cow;
use std::sync::Arc;

use ferrisix_plugin_api::{CheckCtx, CompileCtx, Exit, Phases, Plugin, PluginCtx, PluginDef, Step};
use ferrisix_router::VarSource;
use http::{header, HeaderValue, Method, StatusCode};
use rand::Rng;
use serde_json::{json, Value};

use crate::support::pcre::Substitution;
use crate::support::uri::uri_safe_encode;

pub const NAME: &str = "redirect";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    ..PluginDef::new(NAME, 900, schema, compile)
};

const URI_PATTERN: &str =
    r"(\\\$[0-9a-zA-Z_]+)|\$\{([0-9a-zA-Z_]+)\}|\$([0-9a-zA-Z_]+)|(\$|[^$\\]+)";

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "ret_code": {"type": "integer", "minimum": 200, "default": 302},
            "uri": {"type": "string", "minLength": 2, "pattern": URI_PATTERN},
            "regex_uri": {
                "description": "params for generating new uri that substitute from client uri, first param is regular expression, the second one is uri template",
                "type": "array",
                "maxItems": 2,
                "minItems": 2,
                "items": {"description": "regex uri", "type": "string"}
            },
            "http_to_https": {"type": "boolean"},
            "encode_uri": {"type": "boolean", "default": false},
            "append_query_string": {"type": "boolean", "default": false}
        },
        "oneOf": [
            {"required": ["uri"]},
            {"required": ["regex_uri"]},
            {"required": ["http_to_https"]}
        ]
    })
}

fn substitution(conf: &Value) -> Option<Result<Substitution, String>> {
    let pair = conf.get("regex_uri")?.as_array()?;
    let (p, r) = (pair.first()?.as_str()?, pair.get(1)?.as_str()?);
    Some(Substitution::new(p, r).map_err(|e| format!("invalid regex_uri ({p}, {r}), err:{e}")))
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    if let Some(s) = substitution(cx.conf) {
        s?;
    }
    let on = |k: &str| cx.conf.get(k).and_then(Value::as_bool) == Some(true);
    if on("http_to_https") && on("append_query_string") {
        return Err(
            "only one of `http_to_https` and `append_query_string` can be configured.".into(),
        );
    }
    Ok(())
}

/// One piece of a redirect target (redirect's own `reg`, not `resolve_var`).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Text(String),
    Var(String),
}

fn parse_target(uri: &str) -> Vec<Piece> {
    let word = |s: &str| {
        s.bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
            .count()
    };
    let mut out: Vec<Piece> = Vec::new();
    let mut text = String::new();
    let mut rest = uri;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("\\$") {
            let n = word(after);
            if n > 0 {
                // `\$host` stays as written, backslash included.
                text.push_str(&rest[..2 + n]);
                rest = &after[n..];
                continue;
            }
        }
        if let Some(after) = rest.strip_prefix("${") {
            let n = word(after);
            if n > 0 && after[n..].starts_with('}') {
                if !text.is_empty() {
                    out.push(Piece::Text(std::mem::take(&mut text)));
                }
                out.push(Piece::Var(after[..n].to_owned()));
                rest = &after[n + 1..];
                continue;
            }
        }
        if let Some(after) = rest.strip_prefix('$') {
            let n = word(after);
            if n > 0 {
                if !text.is_empty() {
                    out.push(Piece::Text(std::mem::take(&mut text)));
                }
                out.push(Piece::Var(after[..n].to_owned()));
                rest = &after[n..];
                continue;
            }
        }
        let ch = rest.chars().next().unwrap_or('$');
        text.push(ch);
        rest = &rest[ch.len_utf8()..];
    }
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    out
}

fn resolve(pieces: &[Piece], vars: &dyn VarSource) -> String {
    let mut out = String::new();
    for p in pieces {
        match p {
            Piece::Text(t) => out.push_str(t),
            Piece::Var(v) => {
                if let Some(val) = vars.var(v) {
                    out.push_str(&val);
                }
            }
        }
    }
    out
}

#[derive(Debug)]
enum Target {
    Uri(Vec<Piece>),
    Regex(Substitution),
    None,
}

#[derive(Debug)]
struct Redirect {
    ret_code: StatusCode,
    target: Target,
    http_to_https: bool,
    /// `plugin_attr.redirect.https_port`, else the TLS listeners' ports.
    https_ports: Vec<i64>,
    encode_uri: bool,
    append_query_string: bool,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let code = conf["ret_code"].as_u64().unwrap_or(302);
    let ret_code = u16::try_from(code)
        .ok()
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or_else(|| format!("invalid ret_code {code}"))?;
    let target = if let Some(uri) = conf.get("uri").and_then(Value::as_str) {
        Target::Uri(parse_target(uri))
    } else if let Some(s) = substitution(&conf) {
        Target::Regex(s?)
    } else {
        Target::None
    };
    let attr_port = cx
        .services
        .plugin_attr()
        .others
        .get(NAME)
        .and_then(|a| a.get("https_port"))
        .and_then(Value::as_i64);
    let https_ports = match attr_port {
        Some(p) => vec![p],
        None => cx
            .services
            .tls_ports()
            .iter()
            .map(|p| i64::from(*p))
            .collect(),
    };
    Ok(Arc::new(Redirect {
        ret_code,
        target,
        http_to_https: conf["http_to_https"].as_bool().unwrap_or(false),
        https_ports,
        encode_uri: conf["encode_uri"].as_bool().unwrap_or(false),
        append_query_string: conf["append_query_string"].as_bool().unwrap_or(false),
    }))
}

impl Redirect {
    fn https_target(&self, ctx: &PluginCtx<'_>) -> String {
        let port = match self.https_ports.len() {
            0 => None,
            1 => Some(self.https_ports[0]),
            n => Some(self.https_ports[rand::thread_rng().gen_range(0..n)]),
        };
        let host = ctx.var("host").unwrap_or(Cow::Borrowed(""));
        match port {
            Some(p) if p != 443 && (1..=65535).contains(&p) => {
                format!("https://{host}:{p}{}", ctx.request_uri())
            }
            _ => format!("https://{host}{}", ctx.request_uri()),
        }
    }
}

impl Plugin for Redirect {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let mut code = self.ret_code;
        let scheme = ctx
            .header("x-forwarded-proto")
            .unwrap_or(ctx.head().conn.scheme());
        let mut new_uri = if self.http_to_https && scheme != "https" {
            code = if matches!(*ctx.method(), Method::GET | Method::HEAD) {
                StatusCode::MOVED_PERMANENTLY
            } else {
                StatusCode::PERMANENT_REDIRECT
            };
            self.https_target(ctx)
        } else {
            match &self.target {
                Target::Uri(pieces) => resolve(pieces, ctx),
                Target::Regex(sub) => match sub.sub_first(ctx.uri()) {
                    Some(u) => u,
                    None => return Step::CONTINUE,
                },
                Target::None => return Step::CONTINUE,
            }
        };
        let index = new_uri.find('?');
        if self.encode_uri {
            new_uri = match index {
                Some(i) => format!("{}{}", uri_safe_encode(&new_uri[..i]), &new_uri[i..]),
                None => uri_safe_encode(&new_uri),
            };
        }
        if self.append_query_string {
            if let Some(args) = ctx.query() {
                new_uri.push(if index.is_some() { '&' } else { '?' });
                new_uri.push_str(args);
            }
        }
        match HeaderValue::from_str(&new_uri) {
            Ok(location) => Step::exit(Exit::status(code).with_header(header::LOCATION, location)),
            Err(_) => {
                tracing::error!(uri = %new_uri, "redirect: the target is no valid Location");
                Step::exit(Exit::status(StatusCode::INTERNAL_SERVER_ERROR))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::{Flow, PluginServices};

    use super::*;
    use crate::testing::Compiler;

    fn redirect_with(c: &Compiler, conf: Value, mut req: TestRequest) -> Option<(u16, String)> {
        let p = (DEF.compile)(&c.cx(NAME, &conf, "redir", None)).unwrap();
        let out = match p.rewrite(&mut req.ctx()) {
            Step::Done(Flow::Exit(e)) => {
                let loc = e
                    .headers
                    .iter()
                    .find(|(n, _)| n == header::LOCATION)
                    .map(|(_, v)| v.to_str().unwrap().to_owned())
                    .unwrap_or_default();
                Some((e.status.as_u16(), loc))
            }
            _ => None,
        };
        out
    }

    fn redirect(conf: Value, req: TestRequest) -> Option<(u16, String)> {
        redirect_with(&Compiler::new(), conf, req)
    }

    fn host(uri: &str, host: &str) -> TestRequest {
        let mut r = TestRequest::get(uri);
        r.host = Some(host.into());
        r
    }

    #[test]
    fn uri_templates() {
        assert_eq!(
            redirect(
                json!({"uri": "/test/add/${uri}/$arg_a?x=\\$uri", "ret_code": 301}),
                TestRequest::get("/p?a=1")
            ),
            Some((301, "/test/add//p/1?x=\\$uri".into()))
        );
        assert_eq!(
            redirect(json!({"uri": "/t$nope$"}), TestRequest::get("/")),
            Some((302, "/t$".into()))
        );
        assert_eq!(
            redirect(
                json!({"uri": "/a b", "encode_uri": true}),
                TestRequest::get("/")
            ),
            Some((302, "/a%20b".into()))
        );
        assert_eq!(
            redirect(
                json!({"uri": "/n?k=v", "append_query_string": true}),
                TestRequest::get("/o?a=1")
            ),
            Some((302, "/n?k=v&a=1".into()))
        );
        assert_eq!(
            redirect(
                json!({"uri": "/n", "append_query_string": true}),
                TestRequest::get("/o?a=1")
            ),
            Some((302, "/n?a=1".into()))
        );
    }

    #[test]
    fn regex_uri() {
        let conf = json!({"regex_uri": ["^/c/(.*)/(.*)", "/t/$1_$2"]});
        assert_eq!(
            redirect(conf.clone(), TestRequest::get("/c/a/b")),
            Some((302, "/t/a_b".into()))
        );
        assert_eq!(redirect(conf, TestRequest::get("/x")), None);
    }

    #[test]
    fn http_to_https_ports() {
        let conf = json!({"http_to_https": true});
        assert_eq!(
            redirect(conf.clone(), host("/h?x=1", "foo.com")),
            Some((301, "https://foo.com/h?x=1".into()))
        );
        let mut post = TestRequest::new(Method::POST, "/h");
        post.host = Some("foo.com".into());
        assert_eq!(
            redirect(conf.clone(), post),
            Some((308, "https://foo.com/h".into()))
        );
        assert_eq!(
            redirect(
                conf.clone(),
                host("/h", "foo.com").header("x-forwarded-proto", "https")
            ),
            None
        );
        let tls = Compiler::with(Arc::new(
            PluginServices::default().with_tls_ports(vec![9443]),
        ));
        assert_eq!(
            redirect_with(&tls, conf.clone(), host("/h", "foo.com")),
            Some((301, "https://foo.com:9443/h".into()))
        );
        let std = Compiler::with(Arc::new(
            PluginServices::default().with_tls_ports(vec![443]),
        ));
        assert_eq!(
            redirect_with(&std, conf, host("/h", "foo.com")),
            Some((301, "https://foo.com/h".into()))
        );
    }

    #[test]
    fn validation() {
        let r = crate::PluginRegistry::builtin();
        assert_eq!(
            r.check(NAME, &json!({"http_to_https": true, "append_query_string": true})),
            Err("failed to check the configuration of plugin redirect err: only one of `http_to_https` and `append_query_string` can be configured.".into())
        );
        assert!(r
            .check(NAME, &json!({"uri": "/a", "regex_uri": ["a", "b"]}))
            .is_err());
        assert!(r
            .check(NAME, &json!({"regex_uri": ["(", "b"]}))
            .unwrap_err()
            .contains("invalid regex_uri ((, b), err:"));
        assert!(r.check(NAME, &json!({"uri": "/"})).is_err(), "minLength 2");
        assert!(r
            .check(NAME, &json!({"uri": "/a", "ret_code": 100}))
            .is_err());
    }
}
