//! ferrisix on its embedded store, end to end: a real `ferrisix` process (traditional role,
//! embedded provider) driven through its Admin API over HTTP.
//!
//! * `kill -9` during a burst of 1000 PUTs, then a restart on the same data directory: every
//!   acknowledged PUT is there, through the Admin API and through the data port;
//! * a restart with 2,000 routes stored serves all of them from the first request (no
//!   partial table while the first compile runs);
//! * (ignored) the PUT-to-served propagation figure;
//! * the control API's `/v1/schema`, and the Admin API on the data port.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{
    percentile, poll_from, route_to, try_request, Behaviour, StoreGatewayBuilder, Upstream,
    ADMIN_KEY,
};

const BURST: u32 = 1000;
/// The process is killed once this many PUTs were acknowledged: well inside the burst.
const KILL_AFTER: usize = 300;

#[test]
fn kill_9_during_a_burst_of_1000_puts_keeps_every_acknowledged_put() {
    let up = Upstream::start("burst", Behaviour::Echo);
    let mut gw = StoreGatewayBuilder::embedded().start();

    // id -> whether the PUT was acknowledged (200/201); the writer stops at the first failure.
    let acked: Arc<Mutex<Vec<u32>>> = Arc::default();
    let writer = {
        let (acked, admin, node) = (Arc::clone(&acked), gw.admin_addr(), up.node());
        std::thread::spawn(move || -> (Option<u32>, Vec<String>) {
            let mut unexpected = Vec::new();
            for id in 1..=BURST {
                let body = route_to(&format!("/burst/{id}"), &node).to_string();
                let reply = try_request(
                    admin,
                    "PUT",
                    &format!("/apisix/admin/routes/{id}"),
                    &[
                        ("X-API-KEY", ADMIN_KEY),
                        ("Content-Type", "application/json"),
                    ],
                    body.as_bytes(),
                );
                match reply {
                    Ok(r) if matches!(r.status, 200 | 201) => acked.lock().unwrap().push(id),
                    Ok(r) => {
                        unexpected.push(format!("PUT {id}: {} {}", r.status, r.text()));
                        return (Some(id), unexpected);
                    }
                    // The process is gone: this PUT was in flight, unacknowledged.
                    Err(_) => return (Some(id), unexpected),
                }
            }
            (None, unexpected)
        })
    };
    poll_from(
        Instant::now(),
        Duration::from_secs(300),
        Duration::from_millis(1),
        || acked.lock().unwrap().len() >= KILL_AFTER,
    )
    .expect("the burst did not reach its kill point");
    gw.kill9();
    let (in_flight, unexpected) = writer.join().unwrap();
    assert!(unexpected.is_empty(), "{unexpected:?}");
    let acked = acked.lock().unwrap().clone();
    let in_flight = in_flight.expect("the kill came after the whole burst was acknowledged");
    eprintln!(
        "burst: killed with {} PUTs acknowledged, PUT {in_flight} in flight",
        acked.len()
    );
    assert_eq!(acked, (1..in_flight).collect::<Vec<_>>());

    gw.restart();

    // Every acknowledged PUT is there, whole, through the Admin API ...
    for id in &acked {
        let reply = gw.admin("GET", &format!("/apisix/admin/routes/{id}"), "");
        assert_eq!(reply.status, 200, "route {id}: {}", reply.text());
        let value = &reply.json()["value"];
        assert_eq!(value["id"], id.to_string(), "{value}");
        assert_eq!(value["uri"], format!("/burst/{id}"), "{value}");
        assert_eq!(value["upstream"]["nodes"][up.node()], 1, "{value}");
    }
    // ... and through the data port.
    for id in &acked {
        let reply = gw.get(&format!("/burst/{id}"));
        assert_eq!(reply.status, 200, "/burst/{id}: {}", reply.text());
        assert_eq!(reply.header("X-Upstream"), Some("burst"));
    }
    // The PUT in flight is entirely there or absent; nothing after it exists.
    let reply = gw.admin("GET", &format!("/apisix/admin/routes/{in_flight}"), "");
    let in_flight_kept = match reply.status {
        200 => {
            assert_eq!(reply.json()["value"]["uri"], format!("/burst/{in_flight}"));
            assert_eq!(gw.get(&format!("/burst/{in_flight}")).status, 200);
            true
        }
        404 => false,
        s => panic!("route {in_flight} (in flight): {s} {}", reply.text()),
    };
    eprintln!(
        "burst: the PUT in flight was {}",
        if in_flight_kept {
            "kept"
        } else {
            "lost (unacknowledged)"
        }
    );
    let expected = acked.len() + usize::from(in_flight_kept);
    let list = gw.admin("GET", "/apisix/admin/routes", "");
    assert_eq!(list.status, 200);
    assert_eq!(
        list.json()["total"],
        expected,
        "no route beyond the in-flight one"
    );
    assert_eq!(gw.config_report()["routes"], expected);
    assert_eq!(gw.control("/status/ready").status, 200);

    // The store keeps working after the crash: a new write is acknowledged and served.
    gw.put_route("after", &route_to("/after-crash", &up.node()));
    poll_from(
        Instant::now(),
        Duration::from_secs(10),
        Duration::from_millis(10),
        || gw.status_of("/after-crash") == 200,
    )
    .expect("a PUT after the restart was not served");
}

