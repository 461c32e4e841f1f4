//! The checks themselves: a resource against its schema (with the plugins' schemas, `_meta`
//! and APISIX's extra rules), references between resources, and the messages they answer.

use std::fmt;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::addr::parse_addr;
use super::convert::strings;
use crate::encrypt::Keyring;
use crate::model::ResourceKind;
use crate::schema::{self, lua};
use crate::state::ConfigState;
use crate::vars;

/// Checks one plugin's configuration. Implementations return APISIX's full message:
/// `unknown plugin [<name>]` for a plugin that is not enabled, `failed to check the
/// configuration of plugin <name> err: <schema error>` when its schema refuses the conf.
///
/// `conf` is always a JSON object (or an empty array, which Lua cannot tell from `{}`); other
/// values are refused before this is called. Schema failures of a plugin whose
/// `_meta.disable` is `true` are accepted by the caller (APISIX 3.18), as are the `_meta.filter`
/// checks, which the caller also runs.
pub trait PluginCheck {
    fn check(&self, name: &str, conf: &Value) -> Result<(), String>;

    /// A plugin on a consumer (checked against the plugin's consumer schema where it has one).
    fn check_consumer(&self, name: &str, conf: &Value) -> Result<(), String> {
        self.check(name, conf)
    }

    /// A `plugin_metadata` document. Errors are the full message: `invalid plugin name` for an
    /// unknown plugin, `invalid configuration: <schema error>` otherwise.
    fn check_metadata(&self, name: &str, conf: &Value) -> Result<(), String> {
        let _ = (name, conf);
        Ok(())
    }
}

/// Accepts every plugin name with any object configuration (a stand-in until the plugins crate
/// provides the real schemas).
#[derive(Clone, Copy, Debug, Default)]
pub struct AcceptAnyPlugin;

impl PluginCheck for AcceptAnyPlugin {
    fn check(&self, name: &str, conf: &Value) -> Result<(), String> {
        // Every plugin schema is at least `{type: object}`; a non-empty array fails it.
        schema::validate(&serde_json::json!({"type": "object"}), conf)
            .map_err(|e| format!("failed to check the configuration of plugin {name} err: {e}"))
    }
}

/// A refused resource; `message` is APISIX's `error_msg`.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidationError {
    pub message: String,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ValidationError {}

impl From<String> for ValidationError {
    fn from(message: String) -> Self {
        ValidationError { message }
    }
}

/// Read access to stored resources, for the reference checks (`upstream_id` must exist ...).
pub trait ReferenceLookup {
    /// The stored value of `kind/id`, `None` when there is none.
    fn lookup(&self, kind: ResourceKind, id: &str) -> Option<Arc<Value>>;
}

impl ReferenceLookup for ConfigState {
    fn lookup(&self, kind: ResourceKind, id: &str) -> Option<Arc<Value>> {
        self.get(kind, id).map(|item| Arc::new(item.value.parse()))
    }
}

/// Checks a resource as the Admin API does on PUT/POST/PATCH, except the references to other
/// stored resources (see [`references`] and [`check_resource_with_refs`]).
pub fn check_resource(
    kind: ResourceKind,
    value: &Value,
    plugins: &dyn PluginCheck,
) -> Result<(), ValidationError> {
    let mut conf = value.clone();
    check_in_place(kind, &mut conf, plugins, None)
}

/// [`check_resource`] plus the reference checks, each at the point APISIX runs it, with
/// APISIX's messages (`failed to fetch upstream info by upstream id [1], response code: 404`).
pub fn check_resource_with_refs(
    kind: ResourceKind,
    value: &Value,
    plugins: &dyn PluginCheck,
    refs: &dyn ReferenceLookup,
) -> Result<(), ValidationError> {
    let mut conf = value.clone();
    check_in_place(kind, &mut conf, plugins, Some(refs))
}

/// Runs the checks on `conf` and leaves the schema defaults filled in, as APISIX's validator
/// does to the copy it checks.
pub(crate) fn check_in_place(
    kind: ResourceKind,
    conf: &mut Value,
    plugins: &dyn PluginCheck,
    refs: Option<&dyn ReferenceLookup>,
) -> Result<(), ValidationError> {
    Checker {
        plugins,
        refs,
        keyring: None,
        synced: false,
    }
    .check(kind, conf)
}

