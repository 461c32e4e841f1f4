//! The export server (`plugin_attr.prometheus.export_addr`): `GET <export_uri>` answers the
//! metrics text; any other method or path gets nginx's 404 page, as APISIX's export server.
//!
//! The text is rendered on each scrape from the live counters (APISIX serves a copy refreshed
//! every `refresh_interval`); a scrape sees every request whose log phase has run.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use ferrisix_net::{Acceptor, ConnLimits, Drain};
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::Metrics;

fn not_found() -> Response<Full<Bytes>> {
    let body = "<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n<center><h1>404 Not Found</h1></center>\r\n<hr><center>openresty</center>\r\n</body>\r\n</html>\r\n";
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = StatusCode::NOT_FOUND;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/html"),
    );
    r
}

/// Answers one export request.
pub fn answer(metrics: &Metrics, method: &Method, path: &str) -> Response<Full<Bytes>> {
    if method != Method::GET || path != metrics.export_uri() {
        return not_found();
    }
    let mut r = Response::new(Full::new(Bytes::from(metrics.render())));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain"),
    );
    r
}

/// Serves the export endpoint on `listener` until `shutdown` turns true. `limits` bounds
/// silent, idle and non-reading clients as on the data port.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    limits: ConnLimits,
    mut shutdown: watch::Receiver<bool>,
) {
    let builder = Arc::new(ferrisix_net::http_builder(&limits).http1_only());
    let mut acceptor = Acceptor::new(listener, "prometheus export");
    let drain = Drain::new();
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => break,
            a = acceptor.accept() => a,
        };
        let metrics = metrics.clone();
        let builder = builder.clone();
        let drain = drain.clone();
        tokio::spawn(async move {
            let (io, conn_watch) = ferrisix_net::wrap(stream, &limits);
            let conn_watch = conn_watch.with_drain(&drain);
            let requests = conn_watch.clone();
            let service = service_fn(move |req: Request<Incoming>| {
                let metrics = metrics.clone();
                let in_flight = requests.begin();
                let resp = answer(&metrics, req.method(), req.uri().path());
                let resp = requests.respond(resp, in_flight, req.version());
                async move { Ok::<_, Infallible>(resp) }
            });
            if let Some(Err(e)) = conn_watch
                .serve(builder.serve_connection(io, service))
                .await
            {
                tracing::debug!(error = %e, "prometheus export connection ended with an error");
            }
        });
    }
    drop(acceptor);
    drain.start();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), drain.finished()).await;
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn only_get_on_the_uri() {
        let services = ferrisix_plugin_api::PluginServices::default();
        let m = services.shared::<Metrics>();
        let r = answer(&m, &Method::GET, "/apisix/prometheus/metrics");
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "text/plain");
        let body = r.into_body().collect().await.unwrap().to_bytes();
        assert!(std::str::from_utf8(&body)
            .unwrap()
            .contains("apisix_node_info{"));
        assert_eq!(
            answer(&m, &Method::POST, "/apisix/prometheus/metrics").status(),
            404
        );
        assert_eq!(answer(&m, &Method::GET, "/other").status(), 404);
    }
}
