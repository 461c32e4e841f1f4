//! grpc-transcode and grpc-web end to end. grpc-transcode: protos written through the Admin API
//! (text, a base64 descriptor set, one importing another), routes calling a real tonic gRPC
//! server (h2c) with JSON and query arguments, and the answers: decoded replies under
//! `pb_option`s, grpc-status mapped to HTTP, `show_status_in_body` with `status_detail_type`,
//! deadlines, refusals. grpc-web: a client following grpc's PROTOCOL-WEB.md, binary and text,
//! against the same server.
//!
//! The server is tonic's (its server, framing, deadlines and `grpc-status-details-bin`), with
//! services written by hand over the raw-bytes codec of `grpc.rs` and prost messages, so no
//! code generation is needed.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use prost::Message;
use serde_json::{json, Value};
use tonic::codegen::{BoxFuture, Context, Poll, Service};
use tonic::{Code, Status};

use crate::grpc::Raw;
use crate::support::{self, Reply, StoreGateway, StoreGatewayBuilder};

#[derive(Clone, PartialEq, Message)]
struct Person {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(int32, tag = "2")]
    age: i32,
}

#[derive(Clone, PartialEq, Message)]
struct HelloRequest {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, repeated, tag = "2")]
    items: Vec<String>,
    #[prost(int32, tag = "3")]
    gender: i32,
    #[prost(message, optional, tag = "4")]
    person: Option<Person>,
}

#[derive(Clone, PartialEq, Message)]
struct HelloReply {
    #[prost(string, tag = "1")]
    message: String,
    #[prost(string, repeated, tag = "2")]
    items: Vec<String>,
    #[prost(int32, tag = "3")]
    gender: i32,
}

#[derive(Clone, PartialEq, Message)]
struct PlusRequest {
    #[prost(int64, tag = "1")]
    a: i64,
    #[prost(int64, tag = "2")]
    b: i64,
}

#[derive(Clone, PartialEq, Message)]
struct PlusReply {
    #[prost(int64, tag = "1")]
    result: i64,
}

#[derive(Clone, PartialEq, Message)]
struct ErrorDetail {
    #[prost(int64, tag = "1")]
    code: i64,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(string, tag = "3")]
    r#type: String,
}

#[derive(Clone, PartialEq, Message)]
struct AnyMsg {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<AnyMsg>,
}

#[derive(Clone, PartialEq, Message)]
struct User {
    #[prost(string, tag = "1")]
    name: String,
}

#[derive(Clone, PartialEq, Message)]
struct ImportRequest {
    #[prost(message, optional, tag = "1")]
    user: Option<User>,
    #[prost(string, tag = "2")]
    body: String,
}

#[derive(Clone, PartialEq, Message)]
struct ImportResponse {
    #[prost(string, tag = "1")]
    body: String,
}

const HELLO_PROTO: &str = r#"syntax = "proto3";
package helloworld;
service Greeter {
  rpc SayHello (HelloRequest) returns (HelloReply) {}
  rpc Plus (PlusRequest) returns (PlusReply) {}
  rpc GetErrResp (HelloRequest) returns (HelloReply) {}
  rpc Slow (HelloRequest) returns (HelloReply) {}
}
enum Gender { GENDER_UNKNOWN = 0; GENDER_MALE = 1; GENDER_FEMALE = 2; }
message Person { string name = 1; int32 age = 2; }
message HelloRequest { string name = 1; repeated string items = 2; Gender gender = 3; Person person = 4; }
message HelloReply { string message = 1; repeated string items = 2; Gender gender = 3; }
message PlusRequest { int64 a = 1; int64 b = 2; }
message PlusReply { int64 result = 1; }
message ErrorDetail { int64 code = 1; string message = 2; string type = 3; }
"#;

/// Imports `proto/import.proto` (APISIX's t/grpc_server_example layout), the proto `import`.
const SRC_PROTO: &str = r#"syntax = "proto3";
package helloworld;
import "proto/import.proto";
service TestImport { rpc Run (Request) returns (pkg.Response) {} }
message Request { pkg.User user = 1; string body = 2; }
"#;

