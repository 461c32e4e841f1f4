//! The TLS side of HTTP/3 over QUIC. A QUIC endpoint takes one rustls `ServerConfig` for all its
//! connections, so the ssl is chosen inside it: [`SniResolver`] looks the handshake's SNI (or
//! `fallback_sni`) up in the current [`CertStore`], exactly as [`crate::accept`] does on TCP,
//! and hands the handshake to that ssl's own certificate resolver (its RSA/ECDSA pairs, OCSP
//! staples included). QUIC speaks TLS 1.3 only, with ALPN `h3`.
//!
//! Not carried over from TCP: an ssl with client certificate verification is refused over QUIC
//! (one config cannot hold each ssl's verifier; the handshake fails and the client falls back
//! to TCP), and sessions are not resumed (no tickets, no session cache), which
//! also keeps 0-RTT and its replays out.

use std::sync::Arc;

use rustls::server::{ClientHello, NoServerSessionStorage, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

use crate::accept::{AcceptError, ClientVerify, TlsConnInfo};
use crate::store::CertStore;

/// HTTP/3's ALPN token.
pub const ALPN_H3: &[u8] = b"h3";

/// Where the resolver reads the ssls from: the current configuration snapshot's store.
pub type StoreSource = Arc<dyn Fn() -> Arc<CertStore> + Send + Sync>;

/// Chooses each QUIC handshake's certificate by SNI from the current store.
pub struct SniResolver {
    store: StoreSource,
}

impl std::fmt::Debug for SniResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SniResolver")
    }
}

/// The SNI as the store matches it (lower-case, no trailing dot).
fn client_sni(hello: &ClientHello<'_>) -> Option<String> {
    hello
        .server_name()
        .map(|s| s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase())
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let store = (self.store)();
        let sni = client_sni(&hello);
        let Some(name) = store.effective_sni(sni.as_deref()) else {
            tracing::error!("QUIC: {}", AcceptError::NoCertificate(None));
            return None;
        };
        let Some(entry) = store.lookup(&name) else {
            tracing::error!("QUIC: {}", AcceptError::NoCertificate(Some(name)));
            return None;
        };
        match entry.quic_resolver() {
            Ok(resolver) => resolver.resolve(hello),
            Err(e) => {
                tracing::info!(ssl = %entry.id, "QUIC handshake refused: {e}");
                None
            }
        }
    }
}

/// The rustls config of a QUIC endpoint: TLS 1.3, ALPN `h3`, certificates by SNI from
/// `store`, no client certificates, no resumption, no early data.
pub fn server_config(store: StoreSource) -> Result<ServerConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(SniResolver { store }));
    config.alpn_protocols = vec![ALPN_H3.to_vec()];
    // 0-RTT off: early data can be replayed (QUIC allows 0 or u32::MAX only).
    config.max_early_data_size = 0;
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(NoServerSessionStorage {});
    Ok(config)
}

