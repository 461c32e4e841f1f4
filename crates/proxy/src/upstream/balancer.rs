//! Node selection: every APISIX balancer (`roundrobin`, `chash`, `least_conn`, `ewma`) inside
//! APISIX's node priority groups, behind one [`UpstreamPicker`] the try loop calls.
//!
//! The try loop asks [`UpstreamPicker::pick`] for a node with the request's [`PickState`] (the
//! chash key, where a retry continues), the nodes this request already tried and which nodes
//! are healthy; it starts each try with [`UpstreamPicker::begin`], whose [`TryGuard`] counts the
//! connection for least_conn until the response is over and feeds the response time to ewma.
//! Every state here is shared by all worker threads (atomics), so workers agree on it.

mod ewma;
mod least_conn;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub use ewma::{EwmaSlot, EwmaTable};
pub use ferrisix_plugin_api::chash::{crc32, resolve_template, ring_id, HashOn, POINTS_PER_WEIGHT};
pub use least_conn::InFlight;

use ferrisix_plugin_api::chash::Ring;
use ferrisix_plugin_api::roundrobin::InterleavedWrr;
use least_conn::LeastConn;

/// The balancer an upstream's `type` names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BalancerType {
    RoundRobin,
    Chash(HashOn),
    LeastConn,
    Ewma,
}

/// Node attributes the picker needs.
#[derive(Clone, Debug)]
pub struct NodeWeight {
    pub weight: u32,
    pub priority: i64,
    /// The resolved address, `ip:port` (`[v6]:port`): chash's ring name, ewma's and least_conn's
    /// key.
    pub host: String,
    pub port: u16,
}

impl NodeWeight {
    fn addr_key(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

enum Algo {
    RoundRobin {
        wrr: InterleavedWrr,
        /// Members the WRR can return (weight > 0, or all when every weight is 0).
        pickable: Vec<bool>,
    },
    Chash(Ring),
    LeastConn(LeastConn),
    Ewma(Vec<Arc<EwmaSlot>>),
}

/// One priority level of an upstream's nodes.
struct PriorityGroup {
    priority: i64,
    /// Indices into the upstream's node list.
    members: Vec<usize>,
    algo: Algo,
}

/// Shared state the pickers of one process draw on.
#[derive(Debug, Default)]
pub struct BalancerEnv {
    pub ewma: EwmaTable,
}

/// Picks upstream nodes for one upstream: highest priority group first, the upstream's balancer
/// inside it, skipping nodes this request already tried and, where any node is healthy, the
/// unhealthy ones.
pub struct UpstreamPicker {
    kind: BalancerType,
    groups: Vec<PriorityGroup>,
    /// APISIX skips the balancer for a one-node upstream (except least_conn).
    single: bool,
    /// Per node: its least_conn counter (least_conn only).
    in_flight: Vec<Option<InFlight>>,
    /// Per node: its ewma slot (ewma only).
    ewma: Vec<Option<Arc<EwmaSlot>>>,
    /// Per node: `ip:port` (least_conn only, to carry its counts to the next picker).
    keys: Vec<String>,
}

impl std::fmt::Debug for UpstreamPicker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamPicker")
            .field("kind", &self.kind)
            .field("groups", &self.groups.len())
            .finish()
    }
}

/// What one request's picks remember between tries.
#[derive(Debug, Default)]
pub struct PickState<'a> {
    /// The chash key (`fetch_chash_hash_key`), computed once per request.
    pub key: Cow<'a, str>,
    /// The priority group in use (APISIX never goes back up within a request).
    group: usize,
    /// chash: the ring point of the last pick, where a retry walks on from.
    chash_point: Option<usize>,
}

