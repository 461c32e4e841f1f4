//! Shared harness for the end-to-end tests: upstream servers on random 127.0.0.1 ports and a
//! real `ferrisix` process started on a temporary standalone config.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

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
        // A port from `free_port` can be taken by a parallel test before the gateway binds it,
        // and the gateway then exits: start again on fresh ports.
        let mut failures = Vec::new();
        for _ in 0..3 {
            match Self::spawn(apisix_yaml, apisix_keys, extra_config, workers) {
                Ok(gw) => return gw,
                Err(e) => failures.push(e),
            }
        }
        panic!("ferrisix did not start: {failures:?}");
    }

    fn spawn(
        apisix_yaml: &str,
        apisix_keys: &str,
        extra_config: &str,
        workers: usize,
    ) -> Result<Gateway, String> {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let apisix_keys: String = apisix_keys
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| format!("  {l}\n"))
            .collect();
        // Every gateway gets its own metrics port, so parallel tests do not fight over 9091.
        let metrics_port = free_port();
        let plugin_attr = if extra_config.contains("plugin_attr:") {
            String::new()
        } else {
            format!(
                "plugin_attr:\n  prometheus:\n    export_addr:\n      ip: 127.0.0.1\n      port: {metrics_port}\n"
            )
        };
        let extra_config = format!("{plugin_attr}{extra_config}");
        let config = format!(
            "apisix:\n  node_listen:\n    - ip: 127.0.0.1\n      port: {port}\n  enable_admin: false\n  enable_control: false\n{apisix_keys}\
             deployment:\n  role: data_plane\n  role_data_plane:\n    config_provider: yaml\n\
             nginx_config:\n  worker_processes: {workers}\n  worker_shutdown_timeout: 10s\n  http:\n    access_log: {}\n{extra_config}",
            dir.path().join("access.log").display()
        );
        std::fs::write(dir.path().join("config.yaml"), config).unwrap();
        write_routes(dir.path(), apisix_yaml);
        let child = Command::new(env!("CARGO_BIN_EXE_ferrisix"))
            .arg("-c")
            .arg(dir.path().join("config.yaml"))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start ferrisix");
        let mut gw = Gateway {
            child,
            port,
            dir,
            metrics_port,
        };
        gw.wait_ready()?;
        Ok(gw)
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
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
        Err(format!("not listening on {} after 20 s", self.port))
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

/// Reads one response (Content-Length, chunked, or close-delimited).
pub fn read_reply(s: &mut TcpStream, head_only: bool) -> Reply {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(p) = find(&buf, b"\r\n\r\n") {
            break p;
        }
        let n = s.read(&mut chunk).unwrap();
        assert!(
            n > 0,
            "connection closed before the response head: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let status: u16 = status_line.split(' ').nth(1).unwrap().parse().unwrap();
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
        Vec::new()
    } else if let Some(len) = get("content-length") {
        let len: usize = len.parse().unwrap();
        while rest.len() < len {
            let n = s.read(&mut chunk).unwrap();
            assert!(n > 0, "body cut short");
            rest.extend_from_slice(&chunk[..n]);
        }
        rest.truncate(len);
        rest
    } else if get("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        let mut body = Vec::new();
        loop {
            while find(&rest, b"\r\n").is_none() {
                let n = s.read(&mut chunk).unwrap();
                assert!(n > 0);
                rest.extend_from_slice(&chunk[..n]);
            }
            let p = find(&rest, b"\r\n").unwrap();
            let size = usize::from_str_radix(
                std::str::from_utf8(&rest[..p])
                    .unwrap()
                    .split(';')
                    .next()
                    .unwrap()
                    .trim(),
                16,
            )
            .unwrap();
            rest.drain(..p + 2);
            while rest.len() < size + 2 {
                let n = s.read(&mut chunk).unwrap();
                assert!(n > 0);
                rest.extend_from_slice(&chunk[..n]);
            }
            body.extend_from_slice(&rest[..size]);
            rest.drain(..size + 2);
            if size == 0 {
                break;
            }
        }
        body
    } else {
        let _ = s.read_to_end(&mut rest);
        rest
    };
    Reply {
        status,
        headers,
        body,
    }
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
