//! `config.yaml`: the process settings (listeners, timeouts, logging, deployment role, Admin API,
//! etcd, prometheus export), with APISIX's key names and APISIX's default for every key.
//!
//! Loading parses the YAML, substitutes `${{VAR}}` / `${{VAR:=default}}` in string values (as
//! APISIX does after parsing, turning numeric and boolean results into numbers and booleans),
//! then deserializes into [`Settings`]. A value of the wrong type is refused with its dotted path
//! (`apisix.node_listen[1]: ...`); every such error is collected, not just the first. Keys that
//! APISIX knows but ferrisix does not act on, and plain typos, are not errors: each is returned
//! as a warning naming its path so the caller can log it. Everything absent takes APISIX's
//! default, so an empty file is a complete configuration.

mod de;
pub mod save;
mod values;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;

use crate::env;
use crate::provider::Format;

pub use values::{ExtraLabel, ListenAddr, RealIpFrom, WorkerProcesses};

/// Most errors one load reports; each retry removes the key that failed, so this only bounds a
/// pathological file.
const MAX_ERRORS: usize = 64;

/// Why `config.yaml` could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The text is not YAML; the message carries the line and column.
    #[error("{origin}: invalid YAML: {message}")]
    Syntax { origin: String, message: String },
    /// The YAML is fine but values are not: one message per problem, each starting with the
    /// key's dotted path.
    #[error("{origin}: invalid configuration:\n  {}", .errors.join("\n  "))]
    Invalid { origin: String, errors: Vec<String> },
}

/// The whole of `config.yaml`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Settings {
    pub apisix: ApisixSettings,
    pub nginx_config: NginxConfig,
    pub deployment: Deployment,
    /// Enabled HTTP plugins. `None` = APISIX's default list (every plugin ferrisix has).
    pub plugins: Option<Vec<String>>,
    pub plugin_attr: PluginAttr,
    /// Service discovery (`discovery.dns`).
    pub discovery: DiscoverySettings,
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
    /// The control API (readiness, applied revision, dumps).
    pub enable_control: bool,
    pub control: ControlListen,
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
}

/// The `discovery:` section; only `dns` is built.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct DiscoverySettings {
    pub dns: Option<DnsDiscoverySettings>,
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
    /// Ports, `"ip:port"` strings or `{ip, port, enable_http2}` maps (default 9443).
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
            enable_control: true,
            control: ControlListen::default(),
            ssl: SslSettings::default(),
            data_encryption: DataEncryption::default(),
            dns_resolver: Vec::new(),
            dns_resolver_valid: None,
            enable_ipv6: true,
            disable_upstream_healthcheck: false,
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
}

impl Default for NginxConfig {
    fn default() -> Self {
        NginxConfig {
            error_log: None,
            error_log_level: None,
            worker_processes: WorkerProcesses::Auto,
            worker_shutdown_timeout: Duration::from_secs(240),
            http: NginxHttp::default(),
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
    pub admin_api_version: AdminApiVersion,
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
    /// `metrics.<name>`: extra labels and series expiry per HTTP metric.
    pub metrics: PrometheusMetrics,
}

/// `plugin_attr.prometheus.metrics`. Metrics ferrisix does not have (the LLM and AI-cache
/// families) are unknown keys, reported as warnings.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct PrometheusMetrics {
    pub http_status: MetricAttr,
    pub http_latency: MetricAttr,
    pub bandwidth: MetricAttr,
    /// APISIX's health-check gauge, which ferrisix does not have (health checks are not
    /// built): validated and ignored. APISIX reads only `expire` for it.
    pub upstream_status: UpstreamStatusAttr,
}

/// `plugin_attr.prometheus.metrics.<name>` for `http_status`, `http_latency`, `bandwidth`.
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
    /// After SIGTERM, how long the listening sockets stay open for a successor once the
    /// connections have drained (`ferrisix` started again: a restart). Connections arriving
    /// meanwhile wait in the kernel's accept queues and the successor serves them, so a stop
    /// followed by a start loses none. `0` closes them at SIGTERM, as nginx does. Default 5s.
    #[serde(deserialize_with = "de::duration")]
    pub handover_wait: Duration,
}

