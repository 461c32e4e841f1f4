//! One rustls `ServerConfig` per ssl: its certificate pairs, its protocols, and its client
//! certificate policy.

use std::sync::Arc;

use arc_swap::ArcSwap;
use ferrisix_config::model::{Ssl, SslClient};
use ferrisix_config::pem;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};

use crate::ocsp::{KeySlots, OcspStapler};
use crate::resumption::{Scope, ScopedSessions, ScopedTicketer};
use crate::settings::{protocol_versions, TlsSettings};

/// ALPN for listeners with HTTP/2 (`h2` preferred, as nginx's `http2 on`).
pub const ALPN_H2: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// The certificate pairs of one ssl; the client's signature schemes (and, for TLS 1.2, its
/// cipher suites) choose between an RSA and an ECDSA certificate.
#[derive(Debug)]
pub struct PairResolver {
    /// Each pair swappable for a copy with a stapled OCSP answer ([`crate::ocsp`]).
    keys: Arc<KeySlots>,
    tls13: bool,
}

impl ResolvesServerCert for PairResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let schemes = hello.signature_schemes();
        let suites = hello.cipher_suites();
        let tls13 = self.tls13 && suites.iter().any(|s| crate::ciphers::is_tls13(*s));
        self.keys.iter().map(ArcSwap::load_full).find(|ck| {
            if ck.key.choose_scheme(schemes).is_none() {
                return false;
            }
            if tls13 {
                return true;
            }
            let ecdsa = !matches!(ck.key.algorithm(), rustls::SignatureAlgorithm::RSA);
            suites
                .iter()
                .any(|s| crate::ciphers::tls12_auth_is_ecdsa(*s) == Some(ecdsa))
        })
    }
}

/// Loads one certificate chain and key. A key that does not belong to the certificate is an
/// error of its own kind: APISIX stores such an ssl and fails its handshakes.
pub fn certified_key(
    cert: &str,
    key: &str,
    settings: &TlsSettings,
) -> Result<CertifiedKey, KeyError> {
    let chain = pem::parse_certs(cert)
        .map_err(|e| KeyError::Invalid(format!("failed to parse cert: {e}")))?;
    let der =
        pem::parse_key(key).map_err(|e| KeyError::Invalid(format!("failed to parse key: {e}")))?;
    let signing = settings
        .provider
        .key_provider
        .load_private_key(der)
        .map_err(|e| KeyError::Invalid(format!("failed to parse key: {e}")))?;
    let ck = CertifiedKey::new(chain, signing);
    match ck.keys_match() {
        Ok(()) => Ok(ck),
        // Keys whose public half rustls cannot derive are taken on trust.
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(ck),
        Err(_) => Err(KeyError::Mismatch(
            "the private key does not match the certificate (X509_check_private_key failed)"
                .to_owned(),
        )),
    }
}

#[derive(Debug)]
pub enum KeyError {
    /// Does not parse: the ssl is quarantined.
    Invalid(String),
    /// Parses but the key is not the certificate's: kept, every handshake fails.
    Mismatch(String),
}

/// How client certificates are treated on a connection.
#[derive(Debug, Clone)]
pub struct ClientPolicy {
    /// Verifies a presented chain (CA and depth); used after the handshake in lenient mode.
    pub verifier: Arc<DepthVerifier>,
    /// URIs served without a verified certificate; empty = verified in the handshake.
    pub skip_uri: Vec<regex::Regex>,
}

/// rustls's WebPKI verifier plus nginx's `ssl_verify_depth`.
#[derive(Debug)]
pub struct DepthVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    depth: u32,
    anchors: Vec<CertificateDer<'static>>,
}

impl DepthVerifier {
    /// The chain check alone (no signature over the handshake).
    pub fn verify_chain(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<(), String> {
        self.inner
            .verify_client_cert(end_entity, intermediates, now)
            .map_err(|e| e.to_string())?;
        // Certificates the client sent that are themselves trusted do not lengthen the chain.
        let between = intermediates
            .iter()
            .filter(|c| !self.anchors.iter().any(|a| a.as_ref() == c.as_ref()))
            .count() as u32;
        if between + 1 > self.depth.max(1) && !(self.depth == 0 && between == 0) {
            return Err(format!(
                "certificate chain too long ({} certificates, verify depth {})",
                between + 2,
                self.depth
            ));
        }
        Ok(())
    }
}

/// The handshake's client-certificate verifier. Strict (no `skip_mtls_uri_regex`): a verified
/// client certificate is required. Lenient: one is asked for but the handshake finishes
/// whatever comes, and the request path then decides (`skip_mtls_uri_regex`). Signatures over
/// the handshake are checked either way, so a certificate presented is one the client holds
/// the key of.
#[derive(Debug)]
struct HandshakeVerifier {
    chain: Arc<DepthVerifier>,
    lenient: bool,
}

impl ClientCertVerifier for HandshakeVerifier {
    fn client_auth_mandatory(&self) -> bool {
        !self.lenient
    }
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.chain.inner.root_hint_subjects()
    }
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        if self.lenient {
            return Ok(ClientCertVerified::assertion());
        }
        match self.chain.verify_chain(end_entity, intermediates, now) {
            Ok(()) => Ok(ClientCertVerified::assertion()),
            Err(e) => {
                tracing::info!("client certificate verification failed in handshake: {e}");
                self.chain
                    .inner
                    .verify_client_cert(end_entity, intermediates, now)?;
                Err(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::ApplicationVerificationFailure,
                ))
            }
        }
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.inner.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.inner.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.inner.supported_verify_schemes()
    }
}

