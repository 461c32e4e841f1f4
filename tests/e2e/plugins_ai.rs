//! End-to-end AI gateway through the binary, against an in-test LLM provider that speaks
//! OpenAI's documented chat completions API (JSON answers with `usage`, and server-sent
//! `chat.completion.chunk` events ending in `data: [DONE]` with a usage chunk when
//! `stream_options.include_usage` is set): ai-proxy with auth, options and a token budget,
//! a streamed answer relayed event by event before the provider finished, and
//! ai-proxy-multi falling back from an instance that answers 429.
use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

/// What the provider received: (path with query, lower-cased headers, body).
type Seen = Arc<Mutex<Vec<(String, Vec<(String, String)>, Value)>>>;

/// The provider. `/limited/...` answers 429; a streamed chat sends its first event, then
/// waits for `release` before the rest.
struct Provider {
    addr: SocketAddr,
    seen: Seen,
    release: mpsc::Sender<()>,
}

fn start_provider() -> Provider {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let (release, gate) = mpsc::channel::<()>();
    let gate = Arc::new(Mutex::new(gate));
    let s = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (s, gate) = (s.clone(), gate.clone());
            std::thread::spawn(move || serve(stream, &s, &gate));
        }
    });
    Provider {
        addr,
        seen,
        release,
    }
}

