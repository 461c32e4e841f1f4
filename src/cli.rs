//! Command-line parsing and the translation of `config.yaml` settings into the options of
//! each crate.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use ferrisix_config::model::ResourceKind;
use ferrisix_config::provider::parse_standalone;
use ferrisix_config::settings::{AccessLogTarget, HttpRouter, Settings};
use ferrisix_config::state::ConfigState;
use ferrisix_config::validate;
use ferrisix_plugins::PluginRegistry;
use ferrisix_proxy::access_log::{AccessLog, LogSink};
use ferrisix_proxy::{
    CompileOptions, Gateway, RealIpConfig, ServerOptions, SnapshotHandle, WorkerModel,
};
use ferrisix_router::RouterKind;
use http::{HeaderName, HeaderValue};
use tokio::sync::watch;

pub const USAGE: &str = "usage: ferrisix [-c CONFIG] [-t] [-V]

  -c, --config FILE   config.yaml to use (default: conf/config.yaml if present, else built-in defaults)
  -t, --test          check the configuration (and the standalone file) and exit 0 or 1
  -V, --version       print the version
  -h, --help          print this help

Environment: RUST_LOG sets the log filter (default info); FERRISIX_WORKER_MODEL=shared runs one
multi-threaded runtime instead of one single-threaded runtime per worker.";

#[derive(Debug, Default)]
pub struct Args {
    pub config: Option<PathBuf>,
    pub test_only: bool,
    pub help: bool,
    pub version: bool,
}

impl Args {
    pub fn parse(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
        let mut out = Args::default();
        while let Some(a) = args.next() {
            match a.as_str() {
                "-c" | "--config" => {
                    out.config = Some(args.next().ok_or("-c needs a file")?.into());
                }
                "-t" | "--test" => out.test_only = true,
                "-h" | "--help" => out.help = true,
                "-V" | "--version" => out.version = true,
                other => return Err(format!("unknown argument {other}")),
            }
        }
        Ok(out)
    }
}

pub fn load_settings(args: &Args) -> Result<Settings, String> {
    let (settings, warnings) = match &args.config {
        Some(path) => Settings::load(path),
        None => Settings::load_or_default(&PathBuf::from("conf/config.yaml")),
    }
    .map_err(|e| e.to_string())?;
    for w in warnings {
        tracing::warn!("{w}");
    }
    Ok(settings)
}

/// `ferrisix -t`: like `nginx -t`, reports every problem and exits 0 or 1.
pub fn check(settings: &Settings) -> ExitCode {
    let mut failed = false;
    if let Some(format) = settings.provider().file_format() {
        let path = settings.standalone_file();
        match std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|text| parse_standalone(&text, format, 1))
        {
            Err(e) => {
                eprintln!("ferrisix: {}: {e}", path.display());
                failed = true;
            }
            Ok(state) => {
                let (registry, unknown) = PluginRegistry::enabled(settings.plugins.as_deref());
                for name in unknown {
                    eprintln!("ferrisix: plugins: unknown plugin {name}");
                    failed = true;
                }
                for kind in ResourceKind::ALL {
                    for item in state.items(kind) {
                        if let Err(e) = validate::check_resource(kind, &item.value, &registry) {
                            eprintln!(
                                "ferrisix: {}: {} {}: {e}",
                                path.display(),
                                kind.noun(),
                                item.id
                            );
                            failed = true;
                        }
                    }
                }
            }
        }
    }
    if failed {
        eprintln!("ferrisix: configuration test failed");
        ExitCode::FAILURE
    } else {
        eprintln!("ferrisix: configuration test is successful");
        ExitCode::SUCCESS
    }
}

pub fn compile_options(settings: &Settings) -> CompileOptions {
    CompileOptions {
        router: match settings.apisix.router.http {
            HttpRouter::RadixtreeHostUri => RouterKind::HostUri,
            HttpRouter::RadixtreeUri => RouterKind::Uri,
            HttpRouter::RadixtreeUriWithParameter => RouterKind::UriWithParameter,
        },
    }
}

