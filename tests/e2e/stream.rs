//! The stream proxy (`stream_routes`) end to end: Debian's redis-server behind a TCP stream
//! route, driven with redis-cli through the gateway; a UDP route to an in-test UDP echo.

use std::net::UdpSocket;
use std::time::Duration;

use crate::support::redis::{redis_cli, require_redis, Redis};
use crate::support::{free_port, poll_until, Gateway};

fn stream_keys(tcp: u16, udp: u16) -> String {
    format!(
        "proxy_mode: http&stream\nstream_proxy:\n  tcp:\n    - \"127.0.0.1:{tcp}\"\n  udp:\n    - \"127.0.0.1:{udp}\""
    )
}

#[test]
fn redis_cli_through_a_stream_route() {
    require_redis();
    let redis = Redis::start(false);
    let (tcp, udp) = (free_port(), free_port());
    let routes = format!(
        "stream_routes:\n  - id: 1\n    server_port: {tcp}\n    upstream:\n      type: roundrobin\n      nodes:\n        \"127.0.0.1:{}\": 1\n",
        redis.port
    );
    let _gw = Gateway::start_full(&routes, &stream_keys(tcp, udp), "");
    // The stream table follows the first snapshot: wait until the route answers.
    let ready = poll_until(Duration::from_secs(10), || {
        redis_cli(tcp, &["PING"]).trim() == "PONG"
    });
    assert!(
        ready.is_some(),
        "redis-cli PING through the gateway never answered PONG"
    );
    assert_eq!(redis_cli(tcp, &["SET", "through", "gateway"]).trim(), "OK");
    // The value reached the real server, and comes back through the gateway.
    assert_eq!(redis_cli(redis.port, &["GET", "through"]).trim(), "gateway");
    assert_eq!(redis_cli(tcp, &["GET", "through"]).trim(), "gateway");
    // A bulk value larger than one read buffer crosses intact both ways.
    // (From stdin with `-x`: one argument of the command line may not pass 128 KiB.)
    let big = "x".repeat(200_000);
    let mut set = std::process::Command::new("redis-cli")
        .args(["-p", &tcp.to_string(), "-x", "SET", "big"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("redis-cli");
    std::io::Write::write_all(&mut set.stdin.take().unwrap(), big.as_bytes()).unwrap();
    let out = set.wait_with_output().expect("redis-cli SET big");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK");
    assert_eq!(redis_cli(tcp, &["STRLEN", "big"]).trim(), "200000");
    assert_eq!(redis_cli(tcp, &["GET", "big"]).trim().len(), 200_000);
}

#[test]
fn udp_route_answers_datagrams_and_unmatched_ones_get_none() {
    let echo = UdpSocket::bind("127.0.0.1:0").unwrap();
    let echo_addr = echo.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while let Ok((n, peer)) = echo.recv_from(&mut buf) {
            let mut out = b"echo: ".to_vec();
            out.extend_from_slice(&buf[..n]);
            let _ = echo.send_to(&out, peer);
        }
    });
    let (tcp, udp) = (free_port(), free_port());
    let routes = format!(
        "stream_routes:\n  - id: u1\n    remote_addr: 127.0.0.1\n    upstream:\n      scheme: udp\n      type: roundrobin\n      nodes:\n        \"{echo_addr}\": 1\n"
    );
    let _gw = Gateway::start_full(&routes, &stream_keys(tcp, udp), "");
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = [0u8; 2048];
    let answered = poll_until(Duration::from_secs(10), || {
        client.send_to(b"ping", ("127.0.0.1", udp)).unwrap();
        matches!(client.recv_from(&mut buf), Ok((n, _)) if &buf[..n] == b"echo: ping")
    });
    assert!(answered.is_some(), "no answer through the UDP stream route");
    // The same session carries the next datagram.
    client.send_to(b"again", ("127.0.0.1", udp)).unwrap();
    let (n, _) = client.recv_from(&mut buf).expect("second answer");
    assert_eq!(&buf[..n], b"echo: again");

    // From 127.0.0.2 no route matches: no answer.
    let other = UdpSocket::bind("127.0.0.2:0").unwrap();
    other
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    other.send_to(b"ping", ("127.0.0.1", udp)).unwrap();
    assert!(
        other.recv_from(&mut buf).is_err(),
        "an unmatched datagram was answered"
    );
}

