//! What compiling one plugin configuration may read: the conf, where it comes from, the route,
//! the plugin's metadata, the shared services, the upstreams it may send requests to, and the
//! plugin APIs of the enabled plugins.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode};
use serde_json::{Map, Value};

use ferrisix_config::proto::Protos;

use crate::ctx::{Owner, RouteInfo};
use crate::plugin::Plugin;
use crate::services::PluginServices;
use crate::upstream::UpstreamResolver;

/// What a plugin API answers (APISIX's `api()` handlers).
#[derive(Clone, Debug)]
pub struct ApiAnswer {
    pub status: StatusCode,
    pub content_type: HeaderValue,
    pub body: Bytes,
}

/// What answers a plugin API request.
#[derive(Clone)]
pub enum ApiHandler {
    /// An answer from the method and URI alone (node-status' document, prometheus' text).
    Answer(ApiAnswerFn),
    /// A handler of the whole request (APISIX's handlers that read the body, look up
    /// consumers or call out): `make` builds it once per snapshot from the `plugin_metadata`
    /// of `plugin`, and `public-api` runs its `access` phase, which answers with an exit.
    Request {
        plugin: &'static str,
        make: ApiMaker,
    },
}

/// Answers a plugin API request from its method and URI ([`ApiHandler::Answer`]).
pub type ApiAnswerFn = Arc<dyn Fn(&Method, &str) -> ApiAnswer + Send + Sync>;

/// Builds an [`ApiHandler::Request`] handler from its plugin's metadata (`None`: none set).
pub type ApiMaker =
    Arc<dyn Fn(Option<&Value>, &Arc<PluginServices>) -> Arc<dyn Plugin> + Send + Sync>;

/// One plugin API: a method set and a URI its plugin answers itself (APISIX's `api_router`),
/// served on a data-plane route through `public-api`.
#[derive(Clone)]
pub struct PluginApi {
    pub methods: &'static [Method],
    /// An exact path, or a prefix when it ends with `*` (APISIX's radixtree paths).
    pub uri: String,
    pub handler: ApiHandler,
}

impl fmt::Debug for PluginApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginApi")
            .field("methods", &self.methods)
            .field("uri", &self.uri)
            .finish()
    }
}

impl PluginApi {
    pub fn matches(&self, method: &Method, uri: &str) -> bool {
        let path_ok = match self.uri.strip_suffix('*') {
            Some(prefix) => uri.starts_with(prefix),
            None => uri == self.uri,
        };
        path_ok && self.methods.contains(method)
    }
}

/// The plugin APIs of the enabled plugins.
#[derive(Clone, Debug, Default)]
pub struct PluginApis(Arc<[PluginApi]>);

impl PluginApis {
    pub fn new(apis: Vec<PluginApi>) -> PluginApis {
        PluginApis(apis.into())
    }

    /// The position of the API matching `method` and `uri` in [`PluginApis::iter`].
    pub fn position(&self, method: &Method, uri: &str) -> Option<usize> {
        self.0.iter().position(|a| a.matches(method, uri))
    }

