//! data-mask (`apisix/plugins/data-mask.lua`): masks fields of the request in what the
//! loggers record (http-logger and every other logger's entry), while the upstream still
//! receives the request unchanged. Each item of `request` names a field by `type`:
//! - `query`: an argument of the query string (the logged `request_uri`, `uri`, `url` and
//!   `querystring`);
//! - `header`: a request header (the logged `headers`, and `$http_<name>`);
//! - `body`: a field of the body, `body_format` `json` (`name` a JSONPath; bodies larger than
//!   `max_body_size` are left as they are) or `urlencoded` (a form field, at most
//!   `max_req_post_args` fields are read);
//!
//! and an `action`: `remove` it, `replace` it with `value`, or `regex`: replace the first
//! match of `regex` with `value` (`$1` names a capture, as `ngx.re.sub`). Masking runs before
//! any plugin's log phase, as APISIX's runs in the log phase at a priority above the loggers'.

use std::sync::Arc;

use bytes::Bytes;
use ferrisix_config::schema::{cjson, lua};
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, LogCtx, LogNeeds, Phases, Plugin, PluginDef, VarNames,
};
use http::{HeaderName, HeaderValue};
use serde_json::{json, Value};

use crate::support::args::{self, encode_args};
use crate::support::jsonpath::{self, JsonPath};
use crate::support::pcre::Substitution;

pub const NAME: &str = "data-mask";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    ..PluginDef::new(NAME, 1500, schema, compile)
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "request": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "type": {"type": "string", "enum": ["query", "header", "body"]},
                        "body_format": {"type": "string", "enum": ["json", "urlencoded"]},
                        "name": {"type": "string"},
                        "action": {"type": "string", "enum": ["regex", "replace", "remove"]},
                        "regex": {"type": "string"},
                        "value": {"type": "string"}
                    },
                    "required": ["type", "name", "action"],
                    "allOf": [
                        {"if": {"properties": {"type": {"const": "body"}}},
                         "then": {"required": ["body_format"]}},
                        {"if": {"properties": {"action": {"const": "regex"}}},
                         "then": {"required": ["regex", "value"]}},
                        {"if": {"properties": {"action": {"const": "replace"}}},
                         "then": {"required": ["value"]}}
                    ]
                }
            },
            "max_body_size": {"type": "integer", "exclusiveMinimum": 0, "default": 1048576},
            "max_req_post_args": {"type": "integer", "default": 100, "minimum": 0}
        }
    })
}

fn items(conf: &Value) -> impl Iterator<Item = &Value> {
    conf.get("request")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// Regexes and JSONPaths are compiled when the conf is written, not met in the log phase.
fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    for item in items(cx.conf) {
        Item::compile(item)?;
    }
    Ok(())
}

#[derive(Debug)]
enum Action {
    Remove,
    Replace(String),
    Regex(Substitution),
}

#[derive(Debug)]
enum Target {
    Query(String),
    Header(HeaderName),
    JsonBody(JsonPath),
    FormBody(String),
}

#[derive(Debug)]
struct Item {
    target: Target,
    action: Action,
}

impl Item {
    fn compile(item: &Value) -> Result<Item, String> {
        let field = |k: &str| item.get(k).and_then(Value::as_str).unwrap_or("");
        let name = field("name");
        let action = match field("action") {
            "remove" => Action::Remove,
            "replace" => Action::Replace(field("value").to_owned()),
            _ => Action::Regex(
                Substitution::new(field("regex"), field("value"))
                    .map_err(|e| format!("invalid regex {:?}: {e}", field("regex")))?,
            ),
        };
        let target = match (field("type"), field("body_format")) {
            ("query", _) => Target::Query(name.to_owned()),
            ("header", _) => Target::Header(
                HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
                    .map_err(|_| format!("invalid header name: {name}"))?,
            ),
            (_, "json") => Target::JsonBody(JsonPath::parse(name)?),
            _ => Target::FormBody(name.to_owned()),
        };
        Ok(Item { target, action })
    }

    /// `ngx.re.sub`'s result when the regex matched.
    fn masked(&self, text: &str) -> Option<String> {
        match &self.action {
            Action::Remove => None,
            Action::Replace(v) => Some(v.clone()),
            Action::Regex(s) => s.sub_first(text),
        }
    }
}

struct DataMask {
    items: Vec<Item>,
    max_body: usize,
    max_post_args: usize,
    needs: LogNeeds,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let items = items(&conf)
        .map(Item::compile)
        .collect::<Result<Vec<_>, _>>()?;
    let max_body = conf["max_body_size"]
        .as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(1 << 20);
    let mut needs = LogNeeds::default();
    let mut vars: Vec<Box<str>> = vec!["request_uri".into(), "uri".into()];
    for item in &items {
        match &item.target {
            Target::Header(h) => {
                needs.request_headers = true;
                vars.push(format!("http_{}", h.as_str().replace('-', "_")).into());
            }
            Target::JsonBody(_) | Target::FormBody(_) => needs.request_body = Some(max_body),
            Target::Query(_) => {}
        }
    }
    needs.vars = Some(VarNames::from(vars));
    Ok(Arc::new(DataMask {
        items,
        max_body,
        max_post_args: conf["max_req_post_args"]
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(100),
        needs,
    }))
}

