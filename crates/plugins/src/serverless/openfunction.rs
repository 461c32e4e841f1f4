//! openfunction (`apisix/plugins/openfunction.lua`): the request sent to an OpenFunction
//! function (`function_uri`), as the generic function call does, with
//! `authorization.service_token` (`user:password`) as `Authorization: Basic`.

use std::sync::Arc;

use base64::Engine;
use ferrisix_plugin_api::{CompileCtx, Plugin, PluginDef};
use http::HeaderValue;
use serde_json::{json, Value};

use super::generic_upstream::{self, Call};

pub const NAME: &str = "openfunction";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &["authorization.service_token"],
    ..PluginDef::new(NAME, -1902, schema, compile)
};

fn schema() -> Value {
    // APISIX's `authorization` schema is written without `type`/`properties` (a
    // `service_token` keyword the validator ignores), so any value passes; the plugin reads
    // `authorization.service_token`.
    generic_upstream::schema(Some(json!({"service_token": {"type": "string"}})))
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let basic = conf
        .get("authorization")
        .and_then(|a| a.get("service_token"))
        .and_then(Value::as_str)
        .map(|t| {
            let encoded = base64::engine::general_purpose::STANDARD.encode(t);
            HeaderValue::from_str(&format!("Basic {encoded}"))
        })
        .transpose()
        .map_err(|_| "invalid authorization.service_token".to_string())?;
    generic_upstream::compile(
        cx,
        NAME,
        Box::new(move |call: &mut Call| {
            if let Some(b) = &basic {
                call.headers.insert(http::header::AUTHORIZATION, b.clone());
            }
        }),
    )
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;

    use super::super::generic_upstream::testing::{call, platform};
    use super::*;
    use crate::testing::Compiler;

    /// An OpenFunction function behind its gateway with basic auth `test:test`: the
    /// function answers `Hello, <path's last segment>!`.
    fn function(s: &Value) -> (u16, String) {
        if s["headers"]["authorization"] != "Basic dGVzdDp0ZXN0" {
            return (401, "unauthorized".into());
        }
        let name = s["path"]
            .as_str()
            .unwrap_or("")
            .rsplit('/')
            .next()
            .unwrap_or("");
        (200, format!("Hello, {name}!"))
    }

    #[tokio::test]
    async fn basic_service_token() {
        let addr = platform(function).await;
        let c = Compiler::new();
        let uri = format!("http://{addr}/default/function-sample/world");
        let conf = json!({"function_uri": uri, "authorization": {"service_token": "test:test"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "of-1", None)).unwrap();
        let e = call(&*p, TestRequest::get("/hello")).await;
        assert_eq!(e.status, 200);
        assert_eq!(e.body.as_deref(), Some(&b"Hello, world!"[..]));
        let conf = json!({"function_uri": uri});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "of-2", None)).unwrap();
        assert_eq!(call(&*p, TestRequest::get("/hello")).await.status, 401);
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        assert_eq!(
            r.check(NAME, &json!({})).unwrap_err(),
            "failed to check the configuration of plugin openfunction err: property \"function_uri\" is required"
        );
        assert!(r
            .check(
                NAME,
                &json!({"function_uri": "http://a/b", "authorization": {"service_token": "u:p"}})
            )
            .is_ok());
        assert_eq!(r.get(NAME).unwrap().priority, -1902);
    }
}
