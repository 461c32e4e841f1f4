//! CPU priority of the threads that are not the workers.

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

#[cfg(test)]
mod tests {
    use super::*;

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
