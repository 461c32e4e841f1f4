//! Session resumption scoped to the policy a session was made under.
//!
//! One session cache (and one ticketer) serves every ssl, so sessions outlive configuration
//! changes that do not concern them. But a resumed handshake skips the client-certificate
//! request: a session made while an ssl asked for no certificate would, once the ssl requires
//! one, let a client in without it; and one made under another CA would carry a certificate
//! the new CA never vouched for. So each ssl's server config sees the shared cache and ticketer
//! through a [`Scope`]: a digest of the ssl's id and its `client` policy, prefixed to every
//! cache key and sealed inside every ticket. A session from another scope is simply not found,
//! and the client gets a full handshake under the current policy.

use std::sync::Arc;

use ferrisix_config::model::Ssl;
use rustls::server::{ProducesTickets, StoresServerSessions};

/// What a session is valid for: SHA-256 over the ssl's id and its client-certificate policy.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Scope([u8; 32]);

impl std::fmt::Debug for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hex: String = self.0[..6].iter().map(|b| format!("{b:02x}")).collect();
        write!(f, "Scope({hex}..)")
    }
}

impl Scope {
    /// The scope of `ssl`'s server sessions. Fields are length-prefixed so that no two
    /// policies share an encoding.
    pub fn of(ssl: &Ssl) -> Scope {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        let mut field = |bytes: &[u8]| {
            ctx.update(&(bytes.len() as u64).to_be_bytes());
            ctx.update(bytes);
        };
        field(ssl.id.as_bytes());
        match &ssl.client {
            None => field(b"no client certificate"),
            Some(client) => {
                field(b"client certificate");
                field(client.ca.as_bytes());
                field(&client.depth.to_be_bytes());
                field(&(client.skip_mtls_uri_regex.len() as u64).to_be_bytes());
                for r in &client.skip_mtls_uri_regex {
                    field(r.as_bytes());
                }
            }
        }
        let digest = ctx.finish();
        let mut out = [0u8; 32];
        out.copy_from_slice(digest.as_ref());
        Scope(out)
    }

    fn key(&self, key: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.0.len() + key.len());
        out.extend_from_slice(&self.0);
        out.extend_from_slice(key);
        out
    }
}

/// The shared session cache as one scope sees it: keys (TLS 1.2 session ids, TLS 1.3
/// stateful tickets) are prefixed with the scope.
#[derive(Debug)]
pub struct ScopedSessions {
    inner: Arc<dyn StoresServerSessions>,
    scope: Scope,
}

impl ScopedSessions {
    pub fn new(inner: Arc<dyn StoresServerSessions>, scope: Scope) -> Arc<ScopedSessions> {
        Arc::new(ScopedSessions { inner, scope })
    }
}

impl StoresServerSessions for ScopedSessions {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.inner.put(self.scope.key(&key), value)
    }
    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner.get(&self.scope.key(key))
    }
    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner.take(&self.scope.key(key))
    }
    fn can_cache(&self) -> bool {
        self.inner.can_cache()
    }
}

/// The shared ticketer as one scope sees it: the scope is sealed with the session, and a
/// ticket from another scope does not open.
#[derive(Debug)]
pub struct ScopedTicketer {
    inner: Arc<dyn ProducesTickets>,
    scope: Scope,
}

impl ScopedTicketer {
    pub fn new(inner: Arc<dyn ProducesTickets>, scope: Scope) -> Arc<ScopedTicketer> {
        Arc::new(ScopedTicketer { inner, scope })
    }
}

impl ProducesTickets for ScopedTicketer {
    fn enabled(&self) -> bool {
        self.inner.enabled()
    }
    fn lifetime(&self) -> u32 {
        self.inner.lifetime()
    }
    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.inner.encrypt(&self.scope.key(plain))
    }
    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        let plain = self.inner.decrypt(cipher)?;
        plain
            .strip_prefix(self.scope.0.as_slice())
            .map(<[u8]>::to_vec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrisix_config::model::SslClient;

    fn ssl(id: &str, client: Option<(&str, u32, &[&str])>) -> Ssl {
        Ssl {
            id: id.into(),
            client: client.map(|(ca, depth, skip)| SslClient {
                ca: ca.into(),
                depth,
                skip_mtls_uri_regex: skip.iter().map(|s| (*s).to_owned()).collect(),
            }),
            ..Ssl::default()
        }
    }

    #[test]
    fn scope_follows_the_ssl_and_its_client_policy_only() {
        let base = Scope::of(&ssl("1", None));
        let mut other_cert = ssl("1", None);
        other_cert.cert = "another certificate".into();
        assert_eq!(
            base,
            Scope::of(&other_cert),
            "a new certificate keeps sessions"
        );
        let policies = [
            ssl("1", None),
            ssl("2", None),
            ssl("1", Some(("CA", 1, &[]))),
            ssl("1", Some(("CA2", 1, &[]))),
            ssl("1", Some(("CA", 2, &[]))),
            ssl("1", Some(("CA", 1, &["^/open"]))),
            ssl("1", Some(("CA", 1, &["^/open", ""]))),
        ];
        let scopes: Vec<Scope> = policies.iter().map(Scope::of).collect();
        for (i, a) in scopes.iter().enumerate() {
            for (j, b) in scopes.iter().enumerate() {
                assert_eq!(a == b, i == j, "{:?} vs {:?}", policies[i], policies[j]);
            }
        }
    }

    #[test]
    fn cache_and_tickets_do_not_cross_scopes() {
        let shared = rustls::server::ServerSessionMemoryCache::new(16);
        let a = ScopedSessions::new(shared.clone(), Scope::of(&ssl("1", None)));
        let b = ScopedSessions::new(shared.clone(), Scope::of(&ssl("1", Some(("CA", 1, &[])))));
        assert!(a.put(b"id".to_vec(), b"session".to_vec()));
        assert_eq!(b.get(b"id"), None);
        assert_eq!(b.take(b"id"), None);
        assert_eq!(a.get(b"id").as_deref(), Some(&b"session"[..]));
        assert_eq!(a.take(b"id").as_deref(), Some(&b"session"[..]));
        assert_eq!(a.get(b"id"), None, "taken once");

        let ticketer = rustls::crypto::ring::Ticketer::new().unwrap();
        let a = ScopedTicketer::new(ticketer.clone(), Scope::of(&ssl("1", None)));
        let b = ScopedTicketer::new(ticketer, Scope::of(&ssl("1", Some(("CA", 1, &[])))));
        let ticket = a.encrypt(b"session").unwrap();
        assert_eq!(a.decrypt(&ticket).as_deref(), Some(&b"session"[..]));
        assert_eq!(b.decrypt(&ticket), None);
    }
}
