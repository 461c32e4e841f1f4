//! A one-node Kafka broker for tests (the workspace's and the crate's): Debian packages no
//! Kafka, so tests speak the real protocol from the broker's side, decode what producers
//! send and keep it in a log that consumers list offsets in and fetch from (record batches
//! v2, CRC-32C checked and written).

use std::collections::HashMap;
use std::io::{Cursor, Read};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;

/// One record a broker stored.
#[derive(Debug, Clone)]
pub struct Stored {
    pub topic: String,
    pub partition: i32,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub acks: i16,
    /// The record batch's compression (the attributes' codec: 0 none, 1 gzip, 2 snappy).
    pub compression: i16,
}

/// A one-node Kafka broker speaking the protocol's non-flexible versions: ApiVersions
/// (v0-2; v3 is refused, so the client steps down), Metadata v1, Produce v3 with record
/// batches (v2) decoded, ListOffsets v1, Fetch v4, SaslHandshake v1 and SaslAuthenticate v0
/// (PLAIN, checking `user`/`pass` when `sasl`).
pub struct Broker {
    pub port: u16,
    pub records: mpsc::UnboundedReceiver<Stored>,
    pub auths: mpsc::UnboundedReceiver<Vec<u8>>,
    /// What was produced or appended, per topic and partition.
    pub log: Arc<Mutex<Log>>,
    /// Each Fetch request's partition and offset, as the client sent them.
    pub fetches: mpsc::UnboundedReceiver<(String, i32, i64)>,
    /// Metadata requests answered (a producer's partition lists).
    pub metadata_requests: Arc<std::sync::atomic::AtomicUsize>,
}

/// A record as the log keeps it: key, value, timestamp (ms).
pub type LogRecord = (Option<Vec<u8>>, Option<Vec<u8>>, i64);

/// One partition's log: its batches as they were written, and the first offset still kept.
#[derive(Debug, Default)]
pub struct PartitionLog {
    pub start: i64,
    /// Base offset and records of each batch.
    pub batches: Vec<(i64, Vec<LogRecord>)>,
}

impl PartitionLog {
    /// The next offset (the high watermark: every record is committed at once).
    pub fn end(&self) -> i64 {
        self.batches
            .last()
            .map_or(self.start, |(base, r)| base + r.len() as i64)
    }

    fn append(&mut self, records: Vec<LogRecord>) {
        if !records.is_empty() {
            let base = self.end();
            self.batches.push((base, records));
        }
    }
}

pub type Log = HashMap<(String, i32), PartitionLog>;

impl Broker {
    /// Appends `records` to the partition as one record batch.
    pub fn append(&self, topic: &str, partition: i32, records: Vec<LogRecord>) {
        let mut log = self.log.lock().unwrap();
        log.entry((topic.to_owned(), partition))
            .or_default()
            .append(records);
    }

    /// Drops the records before `start` (as retention does): the earliest offset becomes
    /// `start`.
    pub fn trim(&self, topic: &str, partition: i32, start: i64) {
        let mut log = self.log.lock().unwrap();
        let p = log.entry((topic.to_owned(), partition)).or_default();
        p.batches.retain(|(base, r)| base + r.len() as i64 > start);
        if p.batches.is_empty() {
            p.start = p.start.max(start);
        } else {
            p.start = start;
        }
    }
}

struct Wire<'a>(Cursor<&'a [u8]>);

impl Wire<'_> {
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0; n];
        Read::read_exact(&mut self.0, &mut b).unwrap();
        b
    }
    fn i8(&mut self) -> i8 {
        self.bytes(1)[0] as i8
    }
    fn i16(&mut self) -> i16 {
        i16::from_be_bytes(self.bytes(2).try_into().unwrap())
    }
    fn i32(&mut self) -> i32 {
        i32::from_be_bytes(self.bytes(4).try_into().unwrap())
    }
    fn i64(&mut self) -> i64 {
        i64::from_be_bytes(self.bytes(8).try_into().unwrap())
    }
    fn string(&mut self) -> Option<String> {
        let n = self.i16();
        (n >= 0).then(|| String::from_utf8(self.bytes(n as usize)).unwrap())
    }
    fn varint(&mut self) -> i64 {
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let b = self.bytes(1)[0];
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        ((v >> 1) as i64) ^ -((v & 1) as i64)
    }
    fn var_bytes(&mut self) -> Option<Vec<u8>> {
        let n = self.varint();
        (n >= 0).then(|| self.bytes(n as usize))
    }
}