fn tls_data(name: &str) -> String {
    format!("{}/tests/data/tls/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A YAML block scalar holding the PEM file `name`, its lines indented `indent` spaces.
fn pem_block(name: &str, indent: usize) -> String {
    let text = std::fs::read_to_string(tls_data(name)).unwrap();
    let mut out = String::from("|\n");
    for line in text.lines() {
        out.push_str(&" ".repeat(indent));
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// curl over TLS to the stream port `port` as `server.local`, with the client certificate
/// `cert` (and its key) if any: its exit code and what the node answered.
fn curl_tls(port: u16, cert: Option<&str>) -> (i32, String) {
    let mut cmd = std::process::Command::new(crate::support::debian::require("curl"));
    cmd.args(["-sk", "--max-time", "5", "--resolve"])
        .arg(format!("server.local:{port}:127.0.0.1"));
    if let Some(cert) = cert {
        cmd.arg("--cert")
            .arg(tls_data(&format!("{cert}.crt")))
            .arg("--key")
            .arg(tls_data(&format!("{cert}.key")));
    }
    let out = cmd
        .arg(format!("https://server.local:{port}/mtls"))
        .stderr(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// mTLS on a `tls: true` stream port (APISIX's `t/stream-node/mtls.t`): an ssl with
/// `client.ca` lets a session in only with a certificate that CA signed; none, or a rogue or
/// expired one, is refused before any byte reaches the node. `skip_mtls_uri_regex` has no
/// URI to exempt on a stream port: the handshake finishes, the session is still refused.
#[test]
fn stream_tls_port_requires_a_verified_client_certificate() {
    use crate::support::{Behaviour, Upstream};
    let up = Upstream::start("n", Behaviour::Echo);
    let (strict, lenient) = (free_port(), free_port());
    let apisix_yaml = format!(
        "ssls:\n  - id: \"strict\"\n    sni: \"server.local\"\n    cert: {cert}    key: {key}    client:\n      ca: {ca}\
         stream_routes:\n  - id: s\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{node}\": 1\n",
        cert = pem_block("server.crt", 6),
        key = pem_block("server.key", 6),
        ca = pem_block("client-ca.crt", 8),
        node = up.node(),
    );
    let keys = format!(
        "proxy_mode: http&stream\nstream_proxy:\n  tcp:\n    - addr: \"127.0.0.1:{strict}\"\n      tls: true\n"
    );
    let _gw = Gateway::start_full(&apisix_yaml, &keys, "");
    let mut body = String::new();
    let through = poll_until(Duration::from_secs(10), || {
        let (code, out) = curl_tls(strict, Some("client"));
        body = out;
        code == 0
    });
    assert!(
        through.is_some(),
        "a verified client certificate was refused: {body}"
    );
    assert!(body.contains("/mtls"), "{body}");
    for cert in [None, Some("rogue"), Some("expired-client")] {
        let (code, out) = curl_tls(strict, cert);
        assert_ne!(code, 0, "{cert:?} must be refused, the node answered {out}");
        assert!(out.is_empty(), "{cert:?}: {out}");
    }

    // With skip_mtls_uri_regex the handshake only asks; the stream port still refuses.
    let apisix_yaml = apisix_yaml.replace(
        "    client:\n",
        "    client:\n      skip_mtls_uri_regex:\n        - \"^/mtls\"\n",
    );
    let keys = keys.replace(&strict.to_string(), &lenient.to_string());
    let _gw2 = Gateway::start_full(&apisix_yaml, &keys, "");
    let through = poll_until(Duration::from_secs(10), || {
        curl_tls(lenient, Some("client")).0 == 0
    });
    assert!(
        through.is_some(),
        "a verified client certificate was refused"
    );
    let (code, out) = curl_tls(lenient, None);
    assert_ne!(code, 0, "no certificate must be refused, got {out}");
    assert!(out.is_empty(), "{out}");
}

/// A TCP node that echoes what it reads, until the peer closes.
fn tcp_echo() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut back = conn.try_clone().unwrap();
                let _ = std::io::copy(&mut conn, &mut back);
            });
        }
    });
    addr
}

/// A session through `port`: `Some(stream)` when its bytes come back, `None` when the
/// gateway closed it first.
fn echo_session(port: u16) -> Option<std::net::TcpStream> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"hi").ok()?;
    let mut buf = [0u8; 2];
    s.read_exact(&mut buf).ok()?;
    (&buf == b"hi").then_some(s)
}

/// The members of every stream limit-conn sorted set, summed over `servers`.
fn stream_limit_members(servers: &[Redis]) -> usize {
    servers
        .iter()
        .map(|r| {
            crate::support::redis::redis_keys(r.port, "limit_conn:/apisix/stream_routes/*")
                .iter()
                .map(|k| {
                    redis_cli(r.port, &["ZCARD", k])
                        .trim()
                        .parse::<usize>()
                        .unwrap_or(0)
                })
                .sum::<usize>()
        })
        .sum()
}

