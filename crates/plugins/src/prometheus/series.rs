//! Lock-free series storage for the hot path.
//!
//! A [`SeriesGroup`] holds every series of one `(route, service)` label pair. Within it a
//! series is named by a 64-bit key packed from the request-time label values (status code,
//! response source, matched uri/host ids interned at compile time, node IPv4 address, latency
//! or bandwidth type), so recording a request is a few probes of a small open-addressing table
//! of atomics: no label strings, no locks, no allocation once the series exists. Keys that do
//! not fit (IPv6 nodes, many uris) go to a mutex-guarded overflow map.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

const TABLE_SLOTS: usize = 16;

struct Slot<V> {
    key: AtomicU64,
    value: OnceLock<V>,
}

/// A fixed-size open-addressing table whose slots are claimed with one CAS and never freed
/// (a group lives as long as its route).
pub struct AtomicTable<V> {
    slots: Box<[Slot<V>]>,
}

impl<V> AtomicTable<V> {
    fn new() -> AtomicTable<V> {
        AtomicTable {
            slots: (0..TABLE_SLOTS)
                .map(|_| Slot {
                    key: AtomicU64::new(0),
                    value: OnceLock::new(),
                })
                .collect(),
        }
    }

    /// The value for `key` (non-zero), created by `init` on first use; `None` when full.
    fn get_or_insert(&self, key: u64, init: impl Fn() -> V) -> Option<&V> {
        let n = self.slots.len();
        let start = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & (n - 1);
        for i in 0..n {
            let slot = &self.slots[(start + i) & (n - 1)];
            let k = slot.key.load(Ordering::Acquire);
            if k == key {
                return Some(slot.value.get_or_init(&init));
            }
            if k == 0 {
                match slot
                    .key
                    .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => return Some(slot.value.get_or_init(&init)),
                    Err(actual) if actual == key => return Some(slot.value.get_or_init(&init)),
                    Err(_) => continue,
                }
            }
        }
        None
    }

    fn iter(&self) -> impl Iterator<Item = (u64, &V)> {
        self.slots.iter().filter_map(|s| {
            let k = s.key.load(Ordering::Acquire);
            (k != 0).then(|| s.value.get().map(|v| (k, v))).flatten()
        })
    }
}

/// A histogram: per-bucket (not cumulative) counts, the last one for `+Inf`, and the sum.
pub struct Histogram {
    counts: Box<[AtomicU64]>,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn new(buckets: usize) -> Histogram {
        Histogram {
            counts: (0..=buckets).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
        }
    }

    fn observe(&self, bucket: usize, micros: u64) {
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramValue {
        HistogramValue {
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            sum_micros: self.sum_micros.load(Ordering::Relaxed),
        }
    }
}

/// A histogram read for export.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HistogramValue {
    pub counts: Vec<u64>,
    pub sum_micros: u64,
}

/// `type` of `http_latency`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LatencyType {
    Request = 0,
    Upstream = 1,
    Apisix = 2,
}

impl LatencyType {
    pub fn as_str(self) -> &'static str {
        match self {
            LatencyType::Request => "request",
            LatencyType::Upstream => "upstream",
            LatencyType::Apisix => "apisix",
        }
    }

    fn from_bits(b: u64) -> LatencyType {
        match b {
            0 => LatencyType::Request,
            1 => LatencyType::Upstream,
            _ => LatencyType::Apisix,
        }
    }
}

/// `type` of `bandwidth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    Ingress = 0,
    Egress = 1,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

/// The request-time labels of one `http_status` series.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StatusLabels {
    pub code: u16,
    /// `response_source`: 0 upstream, 1 nginx, 2 apisix.
    pub source: u8,
    /// Interned matched uri / host (0 = `""`).
    pub uri: u16,
    pub host: u16,
    pub node: Option<IpAddr>,
}

const TOP: u64 = 1 << 63;
const NODE_BITS: u32 = 33;

/// Packs a node into 33 bits: bit 32 set for an IPv4 address; `None` for what does not fit.
fn node_bits(node: Option<IpAddr>) -> Option<u64> {
    match node {
        None => Some(0),
        Some(IpAddr::V4(v4)) => Some((1 << 32) | u64::from(u32::from(v4))),
        Some(IpAddr::V6(_)) => None,
    }
}

fn node_from_bits(bits: u64) -> Option<IpAddr> {
    (bits & (1 << 32) != 0)
        .then(|| IpAddr::V4(std::net::Ipv4Addr::from((bits & 0xffff_ffff) as u32)))
}

