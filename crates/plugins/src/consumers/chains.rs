//! The route chains merged with a consumer's plugins, per snapshot: APISIX's
//! `merge_consumer_route`, whose result it caches by the route's and the consumer's (and its
//! group's) versions. Here the cache lives and dies with one snapshot, which compiled the
//! route chains and consumers it holds, so an entry can never be stale; a changed route or
//! consumer means a new snapshot and a new cache.
//!
//! Each (route, consumer) pair is merged on its first request, then found again with one
//! lock-free load: the cache is a fixed table of atomic slots (direct-mapped by the two
//! chains' addresses). A pair whose slot another pair took is merged again and takes it
//! back, so the table stays bounded however many consumers call however many routes, and
//! the worst case is the per-request merge this cache saves.

use std::sync::Arc;

use arc_swap::ArcSwapOption;

use super::ConsumerSet;
use crate::chain::{ConsumerPlugins, PluginChain};

/// Slots of the table (a power of two): pairs that stay merged without contention.
const SLOTS: usize = 4096;

struct Merged {
    route: Arc<PluginChain>,
    consumer: Arc<ConsumerPlugins>,
    chain: Arc<PluginChain>,
}

/// A snapshot's consumers and the chains merged with their plugins so far.
pub struct ConsumerChains {
    pub set: Arc<ConsumerSet>,
    /// Empty when no consumer has plugins to merge.
    slots: Box<[ArcSwapOption<Merged>]>,
}

impl std::fmt::Debug for ConsumerChains {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerChains")
            .field("set", &self.set)
            .field("slots", &self.slots.len())
            .finish()
    }
}

impl Default for ConsumerChains {
    fn default() -> Self {
        ConsumerChains::new(Arc::default())
    }
}

impl ConsumerChains {
    /// An empty cache over `set` (a table only when some consumer has plugins).
    pub fn new(set: Arc<ConsumerSet>) -> ConsumerChains {
        let slots = if set.plugins.is_empty() { 0 } else { SLOTS };
        ConsumerChains {
            set,
            slots: (0..slots).map(|_| ArcSwapOption::empty()).collect(),
        }
    }

    /// The plugins of the consumer named `username` (over its group's), if it has any.
    pub fn plugins_of(&self, username: &str) -> Option<&Arc<ConsumerPlugins>> {
        self.set.plugins.get(username)
    }

    /// `route` merged with `consumer` ([`PluginChain::with_consumer`]), merged once per
    /// snapshot for each pair while it keeps its slot.
    pub fn merged(
        &self,
        route: &Arc<PluginChain>,
        consumer: &Arc<ConsumerPlugins>,
    ) -> Arc<PluginChain> {
        if self.slots.is_empty() {
            return Arc::new(route.with_consumer(consumer));
        }
        let slot = &self.slots[slot_of(route, consumer, self.slots.len())];
        if let Some(m) = &*slot.load() {
            if Arc::ptr_eq(&m.route, route) && Arc::ptr_eq(&m.consumer, consumer) {
                return m.chain.clone();
            }
        }
        let chain = Arc::new(route.with_consumer(consumer));
        slot.store(Some(Arc::new(Merged {
            route: route.clone(),
            consumer: consumer.clone(),
            chain: chain.clone(),
        })));
        chain
    }

    /// How many pairs hold a slot now.
    pub fn cached(&self) -> usize {
        self.slots.iter().filter(|s| s.load().is_some()).count()
    }
}

