//! lua-resty-balancer's `resty.roundrobin`: interleaved weighted round robin (the LVS "current
//! weight, gcd" scheme), not nginx's smooth WRR, so 3:2:1 serves `A | A B | A B C` per period.
//! The state (position, current weight) is packed into one atomic word and advanced with
//! compare-and-swap, so every worker thread shares one exact sequence without a lock.

use std::sync::atomic::{AtomicU64, Ordering};

/// Sentinel position meaning "before the first node" (Lua's `next(t, nil)`).
const BEFORE_FIRST: u32 = u32::MAX;

/// Interleaved weighted round robin over a fixed list of weights.
#[derive(Debug)]
pub(super) struct InterleavedWrr {
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
    pub(super) fn new(weights: Vec<u32>, start: usize) -> InterleavedWrr {
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

    pub(super) fn next(&self) -> Option<usize> {
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
