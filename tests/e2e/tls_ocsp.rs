//! End-to-end OCSP stapling: Debian's `openssl ocsp` answers as the responder named in the
//! certificates' Authority Information Access (certificates made here by `openssl`), ssls are
//! written through the Admin API with `ocsp_stapling`, and `openssl s_client -status` reads
//! what the gateway staples: the answer for a good certificate, nothing for an ssl that does
//! not ask or a revoked certificate (unless `skip_verify`), APISIX's message in the log.
use crate::support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ferrisix_testkit::openssl_pki::{issue, self_signed};
use serde_json::json;
use support::*;

/// A CA and two leaves (`good` serial 0x1001, `revoked` serial 0x1002) whose AIA names the
/// responder at `url`; `index.txt` says the second is revoked.
fn pki(dir: &Path, url: &str) {
    self_signed(dir, "ca.key", "ca.pem", "/CN=Test OCSP CA", true);
    for (name, serial) in [("good", "0x1001"), ("revoked", "0x1002")] {
        issue(
            dir,
            name,
            &format!("/CN={name}.test"),
            &format!("subjectAltName=DNS:{name}.test\nauthorityInfoAccess=OCSP;URI:{url}\n"),
            serial,
        );
    }
    std::fs::write(
        dir.join("index.txt"),
        "V\t301231000000Z\t\t1001\tunknown\t/CN=good.test\n\
         R\t301231000000Z\t260101000000Z\t1002\tunknown\t/CN=revoked.test\n",
    )
    .unwrap();
}

/// `openssl ocsp` serving `index.txt` on `port`, killed on drop.
struct Responder(Child);

impl Drop for Responder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn responder(dir: &Path, port: u16) -> Responder {
    let mut child = Command::new("openssl")
        .current_dir(dir)
        .args([
            "ocsp",
            "-index",
            "index.txt",
            // OpenSSL 3.0 takes a port alone (every address).
            "-port",
            &port.to_string(),
            "-rsigner",
            "ca.pem",
            "-rkey",
            "ca.key",
            "-CA",
            "ca.pem",
            "-ndays",
            "1",
            "-ignore_err",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl (Debian package openssl) must be installed");
    // Ready once it says so. Not by connecting: OpenSSL 3.0's responder stops answering after
    // a connection that closes without a request.
    let stderr = child.stderr.take().unwrap();
    let r = Responder(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut told = false;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if !told && line.contains("waiting for OCSP client connections") {
                let _ = tx.send(());
                told = true;
            }
        }
    });
    assert!(
        rx.recv_timeout(Duration::from_secs(20)).is_ok(),
        "openssl ocsp did not start listening on {port}"
    );
    r
}

/// `openssl s_client -status` for `sni`: its whole output.
fn s_client_status(port: u16, sni: &str, ca: &Path) -> String {
    s_client_status_with(port, sni, ca, &[])
}

/// [`s_client_status`] with more of s_client's options (`-tls1_2`).
fn s_client_status_with(port: u16, sni: &str, ca: &Path, more: &[&str]) -> String {
    let out = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-servername",
            sni,
            "-status",
            "-CAfile",
        ])
        .arg(ca)
        .args(more)
        .stdin(Stdio::null())
        .output()
        .expect("openssl is installed");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ssl_body(dir: &Path, name: &str, ocsp: serde_json::Value) -> String {
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    json!({
        // The chain: the leaf, then its issuer (the responder is asked about the leaf).
        "cert": format!("{}{}", read(&format!("{name}.pem")), read("ca.pem")),
        "key": read(&format!("{name}.key")),
        "snis": [format!("{name}.test")],
        "ocsp_stapling": ocsp,
    })
    .to_string()
}

