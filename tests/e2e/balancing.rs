//! End-to-end load balancing (spec data-plane §4.2, §4.3): weighted roundrobin counts over whole
//! periods, weight 0, and node priority groups with failover, against the real binary.
use crate::support;

use std::collections::BTreeMap;

use serde_json::{json, Value};
use support::*;

/// Counts which upstream (by `X-Upstream`) served each of `n` replies.
fn tally(replies: impl Iterator<Item = Reply>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for reply in replies {
        assert_eq!(reply.status, 200, "{reply:?}");
        let name = reply.header("X-Upstream").expect("proxied").to_string();
        *counts.entry(name).or_insert(0) += 1;
    }
    counts
}

fn count(counts: &BTreeMap<String, usize>, name: &str) -> usize {
    counts.get(name).copied().unwrap_or(0)
}

fn one_route(upstream: Value) -> String {
    json!({ "routes": [{ "id": "r1", "uri": "/lb", "upstream": upstream }] }).to_string()
}

#[test]
fn weighted_roundrobin_3_2_1_over_whole_periods_on_one_connection() {
    let a = Upstream::start("a", Behaviour::Echo);
    let b = Upstream::start("b", Behaviour::Echo);
    let c = Upstream::start("c", Behaviour::Echo);
    let gw = Gateway::start(&one_route(json!({
        "type": "roundrobin",
        "nodes": { a.node(): 3, b.node(): 2, c.node(): 1 },
    })));
    let mut conn = Conn::open(gw.addr());
    // Two whole periods of 6, twice over: every window of one period holds 3/2/1.
    for round in 0..2 {
        let counts = tally((0..12).map(|_| conn.get("/lb")));
        assert_eq!(
            (
                count(&counts, "a"),
                count(&counts, "b"),
                count(&counts, "c")
            ),
            (6, 4, 2),
            "round {round}: {counts:?}"
        );
    }
    assert_eq!((a.hits(), b.hits(), c.hits()), (12, 8, 4));
}

#[test]
fn weight_zero_is_never_picked_over_separate_connections() {
    let a = Upstream::start("a", Behaviour::Echo);
    let b = Upstream::start("b", Behaviour::Echo);
    let c = Upstream::start("c", Behaviour::Echo);
    // Node order as an array, through an upstream referenced by id.
    let doc = json!({
        "upstreams": [{
            "id": "u1",
            "type": "roundrobin",
            "nodes": [
                { "host": "127.0.0.1", "port": a.addr.port(), "weight": 3 },
                { "host": "127.0.0.1", "port": b.addr.port(), "weight": 0 },
                { "host": "127.0.0.1", "port": c.addr.port(), "weight": 1 },
            ],
        }],
        "routes": [{ "id": "r1", "uri": "/lb", "upstream_id": "u1" }],
    });
    let gw = Gateway::start(&doc.to_string());
    let counts = tally((0..8).map(|_| get(gw.addr(), "/lb")));
    assert_eq!(
        (
            count(&counts, "a"),
            count(&counts, "b"),
            count(&counts, "c")
        ),
        (6, 0, 2),
        "{counts:?}"
    );
    let counts = tally((0..16).map(|_| get(gw.addr(), "/lb")));
    assert_eq!(
        (
            count(&counts, "a"),
            count(&counts, "b"),
            count(&counts, "c")
        ),
        (12, 0, 4)
    );
    assert_eq!(b.hits(), 0);
}

#[test]
fn equal_weights_alternate_evenly() {
    let a = Upstream::start("a", Behaviour::Echo);
    let b = Upstream::start("b", Behaviour::Echo);
    let gw = Gateway::start(&one_route(json!({
        "type": "roundrobin",
        "nodes": { a.node(): 5, b.node(): 5 },
    })));
    let mut conn = Conn::open(gw.addr());
    let counts = tally((0..10).map(|_| conn.get("/lb")));
    assert_eq!(
        (count(&counts, "a"), count(&counts, "b")),
        (5, 5),
        "{counts:?}"
    );
}

#[test]
fn single_node_with_weight_zero_still_serves() {
    let a = Upstream::start("a", Behaviour::Echo);
    let gw = Gateway::start(&one_route(
        json!({ "type": "roundrobin", "nodes": { a.node(): 0 } }),
    ));
    let reply = get(gw.addr(), "/lb");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("X-Upstream"), Some("a"));
}