/// limit-conn with `policy: redis` and `redis-cluster` on a stream route: two gateways on
/// the same Redis share the count (a session held through one refuses the next through the
/// other), and the member goes when the session ends.
#[test]
fn stream_limit_conn_counts_in_redis_and_redis_cluster() {
    require_redis();
    let node = tcp_echo();
    let single = vec![Redis::start(false)];
    let cluster = crate::support::redis::redis_cluster();
    for (servers, policy) in [
        (
            &single,
            format!(
                "policy: redis\n          redis_host: 127.0.0.1\n          redis_port: {}",
                single[0].port
            ),
        ),
        (
            &cluster,
            format!(
                "policy: redis-cluster\n          redis_cluster_name: test\n          redis_cluster_nodes:\n{}",
                cluster
                    .iter()
                    .map(|r| format!("            - \"{}\"\n", r.node()))
                    .collect::<String>()
                    .trim_end()
            ),
        ),
    ] {
        let routes = format!(
            "stream_routes:\n  - id: lc\n    plugins:\n      limit-conn:\n          conn: 1\n          burst: 0\n          default_conn_delay: 0.1\n          key: remote_addr\n          {policy}\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{node}\": 1\n"
        );
        let (a, b) = (free_port(), free_port());
        let _gw_a = Gateway::start_full(&routes, &stream_keys(a, free_port()), "");
        let _gw_b = Gateway::start_full(&routes, &stream_keys(b, free_port()), "");
        let mut held = None;
        poll_until(Duration::from_secs(10), || {
            held = echo_session(a);
            held.is_some()
        });
        assert!(held.is_some(), "{policy}: the first session was refused");
        assert_eq!(stream_limit_members(servers), 1, "{policy}");
        // Past conn + burst, through either gateway: closed before any byte is relayed.
        assert!(echo_session(b).is_none(), "{policy}: over the limit on b");
        assert!(echo_session(a).is_none(), "{policy}: over the limit on a");
        assert_eq!(stream_limit_members(servers), 1, "{policy}");
        // The held session ends: its member goes, and the other gateway lets one in.
        drop(held);
        let released = poll_until(Duration::from_secs(10), || {
            stream_limit_members(servers) == 0
        });
        assert!(released.is_some(), "{policy}: the member was not removed");
        // The gateway that held it removed the member after the session's end; the other
        // counts afresh on its next session.
        let admitted = poll_until(Duration::from_secs(10), || echo_session(b).is_some());
        assert!(admitted.is_some(), "{policy}: refused after release");
    }
}

/// A stream limit-conn whose Redis is down closes the session (APISIX's 500), unless
/// `allow_degradation` lets it through uncounted. A plain route on another port shows the
/// table is in before the limited port is tried.
#[test]
fn stream_limit_conn_redis_down_closes_or_degrades() {
    let node = tcp_echo();
    let dead = free_port();
    for (degrade, expect_through) in [("false", false), ("true", true)] {
        let (limited, plain) = (free_port(), free_port());
        let routes = format!(
            "stream_routes:\n  - id: lc\n    server_port: {limited}\n    plugins:\n      limit-conn:\n          conn: 1\n          burst: 0\n          default_conn_delay: 0.1\n          key: remote_addr\n          policy: redis\n          redis_host: 127.0.0.1\n          redis_port: {dead}\n          redis_timeout: 200\n          allow_degradation: {degrade}\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{node}\": 1\n\
             \x20 - id: plain\n    server_port: {plain}\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{node}\": 1\n"
        );
        let keys = format!(
            "proxy_mode: http&stream\nstream_proxy:\n  tcp:\n    - \"127.0.0.1:{limited}\"\n    - \"127.0.0.1:{plain}\"\n"
        );
        let _gw = Gateway::start_full(&routes, &keys, "");
        let ready = poll_until(Duration::from_secs(10), || echo_session(plain).is_some());
        assert!(ready.is_some(), "the plain stream route never answered");
        assert_eq!(
            echo_session(limited).is_some(),
            expect_through,
            "allow_degradation: {degrade}"
        );
    }
}

