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
//!    their plugins (of any plugin, for `public-api`, which builds the plugins' APIs from
//!    theirs), changed;
//! 4. routes: rebuilt when the route itself, its service, its plugin config, an upstream it
//!    uses, the metadata of one of its plugins (any, for `public-api`), or the global chains
//!    changed; every other
//!    route is handed on as the same `Arc<CompiledRoute>`;
//! 5. the route table is the previous one with the routes that are new, rebuilt or gone
//!    applied to it (`RouteTable::apply`): everything else is shared with the previous
//!    snapshot's table, which keeps serving unchanged until its last request ends.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrisix_config::model::ResourceKind;
use ferrisix_config::shared_map::SharedMap;
use ferrisix_config::state::{ConfigState, StoredItem};
use ferrisix_plugins::{
    CompileEnv, ConsumerChains, ConsumerSet, GlobalChains, GlobalRules, PluginChain, PluginRegistry,
};
use ferrisix_router::{RouteTable, RouterKind};
use ferrisix_tls::{CertStore, TlsContext};
use serde_json::Value;

use super::accept::{Applied, Quarantined};
use super::diff::{ConfigDiff, Difference, SnapshotDiff};
use super::routes::{
    compile_slot, Changes, CompiledRoute, RouteInputs, RouteSlot, API_PLUGIN, PROTO_PLUGIN,
};
use super::ssls;
use super::upstreams::{
    inline_upstream, upstreams_by_id, CompiledUpstream, CompiledUpstreams, Holder, PluginUpstreams,
    UpstreamEnv,
};
use crate::upstream::health::UpstreamChecker;
use crate::upstream::nodes::UpstreamServices;
use ferrisix_config::parallel;

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
    /// The consumers (with their credentials and groups) auth plugins find, and the route
    /// chains merged with their plugins, per (route, consumer), for this snapshot only.
    pub consumers: Arc<ConsumerChains>,
    /// How long the compile that made this snapshot spent in each stage.
    pub stages: CompileStages,
    cache: CompileCache,
}

/// A health checker and the resource whose upstream it checks.
#[derive(Clone, Debug)]
pub struct CheckerEntry {
    pub kind: ResourceKind,
    pub id: String,
    pub checker: Arc<UpstreamChecker>,
}

