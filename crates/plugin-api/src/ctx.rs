//! The per-request context as plugins see it.
//!
//! The proxy owns one context per request (pingora's `CTX`) and carries it through every phase.
//! Plugins get a [`PluginCtx`]: a view that reads the request head and every variable, and
//! writes only what APISIX lets a plugin change: the request that goes upstream (headers,
//! method, URI, Host, query), `$remote_addr`, the consumer, the upstream, the body size limit,
//! per-request plugin state, the headers added to whatever answer ends the request, and guards
//! dropped when the request ends. The plugin-owned part of the context is a [`RequestState`],
//! which the proxy keeps between phases and reads back after them.

use std::any::{Any, TypeId};
use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ferrisix_config::model::ResourceKind;
use ferrisix_router::VarSource;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use http_body_util::BodyExt;
use smallvec::SmallVec;

pub use crate::consumers::Consumer;
use crate::consumers::{ConsumerIndex, Credential};
use crate::head::RequestHead;
use crate::upstream::UpstreamRef;
use crate::vars::RequestVars;

/// The matched route as plugins see it, built once per snapshot by the proxy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
///
/// One per route (100,000 of them in a large configuration), so it is compact: the id is
/// shared with access-log records (logging a request copies a pointer), the lists are exact.
pub struct RouteInfo {
    pub id: Arc<str>,
    pub name: Option<Box<str>>,
    pub service_id: Option<Box<str>>,
    pub service_name: Option<Box<str>>,
    /// The route's `uri`/`uris`, in order (the router reports which one matched).
    pub uris: Box<[String]>,
    /// The hosts used for matching (the route's, else its service's).
    pub hosts: Box<[String]>,
}

impl RouteInfo {
    /// Position of the matched pattern in `uris`, `None` if it is not one of them.
    pub fn uri_index(&self, matched: &str) -> Option<usize> {
        self.uris.iter().position(|u| u == matched)
    }

    pub fn host_index(&self, matched: &str) -> Option<usize> {
        self.hosts.iter().position(|h| h == matched)
    }
}

/// The resource that holds a plugin configuration: APISIX's `_meta.parent.resource_key`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Owner {
    /// `/apisix/routes/1`, `/apisix/services/2`, `/apisix/plugin_configs/3`,
    /// `/apisix/global_rules/4`, `/apisix/consumers/jack`.
    pub key: String,
}

impl Owner {
    pub fn new(kind: ResourceKind, id: &str) -> Owner {
        Owner {
            key: format!("/apisix/{}/{}", kind.dir(), id),
        }
    }
}

/// What plugins changed in the request that goes upstream (headers are edited in place).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpstreamEdits {
    pub method: Option<Method>,
    /// The upstream path, without the query (`$upstream_uri` before the query is added).
    pub path: Option<String>,
    /// The query sent upstream: `Some(None)` removes it.
    pub query: Option<Option<String>>,
    /// `Host` sent upstream, replacing what `pass_host` would choose.
    pub host: Option<HeaderValue>,
}

impl UpstreamEdits {
    pub fn is_empty(&self) -> bool {
        self.method.is_none() && self.path.is_none() && self.query.is_none() && self.host.is_none()
    }
}

/// Why a request body could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BodyError {
    /// The client went away or sent a broken body (nginx: 400).
    Broken(String),
    /// The client stalled (nginx: 408).
    Timeout,
    /// The body passed the limit; this many bytes were read (still forwarded).
    TooLarge(usize),
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyError::Broken(e) => write!(f, "failed to read the request body: {e}"),
            BodyError::Timeout => f.write_str("client timed out sending the request body"),
            BodyError::TooLarge(n) => {
                write!(f, "request body larger than the limit ({n} bytes read)")
            }
        }
    }
}

impl std::error::Error for BodyError {}

/// A request body still to be read from the client.
pub type PendingBody = Pin<Box<dyn http_body::Body<Data = Bytes, Error = BodyError> + Send>>;

/// The request body as the request phases hold it: read once, then forwarded from here.
#[derive(Default)]
pub enum RequestBody {
    /// No body (or none yet handed over: requests on routes without plugins keep theirs in
    /// the proxy).
    #[default]
    Empty,
    Unread(PendingBody),
    /// Read completely.
    Buffered(Bytes),
    /// Read up to a limit; the rest follows from the client.
    Partial {
        read: Bytes,
        rest: PendingBody,
    },
    /// Reading failed; the proxy answers for it.
    Failed(BodyError),
}

impl fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestBody::Empty => f.write_str("Empty"),
            RequestBody::Unread(_) => f.write_str("Unread"),
            RequestBody::Buffered(b) => write!(f, "Buffered({})", b.len()),
            RequestBody::Partial { read, .. } => write!(f, "Partial({}..)", read.len()),
            RequestBody::Failed(e) => write!(f, "Failed({e})"),
        }
    }
}

