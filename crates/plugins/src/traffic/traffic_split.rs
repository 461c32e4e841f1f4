//! traffic-split (`apisix/plugins/traffic-split.lua`): the first rule whose `match` passes
//! (any of its `vars` expressions; a rule without `match` always passes) picks one of its
//! `weighted_upstreams` by `resty.roundrobin`: an `upstream_id`, an inline `upstream`, or,
//! for an entry with only a weight, the route's own upstream.
//!
//! Each rule's picker lives as long as the conf (APISIX's lrucache keyed by the rule's table),
//! so a recompile of an unchanged conf (an upstream it names changed) carries the sequence on.
//! An `upstream_id` that names no upstream answers 500 with APISIX's message on the requests
//! that rule takes; the snapshot compiles the route again when that upstream appears.
//!
//! A `match` naming `post_arg_*` reads a form body first (APISIX's `ctx.var` reads it on the
//! first such variable), up to [`FORM_LIMIT`].

use std::sync::Arc;

use ferrisix_config::schema::defs;
use ferrisix_config::vars::compile_vars;
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, Exit, Flow, Lease, Phases, Plugin, PluginCtx, PluginDef, Retain,
    StateMap, Step, UpstreamRef,
};
use ferrisix_router::Expr;
use http::StatusCode;
use serde_json::{json, Value};

use ferrisix_plugin_api::roundrobin::InterleavedWrr;

pub const NAME: &str = "traffic-split";

/// The largest form body whose fields `post_arg_*` sees: nginx's default
/// `client_body_buffer_size` on x86-64, past which it spools the body to a file and
/// `ngx.req.get_post_args` gives no fields.
const FORM_LIMIT: usize = 8 * 1024;

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    ..PluginDef::new(NAME, 966, schema, compile)
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
                            "items": {
                                "type": "object",
                                "properties": {"vars": {"type": "array"}}
                            }
                        },
                        "weighted_upstreams": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "upstream_id": defs::id(),
                                    "upstream": defs::upstream(),
                                    "weight": {
                                        "description": "used to split traffic between different\
                                            upstreams for plugin configuration",
                                        "type": "integer",
                                        "default": 1,
                                        "minimum": 0
                                    }
                                }
                            },
                            "default": [{"weight": 1}],
                            "minItems": 1,
                            "maxItems": 20
                        }
                    }
                }
            }
        }
    })
}

/// Whether a `match` compares a `post_arg_*` variable in one of its `vars` (a comparison is
/// an array whose first item names the variable; logical operators nest them).
fn names_post_arg(v: &Value) -> bool {
    match v {
        Value::Array(items) => {
            items
                .first()
                .and_then(Value::as_str)
                .is_some_and(|name| name.starts_with("post_arg_"))
                || items.iter().any(names_post_arg)
        }
        Value::Object(m) => m.values().any(names_post_arg),
        _ => false,
    }
}

/// The rules' `match[].vars`, compiled.
fn rule_matches(rule: &Value) -> Result<Option<Vec<Expr>>, String> {
    let Some(matches) = rule.get("match").and_then(Value::as_array) else {
        return Ok(None);
    };
    matches
        .iter()
        .map(|m| compile_vars(m.get("vars").unwrap_or(&Value::Array(Vec::new()))))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    for rule in cx
        .conf
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        rule_matches(rule)?;
    }
    Ok(())
}

/// Where one weighted entry sends the request.
#[derive(Debug)]
enum Target {
    /// The route's own upstream.
    Route,
    Upstream(UpstreamRef),
    /// An `upstream_id` naming no upstream, or an inline upstream that did not compile.
    Broken(String),
}

#[derive(Debug)]
struct Rule {
    /// `None`: no `match`, the rule always passes.
    matches: Option<Vec<Expr>>,
    targets: Vec<Target>,
    /// Index of this rule's picker in the conf's state.
    picker: usize,
}

