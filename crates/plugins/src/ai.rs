//! The AI gateway (APISIX 3.18's `ai-*` plugins): ai-proxy and ai-proxy-multi answer in
//! place of the upstream with an LLM provider's answer; ai-rate-limiting spends token
//! budgets; the prompt plugins shape the request before it goes (ai-prompt-template,
//! ai-prompt-decorator), refuse it (ai-prompt-guard) or have an LLM rewrite it
//! (ai-request-rewrite); the guards have a content service judge the request and the answer
//! (ai-aws-content-moderation, ai-aliyun-content-moderation, ai-lakera-guard); mcp-bridge
//! bridges MCP clients over SSE to MCP servers on stdio; ai-cache answers repeated prompts
//! from Redis and ai-rag adds what a vector search found. What they share lives in
//! `support::ai`.

family! {
    ai_proxy,
    ai_proxy_multi,
    ai_rate_limiting,
    ai_prompt_template,
    ai_prompt_decorator,
    ai_prompt_guard,
    ai_request_rewrite,
    ai_aws_content_moderation,
    ai_aliyun_content_moderation,
    ai_lakera_guard,
    mcp_bridge,
    ai_cache,
    ai_rag,
}
