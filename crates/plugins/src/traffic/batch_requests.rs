//! batch-requests (`apisix/plugins/batch-requests.lua`): the API `POST /apisix/batch-requests`
//! (`plugin_attr.batch-requests.uri` moves it; served through `public-api`, as APISIX's plugin
//! APIs are) takes a JSON document of requests, sends each one back to this gateway, and
//! answers the list of their answers, `[{"status", "reason", "headers", "body"}]`.
//!
//! The document is checked against APISIX's request schema (`query`, `headers`, `timeout` in
//! ms, `pipeline[]` of `version`, `method`, `path`, `query`, `headers`, `body`, `ssl_verify`).
//! Each entry gets the document's `headers` and `query` where it has none of the same name,
//! then the batch request's own headers except `Content-*` ones, and `real_ip_header` set to
//! the client's address whatever the entry said, so the gateway routes and authenticates it
//! as it would the client's own request. `plugin_metadata` bounds the body (`max_body_size`,
//! 413 with APISIX's message) and the number of entries (`max_pipeline_items`).
//!
//! Not as APISIX: APISIX pipelines the entries on one connection to `127.0.0.1` and the port
//! the batch came in on; ferrisix sends them one after another, in order, to the address and
//! port the batch came in on (over TLS when it came over TLS, where `ssl_verify` applies),
//! each bounded by `timeout`. An entry that times out (or whose answer breaks off) is
//! `{"status": 504, "reason": "upstream timeout"}` as in APISIX, and does not hold up the
//! entries after it. Hop-by-hop headers of the batch request (`Connection`,
//! `Transfer-Encoding`, `Expect` ...) are not copied onto the entries. Answer headers are
//! named in the canonical case (`Content-Type`), a repeated one as a list.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_config::schema::{cjson, lua};
use ferrisix_plugin_api::{
    ApiHandler, BodyError, Exit, Flow, HttpError, Phases, Plugin, PluginApi, PluginCtx, PluginDef,
    PluginServices, Scope, Step,
};
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Version};
use serde_json::{json, Map, Value};

use crate::support::args::encode_args;
use crate::support::inert;

pub const NAME: &str = "batch-requests";

/// The plugin itself does nothing per request: enabling it is what adds the API.
pub static DEF: PluginDef = PluginDef {
    scope: Scope::Global,
    metadata_schema: Some(metadata_schema),
    apis: Some(apis),
    ..PluginDef::new(NAME, 4010, schema, inert::compile)
};

const DEFAULT_URI: &str = "/apisix/batch-requests";
const DEFAULT_MAX_BODY_SIZE: u64 = 1024 * 1024;
const DEFAULT_MAX_PIPELINE_ITEMS: u64 = 1000;

/// Headers that describe one connection, not the request: never copied onto the entries.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "expect",
];

fn schema() -> Value {
    json!({"type": "object"})
}

fn metadata_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "max_body_size": {
                "description": "max pipeline body size in bytes",
                "type": "integer",
                "exclusiveMinimum": 0,
                "default": DEFAULT_MAX_BODY_SIZE
            },
            "max_pipeline_items": {
                "description": "max number of requests allowed in the pipeline",
                "type": "integer",
                "exclusiveMinimum": 0,
                "default": DEFAULT_MAX_PIPELINE_ITEMS
            }
        }
    })
}

/// What the API takes (APISIX's `req_schema`).
fn request_schema() -> Value {
    let mut method = ferrisix_config::schema::defs::method();
    method["default"] = json!("GET");
    json!({
        "type": "object",
        "properties": {
            "query": {"description": "pipeline query string", "type": "object"},
            "headers": {"description": "pipeline header", "type": "object"},
            "timeout": {
                "description": "pipeline timeout(ms)",
                "type": "integer",
                "minimum": 1,
                "default": 30000
            },
            "pipeline": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "additionalProperties": false,
                    "properties": {
                        "version": {
                            "description": "HTTP version",
                            "type": "number",
                            "enum": [1.0, 1.1],
                            "default": 1.1
                        },
                        "method": method,
                        "path": {"type": "string", "minLength": 1},
                        "query": {"description": "request query string", "type": "object"},
                        "headers": {"description": "request headers", "type": "object"},
                        "body": {"description": "request body", "type": "string"},
                        "ssl_verify": {"type": "boolean", "default": false}
                    },
                    "required": ["path"]
                }
            }
        },
        "anyOf": [{"required": ["pipeline"]}]
    })
}

