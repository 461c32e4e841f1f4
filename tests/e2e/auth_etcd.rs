//! etcd interop for consumers: a consumer and a 3.x credential written into etcd the way
//! APISIX's Admin API writes them (key-auth's `key` and basic-auth's `password` AES-128-CBC
//! encrypted with the keyring's first key as key and IV, base64; here encrypted by the openssl
//! CLI, independently of ferrisix), authenticate on ferrisix; and a consumer written through
//! ferrisix's Admin API lands in etcd in that form and is shown decrypted.

use crate::support;

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::etcd::Etcd;
use support::{request, Behaviour, StoreGatewayBuilder, Upstream};

/// APISIX's default keyring's first key.
const FIRST_KEY: &str = "qeddd145sfvddff3";

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// `openssl enc -aes-128-cbc -K key -iv key | base64`, as APISIX's resty.aes does it.
fn openssl_encrypt(plain: &str) -> String {
    use std::io::Write;
    let mut child = Command::new("openssl")
        .args(["enc", "-aes-128-cbc", "-a", "-A", "-K"])
        .arg(hex(FIRST_KEY))
        .arg("-iv")
        .arg(hex(FIRST_KEY))
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

#[test]
fn consumers_written_as_apisix_does_authenticate() {
    let etcd = Etcd::start();
    let kv = etcd.kv();
    let upstream = Upstream::start("u", Behaviour::Echo);
    let consumer = json!({
        "username": "jack",
        "labels": {"custom_id": "cust-1"},
        "plugins": {"key-auth": {"key": openssl_encrypt("jack-key")}},
        "create_time": 1, "update_time": 1,
    });
    kv.put("/apisix/consumers/jack", consumer.to_string());
    let credential = json!({
        "id": "cred-1",
        "plugins": {"basic-auth": {"username": "jack-user", "password": openssl_encrypt("jack-pass")}},
        "create_time": 1, "update_time": 1,
    });
    kv.put(
        "/apisix/consumers/jack/credentials/cred-1",
        credential.to_string(),
    );
    let route = |id: &str, uri: &str, plugin: &str| {
        json!({
            "id": id, "uri": uri,
            "plugins": {plugin: {}},
            "upstream": {"type": "roundrobin", "nodes": {upstream.node(): 1}},
        })
        .to_string()
    };
    kv.put("/apisix/routes/1", route("1", "/key", "key-auth"));
    kv.put("/apisix/routes/2", route("2", "/basic", "basic-auth"));

    let gw = StoreGatewayBuilder::etcd(&etcd.endpoint()).start();
    let addr = gw.data_addr();
    let ok = support::poll_until(Duration::from_secs(10), || {
        request(addr, "GET", "/key", &[("apikey", "jack-key")], b"").status == 200
    });
    assert!(ok.is_some(), "the APISIX-encrypted key authenticates");
    let r = request(addr, "GET", "/key", &[("apikey", "jack-key")], b"");
    let echo = r.json();
    assert_eq!(echo["headers"]["x-consumer-username"], "jack");
    assert_eq!(echo["headers"]["x-consumer-custom-id"], "cust-1");
    assert!(echo["headers"].get("x-credential-identifier").is_none());
    // The ciphertext itself is not a key.
    let cipher = openssl_encrypt("jack-key");
    assert_eq!(
        request(addr, "GET", "/key", &[("apikey", &cipher)], b"").status,
        401
    );

    // basic-auth from the credential, its password encrypted.
    let basic = format!("Basic {}", base64_encode("jack-user:jack-pass"));
    let r = request(addr, "GET", "/basic", &[("authorization", &basic)], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["headers"]["x-credential-identifier"], "cred-1");
    let wrong = format!("Basic {}", base64_encode("jack-user:nope"));
    assert_eq!(
        request(addr, "GET", "/basic", &[("authorization", &wrong)], b"").status,
        401
    );

    // Written through ferrisix's Admin API: etcd holds the key as APISIX would.
    let r = gw.admin(
        "PUT",
        "/apisix/admin/consumers/rose",
        &json!({"username": "rose", "plugins": {"key-auth": {"key": "rose-key"}}}).to_string(),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let raw = kv.get("/apisix/consumers/rose").expect("written to etcd");
    let stored: Value = serde_json::from_slice(&raw.value).unwrap();
    assert_eq!(
        stored["plugins"]["key-auth"]["key"],
        openssl_encrypt("rose-key")
    );
    let r = gw.admin("GET", "/apisix/admin/consumers/rose", "");
    assert_eq!(r.json()["value"]["plugins"]["key-auth"]["key"], "rose-key");
    let ok = support::poll_until(Duration::from_secs(10), || {
        request(addr, "GET", "/key", &[("apikey", "rose-key")], b"").status == 200
    });
    assert!(ok.is_some());
    // A key another consumer holds is refused, encrypted or not.
    let r = gw.admin(
        "PUT",
        "/apisix/admin/consumers/tom",
        &json!({"username": "tom", "plugins": {"key-auth": {"key": "jack-key"}}}).to_string(),
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error_msg"],
        "duplicate key of plugin key-auth found with consumer: jack"
    );
}

fn base64_encode(s: &str) -> String {
    use std::io::Write;
    let mut child = Command::new("base64")
        .arg("-w0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    String::from_utf8(child.wait_with_output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_owned()
}