/// The control API lists stream routes' health checkers as APISIX's does: in
/// `/v1/healthcheck` between the routes' and the upstreams', and one by one under
/// `/v1/healthcheck/stream_routes/{id}`, with APISIX's 404s.
#[test]
fn control_api_lists_stream_route_health_checkers() {
    use crate::support::{dead_node, StoreGatewayBuilder};
    use serde_json::json;
    let live = tcp_echo().to_string();
    let dead = dead_node();
    let tcp = free_port();
    let gw = StoreGatewayBuilder::embedded()
        .apisix_key(&format!(
            "proxy_mode: http&stream\nstream_proxy:\n  tcp:\n    - \"127.0.0.1:{tcp}\"\n"
        ))
        .start();
    let checks = json!({"active": {"type": "tcp",
        "healthy": {"interval": 1, "successes": 1},
        "unhealthy": {"interval": 1, "tcp_failures": 1}}});
    let upstream = json!({"type": "roundrobin", "nodes": {live.clone(): 1, dead.clone(): 1},
        "checks": checks});
    let put = |path: &str, body: serde_json::Value| {
        let r = gw.admin("PUT", path, &body.to_string());
        assert!(matches!(r.status, 200 | 201), "{path}: {}", r.text());
    };
    put("/apisix/admin/upstreams/u1", upstream.clone());
    put(
        "/apisix/admin/routes/r1",
        json!({"uri": "/r1", "upstream": upstream.clone()}),
    );
    put(
        "/apisix/admin/stream_routes/s1",
        json!({"server_port": tcp, "upstream": upstream.clone()}),
    );
    // A stream route on a shared upstream has no checker of its own.
    put(
        "/apisix/admin/stream_routes/s2",
        json!({"server_port": 1, "upstream_id": "u1"}),
    );
    let mut list = serde_json::Value::Null;
    let listed = poll_until(Duration::from_secs(15), || {
        list = gw.control("/v1/healthcheck").json();
        list.as_array().is_some_and(|l| l.len() == 3)
    });
    assert!(listed.is_some(), "{list}");
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        names,
        [
            "/apisix/routes/r1",
            "/apisix/stream_routes/s1",
            "/apisix/upstreams/u1"
        ]
    );

    // The dead node is found out by the stream route's own checker.
    let mut one = serde_json::Value::Null;
    let down = poll_until(Duration::from_secs(15), || {
        let r = gw.control("/v1/healthcheck/stream_routes/s1");
        assert_eq!(r.status, 200, "{}", r.text());
        one = r.json();
        one["nodes"].as_array().is_some_and(|nodes| {
            nodes.iter().any(|n| {
                format!("{}:{}", n["ip"].as_str().unwrap_or_default(), n["port"]) == dead
                    && n["status"] == "unhealthy"
            })
        })
    });
    assert!(down.is_some(), "{one}");
    assert_eq!(one["type"], "tcp");
    assert_eq!(one["name"], "/apisix/stream_routes/s1");
    // `apisix_upstream_status` reports the stream route's checker too, as APISIX's exporter
    // reads the same list.
    let metrics = crate::support::get(
        std::net::SocketAddr::from(([127, 0, 0, 1], gw.metrics_port)),
        "/apisix/prometheus/metrics",
    )
    .text();
    for (node, up) in [(&dead, 0), (&live, 1)] {
        let (ip, port) = node.rsplit_once(':').unwrap();
        let series = format!(
            "apisix_upstream_status{{name=\"/apisix/stream_routes/s1\",ip=\"{ip}\",port=\"{port}\"}} {up}"
        );
        assert!(
            metrics.lines().any(|l| l == series),
            "no {series} in\n{metrics}"
        );
    }
    // The live node is what the stream route serves.
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", tcp)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    for _ in 0..3 {
        s.write_all(b"hi").unwrap();
        let mut buf = [0u8; 2];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hi");
    }

    for (path, status, message) in [
        (
            "/v1/healthcheck/stream_routes/s2",
            404,
            "no checker for stream_routes[s2]",
        ),
        (
            "/v1/healthcheck/stream_routes/nope",
            404,
            "stream_routes[nope] not found",
        ),
        (
            "/v1/healthcheck/stream_routes",
            404,
            "missing src id for src type stream_routes",
        ),
    ] {
        let r = gw.control(path);
        assert_eq!(r.status, status, "{path}: {}", r.text());
        assert_eq!(r.json()["error_msg"], message, "{path}");
    }
}

/// A TCP node that writes `<name>\n` to each connection and closes it.
fn named_node(name: &'static str) -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let _ = std::io::Write::write_all(&mut conn, format!("{name}\n").as_bytes());
        }
    });
    addr
}