/// `plugin_attr.batch-requests.uri`, else `/apisix/batch-requests`.
fn api_uri(services: &PluginServices) -> String {
    services
        .plugin_attr()
        .others
        .get(NAME)
        .and_then(|a| a.get("uri"))
        .and_then(Value::as_str)
        .unwrap_or(DEFAULT_URI)
        .to_owned()
}

fn apis(services: &PluginServices) -> Vec<PluginApi> {
    vec![PluginApi {
        methods: &[Method::POST],
        uri: api_uri(services),
        handler: ApiHandler::Request {
            plugin: NAME,
            make: Arc::new(|metadata, services| Arc::new(BatchApi::new(metadata, services))),
        },
    }]
}

/// The API's handler, built per snapshot from the plugin's metadata.
struct BatchApi {
    max_body_size: u64,
    max_pipeline_items: u64,
    schema: Value,
    services: Arc<PluginServices>,
}

impl BatchApi {
    fn new(metadata: Option<&Value>, services: &Arc<PluginServices>) -> BatchApi {
        let limit = |name: &str, default: u64| {
            metadata
                .and_then(|m| m.get(name))
                .and_then(Value::as_u64)
                .filter(|n| *n > 0)
                .unwrap_or(default)
        };
        BatchApi {
            max_body_size: limit("max_body_size", DEFAULT_MAX_BODY_SIZE),
            max_pipeline_items: limit("max_pipeline_items", DEFAULT_MAX_PIPELINE_ITEMS),
            schema: request_schema(),
            services: services.clone(),
        }
    }
}

fn too_large(size: u64, max: u64) -> Exit {
    // nginx has no 417 for a refused `Expect: 100-continue`: APISIX answers 413 either way.
    Exit::error_msg(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("request size {size} is greater than the maximum size {max} allowed"),
    )
}

fn bad_request(msg: &str) -> Flow {
    Flow::Exit(Exit::error_msg(StatusCode::BAD_REQUEST, msg))
}

/// One pipeline entry, ready to send.
#[derive(Debug, PartialEq)]
struct Entry {
    method: Method,
    version: Version,
    /// Path and query.
    target: String,
    headers: HeaderMap,
    body: Bytes,
    ssl_verify: bool,
}

/// Header values as the document gives them: a string, a number, or a list of them.
fn header_values(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Number(n) => vec![lua::json_number(n)],
        Value::Array(list) => list.iter().flat_map(header_values).collect(),
        _ => Vec::new(),
    }
}

/// An object's keys lower-cased (`lowercase_key_or_init`); a later key wins.
fn lowercase_keys(obj: Option<&Value>) -> Map<String, Value> {
    let mut out = Map::new();
    if let Some(Value::Object(m)) = obj {
        for (k, v) in m {
            out.insert(k.to_ascii_lowercase(), v.clone());
        }
    }
    out
}

/// A query object as `ngx.encode_args` writes it: `true` a bare name, `false` left out, a
/// list the name repeated.
fn query_fields(query: &Map<String, Value>) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for (k, v) in query {
        let values = match v {
            Value::Array(list) => list.clone(),
            other => vec![other.clone()],
        };
        for v in values {
            match v {
                Value::Bool(true) => out.push((k.clone(), None)),
                Value::Bool(false) | Value::Null => {}
                Value::String(s) => out.push((k.clone(), Some(s))),
                Value::Number(n) => out.push((k.clone(), Some(lua::json_number(&n)))),
                other => out.push((k.clone(), Some(lua::cjson_encode(&other)))),
            }
        }
    }
    out
}

