//! APISIX benchmark scenario 1, "single upstream, no plugin" (spec data-plane §8), in process:
//! the time per request through the whole request path (the real listener and one worker,
//! router, balancer, upstream keep-alive client) to a loopback upstream answering
//! `1234567890`, with 1 and 16 keep-alive client connections. Access log off. See
//! `support/proxy.rs` for the harness.

use criterion::{criterion_group, criterion_main, Criterion};

#[path = "support/proxy.rs"]
mod proxy;

/// Scenario 1's route, exactly as run.sh PUTs it (`UPSTREAM_PORT` is filled in).
const ROUTE: &str = r#"{"uri": "/hello", "plugins": {}, "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:UPSTREAM_PORT": 1}}}"#;

/// The answer came through the gateway, no plugin touched it, and the gateway counted the
/// probes in its own statistics.
fn verify(gateway: &proxy::Proxy, answer: &proxy::Answer) {
    let has = |name: &str| answer.headers.iter().any(|(k, _)| k == name);
    assert!(has("server"), "no Server header: {:?}", answer.headers);
    assert!(!has("x-ratelimit-remaining"), "a plugin ran");
    assert!(gateway.services.conn_stats().read().requests >= 2);
}

fn single_upstream(c: &mut Criterion) {
    proxy::bench_scenario(c, "single_upstream", ROUTE, verify);
}

criterion_group! {
    name = benches;
    config = proxy::config();
    targets = single_upstream
}
criterion_main!(benches);
