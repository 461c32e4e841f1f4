//! The Redis connections of the `redis`, `redis-cluster` and `redis-sentinel` policies shared by
//! limit-count, limit-req and limit-conn: APISIX's `apisix/utils/redis.lua`,
//! `rediscluster.lua` and `limit-count/util.lua` `redis_cli_sentinel`, with the fields and
//! schemas of `apisix/utils/redis-schema.lua`.
//!
//! Connections are multiplexed (many requests pipelined on one TCP connection) and pooled per
//! target ([`single`], [`cluster`], [`sentinel`]), shared by every plugin instance of one
//! gateway that names the same target ([`RedisPools`]). Their I/O tasks run on the gateway's
//! background [`Executor`], so a connection outlives the worker runtime that first needed it
//! and any worker can use any connection. Cluster clients route by hash slot and follow
//! `MOVED`/`ASK`, refreshing their slot map (the `redis` crate).
//!
//! Every operation is bounded by `redis_timeout` twice at most, as APISIX's
//! `set_timeouts(timeout, timeout, timeout)` bounds connecting and then answering: getting a
//! connection (waiting for another request's connect included) within one, the command (all
//! its round trips: a script sent by SHA and loaded on `NOSCRIPT` takes up to three) within the
//! other.

pub mod cluster;
pub mod sentinel;
pub mod single;
#[cfg(test)]
pub(crate) mod test_server;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use ferrisix_plugin_api::{Executor, PluginServices, SharedState};
use redis::{Cmd, FromRedisValue, ScriptInvocation};
use serde_json::{json, Map, Value};

use cluster::ClusterPool;
use sentinel::{master_lost, not_run, SentinelPool};
use single::SinglePool;

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

/// A connection from `connect` within `t`; a failure or the time-out (naming `what`) is an
/// error before anything was sent.
async fn connect_within<C>(
    t: Duration,
    what: &str,
    connect: impl Future<Output = Result<C, String>>,
) -> Result<C, RemoteError> {
    tokio::time::timeout(t, connect)
        .await
        .map_err(|_| {
            RemoteError::before_sending(format!(
                "timeout connecting to {what} after {} ms",
                t.as_millis()
            ))
        })?
        .map_err(RemoteError::before_sending)
}