pub fn gateway(settings: &Settings, snapshot: SnapshotHandle) -> Gateway {
    let http = &settings.nginx_config.http;
    let server_header = if settings.apisix.enable_server_tokens {
        HeaderValue::from_static(concat!("ferrisix/", env!("CARGO_PKG_VERSION")))
    } else {
        HeaderValue::from_static("ferrisix")
    };
    let sink = if !http.enable_access_log {
        LogSink::Off
    } else {
        match &http.access_log {
            AccessLogTarget::Off => LogSink::Off,
            AccessLogTarget::Stdout => LogSink::Stdout,
            AccessLogTarget::Stderr => LogSink::Stderr,
            AccessLogTarget::File(p) => LogSink::File(p.clone()),
        }
    };
    Gateway {
        snapshot,
        server_header,
        real_ip: RealIpConfig {
            header: HeaderName::from_bytes(http.real_ip_header.to_ascii_lowercase().as_bytes())
                .unwrap_or(HeaderName::from_static("x-real-ip")),
            trusted: http.real_ip_from.nets.clone(),
            recursive: http.real_ip_recursive,
        },
        show_upstream_status: settings.apisix.show_upstream_status_in_response_header,
        access_log: Arc::new(AccessLog::new(sink, &http.access_log_format)),
        legacy_admin: None,
    }
}

pub fn server_options(settings: &Settings) -> ServerOptions {
    let model = match std::env::var("FERRISIX_WORKER_MODEL").as_deref() {
        Ok("shared") => WorkerModel::Shared,
        _ => WorkerModel::PerCore,
    };
    ServerOptions {
        listen: settings
            .apisix
            .node_listen
            .iter()
            .map(|l| SocketAddr::new(l.ip, l.port))
            .collect(),
        workers: settings.nginx_config.worker_processes.resolve(),
        model,
        shutdown_timeout: settings.nginx_config.worker_shutdown_timeout,
        header_timeout: settings.nginx_config.http.client_header_timeout,
    }
}

pub async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Hands `plugin_attr` to the plugins; must run before the first snapshot is compiled.
/// `health` answers `apisix_etcd_reachable`; `states` (a store's, `None` for the standalone
/// file, which has no modify indexes) answers `apisix_etcd_modify_indexes`.
pub fn configure_plugins(
    settings: &Settings,
    health: ferrisix_proxy::control::HealthProbe,
    states: Option<watch::Receiver<Arc<ConfigState>>>,
    snapshot: SnapshotHandle,
) {
    let plugin_settings = ferrisix_plugins::PluginSettings {
        prometheus: settings.plugin_attr.prometheus.clone(),
    };
    if let Err(e) = ferrisix_plugins::configure(plugin_settings) {
        tracing::warn!("{e}");
    }
    ferrisix_plugins::runtime()
        .metrics
        .set_node_source(Box::new(StoreSource {
            health,
            states,
            snapshot,
        }));
}

/// What upstreams compile with: the health probers and the resolver on `executor`.
pub fn upstream_env(
    settings: &Settings,
    executor: tokio::runtime::Handle,
) -> Arc<ferrisix_proxy::UpstreamEnv> {
    let dns = settings.discovery.dns.as_ref();
    let options = ferrisix_proxy::dns::DnsOptions {
        servers: settings.apisix.dns_resolver.clone(),
        valid: settings
            .apisix
            .dns_resolver_valid
            .map(std::time::Duration::from_secs),
        enable_ipv6: settings.apisix.enable_ipv6,
        discovery_servers: dns.map(|d| {
            if d.servers.is_empty() {
                // `resolv_conf`: the name servers it lists.
                d.resolv_conf
                    .as_deref()
                    .and_then(|p| std::fs::read_to_string(p).ok())
                    .map(|t| {
                        t.lines()
                            .filter_map(|l| l.trim().strip_prefix("nameserver"))
                            .map(|s| s.trim().to_string())
                            .collect()
                    })
                    .unwrap_or_default()
            } else {
                d.servers.clone()
            }
        }),
        discovery_order: dns.map(|d| d.order.clone()).unwrap_or_default(),
        hosts_file: None,
    };
    Arc::new(ferrisix_proxy::UpstreamEnv {
        health: ferrisix_proxy::health::HealthService::new(executor.clone()),
        balancer: Default::default(),
        dns: ferrisix_proxy::dns::DnsResolver::new(&options, Some(executor)),
        prefix: settings.deployment.etcd.prefix.clone(),
    })
}

