//! `/apisix/admin/configs`: whole standalone documents.
//!
//! `POST /apisix/admin/configs/validate` (APISIX 3.15+, every mode) checks a document without
//! storing it. In API-driven standalone mode (`config_provider: yaml` with the traditional
//! role) the Admin API serves nothing else but `GET`, `PUT` and `HEAD /apisix/admin/configs`
//! (APISIX's `admin/standalone.lua`): `PUT` checks the document as a whole, as
//! `config_validate.lua` does, and hands it to the [`StandaloneApiStore`], which applies it
//! with the digest and version rules; `GET` returns the loaded document, `HEAD` its digest and
//! time. Every other path answers nginx's 404 page.

use std::collections::HashSet;
use std::fmt::Display;
use std::net::IpAddr;

use bytes::Bytes;
use ferrisix_config::schema::lua;
use ferrisix_config::store::standalone_api::{Replaced, DIGEST, LAST_MODIFIED};
use http::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE};
use http::request::Parts;
use http::{Method, StatusCode};
use http_body::Body;
use serde_json::{json, Map, Value};

use super::resource::id_text;
use super::{AdminApi, PREFIX};
use crate::body::read_limited;
use crate::resources;
use crate::response::{Body as ReplyBody, Reply};
use ferrisix_config::schema::cjson;

/// The resource sections of a standalone document, as APISIX lists its etcd directories.
const CONFIG_SECTIONS: [&str; 13] = [
    "upstreams",
    "plugins",
    "ssls",
    "stream_routes",
    "plugin_metadata",
    "routes",
    "services",
    "consumers",
    "global_rules",
    "protos",
    "plugin_configs",
    "consumer_groups",
    "secrets",
];

/// The sections whose schema API-driven standalone mode extends with an integer
/// `modifiedIndex` (APISIX's `standalone.lua` `patch_schema`); consumers' credential items
/// too.
const WITH_MODIFIED_INDEX: [&str; 10] = [
    "protos",
    "global_rules",
    "routes",
    "stream_routes",
    "services",
    "upstreams",
    "consumers",
    "consumer_groups",
    "ssls",
    "plugin_configs",
];

/// The largest `PUT /apisix/admin/configs` body. APISIX reads it without a limit of its own
/// (nginx's `client_max_body_size` is 0 by default); a whole configuration of 100,000 routes
/// is tens of MiB, so this bounds memory without refusing real ones.
pub const CONFIGS_MAX_BODY: usize = 256 * 1024 * 1024;

/// The outcome of checking a document.
enum Checked {
    Valid,
    /// The first error (`PUT`): APISIX's `error_msg`.
    First(String),
    /// Every error (`validate`): APISIX's `errors` entries.
    All(Vec<Value>),
}

impl AdminApi {
    /// The standalone router (`apisix/admin/init.lua`'s `standalone_uri_route`).
    pub(crate) async fn dispatch_standalone<B>(
        &self,
        parts: &Parts,
        uri: &str,
        body: B,
        peer: IpAddr,
    ) -> Reply
    where
        B: Body,
        B::Error: Display,
    {
        let method = &parts.method;
        if uri == PREFIX && method == Method::HEAD {
            return Reply::Lua {
                status: StatusCode::OK,
                body: ReplyBody::Empty,
                handler: false,
            };
        }
        let configs = uri == "/apisix/admin/configs"
            && matches!(*method, Method::GET | Method::PUT | Method::HEAD);
        let validate = uri == "/apisix/admin/configs/validate" && method == Method::POST;
        if !configs && !validate {
            return Reply::Page(StatusCode::NOT_FOUND);
        }
        if let Err(r) = self.auth(parts, peer) {
            return r;
        }
        match *method {
            Method::POST => self.validate_configs(parts, body).await,
            Method::PUT => self.configs_put(parts, body).await,
            Method::HEAD => self.configs_head(),
            _ => self.configs_get(parts),
        }
    }

    /// `PUT /apisix/admin/configs`: APISIX's `standalone.lua` `update()`.
    async fn configs_put<B>(&self, parts: &Parts, body: B) -> Reply
    where
        B: Body,
        B::Error: Display,
    {
        let Some(store) = self.standalone.clone() else {
            return Reply::Page(StatusCode::NOT_FOUND);
        };
        let Some(digest) = parts.headers.get(DIGEST) else {
            return Reply::early(
                StatusCode::BAD_REQUEST,
                json!({"error_msg": "missing digest header"}),
            );
        };
        let digest = String::from_utf8_lossy(digest.as_bytes()).into_owned();
        let data = match self.read_document(parts, body, CONFIGS_MAX_BODY).await {
            Ok(d) => d,
            Err(r) => return r,
        };
        // The digest is compared before anything is checked: a client that sends what is
        // loaded again gets 204 whatever the body holds.
        if store.digest().as_deref() == Some(digest.as_str()) {
            return no_content();
        }
        // Without collecting, only the first error comes back.
        if let Checked::First(msg) = self.check_document(&data, false).await {
            return Reply::early(StatusCode::BAD_REQUEST, json!({"error_msg": msg}));
        }
        let empty = Map::new();
        let object = data.as_object().unwrap_or(&empty);
        match store.replace(object, &digest, now_epoch()) {
            Ok(Replaced::SameDigest) => no_content(),
            Ok(Replaced::Applied { last_modified }) => {
                tracing::info!(digest = %digest, "standalone configuration applied");
                Reply::Custom {
                    status: StatusCode::ACCEPTED,
                    body: Bytes::new(),
                    content_type: "application/json",
                    headers: vec![(LAST_MODIFIED, last_modified.to_string()), (DIGEST, digest)],
                }
            }
            Err(msg) => Reply::early(StatusCode::BAD_REQUEST, json!({"error_msg": msg})),
        }
    }

