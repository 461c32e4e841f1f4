//! Observability: opentelemetry, zipkin and skywalking tracing, prometheus metrics and public-api, which serves plugins' own APIs (the
//! metrics text, node-status' `/apisix/status`) on a data-plane route.

family! {
    node_status,
    opentelemetry,
    prometheus,
    public_api,
    skywalking,
    zipkin,
}
