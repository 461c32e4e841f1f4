//! Node selection: APISIX's roundrobin balancer with node priority groups.
//!
//! APISIX uses lua-resty-balancer's interleaved weighted round robin (the LVS "current weight,
//! gcd" scheme), not nginx's smooth WRR, so 3:2:1 serves `A | A B | A B C` per period. The state
//! (position, current weight) is packed into one atomic word and advanced with compare-and-swap,
//! so every worker thread shares one exact sequence without a lock.

use std::sync::atomic::{AtomicU64, Ordering};

/// Sentinel position meaning "before the first node" (Lua's `next(t, nil)`).
const BEFORE_FIRST: u32 = u32::MAX;

/// Interleaved weighted round robin over a fixed list of weights.
#[derive(Debug)]
struct InterleavedWrr {
    weights: Vec<u32>,
    max_weight: u32,
    gcd: u32,
    /// High 32 bits: position (index or BEFORE_FIRST); low 32 bits: current weight.
    state: AtomicU64,
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn pack(pos: u32, cw: u32) -> u64 {
    (u64::from(pos) << 32) | u64::from(cw)
}

fn unpack(state: u64) -> (u32, u32) {
    ((state >> 32) as u32, state as u32)
}

impl InterleavedWrr {
    fn new(weights: Vec<u32>, start: usize) -> InterleavedWrr {
        // Every weight 0 would never pick anything; APISIX then rotates plainly.
        let weights = if weights.iter().all(|w| *w == 0) {
            vec![1; weights.len()]
        } else {
            weights
        };
        let max_weight = weights.iter().copied().max().unwrap_or(0);
        let gcd = weights.iter().copied().fold(0, gcd).max(1);
        let start = if weights.is_empty() {
            BEFORE_FIRST
        } else {
            (start % weights.len()) as u32
        };
        InterleavedWrr {
            weights,
            max_weight,
            gcd,
            state: AtomicU64::new(pack(start, max_weight)),
        }
    }

    /// One step of the algorithm from `(pos, cw)`; returns the picked index and the new state.
    fn step(&self, mut pos: u32, mut cw: u32) -> (usize, u64) {
        let n = self.weights.len() as u32;
        loop {
            pos = if pos == BEFORE_FIRST || pos + 1 >= n {
                if pos != BEFORE_FIRST {
                    // Walked past the last node: lower the bar for the next round.
                    cw = cw.saturating_sub(self.gcd);
                    if cw == 0 {
                        cw = self.max_weight;
                    }
                    pos = BEFORE_FIRST;
                    continue;
                }
                0
            } else {
                pos + 1
            };
            if self.weights[pos as usize] >= cw {
                return (pos as usize, pack(pos, cw));
            }
        }
    }

    fn next(&self) -> Option<usize> {
        if self.weights.is_empty() {
            return None;
        }
        let mut current = self.state.load(Ordering::Relaxed);
        loop {
            let (pos, cw) = unpack(current);
            let (picked, new_state) = self.step(pos, cw);
            match self.state.compare_exchange_weak(
                current,
                new_state,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(picked),
                Err(actual) => current = actual,
            }
        }
    }
}

/// One priority level of an upstream's nodes.
#[derive(Debug)]
struct PriorityGroup {
    /// Indices into the upstream's node list.
    members: Vec<usize>,
    /// Members the WRR can return (weight > 0, or all when every weight is 0).
    pickable: Vec<bool>,
    wrr: InterleavedWrr,
}

/// Picks upstream nodes for one upstream: highest priority group first, roundrobin inside it,
/// skipping nodes this request already tried.
#[derive(Debug)]
pub struct UpstreamPicker {
    groups: Vec<PriorityGroup>,
    single: bool,
}

/// Node attributes the picker needs.
#[derive(Clone, Copy, Debug)]
pub struct NodeWeight {
    pub weight: u32,
    pub priority: i64,
}

impl UpstreamPicker {
    /// `start` seeds the random start position (APISIX starts each picker at a random node).
    pub fn new(nodes: &[NodeWeight], mut start: impl FnMut(usize) -> usize) -> UpstreamPicker {
        let mut priorities: Vec<i64> = nodes.iter().map(|n| n.priority).collect();
        priorities.sort_unstable_by(|a, b| b.cmp(a));
        priorities.dedup();
        let groups = priorities
            .into_iter()
            .map(|p| {
                let members: Vec<usize> = (0..nodes.len())
                    .filter(|i| nodes[*i].priority == p)
                    .collect();
                let weights: Vec<u32> = members.iter().map(|i| nodes[*i].weight).collect();
                let all_zero = weights.iter().all(|w| *w == 0);
                let pickable = weights.iter().map(|w| all_zero || *w > 0).collect();
                let first = start(members.len());
                PriorityGroup {
                    wrr: InterleavedWrr::new(weights, first),
                    members,
                    pickable,
                }
            })
            .collect();
        UpstreamPicker {
            groups,
            single: nodes.len() == 1,
        }
    }

