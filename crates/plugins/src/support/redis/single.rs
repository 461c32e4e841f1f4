//! The `redis` policy's connections: a pool of multiplexed connections to one server.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use ferrisix_plugin_api::Executor;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, RedisConnectionInfo};

use super::SingleTarget;

/// Connections per single-node target; each multiplexes any number of requests.
pub const MAX_CONNECTIONS: usize = 4;

/// A pool of multiplexed connections to one Redis server.
pub struct SinglePool {
    pub(crate) target: SingleTarget,
    pub(crate) executor: Executor,
    client: redis::Client,
    slots: Box<[ArcSwapOption<MultiplexedConnection>]>,
    /// Serialises (re)connecting per slot so a burst does not open a connection per request.
    connecting: Box<[tokio::sync::Mutex<()>]>,
    next: AtomicUsize,
    /// `redis_timeout`, or a sentinel target's `redis_connect_timeout`.
    pub(crate) connect_timeout: Duration,
}

impl SinglePool {
    pub(crate) fn new(target: SingleTarget, executor: Executor) -> Result<SinglePool, String> {
        let addr = if target.ssl {
            ConnectionAddr::TcpTls {
                host: target.host.clone(),
                port: target.port,
                insecure: !target.ssl_verify,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(target.host.clone(), target.port)
        };
        let mut redis_info = RedisConnectionInfo::default().set_db(target.database);
        if let Some(p) = target.password.as_deref().filter(|p| !p.is_empty()) {
            redis_info = redis_info.set_password(p);
            if let Some(u) = &target.username {
                redis_info = redis_info.set_username(u);
            }
        }
        let info = redis::IntoConnectionInfo::into_connection_info(addr)
            .map(|i: ConnectionInfo| i.set_redis_settings(redis_info))
            .map_err(|e| e.to_string())?;
        let client = redis::Client::open(info).map_err(|e| e.to_string())?;
        let n = target.pool.clamp(1, MAX_CONNECTIONS);
        Ok(SinglePool {
            connect_timeout: Duration::from_millis(target.timeout_ms.max(1)),
            target,
            executor,
            client,
            slots: (0..n).map(|_| ArcSwapOption::empty()).collect(),
            connecting: (0..n).map(|_| tokio::sync::Mutex::new(())).collect(),
            next: AtomicUsize::new(0),
        })
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_millis(self.target.timeout_ms.max(1))
    }

    pub(crate) async fn connection(&self) -> Result<(usize, MultiplexedConnection), String> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        if let Some(c) = self.slots[i].load_full() {
            return Ok((i, (*c).clone()));
        }
        let _guard = self.connecting[i].lock().await;
        if let Some(c) = self.slots[i].load_full() {
            return Ok((i, (*c).clone()));
        }
        let client = self.client.clone();
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.timeout()));
        let conn = self
            .executor
            .spawn(async move {
                client
                    .get_multiplexed_async_connection_with_config(&cfg)
                    .await
            })?
            .await
            .map_err(|e| format!("redis connect task: {e}"))?
            .map_err(|e| e.to_string())?;
        self.slots[i].store(Some(Arc::new(conn.clone())));
        Ok((i, conn))
    }

    /// Forgets a connection that failed in a way that leaves it unusable (or, after a
    /// time-out, liable to hand a late answer to the next request).
    pub(crate) fn failed(&self, slot: usize, e: Option<&redis::RedisError>) {
        let unusable = e.is_none_or(|e| {
            e.is_io_error()
                || e.is_connection_dropped()
                || e.is_unrecoverable_error()
                || e.is_timeout()
        });
        if unusable {
            self.slots[slot].store(None);
        }
    }
}
