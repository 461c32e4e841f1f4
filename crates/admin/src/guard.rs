//! A per-client-address limit on failed Admin API authentications (ferrisix's own: APISIX
//! compares every key it is sent, however many).
//!
//! Each wrong key spends one cell of a GCRA bucket (`governor`) for the client's address; past
//! the burst, the address's wrong keys are answered 429 until a cell frees up. A right key gets
//! through whatever the bucket holds: behind a shared address (a NAT, a corporate proxy) anyone
//! could otherwise lock the operators out by sending wrong keys. IPv6 clients are grouped by
//! /64 (one host's usual allocation), so an attacker cannot hop addresses inside its own
//! prefix.
//!
//! Why letting the right key through is safe:
//! - The presented key is compared on every request, locked out or not, against every
//!   configured key in constant time (`auth::check`). The guard is asked only after the
//!   comparison and only about its outcome, so its state changes no comparison and no timing
//!   tells how much of a wrong key matched.
//! - Only failures reach the bucket. A success neither spends nor frees a cell, so an
//!   operator's requests cannot refill the bucket for the guesses that follow, and every wrong
//!   key of a throttled address gets the same 429, without a comparison result to read.
//! - What it gives up: a throttled address still learns when a guess is right, so the guard
//!   does not cap how fast one address can try keys; it caps the failures answered with a
//!   401 and makes a guessing address stand out (every refusal is logged with the client).
//!   The key itself must resist guessing, as it already had to against guesses spread over
//!   many addresses (APISIX generates 32 random characters when `admin_key` is empty).

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};

/// Past this many tracked addresses, forgotten state is dropped on the next failure.
const PRUNE_ABOVE: usize = 4096;

/// See the module documentation.
#[derive(Debug)]
pub struct AuthGuard {
    limiter: RateLimiter<IpAddr, DefaultKeyedStateStore<IpAddr>, DefaultClock>,
}

impl AuthGuard {
    /// `burst` failures at once, then `per_minute`; `None` when either is 0.
    pub fn new(burst: u32, per_minute: u32) -> Option<AuthGuard> {
        let quota =
            Quota::per_minute(NonZeroU32::new(per_minute)?).allow_burst(NonZeroU32::new(burst)?);
        Some(AuthGuard {
            limiter: RateLimiter::keyed(quota),
        })
    }

    /// Records a wrong key from `client`; `Some(wait)` when the address is over its limit
    /// (a refused failure spends nothing, so a throttled address stays throttled no longer
    /// than its last accepted failure makes it).
    pub fn failed(&self, client: IpAddr) -> Option<Duration> {
        let key = group(client);
        if self.limiter.len() > PRUNE_ABOVE {
            self.limiter.retain_recent();
        }
        let refused = self.limiter.check_key(&key).err()?;
        Some(refused.wait_time_from(self.limiter.clock().now()))
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
            assert_eq!(guard.failed(a), None);
        }
        let wait = guard.failed(a).expect("fourth failure refused");
        assert!(
            wait > Duration::from_secs(50) && wait <= Duration::from_secs(60),
            "{wait:?}"
        );
        assert!(guard.failed(a).is_some(), "still refused");
        // Another address has its own bucket.
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
