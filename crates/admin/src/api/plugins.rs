//! The endpoints that are not stored resources: `/plugins/list`, `/plugins/<name>`,
//! `/plugins?all=true`, `/plugins/reload`, `/schema/<name>`, `/schema/validate/<resource>` and
//! `/configs/validate`.

use std::collections::HashSet;
use std::fmt::Display;

use ferrisix_config::schema::schema_by_name;
use ferrisix_config::store::StoreError;
use ferrisix_plugins::stream::StreamPlugins;
use ferrisix_plugins::PluginRegistry;
use http::request::Parts;
use http::StatusCode;
use http_body::Body;
use serde_json::{json, Map, Value};

use super::resource::parse_stored;
use super::AdminApi;
use crate::args::Args;
use crate::path;
use crate::resources;
use crate::response::{lua_view, Body as ReplyBody, Reply};

/// APISIX's mark on plugin schemas it injected `_meta` into.
const INJECTED_MARK: &str = "this is a mark for our injected plugin schema";

/// An empty Lua list is encoded as `{}`.
fn lua_list(items: Vec<Value>) -> Value {
    if items.is_empty() {
        Value::Object(Map::new())
    } else {
        Value::Array(items)
    }
}

impl AdminApi {
    /// `GET /apisix/admin/plugins/list[?subsystem=http|stream]`: names by priority, highest
    /// first.
    pub(crate) fn plugin_list(&self, args: &Args) -> Reply {
        let names = match args.get("subsystem") {
            None => self.plugins().list().map(|p| json!(p.name)).collect(),
            Some(a) if a.as_str() == Some("http") => {
                self.plugins().list().map(|p| json!(p.name)).collect()
            }
            Some(a) if a.as_str() == Some("stream") => self
                .options()
                .stream_plugins
                .names()
                .map(|n| json!(n))
                .collect(),
            Some(_) => {
                return Reply::Lua {
                    status: StatusCode::BAD_REQUEST,
                    body: ReplyBody::Text("invalid subsystem passed".to_string()),
                    handler: false,
                };
            }
        };
        Reply::early(StatusCode::OK, lua_list(names))
    }

    /// `GET /apisix/admin/plugins/<name>` (and `?all=true`).
    pub(crate) fn plugin_get(&self, name: Option<&str>, args: &Args) -> Reply {
        let subsystem = match args.get("subsystem") {
            None => "http".to_string(),
            Some(a) => a.as_str().unwrap_or_default().to_string(),
        };
        if subsystem != "http" && subsystem != "stream" {
            return Reply::bad_request(format!("unsupported subsystem: {subsystem}"));
        }
        let registry = self.plugins();
        if args.str("all") == Some("true") {
            tracing::warn!("query parameter \"all\" will be deprecated soon.");
            if args.str("subsystem") == Some("stream") {
                // APISIX loads the stream plugins in the http subsystem too (for the Admin
                // API's checks), whatever `proxy_mode` is: name, priority, schema, version.
                return Reply::json(
                    StatusCode::OK,
                    stream_plugin_catalog(&registry, &self.options().stream_plugins),
                );
            }
            return Reply::json(StatusCode::OK, http_plugin_catalog(&registry));
        }
        if subsystem == "stream" {
            return match name.and_then(|n| self.options().stream_plugins.schema(n)) {
                Some(s) => Reply::json(StatusCode::OK, lua_view(s)),
                None => Reply::error(
                    StatusCode::NOT_FOUND,
                    "plugin not found in subsystem stream".to_string(),
                ),
            };
        }
        let plugin = name.and_then(|n| registry.get(n));
        let Some(plugin) = plugin else {
            return Reply::error(
                StatusCode::NOT_FOUND,
                format!("plugin not found in subsystem {subsystem}"),
            );
        };
        let schema = if args.str("schema_type") == Some("consumer") {
            plugin.consumer_schema.clone()
        } else {
            Some(with_mark(&plugin.schema))
        };
        match schema {
            Some(s) => Reply::json(StatusCode::OK, lua_view(s)),
            None => Reply::bad_request("not found schema"),
        }
    }

    /// `GET /apisix/admin/schema/<name>`.
    pub(crate) fn schema_get(&self, name: Option<&str>) -> Reply {
        let name = name.unwrap_or_default();
        match schema_by_name(name) {
            Some(s) => Reply::json(StatusCode::OK, lua_view(s.clone())),
            None => Reply::bad_request(format!("not found schema: {name}")),
        }
    }

    /// `PUT /apisix/admin/plugins/reload`: reload the plugin list, then rewrite
    /// `<prefix>/plugins`. Like APISIX, a failed write is logged, not answered.
    pub(crate) async fn reload_plugins(&self) -> Reply {
        if let Some(hook) = &self.reload {
            if let Some(registry) = hook() {
                self.set_plugins(registry);
            }
        }
        if let Err(e) = self.write_plugin_list(false).await {
            tracing::error!(error = %e, "failed to set plugins");
        }
        Reply::Lua {
            status: StatusCode::OK,
            body: ReplyBody::Text("done".to_string()),
            handler: false,
        }
    }

    /// Writes the enabled-plugin list to `<prefix>/plugins` (`[{"name": ...}, ...]`) unless it
    /// already holds the same plugins; call it once at start.
    pub async fn publish_plugin_list(&self) -> Result<(), StoreError> {
        self.write_plugin_list(true).await
    }

