//! The Redis connections of the `redis`, `redis-cluster` and `redis-sentinel` policies
//! (limit-count, limit-req, limit-conn): APISIX's `apisix/utils/redis.lua`, `rediscluster.lua`
//! and `limit-count/util.lua` `redis_cli_sentinel`, with the fields of
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

/// Where a `redis-sentinel` policy connects: the master (or a replica) that the sentinels name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SentinelTarget {
    /// Asked in this order.
    pub sentinels: Vec<(String, u16)>,
    pub master_name: String,
    /// `master`, or `slave`: a healthy replica picked at random.
    pub role: String,
    pub username: Option<String>,
    pub password: Option<String>,
    pub sentinel_username: Option<String>,
    pub sentinel_password: Option<String>,
    pub database: i64,
    pub connect_timeout_ms: u64,
    pub read_timeout_ms: u64,
}

/// The target a plugin conf names, from the fields of `apisix/utils/redis-schema.lua`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    Single(SingleTarget),
    Cluster(ClusterTarget),
    Sentinel(SentinelTarget),
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
    /// The target of `policy` (`redis`, `redis-cluster` or `redis-sentinel`) in conf `c`;
    /// `None` for any other policy.
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
            "redis-sentinel" => Target::Sentinel(SentinelTarget {
                sentinels: c
                    .get("redis_sentinels")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|s| {
                                Some((
                                    s.get("host")?.as_str()?.to_owned(),
                                    s.get("port")?.as_u64()? as u16,
                                ))
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                master_name: str_field(c, "redis_master_name")
                    .ok_or("redis_master_name is missing")?
                    .to_owned(),
                role: str_field(c, "redis_role").unwrap_or("master").to_owned(),
                username: str_field(c, "redis_username").map(str::to_owned),
                password,
                sentinel_username: str_field(c, "sentinel_username").map(str::to_owned),
                sentinel_password: str_field(c, "sentinel_password").map(str::to_owned),
                database: u64_field(c, "redis_database", 0) as i64,
                connect_timeout_ms: u64_field(c, "redis_connect_timeout", 1000),
                read_timeout_ms: u64_field(c, "redis_read_timeout", 1000),
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
    /// `redis_timeout`, or a sentinel target's `redis_connect_timeout`.
    connect_timeout: Duration,
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
            connect_timeout: Duration::from_millis(target.timeout_ms.max(1)),
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
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.timeout()));
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

/// Asks one sentinel where `t`'s master (or, for `redis_role: slave`, a healthy replica) is,
/// within `redis_connect_timeout` to connect and `redis_read_timeout` per answer.
async fn ask_sentinel(t: &SentinelTarget, host: &str, port: u16) -> Result<(String, u16), String> {
    let mut settings = RedisConnectionInfo::default();
    if let Some(p) = t.sentinel_password.as_deref().filter(|p| !p.is_empty()) {
        settings = settings.set_password(p);
        if let Some(u) = &t.sentinel_username {
            settings = settings.set_username(u);
        }
    }
    let info =
        redis::IntoConnectionInfo::into_connection_info(ConnectionAddr::Tcp(host.to_owned(), port))
            .map(|i: ConnectionInfo| i.set_redis_settings(settings))
            .map_err(|e| e.to_string())?;
    let client = redis::Client::open(info).map_err(|e| e.to_string())?;
    let (ct, rt) = (
        Duration::from_millis(t.connect_timeout_ms.max(1)),
        Duration::from_millis(t.read_timeout_ms.max(1)),
    );
    let cfg = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(ct))
        .set_response_timeout(Some(rt));
    let mut conn = tokio::time::timeout(
        ct + rt,
        client.get_multiplexed_async_connection_with_config(&cfg),
    )
    .await
    .map_err(|_| format!("timeout connecting to sentinel {host}:{port}"))?
    .map_err(|e| format!("sentinel {host}:{port}: {e}"))?;
    if t.role == "slave" {
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("slaves").arg(&t.master_name);
        let replicas: Vec<HashMap<String, String>> =
            tokio::time::timeout(rt, cmd.query_async(&mut conn))
                .await
                .map_err(|_| format!("timeout reading from sentinel {host}:{port}"))?
                .map_err(|e| format!("sentinel {host}:{port}: {e}"))?;
        // lua-resty-redis-connector's choice: a replica whose link to the master is up, at
        // random.
        let healthy: Vec<(String, u16)> = replicas
            .iter()
            .filter(|r| r.get("master-link-status").map(String::as_str) == Some("ok"))
            .filter_map(|r| Some((r.get("ip")?.clone(), r.get("port")?.parse().ok()?)))
            .collect();
        if healthy.is_empty() {
            return Err(format!("no slaves for {}", t.master_name));
        }
        let i = rand::random::<usize>() % healthy.len();
        return Ok(healthy[i].clone());
    }
    let mut cmd = redis::cmd("SENTINEL");
    cmd.arg("get-master-addr-by-name").arg(&t.master_name);
    let addr: Option<(String, u16)> = tokio::time::timeout(rt, cmd.query_async(&mut conn))
        .await
        .map_err(|_| format!("timeout reading from sentinel {host}:{port}"))?
        .map_err(|e| format!("sentinel {host}:{port}: {e}"))?;
    addr.ok_or_else(|| format!("invalid master name {}", t.master_name))
}

