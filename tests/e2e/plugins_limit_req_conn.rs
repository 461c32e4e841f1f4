//! End-to-end limit-req and limit-conn: the leaky bucket rejects an immediate second request,
//! limit-conn rejects a concurrent request while one is in flight and admits again once it is
//! over, including after a client went away mid-request; with the redis and redis-cluster
//! policies several gateway processes share one bucket and one in-flight count, and a Redis
//! that is down, silent or not Redis answers 500 or lets requests through
//! (`allow_degradation`).
use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use support::redis::{redis_cli, redis_cluster, redis_keys, require_redis, Redis};
use support::*;

fn route(id: &str, uri: &str, up: &Upstream, plugins: Value) -> Value {
    json!({"id": id, "uri": uri, "plugins": plugins,
        "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}})
}

#[test]
fn limit_req_rejects_immediate_second_request() {
    let up = Upstream::start("u", Behaviour::Echo);
    let gw = Gateway::start_with(
        &json!({"routes": [
            route("1", "/r", &up, json!({"limit-req": {"rate": 1, "burst": 0, "key": "remote_addr"}})),
            route("2", "/m", &up, json!({"limit-req": {"rate": 1, "burst": 0, "key": "remote_addr",
                "rejected_code": 429, "rejected_msg": "too many"}}))
        ]})
        .to_string(),
        "",
    );
    assert_eq!(get(gw.addr(), "/r").status, 200);
    let r = get(gw.addr(), "/r");
    assert_eq!(r.status, 503);
    assert!(r.text().contains("503 Service Temporarily Unavailable"));
    assert_eq!(
        up.hits(),
        1,
        "the rejected request never reached the upstream"
    );
    assert_eq!(get(gw.addr(), "/m").status, 200);
    let r = get(gw.addr(), "/m");
    assert_eq!(r.status, 429);
    assert_eq!(r.text(), "{\"error_msg\":\"too many\"}\n");
    // One second later the bucket has leaked one request.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(get(gw.addr(), "/r").status, 200);
}

#[test]
fn limit_conn_rejects_concurrent_request_until_first_finishes() {
    let up = Upstream::start("slow", Behaviour::Delay(Duration::from_millis(800)));
    let gw = Gateway::start_with(
        &json!({"routes": [route("1", "/c", &up, json!({"limit-conn": {
            "conn": 1, "burst": 0, "default_conn_delay": 0.1, "key": "remote_addr"}}))]})
        .to_string(),
        "",
    );
    let addr = gw.addr();
    let first = std::thread::spawn(move || get(addr, "/c").status);
    assert!(
        poll_until(Duration::from_secs(5), || up.hits() == 1).is_some(),
        "the first request reached the upstream"
    );
    let r = get(addr, "/c");
    assert_eq!(r.status, 503);
    assert_eq!(first.join().unwrap(), 200);
    assert_eq!(get(addr, "/c").status, 200, "the count went back down");

    // A client that goes away while its request is in flight does not leak its slot.
    // Counted before the request goes out: read after, it may already include it.
    let hits = up.hits();
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /c HTTP/1.1\r\nHost: test.local\r\n\r\n")
        .unwrap();
    assert!(poll_until(Duration::from_secs(5), || up.hits() == hits + 1).is_some());
    drop(s);
    assert!(
        poll_until(Duration::from_secs(5), || get(addr, "/c").status == 200).is_some(),
        "the abandoned request's slot is released"
    );
    // And released once only: still exactly one slot.
    let addr2 = gw.addr();
    let slow = std::thread::spawn(move || get(addr2, "/c").status);
    let hits = up.hits();
    assert!(poll_until(Duration::from_secs(5), || up.hits() == hits + 1).is_some());
    assert_eq!(get(addr, "/c").status, 503);
    assert_eq!(slow.join().unwrap(), 200);
}

// ---------------------------------------------------------------------------------------------
// Redis policies: several gateway processes sharing one bucket or one in-flight count.

/// A Redis to point the policies at: one server, or a three-node cluster.
struct Backend {
    servers: Vec<Redis>,
    cluster: bool,
}

impl Backend {
    fn single() -> Backend {
        Backend {
            servers: vec![Redis::start(false)],
            cluster: false,
        }
    }

    fn cluster() -> Backend {
        Backend {
            servers: redis_cluster(),
            cluster: true,
        }
    }

    /// The policy fields of a plugin conf.
    fn fields(&self) -> Value {
        if self.cluster {
            let seeds: Vec<String> = self.servers.iter().map(Redis::node).collect();
            json!({"policy": "redis-cluster", "redis_cluster_nodes": seeds,
                "redis_cluster_name": "test"})
        } else {
            json!({"policy": "redis", "redis_host": "127.0.0.1",
                "redis_port": self.servers[0].port})
        }
    }

    /// `conf` with the policy fields added.
    fn conf(&self, mut conf: Value) -> Value {
        let fields = self.fields();
        conf.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        conf
    }

    /// Every key matching `pattern`, on whichever node holds it, with the node's port.
    fn keys(&self, pattern: &str) -> Vec<(u16, String)> {
        self.servers
            .iter()
            .flat_map(|s| redis_keys(s.port, pattern).into_iter().map(|k| (s.port, k)))
            .collect()
    }

    /// The members of every limit-conn set of route `route`: the requests in flight.
    fn in_flight(&self, route: &str) -> usize {
        self.keys(&format!("limit_conn:/apisix/routes/{route}:*"))
            .iter()
            .map(|(port, key)| {
                redis_cli(*port, &["zcard", key])
                    .trim()
                    .parse::<usize>()
                    .unwrap()
            })
            .sum()
    }
}

/// An upstream that holds every request until opened: requests stay in flight for as long as
/// a test needs, whatever the machine's speed.
struct Gate {
    addr: SocketAddr,
    arrived: Arc<AtomicUsize>,
    open: Arc<(Mutex<bool>, Condvar)>,
}

impl Gate {
    fn start() -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let arrived = Arc::new(AtomicUsize::new(0));
        let open = Arc::new((Mutex::new(false), Condvar::new()));
        let (a, o) = (arrived.clone(), open.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                let (a, o) = (a.clone(), o.clone());
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        // One request head (the tests send no bodies), then wait for the gate.
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            match s.read(&mut chunk) {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
                        buf.drain(..end + 4);
                        a.fetch_add(1, Ordering::SeqCst);
                        let (lock, cv) = &*o;
                        let mut is_open = lock.lock().unwrap();
                        while !*is_open {
                            is_open = cv.wait(is_open).unwrap();
                        }
                        drop(is_open);
                        let reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                        if s.write_all(reply).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Gate {
            addr,
            arrived,
            open,
        }
    }

    fn set(&self, open: bool) {
        let (lock, cv) = &*self.open;
        *lock.lock().unwrap() = open;
        cv.notify_all();
    }

    fn arrived(&self) -> usize {
        self.arrived.load(Ordering::SeqCst)
    }

    /// Waits until `n` requests in all have reached the upstream.
    fn wait_arrived(&self, n: usize) {
        assert!(
            poll_until(Duration::from_secs(20), || self.arrived() >= n).is_some(),
            "{} of {n} requests reached the upstream",
            self.arrived()
        );
        assert_eq!(self.arrived(), n);
    }
}

fn gated_route(id: &str, uri: &str, gate: &Gate, plugins: Value) -> Value {
    json!({"id": id, "uri": uri, "plugins": plugins,
        "upstream": {"type": "roundrobin", "nodes": {gate.addr.to_string(): 1}}})
}

/// Three gateways share one leaky bucket: with `nodelay` and burst 99 at a rate that leaks
/// nothing within the test, exactly 100 requests pass in all; per-client buckets are exact too.
fn limit_req_shares_one_bucket(backend: &Backend) {
    let up = Upstream::start("u", Behaviour::Echo);
    let lr = |burst: u64| {
        backend.conf(json!({"rate": 0.001, "burst": burst, "key": "remote_addr",
            "nodelay": true, "rejected_code": 429}))
    };
    let routes = json!({"routes": [
        route("1", "/shared", &up, json!({"limit-req": lr(99)})),
        route("2", "/per-client", &up, json!({"limit-req": lr(1)})),
    ]})
    .to_string();
    let gateways: Vec<Gateway> = (0..3).map(|_| Gateway::start(&routes)).collect();
    let addrs: Vec<SocketAddr> = gateways.iter().map(Gateway::addr).collect();
    let (ok, rejected) = hammer(&addrs, "/shared", 30, 10);
    assert_eq!((ok, rejected), (100, 200), "one bucket for every gateway");
    assert_eq!(up.hits(), 100, "rejected requests never reach the upstream");
    // The bucket lives under APISIX's key, as a hash with the excess and the last time.
    let keys = backend.keys("limit_req:/apisix/routes/1:*:127.0.0.1");
    assert_eq!(keys.len(), 1, "{keys:?}");
    let (port, key) = &keys[0];
    let excess: f64 = redis_cli(*port, &["hget", key, "excess"])
        .trim()
        .parse()
        .unwrap();
    assert!(excess > 98_000.0 && excess <= 99_000.0, "{excess}");
    assert!(
        redis_cli(*port, &["ttl", key])
            .trim()
            .parse::<i64>()
            .unwrap()
            > 0
    );

    // Per client (X-Real-IP from 127.0.0.1 is trusted): 1 + burst 1 pass, on any gateway.
    for i in 0..12 {
        let client = format!("10.2.0.{i}");
        for (n, expect) in [200, 200, 429].into_iter().enumerate() {
            let gw = &gateways[(i + n) % 3];
            let r = request(
                gw.addr(),
                "GET",
                "/per-client",
                &[("X-Real-IP", &client)],
                b"",
            );
            assert_eq!(r.status, expect, "client {client}, request {n}");
        }
    }
    if backend.cluster {
        let used = backend
            .servers
            .iter()
            .filter(|s| !redis_keys(s.port, "limit_req:*").is_empty())
            .count();
        assert!(used >= 2, "buckets spread over the cluster's nodes");
    }
}

#[test]
fn limit_req_redis_shares_one_bucket_between_gateways() {
    require_redis();
    limit_req_shares_one_bucket(&Backend::single());
}

#[test]
fn limit_req_redis_cluster_shares_one_bucket_between_gateways() {
    require_redis();
    limit_req_shares_one_bucket(&Backend::cluster());
}

/// Three gateways share one in-flight count: with conn 2 and burst 1, the three requests held
/// upstream are all that pass (the third delayed, within burst); every further one is rejected
/// until responses end, and then the slots are free again, also after a client went away.
fn limit_conn_shares_one_count(backend: &Backend) {
    let gate = Gate::start();
    let lc = backend.conf(json!({"conn": 2, "burst": 1, "default_conn_delay": 0.1,
        "only_use_default_delay": true, "key": "remote_addr", "rejected_msg": "busy"}));
    let routes =
        json!({"routes": [gated_route("1", "/c", &gate, json!({"limit-conn": lc}))]}).to_string();
    let gateways: Vec<Gateway> = (0..3).map(|_| Gateway::start(&routes)).collect();
    let addrs: Vec<SocketAddr> = gateways.iter().map(Gateway::addr).collect();

    for round in 0..2 {
        let before = gate.arrived();
        // Three requests, one per gateway, each in flight before the next is sent.
        let held: Vec<_> = (0..3)
            .map(|i| {
                let addr = addrs[i];
                let t = std::thread::spawn(move || get(addr, "/c"));
                gate.wait_arrived(before + i + 1);
                t
            })
            .collect();
        assert_eq!(backend.in_flight("1"), 3, "round {round}");
        // Every gateway now rejects: conn + burst are in flight across the three.
        for addr in &addrs {
            let r = get(*addr, "/c");
            assert_eq!(r.status, 503, "round {round}");
            assert_eq!(r.text(), "{\"error_msg\":\"busy\"}\n");
        }
        assert_eq!(
            gate.arrived(),
            before + 3,
            "rejected requests never reach the upstream"
        );
        gate.set(true);
        for t in held {
            assert_eq!(t.join().unwrap().status, 200);
        }
        gate.set(false);
        // The releases are asynchronous: the count drains to zero once the responses ended.
        assert!(
            poll_until(Duration::from_secs(20), || backend.in_flight("1") == 0).is_some(),
            "slots released after round {round}: {} left",
            backend.in_flight("1")
        );
    }

    // A client that goes away while its request is held upstream releases its slot.
    let before = gate.arrived();
    let mut s = TcpStream::connect(addrs[0]).unwrap();
    s.write_all(b"GET /c HTTP/1.1\r\nHost: test.local\r\n\r\n")
        .unwrap();
    gate.wait_arrived(before + 1);
    assert_eq!(backend.in_flight("1"), 1);
    drop(s);
    assert!(
        poll_until(Duration::from_secs(20), || backend.in_flight("1") == 0).is_some(),
        "the abandoned request's slot is released"
    );
    gate.set(true);
    for addr in &addrs {
        assert_eq!(get(*addr, "/c").status, 200);
    }
    assert!(poll_until(Duration::from_secs(20), || backend.in_flight("1") == 0).is_some());
    // The members lapse after key_ttl (default 3600 s) should a gateway die holding them.
    let keys = backend.keys("limit_conn:*");
    assert!(keys.is_empty(), "an empty set is no key: {keys:?}");
}

#[test]
fn limit_conn_redis_shares_one_count_between_gateways() {
    require_redis();
    limit_conn_shares_one_count(&Backend::single());
}

#[test]
fn limit_conn_redis_cluster_shares_one_count_between_gateways() {
    require_redis();
    limit_conn_shares_one_count(&Backend::cluster());
}

/// A Redis port that is not Redis: it accepts connections and never answers (`None`), or
/// answers `answer` to anything.
fn fake_redis(answer: Option<&'static [u8]>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n) = s.read(&mut chunk) {
                    if n == 0 {
                        return;
                    }
                    if let Some(a) = answer {
                        if s.write_all(a).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    port
}

#[test]
fn redis_down_slow_or_garbage_fails_or_degrades() {
    let up = Upstream::start("u", Behaviour::Echo);
    let servers = [
        ("down", free_port()),
        ("silent", fake_redis(None)),
        ("garbage", fake_redis(Some(b"garbage\r\n"))),
    ];
    let mut routes = Vec::new();
    for (name, port) in servers {
        for degrade in [false, true] {
            let redis = json!({"policy": "redis", "redis_host": "127.0.0.1", "redis_port": port,
                "redis_timeout": 300, "allow_degradation": degrade});
            let mut lr = json!({"rate": 1, "burst": 0, "key": "remote_addr"});
            let mut lc = json!({"conn": 1, "burst": 0, "default_conn_delay": 0.1,
                "key": "remote_addr"});
            for c in [&mut lr, &mut lc] {
                c.as_object_mut()
                    .unwrap()
                    .extend(redis.as_object().unwrap().clone());
            }
            let n = routes.len();
            routes.push(route(
                &format!("r{n}"),
                &format!("/req/{name}/{degrade}"),
                &up,
                json!({"limit-req": lr}),
            ));
            routes.push(route(
                &format!("c{n}"),
                &format!("/conn/{name}/{degrade}"),
                &up,
                json!({"limit-conn": lc}),
            ));
        }
    }
    let gw = Gateway::start(&json!({ "routes": routes }).to_string());
    for (name, _) in servers {
        for plugin in ["req", "conn"] {
            // Twice: the second request finds the pool's state after the first failure.
            for _ in 0..2 {
                let r = get(gw.addr(), &format!("/{plugin}/{name}/false"));
                assert_eq!(r.status, 500, "limit-{plugin}, redis {name}");
                assert!(
                    r.text().contains("500 Internal Server Error"),
                    "APISIX's bare 500: {}",
                    r.text()
                );
                let r = get(gw.addr(), &format!("/{plugin}/{name}/true"));
                assert_eq!(r.status, 200, "limit-{plugin}, redis {name}, degraded");
            }
        }
    }
    assert_eq!(up.hits(), 12, "only the degraded requests were proxied");
}
