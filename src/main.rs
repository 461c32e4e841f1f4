//! The `ferrisix` binary: reads `config.yaml`, starts the configured store, and wires the data
//! plane to it. All behaviour lives in the crates; this file only connects them.
#![forbid(unsafe_code)]

mod cli;
mod ext_runner;
mod lifecycle;
mod logging;
mod reload;
mod sources;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use ferrisix_config::reopen::LogReopen;
use ferrisix_config::settings::{ProviderKind, Role, Settings};
use ferrisix_net::handover::{self, HandoverServer, Successor};
use ferrisix_net::ListenerSet;
use ferrisix_plugin_api::{Clock, Executor, ExtRunner, PluginServices};
use ferrisix_plugins::PluginRegistry;
use ferrisix_proxy::server::GatewayHandle;
use ferrisix_proxy::snapshot;
use lifecycle::Event;

// mimalloc: the proxy path makes many small, short-lived allocations per request (header
// maps, hyper's per-request channels); mimalloc's thread-local free lists make them cheaper
// than glibc malloc's (`benches/e2e/bench.py` and `benches/e2e/instructions.py` measure it).
#[global_allocator]
static ALLOCATOR: ferrisix_alloc::Mimalloc = ferrisix_alloc::Mimalloc;

/// Writes `text` and a newline to stdout. A reader that went away (`ferrisix -V | head -1`)
/// is no error of ours: `println!` would panic on the broken pipe.
fn print_stdout(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}

fn main() -> ExitCode {
    let args = match cli::Args::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("ferrisix: {msg}\n\n{}", cli::USAGE);
            return ExitCode::from(2);
        }
    };
    if args.help {
        print_stdout(cli::USAGE);
        return ExitCode::SUCCESS;
    }
    if args.version {
        print_stdout(&cli::version_text());
        return ExitCode::SUCCESS;
    }
    let settings = match cli::load_settings(&args) {
        Ok(s) => s,
        Err(msg) => {
            eprintln!("ferrisix: {msg}");
            return ExitCode::FAILURE;
        }
    };
    let reopen = LogReopen::new();
    let log = logging::init(&settings.0, &reopen);
    for w in &settings.1 {
        tracing::warn!("{w}");
    }
    let settings = settings.0;
    if args.test_only {
        return cli::check(&settings);
    }
    match run(settings, log, reopen) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            tracing::error!("{msg}");
            ExitCode::FAILURE
        }
    }
}

/// Finds a running ferrisix on the hand-over socket and takes its listening sockets; on the
/// embedded store it also asks it to close the store. Without one, an empty set.
fn take_over(settings: &Settings) -> Result<(Option<Successor>, ListenerSet), String> {
    let Some(path) = settings.handover_socket() else {
        return Ok((None, ListenerSet::new()));
    };
    match handover::connect(&path) {
        Ok(None) => Ok((None, ListenerSet::new())),
        Ok(Some((predecessor, sockets))) => {
            tracing::info!(
                pid = predecessor.pid,
                version = %predecessor.version,
                "taking over from the running process: its listening sockets came over"
            );
            if settings.provider() == ProviderKind::Embedded {
                predecessor.release().map_err(|e| {
                    format!("the running process did not release the embedded store: {e}")
                })?;
            }
            Ok((Some(predecessor), sockets))
        }
        Err(e) => {
            tracing::warn!(socket = %path.display(), error = %e, "hand-over socket: no usable predecessor; binding afresh");
            Ok((None, ListenerSet::new()))
        }
    }
}

