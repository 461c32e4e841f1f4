//! Shared harness for the end-to-end tests: upstream servers on random 127.0.0.1 ports and a
//! real `ferrisix` process started on a temporary standalone config ([`Gateway`]) or on a
//! store with the Admin API ([`StoreGateway`], with [`etcd::Etcd`] for an etcd to use), and
//! Redis servers for the redis policies ([`redis::Redis`]).
#![allow(dead_code)]

pub mod debian;
pub mod etcd;
pub mod nginx;
pub mod redis;
pub mod slapd;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A 127.0.0.1 port no other pick of this test process got (see its docs).
pub use ferrisix_config::test_support::free_port;

/// A running gateway process with its own config directory.
pub struct Gateway {
    pub child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
    /// The prometheus export port (a free one, unless `extra_config` sets `plugin_attr`).
    pub metrics_port: u16,
}

impl Gateway {
    /// Starts ferrisix in standalone mode serving `apisix_yaml` (without the `#END` line,
    /// which is appended). `extra` is appended to config.yaml's `apisix:` section-free tail.
    pub fn start(apisix_yaml: &str) -> Gateway {
        Self::start_with(apisix_yaml, "")
    }

    pub fn start_with(apisix_yaml: &str, extra_config: &str) -> Gateway {
        Self::start_full(apisix_yaml, "", extra_config)
    }

    /// Like [`Gateway::start_with`], with `apisix_keys` added inside config.yaml's `apisix:`
    /// section (written unindented, e.g. `"router:\n  http: radixtree_uri"`; each line is
    /// indented here). The harness already sets `node_listen` and `enable_admin` there.
    pub fn start_full(apisix_yaml: &str, apisix_keys: &str, extra_config: &str) -> Gateway {
        Self::start_workers(apisix_yaml, apisix_keys, extra_config, 1)
    }

    /// Like [`Gateway::start_full`] with `workers` worker threads (`nginx_config.worker_processes`).
    pub fn start_workers(
        apisix_yaml: &str,
        apisix_keys: &str,
        extra_config: &str,
        workers: usize,
    ) -> Gateway {
        Self::start_tuned(apisix_yaml, apisix_keys, extra_config, workers, "")
    }

    /// Like [`Gateway::start_workers`], with `http_keys` added inside `nginx_config.http`
    /// (unindented lines, e.g. `"client_header_timeout: 1s"`).
    pub fn start_tuned(
        apisix_yaml: &str,
        apisix_keys: &str,
        extra_config: &str,
        workers: usize,
        http_keys: &str,
    ) -> Gateway {
        Launch::new(apisix_yaml)
            .apisix_keys(apisix_keys)
            .extra_config(extra_config)
            .workers(workers)
            .http_keys(http_keys)
            .start()
    }

    fn wait_ready(&mut self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "exited ({status}) before listening on {}",
                    self.port
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!("not listening on {} after {within:?}", self.port))
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Replaces the standalone file (the gateway polls it).
    pub fn rewrite_routes(&self, apisix_yaml: &str) {
        write_routes(self.dir.path(), apisix_yaml);
    }

