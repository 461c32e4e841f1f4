//! The `ferrisix` binary: reads `config.yaml`, starts the configured store, and wires the data
//! plane to it. All behaviour lives in the crates; this file only connects them.
#![forbid(unsafe_code)]

mod cli;
mod sources;

use std::process::ExitCode;
use std::sync::Arc;

use ferrisix_config::settings::{Role, Settings};
use ferrisix_plugin_api::{Clock, Executor, PluginServices};
use ferrisix_plugins::PluginRegistry;
use ferrisix_proxy::snapshot;

// mimalloc: the proxy path's small, short-lived allocations (header maps, hyper's per-request
// channels) cost glibc malloc ~4% of CPU under load in profiles; mimalloc's thread-local free
// lists make them cheaper (benches/e2e, README "Performance").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = match cli::Args::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("ferrisix: {msg}\n\n{}", cli::USAGE);
            return ExitCode::from(2);
        }
    };
    if args.help {
        println!("{}", cli::USAGE);
        return ExitCode::SUCCESS;
    }
    if args.version {
        println!("ferrisix {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();

    let settings = match cli::load_settings(&args) {
        Ok(s) => s,
        Err(msg) => {
            eprintln!("ferrisix: {msg}");
            return ExitCode::FAILURE;
        }
    };
    if args.test_only {
        return cli::check(&settings);
    }
    match run(settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            tracing::error!("{msg}");
            ExitCode::FAILURE
        }
    }
}

fn run(mut settings: Settings) -> Result<(), String> {
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the control runtime: {e}"))?;
    // The plugins' background tasks (Redis connections, their releases) run here, off the
    // workers and off the control thread's compiles.
    let background = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("ferrisix-background")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the background runtime: {e}"))?;
    let services = Arc::new(
        PluginServices::new(
            settings.plugin_attr.clone(),
            Executor::new(background.handle().clone()),
            Clock::system(),
        )
        .with_tls_ports(if settings.apisix.ssl.enable {
            settings.apisix.ssl.listen.iter().map(|l| l.port).collect()
        } else {
            Vec::new()
        }),
    );
    // Health probes and DNS lookups run on the control runtime, never on a worker.
    let upstreams = cli::upstream_services(&settings, control.handle().clone());
    let options = cli::compile_options(&settings, upstreams)?;
    let handle = snapshot::new_handle(&options);

    let source = control.block_on(sources::open(&settings))?;
    let states = source.states.clone();
    let health = source.health.clone();

    // Compile the first state before accepting traffic, so the first request sees the routes.
    let first = states.borrow().clone();
    let (registry, unknown) = PluginRegistry::new(services.clone(), settings.plugins.as_deref());
    for name in unknown {
        tracing::warn!(plugin = %name, "config.yaml enables a plugin ferrisix does not have; ignored");
    }
    // Standalone files have no modify indexes to report.
    let store_states = source.store.as_ref().map(|_| states.clone());
    cli::configure_plugins(&services, health.clone(), store_states, handle.clone());
    let prometheus_enabled = registry.get("prometheus").is_some();
    let plugins = Arc::new(registry.clone());
    handle.store(Arc::new(snapshot::Snapshot::compile(
        &first,
        &handle.load(),
        &options,
        &plugins,
    )));
    control.spawn(snapshot::follow(states, handle.clone(), options, plugins));
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);

    if settings.apisix.enable_control {
        let addr =
            std::net::SocketAddr::new(settings.apisix.control.ip, settings.apisix.control.port);
        let listener = control
            .block_on(tokio::net::TcpListener::bind(addr))
            .map_err(|e| format!("cannot listen on {addr} for the control API: {e}"))?;
        let api = Arc::new(ferrisix_proxy::control::ControlApi {
            snapshot: handle.clone(),
            health,
        });
        control.spawn(ferrisix_proxy::control::serve(
            listener,
            api,
            cli::conn_limits(&settings),
            shutdown_rx.clone(),
        ));
    }

    let mut admin = None;
    if settings.admin_enabled() {
        match source.store.clone() {
            Some(store) => {
                for notice in ferrisix_admin::keys::ensure_admin_keys(&mut settings) {
                    // Printed whatever the log filter: this is how the operator learns the key.
                    eprintln!("ferrisix: {notice}");
                }
                admin = Some(control.block_on(sources::start_admin(
                    &settings,
                    store,
                    registry,
                    shutdown_rx.clone(),
                ))?);
            }
            None => tracing::info!("Admin API off: the standalone file is the configuration"),
        }
    }

    if prometheus_enabled {
        cli::start_prometheus_export(&settings, &services, &control, shutdown_rx.clone())?;
    }

    // A control_plane node serves only the Admin API, as in APISIX.
    let server = if settings.deployment.role == Role::ControlPlane {
        tracing::info!("control_plane role: Admin API only, no data-plane listeners");
        None
    } else {
        let mut gateway = cli::gateway(&settings, handle, services.conn_stats().clone());
        if settings.ferrisix.admin_on_data_port {
            match admin.clone() {
                Some(api) => {
                    tracing::warn!("ferrisix.admin_on_data_port: the Admin API also answers loopback clients on the data port (APISIX 2.x compatibility)");
                    gateway.legacy_admin = Some(sources::legacy_admin(api));
                }
                None => tracing::warn!(
                    "ferrisix.admin_on_data_port is set but this node has no Admin API"
                ),
            }
        }
        let gateway = Arc::new(gateway);
        let server_options = cli::server_options(&settings);
        let server = ferrisix_proxy::server::start(gateway, server_options.clone(), shutdown_rx)
            .map_err(|e| format!("cannot listen on {:?}: {e}", server_options.listen))?;
        tracing::info!(
            listen = ?server_options.listen,
            workers = server_options.workers,
            "ferrisix {} serving",
            env!("CARGO_PKG_VERSION")
        );
        Some(server)
    };

    control.block_on(async {
        cli::wait_for_signal().await;
    });
    tracing::info!("shutting down: no new connections, finishing requests in flight");
    let _ = shutdown_tx.send(true);
    if let Some(server) = server {
        server.wait();
    }
    // The requests are over: the loggers' buffered batches go out before the process ends.
    let flushed = background.block_on(
        services
            .shutdown()
            .drain(settings.nginx_config.worker_shutdown_timeout),
    );
    if !flushed {
        tracing::warn!("shutdown timeout reached with log batches still being sent");
    }
    tracing::info!("stopped");
    Ok(())
}