/// nginx's `client_body_timeout` default: the longest gap between two reads of the body.
const BODY_READ_GAP: Duration = Duration::from_secs(60);

impl RequestBody {
    /// Reads the body up to `limit` bytes, once, waiting at most `gap` between two reads;
    /// later calls answer what was read.
    pub async fn read(&mut self, limit: usize, gap: Duration) -> Result<&Bytes, BodyError> {
        if let RequestBody::Unread(_) = self {
            let RequestBody::Unread(mut body) = std::mem::take(self) else {
                unreachable!("checked above")
            };
            let mut buf = BytesMut::new();
            *self = loop {
                match tokio::time::timeout(gap, body.frame()).await {
                    Ok(Some(Ok(frame))) => {
                        if let Ok(data) = frame.into_data() {
                            buf.extend_from_slice(&data);
                            if buf.len() > limit {
                                break RequestBody::Partial {
                                    read: buf.freeze(),
                                    rest: body,
                                };
                            }
                        }
                    }
                    Ok(None) => break RequestBody::Buffered(buf.freeze()),
                    Ok(Some(Err(e))) => break RequestBody::Failed(e),
                    Err(_) => break RequestBody::Failed(BodyError::Timeout),
                }
            };
        }
        if let RequestBody::Empty = self {
            *self = RequestBody::Buffered(Bytes::new());
        }
        match &*self {
            RequestBody::Buffered(b) if b.len() <= limit => Ok(b),
            RequestBody::Buffered(b) => Err(BodyError::TooLarge(b.len())),
            RequestBody::Partial { read, .. } => Err(BodyError::TooLarge(read.len())),
            RequestBody::Failed(e) => Err(e.clone()),
            RequestBody::Empty | RequestBody::Unread(_) => unreachable!("read above"),
        }
    }

    /// The body, when it was read completely.
    pub fn buffered(&self) -> Option<&Bytes> {
        match self {
            RequestBody::Buffered(b) => Some(b),
            _ => None,
        }
    }
}

/// Values owned by one request and dropped when it ends; their `Drop` is their cleanup, so it
/// runs exactly once whatever way the request ends. Empty costs no allocation.
#[derive(Default)]
pub struct RequestGuards(Vec<Box<dyn Send + Sync>>);

impl RequestGuards {
    pub fn push(&mut self, guard: Box<dyn Send + Sync>) {
        self.0.push(guard);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl fmt::Debug for RequestGuards {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestGuards({})", self.0.len())
    }
}

/// Headers plugins set on the response. A few fit inline, so setting them allocates nothing
/// beyond their values.
#[derive(Clone, Debug, Default)]
pub struct ResponseHeaders(SmallVec<[(HeaderName, HeaderValue); 4]>);

impl ResponseHeaders {
    /// Sets `name`, replacing earlier values (`core.response.set_header`).
    pub fn insert(&mut self, name: HeaderName, value: HeaderValue) {
        self.0.retain(|(n, _)| *n != name);
        self.0.push((name, value));
    }

    /// Adds a value to `name` (`core.response.add_header`).
    pub fn append(&mut self, name: HeaderName, value: HeaderValue) {
        self.0.push((name, value));
    }

    pub fn get(&self, name: &str) -> Option<&HeaderValue> {
        self.0
            .iter()
            .find(|(n, _)| n.as_str().eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&HeaderName, &HeaderValue)> {
        self.0.iter().map(|(n, v)| (n, v))
    }

    /// Puts the headers on a response: each name replaces the response's own values.
    pub fn apply(self, to: &mut HeaderMap) {
        let mut set: SmallVec<[HeaderName; 4]> = SmallVec::new();
        for (name, value) in self.0 {
            if set.contains(&name) {
                to.append(name, value);
            } else {
                set.push(name.clone());
                to.insert(name, value);
            }
        }
    }
}

impl std::ops::Index<&str> for ResponseHeaders {
    type Output = HeaderValue;

    fn index(&self, name: &str) -> &HeaderValue {
        self.get(name).unwrap_or_else(|| panic!("no header {name}"))
    }
}

/// Per-request plugin-private values by type (cors remembers the allowed origin for its
/// header filter; opentelemetry its span for the log phase). Empty costs no allocation.
#[derive(Default)]
pub struct RequestValues(Vec<(TypeId, Box<dyn Any + Send + Sync>)>);

impl fmt::Debug for RequestValues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestValues({})", self.0.len())
    }
}

impl RequestValues {
    /// The value of type `T`, if one was kept.
    pub fn get<T: Any>(&self) -> Option<&T> {
        let id = TypeId::of::<T>();
        self.0
            .iter()
            .find(|(t, _)| *t == id)
            .and_then(|(_, v)| v.downcast_ref())
    }

    fn get_mut<T: Any>(&mut self) -> Option<&mut T> {
        let id = TypeId::of::<T>();
        self.0
            .iter_mut()
            .find(|(t, _)| *t == id)
            .and_then(|(_, v)| v.downcast_mut())
    }

