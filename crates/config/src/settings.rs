//! `config.yaml`: the process settings (listeners, timeouts, logging, deployment role, Admin API,
//! etcd, prometheus export), with APISIX's key names and APISIX's default for every key.
//!
//! This file is the model: the typed settings, their defaults, and what they mean together
//! ([`Settings::provider`], the paths derived from them). Reading a file into it is in `load`;
//! the value types of loosely typed keys in `values`, their parsers in `de`, writing a
//! generated admin key back in [`save`].

mod de;
pub mod discovery;
mod load;
pub mod save;
mod values;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;

use crate::provider::Format;

pub use load::SettingsError;
pub use values::{ExtraLabel, ListenAddr, RealIpFrom, WorkerProcesses};

/// The whole of `config.yaml`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Settings {
    pub apisix: ApisixSettings,
    pub nginx_config: NginxConfig,
    pub deployment: Deployment,
    /// Enabled HTTP plugins. `None` = APISIX's default list (every plugin ferrisix has).
    pub plugins: Option<Vec<String>>,
    /// Enabled stream plugins. `None` = APISIX's default stream list.
    pub stream_plugins: Option<Vec<String>>,
    pub plugin_attr: PluginAttr,
    /// Service discovery (`discovery.<registry>`, see [`discovery`]).
    pub discovery: DiscoverySettings,
    /// `wasm.plugins`: proxy-wasm plugins (ferrisix-wasm).
    pub wasm: WasmSettings,
    /// The external plugin runner (`ext-plugin`).
    #[serde(rename = "ext-plugin")]
    pub ext_plugin: ExtPluginSettings,
    /// `graphql`: how much of a request the GraphQL plugins read.
    pub graphql: GraphqlSettings,
    /// `xrpc.protocols`: the xRPC protocols stream routes may name.
    pub xrpc: XrpcSettings,
    /// ferrisix-only keys.
    pub ferrisix: FerrisixSettings,
    /// The file these settings came from; relative paths in them resolve against its directory.
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

/// The `apisix:` section.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct ApisixSettings {
    /// Data-plane HTTP listeners.
    #[serde(deserialize_with = "de::node_listen")]
    pub node_listen: Vec<ListenAddr>,
    pub enable_admin: bool,
    /// Server-wide HTTP/2 switch (APISIX 3.9+ renders `http2 on;` for every listener, which on
    /// a plain port means h2c with prior knowledge). A `node_listen` entry's own
    /// `enable_http2` overrides it for that listener.
    pub enable_http2: bool,
    /// `Server: APISIX/<version>` when true, `Server: APISIX` when false.
    pub enable_server_tokens: bool,
    pub show_upstream_status_in_response_header: bool,
    pub delete_uri_tail_slash: bool,
    pub normalize_uri_like_servlet: bool,
    pub router: RouterSettings,
    pub proxy_mode: ProxyMode,
    /// The stream proxy's listeners, used when `proxy_mode` includes `stream`.
    pub stream_proxy: StreamProxySettings,
    /// `apisix.proxy_protocol`: the HTTP listeners that require a PROXY protocol header, and
    /// the stream ports' defaults for reading and sending one.
    pub proxy_protocol: ProxyProtocolSettings,
    /// The control API (readiness, applied revision, dumps).
    pub enable_control: bool,
    pub control: ControlListen,
    /// `apisix.status`: the status API (`/status`, `/status/ready`) on its own address; off
    /// when the key is absent, as in APISIX.
    pub status: Option<StatusListen>,
    /// The TLS data-plane listener.
    pub ssl: SslSettings,
    /// Encryption of stored secrets (ssl keys, plugins' `encrypt_fields`).
    pub data_encryption: DataEncryption,
    /// Name servers (`ip` or `ip:port`) for domain nodes; empty = the system's resolv.conf.
    pub dns_resolver: Vec<String>,
    /// Seconds a resolved address is kept, overriding the record's TTL when set.
    pub dns_resolver_valid: Option<u64>,
    /// A name with only IPv6 addresses is usable (APISIX prefers IPv4 either way).
    pub enable_ipv6: bool,
    /// The global switch off for upstream health checks (`checks` are then ignored).
    pub disable_upstream_healthcheck: bool,
    /// The cache zones proxy-cache stores answers in (`None`: the key set to null, so
    /// proxy-cache checks no zone names, as APISIX's `check_schema` without the section).
    pub proxy_cache: Option<ProxyCacheSettings>,
    /// `apisix.lru`: the caches' lifetimes (ferrisix reads `secret`).
    pub lru: LruSettings,
}

/// `apisix.lru`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct LruSettings {
    pub secret: SecretLru,
}

/// `apisix.lru.secret`: how long a resolved secret reference is kept (`ttl`) and a failed
/// one (`neg_ttl`), in seconds. `count` and `neg_count` bound APISIX's per-worker LRU; ferrisix
/// keeps one entry per reference in use, so they are read and not needed.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct SecretLru {
    pub ttl: f64,
    pub count: u64,
    pub neg_ttl: f64,
    pub neg_count: u64,
}

impl Default for SecretLru {
    fn default() -> SecretLru {
        SecretLru {
            ttl: 300.0,
            count: 512,
            neg_ttl: 60.0,
            neg_count: 512,
        }
    }
}

/// `apisix.proxy_cache`: how long the disk strategy keeps an answer that says nothing of its
/// freshness, and the zones proxy-cache confs name.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct ProxyCacheSettings {
    /// nginx's `proxy_cache_valid any <cache_ttl>` for the disk zones.
    #[serde(deserialize_with = "de::duration")]
    pub cache_ttl: Duration,
    pub zones: Vec<CacheZone>,
}

