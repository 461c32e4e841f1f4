//! graphql-limit-count (`apisix/plugins/graphql-limit-count.lua`): limit-count whose requests
//! are GraphQL queries, each charged its cost instead of 1. Only POST is served (405 otherwise);
//! the body is the query itself (`application/graphql`) or a JSON `{"query", "operationName",
//! "variables"}` (`application/json`), any other Content-Type is refused with 400. The cost is
//! the query's depth (`cost_strategy` `depth`, the default); `complexity` charges its node
//! count (every field weighs 1, as APISIX charges a route bound to no service or a service
//! without cost decorations) and `node_quantifier` 1. The cost is scaled by `score_factor`,
//! rounded up, at least 1, sent as `X-Graphql-Query-Cost` with `show_limit_quota_header`, and
//! charged to limit-count with every limit-count option (the counters are this conf's own).
//! A query costing more than `max_cost` (0: no limit) is refused with 403 after it was charged.
//!
//! Not built: the per-service cost decorations and the schema introspection they need
//! (`resolve_variables`, `introspection_endpoint` and `introspection_headers` are accepted
//! and have nothing to act on).

use std::sync::Arc;

use ferrisix_config::schema::{cjson, lua};
use ferrisix_plugin_api::{CheckCtx, CompileCtx, Flow, Phases, Plugin, PluginCtx, PluginDef, Step};
use http::{HeaderName, HeaderValue, Method, StatusCode};
use serde_json::Value;

use crate::support::auth::message_exit;
use crate::support::graphql::{self, Document, Selection};
use crate::support::limit::LimitCost;

pub const NAME: &str = "graphql-limit-count";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    encrypt_fields: &[
        "redis_password",
        "sentinel_password",
        "introspection_headers",
    ],
    ..PluginDef::new(NAME, 1004, schema, compile)
};

const QUERY_COST: HeaderName = HeaderName::from_static("x-graphql-query-cost");

fn limit_count() -> &'static PluginDef {
    crate::builtin()
        .find(|d| d.name == "limit-count")
        .expect("limit-count is built in")
}

fn schema() -> Value {
    let mut s = (limit_count().schema)();
    if let Some(props) = s.get_mut("properties").and_then(Value::as_object_mut) {
        let extra = serde_json::json!({
            "cost_strategy": {"type": "string",
                "enum": ["depth", "complexity", "node_quantifier"], "default": "depth"},
            "max_cost": {"type": "number", "minimum": 0, "default": 0},
            "score_factor": {"type": "number", "exclusiveMinimum": 0, "default": 1},
            "resolve_variables": {"type": "boolean", "default": true},
            "introspection_endpoint": {"type": "string", "pattern": "^https?://"},
            "introspection_headers": {"type": "object",
                "patternProperties": {"^[^:]+$": {"type": "string"}}}
        });
        if let Value::Object(extra) = extra {
            props.extend(extra);
        }
    }
    s
}

