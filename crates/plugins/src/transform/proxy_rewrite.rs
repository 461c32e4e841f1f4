//! proxy-rewrite (`apisix/plugins/proxy-rewrite.lua`): rewrites the request sent upstream:
//! its URI (`uri` with `$var`s, or the first matching `regex_uri` pair), method, `Host` and
//! headers (`add`/`set`/`remove`, values with `$var`s and `regex_uri`'s captures `$1`..).
//!
//! As APISIX, the new path is escaped (`ngx_escape_uri`, plus the few bytes a request line
//! cannot carry: `<`, `>`, `` ` ``, and in the query space, `"`, `#`) and becomes `$uri` for
//! later plugins;
//! the client's query string follows it upstream (after the rewritten one's, with `&`).
//! `use_real_request_uri_unsafe` starts from the raw request URI instead and escapes nothing.
//! Even a conf that changes only headers sends the normalised, escaped `$uri` upstream, as
//! APISIX does.

use std::borrow::Cow;
use std::sync::Arc;

use ferrisix_plugin_api::{CheckCtx, CompileCtx, Phases, Plugin, PluginCtx, PluginDef, Step};
use ferrisix_router::VarSource;
use http::{HeaderName, HeaderValue, Method};
use serde_json::{json, Map, Value};

use crate::support::headers::{self, ValueTemplate};
use crate::support::pcre::Substitution;
use crate::support::uri::{upstream_path, upstream_query};
use ferrisix_plugin_api::Template;

pub const NAME: &str = "proxy-rewrite";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    ..PluginDef::new(NAME, 1008, schema, compile)
};

/// The methods nginx can send (`ngx.HTTP_*`).
const METHODS: [&str; 14] = [
    "GET", "POST", "PUT", "HEAD", "DELETE", "OPTIONS", "MKCOL", "COPY", "MOVE", "PROPFIND", "LOCK",
    "UNLOCK", "PATCH", "TRACE",
];

fn header_values() -> Value {
    json!({"oneOf": [
        {"type": "string"},
        {"type": "number"},
        {"type": "array", "minItems": 1, "items": {"oneOf": [{"type": "string"}, {"type": "number"}]}}
    ]})
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "uri": {
                "description": "new uri for upstream",
                "type": "string",
                "minLength": 1,
                "maxLength": 4096,
                "pattern": "^\\/.*"
            },
            "method": {
                "description": "proxy route method",
                "type": "string",
                "enum": METHODS
            },
            "regex_uri": {
                "description": "new uri that substitute from client uri for upstream, lower priority than uri property",
                "type": "array",
                "minItems": 2,
                "items": {"description": "regex uri", "type": "string"}
            },
            "host": {
                "description": "new host for upstream",
                "type": "string",
                "pattern": "^[0-9a-zA-Z-.]+(:\\d{1,5})?$"
            },
            "headers": {
                "description": "new headers for request",
                "oneOf": [
                    {
                        "type": "object",
                        "minProperties": 1,
                        "additionalProperties": false,
                        "properties": {
                            "add": {
                                "type": "object",
                                "minProperties": 1,
                                "patternProperties": {"^[^:]+$": header_values()}
                            },
                            "set": {
                                "type": "object",
                                "minProperties": 1,
                                "patternProperties": {"^[^:]+$": header_values()}
                            },
                            "remove": {
                                "type": "array",
                                "minItems": 1,
                                "items": {"type": "string", "pattern": "^[^:]+$"}
                            }
                        }
                    },
                    {
                        "type": "object",
                        "minProperties": 1,
                        "patternProperties": {
                            "^[^:]+$": {"oneOf": [{"type": "string"}, {"type": "number"}]}
                        }
                    }
                ]
            },
            "use_real_request_uri_unsafe": {
                "description": "use real_request_uri instead, THIS IS VERY UNSAFE.",
                "type": "boolean",
                "default": false
            }
        },
        "minProperties": 1
    })
}

