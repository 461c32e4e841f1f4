//! Plugin chains: the plugins of one route (or of the global rules) compiled once per snapshot,
//! sorted by priority, and run phase by phase on the request path.
//!
//! Compilation does what APISIX's `plugin.filter` does per request, once: plugins whose
//! `_meta.disable` is true are left out, `_meta.priority` overrides the plugin's priority,
//! `_meta.filter` is compiled into an expression, and global rules apply `run_policy =
//! "prefer_route"`. Running a phase then only walks the plugins that implement it.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use ferrisix_config::model::ResourceKind;
use ferrisix_config::vars::compile_vars;
use ferrisix_plugin_api::{
    CompileCtx, Flow, LogCtx, LogNeeds, Owner, Phases, Plugin, PluginCtx, PluginKind, Protos,
    ResponseHead, RouteInfo, RunPolicy, Step, UpstreamAnswer, UpstreamResolver,
};
use ferrisix_router::Expr;
use serde_json::{Map, Value};

use crate::registry::PluginRegistry;

/// One plugin configuration and where it comes from.
#[derive(Clone, Debug)]
pub struct PluginSource<'a> {
    pub name: &'a str,
    pub conf: &'a Value,
    pub owner: &'a Owner,
}

/// What compiling a plugin may read besides its configuration.
#[derive(Clone, Copy)]
pub struct CompileEnv<'a> {
    /// `plugin_metadata` documents by plugin name.
    pub metadata: &'a HashMap<String, Value>,
    /// The enabled plugins and the services they compile against.
    pub registry: &'a PluginRegistry,
    /// The upstreams of the snapshot being compiled (traffic-split's choices).
    pub upstreams: &'a dyn UpstreamResolver,
    /// The snapshot's compiled protos (grpc-transcode).
    pub protos: &'a Protos,
}

impl std::fmt::Debug for CompileEnv<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompileEnv")
            .field("metadata", &self.metadata.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

#[derive(Clone)]
struct ChainEntry {
    name: &'static str,
    priority: i64,
    plugin: Arc<dyn Plugin>,
    filter: Option<Expr>,
    /// `_meta.error_response`: replaces the body of any exit ≥ 400 of this plugin.
    error_response: Option<Bytes>,
    /// An authentication plugin (`type = 'auth'`).
    auth: bool,
    /// Merged in from the consumer (or its group) and not on the route: APISIX's
    /// `_from_consumer`, whose rewrite runs once the consumer is known.
    from_consumer: bool,
}

/// The compiled plugins of one route, highest priority first.
#[derive(Default)]
pub struct PluginChain {
    entries: Box<[ChainEntry]>,
    phases: Phases,
    /// What the plugins' log phases read ([`Plugin::log_needs`]).
    log_needs: LogNeeds,
    /// Some plugin authenticates: requests need the snapshot's consumers.
    needs_consumers: bool,
}

impl std::fmt::Debug for PluginChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|e| (e.name, e.priority)))
            .finish()
    }
}

fn meta(conf: &Value) -> Option<&Map<String, Value>> {
    conf.get("_meta").and_then(Value::as_object)
}

/// `_meta.disable == true`.
pub fn is_disabled(conf: &Value) -> bool {
    meta(conf)
        .and_then(|m| m.get("disable"))
        .and_then(Value::as_bool)
        == Some(true)
}

impl ChainEntry {
    /// `None`: left out (disabled, or not a plugin of this registry).
    fn compile(
        src: &PluginSource<'_>,
        route: Option<&RouteInfo>,
        env: CompileEnv<'_>,
    ) -> Result<Option<ChainEntry>, String> {
        if !src.conf.is_object() || is_disabled(src.conf) {
            return Ok(None);
        }
        let Some(info) = env.registry.get(src.name) else {
            tracing::warn!(plugin = src.name, "unknown plugin left out of the chain");
            return Ok(None);
        };
        let conf = env.registry.decrypted(info, src.conf);
        let cx = CompileCtx {
            name: info.name,
            conf: &conf,
            owner: src.owner,
            route,
            metadata: env.metadata.get(info.name),
            all_metadata: env.metadata,
            services: env.registry.services(),
            upstreams: env.upstreams,
            apis: env.registry.apis(),
            schema: &info.schema,
            protos: env.protos,
        };
        let plugin = (info.def.compile)(&cx)
            .map_err(|e| format!("failed to load plugin {}: {e}", src.name))?;
        let meta = meta(src.conf);
        let priority = meta
            .and_then(|m| m.get("priority"))
            .and_then(Value::as_i64)
            .unwrap_or(info.priority);
        let filter = match meta.and_then(|m| m.get("filter")) {
            Some(f) => Some(compile_vars(f).map_err(|e| format!("plugin {}: {e}", src.name))?),
            None => None,
        };
        let error_response = meta.and_then(|m| m.get("error_response")).map(|v| match v {
            Value::String(s) => Bytes::from(s.clone()),
            // A table body is JSON-encoded and followed by a newline.
            other => {
                let mut s = ferrisix_config::schema::lua::cjson_encode(other);
                s.push('\n');
                Bytes::from(s)
            }
        });
        Ok(Some(ChainEntry {
            name: info.name,
            priority,
            plugin,
            filter,
            error_response,
            auth: info.def.kind == PluginKind::Auth,
            from_consumer: false,
        }))
    }
}

