//! End-to-end: a real Prometheus (Debian's `prometheus` package) scrapes ferrisix's exporter,
//! and every query of APISIX's Grafana dashboard about HTTP status, latency, bandwidth and
//! requests returns data after some traffic (spec data-plane §7).
//!
//! The queries are vendored in `tests/data/grafana-queries.txt` (source file and APISIX commit
//! in its header). `scripts/test.sh` installs `prometheus`; without it the test fails, naming
//! the package.
use crate::support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use support::debian::require;
use support::*;

const QUERIES: &str = include_str!("../data/grafana-queries.txt");

/// One dashboard query: where it comes from and its expression as written in the dashboard.
struct Query {
    panel: String,
    expr: String,
}

/// The vendored queries: each expression line, with the `# panel:` comment above it.
fn dashboard_queries() -> Vec<Query> {
    let mut panel = String::new();
    let mut out = Vec::new();
    for line in QUERIES.lines() {
        let line = line.trim();
        if let Some(p) = line.strip_prefix("# panel:") {
            panel = p.trim().to_owned();
        } else if !line.is_empty() && !line.starts_with('#') {
            out.push(Query {
                panel: panel.clone(),
                expr: line.to_owned(),
            });
        }
    }
    out
}

/// The expression Grafana sends to Prometheus for `expr` when every template variable is set
/// to "All".
///
/// - The dashboard's variables (`instance`, `service`, `route`, `consumer`, `node`) all have
///   `includeAll: true` with `allValue: ".*"`; Grafana puts a custom all-value in verbatim, so
///   `route=~"$route"` becomes `route=~".*"` (which also matches the empty label of unmatched
///   requests and of routes outside a service).
/// - `$__rate_interval` is `max($__interval + scrape interval, 4 × scrape interval)`; with
///   Grafana's default 15 s datasource scrape interval that is at least `1m`, the value used
///   here. The test's own scrapes are every second, so a minute holds dozens of samples.
/// - `$__interval` (the graph's step) and `$__range` (the dashboard's time range) are not in
///   the current dashboard; they are given fixed values (`15s`, `5m`) should a newer copy of
///   the queries use them.
///
/// Both `$name` and `${name}` forms are handled; longer names go first so that `$__range`
/// does not eat `$__range_s` and `$__interval` does not eat `$__interval_ms`.
fn grafana_substitute(expr: &str) -> String {
    const VARS: [(&str, &str); 12] = [
        ("__rate_interval", "1m"),
        ("__interval_ms", "15000"),
        ("__interval", "15s"),
        ("__range_ms", "300000"),
        ("__range_s", "300"),
        ("__range", "5m"),
        ("instance", ".*"),
        ("service", ".*"),
        ("route", ".*"),
        ("consumer", ".*"),
        ("node", ".*"),
        ("job", ".*"),
    ];
    let mut s = expr.to_owned();
    for (name, value) in VARS {
        s = s.replace(&format!("${{{name}}}"), value);
        s = s.replace(&format!("${name}"), value);
    }
    s
}

/// The Prometheus server binary (Debian's `prometheus`, which `scripts/test.sh` installs);
/// panics, naming the package, when it is missing.
fn prometheus_binary() -> PathBuf {
    require("prometheus")
}

/// A Prometheus server on a random port with its own config and storage; killed on drop.
struct PromServer {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl PromServer {
    fn start(bin: &Path, metrics_port: u16, export_uri: &str) -> PromServer {
        let mut failures = Vec::new();
        // A free port can be taken before Prometheus binds it: try again on a fresh one.
        for _ in 0..3 {
            match Self::spawn(bin, metrics_port, export_uri) {
                Ok(p) => return p,
                Err(e) => failures.push(e),
            }
        }
        panic!("prometheus did not start: {failures:#?}");
    }