const IMPORT_PROTO: &str = r#"syntax = "proto3";
package pkg;
message User { string name = 1; }
message Response { string body = 1; }
"#;

fn decode<M: Message + Default>(b: &Bytes) -> Result<M, Status> {
    M::decode(b.as_ref()).map_err(|e| Status::invalid_argument(e.to_string()))
}

async fn answer(path: &str, req: tonic::Request<Bytes>) -> Result<tonic::Response<Bytes>, Status> {
    let msg = req.into_inner();
    let reply = match path {
        "/helloworld.Greeter/SayHello" => {
            let r: HelloRequest = decode(&msg)?;
            let mut text = format!("Hello {}", r.name);
            if let Some(p) = r.person {
                text.push_str(&format!(", name: {}", p.name));
                if p.age > 0 {
                    text.push_str(&format!(", age: {}", p.age));
                }
            }
            HelloReply {
                message: text,
                items: r.items,
                gender: r.gender,
            }
            .encode_to_vec()
        }
        "/helloworld.Greeter/Plus" => {
            let r: PlusRequest = decode(&msg)?;
            PlusReply { result: r.a + r.b }.encode_to_vec()
        }
        "/helloworld.Greeter/GetErrResp" => {
            let detail = ErrorDetail {
                code: 1,
                message: "The server is out of service".into(),
                r#type: "service".into(),
            };
            let status = RpcStatus {
                code: Code::Unavailable as i32,
                message: "Out of service".into(),
                details: vec![AnyMsg {
                    type_url: "type.googleapis.com/helloworld.ErrorDetail".into(),
                    value: detail.encode_to_vec(),
                }],
            };
            return Err(Status::with_details(
                Code::Unavailable,
                "Out of service",
                Bytes::from(status.encode_to_vec()),
            ));
        }
        "/helloworld.Greeter/Slow" => {
            tokio::time::sleep(Duration::from_secs(3)).await;
            HelloReply::default().encode_to_vec()
        }
        "/helloworld.TestImport/Run" => {
            let r: ImportRequest = decode(&msg)?;
            let name = r.user.map(|u| u.name).unwrap_or_default();
            ImportResponse {
                body: format!("Hello {name}, {}", r.body),
            }
            .encode_to_vec()
        }
        _ => return Err(Status::unimplemented("no such method")),
    };
    Ok(tonic::Response::new(Bytes::from(reply)))
}

/// One call, answered by [`answer`].
struct Call(String);

impl tonic::server::UnaryService<Bytes> for Call {
    type Response = Bytes;
    type Future = BoxFuture<tonic::Response<Bytes>, Status>;
    fn call(&mut self, req: tonic::Request<Bytes>) -> Self::Future {
        let path = std::mem::take(&mut self.0);
        Box::pin(async move { answer(&path, req).await })
    }
}

macro_rules! service {
    ($ty:ident, $name:literal) => {
        #[derive(Clone)]
        struct $ty;

        impl tonic::server::NamedService for $ty {
            const NAME: &'static str = $name;
        }

        impl Service<http::Request<tonic::body::Body>> for $ty {
            type Response = http::Response<tonic::body::Body>;
            type Error = Infallible;
            type Future = BoxFuture<Self::Response, Infallible>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
                let path = req.uri().path().to_owned();
                Box::pin(async move {
                    let mut grpc = tonic::server::Grpc::new(Raw);
                    Ok(grpc.unary(Call(path), req).await)
                })
            }
        }
    };
}

service!(Greeter, "helloworld.Greeter");
service!(TestImport, "helloworld.TestImport");

/// Starts the tonic server (h2c) on a random port, on its own runtime thread.
fn start_server() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let incoming = futures_util::stream::unfold(listener, |l| async move {
                let conn = l.accept().await.map(|(s, _)| s);
                Some((conn, l))
            });
            tonic::transport::Server::builder()
                .add_service(Greeter)
                .add_service(TestImport)
                .serve_with_incoming(incoming)
                .await
                .unwrap();
        });
    });
    addr
}

fn put(gw: &StoreGateway, path: &str, body: &Value) -> Reply {
    gw.admin("PUT", &format!("/apisix/admin/{path}"), &body.to_string())
}

