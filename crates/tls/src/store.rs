//! The certificates of one configuration snapshot, keyed by SNI the way APISIX's
//! `ssl/router/radixtree_sni.lua` keys them.
//!
//! APISIX reverses every SNI and puts it in a radixtree: `test.com` is the exact path
//! `moc.tset`, `*.test.com` the prefix `moc.tset.`. A lookup reverses the client's SNI, takes an
//! exact match first, else the longest prefix; then a wildcard must cover one label only, so
//! `a.b.test.com` is refused by `*.test.com` (and is not handed to a shorter wildcard either).
//! Of two ssls with the same SNI the first one stored (in creation order) serves.

use std::collections::HashMap;
use std::sync::Arc;

use ferrisix_config::model::{Ssl, SslType};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

use crate::server::{self, ClientPolicy};
use crate::settings::TlsContext;

/// One server ssl as handshakes use it.
pub struct SslEntry {
    pub id: String,
    /// The SNIs as APISIX holds them: reversed, `*` kept.
    snis_rev: Vec<String>,
    sni_list: bool,
    /// With and without `h2` in ALPN; `Err` when its key does not match its certificate.
    configs: Result<(Arc<ServerConfig>, Arc<ServerConfig>), String>,
    pub client: Option<ClientPolicy>,
    /// Its protocols include TLS 1.3.
    tls13: bool,
    source: Ssl,
}

impl std::fmt::Debug for SslEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SslEntry")
            .field("id", &self.id)
            .field("snis", &self.source.snis)
            .field("usable", &self.configs.is_ok())
            .finish()
    }
}

impl SslEntry {
    /// The server config for a listener with (or without) HTTP/2; `Err` explains why every
    /// handshake on this ssl fails.
    pub fn config(&self, http2: bool) -> Result<Arc<ServerConfig>, &str> {
        match &self.configs {
            Ok((h2, h1)) => Ok(if http2 { h2.clone() } else { h1.clone() }),
            Err(e) => Err(e),
        }
    }

    /// The certificate resolver of its HTTP/2 listeners' config, for a QUIC handshake
    /// ([`crate::quic`]); `Err` says why this ssl cannot serve one.
    pub fn quic_resolver(
        &self,
    ) -> Result<Arc<dyn rustls::server::ResolvesServerCert>, std::borrow::Cow<'_, str>> {
        let (config, _) = self.configs.as_ref().map_err(|e| e.as_str())?;
        if !self.tls13 {
            return Err("its ssl_protocols leave out TLSv1.3, the only version QUIC uses".into());
        }
        if self.client.is_some() {
            // One QUIC endpoint config serves every SNI, so a per-ssl client certificate
            // policy cannot be applied; the client keeps to TCP for this ssl.
            return Err(
                "client certificate verification (client.ca) is served over TCP only".into(),
            );
        }
        Ok(config.cert_resolver.clone())
    }

    pub fn snis(&self) -> &[String] {
        &self.source.snis
    }
}

/// A certificate presented to upstreams (`ssls` of type `client`, `tls.client_cert_id`).
pub struct ClientIdentity {
    pub id: String,
    pub key: Arc<CertifiedKey>,
    /// Identifies the certificate in pool keys.
    pub fingerprint: u64,
    source: Ssl,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("id", &self.id)
            .finish()
    }
}

/// The `ssls` of a snapshot.
#[derive(Default)]
pub struct CertStore {
    entries: Vec<Arc<SslEntry>>,
    /// Reversed exact SNI → entry index.
    exact: HashMap<String, usize>,
    /// Reversed wildcard prefixes (without the `*`), longest first, with their entry.
    prefixes: Vec<(String, usize)>,
    by_id: HashMap<String, Arc<SslEntry>>,
    clients: HashMap<String, Arc<ClientIdentity>>,
    fallback_sni: Option<String>,
}

impl std::fmt::Debug for CertStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertStore")
            .field("server", &self.entries.len())
            .field("client", &self.clients.len())
            .finish()
    }
}

/// An ssl that could not be compiled, with APISIX's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub id: String,
    pub error: String,
}

