//! Domain nodes and `discovery_type: dns` against a tiny DNS server run by the test (UDP on
//! 127.0.0.1, answers from a table the test changes): every address of a name is used, a
//! changed answer is picked up after its TTL, a failing server leaves the last good addresses
//! in use, and SRV records give ports, weights and priorities.
use crate::support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use support::*;

#[derive(Clone, Debug)]
enum Rr {
    A(Ipv4Addr),
    Srv {
        priority: u16,
        weight: u16,
        port: u16,
        target: String,
    },
}

/// name → records; `None` answers SERVFAIL for every query.
type Zone = Arc<Mutex<Option<HashMap<String, Vec<Rr>>>>>;

fn encode_name(out: &mut Vec<u8>, name: &str) {
    for label in name.trim_end_matches('.').split('.') {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
}

/// Starts the DNS server; returns its port.
fn dns_server(zone: Zone) -> u16 {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = socket.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buf) else {
                continue;
            };
            let q = &buf[..n];
            if q.len() < 12 {
                continue;
            }
            // The question: labels, then type and class.
            let mut i = 12;
            let mut labels = Vec::new();
            while i < q.len() && q[i] != 0 {
                let len = q[i] as usize;
                labels.push(String::from_utf8_lossy(&q[i + 1..i + 1 + len]).to_ascii_lowercase());
                i += 1 + len;
            }
            let qend = i + 5;
            if qend > q.len() {
                continue;
            }
            let qtype = u16::from_be_bytes([q[i + 1], q[i + 2]]);
            let name = labels.join(".");
            let zone = zone.lock().unwrap().clone();
            let mut answers: Vec<Vec<u8>> = Vec::new();
            let rcode = match &zone {
                None => 2,
                Some(z) => match z.get(&name) {
                    None => 3,
                    Some(rrs) => {
                        for rr in rrs {
                            let mut a = vec![0xc0, 0x0c];
                            match rr {
                                Rr::A(ip) if qtype == 1 => {
                                    a.extend_from_slice(&[0, 1, 0, 1, 0, 0, 0, 1, 0, 4]);
                                    a.extend_from_slice(&ip.octets());
                                }
                                Rr::Srv {
                                    priority,
                                    weight,
                                    port,
                                    target,
                                } if qtype == 33 => {
                                    let mut rdata = Vec::new();
                                    rdata.extend_from_slice(&priority.to_be_bytes());
                                    rdata.extend_from_slice(&weight.to_be_bytes());
                                    rdata.extend_from_slice(&port.to_be_bytes());
                                    encode_name(&mut rdata, target);
                                    a.extend_from_slice(&[0, 33, 0, 1, 0, 0, 0, 1]);
                                    a.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
                                    a.extend_from_slice(&rdata);
                                }
                                _ => continue,
                            }
                            answers.push(a);
                        }
                        0
                    }
                },
            };
            let mut resp = Vec::with_capacity(512);
            resp.extend_from_slice(&q[..2]);
            resp.extend_from_slice(&[0x81, 0x80 | rcode]);
            resp.extend_from_slice(&[0, 1]);
            resp.extend_from_slice(&(answers.len() as u16).to_be_bytes());
            resp.extend_from_slice(&[0, 0, 0, 0]);
            resp.extend_from_slice(&q[12..qend]);
            for a in answers {
                resp.extend_from_slice(&a);
            }
            let _ = socket.send_to(&resp, from);
        }
    });
    port
}

/// An HTTP server on `ip:port` answering 200 with `X-Upstream: name`.
fn named_server(ip: &str, port: u16, name: &'static str) {
    let listener = TcpListener::bind((ip, port)).unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut pending = Vec::new();
                loop {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => pending.extend_from_slice(&buf[..n]),
                    }
                    while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                        pending.drain(..end + 4);
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Upstream: {name}\r\n\r\nok"
                        );
                        let _ = s.write_all(reply.as_bytes());
                    }
                }
            });
        }
    });
}