impl PluginChain {
    /// An empty chain.
    pub fn empty() -> Arc<PluginChain> {
        Arc::new(PluginChain::default())
    }

    /// Compiles `sources` for `route` (`None`: requests that matched no route). Fails with the
    /// first plugin that cannot be compiled.
    pub fn compile(
        sources: &[PluginSource<'_>],
        route: Option<&RouteInfo>,
        env: CompileEnv<'_>,
    ) -> Result<PluginChain, String> {
        let mut entries = Vec::with_capacity(sources.len());
        for src in sources {
            entries.extend(ChainEntry::compile(src, route, env)?);
        }
        Ok(PluginChain::from_entries(entries))
    }

    fn from_entries(mut entries: Vec<ChainEntry>) -> PluginChain {
        // Equal priorities run in name order, so the order is deterministic.
        entries.sort_by(|a, b| b.priority.cmp(&a.priority).then_with(|| a.name.cmp(b.name)));
        let phases = entries
            .iter()
            .fold(Phases::NONE, |p, e| p | e.plugin.phases());
        let log_needs = entries
            .iter()
            .filter(|e| e.plugin.phases().contains(Phases::LOG))
            .fold(LogNeeds::default(), |n, e| n.union(&e.plugin.log_needs()));
        let needs_consumers = entries.iter().any(|e| e.auth || e.plugin.needs_consumers());
        PluginChain {
            entries: entries.into_boxed_slice(),
            phases,
            log_needs,
            needs_consumers,
        }
    }

    /// Whether some plugin of the chain authenticates (and so looks up consumers).
    pub fn needs_consumers(&self) -> bool {
        self.needs_consumers
    }

    /// APISIX's `merge_consumer_route`: the consumer's (and its group's) plugins replace the
    /// route's of the same name and join the others; the ones the route did not have are
    /// marked to run their rewrite phase now ([`PluginChain::rewrite_in_consumer`]). The
    /// consumer's plugins were compiled once per snapshot: this copies handles.
    pub fn with_consumer(&self, consumer: &ConsumerPlugins) -> PluginChain {
        let mut entries: Vec<ChainEntry> = Vec::with_capacity(self.entries.len() + consumer.len());
        entries.extend(
            self.entries
                .iter()
                .filter(|e| !consumer.entries.iter().any(|c| c.name == e.name))
                .cloned(),
        );
        for c in consumer.entries.iter() {
            let mut e = c.clone();
            e.from_consumer = !self.entries.iter().any(|r| r.name == c.name);
            entries.push(e);
        }
        PluginChain::from_entries(entries)
    }

    /// The `rewrite_in_consumer` phase: the rewrite of the plugins merged in from the
    /// consumer that the route did not have, auth plugins excepted.
    pub async fn rewrite_in_consumer(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        if !self.phases.contains(Phases::REWRITE) {
            return Flow::Continue;
        }
        self.run_entries(Phases::REWRITE, ctx, |e| e.from_consumer && !e.auth)
            .await
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether any plugin implements `phase`.
    pub fn has(&self, phase: Phases) -> bool {
        self.phases.contains(phase)
    }

    /// What this chain's log phase reads.
    pub fn log_needs(&self) -> &LogNeeds {
        &self.log_needs
    }

    /// Plugin names in run order.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.entries.iter().map(|e| e.name)
    }

    pub async fn rewrite(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        self.run(Phases::REWRITE, ctx).await
    }

    pub async fn access(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        self.run(Phases::ACCESS, ctx).await
    }

    pub async fn before_proxy(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        self.run(Phases::BEFORE_PROXY, ctx).await
    }

    /// `upstream_answer`, in priority order; the first exit replaces the answer.
    pub async fn upstream_answer(
        &self,
        ctx: &mut PluginCtx<'_>,
        answer: &mut UpstreamAnswer,
    ) -> Flow {
        if !self.phases.contains(Phases::UPSTREAM_ANSWER) {
            return Flow::Continue;
        }
        for e in self.entries.iter() {
            if !e.plugin.phases().contains(Phases::UPSTREAM_ANSWER) {
                continue;
            }
            if let Some(filter) = &e.filter {
                if !filter.eval(&*ctx) {
                    continue;
                }
            }
            let flow = match e.plugin.upstream_answer(ctx, answer) {
                Step::Done(flow) => flow,
                Step::Wait(fut) => fut.await,
            };
            if let Flow::Exit(mut exit) = flow {
                if let Some(body) = e
                    .error_response
                    .as_ref()
                    .filter(|_| exit.status.as_u16() >= 400)
                {
                    exit.body = Some(body.clone());
                }
                return Flow::Exit(exit);
            }
        }
        Flow::Continue
    }

    async fn run(&self, phase: Phases, ctx: &mut PluginCtx<'_>) -> Flow {
        if !self.phases.contains(phase) {
            return Flow::Continue;
        }
        self.run_entries(phase, ctx, |_| true).await
    }

    async fn run_entries(
        &self,
        phase: Phases,
        ctx: &mut PluginCtx<'_>,
        runs: impl Fn(&ChainEntry) -> bool,
    ) -> Flow {
        for e in self.entries.iter() {
            if !e.plugin.phases().contains(phase) || !runs(e) {
                continue;
            }
            if let Some(filter) = &e.filter {
                if !filter.eval(&*ctx) {
                    continue;
                }
            }
            let step = match phase {
                Phases::REWRITE => e.plugin.rewrite(ctx),
                Phases::ACCESS => e.plugin.access(ctx),
                _ => e.plugin.before_proxy(ctx),
            };
            let flow = match step {
                Step::Done(flow) => flow,
                Step::Wait(fut) => fut.await,
            };
            if let Flow::Exit(mut exit) = flow {
                if exit.status.as_u16() >= 400 {
                    // A rejection is normal traffic (rate limits), not a gateway problem.
                    tracing::debug!(
                        plugin = e.name,
                        status = exit.status.as_u16(),
                        "plugin exits"
                    );
                    if let Some(body) = &e.error_response {
                        exit.body = Some(body.clone());
                    }
                }
                return Flow::Exit(exit);
            }
        }
        Flow::Continue
    }

    /// The `_meta.filter` verdicts of this request, taken while its variables are at hand, for
    /// the phases that run after the response head (APISIX caches them per request too).
    pub fn verdicts(&self, ctx: &PluginCtx<'_>) -> Verdicts {
        let mut v = Verdicts::ALL;
        for (i, e) in self.entries.iter().enumerate().take(64) {
            if let Some(filter) = &e.filter {
                if !filter.eval(ctx) {
                    v.0 &= !(1 << i);
                }
            }
        }
        v
    }

    /// `header_filter`: the response head is final except for what plugins change here.
    pub fn header_filter(
        &self,
        ctx: &mut PluginCtx<'_>,
        resp: &mut ResponseHead<'_>,
        verdicts: Verdicts,
    ) {
        if !self.phases.contains(Phases::HEADER_FILTER) {
            return;
        }
        for (i, e) in self.entries.iter().enumerate() {
            if e.plugin.phases().contains(Phases::HEADER_FILTER) && verdicts.allows(i) {
                e.plugin.header_filter(ctx, resp);
            }
        }
    }

    /// The plugins' `mask_log`, run over both chains before any `log`.
    pub fn mask_log(&self, ctx: &mut LogCtx, verdicts: Verdicts) {
        if !self.phases.contains(Phases::LOG_MASK) {
            return;
        }
        for (i, e) in self.entries.iter().enumerate() {
            if e.plugin.phases().contains(Phases::LOG_MASK) && verdicts.allows(i) {
                e.plugin.mask_log(ctx);
            }
        }
    }

    pub fn log(&self, ctx: &LogCtx, verdicts: Verdicts) {
        if !self.phases.contains(Phases::LOG) {
            return;
        }
        for (i, e) in self.entries.iter().enumerate() {
            if e.plugin.phases().contains(Phases::LOG) && verdicts.allows(i) {
                e.plugin.log(ctx);
            }
        }
    }
}

/// A consumer's plugins (merged over its group's), compiled once per snapshot, to be merged
/// over a route's chain once the consumer is known ([`PluginChain::with_consumer`]). Auth
/// plugins are left out: their conf on a consumer is a credential, and their only phase
/// (rewrite) has run by then (APISIX skips them in `rewrite_in_consumer` too).
#[derive(Default)]
pub struct ConsumerPlugins {
    entries: Vec<ChainEntry>,
}

impl std::fmt::Debug for ConsumerPlugins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|e| e.name))
            .finish()
    }
}

