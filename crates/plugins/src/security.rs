//! Plugins that enforce the browser's cross-origin rules: cors, and csrf's double-submit
//! cookie; chaitin-waf, which has a SafeLine web application firewall judge each request; and
//! ocsp-stapling, whose work (the responders' answers stapled to TLS handshakes) is
//! `ferrisix-tls`'s.

family! {
    chaitin_waf,
    cors,
    csrf,
    ocsp_stapling,
}
