//! APISIX's `ewma` balancer: a moving average of each node's response time, decaying over 10 s.
//!
//! As in APISIX the averages are kept per `ip:port` for the whole process, whatever upstream
//! the node belongs to, and forgotten 60 s after the last update (its shared dict's TTL). Of two
//! random eligible nodes the one with the lower decayed average wins. Only a try that got an
//! answer updates the average: a failed try before a retry only marks the node as tried.
//! The update is skipped when another thread is updating the same node at that instant, as
//! APISIX's lock with a zero timeout does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

/// `DECAY_TIME`, seconds.
const DECAY_SECS: f64 = 10.0;
/// `SHM_TTL`, seconds.
const TTL_SECS: f64 = 60.0;

/// The averages of every node the process balances with ewma.
#[derive(Debug)]
pub struct EwmaTable {
    epoch: Instant,
    slots: Mutex<HashMap<String, Weak<EwmaSlot>>>,
}

impl Default for EwmaTable {
    fn default() -> Self {
        EwmaTable {
            epoch: Instant::now(),
            slots: Mutex::new(HashMap::new()),
        }
    }
}

impl EwmaTable {
    /// The slot of `addr` (`ip:port`), shared with every other upstream naming it. Called when
    /// an upstream compiles, never on the request path.
    pub fn slot(&self, addr: &str) -> Arc<EwmaSlot> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = slots.get(addr).and_then(Weak::upgrade) {
            return s;
        }
        slots.retain(|_, w| w.strong_count() > 0);
        let s = Arc::new(EwmaSlot {
            epoch: self.epoch,
            ewma: AtomicU64::new(0f64.to_bits()),
            touched: AtomicU64::new(0f64.to_bits()),
            updating: AtomicBool::new(false),
        });
        slots.insert(addr.to_string(), Arc::downgrade(&s));
        s
    }
}

/// One node's average and when it was last updated (seconds since the table's epoch).
#[derive(Debug)]
pub struct EwmaSlot {
    epoch: Instant,
    ewma: AtomicU64,
    touched: AtomicU64,
    updating: AtomicBool,
}

fn decay(ewma: f64, touched: f64, rtt: f64, now: f64) -> f64 {
    let weight = (-(now - touched).max(0.0) / DECAY_SECS).exp();
    ewma * weight + rtt * (1.0 - weight)
}

impl EwmaSlot {
    fn now(&self) -> f64 {
        // Offset by the TTL so a slot never touched reads as expired.
        self.epoch.elapsed().as_secs_f64() + TTL_SECS + 1.0
    }

    fn stored(&self, now: f64) -> (f64, f64) {
        let touched = f64::from_bits(self.touched.load(Ordering::Relaxed));
        if now - touched > TTL_SECS {
            return (0.0, 0.0);
        }
        (f64::from_bits(self.ewma.load(Ordering::Relaxed)), touched)
    }

    /// The decayed average now (APISIX's `score`).
    pub fn score(&self) -> f64 {
        let now = self.now();
        let (ewma, touched) = self.stored(now);
        decay(ewma, touched, 0.0, now)
    }

    /// Folds in one response time (connect + response, seconds).
    pub fn update(&self, rtt: f64) {
        if self
            .updating
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let now = self.now();
        let (ewma, touched) = self.stored(now);
        let ewma = decay(ewma, touched, rtt, now);
        self.ewma.store(ewma.to_bits(), Ordering::Relaxed);
        self.touched.store(now.to_bits(), Ordering::Relaxed);
        self.updating.store(false, Ordering::Release);
    }
}

/// Two distinct random members of `eligible` compared; the lower score wins.
pub(super) fn pick(
    slots: &[Arc<EwmaSlot>],
    eligible: &[usize],
    mut random: impl FnMut(usize) -> usize,
) -> Option<usize> {
    match eligible.len() {
        0 => None,
        1 => Some(eligible[0]),
        n => {
            let a = random(n);
            let mut b = random(n - 1);
            if b >= a {
                b += 1;
            }
            let (a, b) = (eligible[a], eligible[b]);
            Some(if slots[a].score() > slots[b].score() {
                b
            } else {
                a
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_sample_is_taken_whole_then_decays() {
        let t = EwmaTable::default();
        let s = t.slot("127.0.0.1:1");
        assert_eq!(s.score(), 0.0);
        s.update(0.5);
        assert!((s.score() - 0.5).abs() < 0.01, "{}", s.score());
        s.update(0.0);
        // Updates a moment apart barely move the average.
        assert!(s.score() > 0.45);
    }

    #[test]
    fn slots_are_shared_by_address() {
        let t = EwmaTable::default();
        let a = t.slot("10.0.0.1:80");
        a.update(1.0);
        assert!(t.slot("10.0.0.1:80").score() > 0.9);
        assert_eq!(t.slot("10.0.0.2:80").score(), 0.0);
    }

    #[test]
    fn the_faster_of_two_wins() {
        let t = EwmaTable::default();
        let slots = vec![t.slot("a:1"), t.slot("b:1")];
        slots[0].update(0.5);
        slots[1].update(0.001);
        for seed in 0..4 {
            let mut r = seed;
            let pick = pick(&slots, &[0, 1], |n| {
                r += 1;
                r % n
            });
            assert_eq!(pick, Some(1));
        }
    }
}
