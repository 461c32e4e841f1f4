//! Command-line parsing and the translation of `config.yaml` settings into the options of
//! each crate.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use ferrisix_config::reopen::LogReopen;
use ferrisix_config::settings::{AccessLogTarget, HttpRouter, Settings};
use ferrisix_config::state::ConfigState;
use ferrisix_net::ListenerSet;
use ferrisix_plugin_api::PluginServices;
use ferrisix_plugins::log::log_rotate;
use ferrisix_plugins::observe::prometheus::Metrics;
use ferrisix_plugins::PluginRegistry;
use ferrisix_proxy::log::access::{AccessLog, LogSink};
use ferrisix_proxy::server::{Http2Limits, Listen};
use ferrisix_proxy::{
    CompileOptions, Gateway, RealIpConfig, ServerOptions, SnapshotHandle, WorkerModel,
};
use ferrisix_router::RouterKind;
use http::HeaderValue;
use tokio::sync::watch;

pub const USAGE: &str = "usage: ferrisix [-c CONFIG] [-t] [-V]

  -c, --config FILE   config.yaml to use (default: conf/config.yaml if present, else built-in defaults)
  -t, --test          check the configuration (and the standalone file) and exit 0 or 1
  -V, --version       print the version, the commit, the features and the plugins built in
  -h, --help          print this help

Signals: TERM/INT stop (finishing requests in flight), HUP re-reads config.yaml, USR1 reopens
the log files, USR2 starts the binary again, which takes the listening sockets over (upgrade).
Starting ferrisix while another one runs on the same config takes over from it likewise.

Environment: RUST_LOG sets the log filter (replaces nginx_config.error_log_level);
FERRISIX_WORKER_MODEL=shared runs one multi-threaded runtime instead of one single-threaded
runtime per worker.";

/// `ferrisix --version`: what was built, from what.
pub fn version_text() -> String {
    let plugins: Vec<&str> = PluginRegistry::builtin().list().map(|p| p.name).collect();
    format!(
        "ferrisix {}\ncommit: {}\nfeatures: {}\ntarget: {} ({})\nplugins: {}",
        env!("CARGO_PKG_VERSION"),
        env!("FERRISIX_COMMIT"),
        env!("FERRISIX_FEATURES"),
        env!("FERRISIX_TARGET"),
        env!("FERRISIX_PROFILE"),
        plugins.join(", ")
    )
}

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

/// The settings and the warnings about them (logged once the log is set up from them).
pub fn load_settings(args: &Args) -> Result<(Settings, Vec<String>), String> {
    match &args.config {
        Some(path) => Settings::load(path),
        None => Settings::load_or_default(&PathBuf::from("conf/config.yaml")),
    }
    .map_err(|e| e.to_string())
}

/// `ferrisix -t`: like `nginx -t`, reports every problem and exits 0 or 1.
pub fn check(settings: &Settings) -> ExitCode {
    let mut problems = Vec::new();
    if let Err(e) = ferrisix_tls::TlsSettings::new(&settings.apisix.ssl, &settings.config_dir()) {
        problems.push(e.to_string());
    }
    // Only a standalone file holds resources to check; a store's are checked as they are
    // written.
    // `wasm.plugins`: every module read and compiled, as at boot.
    let wasm = ferrisix_wasm::WasmPlugins::load(
        &settings.wasm,
        &settings.ferrisix.wasm,
        Some(&settings.config_dir()),
        |name| ferrisix_plugins::builtin().any(|d| d.name == name),
    )
    .unwrap_or_else(|errors| {
        problems.extend(errors);
        ferrisix_wasm::WasmPlugins::none()
    });
    if let Err(e) = log_rotator(settings, &LogReopen::new()) {
        problems.push(e);
    }
    if settings.provider().file_format().is_some() {
        let (registry, unknown) = PluginRegistry::enabled(settings.plugins.as_deref());
        let registry = registry.with_plugins(wasm.defs());
        problems.extend(
            unknown
                .iter()
                .map(|n| format!("plugins: unknown plugin {n}")),
        );
        problems.extend(ferrisix_config::check::standalone_problems(
            settings, &registry,
        ));
    }
    for p in &problems {
        eprintln!("ferrisix: {p}");
    }
    if problems.is_empty() {
        eprintln!("ferrisix: configuration test is successful");
        ExitCode::SUCCESS
    } else {
        eprintln!("ferrisix: configuration test failed");
        ExitCode::FAILURE
    }
}

