//! Compiling a store's `ConfigState` into the next [`Snapshot`], against the previous one.
//!
//! The compile starts from the explicit diff between the state the previous snapshot compiled
//! and this one ([`ConfigDiff`]), then works down the dependencies:
//!
//! 1. the ssls become the certificate store (see `ssls`); then validation: changed and added
//!    resources are validated (quarantine and fallback, see `accept`); unchanged ones keep
//!    their accepted form;
//! 2. upstreams by id: changed ones are compiled again, the others keep their compiled form
//!    (and so their balancer's position); services' inline upstreams likewise;
//! 3. the global rules' chains: prepared again when a global rule, or the metadata of one of
//!    their plugins, changed;
//! 4. routes: rebuilt when the route itself, its service, its plugin config, an upstream it
//!    uses, the metadata of one of its plugins, or the global chains changed; every other
//!    route is handed on as the same `Arc<CompiledRoute>`;
//! 5. the route table is the previous one with the routes that are new, rebuilt or gone
//!    applied to it (`RouteTable::apply`): everything else is shared with the previous
//!    snapshot's table, which keeps serving unchanged until its last request ends.

use std::collections::HashMap;
use std::sync::Arc;

use ferrisix_config::model::ResourceKind;
use ferrisix_config::state::{ConfigState, StoredItem};
use ferrisix_plugins::{
    CompileEnv, ConsumerSet, GlobalChains, GlobalRules, PluginChain, PluginRegistry,
};
use ferrisix_router::{RouteTable, RouterKind};
use ferrisix_tls::{CertStore, TlsContext};
use serde_json::Value;

use super::accept::{Applied, Quarantined};
use super::diff::{ConfigDiff, Difference, SnapshotDiff};
use super::routes::{compile_slot, Changes, CompiledRoute, RouteInputs, RouteSlot};
use super::ssls;
use super::upstreams::{
    inline_upstream, upstreams_by_id, CompiledUpstream, CompiledUpstreams, Holder, UpstreamEnv,
};
use crate::health::UpstreamChecker;
use crate::nodes::UpstreamServices;

/// The published, immutable serving state.
pub struct Snapshot {
    pub revision: i64,
    pub router: RouteTable<Arc<CompiledRoute>>,
    pub upstreams: HashMap<String, Arc<CompiledUpstream>>,
    pub quarantine: Vec<Quarantined>,
    /// The global rules' plugins for requests that match no route.
    pub global_chain: Arc<PluginChain>,
    /// The certificates of the `ssls`, published with the routes they serve.
    pub tls: Arc<CertStore>,
    /// Every health checker in use, by the resource holding the upstream: routes, then
    /// services, then upstreams, each by id (the order of APISIX's `/v1/healthcheck`).
    pub checkers: Vec<CheckerEntry>,
    /// The consumers (with their credentials and groups) auth plugins find.
    pub consumers: Arc<ConsumerSet>,
    diff: SnapshotDiff,
    cache: CompileCache,
}

/// A health checker and the resource whose upstream it checks.
#[derive(Clone, Debug)]
pub struct CheckerEntry {
    pub kind: ResourceKind,
    pub id: String,
    pub checker: Arc<UpstreamChecker>,
}

/// Options that shape compilation.
#[derive(Clone, Debug, Default)]
pub struct CompileOptions {
    pub router: RouterKind,
    /// `apisix.ssl` and the keyring, for `ssls` and TLS upstreams.
    pub tls: Arc<TlsContext>,
    /// What upstreams compile with: health probers, balancer state, the resolver.
    pub upstreams: Arc<UpstreamServices>,
}

impl CompileOptions {
    /// Whether what was compiled with `self` is valid under `other` (the same router, the
    /// same TLS context, the same upstream services).
    fn same_as(&self, other: &CompileOptions) -> bool {
        self.router == other.router
            && Arc::ptr_eq(&self.tls, &other.tls)
            && Arc::ptr_eq(&self.upstreams, &other.upstreams)
    }
}

