//! etcd interop for ssls: an ssl object stored as APISIX stores it (the private key AES-128-CBC
//! encrypted with the keyring's first key as key and IV, base64; here encrypted by the openssl
//! CLI, an implementation independent of ferrisix's) is decrypted and served; and one written
//! through ferrisix's Admin API lands in etcd in the same form, readable the same way.

use crate::support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;
use support::etcd::Etcd;
use support::{free_port, StoreGatewayBuilder};

fn cert_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tls")
}

fn pem(name: &str) -> String {
    std::fs::read_to_string(cert_dir().join(name)).unwrap()
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// `openssl enc -aes-128-cbc -K key -iv key | base64`, as APISIX's resty.aes does it.
fn openssl_encrypt(key: &str, plain: &str) -> String {
    use std::io::Write;
    let mut child = Command::new("openssl")
        .args([
            "enc",
            "-aes-128-cbc",
            "-a",
            "-A",
            "-K",
            &hex(key),
            "-iv",
            &hex(key),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(plain.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn openssl_decrypt(key: &str, b64: &str) -> String {
    use std::io::Write;
    let mut child = Command::new("openssl")
        .args([
            "enc",
            "-d",
            "-aes-128-cbc",
            "-a",
            "-A",
            "-K",
            &hex(key),
            "-iv",
            &hex(key),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b64.as_bytes())
        .unwrap();
    String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap()
}

fn served_cn(port: u16, sni: &str) -> Option<String> {
    let out = Command::new("openssl")
        .args(["s_client", "-servername", sni, "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
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
fn ssls_encrypted_as_apisix_does_are_served_and_written_alike() {
    let etcd = Etcd::start();
    let kv = etcd.kv();
    // APISIX's default keyring; the first key encrypts.
    let first = "qeddd145sfvddff3";
    let stored = json!({
        "id": "1", "sni": "server.local", "type": "server", "status": 1,
        "cert": pem("server.crt"),
        "key": openssl_encrypt(first, &pem("server.key")),
        "create_time": 1, "update_time": 1,
    });
    assert!(!stored["key"].as_str().unwrap().starts_with("---"));
    kv.put("/apisix/ssls/1", stored.to_string());
    // A key encrypted with the second (older) keyring entry still reads: rotation by order.
    let rotated = json!({
        "id": "2", "sni": "other.local",
        "cert": pem("other.crt"),
        "key": openssl_encrypt("edd1c9f0985e76a2", &pem("other.key")),
    });
    kv.put("/apisix/ssls/2", rotated.to_string());

    let tls_port = free_port();
    let gw = StoreGatewayBuilder::etcd(&etcd.endpoint())
        .apisix_key(&format!(
            "ssl:\n  listen:\n    - ip: 127.0.0.1\n      port: {tls_port}"
        ))
        .start();
    let ok = support::poll_until(Duration::from_secs(10), || {
        served_cn(tls_port, "server.local").as_deref() == Some("server.local")
    });
    assert!(ok.is_some(), "the APISIX-encrypted ssl is served");
    assert_eq!(
        served_cn(tls_port, "other.local").as_deref(),
        Some("other.local")
    );

    // Written through ferrisix's Admin API: etcd holds the key encrypted the APISIX way.
    let r = gw.admin(
        "PUT",
        "/apisix/admin/ssls/3",
        &json!({"sni": "*.wild.local", "cert": pem("wild.crt"), "key": pem("wild.key")})
            .to_string(),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let raw = kv.get("/apisix/ssls/3").expect("written to etcd");
    let value: serde_json::Value = serde_json::from_slice(&raw.value).unwrap();
    let key = value["key"].as_str().unwrap();
    assert!(!key.starts_with("---"), "stored encrypted");
    assert_eq!(openssl_decrypt(first, key), pem("wild.key"));
    let ok = support::poll_until(Duration::from_secs(10), || {
        served_cn(tls_port, "a.wild.local").as_deref() == Some("*.wild.local")
    });
    assert!(ok.is_some());
    // The Admin API never shows the key.
    let r = gw.admin("GET", "/apisix/admin/ssls/3", "");
    assert!(r.json()["value"].get("key").is_none());
}

/// An upstream's `tls.client_cert_id` whose ssl stops being a client certificate (changed into
/// a server ssl, then deleted): APISIX keeps the route and its balancer phase answers 502 with
/// "failed to get ssl cert: ..." before any try (`resolve_upstream_client_cert`).
fn client_cert_id_losing_its_ssl(builder: StoreGatewayBuilder) {
    let gw = builder.start();
    let client = json!({ "type": "client", "cert": pem("client.crt"), "key": pem("client.key") });
    let r = gw.admin("PUT", "/apisix/admin/ssls/c", &client.to_string());
    assert!(r.status == 200 || r.status == 201, "{}", r.text());
    // The node refuses connections: a try shows in X-APISIX-Upstream-Status, the answer given
    // before any try does not.
    let route = json!({
        "uri": "/by-id",
        "upstream": {
            "scheme": "https",
            "nodes": { support::dead_node(): 1 },
            "tls": { "client_cert_id": "c" },
        },
    });
    let r = gw.admin("PUT", "/apisix/admin/routes/1", &route.to_string());
    assert!(r.status == 200 || r.status == 201, "{}", r.text());
    let tried = support::poll_until(Duration::from_secs(10), || {
        let r = gw.get("/by-id");
        r.status == 502 && r.header("X-APISIX-Upstream-Status") == Some("502")
    });
    assert!(
        tried.is_some(),
        "the route is served while its ssl is a client one"
    );

    let server = json!({
        "type": "server", "sni": "server.local",
        "cert": pem("server.crt"), "key": pem("server.key"),
    });
    let r = gw.admin("PUT", "/apisix/admin/ssls/c", &server.to_string());
    assert!(r.status == 200 || r.status == 201, "{}", r.text());
    let untried =
        |r: &support::Reply| r.status == 502 && r.header("X-APISIX-Upstream-Status").is_none();
    let answered = support::poll_until(Duration::from_secs(10), || untried(&gw.get("/by-id")));
    let r = gw.get("/by-id");
    assert!(answered.is_some(), "{} {:?}", r.status, r.text());
    let ok = support::poll_until(Duration::from_secs(5), || {
        gw.log_text()
            .contains("failed to get ssl cert: ssl type should be 'client'")
    });
    assert!(ok.is_some(), "{}", gw.log_text());

    let r = gw.admin("DELETE", "/apisix/admin/ssls/c", "");
    assert_eq!(r.status, 200, "{}", r.text());
    let ok = support::poll_until(Duration::from_secs(10), || {
        untried(&gw.get("/by-id"))
            && gw
                .log_text()
                .contains("failed to get ssl cert: ssl id [c] not exits")
    });
    let r = gw.get("/by-id");
    assert!(
        ok.is_some() && untried(&r),
        "{} {:?}\n{}",
        r.status,
        r.text(),
        gw.log_text()
    );
}

#[test]
fn client_cert_id_losing_its_ssl_keeps_the_route_on_the_embedded_store() {
    client_cert_id_losing_its_ssl(StoreGatewayBuilder::embedded());
}

#[test]
fn client_cert_id_losing_its_ssl_keeps_the_route_on_etcd() {
    let etcd = Etcd::start();
    client_cert_id_losing_its_ssl(StoreGatewayBuilder::etcd(&etcd.endpoint()));
}
