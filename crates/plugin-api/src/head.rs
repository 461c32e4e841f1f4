//! The request head as it arrived, and the connection it came on: what every variable is read
//! from.

use std::net::SocketAddr;

use http::{Method, Uri, Version};

/// The connection a request arrived on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnFacts {
    /// The TCP peer (`$realip_remote_addr`, `$remote_port`).
    pub peer: SocketAddr,
    /// The local address (`$server_addr`, `$server_port`).
    pub local: SocketAddr,
    /// The connection is TLS (`$scheme` is `https`).
    pub tls: bool,
}

impl ConnFacts {
    /// `$scheme`.
    pub fn scheme(&self) -> &'static str {
        if self.tls {
            "https"
        } else {
            "http"
        }
    }
}

/// The client's request head, as it arrived (its headers are separate: plugins edit them).
#[derive(Clone, Copy, Debug)]
pub struct RequestHead<'r> {
    pub method: &'r Method,
    /// The raw request target (`$request_uri`, the query).
    pub uri: &'r Uri,
    pub version: Version,
    /// The normalised path (`$uri`).
    pub path: &'r str,
    /// `$host`: lower-cased, without the port.
    pub host: Option<&'r str>,
    pub conn: &'r ConnFacts,
}