    /// `GET /apisix/admin/configs`: the loaded document, as JSON or (with
    /// `Accept: application/yaml`) YAML.
    fn configs_get(&self, parts: &Parts) -> Reply {
        let Some(store) = self.standalone.as_ref() else {
            return Reply::Page(StatusCode::NOT_FOUND);
        };
        let text = store.document_json();
        let yaml = parts
            .headers
            .get(ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.starts_with("application/yaml"));
        let (body, content_type) = if yaml {
            let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            match serde_yaml::to_string(&value) {
                Ok(y) => (Bytes::from(y), "application/yaml"),
                Err(e) => {
                    return Reply::early(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        json!({"error_msg": format!("failed to encode yaml: {e}")}),
                    )
                }
            }
        } else {
            (Bytes::from(text), "application/json")
        };
        Reply::Custom {
            status: StatusCode::OK,
            body,
            content_type,
            headers: metadata_headers(store),
        }
    }

    /// `HEAD /apisix/admin/configs`: the digest and time of the loaded document.
    fn configs_head(&self) -> Reply {
        let Some(store) = self.standalone.as_ref() else {
            return Reply::Page(StatusCode::NOT_FOUND);
        };
        Reply::Custom {
            status: StatusCode::OK,
            body: Bytes::new(),
            content_type: "application/json",
            headers: metadata_headers(store),
        }
    }

    /// `POST /apisix/admin/configs/validate` (3.15+): checks a whole standalone-style document
    /// (JSON, or YAML with `Content-Type: application/yaml`) without storing anything.
    pub(crate) async fn validate_configs<B>(&self, parts: &Parts, body: B) -> Reply
    where
        B: Body,
        B::Error: Display,
    {
        let data = match self
            .read_document(parts, body, self.options.body_limit)
            .await
        {
            Ok(d) => d,
            Err(r) => return r,
        };
        match self.check_document(&data, true).await {
            Checked::All(errors) if !errors.is_empty() => Reply::early(
                StatusCode::BAD_REQUEST,
                json!({"error_msg": "Configuration validation failed", "errors": errors}),
            ),
            Checked::First(msg) => Reply::early(
                StatusCode::BAD_REQUEST,
                json!({"error_msg": "Configuration validation failed", "errors": [{"error": msg}]}),
            ),
            _ => Reply::early(StatusCode::OK, json!({})),
        }
    }

