//! referer-restriction (`apisix/plugins/referer-restriction.lua`): refuses requests whose
//! `Referer` host is outside `whitelist` or inside `blacklist` (exact hosts, or `*.suffix`
//! wildcards), with 403 and `{"message": message}`. A missing `Referer`, or one that is no
//! `[http[s]:]//host...` URI, is refused unless `bypass_missing`.

use std::collections::HashSet;
use std::sync::Arc;

use ferrisix_plugin_api::{CompileCtx, Exit, Phases, Plugin, PluginCtx, PluginDef, Step};
use http::StatusCode;
use serde_json::{json, Value};

pub const NAME: &str = "referer-restriction";

pub static DEF: PluginDef = PluginDef::new(NAME, 2990, schema, compile);

fn schema() -> Value {
    let list = json!({
        "type": "array",
        "items": ferrisix_config::schema::defs::host(),
        "minItems": 1
    });
    json!({
        "type": "object",
        "properties": {
            "bypass_missing": {"type": "boolean", "default": false},
            "whitelist": list.clone(),
            "blacklist": list,
            "message": {
                "type": "string",
                "minLength": 1,
                "maxLength": 1024,
                "default": "Your referer host is not allowed"
            }
        },
        "oneOf": [{"required": ["whitelist"]}, {"required": ["blacklist"]}]
    })
}

/// Exact hosts and `*` suffixes (`*.example.com` matches `a.example.com`; `*` alone matches
/// every host).
#[derive(Debug, Default)]
struct HostMatcher {
    exact: HashSet<String>,
    suffixes: Vec<String>,
}

impl HostMatcher {
    fn new(v: Option<&Value>) -> Option<HostMatcher> {
        let list = v?.as_array()?;
        let mut m = HostMatcher::default();
        for h in list.iter().filter_map(Value::as_str) {
            match h.strip_prefix('*') {
                Some(suffix) => m.suffixes.push(suffix.to_owned()),
                None => {
                    m.exact.insert(h.to_owned());
                }
            }
        }
        Some(m)
    }

    fn matches(&self, host: &str) -> bool {
        self.exact.contains(host) || self.suffixes.iter().any(|s| host.ends_with(s.as_str()))
    }
}

/// The host of a `Referer` as lua-resty-http's `parse_uri` takes it apart:
/// `[http:|https:]//host[:port][path][?query]`, host possibly a bracketed IPv6 address.
fn referer_host(referer: &str) -> Option<&str> {
    let rest = referer
        .strip_prefix("https:")
        .or_else(|| referer.strip_prefix("http:"))
        .unwrap_or(referer);
    let rest = rest.strip_prefix("//")?;
    let host = if rest.starts_with('[') {
        let end = rest.find(']')?;
        &rest[..=end]
    } else {
        let end = rest.find([':', '/', '?', '[', ']']).unwrap_or(rest.len());
        &rest[..end]
    };
    (!host.is_empty()).then_some(host)
}

#[derive(Debug)]
enum List {
    White(HostMatcher),
    Black(HostMatcher),
}

#[derive(Debug)]
struct RefererRestriction {
    list: List,
    bypass_missing: bool,
    exit: Exit,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let list = match HostMatcher::new(conf.get("whitelist")) {
        Some(w) => List::White(w),
        None => List::Black(HostMatcher::new(conf.get("blacklist")).unwrap_or_default()),
    };
    Ok(Arc::new(RefererRestriction {
        list,
        bypass_missing: conf["bypass_missing"].as_bool().unwrap_or(false),
        exit: super::message_exit(
            StatusCode::FORBIDDEN,
            conf["message"]
                .as_str()
                .unwrap_or("Your referer host is not allowed"),
        ),
    }))
}

impl Plugin for RefererRestriction {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let host = ctx.header("referer").and_then(referer_host);
        let block = match (host, &self.list) {
            (None, _) => !self.bypass_missing,
            (Some(h), List::White(m)) => !m.matches(h),
            (Some(h), List::Black(m)) => m.matches(h),
        };
        if block {
            Step::exit(self.exit.clone())
        } else {
            Step::CONTINUE
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::Flow;

    use super::*;
    use crate::testing::Compiler;

    fn refused(conf: &Value, referer: Option<&str>) -> bool {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, conf, "rr", None)).unwrap();
        let mut req = TestRequest::get("/");
        if let Some(r) = referer {
            req = req.header("referer", r);
        }
        let out = match p.access(&mut req.ctx()) {
            Step::Done(Flow::Exit(e)) => {
                assert_eq!(e.status, 403);
                true
            }
            _ => false,
        };
        out
    }

    #[test]
    fn hosts() {
        assert_eq!(referer_host("http://www.a.com:80/x?y"), Some("www.a.com"));
        assert_eq!(referer_host("https://[::1]:8/"), Some("[::1]"));
        assert_eq!(referer_host("//a.com"), Some("a.com"));
        assert_eq!(referer_host("a.com"), None);
        assert_eq!(referer_host("ftp://a.com"), None);
        let w = json!({"whitelist": ["*.xx.com", "yy.com"]});
        assert!(!refused(&w, Some("http://www.xx.com/a")));
        assert!(!refused(&w, Some("https://yy.com")));
        assert!(refused(&w, Some("http://www.yy.com")));
        assert!(refused(&w, None));
        assert!(refused(&w, Some("not a uri")));
        let b = json!({"blacklist": ["*.xx.com"], "bypass_missing": true});
        assert!(refused(&b, Some("http://a.xx.com")));
        assert!(!refused(&b, Some("http://a.yy.com")));
        assert!(!refused(&b, None));
        let r = crate::PluginRegistry::builtin();
        assert!(r.check(NAME, &json!({"whitelist": ["a b"]})).is_err());
        assert!(r
            .check(
                NAME,
                &json!({"whitelist": ["a.com"], "blacklist": ["b.com"]})
            )
            .is_err());
        assert!(r.check(NAME, &json!({"whitelist": ["*"]})).is_ok());
    }
}