/// `headers` in the 3.1 form (`add`/`set`/`remove`) rather than the old flat one (all set).
fn is_new_headers_conf(h: &Map<String, Value>) -> bool {
    ["add", "set", "remove"]
        .iter()
        .any(|k| matches!(h.get(*k), Some(Value::Object(_) | Value::Array(_))))
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    if let Some(pairs) = cx.conf.get("regex_uri").and_then(Value::as_array) {
        if pairs.len() % 2 != 0 {
            return Err("The length of regex_uri should be an even number".into());
        }
        for pair in pairs.chunks(2) {
            let (p, r) = (
                pair[0].as_str().unwrap_or(""),
                pair[1].as_str().unwrap_or(""),
            );
            Substitution::new(p, r).map_err(|e| format!("invalid regex_uri({p}, {r}): {e}"))?;
        }
    }
    if let Some(h) = cx.conf.get("headers").and_then(Value::as_object) {
        if !is_new_headers_conf(h) {
            for (field, value) in h {
                let Some(text) = headers::value_text(value) else {
                    return Err("invalid type as header value".into());
                };
                if field.is_empty() {
                    return Err("invalid field length in header".into());
                }
                if !headers::valid_field(field) {
                    return Err("invalid field character in header".into());
                }
                if !headers::valid_value(&text) {
                    return Err("invalid value character in header".into());
                }
            }
        }
    }
    Ok(())
}

/// One header and its values, in the conf's order.
#[derive(Debug)]
struct HeaderOp {
    name: HeaderName,
    values: Vec<ValueTemplate>,
    /// The conf gave an array (a set of several values).
    array: bool,
}

#[derive(Debug, Default)]
struct HeaderOps {
    add: Vec<HeaderOp>,
    set: Vec<HeaderOp>,
    remove: Vec<HeaderName>,
}

fn header_ops(conf: &Map<String, Value>) -> HeaderOps {
    let ops_of = |m: Option<&Value>| -> Vec<HeaderOp> {
        let mut out = Vec::new();
        for (field, v) in m.and_then(Value::as_object).into_iter().flatten() {
            let Some(name) = headers::name(field, NAME) else {
                continue;
            };
            let (values, array) = match v {
                Value::Array(items) => {
                    (items.iter().filter_map(headers::value_text).collect(), true)
                }
                other => (headers::value_text(other).into_iter().collect(), false),
            };
            let values: Vec<String> = values;
            out.push(HeaderOp {
                name,
                values: values.iter().map(|s| ValueTemplate::new(s)).collect(),
                array,
            });
        }
        out
    };
    if is_new_headers_conf(conf) {
        HeaderOps {
            add: ops_of(conf.get("add")),
            set: ops_of(conf.get("set")),
            remove: conf
                .get("remove")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .filter_map(|f| headers::name(f, NAME))
                .collect(),
        }
    } else {
        let flat = Value::Object(conf.clone());
        HeaderOps {
            set: ops_of(Some(&flat)),
            ..Default::default()
        }
    }
}

#[derive(Debug)]
struct ProxyRewrite {
    uri: Option<Template>,
    regex_uri: Vec<Substitution>,
    method: Option<Method>,
    host: Option<HeaderValue>,
    headers: Option<HeaderOps>,
    unsafe_uri: bool,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let regex_uri = match conf.get("regex_uri").and_then(Value::as_array) {
        Some(items) => items
            .chunks(2)
            .filter(|p| p.len() == 2)
            .map(|p| Substitution::new(p[0].as_str().unwrap_or(""), p[1].as_str().unwrap_or("")))
            .collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    let method = match conf.get("method").and_then(Value::as_str) {
        Some(m) => Some(Method::from_bytes(m.as_bytes()).map_err(|e| e.to_string())?),
        None => None,
    };
    let host = match conf.get("host").and_then(Value::as_str) {
        Some(h) => Some(HeaderValue::from_str(h).map_err(|e| e.to_string())?),
        None => None,
    };
    Ok(Arc::new(ProxyRewrite {
        uri: conf.get("uri").and_then(Value::as_str).map(Template::parse),
        regex_uri,
        method,
        host,
        headers: conf
            .get("headers")
            .and_then(Value::as_object)
            .map(header_ops),
        unsafe_uri: conf
            .get("use_real_request_uri_unsafe")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    }))
}

/// The variables of `uri`: each value with its `?` escaped (`escape_separator`), so a value
/// cannot start a query.
struct EscapedVars<'a, 'r>(&'a PluginCtx<'r>);

impl VarSource for EscapedVars<'_, '_> {
    fn var(&self, name: &str) -> Option<Cow<'_, str>> {
        let v = self.0.var(name)?;
        Some(if v.contains('?') {
            Cow::Owned(v.replace('?', "%3F"))
        } else {
            v
        })
    }
}

