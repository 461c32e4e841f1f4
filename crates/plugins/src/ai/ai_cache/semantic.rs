//! ai-cache's semantic layer (`ai-cache/semantic.lua`, `embeddings/`,
//! `vector-search/redis.lua`): the prompt's last turns embedded by OpenAI or Azure OpenAI,
//! the nearest answer of the same partition found with RediSearch's KNN query (`FT.SEARCH`
//! over a HNSW cosine index `FT.CREATE`d on first use), and the answer written back as a
//! hash with the embedding as packed float32 (`HSET` + `EXPIRE`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use ferrisix_plugin_api::PluginServices;
use http::{header, HeaderValue, Request, StatusCode};
use redis::Value as Reply;
use serde_json::{json, Value};

use super::key::hex_digest;
use crate::support::ai::protocol::Protocol;
use crate::support::redis::Remote;

pub const OPENAI_DEFAULT_ENDPOINT: &str = "https://api.openai.com/v1/embeddings";

/// `semantic.embedding`: the one provider configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Provider {
    OpenAi,
    AzureOpenAi,
}

/// `semantic.match`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Match {
    pub message_countback: usize,
    pub ignore_system: bool,
    pub ignore_assistant: bool,
    pub ignore_tool: bool,
}

impl Default for Match {
    fn default() -> Match {
        Match {
            message_countback: 1,
            ignore_system: true,
            ignore_assistant: true,
            ignore_tool: true,
        }
    }
}

/// `semantic`, compiled.
#[derive(Debug)]
pub struct Semantic {
    pub threshold: f64,
    pub top_k: u64,
    pub ttl: u64,
    pub matching: Match,
    pub provider: Provider,
    pub endpoint: String,
    pub model: Option<String>,
    pub api_key: String,
    pub dimensions: Option<u64>,
    pub ssl_verify: bool,
    pub timeout: Duration,
    pub index: String,
    /// `<provider>|<model>|<endpoint>|<dimensions>` hashed: entries of another embedding
    /// model never meet this one's.
    identity: String,
    /// The dimension whose index this instance created (0: none yet); a failed search
    /// clears it so the next one creates the index again.
    ensured: AtomicUsize,
}

fn u64_at(v: &Value, k: &str, default: u64) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(default)
}

fn bool_at(v: &Value, k: &str, default: bool) -> bool {
    v.get(k).and_then(Value::as_bool).unwrap_or(default)
}

impl Semantic {
    /// From `semantic` with the schema's defaults filled in.
    pub fn from_conf(s: &Value) -> Result<Semantic, String> {
        let emb = s.get("embedding").ok_or("semantic.embedding is missing")?;
        let (provider, c) = match (emb.get("openai"), emb.get("azure_openai")) {
            (Some(c), _) => (Provider::OpenAi, c),
            (None, Some(c)) => (Provider::AzureOpenAi, c),
            _ => return Err("semantic.embedding names no provider".into()),
        };
        let model = c.get("model").and_then(Value::as_str).map(str::to_owned);
        let endpoint = match c.get("endpoint").and_then(Value::as_str) {
            Some(e) => e.to_owned(),
            None if provider == Provider::OpenAi => OPENAI_DEFAULT_ENDPOINT.to_owned(),
            None => return Err("semantic.embedding.azure_openai.endpoint is missing".into()),
        };
        let dimensions = c.get("dimensions").and_then(Value::as_u64);
        let name = match provider {
            Provider::OpenAi => "openai",
            Provider::AzureOpenAi => "azure_openai",
        };
        let repr = format!(
            "{name}|{}|{endpoint}|{}",
            model.as_deref().unwrap_or(""),
            dimensions.map(|d| d.to_string()).unwrap_or_default()
        );
        let m = s.get("match").cloned().unwrap_or(Value::Null);
        Ok(Semantic {
            threshold: s
                .get("similarity_threshold")
                .and_then(Value::as_f64)
                .unwrap_or(0.95),
            top_k: u64_at(s, "top_k", 1),
            ttl: u64_at(s, "ttl", 86400),
            matching: Match {
                message_countback: u64_at(&m, "message_countback", 1) as usize,
                ignore_system: bool_at(&m, "ignore_system_prompts", true),
                ignore_assistant: bool_at(&m, "ignore_assistant_prompts", true),
                ignore_tool: bool_at(&m, "ignore_tool_prompts", true),
            },
            provider,
            endpoint,
            model,
            api_key: c
                .get("api_key")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            dimensions,
            ssl_verify: bool_at(c, "ssl_verify", true),
            timeout: Duration::from_millis(u64_at(c, "timeout", 5000)),
            index: s
                .get("vector_search")
                .and_then(|v| v.get("redis"))
                .and_then(|r| r.get("index"))
                .and_then(Value::as_str)
                .unwrap_or("ai-cache")
                .to_owned(),
            identity: hex_digest(repr.as_bytes())[..16].to_owned(),
            ensured: AtomicUsize::new(0),
        })
    }