fn serve(stream: TcpStream, seen: &Seen, gate: &Mutex<mpsc::Receiver<()>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let target = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).unwrap();
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
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    seen.lock()
        .unwrap()
        .push((target.clone(), headers, body.clone()));
    let mut out = stream;
    let model = body["model"].as_str().unwrap_or("m").to_owned();
    if target.starts_with("/limited") {
        let err = r#"{"error":{"message":"slow down","type":"requests"}}"#;
        let _ = write!(
            out,
            "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{err}",
            err.len()
        );
        return;
    }
    if target.starts_with("/tools") {
        tool_call(out, &body, gate);
        return;
    }
    if target.ends_with("/v1/embeddings") {
        embeddings(out, &body);
        return;
    }
    if target.ends_with("/v1/responses") {
        responses(out, &body);
        return;
    }
    if body["stream"] == json!(true) {
        let _ = out.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        );
        let mut event = |data: String| {
            let e = format!("data: {data}\n\n");
            let _ = write!(out, "{:x}\r\n{e}\r\n", e.len());
            let _ = out.flush();
        };
        let chunk = |delta: Value| {
            json!({"id": "c1", "object": "chat.completion.chunk", "model": model,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
            .to_string()
        };
        event(chunk(json!({"role": "assistant", "content": "first"})));
        // The rest only once the test saw the first event through the gateway.
        let _ = gate.lock().unwrap().recv_timeout(Duration::from_secs(20));
        event(chunk(json!({"content": " second"})));
        if body["stream_options"]["include_usage"] == json!(true) {
            event(
                json!({"id": "c1", "object": "chat.completion.chunk", "choices": [],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
                .to_string(),
            );
        }
        event("[DONE]".into());
        let _ = out.write_all(b"0\r\n\r\n");
        return;
    }
    let answer = json!({"id": "c1", "object": "chat.completion", "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "an answer"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}})
    .to_string();
    let _ = write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
        answer.len()
    );
}

/// An answer asking for a tool (`message.tool_calls`, or streamed as `delta.tool_calls`
/// chunks). A stream's head goes at once, its first event only once the test releases it.
fn tool_call(mut out: TcpStream, body: &Value, gate: &Mutex<mpsc::Receiver<()>>) {
    let call = json!({"index": 0, "id": "call_1", "type": "function",
                      "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}});
    if body["stream"] == json!(true) {
        let _ = out.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        );
        let _ = out.flush();
        let _ = gate.lock().unwrap().recv_timeout(Duration::from_secs(20));
        for data in [
            json!({"id": "t1", "object": "chat.completion.chunk", "model": "m",
                   "choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [call]},
                                "finish_reason": null}]})
            .to_string(),
            json!({"id": "t1", "object": "chat.completion.chunk", "choices": [],
                   "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}})
            .to_string(),
            "[DONE]".to_owned(),
        ] {
            let e = format!("data: {data}\n\n");
            let _ = write!(out, "{:x}\r\n{e}\r\n", e.len());
        }
        let _ = out.write_all(b"0\r\n\r\n");
        return;
    }
    let answer = json!({"id": "t1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": null,
                     "tool_calls": [call]}, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}})
    .to_string();
    let _ = write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
        answer.len()
    );
}

/// OpenAI's embeddings API: one vector per input, as floats, or (`encoding_format: base64`, what
/// the official client asks for) as the base64 of their little-endian `f32` bytes.
fn embeddings(mut out: TcpStream, body: &Value) {
    let inputs = match &body["input"] {
        Value::Array(a) => a.len(),
        _ => 1,
    };
    let data: Vec<Value> = (0..inputs)
        .map(|i| {
            let v = [0.5f32, -1.0, i as f32];
            let embedding = if body["encoding_format"] == "base64" {
                let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
                json!(base64_encode(&bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let answer = json!({"object": "list", "data": data, "model": body["model"],
        "usage": {"prompt_tokens": 3, "total_tokens": 3}})
    .to_string();
    let _ = write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
        answer.len()
    );
}

fn base64_encode(bytes: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::new();
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                s.push(A[(n >> shift & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// OpenAI's Responses API: a `response` object, or (`stream: true`) its documented events,
/// each an SSE `event:` named by the data's `type`, ending with `response.completed`.
fn responses(mut out: TcpStream, body: &Value) {
    let response = |status: &str, text: &str| {
        json!({"id": "resp_1", "object": "response", "created_at": 1, "model": body["model"],
               "status": status, "output": if text.is_empty() { json!([]) } else { json!([{
                   "id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": text, "annotations": []}]}]) },
               "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7,
                         "input_tokens_details": {"cached_tokens": 0},
                         "output_tokens_details": {"reasoning_tokens": 0}}})
    };
    if body["stream"] != json!(true) {
        let answer = response("completed", "a response").to_string();
        let _ = write!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
            answer.len()
        );
        return;
    }
    let _ = out.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
    );
    let delta = |n: u64, text: &str| {
        json!({"type": "response.output_text.delta", "sequence_number": n, "item_id": "msg_1",
               "output_index": 0, "content_index": 0, "delta": text})
    };
    let events = [
        json!({"type": "response.created", "sequence_number": 0,
               "response": response("in_progress", "")}),
        delta(1, "streamed"),
        delta(2, " response"),
        json!({"type": "response.completed", "sequence_number": 3,
               "response": response("completed", "streamed response")}),
    ];
    for e in events {
        let e = format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap());
        let _ = write!(out, "{:x}\r\n{e}\r\n", e.len());
        let _ = out.flush();
    }
    let _ = out.write_all(b"0\r\n\r\n");
}

fn chat(addr: SocketAddr, path: &str, extra: &[(&str, &str)], body: &Value) -> Reply {
    let mut headers = vec![("Content-Type", "application/json")];
    headers.extend_from_slice(extra);
    request(addr, "POST", path, &headers, body.to_string().as_bytes())
}

#[test]
fn ai_proxy_chat_with_auth_options_and_token_budget() {
    let p = start_provider();
    let routes = json!({"routes": [
        {"id": "chat", "uri": "/chat", "plugins": {
            "ai-proxy": {"provider": "openai", "auth": {"header": {"Authorization": "Bearer sk-e2e"}},
                         "options": {"model": "gpt-e2e", "temperature": 0.1},
                         "override": {"endpoint": format!("http://{}", p.addr)}},
            "ai-rate-limiting": {"limit": 10, "time_window": 60}}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    let body = json!({"model": "client", "messages": [{"role": "user", "content": "hi"}]});
    let r = chat(
        gw.addr(),
        "/chat",
        &[("Authorization", "Bearer client")],
        &body,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], "an answer");
    assert_eq!(
        r.header("x-ai-ratelimit-remaining-ai-proxy-openai"),
        Some("10")
    );
    let (path, headers, sent) = p.seen.lock().unwrap()[0].clone();
    assert_eq!(path, "/v1/chat/completions");
    let auth: Vec<&str> = headers
        .iter()
        .filter(|(k, _)| k == "authorization")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(auth, ["Bearer sk-e2e"], "the client's key replaced");
    assert_eq!(sent["model"], "gpt-e2e");
    assert_eq!(sent["temperature"], 0.1);

    // 6 tokens spent of 10: 4 left, then none.
    let r = chat(gw.addr(), "/chat", &[], &body);
    assert_eq!(
        r.header("x-ai-ratelimit-remaining-ai-proxy-openai"),
        Some("4")
    );
    let r = chat(gw.addr(), "/chat", &[], &body);
    assert_eq!(r.status, 503);
    assert_eq!(
        r.header("x-ai-ratelimit-remaining-ai-proxy-openai"),
        Some("0")
    );
    assert_eq!(
        p.seen.lock().unwrap().len(),
        2,
        "a refused request never reaches the provider"
    );

    // Not an AI request.
    let r = request(
        gw.addr(),
        "POST",
        "/chat",
        &[("Content-Type", "text/plain")],
        b"x",
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        r.text(),
        "unsupported content-type: text/plain, only application/json is supported"
    );
}

/// A streamed chat POSTed to `path` on a connection of its own, the answer left to read.
fn chat_stream(addr: SocketAddr, path: &str) -> TcpStream {
    let body = json!({"stream": true, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

/// Reads until `text` has come (the connection must not close before).
fn read_until(s: &mut TcpStream, text: &str) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains(text) {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    got
}

#[test]
fn streamed_answer_relayed_before_the_provider_finished() {
    let p = start_provider();
    let routes = json!({"routes": [
        {"id": "s", "uri": "/s", "plugins": {
            "ai-proxy": {"provider": "openai", "auth": {"header": {"Authorization": "Bearer k"}},
                         "override": {"endpoint": format!("http://{}", p.addr)}},
            "ai-rate-limiting": {"limit": 100, "time_window": 60}}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    let mut s = chat_stream(gw.addr(), "/s");
    // The first event comes while the provider still holds the rest back.
    let mut got = read_until(&mut s, "first");
    let head = String::from_utf8_lossy(&got).to_ascii_lowercase();
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    assert!(!head.contains("second"));
    p.release.send(()).unwrap();
    s.read_to_end(&mut got).unwrap();
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains("\"content\":\" second\""), "{text}");
    assert!(text.contains("data: [DONE]"), "{text}");
    // The gateway asked for the usage chunk, and the budget counted it.
    assert_eq!(
        p.seen.lock().unwrap()[0].2["stream_options"],
        json!({"include_usage": true})
    );
    let again = json!({"messages": [{"role": "user", "content": "hi"}]});
    let r = chat(gw.addr(), "/s", &[], &again);
    assert_eq!(
        r.header("x-ai-ratelimit-remaining-ai-proxy-openai"),
        Some("95")
    );
}

/// `max_response_bytes` on a whole answer (over its `Content-Length`: 502 with APISIX's text)
/// and on a stream (it ends after the chunk that crosses the cap, though the provider has
/// more); `max_stream_duration_ms` ends a stream whose next chunk comes past it.
#[test]
fn runaway_answers_are_cut_at_max_response_bytes_and_max_stream_duration_ms() {
    let p = start_provider();
    let proxy = |caps: Value| {
        let mut conf = json!({"provider": "openai",
            "auth": {"header": {"Authorization": "Bearer k"}},
            "override": {"endpoint": format!("http://{}", p.addr)}});
        for (k, v) in caps.as_object().unwrap() {
            conf[k] = v.clone();
        }
        conf
    };
    let routes = json!({"routes": [
        {"id": "b", "uri": "/bytes", "plugins": {"ai-proxy": proxy(json!({"max_response_bytes": 60}))}},
        {"id": "t", "uri": "/time", "plugins": {"ai-proxy": proxy(json!({"max_stream_duration_ms": 300}))}},
        {"id": "ok", "uri": "/ok", "plugins": {"ai-proxy": proxy(json!({"max_response_bytes": 100000}))}}
    ]});
    let gw = Launch::new(&routes.to_string())
        .stderr_to_file()
        .rust_log("warn")
        .start();
    let hi = json!({"messages": [{"role": "user", "content": "hi"}]});
    let r = chat(gw.addr(), "/bytes", &[], &hi);
    assert_eq!(r.status, 502);
    assert_eq!(r.text(), "max_response_bytes exceeded");
    let r = chat(gw.addr(), "/ok", &[], &hi);
    assert_eq!(r.status, 200, "{}", r.text());
    // A stream: the first event alone is over 60 bytes; the provider holds the rest back
    // until released, and the gateway ends the stream without waiting for it.
    let mut s = chat_stream(gw.addr(), "/bytes");
    let mut got = String::new();
    s.read_to_string(&mut got).unwrap();
    assert!(got.contains("first"), "{got}");
    assert!(!got.contains("second") && !got.contains("[DONE]"), "{got}");
    // The duration: the first event comes at once; the rest only after the cap.
    let mut s = chat_stream(gw.addr(), "/time");
    read_until(&mut s, "first");
    std::thread::sleep(Duration::from_millis(400));
    // Released twice: the first gate was the /bytes stream's, whose provider is still held.
    p.release.send(()).unwrap();
    p.release.send(()).unwrap();
    let mut rest = String::new();
    s.read_to_string(&mut rest).unwrap();
    let logged = poll_until(Duration::from_secs(5), || {
        gw.error_output()
            .contains("aborting AI stream: max_stream_duration_ms exceeded")
    });
    assert!(logged.is_some(), "{}", gw.error_output());
    assert!(gw
        .error_output()
        .contains("aborting AI stream: max_response_bytes exceeded"));
}

#[test]
fn ai_proxy_multi_falls_back_from_a_rate_limited_instance() {
    let p = start_provider();
    let routes = json!({"routes": [
        {"id": "m", "uri": "/m", "plugins": {"ai-proxy-multi": {
            "fallback_strategy": ["http_429"],
            "instances": [
                {"name": "busy", "provider": "openai", "weight": 1, "priority": 1,
                 "auth": {"header": {"Authorization": "Bearer busy"}},
                 "override": {"endpoint": format!("http://{}/limited/v1/chat/completions", p.addr)}},
                {"name": "spare", "provider": "deepseek", "weight": 1, "priority": 0,
                 "auth": {"query": {"key": "spare"}}, "options": {"model": "spare-model"},
                 "override": {"endpoint": format!("http://{}", p.addr)}}]}}},
        {"id": "n", "uri": "/n", "plugins": {"ai-proxy-multi": {
            "instances": [
                {"name": "busy", "provider": "openai", "weight": 1,
                 "auth": {"header": {"Authorization": "Bearer busy"}},
                 "override": {"endpoint": format!("http://{}/limited/v1/chat/completions", p.addr)}}]}}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let r = chat(gw.addr(), "/m", &[], &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "spare-model");
    let seen = p.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert!(seen[0].0.starts_with("/limited/"));
    assert_eq!(seen[1].0, "/chat/completions?key=spare");

    // Without a fallback the provider's 429 reaches the client as it was.
    let r = chat(gw.addr(), "/n", &[], &body);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json()["error"]["message"], "slow down");
}

/// The official `openai` Python client (PyPI, installed by scripts/test.sh) against ai-proxy:
/// a chat, a streamed chat, and a provider's 429 surfacing as the client's `RateLimitError`.
#[test]
fn official_openai_client() {
    let p = start_provider();
    let endpoint = format!("http://{}", p.addr);
    let routes = json!({"routes": [
        {"id": "v1", "uri": "/v1/*", "plugins": {
            "ai-proxy": {"provider": "openai", "auth": {"header": {"Authorization": "Bearer sk-py"}},
                         "override": {"endpoint": endpoint}}}},
        {"id": "busy", "uri": "/busy/*", "plugins": {
            "ai-proxy": {"provider": "openai", "auth": {"header": {"Authorization": "Bearer sk-py"}},
                         "override": {"endpoint": format!("{endpoint}/limited/v1/chat/completions")}}}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    // The stream's second half waits for a release: give it up front.
    p.release.send(()).unwrap();
    let script = r#"
import json, sys
import openai
base = sys.argv[1]
c = openai.OpenAI(base_url=base + "/v1", api_key="client-key", max_retries=0)
r = c.chat.completions.create(model="gpt-py", messages=[{"role": "user", "content": "hi"}])
out = {"content": r.choices[0].message.content, "total": r.usage.total_tokens}
s = c.chat.completions.create(model="gpt-py", stream=True,
                              messages=[{"role": "user", "content": "hi"}])
parts, usage = [], None
for chunk in s:
    if chunk.usage:
        usage = chunk.usage.total_tokens
    for choice in chunk.choices:
        parts.append(choice.delta.content or "")
out["stream"] = "".join(parts)
out["stream_usage"] = usage
busy = openai.OpenAI(base_url=base + "/busy/v1", api_key="k", max_retries=0)
try:
    busy.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    out["busy"] = "answered"
except openai.RateLimitError as e:
    out["busy"] = "RateLimitError %d" % e.status_code
print(json.dumps(out))
"#;
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(format!("http://{}", gw.addr()))
        .output()
        .expect("python3 (Debian's python3) runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named 'openai'"),
        "the openai Python package is missing: scripts/test.sh installs it (pip install openai)"
    );
    assert!(out.status.success(), "{stderr}");
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        got,
        json!({"content": "an answer", "total": 6, "stream": "first second",
               "stream_usage": 5, "busy": "RateLimitError 429"})
    );
}

/// The official `openai` Python client's embeddings and Responses APIs through ai-proxy: what
/// the provider received (its path, the configured key in place of the client's, the body as
/// the client wrote it) and what the client made of the answers, streamed and not.
#[test]
fn official_openai_client_embeddings_and_responses() {
    let p = start_provider();
    let routes = json!({"routes": [
        {"id": "v1", "uri": "/v1/*", "plugins": {
            "ai-proxy": {"provider": "openai", "auth": {"header": {"Authorization": "Bearer sk-py"}},
                         "override": {"endpoint": format!("http://{}", p.addr)}}}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    let script = r#"
import json, sys
import openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="client-key", max_retries=0)
out = {}
e = c.embeddings.create(model="emb-py", input=["one", "two"])
out["embeddings"] = [d.embedding for d in e.data]
out["embedding_usage"] = e.usage.total_tokens
f = c.embeddings.create(model="emb-py", input="one", encoding_format="float")
out["float"] = f.data[0].embedding
r = c.responses.create(model="resp-py", input="hi")
out["response"] = r.output_text
out["response_usage"] = r.usage.total_tokens
events, text, final = [], [], None
for ev in c.responses.create(model="resp-py", input="hi", stream=True):
    events.append(ev.type)
    if ev.type == "response.output_text.delta":
        text.append(ev.delta)
    if ev.type == "response.completed":
        final = ev.response.output_text
out["events"] = events
out["stream"] = "".join(text)
out["final"] = final
print(json.dumps(out))
"#;
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(format!("http://{}", gw.addr()))
        .output()
        .expect("python3 (Debian's python3) runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named 'openai'"),
        "the openai Python package is missing: scripts/test.sh installs it (pip install openai)"
    );
    assert!(out.status.success(), "{stderr}");
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        got,
        json!({"embeddings": [[0.5, -1.0, 0.0], [0.5, -1.0, 1.0]], "embedding_usage": 3,
               "float": [0.5, -1.0, 0.0],
               "response": "a response", "response_usage": 7,
               "events": ["response.created", "response.output_text.delta",
                          "response.output_text.delta", "response.completed"],
               "stream": "streamed response", "final": "streamed response"})
    );
    let seen = p.seen.lock().unwrap();
    let paths: Vec<&str> = seen.iter().map(|(path, _, _)| path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/v1/embeddings",
            "/v1/embeddings",
            "/v1/responses",
            "/v1/responses"
        ]
    );
    for (_, headers, _) in seen.iter() {
        let auth: Vec<&str> = headers
            .iter()
            .filter(|(k, _)| k == "authorization")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(
            auth,
            ["Bearer sk-py"],
            "the configured key, not the client's"
        );
    }
    assert_eq!(
        seen[0].2,
        json!({"model": "emb-py", "input": ["one", "two"], "encoding_format": "base64"})
    );
    assert_eq!(
        seen[1].2,
        json!({"model": "emb-py", "input": "one", "encoding_format": "float"})
    );
    assert_eq!(seen[2].2, json!({"model": "resp-py", "input": "hi"}));
    assert_eq!(
        seen[3].2,
        json!({"model": "resp-py", "input": "hi", "stream": true})
    );
}

/// The `$llm_*` variables and `$request_type` ai-proxy sets, read by a logger's
/// `log_format` and by the access log, and the prometheus AI labels and LLM metrics, for a chat and a streamed chat.
#[test]
fn llm_variables_reach_the_loggers_and_prometheus() {
    let p = start_provider();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("ai.log");
    let format = json!({"type": "$request_type", "asked": "$request_llm_model",
        "model": "$llm_model", "prompt": "$llm_prompt_tokens",
        "completion": "$llm_completion_tokens", "total": "$llm_total_tokens",
        "stream": "$llm_stream", "ttft": "$llm_time_to_first_token"});
    let routes = json!({"routes": [
        {"id": "ai", "uri": "/ai", "plugins": {
            "ai-proxy": {"provider": "openai", "auth": {"header": {"Authorization": "Bearer k"}},
                         "options": {"model": "gpt-e2e"},
                         "override": {"endpoint": format!("http://{}", p.addr)}},
            "prometheus": {},
            "file-logger": {"path": log.to_str().unwrap(), "log_format": format}}},
    ]});
    let gw = Gateway::start_tuned(
        &routes.to_string(),
        "",
        "",
        1,
        "access_log_format: \"$uri $request_type $request_llm_model $llm_model $llm_prompt_tokens $llm_completion_tokens\"",
    );
    let r = chat(
        gw.addr(),
        "/ai",
        &[],
        &json!({"model": "asked", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // The stream's second half waits for a release: give it up front.
    p.release.send(()).unwrap();
    let r = chat(
        gw.addr(),
        "/ai",
        &[],
        &json!({"model": "asked-s", "stream": true,
                "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("data: [DONE]"), "{}", r.text());

    let mut text = String::new();
    poll_until(Duration::from_secs(10), || {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines().count() >= 2
    })
    .unwrap_or_else(|| panic!("two log lines: {text}"));
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (chat_line, stream_line) = (&lines[0], &lines[1]);
    assert_eq!(chat_line["type"], "ai_chat", "{chat_line}");
    assert_eq!(chat_line["asked"], "asked");
    assert_eq!(chat_line["model"], "gpt-e2e");
    assert_eq!(chat_line["prompt"], "4");
    assert_eq!(chat_line["completion"], "2");
    assert_eq!(chat_line["total"], "6");
    assert_eq!(chat_line["stream"], "false");
    assert!(chat_line["ttft"].as_str().unwrap().parse::<u64>().is_ok());
    assert_eq!(stream_line["type"], "ai_stream", "{stream_line}");
    assert_eq!(stream_line["asked"], "asked-s");
    assert_eq!(stream_line["model"], "gpt-e2e");
    // The stream's usage chunk came last.
    assert_eq!(stream_line["prompt"], "3");
    assert_eq!(stream_line["completion"], "2");
    assert_eq!(stream_line["stream"], "true");

    // The access log reads them too; a request no AI plugin served has nginx.conf's presets.
    assert_eq!(get(gw.addr(), "/elsewhere").status, 404);
    let mut access = String::new();
    poll_until(Duration::from_secs(10), || {
        access = std::fs::read_to_string(access_log(&gw)).unwrap_or_default();
        access.lines().count() >= 3
    })
    .unwrap_or_else(|| panic!("three access log lines: {access}"));
    let access: Vec<&str> = access.lines().collect();
    assert_eq!(access[0], "/ai ai_chat asked gpt-e2e 4 2");
    assert_eq!(access[1], "/ai ai_stream asked-s gpt-e2e 3 2");
    assert_eq!(access[2], "/elsewhere traditional_http   0 0");

    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], gw.metrics_port));
    let metrics = get(addr, "/apisix/prometheus/metrics").text();
    let line = |prefix: &str, has: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(prefix) && l.contains(has))
            .unwrap_or_else(|| panic!("no {prefix}..{has} in {metrics}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .to_owned()
    };
    let chat_labels = "request_type=\"ai_chat\",request_llm_model=\"asked\",llm_model=\"gpt-e2e\"";
    let stream_labels =
        "request_type=\"ai_stream\",request_llm_model=\"asked-s\",llm_model=\"gpt-e2e\"";
    assert_eq!(
        line("apisix_http_status{code=\"200\",route=\"ai\"", chat_labels),
        "1"
    );
    assert_eq!(
        line(
            "apisix_http_status{code=\"200\",route=\"ai\"",
            stream_labels
        ),
        "1"
    );
    assert!(
        metrics.contains("# TYPE apisix_llm_prompt_tokens counter\n"),
        "{metrics}"
    );
    assert_eq!(
        line("apisix_llm_prompt_tokens{route_id=\"ai\"", chat_labels),
        "4"
    );
    assert_eq!(
        line("apisix_llm_completion_tokens{route_id=\"ai\"", chat_labels),
        "2"
    );
    assert_eq!(
        line("apisix_llm_prompt_tokens{route_id=\"ai\"", stream_labels),
        "3"
    );
    assert_eq!(
        line(
            "apisix_llm_completion_tokens_dist_count{route_id=\"ai\"",
            stream_labels
        ),
        "1"
    );
    assert_eq!(
        line(
            "apisix_llm_prompt_tokens_dist_bucket{route_id=\"ai\"",
            &format!("{chat_labels},le=\"10\"")
        ),
        "1"
    );
}

/// `$llm_has_tool_calls` from a complete and a streamed answer, a stream's time to first
/// token taken at its first chunk, and `apisix_llm_active_connections` counting the stream
/// while it lasts.
#[test]
fn tool_calls_first_token_and_active_connections() {
    let p = start_provider();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("ai.log");
    let format = json!({"tools": "$llm_has_tool_calls", "ttft": "$llm_time_to_first_token",
        "type": "$request_type"});
    let proxy = |path: &str| {
        json!({"provider": "openai", "auth": {"header": {"Authorization": "Bearer k"}},
               "override": {"endpoint": format!("http://{}{path}", p.addr)}})
    };
    let logger = json!({"path": log.to_str().unwrap(), "log_format": format});
    let routes = json!({"routes": [
        {"id": "tools", "uri": "/tools", "name": "tooling", "plugins": {
            "ai-proxy": proxy("/tools/v1/chat/completions"), "prometheus": {},
            "file-logger": logger}},
        {"id": "plain", "uri": "/plain", "plugins": {
            "ai-proxy": proxy(""), "file-logger": logger}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    let ask = json!({"model": "m", "messages": [{"role": "user", "content": "weather?"}]});
    let r = chat(gw.addr(), "/tools", &[], &ask);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["choices"][0]["message"]["tool_calls"][0]["id"],
        "call_1"
    );
    let r = chat(gw.addr(), "/plain", &[], &ask);
    assert_eq!(r.status, 200, "{}", r.text());

    // A stream whose head came but whose first event is held back.
    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    let body = streamed.to_string();
    let mut s = TcpStream::connect(gw.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "POST /tools HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("\r\n\r\n") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&got).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let scrape = || {
        get(
            SocketAddr::from(([127, 0, 0, 1], gw.metrics_port)),
            "/apisix/prometheus/metrics",
        )
        .text()
    };
    let gauge = "apisix_llm_active_connections{route=\"tooling\",route_id=\"tools\",matched_uri=\"/tools\",matched_host=\"\",service=\"\",service_id=\"\",consumer=\"\",node=\"ai-proxy-openai\",request_type=\"ai_stream\",request_llm_model=\"m\",llm_model=\"m\"}";
    let metrics = scrape();
    assert!(metrics.contains(&format!("{gauge} 1\n")), "{metrics}");
    assert!(metrics.contains("# TYPE apisix_llm_active_connections gauge\n"));
    // The first event leaves the provider only after this pause, so a time to first token
    // taken at it is at least the pause (one taken at the head would not be).
    let hold = Duration::from_millis(300);
    std::thread::sleep(hold);
    p.release.send(()).unwrap();
    s.read_to_end(&mut got).unwrap();
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains("\"tool_calls\""), "{text}");
    assert!(text.contains("data: [DONE]"), "{text}");

    let mut logged = String::new();
    poll_until(Duration::from_secs(10), || {
        logged = std::fs::read_to_string(&log).unwrap_or_default();
        logged.lines().count() >= 3
    })
    .unwrap_or_else(|| panic!("three log lines: {logged}"));
    let lines: Vec<Value> = logged
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["tools"], "true", "{}", lines[0]);
    assert_eq!(lines[0]["type"], "ai_chat");
    assert_eq!(lines[1]["tools"], "false", "{}", lines[1]);
    assert_eq!(lines[2]["tools"], "true", "{}", lines[2]);
    assert_eq!(lines[2]["type"], "ai_stream");
    let ttft: u128 = lines[2]["ttft"].as_str().unwrap().parse().unwrap();
    assert!(ttft >= hold.as_millis(), "{}", lines[2]);
    // The stream is over: the gauge is back to 0.
    let mut metrics = String::new();
    poll_until(Duration::from_secs(10), || {
        metrics = scrape();
        metrics.contains(&format!("{gauge} 0\n"))
    })
    .unwrap_or_else(|| panic!("{gauge} 0 in {metrics}"));
}

/// A request an in-test cloud server received: method, raw path with query, lower-cased
/// headers, body.
type CloudReq = (String, String, Vec<(String, String)>, Vec<u8>);
type CloudHandler = dyn Fn(&CloudReq) -> (u16, String) + Send + Sync;

/// An HTTP/1.1 server answering each request with `handler`'s JSON.
fn start_cloud(handler: Arc<CloudHandler>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let handler = handler.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                let mut parts = line.split_whitespace();
                let method = parts.next().unwrap_or("").to_owned();
                let target = parts.next().unwrap_or("/").to_owned();
                let mut headers = Vec::new();
                loop {
                    let mut h = String::new();
                    reader.read_line(&mut h).unwrap();
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
                let (status, answer) = handler(&(method, target, headers, body));
                let mut out = stream;
                let _ = write!(
                    out,
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                    answer.len()
                );
            });
        }
    });
    addr
}

fn header_of<'a>(req: &'a CloudReq, name: &str) -> Option<&'a str> {
    req.2
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(if b[i] == b'+' { b' ' } else { b[i] });
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// AWS's SigV4 recomputed from the documented algorithm for a request without a query: the
/// canonical URI is each path segment URI-encoded twice (as AWS asks of services other than
/// S3), over the headers `SignedHeaders` names; why not, when the signature does not match.
fn sigv4_valid(req: &CloudReq, secret: &str) -> Result<(), String> {
    use ring::{digest, hmac};
    let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let mac = |key: &[u8], msg: &[u8]| {
        hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), msg)
            .as_ref()
            .to_vec()
    };
    let auth = header_of(req, "authorization").ok_or("no authorization")?;
    let rest = auth
        .strip_prefix("AWS4-HMAC-SHA256 Credential=")
        .ok_or("not sigv4")?;
    let (credential, rest) = rest
        .split_once(", SignedHeaders=")
        .ok_or("no signed headers")?;
    let (signed, signature) = rest.split_once(", Signature=").ok_or("no signature")?;
    let (_key, scope) = credential.split_once('/').ok_or("bad credential")?;
    let amz_date = header_of(req, "x-amz-date").ok_or("no x-amz-date")?;
    let encode = |s: &str| {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect::<String>()
    };
    let canonical_uri = req
        .1
        .split('/')
        .map(|seg| encode(&encode(&percent_decode(seg))))
        .collect::<Vec<_>>()
        .join("/");
    let mut canonical_headers = String::new();
    for name in signed.split(';') {
        let value = header_of(req, name).ok_or(format!("{name} signed but not sent"))?;
        canonical_headers.push_str(&format!("{name}:{}\n", value.trim()));
    }
    let canonical = format!(
        "{}\n{canonical_uri}\n\n{canonical_headers}\n{signed}\n{}",
        req.0,
        hex(digest::digest(&digest::SHA256, &req.3).as_ref())
    );
    let sts = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex(digest::digest(&digest::SHA256, canonical.as_bytes()).as_ref())
    );
    let mut parts = scope.split('/');
    let (date, region, service) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
    );
    if !amz_date.starts_with(date) {
        return Err("date outside the scope".into());
    }
    let k = mac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k = mac(&k, region.as_bytes());
    let k = mac(&k, service.as_bytes());
    let k = mac(&k, b"aws4_request");
    if hex(&mac(&k, sts.as_bytes())) == signature {
        Ok(())
    } else {
        Err(format!("signature mismatch over {canonical:?}"))
    }
}

/// vertex-ai with a GCP service account (the JWT checked with the account's public key at
/// the token URI, the token then sent and kept) and bedrock signed with SigV4 (recomputed
/// here, session token included).
#[test]
fn vertex_ai_service_account_and_bedrock_sigv4() {
    const PRIVATE: &str = include_str!("../data/tls/dual-rsa.key");
    const PUBLIC: &str = include_str!("../data/tls/dual-rsa.pub");
    let token_uri = Arc::new(Mutex::new(String::new()));
    let exchanges = Arc::new(Mutex::new(0usize));
    let seen: Arc<Mutex<Vec<CloudReq>>> = Arc::default();
    let (uri, count, log) = (token_uri.clone(), exchanges.clone(), seen.clone());
    let addr = start_cloud(Arc::new(move |req: &CloudReq| {
        log.lock().unwrap().push(req.clone());
        let (method, path, _, body) = req;
        if method == "POST" && path == "/token" {
            let form: Vec<(String, String)> = String::from_utf8_lossy(body)
                .split('&')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), percent_decode(v)))
                .collect();
            let field = |k: &str| {
                form.iter()
                    .find(|(n, _)| n == k)
                    .map_or("", |(_, v)| v.as_str())
            };
            if field("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
                return (400, r#"{"error":"unsupported_grant_type"}"#.into());
            }
            let key = jsonwebtoken::DecodingKey::from_rsa_pem(PUBLIC.as_bytes()).unwrap();
            let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
            v.set_audience(&[uri.lock().unwrap().clone()]);
            return match jsonwebtoken::decode::<Value>(field("assertion"), &key, &v) {
                Ok(t) if t.claims["iss"] == "ai@p1.iam.gserviceaccount.com" => {
                    *count.lock().unwrap() += 1;
                    (
                        200,
                        r#"{"access_token":"ya29.ai","expires_in":3600,"token_type":"Bearer"}"#
                            .into(),
                    )
                }
                _ => (400, r#"{"error":"invalid_grant"}"#.into()),
            };
        }
        if path.starts_with("/v1beta1/projects/p1/locations/us-central1/") {
            if header_of(req, "authorization") != Some("Bearer ya29.ai") {
                return (401, r#"{"error":{"code":401}}"#.into());
            }
            return (
                200,
                json!({"id": "v1", "object": "chat.completion", "model": "gemini",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "from vertex"},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}})
                .to_string(),
            );
        }
        if path.starts_with("/model/") {
            if let Err(e) = sigv4_valid(req, "bedrock-secret") {
                return (403, json!({"message": e}).to_string());
            }
            return (
                200,
                json!({"output": {"message": {"role": "assistant", "content": [{"text": "from bedrock"}]}},
                       "stopReason": "end_turn",
                       "usage": {"inputTokens": 4, "outputTokens": 5, "totalTokens": 9}})
                .to_string(),
            );
        }
        (404, "{}".into())
    }));
    *token_uri.lock().unwrap() = format!("http://{addr}/token");
    let account = json!({"type": "service_account", "project_id": "p1",
        "client_email": "ai@p1.iam.gserviceaccount.com", "private_key": PRIVATE,
        "token_uri": format!("http://{addr}/token")})
    .to_string();
    let routes = json!({"routes": [
        {"id": "vertex", "uri": "/vertex", "plugins": {"ai-proxy": {
            "provider": "vertex-ai", "auth": {"gcp": {"service_account_json": account}},
            "provider_conf": {"project_id": "p1", "region": "us-central1"},
            "options": {"model": "gemini"},
            "override": {"endpoint": format!("http://{addr}")}}}},
        {"id": "nokey", "uri": "/nokey", "plugins": {"ai-proxy": {
            "provider": "vertex-ai", "auth": {"gcp": {"service_account_json": "{}"}},
            "provider_conf": {"project_id": "p1", "region": "us-central1"},
            "override": {"endpoint": format!("http://{addr}")}}}},
        {"id": "bedrock", "uri": "/b/converse", "plugins": {"ai-proxy": {
            "provider": "bedrock",
            "auth": {"aws": {"access_key_id": "AKIDAI", "secret_access_key": "bedrock-secret",
                             "session_token": "session-1"}},
            "provider_conf": {"region": "us-east-1"},
            "options": {"model": "anthropic.claude-3:0"},
            "override": {"endpoint": format!("http://{addr}")}}}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    let ask = json!({"messages": [{"role": "user", "content": "hi"}]});
    for _ in 0..2 {
        let r = chat(gw.addr(), "/vertex", &[], &ask);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["choices"][0]["message"]["content"], "from vertex");
    }
    // One exchange: the token is kept until it expires.
    assert_eq!(*exchanges.lock().unwrap(), 1);
    let r = chat(gw.addr(), "/nokey", &[], &ask);
    assert_eq!(r.status, 500, "{}", r.text());
    assert_eq!(
        r.json()["error_msg"],
        "failed to get gcp access token: failed to get google oauth token"
    );

    let converse = json!({"messages": [{"role": "user", "content": [{"text": "hi"}]}]});
    let r = chat(gw.addr(), "/b/converse", &[], &converse);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["output"]["message"]["content"][0]["text"],
        "from bedrock"
    );
    let seen = seen.lock().unwrap();
    let signed = seen.iter().find(|r| r.1.starts_with("/model/")).unwrap();
    // The model's `:` goes once-encoded on the wire.
    assert_eq!(signed.1, "/model/anthropic.claude-3%3A0/converse");
    assert_eq!(header_of(signed, "x-amz-security-token"), Some("session-1"));
    let auth = header_of(signed, "authorization").unwrap();
    assert!(
        auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDAI/")
            && auth.contains("/us-east-1/bedrock/aws4_request, SignedHeaders=host;x-amz-date;x-amz-security-token, "),
        "{auth}"
    );
}

/// ai-rate-limiting's `rules` (a budget per value of a request variable, here a team header,
/// with its own header prefix) spending `cost_expr` of the provider's usage (4 prompt and 2
/// completion tokens per answer: 4 * 2 + 2 = 10).
#[test]
fn ai_rate_limiting_rules_spend_the_cost_expression() {
    let p = start_provider();
    let routes = json!({"routes": [
        {"id": "r", "uri": "/r", "plugins": {
            "ai-proxy": {"provider": "openai", "auth": {"header": {"Authorization": "Bearer k"}},
                         "override": {"endpoint": format!("http://{}", p.addr)}},
            "ai-rate-limiting": {
                "rules": [{"count": 20, "time_window": 60, "key": "team-${http_x_team}",
                           "header_prefix": "team"}],
                "limit_strategy": "expression",
                "cost_expr": "prompt_tokens * 2 + completion_tokens",
                "rejected_code": 429, "rejected_msg": "team budget spent"}}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let a = [("X-Team", "a")];
    let r = chat(gw.addr(), "/r", &a, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-ai-team-ratelimit-limit"), Some("20"));
    assert_eq!(r.header("x-ai-team-ratelimit-remaining"), Some("20"));
    assert_eq!(r.header("x-ai-team-ratelimit-reset"), Some("60"));
    let r = chat(gw.addr(), "/r", &a, &body);
    assert_eq!(r.header("x-ai-team-ratelimit-remaining"), Some("10"));
    let r = chat(gw.addr(), "/r", &a, &body);
    assert_eq!(r.status, 429);
    assert_eq!(r.json()["error_msg"], "team budget spent");
    assert_eq!(r.header("x-ai-team-ratelimit-remaining"), Some("0"));
    // Another team has its own budget.
    let r = chat(gw.addr(), "/r", &[("X-Team", "b")], &body);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ai-team-ratelimit-remaining"), Some("20"));
    // No rule applies to a request without the variable: APISIX fails it with 500.
    let r = chat(gw.addr(), "/r", &[], &body);
    assert_eq!(r.status, 500);
    assert_eq!(
        p.seen.lock().unwrap().len(),
        3,
        "refused requests never reach the provider"
    );
}

fn redis_budget_routes(provider: SocketAddr, policy: Value) -> String {
    let mut conf = json!({"limit": 10, "time_window": 60});
    for (k, v) in policy.as_object().unwrap() {
        conf[k] = v.clone();
    }
    json!({"routes": [
        {"id": "shared", "uri": "/shared", "plugins": {
            "ai-proxy": {"provider": "openai", "auth": {"header": {"Authorization": "Bearer k"}},
                         "override": {"endpoint": format!("http://{provider}")}},
            "ai-rate-limiting": conf}},
    ]})
    .to_string()
}

/// Two gateways with the same route spend one budget kept in Redis (`redis`, then
/// `redis-cluster`): what one spent, the other sees.
#[test]
fn ai_rate_limiting_budget_in_redis_is_shared_by_gateways() {
    use support::redis::{redis_cli, redis_cluster, redis_keys, require_redis, Redis};
    require_redis();
    let p = start_provider();
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let remaining = |gw: &Gateway| {
        let r = chat(gw.addr(), "/shared", &[], &body);
        (
            r.status,
            r.header("x-ai-ratelimit-remaining-ai-proxy-openai")
                .map(str::to_owned),
        )
    };
    let redis = Redis::start(false);
    let nodes = redis_cluster();
    let seeds: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    // The tokens spent so far, read from whichever server holds the counter.
    let spent = |ports: &[u16]| -> Option<u64> {
        ports.iter().find_map(|&port| {
            let key = redis_keys(port, "plugin-ai-rate-limiting:*").pop()?;
            redis_cli(port, &["get", &key]).trim().parse().ok()
        })
    };
    let cluster_ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    for (policy, ports) in [
        (
            json!({"policy": "redis", "redis_host": "127.0.0.1", "redis_port": redis.port}),
            vec![redis.port],
        ),
        (
            json!({"policy": "redis-cluster", "redis_cluster_nodes": seeds,
                   "redis_cluster_name": "ai"}),
            cluster_ports,
        ),
    ] {
        let routes = redis_budget_routes(p.addr, policy.clone());
        let (one, two) = (Gateway::start(&routes), Gateway::start(&routes));
        assert_eq!(remaining(&one), (200, Some("10".into())), "{policy}");
        // The log phase spends the answer's 6 tokens once the answer went.
        poll_until(Duration::from_secs(10), || spent(&ports) == Some(6))
            .expect("the first answer's tokens reach Redis");
        assert_eq!(remaining(&two), (200, Some("4".into())), "{policy}");
        poll_until(Duration::from_secs(10), || spent(&ports) == Some(12))
            .expect("the second answer's tokens reach Redis");
        assert_eq!(remaining(&one), (503, Some("0".into())), "{policy}");
        assert_eq!(remaining(&two), (503, Some("0".into())), "{policy}");
    }
    let keys = redis_keys(redis.port, "plugin-ai-rate-limiting:*");
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(keys[0].ends_with(":ai-rate-limiting#global"), "{keys:?}");
}

/// ai-proxy-multi's `chash` balancer: the instances of a priority on the consistent-hash
/// ring, a request going by its `hash_on: header` key — the same user always to the same
/// instance, the users spread over them; an instance answering 429 falls back along the ring.
#[test]
fn ai_proxy_multi_chash_keeps_a_user_on_one_instance() {
    let p = start_provider();
    let instance = |name: &str, path: &str| {
        json!({"name": name, "provider": "openai", "weight": 1,
               "auth": {"header": {"Authorization": format!("Bearer {name}")}},
               "override": {"endpoint": format!("http://{}/{path}/v1/chat/completions", p.addr)}})
    };
    let routes = json!({"routes": [
        {"id": "h", "uri": "/h", "plugins": {"ai-proxy-multi": {
            "balancer": {"algorithm": "chash", "hash_on": "header", "key": "X-User"},
            "instances": [instance("one", "one"), instance("two", "two"), instance("three", "three")]}}},
        {"id": "f", "uri": "/f", "plugins": {"ai-proxy-multi": {
            "balancer": {"algorithm": "chash", "hash_on": "header", "key": "X-User"},
            "fallback_strategy": ["http_429"],
            "instances": [instance("busy", "limited"), instance("spare", "spare")]}}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let auth_of = |i: usize| -> String {
        let seen = p.seen.lock().unwrap();
        seen[i]
            .1
            .iter()
            .find(|(k, _)| k == "authorization")
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    let mut used = std::collections::BTreeSet::new();
    for user in 0..12 {
        let who = format!("user-{user}");
        let mut first = None;
        for _ in 0..3 {
            let n = p.seen.lock().unwrap().len();
            let r = chat(gw.addr(), "/h", &[("X-User", &who)], &body);
            assert_eq!(r.status, 200, "{}", r.text());
            let auth = auth_of(n);
            assert_eq!(*first.get_or_insert(auth.clone()), auth, "{who} moved");
        }
        used.insert(first.unwrap());
    }
    assert!(used.len() > 1, "every user on one instance: {used:?}");

    // Whoever hashes onto the busy instance is moved on to the spare one.
    for user in 0..6 {
        let who = format!("user-{user}");
        let r = chat(gw.addr(), "/f", &[("X-User", &who)], &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let n = p.seen.lock().unwrap().len();
        assert_eq!(auth_of(n - 1), "Bearer spare");
    }
}
