//! A per-client-address limit on failed Admin API authentications (ferrisix's own: APISIX
//! compares every key it is sent, however many).
//!
//! Each wrong key spends one cell of a GCRA bucket (`governor`) for the client's address.
//! When the bucket refuses, the address is locked out until a cell frees up: its requests are
//! answered 429 before any key is compared, so guessing cannot go on at a higher rate, even
//! with the right key among the guesses. IPv6 clients are grouped by /64 (one host's usual
//! allocation), so an attacker cannot hop addresses inside its own prefix.

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};

/// Past this many tracked addresses, forgotten state is dropped on the next failure.
const PRUNE_ABOVE: usize = 4096;

/// See the module documentation.
#[derive(Debug)]
pub struct AuthGuard {
    limiter: RateLimiter<IpAddr, DefaultKeyedStateStore<IpAddr>, DefaultClock>,
    locked: Mutex<HashMap<IpAddr, Instant>>,
}

impl AuthGuard {
    /// `burst` failures at once, then `per_minute`; `None` when either is 0.
    pub fn new(burst: u32, per_minute: u32) -> Option<AuthGuard> {
        let quota =
            Quota::per_minute(NonZeroU32::new(per_minute)?).allow_burst(NonZeroU32::new(burst)?);
        Some(AuthGuard {
            limiter: RateLimiter::keyed(quota),
            locked: Mutex::new(HashMap::new()),
        })
    }

    /// How long `client` must wait before its key is looked at again, if it is locked out.
    pub fn locked_out(&self, client: IpAddr) -> Option<Duration> {
        let key = group(client);
        let mut locked = self.locked.lock().unwrap_or_else(|e| e.into_inner());
        let until = *locked.get(&key)?;
        let now = Instant::now();
        if until > now {
            return Some(until - now);
        }
        locked.remove(&key);
        None
    }

    /// Records a wrong key from `client`; `Some(wait)` when that was one too many.
    pub fn failed(&self, client: IpAddr) -> Option<Duration> {
        let key = group(client);
        if self.limiter.len() > PRUNE_ABOVE {
            self.limiter.retain_recent();
        }
        let refused = self.limiter.check_key(&key).err()?;
        let wait = refused.wait_time_from(self.limiter.clock().now());
        let mut locked = self.locked.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if locked.len() > PRUNE_ABOVE {
            locked.retain(|_, until| *until > now);
        }
        locked.insert(key, now + wait);
        Some(wait)
    }
}

/// The address the limit applies to: IPv4 as is, IPv6 by its /64.
fn group(client: IpAddr) -> IpAddr {
    match client.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_429_per_address() {
        let guard = AuthGuard::new(3, 1).unwrap();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 0..3 {
            assert_eq!(guard.locked_out(a), None);
            assert_eq!(guard.failed(a), None);
        }
        let wait = guard.failed(a).expect("fourth failure refused");
        assert!(
            wait > Duration::from_secs(50) && wait <= Duration::from_secs(60),
            "{wait:?}"
        );
        assert!(guard.locked_out(a).is_some());
        // Another address has its own bucket.
        assert_eq!(guard.locked_out(b), None);
        assert_eq!(guard.failed(b), None);
    }

    #[test]
    fn ipv6_is_grouped_by_64() {
        let guard = AuthGuard::new(1, 1).unwrap();
        assert_eq!(guard.failed("2001:db8::1".parse().unwrap()), None);
        assert!(guard.failed("2001:db8::2".parse().unwrap()).is_some());
        assert_eq!(guard.failed("2001:db8:0:1::1".parse().unwrap()), None);
        assert!(AuthGuard::new(0, 1).is_none());
    }
}