    pub fn index_name(&self, dim: usize) -> String {
        format!("{}:idx:{}:{dim}", self.index, self.identity)
    }

    pub fn prefix(&self, dim: usize) -> String {
        format!("{}:l2:{}:{dim}:", self.index, self.identity)
    }

    /// Calls the embeddings API with `text`; the vector of its first `data` item.
    pub async fn embed(&self, services: &PluginServices, text: &str) -> Result<Vec<f32>, String> {
        let mut body = match self.provider {
            Provider::OpenAi => json!({"model": self.model, "input": text}),
            Provider::AzureOpenAi => json!({"input": text}),
        };
        if let Some(d) = self.dimensions {
            body["dimensions"] = json!(d);
        }
        let mut req = Request::post(&self.endpoint)
            .body(Bytes::from(body.to_string()))
            .map_err(|e| format!("embeddings request failed: {e}"))?;
        let h = req.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let auth = match self.provider {
            Provider::OpenAi => (header::AUTHORIZATION, format!("Bearer {}", self.api_key)),
            Provider::AzureOpenAi => (
                http::HeaderName::from_static("api-key"),
                self.api_key.clone(),
            ),
        };
        h.insert(
            auth.0,
            HeaderValue::from_str(&auth.1).map_err(|_| "invalid api_key")?,
        );
        let resp = services
            .http()
            .send_verified(req, self.timeout, self.ssl_verify)
            .await
            .map_err(|e| format!("embeddings request failed: {e}"))?;
        if resp.status() != StatusCode::OK {
            return Err(format!(
                "embeddings endpoint returned {}",
                resp.status().as_u16()
            ));
        }
        let decoded: Value =
            serde_json::from_slice(resp.body()).map_err(|_| "malformed embeddings response")?;
        let vec = decoded
            .get("data")
            .and_then(|d| d.get(0))
            .and_then(|d| d.get("embedding"))
            .and_then(Value::as_array)
            .ok_or("malformed embeddings response")?;
        vec.iter()
            .map(|x| {
                x.as_f64()
                    .map(|f| f as f32)
                    .ok_or_else(|| "malformed embeddings response".to_owned())
            })
            .collect()
    }

