//! xRPC's redis protocol on stream routes end to end: Debian's redis-server behind a route
//! with `protocol: redis`, driven through the gateway with redis-cli and a raw RESP socket
//! (pipelining, fault delays, pub/sub), the per-command syslog entries caught by an in-test
//! UDP syslog receiver, and the redis metrics scraped from the prometheus exporter.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::support::redis::{redis_cli, require_redis, Redis};
use crate::support::{free_port, get, poll_until, Gateway};

const XRPC: &str =
    "stream_plugins:\n  - prometheus\n  - syslog\nxrpc:\n  protocols:\n    - name: redis\n";

fn stream_keys(ports: &[u16]) -> String {
    let mut s = "proxy_mode: http&stream\nstream_proxy:\n  tcp:\n".to_string();
    for p in ports {
        s.push_str(&format!("    - \"127.0.0.1:{p}\"\n"));
    }
    s
}

/// A UDP syslog receiver: the JSON of each RFC 5424 message it got.
fn syslog_receiver() -> (u16, Arc<Mutex<Vec<Value>>>) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = socket.local_addr().unwrap().port();
    let got = Arc::new(Mutex::new(Vec::new()));
    let sink = got.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        while let Ok(n) = socket.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            // `<46>1 <time> <host> apisix <pid> - - <json>`
            let json = text
                .split_once(" - - ")
                .map(|(_, j)| j.trim())
                .unwrap_or("");
            let v: Value = serde_json::from_str(json)
                .unwrap_or_else(|e| panic!("not a syslog JSON message ({e}): {text}"));
            sink.lock().unwrap().push(v);
        }
    });
    (port, got)
}

fn logged(got: &Arc<Mutex<Vec<Value>>>, logger: &str, cmd: &str) -> Option<Value> {
    got.lock()
        .unwrap()
        .iter()
        .find(|v| v["logger"] == logger && v["cmd"] == cmd)
        .cloned()
}

fn resp(args: &[&str]) -> Vec<u8> {
    let mut v = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        v.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    v
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Reads exactly `want.len()` bytes and compares them with `want`.
fn expect(s: &mut TcpStream, want: &str) {
    let mut buf = vec![0u8; want.len()];
    s.read_exact(&mut buf)
        .unwrap_or_else(|e| panic!("waiting for {want:?}: {e}"));
    assert_eq!(String::from_utf8_lossy(&buf), want);
}

/// Reads until the gateway closes the connection: what came before.
fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    let mut all = Vec::new();
    s.read_to_end(&mut all)
        .expect("the gateway closes the connection (no read timeout)");
    all
}