/// [`check_resource`] (or [`check_resource_with_refs`] with `refs`) as the Admin API runs it on
/// a write: an ssl's or upstream's private key that is not PEM is decrypted with `keyring`
/// and then parsed, as APISIX's `validate` decrypts it (`aes_decrypt_pkey`), so a key that is
/// neither PEM nor the keyring's ciphertext is refused (`failed to decrypt previous encrypted
/// key`), and so is the ciphertext of something that is no key. An empty keyring decrypts
/// nothing: the key is parsed as it is.
pub fn check_resource_with_keyring(
    kind: ResourceKind,
    value: &Value,
    plugins: &dyn PluginCheck,
    refs: Option<&dyn ReferenceLookup>,
    keyring: &Keyring,
) -> Result<(), ValidationError> {
    let mut conf = value.clone();
    Checker {
        plugins,
        refs,
        keyring: Some(keyring),
        synced: false,
    }
    .check(kind, &mut conf)
}

/// [`check_in_place`] for a resource the data plane synced from the store. As APISIX's
/// config loader, it checks a route's or service's inline upstream by the schema of its
/// holder only (the Admin API checks it against the upstream schema a second time, a cost a
/// boot would pay per route: `benches/e2e/boot_ab.py` times its validation); the upstream's
/// other checks (ports, IPv6 brackets, `pass_host`, chash keys, TLS) still run.
pub(crate) fn check_synced_in_place(
    kind: ResourceKind,
    conf: &mut Value,
    plugins: &dyn PluginCheck,
) -> Result<(), ValidationError> {
    Checker {
        plugins,
        refs: None,
        keyring: None,
        synced: true,
    }
    .check(kind, conf)
}

impl Checker<'_> {
    fn check(&self, kind: ResourceKind, conf: &mut Value) -> Result<(), ValidationError> {
        match kind {
            ResourceKind::Routes => self.route(conf),
            ResourceKind::Services => self.service(conf),
            ResourceKind::Upstreams => self.upstream(conf),
            ResourceKind::PluginConfigs | ResourceKind::GlobalRules => self.plugin_set(kind, conf),
            ResourceKind::Consumers => self.consumer(conf),
            ResourceKind::ConsumerGroups => self.consumer_group(conf),
            ResourceKind::Credentials => self.credential(conf),
            ResourceKind::Ssls => self.ssl(conf),
            ResourceKind::PluginMetadata => self.plugin_metadata(conf),
            ResourceKind::Protos => proto(conf),
            // The stream proxy checks its plugins against the stream plugins when it compiles.
            ResourceKind::StreamRoutes => {
                crate::schema::validate(crate::schema::resource_schema(kind), conf)
            }
            // The id names the manager whose schema applies: the data plane's secret
            // resolution checks it when it reads the item.
            ResourceKind::Secrets => Ok(()),
        }
        .map_err(ValidationError::from)
    }
}

/// A proto: APISIX's schema, then its content compiles (`invalid content: <compiler's
/// message>`); an import that names no proto yet is left to the data plane, which holds the
/// proto back until it exists.
fn proto(conf: &Value) -> Result<(), String> {
    crate::schema::validate(crate::schema::resource_schema(ResourceKind::Protos), conf)?;
    let content = conf
        .get("content")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let id = conf.get("id").map_or_else(|| "proto".to_owned(), id_text);
    crate::proto::check(&id, content).map_err(|e| format!("invalid content: {e}"))
}

/// APISIX's `plugin.check_schema` over a `plugins` object on its own, for resources whose other
/// checks live elsewhere (the Admin API's consumer groups and consumer credentials). `consumer`
/// selects the plugins' consumer schemas; a non-object `plugins` is left to the schema.
pub fn check_plugins(
    plugins: &Value,
    consumer: bool,
    plugin_check: &dyn PluginCheck,
) -> Result<(), ValidationError> {
    let checker = Checker {
        plugins: plugin_check,
        refs: None,
        keyring: None,
        synced: false,
    };
    checker
        .plugins(plugins, consumer)
        .map_err(ValidationError::from)
}

