//! proxy-wasm plugins: the modules config.yaml's `wasm.plugins` declares, each registered under
//! its own name and priority like a built-in plugin, and run in process on wasmtime behind the
//! plugin API, as APISIX runs them through wasm-nginx-module (proxy-wasm ABI 0.2.x).
//!
//! Each module is compiled once at boot ([`WasmPlugins::load`]) and instantiated once per
//! worker thread on first use (its "VM"); each configured conf gets one root context per
//! worker (`proxy_on_configure` with the conf, a JSON-encoded object or the string as given),
//! each request one HTTP context. Every call into a module runs under an epoch deadline and a
//! memory limit (`ferrisix.wasm`); a module that traps, runs past the deadline or asks for too
//! much memory answers 503 for that request, as APISIX's `wasm.lua` does for a failed call,
//! and its instance on that worker is made afresh. A module reaches the host only through the
//! proxy-wasm host calls (`docs/wasm.md` lists them): no WASI filesystem, network or
//! environment.
#![forbid(unsafe_code)]

mod abi;
mod host;
mod plugin;
mod shared;
mod vm;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use ferrisix_config::settings::{WasmLimits, WasmRequestPhase, WasmSettings};
use ferrisix_plugin_api::{CompileCtx, Plugin, PluginDef, PluginServices, SharedState};
use serde_json::{json, Value};
use wasmtime::{Config, Engine, Module};

use crate::vm::{Loaded, RootKey};

/// How often the engine's epoch advances: the granularity of the call deadline.
const EPOCH_TICK: Duration = Duration::from_millis(10);

/// The ABI versions a module may declare (by exporting `proxy_abi_version_<v>`).
const ABI_VERSIONS: &[&str] = &[
    "proxy_abi_version_0_2_1",
    "proxy_abi_version_0_2_0",
    "proxy_abi_version_0_1_0",
];

/// The loaded wasm plugins of one gateway.
pub struct WasmPlugins {
    defs: Vec<&'static PluginDef>,
    loaded: Arc<HashMap<String, Arc<Loaded>>>,
    engine: Option<Engine>,
}

impl std::fmt::Debug for WasmPlugins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.loaded.keys()).finish()
    }
}

/// The loaded modules, found by the plugins' compile function in the gateway's services.
#[derive(Default)]
struct WasmHost(OnceLock<Arc<HashMap<String, Arc<Loaded>>>>);

impl SharedState for WasmHost {
    fn create(_: &PluginServices) -> Self {
        WasmHost::default()
    }
}

impl WasmPlugins {
    /// No wasm plugins.
    pub fn none() -> WasmPlugins {
        WasmPlugins {
            defs: Vec::new(),
            loaded: Arc::new(HashMap::new()),
            engine: None,
        }
    }

