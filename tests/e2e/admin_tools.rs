//! The tools APISIX users drive the Admin API with, replayed against a real `ferrisix` on the
//! embedded store, with the requests and bodies their sources build:
//!
//! * ADC's `apisix` backend (`api7/adc` `libs/backend-apisix`): the version probe
//!   (`GET /routes`, `Server` header), the dump (every list, credentials per consumer, the
//!   stream routes' list that may fail), the sync (`PUT`/`DELETE` per event, a service's inline
//!   upstream as `upstreams/<service id>` first), and `POST /configs/validate` (apisix-
//!   ingress-controller 2.x drives ADC, so its `apisix` provider sends the same);
//! * the dashboard (`apache/apisix-dashboard` `src/apis/`): its static files at `/ui/` (the
//!   redirect, the SPA fallback, nothing outside the directory) and its Admin API calls.
//!
//! ADC's `apisix-standalone` backend is replayed in `standalone_api`.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{
    poll_until, request, Behaviour, Reply, StoreGateway, StoreGatewayBuilder, Upstream, ADMIN_KEY,
};

const SERVICE_ID: &str = "10c8fac6b8ca448731d1c21385b93c1b0729ccc5";
const ROUTE_ID: &str = "6613a8e57c1b9c58747159a82f03fbd391b1e9bc";
const CREDENTIAL_ID: &str = "92c00879d44c5e2365b0eade59e4e6a2f7f2e3bd";
const SSL_ID: &str = "7f838658bd27e0b60e8252355abd75817d307ac2";
const EXTRA_UPSTREAM_ID: &str = "c173ee9fba7b08af407476092a3ea7c96c878a5b";

/// An ADC request: its axios client sends `Content-Type: application/json` and `X-API-KEY`
/// on every call.
fn adc(gw: &StoreGateway, method: &str, path: &str, body: Option<&Value>) -> Reply {
    let text = body.map(Value::to_string).unwrap_or_default();
    request(
        gw.admin_addr(),
        method,
        path,
        &[
            ("Content-Type", "application/json"),
            ("X-API-KEY", ADMIN_KEY),
        ],
        text.as_bytes(),
    )
}

fn ok(reply: &Reply, what: &str) {
    assert!(
        (200..300).contains(&reply.status),
        "{what}: {} {}",
        reply.status,
        reply.text()
    );
}

/// ADC's `version()`: `APISIX/(.*)` in the `Server` header, coerced; anything else is
/// `999.999.999`, which ADC treats as the newest APISIX (credentials listed per consumer,
/// stream routes with `__ADC_NAME` labels, `HEAD` of the configs).
fn adc_version(server: Option<&str>) -> (u64, u64, u64) {
    let fallback = (999, 999, 999);
    let Some(server) = server else {
        return fallback;
    };
    let Some(at) = server.find("APISIX/") else {
        return fallback;
    };
    let nums: Vec<u64> = server[at + 7..]
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .take(3)
        .filter_map(|s| s.parse().ok())
        .collect();
    match nums.as_slice() {
        [a, b, c, ..] => (*a, *b, *c),
        [a, b] => (*a, *b, 0),
        [a] => (*a, 0, 0),
        [] => fallback,
    }
}

/// The `list` of a list answer as ADC reads it (`resp.data.list.map(item => item.value)`):
/// it must be an array, also when empty.
fn list_values(reply: &Reply, what: &str) -> Vec<Value> {
    ok(reply, what);
    let body = reply.json();
    let list = body["list"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: `list` is not an array: {body}"));
    list.iter().map(|item| item["value"].clone()).collect()
}

/// ADC's `Fetcher.dump()`: every list, then the credentials of each consumer.
fn adc_dump(gw: &StoreGateway) -> Value {
    let mut out = serde_json::Map::new();
    for name in [
        "services",
        "routes",
        "upstreams",
        "ssls",
        "consumers",
        "plugin_configs",
        "global_rules",
    ] {
        let reply = adc(gw, "GET", &format!("/apisix/admin/{name}"), None);
        out.insert(name.into(), Value::Array(list_values(&reply, name)));
    }
    // Plugin metadata: the plugin name is the last segment of each item's `key`.
    let reply = adc(gw, "GET", "/apisix/admin/plugin_metadata", None);
    ok(&reply, "plugin_metadata");
    let body = reply.json();
    let mut metadata = serde_json::Map::new();
    for item in body["list"].as_array().expect("plugin_metadata list") {
        let key = item["key"].as_str().expect("key");
        let name = key.rsplit('/').next().unwrap().to_owned();
        metadata.insert(name, item["value"].clone());
    }
    out.insert("plugin_metadata".into(), Value::Object(metadata));
    // Stream routes: any status >= 400 reads as none (stream mode off).
    let reply = adc(gw, "GET", "/apisix/admin/stream_routes", None);
    if reply.status < 400 {
        let routes = list_values(&reply, "stream_routes");
        out.insert("stream_routes".into(), Value::Array(routes));
    } else {
        assert_eq!(reply.status, 400, "{}", reply.text());
        assert_eq!(
            reply.json(),
            json!({"error_msg": "stream mode is disabled, can not add stream routes"})
        );
        out.insert("stream_routes".into(), json!([]));
    }
    // Credentials (version >= 3.11): a 404 keeps the consumer as it is.
    let mut credentials = serde_json::Map::new();
    for consumer in out["consumers"].as_array().unwrap().clone() {
        let username = consumer["username"].as_str().expect("username").to_owned();
        let reply = adc(
            gw,
            "GET",
            &format!("/apisix/admin/consumers/{username}/credentials"),
            None,
        );
        if reply.status != 404 {
            let list = list_values(&reply, "credentials");
            credentials.insert(username, Value::Array(list));
        }
    }
    out.insert("credentials".into(), Value::Object(credentials));
    Value::Object(out)
}

fn cert(name: &str) -> String {
    std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/tls")
            .join(name),
    )
    .unwrap()
}