/// The stored resources a resource points at, in the order APISIX checks them: an upstream's
/// (or inline upstream's) `tls.client_cert_id` (an SSL), then `upstream_id`, `service_id`,
/// `plugin_config_id`. Ids are given as APISIX prints them (`1` for an integer id).
pub fn references(kind: ResourceKind, value: &Value) -> Vec<(ResourceKind, String)> {
    let mut out = Vec::new();
    let client_cert = |up: &Value| {
        up.get("tls")
            .and_then(|t| t.get("client_cert_id"))
            .map(id_text)
    };
    match kind {
        ResourceKind::Upstreams => {
            out.extend(client_cert(value).map(|id| (ResourceKind::Ssls, id)));
        }
        ResourceKind::Routes | ResourceKind::Services => {
            if let Some(up) = value.get("upstream").filter(|u| truthy(Some(u))) {
                out.extend(client_cert(up).map(|id| (ResourceKind::Ssls, id)));
            }
            let mut fields = vec![("upstream_id", ResourceKind::Upstreams)];
            if kind == ResourceKind::Routes {
                fields.push(("service_id", ResourceKind::Services));
                fields.push(("plugin_config_id", ResourceKind::PluginConfigs));
            }
            for (field, target) in fields {
                if let Some(id) = value.get(field).filter(|v| truthy(Some(v))) {
                    out.push((target, id_text(id)));
                }
            }
        }
        _ => {}
    }
    out
}

/// APISIX's message for a reference to a resource that does not exist.
pub fn missing_reference_message(kind: ResourceKind, id: &str) -> String {
    let what = match kind {
        ResourceKind::Upstreams => "upstream info by upstream",
        ResourceKind::Services => "service info by service",
        ResourceKind::PluginConfigs => "plugin config info by plugin config",
        ResourceKind::Ssls => "ssl info by ssl",
        ResourceKind::GlobalRules => "global rule info by global rule",
        ResourceKind::Consumers => "consumer info by consumer",
        ResourceKind::ConsumerGroups => "consumer group info by consumer group",
        ResourceKind::Credentials => "credential info by credential",
        ResourceKind::PluginMetadata => "plugin metadata info by plugin metadata",
        ResourceKind::Protos => "proto info by proto",
        ResourceKind::Routes => "route info by route",
        ResourceKind::StreamRoutes => "stream route info by stream route",
        ResourceKind::Secrets => "secret info by secret",
    };
    format!("failed to fetch {what} id [{id}], response code: 404")
}

/// The Admin API's refusal of bookkeeping fields in a PUT/POST body (3.7+): `create_time` or
/// `update_time` at the top level, inside `upstream`, or as a plugin name.
pub fn check_forbidden_properties(value: &Value) -> Result<(), ValidationError> {
    const FORBIDDEN: [&str; 2] = ["create_time", "update_time"];
    let prefix = "the property is forbidden:  ";
    for (scope, obj) in [
        ("", Some(value)),
        ("upstream.", value.get("upstream")),
        ("plugins.", value.get("plugins")),
    ] {
        let Some(Value::Object(obj)) = obj else {
            continue;
        };
        if let Some(field) = FORBIDDEN.iter().find(|f| truthy(obj.get(**f))) {
            return Err(format!("{prefix}{scope}{field}").into());
        }
    }
    Ok(())
}

/// APISIX 3.15+: one plugin may appear in only one global rule. `others` are the stored global
/// rules in list order; the rule being written (same `id`) and rules without an id are skipped.
pub fn check_global_rule_conflicts<'a>(
    id: &str,
    value: &Value,
    others: impl IntoIterator<Item = &'a Value>,
) -> Result<(), ValidationError> {
    let Some(Value::Object(plugins)) = value.get("plugins") else {
        return Ok(());
    };
    for other in others {
        let Some(stored_id) = other.get("id").map(id_text) else {
            continue;
        };
        if stored_id == id {
            continue;
        }
        let Some(Value::Object(theirs)) = other.get("plugins") else {
            continue;
        };
        if let Some(name) = plugins.keys().find(|name| theirs.contains_key(*name)) {
            return Err(format!(
                "plugin '{name}' already exists in global rule with id '{stored_id}'"
            )
            .into());
        }
    }
    Ok(())
}

/// Lua truthiness of an optional field: present and not `false` (JSON `null` is a truthy
/// userdata in Lua).
fn truthy(v: Option<&Value>) -> bool {
    !matches!(v, None | Some(Value::Bool(false)))
}

/// `$secret://...` and `$env://...` references are resolved at use, not checked on write.
fn is_secret_ref(s: &str) -> bool {
    s.starts_with("$secret://") || s.to_ascii_uppercase().starts_with("$ENV://")
}

