//! WebSocket tunnelling: after the upstream answers 101, both upgraded connections are joined
//! and bytes are copied both ways until either side closes.

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use crate::upstream::balancer::TryGuard;

/// `guard` is the upstream try, held until the tunnel closes.
pub fn tunnel(client: OnUpgrade, upstream: OnUpgrade, guard: TryGuard) {
    tokio::spawn(async move {
        let _guard = guard;
        let (client, upstream) = match tokio::try_join!(client, upstream) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::debug!(error = %e, "websocket upgrade failed");
                return;
            }
        };
        let mut client = TokioIo::new(client);
        let mut upstream = TokioIo::new(upstream);
        if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            tracing::debug!(error = %e, "websocket tunnel ended");
        }
    });
}
