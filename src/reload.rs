//! SIGHUP: config.yaml is read again. What the data plane reads per connection is applied at
//! once (a new gateway value, swapped whole: the next connection uses it); the log level too.
//! Everything else is named in the log as needing a restart (a restart loses no connection:
//! see [`crate::lifecycle`]).

use std::sync::Arc;

use ferrisix_config::reopen::LogReopen;
use ferrisix_config::settings::Settings;
use ferrisix_proxy::server::GatewayHandle;
use ferrisix_proxy::SnapshotHandle;

use crate::logging::LogControl;

/// What SIGHUP may change, and the settings in force.
pub struct Reloader {
    pub settings: Settings,
    pub gateway: Option<GatewayHandle>,
    pub snapshot: SnapshotHandle,
    pub stats: Arc<ferrisix_plugin_api::ConnStats>,
    pub reopen: LogReopen,
}

/// The keys a SIGHUP applies (docs/operating.md lists them).
pub const LIVE_KEYS: &[&str] = &[
    "apisix.enable_server_tokens",
    "apisix.show_upstream_status_in_response_header",
    "nginx_config.error_log_level",
    "nginx_config.http.real_ip_header",
    "nginx_config.http.real_ip_from",
    "nginx_config.http.real_ip_recursive",
    "nginx_config.http.enable_access_log",
    "nginx_config.http.access_log",
    "nginx_config.http.access_log_format",
    "nginx_config.http.access_log_format_escape",
    "nginx_config.http.client_body_timeout",
    "nginx_config.http.client_max_body_size",
];

/// `new` with every key SIGHUP applies set as in `old`, so that what still differs needs a
/// restart.
fn without_live_keys(new: &Settings, old: &Settings) -> Settings {
    let mut s = new.clone();
    s.apisix.enable_server_tokens = old.apisix.enable_server_tokens;
    s.apisix.show_upstream_status_in_response_header =
        old.apisix.show_upstream_status_in_response_header;
    s.nginx_config.error_log_level = old.nginx_config.error_log_level;
    let (h, o) = (&mut s.nginx_config.http, &old.nginx_config.http);
    h.real_ip_header = o.real_ip_header.clone();
    h.real_ip_from = o.real_ip_from.clone();
    h.real_ip_recursive = o.real_ip_recursive;
    h.enable_access_log = o.enable_access_log;
    h.access_log = o.access_log.clone();
    h.access_log_format = o.access_log_format.clone();
    h.access_log_format_escape = o.access_log_format_escape;
    h.client_body_timeout = o.client_body_timeout;
    h.client_max_body_size = o.client_max_body_size;
    // Generated admin keys are filled in after loading; a file that kept them reads the same.
    for (n, o) in s
        .deployment
        .admin
        .admin_key
        .iter_mut()
        .zip(&old.deployment.admin.admin_key)
    {
        if n.key.is_empty() && n.name == o.name {
            n.key = o.key.clone();
        }
    }
    s
}

/// The top-level sections (and `nginx_config.http`) of `a` and `b` that differ.
pub fn changed_sections(a: &Settings, b: &Settings) -> Vec<&'static str> {
    let mut out = Vec::new();
    if a.apisix != b.apisix {
        out.push("apisix");
    }
    if a.nginx_config.http != b.nginx_config.http {
        out.push("nginx_config.http");
    }
    let (mut an, mut bn) = (a.nginx_config.clone(), b.nginx_config.clone());
    an.http = bn.http.clone();
    if an != bn {
        bn.http = an.http.clone();
        out.push("nginx_config");
    }
    if a.deployment != b.deployment {
        out.push("deployment");
    }
    if a.plugins != b.plugins {
        out.push("plugins");
    }
    if a.plugin_attr != b.plugin_attr {
        out.push("plugin_attr");
    }
    if a.ferrisix != b.ferrisix {
        out.push("ferrisix");
    }
    out
}

impl Reloader {
    /// Re-reads config.yaml and applies what can change live.
    pub fn reload(&mut self, log: &mut LogControl) {
        let Some(path) = self.settings.source.clone() else {
            tracing::warn!("SIGHUP: running on built-in defaults, no config.yaml to re-read");
            return;
        };
        let new = match Settings::load(&path) {
            Ok((s, warnings)) => {
                for w in warnings {
                    tracing::warn!("{w}");
                }
                s
            }
            Err(e) => {
                tracing::error!(
                    "SIGHUP: {} not applied, the running configuration stays: {e}",
                    path.display()
                );
                return;
            }
        };
        let mut restart: Vec<&str> =
            changed_sections(&without_live_keys(&new, &self.settings), &self.settings);
        restart.extend(log.reload(&new));
        if let Some(handle) = &self.gateway {
            let current = handle.load_full();
            let mut gateway = crate::cli::gateway(
                &new,
                self.snapshot.clone(),
                self.stats.clone(),
                &self.reopen,
            );
            gateway.legacy_admin = current.legacy_admin.clone();
            handle.store(Arc::new(gateway));
        }
        if restart.is_empty() {
            tracing::info!(file = %path.display(), live_keys = ?LIVE_KEYS, "SIGHUP: config.yaml re-read and applied");
        } else {
            tracing::warn!(
                file = %path.display(),
                needs_restart = ?restart,
                "SIGHUP: config.yaml re-read; the live keys are applied, these changed sections need a restart (ferrisix restarts without losing a connection: start it again)"
            );
        }
        // What the process runs with now: the live keys as read, the rest as started.
        self.settings = without_live_keys(&self.settings, &new);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Settings {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, yaml).unwrap();
        Settings::load(&path).unwrap().0
    }

    #[test]
    fn live_keys_need_no_restart_and_the_others_are_named() {
        let old = parse("apisix:\n  node_listen: [9080]\n");
        let live = parse(
            "apisix:\n  node_listen: [9080]\n  enable_server_tokens: false\nnginx_config:\n  http:\n    access_log: stdout\n    real_ip_header: X-Forwarded-For\n    client_max_body_size: 1m\n",
        );
        assert!(changed_sections(&without_live_keys(&live, &old), &old).is_empty());
        let restart = parse(
            "apisix:\n  node_listen: [9081]\nnginx_config:\n  worker_processes: 3\n  http:\n    keepalive_timeout: 5s\n",
        );
        assert_eq!(
            changed_sections(&without_live_keys(&restart, &old), &old),
            ["apisix", "nginx_config.http", "nginx_config"]
        );
    }
}
