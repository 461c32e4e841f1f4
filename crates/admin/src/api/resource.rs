//! GET, PUT, POST, PATCH and DELETE on a resource (APISIX's `apisix/admin/resource.lua`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferrisix_config::encrypt::FieldOp;
use ferrisix_config::schema::lua;
use ferrisix_config::store::{KeyValue, StoreError};
use http::{Method, StatusCode};
use serde_json::{json, Value};

use super::{AdminApi, Call};
use crate::list::{self, Item, ListAnswer};
use crate::merge;
use crate::resources::Resource;
use crate::response::{lua_view, Body, Reply};

/// Lua truthiness of an optional field (absent and `false` are false; JSON `null` is true).
pub(crate) fn truthy(v: Option<&Value>) -> bool {
    !matches!(v, None | Some(Value::Bool(false)))
}

/// `tostring` of an id value.
pub(crate) fn id_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => lua::json_number(n),
        other => lua::cjson_encode(other),
    }
}

/// A stored value as JSON; a value that is not JSON is shown as the string it is.
pub(crate) fn parse_stored(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn unavailable(e: StoreError) -> Reply {
    Reply::unavailable(e.to_string())
}

fn not_supported(method: &Method, res: &Resource) -> Reply {
    Reply::error(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("not supported `{method}` method for {}", res.kind),
    )
}

fn encode(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

/// The lease length of `?ttl=` (already checked to be a number).
fn ttl(call: &Call) -> Option<Duration> {
    let secs = call.args.str("ttl").and_then(lua::tonumber)?;
    Some(Duration::from_secs_f64(if secs.is_finite() && secs > 0.0 {
        secs
    } else {
        0.0
    }))
}

/// `inject_timestamp`: `create_time` from the previous value (else now), `update_time` now
/// unless `keep_update_time`.
fn stamp(conf: &mut Value, previous_create: Option<&Value>, keep_update_time: bool) {
    let Value::Object(m) = conf else { return };
    if !truthy(m.get("create_time")) {
        let t = previous_create
            .filter(|v| truthy(Some(v)))
            .cloned()
            .unwrap_or_else(|| json!(now()));
        m.insert("create_time".to_string(), t);
    }
    if !truthy(m.get("update_time")) || !keep_update_time {
        m.insert("update_time".to_string(), json!(now()));
    }
}

impl AdminApi {
    pub(crate) fn prefix(&self) -> &str {
        self.store.prefix()
    }

    /// The secret manager and id of `/secrets/<manager>/<id>`; other resources keep the id.
    fn split_secret(call: &Call) -> (Option<String>, Option<String>) {
        if call.res.name == "secrets" {
            (call.id.clone(), call.sub.first().cloned())
        } else {
            (None, call.id.clone())
        }
    }

    /// The etcd key of one item.
    fn item_key(&self, call: &Call, typ: Option<&str>, id: &str) -> String {
        let prefix = self.prefix();
        match call.res.name {
            "credentials" => {
                let username = call.sub.first().map_or("", String::as_str);
                format!("{prefix}/consumers/{username}/credentials/{id}")
            }
            "secrets" => format!("{prefix}/secrets/{}/{id}", typ.unwrap_or_default()),
            name => format!("{prefix}/{name}/{id}"),
        }
    }

    pub(crate) async fn get(&self, call: Call) -> Reply {
        let (typ, id) = Self::split_secret(&call);
        let strip_keys = call.res.name == "ssls";
        if let Some(id) = id {
            let key = self.item_key(&call, typ.as_deref(), &id);
            return match self.store.get(&key).await {
                Err(e) => unavailable(e),
                Ok(None) => Reply::key_not_found(),
                Ok(Some(kv)) => {
                    let mut item = to_item(kv);
                    if strip_keys {
                        strip_private_keys(&mut item.value);
                    }
                    self.process_plugin_fields(call.res.name, &mut item.value, FieldOp::Decrypt);
                    Reply::json(StatusCode::OK, list::envelope(&item))
                }
            };
        }

        let prefix = self.prefix();
        let dir = match call.res.name {
            "credentials" => {
                let username = call.sub.first().map_or("", String::as_str);
                format!("{prefix}/consumers/{username}/credentials/")
            }
            name => format!("{prefix}/{name}/"),
        };
        // A page with no filter is read from the store page by page where it can (the
        // directory's other items are neither read nor parsed). Secrets sit one level further
        // down (`secrets/<manager>/<id>`), so they are always listed whole.
        let window = list::store_page(&call.args).filter(|_| call.res.name != "secrets");
        if let Some((offset, limit)) = window {
            match self.store.list_page(&dir, offset, limit).await {
                Err(e) => return unavailable(e),
                Ok(None) => {}
                Ok(Some(page)) => {
                    if page.total == 0 && call.res.name == "credentials" {
                        return Reply::key_not_found();
                    }
                    let mut items: Vec<Item> = page.kvs.into_iter().map(to_item).collect();
                    for item in &mut items {
                        if strip_keys {
                            strip_private_keys(&mut item.value);
                        }
                        self.process_plugin_fields(
                            call.res.name,
                            &mut item.value,
                            FieldOp::Decrypt,
                        );
                    }
                    return Reply::json(StatusCode::OK, list::paged_answer(&items, page.total));
                }
            }
        }
        let kvs = match self.store.list(&dir).await {
            Ok((kvs, _)) => kvs,
            Err(e) => return unavailable(e),
        };
        let mut items: Vec<Item> = kvs
            .into_iter()
            // The `init_dir` placeholder of the directory itself.
            .filter(|kv| kv.key != dir)
            .filter(|kv| call.res.name != "consumers" || !is_credential_key(&kv.key[dir.len()..]))
            .map(to_item)
            .collect();
        // Credentials have no directory placeholder: an empty range is etcd's 404.
        if items.is_empty() && call.res.name == "credentials" {
            return Reply::key_not_found();
        }
        for item in &mut items {
            if strip_keys {
                strip_private_keys(&mut item.value);
            }
            self.process_plugin_fields(call.res.name, &mut item.value, FieldOp::Decrypt);
        }
        match list::answer(items, &call.args, call.res.filter_fields) {
            ListAnswer::Json(v) => Reply::json(StatusCode::OK, v),
            ListAnswer::BadPageSize => Reply::Lua {
                status: StatusCode::BAD_REQUEST,
                body: Body::Text("page_size must be between 10 and 500".to_string()),
                handler: true,
            },
        }
    }

    pub(crate) async fn put(&self, call: Call) -> Reply {
        if call.res.refuses(&Method::PUT) {
            return not_supported(&Method::PUT, call.res);
        }
        let (typ, path_id) = Self::split_secret(&call);
        let mut conf = call.body.clone();
        let id = match self
            .check_conf(
                &call,
                path_id.as_deref(),
                conf.as_mut(),
                call.res.needs_id,
                typ.as_deref(),
                false,
            )
            .await
        {
            Ok(id) => id,
            Err(r) => return r,
        };
        let Some(mut conf) = conf else {
            return Reply::bad_request("missing configurations");
        };
        // Secrets are keyed by the id under the manager, not by `manager/id`.
        let key_id = if call.res.name == "secrets" {
            path_id.unwrap_or_default()
        } else {
            id.clone()
        };
        let key = self.item_key(&call, typ.as_deref(), &key_id);

        if call.res.name == "credentials" {
            let username = call.sub.first().map_or("", String::as_str);
            match self
                .store
                .get(&format!("{}/consumers/{username}", self.prefix()))
                .await
            {
                Err(e) => return unavailable(e),
                Ok(None) => return Reply::error(StatusCode::NOT_FOUND, "consumer not found"),
                Ok(Some(_)) => {}
            }
        }

        self.encrypt_secrets(call.res.name, &mut conf);
        if call.res.name == "plugin_metadata" {
            if let Value::Object(m) = &mut conf {
                m.insert("id".to_string(), Value::String(id));
            }
        } else {
            let previous = match self.store.get(&key).await {
                Ok(p) => p,
                Err(e) => return unavailable(e),
            };
            let previous = previous.map(|kv| parse_stored(&kv.value));
            stamp(
                &mut conf,
                previous.as_ref().and_then(|p| p.get("create_time")),
                false,
            );
        }

        self.write(&call, key, conf).await
    }

    pub(crate) async fn post(&self, call: Call) -> Reply {
        if call.res.refuses(&Method::POST) {
            return not_supported(&Method::POST, call.res);
        }
        let mut conf = call.body.clone();
        if let Err(r) = self
            .check_conf(&call, call.id.as_deref(), conf.as_mut(), false, None, false)
            .await
        {
            return r;
        }
        let Some(mut conf) = conf else {
            return Reply::bad_request("missing configurations");
        };
        stamp(&mut conf, None, false);
        self.encrypt_secrets(call.res.name, &mut conf);

        // APISIX's id: the revision of a scratch write, as 20 zero-padded digits.
        let gen = match self
            .store
            .put(&format!("{}/gen_id", self.prefix()), b"1".to_vec(), None)
            .await
        {
            Ok(o) => o,
            Err(e) => return unavailable(e),
        };
        let id = format!("{:020}", gen.revision);
        if let Value::Object(m) = &mut conf {
            m.insert("id".to_string(), Value::String(id.clone()));
        }
        let key = self.item_key(&call, None, &id);
        self.write(&call, key, conf).await
    }

    pub(crate) async fn delete(&self, call: Call) -> Reply {
        if call.res.refuses(&Method::DELETE) {
            return not_supported(&Method::DELETE, call.res);
        }
        let (typ, id) = Self::split_secret(&call);
        let Some(id) = id else {
            return Reply::bad_request(format!("missing {} id", call.res.kind));
        };
        let key = self.item_key(&call, typ.as_deref(), &id);
        // Only the exact string `true` skips the checks.
        if let Some(check) = call.res.delete_check {
            if call.args.str("force") != Some("true") {
                if let Err(r) = self.delete_check(check, &id).await {
                    return r;
                }
            }
        }
        if call.res.name == "consumers" {
            if let Err(e) = self
                .store
                .delete_prefix(&format!("{key}/credentials/"))
                .await
            {
                return unavailable(e);
            }
        }
        match self.store.delete(&key).await {
            Err(e) => unavailable(e),
            Ok(None) => Reply::key_not_found(),
            Ok(Some(_)) => Reply::json(StatusCode::OK, json!({"deleted": "1", "key": key})),
        }
    }

    pub(crate) async fn patch(&self, call: Call) -> Reply {
        if call.res.refuses(&Method::PATCH) {
            return not_supported(&Method::PATCH, call.res);
        }
        let (typ, id, sub_path) = if call.res.name == "secrets" {
            let Some((id, rest)) = call.sub.split_first() else {
                return Reply::bad_request("no secret id");
            };
            (call.id.clone(), Some(id.clone()), rest.to_vec())
        } else if call.res.name == "credentials" {
            // The sub path carries the consumer; there is no JSON path to patch.
            (None, call.id.clone(), Vec::new())
        } else {
            (None, call.id.clone(), call.sub.clone())
        };
        let Some(id) = id else {
            return Reply::bad_request(format!("missing {} id", call.res.kind));
        };
        let key = self.item_key(&call, typ.as_deref(), &id);
        let Some(patch) = call.body.clone() else {
            return Reply::bad_request("missing new configuration");
        };
        if sub_path.is_empty() && !matches!(patch, Value::Object(_) | Value::Array(_)) {
            return Reply::bad_request("invalid configuration");
        }
        let old = match self.store.get(&key).await {
            Err(e) => return unavailable(e),
            Ok(None) => return Reply::key_not_found(),
            Ok(Some(kv)) => kv,
        };
        let mut node = parse_stored(&old.value);
        if !node.is_object() {
            node = json!({});
        }
        // Stored plugin secrets are ciphertext: decrypted before the merge, so the write
        // below encrypts each exactly once (APISIX's `decrypt_params` before patching).
        self.process_plugin_fields(call.res.name, &mut node, FieldOp::Decrypt);
        if sub_path.is_empty() {
            let patch_sets_update_time = patch.get("update_time").is_some_and(|v| !v.is_null());
            if let Value::Object(m) = &mut node {
                merge::merge(m, merge::patch_table(patch));
            }
            stamp(&mut node, None, patch_sets_update_time);
        } else {
            if let Err(e) = merge::patch_path(&mut node, &sub_path, patch) {
                return Reply::bad_request(e);
            }
            stamp(&mut node, None, false);
        }

        if let Err(r) = self
            .check_conf(
                &call,
                Some(&id),
                Some(&mut node),
                true,
                typ.as_deref(),
                true,
            )
            .await
        {
            return r;
        }
        // Keys already stored are ciphertext and stay as they are; new PEM ones are encrypted.
        self.encrypt_secrets(call.res.name, &mut node);
        match self
            .store
            .put_if_unmodified(&key, encode(&node), old.mod_revision, ttl(&call))
            .await
        {
            Err(e) => unavailable(e),
            Ok(_) => Reply::json(StatusCode::OK, json!({"key": key, "value": lua_view(node)})),
        }
    }
}

impl AdminApi {
    /// Writes `conf` at `key` (for the call's `ttl`): 201 with the value, 200 when it replaced
    /// one.
    async fn write(&self, call: &Call, key: String, conf: Value) -> Reply {
        match self.store.put(&key, encode(&conf), ttl(call)).await {
            Err(e) => unavailable(e),
            Ok(outcome) => {
                let status = if outcome.previous.is_some() {
                    StatusCode::OK
                } else {
                    StatusCode::CREATED
                };
                Reply::json(status, json!({"key": key, "value": lua_view(conf)}))
            }
        }
    }

    /// What APISIX stores encrypted: an ssl's `key`/`keys` (`aes_encrypt_pkey`) and an
    /// upstream's `tls.client_key` (inline upstreams of routes and services too).
    fn encrypt_secrets(&self, resource: &str, conf: &mut Value) {
        self.process_plugin_fields(resource, conf, FieldOp::Encrypt);
        let keyring = &self.options().keyring;
        match resource {
            "ssls" => keyring.encrypt_ssl(conf),
            "upstreams" => keyring.encrypt_upstream_tls(conf),
            "routes" | "services" => {
                if let Some(up) = conf.get_mut("upstream") {
                    keyring.encrypt_upstream_tls(up);
                }
            }
            _ => {}
        }
    }
}

fn to_item(kv: KeyValue) -> Item {
    Item {
        value: parse_stored(&kv.value),
        key: kv.key,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
    }
}

/// `<username>/credentials/<id>` under the consumers directory.
fn is_credential_key(rest: &str) -> bool {
    rest.split('/').nth(1) == Some("credentials")
}

/// SSL private keys never leave the Admin API on reads.
fn strip_private_keys(v: &mut Value) {
    if let Value::Object(m) = v {
        m.shift_remove("key");
        m.shift_remove("keys");
    }
}
