//! End-to-end HTTP/2 to plain upstreams (the `ferrisix.http_version: "2"` label): h2c with
//! prior knowledge against an in-test hyper HTTP/2 server that counts its connections and holds
//! answers until a number of requests are in flight at once (so multiplexing is seen, not
//! timed), and h2 over TLS by ALPN against Debian's nginx with `http2` on its TLS listener.

use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use support::{dead_node, get, Gateway};
use tokio::sync::{mpsc, watch};

/// The h2c upstream's state: connections accepted, requests held (`/hold/<n>` answers once
/// `n` of them are in flight).
struct H2c {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

/// What each request on one connection can reach: the connection's number, and a way to make
/// the connection send GOAWAY.
#[derive(Clone)]
struct ConnCtx {
    id: usize,
    held: Arc<watch::Sender<usize>>,
    goaway: mpsc::Sender<()>,
}

async fn h2c_call(
    req: Request<Incoming>,
    ctx: ConnCtx,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let version = format!("{:?}", req.version());
    let path = req.uri().path().to_string();
    if let Some(n) = path.strip_prefix("/hold/") {
        let n: usize = n.parse().unwrap();
        ctx.held.send_modify(|h| *h += 1);
        let mut rx = ctx.held.subscribe();
        let _ = rx.wait_for(|h| *h >= n).await;
    } else if path == "/goaway" {
        let _ = ctx.goaway.send(()).await;
        // The GOAWAY frame goes out before this answer does.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let body = format!("conn={} version={version} path={path}", ctx.id);
    Ok(Response::new(Full::new(Bytes::from(body))))
}

/// Starts the h2c upstream on its own runtime thread, advertising `max_streams`.
fn start_h2c(max_streams: u32) -> H2c {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let held = Arc::new(watch::Sender::new(0usize));
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let id = counted.fetch_add(1, Ordering::SeqCst) + 1;
                let (goaway_tx, mut goaway_rx) = mpsc::channel(1);
                let ctx = ConnCtx {
                    id,
                    held: held.clone(),
                    goaway: goaway_tx,
                };
                tokio::spawn(async move {
                    let conn = hyper::server::conn::http2::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .max_concurrent_streams(max_streams)
                    .serve_connection(
                        hyper_util::rt::TokioIo::new(stream),
                        hyper::service::service_fn(move |req| h2c_call(req, ctx.clone())),
                    );
                    let mut conn = std::pin::pin!(conn);
                    tokio::select! {
                        _ = conn.as_mut() => return,
                        _ = goaway_rx.recv() => conn.as_mut().graceful_shutdown(),
                    }
                    let _ = conn.await;
                });
            }
        });
    });
    H2c { addr, connections }
}

fn h2_route(nodes: &str, scheme: &str, extra: &str) -> String {
    format!(
        "routes:\n  - id: \"h2\"\n    uri: \"/*\"\n    upstream:\n      scheme: {scheme}\n      type: roundrobin\n      labels:\n        ferrisix.http_version: \"2\"\n{extra}      nodes:\n{nodes}"
    )
}

fn node(addr: &str) -> String {
    format!("        \"{addr}\": 1\n")
}

