//! The data plane's secret resolution (APISIX's `apisix/secret.lua` with
//! `apisix/secret/{vault,aws,gcp}.lua`): the `$secret://` and `$env://` references of a
//! store's states resolved before the compile sees them, and kept fresh in the background.
//!
//! The store's states pass through [`SecretResolver::run`] on their way to the compile. For
//! each state it finds the references (in the places `ferrisix_config::secret::ref_fields`
//! names), fetches the `$secret://` ones it does not hold yet from their managers (the
//! `/secrets/<manager>/<id>` items of the same state), and publishes the state with every
//! reference replaced by its value. The request path never meets a reference, a lock or a
//! store call: a rotated secret reaches requests as a changed resource, compiled and
//! published as any other change.
//!
//! The cache is APISIX's: a value is kept for `apisix.lru.secret.ttl` seconds (300), a
//! failure for `neg_ttl` (60); a change of a manager's configuration fetches its references
//! again. When a value's time is up it is fetched again in the background, and the state is
//! published again if it changed. Where ferrisix differs:
//! - a refresh that cannot reach the store (connection, timeout, a 5xx answer) keeps the last
//!   value (logged), and tries again after `neg_ttl`; a store that answers that the secret or
//!   its field is gone ends the value;
//! - a reference that does not resolve is not kept as written: its resource is refused
//!   (quarantined, with the reference and field named, never a value). The resource's
//!   previous definition, if one resolved, keeps serving; the same definition is never served
//!   with a value the store no longer has.

mod aws;
mod gcp;
mod vault;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferrisix_config::model::ResourceKind;
use ferrisix_config::secret::{self, StateResolver};
use ferrisix_config::state::ConfigState;
use ferrisix_plugin_api::PluginServices;
use serde_json::Value;
use tokio::sync::watch;

use crate::support::cloud::gcp_token::Token;

/// One reference to fetch: its URI, and its manager's (kind, configuration) or why there is none.
type ManagerFetch = (String, Result<(String, Value), String>);

/// What decrypts the plugins' stored-encrypted fields (`PluginRegistry::field_decryptor`):
/// a reference stored in such a field is found and resolved too.
pub struct Decryptor {
    /// The quoted names of the plugins with `encrypt_fields`.
    pub names: Vec<String>,
    /// Decrypts those fields in a `plugins` object, in place.
    pub decrypt: secret::RevealFn,
}

/// The cache's lifetimes (config.yaml's `apisix.lru.secret`).
#[derive(Clone, Copy, Debug)]
pub struct CacheTtl {
    /// How long a value is kept.
    pub ttl: Duration,
    /// How long a failure is kept before it is tried again.
    pub neg_ttl: Duration,
}

impl Default for CacheTtl {
    fn default() -> CacheTtl {
        CacheTtl {
            ttl: Duration::from_secs(300),
            neg_ttl: Duration::from_secs(60),
        }
    }
}

/// Why a fetch found no value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FetchError {
    /// The store answered: no such secret or field, or the request refused (a 4xx).
    Missing(String),
    /// The store could not be asked or failed (connection, timeout, a 5xx answer).
    Unavailable(String),
}

impl FetchError {
    fn message(&self) -> &str {
        match self {
            FetchError::Missing(m) | FetchError::Unavailable(m) => m,
        }
    }
}

/// What a manager's call found: an HTTP failure is `Unavailable`, a 5xx answer too.
fn status_error(status: u16, message: String) -> FetchError {
    if status >= 500 {
        FetchError::Unavailable(message)
    } else {
        FetchError::Missing(message)
    }
}

/// Where `$env://` references are read (shared by the concurrent fetches).
type Env = dyn Fn(&str) -> Option<String> + Send + Sync;

/// The timeout of one call to a store (Vault's `timeout` default in APISIX).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// One reference's cached value.
struct Entry {
    value: Result<Value, String>,
    /// The manager configuration it was fetched with (its stored text).
    conf: String,
    /// When it is fetched again.
    refresh_at: Instant,
}

/// Resolves the references of a store's states (see the module's documentation).
pub struct SecretResolver {
    services: Arc<PluginServices>,
    ttl: CacheTtl,
    env: Box<Env>,
    refs: StateResolver,
    input: Arc<ConfigState>,
    cache: HashMap<String, Entry>,
    /// GCP access tokens by `client_email#project_id`, kept until a minute before expiry.
    tokens: HashMap<String, Token>,
}