    /// The answer of the API matching `method` and `uri`, `None` when none matches or the
    /// one that matches handles the whole request ([`ApiHandler::Request`]).
    pub fn answer(&self, method: &Method, uri: &str) -> Option<ApiAnswer> {
        match &self.0.get(self.position(method, uri)?)?.handler {
            ApiHandler::Answer(answer) => Some(answer(method, uri)),
            ApiHandler::Request { .. } => None,
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &PluginApi> {
        self.0.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Everything compiling one plugin configuration may read.
pub struct CompileCtx<'a> {
    /// The plugin's name.
    pub name: &'static str,
    /// The configuration, as stored (defaults not filled in).
    pub conf: &'a Value,
    /// The resource holding the conf, which keys state that must survive recompiles.
    pub owner: &'a Owner,
    /// The route the plugin runs for; `None` for global rules shared by every route and for
    /// requests that matched no route.
    pub route: Option<&'a RouteInfo>,
    /// `plugin_metadata/<name>`, if any.
    pub metadata: Option<&'a Value>,
    /// Every plugin's `plugin_metadata` by name (public-api builds the API handlers of
    /// other plugins from theirs).
    pub all_metadata: &'a HashMap<String, Value>,
    pub services: &'a Arc<PluginServices>,
    pub upstreams: &'a dyn UpstreamResolver,
    pub apis: &'a PluginApis,
    /// The plugin's schema, to fill in defaults.
    pub schema: &'a Value,
    /// The snapshot's compiled `protos` (grpc-transcode's `proto_id`).
    pub protos: &'a Protos,
}

impl CompileCtx<'_> {
    /// The conf as an object.
    pub fn object(&self) -> Result<&Map<String, Value>, String> {
        self.conf
            .as_object()
            .ok_or_else(|| "conf is not an object".into())
    }

    /// The conf with the schema's defaults filled in, as APISIX holds it.
    pub fn filled(&self) -> Value {
        let mut filled = self.conf.clone();
        let _ = ferrisix_config::schema::validate_and_fill(self.schema, &mut filled);
        filled
    }

    /// APISIX's `plugin.conf_version`: crc32 of the conf's stable encoding (defaults filled
    /// in, `_meta` left out), so an unchanged conf keeps its state across snapshots and
    /// re-PUTs, while any change starts afresh.
    pub fn conf_version(&self) -> u32 {
        conf_version(self.schema, self.conf)
    }

    /// `<owner key>:<conf version>`: the key of this conf's state in a [`crate::StateMap`].
    pub fn state_key(&self) -> String {
        format!("{}:{}", self.owner.key, self.conf_version())
    }
}

/// [`CompileCtx::conf_version`] for `conf` under `schema`.
pub fn conf_version(schema: &Value, conf: &Value) -> u32 {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                Value::Object(
                    keys.into_iter()
                        .map(|k| (k.clone(), sorted(&m[k])))
                        .collect(),
                )
            }
            Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    let mut filled = conf.clone();
    let _ = ferrisix_config::schema::validate_and_fill(schema, &mut filled);
    if let Some(m) = filled.as_object_mut() {
        m.remove("_meta");
    }
    crc32fast::hash(sorted(&filled).to_string().as_bytes())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::upstream::NoUpstreams;

    #[test]
    fn versions_ignore_defaults_order_and_meta() {
        let schema = json!({"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer", "default": 3}}});
        let v = conf_version(&schema, &json!({"a": 1}));
        assert_eq!(v, conf_version(&schema, &json!({"b": 3, "a": 1})));
        assert_eq!(
            v,
            conf_version(&schema, &json!({"a": 1, "_meta": {"disable": false}}))
        );
        assert_ne!(v, conf_version(&schema, &json!({"a": 2})));
    }

    #[test]
    fn apis_match_exact_and_prefix_paths() {
        let answer = |_: &Method, uri: &str| ApiAnswer {
            status: StatusCode::OK,
            content_type: HeaderValue::from_static("text/plain"),
            body: Bytes::from(uri.to_owned()),
        };
        let apis = PluginApis::new(vec![
            PluginApi {
                methods: &[Method::GET],
                uri: "/exact".into(),
                handler: ApiHandler::Answer(Arc::new(answer)),
            },
            PluginApi {
                methods: &[Method::GET],
                uri: "/apisix/plugin/x/*".into(),
                handler: ApiHandler::Answer(Arc::new(answer)),
            },
        ]);
        assert_eq!(apis.answer(&Method::GET, "/exact").unwrap().body, "/exact");
        assert!(apis.answer(&Method::GET, "/apisix/plugin/x/a/b").is_some());
        assert!(apis.answer(&Method::POST, "/exact").is_none());
        assert!(apis.answer(&Method::GET, "/exact/x").is_none());
        assert!(NoUpstreams.upstream_by_id("1").is_err());
    }
}
