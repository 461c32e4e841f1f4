//! The `redis-cluster` policy's connection: one cluster client, which keeps its own
//! connection per node and routes by hash slot.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use ferrisix_plugin_api::Executor;
use redis::cluster_async::ClusterConnection;

use super::ClusterTarget;

/// One cluster client (it keeps its own connection per node).
pub struct ClusterPool {
    pub(crate) target: ClusterTarget,
    pub(crate) executor: Executor,
    client: redis::cluster::ClusterClient,
    conn: ArcSwapOption<ClusterConnection>,
    connecting: tokio::sync::Mutex<()>,
}

impl ClusterPool {
    pub(crate) fn new(target: ClusterTarget, executor: Executor) -> Result<ClusterPool, String> {
        let t = Duration::from_millis(target.timeout_ms.max(1));
        let nodes: Vec<String> = target
            .nodes
            .iter()
            .map(|n| format!("{}://{n}", if target.ssl { "rediss" } else { "redis" }))
            .collect();
        let mut b = redis::cluster::ClusterClientBuilder::new(nodes)
            .connection_timeout(t)
            .response_timeout(t);
        if let Some(p) = target.password.as_deref().filter(|p| !p.is_empty()) {
            b = b.password(p);
        }
        if target.ssl {
            b = b.tls(if target.ssl_verify {
                redis::TlsMode::Secure
            } else {
                redis::TlsMode::Insecure
            });
        }
        let client = b.build().map_err(|e| e.to_string())?;
        Ok(ClusterPool {
            target,
            executor,
            client,
            conn: ArcSwapOption::empty(),
            connecting: tokio::sync::Mutex::new(()),
        })
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_millis(self.target.timeout_ms.max(1))
    }

    pub(crate) async fn connection(&self) -> Result<ClusterConnection, String> {
        if let Some(c) = self.conn.load_full() {
            return Ok((*c).clone());
        }
        let _guard = self.connecting.lock().await;
        if let Some(c) = self.conn.load_full() {
            return Ok((*c).clone());
        }
        let client = self.client.clone();
        let conn = self
            .executor
            .spawn(async move { client.get_async_connection().await })?
            .await
            .map_err(|e| format!("redis cluster connect task: {e}"))?
            .map_err(|e| {
                format!(
                    "failed to connect to redis cluster {}: {e}",
                    self.target.name
                )
            })?;
        self.conn.store(Some(Arc::new(conn.clone())));
        Ok(conn)
    }
}
