//! Debian packages for tests that need real servers (etcd, Redis, Prometheus): installed with
//! apt-get when missing, so the suite runs on a fresh machine.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Runs one apt-get command (through `sudo -n` when not root), panicking with its output on
/// failure.
pub fn apt_get(args: &[&str]) {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    let mut cmd = if root {
        Command::new("apt-get")
    } else {
        let mut c = Command::new("sudo");
        c.args(["-n", "apt-get"]);
        c
    };
    // Wait for a dpkg lock held by someone else instead of failing at once.
    cmd.args(["-o", "DPkg::Lock::Timeout=300", "-q"])
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null());
    let out = cmd.output().expect("run apt-get");
    assert!(
        out.status.success(),
        "apt-get {args:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `name` on `PATH`, if it is there.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
