//! traffic-label (`apisix/plugins/traffic-label.lua`): labels requests with headers, for
//! plugins that run after it (traffic-split) and the upstream. `rules` are tried in order;
//! a rule's `match` (a lua-resty-expr rule list; none matches every request) selects it, and
//! one of its `actions` is picked by weighted round robin over their `weight`s (1 by default).
//! An action's `set_headers` sets request headers (each value may hold `$var`s, as
//! proxy-rewrite's), and no later rule is tried; an action of weight alone changes nothing and
//! lets the following rules be tried, as in APISIX.

use std::sync::Arc;

use ferrisix_config::schema::lua;
use ferrisix_config::vars::compile_vars;
use ferrisix_plugin_api::roundrobin::InterleavedWrr;
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, Lease, Phases, Plugin, PluginCtx, PluginDef, Retain, StateMap, Step,
};
use ferrisix_router::Expr;
use http::HeaderName;
use serde_json::{json, Value};

use crate::support::headers::{self, ValueTemplate};

pub const NAME: &str = "traffic-label";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    ..PluginDef::new(NAME, 967, schema, compile)
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "rules": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "match": {
                            "type": "array",
                            "items": {"anyOf": [{"type": "array"}, {"type": "string"}]},
                            "minItems": 1
                        },
                        "actions": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "set_headers": {
                                        "description": "new headers for request",
                                        "type": "object",
                                        "minProperties": 1
                                    },
                                    "weight": {"type": "integer", "default": 1, "minimum": 1}
                                }
                            },
                            "minItems": 1
                        }
                    },
                    "required": ["actions"]
                },
                "minItems": 1
            }
        },
        "required": ["rules"]
    })
}

