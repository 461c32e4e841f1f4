//! body-transformer (`apisix/plugins/body-transformer.lua`): rewrites the request body sent
//! upstream (`request`) and the response body sent to the client (`response`) with a
//! lua-resty-template `template` (base64 with `template_is_base64`) rendered over the decoded
//! body. `input_format` says how the body is decoded: `json`, `xml` (namespace prefixes
//! dropped), `encoded` (a form), `args` (the query string; always so for a GET request),
//! `multipart` (form-data fields by name) or `plain` (not decoded); without it the
//! Content-Type chooses (`text/xml`, `application/json`, a form, `multipart/`), and a body of
//! another type is not decoded. As in APISIX, a template is also tried as base64 when the
//! format is one that is not `encoded` or `args`.
//!
//! The template sees the decoded body's fields as globals (and as `context`), `_body` (the
//! raw body), `_ctx.var.<name>` (request variables, `status` in a response) and
//! `_ctx.consumer.username`, and the helpers `_escape_xml` and `_escape_json`; the template
//! language is [`template`]'s and the Lua it runs [`lua`]'s. A request body that does not
//! decode is answered 400 `{"message": "request body decode: <error>"}`, a template that fails
//! 503 `{"message": "request template rendering: <error>"}`; a response that fails is passed
//! on as the upstream sent it. Requests larger than `max_req_body_size` get 413; responses are
//! held up to `max_resp_body_size`. Templates are compiled when the conf is written, and one
//! using a construct outside the supported language is refused then.
//!
//! `require` gives the modules APISIX's documented templates load (`cjson`, `cjson.safe`,
//! `apisix.core`'s `json`, `tinyyaml`, `lyaml`). Not built: the `_multipart` object
//! (`set_simple`, `tostring`).

use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use ferrisix_config::schema::cjson;
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, Flow, Phases, Plugin, PluginCtx, PluginDef, ResponseHead, Step, WholeBody,
};
use ferrisix_router::VarSource;
use http::{Method, StatusCode};
use serde_json::{json, Map, Value};

use crate::support::args::decode_form;
use crate::support::auth::message_exit;

mod lua;
mod template;
mod xml;

use lua::{Globals, Key, Val};
use template::Template;

pub const NAME: &str = "body-transformer";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    ..PluginDef::new(NAME, 1080, schema, compile)
};

fn schema() -> Value {
    let transform = json!({
        "type": "object",
        "properties": {
            "input_format": {"type": "string",
                "enum": ["xml", "json", "encoded", "args", "plain", "multipart"]},
            "template": {"type": "string"},
            "template_is_base64": {"type": "boolean"}
        },
        "required": ["template"]
    });
    json!({
        "type": "object",
        "properties": {
            "request": transform,
            "response": transform,
            "max_req_body_size": {"type": "integer", "minimum": 1, "default": 67108864},
            "max_resp_body_size": {"type": "integer", "minimum": 1, "default": 67108864}
        },
        "anyOf": [
            {"required": ["request"]},
            {"required": ["response"]},
            {"required": ["request", "response"]}
        ]
    })
}