impl StatusLabels {
    fn pack(&self) -> Option<u64> {
        if self.code > 1023 || self.uri > 255 || self.host > 255 || self.source > 3 {
            return None;
        }
        let node = node_bits(self.node)?;
        Some(
            TOP | (u64::from(self.source) << 61)
                | (u64::from(self.code) << 51)
                | (u64::from(self.uri) << 43)
                | (u64::from(self.host) << 35)
                | node,
        )
    }

    fn unpack(k: u64) -> StatusLabels {
        StatusLabels {
            source: ((k >> 61) & 0x3) as u8,
            code: ((k >> 51) & 0x3ff) as u16,
            uri: ((k >> 43) & 0xff) as u16,
            host: ((k >> 35) & 0xff) as u16,
            node: node_from_bits(k & ((1 << NODE_BITS) - 1)),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum OverflowKey {
    Status(StatusLabels),
    Latency(LatencyType, Option<IpAddr>),
    Bandwidth(Direction, Option<IpAddr>),
}

#[derive(Default)]
struct Overflow {
    counters: HashMap<OverflowKey, u64>,
    histograms: HashMap<OverflowKey, HistogramValue>,
}

/// Every series of one `(route, service)` label pair.
pub struct SeriesGroup {
    pub route: String,
    pub service: String,
    /// Interned label texts: index 0 is `""`.
    uris: Mutex<Vec<String>>,
    hosts: Mutex<Vec<String>>,
    status: AtomicTable<AtomicU64>,
    latency: AtomicTable<Histogram>,
    bandwidth: AtomicTable<AtomicU64>,
    overflow: Mutex<Overflow>,
    buckets: usize,
}

/// One group read for export.
#[derive(Debug, Default)]
pub struct GroupValues {
    pub status: Vec<(StatusLabels, u64)>,
    pub latency: Vec<((LatencyType, Option<IpAddr>), HistogramValue)>,
    pub bandwidth: Vec<((Direction, Option<IpAddr>), u64)>,
    pub uris: Vec<String>,
    pub hosts: Vec<String>,
}

fn intern(table: &Mutex<Vec<String>>, text: &str) -> u16 {
    if text.is_empty() {
        return 0;
    }
    let mut t = table.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = t.iter().position(|s| s == text) {
        return i as u16;
    }
    t.push(text.to_owned());
    (t.len() - 1).min(u16::MAX as usize) as u16
}

impl SeriesGroup {
    pub fn new(route: String, service: String, buckets: usize) -> SeriesGroup {
        SeriesGroup {
            route,
            service,
            uris: Mutex::new(vec![String::new()]),
            hosts: Mutex::new(vec![String::new()]),
            status: AtomicTable::new(),
            latency: AtomicTable::new(),
            bandwidth: AtomicTable::new(),
            overflow: Mutex::new(Overflow::default()),
            buckets,
        }
    }

    /// The id of a matched-uri label (compile time).
    pub fn uri_id(&self, uri: &str) -> u16 {
        intern(&self.uris, uri)
    }

    pub fn host_id(&self, host: &str) -> u16 {
        intern(&self.hosts, host)
    }

    fn overflow(&self) -> std::sync::MutexGuard<'_, Overflow> {
        self.overflow.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn count_status(&self, labels: StatusLabels) {
        if let Some(c) = labels
            .pack()
            .and_then(|k| self.status.get_or_insert(k, || AtomicU64::new(0)))
        {
            c.fetch_add(1, Ordering::Relaxed);
            return;
        }
        *self
            .overflow()
            .counters
            .entry(OverflowKey::Status(labels))
            .or_default() += 1;
    }

    pub fn observe_latency(
        &self,
        kind: LatencyType,
        node: Option<IpAddr>,
        bucket: usize,
        micros: u64,
    ) {
        let key = node_bits(node).map(|n| TOP | ((kind as u64) << NODE_BITS) | n);
        let buckets = self.buckets;
        if let Some(h) = key.and_then(|k| self.latency.get_or_insert(k, || Histogram::new(buckets)))
        {
            h.observe(bucket, micros);
            return;
        }
        let mut o = self.overflow();
        let h = o
            .histograms
            .entry(OverflowKey::Latency(kind, node))
            .or_insert_with(|| HistogramValue {
                counts: vec![0; buckets + 1],
                sum_micros: 0,
            });
        h.counts[bucket] += 1;
        h.sum_micros += micros;
    }

    pub fn add_bandwidth(&self, dir: Direction, node: Option<IpAddr>, bytes: u64) {
        let key = node_bits(node).map(|n| TOP | ((dir as u64) << NODE_BITS) | n);
        if let Some(c) = key.and_then(|k| self.bandwidth.get_or_insert(k, || AtomicU64::new(0))) {
            c.fetch_add(bytes, Ordering::Relaxed);
            return;
        }
        *self
            .overflow()
            .counters
            .entry(OverflowKey::Bandwidth(dir, node))
            .or_default() += bytes;
    }

    /// Everything recorded so far.
    pub fn read(&self) -> GroupValues {
        let mut v = GroupValues {
            uris: self.uris.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            hosts: self.hosts.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            ..Default::default()
        };
        for (k, c) in self.status.iter() {
            v.status
                .push((StatusLabels::unpack(k), c.load(Ordering::Relaxed)));
        }
        let mask = (1 << NODE_BITS) - 1;
        for (k, h) in self.latency.iter() {
            let kind = LatencyType::from_bits((k >> NODE_BITS) & 0x3);
            v.latency
                .push(((kind, node_from_bits(k & mask)), h.snapshot()));
        }
        for (k, c) in self.bandwidth.iter() {
            let dir = if (k >> NODE_BITS) & 1 == 0 {
                Direction::Ingress
            } else {
                Direction::Egress
            };
            v.bandwidth
                .push(((dir, node_from_bits(k & mask)), c.load(Ordering::Relaxed)));
        }
        let o = self.overflow();
        for (k, n) in &o.counters {
            match *k {
                OverflowKey::Status(l) => v.status.push((l, *n)),
                OverflowKey::Bandwidth(d, node) => v.bandwidth.push(((d, node), *n)),
                OverflowKey::Latency(..) => {}
            }
        }
        for (k, h) in &o.histograms {
            if let OverflowKey::Latency(t, node) = *k {
                v.latency.push(((t, node), h.clone()));
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_keys_round_trip() {
        let l = StatusLabels {
            code: 503,
            source: 2,
            uri: 7,
            host: 0,
            node: Some("10.1.2.3".parse().unwrap()),
        };
        assert_eq!(StatusLabels::unpack(l.pack().unwrap()), l);
        let none = StatusLabels { node: None, ..l };
        assert_eq!(StatusLabels::unpack(none.pack().unwrap()), none);
        assert!(StatusLabels {
            node: Some("::1".parse().unwrap()),
            ..l
        }
        .pack()
        .is_none());
    }

    #[test]
    fn table_fills_then_overflows() {
        let g = SeriesGroup::new("r".into(), "".into(), 3);
        for code in 100..140u16 {
            g.count_status(StatusLabels {
                code,
                source: 0,
                uri: 0,
                host: 0,
                node: None,
            });
        }
        g.count_status(StatusLabels {
            code: 100,
            source: 0,
            uri: 0,
            host: 0,
            node: None,
        });
        let v = g.read();
        assert_eq!(v.status.len(), 40);
        assert_eq!(v.status.iter().map(|(_, n)| n).sum::<u64>(), 41);
    }

    #[test]
    fn concurrent_counts_are_exact() {
        let g = std::sync::Arc::new(SeriesGroup::new("r".into(), "".into(), 3));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let g = g.clone();
                std::thread::spawn(move || {
                    for i in 0..1000u16 {
                        g.count_status(StatusLabels {
                            code: 200 + i % 3,
                            source: 0,
                            uri: 0,
                            host: 0,
                            node: None,
                        });
                        g.observe_latency(LatencyType::Request, None, 1, 1500);
                        g.add_bandwidth(Direction::Egress, Some("127.0.0.1".parse().unwrap()), 10);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let v = g.read();
        assert_eq!(v.status.iter().map(|(_, n)| n).sum::<u64>(), 4000);
        assert_eq!(v.latency[0].1.counts, vec![0, 4000, 0, 0]);
        assert_eq!(v.latency[0].1.sum_micros, 6_000_000);
        assert_eq!(
            v.bandwidth,
            vec![(
                (Direction::Egress, Some("127.0.0.1".parse().unwrap())),
                40_000
            )]
        );
    }

    #[test]
    fn interned_ids() {
        let g = SeriesGroup::new("r".into(), "".into(), 3);
        assert_eq!(g.uri_id(""), 0);
        assert_eq!(g.uri_id("/a"), 1);
        assert_eq!(g.uri_id("/b"), 2);
        assert_eq!(g.uri_id("/a"), 1);
    }
}
