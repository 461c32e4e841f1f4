//! The Admin API's HTTP listener (hyper 1, HTTP/1.1 and HTTP/2, graceful shutdown).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::AdminApi;

/// How long in-flight admin requests may finish after shutdown is signalled.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Serves `admin` on `listener` until `shutdown` turns true, then lets in-flight requests
/// finish (for up to ten seconds).
pub async fn serve(
    listener: TcpListener,
    admin: Arc<AdminApi>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .keep_alive(true)
        // A client that never finishes its headers is dropped rather than held forever.
        .header_read_timeout(Duration::from_secs(60))
        .max_buf_size(64 * 1024);
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    // A closed channel counts as a stop signal too.
    let stop = async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
    };
    tokio::pin!(stop);

    loop {
        tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let admin = admin.clone();
                    let service = service_fn(move |req| {
                        let admin = admin.clone();
                        async move { Ok::<_, Infallible>(admin.handle(req, peer.ip()).await) }
                    });
                    let conn = builder.serve_connection(TokioIo::new(stream), service).into_owned();
                    let conn = graceful.watch(conn);
                    tokio::spawn(async move {
                        if let Err(e) = conn.await {
                            tracing::debug!(error = %e, "admin connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    // Out of file descriptors and similar: back off instead of spinning.
                    tracing::warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("admin shutdown timeout reached with requests still in flight");
    }
}
