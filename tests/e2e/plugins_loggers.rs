//! End-to-end loggers through the binary: http-logger under wrk logs every request exactly
//! once (the last partial batch flushed by the graceful shutdown), and so does every logger
//! ferrisix builds, all on one route under wrk; with its sink down the
//! gateway keeps serving with bounded memory (the backlog drops what it cannot hold);
//! file-logger appends its lines and reopens its file on SIGUSR1.
use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{json, Value};
use support::*;

/// An HTTP log sink: counts the entries of every POSTed batch (a JSON array or one object)
/// by their `status` field, and keeps each batch's `Authorization` header.
struct Sink {
    addr: SocketAddr,
    statuses: Arc<Mutex<Vec<String>>>,
    batches: Arc<AtomicUsize>,
    auth: Arc<Mutex<Vec<String>>>,
}

impl Sink {
    fn start() -> Sink {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let statuses = Arc::new(Mutex::new(Vec::new()));
        let batches = Arc::new(AtomicUsize::new(0));
        let auth = Arc::new(Mutex::new(Vec::new()));
        let (st, b, a) = (statuses.clone(), batches.clone(), auth.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (st, b, a) = (st.clone(), b.clone(), a.clone());
                std::thread::spawn(move || serve_sink(stream, &st, &b, &a));
            }
        });
        Sink {
            addr,
            statuses,
            batches,
            auth,
        }
    }
}

fn serve_sink(
    mut s: TcpStream,
    statuses: &Mutex<Vec<String>>,
    batches: &AtomicUsize,
    auth: &Mutex<Vec<String>>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let raw_head = String::from_utf8_lossy(&buf[..end]).into_owned();
        if let Some(v) = raw_head.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("authorization")
                .then(|| value.trim().to_owned())
        }) {
            auth.lock().unwrap().push(v);
        }
        let head = raw_head.to_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        while buf.len() < end + 4 + len {
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Vec<u8> = buf.drain(..end + 4 + len).skip(end + 4).collect();
        let v: Value = serde_json::from_slice(&body).expect("a JSON batch");
        let entries = match v {
            Value::Array(a) => a,
            one => vec![one],
        };
        batches.fetch_add(1, Ordering::Relaxed);
        statuses.lock().unwrap().extend(
            entries
                .iter()
                .map(|e| e["status"].as_str().unwrap_or("?").to_owned()),
        );
        if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .is_err()
        {
            return;
        }
    }
}

