//! Process-wide plugin state: what outlives snapshots (limit-count counters, limit-req
//! buckets, limit-conn counts, Redis pools, prometheus series) and the plugin settings from
//! `config.yaml`.
//!
//! APISIX keeps such state in nginx shared dicts that every worker sees; ferrisix keeps it in
//! one [`Runtime`] per process, which compiled plugins reference. [`configure`] must run before
//! the first snapshot is compiled for the settings to apply; without it the defaults are used.

use std::sync::OnceLock;

use ferrisix_config::settings::PrometheusAttr;

use crate::limit_conn::ConnSpaces;
use crate::limit_count::local::Spaces;
use crate::limit_req::ReqSpaces;
use crate::prometheus::Metrics;
use crate::public_api::PluginApis;
use crate::redis_client::Remotes;

/// Plugin state shared by every snapshot and worker.
#[derive(Debug)]
pub struct Runtime {
    pub counters: Spaces,
    pub remotes: Remotes,
    /// limit-req buckets.
    pub req: ReqSpaces,
    /// limit-conn in-flight counts.
    pub conn: ConnSpaces,
    pub metrics: Metrics,
    /// The plugin APIs `public-api` serves.
    pub apis: PluginApis,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// Plugin settings from `config.yaml`.
#[derive(Clone, Debug, Default)]
pub struct PluginSettings {
    pub prometheus: PrometheusAttr,
}

/// Installs the settings; fails if the runtime was already in use (the first compile fixes it).
pub fn configure(settings: PluginSettings) -> Result<(), String> {
    RUNTIME
        .set(Runtime::new(settings))
        .map_err(|_| "plugin runtime already initialised".to_string())
}

/// The process' plugin runtime (default settings if [`configure`] was not called).
pub fn runtime() -> &'static Runtime {
    RUNTIME.get_or_init(|| Runtime::new(PluginSettings::default()))
}

impl Runtime {
    fn new(settings: PluginSettings) -> Runtime {
        Runtime {
            counters: Spaces::default(),
            remotes: Remotes::default(),
            req: ReqSpaces::default(),
            conn: ConnSpaces::default(),
            metrics: Metrics::new(&settings.prometheus),
            apis: PluginApis::from_settings(&settings.prometheus),
        }
    }

    /// Drops state no compiled plugin references any more (after a snapshot was replaced).
    pub fn sweep(&self) {
        self.counters.sweep();
        self.req.sweep(|s| s.live());
        self.conn.sweep(|s| s.live());
        self.metrics.sweep();
    }
}