fn logger(name: &str, syslog: u16, filter: &str) -> String {
    format!(
        "      - name: syslog\n{filter}        conf:\n          host: 127.0.0.1\n          port: {syslog}\n          sock_type: udp\n          batch_max_size: 1\n          log_format:\n            logger: {name}\n            cmd: $redis_cmd_line\n            rpc_time: $rpc_time\n            route: $route_id\n"
    )
}

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn redis_xrpc_commands_pipelining_faults_pubsub_logs_and_metrics() {
    require_redis();
    let redis = Redis::start(false);
    let (syslog, got) = syslog_receiver();
    let tcp = free_port();
    let dead = crate::support::dead_node();
    let loggers = [
        logger(
            "slow",
            syslog,
            "        filter:\n          - [rpc_time, \">=\", 0.05]\n",
        ),
        logger("all", syslog, ""),
        logger(
            "never",
            syslog,
            "        filter:\n          - [remote_addr, \"==\", \"192.0.2.1\"]\n",
        ),
    ]
    .concat();
    // Route 2 comes first and would match, but a subordinate route is never matched at the
    // entry: its dead node is never tried.
    let routes = format!(
        "stream_routes:
  - id: 2
    server_port: {tcp}
    protocol:
      name: redis
      superior_id: 1
    upstream:
      type: roundrobin
      nodes:
        \"{dead}\": 1
  - id: 1
    server_port: {tcp}
    protocol:
      name: redis
      conf:
        faults:
          - commands: [get]
            key: slow
            delay: 0.05
      metric:
        enable: true
      logger:
{loggers}    upstream:
      type: roundrobin
      nodes:
        \"127.0.0.1:{}\": 1
",
        redis.port
    );
    let gw = Gateway::start_full(&routes, &stream_keys(&[tcp]), XRPC);
    let ready = poll_until(Duration::from_secs(10), || {
        redis_cli(tcp, &["PING"]).trim() == "PONG"
    });
    assert!(ready.is_some(), "redis-cli PING through the gateway");

    // Plain commands with redis-cli.
    assert_eq!(redis_cli(tcp, &["SET", "a", "1"]).trim(), "OK");
    assert_eq!(redis_cli(tcp, &["GET", "a"]).trim(), "1");
    assert_eq!(redis_cli(redis.port, &["GET", "a"]).trim(), "1");

    // Pipelining: three commands in one write, the answers in order.
    let mut s = connect(tcp);
    let mut batch = resp(&["SET", "p", "1"]);
    batch.extend(resp(&["INCR", "p"]));
    batch.extend(resp(&["GET", "p"]));
    s.write_all(&batch).unwrap();
    expect(&mut s, "+OK\r\n:2\r\n$1\r\n2\r\n");

    // A delayed command in a pipeline keeps its place: its answer comes first.
    let mut batch = resp(&["get", "slow"]);
    batch.extend(resp(&["PING"]));
    batch.extend(resp(&["GET", "a"]));
    s.write_all(&batch).unwrap();
    expect(&mut s, "$-1\r\n+PONG\r\n$1\r\n1\r\n");

    // A value larger than the read buffers crosses whole; the log keeps its first bytes.
    let big = "x".repeat(200_000);
    let mut set = std::process::Command::new("redis-cli")
        .args(["-p", &tcp.to_string(), "-x", "SET", "big"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("redis-cli");
    set.stdin.take().unwrap().write_all(big.as_bytes()).unwrap();
    let out = set.wait_with_output().expect("redis-cli SET big");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK");
    assert_eq!(redis_cli(tcp, &["STRLEN", "big"]).trim(), "200000");

    // Pub/sub: the subscription's messages are not requests.
    let mut sub = connect(tcp);
    sub.write_all(&resp(&["SUBSCRIBE", "dog"])).unwrap();
    expect(&mut sub, "*3\r\n$9\r\nsubscribe\r\n$3\r\ndog\r\n:1\r\n");
    assert_eq!(redis_cli(tcp, &["PUBLISH", "dog", "Hello"]).trim(), "1");
    expect(
        &mut sub,
        "*3\r\n$7\r\nmessage\r\n$3\r\ndog\r\n$5\r\nHello\r\n",
    );
    sub.write_all(&resp(&["UNSUBSCRIBE"])).unwrap();
    expect(&mut sub, "*3\r\n$11\r\nunsubscribe\r\n$3\r\ndog\r\n:0\r\n");
    sub.write_all(&resp(&["SET", "dog", "1"])).unwrap();
    expect(&mut sub, "+OK\r\n");

    // Every command was logged once finished, by the loggers whose filter passed.
    let wanted = [
        "set a 1",
        "get a",
        "set p 1",
        "incr p",
        "get p",
        "get slow",
        "ping",
        "strlen big",
        "subscribe dog",
        "publish dog Hello",
        "unsubscribe",
        "set dog 1",
    ];
    let all_logged = poll_until(Duration::from_secs(10), || {
        wanted.iter().all(|c| logged(&got, "all", c).is_some())
    });
    assert!(
        all_logged.is_some(),
        "missing entries in {:?}",
        got.lock().unwrap()
    );
    let set_big = format!("set big {}...(200000 bytes)", "x".repeat(128));
    assert!(
        poll_until(Duration::from_secs(5), || logged(&got, "all", &set_big)
            .is_some())
        .is_some(),
        "{:?}",
        got.lock().unwrap()
    );
    let entry = logged(&got, "all", "get slow").unwrap();
    assert_eq!(entry["route"], "1");
    // The filtered logger saw the delayed command (its rpc_time includes the delay).
    let slow = poll_until(Duration::from_secs(5), || {
        logged(&got, "slow", "get slow").is_some()
    });
    assert!(slow.is_some(), "{:?}", got.lock().unwrap());
    let rpc_time: f64 = logged(&got, "slow", "get slow").unwrap()["rpc_time"]
        .as_f64()
        .or_else(|| {
            logged(&got, "slow", "get slow").unwrap()["rpc_time"]
                .as_str()
                .and_then(|t| t.parse().ok())
        })
        .unwrap();
    assert!(rpc_time >= 0.05, "{rpc_time}");
    // No published message became a request, and the never-matching filter logged nothing.
    let entries = got.lock().unwrap().clone();
    assert!(
        !entries
            .iter()
            .any(|v| v["cmd"].as_str().is_some_and(|c| c.starts_with("message"))),
        "{entries:?}"
    );
    assert!(
        !entries.iter().any(|v| v["logger"] == "never"),
        "{entries:?}"
    );

    // The redis metrics, per route and command.
    let metrics_addr = std::net::SocketAddr::from(([127, 0, 0, 1], gw.metrics_port));
    let mut text = String::new();
    let counted = poll_until(Duration::from_secs(10), || {
        text = get(metrics_addr, "/apisix/prometheus/metrics").text();
        metric(
            &text,
            "apisix_redis_commands_total{route=\"1\",command=\"set\"}",
        ) == Some(4.0)
    });
    assert!(counted.is_some(), "{text}");
    assert!(
        text.contains("# TYPE apisix_redis_commands_total counter\n"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE apisix_redis_commands_latency_seconds histogram\n"),
        "{text}"
    );
    let get_series = |le: &str| {
        metric(
            &text,
            &format!(
                "apisix_redis_commands_latency_seconds_bucket{{route=\"1\",command=\"get\",le=\"{le}\"}}"
            ),
        )
    };
    assert_eq!(
        metric(
            &text,
            "apisix_redis_commands_total{route=\"1\",command=\"get\"}"
        ),
        Some(4.0),
        "{text}"
    );
    assert_eq!(get_series("+Inf"), Some(4.0), "{text}");
    // The delayed GET took at least its delay: it is not in the 0.02 s bucket.
    assert!(get_series("0.02").is_some_and(|n| n <= 3.0), "{text}");
    assert_eq!(
        metric(
            &text,
            "apisix_redis_commands_latency_seconds_count{route=\"1\",command=\"get\"}"
        ),
        Some(4.0),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "apisix_redis_commands_total{route=\"1\",command=\"publish\"}"
        ),
        Some(1.0),
        "{text}"
    );
}

/// A fake redis that answers one command with `+OK` and then closes.
fn answers_once_then_closes() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut c) = conn else { return };
            let mut buf = [0u8; 1024];
            if c.read(&mut buf).unwrap_or(0) > 0 {
                let _ = c.write_all(b"+OK\r\n");
            }
            drop(c);
        }
    });
    port
}