/// The ADC `apisix` backend's sync of a configuration (a service with an inline upstream and
/// a route, a consumer with a key-auth credential, an SSL, a global rule, plugin metadata, an
/// upstream bound to the service), then its dump read back, its validation, and the deletes.
#[test]
fn adc_apisix_backend_dump_sync_validate_and_delete() {
    let backend = Upstream::start("adc-backend", Behaviour::Echo);
    let gw = StoreGatewayBuilder::embedded().start();

    // version(): the first call of every dump and sync.
    let probe = adc(&gw, "GET", "/apisix/admin/routes", None);
    ok(&probe, "version probe");
    let server = probe.header("Server").map(str::to_owned);
    assert!(
        server
            .as_deref()
            .is_some_and(|s| s.starts_with("ferrisix/")),
        "{server:?}"
    );
    // ferrisix names itself, so ADC takes it for the newest APISIX: every feature it gates
    // on the version (credentials >= 3.11, stream routes >= 3.8) is used.
    assert_eq!(adc_version(server.as_deref()), (999, 999, 999));
    assert_eq!(adc_version(Some("APISIX/3.14.1")), (3, 14, 1));

    // The first dump of an empty gateway: every list an array, stream routes refused.
    let empty = adc_dump(&gw);
    for name in ["services", "routes", "upstreams", "ssls", "consumers"] {
        assert_eq!(empty[name], json!([]), "{name}");
    }
    assert_eq!(empty["plugin_metadata"], json!({}));

    // sync(): service create = PUT upstreams/<id> (the inline upstream, with the service's
    // id and name), then PUT services/<id> without it.
    let upstream = json!({
        "type": "roundrobin",
        "scheme": "http",
        "nodes": [{"host": "127.0.0.1", "port": backend.node().rsplit(':').next().unwrap().parse::<u16>().unwrap(), "weight": 100}],
        "timeout": {"connect": 3, "send": 3, "read": 3},
        "pass_host": "pass",
        "id": SERVICE_ID,
        "name": "httpbin-svc",
    });
    ok(
        &adc(
            &gw,
            "PUT",
            &format!("/apisix/admin/upstreams/{SERVICE_ID}"),
            Some(&upstream),
        ),
        "upstream",
    );
    let service = json!({
        "id": SERVICE_ID,
        "name": "httpbin-svc",
        "desc": "the service ADC made",
        "labels": {"team": "api", "tags": "[\"a\",\"b\"]"},
        "upstream_id": SERVICE_ID,
        "hosts": ["adc.example.com"],
    });
    let put = adc(
        &gw,
        "PUT",
        &format!("/apisix/admin/services/{SERVICE_ID}"),
        Some(&service),
    );
    ok(&put, "service");
    assert_eq!(put.json()["value"]["upstream_id"], SERVICE_ID);

    // Upstream with a parent service: labelled with the service's id.
    let extra = json!({
        "type": "chash",
        "hash_on": "header",
        "key": "x-user",
        "nodes": [{"host": "127.0.0.1", "port": 1980, "weight": 1}],
        "name": "extra-upstream",
        "labels": {"__ADC_UPSTREAM_SERVICE_ID": SERVICE_ID},
    });
    ok(
        &adc(
            &gw,
            "PUT",
            &format!("/apisix/admin/upstreams/{EXTRA_UPSTREAM_ID}"),
            Some(&extra),
        ),
        "upstream of the service",
    );

    let route = json!({
        "id": ROUTE_ID,
        "name": "httpbin-route",
        "desc": "get",
        "uris": ["/adc/*"],
        "hosts": ["adc.example.com"],
        "methods": ["GET", "POST"],
        "service_id": SERVICE_ID,
        "plugins": {"key-auth": {}, "proxy-rewrite": {"regex_uri": ["^/adc/(.*)", "/$1"]}},
        "priority": 0,
        "status": 1,
    });
    let put = adc(
        &gw,
        "PUT",
        &format!("/apisix/admin/routes/{ROUTE_ID}"),
        Some(&route),
    );
    ok(&put, "route");
    assert_eq!(put.json()["key"], format!("/apisix/routes/{ROUTE_ID}"));

    // Consumer: PUT consumers/<username> with the username in the body too.
    let consumer = json!({"username": "jack", "desc": "a consumer", "labels": {"org": "x"}});
    ok(
        &adc(&gw, "PUT", "/apisix/admin/consumers/jack", Some(&consumer)),
        "consumer",
    );
    let credential = json!({
        "id": CREDENTIAL_ID,
        "name": "jack-key",
        "plugins": {"key-auth": {"key": "jack-secret"}},
    });
    let put = adc(
        &gw,
        "PUT",
        &format!("/apisix/admin/consumers/jack/credentials/{CREDENTIAL_ID}"),
        Some(&credential),
    );
    ok(&put, "credential");

    let ssl = json!({
        "id": SSL_ID,
        "status": 1,
        "type": "server",
        "snis": ["adc.example.com"],
        "cert": cert("server.crt"),
        "key": cert("server.key"),
    });
    ok(
        &adc(
            &gw,
            "PUT",
            &format!("/apisix/admin/ssls/{SSL_ID}"),
            Some(&ssl),
        ),
        "ssl",
    );

    // Global rule: one per plugin, named after it.
    let rule = json!({"plugins": {"response-rewrite": {"headers": {"set": {"x-adc": "1"}}}}});
    ok(
        &adc(
            &gw,
            "PUT",
            "/apisix/admin/global_rules/response-rewrite",
            Some(&rule),
        ),
        "global rule",
    );
    // Plugin metadata: the plugin's configuration as the body.
    let metadata = json!({"log_format": {"host": "$host", "client_ip": "$remote_addr"}});
    ok(
        &adc(
            &gw,
            "PUT",
            "/apisix/admin/plugin_metadata/http-logger",
            Some(&metadata),
        ),
        "plugin metadata",
    );

    // The configuration serves as ADC meant it.
    // The route and the global rule are separate writes: wait until both serve.
    let seen = poll_until(Duration::from_secs(10), || {
        let r = request(
            gw.data_addr(),
            "GET",
            "/adc/get",
            &[("Host", "adc.example.com"), ("apikey", "jack-secret")],
            b"",
        );
        r.status == 200 && r.header("x-adc").is_some()
    });
    assert!(
        seen.is_some(),
        "the synced route and global rule never served"
    );
    let reply = request(
        gw.data_addr(),
        "GET",
        "/adc/get",
        &[("Host", "adc.example.com"), ("apikey", "jack-secret")],
        b"",
    );
    assert_eq!(reply.header("x-adc"), Some("1"));
    let reply = request(
        gw.data_addr(),
        "GET",
        "/adc/get",
        &[("Host", "adc.example.com")],
        b"",
    );
    assert_eq!(reply.status, 401, "key-auth from the credential");

    // The dump reads back what was synced, in the fields ADC maps.
    let dump = adc_dump(&gw);
    let services = dump["services"].as_array().unwrap();
    assert_eq!(services.len(), 1);
    assert_eq!(services[0]["upstream_id"], SERVICE_ID);
    assert_eq!(services[0]["labels"]["tags"], "[\"a\",\"b\"]");
    let routes = dump["routes"].as_array().unwrap();
    assert_eq!(routes[0]["service_id"], SERVICE_ID);
    assert_eq!(routes[0]["uris"], json!(["/adc/*"]));
    let upstreams = dump["upstreams"].as_array().unwrap();
    assert_eq!(upstreams.len(), 2);
    let bound: Vec<_> = upstreams
        .iter()
        .filter(|u| u["labels"]["__ADC_UPSTREAM_SERVICE_ID"] == SERVICE_ID)
        .collect();
    assert_eq!(bound.len(), 1);
    // Node lists keep their array form, which ADC reads as hosts and ports.
    assert!(
        upstreams.iter().all(|u| u["nodes"].is_array()),
        "{upstreams:?}"
    );
    // Consumers' list holds consumers only (no credentials), credentials come per consumer.
    let consumers = dump["consumers"].as_array().unwrap();
    assert_eq!(consumers.len(), 1, "{consumers:?}");
    assert_eq!(consumers[0]["username"], "jack");
    let creds = dump["credentials"]["jack"].as_array().unwrap();
    assert_eq!(creds.len(), 1);
    assert_eq!(creds[0]["id"], CREDENTIAL_ID);
    assert_eq!(creds[0]["name"], "jack-key");
    assert!(creds[0]["plugins"]["key-auth"].is_object());
    let ssls = dump["ssls"].as_array().unwrap();
    assert_eq!(ssls[0]["snis"], json!(["adc.example.com"]));
    assert!(ssls[0]["cert"]
        .as_str()
        .unwrap()
        .contains("BEGIN CERTIFICATE"));
    let rules = dump["global_rules"].as_array().unwrap();
    assert_eq!(rules[0]["id"], "response-rewrite");
    assert_eq!(
        dump["plugin_metadata"]["http-logger"]["log_format"]["host"],
        "$host"
    );

    // validate(): every resource type present (empty arrays too), ids and the service's
    // upstream together.
    let body = json!({
        "routes": [route],
        "services": [service],
        "consumers": [consumer],
        "ssls": [ssl],
        "global_rules": [{"id": "response-rewrite", "plugins": rule["plugins"]}],
        "stream_routes": [],
        "plugin_metadata": [{"id": "http-logger", "log_format": metadata["log_format"]}],
        "upstreams": [upstream],
    });
    let reply = adc(&gw, "POST", "/apisix/admin/configs/validate", Some(&body));
    assert_eq!(reply.status, 200, "{}", reply.text());
    // A bad route: 400 with the error per resource, which ADC maps back by index.
    let mut bad = body.clone();
    bad["routes"][0]["uris"] = json!("not-an-array");
    let reply = adc(&gw, "POST", "/apisix/admin/configs/validate", Some(&bad));
    assert_eq!(reply.status, 400, "{}", reply.text());
    let errors = reply.json();
    assert!(errors["error_msg"].is_string(), "{errors}");
    let first = &errors["errors"][0];
    assert_eq!(first["resource_type"], "routes", "{errors}");
    assert_eq!(first["index"], 0, "{errors}");

    // An update: PUT of the whole resource again.
    let mut updated = route.clone();
    updated["methods"] = json!(["GET"]);
    ok(
        &adc(
            &gw,
            "PUT",
            &format!("/apisix/admin/routes/{ROUTE_ID}"),
            Some(&updated),
        ),
        "route update",
    );

    // Deletes, in ADC's order: routes, then the service before its upstream.
    for path in [
        format!("/apisix/admin/routes/{ROUTE_ID}"),
        format!("/apisix/admin/upstreams/{EXTRA_UPSTREAM_ID}"),
        format!("/apisix/admin/services/{SERVICE_ID}"),
        format!("/apisix/admin/upstreams/{SERVICE_ID}"),
        format!("/apisix/admin/consumers/jack/credentials/{CREDENTIAL_ID}"),
        "/apisix/admin/consumers/jack".to_owned(),
        format!("/apisix/admin/ssls/{SSL_ID}"),
        "/apisix/admin/global_rules/response-rewrite".to_owned(),
        "/apisix/admin/plugin_metadata/http-logger".to_owned(),
    ] {
        let reply = adc(&gw, "DELETE", &path, None);
        assert_eq!(reply.status, 200, "DELETE {path}: {}", reply.text());
    }
    let after = adc_dump(&gw);
    for name in [
        "services",
        "routes",
        "upstreams",
        "ssls",
        "consumers",
        "global_rules",
    ] {
        assert_eq!(after[name], json!([]), "{name}");
    }
}