/// The sentinels asked in order until one names the master; the error lists every failure, as
/// APISIX's `redis_cli_sentinel` reports the connector's previous errors.
async fn resolve_master(t: &SentinelTarget) -> Result<(String, u16), String> {
    let mut errors = Vec::new();
    for (host, port) in &t.sentinels {
        match ask_sentinel(t, host, *port).await {
            Ok(addr) => return Ok(addr),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        errors.push("no sentinels".to_owned());
    }
    Err(format!(
        "redis connection failed, err: {}",
        errors.join(", ")
    ))
}

/// Whether a failure says the resolved master is no longer the place to write: the connection
/// is gone, or the server answers as a replica / without its master (a failover under way).
fn master_lost(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
        || e.is_timeout()
        || not_run(e)
}

/// Whether the server refused the command without running it: it is a replica now, has lost
/// its master, is loading, refused the connection, or had closed it before the command went.
fn not_run(e: &redis::RedisError) -> bool {
    let text = e.to_string();
    e.is_connection_refusal()
        // A pipe already closed (the sentinels kill a demoted master's clients): the command
        // never left; the redis crate only says so in words.
        || (e.is_connection_dropped() && text.to_ascii_lowercase().contains("broken pipe"))
        || ["READONLY", "MASTERDOWN", "LOADING"]
            .iter()
            // A script's error may carry the code inside its message.
            .any(|code| e.code() == Some(code) || text.contains(code))
}

/// The connections of a `redis-sentinel` target: a [`SinglePool`] to the address the sentinels
/// named, kept until it fails as [`master_lost`] says, then resolved again.
/// APISIX asks the sentinels on every request; ferrisix keeps the answer until a failure shows
/// it stale, which follows a failover the same way without a sentinel round trip per request.
pub struct SentinelPool {
    target: SentinelTarget,
    current: ArcSwapOption<SinglePool>,
    /// Serialises resolving so a burst asks the sentinels once.
    resolving: tokio::sync::Mutex<()>,
}

impl SentinelPool {
    fn new(target: SentinelTarget) -> SentinelPool {
        SentinelPool {
            target,
            current: ArcSwapOption::empty(),
            resolving: tokio::sync::Mutex::new(()),
        }
    }

    fn read_timeout(&self) -> Duration {
        Duration::from_millis(self.target.read_timeout_ms.max(1))
    }

    fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.target.connect_timeout_ms.max(1))
    }

    /// The pool of the current master, asking the sentinels when there is none.
    async fn pool(&self) -> Result<Arc<SinglePool>, String> {
        if let Some(p) = self.current.load_full() {
            return Ok(p);
        }
        let _guard = self.resolving.lock().await;
        if let Some(p) = self.current.load_full() {
            return Ok(p);
        }
        let t = self.target.clone();
        let (host, port) = io_runtime()?
            .spawn(async move { resolve_master(&t).await })
            .await
            .map_err(|e| format!("redis sentinel task: {e}"))??;
        let mut pool = SinglePool::new(SingleTarget {
            host,
            port,
            username: self.target.username.clone(),
            password: self.target.password.clone(),
            database: self.target.database,
            timeout_ms: self.target.read_timeout_ms,
            ssl: false,
            ssl_verify: false,
            pool: MAX_CONNECTIONS,
        })?;
        pool.connect_timeout = self.connect_timeout();
        let pool = Arc::new(pool);
        self.current.store(Some(pool.clone()));
        Ok(pool)
    }

    /// Drops `pool` (when it is still the current one) so the next request asks the sentinels.
    fn forget(&self, pool: &Arc<SinglePool>) {
        let cur = self.current.load();
        if cur.as_ref().is_some_and(|c| Arc::ptr_eq(c, pool)) {
            self.current.compare_and_swap(&cur, None);
        }
    }
}

