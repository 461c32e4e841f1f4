//! Upstream response heads: a fake upstream answers the real client code with the input.
#![no_main]
use std::io::{Read, Write};
use std::time::Duration;

use ferrisix_proxy::upstream::client::{self, PoolKey, PoolLimits, SendOutcome, TryTimeouts, UpstreamBody};
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let bytes = data.to_vec();
    let upstream = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 2048];
        let _ = s.read(&mut buf);
        let _ = s.write_all(&bytes);
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let t = TryTimeouts {
        connect: Duration::from_secs(1),
        send: Duration::from_secs(1),
        read: Duration::from_secs(1),
    };
    rt.block_on(async {
        let mut conn = client::checkout(PoolKey { addr }, PoolLimits::default(), t.connect)
            .await
            .unwrap();
        let req = http::Request::get("/")
            .header("host", "u")
            .body(UpstreamBody::Empty)
            .unwrap();
        if let SendOutcome::Response(resp) = client::send(&mut conn, req, t).await {
            let _ = tokio::time::timeout(Duration::from_secs(2), resp.into_body().collect()).await;
        }
    });
    upstream.join().unwrap();
});