/// ADC deletes a service before the upstream it made for it; the other order is refused
/// with APISIX's message, so a sync that went wrong is visible.
#[test]
fn adc_order_matters_upstream_in_use() {
    let gw = StoreGatewayBuilder::embedded().start();
    let upstream =
        json!({"type": "roundrobin", "nodes": [{"host": "127.0.0.1", "port": 1980, "weight": 1}]});
    ok(
        &adc(&gw, "PUT", "/apisix/admin/upstreams/u1", Some(&upstream)),
        "upstream",
    );
    ok(
        &adc(
            &gw,
            "PUT",
            "/apisix/admin/services/u1",
            Some(&json!({"upstream_id": "u1"})),
        ),
        "service",
    );
    let reply = adc(&gw, "DELETE", "/apisix/admin/upstreams/u1", None);
    assert_eq!(reply.status, 400);
    assert_eq!(
        reply.json(),
        json!({"error_msg": "can not delete this upstream, service [u1] is still using it now"})
    );
}

// ---- the dashboard ----

/// A node with the dashboard's directory at `<config dir>/ui`.
fn start_with_ui() -> (StoreGateway, PathBuf) {
    let gw = StoreGatewayBuilder::embedded()
        .ferrisix_key("admin_ui_dir: ui")
        .start();
    let dir = gw.config_path().parent().unwrap().join("ui");
    std::fs::create_dir_all(dir.join("assets")).unwrap();
    std::fs::write(dir.join("index.html"), INDEX).unwrap();
    std::fs::write(
        dir.join("assets/index-abc.js"),
        "console.log('dashboard');\n",
    )
    .unwrap();
    std::fs::write(dir.join("assets/index-abc.css"), "body{margin:0}\n").unwrap();
    std::fs::write(dir.join("assets/logo.svg"), "<svg/>").unwrap();
    (gw, dir)
}

