//! `public-api`: serves the plugins' own APIs (APISIX's `api_router`) on a data-plane route.
//!
//! A plugin API is a method set and a URI that the plugin answers itself. APISIX lists them from
//! each plugin's `api()` and matches them only when a route carrying `public-api` was matched
//! first, so an operator decides where (and behind which auth plugins) an API is exposed. The
//! plugin looks up its `uri` setting, or the request's `$uri`, among the APIs of the enabled
//! plugins ([`PluginDef::apis`], collected by the registry) and answers with that API, or 404
//! when none matches.
//!
//! The APIs are prometheus' metrics text at `plugin_attr.prometheus.export_uri` (listed only
//! when `enable_export_server` is false, as APISIX's `get_api`), node-status' `/apisix/status`,
//! batch-requests' `/apisix/batch-requests` and wolf-rbac's login, password and user APIs.
//! The last two handle the whole request (its body, the consumers, calls out): their
//! handlers are built here, per snapshot, from their plugins' `plugin_metadata`, and run as
//! this plugin's access phase.

use std::sync::Arc;

use ferrisix_plugin_api::{
    ApiHandler, CompileCtx, Exit, Phases, Plugin, PluginApis, PluginCtx, PluginDef, Step,
};
use http::{header, StatusCode};
use serde_json::{json, Value};

pub const NAME: &str = "public-api";

pub static DEF: PluginDef = PluginDef::new(NAME, 501, schema, compile);

fn schema() -> Value {
    json!({"type": "object", "properties": {"uri": {"type": "string"}}})
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    // The APIs that handle the whole request are built now, from their plugins' metadata of
    // this snapshot; the others answer from the URI alone.
    let handlers = cx
        .apis
        .iter()
        .map(|api| match &api.handler {
            ApiHandler::Answer(_) => None,
            ApiHandler::Request { plugin, make } => {
                Some(make(cx.all_metadata.get(*plugin), cx.services))
            }
        })
        .collect::<Vec<_>>();
    Ok(Arc::new(PublicApi {
        uri: cx
            .conf
            .get("uri")
            .and_then(Value::as_str)
            .map(str::to_owned),
        needs_consumers: handlers.iter().flatten().any(|h| h.needs_consumers()),
        apis: cx.apis.clone(),
        handlers,
    }))
}

/// `public-api` compiled for one route.
pub struct PublicApi {
    /// `uri`: the API to serve, whatever path matched the route.
    uri: Option<String>,
    apis: PluginApis,
    /// The whole-request handlers, by the position of their API in `apis`.
    handlers: Vec<Option<Arc<dyn Plugin>>>,
    /// Some handler looks consumers up (wolf-rbac's login).
    needs_consumers: bool,
}

impl std::fmt::Debug for PublicApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublicApi")
            .field("uri", &self.uri)
            .field("apis", &self.apis)
            .finish_non_exhaustive()
    }
}

impl Plugin for PublicApi {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn needs_consumers(&self) -> bool {
        self.needs_consumers
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let uri = self.uri.as_deref().unwrap_or(ctx.uri());
        let found = self.apis.position(ctx.method(), uri);
        let Some(i) = found else {
            // No API at this path (or not for this method): APISIX's `return 404`.
            return Step::exit(Exit::status(StatusCode::NOT_FOUND));
        };
        if let Some(Some(handler)) = self.handlers.get(i) {
            return handler.access(ctx);
        }
        let uri = self.uri.as_deref().unwrap_or(ctx.uri());
        match self.apis.answer(ctx.method(), uri) {
            Some(answer) => Step::exit(
                Exit::body(answer.status, answer.body)
                    .with_header(header::CONTENT_TYPE, answer.content_type),
            ),
            None => Step::exit(Exit::status(StatusCode::NOT_FOUND)),
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::settings::PluginAttr;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::{Executor, Flow, PluginServices};
    use http::Method;

    use super::*;
    use crate::testing::Compiler;

    fn answer(c: &Compiler, method: Method, uri: &str) -> Exit {
        let conf = json!({});
        let plugin = (DEF.compile)(&c.cx(NAME, &conf, "pa", None)).unwrap();
        let mut req = TestRequest::new(method, uri);
        let Step::Done(Flow::Exit(e)) = plugin.access(&mut req.ctx()) else {
            panic!("public-api always answers")
        };
        e
    }

    #[test]
    fn prometheus_api_only_without_export_server() {
        let with_server = Compiler::new();
        // Other plugins (node-status) register their APIs; prometheus's is not among them.
        assert!(with_server
            .registry
            .apis()
            .answer(&Method::GET, "/apisix/prometheus/metrics")
            .is_none());
        assert_eq!(answer(&with_server, Method::GET, "/metrics").status, 404);

        let mut attr = PluginAttr::default();
        attr.prometheus.enable_export_server = false;
        attr.prometheus.export_uri = "/metrics".to_owned();
        let services = PluginServices::new(attr, Executor::current(), Default::default());
        let c = Compiler::with(Arc::new(services));
        let e = answer(&c, Method::GET, "/metrics");
        assert_eq!(e.status, StatusCode::OK);
        assert_eq!(e.headers[0].1, "text/plain");
        assert!(std::str::from_utf8(e.body.as_deref().unwrap())
            .unwrap()
            .contains("apisix_node_info{"));
        assert_eq!(answer(&c, Method::POST, "/metrics").status, 404);
        assert_eq!(answer(&c, Method::GET, "/metrics/x").status, 404);
    }
}