/// The pickers of one conf, one per rule with weighted upstreams.
struct Pickers(Vec<InterleavedWrr>);

impl Retain for Pickers {}

struct TrafficSplit {
    rules: Vec<Rule>,
    pickers: Lease<Pickers>,
    /// A `match` names `post_arg_*`: a form body is read before the rules are matched.
    reads_form: bool,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let filled = cx.filled();
    let reads_form = filled
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|rule| rule.get("match"))
        .any(names_post_arg);
    let mut rules = Vec::new();
    let mut weights = Vec::new();
    for (r, rule) in filled
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let matches = rule_matches(rule)?;
        let mut targets = Vec::new();
        let mut rule_weights = Vec::new();
        for (i, entry) in rule
            .get("weighted_upstreams")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let target = if let Some(id) = entry.get("upstream_id") {
                let id = match id {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                match cx.upstreams.upstream_by_id(&id) {
                    Ok(u) => Target::Upstream(u),
                    Err(_) => Target::Broken(format!(
                        "failed to fetch upstream info by upstream id: {id}"
                    )),
                }
            } else if let Some(up) = entry.get("upstream") {
                // APISIX's resource path for a plugin's upstream (healthcheck_manager.lua).
                let key = format!(
                    "{}#plugins['{NAME}'].rules[{r}].weighted_upstreams[{i}].upstream",
                    cx.owner.key
                );
                match cx.upstreams.compile_inline_upstream(&key, up) {
                    Ok(u) => Target::Upstream(u),
                    Err(e) => {
                        tracing::error!(route = %cx.owner.key, entry = i + 1, error = %e,
                            "traffic-split: failed to validate generated upstream");
                        Target::Broken(e)
                    }
                }
            } else {
                Target::Route
            };
            let weight = entry.get("weight").and_then(Value::as_u64).unwrap_or(1);
            rule_weights.push(u32::try_from(weight).unwrap_or(u32::MAX));
            targets.push(target);
        }
        rules.push(Rule {
            matches,
            targets,
            picker: weights.len(),
        });
        weights.push(rule_weights);
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
    Ok(Arc::new(TrafficSplit {
        rules,
        pickers,
        reads_form,
    }))
}

impl TrafficSplit {
    fn pick(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        // As APISIX: every rule's upstream_ids are checked before any rule is matched.
        for rule in &self.rules {
            for t in &rule.targets {
                if let Target::Broken(e) = t {
                    if e.starts_with("failed to fetch upstream info") {
                        return Flow::Exit(Exit::body(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            e.clone(),
                        ));
                    }
                }
            }
        }
        let Some(rule) = self.rules.iter().find(|r| match &r.matches {
            None => true,
            Some(m) => m.iter().any(|e| e.eval(&*ctx)),
        }) else {
            return Flow::Continue;
        };
        let picked = self.pickers.0[rule.picker]
            .next()
            .and_then(|i| rule.targets.get(i));
        match picked {
            Some(Target::Upstream(u)) => ctx.choose_upstream(u.clone()),
            Some(Target::Broken(e)) => {
                return Flow::Exit(Exit::body(StatusCode::INTERNAL_SERVER_ERROR, e.clone()))
            }
            Some(Target::Route) | None => {}
        }
        Flow::Continue
    }
}

impl Plugin for TrafficSplit {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        if self.reads_form && ctx.has_form_body() && ctx.body().is_none() {
            return Step::Wait(Box::pin(async move {
                // A body past the limit, or one that fails, has no fields here (the body is
                // still forwarded, and a failed one answered by the proxy).
                let _ = ctx.read_body(FORM_LIMIT).await;
                self.pick(ctx)
            }));
        }
        Step::Done(self.pick(ctx))
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::UpstreamResolver;

    use super::*;
    use crate::testing::Compiler;

    /// Upstreams by id "a" and "b"; inline ones are numbered as compiled.
    struct Ups {
        a: UpstreamRef,
        b: UpstreamRef,
    }