#[test]
fn redis_xrpc_bad_input_ends_the_session() {
    require_redis();
    let redis = Redis::start(false);
    let (tcp, flaky, dubbo, bad_conf) = (free_port(), free_port(), free_port(), free_port());
    let fake = answers_once_then_closes();
    let route = |id: &str, port: u16, protocol: &str, node: &str| {
        format!(
            "  - id: {id}\n    server_port: {port}\n    protocol:\n{protocol}    upstream:\n      type: roundrobin\n      nodes:\n        \"{node}\": 1\n"
        )
    };
    let redis_node = format!("127.0.0.1:{}", redis.port);
    let routes = format!(
        "stream_routes:\n{}{}{}{}",
        route("1", tcp, "      name: redis\n", &redis_node),
        route(
            "2",
            flaky,
            "      name: redis\n",
            &format!("127.0.0.1:{fake}")
        ),
        // dubbo is not built: the route is refused ("unknown protocol [dubbo]").
        route("3", dubbo, "      name: dubbo\n", &redis_node),
        // A conf the redis schema refuses.
        route(
            "4",
            bad_conf,
            "      name: redis\n      conf:\n        faults: []\n",
            &redis_node
        ),
    );
    let _gw = Gateway::start_full(
        &routes,
        &stream_keys(&[tcp, flaky, dubbo, bad_conf]),
        "xrpc:\n  protocols:\n    - name: redis\n    - name: dubbo\n",
    );
    let ready = poll_until(Duration::from_secs(10), || {
        redis_cli(tcp, &["PING"]).trim() == "PONG"
    });
    assert!(ready.is_some(), "redis-cli PING through the gateway");

    // Malformed RESP closes the connection without an answer.
    for bad in [&b"*-1\r\n"[..], b"PING\r\n", b"*1e9\r\n", b"*1\r\n$-3\r\n"] {
        let mut s = connect(tcp);
        s.write_all(bad).unwrap();
        assert_eq!(
            read_to_close(&mut s),
            b"",
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    // A malformed command ends the session, the good one before it in the same read
    // included (APISIX passes a read's commands on once all of them parsed).
    let mut s = connect(tcp);
    let mut batch = resp(&["PING"]);
    batch.extend_from_slice(b"*0\r\n");
    s.write_all(&batch).unwrap();
    let got = read_to_close(&mut s);
    assert!(got.is_empty() || got == b"+PONG\r\n", "{got:?}");

    // A bulk length past redis' limit: the gateway holds none of it back, redis refuses it
    // and closes, and so does the session.
    let mut s = connect(tcp);
    s.write_all(b"*2\r\n$3\r\nGET\r\n$99999999999\r\nxxxx")
        .unwrap();
    let got = String::from_utf8_lossy(&read_to_close(&mut s)).into_owned();
    assert!(got.starts_with("-ERR Protocol error"), "{got}");

    // An upstream that goes away ends the session.
    let mut s = connect(flaky);
    s.write_all(&resp(&["PING"])).unwrap();
    expect(&mut s, "+OK\r\n");
    assert_eq!(read_to_close(&mut s), b"");

    // Routes with a protocol that is not there or a conf its schema refuses serve nothing.
    for port in [dubbo, bad_conf] {
        let mut s = connect(port);
        let _ = s.write_all(&resp(&["PING"]));
        assert_eq!(read_to_close(&mut s), b"", "port {port}");
    }
    // The good route still serves.
    assert_eq!(redis_cli(tcp, &["PING"]).trim(), "PONG");
}
