//! Plugins that enforce the browser's cross-origin rules: cors, and csrf's double-submit
//! cookie.

family! {
    cors,
    csrf,
}