    /// Reads a document: `invalid request body: ...` for an empty or unreadable one.
    async fn read_document<B>(&self, parts: &Parts, body: B, limit: usize) -> Result<Value, Reply>
    where
        B: Body,
        B::Error: Display,
    {
        let refuse = |msg: String| {
            Reply::early(
                StatusCode::BAD_REQUEST,
                json!({"error_msg": format!("invalid request body: {msg}")}),
            )
        };
        let declared = parts
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let bytes = read_limited(body, declared, limit)
            .await
            .map_err(|e| refuse(e.message(limit)))?;
        if bytes.is_empty() {
            return Err(refuse("empty request body".to_string()));
        }
        let yaml = parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("application/yaml"));
        let data = if yaml {
            match ferrisix_config::nesting::check_yaml_depth(&String::from_utf8_lossy(&bytes))
                .ok()
                .and_then(|()| serde_yaml::from_slice::<Value>(&bytes).ok())
            {
                Some(v @ (Value::Object(_) | Value::Array(_))) => v,
                _ => return Err(refuse("invalid yaml request body".to_string())),
            }
        } else {
            cjson::decode(&bytes).map_err(refuse)?
        };
        match data {
            // A Lua table either way; a list holds no resource type.
            Value::Object(_) => Ok(data),
            Value::Array(_) => Ok(Value::Object(Map::new())),
            other => Err(refuse(format!(
                "the configuration must be an object, got {}",
                lua::type_name(&other)
            ))),
        }
    }

    /// `config_validate.lua`'s `validate_configuration`: each section's version must be a
    /// number, each item pass its resource's check (references to other resources are not
    /// looked up), and ids (consumers: usernames, credential ids) be unique per section.
    async fn check_document(&self, data: &Value, collect_all: bool) -> Checked {
        let standalone = self.standalone.is_some();
        let mut errors: Vec<Value> = Vec::new();
        for section in CONFIG_SECTIONS {
            let version_key = format!("{section}_conf_version");
            if let Some(v) = data.get(&version_key) {
                if !v.is_number() && *v != Value::Bool(false) {
                    if !collect_all {
                        return Checked::First(format!("{version_key} must be a number"));
                    }
                    errors.push(json!({
                        "resource_type": section,
                        "error": format!("{version_key} must be a number, got {}", lua::type_name(v)),
                    }));
                }
            }
            let Some(Value::Array(items)) = data.get(section) else {
                continue;
            };
            let mut seen: HashSet<String> = HashSet::new();
            for (index, item) in items.iter().enumerate() {
                let shown_id = item
                    .get("id")
                    .or_else(|| item.get("username"))
                    .map_or_else(|| json!(""), Value::clone);
                let checked = match strip_modified_index(section, item, standalone) {
                    Ok(item) => self.check_item(section, &item).await,
                    Err(e) => Err(e),
                };
                if let Err(message) = checked {
                    if !collect_all {
                        return Checked::First(message);
                    }
                    errors.push(json!({
                        "resource_type": section,
                        "resource_id": shown_id,
                        "index": index,
                        "error": message,
                    }));
                }
                let (identifier, what) = if section == "consumers" {
                    match item.get("id").filter(|v| !v.is_null()) {
                        Some(id) => (Some(id), "credential id"),
                        None => (item.get("username"), "username"),
                    }
                } else {
                    (item.get("id"), "id")
                };
                if let Some(identifier) = identifier.filter(|v| !v.is_null()) {
                    let text = id_text(identifier);
                    if !seen.insert(text.clone()) {
                        let message = format!("found duplicate {what} {text} in {section}");
                        if !collect_all {
                            return Checked::First(message);
                        }
                        errors.push(json!({
                            "resource_type": section,
                            "resource_id": shown_id,
                            "index": index,
                            "error": message,
                        }));
                    }
                }
            }
        }
        if errors.is_empty() {
            Checked::Valid
        } else {
            Checked::All(errors)
        }
    }

    /// One item of a standalone document, checked as its resource's checker does with the
    /// reference lookups skipped.
    async fn check_item(&self, section: &str, item: &Value) -> Result<(), String> {
        let Some(mut res) = resources::lookup(section) else {
            return Ok(());
        };
        let id = item.get("id").filter(|v| !v.is_null());
        let mut typ = None;
        if section == "consumers" && id.is_some_and(|i| id_text(i).contains("/credentials/")) {
            res = resources::lookup("credentials").unwrap_or(res);
        }
        let secret_type;
        if section == "secrets" {
            let text = id.map(id_text).unwrap_or_default();
            let Some((manager, _)) = text.split_once('/') else {
                return Err(format!("invalid secret id: {text}"));
            };
            secret_type = manager.to_string();
            typ = Some(secret_type.as_str());
        }
        match self.check_resource(res, id, item, typ, false).await {
            Ok(()) => Ok(()),
            Err(Reply::Lua {
                body: ReplyBody::Json(v),
                ..
            }) => Err(v.get("error_msg").map(id_text).unwrap_or_default()),
            Err(_) => Err("invalid configuration".to_string()),
        }
    }
}

/// In API-driven standalone mode the resource schemas accept an integer `modifiedIndex`
/// (APISIX adds it to them): checked here, and left out of what the resource check sees.
fn strip_modified_index(section: &str, item: &Value, standalone: bool) -> Result<Value, String> {
    let Some(index) = item.get("modifiedIndex") else {
        return Ok(item.clone());
    };
    if !standalone || !WITH_MODIFIED_INDEX.contains(&section) {
        return Ok(item.clone());
    }
    let integral = index.as_f64().is_some_and(|f| f.fract() == 0.0);
    if !integral {
        let got = if index.is_number() {
            "number"
        } else {
            lua::type_name(index)
        };
        return Err(format!(
            "invalid configuration: property \"modifiedIndex\" validation failed: wrong type: \
             expected integer, got {got}"
        ));
    }
    let mut item = item.clone();
    if let Value::Object(m) = &mut item {
        m.remove("modifiedIndex");
    }
    Ok(item)
}

fn no_content() -> Reply {
    Reply::Lua {
        status: StatusCode::NO_CONTENT,
        body: ReplyBody::Empty,
        handler: false,
    }
}

/// `X-Last-Modified` and `X-Digest` of the loaded document; none before the first update.
fn metadata_headers(
    store: &ferrisix_config::store::standalone_api::StandaloneApiStore,
) -> Vec<(&'static str, String)> {
    let mut headers = Vec::new();
    if let Some(t) = store.last_modified() {
        headers.push((LAST_MODIFIED, t.to_string()));
    }
    if let Some(d) = store.digest() {
        headers.push((DIGEST, d));
    }
    headers
}

fn now_epoch() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}
