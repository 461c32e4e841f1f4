//! APISIX's API-driven standalone mode, end to end: a real `ferrisix` process with
//! `role: traditional` and `role_traditional.config_provider: yaml`, configured only through
//! `PUT /apisix/admin/configs`, as apisix-ingress-controller 2.x and ADC drive it.
//!
//! * the whole cycle: empty and not ready at start, a PUT served, GET/HEAD, the same digest,
//!   a version going back, a refused document, the resource endpoints answering 404, `{}`;
//! * ADC's `apisix-standalone` backend's requests replayed as its source builds them (version
//!   probe, `HEAD` then `GET` of the config, `PUT`s with millisecond versions and
//!   `modifiedIndex`es, credentials as consumer items);
//! * a restart starts empty and not ready, as APISIX's in-memory configuration does.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{
    free_port, poll_until, request, Behaviour, Reply, StoreGateway, StoreGatewayBuilder, Upstream,
    ADMIN_KEY,
};

const CONFIGS: &str = "/apisix/admin/configs";

/// A node in API-driven standalone mode with the status API on a port of its own.
fn start() -> (StoreGateway, u16) {
    let status = free_port();
    let gw = StoreGatewayBuilder::standalone_api()
        .apisix_key(&format!("status:\n  ip: 127.0.0.1\n  port: {status}"))
        .start();
    (gw, status)
}

fn admin(
    gw: &StoreGateway,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let mut all = vec![("X-API-KEY", ADMIN_KEY)];
    all.extend_from_slice(headers);
    request(gw.admin_addr(), method, path, &all, body)
}

