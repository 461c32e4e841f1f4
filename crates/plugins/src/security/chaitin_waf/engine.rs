//! One exchange with a SafeLine detection engine, and the kept-alive connections to it.
//!
//! The connections an exchange leaves usable wait in a [`Pool`] per engine node, as
//! lua-resty-t1k's cosocket pool (`keepalive_size` of them at most, each closed once it has
//! been idle `keepalive_timeout`). The pool is a fixed row of slots claimed by compare-and-swap,
//! so requests take and return connections without a lock. Errors read as lua-resty-t1k's,
//! with nginx's socket words (`timeout`, `closed`, `connection refused`).

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use bytes::BytesMut;
use ferrisix_plugin_api::Retain;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use super::t1k::{Answer, DecodeError, Decoder, Message, Want};

/// Where an engine listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A host name or address (IPv6 without its brackets) and a port.
    Tcp { host: String, port: u16 },
    /// A Unix socket path (the node's host was `unix:<path>`).
    Unix(String),
}

impl Target {
    /// The node `host`/`port` of the metadata, as lua-resty-t1k reads it: a host starting with
    /// `unix:` is a socket path and its port is ignored.
    pub fn new(host: &str, port: u16) -> Target {
        match host.strip_prefix("unix:") {
            Some(path) => Target::Unix(path.to_owned()),
            None => Target::Tcp {
                host: host
                    .strip_prefix('[')
                    .and_then(|h| h.strip_suffix(']'))
                    .unwrap_or(host)
                    .to_owned(),
                port,
            },
        }
    }
}

/// A connection to an engine.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    async fn write_all(&mut self, b: &[u8]) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.write_all(b).await,
            Stream::Unix(s) => s.write_all(b).await,
        }
    }

    async fn read_buf(&mut self, b: &mut BytesMut) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read_buf(b).await,
            Stream::Unix(s) => s.read_buf(b).await,
        }
    }

    /// Whether an idle connection is still good: the engine has neither closed it nor sent
    /// anything on it since the last answer.
    fn idle_and_open(&self) -> bool {
        let mut probe = [0u8; 1];
        let r = match self {
            Stream::Tcp(s) => s.try_read(&mut probe),
            Stream::Unix(s) => s.try_read(&mut probe),
        };
        matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

/// nginx's words for a socket error.
fn words(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".into(),
        io::ErrorKind::ConnectionReset => "connection reset by peer".into(),
        io::ErrorKind::NotFound => "no such file or directory".into(),
        io::ErrorKind::PermissionDenied => "permission denied".into(),
        io::ErrorKind::BrokenPipe => "broken pipe".into(),
        io::ErrorKind::UnexpectedEof => "closed".into(),
        _ => e.to_string(),
    }
}

/// The socket timeouts (`connect_timeout`, `send_timeout`, `read_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub connect: Duration,
    pub send: Duration,
    pub read: Duration,
}

async fn connect(target: &Target, limit: Duration) -> Result<Stream, String> {
    let fut = async {
        match target {
            Target::Unix(path) => UnixStream::connect(path)
                .await
                .map(Stream::Unix)
                .map_err(|e| words(&e)),
            Target::Tcp { host, port } => {
                let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), *port))
                    .await
                    .map_err(|_| format!("{host} could not be resolved"))?
                    .collect();
                let mut last = format!("{host} could not be resolved");
                for a in addrs {
                    match TcpStream::connect(a).await {
                        Ok(s) => {
                            // Small sections go out at once, as lua-resty-t1k sets tcp-nodelay.
                            let _ = s.set_nodelay(true);
                            return Ok(Stream::Tcp(s));
                        }
                        Err(e) => last = words(&e),
                    }
                }
                Err(last)
            }
        }
    };
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err("timeout".into()),
    }
}

/// Why an exchange on a connection failed, and whether the connection may be blamed (a kept
/// connection the engine closed meanwhile is worth one retry on a fresh one).
struct Failed {
    msg: String,
    stale: bool,
}