impl<'a> PickState<'a> {
    pub fn new(key: Cow<'a, str>) -> PickState<'a> {
        PickState {
            key,
            group: 0,
            chash_point: None,
        }
    }
}

impl UpstreamPicker {
    /// `start` seeds roundrobin's random start position; `previous` is the picker this one
    /// replaces for the same upstream, whose least_conn counts carry over node by node.
    pub fn new(
        kind: BalancerType,
        nodes: &[NodeWeight],
        env: &BalancerEnv,
        previous: Option<&UpstreamPicker>,
        mut start: impl FnMut(usize) -> usize,
    ) -> UpstreamPicker {
        let mut priorities: Vec<i64> = nodes.iter().map(|n| n.priority).collect();
        priorities.sort_unstable_by(|a, b| b.cmp(a));
        priorities.dedup();
        let carried: HashMap<(i64, String), InFlight> = match previous {
            Some(p) if p.kind == BalancerType::LeastConn => p.counts_by_node(),
            _ => HashMap::new(),
        };
        let mut in_flight = vec![None; nodes.len()];
        let mut ewma_slots = vec![None; nodes.len()];
        let groups = priorities
            .into_iter()
            .map(|p| {
                let members: Vec<usize> = (0..nodes.len())
                    .filter(|i| nodes[*i].priority == p)
                    .collect();
                let weights: Vec<u32> = members.iter().map(|i| nodes[*i].weight).collect();
                let algo = match &kind {
                    BalancerType::RoundRobin => {
                        let all_zero = weights.iter().all(|w| *w == 0);
                        let pickable = weights.iter().map(|w| all_zero || *w > 0).collect();
                        let first = start(members.len());
                        // Every weight 0 would never pick anything; APISIX then rotates plainly.
                        let weights = if all_zero {
                            vec![1; weights.len()]
                        } else {
                            weights
                        };
                        Algo::RoundRobin {
                            wrr: InterleavedWrr::new(weights, Some(first)),
                            pickable,
                        }
                    }
                    BalancerType::Chash(_) => {
                        let ids: Vec<(Vec<u8>, u32)> = members
                            .iter()
                            .map(|i| (ring_id(&nodes[*i].host, nodes[*i].port), nodes[*i].weight))
                            .collect();
                        Algo::Chash(Ring::new(&ids))
                    }
                    BalancerType::LeastConn => {
                        let counts: Vec<InFlight> = members
                            .iter()
                            .map(|i| {
                                let c = carried
                                    .get(&(p, nodes[*i].addr_key()))
                                    .cloned()
                                    .unwrap_or_else(|| Arc::new(AtomicU32::new(0)));
                                in_flight[*i] = Some(c.clone());
                                c
                            })
                            .collect();
                        Algo::LeastConn(LeastConn::new(&weights, counts))
                    }
                    BalancerType::Ewma => {
                        let slots: Vec<Arc<EwmaSlot>> = members
                            .iter()
                            .map(|i| {
                                let s = env.ewma.slot(&nodes[*i].addr_key());
                                ewma_slots[*i] = Some(s.clone());
                                s
                            })
                            .collect();
                        Algo::Ewma(slots)
                    }
                };
                PriorityGroup {
                    priority: p,
                    members,
                    algo,
                }
            })
            .collect();
        let keys = if kind == BalancerType::LeastConn {
            nodes.iter().map(NodeWeight::addr_key).collect()
        } else {
            Vec::new()
        };
        UpstreamPicker {
            keys,
            single: nodes.len() == 1 && kind != BalancerType::LeastConn,
            kind,
            groups,
            in_flight,
            ewma: ewma_slots,
        }
    }

    pub fn kind(&self) -> &BalancerType {
        &self.kind
    }

    /// The chash key source, when this is a chash upstream.
    pub fn hash_on(&self) -> Option<&HashOn> {
        match &self.kind {
            BalancerType::Chash(h) if !self.single => Some(h),
            _ => None,
        }
    }

    fn counts_by_node(&self) -> HashMap<(i64, String), InFlight> {
        let mut out = HashMap::new();
        for g in &self.groups {
            if let Algo::LeastConn(lc) = &g.algo {
                for (m, c) in g.members.iter().zip(&lc.counts) {
                    out.insert((g.priority, self.keys[*m].clone()), c.clone());
                }
            }
        }
        out
    }

    /// Picks the next node index, or `None` when every usable node was tried.
    ///
    /// `usable(i)`: not tried by this request, and healthy unless no node is (the caller
    /// decides the fall-back, see [`crate::upstream`]).
    pub fn pick(&self, state: &mut PickState<'_>, usable: &dyn Fn(usize) -> bool) -> Option<usize> {
        if self.single {
            // APISIX skips the balancer for a one-node upstream, whatever its weight and health,
            // on every try: an explicit `retries` retries the same node (spec data-plane §3.5,
            // §4.1).
            return Some(0);
        }
        if self.in_flight.len() == 1 {
            // One node and not `single`: least_conn, which runs even for one node (it must
            // count that node's connections). APISIX then leaves the node off the tried list
            // (`after_balance(ctx, false)`), so a retry lands on it again as under every
            // other balancer, healthy or not (a lone unhealthy node is "all unhealthy", which
            // uses them all).
            return self.pick_in(&self.groups[0], state, &|_| true);
        }
        while state.group < self.groups.len() {
            let group = &self.groups[state.group];
            if let Some(node) = self.pick_in(group, state, usable) {
                return Some(node);
            }
            state.group += 1;
            state.chash_point = None;
        }
        None
    }

