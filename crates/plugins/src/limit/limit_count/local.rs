//! The `local` policy: counters shared by every worker thread of the gateway (APISIX's
//! `plugin-limit-count` shared dict, which all nginx workers of one node share).
//!
//! Counters live in [`Space`]s, one per counter-key prefix (`<resource key>:<crc32 of the conf>`
//! or the group name), so a space is exactly the set of counters one configuration owns. Each
//! space is the plugin API's sharded [`Keyed`] map, so the common path (a known client
//! address) formats and allocates nothing. Spaces are leased from the gateway's
//! [`StateMap`]: an unchanged configuration gets the same space in the next snapshot, so its
//! counters carry on; a space no snapshot uses any more is released then, or, while a window
//! is still open, kept until it is over (as the shared dict keeps the keys until they expire),
//! so deleting and re-creating the same conf within the window keeps its count.

use ferrisix_plugin_api::{Clock, KeyRef, Keyed, Retain, Slot, StateMap};

/// The spaces of one gateway.
pub type Spaces = StateMap<Space>;

/// What one request did to a counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub rejected: bool,
    /// Remaining quota after this request (0 when rejected).
    pub remaining: u64,
    /// Time to the window's end in hundredths of a second (APISIX floors to 2 decimals).
    pub reset_centis: u64,
}

#[derive(Clone, Copy, Debug)]
struct Fixed {
    end_ms: u64,
    used: u64,
}

#[derive(Clone, Copy, Debug)]
struct Sliding {
    window_id: u64,
    window_ms: u64,
    current: u64,
    previous: u64,
}

impl Sliding {
    /// Moves the pair to window `wid`: the current window becomes the previous one if it was
    /// the one just before, otherwise both start from zero.
    fn advance(&mut self, wid: u64) {
        if self.window_id == wid {
            return;
        }
        self.previous = if self.window_id + 1 == wid {
            self.current
        } else {
            0
        };
        self.current = 0;
        self.window_id = wid;
    }

    /// A pair matters until its current window is the previous of the next one.
    fn over(&self, now_epoch: u64) -> bool {
        (self.window_id + 2) * self.window_ms <= now_epoch
    }
}

/// The counters of one configuration (or one group).
pub struct Space {
    clock: Clock,
    fixed: Keyed<Fixed>,
    sliding: Keyed<Sliding>,
}

impl std::fmt::Debug for Space {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Space")
            .field("fixed", &self.fixed)
            .field("sliding", &self.sliding)
            .finish()
    }
}

impl Retain for Space {
    /// An open window outlives its configuration.
    fn retain(&self) -> bool {
        let (mono, epoch) = (self.clock.coarse_mono_ms(), self.clock.epoch_ms());
        let fixed = self.fixed.sweep(|w| w.end_ms <= mono);
        let sliding = self.sliding.sweep(|s| s.over(epoch));
        fixed || sliding
    }
}

impl Space {
    pub fn new(clock: Clock) -> Space {
        Space {
            clock,
            fixed: Keyed::default(),
            sliding: Keyed::default(),
        }
    }

    /// The fixed window of lua-resty-limit-traffic's `count` as APISIX runs it: the first
    /// request opens a window of `window_s` seconds; every request in it (allowed or not) is
    /// counted; more than `limit` is rejected.
    ///
    /// Its times are the coarse clock's (a kernel tick's resolution against windows of
    /// seconds; APISIX counts on nginx's cached time, also read once per event-loop pass).
    pub fn fixed(&self, key: KeyRef<'_>, limit: u64, window_s: u64, cost: u64) -> Outcome {
        let now = self.clock.coarse_mono_ms();
        let fresh = Fixed {
            end_ms: now + window_s.saturating_mul(1000),
            used: cost,
        };
        let (used, end) = self.fixed.update(
            key,
            now,
            |w| w.end_ms <= now,
            |slot| match slot {
                Some(w) if w.end_ms > now => {
                    w.used = w.used.saturating_add(cost);
                    (Slot::Keep, (w.used, w.end_ms))
                }
                Some(w) => {
                    *w = fresh;
                    (Slot::Keep, (w.used, w.end_ms))
                }
                None => (Slot::Insert(fresh), (fresh.used, fresh.end_ms)),
            },
        );
        if used > limit {
            return Outcome {
                rejected: true,
                remaining: 0,
                reset_centis: end.saturating_sub(now) / 10,
            };
        }
        // The request that opened the window reports the whole window (APISIX sets the reset
        // time then and reads it back afterwards).
        let reset_centis = if used == cost {
            window_s * 100
        } else {
            end.saturating_sub(now) / 10
        };
        Outcome {
            rejected: false,
            remaining: limit - used,
            reset_centis,
        }
    }

    /// APISIX 3.18's sliding window: the previous window's count weighted by the part of it
    /// still inside the sliding window, plus the current one; only accepted requests count.
    pub fn sliding(&self, key: KeyRef<'_>, limit: u64, window_s: u64, cost: u64) -> Outcome {
        let now = self.clock.epoch_ms();
        let window_ms = window_s.max(1).saturating_mul(1000);
        let wid = now / window_ms;
        let remaining_ms = window_ms - now % window_ms;
        let fresh = Sliding {
            window_id: wid,
            window_ms,
            current: 0,
            previous: 0,
        };
        self.sliding.update(
            key,
            self.clock.coarse_mono_ms(),
            |s| s.over(now),
            |slot| {
                let mut s = slot.as_deref().copied().unwrap_or(fresh);
                s.window_ms = window_ms;
                s.advance(wid);
                let decision = sliding_decide(
                    s.current,
                    s.previous.min(limit),
                    limit,
                    cost,
                    window_ms,
                    remaining_ms,
                );
                if !decision.rejected {
                    s.current += cost;
                }
                match slot {
                    Some(existing) => {
                        *existing = s;
                        (Slot::Keep, decision)
                    }
                    None => (Slot::Insert(s), decision),
                }
            },
        )
    }
}