/// What the next compile starts from.
#[derive(Default)]
struct CompileCache {
    /// The state this snapshot compiled, which the next diff is taken against.
    source: ConfigState,
    options: CompileOptions,
    applied: Applied,
    /// Inline upstreams of services, by service id.
    service_upstreams: HashMap<String, Arc<CompiledUpstream>>,
    globals: Arc<GlobalChains>,
    /// Compiled routes by route id (enabled routes that compiled).
    routes: HashMap<String, RouteSlot>,
}

impl Snapshot {
    pub fn empty(options: &CompileOptions) -> Snapshot {
        Snapshot {
            revision: 0,
            router: RouteTable::empty(options.router),
            upstreams: HashMap::new(),
            quarantine: Vec::new(),
            global_chain: PluginChain::empty(),
            tls: Arc::new(CertStore::default()),
            checkers: Vec::new(),
            consumers: Arc::default(),
            diff: SnapshotDiff::default(),
            cache: CompileCache {
                options: options.clone(),
                ..CompileCache::default()
            },
        }
    }

    /// The accepted (possibly previous, if quarantined) stored values of one kind, by id.
    pub fn applied(&self, kind: ResourceKind) -> Vec<(String, Arc<Value>)> {
        self.cache.applied.raw(kind)
    }

    /// What this snapshot changed against the one it was compiled after.
    pub fn diff(&self) -> &SnapshotDiff {
        &self.diff
    }

    /// The compiled route `id`, if it is in the route table.
    pub fn route(&self, id: &str) -> Option<&Arc<CompiledRoute>> {
        self.cache.routes.get(id).map(|s| &s.compiled)
    }

