//! The providers of APISIX's `ai-providers/`: each one's default host, the path of each
//! protocol it speaks, and where `override.llm_options.max_tokens` goes in its body.

use serde_json::{Map, Value};

use super::protocol::Protocol;

/// A provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    OpenAi,
    DeepSeek,
    AimlApi,
    Anthropic,
    OpenAiCompatible,
    AzureOpenAi,
    OpenRouter,
    Gemini,
    VertexAi,
    Bedrock,
}

/// `provider_conf`: the project and region of vertex-ai and bedrock.
#[derive(Clone, Debug, Default)]
pub struct ProviderConf {
    pub project_id: Option<String>,
    pub region: Option<String>,
}

impl ProviderConf {
    pub fn from_conf(v: Option<&Value>) -> ProviderConf {
        let s = |k: &str| {
            v.and_then(|v| v.get(k))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        ProviderConf {
            project_id: s("project_id"),
            region: s("region"),
        }
    }
}

impl Provider {
    /// Every provider, in APISIX's schema order (its `enum`).
    pub const NAMES: [&'static str; 10] = [
        "openai",
        "deepseek",
        "aimlapi",
        "anthropic",
        "openai-compatible",
        "azure-openai",
        "openrouter",
        "gemini",
        "vertex-ai",
        "bedrock",
    ];

    pub fn parse(name: &str) -> Option<Provider> {
        Some(match name {
            "openai" => Provider::OpenAi,
            "deepseek" => Provider::DeepSeek,
            "aimlapi" => Provider::AimlApi,
            "anthropic" => Provider::Anthropic,
            "openai-compatible" => Provider::OpenAiCompatible,
            "azure-openai" => Provider::AzureOpenAi,
            "openrouter" => Provider::OpenRouter,
            "gemini" => Provider::Gemini,
            "vertex-ai" => Provider::VertexAi,
            "bedrock" => Provider::Bedrock,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::DeepSeek => "deepseek",
            Provider::AimlApi => "aimlapi",
            Provider::Anthropic => "anthropic",
            Provider::OpenAiCompatible => "openai-compatible",
            Provider::AzureOpenAi => "azure-openai",
            Provider::OpenRouter => "openrouter",
            Provider::Gemini => "gemini",
            Provider::VertexAi => "vertex-ai",
            Provider::Bedrock => "bedrock",
        }
    }

    /// The protocols it speaks natively, in APISIX's order.
    pub fn capabilities(self) -> &'static [Protocol] {
        use Protocol::*;
        match self {
            Provider::OpenAi | Provider::OpenAiCompatible => {
                &[OpenAiChat, OpenAiResponses, OpenAiEmbeddings]
            }
            Provider::Anthropic => &[OpenAiChat, AnthropicMessages],
            Provider::VertexAi => &[OpenAiChat, OpenAiEmbeddings],
            Provider::Bedrock => &[BedrockConverse],
            _ => &[OpenAiChat],
        }
    }

    /// Its host when `override.endpoint` names none.
    pub fn host(self, conf: &ProviderConf) -> Option<String> {
        Some(match self {
            Provider::OpenAi => "api.openai.com".into(),
            Provider::DeepSeek => "api.deepseek.com".into(),
            Provider::AimlApi => "api.aimlapi.com".into(),
            Provider::Anthropic => "api.anthropic.com".into(),
            Provider::OpenRouter => "openrouter.ai".into(),
            Provider::Gemini => "generativelanguage.googleapis.com".into(),
            Provider::VertexAi => match &conf.region {
                Some(r) => format!("{r}-aiplatform.googleapis.com"),
                None => "aiplatform.googleapis.com".into(),
            },
            Provider::Bedrock => format!("bedrock-runtime.{}.amazonaws.com", conf.region.as_ref()?),
            Provider::OpenAiCompatible | Provider::AzureOpenAi => return None,
        })
    }

