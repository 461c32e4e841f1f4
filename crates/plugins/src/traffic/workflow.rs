//! workflow (`apisix/plugins/workflow.lua`): `rules`, each a `case` (a lua-resty-expr rule
//! list; a rule without one always matches) and `actions`. In the access phase the first rule
//! whose case matches runs its first action, and no later rule is looked at:
//! - `["return", {"code": N}]` answers N with `{"error_msg":"rejected by workflow"}`;
//! - `["limit-count", conf]` and `["limit-conn", conf]` run that plugin with that conf, the
//!   counters of each rule's action kept apart from every other rule's and from the route's
//!   own limit plugins.
//!
//! Every action of every rule is checked when the conf is written (APISIX's `check_schema`),
//! with the action plugin's own schema and checks. The action plugins are compiled from the
//! catalog of built-in definitions, never by importing their modules. As in APISIX, a `case`
//! that lua-resty-expr cannot compile is not refused; its rule then matches every request.

use std::sync::Arc;

use ferrisix_config::schema;
use ferrisix_config::vars::compile_vars;
use ferrisix_plugin_api::{CheckCtx, CompileCtx, Exit, Phases, Plugin, PluginCtx, PluginDef, Step};
use ferrisix_router::Expr;
use http::StatusCode;
use serde_json::{json, Value};

pub const NAME: &str = "workflow";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    ..PluginDef::new(NAME, 1006, schema, compile)
};

/// The plugins an action may name besides `return`.
const PLUGIN_ACTIONS: [&str; 2] = ["limit-count", "limit-conn"];

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "rules": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "case": {
                            "type": "array",
                            "items": {"anyOf": [{"type": "array"}, {"type": "string"}]},
                            "minItems": 1
                        },
                        "actions": {
                            "type": "array",
                            "items": {"type": "array", "minItems": 1}
                        }
                    },
                    "required": ["actions"]
                }
            }
        },
        "required": ["rules"]
    })
}

fn return_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"code": {"type": "integer", "minimum": 100, "maximum": 599}},
        "required": ["code"]
    })
}