const INDEX: &str = "<!doctype html><html><body><div id=\"root\"></div></body></html>\n";

fn ui_get(gw: &StoreGateway, path: &str, headers: &[(&str, &str)]) -> Reply {
    request(gw.admin_addr(), "GET", path, headers, b"")
}

/// `t/cli/test_admin_ui.sh`'s checks: `/ui` redirects to the relative `/ui/`, the index,
/// assets, and the single-page application's fallback, without an admin key.
#[test]
fn dashboard_static_files_redirect_and_fallback() {
    let (gw, dir) = start_with_ui();

    let reply = ui_get(&gw, "/ui", &[]);
    assert_eq!(reply.status, 301);
    assert_eq!(reply.header("Location"), Some("/ui/"));
    let reply = ui_get(&gw, "/ui?x=1", &[]);
    assert_eq!(reply.header("Location"), Some("/ui/"));

    let reply = ui_get(&gw, "/ui/", &[]);
    assert_eq!(reply.status, 200);
    assert_eq!(reply.text(), INDEX);
    assert_eq!(reply.header("Content-Type"), Some("text/html"));
    let reply = ui_get(&gw, "/ui/index.html", &[]);
    assert_eq!((reply.status, reply.text().as_str()), (200, INDEX));

    let reply = ui_get(&gw, "/ui/assets/index-abc.js", &[]);
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("Content-Type"), Some("application/javascript"));
    assert_eq!(reply.text(), "console.log('dashboard');\n");
    assert!(reply.header("Expires").is_some());
    let cache: Vec<&str> = reply
        .headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("cache-control"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert!(cache.contains(&"private,max-age=7200"), "{cache:?}");
    let reply = ui_get(&gw, "/ui/assets/index-abc.css", &[]);
    assert_eq!(reply.header("Content-Type"), Some("text/css"));
    let reply = ui_get(&gw, "/ui/assets/logo.svg", &[]);
    assert_eq!(reply.header("Content-Type"), Some("image/svg+xml"));

    // A client-side route: the index.
    let reply = ui_get(&gw, "/ui/routes/detail/1", &[]);
    assert_eq!((reply.status, reply.text().as_str()), (200, INDEX));
    let reply = ui_get(&gw, "/ui/not_exist", &[]);
    assert_eq!((reply.status, reply.text().as_str()), (200, INDEX));

    // Revalidation and compression.
    let reply = ui_get(&gw, "/ui/assets/index-abc.js", &[]);
    let etag = reply.header("ETag").expect("etag").to_owned();
    let reply = ui_get(&gw, "/ui/assets/index-abc.js", &[("If-None-Match", &etag)]);
    assert_eq!(reply.status, 304);
    let reply = ui_get(
        &gw,
        "/ui/assets/index-abc.js",
        &[("Accept-Encoding", "gzip")],
    );
    assert_eq!(reply.header("Content-Encoding"), Some("gzip"));
    let mut plain = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(reply.body.as_slice()),
        &mut plain,
    )
    .unwrap();
    assert_eq!(plain, "console.log('dashboard');\n");

    // Only GET and HEAD.
    let reply = request(gw.admin_addr(), "POST", "/ui/index.html", &[], b"x");
    assert_eq!(reply.status, 405);
    let reply = request(gw.admin_addr(), "HEAD", "/ui/", &[], b"");
    assert_eq!(reply.status, 200);

    // Without an index, a miss is nginx's 404.
    std::fs::remove_file(dir.join("index.html")).unwrap();
    let reply = ui_get(&gw, "/ui/not_exist", &[]);
    assert_eq!(reply.status, 404);
    assert!(reply.text().contains("404 Not Found"));

    // The Admin API next to it still wants its key.
    let reply = ui_get(&gw, "/apisix/admin/routes", &[]);
    assert_eq!(reply.status, 401);
}

