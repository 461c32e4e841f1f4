//! The `redis` and `redis-cluster` policies: one script round trip per request.
//!
//! The fixed-window script takes the counter key (`plugin-limit-count:v1:<counter key>`), the
//! window and the cost: a key without a TTL is (re)created with the cost and the window as its
//! expiry, otherwise it is incremented; it answers the consumed count and the remaining TTL in
//! milliseconds. The script is sent by SHA (`EVALSHA`) and loaded on `NOSCRIPT`.
//!
//! Connections are multiplexed (many requests pipelined on one TCP connection) and pooled per
//! target; their I/O tasks run on one dedicated thread, so a connection outlives the worker
//! runtime that first needed it and any worker can use any connection. Cluster clients route
//! by hash slot and follow `MOVED`/`ASK`, refreshing their slot map (the `redis` crate).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, RedisConnectionInfo, Script};

use super::local::{sliding_decide, Outcome};

/// Connections per single-node target; each multiplexes any number of requests.
const MAX_CONNECTIONS: usize = 4;

fn fixed_script() -> &'static Script {
    static S: OnceLock<Script> = OnceLock::new();
    // KEYS[1] counter; ARGV[1] window (s); ARGV[2] cost. Answers {consumed, ttl in ms}.
    S.get_or_init(|| {
        Script::new(
            "local left = redis.call('pttl', KEYS[1])\n\
             if left < 0 then\n\
               redis.call('set', KEYS[1], ARGV[2], 'EX', ARGV[1])\n\
               return {tonumber(ARGV[2]), tonumber(ARGV[1]) * 1000}\n\
             end\n\
             return {redis.call('incrby', KEYS[1], ARGV[2]), left}\n",
        )
    })
}

fn sliding_script() -> &'static Script {
    static S: OnceLock<Script> = OnceLock::new();
    // KEYS[1] current window's counter; ARGV: cost, limit, window (ms), remaining (ms),
    // expiry (s), previous window's count. Decides and increments atomically (only on accept).
    // Answers {accepted, current count, previous count (capped at the limit)}.
    S.get_or_init(|| {
        Script::new(
            "local cost = tonumber(ARGV[1])\n\
             local limit = tonumber(ARGV[2])\n\
             local window = tonumber(ARGV[3])\n\
             local remaining = tonumber(ARGV[4])\n\
             local prev = math.min(tonumber(ARGV[6]), limit)\n\
             local left = redis.call('pttl', KEYS[1])\n\
             local cur = 0\n\
             if left >= 0 then cur = tonumber(redis.call('get', KEYS[1]) or 0) end\n\
             if cur >= limit or prev / window * remaining + cur >= limit then\n\
               return {0, cur, prev}\n\
             end\n\
             if left < 0 then\n\
               redis.call('set', KEYS[1], cost, 'EX', ARGV[5])\n\
               return {1, cost, prev}\n\
             end\n\
             return {1, redis.call('incrby', KEYS[1], cost), prev}\n",
        )
    })
}

/// The thread that runs every Redis connection's I/O.
fn io_runtime() -> Result<&'static tokio::runtime::Handle, String> {
    static RT: OnceLock<Result<tokio::runtime::Handle, String>> = OnceLock::new();
    RT.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the redis runtime: {e}"))?;
        let handle = rt.handle().clone();
        std::thread::Builder::new()
            .name("ferrisix-redis".into())
            .spawn(move || rt.block_on(std::future::pending::<()>()))
            .map_err(|e| format!("cannot start the redis thread: {e}"))?;
        Ok(handle)
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Where a `redis` policy connects: everything that makes two connections interchangeable.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SingleTarget {
    pub host: String,
    pub port: u16,
    pub username: Option<String>,
    pub password: Option<String>,
    pub database: i64,
    pub timeout_ms: u64,
    pub ssl: bool,
    pub ssl_verify: bool,
    pub pool: usize,
}