    impl UpstreamResolver for Ups {
        fn upstream_by_id(&self, id: &str) -> Result<UpstreamRef, String> {
            match id {
                "a" => Ok(self.a.clone()),
                "b" => Ok(self.b.clone()),
                _ => Err(format!("failed to find upstream by id: {id}")),
            }
        }

        fn compile_inline_upstream(&self, key: &str, conf: &Value) -> Result<UpstreamRef, String> {
            assert!(
                key.contains("#plugins['traffic-split'].rules[") && key.ends_with("].upstream"),
                "{key}"
            );
            Ok(UpstreamRef::new(Arc::new(conf.to_string())))
        }
    }

    fn ups() -> Ups {
        Ups {
            a: UpstreamRef::new(Arc::new("a".to_string())),
            b: UpstreamRef::new(Arc::new("b".to_string())),
        }
    }

    fn compiled(c: &Compiler, ups: &Ups, conf: &Value, owner: &str) -> Arc<dyn Plugin> {
        let mut cx = c.cx(NAME, conf, owner, None);
        cx.upstreams = ups;
        (DEF.compile)(&cx).unwrap()
    }

    /// Which upstream the request went to: "a", "b", an inline one, or "route".
    fn run(p: &dyn Plugin, uri: &str) -> Result<String, Exit> {
        let mut req = TestRequest::get(uri);
        let flow = match p.access(&mut req.ctx()) {
            Step::Done(f) => f,
            Step::Wait(_) => panic!("traffic-split never waits"),
        };
        if let Flow::Exit(e) = flow {
            return Err(e);
        }
        Ok(req
            .state
            .chosen_upstream()
            .map_or("route".into(), |u| u.get::<String>().unwrap().clone()))
    }

    #[test]
    fn three_to_two_in_apisix_order() {
        let c = Compiler::new();
        let ups = ups();
        let conf = json!({"rules": [{"weighted_upstreams": [
            {"upstream_id": "a", "weight": 3}, {"weight": 2}]}]});
        let p = compiled(&c, &ups, &conf, "ts-1");
        let seq: Vec<String> = (0..1000).map(|_| run(&*p, "/").unwrap()).collect();
        assert_eq!(seq[..5], ["a", "a", "route", "a", "route"]);
        assert_eq!(seq.iter().filter(|s| *s == "a").count(), 600);
        assert!(seq.chunks(5).all(|c| c == seq[..5].to_vec()));
        // The same conf compiled again (a new snapshot) carries the sequence on.
        let again = compiled(&c, &ups, &conf, "ts-1");
        assert_eq!(run(&*again, "/").unwrap(), "a");
        drop(p);
    }

    #[test]
    fn first_matching_rule_wins() {
        let c = Compiler::new();
        let ups = ups();
        let conf = json!({"rules": [
            {"match": [{"vars": [["arg_name", "==", "jack"]]}, {"vars": [["arg_x", "==", "1"]]}],
             "weighted_upstreams": [{"upstream_id": "a"}]},
            {"match": [{"vars": [["arg_name", "==", "rose"]]}],
             "weighted_upstreams": [{"upstream_id": "b"}]}
        ]});
        let p = compiled(&c, &ups, &conf, "ts-2");
        assert_eq!(run(&*p, "/?name=jack").unwrap(), "a");
        assert_eq!(run(&*p, "/?x=1").unwrap(), "a");
        assert_eq!(run(&*p, "/?name=rose").unwrap(), "b");
        assert_eq!(run(&*p, "/?name=tom").unwrap(), "route");
        // Without weighted_upstreams the default is the route's own (weight 1).
        let conf = json!({"rules": [{"match": [{"vars": [["arg_a", "==", "1"]]}]}]});
        let p = compiled(&c, &ups, &conf, "ts-3");
        assert_eq!(run(&*p, "/?a=1").unwrap(), "route");
    }