/// Query or form fields in their order: name, and value (`None`: no `=`).
type Args = Vec<(String, Option<String>)>;

fn parse_args(text: &str, max: usize) -> Args {
    text.split('&')
        .filter(|p| !p.is_empty())
        .take(if max == 0 { usize::MAX } else { max })
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) => (unescape(k), Some(unescape(v))),
            None => (unescape(pair), None),
        })
        .collect()
}

fn unescape(s: &str) -> String {
    args::unescape(s.as_bytes())
}

/// `mask_table`: the field's values masked; whether any was.
fn mask_args(args: &mut Args, name: &str, item: &Item) -> bool {
    if !args.iter().any(|(k, _)| k == name) {
        return false;
    }
    match &item.action {
        Action::Remove => {
            args.retain(|(k, _)| k != name);
            true
        }
        Action::Replace(v) => {
            // The field becomes one value, where the first one was.
            let first = args.iter().position(|(k, _)| k == name).unwrap_or(0);
            let mut i = 0;
            args.retain(|(k, _)| {
                i += 1;
                k != name || i - 1 == first
            });
            if let Some(slot) = args.iter_mut().find(|(k, _)| k == name) {
                slot.1 = Some(v.clone());
            }
            true
        }
        Action::Regex(_) => {
            let mut masked = false;
            for (k, v) in args.iter_mut().filter(|(k, _)| k == name) {
                let Some(text) = v.as_deref() else {
                    tracing::warn!("data-mask: skipping regex for non-string value in field: {k}");
                    continue;
                };
                if let Some(new) = item.masked(text) {
                    *v = Some(new);
                    masked = true;
                }
            }
            masked
        }
    }
}

fn mask_json(doc: &mut Value, path: &JsonPath, item: &Item) -> bool {
    let mut masked = false;
    // Last first, so removing a list item leaves the earlier paths valid.
    for p in path.locate(doc).iter().rev() {
        match &item.action {
            Action::Remove => {
                jsonpath::remove(doc, p);
                masked = true;
            }
            Action::Replace(v) => {
                if let Some(slot) = jsonpath::get_mut(doc, p) {
                    *slot = Value::String(v.clone());
                    masked = true;
                }
            }
            Action::Regex(_) => match jsonpath::get_mut(doc, p) {
                Some(Value::String(s)) => {
                    if let Some(new) = item.masked(s) {
                        *s = new;
                        masked = true;
                    }
                }
                _ => tracing::warn!("data-mask: skipping regex for non-string value at path"),
            },
        }
    }
    masked
}

impl DataMask {
    fn mask_query(&self, ctx: &mut LogCtx) {
        let Some(request_uri) = ctx.vars.get("request_uri").map(str::to_owned) else {
            return;
        };
        let (path, query) = request_uri
            .split_once('?')
            .map_or((request_uri.as_str(), ""), |(p, q)| (p, q));
        let mut args = parse_args(query, 0);
        let mut masked = false;
        for item in &self.items {
            if let Target::Query(name) = &item.target {
                masked |= mask_args(&mut args, name, item);
            }
        }
        if !masked {
            return;
        }
        let path = ctx.vars.get("uri").unwrap_or(path).to_owned();
        let uri = if args.is_empty() {
            path
        } else {
            format!("{path}?{}", encode_args(&args))
        };
        ctx.vars.set("request_uri", || Some(uri));
    }

    fn mask_headers(&self, ctx: &mut LogCtx) {
        for item in &self.items {
            let Target::Header(name) = &item.target else {
                continue;
            };
            let Some(headers) = ctx.request_headers.as_mut() else {
                return;
            };
            let Some(current) = headers.get(name).and_then(|v| v.to_str().ok()) else {
                continue;
            };
            let new = match &item.action {
                Action::Remove => None,
                _ => match item.masked(current) {
                    Some(v) => Some(v),
                    None => continue,
                },
            };
            headers.remove(name);
            if let Some(v) = new.as_deref().and_then(|v| HeaderValue::from_str(v).ok()) {
                headers.insert(name.clone(), v);
            }
            let var = format!("http_{}", name.as_str().replace('-', "_"));
            ctx.vars.set(&var, || Some(new.unwrap_or_default()));
        }
    }

