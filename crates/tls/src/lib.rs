//! ferrisix's TLS machinery, on rustls with the ring provider.
//!
//! [`CertStore`] holds the `ssls` of one configuration snapshot: server certificates keyed by
//! SNI (exact names and `*.` wildcards, with APISIX's radixtree precedence), each with its own
//! rustls `ServerConfig` (protocols, client-certificate verification, RSA and ECDSA pairs chosen
//! by the client's signature schemes), and client certificates for upstream mTLS. [`accept`]
//! reads a ClientHello, picks the ssl by SNI (or `fallback_sni`) and completes the handshake;
//! [`mtls`] applies APISIX's per-request client-certificate rules; [`upstream`] builds the
//! client configs used towards TLS upstreams; [`resumption`] keeps a resumed session within
//! the client-certificate policy it was made under; [`ocsp`] staples the responders' answers
//! (the ocsp-stapling plugin); [`quic`] gives HTTP/3's QUIC endpoints the same ssls by SNI.
//! [`TlsSettings`] carries `apisix.ssl`:
//! protocols, nginx cipher names mapped onto rustls suites, session cache and tickets.
#![forbid(unsafe_code)]

pub mod accept;
pub mod ciphers;
pub mod mtls;
pub mod ocsp;
pub mod quic;
pub mod resumption;
pub mod server;
pub mod settings;
pub mod store;
pub mod upstream;

pub use accept::{accept, AcceptError, ClientVerify, TlsConnInfo};
pub use settings::{TlsContext, TlsSettings};
pub use store::{CertStore, ClientIdentity, SslEntry};
pub use upstream::UpstreamTls;