fn upstream_names(gw: &Gateway, n: usize) -> HashMap<String, usize> {
    let mut c = Conn::open(gw.addr());
    let mut out = HashMap::new();
    for _ in 0..n {
        let r = c.get("/d");
        assert_eq!(r.status, 200, "{r:?}");
        *out.entry(r.header("X-Upstream").unwrap_or("-").to_string())
            .or_default() += 1;
    }
    out
}

#[test]
fn domain_node_uses_every_address_and_follows_changes() {
    let port = free_port();
    named_server("127.0.0.1", port, "one");
    named_server("127.0.0.2", port, "two");
    let zone: Zone = Arc::new(Mutex::new(Some(HashMap::from([(
        "svc.ferrisix.test".to_string(),
        vec![
            Rr::A("127.0.0.1".parse().unwrap()),
            Rr::A("127.0.0.2".parse().unwrap()),
        ],
    )]))));
    let dns = dns_server(zone.clone());
    let routes = json!({ "routes": [{ "id": "d", "uri": "/d", "upstream": {
        "type": "roundrobin",
        "nodes": { format!("svc.ferrisix.test:{port}"): 1 }
    }}]});
    let gw = Gateway::start_full(
        &routes.to_string(),
        &format!("dns_resolver:\n  - \"127.0.0.1:{dns}\""),
        "",
    );
    let seen = upstream_names(&gw, 8);
    assert_eq!(seen.get("one"), Some(&4), "{seen:?}");
    assert_eq!(seen.get("two"), Some(&4), "{seen:?}");

    // The name now has one address: picked up after its 1 s TTL.
    zone.lock().unwrap().as_mut().unwrap().insert(
        "svc.ferrisix.test".into(),
        vec![Rr::A("127.0.0.2".parse().unwrap())],
    );
    let moved = poll_until(Duration::from_secs(15), || {
        upstream_names(&gw, 4).get("two") == Some(&4)
    });
    assert!(moved.is_some(), "the new answer was never used");

    // The server fails: the last good address keeps serving.
    *zone.lock().unwrap() = None;
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(upstream_names(&gw, 4).get("two"), Some(&4));
}

#[test]
fn dns_discovery_srv_records_give_ports_weights_and_priorities() {
    let (p1, p2, p3) = (free_port(), free_port(), free_port());
    named_server("127.0.0.1", p1, "light");
    named_server("127.0.0.1", p2, "heavy");
    named_server("127.0.0.1", p3, "backup");
    let srv = |priority, weight, port, target: &str| Rr::Srv {
        priority,
        weight,
        port,
        target: target.to_string(),
    };
    let zone: Zone = Arc::new(Mutex::new(Some(HashMap::from([
        (
            "_http._tcp.svc.ferrisix.test".to_string(),
            vec![
                srv(10, 1, p1, "a.ferrisix.test"),
                srv(10, 3, p2, "a.ferrisix.test"),
                // A higher SRV priority value is a backup: APISIX negates it.
                srv(20, 1, p3, "a.ferrisix.test"),
            ],
        ),
        (
            "a.ferrisix.test".to_string(),
            vec![Rr::A("127.0.0.1".parse().unwrap())],
        ),
    ]))));
    let dns = dns_server(zone);
    let routes = json!({ "routes": [{ "id": "d", "uri": "/d", "upstream": {
        "type": "roundrobin",
        "discovery_type": "dns",
        "service_name": "_http._tcp.svc.ferrisix.test"
    }}]});
    let gw = Gateway::start_with(
        &routes.to_string(),
        &format!("discovery:\n  dns:\n    servers:\n      - \"127.0.0.1:{dns}\"\n"),
    );
    let seen = upstream_names(&gw, 8);
    assert_eq!(seen.get("light"), Some(&2), "{seen:?}");
    assert_eq!(seen.get("heavy"), Some(&6), "{seen:?}");
    assert_eq!(seen.get("backup"), None, "{seen:?}");
}
