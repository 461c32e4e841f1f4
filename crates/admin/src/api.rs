//! The Admin API's request pipeline, in APISIX's order: allow-list, common headers, CORS
//! preflight, routing, key check, resource and method lookup, body, `ttl`, handler.
//!
//! Every stage answers exactly as APISIX's does (status, body, which headers), because clients
//! and tests compare them; the comments name the APISIX behaviour each branch mirrors.

use std::fmt::Display;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use ferrisix_config::schema::lua;
use ferrisix_config::settings::{AdminKey, AdminKeyGuard, AdminSettings};
use ferrisix_config::store::standalone_api::StandaloneApiStore;
use ferrisix_config::store::Store;
use ferrisix_plugins::PluginRegistry;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, SERVER};
use http::request::Parts;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::Full;
use ipnet::IpNet;
use serde_json::{json, Value};

use crate::args::Args;
use crate::body::read_limited;
use crate::guard::AuthGuard;
use crate::resources::{self, Resource};
use crate::response::{nginx_page, Reply};
use crate::{auth, path};
use ferrisix_config::schema::cjson;

mod checks;
mod configs;
mod consumers;
mod plugins;

pub use plugins::{core_schema_catalog, http_plugin_catalog, stream_plugin_catalog};
mod resource;

/// APISIX's `MAX_REQ_BODY`: 1.5 MiB.
pub const MAX_BODY: usize = 1024 * 1024 * 3 / 2;

const PREFIX: &str = "/apisix/admin";

/// How the Admin API is set up (`deployment.admin` plus what the process knows).
#[derive(Clone, Debug)]
pub struct AdminOptions {
    /// `admin_key`. An empty list matches no key, so every request is refused with 401, as
    /// APISIX's `check_token` does; only `key_required: false` turns the check off.
    pub keys: Vec<AdminKey>,
    /// `admin_key_required: false` skips the key check entirely.
    pub key_required: bool,
    /// `allow_admin`: `None` lets everyone in, `Some([])` nobody.
    pub allow_admin: Option<Vec<IpNet>>,
    /// `enable_admin_cors`.
    pub cors: bool,
    /// Largest accepted request body.
    pub body_limit: usize,
    /// The `Server` header (and the footer of nginx-style pages).
    pub server: String,
    /// `apisix.proxy_mode` includes `stream`: stream routes may be managed.
    pub stream_mode: bool,
    /// `stream_plugins`: what `/plugins/list?subsystem=stream` lists and stream routes may use.
    pub stream_plugins: ferrisix_plugins::stream::StreamPlugins,
    /// `xrpc.protocols`: the xRPC protocols a stream route's `protocol` may name.
    pub xrpc: ferrisix_config::xrpc::XrpcProtocols,
    /// `apisix.data_encryption.keyring`: ssl keys and upstream client keys are stored
    /// encrypted with it, as APISIX stores them.
    pub keyring: ferrisix_config::encrypt::Keyring,
    /// `apisix.data_encryption.enable_encrypt_fields`: the plugins' `encrypt_fields` are
    /// stored encrypted (and shown decrypted).
    pub encrypt_fields: bool,
    /// `ferrisix.admin_key_guard`: failed authentications per client address.
    pub key_guard: AdminKeyGuard,
    /// `enable_admin_ui`: the dashboard's directory, served at `/ui/`; `None` serves nothing.
    pub ui_dir: Option<std::path::PathBuf>,
}

impl Default for AdminOptions {
    fn default() -> Self {
        AdminOptions::from_settings(&AdminSettings::default())
    }
}