fn node(addr: &str, weight: u32, priority: i64) -> Value {
    let (host, port) = addr.rsplit_once(':').unwrap();
    json!({ "host": host, "port": port.parse::<u16>().unwrap(), "weight": weight, "priority": priority })
}

#[test]
fn dead_high_priority_node_fails_over_to_the_lower_group() {
    let low = Upstream::start("low", Behaviour::Echo);
    let dead = dead_node();
    let gw = Gateway::start(&one_route(json!({
        "type": "roundrobin",
        "nodes": [node(&dead, 1, 10), node(&low.node(), 1, 0)],
    })));
    for _ in 0..6 {
        let reply = get(gw.addr(), "/lb");
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.header("X-Upstream"), Some("low"));
        // "502, 200": the last try succeeded, so no status header.
        assert_eq!(reply.header("X-APISIX-Upstream-Status"), None);
    }
    assert_eq!(low.hits(), 6);
}

#[test]
fn live_higher_group_gets_all_traffic() {
    let high1 = Upstream::start("high1", Behaviour::Echo);
    let high2 = Upstream::start("high2", Behaviour::Echo);
    let low = Upstream::start("low", Behaviour::Echo);
    let gw = Gateway::start(&one_route(json!({
        "type": "roundrobin",
        "nodes": [node(&low.node(), 100, -1), node(&high1.node(), 1, 5), node(&high2.node(), 1, 5)],
    })));
    let mut conn = Conn::open(gw.addr());
    let counts = tally((0..10).map(|_| conn.get("/lb")));
    assert_eq!(count(&counts, "low"), 0, "{counts:?}");
    assert_eq!((count(&counts, "high1"), count(&counts, "high2")), (5, 5));
    assert_eq!(low.hits(), 0);
}

#[test]
fn failover_stays_inside_the_higher_group_while_one_of_it_works() {
    let high = Upstream::start("high", Behaviour::Echo);
    let low = Upstream::start("low", Behaviour::Echo);
    let dead = dead_node();
    let gw = Gateway::start(&one_route(json!({
        "type": "roundrobin",
        "nodes": [node(&dead, 1, 1), node(&low.node(), 1, 0), node(&high.node(), 1, 1)],
    })));
    let counts = tally((0..8).map(|_| get(gw.addr(), "/lb")));
    assert_eq!(count(&counts, "high"), 8, "{counts:?}");
    assert_eq!(low.hits(), 0);
}

#[test]
fn an_unknown_balancer_type_is_stored_and_fails_the_request_with_500() {
    // APISIX stores any `type`; its balancer `require`s `apisix.balancer.<type>` only when it
    // has to pick among several nodes, and that error ends the request with 500. One node
    // skips the balancer and is served.
    let a = Upstream::start("a", Behaviour::Echo);
    let b = Upstream::start("b", Behaviour::Echo);
    let gw = StoreGatewayBuilder::embedded().start();
    let put = |id: &str, nodes: Value| {
        let route =
            json!({ "uri": format!("/{id}"), "upstream": { "type": "fastest", "nodes": nodes } });
        let r = gw.admin(
            "PUT",
            &format!("/apisix/admin/routes/{id}"),
            &route.to_string(),
        );
        assert_eq!(r.status, 201, "{}", r.text());
        assert_eq!(r.json()["value"]["upstream"]["type"], "fastest");
    };
    put("one", json!({ a.node(): 1 }));
    put("two", json!({ a.node(): 1, b.node(): 1 }));
    let served = poll_until(std::time::Duration::from_secs(10), || {
        gw.status_of("/one") == 200 && gw.status_of("/two") != 404
    });
    assert!(served.is_some(), "{}", gw.log_text());
    let r = gw.get("/two");
    assert_eq!(r.status, 500, "{r:?}\n{}", gw.log_text());
    assert!(
        r.text().contains("500 Internal Server Error"),
        "{}",
        r.text()
    );
    assert_eq!(r.header("X-APISIX-Upstream-Status"), None);
    let one_hits = a.hits();
    assert_eq!(gw.get("/two").status, 500);
    assert_eq!((a.hits(), b.hits()), (one_hits, 0), "/two tries no node");
    assert!(
        gw.log_text()
            .contains("module 'apisix.balancer.fastest' not found"),
        "{}",
        gw.log_text()
    );
}
