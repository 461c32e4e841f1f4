//! oas-validator (`apisix/plugins/oas-validator.lua`): validates requests against an OpenAPI 3
//! document, given inline (`spec`, JSON) or fetched from `spec_url` (with
//! `spec_url_request_headers`, `ssl_verify` and `timeout`; kept for the metadata's
//! `spec_url_ttl` seconds, 3600 by default). The request's path (`$uri`) and method select the
//! operation; its path parameters, query parameters, headers and body are checked against the
//! operation's parameters (path-level ones included; string values converted to the schema's
//! type first) and `requestBody` (its `required` flag, the media type of `Content-Type`, and
//! the schema of a JSON or form body). `$ref`s within the document are followed. Each part is
//! skipped with its `skip_*_validation` flag. A request that fails is answered
//! `rejection_status_code` (400) with `{"message": "failed to validate request. "}`, the reason
//! appended with `verbose_errors`, unless `reject_if_not_match` is false (then it is only
//! logged). A path or method the document does not describe fails too.
//!
//! The reasons `verbose_errors` shows are ferrisix's own words, not the Lua validator's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use ferrisix_config::schema::{self, cjson};
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, Flow, Phases, Plugin, PluginCtx, PluginDef, PluginServices, Step,
};
use http::{HeaderName, HeaderValue, Request, StatusCode};
use serde_json::{json, Map, Value};

use crate::support::args::decode_form;
use crate::support::auth::message_exit;

pub const NAME: &str = "oas-validator";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    metadata_schema: Some(metadata_schema),
    ..PluginDef::new(NAME, 512, schema, compile)
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "max_req_body_size": {"type": "integer", "minimum": 1, "default": 67108864},
            "spec": {"type": "string", "minLength": 1},
            "spec_url": {"type": "string", "pattern": "^https?://"},
            "spec_url_request_headers": {
                "type": "object", "additionalProperties": {"type": "string"}
            },
            "ssl_verify": {"type": "boolean", "default": false},
            "timeout": {"type": "integer", "minimum": 1000, "maximum": 60000, "default": 10000},
            "verbose_errors": {"type": "boolean", "default": false},
            "skip_request_body_validation": {"type": "boolean", "default": false},
            "skip_request_header_validation": {"type": "boolean", "default": false},
            "skip_query_param_validation": {"type": "boolean", "default": false},
            "skip_path_params_validation": {"type": "boolean", "default": false},
            "reject_if_not_match": {"type": "boolean", "default": true},
            "rejection_status_code": {
                "type": "integer", "minimum": 400, "maximum": 599, "default": 400
            }
        },
        "oneOf": [{"required": ["spec"]}, {"required": ["spec_url"]}]
    })
}

fn metadata_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"spec_url_ttl": {"type": "integer", "minimum": 1, "default": 3600}}
    })
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    if let Some(spec) = cx.conf.get("spec").and_then(Value::as_str) {
        cjson::decode(spec.as_bytes())
            .map_err(|e| format!("invalid JSON string provided, err: {e}"))?;
    }
    Ok(())
}

/// How deep `$ref`s are followed; a cycle ends as an empty (accepting) schema.
const MAX_REF_DEPTH: usize = 32;

/// The document with every `$ref` into itself replaced by what it points at, and OpenAPI's
/// `nullable` written as a JSON-schema type list.
fn resolve(v: &Value, root: &Value, depth: usize) -> Value {
    match v {
        Value::Object(m) => {
            if let Some(r) = m.get("$ref").and_then(Value::as_str) {
                if depth >= MAX_REF_DEPTH {
                    return json!({});
                }
                let target = r
                    .strip_prefix('#')
                    .and_then(|p| root.pointer(p))
                    .cloned()
                    .unwrap_or_else(|| json!({}));
                return resolve(&target, root, depth + 1);
            }
            let mut out: Map<String, Value> = m
                .iter()
                .map(|(k, v)| (k.clone(), resolve(v, root, depth)))
                .collect();
            if out.get("nullable") == Some(&Value::Bool(true)) {
                if let Some(Value::String(t)) = out.get("type").cloned() {
                    out.insert("type".into(), json!([t, "null"]));
                }
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| resolve(x, root, depth)).collect()),
        other => other.clone(),
    }
}