    fn pick_in(
        &self,
        group: &PriorityGroup,
        state: &mut PickState<'_>,
        usable: &dyn Fn(usize) -> bool,
    ) -> Option<usize> {
        let members = &group.members;
        match &group.algo {
            Algo::RoundRobin { wrr, pickable } => {
                let any = members.iter().zip(pickable).any(|(m, p)| *p && usable(*m));
                if !any {
                    return None;
                }
                // Advance the shared sequence until a usable node comes up; bounded by one
                // period because every pickable node appears once per period.
                loop {
                    let node = members[wrr.next()?];
                    if usable(node) {
                        return Some(node);
                    }
                }
            }
            Algo::Chash(ring) => {
                if ring.is_empty() {
                    return None;
                }
                let mut point = match state.chash_point {
                    None => {
                        let (member, point) = ring.find(state.key.as_bytes())?;
                        state.chash_point = Some(point);
                        if usable(members[member]) {
                            return Some(members[member]);
                        }
                        point
                    }
                    Some(p) => p,
                };
                // A retry (or an unhealthy node) walks on along the ring, as resty.chash's
                // `next` does, at most once around.
                for _ in 0..ring.len() {
                    let member;
                    (member, point) = ring.next(point);
                    state.chash_point = Some(point);
                    if usable(members[member]) {
                        return Some(members[member]);
                    }
                }
                None
            }
            Algo::LeastConn(lc) => lc.pick(|i| usable(members[i])).map(|i| members[i]),
            Algo::Ewma(slots) => {
                let eligible: Vec<usize> =
                    (0..members.len()).filter(|i| usable(members[*i])).collect();
                let mut rng = rand::thread_rng();
                ewma::pick(slots, &eligible, |n| rand::Rng::gen_range(&mut rng, 0..n))
                    .map(|i| members[i])
            }
        }
    }

    /// Starts a try on `node`: least_conn counts it from now until the guard drops.
    pub fn begin(&self, node: usize) -> TryGuard {
        let in_flight = self.in_flight.get(node).cloned().flatten();
        if let Some(c) = &in_flight {
            c.fetch_add(1, Ordering::Relaxed);
        }
        TryGuard {
            in_flight,
            // Only ewma reads the clock.
            ewma: self
                .ewma
                .get(node)
                .cloned()
                .flatten()
                .map(|s| (s, Instant::now())),
            answered: false,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }
}

/// One try on one node. Dropping it ends the try: least_conn's count goes down, and a try that
/// got an answer ([`TryGuard::answered`]) feeds its duration to ewma. Keep it with the response
/// body so long responses (and websocket tunnels) count as the connections they are.
pub struct TryGuard {
    in_flight: Option<InFlight>,
    /// ewma's slot and when the try started.
    ewma: Option<(Arc<EwmaSlot>, Instant)>,
    answered: bool,
}

impl std::fmt::Debug for TryGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TryGuard")
            .field("answered", &self.answered)
            .finish()
    }
}

impl TryGuard {
    /// The upstream answered this try (its time counts for ewma when the response ends).
    pub fn answered(&mut self) {
        self.answered = true;
    }
}

