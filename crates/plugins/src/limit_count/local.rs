//! The `local` policy: counters shared by every worker thread of the process (APISIX's
//! `plugin-limit-count` shared dict, which all nginx workers of one node share).
//!
//! Counters live in [`Space`]s, one per counter-key prefix (`<resource key>:<crc32 of the conf>`
//! or the group name), so a space is exactly the set of counters one configuration owns. A
//! space is sharded by key over short critical sections (a hash lookup and two integer
//! updates); keys from `remote_addr` are stored as addresses, so the common path formats and
//! allocates nothing. [`Spaces`] hands out spaces by prefix: an unchanged configuration gets
//! the same space in the next snapshot, so its counters carry on; a space nobody references
//! any more is dropped once its windows are over.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

const SHARDS: usize = 32;

/// Milliseconds on a monotonic clock (fixed windows: immune to wall-clock jumps).
pub(crate) fn mono_ms() -> u64 {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    // Start at 1 s so that 0 never looks like a live window end.
    base.elapsed().as_millis() as u64 + 1000
}

/// Milliseconds since the epoch (sliding windows are aligned to wall-clock multiples of the
/// window, as APISIX's `floor(ngx.now() / window)`).
pub(crate) fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A counter key: the address itself for `remote_addr`, text otherwise. Text that is the
/// canonical form of an address is stored as that address, so both spellings share a counter
/// as they do in APISIX.
#[derive(Clone, Copy, Debug)]
pub enum KeyRef<'a> {
    Ip(IpAddr),
    Text(&'a str),
}

impl KeyRef<'_> {
    pub(crate) fn normalized(self) -> Self {
        match self {
            KeyRef::Text(t) => match t.parse::<IpAddr>() {
                Ok(ip) if ip.to_string() == t => KeyRef::Ip(ip),
                _ => self,
            },
            ip => ip,
        }
    }
}

impl std::fmt::Display for KeyRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyRef::Ip(ip) => write!(f, "{ip}"),
            KeyRef::Text(t) => f.write_str(t),
        }
    }
}

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
}

#[derive(Default)]
struct Shard {
    fixed_ip: HashMap<IpAddr, Fixed>,
    fixed_text: HashMap<Box<str>, Fixed>,
    sliding_ip: HashMap<IpAddr, Sliding>,
    sliding_text: HashMap<Box<str>, Sliding>,
    /// When expired entries were last dropped (monotonic ms).
    swept_ms: u64,
}

impl Shard {
    fn len(&self) -> usize {
        self.fixed_ip.len()
            + self.fixed_text.len()
            + self.sliding_ip.len()
            + self.sliding_text.len()
    }

    /// Drops finished windows, at most once a second and only when the shard holds entries.
    fn sweep(&mut self, now_mono: u64, now_epoch: u64) {
        if now_mono < self.swept_ms + 1000 || self.len() == 0 {
            return;
        }
        self.swept_ms = now_mono;
        self.fixed_ip.retain(|_, w| w.end_ms > now_mono);
        self.fixed_text.retain(|_, w| w.end_ms > now_mono);
        // A sliding pair matters until its current window is the previous of the next one.
        let live = |s: &Sliding| (s.window_id + 2) * s.window_ms > now_epoch;
        self.sliding_ip.retain(|_, s| live(s));
        self.sliding_text.retain(|_, s| live(s));
    }
}

/// The counters of one configuration (or one group).
pub struct Space {
    prefix: Box<str>,
    shards: Box<[Mutex<Shard>]>,
    hasher: std::collections::hash_map::RandomState,
}

