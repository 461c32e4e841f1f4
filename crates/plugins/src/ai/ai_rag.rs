//! ai-rag (`apisix/plugins/ai-rag.lua`, `ai-rag/`): retrieval-augmented generation. The
//! request's `ai_rag.embeddings` object is sent to Azure OpenAI's embeddings API, the vector
//! it answers is searched in Azure AI Search (`vectorQueries` over `ai_rag.vector_search.fields`),
//! and the search's answer is appended to the conversation as a user message (by the
//! request's protocol: a chat's `messages`, the Responses API's `input` ...), `ai_rag`
//! removed, before ai-proxy sends it on. Either service's error status and body are the
//! client's answer; a request without `ai_rag`, or one whose `ai_rag` is not as the
//! providers need, is a 400.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_plugin_api::{
    BodyError, CheckCtx, CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef,
    PluginServices, Step,
};
use http::{header, HeaderName, HeaderValue, Request, StatusCode};
use serde_json::{json, Map, Value};

use crate::support::ai::protocol::Protocol;
use crate::support::ai::set_body;

pub const NAME: &str = "ai-rag";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    encrypt_fields: &[
        "embeddings_provider.azure_openai.api_key",
        "vector_search_provider.azure_ai_search.api_key",
    ],
    ..PluginDef::new(NAME, 1060, conf_schema, compile)
};

/// resty.http's default timeout, which APISIX's calls keep.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

fn endpoint_and_key() -> Value {
    json!({
        "type": "object",
        "properties": {
            "endpoint": {"type": "string"},
            "api_key": {"type": "string"}
        },
        "required": ["endpoint", "api_key"]
    })
}

fn conf_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "ssl_verify": {"type": "boolean", "default": true},
            "embeddings_provider": {
                "type": "object",
                "properties": {"azure_openai": endpoint_and_key()},
                "required": ["azure_openai"],
                "maxProperties": 1
            },
            "vector_search_provider": {
                "type": "object",
                "properties": {"azure_ai_search": endpoint_and_key()},
                "required": ["azure_ai_search"],
                "maxProperties": 1
            }
        },
        "required": ["embeddings_provider", "vector_search_provider"]
    })
}

/// What the request's `ai_rag` must hold for the two providers.
fn request_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "ai_rag": {
                "type": "object",
                "properties": {
                    "vector_search": {
                        "type": "object",
                        "properties": {"fields": {"type": "string"}},
                        "required": ["fields"]
                    },
                    "embeddings": {
                        "type": "object",
                        "properties": {"input": {"type": "string"}},
                        "required": ["input"]
                    }
                },
                "required": ["vector_search", "embeddings"]
            }
        }
    })
}

/// APISIX's `check_tls_bool` and `check_https`: warnings, never refusals.
fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    if cx.conf.get("ssl_verify") == Some(&Value::Bool(false)) {
        tracing::warn!("Keeping ssl_verify disabled in {NAME} configuration is a security risk");
    }
    for path in [
        "/embeddings_provider/azure_openai/endpoint",
        "/vector_search_provider/azure_ai_search/endpoint",
    ] {
        if let Some(e) = cx.conf.pointer(path).and_then(Value::as_str) {
            if !e.starts_with("https://") {
                tracing::warn!("Using {NAME} {path} with no TLS is a security risk");
            }
        }
    }
    Ok(())
}

#[derive(Debug)]
struct Service {
    endpoint: String,
    api_key: HeaderValue,
}

impl Service {
    fn from_conf(conf: &Value, path: &str) -> Result<Service, String> {
        let c = conf
            .pointer(path)
            .ok_or_else(|| format!("{path} is missing"))?;
        let field = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or_default();
        Ok(Service {
            endpoint: field("endpoint").to_owned(),
            api_key: HeaderValue::from_str(field("api_key"))
                .map_err(|_| format!("invalid api_key in {path}"))?,
        })
    }
}

#[derive(Debug)]
struct AiRag {
    embeddings: Service,
    search: Service,
    ssl_verify: bool,
    request_schema: Value,
    services: Arc<PluginServices>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    Ok(Arc::new(AiRag {
        embeddings: Service::from_conf(&conf, "/embeddings_provider/azure_openai")?,
        search: Service::from_conf(&conf, "/vector_search_provider/azure_ai_search")?,
        ssl_verify: conf.get("ssl_verify").and_then(Value::as_bool) != Some(false),
        request_schema: request_schema(),
        services: cx.services.clone(),
    }))
}