/// Runs one command-like call on a remote within the time limits, with the connection
/// bookkeeping.
macro_rules! on_remote {
    ($remote:expr, |$c:ident| $call:expr) => {{
        let t = $remote.timeout();
        match $remote {
            Remote::Single(p) => {
                let (slot, mut conn) = connect_within(t, "redis", p.connection()).await?;
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
                let mut conn = connect_within(t, "redis cluster", p.connection()).await?;
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

impl Remote {
    /// Runs `fut` on the gateway's background executor, detached from the caller: it completes
    /// even if whoever spawned it goes away (limit-conn's releases, and its increments whose
    /// request was abandoned mid-flight).
    pub fn spawn<F>(&self, fut: F) -> Result<tokio::task::JoinHandle<F::Output>, String>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let executor = match self {
            Remote::Single(p) => &p.executor,
            Remote::Cluster(p) => &p.executor,
            Remote::Sentinel(p) => &p.executor,
        };
        executor.spawn(fut)
    }
}

/// Every Redis pool of one gateway, shared by the plugin instances that use the same target.
pub struct RedisPools {
    executor: Executor,
    single: Mutex<HashMap<SingleTarget, Weak<SinglePool>>>,
    cluster: Mutex<HashMap<ClusterTarget, Weak<ClusterPool>>>,
    sentinel: Mutex<HashMap<SentinelTarget, Weak<SentinelPool>>>,
}

impl std::fmt::Debug for RedisPools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedisPools")
    }
}

impl RedisPools {
    /// Pools whose connections run their I/O on `executor`.
    pub fn new(executor: Executor) -> RedisPools {
        RedisPools {
            executor,
            single: Mutex::default(),
            cluster: Mutex::default(),
            sentinel: Mutex::default(),
        }
    }

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
        let p = Arc::new(SentinelPool::new(target.clone(), self.executor.clone()));
        map.insert(target, Arc::downgrade(&p));
        Remote::Sentinel(p)
    }

    pub fn single(&self, target: SingleTarget) -> Result<Remote, String> {
        let mut map = self.single.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        if let Some(p) = map.get(&target).and_then(Weak::upgrade) {
            return Ok(Remote::Single(p));
        }
        let p = Arc::new(SinglePool::new(target.clone(), self.executor.clone())?);
        map.insert(target, Arc::downgrade(&p));
        Ok(Remote::Single(p))
    }

    pub fn cluster(&self, target: ClusterTarget) -> Result<Remote, String> {
        let mut map = self.cluster.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        if let Some(p) = map.get(&target).and_then(Weak::upgrade) {
            return Ok(Remote::Cluster(p));
        }
        let p = Arc::new(ClusterPool::new(target.clone(), self.executor.clone())?);
        map.insert(target, Arc::downgrade(&p));
        Ok(Remote::Cluster(p))
    }
}

/// The Redis pool of a conf's `redis` / `redis-cluster` / `redis-sentinel` policy, `None` for
/// `local`.
pub fn policy_remote(
    plugin: &str,
    c: &Map<String, Value>,
    services: &PluginServices,
) -> Result<Option<Remote>, String> {
    let policy = c.get("policy").and_then(Value::as_str).unwrap_or("local");
    match Target::from_conf(policy, c)? {
        Some(target) => services.shared::<RedisPools>().get(target).map(Some),
        None if policy == "local" => Ok(None),
        None => Err(format!("{plugin} policy \"{policy}\" is not supported")),
    }
}

impl SharedState for RedisPools {
    fn create(services: &PluginServices) -> Self {
        RedisPools::new(services.executor().clone())
    }
}

/// The extra properties of the `redis`, `redis-cluster` and `redis-sentinel` policies
/// (apisix/utils/redis-schema.lua, limit-count/init.lua).
pub fn policy_schemas() -> (Value, Value, Value) {
    let keepalive = json!({
        "redis_keepalive_timeout": {"type": "integer", "minimum": 1000, "default": 10000},
        "redis_keepalive_pool": {"type": "integer", "minimum": 1, "default": 100}
    });
    let with_keepalive = |mut v: Value| {
        if let (Some(m), Some(k)) = (v.as_object_mut(), keepalive.as_object()) {
            m.extend(k.clone());
        }
        v
    };
    let redis = with_keepalive(json!({
        "redis_host": {"type": "string", "minLength": 2},
        "redis_port": {"type": "integer", "minimum": 1, "default": 6379},
        "redis_username": {"type": "string", "minLength": 1},
        "redis_password": {"type": "string", "minLength": 0},
        "redis_database": {"type": "integer", "minimum": 0, "default": 0},
        "redis_timeout": {"type": "integer", "minimum": 1, "default": 1000},
        "redis_ssl": {"type": "boolean", "default": false},
        "redis_ssl_verify": {"type": "boolean", "default": false}
    }));
    let cluster = with_keepalive(json!({
        "redis_cluster_nodes": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "string", "minLength": 2, "maxLength": 100}
        },
        "redis_password": {"type": "string", "minLength": 0},
        "redis_timeout": {"type": "integer", "minimum": 1, "default": 1000},
        "redis_cluster_name": {"type": "string"},
        "redis_cluster_ssl": {"type": "boolean", "default": false},
        "redis_cluster_ssl_verify": {"type": "boolean", "default": false}
    }));
    let sentinel = json!({
        "properties": {
            "redis_sentinels": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {
                        "host": {"type": "string", "minLength": 2},
                        "port": {"type": "integer", "minimum": 1, "maximum": 65535}
                    },
                    "required": ["host", "port"],
                    "additionalProperties": false
                }
            },
            "redis_master_name": {"type": "string", "minLength": 1},
            "redis_role": {"type": "string", "enum": ["master", "slave"], "default": "master"},
            "redis_connect_timeout": {"type": "integer", "minimum": 1, "default": 1000},
            "redis_read_timeout": {"type": "integer", "minimum": 1, "default": 1000},
            "redis_keepalive_timeout": {"type": "integer", "minimum": 1, "default": 60000},
            "redis_database": {"type": "integer", "minimum": 0, "default": 0},
            "redis_username": {"type": "string", "minLength": 1},
            "redis_password": {"type": "string", "minLength": 0},
            "sentinel_username": {"type": "string", "minLength": 1},
            "sentinel_password": {"type": "string", "minLength": 0}
        },
        "required": ["redis_sentinels", "redis_master_name"]
    });
    (
        json!({"properties": redis, "required": ["redis_host"]}),
        json!({"properties": cluster, "required": ["redis_cluster_nodes", "redis_cluster_name"]}),
        sentinel,
    )
}

/// The `redis` / `redis-cluster` policy clauses of limit-req and limit-conn (their `policy`
/// enum has no sentinel), added to `schema`.
pub fn with_policy_clauses(mut schema: Value) -> Value {
    let (redis, cluster, _) = policy_schemas();
    let clauses = json!({
        "if": {"properties": {"policy": {"enum": ["redis"]}}},
        "then": redis,
        "else": {
            "if": {"properties": {"policy": {"enum": ["redis-cluster"]}}},
            "then": cluster
        }
    });
    if let (Some(m), Value::Object(clauses)) = (schema.as_object_mut(), clauses) {
        m.extend(clauses);
    }
    schema
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
        let remotes = RedisPools::new(Executor::current());
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
        let remote = RedisPools::new(Executor::current())
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
}
