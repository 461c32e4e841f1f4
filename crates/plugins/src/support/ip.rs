//! Address lists of plugin confs (`core.ip.create_ip_matcher`): IPv4 and IPv6 addresses and
//! CIDR blocks.

use std::net::IpAddr;

use ipnet::IpNet;

/// A compiled list of addresses and blocks.
#[derive(Clone, Debug, Default)]
pub struct IpMatcher(Vec<IpNet>);

/// One entry: an address (a /32 or /128 block) or a CIDR block; `None` if it is neither
/// (`core.ip.validate_cidr_or_ip`).
pub fn parse_entry(s: &str) -> Option<IpNet> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(IpNet::from(ip));
    }
    s.parse::<IpNet>().ok()
}

impl IpMatcher {
    /// The list, or `invalid ip address: <entry>` for the first entry that is not one.
    pub fn new<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<IpMatcher, String> {
        entries
            .into_iter()
            .map(|e| parse_entry(e).ok_or_else(|| format!("invalid ip address: {e}")))
            .collect::<Result<Vec<_>, _>>()
            .map(IpMatcher)
    }

    /// The list of a conf field (strings), checked.
    pub fn from_conf(v: Option<&serde_json::Value>) -> Result<Option<IpMatcher>, String> {
        let Some(list) = v.and_then(serde_json::Value::as_array) else {
            return Ok(None);
        };
        IpMatcher::new(list.iter().filter_map(serde_json::Value::as_str)).map(Some)
    }

    pub fn matches(&self, ip: IpAddr) -> bool {
        // An IPv4 client on a dual-stack socket arrives as ::ffff:a.b.c.d.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.0.iter().any(|n| n.contains(&ip))
    }

    /// [`IpMatcher::matches`] on text; text that is no address matches nothing.
    pub fn matches_text(&self, ip: &str) -> bool {
        ip.trim().parse().is_ok_and(|ip| self.matches(ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_blocks() {
        let m = IpMatcher::new(["127.0.0.1", "10.0.0.0/8", "2001:db8::/32", "::1"]).unwrap();
        for ip in [
            "127.0.0.1",
            "10.2.3.4",
            "2001:db8::5",
            "::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(m.matches(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["127.0.0.2", "11.0.0.1", "2001:db9::1"] {
            assert!(!m.matches(ip.parse().unwrap()), "{ip}");
        }
        assert!(!m.matches_text("nope"));
        assert_eq!(
            IpMatcher::new(["1.1.1.1/33"]).unwrap_err(),
            "invalid ip address: 1.1.1.1/33"
        );
        assert!(IpMatcher::new(["::1/129"]).is_err());
    }
}