/// The time one compile spent in its stages (the `configuration applied` log line reports
/// them): validating what changed, compiling the routes that need it (upstreams, plugin
/// chains), and applying them to the route table.
#[derive(Clone, Copy, Debug, Default)]
pub struct CompileStages {
    pub validate: Duration,
    pub routes: Duration,
    pub table: Duration,
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
    /// Compiled routes by route id (enabled routes that compiled); shared with the next
    /// compile, which changes only the routes it touches.
    /// Boxed: a shard copied for a change copies pointers, and the maps' spare buckets are
    /// pointer-sized.
    routes: SharedMap<Arc<RouteSlot>>,
    /// Routes that failed to compile or to enter the table, by id: reported again by every
    /// compile until they change.
    route_refusals: SharedMap<Quarantined>,
    /// The health checkers of the routes' inline upstreams, by route id: changed only for the
    /// routes a compile touches (most routes have none).
    route_checkers: Arc<BTreeMap<String, Arc<UpstreamChecker>>>,
    /// The plugins' inline upstreams of the global rules' chains and of the consumers, kept
    /// with them while they are not compiled again.
    global_upstreams: PluginUpstreams,
    consumer_upstreams: PluginUpstreams,
    /// The routes' plugins' inline upstreams, by route id: changed only for the routes a
    /// compile touches, as `route_checkers`.
    route_plugin_upstreams: Arc<BTreeMap<String, PluginUpstreams>>,
    /// Every plugin's inline upstream in use, each once by resource path (routes', global
    /// rules', consumers'), which the next compile reuses.
    plugin_upstreams: PluginUpstreams,
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
            stages: CompileStages::default(),
            cache: CompileCache {
                options: options.clone(),
                ..CompileCache::default()
            },
        }
    }

    /// What upstreams compiled with (the control API reads the registries from it).
    pub fn upstream_services(&self) -> &Arc<UpstreamServices> {
        &self.cache.options.upstreams
    }

    /// The accepted (possibly previous, if quarantined) stored values of one kind, by id.
    pub fn applied(&self, kind: ResourceKind) -> Vec<(String, Arc<Value>)> {
        self.cache.applied.raw(&self.cache.source, kind)
    }

    /// The state this snapshot compiled (the stream proxy reads its `stream_routes` here).
    pub fn source(&self) -> &ConfigState {
        &self.cache.source
    }

    /// The compiled inline upstream of service `id`.
    pub fn service_upstream(&self, id: &str) -> Option<&Arc<CompiledUpstream>> {
        self.cache.service_upstreams.get(id)
    }

    /// Compiles the inline upstream `conf` of a resource the HTTP snapshot does not serve
    /// (a stream route), with this snapshot's certificates and the process' upstream
    /// services; `previous` (its compiled form in the last compile) keeps its balancer and
    /// health state while the definition is unchanged.
    pub fn compile_upstream(
        &self,
        kind: ResourceKind,
        id: &str,
        conf: &Value,
        previous: Option<&Arc<CompiledUpstream>>,
    ) -> Result<Arc<CompiledUpstream>, String> {
        let up = ferrisix_config::validate::upstream_from_value(None, conf)
            .map_err(|e| e.to_string())?;
        let options = &self.cache.options;
        let up = options.upstreams.inline.definition(Arc::new(up));
        let env = UpstreamEnv {
            ctx: &options.tls,
            store: &self.tls,
            services: &options.upstreams,
        };
        inline_upstream(&up, Holder::Resource { kind, id }, previous, env)
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
        Snapshot::compile_diffed(state, previous, options, plugins).0
    }

    /// [`Snapshot::compile`], with what the new snapshot changed against `previous`. The
    /// snapshot does not keep it: the first one's would list every resource (a tenth of a
    /// kilobyte per route at boot) for as long as it serves.
    pub fn compile_diffed(
        state: &ConfigState,
        previous: &Snapshot,
        options: &CompileOptions,
        plugins: &PluginRegistry,
    ) -> (Snapshot, SnapshotDiff) {
        // Other options change every compiled part: start over.
        let fresh;
        let same_options = previous.cache.options.same_as(options);
        let prev = if same_options {
            &previous.cache
        } else {
            fresh = CompileCache::default();
            &fresh
        };
        let started = Instant::now();
        let config = ConfigDiff::new(&prev.source, state);
        let mut quarantine = Vec::new();
        let tls = ssls::compile(state, &previous.tls, &options.tls, &mut quarantine);
        let upstream_env = UpstreamEnv {
            ctx: &options.tls,
            store: &tls,
            services: &options.upstreams,
        };

        let (applied, mut applied_diff, fresh_routes) = Applied::accept(
            state,
            &prev.source,
            &config,
            &prev.applied,
            plugins,
            &options.upstreams.inline,
            &mut quarantine,
        );
        // The certificate store reuses what did not change; what it applied is the store's
        // diff.
        applied_diff.ssls = config.ssls.clone();
        let validated = Instant::now();

        // Whether a compiled upstream is still valid is `UpstreamEnv::reusable`'s to say (the
        // TLS context may have changed with the options).
        // Upstreams by id are few next to routes (inline ones are compiled with their route):
        // a plain map of them per compile is cheap.
        let applied_upstreams: HashMap<String, _> = applied
            .upstreams
            .iter()
            .map(|(id, acc)| (id.clone(), acc.clone()))
            .collect();
        let upstreams = upstreams_by_id(
            &applied_upstreams,
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
            .map(|(name, v)| (name.clone(), (*v.typed).clone()))
            .collect();
        // Plugins may send requests to the upstreams compiled so far (traffic-split).
        let resolver = CompiledUpstreams::new(&upstreams, upstream_env, &prev.plugin_upstreams);
        let plugin_env = CompileEnv {
            metadata: &metadata,
            registry: plugins,
            upstreams: &resolver,
            protos: &applied.protos,
        };
        let globals_changed = !applied_diff.global_rules.is_empty()
            || applied.global_rules.values().any(|rule| {
                rule.typed.plugins.keys().any(|p| {
                    applied_diff.plugin_metadata.touches(p)
                        || (p == API_PLUGIN && !applied_diff.plugin_metadata.is_empty())
                })
            })
            || (!applied_diff.protos.is_empty()
                && applied
                    .global_rules
                    .values()
                    .any(|rule| rule.typed.plugins.contains_key(PROTO_PLUGIN)))
            || !same_options;
        let (globals, global_upstreams) = if globals_changed {
            let globals = Arc::new(prepare_globals(state, &applied, plugin_env));
            (globals, resolver.take_asked())
        } else {
            (prev.globals.clone(), prev.global_upstreams.clone())
        };

        // The consumers are compiled again when a consumer, group or credential changed, or
        // anything their plugins compile against (metadata, the global rules' services).
        let consumers_changed = !applied_diff.consumers.is_empty()
            || !applied_diff.consumer_groups.is_empty()
            || !applied_diff.credentials.is_empty()
            || !applied_diff.plugin_metadata.is_empty()
            || !applied_diff.protos.is_empty()
            || !same_options;
        let consumers = if consumers_changed {
            let (set, problems) = ConsumerSet::compile(
                &applied.raw(state, ResourceKind::Consumers),
                &applied.raw(state, ResourceKind::ConsumerGroups),
                &applied.raw(state, ResourceKind::Credentials),
                &options.tls.keyring,
                // `$env://` references read the gateway's environment, as APISIX's workers.
                &ferrisix_config::env::process_env,
                plugin_env,
            );
            for p in problems {
                quarantine.push(Quarantined::new(p.kind, &p.id, p.error));
            }
            Arc::new(set)
        } else {
            previous.consumers.set.clone()
        };
        let consumer_upstreams = if consumers_changed {
            resolver.take_asked()
        } else {
            prev.consumer_upstreams.clone()
        };
        // A fresh merge cache: what it would hold of the previous snapshot may have changed.
        let consumers = Arc::new(ConsumerChains::new(consumers));

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
            resolver: &resolver,
        };
        // Routes depend on more than themselves only through what `RouteDeps` lists, the
        // global chains, the options and (inline upstreams' client certificates) the ssls: while
        // none of those changed, only the routes the diff names are looked at.
        let dependencies_changed = !same_options
            || globals_changed
            || !applied_diff.services.is_empty()
            || !applied_diff.plugin_configs.is_empty()
            || !applied_diff.plugin_metadata.is_empty()
            || !applied_diff.protos.is_empty()
            || !upstream_diff.is_empty()
            || !service_upstream_diff.is_empty()
            || !config.ssls.is_empty();
        let candidates: Vec<&String> = if dependencies_changed {
            // Every stored route (those refused with nothing serving are found so below).
            state
                .items_unordered(ResourceKind::Routes)
                .map(|i| &i.id)
                .chain(prev.routes.keys())
                .chain(prev.route_refusals.keys())
                .collect()
        } else {
            applied_diff
                .routes
                .added
                .iter()
                .chain(&applied_diff.routes.changed)
                .chain(&applied_diff.routes.removed)
                .collect()
        };
        let mut routes = prev.routes.clone();
        let mut route_refusals = prev.route_refusals.clone();
        // The table takes the routes that are new, rebuilt or gone; the rest of it is shared
        // with the previous snapshot's (which keeps serving unchanged meanwhile).
        let mut router = if same_options {
            previous.router.clone()
        } else {
            RouteTable::empty(options.router)
        };
        let mut route_diff = Difference::default();
        let mut removed_keys = Vec::new();
        let mut placed: Vec<(String, Arc<RouteSlot>)> = Vec::new();
        // Their table entries, in the same order.
        let mut inserts = Vec::new();
        // Which candidates are compiled is decided here, in order; the compiles themselves
        // are independent of each other and run on every core when there are many (boot),
        // then their outcomes are applied in the same order.
        let mut seen = std::collections::HashSet::new();
        let mut steps: Vec<RouteStep<'_>> = Vec::new();
        for id in candidates {
            if !seen.insert(id) {
                continue;
            }
            route_refusals.remove(id);
            let before = prev.routes.get(id);
            // A route that is neither accepted nor stored is gone; one that is disabled is
            // found so when its definition is read, below.
            let compile = match state.get(ResourceKind::Routes, id) {
                Some(item) if applied.route_text(state, id).is_some() => {
                    // Its inline upstream's compiled form holds the definition it was built
                    // from, which is the accepted one while the route is unchanged.
                    let inline_still_valid = |slot: &RouteSlot| match &slot.inline {
                        Some(c) => upstream_env.reusable(c, &c.source),
                        None => true,
                    };
                    let reused = before.is_some_and(|slot| {
                        slot.seq == item.seq
                            && !applied_diff.routes.touches(id)
                            && !slot.touched_by(&changes)
                            && inline_still_valid(slot)
                    });
                    if reused {
                        continue;
                    }
                    Some(item.seq)
                }
                _ => None,
            };
            steps.push(RouteStep {
                id,
                before,
                compile,
            });
        }
        let outcomes = parallel::map(&steps, |step| {
            let seq = step.compile?;
            let def = match applied.route_def(
                state,
                step.id,
                &fresh_routes,
                plugins,
                &options.upstreams.inline,
            )? {
                Ok(def) => def,
                Err(e) => return Some(Err(e)),
            };
            def.0
                .enabled
                .then(|| compile_slot(&def, seq, &inputs, step.before.map(|b| &**b)))
        });
        drop(fresh_routes);
        for (step, outcome) in steps.into_iter().zip(outcomes) {
            let id = step.id;
            let slot = match outcome {
                None => None,
                Some(Ok((slot, entry))) => Some((Arc::new(slot), entry)),
                Some(Err(e)) => {
                    route_refusals
                        .insert(id.clone(), Quarantined::new(ResourceKind::Routes, id, e));
                    None
                }
            };
            if let Some(b) = step.before {
                removed_keys.push(table_key(b.seq, id));
            }
            match slot {
                Some((slot, entry)) => {
                    inserts.push((table_key(slot.seq, id), entry));
                    placed.push((id.clone(), slot));
                }
                None => {
                    if routes.remove(id).is_some() {
                        route_diff.removed.insert(id.clone());
                    }
                }
            }
        }
        let routes_compiled = Instant::now();
        let errors = router.apply(removed_keys, inserts);
        let stages = CompileStages {
            validate: validated - started,
            routes: routes_compiled - validated,
            table: routes_compiled.elapsed(),
        };
        let mut refused = vec![false; placed.len()];
        for e in errors {
            refused[e.index] = true;
            let id = &placed[e.index].0;
            route_refusals.insert(
                id.clone(),
                Quarantined::new(ResourceKind::Routes, id, e.message),
            );
        }
        for ((id, slot), refused) in placed.into_iter().zip(refused) {
            let had = if refused {
                routes.remove(&id).is_some()
            } else {
                routes.insert(id.clone(), slot).is_some()
            };
            match (had, refused) {
                (true, true) => route_diff.removed.insert(id),
                (true, false) => route_diff.changed.insert(id),
                (false, false) => route_diff.added.insert(id),
                (false, true) => false,
            };
        }
        // Routes refused here stay reported until they change (in route insertion order).
        let mut refusals: Vec<&Quarantined> = route_refusals.values().collect();
        refusals.sort_by_key(|q| state.get(ResourceKind::Routes, &q.id).map(|i| i.seq));
        quarantine.extend(refusals.into_iter().cloned());

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
        let mut route_checkers = prev.route_checkers.clone();
        for id in route_diff
            .added
            .iter()
            .chain(&route_diff.changed)
            .chain(&route_diff.removed)
        {
            let now = routes
                .get(id)
                .and_then(|slot| slot.inline.as_ref())
                .and_then(|u| u.checker.as_ref());
            match now {
                Some(c) => {
                    if !route_checkers
                        .get(id)
                        .is_some_and(|old| Arc::ptr_eq(old, c))
                    {
                        Arc::make_mut(&mut route_checkers).insert(id.clone(), c.clone());
                    }
                }
                None => {
                    if route_checkers.contains_key(id) {
                        Arc::make_mut(&mut route_checkers).remove(id);
                    }
                }
            }
        }
        let mut route_plugin_upstreams = prev.route_plugin_upstreams.clone();
        for id in route_diff
            .added
            .iter()
            .chain(&route_diff.changed)
            .chain(&route_diff.removed)
        {
            match routes.get(id).map(|slot| &slot.plugin_upstreams) {
                Some(ups) if !ups.is_empty() => {
                    Arc::make_mut(&mut route_plugin_upstreams).insert(id.clone(), ups.clone());
                }
                _ => {
                    if route_plugin_upstreams.contains_key(id) {
                        Arc::make_mut(&mut route_plugin_upstreams).remove(id);
                    }
                }
            }
        }
        // Each once, by resource path (a service's plugin conf runs in all its routes).
        let plugin_upstreams: PluginUpstreams = route_plugin_upstreams
            .values()
            .flatten()
            .chain(&global_upstreams)
            .chain(&consumer_upstreams)
            .map(|(key, up)| (key.clone(), up.clone()))
            .collect::<BTreeMap<_, _>>()
            .into_iter()
            .collect();
        let checkers = checkers(
            &route_checkers,
            &service_upstreams,
            &upstreams,
            &plugin_upstreams,
        );
        let diff = SnapshotDiff {
            config,
            applied: applied_diff,
            routes: route_diff,
            upstreams: upstream_diff,
        };
        let snapshot = Snapshot {
            revision: state.revision,
            router,
            upstreams: upstreams.clone(),
            quarantine,
            global_chain: globals.unmatched(),
            tls,
            checkers,
            consumers,
            stages,
            cache: CompileCache {
                source: state.clone(),
                options: options.clone(),
                applied,
                service_upstreams,
                globals,
                global_upstreams,
                consumer_upstreams,
                plugin_upstreams,
                routes,
                route_refusals,
                route_checkers,
                route_plugin_upstreams,
            },
        };
        (snapshot, diff)
    }
}

