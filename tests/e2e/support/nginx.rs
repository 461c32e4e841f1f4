//! Debian's nginx as a TLS upstream (the test certificate of tests/data/tls), one worker, in a
//! directory of its own; stopped when dropped.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct NginxTls {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for NginxTls {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl NginxTls {
    /// A TLS listener (`http2` on it or not) whose every location answers 200 with `body`
    /// (an nginx string: variables such as `$server_protocol` are expanded); `directives` go
    /// into its `server` block (e.g. a client-certificate check).
    pub fn start(http2: bool, directives: &str, body: &str) -> NginxTls {
        let dir = tempfile::tempdir().unwrap();
        let port = super::free_port();
        let d = dir.path().display();
        let c = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tls");
        let c = c.display();
        let h2 = if http2 { " http2" } else { "" };
        let conf = format!(
            "daemon off; master_process off; worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log;
events {{}}
http {{
  access_log off;
  client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d}; uwsgi_temp_path {d}; scgi_temp_path {d};
  server {{
    listen 127.0.0.1:{port} ssl{h2};
    ssl_certificate {c}/server.crt; ssl_certificate_key {c}/server.key;
    {directives}
    location / {{ return 200 \"{body}\"; }}
  }}
}}
"
        );
        std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
        let child = Command::new(super::debian::require("nginx"))
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(dir.path().join("nginx.conf"))
            .stderr(Stdio::null())
            .spawn()
            .expect("start nginx");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "nginx did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        NginxTls {
            child,
            port,
            _dir: dir,
        }
    }
}
