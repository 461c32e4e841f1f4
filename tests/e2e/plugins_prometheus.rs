//! End-to-end prometheus (spec data-plane §7): the export server, the HTTP metric families with
//! APISIX 3.18's labels, node metrics, global rules seeing unmatched requests, `prefer_route`,
//! `prefer_name`, `metric_prefix`, and series of deleted routes going away.
use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

fn route(id: &str, uri: &str, up: &Upstream, plugins: Value) -> Value {
    json!({"id": id, "uri": uri, "plugins": plugins,
        "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}})
}

fn metrics_addr(gw: &Gateway) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], gw.metrics_port))
}

fn metrics(gw: &Gateway) -> String {
    let r = get(metrics_addr(gw), "/apisix/prometheus/metrics");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Content-Type"), Some("text/plain"));
    r.text()
}

/// The value of the first sample line starting with `prefix`.
fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `apisix_batch_process_entries`: a logger's batch processor reports the entries its buffer
/// holds, labelled with the first request's route and server address.
#[test]
fn loggers_report_their_batch_backlog() {
    let up = Upstream::start("u", Behaviour::Echo);
    // A log server that is never reached: the batch waits (30 s without an entry).
    let logger = json!({"uri": "http://127.0.0.1:9/log", "batch_max_size": 10,
        "inactive_timeout": 30, "name": "backlog"});
    let gw = Gateway::start(
        &json!({"routes": [route("471", "/q", &up, json!({"prometheus": {}, "http-logger": logger}))]})
            .to_string(),
    );
    for _ in 0..3 {
        assert_eq!(get(gw.addr(), "/q").status, 200);
    }
    let line = "apisix_batch_process_entries{name=\"backlog\",route_id=\"471\",server_addr=\"127.0.0.1\"} ";
    let mut text = String::new();
    let seen = poll_until(Duration::from_secs(5), || {
        text = metrics(&gw);
        sample(&text, line) == Some(3.0)
    });
    assert!(seen.is_some(), "{text}");
    assert!(text.contains("# TYPE apisix_batch_process_entries gauge\n"));
}

