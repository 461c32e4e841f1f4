//! proxy-cache against the real binary: the memory and disk strategies serve hits without the
//! upstream, PURGE, and the disk zone read back after a `kill -9`, with a damaged file never
//! served.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::support::*;

fn zones(disk: &Path) -> String {
    format!(
        "proxy_cache:\n  cache_ttl: 10s\n  zones:\n    - name: disk_cache_one\n      memory_size: 1m\n      disk_size: 10m\n      disk_path: {}\n      cache_levels: \"1:2\"\n    - name: memory_cache\n      memory_size: 1m\n",
        disk.display()
    )
}

fn routes(up: &Upstream) -> String {
    json!({"routes": [
        {"id": "mem", "uri": "/mem/*", "plugins": {"proxy-cache": {
            "cache_strategy": "memory", "cache_zone": "memory_cache",
            "cache_key": ["$host", "$uri"]}},
         "upstream": {"nodes": {up.node(): 1}}},
        {"id": "disk", "uri": "/disk/*", "plugins": {"proxy-cache": {
            "cache_key": ["$host", "$uri"], "cache_bypass": ["$arg_bypass"]}},
         "upstream": {"nodes": {up.node(): 1}}},
        {"id": "plain", "uri": "/plain", "upstream": {"nodes": {up.node(): 1}}},
    ]})
    .to_string()
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().unwrap().is_dir() {
                todo.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

#[test]
fn memory_and_disk_hits_skip_the_upstream() {
    let up = Upstream::start("up", Behaviour::Echo);
    let disk = tempfile::tempdir().unwrap();
    let gw = Gateway::start_full(&routes(&up), &zones(disk.path()), "");
    for prefix in ["/mem", "/disk"] {
        let before = up.hits();
        let r = get(gw.addr(), &format!("{prefix}/a?n=1"));
        assert_eq!(
            (r.status, r.header("apisix-cache-status")),
            (200, Some("MISS")),
            "{prefix}"
        );
        let r2 = get(gw.addr(), &format!("{prefix}/a?n=2"));
        assert_eq!(r2.header("apisix-cache-status"), Some("HIT"), "{prefix}");
        assert_eq!(r2.body, r.body, "{prefix}: the stored answer");
        assert_eq!(r2.header("content-type"), r.header("content-type"));
        assert_eq!(
            up.hits(),
            before + 1,
            "{prefix}: the hit did not reach the upstream"
        );
        // A HEAD is answered from the same entry, without a body.
        let h = request(gw.addr(), "HEAD", &format!("{prefix}/a"), &[], b"");
        assert_eq!(
            (h.status, h.header("apisix-cache-status")),
            (200, Some("HIT"))
        );
        assert!(h.body.is_empty());
        let p = request(gw.addr(), "PURGE", &format!("{prefix}/a"), &[], b"");
        assert_eq!(p.status, 200, "{prefix}");
        let p = request(gw.addr(), "PURGE", &format!("{prefix}/a"), &[], b"");
        assert_eq!(p.status, 404, "{prefix}");
        let r = get(gw.addr(), &format!("{prefix}/a?n=3"));
        assert_eq!(r.header("apisix-cache-status"), Some("MISS"));
    }
    assert_eq!(files(disk.path()).len(), 1, "one file: /disk/a");
    // A bypassed request's answer replaces the stored one (nginx's proxy_cache_bypass).
    let r = get(gw.addr(), "/disk/a?bypass=1");
    assert_eq!(r.header("apisix-cache-status"), Some("BYPASS"));
    let r2 = get(gw.addr(), "/disk/a");
    assert_eq!(
        (r2.header("apisix-cache-status"), r2.body.clone()),
        (Some("HIT"), r.body)
    );
    // Routes without the plugin say nothing of a cache.
    assert_eq!(get(gw.addr(), "/plain").header("apisix-cache-status"), None);
}

#[test]
fn disk_entries_survive_a_kill_and_damaged_files_are_not_served() {
    let up = Upstream::start("up", Behaviour::Echo);
    let disk = tempfile::tempdir().unwrap();
    let mut gw = Gateway::start_full(&routes(&up), &zones(disk.path()), "");
    let first = get(gw.addr(), "/disk/kept?n=1");
    assert_eq!(first.header("apisix-cache-status"), Some("MISS"));
    get(gw.addr(), "/disk/damaged?n=1");
    assert_eq!(files(disk.path()).len(), 2);
    gw.child.kill().unwrap();
    gw.child.wait().unwrap();
    drop(gw);
    // What a crash mid-write could leave: a cut file, and a temporary file.
    let damaged = files(disk.path())
        .into_iter()
        .find(|f| {
            std::fs::read(f)
                .unwrap()
                .windows(8)
                .any(|w| w == b"/damaged")
        })
        .expect("the damaged entry's file");
    let bytes = std::fs::read(&damaged).unwrap();
    std::fs::write(&damaged, &bytes[..bytes.len() / 2]).unwrap();
    std::fs::write(disk.path().join(".tmp-1-0"), &bytes[..10]).unwrap();

    let gw = Gateway::start_full(&routes(&up), &zones(disk.path()), "");
    let hits = up.hits();
    let r = get(gw.addr(), "/disk/kept?n=2");
    assert_eq!(r.header("apisix-cache-status"), Some("HIT"));
    assert_eq!(r.body, first.body, "stored before the kill");
    assert_eq!(up.hits(), hits);
    let r = get(gw.addr(), "/disk/damaged?n=2");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("apisix-cache-status"),
        Some("MISS"),
        "the cut file is not served"
    );
    assert!(r.text().contains("n=2"), "{}", r.text());
    let tmp = disk.path().join(".tmp-1-0");
    assert!(
        poll_until(std::time::Duration::from_secs(10), || !tmp.exists()).is_some(),
        "temporary files are cleared when the zone is read back"
    );
}
