//! The value types of config.yaml keys that take more than a plain value (listeners, worker
//! counts, trusted networks, metric labels); `de` parses them as APISIX reads them.

use std::net::IpAddr;

use ipnet::IpNet;

/// One data-plane listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenAddr {
    pub ip: IpAddr,
    pub port: u16,
    pub enable_http2: bool,
    /// `apisix.ssl.listen[].enable_http3`: HTTP/3 over QUIC on the same port (UDP) beside the
    /// TLS listener. Read on ssl listeners only, as APISIX reads it.
    pub enable_http3: bool,
    /// The entry named no address (a bare port, or a map without `ip`): with
    /// `apisix.enable_ipv6` APISIX also listens on `[::]` for it.
    pub any_address: bool,
}

impl ListenAddr {
    /// `port` on every IPv4 address, HTTP/2 on, HTTP/3 off (APISIX's defaults).
    pub fn port(port: u16) -> ListenAddr {
        ListenAddr {
            ip: IpAddr::from([0, 0, 0, 0]),
            port,
            enable_http2: true,
            enable_http3: false,
            any_address: true,
        }
    }
}

/// `nginx_config.worker_processes`: `auto` or a count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorkerProcesses {
    #[default]
    Auto,
    Count(usize),
}

impl WorkerProcesses {
    /// The number of workers to run: `auto` is one per available CPU.
    pub fn resolve(&self) -> usize {
        match *self {
            WorkerProcesses::Auto => std::thread::available_parallelism().map_or(1, |n| n.get()),
            WorkerProcesses::Count(n) => n.max(1),
        }
    }
}

/// `real_ip_from`, parsed: the trusted networks, and whether `"unix:"` (peers on a Unix
/// socket) was listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RealIpFrom {
    pub nets: Vec<IpNet>,
    pub unix: bool,
}

impl Default for RealIpFrom {
    fn default() -> Self {
        RealIpFrom {
            nets: vec![IpNet::from(IpAddr::from([127, 0, 0, 1]))],
            unix: true,
        }
    }
}

impl RealIpFrom {
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|n| n.contains(&ip))
    }
}

/// One `- label: $variable` entry of `extra_labels`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtraLabel {
    /// The label name.
    pub name: String,
    /// The value as written (`$upstream_addr`).
    pub value: String,
}

impl ExtraLabel {
    /// The variable whose value the label takes: APISIX drops the first character of the
    /// value (`v:sub(2)`), whatever it is, so `upstream_addr` (no `$`) names `pstream_addr`.
    pub fn variable(&self) -> &str {
        let mut chars = self.value.chars();
        chars.next();
        chars.as_str()
    }
}