/// `openssl s_client` to the stream TLS port as `sni`, with `args`; stdout and stderr.
fn s_client(port: u16, sni: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(crate::support::debian::require("openssl"))
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .args(["-servername", sni, "-ign_eof"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A TLS session resumed under another SNI is not resumed (APISIX's
/// `verify_tls_session_resumption`: the session's host must be the ClientHello's SNI): the
/// handshake is a full one, the route is the new SNI's, and where the ssl requires a client
/// certificate a session made with one does not let a client without one in under the other
/// name. Under the same SNI the session resumes. TLS 1.2 (session id) and 1.3 (ticket).
#[test]
fn stream_sessions_resume_only_under_their_own_sni() {
    let (a, b) = (named_node("node-a"), named_node("node-b"));
    let (open, strict) = (free_port(), free_port());
    let ssl = |id: &str, client: bool| {
        format!(
            "  - id: \"{id}\"\n    snis: [\"a.local\", \"b.local\"]\n    cert: {cert}    key: {key}{client}",
            cert = pem_block("server.crt", 6),
            key = pem_block("server.key", 6),
            client = if client {
                format!("    client:\n      ca: {}", pem_block("client-ca.crt", 8))
            } else {
                String::new()
            },
        )
    };
    let routes = |port: u16| {
        format!(
            "  - id: a{port}\n    server_port: {port}\n    sni: a.local\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{a}\": 1\n\
             \x20 - id: b{port}\n    server_port: {port}\n    sni: b.local\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{b}\": 1\n"
        )
    };
    let keys = |port: u16| {
        format!(
            "proxy_mode: http&stream\nstream_proxy:\n  tcp:\n    - addr: \"127.0.0.1:{port}\"\n      tls: true\n"
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let file = |n: &str| dir.path().join(n).to_str().unwrap().to_owned();

    let yaml = format!("ssls:\n{}stream_routes:\n{}", ssl("o", false), routes(open));
    let _gw = Gateway::start_full(&yaml, &keys(open), "");
    let up = poll_until(Duration::from_secs(10), || {
        s_client(open, "a.local", &[]).contains("node-a")
    });
    assert!(up.is_some(), "{}", s_client(open, "a.local", &[]));
    for (version, flag) in [("TLSv1.2", "-tls1_2"), ("TLSv1.3", "-tls1_3")] {
        let (same, other) = (
            file(&format!("same{version}")),
            file(&format!("other{version}")),
        );
        let made = s_client(open, "a.local", &[flag, "-sess_out", same.as_str()]);
        assert!(made.contains(&format!("New, {version}")), "{made}");
        assert!(made.contains("node-a"), "{made}");
        let again = s_client(open, "a.local", &[flag, "-sess_in", same.as_str()]);
        assert!(again.contains(&format!("Reused, {version}")), "{again}");
        assert!(again.contains("node-a"), "{again}");

        let made = s_client(open, "a.local", &[flag, "-sess_out", other.as_str()]);
        assert!(made.contains("node-a"), "{made}");
        let moved = s_client(open, "b.local", &[flag, "-sess_in", other.as_str()]);
        assert!(moved.contains(&format!("New, {version}")), "{moved}");
        assert!(!moved.contains("Reused"), "{moved}");
        assert!(moved.contains("node-b"), "{moved}");
    }

    // The ssl requires a client certificate: a session made with one under a.local does not
    // carry a client without one in under b.local.
    let yaml = format!(
        "ssls:\n{}stream_routes:\n{}",
        ssl("s", true),
        routes(strict)
    );
    let _gw2 = Gateway::start_full(&yaml, &keys(strict), "");
    let (cert, key) = (tls_data("client.crt"), tls_data("client.key"));
    let with_cert = ["-cert", cert.as_str(), "-key", key.as_str()];
    let up = poll_until(Duration::from_secs(10), || {
        s_client(strict, "a.local", &with_cert).contains("node-a")
    });
    assert!(up.is_some(), "{}", s_client(strict, "a.local", &with_cert));
    for (version, flag) in [("TLSv1.2", "-tls1_2"), ("TLSv1.3", "-tls1_3")] {
        let saved = file(&format!("strict{version}"));
        let mut args = with_cert.to_vec();
        args.extend([flag, "-sess_out", saved.as_str()]);
        let made = s_client(strict, "a.local", &args);
        assert!(made.contains("node-a"), "{made}");
        let moved = s_client(strict, "b.local", &[flag, "-sess_in", saved.as_str()]);
        assert!(!moved.contains("Reused"), "{moved}");
        assert!(!moved.contains("node-"), "{moved}");
    }
}
