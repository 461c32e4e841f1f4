//! The schemas APISIX's `ai-proxy/schema.lua` shares between ai-proxy, ai-proxy-multi and
//! ai-request-rewrite, and its checks beyond them.

use serde_json::{json, Map, Value};

use super::call::Endpoint;
use super::protocol::Protocol;
use super::provider::Provider;

pub fn providers() -> Value {
    json!(Provider::NAMES)
}

/// `auth`: header and query keys, a GCP service account, AWS keys.
pub fn auth() -> Value {
    let item =
        json!({"type": "object", "patternProperties": {"^[a-zA-Z0-9._-]+$": {"type": "string"}}});
    json!({
        "type": "object",
        "patternProperties": {
            "header": item,
            "query": item,
            "gcp": {"type": "object", "properties": {
                "service_account_json": {"type": "string"},
                "max_ttl": {"type": "integer", "minimum": 1},
                "expire_early_secs": {"type": "integer", "minimum": 0, "default": 60}
            }},
            "aws": {"type": "object", "properties": {
                "access_key_id": {"type": "string", "minLength": 1},
                "secret_access_key": {"type": "string", "minLength": 1},
                "session_token": {"type": "string", "minLength": 1}
            }, "required": ["access_key_id", "secret_access_key"]}
        },
        "additionalProperties": false
    })
}

pub fn options() -> Value {
    json!({"type": "object", "properties": {"model": {"type": "string"}}, "additionalProperties": true})
}

fn override_schema() -> Value {
    let mut per_protocol = Map::new();
    for p in Protocol::ALL {
        per_protocol.insert(
            p.name().into(),
            json!({"type": "object", "additionalProperties": true}),
        );
    }
    json!({
        "type": "object",
        "properties": {
            "endpoint": {"type": "string", "minLength": 1},
            "llm_options": {"type": "object", "properties": {
                "max_tokens": {"type": "integer", "minimum": 1}
            }, "additionalProperties": false},
            "request_body": {"type": "object", "properties": per_protocol, "additionalProperties": false},
            "request_body_force_override": {"type": "boolean", "default": false}
        }
    })
}

fn provider_conf() -> Value {
    json!({"type": "object", "properties": {
        "project_id": {"type": "string"},
        "region": {"type": "string", "minLength": 1}
    }})
}

fn logging() -> Value {
    json!({"type": "object", "properties": {
        "summaries": {"type": "boolean", "default": false},
        "payloads": {"type": "boolean", "default": false}
    }})
}

/// The connection and size settings both proxies share.
fn common(props: &mut Map<String, Value>) {
    let extra = json!({
        "logging": logging(),
        "timeout": {"type": "integer", "minimum": 1, "maximum": 600000, "default": 30000},
        "max_req_body_size": {"type": "integer", "minimum": 1, "default": 67108864},
        "max_stream_duration_ms": {"type": "integer", "minimum": 1},
        "max_response_bytes": {"type": "integer", "minimum": 1},
        "keepalive": {"type": "boolean", "default": true},
        "keepalive_timeout": {"type": "integer", "minimum": 1000, "default": 60000},
        "keepalive_pool": {"type": "integer", "minimum": 1, "default": 30},
        "streaming_flush_interval_ms": {"type": "integer", "minimum": 0, "default": 10},
        "ssl_verify": {"type": "boolean", "default": true}
    });
    if let Value::Object(m) = extra {
        props.extend(m);
    }
}

pub fn ai_proxy() -> Value {
    let mut props = Map::new();
    props.insert(
        "provider".into(),
        json!({"type": "string", "enum": providers()}),
    );
    props.insert("provider_conf".into(), provider_conf());
    props.insert("auth".into(), auth());
    props.insert("options".into(), options());
    props.insert("override".into(), override_schema());
    common(&mut props);
    json!({"type": "object", "properties": props, "required": ["provider", "auth"]})
}

