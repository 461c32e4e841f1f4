//! The per-request context (pingora's `CTX`): one per request, carried through every phase,
//! from the request head to the log phase handed to the response body.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::client_body::ClientBody;
use crate::gateway::ConnInfo;
use crate::log::LogPhase;
use crate::plugins::PluginRun;
use crate::snapshot::CompiledRoute;
use ferrisix_plugin_api::{ConnFacts, PluginCtx, RequestHead, RequestState, RouteInfo};
use http::request::Parts;
use http::{Extensions, HeaderMap, HeaderValue, Method, Uri, Version};

/// `$host`, without copying the Host header when it needs no change.
#[derive(Clone, Debug, Default)]
pub enum HostName {
    #[default]
    Absent,
    /// The first `n` bytes of [`ClientHead::host_value`].
    Prefix(usize),
    /// Lower-cased or otherwise changed.
    Owned(String),
}

/// The client's request head, as it arrived; its headers are kept apart (plugins edit them).
#[derive(Debug)]
pub struct ClientHead {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    /// `$uri` when normalising changed the path (else the URI's own path is `$uri`).
    pub path: Option<String>,
    pub host: HostName,
    /// `$http_host` as a header value: the client's Host header (sharing its bytes costs no
    /// copy), else built from `:authority` or an absolute-form URI.
    pub host_value: Option<HeaderValue>,
}

impl ClientHead {
    pub fn path(&self) -> &str {
        self.path.as_deref().unwrap_or(self.uri.path())
    }

    /// `$host`.
    pub fn host(&self) -> Option<&str> {
        match &self.host {
            HostName::Absent => None,
            HostName::Prefix(n) => self
                .host_value
                .as_ref()
                .and_then(|v| v.to_str().ok())
                .and_then(|s| s.get(..*n)),
            HostName::Owned(s) => Some(s),
        }
    }

    /// The head as the plugin API names it.
    pub fn as_request_head<'a>(&'a self, conn: &'a ConnFacts) -> RequestHead<'a> {
        RequestHead {
            method: &self.method,
            uri: &self.uri,
            version: self.version,
            path: self.path(),
            host: self.host(),
            conn,
        }
    }
}

/// One request, from its head to its log phase.
pub struct RequestCtx<'c> {
    pub conn: &'c ConnInfo,
    pub started: Instant,
    pub head: ClientHead,
    /// The request headers, as they will go upstream.
    pub headers: HeaderMap,
    pub extensions: Extensions,
    /// The client's body, until it is sent upstream or handed to the plugins.
    pub body: Option<ClientBody>,
    /// `$remote_addr`.
    pub remote_addr: IpAddr,
    /// The matched route, kept while its plugins run (they may wait on I/O after the
    /// snapshot was replaced).
    pub route: Option<Arc<CompiledRoute>>,
    /// The plugin side of the request; `None` when no plugin runs for it.
    pub plugins: Option<PluginRun>,
    pub log: LogPhase,
}

impl<'c> RequestCtx<'c> {
    pub fn new(
        conn: &'c ConnInfo,
        parts: Parts,
        body: ClientBody,
        remote_addr: IpAddr,
        started: Instant,
        log: LogPhase,
    ) -> RequestCtx<'c> {
        RequestCtx {
            conn,
            started,
            head: ClientHead {
                method: parts.method,
                uri: parts.uri,
                version: parts.version,
                path: None,
                host: HostName::Absent,
                host_value: None,
            },
            headers: parts.headers,
            extensions: parts.extensions,
            body: Some(body),
            remote_addr,
            route: None,
            plugins: None,
            log,
        }
    }
}

/// A plugin's view of the request, from the context's separate parts (so the plugin state
/// and the headers can be borrowed mutably side by side).
pub fn plugin_view<'a>(
    head: &'a ClientHead,
    conn: &'a ConnFacts,
    headers: &'a mut HeaderMap,
    route: Option<&'a RouteInfo>,
    state: &'a mut RequestState,
) -> PluginCtx<'a> {
    PluginCtx::new(head.as_request_head(conn), headers, route, state)
}