    /// Replaces the standalone file with exactly `text` (no `#END` added), atomically.
    pub fn rewrite_raw(&self, text: &str) {
        let tmp = self.dir.path().join("apisix.yaml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(tmp, self.dir.path().join("apisix.yaml")).unwrap();
    }

    pub fn config_dir(&self) -> &Path {
        self.dir.path()
    }

    /// What the gateway wrote to standard error, when [`Launch::stderr_to_file`] kept it.
    pub fn error_output(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident set size of the gateway, from /proc.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    pub fn signal(&self, sig: &str) {
        Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_routes(dir: &Path, yaml: &str) {
    let tmp = dir.join("apisix.yaml.tmp");
    std::fs::write(&tmp, format!("{yaml}\n#END\n")).unwrap();
    std::fs::rename(tmp, dir.join("apisix.yaml")).unwrap();
}

/// How a [`Gateway`] is started: config.yaml is the harness's (a data-plane listener on a free
/// port, standalone routes, no admin or control API, TLS off unless `apisix_keys` names `ssl`, a
/// free prometheus port unless `extra_config` names `plugin_attr`) with the caller's keys added.
/// Keys are written unindented (e.g. `"router:\n  http: radixtree_uri"`) and `{dir}` in any of
/// them is the gateway's own directory.
#[derive(Clone, Debug)]
pub struct Launch {
    apisix_yaml: String,
    apisix_keys: String,
    nginx_keys: String,
    http_keys: String,
    extra_config: String,
    workers: usize,
    rust_log: &'static str,
    stderr_to_file: bool,
    ready_within: Duration,
    env: Vec<(String, String)>,
}

impl Launch {
    /// `apisix_yaml` is the standalone file without its `#END` line.
    pub fn new(apisix_yaml: &str) -> Launch {
        Launch {
            apisix_yaml: apisix_yaml.to_owned(),
            apisix_keys: String::new(),
            nginx_keys: String::new(),
            http_keys: String::new(),
            extra_config: String::new(),
            workers: 1,
            rust_log: "warn",
            stderr_to_file: false,
            ready_within: Duration::from_secs(20),
            env: Vec::new(),
        }
    }

    /// An environment variable of the gateway's process (`TZ`, ...).
    pub fn env(mut self, name: &str, value: &str) -> Launch {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Keys inside config.yaml's `apisix:` section.
    pub fn apisix_keys(mut self, keys: &str) -> Launch {
        self.apisix_keys.push_str(keys);
        self
    }

    /// Keys inside `nginx_config:` beside `http` (`error_log`, `stream`).
    pub fn nginx_keys(mut self, keys: &str) -> Launch {
        self.nginx_keys.push_str(keys);
        self
    }

    /// Keys inside `nginx_config.http`.
    pub fn http_keys(mut self, keys: &str) -> Launch {
        self.http_keys.push_str(keys);
        self
    }

    /// Top-level sections after the harness's own.
    pub fn extra_config(mut self, text: &str) -> Launch {
        self.extra_config.push_str(text);
        self
    }

    /// `nginx_config.worker_processes`.
    pub fn workers(mut self, workers: usize) -> Launch {
        self.workers = workers;
        self
    }

    /// The gateway's `RUST_LOG` (`warn` unless set).
    pub fn rust_log(mut self, filter: &'static str) -> Launch {
        self.rust_log = filter;
        self
    }

    /// The gateway's standard error goes to `error.log` in its directory
    /// ([`Gateway::error_output`]) instead of the test's.
    pub fn stderr_to_file(mut self) -> Launch {
        self.stderr_to_file = true;
        self
    }

    /// How long the gateway may take to listen (20 s unless set).
    pub fn ready_within(mut self, limit: Duration) -> Launch {
        self.ready_within = limit;
        self
    }

    /// Starts the gateway; a port from `free_port` can be taken by a parallel test before the
    /// gateway binds it, and the gateway then exits: it is started again on fresh ports.
    pub fn start(self) -> Gateway {
        let mut failures = Vec::new();
        for _ in 0..3 {
            match self.try_start() {
                Ok(gw) => return gw,
                Err(e) => failures.push(e),
            }
        }
        panic!("ferrisix did not start: {failures:?}");
    }

    /// One try: the error says why the gateway did not listen (its error output included
    /// when it goes to a file).
    pub fn try_start(&self) -> Result<Gateway, String> {
        let dir = tempfile::tempdir().unwrap();
        let here = dir.path().display().to_string();
        let lines = |text: &str, indent: &str| -> String {
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| format!("{indent}{}\n", l.replace("{dir}", &here)))
                .collect()
        };
        let port = free_port();
        let apisix_keys = lines(&self.apisix_keys, "  ");
        // APISIX's default opens the TLS port 9443 on every address; parallel test gateways
        // must not share it, so a test that wants TLS names its own listener.
        let apisix_keys = if apisix_keys.contains("\n  ssl:") || apisix_keys.starts_with("  ssl:") {
            apisix_keys
        } else {
            format!("{apisix_keys}  ssl:\n    enable: false\n")
        };
        // Every gateway gets its own metrics port, so parallel tests do not fight over 9091.
        let metrics_port = free_port();
        let prometheus = format!(
            "  prometheus:\n    export_addr:\n      ip: 127.0.0.1\n      port: {metrics_port}\n"
        );
        let mut extra_config = self.extra_config.replace("{dir}", &here);
        let plugin_attr = if extra_config.starts_with("plugin_attr:\n")
            || extra_config.contains("\nplugin_attr:\n")
        {
            // The caller's plugin_attr gets the metrics port too, unless it sets prometheus'.
            if !extra_config.contains("\n  prometheus:") {
                extra_config = extra_config.replacen(
                    "plugin_attr:\n",
                    &format!("plugin_attr:\n{prometheus}"),
                    1,
                );
            }
            String::new()
        } else if extra_config.contains("plugin_attr:") {
            // A flow-style or otherwise written section: left as the caller wrote it.
            String::new()
        } else {
            format!("plugin_attr:\n{prometheus}")
        };
        let http_keys = lines(&self.http_keys, "    ");
        let access_log = if http_keys.contains("    access_log:") {
            String::new()
        } else {
            format!("    access_log: {here}/access.log\n")
        };
        let config = format!(
            "apisix:\n  node_listen:\n    - ip: 127.0.0.1\n      port: {port}\n  enable_admin: false\n  enable_control: false\n{apisix_keys}\
             deployment:\n  role: data_plane\n  role_data_plane:\n    config_provider: yaml\n\
             nginx_config:\n  worker_processes: {}\n  worker_shutdown_timeout: 10s\n{}  http:\n{access_log}{http_keys}{plugin_attr}{}",
            self.workers,
            lines(&self.nginx_keys, "  "),
            extra_config,
        );
        std::fs::write(dir.path().join("config.yaml"), config).unwrap();
        write_routes(dir.path(), &self.apisix_yaml);
        let stderr = if self.stderr_to_file {
            Stdio::from(std::fs::File::create(dir.path().join("error.log")).unwrap())
        } else {
            Stdio::inherit()
        };
        let child = Command::new(env!("CARGO_BIN_EXE_ferrisix"))
            .arg("-c")
            .arg(dir.path().join("config.yaml"))
            .env("RUST_LOG", self.rust_log)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start ferrisix");
        let mut gw = Gateway {
            child,
            port,
            dir,
            metrics_port,
        };
        gw.wait_ready(self.ready_within).map_err(|e| {
            let output = gw.error_output();
            if output.is_empty() {
                e
            } else {
                format!("{e}: {output}")
            }
        })?;
        Ok(gw)
    }
}

/// A minimal HTTP/1.1 response as parsed by the tests.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

/// Sends one request on a new connection and reads the whole response.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str("Host: test.local\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" || method == "PUT" {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    read_reply(&mut s, method == "HEAD")
}

/// Sends `raw` (a complete request, head and body, as written) on a new connection and reads
/// one response. For requests `request` cannot express (chunked bodies, hop-by-hop headers).
pub fn request_raw(addr: SocketAddr, raw: &[u8]) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(raw).unwrap();
    let head_only = raw.starts_with(b"HEAD ");
    read_reply(&mut s, head_only)
}

/// One kept-alive client connection: requests on it go one after the other.
pub struct Conn {
    stream: TcpStream,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let _ = stream.set_nodelay(true);
        Conn { stream }
    }

    /// Sends one request (Host `test.local` unless given) without `Connection: close` and reads
    /// its response; the connection stays open for the next one.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        let mut req = format!("{method} {path} HTTP/1.1\r\n");
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            req.push_str("Host: test.local\r\n");
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        if !body.is_empty() || method == "POST" || method == "PUT" {
            req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        req.push_str("\r\n");
        self.stream.write_all(req.as_bytes()).unwrap();
        self.stream.write_all(body).unwrap();
        read_reply(&mut self.stream, method == "HEAD")
    }

    pub fn get(&mut self, path: &str) -> Reply {
        self.request("GET", path, &[], b"")
    }
}

/// Sends `per_client` requests from each of `clients` threads, each on its own kept-alive
/// connection to one of `gateways` (round robin); answers the 200s and the 429s (any other
/// status fails the test).
pub fn hammer(
    gateways: &[SocketAddr],
    path: &str,
    clients: usize,
    per_client: usize,
) -> (usize, usize) {
    let ok = Arc::new(AtomicUsize::new(0));
    let rejected = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..clients)
        .map(|i| {
            let addr = gateways[i % gateways.len()];
            let (ok, rejected, path) = (ok.clone(), rejected.clone(), path.to_string());
            std::thread::spawn(move || {
                let mut conn = Conn::open(addr);
                for _ in 0..per_client {
                    match conn.get(&path).status {
                        200 => ok.fetch_add(1, Ordering::SeqCst),
                        429 => rejected.fetch_add(1, Ordering::SeqCst),
                        other => panic!("unexpected status {other}"),
                    };
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    (ok.load(Ordering::SeqCst), rejected.load(Ordering::SeqCst))
}

/// `127.0.0.1:<port>` where nothing listens: connecting is refused (an upstream node that is down).
pub fn dead_node() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// Calls `check` every 20 ms until it returns true or `limit` passes; returns how long it took,
/// or `None` on time-out. For waiting on reloads without asserting on their speed.
pub fn poll_until(limit: Duration, mut check: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if check() {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn get(addr: SocketAddr, path: &str) -> Reply {
    request(addr, "GET", path, &[], b"")
}

pub fn get_host(addr: SocketAddr, path: &str, host: &str) -> Reply {
    request(addr, "GET", path, &[("Host", host)], b"")
}

/// Reads one response (Content-Length, chunked, or close-delimited); panics on I/O errors.
pub fn read_reply(s: &mut TcpStream, head_only: bool) -> Reply {
    try_read_reply(s, head_only).unwrap_or_else(|e| panic!("{e}"))
}

/// [`read_reply`] that returns I/O errors (a connection reset, closed early, or timed out)
/// instead of panicking, for clients that must survive a process being killed.
pub fn try_read_reply(s: &mut TcpStream, head_only: bool) -> std::io::Result<Reply> {
    try_read_pipelined(s, &mut Vec::new(), head_only)
}

/// Reads one response of several the server may send back to back (pipelined requests):
/// `pending` holds bytes read past the previous response, and keeps those read past this one.
/// A single read can take in the next response too, so each must start where the last ended.
pub fn read_pipelined(s: &mut TcpStream, pending: &mut Vec<u8>, head_only: bool) -> Reply {
    try_read_pipelined(s, pending, head_only).unwrap_or_else(|e| panic!("{e}"))
}

fn try_read_pipelined(
    s: &mut TcpStream,
    pending: &mut Vec<u8>,
    head_only: bool,
) -> std::io::Result<Reply> {
    use std::io::{Error, ErrorKind};
    let short = |what: String| Error::new(ErrorKind::UnexpectedEof, what);
    let mut buf = std::mem::take(pending);
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(p) = find(&buf, b"\r\n\r\n") {
            break p;
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(short(format!(
                "connection closed before the response head: {:?}",
                String::from_utf8_lossy(&buf)
            )));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let bad = |what: &str| Error::new(ErrorKind::InvalidData, what.to_string());
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| bad(&format!("bad status line {status_line:?}")))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut rest = buf[head_end + 4..].to_vec();
    let get = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.clone())
    };
    let body = if head_only || status == 204 || status == 304 || status == 101 {
        *pending = std::mem::take(&mut rest);
        Vec::new()
    } else if let Some(len) = get("content-length") {
        let len: usize = len.parse().map_err(|_| bad("bad Content-Length"))?;
        while rest.len() < len {
            let n = s.read(&mut chunk)?;
            if n == 0 {
                return Err(short("body cut short".into()));
            }
            rest.extend_from_slice(&chunk[..n]);
        }
        *pending = rest.split_off(len);
        rest
    } else if get("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        let mut body = Vec::new();
        let mut fill = |rest: &mut Vec<u8>| -> std::io::Result<()> {
            let n = s.read(&mut chunk)?;
            if n == 0 {
                return Err(short("chunked body cut short".into()));
            }
            rest.extend_from_slice(&chunk[..n]);
            Ok(())
        };
        loop {
            while find(&rest, b"\r\n").is_none() {
                fill(&mut rest)?;
            }
            let p = find(&rest, b"\r\n").unwrap();
            let size = std::str::from_utf8(&rest[..p])
                .ok()
                .and_then(|l| l.split(';').next())
                .and_then(|l| usize::from_str_radix(l.trim(), 16).ok())
                .ok_or_else(|| bad("bad chunk size"))?;
            rest.drain(..p + 2);
            while rest.len() < size + 2 {
                fill(&mut rest)?;
            }
            body.extend_from_slice(&rest[..size]);
            rest.drain(..size + 2);
            if size == 0 {
                break;
            }
        }
        *pending = rest;
        body
    } else {
        let _ = s.read_to_end(&mut rest);
        rest
    };
    Ok(Reply {
        status,
        headers,
        body,
    })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// What an upstream does with each request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Answers 200 with a JSON echo of the request (method, path, headers, body length).
    Echo,
    /// Answers with this status and an empty body.
    Status(u16),
    /// Sleeps this long before echoing.
    Delay(Duration),
    /// Sleeps this long before echoing a request whose path contains the text; echoes the
    /// others at once (one keep-alive connection can then be fast, then slow).
    DelayPath(&'static str, Duration),
    /// Accepts the connection, reads the request, then closes without answering.
    Hangup,
}

/// A threaded HTTP/1.1 test upstream on a random port, counting the requests it served.
pub struct Upstream {
    pub addr: SocketAddr,
    pub hits: Arc<AtomicUsize>,
    pub name: String,
}

impl Upstream {
    pub fn start(name: &str, behaviour: Behaviour) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        let n = name.to_string();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let h = h.clone();
                let n = n.clone();
                std::thread::spawn(move || serve_upstream(stream, &n, behaviour, &h));
            }
        });
        Upstream {
            addr,
            hits,
            name: name.to_string(),
        }
    }

    pub fn node(&self) -> String {
        self.addr.to_string()
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

fn serve_upstream(mut s: TcpStream, name: &str, behaviour: Behaviour, hits: &AtomicUsize) {
    let _ = s.set_nodelay(true);
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        // Read a request head.
        let head_end = loop {
            if let Some(p) = find(&buf, b"\r\n\r\n") {
                break p;
            }
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        buf.drain(..head_end + 4);
        let mut lines = head.split("\r\n");
        let mut rl = lines.next().unwrap_or("").split(' ');
        let method = rl.next().unwrap_or("").to_string();
        let path = rl.next().unwrap_or("").to_string();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let hv = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        // Read (and count, not keep) the body.
        let mut body_len: u64 = 0;
        let mut body_sample = Vec::new();
        if let Some(cl) = hv("content-length") {
            let mut remaining: u64 = cl.parse().unwrap_or(0);
            let take = remaining.min(buf.len() as u64) as usize;
            body_sample.extend_from_slice(&buf[..take.min(1024)]);
            buf.drain(..take);
            remaining -= take as u64;
            body_len += take as u64;
            while remaining > 0 {
                let want = remaining.min(chunk.len() as u64) as usize;
                match s.read(&mut chunk[..want]) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if body_sample.len() < 1024 {
                            body_sample
                                .extend_from_slice(&chunk[..n.min(1024 - body_sample.len())]);
                        }
                        remaining -= n as u64;
                        body_len += n as u64;
                    }
                }
            }
        } else if hv("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
            loop {
                while find(&buf, b"\r\n").is_none() {
                    match s.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let p = find(&buf, b"\r\n").unwrap();
                let size = usize::from_str_radix(
                    String::from_utf8_lossy(&buf[..p])
                        .split(';')
                        .next()
                        .unwrap()
                        .trim(),
                    16,
                )
                .unwrap_or(0);
                buf.drain(..p + 2);
                let mut need = size + 2;
                while need > 0 {
                    if buf.is_empty() {
                        match s.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let take = need.min(buf.len());
                    if body_sample.len() < 1024 {
                        let data_take = take
                            .min(need.saturating_sub(2))
                            .min(1024 - body_sample.len());
                        body_sample.extend_from_slice(&buf[..data_take]);
                    }
                    buf.drain(..take);
                    need -= take;
                }
                body_len += size as u64;
                if size == 0 {
                    break;
                }
            }
        }
        hits.fetch_add(1, Ordering::SeqCst);
        let respond = |s: &mut TcpStream, status: u16, body: &[u8]| -> bool {
            let resp = format!(
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nContent-Type: application/json\r\nX-Upstream: {name}\r\nServer: test-upstream\r\n\r\n",
                body.len()
            );
            s.write_all(resp.as_bytes()).is_ok() && s.write_all(body).is_ok()
        };
        let echo = || {
            serde_json::json!({
                "upstream": name,
                "method": method,
                "path": path,
                "headers": serde_json::Value::Object(headers.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect()),
                "body_len": body_len,
                "body": String::from_utf8_lossy(&body_sample),
            })
            .to_string()
        };
        let ok = match behaviour {
            Behaviour::Echo => respond(&mut s, 200, echo().as_bytes()),
            Behaviour::Status(code) => respond(&mut s, code, b""),
            Behaviour::Delay(d) => {
                std::thread::sleep(d);
                respond(&mut s, 200, echo().as_bytes())
            }
            Behaviour::DelayPath(text, d) => {
                if path.contains(text) {
                    std::thread::sleep(d);
                }
                respond(&mut s, 200, echo().as_bytes())
            }
            Behaviour::Hangup => return,
        };
        if !ok {
            return;
        }
    }
}

/// The config dir's access log, for tests that read it.
pub fn access_log(gw: &Gateway) -> PathBuf {
    gw.config_dir().join("access.log")
}

/// [`request`] that returns I/O errors instead of panicking (connect refused, reset, timed
/// out), for clients that run while processes are killed and restarted.
pub fn try_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Reply> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.set_write_timeout(Some(Duration::from_secs(30)))?;
    let _ = s.set_nodelay(true);
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str("Host: test.local\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" || method == "PUT" || method == "PATCH" {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("Connection: close\r\n\r\n");
    s.write_all(req.as_bytes())?;
    s.write_all(body)?;
    try_read_reply(&mut s, method == "HEAD")
}

/// A kept-alive client connection that reports failures instead of panicking: for load
/// loops, which would otherwise leave thousands of sockets in TIME_WAIT.
pub struct TryConn {
    addr: SocketAddr,
    stream: Option<TcpStream>,
}

impl TryConn {
    pub fn new(addr: SocketAddr) -> TryConn {
        TryConn { addr, stream: None }
    }

    /// Sends `GET path` on the open connection (opening one if needed) and reads the answer.
    /// After an error the connection is dropped, and the next call opens a new one.
    pub fn get(&mut self, path: &str) -> std::io::Result<Reply> {
        let result = self.try_get(path);
        if result.is_err() {
            self.stream = None;
        }
        result
    }

    /// Closes the connection; the next request opens a new one.
    pub fn reconnect(&mut self) {
        self.stream = None;
    }

    fn try_get(&mut self, path: &str) -> std::io::Result<Reply> {
        if self.stream.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(10))?;
            s.set_read_timeout(Some(Duration::from_secs(30)))?;
            let _ = s.set_nodelay(true);
            self.stream = Some(s);
        }
        let s = self.stream.as_mut().unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: test.local\r\n\r\n").as_bytes())?;
        let reply = try_read_reply(s, false)?;
        if reply
            .header("connection")
            .is_some_and(|c| c.eq_ignore_ascii_case("close"))
        {
            self.stream = None;
        }
        Ok(reply)
    }
}

/// The admin key every [`StoreGateway`] is configured with.
pub const ADMIN_KEY: &str = "edd1c9f034335f136f87ad84b625c8f1";

/// Where a [`StoreGateway`] keeps its configuration.
#[derive(Clone, Debug)]
pub enum StoreKind {
    /// `role_traditional.config_provider: embedded`: the redb file in the data directory.
    Embedded,
    /// `role_traditional.config_provider: etcd` with these endpoints.
    Etcd(Vec<String>),
    /// `role_traditional.config_provider: yaml`: APISIX's API-driven standalone mode, the
    /// configuration pushed with `PUT /apisix/admin/configs`.
    StandaloneApi,
}

/// Builds a ferrisix node in the `traditional` role (data plane + Admin API + control API) on
/// a store, every listener on its own random 127.0.0.1 port so tests can run in parallel.
#[derive(Clone, Debug)]
pub struct StoreGatewayBuilder {
    store: StoreKind,
    etcd_keys: Vec<String>,
    apisix_keys: Vec<String>,
    ferrisix_keys: Vec<String>,
    admin_keys: Vec<String>,
    workers: usize,
    log_filter: String,
    envs: Vec<(String, String)>,
}

impl StoreGatewayBuilder {
    pub fn embedded() -> StoreGatewayBuilder {
        StoreGatewayBuilder::new(StoreKind::Embedded)
    }

    /// A node in API-driven standalone mode (empty until a `PUT /apisix/admin/configs`).
    pub fn standalone_api() -> StoreGatewayBuilder {
        StoreGatewayBuilder::new(StoreKind::StandaloneApi)
    }

    /// A node on the etcd at `endpoint` (`http://127.0.0.1:PORT`), prefix `/apisix`.
    pub fn etcd(endpoint: &str) -> StoreGatewayBuilder {
        StoreGatewayBuilder::new(StoreKind::Etcd(vec![endpoint.to_owned()]))
    }

    fn new(store: StoreKind) -> StoreGatewayBuilder {
        StoreGatewayBuilder {
            store,
            // Short enough that a test never waits 30 s on a dead peer; long enough for a
            // loaded CI machine.
            etcd_keys: vec!["timeout: 5".into()],
            apisix_keys: Vec::new(),
            ferrisix_keys: Vec::new(),
            admin_keys: Vec::new(),
            workers: 1,
            log_filter: "warn".into(),
            envs: Vec::new(),
        }
    }

    /// An environment variable of the process (on top of the test's own).
    pub fn env(mut self, name: &str, value: &str) -> StoreGatewayBuilder {
        self.envs.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Adds a `key: value` line under `deployment.etcd` (a later line for the same key wins).
    pub fn etcd_key(mut self, line: &str) -> StoreGatewayBuilder {
        self.etcd_keys.push(line.to_owned());
        self
    }

    /// Adds lines (unindented) under `apisix:`, e.g. an `ssl:` block.
    pub fn apisix_key(mut self, lines: &str) -> StoreGatewayBuilder {
        self.apisix_keys
            .extend(lines.lines().map(|l| format!("  {l}\n")));
        self
    }

    /// Adds a `key: value` line under `ferrisix:`, e.g. `admin_ui_dir: ui`.
    pub fn ferrisix_key(mut self, line: &str) -> StoreGatewayBuilder {
        self.ferrisix_keys.push(format!("  {line}\n"));
        self
    }

    /// Adds a `key: value` line under `deployment.admin`, e.g. `enable_admin_ui: false`.
    pub fn admin_key(mut self, line: &str) -> StoreGatewayBuilder {
        self.admin_keys.push(format!("    {line}\n"));
        self
    }

    /// `nginx_config.worker_processes`.
    pub fn workers(mut self, workers: usize) -> StoreGatewayBuilder {
        self.workers = workers;
        self
    }

    /// `RUST_LOG` for the process (default `warn`); its log goes to [`StoreGateway::log_text`].
    pub fn log_filter(mut self, filter: &str) -> StoreGatewayBuilder {
        self.log_filter = filter.to_owned();
        self
    }

    /// Starts the node and waits until its data, Admin and control ports listen. Panics if it
    /// exits first (after retrying on fresh ports, which a parallel test may have taken).
    pub fn start(self) -> StoreGateway {
        let mut failures = Vec::new();
        for _ in 0..3 {
            let mut gw = StoreGateway {
                child: None,
                dir: tempfile::tempdir().unwrap(),
                data_port: free_port(),
                admin_port: free_port(),
                control_port: free_port(),
                metrics_port: free_port(),
                admin_key: ADMIN_KEY.to_owned(),
                log_filter: self.log_filter.clone(),
                envs: self.envs.clone(),
            };
            std::fs::write(gw.config_path(), self.config_yaml(&gw)).unwrap();
            match gw.launch() {
                Ok(()) => return gw,
                Err(e) => failures.push(e),
            }
        }
        panic!("ferrisix did not start: {failures:#?}");
    }

    fn config_yaml(&self, gw: &StoreGateway) -> String {
        let (provider, etcd_hosts) = match &self.store {
            StoreKind::Embedded => ("embedded", String::new()),
            StoreKind::StandaloneApi => ("yaml", String::new()),
            StoreKind::Etcd(hosts) => (
                "etcd",
                hosts.iter().map(|h| format!("      - \"{h}\"\n")).collect(),
            ),
        };
        let etcd_section = if etcd_hosts.is_empty() {
            String::from("    prefix: /apisix\n")
        } else {
            format!("    host:\n{etcd_hosts}    prefix: /apisix\n")
        };
        let etcd_keys: String = self
            .etcd_keys
            .iter()
            .map(|l| format!("    {l}\n"))
            .collect();
        let dir = gw.dir.path();
        let mut apisix_keys: String = self.apisix_keys.concat();
        // No shared default TLS port 9443 between parallel test nodes.
        if !apisix_keys.contains("  ssl:") {
            apisix_keys.push_str("  ssl:\n    enable: false\n");
        }
        format!(
            "apisix:\n\
             {apisix_keys}\
             \x20 node_listen:\n\
             \x20   - ip: 127.0.0.1\n\
             \x20     port: {data}\n\
             \x20 enable_admin: true\n\
             \x20 enable_control: true\n\
             \x20 control:\n\
             \x20   ip: 127.0.0.1\n\
             \x20   port: {control}\n\
             deployment:\n\
             \x20 role: traditional\n\
             \x20 role_traditional:\n\
             \x20   config_provider: {provider}\n\
             \x20 etcd:\n\
             {etcd_section}{etcd_keys}\
             \x20 admin:\n\
             \x20   admin_listen:\n\
             \x20     ip: 127.0.0.1\n\
             \x20     port: {admin}\n\
             \x20   admin_key:\n\
             \x20     - name: admin\n\
             \x20       key: {key}\n\
             \x20       role: admin\n\
             {admin_keys}\
             ferrisix:\n\
             \x20 data_dir: {data_dir}\n\
             {ferrisix_keys}\
             plugin_attr:\n\
             \x20 prometheus:\n\
             \x20   export_addr:\n\
             \x20     ip: 127.0.0.1\n\
             \x20     port: {metrics}\n\
             nginx_config:\n\
             \x20 worker_processes: {workers}\n\
             \x20 worker_shutdown_timeout: 10s\n\
             \x20 http:\n\
             \x20   access_log: {access_log}\n",
            data = gw.data_port,
            control = gw.control_port,
            admin = gw.admin_port,
            metrics = gw.metrics_port,
            key = gw.admin_key,
            data_dir = gw.data_dir().display(),
            ferrisix_keys = self.ferrisix_keys.concat(),
            admin_keys = self.admin_keys.concat(),
            workers = self.workers,
            access_log = dir.join("access.log").display(),
        )
    }
}

/// A ferrisix node on a store (see [`StoreGatewayBuilder`]). Its config directory, data
/// directory and log outlive restarts; the process is killed on drop.
pub struct StoreGateway {
    child: Option<Child>,
    dir: tempfile::TempDir,
    pub data_port: u16,
    pub admin_port: u16,
    pub control_port: u16,
    pub metrics_port: u16,
    pub admin_key: String,
    log_filter: String,
    envs: Vec<(String, String)>,
}

impl StoreGateway {
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.yaml")
    }

    /// `ferrisix.data_dir`: the embedded store's file, etcd mode's local copy.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Where etcd mode keeps its copy of the last configuration applied from etcd.
    pub fn local_copy(&self) -> PathBuf {
        self.data_dir().join("etcd-local-copy.json")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("ferrisix.log")
    }

    /// Everything the process (every start of it) wrote to stderr.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn data_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.data_port))
    }

    pub fn admin_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.admin_port))
    }

    pub fn control_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.control_port))
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// Spawns the process on the existing config and waits for its three ports.
    fn launch(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_ferrisix"))
            .arg("-c")
            .arg(self.config_path())
            .env("RUST_LOG", &self.log_filter)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start ferrisix");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        let ports = [self.control_port, self.admin_port, self.data_port];
        let mut next = 0;
        while next < ports.len() {
            if TcpStream::connect(("127.0.0.1", ports[next])).is_ok() {
                next += 1;
                continue;
            }
            if let Ok(Some(status)) = self.child.as_mut().unwrap().try_wait() {
                self.child = None;
                return Err(format!(
                    "exited ({status}) before listening on {}; log:\n{}",
                    ports[next],
                    tail(&self.log_text(), 3000)
                ));
            }
            if Instant::now() > deadline {
                return Err(format!("not listening on {} after 30 s", ports[next]));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Starts the process again on the same config, ports and data directory (after
    /// [`StoreGateway::stop`] or [`StoreGateway::kill9`]).
    pub fn restart(&mut self) {
        assert!(
            self.child.is_none(),
            "restart: the process is still running"
        );
        let mut failures = Vec::new();
        // The ports were ours a moment ago; a parallel test's free-port probe can hold one for
        // an instant.
        for _ in 0..3 {
            match self.launch() {
                Ok(()) => return,
                Err(e) => failures.push(e),
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        panic!("ferrisix did not restart: {failures:#?}");
    }

    /// Sends `sig` (a name such as `STOP` or `CONT`) to the process.
    pub fn signal(&self, sig: &str) {
        let pid = self.pid().expect("the process is running");
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{sig} {pid}");
    }

    /// Graceful stop: SIGTERM, then waits for the exit (SIGKILL after 20 s).
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("ferrisix did not exit within 20 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The pid file (`ferrisix.pid` in the data directory) names the serving process.
    pub fn pid_file_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.data_dir().join("ferrisix.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// A restart that keeps every connection: a second process on the same config while this
    /// one runs, after SIGTERM to this one when `sigterm_first` (a stop followed by a start),
    /// else while it still serves (a binary upgrade). Returns once the new process serves (its
    /// pid file) and the old one exited (zero status), with how long the old one took.
    pub fn restart_in_place(&mut self, sigterm_first: bool) -> Duration {
        let mut old = self.child.take().expect("the process is running");
        let old_pid = old.id();
        let began = Instant::now();
        if sigterm_first {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(old_pid.to_string())
                .status();
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_ferrisix"))
            .arg("-c")
            .arg(self.config_path())
            .env("RUST_LOG", &self.log_filter)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start ferrisix");
        let new_pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.pid_file_pid() != Some(new_pid) {
            if let Ok(Some(status)) = self.child.as_mut().unwrap().try_wait() {
                panic!(
                    "the successor exited ({status}); log:\n{}",
                    tail(&self.log_text(), 3000)
                );
            }
            assert!(Instant::now() < deadline, "the successor did not take over");
            std::thread::sleep(Duration::from_millis(20));
        }
        let status = loop {
            if let Some(status) = old.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = old.kill();
                panic!(
                    "the old process did not exit; log:\n{}",
                    tail(&self.log_text(), 3000)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "the old process exited with {status}");
        began.elapsed()
    }

    /// `kill -9`: no chance to flush or clean up.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// One Admin API request with the admin key (`path` starts with `/apisix/admin`).
    pub fn admin(&self, method: &str, path: &str, body: &str) -> Reply {
        self.try_admin(method, path, body)
            .unwrap_or_else(|e| panic!("Admin API {method} {path}: {e}"))
    }

    pub fn try_admin(&self, method: &str, path: &str, body: &str) -> std::io::Result<Reply> {
        let mut headers = vec![("X-API-KEY", self.admin_key.as_str())];
        if !body.is_empty() {
            headers.push(("Content-Type", "application/json"));
        }
        try_request(self.admin_addr(), method, path, &headers, body.as_bytes())
    }

    /// `PUT /apisix/admin/routes/{id}`; panics unless the answer is 200 or 201.
    pub fn put_route(&self, id: &str, route: &serde_json::Value) -> Reply {
        let reply = self.admin(
            "PUT",
            &format!("/apisix/admin/routes/{id}"),
            &route.to_string(),
        );
        assert!(
            matches!(reply.status, 200 | 201),
            "PUT route {id}: {} {}",
            reply.status,
            reply.text()
        );
        reply
    }

    /// `DELETE /apisix/admin/routes/{id}`; panics unless the answer is 200.
    pub fn delete_route(&self, id: &str) {
        let reply = self.admin("DELETE", &format!("/apisix/admin/routes/{id}"), "");
        assert_eq!(reply.status, 200, "DELETE route {id}: {}", reply.text());
    }

    /// A GET through the data port.
    pub fn get(&self, path: &str) -> Reply {
        self.try_get(path)
            .unwrap_or_else(|e| panic!("GET {path} on the data port: {e}"))
    }

    pub fn try_get(&self, path: &str) -> std::io::Result<Reply> {
        try_request(self.data_addr(), "GET", path, &[], b"")
    }

    /// The status of a GET through the data port (0 when the request itself failed).
    pub fn status_of(&self, path: &str) -> u16 {
        self.try_get(path).map_or(0, |r| r.status)
    }

    /// A GET on the control API.
    pub fn control(&self, path: &str) -> Reply {
        try_request(self.control_addr(), "GET", path, &[], b"")
            .unwrap_or_else(|e| panic!("control API GET {path}: {e}"))
    }

    /// The control API's `/v1/config`: revision, route count, store health, quarantine.
    pub fn config_report(&self) -> serde_json::Value {
        let reply = self.control("/v1/config");
        assert_eq!(reply.status, 200, "/v1/config: {}", reply.text());
        reply.json()
    }
}

impl Drop for StoreGateway {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- ferrisix log (data port {}) ---\n{}",
                self.data_port,
                tail(&self.log_text(), 6000)
            );
        }
    }
}

fn tail(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// A route sending `uri` to the upstream node `node`, in the shape a client PUTs.
pub fn route_to(uri: &str, node: &str) -> serde_json::Value {
    serde_json::json!({
        "uri": uri,
        "upstream": {"type": "roundrobin", "nodes": {node: 1}},
    })
}

/// Polls `check` every `every` until it returns true or `limit` passes; returns how long it
/// took from `start` (so the time of the trigger can be counted in), or `None` on time-out.
pub fn poll_from(
    start: Instant,
    limit: Duration,
    every: Duration,
    mut check: impl FnMut() -> bool,
) -> Option<Duration> {
    loop {
        if check() {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// The `p`-th percentile (0..=100, nearest rank) of `samples`.
pub fn percentile(samples: &[Duration], p: f64) -> Duration {
    assert!(!samples.is_empty());
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Puts `count` new routes (`/prop/<i>`, one after the other) through `gw`'s Admin API and, for
/// each, polls the data port until it answers 200. Returns the times from sending the PUT to
/// the first 200, and from the PUT's answer to the first 200 (zero when it was served first).
pub fn measure_propagation(
    gw: &StoreGateway,
    up: &Upstream,
    count: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let (mut total, mut after_ack) = (Vec::new(), Vec::new());
    for i in 0..count {
        let uri = format!("/prop/{i}");
        let body = route_to(&uri, &up.node()).to_string();
        let start = Instant::now();
        let reply = gw.admin("PUT", &format!("/apisix/admin/routes/prop{i}"), &body);
        let acked = start.elapsed();
        assert_eq!(reply.status, 201, "PUT prop{i}: {}", reply.text());
        let served = poll_from(
            start,
            Duration::from_secs(10),
            Duration::from_micros(200),
            || gw.status_of(&uri) == 200,
        )
        .unwrap_or_else(|| panic!("{uri} not served within 10 s of its PUT"));
        total.push(served);
        after_ack.push(served.saturating_sub(acked));
    }
    (total, after_ack)
}