/// `n` requests for `/hold/<n>` at once; the answers' bodies.
fn held_requests(gw: SocketAddr, n: usize) -> Vec<String> {
    let threads: Vec<_> = (0..n)
        .map(|_| {
            std::thread::spawn(move || {
                let r = get(gw, &format!("/hold/{n}"));
                assert_eq!(r.status, 200, "{}", r.text());
                r.text()
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn h2c_requests_in_flight_share_one_connection() {
    let up = start_h2c(100);
    let gw = Gateway::start(&h2_route(&node(&up.addr.to_string()), "http", ""));
    // Ten requests the server answers only once all ten are in: one connection carries them.
    let bodies = held_requests(gw.addr(), 10);
    assert!(
        bodies
            .iter()
            .all(|b| b.starts_with("conn=1 version=HTTP/2.0")),
        "{bodies:?}"
    );
    assert_eq!(up.connections.load(Ordering::SeqCst), 1);
    // And later requests reuse it.
    for _ in 0..3 {
        assert!(get(gw.addr(), "/again").text().starts_with("conn=1 "));
    }
    assert_eq!(up.connections.load(Ordering::SeqCst), 1);
}

#[test]
fn h2c_opens_more_connections_past_the_servers_max_streams() {
    let up = start_h2c(4);
    let gw = Gateway::start(&h2_route(&node(&up.addr.to_string()), "http", ""));
    // Ten streams at once with at most four per connection: three connections, full ones
    // first.
    let bodies = held_requests(gw.addr(), 10);
    assert_eq!(up.connections.load(Ordering::SeqCst), 3, "{bodies:?}");
    let per_conn = |id: usize| {
        bodies
            .iter()
            .filter(|b| b.starts_with(&format!("conn={id} ")))
            .count()
    };
    let mut counts = [per_conn(1), per_conn(2), per_conn(3)];
    counts.sort_unstable();
    assert_eq!(counts, [2, 4, 4], "{bodies:?}");
}

#[test]
fn h2c_goaway_makes_the_next_request_open_a_new_connection() {
    let up = start_h2c(100);
    let gw = Gateway::start(&h2_route(&node(&up.addr.to_string()), "http", ""));
    assert!(get(gw.addr(), "/first").text().starts_with("conn=1 "));
    let r = get(gw.addr(), "/goaway");
    assert_eq!(r.status, 200);
    assert!(r.text().starts_with("conn=1 "));
    for _ in 0..3 {
        let r = get(gw.addr(), "/after");
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.text().starts_with("conn=2 "), "{}", r.text());
    }
    assert_eq!(up.connections.load(Ordering::SeqCst), 2);
}

#[test]
fn h2c_retries_go_to_another_node() {
    let up = start_h2c(100);
    let nodes = node(&dead_node()) + &node(&up.addr.to_string());
    let gw = Gateway::start(&h2_route(&nodes, "http", "      retries: 1\n"));
    // Round robin sends half the first tries to the dead node; each is tried again on the
    // live one.
    for _ in 0..4 {
        let r = get(gw.addr(), "/r");
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.text().starts_with("conn=1 version=HTTP/2.0"));
    }
    assert_eq!(up.connections.load(Ordering::SeqCst), 1);
}

/// Debian's nginx on a TLS listener, with `http2` on it or not; it answers with the protocol
/// and the connection number it served the request on.
fn nginx_tls(http2: bool) -> support::nginx::NginxTls {
    support::nginx::NginxTls::start(http2, "", "$server_protocol conn=$connection host=$host")
}

#[test]
fn https_upstream_speaks_what_nginx_picks_by_alpn() {
    let h2 = nginx_tls(true);
    let h1 = nginx_tls(false);
    let routes = format!(
        "{}  - id: \"h1\"\n    uri: \"/one/*\"\n    upstream:\n      scheme: https\n      type: roundrobin\n      labels:\n        ferrisix.http_version: \"2\"\n      nodes:\n{}",
        h2_route(&node(&format!("127.0.0.1:{}", h2.port)), "https", ""),
        node(&format!("127.0.0.1:{}", h1.port)),
    );
    let gw = Gateway::start(&routes);
    let mut conns = Vec::new();
    for _ in 0..3 {
        let r = get(gw.addr(), "/two");
        assert_eq!(r.status, 200, "{}", r.text());
        let text = r.text();
        // :authority is the client's Host, as Host would be over HTTP/1.1.
        assert!(text.starts_with("HTTP/2.0 conn="), "{text}");
        assert!(text.ends_with(" host=test.local"), "{text}");
        conns.push(text.split(' ').nth(1).unwrap().to_string());
    }
    // One connection, reused.
    assert!(conns.iter().all(|c| *c == conns[0]), "{conns:?}");
    // Without http2 on its listener nginx picks HTTP/1.1, which the upstream then speaks.
    for _ in 0..2 {
        let r = get(gw.addr(), "/one/x");
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.text().starts_with("HTTP/1.1 conn="), "{}", r.text());
    }
}
