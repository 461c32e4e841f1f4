//! Certificates made with Debian's `openssl` command for the TLS tests (OCSP stapling's unit
//! and end-to-end tests): a CA, and leaves it signs with the extensions a test names. Files are
//! written into the test's directory under the names given.

use std::path::Path;
use std::process::Command;

/// Runs `openssl` in `dir`; panics with its stderr when it fails.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl (Debian package openssl) must be installed");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A P-256 key in `key`.
pub fn ec_key(dir: &Path, key: &str) {
    openssl(
        dir,
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            key,
        ],
    );
}

/// A self-signed certificate `pem` for a new key `key`, with the CA extensions when `ca`.
pub fn self_signed(dir: &Path, key: &str, pem: &str, subject: &str, ca: bool) {
    ec_key(dir, key);
    let mut args = vec![
        "req", "-x509", "-new", "-key", key, "-subj", subject, "-days", "30", "-out", pem,
    ];
    if ca {
        args.extend([
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
    }
    openssl(dir, &args);
}

/// A leaf `<name>.pem` for a new key `<name>.key`, signed by `ca.pem`/`ca.key` with `serial`
/// and the extensions in `extensions` (an openssl extfile's lines).
pub fn issue(dir: &Path, name: &str, subject: &str, extensions: &str, serial: &str) {
    let (key, csr, ext, pem) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.ext"),
        format!("{name}.pem"),
    );
    ec_key(dir, &key);
    openssl(
        dir,
        &["req", "-new", "-key", &key, "-subj", subject, "-out", &csr],
    );
    std::fs::write(dir.join(&ext), extensions).expect("write the extfile");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-set_serial",
            serial,
            "-days",
            "30",
            "-extfile",
            &ext,
            "-out",
            &pem,
        ],
    );
}
