//! Builds the configuration source the settings ask for (the standalone file, the embedded
//! store, or etcd) and, where the role has one, the Admin API on top of the store.

use std::path::Path;
use std::sync::Arc;

use ferrisix_admin::{AdminApi, AdminOptions};
use ferrisix_config::provider::{FileProvider, Format};
use ferrisix_config::settings::{AdminRole, ProviderKind, Settings};
use ferrisix_config::state::ConfigState;
use ferrisix_config::store::embedded::EmbeddedStore;
use ferrisix_config::store::etcd::EtcdStore;
use ferrisix_config::store::{Store, StoreHealth};
use ferrisix_plugins::PluginRegistry;
use ferrisix_proxy::control::HealthProbe;
use tokio::sync::watch;

/// Where the data plane's configuration comes from.
pub struct Source {
    pub states: watch::Receiver<Arc<ConfigState>>,
    pub health: HealthProbe,
    /// The writable store behind the Admin API (absent for the standalone file).
    pub store: Option<Arc<dyn Store>>,
}

/// Opens the provider `settings.provider()` names. Runs inside the control runtime.
pub async fn open(settings: &Settings) -> Result<Source, String> {
    match settings.provider() {
        kind @ (ProviderKind::Yaml | ProviderKind::Json) => {
            let path = settings.standalone_file();
            let format = kind.file_format().unwrap_or(Format::Yaml);
            let (rx, _task) = FileProvider::start(path.clone(), format)
                .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
            tracing::info!(file = %path.display(), "standalone mode: watching the config file");
            let probe_rx = rx.clone();
            let health: HealthProbe = Arc::new(move || StoreHealth {
                reachable: true,
                synced: true,
                revision: probe_rx.borrow().revision,
                detail: format!("standalone file {}", path.display()),
            });
            Ok(Source {
                states: rx,
                health,
                store: None,
            })
        }
        ProviderKind::Embedded => {
            let dir = settings.data_dir();
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("cannot create the data directory {}: {e}", dir.display()))?;
            let path = dir.join("ferrisix.redb");
            let store = EmbeddedStore::open(&path, &settings.deployment.etcd.prefix)
                .map_err(|e| format!("cannot open the embedded store {}: {e}", path.display()))?;
            tracing::info!(path = %path.display(), "embedded store opened");
            Ok(from_store(store))
        }
        ProviderKind::Etcd => {
            let dir = settings.data_dir();
            let _ = std::fs::create_dir_all(&dir);
            let copy = dir.join("etcd-local-copy.json");
            let store = EtcdStore::connect(&settings.deployment.etcd, Some(copy))
                .await
                .map_err(|e| {
                    format!("cannot reach etcd {:?}: {e}", settings.deployment.etcd.host)
                })?;
            tracing::info!(endpoints = ?settings.deployment.etcd.host, "etcd store connected");
            Ok(from_store(store))
        }
    }
}

fn from_store<S: Store>(store: Arc<S>) -> Source {
    let states = store.subscribe();
    let probe = store.clone();
    let health: HealthProbe = Arc::new(move || probe.health());
    Source {
        states,
        health,
        store: Some(store),
    }
}

/// Makes sure every admin key is set: an empty key is replaced by a generated one, written back
/// into config.yaml when there is one and printed once (APISIX 3.10+ does the same).
pub fn ensure_admin_keys(settings: &mut Settings) -> Result<(), String> {
    let mut generated = Vec::new();
    for key in settings.deployment.admin.admin_key.iter_mut() {
        if key.key.is_empty() && key.role == AdminRole::Admin {
            key.key = generate_key();
            generated.push((key.name.clone(), key.key.clone()));
        }
    }
    if generated.is_empty() {
        return Ok(());
    }
    let written = match settings.source.clone() {
        Some(path) => match write_back_keys(&path, &generated) {
            Ok(()) => Some(path),
            Err(e) => {
                tracing::warn!(
                    "could not write the generated admin key into {}: {e}",
                    path.display()
                );
                None
            }
        },
        // Running on built-in defaults: keep the key in conf/config.yaml (APISIX's path), so
        // the next start uses the same key.
        None => match write_new_config(&settings.config_dir().join("config.yaml"), &generated) {
            Ok(path) => Some(path),
            Err(e) => {
                tracing::warn!("could not save the generated admin key: {e}");
                None
            }
        },
    };
    for (name, key) in &generated {
        // Printed once, on purpose: this is how the operator learns the key.
        eprintln!(
            "ferrisix: generated admin key for '{name}': {key}{}",
            written
                .as_ref()
                .map(|p| format!(" (saved in {})", p.display()))
                .unwrap_or_else(
                    || " (not saved: set deployment.admin.admin_key in config.yaml)".into()
                )
        );
    }
    Ok(())
}

/// Creates a minimal config.yaml holding the generated keys (only when none exists).
fn write_new_config(
    path: &Path,
    generated: &[(String, String)],
) -> Result<std::path::PathBuf, String> {
    if path.exists() {
        return Err(format!("{} exists but was not loaded", path.display()));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    }
    let mut text = String::from(
        "# Written by ferrisix at first start: the generated Admin API key.\n# Every other key keeps its default; see config/config.yaml in the repository.\ndeployment:\n  admin:\n    admin_key:\n",
    );
    for (name, key) in generated {
        text.push_str(&format!(
            "      - name: {name}\n        key: {key}\n        role: admin\n"
        ));
    }
    std::fs::write(path, text).map_err(|e| e.to_string())?;
    Ok(path.to_path_buf())
}

