//! APISIX's `apisix.data_encryption`: stored secrets (ssl private keys, upstream client keys,
//! the fields a plugin lists in `encrypt_fields`) are kept AES-CBC encrypted and base64-encoded,
//! so an APISIX node and a ferrisix node sharing one etcd read each other's values.
//!
//! The algorithm is APISIX's `core/data_encryption.lua`: each keyring entry is both the key and
//! the IV (16 bytes: AES-128-CBC, 32 bytes: AES-256-CBC), PKCS#7 padding, standard base64.
//! Encryption uses the first entry; decryption tries each entry in order, so a new key is put
//! first and the old ones kept below it (key rotation by keyring order).
//!
//! This lives in the config crate because encryption is a property of what is stored: the
//! Admin API encrypts on write, the data plane decrypts on compile, and both read it from here.
//! Its dependencies (RustCrypto's `aes` and `cbc`, `base64`) are small and pure Rust.

use aes::cipher::{block_padding::Pkcs7, BlockDecryptMut, BlockEncryptMut, KeyIvInit};
use base64::Engine as _;
use serde_json::Value;

/// APISIX's default keyring (`apisix/cli/config.lua`).
pub const DEFAULT_KEYRING: [&str; 2] = ["qeddd145sfvddff3", "edd1c9f0985e76a2"];

#[derive(Clone, PartialEq, Eq)]
enum Cipher {
    Aes128([u8; 16]),
    Aes256([u8; 32]),
}

impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.write_str(match self {
            Cipher::Aes128(_) => "Aes128(..)",
            Cipher::Aes256(_) => "Aes256(..)",
        })
    }
}

impl Cipher {
    fn encrypt(&self, plain: &[u8]) -> Vec<u8> {
        match self {
            Cipher::Aes128(k) => cbc::Encryptor::<aes::Aes128>::new(k.into(), k.into())
                .encrypt_padded_vec_mut::<Pkcs7>(plain),
            Cipher::Aes256(k) => {
                let iv: [u8; 16] = k[..16].try_into().expect("32-byte key");
                // APISIX passes the key as the IV; OpenSSL reads only its first 16 bytes.
                cbc::Encryptor::<aes::Aes256>::new(k.into(), (&iv).into())
                    .encrypt_padded_vec_mut::<Pkcs7>(plain)
            }
        }
    }

    fn decrypt(&self, data: &[u8]) -> Option<Vec<u8>> {
        match self {
            Cipher::Aes128(k) => cbc::Decryptor::<aes::Aes128>::new(k.into(), k.into())
                .decrypt_padded_vec_mut::<Pkcs7>(data)
                .ok(),
            Cipher::Aes256(k) => {
                let iv: [u8; 16] = k[..16].try_into().expect("32-byte key");
                cbc::Decryptor::<aes::Aes256>::new(k.into(), (&iv).into())
                    .decrypt_padded_vec_mut::<Pkcs7>(data)
                    .ok()
            }
        }
    }
}

/// The ciphers of a keyring, first one encrypts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keyring {
    ciphers: Vec<Cipher>,
}

impl Keyring {
    /// Builds the keyring. Entries that are neither 16 nor 32 bytes are refused with the
    /// entry's position, as APISIX's CLI schema refuses them at startup.
    pub fn new<S: AsRef<str>>(keys: &[S]) -> Result<Keyring, String> {
        let mut ciphers = Vec::with_capacity(keys.len());
        for (i, k) in keys.iter().enumerate() {
            let b = k.as_ref().as_bytes();
            ciphers.push(match b.len() {
                16 => Cipher::Aes128(b.try_into().expect("length checked")),
                32 => Cipher::Aes256(b.try_into().expect("length checked")),
                n => {
                    return Err(format!(
                        "apisix.data_encryption.keyring[{i}]: expected a 16 byte (AES-128) or 32 \
                         byte (AES-256) key, got {n} bytes"
                    ))
                }
            });
        }
        Ok(Keyring { ciphers })
    }

    /// APISIX's default keyring.
    pub fn apisix_default() -> Keyring {
        Keyring::new(&DEFAULT_KEYRING).expect("static keys are 16 bytes")
    }

    /// No keyring: values are stored as written (APISIX does the same with an empty keyring).
    pub fn is_empty(&self) -> bool {
        self.ciphers.is_empty()
    }

    /// Encrypts with the first key; an empty keyring returns the value unchanged.
    pub fn encrypt(&self, value: &str) -> String {
        match self.ciphers.first() {
            None => value.to_owned(),
            Some(c) => {
                base64::engine::general_purpose::STANDARD.encode(c.encrypt(value.as_bytes()))
            }
        }
    }