    /// Reads and compiles every module of `settings`; relative files resolve against `base`
    /// (config.yaml's directory). `taken` tells the names of built-in plugins, which a wasm
    /// plugin may not reuse. Every failure is reported, each with its plugin's name.
    pub fn load(
        settings: &WasmSettings,
        limits: &WasmLimits,
        base: Option<&Path>,
        taken: impl Fn(&str) -> bool,
    ) -> Result<WasmPlugins, Vec<String>> {
        if settings.plugins.is_empty() {
            return Ok(WasmPlugins::none());
        }
        let mut config = Config::new();
        config.epoch_interruption(true);
        let engine = Engine::new(&config).map_err(|e| vec![format!("wasm: {e}")])?;
        let ticks = limits.timeout.as_millis().div_ceil(EPOCH_TICK.as_millis()) as u64 + 1;
        let mut loaded = HashMap::new();
        let mut defs = Vec::new();
        let mut errors = Vec::new();
        for p in &settings.plugins {
            if taken(&p.name) {
                errors.push(format!(
                    "wasm plugin {}: the name of a built-in plugin",
                    p.name
                ));
                continue;
            }
            let path = match (base, p.file.is_relative()) {
                (Some(base), true) => base.join(&p.file),
                _ => PathBuf::from(&p.file),
            };
            let module = match compile(&engine, &path) {
                Ok(m) => m,
                Err(e) => {
                    errors.push(format!("wasm plugin {}: {}: {e}", p.name, path.display()));
                    continue;
                }
            };
            let pre = match host::linker(&engine, &module).and_then(|l| l.instantiate_pre(&module))
            {
                Ok(pre) => pre,
                Err(e) => {
                    errors.push(format!("wasm plugin {}: {}: {e}", p.name, path.display()));
                    continue;
                }
            };
            let name: Arc<str> = p.name.as_str().into();
            loaded.insert(
                p.name.clone(),
                Arc::new(Loaded {
                    name: name.clone(),
                    uid: vm::next_id(),
                    engine: engine.clone(),
                    pre,
                    shared: Arc::default(),
                    max_memory: usize::try_from(limits.max_memory).unwrap_or(usize::MAX),
                    deadline_ticks: ticks,
                    next_root: AtomicU64::new(1),
                    roots: Mutex::new(HashMap::new()),
                    rewrite: p.http_request_phase == WasmRequestPhase::Rewrite,
                }),
            );
            // One definition per configured plugin, made once at boot: the registry holds
            // definitions for the life of the process.
            let def: &'static PluginDef = Box::leak(Box::new(PluginDef::new(
                Box::leak(p.name.clone().into_boxed_str()),
                p.priority,
                schema,
                compile_conf,
            )));
            defs.push(def);
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(WasmPlugins {
            defs,
            loaded: Arc::new(loaded),
            engine: Some(engine),
        })
    }

    /// The plugins' definitions, for the registry.
    pub fn defs(&self) -> &[&'static PluginDef] {
        &self.defs
    }

    /// Hands the modules to `services` (where the plugins compile from) and starts the epoch
    /// clock of the call deadlines on its executor.
    pub fn install(&self, services: &PluginServices) -> Result<(), String> {
        let Some(engine) = self.engine.clone() else {
            return Ok(());
        };
        if services
            .shared::<WasmHost>()
            .0
            .set(self.loaded.clone())
            .is_err()
        {
            return Err("wasm plugins installed twice".into());
        }
        services
            .executor()
            .spawn(async move {
                let mut every = tokio::time::interval(EPOCH_TICK);
                loop {
                    every.tick().await;
                    engine.increment_epoch();
                }
            })
            .map(drop)
    }
}

fn compile(engine: &Engine, path: &Path) -> Result<Module, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let module = Module::new(engine, &bytes).map_err(|e| e.to_string())?;
    let exports: Vec<&str> = module.exports().map(|e| e.name()).collect();
    if !ABI_VERSIONS.iter().any(|v| exports.contains(v)) {
        return Err("not a proxy-wasm module (it exports no proxy_abi_version_0_2_x)".into());
    }
    if !exports.contains(&"memory") {
        return Err("the module exports no memory".into());
    }
    Ok(module)
}

/// APISIX's schema of a wasm plugin's configuration.
fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "conf": {
                "oneOf": [
                    {"type": "object", "minProperties": 1},
                    {"type": "string", "minLength": 1}
                ]
            }
        },
        "required": ["conf"]
    })
}

/// A conf on a route: the module's root context for it, keyed so an unchanged conf keeps its
/// root contexts across recompiles.
fn compile_conf(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let loaded = cx
        .services
        .shared::<WasmHost>()
        .0
        .get()
        .and_then(|m| m.get(cx.name).cloned())
        .ok_or_else(|| format!("wasm plugin {} is not loaded", cx.name))?;
    // As wasm.lua: a table is JSON-encoded (cjson), a string handed over as it is.
    let conf = match cx.conf.get("conf") {
        Some(Value::String(s)) => Bytes::from(s.clone()),
        Some(v @ Value::Object(_)) => Bytes::from(ferrisix_config::schema::lua::cjson_encode(v)),
        _ => return Err("invalid conf type".into()),
    };
    let key = cx.state_key();
    let root = {
        let mut roots = loaded.roots.lock().unwrap_or_else(|e| e.into_inner());
        roots.retain(|_, w| w.strong_count() > 0);
        match roots.get(&key).and_then(Weak::upgrade) {
            Some(r) if r.conf == conf => r,
            _ => {
                let r = Arc::new(RootKey {
                    id: loaded
                        .next_root
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                    conf,
                });
                roots.insert(key, Arc::downgrade(&r));
                r
            }
        }
    };
    Ok(Arc::new(plugin::WasmConf {
        rewrite: loaded.rewrite,
        loaded,
        root,
        services: cx.services.clone(),
    }))
}