#[test]
fn http_metrics_with_apisix_labels() {
    let up = Upstream::start("u", Behaviour::Echo);
    let gw = Gateway::start(
        &json!({"routes": [route("470", "/p", &up, json!({"prometheus": {}}))]}).to_string(),
    );
    for _ in 0..2 {
        assert_eq!(get(gw.addr(), "/p").status, 200);
    }
    let text = metrics(&gw);
    assert!(text.contains("# HELP apisix_http_status HTTP status codes per service in APISIX\n"));
    assert!(text.contains("# TYPE apisix_http_status counter\n"));
    assert!(text.contains("# TYPE apisix_http_latency histogram\n"));
    assert!(text.contains("# TYPE apisix_bandwidth counter\n"));
    let status = "apisix_http_status{code=\"200\",route=\"470\",matched_uri=\"/p\",matched_host=\"\",service=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\",response_source=\"upstream\"} ";
    assert_eq!(sample(&text, status), Some(2.0), "{text}");
    let labels = "route=\"470\",service=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\"";
    for kind in ["request", "upstream", "apisix"] {
        for le in ["1", "60000", "+Inf"] {
            let line =
                format!("apisix_http_latency_bucket{{type=\"{kind}\",{labels},le=\"{le}\"}} ");
            assert!(sample(&text, &line).is_some(), "{line} in {text}");
        }
        let count = format!("apisix_http_latency_count{{type=\"{kind}\",{labels}}} ");
        assert_eq!(sample(&text, &count), Some(2.0));
        assert!(sample(
            &text,
            &format!("apisix_http_latency_sum{{type=\"{kind}\",{labels}}} ")
        )
        .is_some());
    }
    let ingress = sample(
        &text,
        &format!("apisix_bandwidth{{type=\"ingress\",{labels}}} "),
    )
    .unwrap();
    let egress = sample(
        &text,
        &format!("apisix_bandwidth{{type=\"egress\",{labels}}} "),
    )
    .unwrap();
    assert!(ingress > 100.0 && egress > 200.0, "{ingress} {egress}");

    // Node metrics.
    assert!(text.contains("apisix_node_info{hostname=\""));
    assert!(text.contains("apisix_nginx_http_current_connections{state=\"active\"} "));
    assert!(text.contains("apisix_nginx_http_current_connections{state=\"accepted\"} "));
    assert!(sample(&text, "apisix_http_requests_total ").unwrap() >= 2.0);
    assert!(text.lines().any(|l| l == "apisix_etcd_reachable 1"));
    assert!(text
        .lines()
        .any(|l| l == "apisix_nginx_metric_errors_total 0"));

    // Sorted as APISIX sorts: by the sample key.
    let keys: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.rsplit_once(' ').unwrap().0)
        .collect();
    let buckets_in_order = text
        .lines()
        .filter(|l| l.starts_with("apisix_http_latency_bucket{type=\"request\""))
        .map(|l| {
            l.split("le=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
                .to_string()
        })
        .collect::<Vec<_>>();
    assert_eq!(buckets_in_order.first().map(String::as_str), Some("1"));
    assert_eq!(buckets_in_order.last().map(String::as_str), Some("+Inf"));
    assert!(
        keys.iter().position(|k| k.starts_with("apisix_bandwidth"))
            < keys
                .iter()
                .position(|k| k.starts_with("apisix_http_status"))
    );

    // Only GET on the export uri.
    assert_eq!(get(metrics_addr(&gw), "/other").status, 404);
    assert_eq!(
        request(
            metrics_addr(&gw),
            "POST",
            "/apisix/prometheus/metrics",
            &[],
            b""
        )
        .status,
        404
    );
}

#[test]
fn global_rule_sees_unmatched_and_rejected_requests_and_prefers_the_route() {
    let up = Upstream::start("u", Behaviour::Echo);
    let gw = Gateway::start(
        &json!({
            "routes": [
                route("lim", "/lim", &up, json!({"limit-count": {"count": 1, "time_window": 60, "rejected_code": 429}})),
                route("own", "/own", &up, json!({"prometheus": {"prefer_name": true}})),
            ],
            "global_rules": [{"id": "g", "plugins": {"prometheus": {}}}]
        })
        .to_string(),
    );
    assert_eq!(get(gw.addr(), "/nowhere").status, 404);
    assert_eq!(get(gw.addr(), "/lim").status, 200);
    assert_eq!(get(gw.addr(), "/lim").status, 429);
    assert_eq!(get(gw.addr(), "/own").status, 200);
    let text = metrics(&gw);
    let unmatched = "apisix_http_status{code=\"404\",route=\"\",matched_uri=\"\",matched_host=\"\",service=\"\",consumer=\"\",node=\"\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\",response_source=\"apisix\"} ";
    assert_eq!(sample(&text, unmatched), Some(1.0), "{text}");
    let rejected = "apisix_http_status{code=\"429\",route=\"lim\",matched_uri=\"/lim\",matched_host=\"\",service=\"\",consumer=\"\",node=\"\",";
    assert_eq!(sample(&text, rejected), Some(1.0), "{text}");
    let proxied = "apisix_http_status{code=\"200\",route=\"lim\",matched_uri=\"/lim\",matched_host=\"\",service=\"\",consumer=\"\",node=\"127.0.0.1\",";
    assert_eq!(sample(&text, proxied), Some(1.0));
    // The route's own prometheus replaces the global one (counted once, with prefer_name,
    // which falls back to the id).
    let own: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("apisix_http_status{code=\"200\",route=\"own\""))
        .collect();
    assert_eq!(own.len(), 1, "{text}");
    assert!(own[0].ends_with(" 1"));
}

