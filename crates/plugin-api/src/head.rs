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
    /// What the PROXY protocol header that opened the connection said, on the listeners that
    /// require one (`$proxy_protocol_addr`, `$proxy_protocol_port`,
    /// `$proxy_protocol_server_addr`, `$proxy_protocol_server_port`); `None` elsewhere, and
    /// for a header without addresses (v2 `LOCAL`, v1 `UNKNOWN`).
    pub proxy_protocol: Option<ProxiedAddrs>,
    /// The realip rewrite takes the client from the PROXY header (nginx's
    /// `real_ip_header proxy_protocol` from a trusted peer): `$remote_addr` and
    /// `$remote_port` are the header's source.
    pub client_from_proxy_protocol: bool,
}

/// The addresses of a PROXY protocol header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProxiedAddrs {
    /// The client, as the proxy in front saw it.
    pub source: SocketAddr,
    /// The address the client connected to on that proxy.
    pub destination: SocketAddr,
}

impl ConnFacts {
    /// A connection without a PROXY protocol header.
    pub fn new(peer: SocketAddr, local: SocketAddr, tls: bool) -> ConnFacts {
        ConnFacts {
            peer,
            local,
            tls,
            proxy_protocol: None,
            client_from_proxy_protocol: false,
        }
    }

    /// `$remote_port` before any plugin changes it.
    pub fn remote_port(&self) -> u16 {
        match self.proxy_protocol {
            Some(pp) if self.client_from_proxy_protocol => pp.source.port(),
            _ => self.peer.port(),
        }
    }

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
