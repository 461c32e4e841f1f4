//! The services shared by every plugin of one gateway, made once (by the binary) and passed
//! down: never globals, so two gateways in one process share nothing.
//!
//! - a [`Clock`] (monotonic and wall milliseconds; a manual one for tests),
//! - an [`Executor`] for background tasks (Redis connections, batch processors, probes): no
//!   crate starts a thread or runtime of its own,
//! - an [`HttpClient`] for plugins that call out (`http` and `https`), and the [`TlsClient`]
//!   plugins speaking TLS over their own connections use (tcp-logger, syslog): both verify
//!   against the gateway's trusted CA bundle,
//! - the connection statistics the proxy core writes and prometheus reads ([`ConnStats`]),
//! - `plugin_attr` from `config.yaml`,
//! - the graceful [`Shutdown`] background work holds open,
//! - the log-reopen signal ([`LogReopen`], SIGUSR1 after logrotate moved the files away): a
//!   plugin that writes a file compares [`LogReopen::generation`] with the one it opened the
//!   file at before each write (an atomic load) and reopens the path when they differ, or
//!   waits on [`LogReopen::subscribe`] in a background task,
//! - where the external plugin runner listens ([`ExtRunner`], `ext-plugin` in config.yaml),
//! - typed shared states ([`SharedState`]): one value per type and gateway, made on first use
//!   (the Redis pools, the metrics registry, the counter spaces of the limit plugins).

use std::any::{Any, TypeId};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

pub use ferrisix_config::reopen::LogReopen;
use ferrisix_config::settings::{GraphqlSettings, PluginAttr, ProxyCacheSettings};

use crate::clock::Clock;
use crate::error_log::ErrorLogTap;
use crate::exec::Executor;
use crate::ext_runner::ExtRunner;
use crate::http_client::HttpClient;
use crate::shutdown::Shutdown;
use crate::stats::ConnStats;
use crate::tls_client::TlsClient;

/// A value shared by every plugin of one gateway, one per type, made on first use.
pub trait SharedState: Any + Send + Sync {
    fn create(services: &PluginServices) -> Self;
}

/// The services of one gateway.
pub struct PluginServices {
    clock: Clock,
    executor: Executor,
    http: HttpClient,
    tls: Arc<TlsClient>,
    conn_stats: Arc<ConnStats>,
    attr: PluginAttr,
    /// The HTTPS listeners' ports (`apisix.ssl.listen` when `apisix.ssl.enable`).
    tls_ports: Vec<u16>,
    /// `nginx_config.http.real_ip_header`, lower-cased.
    real_ip_header: String,
    /// `apisix.proxy_cache`: the zones proxy-cache stores answers in.
    proxy_cache: Option<Arc<ProxyCacheSettings>>,
    graphql_max_size: usize,
    shutdown: Shutdown,
    log_reopen: LogReopen,
    error_log: Arc<ErrorLogTap>,
    ext_runner: Arc<ExtRunner>,
    shared: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    texts: Mutex<HashSet<&'static str>>,
}

impl std::fmt::Debug for PluginServices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginServices")
            .field("executor", &self.executor)
            .finish_non_exhaustive()
    }
}

impl Default for PluginServices {
    /// Default `plugin_attr`, the system clock, tasks on the caller's runtime.
    fn default() -> Self {
        PluginServices::new(PluginAttr::default(), Executor::current(), Clock::system())
    }
}

impl PluginServices {
    pub fn new(attr: PluginAttr, executor: Executor, clock: Clock) -> PluginServices {
        let tls = Arc::new(TlsClient::new(None));
        PluginServices {
            http: HttpClient::with_tls(executor.clone(), &tls),
            tls,
            clock,
            executor,
            conn_stats: Arc::new(ConnStats::new()),
            attr,
            tls_ports: Vec::new(),
            real_ip_header: "x-real-ip".to_owned(),
            proxy_cache: Some(Arc::new(ProxyCacheSettings::default())),
            graphql_max_size: GraphqlSettings::default().max_size,
            shutdown: Shutdown::new(),
            log_reopen: LogReopen::new(),
            error_log: Arc::new(ErrorLogTap::new()),
            ext_runner: Arc::new(ExtRunner::default()),
            shared: Mutex::new(HashMap::new()),
            texts: Mutex::new(HashSet::new()),
        }
    }

    /// The gateway's own error log, as the binary's log hands it over (error-log-logger).
    pub fn error_log(&self) -> &Arc<ErrorLogTap> {
        &self.error_log
    }

    /// Reads the gateway's error log from `tap` (the one the binary's log writes to).
    pub fn with_error_log(mut self, tap: Arc<ErrorLogTap>) -> PluginServices {
        self.error_log = tap;
        self
    }

    /// The external plugin runner the `ext-plugin-*` plugins talk to.
    pub fn ext_runner(&self) -> &Arc<ExtRunner> {
        &self.ext_runner
    }

