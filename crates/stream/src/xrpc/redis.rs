//! A redis xRPC session (APISIX's `apisix/stream/xrpc/runner.lua` with the redis protocol).
//!
//! Two halves run side by side. The client half reads commands (`resp`), waits each
//! matching fault's delay, connects to a node of the route's upstream once the first bytes
//! are to go, and passes the commands on; it hands each command to the upstream half in
//! order. The upstream half passes the upstream's bytes back to the client as they come and
//! reads them as replies, each ending the oldest command (a pub/sub message ends none),
//! whose loggers and metrics then run.
//!
//! The session ends on malformed input from either side (the client's connection is then
//! closed without an answer to what was not answered), when the upstream closes, or on the
//! idle timeout. A client that closes its side first still gets the replies to what it
//! sent. Commands that got no reply are logged and counted at the end ("RPC is not
//! finished").

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ferrisix_proxy::snapshot::CompiledUpstream;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, oneshot};

use super::resp::{Command, Reply, ReplyScanner, ReplySink, RequestParser};
use super::XrpcRoute;
use crate::connect::{self, Upstream};
use crate::vars::ConnVars;

/// Bytes read per socket read.
const CHUNK: usize = 16 * 1024;
/// Bytes of a long command passed on before the command is whole.
const FLUSH_AT: usize = 64 * 1024;

/// A command sent upstream, waiting for its reply.
struct InFlight {
    cmd: Command,
    /// When it was read (APISIX starts `rpc_time` there, before the fault delay).
    started: Instant,
}

/// Why the client half stopped.
enum ClientEnd {
    /// The client closed its side.
    Closed,
    /// Malformed input, a read error, the idle timeout, or no upstream.
    Failed,
}

/// What both halves share.
struct Shared {
    start: Instant,
    /// Milliseconds from `start` of the last byte either way.
    last: AtomicU64,
    in_flight: AtomicUsize,
    client_closed: AtomicBool,
    from_client: AtomicU64,
    to_client: AtomicU64,
}

impl Shared {
    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(ms.saturating_sub(self.last.load(Ordering::Relaxed)))
    }
}

/// Reads with the session's idle timeout: `None` at the end (EOF, an error, or no byte
/// either way for `idle`).
async fn read_some<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut [u8],
    shared: &Shared,
    idle: Duration,
) -> Option<usize> {
    loop {
        match tokio::time::timeout(idle, r.read(buf)).await {
            Err(_) if shared.idle_for() < idle => continue,
            Err(_) | Ok(Err(_)) | Ok(Ok(0)) => return None,
            Ok(Ok(n)) => {
                shared.touch();
                return Some(n);
            }
        }
    }
}