#[derive(Debug)]
struct Param {
    name: String,
    location: String,
    required: bool,
    schema: Value,
}

#[derive(Debug)]
struct Operation {
    params: Vec<Param>,
    body_required: bool,
    /// Media type -> schema.
    content: Vec<(String, Value)>,
}

#[derive(Debug)]
struct PathItem {
    /// `None`: a `{param}` segment.
    segments: Vec<Option<String>>,
    names: Vec<String>,
    ops: Vec<(String, Operation)>,
}

#[derive(Debug)]
struct Oas {
    paths: Vec<PathItem>,
}

fn params_of(list: Option<&Value>) -> Vec<Param> {
    list.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| {
            Some(Param {
                name: p.get("name")?.as_str()?.to_owned(),
                location: p.get("in")?.as_str()?.to_owned(),
                required: p.get("required").and_then(Value::as_bool).unwrap_or(false),
                schema: p.get("schema").cloned().unwrap_or_else(|| json!({})),
            })
        })
        .collect()
}

impl Oas {
    fn compile(text: &[u8]) -> Result<Oas, String> {
        let raw = cjson::decode(text)?;
        let doc = resolve(&raw, &raw, 0);
        let paths = doc
            .get("paths")
            .and_then(Value::as_object)
            .ok_or("the document has no paths")?;
        let mut out = Vec::new();
        for (template, item) in paths {
            let mut segments = Vec::new();
            let mut names = Vec::new();
            for seg in template.trim_start_matches('/').split('/') {
                match seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                    Some(name) => {
                        names.push(name.to_owned());
                        segments.push(None);
                    }
                    None => segments.push(Some(seg.to_owned())),
                }
            }
            let shared = params_of(item.get("parameters"));
            let mut ops = Vec::new();
            for method in [
                "get", "put", "post", "delete", "options", "head", "patch", "trace",
            ] {
                let Some(op) = item.get(method) else { continue };
                let mut params = params_of(op.get("parameters"));
                for p in &shared {
                    if !params
                        .iter()
                        .any(|q| q.name == p.name && q.location == p.location)
                    {
                        params.push(Param {
                            name: p.name.clone(),
                            location: p.location.clone(),
                            required: p.required,
                            schema: p.schema.clone(),
                        });
                    }
                }
                let body = op.get("requestBody");
                let content = body
                    .and_then(|b| b.get("content"))
                    .and_then(Value::as_object)
                    .map(|c| {
                        c.iter()
                            .map(|(t, m)| {
                                let s = m.get("schema").cloned().unwrap_or_else(|| json!({}));
                                (t.to_ascii_lowercase(), s)
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                ops.push((
                    method.to_uppercase(),
                    Operation {
                        params,
                        body_required: body
                            .and_then(|b| b.get("required"))
                            .and_then(Value::as_bool)
                            .unwrap_or(false),
                        content,
                    },
                ));
            }
            out.push(PathItem {
                segments,
                names,
                ops,
            });
        }
        // Literal segments win over parameters, as OpenAPI matches concrete paths first.
        out.sort_by_key(|p| p.segments.iter().filter(|s| s.is_none()).count());
        Ok(Oas { paths: out })
    }

    /// The path item matching `path`, and its path parameters' values.
    fn route(&self, path: &str) -> Option<(&PathItem, Vec<(String, String)>)> {
        let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        self.paths.iter().find_map(|p| {
            if p.segments.len() != segs.len() {
                return None;
            }
            let mut values = Vec::new();
            let mut names = p.names.iter();
            for (want, got) in p.segments.iter().zip(&segs) {
                match want {
                    Some(lit) if lit == got => {}
                    Some(_) => return None,
                    None if got.is_empty() => return None,
                    None => values.push((
                        names.next()?.clone(),
                        crate::support::args::unescape(got.as_bytes()),
                    )),
                }
            }
            Some((p, values))
        })
    }
}

/// A text parameter as the schema's type wants it; `None` when it cannot be one.
fn coerce(text: &str, schema: &Value) -> Option<Value> {
    let t = match schema.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(list)) => list
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")?,
        _ => return Some(Value::String(text.to_owned())),
    };
    Some(match t {
        "integer" => Value::from(text.trim().parse::<i64>().ok()?),
        "number" => {
            serde_json::Number::from_f64(text.trim().parse::<f64>().ok()?).map(Value::Number)?
        }
        "boolean" => match text {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => return None,
        },
        "array" => {
            let items = schema.get("items").cloned().unwrap_or_else(|| json!({}));
            Value::Array(
                text.split(',')
                    .map(|p| coerce(p, &items))
                    .collect::<Option<Vec<_>>>()?,
            )
        }
        "object" => cjson::decode(text.as_bytes()).ok()?,
        _ => Value::String(text.to_owned()),
    })
}

fn check_param(p: &Param, value: Option<String>) -> Result<(), String> {
    let Some(text) = value else {
        return if p.required {
            Err(format!(
                "{} parameter \"{}\" is required",
                p.location, p.name
            ))
        } else {
            Ok(())
        };
    };
    let v = coerce(&text, &p.schema).ok_or_else(|| {
        format!(
            "{} parameter \"{}\": {text:?} is not of the schema's type",
            p.location, p.name
        )
    })?;
    schema::validate(&p.schema, &v)
        .map_err(|e| format!("{} parameter \"{}\": {e}", p.location, p.name))
}

#[derive(Debug, Clone, Copy)]
struct Skips {
    body: bool,
    header: bool,
    query: bool,
    path: bool,
}

/// What the request is checked on, read before checking.
struct Input<'a> {
    method: &'a str,
    path: &'a str,
    query: Option<&'a str>,
    headers: &'a http::HeaderMap,
    body: Option<&'a Bytes>,
}