/// The entries of a checked document (defaults filled in), with the document's headers and
/// query, the batch request's headers (`outer`) and the client's address set as APISIX's
/// `set_common_header` and `set_common_query` do.
fn entries(
    data: &Value,
    outer: &HeaderMap,
    real_ip_header: &str,
    client_ip: &str,
) -> Result<Vec<Entry>, String> {
    let common_headers = lowercase_keys(data.get("headers"));
    let common_query = data.get("query").and_then(Value::as_object);
    let items = data["pipeline"].as_array().map_or(&[][..], Vec::as_slice);
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let n = i + 1;
        let mut own = lowercase_keys(item.get("headers"));
        for (k, v) in &common_headers {
            if !own.contains_key(k) {
                own.insert(k.clone(), v.clone());
            }
        }
        let mut headers = HeaderMap::new();
        for (k, v) in &own {
            if k == real_ip_header {
                continue;
            }
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| format!("pipeline item {n}: invalid header name \"{k}\""))?;
            for value in header_values(v) {
                let value = HeaderValue::from_str(&value)
                    .map_err(|_| format!("pipeline item {n}: invalid value of header \"{k}\""))?;
                headers.append(name.clone(), value);
            }
        }
        for name in outer.keys() {
            let skip = name.as_str().starts_with("content-")
                || HOP_BY_HOP.contains(&name.as_str())
                || own.contains_key(name.as_str())
                || name.as_str() == real_ip_header;
            if !skip {
                for v in outer.get_all(name) {
                    headers.append(name.clone(), v.clone());
                }
            }
        }
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(real_ip_header.as_bytes()),
            HeaderValue::from_str(client_ip),
        ) {
            headers.insert(name, value);
        }

        let mut query = item
            .get("query")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        if let Some(common) = common_query {
            for (k, v) in common {
                if !query.contains_key(k) {
                    query.insert(k.clone(), v.clone());
                }
            }
        }
        let path = item["path"].as_str().unwrap_or("/");
        if !path.starts_with('/') {
            return Err(format!(
                "pipeline item {n}: path \"{path}\" does not start with \"/\""
            ));
        }
        let mut target = path.to_owned();
        let args = encode_args(&query_fields(&query));
        if !args.is_empty() {
            target.push(if path.contains('?') { '&' } else { '?' });
            target.push_str(&args);
        }
        let method = item["method"].as_str().unwrap_or("GET");
        let method = Method::from_bytes(method.as_bytes())
            .map_err(|_| format!("pipeline item {n}: invalid method"))?;
        let version = if item["version"].as_f64() == Some(1.0) {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        };
        out.push(Entry {
            method,
            version,
            target,
            headers,
            body: Bytes::from(item["body"].as_str().unwrap_or("").to_owned()),
            ssl_verify: item["ssl_verify"].as_bool() == Some(true),
        });
    }
    Ok(out)
}

/// `Content-Type` as nginx and most servers write it.
fn canonical_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = true;
    for c in name.chars() {
        out.push(if upper { c.to_ascii_uppercase() } else { c });
        upper = c == '-';
    }
    out
}

