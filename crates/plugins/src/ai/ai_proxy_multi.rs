//! ai-proxy-multi (`apisix/plugins/ai-proxy-multi.lua`): ai-proxy over several instances.
//! The instances of the highest `priority` share the requests by `weight` (resty's
//! roundrobin); `fallback_strategy` moves a request on to the next instance when one
//! answers 429 (`http_429`), 5xx or cannot be reached (`http_5xx`), or one of
//! `fallback_http_statuses`, and with `instance_health_and_rate_limiting` (or
//! `rate_limiting`) skips instances whose ai-rate-limiting budget is spent. The `chash`
//! balancer puts each priority's instances on the proxy's consistent-hash ring (resty.chash,
//! the instances' names as the ring's node ids, as APISIX's picker names them) and picks by
//! the request's `hash_on` / `key`, a fallback going on along the ring.

use std::sync::Arc;

use ferrisix_plugin_api::chash::{HashOn, Ring};
use ferrisix_plugin_api::roundrobin::InterleavedWrr;
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef, PluginServices, Step,
};
use http::StatusCode;
use serde_json::Value;
use std::borrow::Cow;

use crate::support::ai::call::{self, CallConf, Instance};
use crate::support::ai::{schema, start, AiRequest, Budget, LlmRecord, Logging, PickedInstance};

pub const NAME: &str = "ai-proxy-multi";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    version: 0.5,
    ..PluginDef::new(NAME, 1041, schema::ai_proxy_multi, compile)
};

fn instances(conf: &Value) -> &[Value] {
    conf.get("instances")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    let mut seen: Vec<&str> = Vec::new();
    for (i, inst) in instances(cx.conf).iter().enumerate() {
        let name = inst.get("name").and_then(Value::as_str).unwrap_or("?");
        if let Some(j) = seen.iter().position(|n| *n == name) {
            return Err(format!(
                "duplicate instance name '{name}' at instances[{}] and instances[{}]",
                j + 1,
                i + 1
            ));
        }
        seen.push(name);
        if let Some(e) = inst
            .get("override")
            .and_then(|o| o.get("endpoint"))
            .and_then(Value::as_str)
        {
            if !schema::valid_endpoint(e) {
                return Err("invalid endpoint".into());
            }
        }
        schema::check_gcp(inst)?;
        schema::provider_requirements(inst).map_err(|e| format!("instance '{name}': {e}"))?;
    }
    let balancer = cx.conf.get("balancer");
    let algo = balancer
        .and_then(|b| b.get("algorithm"))
        .and_then(Value::as_str);
    if algo == Some("chash") {
        let hash_on = balancer
            .and_then(|b| b.get("hash_on"))
            .and_then(Value::as_str)
            .unwrap_or("vars");
        let key = balancer.and_then(|b| b.get("key"));
        if hash_on != "consumer" && key.is_none() {
            return Err(
                "must configure `hash_key` when balancer `hash_on` is not set to cookie".into(),
            );
        }
        match ferrisix_config::schema::chash_key_schema(hash_on) {
            Err(e) => return Err(format!("type is chash, err: {e}")),
            Ok(Some(key_schema)) => {
                ferrisix_config::schema::validate(key_schema, key.unwrap_or(&Value::Null))
                    .map_err(|e| format!("invalid configuration: {e}"))?;
            }
            Ok(None) => {}
        }
    }
    if algo == Some("semantic") {
        return Err("the semantic balancer algorithm is not supported by ferrisix".into());
    }
    Ok(())
}

/// What `fallback_strategy` falls back on.
#[derive(Clone, Copy, Debug, Default)]
struct Fallback {
    on_429: bool,
    on_5xx: bool,
    rate_limiting: bool,
}

/// The instances of one priority, balanced by weight.
#[derive(Debug)]
struct Group {
    members: Vec<usize>,
    wrr: InterleavedWrr,
    /// `chash`: the members on the ring by weight.
    ring: Option<Ring>,
}

