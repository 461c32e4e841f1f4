//! A cheap clock for bookkeeping that can live with a kernel tick's resolution.
//!
//! `CLOCK_MONOTONIC_COARSE` is the monotonic clock as of the kernel's last tick (1-4 ms old,
//! by `CONFIG_HZ`), read from the vDSO's data page alone, where `Instant::now()` also reads
//! the TSC and scales it, several times the cost, and the request path reads a clock many
//! times per request. callgrind does not count vDSO reads (`benches/e2e/instructions.py`
//! misses them); `perf record` of a worker under `benches/e2e/bench.py` shows them. Idle
//! timestamps (pooled connections) and counting windows (limit-count) take this one; what is
//! logged or measured against a request's timeouts keeps `Instant`.

use rustix::time::{clock_gettime, ClockId};

#[cfg(any(target_os = "linux", target_os = "android"))]
const COARSE: ClockId = ClockId::MonotonicCoarse;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const COARSE: ClockId = ClockId::Monotonic;

/// Milliseconds on the coarse monotonic clock: `Instant`'s timeline, behind it by less than
/// one kernel tick.
pub fn coarse_monotonic_ms() -> u64 {
    let t = clock_gettime(COARSE);
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(t.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1000) + nanos / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn precise_ms() -> u64 {
        let t = clock_gettime(ClockId::Monotonic);
        u64::try_from(t.tv_sec).unwrap() * 1000 + u64::try_from(t.tv_nsec).unwrap() / 1_000_000
    }

    /// It is the monotonic clock's timeline, never ahead of it, behind by about a tick, and
    /// it moves with it.
    #[test]
    fn follows_the_monotonic_clock() {
        let coarse = coarse_monotonic_ms();
        let precise = precise_ms();
        assert!(coarse <= precise, "{coarse} ahead of {precise}");
        assert!(precise - coarse < 1_000, "{coarse} far behind {precise}");
        std::thread::sleep(std::time::Duration::from_millis(50));
        let later = coarse_monotonic_ms();
        assert!(
            later >= coarse + 30,
            "50 ms of sleep moved it {} ms",
            later - coarse
        );
    }
}
