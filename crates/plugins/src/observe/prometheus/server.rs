//! The export server (`plugin_attr.prometheus.export_addr`): `GET <export_uri>` answers the
//! metrics text; any other method or path gets nginx's 404 page, as APISIX's export server.
//!
//! The text is rendered on each scrape from the live counters (APISIX serves a copy refreshed
//! every `refresh_interval`); a scrape sees every request whose log phase has run.

use std::sync::Arc;

use bytes::Bytes;
use ferrisix_net::ConnLimits;
use http::{header, Method, Response, StatusCode};
use http_body_util::Full;
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
    shutdown: watch::Receiver<bool>,
) {
    let builder = ferrisix_net::http_builder(&limits).http1_only();
    let name = "prometheus export";
    ferrisix_net::serve_until(listener, name, builder, limits, shutdown, move |req, _| {
        std::future::ready(answer(&metrics, req.method(), req.uri().path()))
    })
    .await;
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
