//! The process's lifetime: its signals, the Admin API server that a hand-over stops and
//! restarts, what this process does for a successor ([`ferrisix_net::handover`]), and the pid
//! file.
//!
//! Restarts and binary upgrades lose no connection because the listening sockets are never
//! closed while a client may be waiting on them: a new `ferrisix` started on the same
//! config.yaml finds the running one on its hand-over socket, receives its listening sockets
//! (with the connections queued on them), starts serving from them, and only then tells the
//! old one to stop accepting and drain. A plain SIGTERM followed by a start works the same way:
//! after SIGTERM the old process drains but keeps its sockets open for
//! `ferrisix.handover_wait`, so connections arriving between the stop and the start are not
//! refused. Meanwhile it accepts them and answers each itself (closing it after its answer):
//! with no successor coming, a connection left in the queue would only be reset when the
//! sockets close.

use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ferrisix_admin::AdminApi;
use ferrisix_config::store::embedded::EmbeddedStore;
use ferrisix_net::handover::Predecessor;
use ferrisix_net::ConnLimits;
use tokio::sync::{mpsc, watch};

/// What the main loop reacts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// SIGTERM or SIGINT: stop (keeping the sockets, and answering on them, for a successor a
    /// while).
    Stop,
    /// A successor took the listening sockets over and serves: stop at once.
    HandedOver,
    /// SIGHUP: re-read config.yaml.
    Reload,
    /// SIGUSR1: reopen the log files.
    Reopen,
    /// SIGUSR2: start a successor from the binary on disk (nginx's binary upgrade).
    Upgrade,
}

/// Turns the process's signals into [`Event`]s on `tx`. Runs on the control runtime.
pub fn forward_signals(tx: mpsc::UnboundedSender<Event>) -> io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let kinds = [
        (SignalKind::terminate(), Event::Stop),
        (SignalKind::interrupt(), Event::Stop),
        (SignalKind::hangup(), Event::Reload),
        (SignalKind::user_defined1(), Event::Reopen),
        (SignalKind::user_defined2(), Event::Upgrade),
    ];
    for (kind, event) in kinds {
        let mut stream = signal(kind)?;
        let tx = tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if tx.send(event).is_err() {
                    return;
                }
            }
        });
    }
    Ok(())
}

/// The Admin API server, which a successor on the embedded store stops (only one process
/// may hold the store's file) and restarts when that successor went away.
pub struct AdminServer {
    api: Arc<AdminApi>,
    /// A duplicate of the listening socket, kept for restarts (the socket itself lives in the
    /// process's listener set).
    listener: TcpListener,
    limits: ConnLimits,
    rt: tokio::runtime::Handle,
    running: Mutex<Option<Running>>,
}

struct Running {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl AdminServer {
    pub fn new(
        api: Arc<AdminApi>,
        listener: TcpListener,
        limits: ConnLimits,
        rt: tokio::runtime::Handle,
    ) -> AdminServer {
        AdminServer {
            api,
            listener,
            limits,
            rt,
            running: Mutex::new(None),
        }
    }

    pub fn api(&self) -> &Arc<AdminApi> {
        &self.api
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Running>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts serving (no-op when it already does).
    pub fn start(&self) -> io::Result<()> {
        let mut running = self.lock();
        if running.is_some() {
            return Ok(());
        }
        let listener = self.listener.try_clone()?;
        let (stop, rx) = watch::channel(false);
        let (api, limits) = (self.api.clone(), self.limits);
        let task = self.rt.spawn(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => ferrisix_admin::serve(l, api, limits, rx).await,
                Err(e) => tracing::error!(error = %e, "Admin API: cannot use its listener"),
            }
        });
        *running = Some(Running { stop, task });
        Ok(())
    }

    /// Stops accepting and waits for the Admin API's connections to drain (at most its
    /// shutdown grace). Blocking: call it off the runtime.
    pub fn stop(&self) {
        let Some(running) = self.lock().take() else {
            return;
        };
        let _ = running.stop.send(true);
        let _ = self.rt.block_on(running.task);
    }
}