fn client_policy(
    client: &SslClient,
    settings: &TlsSettings,
) -> Result<(ClientPolicy, Arc<dyn ClientCertVerifier>), String> {
    let cas =
        pem::parse_certs(&client.ca).map_err(|e| format!("failed to parse client cert: {e}"))?;
    let mut roots = RootCertStore::empty();
    for ca in &cas {
        roots
            .add(ca.clone())
            .map_err(|e| format!("failed to parse client cert: {e}"))?;
    }
    let inner =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), settings.provider.clone())
            .build()
            .map_err(|e| format!("failed to set client certificate verification: {e}"))?;
    let depth = Arc::new(DepthVerifier {
        inner,
        depth: client.depth,
        anchors: cas,
    });
    let skip_uri = client
        .skip_mtls_uri_regex
        .iter()
        .map(|r| {
            regex::Regex::new(r).map_err(|e| format!("invalid skip_mtls_uri_regex {r:?}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let verifier: Arc<dyn ClientCertVerifier> = Arc::new(HandshakeVerifier {
        chain: depth.clone(),
        lenient: !skip_uri.is_empty(),
    });
    Ok((
        ClientPolicy {
            verifier: depth,
            skip_uri,
        },
        verifier,
    ))
}

/// A server ssl compiled: the configs for listeners with and without HTTP/2, and the client
/// policy. `Err` in `configs` is a key mismatch: the handshake fails with that message.
pub struct ServerSsl {
    pub configs: Result<(Arc<ServerConfig>, Arc<ServerConfig>), String>,
    pub client: Option<ClientPolicy>,
    /// Its protocols include TLS 1.3 (QUIC's only one).
    pub tls13: bool,
}

/// Builds the server side of `ssl`. `Err` quarantines it (a PEM that does not parse). With
/// `ocsp` and `ocsp_stapling.enabled`, each certificate gets its answer stapled.
pub fn build(
    ssl: &Ssl,
    settings: &TlsSettings,
    ocsp: Option<&Arc<OcspStapler>>,
) -> Result<ServerSsl, String> {
    let mut keys = Vec::new();
    let mut mismatch = None;
    let pairs = std::iter::once((&ssl.cert, &ssl.key)).chain(ssl.certs.iter().zip(&ssl.keys));
    for (i, (cert, key)) in pairs.enumerate() {
        match certified_key(cert, key, settings) {
            Ok(ck) => keys.push(ArcSwap::from_pointee(ck)),
            Err(KeyError::Invalid(e)) if i == 0 => return Err(e),
            Err(KeyError::Invalid(e)) => {
                return Err(format!("failed to handle cert-key pair[{i}]: {e}"))
            }
            Err(KeyError::Mismatch(e)) => {
                let what = if i == 0 {
                    String::from("cert/key")
                } else {
                    format!("cert-key pair[{i}]")
                };
                mismatch.get_or_insert(format!("{what}: {e}"));
            }
        }
    }
    let versions = match &ssl.ssl_protocols {
        Some(names) => {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let (v, unsupported) = protocol_versions(&names);
            if !unsupported.is_empty() {
                tracing::warn!(ssl = %ssl.id, "ssl_protocols {unsupported:?} are not supported by rustls; left out");
            }
            v
        }
        None => settings.protocols.clone(),
    };
    let tls13 = versions.contains(&&rustls::version::TLS13);
    let (client, verifier) = match &ssl.client {
        Some(c) => {
            let (policy, verifier) = client_policy(c, settings)?;
            (Some(policy), Some(verifier))
        }
        None => (None, None),
    };
    if let Some(e) = mismatch {
        return Ok(ServerSsl {
            configs: Err(e),
            client,
            tls13,
        });
    }
    if versions.is_empty() {
        return Ok(ServerSsl {
            configs: Err(format!(
                "ssl_protocols {:?} leave no protocol this build supports",
                ssl.ssl_protocols.as_deref().unwrap_or_default()
            )),
            client,
            tls13,
        });
    }
    let builder = ServerConfig::builder_with_provider(settings.provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| format!("ssl_protocols: {e}"))?;
    let builder = match verifier {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let keys: Arc<KeySlots> = keys.into();
    if let (Some(stapler), Some(conf)) = (ocsp, ssl.ocsp_stapling.as_ref().filter(|o| o.enabled)) {
        for index in 0..keys.len() {
            stapler.staple(ssl.id.clone(), conf.clone(), Arc::downgrade(&keys), index);
        }
    }
    let mut config = builder.with_cert_resolver(Arc::new(PairResolver { keys, tls13 }));
    // Sessions resume only under the client policy they were made under.
    let scope = Scope::of(ssl);
    config.session_storage = ScopedSessions::new(settings.session_cache.clone(), scope);
    if let Some(t) = &settings.ticketer {
        config.ticketer = ScopedTicketer::new(t.clone(), scope);
    }
    config.ignore_client_order = false;
    config.max_early_data_size = 0;
    let mut http1 = config.clone();
    http1.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.alpn_protocols = ALPN_H2.iter().map(|p| p.to_vec()).collect();
    Ok(ServerSsl {
        configs: Ok((Arc::new(config), Arc::new(http1))),
        client,
        tls13,
    })
}