    /// `FT.CREATE` of the index of `dim`, once per instance ("Index already exists" is
    /// success).
    pub async fn ensure_index(&self, redis: &Remote, dim: usize) -> Result<(), String> {
        if self.ensured.load(Ordering::Relaxed) == dim {
            return Ok(());
        }
        let mut cmd = redis::cmd("FT.CREATE");
        cmd.arg(self.index_name(dim))
            .arg("ON")
            .arg("HASH")
            .arg("PREFIX")
            .arg(1)
            .arg(self.prefix(dim))
            .arg("SCHEMA")
            .arg("partition")
            .arg("TAG")
            .arg("embedding")
            .arg("VECTOR")
            .arg("HNSW")
            .arg(6)
            .arg("TYPE")
            .arg("FLOAT32")
            .arg("DIM")
            .arg(dim)
            .arg("DISTANCE_METRIC")
            .arg("COSINE");
        match redis.query::<Reply>(&cmd).await {
            Ok(Reply::ServerError(e)) if !e.to_string().contains("Index already exists") => {
                return Err(e.to_string())
            }
            Ok(_) => {}
            Err(e) if e.message.contains("Index already exists") => {}
            Err(e) => return Err(e.message),
        }
        self.ensured.store(dim, Ordering::Relaxed);
        Ok(())
    }

    /// The nearest answer of `partition` to `vec`: (distance, response, created_at, format).
    pub async fn knn_search(
        &self,
        redis: &Remote,
        partition: &str,
        vec: &[f32],
    ) -> Result<Option<Hit>, String> {
        let query = format!(
            "(@partition:{{{partition}}})=>[KNN {} @embedding $vec AS __score]",
            self.top_k
        );
        let mut cmd = redis::cmd("FT.SEARCH");
        cmd.arg(self.index_name(vec.len()))
            .arg(query)
            .arg("PARAMS")
            .arg(2)
            .arg("vec")
            .arg(pack_float32(vec))
            .arg("RETURN")
            .arg(4)
            .arg("__score")
            .arg("response")
            .arg("created_at")
            .arg("format")
            .arg("SORTBY")
            .arg("__score")
            .arg("DIALECT")
            .arg(2);
        let reply = match redis.query::<Reply>(&cmd).await {
            Ok(Reply::ServerError(e)) => Err(e.to_string()),
            Ok(r) => Ok(r),
            Err(e) => Err(e.message),
        };
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                self.ensured.store(0, Ordering::Relaxed);
                return Err(e);
            }
        };
        Ok(parse_search(&reply))
    }

    /// Writes the answer as the partition's document of `fingerprint`, kept `ttl` seconds.
    pub async fn write(
        &self,
        redis: &Remote,
        doc: &Document<'_>,
        response: &[u8],
    ) -> Result<(), String> {
        let dim = doc.embedding.len();
        self.ensure_index(redis, dim).await?;
        let key = format!("{}{}:{}", self.prefix(dim), doc.partition, doc.fingerprint);
        let mut hset = redis::cmd("HSET");
        hset.arg(&key)
            .arg("partition")
            .arg(doc.partition)
            .arg("embedding")
            .arg(pack_float32(doc.embedding))
            .arg("response")
            .arg(response)
            .arg("created_at")
            .arg(doc.created_at)
            .arg("format")
            .arg(doc.format);
        redis.query::<Reply>(&hset).await.map_err(String::from)?;
        let mut expire = redis::cmd("EXPIRE");
        expire.arg(&key).arg(self.ttl);
        redis.query::<Reply>(&expire).await.map_err(String::from)?;
        Ok(())
    }
}

/// What an answer is stored with in the semantic layer.
pub struct Document<'a> {
    pub partition: &'a str,
    pub fingerprint: &'a str,
    pub embedding: &'a [f32],
    pub created_at: u64,
    pub format: &'a str,
}

/// A document found by the KNN query.
#[derive(Clone, Debug, PartialEq)]
pub struct Hit {
    pub distance: f64,
    pub response: Bytes,
    pub created_at: Option<u64>,
    pub format: Option<String>,
}

fn text(v: &Reply) -> Option<Vec<u8>> {
    match v {
        Reply::BulkString(b) => Some(b.clone()),
        Reply::SimpleString(s) => Some(s.as_bytes().to_vec()),
        Reply::Int(i) => Some(i.to_string().into_bytes()),
        Reply::Double(d) => Some(d.to_string().into_bytes()),
        Reply::VerbatimString { text, .. } => Some(text.as_bytes().to_vec()),
        _ => None,
    }
}

