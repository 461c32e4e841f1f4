//! degraphql (`apisix/plugins/degraphql.lua`): serves a fixed GraphQL `query` behind a plain
//! route. A POST goes upstream as the JSON GraphQL body `{"query", "operationName",
//! "variables"}` (Content-Type `application/json`), `variables` taken by name from the client's
//! JSON body; a GET as the query string `query=...&operationName=...&variables=...`, the
//! variables taken from the client's query arguments and JSON-encoded. Other methods get 405.
//! A client POST body that is missing or not a JSON object when `variables` are configured
//! gets 400, one that cannot be read 503. The query must parse, and name its operation
//! (`operation_name`) when it holds several definitions.

use std::sync::Arc;

use bytes::Bytes;
use ferrisix_config::schema::{cjson, lua};
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef, Step,
};
use http::{header, HeaderValue, Method, StatusCode};
use serde_json::{json, Map, Value};

use crate::support::args::encode_args;
use crate::support::graphql;

pub const NAME: &str = "degraphql";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    ..PluginDef::new(NAME, 509, schema, compile)
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "max_req_body_size": {"type": "integer", "minimum": 1, "default": 67108864},
            "query": {"type": "string", "minLength": 1, "maxLength": 1024},
            "variables": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "operation_name": {"type": "string", "minLength": 1, "maxLength": 1024}
        },
        "required": ["query"]
    })
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    let query = cx.conf.get("query").and_then(Value::as_str).unwrap_or("");
    let doc = graphql::parse(query).map_err(|e| format!("failed to parse query: {e}"))?;
    if doc.definitions.len() > 1 && cx.conf.get("operation_name").is_none() {
        return Err(
            "operation_name is required if multiple operations are present in the query".into(),
        );
    }
    Ok(())
}

#[derive(Debug)]
struct Degraphql {
    query: String,
    operation_name: Option<String>,
    variables: Option<Vec<String>>,
    max_body: usize,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let text = |k: &str| conf.get(k).and_then(Value::as_str).map(str::to_owned);
    Ok(Arc::new(Degraphql {
        query: text("query").unwrap_or_default(),
        operation_name: text("operation_name"),
        variables: conf.get("variables").and_then(Value::as_array).map(|l| {
            l.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        }),
        max_body: conf["max_req_body_size"]
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(usize::MAX),
    }))
}

impl Degraphql {
    async fn run(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let post = *ctx.method() == Method::POST;
        if !post && *ctx.method() != Method::GET {
            return Flow::Exit(Exit::status(StatusCode::METHOD_NOT_ALLOWED));
        }
        let mut variables = None;
        if let Some(names) = &self.variables {
            let mut vars = Map::new();
            if post {
                let body = match ctx.read_body(self.max_body).await {
                    Ok(b) if !b.is_empty() => b.clone(),
                    Ok(_) => {
                        tracing::error!("missing request body");
                        return Flow::Exit(Exit::status(StatusCode::BAD_REQUEST));
                    }
                    Err(e) => {
                        tracing::error!("failed to get request body: {e}");
                        return Flow::Exit(Exit::status(StatusCode::SERVICE_UNAVAILABLE));
                    }
                };
                let doc = match cjson::decode(&body) {
                    Ok(v @ (Value::Object(_) | Value::Array(_))) => v,
                    other => {
                        let why = other.err().unwrap_or_else(|| "bad type".into());
                        tracing::error!("invalid request body can't be decoded: {why}");
                        return Flow::Exit(Exit::status(StatusCode::BAD_REQUEST));
                    }
                };
                for n in names {
                    if let Some(v) = doc.get(n.as_str()).filter(|v| !v.is_null()) {
                        vars.insert(n.clone(), v.clone());
                    }
                }
            } else {
                for n in names {
                    if let Some(v) = ctx.arg(n) {
                        vars.insert(n.clone(), Value::String(v.into_owned()));
                    }
                }
            }
            variables = Some(Value::Object(vars));
        }
        if post {
            let mut body = Map::new();
            body.insert("query".into(), Value::String(self.query.clone()));
            if let Some(op) = &self.operation_name {
                body.insert("operationName".into(), Value::String(op.clone()));
            }
            if let Some(v) = variables {
                body.insert("variables".into(), v);
            }
            if self.variables.is_none() {
                // Read what the client sent, so the connection stays usable.
                let _ = ctx.read_body(self.max_body).await;
            }
            ctx.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            ctx.set_body(Bytes::from(lua::cjson_encode(&Value::Object(body))));
        } else {
            let mut args = vec![("query".to_string(), Some(self.query.clone()))];
            if let Some(op) = &self.operation_name {
                args.push(("operationName".into(), Some(op.clone())));
            }
            if let Some(v) = variables {
                args.push(("variables".into(), Some(lua::cjson_encode(&v))));
            }
            ctx.set_upstream_query(Some(encode_args(&args)));
        }
        Flow::Continue
    }
}

impl Plugin for Degraphql {
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

    async fn run(conf: Value, req: &mut TestRequest) -> Flow {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "dg", None)).unwrap();
        let flow = match p.access(&mut req.ctx()) {
            Step::Done(f) => f,
            Step::Wait(fut) => fut.await,
        };
        flow
    }

    #[tokio::test]
    async fn post_get_and_other_methods() {
        let conf = json!({"query": "query q($name: String) { p(n: $name) { id } }",
                          "variables": ["name"]});
        let mut r = TestRequest::post("/g", "{\"name\": \"ann\", \"x\": 1}");
        assert_eq!(run(conf.clone(), &mut r).await, Flow::Continue);
        let sent: Value = serde_json::from_slice(&r.sent_body().unwrap()).unwrap();
        assert_eq!(sent["variables"], json!({"name": "ann"}));
        assert_eq!(r.headers["content-type"], "application/json");

        let mut r = TestRequest::get("/g?name=bob");
        assert_eq!(run(conf.clone(), &mut r).await, Flow::Continue);
        let q = r.state.upstream_edits().query.clone().flatten().unwrap();
        assert!(
            q.ends_with("&variables=%7B%22name%22%3A%22bob%22%7D"),
            "{q}"
        );

        let mut r = TestRequest::post("/g", "[1");
        let Flow::Exit(e) = run(conf.clone(), &mut r).await else {
            panic!()
        };
        assert_eq!(e.status, 400);
        let mut r = TestRequest::new(Method::PUT, "/g");
        let Flow::Exit(e) = run(conf, &mut r).await else {
            panic!()
        };
        assert_eq!(e.status, 405);
    }

    #[test]
    fn bad_confs() {
        let c = Compiler::new();
        let r = &c.registry;
        let err = |c: Value| r.check(NAME, &c).unwrap_err();
        assert!(err(json!({"query": "uery {}"}))
            .ends_with("failed to parse query: Syntax error near line 1"));
        assert!(
            err(json!({"query": "query a { x } query b { y }"})).ends_with(
                "operation_name is required if multiple operations are present in the query"
            )
        );
        assert!(r
            .check(
                NAME,
                &json!({"query": "query a { x } query b { y }", "operation_name": "b"})
            )
            .is_ok());
    }
}
