//! cors (`apisix/plugins/cors.lua`): answers preflight `OPTIONS` requests itself (200, empty)
//! and puts the CORS headers on every answer whose `Origin` is allowed: by `allow_origins`
//! (`*`, `**` for the request's own origin, one origin, or a comma-separated list), by
//! `allow_origins_by_regex` (which then replaces `allow_origins`), or by the named origin lists
//! of the plugin's metadata (`allow_origins_by_metadata`). `Vary: Origin` is added unless
//! `allow_origins` is `*`. `timing_allow_origins` (or `_by_regex`) sets `Timing-Allow-Origin`
//! the same way. With `allow_credential`, no option may be `*`.

use std::collections::HashSet;
use std::sync::Arc;

use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, Exit, Phases, Plugin, PluginCtx, PluginDef, ResponseHead, Step,
};
use http::{header, HeaderName, HeaderValue, Method, StatusCode};
use regex::Regex;
use serde_json::{json, Map, Value};

use crate::support::pcre;

pub const NAME: &str = "cors";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    metadata_schema: Some(metadata_schema),
    ..PluginDef::new(NAME, 4000, schema, compile)
};

const ORIGINS_PATTERN: &str = r"^(\*|\*\*|null|\w+://[^,]+(,\w+://[^,]+)*)$";

fn metadata_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "allow_origins": {
                "type": "object",
                "additionalProperties": {"type": "string", "pattern": ORIGINS_PATTERN}
            }
        }
    })
}

fn regex_list(description: &str) -> Value {
    json!({
        "type": "array",
        "description": description,
        "items": {"type": "string", "minLength": 1, "maxLength": 4096},
        "minItems": 1,
        "uniqueItems": true
    })
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "allow_origins": {
                "description": "you can use '*' to allow all origins when no credentials,'**' to allow forcefully(it will bring some security risks, be carefully),multiple origin use ',' to split. default: *.",
                "type": "string",
                "pattern": ORIGINS_PATTERN,
                "default": "*"
            },
            "allow_methods": {
                "description": "you can use '*' to allow all methods when no credentials,'**' to allow forcefully(it will bring some security risks, be carefully),multiple method use ',' to split. default: *.",
                "type": "string",
                "default": "*"
            },
            "allow_headers": {
                "description": "you can use '*' to allow all header when no credentials,'**' to allow forcefully(it will bring some security risks, be carefully),multiple header use ',' to split. default: *.",
                "type": "string",
                "default": "*"
            },
            "expose_headers": {
                "description": "multiple header use ',' to split.If not specified, no custom headers are exposed.",
                "type": "string"
            },
            "max_age": {
                "description": "maximum number of seconds the results can be cached.-1 means no cached, the max value is depend on browser,more details plz check MDN. default: 5.",
                "type": "integer",
                "default": 5
            },
            "allow_credential": {
                "description": "allow client append credential. according to CORS specification,if you set this option to 'true', you can not use '*' for other options.",
                "type": "boolean",
                "default": false
            },
            "allow_origins_by_regex": regex_list("you can use regex to allow specific origins when no credentials,for example use [.*\\.test.com$] to allow a.test.com and b.test.com"),
            "allow_origins_by_metadata": regex_list("set allowed origins by referencing origins in plugin metadata"),
            "timing_allow_origins": {
                "description": "you can use '*' to allow all origins which can view timing information when no credentials,'**' to allow forcefully (it will bring some security risks, be careful),multiple origin use ',' to split. default: nil",
                "type": "string",
                "pattern": ORIGINS_PATTERN
            },
            "timing_allow_origins_by_regex": regex_list("you can use regex to allow specific origins which can view timing information,for example use [.*\\.test.com] to allow a.test.com and b.test.com")
        }
    })
}

