//! Helpers for the plugins' unit tests: compiling a conf as a snapshot would, and requests
//! carrying given variables.

use std::collections::HashMap;
use std::sync::Arc;

use ferrisix_config::model::ResourceKind;
use ferrisix_plugin_api::testing::TestRequest;
use ferrisix_plugin_api::{
    CompileCtx, Consumer, ConsumerIndex, Credential, NoUpstreams, Owner, PluginServices,
};
use serde_json::Value;

use crate::chain::CompileEnv;
use crate::registry::PluginRegistry;

/// Compiles confs against one set of services (one gateway).
pub(crate) struct Compiler {
    pub registry: PluginRegistry,
    /// Every plugin's `plugin_metadata` (what public-api builds other plugins' APIs from).
    pub all_metadata: HashMap<String, Value>,
}

impl Compiler {
    pub fn new() -> Compiler {
        Compiler::with(Arc::new(PluginServices::default()))
    }

    pub fn with(services: Arc<PluginServices>) -> Compiler {
        Compiler {
            registry: PluginRegistry::new(services, None).0,
            all_metadata: HashMap::new(),
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
            all_metadata: &self.all_metadata,
            services: self.registry.services(),
            upstreams: &NoUpstreams,
            apis: self.registry.apis(),
            schema: &info.schema,
            protos: &ferrisix_plugin_api::Protos::EMPTY,
        }
    }
}

/// A compile environment of its own (fresh services: no state shared between tests), as the
/// chains of a snapshot are compiled in.
pub(crate) fn env() -> CompileEnv<'static> {
    let metadata: &'static HashMap<String, Value> = Box::leak(Box::default());
    let registry: &'static PluginRegistry = Box::leak(Box::new(PluginRegistry::builtin()));
    CompileEnv {
        metadata,
        registry,
        upstreams: &NoUpstreams,
        protos: &ferrisix_plugin_api::Protos::EMPTY,
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

/// The consumers of an auth plugin's tests: `jack`, holding `plugin`'s credential `conf`
/// under `key`, and `anon` (for `anonymous_consumer`).
pub(crate) fn jack_and_anon(plugin: &'static str, key: &str, conf: Value) -> Arc<ConsumerIndex> {
    let mut index = ConsumerIndex::default();
    let jack = Arc::new(Consumer {
        username: "jack".into(),
        ..Default::default()
    });
    index.add_consumer(jack.clone());
    index.add_consumer(Arc::new(Consumer {
        username: "anon".into(),
        ..Default::default()
    }));
    index.add_credential(
        plugin,
        key.into(),
        Credential {
            consumer: jack,
            conf,
            prepared: None,
        },
    );
    Arc::new(index)
}