impl AdminOptions {
    pub fn from_settings(settings: &AdminSettings) -> AdminOptions {
        AdminOptions {
            keys: settings.admin_key.clone(),
            key_required: settings.admin_key_required,
            allow_admin: settings.allow_admin.clone(),
            cors: settings.enable_admin_cors,
            body_limit: MAX_BODY,
            server: concat!("ferrisix/", env!("CARGO_PKG_VERSION")).to_string(),
            stream_mode: false,
            stream_plugins: ferrisix_plugins::stream::StreamPlugins::new(None).0,
            xrpc: ferrisix_config::xrpc::XrpcProtocols::default(),
            keyring: ferrisix_config::encrypt::Keyring::apisix_default(),
            encrypt_fields: true,
            key_guard: AdminKeyGuard::default(),
            ui_dir: None,
        }
    }
}

/// Rebuilds the plugin registry for `PUT /apisix/admin/plugins/reload` (re-reading
/// `config.yaml`'s plugin list); `None` keeps the current one.
pub type ReloadHook = Arc<dyn Fn() -> Option<PluginRegistry> + Send + Sync>;

/// The Admin API: answers `/apisix/admin/*` requests, writing only through the [`Store`].
pub struct AdminApi {
    options: AdminOptions,
    server: HeaderValue,
    store: Arc<dyn Store>,
    plugins: RwLock<PluginRegistry>,
    reload: Option<ReloadHook>,
    guard: Option<AuthGuard>,
    /// API-driven standalone mode: only `/apisix/admin/configs` is served, into this store.
    standalone: Option<Arc<StandaloneApiStore>>,
}

impl std::fmt::Debug for AdminApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminApi")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// One resource request after routing.
pub(crate) struct Call {
    pub res: &'static Resource,
    /// The id segment (for credentials the credential id, for secrets the manager).
    pub id: Option<String>,
    /// The segments after the id (for credentials `[username, "credentials", ...]`).
    pub sub: Vec<String>,
    pub body: Option<Value>,
    pub args: Args,
}

impl AdminApi {
    pub fn new(options: AdminOptions, store: Arc<dyn Store>, plugins: PluginRegistry) -> AdminApi {
        let server = HeaderValue::from_str(&options.server)
            .unwrap_or_else(|_| HeaderValue::from_static("ferrisix"));
        let g = &options.key_guard;
        let guard = g
            .enabled
            .then(|| AuthGuard::new(g.burst, g.per_minute))
            .flatten();
        AdminApi {
            options,
            server,
            store,
            plugins: RwLock::new(plugins),
            reload: None,
            guard,
            standalone: None,
        }
    }

    /// API-driven standalone mode (APISIX's `config_provider: yaml` with the traditional
    /// role): the Admin API serves `/apisix/admin/configs` into `store`, and nothing else.
    pub fn with_standalone(mut self, store: Arc<StandaloneApiStore>) -> AdminApi {
        self.standalone = Some(store);
        self
    }

    /// Whether this Admin API runs in API-driven standalone mode.
    pub fn is_standalone(&self) -> bool {
        self.standalone.is_some()
    }

    /// Sets what `PUT /apisix/admin/plugins/reload` reloads from.
    pub fn with_reload_hook(mut self, hook: ReloadHook) -> AdminApi {
        self.reload = Some(hook);
        self
    }

    pub fn options(&self) -> &AdminOptions {
        &self.options
    }

