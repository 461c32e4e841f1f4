//! The Admin API's HTTP listener (hyper 1, HTTP/1.1 and HTTP/2, graceful shutdown).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use ferrisix_net::{Acceptor, ConnLimits, Tracked};
use hyper::service::service_fn;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::AdminApi;

/// How long in-flight admin requests may finish after shutdown is signalled.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Serves `admin` on `listener` until `shutdown` turns true, then lets in-flight requests
/// finish (for up to ten seconds). `limits` bounds silent, idle and non-reading clients as on
/// the data port.
pub async fn serve(
    listener: TcpListener,
    admin: Arc<AdminApi>,
    limits: ConnLimits,
    mut shutdown: watch::Receiver<bool>,
) {
    let builder = ferrisix_net::http_builder(&limits);
    let mut acceptor = Acceptor::new(listener, "admin");
    let graceful = GracefulShutdown::new();
    // A closed channel counts as a stop signal too.
    let stop = async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
    };
    tokio::pin!(stop);

    loop {
        tokio::select! {
            () = &mut stop => break,
            (stream, peer) = acceptor.accept() => {
                let (io, conn_watch) = ferrisix_net::wrap(stream, &limits);
                let admin = admin.clone();
                let requests = conn_watch.clone();
                let service = service_fn(move |req| {
                    let admin = admin.clone();
                    let in_flight = requests.begin();
                    async move {
                        let resp = admin.handle(req, peer.ip()).await;
                        Ok::<_, Infallible>(Tracked::response(resp, in_flight))
                    }
                });
                let conn = builder.serve_connection(io, service).into_owned();
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Some(Err(e)) = conn_watch.run(conn).await {
                        tracing::debug!(error = %e, "admin connection ended with an error");
                    }
                });
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