fn regexes(conf: &Value, field: &str) -> Result<Option<Regex>, String> {
    let Some(list) = conf.get(field).and_then(Value::as_array) else {
        return Ok(None);
    };
    let rules: Vec<&str> = list.iter().filter_map(Value::as_str).collect();
    for r in &rules {
        pcre::compile(r, false)?;
    }
    // APISIX joins the rules with `|` and searches the origin once.
    pcre::compile(&rules.join("|"), false).map(Some)
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    let conf = cx.filled()?;
    if conf["allow_credential"].as_bool() == Some(true) {
        let star = [
            "allow_origins",
            "allow_methods",
            "allow_headers",
            "expose_headers",
            "timing_allow_origins",
        ]
        .iter()
        .any(|k| conf.get(*k).and_then(Value::as_str) == Some("*"));
        if star {
            return Err(
                "you can not set '*' for other option when 'allow_credential' is true".into(),
            );
        }
    }
    regexes(&conf, "allow_origins_by_regex")?;
    regexes(&conf, "timing_allow_origins_by_regex")?;
    Ok(())
}

/// An `allow_origins` value, taken apart once (`process_with_allow_origins`).
#[derive(Clone, Debug)]
enum Origins {
    /// `**`: the request's origin (or `*` without one).
    Any,
    /// A comma-separated list: the request's origin when listed.
    List(HashSet<String>),
    /// One value (`*`, `null` or an origin), answered as it is.
    One(String),
}

impl Origins {
    fn parse(s: &str) -> Origins {
        if s == "**" {
            Origins::Any
        } else if s.contains(',') {
            Origins::List(
                s.split(',')
                    .filter(|o| !o.is_empty())
                    .map(str::to_owned)
                    .collect(),
            )
        } else {
            Origins::One(s.to_owned())
        }
    }

    fn resolve(&self, req: Option<&str>) -> Option<String> {
        match self {
            Origins::Any => Some(req.unwrap_or("*").to_owned()),
            Origins::List(set) => req.filter(|r| set.contains(*r)).map(str::to_owned),
            Origins::One(o) => Some(o.clone()),
        }
    }
}

/// `match_origins`: the answer allows the request's origin (or every origin).
fn matches(req: Option<&str>, allowed: Option<&str>) -> bool {
    req == allowed || allowed == Some("*")
}

#[derive(Debug)]
struct Cors {
    allow_origins: Origins,
    allow_origins_star: bool,
    by_regex: Option<Regex>,
    /// The metadata's origin lists named by `allow_origins_by_metadata`, in order; `None`
    /// without that option.
    by_metadata: Option<Vec<Origins>>,
    allow_methods: HeaderValue,
    /// `allow_headers: **`: echo `Access-Control-Request-Headers`.
    allow_headers: Option<HeaderValue>,
    expose_headers: Option<HeaderValue>,
    max_age: HeaderValue,
    allow_credential: bool,
    timing: Option<Origins>,
    timing_by_regex: Option<Regex>,
}

/// The request's `Origin`, kept in `rewrite` (later plugins may change the header).
struct RequestOrigin(Option<String>);

fn value(s: &str, field: &str) -> Result<HeaderValue, String> {
    HeaderValue::from_str(s).map_err(|_| format!("{field}: not a valid header value"))
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let text = |k: &str| conf.get(k).and_then(Value::as_str);
    let allow_origins = text("allow_origins").unwrap_or("*");
    let by_metadata = conf
        .get("allow_origins_by_metadata")
        .and_then(Value::as_array)
        .map(|keys| {
            let lists: Option<&Map<String, Value>> = cx
                .metadata
                .and_then(|m| m.get("allow_origins"))
                .and_then(Value::as_object);
            keys.iter()
                .filter_map(Value::as_str)
                .filter_map(|k| lists?.get(k)?.as_str().map(Origins::parse))
                .collect()
        });
    let methods = match text("allow_methods").unwrap_or("*") {
        "**" => "GET,POST,PUT,DELETE,PATCH,HEAD,OPTIONS,CONNECT,TRACE",
        m => m,
    };
    let allow_headers = match text("allow_headers").unwrap_or("*") {
        "**" => None,
        h => Some(value(h, "allow_headers")?),
    };
    Ok(Arc::new(Cors {
        allow_origins: Origins::parse(allow_origins),
        allow_origins_star: allow_origins == "*",
        by_regex: regexes(&conf, "allow_origins_by_regex")?,
        by_metadata,
        allow_methods: value(methods, "allow_methods")?,
        allow_headers,
        expose_headers: match text("expose_headers") {
            Some("") | None => None,
            Some(e) => Some(value(e, "expose_headers")?),
        },
        max_age: HeaderValue::from(conf["max_age"].as_i64().unwrap_or(5)),
        allow_credential: conf["allow_credential"].as_bool().unwrap_or(false),
        timing: text("timing_allow_origins").map(Origins::parse),
        timing_by_regex: regexes(&conf, "timing_allow_origins_by_regex")?,
    }))
}