/// Nothing outside the directory: `..` in every spelling, and symlinks that leave it (the
/// config file, which holds the admin key, sits right beside the directory).
#[test]
fn dashboard_serves_nothing_outside_its_directory() {
    let (gw, dir) = start_with_ui();
    let config = std::fs::read_to_string(gw.config_path()).unwrap();
    assert!(config.contains(ADMIN_KEY));
    let leaked = |reply: &Reply| reply.text().contains(ADMIN_KEY);

    for path in [
        "/ui/../config.yaml",
        "/ui/%2e%2e/config.yaml",
        "/ui/..%2fconfig.yaml",
        "/ui/assets/../../config.yaml",
        "/ui/%2E%2E%2Fconfig.yaml",
        "/ui/....//config.yaml",
        "/ui//../config.yaml",
    ] {
        let reply = ui_get(&gw, path, &[]);
        assert!(!leaked(&reply), "{path} leaked the config");
    }
    #[cfg(unix)]
    {
        let outside: PathBuf = gw.config_path();
        std::os::unix::fs::symlink(&outside, dir.join("leak.yaml")).unwrap();
        std::os::unix::fs::symlink(dir.parent().unwrap(), dir.join("up")).unwrap();
        for path in ["/ui/leak.yaml", "/ui/up/config.yaml"] {
            let reply = ui_get(&gw, path, &[]);
            assert!(!leaked(&reply), "{path} leaked the config");
            // The SPA fallback answers instead.
            assert_eq!(
                (reply.status, reply.text().as_str()),
                (200, INDEX),
                "{path}"
            );
        }
        // A symlink inside the directory is served.
        std::os::unix::fs::symlink(dir.join("assets/logo.svg"), dir.join("logo.svg")).unwrap();
        assert_eq!(ui_get(&gw, "/ui/logo.svg", &[]).text(), "<svg/>");
    }
}

/// `enable_admin_ui: false`: `/ui/` is nginx's 404.
#[test]
fn dashboard_off() {
    let gw = StoreGatewayBuilder::embedded()
        .ferrisix_key("admin_ui_dir: ui")
        .admin_key("enable_admin_ui: false")
        .start();
    let dir = gw.config_path().parent().unwrap().join("ui");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("index.html"), INDEX).unwrap();
    assert_eq!(ui_get(&gw, "/ui/", &[]).status, 404);
    assert_eq!(ui_get(&gw, "/ui", &[]).status, 404);
}

/// The dashboard's request: `X-API-KEY`, JSON bodies, `qs` query strings.
fn dash(gw: &StoreGateway, method: &str, path: &str, body: Option<Value>) -> Reply {
    let text = body.map(|b| b.to_string()).unwrap_or_default();
    request(
        gw.admin_addr(),
        method,
        &format!("/apisix/admin{path}"),
        &[
            ("X-API-KEY", ADMIN_KEY),
            ("Content-Type", "application/json"),
        ],
        text.as_bytes(),
    )
}

/// A list as the dashboard reads it: `{total, list}`, `list` an array or (APISIX's empty
/// table) an empty object, which its interceptor turns into `[]`.
fn dash_list(reply: &Reply, what: &str) -> (u64, Vec<Value>) {
    ok(reply, what);
    let body = reply.json();
    let total = body["total"]
        .as_u64()
        .unwrap_or_else(|| panic!("{what}: {body}"));
    let list = match &body["list"] {
        Value::Array(items) => items.clone(),
        Value::Object(o) if o.is_empty() => Vec::new(),
        other => panic!("{what}: list is {other}"),
    };
    (total, list)
}