/// One zone of `apisix.proxy_cache.zones`: a disk zone when it has `disk_path` (nginx's
/// `proxy_cache_path`), else a memory zone (a `lua_shared_dict` of `memory_size`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct CacheZone {
    pub name: String,
    /// A memory zone's bytes; a disk zone's key index (nginx's `keys_zone` size).
    #[serde(deserialize_with = "de::size")]
    pub memory_size: u64,
    #[serde(default, deserialize_with = "de::opt_size")]
    pub disk_size: Option<u64>,
    #[serde(default)]
    pub disk_path: Option<String>,
    /// Directory levels of the file names (`"1:2"`).
    #[serde(default)]
    pub cache_levels: Option<String>,
}

/// nginx's `levels=`: 1 to 3 directory levels named by 1 or 2 hex characters each.
pub fn cache_levels(levels: &str) -> Option<Vec<u8>> {
    let parsed: Vec<u8> = levels
        .split(':')
        .map(|l| match l {
            "1" => Some(1),
            "2" => Some(2),
            _ => None,
        })
        .collect::<Option<_>>()?;
    (1..=3).contains(&parsed.len()).then_some(parsed)
}

impl Default for ProxyCacheSettings {
    /// APISIX's default zones (`apisix/cli/config.lua`).
    fn default() -> Self {
        ProxyCacheSettings {
            cache_ttl: Duration::from_secs(10),
            zones: vec![
                CacheZone {
                    name: "disk_cache_one".into(),
                    memory_size: 50 << 20,
                    disk_size: Some(1 << 30),
                    disk_path: Some("/tmp/disk_cache_one".into()),
                    cache_levels: Some("1:2".into()),
                },
                CacheZone {
                    name: "memory_cache".into(),
                    memory_size: 50 << 20,
                    disk_size: None,
                    disk_path: None,
                    cache_levels: None,
                },
            ],
        }
    }
}

pub use discovery::DiscoverySettings;

/// The `ext-plugin:` section: the runner the `ext-plugin-*` plugins talk to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ExtPluginSettings {
    /// The runner's command line (program and arguments); the gateway starts it, restarts it
    /// when it exits and stops it on shutdown.
    pub cmd: Option<Vec<String>>,
    /// The runner's socket instead of `apisix-<pid>.sock` beside config.yaml (APISIX uses it
    /// in its tests; a runner started by hand listens there).
    pub path_for_test: Option<PathBuf>,
}

/// `discovery.dns` (APISIX's `apisix/discovery/dns/schema.lua`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct DnsDiscoverySettings {
    /// `ip:port` of the name servers.
    pub servers: Vec<String>,
    /// A resolv.conf to read the name servers from instead.
    pub resolv_conf: Option<String>,
    /// Record types tried in turn (`last`, `SRV`, `A`, `AAAA`, `CNAME`).
    pub order: Vec<String>,
}

/// `apisix.ssl`: the HTTPS listeners and their TLS settings. Certificates come from `ssls`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct SslSettings {
    pub enable: bool,
    /// Ports, `"ip:port"` strings or `{ip, port, enable_http3}` maps (default 9443);
    /// `enable_http3` adds HTTP/3 over QUIC on the same port.
    #[serde(deserialize_with = "de::node_listen")]
    pub listen: Vec<ListenAddr>,
    /// `TLSv1.2 TLSv1.3` (space separated, nginx's `ssl_protocols`).
    pub ssl_protocols: String,
    /// nginx/OpenSSL cipher names, `:` separated; they shape TLS 1.2 only, as in nginx.
    pub ssl_ciphers: String,
    pub ssl_session_tickets: bool,
    /// CA bundle for verifying upstreams (`tls.verify`): a PEM file, or `system`.
    pub ssl_trusted_certificate: Option<String>,
    /// The SNI assumed when a client sends none.
    pub fallback_sni: Option<String>,
}

/// APISIX's default `ssl_ciphers` (conf/config.yaml.example).
pub const DEFAULT_SSL_CIPHERS: &str = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:DHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES256-GCM-SHA384";

impl Default for SslSettings {
    fn default() -> Self {
        SslSettings {
            enable: true,
            listen: vec![ListenAddr::port(9443)],
            ssl_protocols: "TLSv1.2 TLSv1.3".to_owned(),
            ssl_ciphers: DEFAULT_SSL_CIPHERS.to_owned(),
            ssl_session_tickets: false,
            ssl_trusted_certificate: None,
            fallback_sni: None,
        }
    }
}

/// `apisix.data_encryption`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct DataEncryption {
    /// Encrypt the fields plugins list in `encrypt_fields` (ssl keys are encrypted whenever
    /// the keyring is not empty, as in APISIX).
    pub enable_encrypt_fields: bool,
    /// 16- or 32-byte keys; the first encrypts, all are tried to decrypt.
    #[serde(deserialize_with = "de::string_or_list")]
    pub keyring: Vec<String>,
}

impl Default for DataEncryption {
    fn default() -> Self {
        DataEncryption {
            enable_encrypt_fields: true,
            keyring: crate::encrypt::DEFAULT_KEYRING
                .iter()
                .map(|k| (*k).to_owned())
                .collect(),
        }
    }
}

impl DataEncryption {
    pub fn keyring(&self) -> crate::encrypt::Keyring {
        crate::encrypt::Keyring::new(&self.keyring).unwrap_or_default()
    }
}

/// `apisix.control`: where the control API listens (APISIX's default 127.0.0.1:9090).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ControlListen {
    pub ip: IpAddr,
    pub port: u16,
}

/// `apisix.status`: where the status API listens (APISIX's default 127.0.0.1:7085).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct StatusListen {
    pub ip: IpAddr,
    pub port: u16,
}

impl Default for StatusListen {
    fn default() -> Self {
        StatusListen {
            ip: IpAddr::from([127, 0, 0, 1]),
            port: 7085,
        }
    }
}