    /// Talks to the runner `runner` describes (`ext-plugin` of config.yaml; the binary
    /// supervises the runner itself when `ext-plugin.cmd` is set).
    pub fn with_ext_runner(mut self, runner: Arc<ExtRunner>) -> PluginServices {
        self.ext_runner = runner;
        self
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    pub fn executor(&self) -> &Executor {
        &self.executor
    }

    pub fn http(&self) -> &HttpClient {
        &self.http
    }

    /// TLS over a plugin's own connections.
    pub fn tls(&self) -> &Arc<TlsClient> {
        &self.tls
    }

    /// Verifies plugins' TLS peers against `roots` (`apisix.ssl.ssl_trusted_certificate`)
    /// instead of the system's bundle.
    pub fn with_tls_roots(mut self, roots: Arc<rustls::RootCertStore>) -> PluginServices {
        self.tls = Arc::new(TlsClient::new(Some(roots)));
        self.http = HttpClient::with_tls(self.executor.clone(), &self.tls);
        self
    }

    /// Connection and request counters (written by the proxy core).
    pub fn conn_stats(&self) -> &Arc<ConnStats> {
        &self.conn_stats
    }

    /// The gateway's HTTPS ports, for plugins that send clients there (redirect's
    /// `http_to_https`).
    pub fn with_tls_ports(mut self, ports: Vec<u16>) -> PluginServices {
        self.tls_ports = ports;
        self
    }

    /// `nginx_config.http.real_ip_header`: the header batch-requests sets the client's
    /// address in on the requests it sends back to the gateway.
    pub fn with_real_ip_header(mut self, name: &str) -> PluginServices {
        self.real_ip_header = name.to_ascii_lowercase();
        self
    }

    /// `nginx_config.http.real_ip_header`, lower-cased (`x-real-ip` unless set).
    pub fn real_ip_header(&self) -> &str {
        &self.real_ip_header
    }

    /// `apisix.proxy_cache` as config.yaml has it (APISIX's default zones unless set).
    pub fn with_proxy_cache(mut self, zones: Option<ProxyCacheSettings>) -> PluginServices {
        self.proxy_cache = zones.map(Arc::new);
        self
    }

    /// The cache zones; `None` when config.yaml set `apisix.proxy_cache` to nothing.
    /// config.yaml's `graphql.max_size`.
    pub fn with_graphql_max_size(mut self, max_size: usize) -> PluginServices {
        self.graphql_max_size = max_size;
        self
    }

    /// The largest GraphQL request the GraphQL plugins read (`graphql.max_size`).
    pub fn graphql_max_size(&self) -> usize {
        self.graphql_max_size
    }

    pub fn proxy_cache(&self) -> Option<&Arc<ProxyCacheSettings>> {
        self.proxy_cache.as_ref()
    }

    /// The HTTPS ports; empty when TLS is off.
    pub fn tls_ports(&self) -> &[u16] {
        &self.tls_ports
    }

    /// The gateway's graceful shutdown: background work that must not be lost (the loggers'
    /// batches) holds it open; the binary starts and drains it.
    pub fn shutdown(&self) -> &Shutdown {
        &self.shutdown
    }

    /// `plugin_attr` of `config.yaml`.
    pub fn plugin_attr(&self) -> &PluginAttr {
        &self.attr
    }

    /// The signal to reopen log files (SIGUSR1), shared with the access log and the error
    /// log: see the module documentation.
    pub fn log_reopen(&self) -> &LogReopen {
        &self.log_reopen
    }

    /// A copy of `text` that lives as long as the process, made once per gateway and text: for
    /// header names and values that every request clones, since a static header clones
    /// without touching a reference count all worker threads would contend on. Bounded by the
    /// distinct texts configured.
    pub fn static_text(&self, text: &str) -> &'static str {
        let mut texts = self.texts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = texts.get(text) {
            return s;
        }
        let s: &'static str = Box::leak(text.to_owned().into_boxed_str());
        texts.insert(s);
        s
    }

    /// This gateway's `T`, made on first use.
    pub fn shared<T: SharedState>(&self) -> Arc<T> {
        let id = TypeId::of::<T>();
        let lock = || self.shared.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = lock().get(&id) {
            if let Ok(v) = v.clone().downcast::<T>() {
                return v;
            }
        }
        // Made without the lock held: `create` may ask for other shared states.
        let made: Arc<dyn Any + Send + Sync> = Arc::new(T::create(self));
        let v = lock().entry(id).or_insert(made).clone();
        v.downcast::<T>().expect("stored under its own type id")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    use super::*;

    static MADE: AtomicUsize = AtomicUsize::new(0);

    struct Counter(AtomicU64);

    impl SharedState for Counter {
        fn create(_: &PluginServices) -> Self {
            MADE.fetch_add(1, Ordering::Relaxed);
            Counter(AtomicU64::new(0))
        }
    }

    #[test]
    fn shared_state_is_per_services_value() {
        let a = PluginServices::default();
        let b = PluginServices::default();
        a.shared::<Counter>().0.fetch_add(1, Ordering::Relaxed);
        assert_eq!(a.shared::<Counter>().0.load(Ordering::Relaxed), 1);
        assert_eq!(b.shared::<Counter>().0.load(Ordering::Relaxed), 0);
        assert_eq!(MADE.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn manual_clock() {
        let c = Clock::manual(5_000);
        assert_eq!((c.mono_ms(), c.epoch_ms()), (1000, 5000));
        c.advance(250);
        assert_eq!((c.mono_ms(), c.epoch_ms()), (1250, 5250));
        let s = Clock::system();
        assert!(s.mono_ms() >= 1000 && s.epoch_ms() > 1_600_000_000_000);
    }

    #[tokio::test]
    async fn executor_runs_detached_tasks() {
        assert_eq!(
            Executor::current()
                .spawn(async { 7 })
                .unwrap()
                .await
                .unwrap(),
            7
        );
        let handle = tokio::runtime::Handle::current();
        assert_eq!(
            Executor::new(handle)
                .spawn(async { 8 })
                .unwrap()
                .await
                .unwrap(),
            8
        );
    }
}