fn route(gw: &StoreGateway, id: &str, uri: &str, plugin: Value, server: SocketAddr) {
    let r = json!({
        "uri": uri,
        "plugins": {"grpc-transcode": plugin},
        "upstream": {"scheme": "grpc", "type": "roundrobin", "nodes": {server.to_string(): 1}}
    });
    gw.put_route(id, &r);
}

/// The answer to `method path` once it is no longer the 404 of a route not yet served.
fn call(gw: &StoreGateway, method: &str, path: &str, json_body: Option<&str>) -> Reply {
    let headers: &[(&str, &str)] = if json_body.is_some() {
        &[("Content-Type", "application/json")]
    } else {
        &[]
    };
    let body = json_body.unwrap_or_default().as_bytes();
    let mut reply = None;
    support::poll_until(Duration::from_secs(10), || {
        let r = support::request(gw.data_addr(), method, path, headers, body);
        let served = r.status != 404;
        reply = Some(r);
        served
    });
    reply.unwrap()
}

fn body_json(r: &Reply) -> Value {
    serde_json::from_str(&r.text()).unwrap_or_else(|e| panic!("{e}: {} {}", r.status, r.text()))
}

#[test]
fn transcodes_unary_calls_with_options_errors_and_deadlines() {
    let server = start_server();
    let gw = StoreGatewayBuilder::embedded().start();

    // A syntax error is refused with the compiler's message and place.
    let bad = put(
        &gw,
        "protos/bad",
        &json!({"content": "syntax = \"proto3\";\nmessage A {\n  string x = ;\n}"}),
    );
    assert_eq!(bad.status, 400, "{}", bad.text());
    let msg = body_json(&bad)["error_msg"].as_str().unwrap().to_owned();
    assert!(msg.starts_with("invalid content: bad.proto:3:"), "{msg}");

    let ok = put(&gw, "protos/hello", &json!({"content": HELLO_PROTO}));
    assert!(matches!(ok.status, 200 | 201), "{}", ok.text());

    let hello = |method: &str| json!({"proto_id": "hello", "service": "helloworld.Greeter", "method": method});
    route(&gw, "say", "/hello", hello("SayHello"), server);

    // Query arguments, defaults filled in (proto3, auto_default_values).
    let r = call(&gw, "GET", "/hello?name=world", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        body_json(&r),
        json!({"message": "Hello world", "items": [], "gender": "GENDER_UNKNOWN"})
    );
    // A JSON body: a nested message, a list and an enum by name.
    let r = call(
        &gw,
        "POST",
        "/hello",
        Some(
            r#"{"name":"world","person":{"name":"Joe","age":1},"items":["a","b"],"gender":"GENDER_FEMALE"}"#,
        ),
    );
    assert_eq!(
        body_json(&r),
        json!({"message": "Hello world, name: Joe, age: 1", "items": ["a", "b"], "gender": "GENDER_FEMALE"})
    );
    // An enum by number; a form body.
    let r = call(&gw, "POST", "/hello", Some(r#"{"name":"x","gender":1}"#));
    assert_eq!(body_json(&r)["gender"], "GENDER_MALE");
    let r = support::request(
        gw.data_addr(),
        "POST",
        "/hello",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        b"name=form",
    );
    assert_eq!(body_json(&r)["message"], "Hello form");
    // A body that is not JSON: APISIX reads the POST's form arguments instead (none here),
    // so the call goes out with an empty message.
    let r = call(&gw, "POST", "/hello?name=ignored", Some("{not json"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(body_json(&r)["message"], "Hello ");
    // A value that does not encode: 400.
    let r = call(&gw, "POST", "/hello", Some(r#"{"gender":"GENDER_MA"}"#));
    assert_eq!(r.status, 400, "{}", r.text());

    // pb_option: int64 forms, enums as values, no default values.
    let mut plus = hello("Plus");
    plus["pb_option"] = json!(["int64_as_string", "enum_as_name"]);
    route(&gw, "plus", "/plus", plus, server);
    let r = call(&gw, "GET", "/plus?a=1&b=2", None);
    assert_eq!(body_json(&r), json!({"result": 3}));
    let r = call(&gw, "GET", "/plus?a=1&b=2251799813685260", None);
    assert_eq!(body_json(&r), json!({"result": "#2251799813685261"}));
    let mut hex = hello("Plus");
    hex["pb_option"] = json!(["int64_as_hexstring"]);
    route(&gw, "hex", "/hex", hex, server);
    let r = call(&gw, "GET", "/hex?a=1&b=2251799813685260", None);
    assert_eq!(body_json(&r), json!({"result": "#0x800000000000D"}));
    let mut plain = hello("SayHello");
    plain["pb_option"] = json!(["enum_as_value", "no_default_values"]);
    route(&gw, "plain", "/plain", plain, server);
    let r = call(
        &gw,
        "POST",
        "/plain",
        Some(r#"{"name":"v","gender":"GENDER_MALE"}"#),
    );
    assert_eq!(body_json(&r), json!({"message": "Hello v", "gender": 1}));

    // gRPC errors: the status mapped, the body as the upstream left it (empty) ...
    route(&gw, "err", "/err", hello("GetErrResp"), server);
    let r = call(&gw, "GET", "/err?name=world", None);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("grpc-status"), Some("14"));
    assert!(r.header("grpc-status-details-bin").is_some());
    assert_eq!(r.text(), "");
    // ... or the status details in the body, raw or decoded as `status_detail_type`.
    let mut shown = hello("GetErrResp");
    shown["show_status_in_body"] = json!(true);
    route(&gw, "err2", "/err2", shown.clone(), server);
    let r = call(&gw, "GET", "/err2?name=world", None);
    assert_eq!(r.status, 503);
    assert_eq!(
        body_json(&r),
        json!({"error": {"code": 14, "message": "Out of service", "details": [{
            "type_url": "type.googleapis.com/helloworld.ErrorDetail",
            "value": "\u{8}\u{1}\u{12}\u{1c}The server is out of service\u{1a}\u{7}service"}]}})
    );
    shown["status_detail_type"] = json!("helloworld.ErrorDetail");
    route(&gw, "err3", "/err3", shown.clone(), server);
    let r = call(&gw, "GET", "/err3?name=world", None);
    assert_eq!(
        body_json(&r)["error"]["details"],
        json!([{"code": 1, "message": "The server is out of service", "type": "service"}])
    );
    shown["status_detail_type"] = json!("helloworld.error");
    route(&gw, "err4", "/err4", shown, server);
    let r = call(&gw, "GET", "/err4?name=world", None);
    assert_eq!(r.status, 503);
    assert_eq!(
        r.text(),
        "failed to call pb.decode to decode details in grpc-status-details-bin"
    );

    // A deadline shorter than the call: 504. A method the proto lacks: 503.
    let mut slow = hello("Slow");
    slow["deadline"] = json!(300);
    route(&gw, "slow", "/slow", slow, server);
    let r = call(&gw, "GET", "/slow", None);
    assert_eq!(r.status, 504, "{}", r.text());
    route(&gw, "nope", "/nope", hello("Nope"), server);
    let r = call(&gw, "GET", "/nope", None);
    assert_eq!(r.status, 503, "{}", r.text());

    // A base64 descriptor set serves as the text does.
    let pool = ferrisix_config::proto::compile("set", HELLO_PROTO, &Default::default()).unwrap();
    let set = base64::engine::general_purpose::STANDARD.encode(pool.encode_to_vec());
    let ok = put(&gw, "protos/set", &json!({"content": set}));
    assert!(matches!(ok.status, 200 | 201), "{}", ok.text());
    let mut from_set = hello("SayHello");
    from_set["proto_id"] = json!("set");
    route(&gw, "set", "/set", from_set, server);
    let r = call(&gw, "GET", "/set?name=pb", None);
    assert_eq!(body_json(&r)["message"], "Hello pb");
}

#[test]
fn imports_resolve_between_protos_and_changes_recompile() {
    let server = start_server();
    let gw = StoreGatewayBuilder::embedded().start();
    // The importing proto first: accepted, held back alone while its import is missing.
    let ok = put(&gw, "protos/src", &json!({"content": SRC_PROTO}));
    assert!(matches!(ok.status, 200 | 201), "{}", ok.text());
    let ok = put(&gw, "protos/hello", &json!({"content": HELLO_PROTO}));
    assert!(matches!(ok.status, 200 | 201), "{}", ok.text());
    route(
        &gw,
        "run",
        "/run",
        json!({"proto_id": "src", "service": "helloworld.TestImport", "method": "Run"}),
        server,
    );
    route(
        &gw,
        "say",
        "/hello",
        json!({"proto_id": "hello", "service": "helloworld.Greeter", "method": "SayHello"}),
        server,
    );
    let r = call(&gw, "GET", "/hello?name=a", None);
    assert_eq!(
        body_json(&r)["message"],
        "Hello a",
        "the other protos serve"
    );
    let quarantined = || -> Vec<Value> {
        let report = support::get(gw.control_addr(), "/v1/config").json();
        report["quarantined"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let held = quarantined();
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0]["kind"], "protos");
    assert_eq!(held[0]["id"], "src");
    assert!(
        held[0]["error"]
            .as_str()
            .unwrap()
            .contains("proto/import.proto"),
        "{held:?}"
    );
    // The route using it is not transcoded: the request goes on as it came (APISIX's
    // behaviour when its proto cannot be loaded), which the gRPC server does not answer 200.
    let r = call(
        &gw,
        "POST",
        "/run",
        Some(r#"{"user":{"name":"u"},"body":"b"}"#),
    );
    assert_ne!(r.status, 200, "{}", r.text());

    // The import arrives (by the id `import`): the proto compiles and the route, unchanged,
    // is compiled again against it.
    let ok = put(&gw, "protos/import", &json!({"content": IMPORT_PROTO}));
    assert!(matches!(ok.status, 200 | 201), "{}", ok.text());
    let mut last = None;
    let served = support::poll_until(Duration::from_secs(10), || {
        let r = support::request(
            gw.data_addr(),
            "POST",
            "/run",
            &[("Content-Type", "application/json")],
            br#"{"user":{"name":"u"},"body":"b"}"#,
        );
        let ok = r.status == 200;
        last = Some(r);
        ok
    });
    let r = last.unwrap();
    assert!(served.is_some(), "{} {}", r.status, r.text());
    assert_eq!(body_json(&r), json!({"body": "Hello u, b"}));
    assert!(quarantined().is_empty());

    // A proto that changes recompiles its routes: the method gone, 503.
    let without = HELLO_PROTO.replace(
        "  rpc SayHello (HelloRequest) returns (HelloReply) {}\n",
        "",
    );
    let ok = put(&gw, "protos/hello", &json!({"content": without}));
    assert!(matches!(ok.status, 200 | 201), "{}", ok.text());
    let gone = support::poll_until(Duration::from_secs(10), || {
        support::get(gw.data_addr(), "/hello?name=a").status == 503
    });
    assert!(gone.is_some(), "the route follows its proto");
}

/// gRPC-Web frames of an answer body: `(flag, payload)` in order.
fn web_frames(mut body: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    while body.len() >= 5 {
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        assert!(body.len() >= 5 + len, "a whole frame: {body:?}");
        out.push((body[0], body[5..5 + len].to_vec()));
        body = &body[5 + len..];
    }
    assert!(body.is_empty(), "no bytes after the last frame");
    out
}

fn grpc_frame(msg: &[u8]) -> Vec<u8> {
    let mut b = vec![0];
    b.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    b.extend_from_slice(msg);
    b
}

/// A gRPC-Web client as grpc's PROTOCOL-WEB.md has it: the request as one message frame, the
/// answer as message frames then a trailer frame (flag 0x80), base64 for the text forms.
#[test]
fn grpc_web_binary_and_text_calls() {
    let server = start_server();
    let gw = StoreGatewayBuilder::embedded().start();
    gw.put_route(
        "web",
        &json!({
            "uri": "/grpc/web/*",
            "plugins": {"grpc-web": {}},
            "upstream": {"scheme": "grpc", "type": "roundrobin", "nodes": {server.to_string(): 1}}
        }),
    );
    let b64 = base64::engine::general_purpose::STANDARD;
    let hello = HelloRequest {
        name: "web".into(),
        ..HelloRequest::default()
    }
    .encode_to_vec();
    let post = |ct: &str, path: &str, body: &[u8]| {
        let mut reply = None;
        support::poll_until(Duration::from_secs(10), || {
            let r = support::request(gw.data_addr(), "POST", path, &[("Content-Type", ct)], body);
            let served = r.status != 404;
            reply = Some(r);
            served
        });
        reply.unwrap()
    };

    for ct in ["application/grpc-web", "application/grpc-web+proto"] {
        let r = post(
            ct,
            "/grpc/web/helloworld.Greeter/SayHello",
            &grpc_frame(&hello),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("content-type"), Some(ct));
        assert_eq!(r.header("access-control-allow-origin"), Some("*"));
        assert_eq!(
            r.header("access-control-expose-headers"),
            Some("grpc-message,grpc-status")
        );
        let frames = web_frames(&r.body);
        assert_eq!(frames.len(), 2, "{frames:?}");
        assert_eq!(frames[0].0, 0);
        let reply = HelloReply::decode(frames[0].1.as_slice()).unwrap();
        assert_eq!(reply.message, "Hello web");
        assert_eq!(frames[1].0, 0x80);
        assert_eq!(frames[1].1, b"grpc-status:0\r\ngrpc-message:\r\n");
    }
    for ct in [
        "application/grpc-web-text",
        "application/grpc-web-text+proto",
    ] {
        let body = b64.encode(grpc_frame(&hello));
        let r = post(ct, "/grpc/web/helloworld.Greeter/SayHello", body.as_bytes());
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("content-type"), Some(ct));
        let raw = b64.decode(r.text().trim()).unwrap();
        let frames = web_frames(&raw);
        let reply = HelloReply::decode(frames[0].1.as_slice()).unwrap();
        assert_eq!(reply.message, "Hello web");
        assert_eq!(
            frames[1],
            (0x80, b"grpc-status:0\r\ngrpc-message:\r\n".to_vec())
        );
    }
    // A gRPC error without a message (trailers-only): the status in the head, no trailer frame.
    let r = post(
        "application/grpc-web+proto",
        "/grpc/web/helloworld.Greeter/GetErrResp",
        &grpc_frame(&hello),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("grpc-status"), Some("14"));
    // gRPC percent-encodes the message.
    assert_eq!(r.header("grpc-message"), Some("Out%20of%20service"));
    assert!(r.body.is_empty(), "{:?}", r.body);

    // The preflight, other methods, other content types.
    let r = support::request(gw.data_addr(), "OPTIONS", "/grpc/web/x", &[], b"");
    assert_eq!(r.status, 204);
    assert_eq!(r.header("access-control-allow-methods"), Some("POST"));
    assert_eq!(
        r.header("access-control-allow-headers"),
        Some("content-type,x-grpc-web,x-user-agent")
    );
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    let r = support::request(gw.data_addr(), "GET", "/grpc/web/x", &[], b"");
    assert_eq!(r.status, 405);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    let r = post("application/json", "/grpc/web/x", b"{}");
    assert_eq!(r.status, 400);
    let r = post(
        "application/grpc-web-text",
        "/grpc/web/x",
        b"!!not base64!!",
    );
    assert_eq!(r.status, 400);

    // cors_allow_headers on the preflight.
    gw.put_route(
        "web2",
        &json!({
            "uri": "/grpc/web2/*",
            "plugins": {"grpc-web": {"cors_allow_headers": "grpc-accept-encoding"}},
            "upstream": {"scheme": "grpc", "type": "roundrobin", "nodes": {server.to_string(): 1}}
        }),
    );
    let mut r = None;
    support::poll_until(Duration::from_secs(10), || {
        let x = support::request(gw.data_addr(), "OPTIONS", "/grpc/web2/x", &[], b"");
        let ok = x.status == 204;
        r = Some(x);
        ok
    });
    assert_eq!(
        r.unwrap().header("access-control-allow-headers"),
        Some("grpc-accept-encoding")
    );
}
