//! request-validation (`apisix/plugins/request-validation.lua`): checks the request headers
//! against `header_schema` and the body against `body_schema` before the request goes on, and
//! answers `rejected_code` (400 by default) with `rejected_msg`, or else the validator's own
//! message (api7 jsonschema's words, as the Admin API reports them), when one fails.
//!
//! The headers are checked as `ngx.req.get_headers()` shows them: lower-cased names, a repeated
//! header as the list of its values. The body is read up to `max_req_body_size` bytes; a
//! missing, larger or unreadable body is refused with `rejected_msg` (nginx's page without
//! one). A form body (`application/x-www-form-urlencoded`) is checked as its decoded fields;
//! anything else is decoded as JSON with lua-cjson's error messages, and a JSON body that passes
//! is re-encoded before it goes upstream, so the upstream parses exactly what was checked. A
//! request with two Content-Type headers is refused, since the gateway and the upstream could
//! read its body differently.

use std::sync::Arc;

use bytes::Bytes;
use ferrisix_config::schema::{self, cjson, lua};
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef, Step,
};
use http::StatusCode;
use serde_json::{json, Value};

use crate::support::args::{decode_form, headers_table};
use crate::support::schema_check;

pub const NAME: &str = "request-validation";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    ..PluginDef::new(NAME, 2800, schema, compile)
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "header_schema": {"type": "object"},
            "body_schema": {"type": "object"},
            "max_req_body_size": {"type": "integer", "minimum": 1, "default": 67108864},
            "rejected_code": {"type": "integer", "minimum": 200, "maximum": 599, "default": 400},
            "rejected_msg": {"type": "string", "minLength": 1, "maxLength": 256}
        },
        "anyOf": [{"required": ["header_schema"]}, {"required": ["body_schema"]}]
    })
}

/// Both schemas must be schemas the validator can run (APISIX's `core.schema.valid`).
fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    for key in ["body_schema", "header_schema"] {
        if let Some(s) = cx.conf.get(key) {
            schema_check::valid(s)?;
        }
    }
    Ok(())
}

#[derive(Debug)]
struct RequestValidation {
    header_schema: Option<Value>,
    body_schema: Option<Value>,
    max_body: usize,
    status: StatusCode,
    rejected_msg: Option<String>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let code = conf["rejected_code"].as_u64().unwrap_or(400);
    let status = u16::try_from(code)
        .ok()
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or_else(|| format!("invalid rejected_code {code}"))?;
    Ok(Arc::new(RequestValidation {
        header_schema: conf.get("header_schema").cloned(),
        body_schema: conf.get("body_schema").cloned(),
        max_body: conf["max_req_body_size"]
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(usize::MAX),
        status,
        rejected_msg: conf
            .get("rejected_msg")
            .and_then(Value::as_str)
            .map(str::to_owned),
    }))
}

impl RequestValidation {
    fn reject(&self, err: Option<String>) -> Flow {
        match self.rejected_msg.clone().or(err) {
            Some(msg) => Flow::Exit(Exit::body(self.status, msg)),
            None => Flow::Exit(Exit::status(self.status)),
        }
    }

    async fn run(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        if let Some(s) = &self.header_schema {
            if let Err(e) = schema::validate(s, &headers_table(ctx)) {
                tracing::error!("req schema validation failed{e}");
                return self.reject(Some(e));
            }
        }
        let Some(s) = &self.body_schema else {
            return Flow::Continue;
        };
        let body = match ctx.read_body(self.max_body).await {
            Ok(b) if !b.is_empty() => b.clone(),
            Ok(_) => return self.reject(None),
            Err(e) => {
                tracing::error!("failed to get body: {e}");
                return self.reject(None);
            }
        };
        let mut types = ctx.headers().get_all(http::header::CONTENT_TYPE).iter();
        let content_type = types.next();
        if types.next().is_some() {
            tracing::error!("duplicated Content-Type header");
            return self.reject(None);
        }
        let form = content_type.is_some_and(|ct| {
            ct.as_bytes()
                .to_ascii_lowercase()
                .starts_with(b"application/x-www-form-urlencoded")
        });
        let decoded = if form {
            decode_form(&body)
        } else {
            match cjson::decode(&body) {
                Ok(v) => v,
                Err(e) => {
                    tracing::error!("failed to decode the req body: {e}");
                    return self.reject(Some(e));
                }
            }
        };
        if let Err(e) = schema::validate(s, &decoded) {
            tracing::error!("req schema validation failed: {e}");
            return self.reject(Some(e));
        }
        if !form {
            ctx.set_body(Bytes::from(lua::cjson_encode(&decoded)));
        }
        Flow::Continue
    }
}