#[derive(Default)]
struct Out(Vec<u8>);

impl Out {
    fn i16(&mut self, v: i16) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn i32(&mut self, v: i32) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn i64(&mut self, v: i64) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn string(&mut self, s: &str) -> &mut Self {
        self.i16(s.len() as i16);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn i8(&mut self, v: i8) -> &mut Self {
        self.0.push(v as u8);
        self
    }
    fn varint(&mut self, v: i64) -> &mut Self {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        loop {
            let b = (z & 0x7f) as u8;
            z >>= 7;
            if z == 0 {
                self.0.push(b);
                return self;
            }
            self.0.push(b | 0x80);
        }
    }
    fn var_bytes(&mut self, b: Option<&[u8]>) -> &mut Self {
        match b {
            Some(b) => {
                self.varint(b.len() as i64);
                self.0.extend_from_slice(b);
            }
            None => {
                self.varint(-1);
            }
        }
        self
    }
}

/// CRC-32C (Castagnoli), which record batches carry.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// One record batch (v2, uncompressed, no producer id) of `records` from offset `base`.
fn encode_batch(base: i64, records: &[LogRecord]) -> Vec<u8> {
    let first_ts = records.first().map_or(0, |r| r.2);
    let max_ts = records.iter().map(|r| r.2).max().unwrap_or(first_ts);
    // From the attributes on: what the CRC covers.
    let mut body = Out::default();
    body.i16(0)
        .i32(records.len() as i32 - 1)
        .i64(first_ts)
        .i64(max_ts)
        .i64(-1)
        .i16(-1)
        .i32(-1)
        .i32(records.len() as i32);
    for (delta, (key, value, ts)) in records.iter().enumerate() {
        let mut r = Out::default();
        r.i8(0)
            .varint(ts - first_ts)
            .varint(delta as i64)
            .var_bytes(key.as_deref())
            .var_bytes(value.as_deref())
            .varint(0);
        body.varint(r.0.len() as i64);
        body.0.extend_from_slice(&r.0);
    }
    let mut out = Out::default();
    out.i64(base)
        .i32(4 + 1 + 4 + body.0.len() as i32)
        .i32(0)
        .i8(2)
        .i32(crc32c(&body.0) as i32);
    out.0.extend_from_slice(&body.0);
    out.0
}

/// A record read from a batch: key, value, timestamp (ms) and its batch's codec.
type ReadRecord = (Option<Vec<u8>>, Vec<u8>, i64, i16);

/// The records of record batches (v2, uncompressed, gzip or snappy).
fn record_batches(data: &[u8]) -> Vec<ReadRecord> {
    let mut w = Wire(Cursor::new(data));
    let mut out = Vec::new();
    while (w.0.position() as usize) < data.len() {
        let _base_offset = w.i64();
        let len = w.i32() as u64;
        let end = w.0.position() + len;
        let _leader_epoch = w.i32();
        assert_eq!(w.i8(), 2, "record batch magic");
        let crc = w.i32() as u32;
        let covered = &data[w.0.position() as usize..end as usize];
        assert_eq!(crc, crc32c(covered), "record batch CRC-32C");
        let attributes = w.i16();
        let codec = attributes & 0x7;
        let _last_offset_delta = w.i32();
        let (first_ts, _max_ts, _pid) = (w.i64(), w.i64(), w.i64());
        let (_epoch, _seq) = (w.i16(), w.i32());
        let n = w.i32();
        // The record count stays plain; the records after it are compressed as a whole.
        let rest = &data[w.0.position() as usize..end as usize];
        let records = match codec {
            0 => rest.to_vec(),
            1 => {
                let mut out = Vec::new();
                flate2::read::GzDecoder::new(rest)
                    .read_to_end(&mut out)
                    .expect("gzip records");
                out
            }
            2 => snap::raw::Decoder::new()
                .decompress_vec(rest)
                .expect("snappy records"),
            other => panic!("compression codec {other} is not decoded here"),
        };
        w.0.set_position(end);
        let mut r = Wire(Cursor::new(&records[..]));
        for _ in 0..n {
            let _len = r.varint();
            let _attrs = r.i8();
            let ts_delta = r.varint();
            let _offset_delta = r.varint();
            let key = r.var_bytes();
            let value = r.var_bytes().unwrap_or_default();
            for _ in 0..r.varint() {
                let _ = (r.var_bytes(), r.var_bytes());
            }
            out.push((key, value, first_ts + ts_delta, codec));
        }
        assert_eq!(r.0.position() as usize, records.len());
    }
    out
}

pub async fn broker(topic: &'static str, partitions: i32, sasl: bool) -> Broker {
    start(topic, partitions, sasl, None).await
}

/// [`broker`] over TLS with this certificate and key (PEM).
pub async fn tls_broker(topic: &'static str, partitions: i32, cert: &str, key: &str) -> Broker {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .map(|c| c.unwrap())
        .collect();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    start(
        topic,
        partitions,
        false,
        Some(TlsAcceptor::from(Arc::new(config))),
    )
    .await
}

async fn start(
    topic: &'static str,
    partitions: i32,
    sasl: bool,
    tls: Option<TlsAcceptor>,
) -> Broker {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, records) = mpsc::unbounded_channel();
    let (atx, auths) = mpsc::unbounded_channel();
    let (ftx, fetches) = mpsc::unbounded_channel();
    let log = Arc::new(Mutex::new(Log::new()));
    let shared = log.clone();
    let metadata_requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let metadata_count = metadata_requests.clone();
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            let node = Node {
                port,
                topic,
                partitions,
                sasl,
                records: tx.clone(),
                auths: atx.clone(),
                fetches: ftx.clone(),
                log: shared.clone(),
                metadata_requests: metadata_count.clone(),
            };
            match tls.clone() {
                None => {
                    tokio::spawn(serve(s, node));
                }
                Some(acceptor) => {
                    tokio::spawn(async move {
                        // A client that refuses the certificate ends the handshake.
                        if let Ok(s) = acceptor.accept(s).await {
                            serve(s, node).await;
                        }
                    });
                }
            }
        }
    });
    Broker {
        port,
        records,
        auths,
        log,
        fetches,
        metadata_requests,
    }
}

