//! The control port (127.0.0.1:9090 by default, like APISIX's control API): readiness, the
//! schemas (`/v1/schema`), the applied configuration revision, quarantined resources, dumps of what is being served, and
//! APISIX's health-check views (`/v1/healthcheck`, `/v1/healthcheck/{type}/{id}`), and the
//! discovery modules' views (`/v1/discovery/{name}/dump`, `/v1/discovery/{name}/show_dump_file`;
//! beyond APISIX, `/v1/discovery` gives each registry's fetch and failure counts).
//!
//! It reads the published snapshot and the store's health; it never touches the request path.

use std::sync::Arc;

use bytes::Bytes;
use ferrisix_config::model::ResourceKind;
use ferrisix_config::store::StoreHealth;
use ferrisix_net::ConnLimits;
use http::{header, Method, Response, StatusCode};
use http_body_util::Full;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::snapshot::{Snapshot, SnapshotHandle};
use crate::upstream::health::UpstreamChecker;

/// Reports the config source's health (the embedded store, etcd, or a watched file).
pub type HealthProbe = Arc<dyn Fn() -> StoreHealth + Send + Sync>;

/// The stream proxy's routes as it serves them, each with the checker of its own inline
/// upstream (`None` without `checks`), in id order. The stream crate sits above this one,
/// so it hands its table over as this reader.
pub type StreamCheckers =
    Arc<dyn Fn() -> Vec<(String, Option<Arc<UpstreamChecker>>)> + Send + Sync>;

pub struct ControlApi {
    pub snapshot: SnapshotHandle,
    pub health: HealthProbe,
    /// The stream routes' checkers; `None` when the stream proxy is off.
    pub stream: Option<StreamCheckers>,
    /// `/v1/schema`'s document (the core schemas and the enabled plugins', made at start:
    /// the plugin list is read once), `None` where it is not served (the status port).
    pub schema: Option<Arc<Value>>,
}

fn json_response(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

impl ControlApi {
    pub fn handle(&self, method: &Method, path: &str) -> Response<Full<Bytes>> {
        self.handle_with(method, path, false)
    }

    /// `accept_html`: the client's `Accept` names `text/html` (APISIX then renders a table).
    pub fn handle_with(
        &self,
        method: &Method,
        path: &str,
        accept_html: bool,
    ) -> Response<Full<Bytes>> {
        if method != Method::GET {
            return json_response(
                StatusCode::METHOD_NOT_ALLOWED,
                json!({"error_msg": "only GET is supported"}),
            );
        }
        let snapshot = self.snapshot.load();
        let health = (self.health)();
        let path = path.trim_end_matches('/');
        // Resources whose secret references were resolved are shown as written, with the
        // references, as APISIX shows them: never a secret's value.
        let shown = |kind: ResourceKind, id: &str, v: &Value| -> Value {
            match snapshot.source().written.get(&(kind, id.to_owned())) {
                Some(written) => written.parse(),
                None => v.clone(),
            }
        };
        let dump = |kind: ResourceKind| -> Value {
            Value::Array(
                snapshot
                    .applied(kind)
                    .into_iter()
                    .map(|(id, v)| {
                        let value = shown(kind, &id, &v);
                        json!({"id": id, "value": value})
                    })
                    .collect(),
            )
        };
        let one = |kind: ResourceKind, id: &str| -> Response<Full<Bytes>> {
            match snapshot.applied(kind).into_iter().find(|(i, _)| i == id) {
                Some((_, v)) => json_response(StatusCode::OK, shown(kind, id, &v)),
                None => json_response(StatusCode::NOT_FOUND, json!({"error_msg": "not found"})),
            }
        };
        match path {
            "/status" => json_response(StatusCode::OK, json!({"status": "ok"})),
            "/v1/healthcheck" => self.health_checkers(&snapshot, accept_html),
            "/status/ready" => {
                // Ready means: serving the store's current config, not a local copy.
                if health.synced {
                    json_response(
                        StatusCode::OK,
                        json!({"status": "ok", "revision": snapshot.revision}),
                    )
                } else {
                    json_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        json!({"status": "error", "error": health.detail, "revision": snapshot.revision}),
                    )
                }
            }
            "/v1/config" => json_response(
                StatusCode::OK,
                json!({
                    "revision": snapshot.revision,
                    "routes": snapshot.router.len(),
                    "upstreams": snapshot.upstreams.len(),
                    "store": {
                        "reachable": health.reachable,
                        "synced": health.synced,
                        "revision": health.revision,
                        "detail": health.detail,
                    },
                    "quarantined": snapshot.quarantine.iter().map(|q| json!({
                        "kind": q.kind.dir(),
                        "id": q.id,
                        "error": q.error,
                        "serving_previous": q.serving_previous,
                    })).collect::<Vec<_>>(),
                }),
            ),
            "/v1/schema" => match &self.schema {
                Some(doc) => json_response(StatusCode::OK, Value::clone(doc)),
                None => json_response(StatusCode::NOT_FOUND, json!({"error_msg": "not found"})),
            },
            "/v1/routes" => json_response(StatusCode::OK, dump(ResourceKind::Routes)),
            "/v1/upstreams" => json_response(StatusCode::OK, dump(ResourceKind::Upstreams)),
            "/v1/services" => json_response(StatusCode::OK, dump(ResourceKind::Services)),
            _ => {
                if let Some(rest) = path.strip_prefix("/v1/healthcheck/") {
                    self.health_checker(&snapshot, rest, accept_html)
                } else if let Some(rest) = path.strip_prefix("/v1/discovery") {
                    discovery_view(&snapshot, rest)
                } else if let Some(id) = path.strip_prefix("/v1/route/") {
                    one(ResourceKind::Routes, id)
                } else if let Some(id) = path.strip_prefix("/v1/upstream/") {
                    one(ResourceKind::Upstreams, id)
                } else if let Some(id) = path.strip_prefix("/v1/service/") {
                    one(ResourceKind::Services, id)
                } else {
                    json_response(StatusCode::NOT_FOUND, json!({"error_msg": "not found"}))
                }
            }
        }
    }
}

