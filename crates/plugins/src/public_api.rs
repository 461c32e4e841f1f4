//! `public-api`: serves the plugins' own APIs (APISIX's `api_router`) on a data-plane route.
//!
//! A plugin API is a method set and a URI that the plugin answers itself. APISIX lists them from
//! each plugin's `api()` and matches them only when a route carrying `public-api` was matched
//! first, so an operator decides where (and behind which auth plugins) an API is exposed. The
//! plugin looks up its `uri` setting, or the request's `$uri`, among the APIs and answers with
//! that API, or 404 when none matches.
//!
//! The one API ferrisix has is prometheus' metrics text at `plugin_attr.prometheus.export_uri`,
//! listed only when `enable_export_server` is false (as APISIX's `get_api`).

use bytes::Bytes;
use http::{header, HeaderValue, Method, StatusCode};
use serde_json::Value;

use crate::plugin::{Exit, Flow, Phases, Plugin, PluginCtx, Step};
use crate::prometheus::Metrics;

pub const NAME: &str = "public-api";

/// What a plugin API answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ApiHandler {
    PrometheusMetrics,
}

/// One plugin API: `GET /apisix/prometheus/metrics` and the like.
#[derive(Clone, Debug)]
struct PluginApi {
    methods: &'static [Method],
    /// An exact path, or a prefix when it ends with `*` (APISIX's radixtree paths).
    uri: String,
    handler: ApiHandler,
}

impl PluginApi {
    fn matches(&self, method: &Method, uri: &str) -> bool {
        let path_ok = match self.uri.strip_suffix('*') {
            Some(prefix) => uri.starts_with(prefix),
            None => uri == self.uri,
        };
        path_ok && self.methods.contains(method)
    }
}

/// The plugin APIs of this process, fixed by `config.yaml` at start (APISIX rebuilds its API
/// router only when the plugin list is reloaded).
#[derive(Clone, Debug, Default)]
pub struct PluginApis {
    apis: Vec<PluginApi>,
}

impl PluginApis {
    /// The APIs the enabled settings expose: prometheus' export URI when it has no export
    /// server of its own.
    pub fn from_settings(prometheus: &ferrisix_config::settings::PrometheusAttr) -> PluginApis {
        let mut apis = Vec::new();
        if !prometheus.enable_export_server {
            apis.push(PluginApi {
                methods: &[Method::GET],
                uri: prometheus.export_uri.clone(),
                handler: ApiHandler::PrometheusMetrics,
            });
        }
        PluginApis { apis }
    }

    /// The answer of the API matching `method` and `uri`, `None` when no API matches.
    pub fn answer(&self, metrics: &Metrics, method: &Method, uri: &str) -> Option<ApiAnswer> {
        let api = self.apis.iter().find(|a| a.matches(method, uri))?;
        Some(match api.handler {
            ApiHandler::PrometheusMetrics => ApiAnswer {
                status: StatusCode::OK,
                // APISIX's handler sets `content_type: text/plain` before answering the text.
                content_type: HeaderValue::from_static("text/plain"),
                body: Bytes::from(metrics.render()),
            },
        })
    }

    pub fn is_empty(&self) -> bool {
        self.apis.is_empty()
    }
}

/// A plugin API's response.
#[derive(Clone, Debug)]
pub struct ApiAnswer {
    pub status: StatusCode,
    pub content_type: HeaderValue,
    pub body: Bytes,
}

/// `public-api` compiled for one route.
#[derive(Debug)]
pub struct PublicApi {
    /// `uri`: the API to serve, whatever path matched the route.
    uri: Option<String>,
}

impl PublicApi {
    pub fn compile(conf: &Value) -> PublicApi {
        PublicApi {
            uri: conf.get("uri").and_then(Value::as_str).map(str::to_owned),
        }
    }
}

impl Plugin for PublicApi {
    fn name(&self) -> &'static str {
        NAME
    }

    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let rt = crate::runtime::runtime();
        let uri = self.uri.as_deref().unwrap_or(ctx.uri);
        let exit = match rt.apis.answer(&rt.metrics, ctx.method, uri) {
            Some(answer) => {
                ctx.response_headers
                    .insert(header::CONTENT_TYPE, answer.content_type);
                Exit {
                    status: answer.status,
                    body: Some(answer.body),
                }
            }
            // No API at this path (or not for this method): APISIX's `return 404`.
            None => Exit::status(StatusCode::NOT_FOUND),
        };
        Step::Done(Flow::Exit(exit))
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::settings::PrometheusAttr;

    use super::*;

    #[test]
    fn prometheus_api_only_without_export_server() {
        let metrics = Metrics::new(&PrometheusAttr::default());
        let with_server = PluginApis::from_settings(&PrometheusAttr::default());
        assert!(with_server.is_empty());
        let attr = PrometheusAttr {
            enable_export_server: false,
            export_uri: "/metrics".to_owned(),
            ..PrometheusAttr::default()
        };
        let apis = PluginApis::from_settings(&attr);
        let answer = apis.answer(&metrics, &Method::GET, "/metrics").unwrap();
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.content_type, "text/plain");
        assert!(std::str::from_utf8(&answer.body)
            .unwrap()
            .contains("apisix_node_info{"));
        assert!(apis.answer(&metrics, &Method::POST, "/metrics").is_none());
        assert!(apis.answer(&metrics, &Method::GET, "/metrics/x").is_none());
    }

    #[test]
    fn prefix_apis() {
        let api = PluginApi {
            methods: &[Method::GET],
            uri: "/apisix/plugin/x/*".to_owned(),
            handler: ApiHandler::PrometheusMetrics,
        };
        assert!(api.matches(&Method::GET, "/apisix/plugin/x/a/b"));
        assert!(!api.matches(&Method::GET, "/apisix/plugin/y"));
        assert!(!api.matches(&Method::PUT, "/apisix/plugin/x/a"));
    }
}
