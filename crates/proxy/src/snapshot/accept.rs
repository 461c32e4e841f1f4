//! Validation with quarantine: every stored resource is validated on its own. One that fails
//! is quarantined: logged, left out, and if an earlier version of it was accepted, that
//! version keeps serving (as APISIX keeps the older valid item). Resources the store did not
//! change keep their accepted form without being validated again, and are not even looked at:
//! a compile validates what the diff names.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ferrisix_config::model::{GlobalRule, PluginConfig, ResourceKind, Route, Service, Upstream};
use ferrisix_config::proto::Protos;
use ferrisix_config::shared_map::SharedMap;
use ferrisix_config::state::{ConfigState, StoredItem, StoredValue};
use ferrisix_config::validate::{self, PluginCheck};
use ferrisix_config::vars::compile_vars;
use ferrisix_router::Expr;
use serde_json::Value;

use super::diff::{ConfigDiff, Difference};
use super::upstreams::InlineUpstreams;
use ferrisix_config::parallel;

/// A resource left out of (or held at an older version in) the snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quarantined {
    pub kind: ResourceKind,
    pub id: String,
    pub error: String,
    /// An earlier accepted version keeps serving.
    pub serving_previous: bool,
}

impl Quarantined {
    /// Refused with nothing serving in its place.
    pub(super) fn new(kind: ResourceKind, id: &str, error: String) -> Quarantined {
        Quarantined {
            kind,
            id: id.to_string(),
            error,
            serving_previous: false,
        }
    }
}

/// The accepted version of one resource.
pub(super) struct Accepted<T> {
    /// The stored value that was accepted.
    pub raw: StoredValue,
    pub typed: Arc<T>,
}

impl<T> Clone for Accepted<T> {
    fn clone(&self) -> Self {
        Accepted {
            raw: self.raw.clone(),
            typed: self.typed.clone(),
        }
    }
}

/// A route with its `vars` compiled (boxed: most routes have none, and an `Expr` inline would
/// make every route carry its size).
pub(super) type RouteDef = (Route, Option<Box<Expr>>);

/// The typed routes this accept validated, by id: handed to the compile that follows and
/// dropped with it. An accepted route is kept only as its stored text, which a later compile
/// that must build the route again (a dependency changed) converts again
/// ([`Applied::route_def`]): a typed route is bigger than its text, and keeping every one
/// would cost that difference per route (`examples/route_memory.rs` reports the bytes per
/// route).
pub(super) type FreshRoutes = HashMap<String, Arc<RouteDef>>;

/// The accepted version of every resource the data plane compiles, by kind and id. The maps
/// are shared with the previous compile's and changed where the diff says.
#[derive(Clone, Default)]
pub(super) struct Applied {
    /// The accepted text of each route whose stored version is refused while an earlier
    /// version keeps serving. Every other accepted route's text is the stored one, read from
    /// the state ([`Applied::route_text`]): a map of every route's text beside the state's
    /// cost a tenth of a kilobyte per route at 100,000.
    held_routes: SharedMap<StoredValue>,
    pub services: SharedMap<Accepted<Service>>,
    pub upstreams: SharedMap<Accepted<Upstream>>,
    pub plugin_configs: SharedMap<Accepted<PluginConfig>>,
    pub global_rules: SharedMap<Accepted<GlobalRule>>,
    /// Plugin metadata documents by plugin name, as stored and parsed (each plugin reads its
    /// own).
    pub plugin_metadata: HashMap<String, Accepted<Value>>,
    /// The protos compiled (grpc-transcode reads them), again only when one changed: an
    /// import makes one proto depend on others.
    pub protos: Protos,
    /// Consumers by username, consumer groups by id, credentials by
    /// `<username>/credentials/<id>`: checked, then compiled as stored (`raw`).
    pub consumers: SharedMap<Accepted<()>>,
    pub consumer_groups: SharedMap<Accepted<()>>,
    pub credentials: SharedMap<Accepted<()>>,
    /// Every stored resource that is refused (with an older version serving or not), per kind
    /// in validation order, by id: reported by every compile until it changes.
    refusals: [BTreeMap<String, Quarantined>; 8],
}

/// Every stored proto compiled against the others (a proto without a string `content`, which
/// the Admin API refuses, compiles as empty text).
fn compile_protos(state: &ConfigState) -> Protos {
    let contents = state
        .items_unordered(ResourceKind::Protos)
        .map(|i| {
            let v = i.value.parse();
            let content = v.get("content").and_then(Value::as_str).unwrap_or_default();
            (i.id.clone(), content.to_owned())
        })
        .collect();
    Protos::compile_all(contents)
}

