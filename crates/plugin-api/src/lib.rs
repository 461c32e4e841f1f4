//! The plugin API of ferrisix: what a plugin is allowed to see and use, and nothing of the
//! proxy's insides. Plugin families (`ferrisix-plugins`) reach the proxy through this crate
//! only (besides it they use the parts of the lower crates listed below); the proxy implements
//! the other side of it. `docs/adding-a-plugin.md` walks through writing a plugin.
//!
//! A plugin is one static [`PluginDef`] (name, priority, schemas, checks, how it compiles a
//! configuration) and the [`Plugin`] instances it compiles, once per snapshot, for one
//! configuration on one route. The proxy carries one context per request through APISIX's
//! phases and hands plugins a [`PluginCtx`] view of it: the request head and every variable,
//! the edits that shape the request sent upstream, the consumer and upstream slots (with the
//! snapshot's [`ConsumerIndex`] auth plugins find credentials in), the request body,
//! per-request plugin state and the headers added to whatever answer ends the request.
//! After the response head, `header_filter` sees a [`ResponseHead`] and may install streaming
//! [`BodyFilter`]s; `log` sees a [`LogCtx`] holding only what the chain's plugins declared in
//! their [`LogNeeds`].
//!
//! Nothing here is process-wide: the clock, the executor for background tasks, the HTTP
//! client, the connection statistics, the gateway's own error log as plugins may read it
//! ([`ErrorLogTap`]) and the typed shared states live in one
//! [`PluginServices`] value that the binary makes and passes down, so two gateways in one
//! process share nothing. State that must outlive snapshots (counters, buckets, series) lives
//! in a [`StateMap`], which releases a resource's state when the last snapshot using it is
//! dropped.
//!
//! A plugin's [`PluginDef::verdict`] applies its schema before its own check, so a check
//! never sees, and cannot drop, the schema's failure (it may only reword it, see
//! [`SchemaErrorFn`]).
//!
//! # What plugins use besides this crate
//!
//! Plugins share three lower crates with the proxy. The parts below are the configuration
//! language and request variables a plugin's conf is written in, which the proxy and the Admin
//! API read the same way; they are used from those crates directly rather than renamed here.
//! A plugin module (a file of a family in `ferrisix-plugins`, or of its `support/`) may use:
//!
//! - `ferrisix_config::schema`: JSON schemas and APISIX's shared schema pieces
//!   (`schema::defs`), filling defaults, and `schema::lua`, the Lua-compatible JSON encoding
//!   of APISIX's answers;
//! - `ferrisix_config::vars`: compiling APISIX `vars` expressions (lua-resty-expr);
//! - `ferrisix_config::settings`: config.yaml's `plugin_attr` for plugins that read it
//!   (prometheus, public-api) and the cache zones of `apisix.proxy_cache` (proxy-cache);
//! - `ferrisix_router::VarSource`, `ferrisix_router::Expr`: reading request variables and
//!   evaluating compiled expressions;
//! - `ferrisix_net`: serving a port of the plugin's own (prometheus' export server) with the
//!   gateway's connection limits and drain, and its log helpers (`Repeats`, `clip`) for
//!   warnings that could otherwise flood the log (one line per interval with a count, client
//!   text cut short).
//!
//! The rest of `ferrisix-plugins` (the registry, the chains, the consumer set) and tests
//! may also use:
//!
//! - `ferrisix_config::validate`: the registry answers its `PluginCheck`;
//! - `ferrisix_config::model`, `ferrisix_config::encrypt`, `ferrisix_config::env`,
//!   `ferrisix_config::secret`: resources, their encrypted fields and secret references, as
//!   the consumer set reads them;
//! - `ferrisix_config::state`: the store's states, which the secret resolution (`secrets`)
//!   rewrites with the references' values before the compile;
//! - `ferrisix_config::pem`, `ferrisix_config::proto` (protos for grpc-transcode),
//!   `ferrisix_config::test_support`: in tests only.
//!
//! `ferrisix-plugins`' `boundary` test holds its code and its `Cargo.toml` to these lists.
#![forbid(unsafe_code)]

pub mod answer;
pub mod chash;
pub mod clock;
pub mod compile;
pub mod consumers;
pub mod ctx;
pub mod def;
pub mod error_log;
pub mod exec;
pub mod exit;
pub mod ext_runner;
pub mod head;
pub mod http_client;
pub mod key;
pub mod keyed;
pub mod log;
pub mod plugin;
pub mod response;
pub mod roundrobin;
pub mod services;
pub mod shutdown;
pub mod state;
pub mod stats;
pub mod template;
pub mod testing;
pub mod tls_client;
pub mod upstream;
pub mod vars;

pub use answer::{AnswerBody, UpstreamAnswer};
pub use clock::Clock;
pub use compile::{ApiAnswer, ApiHandler, ApiMaker, CompileCtx, PluginApi, PluginApis};
pub use consumers::{AuthDef, ConsumerIndex, Credential, Prepared};
pub use ctx::{
    BodyError, Consumer, NodeTimeouts, Owner, PendingBody, PluginCtx, RequestBody, RequestGuards,
    RequestState, RequestValues, ResponseHeaders, RouteInfo, UpstreamEdits, UpstreamTries,
};
pub use def::{
    CheckCtx, CheckFn, CompileFn, PluginDef, PluginKind, RunPolicy, SchemaErrorFn, Scope,
};
pub use error_log::ErrorLogTap;
pub use exec::Executor;
pub use exit::Exit;
pub use ext_runner::ExtRunner;
/// The snapshot's compiled `protos` (the config crate compiles them; plugins read them here).
pub use ferrisix_config::proto::Protos;
pub use head::{ConnFacts, ProxiedAddrs, RequestHead};
pub use http_client::{HttpClient, HttpError, KeepAlive};
pub use key::{KeySpec, KeyValue};
pub use keyed::{KeyRef, Keyed, OwnedKey, Slot};
pub use log::{
    preset_var, union_var_names, LateVarSource, LateVars, LogCtx, LogNeeds, LogVars,
    ResponseSource, VarNames,
};
pub use plugin::{Flow, PhaseFuture, Phases, Plugin, Step};
pub use response::{BodyChunk, BodyEdits, BodyFilter, BodyFilters, ResponseHead, WholeBody};
pub use services::{LogReopen, PluginServices, SharedState};
pub use shutdown::{Shutdown, ShutdownHold};
pub use state::{Lease, Retain, StateMap};
pub use stats::{ConnStats, ConnTotals};
pub use template::Template;
pub use tls_client::TlsClient;
pub use upstream::{NoUpstreams, UpstreamRef, UpstreamResolver};
pub use vars::RequestVars;
