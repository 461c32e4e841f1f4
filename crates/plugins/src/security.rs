//! Plugins that enforce the browser's cross-origin rules: cors, and csrf's double-submit
//! cookie; and ocsp-stapling, whose work (the responders' answers stapled to TLS handshakes)
//! is `ferrisix-tls`'s.

family! {
    cors,
    csrf,
    ocsp_stapling,
}