impl Drop for TryGuard {
    fn drop(&mut self) {
        if let Some(c) = &self.in_flight {
            // Never below zero, even if a count was carried oddly.
            let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
        if self.answered {
            if let Some((s, started)) = &self.ewma {
                s.update(started.elapsed().as_secs_f64());
            }
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(weights: &[u32]) -> Vec<NodeWeight> {
        weights
            .iter()
            .enumerate()
            .map(|(i, w)| NodeWeight {
                weight: *w,
                priority: 0,
                host: "127.0.0.1".into(),
                port: 1000 + i as u16,
            })
            .collect()
    }

    fn rr(ns: &[NodeWeight], start: usize) -> UpstreamPicker {
        UpstreamPicker::new(
            BalancerType::RoundRobin,
            ns,
            &BalancerEnv::default(),
            None,
            |_| start,
        )
    }

    impl UpstreamPicker {
        fn pick_untried(&self, tried: &[usize]) -> Option<usize> {
            let mut st = PickState::default();
            self.pick(&mut st, &|i| !tried.contains(&i))
        }
    }

    fn counts(p: &UpstreamPicker, n: usize, picks: usize) -> Vec<usize> {
        let mut c = vec![0; n];
        for _ in 0..picks {
            c[p.pick_untried(&[]).unwrap()] += 1;
        }
        c
    }

    #[test]
    fn interleaved_order_from_first_node() {
        let p = rr(&nodes(&[3, 2, 1]), 0);
        // Start state is (pos 0, cw 3): the first pick walks on from node 0.
        let seq: Vec<usize> = (0..12).map(|_| p.pick_untried(&[]).unwrap()).collect();
        // Over any whole period of 6 the counts are 3/2/1, grouped A | A B | A B C.
        let mut c = [0; 3];
        for i in &seq[..6] {
            c[*i] += 1;
        }
        assert_eq!(c, [3, 2, 1]);
        assert_eq!(&seq[..6], &seq[6..]);
        let period = [0, 0, 1, 0, 1, 2];
        let rotation = (0..6)
            .find(|r| (0..6).all(|i| seq[i] == period[(i + r) % 6]))
            .is_some();
        assert!(rotation, "sequence {seq:?} is not a rotation of A|AB|ABC");
    }

    #[test]
    fn whole_periods_from_any_start() {
        for start in 0..3 {
            let p = rr(&nodes(&[3, 2, 1]), start);
            assert_eq!(counts(&p, 3, 12), vec![6, 4, 2]);
        }
    }

    #[test]
    fn weight_zero_is_never_picked() {
        for start in 0..3 {
            let p = rr(&nodes(&[3, 0, 1]), start);
            assert_eq!(counts(&p, 3, 8), vec![6, 0, 2]);
        }
    }

    #[test]
    fn all_zero_rotates() {
        let p = rr(&nodes(&[0, 0]), 0);
        assert_eq!(counts(&p, 2, 4), vec![2, 2]);
    }

    #[test]
    fn gcd_shortens_the_period() {
        let p = rr(&nodes(&[4, 2]), 0);
        assert_eq!(counts(&p, 2, 3), vec![2, 1]);
    }

    #[test]
    fn single_node_ignores_weight() {
        let p = rr(&nodes(&[0]), 0);
        assert_eq!(p.pick_untried(&[]), Some(0));
        // Retries (when `retries` allows them) go to the same node again.
        assert_eq!(p.pick_untried(&[0]), Some(0));
    }

    #[test]
    fn retries_skip_tried_nodes_and_fall_to_lower_priority() {
        let ns = vec![
            NodeWeight {
                weight: 1,
                priority: 10,
                host: "127.0.0.1".into(),
                port: 1,
            },
            NodeWeight {
                weight: 1,
                priority: 0,
                host: "127.0.0.1".into(),
                port: 2,
            },
            NodeWeight {
                weight: 1,
                priority: 10,
                host: "127.0.0.1".into(),
                port: 3,
            },
        ];
        let p = rr(&ns, 0);
        for _ in 0..10 {
            let first = p.pick_untried(&[]).unwrap();
            assert_ne!(first, 1, "lower group used while a higher one works");
            let second = p.pick_untried(&[first]).unwrap();
            assert_ne!(second, 1);
            assert_ne!(second, first);
            assert_eq!(p.pick_untried(&[first, second]), Some(1));
            assert_eq!(p.pick_untried(&[0, 1, 2]), None);
        }
    }

    #[test]
    fn shared_between_threads() {
        let p = std::sync::Arc::new(rr(&nodes(&[5, 3, 2]), 1));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || {
                    let mut c = [0usize; 3];
                    for _ in 0..1000 {
                        c[p.pick_untried(&[]).unwrap()] += 1;
                    }
                    c
                })
            })
            .collect();
        let mut total = [0usize; 3];
        for h in handles {
            let c = h.join().unwrap();
            for i in 0..3 {
                total[i] += c[i];
            }
        }
        assert_eq!(total, [2000, 1200, 800]);
    }

    fn chash(nodes: &[(&str, u32)]) -> UpstreamPicker {
        let ns: Vec<NodeWeight> = nodes
            .iter()
            .map(|(addr, w)| {
                let (host, port) = addr.rsplit_once(':').unwrap();
                NodeWeight {
                    weight: *w,
                    priority: 0,
                    host: host.to_string(),
                    port: port.parse().unwrap(),
                }
            })
            .collect();
        UpstreamPicker::new(
            BalancerType::Chash(HashOn::Vars("remote_addr".into())),
            &ns,
            &BalancerEnv::default(),
            None,
            |_| 0,
        )
    }

    fn chash_pick(p: &UpstreamPicker, key: &str) -> usize {
        let mut st = PickState::new(Cow::Owned(key.to_string()));
        p.pick(&mut st, &|_| true).unwrap()
    }

