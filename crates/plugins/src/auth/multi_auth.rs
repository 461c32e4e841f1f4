//! multi-auth (`apisix/plugins/multi-auth.lua`): `auth_plugins` lists two or more auth
//! plugins with their confs; each is tried in order and the first that authenticates wins.
//! When none does the answer is 401 `{"message":"Authorization Failed"}` (each plugin's reason
//! is logged), with the last plugin's `WWW-Authenticate` challenge, as the plugins set it on the
//! response in APISIX.
//!
//! The listed plugins are compiled once with the multi-auth conf, from the catalog of built-in
//! definitions (as the registry is), never by importing their modules.

use std::sync::Arc;

use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef, PluginKind, Step,
};
use http::{HeaderName, StatusCode};
use serde_json::{json, Value};

use crate::support::auth::message_exit;

pub const NAME: &str = "multi-auth";

pub static DEF: PluginDef = PluginDef {
    kind: PluginKind::Auth,
    check: Some(check),
    ..PluginDef::new(NAME, 2600, schema, compile)
};

fn schema() -> Value {
    json!({
        "type": "object",
        "title": "work with route or service object",
        "properties": {"auth_plugins": {"type": "array", "minItems": 2}},
        "required": ["auth_plugins"]
    })
}

/// The auth plugin named `name` among the built-in ones (not multi-auth itself).
fn auth_def(name: &str) -> Result<&'static PluginDef, String> {
    let def = crate::builtin()
        .find(|d| d.name == name)
        .ok_or_else(|| format!("{name} plugin did not found"))?;
    if def.kind != PluginKind::Auth || def.name == NAME {
        return Err(format!("{name} plugin is not supported"));
    }
    Ok(def)
}

/// The (name, conf) pairs of `auth_plugins`, in order.
fn entries(conf: &Value) -> Vec<(&str, &Value)> {
    conf.get("auth_plugins")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
        .flat_map(|m| m.iter().map(|(k, v)| (k.as_str(), v)))
        .collect()
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    for (name, conf) in entries(cx.conf) {
        let def = auth_def(name)?;
        let schema = (def.schema)();
        def.verdict(&CheckCtx {
            conf,
            schema: &schema,
            services: cx.services,
            now: cx.now,
            consumer: false,
        })
        .map_err(|e| format!("plugin {name} check schema failed: {e}"))?;
    }
    Ok(())
}

struct MultiAuth {
    plugins: Vec<(&'static str, Arc<dyn Plugin>)>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let mut plugins = Vec::new();
    for (name, conf) in entries(cx.conf) {
        let def = auth_def(name)?;
        let schema = (def.schema)();
        let plugin = (def.compile)(&CompileCtx {
            name: def.name,
            conf,
            owner: cx.owner,
            route: cx.route,
            metadata: None,
            all_metadata: cx.all_metadata,
            services: cx.services,
            upstreams: cx.upstreams,
            apis: cx.apis,
            schema: &schema,
            protos: cx.protos,
        })
        .map_err(|e| format!("{name}: {e}"))?;
        plugins.push((def.name, plugin));
    }
    Ok(Arc::new(MultiAuth { plugins }))
}

const WWW_AUTHENTICATE: HeaderName = HeaderName::from_static("www-authenticate");

impl MultiAuth {
    async fn run(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let mut challenge = None;
        for (name, plugin) in &self.plugins {
            let flow = match plugin.rewrite(ctx) {
                Step::Done(f) => f,
                Step::Wait(fut) => fut.await,
            };
            match flow {
                Flow::Continue => return Flow::Continue,
                Flow::Exit(e) => {
                    tracing::warn!(
                        "{name} failed to authenticate the request, code: {}",
                        e.status.as_u16()
                    );
                    if let Some((_, v)) = e.headers.iter().find(|(n, _)| *n == WWW_AUTHENTICATE) {
                        challenge = Some(v.clone());
                    }
                }
            }
        }
        let mut exit: Exit = message_exit(StatusCode::UNAUTHORIZED, "Authorization Failed");
        if let Some(c) = challenge {
            exit = exit.with_header(WWW_AUTHENTICATE, c);
        }
        Flow::Exit(exit)
    }
}

impl Plugin for MultiAuth {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.run(ctx)))
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::{Consumer, ConsumerIndex, Credential};

    use super::*;
    use crate::testing::Compiler;

    async fn run(req: TestRequest) -> (Flow, TestRequest) {
        let mut req = req;
        let conf = json!({"auth_plugins": [{"basic-auth": {}}, {"key-auth": {"header": "x-key"}}]});
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "ma", None)).unwrap();
        let mut index = ConsumerIndex::default();
        let jack = Arc::new(Consumer {
            username: "jack".into(),
            ..Default::default()
        });
        index.add_credential(
            "key-auth",
            "k".into(),
            Credential {
                consumer: jack,
                conf: json!({"key": "k"}),
                prepared: None,
            },
        );
        req.state.set_consumers(Arc::new(index));
        let flow = match p.rewrite(&mut req.ctx()) {
            Step::Done(f) => f,
            Step::Wait(fut) => fut.await,
        };
        (flow, req)
    }

    #[tokio::test]
    async fn first_that_authenticates_wins() {
        let (flow, req) = run(TestRequest::get("/").header("x-key", "k")).await;
        assert_eq!(flow, Flow::Continue);
        assert_eq!(req.headers["x-consumer-username"], "jack");
        let (flow, _) = run(TestRequest::get("/").header("x-key", "nope")).await;
        let Flow::Exit(e) = flow else {
            panic!("refused")
        };
        assert_eq!(e.status, 401);
        assert_eq!(
            e.body.as_deref(),
            Some(&b"{\"message\":\"Authorization Failed\"}\n"[..])
        );
        assert!(e
            .headers
            .iter()
            .any(|(n, v)| n == "www-authenticate" && v == "apikey realm=\"key\""));
    }

    #[test]
    fn checks() {
        let c = Compiler::new();
        let r = &c.registry;
        let err = |conf: Value| r.check(NAME, &conf).unwrap_err();
        assert!(r
            .check(NAME, &json!({"auth_plugins": [{"key-auth": {}}]}))
            .is_err());
        assert!(
            err(json!({"auth_plugins": [{"key-auth": {}}, {"nope": {}}]}))
                .ends_with("nope plugin did not found")
        );
        assert!(
            err(json!({"auth_plugins": [{"key-auth": {}}, {"limit-count": {}}]}))
                .ends_with("limit-count plugin is not supported")
        );
        assert!(
            err(json!({"auth_plugins": [{"key-auth": {"header": 1}}, {"basic-auth": {}}]}))
                .contains("plugin key-auth check schema failed: ")
        );
        assert!(r
            .check(
                NAME,
                &json!({"auth_plugins": [{"key-auth": {}}, {"jwt-auth": {}}]})
            )
            .is_ok());
    }
}