/// `/v1/discovery{rest}`.
fn discovery_view(snapshot: &Snapshot, rest: &str) -> Response<Full<Bytes>> {
    let discovery = &snapshot.upstream_services().discovery;
    if rest.is_empty() {
        return json_response(StatusCode::OK, discovery.stats());
    }
    let not_found = || json_response(StatusCode::NOT_FOUND, json!({"error_msg": "not found"}));
    let Some((name, what)) = rest.trim_start_matches('/').split_once('/') else {
        return not_found();
    };
    match what {
        "dump" => match discovery.dump(name) {
            Some(v) => json_response(StatusCode::OK, v),
            None => not_found(),
        },
        "show_dump_file" => match discovery.show_dump_file(name) {
            Some((status, body)) => {
                // APISIX answers the file's text (or why not) as it is.
                let mut resp = Response::new(Full::new(Bytes::from(body)));
                *resp.status_mut() =
                    StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
                resp
            }
            None => not_found(),
        },
        _ => not_found(),
    }
}

impl ControlApi {
    /// The status API (`apisix.status`): `/status` answers that the process runs,
    /// `/status/ready` whether it serves its configuration source's current state (in
    /// API-driven standalone mode: whether a configuration was ever pushed). Paths match as
    /// nginx's prefix locations do; anything else is nginx's 404 page.
    pub fn handle_status(&self, path: &str) -> Response<Full<Bytes>> {
        if path.starts_with("/status/ready") {
            let health = (self.health)();
            if !health.synced {
                return json_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    json!({"status": "error", "error": health.detail}),
                );
            }
            // APISIX 3.15: not ready until the registries that say so are.
            let snapshot = self.snapshot.load();
            return match snapshot.upstream_services().discovery.check_ready() {
                Ok(()) => json_response(StatusCode::OK, json!({"status": "ok"})),
                Err(e) => json_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    json!({"status": "error", "error": e}),
                ),
            };
        }
        if path.starts_with("/status") {
            return json_response(StatusCode::OK, json!({"status": "ok"}));
        }
        let mut resp = Response::new(Full::new(Bytes::from_static(
            b"<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n<center><h1>404 Not Found</h1></center>\r\n</body>\r\n</html>\r\n",
        )));
        *resp.status_mut() = StatusCode::NOT_FOUND;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/html"),
        );
        resp
    }

    /// `/v1/healthcheck`: every route, stream route, service and upstream with `checks`, as
    /// APISIX's `_get_health_checkers` lists them (in that order).
    fn health_checkers(&self, snapshot: &Snapshot, html: bool) -> Response<Full<Bytes>> {
        let stream: Vec<Value> = self
            .stream_routes()
            .iter()
            .filter_map(|(_, c)| c.as_deref().map(checker_info))
            .collect();
        let mut infos: Vec<Value> = Vec::new();
        let mut stream = Some(stream);
        for entry in &snapshot.checkers {
            if entry.kind != ResourceKind::Routes {
                infos.extend(stream.take().into_iter().flatten());
            }
            infos.push(checker_info(&entry.checker));
        }
        infos.extend(stream.take().into_iter().flatten());
        if html {
            return html_response(&infos);
        }
        json_response(StatusCode::OK, Value::Array(infos))
    }

    fn stream_routes(&self) -> Vec<(String, Option<Arc<UpstreamChecker>>)> {
        self.stream.as_ref().map(|read| read()).unwrap_or_default()
    }

    /// `/v1/healthcheck/stream_routes/{id}`: the stream route's own upstream's checker.
    fn stream_health_checker(&self, src_id: &str, html: bool) -> Response<Full<Bytes>> {
        let routes = self.stream_routes();
        let Some((_, checker)) = routes.iter().find(|(id, _)| id == src_id) else {
            return json_response(
                StatusCode::NOT_FOUND,
                json!({"error_msg": format!("stream_routes[{src_id}] not found")}),
            );
        };
        let Some(checker) = checker else {
            return json_response(
                StatusCode::NOT_FOUND,
                json!({"error_msg": format!("no checker for stream_routes[{src_id}]")}),
            );
        };
        let info = checker_info(checker);
        if html {
            return html_response(&[info]);
        }
        json_response(StatusCode::OK, info)
    }

    /// `/v1/healthcheck/{routes|stream_routes|services|upstreams}/{id}`.
    fn health_checker(&self, snapshot: &Snapshot, rest: &str, html: bool) -> Response<Full<Bytes>> {
        let mut segs = rest.splitn(2, '/');
        let src_type = segs.next().unwrap_or_default();
        let src_id = segs.next().filter(|s| !s.is_empty());
        let Some(src_id) = src_id else {
            return json_response(
                StatusCode::NOT_FOUND,
                json!({"error_msg": format!("missing src id for src type {src_type}")}),
            );
        };
        let kind = match src_type {
            "routes" => ResourceKind::Routes,
            "services" => ResourceKind::Services,
            "upstreams" => ResourceKind::Upstreams,
            "stream_routes" => return self.stream_health_checker(src_id, html),
            _ => {
                return json_response(
                    StatusCode::BAD_REQUEST,
                    json!({"error_msg": format!("invalid src type {src_type}")}),
                )
            }
        };
        let exists = snapshot.applied(kind).iter().any(|(id, _)| id == src_id);
        if !exists {
            return json_response(
                StatusCode::NOT_FOUND,
                json!({"error_msg": format!("{src_type}[{src_id}] not found")}),
            );
        }
        match snapshot
            .checkers
            .iter()
            .find(|c| c.kind == kind && c.id == src_id)
        {
            Some(entry) => {
                let info = checker_info(&entry.checker);
                if html {
                    return html_response(&[info]);
                }
                json_response(StatusCode::OK, info)
            }
            None => json_response(
                StatusCode::NOT_FOUND,
                json!({"error_msg": format!("no checker for {src_type}[{src_id}]")}),
            ),
        }
    }
}

