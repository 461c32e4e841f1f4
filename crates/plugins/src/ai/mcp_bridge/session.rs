//! mcp-bridge's sessions: the process of each, the task that relays between it and the SSE
//! stream, and the gateway's table of open sessions that the message endpoint hands client
//! messages through (APISIX's `mcp-session` shared dictionary).

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ferrisix_plugin_api::{BodyError, Executor, PluginServices, SharedState, Shutdown};
use hyper::body::{Body, Frame};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// APISIX's server pings its client this often (`ngx.sleep(30)` in its ping loop).
const PING_EVERY: Duration = Duration::from_secs(30);
/// How long a process gets to exit once its stdin is closed before it is killed: ngx.pipe's
/// default `wait_timeout`, which APISIX's `proc:wait()` runs under.
const EXIT_GRACE: Duration = Duration::from_secs(10);
/// How long one write of a message to the process's stdin may take: ngx.pipe's default
/// `write_timeout`; a message that cannot be written in that time is dropped (and logged).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Client messages waiting for the process to read them, per session. APISIX's queue is
/// bounded by its shared dictionary's memory; a message past this is answered 500, as a full
/// dictionary is there.
const INBOX: usize = 1024;
/// Events waiting for the client to read them: the relay stops reading the process's output
/// while the client is this far behind, so a slow client slows the process, not the memory.
const OUTBOX: usize = 64;
/// The longest line read from the process's stdout or stderr: a process writing more without
/// a newline is ended (its session with it) rather than buffered without bound.
const MAX_LINE: usize = 16 << 20;

/// The sessions open on one gateway, by id: what a message endpoint hands messages through.
/// Sessions are made by one request (the SSE stream) and found by others (the messages), so
/// this is the one table they share; it is touched once per session and once per message,
/// never on requests of routes without the plugin.
#[derive(Default)]
pub struct Sessions {
    inboxes: Mutex<HashMap<String, mpsc::Sender<Bytes>>>,
}

impl SharedState for Sessions {
    fn create(_: &PluginServices) -> Self {
        Sessions::default()
    }
}

impl Sessions {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, mpsc::Sender<Bytes>>> {
        // Plain bookkeeping: usable after a panic elsewhere.
        self.inboxes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands `message` to session `id`'s process. A session that is not open (ended, never
    /// existed, or no id at all) takes it without a word, as APISIX's queue does; only a
    /// session whose queue is full refuses it.
    pub fn push(&self, id: Option<&str>, message: Bytes) -> Result<(), String> {
        let Some(id) = id else {
            return Ok(());
        };
        let Some(inbox) = self.lock().get(id).cloned() else {
            tracing::debug!("mcp-bridge: message for session {id}, which is not open");
            return Ok(());
        };
        match inbox.try_send(message) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => {
                Err(format!("the queue of session {id} is full"))
            }
            // Ended between the lookup and now: as for a session that is not open.
            Err(mpsc::error::TrySendError::Closed(_)) => Ok(()),
        }
    }

    fn insert(&self, id: String, inbox: mpsc::Sender<Bytes>) {
        self.lock().insert(id, inbox);
    }

    fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().len()
    }
}

/// How a route's sessions start their process.
pub struct Bridge {
    pub command: String,
    pub args: Vec<String>,
    pub executor: Executor,
    pub shutdown: Shutdown,
}

