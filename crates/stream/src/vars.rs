//! The nginx stream variables of one connection, as plugins, chash keys and log formats read
//! them (`$remote_addr`, `$server_port`, `$route_id`, `$mqtt_client_id`,
//! `$proxy_protocol_addr`, `$proxy_protocol_tlv_<name>` ...).

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use ferrisix_net::proxy_protocol::ProxyHeader;
use ferrisix_router::VarSource;
use ipnet::IpNet;

/// What a connection knows about itself.
#[derive(Clone, Debug)]
pub struct ConnVars {
    /// The client (`$remote_addr`): the peer, or the PROXY header's source when the peer is
    /// trusted by `nginx_config.stream.real_ip_from`.
    pub remote: SocketAddr,
    /// The TCP (or UDP) peer (`$realip_remote_addr`, `$realip_remote_port`).
    pub peer: SocketAddr,
    pub local: SocketAddr,
    /// The PROXY protocol header's source and destination, on the ports that read one
    /// (`$proxy_protocol_addr` ... ); `None` for a header without addresses.
    pub proxy_protocol: Option<(SocketAddr, SocketAddr)>,
    /// The TLVs of a v2 PROXY header with addresses (`$proxy_protocol_tlv_<name>`).
    pub proxy_protocol_tlvs: Option<Arc<[u8]>>,
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
            peer: remote,
            local,
            proxy_protocol: None,
            proxy_protocol_tlvs: None,
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

impl ConnVars {
    /// Takes in what the PROXY header said: its addresses become `$proxy_protocol_*`, and its
    /// source the client when `trusted` (nginx stream's realip module, `set_real_ip_from`)
    /// holds the peer.
    pub fn take_proxy_protocol(&mut self, header: ProxyHeader, trusted: &[IpNet]) {
        let Some((source, destination)) = header.addresses() else {
            return;
        };
        self.proxy_protocol = Some((source, destination));
        let peer = unmapped(self.peer.ip());
        if trusted.iter().any(|n| n.contains(&peer)) {
            self.remote = source;
        }
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 one (a dual-stack socket's peers).
fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

impl VarSource for ConnVars {
    fn var(&self, name: &str) -> Option<Cow<'_, str>> {
        let owned = |s: String| Some(Cow::Owned(s));
        match name {
            "remote_addr" | "binary_remote_addr" => owned(self.remote.ip().to_string()),
            "remote_port" => owned(self.remote.port().to_string()),
            "realip_remote_addr" => owned(self.peer.ip().to_string()),
            "realip_remote_port" => owned(self.peer.port().to_string()),
            "proxy_protocol_addr" => owned(self.proxy_protocol?.0.ip().to_string()),
            "proxy_protocol_port" => owned(self.proxy_protocol?.0.port().to_string()),
            "proxy_protocol_server_addr" => owned(self.proxy_protocol?.1.ip().to_string()),
            "proxy_protocol_server_port" => owned(self.proxy_protocol?.1.port().to_string()),
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
            _ => {
                // nginx's prefix variable: the bytes of a TLV, by name or `0x<type>`.
                let tlv = name.strip_prefix("proxy_protocol_tlv_")?;
                let value =
                    ferrisix_net::proxy_protocol::tlv(self.proxy_protocol_tlvs.as_deref()?, tlv)?;
                Some(match value {
                    Cow::Borrowed(b) => String::from_utf8_lossy(b),
                    Cow::Owned(b) => Cow::Owned(String::from_utf8_lossy(&b).into_owned()),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_proxy_header_names_the_client_only_from_a_trusted_peer() {
        let header = ProxyHeader::Proxied {
            source: addr("198.51.100.7:56324"),
            destination: addr("10.0.0.1:9100"),
        };
        let mut untrusted = ConnVars::new(addr("127.0.0.1:40000"), addr("127.0.0.1:9100"), "TCP");
        untrusted.take_proxy_protocol(header, &[]);
        let v = |c: &ConnVars, n: &str| c.var(n).map(Cow::into_owned);
        assert_eq!(v(&untrusted, "remote_addr").as_deref(), Some("127.0.0.1"));
        assert_eq!(
            v(&untrusted, "proxy_protocol_addr").as_deref(),
            Some("198.51.100.7")
        );
        assert_eq!(
            v(&untrusted, "proxy_protocol_port").as_deref(),
            Some("56324")
        );
        assert_eq!(
            v(&untrusted, "proxy_protocol_server_addr").as_deref(),
            Some("10.0.0.1")
        );
        assert_eq!(
            v(&untrusted, "proxy_protocol_server_port").as_deref(),
            Some("9100")
        );

        let mut trusted = ConnVars::new(
            addr("[::ffff:127.0.0.1]:40000"),
            addr("127.0.0.1:9100"),
            "TCP",
        );
        trusted.take_proxy_protocol(header, &["127.0.0.0/8".parse().unwrap()]);
        assert_eq!(v(&trusted, "remote_addr").as_deref(), Some("198.51.100.7"));
        assert_eq!(v(&trusted, "remote_port").as_deref(), Some("56324"));
        assert_eq!(
            v(&trusted, "realip_remote_addr").as_deref(),
            Some("::ffff:127.0.0.1")
        );
        assert_eq!(v(&trusted, "realip_remote_port").as_deref(), Some("40000"));

        // LOCAL: nothing changes, and the proxy_protocol variables stay unset.
        let mut local = ConnVars::new(addr("127.0.0.1:40000"), addr("127.0.0.1:9100"), "TCP");
        local.take_proxy_protocol(ProxyHeader::Local, &["127.0.0.0/8".parse().unwrap()]);
        assert_eq!(v(&local, "remote_addr").as_deref(), Some("127.0.0.1"));
        assert_eq!(v(&local, "proxy_protocol_addr"), None);
    }

    #[test]
    fn tlv_variables_read_the_header_tlvs() {
        let mut c = ConnVars::new(addr("127.0.0.1:40000"), addr("127.0.0.1:9100"), "TCP");
        let v = |c: &ConnVars, n: &str| c.var(n).map(Cow::into_owned);
        assert_eq!(v(&c, "proxy_protocol_tlv_authority"), None);
        let mut ssl = vec![0x01, 0, 0, 0, 0];
        ssl.extend_from_slice(&[0x22, 0x00, 0x02, b'c', b'n']);
        let mut list = vec![
            0x02,
            0x00,
            0x03,
            b'a',
            b'.',
            b'b',
            0x20,
            0x00,
            ssl.len() as u8,
        ];
        list.extend_from_slice(&ssl);
        c.proxy_protocol_tlvs = Some(list.into());
        assert_eq!(
            v(&c, "proxy_protocol_tlv_authority").as_deref(),
            Some("a.b")
        );
        assert_eq!(v(&c, "proxy_protocol_tlv_0x02").as_deref(), Some("a.b"));
        assert_eq!(v(&c, "proxy_protocol_tlv_ssl_cn").as_deref(), Some("cn"));
        assert_eq!(v(&c, "proxy_protocol_tlv_ssl_verify").as_deref(), Some("0"));
        assert_eq!(v(&c, "proxy_protocol_tlv_alpn"), None);
        assert_eq!(v(&c, "proxy_protocol_tlv_"), None);
    }
}
