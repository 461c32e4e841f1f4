//! The `redis-sentinel` policy's connections: the master (or a replica) the sentinels name,
//! resolved again when a failure shows the answer stale.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use ferrisix_plugin_api::Executor;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, RedisConnectionInfo};

use super::single::{SinglePool, MAX_CONNECTIONS};
use super::{SentinelTarget, SingleTarget};

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
pub(crate) fn master_lost(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
        || e.is_timeout()
        || not_run(e)
}

/// Whether the server refused the command without running it: it is a replica now, has lost
/// its master, is loading, refused the connection, or had closed it before the command went.
pub(crate) fn not_run(e: &redis::RedisError) -> bool {
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
/// named, kept until it fails as `master_lost` says, then resolved again.
/// APISIX asks the sentinels on every request; ferrisix keeps the answer until a failure shows
/// it stale, which follows a failover the same way without a sentinel round trip per request.
pub struct SentinelPool {
    pub(crate) target: SentinelTarget,
    pub(crate) executor: Executor,
    current: ArcSwapOption<SinglePool>,
    /// Serialises resolving so a burst asks the sentinels once.
    resolving: tokio::sync::Mutex<()>,
}

impl SentinelPool {
    pub(crate) fn new(target: SentinelTarget, executor: Executor) -> SentinelPool {
        SentinelPool {
            target,
            executor,
            current: ArcSwapOption::empty(),
            resolving: tokio::sync::Mutex::new(()),
        }
    }

    pub(crate) fn read_timeout(&self) -> Duration {
        Duration::from_millis(self.target.read_timeout_ms.max(1))
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.target.connect_timeout_ms.max(1))
    }

    /// The pool of the current master, asking the sentinels when there is none.
    pub(crate) async fn pool(&self) -> Result<Arc<SinglePool>, String> {
        if let Some(p) = self.current.load_full() {
            return Ok(p);
        }
        let _guard = self.resolving.lock().await;
        if let Some(p) = self.current.load_full() {
            return Ok(p);
        }
        let t = self.target.clone();
        let (host, port) = self
            .executor
            .spawn(async move { resolve_master(&t).await })?
            .await
            .map_err(|e| format!("redis sentinel task: {e}"))??;
        let mut pool = SinglePool::new(
            SingleTarget {
                host,
                port,
                username: self.target.username.clone(),
                password: self.target.password.clone(),
                database: self.target.database,
                timeout_ms: self.target.read_timeout_ms,
                ssl: false,
                ssl_verify: false,
                pool: MAX_CONNECTIONS,
            },
            self.executor.clone(),
        )?;
        pool.connect_timeout = self.connect_timeout();
        let pool = Arc::new(pool);
        self.current.store(Some(pool.clone()));
        Ok(pool)
    }

    /// Drops `pool` (when it is still the current one) so the next request asks the sentinels.
    pub(crate) fn forget(&self, pool: &Arc<SinglePool>) {
        let cur = self.current.load();
        if cur.as_ref().is_some_and(|c| Arc::ptr_eq(c, pool)) {
            self.current.compare_and_swap(&cur, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{json, Value};

    use super::super::test_server::{self, free_port};
    use super::super::{RedisPools, Remote, Target};
    use ferrisix_plugin_api::Executor;

    fn sentinel_remote(sentinel_ports: &[u16], master_name: &str, timeout_ms: u64) -> Remote {
        let sentinels: Vec<Value> = sentinel_ports
            .iter()
            .map(|p| json!({"host": "127.0.0.1", "port": p}))
            .collect();
        let c = json!({"redis_sentinels": sentinels, "redis_master_name": master_name,
            "redis_connect_timeout": timeout_ms, "redis_read_timeout": timeout_ms});
        RedisPools::new(Executor::current())
            .get(
                Target::from_conf("redis-sentinel", c.as_object().unwrap())
                    .unwrap()
                    .unwrap(),
            )
            .unwrap()
    }

    /// The sentinels are asked in order: a dead one is passed over, the next names the master,
    /// and commands run there.
    #[tokio::test]
    async fn sentinel_names_the_master() {
        let master = test_server::TestRedis::start();
        let sentinel = test_server::TestSentinel::start(master.port);
        let remote = sentinel_remote(&[free_port(), sentinel.port], "m", 1000);
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
        let remote = sentinel_remote(&[free_port(), free_port()], "m", 100);
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
        let a = test_server::TestRedis::start();
        let b = test_server::TestRedis::start();
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