/// Fails when `apisix.ssl` cannot be used (an unknown cipher name, an unreadable
/// `ssl_trusted_certificate` ...), with the key's name. `upstreams`: what upstreams compile
/// with ([`upstream_services`]).
pub fn compile_options(
    settings: &Settings,
    upstreams: Arc<ferrisix_proxy::UpstreamServices>,
    background: tokio::runtime::Handle,
) -> Result<CompileOptions, String> {
    let tls = ferrisix_tls::TlsSettings::new(&settings.apisix.ssl, &settings.config_dir())?;
    let mut tls = ferrisix_tls::TlsContext::new(tls, settings.apisix.data_encryption.keyring());
    // ocsp-stapling enabled (by the `plugins` list, or by its absence, which enables every
    // plugin): the ssls that ask get their OCSP answers stapled, fetched on `background`.
    let stapling = settings
        .plugins
        .as_deref()
        .is_none_or(|p| p.iter().any(|n| n == "ocsp-stapling"));
    if stapling {
        tls = tls.with_ocsp(ferrisix_tls::ocsp::OcspStapler::new(background));
    }
    Ok(CompileOptions {
        router: match settings.apisix.router.http {
            HttpRouter::RadixtreeHostUri => RouterKind::HostUri,
            HttpRouter::RadixtreeUri => RouterKind::Uri,
            HttpRouter::RadixtreeUriWithParameter => RouterKind::UriWithParameter,
        },
        tls: Arc::new(tls),
        upstreams,
    })
}

/// What upstreams compile with: the health probers and the resolver, both running on
/// `executor` (never on a worker), and the etcd prefix that names health checkers.
pub fn upstream_services(
    settings: &Settings,
    executor: tokio::runtime::Handle,
) -> Arc<ferrisix_proxy::UpstreamServices> {
    let dns = settings.discovery.dns.as_ref();
    let options = ferrisix_proxy::upstream::dns::DnsOptions {
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
    // Registries' HTTPS is verified against `ssl_trusted_certificate` when one is named (an
    // unreadable one fails in `compile_options`), else the system's bundle.
    let trusted = settings
        .apisix
        .ssl
        .ssl_trusted_certificate
        .as_deref()
        .filter(|t| *t != "system")
        .and_then(|_| {
            ferrisix_tls::TlsSettings::new(&settings.apisix.ssl, &settings.config_dir()).ok()
        })
        .map(|t| t.trusted);
    let discovery = ferrisix_proxy::upstream::discovery::Discovery::start(
        &settings.discovery,
        ferrisix_proxy::upstream::discovery::DiscoveryEnv {
            executor: executor.clone(),
            trusted,
            metrics: Default::default(),
        },
    );
    Arc::new(ferrisix_proxy::UpstreamServices {
        health: ferrisix_proxy::upstream::health::HealthService::new(executor.clone())
            .disabled(settings.apisix.disable_upstream_healthcheck),
        balancer: Default::default(),
        dns: ferrisix_proxy::upstream::dns::DnsResolver::new(&options, Some(executor)),
        prefix: settings.deployment.etcd.prefix.clone(),
        inline: Default::default(),
        discovery,
    })
}

/// The data plane's gateway; `stats` are the plugins' services' connection statistics.
pub fn gateway(
    settings: &Settings,
    snapshot: SnapshotHandle,
    stats: Arc<ferrisix_plugin_api::ConnStats>,
    reopen: &LogReopen,
) -> Gateway {
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
        real_ip: RealIpConfig::new(
            &http.real_ip_header,
            http.real_ip_from.nets.clone(),
            http.real_ip_recursive,
        ),
        show_upstream_status: settings.apisix.show_upstream_status_in_response_header,
        access_log: Arc::new(
            AccessLog::new(sink, &http.access_log_format)
                .with_escape(http.access_log_format_escape)
                .with_reopen(reopen.clone()),
        ),
        stats,
        legacy_admin: None,
        client_body_timeout: http.client_body_timeout,
        client_max_body_size: http.client_max_body_size,
    }
}

