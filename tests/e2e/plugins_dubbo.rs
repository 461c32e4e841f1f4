//! http-dubbo and dubbo-proxy against a Dubbo 2 provider that decodes what the gateway sends
//! on its own (`tests/e2e/dubbo_provider.py`: the frame header by Dubbo's layout, Hessian 2
//! with python-hessian from PyPI, fastjson as its lines) and answers with what it decoded, so
//! each test checks the service, version, method, parameter types, arguments and attachments
//! the gateway put on the wire, and how the gateway turns the answer (or a failure) into HTTP.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

use crate::support::{dead_node, request, Gateway, Launch, Reply};

const PROVIDER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/dubbo_provider.py");

/// The provider process, killed when the test ends.
struct Provider {
    child: Child,
    port: u16,
}

impl Provider {
    fn start() -> Provider {
        let mut child = Command::new("python3")
            .arg(PROVIDER)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("the provider needs python-hessian (scripts/test.sh installs it): {line:?}")
        });
        Provider { child, port }
    }

    fn node(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn route(uri: &str, plugin: &str, conf: Value, node: &str, timeout: &str) -> String {
    format!(
        "  - uri: {uri}\n    plugins:\n      {plugin}: {conf}\n    upstream:\n      type: roundrobin\n{timeout}      nodes:\n        \"{node}\": 1\n"
    )
}

fn routes(list: &[String]) -> String {
    format!("routes:\n{}", list.concat())
}

fn post(gw: &Gateway, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    request(gw.addr(), "POST", path, headers, body)
}

/// The request lines the provider got.
fn lines(r: &Reply) -> Vec<String> {
    serde_json::from_value(r.json()["lines"].clone()).unwrap()
}

// ---- http-dubbo ----------------------------------------------------------------------------

fn http_dubbo(uri: &str, method: &str, extra: Value, node: &str) -> String {
    let mut conf = json!({
        "service_name": "org.apache.dubbo.backend.DubboSerializationTestService",
        "service_version": "1.0.1",
        "method": method,
        "params_type_desc": "Ljava/lang/String;I",
    });
    for (k, v) in extra.as_object().unwrap() {
        conf[k] = v.clone();
    }
    route(uri, "http-dubbo", conf, node, "")
}

#[test]
fn http_dubbo_sends_json_parameters_as_fastjson_lines() {
    let p = Provider::start();
    let gw = Gateway::start(&routes(&[http_dubbo(
        "/echo",
        "echo",
        json!({}),
        &p.node(),
    )]));
    let r = post(
        &gw,
        "/echo",
        &[("Content-Type", "application/json")],
        r#"["a \"quoted\"\nline/é", 2, 1.5, true, null, {"k": [1, 2]}]"#.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let got = r.json();
    // Request, two-way, fastjson (6); APISIX's fixed request id.
    assert_eq!(got["flag"], 0xc6);
    assert_eq!(got["id"], 1);
    assert_eq!(
        got["lines"],
        json!([
            "\"2.0.2\"",
            "\"org.apache.dubbo.backend.DubboSerializationTestService\"",
            "\"1.0.1\"",
            "\"echo\"",
            "\"Ljava/lang/String;I\"",
            "\"a \\\"quoted\\\"\\nline/é\"",
            "2",
            "1.5",
            "true",
            "null",
            "{\"k\":[1,2]}",
            "{}",
            ""
        ])
    );
    // The provider decodes each parameter line as JSON.
    let first: String = serde_json::from_str(got["lines"][5].as_str().unwrap()).unwrap();
    assert_eq!(first, "a \"quoted\"\nline/é");
}

#[test]
fn http_dubbo_passes_a_serialized_body_and_defaults() {
    let p = Provider::start();
    let conf = json!({"service_name": "svc.Plain", "method": "echo"});
    let by_header = json!({"service_name": "svc.Plain", "method": "echo",
                           "serialization_header_key": "X-Serialized"});
    let serialized = json!({"service_name": "svc.Plain", "method": "echo", "serialized": true});
    let gw = Gateway::start(&routes(&[
        route("/plain", "http-dubbo", conf, &p.node(), ""),
        route("/header", "http-dubbo", by_header, &p.node(), ""),
        route("/serialized", "http-dubbo", serialized, &p.node(), ""),
    ]));
    // No body: no parameter lines; the version and types take their defaults.
    let r = post(&gw, "/plain", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["lines"],
        json!([
            "\"2.0.2\"",
            "\"svc.Plain\"",
            "\"0.0.0\"",
            "\"echo\"",
            "\"\"",
            "{}",
            ""
        ])
    );
    // A serialized body goes as it is, a newline added when it has none.
    let r = post(&gw, "/serialized", &[], b"\"x\"\n{\"a\":1}");
    assert_eq!(lines(&r)[5..8], ["\"x\"", "{\"a\":1}", "{}"]);
    let r = post(&gw, "/header", &[("X-Serialized", "true")], b"[1,2]");
    assert_eq!(r.json()["lines"][5], "[1,2]");
    // The header other than `true`: the body is JSON parameters again.
    let r = post(&gw, "/header", &[("X-Serialized", "yes")], b"[1,2]");
    assert_eq!(lines(&r)[5..7], ["1", "2"]);
}

#[test]
fn http_dubbo_answers() {
    let p = Provider::start();
    let node = p.node();
    let gw = Gateway::start(&routes(&[
        http_dubbo("/attach", "withAttachments", json!({}), &node),
        http_dubbo("/nothing", "nothing", json!({}), &node),
        http_dubbo("/boom", "boom", json!({}), &node),
        http_dubbo("/notfound", "notFound", json!({}), &node),
        http_dubbo("/garbage", "garbage", json!({}), &node),
        http_dubbo("/drop", "drop", json!({}), &node),
        http_dubbo("/slow", "slow", json!({"read_timeout": 100}), &node),
        http_dubbo("/small", "echo", json!({"max_req_body_size": 4}), &node),
        http_dubbo(
            "/dead",
            "echo",
            json!({"connect_timeout": 500}),
            &dead_node(),
        ),
    ]));
    // A value with attachments: its line is the body.
    let r = post(&gw, "/attach", &[], b"[]");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["lines"][3], "\"withAttachments\"");
    // A null value: 200 with no body.
    let r = post(&gw, "/nothing", &[], b"");
    assert_eq!((r.status, r.body.len()), (200, 0));
    // An exception, a status other than OK, a frame that is not Dubbo's, a closed connection,
    // a read timeout and a body that is not JSON: APISIX's 500.
    for path in ["/boom", "/notfound", "/garbage", "/drop", "/slow"] {
        assert_eq!(post(&gw, path, &[], b"").status, 500, "{path}");
    }
    assert_eq!(post(&gw, "/attach", &[], b"not json").status, 500);
    assert_eq!(post(&gw, "/attach", &[], b"\"scalar\"").status, 500);
    // A body past max_req_body_size: 413; no connection to the node: 502.
    assert_eq!(post(&gw, "/small", &[], b"[1,2,3]").status, 413);
    assert_eq!(post(&gw, "/small", &[], b"[1]").status, 200);
    assert_eq!(post(&gw, "/dead", &[], b"[1]").status, 502);
}

#[test]
fn http_dubbo_schema() {
    let gw = Launch::new(&routes(&[
        route(
            "/bad",
            "http-dubbo",
            json!({"service_name": "s"}),
            "127.0.0.1:1",
            "",
        ),
        route(
            "/bad-version",
            "http-dubbo",
            json!({"service_name": "s", "method": "m", "service_version": "x"}),
            "127.0.0.1:1",
            "",
        ),
    ]))
    .stderr_to_file()
    .start();
    // Routes with invalid plugin confs are not loaded.
    assert_eq!(post(&gw, "/bad", &[], b"").status, 404);
    assert_eq!(post(&gw, "/bad-version", &[], b"").status, 404);
    let log = gw.error_output();
    assert!(log.contains("property \"method\" is required"), "{log}");
    assert!(
        log.contains("property \"service_version\" validation failed"),
        "{log}"
    );
}

// ---- dubbo-proxy ---------------------------------------------------------------------------

fn dubbo_proxy(
    uri: &str,
    method: Option<&str>,
    version: &str,
    node: &str,
    timeout: &str,
) -> String {
    let mut conf = json!({
        "service_name": "org.apache.dubbo.backend.DemoService",
        "service_version": version,
    });
    if let Some(m) = method {
        conf["method"] = json!(m);
    }
    route(uri, "dubbo-proxy", conf, node, timeout)
}

#[test]
fn dubbo_proxy_calls_with_headers_and_body_as_a_map() {
    let p = Provider::start();
    let gw = Gateway::start(&routes(&[
        dubbo_proxy("/hello", Some("hello"), "1.0.0", &p.node(), ""),
        dubbo_proxy("/bytes", Some("bytes"), "1.0.0", &p.node(), ""),
    ]));
    let r = post(
        &gw,
        "/hello",
        &[("Extra-Arg-K", "V"), ("X-Multi", "a"), ("X-Multi", "b")],
        b"payload \x00\xff",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // Entries of the answer map other than status and body are headers.
    assert_eq!(r.header("got-extra-arg-k"), Some("V"));
    assert_eq!(r.header("x-dubbo"), Some("yes"));
    let got: Value = r.json();
    // Request, two-way, Hessian 2 (2).
    assert_eq!(got["flag"], 0xc2);
    assert_eq!(got["dubbo"], "2.0.2");
    assert_eq!(got["service"], "org.apache.dubbo.backend.DemoService");
    assert_eq!(got["version"], "1.0.0");
    assert_eq!(got["method"], "hello");
    assert_eq!(got["types"], "Ljava/util/Map;");
    let args = got["args"].as_array().unwrap();
    assert_eq!(args.len(), 1);
    let map = &args[0];
    assert_eq!(map["extra-arg-k"], "V");
    assert_eq!(map["x-multi"], "a, b");
    assert_eq!(map["host"], "test.local");
    assert_eq!(map["body"]["binary"], "payload \u{0}\u{ff}");
    assert_eq!(
        got["attachments"],
        json!({"path": "org.apache.dubbo.backend.DemoService",
               "interface": "org.apache.dubbo.backend.DemoService",
               "version": "1.0.0"})
    );
    // A binary body back as bytes.
    let r = post(&gw, "/bytes", &[], b"\x01\x02");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"\x01\x02!"[..]));
}