    /// The enabled plugins validation runs against.
    pub fn plugins(&self) -> PluginRegistry {
        self.plugins
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the enabled plugins (a reload done elsewhere).
    pub fn set_plugins(&self, plugins: PluginRegistry) {
        *self.plugins.write().unwrap_or_else(|e| e.into_inner()) = plugins;
    }

    /// Answers one request from `peer`. Never fails: every problem is an HTTP answer.
    pub async fn handle<B>(&self, req: Request<B>, peer: IpAddr) -> Response<Full<Bytes>>
    where
        B: Body,
        B::Error: Display,
    {
        // 1. nginx `allow`/`deny`: refused before any Lua runs, so no APISIX headers.
        if !self.allowed(peer.to_canonical()) {
            return self.page(StatusCode::FORBIDDEN, false);
        }
        let (parts, body) = req.into_parts();
        let Some(uri) = path::normalize(parts.uri.path()) else {
            return self.page(StatusCode::BAD_REQUEST, false);
        };
        // `location = /ui` and `location ^~ /ui/`: the dashboard's static files, no key.
        if let Some(root) = &self.options.ui_dir {
            if crate::ui::is_ui_path(&uri) {
                return crate::ui::serve(root, &parts, &uri, &self.server).await;
            }
        }
        // Outside nginx's `location /apisix/admin` nothing of APISIX runs.
        if !uri.starts_with(PREFIX) {
            return self.page(StatusCode::NOT_FOUND, false);
        }
        let reply = self.dispatch(&parts, &uri, body, peer.to_canonical()).await;
        self.finish(reply)
    }

    fn allowed(&self, peer: IpAddr) -> bool {
        match &self.options.allow_admin {
            None => true,
            Some(nets) => nets.iter().any(|n| n.contains(&peer)),
        }
    }

    /// nginx's own page; `in_location` adds the headers APISIX set before routing failed.
    fn page(&self, status: StatusCode, in_location: bool) -> Response<Full<Bytes>> {
        let mut resp = Response::new(Full::new(nginx_page(status, &self.options.server)));
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        h.insert(SERVER, self.server.clone());
        h.insert(CONTENT_TYPE, HeaderValue::from_static("text/html"));
        if in_location {
            self.cors_headers(h);
        }
        resp
    }

    fn cors_headers(&self, h: &mut http::HeaderMap) {
        if !self.options.cors {
            return;
        }
        h.insert("access-control-allow-origin", HeaderValue::from_static("*"));
        h.insert(
            "access-control-allow-credentials",
            HeaderValue::from_static("true"),
        );
        h.insert(
            "access-control-expose-headers",
            HeaderValue::from_static("*"),
        );
        h.insert("access-control-max-age", HeaderValue::from_static("3600"));
    }

    fn finish(&self, reply: Reply) -> Response<Full<Bytes>> {
        match reply {
            Reply::Page(status) => self.page(status, true),
            Reply::Preflight => {
                let mut resp = Response::new(Full::new(Bytes::new()));
                let h = resp.headers_mut();
                h.insert(SERVER, self.server.clone());
                h.insert("access-control-allow-origin", HeaderValue::from_static("*"));
                h.insert(
                    "access-control-allow-methods",
                    HeaderValue::from_static("POST, GET, PUT, OPTIONS, DELETE, PATCH"),
                );
                h.insert("access-control-max-age", HeaderValue::from_static("3600"));
                h.insert(
                    "access-control-allow-headers",
                    HeaderValue::from_static("*"),
                );
                h.insert(
                    "access-control-allow-credentials",
                    HeaderValue::from_static("true"),
                );
                h.insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
                h.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
                resp
            }
            Reply::Custom {
                status,
                body,
                content_type,
                headers,
            } => {
                let mut resp = Response::new(Full::new(body));
                *resp.status_mut() = status;
                let h = resp.headers_mut();
                h.insert(SERVER, self.server.clone());
                self.cors_headers(h);
                h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
                for (name, value) in headers {
                    let name = http::HeaderName::from_bytes(name.as_bytes());
                    if let (Ok(n), Ok(v)) = (name, HeaderValue::from_str(&value)) {
                        h.insert(n, v);
                    }
                }
                resp
            }
            Reply::Lua {
                status,
                body,
                handler,
            } => {
                let mut resp = Response::new(Full::new(body.into_bytes()));
                *resp.status_mut() = status;
                let h = resp.headers_mut();
                h.insert(SERVER, self.server.clone());
                self.cors_headers(h);
                // Every answer past the preflight is labelled JSON, plain-text bodies too.
                h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                if handler {
                    h.insert("x-api-version", HeaderValue::from_static("v3"));
                }
                resp
            }
        }
    }

    /// The admin router (`apisix/admin/init.lua`'s `uri_route`).
    async fn dispatch<B>(&self, parts: &Parts, uri: &str, body: B, peer: IpAddr) -> Reply
    where
        B: Body,
        B::Error: Display,
    {
        let method = &parts.method;
        if self.options.cors && method == Method::OPTIONS {
            return Reply::Preflight;
        }
        let resource_method = matches!(
            *method,
            Method::GET | Method::PUT | Method::POST | Method::DELETE | Method::PATCH
        );
        if self.standalone.is_some() {
            return self.dispatch_standalone(parts, uri, body, peer).await;
        }
        if uri == PREFIX {
            return if method == Method::HEAD {
                Reply::Lua {
                    status: StatusCode::OK,
                    body: crate::response::Body::Empty,
                    handler: false,
                }
            } else {
                Reply::Page(StatusCode::NOT_FOUND)
            };
        }
        if uri == "/apisix/admin/configs/validate" && method == Method::POST {
            if let Err(r) = self.auth(parts, peer) {
                return r;
            }
            return self.validate_configs(parts, body).await;
        }
        if uri == "/apisix/admin/plugins/list" && method == Method::GET {
            if let Err(r) = self.auth(parts, peer) {
                return r;
            }
            return self.plugin_list(&Args::parse(parts.uri.query()));
        }
        if uri == "/apisix/admin/plugins/reload" && resource_method {
            if let Err(r) = self.auth(parts, peer) {
                return r;
            }
            if method == Method::PUT {
                return self.reload_plugins().await;
            }
            return Reply::early(
                StatusCode::METHOD_NOT_ALLOWED,
                json!({"error_msg": format!(
                    "please use PUT method to reload the plugins, {method} method is not allowed."
                )}),
            );
        }
        if method == Method::POST && uri.starts_with("/apisix/admin/schema/validate/") {
            if let Err(r) = self.auth(parts, peer) {
                return r;
            }
            return self.schema_validate(parts, uri, body).await;
        }
        if resource_method && uri.starts_with("/apisix/admin/") {
            return self.run(parts, uri, body, peer).await;
        }
        Reply::Page(StatusCode::NOT_FOUND)
    }

    /// `check_token`: 401 with APISIX's description, no `X-API-VERSION`. The log line names
    /// the client, and wrong keys count against its address ([`AuthGuard`]): past the burst,
    /// its wrong keys get 429 while a right key still gets through.
    fn auth(&self, parts: &Parts, peer: IpAddr) -> Result<(), Reply> {
        if !self.options.key_required {
            return Ok(());
        }
        let too_many = |wait: std::time::Duration| {
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            tracing::warn!(client = %peer, retry_in_s = secs, "failed to check token: too many wrong keys from this client");
            Reply::early(
                StatusCode::TOO_MANY_REQUESTS,
                json!({"error_msg": format!(
                    "too many failed authentications from {peer}, retry in {secs} seconds"
                )}),
            )
        };
        // The key is compared first, whatever the guard holds, and the guard only hears of
        // wrong ones (see `guard` for why that is safe).
        let presented = auth::presented_key(parts.uri.query(), &parts.headers);
        auth::check(&self.options.keys, presented, &parts.method).map_err(|refusal| {
            if refusal == auth::Refusal::Wrong {
                if let Some(wait) = self.guard.as_ref().and_then(|g| g.failed(peer)) {
                    return too_many(wait);
                }
            }
            tracing::warn!(client = %peer, reason = refusal.description(), "failed to check token");
            Reply::early(
                StatusCode::UNAUTHORIZED,
                json!({"error_msg": "failed to check token", "description": refusal.description()}),
            )
        })
    }

    /// Reads and decodes the body (stage 9): `None` for an empty body.
    async fn read_json<B>(&self, parts: &Parts, body: B) -> Result<Option<Value>, Reply>
    where
        B: Body,
        B::Error: Display,
    {
        let declared = parts
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let limit = self.options.body_limit;
        let bytes = read_limited(body, declared, limit).await.map_err(|e| {
            Reply::early(
                StatusCode::BAD_REQUEST,
                json!({"error_msg": format!("invalid request body: {}", e.message(limit))}),
            )
        })?;
        if bytes.is_empty() {
            return Ok(None);
        }
        cjson::decode(&bytes).map(Some).map_err(|e| {
            Reply::early(
                StatusCode::BAD_REQUEST,
                json!({
                    "error_msg": format!("invalid request body: {e}"),
                    "req_body": String::from_utf8_lossy(&bytes),
                }),
            )
        })
    }

    /// `run()`: everything under `/apisix/admin/*` that is not one of the fixed routes.
    async fn run<B>(&self, parts: &Parts, uri: &str, body: B, peer: IpAddr) -> Reply
    where
        B: Body,
        B::Error: Display,
    {
        if let Err(r) = self.auth(parts, peer) {
            return r;
        }
        let segs = path::segments(uri);
        let tail = |from: usize| segs.get(from..).map(<[String]>::to_vec).unwrap_or_default();
        let mut res_name = segs.get(2).cloned().unwrap_or_default();
        let mut id = segs.get(3).cloned();
        let mut sub = tail(4);
        // `/schema/plugins/<name>` is served as `/plugins/<name>`.
        if res_name == "schema" && id.as_deref() == Some("plugins") {
            res_name = "plugins".to_string();
            id = segs.get(4).cloned();
            sub = tail(5);
        }
        if res_name == "stream_routes" && !self.options.stream_mode {
            return Reply::early(
                StatusCode::BAD_REQUEST,
                json!({"error_msg": "stream mode is disabled, can not add stream routes"}),
            );
        }
        // `/consumers/<username>/credentials[/<id>]` is the credentials resource.
        if res_name == "consumers" && segs.get(4).map(String::as_str) == Some("credentials") {
            let mut credential_sub = vec![id.clone().unwrap_or_default()];
            credential_sub.extend(tail(4));
            res_name = "credentials".to_string();
            id = segs.get(5).cloned();
            sub = credential_sub;
        }

        enum Target {
            Schema,
            Plugins,
            Resource(&'static Resource),
        }
        let target = match res_name.as_str() {
            "schema" => Target::Schema,
            "plugins" => Target::Plugins,
            other => match resources::lookup(other) {
                Some(r) => Target::Resource(r),
                None => {
                    return Reply::early(
                        StatusCode::NOT_FOUND,
                        json!({"error_msg": format!("Unsupported resource type: {other}")}),
                    );
                }
            },
        };
        // `schema` and `plugins` only have a GET handler.
        if matches!(target, Target::Schema | Target::Plugins) && parts.method != Method::GET {
            return Reply::early(StatusCode::NOT_FOUND, json!({"error_msg": "not found"}));
        }
        let body = match self.read_json(parts, body).await {
            Ok(b) => b,
            Err(r) => return r,
        };
        let args = Args::parse(parts.uri.query());
        if let Some(ttl) = args.get("ttl") {
            if ttl.as_str().and_then(lua::tonumber).is_none() {
                return Reply::early(
                    StatusCode::BAD_REQUEST,
                    json!({"error_msg": "invalid argument ttl: should be a number"}),
                );
            }
        }
        match target {
            Target::Schema => self.schema_get(id.as_deref()),
            Target::Plugins => self.plugin_get(id.as_deref(), &args),
            Target::Resource(res) => {
                let call = Call {
                    res,
                    id,
                    sub,
                    body,
                    args,
                };
                match parts.method {
                    Method::GET => self.get(call).await,
                    Method::PUT => self.put(call).await,
                    Method::POST => self.post(call).await,
                    Method::DELETE => self.delete(call).await,
                    _ => self.patch(call).await,
                }
            }
        }
    }
}