    fn mask_body(&self, ctx: &mut LogCtx) {
        let Some(body) = ctx.request_body.clone() else {
            return;
        };
        let mut form: Option<Args> = None;
        let mut form_masked = false;
        let mut json: Option<Value> = None;
        let mut json_masked = false;
        for item in &self.items {
            match &item.target {
                Target::FormBody(name) => {
                    let args = form.get_or_insert_with(|| {
                        parse_args(&String::from_utf8_lossy(&body), self.max_post_args)
                    });
                    form_masked |= mask_args(args, name, item);
                }
                Target::JsonBody(path) => {
                    if body.len() > self.max_body {
                        tracing::warn!(
                            "data-mask: skipping body masking because body size ({}) exceeds \
                             max_body_size ({})",
                            body.len(),
                            self.max_body
                        );
                        continue;
                    }
                    if json.is_none() {
                        match cjson::decode(&body) {
                            Ok(v) => json = Some(v),
                            Err(e) => {
                                tracing::warn!("failed to decode json body: {e}");
                                continue;
                            }
                        }
                    }
                    if let Some(doc) = json.as_mut() {
                        json_masked |= mask_json(doc, path, item);
                    }
                }
                _ => {}
            }
        }
        if form_masked {
            if let Some(args) = &form {
                ctx.request_body = Some(Bytes::from(encode_args(args)));
            }
        }
        if json_masked {
            if let Some(doc) = &json {
                ctx.request_body = Some(Bytes::from(lua::cjson_encode(doc)));
            }
        }
    }
}

impl Plugin for DataMask {
    fn phases(&self) -> Phases {
        // LOG too: the log phase (and what it reads) exists even when no logger asked for it.
        Phases::LOG_MASK | Phases::LOG
    }

    fn log_needs(&self) -> LogNeeds {
        self.needs.clone()
    }

    fn mask_log(&self, ctx: &mut LogCtx) {
        self.mask_query(ctx);
        self.mask_headers(ctx);
        self.mask_body(ctx);
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_plugin_api::LogVars;
    use http::HeaderMap;

    use super::*;
    use crate::testing::Compiler;
    use ferrisix_config::validate::PluginCheck;

    fn plugin(conf: Value) -> Arc<dyn Plugin> {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "dm", None)).unwrap();
        p
    }

    struct Vars(Vec<(&'static str, &'static str)>);

    impl ferrisix_router::VarSource for Vars {
        fn var(&self, name: &str) -> Option<std::borrow::Cow<'_, str>> {
            self.0
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| std::borrow::Cow::Borrowed(*v))
        }
    }

    #[test]
    fn query_and_headers() {
        let p = plugin(json!({"request": [
            {"type": "query", "name": "password", "action": "remove"},
            {"type": "query", "name": "token", "action": "replace", "value": "*****"},
            {"type": "header", "name": "X-Pass", "action": "remove"},
            {"type": "header", "name": "x-card", "action": "regex",
             "regex": "(\\d+)\\-\\d+\\-\\d+\\-(\\d+)", "value": "$1-****-****-$2"},
        ]}));
        let names = p.log_needs().vars.unwrap();
        let src = Vars(vec![
            ("request_uri", "/a?password=abc&token=xyz"),
            ("uri", "/a"),
        ]);
        let mut headers = HeaderMap::new();
        headers.insert("x-pass", HeaderValue::from_static("p"));
        headers.insert("x-card", HeaderValue::from_static("1234-5678-9012-3456"));
        let mut ctx = LogCtx {
            vars: LogVars::capture(names, &src),
            request_headers: Some(headers),
            ..LogCtx::default()
        };
        p.mask_log(&mut ctx);
        assert_eq!(ctx.vars.get("request_uri"), Some("/a?token=*****"));
        let h = ctx.request_headers.unwrap();
        assert!(h.get("x-pass").is_none());
        assert_eq!(h["x-card"], "1234-****-****-3456");
    }

    #[test]
    fn json_and_form_bodies() {
        let p = plugin(json!({"request": [
            {"type": "body", "body_format": "json", "name": "$.password", "action": "remove"},
            {"type": "body", "body_format": "json", "name": "$.users[*].card", "action": "regex",
             "regex": "(\\d+)\\-\\d+", "value": "$1-**"},
        ]}));
        let mut ctx = LogCtx {
            request_body: Some(Bytes::from_static(
                b"{\"password\":\"abc\",\"users\":[{\"card\":\"11-22\"},{\"card\":\"33-44\"}]}",
            )),
            ..LogCtx::default()
        };
        p.mask_log(&mut ctx);
        assert_eq!(
            ctx.request_body.as_deref(),
            Some(&b"{\"users\":[{\"card\":\"11-**\"},{\"card\":\"33-**\"}]}"[..])
        );

        let p = plugin(json!({"request": [
            {"type": "body", "body_format": "urlencoded", "name": "pw", "action": "replace",
             "value": "x"},
        ]}));
        let mut ctx = LogCtx {
            request_body: Some(Bytes::from_static(b"a=1&pw=secret")),
            ..LogCtx::default()
        };
        p.mask_log(&mut ctx);
        assert_eq!(ctx.request_body.as_deref(), Some(&b"a=1&pw=x"[..]));
    }

    #[test]
    fn bad_confs() {
        let c = Compiler::new();
        let r = &c.registry;
        let err = |c: Value| r.check(NAME, &c).unwrap_err();
        assert!(
            err(json!({"request": [{"type": "body", "name": "$.a", "action": "remove"}]}))
                .ends_with("allOf 1 failed: then clause did not match")
        );
        assert!(err(
            json!({"request": [{"type": "query", "name": "a", "action": "regex",
            "regex": "(", "value": "x"}]})
        )
        .contains("invalid regex"));
    }
}