    /// Compiles `state`, reusing what `previous` already compiled (which is still alive
    /// meanwhile: unchanged plugin confs lease the same state again).
    pub fn compile(
        state: &ConfigState,
        previous: &Snapshot,
        options: &CompileOptions,
        plugins: &PluginRegistry,
    ) -> Snapshot {
        // Other options change every compiled part: start over.
        let fresh;
        let same_options = previous.cache.options.same_as(options);
        let prev = if same_options {
            &previous.cache
        } else {
            fresh = CompileCache::default();
            &fresh
        };
        let config = ConfigDiff::new(&prev.source, state);
        let mut quarantine = Vec::new();
        let tls = ssls::compile(state, &previous.tls, &options.tls, &mut quarantine);
        let upstream_env = UpstreamEnv {
            ctx: &options.tls,
            store: &tls,
            services: &options.upstreams,
        };

        let applied = Applied::accept(state, &config, &prev.applied, plugins, &mut quarantine);
        let mut applied_diff = Applied::diff(&prev.applied, &applied);
        // The certificate store reuses what did not change; what it applied is the store's
        // diff.
        applied_diff.ssls = config.ssls.clone();

        // Whether a compiled upstream is still valid is `UpstreamEnv::reusable`'s to say (the
        // TLS context may have changed with the options).
        let upstreams = upstreams_by_id(
            &applied.upstreams,
            &applied_diff.upstreams,
            &previous.upstreams,
            upstream_env,
            &mut quarantine,
        );
        let upstream_diff =
            Difference::between(&previous.upstreams, &upstreams, |a, b| Arc::ptr_eq(a, b));
        let service_upstreams = service_upstreams(&applied, prev, upstream_env, &mut quarantine);
        let service_upstream_diff =
            Difference::between(&prev.service_upstreams, &service_upstreams, |a, b| {
                Arc::ptr_eq(a, b)
            });

        // Metadata reaches the plugins when they compile (prometheus applies its
        // `disabled_labels` then); a change of it recompiles the routes and rules using it.
        let metadata: HashMap<String, Value> = applied
            .plugin_metadata
            .iter()
            .map(|(name, v)| (name.clone(), (**v).clone()))
            .collect();
        // Plugins may send requests to the upstreams compiled so far (traffic-split).
        let resolver = CompiledUpstreams::new(&upstreams, upstream_env);
        let plugin_env = CompileEnv {
            metadata: &metadata,
            registry: plugins,
            upstreams: &resolver,
        };
        let globals_changed = !applied_diff.global_rules.is_empty()
            || applied.global_rules.values().any(|rule| {
                rule.typed
                    .plugins
                    .keys()
                    .any(|p| applied_diff.plugin_metadata.touches(p))
            })
            || !same_options;
        let globals = if globals_changed {
            Arc::new(prepare_globals(state, &applied, plugin_env))
        } else {
            prev.globals.clone()
        };

        // The consumers are compiled again when a consumer, group or credential changed, or
        // anything their plugins compile against (metadata, the global rules' services).
        let consumers_changed = !applied_diff.consumers.is_empty()
            || !applied_diff.consumer_groups.is_empty()
            || !applied_diff.credentials.is_empty()
            || !applied_diff.plugin_metadata.is_empty()
            || !same_options;
        let consumers = if consumers_changed {
            let (set, problems) = ConsumerSet::compile(
                &applied.raw(ResourceKind::Consumers),
                &applied.raw(ResourceKind::ConsumerGroups),
                &applied.raw(ResourceKind::Credentials),
                &options.tls.keyring,
                plugin_env,
            );
            for p in problems {
                quarantine.push(Quarantined::new(p.kind, &p.id, p.error));
            }
            Arc::new(set)
        } else {
            previous.consumers.clone()
        };

        let changes = Changes {
            applied: &applied_diff,
            upstreams: &upstream_diff,
            service_upstreams: &service_upstream_diff,
            globals: globals_changed,
        };
        let inputs = RouteInputs {
            applied: &applied,
            upstreams: &upstreams,
            service_upstreams: &service_upstreams,
            globals: &globals,
            env: plugin_env,
            upstream_env,
        };
        let mut order: Vec<&StoredItem> = state.items(ResourceKind::Routes).collect();
        order.sort_by_key(|i| i.seq);
        let mut slots: Vec<(String, RouteSlot)> = Vec::with_capacity(order.len());
        for item in order {
            let Some(acc) = applied.routes.get(&item.id) else {
                continue;
            };
            if !acc.typed.0.enabled {
                continue;
            }
            let before = prev.routes.get(&item.id);
            let inline_still_valid = |slot: &RouteSlot| match (&slot.inline, &acc.typed.0.upstream)
            {
                (Some(c), Some(up)) => upstream_env.reusable(c, up),
                _ => true,
            };
            let reused = before.filter(|slot| {
                !applied_diff.routes.touches(&item.id)
                    && !slot.deps.touched_by(&changes)
                    && inline_still_valid(slot)
            });
            let slot = match reused {
                Some(slot) => slot.clone(),
                None => match compile_slot(&acc.typed, item.seq, &inputs, before) {
                    Ok(slot) => slot,
                    Err(e) => {
                        quarantine.push(Quarantined::new(ResourceKind::Routes, &item.id, e));
                        continue;
                    }
                },
            };
            slots.push((item.id.clone(), slot));
        }
        // The table takes the routes that are new, rebuilt or gone; the rest of it is shared
        // with the previous snapshot's (which keeps serving unchanged meanwhile).
        let mut router = if same_options {
            previous.router.clone()
        } else {
            RouteTable::empty(options.router)
        };
        let kept = |id: &String, slot: &RouteSlot| {
            prev.routes
                .get(id)
                .is_some_and(|p| p.seq == slot.seq && Arc::ptr_eq(&p.compiled, &slot.compiled))
        };
        let fresh: HashMap<&String, &RouteSlot> = slots.iter().map(|(id, s)| (id, s)).collect();
        let removed = prev
            .routes
            .iter()
            .filter(|(id, _)| !fresh.get(id).is_some_and(|s| kept(id, s)))
            .map(|(_, old)| old.seq);
        let mut placed = Vec::new();
        let mut inserts = Vec::new();
        for (i, (id, slot)) in slots.iter().enumerate() {
            if !kept(id, slot) {
                placed.push(i);
                inserts.push((slot.seq, slot.entry()));
            }
        }
        let errors = router.apply(removed, inserts);
        let mut refused = vec![false; slots.len()];
        for e in errors {
            let index = placed[e.index];
            refused[index] = true;
            quarantine.push(Quarantined::new(
                ResourceKind::Routes,
                &slots[index].0,
                e.message,
            ));
        }
        drop(fresh);
        let routes: HashMap<String, RouteSlot> = slots
            .into_iter()
            .zip(refused)
            .filter(|(_, refused)| !refused)
            .map(|(slot, _)| slot)
            .collect();
        let route_diff = Difference::between(&prev.routes, &routes, |a, b| {
            Arc::ptr_eq(&a.compiled, &b.compiled)
        });

        for ((kind, id), error) in &state.unreadable {
            quarantine.push(Quarantined {
                kind: *kind,
                id: id.clone(),
                error: error.clone(),
                serving_previous: state.get(*kind, id).is_some(),
            });
        }
        for item in &quarantine {
            tracing::error!(
                kind = item.kind.dir(),
                id = %item.id,
                serving_previous = item.serving_previous,
                "resource refused: {}",
                item.error
            );
        }
        let checkers = checkers(&routes, &service_upstreams, &upstreams);
        Snapshot {
            revision: state.revision,
            router,
            upstreams: upstreams.clone(),
            quarantine,
            global_chain: globals.unmatched(),
            tls,
            checkers,
            consumers,
            diff: SnapshotDiff {
                config,
                applied: applied_diff,
                routes: route_diff,
                upstreams: upstream_diff,
            },
            cache: CompileCache {
                source: state.clone(),
                options: options.clone(),
                applied,
                service_upstreams,
                globals,
                routes,
            },
        }
    }
}