fn logged_route(up: &Upstream, sink: &str) -> String {
    json!({"routes": [{"id": "1", "uri": "/hello", "plugins": {"http-logger": {
        "uri": format!("http://{sink}/log"), "batch_max_size": 1000,
        "log_format": {"status": "$status", "uri": "$uri"}}},
        "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}]})
    .to_string()
}

fn ensure_wrk() {
    debian::require("wrk");
}

/// wrk's completed requests and its output.
fn wrk(addr: SocketAddr, secs: u64) -> (usize, String) {
    let out = std::process::Command::new("wrk")
        .args(["-t", "2", "-c", "16", "-d", &format!("{secs}s")])
        .arg(format!("http://{addr}/hello"))
        .output()
        .expect("run wrk");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let total = text
        .lines()
        .find_map(|l| l.trim().split_once(" requests in "))
        .and_then(|(n, _)| n.parse::<usize>().ok())
        .unwrap_or_else(|| panic!("no request count in wrk's output:\n{text}"));
    (total, text)
}

#[test]
fn http_logger_logs_every_request_exactly_once_under_wrk() {
    ensure_wrk();
    let up = Upstream::start("u", Behaviour::Echo);
    let sink = Sink::start();
    let mut gw = Gateway::start(&logged_route(&up, &sink.addr.to_string()));
    let (total, text) = wrk(gw.addr(), 10);
    // The graceful shutdown sends the last, partial batch.
    gw.signal("TERM");
    let status = gw.child.wait().expect("the gateway exits");
    assert!(status.success(), "{status:?}");
    let statuses = sink.statuses.lock().unwrap().clone();
    let ok = statuses.iter().filter(|s| *s == "200").count();
    eprintln!(
        "wrk -c 16 -d 10: {total} requests completed; the upstream served {}; the sink got {} entries in {} batches ({ok} of 200)",
        up.hits(),
        statuses.len(),
        sink.batches.load(Ordering::Relaxed),
    );
    // Every request the gateway served is logged exactly once: one entry per upstream hit.
    assert_eq!(statuses.len(), up.hits(), "{text}");
    // wrk counts only the answers it read before its deadline; the requests still in flight
    // on its 16 connections then were served (and logged) all the same.
    assert!(
        ok >= total && ok - total <= 16,
        "{ok} logged, {total} completed\n{text}"
    );
    assert!(
        statuses.iter().all(|s| s == "200" || s == "499"),
        "{:?}",
        statuses.iter().filter(|s| *s != "200").collect::<Vec<_>>()
    );
}

#[test]
fn http_logger_with_its_sink_down_keeps_memory_bounded() {
    ensure_wrk();
    let secs: u64 = std::env::var("FERRISIX_SINK_DOWN_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let up = Upstream::start("u", Behaviour::Echo);
    // Nothing listens there: every batch fails to connect and is retried, then dropped.
    let gw = Gateway::start(&logged_route(&up, &dead_node()));
    let (warm, _) = wrk(gw.addr(), 2);
    let before = gw.rss_kib();
    let started = Instant::now();
    let (total, text) = wrk(gw.addr(), secs);
    let after = gw.rss_kib();
    eprintln!(
        "sink down, wrk -c 16 -d {secs}: {total} requests ({warm} warm-up) in {:?}; RSS {before} KiB before, {after} KiB after",
        started.elapsed()
    );
    assert!(total > 1000, "the gateway kept serving: {text}");
    assert!(
        after < before + 64 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
    // Still answering at once.
    let r = get(gw.addr(), "/hello");
    assert_eq!(r.status, 200);
}

/// Issue 47, item 6: http-logger's `auth_header` is one of its `encrypt_fields`, stored
/// encrypted by the Admin API; the data plane decrypts it, so the log server gets the value
/// configured, not the stored ciphertext.
#[test]
fn http_logger_sends_the_auth_header_configured_not_its_stored_form() {
    let up = Upstream::start("u", Behaviour::Echo);
    let sink = Sink::start();
    let gw = StoreGatewayBuilder::embedded().start();
    let secret = "Bearer s3cr3t-token";
    gw.put_route(
        "1",
        &json!({"uri": "/hello", "plugins": {"http-logger": {
            "uri": format!("http://{}/log", sink.addr), "auth_header": secret,
            "batch_max_size": 1, "log_format": {"status": "$status"}}},
            "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}),
    );
    // Stored encrypted (the Admin API shows it decrypted).
    let stored = gw.admin("GET", "/apisix/admin/routes/1", "");
    assert_eq!(
        stored.json()["value"]["plugins"]["http-logger"]["auth_header"],
        secret
    );
    poll_until(std::time::Duration::from_secs(10), || {
        get(gw.data_addr(), "/hello").status == 200
    })
    .expect("the route is served");
    poll_until(std::time::Duration::from_secs(10), || {
        !sink.auth.lock().unwrap().is_empty()
    })
    .expect("a batch reached the sink");
    let auth = sink.auth.lock().unwrap().clone();
    assert!(auth.iter().all(|a| a == secret), "{auth:?}");
}

/// The lines of `path` once it has `n` of them (within 10 s).
fn file_lines(path: &std::path::Path, n: usize) -> Vec<Value> {
    let mut text = String::new();
    poll_until(std::time::Duration::from_secs(10), || {
        text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines().count() >= n
    })
    .unwrap_or_else(|| panic!("{} has not {n} lines:\n{text}", path.display()));
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn file_logger_appends_lines_and_reopens_its_file_on_sigusr1() {
    let up = Upstream::start("u", Behaviour::Echo);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("file.log");
    let routes = json!({"routes": [{"id": "1", "uri": "/hello", "plugins": {"file-logger": {
        "path": path.to_str().unwrap(), "log_format": {"status": "$status", "args": "$args"},
        "match": [[["arg_skip", "!", "==", "yes"]]]}},
        "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}]})
    .to_string();
    let gw = Gateway::start(&routes);
    assert_eq!(get(gw.addr(), "/hello?n=1").status, 200);
    assert_eq!(get(gw.addr(), "/hello?skip=yes").status, 200);
    assert_eq!(get(gw.addr(), "/hello?n=2").status, 200);
    let first = file_lines(&path, 2);
    assert_eq!(
        first[0],
        json!({"status": "200", "args": "n=1", "route_id": "1"})
    );
    assert_eq!(first[1]["args"], "n=2");
    // logrotate: the file moved away, then SIGUSR1; the next lines go to a new file.
    let rotated = dir.path().join("file.log.1");
    std::fs::rename(&path, &rotated).unwrap();
    gw.signal("USR1");
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(get(gw.addr(), "/hello?n=3").status, 200);
    let after = file_lines(&path, 1);
    assert_eq!(
        after,
        vec![json!({"status": "200", "args": "n=3", "route_id": "1"})]
    );
    assert_eq!(file_lines(&rotated, 2).len(), 2);
}

/// file-logger's `log_format_extra`: the default entry keeps every field and gains the extra
/// ones, resolved per request; an extra key naming a default field does not replace it.
#[test]
fn file_logger_log_format_extra_adds_to_the_default_entry() {
    let up = Upstream::start("u", Behaviour::Echo);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("extra.log");
    let routes = json!({"routes": [{"id": "7", "uri": "/hello", "plugins": {"file-logger": {
        "path": path.to_str().unwrap(),
        "log_format_extra": {"tenant": "$http_x_tenant", "route_id": "not-the-route"}}},
        "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}]})
    .to_string();
    let gw = Gateway::start(&routes);
    let r = request(gw.addr(), "GET", "/hello?a=1", &[("x-tenant", "acme")], b"");
    assert_eq!(r.status, 200);
    let line = &file_lines(&path, 1)[0];
    assert_eq!(line["tenant"], "acme");
    assert_eq!(line["route_id"], "7", "a default field is not replaced");
    assert_eq!(line["request"]["uri"], "/hello?a=1");
    assert_eq!(line["response"]["status"], 200);
    assert!(
        line.get("upstream").is_some() && line.get("latency").is_some(),
        "{line}"
    );
}

/// What every logger of the all-loggers test writes once per entry: the value of the
/// `X-Mark` header wrk sends, taken by each logger's `log_format` (or lago's template).
const MARK: &str = "zq9mark7x";

fn marks(bytes: &[u8]) -> usize {
    bytes
        .windows(MARK.len())
        .filter(|w| *w == MARK.as_bytes())
        .count()
}

/// A TCP log server: counts the marks in everything each connection wrote.
fn tcp_mark_sink(count: Arc<AtomicUsize>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let count = count.clone();
            std::thread::spawn(move || {
                let mut all = Vec::new();
                let _ = s.read_to_end(&mut all);
                count.fetch_add(marks(&all), Ordering::Relaxed);
            });
        }
    });
    addr
}

/// A UDP log server: counts the marks of every datagram.
fn udp_mark_sink(count: Arc<AtomicUsize>) -> SocketAddr {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = socket.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        while let Ok(n) = socket.recv(&mut buf) {
            count.fetch_add(marks(&buf[..n]), Ordering::Relaxed);
        }
    });
    addr
}

/// A TLS log server (SLS's syslog endpoint), the test certificate: counts the marks in
/// everything each connection wrote.
fn tls_mark_sink(count: Arc<AtomicUsize>) -> SocketAddr {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tls/");
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(format!("{data}server.crt"))
            .unwrap()
            .map(|c| c.unwrap())
            .collect();
    let key = PrivateKeyDer::from_pem_file(format!("{data}server.key")).unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    // rustls's default: TLS 1.3 session tickets after the handshake, which the gateway must
    // read before it closes (a close with unread data is a reset, and the tail is lost).
    config.send_tls13_tickets = 2;
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            let (count, config) = (count.clone(), config.clone());
            std::thread::spawn(move || {
                let conn = rustls::ServerConnection::new(config).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, s);
                let mut all = Vec::new();
                // A close without close_notify still ends what was sent.
                let _ = tls.read_to_end(&mut all);
                count.fetch_add(marks(&all), Ordering::Relaxed);
            });
        }
    });
    addr
}

/// An HTTP log service: counts the marks of each request's body sent to `path` and answers
/// `answer`; any other request is answered 404 (and its marks are not counted).
fn http_mark_sink(
    count: Arc<AtomicUsize>,
    method_path: &'static str,
    answer: (u16, &'static str),
) -> SocketAddr {
    crate::plugins_long_tail::http_server(move |head, body| {
        if head.starts_with(method_path) {
            count.fetch_add(marks(body), Ordering::Relaxed);
            (answer.0, answer.1.to_owned())
        } else if head.starts_with("GET / ") {
            // Elasticsearch's version, asked once.
            (200, r#"{"version":{"number":"8.11.0"}}"#.to_owned())
        } else if head.starts_with("POST /token ") {
            // Google's OAuth token endpoint.
            (
                200,
                r#"{"access_token":"at-1","expires_in":3600,"token_type":"Bearer"}"#.to_owned(),
            )
        } else {
            (404, format!("unexpected {head}"))
        }
    })
}

/// Issue 45: every logger ferrisix builds on one route, under wrk: each sink gets exactly one
/// entry per request the upstream served, none lost, none twice. The sinks are the in-test
/// servers of the loggers' own tests (HTTP services, TCP/UDP/TLS log servers, the in-test
/// Kafka broker and RocketMQ cluster) and a file.
#[test]
fn every_logger_delivers_exactly_once_under_wrk() {
    use ferrisix_plugins::log::kafka_logger::test_broker::broker;
    use ferrisix_plugins::log::rocketmq_logger::test_broker::cluster;
    ensure_wrk();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut kafka = rt.block_on(broker("access", 2, false));
    let mut mq = rt.block_on(cluster("access", 2, None));
    let up = Upstream::start("u", Behaviour::Echo);
    let names = [
        "http-logger",
        "tcp-logger",
        "udp-logger",
        "syslog",
        "file-logger",
        "clickhouse-logger",
        "elasticsearch-logger",
        "loki-logger",
        "skywalking-logger",
        "splunk-hec-logging",
        "loggly",
        "sls-logger",
        "google-cloud-logging",
        "tencent-cloud-cls",
        "lago",
        "kafka-logger",
        "rocketmq-logger",
    ];
    let counts: Vec<Arc<AtomicUsize>> = names.iter().map(|_| Arc::default()).collect();
    let c = |name: &str| counts[names.iter().position(|n| *n == name).unwrap()].clone();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("access.log");
    let fmt = json!({"mark": "$http_x_mark", "status": "$status"});
    let http = http_mark_sink(c("http-logger"), "POST /log ", (200, "ok"));
    let tcp = tcp_mark_sink(c("tcp-logger"));
    let udp = udp_mark_sink(c("udp-logger"));
    let syslog = tcp_mark_sink(c("syslog"));
    let ch = http_mark_sink(c("clickhouse-logger"), "POST / ", (200, ""));
    let es = http_mark_sink(
        c("elasticsearch-logger"),
        "POST /_bulk ",
        (200, r#"{"errors":false}"#),
    );
    let loki = http_mark_sink(c("loki-logger"), "POST /loki/api/v1/push ", (204, ""));
    let sw = http_mark_sink(c("skywalking-logger"), "POST /v3/logs ", (200, ""));
    let hec = http_mark_sink(
        c("splunk-hec-logging"),
        "POST /services/collector ",
        (200, r#"{"text":"Success","code":0}"#),
    );
    let loggly = http_mark_sink(
        c("loggly"),
        "POST /bulk/tok/tag/bulk ",
        (200, r#"{"response":"ok"}"#),
    );
    let sls = tls_mark_sink(c("sls-logger"));
    let google = http_mark_sink(
        c("google-cloud-logging"),
        "POST /v2/entries:write ",
        (200, "{}"),
    );
    let cls = http_mark_sink(
        c("tencent-cloud-cls"),
        "POST /structuredlog?topic_id=t1 ",
        (200, ""),
    );
    let lago = http_mark_sink(c("lago"), "POST /api/v1/events/batch ", (200, "{}"));
    let key = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/tls/dual-rsa.key"
    ))
    .unwrap();
    let plugins = json!({
        "http-logger": {"uri": format!("http://{http}/log"), "log_format": fmt},
        "tcp-logger": {"host": "127.0.0.1", "port": tcp.port(), "log_format": fmt},
        // A datagram a batch: small batches keep each well under the loopback's limits.
        "udp-logger": {"host": "127.0.0.1", "port": udp.port(), "batch_max_size": 20, "log_format": fmt},
        "syslog": {"host": "127.0.0.1", "port": syslog.port(), "log_format": fmt},
        "file-logger": {"path": file.to_str().unwrap(), "log_format": fmt},
        "clickhouse-logger": {"endpoint_addr": format!("http://{ch}/"), "user": "u", "password": "p",
            "database": "d", "logtable": "t", "log_format": fmt},
        "elasticsearch-logger": {"endpoint_addr": format!("http://{es}"), "field": {"index": "gw"},
            "log_format": fmt},
        "loki-logger": {"endpoint_addrs": [format!("http://{loki}")], "log_format": fmt},
        "skywalking-logger": {"endpoint_addr": format!("http://{sw}"), "log_format": fmt},
        "splunk-hec-logging": {"endpoint": {"uri": format!("http://{hec}/services/collector"),
            "token": "t"}, "log_format": fmt},
        "loggly": {"customer_token": "tok", "log_format": fmt},
        "sls-logger": {"host": "127.0.0.1", "port": sls.port(), "project": "p", "logstore": "l",
            "access_key_id": "ak", "access_key_secret": "sk", "ssl_verify": false, "log_format": fmt},
        "google-cloud-logging": {"auth_config": {"client_email": "gw@p.iam.gserviceaccount.com",
            "private_key": key, "project_id": "p", "token_uri": format!("http://{google}/token"),
            "entries_uri": format!("http://{google}/v2/entries:write")}, "ssl_verify": false,
            "log_format": fmt},
        "tencent-cloud-cls": {"cls_host": cls.to_string(), "cls_topic": "t1", "scheme": "http",
            "secret_id": "AKID", "secret_key": "SKEY", "log_format": fmt},
        "lago": {"endpoint_addrs": [format!("http://{lago}")], "token": "t",
            "event_transaction_id": "${request_id}", "event_subscription_id": "$http_x_mark",
            "event_code": "call", "ssl_verify": false},
        "kafka-logger": {"brokers": [{"host": "127.0.0.1", "port": kafka.port}],
            "kafka_topic": "access", "log_format": fmt},
        "rocketmq-logger": {"nameserver_list": [format!("127.0.0.1:{}", mq.nameserver_port)],
            "topic": "access", "log_format": fmt}
    });
    assert_eq!(plugins.as_object().unwrap().len(), names.len());
    let conf = json!({
        "routes": [{"id": "1", "uri": "/hello", "plugins": plugins,
            "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}],
        "plugin_metadata": [{"id": "loggly", "host": format!("http://{loggly}"), "protocol": "http"}]
    });
    let mut gw = Gateway::start(&conf.to_string());
    let out = std::process::Command::new("wrk")
        .args([
            "-t",
            "2",
            "-c",
            "16",
            "-d",
            "5s",
            "-H",
            &format!("X-Mark: {MARK}"),
        ])
        .arg(format!("http://{}/hello", gw.addr()))
        .output()
        .expect("run wrk");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // The graceful shutdown sends the last, partial batches.
    gw.signal("TERM");
    let status = gw.child.wait().expect("the gateway exits");
    assert!(status.success(), "{status:?}");
    let served = up.hits();
    assert!(served > 100, "{text}");
    // What the gateway sent before it exited may still be in the sinks' threads.
    let (kafka_count, mq_count, file_count) =
        (c("kafka-logger"), c("rocketmq-logger"), c("file-logger"));
    let mut collect = || {
        while let Ok(r) = kafka.records.try_recv() {
            kafka_count.fetch_add(marks(&r.value), Ordering::Relaxed);
        }
        while let Ok(m) = mq.sent.try_recv() {
            mq_count.fetch_add(marks(&m.body), Ordering::Relaxed);
        }
        let lines = std::fs::read(&file).unwrap_or_default();
        file_count.store(marks(&lines), Ordering::Relaxed);
    };
    let settled = poll_until(std::time::Duration::from_secs(10), || {
        collect();
        counts.iter().all(|n| n.load(Ordering::Relaxed) >= served)
    });
    let got = |counts: &[Arc<AtomicUsize>]| -> Vec<(&str, usize)> {
        names
            .iter()
            .zip(counts)
            .map(|(n, c)| (*n, c.load(Ordering::Relaxed)))
            .collect()
    };
    eprintln!(
        "wrk: {served} requests served\n{text}\nentries per logger: {:?}",
        got(&counts)
    );
    assert!(
        settled.is_some(),
        "entries lost: {served} served, {:?}",
        got(&counts)
    );
    // Nothing arrives twice (a batch sent again after its success would show here).
    std::thread::sleep(std::time::Duration::from_secs(1));
    collect();
    for (name, n) in names.iter().zip(&counts) {
        assert_eq!(
            n.load(Ordering::Relaxed),
            served,
            "{name}: {:?}",
            got(&counts)
        );
    }
    drop(rt);
}
