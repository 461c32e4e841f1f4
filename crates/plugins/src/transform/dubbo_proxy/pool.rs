//! dubbo-proxy's connections to its nodes, as Tengine's `multi` upstream keeps them: calls to
//! one node share a connection until it carries `upstream_multiplex_count` calls at once,
//! then another is opened. Each connection is one task that owns the socket, writes the calls
//! handed to it with request ids of its own, and hands each answer to the call whose id it
//! bears; it answers the provider's heartbeats and closes after a minute without calls
//! (nginx's `keepalive_timeout`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};

use crate::support::dubbo::{
    self, CallError, FrameReader, Header, Timeouts, FLAG_EVENT, SERIALIZATION_HESSIAN2, STATUS_OK,
};

/// An idle connection closes after this long.
const IDLE: Duration = Duration::from_secs(60);
/// The read wait while calls are in flight (each caller bounds its own).
const BUSY: Duration = Duration::from_secs(24 * 3600);
/// The largest answer frame accepted.
const MAX_ANSWER: u32 = 64 * 1024 * 1024;

type Answer = Result<(Header, BytesMut), CallError>;

/// One call handed to a connection.
struct Job {
    body: Vec<u8>,
    timeouts: Timeouts,
    /// Told once the request is written: the read timeout counts from there.
    sent: oneshot::Sender<()>,
    reply: oneshot::Sender<Answer>,
}

/// A connection as the pool sees it.
#[derive(Clone)]
struct Conn {
    jobs: mpsc::UnboundedSender<Job>,
    in_flight: Arc<AtomicUsize>,
    alive: Arc<AtomicBool>,
}

/// The connections of every node, by node.
#[derive(Debug)]
pub struct Pools {
    multiplex: usize,
    nodes: Mutex<HashMap<SocketAddr, Vec<Conn>>>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("in_flight", &self.in_flight.load(Ordering::Relaxed))
            .finish()
    }
}

/// A call's claim on a connection, given back when the call ends however it ends.
struct Claim(Arc<AtomicUsize>);

impl Drop for Claim {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Pools {
    pub fn new(multiplex: usize) -> Pools {
        Pools {
            multiplex: multiplex.max(1),
            nodes: Mutex::new(HashMap::new()),
        }
    }

    /// A connection to `node` with room for one more call (a new one when none has), claimed.
    fn claim(&self, node: SocketAddr) -> (Conn, Claim) {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        let conns = nodes.entry(node).or_default();
        conns.retain(|c| c.alive.load(Ordering::Acquire));
        let found = conns
            .iter()
            .find(|c| c.in_flight.load(Ordering::Acquire) < self.multiplex)
            .cloned();
        let conn = match found {
            Some(c) => c,
            None => {
                let c = spawn(node);
                conns.push(c.clone());
                c
            }
        };
        conn.in_flight.fetch_add(1, Ordering::AcqRel);
        let claim = Claim(conn.in_flight.clone());
        (conn, claim)
    }

