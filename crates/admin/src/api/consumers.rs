//! What the Admin API does for consumers' secrets: APISIX's `check_duplicate_key` (an auth
//! plugin's key may name one consumer or credential only), and the plugins' `encrypt_fields`,
//! stored encrypted with the data encryption keyring and shown decrypted by `GET`.

use ferrisix_config::encrypt::{process_fields, FieldOp};
use ferrisix_config::model::ResourceKind;
use serde_json::Value;

use super::AdminApi;
use crate::response::Reply;

/// The resources whose values hold a `plugins` object.
fn has_plugins(resource: &str) -> bool {
    matches!(
        resource,
        "routes"
            | "services"
            | "plugin_configs"
            | "global_rules"
            | "consumers"
            | "credentials"
            | "consumer_groups"
    )
}

/// Who holds a credential key: a consumer, or one of its credentials.
#[derive(Debug, PartialEq, Eq)]
struct KeyOwner {
    username: String,
    credential_id: Option<String>,
}

impl AdminApi {
    /// Applies `op` to the `encrypt_fields` of every plugin in `conf.plugins` (APISIX's
    /// `encrypt_conf` / `decrypt_conf`), when `data_encryption.enable_encrypt_fields` is on.
    pub(crate) fn process_plugin_fields(&self, resource: &str, conf: &mut Value, op: FieldOp) {
        if !self.options().encrypt_fields || !has_plugins(resource) {
            return;
        }
        let registry = self.plugins();
        let Some(plugins) = conf.get_mut("plugins").and_then(Value::as_object_mut) else {
            return;
        };
        for (name, plugin_conf) in plugins.iter_mut() {
            let Some(info) = registry.get(name) else {
                continue;
            };
            if info.def.encrypt_fields.is_empty() || !plugin_conf.is_object() {
                continue;
            }
            // A field that does not decrypt is shown as stored (APISIX logs and keeps it).
            let _ = process_fields(
                &self.options().keyring,
                plugin_conf,
                info.def.encrypt_fields,
                op,
            );
        }
    }

    /// APISIX's `consumer.check_duplicate_key`: refuses an auth plugin key that another
    /// consumer or credential already holds. It reads the store's watched state (as APISIX
    /// reads its synced view), so a write a moment earlier may not be seen yet.
    pub(crate) fn check_duplicate_key(
        &self,
        plugins: Option<&Value>,
        username: &str,
        credential_id: Option<&str>,
    ) -> Result<(), Reply> {
        let Some(plugins) = plugins.and_then(Value::as_object) else {
            return Ok(());
        };
        let registry = self.plugins();
        let keyring = &self.options().keyring;
        let state = self.store.subscribe().borrow().clone();
        for (name, conf) in plugins {
            let Some(info) = registry.get(name) else {
                continue;
            };
            let Some(auth) = info.def.auth else {
                continue;
            };
            let Some(value) = conf.get(auth.key_field).and_then(Value::as_str) else {
                continue;
            };
            if value.starts_with("$secret://") || value.starts_with("$env://") {
                // A secret reference cannot be resolved at write time.
                continue;
            }
            // The stored key is encrypted when the plugin lists it in `encrypt_fields`; the
            // keyring's encryption is deterministic, so the new key is encrypted once and
            // compared with what is stored rather than decrypting every consumer's.
            let encrypted = (self.options().encrypt_fields
                && !keyring.is_empty()
                && info.def.encrypt_fields.contains(&auth.key_field))
            .then(|| keyring.encrypt(value));
            let holds = |doc: &Value| {
                doc.get("plugins")
                    .and_then(|p| p.get(name))
                    .and_then(|c| c.get(auth.key_field))
                    .and_then(Value::as_str)
                    .is_some_and(|stored| stored == value || encrypted.as_deref() == Some(stored))
            };
            // APISIX's runtime match is the last one loaded, in key order: a consumer's key
            // sorts before its credentials'.
            let mut owners: Vec<(String, KeyOwner)> = Vec::new();
            for item in state.items(ResourceKind::Consumers) {
                if holds(&item.value.parse()) {
                    owners.push((
                        item.id.clone(),
                        KeyOwner {
                            username: item.id.clone(),
                            credential_id: None,
                        },
                    ));
                }
            }
            for item in state.items(ResourceKind::Credentials) {
                if let Some((user, cred)) = item.id.split_once("/credentials/") {
                    if holds(&item.value.parse()) {
                        owners.push((
                            item.id.clone(),
                            KeyOwner {
                                username: user.to_owned(),
                                credential_id: Some(cred.to_owned()),
                            },
                        ));
                    }
                }
            }
            owners.sort_by(|a, b| a.0.cmp(&b.0));
            let Some((_, owner)) = owners.pop() else {
                continue;
            };
            let is_self = match credential_id {
                Some(id) => {
                    owner.username == username && owner.credential_id.as_deref() == Some(id)
                }
                None => owner.username == username,
            };
            if !is_self {
                let desc = match &owner.credential_id {
                    Some(c) => format!("credential: {c} of consumer: {}", owner.username),
                    None => format!("consumer: {}", owner.username),
                };
                return Err(Reply::bad_request(format!(
                    "duplicate {} of plugin {name} found with {desc}",
                    auth.key_field
                )));
            }
        }
        Ok(())
    }
}