    /// Keeps `value`, replacing the one of its type (the proxy's side; tests build a
    /// [`crate::LogCtx`]'s values with it).
    pub fn insert<T: Any + Send + Sync>(&mut self, value: T) {
        let id = TypeId::of::<T>();
        match self.0.iter_mut().find(|(t, _)| *t == id) {
            Some(slot) => slot.1 = Box::new(value),
            None => self.0.push((id, Box::new(value))),
        }
    }
}

/// The timeouts of one try on an upstream node (nginx's `proxy_*_timeout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeTimeouts {
    pub connect: Duration,
    pub send: Duration,
    pub read: Duration,
}

/// The plugin-owned part of one request's context, kept by the proxy between phases. The
/// accessors that take it apart are the proxy's side of the API.
pub struct RequestState {
    remote_addr: IpAddr,
    /// `$remote_port` as real-ip set it.
    remote_port: Option<u16>,
    matched_uri: Option<u16>,
    matched_host: Option<u16>,
    upstream: UpstreamEdits,
    consumer: Option<Arc<Consumer>>,
    /// The snapshot's consumers, for routes whose plugins authenticate.
    consumers: Option<Arc<ConsumerIndex>>,
    upstream_choice: Option<UpstreamRef>,
    body: RequestBody,
    max_body_size: Option<u64>,
    response_headers: ResponseHeaders,
    private: RequestValues,
    guards: RequestGuards,
    upstream_node: Option<SocketAddr>,
    upstream_timeouts: Option<NodeTimeouts>,
    body_timeout: Duration,
    /// `$uri` after a plugin changed it (proxy-rewrite's `ngx.req.set_uri`).
    uri: Option<String>,
    /// `proxy_request_buffering` as a plugin set it (proxy-control); `None`: the gateway's.
    request_buffering: Option<bool>,
    /// The body of the exit a plugin answers with in place of the upstream, relayed as it
    /// arrives (ai-proxy's streamed answers).
    /// In a mutex only so that the state stays `Sync` (a body is `Send` alone); never
    /// contended: one request's phases run one after the other.
    exit_stream: std::sync::Mutex<Option<PendingBody>>,
}

impl fmt::Debug for RequestState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestState")
            .field("remote_addr", &self.remote_addr)
            .field("upstream", &self.upstream)
            .field("consumer", &self.consumer.as_ref().map(|c| &c.username))
            .field("body", &self.body)
            .finish_non_exhaustive()
    }
}

impl RequestState {
    pub fn new(remote_addr: IpAddr) -> RequestState {
        RequestState {
            remote_addr,
            remote_port: None,
            matched_uri: None,
            matched_host: None,
            upstream: UpstreamEdits::default(),
            consumer: None,
            consumers: None,
            upstream_choice: None,
            body: RequestBody::Empty,
            max_body_size: None,
            response_headers: ResponseHeaders::default(),
            private: RequestValues::default(),
            guards: RequestGuards::default(),
            upstream_node: None,
            upstream_timeouts: None,
            body_timeout: BODY_READ_GAP,
            uri: None,
            request_buffering: None,
            exit_stream: std::sync::Mutex::new(None),
        }
    }