/// The log-rotate timer's state, when config.yaml's `plugins` list names log-rotate (APISIX's
/// default list leaves it out, so a config without a list does not rotate): the error log and
/// the access log where they are files, moved by `plugin_attr.log-rotate`. Fails on a bad
/// `plugin_attr.log-rotate`.
pub fn log_rotator(
    settings: &Settings,
    reopen: &LogReopen,
) -> Result<Option<log_rotate::LogRotator>, String> {
    let listed = settings
        .plugins
        .as_deref()
        .is_some_and(|p| p.iter().any(|n| n == log_rotate::NAME));
    if !listed {
        return Ok(None);
    }
    let attr =
        log_rotate::RotateAttr::from_attr(settings.plugin_attr.others.get(log_rotate::NAME))?;
    let mut logs = Vec::new();
    match &settings.nginx_config.error_log {
        Some(AccessLogTarget::File(path)) => logs.push(log_rotate::RotatedLog {
            kind: "error.log",
            path: path.clone(),
            reopen: reopen.clone(),
        }),
        _ => tracing::info!(
            "log-rotate: nginx_config.error_log is not a file (stderr by default); only the access log is rotated"
        ),
    }
    let http = &settings.nginx_config.http;
    if let (true, AccessLogTarget::File(path)) = (http.enable_access_log, &http.access_log) {
        logs.push(log_rotate::RotatedLog {
            kind: "access.log",
            path: path.clone(),
            reopen: reopen.clone(),
        });
    }
    Ok(Some(log_rotate::LogRotator::new(attr, logs)))
}

pub fn server_options(settings: &Settings) -> ServerOptions {
    let model = match std::env::var("FERRISIX_WORKER_MODEL").as_deref() {
        Ok("shared") => WorkerModel::Shared,
        _ => WorkerModel::PerCore,
    };
    let ipv6 = settings.apisix.enable_ipv6 && ipv6_available();
    let pp = &settings.apisix.proxy_protocol;
    let ssl = &settings.apisix.ssl;
    let tls_listen = if ssl.enable { &ssl.listen[..] } else { &[] };
    ServerOptions {
        listen: listens(&settings.apisix.node_listen, ipv6, |_| false)
            .into_iter()
            .chain(proxy_protocol_listens(settings, pp.listen_http_port, ipv6))
            .collect(),
        workers: settings.nginx_config.worker_processes.resolve(),
        model,
        shutdown_timeout: settings.nginx_config.worker_shutdown_timeout,
        limits: conn_limits(settings),
        tls_listen: listens(tls_listen, ipv6, |l| l.enable_http3)
            .into_iter()
            .chain(proxy_protocol_listens(settings, pp.listen_https_port, ipv6))
            .collect(),
        http2: {
            let h = settings.ferrisix.http2;
            Http2Limits {
                max_concurrent_streams: h.max_concurrent_streams,
                max_header_list_size: h.max_header_list_size,
                initial_stream_window_size: h.initial_stream_window_size,
                initial_connection_window_size: h.initial_connection_window_size,
                max_frame_size: h.max_frame_size,
            }
        },
    }
}

/// The listeners of `node_listen` / `ssl.listen`, as APISIX's `listen_table_insert` makes
/// them: each address once, and with `ipv6` (`apisix.enable_ipv6`) an entry that named no
/// address (a bare port, or a map without `ip`) also on `[::]` of its port.
fn listens(
    entries: &[ferrisix_config::settings::ListenAddr],
    ipv6: bool,
    http3: impl Fn(&ferrisix_config::settings::ListenAddr) -> bool,
) -> Vec<Listen> {
    let mut out: Vec<Listen> = Vec::new();
    let mut push = |addr: SocketAddr, l: &ferrisix_config::settings::ListenAddr| {
        if !out.iter().any(|o| o.addr == addr) {
            out.push(Listen {
                addr,
                http2: l.enable_http2,
                proxy_protocol: false,
                http3: http3(l),
            });
        }
    };
    for l in entries {
        push(SocketAddr::new(l.ip, l.port), l);
        if ipv6 && l.any_address {
            push(
                SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), l.port),
                l,
            );
        }
    }
    out
}

