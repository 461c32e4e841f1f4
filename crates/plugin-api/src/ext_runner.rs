//! Where the external plugin runner listens (APISIX's `ext-plugin`), as the binary set it up:
//! the unix socket the `ext-plugin-*` plugins connect to, how long they wait on the runner,
//! and a generation that moves on whenever the conf tokens the runner handed out may be
//! gone (the supervised runner exited, or a runner answered "conf token not found"), so that
//! every plugin prepares its conf again, as APISIX flushes its token cache then.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The runner's socket and the validity of its conf tokens, one per gateway.
#[derive(Debug)]
pub struct ExtRunner {
    path: PathBuf,
    timeout: Duration,
    generation: AtomicU64,
}

impl ExtRunner {
    /// `path`: the unix socket; `timeout`: how long one send or one read may take (APISIX:
    /// 60 s; connecting is given 1 s).
    pub fn new(path: PathBuf, timeout: Duration) -> ExtRunner {
        ExtRunner {
            path,
            timeout,
            generation: AtomicU64::new(0),
        }
    }

    /// APISIX's default socket: `conf/apisix-<pid>.sock` under the working directory.
    pub fn default_path() -> PathBuf {
        let dir = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        dir.join("conf")
            .join(format!("apisix-{}.sock", std::process::id()))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The tokens of earlier generations are no longer valid.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Forgets every conf token handed out so far.
    pub fn flush_tokens(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}

impl Default for ExtRunner {
    fn default() -> Self {
        ExtRunner::new(ExtRunner::default_path(), Duration::from_secs(60))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushing_moves_the_generation() {
        let r = ExtRunner::new(PathBuf::from("/tmp/r.sock"), Duration::from_secs(2));
        let g = r.generation();
        r.flush_tokens();
        assert_eq!(r.generation(), g + 1);
        assert_eq!(r.path(), Path::new("/tmp/r.sock"));
        assert!(
            ExtRunner::default_path().ends_with(format!("conf/apisix-{}.sock", std::process::id()))
        );
    }
}
