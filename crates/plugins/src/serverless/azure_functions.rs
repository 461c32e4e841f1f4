//! azure-functions (`apisix/plugins/azure-functions.lua`): the request sent to an Azure
//! Functions HTTP trigger (`function_uri`), as the generic function call does, with Azure's
//! function keys: unless the client sent `x-functions-key` or `x-functions-clientid`, the
//! conf's `authorization.apikey` and `authorization.clientid` go as those headers, else
//! (no `authorization`) the plugin metadata's `master_apikey` and `master_clientid`.

use std::sync::Arc;

use ferrisix_plugin_api::{CompileCtx, Plugin, PluginDef};
use http::{HeaderName, HeaderValue};
use serde_json::{json, Value};

use super::generic_upstream::{self, Call};

pub const NAME: &str = "azure-functions";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &["authorization.apikey"],
    metadata_schema: Some(metadata_schema),
    ..PluginDef::new(NAME, -1900, schema, compile)
};

fn schema() -> Value {
    generic_upstream::schema(Some(json!({
        "type": "object",
        "properties": {"apikey": {"type": "string"}, "clientid": {"type": "string"}}
    })))
}

fn metadata_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "master_apikey": {"type": "string", "default": ""},
            "master_clientid": {"type": "string", "default": ""}
        }
    })
}

const KEY: HeaderName = HeaderName::from_static("x-functions-key");
const CLIENT_ID: HeaderName = HeaderName::from_static("x-functions-clientid");

fn header_value(v: Option<&Value>, field: &str) -> Result<Option<HeaderValue>, String> {
    v.and_then(Value::as_str)
        .map(HeaderValue::from_str)
        .transpose()
        .map_err(|_| format!("invalid {field}"))
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    // The headers to add: the conf's authorization, else the metadata's master keys (a
    // metadata's absent key is its default, "").
    let (key, client_id) = match conf.get("authorization") {
        Some(a) => (
            header_value(a.get("apikey"), "authorization.apikey")?,
            header_value(a.get("clientid"), "authorization.clientid")?,
        ),
        None => match cx.metadata {
            Some(m) => (
                header_value(m.get("master_apikey").or(Some(&json!(""))), "master_apikey")?,
                header_value(
                    m.get("master_clientid").or(Some(&json!(""))),
                    "master_clientid",
                )?,
            ),
            None => (None, None),
        },
    };
    generic_upstream::compile(
        cx,
        NAME,
        Box::new(move |call: &mut Call| {
            if call.headers.contains_key(KEY) || call.headers.contains_key(CLIENT_ID) {
                return;
            }
            if let Some(k) = &key {
                call.headers.insert(KEY, k.clone());
            }
            if let Some(c) = &client_id {
                call.headers.insert(CLIENT_ID, c.clone());
            }
        }),
    )
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::RouteInfo;
    use http::Method;

    use super::super::generic_upstream::testing::{call, platform, seen};
    use super::*;
    use crate::testing::Compiler;

    /// An Azure Functions host: a function at `/api/<name>` with the key `fn-key` (or the
    /// host's master key `master`); others get 401, as Azure answers.
    fn azure(s: &Value) -> (u16, String) {
        let key = s["headers"]["x-functions-key"].as_str().unwrap_or("");
        if !s["path"].as_str().unwrap_or("").starts_with("/api/") {
            return (404, "{}".into());
        }
        if key != "fn-key" && key != "master" {
            return (401, "{}".into());
        }
        (200, s.to_string())
    }

    fn route() -> RouteInfo {
        RouteInfo {
            id: "1".into(),
            name: None,
            service_id: None,
            service_name: None,
            uris: vec!["/azure/*".to_owned()].into(),
            hosts: Box::default(),
        }
    }

    fn request(method: Method, uri: &str) -> TestRequest {
        let mut r = TestRequest::new(method, uri).route(route());
        r.state.set_matched(Some(0), None);
        r
    }

    #[tokio::test]
    async fn keys_from_conf_client_or_metadata() {
        let addr = platform(azure).await;
        let c = Compiler::new();
        let uri = format!("http://{addr}/api");
        let conf =
            json!({"function_uri": uri, "authorization": {"apikey": "fn-key", "clientid": "c1"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "az-1", None)).unwrap();
        let mut req = request(Method::POST, "/azure/httptrigger?name=x")
            .header("content-type", "application/json")
            .header("content-length", "2");
        req.state
            .set_body(ferrisix_plugin_api::RequestBody::Buffered("{}".into()));
        let e = call(&*p, req).await;
        assert_eq!(e.status, 200);
        let s = seen(&e);
        assert_eq!(s["method"], "POST");
        // The route's wildcard part follows the function's path.
        assert_eq!(s["path"], "/api/httptrigger");
        assert_eq!(s["query"], "name=x");
        assert_eq!(s["headers"]["x-functions-clientid"], "c1");
        assert_eq!(s["body"], "{}");
        assert!(e.headers.iter().any(|(k, v)| k == "x-fn" && v == "called"));
        // The client's key wins.
        let e = call(
            &*p,
            request(Method::GET, "/azure/f").header("x-functions-key", "bad"),
        )
        .await;
        assert_eq!(e.status, 401);
        // Without authorization: the metadata's master key.
        let conf = json!({"function_uri": uri});
        let meta = json!({"master_apikey": "master"});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "az-2", Some(&meta))).unwrap();
        let e = call(&*p, request(Method::GET, "/azure/f")).await;
        assert_eq!(e.status, 200);
        assert_eq!(seen(&e)["headers"]["x-functions-clientid"], "");
        // Nothing anywhere: no key, Azure refuses.
        let p = (DEF.compile)(&c.cx(NAME, &conf, "az-3", None)).unwrap();
        assert_eq!(
            call(&*p, request(Method::GET, "/azure/f")).await.status,
            401
        );
    }

    #[tokio::test]
    async fn unreachable_functions_are_503() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let c = Compiler::new();
        let conf = json!({"function_uri": format!("http://{addr}/api"), "timeout": 500});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "az-4", None)).unwrap();
        assert_eq!(
            call(&*p, request(Method::GET, "/azure/f")).await.status,
            503
        );
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        assert!(r
            .check(NAME, &json!({"function_uri": "http://a/api"}))
            .is_ok());
        assert_eq!(
            r.check(NAME, &json!({"function_uri": "http://a/api", "authorization": {"apikey": 1}}))
                .unwrap_err(),
            "failed to check the configuration of plugin azure-functions err: property \"authorization\" validation failed: property \"apikey\" validation failed: wrong type: expected string, got number"
        );
        assert!(r
            .check_metadata(NAME, &json!({"master_apikey": "k"}))
            .is_ok());
        assert_eq!(r.get(NAME).unwrap().priority, -1900);
    }
}