/// Runs `f` on a thread that ends with it. For the boot's big allocations (the store's read,
/// the first compile): they are freed later by other threads (compiles, the Admin API's
/// deletions), and mimalloc gives a page back only once its owner collects it, which the main
/// thread, parked until shutdown, never does; an ended thread's pages are freed by whoever
/// empties them.
fn on_ending_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(f)
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn run(
    mut settings: Settings,
    mut log: logging::LogControl,
    reopen: LogReopen,
) -> Result<(), String> {
    // A thread of its own (not the main thread's block_on) drives the control tasks, so that
    // the main thread and the hand-over thread can wait on them (an Admin API drain) while
    // they run. Its threads (and the compiles' helpers they start) run nicer than the
    // workers: on busy cores a change takes longer to apply rather than requests longer to
    // answer. `benches/e2e/scale.py` measures both sides: the request p99 under 50 changes/s
    // against idle, and the compile's wall time beside its CPU time, which the priority
    // leaves unchanged.
    let control = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("ferrisix-control")
        // Store reads and compiles run on this runtime's blocking threads, and what they free
        // (a boot's whole store read, tens of MiB at 100,000 routes) goes back to the system
        // when such a thread next allocates or ends. Tokio keeps an idle one 10 s; after 1 s a
        // boot's memory is back soon after serving starts, for one thread start per change
        // after a quiet second (`benches/e2e/scale.py` reads the RSS 3 s after a boot).
        .thread_keep_alive(std::time::Duration::from_secs(1))
        .on_thread_start(ferrisix_net::yield_to_workers)
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
    let mut services = PluginServices::new(
        settings.plugin_attr.clone(),
        Executor::new(background.handle().clone()),
        Clock::system(),
    )
    .with_error_log(log.error_log().clone())
    .with_tls_ports(if settings.apisix.ssl.enable {
        settings.apisix.ssl.listen.iter().map(|l| l.port).collect()
    } else {
        Vec::new()
    })
    .with_proxy_cache(settings.apisix.proxy_cache.clone())
    .with_graphql_max_size(settings.graphql.max_size)
    .with_real_ip_header(&settings.nginx_config.http.real_ip_header);
    let ext_runner = Arc::new(ExtRunner::new(
        settings.ext_plugin_socket(),
        settings.ferrisix.ext_plugin_timeout,
    ));
    services = services.with_ext_runner(ext_runner.clone());
    // The plugins' TLS peers (log servers, HTTPS endpoints) are verified against the CA
    // bundle upstreams use, as APISIX's `lua_ssl_trusted_certificate` serves both (a bad
    // bundle is reported by the compile options below).
    if let Ok(tls) = ferrisix_tls::TlsSettings::new(&settings.apisix.ssl, &settings.config_dir()) {
        services = services.with_tls_roots(tls.trusted);
    }
    let services = Arc::new(services);
    // One reopen signal for the access log, the error log and the plugins' file loggers.
    let reopen_for_plugins = services.log_reopen().clone();
    // Health probes and DNS lookups run on the control runtime, never on a worker.
    let upstreams = cli::upstream_services(&settings, control.handle().clone());
    let options = cli::compile_options(&settings, upstreams, background.handle().clone())?;
    let handle = snapshot::new_handle(&options);

    // `ext-plugin.cmd`: the runner starts with the gateway, as APISIX's privileged agent
    // starts it, and is stopped once the requests are over.
    let runner = match &settings.ext_plugin.cmd {
        Some(cmd) => Some(ext_runner::start(cmd.clone(), ext_runner.clone())?),
        None => None,
    };

    // Before opening the store: a predecessor on the embedded store closes it first.
    let (predecessor, mut sockets) = take_over(&settings)?;

    let opening = std::time::Instant::now();
    // On a thread that ends with it, as the first compile below: the store's whole read (the
    // stored texts of every route) is freed later by other threads, into pages the parked main
    // thread would never collect (`benches/e2e/scale.py` ends with every route deleted in a
    // burst and reads the RSS after it).
    let source = on_ending_thread(|| control.block_on(sources::open(&settings)))?;
    let opened = opening.elapsed();
    let states = source.states.clone();
    let health = source.health.clone();

    // config.yaml's `wasm.plugins`: compiled once here, registered beside the built-in ones.
    let wasm = ferrisix_wasm::WasmPlugins::load(
        &settings.wasm,
        &settings.ferrisix.wasm,
        Some(&settings.config_dir()),
        |name| ferrisix_plugins::builtin().any(|d| d.name == name),
    )
    .map_err(|errors| errors.join("; "))?;
    wasm.install(&services)?;
    let (mut registry, unknown) =
        PluginRegistry::new(services.clone(), settings.plugins.as_deref());
    registry = registry.with_plugins(wasm.defs());
    // As APISIX's `enable_gde`: the plugins' `encrypt_fields` are stored encrypted on a store
    // the Admin API writes, never in a standalone file.
    let encryption = &settings.apisix.data_encryption;
    if source.store.is_some() && encryption.enable_encrypt_fields {
        registry = registry.with_encrypted_fields(encryption.keyring());
    }
    for name in unknown {
        tracing::warn!(plugin = %name, "config.yaml enables a plugin ferrisix does not have; ignored");
    }
    // Standalone files have no modify indexes to report.
    let store_states = source.store.as_ref().map(|_| states.clone());
    // The stream table, published by the stream proxy's compile (a data-plane role only),
    // read by the control API and `apisix_upstream_status` for its routes' checkers.
    let stream_serving =
        settings.apisix.proxy_mode.stream() && settings.deployment.role != Role::ControlPlane;
    let stream_table: ferrisix_stream::StreamHandle = Arc::new(ArcSwap::from_pointee(
        ferrisix_stream::StreamTable::default(),
    ));
    let stream_checkers: Option<ferrisix_proxy::control::StreamCheckers> =
        stream_serving.then(|| {
            let table = stream_table.clone();
            Arc::new(move || table.load().checkers()) as ferrisix_proxy::control::StreamCheckers
        });
    cli::configure_plugins(
        &services,
        health.clone(),
        store_states,
        handle.clone(),
        stream_checkers.clone(),
    );
    let (stream_plugins, unknown_stream) =
        ferrisix_plugins::stream::StreamPlugins::new(settings.stream_plugins.as_deref());
    let stream_on = settings.apisix.proxy_mode.stream();
    if stream_on {
        for name in unknown_stream {
            tracing::warn!(plugin = %name, "config.yaml enables a stream plugin ferrisix does not have; ignored");
        }
    }
    let prometheus_enabled = registry.get("prometheus").is_some()
        || (stream_on && stream_plugins.priority("prometheus").is_some());
    let plugins = Arc::new(registry.clone());
    // The control API's `/v1/schema`: the plugin list is read once, so made once.
    let control_schema = settings.apisix.enable_control.then(|| {
        Arc::new(serde_json::json!({
            "main": ferrisix_admin::core_schema_catalog(),
            "plugins": ferrisix_admin::http_plugin_catalog(&registry),
            "stream_plugins": ferrisix_admin::stream_plugin_catalog(&registry, &stream_plugins),
        }))
    });
    let compiling = std::time::Instant::now();
    // Compile the first state before accepting traffic, so the first request sees the routes.
    // The state is let go once compiled: held here, it kept the boot's whole store read (every
    // route's stored text) alive for the life of the process, after every route was replaced
    // or deleted.
    // `$secret://` and `$env://` references are resolved between the store and the compile
    // (fetched before the first compile, refreshed in the background), so the compile and the
    // request path only ever see values.
    let lru = &settings.apisix.lru.secret;
    let ttl = ferrisix_plugins::secrets::CacheTtl {
        ttl: std::time::Duration::from_secs_f64(lru.ttl.max(0.0)),
        neg_ttl: std::time::Duration::from_secs_f64(lru.neg_ttl.max(0.0)),
    };
    let mut resolver = ferrisix_plugins::secrets::SecretResolver::new(services.clone(), ttl)
        .with_decryptor(registry.field_decryptor());
    let first = states.borrow().clone();
    let first = Arc::new(control.block_on(resolver.resolve(first)));
    let (resolved_tx, resolved) = tokio::sync::watch::channel(first.clone());
    control.spawn(resolver.run(states.clone(), resolved_tx));
    let snapshot = {
        on_ending_thread(|| snapshot::Snapshot::compile(&first, &handle.load(), &options, &plugins))
    };
    drop(first);
    // The boot's stages, for whoever wonders where the time to serving went.
    tracing::info!(
        revision = snapshot.revision,
        routes = snapshot.router.len(),
        quarantined = snapshot.quarantine.len(),
        store_read_us = opened.as_micros() as u64,
        elapsed_us = compiling.elapsed().as_micros() as u64,
        validate_us = snapshot.stages.validate.as_micros() as u64,
        routes_us = snapshot.stages.routes.as_micros() as u64,
        table_us = snapshot.stages.table.as_micros() as u64,
        "first configuration compiled; serving starts"
    );
    handle.store(Arc::new(snapshot));
    let (published_tx, published_rx) = tokio::sync::watch::channel(0);
    control.spawn(snapshot::follow(
        resolved,
        handle.clone(),
        options,
        plugins,
        published_tx,
    ));
    // log-rotate: its timer moves the logs aside off the request path.
    if let Some(rotator) = cli::log_rotator(&settings, &reopen)? {
        background.spawn(rotator.run());
    }
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let shutdown_rx_stream = shutdown_rx.clone();
    // The data plane's accepting ends with this one when the sockets wait for a successor.
    let (linger_tx, linger_rx) = tokio::sync::watch::channel(false);

    if settings.apisix.enable_control {
        let addr =
            std::net::SocketAddr::new(settings.apisix.control.ip, settings.apisix.control.port);
        let listener = cli::listen_one(&mut sockets, addr, "the control API")?;
        let api = Arc::new(ferrisix_proxy::control::ControlApi {
            snapshot: handle.clone(),
            health: health.clone(),
            stream: stream_checkers.clone(),
            schema: control_schema.clone(),
        });
        let limits = cli::conn_limits(&settings);
        let shutdown = shutdown_rx.clone();
        control.spawn(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => ferrisix_proxy::control::serve(l, api, limits, shutdown).await,
                Err(e) => tracing::error!(error = %e, "control API: cannot use its listener"),
            }
        });
    }

    if let Some(status) = &settings.apisix.status {
        let addr = std::net::SocketAddr::new(status.ip, status.port);
        let listener = cli::listen_one(&mut sockets, addr, "the status API")?;
        let api = Arc::new(ferrisix_proxy::control::ControlApi {
            snapshot: handle.clone(),
            health: health.clone(),
            stream: stream_checkers.clone(),
            schema: None,
        });
        let limits = cli::conn_limits(&settings);
        let shutdown = shutdown_rx.clone();
        control.spawn(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => ferrisix_proxy::control::serve_status(l, api, limits, shutdown).await,
                Err(e) => tracing::error!(error = %e, "status API: cannot use its listener"),
            }
        });
        tracing::info!(%addr, "status API listening");
    }

    let mut admin: Option<Arc<lifecycle::AdminServer>> = None;
    if settings.admin_enabled() {
        match source.store.clone() {
            Some(store) => {
                for notice in ferrisix_admin::keys::ensure_admin_keys(&mut settings) {
                    // Printed whatever the log filter: this is how the operator learns the key.
                    eprintln!("ferrisix: {notice}");
                }
                let listen = &settings.deployment.admin.admin_listen;
                let addr = std::net::SocketAddr::new(listen.ip, listen.port);
                let listener = cli::listen_one(&mut sockets, addr, "the Admin API")?;
                let api = control.block_on(sources::admin_api(
                    &settings,
                    store,
                    source.standalone.clone(),
                    registry,
                ));
                let server = Arc::new(lifecycle::AdminServer::new(
                    api,
                    listener,
                    cli::conn_limits(&settings),
                    control.handle().clone(),
                ));
                server
                    .start()
                    .map_err(|e| format!("cannot start the Admin API on {addr}: {e}"))?;
                tracing::info!(%addr, "Admin API listening");
                admin = Some(server);
            }
            None => tracing::info!("Admin API off: the standalone file is the configuration"),
        }
    }

    if prometheus_enabled {
        cli::start_prometheus_export(
            &settings,
            &services,
            &control,
            &mut sockets,
            shutdown_rx.clone(),
        )?;
    }

    // The stream proxy: its own runtime, beside the HTTP workers (a data-plane role only).
    // Its listeners are bound before the HTTP port opens, so a node that answers HTTP has
    // its stream ports too (and one that cannot bind them fails before serving anything).
    let _stream_runtime = if stream_serving {
        Some(start_stream(
            &settings,
            stream_table,
            handle.clone(),
            published_rx,
            stream_plugins,
            services.clone(),
            &control,
            shutdown_rx_stream.clone(),
        )?)
    } else {
        None
    };

    // A control_plane node serves only the Admin API, as in APISIX.
    let mut gateway_handle = None;
    let server = if settings.deployment.role == Role::ControlPlane {
        tracing::info!("control_plane role: Admin API only, no data-plane listeners");
        None
    } else {
        let mut gateway = cli::gateway(
            &settings,
            handle.clone(),
            services.conn_stats().clone(),
            &reopen,
        );
        if settings.ferrisix.admin_on_data_port {
            match &admin {
                Some(server) => {
                    tracing::warn!("ferrisix.admin_on_data_port: the Admin API also answers loopback clients on the data port (APISIX 2.x compatibility)");
                    gateway.legacy_admin = Some(sources::legacy_admin(server.api().clone()));
                }
                None => tracing::warn!(
                    "ferrisix.admin_on_data_port is set but this node has no Admin API"
                ),
            }
        }
        let gateway: GatewayHandle = Arc::new(ArcSwap::from_pointee(gateway));
        gateway_handle = Some(gateway.clone());
        let server_options = cli::server_options(&settings);
        let server = ferrisix_proxy::server::start_with(
            gateway,
            server_options.clone(),
            &mut sockets,
            shutdown_rx,
            Some(linger_rx),
        )
        .map_err(|e| format!("cannot listen on {:?}: {e}", server_options.listen))?;
        tracing::info!(
            listen = ?server_options.listen,
            workers = server_options.workers,
            "ferrisix {} serving",
            env!("CARGO_PKG_VERSION")
        );
        Some(server)
    };
    sockets.close_unused();

    // Serving: the predecessor stops accepting and drains.
    if let Some(predecessor) = predecessor {
        let pid = predecessor.pid;
        match predecessor.stop() {
            Ok(()) => tracing::info!(
                pid,
                "the previous process stopped accepting; it drains and exits"
            ),
            Err(e) => {
                tracing::warn!(pid, error = %e, "the previous process did not confirm its stop")
            }
        }
    }
    let pid_file = match settings.pid_file() {
        Some(path) => match lifecycle::PidFile::write(&path) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot write the pid file");
                None
            }
        },
        None => None,
    };

    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let sockets = Arc::new(Mutex::new(sockets));
    let stopping = Arc::new(AtomicBool::new(false));
    let host = Arc::new(lifecycle::Host {
        admin: admin.clone(),
        embedded: source.embedded.clone(),
        events: events_tx.clone(),
        stopping: stopping.clone(),
    });
    let handover_server = match settings.handover_socket() {
        Some(path) => {
            match HandoverServer::start(&path, env!("CARGO_PKG_VERSION"), sockets.clone(), host) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(socket = %path.display(), error = %e, "no hand-over socket: a restart will not keep connections");
                    None
                }
            }
        }
        None => None,
    };
    {
        let _rt = control.enter();
        lifecycle::forward_signals(events_tx.clone())
            .map_err(|e| format!("cannot handle signals: {e}"))?;
    }

    let mut reloader = reload::Reloader {
        settings: settings.clone(),
        gateway: gateway_handle,
        snapshot: handle,
        stats: services.conn_stats().clone(),
        reopen: reopen.clone(),
    };
    let mut handed_over = control.block_on(async {
        while let Some(event) = events.recv().await {
            match event {
                Event::Stop => return false,
                Event::HandedOver => return true,
                Event::Reload => reloader.reload(&mut log),
                Event::Reopen => {
                    reopen.trigger();
                    reopen_for_plugins.trigger();
                    tracing::info!("SIGUSR1: log files reopened");
                }
                Event::Upgrade => lifecycle::spawn_successor(),
            }
        }
        false
    });
    stopping.store(true, Ordering::Release);
    let wait = settings.ferrisix.handover_wait;
    // Whether the listening sockets stay open a while for a successor (a start after the
    // SIGTERM, which takes them over with their queues). Meanwhile this process goes on
    // accepting and answers every connection that comes, closing it after its answer: a
    // connection left queued would wait out `handover_wait` and then be reset when the sockets
    // close, where nginx (no successor to wait for) refuses it at once. No signal tells that a
    // successor is coming, so answering is the only way to lose nothing either way.
    let keep_sockets = !handed_over && !wait.is_zero() && handover_server.is_some();
    if handed_over {
        tracing::info!("a successor serves now: finishing requests in flight");
    } else if !keep_sockets {
        tracing::info!("shutting down: listeners closed, finishing requests in flight");
    } else {
        tracing::info!(
            handover_wait = ?wait,
            "shutting down: finishing requests in flight; the listening sockets stay open for a successor meanwhile, and the connections they get are answered and closed"
        );
    }
    let _ = shutdown_tx.send(true);
    if !keep_sockets {
        let _ = linger_tx.send(true);
        sockets.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
    if let Some(admin) = &admin {
        admin.stop();
    }
    if keep_sockets {
        // Wait for a successor to take the sockets over (it then sends STOP), for at most
        // `handover_wait` from the SIGTERM.
        let came = control.block_on(async {
            let deadline = tokio::time::sleep(wait);
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    () = &mut deadline => return false,
                    event = events.recv() => match event {
                        Some(Event::HandedOver) => return true,
                        Some(_) => {}
                        None => return false,
                    },
                }
            }
        });
        if came {
            tracing::info!("a successor took the listening sockets over");
            handed_over = true;
        } else {
            tracing::info!("no successor came: listeners closed");
        }
        let _ = linger_tx.send(true);
        sockets.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
    if let Some(server) = server {
        server.wait();
    }
    if let Some(runner) = runner {
        runner.stop();
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
    drop(handover_server);
    match pid_file {
        Some(pid_file) if handed_over => pid_file.hand_over(),
        other => drop(other),
    }
    tracing::info!("stopped");
    Ok(())
}

