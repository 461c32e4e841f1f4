//! A worker that has kept its core for a whole window gives it up for a moment.
//!
//! A worker under load rarely finds its event queue empty, so it rarely blocks, and the
//! kernel takes the core from it only at a wake-up that may preempt it or at the next
//! scheduler tick (4 ms at the common `HZ=250`). On a machine where the gateway shares its
//! cores with other processes (its clients, its upstreams, a sidecar), a process woken onto
//! the worker's core then waits up to a tick, and the requests that process serves or sends
//! wait with it. nginx blocks in `epoll_wait` between bursts and hands its core over there; a
//! busy worker that never blocks kept the load generator and the upstream waiting for ticks,
//! which shows as a tail latency above nginx's when they share cores (`benches/e2e/bench.py`
//! on a 2-core machine; with `--pin split` the two tails are level). So a worker that ran for
//! nearly all of the last half millisecond yields its core once (`sched_yield`): whatever
//! waits on that core runs first, and with nothing waiting the call returns at once. The check
//! costs one read of the thread's CPU clock per window, taken when a request starts at least a
//! window after the last check: bounded by the window, and nothing when idle. It runs where a
//! request starts, so a worker busy only relaying long bodies, with no request starting, does
//! not yield: such a worker mostly waits on its sockets anyway.

use std::cell::Cell;
use std::time::{Duration, Instant};

use crate::priority::thread_cpu_time;

/// How long a worker may keep its core before it offers it: an eighth of a 250 Hz tick. A
/// longer window leaves more of the tail in place at the same CPU per request
/// (`benches/e2e/bench.py`'s p99 on shared cores is the measure).
const SHARE_WINDOW: Duration = Duration::from_micros(500);

/// The share of the window the worker must have run for it to yield: below it, the kernel has
/// already switched it out for a while, and others have had their turn.
const BUSY_NUM: u32 = 9;
const BUSY_DEN: u32 = 10;

thread_local! {
    /// The window's start on this thread: its wall time and the thread's CPU time then.
    static WINDOW: Cell<Option<(Instant, Duration)>> = const { Cell::new(None) };
}

/// Whether a thread that ran `ran` of the last `wall` kept its core for the whole window.
fn kept_the_core(wall: Duration, ran: Duration) -> bool {
    wall >= SHARE_WINDOW && ran * BUSY_DEN >= wall * BUSY_NUM
}

/// Called by a worker as a request starts, at `now` (a clock reading it takes anyway). Yields
/// the core once when this thread ran for nearly all of the window that has just passed;
/// says whether it did.
pub fn share_core(now: Instant) -> bool {
    WINDOW.with(|window| {
        let Some((start, cpu_at_start)) = window.get() else {
            window.set(Some((now, thread_cpu_time())));
            return false;
        };
        let wall = now.saturating_duration_since(start);
        if wall < SHARE_WINDOW {
            return false;
        }
        let cpu = thread_cpu_time();
        let yielded = kept_the_core(wall, cpu.saturating_sub(cpu_at_start));
        if yielded {
            rustix::thread::sched_yield();
        }
        window.set(Some((now, cpu)));
        yielded
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_whole_window_nearly_all_run_counts() {
        let ms = Duration::from_millis;
        let us = Duration::from_micros;
        assert!(kept_the_core(us(500), us(480)));
        assert!(kept_the_core(ms(3), us(2_800)));
        // Switched out for a fifth of it: the kernel has shared the core already.
        assert!(!kept_the_core(ms(1), us(800)));
        // Idle most of a long gap (the thread slept in its event loop).
        assert!(!kept_the_core(ms(500), ms(2)));
        // Too short a window to say.
        assert!(!kept_the_core(us(400), us(400)));
    }

    #[test]
    fn a_spinning_thread_yields_and_a_sleeping_one_does_not() {
        std::thread::spawn(|| {
            let begin = Instant::now();
            assert!(!share_core(begin), "the first call only opens a window");
            // Sleeping through windows: never a yield.
            for _ in 0..3 {
                std::thread::sleep(Duration::from_millis(3));
                assert!(!share_core(Instant::now()));
            }
            // Spinning: once a window has passed the thread has run nearly all of it, unless
            // the machine's other threads took its core; try for a while.
            let started = Instant::now();
            let mut yields = 0;
            while yields == 0 {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "a spinning thread never yielded"
                );
                let mut x = 0u64;
                let spin = Instant::now();
                while spin.elapsed() < Duration::from_micros(50) {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                if share_core(Instant::now()) {
                    yields += 1;
                }
            }
        })
        .join()
        .unwrap();
    }
}