impl Default for ControlListen {
    fn default() -> Self {
        ControlListen {
            ip: IpAddr::from([127, 0, 0, 1]),
            port: 9090,
        }
    }
}

impl Default for ApisixSettings {
    fn default() -> Self {
        ApisixSettings {
            node_listen: vec![ListenAddr::port(9080)],
            enable_admin: true,
            enable_http2: true,
            enable_server_tokens: true,
            show_upstream_status_in_response_header: false,
            delete_uri_tail_slash: false,
            normalize_uri_like_servlet: false,
            router: RouterSettings::default(),
            proxy_mode: ProxyMode::Http,
            stream_proxy: StreamProxySettings::default(),
            proxy_protocol: ProxyProtocolSettings::default(),
            enable_control: true,
            control: ControlListen::default(),
            status: None,
            ssl: SslSettings::default(),
            data_encryption: DataEncryption::default(),
            dns_resolver: Vec::new(),
            dns_resolver_valid: None,
            enable_ipv6: true,
            disable_upstream_healthcheck: false,
            proxy_cache: Some(ProxyCacheSettings::default()),
            lru: LruSettings::default(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RouterSettings {
    pub http: HttpRouter,
}

/// `apisix.router.http`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HttpRouter {
    /// Host first, then URI (APISIX's default since 3.3).
    #[default]
    RadixtreeHostUri,
    RadixtreeUri,
    RadixtreeUriWithParameter,
}

/// `apisix.stream_proxy`: the L4 listeners. Each entry is a port, an `"ip:port"` string (a
/// port range `"ip:9100-9105"` too), or a map `{addr, tls}` whose `addr` is either.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct StreamProxySettings {
    #[serde(deserialize_with = "de::stream_listen")]
    pub tcp: Vec<StreamListen>,
    #[serde(deserialize_with = "de::stream_listen")]
    pub udp: Vec<StreamListen>,
}

/// One stream listener address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamListen {
    pub ip: IpAddr,
    pub port: u16,
    /// TLS is terminated on this port, the certificate chosen from `ssls` by SNI (TCP only).
    pub tls: bool,
    /// `proxy_protocol`: a PROXY protocol header must open each connection (TCP only). An
    /// entry without the key takes `apisix.proxy_protocol.enable_tcp_pp` once the file is
    /// read, so after loading it is `Some` on every TCP entry.
    pub proxy_protocol: Option<bool>,
    /// `proxy_protocol_to_upstream`: a v1 header is sent to the node before any byte of the
    /// session; without the key, `apisix.proxy_protocol.enable_tcp_pp_to_upstream`.
    pub proxy_protocol_to_upstream: Option<bool>,
}

impl StreamListen {
    /// `ip:port`, no TLS, no PROXY protocol.
    pub fn plain(ip: IpAddr, port: u16) -> StreamListen {
        StreamListen {
            ip,
            port,
            tls: false,
            proxy_protocol: None,
            proxy_protocol_to_upstream: None,
        }
    }

    /// Whether connections on this port open with a PROXY protocol header.
    pub fn accepts_proxy_protocol(&self) -> bool {
        self.proxy_protocol == Some(true)
    }

    /// Whether sessions on this port send a PROXY protocol header to their node.
    pub fn sends_proxy_protocol(&self) -> bool {
        self.proxy_protocol_to_upstream == Some(true)
    }
}

/// `apisix.proxy_protocol` (APISIX's `apisix/cli/schema.lua`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ProxyProtocolSettings {
    /// An HTTP listener on every IPv4 address of this port whose connections must open with
    /// a PROXY protocol header (nginx's `listen <port> proxy_protocol`).
    pub listen_http_port: Option<u16>,
    /// The same for HTTPS: the header, then the TLS handshake.
    pub listen_https_port: Option<u16>,
    /// The default of `proxy_protocol` on `stream_proxy.tcp` entries.
    pub enable_tcp_pp: bool,
    /// The default of `proxy_protocol_to_upstream` on `stream_proxy.tcp` entries.
    pub enable_tcp_pp_to_upstream: bool,
}

impl ProxyMode {
    /// Whether the stream proxy runs.
    pub fn stream(self) -> bool {
        matches!(self, ProxyMode::Stream | ProxyMode::HttpAndStream)
    }
}

/// `apisix.proxy_mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum ProxyMode {
    #[default]
    #[serde(rename = "http")]
    Http,
    #[serde(rename = "stream")]
    Stream,
    #[serde(rename = "http&stream")]
    HttpAndStream,
}

/// The `nginx_config:` section: the nginx directives APISIX renders that ferrisix honours.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct NginxConfig {
    /// The error log (ferrisix's own log lines): a path (relative to the working directory,
    /// as APISIX's `logs/error.log`), `stderr` or `stdout`. Absent: stderr, where a service
    /// manager or container engine collects it (APISIX writes `logs/error.log`).
    pub error_log: Option<AccessLogTarget>,
    /// `debug`, `info`, `notice`, `warn`, `error`, `crit`, `alert` or `emerg` (the last three
    /// log as `error`); `RUST_LOG`, when set, replaces it. Absent: `info` (APISIX: `warn`), so
    /// that a first run shows what it serves.
    pub error_log_level: Option<LogLevel>,
    pub worker_processes: WorkerProcesses,
    #[serde(deserialize_with = "de::duration")]
    pub worker_shutdown_timeout: Duration,
    pub http: NginxHttp,
    pub stream: NginxStream,
}

/// `nginx_config.stream`: what ferrisix reads of it.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct NginxStream {
    /// nginx stream's `set_real_ip_from`: peers trusted to name the client in the PROXY
    /// protocol header of a `proxy_protocol` port. From one of them, the header's address
    /// becomes `$remote_addr` (route matching, ip-restriction, limit-conn, the header sent
    /// upstream); from anyone else it is only `$proxy_protocol_addr`. Empty by default.
    pub real_ip_from: RealIpFrom,
}