    /// Decrypts with each key in order. `subject` names the value in the message
    /// (`decrypt ssl key failed`), as APISIX words it.
    pub fn decrypt(&self, value: &str, subject: &str) -> Result<String, String> {
        if self.ciphers.is_empty() {
            return Ok(value.to_owned());
        }
        let what = if subject.is_empty() {
            String::new()
        } else {
            format!("{subject} ")
        };
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(value.trim_end())
            .map_err(|_| format!("base64 decode {what}failed"))?;
        for c in &self.ciphers {
            if let Some(plain) = c.decrypt(&decoded) {
                if let Ok(s) = String::from_utf8(plain) {
                    return Ok(s);
                }
            }
        }
        Err(format!("decrypt {what}failed"))
    }

    /// A private key as stored: PEM (starts with `---`) is encrypted, anything else is taken as
    /// already encrypted and kept (APISIX's `aes_encrypt_pkey`).
    pub fn encrypt_pkey(&self, pem: &str) -> String {
        if pem.starts_with("---") {
            self.encrypt(pem)
        } else {
            pem.to_owned()
        }
    }

    /// A stored private key as PEM: PEM is kept, anything else is decrypted
    /// (APISIX's `aes_decrypt_pkey`).
    pub fn decrypt_pkey(&self, stored: &str) -> Result<String, String> {
        if stored.starts_with("---") {
            Ok(stored.to_owned())
        } else {
            self.decrypt(stored, "ssl key")
        }
    }

    /// Encrypts `key` and every entry of `keys` of an ssl object (Admin API, on write).
    pub fn encrypt_ssl(&self, conf: &mut Value) {
        self.map_ssl_keys(conf, |k| Ok(self.encrypt_pkey(k)))
            .expect("encryption does not fail");
    }

    /// Decrypts `key` and `keys` of a stored ssl object (data plane, on compile).
    pub fn decrypt_ssl(&self, conf: &mut Value) -> Result<(), String> {
        self.map_ssl_keys(conf, |k| self.decrypt_pkey(k))
    }

    fn map_ssl_keys(
        &self,
        conf: &mut Value,
        f: impl Fn(&str) -> Result<String, String>,
    ) -> Result<(), String> {
        if let Some(Value::String(k)) = conf.get_mut("key") {
            *k = f(k)?;
        }
        if let Some(Value::Array(keys)) = conf.get_mut("keys") {
            for k in keys.iter_mut() {
                if let Value::String(s) = k {
                    *s = f(s)?;
                }
            }
        }
        Ok(())
    }

    /// An upstream's `tls.client_key` (APISIX's `check_upstream_conf` encrypts it on write).
    pub fn encrypt_upstream_tls(&self, upstream: &mut Value) {
        if let Some(Value::String(k)) = upstream
            .get_mut("tls")
            .and_then(|t| t.get_mut("client_key"))
        {
            *k = self.encrypt_pkey(k);
        }
    }

    pub fn decrypt_upstream_tls(&self, upstream: &mut Value) -> Result<(), String> {
        if let Some(Value::String(k)) = upstream
            .get_mut("tls")
            .and_then(|t| t.get_mut("client_key"))
        {
            *k = self.decrypt_pkey(k)?;
        }
        Ok(())
    }
}

/// Which of APISIX's two operations [`process_fields`] applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldOp {
    Encrypt,
    Decrypt,
}

/// Applies `op` to the fields of a plugin conf named by `paths` (a plugin's `encrypt_fields`),
/// as APISIX's `process_encrypt_field`: dotted paths of any depth, arrays at intermediate
/// segments are walked element by element, and a leaf may be a string, an array of strings
/// or an object of strings. A value that fails to decrypt is left as it is (APISIX logs it and
/// keeps the value); the failures are returned as messages naming the path.
pub fn process_fields(
    keyring: &Keyring,
    conf: &mut Value,
    paths: &[&str],
    op: FieldOp,
) -> Vec<String> {
    let mut failures = Vec::new();
    if keyring.is_empty() {
        return failures;
    }
    for path in paths {
        process_path(keyring, conf, path, path, op, &mut failures);
    }
    failures
}