/// APISIX's `apisix_ssl.validate(cert, key)`: the certificate is parsed, then the key, once
/// decrypted with `keyring` when it is not PEM. Without a keyring a key that is not PEM is
/// taken as encrypted; it is parsed when the data plane decrypts it.
fn check_pem_pair(cert: &str, key: Option<&str>, keyring: Option<&Keyring>) -> Result<(), String> {
    crate::pem::parse_certs(cert).map_err(|e| format!("failed to parse cert: {e}"))?;
    let Some(key) = key else {
        return Ok(());
    };
    let pem = match keyring {
        // APISIX logs the keyring's reason and answers without it.
        Some(k) => k
            .decrypt_pkey(key)
            .map_err(|_| "failed to decrypt previous encrypted key".to_string())?,
        None if key.starts_with("---") => key.to_owned(),
        None => return Ok(()),
    };
    crate::pem::parse_key(&pem).map_err(|e| format!("failed to parse key: {e}"))?;
    Ok(())
}

/// An id as Lua's string concatenation prints it.
pub(crate) fn id_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => lua::json_number(n),
        other => lua::cjson_encode(other),
    }
}

fn schema_check(schema: &Value, conf: &mut Value) -> Result<(), String> {
    schema::validate_and_fill(schema, conf).map_err(|e| format!("invalid configuration: {e}"))
}

struct Checker<'a> {
    plugins: &'a dyn PluginCheck,
    refs: Option<&'a dyn ReferenceLookup>,
    /// The keyring private keys that are not PEM are decrypted with before they are parsed
    /// (the Admin API's; see [`check_resource_with_keyring`]). `None`: such keys are taken as
    /// encrypted and parsed where they are decrypted.
    keyring: Option<&'a Keyring>,
    /// Synced by the data plane, not written through the Admin API (see
    /// [`check_synced_in_place`]).
    synced: bool,
}