/// What one connection of the broker serves from.
struct Node {
    port: u16,
    topic: &'static str,
    partitions: i32,
    sasl: bool,
    records: mpsc::UnboundedSender<Stored>,
    auths: mpsc::UnboundedSender<Vec<u8>>,
    fetches: mpsc::UnboundedSender<(String, i32, i64)>,
    log: Arc<Mutex<Log>>,
    metadata_requests: Arc<std::sync::atomic::AtomicUsize>,
}

impl Node {
    fn has(&self, topic: &str, partition: i32) -> bool {
        topic == self.topic && (0..self.partitions).contains(&partition)
    }
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, node: Node) {
    let Node {
        port,
        topic,
        partitions,
        sasl,
        ..
    } = node;
    let tx = node.records.clone();
    let auths = node.auths.clone();
    let mut authenticated = !sasl;
    loop {
        let mut len = [0u8; 4];
        if s.read_exact(&mut len).await.is_err() {
            return;
        }
        let mut frame = vec![0; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut frame).await.unwrap();
        let mut w = Wire(Cursor::new(&frame));
        let (key, version, correlation) = (w.i16(), w.i16(), w.i32());
        let _client = w.string();
        let mut out = Out::default();
        out.i32(correlation);
        match (key, version) {
            (18, 3) => {
                // UNSUPPORTED_VERSION, in v0's layout as brokers answer it.
                out.i16(35).i32(0);
            }
            (18, v) => {
                out.i16(0).i32(7);
                for (k, min, max) in [
                    (18, 0, 2),
                    (3, 1, 1),
                    (0, 3, 3),
                    (2, 1, 1),
                    (1, 4, 4),
                    (17, 1, 1),
                    (36, 0, 0),
                ] {
                    out.i16(k).i16(min).i16(max);
                }
                if v >= 1 {
                    out.i32(0);
                }
            }
            (17, 1) => {
                assert_eq!(w.string().as_deref(), Some("PLAIN"));
                out.i16(0).i32(1).string("PLAIN");
            }
            (36, 0) => {
                let n = w.i32() as usize;
                let auth = w.bytes(n);
                authenticated = auth == b"\0user\0pass";
                auths.send(auth).unwrap();
                if authenticated {
                    out.i16(0).i16(-1).i32(0);
                } else {
                    // SASL_AUTHENTICATION_FAILED
                    out.i16(58).string("bad credentials").i32(0);
                }
            }
            (3, 1) => {
                assert!(authenticated, "metadata before authentication");
                node.metadata_requests
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                out.i32(1)
                    .i32(1)
                    .string("127.0.0.1")
                    .i32(port as i32)
                    .i16(-1);
                out.i32(1); // controller
                out.i32(1).i16(0).string(topic).0.push(0);
                out.i32(partitions);
                for p in 0..partitions {
                    out.i16(0).i32(p).i32(1).i32(1).i32(1).i32(1).i32(1);
                }
            }
            (0, 3) => {
                assert!(authenticated, "produce before authentication");
                let _txn = w.string();
                let acks = w.i16();
                let _timeout = w.i32();
                let mut answer = Vec::new();
                for _ in 0..w.i32() {
                    let name = w.string().unwrap();
                    let mut parts = Vec::new();
                    for _ in 0..w.i32() {
                        let index = w.i32();
                        let n = w.i32() as usize;
                        let data = w.bytes(n);
                        let mut kept = Vec::new();
                        for (key, value, ts, compression) in record_batches(&data) {
                            kept.push((key.clone(), Some(value.clone()), ts));
                            tx.send(Stored {
                                topic: name.clone(),
                                partition: index,
                                key,
                                value,
                                acks,
                                compression,
                            })
                            .unwrap();
                        }
                        let mut log = node.log.lock().unwrap();
                        log.entry((name.clone(), index)).or_default().append(kept);
                        parts.push(index);
                    }
                    answer.push((name, parts));
                }
                out.i32(answer.len() as i32);
                for (name, parts) in answer {
                    out.string(&name).i32(parts.len() as i32);
                    for p in parts {
                        out.i32(p).i16(0).i64(0).i64(-1);
                    }
                }
                out.i32(0);
            }
            (2, 1) => {
                assert!(authenticated, "list offsets before authentication");
                assert_eq!(w.i32(), -1, "a consumer's replica id");
                let mut answer = Vec::new();
                for _ in 0..w.i32() {
                    let name = w.string().unwrap();
                    let mut parts = Vec::new();
                    for _ in 0..w.i32() {
                        let (index, ts) = (w.i32(), w.i64());
                        parts.push((index, list_offset(&node, &name, index, ts)));
                    }
                    answer.push((name, parts));
                }
                out.i32(answer.len() as i32);
                for (name, parts) in answer {
                    out.string(&name).i32(parts.len() as i32);
                    for (index, (error, ts, offset)) in parts {
                        out.i32(index).i16(error).i64(ts).i64(offset);
                    }
                }
            }
            (1, 4) => {
                assert!(authenticated, "fetch before authentication");
                assert_eq!(w.i32(), -1, "a consumer's replica id");
                let (_max_wait, _min_bytes, _max_bytes, _isolation) =
                    (w.i32(), w.i32(), w.i32(), w.i8());
                let mut answer = Vec::new();
                for _ in 0..w.i32() {
                    let name = w.string().unwrap();
                    let mut parts = Vec::new();
                    for _ in 0..w.i32() {
                        let (index, offset, _max) = (w.i32(), w.i64(), w.i32());
                        node.fetches.send((name.clone(), index, offset)).unwrap();
                        parts.push((index, fetch(&node, &name, index, offset)));
                    }
                    answer.push((name, parts));
                }
                out.i32(0).i32(answer.len() as i32);
                for (name, parts) in answer {
                    out.string(&name).i32(parts.len() as i32);
                    for (index, (error, high, records)) in parts {
                        out.i32(index).i16(error).i64(high).i64(high).i32(0);
                        match records {
                            Some(r) => {
                                out.i32(r.len() as i32);
                                out.0.extend_from_slice(&r);
                            }
                            None => {
                                out.i32(-1);
                            }
                        }
                    }
                }
            }
            other => panic!("unexpected request {other:?}"),
        }
        let mut msg = (out.0.len() as u32).to_be_bytes().to_vec();
        msg.extend_from_slice(&out.0);
        if s.write_all(&msg).await.is_err() {
            return;
        }
    }
}

