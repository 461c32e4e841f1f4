//! Test support for the store tests: a throwaway single-member etcd (Debian's `etcd` binary,
//! installed with apt-get when missing) on random ports with a temporary data directory, and a
//! TCP proxy that can cut or black-hole connections to simulate network failures.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ferrisix_config::settings::EtcdSettings;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

/// The `etcd` binary, installing Debian's `etcd-server` if needed. `None` (after saying why)
/// only when it is missing and apt-get is unavailable, so the caller skips.
pub fn etcd_binary() -> Option<PathBuf> {
    static BINARY: OnceLock<Option<PathBuf>> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            if let Some(p) = which("etcd") {
                return Some(p);
            }
            if which("apt-get").is_none() {
                eprintln!("SKIPPED: no `etcd` binary and no apt-get to install etcd-server");
                return None;
            }
            eprintln!("installing etcd-server with apt-get for the etcd store tests");
            let install = || {
                Command::new("apt-get")
                    .args(["install", "-y", "etcd-server"])
                    .env("DEBIAN_FRONTEND", "noninteractive")
                    .stdout(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            };
            if !install() {
                let _ = Command::new("apt-get")
                    .arg("update")
                    .stdout(Stdio::null())
                    .status();
                assert!(install(), "apt-get install -y etcd-server failed");
            }
            Some(which("etcd").expect("etcd installed by apt-get"))
        })
        .clone()
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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
    /// `None` (after saying why) when the `openssl` command is missing.
    pub fn make(dir: &Path) -> Option<TlsFiles> {
        if which("openssl").is_none() {
            eprintln!("SKIPPED: no `openssl` command to make test certificates");
            return None;
        }
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .unwrap();
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
            std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
            let (key, csr, pem, extfile) =
                (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"), format!("{name}.ext"));
            run(&[&["req"][..], &ec, &["-keyout", &key, "-out", &csr, "-subj", &format!("/CN={cn}")]].concat());
            run(&["x509", "-req", "-in", &csr, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", &pem,
                "-days", "2", "-extfile", &extfile]);
        }
        Some(TlsFiles {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client.key"),
        })
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
    /// Starts a fresh etcd, or returns `None` when etcd cannot be had (see [`etcd_binary`]).
    pub fn start() -> Option<Etcd> {
        Etcd::start_with(None)
    }

    /// Starts a fresh etcd that serves clients over TLS with client-certificate auth.
    pub fn start_tls(tls: TlsFiles) -> Option<Etcd> {
        Etcd::start_with(Some(tls))
    }

    fn start_with(tls: Option<TlsFiles>) -> Option<Etcd> {
        let binary = etcd_binary()?;
        // A port picked free can be taken before etcd binds it; try a few pairs.
        for _ in 0..5 {
            let mut etcd = Etcd {
                binary: binary.clone(),
                dir: tempfile::tempdir().unwrap(),
                client_port: free_port(),
                peer_port: free_port(),
                tls: tls.clone(),
                child: None,
            };
            if etcd.launch() {
                return Some(etcd);
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

    /// Spawns etcd and waits until it is healthy; false if it exited (port taken).
    fn launch(&mut self) -> bool {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())
            .unwrap();
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

    fn healthy(&self) -> bool {
        let Ok(mut s) = TcpStream::connect_timeout(&self.addr(), Duration::from_millis(200)) else {
            return false;
        };
        if self.tls.is_some() {
            // Listening is all we can check without TLS here; clients retry until it serves.
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

    /// Starts etcd again on the same ports and data.
    pub fn restart(&mut self) {
        self.stop();
        assert!(self.launch(), "etcd did not restart");
    }

    /// Restarts etcd with an empty data directory (its revision starts over).
    pub fn restart_wiped(&mut self) {
        self.stop();
        std::fs::remove_dir_all(self.data_dir()).unwrap();
        assert!(self.launch(), "etcd did not restart");
    }

    pub async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect([self.endpoint()], None)
            .await
            .unwrap()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Store settings for tests: short timeouts so failures show quickly.
pub fn settings(endpoints: Vec<String>) -> EtcdSettings {
    EtcdSettings {
        host: endpoints,
        timeout: 2,
        watch_timeout: 4,
        startup_retry: 1,
        ..EtcdSettings::default()
    }
}

/// Polls `check` every 20 ms until it holds; panics with `what` after `within`.
pub async fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ProxyState {
    /// Refuse new connections and close existing ones.
    cut: bool,
    /// Connections with a smaller id forward nothing more but stay open.
    blackhole_before: u64,
}

/// A TCP proxy in front of one address.
pub struct Proxy {
    addr: SocketAddr,
    state: Arc<watch::Sender<ProxyState>>,
    next_id: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Must be called inside a Tokio runtime.
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(watch::channel(ProxyState::default()).0);
        let next_id = Arc::new(AtomicU64::new(0));
        let (s, ids) = (Arc::clone(&state), Arc::clone(&next_id));
        let accept = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                if s.borrow().cut {
                    continue; // dropped: closed at once
                }
                let id = ids.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(pump(id, conn, target, s.subscribe()));
            }
        });
        Proxy {
            addr,
            state,
            next_id,
            accept,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Closes every connection and refuses new ones until [`Proxy::heal`].
    pub fn cut(&self) {
        self.state.send_modify(|s| s.cut = true);
    }

    /// Accepts connections again.
    pub fn heal(&self) {
        self.state.send_modify(|s| s.cut = false);
    }

    /// Existing connections stay open but forward nothing (a half-dead network path); new
    /// connections work.
    pub fn blackhole_existing(&self) {
        let next = self.next_id.load(Ordering::SeqCst);
        self.state.send_modify(|s| s.blackhole_before = next);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.state.send_modify(|s| s.cut = true);
    }
}

async fn pump(
    id: u64,
    client: tokio::net::TcpStream,
    target: SocketAddr,
    mut state: watch::Receiver<ProxyState>,
) {
    let Ok(server) = tokio::net::TcpStream::connect(target).await else {
        return;
    };
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let blackholed = {
        let forward = async {
            let up = async {
                let _ = tokio::io::copy(&mut cr, &mut sw).await;
                let _ = sw.shutdown().await;
            };
            let down = async {
                let _ = tokio::io::copy(&mut sr, &mut cw).await;
                let _ = cw.shutdown().await;
            };
            tokio::join!(up, down);
        };
        tokio::select! {
            _ = forward => return,
            s = state.wait_for(|s| s.cut || id < s.blackhole_before) => s.map(|s| !s.cut).unwrap_or(false),
        }
    };
    if blackholed {
        // Hold both sockets open, silent, until the proxy is cut or dropped.
        let _ = state.wait_for(|s| s.cut).await;
    }
    drop((cr, cw, sr, sw));
}

/// The path of a file in `dir`, for local copies.
pub fn copy_path(dir: &Path) -> PathBuf {
    dir.join("data/etcd-copy.json")
}
