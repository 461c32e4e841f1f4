//! The nginx stream variables of one connection, as plugins, chash keys and log formats read
//! them (`$remote_addr`, `$server_port`, `$route_id`, `$mqtt_client_id` ...).

use std::borrow::Cow;
use std::net::SocketAddr;
use std::time::Instant;

use ferrisix_router::VarSource;

/// What a connection knows about itself.
#[derive(Clone, Debug)]
pub struct ConnVars {
    pub remote: SocketAddr,
    pub local: SocketAddr,
    /// The SNI of a TLS connection the gateway terminated.
    pub sni: Option<String>,
    pub route_id: Option<String>,
    pub service_id: Option<String>,
    /// The CONNECT packet's client id, set by mqtt-proxy.
    pub mqtt_client_id: Option<String>,
    /// The node the session went to.
    pub upstream_addr: Option<SocketAddr>,
    pub started: Instant,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    /// `$protocol`: `TCP` or `UDP`.
    pub protocol: &'static str,
}

impl ConnVars {
    pub fn new(remote: SocketAddr, local: SocketAddr, protocol: &'static str) -> ConnVars {
        ConnVars {
            remote,
            local,
            sni: None,
            route_id: None,
            service_id: None,
            mqtt_client_id: None,
            upstream_addr: None,
            started: Instant::now(),
            bytes_received: 0,
            bytes_sent: 0,
            protocol,
        }
    }
}

impl VarSource for ConnVars {
    fn var(&self, name: &str) -> Option<Cow<'_, str>> {
        let owned = |s: String| Some(Cow::Owned(s));
        match name {
            "remote_addr" | "realip_remote_addr" | "binary_remote_addr" => {
                owned(self.remote.ip().to_string())
            }
            "remote_port" | "realip_remote_port" => owned(self.remote.port().to_string()),
            "server_addr" => owned(self.local.ip().to_string()),
            "server_port" => owned(self.local.port().to_string()),
            "ssl_server_name" => self.sni.as_deref().map(Cow::Borrowed),
            "route_id" => self.route_id.as_deref().map(Cow::Borrowed),
            "service_id" => self.service_id.as_deref().map(Cow::Borrowed),
            "mqtt_client_id" => self.mqtt_client_id.as_deref().map(Cow::Borrowed),
            "upstream_addr" => self.upstream_addr.map(|a| a.to_string()).and_then(owned),
            "protocol" => Some(Cow::Borrowed(self.protocol)),
            "bytes_received" => owned(self.bytes_received.to_string()),
            "bytes_sent" => owned(self.bytes_sent.to_string()),
            "session_time" => owned(format!("{:.3}", self.started.elapsed().as_secs_f64())),
            "status" => Some(Cow::Borrowed("200")),
            _ => None,
        }
    }
}