#[test]
fn deleted_routes_lose_their_series() {
    let up = Upstream::start("u", Behaviour::Echo);
    let gw = Gateway::start(
        &json!({"routes": [
            route("a", "/a", &up, json!({"prometheus": {}})),
            route("b", "/b", &up, json!({"prometheus": {}})),
        ]})
        .to_string(),
    );
    assert_eq!(get(gw.addr(), "/a").status, 200);
    assert_eq!(get(gw.addr(), "/b").status, 200);
    let text = metrics(&gw);
    assert!(text.contains("route=\"a\"") && text.contains("route=\"b\""));

    // An unrelated edit keeps the counts.
    gw.rewrite_routes(
        &json!({"routes": [
            route("a", "/a", &up, json!({"prometheus": {}})),
            route("b", "/b", &up, json!({"prometheus": {}})),
            route("c", "/c", &up, json!({})),
        ]})
        .to_string(),
    );
    poll_until(Duration::from_secs(10), || {
        get(gw.addr(), "/c").status == 200
    })
    .expect("reload");
    assert_eq!(get(gw.addr(), "/a").status, 200);
    let a200 = "apisix_http_status{code=\"200\",route=\"a\",";
    assert_eq!(sample(&metrics(&gw), a200), Some(2.0));

    gw.rewrite_routes(
        &json!({"routes": [route("a", "/a", &up, json!({"prometheus": {}}))]}).to_string(),
    );
    poll_until(Duration::from_secs(10), || {
        get(gw.addr(), "/b").status == 404
    })
    .expect("reload");
    let gone = poll_until(Duration::from_secs(5), || {
        !metrics(&gw).contains("route=\"b\"")
    });
    assert!(gone.is_some(), "{}", metrics(&gw));
    assert!(metrics(&gw).contains("route=\"a\""));
}

#[test]
fn metric_prefix_and_export_settings() {
    let up = Upstream::start("u", Behaviour::Echo);
    let port = free_port();
    let extra = format!(
        "plugin_attr:\n  prometheus:\n    metric_prefix: ferrisix_\n    export_uri: /m\n    export_addr:\n      ip: 127.0.0.1\n      port: {port}\n"
    );
    let gw = Gateway::start_with(
        &json!({"routes": [route("1", "/p", &up, json!({"prometheus": {}}))]}).to_string(),
        &extra,
    );
    assert_eq!(get(gw.addr(), "/p").status, 200);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let r = get(addr, "/m");
    assert_eq!(r.status, 200);
    let text = r.text();
    assert!(
        text.contains("# TYPE ferrisix_http_status counter\n"),
        "{text}"
    );
    assert!(text.contains("ferrisix_http_status{code=\"200\",route=\"1\""));
    assert!(!text.contains("apisix_http_status"));
    assert_eq!(get(addr, "/apisix/prometheus/metrics").status, 404);
}

#[test]
fn public_api_serves_the_metrics_without_an_export_server() {
    let up = Upstream::start("u", Behaviour::Echo);
    let port = free_port();
    let extra = format!(
        "plugin_attr:\n  prometheus:\n    enable_export_server: false\n    export_addr:\n      ip: 127.0.0.1\n      port: {port}\n"
    );
    let routes = json!({"routes": [
        route("p", "/p", &up, json!({"prometheus": {}})),
        {"id": "m", "uri": "/apisix/prometheus/metrics", "plugins": {"public-api": {}}},
        {"id": "alias", "uri": "/my-metrics", "plugins": {"public-api": {"uri": "/apisix/prometheus/metrics"}}},
        {"id": "none", "uri": "/nothing/*", "plugins": {"public-api": {}}},
    ]});
    let gw = Gateway::start_with(&routes.to_string(), &extra);
    assert_eq!(get(gw.addr(), "/p").status, 200);
    for path in ["/apisix/prometheus/metrics", "/my-metrics"] {
        let r = get(gw.addr(), path);
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("Content-Type"), Some("text/plain"));
        let text = r.text();
        assert!(
            text.contains("apisix_http_status{code=\"200\",route=\"p\""),
            "{text}"
        );
    }
    // Only GET is an API; other paths under a public-api route have none.
    let post = request(gw.addr(), "POST", "/apisix/prometheus/metrics", &[], b"");
    assert_eq!(post.status, 404);
    assert_eq!(get(gw.addr(), "/nothing/here").status, 404);
    // No export server was started.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[test]
