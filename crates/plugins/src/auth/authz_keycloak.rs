//! authz-keycloak (`apisix/plugins/authz-keycloak.lua`): Keycloak's Authorization Services.
//! The request's bearer token (`Authorization`, `Bearer ` added when missing; none: 401
//! "Missing JWT token in request") asks the token endpoint (`token_endpoint`, or the
//! discovery document's) for a UMA decision (`grant_type`
//! `urn:ietf:params:oauth:grant-type:uma-ticket`, `audience` the `client_id`,
//! `response_mode=decision`, one `permission` per configured permission, each with the
//! method as scope under `http_method_as_scope`). A 2xx decision lets the request through;
//! 401, 403 and other errors are answered as Keycloak gave them (403 redirects to
//! `access_denied_redirect_uri` with 307 when set). With no permissions and
//! `policy_enforcement_mode` `ENFORCING` the answer is 403
//! `{"error":"access_denied","error_description":"not_authorized"}`.
//!
//! Not built: `lazy_load_paths` (resolving the path to resources at the resource
//! registration endpoint with a service account token; such a request answers 503) and the
//! password grant of `password_grant_token_generation_incoming_uri` (the request goes on to
//! the decision).

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use ferrisix_plugin_api::{
    CompileCtx, Exit, Flow, KeepAlive, Phases, Plugin, PluginCtx, PluginDef, PluginServices, Step,
};
use http::{HeaderValue, Request, StatusCode};
use serde_json::{json, Value};

use crate::support::auth::message_exit;

pub const NAME: &str = "authz-keycloak";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &["client_secret"],
    ..PluginDef::new(NAME, 2000, schema, compile)
};

fn schema() -> Value {
    let text = |max: u64| json!({"type": "string", "minLength": 1, "maxLength": max});
    let int =
        |min: u64, default: u64| json!({"type": "integer", "minimum": min, "default": default});
    json!({
        "type": "object",
        "properties": {
            "max_req_body_size": int(1, 67_108_864),
            "discovery": text(4096),
            "token_endpoint": text(4096),
            "resource_registration_endpoint": text(4096),
            "client_id": text(100),
            "client_secret": text(100),
            "grant_type": {
                "type": "string",
                "default": "urn:ietf:params:oauth:grant-type:uma-ticket",
                "enum": ["urn:ietf:params:oauth:grant-type:uma-ticket"],
                "minLength": 1, "maxLength": 100
            },
            "policy_enforcement_mode": {
                "type": "string", "enum": ["ENFORCING", "PERMISSIVE"], "default": "ENFORCING"
            },
            "permissions": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": 100},
                "uniqueItems": true,
                "default": []
            },
            "lazy_load_paths": {"type": "boolean", "default": false},
            "http_method_as_scope": {"type": "boolean", "default": false},
            "timeout": int(1000, 3000),
            "ssl_verify": {"type": "boolean", "default": true},
            "cache_ttl_seconds": int(1, 86_400),
            "keepalive": {"type": "boolean", "default": true},
            "keepalive_timeout": int(1000, 60_000),
            "keepalive_pool": int(1, 5),
            "access_denied_redirect_uri": text(2048),
            "access_token_expires_in": int(1, 300),
            "access_token_expires_leeway": int(0, 0),
            "refresh_token_expires_in": int(1, 3600),
            "refresh_token_expires_leeway": int(0, 0),
            "password_grant_token_generation_incoming_uri": text(4096)
        },
        "required": ["client_id"],
        "allOf": [
            {"anyOf": [{"required": ["discovery"]}, {"required": ["token_endpoint"]}]},
            {"anyOf": [
                {"properties": {"lazy_load_paths": {"enum": [false]}}},
                {
                    "properties": {"lazy_load_paths": {"enum": [true]}},
                    "anyOf": [
                        {"required": ["discovery"]},
                        {"required": ["resource_registration_endpoint"]}
                    ]
                }
            ]}
        ]
    })
}

struct AuthzKeycloak {
    client_id: String,
    grant_type: String,
    discovery: Option<String>,
    token_endpoint: Option<String>,
    enforcing: bool,
    permissions: Vec<String>,
    lazy_load_paths: bool,
    http_method_as_scope: bool,
    timeout: Duration,
    ssl_verify: bool,
    /// `keepalive*`: the connection kept for the next call (`None`: closed after it).
    keepalive: Option<KeepAlive>,
    access_denied_redirect_uri: Option<HeaderValue>,
    services: Arc<PluginServices>,
    /// The token endpoint the discovery document named.
    discovered: ArcSwapOption<String>,
}

impl std::fmt::Debug for AuthzKeycloak {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthzKeycloak")
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let s = |k: &str| conf.get(k).and_then(Value::as_str).map(str::to_owned);
    Ok(Arc::new(AuthzKeycloak {
        client_id: s("client_id").unwrap_or_default(),
        grant_type: s("grant_type").unwrap_or_default(),
        discovery: s("discovery"),
        token_endpoint: s("token_endpoint"),
        enforcing: s("policy_enforcement_mode").as_deref() != Some("PERMISSIVE"),
        permissions: conf["permissions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p.as_str().map(str::to_owned))
            .collect(),
        lazy_load_paths: conf["lazy_load_paths"].as_bool().unwrap_or(false),
        http_method_as_scope: conf["http_method_as_scope"].as_bool().unwrap_or(false),
        timeout: Duration::from_millis(conf["timeout"].as_u64().unwrap_or(3000)),
        ssl_verify: conf["ssl_verify"].as_bool().unwrap_or(true),
        keepalive: conf.as_object().and_then(|c| KeepAlive::of_conf(c, 5)),
        access_denied_redirect_uri: s("access_denied_redirect_uri")
            .and_then(|u| HeaderValue::from_str(&u).ok()),
        services: cx.services.clone(),
        discovered: ArcSwapOption::empty(),
    }))
}

fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

impl AuthzKeycloak {
    fn denied_redirect(&self) -> Option<Flow> {
        let uri = self.access_denied_redirect_uri.clone()?;
        Some(Flow::Exit(
            Exit::status(StatusCode::TEMPORARY_REDIRECT).with_header(http::header::LOCATION, uri),
        ))
    }