/// Every checker's info, routes first, as `_get_health_checkers` collects them.
pub fn health_infos(snapshot: &Snapshot) -> Vec<Value> {
    snapshot
        .checkers
        .iter()
        .map(|c| checker_info(&c.checker))
        .collect()
}

/// lua-resty-healthcheck's `get_target_list` shape (3.4+), under the checker's name.
fn checker_info(checker: &UpstreamChecker) -> Value {
    let nodes: Vec<Value> = checker
        .targets()
        .iter()
        .map(|t| {
            let c = t.counters();
            let mut node = json!({
                "ip": t.ip.to_string(),
                "port": t.port,
                "hostname": t.hostname,
                "status": t.health().name(),
                "counter": {
                    "success": c.success,
                    "http_failure": c.http_failure,
                    "tcp_failure": c.tcp_failure,
                    "timeout_failure": c.timeout_failure,
                },
            });
            if let Some(h) = &t.host_header {
                node["hostheader"] = Value::String(h.clone());
            }
            node
        })
        .collect();
    json!({"name": checker.name, "type": checker.config.type_name, "nodes": nodes})
}

/// APISIX's HTML table of the checkers (for a browser's `Accept: text/html`).
fn html_response(infos: &[Value]) -> Response<Full<Bytes>> {
    fn esc(v: &Value) -> String {
        let s = match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    }
    let mut out = String::from("<html xmlns=\"http://www.w3.org/1999/xhtml\">\n<head>\n  <title>APISIX upstream check status</title>\n</head>\n<body>\n<h1>APISIX upstream check status</h1>\n<table style=\"background-color:white\" cellspacing=\"0\" cellpadding=\"3\" border=\"1\">\n  <tr bgcolor=\"#C0C0C0\">\n    <th>Index</th>\n    <th>Upstream</th>\n    <th>Check type</th>\n    <th>Host</th>\n    <th>Status</th>\n    <th>Success counts</th>\n    <th>TCP Failures</th>\n    <th>HTTP Failures</th>\n    <th>TIMEOUT Failures</th>\n  </tr>\n");
    let mut i = 0;
    for info in infos {
        for node in info["nodes"].as_array().into_iter().flatten() {
            i += 1;
            let status = node["status"].as_str().unwrap_or_default();
            if status == "healthy" || status == "mostly_healthy" {
                out.push_str("  <tr>\n");
            } else {
                out.push_str("  <tr bgcolor=\"#FF0000\">\n");
            }
            let c = &node["counter"];
            for cell in [
                i.to_string(),
                esc(&info["name"]),
                esc(&info["type"]),
                format!("{}:{}", esc(&node["ip"]), esc(&node["port"])),
                esc(&node["status"]),
                esc(&c["success"]),
                esc(&c["tcp_failure"]),
                esc(&c["http_failure"]),
                esc(&c["timeout_failure"]),
            ] {
                out.push_str(&format!("    <td>{cell}</td>\n"));
            }
            out.push_str("  </tr>\n");
        }
    }
    out.push_str("</table>\n</body>\n</html>\n");
    let mut resp = Response::new(Full::new(Bytes::from(out)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/html"),
    );
    resp
}

/// The health of every checked node as `apisix_upstream_status` reports it:
/// `(checker name, ip, port, up)`.
pub fn upstream_statuses(snapshot: &Snapshot) -> Vec<(String, String, u16, bool)> {
    snapshot
        .checkers
        .iter()
        .flat_map(|entry| checker_statuses(&entry.checker))
        .collect()
}

/// One checker's nodes as [`upstream_statuses`] reports them.
pub fn checker_statuses(checker: &UpstreamChecker) -> Vec<(String, String, u16, bool)> {
    checker
        .targets()
        .iter()
        .map(|t| (checker.name.clone(), t.ip.to_string(), t.port, t.is_up()))
        .collect()
}

/// Serves the status API ([`ControlApi::handle_status`]) on `listener` until `shutdown`.
pub async fn serve_status(
    listener: TcpListener,
    api: Arc<ControlApi>,
    limits: ConnLimits,
    shutdown: watch::Receiver<bool>,
) {
    let builder = ferrisix_net::http_builder(&limits);
    ferrisix_net::serve_until(
        listener,
        "status",
        builder,
        limits,
        shutdown,
        move |req, _| std::future::ready(api.handle_status(req.uri().path())),
    )
    .await;
}

/// Serves the control API until `shutdown` turns true. `limits` bounds silent, idle and
/// non-reading clients as on the data port.
pub async fn serve(
    listener: TcpListener,
    api: Arc<ControlApi>,
    limits: ConnLimits,
    shutdown: watch::Receiver<bool>,
) {
    let builder = ferrisix_net::http_builder(&limits);
    ferrisix_net::serve_until(
        listener,
        "control",
        builder,
        limits,
        shutdown,
        move |req, _| {
            let html = req
                .headers()
                .get(header::ACCEPT)
                .and_then(|a| a.to_str().ok())
                .is_some_and(|a| a.contains("text/html"));
            std::future::ready(api.handle_with(req.method(), req.uri().path(), html))
        },
    )
    .await;
}
