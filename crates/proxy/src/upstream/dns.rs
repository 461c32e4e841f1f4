//! Name resolution for upstream nodes given by host name and for `discovery_type: dns`,
//! without blocking a worker.
//!
//! As APISIX's `core.resolver`, the hosts file comes first and IPv4 is preferred there (so
//! `localhost` is 127.0.0.1). Other names go to a pure-Rust resolver (hickory) on the executor
//! handle given in, never on a worker: the snapshot compile uses the last good answer it has and
//! [`crate::upstream`] re-resolves each name when its TTL runs out. Unlike APISIX, which keeps
//! one address of a name, every address is used. A failed lookup keeps the last good addresses
//! and is logged once per change of outcome.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hickory_resolver::config::{NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::TokioResolver;

/// Re-resolution never runs more often than this, whatever the TTL.
const MIN_TTL: Duration = Duration::from_secs(1);
/// How soon a failed lookup is tried again.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(5);

/// One answer: addresses (with SRV's port, weight and priority where the record has them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub ip: IpAddr,
    /// SRV's port (0: none).
    pub port: u16,
    /// SRV's weight (1 for A/AAAA).
    pub weight: u32,
    /// SRV's priority, negated as APISIX does (lower SRV priority is picked first).
    pub priority: i64,
}

#[derive(Clone, Debug)]
pub struct Answer {
    pub records: Vec<Record>,
    pub valid_until: Instant,
}

/// What a name is resolved for: a domain node (A, else AAAA) or DNS discovery (its `order`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Purpose {
    Node,
    Discovery,
}

#[derive(Default)]
struct Cached {
    answer: Option<Answer>,
    last_error: Option<String>,
}

/// The process' resolver for upstream names.
pub struct DnsResolver {
    hosts: HashMap<String, Vec<IpAddr>>,
    nodes: Option<TokioResolver>,
    discovery: Option<TokioResolver>,
    discovery_order: Vec<String>,
    enable_ipv6: bool,
    valid_override: Option<Duration>,
    cache: Mutex<HashMap<(Purpose, String), Cached>>,
    executor: Option<tokio::runtime::Handle>,
}

impl std::fmt::Debug for DnsResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsResolver")
            .field("hosts", &self.hosts.len())
            .finish()
    }
}

/// How the binary configures the resolver.
#[derive(Clone, Debug, Default)]
pub struct DnsOptions {
    /// `apisix.dns_resolver` (empty: the system's resolv.conf).
    pub servers: Vec<String>,
    pub valid: Option<Duration>,
    pub enable_ipv6: bool,
    /// `discovery.dns.servers` (`None`: no DNS discovery configured).
    pub discovery_servers: Option<Vec<String>>,
    pub discovery_order: Vec<String>,
    /// The hosts file (`/etc/hosts`).
    pub hosts_file: Option<std::path::PathBuf>,
}

/// Parses `ip` or `ip:port` (port 53 by default).
fn server_addr(s: &str) -> Option<SocketAddr> {
    s.parse::<SocketAddr>()
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 53)))
        .or_else(|| {
            s.trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
                .ok()
                .map(|ip| SocketAddr::new(ip, 53))
        })
}

fn resolver_for(servers: &[String]) -> Option<TokioResolver> {
    let built = if servers.is_empty() {
        TokioResolver::builder_tokio().and_then(|b| b.build())
    } else {
        let mut group = Vec::new();
        for s in servers {
            match server_addr(s) {
                Some(addr) => {
                    // UDP, then TCP for truncated answers, both on the given port.
                    let mut server = NameServerConfig::udp_and_tcp(addr.ip());
                    for c in &mut server.connections {
                        c.port = addr.port();
                    }
                    group.push(server);
                }
                None => tracing::warn!(server = %s, "invalid DNS server address ignored"),
            }
        }
        let config = ResolverConfig::from_name_servers(group);
        TokioResolver::builder_with_config(config, TokioRuntimeProvider::default()).build()
    };
    match built {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(error = %e, "cannot set up the DNS resolver; domain nodes resolve from the hosts file only");
            None
        }
    }
}

