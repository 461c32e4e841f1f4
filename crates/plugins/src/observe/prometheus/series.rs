//! Lock-free series storage for the hot path.
//!
//! A [`SeriesGroup`] holds every series of one `(route, service)` label pair. Within it a
//! series is named by a 64-bit key packed from the request-time label values (status code,
//! response source, matched uri/host ids interned at compile time, node IPv4 address, latency
//! or bandwidth type), so recording a request is a few probes of a small open-addressing table
//! of atomics: no label strings, no locks, no allocation once the series exists. Keys that do
//! not fit (IPv6 nodes, many uris) go to a mutex-guarded overflow map.
//!
//! The `consumer` label and extra labels (`plugin_attr.prometheus.metrics.<name>.extra_labels`)
//! take their values from the request (its consumer, request variables), so they cannot be
//! resolved at compile time: a metric keeps one such table per distinct tuple of consumer and
//! extra values, in a map behind a read-write lock that only requests with a consumer, or of
//! a metric with extra labels, take. For the others that map is never touched.
//!
//! A metric with an `expire` stamps each series with the time of its last update; a render
//! leaves out (and resets, or frees) series not updated for that long, as nginx's shared dict
//! lets a key with an expiry lapse. Without `expire` nothing is stamped. A histogram lapses as
//! a whole: in APISIX each bucket line is its own key, and a bucket that recent observations
//! did not reach could lapse alone and leave a histogram with holes.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, RwLock};

use smallvec::SmallVec;

const TABLE_SLOTS: usize = 16;
/// Series sharing one tuple of extra-label values differ only in the request-time labels
/// (status, node ...), so their tables are smaller; the overflow map takes the rest.
const EXTRA_TABLE_SLOTS: usize = 4;

/// `expire` of each HTTP metric, in milliseconds; 0 = never.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Expire {
    pub status: u64,
    pub latency: u64,
    pub bandwidth: u64,
}

impl Expire {
    pub fn any(&self) -> bool {
        self.status > 0 || self.latency > 0 || self.bandwidth > 0
    }
}

struct Slot<V> {
    key: AtomicU64,
    /// The monotonic milliseconds (the gateway clock's, never 0: a stamp of 0 marks a series
    /// that is not live) of the last update when the metric expires, else unused (0).
    touched: AtomicU64,
    value: OnceLock<V>,
}

/// A fixed-size open-addressing table whose slots are claimed with one CAS and never freed
/// (a group lives as long as its route; an expired series keeps its slot for its key).
pub struct AtomicTable<V> {
    slots: Box<[Slot<V>]>,
}

impl<V> AtomicTable<V> {
    /// `slots` must be a power of two.
    fn new(slots: usize) -> AtomicTable<V> {
        AtomicTable {
            slots: (0..slots)
                .map(|_| Slot {
                    key: AtomicU64::new(0),
                    touched: AtomicU64::new(0),
                    value: OnceLock::new(),
                })
                .collect(),
        }
    }

    /// The slot for `key` (non-zero), its value created by `init` on first use; `None` when
    /// full.
    fn get_or_insert(&self, key: u64, init: impl Fn() -> V) -> Option<(&Slot<V>, &V)> {
        let n = self.slots.len();
        let start = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & (n - 1);
        for i in 0..n {
            let slot = &self.slots[(start + i) & (n - 1)];
            let k = slot.key.load(Ordering::Acquire);
            if k == key {
                return Some((slot, slot.value.get_or_init(&init)));
            }
            if k == 0 {
                match slot
                    .key
                    .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => return Some((slot, slot.value.get_or_init(&init))),
                    Err(actual) if actual == key => {
                        return Some((slot, slot.value.get_or_init(&init)))
                    }
                    Err(_) => continue,
                }
            }
        }
        None
    }

    fn iter(&self) -> impl Iterator<Item = (u64, &Slot<V>, &V)> {
        self.slots.iter().filter_map(|s| {
            let k = s.key.load(Ordering::Acquire);
            (k != 0).then(|| s.value.get().map(|v| (k, s, v))).flatten()
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

    pub fn snapshot(&self) -> HistogramValue {
        HistogramValue {
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::SeqCst))
                .collect(),
            sum_micros: self.sum_micros.load(Ordering::SeqCst),
        }
    }
}