#[derive(Debug)]
struct AiProxyMulti {
    instances: Vec<Instance>,
    /// Highest priority first.
    groups: Vec<Group>,
    /// `chash`: where the key comes from.
    hash_on: Option<HashOn>,
    fallback: Fallback,
    max_retries: Option<u64>,
    retry_within: Option<std::time::Duration>,
    call: CallConf,
    max_body: usize,
    logging: Logging,
    services: Arc<PluginServices>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(build(cx)?))
}

fn build(cx: &CompileCtx<'_>) -> Result<AiProxyMulti, String> {
    let conf = cx.filled();
    let list = instances(&conf)
        .iter()
        .map(|i| {
            let name = i
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            Instance::from_conf(i, name)
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut priorities: Vec<i64> = list.iter().map(|i| i.priority).collect();
    priorities.sort_unstable_by(|a, b| b.cmp(a));
    priorities.dedup();
    let balancer = conf.get("balancer");
    let text = |k: &str| balancer.and_then(|b| b.get(k)).and_then(Value::as_str);
    let hash_on = (text("algorithm") == Some("chash"))
        .then(|| HashOn::from_config(text("hash_on"), text("key")));
    let groups = priorities
        .into_iter()
        .map(|p| {
            let members: Vec<usize> = (0..list.len()).filter(|&i| list[i].priority == p).collect();
            let weights: Vec<_> = members.iter().map(|&i| list[i].weight).collect();
            let ring = hash_on.as_ref().map(|_| {
                let ids: Vec<(Vec<u8>, u32)> = members
                    .iter()
                    .map(|&i| {
                        let id = list[i].name.bytes().map(|b| if b == b':' { 0 } else { b });
                        (id.collect(), list[i].weight)
                    })
                    .collect();
                Ring::new(&ids)
            });
            Group {
                members,
                wrr: InterleavedWrr::new(weights, None),
                ring,
            }
        })
        .collect();
    let has = |name: &str| match conf.get("fallback_strategy") {
        Some(Value::String(s)) => s == name,
        Some(Value::Array(a)) => a.iter().any(|v| v.as_str() == Some(name)),
        _ => false,
    };
    let fallback = Fallback {
        on_429: has("http_429"),
        on_5xx: has("http_5xx"),
        rate_limiting: has("instance_health_and_rate_limiting") || has("rate_limiting"),
    };
    Ok(AiProxyMulti {
        instances: list,
        groups,
        hash_on,
        fallback,
        max_retries: conf.get("max_retries").and_then(Value::as_u64),
        retry_within: conf
            .get("retry_on_failure_within_ms")
            .and_then(Value::as_u64)
            .map(std::time::Duration::from_millis),
        call: CallConf::from_conf(&conf).with_active_connections(cx.services),
        max_body: conf
            .get("max_req_body_size")
            .and_then(Value::as_u64)
            .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX)),
        logging: Logging::from_conf(&conf),
        services: cx.services.clone(),
    })
}

/// The instances this request tried, and the one it is on.
#[derive(Debug, Default)]
struct Tries {
    tried: Vec<usize>,
    current: usize,
}