/// `[total, key1, [field, value, ...], ...]`: the first document's fields, if it has a
/// response and a score.
pub fn parse_search(reply: &Reply) -> Option<Hit> {
    let Reply::Array(items) = reply else {
        return None;
    };
    let total = match items.first()? {
        Reply::Int(n) => *n,
        other => String::from_utf8_lossy(&text(other)?).parse().ok()?,
    };
    if total < 1 {
        return None;
    }
    let fields: Vec<(Reply, Reply)> = match items.get(2)? {
        Reply::Array(f) => f
            .chunks(2)
            .filter(|c| c.len() == 2)
            .map(|c| (c[0].clone(), c[1].clone()))
            .collect(),
        Reply::Map(m) => m.clone(),
        _ => return None,
    };
    let (mut distance, mut response, mut created_at, mut format) = (None, None, None, None);
    for (k, v) in &fields {
        let Some(k) = text(k) else { continue };
        let v = text(v);
        match k.as_slice() {
            b"__score" => distance = v.and_then(|v| String::from_utf8_lossy(&v).parse().ok()),
            b"response" => response = v,
            b"created_at" => {
                created_at = v.and_then(|v| String::from_utf8_lossy(&v).parse::<f64>().ok())
            }
            b"format" => format = v.map(|v| String::from_utf8_lossy(&v).into_owned()),
            _ => {}
        }
    }
    Some(Hit {
        distance: distance?,
        response: Bytes::from(response?),
        created_at: created_at.map(|c| c as u64),
        format,
    })
}