/// The listeners of `apisix.proxy_protocol.listen_http_port` / `listen_https_port`: every
/// IPv4 address (APISIX's `listen <port> default_server proxy_protocol`), and `[::]` with
/// `ipv6` (`enable_ipv6`), HTTP/2 as the server's.
fn proxy_protocol_listens(settings: &Settings, port: Option<u16>, ipv6: bool) -> Vec<Listen> {
    let Some(port) = port else {
        return Vec::new();
    };
    let mut ips = vec![std::net::IpAddr::from([0, 0, 0, 0])];
    if ipv6 {
        ips.push(std::net::Ipv6Addr::UNSPECIFIED.into());
    }
    ips.into_iter()
        .map(|ip| Listen {
            addr: SocketAddr::new(ip, port),
            http2: settings.apisix.enable_http2,
            proxy_protocol: true,
            http3: false,
        })
        .collect()
}

/// Whether this host can open IPv6 sockets at all: a kernel without IPv6 (or a container
/// with it disabled) gets IPv4 listeners only and a warning, where nginx would fail to
/// start on `[::]`.
fn ipv6_available() -> bool {
    match std::net::TcpListener::bind((std::net::Ipv6Addr::LOCALHOST, 0)) {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %e, "apisix.enable_ipv6: this host has no IPv6, listening on IPv4 only");
            false
        }
    }
}

/// nginx's per-connection timers (`nginx_config.http`), for every listener.
pub fn conn_limits(settings: &Settings) -> ferrisix_net::ConnLimits {
    let http = &settings.nginx_config.http;
    ferrisix_net::ConnLimits {
        header_timeout: http.client_header_timeout,
        keepalive_timeout: http.keepalive_timeout,
        send_timeout: http.send_timeout,
    }
}

/// Tells prometheus where the store's health and modify indexes come from: `health`
/// answers `apisix_etcd_reachable`; `states` (a store's, `None` for the standalone file,
/// which has no modify indexes) answers `apisix_etcd_modify_indexes`.
pub fn configure_plugins(
    services: &PluginServices,
    health: ferrisix_proxy::control::HealthProbe,
    states: Option<watch::Receiver<Arc<ConfigState>>>,
    snapshot: SnapshotHandle,
    stream: Option<ferrisix_proxy::control::StreamCheckers>,
) {
    services
        .shared::<Metrics>()
        .set_node_source(Box::new(StoreSource {
            health,
            states,
            snapshot,
            stream,
        }));
}

struct StoreSource {
    health: ferrisix_proxy::control::HealthProbe,
    states: Option<watch::Receiver<Arc<ConfigState>>>,
    /// The health checkers' nodes, for `apisix_upstream_status`.
    snapshot: SnapshotHandle,
    /// The stream routes' checkers, which APISIX's `get_health_checkers` lists too.
    stream: Option<ferrisix_proxy::control::StreamCheckers>,
}

impl ferrisix_plugins::observe::prometheus::NodeSource for StoreSource {
    fn etcd_reachable(&self) -> Option<bool> {
        Some((self.health)().reachable)
    }

    fn upstream_status(&self) -> Vec<(String, String, u16, bool)> {
        let mut out = ferrisix_proxy::control::upstream_statuses(&self.snapshot.load());
        if let Some(read) = &self.stream {
            for (_, checker) in read() {
                if let Some(c) = checker {
                    out.extend(ferrisix_proxy::control::checker_statuses(&c));
                }
            }
        }
        out
    }

    fn modify_indexes(&self) -> Vec<(String, i64)> {
        match &self.states {
            Some(states) => states.borrow().modify_indexes(),
            None => Vec::new(),
        }
    }
}

