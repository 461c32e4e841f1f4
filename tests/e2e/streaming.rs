//! Bodies stream through the gateway with backpressure: a 1 GiB upload passes while the
//! gateway's resident memory stays small, and websocket connections are tunnelled.

use crate::support;

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::{Behaviour, Gateway, Upstream};

const GIB: u64 = 1 << 30;

#[test]
fn one_gib_upload_streams_without_growing_memory() {
    let up = Upstream::start("sink", Behaviour::Echo);
    let gw = Gateway::start(&format!(
        "routes:\n  - id: up\n    uri: /upload\n    upstream:\n      nodes:\n        \"{}\": 1\n",
        up.node()
    ));
    let baseline = gw.rss_kib();

    // Sample the gateway's RSS while the upload runs.
    let done = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let done = done.clone();
        let peak = peak.clone();
        let pid = gw.pid();
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                    if let Some(kb) = status
                        .lines()
                        .find_map(|l| l.strip_prefix("VmRSS:"))
                        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                    {
                        peak.fetch_max(kb, Ordering::SeqCst);
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    let mut s = TcpStream::connect(gw.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "POST /upload HTTP/1.1\r\nHost: up.test\r\nContent-Length: {GIB}\r\nContent-Type: application/octet-stream\r\n\r\n"
    )
    .unwrap();
    let chunk = vec![b'x'; 256 * 1024];
    let mut sent = 0u64;
    let started = std::time::Instant::now();
    while sent < GIB {
        s.write_all(&chunk).unwrap();
        sent += chunk.len() as u64;
    }
    let reply = support::read_reply(&mut s, false);
    let elapsed = started.elapsed();
    done.store(true, Ordering::SeqCst);
    sampler.join().unwrap();

    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        reply.json()["body_len"],
        GIB,
        "the upstream received every byte"
    );
    let peak = peak.load(Ordering::SeqCst);
    eprintln!(
        "1 GiB upload: {:.1} s ({:.0} MiB/s), gateway RSS baseline {} KiB, peak {} KiB",
        elapsed.as_secs_f64(),
        1024.0 / elapsed.as_secs_f64(),
        baseline,
        peak
    );
    // Growth over the idle baseline, not an absolute figure: under qemu (the arm64 tests) the
    // process' RSS includes the emulator's own ~60 MiB.
    assert!(
        peak.saturating_sub(baseline) < 32 * 1024,
        "gateway RSS grew from {baseline} to {peak} KiB during a 1 GiB upload"
    );
}

#[test]
fn chunked_upload_of_unknown_length_streams() {
    let up = Upstream::start("sink", Behaviour::Echo);
    let gw = Gateway::start(&format!(
        "routes:\n  - id: up\n    uri: /upload\n    upstream:\n      nodes:\n        \"{}\": 1\n",
        up.node()
    ));
    let mut s = TcpStream::connect(gw.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "PUT /upload HTTP/1.1\r\nHost: up.test\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .unwrap();
    let chunk = vec![b'y'; 100_000];
    for _ in 0..200 {
        write!(s, "{:x}\r\n", chunk.len()).unwrap();
        s.write_all(&chunk).unwrap();
        s.write_all(b"\r\n").unwrap();
    }
    s.write_all(b"0\r\n\r\n").unwrap();
    let reply = support::read_reply(&mut s, false);
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["body_len"], 20_000_000u64);
}

mod websocket {
    use super::*;
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    /// A websocket echo server on a random port, on its own runtime thread.
    fn echo_server() -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let (stream, _) = listener.accept().await.unwrap();
                    tokio::spawn(async move {
                        let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                            return;
                        };
                        while let Some(Ok(msg)) = ws.next().await {
                            if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            });
        });
        addr
    }

    fn route(ws_node: std::net::SocketAddr, enable: bool) -> String {
        format!(
            "routes:\n  - id: ws\n    uri: /ws\n    enable_websocket: {enable}\n    upstream:\n      nodes:\n        \"{ws_node}\": 1\n"
        )
    }

    #[test]
    fn websocket_echo_through_the_gateway() {
        let node = echo_server();
        let gw = Gateway::start(&route(node, true));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let url = format!("ws://127.0.0.1:{}/ws", gw.port);
            let (mut ws, resp) = tokio_tungstenite::connect_async(url)
                .await
                .expect("handshake through the gateway");
            assert_eq!(resp.status(), 101);
            for i in 0..20 {
                let text = format!("hello {i}");
                ws.send(Message::text(text.clone())).await.unwrap();
                let echoed = ws.next().await.unwrap().unwrap();
                assert_eq!(echoed.into_text().unwrap().as_str(), text);
            }
            let big = vec![7u8; 1 << 20];
            ws.send(Message::binary(big.clone())).await.unwrap();
            let echoed = ws.next().await.unwrap().unwrap();
            assert_eq!(echoed.into_data().as_ref(), &big[..]);
            ws.close(None).await.unwrap();
        });
    }

    #[test]
    fn upgrade_headers_are_dropped_when_websocket_is_off() {
        let node = echo_server();
        let gw = Gateway::start(&route(node, false));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let url = format!("ws://127.0.0.1:{}/ws", gw.port);
            // Without Upgrade/Connection the echo server sees a plain GET and refuses it.
            assert!(tokio_tungstenite::connect_async(url).await.is_err());
        });
    }
}