impl SecretResolver {
    /// A resolver calling stores with `services`' HTTP client and reading `$env://`
    /// references from the process environment.
    pub fn new(services: Arc<PluginServices>, ttl: CacheTtl) -> SecretResolver {
        SecretResolver::with_env(services, ttl, Box::new(ferrisix_config::env::process_env))
    }

    /// Decrypts the plugins' stored-encrypted fields before looking for references.
    pub fn with_decryptor(mut self, decryptor: Option<Decryptor>) -> SecretResolver {
        if let Some(d) = decryptor {
            self.refs = StateResolver::with_reveal(d.names, d.decrypt);
        }
        self
    }

    /// [`SecretResolver::new`] with another environment (tests).
    pub fn with_env(services: Arc<PluginServices>, ttl: CacheTtl, env: Box<Env>) -> SecretResolver {
        SecretResolver {
            services,
            ttl,
            env,
            refs: StateResolver::default(),
            input: Arc::default(),
            cache: HashMap::new(),
            tokens: HashMap::new(),
        }
    }

    /// `input` with its references resolved: the references not cached (or whose manager
    /// changed) are fetched first.
    pub async fn resolve(&mut self, input: Arc<ConfigState>) -> ConfigState {
        self.refs.update(&input);
        self.input = input;
        self.fetch().await;
        self.output()
    }

    fn output(&mut self) -> ConfigState {
        let cache = &self.cache;
        let lookup = |uri: &str| cache.get(uri).map(|e| e.value.clone());
        let (out, _refused) = self.refs.resolve(&*self.env, &lookup);
        out
    }

    /// When the next cached value is due.
    fn next_refresh(&self) -> Option<Instant> {
        let wanted = self.refs.secret_refs();
        wanted
            .iter()
            .filter_map(|r| self.cache.get(*r))
            .map(|e| e.refresh_at)
            .min()
    }

    /// Fetches the references of the current state that are not cached, whose manager
    /// changed, or whose time is up. Answers whether a value changed.
    async fn fetch(&mut self) -> bool {
        let now = Instant::now();
        let mut todo: Vec<ManagerFetch> = Vec::new();
        for uri in self.refs.secret_refs() {
            let manager = manager_of(&self.input, uri);
            let conf_text = manager
                .as_ref()
                .map_or_else(|_| String::new(), |m| m.0.clone());
            let cached = self
                .cache
                .get(uri)
                .is_some_and(|e| e.conf == conf_text && e.refresh_at > now);
            if !cached {
                todo.push((uri.to_owned(), manager));
            }
        }
        // Entries no reference uses any more go.
        let wanted: std::collections::HashSet<&str> = self.refs.secret_refs().into_iter().collect();
        self.cache.retain(|k, _| wanted.contains(k.as_str()));
        if todo.is_empty() {
            return false;
        }
        // GCP tokens first (one exchange per account), then every value at once.
        self.gcp_tokens(&todo).await;
        let this = &*self;
        let fetches = todo.iter().map(|(uri, manager)| async move {
            let result = match manager {
                Err(e) => Err(FetchError::Missing(e.clone())),
                Ok((_, conf)) => this.fetch_one(uri, conf).await,
            };
            (uri.clone(), result)
        });
        let results = futures_util::future::join_all(fetches).await;
        let mut changed = false;
        for ((uri, result), (_, manager)) in results.into_iter().zip(&todo) {
            let conf = manager
                .as_ref()
                .map_or_else(|_| String::new(), |m| m.0.clone());
            let previous = self.cache.remove(&uri);
            let before = previous.as_ref().map(|p| p.value.clone());
            let kept = previous.filter(|p| p.conf == conf && p.value.is_ok());
            let entry = match result {
                Ok(value) => Entry {
                    value: Ok(value),
                    conf,
                    refresh_at: now + self.ttl.ttl,
                },
                Err(FetchError::Unavailable(e)) if kept.is_some() => {
                    tracing::error!(
                        "failed to refresh secret reference: {uri}, err: {e}; the last value is kept"
                    );
                    let kept = kept.expect("checked");
                    Entry {
                        refresh_at: now + self.ttl.neg_ttl,
                        ..kept
                    }
                }
                Err(e) => {
                    tracing::error!(
                        "failed to fetch secret reference: {uri}, err: {}",
                        e.message()
                    );
                    Entry {
                        value: Err(e.message().to_owned()),
                        conf,
                        refresh_at: now + self.ttl.neg_ttl,
                    }
                }
            };
            if before.as_ref() != Some(&entry.value) {
                changed = true;
            }
            self.cache.insert(uri, entry);
        }
        changed
    }

