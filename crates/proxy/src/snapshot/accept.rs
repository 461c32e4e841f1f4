//! Validation with quarantine: every stored resource is validated on its own. One that fails
//! is quarantined: logged, left out, and if an earlier version of it was accepted, that
//! version keeps serving (as APISIX keeps the older valid item). Resources the store did not
//! change keep their accepted form without being validated again.

use std::collections::HashMap;
use std::sync::Arc;

use ferrisix_config::model::{GlobalRule, PluginConfig, ResourceKind, Route, Service, Upstream};
use ferrisix_config::state::ConfigState;
use ferrisix_config::validate::{self, PluginCheck};
use ferrisix_config::vars::compile_vars;
use ferrisix_router::Expr;
use serde_json::Value;

use super::diff::{ConfigDiff, Difference};

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
    pub raw: Arc<Value>,
    pub typed: Arc<T>,
    /// Why the store's newer value was refused, while this older one keeps serving.
    pub refused: Option<String>,
}

impl<T> Clone for Accepted<T> {
    fn clone(&self) -> Self {
        Accepted {
            raw: self.raw.clone(),
            typed: self.typed.clone(),
            refused: self.refused.clone(),
        }
    }
}

/// A route with its `vars` compiled.
pub(super) type RouteDef = (Route, Option<Expr>);

/// The accepted version of every resource the data plane compiles, by kind and id.
#[derive(Clone, Default)]
pub(super) struct Applied {
    pub routes: HashMap<String, Accepted<RouteDef>>,
    pub services: HashMap<String, Accepted<Service>>,
    pub upstreams: HashMap<String, Accepted<Upstream>>,
    pub plugin_configs: HashMap<String, Accepted<PluginConfig>>,
    pub global_rules: HashMap<String, Accepted<GlobalRule>>,
    /// Plugin metadata documents by plugin name, as stored (each plugin reads its own).
    pub plugin_metadata: HashMap<String, Arc<Value>>,
    /// Consumers by username, consumer groups by id, credentials by
    /// `<username>/credentials/<id>`: checked, then compiled as stored (`raw`).
    pub consumers: HashMap<String, Accepted<()>>,
    pub consumer_groups: HashMap<String, Accepted<()>>,
    pub credentials: HashMap<String, Accepted<()>>,
}

impl Applied {
    /// Accepts `state`: what `diff` says is unchanged keeps its `previous` form, the rest is
    /// validated.
    pub fn accept(
        state: &ConfigState,
        diff: &ConfigDiff,
        previous: &Applied,
        plugins: &dyn PluginCheck,
        quarantine: &mut Vec<Quarantined>,
    ) -> Applied {
        Applied {
            upstreams: accept_kind(
                state,
                ResourceKind::Upstreams,
                &diff.upstreams,
                &previous.upstreams,
                quarantine,
                |id, v| validate::upstream_from_value(Some(id), v).map_err(|e| e.message),
            ),
            services: accept_kind(
                state,
                ResourceKind::Services,
                &diff.services,
                &previous.services,
                quarantine,
                |id, v| validate::service_from_value(id, v, plugins).map_err(|e| e.message),
            ),
            plugin_configs: accept_kind(
                state,
                ResourceKind::PluginConfigs,
                &diff.plugin_configs,
                &previous.plugin_configs,
                quarantine,
                |id, v| validate::plugin_config_from_value(id, v, plugins).map_err(|e| e.message),
            ),
            global_rules: accept_kind(
                state,
                ResourceKind::GlobalRules,
                &diff.global_rules,
                &previous.global_rules,
                quarantine,
                |id, v| validate::global_rule_from_value(id, v, plugins).map_err(|e| e.message),
            ),
            routes: accept_kind(
                state,
                ResourceKind::Routes,
                &diff.routes,
                &previous.routes,
                quarantine,
                |id, v| {
                    let route =
                        validate::route_from_value(id, v, plugins).map_err(|e| e.message)?;
                    let vars = match &route.vars {
                        Some(v) => Some(compile_vars(v)?),
                        None => None,
                    };
                    Ok((route, vars))
                },
            ),
            plugin_metadata: state
                .items(ResourceKind::PluginMetadata)
                .map(|i| (i.id.clone(), i.value.clone()))
                .collect(),
            consumers: accept_checked(
                state,
                ResourceKind::Consumers,
                &diff.consumers,
                &previous.consumers,
                quarantine,
                plugins,
            ),
            consumer_groups: accept_checked(
                state,
                ResourceKind::ConsumerGroups,
                &diff.consumer_groups,
                &previous.consumer_groups,
                quarantine,
                plugins,
            ),
            credentials: accept_checked(
                state,
                ResourceKind::Credentials,
                &diff.credentials,
                &previous.credentials,
                quarantine,
                plugins,
            ),
        }
    }

