//! Typed views of APISIX resources, built from JSON that already passed validation.
//!
//! The stored JSON (what the Admin API writes and etcd holds) stays the source of truth; these
//! types are what the data plane compiles from. Fields the data plane does not act on yet are
//! kept as raw JSON so nothing a user wrote is lost.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value};

/// The resource kinds of APISIX's etcd layout, in the order a snapshot compiles them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResourceKind {
    Upstreams,
    Services,
    PluginConfigs,
    GlobalRules,
    /// `consumer_groups/<id>`: plugins shared by the consumers naming the group.
    ConsumerGroups,
    Consumers,
    /// `consumers/<username>/credentials/<id>` (3.x): an auth plugin's credential of one
    /// consumer. The id is `<username>/credentials/<id>`, so the key is built as for the
    /// other kinds.
    Credentials,
    Ssls,
    PluginMetadata,
    /// `protos/<id>`: protobuf definitions grpc-transcode compiles against.
    Protos,
    Routes,
    /// `stream_routes/<id>`: the L4 routes of the stream proxy (`apisix.proxy_mode` with
    /// `stream`); the HTTP snapshot carries them through untouched.
    StreamRoutes,
    /// `secrets/<manager>/<id>`: a secret manager's configuration, which `$secret://`
    /// references name. The id is `<manager>/<id>`.
    Secrets,
}

impl ResourceKind {
    pub const ALL: [ResourceKind; 13] = [
        ResourceKind::Upstreams,
        ResourceKind::Services,
        ResourceKind::PluginConfigs,
        ResourceKind::GlobalRules,
        ResourceKind::ConsumerGroups,
        ResourceKind::Consumers,
        ResourceKind::Credentials,
        ResourceKind::Ssls,
        ResourceKind::PluginMetadata,
        ResourceKind::Protos,
        ResourceKind::Routes,
        ResourceKind::StreamRoutes,
        ResourceKind::Secrets,
    ];

    /// The directory name under the etcd prefix and the key in `apisix.yaml`.
    pub fn dir(self) -> &'static str {
        match self {
            ResourceKind::Upstreams => "upstreams",
            ResourceKind::Services => "services",
            ResourceKind::PluginConfigs => "plugin_configs",
            ResourceKind::GlobalRules => "global_rules",
            ResourceKind::ConsumerGroups => "consumer_groups",
            ResourceKind::Consumers | ResourceKind::Credentials => "consumers",
            ResourceKind::Ssls => "ssls",
            ResourceKind::PluginMetadata => "plugin_metadata",
            ResourceKind::Protos => "protos",
            ResourceKind::Routes => "routes",
            ResourceKind::StreamRoutes => "stream_routes",
            ResourceKind::Secrets => "secrets",
        }
    }

    /// The kind stored directly under `dir` (`consumers` is the consumers', whose
    /// credentials sit one level deeper: see [`crate::store::place_of`]).
    pub fn from_dir(dir: &str) -> Option<ResourceKind> {
        ResourceKind::ALL
            .into_iter()
            .find(|k| *k != ResourceKind::Credentials && k.dir() == dir)
    }

    /// The singular word APISIX uses in messages (`missing route id`).
    pub fn noun(self) -> &'static str {
        match self {
            ResourceKind::Upstreams => "upstream",
            ResourceKind::Services => "service",
            ResourceKind::PluginConfigs => "plugin config",
            ResourceKind::GlobalRules => "global rule",
            ResourceKind::ConsumerGroups => "consumer group",
            ResourceKind::Consumers => "consumer",
            ResourceKind::Credentials => "credential",
            ResourceKind::Ssls => "ssl",
            ResourceKind::PluginMetadata => "plugin_metadata",
            ResourceKind::Protos => "proto",
            ResourceKind::Routes => "route",
            ResourceKind::StreamRoutes => "stream route",
            ResourceKind::Secrets => "secret",
        }
    }
}

/// `{connect, send, read}` in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
pub struct Timeout {
    pub connect: f64,
    pub send: f64,
    pub read: f64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PassHost {
    #[default]
    Pass,
    Node,
    Rewrite,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    #[default]
    Http,
    Https,
    Grpc,
    Grpcs,
    Tcp,
    Tls,
    Udp,
    Kafka,
}

impl Scheme {
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Https | Scheme::Grpcs | Scheme::Tls => 443,
            _ => 80,
        }
    }
}

/// Balancer type. Validation accepts any string (APISIX has no enum at write time); unknown
/// types are reported when the snapshot compiles.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LbType {
    #[default]
    RoundRobin,
    Chash,
    Ewma,
    LeastConn,
    Other(String),
}