impl Checker<'_> {
    fn route(&self, conf: &mut Value) -> Result<(), String> {
        if truthy(conf.get("host")) && truthy(conf.get("hosts")) {
            return Err("only one of host or hosts is allowed".to_string());
        }
        if truthy(conf.get("remote_addr")) && truthy(conf.get("remote_addrs")) {
            return Err("only one of remote_addr or remote_addrs is allowed".to_string());
        }
        schema_check(schema::resource_schema(ResourceKind::Routes), conf)?;
        if let Some(up) = conf.get_mut("upstream").filter(|u| truthy(Some(u))) {
            self.inline_upstream(up)?;
        }
        self.reference(conf, "upstream_id", ResourceKind::Upstreams)?;
        self.reference(conf, "service_id", ResourceKind::Services)?;
        self.reference(conf, "plugin_config_id", ResourceKind::PluginConfigs)?;
        if let Some(plugins) = conf.get("plugins").filter(|p| truthy(Some(p))) {
            self.plugins(plugins, false)?;
        }
        if let Some(expr) = conf.get("vars").filter(|v| truthy(Some(v))) {
            vars::compile_vars(expr)?;
        }
        if let Some(expr) = conf.get("vars") {
            vars::check_post_arg_paths(expr)?;
        }
        // `filter_func` and `script` are Lua source; they are kept as written and not run.
        Ok(())
    }

    fn service(&self, conf: &mut Value) -> Result<(), String> {
        schema_check(schema::resource_schema(ResourceKind::Services), conf)?;
        if let Some(up) = conf.get_mut("upstream").filter(|u| truthy(Some(u))) {
            self.inline_upstream(up)?;
        }
        self.reference(conf, "upstream_id", ResourceKind::Upstreams)?;
        if let Some(plugins) = conf.get("plugins").filter(|p| truthy(Some(p))) {
            self.plugins(plugins, false)?;
        }
        Ok(())
    }

    /// A route's or service's inline upstream, after its holder's schema check.
    fn inline_upstream(&self, conf: &mut Value) -> Result<(), String> {
        self.upstream_checks(conf, !self.synced)
    }

    fn upstream(&self, conf: &mut Value) -> Result<(), String> {
        self.upstream_checks(conf, true)
    }

    /// APISIX's `check_upstream_conf` (Admin side), for upstreams and inline upstreams alike;
    /// `schema`: whether the upstream schema is checked (see [`check_synced_in_place`]).
    fn upstream_checks(&self, conf: &mut Value, schema: bool) -> Result<(), String> {
        // Checked before the schema: an unbracketed IPv6 host would make "host:port" ambiguous.
        if let Some(Value::Array(nodes)) = conf.get("nodes") {
            for node in nodes {
                if let Some(Value::String(host)) = node.get("host") {
                    if !host.starts_with('[') && host.parse::<std::net::Ipv6Addr>().is_ok() {
                        return Err(
                            "invalid configuration: IPv6 address must be enclosed with '[' and ']'"
                                .to_string(),
                        );
                    }
                }
            }
        }
        if schema {
            schema_check(schema::resource_schema(ResourceKind::Upstreams), conf)?;
        }

        if let Some(Value::Object(nodes)) = conf.get("nodes") {
            for addr in nodes.keys() {
                if let (_, Some(port)) = parse_addr(addr) {
                    if !(1.0..=65535.0).contains(&port) {
                        return Err(format!("invalid port {}", lua::number(port)));
                    }
                }
            }
        }

        if let (Some(refs), Some(ssl_id)) = (
            self.refs,
            conf.get("tls").and_then(|t| t.get("client_cert_id")),
        ) {
            let ssl_id = id_text(ssl_id);
            match refs.lookup(ResourceKind::Ssls, &ssl_id) {
                None => return Err(missing_reference_message(ResourceKind::Ssls, &ssl_id)),
                Some(ssl) if ssl.get("type").and_then(Value::as_str) != Some("client") => {
                    return Err(format!(
                        "failed to fetch ssl info by ssl id [{ssl_id}], wrong ssl type"
                    ));
                }
                Some(_) => {}
            }
        }

        let no_upstream_host = match conf.get("upstream_host") {
            None => true,
            Some(Value::String(host)) => host.is_empty(),
            Some(_) => false,
        };
        if conf.get("pass_host").and_then(Value::as_str) == Some("rewrite") && no_upstream_host {
            return Err("`upstream_host` can't be empty when `pass_host` is `rewrite`".to_string());
        }

        check_http_version(conf)?;

        if let Some(tls) = conf.get("tls") {
            if let Some(Value::String(cert)) = tls.get("client_cert") {
                let key = tls.get("client_key").and_then(Value::as_str);
                check_pem_pair(cert, key, self.keyring)?;
            }
        }

        if conf.get("type").and_then(Value::as_str) != Some("chash") {
            return Ok(());
        }
        let hash_on = conf
            .get("hash_on")
            .and_then(Value::as_str)
            .unwrap_or("vars")
            .to_string();
        let key = conf.get("key");
        if hash_on != "consumer" && !truthy(key) {
            return Err("missing key".to_string());
        }
        match schema::chash_key_schema(&hash_on) {
            Err(e) => Err(format!("type is chash, err: {e}")),
            Ok(None) => Ok(()),
            Ok(Some(key_schema)) => {
                let mut key = key.cloned().unwrap_or(Value::Null);
                schema_check(key_schema, &mut key)
            }
        }
    }

    fn plugin_set(&self, kind: ResourceKind, conf: &mut Value) -> Result<(), String> {
        schema_check(schema::resource_schema(kind), conf)?;
        if let Some(plugins) = conf.get("plugins") {
            self.plugins(plugins, false)?;
        }
        Ok(())
    }

    fn consumer(&self, conf: &mut Value) -> Result<(), String> {
        schema_check(schema::resource_schema(ResourceKind::Consumers), conf)?;
        if let Some(plugins) = conf.get("plugins").filter(|p| truthy(Some(p))) {
            self.plugins(plugins, true)
                .map_err(|e| format!("invalid plugins configuration: {e}"))?;
        }
        Ok(())
    }

    fn consumer_group(&self, conf: &mut Value) -> Result<(), String> {
        schema_check(schema::resource_schema(ResourceKind::ConsumerGroups), conf)?;
        if let Some(plugins) = conf.get("plugins") {
            self.plugins(plugins, false)?;
        }
        Ok(())
    }

    /// A credential's plugins are checked with their consumer schemas (only auth plugins are
    /// allowed: the Admin API refuses others, the data plane ignores them).
    fn credential(&self, conf: &mut Value) -> Result<(), String> {
        schema_check(schema::resource_schema(ResourceKind::Credentials), conf)?;
        if let Some(plugins) = conf.get("plugins").filter(|p| truthy(Some(p))) {
            self.plugins(plugins, true)
                .map_err(|e| format!("invalid plugins configuration: {e}"))?;
        }
        Ok(())
    }

    /// APISIX's `check_ssl_conf`: the schema, the certificate and key, then the extra pairs
    /// (numbered from 1) and the client CA. A key that does not belong to its certificate is
    /// accepted, as APISIX accepts it; the handshake fails later (and says so in the log).
    fn ssl(&self, conf: &mut Value) -> Result<(), String> {
        schema_check(schema::resource_schema(ResourceKind::Ssls), conf)?;
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
        if let Some(cert) = text(conf.get("cert")) {
            let key = text(conf.get("key"));
            if !is_secret_ref(&cert) && !key.as_deref().is_some_and(is_secret_ref) {
                check_pem_pair(&cert, key.as_deref(), self.keyring)?;
            }
        }
        if conf.get("type").and_then(Value::as_str) == Some("client") {
            return Ok(());
        }
        let list = |field: &str| strings(conf.get(field));
        let (certs, keys) = (list("certs"), list("keys"));
        if certs.len() != keys.len() {
            return Err("mismatched number of certs and keys".to_string());
        }
        for (i, (cert, key)) in certs.iter().zip(&keys).enumerate() {
            if !is_secret_ref(cert) && !is_secret_ref(key) {
                check_pem_pair(cert, Some(key), self.keyring)
                    .map_err(|e| format!("failed to handle cert-key pair[{}]: {e}", i + 1))?;
            }
        }
        if let Some(ca) = text(conf.get("client").and_then(|c| c.get("ca"))) {
            if !is_secret_ref(&ca) {
                check_pem_pair(&ca, None, None)
                    .map_err(|e| format!("failed to validate client_cert: {e}"))?;
            }
        }
        Ok(())
    }

    fn plugin_metadata(&self, conf: &mut Value) -> Result<(), String> {
        let Some(name) = conf.get("id").map(id_text) else {
            return Err("missing plugin name".to_string());
        };
        self.plugins.check_metadata(&name, conf)
    }

    fn reference(&self, conf: &Value, field: &str, kind: ResourceKind) -> Result<(), String> {
        let (Some(refs), Some(id)) = (self.refs, conf.get(field).filter(|v| truthy(Some(v))))
        else {
            return Ok(());
        };
        let id = id_text(id);
        match refs.lookup(kind, &id) {
            Some(_) => Ok(()),
            None => Err(missing_reference_message(kind, &id)),
        }
    }

    /// APISIX's `plugin.check_schema` over a `plugins` object, in document order.
    fn plugins(&self, plugins: &Value, consumer: bool) -> Result<(), String> {
        let Value::Object(plugins) = plugins else {
            return Ok(());
        };
        for (name, conf) in plugins {
            self.plugin(name, conf, consumer)?;
        }
        Ok(())
    }

    fn plugin(&self, name: &str, conf: &Value, consumer: bool) -> Result<(), String> {
        if !matches!(conf, Value::Object(_) | Value::Array(_)) {
            return Err(format!(
                "invalid plugin conf {} for plugin [{name}]",
                lua::force_encode_scalar(conf)
            ));
        }
        let checked = if consumer {
            self.plugins.check_consumer(name, conf)
        } else {
            self.plugins.check(name, conf)
        };
        if let Err(e) = checked {
            // 3.18: a disabled plugin never runs, so a failing schema does not block the resource.
            let schema_failure = e.starts_with("failed to check the configuration of plugin ");
            if !(schema_failure
                && meta(conf).and_then(|m| m.get("disable")) == Some(&Value::Bool(true)))
            {
                return Err(e);
            }
        }
        if let Some(filter) = meta(conf)
            .and_then(|m| m.get("filter"))
            .filter(|f| truthy(Some(f)))
        {
            vars::compile_vars(filter)?;
        }
        Ok(())
    }
}