/// Every call of `src/apis/*.ts` with the parameters the pages send.
#[test]
fn dashboard_admin_api_calls() {
    let gw = StoreGatewayBuilder::embedded().start();

    // Plugins: the list, the schemas per subsystem with `all=true`, one schema.
    let reply = dash(&gw, "GET", "/plugins/list", None);
    ok(&reply, "plugins/list");
    let names = reply.json();
    assert!(names.as_array().unwrap().iter().any(|n| n == "key-auth"));
    let reply = dash(&gw, "GET", "/plugins?subsystem=http&all=true", None);
    ok(&reply, "plugins all");
    let all = reply.json();
    assert!(all["key-auth"]["schema"].is_object(), "{}", all["key-auth"]);
    assert!(all["key-auth"]["consumer_schema"].is_object());
    assert!(all["http-logger"]["metadata_schema"].is_object());
    // What the plugin picker offers: every plugin with a `schema`.
    let with_schema = all
        .as_object()
        .unwrap()
        .values()
        .filter(|v| v["schema"].is_object())
        .count();
    assert_eq!(with_schema, names.as_array().unwrap().len());
    let reply = dash(&gw, "GET", "/plugins?subsystem=stream&all=true", None);
    ok(&reply, "stream plugins");
    let stream = reply.json();
    assert!(stream["limit-conn"]["schema"].is_object(), "{stream}");
    assert!(stream.get("key-auth").is_none());
    let reply = dash(&gw, "GET", "/plugins/limit-count", None);
    ok(&reply, "plugin schema");
    assert!(reply.json()["properties"]["count"].is_object());

    // Upstreams: POST, list pages, detail, PUT without the id in the body.
    let reply = dash(
        &gw,
        "POST",
        "/upstreams",
        Some(
            json!({"name": "u", "type": "roundrobin", "nodes": [{"host": "127.0.0.1", "port": 1980, "weight": 1}]}),
        ),
    );
    ok(&reply, "POST upstream");
    let upstream_id = reply.json()["value"]["id"].as_str().unwrap().to_owned();
    ok(
        &dash(
            &gw,
            "PUT",
            "/upstreams/up2",
            Some(
                json!({"name": "u2", "type": "roundrobin", "nodes": [{"host": "127.0.0.1", "port": 1981, "weight": 1}]}),
            ),
        ),
        "PUT upstream",
    );
    let (total, list) = dash_list(
        &dash(&gw, "GET", "/upstreams?page=1&page_size=10", None),
        "upstreams",
    );
    assert_eq!((total, list.len()), (2, 2));
    let (_, list) = dash_list(
        &dash(&gw, "GET", "/upstreams?page=1&page_size=10&name=u2", None),
        "upstreams by name",
    );
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["value"]["id"], "up2");

    // Services and routes, with the service detail page's `filter`.
    let reply = dash(
        &gw,
        "POST",
        "/services",
        Some(json!({"name": "s", "upstream_id": upstream_id})),
    );
    ok(&reply, "POST service");
    let service_id = reply.json()["value"]["id"].as_str().unwrap().to_owned();
    ok(
        &dash(
            &gw,
            "PUT",
            "/routes/r1",
            Some(json!({"name": "r1", "uri": "/r1", "service_id": service_id})),
        ),
        "route in service",
    );
    ok(
        &dash(
            &gw,
            "POST",
            "/routes",
            Some(json!({"name": "r2", "uri": "/r2", "upstream_id": "up2"})),
        ),
        "POST route",
    );
    let filter = format!("/routes?page=1&page_size=10&filter=service_id%3D{service_id}");
    let (total, list) = dash_list(&dash(&gw, "GET", &filter, None), "routes of service");
    assert_eq!((total, list.len()), (1, 1), "{filter}");
    assert_eq!(list[0]["value"]["id"], "r1");
    let (total, _) = dash_list(
        &dash(&gw, "GET", "/routes?page=1&page_size=500", None),
        "routes",
    );
    assert_eq!(total, 2);
    let reply = dash(&gw, "GET", "/routes?page=1&page_size=5", None);
    assert_eq!(reply.status, 400, "page_size below APISIX's 10");
    let reply = dash(&gw, "GET", "/routes/r1", None);
    ok(&reply, "route detail");
    assert_eq!(reply.json()["value"]["uri"], "/r1");

    // Stream routes on a node without stream mode: the gate the dashboard recognises.
    let reply = dash(&gw, "GET", "/stream_routes?page=1&page_size=10", None);
    assert_eq!(reply.status, 400);
    assert!(reply.json()["error_msg"]
        .as_str()
        .unwrap()
        .contains("stream mode"));

    // Consumers: PUT to the collection, credentials (empty, then one), groups.
    ok(
        &dash(
            &gw,
            "PUT",
            "/consumer_groups/gold",
            Some(json!({"plugins": {"limit-count": {"count": 10, "time_window": 60}}})),
        ),
        "consumer group",
    );
    let (total, _) = dash_list(
        &dash(&gw, "GET", "/consumer_groups?page=1&page_size=10", None),
        "consumer groups",
    );
    assert_eq!(total, 1);
    ok(
        &dash(
            &gw,
            "PUT",
            "/consumers",
            Some(json!({"username": "rose", "group_id": "gold", "plugins": {}})),
        ),
        "consumer",
    );
    let reply = dash(
        &gw,
        "GET",
        "/consumers/rose/credentials?username=rose",
        None,
    );
    if reply.status != 404 {
        let (total, _) = dash_list(&reply, "no credentials");
        assert_eq!(total, 0);
    }
    ok(
        &dash(
            &gw,
            "PUT",
            "/consumers/rose/credentials/c1",
            Some(json!({"desc": "k", "plugins": {"key-auth": {"key": "rose-key"}}})),
        ),
        "credential",
    );
    let (total, list) = dash_list(
        &dash(
            &gw,
            "GET",
            "/consumers/rose/credentials?username=rose",
            None,
        ),
        "credentials",
    );
    assert_eq!(total, 1);
    assert_eq!(list[0]["value"]["id"], "c1");
    let reply = dash(&gw, "GET", "/consumers/rose/credentials/c1", None);
    ok(&reply, "credential detail");
    let (total, list) = dash_list(
        &dash(&gw, "GET", "/consumers?page=1&page_size=10", None),
        "consumers",
    );
    assert_eq!(total, 1, "credentials are not consumers: {list:?}");

    // Secrets: `<manager>/<id>`, which the dashboard splits.
    ok(
        &dash(
            &gw,
            "PUT",
            "/secrets/vault/s1",
            Some(json!({"uri": "http://127.0.0.1:8200", "prefix": "kv/apisix", "token": "t"})),
        ),
        "secret",
    );
    let (_, list) = dash_list(
        &dash(&gw, "GET", "/secrets?page=1&page_size=10", None),
        "secrets",
    );
    assert_eq!(list[0]["value"]["id"], "vault/s1");
    ok(
        &dash(&gw, "GET", "/secrets/vault/s1", None),
        "secret detail",
    );

    // Protos: PUT and POST.
    let proto = "syntax = \"proto3\";\npackage hello;\nmessage Req { string name = 1; }\n";
    ok(
        &dash(&gw, "PUT", "/protos/p1", Some(json!({"content": proto}))),
        "proto",
    );
    ok(
        &dash(&gw, "POST", "/protos", Some(json!({"content": proto}))),
        "POST proto",
    );
    let (total, _) = dash_list(
        &dash(&gw, "GET", "/protos?page=1&page_size=10", None),
        "protos",
    );
    assert_eq!(total, 2);

    // Global rules, plugin configs, SSLs.
    ok(
        &dash(
            &gw,
            "PUT",
            "/global_rules/g1",
            Some(json!({"plugins": {"cors": {}}})),
        ),
        "global rule",
    );
    let (total, _) = dash_list(&dash(&gw, "GET", "/global_rules", None), "global rules");
    assert_eq!(total, 1);
    ok(
        &dash(
            &gw,
            "PUT",
            "/plugin_configs/pc1",
            Some(json!({"plugins": {"cors": {}}})),
        ),
        "plugin config",
    );
    ok(
        &dash(
            &gw,
            "PUT",
            "/ssls/s1",
            Some(
                json!({"snis": ["dash.local"], "cert": cert("server.crt"), "key": cert("server.key")}),
            ),
        ),
        "ssl",
    );
    let (_, list) = dash_list(&dash(&gw, "GET", "/ssls?page=1&page_size=10", None), "ssls");
    assert_eq!(list[0]["value"]["snis"], json!(["dash.local"]));

    // Plugin metadata: PUT, GET, DELETE.
    ok(
        &dash(
            &gw,
            "PUT",
            "/plugin_metadata/http-logger",
            Some(json!({"log_format": {"host": "$host"}})),
        ),
        "metadata",
    );
    let reply = dash(&gw, "GET", "/plugin_metadata/http-logger", None);
    ok(&reply, "metadata detail");
    assert_eq!(reply.json()["value"]["log_format"]["host"], "$host");
    ok(
        &dash(&gw, "DELETE", "/plugin_metadata/http-logger", None),
        "metadata delete",
    );
    assert_eq!(
        dash(&gw, "GET", "/plugin_metadata/http-logger", None).status,
        404
    );

    // The e2e cleanup helpers: `deleteAll*` pages through with `page_size=500` and deletes.
    for (list_path, id_field, prefix) in [
        ("/routes", "id", "/routes/"),
        ("/services", "id", "/services/"),
        ("/upstreams", "id", "/upstreams/"),
        ("/consumers", "username", "/consumers/"),
        ("/consumer_groups", "id", "/consumer_groups/"),
    ] {
        let (_, list) = dash_list(
            &dash(
                &gw,
                "GET",
                &format!("{list_path}?page=1&page_size=500"),
                None,
            ),
            list_path,
        );
        for item in list {
            let id = item["value"][id_field].as_str().unwrap().to_owned();
            let reply = dash(&gw, "DELETE", &format!("{prefix}{id}"), None);
            assert_eq!(reply.status, 200, "{prefix}{id}: {}", reply.text());
        }
        let (total, _) = dash_list(
            &dash(
                &gw,
                "GET",
                &format!("{list_path}?page=1&page_size=10"),
                None,
            ),
            list_path,
        );
        assert_eq!(total, 0, "{list_path}");
    }
}