/// PUT through the Admin API to the first 200 through the data port, over 200 new routes.
/// Ignored by default (it only prints figures); run with `--ignored --nocapture`.
#[test]
#[ignore]
fn propagation_figure_embedded() {
    let up = Upstream::start("prop", Behaviour::Echo);
    let gw = StoreGatewayBuilder::embedded().start();
    let (total, after_ack) = support::measure_propagation(&gw, &up, 200);
    eprintln!(
        "propagation (embedded, 200 PUTs): PUT sent -> first 200: p50 {:?} p99 {:?} max {:?}; \
         PUT answered -> first 200: p50 {:?} p99 {:?}",
        percentile(&total, 50.0),
        percentile(&total, 99.0),
        percentile(&total, 100.0),
        percentile(&after_ack, 50.0),
        percentile(&after_ack, 99.0),
    );
}

/// `apisix_etcd_modify_indexes` follows the store: each directory's highest modify index,
/// their maximum, and the store revision.
#[test]
fn modify_indexes_follow_the_store() {
    let up = Upstream::start("mi", Behaviour::Echo);
    let gw = StoreGatewayBuilder::embedded().start();
    let up_body = serde_json::json!({"type": "roundrobin", "nodes": {up.node(): 1}});
    let reply = gw.admin("PUT", "/apisix/admin/upstreams/u1", &up_body.to_string());
    assert_eq!(reply.status, 201, "{}", reply.text());
    gw.put_route("r1", &route_to("/a", &up.node()));
    gw.put_route("r2", &route_to("/b", &up.node()));
    // A GET answers the stored item with its modifiedIndex (a PUT answers only key and value).
    let index = |path: &str| -> i64 {
        let r = gw.admin("GET", path, "");
        r.json()["modifiedIndex"]
            .as_i64()
            .unwrap_or_else(|| panic!("{path}: {}", r.text()))
    };
    let upstream_index = index("/apisix/admin/upstreams/u1");
    let route_index = index("/apisix/admin/routes/r2");
    assert!(route_index > upstream_index);
    let metrics_addr = std::net::SocketAddr::from(([127, 0, 0, 1], gw.metrics_port));
    let sample = |text: &str, key: &str| -> Option<i64> {
        let prefix = format!("apisix_etcd_modify_indexes{{key=\"{key}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.parse().ok())
    };
    let mut text = String::new();
    let seen = support::poll_until(Duration::from_secs(10), || {
        text = support::get(metrics_addr, "/apisix/prometheus/metrics").text();
        sample(&text, "routes") == Some(route_index)
    });
    assert!(seen.is_some(), "{text}");
    assert_eq!(sample(&text, "upstreams"), Some(upstream_index));
    assert_eq!(sample(&text, "services"), Some(0));
    assert_eq!(sample(&text, "max_modify_index"), Some(route_index));
    assert!(
        sample(&text, "x_etcd_index").unwrap() >= route_index,
        "{text}"
    );
}

/// A restart with thousands of routes stored (enough for the first compile to validate on
/// every core) serves the whole configuration from the data port's first request: the port
/// opens only once the first configuration is compiled whole, never with part of the table.
#[test]
fn a_restart_serves_every_stored_route_from_the_first_request() {
    const ROUTES: usize = 2000;
    let up = Upstream::start("boot", Behaviour::Echo);
    let mut gw = StoreGatewayBuilder::embedded()
        .log_filter("warn,ferrisix=info")
        .start();
    for i in 0..ROUTES {
        let reply = gw.put_route(&i.to_string(), &route_to(&format!("/boot/{i}"), &up.node()));
        assert!(matches!(reply.status, 200 | 201), "{}", reply.text());
    }
    gw.stop();
    gw.restart();
    // `restart` returns as soon as the ports listen: nothing has waited for a compile since.
    for i in [ROUTES - 1, 0, ROUTES / 2, ROUTES - 2] {
        let reply = support::get(gw.data_addr(), &format!("/boot/{i}"));
        assert_eq!(
            reply.status, 200,
            "route {i} at the first request after the restart"
        );
    }
    let ready = support::get(gw.control_addr(), "/status/ready");
    assert_eq!(ready.status, 200, "{}", ready.text());
    let log = gw.log_text();
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("first configuration compiled"))
        .unwrap_or_else(|| panic!("no boot line in the log:\n{log}"));
    assert!(line.contains(&format!("routes={ROUTES}")), "{line}");
    assert!(line.contains("validate_us="), "{line}");
}