/// The variables of header values: `$1`.. are `regex_uri`'s captures (empty without them),
/// anything else a request variable (`resolve_var_with_captures`, then `resolve_var`).
struct CaptureVars<'a, 'r> {
    ctx: &'a PluginCtx<'r>,
    captures: Option<&'a [Option<String>]>,
}

impl VarSource for CaptureVars<'_, '_> {
    fn var(&self, name: &str) -> Option<Cow<'_, str>> {
        let digits = name.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return self.ctx.var(name);
        }
        let n: usize = name[..digits].parse().unwrap_or(usize::MAX);
        let cap = self
            .captures
            .and_then(|c| c.get(n))
            .and_then(Option::as_deref)
            .unwrap_or("");
        Some(Cow::Owned(format!("{cap}{}", &name[digits..])))
    }
}

/// `regex_uri`'s captures, for header values.
struct Captures(Vec<Option<String>>);

impl ProxyRewrite {
    /// The new `$upstream_uri` as APISIX builds it: (path, query) to send.
    fn rewrite_uri(&self, ctx: &mut PluginCtx<'_>) -> (String, Option<Option<String>>) {
        let mut upstream_uri: String;
        let mut query_string = "";
        let real;
        if self.unsafe_uri {
            real = ctx.request_uri().to_owned();
            query_string = real.find('?').map_or("", |i| &real[i..]);
            upstream_uri = real.clone();
        } else {
            upstream_uri = ctx.uri().to_owned();
        }
        let mut separator_escaped = false;
        if let Some(t) = &self.uri {
            separator_escaped = true;
            upstream_uri = t.resolve(&EscapedVars(ctx)).text;
            if !query_string.is_empty() {
                if upstream_uri.contains('?') {
                    upstream_uri.push('&');
                    upstream_uri.push_str(&query_string[1..]);
                } else {
                    upstream_uri.push_str(query_string);
                }
            }
        } else if !self.regex_uri.is_empty() {
            separator_escaped = !upstream_uri.contains('?');
            for sub in &self.regex_uri {
                if let Some(caps) = sub.regex.captures(&upstream_uri) {
                    let captured: Vec<Option<String>> = caps
                        .iter()
                        .map(|m| m.map(|m| m.as_str().to_owned()))
                        .collect();
                    let new = sub.sub_first(&upstream_uri);
                    ctx.insert(Captures(captured));
                    if let Some(new) = new {
                        upstream_uri = new;
                    }
                    break;
                }
            }
        }
        if self.unsafe_uri {
            return match upstream_uri.split_once('?') {
                Some((p, q)) => (p.to_owned(), Some(Some(q.to_owned()))),
                None => (upstream_uri, Some(None)),
            };
        }
        let index = if separator_escaped {
            upstream_uri.find('?')
        } else {
            None
        };
        match index {
            Some(i) => {
                let path = upstream_path(&upstream_uri[..i]);
                let mut query = upstream_query(&upstream_uri[i + 1..]);
                // The client's arguments follow the rewritten ones.
                if let Some(args) = ctx.query() {
                    query.push('&');
                    query.push_str(args);
                }
                (path, Some(Some(query)))
            }
            // The client's query string, if any, goes up as it came.
            None => (upstream_path(&upstream_uri), None),
        }
    }

