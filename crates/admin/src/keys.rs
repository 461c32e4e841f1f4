//! Generated admin keys (APISIX 3.10+): an empty key of an `admin`-role entry in
//! `deployment.admin.admin_key` is replaced at start by a random one, which is saved into
//! config.yaml (see [`ferrisix_config::settings::save`]) so the next start uses the same key,
//! and shown to the operator once.

use ferrisix_config::settings::save::{self, GeneratedKey};
use ferrisix_config::settings::{AdminRole, Settings};
use rand::Rng;

/// Fills every empty admin key of `settings` with a generated one and saves them. Returns the
/// notices for the operator (each key, and where it was saved or what to write by hand), to
/// be printed whatever the log filter: this is how the operator learns the key.
pub fn ensure_admin_keys(settings: &mut Settings) -> Vec<String> {
    let mut generated = Vec::new();
    for (index, key) in settings.deployment.admin.admin_key.iter_mut().enumerate() {
        if key.key.is_empty() && key.role == AdminRole::Admin {
            key.key = generate_key();
            generated.push(GeneratedKey {
                index,
                name: key.name.clone(),
                key: key.key.clone(),
            });
        }
    }
    if generated.is_empty() {
        return Vec::new();
    }
    let saved = match settings.source.clone() {
        Some(path) => save::save_admin_keys(&path, &generated).map_err(|e| (path, e)),
        // Running on built-in defaults: keep the key in conf/config.yaml (APISIX's path), so
        // the next start uses the same key.
        None => {
            let path = settings.config_dir().join("config.yaml");
            save::write_new_config(&path, &generated).map_err(|e| (path, e))
        }
    };
    let mut notices: Vec<String> = generated
        .iter()
        .map(|k| {
            format!(
                "generated admin key for '{}': {}{}",
                k.name,
                k.key,
                match &saved {
                    Ok(path) => format!(" (saved in {})", path.display()),
                    Err(_) => " (not saved)".to_owned(),
                }
            )
        })
        .collect();
    if let Err((path, e)) = saved {
        tracing::warn!(
            "could not save the generated admin key in {}: {e}",
            path.display()
        );
        notices.push(format!(
            "could not save the generated admin key in {}: {e}; to keep it across restarts, write it there: {}",
            path.display(),
            save::what_to_write(&generated)
        ));
    }
    notices
}

/// 32 random letters, as APISIX generates them.
fn generate_key() -> String {
    const LETTERS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut rng = rand::rngs::OsRng;
    (0..32)
        .map(|_| LETTERS[rng.gen_range(0..LETTERS.len())] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_are_32_letters() {
        let k = generate_key();
        assert_eq!(k.len(), 32);
        assert!(k.bytes().all(|b| b.is_ascii_alphabetic()));
        assert_ne!(k, generate_key());
    }

    #[test]
    fn empty_admin_keys_are_generated_saved_and_announced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(
            &path,
            "deployment:\n  admin:\n    admin_key:\n      - name: viewer\n        key: ''\n        role: viewer\n      - name: admin\n        key: ''\n        role: admin\n",
        )
        .unwrap();
        let (mut settings, _) = Settings::load(&path).unwrap();
        let notices = ensure_admin_keys(&mut settings);
        let key = settings.deployment.admin.admin_key[1].key.clone();
        assert_eq!(key.len(), 32);
        assert_eq!(
            settings.deployment.admin.admin_key[0].key, "",
            "viewers get none"
        );
        assert_eq!(
            notices,
            [format!(
                "generated admin key for 'admin': {key} (saved in {})",
                std::fs::canonicalize(&path).unwrap().display()
            )]
        );
        // The next start reads the same key and generates nothing.
        let (mut again, _) = Settings::load(&path).unwrap();
        assert_eq!(again.deployment.admin.admin_key[1].key, key);
        assert!(ensure_admin_keys(&mut again).is_empty());
    }

    #[test]
    fn a_file_that_cannot_be_edited_says_what_to_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        let text = "deployment:\n  admin: {admin_key: [{name: admin, key: '', role: admin}]}\n";
        std::fs::write(&path, text).unwrap();
        let (mut settings, _) = Settings::load(&path).unwrap();
        let notices = ensure_admin_keys(&mut settings);
        let key = &settings.deployment.admin.admin_key[0].key;
        assert_eq!(notices.len(), 2, "{notices:?}");
        assert!(notices[0].ends_with(" (not saved)"), "{notices:?}");
        assert!(
            notices[1].contains(&format!(
                "deployment.admin.admin_key[0] (name: admin): key: {key}"
            )),
            "{notices:?}"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    }
}
