//! Turns a plugin name and configuration into a compiled instance.

use std::sync::Arc;

use serde_json::Value;

use crate::chain::CompileEnv;
use crate::limit_conn::{self, LimitConn};
use crate::limit_count::{self, LimitCount};
use crate::limit_req::{self, LimitReq};
use crate::plugin::{Owner, Plugin, RouteInfo};
use crate::prometheus::{self, Prometheus};
use crate::public_api::{self, PublicApi};
use crate::runtime::runtime;

/// Compiles `conf` of plugin `name`, held by `owner`, for `route`. `Ok(None)`: a plugin whose
/// schema ferrisix knows but which it does not implement.
pub fn compile(
    name: &str,
    conf: &Value,
    owner: &Owner,
    route: Option<&RouteInfo>,
    env: CompileEnv<'_>,
) -> Result<Option<Arc<dyn Plugin>>, String> {
    let rt = runtime();
    Ok(Some(match name {
        limit_count::NAME => Arc::new(LimitCount::compile(
            conf,
            owner,
            env.metadata.get(name),
            rt,
        )?) as Arc<dyn Plugin>,
        limit_req::NAME => Arc::new(LimitReq::compile(conf, owner, rt)?) as Arc<dyn Plugin>,
        limit_conn::NAME => Arc::new(LimitConn::compile(conf, owner, rt)?) as Arc<dyn Plugin>,
        prometheus::NAME => Arc::new(Prometheus::compile(conf, route, &rt.metrics)),
        public_api::NAME => Arc::new(PublicApi::compile(conf)),
        _ => return Ok(None),
    }))
}

/// APISIX's `run_policy = "prefer_route"`: the global rule's instance is skipped when the route
/// has its own.
pub fn prefers_route(name: &str) -> bool {
    name == prometheus::NAME
}

/// Plugins whose compiled form depends on the route they run for (global rules compile those
/// per route, the others once).
pub fn depends_on_route(name: &str) -> bool {
    name == prometheus::NAME
}