impl AiProxyMulti {
    /// The next instance by priority and weight (or, `chash`, by the request's key on the
    /// ring) among those not tried; with a rate-limiting fallback, one whose budget is spent
    /// counts as tried.
    async fn pick(&self, ctx: &mut PluginCtx<'_>, tried: &mut Vec<usize>) -> Option<usize> {
        let budget = if self.fallback.rate_limiting {
            ctx.get::<Budget>().cloned()
        } else {
            None
        };
        let key = self.hash_on.as_ref().map(|h| {
            let consumer = ctx.consumer().map(|c| c.username.clone());
            let var = |name: &str| {
                ferrisix_router::VarSource::var(&*ctx, name).map(|v| Cow::Owned(v.into_owned()))
            };
            h.key(&var, consumer.as_deref()).into_owned()
        });
        for group in &self.groups {
            let mut point = None;
            for _ in 0..group.members.len() * 2 + 2 {
                if group.members.iter().all(|m| tried.contains(m)) {
                    break;
                }
                let i = match (&group.ring, &key) {
                    (Some(ring), Some(key)) => {
                        // resty.chash: the key's point, then on along the ring past the
                        // members tried.
                        let mut at = match point {
                            None => ring.find(key.as_bytes()),
                            Some(p) => Some(ring.next(p)),
                        };
                        for _ in 0..ring.len() {
                            match at {
                                Some((m, _)) if tried.contains(&group.members[m]) => {
                                    at = at.map(|(_, p)| ring.next(p));
                                }
                                _ => break,
                            }
                        }
                        let Some((m, p)) = at else { break };
                        point = Some(p);
                        m
                    }
                    _ => match group.wrr.next() {
                        Some(i) => i,
                        None => break,
                    },
                };
                let idx = group.members[i];
                if tried.contains(&idx) {
                    continue;
                }
                if let Some(b) = &budget {
                    if !b.0.allows(ctx, &self.instances[idx].name).await {
                        tracing::warn!(
                            "ai instance: {} is not available, try to pick another one",
                            self.instances[idx].name
                        );
                        tried.push(idx);
                        continue;
                    }
                }
                return Some(idx);
            }
        }
        None
    }

    async fn access_async(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        if let Err(exit) = start(ctx, self.max_body, self.logging).await {
            return Flow::Exit(exit);
        }
        let mut tried = Vec::new();
        let Some(idx) = self.pick(ctx, &mut tried).await else {
            return Flow::Exit(Exit::body(
                StatusCode::SERVICE_UNAVAILABLE,
                "all servers tried",
            ));
        };
        ctx.insert(PickedInstance(
            self.instances[idx].name.clone(),
            self.instances[idx].identity.clone(),
        ));
        ctx.insert(Tries {
            tried,
            current: idx,
        });
        Flow::Continue
    }

    fn retries(&self, status: u16) -> bool {
        (status == 429 && self.fallback.on_429)
            || ((500..600).contains(&status) && self.fallback.on_5xx)
            || self.call.fallback_statuses.contains(&status)
    }

    async fn proxy(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let (Some(req), Some(record)) = (
            ctx.get::<AiRequest>().cloned(),
            ctx.get::<Arc<LlmRecord>>().cloned(),
        ) else {
            return Flow::Continue;
        };
        let Some(mut tries) = ctx.get_mut::<Tries>().map(std::mem::take) else {
            return Flow::Continue;
        };
        let started = std::time::Instant::now();
        let mut retried = 0;
        loop {
            let inst = &self.instances[tries.current];
            let exit = call::call(ctx, &self.services, inst, &self.call, &req, &record).await;
            let status = exit.status.as_u16();
            if !self.retries(status) {
                return Flow::Exit(exit);
            }
            if self.retry_within.is_some_and(|w| started.elapsed() > w) {
                return Flow::Exit(exit);
            }
            retried += 1;
            if self.max_retries.is_some_and(|m| retried > m) {
                return Flow::Exit(exit);
            }
            tries.tried.push(tries.current);
            let Some(next) = self.pick(ctx, &mut tries.tried).await else {
                tracing::error!("failed to pick new AI instance: all servers tried");
                return Flow::Exit(Exit::status(StatusCode::BAD_GATEWAY));
            };
            tracing::warn!(
                "ai instance {} returned status {status}, falling back to {}",
                inst.name,
                self.instances[next].name
            );
            tries.current = next;
            ctx.insert(PickedInstance(
                self.instances[next].name.clone(),
                self.instances[next].identity.clone(),
            ));
        }
    }
}