impl Plugin for RequestValidation {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
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
        let p = (DEF.compile)(&c.cx(NAME, &conf, "rv", None)).unwrap();
        let flow = match p.rewrite(&mut req.ctx()) {
            Step::Done(f) => f,
            Step::Wait(fut) => fut.await,
        };
        flow
    }

    fn body_of(flow: &Flow) -> (u16, String) {
        match flow {
            Flow::Exit(e) => (
                e.status.as_u16(),
                String::from_utf8_lossy(e.body.as_deref().unwrap_or_default()).into_owned(),
            ),
            Flow::Continue => (0, String::new()),
        }
    }

    fn body_conf() -> Value {
        json!({"body_schema": {"type": "object", "required": ["name"],
            "properties": {"name": {"type": "string", "minLength": 2}}}})
    }

    #[tokio::test]
    async fn body_messages_and_reencoding() {
        let post = |b: &str| TestRequest::post("/x", b).header("content-type", "application/json");
        let mut r = post("{\"other\": 1}");
        assert_eq!(
            body_of(&run(body_conf(), &mut r).await),
            (400, "property \"name\" is required".into())
        );
        let mut r = post("{\"name\": 5}");
        assert_eq!(
            body_of(&run(body_conf(), &mut r).await).1,
            "property \"name\" validation failed: wrong type: expected string, got number"
        );
        let mut r = post("nope");
        assert_eq!(
            body_of(&run(body_conf(), &mut r).await).1,
            "Expected value but found invalid token at character 1"
        );
        let mut r = post("{ \"name\" : \"ab/c\" }");
        assert_eq!(run(body_conf(), &mut r).await, Flow::Continue);
        assert_eq!(r.sent_body().as_deref(), Some(&b"{\"name\":\"ab/c\"}"[..]));
    }

    #[tokio::test]
    async fn forms_headers_and_rejections() {
        let mut r = TestRequest::post("/x", "name=ab&x=1")
            .header("content-type", "application/x-www-form-urlencoded");
        assert_eq!(run(body_conf(), &mut r).await, Flow::Continue);
        // A form is proxied as it came.
        assert_eq!(r.sent_body().as_deref(), Some(&b"name=ab&x=1"[..]));

        let conf = json!({"header_schema": {"type": "object", "required": ["x-t"],
            "properties": {"x-t": {"type": "string", "pattern": "^t-"}}}});
        let mut r = TestRequest::get("/x").header("x-t", "bad");
        assert_eq!(
            body_of(&run(conf.clone(), &mut r).await).1,
            "property \"x-t\" validation failed: failed to match pattern \"^t-\" with \"bad\""
        );
        let mut r = TestRequest::get("/x").header("x-t", "t-1");
        assert_eq!(run(conf, &mut r).await, Flow::Continue);

        let mut conf = body_conf();
        conf["rejected_code"] = json!(403);
        conf["rejected_msg"] = json!("no");
        let mut r = TestRequest::get("/x");
        assert_eq!(
            body_of(&run(conf.clone(), &mut r).await),
            (403, "no".into())
        );
        let mut r = TestRequest::post("/x", "{}")
            .header("content-type", "application/json")
            .header("content-type", "application/json");
        assert_eq!(body_of(&run(conf, &mut r).await), (403, "no".into()));
    }

    #[test]
    fn bad_confs() {
        let c = Compiler::new();
        let r = &c.registry;
        let err = |c: Value| r.check(NAME, &c).unwrap_err();
        assert!(err(json!({"rejected_msg": "x"})).contains("object matches none of the required"));
        assert!(err(json!({"body_schema": {"type": "test"}})).contains("invalid JSON type: test"));
        assert!(r.check(NAME, &body_conf()).is_ok());
    }
}