    async fn gcp_tokens(&mut self, todo: &[ManagerFetch]) {
        let now = now_secs();
        for (_, manager) in todo {
            let Ok((_, conf)) = manager else { continue };
            if conf.get("__manager").and_then(Value::as_str) != Some("gcp") {
                continue;
            }
            let Ok((account, _)) = gcp::account(conf) else {
                continue;
            };
            let key = gcp::token_key(&account);
            if self.tokens.get(&key).is_some_and(|t| t.fresh(now)) {
                continue;
            }
            match gcp::exchange(self.services.http(), &account, conf).await {
                Ok(t) => {
                    self.tokens.insert(key, t);
                }
                Err(e) => {
                    self.tokens.remove(&key);
                    tracing::error!("failed to refresh google oauth access token, {e}");
                }
            }
        }
    }

    async fn fetch_one(&self, uri: &str, conf: &Value) -> Result<Value, FetchError> {
        let parsed = secret::parse_secret_uri(uri).map_err(FetchError::Missing)?;
        let http = self.services.http();
        let env = &*self.env;
        let value = match parsed.manager {
            "vault" => vault::get(http, conf, parsed.key, env).await?,
            "aws" => aws::get(http, conf, parsed.key, env, now_secs()).await?,
            "gcp" => {
                let (account, entries) = gcp::account(conf).map_err(FetchError::Missing)?;
                let token = self.tokens.get(&gcp::token_key(&account));
                gcp::get(http, conf, (&account, &entries), token, parsed.key).await?
            }
            other => return Err(FetchError::Missing(format!("no secret manager: {other}"))),
        };
        value.ok_or_else(|| FetchError::Missing("no value".into()))
    }

    /// Follows `input`'s states, publishing each resolved on `output`, and refreshes cached
    /// values as they come due (publishing again when one changed), until `input`'s sender
    /// or every receiver of `output` goes away.
    pub async fn run(
        mut self,
        mut input: watch::Receiver<Arc<ConfigState>>,
        output: watch::Sender<Arc<ConfigState>>,
    ) {
        drop(input.borrow_and_update());
        loop {
            let next = self.next_refresh();
            let timer = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = input.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let state = input.borrow_and_update().clone();
                    let out = self.resolve(state).await;
                    if output.send(Arc::new(out)).is_err() {
                        return;
                    }
                }
                () = timer => {
                    if self.fetch().await {
                        let out = self.output();
                        if output.send(Arc::new(out)).is_err() {
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// The configuration of the manager `uri` names, as stored (its text, to see it change) and
/// checked with its defaults, marked with its manager's name (`__manager`); or why there is
/// none (APISIX's `no secret conf, secret_uri: ...`).
fn manager_of(state: &ConfigState, uri: &str) -> Result<(String, Value), String> {
    let parsed = secret::parse_secret_uri(uri)?;
    let id = format!("{}/{}", parsed.manager, parsed.id);
    let item = state
        .get(ResourceKind::Secrets, &id)
        .ok_or_else(|| format!("no secret conf, secret_uri: {uri}"))?;
    let (manager, mut conf) = secret::manager_conf(&id, &item.value.parse())
        .map_err(|e| format!("invalid secret conf {id}: {e}"))?;
    if let Value::Object(map) = &mut conf {
        map.insert("__manager".into(), Value::String(manager));
    }
    Ok((item.value.text().to_owned(), conf))
}

/// The value of `data[field]` of a JSON text (a secret holding a JSON object).
fn json_field(text: &str, field: &str) -> Result<Option<Value>, FetchError> {
    let data: Value = serde_json::from_str(text)
        .map_err(|e| FetchError::Missing(format!("failed to decode result, err: {e}")))?;
    Ok(data.get(field).filter(|v| !v.is_null()).cloned())
}