impl Bridge {
    /// Starts a session: the process, its relay, and the stream the client reads (whose
    /// first event announces the message endpoint). Fails when the process cannot start.
    pub fn open(&self, sessions: &Arc<Sessions>, base_uri: &str) -> io::Result<SseStream> {
        let mut child = Command::new(&self.command)
            .args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Should the relay task never run its end (the runtime going away), the process
            // is still killed; the relay itself always waits for it.
            .kill_on_drop(true)
            .spawn()?;
        let id = uuid_v4();
        let (inbox_tx, inbox) = mpsc::channel(INBOX);
        let (events, rx) = mpsc::channel(OUTBOX);
        let endpoint = event(
            "endpoint",
            format!("{base_uri}/message?sessionId={id}").as_bytes(),
        );
        // Room for it: the channel is new.
        let _ = events.try_send(endpoint);
        sessions.insert(id.clone(), inbox_tx);
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let relay = Relay {
            id: id.clone(),
            events,
            inbox,
            shutdown: self.shutdown.clone(),
        };
        let sessions_for_end = sessions.clone();
        // A stopping gateway waits for its sessions' processes to be ended and reaped.
        let hold = self.shutdown.hold();
        let run = async move {
            relay.run(stdin, stdout, stderr).await;
            sessions_for_end.remove(&id);
            end_process(child, &id).await;
            drop(hold);
        };
        if let Err(e) = self.executor.spawn(run) {
            // The future (and the child, killed on drop) went with the error.
            return Err(io::Error::other(e));
        }
        Ok(SseStream { rx })
    }
}

/// Closes the process's stdin (done by the relay dropping it), waits a while for it to exit,
/// then kills it; it is always waited for, so it never stays a zombie.
async fn end_process(mut child: Child, id: &str) {
    match tokio::time::timeout(EXIT_GRACE, child.wait()).await {
        Ok(Ok(status)) => tracing::info!("mcp-bridge: session {id}: process exited, {status}"),
        Ok(Err(e)) => tracing::warn!("mcp-bridge: session {id}: waiting for the process: {e}"),
        Err(_) => {
            tracing::info!("mcp-bridge: session {id}: process still running, killing it");
            if let Err(e) = child.kill().await {
                tracing::warn!("mcp-bridge: session {id}: killing the process: {e}");
            }
        }
    }
}

/// One SSE event as APISIX's transport writes it.
fn event(kind: &str, data: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(data.len() + kind.len() + 16);
    b.extend_from_slice(b"event: ");
    b.extend_from_slice(kind.as_bytes());
    b.extend_from_slice(b"\ndata: ");
    b.extend_from_slice(data);
    b.extend_from_slice(b"\n\n");
    b.freeze()
}

/// A line of the process's stderr as the notification APISIX sends it in (APISIX splices the
/// text in unescaped; here it is JSON-escaped, so a quote in it keeps the message valid).
fn stderr_notification(line: &[u8]) -> Bytes {
    let text = String::from_utf8_lossy(line);
    let content = serde_json::Value::String(text.into_owned()).to_string();
    event(
        "message",
        format!(
            "{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/stderr\",\"params\":{{\"content\":{content}}}}}"
        )
        .as_bytes(),
    )
}

fn ping(n: u64) -> Bytes {
    event(
        "message",
        format!("{{\"jsonrpc\": \"2.0\",\"method\": \"ping\",\"id\":\"ping:{n}\"}}").as_bytes(),
    )
}

/// A version 4 UUID in its usual lower-case text form (`core.id.gen_uuid_v4`).
fn uuid_v4() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "{}-{}-{}-{}-{}",
        h(0..4),
        h(4..6),
        h(6..8),
        h(8..10),
        h(10..16)
    )
}

/// One session's relay between the process and the client's stream.
struct Relay {
    id: String,
    events: mpsc::Sender<Bytes>,
    inbox: mpsc::Receiver<Bytes>,
    shutdown: Shutdown,
}

/// A line read, or why there is none.
enum Line {
    Some(Vec<u8>),
    Eof,
}