async fn talk(
    stream: &mut Stream,
    server: &str,
    msg: &Message,
    t: &Timeouts,
) -> Result<(Answer, bool), Failed> {
    let mut start = 0;
    for &(end, tag) in &msg.sections {
        let part = &msg.bytes[start..end];
        start = end;
        let r = tokio::time::timeout(t.send, stream.write_all(part)).await;
        let err = match r {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => (words(&e), true),
            Err(_) => ("timeout".to_owned(), false),
        };
        return Err(Failed {
            msg: format!(
                "failed to send 0x{tag:02X} data to t1k server {server}: {}",
                err.0
            ),
            stale: err.1,
        });
    }
    let mut decoder = Decoder::default();
    let mut buf = BytesMut::with_capacity(512);
    let mut received = false;
    loop {
        match decoder.feed(&mut buf) {
            Ok(Some(answer)) => return Ok((answer, buf.is_empty())),
            Ok(None) => {}
            Err(DecodeError::NotFirst) => {
                return Err(Failed {
                    msg: format!("first packet is not MASK_FIRST from t1k server {server}"),
                    stale: false,
                })
            }
            Err(DecodeError::TooLong(n)) => {
                return Err(Failed {
                    msg: format!("packet of {n} bytes from t1k server {server} is too long"),
                    stale: false,
                })
            }
        }
        let what = match decoder.wants() {
            Want::Header => "info packet",
            Want::Data => "data",
        };
        let err = match tokio::time::timeout(t.read, stream.read_buf(&mut buf)).await {
            Ok(Ok(0)) => ("closed".to_owned(), !received),
            Ok(Ok(_)) => {
                received = true;
                continue;
            }
            Ok(Err(e)) => (words(&e), !received),
            Err(_) => ("timeout".to_owned(), false),
        };
        return Err(Failed {
            msg: format!(
                "failed to receive {what} from t1k server {server}: {}",
                err.0
            ),
            stale: err.1,
        });
    }
}

/// Sends `msg` to the engine at `target` (`server` names it in errors) and reads its answer,
/// on a kept connection from `pool` when one is idle, else on a new one. A connection that
/// answered cleanly goes back to the pool for `keepalive`.
pub async fn exchange(
    pool: &Pool,
    target: &Target,
    server: &str,
    msg: &Message,
    t: &Timeouts,
    keepalive: Option<Duration>,
) -> Result<Answer, String> {
    if let Some(mut stream) = pool.take() {
        match talk(&mut stream, server, msg, t).await {
            Ok((answer, clean)) => {
                if clean {
                    pool.put(stream, keepalive);
                }
                return Ok(answer);
            }
            // The engine closed the kept connection before it saw this request: try a new
            // one, as a cosocket pool would not have kept a closed connection.
            Err(f) if f.stale => {}
            Err(f) => return Err(f.msg),
        }
    }
    let mut stream = connect(target, t.connect).await.map_err(|e| {
        format!("failed to get socket: failed to connect to t1k server {server}: {e}")
    })?;
    match talk(&mut stream, server, msg, t).await {
        Ok((answer, clean)) => {
            if clean {
                pool.put(stream, keepalive);
            }
            Ok(answer)
        }
        Err(f) => Err(f.msg),
    }
}

const EMPTY: u8 = 0;
const BUSY: u8 = 1;
const FULL: u8 = 2;

struct Idle {
    stream: Stream,
    /// `None`: kept until the engine closes it.
    until: Option<Instant>,
}

struct Slot {
    state: AtomicU8,
    idle: ArcSwapOption<Idle>,
}

/// The idle connections to one engine node. A slot is claimed (`EMPTY`/`FULL` to `BUSY`) by
/// compare-and-swap before its connection is stored or taken, so one request at a time owns
/// it; the cell is only ever swapped, never read in place.
pub struct Pool {
    slots: Box<[Slot]>,
}

impl Retain for Pool {}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pool({} slots)", self.slots.len())
    }
}

impl Pool {
    /// A pool keeping at most `size` idle connections (none for 0).
    pub fn new(size: usize) -> Pool {
        Pool {
            slots: (0..size)
                .map(|_| Slot {
                    state: AtomicU8::new(EMPTY),
                    idle: ArcSwapOption::empty(),
                })
                .collect(),
        }
    }

