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
