//! The Admin API's HTTP listener (hyper 1, HTTP/1.1 and HTTP/2, graceful shutdown), on the
//! accept-and-serve loop every server beside the workers shares ([`ferrisix_net::serve_until`]).

use std::sync::Arc;

use ferrisix_net::ConnLimits;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::AdminApi;

/// Serves `admin` on `listener` until `shutdown` turns true, then drains its connections
/// (in-flight requests finish, kept-alive clients are told to close; for up to
/// [`ferrisix_net::SHUTDOWN_GRACE`]). `limits` bounds silent, idle and non-reading clients as
/// on the data port.
pub async fn serve(
    listener: TcpListener,
    admin: Arc<AdminApi>,
    limits: ConnLimits,
    shutdown: watch::Receiver<bool>,
) {
    let builder = ferrisix_net::http_builder(&limits);
    ferrisix_net::serve_until(
        listener,
        "admin",
        builder,
        limits,
        shutdown,
        move |req, peer| {
            let admin = admin.clone();
            async move { admin.handle(req, peer.ip()).await }
        },
    )
    .await;
}