/// Services' inline upstreams, reused while the definition is equal.
fn service_upstreams(
    applied: &Applied,
    prev: &CompileCache,
    env: UpstreamEnv<'_>,
    quarantine: &mut Vec<Quarantined>,
) -> HashMap<String, Arc<CompiledUpstream>> {
    let mut out = HashMap::new();
    for (id, acc) in &applied.services {
        let Some(up) = &acc.typed.upstream else {
            continue;
        };
        let holder = Holder {
            kind: ResourceKind::Services,
            id,
        };
        match inline_upstream(up, holder, prev.service_upstreams.get(id), env) {
            Ok(c) => {
                out.insert(id.clone(), c);
            }
            Err(e) => quarantine.push(Quarantined::new(ResourceKind::Services, id, e)),
        }
    }
    out
}

/// The health checkers of the routes' and services' inline upstreams and of the upstreams, as
/// `_get_health_checkers` lists them.
fn checkers(
    routes: &HashMap<String, RouteSlot>,
    service_upstreams: &HashMap<String, Arc<CompiledUpstream>>,
    upstreams: &HashMap<String, Arc<CompiledUpstream>>,
) -> Vec<CheckerEntry> {
    let inline: HashMap<&String, &Arc<CompiledUpstream>> = routes
        .iter()
        .filter_map(|(id, slot)| slot.inline.as_ref().map(|u| (id, u)))
        .collect();
    let mut out = Vec::new();
    for (kind, map) in [
        (ResourceKind::Routes, inline),
        (ResourceKind::Services, service_upstreams.iter().collect()),
        (ResourceKind::Upstreams, upstreams.iter().collect()),
    ] {
        let mut ids: Vec<&String> = map.keys().copied().collect();
        ids.sort();
        for id in ids {
            if let Some(c) = &map[id].checker {
                out.push(CheckerEntry {
                    kind,
                    id: id.clone(),
                    checker: c.clone(),
                });
            }
        }
    }
    out
}

/// The global rules' plugins, merged in APISIX's iteration order and compiled.
fn prepare_globals(state: &ConfigState, applied: &Applied, env: CompileEnv<'_>) -> GlobalChains {
    let mut rules: Vec<&StoredItem> = state.items(ResourceKind::GlobalRules).collect();
    rules.sort_by_key(|i| i.seq);
    GlobalRules::merge(
        rules
            .iter()
            .filter_map(|i| applied.global_rules.get(&i.id))
            .map(|acc| (acc.typed.id.as_str(), &acc.typed.plugins)),
    )
    .prepare(env)
}
