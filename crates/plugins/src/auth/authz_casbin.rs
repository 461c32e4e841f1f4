//! authz-casbin (`apisix/plugins/authz-casbin.lua`): access control by a Casbin model and
//! policy: the subject is the value of the request header named by `username`
//! (`anonymous` without it), the object the path (`$uri`), the action the method. A request
//! the policy does not allow answers 403 `{"message":"Access Denied"}`.
//!
//! The model and policy come from the conf (`model` and `policy` text, or `model_path` and
//! `policy_path` files read when the conf is compiled) or else from the plugin metadata
//! (`model`, `policy`); without either the request answers 503. What Casbin supports here:
//! [`casbin`].
//!
//! APISIX accepts a conf holding only `username` when the metadata exists at the time it is
//! written; ferrisix's check does not see the metadata, so it accepts such a conf and the
//! metadata is read when the route is compiled.

use std::sync::Arc;

use ferrisix_plugin_api::{CheckCtx, CompileCtx, Exit, Phases, Plugin, PluginCtx, PluginDef, Step};
use http::{HeaderName, StatusCode};
use serde_json::{json, Value};

use crate::support::auth::message_exit;

mod casbin;

pub const NAME: &str = "authz-casbin";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    metadata_schema: Some(metadata_schema),
    ..PluginDef::new(NAME, 2560, schema, compile)
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "model_path": {"type": "string"},
            "policy_path": {"type": "string"},
            "model": {"type": "string"},
            "policy": {"type": "string"},
            "username": {"type": "string"}
        }
    })
}

fn metadata_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "model": {"type": "string"},
            "policy": {"type": "string"}
        },
        "required": ["model", "policy"]
    })
}

fn has(conf: &Value, keys: &[&str]) -> bool {
    keys.iter().all(|k| conf.get(*k).is_some())
}

/// APISIX's `oneOf` over ({model_path, policy_path, username}, {model, policy, username}),
/// a conf with `username` alone left to the metadata.
fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    let files = has(cx.conf, &["model_path", "policy_path", "username"]);
    let text = has(cx.conf, &["model", "policy", "username"]);
    match (files, text) {
        (true, true) => {
            Err("value should match only one schema, but matches both schemas 1 and 2".into())
        }
        (false, false) if cx.conf.get("username").is_none() => {
            Err("value should match only one schema, but matches none".into())
        }
        _ => Ok(()),
    }
}

#[derive(Debug)]
struct AuthzCasbin {
    /// `None`: no model and policy anywhere (503).
    enforcer: Option<casbin::Enforcer>,
    username: Option<HeaderName>,
}

fn read(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("failed to read {path}: {e}"))
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.conf;
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    let texts = if let (Some(m), Some(p)) = (s(conf, "model_path"), s(conf, "policy_path")) {
        Some((read(&m)?, read(&p)?))
    } else if let (Some(m), Some(p)) = (s(conf, "model"), s(conf, "policy")) {
        Some((m, p))
    } else {
        cx.metadata
            .and_then(|md| Some((s(md, "model")?, s(md, "policy")?)))
    };
    let enforcer = match texts {
        Some((model, policy)) => Some(casbin::Enforcer::new(&model, &policy)?),
        None => {
            tracing::error!("not enough configuration to create enforcer");
            None
        }
    };
    Ok(Arc::new(AuthzCasbin {
        enforcer,
        username: s(conf, "username").and_then(|h| HeaderName::from_bytes(h.as_bytes()).ok()),
    }))
}

impl Plugin for AuthzCasbin {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let Some(enforcer) = &self.enforcer else {
            return Step::exit(Exit::status(StatusCode::SERVICE_UNAVAILABLE));
        };
        let user = self
            .username
            .as_ref()
            .and_then(|h| ctx.headers().get(h))
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_else(|| "anonymous".to_owned());
        if enforcer.enforce(&[user.as_str(), ctx.uri(), ctx.method().as_str()]) {
            Step::CONTINUE
        } else {
            Step::exit(message_exit(StatusCode::FORBIDDEN, "Access Denied"))
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::Flow;
    use http::Method;

    use super::*;
    use crate::testing::Compiler;

    const MODEL: &str = "[request_definition]\nr = sub, obj, act\n\n[policy_definition]\np = sub, obj, act\n\n[role_definition]\ng = _, _\n\n[policy_effect]\ne = some(where (p.eft == allow))\n\n[matchers]\nm = (g(r.sub, p.sub) || keyMatch(r.sub, p.sub)) && keyMatch(r.obj, p.obj) && keyMatch(r.act, p.act)";

    fn status(conf: &Value, metadata: Option<&Value>, req: TestRequest) -> u16 {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, conf, "casbin", metadata)).unwrap();
        let mut req = req;
        let status = match p.rewrite(&mut req.ctx()) {
            Step::Done(Flow::Continue) => 200,
            Step::Done(Flow::Exit(e)) => e.status.as_u16(),
            Step::Wait(_) => panic!("authz-casbin does not wait"),
        };
        status
    }

    #[test]
    fn inline_files_and_metadata() {
        let policy = "p, *, /public, GET\np, admin, *, *\ng, alice, admin";
        let conf = json!({"model": MODEL, "policy": policy, "username": "user"});
        assert_eq!(status(&conf, None, TestRequest::get("/public")), 200);
        assert_eq!(
            status(&conf, None, TestRequest::new(Method::POST, "/public")),
            403
        );
        assert_eq!(
            status(&conf, None, TestRequest::get("/x").header("user", "bob")),
            403
        );
        assert_eq!(
            status(
                &conf,
                None,
                TestRequest::new(Method::DELETE, "/x").header("user", "alice")
            ),
            200
        );
        let dir = tempfile::tempdir().unwrap();
        let (m, p) = (dir.path().join("model.conf"), dir.path().join("policy.csv"));
        std::fs::write(&m, MODEL).unwrap();
        std::fs::write(&p, policy).unwrap();
        let files = json!({"model_path": m, "policy_path": p, "username": "user"});
        assert_eq!(
            status(&files, None, TestRequest::get("/x").header("user", "admin")),
            200
        );
        let only_user = json!({"username": "user"});
        let md = json!({"model": MODEL, "policy": policy});
        assert_eq!(
            status(&only_user, Some(&md), TestRequest::get("/public")),
            200
        );
        assert_eq!(status(&only_user, None, TestRequest::get("/public")), 503);
    }

    #[test]
    fn schema_messages() {
        let c = Compiler::new();
        let err = |conf: Value| c.registry.check(NAME, &conf).unwrap_err();
        assert_eq!(
            err(json!({"model": MODEL, "policy": "p, *, /, GET"})),
            "failed to check the configuration of plugin authz-casbin err: value should match only one schema, but matches none"
        );
        assert!(c.registry.check(NAME, &json!({"username": "u"})).is_ok());
        assert_eq!(c.registry.get(NAME).unwrap().priority, 2560);
    }
}