    fn edit_headers(&self, ops: &HeaderOps, ctx: &mut PluginCtx<'_>) {
        let captures = ctx.get::<Captures>().map(|c| c.0.clone());
        let mut added: Vec<(HeaderName, HeaderValue)> = Vec::new();
        let mut set: Vec<(&HeaderName, Vec<HeaderValue>)> = Vec::new();
        {
            let vars = CaptureVars {
                ctx,
                captures: captures.as_deref(),
            };
            for op in &ops.add {
                for v in &op.values {
                    let text = v.resolve(&vars);
                    if text.is_empty() {
                        continue;
                    }
                    if let Some(hv) = headers::header_value(&text, NAME, &op.name) {
                        added.push((op.name.clone(), hv));
                    }
                }
            }
            for op in &ops.set {
                let values: Vec<HeaderValue> = op
                    .values
                    .iter()
                    .map(|v| v.resolve(&vars))
                    // nginx's set_header with an empty value removes the header.
                    .filter(|t| !t.is_empty())
                    .filter_map(|t| headers::header_value(&t, NAME, &op.name))
                    .collect();
                if op.array && values.is_empty() {
                    continue;
                }
                set.push((&op.name, values));
            }
        }
        let h = ctx.headers_mut();
        for (name, value) in added {
            h.append(name, value);
        }
        for (name, values) in set {
            h.remove(name);
            for v in values {
                h.append(name.clone(), v);
            }
        }
        for name in &ops.remove {
            h.remove(name);
        }
    }
}

impl Plugin for ProxyRewrite {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        if let Some(host) = &self.host {
            ctx.set_upstream_host(host.clone());
        }
        let (path, query) = self.rewrite_uri(ctx);
        if !self.unsafe_uri {
            ctx.set_uri(path.clone());
        }
        ctx.set_upstream_path(path);
        if let Some(q) = query {
            ctx.set_upstream_query(q);
        }
        if let Some(ops) = &self.headers {
            self.edit_headers(ops, ctx);
        }
        if let Some(m) = &self.method {
            ctx.set_upstream_method(m.clone());
        }
        Step::CONTINUE
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;

    use super::*;
    use crate::testing::Compiler;

