//! Observability: opentelemetry and zipkin tracing, prometheus metrics and public-api, which serves plugins' own APIs (the
//! metrics text) on a data-plane route.

family! {
    opentelemetry,
    prometheus,
    public_api,
    zipkin,
}