impl Plugin for AiProxyMulti {
    fn phases(&self) -> Phases {
        Phases::ACCESS | Phases::BEFORE_PROXY | Phases::UPSTREAM
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.access_async(ctx)))
    }

    fn before_proxy<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.proxy(ctx)))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testing::{request, Compiler};

    fn multi(balancer: Value) -> AiProxyMulti {
        let instances: Vec<Value> = ["a", "b", "c"]
            .iter()
            .map(|n| {
                json!({"name": n, "provider": "openai", "weight": 1,
                "auth": {"header": {"Authorization": "Bearer k"}}})
            })
            .collect();
        let conf = json!({"balancer": balancer, "instances": instances});
        let c = Compiler::new();
        build(&c.cx(NAME, &conf, "aipm-chash", None)).unwrap()
    }

    async fn pick(m: &AiProxyMulti, user: &'static str, tried: &mut Vec<usize>) -> Option<usize> {
        let mut req = request("10.0.0.1", &[("http_x_user", user)]);
        let mut ctx = req.ctx();
        m.pick(&mut ctx, tried).await
    }

    #[tokio::test]
    async fn chash_sticks_a_key_to_an_instance_and_falls_back_along_the_ring() {
        let m = multi(json!({"algorithm": "chash", "hash_on": "header", "key": "X-User"}));
        let mut seen = std::collections::BTreeSet::new();
        for user in ["u1", "u2", "u3", "u4", "u5", "u6", "u7", "u8"] {
            let first = pick(&m, user, &mut Vec::new()).await.unwrap();
            for _ in 0..3 {
                assert_eq!(pick(&m, user, &mut Vec::new()).await, Some(first), "{user}");
            }
            seen.insert(first);
            // Its instance tried: another one, then the last, then none.
            let mut tried = vec![first];
            let second = pick(&m, user, &mut tried).await.unwrap();
            assert_ne!(second, first);
            tried.push(second);
            let third = pick(&m, user, &mut tried).await.unwrap();
            assert!(third != first && third != second);
            tried.push(third);
            assert_eq!(pick(&m, user, &mut tried).await, None);
        }
        assert!(seen.len() > 1, "all keys on one instance");
        // The ring is resty.chash's over the instances' names: the same key, the same pick,
        // whichever gateway builds it.
        let ids: Vec<(Vec<u8>, u32)> = ["a", "b", "c"]
            .iter()
            .map(|n| (n.as_bytes().to_vec(), 1))
            .collect();
        let ring = Ring::new(&ids);
        assert_eq!(
            pick(&m, "u1", &mut Vec::new()).await,
            ring.find(b"u1").map(|(i, _)| i)
        );
        // Round robin is untouched by the key.
        let rr = multi(json!({"algorithm": "roundrobin"}));
        let mut spread = std::collections::BTreeSet::new();
        for _ in 0..3 {
            spread.insert(pick(&rr, "u1", &mut Vec::new()).await.unwrap());
        }
        assert_eq!(spread.len(), 3);
    }

    #[test]
    fn chash_key_schemas_as_apisix() {
        let c = Compiler::new();
        let check = |balancer: Value| {
            use ferrisix_config::validate::PluginCheck;
            let conf = json!({"balancer": balancer, "instances": [{"name": "a",
                "provider": "openai", "weight": 1, "auth": {"header": {"k": "v"}}}]});
            c.registry.check(NAME, &conf)
        };
        assert!(check(json!({"algorithm": "chash", "hash_on": "header", "key": "X-User"})).is_ok());
        assert!(check(json!({"algorithm": "chash", "hash_on": "consumer"})).is_ok());
        let e = check(json!({"algorithm": "chash", "hash_on": "vars", "key": "not_a_var"}))
            .unwrap_err();
        assert!(e.ends_with(
            "invalid configuration: failed to match pattern \"^((uri|server_name|server_addr|request_uri|remote_port|remote_addr|query_string|host|hostname|mqtt_client_id)|arg_[0-9a-zA-z_-]+)$\" with \"not_a_var\""
        ), "{e}");
        assert!(check(json!({"algorithm": "chash", "hash_on": "header"}))
            .unwrap_err()
            .ends_with("must configure `hash_key` when balancer `hash_on` is not set to cookie"));
    }
}
