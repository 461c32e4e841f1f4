//! A one-node Kafka broker for tests (the workspace's and the crate's): Debian packages no
//! Kafka, so tests speak the real protocol from the broker's side and decode what producers
//! send.

use std::io::{Cursor, Read};
use std::sync::Arc;

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
}

/// A one-node Kafka broker speaking the protocol's non-flexible versions: ApiVersions
/// (v0-2; v3 is refused, so the client steps down), Metadata v1, Produce v3 with record
/// batches (v2) decoded, SaslHandshake v1 and SaslAuthenticate v0 (PLAIN, checking
/// `user`/`pass` when `sasl`).
pub struct Broker {
    pub port: u16,
    pub records: mpsc::UnboundedReceiver<Stored>,
    pub auths: mpsc::UnboundedReceiver<Vec<u8>>,
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
}

/// The records of one record batch (v2, uncompressed).
fn record_batches(data: &[u8]) -> Vec<(Option<Vec<u8>>, Vec<u8>)> {
    let mut w = Wire(Cursor::new(data));
    let mut out = Vec::new();
    while (w.0.position() as usize) < data.len() {
        let _base_offset = w.i64();
        let len = w.i32() as u64;
        let end = w.0.position() + len;
        let _leader_epoch = w.i32();
        assert_eq!(w.i8(), 2, "record batch magic");
        let _crc = w.i32();
        let attributes = w.i16();
        assert_eq!(attributes & 0x7, 0, "uncompressed");
        let _last_offset_delta = w.i32();
        let (_first_ts, _max_ts, _pid) = (w.i64(), w.i64(), w.i64());
        let (_epoch, _seq) = (w.i16(), w.i32());
        let n = w.i32();
        for _ in 0..n {
            let _len = w.varint();
            let _attrs = w.i8();
            let _ts_delta = w.varint();
            let _offset_delta = w.varint();
            let key = w.var_bytes();
            let value = w.var_bytes().unwrap_or_default();
            for _ in 0..w.varint() {
                let _ = (w.var_bytes(), w.var_bytes());
            }
            out.push((key, value));
        }
        assert_eq!(w.0.position(), end);
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
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            let (tx, atx) = (tx.clone(), atx.clone());
            match tls.clone() {
                None => {
                    tokio::spawn(serve(s, port, topic, partitions, sasl, tx, atx));
                }
                Some(acceptor) => {
                    tokio::spawn(async move {
                        // A client that refuses the certificate ends the handshake.
                        if let Ok(s) = acceptor.accept(s).await {
                            serve(s, port, topic, partitions, sasl, tx, atx).await;
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
    }
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    port: u16,
    topic: &'static str,
    partitions: i32,
    sasl: bool,
    tx: mpsc::UnboundedSender<Stored>,
    auths: mpsc::UnboundedSender<Vec<u8>>,
) {
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
                out.i16(0).i32(5);
                for (k, min, max) in [(18, 0, 2), (3, 1, 1), (0, 3, 3), (17, 1, 1), (36, 0, 0)] {
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
                        for (key, value) in record_batches(&data) {
                            tx.send(Stored {
                                topic: name.clone(),
                                partition: index,
                                key,
                                value,
                                acks,
                            })
                            .unwrap();
                        }
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
            other => panic!("unexpected request {other:?}"),
        }
        let mut msg = (out.0.len() as u32).to_be_bytes().to_vec();
        msg.extend_from_slice(&out.0);
        if s.write_all(&msg).await.is_err() {
            return;
        }
    }
}
