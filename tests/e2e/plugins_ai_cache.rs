//! End-to-end ai-cache and ai-rag through the binary.
//!
//! ai-cache's exact layer runs against Debian's `redis-server`. Its semantic layer needs
//! RediSearch (`FT.CREATE`, `FT.SEARCH`), which Debian's Redis has not, so it runs against an
//! in-test RESP server that implements the commands APISIX sends as RediSearch documents
//! them (a HNSW cosine index over hashes of a prefix, a KNN query restricted to a TAG,
//! `PARAMS`, `RETURN`, `SORTBY`, `DIALECT 2`), checks every argument's shape and answers a
//! real cosine KNN over the hashes it stored; plus GET/SET/HSET/EXPIRE. The embeddings
//! services (OpenAI's and Azure OpenAI's documented `/embeddings` API) and the LLM provider
//! (OpenAI chat completions, JSON and server-sent events ending in `data: [DONE]`) are
//! in-test servers that check the key headers and bodies the gateway sends.
//!
//! ai-rag runs against in-test Azure OpenAI embeddings and Azure AI Search servers that
//! check `api-key` and the bodies, and an upstream that answers with the body it received.
use crate::support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use support::redis::{redis_cli, redis_keys, require_redis, Redis};
use support::*;

/// One request an in-test HTTP server received.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// An answer: status, content type, body; `sse` sends it chunked, event by event.
struct Answer {
    status: u16,
    content_type: &'static str,
    body: Vec<u8>,
    sse: bool,
}

fn json_answer(status: u16, v: &Value) -> Answer {
    Answer {
        status,
        content_type: "application/json",
        body: v.to_string().into_bytes(),
        sse: false,
    }
}

type Handler = Arc<dyn Fn(&Seen) -> Answer + Send + Sync>;

/// A threaded HTTP/1.1 server answering each request with `handler`, one per connection.
struct HttpServer {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl HttpServer {
    fn start(handler: Handler) -> HttpServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let s = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (s, h) = (s.clone(), handler.clone());
                std::thread::spawn(move || serve_http(stream, &s, &h));
            }
        });
        HttpServer { addr, seen }
    }

    fn count(&self, path: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.path == path)
            .count()
    }

    fn last(&self, path: &str) -> Seen {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|s| s.path == path)
            .cloned()
            .unwrap_or_else(|| panic!("no request to {path}"))
    }
}

fn serve_http(stream: TcpStream, seen: &Mutex<Vec<Seen>>, handler: &Handler) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 {
            return;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = vec![0; len];
    reader.read_exact(&mut body).unwrap();
    let req = Seen {
        path,
        headers,
        body,
    };
    seen.lock().unwrap().push(req.clone());
    let a = handler(&req);
    let mut out = stream;
    if a.sse {
        let _ = write!(
            out,
            "HTTP/1.1 {} OK\r\nContent-Type: {}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
            a.status, a.content_type
        );
        let text = String::from_utf8_lossy(&a.body).into_owned();
        for ev in text.split_inclusive("\n\n") {
            let _ = write!(out, "{:x}\r\n{ev}\r\n", ev.len());
            let _ = out.flush();
        }
        let _ = out.write_all(b"0\r\n\r\n");
        return;
    }
    let _ = write!(
        out,
        "HTTP/1.1 {} X\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        a.status,
        a.content_type,
        a.body.len()
    );
    let _ = out.write_all(&a.body);
}