struct StoreSource {
    health: ferrisix_proxy::control::HealthProbe,
    states: Option<watch::Receiver<Arc<ConfigState>>>,
    snapshot: SnapshotHandle,
}

impl ferrisix_plugins::prometheus::node::NodeSource for StoreSource {
    fn etcd_reachable(&self) -> Option<bool> {
        Some((self.health)().reachable)
    }

    fn upstream_status(&self) -> Vec<(String, String, u16, bool)> {
        ferrisix_proxy::control::upstream_statuses(&self.snapshot.load())
    }

    fn modify_indexes(&self) -> Vec<(String, i64)> {
        match &self.states {
            Some(states) => modify_indexes(&states.borrow()),
            None => Vec::new(),
        }
    }
}

/// APISIX's `etcd_modify_index()`: per resource directory, the highest modify index of its
/// items (0 when empty), their maximum, and the store's current revision (`x_etcd_index`,
/// which APISIX reads from etcd's `X-Etcd-Index` header).
fn modify_indexes(state: &ConfigState) -> Vec<(String, i64)> {
    let mut out = Vec::with_capacity(11);
    let mut max = 0;
    // APISIX's order; stream_routes and protos are resources ferrisix does not load.
    for (key, kind) in [
        ("routes", Some(ResourceKind::Routes)),
        ("services", Some(ResourceKind::Services)),
        ("ssls", Some(ResourceKind::Ssls)),
        ("consumers", Some(ResourceKind::Consumers)),
        ("global_rules", Some(ResourceKind::GlobalRules)),
        ("upstreams", Some(ResourceKind::Upstreams)),
        ("stream_routes", None),
        ("protos", None),
    ] {
        let idx = kind
            .and_then(|k| state.items(k).map(|i| i.mod_revision).max())
            .unwrap_or(0);
        max = max.max(idx);
        out.push((key.to_owned(), idx));
        if key == "global_rules" && state.items(ResourceKind::GlobalRules).next().is_some() {
            // APISIX's global_rules config `prev_index`: the store revision its watch has seen.
            out.push(("prev_index".to_owned(), state.revision));
        }
    }
    out.push(("max_modify_index".to_owned(), max));
    out.push(("x_etcd_index".to_owned(), state.revision));
    out
}

/// The prometheus export server on `plugin_attr.prometheus.export_addr`, serving `export_uri`.
/// With `enable_export_server: false` there is none: a route with the `public-api` plugin
/// serves `export_uri` on the data port instead, as in APISIX.
pub fn start_prometheus_export(
    settings: &Settings,
    rt: &tokio::runtime::Runtime,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<(), String> {
    let attr = &settings.plugin_attr.prometheus;
    if !attr.enable_export_server {
        tracing::info!(uri = %attr.export_uri, "prometheus: no export server; a route with the public-api plugin serves the metrics");
        return Ok(());
    }
    let addr = SocketAddr::new(attr.export_addr.ip, attr.export_addr.port);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(addr))
        .map_err(|e| format!("cannot listen on {addr} for prometheus metrics: {e}"))?;
    rt.spawn(ferrisix_plugins::prometheus::server::serve(
        listener,
        &ferrisix_plugins::runtime().metrics,
        shutdown,
    ));
    tracing::info!(%addr, uri = %attr.export_uri, "prometheus metrics exported");
    Ok(())
}
