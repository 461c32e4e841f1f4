//! Observability: prometheus metrics and public-api, which serves plugins' own APIs (the
//! metrics text) on a data-plane route.

family! {
    prometheus,
    public_api,
}
