//! Route lookup and compile benchmarks for `ferrisix-router` (default `radixtree_host_uri` mode).
//!
//! Table sizes follow lua-resty-radixtree's own benchmarks (1 to 100k routes). Samples are kept
//! small so the whole run stays well under two minutes; use `-- --quick` for a smoke run.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use ferrisix_router::{Method, RequestInfo, RouteEntry, RouteTable, RouterKind, VarSource};

const SIZES: [usize; 4] = [1, 100, 10_000, 100_000];
const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Routes without `vars`: nothing is ever asked of the variable source.
struct NoVars;

impl VarSource for NoVars {
    fn var(&self, _name: &str) -> Option<std::borrow::Cow<'_, str>> {
        None
    }
}

fn request<'a>(path: &'a str, host: &'a str) -> RequestInfo<'a> {
    RequestInfo {
        path,
        host: Some(host),
        host_header: Some(host),
        method: Some(Method::Get),
        remote_addr: LOCALHOST,
    }
}

fn build(entries: Vec<RouteEntry<u32>>) -> RouteTable<u32> {
    let (table, errors) = RouteTable::new(RouterKind::HostUri, entries);
    assert!(errors.is_empty());
    table
}

fn exact_routes(n: usize) -> Vec<RouteEntry<u32>> {
    (0..n)
        .map(|i| RouteEntry::new(vec![format!("/api/v1/service{i}/items")], i as u32))
        .collect()
}

fn prefix_routes(n: usize) -> Vec<RouteEntry<u32>> {
    (0..n)
        .map(|i| RouteEntry::new(vec![format!("/api/v1/service{i}/*")], i as u32))
        .collect()
}

fn host_routes(n: usize) -> Vec<RouteEntry<u32>> {
    (0..n)
        .map(|i| {
            let mut e = RouteEntry::new(vec!["/api/*".to_string()], i as u32);
            e.hosts = vec![format!("tenant{i}.example.com")];
            e
        })
        .collect()
}

/// A realistic mix for compile time: a third each of exact, prefix and host routes, with a
/// method filter on every other route.
fn mixed_routes(n: usize) -> Vec<RouteEntry<u32>> {
    (0..n)
        .map(|i| {
            let mut e = match i % 3 {
                0 => RouteEntry::new(vec![format!("/api/v1/service{i}/items")], i as u32),
                1 => RouteEntry::new(vec![format!("/api/v1/service{i}/*")], i as u32),
                _ => {
                    let mut e = RouteEntry::new(vec![format!("/svc{i}/*")], i as u32);
                    e.hosts = vec![format!("tenant{i}.example.com")];
                    e
                }
            };
            if i % 2 == 0 {
                e.methods = ferrisix_router::MethodSet::from_names(["GET", "POST"]).unwrap();
            }
            e
        })
        .collect()
}

/// Lookup of an exact (hash table) route among N exact routes; the request carries a Host that
/// no route lists, so the host stage is consulted and skipped as in production.
fn lookup_exact(c: &mut Criterion) {
    let mut g = c.benchmark_group("lookup_exact");
    for n in SIZES {
        let table = build(exact_routes(n));
        let path = format!("/api/v1/service{}/items", n / 2);
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            let req = request(&path, "example.com");
            b.iter(|| black_box(table.lookup(black_box(&req), &NoVars)).map(|m| *m.value))
        });
    }
    g.finish();
}

/// Lookup of a prefix route (`/api/v1/serviceK/*`) among N prefix routes with a deeper request
/// path: exact-table miss, radix walk, climb to the stored prefix.
fn lookup_prefix(c: &mut Criterion) {
    let mut g = c.benchmark_group("lookup_prefix");
    for n in SIZES {
        let table = build(prefix_routes(n));
        let path = format!("/api/v1/service{}/users/42/profile", n / 2);
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            let req = request(&path, "example.com");
            b.iter(|| black_box(table.lookup(black_box(&req), &NoVars)).map(|m| *m.value))
        });
    }
    g.finish();
}

/// Lookup in the host stage: N routes, each on its own exact host with `/api/*`; the request
/// hits one host entry and its prefix.
fn lookup_host(c: &mut Criterion) {
    let mut g = c.benchmark_group("lookup_host");
    for n in SIZES {
        let table = build(host_routes(n));
        let host = format!("tenant{}.example.com", n / 2);
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            let req = request("/api/orders/17", &host);
            b.iter(|| black_box(table.lookup(black_box(&req), &NoVars)).map(|m| *m.value))
        });
    }
    g.finish();
}

/// Time to compile a table of N mixed routes (exact, prefix, host) from ready `RouteEntry`s,
/// i.e. what a config change costs before the new table is swapped in.
fn compile(c: &mut Criterion) {
    let mut g = c.benchmark_group("compile");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(4));
    for n in [10_000, 100_000] {
        let entries = mixed_routes(n);
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter_batched(
                || entries.clone(),
                |e| black_box(build(e)),
                criterion::BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
}

criterion_group! {
    name = benches;
    config = config();
    targets = lookup_exact, lookup_prefix, lookup_host, compile
}
criterion_main!(benches);