/// The slot of a pair: the two addresses (held alive by the entry, so unique while it is
/// there) mixed by a multiplicative hash.
fn slot_of(route: &Arc<PluginChain>, consumer: &Arc<ConsumerPlugins>, slots: usize) -> usize {
    let r = Arc::as_ptr(route) as usize as u64;
    let c = Arc::as_ptr(consumer) as usize as u64;
    let h = (r ^ c.rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> 40) as usize & (slots - 1)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use ferrisix_config::encrypt::Keyring;
    use ferrisix_config::model::ResourceKind;
    use ferrisix_plugin_api::Owner;
    use serde_json::{json, Value};

    use super::*;
    use crate::chain::{CompileEnv, PluginSource};
    use crate::testing::env;

    fn route_chain(id: &str, env: CompileEnv<'_>) -> Arc<PluginChain> {
        let owner = Owner::new(ResourceKind::Routes, id);
        let ka = json!({});
        let src = [PluginSource {
            name: "key-auth",
            conf: &ka,
            owner: &owner,
        }];
        Arc::new(PluginChain::compile(&src, None, env).unwrap())
    }

    #[test]
    fn each_pair_is_merged_once_and_kept_apart() {
        let env = env();
        let consumers: Vec<(String, Arc<Value>)> = ["jack", "rose"]
            .iter()
            .map(|u| {
                let doc = json!({"username": u, "plugins": {"key-auth": {"key": format!("{u}-key")},
                    "limit-count": {"count": 2, "time_window": 60}}});
                ((*u).to_owned(), Arc::new(doc))
            })
            .collect();
        let (set, problems) =
            ConsumerSet::compile(&consumers, &[], &[], &Keyring::default(), &|_| None, env);
        assert!(problems.is_empty(), "{problems:?}");
        let chains = ConsumerChains::new(Arc::new(set));
        let (r1, r2) = (route_chain("c1", env), route_chain("c2", env));
        let jack = chains.plugins_of("jack").unwrap().clone();
        let rose = chains.plugins_of("rose").unwrap().clone();
        assert_eq!(chains.cached(), 0, "nothing merged before a request");
        let a = chains.merged(&r1, &jack);
        assert_eq!(
            a.names().collect::<Vec<_>>(),
            ["key-auth", "limit-count"],
            "the consumer's plugin joined the route's"
        );
        assert!(Arc::ptr_eq(&a, &chains.merged(&r1, &jack)), "merged once");
        let others = [
            chains.merged(&r2, &jack),
            chains.merged(&r1, &rose),
            chains.merged(&r2, &rose),
        ];
        for o in &others {
            assert!(!Arc::ptr_eq(&a, o));
        }
        assert!(chains.cached() >= 2 && chains.cached() <= 4);

        // Without consumer plugins there is no table, and merging still answers.
        let bare = ConsumerChains::default();
        assert_eq!((bare.slots.len(), bare.cached()), (0, 0));
        assert_eq!(bare.merged(&r1, &jack).len(), 2);
    }

    #[test]
    fn a_taken_slot_is_merged_again_and_taken_back() {
        let env = env();
        let consumers = vec![(
            "jack".to_owned(),
            Arc::new(
                json!({"username": "jack", "plugins": {"limit-count": {"count": 2, "time_window": 60}}}),
            ),
        )];
        let (set, _) =
            ConsumerSet::compile(&consumers, &[], &[], &Keyring::default(), &|_| None, env);
        let chains = ConsumerChains::new(Arc::new(set));
        let jack = chains.plugins_of("jack").unwrap().clone();
        // Enough routes that two share a slot.
        let routes: Vec<_> = (0..SLOTS + 1)
            .map(|i| route_chain(&format!("s{i}"), env))
            .collect();
        let slot = |r: &Arc<PluginChain>| slot_of(r, &jack, SLOTS);
        let mut by_slot: HashMap<usize, usize> = HashMap::new();
        let (a, b) = routes
            .iter()
            .enumerate()
            .find_map(|(i, r)| by_slot.insert(slot(r), i).map(|j| (j, i)))
            .expect("pigeonhole");
        let first = chains.merged(&routes[a], &jack);
        let other = chains.merged(&routes[b], &jack);
        assert!(Arc::ptr_eq(&other, &chains.merged(&routes[b], &jack)));
        let again = chains.merged(&routes[a], &jack);
        assert!(
            !Arc::ptr_eq(&first, &again),
            "merged again after losing its slot"
        );
        assert_eq!(chains.cached(), 1);
    }
}