impl Applied {
    /// Accepts `state`: what `diff` says is unchanged keeps its `previous` form, the rest is
    /// validated. Returns what changed in what is served: a refused update that keeps the
    /// previous version serving is no change. Inline upstreams equal to one in `inline` share
    /// its copy.
    pub fn accept(
        state: &ConfigState,
        previous_state: &ConfigState,
        diff: &ConfigDiff,
        previous: &Applied,
        plugins: &(dyn PluginCheck + Sync),
        inline: &InlineUpstreams,
        quarantine: &mut Vec<Quarantined>,
    ) -> (Applied, ConfigDiff, FreshRoutes) {
        let mut applied_diff = ConfigDiff::default();
        let mut fresh_routes = FreshRoutes::new();
        let mut refusals = previous.refusals.clone();
        let [r_up, r_svc, r_pc, r_gr, r_routes, r_consumers, r_groups, r_credentials] =
            &mut refusals;
        let applied = Applied {
            upstreams: accept_kind(
                KindUpdate {
                    state,
                    kind: ResourceKind::Upstreams,
                    changed: &diff.upstreams,
                    refusals: r_up,
                    applied: &mut applied_diff.upstreams,
                },
                &previous.upstreams,
                |id, v| validate::upstream_from_value(Some(id), v).map_err(|e| e.message),
                keep_typed,
            ),
            services: accept_kind(
                KindUpdate {
                    state,
                    kind: ResourceKind::Services,
                    changed: &diff.services,
                    refusals: r_svc,
                    applied: &mut applied_diff.services,
                },
                &previous.services,
                |id, v| {
                    let mut service =
                        validate::service_from_value(id, v, plugins).map_err(|e| e.message)?;
                    service.upstream = service.upstream.map(|u| inline.definition(u));
                    Ok(service)
                },
                keep_typed,
            ),
            plugin_configs: accept_kind(
                KindUpdate {
                    state,
                    kind: ResourceKind::PluginConfigs,
                    changed: &diff.plugin_configs,
                    refusals: r_pc,
                    applied: &mut applied_diff.plugin_configs,
                },
                &previous.plugin_configs,
                |id, v| validate::plugin_config_from_value(id, v, plugins).map_err(|e| e.message),
                keep_typed,
            ),
            global_rules: accept_kind(
                KindUpdate {
                    state,
                    kind: ResourceKind::GlobalRules,
                    changed: &diff.global_rules,
                    refusals: r_gr,
                    applied: &mut applied_diff.global_rules,
                },
                &previous.global_rules,
                |id, v| validate::global_rule_from_value(id, v, plugins).map_err(|e| e.message),
                keep_typed,
            ),
            held_routes: accept_routes(
                KindUpdate {
                    state,
                    kind: ResourceKind::Routes,
                    changed: &diff.routes,
                    refusals: r_routes,
                    applied: &mut applied_diff.routes,
                },
                previous_state,
                previous,
                &mut fresh_routes,
                |id, v| route_def(id, v, plugins, inline),
            ),
            plugin_metadata: state
                .items_unordered(ResourceKind::PluginMetadata)
                .map(|i| {
                    // Parsed again only when its text changed.
                    let typed = match previous.plugin_metadata.get(&i.id) {
                        Some(p) if p.raw == i.value => p.typed.clone(),
                        _ => Arc::new(i.value.parse()),
                    };
                    let raw = i.value.clone();
                    (i.id.clone(), Accepted { raw, typed })
                })
                .collect(),
            protos: if diff.protos.is_empty() {
                previous.protos.clone()
            } else {
                compile_protos(state)
            },
            consumers: accept_checked(
                KindUpdate {
                    state,
                    kind: ResourceKind::Consumers,
                    changed: &diff.consumers,
                    refusals: r_consumers,
                    applied: &mut applied_diff.consumers,
                },
                &previous.consumers,
                plugins,
            ),
            consumer_groups: accept_checked(
                KindUpdate {
                    state,
                    kind: ResourceKind::ConsumerGroups,
                    changed: &diff.consumer_groups,
                    refusals: r_groups,
                    applied: &mut applied_diff.consumer_groups,
                },
                &previous.consumer_groups,
                plugins,
            ),
            credentials: accept_checked(
                KindUpdate {
                    state,
                    kind: ResourceKind::Credentials,
                    changed: &diff.credentials,
                    refusals: r_credentials,
                    applied: &mut applied_diff.credentials,
                },
                &previous.credentials,
                plugins,
            ),
            refusals,
        };
        for kind in &applied.refusals {
            quarantine.extend(kind.values().cloned());
        }
        // A proto that does not compile (an import naming no proto) is held back alone; the
        // routes using it answer as APISIX's do when their proto cannot be loaded.
        for (id, err) in applied.protos.errors() {
            quarantine.push(Quarantined::new(
                ResourceKind::Protos,
                id,
                err.message.clone(),
            ));
        }
        applied_diff.protos = diff.protos.clone();
        // Each replaced or removed route and service may have let go of a shared upstream.
        let [routes, services] = [&applied_diff.routes, &applied_diff.services];
        inline.released(
            routes.changed.len()
                + routes.removed.len()
                + services.changed.len()
                + services.removed.len(),
        );
        applied_diff.plugin_metadata = Difference::between(
            &previous.plugin_metadata,
            &applied.plugin_metadata,
            |a, b| Arc::ptr_eq(&a.typed, &b.typed) || a.raw == b.raw,
        );
        (applied, applied_diff, fresh_routes)
    }

