//! End-to-end echo (`t/plugin/echo.t`) through the binary: the body replaced, wrapped
//! before and after (also around a chunked upstream body), and the headers set, with the
//! upstream's length and validators gone.
use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

/// An upstream like APISIX's test server: `/hello` answers `hello world\n` with a length
/// and an ETag, `/hello_chunked` the same in two chunks written apart.
fn start_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve(stream));
        }
    });
    addr
}

fn serve(mut s: TcpStream) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end + 4);
        let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
        let ok = if path == "/hello_chunked" {
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nhello \r\n")
                .and_then(|_| s.flush())
                .and_then(|_| {
                    std::thread::sleep(Duration::from_millis(50));
                    s.write_all(b"6\r\nworld\n\r\n0\r\n\r\n")
                })
        } else {
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 12\r\nETag: \"abc\"\r\n\r\nhello world\n")
        };
        if ok.is_err() {
            return;
        }
    }
}

fn route(id: &str, uri: &str, up: SocketAddr, echo: Value) -> Value {
    json!({"id": id, "uri": uri, "plugins": {"echo": echo},
        "upstream": {"type": "roundrobin", "nodes": {up.to_string(): 1}}})
}

#[test]
fn body_wrapped_replaced_and_headers_set() {
    let up = start_upstream();
    let routes = json!({"routes": [
        route("1", "/hello", up, json!({
            "before_body": "before the body modification ",
            "body": "hello upstream",
            "after_body": " after the body modification.",
            "headers": {"Location": "https://www.iresty.com", "Authorization": "userpass"}})),
        route("2", "/hello_chunked", up, json!({
            "before_body": "before the body modification ",
            "after_body": " after the body modification."})),
        route("3", "/only_before", up, json!({"before_body": "before "})),
    ]});
    let gw = Gateway::start(&routes.to_string());

    let r = get(gw.addr(), "/hello");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.text(),
        "before the body modification hello upstream after the body modification."
    );
    assert_eq!(r.header("Location"), Some("https://www.iresty.com"));
    assert_eq!(r.header("Authorization"), Some("userpass"));
    assert_eq!(
        r.header("ETag"),
        None,
        "the upstream's validator went with its body"
    );

    let r = get(gw.addr(), "/hello_chunked");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.text(),
        "before the body modification hello world\n after the body modification."
    );

    // Content-Length is gone with the upstream's body: the wrapped body is sent in full.
    let r = get(gw.addr(), "/only_before");
    assert_eq!(r.text(), "before hello world\n");
    assert_ne!(r.header("Content-Length"), Some("12"));
}
