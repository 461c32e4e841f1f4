//! The gateway (everything the request path needs besides the snapshot) and the connection a
//! request arrived on.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ferrisix_plugin_api::{ConnFacts, ConnStats};
use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;

use crate::log::access::AccessLog;
use crate::log::LogSinks;
use crate::request::real_ip::RealIpConfig;
use crate::response::body::ResponseBody;
use crate::snapshot::SnapshotHandle;
use crate::upstream::forwarded::ForwardedValues;

/// Everything the request path needs besides the snapshot.
pub struct Gateway {
    pub snapshot: SnapshotHandle,
    pub server_header: HeaderValue,
    pub real_ip: RealIpConfig,
    pub show_upstream_status: bool,
    pub access_log: Arc<AccessLog>,
    /// Connection and request counters (`stub_status`), the plugins' services' own: written
    /// here, read by prometheus.
    pub stats: Arc<ConnStats>,
    /// APISIX 2.x compatibility: `/apisix/admin` on the data port, for loopback clients only.
    pub legacy_admin: Option<LegacyAdmin>,
    /// nginx's `client_body_timeout`: the longest wait for the next part of a request body
    /// while it is read before proxying (408 then).
    pub client_body_timeout: std::time::Duration,
    /// nginx's `client_max_body_size` (bytes, 0: no limit, APISIX's default): a declared
    /// length over it is refused (413) before routing, a chunked body once it passes it. A
    /// route's client-control `max_body_size` replaces it for the body read.
    pub client_max_body_size: u64,
}

/// Answers `/apisix/admin/...` requests that arrive on the data port (APISIX 2.x served its
/// Admin API there). The binary plugs the Admin API in; the data plane only forwards to it.
pub type LegacyAdmin = Arc<
    dyn Fn(
            Request<Incoming>,
            IpAddr,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = Response<ResponseBody>> + Send>>
        + Send
        + Sync,
>;

/// The connection a request arrived on, with what every request on it needs built once per
/// connection rather than once per request.
pub struct ConnInfo {
    pub gateway: Arc<Gateway>,
    pub facts: ConnFacts,
    /// What its requests send upstream about it.
    pub(crate) forwarded: ForwardedValues,
    /// Where the log phases of this connection's requests go.
    pub(crate) log: Arc<LogSinks>,
    /// The TLS session, on the HTTPS listeners (`$scheme` is then `https`).
    pub tls: Option<Arc<ferrisix_tls::TlsConnInfo>>,
}

impl std::fmt::Debug for ConnInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnInfo")
            .field("peer", &self.facts.peer)
            .field("local", &self.facts.local)
            .finish()
    }
}

impl ConnInfo {
    pub fn new(gateway: Arc<Gateway>, peer: SocketAddr, local: SocketAddr) -> ConnInfo {
        let log = Arc::new(LogSinks {
            stats: gateway.stats.clone(),
            access_log: gateway.access_log.clone(),
        });
        ConnInfo {
            facts: ConnFacts::new(peer, local, false),
            forwarded: ForwardedValues::new(peer, local, "http"),
            log,
            gateway,
            tls: None,
        }
    }

    /// A connection that arrived over TLS.
    pub fn with_tls(mut self, tls: ferrisix_tls::TlsConnInfo) -> ConnInfo {
        self.tls = Some(Arc::new(tls));
        self.facts.tls = true;
        self.forwarded = ForwardedValues::new(self.facts.peer, self.facts.local, "https");
        self
    }

    /// A connection opened by a PROXY protocol header (the listeners of
    /// `apisix.proxy_protocol`): its addresses become `$proxy_protocol_*`, and, with
    /// `real_ip_header: proxy_protocol` and a trusted peer, the client (`$remote_addr`,
    /// `$remote_port`, what `X-Real-IP` and `X-Forwarded-For` say).
    pub fn with_proxy_protocol(
        mut self,
        header: ferrisix_net::proxy_protocol::ProxyHeader,
    ) -> ConnInfo {
        let Some((source, destination)) = header.addresses() else {
            return self;
        };
        self.facts.proxy_protocol = Some(ferrisix_plugin_api::ProxiedAddrs {
            source,
            destination,
        });
        let real_ip = &self.gateway.real_ip;
        if real_ip.proxy_protocol && real_ip.trusts(self.facts.peer.ip()) {
            self.facts.client_from_proxy_protocol = true;
        }
        self
    }

    /// `$remote_addr` as the connection gives it, before any header is read: the PROXY
    /// header's client when the realip rewrite takes it.
    pub fn client_from_proxy_protocol(&self) -> Option<IpAddr> {
        let pp = self.facts.proxy_protocol?;
        self.facts
            .client_from_proxy_protocol
            .then_some(pp.source.ip())
    }

    /// `$scheme`.
    pub fn scheme(&self) -> &'static str {
        self.facts.scheme()
    }

    pub fn peer(&self) -> SocketAddr {
        self.facts.peer
    }

    pub fn local(&self) -> SocketAddr {
        self.facts.local
    }
}
