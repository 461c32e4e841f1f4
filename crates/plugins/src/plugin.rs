//! The plugin interface: APISIX's phases as trait methods, and the per-request contexts they
//! receive.
//!
//! A plugin instance is compiled once per snapshot for one configuration on one route (see
//! [`crate::chain`]); the request path only calls its phase methods. Phases that run before the
//! response (`rewrite`, `access`, `before_proxy`) may end the request with an [`Exit`] and may
//! wait on I/O: they answer [`Step::Done`] when they finished synchronously (the common case,
//! which costs no allocation) or [`Step::Wait`] with a boxed future (a Redis round trip).
//! `log` runs once the response is over, from an owned [`LogCtx`].

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_config::model::ResourceKind;
use ferrisix_router::VarSource;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use smallvec::SmallVec;

/// A set of phases, as a bit set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Phases(u8);

impl Phases {
    pub const NONE: Phases = Phases(0);
    pub const REWRITE: Phases = Phases(1);
    pub const ACCESS: Phases = Phases(1 << 1);
    pub const BEFORE_PROXY: Phases = Phases(1 << 2);
    pub const HEADER_FILTER: Phases = Phases(1 << 3);
    pub const BODY_FILTER: Phases = Phases(1 << 4);
    pub const LOG: Phases = Phases(1 << 5);

    pub const fn union(self, other: Phases) -> Phases {
        Phases(self.0 | other.0)
    }

    pub const fn contains(self, other: Phases) -> bool {
        self.0 & other.0 == other.0 && other.0 != 0
    }

    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for Phases {
    type Output = Phases;
    fn bitor(self, rhs: Phases) -> Phases {
        self.union(rhs)
    }
}

/// How a request ends early: `core.response.exit(status, body)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    pub status: StatusCode,
    /// `None`: nginx's HTML error page for the status. `Some`: this body as
    /// `text/plain; charset=utf-8` (APISIX's JSON line already ends with `\n`).
    pub body: Option<Bytes>,
}

impl Exit {
    /// An exit with nginx's page for `status`.
    pub fn status(status: StatusCode) -> Exit {
        Exit { status, body: None }
    }

    /// An exit with `{"error_msg":"<msg>"}\n`, encoded as APISIX's cjson does (no `/` escaping).
    pub fn error_msg(status: StatusCode, msg: &str) -> Exit {
        let mut body = String::with_capacity(msg.len() + 16);
        body.push_str("{\"error_msg\":");
        body.push_str(&ferrisix_config::schema::lua::cjson_encode(
            &serde_json::Value::String(msg.to_owned()),
        ));
        body.push_str("}\n");
        Exit {
            status,
            body: Some(Bytes::from(body)),
        }
    }
}

/// What a phase decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Exit(Exit),
}

/// A phase that may still be waiting on I/O.
pub type PhaseFuture<'a> = Pin<Box<dyn Future<Output = Flow> + Send + 'a>>;

/// The answer of a request phase: done now, or a future to await.
pub enum Step<'a> {
    Done(Flow),
    Wait(PhaseFuture<'a>),
}

impl Step<'_> {
    pub const CONTINUE: Step<'static> = Step::Done(Flow::Continue);
}

impl fmt::Debug for Step<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Done(flow) => f.debug_tuple("Done").field(flow).finish(),
            Step::Wait(_) => f.write_str("Wait(..)"),
        }
    }
}

/// The matched route as plugins see it, built once per snapshot by the proxy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteInfo {
    pub id: String,
    pub name: Option<String>,
    pub service_id: Option<String>,
    pub service_name: Option<String>,
    /// The route's `uri`/`uris`, in order (the router reports which one matched).
    pub uris: Vec<String>,
    /// The hosts used for matching (the route's, else its service's).
    pub hosts: Vec<String>,
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
    /// `/apisix/global_rules/4`.
    pub key: String,
}

impl Owner {
    pub fn new(kind: ResourceKind, id: &str) -> Owner {
        Owner {
            key: format!("/apisix/{}/{}", kind.dir(), id),
        }
    }
}

/// The request as the request phases see it.
pub struct PluginCtx<'a> {
    pub method: &'a Method,
    /// The normalised path (`$uri`).
    pub uri: &'a str,
    pub headers: &'a HeaderMap,
    /// `$remote_addr` after the realip rewrite.
    pub remote_addr: IpAddr,
    /// Every other request variable.
    pub vars: &'a (dyn VarSource + Sync),
    /// The matched route; `None` for a request that matched none (global rules only).
    pub route: Option<&'a RouteInfo>,
    pub matched_uri: &'a str,
    pub matched_host: &'a str,
    /// The node picked for the first try; set before `before_proxy`.
    pub upstream_node: Option<SocketAddr>,
    /// Headers to add to whatever response ends this request (`core.response.set_header` in
    /// the request phases): the upstream's answer, an exit, or the 404.
    pub response_headers: ResponseHeaders,
    /// Request-scoped state dropped once the request is over (right after its log phase, or
    /// with the request if it is abandoned earlier): limit-conn's in-flight count.
    pub guards: RequestGuards,
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

