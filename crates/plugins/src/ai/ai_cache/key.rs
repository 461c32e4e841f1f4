//! ai-cache's keys (`ai-cache/key.lua`): the request's fingerprint (a SHA-256 of the
//! canonical JSON of what decides the answer: the client's protocol, messages and
//! parameters, and the picked instance's provider, effective model, options and override),
//! the scope that isolates entries (route, consumer, variables) and the exact layer's key
//! `ai-cache:l1:<scope>:<fingerprint>`.
//!
//! The canonical JSON sorts object keys, as APISIX's `core.json.canonical_encode`; numbers
//! and empty containers are written as serde_json writes them, so an entry APISIX wrote
//! is not promised to be found under the same key here.

use serde_json::{Map, Value};

use crate::support::ai::protocol::Protocol;

const KEY_PREFIX: &str = "ai-cache:l1:";

/// `cache_key`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyConf {
    pub share_across_routes: bool,
    pub include_consumer: bool,
    pub include_vars: Vec<String>,
}

/// What the scope is made of, read from the request.
pub struct ScopeFacts<'a> {
    pub route_id: Option<&'a str>,
    pub consumer: Option<&'a str>,
    /// `include_vars`' values, in order.
    pub vars: Vec<Option<String>>,
}

/// SHA-256 of `s`, lower-case hex.
pub fn hex_digest(s: &[u8]) -> String {
    crate::support::cloud::sigv4::sha256_hex(s)
}