/// A histogram read for export.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HistogramValue {
    pub counts: Vec<u64>,
    pub sum_micros: u64,
}

/// What one series holds, as atomics in a table slot and as a plain value in the overflow map.
trait Cell: Send + Sync + Sized {
    type Plain: Clone;
    type Update: Copy;
    fn new(buckets: usize) -> Self;
    fn plain(buckets: usize) -> Self::Plain;
    fn apply(&self, u: Self::Update, order: Ordering);
    fn apply_plain(p: &mut Self::Plain, u: Self::Update);
    fn snapshot(&self) -> Self::Plain;
    /// Takes away exactly what `p` read, keeping updates that came after it.
    fn subtract(&self, p: &Self::Plain);
}

impl Cell for AtomicU64 {
    type Plain = u64;
    type Update = u64;

    fn new(_: usize) -> Self {
        AtomicU64::new(0)
    }

    fn plain(_: usize) -> u64 {
        0
    }

    fn apply(&self, n: u64, order: Ordering) {
        self.fetch_add(n, order);
    }

    fn apply_plain(p: &mut u64, n: u64) {
        *p = p.wrapping_add(n);
    }

    fn snapshot(&self) -> u64 {
        self.load(Ordering::SeqCst)
    }

    fn subtract(&self, p: &u64) {
        self.fetch_sub(*p, Ordering::SeqCst);
    }
}

impl Cell for Histogram {
    type Plain = HistogramValue;
    /// (bucket index, microseconds).
    type Update = (usize, u64);

    fn new(buckets: usize) -> Self {
        Histogram::new(buckets)
    }

    fn plain(buckets: usize) -> HistogramValue {
        HistogramValue {
            counts: vec![0; buckets + 1],
            sum_micros: 0,
        }
    }

    fn apply(&self, (bucket, micros): (usize, u64), order: Ordering) {
        self.counts[bucket].fetch_add(1, order);
        self.sum_micros.fetch_add(micros, order);
    }

    fn apply_plain(p: &mut HistogramValue, (bucket, micros): (usize, u64)) {
        p.counts[bucket] += 1;
        p.sum_micros = p.sum_micros.wrapping_add(micros);
    }

    fn snapshot(&self) -> HistogramValue {
        Histogram::snapshot(self)
    }

