//! One health-checked node: lua-resty-healthcheck's four counters and four states, packed in one
//! atomic word that every worker thread and the prober update with compare-and-swap.
//!
//! The rules are resty.healthcheck's `incr_counter`: a report in the direction the target
//! already fully is (a success on a healthy target) is not counted; a success clears the three
//! failure counters and a failure clears the success counter; reaching the limit flips the
//! state; a first report against the state makes it `mostly_healthy` / `mostly_unhealthy`
//! (which still count as healthy / unhealthy). Counters are not reset on a flip.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// How many live targets of one checker lineage (a checker and the ones that took its targets
/// over) are down. The request path reads it once per pick: while it is 0 no node's health is
/// looked at. Each target adds itself when it goes down and removes itself when it comes back
/// up or is dropped while down, so the count is exact (a target dropped from the node list but
/// still held by a request in flight keeps counting until it goes, which only sends picks
/// down the slower, per-node path meanwhile).
#[derive(Debug, Default)]
pub struct DownTally(AtomicUsize);

impl DownTally {
    /// Whether some target of this lineage is down.
    pub fn any(&self) -> bool {
        self.0.load(Ordering::Relaxed) != 0
    }
}

/// The four states of resty.healthcheck.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    Healthy,
    MostlyHealthy,
    MostlyUnhealthy,
    Unhealthy,
}

impl Health {
    fn from_bits(b: u64) -> Health {
        match b & 3 {
            0 => Health::Healthy,
            1 => Health::MostlyHealthy,
            2 => Health::MostlyUnhealthy,
            _ => Health::Unhealthy,
        }
    }

    fn bits(self) -> u64 {
        match self {
            Health::Healthy => 0,
            Health::MostlyHealthy => 1,
            Health::MostlyUnhealthy => 2,
            Health::Unhealthy => 3,
        }
    }

    /// `get_target_status`: healthy and mostly healthy targets receive traffic.
    pub fn is_up(self) -> bool {
        matches!(self, Health::Healthy | Health::MostlyHealthy)
    }

    /// As the control API names it.
    pub fn name(self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::MostlyHealthy => "mostly_healthy",
            Health::MostlyUnhealthy => "mostly_unhealthy",
            Health::Unhealthy => "unhealthy",
        }
    }
}

/// Which counter a report moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    Success = 0,
    Http = 1,
    Tcp = 2,
    Timeout = 3,
}

/// The counters as the control API shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub success: u8,
    pub http_failure: u8,
    pub tcp_failure: u8,
    pub timeout_failure: u8,
}

const HEALTH_SHIFT: u32 = 32;
const SUCCESS_MASK: u64 = 0xff;
const FAILURE_MASK: u64 = 0xffff_ff00;

/// A node as its checker knows it: resty.healthcheck's identity (ip, port, hostname) plus the
/// Host header its probes send.
#[derive(Debug)]
pub struct Target {
    pub ip: IpAddr,
    pub port: u16,
    /// `checks.active.host`, else the ip.
    pub hostname: String,
    /// The Host header of probes when it is not the hostname: the node's domain, or
    /// `upstream_host` with `pass_host: rewrite`.
    pub host_header: Option<String>,
    /// Low 32 bits: the counters (success, http, tcp, timeout, one byte each); bits 32-33: the
    /// state.
    word: AtomicU64,
    /// Bumped each time the target goes down; pooled connections opened before are not reused.
    down_epoch: AtomicU32,
    tally: Arc<DownTally>,
}

/// The identity a target is found by when a node list changes.
pub type TargetKey = (IpAddr, u16, String, Option<String>);

impl Target {
    /// A healthy target counted, when it goes down, in `tally`.
    pub fn new(
        ip: IpAddr,
        port: u16,
        hostname: String,
        host_header: Option<String>,
        tally: Arc<DownTally>,
    ) -> Target {
        Target {
            ip,
            port,
            hostname,
            host_header,
            word: AtomicU64::new(0),
            down_epoch: AtomicU32::new(0),
            tally,
        }
    }

    pub fn key(&self) -> TargetKey {
        (
            self.ip,
            self.port,
            self.hostname.clone(),
            self.host_header.clone(),
        )
    }

    pub fn health(&self) -> Health {
        Health::from_bits(self.word.load(Ordering::Relaxed) >> HEALTH_SHIFT)
    }

    pub fn is_up(&self) -> bool {
        self.health().is_up()
    }

    pub fn down_epoch(&self) -> u32 {
        self.down_epoch.load(Ordering::Relaxed)
    }

    pub fn counters(&self) -> Counters {
        let w = self.word.load(Ordering::Relaxed);
        Counters {
            success: w as u8,
            http_failure: (w >> 8) as u8,
            tcp_failure: (w >> 16) as u8,
            timeout_failure: (w >> 24) as u8,
        }
    }

