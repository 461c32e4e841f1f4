//! The `discovery:` section: one key per registry, with the keys and defaults of APISIX's
//! `apisix/discovery/<name>/schema.lua`. `tars` is read (so that a config written for APISIX
//! loads) but not built; see docs/discovery.md.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `discovery.<name>.timeout` for the Consul modules (milliseconds; `wait` in seconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct ConsulTimeout {
    pub connect: u64,
    pub read: u64,
    /// The blocking query's `wait`, seconds.
    pub wait: u64,
}

impl Default for ConsulTimeout {
    fn default() -> Self {
        ConsulTimeout {
            connect: 2000,
            read: 2000,
            wait: 60,
        }
    }
}

/// `dump`: where the last fetched services are written, and whether they are read at start.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct DumpSettings {
    pub path: String,
    pub load_on_init: bool,
    /// Seconds after which a dump file is too old to load (0: never).
    pub expire: i64,
}

impl Default for DumpSettings {
    fn default() -> Self {
        DumpSettings {
            path: String::new(),
            load_on_init: true,
            expire: 0,
        }
    }
}

/// `default_service`: the node a service the registry does not know gets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct DefaultService {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub metadata: Option<DefaultServiceMetadata>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct DefaultServiceMetadata {
    pub fail_timeout: i64,
    pub weight: i64,
    pub max_fails: i64,
}

impl Default for DefaultServiceMetadata {
    fn default() -> Self {
        DefaultServiceMetadata {
            fail_timeout: 1,
            weight: 1,
            max_fails: 1,
        }
    }
}

/// `discovery.consul` (`apisix/discovery/consul/schema.lua`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct ConsulSettings {
    /// `http://host:port` of each Consul server (each is watched on its own).
    pub servers: Vec<String>,
    /// Accepted for APISIX's configs (it sizes an nginx shared dict; nothing to size here).
    pub shared_size: String,
    pub token: String,
    /// Seconds between fetches when `keepalive` is off.
    pub fetch_interval: u64,
    /// On: blocking queries, one after another. Off: a fetch every `fetch_interval`.
    pub keepalive: bool,
    pub weight: u32,
    pub timeout: ConsulTimeout,
    /// `origin`, `host_sort`, `port_sort` or `combine_sort`.
    pub sort_type: String,
    pub skip_services: Vec<String>,
    pub dump: Option<DumpSettings>,
    pub default_service: Option<DefaultService>,
}

impl Default for ConsulSettings {
    fn default() -> Self {
        ConsulSettings {
            servers: Vec::new(),
            shared_size: "64m".into(),
            token: String::new(),
            fetch_interval: 3,
            keepalive: true,
            weight: 1,
            timeout: ConsulTimeout::default(),
            sort_type: "origin".into(),
            skip_services: Vec::new(),
            dump: None,
            default_service: None,
        }
    }
}

/// `discovery.consul_kv` (`apisix/discovery/consul_kv/schema.lua`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct ConsulKvSettings {
    pub servers: Vec<String>,
    pub token: String,
    pub fetch_interval: u64,
    pub keepalive: bool,
    /// The key prefix the nodes are under.
    pub prefix: String,
    pub weight: u32,
    pub timeout: ConsulTimeout,
    pub skip_keys: Vec<String>,
    pub dump: Option<DumpSettings>,
    pub default_service: Option<DefaultService>,
}

impl Default for ConsulKvSettings {
    fn default() -> Self {
        ConsulKvSettings {
            servers: Vec::new(),
            token: String::new(),
            fetch_interval: 3,
            keepalive: true,
            prefix: "upstreams".into(),
            weight: 1,
            timeout: ConsulTimeout::default(),
            skip_keys: Vec::new(),
            dump: None,
            default_service: None,
        }
    }
}

/// `timeout` of Nacos and Eureka (milliseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct HttpTimeout {
    pub connect: u64,
    pub send: u64,
    pub read: u64,
}

impl Default for HttpTimeout {
    fn default() -> Self {
        HttpTimeout {
            connect: 2000,
            send: 2000,
            read: 5000,
        }
    }
}

/// `discovery.nacos` (`apisix/discovery/nacos/schema.lua`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct NacosSettings {
    /// `http(s)://[user:password@]host:port` of each Nacos server (one answering is enough).
    pub host: Vec<String>,
    pub fetch_interval: u64,
    /// The API prefix: `/nacos/v1/` (APISIX's), or `/nacos/v2/` for Nacos 2's open API.
    pub prefix: String,
    pub weight: u32,
    pub timeout: HttpTimeout,
    pub access_key: String,
    pub secret_key: String,
}