impl Default for FerrisixSettings {
    fn default() -> Self {
        FerrisixSettings {
            admin_key_guard: AdminKeyGuard::default(),
            config_file: None,
            data_dir: None,
            admin_on_data_port: false,
            http2: Http2Settings::default(),
            log: LogSettings::default(),
            handover_socket: None,
            pid_file: None,
            handover_wait: Duration::from_secs(5),
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
}

impl ProviderKind {
    /// The standalone file format this provider reads, if it reads one.
    pub fn file_format(self) -> Option<Format> {
        match self {
            ProviderKind::Yaml => Some(Format::Yaml),
            ProviderKind::Json => Some(Format::Json),
            ProviderKind::Etcd | ProviderKind::Embedded => None,
        }
    }
}

impl Settings {
    /// Reads and parses `path`. The warnings name every key that was ignored.
    pub fn load(path: &Path) -> Result<(Settings, Vec<String>), SettingsError> {
        let text = std::fs::read_to_string(path).map_err(|source| SettingsError::Io {
            path: path.to_owned(),
            source,
        })?;
        let (mut settings, warnings) =
            Self::parse(&text, &path.display().to_string(), &env::process_env)?;
        settings.source = Some(path.to_owned());
        Ok((settings, warnings))
    }

    /// Like [`Settings::load`], but a missing file gives the defaults (and a warning saying
    /// so) — for a default path the user did not name.
    pub fn load_or_default(path: &Path) -> Result<(Settings, Vec<String>), SettingsError> {
        match Self::load(path) {
            Err(SettingsError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                Ok((
                    Settings::embedded_default(),
                    vec![format!(
                        "{} not found; using the default settings",
                        path.display()
                    )],
                ))
            }
            other => other,
        }
    }

    /// Parses config.yaml text with the process environment.
    pub fn from_yaml_str(text: &str) -> Result<(Settings, Vec<String>), SettingsError> {
        Self::parse(text, "config.yaml", &env::process_env)
    }

    /// Parses config.yaml text, looking `${{VAR}}` up with `env`.
    pub fn from_yaml_str_with_env(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(Settings, Vec<String>), SettingsError> {
        Self::parse(text, "config.yaml", env)
    }

    /// The settings used when there is no config file at all: APISIX's defaults.
    pub fn embedded_default() -> Settings {
        Settings::default()
    }

    /// Which config provider serves resources.
    ///
    /// * `data_plane`: its `config_provider` (`yaml`, `json`, `etcd`); absent or `xds` (which
    ///   [`Settings::load`] refuses) → etcd, APISIX's default.
    /// * `control_plane`: etcd.
    /// * `traditional`: etcd only when `role_traditional.config_provider: etcd` says so;
    ///   otherwise (`embedded`, absent, or `yaml`, APISIX's API-driven in-memory standalone)
    ///   the embedded store.
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
                Some(TraditionalProvider::Yaml | TraditionalProvider::Embedded) | None => {
                    ProviderKind::Embedded
                }
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

    fn parse(
        text: &str,
        origin: &str,
        env: env::EnvLookup<'_>,
    ) -> Result<(Settings, Vec<String>), SettingsError> {
        crate::nesting::check_yaml_depth(text).map_err(|message| SettingsError::Syntax {
            origin: origin.to_owned(),
            message,
        })?;
        let mut value: serde_yaml::Value =
            serde_yaml::from_str(text).map_err(|e| SettingsError::Syntax {
                origin: origin.to_owned(),
                message: e.to_string(),
            })?;
        let invalid = |errors| SettingsError::Invalid {
            origin: origin.to_owned(),
            errors,
        };
        match value {
            // Empty, or only comments.
            serde_yaml::Value::Null => return Ok((Settings::default(), Vec::new())),
            serde_yaml::Value::Mapping(_) => {}
            _ => {
                return Err(invalid(vec![
                    "the top level must be a mapping of sections".into()
                ]))
            }
        }

        let mut errors = Vec::new();
        if let Err(e) = env::substitute_yaml(&mut value, env) {
            // A missing variable leaves an empty string behind; the typed pass would then
            // report confusing follow-on errors, so stop here.
            return Err(invalid(e));
        }

        let mut warnings = Vec::new();
        let mut settings = deserialize_collecting(&mut value, &mut errors, &mut warnings);
        apply_listener_http2_default(&mut settings, &value);
        apply_ssl_listen_defaults(&mut settings, &value);
        check(&settings, &mut errors);
        admin_key_checks(&settings, &mut errors, &mut warnings);
        prometheus_warnings(&settings, &mut warnings);
        if errors.is_empty() {
            Ok((settings, warnings))
        } else {
            Err(invalid(errors))
        }
    }
}

/// Deserializes, and on an error records it, removes the offending key (so its default
/// applies) and tries again — serde stops at the first error, users want all of them.
fn deserialize_collecting(
    value: &mut serde_yaml::Value,
    errors: &mut Vec<String>,
    warnings: &mut Vec<String>,
) -> Settings {
    for _ in 0..MAX_ERRORS {
        let mut ignored = Vec::new();
        let result = {
            let mut on_ignored = |p: serde_ignored::Path<'_>| ignored.push(ignored_path(&p));
            let de = serde_ignored::Deserializer::new(&*value, &mut on_ignored);
            serde_path_to_error::deserialize::<_, Settings>(de)
        };
        match result {
            Ok(s) => {
                warnings.extend(
                    ignored
                        .into_iter()
                        .map(|p| format!("unknown or unsupported key `{p}` ignored")),
                );
                return s;
            }
            Err(e) => {
                errors.push(e.to_string());
                if !remove_key(value, e.path()) {
                    break;
                }
            }
        }
    }
    Settings::default()
}

/// Removes the innermost mapping key on `path`; false when there is none to remove.
fn remove_key(root: &mut serde_yaml::Value, path: &serde_path_to_error::Path) -> bool {
    use serde_path_to_error::Segment;
    let segments: Vec<&Segment> = path.iter().collect();
    let Some(last_key) = segments
        .iter()
        .rposition(|s| matches!(s, Segment::Map { .. }))
    else {
        return false;
    };
    let mut node = root;
    for seg in &segments[..last_key] {
        node = match (seg, node) {
            (Segment::Map { key }, serde_yaml::Value::Mapping(m)) => {
                match m.get_mut(key.as_str()) {
                    Some(v) => v,
                    None => return false,
                }
            }
            (Segment::Seq { index }, serde_yaml::Value::Sequence(s)) => match s.get_mut(*index) {
                Some(v) => v,
                None => return false,
            },
            _ => return false,
        };
    }
    match (segments[last_key], node) {
        (Segment::Map { key }, serde_yaml::Value::Mapping(m)) => m.remove(key.as_str()).is_some(),
        _ => false,
    }
}

/// `a.b[1].c`, the same spelling serde_path_to_error uses for errors.
fn ignored_path(p: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match p {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", ignored_path(parent)),
        Path::Map { parent, key } => {
            let parent = ignored_path(parent);
            if parent.is_empty() {
                key.clone()
            } else {
                format!("{parent}.{key}")
            }
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => ignored_path(parent),
    }
}

/// A listener without its own `enable_http2` follows `apisix.enable_http2`. The typed pass
/// cannot see which entries were explicit, so look at the document.
fn apply_listener_http2_default(settings: &mut Settings, value: &serde_yaml::Value) {
    let global = settings.apisix.enable_http2;
    let entries = value.get("apisix").and_then(|a| a.get("node_listen"));
    for (i, addr) in settings.apisix.node_listen.iter_mut().enumerate() {
        let explicit = entries
            .and_then(|e| e.as_sequence())
            .and_then(|s| s.get(i))
            .is_some_and(|entry| entry.get("enable_http2").is_some());
        if !explicit {
            addr.enable_http2 = global;
        }
    }
}

/// `apisix.ssl.listen` entries follow `apisix.enable_http2` unless they say otherwise, and a
/// map without a port takes 9443 (the plain listener's 9080 default does not apply).
fn apply_ssl_listen_defaults(settings: &mut Settings, value: &serde_yaml::Value) {
    let global = settings.apisix.enable_http2;
    let entries = value
        .get("apisix")
        .and_then(|a| a.get("ssl"))
        .and_then(|s| s.get("listen"))
        .and_then(|l| l.as_sequence());
    for (i, addr) in settings.apisix.ssl.listen.iter_mut().enumerate() {
        let entry = entries.and_then(|s| s.get(i));
        if entry.is_none_or(|e| e.get("enable_http2").is_none()) {
            addr.enable_http2 = global;
        }
        if entry.is_some_and(|e| e.is_mapping() && e.get("port").is_none()) {
            addr.port = 9443;
        }
    }
}

/// Rules across keys that types cannot express; APISIX's schema checks the same.
fn check(s: &Settings, errors: &mut Vec<String>) {
    let d = &s.deployment;
    if d.role == Role::DataPlane {
        match d.role_data_plane.config_provider {
            None => errors.push(
                "deployment.role_data_plane.config_provider: required when deployment.role is \
                 data_plane (etcd, yaml or json)"
                    .into(),
            ),
            Some(DataPlaneProvider::Xds) => errors.push(
                "deployment.role_data_plane.config_provider: xds is not supported by ferrisix \
                 (use etcd, yaml or json)"
                    .into(),
            ),
            Some(_) => {}
        }
    }
    if d.etcd.host.is_empty() {
        errors.push("deployment.etcd.host: expected at least one etcd address".into());
    }
    for (i, h) in d.etcd.host.iter().enumerate() {
        if !(h.starts_with("http://") || h.starts_with("https://")) {
            errors.push(format!(
                "deployment.etcd.host[{i}]: invalid value: string {h:?}, expected an address \
                 starting with http:// or https://"
            ));
        }
    }
    let guard = &s.ferrisix.admin_key_guard;
    if guard.enabled && (guard.burst == 0 || guard.per_minute == 0) {
        errors.push(
            "ferrisix.admin_key_guard: burst and per_minute must be at least 1 (enabled: false \
             turns the guard off)"
                .into(),
        );
    }
    if d.etcd.timeout == 0 {
        errors.push("deployment.etcd.timeout: invalid value: 0, expected at least 1".into());
    }
    if !s.plugin_attr.prometheus.export_uri.starts_with('/') {
        errors.push(format!(
            "plugin_attr.prometheus.export_uri: invalid value: string {:?}, expected a path \
             starting with /",
            s.plugin_attr.prometheus.export_uri
        ));
    }
    check_extra_labels(&s.plugin_attr.prometheus.metrics, errors);
    if let Err(e) = crate::encrypt::Keyring::new(&s.apisix.data_encryption.keyring) {
        errors.push(e);
    }
    for p in s.apisix.ssl.ssl_protocols.split_whitespace() {
        if !matches!(
            p,
            "TLSv1" | "TLSv1.1" | "TLSv1.2" | "TLSv1.3" | "SSLv2" | "SSLv3"
        ) {
            errors.push(format!(
                "apisix.ssl.ssl_protocols: invalid value: string {p:?}, expected TLSv1.2 or TLSv1.3"
            ));
        }
    }
}

/// APISIX's CLI checks of the Admin API token (`apisix/cli/ops.lua`), run at start and by
/// `ferrisix -t`. An empty `admin_key` list refuses every Admin request with 401 at run time
/// (as `check_token` does); the CLI refuses such a file unless the Admin API is reachable from
/// loopback only, and there it only warns. `admin_key_required: false` turns the check off,
/// loudly.
fn admin_key_checks(s: &Settings, errors: &mut Vec<String>, warnings: &mut Vec<String>) {
    if !s.admin_enabled() {
        return;
    }
    let admin = &s.deployment.admin;
    if !admin.admin_key_required {
        warnings.push(
            "Warning! Admin key is bypassed! deployment.admin.admin_key_required is false:              anyone allowed by allow_admin can change the configuration. If you are deploying              in a production environment, enable `admin_key_required` and set a secure admin key!"
                .into(),
        );
        return;
    }
    if !admin.admin_key.is_empty() {
        return;
    }
    let loopback_only = admin
        .allow_admin
        .as_deref()
        .is_some_and(|nets| nets.len() == 1 && nets[0] == loopback_admin_net());
    if loopback_only {
        warnings.push(
            "deployment.admin.admin_key is empty: every Admin API request is refused with 401              until a key is set"
                .into(),
        );
    } else {
        errors.push(
            "deployment.admin.admin_key: ERROR: missing valid Admin API token. Please modify              \"admin_key\" in conf/config.yaml (an empty list refuses every Admin API request;              admin_key_required: false turns authentication off)"
                .into(),
        );
    }
}

/// `127.0.0.0/24`: APISIX's default `allow_admin`, the one its CLI trusts without a key check.
fn loopback_admin_net() -> IpNet {
    IpNet::V4(ipnet::Ipv4Net::new(std::net::Ipv4Addr::new(127, 0, 0, 0), 24).expect("static CIDR"))
}

/// The HTTP metrics with their settings and built-in labels.
fn http_metrics(
    m: &PrometheusMetrics,
) -> [(&'static str, &MetricAttr, &'static [&'static str]); 3] {
    [
        ("http_status", &m.http_status, &HTTP_STATUS_LABELS),
        ("http_latency", &m.http_latency, &HTTP_LATENCY_LABELS),
        ("bandwidth", &m.bandwidth, &BANDWIDTH_LABELS),
    ]
}

/// Label names as nginx-lua-prometheus accepts them when the metric is registered. APISIX
/// starts with a bad one but then has no such metric at all (every request's log phase fails
/// on it); a repeated name makes an exposition Prometheus refuses to scrape. Both are refused
/// here instead.
fn check_extra_labels(m: &PrometheusMetrics, errors: &mut Vec<String>) {
    for (metric, attr, builtin) in http_metrics(m) {
        for (i, label) in attr.extra_labels.iter().enumerate() {
            let name = label.name.as_str();
            let expected = if !is_label_name(name) {
                "a label name matching [a-zA-Z_][a-zA-Z0-9_]*"
            } else if name == "le" {
                "a label name other than le (reserved for histogram buckets)"
            } else if builtin.contains(&name) {
                "a label name the metric does not already have"
            } else if attr.extra_labels[..i].iter().any(|l| l.name == name) {
                "a label name not used earlier in the list"
            } else {
                continue;
            };
            errors.push(format!(
                "plugin_attr.prometheus.metrics.{metric}.extra_labels[{i}]: invalid value: \
                 string {name:?}, expected {expected}"
            ));
        }
    }
}

fn is_label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// What APISIX accepts but surely does not mean: an extra label value that is not a `$`
/// reference (APISIX still drops its first character and reads the variable named by the
/// rest), and `upstream_status.expire`, which ferrisix does not need: its series come and go
/// with the health checkers.
fn prometheus_warnings(s: &Settings, warnings: &mut Vec<String>) {
    let m = &s.plugin_attr.prometheus.metrics;
    for (metric, attr, _) in http_metrics(m) {
        for (i, label) in attr.extra_labels.iter().enumerate() {
            if !label.value.starts_with('$') {
                warnings.push(format!(
                    "plugin_attr.prometheus.metrics.{metric}.extra_labels[{i}]: {:?} is not a \
                     $variable; as in APISIX, label {:?} takes the value of variable {:?}",
                    label.value,
                    label.name,
                    label.variable()
                ));
            }
        }
    }
    if m.upstream_status != UpstreamStatusAttr::default() {
        warnings.push(
            "plugin_attr.prometheus.metrics.upstream_status.expire ignored: ferrisix's \
             upstream_status series come and go with the health checkers"
                .into(),
        );
    }
}

#[cfg(test)]
mod tests;