fn rules(conf: &Value) -> impl Iterator<Item = &Value> {
    conf.get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn actions(rule: &Value) -> impl Iterator<Item = &serde_json::Map<String, Value>> {
    rule.get("actions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
}

fn compile_match(rule: &Value) -> Result<Expr, String> {
    compile_vars(rule.get("match").unwrap_or(&json!([])))
}

/// `set_headers` as proxy-rewrite checks its flat `headers`.
fn check_set_headers(cx: &CheckCtx<'_>, conf: &Value) -> Result<(), String> {
    let def = crate::builtin()
        .find(|d| d.name == "proxy-rewrite")
        .ok_or("proxy-rewrite is not built in")?;
    let schema = (def.schema)();
    let conf = json!({ "headers": conf });
    def.verdict(&CheckCtx {
        conf: &conf,
        schema: &schema,
        services: cx.services,
        now: cx.now,
        consumer: false,
    })
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    for rule in rules(cx.conf) {
        compile_match(rule).map_err(|e| {
            let m = rule
                .get("match")
                .map_or("{}".to_string(), lua::cjson_encode);
            let e = e.trim_start_matches("failed to validate the 'vars' expression: ");
            format!("failed to validate the 'match' expression: {m} err: {e}")
        })?;
        for action in actions(rule) {
            for (name, conf) in action {
                match name.as_str() {
                    "weight" => {}
                    "set_headers" => check_set_headers(cx, conf)
                        .map_err(|e| format!("failed to validate the 'set_headers' action: {e}"))?,
                    other => return Err(format!("not supported action: {other}")),
                }
            }
        }
    }
    Ok(())
}

/// One action: the headers it sets (`None`: a weight alone).
type Action = Option<Vec<(HeaderName, ValueTemplate)>>;

struct Rule {
    matches: Expr,
    actions: Vec<Action>,
    picker: usize,
}

/// The pickers of one conf, one per rule, kept across snapshots while the conf is unchanged.
struct Pickers(Vec<InterleavedWrr>);

impl Retain for Pickers {}

struct TrafficLabel {
    rules: Vec<Rule>,
    pickers: Lease<Pickers>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let mut compiled = Vec::new();
    let mut weights = Vec::new();
    for rule in rules(&conf) {
        let matches = compile_match(rule)?;
        let mut list = Vec::new();
        let mut w = Vec::new();
        for action in actions(rule) {
            let weight = action.get("weight").and_then(Value::as_u64).unwrap_or(1);
            w.push(u32::try_from(weight).unwrap_or(u32::MAX));
            list.push(
                action
                    .get("set_headers")
                    .and_then(Value::as_object)
                    .map(|h| {
                        h.iter()
                            .filter_map(|(field, value)| {
                                let name = headers::name(field, NAME)?;
                                Some((name, ValueTemplate::new(&headers::value_text(value)?)))
                            })
                            .collect()
                    }),
            );
        }
        compiled.push(Rule {
            matches,
            actions: list,
            picker: weights.len(),
        });
        weights.push(w);
    }
    let pickers = cx
        .services
        .shared::<StateMap<Pickers>>()
        .lease(&cx.state_key(), || {
            Pickers(
                weights
                    .into_iter()
                    .map(|w| InterleavedWrr::new(w, None))
                    .collect(),
            )
        });
    Ok(Arc::new(TrafficLabel {
        rules: compiled,
        pickers,
    }))
}

impl Plugin for TrafficLabel {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        for rule in &self.rules {
            if !rule.matches.eval(&*ctx) {
                continue;
            }
            let Some(i) = self.pickers.0[rule.picker].next() else {
                continue;
            };
            if let Some(Some(set)) = rule.actions.get(i) {
                let values: Vec<_> = set
                    .iter()
                    .filter_map(|(name, t)| Some((name, t.header_value(&*ctx, NAME, name)?)))
                    .collect();
                let h = ctx.headers_mut();
                for (name, value) in values {
                    h.insert(name.clone(), value);
                }
                return Step::CONTINUE;
            }
        }
        Step::CONTINUE
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_plugin_api::testing::TestRequest;

    use super::*;
    use crate::testing::Compiler;
    use ferrisix_config::validate::PluginCheck;

    fn label(p: &Arc<dyn Plugin>, uri: &str) -> Option<String> {
        let mut req = TestRequest::get(uri).header("x-id", "100");
        let _ = p.access(&mut req.ctx());
        let v = req
            .headers
            .get("x-id")
            .map(|v| v.to_str().unwrap().to_owned());
        v
    }

    #[test]
    fn first_matching_rule_sets_headers() {
        let conf = json!({"rules": [
            {"match": [["arg_env", "==", "dev"]],
             "actions": [{"set_headers": {"X-Id": "200", "X-Client": "$remote_addr"}}]},
            {"match": [["arg_env", "~~", "^d"]], "actions": [{"set_headers": {"X-Id": "300"}}]},
        ]});
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "tl", None)).unwrap();
        assert_eq!(label(&p, "/?env=dev").as_deref(), Some("200"));
        assert_eq!(label(&p, "/?env=demo").as_deref(), Some("300"));
        assert_eq!(label(&p, "/?env=prod").as_deref(), Some("100"));
        let mut req = TestRequest::get("/?env=dev");
        let _ = p.access(&mut req.ctx());
        assert_eq!(req.headers["x-client"], "127.0.0.1");
    }

    #[test]
    fn weighted_actions() {
        let conf = json!({"rules": [
            {"actions": [{"set_headers": {"X-Id": "canary"}, "weight": 1}, {"weight": 3}]},
        ]});
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "tl2", None)).unwrap();
        let canary = (0..8)
            .filter(|_| label(&p, "/").as_deref() == Some("canary"))
            .count();
        assert_eq!(canary, 2);
    }

    #[test]
    fn bad_confs() {
        let c = Compiler::new();
        let r = &c.registry;
        let err = |c: Value| r.check(NAME, &c).unwrap_err();
        assert!(
            err(json!({"rules": [{"actions": [{"go": 1}]}]})).ends_with("not supported action: go")
        );
        assert!(
            err(json!({"rules": [{"actions": [{"set_headers": {"X A": "1"}}]}]}))
                .contains("failed to validate the 'set_headers' action: ")
        );
        assert!(
            err(json!({"rules": [{"match": [["a", "=", "1"]], "actions": [{"weight": 1}]}]}))
                .contains("failed to validate the 'match' expression: ")
        );
    }
}
