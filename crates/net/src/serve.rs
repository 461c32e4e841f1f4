//! The accept-and-serve loop of the servers that run on one task beside the workers (the Admin
//! API, the control API, the prometheus export server): each accepted connection is wrapped
//! with the listeners' limits ([`crate::wrap`]), served on its own task under the server's
//! [`Drain`], and every answer goes out through [`ConnWatch::respond`]. On shutdown the
//! listener closes and the open connections drain (in-flight requests finish, kept-alive
//! clients are told to close) for up to [`SHUTDOWN_GRACE`].
//!
//! [`ConnWatch::respond`]: crate::ConnWatch::respond

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioExecutor;
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::{Acceptor, ConnLimits, Drain};

/// How long in-flight requests may finish once shutdown is signalled.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Serves `handler`'s answers on `listener` until `shutdown` turns true (or its sender goes
/// away), then drains the connections. `name` names the server in the logs; `builder` is
/// [`crate::http_builder`] (or an HTTP/1-only form of it); `limits` bounds silent, idle and
/// non-reading clients as on the data port. `handler` gets each request with its client's
/// address.
pub async fn serve_until<H, F, B>(
    listener: TcpListener,
    name: &'static str,
    builder: auto::Builder<TokioExecutor>,
    limits: ConnLimits,
    mut shutdown: watch::Receiver<bool>,
    handler: H,
) where
    H: Fn(Request<Incoming>, SocketAddr) -> F + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let builder = Arc::new(builder);
    let handler = Arc::new(handler);
    let mut acceptor = Acceptor::new(listener, name);
    let drain = Drain::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => break,
            accepted = acceptor.accept() => accepted,
        };
        let builder = builder.clone();
        let handler = handler.clone();
        let drain = drain.clone();
        tokio::spawn(async move {
            let (io, conn_watch) = crate::wrap(stream, &limits);
            let conn_watch = conn_watch.with_drain(&drain);
            let requests = conn_watch.clone();
            let service = service_fn(move |req: Request<Incoming>| {
                let in_flight = requests.begin();
                let version = req.version();
                let answer = handler(req, peer);
                let requests = requests.clone();
                async move {
                    let resp = answer.await;
                    Ok::<_, Infallible>(requests.respond(resp, in_flight, version))
                }
            });
            let served = conn_watch.serve(builder.serve_connection(io, service));
            if let Some(Err(e)) = served.await {
                tracing::debug!(server = name, error = %e, "connection ended with an error");
            }
        });
    }
    // New clients are refused from here on rather than left waiting in the queue.
    drop(acceptor);
    drain.start();
    if tokio::time::timeout(SHUTDOWN_GRACE, drain.finished())
        .await
        .is_err()
    {
        tracing::warn!(
            server = name,
            "shutdown grace ended with requests still in flight"
        );
    }
}