    /// The accepted text of route `id`, `state` being the state this was accepted from:
    /// the held one, none while it is refused with nothing serving, else the stored one.
    pub fn route_text<'a>(&'a self, state: &'a ConfigState, id: &str) -> Option<&'a StoredValue> {
        if let Some(held) = self.held_routes.get(id) {
            return Some(held);
        }
        if self.refusals[ROUTE_REFUSALS].contains_key(id) {
            return None;
        }
        state.get(ResourceKind::Routes, id).map(|i| &i.value)
    }

    /// The typed form of accepted route `id` (`state` as for [`Applied::route_text`]): from
    /// this compile's `fresh` ones, or converted again from its accepted text (which passed
    /// this conversion before, with the same plugins: it passes again).
    pub fn route_def(
        &self,
        state: &ConfigState,
        id: &str,
        fresh: &FreshRoutes,
        plugins: &dyn PluginCheck,
        inline: &InlineUpstreams,
    ) -> Option<Result<Arc<RouteDef>, String>> {
        if let Some(def) = fresh.get(id) {
            return Some(Ok(def.clone()));
        }
        let raw = self.route_text(state, id)?;
        Some(route_def(id, raw.parse(), plugins, inline).map(Arc::new))
    }

    /// The accepted stored values of one kind, by id, parsed (`state` as for
    /// [`Applied::route_text`]).
    pub fn raw(&self, state: &ConfigState, kind: ResourceKind) -> Vec<(String, Arc<Value>)> {
        fn sorted<'a>(
            texts: impl Iterator<Item = (&'a String, &'a StoredValue)>,
        ) -> Vec<(String, Arc<Value>)> {
            let mut v: Vec<_> = texts
                .map(|(k, t)| (k.clone(), Arc::new(t.parse())))
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        }
        fn raw<V>(
            m: &SharedMap<V>,
            text: impl Fn(&V) -> &StoredValue,
        ) -> Vec<(String, Arc<Value>)> {
            sorted(m.iter().map(|(k, a)| (k, text(a))))
        }
        fn of<T>(a: &Accepted<T>) -> &StoredValue {
            &a.raw
        }
        match kind {
            ResourceKind::Routes => sorted(
                state
                    .items_unordered(ResourceKind::Routes)
                    .filter_map(|i| Some((&i.id, self.route_text(state, &i.id)?))),
            ),
            ResourceKind::Upstreams => raw(&self.upstreams, of),
            ResourceKind::Services => raw(&self.services, of),
            ResourceKind::PluginConfigs => raw(&self.plugin_configs, of),
            ResourceKind::GlobalRules => raw(&self.global_rules, of),
            ResourceKind::Consumers => raw(&self.consumers, of),
            ResourceKind::ConsumerGroups => raw(&self.consumer_groups, of),
            ResourceKind::Credentials => raw(&self.credentials, of),
            _ => Vec::new(),
        }
    }
}

/// [`accept_kind`] for kinds compiled from their stored value once checked.
fn accept_checked(
    update: KindUpdate<'_>,
    previous: &SharedMap<Accepted<()>>,
    plugins: &(dyn PluginCheck + Sync),
) -> SharedMap<Accepted<()>> {
    let kind = update.kind;
    accept_kind(
        update,
        previous,
        |_, v| validate::check_resource(kind, &v, plugins).map_err(|e| e.message),
        keep_typed,
    )
}

/// What the accepted map keeps of an item: its stored value and typed form.
fn keep_typed<T>(_: &String, raw: &StoredValue, typed: T) -> Accepted<T> {
    Accepted {
        raw: raw.clone(),
        typed: Arc::new(typed),
    }
}

/// A stored route validated and converted: its inline upstream shares an equal one's copy,
/// its `vars` compiled.
fn route_def(
    id: &str,
    v: Value,
    plugins: &dyn PluginCheck,
    inline: &InlineUpstreams,
) -> Result<RouteDef, String> {
    let mut route = validate::route_from_value(id, v, plugins).map_err(|e| e.message)?;
    route.upstream = route.upstream.map(|u| inline.definition(u));
    let vars = match &route.vars {
        Some(v) => Some(Box::new(compile_vars(v)?)),
        None => None,
    };
    Ok((route, vars))
}

/// Where [`Applied::refusals`] keeps the routes' (the order of [`Applied::accept`]'s kinds).
const ROUTE_REFUSALS: usize = 4;