fn base64_text(text: &str) -> Option<String> {
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let bytes = engine.decode(text.trim_end()).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// One side's template, compiled as written and, where it could be read as base64, decoded.
#[derive(Debug)]
struct Side {
    format: Option<String>,
    is_base64: bool,
    plain: Result<Arc<Template>, String>,
    decoded: Option<Result<Arc<Template>, String>>,
}

impl Side {
    fn new(conf: &Value) -> Side {
        let text = conf["template"].as_str().unwrap_or_default();
        let decoded = base64_text(text).map(|t| template::compile(&t).map(Arc::new));
        Side {
            format: conf["input_format"].as_str().map(str::to_owned),
            is_base64: conf["template_is_base64"].as_bool().unwrap_or(false),
            plain: template::compile(text).map(Arc::new),
            decoded,
        }
    }

    /// The template to run for `format` (APISIX decodes base64 when asked to, or when a
    /// format other than `encoded` and `args` is in use; a text that is not base64 is used
    /// as it is).
    fn template(&self, format: Option<&str>) -> Result<Arc<Template>, String> {
        let try_decoded = self.is_base64 || format.is_some_and(|f| f != "encoded" && f != "args");
        match (&self.decoded, try_decoded) {
            (Some(d), true) => d.clone(),
            _ => self.plain.clone(),
        }
    }

    /// Whether some way the template may be run compiles.
    fn check(&self) -> Result<(), String> {
        match (&self.plain, &self.decoded) {
            (Ok(_), _) | (_, Some(Ok(_))) => Ok(()),
            (Err(e), _) => Err(e.clone()),
        }
    }

    /// `set_input_format`: the configured format, else the one the Content-Type names.
    fn format(&self, content_type: Option<&str>, get: bool) -> Option<String> {
        if get {
            return Some("args".into());
        }
        if let Some(f) = &self.format {
            return Some(f.clone());
        }
        let ct = content_type?.to_ascii_lowercase();
        if ct.contains("text/xml") {
            Some("xml".into())
        } else if ct.contains("application/json") {
            Some("json".into())
        } else if ct.contains("application/x-www-form-urlencoded") {
            Some("encoded".into())
        } else if ct.contains("multipart/") {
            Some("multipart".into())
        } else {
            None
        }
    }
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    for side in ["request", "response"] {
        if let Some(conf) = cx.conf.get(side) {
            Side::new(conf)
                .check()
                .map_err(|e| format!("failed to compile the {side} template: {e}"))?;
        }
    }
    Ok(())
}

#[derive(Debug)]
struct BodyTransformer {
    request: Option<Side>,
    response: Option<Arc<Side>>,
    max_req_body: usize,
    max_resp_body: usize,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let size = |k: &str| {
        conf[k]
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(64 << 20)
    };
    Ok(Arc::new(BodyTransformer {
        request: conf.get("request").map(Side::new),
        response: conf.get("response").map(|c| Arc::new(Side::new(c))),
        max_req_body: size("max_req_body_size"),
        max_resp_body: size("max_resp_body_size"),
    }))
}

/// `multipart/form-data` fields by name (a repeated one as the list of its values).
fn decode_multipart(body: &[u8], content_type: Option<&str>) -> Result<Value, String> {
    let ct = content_type.unwrap_or("");
    let boundary = ct
        .split(';')
        .filter_map(|p| p.trim().strip_prefix("boundary="))
        .next()
        .map(|b| b.trim_matches('"'))
        .filter(|b| !b.is_empty())
        .ok_or("no boundary in the Content-Type")?;
    let text = String::from_utf8_lossy(body);
    let delim = format!("--{boundary}");
    let mut fields = Map::new();
    for part in text.split(&delim).skip(1) {
        if part.starts_with("--") {
            break;
        }
        let part = part.strip_prefix("\r\n").unwrap_or(part);
        let (head, value) = part
            .split_once("\r\n\r\n")
            .ok_or("malformed multipart part")?;
        let value = value.strip_suffix("\r\n").unwrap_or(value);
        let name = head
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("content-disposition"))
            .and_then(|l| {
                l.split(';')
                    .filter_map(|p| p.trim().strip_prefix("name="))
                    .next()
                    .map(|n| n.trim_matches('"').to_owned())
            })
            .ok_or("multipart part without a name")?;
        let v = Value::String(value.to_owned());
        match fields.get_mut(&name) {
            Some(Value::Array(list)) => list.push(v),
            Some(prev) => {
                let first = prev.take();
                *prev = Value::Array(vec![first, v]);
            }
            None => {
                fields.insert(name, v);
            }
        }
    }
    Ok(Value::Object(fields))
}