    /// `incr_counter`: one report towards `towards_up` on `counter`, which flips the target
    /// when it reaches `limit` (0 disables the counter). Returns the new state when it changed.
    pub fn report(&self, towards_up: bool, counter: Counter, limit: u8) -> Option<Health> {
        if limit == 0 {
            return None;
        }
        let mut current = self.word.load(Ordering::Relaxed);
        loop {
            let health = Health::from_bits(current >> HEALTH_SHIFT);
            if (towards_up && health == Health::Healthy)
                || (!towards_up && health == Health::Unhealthy)
            {
                return None;
            }
            let shift = 8 * counter as u32;
            let value = ((current >> shift) & 0xff).saturating_add(1).min(0xff);
            let counters = current & 0xffff_ffff;
            let counters = (counters & !(0xff << shift)) | (value << shift);
            let counters = if counter == Counter::Success {
                counters & SUCCESS_MASK
            } else {
                counters & FAILURE_MASK
            };
            let new_health = if value >= u64::from(limit) {
                if towards_up {
                    Health::Healthy
                } else {
                    Health::Unhealthy
                }
            } else if health == Health::Healthy && counters & FAILURE_MASK != 0 {
                Health::MostlyHealthy
            } else if health == Health::Unhealthy && counters & SUCCESS_MASK != 0 {
                Health::MostlyUnhealthy
            } else {
                health
            };
            let new = counters | (new_health.bits() << HEALTH_SHIFT);
            match self
                .word
                .compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    if new_health.is_up() != health.is_up() {
                        // Only the report that won the CAS sees this flip: the tally moves once.
                        if new_health.is_up() {
                            self.tally.0.fetch_sub(1, Ordering::Relaxed);
                        } else {
                            self.tally.0.fetch_add(1, Ordering::Relaxed);
                            self.down_epoch.fetch_add(1, Ordering::Relaxed);
                        }
                        return Some(new_health);
                    }
                    return (new_health != health).then_some(new_health);
                }
                Err(actual) => current = actual,
            }
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if !self.is_up() {
            self.tally.0.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target::new(
            "127.0.0.1".parse().unwrap(),
            80,
            "127.0.0.1".into(),
            None,
            Arc::default(),
        )
    }

    #[test]
    fn the_tally_counts_down_targets_exactly() {
        let tally = Arc::new(DownTally::default());
        let new = || {
            Target::new(
                "127.0.0.1".parse().unwrap(),
                80,
                "127.0.0.1".into(),
                None,
                tally.clone(),
            )
        };
        let (a, b) = (new(), new());
        assert!(!tally.any());
        a.report(false, Counter::Tcp, 1);
        a.report(false, Counter::Tcp, 1);
        b.report(false, Counter::Http, 1);
        assert_eq!(tally.0.load(Ordering::Relaxed), 2);
        a.report(true, Counter::Success, 1);
        assert_eq!(tally.0.load(Ordering::Relaxed), 1);
        drop(b);
        assert!(!tally.any(), "a target dropped while down still counted");
        drop(a);
        assert!(!tally.any());
    }

    #[test]
    fn successes_on_a_healthy_target_are_not_counted() {
        let t = target();
        assert_eq!(t.report(true, Counter::Success, 2), None);
        assert_eq!(t.counters(), Counters::default());
    }

    #[test]
    fn failures_flip_after_the_limit_and_stay_counted() {
        let t = target();
        assert_eq!(
            t.report(false, Counter::Tcp, 2),
            Some(Health::MostlyHealthy)
        );
        assert!(t.is_up());
        assert_eq!(t.report(false, Counter::Tcp, 2), Some(Health::Unhealthy));
        assert!(!t.is_up());
        assert_eq!(t.down_epoch(), 1);
        // Fully unhealthy: further failures are not counted.
        assert_eq!(t.report(false, Counter::Tcp, 2), None);
        assert_eq!(t.counters().tcp_failure, 2);
    }

    #[test]
    fn a_success_clears_failures_and_a_failure_clears_successes() {
        let t = target();
        t.report(false, Counter::Http, 5);
        t.report(false, Counter::Timeout, 5);
        assert_eq!(t.health(), Health::MostlyHealthy);
        t.report(true, Counter::Success, 3);
        let c = t.counters();
        assert_eq!((c.success, c.http_failure, c.timeout_failure), (1, 0, 0));
        // Still mostly healthy: resty only flips at the limit.
        assert_eq!(t.health(), Health::MostlyHealthy);
        t.report(true, Counter::Success, 3);
        t.report(true, Counter::Success, 3);
        assert_eq!(t.health(), Health::Healthy);
        t.report(false, Counter::Http, 5);
        assert_eq!(t.counters().success, 0);
    }

    #[test]
    fn recovery_goes_through_mostly_unhealthy() {
        let t = target();
        t.report(false, Counter::Tcp, 1);
        assert_eq!(t.health(), Health::Unhealthy);
        assert_eq!(
            t.report(true, Counter::Success, 2),
            Some(Health::MostlyUnhealthy)
        );
        assert!(!t.is_up());
        assert_eq!(t.report(true, Counter::Success, 2), Some(Health::Healthy));
        assert_eq!(t.counters().tcp_failure, 0);
    }

    #[test]
    fn zero_limit_disables_the_counter() {
        let t = target();
        assert_eq!(t.report(false, Counter::Tcp, 0), None);
        assert_eq!(t.counters(), Counters::default());
    }
}
