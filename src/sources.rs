//! Builds the configuration source the settings ask for (the standalone file, the embedded
//! store, or etcd) and, where the role has one, the Admin API on top of the store.

use std::sync::Arc;

use ferrisix_admin::{AdminApi, AdminOptions};
use ferrisix_config::provider::{FileProvider, Format};
use ferrisix_config::settings::{ProviderKind, Settings};
use ferrisix_config::state::ConfigState;
use ferrisix_config::store::embedded::EmbeddedStore;
use ferrisix_config::store::etcd::EtcdStore;
use ferrisix_config::store::standalone_api::StandaloneApiStore;
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
    /// The embedded store, which a successor process needs closed before it opens the file.
    pub embedded: Option<Arc<EmbeddedStore>>,
    /// API-driven standalone mode's store, which the Admin API replaces whole.
    pub standalone: Option<Arc<StandaloneApiStore>>,
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
                embedded: None,
                standalone: None,
            })
        }
        ProviderKind::StandaloneApi => {
            let store = StandaloneApiStore::new(settings.deployment.etcd.prefix.clone());
            tracing::info!(
                "API-driven standalone mode: the configuration is empty until PUT /apisix/admin/configs"
            );
            let mut source = from_store(store.clone());
            source.standalone = Some(store);
            Ok(source)
        }
        ProviderKind::Embedded => {
            let dir = settings.data_dir();
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("cannot create the data directory {}: {e}", dir.display()))?;
            let path = dir.join("ferrisix.redb");
            let store = EmbeddedStore::open(&path, &settings.deployment.etcd.prefix)
                .map_err(|e| format!("cannot open the embedded store {}: {e}", path.display()))?;
            tracing::info!(path = %path.display(), "embedded store opened");
            let mut source = from_store(store.clone());
            source.embedded = Some(store);
            Ok(source)
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
        embedded: None,
        standalone: None,
    }
}

/// The Admin API on `deployment.admin.admin_listen` (served by [`crate::lifecycle::AdminServer`]).
pub async fn admin_api(
    settings: &Settings,
    store: Arc<dyn Store>,
    standalone: Option<Arc<StandaloneApiStore>>,
    plugins: PluginRegistry,
) -> Arc<AdminApi> {
    let mut options = AdminOptions::from_settings(&settings.deployment.admin);
    options.keyring = settings.apisix.data_encryption.keyring();
    options.encrypt_fields = settings.apisix.data_encryption.enable_encrypt_fields;
    options.key_guard = settings.ferrisix.admin_key_guard.clone();
    options.ui_dir = settings.admin_ui_dir();
    options.stream_mode = settings.apisix.proxy_mode.stream();
    options.stream_plugins =
        ferrisix_plugins::stream::StreamPlugins::new(settings.stream_plugins.as_deref()).0;
    options.xrpc = ferrisix_config::xrpc::XrpcProtocols::new(&settings.xrpc.names()).0;
    let config_path = settings.source.clone();
    let services = plugins.services().clone();
    // The wasm plugins stay as booted (their modules are compiled once).
    let wasm: Vec<&'static ferrisix_plugin_api::PluginDef> = plugins
        .list()
        .map(|p| p.def)
        .filter(|d| !ferrisix_plugins::builtin().any(|b| std::ptr::eq(b, *d)))
        .collect();
    let hook: ferrisix_admin::ReloadHook = Arc::new(move || {
        // `PUT /plugins/reload` re-reads the plugin list from config.yaml, as APISIX does.
        let path = config_path.as_ref()?;
        let (s, _) = Settings::load(path).ok()?;
        Some(
            PluginRegistry::new(services.clone(), s.plugins.as_deref())
                .0
                .with_plugins(&wasm),
        )
    });
    let api = AdminApi::new(options, store, plugins).with_reload_hook(hook);
    if let Some(standalone) = standalone {
        // Nothing but whole documents is written in this mode: no plugin list either.
        return Arc::new(api.with_standalone(standalone));
    }
    let api = Arc::new(api);
    if let Err(e) = api.publish_plugin_list().await {
        tracing::warn!("could not publish the plugin list to the store: {e}");
    }
    api
}

/// The data port's `/apisix/admin` handler for `ferrisix.admin_on_data_port`.
pub fn legacy_admin(api: Arc<AdminApi>) -> ferrisix_proxy::LegacyAdmin {
    Arc::new(move |req, peer| {
        let api = api.clone();
        Box::pin(async move {
            let resp = api.handle(req, peer).await;
            let (parts, body) = resp.into_parts();
            let bytes = http_body_util::BodyExt::collect(body)
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            http::Response::from_parts(parts, ferrisix_proxy::ResponseBody::full(bytes))
        })
    })
}
