//! A throwaway `redis-server` for unit tests: started on a free port, killed on drop. A test
//! that finds no `redis-server` fails, naming the package (`scripts/test.sh` installs it).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferrisix_plugin_api::Executor;
use serde_json::json;

use super::{RedisPools, Remote, Target};

/// A port on 127.0.0.1 where nothing listens, below the ephemeral range: a port from
/// `bind(:0)` could be taken by a client socket meanwhile, or a connect to it could meet
/// itself (a TCP self-connection) and pass for a server that is up.
pub use ferrisix_config::test_support::free_port;

/// A pool of connections to the `redis` policy's server at `127.0.0.1:port`.
pub fn remote(port: u16) -> Remote {
    let c = json!({"redis_host": "127.0.0.1", "redis_port": port});
    let t = Target::from_conf("redis", c.as_object().unwrap())
        .unwrap()
        .unwrap();
    RedisPools::new(Executor::current()).get(t).unwrap()
}

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
    /// Panics, naming the package that installs it, when there is no `redis-server`.
    pub fn start() -> TestRedis {
        let binary = ferrisix_config::test_support::debian::require("redis-server");
        for _ in 0..3 {
            let port = free_port();
            let child = Command::new(&binary)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start redis-server");
            let mut r = TestRedis { child, port };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return r;
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
        let port = free_port();
        // Sentinel rewrites its config file, so each one needs its own.
        let conf = std::env::temp_dir().join(format!(
            "ferrisix-sentinel-{}-{port}.conf",
            std::process::id()
        ));
        std::fs::write(
            &conf,
            format!("port {port}\nbind 127.0.0.1\nsentinel monitor m 127.0.0.1 {master_port} 1\n"),
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
