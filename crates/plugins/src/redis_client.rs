//! The Redis connections of the `redis` and `redis-cluster` policies (limit-count, limit-req,
//! limit-conn): APISIX's `apisix/utils/redis.lua` and `rediscluster.lua`, with the fields of
//! `apisix/utils/redis-schema.lua`.
//!
//! Connections are multiplexed (many requests pipelined on one TCP connection) and pooled per
//! target, shared by every plugin instance that names the same target; their I/O tasks run on
//! one dedicated thread, so a connection outlives the worker runtime that first needed it and
//! any worker can use any connection. Cluster clients route by hash slot and follow
//! `MOVED`/`ASK`, refreshing their slot map (the `redis` crate).
//!
//! Every operation is bounded by `redis_timeout` twice at most, as APISIX's
//! `set_timeouts(timeout, timeout, timeout)` bounds connecting and then answering: getting a
//! connection (waiting for another request's connect included) within one, the command (all
//! its round trips: a script sent by SHA and loaded on `NOSCRIPT` takes up to three) within the
//! other.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, FromRedisValue,
    RedisConnectionInfo, ScriptInvocation,
};
use serde_json::{Map, Value};

/// Connections per single-node target; each multiplexes any number of requests.
const MAX_CONNECTIONS: usize = 4;

/// The thread that runs every Redis connection's I/O.
pub fn io_runtime() -> Result<&'static tokio::runtime::Handle, String> {
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

/// Runs `fut` on the Redis thread, detached from the caller: it completes even if whoever
/// spawned it goes away (limit-conn's releases, and its increments whose request was
/// abandoned mid-flight).
pub fn spawn<F>(fut: F) -> Result<tokio::task::JoinHandle<F::Output>, String>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    Ok(io_runtime()?.spawn(fut))
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

/// The target a plugin conf names, from the fields of `apisix/utils/redis-schema.lua`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    Single(SingleTarget),
    Cluster(ClusterTarget),
}

fn str_field<'a>(c: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    c.get(name).and_then(Value::as_str)
}

fn u64_field(c: &Map<String, Value>, name: &str, default: u64) -> u64 {
    c.get(name).and_then(Value::as_u64).unwrap_or(default)
}

fn bool_field(c: &Map<String, Value>, name: &str, default: bool) -> bool {
    c.get(name).and_then(Value::as_bool).unwrap_or(default)
}

impl Target {
    /// The target of `policy` (`redis` or `redis-cluster`) in conf `c`; `None` for any other
    /// policy.
    pub fn from_conf(policy: &str, c: &Map<String, Value>) -> Result<Option<Target>, String> {
        let timeout_ms = u64_field(c, "redis_timeout", 1000);
        let password = str_field(c, "redis_password").map(str::to_owned);
        Ok(Some(match policy {
            "redis" => Target::Single(SingleTarget {
                host: str_field(c, "redis_host")
                    .ok_or("redis_host is missing")?
                    .to_owned(),
                port: u64_field(c, "redis_port", 6379) as u16,
                username: str_field(c, "redis_username").map(str::to_owned),
                password,
                database: u64_field(c, "redis_database", 0) as i64,
                timeout_ms,
                ssl: bool_field(c, "redis_ssl", false),
                ssl_verify: bool_field(c, "redis_ssl_verify", false),
                pool: u64_field(c, "redis_keepalive_pool", 100) as usize,
            }),
            "redis-cluster" => Target::Cluster(ClusterTarget {
                nodes: c
                    .get("redis_cluster_nodes")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default(),
                name: str_field(c, "redis_cluster_name").unwrap_or("").to_owned(),
                password,
                timeout_ms,
                ssl: bool_field(c, "redis_cluster_ssl", false),
                ssl_verify: bool_field(c, "redis_cluster_ssl_verify", false),
            }),
            _ => return Ok(None),
        }))
    }
}

/// A failed Redis operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteError {
    pub message: String,
    /// The command may have reached the server and run there (a time-out or a connection lost
    /// after sending), so its effect cannot be ruled out.
    pub maybe_applied: bool,
}

impl RemoteError {
    fn before_sending(message: String) -> RemoteError {
        RemoteError {
            message,
            maybe_applied: false,
        }
    }

    fn from_redis(e: &redis::RedisError) -> RemoteError {
        RemoteError {
            message: e.to_string(),
            maybe_applied: e.is_timeout() || e.is_connection_dropped() || e.is_io_error(),
        }
    }

    fn timed_out(timeout: Duration) -> RemoteError {
        RemoteError {
            message: format!("timeout after {} ms", timeout.as_millis()),
            maybe_applied: true,
        }
    }
}

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<RemoteError> for String {
    fn from(e: RemoteError) -> String {
        e.message
    }
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
    fn failed(&self, slot: usize, e: Option<&redis::RedisError>) {
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

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.target.timeout_ms.max(1))
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

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Remote::Single(p) => write!(f, "Remote({}:{})", p.target.host, p.target.port),
            Remote::Cluster(p) => write!(f, "RemoteCluster({})", p.target.name),
        }
    }
}