impl Default for NginxStream {
    fn default() -> Self {
        NginxStream {
            real_ip_from: RealIpFrom {
                nets: Vec::new(),
                unix: false,
            },
        }
    }
}

impl Default for NginxConfig {
    fn default() -> Self {
        NginxConfig {
            error_log: None,
            error_log_level: None,
            worker_processes: WorkerProcesses::Auto,
            worker_shutdown_timeout: Duration::from_secs(240),
            http: NginxHttp::default(),
            stream: NginxStream::default(),
        }
    }
}

/// nginx's `error_log` levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Debug,
    Info,
    Notice,
    Warn,
    Error,
    Crit,
    Alert,
    Emerg,
}

impl LogLevel {
    /// The `tracing` filter directive for this level (tracing has no notice, crit, alert or
    /// emerg: notice logs as info, the last three as error).
    pub fn directive(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info | LogLevel::Notice => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error | LogLevel::Crit | LogLevel::Alert | LogLevel::Emerg => "error",
        }
    }
}

/// `nginx_config.http`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct NginxHttp {
    /// Header carrying the client address from a trusted peer.
    pub real_ip_header: String,
    /// Peers trusted to set `real_ip_header`.
    pub real_ip_from: RealIpFrom,
    /// nginx `real_ip_recursive`: `"on"`/`"off"` or a boolean.
    #[serde(deserialize_with = "de::on_off")]
    pub real_ip_recursive: bool,
    pub enable_access_log: bool,
    pub access_log: AccessLogTarget,
    pub access_log_format: String,
    pub access_log_format_escape: LogEscape,
    #[serde(deserialize_with = "de::duration")]
    pub keepalive_timeout: Duration,
    #[serde(deserialize_with = "de::duration")]
    pub client_header_timeout: Duration,
    #[serde(deserialize_with = "de::duration")]
    pub client_body_timeout: Duration,
    #[serde(deserialize_with = "de::duration")]
    pub send_timeout: Duration,
    /// Bytes; 0 = unlimited (APISIX's default, unlike nginx's 1m).
    #[serde(deserialize_with = "de::size")]
    pub client_max_body_size: u64,
    pub upstream: UpstreamKeepalive,
}

/// APISIX's default `nginx_config.http.access_log_format` (apisix/cli/config.lua).
pub const DEFAULT_ACCESS_LOG_FORMAT: &str = "$remote_addr - $remote_user [$time_local] $http_host \"$request\" $status $body_bytes_sent $request_time \"$http_referer\" \"$http_user_agent\" $upstream_addr $upstream_status $upstream_response_time \"$upstream_scheme://$upstream_host$upstream_uri\" \"$apisix_request_id\"";

impl Default for NginxHttp {
    fn default() -> Self {
        NginxHttp {
            real_ip_header: "X-Real-IP".to_owned(),
            real_ip_from: RealIpFrom::default(),
            real_ip_recursive: false,
            enable_access_log: true,
            access_log: AccessLogTarget::File(PathBuf::from("logs/access.log")),
            access_log_format: DEFAULT_ACCESS_LOG_FORMAT.to_owned(),
            access_log_format_escape: LogEscape::Default,
            keepalive_timeout: Duration::from_secs(60),
            client_header_timeout: Duration::from_secs(60),
            client_body_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(10),
            client_max_body_size: 0,
            upstream: UpstreamKeepalive::default(),
        }
    }
}

/// Where the access log goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccessLogTarget {
    Off,
    Stdout,
    Stderr,
    /// A path, relative to the working directory as in APISIX (`logs/access.log`).
    File(PathBuf),
}

impl<'de> Deserialize<'de> for AccessLogTarget {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(match s.as_str() {
            "off" => AccessLogTarget::Off,
            "stdout" | "/dev/stdout" => AccessLogTarget::Stdout,
            "stderr" | "/dev/stderr" => AccessLogTarget::Stderr,
            _ => AccessLogTarget::File(PathBuf::from(s)),
        })
    }
}

/// nginx `log_format ... escape=`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum LogEscape {
    /// `"`, `\` and bytes < 32 or > 126 as `\xHH`.
    #[default]
    #[serde(rename = "default")]
    Default,
    /// JSON string escaping.
    #[serde(rename = "json")]
    Json,
    #[serde(rename = "none")]
    NoEscape,
}

/// `nginx_config.http.upstream`: the connection pool to upstreams.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct UpstreamKeepalive {
    /// Idle connections kept per worker.
    pub keepalive: u32,
    pub keepalive_requests: u32,
    #[serde(deserialize_with = "de::duration")]
    pub keepalive_timeout: Duration,
}

impl Default for UpstreamKeepalive {
    fn default() -> Self {
        UpstreamKeepalive {
            keepalive: 320,
            keepalive_requests: 1000,
            keepalive_timeout: Duration::from_secs(60),
        }
    }
}