fn without_public_api_the_export_uri_is_not_served() {
    // With the export server on, the API is not listed (APISIX's get_api), so a public-api
    // route at the export URI answers 404 instead of exposing the metrics on the data port.
    let routes = json!({"routes": [
        {"id": "m", "uri": "/apisix/prometheus/metrics", "plugins": {"public-api": {}}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    assert_eq!(get(gw.addr(), "/apisix/prometheus/metrics").status, 404);
    assert!(metrics(&gw).contains("apisix_node_info{"));
}

/// config.yaml's `plugin_attr` with an export server on a free port, plus `metrics_yaml`
/// (indented under `prometheus:`).
fn with_metrics(metrics_yaml: &str) -> (String, SocketAddr) {
    let port = free_port();
    let metrics: String = metrics_yaml
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| format!("    {l}\n"))
        .collect();
    (
        format!(
            "plugin_attr:\n  prometheus:\n    export_addr:\n      ip: 127.0.0.1\n      port: {port}\n{metrics}"
        ),
        SocketAddr::from(([127, 0, 0, 1], port)),
    )
}

fn scrape(addr: SocketAddr) -> String {
    let r = get(addr, "/apisix/prometheus/metrics");
    assert_eq!(r.status, 200);
    r.text()
}

#[test]
fn extra_labels_take_nginx_variables_after_the_built_in_labels() {
    let up = Upstream::start("u", Behaviour::Echo);
    let (dead_a, dead_b) = (dead_node(), dead_node());
    let (config, export) = with_metrics(
        "metrics:
  http_status:
    extra_labels:
      - upstream_addr: $upstream_addr
      - upstream_status: $upstream_status
  http_latency:
    extra_labels:
      - host: $host
",
    );
    let routes = json!({"routes": [
        route("xl", "/xl", &up, json!({"prometheus": {}})),
        {"id": "down", "uri": "/down", "plugins": {"prometheus": {}},
            "upstream": {"type": "roundrobin", "nodes": {dead_a.clone(): 1, dead_b.clone(): 1}}},
        route("lim", "/lim", &up, json!({"prometheus": {},
            "limit-count": {"count": 1, "time_window": 60, "rejected_code": 429}})),
    ]});
    let gw = Gateway::start_with(&routes.to_string(), &config);
    for _ in 0..2 {
        assert_eq!(get_host(gw.addr(), "/xl", "Example.com:9080").status, 200);
    }
    assert_eq!(get(gw.addr(), "/down").status, 502);
    assert_eq!(get(gw.addr(), "/lim").status, 200);
    assert_eq!(get(gw.addr(), "/lim").status, 429);
    let text = scrape(export);

    let builtin = |code: &str, route: &str, node: &str, source: &str| {
        format!(
            "apisix_http_status{{code=\"{code}\",route=\"{route}\",matched_uri=\"/{route}\",matched_host=\"\",service=\"\",consumer=\"\",node=\"{node}\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\",response_source=\"{source}\""
        )
    };
    let ok = format!(
        "{},upstream_addr=\"{}\",upstream_status=\"200\"}} ",
        builtin("200", "xl", "127.0.0.1", "upstream"),
        up.node()
    );
    assert_eq!(sample(&text, &ok), Some(2.0), "{ok} in {text}");
    // Both nodes were tried: nginx lists every try.
    let down = text
        .lines()
        .find(|l| l.starts_with(&builtin("502", "down", "127.0.0.1", "nginx")))
        .unwrap_or_else(|| panic!("no 502 line in {text}"));
    assert!(down.ends_with(",upstream_status=\"502, 502\"} 1"), "{down}");
    assert!(
        [(&dead_a, &dead_b), (&dead_b, &dead_a)]
            .iter()
            .any(|(a, b)| down.contains(&format!(",upstream_addr=\"{a}, {b}\","))),
        "both dead nodes in upstream_addr: {down}"
    );
    // A request the gateway answered itself has no upstream variables: "".
    let rejected = format!(
        "{},upstream_addr=\"\",upstream_status=\"\"}} ",
        builtin("429", "lim", "", "apisix")
    );
    assert_eq!(sample(&text, &rejected), Some(1.0), "{rejected} in {text}");
    let proxied = format!(
        "{},upstream_addr=\"{}\",upstream_status=\"200\"}} ",
        builtin("200", "lim", "127.0.0.1", "upstream"),
        up.node()
    );
    assert_eq!(sample(&text, &proxied), Some(1.0));
    // http_latency has its own extra label, before `le`; bandwidth has none.
    let labels = "route=\"xl\",service=\"\",consumer=\"\",node=\"127.0.0.1\",request_type=\"traditional_http\",request_llm_model=\"\",llm_model=\"\"";
    let count =
        format!("apisix_http_latency_count{{type=\"request\",{labels},host=\"example.com\"}} ");
    assert_eq!(sample(&text, &count), Some(2.0), "{count} in {text}");
    let inf = format!(
        "apisix_http_latency_bucket{{type=\"request\",{labels},host=\"example.com\",le=\"+Inf\"}} "
    );
    assert_eq!(sample(&text, &inf), Some(2.0));
    let egress = format!("apisix_bandwidth{{type=\"egress\",{labels}}} ");
    assert!(sample(&text, &egress).is_some(), "{egress} in {text}");
}

#[test]
fn series_expire_when_not_updated() {
    let up = Upstream::start("u", Behaviour::Echo);
    let (config, export) = with_metrics(
        "metrics:
  http_status:
    expire: 1
",
    );
    let gw = Gateway::start_with(
        &json!({"routes": [route("exp", "/exp", &up, json!({"prometheus": {}}))]}).to_string(),
        &config,
    );
    let status = "apisix_http_status{code=\"200\",route=\"exp\",";
    // Each try updates the series, so it is seen unless scrapes keep lagging a second behind.
    let mut sent = 0;
    let seen = poll_until(Duration::from_secs(15), || {
        for _ in 0..5 {
            assert_eq!(get(gw.addr(), "/exp").status, 200);
            sent += 1;
        }
        sample(&scrape(export), status).is_some()
    });
    assert!(seen.is_some(), "{}", scrape(export));
    let gone = poll_until(Duration::from_secs(15), || {
        sample(&scrape(export), status).is_none()
    });
    assert!(gone.is_some(), "{}", scrape(export));
    // Metrics without `expire` keep their series.
    let text = scrape(export);
    let egress = "apisix_bandwidth{type=\"egress\",route=\"exp\",";
    assert_eq!(sample(&text, egress).map(|b| b > 0.0), Some(true), "{text}");
    // Updated again: back, counted from 0 (not from the `sent` before).
    let mut again = 0;
    let mut back = None;
    poll_until(Duration::from_secs(15), || {
        assert_eq!(get(gw.addr(), "/exp").status, 200);
        again += 1;
        back = sample(&scrape(export), status);
        back.is_some()
    })
    .expect("the series comes back");
    let back = back.unwrap();
    assert!(
        back >= 1.0 && back <= f64::from(again),
        "{back} after {again} (before: {sent})"
    );
    assert!(sent >= 5 && again < sent, "{again} {sent}");
}