/// Serves the session of a route whose protocol is redis. `preread` holds bytes already
/// read from the client.
pub async fn serve<C>(
    client: &mut C,
    vars: &mut ConnVars,
    route: &XrpcRoute,
    up: &CompiledUpstream,
    idle: Duration,
    preread: Vec<u8>,
) where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let shared = Shared {
        start: Instant::now(),
        last: AtomicU64::new(0),
        in_flight: AtomicUsize::new(0),
        client_closed: AtomicBool::new(false),
        from_client: AtomicU64::new(preread.len() as u64),
        to_client: AtomicU64::new(0),
    };
    let (tx_cmd, mut rx_cmd) = mpsc::unbounded_channel::<InFlight>();
    let (tx_up, rx_up) = oneshot::channel::<(ReadHalf<Upstream>, ConnVars)>();
    let mut waiting: VecDeque<InFlight> = VecDeque::new();
    let mut series = super::SessionSeries::new();
    let mut conn_vars = vars.clone();
    let (mut cr, mut cw) = tokio::io::split(client);
    let mut upstream_writer: Option<WriteHalf<Upstream>> = None;
    {
        let down = client_half(
            &mut cr,
            &mut conn_vars,
            &mut upstream_writer,
            route,
            up,
            idle,
            preread,
            &shared,
            tx_cmd,
            tx_up,
        );
        let upward = upstream_half(
            rx_up,
            &mut rx_cmd,
            &mut waiting,
            &mut series,
            &mut cw,
            route,
            idle,
            &shared,
        );
        tokio::pin!(down);
        tokio::pin!(upward);
        tokio::select! {
            end = &mut down => {
                if let ClientEnd::Closed = end {
                    shared.client_closed.store(true, Ordering::Relaxed);
                    if shared.in_flight.load(Ordering::Relaxed) > 0 {
                        // The replies to what the client sent still go back to it.
                        (&mut upward).await;
                    }
                }
            }
            () = &mut upward => {}
        }
    }
    if let Some(mut w) = upstream_writer {
        let _ = tokio::time::timeout(Duration::from_secs(1), w.shutdown()).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), cw.shutdown()).await;
    vars.upstream_addr = conn_vars.upstream_addr;
    vars.bytes_received += shared.from_client.load(Ordering::Relaxed);
    vars.bytes_sent += shared.to_client.load(Ordering::Relaxed);
    // What got no reply.
    while let Ok(c) = rx_cmd.try_recv() {
        waiting.push_back(c);
    }
    for c in waiting {
        tracing::info!(stream_route = %route.route_id, cmd = %c.cmd.cmd, "RPC is not finished");
        route.finish(&c.cmd, c.started.elapsed(), vars, &mut series);
    }
}

/// Reads commands from the client and passes them on; connects upstream when the first
/// bytes are to go.
#[allow(clippy::too_many_arguments)]
async fn client_half<R: AsyncRead + Unpin>(
    cr: &mut R,
    vars: &mut ConnVars,
    writer: &mut Option<WriteHalf<Upstream>>,
    route: &XrpcRoute,
    up: &CompiledUpstream,
    idle: Duration,
    mut buf: Vec<u8>,
    shared: &Shared,
    tx_cmd: mpsc::UnboundedSender<InFlight>,
    tx_up: oneshot::Sender<(ReadHalf<Upstream>, ConnVars)>,
) -> ClientEnd {
    let mut parser = RequestParser::default();
    let mut out: Vec<u8> = Vec::with_capacity(CHUNK);
    let mut chunk = vec![0u8; CHUNK];
    let mut tx_up = Some(tx_up);
    loop {
        loop {
            let (used, cmd) = match parser.parse(&buf, route.faults.as_ref()) {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(client = %vars.remote, "failed to read request: {e}");
                    return ClientEnd::Failed;
                }
            };
            out.extend_from_slice(&buf[..used]);
            buf.drain(..used);
            let Some(cmd) = cmd else {
                break;
            };
            let delay = cmd.delay;
            shared.in_flight.fetch_add(1, Ordering::Relaxed);
            let _ = tx_cmd.send(InFlight {
                cmd,
                started: Instant::now(),
            });
            if let Some(d) = delay.and_then(|d| Duration::try_from_secs_f64(d).ok()) {
                tokio::time::sleep(d).await;
            }
            if out.len() >= FLUSH_AT {
                break;
            }
        }
        if !out.is_empty() {
            if writer.is_none() {
                let Some(conn) = connect::tcp(up, vars, false).await else {
                    return ClientEnd::Failed;
                };
                let (r, w) = tokio::io::split(conn);
                *writer = Some(w);
                if let Some(tx) = tx_up.take() {
                    let _ = tx.send((r, vars.clone()));
                }
            }
            let Some(w) = writer.as_mut() else {
                return ClientEnd::Failed;
            };
            match tokio::time::timeout(idle, w.write_all(&out)).await {
                Ok(Ok(())) => shared.touch(),
                Ok(Err(e)) => {
                    tracing::error!(stream_route = %route.route_id, "failed to send to upstream: {e}");
                    return ClientEnd::Failed;
                }
                Err(_) => {
                    tracing::error!(stream_route = %route.route_id, "failed to send to upstream: timeout");
                    return ClientEnd::Failed;
                }
            }
            out.clear();
            // More complete commands may wait in `buf` (a long command was flushed early).
            if !buf.is_empty() {
                continue;
            }
        }
        match read_some(cr, &mut chunk, shared, idle).await {
            Some(n) => {
                shared.from_client.fetch_add(n as u64, Ordering::Relaxed);
                buf.extend_from_slice(&chunk[..n]);
            }
            None => return ClientEnd::Closed,
        }
    }
}

