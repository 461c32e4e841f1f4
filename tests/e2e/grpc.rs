//! End-to-end gRPC: a tonic client talks h2c to ferrisix, which proxies to a gRPC test
//! upstream (`scheme: grpc`) built on hyper's HTTP/2 server. Messages are raw bytes (a
//! pass-through codec), so no protobuf code generation is needed: the gateway never looks
//! inside messages anyway.

use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use support::Gateway;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Code, Status};

/// Messages as bytes, unchanged (also the codec of `grpc_transcode`'s tonic server).
#[derive(Clone, Copy, Default)]
pub(crate) struct Raw;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// One gRPC message frame: flag byte, big-endian length, payload.
fn frame(msg: &[u8]) -> Bytes {
    let mut b = bytes::BytesMut::with_capacity(5 + msg.len());
    b.put_u8(0);
    b.put_u32(msg.len() as u32);
    b.put_slice(msg);
    b.freeze()
}

fn trailers(status: u32, message: &str) -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", HeaderValue::from(status));
    if !message.is_empty() {
        t.insert("grpc-message", HeaderValue::from_str(message).unwrap());
    }
    t
}

type Frames = Vec<Result<Frame<Bytes>, std::io::Error>>;

/// The test upstream's methods:
/// * `/test.Echo/Unary`: answers the request's message with `echo: ` in front;
/// * `/test.Echo/Stream`: the request names a count N; N messages 20 ms apart;
/// * `/test.Echo/Die`: one message, then the stream breaks (a reset, no trailers);
/// * `/test.Echo/Slow`: answers after 3 s.
async fn upstream_call(
    req: Request<Incoming>,
) -> Result<
    Response<
        StreamBody<futures_util::stream::BoxStream<'static, Result<Frame<Bytes>, std::io::Error>>>,
    >,
    Infallible,
> {
    use futures_util::StreamExt;
    let path = req.uri().path().to_owned();
    let te = req.headers().get("te").cloned();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let msg = if body.len() >= 5 {
        body.slice(5..)
    } else {
        Bytes::new()
    };
    let head =
        |stream: futures_util::stream::BoxStream<'static, Result<Frame<Bytes>, std::io::Error>>| {
            Response::builder()
                .header("content-type", "application/grpc")
                .header(
                    "x-saw-te",
                    te.clone().unwrap_or(HeaderValue::from_static("none")),
                )
                .body(StreamBody::new(stream))
                .unwrap()
        };
    let frames: Frames = match path.as_str() {
        "/test.Echo/Unary" => {
            let mut out = b"echo: ".to_vec();
            out.extend_from_slice(&msg);
            vec![
                Ok(Frame::data(frame(&out))),
                Ok(Frame::trailers(trailers(0, ""))),
            ]
        }
        "/test.Echo/Stream" => {
            let n: usize = std::str::from_utf8(&msg)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(1);
            let s = futures_util::stream::iter(0..n)
                .then(|i| async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok(Frame::data(frame(format!("part {i}").as_bytes())))
                })
                .chain(futures_util::stream::iter(vec![Ok(Frame::trailers(
                    trailers(0, ""),
                ))]));
            return Ok(head(s.boxed()));
        }
        "/test.Echo/Die" => {
            let s = futures_util::stream::iter(vec![Ok(Frame::data(frame(b"first")))]).chain(
                futures_util::stream::once(async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Err(std::io::Error::other("upstream died"))
                }),
            );
            return Ok(head(s.boxed()));
        }
        "/test.Echo/Slow" => {
            tokio::time::sleep(Duration::from_secs(3)).await;
            vec![
                Ok(Frame::data(frame(b"late"))),
                Ok(Frame::trailers(trailers(0, ""))),
            ]
        }
        _ => vec![Ok(Frame::trailers(trailers(12, "unknown method")))],
    };
    Ok(head(futures_util::stream::iter(frames).boxed()))
}

/// Starts the gRPC upstream (h2c) on a random port, on its own runtime thread.
fn start_upstream() -> SocketAddr {
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
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http2::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(
                        hyper_util::rt::TokioIo::new(stream),
                        hyper::service::service_fn(upstream_call),
                    )
                    .await;
                });
            }
        });
    });
    addr
}

fn grpc_route(upstream: &str) -> String {
    format!(
        "routes:\n  - id: \"g\"\n    uri: \"/test.Echo/*\"\n    upstream:\n      scheme: grpc\n      type: roundrobin\n      nodes:\n        \"{upstream}\": 1\n"
    )
}