/// The sliding-window decision on the counts before this request (shared with the Redis
/// backend, whose script makes the same decision atomically).
pub(crate) fn sliding_decide(
    current: u64,
    previous: u64,
    limit: u64,
    cost: u64,
    window_ms: u64,
    remaining_ms: u64,
) -> Outcome {
    let rate = previous as f64 / window_ms as f64; // per ms
    let estimated_previous = rate * remaining_ms as f64;
    let ceil_centis = |ms: f64| (ms / 10.0).ceil().max(0.0) as u64;
    if current >= limit || estimated_previous + current as f64 >= limit as f64 {
        let reset = if current >= limit || rate == 0.0 {
            remaining_ms as f64
        } else {
            // Time until the weighted previous count has shrunk enough to free a slot.
            (remaining_ms as f64 - (limit - current) as f64 / rate).max(0.0)
        };
        return Outcome {
            rejected: true,
            remaining: 0,
            reset_centis: ceil_centis(reset),
        };
    }
    let after = current + cost;
    let remaining = (limit as f64 - after as f64 - estimated_previous)
        .floor()
        .max(0.0) as u64;
    Outcome {
        rejected: false,
        remaining,
        reset_centis: ceil_centis(remaining_ms as f64),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn ip(s: &str) -> KeyRef<'static> {
        KeyRef::Ip(s.parse().unwrap())
    }

    #[test]
    fn fixed_window_counts_and_resets() {
        let s = Space::new(Clock::system());
        let o = s.fixed(ip("1.1.1.1"), 2, 5, 1);
        assert_eq!(
            o,
            Outcome {
                rejected: false,
                remaining: 1,
                reset_centis: 500
            }
        );
        let o = s.fixed(ip("1.1.1.1"), 2, 5, 1);
        assert!(!o.rejected && o.remaining == 0 && o.reset_centis <= 500 && o.reset_centis > 0);
        let o = s.fixed(ip("1.1.1.1"), 2, 5, 1);
        assert!(o.rejected && o.remaining == 0 && o.reset_centis > 0);
        // Another key has its own counter; the text spelling of an address is the address.
        assert!(!s.fixed(ip("1.1.1.2"), 2, 5, 1).rejected);
        assert_eq!(s.fixed(KeyRef::Text("1.1.1.2"), 2, 5, 1).remaining, 0);
        assert_eq!(s.fixed(KeyRef::Text("k"), 1, 5, 1).remaining, 0);
        assert!(s.fixed(KeyRef::Text("k"), 1, 5, 1).rejected);
    }

    #[test]
    fn fixed_window_expires() {
        let clock = Clock::manual(1_700_000_000_000);
        let s = Space::new(clock.clone());
        assert!(!s.fixed(ip("1.1.1.1"), 1, 1, 1).rejected);
        assert!(s.fixed(ip("1.1.1.1"), 1, 1, 1).rejected);
        clock.advance(1100);
        let o = s.fixed(ip("1.1.1.1"), 1, 1, 1);
        assert_eq!(
            o,
            Outcome {
                rejected: false,
                remaining: 0,
                reset_centis: 100
            }
        );
    }

    #[test]
    fn exactly_count_pass_across_threads() {
        let s = Arc::new(Space::new(Clock::system()));
        let passed = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (s, passed) = (s.clone(), passed.clone());
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        if !s.fixed(KeyRef::Text("shared"), 1000, 60, 1).rejected {
                            passed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(passed.load(std::sync::atomic::Ordering::Relaxed), 1000);
    }

    #[test]
    fn sliding_weighs_the_previous_window() {
        // 10 s windows, 2.5 s left: the previous window's 8 weigh 2.
        let o = sliding_decide(0, 8, 10, 1, 10_000, 2_500);
        assert_eq!(
            o,
            Outcome {
                rejected: false,
                remaining: 7,
                reset_centis: 250
            }
        );
        let o = sliding_decide(8, 8, 10, 1, 10_000, 2_500);
        assert!(o.rejected);
        // Full current window: reset is the rest of the window.
        assert_eq!(
            sliding_decide(10, 0, 10, 1, 10_000, 2_500).reset_centis,
            250
        );
        let s = Space::new(Clock::system());
        let mut passed = 0;
        for _ in 0..5 {
            if !s.sliding(KeyRef::Text("a"), 3, 100, 1).rejected {
                passed += 1;
            }
        }
        assert!(passed <= 3);
    }

    #[test]
    fn spaces_outlive_their_conf_only_while_a_window_is_open() {
        let clock = Clock::manual(1_700_000_000_000);
        let spaces = Spaces::default();
        let a = spaces.lease("p1", || Space::new(clock.clone()));
        let again = spaces.lease("p1", || panic!("shared"));
        assert!(Arc::ptr_eq(a.state(), again.state()));
        a.fixed(KeyRef::Text("x"), 5, 60, 1);
        drop((a, again));
        assert_eq!(spaces.len(), 1, "an open window keeps the space");
        let back = spaces.lease("p1", || panic!("kept"));
        assert_eq!(back.fixed(KeyRef::Text("x"), 5, 60, 1).remaining, 3);
        drop(back);
        clock.advance(61_000);
        spaces.prune();
        assert!(spaces.is_empty(), "released once the window is over");
        let idle = spaces.lease("p2", || Space::new(clock.clone()));
        drop(idle);
        assert!(
            spaces.is_empty(),
            "a space without counts goes with its conf"
        );
    }
}
