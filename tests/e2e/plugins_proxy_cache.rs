//! proxy-cache and graphql-proxy-cache against the real binary: the memory and disk strategies
//! serve hits without the upstream, PURGE, and the disk zone read back after a `kill -9`, with a
//! damaged file never served; GraphQL queries cached by their text, mutations bypassed, and the
//! purge API.

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

/// graphql-proxy-cache: queries by GET and POST hit the cache, mutations bypass it, two routes
/// never share an entry, bad queries get APISIX's 400s, and the purge API deletes an entry of
/// each strategy.
#[test]
fn graphql_queries_are_cached_and_purged() {
    let up = Upstream::start("up", Behaviour::Echo);
    let disk = tempfile::tempdir().unwrap();
    let gql = |strategy: &str, zone: &str| json!({"graphql-proxy-cache": {"cache_strategy": strategy, "cache_zone": zone}});
    let yaml = json!({"routes": [
        {"id": "gm", "uri": "/gm", "plugins": gql("memory", "memory_cache"),
         "upstream": {"nodes": {up.node(): 1}}},
        {"id": "gm2", "uri": "/gm2", "plugins": gql("memory", "memory_cache"),
         "upstream": {"nodes": {up.node(): 1}}},
        {"id": "gd", "uri": "/gd", "plugins": gql("disk", "disk_cache_one"),
         "upstream": {"nodes": {up.node(): 1}}},
        {"id": "purge", "uri": "/apisix/plugin/graphql-proxy-cache/*",
         "plugins": {"public-api": {}}},
    ]})
    .to_string();
    let gw = Gateway::start_full(&yaml, &zones(disk.path()), "graphql:\n  max_size: 200\n");
    let json_ct = [("content-type", "application/json")];
    let query = br#"{"query": "query { persons { id name } }"}"#;

    for path in ["/gm", "/gd"] {
        let before = up.hits();
        let r = request(gw.addr(), "POST", path, &json_ct, query);
        assert_eq!(
            (r.status, r.header("apisix-cache-status")),
            (200, Some("MISS")),
            "{path}"
        );
        let key = r.header("apisix-cache-key").unwrap().to_owned();
        assert_eq!(key.len(), 32, "an MD5 in hex: {key}");
        let r2 = request(gw.addr(), "POST", path, &json_ct, query);
        assert_eq!(r2.header("apisix-cache-status"), Some("HIT"), "{path}");
        assert_eq!(r2.header("apisix-cache-key"), Some(key.as_str()));
        assert_eq!(r2.body, r.body);
        assert_eq!(
            up.hits(),
            before + 1,
            "{path}: the hit stayed off the upstream"
        );

        // The same query by GET is its own entry (the key is the raw query string).
        let get_path = format!("{path}?query=%7B%20persons%20%7B%20id%20%7D%20%7D");
        let g = request(gw.addr(), "GET", &get_path, &[], b"");
        assert_eq!(g.header("apisix-cache-status"), Some("MISS"), "{path}");
        let g = request(gw.addr(), "GET", &get_path, &[], b"");
        assert_eq!(g.header("apisix-cache-status"), Some("HIT"), "{path}");

        // A mutation is never looked up nor stored.
        let m = br#"{"query": "mutation { add(name: \"x\") { id } }"}"#;
        for _ in 0..2 {
            let before = up.hits();
            let r = request(gw.addr(), "POST", path, &json_ct, m);
            assert_eq!(
                (r.status, r.header("apisix-cache-status")),
                (200, Some("BYPASS")),
                "{path}"
            );
            assert!(r.header("apisix-cache-key").is_none());
            assert_eq!(up.hits(), before + 1);
        }
    }

    // Two routes with the same conf and query: two entries.
    let a = request(gw.addr(), "POST", "/gm", &json_ct, query);
    let b = request(gw.addr(), "POST", "/gm2", &json_ct, query);
    assert_eq!(b.header("apisix-cache-status"), Some("MISS"));
    assert_ne!(a.header("apisix-cache-key"), b.header("apisix-cache-key"));

    // application/graphql: the body is the query.
    let ct = [("content-type", "application/graphql")];
    let r = request(gw.addr(), "POST", "/gm", &ct, b"{ persons { id } }");
    assert_eq!(r.header("apisix-cache-status"), Some("MISS"));
    let r = request(gw.addr(), "POST", "/gm", &ct, b"{ persons { id } }");
    assert_eq!(r.header("apisix-cache-status"), Some("HIT"));

    // Refused requests, with APISIX's answers.
    // method, path, headers, body, status, message.
    type Refused<'a> = (
        &'a str,
        &'a str,
        &'a [(&'a str, &'a str)],
        &'a [u8],
        u16,
        &'a str,
    );
    let refused: [Refused; 10] = [
        ("PUT", "/gm", &json_ct, query, 405, ""),
        ("HEAD", "/gm", &[], b"", 405, ""),
        (
            "POST",
            "/gm",
            &json_ct,
            b"{\"query\": \" \"}",
            400,
            "Invalid graphql request: empty graphql query",
        ),
        (
            "POST",
            "/gm",
            &[("content-type", "text/plain")],
            query,
            400,
            "invalid graphql request, error content-type: text/plain",
        ),
        (
            "POST",
            "/gm",
            &json_ct,
            b"{\"q\": 1}",
            400,
            "invalid graphql request, json body[query] is nil",
        ),
        (
            "POST",
            "/gm",
            &json_ct,
            b"{\"query\": \"{ a \"}",
            400,
            "Invalid graphql request: failed to parse graphql query",
        ),
        (
            "POST",
            "/gm",
            &json_ct,
            b"",
            400,
            "Invalid graphql request: can't get graphql request body",
        ),
        // Over `graphql.max_size`.
        (
            "POST",
            "/gm",
            &ct,
            &[b' '; 300],
            400,
            "Invalid graphql request: can't get graphql request body",
        ),
        (
            "GET",
            "/gm",
            &[],
            b"",
            400,
            "Invalid graphql request: can't get graphql request body",
        ),
        (
            "GET",
            "/gm?q=1",
            &[],
            b"",
            400,
            "invalid graphql request, args[query] is nil",
        ),
    ];
    for (method, path, headers, body, status, msg) in refused {
        let r = request(gw.addr(), method, path, headers, body);
        assert_eq!(
            r.status,
            status,
            "{method} {path} {}",
            String::from_utf8_lossy(body)
        );
        if !msg.is_empty() {
            assert_eq!(r.json()["message"], msg, "{method} {path}");
        }
    }

    // Purge: one entry of each strategy, through the plugin's API.
    let purge = |path: &str| request(gw.addr(), "PURGE", path, &[], b"").status;
    let mem_key = request(gw.addr(), "POST", "/gm", &json_ct, query)
        .header("apisix-cache-key")
        .unwrap()
        .to_owned();
    let disk_key = request(gw.addr(), "POST", "/gd", &json_ct, query)
        .header("apisix-cache-key")
        .unwrap()
        .to_owned();
    let api = "/apisix/plugin/graphql-proxy-cache";
    assert_eq!(purge(&format!("{api}/memory/gm/{mem_key}")), 200);
    let r = request(gw.addr(), "POST", "/gm", &json_ct, query);
    assert_eq!(r.header("apisix-cache-status"), Some("MISS"), "purged");
    assert_eq!(purge(&format!("{api}/disk/gd/{disk_key}")), 200);
    assert_eq!(purge(&format!("{api}/disk/gd/{disk_key}")), 404, "gone");
    let r = request(gw.addr(), "POST", "/gd", &json_ct, query);
    assert_eq!(r.header("apisix-cache-status"), Some("MISS"), "purged");
    assert_eq!(
        purge(&format!("{api}/disk/gm/{mem_key}")),
        400,
        "strategy mismatch"
    );
    assert_eq!(
        purge(&format!("{api}/other/gm/{mem_key}")),
        400,
        "no such strategy"
    );
    assert_eq!(purge(&format!("{api}/memory/gm")), 400, "no key");
    assert_eq!(
        purge(&format!("{api}/memory/nope/{mem_key}")),
        404,
        "no such route"
    );
}