/// This process as a predecessor (see [`ferrisix_net::handover`]).
pub struct Host {
    pub admin: Option<Arc<AdminServer>>,
    pub embedded: Option<Arc<EmbeddedStore>>,
    pub events: mpsc::UnboundedSender<Event>,
    /// Set once this process is stopping: a successor that goes away then does not bring the
    /// Admin API back.
    pub stopping: Arc<AtomicBool>,
}

impl Predecessor for Host {
    fn release(&self) -> Result<(), String> {
        // With etcd both processes may serve the Admin API at once; only the embedded store's
        // file is exclusive.
        let Some(store) = &self.embedded else {
            return Ok(());
        };
        if let Some(admin) = &self.admin {
            admin.stop();
        }
        store.suspend();
        tracing::info!("Admin API stopped and embedded store closed for the successor");
        Ok(())
    }

    fn resume(&self) {
        let Some(store) = &self.embedded else { return };
        if let Err(e) = store.resume() {
            tracing::error!("embedded store: cannot reopen after the successor went away: {e}");
            return;
        }
        if self.stopping.load(Ordering::Acquire) {
            return;
        }
        if let Some(admin) = &self.admin {
            if let Err(e) = admin.start() {
                tracing::error!(error = %e, "Admin API: cannot restart");
            }
        }
        tracing::info!("the successor went away: Admin API and embedded store back");
    }

    fn stop(&self) {
        let _ = self.events.send(Event::HandedOver);
    }
}

/// The pid file, removed on drop while it still names this process (a successor rewrites it).
pub struct PidFile {
    path: PathBuf,
}

impl PidFile {
    pub fn write(path: &Path) -> io::Result<PidFile> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        // Written beside and renamed over, so a reader never sees a half-written pid.
        let tmp = path.with_extension(format!("pid.{}", std::process::id()));
        std::fs::write(&tmp, format!("{}\n", std::process::id()))?;
        std::fs::rename(&tmp, path)?;
        Ok(PidFile {
            path: path.to_owned(),
        })
    }
}

impl PidFile {
    /// A successor took the sockets over: the file is its to write and remove. Checking
    /// "is it still mine" before removing it would race the successor's rename.
    pub fn hand_over(mut self) {
        self.path = PathBuf::new();
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        if self.path.as_os_str().is_empty() {
            return;
        }
        let mine = std::fs::read_to_string(&self.path)
            .is_ok_and(|s| s.trim() == std::process::id().to_string());
        if mine {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// SIGUSR2: runs the binary at this process's path again, with its arguments; the new process
/// takes the listening sockets over through the hand-over socket and stops this one. The
/// path is `argv[0]` (the file a package upgrade replaced), not `/proc/self/exe` (the old,
/// deleted inode).
pub fn spawn_successor() {
    let mut args = std::env::args_os();
    let argv0 = args.next().map(PathBuf::from);
    let exe = match argv0 {
        Some(p) if p.components().count() > 1 => p,
        _ => match std::env::current_exe() {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "SIGUSR2: cannot find this binary's path");
                return;
            }
        },
    };
    match std::process::Command::new(&exe).args(args).spawn() {
        Ok(mut child) => {
            tracing::info!(pid = child.id(), binary = %exe.display(), "SIGUSR2: successor started");
            // Reaped here if it fails before taking over (it outlives this process otherwise).
            let _ = std::thread::Builder::new()
                .name("ferrisix-successor".into())
                .spawn(move || {
                    if let Ok(status) = child.wait() {
                        if !status.success() {
                            tracing::error!(%status, "the successor exited; still serving");
                        }
                    }
                });
        }
        Err(e) => {
            tracing::error!(binary = %exe.display(), error = %e, "SIGUSR2: cannot start a successor")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pid_file_is_removed_only_while_it_is_ours() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/ferrisix.pid");
        let pid = PidFile::write(&path).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap().trim(),
            std::process::id().to_string()
        );
        drop(pid);
        assert!(!path.exists());
        let pid = PidFile::write(&path).unwrap();
        // A successor rewrote it.
        std::fs::write(&path, "1\n").unwrap();
        drop(pid);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "1\n");
        // Handed over before the successor wrote its own: left for the successor.
        let pid = PidFile::write(&path).unwrap();
        pid.hand_over();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap().trim(),
            std::process::id().to_string()
        );
    }
}
