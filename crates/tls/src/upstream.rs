//! Client configs for TLS upstreams (`scheme: https`/`grpcs`): certificate verification
//! (`tls.verify` against `ssl_trusted_certificate`; off by default, as nginx's
//! `proxy_ssl_verify off`), an optional client certificate (`tls.client_cert`/`client_key`, or an
//! ssl of type client by `tls.client_cert_id`), and ALPN for h2.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{WantsClientCert, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, ConfigBuilder, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::settings::TlsSettings;

/// A compiled upstream TLS setup.
#[derive(Clone)]
pub struct UpstreamTls {
    pub config: Arc<ClientConfig>,
    /// Tells configs apart in pool keys: same fingerprint, same verification, certificate and
    /// ALPN.
    pub fingerprint: u64,
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("fingerprint", &self.fingerprint)
            .field("alpn", &self.config.alpn_protocols)
            .finish()
    }
}

/// Accepts any server certificate but still checks the handshake signatures (what nginx does
/// with `proxy_ssl_verify off`: encryption without authentication).
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Always presents the one client certificate.
#[derive(Debug)]
struct OneClientCert(Arc<CertifiedKey>);

impl rustls::client::ResolvesClientCert for OneClientCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.0.key.choose_scheme(sigschemes)?;
        Some(self.0.clone())
    }
    fn has_certs(&self) -> bool {
        true
    }
}

impl UpstreamTls {
    /// `alpn`: `h2` for gRPC and HTTP/2 upstreams, `http/1.1` otherwise.
    /// `identity`: the client certificate and its fingerprint.
    pub fn new(
        settings: &TlsSettings,
        verify: bool,
        identity: Option<(Arc<CertifiedKey>, u64)>,
        alpn: &[&[u8]],
    ) -> Result<UpstreamTls, String> {
        // Upstreams get every suite and both versions rustls has: the listener's
        // `ssl_ciphers` and `ssl_protocols` are for clients (nginx's `proxy_ssl_*` defaults).
        let builder = verifying_builder(settings.trusted.clone(), verify)
            .map_err(|e| format!("tls.verify: {e}"))?;
        let mut fp_parts: Vec<Vec<u8>> = vec![vec![u8::from(verify)]];
        let mut config = match identity {
            Some((key, fp)) => {
                fp_parts.push(fp.to_le_bytes().to_vec());
                builder.with_client_cert_resolver(Arc::new(OneClientCert(key)))
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        fp_parts.extend(config.alpn_protocols.iter().cloned());
        let refs: Vec<&[u8]> = fp_parts.iter().map(Vec::as_slice).collect();
        Ok(UpstreamTls {
            config: Arc::new(config),
            fingerprint: crate::store::fingerprint(&refs),
        })
    }

    /// A client certificate given inline (`tls.client_cert` / `client_key`, PEM).
    pub fn identity_from_pem(
        cert: &str,
        key: &str,
        settings: &TlsSettings,
    ) -> Result<(Arc<CertifiedKey>, u64), String> {
        let ck = crate::server::certified_key(cert, key, settings).map_err(|e| match e {
            crate::server::KeyError::Invalid(e) | crate::server::KeyError::Mismatch(e) => e,
        })?;
        Ok((
            Arc::new(ck),
            crate::store::fingerprint(&[cert.as_bytes(), key.as_bytes()]),
        ))
    }
}

/// A client config builder that verifies servers against `trusted` when `verify`, and
/// otherwise accepts any certificate but still checks the handshake signatures.
fn verifying_builder(
    trusted: Arc<RootCertStore>,
    verify: bool,
) -> Result<ConfigBuilder<ClientConfig, WantsClientCert>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    Ok(if verify {
        let v = WebPkiServerVerifier::builder_with_provider(trusted, provider)
            .build()
            .map_err(|e| e.to_string())?;
        builder.with_webpki_verifier(v)
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
    })
}

/// A client config without a client certificate, for the plugins' calls out (log servers,
/// HTTPS endpoints): `ssl_verify` checks the server against `trusted`, the same CA bundle
/// as upstreams' `tls.verify`.
pub fn client_config(
    trusted: Arc<RootCertStore>,
    verify: bool,
    alpn: &[&[u8]],
) -> Result<ClientConfig, String> {
    let mut config = verifying_builder(trusted, verify)?.with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// The name sent as SNI (and verified) for a host: an IP address sends no SNI, as nginx's
/// `proxy_ssl_server_name` never sends one for an address.
pub fn server_name(host: &str) -> Option<ServerName<'static>> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
        return Some(ServerName::IpAddress(ip.into()));
    }
    ServerName::try_from(bare.to_owned()).ok()
}