/// The addresses of `name`'s `kind` records (A or AAAA), and until when they are valid.
async fn addresses(
    r: &TokioResolver,
    name: &str,
    kind: RecordType,
) -> Result<(Vec<IpAddr>, Instant), String> {
    let lookup = r.lookup(name, kind).await.map_err(|e| e.to_string())?;
    let ips = lookup
        .answers()
        .iter()
        .filter_map(|record| match &record.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect();
    Ok((ips, lookup.valid_until()))
}

/// An address answer as records.
fn answer_of((ips, valid_until): (Vec<IpAddr>, Instant)) -> Answer {
    Answer {
        records: ips.into_iter().map(plain).collect(),
        valid_until,
    }
}

/// `/etc/hosts`: name → addresses in file order.
pub fn parse_hosts(text: &str) -> HashMap<String, Vec<IpAddr>> {
    let mut out: HashMap<String, Vec<IpAddr>> = HashMap::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("");
        let mut fields = line.split_whitespace();
        let Some(ip) = fields.next().and_then(|f| f.parse::<IpAddr>().ok()) else {
            continue;
        };
        for name in fields {
            let list = out.entry(name.to_ascii_lowercase()).or_default();
            if !list.contains(&ip) {
                list.push(ip);
            }
        }
    }
    out
}

impl DnsResolver {
    /// Without an executor, names outside the hosts file are not resolved (tests, tools).
    pub fn new(options: &DnsOptions, executor: Option<tokio::runtime::Handle>) -> DnsResolver {
        let path = options
            .hosts_file
            .clone()
            .unwrap_or_else(|| "/etc/hosts".into());
        let hosts = std::fs::read_to_string(&path)
            .map(|t| parse_hosts(&t))
            .unwrap_or_default();
        // hickory's resolvers need a tokio context to be built.
        let _guard = executor.as_ref().map(|h| h.enter());
        let (nodes, discovery) = if executor.is_some() {
            (
                resolver_for(&options.servers),
                options
                    .discovery_servers
                    .as_ref()
                    .and_then(|s| resolver_for(s)),
            )
        } else {
            (None, None)
        };
        DnsResolver {
            hosts,
            nodes,
            discovery,
            discovery_order: if options.discovery_order.is_empty() {
                ["last", "SRV", "A", "AAAA", "CNAME"]
                    .map(String::from)
                    .to_vec()
            } else {
                options.discovery_order.clone()
            },
            enable_ipv6: options.enable_ipv6,
            valid_override: options.valid,
            cache: Mutex::new(HashMap::new()),
            executor,
        }
    }

    /// A resolver that knows only `hosts` (tests).
    pub fn with_hosts(hosts: HashMap<String, Vec<IpAddr>>) -> DnsResolver {
        DnsResolver {
            hosts,
            nodes: None,
            discovery: None,
            discovery_order: Vec::new(),
            enable_ipv6: true,
            valid_override: None,
            cache: Mutex::new(HashMap::new()),
            executor: None,
        }
    }

    pub(crate) fn executor(&self) -> Option<&tokio::runtime::Handle> {
        self.executor.as_ref()
    }

    /// The hosts file's answer: its IPv4 addresses, else (with IPv6 enabled) its IPv6 ones.
    fn hosts_answer(&self, name: &str) -> Option<Vec<Record>> {
        let list = self.hosts.get(&name.to_ascii_lowercase())?;
        let v4: Vec<IpAddr> = list.iter().filter(|i| i.is_ipv4()).copied().collect();
        let ips = if !v4.is_empty() {
            v4
        } else if self.enable_ipv6 {
            list.clone()
        } else {
            return None;
        };
        Some(ips.into_iter().map(plain).collect())
    }

    /// What is known now, without waiting: the hosts file, else the last good answer.
    pub fn known(&self, purpose: Purpose, name: &str) -> Option<Answer> {
        if purpose == Purpose::Node {
            if let Some(records) = self.hosts_answer(name) {
                return Some(Answer {
                    records,
                    valid_until: far_future(),
                });
            }
        }
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .get(&(purpose, name.to_string()))
            .and_then(|c| c.answer.clone())
    }

    /// Resolves `name` (on the executor's tasks). On failure the last good answer stays and the
    /// error is returned; it is logged when it differs from the previous outcome.
    pub async fn resolve(&self, purpose: Purpose, name: &str) -> Result<Answer, String> {
        if let Some(a) = self.known(purpose, name).filter(|_| {
            purpose == Purpose::Node && self.hosts.contains_key(&name.to_ascii_lowercase())
        }) {
            return Ok(a);
        }
        let result = match purpose {
            Purpose::Node => self.lookup_node(name).await,
            Purpose::Discovery => self.lookup_discovery(name).await,
        };
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let entry = cache.entry((purpose, name.to_string())).or_default();
        match result {
            Ok(mut answer) => {
                if let Some(v) = self.valid_override {
                    answer.valid_until = Instant::now() + v;
                }
                if entry.last_error.take().is_some()
                    || entry.answer.as_ref().map(|a| &a.records) != Some(&answer.records)
                {
                    tracing::info!(name, addresses = ?answer.records.iter().map(|r| r.ip).collect::<Vec<_>>(), "upstream name resolved");
                }
                entry.answer = Some(answer.clone());
                Ok(answer)
            }
            Err(e) => {
                if entry.last_error.as_deref() != Some(e.as_str()) {
                    tracing::warn!(name, error = %e, keeping = entry.answer.is_some(), "cannot resolve upstream name; last good addresses kept");
                }
                entry.last_error = Some(e.clone());
                Err(e)
            }
        }
    }

