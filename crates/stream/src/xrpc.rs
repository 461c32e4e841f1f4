//! xRPC on stream routes (APISIX's `apisix/stream/xrpc`): a route with `protocol` has its
//! TCP session read as that protocol's requests instead of relayed byte for byte, each
//! request logged (`protocol.logger`) and counted (`protocol.metric`) on its own.
//!
//! - `redis`: RESP commands from the client, pipelined or not, each passed to the upstream
//!   (after `conf.faults`' delay when one matches) and its reply back in order (`redis`,
//!   with the codec in `resp` and the key table in `commands`).
//! - A route with `protocol.superior_id` is a subordinate route: never matched at the entry
//!   (`table`); the redis protocol routes no request to a subordinate route, as in APISIX.
//! - `protocol.logger`: per finished request, each logger whose `filter` (a `vars`
//!   expression over the connection's variables, `rpc_time` and `redis_cmd_line`) passes
//!   runs its stream plugin's log with `conf`. syslog is the stream logger ferrisix has.
//! - `protocol.metric.enable`: with the stream `prometheus` plugin enabled, the protocol's
//!   metrics (`apisix_redis_commands_total`, `apisix_redis_commands_latency_seconds`).

mod commands;
pub mod redis;
mod resp;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{LogCtx, LogVars, Plugin, VarNames};
use ferrisix_plugins::observe::prometheus::Metrics;
use ferrisix_router::{Expr, VarSource};
use serde_json::Value;

use crate::vars::ConnVars;
use crate::StreamEnv;

/// A stream route's compiled `protocol`.
pub struct XrpcRoute {
    pub route_id: String,
    faults: Option<resp::Faults>,
    loggers: Vec<XrpcLogger>,
    /// The protocol's metrics, when `metric.enable` and the stream prometheus plugin are on.
    metrics: Option<Arc<Metrics>>,
}

/// One `protocol.logger` entry.
struct XrpcLogger {
    /// `None`: no filter, every request is logged.
    filter: Option<Expr>,
    plugin: Arc<dyn Plugin>,
    vars: Option<VarNames>,
}

impl XrpcRoute {
    /// `protocol` of stream route `route_id`, already checked (`ferrisix_config::xrpc`).
    pub fn compile(route_id: &str, protocol: &Value, env: &StreamEnv) -> XrpcRoute {
        let mut loggers = Vec::new();
        for item in protocol
            .get("logger")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let name = item.get("name").and_then(Value::as_str).unwrap_or("");
            // APISIX checks neither the logger's name nor its conf when the route is
            // stored: a logger that cannot run is reported and skipped, the route serves.
            if name != "syslog" {
                tracing::error!(stream_route = %route_id, "failed to load plugin [{name}]: xRPC loggers are stream plugins with a log phase (syslog)");
                continue;
            }
            let filter = match item.get("filter").and_then(Value::as_array) {
                Some(f) if !f.is_empty() => {
                    match ferrisix_config::vars::compile_vars(&Value::Array(f.clone())) {
                        Ok(e) => Some(e),
                        Err(e) => {
                            tracing::error!(stream_route = %route_id, "failed to validate the 'filter' expression: {e}");
                            continue;
                        }
                    }
                }
                _ => None,
            };
            let conf = item
                .get("conf")
                .cloned()
                .unwrap_or(Value::Object(Default::default()));
            match crate::plugins::compile_syslog(route_id, conf, env) {
                Ok((plugin, vars)) => loggers.push(XrpcLogger {
                    filter,
                    plugin,
                    vars,
                }),
                Err(e) => {
                    tracing::error!(stream_route = %route_id, "xRPC logger syslog: {e}");
                }
            }
        }
        let metric_on = protocol
            .get("metric")
            .and_then(|m| m.get("enable"))
            .and_then(Value::as_bool)
            == Some(true);
        let metrics = (metric_on && env.plugins.priority("prometheus").is_some())
            .then(|| env.services.shared::<Metrics>());
        XrpcRoute {
            route_id: route_id.to_string(),
            faults: resp::Faults::compile(protocol.get("conf")),
            loggers,
            metrics,
        }
    }

    /// The end of one request: its loggers, then its metrics. `series` keeps the session's
    /// metric series by command, so the exporter's map is looked up once per command name
    /// in a session.
    fn finish(
        &self,
        cmd: &resp::Command,
        rpc_time: Duration,
        conn: &ConnVars,
        series: &mut SessionSeries,
    ) {
        if !self.loggers.is_empty() {
            let vars = RequestVars {
                conn,
                rpc_time,
                cmd,
            };
            for l in &self.loggers {
                if l.filter.as_ref().is_none_or(|f| f.eval(&vars)) {
                    let ctx = LogCtx {
                        status: 200,
                        request_time: rpc_time,
                        vars: l
                            .vars
                            .clone()
                            .map(|n| LogVars::capture(n, &vars))
                            .unwrap_or_default(),
                        ..LogCtx::default()
                    };
                    l.plugin.log(&ctx);
                }
            }
        }
        if let Some(m) = &self.metrics {
            series
                .entry(cmd.cmd.clone())
                .or_insert_with(|| m.redis_command(&self.route_id, &cmd.cmd))
                .observe(rpc_time);
        }
    }
}

/// A session's metric series by command.
type SessionSeries = std::collections::HashMap<
    String,
    Arc<ferrisix_plugins::observe::prometheus::RedisCommandSeries>,
>;

/// The variables of one request: the connection's, with `rpc_time` (seconds from the
/// request read to its reply) and `redis_cmd_line`.
struct RequestVars<'a> {
    conn: &'a ConnVars,
    rpc_time: Duration,
    cmd: &'a resp::Command,
}

impl VarSource for RequestVars<'_> {
    fn var(&self, name: &str) -> Option<Cow<'_, str>> {
        match name {
            "rpc_time" => Some(Cow::Owned(lua::number(self.rpc_time.as_secs_f64()))),
            "redis_cmd_line" => Some(Cow::Owned(self.cmd.cmd_line.join(" "))),
            other => self.conn.var(other),
        }
    }
}
