//! proxy-cache and graphql-proxy-cache against the real binary: the memory and disk strategies
//! serve hits without the upstream, PURGE, and the disk zone read back after a `kill -9`, with a
//! damaged file never served, and never a cut entry after kills in the middle of storing large
//! answers; `Vary` variants and nginx's stale answers on upstream errors; GraphQL queries cached
//! by their text, mutations bypassed, and the purge API.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

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

/// An HTTP/1.1 upstream whose answers `answer` makes from the request's path, its headers
/// (lower-cased `name: value` lines) and how many requests came before; keep-alive as the
/// gateway's pool uses it.
type Answer = fn(&str, &str, usize) -> Made;

/// An upstream's answer: status, headers, body.
type Made = (u16, Vec<(&'static str, String)>, Vec<u8>);

fn answering(answer: Answer) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let c = c.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut out = stream;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split(' ').nth(1).unwrap_or("/").to_owned();
                    let mut headers = String::new();
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        if h == "\r\n" {
                            break;
                        }
                        headers.push_str(&h.to_ascii_lowercase());
                    }
                    let n = c.fetch_add(1, Ordering::SeqCst);
                    let (status, extra, body) = answer(&path, &headers, n);
                    let mut head =
                        format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\n", body.len());
                    for (k, v) in extra {
                        head.push_str(&format!("{k}: {v}\r\n"));
                    }
                    head.push_str("\r\n");
                    if out.write_all(head.as_bytes()).is_err() {
                        return;
                    }
                    // Large bodies go in pieces, so a kill finds some answers half sent.
                    for piece in body.chunks(64 * 1024) {
                        if out.write_all(piece).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, count)
}

fn header_of<'a>(headers: &'a str, name: &str) -> &'a str {
    headers
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map_or("", str::trim)
}

fn cache_routes(up: SocketAddr, cache_key: &[&str]) -> String {
    json!({"routes": [
        {"id": "mem", "uri": "/mem/*", "plugins": {"proxy-cache": {
            "cache_strategy": "memory", "cache_zone": "memory_cache",
            "cache_key": cache_key}},
         "upstream": {"nodes": {up.to_string(): 1}}},
        {"id": "disk", "uri": "/disk/*", "plugins": {"proxy-cache": {
            "cache_key": cache_key}},
         "upstream": {"nodes": {up.to_string(): 1}}},
    ]})
    .to_string()
}

/// Both strategies keep one answer per variant of the headers the answer's `Vary` names.
#[test]
fn vary_variants_on_both_strategies() {
    fn answer(path: &str, headers: &str, n: usize) -> Made {
        let lang = header_of(headers, "accept-language").to_owned();
        let body = format!("{path} for [{lang}] #{n}");
        (
            200,
            vec![("Vary", "Accept-Language".into())],
            body.into_bytes(),
        )
    }
    let (up, count) = answering(answer);
    let disk = tempfile::tempdir().unwrap();
    let gw = Gateway::start_full(
        &cache_routes(up, &["$host", "$uri"]),
        &zones(disk.path()),
        "",
    );
    for prefix in ["/mem", "/disk"] {
        let path = format!("{prefix}/page");
        let ask = |lang: &str| request(gw.addr(), "GET", &path, &[("Accept-Language", lang)], b"");
        let en = ask("en");
        assert_eq!(en.header("apisix-cache-status"), Some("MISS"), "{prefix}");
        let fr = ask("fr");
        assert_eq!(fr.header("apisix-cache-status"), Some("MISS"), "{prefix}");
        let before = count.load(Ordering::SeqCst);
        for (lang, first) in [("en", &en), ("fr", &fr), ("en", &en)] {
            let again = ask(lang);
            assert_eq!(
                (again.header("apisix-cache-status"), again.text()),
                (Some("HIT"), first.text()),
                "{prefix} {lang}"
            );
            assert!(again.text().contains(&format!("[{lang}]")));
        }
        assert_eq!(count.load(Ordering::SeqCst), before, "{prefix}: hits only");
    }
    // nginx's variant files: the key's file and the second variant's.
    assert_eq!(files(disk.path()).len(), 2);
}