/// Runs one command-like call on a remote within the time limits, with the connection
/// bookkeeping.
macro_rules! on_remote {
    ($remote:expr, |$c:ident| $call:expr) => {{
        let t = $remote.timeout();
        match $remote {
            Remote::Single(p) => {
                let (slot, mut conn) = tokio::time::timeout(t, p.connection())
                    .await
                    .map_err(|_| {
                        RemoteError::before_sending(format!(
                            "timeout connecting to redis after {} ms",
                            t.as_millis()
                        ))
                    })?
                    .map_err(RemoteError::before_sending)?;
                let $c = &mut conn;
                match tokio::time::timeout(t, $call).await {
                    Ok(Ok(v)) => Ok(v),
                    Ok(Err(e)) => {
                        p.failed(slot, Some(&e));
                        Err(RemoteError::from_redis(&e))
                    }
                    Err(_) => {
                        p.failed(slot, None);
                        Err(RemoteError::timed_out(t))
                    }
                }
            }
            Remote::Cluster(p) => {
                let mut conn = tokio::time::timeout(t, p.connection())
                    .await
                    .map_err(|_| {
                        RemoteError::before_sending(format!(
                            "timeout connecting to redis cluster after {} ms",
                            t.as_millis()
                        ))
                    })?
                    .map_err(RemoteError::before_sending)?;
                let $c = &mut conn;
                match tokio::time::timeout(t, $call).await {
                    Ok(Ok(v)) => Ok(v),
                    Ok(Err(e)) => Err(RemoteError::from_redis(&e)),
                    Err(_) => Err(RemoteError::timed_out(t)),
                }
            }
        }
    }};
}

impl Remote {
    /// `redis_timeout`.
    pub fn timeout(&self) -> Duration {
        match self {
            Remote::Single(p) => p.timeout(),
            Remote::Cluster(p) => p.timeout(),
        }
    }

    /// Runs a script: by SHA (`EVALSHA`), loading it on `NOSCRIPT`.
    pub async fn invoke<T: FromRedisValue>(
        &self,
        script: &ScriptInvocation<'_>,
    ) -> Result<T, RemoteError> {
        on_remote!(self, |c| script.invoke_async(c))
    }

    /// Runs one command.
    pub async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, RemoteError> {
        on_remote!(self, |c| cmd.query_async(c))
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
    /// The pool of `target`, shared with every other plugin instance naming it.
    pub fn get(&self, target: Target) -> Result<Remote, String> {
        match target {
            Target::Single(t) => self.single(t),
            Target::Cluster(t) => self.cluster(t),
        }
    }

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

/// A throwaway `redis-server` for unit tests: started on a free port when the binary is on the
/// PATH, killed on drop. The end-to-end tests install it; unit tests skip without it.
#[cfg(test)]
pub(crate) mod test_server {
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    pub struct TestRedis {
        child: Child,
        pub port: u16,
    }

    impl Drop for TestRedis {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    impl TestRedis {
        /// `None` (after saying so) when there is no `redis-server` to run.
        pub fn start() -> Option<TestRedis> {
            for _ in 0..3 {
                let port = std::net::TcpListener::bind("127.0.0.1:0")
                    .ok()?
                    .local_addr()
                    .ok()?
                    .port();
                let Ok(child) = Command::new("redis-server")
                    .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args(["--save", "", "--appendonly", "no"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                else {
                    eprintln!("SKIPPED: no redis-server on the PATH");
                    return None;
                };
                let mut r = TestRedis { child, port };
                let deadline = Instant::now() + Duration::from_secs(10);
                while Instant::now() < deadline {
                    if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                        return Some(r);
                    }
                    if let Ok(Some(_)) = r.child.try_wait() {
                        // The port was taken meanwhile: try another.
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            panic!("redis-server did not start");
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn targets_from_conf() {
        let c = json!({"redis_host": "10.0.0.1", "redis_password": "p", "redis_username": "u",
            "redis_database": 2, "redis_timeout": 50, "redis_ssl": true});
        let Some(Target::Single(t)) = Target::from_conf("redis", c.as_object().unwrap()).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            t,
            SingleTarget {
                host: "10.0.0.1".into(),
                port: 6379,
                username: Some("u".into()),
                password: Some("p".into()),
                database: 2,
                timeout_ms: 50,
                ssl: true,
                ssl_verify: false,
                pool: 100,
            }
        );
        let c = json!({"redis_cluster_nodes": ["a:1", "b:2"], "redis_cluster_name": "n"});
        let Some(Target::Cluster(t)) =
            Target::from_conf("redis-cluster", c.as_object().unwrap()).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (t.nodes.len(), t.name.as_str(), t.timeout_ms),
            (2, "n", 1000)
        );
        assert_eq!(Target::from_conf("local", &Map::new()).unwrap(), None);
        assert!(Target::from_conf("redis", &Map::new()).is_err());
    }

    #[tokio::test]
    async fn same_target_same_pool() {
        let remotes = Remotes::default();
        let c = json!({"redis_host": "127.0.0.1"});
        let t = Target::from_conf("redis", c.as_object().unwrap())
            .unwrap()
            .unwrap();
        let (Remote::Single(a), Remote::Single(b)) =
            (remotes.get(t.clone()).unwrap(), remotes.get(t).unwrap())
        else {
            panic!()
        };
        assert!(Arc::ptr_eq(&a, &b));
    }

    /// A server that accepts and never answers: the operation fails within the time limits
    /// (each is `redis_timeout`), and says the command may have run.
    #[tokio::test]
    async fn silent_server_times_out() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let _hold = std::thread::spawn(move || {
            let mut held = Vec::new();
            for s in listener.incoming().flatten() {
                held.push(s);
            }
        });
        let c = json!({"redis_host": "127.0.0.1", "redis_port": port, "redis_timeout": 100});
        let remote = Remotes::default()
            .get(
                Target::from_conf("redis", c.as_object().unwrap())
                    .unwrap()
                    .unwrap(),
            )
            .unwrap();
        // The outer limit only catches a hang; the time-outs are what end the call.
        let e = tokio::time::timeout(
            Duration::from_secs(30),
            remote.query::<String>(&redis::cmd("PING")),
        )
        .await
        .expect("bounded by redis_timeout")
        .unwrap_err();
        assert!(!e.message.is_empty());
    }
}