/// The vector as the index stores it: float32, little-endian, packed.
pub fn pack_float32(vec: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(vec.len() * 4);
    for x in vec {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

/// The positions of the messages embedded: the last `message_countback` of those whose role
/// is not ignored.
fn window(messages: &[(String, String)], m: &Match) -> Vec<usize> {
    let kept: Vec<usize> = messages
        .iter()
        .enumerate()
        .filter(|(_, (role, _))| {
            !((role == "system" && m.ignore_system)
                || (role == "assistant" && m.ignore_assistant)
                || (role == "tool" && m.ignore_tool))
        })
        .map(|(i, _)| i)
        .collect();
    let start = kept.len().saturating_sub(m.message_countback.max(1));
    kept[start..].to_vec()
}

/// The text embedded: the window's non-empty contents joined by newlines.
pub fn embed_text(messages: &[(String, String)], m: &Match) -> String {
    window(messages, m)
        .into_iter()
        .map(|i| messages[i].1.as_str())
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The messages outside the window: they decide the answer too, so they go into the
/// partition.
pub fn context_messages(messages: &[(String, String)], m: &Match) -> Vec<(String, String)> {
    let w = window(messages, m);
    messages
        .iter()
        .enumerate()
        .filter(|(i, _)| !w.contains(i))
        .map(|(_, msg)| msg.clone())
        .collect()
}

fn nonempty(v: Option<&Value>) -> bool {
    match v {
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        _ => false,
    }
}

fn block_nontext(b: &Value) -> bool {
    b.is_object() && b.get("type").is_some_and(|t| !t.is_null() && t != "text")
}

/// Whether a prompt carries what the embedding cannot see (images, tool calls): the semantic
/// layer is skipped for it.
pub fn has_nontext(body: &Value) -> bool {
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return false;
    };
    messages.iter().any(|msg| {
        if nonempty(msg.get("tool_calls")) || nonempty(msg.get("function_call")) {
            return true;
        }
        match msg.get("content") {
            Some(c @ Value::Object(_)) => block_nontext(c),
            Some(Value::Array(blocks)) => blocks.iter().any(block_nontext),
            _ => false,
        }
    })
}

/// Only OpenAI chats go to the semantic layer (their canonical form is faithful).
pub fn protocol_supported(p: Protocol) -> bool {
    p == Protocol::OpenAiChat
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(r, c)| ((*r).to_owned(), (*c).to_owned()))
            .collect()
    }

    #[test]
    fn the_window_and_its_context() {
        let m = msgs(&[
            ("system", "be brief"),
            ("user", "first"),
            ("assistant", "ok"),
            ("user", "second"),
        ]);
        let d = Match::default();
        assert_eq!(embed_text(&m, &d), "second");
        assert_eq!(
            context_messages(&m, &d),
            msgs(&[
                ("system", "be brief"),
                ("user", "first"),
                ("assistant", "ok")
            ])
        );
        let two = Match {
            message_countback: 2,
            ..d
        };
        assert_eq!(embed_text(&m, &two), "first\nsecond");
        let with_system = Match {
            message_countback: 5,
            ignore_system: false,
            ..d
        };
        assert_eq!(embed_text(&m, &with_system), "be brief\nfirst\nsecond");
        assert_eq!(
            context_messages(&m, &with_system),
            msgs(&[("assistant", "ok")])
        );
    }

    #[test]
    fn nontext_prompts() {
        assert!(!has_nontext(
            &json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]})
        ));
        assert!(has_nontext(
            &json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})
        ));
        assert!(has_nontext(
            &json!({"messages": [{"role": "assistant", "tool_calls": [{"id": "1"}]}]})
        ));
        assert!(!has_nontext(
            &json!({"messages": [{"role": "assistant", "tool_calls": []}]})
        ));
    }

    #[test]
    fn index_names_follow_the_embedding_model() {
        let conf = json!({"embedding": {"openai": {"model": "m", "api_key": "k"}},
            "vector_search": {"redis": {"index": "idx"}}});
        let s = Semantic::from_conf(&conf).unwrap();
        assert_eq!(s.endpoint, OPENAI_DEFAULT_ENDPOINT);
        let expect = &hex_digest(format!("openai|m|{OPENAI_DEFAULT_ENDPOINT}|").as_bytes())[..16];
        assert_eq!(s.index_name(3), format!("idx:idx:{expect}:3"));
        assert_eq!(s.prefix(3), format!("idx:l2:{expect}:3:"));
        let az = json!({"embedding": {"azure_openai": {"endpoint": "http://e", "api_key": "k",
            "dimensions": 8}}, "vector_search": {"redis": {}}});
        let a = Semantic::from_conf(&az).unwrap();
        assert_eq!(a.provider, Provider::AzureOpenAi);
        assert!(a.index_name(8).starts_with("ai-cache:idx:"));
        assert_ne!(a.identity, s.identity);
    }

    #[test]
    fn search_replies() {
        assert_eq!(pack_float32(&[1.0, -2.0]), [0, 0, 128, 63, 0, 0, 0, 192]);
        let reply = Reply::Array(vec![
            Reply::Int(1),
            Reply::BulkString(b"doc".to_vec()),
            Reply::Array(vec![
                Reply::BulkString(b"__score".to_vec()),
                Reply::BulkString(b"0.02".to_vec()),
                Reply::BulkString(b"response".to_vec()),
                Reply::BulkString(b"{\"a\":1}".to_vec()),
                Reply::BulkString(b"created_at".to_vec()),
                Reply::BulkString(b"1700000000".to_vec()),
                Reply::BulkString(b"format".to_vec()),
                Reply::BulkString(b"json".to_vec()),
            ]),
        ]);
        let hit = parse_search(&reply).unwrap();
        assert!((hit.distance - 0.02).abs() < 1e-9);
        assert_eq!(hit.response, "{\"a\":1}");
        assert_eq!(hit.created_at, Some(1_700_000_000));
        assert_eq!(hit.format.as_deref(), Some("json"));
        assert_eq!(parse_search(&Reply::Array(vec![Reply::Int(0)])), None);
    }
}
