//! Listener hand-over from a running ferrisix process to its successor, without losing a
//! connection.
//!
//! Each data-plane worker has its own `SO_REUSEPORT` socket, and the kernel puts each new
//! connection in the accept queue of one of them. Closing such a socket resets every
//! connection still waiting in its queue (unless `net.ipv4.tcp_migrate_req` is set), so a
//! new process binding the same ports beside the old one and the old one then closing its
//! sockets loses connections under load. Here the old process hands the sockets themselves
//! over (`SCM_RIGHTS` on a Unix socket, as HAProxy's `expose-fd listeners` and nginx's binary
//! upgrade pass them): the queues belong to the sockets, the successor accepts from them, and
//! nothing is closed that a client is waiting on.
//!
//! The running process listens on a `SOCK_SEQPACKET` Unix socket (in its data directory,
//! mode 0600, peers of another user refused). A successor connects and the exchange is:
//!
//! 1. `HELLO` → the predecessor's pid and version, then its listening sockets, by address.
//! 2. `RELEASE` (only when the successor needs what the predecessor holds exclusively: the
//!    embedded store's file) → the predecessor stops its Admin API and closes the store, while
//!    its data plane keeps serving; `RELEASED`.
//! 3. `STOP`, once the successor is ready to serve → the predecessor stops accepting and
//!    drains its connections; `STOPPED`. Both processes accept from the same sockets in
//!    between, so there is no moment without an accepting process.
//!
//! A successor that goes away before `STOP` (it failed to start) leaves the predecessor
//! running: what `RELEASE` stopped is resumed.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::net::{
    sockopt, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketType,
};

use crate::listeners::{Held, ListenerSet};

/// Names the exchange, so that a process of an incompatible version is recognised.
const PROTOCOL: &str = "ferrisix-handover/1";
/// Sockets per message (the kernel's limit is 253).
const FDS_PER_MESSAGE: usize = 64;
const MAX_MESSAGE: usize = 4096;
/// How long the successor waits for each answer (RELEASE waits for the Admin API to drain).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the predecessor waits for the successor's next step (it may be connecting to
/// etcd and compiling its first configuration).
const STEP_TIMEOUT: Duration = Duration::from_secs(120);

/// What a running process does for its successor; the binary implements it (the calls come
/// from the hand-over thread and may block).
pub trait Predecessor: Send + Sync + 'static {
    /// Stops what the successor needs exclusively (the Admin API and the embedded store); the
    /// data plane keeps serving.
    fn release(&self) -> Result<(), String>;
    /// The successor went away before taking over: undoes [`Predecessor::release`].
    fn resume(&self);
    /// The successor serves now: stop accepting, drain, exit.
    fn stop(&self);
}

fn io_err(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn unix_addr(path: &Path) -> io::Result<SocketAddrUnix> {
    SocketAddrUnix::new(path).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not usable as a Unix socket path ({e})", path.display()),
        )
    })
}

fn send(conn: &OwnedFd, text: &str, fds: &[std::os::fd::BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_MESSAGE))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io_err("too many sockets for one message"));
    }
    rustix::net::sendmsg(
        conn,
        &[IoSlice::new(text.as_bytes())],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// The next message and the sockets that came with it. EOF is `UnexpectedEof`.
fn recv(conn: &OwnedFd) -> io::Result<(String, Vec<OwnedFd>)> {
    let mut buf = [0u8; MAX_MESSAGE];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_MESSAGE))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        conn,
        &mut [IoSliceMut::new(&mut buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = msg {
            fds.extend(received);
        }
    }
    if got.bytes == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the other process closed the hand-over connection",
        ));
    }
    let text = std::str::from_utf8(&buf[..got.bytes.min(MAX_MESSAGE)])
        .map_err(|_| io_err("hand-over message is not UTF-8"))?
        .to_owned();
    Ok((text, fds))
}

fn seqpacket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?)
}

/// A successor's side of the exchange, after `HELLO`.
#[derive(Debug)]
pub struct Successor {
    conn: OwnedFd,
    /// The predecessor's process id and version.
    pub pid: u32,
    pub version: String,
}