/// Reads one line (without its `\n`, and a `\r` before it), at most `MAX_LINE` bytes. Cancel
/// safe: what was read of a line stays in `buf` until the line is complete.
async fn next_line<R: AsyncBufRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> io::Result<Line> {
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            if buf.is_empty() {
                return Ok(Line::Eof);
            }
            // The last line, without a newline.
            return Ok(Line::Some(std::mem::take(buf)));
        }
        if let Some(i) = avail.iter().position(|&c| c == b'\n') {
            buf.extend_from_slice(&avail[..i]);
            r.consume(i + 1);
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
            return Ok(Line::Some(std::mem::take(buf)));
        }
        let n = avail.len();
        buf.extend_from_slice(avail);
        r.consume(n);
        if buf.len() > MAX_LINE {
            return Err(io::Error::other(format!(
                "a line longer than {MAX_LINE} bytes"
            )));
        }
    }
}

/// Writes one client message to the process, as one line.
async fn write_message(stdin: &mut ChildStdin, message: &[u8]) -> io::Result<()> {
    let mut line = Vec::with_capacity(message.len() + 1);
    line.extend_from_slice(message);
    line.push(b'\n');
    match tokio::time::timeout(WRITE_TIMEOUT, stdin.write_all(&line)).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "timeout")),
    }
}

impl Relay {
    /// Relays until the client goes away, the process closes its output, or the gateway shuts
    /// down. Dropping the process's stdin on return is what asks it to exit.
    async fn run(
        mut self,
        stdin: Option<ChildStdin>,
        stdout: Option<tokio::process::ChildStdout>,
        stderr: Option<tokio::process::ChildStderr>,
    ) {
        let (Some(mut stdin), Some(stdout), Some(stderr)) = (stdin, stdout, stderr) else {
            return;
        };
        let mut stdout = BufReader::new(stdout);
        let mut stderr = BufReader::new(stderr);
        let (mut out_buf, mut err_buf) = (Vec::new(), Vec::new());
        let (mut out_open, mut err_open, mut stdin_open) = (true, true, true);
        let mut pings = tokio::time::interval(PING_EVERY);
        let mut next_ping = 0u64;
        let shutdown = self.shutdown.clone();
        let stopping = shutdown.started();
        tokio::pin!(stopping);
        let id = self.id.clone();
        loop {
            let sent = tokio::select! {
                () = self.events.closed() => {
                    tracing::info!("mcp-bridge: session {id}: the client went away");
                    return;
                }
                () = &mut stopping => return,
                _ = pings.tick() => {
                    next_ping += 1;
                    self.events.send(ping(next_ping)).await
                }
                m = self.inbox.recv(), if stdin_open => {
                    let Some(m) = m else { return };
                    tracing::debug!("mcp-bridge: session {id}: to the process: {}",
                        String::from_utf8_lossy(&m));
                    if let Err(e) = write_message(&mut stdin, &m).await {
                        tracing::warn!("mcp-bridge: session {id}: writing to the process: {e}");
                        stdin_open = e.kind() == io::ErrorKind::TimedOut;
                    }
                    Ok(())
                }
                line = next_line(&mut stdout, &mut out_buf), if out_open => match line {
                    Ok(Line::Some(l)) => self.events.send(event("message", &l)).await,
                    Ok(Line::Eof) => { out_open = false; Ok(()) }
                    Err(e) => {
                        tracing::error!("mcp-bridge: session {id}: reading the process's stdout: {e}");
                        return;
                    }
                },
                line = next_line(&mut stderr, &mut err_buf), if err_open => match line {
                    Ok(Line::Some(l)) => self.events.send(stderr_notification(&l)).await,
                    Ok(Line::Eof) => { err_open = false; Ok(()) }
                    Err(e) => {
                        tracing::error!("mcp-bridge: session {id}: reading the process's stderr: {e}");
                        return;
                    }
                },
            };
            if sent.is_err() {
                tracing::info!("mcp-bridge: session {id}: the client went away");
                return;
            }
            if !out_open && !err_open {
                tracing::info!("mcp-bridge: session {id}: the process closed its output");
                return;
            }
        }
    }
}