impl ConsumerPlugins {
    /// Compiles `sources` (the group's, then the consumer's replacing them by name), leaving
    /// out auth plugins. Fails with the first plugin that cannot be compiled.
    pub fn compile(
        sources: &[PluginSource<'_>],
        env: CompileEnv<'_>,
    ) -> Result<ConsumerPlugins, String> {
        let mut entries: Vec<ChainEntry> = Vec::new();
        for src in sources {
            let auth = env
                .registry
                .get(src.name)
                .is_some_and(|i| i.def.kind == PluginKind::Auth);
            if auth {
                continue;
            }
            entries.retain(|e| e.name != src.name);
            entries.extend(ChainEntry::compile(src, None, env)?);
        }
        Ok(ConsumerPlugins { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.entries.iter().map(|e| e.name)
    }
}

/// Which plugins of a chain passed their `_meta.filter` (bit per entry; entries past the 64th
/// always run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdicts(u64);

impl Verdicts {
    pub const ALL: Verdicts = Verdicts(u64::MAX);

    fn allows(self, i: usize) -> bool {
        i >= 64 || self.0 & (1 << i) != 0
    }
}

/// The plugins of every global rule, merged (3.15+): a plugin configured in two rules runs in
/// neither.
#[derive(Clone, Debug, Default)]
pub struct GlobalRules {
    /// (name, conf, owner) in rule order.
    plugins: Vec<(String, Value, Owner)>,
}

impl GlobalRules {
    /// Merges `rules` (id, plugins) given in APISIX's iteration order.
    pub fn merge<'a>(
        rules: impl IntoIterator<Item = (&'a str, &'a Map<String, Value>)>,
    ) -> GlobalRules {
        let mut seen: HashMap<String, bool> = HashMap::new();
        let mut plugins: Vec<(String, Value, Owner)> = Vec::new();
        for (id, rule_plugins) in rules {
            let owner = Owner::new(ResourceKind::GlobalRules, id);
            for (name, conf) in rule_plugins {
                match seen.get_mut(name) {
                    Some(dup) => {
                        if !*dup {
                            tracing::error!(
                                plugin = %name,
                                "Found {name} configured across different global rules. Removing it from execution list"
                            );
                        }
                        *dup = true;
                    }
                    None => {
                        seen.insert(name.clone(), false);
                        plugins.push((name.clone(), conf.clone(), owner.clone()));
                    }
                }
            }
        }
        plugins.retain(|(name, _, _)| seen.get(name) == Some(&false));
        GlobalRules { plugins }
    }

    pub fn is_empty(&self) -> bool {
        self.plugins.is_empty()
    }

    /// Compiles what does not depend on the route once; see [`GlobalChains::for_route`].
    pub fn prepare(&self, env: CompileEnv<'_>) -> GlobalChains {
        let mut shared = Vec::new();
        let mut per_route = Vec::new();
        let mut prefer_route = Vec::new();
        for (name, conf, owner) in &self.plugins {
            let def = env.registry.get(name).map(|i| i.def);
            if def.is_some_and(|d| d.run_policy == RunPolicy::PreferRoute) {
                prefer_route.push(name.clone());
            }
            if def.is_some_and(|d| d.per_route) {
                per_route.push((name.clone(), conf.clone(), owner.clone()));
                continue;
            }
            let src = PluginSource { name, conf, owner };
            // A global plugin that fails to compile is left out; the rest still run.
            match ChainEntry::compile(&src, None, env) {
                Ok(Some(e)) => shared.push(e),
                Ok(None) => {}
                Err(e) => tracing::error!("global rules: {e}"),
            }
        }
        let mut chains = GlobalChains {
            unmatched: PluginChain::empty(),
            empty: PluginChain::empty(),
            shared_chain: Arc::new(PluginChain::from_entries(shared.clone())),
            shared,
            per_route,
            prefer_route,
        };
        chains.unmatched = chains.build(None, env);
        chains
    }
}

/// The global rules compiled for one snapshot.
pub struct GlobalChains {
    shared: Vec<ChainEntry>,
    /// The chain of `shared` alone, handed to every route when nothing depends on the route.
    shared_chain: Arc<PluginChain>,
    /// Plugins compiled per route (prometheus: its labels are the route's).
    per_route: Vec<(String, Value, Owner)>,
    /// Names of the plugins with `run_policy = "prefer_route"`.
    prefer_route: Vec<String>,
    unmatched: Arc<PluginChain>,
    /// One empty chain for every route without plugins of its own: a chain each would cost
    /// every such route an allocation (`examples/route_memory.rs` counts bytes per route).
    empty: Arc<PluginChain>,
}

impl Default for GlobalChains {
    fn default() -> Self {
        GlobalChains {
            shared: Vec::new(),
            shared_chain: PluginChain::empty(),
            per_route: Vec::new(),
            prefer_route: Vec::new(),
            unmatched: PluginChain::empty(),
            empty: PluginChain::empty(),
        }
    }
}

impl std::fmt::Debug for GlobalChains {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlobalChains")
            .field("unmatched", &self.unmatched)
            .finish()
    }
}

impl GlobalChains {
    /// An empty chain, the same one for every caller: the chain of a route without plugins.
    pub fn empty_chain(&self) -> Arc<PluginChain> {
        self.empty.clone()
    }