impl Default for NacosSettings {
    fn default() -> Self {
        NacosSettings {
            host: Vec::new(),
            fetch_interval: 30,
            prefix: "/nacos/v1/".into(),
            weight: 100,
            timeout: HttpTimeout::default(),
            access_key: String::new(),
            secret_key: String::new(),
        }
    }
}

/// `discovery.eureka` (`apisix/discovery/eureka/schema.lua`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct EurekaSettings {
    /// `http(s)://[user:password@]host:port` of each Eureka server.
    pub host: Vec<String>,
    pub fetch_interval: u64,
    pub prefix: Option<String>,
    /// The weight of an instance without `metadata.weight` (default 100).
    pub weight: Option<u32>,
    pub timeout: HttpTimeout,
}

impl Default for EurekaSettings {
    fn default() -> Self {
        EurekaSettings {
            host: Vec::new(),
            fetch_interval: 30,
            prefix: None,
            weight: None,
            timeout: HttpTimeout::default(),
        }
    }
}

/// `discovery.kubernetes.service`: where the API server is.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct KubernetesService {
    /// `http` or `https`.
    pub schema: String,
    /// A host, or `${ENV}` read from the environment.
    pub host: String,
    /// A port, or `${ENV}`.
    pub port: String,
    /// Verify the API server's certificate (APISIX's default: off).
    pub ssl_verify: Option<bool>,
}

impl Default for KubernetesService {
    fn default() -> Self {
        KubernetesService {
            schema: "https".into(),
            host: "${KUBERNETES_SERVICE_HOST}".into(),
            port: "${KUBERNETES_SERVICE_PORT}".into(),
            ssl_verify: None,
        }
    }
}

/// `discovery.kubernetes.client`: the bearer token, given or read from a file.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct KubernetesClient {
    pub token: Option<String>,
    pub token_file: Option<String>,
}

pub const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

impl Default for KubernetesClient {
    fn default() -> Self {
        KubernetesClient {
            token: None,
            token_file: Some(DEFAULT_TOKEN_FILE.into()),
        }
    }
}

/// `namespace_selector`: at most one of its keys.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct NamespaceSelector {
    pub equal: Option<String>,
    pub not_equal: Option<String>,
    pub r#match: Option<Vec<String>>,
    pub not_match: Option<Vec<String>>,
}

/// One Kubernetes cluster (`discovery.kubernetes`, or an item of its list form with `id`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct KubernetesCluster {
    /// The cluster's id in the list form (`service_name` then starts with `id/`).
    pub id: Option<String>,
    pub service: KubernetesService,
    pub client: KubernetesClient,
    pub namespace_selector: Option<NamespaceSelector>,
    pub label_selector: Option<String>,
    pub default_weight: u32,
    pub shared_size: String,
    pub watch_endpoint_slices: bool,
}

impl Default for KubernetesCluster {
    fn default() -> Self {
        KubernetesCluster {
            id: None,
            service: KubernetesService::default(),
            client: KubernetesClient::default(),
            namespace_selector: None,
            label_selector: None,
            default_weight: 50,
            shared_size: "64m".into(),
            watch_endpoint_slices: false,
        }
    }
}

/// `discovery.kubernetes`: one cluster (an object) or several (a list, each with an `id`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum KubernetesSettings {
    Multiple(Vec<KubernetesCluster>),
    Single(Box<KubernetesCluster>),
}

/// The `discovery:` section.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct DiscoverySettings {
    pub dns: Option<super::DnsDiscoverySettings>,
    pub consul: Option<ConsulSettings>,
    pub consul_kv: Option<ConsulKvSettings>,
    pub nacos: Option<NacosSettings>,
    pub eureka: Option<EurekaSettings>,
    pub kubernetes: Option<KubernetesSettings>,
    /// Read so that APISIX's configs load; not built (it reads a MySQL database).
    pub tars: Option<Value>,
}

impl DiscoverySettings {
    /// Whether `name` is configured (APISIX answers "discovery X is uninitialized" otherwise).
    pub fn configured(&self, name: &str) -> bool {
        match name {
            "dns" => self.dns.is_some(),
            "consul" => self.consul.is_some(),
            "consul_kv" => self.consul_kv.is_some(),
            "nacos" => self.nacos.is_some(),
            "eureka" => self.eureka.is_some(),
            "kubernetes" => self.kubernetes.is_some(),
            "tars" => self.tars.is_some(),
            _ => false,
        }
    }
}

/// `http://host:port` with nothing after the port (Consul's modules accept no other form).
fn consul_server_ok(s: &str) -> bool {
    match s.strip_prefix("http://") {
        Some(rest) => !rest.is_empty() && !rest.contains('/'),
        None => false,
    }
}

fn at_least_one(errors: &mut Vec<String>, key: &str, v: u64) {
    if v < 1 {
        errors.push(format!("{key}: invalid value: {v}, expected at least 1"));
    }
}