/// The body of a session's SSE answer: the relay's events, as they come. Dropping it (the
/// client went away) ends the session.
pub struct SseStream {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for SseStream {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.rx.poll_recv(cx).map(|e| e.map(|b| Ok(Frame::data(b))))
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[test]
    fn events_as_apisix_writes_them() {
        assert_eq!(
            event("endpoint", b"/mcp/message?sessionId=x"),
            "event: endpoint\ndata: /mcp/message?sessionId=x\n\n"
        );
        assert_eq!(
            ping(3),
            "event: message\ndata: {\"jsonrpc\": \"2.0\",\"method\": \"ping\",\"id\":\"ping:3\"}\n\n"
        );
        assert_eq!(
            stderr_notification(b"a \"b\""),
            "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/stderr\",\
             \"params\":{\"content\":\"a \\\"b\\\"\"}}\n\n"
        );
        let id = uuid_v4();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"), "{id}");
        assert_ne!(id, uuid_v4());
    }

    #[tokio::test]
    async fn lines_split_trimmed_and_bounded() {
        let data: &[u8] = b"one\r\ntwo\n\nlast";
        let mut r = BufReader::with_capacity(2, data);
        let mut buf = Vec::new();
        let mut lines = Vec::new();
        while let Line::Some(l) = next_line(&mut r, &mut buf).await.unwrap() {
            lines.push(String::from_utf8(l).unwrap());
        }
        assert_eq!(lines, ["one", "two", "", "last"]);
        let long = vec![b'x'; MAX_LINE + 2];
        let mut r = BufReader::new(&long[..]);
        assert!(next_line(&mut r, &mut Vec::new()).await.is_err());
    }

    #[tokio::test]
    async fn unknown_sessions_take_messages_full_queues_refuse() {
        let s = Sessions::default();
        assert!(s.push(None, Bytes::from("{}")).is_ok());
        assert!(s.push(Some("nope"), Bytes::from("{}")).is_ok());
        let (tx, mut rx) = mpsc::channel(1);
        s.insert("a".into(), tx);
        s.push(Some("a"), Bytes::from("1")).unwrap();
        assert!(s.push(Some("a"), Bytes::from("2")).is_err(), "full");
        assert_eq!(rx.recv().await.unwrap(), "1");
        s.remove("a");
        assert_eq!(s.len(), 0);
    }

    /// A real process (`cat`, which echoes stdin to stdout) through a session, then the
    /// client going away: the session ends and the process is gone.
    #[tokio::test]
    async fn relays_a_process_and_ends_it_with_the_client() {
        let sessions = Arc::new(Sessions::default());
        let bridge = Bridge {
            command: "cat".into(),
            args: Vec::new(),
            executor: Executor::current(),
            shutdown: Shutdown::new(),
        };
        let mut stream = bridge.open(&sessions, "/base").unwrap();
        let first = stream.frame().await.unwrap().unwrap().into_data().unwrap();
        let first = String::from_utf8(first.to_vec()).unwrap();
        let id = first
            .strip_prefix("event: endpoint\ndata: /base/message?sessionId=")
            .and_then(|s| s.strip_suffix("\n\n"))
            .unwrap()
            .to_owned();
        let second = stream.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(second, ping(1));
        sessions
            .push(Some(&id), Bytes::from("{\"jsonrpc\":\"2.0\",\"id\":1}"))
            .unwrap();
        let echoed = stream.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(
            echoed,
            "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1}\n\n"
        );
        drop(stream);
        // The relay notices, closes cat's stdin, waits for it and removes the session.
        for _ in 0..500 {
            if sessions.len() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(sessions.len(), 0);
    }

    #[test]
    fn a_command_that_does_not_exist_fails_to_open() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let sessions = Arc::new(Sessions::default());
            let bridge = Bridge {
                command: "/nonexistent/mcp-server".into(),
                args: Vec::new(),
                executor: Executor::current(),
                shutdown: Shutdown::new(),
            };
            assert!(bridge.open(&sessions, "").is_err());
            assert_eq!(sessions.len(), 0);
        });
    }
}