/// Where a `redis-cluster` policy connects.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClusterTarget {
    /// `host:port` seeds.
    pub nodes: Vec<String>,
    pub name: String,
    pub password: Option<String>,
    pub timeout_ms: u64,
    pub ssl: bool,
    pub ssl_verify: bool,
}

/// A pool of multiplexed connections to one Redis server.
pub struct SinglePool {
    target: SingleTarget,
    client: redis::Client,
    slots: Box<[ArcSwapOption<MultiplexedConnection>]>,
    /// Serialises (re)connecting per slot so a burst does not open a connection per request.
    connecting: Box<[tokio::sync::Mutex<()>]>,
    next: AtomicUsize,
}

impl SinglePool {
    fn new(target: SingleTarget) -> Result<SinglePool, String> {
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
            target,
            client,
            slots: (0..n).map(|_| ArcSwapOption::empty()).collect(),
            connecting: (0..n).map(|_| tokio::sync::Mutex::new(())).collect(),
            next: AtomicUsize::new(0),
        })
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.target.timeout_ms.max(1))
    }

    async fn connection(&self) -> Result<(usize, MultiplexedConnection), String> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        if let Some(c) = self.slots[i].load_full() {
            return Ok((i, (*c).clone()));
        }
        let _guard = self.connecting[i].lock().await;
        if let Some(c) = self.slots[i].load_full() {
            return Ok((i, (*c).clone()));
        }
        let client = self.client.clone();
        let t = self.timeout();
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(t))
            .set_response_timeout(Some(t));
        let conn = io_runtime()?
            .spawn(async move {
                client
                    .get_multiplexed_async_connection_with_config(&cfg)
                    .await
            })
            .await
            .map_err(|e| format!("redis connect task: {e}"))?
            .map_err(|e| e.to_string())?;
        self.slots[i].store(Some(Arc::new(conn.clone())));
        Ok((i, conn))
    }

    /// Forgets a connection that failed in a way that leaves it unusable (or, after a
    /// time-out, liable to hand a late answer to the next request).
    fn failed(&self, slot: usize, e: &redis::RedisError) {
        if e.is_io_error()
            || e.is_connection_dropped()
            || e.is_unrecoverable_error()
            || e.is_timeout()
        {
            self.slots[slot].store(None);
        }
    }
}

/// One cluster client (it keeps its own connection per node).
pub struct ClusterPool {
    target: ClusterTarget,
    client: redis::cluster::ClusterClient,
    conn: ArcSwapOption<ClusterConnection>,
    connecting: tokio::sync::Mutex<()>,
}