impl<'de> Deserialize<'de> for LbType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(match s.as_str() {
            "roundrobin" => LbType::RoundRobin,
            "chash" => LbType::Chash,
            "ewma" => LbType::Ewma,
            "least_conn" => LbType::LeastConn,
            _ => LbType::Other(s),
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct KeepalivePool {
    pub size: u32,
    pub idle_timeout: f64,
    pub requests: u32,
}

impl Default for KeepalivePool {
    fn default() -> Self {
        // nginx_config.http.upstream defaults in APISIX.
        KeepalivePool {
            size: 320,
            idle_timeout: 60.0,
            requests: 1000,
        }
    }
}

/// One upstream node, normalised from either the map or the array form.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Host as written (IP, bracketed IPv6, or domain).
    pub host: String,
    pub port: u16,
    pub weight: u32,
    pub priority: i64,
    /// Boxed: most nodes have none, and a `Value` takes 80 bytes inline.
    pub metadata: Option<Box<Value>>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Upstream {
    pub id: Option<String>,
    pub name: Option<String>,
    pub nodes: Vec<Node>,
    pub lb_type: LbType,
    pub hash_on: Option<String>,
    pub key: Option<String>,
    /// `None` means APISIX's default: number of nodes − 1.
    pub retries: Option<u32>,
    /// Seconds; 0 = no limit.
    pub retry_timeout: f64,
    pub timeout: Option<Timeout>,
    pub pass_host: PassHost,
    pub upstream_host: Option<String>,
    pub scheme: Scheme,
    pub keepalive_pool: KeepalivePool,
    /// Health checks (`checks`) as written; the data plane reads them with APISIX's defaults.
    /// (This and `tls` are boxed: most upstreams have neither.)
    pub checks: Option<Box<Value>>,
    pub tls: Option<Box<Value>>,
    /// `discovery_type` (dns, consul, consul_kv, nacos, eureka, kubernetes) with its
    /// `service_name` and `discovery_args` (nacos' `namespace_id` and `group_name`).
    pub discovery_type: Option<String>,
    pub service_name: Option<String>,
    pub discovery_args: Option<Box<Value>>,
    /// HTTP/2 to an `http` (h2c, prior knowledge) or `https` (offered by ALPN) upstream: the
    /// ferrisix extension label [`HTTP_VERSION_LABEL`] set to `"2"`. gRPC upstreams speak
    /// HTTP/2 whatever it says.
    pub http2: bool,
}

/// The upstream label that asks for HTTP/2 to the nodes (`"2"`; `"1.1"`, the default, is
/// APISIX's behaviour). A label, not a key of its own: APISIX's upstream schema allows no
/// other key, and an APISIX node sharing the store ignores labels.
pub const HTTP_VERSION_LABEL: &str = "ferrisix.http_version";

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Route {
    pub id: String,
    pub name: Option<String>,
    /// `uri` or `uris`, in order.
    pub uris: Vec<String>,
    /// `host` or `hosts`, lower-cased.
    pub hosts: Vec<String>,
    /// Upper-case method names; `None` = all methods.
    pub methods: Option<Vec<String>>,
    /// `remote_addr` or `remote_addrs`, as written (IP or CIDR).
    pub remote_addrs: Vec<String>,
    /// The raw lua-resty-expr list; compiled with [`crate::vars::compile_vars`].
    pub vars: Option<Box<Value>>,
    pub priority: i64,
    /// `status: 0` disables the route.
    pub enabled: bool,
    pub plugins: Map<String, Value>,
    /// Shared with its compiled form, which compares it to tell whether it can be reused.
    pub upstream: Option<Arc<Upstream>>,
    pub upstream_id: Option<String>,
    pub service_id: Option<String>,
    pub plugin_config_id: Option<String>,
    /// Boxed: most routes have none.
    pub timeout: Option<Box<Timeout>>,
    pub enable_websocket: Option<bool>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Service {
    pub id: String,
    pub name: Option<String>,
    pub hosts: Vec<String>,
    pub plugins: Map<String, Value>,
    pub upstream: Option<Arc<Upstream>>,
    pub upstream_id: Option<String>,
    pub enable_websocket: Option<bool>,
}

/// `plugin_configs/<id>`: a reusable set of plugins.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PluginConfig {
    pub id: String,
    pub plugins: Map<String, Value>,
}

/// `global_rules/<id>`: plugins that run for every request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GlobalRule {
    pub id: String,
    pub plugins: Map<String, Value>,
}

/// `ssls/<id>`: `server` certificates are served to clients chosen by SNI; `client` ones are
/// presented to upstreams (`tls.client_cert_id`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SslType {
    #[default]
    Server,
    Client,
}

/// `ssls/<id>.client`: client-certificate verification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SslClient {
    /// The CA bundle (PEM) client certificates must chain to.
    pub ca: String,
    /// nginx `ssl_verify_depth` (default 1).
    pub depth: u32,
    /// URIs (regexes) that are served without a verified client certificate.
    pub skip_mtls_uri_regex: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ssl {
    pub id: String,
    pub ssl_type: SslType,
    pub cert: String,
    /// PEM, decrypted (the stored value may be encrypted with the keyring).
    pub key: String,
    pub certs: Vec<String>,
    pub keys: Vec<String>,
    /// `sni` or `snis`, lower-cased, a trailing dot removed (APISIX's `ssl_filter`).
    pub snis: Vec<String>,
    /// Whether `snis` (a list) was given rather than `sni`: APISIX checks matches differently.
    pub sni_list: bool,
    pub client: Option<SslClient>,
    /// `status: 0` takes the ssl out of the handshakes.
    pub enabled: bool,
    pub ssl_protocols: Option<Vec<String>>,
    /// `ocsp_stapling` (the ocsp-stapling plugin's field of ssls).
    pub ocsp_stapling: Option<OcspStapling>,
}

/// `ssls/<id>.ocsp_stapling`, with APISIX's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OcspStapling {
    pub enabled: bool,
    /// Staple the responder's answer without checking it.
    pub skip_verify: bool,
    /// Seconds an answer is cached (60 or more).
    pub cache_ttl: u64,
}
