//! limit-count's access-phase cost (spec data-plane §6), the plugin called directly as the
//! request path calls it: one `access` with a fresh request state, counting one request and
//! setting the three `X-RateLimit-*` headers. The conf is benchmark scenario 2's
//! (`count` 2e12, `time_window` 60, `key: remote_addr`: never rejects).
//!
//! - `limit_count/local`: the in-process counters, one client address (one hot counter) and
//!   10k client addresses in turn (10k counters).
//! - `limit_count/redis`: `policy: redis` against a `redis-server` started on a random
//!   127.0.0.1 port (one round trip and Lua script per request), one request at a time and 16
//!   in flight at all times (time per request = inverse throughput). Skipped with a notice
//!   when no `redis-server` binary is on the PATH.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::cell::RefCell;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use ferrisix_config::model::ResourceKind;
use ferrisix_plugin_api::testing::TestRequest;
use ferrisix_plugin_api::{Flow, Owner, Plugin, RequestState, Step};
use ferrisix_plugins::PluginRegistry;
use futures_util::stream::{FuturesUnordered, StreamExt};
use serde_json::{json, Value};

/// The compiled conf is a plugin object of the registry.
type LimitCount = Arc<dyn Plugin>;

/// Benchmark scenario 2's limit-count conf, plus `extra` fields.
fn conf(extra: Value) -> Value {
    let mut conf = json!({"count": 2000000000000u64, "time_window": 60, "rejected_code": 503, "key": "remote_addr"});
    if let (Some(c), Some(e)) = (conf.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    conf
}

fn compile(conf: &Value, route_id: &str) -> LimitCount {
    let registry = PluginRegistry::builtin();
    let owner = Owner::new(ResourceKind::Routes, route_id);
    registry
        .compile_one("limit-count", conf, &owner, None, None)
        .expect("limit-count conf")
}

thread_local! {
    /// The request whose context each access gets (its state fresh every time).
    static REQUEST: RefCell<TestRequest> = RefCell::new(TestRequest::get("/hello"));
}

fn ip(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i))
}

/// One access phase with the local policy.
fn access_local(lc: &LimitCount, addr: IpAddr) -> usize {
    REQUEST.with(|r| {
        let mut req = r.borrow_mut();
        req.state = RequestState::new(addr);
        let mut ctx = req.ctx();
        let Step::Done(flow) = lc.access(&mut ctx) else {
            panic!("the local policy does not wait")
        };
        debug_assert_eq!(flow, Flow::Continue);
        ctx.response_headers().len()
    })
}

fn local(c: &mut Criterion) {
    let lc = compile(&conf(json!({})), "bench-local");
    assert_eq!(access_local(&lc, ip(0)), 3);
    let mut g = c.benchmark_group("limit_count/local");
    g.bench_function("one_key", |b| {
        b.iter(|| access_local(&lc, black_box(ip(1))))
    });
    const KEYS: u32 = 10_000;
    // Every counter exists before measuring.
    for i in 0..KEYS {
        access_local(&lc, ip(i));
    }
    let mut next = 0;
    g.bench_function(BenchmarkId::new("keys", KEYS), |b| {
        b.iter(|| {
            next = (next + 1) % KEYS;
            access_local(&lc, black_box(ip(next)))
        })
    });
    g.finish();
}

/// A `redis-server` of this bench; killed when dropped.
struct RedisServer {
    child: Child,
    port: u16,
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl RedisServer {
    /// Starts one on a random port, or says why not.
    fn start() -> Result<RedisServer, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run redis-server: {e}"))?;
        let server = RedisServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err(format!("redis-server did not listen on port {port}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }
}

/// One access phase with a remote policy.
async fn access_remote(lc: &LimitCount, addr: IpAddr) {
    let mut req = TestRequest::get("/hello");
    req.state = RequestState::new(addr);
    let mut ctx = req.ctx();
    let Step::Wait(fut) = lc.access(&mut ctx) else {
        panic!("the redis policy waits")
    };
    let flow = fut.await;
    assert_eq!(flow, Flow::Continue, "redis counting failed");
}

fn redis(c: &mut Criterion) {
    let server = match RedisServer::start() {
        Ok(s) => s,
        Err(why) => {
            eprintln!("limit_count/redis skipped: {why} (install redis-server to run it)");
            return;
        }
    };
    let lc = compile(
        &conf(json!({"policy": "redis", "redis_host": "127.0.0.1", "redis_port": server.port})),
        "bench-redis",
    );
    // The request path's runtime: one single-threaded runtime (a worker's).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Connects and loads the script before measuring.
    rt.block_on(access_remote(&lc, ip(1)));
    let mut g = c.benchmark_group("limit_count/redis");
    g.bench_function("sequential", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let started = Instant::now();
                for _ in 0..iters {
                    access_remote(&lc, black_box(ip(1))).await;
                }
                started.elapsed()
            })
        })
    });
    // 16 requests in flight at all times (wrk's 16 connections), over the plugin's pool.
    const IN_FLIGHT: u64 = 16;
    g.bench_function(BenchmarkId::new("in_flight", IN_FLIGHT), |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let started = Instant::now();
                let mut pending = FuturesUnordered::new();
                let mut issued = 0;
                while issued < iters.min(IN_FLIGHT) {
                    pending.push(access_remote(&lc, ip(issued as u32)));
                    issued += 1;
                }
                while pending.next().await.is_some() {
                    if issued < iters {
                        let addr = ip((issued % IN_FLIGHT) as u32);
                        pending.push(access_remote(&lc, addr));
                        issued += 1;
                    }
                }
                started.elapsed()
            })
        })
    });
    g.finish();
    drop(server);
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
}

criterion_group! {
    name = benches;
    config = config();
    targets = local, redis
}
criterion_main!(benches);