fn check_consul_common(
    errors: &mut Vec<String>,
    name: &str,
    servers: &[String],
    fetch_interval: u64,
    weight: u32,
    timeout: &ConsulTimeout,
    dump: Option<&DumpSettings>,
) {
    if servers.is_empty() {
        errors.push(format!(
            "discovery.{name}.servers: expected at least one server"
        ));
    }
    for (i, s) in servers.iter().enumerate() {
        if !consul_server_ok(s) {
            errors.push(format!(
                "discovery.{name}.servers[{i}]: invalid value: string {s:?}, only support consul \
                 http schema address, eg: http://address:port"
            ));
        }
    }
    at_least_one(
        errors,
        &format!("discovery.{name}.fetch_interval"),
        fetch_interval,
    );
    at_least_one(
        errors,
        &format!("discovery.{name}.weight"),
        u64::from(weight),
    );
    at_least_one(
        errors,
        &format!("discovery.{name}.timeout.connect"),
        timeout.connect,
    );
    at_least_one(
        errors,
        &format!("discovery.{name}.timeout.read"),
        timeout.read,
    );
    at_least_one(
        errors,
        &format!("discovery.{name}.timeout.wait"),
        timeout.wait,
    );
    if let Some(d) = dump {
        if d.path.is_empty() {
            errors.push(format!("discovery.{name}.dump.path: required, a file path"));
        }
    }
}