pub fn ai_proxy_multi() -> Value {
    let instance = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 100},
            "provider": {"type": "string", "enum": providers()},
            "priority": {"type": "integer", "default": 0},
            "weight": {"type": "integer", "minimum": 0},
            "auth": auth(),
            "options": options(),
            "override": override_schema(),
            "provider_conf": provider_conf(),
            "checks": {"type": "object", "properties": {"active": {"type": "object"}}, "required": ["active"]},
            "examples": {"type": "array", "minItems": 1, "maxItems": 64, "items": {"type": "string", "minLength": 1}},
            "threshold": {"type": "number", "minimum": -1, "maximum": 1}
        },
        "required": ["name", "provider", "auth", "weight"]
    });
    let mut props = Map::new();
    props.insert(
        "balancer".into(),
        json!({"type": "object", "properties": {
            "algorithm": {"type": "string", "enum": ["chash", "roundrobin", "semantic"]},
            "hash_on": {"type": "string", "default": "vars", "enum": ["vars", "header", "cookie", "consumer", "vars_combinations"]},
            "key": {"type": "string"}
        }, "default": {"algorithm": "roundrobin"}}),
    );
    props.insert(
        "instances".into(),
        json!({"type": "array", "minItems": 1, "items": instance}),
    );
    props.insert("semantic_opts".into(), json!({"type": "object"}));
    props.insert(
        "fallback_strategy".into(),
        json!({"anyOf": [
            {"type": "string", "enum": ["instance_health_and_rate_limiting", "http_429", "http_5xx"]},
            {"type": "array", "items": {"type": "string", "enum": ["rate_limiting", "http_429", "http_5xx"]}}
        ]}),
    );
    props.insert(
        "fallback_http_statuses".into(),
        json!({"type": "array", "minItems": 1, "uniqueItems": true, "items": {"type": "integer", "minimum": 400, "maximum": 599}}),
    );
    props.insert(
        "max_retries".into(),
        json!({"type": "integer", "minimum": 0}),
    );
    props.insert(
        "retry_on_failure_within_ms".into(),
        json!({"type": "integer", "minimum": 1}),
    );
    common(&mut props);
    json!({"type": "object", "properties": props, "required": ["instances"]})
}

/// `validate_provider_requirements`: what vertex-ai and bedrock cannot do without.
pub fn provider_requirements(conf: &Value) -> Result<(), String> {
    let provider = conf.get("provider").and_then(Value::as_str);
    let has_endpoint = conf
        .get("override")
        .and_then(|o| o.get("endpoint"))
        .is_some();
    let pc = conf.get("provider_conf");
    let pc_has = |k: &str| pc.and_then(|p| p.get(k)).is_some();
    match provider {
        Some("vertex-ai") if !(has_endpoint || pc_has("project_id") && pc_has("region")) => Err(
            "vertex-ai requires either provider_conf (project_id + region) or override.endpoint"
                .into(),
        ),
        Some("bedrock") if !pc_has("region") => Err("bedrock requires provider_conf.region".into()),
        Some("bedrock") if conf.get("auth").and_then(|a| a.get("aws")).is_none() => {
            Err("bedrock requires auth.aws".into())
        }
        _ => Ok(()),
    }
}

/// The GCP service account, when given inline, is JSON.
pub fn check_gcp(conf: &Value) -> Result<(), String> {
    if let Some(sa) = conf
        .get("auth")
        .and_then(|a| a.get("gcp"))
        .and_then(|g| g.get("service_account_json"))
        .and_then(Value::as_str)
    {
        if !sa.starts_with("$secret://") && !sa.starts_with("$env://") {
            serde_json::from_str::<Value>(sa)
                .map_err(|e| format!("invalid gcp service_account_json: {e}"))?;
        }
    }
    Ok(())
}

/// ai-proxy-multi's endpoint check: `http(s)://host...`.
pub fn valid_endpoint(endpoint: &str) -> bool {
    Endpoint::parse(endpoint).is_some()
}
