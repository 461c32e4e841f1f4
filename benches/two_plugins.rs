//! APISIX benchmark scenario 2, "+ limit-count + prometheus" (spec data-plane §8), in process:
//! the time per request through the whole request path with the route's two plugins
//! (limit-count counting per client address with a quota that never rejects, and prometheus
//! recording every request), to a loopback upstream answering `1234567890`, with 1 and 16
//! keep-alive client connections. Access log off. See `support/proxy.rs` for the harness.

use criterion::{criterion_group, criterion_main, Criterion};

#[path = "support/proxy.rs"]
mod proxy;

/// Scenario 2's route, exactly as run.sh PUTs it (`UPSTREAM_PORT` is filled in).
const ROUTE: &str = r#"{"uri": "/hello", "plugins": {"limit-count": {"count": 2000000000000, "time_window": 60, "rejected_code": 503, "key": "remote_addr"}, "prometheus": {}}, "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:UPSTREAM_PORT": 1}}}"#;

/// Both plugins ran: limit-count's headers are on the answer and prometheus counted route 1.
fn verify(gateway: &proxy::Proxy, answer: &proxy::Answer) {
    assert!(
        answer
            .headers
            .iter()
            .any(|(k, _)| k == "x-ratelimit-remaining"),
        "no limit-count headers: {:?}",
        answer.headers
    );
    let text = gateway
        .services
        .shared::<ferrisix_plugins::observe::prometheus::Metrics>()
        .render();
    assert!(
        text.contains("apisix_http_status{code=\"200\",route=\"1\""),
        "prometheus did not record the probe:\n{text}"
    );
}

fn two_plugins(c: &mut Criterion) {
    proxy::bench_scenario(c, "two_plugins", ROUTE, verify);
}

criterion_group! {
    name = benches;
    config = proxy::config();
    targets = two_plugins
}
criterion_main!(benches);
