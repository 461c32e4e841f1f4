//! End-to-end opentelemetry through the binary, against an OTLP/HTTP receiver decoding the
//! protobuf export: the span continues the client's trace, the upstream is sent the
//! request's own context, and the span carries APISIX's attributes and the request's timing.
use crate::support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;
use support::*;

/// Decodes every `POST /v1/traces` it gets and hands the spans over.
fn receiver() -> (String, mpsc::Receiver<Span>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 16384];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match s.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                    assert!(head.starts_with("post /v1/traces "), "{head}");
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    while buf.len() < end + 4 + len {
                        match s.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body: Vec<u8> = buf.drain(..end + 4 + len).skip(end + 4).collect();
                    let export = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
                    for rs in export.resource_spans {
                        for ss in rs.scope_spans {
                            for span in ss.spans {
                                let _ = tx.send(span);
                            }
                        }
                    }
                    if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (addr, rx)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

#[test]
fn spans_continue_the_client_trace_and_reach_the_collector() {
    let (collector, spans) = receiver();
    let up = Upstream::start("u", Behaviour::Delay(Duration::from_millis(30)));
    let routes = json!({"routes": [{"id": "ot1", "uri": "/traced/*", "plugins": {"opentelemetry": {
        "sampler": {"name": "always_on"}, "additional_attributes": ["arg_k"]}},
        "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}]});
    let extra = format!(
        "plugin_attr:\n  prometheus:\n    export_addr:\n      ip: 127.0.0.1\n      port: {}\n  opentelemetry:\n    collector:\n      address: {collector}\n    batch_span_processor:\n      max_export_batch_size: 1\n",
        free_port()
    );
    let gw = Gateway::start_with(&routes.to_string(), &extra);
    let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let before = now_ns();
    let r = request(
        gw.addr(),
        "GET",
        "/traced/a?k=v",
        &[("traceparent", parent), ("User-Agent", "e2e")],
        b"",
    );
    let after = now_ns();
    assert_eq!(r.status, 200);
    let sent = r.json()["headers"]["traceparent"]
        .as_str()
        .expect("the upstream got a traceparent")
        .to_owned();
    let span = spans
        .recv_timeout(Duration::from_secs(10))
        .expect("a span at the collector");
    assert_eq!(hex(&span.trace_id), "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(hex(&span.parent_span_id), "b7ad6b7169203331");
    assert_eq!(
        sent,
        format!(
            "00-0af7651916cd43dd8448eb211c80319c-{}-01",
            hex(&span.span_id)
        )
    );
    assert_eq!(span.name, "GET /traced/*");
    assert!(before <= span.start_time_unix_nano && span.end_time_unix_nano <= after);
    // The upstream took 30 ms.
    assert!(span.end_time_unix_nano - span.start_time_unix_nano >= 30_000_000);
    let attr = |k: &str| {
        span.attributes
            .iter()
            .find(|a| a.key == k)
            .and_then(|a| a.value.clone()?.value)
    };
    let s = |v: &str| Some(AnyValue::StringValue(v.into()));
    assert_eq!(attr("apisix.route_id"), s("ot1"));
    assert_eq!(attr("http.route"), s("/traced/*"));
    assert_eq!(attr("url.path"), s("/traced/a"));
    assert_eq!(attr("user_agent.original"), s("e2e"));
    assert_eq!(attr("apisix.response_source"), s("upstream"));
    assert_eq!(attr("http.status_code"), Some(AnyValue::IntValue(200)));
    assert_eq!(attr("arg_k"), s("v"));
    assert!(span.status.is_none());
}
