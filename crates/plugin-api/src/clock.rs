//! The gateway's clock: monotonic and wall milliseconds, or a manual one for tests; and
//! [`CivilTime`], the one calendar conversion the logs write their timestamps with (the access
//! log in the proxy crate and the logger plugins both depend on this crate).

use std::fmt;
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

/// A UTC calendar date and time of day, to the second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CivilTime {
    pub year: i64,
    /// 1 to 12.
    pub month: u32,
    /// 1 to 31.
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

impl CivilTime {
    /// The UTC date and time `secs` seconds after the Unix epoch (Howard Hinnant's
    /// civil-from-days: exact for every date, no table, no time-zone database).
    pub fn from_unix_secs(secs: u64) -> CivilTime {
        let days = (secs / 86_400) as i64;
        let rem = secs % 86_400;
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        CivilTime {
            year: yoe + era * 400 + i64::from(month <= 2),
            month,
            day,
            hour: (rem / 3600) as u32,
            minute: (rem % 3600 / 60) as u32,
            second: (rem % 60) as u32,
        }
    }

    /// The day of the year, 1 for January 1st (strftime's `%j`).
    pub fn day_of_year(&self) -> u32 {
        const BEFORE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let y = self.year;
        let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        BEFORE[(self.month - 1) as usize] + self.day + u32::from(leap && self.month > 2)
    }

    /// The month's English abbreviation (`Jan`), as nginx and HTTP dates write it.
    pub fn month_abbr(&self) -> &'static str {
        MONTHS[(self.month - 1) as usize]
    }

    /// nginx's `$time_iso8601` in UTC: `2024-01-02T03:04:05+00:00`.
    pub fn iso8601(self) -> impl fmt::Display {
        Iso8601(self)
    }

    /// nginx's `$time_local` in UTC: `02/Jan/2024:03:04:05 +0000`.
    pub fn time_local(self) -> impl fmt::Display {
        TimeLocal(self)
    }
}

struct Iso8601(CivilTime);

impl fmt::Display for Iso8601 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.0;
        write!(
            f,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}+00:00",
            t.year, t.month, t.day, t.hour, t.minute, t.second
        )
    }
}

struct TimeLocal(CivilTime);

impl fmt::Display for TimeLocal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.0;
        write!(
            f,
            "{:02}/{}/{}:{:02}:{:02}:{:02} +0000",
            t.day,
            t.month_abbr(),
            t.year,
            t.hour,
            t.minute,
            t.second
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_times() {
        let t = CivilTime::from_unix_secs(0);
        assert_eq!((t.year, t.month, t.day, t.hour), (1970, 1, 1, 0));
        assert_eq!(t.day_of_year(), 1);
        // 2026-11-30T01:23:48Z
        let t = CivilTime::from_unix_secs(1_796_001_828);
        assert_eq!(
            t,
            CivilTime {
                year: 2026,
                month: 11,
                day: 30,
                hour: 1,
                minute: 23,
                second: 48
            }
        );
        assert_eq!(t.day_of_year(), 334);
        assert_eq!(t.iso8601().to_string(), "2026-11-30T01:23:48+00:00");
        assert_eq!(t.time_local().to_string(), "30/Nov/2026:01:23:48 +0000");
        // A leap day, and the day after it counted in the year.
        let t = CivilTime::from_unix_secs(951_868_800); // 2000-03-01
        assert_eq!((t.year, t.month, t.day), (2000, 3, 1));
        assert_eq!(t.day_of_year(), 61);
        let t = CivilTime::from_unix_secs(4_107_542_399); // 2100-02-28T23:59:59, no leap day
        assert_eq!((t.month, t.day, t.second), (2, 28, 59));
        assert_eq!(CivilTime::from_unix_secs(4_107_542_400).month, 3);
    }
}
