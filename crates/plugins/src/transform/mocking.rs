//! mocking (`apisix/plugins/mocking.lua`): answers the request itself, without the upstream:
//! `response_example` (with `$var`s resolved) or a body generated from `response_schema`
//! (JSON, or XML for the XML content types; each property's `example` is used when it has the
//! property's type, a random value otherwise), with `response_status`, `content_type`,
//! `response_headers` (with `$var`s), the `x-mock-by` header unless `with_mock_header` is
//! false, after `delay` seconds.

use std::sync::Arc;
use std::time::Duration;

use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef, Step, Template,
};
use http::{header, HeaderName, HeaderValue, StatusCode};
use rand::Rng;
use serde_json::{json, Map, Value};

use crate::support::headers::{self, ValueTemplate};

pub const NAME: &str = "mocking";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    ..PluginDef::new(NAME, 10900, schema, compile)
};

const MOCK_BY: &str = concat!("ferrisix/", env!("CARGO_PKG_VERSION"));

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "delay": {"type": "integer", "default": 0},
            "response_status": {"type": "integer", "default": 200, "minimum": 100},
            "content_type": {"type": "string", "default": "application/json;charset=utf8"},
            "response_example": {"type": "string"},
            "response_schema": {"type": "object"},
            "with_mock_header": {"type": "boolean", "default": true},
            "response_headers": {
                "type": "object",
                "minProperties": 1,
                "patternProperties": {
                    "^[^:]+$": {"oneOf": [{"type": "string"}, {"type": "number"}]}
                }
            }
        },
        "anyOf": [{"required": ["response_example"]}, {"required": ["response_schema"]}]
    })
}

/// The media type of `content_type` (before a `;`).
fn media_type(content_type: &str) -> &str {
    content_type
        .split_once(';')
        .map_or(content_type, |(t, _)| t)
}

const SUPPORTED: [&str; 5] = [
    "application/xml",
    "application/json",
    "text/plain",
    "text/html",
    "text/xml",
];

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    let filled = cx.filled()?;
    let ct = filled["content_type"].as_str().unwrap_or("");
    if !SUPPORTED.contains(&media_type(ct)) {
        return Err("unsupported content type!".into());
    }
    Ok(())
}

#[derive(Debug)]
enum Body {
    Example(Template),
    Json(Map<String, Value>),
    Xml(Map<String, Value>),
    /// A schema with a content type it cannot be written in (APISIX logs and answers empty).
    Empty,
}

#[derive(Debug)]
struct Mocking {
    status: StatusCode,
    delay: Duration,
    content_type: Option<HeaderValue>,
    mock_header: bool,
    headers: Vec<(HeaderName, ValueTemplate)>,
    body: Body,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let status = conf["response_status"].as_u64().unwrap_or(200);
    let status = u16::try_from(status)
        .ok()
        .and_then(|s| StatusCode::from_u16(s).ok())
        .ok_or_else(|| format!("invalid response_status {status}"))?;
    let ct = conf["content_type"]
        .as_str()
        .unwrap_or("application/json;charset=utf8");
    let body = if let Some(ex) = conf.get("response_example").and_then(Value::as_str) {
        Body::Example(Template::parse(ex))
    } else {
        let schema = conf["response_schema"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        match media_type(ct) {
            "application/xml" | "text/xml" => Body::Xml(schema),
            "application/json" | "text/plain" => Body::Json(schema),
            _ => {
                tracing::error!("mocking: a response_schema body is written as xml or json only");
                Body::Empty
            }
        }
    };
    let headers = conf
        .get("response_headers")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| {
            let name = headers::name(k, NAME)?;
            Some((name, ValueTemplate::new(&headers::value_text(v)?)))
        })
        .collect();
    Ok(Arc::new(Mocking {
        status,
        delay: Duration::from_secs(conf["delay"].as_i64().unwrap_or(0).max(0) as u64),
        content_type: HeaderValue::from_str(ct).ok(),
        mock_header: conf["with_mock_header"].as_bool().unwrap_or(true),
        headers,
        body,
    }))
}

/// `gen_by_property`: a value for one property of the schema.
fn generate(property: &Value, rng: &mut impl Rng) -> Option<Value> {
    let typ = property.get("type")?.as_str()?.to_ascii_lowercase();
    let example = property.get("example");
    Some(match typ.as_str() {
        "array" => {
            let items = property.get("items")?;
            let n = rng.gen_range(1..=3);
            Value::Array((0..n).filter_map(|_| generate(items, rng)).collect())
        }
        "object" => Value::Object(object(property, rng)),
        "string" => match example {
            Some(Value::String(s)) => Value::String(s.clone()),
            _ => {
                let n = rng.gen_range(1..=10);
                Value::String((0..n).map(|_| rng.gen_range(b'a'..=b'z') as char).collect())
            }
        },
        "number" => match example {
            Some(Value::Number(n)) => Value::Number(n.clone()),
            _ => json!(rng.gen::<f64>() * 10000.0),
        },
        "integer" => match example.and_then(Value::as_f64) {
            Some(n) => json!(n.floor() as i64),
            None => json!(rng.gen_range(1..=10000)),
        },
        "boolean" => match example {
            Some(Value::Bool(b)) => Value::Bool(*b),
            _ => Value::Bool(rng.gen()),
        },
        _ => return None,
    })
}

