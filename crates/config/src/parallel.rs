//! Work spread over the cores when there is a lot of it: at boot every stored value is
//! parsed, and the first compile validates and compiles every stored resource (100,000
//! routes), which on one thread was most of the time to serving. A change has a handful of
//! items and stays on its thread.

/// Fewer items than this are mapped on the calling thread: starting threads costs more than
/// a few hundred validations.
pub const PARALLEL_FROM: usize = 512;

/// `items.iter().map(f).collect()`, in the same order, on up to `available_parallelism`
/// threads (the caller's included) when there are at least [`PARALLEL_FROM`] items.
///
/// Scoped threads, not the Tokio blocking pool: the callers already run on a blocking
/// thread (or on the main thread before serving), and wait for all of them before they go
/// on, so nothing outlives them. A panic in `f` is a bug and is raised again here, as it would
/// have been on one thread.
pub fn map<I: Sync, O: Send>(items: &[I], f: impl Fn(&I) -> O + Sync) -> Vec<O> {
    // The length first: `available_parallelism` reads the cgroup's CPU quota from /proc and
    // /sys on every call, which a one-route change called for each kind it validates
    // (`benches/snapshot_change.rs` times such a change).
    if items.len() < PARALLEL_FROM {
        return items.iter().map(f).collect();
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if threads < 2 {
        return items.iter().map(f).collect();
    }
    let chunk = items.len().div_ceil(threads);
    let f = &f;
    std::thread::scope(|scope| {
        let others: Vec<_> = items
            .chunks(chunk)
            .skip(1)
            .map(|part| scope.spawn(move || part.iter().map(f).collect::<Vec<O>>()))
            .collect();
        let mut out: Vec<O> = items[..chunk].iter().map(f).collect();
        out.reserve(items.len() - out.len());
        for other in others {
            match other.join() {
                Ok(part) => out.extend(part),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_order_below_and_above_the_threshold() {
        for n in [
            0,
            1,
            PARALLEL_FROM - 1,
            PARALLEL_FROM,
            10 * PARALLEL_FROM + 7,
        ] {
            let items: Vec<usize> = (0..n).collect();
            let out = map(&items, |i| i * 3);
            assert_eq!(
                out,
                items.iter().map(|i| i * 3).collect::<Vec<_>>(),
                "n={n}"
            );
        }
    }

    #[test]
    fn uses_other_threads_for_many_items() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let items: Vec<usize> = (0..4 * PARALLEL_FROM).collect();
        let caller = std::thread::current().id();
        let ids = map(&items, |_| std::thread::current().id());
        let elsewhere = ids.iter().filter(|id| **id != caller).count();
        if cores > 1 {
            assert!(elsewhere > 0, "some items ran on another thread");
            assert!(elsewhere < items.len(), "the caller took its share");
        } else {
            assert_eq!(elsewhere, 0);
        }
    }
}