    fn subtract(&self, p: &HistogramValue) {
        for (c, n) in self.counts.iter().zip(&p.counts) {
            c.fetch_sub(*n, Ordering::SeqCst);
        }
        self.sum_micros.fetch_sub(p.sum_micros, Ordering::SeqCst);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The series of one metric: a table of atomics and its overflow map, keyed by `K` (the
/// request-time labels).
struct Family<C: Cell, K> {
    table: AtomicTable<C>,
    /// Series that do not fit the table, with their last update (0 without expiry).
    overflow: Mutex<HashMap<K, (C::Plain, u64)>>,
}

impl<C: Cell, K: Copy + Eq + Hash> Family<C, K> {
    fn new(slots: usize) -> Self {
        Family {
            table: AtomicTable::new(slots),
            overflow: Mutex::new(HashMap::new()),
        }
    }

    /// Records `u` in the series `key` (`packed`: its table key, `None` when it has none).
    /// `now` is non-zero when the metric expires.
    fn record(&self, packed: Option<u64>, key: K, u: C::Update, now: u64, buckets: usize) {
        if let Some((slot, value)) =
            packed.and_then(|k| self.table.get_or_insert(k, || C::new(buckets)))
        {
            if now == 0 {
                value.apply(u, Ordering::Relaxed);
            } else {
                // Stamp, then add (both SeqCst): a render expiring this series either sees
                // the stamp and keeps it, or read its value before this update (see
                // `collect`), so the update is never subtracted with the old counts.
                slot.touched.store(now, Ordering::SeqCst);
                value.apply(u, Ordering::SeqCst);
            }
            return;
        }
        let mut o = lock(&self.overflow);
        let entry = o.entry(key).or_insert_with(|| (C::plain(buckets), 0));
        C::apply_plain(&mut entry.0, u);
        entry.1 = now;
    }

    /// Appends the live series to `out`. With `expire`, series not updated for that long are
    /// left out: a table slot is reset (it keeps its key and counts from 0 if the series comes
    /// back, as a lapsed shared-dict key starts again), an overflow entry is removed.
    fn collect(
        &self,
        now: u64,
        expire: u64,
        unpack: impl Fn(u64) -> K,
        out: &mut Vec<(K, C::Plain)>,
    ) {
        for (k, slot, value) in self.table.iter() {
            if expire == 0 {
                out.push((unpack(k), value.snapshot()));
                continue;
            }
            let touched = slot.touched.load(Ordering::SeqCst);
            if touched == 0 {
                // Expired earlier, or being created and not stamped yet.
                continue;
            }
            let snapshot = value.snapshot();
            if now.saturating_sub(touched) < expire {
                out.push((unpack(k), snapshot));
                continue;
            }
            // Unstamp it unless an update stamped it since; then take away only what the
            // snapshot (read before the unstamp) saw: later updates count for its next life.
            if slot
                .touched
                .compare_exchange(touched, 0, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                value.subtract(&snapshot);
            } else {
                out.push((unpack(k), value.snapshot()));
            }
        }
        let mut o = lock(&self.overflow);
        if expire > 0 {
            o.retain(|_, (_, touched)| now.saturating_sub(*touched) < expire);
        }
        out.extend(o.iter().map(|(k, (v, _))| (*k, v.clone())));
    }

    /// Whether no series is live any more (with writers kept out: the caller holds the write
    /// lock of the map this family is in).
    fn idle(&self, now: u64, expire: u64) -> bool {
        let lapsed = |touched: u64| touched == 0 || now.saturating_sub(touched) >= expire;
        expire > 0
            && self
                .table
                .iter()
                .all(|(_, s, _)| lapsed(s.touched.load(Ordering::SeqCst)))
            && lock(&self.overflow).values().all(|(_, t)| lapsed(*t))
    }
}

/// Extra-label values packed into one map key: each value's length (u32, little-endian), then
/// its bytes. Built on the stack for the usual short values.
pub type ExtraKey = SmallVec<[u8; 64]>;

/// Appends one extra-label value to `key`.
pub fn push_extra_value(key: &mut ExtraKey, value: &str) {
    key.extend_from_slice(&(value.len() as u32).to_le_bytes());
    key.extend_from_slice(value.as_bytes());
}

fn decode_extra(mut key: &[u8]) -> Vec<String> {
    let mut values = Vec::new();
    while key.len() >= 4 {
        let len = u32::from_le_bytes([key[0], key[1], key[2], key[3]]) as usize;
        let end = (4 + len).min(key.len());
        values.push(String::from_utf8_lossy(&key[4..end]).into_owned());
        key = &key[end..];
    }
    values
}

/// The families of one metric by extra-label values.
struct ExtraMap<F> {
    map: RwLock<HashMap<Box<[u8]>, F>>,
}

impl<F> ExtraMap<F> {
    fn new() -> Self {
        ExtraMap {
            map: RwLock::new(HashMap::new()),
        }
    }

    /// Runs `f` on the family of `key` (created by `new` on first use) with the map locked,
    /// shared in the common case, so no render frees the family under the update.
    fn with(&self, key: &[u8], new: impl FnOnce() -> F, f: impl FnOnce(&F)) {
        {
            let map = self.map.read().unwrap_or_else(|e| e.into_inner());
            if let Some(family) = map.get(key) {
                f(family);
                return;
            }
        }
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        f(map.entry(Box::from(key)).or_insert_with(new));
    }

    /// Reads every family into `out` (one [`GroupValues`] per tuple of extra values), then
    /// frees the families whose series all expired.
    fn collect(
        &self,
        expire: u64,
        read: impl Fn(&F, &mut GroupValues),
        idle: impl Fn(&F) -> bool,
        out: &mut Vec<(Vec<String>, GroupValues)>,
    ) {
        let mut lapsed: Vec<Box<[u8]>> = Vec::new();
        {
            let map = self.map.read().unwrap_or_else(|e| e.into_inner());
            for (key, family) in map.iter() {
                let mut v = GroupValues::default();
                read(family, &mut v);
                if v.is_empty() {
                    lapsed.push(key.clone());
                } else {
                    out.push((decode_extra(key), v));
                }
            }
        }
        if expire == 0 || lapsed.is_empty() {
            return;
        }
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        for key in lapsed {
            // Checked again: an update may have revived it between the two locks.
            if map.get(&key).is_some_and(&idle) {
                map.remove(&key);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|e| e.into_inner()).len()
    }
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
const NODE_MASK: u64 = (1 << NODE_BITS) - 1;

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
            node: node_from_bits(k & NODE_MASK),
        }
    }
}

type LatencyKey = (LatencyType, Option<IpAddr>);
type BandwidthKey = (Direction, Option<IpAddr>);

fn pack_typed(kind: u64, node: Option<IpAddr>) -> Option<u64> {
    node_bits(node).map(|n| TOP | (kind << NODE_BITS) | n)
}

fn unpack_latency(k: u64) -> LatencyKey {
    (
        LatencyType::from_bits((k >> NODE_BITS) & 0x3),
        node_from_bits(k & NODE_MASK),
    )
}

fn unpack_bandwidth(k: u64) -> BandwidthKey {
    let dir = if (k >> NODE_BITS) & 1 == 0 {
        Direction::Ingress
    } else {
        Direction::Egress
    };
    (dir, node_from_bits(k & NODE_MASK))
}

type StatusFamily = Family<AtomicU64, StatusLabels>;
type LatencyFamily = Family<Histogram, LatencyKey>;
type BandwidthFamily = Family<AtomicU64, BandwidthKey>;

/// Every series of one `(route, service)` label pair.
pub struct SeriesGroup {
    pub route: String,
    pub service: String,
    /// Interned label texts: index 0 is `""`.
    uris: Mutex<Vec<String>>,
    hosts: Mutex<Vec<String>>,
    status: StatusFamily,
    latency: LatencyFamily,
    bandwidth: BandwidthFamily,
    extra_status: ExtraMap<StatusFamily>,
    extra_latency: ExtraMap<LatencyFamily>,
    extra_bandwidth: ExtraMap<BandwidthFamily>,
    buckets: usize,
    expire: Expire,
}

/// One group read for export.
#[derive(Debug, Default)]
pub struct GroupValues {
    pub status: Vec<(StatusLabels, u64)>,
    pub latency: Vec<(LatencyKey, HistogramValue)>,
    pub bandwidth: Vec<(BandwidthKey, u64)>,
    pub uris: Vec<String>,
    pub hosts: Vec<String>,
    /// The series with extra labels, by their extra values (in the metric's configured
    /// order); each holds the series of one metric only, and no uris or hosts (the ids are
    /// the group's).
    pub extra: Vec<(Vec<String>, GroupValues)>,
}

impl GroupValues {
    fn is_empty(&self) -> bool {
        self.status.is_empty()
            && self.latency.is_empty()
            && self.bandwidth.is_empty()
            && self.extra.is_empty()
    }
}

fn intern(table: &Mutex<Vec<String>>, text: &str) -> u16 {
    if text.is_empty() {
        return 0;
    }
    let mut t = lock(table);
    if let Some(i) = t.iter().position(|s| s == text) {
        return i as u16;
    }
    t.push(text.to_owned());
    (t.len() - 1).min(u16::MAX as usize) as u16
}

/// `now` when the metric expires, else 0 (nothing stamped).
fn stamp(now: u64, expire: u64) -> u64 {
    if expire > 0 {
        now
    } else {
        0
    }
}

impl SeriesGroup {
    pub fn new(route: String, service: String, buckets: usize, expire: Expire) -> SeriesGroup {
        SeriesGroup {
            route,
            service,
            uris: Mutex::new(vec![String::new()]),
            hosts: Mutex::new(vec![String::new()]),
            status: Family::new(TABLE_SLOTS),
            latency: Family::new(TABLE_SLOTS),
            bandwidth: Family::new(TABLE_SLOTS),
            extra_status: ExtraMap::new(),
            extra_latency: ExtraMap::new(),
            extra_bandwidth: ExtraMap::new(),
            buckets,
            expire,
        }
    }

    /// The id of a matched-uri label (compile time).
    pub fn uri_id(&self, uri: &str) -> u16 {
        intern(&self.uris, uri)
    }

    pub fn host_id(&self, host: &str) -> u16 {
        intern(&self.hosts, host)
    }

    /// Counts one request. `extra`: the packed extra-label values when the metric has extra
    /// labels; `now`: the clock's monotonic milliseconds when any metric expires (else unused).
    pub fn count_status(&self, labels: StatusLabels, extra: Option<&[u8]>, now: u64) {
        let now = stamp(now, self.expire.status);
        let record = |f: &StatusFamily| f.record(labels.pack(), labels, 1, now, 0);
        match extra {
            None => record(&self.status),
            Some(key) => self
                .extra_status
                .with(key, || Family::new(EXTRA_TABLE_SLOTS), record),
        }
    }

    pub fn observe_latency(
        &self,
        kind: LatencyType,
        node: Option<IpAddr>,
        bucket: usize,
        micros: u64,
        extra: Option<&[u8]>,
        now: u64,
    ) {
        let now = stamp(now, self.expire.latency);
        let buckets = self.buckets;
        let record = |f: &LatencyFamily| {
            f.record(
                pack_typed(kind as u64, node),
                (kind, node),
                (bucket, micros),
                now,
                buckets,
            )
        };
        match extra {
            None => record(&self.latency),
            Some(key) => self
                .extra_latency
                .with(key, || Family::new(EXTRA_TABLE_SLOTS), record),
        }
    }

    pub fn add_bandwidth(
        &self,
        dir: Direction,
        node: Option<IpAddr>,
        bytes: u64,
        extra: Option<&[u8]>,
        now: u64,
    ) {
        let now = stamp(now, self.expire.bandwidth);
        let record = |f: &BandwidthFamily| {
            f.record(pack_typed(dir as u64, node), (dir, node), bytes, now, 0)
        };
        match extra {
            None => record(&self.bandwidth),
            Some(key) => self
                .extra_bandwidth
                .with(key, || Family::new(EXTRA_TABLE_SLOTS), record),
        }
    }

    /// The live series at `now` (monotonic milliseconds); expired ones are dropped on the way.
    pub fn read(&self, now: u64) -> GroupValues {
        let mut v = GroupValues {
            uris: lock(&self.uris).clone(),
            hosts: lock(&self.hosts).clone(),
            ..Default::default()
        };
        let e = self.expire;
        self.status
            .collect(now, e.status, StatusLabels::unpack, &mut v.status);
        self.latency
            .collect(now, e.latency, unpack_latency, &mut v.latency);
        self.bandwidth
            .collect(now, e.bandwidth, unpack_bandwidth, &mut v.bandwidth);
        self.extra_status.collect(
            e.status,
            |f, out| f.collect(now, e.status, StatusLabels::unpack, &mut out.status),
            |f| f.idle(now, e.status),
            &mut v.extra,
        );
        self.extra_latency.collect(
            e.latency,
            |f, out| f.collect(now, e.latency, unpack_latency, &mut out.latency),
            |f| f.idle(now, e.latency),
            &mut v.extra,
        );
        self.extra_bandwidth.collect(
            e.bandwidth,
            |f, out| f.collect(now, e.bandwidth, unpack_bandwidth, &mut out.bandwidth),
            |f| f.idle(now, e.bandwidth),
            &mut v.extra,
        );
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> StatusLabels {
        StatusLabels {
            code,
            source: 0,
            uri: 0,
            host: 0,
            node: None,
        }
    }

    fn group(expire: Expire) -> SeriesGroup {
        SeriesGroup::new("r".into(), "".into(), 3, expire)
    }

    fn key(values: &[&str]) -> ExtraKey {
        let mut k = ExtraKey::new();
        for v in values {
            push_extra_value(&mut k, v);
        }
        k
    }

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
        let g = group(Expire::default());
        for code in 100..140u16 {
            g.count_status(status(code), None, 0);
        }
        g.count_status(status(100), None, 0);
        let v = g.read(0);
        assert_eq!(v.status.len(), 40);
        assert_eq!(v.status.iter().map(|(_, n)| n).sum::<u64>(), 41);
    }

    #[test]
    fn concurrent_counts_are_exact() {
        let g = std::sync::Arc::new(group(Expire::default()));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let g = g.clone();
                std::thread::spawn(move || {
                    for i in 0..1000u16 {
                        g.count_status(status(200 + i % 3), None, 0);
                        g.observe_latency(LatencyType::Request, None, 1, 1500, None, 0);
                        g.add_bandwidth(
                            Direction::Egress,
                            Some("127.0.0.1".parse().unwrap()),
                            10,
                            None,
                            0,
                        );
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let v = g.read(0);
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
        let g = group(Expire::default());
        assert_eq!(g.uri_id(""), 0);
        assert_eq!(g.uri_id("/a"), 1);
        assert_eq!(g.uri_id("/b"), 2);
        assert_eq!(g.uri_id("/a"), 1);
    }

    #[test]
    fn extra_values_key_their_own_series() {
        let g = group(Expire::default());
        let a = key(&["10.0.0.1:80", "200"]);
        let b = key(&["10.0.0.2:80", ""]);
        g.count_status(status(200), Some(&a), 0);
        g.count_status(status(200), Some(&a), 0);
        g.count_status(status(200), Some(&b), 0);
        g.observe_latency(LatencyType::Request, None, 0, 500, Some(&b), 0);
        g.add_bandwidth(Direction::Ingress, None, 7, Some(&a), 0);
        let mut v = g.read(0);
        assert!(v.status.is_empty() && v.latency.is_empty() && v.bandwidth.is_empty());
        v.extra.sort_by(|x, y| x.0.cmp(&y.0));
        let summary: Vec<(Vec<String>, usize, usize, usize, u64)> = v
            .extra
            .iter()
            .map(|(values, s)| {
                (
                    values.clone(),
                    s.status.len(),
                    s.latency.len(),
                    s.bandwidth.len(),
                    s.status.iter().map(|(_, n)| n).sum::<u64>()
                        + s.bandwidth.iter().map(|(_, n)| n).sum::<u64>(),
                )
            })
            .collect();
        let vals = |a: &str, b: &str| vec![a.to_string(), b.to_string()];
        assert_eq!(
            summary,
            vec![
                (vals("10.0.0.1:80", "200"), 1, 0, 0, 2),
                (vals("10.0.0.1:80", "200"), 0, 0, 1, 7),
                (vals("10.0.0.2:80", ""), 1, 0, 0, 1),
                (vals("10.0.0.2:80", ""), 0, 1, 0, 0),
            ]
        );
        assert_eq!(decode_extra(&key(&[])), Vec::<String>::new());
        assert_eq!(decode_extra(&key(&["", "é\"x"])), vals("", "é\"x"));
    }

    #[test]
    fn series_expire_and_come_back_from_zero() {
        let g = group(Expire {
            status: 1000,
            latency: 0,
            bandwidth: 1000,
        });
        g.count_status(status(200), None, 5_000);
        g.count_status(status(200), None, 5_500);
        g.count_status(status(404), None, 5_000);
        g.observe_latency(LatencyType::Request, None, 1, 10, None, 5_000);
        g.add_bandwidth(Direction::Egress, None, 100, None, 5_000);
        let v = g.read(5_999);
        assert_eq!(v.status.len(), 2);
        assert_eq!(v.bandwidth.len(), 1);
        // 404 and the bandwidth lapsed 1 s after their last update; 200 was updated later;
        // latency never expires.
        let v = g.read(6_000);
        assert_eq!(v.status, vec![(status(200), 2)]);
        assert!(v.bandwidth.is_empty());
        assert_eq!(v.latency.len(), 1);
        let v = g.read(6_500);
        assert!(v.status.is_empty());
        // A series that comes back counts from 0.
        g.count_status(status(404), None, 7_000);
        g.add_bandwidth(Direction::Egress, None, 5, None, 7_000);
        let v = g.read(7_000);
        assert_eq!(v.status, vec![(status(404), 1)]);
        assert_eq!(v.bandwidth, vec![((Direction::Egress, None), 5)]);
        assert_eq!(g.read(100_000).latency[0].1.counts, vec![0, 1, 0, 0]);
    }

    #[test]
    fn expired_overflow_series_are_removed() {
        let g = group(Expire {
            status: 1000,
            ..Default::default()
        });
        for code in 100..140u16 {
            g.count_status(status(code), None, 1_000);
        }
        g.count_status(status(139), None, 1_800);
        assert_eq!(g.read(1_500).status.len(), 40);
        assert_eq!(g.read(2_000).status, vec![(status(139), 2)]);
        assert_eq!(lock(&g.status.overflow).len(), 1);
    }

    #[test]
    fn expired_extra_values_are_freed() {
        let g = group(Expire {
            status: 1000,
            latency: 1000,
            bandwidth: 0,
        });
        let a = key(&["a"]);
        let b = key(&["b"]);
        g.count_status(status(200), Some(&a), 1_000);
        g.count_status(status(200), Some(&b), 1_600);
        g.observe_latency(LatencyType::Apisix, None, 0, 1, Some(&a), 1_000);
        g.add_bandwidth(Direction::Ingress, None, 1, Some(&a), 1_000);
        let v = g.read(2_100);
        let mut live: Vec<&Vec<String>> = v.extra.iter().map(|(k, _)| k).collect();
        live.sort();
        assert_eq!(live, [&vec!["a".to_string()], &vec!["b".to_string()]]);
        assert_eq!(g.extra_status.len(), 1);
        assert_eq!(g.extra_latency.len(), 0);
        // Bandwidth does not expire.
        assert_eq!(g.extra_bandwidth.len(), 1);
        // A family revived before the render's second look is kept.
        g.count_status(status(200), Some(&a), 2_200);
        assert_eq!(g.read(2_300).extra.len(), 3);
        assert_eq!(g.extra_status.len(), 2);
    }

    #[test]
    fn concurrent_updates_while_expiring_never_underflow() {
        // A writer keeps updating a series while a render keeps expiring it: a reset takes
        // away only what its snapshot saw, so the count never wraps below 0 and never exceeds
        // what was added.
        let g = std::sync::Arc::new(group(Expire {
            status: 1,
            ..Default::default()
        }));
        let writer = {
            let g = g.clone();
            std::thread::spawn(move || {
                for i in 0..20_000u64 {
                    g.count_status(status(200), None, 10 + i);
                }
            })
        };
        for i in 0..2_000 {
            let _ = g.read(i * 10);
        }
        writer.join().unwrap();
        // The last update was stamped 20_009; read at that time: live, and its count is what
        // came after the last reset, so at most 20_000.
        let v = g.read(20_009);
        assert_eq!(v.status.len(), 1);
        assert!(v.status[0].1 <= 20_000 && v.status[0].1 >= 1);
    }
}
