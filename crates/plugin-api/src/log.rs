//! The log phase: what a finished request leaves for the plugins' `log`, and how plugins say
//! at compile time what they read there, so the proxy captures just that (and nothing, with
//! no allocation, when no plugin asks).

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_router::VarSource;
use http::HeaderMap;

use crate::ctx::{Consumer, RequestValues};

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

/// What a plugin's `log` reads besides [`LogCtx`]'s fixed facts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogNeeds {
    /// Request variables, read while the request is at hand.
    pub vars: Option<VarNames>,
    /// Every request header, as sent upstream.
    pub request_headers: bool,
    /// Every response header, as sent to the client.
    pub response_headers: bool,
    /// The request body, up to this many bytes (read before proxying, still forwarded).
    pub request_body: Option<usize>,
    /// The response body, up to this many bytes.
    pub response_body: Option<usize>,
}

impl LogNeeds {
    pub fn is_empty(&self) -> bool {
        *self == LogNeeds::default()
    }

    /// What either of two sets reads.
    pub fn union(&self, other: &LogNeeds) -> LogNeeds {
        let max = |a: Option<usize>, b: Option<usize>| match (a, b) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        LogNeeds {
            vars: union_var_names(self.vars.as_ref(), other.vars.as_ref()),
            request_headers: self.request_headers || other.request_headers,
            response_headers: self.response_headers || other.response_headers,
            request_body: max(self.request_body, other.request_body),
            response_body: max(self.response_body, other.response_body),
        }
    }
}

/// Request variables kept for the log phase: only those some plugin of the request's chains
/// asked for. Empty, which allocates nothing, when none did.
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

/// Variables a plugin learns while the answer goes by, after the request's variables were
/// captured (APISIX's `ctx.var.llm_*`, which ai-proxy sets as the provider answers). A plugin
/// keeps its source among the request's values ([`crate::PluginCtx::insert`]) as a
/// [`LateVarSource`]; [`LogCtx::var`] reads it.
pub trait LateVars: Send + Sync + std::fmt::Debug {
    /// The variable's value now; `None` when this source does not set it.
    fn late_var(&self, name: &str) -> Option<String>;
}

/// The request's [`LateVars`].
#[derive(Clone, Debug)]
pub struct LateVarSource(pub Arc<dyn LateVars>);

/// The variables APISIX's nginx.conf sets on every request before any plugin runs
/// (`set $request_type 'traditional_http';` ...): an AI plugin's [`LateVars`] override them.
pub fn preset_var(name: &str) -> Option<&'static str> {
    Some(match name {
        "request_type" => "traditional_http",
        "request_llm_model" | "llm_model" | "llm_end_user_id" | "llm_content_risk_level" => "",
        "llm_time_to_first_token"
        | "llm_prompt_tokens"
        | "llm_completion_tokens"
        | "llm_total_tokens"
        | "llm_tool_count"
        | "llm_cache_read_input_tokens"
        | "llm_cache_creation_input_tokens"
        | "llm_reasoning_tokens" => "0",
        "llm_stream" | "llm_has_tool_calls" => "false",
        _ => return None,
    })
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
    pub consumer: Option<Arc<Consumer>>,
    /// The variables the chains' plugins asked for ([`LogNeeds::vars`]).
    pub vars: LogVars,
    /// With [`LogNeeds::request_headers`].
    pub request_headers: Option<HeaderMap>,
    /// With [`LogNeeds::response_headers`].
    pub response_headers: Option<HeaderMap>,
    /// With [`LogNeeds::request_body`]: what was read, up to the limit.
    pub request_body: Option<Bytes>,
    /// With [`LogNeeds::response_body`]: what was sent, up to the limit.
    pub response_body: Option<Bytes>,
    /// The values plugins kept for the request ([`crate::PluginCtx::insert`]).
    pub values: Option<Arc<RequestValues>>,
}

impl LogCtx {
    /// The request's value of type `T` a plugin kept in an earlier phase.
    pub fn value<T: std::any::Any>(&self) -> Option<&T> {
        self.values.as_deref()?.get()
    }
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
            _ => {
                if let Some(v) = self.vars.get(name) {
                    return Some(Cow::Borrowed(v));
                }
                // Only an AI request holds late variables; the others pay this lookup.
                if let Some(v) = self
                    .value::<LateVarSource>()
                    .and_then(|s| s.0.late_var(name))
                {
                    return Some(Cow::Owned(v));
                }
                if name == "apisix_upstream_response_time" {
                    // nginx.conf: `set $apisix_upstream_response_time $upstream_response_time;`
                    return self.var("upstream_response_time");
                }
                return preset_var(name).map(Cow::Borrowed);
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn late_vars_override_the_presets() {
        #[derive(Debug)]
        struct Ai;
        impl LateVars for Ai {
            fn late_var(&self, name: &str) -> Option<String> {
                (name == "request_type").then(|| "ai_stream".to_owned())
            }
        }
        let plain = LogCtx::default();
        assert_eq!(
            plain.var("request_type").as_deref(),
            Some("traditional_http")
        );
        assert_eq!(plain.var("llm_prompt_tokens").as_deref(), Some("0"));
        assert_eq!(plain.var("llm_model").as_deref(), Some(""));
        assert_eq!(plain.var("llm_stream").as_deref(), Some("false"));
        assert_eq!(plain.var("not_a_var"), None);
        assert_eq!(plain.var("apisix_upstream_response_time"), None);
        let proxied = LogCtx {
            upstream_time: Some(Duration::from_millis(1500)),
            ..LogCtx::default()
        };
        assert_eq!(
            proxied.var("apisix_upstream_response_time").as_deref(),
            Some("1.500")
        );
        let mut values = RequestValues::default();
        values.insert(LateVarSource(Arc::new(Ai)));
        let ai = LogCtx {
            values: Some(Arc::new(values)),
            ..LogCtx::default()
        };
        assert_eq!(ai.var("request_type").as_deref(), Some("ai_stream"));
        // What the source does not set keeps nginx.conf's value.
        assert_eq!(ai.var("llm_completion_tokens").as_deref(), Some("0"));
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
    fn needs_union() {
        let a = LogNeeds {
            request_body: Some(10),
            ..Default::default()
        };
        let b = LogNeeds {
            request_body: Some(100),
            response_headers: true,
            ..Default::default()
        };
        let u = a.union(&b);
        assert_eq!(u.request_body, Some(100));
        assert!(u.response_headers && !u.request_headers);
        assert!(LogNeeds::default().is_empty() && !u.is_empty());
    }
}