    /// One call on `node`: its body sent in a Hessian 2 request frame, the answer frame back.
    pub async fn call(&self, node: SocketAddr, timeouts: Timeouts, body: Vec<u8>) -> Answer {
        let (conn, _claim) = self.claim(node);
        let (sent_tx, sent_rx) = oneshot::channel();
        let (tx, rx) = oneshot::channel();
        let job = Job {
            body,
            timeouts,
            sent: sent_tx,
            reply: tx,
        };
        if conn.jobs.send(job).is_err() {
            return Err(CallError::Read("the connection closed".into()));
        }
        // The connection task bounds the connect and the write itself (and answers the call
        // when either fails); the wait for the answer starts once the request is written, as
        // a provider may never answer one call of many.
        let _ = sent_rx.await;
        match tokio::time::timeout(timeouts.read, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(CallError::Read("the connection closed".into())),
            Err(_) => Err(CallError::ReadTimeout),
        }
    }
}

fn spawn(node: SocketAddr) -> Conn {
    let (tx, rx) = mpsc::unbounded_channel();
    let conn = Conn {
        jobs: tx,
        in_flight: Arc::new(AtomicUsize::new(0)),
        alive: Arc::new(AtomicBool::new(true)),
    };
    let alive = conn.alive.clone();
    tokio::spawn(async move {
        run(node, rx).await;
        alive.store(false, Ordering::Release);
    });
    conn
}

/// A connection's life: connect with the first call's timeout, then write calls and route
/// answers until the provider closes, a write fails, or it idles.
async fn run(node: SocketAddr, mut jobs: mpsc::UnboundedReceiver<Job>) {
    let Some(first) = jobs.recv().await else {
        return;
    };
    let mut stream = match dubbo::connect(node, first.timeouts.connect).await {
        Ok(s) => s,
        Err(e) => {
            let msg = e.to_string();
            let _ = first.reply.send(Err(CallError::Connect(msg.clone())));
            jobs.close();
            while let Some(j) = jobs.recv().await {
                let _ = j.reply.send(Err(CallError::Connect(msg.clone())));
            }
            return;
        }
    };
    let (mut read, mut write) = stream.split();
    let mut reader = FrameReader::new();
    let mut pending: HashMap<u64, oneshot::Sender<Answer>> = HashMap::new();
    let mut next_id: u64 = 0;
    let mut job = Some(first);
    let failure = loop {
        if let Some(j) = job.take() {
            // Calls whose callers gave up are forgotten.
            pending.retain(|_, r| !r.is_closed());
            next_id = next_id.wrapping_add(1);
            let frame = dubbo::frame(SERIALIZATION_HESSIAN2, next_id, &j.body);
            let sent = tokio::time::timeout(j.timeouts.send, write.write_all(&frame)).await;
            match sent {
                Ok(Ok(())) => {
                    pending.insert(next_id, j.reply);
                    let _ = j.sent.send(());
                }
                Ok(Err(e)) => {
                    let _ = j.reply.send(Err(CallError::Send(e.to_string())));
                    break format!("send failed: {e}");
                }
                Err(_) => {
                    let _ = j.reply.send(Err(CallError::Send("timed out".into())));
                    break "send timed out".to_owned();
                }
            }
        }
        // Calls in flight are bounded by their callers' timeouts, not here.
        let idle = if pending.is_empty() { IDLE } else { BUSY };
        tokio::select! {
            j = jobs.recv() => match j {
                Some(j) => job = Some(j),
                None => break String::new(),
            },
            frame = reader.next(&mut read, idle, MAX_ANSWER) => match frame {
                Ok((h, body)) if h.is_request() => {
                    if h.is_event() {
                        // A heartbeat: answered with a null event of the same id.
                        let mut resp = Header {
                            flag: FLAG_EVENT | h.serialization(),
                            status: STATUS_OK,
                            id: h.id,
                            body_len: 1,
                        }
                        .encode()
                        .to_vec();
                        resp.push(b'N');
                        if write.write_all(&resp).await.is_err() {
                            break "heartbeat answer failed".to_owned();
                        }
                    }
                    drop(body);
                }
                Ok((h, _)) if h.is_event() => {}
                Ok((h, body)) => {
                    if let Some(reply) = pending.remove(&h.id) {
                        let _ = reply.send(Ok((h, body)));
                    }
                }
                Err(CallError::ReadTimeout) if pending.is_empty() => break String::new(),
                Err(CallError::ReadTimeout) => {}
                Err(e) => break e.to_string(),
            },
        }
    };
    jobs.close();
    let msg = if failure.is_empty() {
        "upstream prematurely closed connection".to_owned()
    } else {
        failure
    };
    for (_, reply) in pending.drain() {
        let _ = reply.send(Err(CallError::Read(msg.clone())));
    }
    while let Ok(j) = jobs.try_recv() {
        let _ = j.reply.send(Err(CallError::Read(msg.clone())));
    }
}