    async fn write_plugin_list(&self, only_if_changed: bool) -> Result<(), StoreError> {
        let list: Vec<Value> = self
            .plugins()
            .list()
            .map(|p| json!({"name": p.name}))
            .collect();
        let key = format!("{}/plugins", self.prefix());
        let body = serde_json::to_vec(&list).unwrap_or_default();
        if !only_if_changed {
            return self.store.put(&key, body, None).await.map(|_| ());
        }
        match self.store.get(&key).await? {
            None => self.store.put(&key, body, None).await.map(|_| ()),
            Some(kv) => {
                if plugin_set(&parse_stored(&kv.value)) == plugin_set(&Value::Array(list)) {
                    return Ok(());
                }
                // Another node may be writing the same key: only replace what was read.
                match self
                    .store
                    .put_if_unmodified(&key, body, kv.mod_revision, None)
                    .await
                {
                    Ok(_) | Err(StoreError::Conflict) => Ok(()),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// `POST /apisix/admin/schema/validate/<resource>`: 200 with no body, or the schema error
    /// without the `invalid configuration: ` prefix.
    pub(crate) async fn schema_validate<B>(&self, parts: &Parts, uri: &str, body: B) -> Reply
    where
        B: Body,
        B::Error: Display,
    {
        let segs = path::segments(uri);
        let name = segs.get(4).cloned().unwrap_or_default();
        let res = resources::lookup(&name);
        if res.is_none() && name != "schema" && name != "plugins" {
            return Reply::early(
                StatusCode::NOT_FOUND,
                json!({"error_msg": format!("Unsupported resource type: {name}")}),
            );
        }
        let body = match self.read_json(parts, body).await {
            Ok(b) => b,
            Err(r) => return r,
        };
        let checked = match res {
            Some(res) => Self::schema_check(res, body.as_ref()),
            None => Err(format!("not found schema: {name}")),
        };
        match checked {
            Ok(()) => Reply::Lua {
                status: StatusCode::OK,
                body: ReplyBody::Empty,
                handler: false,
            },
            Err(e) => Reply::early(StatusCode::BAD_REQUEST, json!({"error_msg": e})),
        }
    }
}

/// A plugin schema as APISIX serves it: marked as carrying the injected `_meta`.
/// The core schemas by APISIX's `core.schema` names, as the control API's `/v1/schema` lists
/// them under `main` (APISIX's `graphql_cost_decoration` is left out: ferrisix has no such
/// resource).
pub fn core_schema_catalog() -> Value {
    const NAMES: [&str; 13] = [
        "consumer",
        "consumer_group",
        "global_rule",
        "plugin_config",
        "plugins",
        "proto",
        "route",
        "service",
        "ssl",
        "stream_route",
        "upstream",
        "upstream_hash_header_schema",
        "upstream_hash_vars_schema",
    ];
    let mut main = Map::new();
    for name in NAMES {
        if let Some(s) = schema_by_name(name) {
            main.insert(name.to_owned(), lua_view(s.clone()));
        }
    }
    Value::Object(main)
}

/// Every enabled HTTP plugin by name with its version, priority, schemas, scope and type, as
/// APISIX's `plugin.get_all` reports them (`GET /apisix/admin/plugins?all=true`, the control
/// API's `/v1/schema`).
pub fn http_plugin_catalog(registry: &PluginRegistry) -> Value {
    let mut all = Map::new();
    for p in registry.list() {
        let mut info = Map::new();
        info.insert("version".into(), json!(p.version));
        info.insert("priority".into(), json!(p.priority));
        info.insert("schema".into(), with_mark(&p.schema));
        if let Some(s) = &p.metadata_schema {
            info.insert("metadata_schema".into(), s.clone());
        }
        if let Some(s) = &p.consumer_schema {
            info.insert("consumer_schema".into(), s.clone());
        }
        if let Some(scope) = p.scope {
            info.insert("scope".into(), json!(scope));
        }
        if let Some(kind) = p.plugin_type {
            info.insert("type".into(), json!(kind));
        }
        all.insert(p.name.to_string(), lua_view(Value::Object(info)));
    }
    Value::Object(all)
}

/// [`http_plugin_catalog`] for the stream plugins.
pub fn stream_plugin_catalog(registry: &PluginRegistry, stream: &StreamPlugins) -> Value {
    let mut all = Map::new();
    for name in stream.names() {
        let mut info = Map::new();
        let version = registry.get(name).map_or(json!(0.1), |p| json!(p.version));
        info.insert("version".into(), version);
        if let Some(priority) = stream.priority(name) {
            info.insert("priority".into(), json!(priority));
        }
        if let Some(schema) = stream.schema(name) {
            info.insert("schema".into(), with_mark(&schema));
        }
        all.insert(name.to_string(), lua_view(Value::Object(info)));
    }
    Value::Object(all)
}

fn with_mark(schema: &Value) -> Value {
    let mut s = schema.clone();
    if let Value::Object(m) = &mut s {
        m.entry("$comment").or_insert_with(|| json!(INJECTED_MARK));
    }
    s
}

/// The plugins named in a stored `/plugins` list, with their `stream` flags.
fn plugin_set(v: &Value) -> HashSet<(String, bool)> {
    v.as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|p| {
                    let name = p.get("name")?.as_str()?.to_string();
                    Some((name, p.get("stream") == Some(&Value::Bool(true))))
                })
                .collect()
        })
        .unwrap_or_default()
}