    async fn lookup_node(&self, name: &str) -> Result<Answer, String> {
        let r = self.nodes.as_ref().ok_or("no DNS resolver")?;
        // APISIX's client order: A records when there are any, else AAAA.
        match addresses(r, name, RecordType::A).await {
            Ok(v4) if !v4.0.is_empty() => Ok(answer_of(v4)),
            first => {
                if self.enable_ipv6 {
                    if let Ok(v6) = addresses(r, name, RecordType::AAAA).await {
                        if !v6.0.is_empty() {
                            return Ok(answer_of(v6));
                        }
                    }
                }
                Err(match first {
                    Err(e) => e,
                    Ok(_) => format!("no address for {name}"),
                })
            }
        }
    }

    /// `discovery/dns`: the record types of `order` in turn (`last` = the type that answered
    /// last time, CNAME is followed by the A/AAAA lookups anyway).
    async fn lookup_discovery(&self, name: &str) -> Result<Answer, String> {
        let r = self
            .discovery
            .as_ref()
            .ok_or("discovery.dns is not configured")?;
        let mut last_err = format!("no record for {name}");
        for kind in &self.discovery_order {
            match kind.as_str() {
                "SRV" => match r.lookup(name, RecordType::SRV).await {
                    Ok(l) => {
                        let valid_until = l.valid_until();
                        let mut records = Vec::new();
                        let srvs = l.answers().iter().filter_map(|record| match &record.data {
                            RData::SRV(srv) => Some(srv),
                            _ => None,
                        });
                        for srv in srvs {
                            let target = srv.target.to_utf8();
                            let ips: Vec<IpAddr> = match r.lookup_ip(target.as_str()).await {
                                Ok(ips) => ips.iter().collect(),
                                Err(_) => continue,
                            };
                            for ip in ips {
                                records.push(Record {
                                    ip,
                                    port: srv.port,
                                    weight: u32::from(srv.weight),
                                    priority: -i64::from(srv.priority),
                                });
                            }
                        }
                        if !records.is_empty() {
                            return Ok(Answer {
                                records,
                                valid_until,
                            });
                        }
                    }
                    Err(e) => last_err = e.to_string(),
                },
                "A" | "AAAA" => {
                    let kind = if kind == "A" {
                        RecordType::A
                    } else {
                        RecordType::AAAA
                    };
                    match addresses(r, name, kind).await {
                        Ok(found) if !found.0.is_empty() => return Ok(answer_of(found)),
                        Ok(_) => {}
                        Err(e) => last_err = e,
                    }
                }
                _ => {}
            }
        }
        Err(last_err)
    }
}

fn plain(ip: IpAddr) -> Record {
    Record {
        ip,
        port: 0,
        weight: 1,
        priority: 0,
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(365 * 24 * 3600)
}

/// When to look again: at the TTL's end (never sooner than a second), or soon after a failure.
pub fn next_refresh(answer: Option<&Answer>, failed: bool) -> Instant {
    let now = Instant::now();
    if failed {
        return now + RETRY_AFTER_FAILURE;
    }
    match answer {
        Some(a) => a.valid_until.max(now + MIN_TTL),
        None => now + RETRY_AFTER_FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_file_prefers_ipv4() {
        let hosts = parse_hosts("::1 localhost ip6-localhost\n127.0.0.1\tlocalhost # loop\n# x\n10.0.0.9 only6 \n::2 v6only\n");
        let r = DnsResolver::with_hosts(hosts);
        let a = r.known(Purpose::Node, "LocalHost").unwrap();
        assert_eq!(a.records.len(), 1);
        assert_eq!(a.records[0].ip, "127.0.0.1".parse::<IpAddr>().unwrap());
        let a = r.known(Purpose::Node, "v6only").unwrap();
        assert_eq!(a.records[0].ip, "::2".parse::<IpAddr>().unwrap());
        assert!(r.known(Purpose::Node, "nowhere.example").is_none());
    }

    #[test]
    fn server_addresses() {
        assert_eq!(
            server_addr("127.0.0.1"),
            Some("127.0.0.1:53".parse().unwrap())
        );
        assert_eq!(
            server_addr("127.0.0.1:5353"),
            Some("127.0.0.1:5353".parse().unwrap())
        );
        assert_eq!(server_addr("[::1]"), Some("[::1]:53".parse().unwrap()));
        assert_eq!(server_addr("nope"), None);
    }
}
