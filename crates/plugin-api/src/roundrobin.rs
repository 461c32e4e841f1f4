//! lua-resty-balancer's `resty.roundrobin`, the one weighted round robin of APISIX's upstream
//! balancer and of plugins that split traffic (traffic-split): the interleaved weighted round
//! robin of LVS ("current weight" lowered by the weights' gcd each time the walk passes the last
//! entry), not nginx's smooth WRR. Weights 3:2 serve `A A B A B` per period, 3:2:1
//! `A | A B | A B C`, so counts over whole periods are exact.
//!
//! APISIX walks its entries in Lua's `next` order; here the entries keep the configuration's
//! order and the caller says where the walk starts, which makes the order reproducible. The
//! state (position, current weight) sits in one atomic word advanced by compare-and-swap, so
//! every worker thread shares one sequence without a lock.

use std::sync::atomic::{AtomicU64, Ordering};

/// "Before the first entry" (Lua's `next(t, nil)`).
const BEFORE_FIRST: u32 = u32::MAX;

/// Interleaved weighted round robin over fixed weights.
#[derive(Debug)]
pub struct InterleavedWrr {
    weights: Vec<u32>,
    max_weight: u32,
    gcd: u32,
    /// High 32 bits: position (or BEFORE_FIRST); low 32 bits: current weight.
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
    /// A picker over `weights` whose walk starts after entry `after` (`None`: before the first
    /// one). Entries of weight 0 are never picked; a picker without a positive weight picks
    /// nothing (resty.roundrobin finds nothing either).
    pub fn new(weights: Vec<u32>, after: Option<usize>) -> InterleavedWrr {
        let max_weight = weights.iter().copied().max().unwrap_or(0);
        let gcd = weights.iter().copied().fold(0, gcd).max(1);
        let start = match after {
            Some(i) if !weights.is_empty() => (i % weights.len()) as u32,
            _ => BEFORE_FIRST,
        };
        InterleavedWrr {
            weights,
            max_weight,
            gcd,
            state: AtomicU64::new(pack(start, max_weight)),
        }
    }

    /// One step from `(pos, cw)`: the picked index and the new state.
    fn step(&self, mut pos: u32, mut cw: u32) -> (usize, u64) {
        let n = self.weights.len() as u32;
        loop {
            if pos != BEFORE_FIRST && pos + 1 >= n {
                // Walked past the last entry: lower the bar for the next round.
                cw = cw.saturating_sub(self.gcd);
                if cw == 0 {
                    cw = self.max_weight;
                }
                pos = BEFORE_FIRST;
                continue;
            }
            pos = if pos == BEFORE_FIRST { 0 } else { pos + 1 };
            if self.weights[pos as usize] >= cw {
                return (pos as usize, pack(pos, cw));
            }
        }
    }

    /// The index of the next entry.
    pub fn next(&self) -> Option<usize> {
        if self.max_weight == 0 {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn picks(weights: &[u32], after: Option<usize>, n: usize) -> Vec<usize> {
        let rr = InterleavedWrr::new(weights.to_vec(), after);
        (0..n).map(|_| rr.next().unwrap()).collect()
    }

    #[test]
    fn interleaved_order() {
        // 3:2 is A A B A B per period (cw 3: A; cw 2: A B; cw 1: A B).
        assert_eq!(picks(&[3, 2], None, 10), [0, 0, 1, 0, 1, 0, 0, 1, 0, 1]);
        // 3:2:1 is A | A B | A B C.
        assert_eq!(picks(&[3, 2, 1], None, 6), [0, 0, 1, 0, 1, 2]);
        // 2:1:2 (t/plugin/traffic-split4.t TEST 10: 1980 1980 1981 1981 1982 as a multiset).
        assert_eq!(picks(&[2, 1, 2], None, 5), [0, 2, 0, 1, 2]);
        // gcd 2: 4:2 is 2:1.
        assert_eq!(picks(&[4, 2], None, 3), [0, 0, 1]);
        let thousand = picks(&[3, 2], None, 1000);
        assert_eq!(thousand.iter().filter(|i| **i == 0).count(), 600);
    }

    #[test]
    fn the_walk_starts_after_the_given_entry() {
        assert_eq!(picks(&[1, 1, 1], Some(0), 4), [1, 2, 0, 1]);
        assert_eq!(picks(&[1, 1, 1], Some(2), 4), [0, 1, 2, 0]);
        // Past the end wraps.
        assert_eq!(picks(&[1, 1, 1], Some(4), 2), [2, 0]);
    }

    #[test]
    fn zero_weights() {
        assert_eq!(picks(&[0, 1], None, 3), [1, 1, 1]);
        assert_eq!(InterleavedWrr::new(vec![0, 0], None).next(), None);
        assert_eq!(InterleavedWrr::new(vec![], None).next(), None);
        assert_eq!(InterleavedWrr::new(vec![], Some(3)).next(), None);
    }
}
