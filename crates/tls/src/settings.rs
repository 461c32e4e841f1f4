//! `apisix.ssl` turned into what rustls needs: the crypto provider with the chosen suites, the
//! protocol versions, one session cache (and ticketer) shared by every ssl's config so a
//! session resumes across configuration changes (each ssl sees it through its
//! [`crate::resumption::Scope`]), and the CA bundle for upstream verification.

use std::path::Path;
use std::sync::Arc;

use ferrisix_config::encrypt::Keyring;
use ferrisix_config::settings::SslSettings;
use rustls::crypto::CryptoProvider;
use rustls::server::{ProducesTickets, StoresServerSessions};
use rustls::{RootCertStore, SupportedProtocolVersion};

/// Sessions kept for resumption by session id (nginx `ssl_session_cache shared:SSL:20m` holds
/// about 80k; one entry here is a few hundred bytes).
const SESSION_CACHE_ENTRIES: usize = 20_000;

/// The TLS settings every ssl's server config is built with.
#[derive(Clone)]
pub struct TlsSettings {
    pub provider: Arc<CryptoProvider>,
    pub protocols: Vec<&'static SupportedProtocolVersion>,
    pub fallback_sni: Option<String>,
    pub session_cache: Arc<dyn StoresServerSessions>,
    /// `ssl_session_tickets: true` (stateless tickets); `None` keeps resumption in the cache.
    pub ticketer: Option<Arc<dyn ProducesTickets>>,
    /// CA bundle for upstreams with `tls.verify` (`ssl_trusted_certificate`, default the
    /// system's).
    pub trusted: Arc<RootCertStore>,
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("protocols", &self.protocols)
            .field("suites", &self.provider.cipher_suites.len())
            .field("fallback_sni", &self.fallback_sni)
            .field("tickets", &self.ticketer.is_some())
            .field("trusted", &self.trusted.len())
            .finish()
    }
}

/// `ssl_protocols` names mapped to rustls versions. TLS 1.1 and older do not exist in rustls;
/// they are left out (with a warning from [`TlsSettings::new`]).
pub fn protocol_versions(names: &[&str]) -> (Vec<&'static SupportedProtocolVersion>, Vec<String>) {
    let mut out = Vec::new();
    let mut unsupported = Vec::new();
    for n in names {
        match *n {
            "TLSv1.2" => out.push(&rustls::version::TLS12),
            "TLSv1.3" => out.push(&rustls::version::TLS13),
            other => unsupported.push(other.to_owned()),
        }
    }
    (out, unsupported)
}

impl TlsSettings {
    /// Builds the settings; relative paths resolve against `base_dir`. Errors name the key.
    pub fn new(ssl: &SslSettings, base_dir: &Path) -> Result<TlsSettings, String> {
        let suites = crate::ciphers::parse(&ssl.ssl_ciphers)?;
        let provider = CryptoProvider {
            cipher_suites: suites,
            ..rustls::crypto::ring::default_provider()
        };
        let names: Vec<&str> = ssl.ssl_protocols.split_whitespace().collect();
        let (protocols, unsupported) = protocol_versions(&names);
        for p in unsupported {
            tracing::warn!("apisix.ssl.ssl_protocols: {p} is not supported (rustls speaks TLSv1.2 and TLSv1.3 only); left out");
        }
        if protocols.is_empty() {
            return Err(format!(
                "apisix.ssl.ssl_protocols: {:?} enables no protocol this build supports (TLSv1.2, TLSv1.3)",
                ssl.ssl_protocols
            ));
        }
        let ticketer = if ssl.ssl_session_tickets {
            Some(rustls::crypto::ring::Ticketer::new().map_err(|e| e.to_string())?)
        } else {
            None
        };
        let trusted = match ssl.ssl_trusted_certificate.as_deref() {
            None | Some("system") => system_roots(),
            Some(path) => {
                let path = if Path::new(path).is_absolute() {
                    Path::new(path).to_owned()
                } else {
                    base_dir.join(path)
                };
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    format!(
                        "apisix.ssl.ssl_trusted_certificate: cannot read {}: {e}",
                        path.display()
                    )
                })?;
                let certs = ferrisix_config::pem::parse_certs(&text).map_err(|e| {
                    format!(
                        "apisix.ssl.ssl_trusted_certificate: {}: {e}",
                        path.display()
                    )
                })?;
                let mut roots = RootCertStore::empty();
                roots.add_parsable_certificates(certs);
                roots
            }
        };
        Ok(TlsSettings {
            provider: Arc::new(provider),
            protocols,
            fallback_sni: ssl
                .fallback_sni
                .as_deref()
                .map(|s| s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase()),
            session_cache: rustls::server::ServerSessionMemoryCache::new(SESSION_CACHE_ENTRIES),
            ticketer,
            trusted: Arc::new(trusted),
        })
    }
}

impl Default for TlsSettings {
    /// APISIX's default `apisix.ssl`.
    fn default() -> Self {
        TlsSettings::new(&SslSettings::default(), Path::new("."))
            .expect("the default settings are valid")
    }
}

/// The system's CA bundle (`ssl_trusted_certificate: system`).
pub fn system_roots() -> RootCertStore {
    let mut roots = RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(found.certs);
    roots
}

/// What compiling `ssls` and TLS upstreams needs: the settings and the keyring that decrypts
/// stored keys.
#[derive(Clone, Debug)]
pub struct TlsContext {
    pub settings: TlsSettings,
    pub keyring: Keyring,
    /// Staples OCSP answers for the ssls that ask (`ocsp_stapling.enabled`) when the
    /// ocsp-stapling plugin is enabled; `None`: no stapling.
    pub ocsp: Option<std::sync::Arc<crate::ocsp::OcspStapler>>,
}

impl Default for TlsContext {
    /// APISIX's defaults: default `apisix.ssl`, default keyring.
    fn default() -> Self {
        TlsContext {
            settings: TlsSettings::default(),
            keyring: Keyring::apisix_default(),
            ocsp: None,
        }
    }
}

impl TlsContext {
    pub fn new(settings: TlsSettings, keyring: Keyring) -> TlsContext {
        TlsContext {
            settings,
            keyring,
            ocsp: None,
        }
    }

    /// This context stapling OCSP answers with `stapler` (the ocsp-stapling plugin enabled).
    pub fn with_ocsp(mut self, stapler: std::sync::Arc<crate::ocsp::OcspStapler>) -> TlsContext {
        self.ocsp = Some(stapler);
        self
    }
}