fn put_config(gw: &StoreGateway, digest: &str, body: &Value) -> Reply {
    admin(
        gw,
        "PUT",
        CONFIGS,
        &[("X-Digest", digest), ("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
}

fn status(port: u16, path: &str) -> Reply {
    request(
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        "GET",
        path,
        &[],
        b"",
    )
}

fn data_get(gw: &StoreGateway, path: &str, headers: &[(&str, &str)]) -> Reply {
    request(gw.data_addr(), "GET", path, headers, b"")
}

/// Waits until `path` answers `code` on the data port (a PUT is applied asynchronously).
fn wait_for(gw: &StoreGateway, path: &str, headers: &[(&str, &str)], code: u16) {
    let seen = poll_until(Duration::from_secs(10), || {
        data_get(gw, path, headers).status == code
    });
    assert!(
        seen.is_some(),
        "{path} never answered {code}: {} {}",
        data_get(gw, path, headers).status,
        data_get(gw, path, headers).text()
    );
}

fn route(id: &str, uri: &str, node: &str) -> Value {
    json!({"id": id, "uri": uri, "upstream": {"type": "roundrobin", "nodes": {node: 1}}})
}

#[test]
fn configs_are_put_served_read_back_and_guarded() {
    let up = Upstream::start("standalone", Behaviour::Echo);
    let (gw, status_port) = start();

    // Empty and not ready until the first configuration.
    let ready = status(status_port, "/status/ready");
    assert_eq!(ready.status, 503, "{}", ready.text());
    assert_eq!(ready.json()["status"], "error");
    assert_eq!(
        status(status_port, "/status").json(),
        json!({"status": "ok"})
    );
    let empty = admin(&gw, "GET", CONFIGS, &[], b"");
    assert_eq!(empty.status, 200);
    assert_eq!(empty.json()["routes_conf_version"], 0);
    assert_eq!(empty.header("X-Digest"), None);

    let config = json!({
        "routes": [
            route("r1", "/sa/one", &up.node()),
            {"id": "r2", "uri": "/sa/two", "upstream_id": "u1", "plugins": {"key-auth": {}}},
        ],
        "upstreams": [{"id": "u1", "type": "roundrobin", "nodes": {up.node(): 1}}],
        "consumers": [
            {"username": "jack"},
            {"id": "jack/credentials/k1", "plugins": {"key-auth": {"key": "jack-key"}}},
        ],
    });
    let put = put_config(&gw, "digest-1", &config);
    assert_eq!(put.status, 202, "{}", put.text());
    assert!(put.body.is_empty());
    assert_eq!(put.header("X-Digest"), Some("digest-1"));
    let modified: u64 = put.header("X-Last-Modified").unwrap().parse().unwrap();
    assert!(modified > 0);
    wait_for(&gw, "/sa/one", &[], 200);
    wait_for(&gw, "/sa/two", &[("apikey", "jack-key")], 200);
    assert_eq!(data_get(&gw, "/sa/two", &[]).status, 401);
    assert_eq!(status(status_port, "/status/ready").status, 200);

    // Read back: the lists as put, a version per type, the metadata keys and headers.
    let got = admin(&gw, "GET", CONFIGS, &[], b"");
    assert_eq!(got.header("X-Digest"), Some("digest-1"));
    assert_eq!(got.header("Content-Type"), Some("application/json"));
    let doc = got.json();
    assert_eq!(doc["routes"], config["routes"]);
    assert_eq!(doc["consumers"], config["consumers"]);
    assert_eq!(doc["routes_conf_version"], 1);
    assert_eq!(doc["X-Digest"], "digest-1");
    assert!(doc.get("services").is_none());
    let yaml = admin(&gw, "GET", CONFIGS, &[("Accept", "application/yaml")], b"");
    assert_eq!(yaml.header("Content-Type"), Some("application/yaml"));
    assert!(yaml.text().contains("id: r1"), "{}", yaml.text());
    let head = admin(&gw, "HEAD", CONFIGS, &[], b"");
    assert_eq!(head.status, 200);
    assert_eq!(head.header("X-Digest"), Some("digest-1"));

    // The loaded digest again: 204, nothing applied.
    let same = put_config(&gw, "digest-1", &json!({}));
    assert_eq!(same.status, 204);
    assert_eq!(data_get(&gw, "/sa/one", &[]).status, 200);

    // A version going back, a document that does not validate: 400, nothing applied.
    let back = put_config(&gw, "digest-2", &json!({"routes_conf_version": 0}));
    assert_eq!(back.status, 400);
    assert_eq!(
        back.json()["error_msg"],
        "routes_conf_version must be greater than or equal to (1)"
    );
    let bad = put_config(&gw, "digest-3", &json!({"routes": [{"id": "x", "uri": 1}]}));
    assert_eq!(bad.status, 400);
    assert_eq!(
        bad.json()["error_msg"],
        "invalid configuration: property \"uri\" validation failed: wrong type: expected string, got number"
    );
    let missing = admin(&gw, "PUT", CONFIGS, &[], b"{}");
    assert_eq!(missing.json()["error_msg"], "missing digest header");
    assert_eq!(
        admin(&gw, "HEAD", CONFIGS, &[], b"").header("X-Digest"),
        Some("digest-1")
    );

    // Nothing else of the Admin API is served; the key is required.
    assert_eq!(
        admin(&gw, "GET", "/apisix/admin/routes", &[], b"").status,
        404
    );
    assert_eq!(admin(&gw, "DELETE", CONFIGS, &[], b"").status, 404);
    let nokey = request(gw.admin_addr(), "GET", CONFIGS, &[], b"");
    assert_eq!(nokey.status, 401);

    // Validation alone applies nothing.
    let valid = admin(
        &gw,
        "POST",
        "/apisix/admin/configs/validate",
        &[],
        json!({"routes": [route("v", "/sa/validated", &up.node())]})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(valid.status, 200, "{}", valid.text());
    assert_eq!(data_get(&gw, "/sa/validated", &[]).status, 404);

    // `{}` removes everything.
    assert_eq!(put_config(&gw, "digest-4", &json!({})).status, 202);
    wait_for(&gw, "/sa/one", &[], 404);
    assert_eq!(
        data_get(&gw, "/sa/one", &[]).json()["error_msg"],
        "404 Route Not Found"
    );
}

/// A digest as ADC sends it: the hex of a hash of the JSON body it puts.
fn digest_of(body: &Value) -> String {
    let mut h = DefaultHasher::new();
    body.to_string().hash(&mut h);
    format!("{:016x}", h.finish())
}

/// ADC's `apisix-standalone` backend (`libs/backend-apisix-standalone`): `HEAD /apisix/admin`
/// for the version, `HEAD` of the config to find the latest server, `GET` of it as the cache,
/// then each sync `PUT`s the cached document with the changed types' `<type>_conf_version`
/// and the changed items' `modifiedIndex` set to the sync's millisecond timestamp, without
/// the `X-Last-Modified` and `X-Digest` keys, and a digest of the body.
#[test]
fn adc_standalone_backend_sync_sequence() {
    let up = Upstream::start("adc", Behaviour::Echo);
    let up_port: u16 = up.node().rsplit(':').next().unwrap().parse().unwrap();
    let (gw, _) = start();
    let ping = admin(&gw, "HEAD", "/apisix/admin", &[], b"");
    assert_eq!(ping.status, 200);
    assert_eq!(
        admin(&gw, "HEAD", CONFIGS, &[], b"").header("X-Last-Modified"),
        None
    );
    let mut cache = admin(&gw, "GET", CONFIGS, &[], b"").json();

    // First sync: a service with its inline upstream, a route under it, a consumer with a
    // credential (ADC names it `<username>/credentials/<name>`), a global rule.
    let t1: u64 = 1_750_000_000_000;
    let obj = cache.as_object_mut().unwrap();
    obj.insert(
        "services".into(),
        json!([{"id": "svc", "name": "svc", "modifiedIndex": t1,
                "upstream": {"type": "roundrobin", "scheme": "http",
                             "nodes": [{"host": "127.0.0.1", "port": up_port, "weight": 100}]}}]),
    );
    obj.insert(
        "routes".into(),
        json!([
            {"id": "rt-a", "name": "a", "uris": ["/adc/a"], "service_id": "svc", "modifiedIndex": t1},
            {"id": "rt-b", "name": "b", "uris": ["/adc/b"], "service_id": "svc", "modifiedIndex": t1,
             "plugins": {"key-auth": {}}},
        ]),
    );
    obj.insert(
        "consumers".into(),
        json!([
            {"username": "alice", "modifiedIndex": t1},
            {"id": "alice/credentials/main", "name": "main", "modifiedIndex": t1,
             "plugins": {"key-auth": {"key": "alice-key"}}},
        ]),
    );
    obj.insert(
        "global_rules".into(),
        json!([{"id": "response-rewrite", "modifiedIndex": t1,
                "plugins": {"response-rewrite": {"headers": {"set": {"X-Adc": "on"}}}}}]),
    );
    for t in ["services", "routes", "consumers", "global_rules"] {
        obj.insert(format!("{t}_conf_version"), json!(t1));
    }
    let put = put_config(&gw, &digest_of(&cache), &cache);
    assert_eq!(put.status, 202, "{}", put.text());
    wait_for(&gw, "/adc/a", &[], 200);
    assert_eq!(data_get(&gw, "/adc/a", &[]).header("X-Adc"), Some("on"));
    wait_for(&gw, "/adc/b", &[("apikey", "alice-key")], 200);

    // Second sync from a fresh cache: route b changes (new modifiedIndex), route a is kept
    // with its old one, only the routes' version moves on.
    let mut cache = admin(&gw, "GET", CONFIGS, &[], b"").json();
    let obj = cache.as_object_mut().unwrap();
    obj.remove("X-Last-Modified");
    obj.remove("X-Digest");
    let t2 = t1 + 5_000;
    obj["routes"][1]["uris"] = json!(["/adc/b2"]);
    obj["routes"][1]["modifiedIndex"] = json!(t2);
    obj.insert("routes_conf_version".into(), json!(t2));
    let put = put_config(&gw, &digest_of(&cache), &cache);
    assert_eq!(put.status, 202, "{}", put.text());
    wait_for(&gw, "/adc/b2", &[("apikey", "alice-key")], 200);
    assert_eq!(
        data_get(&gw, "/adc/b", &[("apikey", "alice-key")]).status,
        404
    );
    assert_eq!(data_get(&gw, "/adc/a", &[]).status, 200);
    let doc = admin(&gw, "GET", CONFIGS, &[], b"").json();
    assert_eq!(doc["routes_conf_version"], json!(t2));
    assert_eq!(doc["services_conf_version"], json!(t1));

    // A change sent without a new modifiedIndex is not loaded, as APISIX keeps an item whose
    // modifiedIndex it has already loaded.
    let mut stale = doc.clone();
    let obj = stale.as_object_mut().unwrap();
    obj.remove("X-Last-Modified");
    obj.remove("X-Digest");
    obj["routes"][0]["uris"] = json!(["/adc/a-stale"]);
    // Route b's change, with a new modifiedIndex, shows when the PUT is applied.
    obj["routes"][1]["uris"] = json!(["/adc/b3"]);
    obj["routes"][1]["modifiedIndex"] = json!(t2 + 1);
    obj.insert("routes_conf_version".into(), json!(t2 + 1));
    assert_eq!(put_config(&gw, &digest_of(&stale), &stale).status, 202);
    wait_for(&gw, "/adc/b3", &[("apikey", "alice-key")], 200);
    assert_eq!(data_get(&gw, "/adc/a", &[]).status, 200);
    assert_eq!(data_get(&gw, "/adc/a-stale", &[]).status, 404);

    // A sync whose timestamp went back (ADC after a clock rollback, before it corrects it).
    let mut old = stale.clone();
    old["routes_conf_version"] = json!(t1);
    let refused = put_config(&gw, &digest_of(&old), &old);
    assert_eq!(refused.status, 400);
    assert_eq!(
        refused.json()["error_msg"],
        format!(
            "routes_conf_version must be greater than or equal to ({})",
            t2 + 1
        )
    );
}

/// The configuration lives in memory: a restarted node is empty and not ready until the
/// controller pushes again, as APISIX after a restart.
#[test]
fn a_restart_starts_empty_and_not_ready() {
    let up = Upstream::start("restart", Behaviour::Echo);
    let (mut gw, status_port) = start();
    let put = put_config(
        &gw,
        "d",
        &json!({"routes": [route("1", "/sa/r", &up.node())]}),
    );
    assert_eq!(put.status, 202);
    wait_for(&gw, "/sa/r", &[], 200);
    gw.stop();
    gw.restart();
    assert_eq!(data_get(&gw, "/sa/r", &[]).status, 404);
    assert_eq!(
        admin(&gw, "GET", CONFIGS, &[], b"").json()["routes_conf_version"],
        0
    );
    let ready = poll_until(Duration::from_secs(5), || {
        status(status_port, "/status/ready").status == 503
    });
    assert!(ready.is_some());
}

/// A `stream_routes` item of the pushed document is served on the stream port (with
/// `proxy_mode: http&stream`): the stream proxy compiles the same published state.
#[test]
fn stream_routes_of_the_document_are_served() {
    use std::io::{Read, Write};
    // A TCP node that answers every read with "echo: " and what it read.
    let node = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let node_addr = node.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut conn in node.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0 || conn.write_all(&[b"echo: ", &buf[..n]].concat()).is_err() {
                        break;
                    }
                }
            });
        }
    });
    let (tcp, udp) = (free_port(), free_port());
    let gw = StoreGatewayBuilder::standalone_api()
        .apisix_key(&format!(
            "proxy_mode: http&stream\nstream_proxy:\n  tcp:\n    - \"127.0.0.1:{tcp}\"\n  udp:\n    - \"127.0.0.1:{udp}\""
        ))
        .start();
    let doc = json!({
        "stream_routes": [{
            "id": "s1",
            "server_port": tcp,
            "upstream": {"type": "roundrobin", "nodes": {node_addr.to_string(): 1}}
        }]
    });
    assert_eq!(put_config(&gw, "stream-1", &doc).status, 202);
    let echoed = || -> Option<()> {
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", tcp)).ok()?;
        conn.set_read_timeout(Some(Duration::from_millis(500)))
            .ok()?;
        conn.write_all(b"ping").ok()?;
        let mut buf = [0u8; 64];
        let n = conn.read(&mut buf).ok()?;
        (&buf[..n] == b"echo: ping").then_some(())
    };
    let answered = poll_until(Duration::from_secs(10), || echoed().is_some());
    assert!(
        answered.is_some(),
        "the pushed stream route was not served on 127.0.0.1:{tcp}"
    );
}
