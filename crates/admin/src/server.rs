//! The Admin API's HTTP listener (hyper 1, HTTP/1.1 and HTTP/2, graceful shutdown).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use ferrisix_net::{Acceptor, ConnLimits, Drain};
use hyper::service::service_fn;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::AdminApi;

/// How long in-flight admin requests may finish after shutdown is signalled.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Serves `admin` on `listener` until `shutdown` turns true, then drains its connections
/// (in-flight requests finish, kept-alive clients are told to close; for up to ten seconds). `limits` bounds silent, idle and non-reading clients as on
/// the data port.
pub async fn serve(
    listener: TcpListener,
    admin: Arc<AdminApi>,
    limits: ConnLimits,
    mut shutdown: watch::Receiver<bool>,
) {
    let builder = ferrisix_net::http_builder(&limits);
    let mut acceptor = Acceptor::new(listener, "admin");
    let drain = Drain::new();
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
                let conn_watch = conn_watch.with_drain(&drain);
                let admin = admin.clone();
                let requests = conn_watch.clone();
                let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let admin = admin.clone();
                    let requests = requests.clone();
                    let in_flight = requests.begin();
                    let version = req.version();
                    async move {
                        let resp = admin.handle(req, peer.ip()).await;
                        Ok::<_, Infallible>(requests.respond(resp, in_flight, version))
                    }
                });
                let conn = builder.serve_connection(io, service).into_owned();
                tokio::spawn(async move {
                    if let Some(Err(e)) = conn_watch.serve(conn).await {
                        tracing::debug!(error = %e, "admin connection ended with an error");
                    }
                });
            }
        }
    }
    drain.start();
    if tokio::time::timeout(SHUTDOWN_GRACE, drain.finished())
        .await
        .is_err()
    {
        tracing::warn!("admin shutdown timeout reached with requests still in flight");
    }
}
