//! Write validation (`check_conf` and each resource's checker) and the reference checks that
//! guard deletes, reading other resources from the store.

use std::collections::HashMap;
use std::sync::Arc;

use ferrisix_config::model::ResourceKind;
use ferrisix_config::schema::{self, schema_by_name};
use ferrisix_config::validate::{
    check_forbidden_properties, check_global_rule_conflicts, check_plugins, check_resource,
    check_resource_with_keyring, missing_reference_message, references, PluginCheck,
    ReferenceLookup,
};
use ferrisix_plugins::{PluginKind, PluginRegistry};
use serde_json::Value;

use super::resource::{id_text, parse_stored, truthy};
use super::{AdminApi, Call};
use crate::resources::{Checker, DeleteCheck, Resource};
use crate::response::Reply;

/// The referenced resources, read before validation (the validator's lookup is synchronous).
#[derive(Default)]
struct Prefetched {
    found: HashMap<(ResourceKind, String), Arc<Value>>,
    /// Keys the store failed to read, with its error.
    failed: HashMap<(ResourceKind, String), String>,
}

impl ReferenceLookup for Prefetched {
    fn lookup(&self, kind: ResourceKind, id: &str) -> Option<Arc<Value>> {
        self.found.get(&(kind, id.to_string())).cloned()
    }
}

impl Prefetched {
    /// A missing-reference message for a key the store could not read becomes APISIX's
    /// `failed to fetch ... id [x]: <error>`.
    fn explain(&self, message: String) -> String {
        for ((kind, id), err) in &self.failed {
            let missing = missing_reference_message(*kind, id);
            if message == missing {
                let head = missing.trim_end_matches(", response code: 404");
                return format!("{head}: {err}");
            }
        }
        message
    }
}

fn invalid(e: impl std::fmt::Display) -> String {
    format!("invalid configuration: {e}")
}

fn core_schema(name: &str, conf: &Value) -> Result<(), String> {
    match schema_by_name(name) {
        Some(s) => schema::validate(s, conf).map_err(invalid),
        None => Ok(()),
    }
}

/// A credential carries only plugins of `auth` type, as each plugin's definition says
/// (`PluginDef.kind`). Names the registry does not know are refused too (the plugin check
/// before this one reports them first).
fn only_auth_plugins<'a>(
    names: impl IntoIterator<Item = &'a String>,
    plugins: &PluginRegistry,
) -> Result<(), String> {
    let auth = |name: &str| {
        plugins
            .get(name)
            .is_some_and(|p| p.def.kind == PluginKind::Auth)
    };
    if names.into_iter().all(|name| auth(name)) {
        Ok(())
    } else {
        Err("only supports auth type plugins in consumer credential".to_string())
    }
}

impl AdminApi {
    /// APISIX's `resource:check_conf`: the id rules, the forbidden bookkeeping fields, then the
    /// resource's checker on a copy. Returns the id the etcd key uses.
    pub(crate) async fn check_conf(
        &self,
        call: &Call,
        path_id: Option<&str>,
        conf: Option<&mut Value>,
        need_id: bool,
        typ: Option<&str>,
        allow_time: bool,
    ) -> Result<String, Reply> {
        let res = call.res;
        let Some(conf) = conf else {
            return Err(Reply::bad_request("missing configurations"));
        };
        let mut id: Option<Value> = path_id.map(|s| Value::String(s.to_string()));
        if res.name == "secrets" {
            match (typ, path_id) {
                (Some(t), Some(i)) => id = Some(Value::String(format!("{t}/{i}"))),
                _ => return Err(Reply::bad_request(format!("missing {} id", res.kind))),
            }
        }
        if res.needs_id {
            let body_id = conf.get("id").filter(|v| truthy(Some(v))).cloned();
            if id.is_none() {
                id = body_id.clone();
            }
            if need_id && id.is_none() {
                return Err(Reply::bad_request(format!("missing {} id", res.kind)));
            }
            if !need_id && id.is_some() {
                return Err(Reply::bad_request(format!(
                    "wrong {} id, do not need it",
                    res.kind
                )));
            }
            if let (true, Some(body_id), Some(id)) = (need_id, &body_id, &id) {
                // Compared as Lua strings: `1` equals `"1"`.
                if id_text(body_id) != id_text(id) {
                    return Err(Reply::bad_request(format!("wrong {} id", res.kind)));
                }
            }
            if let Value::Object(m) = conf {
                match &id {
                    Some(v) => {
                        m.insert("id".to_string(), v.clone());
                    }
                    None => {
                        m.shift_remove("id");
                    }
                }
            }
        }
        if !allow_time {
            check_forbidden_properties(conf).map_err(|e| Reply::bad_request(e.message))?;
        }
        self.check_resource(res, id.as_ref(), conf, typ, true)
            .await?;
        match res.name {
            "consumers" => {
                let username = conf.get("username").map(id_text).unwrap_or_default();
                self.check_duplicate_key(conf.get("plugins"), &username, None)?;
            }
            "credentials" => {
                let username = call.sub.first().map_or("", String::as_str);
                let cred = id.as_ref().map(id_text);
                self.check_duplicate_key(conf.get("plugins"), username, cred.as_deref())?;
            }
            _ => {}
        }

        Ok(match res.name {
            "consumers" => conf.get("username").map(id_text).unwrap_or_default(),
            _ => id.as_ref().map(id_text).unwrap_or_default(),
        })
    }