/// The LLM provider: a chat answer naming the prompt's last message and a counter (so a
/// replayed answer is told apart from a fresh one); a stream when asked.
fn start_provider() -> HttpServer {
    let n = Arc::new(AtomicUsize::new(0));
    HttpServer::start(Arc::new(move |req: &Seen| {
        let body = req.json();
        let i = n.fetch_add(1, Ordering::SeqCst) + 1;
        let prompt = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_owned();
        if req.path.starts_with("/limited") {
            return json_answer(429, &json!({"error": {"message": "slow down"}}));
        }
        if req.header("authorization") != Some("Bearer sk-llm") {
            return json_answer(401, &json!({"error": {"message": "bad key"}}));
        }
        if body["stream"] == json!(true) {
            let chunk = |delta: Value| {
                json!({"id": "c", "object": "chat.completion.chunk",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
            };
            let events = format!(
                "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
                chunk(json!({"role": "assistant", "content": format!("stream {i}")})),
                chunk(json!({"content": format!(" for {prompt}")}))
            );
            return Answer {
                status: 200,
                content_type: "text/event-stream",
                body: events.into_bytes(),
                sse: true,
            };
        }
        json_answer(
            200,
            &json!({"id": format!("c{i}"), "object": "chat.completion", "model": "gpt-4o",
                "choices": [{"index": 0, "finish_reason": "stop",
                    "message": {"role": "assistant", "content": format!("answer {i} to {prompt}")}}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}),
        )
    }))
}

fn chat(gw: &Gateway, path: &str, extra: &[(&str, &str)], body: &Value) -> Reply {
    let mut headers = vec![("Content-Type", "application/json")];
    headers.extend_from_slice(extra);
    request(
        gw.addr(),
        "POST",
        path,
        &headers,
        body.to_string().as_bytes(),
    )
}

fn prompt(text: &str) -> Value {
    json!({"model": "gpt-4o", "messages": [{"role": "user", "content": text}]})
}

fn ai_proxy(provider: &HttpServer) -> Value {
    json!({"provider": "openai", "auth": {"header": {"Authorization": "Bearer sk-llm"}},
           "options": {"model": "gpt-4o"},
           "override": {"endpoint": format!("http://{}", provider.addr)}})
}

fn wait_for_keys(port: u16, pattern: &str, n: usize) -> Vec<String> {
    let mut keys = Vec::new();
    poll_until(Duration::from_secs(10), || {
        keys = redis_keys(port, pattern);
        keys.len() >= n
    })
    .unwrap_or_else(|| panic!("{pattern}: {keys:?}"));
    keys
}

#[test]
fn ai_cache_exact_layer_on_redis() {
    require_redis();
    let redis = Redis::start(false);
    let provider = start_provider();
    let cache = |extra: Value| {
        let mut c = json!({"redis_host": "127.0.0.1", "redis_port": redis.port});
        c.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        c
    };
    let routes = json!({"routes": [
        {"id": "c1", "uri": "/chat", "plugins": {"ai-proxy": ai_proxy(&provider),
            "ai-cache": cache(json!({"exact": {"ttl": 120},
                "bypass_on": [{"header": "X-No-Cache", "equals": "1"}]}))}},
        {"id": "c2", "uri": "/other", "plugins": {"ai-proxy": ai_proxy(&provider),
            "ai-cache": cache(json!({}))}},
        {"id": "shared1", "uri": "/shared1", "plugins": {"ai-proxy": ai_proxy(&provider),
            "ai-cache": cache(json!({"cache_key": {"share_across_routes": true}}))}},
        {"id": "shared2", "uri": "/shared2", "plugins": {"ai-proxy": ai_proxy(&provider),
            "ai-cache": cache(json!({"cache_key": {"share_across_routes": true}}))}},
        {"id": "tenant", "uri": "/tenant", "plugins": {"ai-proxy": ai_proxy(&provider),
            "ai-cache": cache(json!({"cache_key": {"include_vars": ["http_x_tenant"]}}))}},
        {"id": "quiet", "uri": "/quiet", "plugins": {"ai-proxy": ai_proxy(&provider),
            "ai-cache": cache(json!({"cache_headers": false}))}},
        {"id": "small", "uri": "/small", "plugins": {"ai-proxy": ai_proxy(&provider),
            "ai-cache": cache(json!({"max_cache_body_size": 10}))}},
        {"id": "alone", "uri": "/alone", "upstream": {"nodes": {provider.addr.to_string(): 1}},
            "plugins": {"ai-cache": cache(json!({"fail_mode": "error"}))}},
        {"id": "skip", "uri": "/skip", "upstream": {"nodes": {provider.addr.to_string(): 1}},
            "plugins": {"ai-cache": cache(json!({}))}},
        {"id": "multi", "uri": "/multi", "plugins": {"ai-cache": cache(json!({})),
            "ai-proxy-multi": {"fallback_strategy": ["http_429"], "instances": [
                {"name": "busy", "provider": "openai", "weight": 1, "priority": 1,
                 "auth": {"header": {"Authorization": "Bearer sk-llm"}},
                 "override": {"endpoint": format!("http://{}/limited/v1/chat/completions", provider.addr)}},
                {"name": "spare", "provider": "openai", "weight": 1, "priority": 0,
                 "auth": {"header": {"Authorization": "Bearer sk-llm"}},
                 "override": {"endpoint": format!("http://{}", provider.addr)}}]}}},
        {"id": "down", "uri": "/down", "plugins": {"ai-proxy": ai_proxy(&provider),
            "ai-cache": {"redis_host": "127.0.0.1", "redis_port": free_port(), "redis_timeout": 200}}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    let q = prompt("What is the capital of France?");

    // A miss goes to the provider and is stored under the route's scope.
    let r = chat(&gw, "/chat", &[], &q);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-ai-cache-status"), Some("MISS"));
    let first = r.json()["choices"][0]["message"]["content"].clone();
    assert_eq!(first, "answer 1 to What is the capital of France?");
    let keys = wait_for_keys(redis.port, "ai-cache:l1:*", 1);
    assert_eq!(keys.len(), 1, "{keys:?}");
    let fp = keys[0]
        .strip_prefix("ai-cache:l1:route=c1:")
        .expect("route scope");
    assert!(
        fp.len() == 64 && fp.bytes().all(|b| b.is_ascii_hexdigit()),
        "{fp}"
    );
    let ttl: u64 = redis_cli(redis.port, &["ttl", &keys[0]])
        .trim()
        .parse()
        .unwrap();
    assert!(ttl > 0 && ttl <= 120, "exact.ttl: {ttl}");
    let entry: Value = serde_json::from_str(&redis_cli(redis.port, &["get", &keys[0]])).unwrap();
    assert_eq!(entry["format"], "json");
    assert!(entry["created_at"].as_u64().unwrap() > 1_600_000_000);

    // The same prompt (another client model, other key order) is answered from Redis.
    let same = json!({"messages": [{"content": "What is the capital of France?", "role": "user"}],
                      "model": "other"});
    let r = chat(&gw, "/chat", &[], &same);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ai-cache-status"), Some("HIT"));
    assert!(r.header("x-ai-cache-age").is_some());
    assert_eq!(r.header("x-ai-cache-similarity"), None);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json()["choices"][0]["message"]["content"], first);
    assert_eq!(provider.count("/v1/chat/completions"), 1);

    // bypass_on: neither looked up nor stored.
    let r = chat(&gw, "/chat", &[("X-No-Cache", "1")], &q);
    assert_eq!(r.header("x-ai-cache-status"), Some("BYPASS"));
    assert_eq!(provider.count("/v1/chat/completions"), 2);
    let r = chat(&gw, "/chat", &[("X-No-Cache", "0")], &q);
    assert_eq!(r.header("x-ai-cache-status"), Some("HIT"));

    // Another parameter is another entry; another route has its own space.
    let mut warm = q.clone();
    warm["temperature"] = json!(0.7);
    assert_eq!(
        chat(&gw, "/chat", &[], &warm).header("x-ai-cache-status"),
        Some("MISS")
    );
    assert_eq!(
        chat(&gw, "/other", &[], &q).header("x-ai-cache-status"),
        Some("MISS")
    );
    wait_for_keys(redis.port, "ai-cache:l1:route=c2:*", 1);
    assert_eq!(
        chat(&gw, "/other", &[], &q).header("x-ai-cache-status"),
        Some("HIT")
    );

    // share_across_routes: one space for both routes.
    assert_eq!(
        chat(&gw, "/shared1", &[], &q).header("x-ai-cache-status"),
        Some("MISS")
    );
    wait_for_keys(redis.port, "ai-cache:l1:shared:*", 1);
    assert_eq!(
        chat(&gw, "/shared2", &[], &q).header("x-ai-cache-status"),
        Some("HIT")
    );

    // include_vars: per tenant.
    let t = |tenant: &str| {
        chat(&gw, "/tenant", &[("X-Tenant", tenant)], &q)
            .header("x-ai-cache-status")
            .map(str::to_owned)
    };
    assert_eq!(t("a:1").as_deref(), Some("MISS"));
    let k = wait_for_keys(redis.port, "ai-cache:l1:route=tenant:*", 1);
    assert!(
        k[0].starts_with("ai-cache:l1:route=tenant:http_x_tenant=a%3A1:"),
        "{k:?}"
    );
    assert_eq!(t("a:1").as_deref(), Some("HIT"));
    assert_eq!(t("b").as_deref(), Some("MISS"));

    // cache_headers false: still cached, no headers.
    let r = chat(&gw, "/quiet", &[], &q);
    assert_eq!(r.header("x-ai-cache-status"), None);
    let quiet = r.json()["choices"][0]["message"]["content"].clone();
    wait_for_keys(redis.port, "ai-cache:l1:route=quiet:*", 1);
    let r = chat(&gw, "/quiet", &[], &q);
    assert_eq!(r.header("x-ai-cache-status"), None);
    assert_eq!(r.header("x-ai-cache-age"), None);
    assert_eq!(r.json()["choices"][0]["message"]["content"], quiet);

    // max_cache_body_size: a bigger answer is not stored.
    assert_eq!(
        chat(&gw, "/small", &[], &q).header("x-ai-cache-status"),
        Some("MISS")
    );
    assert_eq!(
        chat(&gw, "/small", &[], &q).header("x-ai-cache-status"),
        Some("MISS")
    );
    assert!(redis_keys(redis.port, "ai-cache:l1:route=small:*").is_empty());

    // Without ai-proxy: fail_mode error refuses, skip passes as BYPASS.
    let r = chat(&gw, "/alone", &[], &q);
    assert_eq!(r.status, 500);
    assert_eq!(
        r.text(),
        "ai-cache must be used with the ai-proxy or ai-proxy-multi plugin"
    );
    let r = chat(&gw, "/skip", &[], &q);
    assert_eq!(r.header("x-ai-cache-status"), Some("BYPASS"));

    // A fallback instance's answer is not stored under the key made for the instance
    // picked first.
    for _ in 0..2 {
        let r = chat(&gw, "/multi", &[], &q);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-ai-cache-status"), Some("MISS"));
    }
    assert_eq!(provider.count("/limited/v1/chat/completions"), 2);
    // An answer stored after them is there: theirs would have been too.
    let before = redis_keys(redis.port, "ai-cache:l1:route=c1:*").len();
    chat(&gw, "/chat", &[], &prompt("after the fallbacks"));
    wait_for_keys(redis.port, "ai-cache:l1:route=c1:*", before + 1);
    assert!(redis_keys(redis.port, "ai-cache:l1:route=multi:*").is_empty());

    // Redis down: fail-open as a miss.
    let r = chat(&gw, "/down", &[], &q);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ai-cache-status"), Some("MISS"));
}

#[test]
fn ai_cache_stores_and_replays_streams_apart_from_answers() {
    require_redis();
    let redis = Redis::start(false);
    let provider = start_provider();
    let routes = json!({"routes": [
        {"id": "s", "uri": "/s", "plugins": {"ai-proxy": ai_proxy(&provider),
            "ai-cache": {"redis_host": "127.0.0.1", "redis_port": redis.port}}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    let mut q = prompt("Stream me");
    q["stream"] = json!(true);
    let r = chat(&gw, "/s", &[], &q);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ai-cache-status"), Some("MISS"));
    let streamed = r.text();
    assert!(
        streamed.contains("stream 1") && streamed.ends_with("data: [DONE]\n\n"),
        "{streamed}"
    );
    let keys = wait_for_keys(redis.port, "ai-cache:l1:*", 1);
    let entry: Value = serde_json::from_str(&redis_cli(redis.port, &["get", &keys[0]])).unwrap();
    assert_eq!(entry["format"], "sse");

    // Replayed whole, as a stream, with its terminal event.
    let r = chat(&gw, "/s", &[], &q);
    assert_eq!(r.header("x-ai-cache-status"), Some("HIT"));
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.text(), streamed);

    // The same prompt without streaming is another entry, answered as JSON.
    let plain = prompt("Stream me");
    let r = chat(&gw, "/s", &[], &plain);
    assert_eq!(r.header("x-ai-cache-status"), Some("MISS"));
    assert_eq!(r.json()["object"], "chat.completion");
    wait_for_keys(redis.port, "ai-cache:l1:*", 2);
    let r = chat(&gw, "/s", &[], &plain);
    assert_eq!(r.header("x-ai-cache-status"), Some("HIT"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(provider.count("/v1/chat/completions"), 2);
}

// ---- The semantic layer: an in-test RediSearch and embeddings services. ----

/// A stored hash: field -> value.
type Hash = HashMap<String, Vec<u8>>;

#[derive(Default)]
struct FakeSearch {
    strings: HashMap<String, Vec<u8>>,
    hashes: HashMap<String, Hash>,
    ttls: HashMap<String, u64>,
    /// index -> (prefix, dim)
    indexes: HashMap<String, (String, usize)>,
    /// Every command, its arguments as text (binary ones as `<n bytes>`).
    log: Vec<Vec<String>>,
    /// Malformed commands: what was wrong.
    errors: Vec<String>,
}

enum Resp {
    Ok,
    Nil,
    Int(i64),
    Bulk(Vec<u8>),
    Array(Vec<Resp>),
    Err(String),
}

fn write_resp(out: &mut Vec<u8>, r: &Resp) {
    match r {
        Resp::Ok => out.extend_from_slice(b"+OK\r\n"),
        Resp::Nil => out.extend_from_slice(b"$-1\r\n"),
        Resp::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
        Resp::Bulk(b) => {
            out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
            out.extend_from_slice(b);
            out.extend_from_slice(b"\r\n");
        }
        Resp::Array(a) => {
            out.extend_from_slice(format!("*{}\r\n", a.len()).as_bytes());
            for x in a {
                write_resp(out, x);
            }
        }
        Resp::Err(e) => out.extend_from_slice(format!("-{e}\r\n").as_bytes()),
    }
}

fn unpack(blob: &[u8]) -> Vec<f32> {
    blob.chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn cosine_distance(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    1.0 - dot / (na * nb)
}

impl FakeSearch {
    fn run(&mut self, args: Vec<Vec<u8>>) -> Resp {
        let text = |b: &Vec<u8>| String::from_utf8_lossy(b).into_owned();
        let cmd = text(&args[0]).to_ascii_uppercase();
        self.log.push(
            args.iter()
                .map(|a| match std::str::from_utf8(a) {
                    Ok(s) if !s.contains('\0') => s.to_owned(),
                    _ => format!("<{} bytes>", a.len()),
                })
                .collect(),
        );
        let a: Vec<String> = args.iter().map(text).collect();
        match cmd.as_str() {
            "PING" => Resp::Bulk(b"PONG".to_vec()),
            "GET" => match self.strings.get(&a[1]) {
                Some(v) => Resp::Bulk(v.clone()),
                None => Resp::Nil,
            },
            "SET" => {
                if a.len() != 5 || a[3] != "EX" {
                    self.errors.push(format!("SET shape: {a:?}"));
                }
                self.strings.insert(a[1].clone(), args[2].clone());
                self.ttls.insert(a[1].clone(), a[4].parse().unwrap_or(0));
                Resp::Ok
            }
            "EXPIRE" => {
                self.ttls.insert(a[1].clone(), a[2].parse().unwrap_or(0));
                Resp::Int(1)
            }
            "HSET" => {
                let fields: Vec<&str> = a[2..].iter().step_by(2).map(String::as_str).collect();
                if fields != ["partition", "embedding", "response", "created_at", "format"] {
                    self.errors.push(format!("HSET fields: {fields:?}"));
                }
                let h = self.hashes.entry(a[1].clone()).or_default();
                for pair in args[2..].chunks(2) {
                    h.insert(text(&pair[0]), pair[1].clone());
                }
                Resp::Int(5)
            }
            "FT.CREATE" => {
                let dim: usize = a.get(17).and_then(|d| d.parse().ok()).unwrap_or(0);
                let expect = [
                    "ON",
                    "HASH",
                    "PREFIX",
                    "1",
                    "*",
                    "SCHEMA",
                    "partition",
                    "TAG",
                    "embedding",
                    "VECTOR",
                    "HNSW",
                    "6",
                    "TYPE",
                    "FLOAT32",
                    "DIM",
                    "*",
                    "DISTANCE_METRIC",
                    "COSINE",
                ];
                let shape: Vec<&str> = a[2..].iter().map(String::as_str).collect();
                let ok = shape.len() == expect.len()
                    && shape.iter().zip(expect).all(|(g, e)| e == "*" || *g == e);
                if !ok || dim == 0 {
                    self.errors.push(format!("FT.CREATE shape: {a:?}"));
                    return Resp::Err("ERR bad FT.CREATE".into());
                }
                if self.indexes.contains_key(&a[1]) {
                    return Resp::Err("Index already exists".into());
                }
                self.indexes.insert(a[1].clone(), (a[6].clone(), dim));
                Resp::Ok
            }
            "FT.SEARCH" => self.search(&a, &args),
            _ => Resp::Err(format!("ERR unknown command '{cmd}'")),
        }
    }

    fn search(&mut self, a: &[String], args: &[Vec<u8>]) -> Resp {
        let Some((prefix, dim)) = self.indexes.get(&a[1]).cloned() else {
            return Resp::Err(format!("{}: no such index", a[1]));
        };
        let tail: Vec<&str> = a[3..].iter().map(String::as_str).collect();
        let expect = [
            "PARAMS",
            "2",
            "vec",
            "*",
            "RETURN",
            "4",
            "__score",
            "response",
            "created_at",
            "format",
            "SORTBY",
            "__score",
            "DIALECT",
            "2",
        ];
        if tail.len() != expect.len() || !tail.iter().zip(expect).all(|(g, e)| e == "*" || *g == e)
        {
            self.errors.push(format!("FT.SEARCH shape: {a:?}"));
            return Resp::Err("ERR bad FT.SEARCH".into());
        }
        // (@partition:{<p>})=>[KNN <k> @embedding $vec AS __score]
        let q = &a[2];
        let parsed = q
            .strip_prefix("(@partition:{")
            .and_then(|r| r.split_once("})=>[KNN "))
            .and_then(|(p, r)| {
                let (k, r) = r.split_once(' ')?;
                (r == "@embedding $vec AS __score]").then(|| (p.to_owned(), k.parse::<usize>()))
            });
        let Some((partition, Ok(k))) = parsed else {
            self.errors.push(format!("FT.SEARCH query: {q}"));
            return Resp::Err("Syntax error".into());
        };
        let vec = unpack(&args[6]);
        if vec.len() != dim {
            self.errors
                .push(format!("vector of {} for DIM {dim}", vec.len()));
        }
        let mut found: Vec<(f64, &String, &Hash)> = self
            .hashes
            .iter()
            .filter(|(key, h)| {
                key.starts_with(&prefix)
                    && h.get("partition").map(|p| p.as_slice()) == Some(partition.as_bytes())
            })
            .map(|(key, h)| (cosine_distance(&vec, &unpack(&h["embedding"])), key, h))
            .collect();
        found.sort_by(|x, y| x.0.total_cmp(&y.0));
        found.truncate(k);
        let mut out = vec![Resp::Int(found.len() as i64)];
        for (d, key, h) in found {
            out.push(Resp::Bulk(key.clone().into_bytes()));
            let mut fields = vec![
                Resp::Bulk(b"__score".to_vec()),
                Resp::Bulk(format!("{d}").into_bytes()),
            ];
            for f in ["response", "created_at", "format"] {
                fields.push(Resp::Bulk(f.as_bytes().to_vec()));
                fields.push(Resp::Bulk(h[f].clone()));
            }
            out.push(Resp::Array(fields));
        }
        Resp::Array(out)
    }
}

/// Reads one RESP command (an array of bulk strings).
fn read_command(r: &mut BufReader<TcpStream>) -> Option<Vec<Vec<u8>>> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let n: usize = line.trim_end().strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::with_capacity(n);
    for _ in 0..n {
        line.clear();
        r.read_line(&mut line).ok()?;
        let len: usize = line.trim_end().strip_prefix('$')?.parse().ok()?;
        let mut b = vec![0; len + 2];
        r.read_exact(&mut b).ok()?;
        b.truncate(len);
        args.push(b);
    }
    Some(args)
}

fn start_fake_search() -> (u16, Arc<Mutex<FakeSearch>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let state: Arc<Mutex<FakeSearch>> = Arc::default();
    let st = state.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let st = st.clone();
            std::thread::spawn(move || {
                let mut out = stream.try_clone().unwrap();
                let mut r = BufReader::new(stream);
                while let Some(args) = read_command(&mut r) {
                    let reply = st.lock().unwrap().run(args);
                    let mut buf = Vec::new();
                    write_resp(&mut buf, &reply);
                    if out.write_all(&buf).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, state)
}

/// Embeddings by meaning, for the test's prompts: the two questions on France are close,
/// Germany is far.
fn vector_of(text: &str) -> Vec<f64> {
    if text.contains("France's capital") {
        vec![0.97, 0.2, 0.0]
    } else if text.contains("France") {
        vec![1.0, 0.0, 0.0]
    } else {
        vec![0.0, 0.0, 1.0]
    }
}

/// `/openai/v1/embeddings` (Bearer key, `model`) and `/azure/embeddings` (`api-key`, no
/// model, `dimensions`).
fn start_embeddings() -> HttpServer {
    HttpServer::start(Arc::new(|req: &Seen| {
        let body = req.json();
        let input = body["input"].as_str().unwrap_or("").to_owned();
        let ok = match req.path.as_str() {
            "/openai/v1/embeddings" => {
                req.header("authorization") == Some("Bearer emb-key")
                    && body["model"] == "text-embedding-3-small"
                    && body.get("dimensions").is_none()
            }
            "/azure/embeddings" => {
                req.header("api-key") == Some("az-key")
                    && body.get("model").is_none()
                    && body["dimensions"] == 3
            }
            _ => false,
        };
        if !ok || req.header("content-type") != Some("application/json") {
            return json_answer(401, &json!({"error": "unauthorized"}));
        }
        json_answer(
            200,
            &json!({"object": "list", "model": "text-embedding-3-small",
                "data": [{"object": "embedding", "index": 0, "embedding": vector_of(&input)}],
                "usage": {"prompt_tokens": 3, "total_tokens": 3}}),
        )
    }))
}

#[test]
fn ai_cache_semantic_layer_on_a_redisearch_server() {
    let (port, search) = start_fake_search();
    let provider = start_provider();
    let emb = start_embeddings();
    let semantic = |embedding: Value, threshold: f64| {
        json!({"redis_host": "127.0.0.1", "redis_port": port,
            "layers": ["exact", "semantic"],
            "semantic": {"similarity_threshold": threshold, "ttl": 600,
                "embedding": embedding, "vector_search": {"redis": {"index": "sem"}}}})
    };
    let openai = json!({"openai": {"endpoint": format!("http://{}/openai/v1/embeddings", emb.addr),
        "model": "text-embedding-3-small", "api_key": "emb-key"}});
    let azure = json!({"azure_openai": {"endpoint": format!("http://{}/azure/embeddings", emb.addr),
        "api_key": "az-key", "dimensions": 3}});
    let routes = json!({"routes": [
        {"id": "sem", "uri": "/sem", "name": "semantic", "plugins": {"ai-proxy": ai_proxy(&provider),
            "ai-cache": semantic(openai, 0.9), "prometheus": {}}},
        {"id": "az", "uri": "/az", "plugins": {"ai-proxy": ai_proxy(&provider),
            "ai-cache": semantic(azure, 0.999)}},
    ]});
    let gw = Gateway::start(&routes.to_string());

    let r = chat(&gw, "/sem", &[], &prompt("What is the capital of France?"));
    assert_eq!(r.header("x-ai-cache-status"), Some("MISS"), "{}", r.text());
    let answer = r.json()["choices"][0]["message"]["content"].clone();
    // Written to both layers in the background, each entry then given its time (`EXPIRE` for
    // the semantic hash comes after its `HSET`).
    poll_until(Duration::from_secs(10), || {
        let s = search.lock().unwrap();
        s.hashes.len() == 1
            && s.strings.len() == 1
            && s.hashes
                .keys()
                .chain(s.strings.keys())
                .all(|k| s.ttls.contains_key(k))
    })
    .unwrap_or_else(|| panic!("written back: {:?}", search.lock().unwrap().log));
    {
        let s = search.lock().unwrap();
        assert!(s.errors.is_empty(), "{:?}", s.errors);
        let (doc, h) = s.hashes.iter().next().unwrap();
        let (index, (prefix, dim)) = s.indexes.iter().next().unwrap();
        assert!(
            index.starts_with("sem:idx:") && index.ends_with(":3"),
            "{index}"
        );
        assert!(
            prefix.starts_with("sem:l2:") && doc.starts_with(prefix.as_str()),
            "{doc}"
        );
        assert_eq!(*dim, 3);
        assert_eq!(unpack(&h["embedding"]), [1.0, 0.0, 0.0]);
        assert_eq!(h["format"], b"json");
        assert_eq!(s.ttls[doc], 600, "semantic.ttl");
        let l1 = s.strings.keys().next().unwrap();
        assert!(l1.starts_with("ai-cache:l1:route=sem:"), "{l1}");
        assert_eq!(s.ttls[l1], 3600, "exact.ttl's default");
    }

    // A similar question: the exact layer misses, the semantic one answers, and the exact
    // layer gets the answer under the new prompt's key.
    let r = chat(&gw, "/sem", &[], &prompt("Tell me France's capital"));
    assert_eq!(r.header("x-ai-cache-status"), Some("HIT"), "{}", r.text());
    let sim: f64 = r.header("x-ai-cache-similarity").unwrap().parse().unwrap();
    assert!(sim > 0.9 && sim < 1.0, "{sim}");
    assert_eq!(r.header("x-ai-cache-similarity").unwrap().len(), 6, "%.4f");
    assert_eq!(r.json()["choices"][0]["message"]["content"], answer);
    assert_eq!(provider.count("/v1/chat/completions"), 1);
    assert_eq!(search.lock().unwrap().strings.len(), 2, "backfilled");
    let embeds = emb.count("/openai/v1/embeddings");
    assert_eq!(embeds, 2);
    // Now an exact hit: no embedding asked.
    let r = chat(&gw, "/sem", &[], &prompt("Tell me France's capital"));
    assert_eq!(r.header("x-ai-cache-status"), Some("HIT"));
    assert_eq!(r.header("x-ai-cache-similarity"), None);
    assert_eq!(emb.count("/openai/v1/embeddings"), embeds);

    // A far question misses.
    let r = chat(&gw, "/sem", &[], &prompt("And Germany?"));
    assert_eq!(r.header("x-ai-cache-status"), Some("MISS"));
    assert_eq!(provider.count("/v1/chat/completions"), 2);

    // The exporter counted each decision: two misses, a semantic then an exact hit, and
    // an embedding call for each of the three prompts the exact layer missed.
    let scrape = || {
        get(
            SocketAddr::from(([127, 0, 0, 1], gw.metrics_port)),
            "/apisix/prometheus/metrics",
        )
        .text()
    };
    let labels = |model: &str| {
        format!("route=\"semantic\",route_id=\"sem\",service=\"\",service_id=\"\",consumer=\"\",node=\"ai-proxy-openai\",request_type=\"ai_chat\",request_llm_model=\"gpt-4o\",llm_model=\"{model}\"")
    };
    let expected = [
        (
            format!("apisix_ai_cache_misses_total{{{}}}", labels("gpt-4o")),
            2,
        ),
        (
            format!(
                "apisix_ai_cache_hits_total{{layer=\"semantic\",{}}}",
                labels("")
            ),
            1,
        ),
        (
            format!(
                "apisix_ai_cache_hits_total{{layer=\"exact\",{}}}",
                labels("")
            ),
            1,
        ),
        (
            format!(
                "apisix_ai_cache_embedding_latency_count{{{}}}",
                labels("gpt-4o")
            ),
            2,
        ),
        (
            format!("apisix_ai_cache_embedding_latency_count{{{}}}", labels("")),
            1,
        ),
    ];
    // The log phase follows the answer: the last request may still be on its way.
    let mut metrics = String::new();
    poll_until(Duration::from_secs(10), || {
        metrics = scrape();
        expected
            .iter()
            .all(|(line, n)| metrics.contains(&format!("{line} {n}\n")))
    })
    .unwrap_or_else(|| panic!("{expected:?} in {metrics}"));
    assert!(metrics.contains("# TYPE apisix_ai_cache_embedding_latency histogram\n"));

    // Azure OpenAI embeddings (api-key, dimensions); its threshold is above the pair's
    // similarity, and its index is another (another embedding model).
    let r = chat(&gw, "/az", &[], &prompt("What is the capital of France?"));
    assert_eq!(r.header("x-ai-cache-status"), Some("MISS"));
    poll_until(Duration::from_secs(10), || {
        search.lock().unwrap().hashes.len() == 3
    })
    .expect("written back");
    let r = chat(&gw, "/az", &[], &prompt("Tell me France's capital"));
    assert_eq!(
        r.header("x-ai-cache-status"),
        Some("MISS"),
        "below the threshold"
    );
    assert!(emb.count("/azure/embeddings") >= 2);
    assert_eq!(
        emb.last("/azure/embeddings").json()["input"],
        "Tell me France's capital"
    );
    let s = search.lock().unwrap();
    assert_eq!(s.indexes.len(), 2);
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    assert!(
        s.log.iter().any(|c| c[0] == "FT.SEARCH"
            && c[2].starts_with("(@partition:{")
            && c[2].ends_with("})=>[KNN 1 @embedding $vec AS __score]")),
        "{:?}",
        s.log
    );
}

// ---- ai-rag ----

#[test]
fn ai_rag_augments_the_request_and_answers_the_services_errors() {
    let services = HttpServer::start(Arc::new(|req: &Seen| {
        if req.header("api-key") != Some("key") {
            return Answer {
                status: 401,
                content_type: "text/plain",
                body: b"Unauthorized\n".to_vec(),
                sse: false,
            };
        }
        let body = req.json();
        match req.path.as_str() {
            "/embeddings" => {
                assert_eq!(body["input"], "which service is good for devops");
                json_answer(
                    200,
                    &json!({"data": [{"embedding": [123456789, 0.5]}], "object": "list"}),
                )
            }
            "/search" => {
                let q = &body["vectorQueries"][0];
                if q["kind"] != "vector"
                    || q["vector"] != json!([123456789, 0.5])
                    || q["fields"] != "contentVector"
                {
                    return json_answer(500, &json!({"error": "occurred"}));
                }
                Answer {
                    status: 200,
                    content_type: "application/json",
                    body: b"{\"value\":[{\"content\":\"Azure DevOps\"}]}".to_vec(),
                    sse: false,
                }
            }
            _ => json_answer(404, &json!({})),
        }
    }));
    let upstream = HttpServer::start(Arc::new(|req: &Seen| Answer {
        status: 200,
        content_type: "application/json",
        body: req.body.clone(),
        sse: false,
    }));
    let rag = |emb_key: &str, search_key: &str| {
        json!({"embeddings_provider": {"azure_openai": {
                "endpoint": format!("http://{}/embeddings", services.addr), "api_key": emb_key}},
              "vector_search_provider": {"azure_ai_search": {
                "endpoint": format!("http://{}/search", services.addr), "api_key": search_key}}})
    };
    let provider = start_provider();
    let up = json!({"nodes": {upstream.addr.to_string(): 1}, "type": "roundrobin"});
    let routes = json!({"routes": [
        {"id": "ok", "uris": ["/rag", "/v1/responses"], "upstream": up, "plugins": {"ai-rag": rag("key", "key")}},
        {"id": "llm", "uri": "/llm", "plugins": {"ai-rag": rag("key", "key"), "ai-proxy": ai_proxy(&provider)}},
        {"id": "bad-emb", "uri": "/bad-emb", "upstream": up, "plugins": {"ai-rag": rag("wrong", "key")}},
        {"id": "bad-search", "uri": "/bad-search", "upstream": up, "plugins": {"ai-rag": rag("key", "wrong")}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    let post = |path: &str, body: &str| {
        request(
            gw.addr(),
            "POST",
            path,
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        )
    };
    let ask = r#"{"ai_rag":{"vector_search":{"fields":"contentVector"},"embeddings":{"input":"which service is good for devops"}}}"#;

    // The search's answer becomes the conversation's user message; ai_rag is gone.
    let r = post("/rag", ask);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"messages": [{"role": "user", "content": "{\"value\":[{\"content\":\"Azure DevOps\"}]}"}]})
    );
    let with_chat = r#"{"model":"m","messages":[{"role":"system","content":"be brief"}],"ai_rag":{"vector_search":{"fields":"contentVector"},"embeddings":{"input":"which service is good for devops"}}}"#;
    let sent = post("/rag", with_chat).json();
    assert_eq!(sent["model"], "m");
    assert_eq!(sent["messages"].as_array().unwrap().len(), 2);
    assert_eq!(sent["messages"][1]["role"], "user");
    // The Responses API: appended to `input`.
    let responses = r#"{"input":"which service is good for devops","ai_rag":{"vector_search":{"fields":"contentVector"},"embeddings":{"input":"which service is good for devops"}}}"#;
    let sent = post("/v1/responses", responses).json();
    assert_eq!(
        sent["input"],
        "which service is good for devops\n{\"value\":[{\"content\":\"Azure DevOps\"}]}"
    );

    // Before ai-proxy: the provider gets the augmented conversation.
    let r = post("/llm", with_chat);
    assert_eq!(r.status, 200, "{}", r.text());
    let sent = provider.last("/v1/chat/completions").json();
    assert_eq!(
        sent["messages"],
        json!([{"role": "system", "content": "be brief"},
               {"role": "user", "content": "{\"value\":[{\"content\":\"Azure DevOps\"}]}"}])
    );
    assert!(sent.get("ai_rag").is_none());

    // The services' errors are the client's answer.
    let r = post("/bad-emb", ask);
    assert_eq!((r.status, r.text().as_str()), (401, "Unauthorized\n"));
    let r = post("/bad-search", ask);
    assert_eq!((r.status, r.text().as_str()), (401, "Unauthorized\n"));
    assert_eq!(upstream.seen.lock().unwrap().len(), 3);

    // Bad requests.
    let r = post("/rag", "");
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json(),
        json!({"message": "could not get body: request body is empty"})
    );
    let r = post("/rag", r#"{"messages":[]}"#);
    assert_eq!(r.status, 400);
    let r = post(
        "/rag",
        r#"{"ai_rag":{"vector_search":{"missing-fields":"x"},"embeddings":{"input":"q"}}}"#,
    );
    assert_eq!(r.status, 400);
    let r = post(
        "/rag",
        r#"{"ai_rag":{"vector_search":{"fields":"x"},"embeddings":{"missinginput":"q"}}}"#,
    );
    assert_eq!(r.status, 400);
    assert_eq!(upstream.seen.lock().unwrap().len(), 3);
}