/// A failed call: the status and body the client gets.
struct Failure(StatusCode, String);

impl Failure {
    fn internal(e: impl std::fmt::Display) -> Failure {
        Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
    }

    fn exit(self) -> Exit {
        Exit::body(self.0, self.1)
    }
}

/// `{"message": text}` and its newline, as APISIX answers a table.
fn message_exit(status: StatusCode, text: &str) -> Exit {
    Exit::body(status, format!("{}\n", json!({ "message": text }))).with_header(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    )
}

impl AiRag {
    /// POSTs `body` to `svc` with its `api-key`; the answer's body when it is a 200.
    async fn post(&self, svc: &Service, body: &Value) -> Result<Bytes, Failure> {
        let mut req = Request::post(&svc.endpoint)
            .body(Bytes::from(body.to_string()))
            .map_err(Failure::internal)?;
        let h = req.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(HeaderName::from_static("api-key"), svc.api_key.clone());
        let resp = self
            .services
            .http()
            .send_verified(req, CALL_TIMEOUT, self.ssl_verify)
            .await
            .map_err(Failure::internal)?;
        let status = resp.status();
        let body = resp.into_body();
        if status != StatusCode::OK {
            return Err(Failure(status, String::from_utf8_lossy(&body).into_owned()));
        }
        Ok(body)
    }

    async fn embed(&self, input: &Value) -> Result<Value, Failure> {
        let body = self.post(&self.embeddings, input).await?;
        let answer: Value = serde_json::from_slice(&body).map_err(Failure::internal)?;
        match answer.get("data").and_then(Value::as_array) {
            Some(data) if !data.is_empty() => {
                Ok(data[0].get("embedding").cloned().unwrap_or(Value::Null))
            }
            _ => Err(Failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                String::from_utf8_lossy(&body).into_owned(),
            )),
        }
    }

    async fn run(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let bytes = match ctx.read_body(usize::MAX).await {
            Ok(b) if !b.is_empty() => b.clone(),
            Ok(_) => {
                return Flow::Exit(message_exit(
                    StatusCode::BAD_REQUEST,
                    "could not get body: request body is empty",
                ))
            }
            Err(BodyError::TooLarge(max)) => {
                return Flow::Exit(message_exit(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!("could not get body: request size is greater than the maximum size {max} allowed"),
                ))
            }
            Err(e) => {
                return Flow::Exit(message_exit(
                    StatusCode::BAD_REQUEST,
                    &format!("could not get body: {e}"),
                ))
            }
        };
        let mut body: Value = match serde_json::from_slice(&bytes) {
            Ok(v) => v,
            Err(e) => {
                return Flow::Exit(message_exit(
                    StatusCode::BAD_REQUEST,
                    &format!("could not parse JSON request body: {e}"),
                ))
            }
        };
        if body.get("ai_rag").is_none_or(Value::is_null) {
            tracing::error!("request body must have \"ai-rag\" field");
            return Flow::Exit(Exit::status(StatusCode::BAD_REQUEST));
        }
        if let Err(e) = ferrisix_config::schema::validate(&self.request_schema, &body) {
            tracing::error!("request body fails schema check: {e}");
            return Flow::Exit(Exit::status(StatusCode::BAD_REQUEST));
        }
        let rag = body["ai_rag"].clone();
        let embedding = match self.embed(&rag["embeddings"]).await {
            Ok(v) => v,
            Err(f) => {
                tracing::error!("could not get embeddings: {}", f.1);
                return Flow::Exit(f.exit());
            }
        };
        let search = json!({"vectorQueries": [{
            "kind": "vector",
            "vector": embedding,
            "fields": rag["vector_search"]["fields"]
        }]});
        let found = match self.post(&self.search, &search).await {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(f) => {
                tracing::error!("could not get vector_search result: {}", f.1);
                return Flow::Exit(f.exit());
            }
        };
        if let Some(obj) = body.as_object_mut() {
            obj.remove("ai_rag");
        }
        append_user_message(&mut body, ctx.uri(), found);
        set_body(ctx, Bytes::from(body.to_string()));
        Flow::Continue
    }
}