fn validate(oas: &Oas, input: &Input<'_>, skip: Skips) -> Result<(), String> {
    let (item, path_values) = oas
        .route(input.path)
        .ok_or_else(|| format!("no path in the document matches {}", input.path))?;
    let op = item
        .ops
        .iter()
        .find(|(m, _)| m == input.method)
        .map(|(_, o)| o)
        .ok_or_else(|| format!("method {} is not allowed for {}", input.method, input.path))?;
    for p in &op.params {
        let value = match p.location.as_str() {
            "path" if !skip.path => path_values
                .iter()
                .find(|(n, _)| *n == p.name)
                .map(|(_, v)| v.clone()),
            "query" if !skip.query => input
                .query
                .and_then(|q| ferrisix_plugin_api::vars::query_arg(q, &p.name))
                .map(|v| v.into_owned()),
            "header" if !skip.header => input
                .headers
                .get(p.name.to_ascii_lowercase().as_str())
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            _ => continue,
        };
        check_param(p, value)?;
    }
    if skip.body {
        return Ok(());
    }
    let body = input.body.filter(|b| !b.is_empty());
    let Some(body) = body else {
        return if op.body_required {
            Err("request body is required".into())
        } else {
            Ok(())
        };
    };
    if op.content.is_empty() {
        return Ok(());
    }
    let media = input
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let family = format!("{}/*", media.split('/').next().unwrap_or(""));
    let schema = ["exact", "family", "any"]
        .iter()
        .find_map(|kind| {
            op.content.iter().find(|(t, _)| match *kind {
                "exact" => *t == media,
                "family" => *t == family,
                _ => t == "*/*",
            })
        })
        .map(|(_, s)| s)
        .ok_or_else(|| format!("content type {media:?} is not allowed"))?;
    let value = if media.ends_with("json") {
        cjson::decode(body).map_err(|e| format!("invalid JSON body: {e}"))?
    } else if media == "application/x-www-form-urlencoded" {
        decode_form(body)
    } else {
        return Ok(());
    };
    schema::validate(schema, &value).map_err(|e| format!("request body: {e}"))
}

enum Source {
    Inline(Result<Arc<Oas>, String>),
    Url {
        url: String,
        headers: Vec<(HeaderName, HeaderValue)>,
        ssl_verify: bool,
        timeout: Duration,
        ttl: Duration,
        cached: ArcSwapOption<(Instant, Arc<Oas>)>,
    },
}

