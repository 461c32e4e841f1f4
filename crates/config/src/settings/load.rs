//! Loading `config.yaml` into [`Settings`].
//!
//! Loading parses the YAML, substitutes `${{VAR}}` / `${{VAR:=default}}` in string values (as
//! APISIX does after parsing, turning numeric and boolean results into numbers and booleans),
//! then deserializes into [`Settings`]. A value of the wrong type is refused with its dotted path
//! (`apisix.node_listen[1]: ...`); every such error is collected, not just the first. Keys that
//! APISIX knows but ferrisix does not act on, and plain typos, are not errors: each is returned
//! as a warning naming its path so the caller can log it. Everything absent takes APISIX's
//! default, so an empty file is a complete configuration. Checks across keys (listeners, admin
//! keys, metric labels) run once the typed pass is done.

use std::path::{Path, PathBuf};

use super::{
    loopback_admin_net, DataPlaneProvider, MetricAttr, PrometheusMetrics, Role, Settings,
    UpstreamStatusAttr, BANDWIDTH_LABELS, HTTP_LATENCY_LABELS, HTTP_STATUS_LABELS,
};
use crate::env;

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
        apply_stream_proxy_protocol_defaults(&mut settings);
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

/// A `stream_proxy.tcp` entry without its own `proxy_protocol` / `proxy_protocol_to_upstream`
/// takes `apisix.proxy_protocol.enable_tcp_pp` / `enable_tcp_pp_to_upstream` (APISIX's
/// `apisix/cli/ops.lua`). UDP ports never read or send the PROXY protocol.
fn apply_stream_proxy_protocol_defaults(settings: &mut Settings) {
    let pp = settings.apisix.proxy_protocol;
    for l in &mut settings.apisix.stream_proxy.tcp {
        l.proxy_protocol.get_or_insert(pp.enable_tcp_pp);
        l.proxy_protocol_to_upstream
            .get_or_insert(pp.enable_tcp_pp_to_upstream);
    }
    for l in &mut settings.apisix.stream_proxy.udp {
        l.proxy_protocol = Some(false);
        l.proxy_protocol_to_upstream = Some(false);
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
    check_wasm(s, errors);
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
    super::discovery::check(&s.discovery, errors);
    if let Some(pc) = &s.apisix.proxy_cache {
        for (i, z) in pc.zones.iter().enumerate() {
            if let Some(levels) = &z.cache_levels {
                if crate::settings::cache_levels(levels).is_none() {
                    errors.push(format!(
                        "apisix.proxy_cache.zones[{i}].cache_levels: invalid value: string \
                         {levels:?}, expected 1 to 3 levels of 1 or 2 characters, as \"1:2\""
                    ));
                }
            }
        }
    }
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
/// `wasm.plugins`: APISIX's schema (a name and a file each), names unique; ferrisix's limits.
fn check_wasm(s: &Settings, errors: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    for (i, p) in s.wasm.plugins.iter().enumerate() {
        if p.name.is_empty() {
            errors.push(format!(
                "wasm.plugins[{i}].name: expected a non-empty string"
            ));
        } else if !seen.insert(p.name.as_str()) {
            errors.push(format!(
                "wasm.plugins[{i}].name: duplicate plugin {:?}",
                p.name
            ));
        }
        if p.file.as_os_str().is_empty() {
            errors.push(format!(
                "wasm.plugins[{i}].file: expected a non-empty string"
            ));
        }
    }
    let limits = &s.ferrisix.wasm;
    if limits.timeout.is_zero() {
        errors.push("ferrisix.wasm.timeout: invalid value: 0, expected more than 0".into());
    }
    if limits.max_memory < 65536 {
        errors.push(format!(
            "ferrisix.wasm.max_memory: invalid value: {}, expected at least 65536 (one page)",
            limits.max_memory
        ));
    }
}

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