/// `ai-protocols`' `append_messages` of one user message, by the protocol the body speaks
/// (an OpenAI chat when it speaks none: a body of only `ai_rag` gets `messages`).
fn append_user_message(body: &mut Value, uri: &str, content: String) {
    let protocol = Protocol::detect(body, uri).unwrap_or(Protocol::OpenAiChat);
    let Some(obj) = body.as_object_mut() else {
        return;
    };
    let push_message = |obj: &mut Map<String, Value>, msg: Value| {
        let list = obj
            .entry("messages")
            .or_insert_with(|| Value::Array(Vec::new()));
        if !list.is_array() {
            *list = Value::Array(Vec::new());
        }
        if let Value::Array(a) = list {
            a.push(msg);
        }
    };
    match protocol {
        Protocol::OpenAiChat | Protocol::AnthropicMessages => {
            push_message(obj, json!({"role": "user", "content": content}));
        }
        Protocol::BedrockConverse => {
            push_message(obj, json!({"role": "user", "content": [{"text": content}]}));
        }
        Protocol::OpenAiResponses => match obj.get_mut("input") {
            Some(Value::String(s)) => {
                s.push('\n');
                s.push_str(&content);
            }
            Some(Value::Array(a)) => {
                a.push(json!({"type": "message", "role": "user", "content": content}));
            }
            _ => {
                obj.insert("input".into(), Value::String(content));
            }
        },
        Protocol::OpenAiEmbeddings | Protocol::Passthrough => {}
    }
}

impl Plugin for AiRag {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.run(ctx)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf() -> Value {
        json!({
            "embeddings_provider": {"azure_openai": {"endpoint": "http://a.b.com", "api_key": "k"}},
            "vector_search_provider": {"azure_ai_search": {"endpoint": "http://a.b.com", "api_key": "k"}}
        })
    }

    #[test]
    fn schema_as_apisix() {
        let schema = conf_schema();
        let err = |c: Value| ferrisix_config::schema::validate(&schema, &c).err();
        assert_eq!(err(conf()), None);
        let mut no_search = conf();
        no_search
            .as_object_mut()
            .unwrap()
            .remove("vector_search_provider");
        assert_eq!(
            err(no_search).as_deref(),
            Some("property \"vector_search_provider\" is required")
        );
        let mut no_emb = conf();
        no_emb
            .as_object_mut()
            .unwrap()
            .remove("embeddings_provider");
        assert_eq!(
            err(no_emb).as_deref(),
            Some("property \"embeddings_provider\" is required")
        );
        let mut two = conf();
        two["embeddings_provider"]["openai"] = json!({});
        assert!(err(two).is_some());
        let mut filled = conf();
        ferrisix_config::schema::validate_and_fill(&schema, &mut filled).unwrap();
        assert_eq!(filled["ssl_verify"], true);
    }

    #[test]
    fn request_checks_as_apisix() {
        let schema = request_schema();
        let err = |c: Value| ferrisix_config::schema::validate(&schema, &c).err();
        assert_eq!(
            err(json!({"ai_rag": {"vector_search": {"missing-fields": "x"}, "embeddings": {"input": "q"}}})).as_deref(),
            Some("property \"ai_rag\" validation failed: property \"vector_search\" validation failed: property \"fields\" is required")
        );
        assert_eq!(
            err(json!({"ai_rag": {"vector_search": {"fields": "x"}, "embeddings": {"missinginput": "q"}}})).as_deref(),
            Some("property \"ai_rag\" validation failed: property \"embeddings\" validation failed: property \"input\" is required")
        );
    }

    #[test]
    fn appended_by_protocol() {
        let mut b = json!({});
        append_user_message(&mut b, "/echo", "r".into());
        assert_eq!(b, json!({"messages": [{"role": "user", "content": "r"}]}));
        let mut b = json!({"messages": [{"role": "system", "content": "s"}]});
        append_user_message(&mut b, "/chat", "r".into());
        assert_eq!(b["messages"][1], json!({"role": "user", "content": "r"}));
        let mut b = json!({"input": "q"});
        append_user_message(&mut b, "/v1/responses", "r".into());
        assert_eq!(b, json!({"input": "q\nr"}));
        let mut b = json!({"input": [{"role": "user", "content": "q"}]});
        append_user_message(&mut b, "/v1/responses", "r".into());
        assert_eq!(
            b["input"][1],
            json!({"type": "message", "role": "user", "content": "r"})
        );
        let mut b = json!({"other": 1});
        append_user_message(&mut b, "/x", "r".into());
        assert_eq!(b, json!({"other": 1}));
    }
}