impl<'a> PluginCtx<'a> {
    pub fn new(
        method: &'a Method,
        uri: &'a str,
        headers: &'a HeaderMap,
        remote_addr: IpAddr,
        vars: &'a (dyn VarSource + Sync),
    ) -> PluginCtx<'a> {
        PluginCtx {
            method,
            uri,
            headers,
            remote_addr,
            vars,
            route: None,
            matched_uri: "",
            matched_host: "",
            upstream_node: None,
            response_headers: ResponseHeaders::default(),
            guards: RequestGuards::default(),
        }
    }
}

impl VarSource for PluginCtx<'_> {
    /// The request's variables plus the ones APISIX adds once a route matched
    /// (`route_id`, `route_name`, `service_id`, `service_name`).
    fn var(&self, name: &str) -> Option<Cow<'_, str>> {
        match name {
            "route_id" => self.route.map(|r| Cow::Borrowed(r.id.as_str())),
            "route_name" => self
                .route
                .and_then(|r| r.name.as_deref())
                .map(Cow::Borrowed),
            "service_id" => self
                .route
                .and_then(|r| r.service_id.as_deref())
                .map(Cow::Borrowed),
            "service_name" => self
                .route
                .and_then(|r| r.service_name.as_deref())
                .map(Cow::Borrowed),
            "remote_addr" => Some(Cow::Owned(self.remote_addr.to_string())),
            "request_method" => Some(Cow::Borrowed(self.method.as_str())),
            "uri" => Some(Cow::Borrowed(self.uri)),
            _ => self.vars.var(name),
        }
    }
}

/// Who produced the response, for prometheus' `response_source` label.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ResponseSource {
    /// The upstream sent the response head.
    Upstream,
    /// Proxied, but the gateway produced the answer (502, 504).
    Nginx,
    /// The gateway ended the request itself (404, plugin exit, 503 without upstream).
    #[default]
    Apisix,
}

impl ResponseSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ResponseSource::Upstream => "upstream",
            ResponseSource::Nginx => "nginx",
            ResponseSource::Apisix => "apisix",
        }
    }
}

/// Names of the request variables a plugin reads in its log phase.
pub type VarNames = Arc<[Box<str>]>;

/// Both lists of names, without repeats; shared when one is absent or both are the same list
/// (the usual case: every prometheus instance asks for the same one).
pub fn union_var_names(a: Option<&VarNames>, b: Option<&VarNames>) -> Option<VarNames> {
    match (a, b) {
        (None, None) => None,
        (Some(x), None) | (None, Some(x)) => Some(x.clone()),
        (Some(x), Some(y)) if Arc::ptr_eq(x, y) || x == y => Some(x.clone()),
        (Some(x), Some(y)) => {
            let mut names: Vec<Box<str>> = x.to_vec();
            for n in y.iter() {
                if !names.contains(n) {
                    names.push(n.clone());
                }
            }
            Some(names.into())
        }
    }
}

/// Request variables kept for the log phase: only those some plugin of the request's chains
/// asked for ([`Plugin::log_vars`]). Empty, which allocates nothing, when none did.
#[derive(Clone, Debug, Default)]
pub struct LogVars {
    names: Option<VarNames>,
    values: Vec<Option<String>>,
}

impl LogVars {
    /// Reads `names` from `src` now (an unknown or unset variable is `None`).
    pub fn capture(names: VarNames, src: &dyn VarSource) -> LogVars {
        let values = names
            .iter()
            .map(|n| src.var(n).map(Cow::into_owned))
            .collect();
        LogVars {
            names: Some(names),
            values,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_none()
    }

    /// Sets a variable that is known only later (`upstream_addr` once the upstream was tried);
    /// `value` is called only when the variable is wanted.
    pub fn set(&mut self, name: &str, value: impl FnOnce() -> Option<String>) {
        if let Some(i) = self.position(name) {
            self.values[i] = value();
        }
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(self.position(name)?)?.as_deref()
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.names.as_ref()?.iter().position(|n| &**n == name)
    }
}

/// The finished request, as the log phase sees it.
#[derive(Clone, Debug, Default)]
pub struct LogCtx {
    /// `$status`.
    pub status: u16,
    /// Index of the matched pattern in the route's `uris` (`None`: no route, or unknown).
    pub matched_uri: Option<u16>,
    pub matched_host: Option<u16>,
    /// IP of the last upstream node tried (`ctx.balancer_ip`).
    pub node: Option<IpAddr>,
    /// `$request_length`: request line, headers and body.
    pub request_length: u64,
    /// `$bytes_sent`: response head and body.
    pub bytes_sent: u64,
    /// `$request_time`.
    pub request_time: Duration,
    /// `$upstream_response_time`, when an upstream was tried.
    pub upstream_time: Option<Duration>,
    pub response_source: ResponseSource,
    /// The variables the chains' plugins asked for ([`Plugin::log_vars`]).
    pub vars: LogVars,
}

impl VarSource for LogCtx {
    /// nginx's variables that are final only now, formatted as nginx does, then the captured
    /// ones; anything else is unset (`None`), as an unknown `ctx.var` is nil in APISIX.
    fn var(&self, name: &str) -> Option<Cow<'_, str>> {
        Some(Cow::Owned(match name {
            "status" => self.status.to_string(),
            "request_time" => format!("{:.3}", self.request_time.as_secs_f64()),
            "upstream_response_time" => format!("{:.3}", self.upstream_time?.as_secs_f64()),
            "request_length" => self.request_length.to_string(),
            "bytes_sent" => self.bytes_sent.to_string(),
            "balancer_ip" => self.node?.to_string(),
            _ => return self.vars.get(name).map(Cow::Borrowed),
        }))
    }
}

