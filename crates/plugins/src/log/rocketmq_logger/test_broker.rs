//! A RocketMQ nameserver and one broker for tests (the workspace's and the crate's): Apache
//! RocketMQ is Java and Debian packages none, so tests speak the remoting protocol from the
//! servers' side. Frames are decoded here on their own (not with the producer's codec), the
//! nameserver answers `GET_ROUTEINFO_BY_TOPIC` with the route as fastjson writes it (integer
//! map keys unquoted), the broker takes `SEND_MESSAGE_V2` and hands over what it got; with
//! ACL both check `AccessKey` and the `Signature` as RocketMQ's `AclUtils` computes it (the
//! ext fields but `Signature` in the order of their names, their values then the body,
//! HMAC-SHA1, base64) and refuse a bad one with `NO_PERMISSION`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use base64::Engine;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;

/// One message the broker took.
#[derive(Debug, Clone)]
pub struct Sent {
    pub topic: String,
    pub queue_id: u32,
    pub broker_name: String,
    pub producer_group: String,
    pub keys: Option<String>,
    pub tags: Option<String>,
    pub uniq_key: String,
    pub body: Vec<u8>,
    pub access_key: Option<String>,
    /// `None` without ACL; else whether the signature was right (a wrong one is refused).
    pub signature_ok: Option<bool>,
}

/// A nameserver and a broker (`broker-a`) serving one topic.
pub struct Cluster {
    pub nameserver_port: u16,
    pub broker_port: u16,
    pub sent: mpsc::UnboundedReceiver<Sent>,
    route_queries: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
}

impl Cluster {
    /// How many route queries the nameserver answered.
    pub fn route_queries(&self) -> usize {
        self.route_queries.load(Ordering::Relaxed)
    }

    /// How many connections the nameserver and the broker accepted, together.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }
}

#[derive(Clone)]
struct Conf {
    topic: String,
    queues: u32,
    acl: Option<(String, String)>,
    broker_port: u16,
    route_queries: Arc<AtomicUsize>,
    sent: mpsc::UnboundedSender<Sent>,
}

/// A cluster serving `topic` with `queues` write queues; `acl` is the access and secret key
/// every request must be signed with.
pub async fn cluster(topic: &str, queues: u32, acl: Option<(&str, &str)>) -> Cluster {
    start(topic, queues, acl, None).await
}

/// [`cluster`] over TLS with this certificate and key (PEM), on both servers.
pub async fn tls_cluster(topic: &str, queues: u32, cert: &str, key: &str) -> Cluster {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .map(|c| c.unwrap())
        .collect();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    start(
        topic,
        queues,
        None,
        Some(TlsAcceptor::from(Arc::new(config))),
    )
    .await
}

async fn start(
    topic: &str,
    queues: u32,
    acl: Option<(&str, &str)>,
    tls: Option<TlsAcceptor>,
) -> Cluster {
    let names = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let broker = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (nameserver_port, broker_port) = (
        names.local_addr().unwrap().port(),
        broker.local_addr().unwrap().port(),
    );
    let (tx, sent) = mpsc::unbounded_channel();
    let route_queries = Arc::new(AtomicUsize::new(0));
    let connections = Arc::new(AtomicUsize::new(0));
    let conf = Conf {
        topic: topic.to_owned(),
        queues,
        acl: acl.map(|(a, s)| (a.to_owned(), s.to_owned())),
        broker_port,
        route_queries: route_queries.clone(),
        sent: tx,
    };
    for listener in [names, broker] {
        let (conf, tls, accepted) = (conf.clone(), tls.clone(), connections.clone());
        tokio::spawn(async move {
            loop {
                let Ok((s, _)) = listener.accept().await else {
                    return;
                };
                accepted.fetch_add(1, Ordering::Relaxed);
                let (conf, tls) = (conf.clone(), tls.clone());
                tokio::spawn(async move {
                    match tls {
                        None => serve(s, conf).await,
                        Some(acceptor) => {
                            if let Ok(s) = acceptor.accept(s).await {
                                serve(s, conf).await;
                            }
                        }
                    }
                });
            }
        });
    }
    Cluster {
        nameserver_port,
        broker_port,
        sent,
        route_queries,
        connections,
    }
}

/// A request as the servers read it.
struct Request {
    code: i64,
    opaque: i64,
    ext: BTreeMap<String, String>,
    body: Vec<u8>,
}

