use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ferrisix_plugin_api::{Flow, LogCtx, Plugin, ResponseHeaders, Step};
use serde_json::{json, Value};

use super::*;
use crate::support::ai::protocol::Usage;
use crate::support::ai::{LlmRecord, PickedInstance};
use crate::support::redis::test_server::{self, TestRedis};
use crate::testing::{request, Compiler};

fn compiler() -> &'static Compiler {
    static C: OnceLock<Compiler> = OnceLock::new();
    C.get_or_init(Compiler::new)
}

fn compile_with(c: &Compiler, conf: Value, owner: &str) -> Arc<dyn Plugin> {
    super::compile(&c.cx(NAME, &conf, owner, None)).unwrap()
}

fn plugin(conf: Value, owner: &str) -> Arc<dyn Plugin> {
    compile_with(compiler(), conf, owner)
}

/// What one request left: its flow, its answer's headers.
struct Outcome {
    flow: Flow,
    headers: ResponseHeaders,
}

/// A request served by `instance` whose answer used `usage` (raw: the provider's own object):
/// rewrite, access, then the log phase.
async fn serve(
    p: &dyn Plugin,
    instance: &str,
    vars: &[(&'static str, &'static str)],
    usage: Option<Value>,
) -> Outcome {
    let mut req = request("10.0.0.1", vars);
    let flow = {
        let mut ctx = req.ctx();
        ctx.insert(PickedInstance(instance.into(), Arc::new(json!({}))));
        let record = Arc::new(LlmRecord::default());
        if let Some(raw) = usage {
            let n = |k: &str| raw.get(k).and_then(Value::as_u64).unwrap_or(0);
            let u = Usage {
                prompt_tokens: n("prompt_tokens"),
                completion_tokens: n("completion_tokens"),
                total_tokens: n("total_tokens"),
                raw: raw.clone(),
            };
            record.update(|f| f.usage = Some(u));
        }
        ctx.insert(record);
        assert!(matches!(p.rewrite(&mut ctx), Step::Done(Flow::Continue)));
        let flow = match p.access(&mut ctx) {
            Step::Done(f) => f,
            Step::Wait(fut) => fut.await,
        };
        flow
    };
    let headers = req.state.take_response_headers();
    if flow == Flow::Continue {
        p.log(&LogCtx {
            status: 200,
            values: req.state.take_values(),
            ..Default::default()
        });
    }
    Outcome { flow, headers }
}

fn usage(prompt: u64, completion: u64) -> Option<Value> {
    Some(
        json!({"prompt_tokens": prompt, "completion_tokens": completion,
        "total_tokens": prompt + completion}),
    )
}

fn status(o: &Outcome) -> u16 {
    match &o.flow {
        Flow::Continue => 200,
        Flow::Exit(e) => e.status.as_u16(),
    }
}

fn header<'a>(o: &'a Outcome, name: &str) -> Option<&'a str> {
    o.headers.get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn instance_and_plugin_wide_budgets() {
    let p = plugin(
        json!({"limit": 10, "time_window": 60,
            "instances": [{"name": "small", "limit": 3, "time_window": 60}],
            "rejected_code": 429, "rejected_msg": "no more tokens"}),
        "airl-t1",
    );
    let o = serve(&*p, "openai", &[], usage(4, 2)).await;
    assert_eq!(status(&o), 200);
    assert_eq!(header(&o, "x-ai-ratelimit-limit-openai"), Some("10"));
    assert_eq!(header(&o, "x-ai-ratelimit-remaining-openai"), Some("10"));
    assert_eq!(header(&o, "x-ai-ratelimit-reset-openai"), Some("60"));
    // The plugin-wide budget is one counter for every instance not listed.
    let o = serve(&*p, "other", &[], usage(2, 2)).await;
    assert_eq!(header(&o, "x-ai-ratelimit-remaining-other"), Some("4"));
    let o = serve(&*p, "openai", &[], None).await;
    let Flow::Exit(e) = &o.flow else {
        panic!("spent")
    };
    assert_eq!(e.status.as_u16(), 429);
    assert_eq!(
        e.body.clone().unwrap(),
        "{\"error_msg\":\"no more tokens\"}\n"
    );
    assert_eq!(header(&o, "x-ai-ratelimit-remaining-openai"), Some("0"));
    // A listed instance has a budget of its own.
    let o = serve(&*p, "small", &[], usage(5, 0)).await;
    assert_eq!(header(&o, "x-ai-ratelimit-remaining-small"), Some("3"));
    assert_eq!(status(&serve(&*p, "small", &[], None).await), 429);
}