    fn spawn(bin: &Path, metrics_port: u16, export_uri: &str) -> Result<PromServer, String> {
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: ferrisix\n    metrics_path: {export_uri}\n    \
             static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n"
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let port = free_port();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", bin.display()))?;
        let mut p = PromServer {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = p.child.try_wait() {
                return Err(format!("exited ({status}):\n{}", p.log()));
            }
            if std::net::TcpStream::connect(p.addr).is_ok() && get(p.addr, "/-/ready").status == 200
            {
                return Ok(p);
            }
            if Instant::now() > deadline {
                return Err(format!("not ready after 60 s:\n{}", p.log()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `/api/v1/query` for `expr`, at `time` (Unix seconds) if given.
    fn query(&self, expr: &str, time: Option<f64>) -> Value {
        let mut path = format!("/api/v1/query?query={}", url_encode(expr));
        if let Some(t) = time {
            path.push_str(&format!("&time={t:.3}"));
        }
        let r = get(self.addr, &path);
        serde_json::from_slice(&r.body).unwrap_or_else(|e| {
            panic!(
                "prometheus answered {} with non-JSON ({e}): {}",
                r.status,
                r.text()
            )
        })
    }

    /// The single value of an instant query's first result, if any.
    fn scalar(&self, expr: &str) -> Option<f64> {
        let v = self.query(expr, None);
        v["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|s| s.parse().ok())
    }
}

impl Drop for PromServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Percent-encoding for a URL query value: everything but RFC 3986's unreserved characters.
fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Why a query's answer counts as "no data", if it does. A result whose every value is NaN
/// (e.g. `histogram_quantile` over buckets that did not move) draws nothing either.
fn no_data(answer: &Value) -> Option<String> {
    if answer["status"] != "success" {
        return Some(format!("query failed: {answer}"));
    }
    let result = answer["data"]["result"].as_array();
    let Some(result) = result.filter(|r| !r.is_empty()) else {
        return Some("empty result".into());
    };
    let values: Vec<&str> = result
        .iter()
        .filter_map(|s| s["value"][1].as_str())
        .collect();
    if values
        .iter()
        .all(|v| v.parse::<f64>().map_or(true, f64::is_nan))
    {
        return Some(format!("only NaN values: {result:?}"));
    }
    None
}

#[test]
fn grafana_dashboard_queries_return_data() {
    let queries = dashboard_queries();
    assert_eq!(
        queries.len(),
        22,
        "tests/data/grafana-queries.txt should hold the dashboard's 22 checked queries"
    );
    let prometheus = prometheus_binary();

    let up = Upstream::start("u", Behaviour::Echo);
    let gw = Gateway::start(
        &json!({
            "routes": [
                // Counted by its own prometheus; limit-count turns part of the traffic into 503s.
                {"id": "api", "uri": "/api", "plugins": {
                    "prometheus": {},
                    "limit-count": {"count": 3, "time_window": 1, "rejected_code": 503}
                }, "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}},
                // A route in a service, so the per-service panels see a service label.
                {"id": "in-svc", "uri": "/svc", "service_id": "svc"},
            ],
            "services": [{"id": "svc", "plugins": {"prometheus": {}},
                "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}],
            // Sees the unmatched requests (404).
            "global_rules": [{"id": "g", "plugins": {"prometheus": {}}}]
        })
        .to_string(),
    );
    let export_uri = "/apisix/prometheus/metrics";
    let prom = PromServer::start(&prometheus, gw.metrics_port, export_uri);

    // The target is up once Prometheus has scraped it.
    let up_once = poll_until(Duration::from_secs(60), || {
        prom.scalar("up{job=\"ferrisix\"}") == Some(1.0)
    });
    assert!(
        up_once.is_some(),
        "prometheus never scraped ferrisix successfully; targets: {}\nlog:\n{}",
        get(prom.addr, "/api/v1/targets").text(),
        prom.log()
    );

    // Traffic spread over several scrapes, so that counters and buckets grow between samples
    // and rates are not zero.
    let mut sent = 0u64;
    let mut codes = std::collections::BTreeMap::<u16, u64>::new();
    let traffic_start = Instant::now();
    while traffic_start.elapsed() < Duration::from_secs(6) {
        for path in ["/api", "/api", "/svc", "/nowhere"] {
            let r = get(gw.addr(), path);
            *codes.entry(r.status).or_default() += 1;
            sent += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("sent {sent} requests, status codes {codes:?}");
    for code in [200, 404, 503] {
        assert!(codes.contains_key(&code), "no {code} in {codes:?}");
    }

    // Wait until the scrapes have seen every request, plus two more scrapes.
    let seen = poll_until(Duration::from_secs(60), || {
        prom.scalar("sum(apisix_http_status{job=\"ferrisix\"})")
            .is_some_and(|n| n >= sent as f64)
    });
    assert!(
        seen.is_some(),
        "prometheus never saw the {sent} requests: sum(apisix_http_status) = {:?}\nlog:\n{}",
        prom.scalar("sum(apisix_http_status{job=\"ferrisix\"})"),
        prom.log()
    );
    std::thread::sleep(Duration::from_secs(2));
    // Every query is evaluated at this instant, so a slow machine does not slide the one-minute
    // windows past the traffic.
    let at = now_unix();

    let mut failures = Vec::new();
    for q in &queries {
        let expr = grafana_substitute(&q.expr);
        if expr.contains('$') {
            failures.push(format!("{}: unsubstituted variable in {expr}", q.panel));
            continue;
        }
        let answer = prom.query(&expr, Some(at));
        match no_data(&answer) {
            Some(why) => failures.push(format!("{}\n    {expr}\n    {why}", q.panel)),
            None => eprintln!(
                "ok  {}: {}",
                q.panel,
                answer["data"]["result"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| format!("{}={}", s["metric"], s["value"][1]))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        }
    }
    if !failures.is_empty() {
        panic!(
            "{} of {} Grafana dashboard queries returned no data:\n{}\n\nprometheus log:\n{}",
            failures.len(),
            queries.len(),
            failures.join("\n"),
            prom.log()
        );
    }
    drop(prom);
}