/// JSON with object keys sorted at every level.
pub fn canonical(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(&m[k], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The protocol's messages in canonical `{role, content}` form (`get_messages`): a chat's
/// (and Anthropic's, Bedrock's) messages with their text parts joined by spaces, those
/// without text left out; the `input` of the Responses and embeddings APIs as the user's.
pub fn messages(protocol: Protocol, body: &Value) -> Vec<(String, String)> {
    match protocol {
        Protocol::OpenAiChat | Protocol::AnthropicMessages | Protocol::BedrockConverse => body
            .get("messages")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|m| {
                let texts: Vec<&str> = match m.get("content") {
                    Some(Value::String(s)) => vec![s.as_str()],
                    Some(Value::Array(parts)) => parts
                        .iter()
                        .filter(|p| {
                            p.get("type").and_then(Value::as_str) == Some("text")
                                || (protocol == Protocol::BedrockConverse
                                    && p.get("text").is_some())
                        })
                        .filter_map(|p| p.get("text").and_then(Value::as_str))
                        .collect(),
                    _ => Vec::new(),
                };
                if texts.is_empty() {
                    return None;
                }
                let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
                Some((role.to_owned(), texts.join(" ")))
            })
            .collect(),
        _ => protocol.messages(body),
    }
}

fn messages_value(msgs: &[(String, String)]) -> Value {
    Value::Array(
        msgs.iter()
            .map(|(r, c)| {
                let mut m = Map::new();
                m.insert("role".into(), Value::String(r.clone()));
                m.insert("content".into(), Value::String(c.clone()));
                Value::Object(m)
            })
            .collect(),
    )
}

/// `build_repr`: the client's protocol, `messages` (left out when `None`) and every other
/// body field (`stream` as the protocol reads it), and the instance's effective request.
pub fn repr(
    protocol: Protocol,
    body: &Value,
    identity: &Value,
    msgs: Option<&[(String, String)]>,
) -> Value {
    let mut params = Map::new();
    if let Some(obj) = body.as_object() {
        for (k, v) in obj {
            if k != "messages" && k != "model" && k != "stream" {
                params.insert(k.clone(), v.clone());
            }
        }
    }
    params.insert("stream".into(), Value::Bool(protocol.is_streaming(body)));
    let mut client = Map::new();
    client.insert("protocol".into(), Value::String(protocol.name().into()));
    if let Some(m) = msgs {
        client.insert("messages".into(), messages_value(m));
    }
    client.insert("params".into(), Value::Object(params));
    let mut effective = Map::new();
    let options = identity.get("options");
    let model = options
        .and_then(|o| o.get("model"))
        .filter(|m| !m.is_null())
        .or_else(|| body.get("model").filter(|m| !m.is_null()))
        .cloned()
        .unwrap_or_else(|| Value::String(String::new()));
    if let Some(p) = identity.get("provider") {
        effective.insert("provider".into(), p.clone());
    }
    effective.insert("model".into(), model);
    for k in [
        "options",
        "llm_options",
        "request_body",
        "request_body_force_override",
        "endpoint",
    ] {
        if let Some(v) = identity.get(k) {
            effective.insert(k.into(), v.clone());
        }
    }
    let mut out = Map::new();
    out.insert("client".into(), Value::Object(client));
    out.insert("effective".into(), Value::Object(effective));
    Value::Object(out)
}

/// The request's fingerprint: its repr with the raw `messages` folded in, so a prompt with
/// an image never collides with the same text alone.
pub fn fingerprint(protocol: Protocol, body: &Value, identity: &Value) -> String {
    let msgs = messages(protocol, body);
    let mut r = repr(protocol, body, identity, Some(&msgs));
    if let (Some(obj), Some(raw)) = (r.as_object_mut(), body.get("messages")) {
        obj.insert("raw_messages".into(), raw.clone());
    }
    hex_digest(canonical(&r).as_bytes())
}

/// `%`, `:` and `=` escaped, as the scope's separators.
fn esc(v: Option<&str>) -> String {
    v.unwrap_or("")
        .replace('%', "%25")
        .replace(':', "%3A")
        .replace('=', "%3D")
}

/// The scope: `route=<id>`, `consumer=<name>`, `<var>=<value>` joined by `:`, or `shared`.
pub fn scope(conf: &KeyConf, facts: &ScopeFacts<'_>) -> String {
    let mut parts = Vec::new();
    if !conf.share_across_routes {
        parts.push(format!("route={}", esc(facts.route_id)));
    }
    if conf.include_consumer {
        parts.push(format!("consumer={}", esc(facts.consumer)));
    }
    for (name, value) in conf.include_vars.iter().zip(&facts.vars) {
        parts.push(format!("{name}={}", esc(value.as_deref())));
    }
    if parts.is_empty() {
        return "shared".into();
    }
    parts.join(":")
}

/// The semantic layer's partition: the scope and the messages the embedding leaves out
/// (`None` for a single-turn prompt).
pub fn partition(
    scope: &str,
    protocol: Protocol,
    body: &Value,
    identity: &Value,
    context: Option<&[(String, String)]>,
) -> String {
    let r = canonical(&repr(protocol, body, identity, context));
    hex_digest(format!("{scope}|{r}").as_bytes())
}

/// The exact layer's key.
pub fn build(scope: &str, fingerprint: &str) -> String {
    format!("{KEY_PREFIX}{scope}:{fingerprint}")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ident() -> Value {
        json!({"provider": "openai", "options": {"model": "gpt-4o"}})
    }

    #[test]
    fn canonical_sorts_keys_at_every_level() {
        let v = json!({"b": 1, "a": {"d": [1, {"z": 0, "y": "x"}], "c": null}});
        assert_eq!(
            canonical(&v),
            r#"{"a":{"c":null,"d":[1,{"y":"x","z":0}]},"b":1}"#
        );
    }

    #[test]
    fn fingerprint_follows_what_decides_the_answer() {
        let body = json!({"model": "x", "messages": [{"role": "user", "content": "hi"}]});
        let a = fingerprint(Protocol::OpenAiChat, &body, &ident());
        assert_eq!(a.len(), 64);
        // The key order of the body does not matter; the instance's model wins over the
        // client's, so the client's model does not split entries.
        let reordered = json!({"messages": [{"content": "hi", "role": "user"}], "model": "y"});
        assert_eq!(a, fingerprint(Protocol::OpenAiChat, &reordered, &ident()));
        // A parameter, streaming, the options and the raw content do.
        let temp = json!({"temperature": 0.5, "messages": [{"role": "user", "content": "hi"}]});
        assert_ne!(a, fingerprint(Protocol::OpenAiChat, &temp, &ident()));
        let stream = json!({"stream": true, "messages": [{"role": "user", "content": "hi"}]});
        assert_ne!(a, fingerprint(Protocol::OpenAiChat, &stream, &ident()));
        let other = json!({"provider": "openai", "options": {"model": "gpt-4o-mini"}});
        assert_ne!(a, fingerprint(Protocol::OpenAiChat, &body, &other));
        let image = json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "u"}}]}]});
        assert_eq!(
            messages(Protocol::OpenAiChat, &image),
            vec![("user".to_owned(), "hi".to_owned())]
        );
        assert_ne!(a, fingerprint(Protocol::OpenAiChat, &image, &ident()));
    }

    #[test]
    fn scopes_and_keys() {
        let facts = ScopeFacts {
            route_id: Some("r:1"),
            consumer: Some("jack"),
            vars: vec![Some("a=b".into()), None],
        };
        let mut conf = KeyConf::default();
        assert_eq!(scope(&conf, &facts), "route=r%3A1");
        conf.include_consumer = true;
        conf.include_vars = vec!["http_x_tenant".into(), "arg_missing".into()];
        assert_eq!(
            scope(&conf, &facts),
            "route=r%3A1:consumer=jack:http_x_tenant=a%3Db:arg_missing="
        );
        let shared = KeyConf {
            share_across_routes: true,
            ..KeyConf::default()
        };
        assert_eq!(scope(&shared, &facts), "shared");
        assert_eq!(build("shared", "ab"), "ai-cache:l1:shared:ab");
    }

    #[test]
    fn partitions_follow_scope_and_context() {
        let body = json!({"messages": [{"role": "user", "content": "hi"}]});
        let a = partition("shared", Protocol::OpenAiChat, &body, &ident(), None);
        assert_eq!(
            a,
            partition("shared", Protocol::OpenAiChat, &body, &ident(), None)
        );
        assert_ne!(
            a,
            partition("route=1", Protocol::OpenAiChat, &body, &ident(), None)
        );
        let ctx = [("system".to_owned(), "be brief".to_owned())];
        assert_ne!(
            a,
            partition("shared", Protocol::OpenAiChat, &body, &ident(), Some(&ctx))
        );
    }
}