    async fn token_endpoint(&self) -> Result<String, String> {
        if let Some(e) = &self.token_endpoint {
            return Ok(e.clone());
        }
        if let Some(e) = self.discovered.load_full() {
            return Ok((*e).clone());
        }
        let url = self
            .discovery
            .as_deref()
            .ok_or("Unable to determine token endpoint.")?;
        let req = Request::get(url)
            .body(Bytes::new())
            .map_err(|e| e.to_string())?;
        let resp = self
            .services
            .http()
            .send_kept(req, self.timeout, self.ssl_verify, self.keepalive)
            .await
            .map_err(|e| format!("Accessing discovery URL ({url}) failed: {e}"))?;
        let doc: Value =
            serde_json::from_slice(resp.body()).map_err(|_| "JSON decoding failed".to_owned())?;
        let e = doc
            .get("token_endpoint")
            .and_then(Value::as_str)
            .ok_or("Unable to determine token endpoint.")?
            .to_owned();
        self.discovered.store(Some(Arc::new(e.clone())));
        Ok(e)
    }

    async fn evaluate(&self, ctx: &mut PluginCtx<'_>, token: String) -> Flow {
        if self.lazy_load_paths {
            tracing::error!("authz-keycloak: lazy_load_paths is not supported by ferrisix");
            return Flow::Exit(Exit::status(StatusCode::SERVICE_UNAVAILABLE));
        }
        if self.permissions.is_empty() && self.enforcing {
            if let Some(r) = self.denied_redirect() {
                return r;
            }
            return Flow::Exit(Exit::body(
                StatusCode::FORBIDDEN,
                "{\"error\":\"access_denied\",\"error_description\":\"not_authorized\"}",
            ));
        }
        let endpoint = match self.token_endpoint().await {
            Ok(e) => e,
            Err(e) => {
                tracing::error!("{e}");
                return Flow::Exit(Exit::body(StatusCode::SERVICE_UNAVAILABLE, e));
            }
        };
        let mut body = format!(
            "grant_type={}&audience={}&response_mode=decision",
            enc(&self.grant_type),
            enc(&self.client_id)
        );
        for p in &self.permissions {
            let p = match (self.http_method_as_scope, p.contains('#')) {
                (false, _) => p.clone(),
                (true, true) => format!("{p}, {}", ctx.method()),
                (true, false) => format!("{p}#{}", ctx.method()),
            };
            body.push_str("&permission=");
            body.push_str(&enc(&p));
        }
        let req = Request::post(&endpoint)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("authorization", token)
            .body(Bytes::from(body));
        let Ok(req) = req else {
            return Flow::Exit(Exit::status(StatusCode::SERVICE_UNAVAILABLE));
        };
        let resp = match self
            .services
            .http()
            .send_kept(req, self.timeout, self.ssl_verify, self.keepalive)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("Error while sending authz request to {endpoint}: {e}");
                return Flow::Exit(Exit::status(StatusCode::SERVICE_UNAVAILABLE));
            }
        };
        let status = resp.status();
        if status == StatusCode::FORBIDDEN {
            if let Some(r) = self.denied_redirect() {
                return r;
            }
        }
        if status.as_u16() >= 400 {
            if status != StatusCode::FORBIDDEN && status != StatusCode::UNAUTHORIZED {
                tracing::error!(
                    "Request denied: Token endpoint returned an error (status: {})",
                    status.as_u16()
                );
            }
            return Flow::Exit(Exit::body(status, resp.body().clone()));
        }
        Flow::Continue
    }
}

impl Plugin for AuthzKeycloak {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let Some(token) = ctx.header("authorization").map(str::to_owned) else {
            return Step::exit(message_exit(
                StatusCode::UNAUTHORIZED,
                "Missing JWT token in request",
            ));
        };
        let token = if token.starts_with("Bearer ") || token.starts_with("bearer ") {
            token
        } else {
            format!("Bearer {token}")
        };
        Step::Wait(Box::pin(self.evaluate(ctx, token)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Compiler;
    use ferrisix_config::validate::PluginCheck;

    #[test]
    fn schema_messages() {
        let c = Compiler::new();
        let err = |conf: Value| c.registry.check(NAME, &conf).unwrap_err();
        let prefix = "failed to check the configuration of plugin authz-keycloak err: ";
        assert_eq!(
            err(json!({"client_id": "c"})),
            format!("{prefix}allOf 1 failed: object matches none of the required: [\"discovery\"] or [\"token_endpoint\"]")
        );
        assert_eq!(
            err(json!({"token_endpoint": "https://k/t"})),
            format!("{prefix}property \"client_id\" is required")
        );
        assert!(
            err(json!({"client_id": "c", "token_endpoint": "https://k/t",
            "lazy_load_paths": true}))
            .starts_with(&format!(
                "{prefix}allOf 2 failed: object matches none of the required"
            ))
        );
        assert!(c
            .registry
            .check(
                NAME,
                &json!({"client_id": "c", "token_endpoint": "https://k/t"})
            )
            .is_ok());
    }
}