pub(crate) fn fingerprint(bytes: &[&[u8]]) -> u64 {
    // FNV-1a: stable across runs and cheap; it only has to tell certificates apart.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        for x in b.iter() {
            h ^= u64::from(*x);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl CertStore {
    /// Compiles `ssls` (already decrypted and validated, in creation order), reusing entries of
    /// `previous` whose definition did not change. Each ssl that fails is refused on its own.
    pub fn build<'a>(
        ssls: impl IntoIterator<Item = &'a Ssl>,
        previous: &CertStore,
        ctx: &TlsContext,
    ) -> (CertStore, Vec<Refused>) {
        let mut store = CertStore {
            fallback_sni: ctx.settings.fallback_sni.clone(),
            ..CertStore::default()
        };
        let mut refused = Vec::new();
        for ssl in ssls {
            match ssl.ssl_type {
                SslType::Client => {
                    if let Some(prev) = previous.clients.get(&ssl.id).filter(|c| c.source == *ssl) {
                        store.clients.insert(ssl.id.clone(), prev.clone());
                        continue;
                    }
                    match server::certified_key(&ssl.cert, &ssl.key, &ctx.settings) {
                        Ok(key) => {
                            let fingerprint =
                                fingerprint(&[ssl.cert.as_bytes(), ssl.key.as_bytes()]);
                            store.clients.insert(
                                ssl.id.clone(),
                                Arc::new(ClientIdentity {
                                    id: ssl.id.clone(),
                                    key: Arc::new(key),
                                    fingerprint,
                                    source: ssl.clone(),
                                }),
                            );
                        }
                        Err(server::KeyError::Invalid(e) | server::KeyError::Mismatch(e)) => {
                            refused.push(Refused {
                                id: ssl.id.clone(),
                                error: e,
                            })
                        }
                    }
                }
                SslType::Server => {
                    if !ssl.enabled || ssl.snis.is_empty() {
                        continue;
                    }
                    let entry = match previous.by_id.get(&ssl.id).filter(|e| e.source == *ssl) {
                        Some(e) => e.clone(),
                        None => match server::build(ssl, &ctx.settings, ctx.ocsp.as_ref()) {
                            Ok(built) => {
                                if let Err(e) = &built.configs {
                                    tracing::error!(
                                        ssl = %ssl.id,
                                        snis = ?ssl.snis,
                                        "ssl kept but unusable, its handshakes will fail: {e}"
                                    );
                                }
                                Arc::new(SslEntry {
                                    id: ssl.id.clone(),
                                    snis_rev: ssl
                                        .snis
                                        .iter()
                                        .map(|s| s.chars().rev().collect())
                                        .collect(),
                                    sni_list: ssl.sni_list,
                                    configs: built.configs,
                                    client: built.client,
                                    tls13: built.tls13,
                                    source: ssl.clone(),
                                })
                            }
                            Err(error) => {
                                refused.push(Refused {
                                    id: ssl.id.clone(),
                                    error,
                                });
                                continue;
                            }
                        },
                    };
                    store.insert(entry);
                }
            }
        }
        store.prefixes.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
        (store, refused)
    }

    fn insert(&mut self, entry: Arc<SslEntry>) {
        let idx = self.entries.len();
        for rev in &entry.snis_rev {
            match rev.strip_suffix('*') {
                Some(prefix) => {
                    if !self.prefixes.iter().any(|(p, _)| p == prefix) {
                        self.prefixes.push((prefix.to_owned(), idx));
                    }
                }
                None => {
                    self.exact.entry(rev.clone()).or_insert(idx);
                }
            }
        }
        self.by_id.insert(entry.id.clone(), entry.clone());
        self.entries.push(entry);
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The ssl serving `sni` (lower-case, no trailing dot), as APISIX's `match_and_set`.
    pub fn lookup(&self, sni: &str) -> Option<&Arc<SslEntry>> {
        let rev: String = sni.chars().rev().collect();
        if let Some(&i) = self.exact.get(&rev) {
            return self.entries.get(i);
        }
        let &(ref prefix, i) = self
            .prefixes
            .iter()
            .find(|(p, _)| rev.starts_with(p.as_str()))?;
        let entry = self.entries.get(i)?;
        let _ = prefix;
        // The post-match check of radixtree_sni.lua, on the reversed name: from the position
        // of the matched SNI's last character on there must be no further dot.
        let no_dot_from = |len: usize| {
            !rev.as_bytes()
                .get(len.saturating_sub(1)..)
                .is_some_and(|r| r.contains(&b'.'))
        };
        let ok = if entry.sni_list {
            entry
                .snis_rev
                .iter()
                .any(|m| *m == rev || no_dot_from(m.len()))
        } else {
            let m = &entry.snis_rev[0];
            m == "*" || no_dot_from(m.len())
        };
        ok.then_some(entry)
    }

    /// The SNI a handshake is matched with: the client's, else `fallback_sni`.
    pub fn effective_sni(&self, client_sni: Option<&str>) -> Option<String> {
        match client_sni {
            Some(s) => Some(s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase()),
            None => self.fallback_sni.clone(),
        }
    }

    /// Whether a server ssl has this id (an upstream's `tls.client_cert_id` naming it gets
    /// APISIX's "ssl type should be 'client'").
    pub fn has_server(&self, id: &str) -> bool {
        self.by_id.contains_key(id)
    }

    /// A client certificate for upstream mTLS, by ssl id.
    pub fn client_identity(&self, id: &str) -> Option<&Arc<ClientIdentity>> {
        self.clients.get(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ssl(id: &str, snis: &[&str], list: bool) -> Ssl {
        Ssl {
            id: id.into(),
            snis: snis.iter().map(|s| (*s).to_owned()).collect(),
            sni_list: list,
            enabled: true,
            ..Ssl::default()
        }
    }

    /// The matching alone, without certificates.
    fn store(ssls: &[Ssl]) -> CertStore {
        let mut s = CertStore::default();
        for ssl in ssls {
            s.insert(Arc::new(SslEntry {
                id: ssl.id.clone(),
                snis_rev: ssl.snis.iter().map(|x| x.chars().rev().collect()).collect(),
                sni_list: ssl.sni_list,
                configs: Err("test".into()),
                client: None,
                tls13: true,
                source: ssl.clone(),
            }));
        }
        s.prefixes.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
        s
    }

    fn hit(s: &CertStore, sni: &str) -> Option<String> {
        s.lookup(sni).map(|e| e.id.clone())
    }

    #[test]
    fn exact_and_wildcard_precedence() {
        let s = store(&[
            ssl("w", &["*.wild.test"], false),
            ssl("b", &["*.b.wild.test"], false),
            ssl("e", &["exact.wild.test"], false),
            ssl("t", &["test.com"], false),
            ssl("t2", &["test.com"], false),
        ]);
        assert_eq!(
            hit(&s, "test.com").as_deref(),
            Some("t"),
            "first stored wins"
        );
        assert_eq!(hit(&s, "exact.wild.test").as_deref(), Some("e"));
        assert_eq!(hit(&s, "x.wild.test").as_deref(), Some("w"));
        assert_eq!(hit(&s, "b.wild.test").as_deref(), Some("w"));
        assert_eq!(
            hit(&s, "x.b.wild.test").as_deref(),
            Some("b"),
            "longest wildcard"
        );
        assert_eq!(
            hit(&s, "y.x.b.wild.test"),
            None,
            "one label only, no fallback"
        );
        assert_eq!(hit(&s, "wild.test"), None);
        assert_eq!(hit(&s, "nothing.test"), None);
    }

    #[test]
    fn snis_list_and_catch_all() {
        let s = store(&[ssl("l", &["wild.test", "*.wild.test"], true)]);
        assert_eq!(hit(&s, "wild.test").as_deref(), Some("l"));
        assert_eq!(hit(&s, "a.wild.test").as_deref(), Some("l"));
        assert_eq!(hit(&s, "a.b.wild.test"), None);
        let all = store(&[ssl("all", &["*"], false)]);
        assert_eq!(hit(&all, "any.thing.test").as_deref(), Some("all"));
    }
}
