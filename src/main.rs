//! The `ferrisix` binary: reads `config.yaml`, starts the configured store, and wires the data
//! plane to it. All behaviour lives in the crates; this file only connects them.
#![forbid(unsafe_code)]

mod cli;

use std::process::ExitCode;
use std::sync::Arc;

use ferrisix_config::provider::FileProvider;
use ferrisix_config::settings::{ProviderKind, Settings};
use ferrisix_plugins::PluginRegistry;
use ferrisix_proxy::snapshot;

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

fn run(settings: Settings) -> Result<(), String> {
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the control runtime: {e}"))?;
    let options = cli::compile_options(&settings);
    let handle = snapshot::new_handle(options);

    let (states, health): (_, ferrisix_proxy::control::HealthProbe) = match settings.provider() {
        kind @ (ProviderKind::Yaml | ProviderKind::Json) => {
            let path = settings.standalone_file();
            let format = kind.file_format().unwrap_or(ferrisix_config::provider::Format::Yaml);
            let (rx, _task) = control
                .block_on(async { FileProvider::start(path.clone(), format) })
                .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
            tracing::info!(file = %path.display(), "standalone mode: watching the config file");
            let probe_rx = rx.clone();
            let health = Arc::new(move || ferrisix_config::store::StoreHealth {
                reachable: true,
                synced: true,
                revision: probe_rx.borrow().revision,
                detail: format!("standalone file {}", path.display()),
            });
            (rx, health)
        }
        other => {
            return Err(format!(
                "config provider {other:?} is not available in this build yet; use deployment.role: data_plane with role_data_plane.config_provider: yaml"
            ))
        }
    };

    // Compile the first state before accepting traffic, so the first request sees the routes.
    let first = states.borrow().clone();
    let (registry, unknown) = PluginRegistry::enabled(settings.plugins.as_deref());
    for name in unknown {
        tracing::warn!(plugin = %name, "config.yaml enables a plugin ferrisix does not have; ignored");
    }
    let plugins = Arc::new(registry);
    handle.store(Arc::new(snapshot::Snapshot::compile(
        &first,
        &handle.load(),
        options,
        plugins.as_ref(),
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
            shutdown_rx.clone(),
        ));
    }

    let gateway = Arc::new(cli::gateway(&settings, handle));
    let server_options = cli::server_options(&settings);
    let server = ferrisix_proxy::server::start(gateway, server_options.clone(), shutdown_rx)
        .map_err(|e| format!("cannot listen on {:?}: {e}", server_options.listen))?;
    tracing::info!(
        listen = ?server_options.listen,
        workers = server_options.workers,
        "ferrisix {} serving",
        env!("CARGO_PKG_VERSION")
    );

    control.block_on(async {
        cli::wait_for_signal().await;
    });
    tracing::info!("shutting down: no new connections, finishing requests in flight");
    let _ = shutdown_tx.send(true);
    server.wait();
    tracing::info!("stopped");
    Ok(())
}