/// One plugin configuration compiled for one route. Every method has a no-op default; a plugin
/// lists the phases it implements in [`Plugin::phases`] so chains skip the others.
pub trait Plugin: Send + Sync + 'static {
    fn name(&self) -> &'static str;

    fn phases(&self) -> Phases;

    /// The request variables `log` reads ([`LogCtx`]'s `VarSource`), fixed at compile time, so
    /// the proxy keeps just those; `None` (the default): none.
    fn log_vars(&self) -> Option<&VarNames> {
        None
    }

    fn rewrite<'a>(&'a self, _ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::CONTINUE
    }

    fn access<'a>(&'a self, _ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::CONTINUE
    }

    fn before_proxy<'a>(&'a self, _ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::CONTINUE
    }

    /// The response head is known; headers may be changed.
    fn header_filter(&self, _status: StatusCode, _headers: &mut HeaderMap) {}

    /// One chunk of the response body on its way out (not wired into the proxy yet: no
    /// implemented plugin needs it).
    fn body_filter(&self, _chunk: &mut Bytes, _end_of_stream: bool) {}

    fn log(&self, _ctx: &LogCtx) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_sets() {
        let p = Phases::ACCESS | Phases::LOG;
        assert!(p.contains(Phases::ACCESS));
        assert!(p.contains(Phases::LOG));
        assert!(!p.contains(Phases::REWRITE));
        assert!(!Phases::NONE.contains(Phases::NONE));
    }

    #[test]
    fn error_msg_body_keeps_slashes() {
        let e = Exit::error_msg(StatusCode::TOO_MANY_REQUESTS, "a/b \"q\"");
        assert_eq!(e.body.unwrap(), "{\"error_msg\":\"a/b \\\"q\\\"\"}\n");
    }

    #[test]
    fn log_vars_capture_only_what_is_asked() {
        struct Src;
        impl VarSource for Src {
            fn var(&self, name: &str) -> Option<Cow<'_, str>> {
                (name != "unset").then(|| Cow::Owned(format!("<{name}>")))
            }
        }
        let names: VarNames = vec!["host".into(), "unset".into(), "upstream_addr".into()].into();
        let mut vars = LogVars::capture(names.clone(), &Src);
        assert_eq!(vars.get("host"), Some("<host>"));
        assert_eq!(vars.get("unset"), None);
        assert_eq!(vars.get("other"), None);
        vars.set("upstream_addr", || Some("127.0.0.1:1980".into()));
        vars.set("not_wanted", || panic!("not read"));
        let ctx = LogCtx {
            status: 502,
            node: Some("10.0.0.1".parse().unwrap()),
            request_time: Duration::from_micros(1500),
            vars,
            ..Default::default()
        };
        assert_eq!(ctx.var("upstream_addr").as_deref(), Some("127.0.0.1:1980"));
        assert_eq!(ctx.var("host").as_deref(), Some("<host>"));
        assert_eq!(ctx.var("status").as_deref(), Some("502"));
        assert_eq!(ctx.var("request_time").as_deref(), Some("0.002"));
        assert_eq!(ctx.var("balancer_ip").as_deref(), Some("10.0.0.1"));
        assert_eq!(ctx.var("upstream_response_time"), None);
        assert!(LogVars::default().is_empty());
        assert_eq!(LogCtx::default().var("host"), None);

        // Unions share the list when they can.
        let other: VarNames = vec!["host".into(), "arg_a".into()].into();
        let same = union_var_names(Some(&names), Some(&names.clone())).unwrap();
        assert!(Arc::ptr_eq(&same, &names));
        assert!(union_var_names(None, None).is_none());
        let both = union_var_names(Some(&names), Some(&other)).unwrap();
        assert_eq!(
            both.iter().map(|n| &**n).collect::<Vec<_>>(),
            ["host", "unset", "upstream_addr", "arg_a"]
        );
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
}