/// A route's key in the table: its place in the insertion order, then its id (so ties of a
/// hand-built state's equal `seq`s fall to id order, as a sort of the ids by `seq` would).
fn table_key(seq: u64, id: &str) -> Vec<u8> {
    let mut key = seq.to_be_bytes().to_vec();
    key.extend_from_slice(id.as_bytes());
    key
}

/// Services' inline upstreams, reused while the definition is equal.
fn service_upstreams(
    applied: &Applied,
    prev: &CompileCache,
    env: UpstreamEnv<'_>,
    quarantine: &mut Vec<Quarantined>,
) -> HashMap<String, Arc<CompiledUpstream>> {
    let mut out = HashMap::new();
    for (id, acc) in applied.services.iter() {
        let Some(up) = &acc.typed.upstream else {
            continue;
        };
        let holder = Holder::Resource {
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
/// `_get_health_checkers` lists them (routes, services, upstreams, each by id), with the
/// plugins' inline upstreams (traffic-split's) beside their holder's: APISIX builds no checker
/// for those, ferrisix does, so they are listed under their resource path, the name APISIX's
/// health-check manager gives a plugin's upstream (the route `1` holds
/// `1#plugins['traffic-split'].rules[0].weighted_upstreams[0].upstream`, listed after `1`).
/// Holders other than routes and services (plugin configs, global rules, consumers) follow
/// the upstreams.
fn checkers(
    routes: &BTreeMap<String, Arc<UpstreamChecker>>,
    service_upstreams: &HashMap<String, Arc<CompiledUpstream>>,
    upstreams: &HashMap<String, Arc<CompiledUpstream>>,
    plugin_upstreams: &PluginUpstreams,
) -> Vec<CheckerEntry> {
    let rank = |kind: ResourceKind| match kind {
        ResourceKind::Routes => 0,
        ResourceKind::Services => 1,
        ResourceKind::Upstreams => 2,
        other => {
            3 + ResourceKind::ALL
                .iter()
                .position(|k| *k == other)
                .unwrap_or(0)
        }
    };
    let mut all: Vec<(ResourceKind, String, &Arc<UpstreamChecker>)> = routes
        .iter()
        .map(|(id, c)| (ResourceKind::Routes, id.clone(), c))
        .collect();
    for (kind, map) in [
        (ResourceKind::Services, service_upstreams),
        (ResourceKind::Upstreams, upstreams),
    ] {
        for (id, up) in map {
            if let Some(c) = &up.checker {
                all.push((kind, id.clone(), c));
            }
        }
    }
    for (key, up) in plugin_upstreams {
        if let (Some((kind, id)), Some(c)) = (plugin_holder(key), &up.checker) {
            all.push((kind, id, c));
        }
    }
    all.sort_by(|a, b| (rank(a.0), &a.1).cmp(&(rank(b.0), &b.1)));
    all.into_iter()
        .map(|(kind, id, checker)| CheckerEntry {
            kind,
            id,
            checker: checker.clone(),
        })
        .collect()
}

/// The holder of a plugin's upstream and its id with the path in it:
/// `/apisix/routes/1#plugins[...]` is route `1#plugins[...]`.
fn plugin_holder(key: &str) -> Option<(ResourceKind, String)> {
    let (owner, path) = key.split_once('#')?;
    let (dir, id) = owner.rsplit_once('/')?;
    let kind = ResourceKind::from_dir(dir.rsplit('/').next()?)?;
    Some((kind, format!("{id}#{path}")))
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

/// One route the compile looks at: its previous slot, and its place in the insertion order
/// when it is to be compiled (`None`: gone).
struct RouteStep<'c> {
    id: &'c String,
    before: Option<&'c Arc<RouteSlot>>,
    compile: Option<u64>,
}