    /// The resource's own checker (APISIX's `check_conf` of each `apisix/admin/*.lua`).
    /// Without `with_refs` the lookups of other stored resources are skipped (APISIX's
    /// `skip_references_check`).
    pub(crate) async fn check_resource(
        &self,
        res: &Resource,
        id: Option<&Value>,
        conf: &Value,
        typ: Option<&str>,
        with_refs: bool,
    ) -> Result<(), Reply> {
        let plugins = self.plugins();
        let bad = |m: String| Err(Reply::bad_request(m));
        match res.checker {
            Checker::Core(ResourceKind::Consumers) => {
                let schema = schema::resource_schema(ResourceKind::Consumers);
                if let Err(e) = schema::validate(schema, conf) {
                    return bad(invalid(e));
                }
                if let Some(username) = id {
                    if conf.get("username") != Some(username) {
                        return bad("wrong username".to_string());
                    }
                }
                if let Err(e) = check_resource(ResourceKind::Consumers, conf, &plugins) {
                    return bad(e.message);
                }
                if let Some(group) = conf
                    .get("group_id")
                    .filter(|v| with_refs && truthy(Some(v)))
                {
                    let group = id_text(group);
                    let key = format!("{}/consumer_groups/{group}", self.prefix());
                    match self.store.get(&key).await {
                        Ok(Some(_)) => {}
                        Ok(None) => {
                            return bad(format!(
                                "failed to fetch consumer group info by consumer group id [{group}], response code: 404"
                            ));
                        }
                        Err(e) => {
                            return bad(format!(
                                "failed to fetch consumer group info by consumer group id [{group}]: {e}"
                            ));
                        }
                    }
                }
                Ok(())
            }
            Checker::Core(ResourceKind::PluginMetadata) => {
                let Some(name) = id.map(id_text) else {
                    return bad("missing plugin name".to_string());
                };
                // Checked without the `id` the Admin API adds afterwards.
                match plugins.check_metadata(&name, conf) {
                    Ok(()) => Ok(()),
                    Err(e) => bad(e),
                }
            }
            Checker::Core(kind) => {
                // ocsp-stapling adds `ocsp_stapling` to the ssl schema when it is enabled;
                // without it the field is one the schema does not have.
                if kind == ResourceKind::Ssls
                    && conf.get("ocsp_stapling").is_some()
                    && plugins.get("ocsp-stapling").is_none()
                {
                    return bad(invalid(
                        "additional properties forbidden, found ocsp_stapling".to_string(),
                    ));
                }
                // Private keys that are not PEM are decrypted with the keyring and parsed, as
                // APISIX's `validate` does.
                let keyring = &self.options().keyring;
                if with_refs {
                    let refs = self.prefetch(kind, conf).await;
                    if let Err(e) = check_resource_with_keyring(
                        kind,
                        conf,
                        &plugins,
                        Some(&refs as &dyn ReferenceLookup),
                        keyring,
                    ) {
                        return bad(refs.explain(e.message));
                    }
                } else if let Err(e) =
                    check_resource_with_keyring(kind, conf, &plugins, None, keyring)
                {
                    return bad(e.message);
                }
                if kind == ResourceKind::GlobalRules {
                    // APISIX skips the check when the rules cannot be read.
                    let others = self.list_dir("global_rules").await.unwrap_or_default();
                    let id = id.map(id_text).unwrap_or_default();
                    if let Err(e) =
                        check_global_rule_conflicts(&id, conf, others.iter().map(|(_, v)| v))
                    {
                        return bad(e.message);
                    }
                }
                Ok(())
            }
            Checker::Credential => {
                core_schema("credential", conf).or_else(bad)?;
                if let Some(p) = conf.get("plugins").filter(|p| truthy(Some(p))) {
                    if let Err(e) = check_plugins(p, true, &plugins) {
                        return bad(format!("invalid plugins configuration: {}", e.message));
                    }
                    if let Value::Object(p) = p {
                        if let Err(e) = only_auth_plugins(p.keys(), &plugins) {
                            return bad(e);
                        }
                    }
                }
                Ok(())
            }
            Checker::ConsumerGroup => {
                core_schema("consumer_group", conf).or_else(bad)?;
                if let Some(p) = conf.get("plugins") {
                    if let Err(e) = check_plugins(p, false, &plugins) {
                        return bad(e.message);
                    }
                }
                Ok(())
            }
            Checker::Proto => {
                core_schema("proto", conf).or_else(bad)?;
                // APISIX compiles the content: a syntax error is refused with the compiler's
                // message. An import naming a proto not written yet is accepted; the data
                // plane holds that proto back until the import exists.
                let content = conf
                    .get("content")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let pid = id.map_or_else(|| "proto".to_owned(), id_text);
                ferrisix_config::proto::check(&pid, content)
                    .map_err(|e| format!("invalid content: {e}"))
                    .or_else(bad)
            }
            Checker::Secret => {
                let manager = typ.unwrap_or_default();
                let Some(schema) = ferrisix_config::secret::manager_schema(manager) else {
                    return bad(format!("invalid secret manager: {manager}"));
                };
                schema::validate(schema, conf).map_err(invalid).or_else(bad)
            }
            Checker::StreamRoute if with_refs => {
                self.check_stream_route(id, conf).await.or_else(bad)
            }
            Checker::StreamRoute => core_schema("stream_route", conf).or_else(bad),
        }
    }