/// A Redis backend of one plugin instance.
#[derive(Clone)]
pub enum Remote {
    Single(Arc<SinglePool>),
    Cluster(Arc<ClusterPool>),
    Sentinel(Arc<SentinelPool>),
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Remote::Single(p) => write!(f, "Remote({}:{})", p.target.host, p.target.port),
            Remote::Cluster(p) => write!(f, "RemoteCluster({})", p.target.name),
            Remote::Sentinel(p) => write!(f, "RemoteSentinel({})", p.target.master_name),
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
            Remote::Sentinel(s) => {
                // A failure that shows the master moved, with the command surely not run, is
                // tried once more on the master the sentinels name now: APISIX asks them on
                // every request, so a failover costs it no failed request either.
                let mut retried = false;
                loop {
                    // Asking the sentinels is bounded by their own time-outs, each sentinel's.
                    let p = s.pool().await.map_err(RemoteError::before_sending)?;
                    let ct = s.connect_timeout();
                    let (slot, mut conn) = match tokio::time::timeout(ct, p.connection()).await {
                        Ok(Ok(c)) => c,
                        failed => {
                            s.forget(&p);
                            if !retried {
                                retried = true;
                                continue;
                            }
                            break Err(RemoteError::before_sending(match failed {
                                Ok(Err(e)) => e,
                                _ => format!(
                                    "timeout connecting to redis after {} ms",
                                    ct.as_millis()
                                ),
                            }));
                        }
                    };
                    let $c = &mut conn;
                    match tokio::time::timeout(t, $call).await {
                        Ok(Ok(v)) => break Ok(v),
                        Ok(Err(e)) => {
                            p.failed(slot, Some(&e));
                            if master_lost(&e) {
                                s.forget(&p);
                                if !retried && not_run(&e) {
                                    retried = true;
                                    continue;
                                }
                            }
                            break Err(RemoteError::from_redis(&e));
                        }
                        Err(_) => {
                            p.failed(slot, None);
                            s.forget(&p);
                            break Err(RemoteError::timed_out(t));
                        }
                    }
                }
            }
        }
    }};
}

impl Remote {
    /// `redis_timeout`, or a sentinel target's `redis_read_timeout`.
    pub fn timeout(&self) -> Duration {
        match self {
            Remote::Single(p) => p.timeout(),
            Remote::Cluster(p) => p.timeout(),
            Remote::Sentinel(p) => p.read_timeout(),
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
    sentinel: Mutex<HashMap<SentinelTarget, Weak<SentinelPool>>>,
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
            Target::Sentinel(t) => Ok(self.sentinel(t)),
        }
    }

    pub fn sentinel(&self, target: SentinelTarget) -> Remote {
        let mut map = self.sentinel.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        if let Some(p) = map.get(&target).and_then(Weak::upgrade) {
            return Remote::Sentinel(p);
        }
        let p = Arc::new(SentinelPool::new(target.clone()));
        map.insert(target, Arc::downgrade(&p));
        Remote::Sentinel(p)
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
    /// A `redis-server --sentinel` watching the master at `master_port` under the name `m`,
    /// killed (and its config file removed) on drop.
    pub struct TestSentinel {
        child: Child,
        pub port: u16,
        conf: std::path::PathBuf,
    }

    impl Drop for TestSentinel {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_file(&self.conf);
        }
    }