/// limit-count's own checks, on this conf.
fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    match limit_count().check {
        Some(check) => check(cx),
        None => Ok(()),
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Strategy {
    Depth,
    Complexity,
    NodeQuantifier,
}

struct GraphqlLimitCount {
    limit: Arc<dyn Plugin>,
    strategy: Strategy,
    max_cost: f64,
    score_factor: f64,
    show_cost: bool,
    /// config.yaml's `graphql.max_size`.
    max_size: usize,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let def = limit_count();
    let limit = (def.compile)(&CompileCtx {
        name: NAME,
        conf: cx.conf,
        owner: cx.owner,
        route: cx.route,
        metadata: cx.metadata,
        all_metadata: cx.all_metadata,
        services: cx.services,
        upstreams: cx.upstreams,
        apis: cx.apis,
        schema: cx.schema,
        protos: cx.protos,
    })?;
    Ok(Arc::new(GraphqlLimitCount {
        limit,
        strategy: match conf["cost_strategy"].as_str() {
            Some("complexity") => Strategy::Complexity,
            Some("node_quantifier") => Strategy::NodeQuantifier,
            _ => Strategy::Depth,
        },
        max_cost: conf["max_cost"].as_f64().unwrap_or(0.0),
        score_factor: conf["score_factor"].as_f64().unwrap_or(1.0),
        show_cost: conf["show_limit_quota_header"].as_bool().unwrap_or(true),
        max_size: cx.services.graphql_max_size(),
    }))
}

fn refuse(msg: &str) -> Flow {
    Flow::Exit(message_exit(StatusCode::BAD_REQUEST, msg))
}

/// Fields in a selection list, fragments expanded; `None` on a cycle of fragment spreads.
fn node_count(list: &[Selection], doc: &Document, visiting: &mut Vec<String>) -> Option<usize> {
    let mut n = 0;
    for s in list {
        n += match s {
            Selection::Field { selections, .. } => 1 + node_count(selections, doc, visiting)?,
            Selection::Inline(sel) => node_count(sel, doc, visiting)?,
            Selection::Spread(name) => {
                if visiting.contains(name) {
                    return None;
                }
                let frag = doc.definitions.iter().find_map(|d| match d {
                    graphql::Definition::Fragment {
                        name: f,
                        selections,
                    } if f == name => Some(selections),
                    _ => None,
                });
                match frag {
                    Some(sel) => {
                        visiting.push(name.clone());
                        let c = node_count(sel, doc, visiting);
                        visiting.pop();
                        c?
                    }
                    None => 0,
                }
            }
        };
    }
    Some(n)
}

impl GraphqlLimitCount {
    /// The query of the request, or the answer refusing it.
    async fn query(&self, ctx: &mut PluginCtx<'_>) -> Result<(String, Option<String>), Flow> {
        let body = match ctx.read_body(self.max_size).await {
            Ok(b) if !b.is_empty() => b.clone(),
            _ => {
                return Err(refuse(
                    "Invalid graphql request: can't get graphql request body",
                ))
            }
        };
        let content_type = ctx.header("content-type").unwrap_or("").to_owned();
        if content_type.starts_with("application/json") {
            let doc = cjson::decode(&body)
                .map_err(|e| refuse(&format!("invalid graphql request, {e}")))?;
            let query = match doc.get("query") {
                None | Some(Value::Null) => {
                    return Err(refuse("invalid graphql request, json body[query] is nil"))
                }
                Some(Value::String(q)) => q.clone(),
                // Not a text: it cannot parse.
                Some(_) => {
                    return Err(refuse(
                        "Invalid graphql request: failed to parse graphql query",
                    ))
                }
            };
            let op = doc
                .get("operationName")
                .and_then(Value::as_str)
                .map(str::to_owned);
            return Ok((query, op));
        }
        if content_type.starts_with("application/graphql") {
            return Ok((String::from_utf8_lossy(&body).into_owned(), None));
        }
        Err(refuse(&format!(
            "invalid graphql request, error content-type: {content_type}"
        )))
    }

    fn raw_cost(&self, doc: &Document, op: Option<&str>) -> Result<f64, Flow> {
        let mut ops: Vec<_> = doc.operations().collect();
        if ops.is_empty() {
            return Err(refuse("Invalid graphql request: empty graphql query"));
        }
        if let Some(name) = op {
            if ops.len() > 1 {
                if let Some(one) = ops.iter().find(|(n, _)| *n == Some(name)).copied() {
                    ops = vec![one];
                }
            }
        }
        let cycle = || refuse("Invalid graphql request: fragment spreads must not form cycles");
        let mut cost = 0usize;
        for (_, sel) in ops {
            let c = match self.strategy {
                Strategy::Depth => doc.depth(sel),
                Strategy::Complexity => node_count(sel, doc, &mut Vec::new()),
                Strategy::NodeQuantifier => node_count(sel, doc, &mut Vec::new()).map(|_| 1),
            }
            .ok_or_else(cycle)?;
            cost = cost.max(c);
        }
        let mut raw = cost.max(1) as f64;
        if self.strategy != Strategy::Depth {
            raw += 0.01;
        }
        Ok(raw)
    }

    async fn run(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        if *ctx.method() != Method::POST {
            return Flow::Exit(ferrisix_plugin_api::Exit::status(
                StatusCode::METHOD_NOT_ALLOWED,
            ));
        }
        let (query, op) = match self.query(ctx).await {
            Ok(q) => q,
            Err(f) => return f,
        };
        let doc = match graphql::parse(&query) {
            Ok(d) => d,
            Err(_) if graphql::is_blank(&query) => {
                tracing::error!("failed to parse graphql: empty query");
                return refuse("Invalid graphql request: empty graphql query");
            }
            Err(e) => {
                tracing::error!("failed to parse graphql: {e}");
                return refuse("Invalid graphql request: failed to parse graphql query");
            }
        };
        let raw = match self.raw_cost(&doc, op.as_deref()) {
            Ok(c) => c,
            Err(f) => return f,
        };
        let cost = (raw * self.score_factor).ceil().max(1.0);
        let units = cost as u64;
        if self.show_cost {
            ctx.response_headers_mut()
                .insert(QUERY_COST, HeaderValue::from(units));
        }
        ctx.insert(LimitCost(units));
        let flow = match self.limit.access(ctx) {
            Step::Done(f) => f,
            Step::Wait(fut) => fut.await,
        };
        // The cost was this call's alone: a limit-count of the route counts 1 again.
        ctx.insert(LimitCost(1));
        if let Flow::Exit(e) = &flow {
            if e.status == StatusCode::INTERNAL_SERVER_ERROR {
                return flow;
            }
        }
        if self.max_cost > 0.0 && cost > self.max_cost {
            return Flow::Exit(message_exit(
                StatusCode::FORBIDDEN,
                &format!(
                    "Invalid graphql request: query cost {} exceeds max_cost {}",
                    lua::number(cost),
                    lua::number(self.max_cost)
                ),
            ));
        }
        flow
    }
}

impl Plugin for GraphqlLimitCount {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.run(ctx)))
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_plugin_api::testing::TestRequest;
    use serde_json::json;

    use super::*;
    use crate::testing::Compiler;
    use ferrisix_config::validate::PluginCheck;

    async fn status(p: &Arc<dyn Plugin>, mut req: TestRequest) -> (u16, String, Option<String>) {
        let flow = match p.access(&mut req.ctx()) {
            Step::Done(f) => f,
            Step::Wait(fut) => fut.await,
        };
        let remaining = req
            .state
            .response_headers()
            .get("x-ratelimit-remaining")
            .map(|v| v.to_str().unwrap().to_owned());
        match flow {
            Flow::Continue => (200, String::new(), remaining),
            Flow::Exit(e) => (
                e.status.as_u16(),
                String::from_utf8_lossy(e.body.as_deref().unwrap_or_default()).into_owned(),
                remaining,
            ),
        }
    }

    #[tokio::test]
    async fn charges_the_depth() {
        let c = Compiler::new();
        let conf = json!({"count": 5, "time_window": 60, "rejected_code": 503});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "glc", None)).unwrap();
        let gql =
            |b: &str| TestRequest::post("/g", b).header("content-type", "application/graphql");
        assert_eq!(status(&p, TestRequest::get("/g")).await.0, 405);
        let (code, body, _) = status(
            &p,
            TestRequest::post("/g", "{ a }").header("content-type", "text/plain"),
        )
        .await;
        assert_eq!(
            (code, body.as_str()),
            (
                400,
                "{\"message\":\"invalid graphql request, error content-type: text/plain\"}\n"
            )
        );
        assert_eq!(
            status(&p, gql("{ a { b } }")).await,
            (200, String::new(), Some("3".into()))
        );
        let json_req = TestRequest::post("/g", "{\"query\": \"query { a { b { c } } }\"}")
            .header("content-type", "application/json");
        assert_eq!(status(&p, json_req).await.2.as_deref(), Some("0"));
        assert_eq!(status(&p, gql("{ x }")).await.0, 503);
        assert_eq!(status(&p, gql("{ x")).await.0, 400);
    }

    #[tokio::test]
    async fn max_cost_refuses_after_charging() {
        let c = Compiler::new();
        let conf = json!({"count": 100, "time_window": 60, "max_cost": 2,
                          "cost_strategy": "complexity"});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "glc2", None)).unwrap();
        let req =
            TestRequest::post("/g", "{ a { b } }").header("content-type", "application/graphql");
        let (code, body, _) = status(&p, req).await;
        assert_eq!(code, 403);
        assert!(body.contains("query cost 3 exceeds max_cost 2"), "{body}");
    }

    #[test]
    fn confs() {
        let c = Compiler::new();
        let r = &c.registry;
        assert!(r
            .check(NAME, &json!({"count": 1, "time_window": 1}))
            .is_ok());
        assert!(r
            .check(
                NAME,
                &json!({"count": 1, "time_window": 1, "cost_strategy": "x"})
            )
            .is_err());
    }
}
