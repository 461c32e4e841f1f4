//! Throwaway Redis servers for the tests of the `redis`, `redis-cluster` and `redis-sentinel`
//! policies: Debian's `redis-server` (which `scripts/test.sh` installs) on random ports, a
//! three-node cluster, a TLS-only server, sentinels (`redis-server --sentinel`), and `redis-cli`
//! to look at what the gateways stored.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::debian::require;
use super::{free_port, poll_until};

/// A redis-server child process, killed on drop.
pub struct Redis {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Panics, naming the package that installs it, when redis-server or redis-cli is missing
/// (`scripts/test.sh` installs both).
pub fn require_redis() {
    require("redis-server");
    require("redis-cli");
}

/// Runs `redis-cli -p <port> <args>` and answers its standard output.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The keys matching `pattern` on the server at `port`.
pub fn redis_keys(port: u16, pattern: &str) -> Vec<String> {
    redis_cli(port, &["--scan", "--pattern", pattern])
        .lines()
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
        .collect()
}

impl Redis {
    /// A plain server, or (`cluster`) a node for [`redis_cluster`].
    pub fn start(cluster: bool) -> Redis {
        let dir = tempfile::tempdir().unwrap();
        // A cluster node also listens on its port + 10000 (the cluster bus).
        let port = if cluster {
            ferrisix_config::test_support::free_port_and(10_000)
        } else {
            free_port()
        };
        let log = std::fs::File::create(dir.path().join("redis.log")).unwrap();
        let mut cmd = Command::new("redis-server");
        cmd.args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir.path());
        if cluster {
            cmd.args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ]);
        }
        let child = cmd
            .stdout(log)
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server");
        let r = Redis {
            child,
            port,
            _dir: dir,
        };
        if poll_until(Duration::from_secs(10), || {
            redis_cli(port, &["ping"]).trim() == "PONG"
        })
        .is_none()
        {
            let log = std::fs::read_to_string(r._dir.path().join("redis.log")).unwrap_or_default();
            panic!("redis-server on port {port} did not start:\n{log}");
        }
        r
    }

    /// `127.0.0.1:<port>`.
    pub fn node(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// A `redis-server --sentinel` child process watching one master, killed on drop.
pub struct Sentinel {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sentinel {
    /// A sentinel watching the master at `master_port` under `name`, with a quorum of one and
    /// a one-second down-after so that a failover is quick.
    pub fn start(master_port: u16, name: &str) -> Sentinel {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        // Sentinel insists on a config file it can rewrite.
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {name} 127.0.0.1 {master_port} 1\n\
                 sentinel down-after-milliseconds {name} 1000\n\
                 sentinel failover-timeout {name} 10000\n",
                dir.path().display()
            ),
        )
        .unwrap();
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server --sentinel");
        let s = Sentinel {
            child,
            port,
            _dir: dir,
        };
        poll_until(Duration::from_secs(10), || {
            redis_cli(port, &["ping"]).trim() == "PONG"
        })
        .expect("sentinel did not start");
        s
    }

    /// The port of the master this sentinel names for `name` now.
    pub fn master_port(&self, name: &str) -> Option<u16> {
        redis_cli(self.port, &["sentinel", "get-master-addr-by-name", name])
            .lines()
            .nth(1)?
            .trim()
            .parse()
            .ok()
    }
}

/// Three cluster nodes, all slots assigned, no replicas.
pub fn redis_cluster() -> Vec<Redis> {
    let nodes: Vec<Redis> = (0..3).map(|_| Redis::start(true)).collect();
    let addrs: Vec<String> = nodes.iter().map(Redis::node).collect();
    let status = Command::new("redis-cli")
        .arg("--cluster")
        .arg("create")
        .args(&addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("redis-cli --cluster create");
    assert!(status.success());
    for n in &nodes {
        poll_until(Duration::from_secs(20), || {
            redis_cli(n.port, &["cluster", "info"]).contains("cluster_state:ok")
        })
        .expect("cluster did not converge");
    }
    nodes
}

/// A TLS-only redis-server with a fresh self-signed certificate; `None` without openssl or a
/// TLS-capable redis-server.
pub fn redis_tls() -> Redis {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let made = Command::new(require("openssl"))
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=redis-test",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(made, "openssl made no certificate for the TLS redis-server");
    let port = free_port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .arg("--tls-cert-file")
        .arg(&cert)
        .arg("--tls-key-file")
        .arg(&key)
        .arg("--tls-ca-cert-file")
        .arg(&cert)
        .args(["--tls-auth-clients", "no"])
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-server with TLS");
    let r = Redis {
        child,
        port,
        _dir: dir,
    };
    poll_until(Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .expect("redis-server with TLS did not listen (built without TLS?)");
    r
}