/// Connects to the process listening on `path` and receives its listening sockets. `None`
/// when nothing runs there (no socket, or a stale one left by a process that died).
pub fn connect(path: &Path) -> io::Result<Option<(Successor, ListenerSet)>> {
    let addr = unix_addr(path)?;
    let conn = seqpacket()?;
    match rustix::net::connect(&conn, &addr) {
        Ok(()) => {}
        Err(e) if e == rustix::io::Errno::NOENT || e == rustix::io::Errno::CONNREFUSED => {
            return Ok(None)
        }
        Err(e) => return Err(e.into()),
    }
    sockopt::set_socket_timeout(&conn, sockopt::Timeout::Recv, Some(ANSWER_TIMEOUT))?;
    send(
        &conn,
        &format!("HELLO {PROTOCOL} {}", std::process::id()),
        &[],
    )?;
    let (peer, _) = recv(&conn)?;
    let mut words = peer.split(' ');
    let (Some("PEER"), Some(pid), Some(version), Some(messages)) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Err(io_err(format!("unexpected hand-over answer {peer:?}")));
    };
    let pid: u32 = pid.parse().map_err(|_| io_err("bad pid"))?;
    let messages: usize = messages.parse().map_err(|_| io_err("bad count"))?;
    let mut held: Vec<Held> = Vec::new();
    for _ in 0..messages {
        let (text, fds) = recv(&conn)?;
        let mut words = text.split(' ');
        let (Some("SOCKETS"), Some(addr), Some(count)) = (words.next(), words.next(), words.next())
        else {
            return Err(io_err(format!("unexpected hand-over message {text:?}")));
        };
        let addr: SocketAddr = addr.parse().map_err(|_| io_err("bad address"))?;
        if count.parse::<usize>().ok() != Some(fds.len()) {
            return Err(io_err("sockets missing from a hand-over message"));
        }
        let sockets = fds.into_iter().map(TcpListener::from);
        match held.iter_mut().find(|h| h.addr == addr) {
            Some(h) => h.sockets.extend(sockets),
            None => held.push(Held {
                addr,
                sockets: sockets.collect(),
            }),
        }
    }
    Ok(Some((
        Successor {
            conn,
            pid,
            version: version.to_owned(),
        },
        ListenerSet::inherit(held),
    )))
}

impl Successor {
    fn ask(&self, request: &str, ok: &str) -> io::Result<()> {
        send(&self.conn, request, &[])?;
        let (answer, _) = recv(&self.conn)?;
        if answer == ok {
            return Ok(());
        }
        match answer.strip_prefix("ERROR ") {
            Some(why) => Err(io::Error::other(why.to_owned())),
            None => Err(io_err(format!("unexpected hand-over answer {answer:?}"))),
        }
    }

    /// Asks the predecessor to stop its Admin API and close the embedded store.
    pub fn release(&self) -> io::Result<()> {
        self.ask("RELEASE", "RELEASED")
    }

    /// Tells the predecessor to stop accepting: this process serves from now on.
    pub fn stop(self) -> io::Result<()> {
        self.ask("STOP", "STOPPED")
    }
}

/// A running process's hand-over socket. Dropping it removes the socket file when it is
/// still this process's (a successor replaces it with its own).
#[derive(Debug)]
pub struct HandoverServer {
    path: PathBuf,
    inode: u64,
    /// Set when a successor took over: the socket file was removed then (the successor binds
    /// its own at the path, possibly with this one's freed inode number).
    handed_over: Arc<AtomicBool>,
}

