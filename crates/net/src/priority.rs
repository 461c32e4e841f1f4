//! CPU priority of the threads that are not the workers, and the CPU time a thread spent.

/// How much nicer than the workers the control threads run (see [`yield_to_workers`]).
pub const CONTROL_NICENESS: i32 = 10;

/// Lowers the calling thread's CPU priority by [`CONTROL_NICENESS`] (Linux applies a
/// thread's nice value to that thread alone, and threads it starts inherit it).
///
/// For the threads that apply configuration changes, answer the Admin API and probe
/// upstreams: on a node whose cores are busy with requests, a burst of changes then takes
/// longer to apply instead of stretching the requests' latency, and on an idle node nothing
/// changes (nice only weighs threads that compete for a core). Failing (a platform without
/// per-thread priorities) leaves the thread as it was, which is only a lost preference.
pub fn yield_to_workers() {
    let me = rustix::thread::gettid();
    let current = rustix::process::getpriority_process(Some(me)).unwrap_or(0);
    if let Err(e) = rustix::process::setpriority_process(Some(me), current + CONTROL_NICENESS) {
        tracing::debug!("cannot lower the control thread's priority: {e}");
    }
}

/// The CPU time the calling thread has used so far (its thread CPU clock).
///
/// A control thread runs at [`CONTROL_NICENESS`], so on busy cores its wall time stretches
/// by design; this is what its work itself cost, which the difference of two readings gives.
/// (Not `/proc/thread-self/schedstat`: the kernel brings that figure up to date only when
/// the thread is switched out or a tick lands, so a 0.1 ms compile mostly read as zero.)
pub fn thread_cpu_time() -> std::time::Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let nanos = u32::try_from(t.tv_nsec).unwrap_or(0);
    std::time::Duration::new(secs, nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_cpu_time_counts_this_threads_work_not_its_sleep() {
        let before = thread_cpu_time();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let slept = thread_cpu_time() - before;
        assert!(slept < std::time::Duration::from_millis(10), "{slept:?}");
        // Spinning moves it (however busy the machine's other threads keep the cores).
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while thread_cpu_time() - before < std::time::Duration::from_millis(20) {
            x = std::hint::black_box(x.wrapping_add(1));
            assert!(
                started.elapsed() < std::time::Duration::from_secs(30),
                "it never moved"
            );
        }
    }

    #[test]
    fn thread_cpu_time_resolves_far_below_a_scheduler_tick() {
        // A clock updated only at ticks and switches moves in steps of a millisecond or more;
        // a compile's 0.1 ms would read as zero. Consecutive readings must differ by less.
        let mut smallest = std::time::Duration::MAX;
        let mut last = thread_cpu_time();
        let started = std::time::Instant::now();
        while started.elapsed() < std::time::Duration::from_millis(200) {
            let now = thread_cpu_time();
            if now > last {
                smallest = smallest.min(now - last);
            }
            last = now;
        }
        assert!(
            smallest < std::time::Duration::from_micros(200),
            "{smallest:?}"
        );
    }

    #[test]
    fn a_control_thread_runs_nicer_than_the_thread_that_started_it() {
        let before = rustix::process::getpriority_process(None).unwrap();
        let inside = std::thread::spawn(|| {
            yield_to_workers();
            let me = rustix::thread::gettid();
            // A thread it starts inherits the lowered priority.
            let child = std::thread::spawn(|| {
                rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap()
            })
            .join()
            .unwrap();
            (
                rustix::process::getpriority_process(Some(me)).unwrap(),
                child,
            )
        })
        .join()
        .unwrap();
        let lowered = (before + CONTROL_NICENESS).min(19);
        assert_eq!(inside, (lowered, lowered));
        // The calling thread is untouched.
        assert_eq!(rustix::process::getpriority_process(None).unwrap(), before);
    }
}