    /// The streamed body of the exit that ends the request, if a plugin set one.
    pub fn take_exit_stream(&mut self) -> Option<PendingBody> {
        self.exit_stream
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// `$uri` as a plugin set it, if one did.
    pub fn uri(&self) -> Option<&str> {
        self.uri.as_deref()
    }

    /// Whether the body is read completely before the request goes upstream (`Some(false)`:
    /// streamed as it arrives), when a plugin decided it.
    pub fn request_buffering(&self) -> Option<bool> {
        self.request_buffering
    }

    /// nginx's `client_body_timeout` for the plugins' body reads.
    pub fn set_body_timeout(&mut self, timeout: Duration) {
        self.body_timeout = timeout;
    }

    pub fn body_timeout(&self) -> Duration {
        self.body_timeout
    }

    /// Which of the route's `uris` and `hosts` matched (indexes into [`RouteInfo`]).
    pub fn set_matched(&mut self, uri: Option<u16>, host: Option<u16>) {
        self.matched_uri = uri;
        self.matched_host = host;
    }

    pub fn matched(&self) -> (Option<u16>, Option<u16>) {
        (self.matched_uri, self.matched_host)
    }

    pub fn remote_addr(&self) -> IpAddr {
        self.remote_addr
    }

    /// `$remote_port` when real-ip set it (else the connection's port applies).
    pub fn remote_port(&self) -> Option<u16> {
        self.remote_port
    }

    pub fn set_body(&mut self, body: RequestBody) {
        self.body = body;
    }

    pub fn take_body(&mut self) -> RequestBody {
        std::mem::take(&mut self.body)
    }

    pub fn body(&self) -> &RequestBody {
        &self.body
    }

    pub fn body_mut(&mut self) -> &mut RequestBody {
        &mut self.body
    }

    pub fn upstream_edits(&self) -> &UpstreamEdits {
        &self.upstream
    }

    pub fn chosen_upstream(&self) -> Option<&UpstreamRef> {
        self.upstream_choice.as_ref()
    }

    pub fn consumer(&self) -> Option<&Arc<Consumer>> {
        self.consumer.as_ref()
    }

    /// The consumers auth plugins look credentials up in (the request's snapshot's).
    pub fn set_consumers(&mut self, consumers: Arc<ConsumerIndex>) {
        self.consumers = Some(consumers);
    }

    pub fn max_body_size(&self) -> Option<u64> {
        self.max_body_size
    }

    /// The node picked for the first try; set before `before_proxy`.
    pub fn set_upstream_node(&mut self, node: SocketAddr) {
        self.upstream_node = Some(node);
    }

    /// The timeouts a try on the picked node runs under (the route's, else the upstream's);
    /// set with the node, for plugins that send the request themselves ([`crate::Phases::NODE`]).
    pub fn set_upstream_timeouts(&mut self, timeouts: NodeTimeouts) {
        self.upstream_timeouts = Some(timeouts);
    }

    pub fn take_response_headers(&mut self) -> ResponseHeaders {
        std::mem::take(&mut self.response_headers)
    }

    pub fn response_headers(&self) -> &ResponseHeaders {
        &self.response_headers
    }

    /// The value of type `T` a plugin kept for this request ([`PluginCtx::insert`]), for the
    /// proxy's side (kafka-proxy's credentials for a kafka upstream).
    pub fn value<T: Any>(&self) -> Option<&T> {
        self.private.get()
    }

    /// The values plugins kept for this request, for the log phase (`None` when there are
    /// none, which allocates nothing).
    pub fn take_values(&mut self) -> Option<Arc<RequestValues>> {
        if self.private.0.is_empty() {
            return None;
        }
        Some(Arc::new(std::mem::take(&mut self.private)))
    }

    pub fn take_guards(&mut self) -> RequestGuards {
        std::mem::take(&mut self.guards)
    }

    pub fn has_guards(&self) -> bool {
        !self.guards.is_empty()
    }
}

/// The upstream tries made so far, as the response phases see them: nginx's `$upstream_addr`,
/// `$upstream_status` and `$upstream_response_time` (every try, in order) and APISIX's
/// `$balancer_ip` and `$balancer_port` (the last node picked).
#[derive(Clone, Copy, Debug, Default)]
pub struct UpstreamTries<'a> {
    pub addrs: &'a [SocketAddr],
    pub statuses: &'a [u16],
    /// How long each finished try took; a try whose answer is still on its way has none yet
    /// (nginx sets it when the request is finalized, so its headers show `-`).
    pub times: &'a [Duration],
}

impl UpstreamTries<'_> {
    fn var(&self, name: &str) -> Option<Option<String>> {
        fn list<T: fmt::Display>(items: &[T]) -> Option<String> {
            if items.is_empty() {
                return None;
            }
            let text: Vec<String> = items.iter().map(T::to_string).collect();
            Some(text.join(", "))
        }
        Some(match name {
            // APISIX keeps an IPv6 node's host in brackets.
            "balancer_ip" => self.addrs.last().map(|a| match a {
                SocketAddr::V4(a) => a.ip().to_string(),
                SocketAddr::V6(a) => format!("[{}]", a.ip()),
            }),
            "balancer_port" => self.addrs.last().map(|a| a.port().to_string()),
            "upstream_addr" => list(self.addrs),
            "upstream_status" => list(self.statuses),
            "upstream_response_time" => {
                let times: Vec<String> = (0..self.addrs.len())
                    .map(|i| match self.times.get(i) {
                        // nginx's `%T.%03M`: seconds and milliseconds, truncated.
                        Some(t) => format!("{}.{:03}", t.as_secs(), t.subsec_millis()),
                        None => "-".to_owned(),
                    })
                    .collect();
                list(&times)
            }
            _ => return None,
        })
    }
}

/// One request as a plugin sees it in a phase.
pub struct PluginCtx<'r> {
    head: RequestHead<'r>,
    headers: &'r mut HeaderMap,
    route: Option<&'r RouteInfo>,
    state: &'r mut RequestState,
    /// The response phases only.
    upstream: Option<UpstreamTries<'r>>,
}

