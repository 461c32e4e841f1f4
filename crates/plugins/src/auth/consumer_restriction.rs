//! consumer-restriction (`apisix/plugins/consumer-restriction.lua`): once an auth plugin found
//! the consumer, lets through or refuses the request by its `type` (`consumer_name`, the
//! default, `consumer_group_id`, `service_id` or `route_id`): a `blacklist` refuses the listed
//! values, a `whitelist` refuses the others, `allowed_by_methods` limits a listed consumer to
//! its methods. A refusal answers `rejected_code` (403) with `{"message": rejected_msg}` or
//! "The <type> is forbidden."; a request without the value (no consumer) gets 401.

use std::sync::Arc;

use ferrisix_plugin_api::{CompileCtx, Exit, Phases, Plugin, PluginCtx, PluginDef, Step};
use ferrisix_router::VarSource;
use http::StatusCode;
use serde_json::{json, Value};

use crate::support::auth::message_exit;

pub const NAME: &str = "consumer-restriction";

pub static DEF: PluginDef = PluginDef::new(NAME, 2400, schema, compile);

fn schema() -> Value {
    let method = ferrisix_config::schema::schema_by_name("method_schema")
        .cloned()
        .unwrap_or_else(|| json!({"type": "string"}));
    json!({
        "type": "object",
        "properties": {
            "type": {
                "type": "string",
                "enum": ["consumer_name", "service_id", "route_id", "consumer_group_id"],
                "default": "consumer_name"
            },
            "blacklist": {"type": "array", "minItems": 1, "items": {"type": "string"}},
            "whitelist": {"type": "array", "minItems": 1, "items": {"type": "string"}},
            "allowed_by_methods": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "user": {"type": "string"},
                        "methods": {"type": "array", "minItems": 1, "items": method}
                    }
                }
            },
            "rejected_code": {"type": "integer", "minimum": 200, "default": 403},
            "rejected_msg": {"type": "string"}
        },
        "anyOf": [
            {"required": ["blacklist"]},
            {"required": ["whitelist"]},
            {"required": ["allowed_by_methods"]}
        ]
    })
}

#[derive(Debug)]
struct ConsumerRestriction {
    /// The variable the `type` names.
    var: &'static str,
    blacklist: Vec<String>,
    whitelist: Vec<String>,
    /// (user, methods); a user listed twice is decided by its first entry, as in APISIX.
    allowed_by_methods: Vec<(Option<String>, Vec<String>)>,
    rejection: Exit,
    /// The 401 for a request without the value.
    missing: Exit,
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let var = match conf.get("type").and_then(Value::as_str) {
        Some("service_id") => "service_id",
        Some("route_id") => "route_id",
        Some("consumer_group_id") => "consumer_group_id",
        _ => "consumer_name",
    };
    let code = conf
        .get("rejected_code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or("invalid rejected_code")?;
    let msg = match conf.get("rejected_msg").and_then(Value::as_str) {
        Some(m) => m.to_owned(),
        None => format!("The {var} is forbidden."),
    };
    let allowed_by_methods = conf
        .get("allowed_by_methods")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|entry| {
            (
                entry.get("user").and_then(Value::as_str).map(str::to_owned),
                strings(entry.get("methods")),
            )
        })
        .collect();
    Ok(Arc::new(ConsumerRestriction {
        var,
        blacklist: strings(conf.get("blacklist")),
        whitelist: strings(conf.get("whitelist")),
        allowed_by_methods,
        rejection: message_exit(code, &msg),
        missing: message_exit(
            StatusCode::UNAUTHORIZED,
            &format!("The request is rejected, please check the {var} for this request"),
        ),
    }))
}

impl ConsumerRestriction {
    fn method_allowed(&self, method: &str, user: &str) -> bool {
        match self
            .allowed_by_methods
            .iter()
            .find(|(u, _)| u.as_deref() == Some(user))
        {
            Some((_, methods)) => methods.iter().any(|m| m == method),
            None => true,
        }
    }
}

