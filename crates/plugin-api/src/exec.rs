//! Where the gateway's background tasks run.

use std::future::Future;

/// Where background tasks run: a runtime handle the binary passes in, or (tests, tools) the
/// runtime of whoever spawns.
#[derive(Clone, Debug, Default)]
pub struct Executor(Option<tokio::runtime::Handle>);

impl Executor {
    pub fn new(handle: tokio::runtime::Handle) -> Executor {
        Executor(Some(handle))
    }

    /// Spawns on the caller's runtime.
    pub fn current() -> Executor {
        Executor(None)
    }

    /// Runs `fut` detached from the caller: it completes even if the caller goes away.
    pub fn spawn<F>(&self, fut: F) -> Result<tokio::task::JoinHandle<F::Output>, String>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.0 {
            Some(h) => Ok(h.spawn(fut)),
            None => tokio::runtime::Handle::try_current()
                .map(|h| h.spawn(fut))
                .map_err(|_| "no runtime to run background tasks on".to_string()),
        }
    }
}
