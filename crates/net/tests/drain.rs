//! Draining real hyper connections: a kept-alive HTTP/1.1 connection gets `Connection: close`
//! on its next answer and ends after it; an idle one ends after the grace period; the server's
//! drain finishes when both have.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use ferrisix_net::{ConnLimits, Drain, IDLE_GRACE};
use hyper::service::service_fn;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn serve(listener: TcpListener, drain: Drain) {
    let builder = ferrisix_net::http_builder(&ConnLimits::default());
    loop {
        let (stream, _) = listener.accept().await.unwrap();
        let (io, watch) = ferrisix_net::wrap(stream, &ConnLimits::default());
        let watch = watch.with_drain(&drain);
        let requests = watch.clone();
        let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let in_flight = requests.begin();
            let resp = hyper::Response::new(http_body_util::Full::new(bytes::Bytes::from("ok")));
            let resp = requests.respond(resp, in_flight, req.version());
            async move { Ok::<_, Infallible>(resp) }
        });
        let conn = builder.serve_connection(io, service).into_owned();
        tokio::spawn(async move { watch.serve(conn).await });
    }
}

/// Sends one request and reads one whole answer (the body is two bytes).
async fn exchange(stream: &mut TcpStream) -> String {
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the answer: {got:?}");
        got.extend_from_slice(&buf[..n]);
        if got.ends_with(b"\r\n\r\nok") {
            return String::from_utf8(got).unwrap();
        }
    }
}

async fn closed(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 16];
    matches!(
        tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn keep_alive_connections_end_without_losing_a_request() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let drain = Drain::new();
    tokio::spawn(serve(listener, drain.clone()));

    let mut busy = TcpStream::connect(addr).await.unwrap();
    let mut idle = TcpStream::connect(addr).await.unwrap();
    assert!(!exchange(&mut busy).await.contains("connection: close"));
    assert!(!exchange(&mut idle).await.contains("connection: close"));

    let started = Instant::now();
    drain.start();
    // The busy client's next request is answered, and the answer ends the connection.
    let answer = exchange(&mut busy).await;
    assert!(answer.contains("connection: close"), "{answer}");
    assert!(closed(&mut busy).await);
    // The idle one is closed once it was idle for the grace period, not before.
    assert!(closed(&mut idle).await);
    assert!(started.elapsed() >= IDLE_GRACE - Duration::from_millis(50));
    tokio::time::timeout(Duration::from_secs(10), drain.finished())
        .await
        .expect("every connection ended");
}