fn meta(conf: &Value) -> Option<&Map<String, Value>> {
    conf.get("_meta").and_then(Value::as_object)
}

/// The ferrisix extension label [`crate::model::HTTP_VERSION_LABEL`]: `"1.1"` or `"2"`, and
/// only where the scheme can speak it (gRPC is HTTP/2 only; the stream and Kafka schemes are
/// not HTTP).
fn check_http_version(conf: &Value) -> Result<(), String> {
    let label = crate::model::HTTP_VERSION_LABEL;
    let Some(v) = conf.get("labels").and_then(|l| l.get(label)) else {
        return Ok(());
    };
    let scheme = conf.get("scheme").and_then(Value::as_str).unwrap_or("http");
    let allowed: &[&str] = match scheme {
        "http" | "https" => &["1.1", "2"],
        "grpc" | "grpcs" => &["2"],
        _ => &[],
    };
    match v.as_str() {
        Some(s) if allowed.contains(&s) => Ok(()),
        _ if allowed.is_empty() => Err(format!(
            "invalid configuration: label \"{label}\" is not supported with scheme \"{scheme}\""
        )),
        _ => Err(format!(
            "invalid configuration: label \"{label}\" must be one of {} with scheme \"{scheme}\"",
            allowed
                .iter()
                .map(|a| format!("\"{a}\""))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}