/// One answer as APISIX lists it.
fn answer_entry(method: &Method, resp: &http::Response<Bytes>) -> Value {
    let status = resp.status();
    let mut headers = Map::new();
    for name in resp.headers().keys() {
        let values: Vec<Value> = resp
            .headers()
            .get_all(name)
            .iter()
            .map(|v| Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect();
        let value = match values.len() {
            1 => values.into_iter().next().unwrap_or(Value::Null),
            _ => Value::Array(values),
        };
        headers.insert(canonical_name(name.as_str()), value);
    }
    let mut out = Map::new();
    out.insert("status".into(), json!(status.as_u16()));
    out.insert(
        "reason".into(),
        json!(status.canonical_reason().unwrap_or("")),
    );
    out.insert("headers".into(), Value::Object(headers));
    // lua-resty-http's `has_body`: not for HEAD, 204, 304 or 1xx.
    let has_body = *method != Method::HEAD
        && status != StatusCode::NO_CONTENT
        && status != StatusCode::NOT_MODIFIED
        && !status.is_informational();
    if has_body {
        out.insert(
            "body".into(),
            Value::String(String::from_utf8_lossy(resp.body()).into_owned()),
        );
    }
    Value::Object(out)
}

impl BatchApi {
    async fn run(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let max = self.max_body_size;
        let declared = ctx
            .header("content-length")
            .and_then(|v| v.trim().parse::<u64>().ok());
        if let Some(len) = declared.filter(|len| *len > max) {
            return Flow::Exit(too_large(len, max));
        }
        // A body without a length is read up to twice the limit, so that the size reported is
        // the body's own unless it is larger still (nginx reads it all into a file first).
        let reach = usize::try_from(max.saturating_mul(2)).unwrap_or(usize::MAX);
        let body = match ctx.read_body(reach).await {
            Ok(b) if b.len() as u64 > max => return Flow::Exit(too_large(b.len() as u64, max)),
            Ok(b) => b.clone(),
            Err(BodyError::TooLarge(n)) => return Flow::Exit(too_large(n as u64, max)),
            Err(BodyError::Timeout) => {
                return Flow::Exit(Exit::status(StatusCode::REQUEST_TIMEOUT))
            }
            Err(BodyError::Broken(_)) => return Flow::Exit(Exit::status(StatusCode::BAD_REQUEST)),
        };
        if body.is_empty() {
            return bad_request("no request body, you should give at least one pipeline setting");
        }
        let mut data = match cjson::decode(&body) {
            Ok(v) => v,
            Err(e) => {
                let text = String::from_utf8_lossy(&body);
                return bad_request(&format!("invalid request body: {text}, err: {e}"));
            }
        };
        if let Err(e) = ferrisix_config::schema::validate_and_fill(&self.schema, &mut data) {
            return bad_request(&format!("bad request body: {e}"));
        }
        let count = data["pipeline"].as_array().map_or(0, Vec::len);
        if count as u64 > self.max_pipeline_items {
            return bad_request(&format!(
                "too many pipeline requests, {count} exceeds the maximum of {}",
                self.max_pipeline_items
            ));
        }
        let timeout = Duration::from_millis(data["timeout"].as_u64().unwrap_or(30000));
        let client_ip = ctx.remote_addr().to_string();
        let list = match entries(
            &data,
            ctx.headers(),
            self.services.real_ip_header(),
            &client_ip,
        ) {
            Ok(list) => list,
            Err(e) => return bad_request(&format!("bad request body: {e}")),
        };
        let conn = ctx.head().conn;
        let base = format!("{}://{}", conn.scheme(), conn.local);
        let mut answers = Vec::with_capacity(list.len());
        for (i, entry) in list.into_iter().enumerate() {
            let method = entry.method.clone();
            let mut req = Request::new(entry.body);
            *req.method_mut() = entry.method;
            *req.version_mut() = entry.version;
            *req.headers_mut() = entry.headers;
            *req.uri_mut() = match format!("{base}{}", entry.target).parse() {
                Ok(uri) => uri,
                Err(_) => {
                    return bad_request(&format!(
                        "bad request body: pipeline item {}: invalid path",
                        i + 1
                    ))
                }
            };
            let sent = self
                .services
                .http()
                .send_verified(req, timeout, entry.ssl_verify)
                .await;
            match sent {
                Ok(resp) => answers.push(answer_entry(&method, &resp)),
                Err(HttpError::Connect(e)) => {
                    return Flow::Exit(Exit::error_msg(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        &format!("connect to apisix failed: {e}"),
                    ))
                }
                Err(e) => {
                    tracing::error!("{NAME}: pipeline request {} failed: {e}", i + 1);
                    answers.push(json!({"status": 504, "reason": "upstream timeout"}));
                }
            }
        }
        Flow::Exit(
            Exit::body(StatusCode::OK, lua::cjson_encode(&Value::Array(answers))).with_header(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
        )
    }
}

impl Plugin for BatchApi {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.run(ctx)))
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;

    use super::*;

    fn checked(doc: Value) -> Result<Value, String> {
        let mut doc = doc;
        ferrisix_config::schema::validate_and_fill(&request_schema(), &mut doc)?;
        Ok(doc)
    }

    #[test]
    fn request_schema_messages_are_apisix_s() {
        let e = checked(json!({"pipeline1": [{"path": "/b"}]})).unwrap_err();
        assert_eq!(e, "object matches none of the required: [\"pipeline\"]");
        let e = checked(json!({"timeout": "200", "pipeline": [{"path": "/b"}]})).unwrap_err();
        assert_eq!(
            e,
            "property \"timeout\" validation failed: wrong type: expected integer, got string"
        );
        let e = checked(json!({"pipeline": [{"path": ""}]})).unwrap_err();
        assert_eq!(e, "property \"pipeline\" validation failed: failed to validate item 1: property \"path\" validation failed: string too short, expected at least 1, got 0");
        let e = checked(json!({"pipeline": [{"path": "/c", "method": "put"}]})).unwrap_err();
        assert_eq!(e, "property \"pipeline\" validation failed: failed to validate item 1: property \"method\" validation failed: matches none of the enum values");
        let e = checked(json!({"pipeline": [{"path": "/d", "version": 1.2}]})).unwrap_err();
        assert_eq!(e, "property \"pipeline\" validation failed: failed to validate item 1: property \"version\" validation failed: matches none of the enum values");
        let e = checked(json!({"pipeline": [{"path": "/d", "ssl_verify": 1.2}]})).unwrap_err();
        assert_eq!(e, "property \"pipeline\" validation failed: failed to validate item 1: property \"ssl_verify\" validation failed: wrong type: expected boolean, got number");
        let e = checked(json!({"pipeline": []})).unwrap_err();
        assert_eq!(
            e,
            "property \"pipeline\" validation failed: expect array to have at least 1 items"
        );
        let e = checked(json!({"pipeline": [{"method": "GET"}]})).unwrap_err();
        assert!(e.contains("property \"path\" is required"), "{e}");
        assert!(checked(json!({"pipeline": [{"path": "/b", "unknown_field": "x"}]})).is_err());
        assert!(checked(json!({"timeout": 0, "pipeline": [{"path": "/b"}]})).is_err());
        let doc = checked(json!({"pipeline": [{"path": "/b"}]})).unwrap();
        assert_eq!(doc["timeout"], 30000);
        assert_eq!(doc["pipeline"][0]["method"], "GET");
        assert_eq!(doc["pipeline"][0]["ssl_verify"], false);
    }

    #[test]
    fn metadata_is_checked() {
        let r = crate::PluginRegistry::builtin();
        let e = r
            .check_metadata(NAME, &json!({"max_body_size": 0}))
            .unwrap_err();
        assert!(
            e.contains(
                "property \"max_body_size\" validation failed: expected 0 to be greater than 0"
            ),
            "{e}"
        );
        assert!(r
            .check_metadata(NAME, &json!({"max_pipeline_items": 2}))
            .is_ok());
        assert!(r.check(NAME, &json!({})).is_ok());
        assert_eq!(r.get(NAME).unwrap().priority, 4010);
    }

    #[test]
    fn headers_and_query_are_inherited_as_apisix_does() {
        let data = checked(json!({
            "query": {"base": "base_query", "conflict": "query_value"},
            "headers": {"Base-Header": "base", "ConflictHeader": "header_value",
                        "OuterConflict": "common_value", "X-Real-IP": "10.0.0.9"},
            "pipeline": [
                {"path": "/b", "headers": {"Header1": "hello", "ConflictHeader": "b-value",
                                           "x-real-ip": "127.0.0.2"}},
                {"path": "/c", "method": "PUT", "version": 1.0},
                {"path": "/d?x=1", "query": {"one": "thing", "conflict": "d value", "flag": true}}
            ]
        }))
        .unwrap();
        let mut outer = HeaderMap::new();
        outer.insert("conflictheader", HeaderValue::from_static("outer_header"));
        outer.insert("outerconflict", HeaderValue::from_static("outer_conflict"));
        outer.insert("cookie", HeaderValue::from_static("c=1"));
        outer.insert("content-type", HeaderValue::from_static("application/json"));
        outer.insert("content-length", HeaderValue::from_static("200"));
        outer.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        outer.insert("host", HeaderValue::from_static("api.test"));
        let list = entries(&data, &outer, "x-real-ip", "192.0.2.7").unwrap();
        assert_eq!(list.len(), 3);
        let h = |i: usize, n: &str| {
            list[i]
                .headers
                .get(n)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        assert_eq!(h(0, "conflictheader").as_deref(), Some("b-value"));
        assert_eq!(h(0, "outerconflict").as_deref(), Some("common_value"));
        assert_eq!(h(0, "base-header").as_deref(), Some("base"));
        assert_eq!(h(0, "header1").as_deref(), Some("hello"));
        assert_eq!(h(0, "cookie").as_deref(), Some("c=1"));
        assert_eq!(h(0, "host").as_deref(), Some("api.test"));
        // The client's address, whatever the document says.
        assert_eq!(h(0, "x-real-ip").as_deref(), Some("192.0.2.7"));
        assert_eq!(list[0].headers.get_all("x-real-ip").iter().count(), 1);
        assert_eq!(h(1, "x-real-ip").as_deref(), Some("192.0.2.7"));
        // Content-* and hop-by-hop headers of the batch stay behind.
        assert_eq!(h(1, "content-type"), None);
        assert_eq!(h(1, "content-length"), None);
        assert_eq!(h(1, "transfer-encoding"), None);
        assert_eq!(h(1, "conflictheader").as_deref(), Some("header_value"));
        assert_eq!(list[1].method, Method::PUT);
        assert_eq!(list[1].version, Version::HTTP_10);
        assert_eq!(list[0].version, Version::HTTP_11);
        assert_eq!(list[0].target, "/b?base=base_query&conflict=query_value");
        assert_eq!(
            list[2].target,
            "/d?x=1&one=thing&conflict=d%20value&flag&base=base_query"
        );
    }

    #[test]
    fn bad_entries_are_refused() {
        let outer = HeaderMap::new();
        let data = checked(json!({"pipeline": [{"path": "b"}]})).unwrap();
        let e = entries(&data, &outer, "x-real-ip", "1.2.3.4").unwrap_err();
        assert_eq!(e, "pipeline item 1: path \"b\" does not start with \"/\"");
        let data = checked(json!({"pipeline": [{"path": "/b", "headers": {"a b": "1"}}]})).unwrap();
        let e = entries(&data, &outer, "x-real-ip", "1.2.3.4").unwrap_err();
        assert_eq!(e, "pipeline item 1: invalid header name \"a b\"");
        let data =
            checked(json!({"pipeline": [{"path": "/b", "headers": {"a": "x\ny"}}]})).unwrap();
        assert!(entries(&data, &outer, "x-real-ip", "1.2.3.4").is_err());
    }

    #[test]
    fn answers_are_listed_as_apisix_does() {
        let resp = http::Response::builder()
            .status(201)
            .header("x-res", "C")
            .header("set-cookie", "a=1")
            .header("set-cookie", "b=2")
            .body(Bytes::from_static(b"C"))
            .unwrap();
        let v = answer_entry(&Method::PUT, &resp);
        assert_eq!(
            v,
            json!({"status": 201, "reason": "Created", "body": "C",
                   "headers": {"X-Res": "C", "Set-Cookie": ["a=1", "b=2"]}})
        );
        let resp = http::Response::builder()
            .status(200)
            .body(Bytes::new())
            .unwrap();
        assert_eq!(answer_entry(&Method::HEAD, &resp).get("body"), None);
        assert_eq!(answer_entry(&Method::GET, &resp)["body"], "");
    }

    #[test]
    fn the_api_follows_plugin_attr() {
        let services = PluginServices::default();
        assert_eq!(apis(&services)[0].uri, DEFAULT_URI);
        let mut attr = ferrisix_config::settings::PluginAttr::default();
        attr.others.insert(NAME.into(), json!({"uri": "/foo/bar"}));
        let services = PluginServices::new(
            attr,
            ferrisix_plugin_api::Executor::current(),
            Default::default(),
        );
        let list = apis(&services);
        assert_eq!(list[0].uri, "/foo/bar");
        assert!(list[0].matches(&Method::POST, "/foo/bar"));
        assert!(!list[0].matches(&Method::GET, "/foo/bar"));
        let mut attr = ferrisix_config::settings::PluginAttr::default();
        attr.others.insert(NAME.into(), json!({"xyz": "/foo/bar"}));
        let services = PluginServices::new(
            attr,
            ferrisix_plugin_api::Executor::current(),
            Default::default(),
        );
        assert_eq!(apis(&services)[0].uri, DEFAULT_URI);
    }

    #[test]
    fn metadata_limits() {
        let services = Arc::new(PluginServices::default());
        let api = BatchApi::new(None, &services);
        assert_eq!(
            (api.max_body_size, api.max_pipeline_items),
            (DEFAULT_MAX_BODY_SIZE, DEFAULT_MAX_PIPELINE_ITEMS)
        );
        let meta = json!({"max_body_size": 2048, "max_pipeline_items": 2});
        let api = BatchApi::new(Some(&meta), &services);
        assert_eq!((api.max_body_size, api.max_pipeline_items), (2048, 2));
        assert_eq!(
            too_large(4096, 2048).body.unwrap(),
            "{\"error_msg\":\"request size 4096 is greater than the maximum size 2048 allowed\"}\n"
        );
    }
}