/// The body decoded for the template; the error is the decoder's.
fn decode(
    format: Option<&str>,
    body: &[u8],
    content_type: Option<&str>,
    query: Option<&str>,
) -> Result<Val, String> {
    let json = match format {
        Some("json") => cjson::decode(body)?,
        Some("xml") => {
            return Ok(Val::from_json(
                &xml::decode(&String::from_utf8_lossy(body))?,
                true,
            ))
        }
        Some("encoded") => decode_form(body),
        Some("args") => decode_form(query.unwrap_or("").as_bytes()),
        Some("multipart") => decode_multipart(body, content_type)?,
        _ => Value::Object(Map::new()),
    };
    Ok(match Val::from_json(&json, false) {
        t @ Val::Table(_) => t,
        _ => Val::table(Vec::new()),
    })
}

/// What `_ctx` shows, read while the request is at hand.
#[derive(Clone, Debug, Default)]
struct CtxView {
    vars: Vec<(String, Option<String>)>,
    consumer: Option<String>,
}

impl CtxView {
    fn capture(t: &Template, vars: &dyn VarSource, consumer: Option<String>) -> CtxView {
        CtxView {
            vars: t
                .vars
                .iter()
                .map(|n| (n.clone(), vars.var(n).map(|v| v.into_owned())))
                .collect(),
            consumer,
        }
    }

    fn table(&self) -> Val {
        let var = Val::table(
            self.vars
                .iter()
                .filter_map(|(n, v)| Some((Key::Str(n.clone()), Val::str(v.as_deref()?))))
                .collect(),
        );
        let mut entries = vec![(Key::Str("var".into()), var)];
        if let Some(c) = &self.consumer {
            entries.push((
                Key::Str("consumer".into()),
                Val::table(vec![(Key::Str("username".into()), Val::str(c))]),
            ));
        }
        Val::table(entries)
    }
}

struct Env {
    fields: Val,
    ctx: Val,
    body: Val,
}

impl Globals for Env {
    fn global(&self, name: &str) -> Val {
        match name {
            "_ctx" => self.ctx.clone(),
            "_body" => self.body.clone(),
            "context" => self.fields.clone(),
            "_multipart" => Val::Nil,
            _ => match &self.fields {
                Val::Table(t) => t
                    .borrow()
                    .entries
                    .iter()
                    .find(|(k, _)| *k == Key::Str(name.into()))
                    .map_or(Val::Nil, |(_, v)| v.clone()),
                _ => Val::Nil,
            },
        }
    }
}

/// Which side runs, for the messages.
#[derive(Clone, Copy)]
enum Which {
    Request,
    Response,
}

impl Which {
    fn name(self) -> &'static str {
        match self {
            Which::Request => "request",
            Which::Response => "response",
        }
    }
}

/// Why a transformation failed: the status and message APISIX answers.
struct Failure(StatusCode, String);

struct Input<'a> {
    format: Option<String>,
    body: Option<&'a [u8]>,
    content_type: Option<&'a str>,
    query: Option<&'a str>,
    get: bool,
}

fn transform(
    side: &Side,
    which: Which,
    input: &Input<'_>,
    view: &CtxView,
    max_out: usize,
) -> Result<String, Failure> {
    let typ = which.name();
    let format = input.format.as_deref();
    let decodes = (input.body.is_some() || input.get) && format != Some("plain");
    let fields = if decodes && format.is_some() {
        decode(
            format,
            input.body.unwrap_or_default(),
            input.content_type,
            input.query,
        )
        .map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("{typ} body decode: {e}")))?
    } else {
        Val::table(Vec::new())
    };
    let t = side.template(format).map_err(|e| {
        Failure(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{typ} template compile: {e}"),
        )
    })?;
    let env = Env {
        fields,
        ctx: view.table(),
        body: input
            .body
            .map_or(Val::Nil, |b| Val::str(&String::from_utf8_lossy(b))),
    };
    t.render(&env, |_| {}, max_out).map_err(|e| {
        Failure(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{typ} template rendering: {e}"),
        )
    })
}