struct OasValidator {
    source: Source,
    services: Arc<PluginServices>,
    max_body: usize,
    verbose: bool,
    reject: bool,
    status: StatusCode,
    skip: Skips,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let flag = |k: &str| conf[k].as_bool().unwrap_or(false);
    let source = match conf.get("spec").and_then(Value::as_str) {
        Some(spec) => Source::Inline(Oas::compile(spec.as_bytes()).map(Arc::new)),
        None => Source::Url {
            url: conf["spec_url"].as_str().unwrap_or_default().to_owned(),
            headers: conf
                .get("spec_url_request_headers")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| {
                    Some((
                        HeaderName::from_bytes(k.as_bytes()).ok()?,
                        HeaderValue::from_str(v.as_str()?).ok()?,
                    ))
                })
                .collect(),
            ssl_verify: flag("ssl_verify"),
            timeout: Duration::from_millis(conf["timeout"].as_u64().unwrap_or(10000)),
            ttl: Duration::from_secs(
                cx.metadata
                    .and_then(|m| m.get("spec_url_ttl"))
                    .and_then(Value::as_u64)
                    .unwrap_or(3600),
            ),
            cached: ArcSwapOption::empty(),
        },
    };
    let code = conf["rejection_status_code"].as_u64().unwrap_or(400);
    Ok(Arc::new(OasValidator {
        source,
        services: cx.services.clone(),
        max_body: conf["max_req_body_size"]
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(usize::MAX),
        verbose: flag("verbose_errors"),
        reject: conf["reject_if_not_match"].as_bool().unwrap_or(true),
        status: u16::try_from(code)
            .ok()
            .and_then(|c| StatusCode::from_u16(c).ok())
            .unwrap_or(StatusCode::BAD_REQUEST),
        skip: Skips {
            body: flag("skip_request_body_validation"),
            header: flag("skip_request_header_validation"),
            query: flag("skip_query_param_validation"),
            path: flag("skip_path_params_validation"),
        },
    }))
}

impl OasValidator {
    async fn document(&self) -> Result<Arc<Oas>, String> {
        match &self.source {
            Source::Inline(r) => r
                .clone()
                .map_err(|e| format!("failed to compile openapi spec, err: {e}")),
            Source::Url {
                url,
                headers,
                ssl_verify,
                timeout,
                ttl,
                cached,
            } => {
                if let Some(c) = cached.load_full() {
                    if c.0.elapsed() < *ttl {
                        return Ok(c.1.clone());
                    }
                }
                let mut req = Request::get(url.as_str());
                for (k, v) in headers {
                    req = req.header(k, v);
                }
                let req = req
                    .body(Bytes::new())
                    .map_err(|e| format!("failed to fetch spec from URL: {e}"))?;
                let res = self
                    .services
                    .http()
                    .send_verified(req, *timeout, *ssl_verify)
                    .await
                    .map_err(|e| format!("failed to fetch spec from URL: {e}"))?;
                if res.status() != StatusCode::OK {
                    return Err(format!(
                        "spec URL returned status {}",
                        res.status().as_u16()
                    ));
                }
                let oas = Arc::new(Oas::compile(res.body()).map_err(|e| {
                    format!("failed to compile openapi spec fetched from URL: {e}")
                })?);
                cached.store(Some(Arc::new((Instant::now(), oas.clone()))));
                Ok(oas)
            }
        }
    }

    async fn run(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let oas = match self.document().await {
            Ok(o) => o,
            Err(e) => {
                tracing::error!("{e}");
                return Flow::Exit(message_exit(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "failed to parse openapi spec",
                ));
            }
        };
        let body = if self.skip.body {
            None
        } else {
            match ctx.read_body(self.max_body).await {
                Ok(b) => Some(b.clone()),
                Err(e) => {
                    let e = e.to_string();
                    tracing::error!("failed reading request body, err: {e}");
                    return Flow::Exit(message_exit(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        &format!("error reading the request body. err: {e}"),
                    ));
                }
            }
        };
        let method = ctx.method().as_str().to_owned();
        let path = ctx.uri().to_owned();
        let input = Input {
            method: &method,
            path: &path,
            query: ctx.query(),
            headers: ctx.headers(),
            body: body.as_ref(),
        };
        let Err(err) = validate(&oas, &input, self.skip) else {
            return Flow::Continue;
        };
        tracing::error!("error occurred while validating request [{method} {path}], err: {err}");
        if !self.reject {
            return Flow::Continue;
        }
        let detail = if self.verbose { err.as_str() } else { "" };
        Flow::Exit(message_exit(
            self.status,
            &format!("failed to validate request. {detail}"),
        ))
    }
}