#[tokio::test]
async fn prompt_and_completion_strategies_and_quiet_headers() {
    let p = plugin(
        json!({"limit": 5, "time_window": 60, "limit_strategy": "completion_tokens",
            "show_limit_quota_header": false}),
        "airl-t2",
    );
    let o = serve(&*p, "i", &[], usage(100, 4)).await;
    assert!(o.headers.is_empty());
    assert_eq!(
        status(&serve(&*p, "i", &[], usage(100, 0)).await),
        200,
        "1 left"
    );
    let p = plugin(
        json!({"limit": 5, "time_window": 60, "limit_strategy": "prompt_tokens"}),
        "airl-t2",
    );
    serve(&*p, "i", &[], usage(5, 100)).await;
    assert_eq!(status(&serve(&*p, "i", &[], None).await), 503);
}

#[tokio::test]
async fn rules_keyed_on_request_variables() {
    let p = plugin(
        json!({"rules": [
            {"count": 10, "time_window": 60, "key": "${http_x_user}"},
            {"count": "$http_x_team_quota", "time_window": 60, "key": "team-$http_x_team",
             "header_prefix": "team"}
        ]}),
        "airl-t3",
    );
    let alice = [
        ("http_x_user", "alice"),
        ("http_x_team", "a"),
        ("http_x_team_quota", "20"),
    ];
    let o = serve(&*p, "any", &alice, usage(6, 0)).await;
    assert_eq!(status(&o), 200);
    assert_eq!(header(&o, "x-ai-1-ratelimit-limit"), Some("10"));
    assert_eq!(header(&o, "x-ai-team-ratelimit-limit"), Some("20"));
    let o = serve(&*p, "any", &alice, usage(4, 0)).await;
    assert_eq!(header(&o, "x-ai-1-ratelimit-remaining"), Some("4"));
    assert_eq!(header(&o, "x-ai-team-ratelimit-remaining"), Some("14"));
    // alice spent her 10; bob of the same team has his own user budget.
    let o = serve(&*p, "any", &alice, None).await;
    assert_eq!(status(&o), 503);
    assert_eq!(header(&o, "x-ai-1-ratelimit-remaining"), Some("0"));
    let bob = [
        ("http_x_user", "bob"),
        ("http_x_team", "a"),
        ("http_x_team_quota", "20"),
    ];
    let o = serve(&*p, "any", &bob, usage(10, 0)).await;
    assert_eq!(header(&o, "x-ai-team-ratelimit-remaining"), Some("10"));
    // Without the user header only the team's rule applies.
    let team_only = [("http_x_team", "a"), ("http_x_team_quota", "20")];
    let o = serve(&*p, "any", &team_only, None).await;
    assert_eq!(status(&o), 503, "the team spent 20");
    assert!(header(&o, "x-ai-1-ratelimit-limit").is_none());
    // No rule applies: 500, as APISIX fails "failed to get rate limit rules".
    let o = serve(&*p, "any", &[], None).await;
    let Flow::Exit(e) = &o.flow else { panic!() };
    assert_eq!((e.status.as_u16(), e.body.as_deref()), (500, None));
    // A bad resolved quota too.
    let bad = [("http_x_team", "b"), ("http_x_team_quota", "many")];
    assert_eq!(status(&serve(&*p, "any", &bad, None).await), 500);
    let lenient = plugin(
        json!({"rules": [{"count": 1, "time_window": 60, "key": "$http_x_user"}],
            "allow_degradation": true}),
        "airl-t3b",
    );
    assert_eq!(status(&serve(&*lenient, "any", &[], None).await), 200);
}

#[tokio::test]
async fn expression_spends_the_cost_of_the_raw_usage() {
    let p = plugin(
        json!({"limit": 100, "time_window": 60, "limit_strategy": "expression",
            "cost_expr": "input_tokens + cache_creation_input_tokens + output_tokens * 2"}),
        "airl-t4",
    );
    let anthropic = Some(json!({"input_tokens": 10, "cache_creation_input_tokens": 5,
        "cache_read_input_tokens": 1000, "output_tokens": 20}));
    serve(&*p, "claude", &[], anthropic).await;
    let o = serve(&*p, "claude", &[], None).await;
    assert_eq!(header(&o, "x-ai-ratelimit-remaining-claude"), Some("45"));
}

