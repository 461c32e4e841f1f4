//! The listener: real connections, then a graceful stop.

use std::sync::Arc;
use std::time::Duration;

use ferrisix_admin::{serve, AdminApi};
use ferrisix_config::store::memory::MemoryStore;
use ferrisix_plugins::PluginRegistry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::*;

async fn exchange(addr: std::net::SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn serves_and_stops() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let store = Arc::new(MemoryStore::new("/apisix"));
    let api = Arc::new(AdminApi::new(options(), store, PluginRegistry::builtin()));
    let (tx, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(serve(
        listener,
        api,
        ferrisix_net::ConnLimits::default(),
        rx,
    ));

    let body = route("/a").to_string();
    let put = format!(
        "PUT /apisix/admin/routes/1 HTTP/1.1\r\nHost: x\r\nX-API-KEY: {KEY}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let answer = exchange(addr, &put).await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert!(answer.contains("\"key\":\"/apisix/routes/1\""));

    let head = exchange(
        addr,
        "HEAD /apisix/admin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    let get = format!("GET /apisix/admin/routes/1 HTTP/1.1\r\nHost: x\r\nX-API-KEY: {KEY}\r\nConnection: close\r\n\r\n");
    let answer = exchange(addr, &get).await;
    assert!(answer.contains("x-api-version: v3"), "{answer}");
    assert!(answer.contains("\"createdIndex\""));

    tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
    assert!(TcpStream::connect(addr).await.is_err() || exchange(addr, &get).await.is_empty());
}

/// Issue 8, finding 2: the Admin listener closes a connection that sends nothing, or only part
/// of the HTTP/2 preface, at client_header_timeout.
#[tokio::test]
async fn silent_and_half_preface_connections_are_closed() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let store = Arc::new(MemoryStore::new("/apisix"));
    let api = Arc::new(AdminApi::new(options(), store, PluginRegistry::builtin()));
    let (_tx, rx) = tokio::sync::watch::channel(false);
    let limits = ferrisix_net::ConnLimits {
        header_timeout: Duration::from_millis(300),
        ..ferrisix_net::ConnLimits::default()
    };
    tokio::spawn(serve(listener, api, limits, rx));
    for sent in [&b""[..], b"PRI * HTTP/2.0\r\n"] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(sent).await.unwrap();
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
        assert!(read.is_ok(), "still open after 10 s having sent {sent:?}");
        assert!(out.is_empty());
    }
}