/// Matches replies to the commands waiting for them.
struct Replies<'a> {
    rx: &'a mut mpsc::UnboundedReceiver<InFlight>,
    waiting: &'a mut VecDeque<InFlight>,
    in_pub_sub: &'a mut bool,
    done: Vec<(InFlight, Instant)>,
}

impl Replies<'_> {
    /// Takes in the commands the client half has sent since.
    fn take_sent(&mut self) {
        while let Ok(c) = self.rx.try_recv() {
            if c.cmd.subscribes {
                *self.in_pub_sub = true;
            }
            self.waiting.push_back(c);
        }
    }
}

impl ReplySink for Replies<'_> {
    fn in_pub_sub(&self) -> bool {
        *self.in_pub_sub
    }

    fn reply(&mut self, reply: Reply) {
        self.take_sent();
        let ends_front = if *self.in_pub_sub && reply.pubsub {
            // A pub/sub message ends the oldest command only when it answers it
            // (`subscribe` to SUBSCRIBE ...); a published message ends none.
            let answers = self
                .waiting
                .front()
                .is_some_and(|c| reply.pubsub_type.as_deref() == Some(c.cmd.cmd.as_str()));
            if reply.left_pub_sub {
                *self.in_pub_sub = false;
            }
            answers
        } else {
            true
        };
        if ends_front {
            if let Some(c) = self.waiting.pop_front() {
                self.done.push((c, Instant::now()));
            }
        }
    }
}

/// Passes the upstream's bytes to the client and reads its replies.
#[allow(clippy::too_many_arguments)]
async fn upstream_half<W: AsyncWrite + Unpin>(
    rx_up: oneshot::Receiver<(ReadHalf<Upstream>, ConnVars)>,
    rx_cmd: &mut mpsc::UnboundedReceiver<InFlight>,
    waiting: &mut VecDeque<InFlight>,
    series: &mut super::SessionSeries,
    cw: &mut W,
    route: &XrpcRoute,
    idle: Duration,
    shared: &Shared,
) {
    let Ok((mut ur, conn)) = rx_up.await else {
        // The client half ended before connecting.
        return std::future::pending().await;
    };
    let mut scanner = ReplyScanner::default();
    let mut in_pub_sub = false;
    let mut chunk = vec![0u8; CHUNK];
    loop {
        let Some(n) = read_some(&mut ur, &mut chunk, shared, idle).await else {
            return;
        };
        let mut replies = Replies {
            rx: &mut *rx_cmd,
            waiting: &mut *waiting,
            in_pub_sub: &mut in_pub_sub,
            done: Vec::new(),
        };
        replies.take_sent();
        if let Err(e) = scanner.feed(&chunk[..n], &mut replies) {
            tracing::error!(stream_route = %route.route_id, "failed to handle upstream: {e}");
            return;
        }
        let done = std::mem::take(&mut replies.done);
        match tokio::time::timeout(idle, cw.write_all(&chunk[..n])).await {
            Ok(Ok(())) => {
                shared.to_client.fetch_add(n as u64, Ordering::Relaxed);
            }
            _ => return,
        }
        for (c, at) in done {
            shared.in_flight.fetch_sub(1, Ordering::Relaxed);
            route.finish(&c.cmd, at.duration_since(c.started), &conn, series);
        }
        if shared.client_closed.load(Ordering::Relaxed)
            && shared.in_flight.load(Ordering::Relaxed) == 0
        {
            return;
        }
    }
}