/// Binds the stream listeners and serves them on a runtime of their own, compiling the stream
/// routes of every published snapshot on the control runtime.
#[allow(clippy::too_many_arguments)]
fn start_stream(
    settings: &Settings,
    table: ferrisix_stream::StreamHandle,
    snapshots: ferrisix_proxy::SnapshotHandle,
    published: tokio::sync::watch::Receiver<i64>,
    plugins: ferrisix_plugins::stream::StreamPlugins,
    services: Arc<PluginServices>,
    control: &tokio::runtime::Runtime,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<tokio::runtime::Runtime, String> {
    let proxy = &settings.apisix.stream_proxy;
    if proxy.tcp.is_empty() && proxy.udp.is_empty() {
        tracing::warn!("apisix.proxy_mode includes stream but apisix.stream_proxy lists no tcp or udp listener");
    }
    let listeners = ferrisix_stream::Listeners::bind(
        &proxy.tcp,
        &proxy.udp,
        &settings.nginx_config.stream.real_ip_from.nets,
    )?;
    let (xrpc, not_built) = ferrisix_config::xrpc::XrpcProtocols::new(&settings.xrpc.names());
    for name in not_built {
        tracing::warn!(protocol = %name, "config.yaml enables an xRPC protocol ferrisix does not have; stream routes naming it are refused");
    }
    let env = Arc::new(ferrisix_stream::StreamEnv {
        plugins,
        services,
        xrpc,
    });
    control.spawn(ferrisix_stream::follow(
        snapshots,
        published,
        table.clone(),
        env,
    ));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("ferrisix-stream")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the stream runtime: {e}"))?;
    {
        let _rt = runtime.enter();
        listeners.serve(table, ferrisix_stream::StreamTimeouts::default(), shutdown)?;
    }
    tracing::info!(
        tcp = ?proxy.tcp.iter().map(|l| format!("{}:{}{}", l.ip, l.port, if l.tls { " tls" } else { "" })).collect::<Vec<_>>(),
        udp = ?proxy.udp.iter().map(|l| format!("{}:{}", l.ip, l.port)).collect::<Vec<_>>(),
        "stream proxy listening"
    );
    Ok(runtime)
}