impl Plugin for OasValidator {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.run(ctx)))
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_plugin_api::testing::TestRequest;

    use super::*;
    use crate::testing::Compiler;
    use ferrisix_config::validate::PluginCheck;

    fn spec() -> String {
        json!({"openapi": "3.0.2", "info": {"title": "t", "version": "1"},
        "components": {"schemas": {"Pet": {"type": "object", "required": ["name"],
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}}},
        "paths": {
            "/pets": {
                "get": {"parameters": [{"name": "status", "in": "query",
                    "schema": {"type": "string", "enum": ["a", "b"]}}]},
                "post": {"requestBody": {"required": true, "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/Pet"}}}}}
            },
            "/pets/{id}": {"get": {"parameters": [{"name": "id", "in": "path",
                "required": true, "schema": {"type": "integer"}}]}},
            "/pets/mine": {"get": {}}
        }})
        .to_string()
    }

    async fn run(conf: &Value, mut req: TestRequest) -> Option<(u16, String)> {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, conf, "oas", None)).unwrap();
        let flow = match p.access(&mut req.ctx()) {
            Step::Done(f) => f,
            Step::Wait(fut) => fut.await,
        };
        match flow {
            Flow::Continue => None,
            Flow::Exit(e) => Some((
                e.status.as_u16(),
                String::from_utf8_lossy(e.body.as_deref().unwrap_or_default()).into_owned(),
            )),
        }
    }

    #[tokio::test]
    async fn path_query_and_body() {
        let conf = json!({"spec": spec()});
        assert_eq!(run(&conf, TestRequest::get("/pets/10")).await, None);
        assert_eq!(run(&conf, TestRequest::get("/pets/mine")).await, None);
        assert_eq!(
            run(&conf, TestRequest::get("/pets/abc")).await,
            Some((
                400,
                "{\"message\":\"failed to validate request. \"}\n".into()
            ))
        );
        assert_eq!(run(&conf, TestRequest::get("/pets?status=a")).await, None);
        assert!(run(&conf, TestRequest::get("/pets?status=c"))
            .await
            .is_some());
        let post =
            |b: &str| TestRequest::post("/pets", b).header("content-type", "application/json");
        assert_eq!(
            run(&conf, post("{\"name\": \"rex\", \"age\": 3}")).await,
            None
        );
        assert!(run(&conf, post("{\"age\": \"old\"}")).await.is_some());
        assert!(run(&conf, TestRequest::post("/pets", "")).await.is_some());
        assert!(run(&conf, TestRequest::get("/cats")).await.is_some());

        let verbose = json!({"spec": spec(), "verbose_errors": true,
                             "rejection_status_code": 422});
        let (code, body) = run(&verbose, TestRequest::get("/pets/abc")).await.unwrap();
        assert_eq!(code, 422);
        assert!(body.contains("path parameter \\\"id\\\""), "{body}");
        let lenient = json!({"spec": spec(), "reject_if_not_match": false});
        assert_eq!(run(&lenient, TestRequest::get("/pets/abc")).await, None);
        let skip = json!({"spec": spec(), "skip_path_params_validation": true});
        assert_eq!(run(&skip, TestRequest::get("/pets/abc")).await, None);
    }

    #[test]
    fn bad_confs() {
        let c = Compiler::new();
        let r = &c.registry;
        let err = r.check(NAME, &json!({"spec": "{"})).unwrap_err();
        assert!(err.contains("invalid JSON string provided, err: "), "{err}");
        assert!(r.check(NAME, &json!({})).is_err());
        assert!(r.check(NAME, &json!({"spec_url": "ftp://x"})).is_err());
    }
}