    /// An idle connection still open and within its idle time; expired or closed ones met on
    /// the way are closed.
    pub fn take(&self) -> Option<Stream> {
        let now = Instant::now();
        for slot in self.slots.iter() {
            if slot
                .state
                .compare_exchange(FULL, BUSY, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            let idle = slot.idle.swap(None);
            slot.state.store(EMPTY, Ordering::Release);
            let Some(idle) = idle.and_then(|a| Arc::try_unwrap(a).ok()) else {
                continue;
            };
            if idle.until.is_some_and(|u| u <= now) || !idle.stream.idle_and_open() {
                continue;
            }
            return Some(idle.stream);
        }
        None
    }

    /// Keeps `stream` for `keepalive` (`None`: until the engine closes it); closes it when
    /// every slot is taken.
    pub fn put(&self, stream: Stream, keepalive: Option<Duration>) {
        let until = keepalive.map(|k| Instant::now() + k);
        for slot in self.slots.iter() {
            if slot
                .state
                .compare_exchange(EMPTY, BUSY, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                slot.idle.store(Some(Arc::new(Idle { stream, until })));
                slot.state.store(FULL, Ordering::Release);
                return;
            }
        }
    }

    /// How many connections wait in the pool.
    #[cfg(test)]
    pub fn idle(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.state.load(Ordering::Relaxed) == FULL)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use tokio::net::TcpListener;

    use super::super::t1k::encode_request;
    use super::*;

    const T: Timeouts = Timeouts {
        connect: Duration::from_secs(5),
        send: Duration::from_secs(5),
        read: Duration::from_millis(300),
    };

    fn pass_answer() -> Vec<u8> {
        vec![0xc1, 1, 0, 0, 0, b'.']
    }

    /// An engine that answers each message on a connection with `answer`, `times` times per
    /// connection, then closes it; counts the connections.
    async fn engine(
        answer: Vec<u8>,
        times: usize,
    ) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let conns = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let c = conns.clone();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                c.fetch_add(1, Ordering::SeqCst);
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    for _ in 0..times {
                        // One message: read until the version section (tag 0xa0) is in.
                        let mut got = Vec::new();
                        while !got.windows(8).any(|w| w == b"Proto:3\n") {
                            let n = s.read(&mut buf).await.unwrap_or(0);
                            if n == 0 {
                                return;
                            }
                            got.extend_from_slice(&buf[..n]);
                        }
                        if answer.is_empty() {
                            // Silent: holds the connection past the read timeout.
                            tokio::time::sleep(Duration::from_secs(5)).await;
                        }
                        s.write_all(&answer).await.unwrap();
                    }
                });
            }
        });
        (addr, conns)
    }

    fn target(addr: SocketAddr) -> Target {
        Target::new(&addr.ip().to_string(), addr.port())
    }

    #[tokio::test]
    async fn keeps_and_reuses_connections() {
        let (addr, conns) = engine(pass_answer(), 100).await;
        let pool = Pool::new(4);
        let msg = encode_request(b"GET / HTTP/1.1\r\n\r\n", None, b"x");
        for _ in 0..3 {
            let a = exchange(&pool, &target(addr), "s", &msg, &T, None)
                .await
                .unwrap();
            assert_eq!(a.action().unwrap(), ".");
        }
        assert_eq!(conns.load(Ordering::SeqCst), 1, "one connection, reused");
        assert_eq!(pool.idle(), 1);
        // An expired connection is not reused.
        let a = exchange(&pool, &target(addr), "s", &msg, &T, Some(Duration::ZERO)).await;
        assert!(a.is_ok());
        let _ = exchange(&pool, &target(addr), "s", &msg, &T, None).await;
        assert_eq!(conns.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_the_engine_closed_is_replaced() {
        // One answer per connection, then the engine closes it.
        let (addr, conns) = engine(pass_answer(), 1).await;
        let pool = Pool::new(2);
        let msg = encode_request(b"h", None, b"x");
        for _ in 0..3 {
            exchange(&pool, &target(addr), "s", &msg, &T, None)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(conns.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn errors_read_as_lua_resty_t1k() {
        let pool = Pool::new(0);
        let msg = encode_request(b"h", None, b"x");
        // Nothing listens.
        let dead = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let e = exchange(&pool, &target(dead), "127.0.0.1:1", &msg, &T, None)
            .await
            .unwrap_err();
        assert_eq!(
            e,
            "failed to get socket: failed to connect to t1k server 127.0.0.1:1: connection refused"
        );
        // Never answers.
        let (addr, _) = engine(Vec::new(), 1).await;
        let e = exchange(&pool, &target(addr), "e", &msg, &T, None)
            .await
            .unwrap_err();
        assert_eq!(
            e,
            "failed to receive info packet from t1k server e: timeout"
        );
        // Answers without the first bit.
        let (addr, _) = engine(vec![0x81, 1, 0, 0, 0, b'.'], 1).await;
        let e = exchange(&pool, &target(addr), "e", &msg, &T, None)
            .await
            .unwrap_err();
        assert_eq!(e, "first packet is not MASK_FIRST from t1k server e");
        // Answers HTTP: `H` has the first bit, and `TTP/` is no length it could mean.
        let (addr, _) = engine(b"HTTP/1.1 200 OK\r\n\r\n".to_vec(), 1).await;
        let e = exchange(&pool, &target(addr), "e", &msg, &T, None)
            .await
            .unwrap_err();
        assert_eq!(e, "packet of 793793620 bytes from t1k server e is too long");
        // Closes in the middle of a section.
        let (addr, _) = engine(vec![0xc1, 9, 0, 0, 0, b'.'], 1).await;
        let e = exchange(&pool, &target(addr), "e", &msg, &T, None)
            .await
            .unwrap_err();
        assert_eq!(e, "failed to receive data from t1k server e: closed");
        // A missing socket file.
        let e = exchange(
            &pool,
            &Target::new("unix:/nonexistent/t1k.sock", 80),
            "unix:/nonexistent/t1k.sock",
            &msg,
            &T,
            None,
        )
        .await
        .unwrap_err();
        assert!(
            e.ends_with("unix:/nonexistent/t1k.sock: no such file or directory"),
            "{e}"
        );
    }

    #[test]
    fn targets() {
        assert_eq!(
            Target::new("[::1]", 8000),
            Target::Tcp {
                host: "::1".into(),
                port: 8000
            }
        );
        assert_eq!(
            Target::new("unix:/tmp/s.sock", 8000),
            Target::Unix("/tmp/s.sock".into())
        );
    }
}