fn generate_key() -> String {
    use rand::Rng;
    const LETTERS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut rng = rand::rngs::OsRng;
    (0..32)
        .map(|_| LETTERS[rng.gen_range(0..LETTERS.len())] as char)
        .collect()
}

/// Replaces, in order, each empty `key:` entry under `admin_key:` with a generated key,
/// editing the text so the file's comments and layout survive.
fn write_back_keys(path: &Path, generated: &[(String, String)]) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let mut out = String::with_capacity(text.len() + 64);
    let mut in_admin_key = false;
    let mut admin_key_indent = 0usize;
    let mut pending = generated.iter();
    let mut replaced = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let content = trimmed.trim_end();
        if content.starts_with("admin_key:") {
            in_admin_key = true;
            admin_key_indent = indent;
            out.push_str(line);
            continue;
        }
        if in_admin_key
            && !content.is_empty()
            && !content.starts_with('#')
            && indent <= admin_key_indent
            && !content.starts_with('-')
        {
            in_admin_key = false;
        }
        let key_part = content.trim_start_matches("- ").trim_start();
        if in_admin_key && key_part.starts_with("key:") {
            let value = key_part["key:".len()..]
                .split('#')
                .next()
                .unwrap_or("")
                .trim();
            if matches!(value, "" | "''" | "\"\"" | "~" | "null") {
                if let Some((_, key)) = pending.next() {
                    let prefix_len = line.find("key:").unwrap_or(0) + "key:".len();
                    out.push_str(&line[..prefix_len]);
                    out.push_str(&format!(" {key}\n"));
                    replaced += 1;
                    continue;
                }
            }
        }
        out.push_str(line);
    }
    if replaced == 0 {
        return Err("no empty admin key entry found in the file".into());
    }
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, out).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, path).map_err(|e| e.to_string())
}

/// Starts the Admin API on `deployment.admin.admin_listen` when the role has one.
pub async fn start_admin(
    settings: &Settings,
    store: Arc<dyn Store>,
    plugins: PluginRegistry,
    shutdown: watch::Receiver<bool>,
) -> Result<Arc<AdminApi>, String> {
    let listen = &settings.deployment.admin.admin_listen;
    let addr = std::net::SocketAddr::new(listen.ip, listen.port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr} for the Admin API: {e}"))?;
    let mut options = AdminOptions::from_settings(&settings.deployment.admin);
    options.keyring = settings.apisix.data_encryption.keyring();
    options.key_guard = settings.ferrisix.admin_key_guard.clone();
    let config_path = settings.source.clone();
    let hook: ferrisix_admin::ReloadHook = Arc::new(move || {
        // `PUT /plugins/reload` re-reads the plugin list from config.yaml, as APISIX does.
        let path = config_path.as_ref()?;
        let (s, _) = Settings::load(path).ok()?;
        Some(PluginRegistry::enabled(s.plugins.as_deref()).0)
    });
    let api = Arc::new(AdminApi::new(options, store, plugins).with_reload_hook(hook));
    if let Err(e) = api.publish_plugin_list().await {
        tracing::warn!("could not publish the plugin list to the store: {e}");
    }
    tracing::info!(%addr, "Admin API listening");
    let limits = crate::cli::conn_limits(settings);
    tokio::spawn(ferrisix_admin::serve(
        listener,
        api.clone(),
        limits,
        shutdown,
    ));
    Ok(api)
}

/// The data port's `/apisix/admin` handler for `ferrisix.admin_on_data_port`.
pub fn legacy_admin(api: Arc<AdminApi>) -> ferrisix_proxy::handler::LegacyAdmin {
    Arc::new(move |req, peer| {
        let api = api.clone();
        Box::pin(async move {
            let resp = api.handle(req, peer).await;
            let (parts, body) = resp.into_parts();
            let bytes = http_body_util::BodyExt::collect(body)
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            http::Response::from_parts(parts, ferrisix_proxy::body::ResponseBody::full(bytes))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_keys_are_written_back_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(
            &path,
            "deployment:\n  admin:\n    admin_key:\n      - name: admin\n        key: ''   # generated\n        role: admin\n      - name: viewer\n        key: abc\n        role: viewer\n# end\n",
        )
        .unwrap();
        write_back_keys(&path, &[("admin".into(), "K".repeat(32))]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains(&format!("        key: {}\n", "K".repeat(32))),
            "{text}"
        );
        assert!(text.contains("key: abc"));
        assert!(text.ends_with("# end\n"));
        let (s, _) = Settings::load(&path).unwrap();
        assert_eq!(s.deployment.admin.admin_key[0].key, "K".repeat(32));
    }

    #[test]
    fn generated_keys_are_32_letters() {
        let k = generate_key();
        assert_eq!(k.len(), 32);
        assert!(k.bytes().all(|b| b.is_ascii_alphabetic()));
        assert_ne!(k, generate_key());
    }
}
