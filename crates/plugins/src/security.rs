//! Plugins that enforce the browser's cross-origin rules.

family! {
    cors,
}
