//! TLS towards the servers plugins call (log servers over TCP, HTTPS endpoints): rustls client
//! configs with and without certificate verification (`ssl_verify`), made on first use,
//! verifying against the gateway's trusted CA bundle (`apisix.ssl.ssl_trusted_certificate`,
//! default the system's: the bundle upstreams' `tls.verify` uses, as APISIX's
//! `lua_ssl_trusted_certificate` serves both).

use std::sync::{Arc, OnceLock};

use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

type Made = OnceLock<Result<Arc<ClientConfig>, String>>;

/// The TLS client of one gateway.
pub struct TlsClient {
    /// `None`: the system's bundle, read when a verified config is first needed.
    roots: Option<Arc<RootCertStore>>,
    alpn: &'static [&'static [u8]],
    verified: Made,
    unverified: Made,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient")
            .field("roots", &self.roots.as_ref().map(|r| r.len()))
            .finish_non_exhaustive()
    }
}

impl TlsClient {
    /// Verifies against `roots` (`None`: the system's); offers no ALPN.
    pub fn new(roots: Option<Arc<RootCertStore>>) -> TlsClient {
        TlsClient::with_alpn(roots, &[])
    }

    /// The same, offering `alpn` (the HTTP client offers `http/1.1`).
    pub fn with_alpn(
        roots: Option<Arc<RootCertStore>>,
        alpn: &'static [&'static [u8]],
    ) -> TlsClient {
        TlsClient {
            roots,
            alpn,
            verified: OnceLock::new(),
            unverified: OnceLock::new(),
        }
    }

    /// A client sharing this one's roots, offering `alpn`.
    pub fn for_alpn(&self, alpn: &'static [&'static [u8]]) -> TlsClient {
        TlsClient::with_alpn(self.roots.clone(), alpn)
    }

    /// The config for `verify` on or off.
    pub fn config(&self, verify: bool) -> Result<Arc<ClientConfig>, String> {
        let slot = if verify {
            &self.verified
        } else {
            &self.unverified
        };
        slot.get_or_init(|| {
            let roots = match &self.roots {
                Some(r) => r.clone(),
                // Unverified handshakes never read the bundle.
                None if !verify => Arc::new(RootCertStore::empty()),
                None => Arc::new(ferrisix_tls::settings::system_roots()),
            };
            ferrisix_tls::upstream::client_config(roots, verify, self.alpn).map(Arc::new)
        })
        .clone()
    }

    /// Completes a TLS handshake over `tcp`. `server_name` is sent as SNI and verified
    /// (an IP address sends no SNI, as nginx's); `verify` off accepts any certificate.
    pub async fn connect(
        &self,
        tcp: TcpStream,
        server_name: &str,
        verify: bool,
    ) -> Result<TlsStream<TcpStream>, String> {
        let config = self.config(verify)?;
        let name = ferrisix_tls::upstream::server_name(server_name)
            .ok_or_else(|| format!("invalid server name {server_name:?}"))?;
        TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())
    }
}
