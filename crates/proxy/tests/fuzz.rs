//! Fuzz harness (stable, proptest): the upstream response head parsing. A fake upstream
//! answers the real client code (`client::checkout` + `client::send`, hyper's client under
//! ferrisix's timeouts) with random and mutated bytes; every case ends, in an answer or a
//! failure, within the read timeout, and nothing panics. Bounded: `PROPTEST_CASES`.

use std::io::{Read, Write};
use std::time::Duration;

use ferrisix_proxy::upstream::client::{
    self, PoolKey, PoolLimits, SendOutcome, TryTimeouts, UpstreamBody,
};
use ferrisix_testkit::cases;
use http_body_util::BodyExt;
use proptest::prelude::*;

const HEAD: &str = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\nX-A: b\r\nConnection: keep-alive\r\n\r\n5\r\nhello\r\n0\r\n\r\n";

fn answer() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec((0..HEAD.len(), any::<u8>(), any::<bool>()), 0..6).prop_map(|edits| {
            let mut b = HEAD.as_bytes().to_vec();
            for (at, byte, insert) in edits {
                if insert { b.insert(at, byte) } else { b[at] = byte }
            }
            b
        }),
        "(HTTP/1\\.[019] |HTTP/2 |[0-9]{1,4} |[A-Za-z ]{0,6}|\r\n|\n|[A-Za-z-]{1,12}: ?[ -~]{0,12}|Content-Length: -?[0-9]{1,20}|Transfer-Encoding: (chunked|gzip)|[0-9a-fA-F]{1,17}(;x)?|\r\n\r\n){0,16}"
            .prop_map(String::into_bytes),
        prop::collection::vec(any::<u8>(), 0..128),
    ]
}

proptest! {
    #![proptest_config(cases(300))]

    #[test]
    fn upstream_answers_never_panic_or_hang(bytes in answer()) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let upstream = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 2048];
            let _ = s.read(&mut buf);
            let _ = s.write_all(&bytes);
            // Closing ends whatever the bytes left open.
        });
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let timeouts = TryTimeouts {
            connect: Duration::from_secs(2),
            send: Duration::from_secs(2),
            read: Duration::from_secs(2),
        };
        rt.block_on(async {
            let mut conn = client::checkout(&PoolKey::plain(addr), PoolLimits::default(), timeouts.connect, None)
                .await
                .expect("connect");
            let req = http::Request::get("/fuzz")
                .header("host", "upstream")
                .body(UpstreamBody::Empty)
                .unwrap();
            let outcome = tokio::time::timeout(Duration::from_secs(10), client::send(&mut conn, req, timeouts))
                .await
                .expect("send ends within the read timeout");
            if let SendOutcome::Response(resp) = outcome {
                let read = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect()).await;
                assert!(read.is_ok(), "the body read ends");
            }
        });
        upstream.join().unwrap();
    }
}