    /// What changed between `previous` and `self` in what is served: a refused update that
    /// keeps the previous version serving is no change.
    pub fn diff(previous: &Applied, current: &Applied) -> ConfigDiff {
        fn by_typed<T>(
            old: &HashMap<String, Accepted<T>>,
            new: &HashMap<String, Accepted<T>>,
        ) -> Difference {
            Difference::between(old, new, |a, b| Arc::ptr_eq(&a.typed, &b.typed))
        }
        ConfigDiff {
            routes: by_typed(&previous.routes, &current.routes),
            services: by_typed(&previous.services, &current.services),
            upstreams: by_typed(&previous.upstreams, &current.upstreams),
            plugin_configs: by_typed(&previous.plugin_configs, &current.plugin_configs),
            global_rules: by_typed(&previous.global_rules, &current.global_rules),
            plugin_metadata: Difference::between(
                &previous.plugin_metadata,
                &current.plugin_metadata,
                |a, b| Arc::ptr_eq(a, b) || a == b,
            ),
            consumers: by_typed(&previous.consumers, &current.consumers),
            consumer_groups: by_typed(&previous.consumer_groups, &current.consumer_groups),
            credentials: by_typed(&previous.credentials, &current.credentials),
            // Not compiled here (the certificate store diffs them itself).
            ssls: Difference::default(),
        }
    }

    /// The accepted stored values of one kind, by id.
    pub fn raw(&self, kind: ResourceKind) -> Vec<(String, Arc<Value>)> {
        fn raw<T>(m: &HashMap<String, Accepted<T>>) -> Vec<(String, Arc<Value>)> {
            let mut v: Vec<_> = m.iter().map(|(k, a)| (k.clone(), a.raw.clone())).collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        }
        match kind {
            ResourceKind::Routes => raw(&self.routes),
            ResourceKind::Upstreams => raw(&self.upstreams),
            ResourceKind::Services => raw(&self.services),
            ResourceKind::PluginConfigs => raw(&self.plugin_configs),
            ResourceKind::GlobalRules => raw(&self.global_rules),
            ResourceKind::Consumers => raw(&self.consumers),
            ResourceKind::ConsumerGroups => raw(&self.consumer_groups),
            ResourceKind::Credentials => raw(&self.credentials),
            _ => Vec::new(),
        }
    }
}

/// [`accept_kind`] for kinds compiled from their stored value once checked.
fn accept_checked(
    state: &ConfigState,
    kind: ResourceKind,
    changed: &Difference,
    previous: &HashMap<String, Accepted<()>>,
    quarantine: &mut Vec<Quarantined>,
    plugins: &dyn PluginCheck,
) -> HashMap<String, Accepted<()>> {
    accept_kind(state, kind, changed, previous, quarantine, |_, v| {
        validate::check_resource(kind, v, plugins).map_err(|e| e.message)
    })
}

/// Accepts every item of one kind: unchanged ones keep their previous outcome (an older
/// version held while a newer one is refused stays held, and stays reported), the others are
/// validated, falling back to the last accepted version of an item that no longer validates.
fn accept_kind<T>(
    state: &ConfigState,
    kind: ResourceKind,
    changed: &Difference,
    previous: &HashMap<String, Accepted<T>>,
    quarantine: &mut Vec<Quarantined>,
    mut convert: impl FnMut(&str, &Value) -> Result<T, String>,
) -> HashMap<String, Accepted<T>> {
    let mut out = HashMap::new();
    for item in state.items(kind) {
        let id = &item.id;
        let prev = previous.get(id);
        if let Some(p) = prev.filter(|_| !changed.touches(id)) {
            if let Some(error) = &p.refused {
                quarantine.push(Quarantined {
                    kind,
                    id: id.clone(),
                    error: error.clone(),
                    serving_previous: true,
                });
            }
            out.insert(id.clone(), p.clone());
            continue;
        }
        match convert(id, &item.value) {
            Ok(typed) => {
                out.insert(
                    id.clone(),
                    Accepted {
                        raw: item.value.clone(),
                        typed: Arc::new(typed),
                        refused: None,
                    },
                );
            }
            Err(error) => {
                quarantine.push(Quarantined {
                    kind,
                    id: id.clone(),
                    error: error.clone(),
                    serving_previous: prev.is_some(),
                });
                if let Some(p) = prev {
                    out.insert(
                        id.clone(),
                        Accepted {
                            refused: Some(error),
                            ..p.clone()
                        },
                    );
                }
            }
        }
    }
    out
}
