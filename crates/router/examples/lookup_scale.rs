//! Route lookup among N routes of the scale benchmark's mix (`benches/e2e/scale.py`: half exact
//! URIs `/r<i>/exact`, half prefixes `/p<i>/*`, a host on every fifth, methods on every
//! seventh), in process: the table's build time and the time of one lookup, for a table larger
//! than `benches/router.rs` builds (it stops at 100,000 to keep `cargo bench` short).
//!
//! `cargo run --release -p ferrisix-router --example lookup_scale -- 1000000`
//!
//! For each kind of route (exact paths, paths under a prefix, routes with a host, all mixed),
//! a round looks up 1,000,000 requests cycling over 4,096 such routes picked across the table,
//! so that the lookups reach memory as a gateway's varied traffic does (a benchmark repeating
//! one request keeps it all in cache); printed: the median of 5 rounds, per lookup.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use ferrisix_router::{
    Method, MethodSet, RequestInfo, RouteEntry, RouteTable, RouterKind, VarSource,
};

/// Which routes of the mix a kind of request goes to, by index.
type RouteKind = fn(usize) -> bool;

/// Routes without `vars`: nothing is ever asked of the variable source.
struct NoVars;

impl VarSource for NoVars {
    fn var(&self, _name: &str) -> Option<std::borrow::Cow<'_, str>> {
        None
    }
}

fn entry(i: usize) -> RouteEntry<u32> {
    let uri = if i % 2 == 0 {
        format!("/r{i}/exact")
    } else {
        format!("/p{i}/*")
    };
    let mut e = RouteEntry::new(vec![uri], i as u32);
    if i % 5 == 0 {
        e.hosts = vec![format!("h{i}.example.com")];
    }
    if i % 7 == 0 {
        e.methods = MethodSet::from_names(["GET", "POST"]).expect("known methods");
    }
    e
}

/// The path and Host a request for route `i` sends.
fn request_for(i: usize) -> (String, String) {
    let path = if i % 2 == 0 {
        format!("/r{i}/exact")
    } else {
        format!("/p{i}/users/42")
    };
    let host = if i % 5 == 0 {
        format!("h{i}.example.com")
    } else {
        "example.com".to_owned()
    };
    (path, host)
}

/// A GET for `path` on `host` from the loopback address.
fn get<'a>(path: &'a str, host: &'a str) -> RequestInfo<'a> {
    RequestInfo {
        path,
        host: Some(host),
        host_header: Some(host),
        method: Some(Method::Get),
        remote_addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
    }
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("the number of routes"))
        .unwrap_or(1_000_000);
    let rounds = 5;
    let started = Instant::now();
    let (table, errors) = RouteTable::new(RouterKind::HostUri, (0..n).map(entry).collect());
    assert!(errors.is_empty(), "{errors:?}");
    println!(
        "{n} routes: table built in {:.2} s",
        started.elapsed().as_secs_f64()
    );

    // 4,096 routes spread over the table, of one kind: exact paths (no host), paths under a
    // prefix (no host), or any route with a host; then all of them mixed.
    let kinds: [(&str, RouteKind); 5] = [
        ("exact", |i| i % 2 == 0 && i % 5 != 0),
        ("prefix", |i| i % 2 == 1 && i % 5 != 0),
        ("host", |i| i % 5 == 0),
        ("mixed", |_| true),
        // One request over and over, all of it in the cache (what `benches/router.rs` times).
        ("one repeated", |_| true),
    ];
    for (kind, of_kind) in kinds {
        let picked: Vec<(usize, String, String)> = (0..)
            // A multiplicative hash of k: spread over the table, both parities.
            .map(|k: usize| ((k as u64).wrapping_mul(2_654_435_761) % n as u64) as usize)
            .filter(|i| of_kind(*i))
            .take(if kind == "one repeated" { 1 } else { 4096 })
            .map(|i| {
                let (path, host) = request_for(i);
                (i, path, host)
            })
            .collect();
        // Every pick finds its own route.
        for (i, path, host) in &picked {
            let req = get(path, host);
            let found = table.lookup(&req, &NoVars).map(|m| *m.value as usize);
            assert_eq!(found, Some(*i), "{path} on {host}");
        }
        let lookups = 1_000_000;
        let mut per_round = Vec::new();
        for _ in 0..rounds {
            let t = Instant::now();
            for k in 0..lookups {
                let (_, path, host) = &picked[k % picked.len()];
                let req = get(path, host);
                black_box(table.lookup(black_box(&req), &NoVars).map(|m| *m.value));
            }
            per_round.push(t.elapsed().as_nanos() as f64 / lookups as f64);
        }
        per_round.sort_by(f64::total_cmp);
        println!(
            "{kind}: median {:.0} ns per lookup ({} rounds: {:.0} to {:.0} ns)",
            per_round[rounds / 2],
            rounds,
            per_round[0],
            per_round[rounds - 1]
        );
    }
}