fn object(schema: &Value, rng: &mut impl Rng) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, v) in schema
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        if let Some(value) = generate(v, rng) {
            out.insert(k.clone(), value);
        }
    }
    out
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// xml2lua's `toXml(value, "data")`: one element per key, arrays as repeated elements.
fn to_xml(name: &str, v: &Value, out: &mut String) {
    match v {
        Value::Array(items) => {
            for i in items {
                to_xml(name, i, out);
            }
        }
        Value::Object(m) => {
            out.push_str(&format!("<{name}>"));
            for (k, v) in m {
                to_xml(k, v, out);
            }
            out.push_str(&format!("</{name}>"));
        }
        Value::String(s) => out.push_str(&format!("<{name}>{}</{name}>", xml_escape(s))),
        Value::Number(n) => out.push_str(&format!("<{name}>{}</{name}>", lua::json_number(n))),
        Value::Bool(b) => out.push_str(&format!("<{name}>{b}</{name}>")),
        Value::Null => {}
    }
}

impl Mocking {
    fn answer(&self, ctx: &PluginCtx<'_>) -> Exit {
        let body = match &self.body {
            Body::Example(t) => t.resolve(ctx).text,
            Body::Json(schema) => {
                let v = Value::Object(object(
                    &Value::Object(schema.clone()),
                    &mut rand::thread_rng(),
                ));
                // An empty table encodes as `{}` in cjson.
                lua::cjson_encode(&v)
            }
            Body::Xml(schema) => {
                let v = Value::Object(object(
                    &Value::Object(schema.clone()),
                    &mut rand::thread_rng(),
                ));
                let mut out = String::new();
                to_xml("data", &v, &mut out);
                out
            }
            Body::Empty => String::new(),
        };
        let mut exit = Exit::body(self.status, body);
        if let Some(ct) = &self.content_type {
            exit = exit.with_header(header::CONTENT_TYPE, ct.clone());
        }
        if self.mock_header {
            exit = exit.with_header(
                HeaderName::from_static("x-mock-by"),
                HeaderValue::from_static(MOCK_BY),
            );
        }
        for (name, value) in &self.headers {
            if let Some(v) = value.header_value(ctx, NAME, name) {
                exit = exit.with_header(name.clone(), v);
            }
        }
        exit
    }
}

impl Plugin for Mocking {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let exit = self.answer(ctx);
        if self.delay.is_zero() {
            return Step::exit(exit);
        }
        let delay = self.delay;
        Step::Wait(Box::pin(async move {
            tokio::time::sleep(delay).await;
            Flow::Exit(exit)
        }))
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;

    use super::*;
    use crate::testing::Compiler;

    fn exit(conf: Value) -> Exit {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "mock", None)).unwrap();
        let mut req = TestRequest::get("/?a=1");
        let out = match p.access(&mut req.ctx()) {
            Step::Done(Flow::Exit(e)) => e,
            other => panic!("{other:?}"),
        };
        out
    }

    fn header<'a>(e: &'a Exit, name: &str) -> Option<&'a str> {
        e.headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.to_str().ok())
    }

    #[test]
    fn example_with_vars_status_and_headers() {
        let e = exit(json!({"content_type": "text/plain", "response_status": 201,
            "response_example": "remote_addr:$remote_addr a=$arg_a",
            "response_headers": {"X-Apisix": "is, cool", "X-Num": 1, "X-Var": "$arg_a"}}));
        assert_eq!(e.status, 201);
        assert_eq!(e.body.as_deref(), Some(&b"remote_addr:127.0.0.1 a=1"[..]));
        assert_eq!(header(&e, "content-type"), Some("text/plain"));
        assert_eq!(header(&e, "x-apisix"), Some("is, cool"));
        assert_eq!(header(&e, "x-num"), Some("1"));
        assert_eq!(header(&e, "x-var"), Some("1"));
        assert!(header(&e, "x-mock-by").unwrap().starts_with("ferrisix/"));
        let e = exit(json!({"response_example": "{}", "with_mock_header": false}));
        assert_eq!(header(&e, "x-mock-by"), None);
        assert_eq!(
            header(&e, "content-type"),
            Some("application/json;charset=utf8")
        );
    }

    #[test]
    fn schema_bodies() {
        let schema = json!({"properties": {
            "s": {"type": "string", "example": "ex"},
            "i": {"type": "integer", "example": 3.7},
            "b": {"type": "boolean"},
            "n": {"type": "number"},
            "a": {"type": "array", "items": {"type": "string", "example": "x"}},
            "o": {"type": "object", "properties": {"k": {"type": "string", "example": "v"}}}}});
        let e = exit(json!({"response_schema": schema.clone()}));
        let v: Value = serde_json::from_slice(e.body.as_ref().unwrap()).unwrap();
        assert_eq!(v["s"], "ex");
        assert_eq!(v["i"], 3);
        assert!(v["b"].is_boolean() && v["n"].is_number());
        assert!(v["a"].as_array().unwrap().iter().all(|x| x == "x"));
        assert_eq!(v["o"]["k"], "v");
        let e = exit(
            json!({"response_schema": {"properties": {"s": {"type": "string", "example": "a<b"}}},
            "content_type": "application/xml"}),
        );
        assert_eq!(e.body.unwrap(), "<data><s>a&lt;b</s></data>");
    }

    #[test]
    fn validation_and_delay() {
        let r = crate::PluginRegistry::builtin();
        assert_eq!(
            r.check(NAME, &json!({"response_example": "x", "content_type": "image/png"})),
            Err("failed to check the configuration of plugin mocking err: unsupported content type!".into())
        );
        assert!(r
            .check(NAME, &json!({"content_type": "text/plain"}))
            .is_err());
        assert!(r
            .check(
                NAME,
                &json!({"response_example": "x", "content_type": "text/html; charset=utf-8"})
            )
            .is_ok());
        let c = Compiler::new();
        let conf = json!({"response_example": "x", "delay": 1});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "mock", None)).unwrap();
        let mut req = TestRequest::get("/");
        assert!(matches!(p.access(&mut req.ctx()), Step::Wait(_)));
    }
}
