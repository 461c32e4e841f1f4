//! Helpers for the plugins' unit tests: compiling a conf as a snapshot would, and requests
//! carrying given variables.

use std::sync::Arc;

use ferrisix_config::model::ResourceKind;
use ferrisix_plugin_api::testing::TestRequest;
use ferrisix_plugin_api::{CompileCtx, NoUpstreams, Owner, PluginServices};
use serde_json::Value;

use crate::registry::PluginRegistry;

/// Compiles confs against one set of services (one gateway).
pub(crate) struct Compiler {
    pub registry: PluginRegistry,
}

impl Compiler {
    pub fn new() -> Compiler {
        Compiler::with(Arc::new(PluginServices::default()))
    }

    pub fn with(services: Arc<PluginServices>) -> Compiler {
        Compiler {
            registry: PluginRegistry::new(services, None).0,
        }
    }

    /// The compile context of plugin `name`'s `conf` held by route `owner`.
    pub fn cx<'a>(
        &'a self,
        name: &'static str,
        conf: &'a Value,
        owner: &str,
        metadata: Option<&'a Value>,
    ) -> CompileCtx<'a> {
        let owner: &'static Owner = Box::leak(Box::new(Owner::new(ResourceKind::Routes, owner)));
        let info = self.registry.get(name).expect("a known plugin");
        CompileCtx {
            name: info.name,
            conf,
            owner,
            route: None,
            metadata,
            services: self.registry.services(),
            upstreams: &NoUpstreams,
            apis: self.registry.apis(),
            schema: &info.schema,
        }
    }
}

/// A GET from `ip` whose `http_*` variables are `vars`.
pub(crate) fn request(ip: &str, vars: &[(&'static str, &'static str)]) -> TestRequest {
    let mut req = TestRequest::get("/").from(ip);
    for (name, value) in vars {
        let header = name
            .strip_prefix("http_")
            .expect("test variables are request headers")
            .replace('_', "-");
        req = req.header(Box::leak(header.into_boxed_str()), value);
    }
    req
}