/// The `deployment:` section.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Deployment {
    pub role: Role,
    pub role_traditional: RoleTraditional,
    pub role_data_plane: RoleDataPlane,
    pub role_control_plane: RoleControlPlane,
    pub admin: AdminSettings,
    pub etcd: EtcdSettings,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Data plane and Admin API in one process.
    #[default]
    Traditional,
    /// Admin API only.
    ControlPlane,
    /// Data plane only; no Admin API.
    DataPlane,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RoleTraditional {
    /// `None` when the file does not say. APISIX then uses etcd; ferrisix uses its embedded
    /// store so that it runs without etcd.
    pub config_provider: Option<TraditionalProvider>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TraditionalProvider {
    Etcd,
    /// APISIX 3.13+ API-driven standalone: config lives in memory, set via `/apisix/admin/configs`.
    Yaml,
    /// ferrisix's own persistent store behind the Admin API.
    Embedded,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RoleDataPlane {
    /// Required when `role: data_plane` (APISIX refuses the file otherwise).
    pub config_provider: Option<DataPlaneProvider>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataPlaneProvider {
    Etcd,
    /// `apisix.yaml` beside config.yaml, reloaded on change.
    Yaml,
    /// `apisix.json` beside config.yaml, reloaded on change.
    Json,
    /// Parsed so the error can say it is unsupported; [`Settings::load`] refuses it.
    Xds,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RoleControlPlane {
    pub config_provider: Option<ControlPlaneProvider>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ControlPlaneProvider {
    Etcd,
}

/// `deployment.admin`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct AdminSettings {
    pub admin_listen: AdminListen,
    pub admin_key: Vec<AdminKey>,
    pub admin_key_required: bool,
    /// `Some(list)`: only these addresses; `Some([])`: nobody; `None` (written `~`): everyone.
    #[serde(deserialize_with = "de::opt_ipnets")]
    pub allow_admin: Option<Vec<IpNet>>,
    pub enable_admin_cors: bool,
    /// The embedded dashboard: the static files of `ferrisix.admin_ui_dir` at `/ui/` on the
    /// Admin port (on by default, as in APISIX).
    pub enable_admin_ui: bool,
    pub admin_api_version: AdminApiVersion,
}

/// `127.0.0.0/24`: APISIX's default `allow_admin`, the one its CLI trusts without a key check.
fn loopback_admin_net() -> IpNet {
    IpNet::V4(ipnet::Ipv4Net::new(std::net::Ipv4Addr::new(127, 0, 0, 0), 24).expect("static CIDR"))
}

impl Default for AdminSettings {
    fn default() -> Self {
        AdminSettings {
            admin_listen: AdminListen::default(),
            admin_key: vec![AdminKey {
                name: "admin".to_owned(),
                key: String::new(),
                role: AdminRole::Admin,
            }],
            admin_key_required: true,
            allow_admin: Some(vec![loopback_admin_net()]),
            enable_admin_cors: true,
            enable_admin_ui: true,
            admin_api_version: AdminApiVersion::V3,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct AdminListen {
    #[serde(deserialize_with = "de::ip")]
    pub ip: IpAddr,
    #[serde(deserialize_with = "de::port")]
    pub port: u16,
}

impl Default for AdminListen {
    fn default() -> Self {
        AdminListen {
            ip: IpAddr::from([0, 0, 0, 0]),
            port: 9180,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct AdminKey {
    pub name: String,
    /// Empty = generate one at start (APISIX prints it).
    #[serde(deserialize_with = "de::stringish")]
    pub key: String,
    pub role: AdminRole,
}

impl Default for AdminKey {
    fn default() -> Self {
        AdminKey {
            name: String::new(),
            key: String::new(),
            role: AdminRole::Admin,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AdminRole {
    #[default]
    Admin,
    /// Read-only.
    Viewer,
}

/// `deployment.admin.admin_api_version`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum AdminApiVersion {
    #[default]
    #[serde(rename = "v3")]
    V3,
    /// 2.x envelopes (`action`, `node`, `count`).
    #[serde(rename = "default")]
    Default,
}

/// `deployment.etcd`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct EtcdSettings {
    /// Endpoints of one cluster, each `http://` or `https://`.
    pub host: Vec<String>,
    pub prefix: String,
    /// Seconds, for connect/read/write.
    pub timeout: u64,
    /// Seconds a watch long-poll waits.
    pub watch_timeout: u64,
    pub startup_retry: u32,
    /// Beyond APISIX: the most keys one read of a full listing asks etcd for (the first
    /// load, a re-list after compaction, an Admin list of a whole directory). The pages are
    /// read at one pinned revision, so together they are one snapshot.
    pub page_size: u32,
    /// Beyond APISIX: stored values longer than this many bytes are quarantined (logged,
    /// reported, never served) instead of parsed and compiled; `0`: no limit.
    pub max_value_size: u64,
    #[serde(deserialize_with = "de::opt_stringish")]
    pub user: Option<String>,
    #[serde(deserialize_with = "de::opt_stringish")]
    pub password: Option<String>,
    pub tls: EtcdTls,
}

impl Default for EtcdSettings {
    fn default() -> Self {
        EtcdSettings {
            host: vec!["http://127.0.0.1:2379".to_owned()],
            prefix: "/apisix".to_owned(),
            timeout: 30,
            watch_timeout: 50,
            startup_retry: 2,
            page_size: 1000,
            max_value_size: 1536 * 1024,
            user: None,
            password: None,
            tls: EtcdTls::default(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct EtcdTls {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub verify: bool,
    pub sni: Option<String>,
}

impl Default for EtcdTls {
    fn default() -> Self {
        EtcdTls {
            cert: None,
            key: None,
            verify: true,
            sni: None,
        }
    }
}

/// `plugin_attr`: prometheus is typed; every other plugin's attributes are kept as written for
/// that plugin to read.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct PluginAttr {
    pub prometheus: PrometheusAttr,
    #[serde(flatten)]
    pub others: BTreeMap<String, serde_json::Value>,
}

/// `plugin_attr.prometheus`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct PrometheusAttr {
    pub export_uri: String,
    pub metric_prefix: String,
    /// false: no export server; `export_uri` is served through `public-api` on a data-plane
    /// route instead.
    pub enable_export_server: bool,
    pub export_addr: ExportAddr,
    /// Seconds between re-renders of the metrics text (3.14+).
    pub refresh_interval: f64,
    /// Histogram buckets in milliseconds; `None` = the plugin's built-in list.
    pub default_buckets: Option<Vec<f64>>,
    /// `apisix_llm_latency`'s buckets in milliseconds; `None` = the built-in latency list.
    pub llm_latency_buckets: Option<Vec<f64>>,
    /// `apisix_llm_prompt_tokens_dist`'s buckets in tokens; `None` = the built-in token list.
    pub llm_prompt_tokens_buckets: Option<Vec<f64>>,
    /// `apisix_llm_completion_tokens_dist`'s buckets in tokens.
    pub llm_completion_tokens_buckets: Option<Vec<f64>>,
    /// `apisix_ai_cache_embedding_latency`'s buckets in milliseconds; `None` = the built-in
    /// latency list.
    pub ai_cache_embedding_latency_buckets: Option<Vec<f64>>,
    /// `metrics.<name>`: extra labels and series expiry per HTTP and LLM metric.
    pub metrics: PrometheusMetrics,
}

/// The `graphql:` section.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct GraphqlSettings {
    /// The largest GraphQL request (POST body or GET query string) the GraphQL plugins read,
    /// in bytes; a larger one is refused as APISIX refuses it.
    pub max_size: usize,
}

impl Default for GraphqlSettings {
    fn default() -> Self {
        // APISIX's default (1 MiB).
        GraphqlSettings { max_size: 1 << 20 }
    }
}

/// The `xrpc:` section.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct XrpcSettings {
    /// The enabled protocols, in their configured order.
    pub protocols: Vec<XrpcProtocolEntry>,
}

/// One `xrpc.protocols` entry.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct XrpcProtocolEntry {
    pub name: String,
}

impl XrpcSettings {
    /// The enabled protocols' names.
    pub fn names(&self) -> Vec<String> {
        self.protocols.iter().map(|p| p.name.clone()).collect()
    }
}

/// `plugin_attr.prometheus.metrics`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct PrometheusMetrics {
    pub http_status: MetricAttr,
    pub http_latency: MetricAttr,
    pub bandwidth: MetricAttr,
    pub llm_latency: MetricAttr,
    pub llm_prompt_tokens: MetricAttr,
    pub llm_completion_tokens: MetricAttr,
    pub llm_active_connections: MetricAttr,
    pub llm_prompt_tokens_dist: MetricAttr,
    pub llm_completion_tokens_dist: MetricAttr,
    pub ai_cache_hits_total: MetricAttr,
    pub ai_cache_misses_total: MetricAttr,
    pub ai_cache_bypasses_total: MetricAttr,
    pub ai_cache_embedding_latency: MetricAttr,
    /// APISIX's health-check gauge, which ferrisix does not have (health checks are not
    /// built): validated and ignored. APISIX reads only `expire` for it.
    pub upstream_status: UpstreamStatusAttr,
}

/// `plugin_attr.prometheus.metrics.<name>` for the HTTP and LLM metrics.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct MetricAttr {
    /// Seconds a series may go without an update before it leaves the exposition (its count
    /// starts again from 0 if it comes back); 0 = never.
    #[serde(deserialize_with = "de::expire")]
    pub expire: f64,
    /// Labels appended after the built-in ones, in this order.
    pub extra_labels: Vec<ExtraLabel>,
}

/// `plugin_attr.prometheus.metrics.upstream_status`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct UpstreamStatusAttr {
    #[serde(deserialize_with = "de::expire")]
    pub expire: f64,
}

/// The built-in labels of the HTTP metrics (APISIX 3.18's `metric_label_map`), in output
/// order; extra labels come after them.
pub const HTTP_STATUS_LABELS: [&str; 11] = [
    "code",
    "route",
    "matched_uri",
    "matched_host",
    "service",
    "consumer",
    "node",
    "request_type",
    "request_llm_model",
    "llm_model",
    "response_source",
];
pub const HTTP_LATENCY_LABELS: [&str; 8] = [
    "type",
    "route",
    "service",
    "consumer",
    "node",
    "request_type",
    "request_llm_model",
    "llm_model",
];
pub const BANDWIDTH_LABELS: [&str; 8] = HTTP_LATENCY_LABELS;

impl Default for PrometheusAttr {
    fn default() -> Self {
        PrometheusAttr {
            export_uri: "/apisix/prometheus/metrics".to_owned(),
            metric_prefix: "apisix_".to_owned(),
            enable_export_server: true,
            export_addr: ExportAddr::default(),
            refresh_interval: 15.0,
            default_buckets: None,
            llm_latency_buckets: None,
            llm_prompt_tokens_buckets: None,
            llm_completion_tokens_buckets: None,
            ai_cache_embedding_latency_buckets: None,
            metrics: PrometheusMetrics::default(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ExportAddr {
    #[serde(deserialize_with = "de::ip")]
    pub ip: IpAddr,
    #[serde(deserialize_with = "de::port")]
    pub port: u16,
}

impl Default for ExportAddr {
    fn default() -> Self {
        ExportAddr {
            ip: IpAddr::from([127, 0, 0, 1]),
            port: 9091,
        }
    }
}

/// `ferrisix.admin_key_guard`: a per-client-address limit on failed Admin API
/// authentications (wrong keys), ferrisix's own (APISIX has none). GCRA: `burst` failures at
/// once, then `per_minute`; past that the address gets 429 without its key being compared.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct AdminKeyGuard {
    pub enabled: bool,
    pub burst: u32,
    pub per_minute: u32,
}

impl Default for AdminKeyGuard {
    fn default() -> Self {
        AdminKeyGuard {
            enabled: true,
            burst: 10,
            per_minute: 10,
        }
    }
}

/// The `ferrisix:` section: keys APISIX does not have.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct FerrisixSettings {
    /// Failed Admin API authentications per client address.
    pub admin_key_guard: AdminKeyGuard,
    /// The standalone file (`yaml`/`json` providers) instead of `apisix.yaml`/`apisix.json`
    /// beside config.yaml. Relative paths resolve against config.yaml's directory.
    pub config_file: Option<PathBuf>,
    /// Where the embedded store keeps its database and etcd mode its local copy of the last
    /// applied config. Relative paths resolve against config.yaml's directory; default `data`.
    pub data_dir: Option<PathBuf>,
    /// The dashboard's directory served at `/ui/` (`deployment.admin.enable_admin_ui`).
    /// Relative paths resolve against config.yaml's directory; default `../ui`, i.e. `ui`
    /// beside `conf/`, where APISIX keeps it (`<apisix home>/ui`).
    pub admin_ui_dir: Option<PathBuf>,
    /// APISIX 2.x compatibility: also answer `/apisix/admin` on the data port (loopback
    /// clients only), so 2.x scripts that PUT to :9080 work as written.
    pub admin_on_data_port: bool,
    /// HTTP/2 limits of the data-plane listeners (nginx's defaults).
    pub http2: Http2Settings,
    /// The process's own log.
    pub log: LogSettings,
    /// The Unix socket a successor process takes the listening sockets over from (binary
    /// upgrade, restart without a lost connection). Relative paths resolve against
    /// config.yaml's directory; default `ferrisix.sock` in the data directory; `""` turns the
    /// hand-over off (a second process on the same ports then fails to start).
    pub handover_socket: Option<PathBuf>,
    /// The file holding the serving process's pid (rewritten by a successor). Relative paths
    /// resolve against config.yaml's directory; default `ferrisix.pid` in the data directory;
    /// `""` writes none.
    pub pid_file: Option<PathBuf>,
    /// After SIGTERM, how long the listening sockets stay open for a successor (`ferrisix`
    /// started again: a restart), which takes them over with their queues. Meanwhile the
    /// stopping process answers the connections arriving itself, so a stop loses none whether
    /// a start follows or not. `0` closes them at SIGTERM, as nginx does. Default 5s.
    #[serde(deserialize_with = "de::duration")]
    pub handover_wait: Duration,
    /// How long the `ext-plugin-*` plugins wait on the runner for one send or one read
    /// (APISIX's is fixed at 60 s; connecting has 1 s). Default 60s.
    #[serde(deserialize_with = "de::duration")]
    pub ext_plugin_timeout: Duration,
    /// Limits of the proxy-wasm plugins' modules (APISIX has none).
    pub wasm: WasmLimits,
}

/// config.yaml's `wasm:` section, as APISIX reads it: the proxy-wasm plugins, each registered
/// under its own name like a built-in plugin.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct WasmSettings {
    pub plugins: Vec<WasmPluginSettings>,
}

/// One of `wasm.plugins`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct WasmPluginSettings {
    pub name: String,
    pub priority: i64,
    /// The module (`.wasm`); a relative path resolves against config.yaml's directory.
    pub file: PathBuf,
    #[serde(default)]
    pub http_request_phase: WasmRequestPhase,
}

/// Where a wasm plugin's `proxy_on_request_headers` runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WasmRequestPhase {
    #[default]
    Access,
    Rewrite,
}

/// `ferrisix.wasm`: what one call into a module may use. A call past either limit traps: the
/// request gets APISIX's answer for a failed wasm plugin (503) and the worker's instance of
/// that module is made afresh.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct WasmLimits {
    /// The longest one call into a module may run (epoch interruption). Default 1s.
    #[serde(deserialize_with = "de::duration")]
    pub timeout: Duration,
    /// The most linear memory one instance may grow to, in bytes. Default 64 MiB.
    pub max_memory: u64,
}

impl Default for WasmLimits {
    fn default() -> Self {
        WasmLimits {
            timeout: Duration::from_secs(1),
            max_memory: 64 << 20,
        }
    }
}

impl Default for FerrisixSettings {
    fn default() -> Self {
        FerrisixSettings {
            admin_key_guard: AdminKeyGuard::default(),
            config_file: None,
            data_dir: None,
            admin_ui_dir: None,
            admin_on_data_port: false,
            http2: Http2Settings::default(),
            log: LogSettings::default(),
            handover_socket: None,
            pid_file: None,
            handover_wait: Duration::from_secs(5),
            wasm: WasmLimits::default(),
            ext_plugin_timeout: Duration::from_secs(60),
        }
    }
}

/// `ferrisix.log`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct LogSettings {
    pub format: LogFormat,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields`, spans), for log
    /// collectors.
    Json,
}

/// `ferrisix.http2`: the limits nginx applies to HTTP/2 clients, under nginx's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Http2Settings {
    /// nginx `http2_max_concurrent_streams` (128).
    pub max_concurrent_streams: u32,
    /// Bytes of request header list (nginx: `large_client_header_buffers 4 8k`).
    pub max_header_list_size: u32,
    /// Initial per-stream receive window (nginx `http2_body_preread_size` 64k).
    pub initial_stream_window_size: u32,
    /// Initial connection receive window.
    pub initial_connection_window_size: u32,
    /// Largest frame payload accepted (the protocol's default, which nginx keeps).
    pub max_frame_size: u32,
}

impl Default for Http2Settings {
    fn default() -> Self {
        Http2Settings {
            max_concurrent_streams: 128,
            max_header_list_size: 32 * 1024,
            initial_stream_window_size: 64 * 1024,
            initial_connection_window_size: 1024 * 1024,
            max_frame_size: 16 * 1024,
        }
    }
}

/// Where resources come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    /// `apisix.yaml`, watched.
    Yaml,
    /// `apisix.json`, watched.
    Json,
    Etcd,
    /// ferrisix's store behind the Admin API.
    Embedded,
    /// APISIX 3.13+'s API-driven standalone mode: the configuration lives in memory and is
    /// replaced whole by `PUT /apisix/admin/configs`.
    StandaloneApi,
}

impl ProviderKind {
    /// The standalone file format this provider reads, if it reads one.
    pub fn file_format(self) -> Option<Format> {
        match self {
            ProviderKind::Yaml => Some(Format::Yaml),
            ProviderKind::Json => Some(Format::Json),
            ProviderKind::Etcd | ProviderKind::Embedded | ProviderKind::StandaloneApi => None,
        }
    }
}
impl Settings {
    /// The settings used when there is no config file at all: APISIX's defaults.
    pub fn embedded_default() -> Settings {
        Settings::default()
    }

    /// Which config provider serves resources.
    ///
    /// * `data_plane`: its `config_provider` (`yaml`, `json`, `etcd`); absent or `xds` (which
    ///   [`Settings::load`] refuses) → etcd, APISIX's default.
    /// * `control_plane`: etcd.
    /// * `traditional`: etcd when `role_traditional.config_provider: etcd` says so; `yaml` is
    ///   APISIX's API-driven standalone mode while the Admin API is on (`apisix.enable_admin`),
    ///   and the watched `apisix.yaml` when it is off, as APISIX's `config_yaml.lua` decides;
    ///   otherwise (`embedded` or absent) the embedded store.
    pub fn provider(&self) -> ProviderKind {
        let d = &self.deployment;
        match d.role {
            Role::DataPlane => match d.role_data_plane.config_provider {
                Some(DataPlaneProvider::Yaml) => ProviderKind::Yaml,
                Some(DataPlaneProvider::Json) => ProviderKind::Json,
                Some(DataPlaneProvider::Etcd | DataPlaneProvider::Xds) | None => ProviderKind::Etcd,
            },
            Role::ControlPlane => ProviderKind::Etcd,
            Role::Traditional => match d.role_traditional.config_provider {
                Some(TraditionalProvider::Etcd) => ProviderKind::Etcd,
                Some(TraditionalProvider::Yaml) if self.apisix.enable_admin => {
                    ProviderKind::StandaloneApi
                }
                Some(TraditionalProvider::Yaml) => ProviderKind::Yaml,
                Some(TraditionalProvider::Embedded) | None => ProviderKind::Embedded,
            },
        }
    }

    /// Whether the Admin API runs: APISIX forces it off for `data_plane` and on for
    /// `control_plane`; `traditional` follows `apisix.enable_admin`.
    pub fn admin_enabled(&self) -> bool {
        match self.deployment.role {
            Role::DataPlane => false,
            Role::ControlPlane => true,
            Role::Traditional => self.apisix.enable_admin,
        }
    }

    /// The directory relative paths resolve against: config.yaml's own, or `conf` (APISIX's
    /// layout) when running without a file.
    pub fn config_dir(&self) -> PathBuf {
        match self.source.as_deref().and_then(Path::parent) {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
            Some(_) => PathBuf::from("."),
            None => PathBuf::from("conf"),
        }
    }

    /// The dashboard's directory (`ferrisix.admin_ui_dir`), `None` when
    /// `deployment.admin.enable_admin_ui` is off.
    pub fn admin_ui_dir(&self) -> Option<PathBuf> {
        if !self.deployment.admin.enable_admin_ui {
            return None;
        }
        let dir = self.config_dir();
        Some(match &self.ferrisix.admin_ui_dir {
            Some(p) if p.is_absolute() => p.clone(),
            Some(p) => dir.join(p),
            None => dir.join("..").join("ui"),
        })
    }

    /// The data directory (`ferrisix.data_dir`, default `data` beside config.yaml).
    pub fn data_dir(&self) -> PathBuf {
        let dir = self.config_dir();
        match &self.ferrisix.data_dir {
            Some(p) if p.is_absolute() => p.clone(),
            Some(p) => dir.join(p),
            None => dir.join("data"),
        }
    }

    /// The hand-over socket (`ferrisix.handover_socket`), `None` when turned off.
    pub fn handover_socket(&self) -> Option<PathBuf> {
        self.data_dir_file(&self.ferrisix.handover_socket, "ferrisix.sock")
    }

    /// The external plugin runner's socket: `ext-plugin.path_for_test`, else APISIX's
    /// `apisix-<pid>.sock` in the configuration directory, made absolute (the runner is told
    /// it through `APISIX_LISTEN_ADDRESS`).
    pub fn ext_plugin_socket(&self) -> PathBuf {
        let path = match &self.ext_plugin.path_for_test {
            Some(p) => p.clone(),
            None => self
                .config_dir()
                .join(format!("apisix-{}.sock", std::process::id())),
        };
        if path.is_absolute() {
            return path;
        }
        std::env::current_dir()
            .map(|d| d.join(&path))
            .unwrap_or(path)
    }

    /// The pid file (`ferrisix.pid_file`), `None` when turned off.
    pub fn pid_file(&self) -> Option<PathBuf> {
        self.data_dir_file(&self.ferrisix.pid_file, "ferrisix.pid")
    }

    fn data_dir_file(&self, set: &Option<PathBuf>, default: &str) -> Option<PathBuf> {
        match set {
            Some(p) if p.as_os_str().is_empty() => None,
            Some(p) if p.is_absolute() => Some(p.clone()),
            Some(p) => Some(self.config_dir().join(p)),
            None => Some(self.data_dir().join(default)),
        }
    }

    /// The standalone file for the `yaml`/`json` providers: `ferrisix.config_file` if set,
    /// else `apisix.yaml` (`apisix.json` for json) beside config.yaml.
    pub fn standalone_file(&self) -> PathBuf {
        let dir = self.config_dir();
        match &self.ferrisix.config_file {
            Some(p) if p.is_absolute() => p.clone(),
            Some(p) => dir.join(p),
            None => {
                let format = self.provider().file_format().unwrap_or(Format::Yaml);
                dir.join(format.default_file_name())
            }
        }
    }
}

#[cfg(test)]
mod tests;
