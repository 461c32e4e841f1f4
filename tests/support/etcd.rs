//! A throwaway single-member etcd for the store end-to-end tests (Debian's `etcd` binary,
//! installed with apt-get when missing), on random ports with a temporary data directory, and a
//! blocking client to read, write and compact it directly, the way APISIX or an operator would.
//!
//! A minimal copy of `crates/config/tests/support` (the root tests cannot use that crate's test
//! support), without TLS and the network-failure proxy.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::debian::{apt_get, which};
use super::free_port;

/// The `etcd` binary, installing Debian's `etcd-server` with apt-get (through `sudo -n` when
/// not root) if it is missing. `None`, after saying so loudly, only where there is no apt-get:
/// the caller skips its test.
pub fn etcd_binary() -> Option<PathBuf> {
    static BINARY: OnceLock<Option<PathBuf>> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            if let Some(p) = which("etcd") {
                return Some(p);
            }
            if which("apt-get").is_none() {
                eprintln!(
                    "\n*************************************************************\n\
                     * SKIPPED: `etcd` is not on PATH and there is no apt-get to  *\n\
                     * install Debian's `etcd-server` package.                    *\n\
                     *************************************************************\n"
                );
                return None;
            }
            eprintln!("installing Debian's etcd-server with apt-get for the etcd end-to-end tests");
            // A fresh machine has no package lists yet.
            apt_get(&["update"]);
            apt_get(&["install", "-y", "--no-install-recommends", "etcd-server"]);
            Some(
                which("etcd")
                    .or_else(|| Some(PathBuf::from("/usr/bin/etcd")).filter(|p| p.is_file()))
                    .expect("etcd-server installed but `etcd` not found"),
            )
        })
        .clone()
}

/// One etcd member; killed on drop.
pub struct Etcd {
    binary: PathBuf,
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

impl Etcd {
    /// Starts a fresh etcd and waits until it answers `/health`; `None` only where etcd cannot
    /// be had (see [`etcd_binary`]), and the test should return.
    pub fn start() -> Option<Etcd> {
        let binary = etcd_binary()?;
        // A port picked free can be taken before etcd binds it; try a few pairs.
        for _ in 0..5 {
            let mut etcd = Etcd {
                binary: binary.clone(),
                dir: tempfile::tempdir().unwrap(),
                client_port: free_port(),
                peer_port: free_port(),
                child: None,
            };
            if etcd.launch() {
                return Some(etcd);
            }
        }
        panic!("etcd did not start");
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.client_port))
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// Spawns etcd and waits until it is healthy; false if it exited (a port was taken).
    fn launch(&mut self) -> bool {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())
            .unwrap();
        let child = Command::new(&self.binary)
            .arg("--name=test")
            .arg(format!("--data-dir={}", self.data_dir().display()))
            .arg(format!("--listen-client-urls={}", self.endpoint()))
            .arg(format!("--advertise-client-urls={}", self.endpoint()))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=test={peer}"))
            .args(["--logger=zap", "--log-outputs=stderr", "--log-level=warn"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                eprintln!(
                    "etcd exited with {status}: {}",
                    std::fs::read_to_string(self.log()).unwrap_or_default()
                );
                self.child = None;
                return false;
            }
            if self.healthy() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "etcd not healthy after 30 s: {}",
            std::fs::read_to_string(self.log()).unwrap_or_default()
        );
    }

    /// Whether etcd answers `GET /health` with `"health":"true"`.
    pub fn healthy(&self) -> bool {
        let Ok(mut s) = TcpStream::connect_timeout(&self.addr(), Duration::from_millis(200)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        if s.write_all(b"GET /health HTTP/1.1\r\nHost: etcd\r\nConnection: close\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut reply = String::new();
        let _ = s.read_to_string(&mut reply);
        reply.contains("\"health\":\"true\"")
    }

    /// Kills etcd (SIGKILL), keeping its data.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts etcd again on the same ports and data directory (after [`Etcd::stop`], or
    /// killing it first).
    pub fn restart(&mut self) {
        self.stop();
        // The ports were ours a moment ago; a parallel test's free-port probe can hold one
        // for an instant, so try a few times.
        for _ in 0..5 {
            if self.launch() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("etcd did not restart");
    }

    /// A blocking client for direct reads and writes.
    pub fn kv(&self) -> EtcdKv {
        EtcdKv {
            endpoint: self.endpoint(),
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One stored key, as etcd returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredKey {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
}

impl StoredKey {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.value).unwrap_or_else(|e| {
            panic!(
                "{} is not JSON ({e}): {}",
                self.key,
                String::from_utf8_lossy(&self.value)
            )
        })
    }
}

/// A blocking etcd client (each call connects afresh, so it works across etcd restarts).
pub struct EtcdKv {
    endpoint: String,
    runtime: tokio::runtime::Runtime,
}

impl EtcdKv {
    fn call<T>(
        &self,
        f: impl AsyncFnOnce(&mut etcd_client::Client) -> Result<T, etcd_client::Error>,
    ) -> T {
        self.runtime.block_on(async {
            let options = etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(5))
                .with_timeout(Duration::from_secs(10));
            let mut client = etcd_client::Client::connect([self.endpoint.as_str()], Some(options))
                .await
                .unwrap_or_else(|e| panic!("connect to etcd {}: {e}", self.endpoint));
            f(&mut client)
                .await
                .unwrap_or_else(|e| panic!("etcd request to {}: {e}", self.endpoint))
        })
    }

    /// Writes `value` under `key`; returns the revision of the write.
    pub fn put(&self, key: &str, value: impl Into<Vec<u8>>) -> i64 {
        let value = value.into();
        self.call(async |c| c.put(key, value, None).await)
            .header()
            .map_or(0, |h| h.revision())
    }

    pub fn get(&self, key: &str) -> Option<StoredKey> {
        self.call(async |c| c.get(key, None).await)
            .kvs()
            .first()
            .map(stored)
    }

    /// Every key starting with `prefix`, in key order, and the revision of the read.
    pub fn list(&self, prefix: &str) -> (Vec<StoredKey>, i64) {
        let response = self.call(async |c| {
            c.get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
                .await
        });
        (
            response.kvs().iter().map(stored).collect(),
            response.header().map_or(0, |h| h.revision()),
        )
    }

    /// Deletes `key`; returns the revision of the delete.
    pub fn delete(&self, key: &str) -> i64 {
        self.call(async |c| c.delete(key, None).await)
            .header()
            .map_or(0, |h| h.revision())
    }

    /// The store's current revision.
    pub fn revision(&self) -> i64 {
        self.call(async |c| c.get("/", None).await)
            .header()
            .map_or(0, |h| h.revision())
    }

    /// Compacts the history up to `revision` (physically, as `etcdctl compact --physical`).
    pub fn compact(&self, revision: i64) {
        self.call(async |c| {
            c.compact(
                revision,
                Some(etcd_client::CompactionOptions::new().with_physical()),
            )
            .await
        });
    }
}

fn stored(kv: &etcd_client::KeyValue) -> StoredKey {
    StoredKey {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
    }
}