    /// The chain for requests that matched no route.
    pub fn unmatched(&self) -> Arc<PluginChain> {
        self.unmatched.clone()
    }

    fn build(
        &self,
        route: Option<(&RouteInfo, &Map<String, Value>)>,
        env: CompileEnv<'_>,
    ) -> Arc<PluginChain> {
        let prefer_skip = |name: &str| {
            let Some((_, route_plugins)) = route else {
                return false;
            };
            self.prefer_route.iter().any(|n| n == name)
                && route_plugins
                    .get(name)
                    .is_some_and(|c| c.is_object() && !is_disabled(c))
        };
        let skips_shared = self.shared.iter().any(|e| prefer_skip(e.name));
        if self.per_route.is_empty() && !skips_shared {
            return self.shared_chain.clone();
        }
        let mut entries: Vec<ChainEntry> = self
            .shared
            .iter()
            .filter(|e| !prefer_skip(e.name))
            .cloned()
            .collect();
        for (name, conf, owner) in &self.per_route {
            if prefer_skip(name) {
                continue;
            }
            let src = PluginSource { name, conf, owner };
            match ChainEntry::compile(&src, route.map(|r| r.0), env) {
                Ok(Some(e)) => entries.push(e),
                Ok(None) => {}
                Err(e) => tracing::error!("global rules: {e}"),
            }
        }
        Arc::new(PluginChain::from_entries(entries))
    }

