//! The control port (127.0.0.1:9090 by default, like APISIX's control API): readiness, the
//! applied configuration revision, quarantined resources, and dumps of what is being served.
//!
//! It reads the published snapshot and the store's health; it never touches the request path.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use ferrisix_config::model::ResourceKind;
use ferrisix_config::store::StoreHealth;
use ferrisix_net::{Acceptor, ConnLimits, Drain};
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::snapshot::SnapshotHandle;

/// Reports the config source's health (the embedded store, etcd, or a watched file).
pub type HealthProbe = Arc<dyn Fn() -> StoreHealth + Send + Sync>;

pub struct ControlApi {
    pub snapshot: SnapshotHandle,
    pub health: HealthProbe,
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
        if method != Method::GET {
            return json_response(
                StatusCode::METHOD_NOT_ALLOWED,
                json!({"error_msg": "only GET is supported"}),
            );
        }
        let snapshot = self.snapshot.load();
        let health = (self.health)();
        let path = path.trim_end_matches('/');
        let dump = |kind: ResourceKind| -> Value {
            Value::Array(
                snapshot
                    .applied(kind)
                    .into_iter()
                    .map(|(id, v)| json!({"id": id, "value": &*v}))
                    .collect(),
            )
        };
        let one = |kind: ResourceKind, id: &str| -> Response<Full<Bytes>> {
            match snapshot.applied(kind).into_iter().find(|(i, _)| i == id) {
                Some((_, v)) => json_response(StatusCode::OK, (*v).clone()),
                None => json_response(StatusCode::NOT_FOUND, json!({"error_msg": "not found"})),
            }
        };
        match path {
            "/status" => json_response(StatusCode::OK, json!({"status": "ok"})),
            "/status/ready" | "/v1/healthcheck" => {
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
            "/v1/routes" => json_response(StatusCode::OK, dump(ResourceKind::Routes)),
            "/v1/upstreams" => json_response(StatusCode::OK, dump(ResourceKind::Upstreams)),
            "/v1/services" => json_response(StatusCode::OK, dump(ResourceKind::Services)),
            _ => {
                if let Some(id) = path.strip_prefix("/v1/route/") {
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

/// Serves the control API until `shutdown` turns true. `limits` bounds silent, idle and
/// non-reading clients as on the data port.
pub async fn serve(
    listener: TcpListener,
    api: Arc<ControlApi>,
    limits: ConnLimits,
    mut shutdown: watch::Receiver<bool>,
) {
    let builder = Arc::new(ferrisix_net::http_builder(&limits));
    let mut acceptor = Acceptor::new(listener, "control");
    let drain = Drain::new();
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => break,
            (stream, _) = acceptor.accept() => {
                let api = api.clone();
                let builder = builder.clone();
                let drain = drain.clone();
                tokio::spawn(async move {
                    let (io, conn_watch) = ferrisix_net::wrap(stream, &limits);
                    let conn_watch = conn_watch.with_drain(&drain);
                    let requests = conn_watch.clone();
                    let service = service_fn(move |req: Request<Incoming>| {
                        let in_flight = requests.begin();
                        let resp = api.handle(req.method(), req.uri().path());
                        let resp = requests.respond(resp, in_flight, req.version());
                        async move { Ok::<_, Infallible>(resp) }
                    });
                    let _ = conn_watch.serve(builder.serve_connection(io, service)).await;
                });
            }
        }
    }
    drop(acceptor);
    drain.start();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), drain.finished()).await;
}