/// What the request path knows of a QUIC connection, from the SNI its handshake carried:
/// the ssl is looked up again in `store` (the one the handshake used unless the
/// configuration changed in between).
pub fn conn_info(store: &CertStore, sni: Option<String>) -> Result<TlsConnInfo, AcceptError> {
    let sni = sni.map(|s| s.strip_suffix('.').unwrap_or(&s).to_ascii_lowercase());
    let name = store
        .effective_sni(sni.as_deref())
        .ok_or(AcceptError::NoCertificate(None))?;
    let entry = store
        .lookup(&name)
        .cloned()
        .ok_or(AcceptError::NoCertificate(Some(name)))?;
    if let Err(e) = entry.quic_resolver() {
        return Err(AcceptError::Unusable(format!("ssl {}: {e}", entry.id)));
    }
    Ok(TlsConnInfo {
        sni,
        ssl: entry,
        client_verify: ClientVerify::None,
        h2: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::TlsContext;
    use ferrisix_config::model::Ssl;
    use rustls::pki_types::ServerName;

    fn pem(name: &str) -> String {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/tls/");
        std::fs::read_to_string(format!("{dir}{name}")).unwrap()
    }

    fn ssl(id: &str, sni: &str, file: &str, protocols: Option<&[&str]>) -> Ssl {
        Ssl {
            id: id.into(),
            cert: pem(&format!("{file}.crt")),
            key: pem(&format!("{file}.key")),
            snis: vec![sni.into()],
            enabled: true,
            ssl_protocols: protocols.map(|p| p.iter().map(|s| (*s).to_owned()).collect()),
            ..Ssl::default()
        }
    }

    fn store() -> Arc<CertStore> {
        let ssls = [
            ssl("1", "server.local", "server", None),
            ssl("2", "other.local", "other", None),
            ssl("3", "old.local", "server", Some(&["TLSv1.2"])),
        ];
        let (store, refused) =
            CertStore::build(&ssls, &CertStore::default(), &TlsContext::default());
        assert!(refused.is_empty(), "{refused:?}");
        Arc::new(store)
    }

    /// A TLS 1.3 handshake in memory against the QUIC config; the leaf certificate served.
    fn handshake(config: Arc<ServerConfig>, sni: &str) -> Result<Vec<u8>, rustls::Error> {
        let mut roots = rustls::RootCertStore::empty();
        let ca = ferrisix_config::pem::parse_certs(&pem("ca.crt"))
            .unwrap()
            .remove(0);
        roots.add(ca).unwrap();
        let mut client_config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        client_config.alpn_protocols = vec![ALPN_H3.to_vec()];
        let name = ServerName::try_from(sni.to_owned()).unwrap();
        let mut client = rustls::ClientConnection::new(Arc::new(client_config), name).unwrap();
        let mut server = rustls::ServerConnection::new(config).unwrap();
        for _ in 0..10 {
            let mut buf = Vec::new();
            client.write_tls(&mut buf).unwrap();
            server.read_tls(&mut buf.as_slice()).unwrap();
            server.process_new_packets()?;
            let mut buf = Vec::new();
            server.write_tls(&mut buf).unwrap();
            client.read_tls(&mut buf.as_slice()).unwrap();
            client.process_new_packets()?;
            if !client.is_handshaking() && !server.is_handshaking() {
                assert_eq!(server.alpn_protocol(), Some(ALPN_H3));
                let leaf = client.peer_certificates().unwrap()[0].to_vec();
                return Ok(leaf);
            }
        }
        panic!("handshake did not finish");
    }

    #[test]
    fn the_sni_picks_the_ssl_and_its_certificate() {
        let store = store();
        let source = store.clone();
        let config = Arc::new(server_config(Arc::new(move || source.clone())).unwrap());
        assert_eq!(config.max_early_data_size, 0, "no 0-RTT");
        assert_eq!(config.send_tls13_tickets, 0, "no resumption");
        let leaf_of = |file: &str| {
            ferrisix_config::pem::parse_certs(&pem(&format!("{file}.crt")))
                .unwrap()
                .remove(0)
                .to_vec()
        };
        assert_eq!(
            handshake(config.clone(), "server.local").unwrap(),
            leaf_of("server")
        );
        assert_eq!(
            handshake(config.clone(), "other.local").unwrap(),
            leaf_of("other")
        );
        // No ssl for the name, and an ssl without TLS 1.3: the handshake fails.
        assert!(handshake(config.clone(), "none.local").is_err());
        assert!(handshake(config, "old.local").is_err());
        assert!(conn_info(&store, Some("Other.Local.".into())).is_ok_and(|i| i.ssl.id == "2"));
        assert!(matches!(
            conn_info(&store, Some("old.local".into())),
            Err(AcceptError::Unusable(_))
        ));
        assert!(matches!(
            conn_info(&store, None),
            Err(AcceptError::NoCertificate(None))
        ));
    }
}