impl Cors {
    fn by_metadata(&self, req: Option<&str>) -> Option<String> {
        let lists = self.by_metadata.as_ref()?;
        lists
            .iter()
            .any(|o| matches(req, o.resolve(req).as_deref()))
            .then(|| req.map(str::to_owned))
            .flatten()
    }

    fn by_regex(re: &Regex, req: Option<&str>) -> Option<String> {
        req.filter(|r| re.is_match(r)).map(str::to_owned)
    }

    /// The `Access-Control-Allow-Origin` to answer, if any (`header_filter`'s order).
    fn allowed_origin(&self, req: Option<&str>) -> Option<String> {
        let mut allowed = None;
        let mut local = true;
        if self.by_metadata.is_some() {
            allowed = self.by_metadata(req);
            local = !matches(req, allowed.as_deref()) && !self.allow_origins_star;
        }
        if local {
            allowed = match &self.by_regex {
                None => self.allow_origins.resolve(req),
                Some(re) => Self::by_regex(re, req),
            };
        }
        if !matches(req, allowed.as_deref()) {
            allowed = self.by_metadata(req);
        }
        allowed
    }

    fn timing_origin(&self, req: Option<&str>) -> Option<String> {
        let t = match (&self.timing_by_regex, &self.timing) {
            (Some(re), _) => Self::by_regex(re, req),
            (None, Some(o)) => o.resolve(req),
            (None, None) => None,
        };
        t.filter(|t| matches(req, Some(t)))
    }
}

impl Plugin for Cors {
    fn phases(&self) -> Phases {
        Phases::REWRITE | Phases::HEADER_FILTER
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let origin = ctx.header("origin").map(str::to_owned);
        ctx.insert(RequestOrigin(origin));
        if ctx.method() == Method::OPTIONS {
            return Step::exit(Exit::body(StatusCode::OK, ""));
        }
        Step::CONTINUE
    }

