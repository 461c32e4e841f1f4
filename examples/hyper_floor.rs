//! The least a hyper proxy can do per request, as a floor for issue 16's targets: one
//! current-thread runtime (as a ferrisix worker), hyper's HTTP/1 server on the client side and
//! hyper's HTTP/1 client on the upstream side, one kept-alive upstream connection per client
//! connection (no pool, no routing, no plugins, no access log, no header rewriting), the
//! request and the answer passed through as they come, bodies streamed.
//!
//! `benches/e2e/bench.py --floor` and `benches/e2e/instructions.py --floor` measure it next to
//! nginx and ferrisix: what it costs per request is what any gateway built on the two hyper
//! codecs pays before it does a gateway's work.
//!
//! ```sh
//! cargo build --release --example hyper_floor
//! target/release/examples/hyper_floor 127.0.0.1:9083 127.0.0.1:1980
//! benches/e2e/build_floor.sh   # profile-guided, as the gateway's release build is
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{Either, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

// The gateway's allocator, so that the floor and ferrisix differ only in what they do.
#[global_allocator]
static ALLOCATOR: ferrisix_alloc::Mimalloc = ferrisix_alloc::Mimalloc;

type Answer = Response<Either<Incoming, Empty<Bytes>>>;

/// The client connection's upstream connection, taken for a request and put back once its
/// answer's head is in (hyper's HTTP/1 server asks for one answer at a time, so the lock is
/// never contended; it is there because the service must be `Send`).
type Upstream = Arc<Mutex<Option<SendRequest<Incoming>>>>;

fn main() -> std::process::ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        eprintln!("usage: hyper_floor LISTEN_ADDR UPSTREAM_ADDR");
        return std::process::ExitCode::from(2);
    };
    let (Ok(listen), Ok(upstream)) = (listen.parse::<SocketAddr>(), upstream.parse()) else {
        eprintln!("hyper_floor: the addresses are ip:port");
        return std::process::ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hyper_floor: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // Ends on SIGINT, so that a profile-instrumented build writes its profile at exit.
    let served = runtime.block_on(async {
        tokio::select! {
            served = serve(listen, upstream) => served,
            stopped = tokio::signal::ctrl_c() => stopped,
        }
    });
    match served {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hyper_floor: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve(listen: SocketAddr, upstream: SocketAddr) -> std::io::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        // Both proxies in the comparison set it (nginx's `tcp_nodelay on`).
        let _ = stream.set_nodelay(true);
        let slot: Upstream = Arc::new(Mutex::new(None));
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req| forward(slot.clone(), upstream, req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn forward(
    slot: Upstream,
    upstream: SocketAddr,
    req: Request<Incoming>,
) -> Result<Answer, Infallible> {
    let taken = slot.lock().map(|mut s| s.take()).unwrap_or(None);
    let mut sender = match taken {
        Some(s) if !s.is_closed() => s,
        _ => match connect(upstream).await {
            Ok(s) => s,
            Err(_) => return Ok(bad_gateway()),
        },
    };
    if sender.ready().await.is_err() {
        return Ok(bad_gateway());
    }
    match sender.send_request(req).await {
        Ok(answer) => {
            if let Ok(mut s) = slot.lock() {
                *s = Some(sender);
            }
            Ok(answer.map(Either::Left))
        }
        Err(_) => Ok(bad_gateway()),
    }
}

async fn connect(upstream: SocketAddr) -> std::io::Result<SendRequest<Incoming>> {
    let stream = TcpStream::connect(upstream).await?;
    let _ = stream.set_nodelay(true);
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(connection);
    Ok(sender)
}

fn bad_gateway() -> Answer {
    let mut answer = Response::new(Either::Right(Empty::new()));
    *answer.status_mut() = StatusCode::BAD_GATEWAY;
    answer
}