impl HandoverServer {
    /// Listens on `path` (a stale socket there is replaced) and serves successors from a
    /// thread of its own, one at a time. `sockets` are what a successor receives.
    pub fn start(
        path: &Path,
        version: &str,
        sockets: Arc<Mutex<ListenerSet>>,
        host: Arc<dyn Predecessor>,
    ) -> io::Result<HandoverServer> {
        let addr = unix_addr(path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let listener = seqpacket()?;
        match rustix::net::bind(&listener, &addr) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::ADDRINUSE => {
                // Nobody answers there (the caller found no predecessor): a leftover.
                std::fs::remove_file(path)?;
                rustix::net::bind(&listener, &addr)?;
            }
            Err(e) => return Err(e.into()),
        }
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        rustix::net::listen(&listener, 4)?;
        let inode = std::fs::metadata(path)?.ino();
        let version = version.to_owned();
        let handed_over = Arc::new(AtomicBool::new(false));
        let end = Ending {
            path: path.to_owned(),
            inode,
            handed_over: handed_over.clone(),
        };
        std::thread::Builder::new()
            .name("ferrisix-handover".into())
            .spawn(move || accept_loop(listener, &version, &sockets, host.as_ref(), &end))?;
        Ok(HandoverServer {
            path: path.to_owned(),
            inode,
            handed_over,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for HandoverServer {
    fn drop(&mut self) {
        if !self.handed_over.load(Ordering::Acquire)
            && std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.inode)
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// What the hand-over thread does with the socket file when a successor takes over.
struct Ending {
    path: PathBuf,
    inode: u64,
    handed_over: Arc<AtomicBool>,
}

impl Ending {
    /// Removes the socket file before the successor hears `STOPPED` (and binds its own), so
    /// that nothing of this process touches the path afterwards.
    fn handed_over(&self) {
        self.handed_over.store(true, Ordering::Release);
        if std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.inode) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn accept_loop(
    listener: OwnedFd,
    version: &str,
    sockets: &Mutex<ListenerSet>,
    host: &dyn Predecessor,
    end: &Ending,
) {
    loop {
        let conn = match rustix::net::accept_with(&listener, rustix::net::SocketFlags::CLOEXEC) {
            Ok(c) => c,
            Err(e) if e == rustix::io::Errno::INTR => continue,
            Err(e) => {
                tracing::warn!(error = %e, "hand-over socket: accept failed; hand-over off");
                return;
            }
        };
        match serve_successor(&conn, version, sockets, host, end) {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "listener hand-over failed"),
        }
    }
}

/// One successor's exchange; `Ok(true)` once it took over.
fn serve_successor(
    conn: &OwnedFd,
    version: &str,
    sockets: &Mutex<ListenerSet>,
    host: &dyn Predecessor,
    end: &Ending,
) -> io::Result<bool> {
    let cred = sockopt::socket_peercred(conn)?;
    let me = rustix::process::geteuid();
    if cred.uid != me && !cred.uid.is_root() {
        return Err(io_err(format!(
            "refused a hand-over to uid {} (this process runs as {})",
            cred.uid.as_raw(),
            me.as_raw()
        )));
    }
    sockopt::set_socket_timeout(conn, sockopt::Timeout::Recv, Some(STEP_TIMEOUT))?;
    let (hello, _) = recv(conn)?;
    let mut words = hello.split(' ');
    if words.next() != Some("HELLO") || words.next() != Some(PROTOCOL) {
        send(conn, &format!("ERROR expected HELLO {PROTOCOL}"), &[])?;
        return Err(io_err(format!("unexpected hand-over greeting {hello:?}")));
    }
    let successor = words.next().unwrap_or("?").to_owned();
    {
        let set = sockets.lock().unwrap_or_else(|e| e.into_inner());
        let mut messages = Vec::new();
        for h in set.held() {
            for chunk in h.sockets.chunks(FDS_PER_MESSAGE) {
                messages.push((h.addr, chunk));
            }
        }
        send(
            conn,
            &format!("PEER {} {version} {}", std::process::id(), messages.len()),
            &[],
        )?;
        for (addr, chunk) in messages {
            let fds: Vec<_> = chunk.iter().map(AsFd::as_fd).collect();
            send(conn, &format!("SOCKETS {addr} {}", fds.len()), &fds)?;
        }
    }
    tracing::info!(successor = %successor, "listening sockets handed to a successor");
    let mut released = false;
    loop {
        let step = match recv(conn) {
            Ok((text, _)) => text,
            Err(e) => {
                if released {
                    host.resume();
                }
                tracing::warn!(successor = %successor, error = %e, "the successor went away before taking over; still serving");
                return Ok(false);
            }
        };
        match step.as_str() {
            "RELEASE" => match host.release() {
                Ok(()) => {
                    released = true;
                    send(conn, "RELEASED", &[])?;
                }
                Err(e) => send(conn, &format!("ERROR {e}"), &[])?,
            },
            "STOP" => {
                host.stop();
                end.handed_over();
                let _ = send(conn, "STOPPED", &[]);
                tracing::info!(successor = %successor, "the successor serves now; draining");
                return Ok(true);
            }
            other => {
                send(conn, "ERROR unknown step", &[])?;
                return Err(io_err(format!("unknown hand-over step {other:?}")));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::sync::atomic::AtomicUsize;

    #[derive(Default)]
    struct Recorder {
        released: AtomicUsize,
        resumed: AtomicUsize,
        stopped: AtomicUsize,
    }

    impl Predecessor for Recorder {
        fn release(&self) -> Result<(), String> {
            self.released.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn resume(&self) {
            self.resumed.fetch_add(1, Ordering::SeqCst);
        }
        fn stop(&self) {
            self.stopped.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn free_addr() -> SocketAddr {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    }

    fn wait_for(mut f: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(std::time::Instant::now() < deadline, "timed out");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The point of handing sockets over: connections waiting in the old process's accept
    /// queues are accepted by the new one after the old one closed everything it had.
    #[test]
    fn queued_connections_survive_the_hand_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handover.sock");
        let addr = free_addr();
        let mut old = ListenerSet::new();
        let workers = old.take(addr, 2, true).unwrap();
        let old = Arc::new(Mutex::new(old));
        let host = Arc::new(Recorder::default());
        let server = HandoverServer::start(&path, "test", old.clone(), host.clone()).unwrap();

        // Clients whose connections nobody accepted yet.
        let mut clients: Vec<std::net::TcpStream> = (0..20)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        for (i, c) in clients.iter_mut().enumerate() {
            c.write_all(&[i as u8]).unwrap();
        }

        let (successor, mut set) = connect(&path).unwrap().expect("a predecessor");
        assert_eq!(successor.pid, std::process::id());
        assert_eq!(successor.version, "test");
        successor.release().unwrap();
        assert_eq!(host.released.load(Ordering::SeqCst), 1);
        let taken = set.take(addr, 1, true).unwrap();
        assert_eq!(taken[0].len(), 2, "both worker sockets came over");
        successor.stop().unwrap();
        wait_for(|| host.stopped.load(Ordering::SeqCst) == 1);
        // The old process closes every socket it had.
        drop(workers);
        old.lock().unwrap().clear();
        drop(old);
        drop(server);

        let mut seen = Vec::new();
        for listener in &taken[0] {
            listener.set_nonblocking(true).unwrap();
        }
        wait_for(|| {
            for listener in &taken[0] {
                while let Ok((mut s, _)) = listener.accept() {
                    s.set_nonblocking(false).unwrap();
                    let mut b = [0u8; 1];
                    s.read_exact(&mut b).unwrap();
                    seen.push(b[0]);
                }
            }
            seen.len() == clients.len()
        });
        seen.sort();
        assert_eq!(seen, (0..20).collect::<Vec<u8>>());
    }

    /// For contrast, what the hand-over avoids: closing a `SO_REUSEPORT` socket resets the
    /// connections queued on it even while its sibling keeps listening (without
    /// `net.ipv4.tcp_migrate_req`).
    #[test]
    fn closing_a_reuseport_socket_resets_its_queue() {
        if std::fs::read_to_string("/proc/sys/net/ipv4/tcp_migrate_req")
            .is_ok_and(|v| v.trim() == "1")
        {
            eprintln!("tcp_migrate_req is on here: queued connections migrate instead");
            return;
        }
        let addr = free_addr();
        let a = crate::listeners::bind(addr, true).unwrap();
        let b = crate::listeners::bind(addr, true).unwrap();
        let mut clients: Vec<std::net::TcpStream> = (0..40)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        drop(a);
        let mut reset = 0;
        for c in &mut clients {
            c.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let mut byte = [0u8; 1];
            match c.read(&mut byte) {
                Ok(0) => reset += 1,
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => reset += 1,
                _ => {}
            }
        }
        drop(b);
        // The kernel spreads connections by hash: about half were queued on `a`.
        assert!(reset > 0, "no queued connection was reset");
    }

    #[test]
    fn a_successor_that_leaves_early_resumes_the_predecessor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handover.sock");
        let host = Arc::new(Recorder::default());
        let _server = HandoverServer::start(
            &path,
            "test",
            Arc::new(Mutex::new(ListenerSet::new())),
            host.clone(),
        )
        .unwrap();
        let (successor, _) = connect(&path).unwrap().unwrap();
        successor.release().unwrap();
        drop(successor);
        wait_for(|| host.resumed.load(Ordering::SeqCst) == 1);
        assert_eq!(host.stopped.load(Ordering::SeqCst), 0);
        // The next successor is served.
        let (again, _) = connect(&path).unwrap().unwrap();
        again.stop().unwrap();
        wait_for(|| host.stopped.load(Ordering::SeqCst) == 1);
    }

    /// The successor's own hand-over socket survives the predecessor's exit, even when it got
    /// the predecessor's freed inode number.
    #[test]
    fn the_successor_socket_outlives_the_predecessor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handover.sock");
        let empty = || Arc::new(Mutex::new(ListenerSet::new()));
        let host = Arc::new(Recorder::default());
        let old = HandoverServer::start(&path, "test", empty(), host.clone()).unwrap();
        let (successor, _) = connect(&path).unwrap().unwrap();
        successor.stop().unwrap();
        assert!(
            !path.exists(),
            "the predecessor removed its socket file at STOP"
        );
        let new = HandoverServer::start(&path, "test", empty(), host).unwrap();
        drop(old);
        assert!(path.exists());
        assert!(connect(&path).unwrap().is_some());
        drop(new);
        assert!(!path.exists());
    }

    #[test]
    fn no_predecessor_and_stale_sockets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handover.sock");
        assert!(connect(&path).unwrap().is_none());
        // A socket file nobody listens on (its process died).
        let stale = seqpacket().unwrap();
        rustix::net::bind(&stale, &unix_addr(&path).unwrap()).unwrap();
        drop(stale);
        assert!(connect(&path).unwrap().is_none());
        let server = HandoverServer::start(
            &path,
            "test",
            Arc::new(Mutex::new(ListenerSet::new())),
            Arc::new(Recorder::default()),
        )
        .unwrap();
        assert!(connect(&path).unwrap().is_some());
        drop(server);
        assert!(!path.exists(), "the socket file goes with its server");
    }
}