    /// 3,000 (node set, key) pairs computed by an independent Python reimplementation of
    /// resty.chash (scripts/dev/chash-vectors.py): ferrisix must agree on every one.
    #[test]
    fn chash_agrees_with_resty_chash_vectors() {
        let sets: [(&str, &[(&str, u32)]); 3] = [
            (
                "three",
                &[
                    ("127.0.0.1:1980", 1),
                    ("127.0.0.1:1981", 1),
                    ("127.0.0.1:1982", 1),
                ],
            ),
            (
                "weighted",
                &[
                    ("10.0.0.1:80", 2),
                    ("10.0.0.2:80", 4),
                    ("10.0.0.3:8080", 6),
                    ("[::1]:80", 2),
                    ("backend.internal:9000", 0),
                ],
            ),
            (
                "five",
                &[
                    ("192.168.0.1:80", 1),
                    ("192.168.0.2:80", 1),
                    ("192.168.0.3:80", 1),
                    ("192.168.0.4:80", 1),
                    ("192.168.0.5:80", 1),
                ],
            ),
        ];
        let vectors = include_str!("../../tests/data/chash-vectors.txt");
        let mut checked = 0;
        for line in vectors.lines() {
            let mut f = line.split('\t');
            let (set, key, want) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
            let nodes = sets.iter().find(|s| s.0 == set).unwrap().1;
            let p = chash(nodes);
            assert_eq!(nodes[chash_pick(&p, key)].0, want, "{set}: key {key}");
            checked += 1;
        }
        assert_eq!(checked, 3000);
    }

    #[test]
    fn chash_removing_one_of_five_moves_only_its_keys() {
        let five: Vec<(String, u32)> = (1..=5).map(|i| (format!("192.168.0.{i}:80"), 1)).collect();
        let refs: Vec<(&str, u32)> = five.iter().map(|(a, w)| (a.as_str(), *w)).collect();
        let before = chash(&refs);
        let four: Vec<(&str, u32)> = refs
            .iter()
            .copied()
            .filter(|n| n.0 != "192.168.0.3:80")
            .collect();
        let after = chash(&four);
        let mut moved = 0;
        for k in 0..1000 {
            let key = format!("key-{k}");
            let old = refs[chash_pick(&before, &key)].0;
            let new = four[chash_pick(&after, &key)].0;
            if old == "192.168.0.3:80" {
                moved += 1;
            } else {
                assert_eq!(old, new, "key {key} moved off a node that stayed");
            }
        }
        assert!(moved > 100, "the removed node held {moved} keys");
    }

    #[test]
    fn chash_retry_walks_the_ring_to_another_node() {
        let p = chash(&[
            ("127.0.0.1:1980", 1),
            ("127.0.0.1:1981", 1),
            ("127.0.0.1:1982", 1),
        ]);
        for k in 0..50 {
            let key = format!("k{k}");
            let mut st = PickState::new(Cow::Owned(key.clone()));
            let first = p.pick(&mut st, &|_| true).unwrap();
            let second = p.pick(&mut st, &|i| i != first).unwrap();
            assert_ne!(first, second);
            let third = p.pick(&mut st, &|i| i != first && i != second).unwrap();
            assert!(third != first && third != second);
            assert_eq!(p.pick(&mut st, &|_| false), None);
            // The same key always starts on the same node.
            assert_eq!(chash_pick(&p, &key), first);
        }
    }

    #[test]
    fn least_conn_counts_tries_until_they_end() {
        let ns = nodes(&[1, 1]);
        let p = UpstreamPicker::new(
            BalancerType::LeastConn,
            &ns,
            &BalancerEnv::default(),
            None,
            |_| 0,
        );
        let mut st = PickState::default();
        let a = p.pick(&mut st, &|_| true).unwrap();
        let guard = p.begin(a);
        let b = p.pick(&mut PickState::default(), &|_| true).unwrap();
        assert_ne!(a, b, "the busy node lost");
        drop(guard);
        assert_eq!(p.pick(&mut PickState::default(), &|_| true), Some(a));
        // A rebuilt picker keeps the in-flight count of a node that stays.
        let g = p.begin(a);
        let q = UpstreamPicker::new(
            BalancerType::LeastConn,
            &ns,
            &BalancerEnv::default(),
            Some(&p),
            |_| 0,
        );
        assert_eq!(q.pick(&mut PickState::default(), &|_| true), Some(b));
        drop(g);
        assert_eq!(q.pick(&mut PickState::default(), &|_| true), Some(a));
    }
}
