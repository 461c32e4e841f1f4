//! End-to-end TLS: a real ferrisix with an HTTPS listener, driven by curl and openssl's
//! s_client (real clients, real handshakes), with certificates from tests/data/tls.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{free_port, Behaviour, Gateway, Upstream};

fn cert_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tls")
}

fn pem(name: &str) -> String {
    std::fs::read_to_string(cert_dir().join(name)).unwrap()
}

/// A YAML block scalar holding `text`, indented for a list item's field.
fn block(text: &str, indent: usize) -> String {
    let pad = " ".repeat(indent);
    let mut out = String::from("|\n");
    for line in text.lines() {
        out.push_str(&pad);
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn ssl_yaml(id: &str, sni: &str, cert: &str, key: &str, extra: &str) -> String {
    format!(
        "  - id: \"{id}\"\n    sni: \"{sni}\"\n    cert: {}    key: {}{extra}",
        block(&pem(cert), 6),
        block(&pem(key), 6)
    )
}

struct TlsGateway {
    gw: Gateway,
    tls_port: u16,
}

fn start(ssls: &str, routes: &str) -> TlsGateway {
    start_with(ssls, routes, "", "")
}

/// `apisix_keys` are more keys of the `apisix:` section, `http_keys` of `nginx_config.http`.
fn start_with(ssls: &str, routes: &str, apisix_keys: &str, http_keys: &str) -> TlsGateway {
    let tls_port = free_port();
    let gw = Gateway::start_tuned(
        &format!("ssls:\n{ssls}\nroutes:\n{routes}"),
        &format!("{apisix_keys}ssl:\n  listen:\n    - ip: 127.0.0.1\n      port: {tls_port}"),
        "",
        1,
        http_keys,
    );
    let t = TlsGateway { gw, tls_port };
    // The TLS listener binds with the plain one; wait until the snapshot has the ssls.
    std::thread::sleep(Duration::from_millis(300));
    t
}

fn route(id: &str, uri: &str, node: &str) -> String {
    format!(
        "  - id: \"{id}\"\n    uri: \"{uri}\"\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{node}\": 1\n"
    )
}

/// `curl` over TLS with `sni` resolved to the gateway; returns (exit code, body, stderr).
fn curl(t: &TlsGateway, sni: &str, path: &str, args: &[&str]) -> (i32, String, String) {
    curl_port(t.tls_port, sni, path, args)
}

/// [`curl`] to the TLS listener on `tls_port`.
fn curl_port(tls_port: u16, sni: &str, path: &str, args: &[&str]) -> (i32, String, String) {
    let url = format!("https://{sni}:{tls_port}{path}");
    let out = Command::new(support::debian::require("curl"))
        .args(["-sk", "-v", "--max-time", "5"])
        .arg("--resolve")
        .arg(format!("{sni}:{tls_port}:127.0.0.1"))
        .args(args)
        .arg(url)
        .current_dir(cert_dir())
        .output()
        .expect("curl is installed");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The subject CN of the certificate curl was shown.
fn subject_cn(stderr: &str) -> Option<String> {
    let line = stderr.lines().find(|l| l.contains("subject:"))?;
    let cn = line.split("CN=").nth(1)?;
    Some(cn.split([';', ',', '/']).next()?.trim().to_owned())
}

/// `openssl s_client` output for one handshake.
fn s_client(port: u16, args: &[&str]) -> String {
    let out = Command::new("openssl")
        .arg("s_client")
        .arg("-connect")
        .arg(format!("127.0.0.1:{port}"))
        .args(args)
        .current_dir(cert_dir())
        .stdin(Stdio::null())
        .output()
        .expect("openssl is installed");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn s_client_cn(port: u16, sni: &str) -> Option<String> {
    let out = s_client(port, &["-servername", sni]);
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("subject="))?;
    Some(
        line.split("CN = ")
            .nth(1)?
            .split(',')
            .next()?
            .trim()
            .to_owned(),
    )
}

#[test]
fn sni_chooses_the_certificate_exact_wildcard_and_none() {
    let up = Upstream::start("a", Behaviour::Echo);
    let ssls = ssl_yaml("1", "server.local", "server.crt", "server.key", "\n")
        + &ssl_yaml("2", "*.wild.local", "wild.crt", "wild.key", "\n");
    let t = start(&ssls, &route("1", "/t", &up.node()));

    let (code, body, err) = curl(&t, "server.local", "/t", &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(subject_cn(&err).as_deref(), Some("server.local"));
    let echo: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["headers"]["x-forwarded-proto"], "https");

    let (code, _, err) = curl(&t, "a.wild.local", "/t", &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(subject_cn(&err).as_deref(), Some("*.wild.local"));

    // Two labels below the wildcard, an unknown name, and no SNI at all: no certificate.
    for sni in ["a.b.wild.local", "nothing.local"] {
        let (code, _, _) = curl(&t, sni, "/t", &[]);
        assert_ne!(code, 0, "{sni} must fail the handshake");
    }
    let out = s_client(t.tls_port, &["-noservername"]);
    assert!(!out.contains("subject="), "no SNI, no certificate: {out}");

    // The plain port still says http.
    let r = support::get(t.gw.addr(), "/t");
    assert_eq!(r.json()["headers"]["x-forwarded-proto"], "http");
}

/// Sessions resume from the gateway's session cache (APISIX's default has
/// `ssl_session_tickets` off): TLS 1.2 by session id, TLS 1.3 by the stateful ticket the
/// cache keeps, which serves once.
#[test]
fn sessions_resume_from_the_cache() {
    let up = Upstream::start("a", Behaviour::Echo);
    let ssls = ssl_yaml("1", "server.local", "server.crt", "server.key", "\n");
    let t = start(&ssls, &route("1", "/t", &up.node()));
    let dir = std::env::temp_dir().join(format!("ferrisix-tls-sessions-{}", t.tls_port));
    std::fs::create_dir_all(&dir).unwrap();
    // A request with `Connection: close` keeps s_client reading until the gateway closes, so
    // it takes in a TLS 1.3 ticket, which comes after the handshake.
    let request = |args: &[&str]| {
        let mut child = Command::new("openssl")
            .arg("s_client")
            .arg("-connect")
            .arg(format!("127.0.0.1:{}", t.tls_port))
            .args(["-servername", "server.local", "-ign_eof"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("openssl is installed");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"GET /t HTTP/1.1\r\nHost: server.local\r\nConnection: close\r\n\r\n")
            .unwrap();
        let out = child.wait_with_output().unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    for (version, flag) in [("TLSv1.2", "-tls1_2"), ("TLSv1.3", "-tls1_3")] {
        let saved = dir.join(version);
        let saved = saved.to_str().unwrap();
        let first = request(&[flag, "-sess_out", saved]);
        assert!(first.contains(&format!("New, {version}")), "{first}");
        assert!(first.contains("HTTP/1.1 200"), "{first}");
        let again = request(&[flag, "-sess_in", saved]);
        assert!(again.contains(&format!("Reused, {version}")), "{again}");
        if version == "TLSv1.3" {
            // The ticket left the cache with its use: it does not resume a second time.
            let third = s_client(
                t.tls_port,
                &["-servername", "server.local", flag, "-sess_in", saved],
            );
            assert!(third.contains("New, TLSv1.3"), "{third}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rsa_and_ecdsa_pairs_follow_the_client() {
    let up = Upstream::start("a", Behaviour::Echo);
    let extra = format!(
        "\n    certs:\n      - {}    keys:\n      - {}",
        block(&pem("dual-ecdsa.crt"), 8),
        block(&pem("dual-ecdsa.key"), 8)
    );
    let ssls = ssl_yaml("1", "dual.local", "dual-rsa.crt", "dual-rsa.key", &extra);
    let t = start(&ssls, &route("1", "/t", &up.node()));
    let rsa = s_client(
        t.tls_port,
        &[
            "-servername",
            "dual.local",
            "-tls1_2",
            "-cipher",
            "ECDHE-RSA-AES128-GCM-SHA256",
        ],
    );
    assert!(rsa.contains("Server public key is 2048 bit"), "{rsa}");
    let ec = s_client(
        t.tls_port,
        &[
            "-servername",
            "dual.local",
            "-tls1_2",
            "-cipher",
            "ECDHE-ECDSA-AES128-GCM-SHA256",
        ],
    );
    assert!(ec.contains("Server public key is 256 bit"), "{ec}");
    // TLS 1.3 with ECDSA signature schemes only.
    let ec13 = s_client(
        t.tls_port,
        &[
            "-servername",
            "dual.local",
            "-tls1_3",
            "-sigalgs",
            "ECDSA+SHA256",
        ],
    );
    assert!(ec13.contains("Server public key is 256 bit"), "{ec13}");
}

#[test]
fn client_certificates_verified_in_the_handshake() {
    let up = Upstream::start("a", Behaviour::Echo);
    let client = format!(
        "\n    client:\n      ca: {}",
        block(&pem("client-ca.crt"), 8)
    );
    let ssls = ssl_yaml("1", "server.local", "server.crt", "server.key", &client);
    let t = start(&ssls, &route("1", "/t", &up.node()));
    let (code, _, err) = curl(
        &t,
        "server.local",
        "/t",
        &["--cert", "client.crt", "--key", "client.key"],
    );
    assert_eq!(code, 0, "{err}");
    for (cert, key) in [
        (None, None),
        (Some("rogue.crt"), Some("rogue.key")),
        (Some("expired-client.crt"), Some("expired-client.key")),
    ] {
        let mut args = vec![];
        if let (Some(c), Some(k)) = (cert, key) {
            args = vec!["--cert", c, "--key", k];
        }
        let (code, body, _) = curl(&t, "server.local", "/t", &args);
        assert_ne!(code, 0, "{cert:?} must be refused, got {body}");
    }
}

#[test]
fn skip_mtls_uri_regex_answers_400_elsewhere() {
    let up = Upstream::start("a", Behaviour::Echo);
    let client = format!(
        "\n    client:\n      ca: {}      skip_mtls_uri_regex:\n        - \"^/open.*\"\n",
        block(&pem("client-ca.crt"), 8)
    );
    let ssls = ssl_yaml("1", "server.local", "server.crt", "server.key", &client);
    let t = start(&ssls, &route("1", "/*", &up.node()));
    let status = |path: &str, args: &[&str]| {
        let mut a = vec![
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            "Host: server.local",
        ];
        a.extend_from_slice(args);
        curl(&t, "server.local", path, &a).1
    };
    assert_eq!(status("/open/1", &[]), "200");
    assert_eq!(status("/closed", &[]), "400");
    assert_eq!(
        status("/closed", &["--cert", "rogue.crt", "--key", "rogue.key"]),
        "400"
    );
    assert_eq!(
        status("/closed", &["--cert", "client.crt", "--key", "client.key"]),
        "200"
    );
}

#[test]
fn h2_by_alpn_and_h2c_with_prior_knowledge() {
    let up = Upstream::start("a", Behaviour::Echo);
    let ssls = ssl_yaml("1", "server.local", "server.crt", "server.key", "\n");
    let t = start(&ssls, &route("1", "/t", &up.node()));
    let (_, v, err) = curl(
        &t,
        "server.local",
        "/t",
        &["--http2", "-o", "/dev/null", "-w", "%{http_version}"],
    );
    assert_eq!(v, "2", "{err}");
    let (_, v, _) = curl(
        &t,
        "server.local",
        "/t",
        &["--http1.1", "-o", "/dev/null", "-w", "%{http_version}"],
    );
    assert_eq!(v, "1.1");
    let out = Command::new(support::debian::require("curl"))
        .args([
            "-s",
            "--http2-prior-knowledge",
            "-o",
            "/dev/null",
            "-w",
            "%{http_version} %{http_code}",
        ])
        .arg(format!("http://127.0.0.1:{}/t", t.gw.port))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "2 200");
}

/// `apisix.enable_http2: false`: neither port speaks HTTP/2 (APISIX renders no `http2 on;`),
/// so an h2c preface on the plain port is refused and ALPN offers no `h2`.
#[test]
fn http2_off_serves_http1_alone_on_both_ports() {
    let up = Upstream::start("a", Behaviour::Echo);
    let t = start_with(
        &ssl_yaml("1", "server.local", "server.crt", "server.key", "\n"),
        &route("1", "/t", &up.node()),
        "enable_http2: false\n",
        "",
    );
    let plain = |args: &[&str]| {
        let out = Command::new(support::debian::require("curl"))
            .args([
                "-s",
                "--max-time",
                "5",
                "-o",
                "/dev/null",
                "-w",
                "%{http_version} %{http_code}",
            ])
            .args(args)
            .arg(format!("http://127.0.0.1:{}/t", t.gw.port))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(plain(&["--http1.1"]), "1.1 200");
    let h2c = plain(&["--http2-prior-knowledge"]);
    assert!(!h2c.starts_with("2 "), "h2c must be refused, got {h2c:?}");
    // Keep-alive still works on the HTTP/1 builder: two requests on one connection.
    let url = format!("http://127.0.0.1:{}/t", t.gw.port);
    let out = Command::new(support::debian::require("curl"))
        .args([
            "-sv",
            "--max-time",
            "5",
            "-o",
            "/dev/null",
            "-o",
            "/dev/null",
        ])
        .args([&url, &url])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Re-using existing connection") || err.contains("Reusing existing"),
        "{err}"
    );
    let (_, v, err) = curl(
        &t,
        "server.local",
        "/t",
        &["--http2", "-o", "/dev/null", "-w", "%{http_version}"],
    );
    assert_eq!(v, "1.1", "ALPN must not offer h2: {err}");
}

#[test]
fn certificate_swap_applies_to_new_handshakes_and_keeps_open_connections() {
    let up = Upstream::start("a", Behaviour::Echo);
    let routes = route("1", "/t", &up.node());
    let t = start(
        &ssl_yaml("1", "server.local", "server.crt", "server.key", "\n"),
        &routes,
    );
    // An open connection, through openssl's client, kept across the change.
    let mut held = Command::new("openssl")
        .args([
            "s_client",
            "-quiet",
            "-servername",
            "server.local",
            "-connect",
        ])
        .arg(format!("127.0.0.1:{}", t.tls_port))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = held.stdin.take().unwrap();
    let mut stdout = held.stdout.take().unwrap();
    let req = b"GET /t HTTP/1.1\r\nHost: server.local\r\n\r\n";
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            let _ = tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    });
    let read_answer = |rx: &std::sync::mpsc::Receiver<String>| {
        let mut got = String::new();
        while !got.contains("\"upstream\"") {
            match rx.recv_timeout(Duration::from_secs(5)) {
                Ok(s) => got.push_str(&s),
                Err(_) => break,
            }
        }
        got
    };
    stdin.write_all(req).unwrap();
    assert!(read_answer(&rx).starts_with("HTTP/1.1 200"));
    assert_eq!(
        s_client_cn(t.tls_port, "server.local").as_deref(),
        Some("server.local")
    );

    // The same SNI now served by another certificate.
    t.gw.rewrite_routes(&format!(
        "ssls:\n{}\nroutes:\n{routes}",
        ssl_yaml("1", "server.local", "other.crt", "other.key", "\n")
    ));
    let swapped = support::poll_until(Duration::from_secs(5), || {
        s_client_cn(t.tls_port, "server.local").as_deref() == Some("other.local")
    });
    assert!(swapped.is_some(), "new handshakes see the new certificate");
    stdin.write_all(req).unwrap();
    let second = read_answer(&rx);
    assert!(
        second.starts_with("HTTP/1.1 200"),
        "the open connection still serves: {second:?}"
    );
    let _ = held.kill();
    let _ = held.wait();
}

#[test]
fn bad_certificate_is_quarantined_alone_and_mismatched_key_fails_its_handshakes() {
    let up = Upstream::start("a", Behaviour::Echo);
    let broken = format!(
        "  - id: \"9\"\n    sni: \"broken.local\"\n    cert: |\n      -----BEGIN CERTIFICATE-----\n      MIIBkjCB\n      -----END CERTIFICATE-----\n    key: {}",
        block(&pem("other.key"), 6)
    );
    let ssls = ssl_yaml("1", "server.local", "server.crt", "server.key", "\n")
        + &broken
        + &ssl_yaml("2", "*.wild.local", "wild.crt", "other.key", "\n");
    let t = start(&ssls, &route("1", "/t", &up.node()));
    let (code, _, err) = curl(&t, "server.local", "/t", &[]);
    assert_eq!(code, 0, "the good ssl keeps serving: {err}");
    let (code, _, _) = curl(&t, "broken.local", "/t", &[]);
    assert_ne!(code, 0);
    let (code, _, _) = curl(&t, "a.wild.local", "/t", &[]);
    assert_ne!(code, 0, "a key of another certificate fails the handshake");
}

#[test]
fn bad_input_on_the_tls_port() {
    let up = Upstream::start("a", Behaviour::Echo);
    let ssls = ssl_yaml("1", "server.local", "server.crt", "server.key", "\n");
    let t = start_with(
        &ssls,
        &route("1", "/t", &up.node()),
        "",
        "client_header_timeout: 1s",
    );
    // Plain HTTP: nginx's 400.
    let mut s = TcpStream::connect(("127.0.0.1", t.tls_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /t HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("The plain HTTP request was sent to HTTPS port"));

    // Garbage, and a client that stalls after connecting: cut off.
    for send in [
        &b"\x01\x02\x03garbage"[..],
        &b""[..],
        &b"\x16\x03\x01\x00"[..],
    ] {
        let mut s = TcpStream::connect(("127.0.0.1", t.tls_port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(send).unwrap();
        let started = std::time::Instant::now();
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).unwrap_or(0);
        assert!(
            n == 0 || buf[0] == 0x15,
            "closed or a TLS alert: {:?}",
            &buf[..n]
        );
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "cut off by the handshake timeout"
        );
    }

    // An oversized ClientHello (a 70 KB extension) is refused, and the server stays up.
    let mut s = TcpStream::connect(("127.0.0.1", t.tls_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let body_len: usize = 70_000;
    let mut hello = vec![0x16, 0x03, 0x01];
    hello.extend_from_slice(&(16_000u16).to_be_bytes());
    hello.push(0x01);
    hello.extend_from_slice(&[
        (body_len >> 16) as u8,
        (body_len >> 8) as u8,
        body_len as u8,
    ]);
    hello.resize(5 + 16_000, 0);
    let _ = s.write_all(&hello);
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).unwrap_or(0);
    assert!(n == 0 || buf[0] == 0x15, "{:?}", &buf[..n]);
    let (code, _, err) = curl(&t, "server.local", "/t", &[]);
    assert_eq!(code, 0, "{err}");

    // TLS 1.2 renegotiation is refused: rustls answers a no_renegotiation alert and never
    // starts a second handshake.
    let reneg = Command::new("openssl")
        .args([
            "s_client",
            "-state",
            "-tls1_2",
            "-servername",
            "server.local",
            "-connect",
        ])
        .arg(format!("127.0.0.1:{}", t.tls_port))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reneg = reneg;
    let mut stdin = reneg.stdin.take().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // s_client renegotiates on a line that is just R.
    let _ = stdin.write_all(b"R\n");
    std::thread::sleep(Duration::from_millis(1000));
    let _ = reneg.kill();
    let out = reneg.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("RENEGOTIATING"), "{text}");
    let after = text.split("RENEGOTIATING").nth(1).unwrap_or("");
    assert!(
        !after.contains("read server hello"),
        "the server never answers a renegotiation: {text}"
    );
}

/// nginx as an HTTPS upstream: it reports the SNI it got and the client certificate shown.
fn nginx_tls_upstream() -> support::nginx::NginxTls {
    let ca = cert_dir().join("client-ca.crt");
    support::nginx::NginxTls::start(
        false,
        &format!(
            "ssl_client_certificate {}; ssl_verify_client optional;",
            ca.display()
        ),
        "sni=$ssl_server_name verify=$ssl_client_verify dn=$ssl_client_s_dn host=$http_host",
    )
}

fn https_route(id: &str, uri: &str, node: &str, tls: &str) -> String {
    format!(
        "  - id: \"{id}\"\n    uri: \"{uri}\"\n    upstream:\n      type: roundrobin\n      scheme: https\n      nodes:\n        \"{node}\": 1\n{tls}"
    )
}

#[test]
fn https_upstreams_sni_client_certificates_and_verification() {
    let up = nginx_tls_upstream();
    let node = format!("127.0.0.1:{}", up.port);
    let inline_cert = format!(
        "      tls:\n        client_cert: {}        client_key: {}",
        block(&pem("client.crt"), 10),
        block(&pem("client.key"), 10)
    );
    let client_ssl = format!(
        "  - id: \"c\"\n    type: client\n    cert: {}    key: {}",
        block(&pem("client.crt"), 6),
        block(&pem("client.key"), 6)
    );
    let routes = https_route("1", "/plain", &node, "")
        + &https_route("2", "/cert", &node, &inline_cert)
        + &https_route(
            "3",
            "/by-id",
            &node,
            "      tls:\n        client_cert_id: \"c\"\n",
        )
        + &https_route(
            "4",
            "/verified",
            &node,
            "      tls:\n        verify: true\n",
        );
    let tls_port = free_port();
    let gw = Gateway::start_full(
        &format!("ssls:\n{client_ssl}\nroutes:\n{routes}"),
        &format!(
            "ssl:\n  listen:\n    - ip: 127.0.0.1\n      port: {tls_port}\n  ssl_trusted_certificate: {}/ca.crt",
            cert_dir().display()
        ),
        "",
    );
    let get = |path: &str, host: &str| {
        let r = support::get_host(gw.addr(), path, host);
        (r.status, r.text())
    };
    let (status, text) = get("/plain", "server.local");
    assert_eq!(status, 200, "{text}");
    assert!(text.starts_with("sni=server.local verify=NONE"), "{text}");
    assert!(text.ends_with("host=server.local"), "{text}");
    let (_, text) = get("/plain", "server.local:8443");
    assert!(
        text.starts_with("sni=server.local "),
        "the port is not part of the SNI: {text}"
    );
    // Alternating between client certificates on one node: pools are keyed by certificate.
    for _ in 0..2 {
        let (_, text) = get("/cert", "server.local");
        assert!(
            text.contains("verify=SUCCESS dn=O=ferrisix-test,CN=client"),
            "{text}"
        );
        let (_, text) = get("/plain", "server.local");
        assert!(text.contains("verify=NONE"), "{text}");
        let (_, text) = get("/by-id", "server.local");
        assert!(text.contains("verify=SUCCESS"), "{text}");
    }
    // tls.verify checks the upstream's certificate against ssl_trusted_certificate and the SNI.
    assert_eq!(get("/verified", "server.local").0, 200);
    assert_eq!(get("/verified", "localhost").0, 200);
    assert_eq!(get("/verified", "wrong.local").0, 502);
}

/// A rustls client trusting the test CA, offering only `version`, resuming from its own
/// session store, with the client certificate `client` (name of a `.crt`/`.key` pair).
fn rustls_client(
    version: &'static rustls::SupportedProtocolVersion,
    client: Option<&str>,
) -> std::sync::Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(cert_dir().join("ca.crt")).unwrap())
        .unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[version])
    .unwrap()
    .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some(name) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(cert_dir().join(format!("{name}.crt")))
                    .unwrap()
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap(),
                PrivateKeyDer::from_pem_file(cert_dir().join(format!("{name}.key"))).unwrap(),
            )
            .unwrap(),
    };
    std::sync::Arc::new(config)
}

/// One `GET /t` over a new connection with `config`: the handshake's kind and the answer's
/// status code, or the error that ended it.
fn rustls_get(
    port: u16,
    config: &std::sync::Arc<rustls::ClientConfig>,
) -> (Option<rustls::HandshakeKind>, Result<String, String>) {
    let name = rustls::pki_types::ServerName::try_from("server.local").unwrap();
    let mut conn = rustls::ClientConnection::new(config.clone(), name).unwrap();
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
    // `Connection: close` reads the answer to its end, and with it the TLS 1.3 tickets that
    // follow the handshake.
    let answer = tls
        .write_all(b"GET /t HTTP/1.1\r\nHost: server.local\r\nConnection: close\r\n\r\n")
        .and_then(|()| {
            let mut text = Vec::new();
            match tls.read_to_end(&mut text) {
                // A close without close_notify still ends a `Connection: close` answer.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !text.is_empty() => {
                    Ok(text)
                }
                r => r.map(|_| text),
            }
        })
        .map(|text| {
            let text = String::from_utf8_lossy(&text).into_owned();
            let status = text.lines().next().unwrap_or_default();
            status.split(' ').nth(1).unwrap_or(status).to_owned()
        })
        .map_err(|e| e.to_string());
    (conn.handshake_kind(), answer)
}

/// A session made while the ssl asked for no client certificate does not resume once the ssl
/// requires one: the client without a certificate gets a full handshake, which is refused.
/// Sessions made under the new policy resume again. Both TLS versions, with the session
/// cache (TLS 1.2 session ids, TLS 1.3 stateful tickets) and with stateless tickets.
#[test]
fn sessions_do_not_resume_past_a_new_client_certificate_requirement() {
    let up = Upstream::start("a", Behaviour::Echo);
    for tickets in [false, true] {
        let tls_port = free_port();
        let gw = support::StoreGatewayBuilder::embedded()
            .apisix_key(&format!(
                "ssl:\n  listen:\n    - ip: 127.0.0.1\n      port: {tls_port}\n  ssl_session_tickets: {tickets}"
            ))
            .start();
        gw.put_route(
            "1",
            &serde_json::json!({"uri": "/t", "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}),
        );
        let put_ssl = |client: bool| {
            let mut ssl = serde_json::json!({
                "snis": ["server.local"], "cert": pem("server.crt"), "key": pem("server.key"),
            });
            if client {
                ssl["client"] = serde_json::json!({"ca": pem("client-ca.crt")});
            }
            let r = gw.admin("PUT", "/apisix/admin/ssls/1", &ssl.to_string());
            assert!(matches!(r.status, 200 | 201), "{}", r.text());
        };
        put_ssl(false);
        let ok = Ok("200".to_owned());
        let versions = [&rustls::version::TLS12, &rustls::version::TLS13];
        let anonymous: Vec<_> = versions.iter().map(|v| rustls_client(v, None)).collect();
        for config in &anonymous {
            let served = support::poll_until(Duration::from_secs(5), || {
                rustls_get(tls_port, config).1 == ok
            });
            assert!(
                served.is_some(),
                "the ssl serves (tickets {tickets}): {:?}",
                rustls_get(tls_port, config)
            );
            let (kind, answer) = rustls_get(tls_port, config);
            assert_eq!(answer, ok);
            assert_eq!(
                kind,
                Some(rustls::HandshakeKind::Resumed),
                "sessions resume under an unchanged policy (tickets {tickets})"
            );
            // Leaves a session in the client's store for after the change.
            assert_eq!(rustls_get(tls_port, config).1, ok);
        }

        put_ssl(true);
        let refused = support::poll_until(Duration::from_secs(5), || {
            rustls_get(tls_port, &rustls_client(&rustls::version::TLS13, None))
                .1
                .is_err()
        });
        assert!(
            refused.is_some(),
            "a fresh handshake without a certificate is refused"
        );
        for (version, config) in versions.iter().zip(&anonymous) {
            let (kind, answer) = rustls_get(tls_port, config);
            assert!(
                kind != Some(rustls::HandshakeKind::Resumed) && answer.is_err(),
                "{version:?} (tickets {tickets}): an old session must not pass the new \
                 client-certificate requirement, got {kind:?} {answer:?}"
            );
        }
        // Under the new policy, with a certificate, sessions resume again.
        for version in versions {
            let config = rustls_client(version, Some("client"));
            let (kind, answer) = rustls_get(tls_port, &config);
            assert_eq!(
                (kind, answer),
                (Some(rustls::HandshakeKind::Full), ok.clone())
            );
            let (kind, answer) = rustls_get(tls_port, &config);
            assert_eq!(
                (kind, answer),
                (Some(rustls::HandshakeKind::Resumed), ok.clone()),
                "{version:?} (tickets {tickets})"
            );
        }
    }
}

/// rustls's verifier (webpki) takes X.509 v3 certificates only, where OpenSSL (and so APISIX)
/// also takes v1: a v1 client certificate that chains to the ssl's `client.ca` fails the
/// handshake, with the log line docs/tls.md quotes. This pins that behaviour: when a rustls
/// update accepts v1 certificates, this test fails and the docs must change with it.
#[test]
fn x509_v1_client_certificates_are_refused_with_a_log_line() {
    let v1 = Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in", "client-v1.crt"])
        .current_dir(cert_dir())
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&v1.stdout).contains("Version: 1 (0x0)"));
    let chain = Command::new("openssl")
        .args(["verify", "-CAfile", "client-ca.crt", "client-v1.crt"])
        .current_dir(cert_dir())
        .output()
        .unwrap();
    assert!(chain.status.success(), "OpenSSL accepts the v1 certificate");

    let up = Upstream::start("a", Behaviour::Echo);
    let tls_port = free_port();
    let gw = support::StoreGatewayBuilder::embedded()
        .apisix_key(&format!(
            "ssl:\n  listen:\n    - ip: 127.0.0.1\n      port: {tls_port}"
        ))
        .log_filter("info")
        .start();
    gw.put_route(
        "1",
        &serde_json::json!({"uri": "/t", "upstream": {"type": "roundrobin", "nodes": {up.node(): 1}}}),
    );
    let ssl = serde_json::json!({
        "snis": ["server.local"], "cert": pem("server.crt"), "key": pem("server.key"),
        "client": {"ca": pem("client-ca.crt")},
    });
    let r = gw.admin("PUT", "/apisix/admin/ssls/1", &ssl.to_string());
    assert!(matches!(r.status, 200 | 201), "{}", r.text());
    let v3 = support::poll_until(Duration::from_secs(5), || {
        let args = ["--cert", "client.crt", "--key", "client.key"];
        curl_port(tls_port, "server.local", "/t", &args).0 == 0
    });
    assert!(v3.is_some(), "a v3 certificate from the same CA is served");
    let (code, body, _) = curl_port(
        tls_port,
        "server.local",
        "/t",
        &["--cert", "client-v1.crt", "--key", "client-v1.key"],
    );
    assert_ne!(code, 0, "the v1 certificate is refused, got {body}");
    let line =
        "TLS handshake failed: invalid peer certificate: Other(OtherError(UnsupportedCertVersion))";
    let logged = support::poll_until(Duration::from_secs(2), || gw.log_text().contains(line));
    assert!(logged.is_some(), "expected {line:?} in:\n{}", gw.log_text());

    // With skip_mtls_uri_regex the handshake asks without requiring, yet the signature check
    // parses the certificate too: a v1 certificate fails the handshake even for a URI that
    // needs none (the same URI without a certificate is served).
    let ssl = serde_json::json!({
        "snis": ["server.local"], "cert": pem("server.crt"), "key": pem("server.key"),
        "client": {"ca": pem("client-ca.crt"), "skip_mtls_uri_regex": ["^/t"]},
    });
    let r = gw.admin("PUT", "/apisix/admin/ssls/1", &ssl.to_string());
    assert!(matches!(r.status, 200 | 201), "{}", r.text());
    let lenient = support::poll_until(Duration::from_secs(5), || {
        curl_port(tls_port, "server.local", "/t", &[]).0 == 0
    });
    assert!(lenient.is_some(), "/t is served without a certificate");
    let before = gw.log_text().matches(line).count();
    let (code, body, _) = curl_port(
        tls_port,
        "server.local",
        "/t",
        &["--cert", "client-v1.crt", "--key", "client-v1.key"],
    );
    assert_ne!(
        code, 0,
        "the v1 certificate fails the handshake, got {body}"
    );
    let logged = support::poll_until(Duration::from_secs(2), || {
        gw.log_text().matches(line).count() > before
    });
    assert!(logged.is_some(), "expected {line:?} in:\n{}", gw.log_text());
}

/// A TLS 1.3 ClientHello, one record, whose server_name extension carries `sni` as is.
fn client_hello_with_sni(sni: &[u8]) -> Vec<u8> {
    let u16be = |n: usize| u16::try_from(n).unwrap().to_be_bytes();
    let mut server_name = vec![0u8]; // host_name
    server_name.extend_from_slice(&u16be(sni.len()));
    server_name.extend_from_slice(sni);
    let mut list = u16be(server_name.len()).to_vec();
    list.extend_from_slice(&server_name);
    let mut extensions = vec![0x00, 0x00];
    extensions.extend_from_slice(&u16be(list.len()));
    extensions.extend_from_slice(&list);
    // supported_versions: TLS 1.3.
    extensions.extend_from_slice(&[0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04]);
    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[7u8; 32]);
    body.push(0); // session id
    body.extend_from_slice(&[0x00, 0x02, 0x13, 0x01]);
    body.extend_from_slice(&[0x01, 0x00]);
    body.extend_from_slice(&u16be(extensions.len()));
    body.extend_from_slice(&extensions);
    let mut handshake = vec![0x01, 0x00];
    handshake.extend_from_slice(&u16be(body.len()));
    handshake.extend_from_slice(&body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend_from_slice(&u16be(handshake.len()));
    record.extend_from_slice(&handshake);
    record
}

/// The SNI is the client's, read before any authentication: a long one (a 10 KB name is no
/// DNS name, but a ClientHello carries it) is not logged whole on every handshake.
#[test]
fn a_long_sni_is_logged_truncated() {
    let tls_port = free_port();
    let gw = support::StoreGatewayBuilder::embedded()
        .apisix_key(&format!(
            "ssl:\n  listen:\n    - ip: 127.0.0.1\n      port: {tls_port}"
        ))
        .log_filter("info")
        .start();
    let ssl = serde_json::json!({
        "snis": ["server.local"], "cert": pem("server.crt"), "key": pem("server.key"),
    });
    let r = gw.admin("PUT", "/apisix/admin/ssls/1", &ssl.to_string());
    assert!(matches!(r.status, 200 | 201), "{}", r.text());
    let sni = "x".repeat(10_000) + ".test";
    let mut s = TcpStream::connect(("127.0.0.1", tls_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&client_hello_with_sni(sni.as_bytes())).unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    assert!(
        answer.is_empty() || answer[0] == 0x15,
        "closed or an alert: {answer:?}"
    );
    let logged = support::poll_until(Duration::from_secs(2), || {
        gw.log_text()
            .contains("TLS handshake failed: peer misbehaved: ServerNameMustContainOneHostName")
    });
    let log = gw.log_text();
    assert!(logged.is_some(), "the handshake is logged: {log}");
    let longest = log.lines().map(str::len).max().unwrap_or(0);
    assert!(
        longest < 2048,
        "a log line of {longest} bytes: {}",
        log.lines()
            .find(|l| l.len() == longest)
            .unwrap()
            .chars()
            .take(300)
            .collect::<String>()
    );
}