async fn read<S: AsyncRead + Unpin>(s: &mut S) -> Option<Request> {
    let total = s.read_u32().await.ok()? as usize;
    let mut frame = vec![0u8; total];
    s.read_exact(&mut frame).await.ok()?;
    let mark = u32::from_be_bytes(frame[..4].try_into().unwrap());
    assert_eq!(mark >> 24, 0, "the header is JSON");
    let header_len = (mark & 0xff_ffff) as usize;
    let header: Value = serde_json::from_slice(&frame[4..4 + header_len]).unwrap();
    assert_eq!(header["flag"], 0, "a two-way request");
    assert_eq!(header["language"], "other");
    // RocketMQ keeps ext fields as strings (fastjson turns numbers and booleans into text).
    let ext = header["extFields"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                    (k.clone(), v)
                })
                .collect()
        })
        .unwrap_or_default();
    Some(Request {
        code: header["code"].as_i64().unwrap(),
        opaque: header["opaque"].as_i64().unwrap(),
        ext,
        body: frame[4 + header_len..].to_vec(),
    })
}

async fn answer<S: AsyncWrite + Unpin>(
    s: &mut S,
    req: &Request,
    code: i64,
    remark: &str,
    ext: Value,
    body: &[u8],
) {
    let header = json!({"code": code, "flag": 1, "opaque": req.opaque, "language": "JAVA",
        "version": 453, "remark": remark, "extFields": ext, "serializeTypeCurrentRPC": "JSON"})
    .to_string();
    let mut out = Vec::new();
    out.extend_from_slice(&((4 + header.len() + body.len()) as u32).to_be_bytes());
    out.extend_from_slice(&(header.len() as u32).to_be_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(body);
    let _ = s.write_all(&out).await;
}

/// `AclUtils.calSignature` over the request's ext fields and body.
fn expected_signature(secret: &str, req: &Request) -> String {
    let mut content = Vec::new();
    for (k, v) in &req.ext {
        if k != "Signature" {
            content.extend_from_slice(v.as_bytes());
        }
    }
    content.extend_from_slice(&req.body);
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, secret.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(ring::hmac::sign(&key, &content).as_ref())
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, conf: Conf) {
    while let Some(req) = read(&mut s).await {
        let signature_ok = conf.acl.as_ref().map(|(ak, sk)| {
            req.ext.get("AccessKey") == Some(ak)
                && req.ext.get("Signature") == Some(&expected_signature(sk, &req))
        });
        if signature_ok == Some(false) {
            answer(&mut s, &req, 16, "signature mismatch", json!({}), b"").await;
            continue;
        }
        match req.code {
            105 => {
                let topic = req.ext.get("topic").cloned().unwrap_or_default();
                if topic != conf.topic {
                    let remark =
                        format!("No topic route info in name server for the topic: {topic}");
                    answer(&mut s, &req, 17, &remark, json!({}), b"").await;
                    continue;
                }
                conf.route_queries.fetch_add(1, Ordering::Relaxed);
                let route = format!(
                    "{{\"brokerDatas\":[{{\"brokerAddrs\":{{0:\"127.0.0.1:{}\"}},\"brokerName\":\"broker-a\",\"cluster\":\"DefaultCluster\"}}],\"filterServerTable\":{{}},\"queueDatas\":[{{\"brokerName\":\"broker-a\",\"perm\":6,\"readQueueNums\":{q},\"topicSysFlag\":0,\"writeQueueNums\":{q}}}]}}",
                    conf.broker_port,
                    q = conf.queues
                );
                answer(&mut s, &req, 0, "", json!({}), route.as_bytes()).await;
            }
            310 => {
                let props: BTreeMap<String, String> = req
                    .ext
                    .get("i")
                    .map(String::as_str)
                    .unwrap_or("")
                    .split('\u{2}')
                    .filter_map(|p| p.split_once('\u{1}'))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect();
                let field = |k: &str| req.ext.get(k).cloned().unwrap_or_default();
                let sent = Sent {
                    topic: field("b"),
                    queue_id: field("e").parse().unwrap(),
                    broker_name: field("n"),
                    producer_group: field("a"),
                    keys: props.get("KEYS").cloned(),
                    tags: props.get("TAGS").cloned(),
                    uniq_key: props.get("UNIQ_KEY").cloned().unwrap_or_default(),
                    body: req.body.clone(),
                    access_key: req.ext.get("AccessKey").cloned(),
                    signature_ok,
                };
                if sent.topic != conf.topic {
                    answer(&mut s, &req, 17, "topic not exist", json!({}), b"").await;
                    continue;
                }
                let queue = sent.queue_id.to_string();
                let _ = conf.sent.send(sent);
                answer(
                    &mut s,
                    &req,
                    0,
                    "",
                    json!({"msgId": "7F00000100002A9F0000000000000000", "queueId": queue,
                        "queueOffset": "0"}),
                    b"",
                )
                .await;
            }
            other => {
                let remark = format!("request type {other} not supported");
                answer(&mut s, &req, 3, &remark, json!({}), b"").await;
            }
        }
    }
}