    /// The global chain as it runs for `route` with its merged `route_plugins`: plugins with
    /// `run_policy = "prefer_route"` are left out when the route has the same plugin enabled.
    pub fn for_route(
        &self,
        route: &RouteInfo,
        route_plugins: &Map<String, Value>,
        env: CompileEnv<'_>,
    ) -> Arc<PluginChain> {
        self.build(Some((route, route_plugins)), env)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::{Exit, PluginDef, PluginServices};
    use http::StatusCode;

    use super::*;
    use crate::testing::env;

    #[test]
    fn order_disable_and_priority_override() {
        let owner = Owner::new(ResourceKind::Routes, "chain-t1");
        let lc = json!({"count": 1, "time_window": 60});
        let prom = json!({});
        let srcs = [
            PluginSource {
                name: "prometheus",
                conf: &prom,
                owner: &owner,
            },
            PluginSource {
                name: "limit-count",
                conf: &lc,
                owner: &owner,
            },
        ];
        let c = PluginChain::compile(&srcs, None, env()).unwrap();
        assert_eq!(c.names().collect::<Vec<_>>(), ["limit-count", "prometheus"]);
        assert!(c.has(Phases::ACCESS) && c.has(Phases::LOG) && !c.has(Phases::REWRITE));

        let prom_first = json!({"_meta": {"priority": 2000}});
        let srcs = [
            PluginSource {
                name: "prometheus",
                conf: &prom_first,
                owner: &owner,
            },
            PluginSource {
                name: "limit-count",
                conf: &lc,
                owner: &owner,
            },
        ];
        let c = PluginChain::compile(&srcs, None, env()).unwrap();
        assert_eq!(c.names().collect::<Vec<_>>(), ["prometheus", "limit-count"]);

        let off = json!({"count": 1, "time_window": 60, "_meta": {"disable": true}});
        let srcs = [PluginSource {
            name: "limit-count",
            conf: &off,
            owner: &owner,
        }];
        assert!(PluginChain::compile(&srcs, None, env()).unwrap().is_empty());
    }

    /// A plugin whose compile fails with the conf it was given, to see what it got.
    fn echo_conf(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
        Err(cx.conf.to_string())
    }

    static SECRETIVE: PluginDef = PluginDef {
        encrypt_fields: &["secret", "auth.password"],
        ..PluginDef::new("secretive", 1, || json!({"type": "object"}), echo_conf)
    };

    /// What `secretive` compiles with from `conf`, under a registry built by `registry`.
    fn compiled_conf(registry: PluginRegistry, conf: &Value) -> Value {
        let owner = Owner::new(ResourceKind::Routes, "chain-secret");
        let env = CompileEnv {
            metadata: &HashMap::new(),
            registry: &registry,
            upstreams: &ferrisix_plugin_api::NoUpstreams,
            protos: &Protos::EMPTY,
        };
        let srcs = [PluginSource {
            name: "secretive",
            conf,
            owner: &owner,
        }];
        let e = PluginChain::compile(&srcs, None, env).unwrap_err();
        let text = e.strip_prefix("failed to load plugin secretive: ").unwrap();
        serde_json::from_str(text).unwrap()
    }

    /// Issue 47, item 6: the fields a plugin lists in `encrypt_fields` reach its compile
    /// decrypted when the store holds them encrypted, and as they are otherwise.
    #[test]
    fn encrypted_fields_compile_decrypted() {
        let keyring = ferrisix_config::encrypt::Keyring::apisix_default();
        let stored = json!({"secret": keyring.encrypt("s3cr3t"),
            "auth": {"password": keyring.encrypt("pw"), "user": "u"},
            "plain": keyring.encrypt("not listed")});
        let registry =
            || PluginRegistry::from_defs(Arc::new(PluginServices::default()), [&SECRETIVE]);
        let got = compiled_conf(registry().with_encrypted_fields(keyring.clone()), &stored);
        assert_eq!(
            got,
            json!({"secret": "s3cr3t", "auth": {"password": "pw", "user": "u"},
                "plain": stored["plain"]})
        );
        // A value that does not decrypt (written before encryption was on) is kept.
        let legacy = json!({"secret": "typed in"});
        let got = compiled_conf(registry().with_encrypted_fields(keyring), &legacy);
        assert_eq!(got, legacy);
        // A standalone file holds the values as typed: nothing is decrypted.
        assert_eq!(compiled_conf(registry(), &stored), stored);
    }

    #[test]
    fn global_rules_drop_duplicates_and_prefer_route() {
        let a = json!({"limit-count": {"count": 1, "time_window": 1}, "prometheus": {}});
        let b = json!({"limit-count": {"count": 2, "time_window": 1}});
        let (a, b) = (a.as_object().unwrap(), b.as_object().unwrap());
        let g = GlobalRules::merge([("1", a), ("2", b)]).prepare(env());
        let unmatched = g.unmatched();
        assert_eq!(unmatched.names().collect::<Vec<_>>(), ["prometheus"]);

        let route = RouteInfo {
            id: "r".into(),
            uris: vec!["/".into()].into(),
            ..Default::default()
        };
        let with_prom = json!({"prometheus": {}});
        let chain = g.for_route(&route, with_prom.as_object().unwrap(), env());
        assert!(chain.is_empty(), "prefer_route skips the global prometheus");
        let disabled = json!({"prometheus": {"_meta": {"disable": true}}});
        let chain = g.for_route(&route, disabled.as_object().unwrap(), env());
        assert_eq!(chain.len(), 1);

        // Route-independent global plugins are compiled once and shared.
        let only_lc = json!({"limit-count": {"count": 1, "time_window": 1}});
        let g = GlobalRules::merge([("3", only_lc.as_object().unwrap())]).prepare(env());
        let empty = Map::new();
        let a = g.for_route(&route, &empty, env());
        let b = g.for_route(&RouteInfo::default(), &empty, env());
        assert!(Arc::ptr_eq(&a, &b));
    }

    #[tokio::test]
    async fn exit_takes_error_response() {
        let owner = Owner::new(ResourceKind::Routes, "chain-t2");
        let lc = json!({"count": 1, "time_window": 60, "key_type": "constant", "key": "k",
            "_meta": {"error_response": {"message": "slow down"}}});
        let srcs = [PluginSource {
            name: "limit-count",
            conf: &lc,
            owner: &owner,
        }];
        let c = PluginChain::compile(&srcs, None, env()).unwrap();
        let mut req = TestRequest::get("/");
        assert_eq!(c.access(&mut req.ctx()).await, Flow::Continue);
        let mut req = TestRequest::get("/");
        let mut ctx = req.ctx();
        let Flow::Exit(exit) = c.access(&mut ctx).await else {
            panic!("not rejected")
        };
        assert_eq!(exit.status, 503);
        assert_eq!(exit.body.unwrap(), "{\"message\":\"slow down\"}\n");
        assert_eq!(ctx.response_headers()["x-ratelimit-remaining"], "0");
    }

    #[test]
    fn filter_verdicts() {
        let owner = Owner::new(ResourceKind::Routes, "chain-t3");
        let prom = json!({"_meta": {"filter": [["uri", "==", "/yes"]]}});
        let srcs = [PluginSource {
            name: "prometheus",
            conf: &prom,
            owner: &owner,
        }];
        let c = PluginChain::compile(&srcs, None, env()).unwrap();
        let (mut yes, mut no) = (TestRequest::get("/yes"), TestRequest::get("/no"));
        assert!(c.verdicts(&yes.ctx()).allows(0));
        assert!(!c.verdicts(&no.ctx()).allows(0));
    }

    /// The cost of benchmark scenario 2's plugins per request (`cargo test --release -p
    /// ferrisix-plugins -- --ignored --nocapture hot_path`).
    #[tokio::test]
    #[ignore]
    async fn hot_path_cost() {
        let owner = Owner::new(ResourceKind::Routes, "chain-bench");
        let lc = json!({"count": 2_000_000_000_000u64, "time_window": 60, "rejected_code": 503, "key": "remote_addr"});
        let prom = json!({});
        let srcs = [
            PluginSource {
                name: "limit-count",
                conf: &lc,
                owner: &owner,
            },
            PluginSource {
                name: "prometheus",
                conf: &prom,
                owner: &owner,
            },
        ];
        let route = RouteInfo {
            id: "1".into(),
            uris: vec!["/hello".into()].into(),
            ..Default::default()
        };
        let c = PluginChain::compile(&srcs, Some(&route), env()).unwrap();
        let ip = "127.0.0.1".parse().unwrap();
        let log = LogCtx {
            status: 200,
            matched_uri: Some(0),
            node: Some(ip),
            request_length: 80,
            bytes_sent: 200,
            request_time: std::time::Duration::from_micros(300),
            upstream_time: Some(std::time::Duration::from_micros(200)),
            response_source: ferrisix_plugin_api::ResponseSource::Upstream,
            ..Default::default()
        };
        let n = 1_000_000u32;
        for (label, with_log) in [
            ("access (limit-count)", false),
            ("access + log (both)", true),
        ] {
            let start = std::time::Instant::now();
            for _ in 0..n {
                let mut req = TestRequest::get("/hello").route(route.clone());
                let mut ctx = req.ctx();
                assert_eq!(c.access(&mut ctx).await, Flow::Continue);
                let v = c.verdicts(&ctx);
                if with_log {
                    c.log(&log, v);
                }
            }
            eprintln!(
                "{label}: {:.0} ns/request",
                start.elapsed().as_nanos() as f64 / f64::from(n)
            );
        }
    }

    #[test]
    fn exit_helper() {
        assert_eq!(Exit::status(StatusCode::NOT_FOUND).body, None);
    }
}
