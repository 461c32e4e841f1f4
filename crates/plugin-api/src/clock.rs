//! The gateway's clock: monotonic and wall milliseconds, or a manual one for tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use ferrisix_net::coarse_monotonic_ms;

/// Milliseconds on a monotonic clock and on the wall clock.
#[derive(Clone, Debug)]
pub struct Clock(Arc<ClockSource>);

#[derive(Debug)]
enum ClockSource {
    /// `base_coarse_ms`: the coarse clock's reading at `base`, where its readings start.
    System {
        base: Instant,
        base_coarse_ms: u64,
    },
    Manual {
        mono: AtomicU64,
        epoch: AtomicU64,
    },
}

/// Monotonic readings start here, so 0 never looks like a live deadline.
const MONO_START_MS: u64 = 1000;

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl Clock {
    /// The system clocks (`clock_gettime` through the vDSO: tens of nanoseconds a reading).
    pub fn system() -> Clock {
        Clock(Arc::new(ClockSource::System {
            base: Instant::now(),
            base_coarse_ms: coarse_monotonic_ms(),
        }))
    }

    /// A clock that moves only when told to ([`Clock::advance`]), starting at `epoch_ms`.
    pub fn manual(epoch_ms: u64) -> Clock {
        Clock(Arc::new(ClockSource::Manual {
            mono: AtomicU64::new(MONO_START_MS),
            epoch: AtomicU64::new(epoch_ms),
        }))
    }

    /// Monotonic milliseconds (windows and expiries: immune to wall-clock jumps).
    pub fn mono_ms(&self) -> u64 {
        match &*self.0 {
            ClockSource::System { base, .. } => base.elapsed().as_millis() as u64 + MONO_START_MS,
            ClockSource::Manual { mono, .. } => mono.load(Ordering::Relaxed),
        }
    }

    /// Monotonic milliseconds as of the kernel's last tick (1-4 ms behind [`Clock::mono_ms`]),
    /// for windows of a second or more that are read on every request (limit-count's): a
    /// fifth of the precise reading's cost. Keep one kind of reading per stored value.
    pub fn coarse_mono_ms(&self) -> u64 {
        match &*self.0 {
            ClockSource::System { base_coarse_ms, .. } => {
                coarse_monotonic_ms().saturating_sub(*base_coarse_ms) + MONO_START_MS
            }
            ClockSource::Manual { mono, .. } => mono.load(Ordering::Relaxed),
        }
    }

    /// Milliseconds since the epoch (windows aligned to wall-clock multiples, as APISIX's
    /// `ngx.now()`).
    pub fn epoch_ms(&self) -> u64 {
        match &*self.0 {
            ClockSource::System { .. } => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            ClockSource::Manual { epoch, .. } => epoch.load(Ordering::Relaxed),
        }
    }

    /// Moves a manual clock forward; a system clock ignores it.
    pub fn advance(&self, ms: u64) {
        if let ClockSource::Manual { mono, epoch } = &*self.0 {
            mono.fetch_add(ms, Ordering::Relaxed);
            epoch.fetch_add(ms, Ordering::Relaxed);
        }
    }
}