impl std::fmt::Debug for Space {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Space")
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl Space {
    fn new(prefix: &str) -> Space {
        Space {
            prefix: prefix.into(),
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: Default::default(),
        }
    }

    /// `<resource key>:<crc32>` or the group name.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn shard(&self, key: KeyRef<'_>) -> MutexGuard<'_, Shard> {
        let mut h = self.hasher.build_hasher();
        match key {
            KeyRef::Ip(ip) => ip.hash(&mut h),
            KeyRef::Text(t) => t.hash(&mut h),
        }
        let i = (h.finish() as usize) % SHARDS;
        // A panic while holding a shard leaves plain integers behind: still usable.
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The fixed window of lua-resty-limit-traffic's `count` as APISIX runs it: the first
    /// request opens a window of `window_s` seconds; every request in it (allowed or not) is
    /// counted; more than `limit` is rejected.
    pub fn fixed(&self, key: KeyRef<'_>, limit: u64, window_s: u64, cost: u64) -> Outcome {
        let key = key.normalized();
        let now = mono_ms();
        let mut guard = self.shard(key);
        let shard = &mut *guard;
        shard.sweep(now, 0);
        let fresh = Fixed {
            end_ms: now + window_s.saturating_mul(1000),
            used: 0,
        };
        let w = match key {
            KeyRef::Ip(ip) => shard.fixed_ip.entry(ip).or_insert(fresh),
            KeyRef::Text(t) => {
                if !shard.fixed_text.contains_key(t) {
                    shard.fixed_text.insert(t.into(), fresh);
                }
                shard.fixed_text.get_mut(t).expect("just inserted")
            }
        };
        if w.end_ms <= now {
            *w = fresh;
        }
        w.used = w.used.saturating_add(cost);
        let (used, end) = (w.used, w.end_ms);
        drop(guard);
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
        let key = key.normalized();
        let now = epoch_ms();
        let window_ms = window_s.max(1).saturating_mul(1000);
        let wid = now / window_ms;
        let remaining_ms = window_ms - now % window_ms;
        let mut guard = self.shard(key);
        let shard = &mut *guard;
        shard.sweep(mono_ms(), now);
        let fresh = Sliding {
            window_id: wid,
            window_ms,
            current: 0,
            previous: 0,
        };
        let s = match key {
            KeyRef::Ip(ip) => shard.sliding_ip.entry(ip).or_insert(fresh),
            KeyRef::Text(t) => {
                if !shard.sliding_text.contains_key(t) {
                    shard.sliding_text.insert(t.into(), fresh);
                }
                shard.sliding_text.get_mut(t).expect("just inserted")
            }
        };
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
        decision
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

/// Every local space, by prefix.
#[derive(Default)]
pub struct Spaces {
    map: Mutex<HashMap<Box<str>, Arc<Space>>>,
}

impl std::fmt::Debug for Spaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Spaces")
    }
}

impl Spaces {
    /// The space for `prefix`, created empty if there is none.
    pub fn get(&self, prefix: &str) -> Arc<Space> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = map.get(prefix) {
            return s.clone();
        }
        let s = Arc::new(Space::new(prefix));
        map.insert(prefix.into(), s.clone());
        s
    }

    /// Drops spaces that no compiled plugin references and whose windows are all over.
    pub fn sweep(&self) {
        let now_mono = mono_ms();
        let now_epoch = epoch_ms();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, space| {
            if Arc::strong_count(space) > 1 {
                return true;
            }
            space.shards.iter().any(|shard| {
                let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
                shard.swept_ms = 0;
                shard.sweep(now_mono, now_epoch);
                shard.len() > 0
            })
        });
    }

    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> KeyRef<'static> {
        KeyRef::Ip(s.parse().unwrap())
    }

    #[test]
    fn fixed_window_counts_and_resets() {
        let s = Space::new("t");
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
        let s = Space::new("t");
        assert!(!s.fixed(ip("1.1.1.1"), 1, 1, 1).rejected);
        assert!(s.fixed(ip("1.1.1.1"), 1, 1, 1).rejected);
        std::thread::sleep(std::time::Duration::from_millis(1100));
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
        let s = Arc::new(Space::new("t"));
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
        let s = Space::new("t");
        let mut passed = 0;
        for _ in 0..5 {
            if !s.sliding(KeyRef::Text("a"), 3, 100, 1).rejected {
                passed += 1;
            }
        }
        assert!(passed <= 3);
    }

    #[test]
    fn spaces_are_shared_and_swept() {
        let spaces = Spaces::default();
        let a = spaces.get("p1");
        assert!(Arc::ptr_eq(&a, &spaces.get("p1")));
        a.fixed(KeyRef::Text("x"), 5, 60, 1);
        drop(a);
        spaces.sweep();
        assert_eq!(spaces.len(), 1, "a live window keeps the space");
        let b = spaces.get("p2");
        drop(b);
        spaces.sweep();
        assert_eq!(spaces.len(), 1, "an idle unreferenced space goes");
    }
}