    impl TestSentinel {
        pub fn start(master_port: u16) -> TestSentinel {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            // Sentinel rewrites its config file, so each one needs its own.
            let conf = std::env::temp_dir().join(format!(
                "ferrisix-sentinel-{}-{port}.conf",
                std::process::id()
            ));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\nsentinel monitor m 127.0.0.1 {master_port} 1\n"
                ),
            )
            .expect("sentinel config");
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server --sentinel");
            let s = TestSentinel { child, port, conf };
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(Instant::now() < deadline, "sentinel did not start");
                std::thread::sleep(Duration::from_millis(20));
            }
            s
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

    #[test]
    fn sentinel_target_from_conf() {
        let c = json!({"redis_sentinels": [{"host": "10.0.0.1", "port": 26379},
            {"host": "10.0.0.2", "port": 26380}], "redis_master_name": "mymaster",
            "redis_password": "p", "sentinel_password": "sp", "redis_database": 3,
            "redis_connect_timeout": 20, "redis_read_timeout": 30});
        let Some(Target::Sentinel(t)) =
            Target::from_conf("redis-sentinel", c.as_object().unwrap()).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            t,
            SentinelTarget {
                sentinels: vec![("10.0.0.1".into(), 26379), ("10.0.0.2".into(), 26380)],
                master_name: "mymaster".into(),
                role: "master".into(),
                username: None,
                password: Some("p".into()),
                sentinel_username: None,
                sentinel_password: Some("sp".into()),
                database: 3,
                connect_timeout_ms: 20,
                read_timeout_ms: 30,
            }
        );
        let c = json!({"redis_sentinels": []});
        assert!(Target::from_conf("redis-sentinel", c.as_object().unwrap()).is_err());
    }

    fn sentinel_remote(sentinel_ports: &[u16], master_name: &str, timeout_ms: u64) -> Remote {
        let sentinels: Vec<Value> = sentinel_ports
            .iter()
            .map(|p| json!({"host": "127.0.0.1", "port": p}))
            .collect();
        let c = json!({"redis_sentinels": sentinels, "redis_master_name": master_name,
            "redis_connect_timeout": timeout_ms, "redis_read_timeout": timeout_ms});
        Remotes::default()
            .get(
                Target::from_conf("redis-sentinel", c.as_object().unwrap())
                    .unwrap()
                    .unwrap(),
            )
            .unwrap()
    }

    fn dead_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// The sentinels are asked in order: a dead one is passed over, the next names the master,
    /// and commands run there.
    #[tokio::test]
    async fn sentinel_names_the_master() {
        let Some(master) = test_server::TestRedis::start() else {
            return;
        };
        let sentinel = test_server::TestSentinel::start(master.port);
        let remote = sentinel_remote(&[dead_port(), sentinel.port], "m", 1000);
        let mut incr = redis::cmd("INCR");
        incr.arg("sentinel-test");
        assert_eq!(remote.query::<i64>(&incr).await.unwrap(), 1);
        assert_eq!(remote.query::<i64>(&incr).await.unwrap(), 2);
        let Remote::Sentinel(s) = &remote else {
            panic!()
        };
        assert_eq!(s.pool().await.unwrap().target.port, master.port);

        // A name no sentinel knows is an error naming it, after every sentinel was asked.
        let e = sentinel_remote(&[sentinel.port], "nope", 1000)
            .query::<i64>(&incr)
            .await
            .unwrap_err();
        assert!(e.message.contains("invalid master name nope"), "{e}");
        assert!(!e.maybe_applied);
    }

    /// No sentinel answers: an error listing each one's failure, within their time-outs.
    #[tokio::test]
    async fn no_sentinel_answers() {
        let remote = sentinel_remote(&[dead_port(), dead_port()], "m", 100);
        let e = tokio::time::timeout(
            Duration::from_secs(10),
            remote.query::<String>(&redis::cmd("PING")),
        )
        .await
        .expect("bounded by the sentinels' time-outs")
        .unwrap_err();
        assert!(e.message.starts_with("redis connection failed"), "{e}");
        assert_eq!(e.message.matches("sentinel 127.0.0.1:").count(), 2, "{e}");
    }

    /// The resolved server turns into a replica (a failover demoting it): the write it refuses
    /// with READONLY is retried on the master the sentinels name now.
    #[tokio::test]
    async fn readonly_master_is_resolved_again() {
        let Some(a) = test_server::TestRedis::start() else {
            return;
        };
        let b = test_server::TestRedis::start().unwrap();
        let sentinel = test_server::TestSentinel::start(a.port);
        let remote = sentinel_remote(&[sentinel.port], "m", 1000);
        let mut incr = redis::cmd("INCR");
        incr.arg("k");
        assert_eq!(remote.query::<i64>(&incr).await.unwrap(), 1);
        // `a` follows `b`, and the sentinel is told `b` is the master now.
        let cli = |port: u16, args: &[&str]| {
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
            let mut c = client.get_connection().unwrap();
            let mut cmd = redis::cmd(args[0]);
            for a in &args[1..] {
                cmd.arg(*a);
            }
            cmd.query::<redis::Value>(&mut c).unwrap();
        };
        cli(a.port, &["REPLICAOF", "127.0.0.1", &b.port.to_string()]);
        cli(sentinel.port, &["SENTINEL", "REMOVE", "m"]);
        cli(
            sentinel.port,
            &[
                "SENTINEL",
                "MONITOR",
                "m",
                "127.0.0.1",
                &b.port.to_string(),
                "1",
            ],
        );
        assert_eq!(remote.query::<i64>(&incr).await.unwrap(), 1);
        let Remote::Sentinel(s) = &remote else {
            panic!()
        };
        assert_eq!(s.pool().await.unwrap().target.port, b.port);
    }
}