    fn header_filter(&self, ctx: &mut PluginCtx<'_>, resp: &mut ResponseHead<'_>) {
        let req = match ctx.get::<RequestOrigin>() {
            Some(RequestOrigin(o)) => o.clone(),
            // A request ended before cors' rewrite ran: its own header.
            None => ctx.header("origin").map(str::to_owned),
        };
        let req = req.as_deref();
        let allowed = self.allowed_origin(req);
        let request_headers = ctx.headers().get("access-control-request-headers").cloned();
        let h = resp.headers_mut();
        if !self.allow_origins_star {
            h.append(header::VARY, HeaderValue::from_static("Origin"));
        }
        if let Some(origin) = allowed.and_then(|o| HeaderValue::from_str(&o).ok()) {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            h.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                self.allow_methods.clone(),
            );
            h.insert(header::ACCESS_CONTROL_MAX_AGE, self.max_age.clone());
            if let Some(e) = &self.expose_headers {
                h.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, e.clone());
            }
            match (&self.allow_headers, request_headers) {
                (Some(a), _) => {
                    h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, a.clone());
                }
                (None, Some(asked)) => {
                    h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
                }
                (None, None) => {
                    h.remove(header::ACCESS_CONTROL_ALLOW_HEADERS);
                }
            }
            if self.allow_credential {
                h.insert(
                    header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                    HeaderValue::from_static("true"),
                );
            }
        }
        if let Some(t) = self
            .timing_origin(req)
            .and_then(|t| HeaderValue::from_str(&t).ok())
        {
            h.insert(HeaderName::from_static("timing-allow-origin"), t);
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::{BodyEdits, Flow};
    use http::HeaderMap;

    use super::*;
    use crate::testing::Compiler;

    /// The response headers cors gives a request with `origin` (and `exit` for preflights).
    fn answer(
        conf: Value,
        metadata: Option<Value>,
        method: Method,
        origin: Option<&str>,
    ) -> (Option<Exit>, HeaderMap) {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "cors", metadata.as_ref())).unwrap();
        let mut req = TestRequest::new(method, "/");
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        req = req.header("access-control-request-headers", "x-asked");
        let mut ctx = req.ctx();
        let exit = match p.rewrite(&mut ctx) {
            Step::Done(Flow::Exit(e)) => Some(e),
            _ => None,
        };
        let (mut status, mut headers, mut edits) =
            (StatusCode::OK, HeaderMap::new(), BodyEdits::default());
        let mut head = ResponseHead::new(&mut status, &mut headers, exit.is_none(), &mut edits);
        p.header_filter(&mut ctx, &mut head);
        (exit, headers)
    }

    fn get(h: &HeaderMap, n: &str) -> Option<String> {
        h.get(n).map(|v| v.to_str().unwrap().to_owned())
    }

    #[test]
    fn defaults_and_preflight() {
        let (exit, h) = answer(json!({}), None, Method::GET, None);
        assert!(exit.is_none());
        assert_eq!(get(&h, "access-control-allow-origin").as_deref(), Some("*"));
        assert_eq!(
            get(&h, "access-control-allow-methods").as_deref(),
            Some("*")
        );
        assert_eq!(
            get(&h, "access-control-allow-headers").as_deref(),
            Some("*")
        );
        assert_eq!(get(&h, "access-control-max-age").as_deref(), Some("5"));
        assert_eq!(get(&h, "vary"), None);
        assert_eq!(get(&h, "access-control-allow-credentials"), None);
        let (exit, h) = answer(json!({}), None, Method::OPTIONS, Some("http://a"));
        let exit = exit.unwrap();
        assert_eq!((exit.status.as_u16(), exit.body.unwrap()), (200, "".into()));
        assert_eq!(get(&h, "access-control-allow-origin").as_deref(), Some("*"));
    }

    #[test]
    fn lists_stars_and_credentials() {
        let conf = json!({"allow_origins": "http://a.ex,http://b.ex", "allow_methods": "GET,POST",
            "allow_headers": "h1,h2", "expose_headers": "e1", "max_age": 50, "allow_credential": true});
        let (_, h) = answer(conf.clone(), None, Method::GET, Some("http://b.ex"));
        assert_eq!(
            get(&h, "access-control-allow-origin").as_deref(),
            Some("http://b.ex")
        );
        assert_eq!(get(&h, "vary").as_deref(), Some("Origin"));
        assert_eq!(
            get(&h, "access-control-expose-headers").as_deref(),
            Some("e1")
        );
        assert_eq!(get(&h, "access-control-max-age").as_deref(), Some("50"));
        assert_eq!(
            get(&h, "access-control-allow-credentials").as_deref(),
            Some("true")
        );
        let (_, h) = answer(conf, None, Method::GET, Some("http://c.ex"));
        assert_eq!(get(&h, "access-control-allow-origin"), None);
        assert_eq!(get(&h, "access-control-allow-methods"), None);
        assert_eq!(get(&h, "vary").as_deref(), Some("Origin"));
        // `**`: the request's own origin, methods and headers.
        let conf = json!({"allow_origins": "**", "allow_methods": "**", "allow_headers": "**"});
        let (_, h) = answer(conf, None, Method::GET, Some("http://z"));
        assert_eq!(
            get(&h, "access-control-allow-origin").as_deref(),
            Some("http://z")
        );
        assert_eq!(
            get(&h, "access-control-allow-methods").as_deref(),
            Some("GET,POST,PUT,DELETE,PATCH,HEAD,OPTIONS,CONNECT,TRACE")
        );
        assert_eq!(
            get(&h, "access-control-allow-headers").as_deref(),
            Some("x-asked")
        );
        // One origin that is not the request's: nothing.
        let (_, h) = answer(
            json!({"allow_origins": "http://a.ex"}),
            None,
            Method::GET,
            Some("http://c"),
        );
        assert_eq!(get(&h, "access-control-allow-origin"), None);
    }

    #[test]
    fn regex_metadata_and_timing() {
        let conf = json!({"allow_origins": "http://listed.ex", "allow_origins_by_regex": [".*\\.test\\.com$"]});
        let (_, h) = answer(conf.clone(), None, Method::GET, Some("http://a.test.com"));
        assert_eq!(
            get(&h, "access-control-allow-origin").as_deref(),
            Some("http://a.test.com")
        );
        let (_, h) = answer(conf, None, Method::GET, Some("http://listed.ex"));
        assert_eq!(get(&h, "access-control-allow-origin"), None);
        let md =
            json!({"allow_origins": {"k1": "http://m1.ex,http://m2.ex", "k2": "http://m3.ex"}});
        let conf = json!({"allow_origins_by_metadata": ["k1", "k2"]});
        for o in ["http://m2.ex", "http://m3.ex"] {
            let (_, h) = answer(conf.clone(), Some(md.clone()), Method::GET, Some(o));
            assert_eq!(get(&h, "access-control-allow-origin").as_deref(), Some(o));
        }
        let (_, h) = answer(conf, Some(md.clone()), Method::GET, Some("http://x.ex"));
        // Neither the metadata nor `allow_origins` (`*` keeps to the metadata) allow it.
        assert_eq!(get(&h, "access-control-allow-origin").as_deref(), None);
        let conf = json!({"allow_origins_by_metadata": ["k2"], "allow_origins": "http://own.ex"});
        let (_, h) = answer(conf, Some(md), Method::GET, Some("http://own.ex"));
        assert_eq!(
            get(&h, "access-control-allow-origin").as_deref(),
            Some("http://own.ex")
        );
        let conf = json!({"timing_allow_origins": "http://t.ex,http://u.ex"});
        let (_, h) = answer(conf, None, Method::GET, Some("http://u.ex"));
        assert_eq!(
            get(&h, "timing-allow-origin").as_deref(),
            Some("http://u.ex")
        );
        let conf = json!({"timing_allow_origins_by_regex": ["^http://t"]});
        let (_, h) = answer(conf.clone(), None, Method::GET, Some("http://tx"));
        assert_eq!(get(&h, "timing-allow-origin").as_deref(), Some("http://tx"));
        let (_, h) = answer(conf, None, Method::GET, Some("http://x"));
        assert_eq!(get(&h, "timing-allow-origin"), None);
    }

    #[test]
    fn validation() {
        let r = crate::PluginRegistry::builtin();
        let star = "failed to check the configuration of plugin cors err: you can not set '*' for other option when 'allow_credential' is true";
        assert_eq!(
            r.check(NAME, &json!({"allow_credential": true})),
            Err(star.into())
        );
        assert_eq!(
            r.check(
                NAME,
                &json!({"allow_origins": "http://a", "allow_methods": "GET",
                "allow_headers": "x", "allow_credential": true, "timing_allow_origins": "*"})
            ),
            Err(star.into())
        );
        assert!(r
            .check(
                NAME,
                &json!({"allow_origins": "http://a", "allow_methods": "GET",
            "allow_headers": "x", "allow_credential": true})
            )
            .is_ok());
        assert_eq!(
            r.check(NAME, &json!({"max_age": "600"})),
            Err("failed to check the configuration of plugin cors err: property \"max_age\" validation failed: wrong type: expected integer, got string".into())
        );
        assert!(r.check(NAME, &json!({"allow_origins": "a.com"})).is_err());
        assert!(r
            .check(NAME, &json!({"allow_origins_by_regex": ["("]}))
            .is_err());
        assert!(r
            .check(NAME, &json!({"allow_origins_by_regex": ["(?<=a)"]}))
            .unwrap_err()
            .contains("not supported"));
    }
}