/// The control API's `/v1/schema`: the core schemas under `main`, and the enabled HTTP and
/// stream plugins as the Admin API's `?all=true` lists them.
#[test]
fn control_schema_lists_the_core_and_plugin_schemas() {
    let gw = StoreGatewayBuilder::embedded().start();
    let reply = gw.control("/v1/schema");
    assert_eq!(reply.status, 200, "{}", reply.text());
    let doc = reply.json();
    for name in [
        "route",
        "upstream",
        "service",
        "consumer",
        "ssl",
        "stream_route",
        "plugins",
    ] {
        assert!(
            doc["main"][name].is_object(),
            "main.{name}: {}",
            doc["main"]
        );
    }
    assert!(doc["main"]["route"]["properties"]["uri"].is_object());
    assert_eq!(doc["plugins"]["limit-count"]["priority"], 1002);
    let all = gw.admin("GET", "/apisix/admin/plugins?all=true", "").json();
    assert_eq!(doc["plugins"], all, "the Admin API's list");
    let stream = gw
        .admin("GET", "/apisix/admin/plugins?all=true&subsystem=stream", "")
        .json();
    assert_eq!(doc["stream_plugins"], stream);
    assert!(doc["stream_plugins"]["limit-conn"].is_object());
}

/// `ferrisix.admin_on_data_port`: the Admin API answers loopback clients on the data port too
/// (APISIX 2.x's layout); other paths there are the data plane's.
#[test]
fn admin_on_the_data_port_for_loopback_clients() {
    let gw = StoreGatewayBuilder::embedded()
        .ferrisix_key("admin_on_data_port: true")
        .start();
    let key = [("x-api-key", ADMIN_KEY)];
    let put = support::request(
        gw.data_addr(),
        "PUT",
        "/apisix/admin/routes/d1",
        &key,
        br#"{"uri": "/d1", "upstream": {"nodes": {"127.0.0.1:1": 1}}}"#,
    );
    assert_eq!(put.status, 201, "{}", put.text());
    let list = support::request(gw.data_addr(), "GET", "/apisix/admin/routes", &key, b"");
    assert_eq!(list.status, 200, "{}", list.text());
    assert_eq!(list.json()["total"], 1);
    let unauthorized = support::request(gw.data_addr(), "GET", "/apisix/admin/routes", &[], b"");
    assert_eq!(unauthorized.status, 401);
    assert_eq!(
        gw.get("/nothing-here").status,
        404,
        "the data plane still serves the rest"
    );
}