#[test]
fn dubbo_proxy_answers_and_failures() {
    let p = Provider::start();
    let node = p.node();
    let short = "      timeout:\n        connect: 0.5\n        send: 0.5\n        read: 0.1\n";
    let no_version = json!({"service_name": "org.apache.dubbo.backend.DemoService"});
    let gw = Launch::new(&routes(&[
        route("/schema", "dubbo-proxy", no_version, &node, ""),
        dubbo_proxy("/fail", Some("fail"), "1.0.0", &node, ""),
        dubbo_proxy("/badStatus", None, "1.0.0", &node, ""),
        dubbo_proxy("/long", Some("long"), "1.0.0", &node, ""),
        dubbo_proxy("/mismatch", Some("hello"), "0.1.0", &node, ""),
        dubbo_proxy("/exception", Some("exception"), "1.0.0", &node, ""),
        dubbo_proxy("/null", Some("null"), "1.0.0", &node, ""),
        dubbo_proxy("/garbage", Some("garbage"), "1.0.0", &node, ""),
        dubbo_proxy("/drop", Some("drop"), "1.0.0", &node, ""),
        dubbo_proxy("/timeout", Some("timeout"), "1.0.0", &node, short),
        dubbo_proxy("/dead", Some("hello"), "1.0.0", &dead_node(), short),
    ]))
    .stderr_to_file()
    .start();
    // A conf without `service_version` is refused: no route.
    assert_eq!(post(&gw, "/schema", &[], b"").status, 404);
    let r = post(&gw, "/fail", &[], b"");
    assert_eq!((r.status, r.text().as_str()), (503, "dubbo fail\n"));
    // No `method`: the URI without its slash; a numeric status.
    let r = post(&gw, "/badStatus", &[], b"");
    assert_eq!((r.status, r.text().as_str()), (200, "ok\n"));
    // A string longer than one Hessian chunk, not ASCII.
    let r = post(&gw, "/long", &[], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), format!("{}end", "é".repeat(40000)));
    // No such service version, an exception, a null, garbage, a closed connection, no node.
    for path in [
        "/mismatch",
        "/exception",
        "/null",
        "/garbage",
        "/drop",
        "/dead",
    ] {
        assert_eq!(post(&gw, path, &[], b"").status, 502, "{path}");
    }
    // No answer within the read timeout.
    assert_eq!(post(&gw, "/timeout", &[], b"").status, 504);
    let log = gw.error_output();
    assert!(log.contains("may be version or group mismatch"), "{log}");
    assert!(
        log.contains("property \"service_version\" is required"),
        "{log}"
    );
}

#[test]
fn dubbo_proxy_multiplexes_calls_on_shared_connections() {
    let p = Provider::start();
    let gw = Launch::new(&routes(&[dubbo_proxy(
        "/hold",
        Some("hold"),
        "1.0.0",
        &p.node(),
        "",
    )]))
    .extra_config("plugin_attr:\n  dubbo-proxy:\n    upstream_multiplex_count: 2\n")
    .start();
    // Four calls at once, which the provider answers only once all four arrived: two per
    // connection, so two connections, and each answer reaches the call with its id.
    let addr = gw.addr();
    let calls: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                let seq = i.to_string();
                let r = request(addr, "GET", "/hold", &[("X-Seq", &seq)], b"");
                (i, r)
            })
        })
        .collect();
    let mut conns = HashSet::new();
    let mut ids = HashSet::new();
    for c in calls {
        let (i, r) = c.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let got = r.json();
        assert_eq!(got["args"][0]["x-seq"], i.to_string());
        conns.insert(got["conn"].as_u64().unwrap());
        ids.insert((got["conn"].as_u64().unwrap(), got["id"].as_u64().unwrap()));
    }
    assert_eq!(conns.len(), 2, "{conns:?}");
    assert_eq!(ids.len(), 4);
}