/// Disk: an expired answer whose `Cache-Control` has `stale-if-error` is served when the
/// upstream then fails (nginx's reading, APISIX's `proxy_cache_use_stale off` otherwise).
#[test]
fn disk_serves_stale_if_error() {
    fn answer(path: &str, _: &str, n: usize) -> Made {
        if n == 0 {
            let cc = if path.contains("window") {
                "max-age=1, stale-if-error=600"
            } else {
                "max-age=1"
            };
            (200, vec![("Cache-Control", cc.into())], b"kept".to_vec())
        } else {
            (503, vec![], b"down".to_vec())
        }
    }
    for (path, want) in [
        ("/disk/window", (200, Some("STALE"), "kept")),
        ("/disk/none", (503, Some("EXPIRED"), "down")),
    ] {
        let (up, _) = answering(answer);
        let disk = tempfile::tempdir().unwrap();
        let gw = Gateway::start_full(&cache_routes(up, &["$uri"]), &zones(disk.path()), "");
        assert_eq!(
            get(gw.addr(), path).header("apisix-cache-status"),
            Some("MISS")
        );
        // nginx's times are whole seconds: past max-age=1 for sure.
        std::thread::sleep(Duration::from_millis(2100));
        let r = get(gw.addr(), path);
        assert_eq!(
            (r.status, r.header("apisix-cache-status"), r.text().as_str()),
            want,
            "{path}"
        );
    }
}

/// GET on a fresh connection, tolerating a gateway that is gone.
fn try_get(addr: SocketAddr, path: &str) -> Option<Reply> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes())
        .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Some(Reply {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    })
}

/// The body the upstream sends for a path: large, and different for every path.
fn big_body(path: &str) -> Vec<u8> {
    let mut body = Vec::with_capacity(1 << 20);
    while body.len() < (1 << 20) {
        body.extend_from_slice(path.as_bytes());
        body.push(b'|');
    }
    body
}

/// `kill -9` while large answers are being stored, three times: after each restart every
/// entry served is whole (the body the upstream sent for its path), whatever the kill cut,
/// and those stored before the kill are served from the disk.
#[test]
fn kills_in_the_middle_of_storing_never_leave_a_cut_entry_served() {
    fn answer(path: &str, _: &str, _: usize) -> Made {
        (200, vec![], big_body(path))
    }
    let (up, _) = answering(answer);
    let disk = tempfile::tempdir().unwrap();
    let routes = cache_routes(up, &["$uri"]);
    // Room for every answer of the test: none is evicted, so what was stored stays.
    let zones = zones(disk.path()).replace("disk_size: 10m", "disk_size: 1g");
    let asked = Arc::new(AtomicUsize::new(0));
    let mut served_from_disk = 0;
    for (round, pause) in [350u64, 700, 1100].into_iter().enumerate() {
        let mut gw = Gateway::start_full(&routes, &zones, "");
        let addr = gw.addr();
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..4)
            .map(|_| {
                let (stop, asked) = (stop.clone(), asked.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        let n = asked.fetch_add(1, Ordering::SeqCst);
                        let _ = try_get(addr, &format!("/disk/big-{n}"));
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(pause));
        // No new requests, then the kill while those in flight are read, stored or sent.
        stop.store(true, Ordering::SeqCst);
        gw.child.kill().unwrap();
        gw.child.wait().unwrap();
        for c in clients {
            c.join().unwrap();
        }
        drop(gw);
        let gw = Gateway::start_full(&routes, &zones, "");
        let mut hits = 0;
        for n in 0..asked.load(Ordering::SeqCst) {
            let path = format!("/disk/big-{n}");
            let r = get(gw.addr(), &path);
            assert_eq!(r.status, 200, "{path}");
            assert!(
                r.body == big_body(&path),
                "round {round}: {path} served cut or wrong"
            );
            if r.header("apisix-cache-status") == Some("HIT") {
                hits += 1;
            }
        }
        // Whatever survived is whole; the next round kills the gateway with these stored.
        eprintln!("round {round}: {hits} entries survived the kill whole");
        served_from_disk += hits;
    }
    // The entries stored by each round's checks were kept through the next kill.
    assert!(
        served_from_disk > 0,
        "entries stored before a kill are served after it"
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
