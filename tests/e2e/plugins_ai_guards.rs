//! End-to-end AI guards through the binary: ai-aws-content-moderation against an in-test
//! AWS Comprehend (`DetectToxicContent` over the JSON 1.1 protocol, the SigV4 signature
//! recomputed here from AWS's documented algorithm and refused when it differs),
//! ai-aliyun-content-moderation against an in-test Aliyun text moderation service (the RPC
//! form, its HMAC-SHA1 signature recomputed here, `TextModerationPlus`'s `Data.RiskLevel` and
//! `Advice`), ai-lakera-guard against an in-test Lakera Guard (`/v2/guard`, bearer key,
//! `messages`, `breakdown`, `flagged`), each in front of an in-test LLM that speaks OpenAI's
//! chat completions (the answer echoes the last user message; streamed as
//! `chat.completion.chunk` events, a usage chunk and `data: [DONE]`). Every service flags a
//! text holding `BADWORD`.
use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use ring::{digest, hmac};
use serde_json::{json, Value};
use support::*;

/// One request an in-test service received.
#[derive(Clone, Debug)]
struct Req {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Req {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// An answer: status, content type, body (the body's chunks, sent one by one).
struct Answer {
    status: u16,
    content_type: &'static str,
    chunks: Vec<String>,
}

fn json_answer(status: u16, body: &Value) -> Answer {
    Answer {
        status,
        content_type: "application/json",
        chunks: vec![body.to_string()],
    }
}

type Handler = dyn Fn(&Req) -> Option<Answer> + Send + Sync;

/// A threaded HTTP/1.1 server answering with `handler` (`None`: never answer), keeping
/// what it got.
struct Server {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Req>>>,
}

impl Server {
    fn start(handler: Arc<Handler>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kept = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (handler, kept) = (handler.clone(), kept.clone());
                std::thread::spawn(move || serve(stream, &*handler, &kept));
            }
        });
        Server { addr, seen }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<Req> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve(mut s: TcpStream, handler: &Handler, seen: &Mutex<Vec<Req>>) {
    loop {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p;
            }
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let mut first = lines.next().unwrap_or("").split(' ');
        let method = first.next().unwrap_or("").to_owned();
        let path = first.next().unwrap_or("").to_owned();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let len: usize = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = buf[head_end + 4..].to_vec();
        while body.len() < len {
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => body.extend_from_slice(&chunk[..n]),
            }
        }
        let req = Req {
            method,
            path,
            headers,
            body,
        };
        let answer = handler(&req);
        seen.lock().unwrap().push(req);
        let Some(a) = answer else {
            // A service that hangs: hold the connection until the client gives up.
            let _ = s.read(&mut chunk);
            std::thread::sleep(Duration::from_secs(30));
            return;
        };
        let head = format!(
            "HTTP/1.1 {} X\r\nContent-Type: {}\r\nTransfer-Encoding: chunked\r\n\r\n",
            a.status, a.content_type
        );
        if s.write_all(head.as_bytes()).is_err() {
            return;
        }
        for c in &a.chunks {
            let _ = write!(s, "{:x}\r\n{c}\r\n", c.len());
            let _ = s.flush();
            if a.chunks.len() > 1 {
                // Separate reads for the gateway: each event its own chunk.
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if s.write_all(b"0\r\n\r\n").is_err() {
            return;
        }
    }
}

/// The LLM: OpenAI chat completions; the answer is `echo: <last user message>`.
fn llm() -> Server {
    Server::start(Arc::new(|req: &Req| {
        let body = req.json();
        let last = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_owned();
        if body["stream"] == json!(true) {
            let chunk = |text: &str| {
                format!(
                    "data: {}\n\n",
                    json!({"id": "c1", "object": "chat.completion.chunk", "model": "m",
                           "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
                )
            };
            let mut chunks = vec![chunk("echo: ")];
            for word in last.split_inclusive(' ') {
                chunks.push(chunk(word));
            }
            chunks.push(format!(
                "data: {}\n\n",
                json!({"id": "c1", "object": "chat.completion.chunk", "choices": [],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
            ));
            chunks.push("data: [DONE]\n\n".into());
            return Some(Answer {
                status: 200,
                content_type: "text/event-stream",
                chunks,
            });
        }
        Some(json_answer(
            200,
            &json!({"id": "c1", "object": "chat.completion", "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("echo: {last}")},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}}),
        ))
    }))
}

fn proxy(llm: &Server) -> Value {
    json!({"provider": "openai", "auth": {"header": {"Authorization": "Bearer sk"}},
           "override": {"endpoint": llm.url()}})
}

fn chat(gw: &Gateway, path: &str, text: &str) -> Reply {
    let body = json!({"model": "gpt-x", "messages": [{"role": "user", "content": text}]});
    request(
        gw.addr(),
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
}

fn chat_stream(gw: &Gateway, path: &str, text: &str) -> Reply {
    let body = json!({"model": "gpt-x", "stream": true,
                      "messages": [{"role": "user", "content": text}]});
    request(
        gw.addr(),
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
}

/// The text of a chat answer, or of the refusal in its place.
fn answer_text(r: &Reply) -> String {
    r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// SigV4 as AWS documents it (not the gateway's code): a POST to `/` with no query.
fn sigv4_signature(
    secret: &str,
    headers: &[(String, String)],
    signed: &str,
    body: &[u8],
    amz_date: &str,
    scope: &str,
) -> String {
    let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let mac = |key: &[u8], msg: &[u8]| {
        hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), msg)
            .as_ref()
            .to_vec()
    };
    let mut canonical_headers = String::new();
    for name in signed.split(';') {
        let value = headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_owned())
            .collect::<Vec<_>>()
            .join(",");
        canonical_headers.push_str(&format!("{name}:{value}\n"));
    }
    let canonical = format!(
        "POST\n/\n\n{canonical_headers}\n{signed}\n{}",
        hex(digest::digest(&digest::SHA256, body).as_ref())
    );
    let sts = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex(digest::digest(&digest::SHA256, canonical.as_bytes()).as_ref())
    );
    let mut parts = scope.split('/');
    let (date, region, service) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let k = mac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k = mac(&k, region.as_bytes());
    let k = mac(&k, service.as_bytes());
    let k = mac(&k, b"aws4_request");
    hex(&mac(&k, sts.as_bytes()))
}

/// AWS Comprehend for the key `AKIDCM` / `cm-secret` in `us-east-1`: the signature
/// checked (403 `InvalidSignatureException` otherwise); each segment's `Toxicity` 0.9 with
/// `BADWORD`, else 0.1; a `PROFANITY` label of 0.8 with `profane`. `fail` answers 500.
fn comprehend(fail: bool) -> Server {
    Server::start(Arc::new(move |req: &Req| {
        if fail {
            return Some(json_answer(
                500,
                &json!({"__type": "InternalServerException"}),
            ));
        }
        let deny = |m: &str| {
            Some(json_answer(
                403,
                &json!({"__type": "InvalidSignatureException", "message": m}),
            ))
        };
        if req.method != "POST"
            || req.path != "/"
            || req.header("x-amz-target") != Some("Comprehend_20171127.DetectToxicContent")
            || req.header("content-type") != Some("application/x-amz-json-1.1")
        {
            return Some(json_answer(
                400,
                &json!({"__type": "UnknownOperationException"}),
            ));
        }
        let Some(auth) = req.header("authorization") else {
            return deny("no authorization");
        };
        let field = |name: &str| {
            auth.split([' ', ','])
                .find_map(|p| p.trim().strip_prefix(name))
                .unwrap_or("")
                .to_owned()
        };
        if !auth.starts_with("AWS4-HMAC-SHA256 ") {
            return deny("not SigV4");
        }
        let credential = field("Credential=");
        let Some(scope) = credential.strip_prefix("AKIDCM/") else {
            return deny("unknown access key");
        };
        if !scope.ends_with("/us-east-1/comprehend/aws4_request") {
            return deny("wrong scope");
        }
        let signed = field("SignedHeaders=");
        for must in ["host", "x-amz-date", "x-amz-target"] {
            if !signed.split(';').any(|h| h == must) {
                return deny("a header is not signed");
            }
        }
        let want = sigv4_signature(
            "cm-secret",
            &req.headers,
            &signed,
            &req.body,
            req.header("x-amz-date").unwrap_or(""),
            scope,
        );
        if field("Signature=") != want {
            return deny("signature mismatch");
        }
        let body = req.json();
        assert_eq!(body["LanguageCode"], "en");
        let segments = body["TextSegments"].as_array().cloned().unwrap_or_default();
        assert!(!segments.is_empty() && segments.len() <= 10, "{body}");
        let results: Vec<Value> = segments
            .iter()
            .map(|s| {
                let t = s["Text"].as_str().unwrap_or("");
                assert!(t.len() <= 1024);
                let profanity = if t.contains("profane") { 0.8 } else { 0.05 };
                json!({"Labels": [{"Name": "PROFANITY", "Score": profanity},
                                  {"Name": "INSULT", "Score": 0.01}],
                       "Toxicity": if t.contains("BADWORD") { 0.9 } else { 0.1 }})
            })
            .collect();
        Some(json_answer(200, &json!({ "ResultList": results })))
    }))
}

fn aws_conf(cm: &Server, extra: Value) -> Value {
    let mut conf = json!({"comprehend": {"access_key_id": "AKIDCM", "secret_access_key": "cm-secret",
                                         "region": "us-east-1", "endpoint": cm.url()}});
    for (k, v) in extra.as_object().unwrap() {
        conf[k] = v.clone();
    }
    conf
}

#[test]
fn aws_content_moderation_signs_and_judges_requests() {
    let (model, cm) = (llm(), comprehend(false));
    let down = comprehend(true);
    let hangs = Server::start(Arc::new(|_: &Req| None));
    let routes = json!({"routes": [
        {"id": "a", "uri": "/a", "plugins": {"ai-proxy": proxy(&model),
            "ai-aws-content-moderation": aws_conf(&cm, json!({}))}},
        {"id": "cat", "uri": "/cat", "plugins": {"ai-proxy": proxy(&model),
            "ai-aws-content-moderation": aws_conf(&cm, json!({
                "moderation_categories": {"PROFANITY": 0.5}, "deny_code": 400,
                "request_check_length_limit": 16}))}},
        {"id": "msg", "uri": "/msg", "plugins": {"ai-proxy": proxy(&model),
            "ai-aws-content-moderation": aws_conf(&cm, json!({"deny_message": "not here"}))}},
        {"id": "down", "uri": "/down", "plugins": {"ai-proxy": proxy(&model),
            "ai-aws-content-moderation": aws_conf(&down, json!({}))}},
        {"id": "slow", "uri": "/slow", "plugins": {"ai-proxy": proxy(&model),
            "ai-aws-content-moderation": aws_conf(&hangs, json!({"timeout": 300}))}},
    ]});
    let gw = Gateway::start(&routes.to_string());

    // Clean: the signed call passed Comprehend's check, and the LLM answered.
    let r = chat(&gw, "/a", "hello there");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(answer_text(&r), "echo: hello there");
    let calls = cm.seen();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].json()["TextSegments"],
        json!([{"Text": "hello there"}])
    );
    assert_eq!(model.seen().len(), 1);

    // Toxic: APISIX's refusal, as a chat completion, and the LLM never asked.
    let r = chat(&gw, "/a", "you BADWORD");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let body = r.json();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "gpt-x");
    assert_eq!(answer_text(&r), "request body exceeds toxicity threshold");
    assert_eq!(body["usage"]["total_tokens"], 0);
    assert_eq!(model.seen().len(), 1);

    // A category over its threshold, a long text cut into segments of 16 bytes.
    let r = chat(&gw, "/cat", "profane and a rather long text to be cut");
    assert_eq!(r.status, 400);
    assert_eq!(answer_text(&r), "request body exceeds PROFANITY threshold");
    let last = cm.seen().last().unwrap().json();
    let segs = last["TextSegments"].as_array().unwrap();
    assert_eq!(segs.len(), 3, "{last}");
    assert!(segs.iter().all(|s| s["Text"].as_str().unwrap().len() <= 16));

    let r = chat(&gw, "/msg", "BADWORD");
    assert_eq!(answer_text(&r), "not here");

    // Comprehend failing, or not answering in time: APISIX's 500 with the reason.
    let r = chat(&gw, "/down", "hello");
    assert_eq!(r.status, 500);
    assert_eq!(r.text(), "failed to get moderation results from response");
    let r = chat(&gw, "/slow", "hello");
    assert_eq!(r.status, 500);
    assert_eq!(
        r.text(),
        "failed to send request to http://127.0.0.1: timeout"
    );
    assert_eq!(
        model.seen().len(),
        1,
        "refused requests never reach the LLM"
    );
}

#[test]
fn aws_content_moderation_checks_answers_and_streams() {
    let (model, cm) = (llm(), comprehend(false));
    let down = comprehend(true);
    let resp = json!({"check_request": false, "check_response": true});
    let routes = json!({"routes": [
        {"id": "r", "uri": "/r", "plugins": {"ai-proxy": proxy(&model),
            "ai-aws-content-moderation": aws_conf(&cm, resp.clone())}},
        {"id": "down", "uri": "/down", "plugins": {"ai-proxy": proxy(&model),
            "ai-aws-content-moderation": aws_conf(&down, resp.clone())}},
        {"id": "rt", "uri": "/rt", "plugins": {"ai-proxy": proxy(&model),
            "ai-aws-content-moderation": aws_conf(&cm, json!({"check_request": false,
                "check_response": true, "stream_check_mode": "realtime",
                "stream_check_cache_size": 1}))}},
    ]});
    let gw = Gateway::start(&routes.to_string());

    let r = chat(&gw, "/r", "fine words");
    assert_eq!(answer_text(&r), "echo: fine words");
    let r = chat(&gw, "/r", "say BADWORD");
    assert_eq!(r.status, 200);
    assert_eq!(answer_text(&r), "response body exceeds toxicity threshold");
    assert_eq!(
        r.json()["usage"]["total_tokens"],
        6,
        "the answer's usage in the refusal"
    );
    // The answer has not gone yet: a failing Comprehend fails it closed.
    let r = chat(&gw, "/down", "fine words");
    assert_eq!(r.status, 500);
    assert_eq!(r.text(), "failed to get moderation results from response");

    // final_packet: the stream goes as it comes; its last events carry the verdict.
    let r = chat_stream(&gw, "/r", "say BADWORD now");
    assert_eq!(r.status, 200);
    let text = r.text();
    assert!(text.contains("\"content\":\"BADWORD \""), "{text}");
    assert!(text.contains("\"risk_level\":\"high\""), "{text}");
    assert!(text.contains("data: [DONE]"), "{text}");
    let r = chat_stream(&gw, "/r", "all fine");
    assert!(r.text().contains("\"risk_level\":\"none\""), "{}", r.text());

    // realtime: checked as it goes; the hit replaces the rest of the stream.
    let r = chat_stream(&gw, "/rt", "one BADWORD two three");
    let text = r.text();
    assert!(
        text.contains("\"content\":\"response body exceeds toxicity threshold\""),
        "{text}"
    );
    assert!(!text.contains("three"), "the rest cut off: {text}");
    assert!(text.ends_with("data: [DONE]"), "{text}");
}

/// Aliyun's RPC signature, from its documentation (not the gateway's code).
fn aliyun_signature(secret: &str, params: &[(String, String)]) -> String {
    let enc = |s: &str| {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect::<String>()
    };
    let mut pairs: Vec<String> = params
        .iter()
        .filter(|(k, _)| k != "Signature")
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect();
    pairs.sort();
    let sts = format!("POST&%2F&{}", enc(&pairs.join("&")));
    let key = hmac::Key::new(
        hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        format!("{secret}&").as_bytes(),
    );
    base64::engine::general_purpose::STANDARD.encode(hmac::sign(&key, sts.as_bytes()))
}

fn form_decode(body: &[u8]) -> Vec<(String, String)> {
    let un = |s: &str| {
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
    };
    String::from_utf8_lossy(body)
        .split('&')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (un(k), un(v)))
        .collect()
}

/// Aliyun text moderation for `LTAIid` / `aliyun-secret`: the signature and the RPC
/// parameters checked; `RiskLevel` `high` with an advice for `BADWORD`, `low` for `meh`,
/// else `none`. `fail` answers 500.
fn aliyun(fail: bool) -> Server {
    Server::start(Arc::new(move |req: &Req| {
        if fail {
            return Some(json_answer(500, &json!({"Code": "InternalError"})));
        }
        assert_eq!(req.method, "POST");
        assert_eq!(req.path, "/");
        assert_eq!(
            req.header("content-type"),
            Some("application/x-www-form-urlencoded")
        );
        let params = form_decode(&req.body);
        let get = |k: &str| {
            params
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        if get("Signature") != aliyun_signature("aliyun-secret", &params)
            || get("AccessKeyId") != "LTAIid"
        {
            return Some(json_answer(
                400,
                &json!({"Code": "SignatureDoesNotMatch", "Message": "Specified signature is not matched"}),
            ));
        }
        for (k, v) in [
            ("Action", "TextModerationPlus"),
            ("Format", "JSON"),
            ("RegionId", "cn-shanghai"),
            ("SignatureMethod", "HMAC-SHA1"),
            ("SignatureVersion", "1.0"),
            ("Version", "2022-03-02"),
        ] {
            assert_eq!(get(k), v, "{params:?}");
        }
        let ts = get("Timestamp");
        assert!(
            ts.len() == 20 && ts.ends_with('Z') && ts.as_bytes()[10] == b'T',
            "{ts}"
        );
        assert_eq!(get("SignatureNonce").len(), 36);
        let service = get("Service");
        assert!(
            service == "llm_query_moderation" || service == "llm_response_moderation",
            "{service}"
        );
        let sp: Value = serde_json::from_str(&get("ServiceParameters")).unwrap();
        assert_eq!(sp["sessionId"].as_str().unwrap().len(), 36);
        let content = sp["content"].as_str().unwrap();
        let level = if content.contains("BADWORD") {
            "high"
        } else if content.contains("meh") {
            "low"
        } else {
            "none"
        };
        let mut data = json!({"RiskLevel": level, "Result": []});
        if level == "high" {
            data["Advice"] = json!([{"Answer": "Let us talk about something else."}]);
        }
        Some(json_answer(
            200,
            &json!({"Code": 200, "Data": data, "RequestId": "r1"}),
        ))
    }))
}

fn aliyun_conf(s: &Server, extra: Value) -> Value {
    let mut conf = json!({"endpoint": s.url(), "region_id": "cn-shanghai",
        "access_key_id": "LTAIid", "access_key_secret": "aliyun-secret"});
    for (k, v) in extra.as_object().unwrap() {
        conf[k] = v.clone();
    }
    conf
}

#[test]
fn aliyun_content_moderation_signs_and_judges() {
    let (model, svc, down) = (llm(), aliyun(false), aliyun(true));
    let routes = json!({"routes": [
        {"id": "a", "uri": "/a", "plugins": {"ai-proxy": proxy(&model),
            "ai-aliyun-content-moderation": aliyun_conf(&svc, json!({"check_response": true}))}},
        {"id": "bar", "uri": "/bar", "plugins": {"ai-proxy": proxy(&model),
            "ai-aliyun-content-moderation": aliyun_conf(&svc, json!({"risk_level_bar": "low",
                "deny_code": 403, "deny_message": "blocked", "request_check_length_limit": 5}))}},
        {"id": "down", "uri": "/down", "plugins": {"ai-proxy": proxy(&model),
            "ai-aliyun-content-moderation": aliyun_conf(&down, json!({}))}},
        {"id": "fp", "uri": "/fp", "plugins": {"ai-proxy": proxy(&model),
            "ai-aliyun-content-moderation": aliyun_conf(&svc, json!({"check_request": false,
                "check_response": true}))}},
        {"id": "rt", "uri": "/rt", "plugins": {"ai-proxy": proxy(&model),
            "ai-aliyun-content-moderation": aliyun_conf(&svc, json!({"check_request": false,
                "check_response": true, "stream_check_mode": "realtime",
                "stream_check_cache_size": 1}))}},
    ]});
    let gw = Gateway::start(&routes.to_string());

    let r = chat(&gw, "/a", "hello");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(answer_text(&r), "echo: hello");
    let seen = svc.seen();
    assert_eq!(seen.len(), 2, "the request and the answer checked");
    let session = |r: &Req| {
        let p = form_decode(&r.body);
        let sp = p.iter().find(|(k, _)| k == "ServiceParameters").unwrap();
        serde_json::from_str::<Value>(&sp.1).unwrap()
    };
    assert_eq!(session(&seen[0])["content"], "hello");
    assert_eq!(session(&seen[1])["content"], "echo: hello");
    assert_eq!(
        session(&seen[0])["sessionId"],
        session(&seen[1])["sessionId"],
        "one session per request"
    );

    // A hit: the service's advice as the answer.
    let r = chat(&gw, "/a", "BADWORD");
    assert_eq!(r.status, 200);
    assert_eq!(answer_text(&r), "Let us talk about something else.");
    assert_eq!(model.seen().len(), 1);

    // risk_level_bar low, deny_code, deny_message, the request cut in 5-character pieces.
    let before = svc.seen().len();
    let r = chat(&gw, "/bar", "so so meh");
    assert_eq!(r.status, 403);
    assert_eq!(answer_text(&r), "blocked");
    let pieces: Vec<String> = svc.seen()[before..]
        .iter()
        .map(|r| session(r)["content"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(pieces, ["so so", " meh"]);

    // The service failing lets the content through (APISIX logs it).
    let r = chat(&gw, "/down", "hello");
    assert_eq!(r.status, 200);
    assert_eq!(answer_text(&r), "echo: hello");

    // final_packet: the verdict on the assembled answer in the last events.
    let r = chat_stream(&gw, "/fp", "tell BADWORD things");
    assert_eq!(r.status, 200);
    let text = r.text();
    assert!(text.contains("\"content\":\"BADWORD \""), "{text}");
    assert!(text.contains("\"risk_level\":\"high\""), "{text}");
    // realtime: the hit ends the stream with the refusal.
    let r = chat_stream(&gw, "/rt", "one two BADWORD three four");
    let text = r.text();
    assert!(text.contains("Let us talk about something else."), "{text}");
    assert!(!text.contains("four"), "{text}");
}

/// Lakera Guard for the key `lk-key`: `flagged` for a message holding `BADWORD`, with a
/// breakdown; 401 for another key; `fail` answers 500.
fn lakera(fail: bool) -> Server {
    Server::start(Arc::new(move |req: &Req| {
        if fail {
            return Some(json_answer(500, &json!({"error": "boom"})));
        }
        assert_eq!(req.method, "POST");
        assert_eq!(req.path, "/v2/guard");
        if req.header("authorization") != Some("Bearer lk-key") {
            return Some(json_answer(401, &json!({"error": "Unauthorized"})));
        }
        let body = req.json();
        assert_eq!(body["breakdown"], true);
        let messages = body["messages"].as_array().unwrap();
        let flagged = messages
            .iter()
            .any(|m| m["content"].as_str().unwrap_or("").contains("BADWORD"));
        Some(json_answer(
            200,
            &json!({"flagged": flagged, "metadata": {"request_uuid": "u-1"},
                "breakdown": [
                    {"project_id": "p", "policy_id": "x", "detector_id": "d1",
                     "detector_type": "prompt_attack", "detected": flagged, "result": "l1_confident"},
                    {"detector_type": "moderated_content/hate", "detected": false}]}),
        ))
    }))
}

fn lakera_conf(s: &Server, extra: Value) -> Value {
    let mut conf = json!({"api_key": "lk-key", "lakera_endpoint": format!("{}/v2/guard", s.url())});
    for (k, v) in extra.as_object().unwrap() {
        conf[k] = v.clone();
    }
    conf
}

#[test]
fn lakera_guard_screens_requests() {
    let (model, lk, down) = (llm(), lakera(false), lakera(true));
    let hangs = Server::start(Arc::new(|_: &Req| None));
    let routes = json!({"routes": [
        {"id": "a", "uri": "/a", "plugins": {"ai-proxy": proxy(&model),
            "ai-lakera-guard": lakera_conf(&lk, json!({"project_id": "project-1"}))}},
        {"id": "reveal", "uri": "/reveal", "plugins": {"ai-proxy": proxy(&model),
            "ai-lakera-guard": lakera_conf(&lk, json!({"reveal_failure_categories": true,
                "deny_code": 400, "request_failure_message": "no"}))}},
        {"id": "alert", "uri": "/alert", "plugins": {"ai-proxy": proxy(&model),
            "ai-lakera-guard": lakera_conf(&lk, json!({"action": "alert"}))}},
        {"id": "closed", "uri": "/closed", "plugins": {"ai-proxy": proxy(&model),
            "ai-lakera-guard": lakera_conf(&down, json!({}))}},
        {"id": "open", "uri": "/open", "plugins": {"ai-proxy": proxy(&model),
            "ai-lakera-guard": lakera_conf(&down, json!({"fail_open": true}))}},
        {"id": "slow", "uri": "/slow", "plugins": {"ai-proxy": proxy(&model),
            "ai-lakera-guard": lakera_conf(&hangs, json!({"timeout": 300}))}},
    ]});
    let gw = Gateway::start(&routes.to_string());

    let body = json!({"model": "gpt-x", "messages": [
        {"role": "system", "content": "be kind"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}]});
    let r = request(
        gw.addr(),
        "POST",
        "/a",
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(answer_text(&r), "echo: ");
    let sent = lk.seen()[0].json();
    assert_eq!(
        sent["messages"],
        json!([{"role": "system", "content": "be kind"}, {"role": "user", "content": "hi"}])
    );
    assert_eq!(sent["project_id"], "project-1");

    let r = chat(&gw, "/a", "BADWORD");
    assert_eq!(r.status, 200);
    assert_eq!(answer_text(&r), "Request blocked by Lakera Guard");
    let r = chat(&gw, "/reveal", "BADWORD");
    assert_eq!(r.status, 400);
    assert_eq!(
        answer_text(&r),
        "no. Flagged categories: prompt_attack (l1_confident)"
    );
    // alert: logged, not blocked.
    let r = chat(&gw, "/alert", "BADWORD");
    assert_eq!(answer_text(&r), "echo: BADWORD");
    // Lakera failing or late: closed by default, open with fail_open.
    let r = chat(&gw, "/closed", "hi");
    assert_eq!(answer_text(&r), "Request blocked by Lakera Guard");
    let r = chat(&gw, "/open", "hi");
    assert_eq!(answer_text(&r), "echo: hi");
    let r = chat(&gw, "/slow", "hi");
    assert_eq!(answer_text(&r), "Request blocked by Lakera Guard");
}

#[test]
fn lakera_guard_screens_answers_and_holds_streams() {
    let (model, lk) = (llm(), lakera(false));
    let routes = json!({"routes": [
        {"id": "out", "uri": "/out", "plugins": {"ai-proxy": proxy(&model),
            "ai-lakera-guard": lakera_conf(&lk, json!({"direction": "output"}))}},
    ]});
    let gw = Gateway::start(&routes.to_string());

    let r = chat(&gw, "/out", "fine");
    assert_eq!(answer_text(&r), "echo: fine");
    let r = chat(&gw, "/out", "BADWORD");
    assert_eq!(answer_text(&r), "Response blocked by Lakera Guard");
    let last = lk.seen().last().unwrap().json();
    assert_eq!(
        last["messages"],
        json!([{"role": "assistant", "content": "echo: BADWORD"}])
    );

    // A clean stream is held back (keep-alive comments meanwhile), then released whole.
    let r = chat_stream(&gw, "/out", "all good here");
    let text = r.text();
    assert!(text.starts_with(":\n\n"), "{text}");
    assert!(text.contains("\"content\":\"here\""), "{text}");
    assert!(text.contains("data: [DONE]"), "{text}");
    // A flagged one never shows its text: the refusal instead.
    let r = chat_stream(&gw, "/out", "some BADWORD here");
    let text = r.text();
    assert!(!text.contains("\"content\":\"BADWORD \""), "{text}");
    assert!(
        text.contains("\"content\":\"Response blocked by Lakera Guard\""),
        "{text}"
    );
}

#[test]
fn guards_without_ai_proxy_follow_fail_mode() {
    let (model, lk, cm) = (llm(), lakera(false), comprehend(false));
    let mut nodes = serde_json::Map::new();
    nodes.insert(model.addr.to_string(), json!(1));
    let upstream = json!({"type": "roundrobin", "nodes": nodes});
    let routes = json!({"routes": [
        {"id": "e", "uri": "/e", "upstream": upstream, "plugins": {
            "ai-lakera-guard": lakera_conf(&lk, json!({"fail_mode": "error"}))}},
        {"id": "s", "uri": "/s", "upstream": upstream, "plugins": {
            "ai-aws-content-moderation": aws_conf(&cm, json!({}))}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    let r = chat(&gw, "/e", "hi");
    assert_eq!(r.status, 500);
    assert_eq!(
        r.text(),
        "no ai instance picked, ai-lakera-guard plugin must be used with ai-proxy or ai-proxy-multi plugin"
    );
    // skip: the request goes to the upstream unchecked.
    let r = chat(&gw, "/s", "BADWORD");
    assert_eq!(r.status, 200);
    assert_eq!(answer_text(&r), "echo: BADWORD");
    assert!(cm.seen().is_empty() && lk.seen().is_empty());
}

#[test]
fn refusals_speak_the_clients_protocol() {
    let (model, lk) = (llm(), lakera(false));
    let routes = json!({"routes": [
        {"id": "in", "uri": "/in/v1/messages", "plugins": {"ai-proxy": proxy(&model),
            "ai-lakera-guard": lakera_conf(&lk, json!({}))}},
        {"id": "out", "uri": "/out/v1/messages", "plugins": {"ai-proxy": proxy(&model),
            "ai-lakera-guard": lakera_conf(&lk, json!({"direction": "output"}))}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    let send = |path: &str, text: &str, stream: bool| {
        let body = json!({"model": "claude-x", "max_tokens": 16, "stream": stream,
                          "system": "be brief",
                          "messages": [{"role": "user", "content": text}]});
        request(
            gw.addr(),
            "POST",
            path,
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        )
    };
    // Anthropic Messages in: the system prompt screened with its role, the refusal a message.
    let r = send("/in/v1/messages", "BADWORD", false);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let a = r.json();
    assert_eq!(a["type"], "message");
    assert_eq!(a["model"], "claude-x");
    assert_eq!(
        a["content"],
        json!([{"type": "text", "text": "Request blocked by Lakera Guard"}])
    );
    assert_eq!(a["usage"], json!({"input_tokens": 0, "output_tokens": 0}));
    assert_eq!(
        lk.seen()[0].json()["messages"][0],
        json!({"role": "system", "content": "be brief"})
    );
    let r = send("/in/v1/messages", "BADWORD", true);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let text = r.text();
    assert!(text.starts_with("event: message_start\n"), "{text}");
    assert!(
        text.contains("\"text\":\"Request blocked by Lakera Guard\""),
        "{text}"
    );
    assert!(
        text.ends_with("event: message_stop\ndata: {}\n\n"),
        "{text}"
    );
    assert!(model.seen().is_empty());

    // The answer, converted back from the OpenAI provider, refused in Anthropic's shape with
    // its usage.
    let r = send("/out/v1/messages", "fine", false);
    assert_eq!(r.json()["content"][0]["text"], "echo: fine");
    let r = send("/out/v1/messages", "say BADWORD", false);
    let a = r.json();
    assert_eq!(a["content"][0]["text"], "Response blocked by Lakera Guard");
    assert_eq!(a["usage"], json!({"input_tokens": 4, "output_tokens": 2}));
}

#[test]
fn the_risk_level_reaches_the_loggers() {
    let (model, svc) = (llm(), aliyun(false));
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("risk.log");
    let routes = json!({"routes": [
        {"id": "a", "uri": "/a", "plugins": {"ai-proxy": proxy(&model),
            "ai-aliyun-content-moderation": aliyun_conf(&svc, json!({})),
            "file-logger": {"path": log.to_str().unwrap(),
                            "log_format": {"uri": "$uri", "risk": "$llm_content_risk_level"}}}},
    ]});
    let gw = Gateway::start(&routes.to_string());
    for text in ["hello", "so meh", "BADWORD"] {
        assert_eq!(chat(&gw, "/a", text).status, 200);
    }
    let mut text = String::new();
    poll_until(Duration::from_secs(10), || {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines().count() >= 3
    })
    .unwrap_or_else(|| panic!("three log lines: {text}"));
    let risks: Vec<String> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["risk"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(risks, ["none", "low", "high"]);
}