impl<'r> PluginCtx<'r> {
    /// The proxy's constructor: the client's head, its (editable) headers, the matched route
    /// and the request's plugin state.
    pub fn new(
        head: RequestHead<'r>,
        headers: &'r mut HeaderMap,
        route: Option<&'r RouteInfo>,
        state: &'r mut RequestState,
    ) -> PluginCtx<'r> {
        PluginCtx {
            head,
            headers,
            route,
            state,
            upstream: None,
        }
    }

    /// The proxy's, for the response phases: the upstream tries behind the answer.
    pub fn with_upstream_tries(mut self, tries: UpstreamTries<'r>) -> PluginCtx<'r> {
        self.upstream = Some(tries);
        self
    }

    /// The client's method.
    pub fn method(&self) -> &Method {
        self.head.method
    }

    /// `$uri`: the normalised path, or what a plugin set it to ([`PluginCtx::set_uri`]).
    pub fn uri(&self) -> &str {
        self.state.uri.as_deref().unwrap_or(self.head.path)
    }

    /// Changes `$uri` for every later plugin (`ngx.req.set_uri`: proxy-rewrite sets it to the
    /// path it sends upstream). What goes upstream is set separately
    /// ([`PluginCtx::set_upstream_path`]).
    pub fn set_uri(&mut self, uri: String) {
        self.state.uri = Some(uri);
    }

    /// Streams the request body upstream as it arrives (`false`) instead of reading it first
    /// (`true`, nginx's `proxy_request_buffering on`); proxy-control.
    pub fn set_request_buffering(&mut self, on: bool) {
        self.state.request_buffering = Some(on);
    }

    /// `$request_uri`: the raw path and query as the client sent them.
    pub fn request_uri(&self) -> &str {
        self.head.uri.path_and_query().map_or("/", |p| p.as_str())
    }

    /// The client's query string, if any.
    pub fn query(&self) -> Option<&str> {
        self.head.uri.query()
    }

    /// A query argument (`$arg_<name>`), decoded.
    pub fn arg(&self, name: &str) -> Option<Cow<'_, str>> {
        crate::vars::query_arg(self.head.uri.query()?, name)
    }

    /// `$host`.
    pub fn host(&self) -> Option<&str> {
        self.head.host
    }

    pub fn head(&self) -> &RequestHead<'r> {
        &self.head
    }

    /// The request headers as they will go upstream (the client's, with plugins' edits).
    pub fn headers(&self) -> &HeaderMap {
        self.headers
    }

    /// One header's first value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Edits the request headers sent upstream (`core.request.set_header`): later plugins and
    /// `$http_*` see the edits.
    pub fn headers_mut(&mut self) -> &mut HeaderMap {
        self.headers
    }

    /// `$remote_addr`.
    pub fn remote_addr(&self) -> IpAddr {
        self.state.remote_addr
    }

    /// Changes `$remote_addr` for every later plugin and the upstream's `X-Real-IP` (real-ip).
    pub fn set_remote_addr(&mut self, addr: IpAddr) {
        self.state.remote_addr = addr;
    }

    /// Changes `$remote_port` for every later plugin (real-ip, with a port in its source).
    pub fn set_remote_port(&mut self, port: u16) {
        self.state.remote_port = Some(port);
    }

    /// The matched route; `None` for a request that matched none (global rules only).
    pub fn route(&self) -> Option<&'r RouteInfo> {
        self.route
    }

    /// The pattern of the route's `uris` that matched (`""` when unknown).
    pub fn matched_uri(&self) -> &str {
        match (self.route, self.state.matched_uri) {
            (Some(r), Some(i)) => r.uris.get(i as usize).map_or("", String::as_str),
            _ => "",
        }
    }

    pub fn matched_host(&self) -> &str {
        match (self.route, self.state.matched_host) {
            (Some(r), Some(i)) => r.hosts.get(i as usize).map_or("", String::as_str),
            _ => "",
        }
    }

    /// What plugins changed so far in the request sent upstream.
    pub fn upstream_edits(&self) -> &UpstreamEdits {
        &self.state.upstream
    }

    pub fn set_upstream_method(&mut self, method: Method) {
        self.state.upstream.method = Some(method);
    }

    /// The path sent upstream (without the query).
    pub fn set_upstream_path(&mut self, path: String) {
        self.state.upstream.path = Some(path);
    }

    /// The query sent upstream (`None`: none).
    pub fn set_upstream_query(&mut self, query: Option<String>) {
        self.state.upstream.query = Some(query);
    }

    /// The `Host` header sent upstream.
    pub fn set_upstream_host(&mut self, host: HeaderValue) {
        self.state.upstream.host = Some(host);
    }

    /// `$upstream_uri` as it stands: the edited path and query, else the client's.
    pub fn upstream_uri(&self) -> Cow<'_, str> {
        let e = &self.state.upstream;
        if e.path.is_none() && e.query.is_none() {
            return Cow::Borrowed(self.request_uri());
        }
        let path = e.path.as_deref().unwrap_or(self.head.uri.path());
        let query = match &e.query {
            Some(q) => q.as_deref(),
            None => self.head.uri.query(),
        };
        Cow::Owned(match query {
            Some(q) => format!("{path}?{q}"),
            None => path.to_owned(),
        })
    }

    /// The consumer an auth plugin attached.
    pub fn consumer(&self) -> Option<&Arc<Consumer>> {
        self.state.consumer.as_ref()
    }

    /// APISIX's `consumer.attach_consumer`: the consumer becomes `ctx.consumer` and the
    /// upstream hears who it is: `X-Consumer-Username`, `X-Credential-Identifier` and
    /// `X-Consumer-Custom-ID` are set, or removed when the consumer has none (a client cannot
    /// pass its own).
    pub fn attach_consumer(&mut self, consumer: Arc<Consumer>) {
        fn set(headers: &mut HeaderMap, name: &'static str, value: Option<&str>) {
            let name = HeaderName::from_static(name);
            match value.and_then(|v| HeaderValue::from_str(v).ok()) {
                Some(v) => {
                    headers.insert(name, v);
                }
                None => {
                    headers.remove(name);
                }
            }
        }
        set(
            self.headers,
            "x-consumer-username",
            Some(consumer.username.as_str()),
        );
        set(
            self.headers,
            "x-credential-identifier",
            consumer.credential_id.as_deref(),
        );
        set(
            self.headers,
            "x-consumer-custom-id",
            consumer.custom_id.as_deref(),
        );
        self.state.consumer = Some(consumer);
    }

    /// The consumers of the request's snapshot; `None` when no plugin of the request
    /// authenticates (the proxy hands them only to routes that need them).
    pub fn consumers(&self) -> Option<&ConsumerIndex> {
        self.state.consumers.as_deref()
    }

    /// The credential of auth plugin `plugin` whose key is `key` (one hash lookup).
    pub fn find_credential(&self, plugin: &str, key: &str) -> Option<&Arc<Credential>> {
        self.consumers()?.find(plugin, key)
    }

    /// Sends the request to another upstream than the route's (traffic-split). The handle
    /// comes from [`crate::CompileCtx::upstreams`] at compile time.
    pub fn choose_upstream(&mut self, upstream: UpstreamRef) {
        self.state.upstream_choice = Some(upstream);
    }

    /// The node picked for the first try (`before_proxy` only).
    pub fn upstream_node(&self) -> Option<SocketAddr> {
        self.state.upstream_node
    }

    /// The timeouts of a try on [`PluginCtx::upstream_node`] (`before_proxy` of a plugin with
    /// [`crate::Phases::NODE`] only).
    pub fn upstream_timeouts(&self) -> Option<NodeTimeouts> {
        self.state.upstream_timeouts
    }

    /// Reads the request body up to `limit` bytes (once; it is still forwarded upstream).
    pub async fn read_body(&mut self, limit: usize) -> Result<&Bytes, BodyError> {
        let gap = self.state.body_timeout;
        self.state.body.read(limit, gap).await
    }

    /// The body, when some plugin read it completely already.
    pub fn body(&self) -> Option<&Bytes> {
        self.state.body.buffered()
    }

    /// What has been read of the body: all of it, or, when [`PluginCtx::read_body`] stopped at
    /// its limit, the part read so far (the rest still follows from the client and goes
    /// upstream after it). chaitin-waf sends the engine the first `req_body_size` bytes of a
    /// body of any size.
    pub fn body_read(&self) -> Option<&Bytes> {
        match &self.state.body {
            RequestBody::Buffered(b) | RequestBody::Partial { read: b, .. } => Some(b),
            _ => None,
        }
    }

    /// Replaces the body sent upstream (`ngx.req.set_body_data`); the proxy sets its
    /// Content-Length from it.
    pub fn set_body(&mut self, body: Bytes) {
        self.state.body = RequestBody::Buffered(body);
    }

    /// Whether the body is a form as APISIX's `post_arg_*` variables read it: a Content-Type
    /// starting with `application/x-www-form-urlencoded` (a charset may follow).
    pub fn has_form_body(&self) -> bool {
        self.header("content-type")
            .is_some_and(|ct| ct.starts_with("application/x-www-form-urlencoded"))
    }

    /// `post_arg_<name>`: the first field `name` of a form body that was read completely
    /// (see [`PluginCtx::has_form_body`]); `None` before the body is read.
    pub fn post_arg(&self, name: &str) -> Option<Cow<'_, str>> {
        if !self.has_form_body() {
            return None;
        }
        crate::vars::form_arg(self.body()?, name).map(Cow::Owned)
    }

    /// Replaces the request body (read or not) with `body`: the later phases read it, and it
    /// goes upstream (the caller sets its `Content-Length`).
    pub fn replace_body(&mut self, body: Bytes) {
        self.state.body = RequestBody::Buffered(body);
    }

    /// The exit this phase returns sends `body` as it arrives instead of its own `body`
    /// (a plugin that answers in place of the upstream relays the provider's stream).
    pub fn set_exit_stream(&mut self, body: PendingBody) {
        *self
            .state
            .exit_stream
            .get_mut()
            .unwrap_or_else(|e| e.into_inner()) = Some(body);
    }

    /// Refuses bodies larger than `bytes` with 413 (`client_max_body_size`).
    pub fn set_max_body_size(&mut self, bytes: u64) {
        self.state.max_body_size = Some(bytes);
    }

    /// Headers added to whatever answer ends this request (`core.response.set_header` in the
    /// request phases): the upstream's, an exit, or the 404.
    pub fn response_headers_mut(&mut self) -> &mut ResponseHeaders {
        &mut self.state.response_headers
    }

    pub fn response_headers(&self) -> &ResponseHeaders {
        &self.state.response_headers
    }

    /// A value dropped when the request ends (after its log phase), whatever way it ends.
    pub fn add_guard(&mut self, guard: Box<dyn Send + Sync>) {
        self.state.guards.push(guard);
    }

    /// This request's value of type `T`, set by [`PluginCtx::insert`].
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.state.private.get()
    }

    pub fn get_mut<T: Any>(&mut self) -> Option<&mut T> {
        self.state.private.get_mut()
    }

    /// Keeps `value` for the later phases of this request (one value per type).
    pub fn insert<T: Any + Send + Sync>(&mut self, value: T) {
        self.state.private.insert(value);
    }

    fn request_vars(&self) -> RequestVars<'_> {
        RequestVars {
            head: &self.head,
            headers: self.headers,
            remote_addr: self.state.remote_addr,
            remote_port: self.state.remote_port,
        }
    }
}