/// ListOffsets for one partition: error code, timestamp and offset (-1 latest: the next
/// offset; -2 earliest: the first kept; else the first record at or after the time, -1 when
/// none is).
fn list_offset(node: &Node, topic: &str, partition: i32, ts: i64) -> (i16, i64, i64) {
    if !node.has(topic, partition) {
        // UNKNOWN_TOPIC_OR_PARTITION
        return (3, -1, -1);
    }
    let log = node.log.lock().unwrap();
    let empty = PartitionLog::default();
    let p = log.get(&(topic.to_owned(), partition)).unwrap_or(&empty);
    match ts {
        -1 => (0, -1, p.end()),
        -2 => (0, -1, p.start),
        ts => p
            .batches
            .iter()
            .flat_map(|(base, r)| {
                r.iter()
                    .enumerate()
                    .map(move |(i, r)| (base + i as i64, r.2))
            })
            .find(|(offset, t)| *offset >= p.start && *t >= ts)
            .map_or((0, -1, -1), |(offset, t)| (0, t, offset)),
    }
}

/// Fetch for one partition: error code, high watermark and the record batches from the one
/// holding `offset` on (a batch is sent whole, as brokers do).
fn fetch(node: &Node, topic: &str, partition: i32, offset: i64) -> (i16, i64, Option<Vec<u8>>) {
    if !node.has(topic, partition) {
        return (3, -1, None);
    }
    let log = node.log.lock().unwrap();
    let empty = PartitionLog::default();
    let p = log.get(&(topic.to_owned(), partition)).unwrap_or(&empty);
    if offset < p.start || offset > p.end() {
        // OFFSET_OUT_OF_RANGE
        return (1, -1, None);
    }
    let mut data = Vec::new();
    for (base, records) in &p.batches {
        if base + records.len() as i64 > offset {
            data.extend_from_slice(&encode_batch(*base, records));
        }
    }
    (0, p.end(), Some(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_check_value() {
        // The catalogue's check value for CRC-32/ISCSI.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn batches_round_trip() {
        let records = vec![
            (Some(b"k".to_vec()), Some(b"v1".to_vec()), 1_000),
            (None, Some(b"v2".to_vec()), 1_005),
        ];
        let got = record_batches(&encode_batch(7, &records));
        assert_eq!(
            got,
            vec![
                (Some(b"k".to_vec()), b"v1".to_vec(), 1_000, 0),
                (None, b"v2".to_vec(), 1_005, 0)
            ]
        );
    }
}