// ---- Admin API clients from PyPI (installed by scripts/test.sh) ----

/// Runs `script` with python3 and the admin address and key in the environment; panics with
/// its output when it fails.
fn python(gw: &StoreGateway, module: &str, package: &str, script: &str) -> String {
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .env("APISIX_BASE_URL", format!("http://{}", gw.admin_addr()))
        .env("APISIX_ADMIN_KEY", ADMIN_KEY)
        .env("APISIX_READ_ONLY", "false")
        .output()
        .expect("python3 (Debian's python3) runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains(&format!("No module named '{module}'")),
        "the {package} Python package is missing: scripts/test.sh installs it (pip install {package})"
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    stdout
}

/// mcp-apisix (the MCP server for APISIX's Admin API): its client class, which every tool of
/// the server calls, through the format probe, lists with paging, `name` and `filter=`, plugin
/// lists and schemas, schema validation, POST and PATCH (it has no delete).
#[test]
fn mcp_apisix_client_calls() {
    let gw = StoreGatewayBuilder::embedded().start();
    let out = python(
        &gw,
        "mcp_apisix",
        "mcp-apisix",
        r#"
import asyncio
from mcp_apisix.clients.admin import ApisixAdminClient

async def main():
    c = ApisixAdminClient()
    info = await c.get_server_info()
    assert info["detected"] and info["response_format"] == "v3", info
    empty = await c.list_resources("routes")
    assert empty["total"] == 0 and empty["list"] == [], empty
    up = await c.create_resource("upstreams", {"type": "roundrobin", "nodes": {"127.0.0.1:1980": 1}})
    uid = up["id"]
    svc = await c.create_resource("services", {"upstream_id": uid})
    sid = svc["id"]
    r = await c.create_resource("routes", {"uri": "/mcp", "service_id": sid, "name": "mcp"})
    await c.create_resource("routes", {"uri": "/other", "upstream_id": uid})
    page = await c.list_resources("routes", page=1, page_size=10, filters={"filter": "service_id=" + sid}, detail=True)
    assert page["total"] == 1, page
    assert page["list"][0]["value"]["uri"] == "/mcp", page
    got = await c.get_resource("routes", r["id"])
    assert got["value"]["name"] == "mcp", got
    patched = await c.update_resource("routes", r["id"], {"desc": "patched"})
    assert patched["value"]["desc"] == "patched", patched
    names = await c.list_plugins("http")
    assert "key-auth" in names, names
    stream = await c.list_plugins("stream")
    assert "limit-conn" in stream and "key-auth" not in stream, stream
    schema = await c.get_plugin_schema("key-auth")
    assert "properties" in schema, schema
    ok = await c.validate_resource_config("routes", {"uri": "/x", "upstream_id": uid})
    assert ok == {"valid": True}, ok
    bad = await c.validate_resource_config("routes", {"uri": 1})
    assert bad["valid"] is False and bad["error_msg"], bad
    sr = await c.list_resources("stream_routes")
    assert sr["total"] == 0 and "notice" in sr, sr
    off = await c.toggle_route(r["id"], False)
    assert off["value"]["status"] == 0, off
    by_name = await c.list_resources("routes", filters={"name": "mcp"})
    assert by_name["total"] == 1, by_name
    await c.aclose()
    print("mcp-apisix ok")

asyncio.run(main())
"#,
    );
    assert!(out.contains("mcp-apisix ok"), "{out}");
}

/// apisix-python-client 0.1.0 reads lists as APISIX 2.x's `node.nodes` and calls the 2.x
/// `ssl` resource: against APISIX 3's v3 envelopes (and ferrisix's) its lists come back empty
/// and its SSL calls fail with 404; its single-resource calls work.
#[test]
fn apisix_python_client_calls() {
    let script = r#"
import os, sys
from apisix_client import ApisixClient
c = ApisixClient(os.environ["APISIX_BASE_URL"] + "/apisix/admin", os.environ["APISIX_ADMIN_KEY"])
up = c.create_upstream({"type": "roundrobin", "nodes": {"127.0.0.1:1980": 1}})
uid = (up.get("value") or up["node"]["value"])["id"]
r = c.update_route("py1", {"uri": "/py", "upstream_id": uid})
got = c.get_route("py1")
value = got.get("value") or got["node"]["value"]
assert value["uri"] == "/py", got
routes = c.list_routes()
print("routes", len(routes))
try:
    c.list_ssl()
    print("ssl ok")
except ConnectionError as e:
    print("ssl failed", "404" in str(e))
c.delete_route("py1")
c.delete_upstream(uid)
print("python client ok")
"#;
    let v3 = StoreGatewayBuilder::embedded().start();
    let out = python(&v3, "apisix_client", "apisix-python-client", script);
    assert!(out.contains("python client ok"), "{out}");
    assert!(
        out.contains("routes 0"),
        "v3 lists have no node.nodes: {out}"
    );
    assert!(out.contains("ssl failed True"), "{out}");
}

// ---- the Kubernetes manifests' probes (deploy/kubernetes/) ----

/// The probes of `ferrisix-standalone.yaml`: `/status` (liveness) answers at once,
/// `/status/ready` (readiness) only once a configuration was pushed, on the control API.
#[test]
fn kubernetes_probes_in_standalone_mode() {
    let gw = StoreGatewayBuilder::standalone_api().start();
    let control = |path: &str| request(gw.control_addr(), "GET", path, &[], b"");
    assert_eq!(control("/status").status, 200);
    assert_eq!(control("/status/ready").status, 503);
    let body = json!({"routes": [{"id": "1", "uri": "/k8s", "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1980": 1}}}]});
    let reply = request(
        gw.admin_addr(),
        "PUT",
        "/apisix/admin/configs",
        &[
            ("X-API-KEY", ADMIN_KEY),
            ("Content-Type", "application/json"),
            ("X-Digest", "k8s-probe-1"),
        ],
        body.to_string().as_bytes(),
    );
    assert_eq!(reply.status, 202, "{}", reply.text());
    let ready = poll_until(Duration::from_secs(10), || {
        control("/status/ready").status == 200
    });
    assert!(ready.is_some(), "{}", control("/status/ready").text());
    assert_eq!(control("/status").status, 200);
}