/// The prometheus export server on `plugin_attr.prometheus.export_addr`, serving `export_uri`.
/// With `enable_export_server: false` there is none: a route with the `public-api` plugin
/// serves `export_uri` on the data port instead, as in APISIX.
pub fn start_prometheus_export(
    settings: &Settings,
    services: &PluginServices,
    rt: &tokio::runtime::Runtime,
    sockets: &mut ListenerSet,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<(), String> {
    let attr = &settings.plugin_attr.prometheus;
    if !attr.enable_export_server {
        tracing::info!(uri = %attr.export_uri, "prometheus: no export server; a route with the public-api plugin serves the metrics");
        return Ok(());
    }
    let addr = SocketAddr::new(attr.export_addr.ip, attr.export_addr.port);
    let listener = listen_one(sockets, addr, "prometheus metrics")?;
    let metrics = services.shared::<Metrics>();
    let limits = conn_limits(settings);
    rt.spawn(async move {
        match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => {
                ferrisix_plugins::observe::prometheus::server::serve(l, metrics, limits, shutdown)
                    .await
            }
            Err(e) => tracing::error!(error = %e, "prometheus metrics: cannot use the listener"),
        }
    });
    tracing::info!(%addr, uri = %attr.export_uri, "prometheus metrics exported");
    Ok(())
}

/// The one listening socket of a single-loop server (Admin, control, metrics) on `addr`:
/// the predecessor's, else a fresh one.
pub fn listen_one(
    sockets: &mut ListenerSet,
    addr: SocketAddr,
    what: &str,
) -> Result<std::net::TcpListener, String> {
    sockets
        .take_one(addr)
        .map_err(|e| format!("cannot listen on {addr} for {what}: {e}"))?
        .pop()
        .ok_or_else(|| format!("cannot listen on {addr} for {what}: no socket"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(yaml: &str) -> Settings {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, yaml).unwrap();
        Settings::load(&path).unwrap().0
    }

    fn addrs(l: &[Listen]) -> Vec<String> {
        l.iter()
            .map(|l| format!("{}{}", l.addr, if l.proxy_protocol { " pp" } else { "" }))
            .collect()
    }

    /// APISIX's `listen_table_insert`: an entry without an address also listens on `[::]`
    /// when `enable_ipv6` (the default) is on; one with an address does not.
    #[test]
    fn enable_ipv6_adds_the_any_address_listeners() {
        let yaml = "apisix:\n  node_listen:\n    - 9080\n    - ip: 127.0.0.1\n      port: 9081\n    - port: 9082\n    - \"127.0.0.1:9083\"\n  ssl:\n    listen:\n      - port: 9443\n        enable_http3: true\n      - ip: 127.0.0.1\n        port: 9444\n  proxy_protocol:\n    listen_http_port: 9181\n";
        let s = settings(yaml);
        let plain = |ipv6| {
            let mut l = listens(&s.apisix.node_listen, ipv6, |_| false);
            l.extend(proxy_protocol_listens(
                &s,
                s.apisix.proxy_protocol.listen_http_port,
                ipv6,
            ));
            addrs(&l)
        };
        assert_eq!(
            plain(true),
            [
                "0.0.0.0:9080",
                "[::]:9080",
                "127.0.0.1:9081",
                "0.0.0.0:9082",
                "[::]:9082",
                "127.0.0.1:9083",
                "0.0.0.0:9181 pp",
                "[::]:9181 pp",
            ]
        );
        assert_eq!(
            plain(false),
            [
                "0.0.0.0:9080",
                "127.0.0.1:9081",
                "0.0.0.0:9082",
                "127.0.0.1:9083",
                "0.0.0.0:9181 pp",
            ]
        );
        let tls = listens(&s.apisix.ssl.listen, true, |l| l.enable_http3);
        assert_eq!(addrs(&tls), ["0.0.0.0:9443", "[::]:9443", "127.0.0.1:9444"]);
        assert!(tls[0].http3 && tls[1].http3 && !tls[2].http3);
        assert!(proxy_protocol_listens(&s, None, true).is_empty());

        // server_options reads apisix.enable_ipv6.
        let off = settings(&yaml.replace("apisix:\n", "apisix:\n  enable_ipv6: false\n"));
        assert_eq!(addrs(&server_options(&off).listen), plain(false));
    }
}