async fn client(gw: SocketAddr) -> tonic::client::Grpc<Channel> {
    let channel = Channel::from_shared(format!("http://{gw}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    tonic::client::Grpc::new(channel)
}

async fn unary(
    grpc: &mut tonic::client::Grpc<Channel>,
    method: &'static str,
    msg: &'static [u8],
    timeout: Option<Duration>,
) -> Result<tonic::Response<Bytes>, Status> {
    grpc.ready().await.unwrap();
    let mut req = tonic::Request::new(Bytes::from_static(msg));
    if let Some(t) = timeout {
        req.set_timeout(t);
    }
    grpc.unary(req, http::uri::PathAndQuery::from_static(method), Raw)
        .await
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn unary_and_streaming_calls_pass_with_trailers() {
    let up = start_upstream();
    let gw = Gateway::start(&grpc_route(&up.to_string()));
    runtime().block_on(async {
        let mut grpc = client(gw.addr()).await;
        let resp = unary(&mut grpc, "/test.Echo/Unary", b"hi", None)
            .await
            .unwrap();
        assert_eq!(resp.get_ref().as_ref(), b"echo: hi");
        // APISIX's @grpc_pass sets TE: trailers towards the upstream.
        assert_eq!(resp.metadata().get("x-saw-te").unwrap(), "trailers");

        grpc.ready().await.unwrap();
        let resp = grpc
            .server_streaming(
                tonic::Request::new(Bytes::from_static(b"5")),
                http::uri::PathAndQuery::from_static("/test.Echo/Stream"),
                Raw,
            )
            .await
            .unwrap();
        let mut stream = resp.into_inner();
        let mut got = Vec::new();
        while let Some(m) = stream.message().await.unwrap() {
            got.push(String::from_utf8(m.to_vec()).unwrap());
        }
        assert_eq!(got, ["part 0", "part 1", "part 2", "part 3", "part 4"]);
        // grpc-status from the upstream's trailers reaches the client.
        let err = unary(&mut grpc, "/test.Echo/Nope", b"", None)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unimplemented);
        assert_eq!(err.message(), "unknown method");
    });
}

#[test]
fn an_upstream_that_dies_mid_stream_fails_the_call() {
    let up = start_upstream();
    let gw = Gateway::start(&grpc_route(&up.to_string()));
    runtime().block_on(async {
        let mut grpc = client(gw.addr()).await;
        grpc.ready().await.unwrap();
        let resp = grpc
            .server_streaming(
                tonic::Request::new(Bytes::new()),
                http::uri::PathAndQuery::from_static("/test.Echo/Die"),
                Raw,
            )
            .await
            .unwrap();
        let mut stream = resp.into_inner();
        assert_eq!(stream.message().await.unwrap().unwrap().as_ref(), b"first");
        let end = stream.message().await;
        assert!(
            end.is_err(),
            "the break reaches the client as an error, not a clean end: {end:?}"
        );
        // The gateway keeps serving.
        let ok = unary(&mut grpc, "/test.Echo/Unary", b"again", None)
            .await
            .unwrap();
        assert_eq!(ok.get_ref().as_ref(), b"echo: again");
    });
}

#[test]
fn gateway_errors_carry_grpc_status_and_deadlines_hold() {
    let up = start_upstream();
    let dead = support::dead_node();
    let gw = Gateway::start(&format!(
        "{}  - id: \"d\"\n    uri: \"/dead.Svc/*\"\n    upstream:\n      scheme: grpc\n      type: roundrobin\n      nodes:\n        \"{dead}\": 1\n",
        grpc_route(&up.to_string())
    ));
    runtime().block_on(async {
        let mut grpc = client(gw.addr()).await;
        let err = unary(&mut grpc, "/dead.Svc/Call", b"", None)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
        // tonic enforces a deadline itself as well, so the gateway's side is checked with a
        // bare HTTP/2 client that sends `grpc-timeout` and waits.
        let started = std::time::Instant::now();
        let stream = tokio::net::TcpStream::connect(gw.addr()).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        let req = Request::post(format!("http://{}/test.Echo/Slow", gw.addr()))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("grpc-timeout", "300m")
            .body(http_body_util::Full::new(frame(b"")))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 504);
        assert_eq!(resp.headers()["grpc-status"], "4", "DEADLINE_EXCEEDED");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the deadline, not the upstream, ended it"
        );
    });
}
