//! A throwaway single-member etcd (Debian's `etcd` binary, which `scripts/test.sh` installs)
//! on random ports with a temporary data directory, optionally serving TLS with client
//! certificates, and a blocking client to read, write and compact it directly.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::debian::require;
use super::free_port;
use crate::store::etcd::kv_of;
use crate::store::KeyValue;

/// The `etcd` binary (Debian's `etcd-server`, which `scripts/test.sh` installs); panics,
/// naming the package, when it is missing.
pub fn etcd_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| require("etcd")).clone()
}

/// Certificates made with the `openssl` command for a TLS etcd: a CA, a server certificate
/// for `localhost` and 127.0.0.1, and a client certificate.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl TlsFiles {
    /// Panics, naming the package, when the `openssl` command is missing.
    pub fn make(dir: &Path) -> TlsFiles {
        let openssl = require("openssl");
        let run = |args: &[&str]| {
            let out = Command::new(&openssl)
                .args(args)
                .current_dir(dir)
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        run(&[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=ferrisix test CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        ]
        .concat());
        for (name, cn, ext) in [
            ("server", "localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"),
            ("client", "root", "extendedKeyUsage=clientAuth\n"),
        ] {
            std::fs::write(dir.join(format!("{name}.ext")), ext).expect("write openssl extensions");
            let (key, csr, pem, extfile) =
                (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"), format!("{name}.ext"));
            run(&[&["req"][..], &ec, &["-keyout", &key, "-out", &csr, "-subj", &format!("/CN={cn}")]].concat());
            run(&["x509", "-req", "-in", &csr, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", &pem,
                "-days", "2", "-extfile", &extfile]);
        }
        TlsFiles {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client.key"),
        }
    }
}

/// One etcd member; killed on drop.
pub struct Etcd {
    binary: PathBuf,
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    /// Serve clients over TLS, requiring a client certificate.
    tls: Option<TlsFiles>,
    child: Option<Child>,
}

impl Etcd {
    /// Starts a fresh etcd and waits until it answers; panics when there is no etcd (see
    /// [`etcd_binary`]).
    pub fn start() -> Etcd {
        Etcd::start_with(None)
    }

    /// Starts a fresh etcd that serves clients over TLS with client-certificate auth.
    pub fn start_tls(tls: TlsFiles) -> Etcd {
        Etcd::start_with(Some(tls))
    }

    fn start_with(tls: Option<TlsFiles>) -> Etcd {
        let binary = etcd_binary();
        // A port picked free can be taken before etcd binds it; try a few pairs.
        for _ in 0..5 {
            let mut etcd = Etcd {
                binary: binary.clone(),
                dir: tempfile::tempdir().expect("temporary directory"),
                client_port: free_port(),
                peer_port: free_port(),
                tls: tls.clone(),
                child: None,
            };
            if etcd.launch() {
                return etcd;
            }
        }
        panic!("etcd did not start");
    }

    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
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
            .expect("open the etcd log");
        let mut command = Command::new(&self.binary);
        if let Some(tls) = &self.tls {
            command
                .arg(format!("--cert-file={}", tls.server_cert.display()))
                .arg(format!("--key-file={}", tls.server_key.display()))
                .arg(format!("--trusted-ca-file={}", tls.ca.display()))
                .arg("--client-cert-auth");
        }
        let child = command
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
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().expect("etcd status"));
            if let Some(status) = exited {
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

    /// Whether etcd answers `GET /health` with `"health":"true"` (over TLS: whether it
    /// listens, which is all that can be checked without a TLS client; clients retry).
    pub fn healthy(&self) -> bool {
        let Ok(mut s) = TcpStream::connect_timeout(&self.addr(), Duration::from_millis(200)) else {
            return false;
        };
        if self.tls.is_some() {
            return true;
        }
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

    /// Restarts etcd with an empty data directory (its revision starts over).
    pub fn restart_wiped(&mut self) {
        self.stop();
        std::fs::remove_dir_all(self.data_dir()).expect("remove the etcd data directory");
        self.restart();
    }

    /// An async client (plain endpoints only).
    pub async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect([self.endpoint()], None)
            .await
            .unwrap_or_else(|e| panic!("connect to etcd {}: {e}", self.endpoint()))
    }

    /// A blocking client for direct reads and writes.
    pub fn kv(&self) -> EtcdKv {
        EtcdKv {
            endpoint: self.endpoint(),
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the blocking etcd client"),
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

impl KeyValue {
    /// The value as JSON (test support: panics, naming the key, when it is not JSON).
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

    pub fn get(&self, key: &str) -> Option<KeyValue> {
        self.call(async |c| c.get(key, None).await)
            .kvs()
            .first()
            .map(kv_of)
    }

    /// Every key starting with `prefix`, in key order, and the revision of the read.
    pub fn list(&self, prefix: &str) -> (Vec<KeyValue>, i64) {
        let response = self.call(async |c| {
            c.get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
                .await
        });
        (
            response.kvs().iter().map(kv_of).collect(),
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