impl BodyTransformer {
    async fn rewrite_request(&self, side: &Side, ctx: &mut PluginCtx<'_>) -> Flow {
        let body = match ctx.read_body(self.max_req_body).await {
            Ok(b) => b.clone(),
            Err(e) => {
                tracing::error!("failed to get request body: {e}");
                return Flow::Exit(ferrisix_plugin_api::Exit::status(
                    StatusCode::PAYLOAD_TOO_LARGE,
                ));
            }
        };
        let get = *ctx.method() == Method::GET;
        let content_type = ctx.header("content-type").map(str::to_owned);
        let format = side.format(content_type.as_deref(), get);
        let consumer = ctx.consumer().map(|c| c.username.clone());
        let view = match side.template(format.as_deref()) {
            Ok(t) => CtxView::capture(&t, &*ctx, consumer),
            Err(_) => CtxView::default(),
        };
        let input = Input {
            format,
            body: (!body.is_empty()).then_some(&body[..]),
            content_type: content_type.as_deref(),
            query: ctx.query(),
            get,
        };
        match transform(
            side,
            Which::Request,
            &input,
            &view,
            self.max_req_body.max(1 << 20),
        ) {
            Ok(out) => {
                ctx.set_body(Bytes::from(out));
                Flow::Continue
            }
            Err(Failure(status, msg)) => {
                tracing::error!("{msg}");
                Flow::Exit(message_exit(status, &msg))
            }
        }
    }
}

impl Plugin for BodyTransformer {
    fn phases(&self) -> Phases {
        let mut p = Phases::NONE;
        if self.request.is_some() {
            p = p | Phases::REWRITE;
        }
        if self.response.is_some() {
            p = p | Phases::HEADER_FILTER;
        }
        p
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        match &self.request {
            Some(side) => Step::Wait(Box::pin(self.rewrite_request(side, ctx))),
            None => Step::CONTINUE,
        }
    }

