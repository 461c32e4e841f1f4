//! Who the client is: nginx's realip module (`real_ip_header`, `real_ip_from`,
//! `real_ip_recursive`), read once per request before anything else, so `$remote_addr` is the
//! named client from the first phase on.

use std::net::IpAddr;

use http::header::HeaderName;
use http::HeaderMap;
use ipnet::IpNet;

/// `real_ip_header`, `real_ip_from`, `real_ip_recursive`.
#[derive(Clone, Debug)]
pub struct RealIpConfig {
    pub header: HeaderName,
    pub trusted: Vec<IpNet>,
    pub recursive: bool,
    /// `real_ip_header proxy_protocol`: the client is the PROXY protocol header's source
    /// (on the listeners that read one, from a trusted peer), not a request header's.
    pub proxy_protocol: bool,
}

impl RealIpConfig {
    /// `real_ip_header` as config.yaml writes it (`proxy_protocol`, or a header name).
    pub fn new(header: &str, trusted: Vec<IpNet>, recursive: bool) -> RealIpConfig {
        let proxy_protocol = header.eq_ignore_ascii_case("proxy_protocol");
        RealIpConfig {
            header: HeaderName::from_bytes(header.to_ascii_lowercase().as_bytes())
                .unwrap_or(HeaderName::from_static("x-real-ip")),
            trusted,
            recursive,
            proxy_protocol,
        }
    }

    pub(crate) fn trusts(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(&ip))
    }

    /// nginx's realip module: a trusted peer may name the client in the configured header.
    /// With `proxy_protocol` no request header names it (the connection did, see
    /// `ConnInfo::with_proxy_protocol`).
    pub fn client_addr(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if self.proxy_protocol || !self.trusts(peer) {
            return peer;
        }
        let Some(value) = headers.get(&self.header).and_then(|v| v.to_str().ok()) else {
            return peer;
        };
        let mut candidates = value.rsplit(',').map(str::trim);
        if !self.recursive {
            // Without recursion nginx takes the last address of the header.
            return candidates
                .next()
                .and_then(|a| a.parse().ok())
                .unwrap_or(peer);
        }
        let mut found = peer;
        for c in candidates {
            match c.parse::<IpAddr>() {
                Ok(ip) => {
                    found = ip;
                    if !self.trusts(ip) {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn real_ip_from_trusted_peer_only() {
        let cfg = RealIpConfig {
            header: HeaderName::from_static("x-real-ip"),
            trusted: vec!["127.0.0.1/32".parse().unwrap()],
            recursive: false,
            proxy_protocol: false,
        };
        let mut h = HeaderMap::new();
        h.insert("x-real-ip", HeaderValue::from_static("10.1.1.1"));
        assert_eq!(
            cfg.client_addr("127.0.0.1".parse().unwrap(), &h),
            "10.1.1.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            cfg.client_addr("127.0.0.2".parse().unwrap(), &h),
            "127.0.0.2".parse::<IpAddr>().unwrap()
        );
        h.insert("x-real-ip", HeaderValue::from_static("garbage"));
        assert_eq!(
            cfg.client_addr("127.0.0.1".parse().unwrap(), &h),
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn recursive_xff_skips_trusted_hops() {
        let cfg = RealIpConfig {
            header: HeaderName::from_static("x-forwarded-for"),
            trusted: vec![
                "127.0.0.0/8".parse().unwrap(),
                "10.0.0.0/8".parse().unwrap(),
            ],
            recursive: true,
            proxy_protocol: false,
        };
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            HeaderValue::from_static("1.2.3.4, 10.0.0.2, 127.0.0.5"),
        );
        assert_eq!(
            cfg.client_addr("127.0.0.1".parse().unwrap(), &h),
            "1.2.3.4".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn proxy_protocol_names_no_request_header() {
        let cfg = RealIpConfig::new(
            "proxy_protocol",
            vec!["127.0.0.1/32".parse().unwrap()],
            false,
        );
        assert!(cfg.proxy_protocol);
        let mut h = HeaderMap::new();
        h.insert("proxy_protocol", HeaderValue::from_static("10.1.1.1"));
        h.insert("x-real-ip", HeaderValue::from_static("10.1.1.2"));
        assert_eq!(
            cfg.client_addr("127.0.0.1".parse().unwrap(), &h),
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
        let cfg = RealIpConfig::new("X-Forwarded-For", Vec::new(), false);
        assert_eq!(cfg.header.as_str(), "x-forwarded-for");
        assert!(!cfg.proxy_protocol);
    }
}