fn check_k8s_cluster(errors: &mut Vec<String>, key: &str, c: &KubernetesCluster) {
    if !matches!(c.service.schema.as_str(), "http" | "https") {
        errors.push(format!(
            "{key}.service.schema: invalid value: string {:?}, expected http or https",
            c.service.schema
        ));
    }
    if let Some(ns) = &c.namespace_selector {
        let set = [
            ns.equal.is_some(),
            ns.not_equal.is_some(),
            ns.r#match.is_some(),
            ns.not_match.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if set > 1 {
            errors.push(format!(
                "{key}.namespace_selector: only one of equal, not_equal, match, not_match"
            ));
        }
        for list in [&ns.r#match, &ns.not_match].into_iter().flatten() {
            if list.is_empty() {
                errors.push(format!(
                    "{key}.namespace_selector: match/not_match need at least one pattern"
                ));
            }
            for p in list {
                if let Err(e) = regex::Regex::new(&format!("^(?:{p})$")) {
                    errors.push(format!(
                        "{key}.namespace_selector: invalid pattern {p:?}: {e}"
                    ));
                }
            }
        }
    }
    if let Some(t) = &c.client.token {
        if t.len() > 4096 {
            errors.push(format!("{key}.client.token: longer than 4096 characters"));
        }
    }
}

/// The rules APISIX's discovery schemas check that the types do not.
pub(super) fn check(d: &DiscoverySettings, errors: &mut Vec<String>) {
    if let Some(c) = &d.consul {
        check_consul_common(
            errors,
            "consul",
            &c.servers,
            c.fetch_interval,
            c.weight,
            &c.timeout,
            c.dump.as_ref(),
        );
        if !matches!(
            c.sort_type.as_str(),
            "origin" | "host_sort" | "port_sort" | "combine_sort"
        ) {
            errors.push(format!(
                "discovery.consul.sort_type: invalid value: string {:?}, expected one of \
                 origin, host_sort, port_sort, combine_sort",
                c.sort_type
            ));
        }
    }
    if let Some(c) = &d.consul_kv {
        check_consul_common(
            errors,
            "consul_kv",
            &c.servers,
            c.fetch_interval,
            c.weight,
            &c.timeout,
            c.dump.as_ref(),
        );
    }
    if let Some(n) = &d.nacos {
        if n.host.is_empty() {
            errors.push("discovery.nacos.host: expected at least one host".into());
        }
        for (i, h) in n.host.iter().enumerate() {
            if !(h.starts_with("http://") || h.starts_with("https://")) || h.len() > 100 {
                errors.push(format!(
                    "discovery.nacos.host[{i}]: invalid value: string {h:?}, expected \
                     http(s)://[user:password@]host:port"
                ));
            }
        }
        at_least_one(errors, "discovery.nacos.fetch_interval", n.fetch_interval);
        at_least_one(errors, "discovery.nacos.weight", u64::from(n.weight));
        if n.prefix.is_empty()
            || !n
                .prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "/-_.".contains(c))
        {
            errors.push(format!(
                "discovery.nacos.prefix: invalid value: string {:?}",
                n.prefix
            ));
        }
    }
    if let Some(e) = &d.eureka {
        if e.host.is_empty() {
            errors.push("discovery.eureka.host: expected at least one host".into());
        }
        at_least_one(errors, "discovery.eureka.fetch_interval", e.fetch_interval);
    }
    match &d.kubernetes {
        Some(KubernetesSettings::Single(c)) => check_k8s_cluster(errors, "discovery.kubernetes", c),
        Some(KubernetesSettings::Multiple(list)) => {
            if list.is_empty() {
                errors.push("discovery.kubernetes: expected at least one cluster".into());
            }
            let mut seen = std::collections::HashSet::new();
            for (i, c) in list.iter().enumerate() {
                let key = format!("discovery.kubernetes[{i}]");
                match c.id.as_deref() {
                    None | Some("") => errors.push(format!("{key}.id: required")),
                    Some(id) => {
                        if !id
                            .chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                            || id.len() > 64
                        {
                            errors.push(format!(
                                "{key}.id: invalid value: string {id:?}, expected 1 to 64 \
                                 lower-case letters or digits"
                            ));
                        }
                        if !seen.insert(id) {
                            errors.push(format!("{key}.id: duplicate id value"));
                        }
                    }
                }
                check_k8s_cluster(errors, &key, c);
            }
        }
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{Settings, SettingsError};

    fn load(yaml: &str) -> Result<Settings, Vec<String>> {
        match Settings::from_yaml_str(yaml) {
            Ok((s, _)) => Ok(s),
            Err(SettingsError::Invalid { errors, .. }) => Err(errors),
            Err(e) => Err(vec![e.to_string()]),
        }
    }

    #[test]
    fn consul_defaults_and_keys() {
        let s = load(
            "discovery:\n  consul:\n    servers: [\"http://127.0.0.1:8500\"]\n    skip_services: [a]\n    dump:\n      path: /tmp/x\n",
        )
        .unwrap();
        let c = s.discovery.consul.unwrap();
        assert_eq!(
            c.timeout,
            ConsulTimeout {
                connect: 2000,
                read: 2000,
                wait: 60
            }
        );
        assert!(c.keepalive);
        assert_eq!(
            (c.fetch_interval, c.weight, c.sort_type.as_str()),
            (3, 1, "origin")
        );
        let dump = c.dump.unwrap();
        assert!(dump.load_on_init);
        assert_eq!(dump.expire, 0);
        assert_eq!(c.skip_services, ["a"]);
    }

    #[test]
    fn kubernetes_single_and_multiple() {
        let s = load(
            "discovery:\n  kubernetes:\n    service:\n      host: 10.0.0.1\n      port: \"6443\"\n",
        )
        .unwrap();
        match s.discovery.kubernetes.unwrap() {
            KubernetesSettings::Single(c) => {
                assert_eq!(c.service.schema, "https");
                assert_eq!(c.client.token_file.as_deref(), Some(DEFAULT_TOKEN_FILE));
                assert_eq!(c.default_weight, 50);
            }
            other => panic!("{other:?}"),
        }
        let s = load(
            "discovery:\n  kubernetes:\n    - id: a1\n      client:\n        token: t\n    - id: b2\n",
        )
        .unwrap();
        match s.discovery.kubernetes.unwrap() {
            KubernetesSettings::Multiple(l) => {
                assert_eq!(l.len(), 2);
                assert_eq!(l[0].client.token.as_deref(), Some("t"));
            }
            other => panic!("{other:?}"),
        }
        let errors =
            load("discovery:\n  kubernetes:\n    - id: a1\n    - id: a1\n    - {}\n").unwrap_err();
        assert!(
            errors.iter().any(|e| e.contains("duplicate id")),
            "{errors:?}"
        );
        assert!(
            errors.iter().any(|e| e.contains("[2].id: required")),
            "{errors:?}"
        );
        let errors = load(
            "discovery:\n  kubernetes:\n    namespace_selector:\n      equal: a\n      match: [\"(\"]\n",
        )
        .unwrap_err();
        assert_eq!(errors.len(), 2, "{errors:?}");
    }

    #[test]
    fn bad_values_are_reported() {
        let errors = load(
            "discovery:\n  consul:\n    servers: [\"https://x:1\", \"http://x:1/\"]\n    sort_type: random\n    fetch_interval: 0\n  nacos:\n    host: []\n  eureka:\n    host: []\n",
        )
        .unwrap_err();
        for want in [
            "consul.servers[0]",
            "consul.servers[1]",
            "consul.sort_type",
            "consul.fetch_interval",
            "nacos.host",
            "eureka.host",
        ] {
            assert!(
                errors.iter().any(|e| e.contains(want)),
                "{want}: {errors:?}"
            );
        }
        let s = load("discovery:\n  nacos:\n    host: [\"http://u:p@127.0.0.1:8848\"]\n  tars: {db_conf: {}}\n").unwrap();
        assert_eq!(s.discovery.nacos.as_ref().unwrap().prefix, "/nacos/v1/");
        assert!(s.discovery.configured("tars"));
        assert!(!s.discovery.configured("consul"));
    }
}