impl VarSource for PluginCtx<'_> {
    /// The request's variables plus the ones APISIX adds once a route matched (`route_id`,
    /// `service_id`, ...) or a consumer was found (`consumer_name`, `consumer_group_id`), and
    /// `post_arg_*` once the body was read.
    fn var(&self, name: &str) -> Option<Cow<'_, str>> {
        let route = self.route;
        match name {
            "route_id" => route.map(|r| Cow::Borrowed(&*r.id)),
            "route_name" => route.and_then(|r| r.name.as_deref()).map(Cow::Borrowed),
            "service_id" => route
                .and_then(|r| r.service_id.as_deref())
                .map(Cow::Borrowed),
            "service_name" => route
                .and_then(|r| r.service_name.as_deref())
                .map(Cow::Borrowed),
            "consumer_name" => self
                .state
                .consumer
                .as_deref()
                .map(|c| Cow::Borrowed(c.username.as_str())),
            "consumer_group_id" => self
                .state
                .consumer
                .as_deref()
                .and_then(|c| c.group_id.as_deref())
                .map(Cow::Borrowed),
            "upstream_uri" => Some(self.upstream_uri()),
            "matched_uri" => Some(Cow::Borrowed(self.matched_uri())),
            "uri" => Some(Cow::Borrowed(self.uri())),
            _ => match name.strip_prefix("post_arg_") {
                Some(field) => self.post_arg(field),
                None => match self.upstream.as_ref().and_then(|u| u.var(name)) {
                    Some(value) => value.map(Cow::Owned),
                    None => self.request_vars().get(name),
                },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderName;

    use super::*;
    use crate::testing::TestRequest;

    #[test]
    fn upstream_tries_in_the_response_phases() {
        let addrs: Vec<SocketAddr> = vec![
            "10.0.0.1:80".parse().unwrap(),
            "[::1]:8080".parse().unwrap(),
        ];
        let tries = UpstreamTries {
            addrs: &addrs,
            statuses: &[502, 200],
            times: &[Duration::from_micros(1_234_567)],
        };
        let mut req = TestRequest::get("/");
        let ctx = req.ctx().with_upstream_tries(tries);
        let var = |n: &str| ctx.var(n).map(|v| v.into_owned());
        assert_eq!(var("balancer_ip").as_deref(), Some("[::1]"));
        assert_eq!(var("balancer_port").as_deref(), Some("8080"));
        assert_eq!(
            var("upstream_addr").as_deref(),
            Some("10.0.0.1:80, [::1]:8080")
        );
        assert_eq!(var("upstream_status").as_deref(), Some("502, 200"));
        assert_eq!(var("upstream_response_time").as_deref(), Some("1.234, -"));
        assert_eq!(var("uri").as_deref(), Some("/"));
        // Before any try, and in the request phases, they are unset.
        let ctx = req.ctx().with_upstream_tries(UpstreamTries::default());
        assert_eq!(ctx.var("balancer_ip"), None);
        assert_eq!(ctx.var("upstream_response_time"), None);
        assert_eq!(req.ctx().var("upstream_addr"), None);
    }

    #[test]
    fn response_headers_insert_replaces_and_append_adds() {
        let mut h = ResponseHeaders::default();
        let name = |n: &'static str| HeaderName::from_static(n);
        h.insert(name("x-a"), HeaderValue::from_static("1"));
        h.append(name("x-b"), HeaderValue::from_static("1"));
        h.append(name("x-b"), HeaderValue::from_static("2"));
        h.insert(name("x-c"), HeaderValue::from_static("1"));
        h.insert(name("x-b"), HeaderValue::from_static("3"));
        h.insert(name("x-a"), HeaderValue::from_static("4"));
        let all: Vec<(&str, &str)> = h
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(all, [("x-c", "1"), ("x-b", "3"), ("x-a", "4")]);
    }

    #[test]
    fn owner_keys() {
        assert_eq!(
            Owner::new(ResourceKind::Routes, "1").key,
            "/apisix/routes/1"
        );
        assert_eq!(
            Owner::new(ResourceKind::GlobalRules, "g").key,
            "/apisix/global_rules/g"
        );
    }

    #[test]
    fn edits_are_seen_by_later_plugins() {
        let route = RouteInfo {
            id: "r1".into(),
            service_id: Some("s1".into()),
            uris: vec!["/a/*".into()].into(),
            ..Default::default()
        };
        let mut req = TestRequest::get("/a/b?x=1").route(route);
        req.state.set_matched(Some(0), None);
        let mut ctx = req.ctx();
        assert_eq!(ctx.var("route_id").as_deref(), Some("r1"));
        assert_eq!(ctx.var("service_id").as_deref(), Some("s1"));
        assert_eq!(ctx.matched_uri(), "/a/*");
        assert_eq!(ctx.var("upstream_uri").as_deref(), Some("/a/b?x=1"));
        ctx.headers_mut().insert(
            HeaderName::from_static("x-added"),
            HeaderValue::from_static("v"),
        );
        assert_eq!(ctx.var("http_x_added").as_deref(), Some("v"));
        ctx.set_remote_addr("10.1.1.1".parse().unwrap());
        assert_eq!(ctx.var("remote_addr").as_deref(), Some("10.1.1.1"));
        ctx.set_upstream_path("/b".into());
        assert_eq!(ctx.upstream_uri(), "/b?x=1");
        ctx.set_upstream_query(None);
        assert_eq!(ctx.upstream_uri(), "/b");
        assert_eq!(ctx.var("consumer_name"), None);
        ctx.attach_consumer(Arc::new(Consumer {
            username: "jack".into(),
            group_id: Some("g".into()),
            ..Default::default()
        }));
        assert_eq!(ctx.var("consumer_name").as_deref(), Some("jack"));
        assert_eq!(ctx.var("consumer_group_id").as_deref(), Some("g"));
        // Per-request plugin state by type.
        #[derive(Debug, PartialEq)]
        struct Origin(&'static str);
        assert_eq!(ctx.get::<Origin>(), None);
        ctx.insert(Origin("a"));
        ctx.insert(Origin("b"));
        assert_eq!(ctx.get::<Origin>(), Some(&Origin("b")));
        ctx.response_headers_mut().insert(
            HeaderName::from_static("x-r"),
            HeaderValue::from_static("1"),
        );
        ctx.set_max_body_size(10);
        assert_eq!(req.state.max_body_size(), Some(10));
        assert_eq!(req.state.upstream_edits().path.as_deref(), Some("/b"));
        assert_eq!(req.state.take_response_headers().len(), 1);
        assert_eq!(
            req.state.remote_addr(),
            "10.1.1.1".parse::<IpAddr>().unwrap()
        );
    }

    /// A body of ready chunks.
    struct Chunks(std::collections::VecDeque<Bytes>);

    impl http_body::Body for Chunks {
        type Data = Bytes;
        type Error = BodyError;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BodyError>>> {
            std::task::Poll::Ready(
                self.get_mut()
                    .0
                    .pop_front()
                    .map(|b| Ok(http_body::Frame::data(b))),
            )
        }
    }

    fn pending(chunks: &[&'static str]) -> PendingBody {
        Box::pin(Chunks(
            chunks
                .iter()
                .map(|c| Bytes::from_static(c.as_bytes()))
                .collect(),
        ))
    }

    #[tokio::test]
    async fn body_is_read_once_up_to_a_limit() {
        let mut body = RequestBody::Unread(pending(&["ab", "cd"]));
        assert_eq!(body.read(10, BODY_READ_GAP).await.unwrap(), "abcd");
        assert_eq!(
            body.read(10, BODY_READ_GAP).await.unwrap(),
            "abcd",
            "read once"
        );
        assert_eq!(
            body.read(3, BODY_READ_GAP).await,
            Err(BodyError::TooLarge(4))
        );
        let mut big = RequestBody::Unread(pending(&["abc", "def", "ghi"]));
        assert_eq!(
            big.read(4, BODY_READ_GAP).await,
            Err(BodyError::TooLarge(6))
        );
        let RequestBody::Partial { read, mut rest } = big else {
            panic!("the rest still follows")
        };
        assert_eq!(read, "abcdef");
        let tail = rest.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(tail, "ghi");
        let mut empty = RequestBody::Empty;
        assert_eq!(empty.read(0, BODY_READ_GAP).await.unwrap(), "");
    }
}