impl ClusterPool {
    fn new(target: ClusterTarget) -> Result<ClusterPool, String> {
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
            client,
            conn: ArcSwapOption::empty(),
            connecting: tokio::sync::Mutex::new(()),
        })
    }

    async fn connection(&self) -> Result<ClusterConnection, String> {
        if let Some(c) = self.conn.load_full() {
            return Ok((*c).clone());
        }
        let _guard = self.connecting.lock().await;
        if let Some(c) = self.conn.load_full() {
            return Ok((*c).clone());
        }
        let client = self.client.clone();
        let conn = io_runtime()?
            .spawn(async move { client.get_async_connection().await })
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

/// A Redis backend of one plugin instance.
#[derive(Clone)]
pub enum Remote {
    Single(Arc<SinglePool>),
    Cluster(Arc<ClusterPool>),
}

/// Runs one script invocation or command on a remote, handling connection bookkeeping.
macro_rules! on_remote {
    ($remote:expr, |$c:ident| $call:expr) => {
        match $remote {
            Remote::Single(p) => {
                let (slot, mut conn) = p.connection().await?;
                let $c = &mut conn;
                let r = $call.await;
                if let Err(e) = &r {
                    p.failed(slot, e);
                }
                r.map_err(|e| e.to_string())
            }
            Remote::Cluster(p) => {
                let mut conn = p.connection().await?;
                let $c = &mut conn;
                $call.await.map_err(|e| e.to_string())
            }
        }
    };
}

impl Remote {
    /// The fixed window on the server: `counter_key` is the whole key
    /// (`plugin-limit-count:v1:...`).
    pub async fn fixed(
        &self,
        counter_key: &str,
        limit: u64,
        window_s: u64,
        cost: u64,
    ) -> Result<Outcome, String> {
        let (consumed, ttl_ms): (i64, i64) = on_remote!(self, |c| fixed_script()
            .key(counter_key)
            .arg(window_s)
            .arg(cost)
            .invoke_async(c))?;
        let reset_centis = (ttl_ms.max(0) as u64) / 10;
        let remaining = limit as i64 - consumed;
        if remaining < 0 {
            return Ok(Outcome {
                rejected: true,
                remaining: 0,
                reset_centis,
            });
        }
        Ok(Outcome {
            rejected: false,
            remaining: remaining as u64,
            reset_centis,
        })
    }

    /// The sliding window on the server: `base` is `plugin-limit-count:<counter key>`; the
    /// counters are `<base>.<window id>.counter`.
    pub async fn sliding(
        &self,
        base: &str,
        limit: u64,
        window_s: u64,
        cost: u64,
    ) -> Result<Outcome, String> {
        let now = super::local::epoch_ms();
        let window_ms = window_s.max(1) * 1000;
        let wid = now / window_ms;
        let remaining_ms = window_ms - now % window_ms;
        let current = format!("{base}.{wid}.counter");
        let previous = format!("{base}.{}.counter", wid.saturating_sub(1));
        let expiry = window_s.max(1) * 2;
        // The previous window is frozen, so reading it outside the script is safe and keeps
        // the script to one key, as a cluster requires.
        let prev: Option<i64> =
            on_remote!(self, |c| redis::cmd("GET").arg(&previous).query_async(c))?;
        let prev = prev.unwrap_or(0).max(0) as u64;
        let (accepted, count, prev): (i64, i64, i64) = on_remote!(self, |c| sliding_script()
            .key(&current)
            .arg(cost)
            .arg(limit)
            .arg(window_ms)
            .arg(remaining_ms)
            .arg(expiry)
            .arg(prev)
            .invoke_async(c))?;
        let (count, prev) = (count.max(0) as u64, prev.max(0) as u64);
        if accepted == 0 {
            // The script's verdict; recomputed here for the reset time.
            let mut o = sliding_decide(count, prev, limit, cost, window_ms, remaining_ms);
            o.rejected = true;
            o.remaining = 0;
            return Ok(o);
        }
        // `count` already includes this request.
        Ok(sliding_decide(
            count.saturating_sub(cost),
            prev,
            limit,
            cost,
            window_ms,
            remaining_ms,
        ))
    }
}

/// Every Redis pool, shared by the plugin instances that use the same target.
#[derive(Default)]
pub struct Remotes {
    single: Mutex<HashMap<SingleTarget, Weak<SinglePool>>>,
    cluster: Mutex<HashMap<ClusterTarget, Weak<ClusterPool>>>,
}

impl std::fmt::Debug for Remotes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Remotes")
    }
}

impl Remotes {
    pub fn single(&self, target: SingleTarget) -> Result<Remote, String> {
        let mut map = self.single.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        if let Some(p) = map.get(&target).and_then(Weak::upgrade) {
            return Ok(Remote::Single(p));
        }
        let p = Arc::new(SinglePool::new(target.clone())?);
        map.insert(target, Arc::downgrade(&p));
        Ok(Remote::Single(p))
    }

    pub fn cluster(&self, target: ClusterTarget) -> Result<Remote, String> {
        let mut map = self.cluster.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        if let Some(p) = map.get(&target).and_then(Weak::upgrade) {
            return Ok(Remote::Cluster(p));
        }
        let p = Arc::new(ClusterPool::new(target.clone())?);
        map.insert(target, Arc::downgrade(&p));
        Ok(Remote::Cluster(p))
    }
}