impl Plugin for ConsumerRestriction {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let Some(value) = ctx.var(self.var) else {
            return Step::exit(self.missing.clone());
        };
        if self.blacklist.iter().any(|b| *b == *value) {
            return Step::exit(self.rejection.clone());
        }
        let mut block = false;
        let mut whitelisted = false;
        if !self.whitelist.is_empty() {
            whitelisted = self.whitelist.iter().any(|w| *w == *value);
            block = !whitelisted;
        }
        if !self.allowed_by_methods.is_empty()
            && !whitelisted
            && !self.method_allowed(ctx.method().as_str(), &value)
        {
            block = true;
        }
        if block {
            Step::exit(self.rejection.clone())
        } else {
            Step::CONTINUE
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::{Consumer, Flow, RouteInfo};
    use http::Method;

    use super::*;
    use crate::testing::Compiler;

    fn run(conf: Value, method: Method, consumer: Option<(&str, Option<&str>)>) -> (u16, String) {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "cr", None)).unwrap();
        let mut req = TestRequest::new(method, "/").route(RouteInfo {
            id: "r1".into(),
            service_id: Some("s1".into()),
            ..Default::default()
        });
        let mut ctx = req.ctx();
        if let Some((name, group)) = consumer {
            ctx.attach_consumer(Arc::new(Consumer {
                username: name.into(),
                group_id: group.map(str::to_owned),
                ..Default::default()
            }));
        }
        let out = match p.access(&mut ctx) {
            Step::Done(Flow::Continue) => (200, String::new()),
            Step::Done(Flow::Exit(e)) => (
                e.status.as_u16(),
                String::from_utf8_lossy(e.body.as_deref().unwrap()).into_owned(),
            ),
            Step::Wait(_) => panic!("does not wait"),
        };
        out
    }

    #[test]
    fn lists_and_methods() {
        let white = json!({"whitelist": ["jack"]});
        assert_eq!(run(white.clone(), Method::GET, Some(("jack", None))).0, 200);
        assert_eq!(
            run(white.clone(), Method::GET, Some(("rose", None))),
            (
                403,
                "{\"message\":\"The consumer_name is forbidden.\"}\n".into()
            )
        );
        assert_eq!(
            run(white, Method::GET, None),
            (
                401,
                "{\"message\":\"The request is rejected, please check the consumer_name for this request\"}\n"
                    .into()
            )
        );
        let black = json!({"blacklist": ["jack"], "rejected_code": 429, "rejected_msg": "no"});
        assert_eq!(
            run(black.clone(), Method::GET, Some(("jack", None))),
            (429, "{\"message\":\"no\"}\n".into())
        );
        assert_eq!(run(black, Method::GET, Some(("rose", None))).0, 200);
        let methods = json!({"allowed_by_methods": [{"user": "jack", "methods": ["POST"]}]});
        assert_eq!(
            run(methods.clone(), Method::GET, Some(("jack", None))).0,
            403
        );
        assert_eq!(
            run(methods.clone(), Method::POST, Some(("jack", None))).0,
            200
        );
        assert_eq!(run(methods, Method::GET, Some(("rose", None))).0, 200);
        // A whitelisted consumer is not held to its methods.
        let both = json!({"whitelist": ["jack"],
            "allowed_by_methods": [{"user": "jack", "methods": ["POST"]}]});
        assert_eq!(run(both, Method::GET, Some(("jack", None))).0, 200);
    }

    #[test]
    fn other_types() {
        let route = json!({"type": "route_id", "whitelist": ["r2"]});
        assert_eq!(
            run(route, Method::GET, Some(("jack", None))),
            (403, "{\"message\":\"The route_id is forbidden.\"}\n".into())
        );
        let service = json!({"type": "service_id", "whitelist": ["s1"]});
        assert_eq!(run(service, Method::GET, None).0, 200);
        let group = json!({"type": "consumer_group_id", "blacklist": ["g1"]});
        assert_eq!(
            run(group.clone(), Method::GET, Some(("jack", Some("g1")))).0,
            403
        );
        assert_eq!(
            run(group.clone(), Method::GET, Some(("jack", Some("g2")))).0,
            200
        );
        assert_eq!(run(group, Method::GET, Some(("jack", None))).0, 401);
    }

    #[test]
    fn schema_needs_a_list() {
        let c = Compiler::new();
        assert!(c.registry.check(NAME, &json!({})).is_err());
        assert!(c.registry.check(NAME, &json!({"whitelist": []})).is_err());
        assert!(c
            .registry
            .check(
                NAME,
                &json!({"allowed_by_methods": [{"user": "a", "methods": ["NOPE"]}]})
            )
            .is_err());
        assert!(c
            .registry
            .check(NAME, &json!({"blacklist": ["a"], "rejected_code": 199}))
            .is_err());
    }
}
