//! datadog (`apisix/plugins/datadog.lua`): each request's metrics to a DogStatsD agent over
//! UDP, at the `host:port` of the plugin's metadata (default `127.0.0.1:8125`), batched by
//! the batch processor. A request's lines, `<namespace>.<metric>:<value>|<type>|#<tags>`:
//! `request.counter` (1, `c`), `request.latency` (ms, `h`), `upstream.latency` (when an
//! upstream answered), `apisix.latency` (`h`), `ingress.size` and `egress.size` (bytes,
//! `ms`), sent as one datagram (one per line when they exceed the agent's 8 KiB buffer). The
//! tags: the metadata's `constant_tags` (default `source:apisix`), the conf's, then
//! `route_name` (the route's name with `prefer_name`, else its id), `path` (the matched URI
//! pattern, `include_path`), `method` (`include_method`), `service_name`, `consumer`,
//! `balancer_ip`, `response_status`, `response_status_class` (`2xx`) and `scheme`, each
//! only when it has a value. `namespace` (default `apisix`) prefixes the names.
//!
//! Not as APISIX: the `scheme` tag (APISIX's `ctx.upstream_scheme`) is sent only where the
//! gateway gives plugins `$upstream_scheme`, which it does not yet.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{CheckCtx, CompileCtx, LogCtx, Plugin, PluginDef, VarNames};
use serde_json::{json, Value};

use super::sink::net::{self, NetError};
use super::sink::{self, BatchSink, Logger, SendError, SendFuture};

pub const NAME: &str = "datadog";

pub static DEF: PluginDef = PluginDef {
    metadata_schema: Some(metadata_schema),
    schema_error: Some(schema_error),
    per_route: true,
    ..sink::def(NAME, 495, schema, compile)
};

/// The agent's default receive buffer (`dogstatsd_buffer_size`): longer datagrams are cut.
const MAX_DATAGRAM_SIZE: usize = 8192;

/// APISIX's tag pattern ends with a look-behind (`(?<!:)`, no trailing colon), which the
/// schema's regex engine lacks; [`TAG_PATTERN`] accepts the same tags and messages name
/// APISIX's.
const APISIX_TAG_PATTERN: &str = r"^[\p{L}][\p{L}\p{N}_.:/-]*(?<!:)$";
const TAG_PATTERN: &str = r"^\p{L}(?:[\p{L}\p{N}_.:/-]*[\p{L}\p{N}_./-])?$";

fn tag_schema() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": 200, "pattern": TAG_PATTERN})
}

fn schema() -> Value {
    sink::batch_schema(
        json!({
            "type": "object",
            "properties": {
                "prefer_name": {"type": "boolean", "default": true},
                "include_path": {"type": "boolean", "default": false},
                "include_method": {"type": "boolean", "default": false},
                "constant_tags": {"type": "array", "items": tag_schema(), "default": []}
            }
        }),
        NAME,
    )
}

fn metadata_schema() -> Value {
    super::batch_processor::wrap_metadata_schema(json!({
        "type": "object",
        "properties": {
            "host": {"type": "string", "default": "127.0.0.1"},
            "port": {"type": "integer", "minimum": 0, "default": 8125},
            "namespace": {"type": "string", "default": "apisix"},
            "constant_tags": {"type": "array", "items": tag_schema(), "default": ["source:apisix"]}
        }
    }))
}

