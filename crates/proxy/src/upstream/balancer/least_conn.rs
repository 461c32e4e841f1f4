//! APISIX's `least_conn`: the node with the lowest `(1 + active connections) / weight` wins.
//!
//! APISIX keeps one heap per worker; here the in-flight count of each node is one atomic shared
//! by every worker thread, so the balancing sees the whole process' load. The counts are keyed
//! by the upstream's resource key, priority and node address and carried from one compiled
//! upstream to the next (APISIX #12217: a rebuilt picker must not forget the connections routed
//! before it), and a try releases the very counter it took.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// The in-flight count of one node.
pub type InFlight = Arc<AtomicU32>;

/// One priority group's nodes for least_conn.
#[derive(Debug)]
pub(super) struct LeastConn {
    /// Per member: `1 / weight` (infinite for weight 0, which then loses to any other node).
    effect_weight: Vec<f64>,
    pub(super) counts: Vec<InFlight>,
}

impl LeastConn {
    pub(super) fn new(weights: &[u32], counts: Vec<InFlight>) -> LeastConn {
        LeastConn {
            effect_weight: weights.iter().map(|w| 1.0 / f64::from(*w)).collect(),
            counts,
        }
    }

    /// The eligible member with the lowest score; ties go to the earlier member.
    pub(super) fn pick(&self, eligible: impl Fn(usize) -> bool) -> Option<usize> {
        let mut best: Option<(usize, f64)> = None;
        for (i, ew) in self.effect_weight.iter().enumerate() {
            if !eligible(i) {
                continue;
            }
            let score = (1.0 + f64::from(self.counts[i].load(Ordering::Relaxed))) * ew;
            match best {
                Some((_, s)) if s <= score => {}
                _ => best = Some((i, score)),
            }
        }
        best.map(|(i, _)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(n: usize) -> Vec<InFlight> {
        (0..n).map(|_| Arc::new(AtomicU32::new(0))).collect()
    }

    #[test]
    fn highest_weight_wins_when_idle() {
        let lc = LeastConn::new(&[1, 3, 1], counts(3));
        assert_eq!(lc.pick(|_| true), Some(1));
        assert_eq!(lc.pick(|i| i != 1), Some(0));
    }

    #[test]
    fn busy_nodes_lose() {
        let lc = LeastConn::new(&[1, 3, 1], counts(3));
        lc.counts[1].store(3, Ordering::Relaxed);
        // (1+3)/3 = 1.33 > (1+0)/1 = 1.
        assert_eq!(lc.pick(|_| true), Some(0));
        lc.counts[0].store(1, Ordering::Relaxed);
        assert_eq!(lc.pick(|_| true), Some(2));
    }

    #[test]
    fn weight_zero_only_when_alone() {
        let lc = LeastConn::new(&[0, 1], counts(2));
        lc.counts[1].store(100, Ordering::Relaxed);
        assert_eq!(lc.pick(|_| true), Some(1));
        assert_eq!(lc.pick(|i| i == 0), Some(0));
    }
}
