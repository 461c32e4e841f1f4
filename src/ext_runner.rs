//! The external plugin runner of `ext-plugin.cmd`, supervised as APISIX's privileged agent
//! does: started with `APISIX_LISTEN_ADDRESS` (the socket it must listen on, `unix:<path>`)
//! and `APISIX_CONF_EXPIRE_TIME` (how long a conf token lives) in its environment, its
//! stdout and stderr passed to the gateway's log line by line, started again 3 s after it
//! exits (the conf tokens it handed out are forgotten at once), and stopped with SIGTERM on
//! shutdown, then SIGKILL if it is still there a second later.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferrisix_plugin_api::ExtRunner;
use ferrisix_plugins::external::runner::CONF_TOKEN_TTL;

/// APISIX waits this long before starting a runner that exited.
const RESPAWN_DELAY: Duration = Duration::from_secs(3);

/// How long a runner has to end after SIGTERM.
const TERM_GRACE: Duration = Duration::from_secs(1);

#[derive(Default)]
struct State {
    stopping: bool,
    /// The running runner's pid, while it has not been reaped.
    pid: Option<u32>,
}

type Shared = Arc<(Mutex<State>, Condvar)>;

/// The supervising thread; [`Supervisor::stop`] ends the runner and the thread.
pub struct Supervisor {
    shared: Shared,
    thread: Option<JoinHandle<()>>,
}

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, State> {
    shared.0.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts `cmd` and keeps it running until [`Supervisor::stop`].
pub fn start(cmd: Vec<String>, runner: Arc<ExtRunner>) -> Result<Supervisor, String> {
    if cmd.is_empty() {
        return Err("ext-plugin.cmd is empty".to_owned());
    }
    let shared: Shared = Arc::default();
    let s = shared.clone();
    let thread = std::thread::Builder::new()
        .name("ferrisix-ext-runner".into())
        .spawn(move || supervise(&cmd, &runner, &s))
        .map_err(|e| format!("cannot start the runner's supervisor: {e}"))?;
    Ok(Supervisor {
        shared,
        thread: Some(thread),
    })
}

fn spawn(cmd: &[String], runner: &ExtRunner) -> std::io::Result<Child> {
    Command::new(&cmd[0])
        .args(&cmd[1..])
        .env(
            "APISIX_CONF_EXPIRE_TIME",
            CONF_TOKEN_TTL.as_secs().to_string(),
        )
        .env(
            "APISIX_LISTEN_ADDRESS",
            format!("unix:{}", runner.path().display()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
}

/// Passes what the runner writes to the log, as APISIX logs its output (at `warn`).
fn relay(out: impl Read + Send + 'static, stream: &'static str) {
    let _ = std::thread::Builder::new()
        .name("ferrisix-ext-runner-log".into())
        .spawn(move || {
            let mut reader = BufReader::new(out);
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&line);
                        tracing::warn!(target: "ext-plugin", stream, "{}", text.trim_end());
                    }
                }
            }
        });
}

fn supervise(cmd: &[String], runner: &ExtRunner, shared: &Shared) {
    loop {
        match spawn(cmd, runner) {
            Ok(mut child) => {
                let pid = child.id();
                tracing::info!(pid, ?cmd, "ext-plugin runner started");
                {
                    let mut st = lock(shared);
                    if st.stopping {
                        drop(st);
                        terminate(pid);
                        let _ = child.wait();
                        return;
                    }
                    st.pid = Some(pid);
                }
                if let Some(out) = child.stdout.take() {
                    relay(out, "stdout");
                }
                if let Some(err) = child.stderr.take() {
                    relay(err, "stderr");
                }
                let status = child.wait();
                let stopping = {
                    let mut st = lock(shared);
                    st.pid = None;
                    shared.1.notify_all();
                    st.stopping
                };
                if stopping {
                    return;
                }
                match status {
                    Ok(s) => tracing::warn!(status = %s, "ext-plugin runner exited"),
                    Err(e) => tracing::warn!(error = %e, "ext-plugin runner: cannot wait on it"),
                }
                // Its conf tokens went with it.
                runner.flush_tokens();
            }
            Err(e) => tracing::error!(?cmd, error = %e, "failed to start the ext-plugin runner"),
        }
        tracing::warn!(?cmd, "respawn runner 3 seconds later");
        let deadline = Instant::now() + RESPAWN_DELAY;
        let mut st = lock(shared);
        while !st.stopping {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = shared
                .1
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if st.stopping {
            return;
        }
        drop(st);
        tracing::warn!("respawning new runner...");
    }
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

fn terminate(pid: u32) {
    signal(pid, rustix::process::Signal::TERM);
}

impl Supervisor {
    /// Stops the runner (SIGTERM, SIGKILL after a second) and the supervising thread.
    pub fn stop(mut self) {
        let mut st = lock(&self.shared);
        st.stopping = true;
        self.shared.1.notify_all();
        if let Some(pid) = st.pid {
            tracing::info!(pid, "terminate runner with SIGTERM");
            // The pid is still the runner's: it is cleared, under this lock, only once reaped.
            terminate(pid);
            let deadline = Instant::now() + TERM_GRACE;
            while st.pid.is_some() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                st = self
                    .shared
                    .1
                    .wait_timeout(st, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            if let Some(pid) = st.pid {
                tracing::warn!(pid, "the runner outlived SIGTERM; killed");
                signal(pid, rustix::process::Signal::KILL);
            }
        }
        drop(st);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