fn rules(conf: &Value) -> impl Iterator<Item = &Value> {
    conf.get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn actions(rule: &Value) -> impl Iterator<Item = &Vec<Value>> {
    rule.get("actions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_array)
}

/// The definition of a plugin action, from the catalog.
fn action_def(name: &str) -> Option<&'static PluginDef> {
    if !PLUGIN_ACTIONS.contains(&name) {
        return None;
    }
    crate::builtin().find(|d| d.name == name)
}

/// The action's conf as its plugin sees it: `_vid` (the rule's index) keeps each rule's
/// counters apart, as APISIX's does.
fn action_conf(conf: Option<&Value>, idx: usize) -> Value {
    let mut c = conf.cloned().unwrap_or_else(|| json!({}));
    if let Value::Object(m) = &mut c {
        m.insert("_vid".into(), json!(idx));
    }
    c
}

fn check_action(cx: &CheckCtx<'_>, action: &[Value]) -> Result<(), String> {
    let name = match action.first() {
        Some(Value::String(s)) => s.as_str(),
        Some(other) => return Err(format!("unsupported action: {other}")),
        None => return Ok(()),
    };
    let conf = action.get(1).cloned().unwrap_or(Value::Null);
    let verdict = if name == "return" {
        schema::validate(&return_schema(), &conf)
    } else if let Some(def) = action_def(name) {
        if conf.get("group").is_some() && name == "limit-count" {
            Err("group is not supported".to_string())
        } else {
            let schema = (def.schema)();
            def.verdict(&CheckCtx {
                conf: &conf,
                schema: &schema,
                services: cx.services,
                now: cx.now,
                consumer: false,
            })
        }
    } else {
        return Err(format!("unsupported action: {name}"));
    };
    verdict.map_err(|e| format!("failed to validate the '{name}' action: {e}"))
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    for rule in rules(cx.conf) {
        for action in actions(rule) {
            check_action(cx, action)?;
        }
    }
    Ok(())
}

enum Action {
    Return(Exit),
    Plugin(Arc<dyn Plugin>),
}

struct Rule {
    /// `None`: the rule matches every request.
    case: Option<Expr>,
    action: Action,
}

struct Workflow {
    rules: Vec<Rule>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let mut compiled = Vec::new();
    for (i, rule) in rules(cx.conf).enumerate() {
        let case = rule.get("case").and_then(|c| compile_vars(c).ok());
        // Only the first action runs.
        let Some(action) = actions(rule).next() else {
            continue;
        };
        let name = action.first().and_then(Value::as_str).unwrap_or("");
        let action = if name == "return" {
            let code = action
                .get(1)
                .and_then(|c| c.get("code"))
                .and_then(Value::as_u64)
                .and_then(|c| u16::try_from(c).ok())
                .and_then(|c| StatusCode::from_u16(c).ok())
                .ok_or("invalid return code")?;
            Action::Return(Exit::error_msg(code, "rejected by workflow"))
        } else {
            let def = action_def(name).ok_or_else(|| format!("unsupported action: {name}"))?;
            let schema = (def.schema)();
            let conf = action_conf(action.get(1), i + 1);
            let plugin = (def.compile)(&CompileCtx {
                name: def.name,
                conf: &conf,
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
            Action::Plugin(plugin)
        };
        compiled.push(Rule { case, action });
    }
    Ok(Arc::new(Workflow { rules: compiled }))
}

impl Plugin for Workflow {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let hit = self
            .rules
            .iter()
            .find(|r| r.case.as_ref().is_none_or(|e| e.eval(&*ctx)));
        match hit.map(|r| &r.action) {
            None => Step::CONTINUE,
            Some(Action::Return(exit)) => Step::exit(exit.clone()),
            Some(Action::Plugin(p)) => p.access(ctx),
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::Flow;

    use super::*;
    use crate::testing::Compiler;
    use ferrisix_config::validate::PluginCheck;

    fn exit_of(p: &Arc<dyn Plugin>, uri: &str) -> Option<u16> {
        let mut req = TestRequest::get(uri);
        let mut ctx = req.ctx();
        let step = p.access(&mut ctx);
        match step {
            Step::Done(Flow::Exit(e)) => Some(e.status.as_u16()),
            Step::Done(Flow::Continue) => None,
            Step::Wait(_) => panic!("local actions decide at once"),
        }
    }

    #[test]
    fn first_matching_rule_wins() {
        let conf = json!({"rules": [
            {"case": [["arg_block", "==", "1"]], "actions": [["return", {"code": 451}]]},
            {"case": [["uri", "==", "/a"], ["arg_foo", "==", "bar"]],
             "actions": [["return", {"code": 403}]]},
        ]});
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "wf", None)).unwrap();
        assert_eq!(exit_of(&p, "/a?foo=bar"), Some(403));
        assert_eq!(exit_of(&p, "/a?foo=bar&block=1"), Some(451));
        assert_eq!(exit_of(&p, "/a?foo=baz"), None);
    }

    #[test]
    fn limit_count_actions_count_apart() {
        let conf = json!({"rules": [
            {"case": [["uri", "==", "/a"]],
             "actions": [["limit-count", {"count": 1, "time_window": 60}]]},
            {"case": [["uri", "==", "/b"]],
             "actions": [["limit-count", {"count": 1, "time_window": 60}]]},
        ]});
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "wf2", None)).unwrap();
        assert_eq!(exit_of(&p, "/a"), None);
        assert_eq!(exit_of(&p, "/b"), None, "rule 2 counts on its own");
        assert_eq!(exit_of(&p, "/a"), Some(503));
        assert_eq!(exit_of(&p, "/c"), None);
    }

    #[test]
    fn bad_confs() {
        let c = Compiler::new();
        let r = &c.registry;
        let err = |c: Value| r.check(NAME, &c).unwrap_err();
        let rule = |a: Value| json!({"rules": [{"case": [["uri", "==", "/"]], "actions": [a]}]});
        assert!(err(rule(json!(["fake", {}]))).ends_with("unsupported action: fake"));
        assert!(err(rule(json!(["return", {"status": 403}])))
            .ends_with("failed to validate the 'return' action: property \"code\" is required"));
        assert!(err(rule(json!(["limit-count", {"count": 2}]))).ends_with(
            "failed to validate the 'limit-count' action: value should match only one schema, \
             but matches none"
        ));
        assert!(r
            .check(
                NAME,
                &rule(json!(["limit-conn", {"conn": 1, "burst": 0,
            "default_conn_delay": 0.1, "key": "remote_addr"}]))
            )
            .is_ok());
    }
}