    /// The path of `protocol` (one of its capabilities); `None` where it depends on what is
    /// missing (vertex-ai without project and region, bedrock without a model).
    pub fn path(
        self,
        protocol: Protocol,
        conf: &ProviderConf,
        model: Option<&str>,
        stream: bool,
    ) -> Option<String> {
        use Protocol::*;
        Some(match (self, protocol) {
            (Provider::DeepSeek | Provider::AimlApi, OpenAiChat) => "/chat/completions".into(),
            (Provider::AzureOpenAi, OpenAiChat) => "/completions".into(),
            (Provider::OpenRouter, OpenAiChat) => "/api/v1/chat/completions".into(),
            (Provider::Gemini, OpenAiChat) => "/v1beta/openai/chat/completions".into(),
            (Provider::VertexAi, OpenAiChat) => format!(
                "/v1beta1/projects/{}/locations/{}/endpoints/openapi/chat/completions",
                conf.project_id.as_ref()?,
                conf.region.as_ref()?
            ),
            (Provider::VertexAi, OpenAiEmbeddings) => format!(
                "/v1/projects/{}/locations/{}/publishers/google/models/{}:predict",
                conf.project_id.as_ref()?,
                conf.region.as_ref()?,
                model?
            ),
            (Provider::Bedrock, BedrockConverse) => {
                let model = model.filter(|m| !m.is_empty())?;
                let model = super::call::escape_uri(model);
                if stream {
                    format!("/model/{model}/converse-stream")
                } else {
                    format!("/model/{model}/converse")
                }
            }
            (_, OpenAiChat) => "/v1/chat/completions".into(),
            (_, OpenAiResponses) => "/v1/responses".into(),
            (_, OpenAiEmbeddings) => "/v1/embeddings".into(),
            (_, AnthropicMessages) => "/v1/messages".into(),
            _ => return None,
        })
    }

    /// Writes `override.llm_options.max_tokens` where the provider reads it for `protocol`
    /// (always overwriting the client's value, as APISIX forces it).
    pub fn set_max_tokens(self, protocol: Protocol, body: &mut Map<String, Value>, max: &Value) {
        use Protocol::*;
        match (self, protocol) {
            (Provider::OpenAi, OpenAiChat) => {
                body.insert("max_completion_tokens".into(), max.clone());
                body.remove("max_tokens");
            }
            (Provider::Gemini | Provider::VertexAi, OpenAiChat) => {
                body.insert("max_completion_tokens".into(), max.clone());
            }
            (_, OpenAiResponses) => {
                body.insert("max_output_tokens".into(), max.clone());
            }
            (Provider::Bedrock, BedrockConverse) => {
                let cfg = body
                    .entry("inferenceConfig")
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Some(cfg) = cfg.as_object_mut() {
                    cfg.insert("maxTokens".into(), max.clone());
                }
            }
            (_, OpenAiChat | AnthropicMessages) => {
                body.insert("max_tokens".into(), max.clone());
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn default_paths_and_hosts() {
        let none = ProviderConf::default();
        let chat = |p: Provider| p.path(Protocol::OpenAiChat, &none, None, false);
        assert_eq!(chat(Provider::OpenAi).unwrap(), "/v1/chat/completions");
        assert_eq!(chat(Provider::DeepSeek).unwrap(), "/chat/completions");
        assert_eq!(
            chat(Provider::OpenRouter).unwrap(),
            "/api/v1/chat/completions"
        );
        assert_eq!(
            chat(Provider::Gemini).unwrap(),
            "/v1beta/openai/chat/completions"
        );
        assert_eq!(chat(Provider::AzureOpenAi).unwrap(), "/completions");
        assert_eq!(chat(Provider::VertexAi), None);
        let vc = ProviderConf {
            project_id: Some("p".into()),
            region: Some("us-central1".into()),
        };
        assert_eq!(
            Provider::VertexAi.host(&vc).unwrap(),
            "us-central1-aiplatform.googleapis.com"
        );
        assert_eq!(
            Provider::Bedrock
                .path(Protocol::BedrockConverse, &vc, Some("a:b/c"), true)
                .unwrap(),
            "/model/a%3Ab%2Fc/converse-stream"
        );
        assert_eq!(Provider::OpenAiCompatible.host(&none), None);
        for name in Provider::NAMES {
            assert_eq!(Provider::parse(name).unwrap().name(), name);
        }
    }

    #[test]
    fn max_tokens_per_provider() {
        let mut b = json!({"max_tokens": 1}).as_object().cloned().unwrap();
        Provider::OpenAi.set_max_tokens(Protocol::OpenAiChat, &mut b, &json!(9));
        assert_eq!(Value::Object(b), json!({"max_completion_tokens": 9}));
        let mut b = Map::new();
        Provider::DeepSeek.set_max_tokens(Protocol::OpenAiChat, &mut b, &json!(9));
        assert_eq!(Value::Object(b), json!({"max_tokens": 9}));
    }
}