    /// Picks the next node index not in `tried`, or `None` when every usable node was tried.
    pub fn pick(&self, tried: &[usize]) -> Option<usize> {
        if self.single {
            // APISIX skips the balancer for a one-node upstream, whatever its weight, on every
            // try: `pick_server` returns that node without looking at the tried set, so an
            // explicit `retries` retries the same node (spec data-plane §3.5, §4.1).
            return Some(0);
        }
        for group in &self.groups {
            let untried = group
                .members
                .iter()
                .zip(&group.pickable)
                .any(|(m, p)| *p && !tried.contains(m));
            if !untried {
                continue;
            }
            // Advance the shared sequence until an untried node comes up; bounded by one
            // full period because every pickable node appears once per period.
            loop {
                let idx = group.wrr.next()?;
                let node = group.members[idx];
                if !tried.contains(&node) {
                    return Some(node);
                }
            }
        }
        None
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(weights: &[u32]) -> Vec<NodeWeight> {
        weights
            .iter()
            .map(|w| NodeWeight {
                weight: *w,
                priority: 0,
            })
            .collect()
    }

    fn counts(p: &UpstreamPicker, n: usize, picks: usize) -> Vec<usize> {
        let mut c = vec![0; n];
        for _ in 0..picks {
            c[p.pick(&[]).unwrap()] += 1;
        }
        c
    }

    #[test]
    fn interleaved_order_from_first_node() {
        let p = UpstreamPicker::new(&nodes(&[3, 2, 1]), |_| 0);
        // Start state is (pos 0, cw 3): the first pick walks on from node 0.
        let seq: Vec<usize> = (0..12).map(|_| p.pick(&[]).unwrap()).collect();
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
            let p = UpstreamPicker::new(&nodes(&[3, 2, 1]), |_| start);
            assert_eq!(counts(&p, 3, 12), vec![6, 4, 2]);
        }
    }

    #[test]
    fn weight_zero_is_never_picked() {
        for start in 0..3 {
            let p = UpstreamPicker::new(&nodes(&[3, 0, 1]), |_| start);
            assert_eq!(counts(&p, 3, 8), vec![6, 0, 2]);
        }
    }

    #[test]
    fn all_zero_rotates() {
        let p = UpstreamPicker::new(&nodes(&[0, 0]), |_| 0);
        assert_eq!(counts(&p, 2, 4), vec![2, 2]);
    }

    #[test]
    fn gcd_shortens_the_period() {
        let p = UpstreamPicker::new(&nodes(&[4, 2]), |_| 0);
        assert_eq!(counts(&p, 2, 3), vec![2, 1]);
    }

    #[test]
    fn single_node_ignores_weight() {
        let p = UpstreamPicker::new(&nodes(&[0]), |_| 0);
        assert_eq!(p.pick(&[]), Some(0));
        // Retries (when `retries` allows them) go to the same node again.
        assert_eq!(p.pick(&[0]), Some(0));
    }

    #[test]
    fn retries_skip_tried_nodes_and_fall_to_lower_priority() {
        let ns = vec![
            NodeWeight {
                weight: 1,
                priority: 10,
            },
            NodeWeight {
                weight: 1,
                priority: 0,
            },
            NodeWeight {
                weight: 1,
                priority: 10,
            },
        ];
        let p = UpstreamPicker::new(&ns, |_| 0);
        for _ in 0..10 {
            let first = p.pick(&[]).unwrap();
            assert_ne!(first, 1, "lower group used while a higher one works");
            let second = p.pick(&[first]).unwrap();
            assert_ne!(second, 1);
            assert_ne!(second, first);
            assert_eq!(p.pick(&[first, second]), Some(1));
            assert_eq!(p.pick(&[0, 1, 2]), None);
        }
    }

    #[test]
    fn shared_between_threads() {
        let p = std::sync::Arc::new(UpstreamPicker::new(&nodes(&[5, 3, 2]), |_| 1));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || {
                    let mut c = [0usize; 3];
                    for _ in 0..1000 {
                        c[p.pick(&[]).unwrap()] += 1;
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
}