/// The schema's message with APISIX's tag pattern (as the message writes patterns, its
/// backslashes doubled).
fn schema_error(_: &CheckCtx<'_>, err: String) -> String {
    let escaped = |p: &str| p.replace('\\', "\\\\");
    err.replace(&escaped(TAG_PATTERN), &escaped(APISIX_TAG_PATTERN))
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

/// What the metric lines of one conf share, fixed at compile.
struct Metrics {
    /// `<namespace>.` (empty for an empty namespace).
    prefix: String,
    /// The metadata's constant tags, then the conf's.
    constant_tags: Vec<String>,
    /// The route's name (`prefer_name`) or id; `None`: the request's `$route_id`.
    route_name: Option<String>,
    /// `Some(None)`: the service's tag is dropped (`prefer_name` with a nameless service,
    /// as APISIX's lookup gives nil); `None`: the request's `$service_id`.
    service_name: Option<Option<String>>,
    /// The route's URI patterns (`include_path`).
    paths: Option<Box<[String]>>,
    include_method: bool,
}

fn format_number(v: f64) -> String {
    // Lua's `%s` of a number: integers without a fraction, others as `%.14g`.
    lua::cjson_encode(&json!(v))
}

impl Metrics {
    fn tags(&self, ctx: &LogCtx) -> String {
        let mut tags: Vec<String> = self.constant_tags.clone();
        let mut add = |key: &str, value: Option<&str>| {
            if let Some(v) = value.filter(|v| !v.is_empty()) {
                tags.push(format!("{key}:{v}"));
            }
        };
        add(
            "route_name",
            self.route_name.as_deref().or(ctx.vars.get("route_id")),
        );
        let path = self
            .paths
            .as_ref()
            .and_then(|p| p.get(usize::from(ctx.matched_uri?)));
        add("path", path.map(String::as_str));
        if self.include_method {
            add("method", ctx.vars.get("request_method"));
        }
        let service = match &self.service_name {
            Some(named) => named.as_deref(),
            None => ctx.vars.get("service_id"),
        };
        add("service_name", service);
        add(
            "consumer",
            ctx.consumer.as_deref().map(|c| c.username.as_str()),
        );
        let balancer = ctx.node.map(|ip| ip.to_string());
        add("balancer_ip", balancer.as_deref());
        let status = (ctx.status != 0).then(|| ctx.status.to_string());
        add("response_status", status.as_deref());
        let class = (ctx.status != 0).then(|| format!("{}xx", ctx.status / 100));
        add("response_status_class", class.as_deref());
        add("scheme", ctx.vars.get("upstream_scheme"));
        if tags.is_empty() {
            String::new()
        } else {
            format!("|#{}", tags.join(","))
        }
    }

    /// The request's lines (`build_metrics`), joined by newlines.
    fn lines(&self, ctx: &LogCtx) -> String {
        let suffix = self.tags(ctx);
        let p = &self.prefix;
        let latency = ctx.request_time.as_secs_f64() * 1000.0;
        // log-util's latencies: the upstream's in whole ms, the gateway's the rest.
        let upstream = ctx.upstream_time.map(|t| t.as_millis() as f64);
        let apisix = upstream.map_or(latency, |u| (latency - u).max(0.0));
        let mut lines = vec![
            format!("{p}request.counter:1|c{suffix}"),
            format!("{p}request.latency:{}|h{suffix}", format_number(latency)),
        ];
        if let Some(u) = upstream {
            lines.push(format!(
                "{p}upstream.latency:{}|h{suffix}",
                format_number(u)
            ));
        }
        lines.push(format!(
            "{p}apisix.latency:{}|h{suffix}",
            format_number(apisix)
        ));
        lines.push(format!("{p}ingress.size:{}|ms{suffix}", ctx.request_length));
        lines.push(format!("{p}egress.size:{}|ms{suffix}", ctx.bytes_sent));
        lines.join("\n")
    }
}

struct DogStatsd {
    host: String,
    port: u16,
}

impl DogStatsd {
    async fn push(&self, entries: &[Bytes]) -> Result<(), SendError> {
        let (host, port) = (self.host.as_str(), self.port);
        let timeout = Duration::from_secs(60);
        for (i, payload) in entries.iter().enumerate() {
            let sent = if payload.len() <= MAX_DATAGRAM_SIZE {
                net::udp(host, port, timeout, payload).await
            } else {
                let mut r = Ok(());
                for line in payload.split(|b| *b == b'\n') {
                    if line.len() > MAX_DATAGRAM_SIZE {
                        tracing::warn!(
                            "dogstatsd metric line exceeds {MAX_DATAGRAM_SIZE} bytes, agent may truncate it"
                        );
                    }
                    r = net::udp(host, port, timeout, line).await;
                    if r.is_err() {
                        break;
                    }
                }
                r
            };
            if let Err(e) = sent {
                let message = match e {
                    NetError::Connect(e) => format!(
                        "failed to connect to UDP server: host[{host}] port[{port}] err: {e}"
                    ),
                    NetError::Send(e) | NetError::Handshake(e) => format!(
                        "failed to send metrics to dogstatsd server: host[{host}] port[{port}] err: {e}"
                    ),
                };
                return Err(SendError {
                    message,
                    first_fail: Some(i + 1),
                });
            }
        }
        Ok(())
    }
}

impl BatchSink for DogStatsd {
    fn send<'a>(&'a self, entries: &'a [Bytes], _: usize) -> SendFuture<'a> {
        Box::pin(self.push(entries))
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let meta = cx.metadata;
    let meta_get = |k: &str| meta.and_then(|m| m.get(k));
    let namespace = meta_get("namespace")
        .and_then(Value::as_str)
        .unwrap_or("apisix");
    let mut constant_tags = match meta_get("constant_tags") {
        Some(v) => strings(Some(v)),
        None => vec!["source:apisix".to_owned()],
    };
    constant_tags.extend(strings(conf.get("constant_tags")));
    let prefer_name = conf.get("prefer_name").and_then(Value::as_bool) != Some(false);
    let route = cx.route;
    let metrics = Metrics {
        prefix: if namespace.is_empty() {
            String::new()
        } else {
            format!("{namespace}.")
        },
        constant_tags,
        route_name: route.map(|r| {
            match r.name.as_deref().filter(|n| prefer_name && !n.is_empty()) {
                Some(name) => name.to_owned(),
                None => r.id.to_string(),
            }
        }),
        service_name: route.filter(|_| prefer_name).and_then(|r| {
            let id = r.service_id.as_deref().filter(|s| !s.is_empty())?;
            Some(match r.service_name.as_deref() {
                Some("") => Some(id.to_owned()),
                other => other.map(str::to_owned),
            })
        }),
        paths: route
            .filter(|_| conf.get("include_path").and_then(Value::as_bool) == Some(true))
            .map(|r| r.uris.clone()),
        include_method: conf.get("include_method").and_then(Value::as_bool) == Some(true),
    };
    let host = meta_get("host")
        .and_then(Value::as_str)
        .unwrap_or("127.0.0.1")
        .to_owned();
    let port = meta_get("port").and_then(Value::as_i64).unwrap_or(8125);
    let port = u16::try_from(port).map_err(|_| format!("invalid port {port}"))?;
    let mut vars: Vec<Box<str>> = vec!["upstream_scheme".into()];
    if metrics.include_method {
        vars.push("request_method".into());
    }
    let logger = Logger::compile_own_entry(cx, NAME, |_| {
        Ok(Arc::new(DogStatsd { host, port }) as Arc<dyn BatchSink>)
    })?
    .with_vars(&VarNames::from(vars));
    Ok(logger.encoded_by(move |_, _, ctx: &LogCtx| Bytes::from(metrics.lines(ctx))))
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::{Consumer, LogVars, RouteInfo};
    use tokio::net::UdpSocket;

    use super::*;
    use crate::testing::Compiler;

    struct V(Vec<(&'static str, &'static str)>);
    impl ferrisix_router::VarSource for V {
        fn var(&self, name: &str) -> Option<std::borrow::Cow<'_, str>> {
            self.0
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).into())
        }
    }

    fn request(p: &dyn Plugin, status: u16) -> LogCtx {
        let vars = V(vec![
            ("route_id", "1"),
            ("service_id", "s1"),
            ("request_method", "GET"),
        ]);
        LogCtx {
            status,
            matched_uri: Some(1),
            node: Some("127.0.0.1".parse().unwrap()),
            request_length: 83,
            bytes_sent: 190,
            request_time: Duration::from_millis(15),
            upstream_time: Some(Duration::from_millis(12)),
            vars: LogVars::capture(p.log_needs().vars.unwrap(), &vars),
            ..Default::default()
        }
    }

    async fn recv(sock: &UdpSocket) -> String {
        let mut buf = [0u8; 65536];
        let n = tokio::time::timeout(Duration::from_secs(5), sock.recv(&mut buf))
            .await
            .expect("a datagram within 5 s")
            .unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    fn route(name: Option<&str>, service_name: Option<&str>) -> RouteInfo {
        RouteInfo {
            id: "1".into(),
            name: name.map(Into::into),
            service_id: Some("s1".into()),
            service_name: service_name.map(Into::into),
            uris: vec!["/a".to_owned(), "/datadog/*".to_owned()].into(),
            hosts: Box::default(),
        }
    }

    #[tokio::test]
    async fn metrics_as_dogstatsd_lines_with_apisix_tags() {
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let port = sock.local_addr().unwrap().port();
        let meta = json!({"host": "127.0.0.1", "port": port, "namespace": "mycompany",
            "constant_tags": ["source:apisix", "env:test"]});
        let c = Compiler::new();
        let conf = json!({"batch_max_size": 1, "constant_tags": ["new_tag:must"],
            "include_path": true, "include_method": true});
        let r = route(Some("datadog"), Some("svc"));
        let mut cx = c.cx(NAME, &conf, "dd-1", Some(&meta));
        cx.route = Some(&r);
        let p = (DEF.compile)(&cx).unwrap();
        let mut ctx = request(&*p, 200);
        ctx.consumer = Some(Arc::new(Consumer {
            username: "jack".into(),
            ..Default::default()
        }));
        p.log(&ctx);
        let got = recv(&sock).await;
        let tags = "|#source:apisix,env:test,new_tag:must,route_name:datadog,path:/datadog/*,method:GET,service_name:svc,consumer:jack,balancer_ip:127.0.0.1,response_status:200,response_status_class:2xx";
        let want = [
            format!("mycompany.request.counter:1|c{tags}"),
            format!("mycompany.request.latency:15|h{tags}"),
            format!("mycompany.upstream.latency:12|h{tags}"),
            format!("mycompany.apisix.latency:3|h{tags}"),
            format!("mycompany.ingress.size:83|ms{tags}"),
            format!("mycompany.egress.size:190|ms{tags}"),
        ]
        .join("\n");
        assert_eq!(got, want);
    }

    #[tokio::test]
    async fn ids_without_prefer_name_and_defaults() {
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let port = sock.local_addr().unwrap().port();
        let meta = json!({"host": "127.0.0.1", "port": port, "namespace": ""});
        let c = Compiler::new();
        let conf = json!({"batch_max_size": 2, "prefer_name": false});
        let r = route(Some("datadog"), Some("svc"));
        let mut cx = c.cx(NAME, &conf, "dd-2", Some(&meta));
        cx.route = Some(&r);
        let p = (DEF.compile)(&cx).unwrap();
        let mut ctx = request(&*p, 502);
        ctx.upstream_time = None;
        p.log(&ctx);
        p.log(&request(&*p, 200));
        // One datagram per request.
        let first = recv(&sock).await;
        let tags = "|#source:apisix,route_name:1,service_name:s1,balancer_ip:127.0.0.1,response_status:502,response_status_class:5xx";
        assert_eq!(
            first.lines().next().unwrap(),
            format!("request.counter:1|c{tags}")
        );
        assert!(!first.contains("upstream.latency"), "{first}");
        assert!(recv(&sock).await.contains("response_status:200"));
    }

    #[test]
    fn nameless_service_drops_its_tag() {
        let m = Metrics {
            prefix: String::new(),
            constant_tags: Vec::new(),
            route_name: Some("r".into()),
            service_name: Some(None),
            paths: None,
            include_method: false,
        };
        let tags = m.tags(&LogCtx::default());
        assert_eq!(tags, "|#route_name:r");
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        let pre = "failed to check the configuration of plugin datadog err: ";
        assert!(r.check(NAME, &json!({})).is_ok());
        assert!(r
            .check(
                NAME,
                &json!({"constant_tags": ["a:b", "ünï:cödé", "x/y-z.w_1"]})
            )
            .is_ok());
        assert_eq!(
            r.check(NAME, &json!({"constant_tags": ["a:"]})).unwrap_err(),
            format!("{pre}property \"constant_tags\" validation failed: failed to validate item 1: failed to match pattern \"{}\" with \"a:\"", APISIX_TAG_PATTERN.replace('\\', "\\\\"))
        );
        assert!(r.check(NAME, &json!({"constant_tags": ["1a"]})).is_err());
        assert!(r.check(NAME, &json!({"prefer_name": "yes"})).is_err());
        assert!(r.check_metadata(NAME, &json!({"port": -1})).is_err());
        let info = r.get(NAME).unwrap();
        assert_eq!(info.priority, 495);
        assert_eq!(info.schema["properties"]["name"]["default"], NAME);
    }
}