    fn run(conf: Value, mut req: TestRequest) -> TestRequest {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "pr", None)).unwrap();
        assert!(matches!(p.rewrite(&mut req.ctx()), Step::Done(_)));
        req
    }

    fn upstream(req: &mut TestRequest) -> String {
        req.ctx().upstream_uri().into_owned()
    }

    fn err(conf: Value) -> String {
        crate::PluginRegistry::builtin()
            .check(NAME, &conf)
            .expect_err(&conf.to_string())
            .trim_start_matches("failed to check the configuration of plugin proxy-rewrite err: ")
            .to_owned()
    }

    #[test]
    fn validation() {
        assert_eq!(
            err(json!({"uri": "hello"})),
            "property \"uri\" validation failed: failed to match pattern \"^\\\\/.*\" with \"hello\""
        );
        assert_eq!(
            err(json!({"uri": "/x", "method": "GET1"})),
            "property \"method\" validation failed: matches none of the enum values"
        );
        assert_eq!(
            err(json!({"regex_uri": ["^/a", "/b", "^/c"]})),
            "The length of regex_uri should be an even number"
        );
        assert!(
            err(json!({"regex_uri": ["^/(a", "/b"]})).starts_with("invalid regex_uri(^/(a, /b): ")
        );
        assert!(err(json!({"regex_uri": ["(?<=a)b", "/b"]})).contains("not supported"));
        assert_eq!(
            err(json!({"headers": {"X A": "1"}})),
            "invalid field character in header"
        );
        assert_eq!(
            err(json!({"headers": {"X-A": "a\u{1}"}})),
            "invalid value character in header"
        );
        assert!(err(json!({"host": "a b"})).contains("host"));
        let r = crate::PluginRegistry::builtin();
        assert!(r
            .check(
                NAME,
                &json!({"headers": {"add": {"X-A": ["1", 2]}, "remove": ["X-B"]}})
            )
            .is_ok());
        assert_eq!(r.get(NAME).unwrap().priority, 1008);
    }

    #[test]
    fn uri_host_method_and_query() {
        let mut req = run(
            json!({"uri": "/new", "host": "h.example", "method": "POST"}),
            TestRequest::get("/old?q=1&a=2"),
        );
        assert_eq!(upstream(&mut req), "/new?q=1&a=2");
        let e = req.state.upstream_edits();
        assert_eq!(e.host.as_ref().unwrap(), "h.example");
        assert_eq!(e.method, Some(Method::POST));
        assert_eq!(req.ctx().uri(), "/new");
        // A rewritten query goes first, the client's after it.
        let mut req = run(
            json!({"uri": "/new?x=$arg_q"}),
            TestRequest::get("/old?q=1"),
        );
        assert_eq!(upstream(&mut req), "/new?x=1&q=1");
        // A variable's `?` cannot start a query; spaces are escaped.
        let mut req = run(
            json!({"uri": "/a$http_x"}),
            TestRequest::get("/o").header("x", "?b c"),
        );
        assert_eq!(upstream(&mut req), "/a%253Fb%20c");
        let mut req = run(json!({"uri": "/up$uri"}), TestRequest::get("/p"));
        assert_eq!(upstream(&mut req), "/up/p");
    }

    #[test]
    fn regex_uri_and_captures_in_headers() {
        let conf = json!({"regex_uri": ["^/x/(.*)/(.*)", "/y/$1_$2", "^/z", "/zz"],
            "headers": {"add": {"X-Parts": "$1/$2"}}});
        let mut req = run(conf.clone(), TestRequest::get("/x/a/b?k=v"));
        assert_eq!(upstream(&mut req), "/y/a_b?k=v");
        assert_eq!(req.headers["x-parts"], "a/b");
        let mut req = run(conf.clone(), TestRequest::get("/z/1"));
        assert_eq!(upstream(&mut req), "/zz/1");
        let mut req = run(conf, TestRequest::get("/none"));
        assert_eq!(upstream(&mut req), "/none");
        assert_eq!(req.headers["x-parts"], "/");
    }

    #[test]
    fn headers_add_set_remove() {
        let conf = json!({"headers": {
            "add": {"X-Add": "123", "X-Both": "in-add", "X-Multi": ["a", 1]},
            "set": {"X-Set": "2233", "X-Both": "in-set", "X-Empty": "$http_nope"},
            "remove": ["X-Remove"]}});
        let req = run(
            conf,
            TestRequest::get("/h")
                .header("x-add", "sssss")
                .header("x-set", "old")
                .header("x-remove", "w")
                .header("x-empty", "gone"),
        );
        let all = |n: &str| -> Vec<&str> {
            req.headers
                .get_all(n)
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect()
        };
        assert_eq!(all("x-add"), ["sssss", "123"]);
        assert_eq!(all("x-set"), ["2233"]);
        assert_eq!(all("x-both"), ["in-set"]);
        assert_eq!(all("x-multi"), ["a", "1"]);
        assert!(all("x-remove").is_empty() && all("x-empty").is_empty());
        // The old flat form sets; a variable without a value removes the header.
        let req = run(
            json!({"headers": {"X-Addr": "$remote_addr", "X-Name": "$arg_name", "X-N": 5}}),
            TestRequest::get("/h").header("x-name", "client"),
        );
        assert_eq!(req.headers["x-addr"], "127.0.0.1");
        assert_eq!(req.headers["x-n"], "5");
        assert!(!req.headers.contains_key("x-name"));
    }

    #[test]
    fn real_request_uri_unsafe() {
        let mut req = run(
            json!({"use_real_request_uri_unsafe": true}),
            TestRequest::get("/a%2Fb/../c?x=%20"),
        );
        assert_eq!(upstream(&mut req), "/a%2Fb/../c?x=%20");
        let mut req = run(
            json!({"use_real_request_uri_unsafe": true, "uri": "/n?y=1"}),
            TestRequest::get("/o?x=1"),
        );
        assert_eq!(upstream(&mut req), "/n?y=1&x=1");
        // Without it, the normalised $uri goes up escaped.
        let mut client = TestRequest::get("/a%20b/../c?x");
        client.path = "/a b/c".into();
        let mut req = run(json!({"headers": {"X-A": "1"}}), client);
        assert_eq!(upstream(&mut req), "/a%20b/c?x");
    }
}