    fn header_filter(&self, ctx: &mut PluginCtx<'_>, resp: &mut ResponseHead<'_>) {
        let Some(side) = self.response.clone() else {
            return;
        };
        let content_type = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let format = side.format(content_type.as_deref(), false);
        let consumer = ctx.consumer().map(|c| c.username.clone());
        let mut view = match side.template(format.as_deref()) {
            Ok(t) => CtxView::capture(&t, &*ctx, consumer),
            Err(_) => CtxView::default(),
        };
        let status = resp.status().as_u16().to_string();
        for (n, v) in &mut view.vars {
            if n == "status" {
                *v = Some(status.clone());
            }
        }
        let query = ctx.query().map(str::to_owned);
        let max = self.max_resp_body;
        resp.clear_headers_as_body_modified();
        resp.add_body_filter(Box::new(WholeBody::new(move |body: Bytes| {
            let held = &body[..body.len().min(max)];
            let input = Input {
                format,
                body: Some(held),
                content_type: content_type.as_deref(),
                query: query.as_deref(),
                get: false,
            };
            match transform(&side, Which::Response, &input, &view, max.max(1 << 20)) {
                Ok(out) => Bytes::from(out),
                Err(Failure(_, msg)) => {
                    tracing::error!("failed to transform response body: {msg}");
                    body
                }
            }
        })));
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_plugin_api::testing::TestRequest;

    use super::*;
    use crate::testing::Compiler;
    use ferrisix_config::validate::PluginCheck;

    async fn run(conf: Value, req: &mut TestRequest) -> Flow {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "bt", None)).unwrap();
        let flow = match p.rewrite(&mut req.ctx()) {
            Step::Done(f) => f,
            Step::Wait(fut) => fut.await,
        };
        flow
    }

    fn sent(req: &TestRequest) -> String {
        String::from_utf8(req.sent_body().unwrap().to_vec()).unwrap()
    }

    #[tokio::test]
    async fn request_formats() {
        let conf = json!({"request": {
            "template": "{\"foo\":\"{{name .. \" world\"}}\",\"bar\":{{age+10}}}"}});
        let mut r = TestRequest::post("/", "{\"name\":\"hello\",\"age\":20}")
            .header("content-type", "application/json");
        assert_eq!(run(conf.clone(), &mut r).await, Flow::Continue);
        assert_eq!(sent(&r), "{\"foo\":\"hello world\",\"bar\":30}");
        let mut r = TestRequest::post("/", "name=hello&age=20")
            .header("content-type", "application/x-www-form-urlencoded");
        assert_eq!(run(conf.clone(), &mut r).await, Flow::Continue);
        assert_eq!(sent(&r), "{\"foo\":\"hello world\",\"bar\":30}");
        let mut r = TestRequest::get("/?name=hello&age=20");
        assert_eq!(run(conf, &mut r).await, Flow::Continue);
        assert_eq!(sent(&r), "{\"foo\":\"hello world\",\"bar\":30}");

        let xml = json!({"request": {"template":
            "{\"c\":\"{{Envelope.Body.r.name}}\",\"id\":\"{{_ctx.var.arg_id}}\"}"}});
        let mut r = TestRequest::post(
            "/?id=7",
            "<?xml version=\"1.0\"?><s:Envelope xmlns:s=\"u\"><s:Body><n:r xmlns:n=\"v\">\
             <n:name>Spain</n:name></n:r></s:Body></s:Envelope>",
        )
        .header("content-type", "text/xml; charset=utf-8");
        assert_eq!(run(xml, &mut r).await, Flow::Continue);
        assert_eq!(sent(&r), "{\"c\":\"Spain\",\"id\":\"7\"}");
    }

    #[tokio::test]
    async fn failures() {
        let exit = |f: Flow| match f {
            Flow::Exit(e) => (
                e.status.as_u16(),
                String::from_utf8_lossy(e.body.as_deref().unwrap_or_default()).into_owned(),
            ),
            Flow::Continue => panic!("expected an exit"),
        };
        let conf = json!({"request": {"input_format": "xml", "template": "{{name}}"}});
        let mut r = TestRequest::post("/", "{\"name\":1}");
        let (code, body) = exit(run(conf, &mut r).await);
        assert_eq!(code, 400);
        assert!(body.starts_with("{\"message\":\"request body decode: Error Parsing XML"));
        let conf = json!({"request": {"template": "{{name() .. \"x\"}}"}});
        let mut r =
            TestRequest::post("/", "{\"name\":\"a\"}").header("content-type", "application/json");
        let (code, body) = exit(run(conf, &mut r).await);
        assert_eq!(code, 503);
        assert!(
            body.starts_with("{\"message\":\"request template rendering: "),
            "{body}"
        );
    }

    #[test]
    fn confs() {
        let c = Compiler::new();
        let r = &c.registry;
        let err = |c: Value| r.check(NAME, &c).unwrap_err();
        assert!(err(json!({})).contains("object matches none of the required"));
        assert!(err(json!({"request": {"template": "{% if x then %}"}}))
            .contains("failed to compile the request template"));
        assert!(
            err(json!({"request": {"template": "{% local function f() end %}"}}))
                .contains("functions cannot be defined")
        );
    }

    #[test]
    fn multipart_fields() {
        let body = "--b\r\nContent-Disposition: form-data; name=\"age\"\r\n\r\n19\r\n\
                    --b\r\nContent-Disposition: form-data; name=\"n\"\r\n\r\nx\r\n--b--\r\n";
        assert_eq!(
            decode_multipart(body.as_bytes(), Some("multipart/form-data; boundary=b")).unwrap(),
            json!({"age": "19", "n": "x"})
        );
    }
}
