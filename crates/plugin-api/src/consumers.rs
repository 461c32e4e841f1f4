//! Consumers as authentication plugins find them: one [`ConsumerIndex`] per snapshot, built
//! by the proxy from the consumers, their credentials and their groups, and handed to every
//! request whose plugins authenticate.
//!
//! An auth plugin declares in its [`AuthDef`] which field of its consumer conf names a
//! credential (key-auth's `key`, basic-auth's `username`, hmac-auth's `key_id`); the index
//! maps that value to the [`Credential`] in one hash lookup, never a scan of the consumers.
//! What a plugin needs of a credential beyond its conf (jwt-auth's decoding key) it prepares
//! once when the index is built ([`AuthDef::prepare`]), not per request. Secrets stay in the
//! index: its `Debug` prints usernames and counts only.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde_json::{Map, Value};

/// The consumer an auth plugin identified (`ctx.consumer`). The authentication work defines
/// how it is found; the request path only carries it: `$consumer_name`,
/// `$consumer_group_id`, the headers sent upstream and the consumer's plugins come from it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Consumer {
    pub username: String,
    pub group_id: Option<String>,
    /// The credential that matched (`X-Credential-Identifier`).
    pub credential_id: Option<String>,
    /// `labels.custom_id` (`X-Consumer-Custom-Id`).
    pub custom_id: Option<String>,
    /// The consumer's `labels` (`ctx.consumer.labels`: acl, attach-consumer-label).
    pub labels: Map<String, Value>,
    /// The consumer's plugins, merged with its group's.
    pub plugins: Map<String, Value>,
}

/// What a credential's conf compiles to, once per snapshot.
pub type Prepared = Arc<dyn Any + Send + Sync>;

/// Compiles one credential conf ([`AuthDef::prepare`]).
pub type PrepareFn = fn(&Value) -> Result<Prepared, String>;

/// How an auth plugin's credentials are indexed.
#[derive(Clone, Copy, Debug)]
pub struct AuthDef {
    /// The field of the consumer conf (defaults filled in) that names the credential: the
    /// lookup key.
    pub key_field: &'static str,
    /// Compiles one credential conf (decrypted, defaults filled in); an error leaves the
    /// credential out (logged without its secrets).
    pub prepare: Option<PrepareFn>,
}

/// One credential of one consumer for one auth plugin.
pub struct Credential {
    /// The consumer it authenticates as (`credential_id` set when it comes from a 3.x
    /// credential rather than the consumer's own plugins).
    pub consumer: Arc<Consumer>,
    /// The plugin's conf on the consumer or credential, decrypted, defaults filled in.
    pub conf: Value,
    /// What [`AuthDef::prepare`] made of it.
    pub prepared: Option<Prepared>,
}

impl Credential {
    /// The prepared value as `T`.
    pub fn prepared<T: Any>(&self) -> Option<&T> {
        self.prepared.as_deref()?.downcast_ref()
    }

    /// A string field of the conf.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.conf.get(name).and_then(Value::as_str)
    }
}

impl fmt::Debug for Credential {
    /// The conf holds secrets: only the consumer and credential names are printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("consumer", &self.consumer.username)
            .field("credential_id", &self.consumer.credential_id)
            .finish_non_exhaustive()
    }
}

/// Every consumer's credentials, by auth plugin and key, and the consumers by username.
#[derive(Default)]
pub struct ConsumerIndex {
    by_plugin: HashMap<&'static str, HashMap<String, Arc<Credential>>>,
    by_name: HashMap<String, Arc<Consumer>>,
}

impl fmt::Debug for ConsumerIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counts: HashMap<&str, usize> = self
            .by_plugin
            .iter()
            .map(|(name, creds)| (*name, creds.len()))
            .collect();
        f.debug_struct("ConsumerIndex")
            .field("consumers", &self.by_name.len())
            .field("credentials", &counts)
            .finish()
    }
}

impl ConsumerIndex {
    /// The credential of `plugin` whose key field is `key`.
    pub fn find(&self, plugin: &str, key: &str) -> Option<&Arc<Credential>> {
        self.by_plugin.get(plugin)?.get(key)
    }

    /// Whether any consumer has a credential of `plugin`.
    pub fn has_plugin(&self, plugin: &str) -> bool {
        self.by_plugin.get(plugin).is_some_and(|m| !m.is_empty())
    }

    /// A consumer by username (`anonymous_consumer`, consumer-restriction).
    pub fn consumer(&self, username: &str) -> Option<&Arc<Consumer>> {
        self.by_name.get(username)
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Adds a consumer (by its username).
    pub fn add_consumer(&mut self, consumer: Arc<Consumer>) {
        self.by_name.insert(consumer.username.clone(), consumer);
    }

    /// Adds a credential of `plugin` under `key`; a later one with the same key replaces the
    /// earlier (as APISIX's consumer cache keeps the last one it reads).
    pub fn add_credential(&mut self, plugin: &'static str, key: String, credential: Credential) {
        self.by_plugin
            .entry(plugin)
            .or_default()
            .insert(key, Arc::new(credential));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn lookups_by_plugin_and_key() {
        let jack = Arc::new(Consumer {
            username: "jack".into(),
            ..Default::default()
        });
        let mut index = ConsumerIndex::default();
        index.add_consumer(jack.clone());
        index.add_credential(
            "key-auth",
            "k1".into(),
            Credential {
                consumer: jack.clone(),
                conf: json!({"key": "k1"}),
                prepared: Some(Arc::new(7u32)),
            },
        );
        let c = index.find("key-auth", "k1").unwrap();
        assert_eq!(c.consumer.username, "jack");
        assert_eq!(c.field("key"), Some("k1"));
        assert_eq!(c.prepared::<u32>(), Some(&7));
        assert_eq!(c.prepared::<u8>(), None);
        assert!(index.find("key-auth", "k2").is_none());
        assert!(index.find("basic-auth", "k1").is_none());
        assert!(index.has_plugin("key-auth") && !index.has_plugin("jwt-auth"));
        assert_eq!(index.consumer("jack").unwrap().username, "jack");
        // No secret in what is printed.
        let printed = format!("{index:?} {c:?}");
        assert!(!printed.contains("k1"), "{printed}");
    }
}