#[test]
fn answers_are_fetched_checked_and_stapled() {
    let pki_dir = tempfile::tempdir().unwrap();
    let dir = pki_dir.path();
    let ocsp_port = free_port();
    pki(dir, &format!("http://127.0.0.1:{ocsp_port}/"));
    let _responder = responder(dir, ocsp_port);
    let tls_port = free_port();
    let gw = StoreGatewayBuilder::embedded()
        .apisix_key(&format!(
            "ssl:\n  listen:\n    - ip: 127.0.0.1\n      port: {tls_port}"
        ))
        .log_filter("info,ferrisix_tls=debug")
        .start();
    let ca = dir.join("ca.pem");

    // The field's schema is APISIX's.
    let r = gw.admin(
        "PUT",
        "/apisix/admin/ssls/bad",
        &ssl_body(dir, "good", json!({"enabled": true, "cache_ttl": 10})),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text()
            .contains("property \\\"ocsp_stapling\\\" validation failed"),
        "{}",
        r.text()
    );

    let r = gw.admin(
        "PUT",
        "/apisix/admin/ssls/good",
        &ssl_body(dir, "good", json!({"enabled": true})),
    );
    assert!(r.status == 200 || r.status == 201, "{}", r.text());
    let stapled = poll_until(Duration::from_secs(30), || {
        s_client_status(tls_port, "good.test", &ca).contains("OCSP Response Status: successful")
    });
    let out = s_client_status(tls_port, "good.test", &ca);
    assert!(
        stapled.is_some(),
        "no answer stapled: {out}\n{}",
        gw.log_text()
    );
    assert!(out.contains("Cert Status: good"), "{out}");
    assert!(out.contains("Serial Number: 1001"), "{out}");
    assert!(out.contains("Verify return code: 0 (ok)"), "{out}");
    // TLS 1.2 carries it in its own CertificateStatus message.
    let out = s_client_status_with(tls_port, "good.test", &ca, &["-tls1_2"]);
    assert!(out.contains("Protocol  : TLSv1.2"), "{out}");
    assert!(out.contains("Cert Status: good"), "{out}");

    // The revoked certificate: its answer does not pass the check, nothing is stapled, and
    // the log says why in APISIX's words.
    let r = gw.admin(
        "PUT",
        "/apisix/admin/ssls/revoked",
        &ssl_body(dir, "revoked", json!({"enabled": true})),
    );
    assert!(r.status == 200 || r.status == 201, "{}", r.text());
    let logged = poll_until(Duration::from_secs(30), || {
        gw.log_text().contains(
            "no ocsp response send: failed to validate ocsp response: certificate status \\\"revoked\\\" in the OCSP response",
        ) || gw.log_text().contains(
            "no ocsp response send: failed to validate ocsp response: certificate status \"revoked\" in the OCSP response",
        )
    });
    assert!(logged.is_some(), "{}", gw.log_text());
    // The ssl is checked while it compiles, a moment before it serves.
    let mut out = String::new();
    let served = poll_until(Duration::from_secs(30), || {
        out = s_client_status(tls_port, "revoked.test", &ca);
        out.contains("CN = revoked.test")
    });
    assert!(served.is_some(), "{out}");
    assert!(out.contains("OCSP response: no response sent"), "{out}");

    // skip_verify: the answer is stapled unchecked (the client sees it says revoked).
    let r = gw.admin(
        "PUT",
        "/apisix/admin/ssls/revoked",
        &ssl_body(
            dir,
            "revoked",
            json!({"enabled": true, "skip_verify": true}),
        ),
    );
    assert!(r.status == 200 || r.status == 201, "{}", r.text());
    let stapled = poll_until(Duration::from_secs(30), || {
        s_client_status(tls_port, "revoked.test", &ca).contains("Cert Status: revoked")
    });
    assert!(
        stapled.is_some(),
        "{}",
        s_client_status(tls_port, "revoked.test", &ca)
    );

    // `enabled: false`: nothing stapled.
    let r = gw.admin(
        "PUT",
        "/apisix/admin/ssls/good",
        &ssl_body(dir, "good", json!({"enabled": false})),
    );
    assert!(r.status == 200 || r.status == 201, "{}", r.text());
    let off = poll_until(Duration::from_secs(30), || {
        s_client_status(tls_port, "good.test", &ca).contains("OCSP response: no response sent")
    });
    assert!(
        off.is_some(),
        "{}",
        s_client_status(tls_port, "good.test", &ca)
    );
    // The Admin API keeps the field as written (ssls are stored as sent, as the other fields).
    let r = gw.admin("GET", "/apisix/admin/ssls/good", "");
    assert_eq!(
        r.json()["value"]["ocsp_stapling"],
        json!({"enabled": false})
    );
}
