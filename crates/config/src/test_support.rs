//! Test support shared by the workspace's tests (feature `test-support`, never in the binary):
//! a throwaway etcd on random ports ([`etcd::Etcd`], with TLS and a blocking client for direct
//! reads and writes, as APISIX or an operator would do them) and the Debian package helper
//! that installs the servers tests need when they are missing ([`debian`]).
//!
//! The in-memory store the Admin API's tests run on is [`crate::store::memory::MemoryStore`],
//! behind the same feature.

pub mod debian;
pub mod etcd;

use std::net::TcpListener;

/// A 127.0.0.1 port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}