#[test]
fn schema_takes_rules_and_the_redis_policies() {
    let ok = |mut conf: Value| {
        ferrisix_config::schema::validate_and_fill(&schema(), &mut conf).map(|_| conf)
    };
    assert!(ok(json!({"rules": [{"count": 1, "time_window": 1, "key": "$remote_addr"}]})).is_ok());
    assert!(
        ok(json!({"limit": 1, "time_window": 1, "rules": [{"count": 1, "time_window": 1, "key": "k"}]}))
            .is_err(),
        "limit and rules are one of two"
    );
    assert!(
        ok(json!({"rules": [{"count": 1, "time_window": 1}]})).is_err(),
        "key is required"
    );
    let redis = ok(json!({"limit": 1, "time_window": 1, "policy": "redis",
        "redis_host": "127.0.0.1"}))
    .unwrap();
    assert_eq!(redis["redis_port"], 6379);
    assert_eq!(redis["redis_timeout"], 1000);
    assert!(ok(json!({"limit": 1, "time_window": 1, "policy": "redis"})).is_err());
    assert!(
        ok(
            json!({"limit": 1, "time_window": 1, "policy": "redis-cluster",
        "redis_cluster_nodes": ["127.0.0.1:7000"]})
        )
        .is_err(),
        "redis_cluster_name is required"
    );
    assert!(ok(
        json!({"limit": 1, "time_window": 1, "policy": "redis-sentinel",
        "redis_sentinels": [{"host": "127.0.0.1", "port": 26379}], "redis_master_name": "m"})
    )
    .is_ok());
    assert_eq!(DEF.encrypt_fields, &["redis_password", "sentinel_password"]);
}

/// Polls `f` until it holds (the log phase spends on Redis in a task of its own).
async fn eventually(mut f: impl std::ops::AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f().await {
        assert!(Instant::now() < deadline, "not within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_policy_shares_the_budget_between_gateways() {
    let redis = TestRedis::start();
    let conf = json!({"limit": 10, "time_window": 60, "policy": "redis",
        "redis_host": "127.0.0.1", "redis_port": redis.port});
    // Two gateways (services of their own) with the same route.
    let (a, b) = (Compiler::new(), Compiler::new());
    let pa = compile_with(&a, conf.clone(), "airl-redis");
    let pb = compile_with(&b, conf, "airl-redis");
    let o = serve(&*pa, "gpt", &[], usage(3, 3)).await;
    assert_eq!(header(&o, "x-ai-ratelimit-remaining-gpt"), Some("10"));
    assert_eq!(header(&o, "x-ai-ratelimit-reset-gpt"), Some("60"));
    eventually(async || {
        let o = serve(&*pb, "gpt", &[], None).await;
        header(&o, "x-ai-ratelimit-remaining-gpt") == Some("4")
    })
    .await;
    serve(&*pb, "gpt", &[], usage(2, 2)).await;
    eventually(async || status(&serve(&*pa, "gpt", &[], None).await) == 503).await;
    let keys: Vec<String> = test_server::remote(redis.port)
        .query(redis::cmd("KEYS").arg("plugin-ai-rate-limiting:*"))
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(keys[0].ends_with(":ai-rate-limiting#global"), "{keys:?}");
}

#[tokio::test]
async fn unreachable_redis_fails_or_degrades() {
    let port = test_server::free_port();
    let base = json!({"limit": 1, "time_window": 60, "policy": "redis",
        "redis_host": "127.0.0.1", "redis_port": port, "redis_timeout": 200});
    let p = plugin(base.clone(), "airl-t6");
    let o = serve(&*p, "gpt", &[], None).await;
    let Flow::Exit(e) = &o.flow else { panic!() };
    assert_eq!(e.status.as_u16(), 500);
    assert_eq!(
        e.body.clone().unwrap(),
        "{\"error_msg\":\"failed to limit count\"}\n"
    );
    let mut lenient = base;
    lenient["allow_degradation"] = json!(true);
    let p = plugin(lenient, "airl-t6");
    assert_eq!(status(&serve(&*p, "gpt", &[], None).await), 200);
}

#[test]
fn checks_as_apisix() {
    use ferrisix_config::validate::PluginCheck;
    let check = |conf: Value| compiler().registry.check(NAME, &conf);
    let prefix = "failed to check the configuration of plugin ai-rate-limiting err: ";
    assert_eq!(
        check(json!({"limit": 1, "time_window": 1, "limit_strategy": "expression"})),
        Err(format!(
            "{prefix}cost_expr is required when limit_strategy is 'expression'"
        ))
    );
    assert_eq!(
        check(
            json!({"limit": 1, "time_window": 1, "limit_strategy": "expression",
            "cost_expr": "input_tokens +"})
        ),
        Err(format!(
            "{prefix}invalid cost_expr: [string \"cost_expr\"]:1: unexpected symbol near <eof>"
        ))
    );
    assert_eq!(
        check(
            json!({"limit": 1, "time_window": 1, "limit_strategy": "expression",
            "cost_expr": "input_tokens + output_tokens"})
        ),
        Ok(())
    );
    assert_eq!(
        check(
            json!({"rules": [{"count": 1, "time_window": 1, "key": "$consumer_name"}],
            "policy": "redis", "redis_host": "127.0.0.1"})
        ),
        Ok(())
    );
}