    /// Where a request with `body` as `content_type` went (the body still to be read, as the
    /// proxy hands it over).
    async fn run_form(p: &dyn Plugin, content_type: &str, body: &'static str) -> String {
        use http_body_util::BodyExt;
        let mut req =
            TestRequest::new(http::Method::POST, "/").header("content-type", content_type);
        let pending = http_body_util::Full::new(bytes::Bytes::from_static(body.as_bytes()))
            .map_err(|never| match never {});
        req.state
            .set_body(ferrisix_plugin_api::RequestBody::Unread(Box::pin(pending)));
        let flow = match p.access(&mut req.ctx()) {
            Step::Done(f) => f,
            Step::Wait(f) => f.await,
        };
        assert_eq!(flow, Flow::Continue);
        req.state
            .chosen_upstream()
            .map_or("route".into(), |u| u.get::<String>().unwrap().clone())
    }

    /// Issue 47, item 9: `post_arg_*` in `match` reads the form body, as APISIX's `ctx.var`
    /// does (`ngx.req.get_post_args`, values decoded) when the Content-Type starts with
    /// `application/x-www-form-urlencoded`, with or without a charset.
    #[tokio::test]
    async fn match_on_form_body_args() {
        let c = Compiler::new();
        let ups = ups();
        let conf = json!({"rules": [
            {"match": [{"vars": [["post_arg_name", "==", "jack doe"], ["post_arg_age", ">", 18]]}],
             "weighted_upstreams": [{"upstream_id": "a"}]}]});
        let p = compiled(&c, &ups, &conf, "ts-form");
        let form = "application/x-www-form-urlencoded";
        assert_eq!(run_form(&*p, form, "name=jack+doe&age=20").await, "a");
        let charset = "application/x-www-form-urlencoded; charset=utf-8";
        assert_eq!(run_form(&*p, charset, "age=30&name=jack%20doe").await, "a");
        assert_eq!(run_form(&*p, form, "name=jack+doe&age=10").await, "route");
        assert_eq!(run_form(&*p, form, "name=rose&age=20").await, "route");
        // Another body type has no post args.
        assert_eq!(
            run_form(&*p, "application/json", "name=jack+doe&age=20").await,
            "route"
        );
    }

    #[test]
    fn inline_and_missing_upstreams() {
        let c = Compiler::new();
        let ups = ups();
        let conf = json!({"rules": [{"weighted_upstreams": [
            {"upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1981": 1}}, "weight": 1},
            {"weight": 0}]}]});
        let p = compiled(&c, &ups, &conf, "ts-4");
        assert!(run(&*p, "/").unwrap().contains("1981"));
        let conf = json!({"rules": [{"weighted_upstreams": [{"upstream_id": "nope"}]}]});
        let p = compiled(&c, &ups, &conf, "ts-5");
        let e = run(&*p, "/").unwrap_err();
        assert_eq!(e.status, 500);
        assert_eq!(
            e.body.unwrap(),
            "failed to fetch upstream info by upstream id: nope"
        );
    }

    #[test]
    fn schema_and_vars_messages() {
        let r = crate::PluginRegistry::builtin();
        assert_eq!(
            r.check(NAME, &json!({"rules": [{"match": [{"vars": [["arg_name", 123, "jack"]]}]}]})),
            Err("failed to check the configuration of plugin traffic-split err: failed to validate the 'vars' expression: invalid operator '123'".into())
        );
        let e = r
            .check(
                NAME,
                &json!({"rules": [{"weighted_upstreams": [{"weight": -1}]}]}),
            )
            .unwrap_err();
        assert!(
            e.contains("property \"weight\" validation failed: expected -1 to be at least 0"),
            "{e}"
        );
        assert!(r.check(NAME, &json!({})).is_ok());
        assert_eq!(r.get(NAME).unwrap().priority, 966);
    }
}