    async fn check_stream_route(&self, id: Option<&Value>, conf: &Value) -> Result<(), String> {
        core_schema("stream_route", conf)?;
        for (field, dir, what) in [
            ("upstream_id", "upstreams", "upstream"),
            ("service_id", "services", "service"),
        ] {
            let Some(target) = conf.get(field).filter(|v| truthy(Some(v))) else {
                continue;
            };
            let target = id_text(target);
            match self
                .store
                .get(&format!("{}/{dir}/{target}", self.prefix()))
                .await
            {
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err(format!(
                        "failed to fetch {what} info by {what} id [{target}], response code: 404"
                    ));
                }
                Err(e) => {
                    return Err(format!(
                        "failed to fetch {what} info by {what} id [{target}]: {e}"
                    ))
                }
            }
        }
        let protocol = conf.get("protocol");
        if let Some(superior) = protocol
            .and_then(|p| p.get("superior_id"))
            .filter(|v| truthy(Some(v)))
        {
            let superior = id_text(superior);
            if id.map(id_text).as_deref() == Some(superior.as_str()) {
                return Err("stream route can not set itself as superior_id".to_string());
            }
            let key = format!("{}/stream_routes/{superior}", self.prefix());
            let stored = match self.store.get(&key).await {
                Ok(Some(kv)) => parse_stored(&kv.value),
                Ok(None) => {
                    return Err(format!(
                        "failed to fetch stream routes[{superior}], response code: 404"
                    ));
                }
                Err(e) => return Err(format!("failed to fetch stream routes[{superior}]: {e}")),
            };
            let theirs = stored.get("protocol").and_then(|p| p.get("name"));
            let ours = protocol.and_then(|p| p.get("name"));
            if let (Some(theirs), Some(ours)) = (theirs, ours) {
                if theirs != ours {
                    return Err(format!(
                        "protocol mismatch: subordinate protocol [{}] does not match superior protocol [{}]",
                        id_text(ours),
                        id_text(theirs)
                    ));
                }
            }
        }
        // apisix/stream/router/ip_port.lua stream_route_checker().
        if let Some(plugins) = conf.get("plugins") {
            self.options.stream_plugins.check(plugins)?;
        }
        for field in ["remote_addr", "server_addr"] {
            if let Some(addr) = conf.get(field).and_then(Value::as_str) {
                let ok = addr.parse::<std::net::IpAddr>().is_ok()
                    || addr.parse::<ipnet::IpNet>().is_ok();
                if !ok {
                    return Err(format!("invalid {field}: {addr}"));
                }
            }
        }
        // apisix/stream/xrpc.lua check_schema(): the name among `xrpc.protocols`, then the
        // protocol's own `conf` schema.
        if let Some(protocol) = protocol {
            self.options.xrpc.check(protocol)?;
        }
        Ok(())
    }

    /// Reads every resource `value` points at.
    async fn prefetch(&self, kind: ResourceKind, value: &Value) -> Prefetched {
        let mut out = Prefetched::default();
        for (target, id) in references(kind, value) {
            let key = format!("{}/{}/{id}", self.prefix(), target.dir());
            match self.store.get(&key).await {
                Ok(Some(kv)) => {
                    out.found
                        .insert((target, id), Arc::new(parse_stored(&kv.value)));
                }
                Ok(None) => {}
                Err(e) => {
                    out.failed.insert((target, id), e.to_string());
                }
            }
        }
        out
    }

    /// The items directly under `<prefix>/<dir>/`, as (id from the key, value), in key order.
    pub(crate) async fn list_dir(&self, dir: &str) -> Result<Vec<(String, Value)>, Reply> {
        let prefix = format!("{}/{dir}/", self.prefix());
        let (kvs, _) = self
            .store
            .list(&prefix)
            .await
            .map_err(|e| Reply::unavailable(e.to_string()))?;
        Ok(kvs
            .into_iter()
            .filter_map(|kv| {
                let id = kv.key[prefix.len()..].to_string();
                if id.is_empty() || id.contains('/') {
                    return None;
                }
                let value = parse_stored(&kv.value);
                value.is_object().then_some((id, value))
            })
            .collect())
    }

    /// Refuses deleting a resource that others still use (each resource's `delete_checker`).
    pub(crate) async fn delete_check(&self, check: DeleteCheck, id: &str) -> Result<(), Reply> {
        let refuse = |m: String| Err(Reply::bad_request(m));
        let same = |v: Option<&Value>| {
            v.filter(|v| truthy(Some(v)))
                .is_some_and(|v| id_text(v) == id)
        };
        match check {
            DeleteCheck::Upstream => {
                for (label, dir, only_plugins) in [
                    ("route", "routes", false),
                    ("service", "services", false),
                    ("plugin_config", "plugin_configs", true),
                    ("consumer", "consumers", true),
                    ("consumer_group", "consumer_groups", true),
                    ("global_rules", "global_rules", true),
                ] {
                    for (item_id, value) in self.list_dir(dir).await? {
                        if traffic_split_uses(value.get("plugins"), id) {
                            return refuse(format!(
                                "can not delete this upstream, plugin in {label} [{item_id}] is still using it now"
                            ));
                        }
                        if !only_plugins && same(value.get("upstream_id")) {
                            return refuse(format!(
                                "can not delete this upstream, {label} [{item_id}] is still using it now"
                            ));
                        }
                    }
                }
            }
            DeleteCheck::Service => {
                let mut sources = vec![("route", "routes")];
                if self.options.stream_mode {
                    sources.push(("stream_route", "stream_routes"));
                }
                for (label, dir) in sources {
                    for (item_id, value) in self.list_dir(dir).await? {
                        if same(value.get("service_id")) {
                            return refuse(format!(
                                "can not delete this service directly, {label} [{item_id}] is still using it now"
                            ));
                        }
                    }
                }
            }
            DeleteCheck::PluginConfig => {
                for (item_id, value) in self.list_dir("routes").await? {
                    if same(value.get("plugin_config_id")) {
                        return refuse(format!(
                            "can not delete this plugin config, route [{item_id}] is still using it now"
                        ));
                    }
                }
            }
            DeleteCheck::ConsumerGroup => {
                for (item_id, value) in self.list_dir("consumers").await? {
                    if same(value.get("group_id")) {
                        return refuse(format!(
                            "can not delete this consumer group, consumer [{item_id}] is still using it now"
                        ));
                    }
                }
            }
            DeleteCheck::Proto => {
                for (label, dir) in [("route", "routes"), ("service", "services")] {
                    for (item_id, value) in self.list_dir(dir).await? {
                        let proto = value
                            .get("plugins")
                            .and_then(|p| p.get("grpc-transcode"))
                            .and_then(|g| g.get("proto_id"));
                        if same(proto) {
                            return refuse(format!(
                                "can not delete this proto, {label} [{item_id}] is still using it now"
                            ));
                        }
                    }
                }
            }
            DeleteCheck::StreamRoute => {
                for (item_id, value) in self.list_dir("stream_routes").await? {
                    let superior = value.get("protocol").and_then(|p| p.get("superior_id"));
                    if superior.is_some_and(|s| id_text(s) == id) {
                        let shown = value.get("id").map(id_text).unwrap_or(item_id);
                        return refuse(format!(
                            "can not delete this stream route directly, stream route [{shown}] is still using it as superior_id"
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// `POST /apisix/admin/schema/validate/<resource>`: the core schema only.
    pub(crate) fn schema_check(res: &Resource, body: Option<&Value>) -> Result<(), String> {
        let schema = match res.name {
            "plugin_metadata" => schema::resource_schema(ResourceKind::PluginMetadata),
            _ => match res.schema_name().and_then(schema_by_name) {
                Some(s) => s,
                None => return Err(format!("not found schema: {}", res.name)),
            },
        };
        let Some(body) = body else {
            // Lua sees no body as `nil`.
            return Err("wrong type: expected object, got nil".to_string());
        };
        schema::validate(schema, body)
    }
}

/// A `traffic-split` rule names `up_id` in one of its weighted upstreams.
fn traffic_split_uses(plugins: Option<&Value>, up_id: &str) -> bool {
    let Some(rules) = plugins
        .and_then(|p| p.get("traffic-split"))
        .and_then(|t| t.get("rules"))
        .and_then(Value::as_array)
    else {
        return false;
    };
    rules.iter().any(|rule| {
        rule.get("weighted_upstreams")
            .and_then(Value::as_array)
            .is_some_and(|ups| {
                ups.iter().any(|u| {
                    u.get("upstream_id")
                        .filter(|v| truthy(Some(v)))
                        .is_some_and(|v| id_text(v) == up_id)
                })
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_take_the_plugins_of_auth_kind() {
        let plugins = PluginRegistry::builtin();
        let (auth, other): (Vec<_>, Vec<_>) = plugins
            .list()
            .map(|p| (p.name.to_string(), p.def.kind))
            .partition(|(_, kind)| *kind == PluginKind::Auth);
        assert!(auth.iter().any(|(n, _)| n == "key-auth"), "{auth:?}");
        for (name, _) in &auth {
            assert_eq!(only_auth_plugins([name], &plugins), Ok(()), "{name}");
        }
        let refused = Err("only supports auth type plugins in consumer credential".to_string());
        assert!(other.iter().any(|(n, _)| n == "forward-auth"), "{other:?}");
        for (name, _) in &other {
            assert_eq!(only_auth_plugins([name], &plugins), refused, "{name}");
        }
        // One plugin of another kind among auth ones is enough to refuse.
        let mixed = ["key-auth".to_string(), "prometheus".to_string()];
        assert_eq!(only_auth_plugins(&mixed, &plugins), refused);
    }
}
