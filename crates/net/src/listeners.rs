//! The process's listening sockets, bound once and handed to the servers.
//!
//! A [`ListenerSet`] owns every listening socket of the process: data-plane workers (one
//! `SO_REUSEPORT` socket per worker and address), the Admin API, the control API, the metrics
//! export. Servers get duplicates of its sockets; the set keeps the originals so that they can
//! be handed over to a successor process ([`crate::handover`]) with every connection waiting
//! in their accept queues. A set made from a predecessor's sockets hands those out first, by
//! address, and binds only what the predecessor did not have.

use std::io;
use std::net::{SocketAddr, TcpListener};

/// nginx's default `listen ... backlog` on Linux is 511; the kernel caps it at somaxconn.
const BACKLOG: i32 = 4096;

/// Binds a listening TCP socket: `SO_REUSEADDR`, `SO_REUSEPORT` when `reuse_port` (one socket
/// per worker, the kernel spreading connections over them), IPv6 sockets IPv6-only,
/// non-blocking.
pub fn bind(addr: SocketAddr, reuse_port: bool) -> io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    if addr.is_ipv6() {
        let _ = socket.set_only_v6(true);
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// The listening sockets of one address.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) addr: SocketAddr,
    pub(crate) sockets: Vec<TcpListener>,
}

/// Every listening socket of the process. See the module documentation.
#[derive(Debug, Default)]
pub struct ListenerSet {
    held: Vec<Held>,
    /// Sockets from a predecessor no server has asked for yet.
    inherited: Vec<Held>,
}

impl ListenerSet {
    /// An empty set: every socket will be bound.
    pub fn new() -> ListenerSet {
        ListenerSet::default()
    }

    /// A set starting from a predecessor's sockets.
    pub(crate) fn inherit(inherited: Vec<Held>) -> ListenerSet {
        ListenerSet {
            held: Vec::new(),
            inherited,
        }
    }

    /// Listeners for a server of `groups` workers on `addr`, one group per worker, each socket
    /// a duplicate of one the set keeps. Fresh sockets are bound with `SO_REUSEPORT` when
    /// `reuse_port` (one per group), else one socket shared by every group. A predecessor's
    /// sockets for `addr` are used first and all of them are served, however many there are:
    /// with fewer groups than sockets a group serves several (their queues must be emptied),
    /// with more, the extra groups get sockets of their own when `reuse_port` allows, else
    /// share the inherited ones.
    pub fn take(
        &mut self,
        addr: SocketAddr,
        groups: usize,
        reuse_port: bool,
    ) -> io::Result<Vec<Vec<TcpListener>>> {
        let groups = groups.max(1);
        let mut out: Vec<Vec<TcpListener>> = (0..groups).map(|_| Vec::new()).collect();
        let mut sockets = Vec::new();
        if let Some(i) = self.inherited.iter().position(|h| h.addr == addr) {
            sockets = self.inherited.swap_remove(i).sockets;
        }
        let inherited = sockets.len();
        for (i, socket) in sockets.iter().enumerate() {
            out[i % groups].push(socket.try_clone()?);
        }
        for (g, group) in out.iter_mut().enumerate().skip(inherited) {
            if reuse_port || sockets.is_empty() {
                match bind(addr, reuse_port) {
                    Ok(s) => {
                        group.push(s.try_clone()?);
                        sockets.push(s);
                        continue;
                    }
                    // The predecessor's sockets lack SO_REUSEPORT: share them.
                    Err(_) if inherited > 0 => {}
                    Err(e) => return Err(e),
                }
            }
            group.push(sockets[g % sockets.len()].try_clone()?);
        }
        self.held.push(Held { addr, sockets });
        Ok(out)
    }

    /// Like [`ListenerSet::take`] for a server with one accept loop.
    pub fn take_one(&mut self, addr: SocketAddr) -> io::Result<Vec<TcpListener>> {
        Ok(self.take(addr, 1, false)?.pop().unwrap_or_default())
    }

    /// Closes the predecessor's sockets no server asked for (addresses no longer configured).
    pub fn close_unused(&mut self) {
        for h in self.inherited.drain(..) {
            tracing::info!(addr = %h.addr, "no longer configured: the predecessor's listener is closed");
        }
    }

    /// Closes every socket the set keeps. Servers' duplicates stay open until they drop them.
    pub fn clear(&mut self) {
        self.held.clear();
        self.inherited.clear();
    }

    /// The addresses held, with how many sockets each.
    pub fn addrs(&self) -> Vec<(SocketAddr, usize)> {
        self.held
            .iter()
            .map(|h| (h.addr, h.sockets.len()))
            .collect()
    }

    pub(crate) fn held(&self) -> &[Held] {
        &self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(addr: SocketAddr, n: usize) -> Held {
        Held {
            addr,
            sockets: (0..n).map(|_| bind(addr, true).unwrap()).collect(),
        }
    }

    fn free_addr() -> SocketAddr {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    }

    #[test]
    fn fresh_sockets_one_per_group_with_reuse_port() {
        let addr = free_addr();
        let mut set = ListenerSet::new();
        let groups = set.take(addr, 3, true).unwrap();
        assert_eq!(groups.iter().map(Vec::len).collect::<Vec<_>>(), [1, 1, 1]);
        assert_eq!(set.addrs(), [(addr, 3)]);
    }

    #[test]
    fn inherited_sockets_are_all_served_by_fewer_groups() {
        let addr = free_addr();
        let mut set = ListenerSet::inherit(vec![held(addr, 4)]);
        let groups = set.take(addr, 3, true).unwrap();
        assert_eq!(groups.iter().map(Vec::len).collect::<Vec<_>>(), [2, 1, 1]);
        assert_eq!(set.addrs(), [(addr, 4)]);
    }

    #[test]
    fn more_groups_than_inherited_sockets_bind_their_own() {
        let addr = free_addr();
        let mut set = ListenerSet::inherit(vec![held(addr, 1)]);
        let groups = set.take(addr, 2, true).unwrap();
        assert_eq!(groups.iter().map(Vec::len).collect::<Vec<_>>(), [1, 1]);
        assert_eq!(set.addrs(), [(addr, 2)]);
        // Without SO_REUSEPORT the groups share the predecessor's socket.
        let other = free_addr();
        let mut set = ListenerSet::inherit(vec![Held {
            addr: other,
            sockets: vec![bind(other, false).unwrap()],
        }]);
        let groups = set.take(other, 2, false).unwrap();
        assert_eq!(groups.iter().map(Vec::len).collect::<Vec<_>>(), [1, 1]);
        assert_eq!(set.addrs(), [(other, 1)]);
    }

    #[test]
    fn an_address_in_use_fails() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut set = ListenerSet::new();
        assert!(set.take_one(taken.local_addr().unwrap()).is_err());
    }
}