fn process_path(
    keyring: &Keyring,
    conf: &mut Value,
    path: &str,
    full: &str,
    op: FieldOp,
    failures: &mut Vec<String>,
) {
    let apply = |s: &mut String, at: String, failures: &mut Vec<String>| match op {
        FieldOp::Encrypt => *s = keyring.encrypt(s),
        FieldOp::Decrypt => match keyring.decrypt(s, "") {
            Ok(plain) => *s = plain,
            Err(e) => failures.push(format!("key [{at}], err: {e}")),
        },
    };
    match path.split_once('.') {
        None => match conf.get_mut(path) {
            Some(Value::String(s)) => apply(s, full.to_owned(), failures),
            Some(Value::Array(items)) => {
                for (i, item) in items.iter_mut().enumerate() {
                    if let Value::String(s) = item {
                        apply(s, format!("{full}] index [{}", i + 1), failures);
                    }
                }
            }
            Some(Value::Object(map)) => {
                for (k, v) in map.iter_mut() {
                    if let Value::String(s) = v {
                        apply(s, format!("{full}.{k}"), failures);
                    }
                }
            }
            _ => {}
        },
        Some((segment, rest)) => match conf.get_mut(segment) {
            Some(Value::Array(items)) => {
                for item in items.iter_mut().filter(|i| i.is_object()) {
                    process_path(keyring, item, rest, full, op, failures);
                }
            }
            Some(v @ Value::Object(_)) => process_path(keyring, v, rest, full, op, failures),
            _ => {}
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip_and_rotation() {
        let old = Keyring::new(&["edd1c9f0985e76a2"]).unwrap();
        let rotated = Keyring::new(&["qeddd145sfvddff3", "edd1c9f0985e76a2"]).unwrap();
        let stored = old.encrypt("secret value");
        assert_ne!(stored, "secret value");
        // The new first key cannot read it, the old one below it can.
        assert_eq!(rotated.decrypt(&stored, "").unwrap(), "secret value");
        let fresh = rotated.encrypt("secret value");
        assert_ne!(fresh, stored);
        assert!(old.decrypt(&fresh, "x").is_err());
        let k32 = Keyring::new(&["0123456789abcdef0123456789abcdef"]).unwrap();
        assert_eq!(
            k32.decrypt(&k32.encrypt("x"), "").unwrap(),
            "x",
            "AES-256-CBC"
        );
    }

    #[test]
    fn apisix_vector() {
        // APISIX t/plugin/csrf.t TEST 15: csrf's `key` "userkey" under the keyring
        // [edd1c9f0985e76a2] is stored in etcd as this value.
        let k = Keyring::new(&["edd1c9f0985e76a2"]).unwrap();
        assert_eq!(k.encrypt("userkey"), "mt39FazQccyMqt4ctoRV7w==");
        assert_eq!(
            k.decrypt("mt39FazQccyMqt4ctoRV7w==", "").unwrap(),
            "userkey"
        );
    }

    #[test]
    fn bad_keys_and_values() {
        assert!(Keyring::new(&["short"]).unwrap_err().contains("keyring[0]"));
        let k = Keyring::apisix_default();
        assert_eq!(
            k.decrypt("not base64!", "ssl key").unwrap_err(),
            "base64 decode ssl key failed"
        );
        assert_eq!(
            k.decrypt("AAAAAAAAAAAAAAAAAAAAAA==", "ssl key")
                .unwrap_err(),
            "decrypt ssl key failed"
        );
        assert_eq!(Keyring::default().encrypt("x"), "x");
    }

    #[test]
    fn pkeys_only_pem_is_encrypted() {
        let k = Keyring::apisix_default();
        let pem = "-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----\n";
        let stored = k.encrypt_pkey(pem);
        assert!(!stored.starts_with("---"));
        assert_eq!(k.encrypt_pkey(&stored), stored, "not encrypted twice");
        assert_eq!(k.decrypt_pkey(&stored).unwrap(), pem);
        assert_eq!(k.decrypt_pkey(pem).unwrap(), pem);
        let mut ssl = json!({"key": pem, "keys": [pem, pem]});
        k.encrypt_ssl(&mut ssl);
        assert!(!ssl["keys"][1].as_str().unwrap().starts_with("---"));
        k.decrypt_ssl(&mut ssl).unwrap();
        assert_eq!(ssl, json!({"key": pem, "keys": [pem, pem]}));
    }

    #[test]
    fn field_paths() {
        let k = Keyring::apisix_default();
        let original = json!({
            "password": "p",
            "auth": {"headers": {"a": "x", "b": 1}, "list": ["l1", "l2"]},
            "nodes": [{"secret": "s1"}, {"secret": "s2"}, "skip"],
            "other": "kept"
        });
        let mut conf = original.clone();
        let paths = [
            "password",
            "auth.headers",
            "auth.list",
            "nodes.secret",
            "absent.x",
        ];
        assert!(process_fields(&k, &mut conf, &paths, FieldOp::Encrypt).is_empty());
        assert_ne!(conf["password"], "p");
        assert_ne!(conf["auth"]["headers"]["a"], "x");
        assert_eq!(conf["auth"]["headers"]["b"], 1);
        assert_ne!(conf["nodes"][1]["secret"], "s2");
        assert_eq!(conf["other"], "kept");
        assert!(process_fields(&k, &mut conf, &paths, FieldOp::Decrypt).is_empty());
        assert_eq!(conf, original);
        // A clear-text value under a listed field fails to decrypt and stays as it is.
        let mut plain = json!({"password": "not encrypted"});
        let failures = process_fields(&k, &mut plain, &["password"], FieldOp::Decrypt);
        assert_eq!(failures.len(), 1);
        assert_eq!(plain["password"], "not encrypted");
    }
}