/// [`accept_kind`] for routes, which are kept as their stored text in the state: the routes
/// `changed` names are validated, each typed route that passes goes to `fresh`, and one that
/// fails keeps its earlier accepted version serving (if any), whose text is held. Returns the
/// held texts.
fn accept_routes(
    update: KindUpdate<'_>,
    previous_state: &ConfigState,
    previous: &Applied,
    fresh: &mut FreshRoutes,
    convert: impl Fn(&str, Value) -> Result<RouteDef, String> + Sync,
) -> SharedMap<StoredValue> {
    let KindUpdate {
        state,
        kind,
        changed,
        refusals,
        applied,
    } = update;
    let mut held = previous.held_routes.clone();
    for (id, named) in validate_named(state, kind, changed, convert) {
        let prev = previous.route_text(previous_state, id);
        refusals.remove(id);
        held.remove(id);
        let Some((_, outcome)) = named else {
            if prev.is_some() {
                applied.removed.insert(id.clone());
            }
            continue;
        };
        match outcome {
            Ok(def) => {
                fresh.insert(id.clone(), Arc::new(def));
                if prev.is_some() {
                    applied.changed.insert(id.clone());
                } else {
                    applied.added.insert(id.clone());
                }
            }
            Err(error) => {
                if let Some(text) = prev {
                    held.insert(id.clone(), text.clone());
                }
                refusals.insert(
                    id.clone(),
                    Quarantined {
                        kind,
                        id: id.clone(),
                        error,
                        serving_previous: prev.is_some(),
                    },
                );
            }
        }
    }
    held
}

/// One kind's share of an accept, which travels together through it: the state it is read
/// from, the ids the diff names, the kind's refusals (kept up to date) and what changed in what
/// is served (filled in).
struct KindUpdate<'a> {
    state: &'a ConfigState,
    kind: ResourceKind,
    changed: &'a Difference,
    refusals: &'a mut BTreeMap<String, Quarantined>,
    applied: &'a mut Difference,
}

/// A stored item and the outcome of its conversion.
type Validated<'s, T> = (&'s StoredItem, Result<T, String>);

/// The ids of one kind that `changed` names, each with its stored item and that item
/// converted (`None` when it is no longer stored), in the diff's order.
fn validate_named<'a, 's, T: Send>(
    state: &'s ConfigState,
    kind: ResourceKind,
    changed: &'a Difference,
    convert: impl Fn(&str, Value) -> Result<T, String> + Sync,
) -> Vec<(&'a String, Option<Validated<'s, T>>)> {
    let named: Vec<(&String, Option<&StoredItem>)> = changed
        .added
        .iter()
        .chain(&changed.changed)
        .chain(&changed.removed)
        .map(|id| (id, state.get(kind, id)))
        .collect();
    // Validation is independent per item: at boot every stored item is named, and they are
    // validated on every core (the outcomes are applied in the same order as named).
    let outcomes = parallel::map(&named, |(id, item)| {
        item.map(|item| convert(id.as_str(), item.value.parse()))
    });
    named
        .into_iter()
        .zip(outcomes)
        .map(|((id, item), outcome)| (id, item.zip(outcome)))
        .collect()
}

/// Accepts the items of one kind that `changed` names (every other one keeps its previous
/// outcome): each is validated, falling back to the last accepted version of an item that no
/// longer validates. The update's `refusals` keeps every refused item of the kind; its
/// `applied` receives what changed in what is served; `keep` makes what the map holds of an accepted item.
fn accept_kind<T: Send, V: Clone>(
    update: KindUpdate<'_>,
    previous: &SharedMap<V>,
    convert: impl Fn(&str, Value) -> Result<T, String> + Sync,
    mut keep: impl FnMut(&String, &StoredValue, T) -> V,
) -> SharedMap<V> {
    let KindUpdate {
        state,
        kind,
        changed,
        refusals,
        applied,
    } = update;
    let mut out = previous.clone();
    for (id, named) in validate_named(state, kind, changed, convert) {
        refusals.remove(id);
        let prev = previous.get(id);
        let Some((item, outcome)) = named else {
            if out.remove(id).is_some() {
                applied.removed.insert(id.clone());
            }
            continue;
        };
        match outcome {
            Ok(typed) => {
                out.insert(id.clone(), keep(id, &item.value, typed));
                if prev.is_some() {
                    applied.changed.insert(id.clone());
                } else {
                    applied.added.insert(id.clone());
                }
            }
            Err(error) => {
                // The previous version (if any) stays in `out` and keeps serving.
                refusals.insert(
                    id.clone(),
                    Quarantined {
                        kind,
                        id: id.clone(),
                        error,
                        serving_previous: prev.is_some(),
                    },
                );
            }
        }
    }
    out
}
