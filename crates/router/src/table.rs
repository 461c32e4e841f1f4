//! The compiled route table and its match procedure.
//!
//! One `UriTable` is what lua-resty-radixtree calls a tree: an exact table (patterns without `*`,
//! and without `:` in the parameter router) consulted first, then the stored prefixes of the path
//! from longest to shortest, each holding its candidates ordered by priority, pattern length and
//! insertion order. A candidate must pass methods, remote addresses, hosts (URI routers only),
//! `vars` and finally the full-path check of its pattern; the first that does wins, and a failing
//! one simply moves on, which is how a request falls back from a long prefix to a shorter one.
//!
//! `radixtree_host_uri` runs that procedure per host: first the exact host, then wildcard hosts by
//! longest suffix, each with its own `UriTable`, and only then the table of hostless routes.
//!
//! Not `matchit`: APISIX semantics win — it has no character prefixes (`/foo*` matching
//! `/foobar`), no fall-back through shorter prefixes, and one route per path.

mod params;
mod pattern;
mod trie;

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::IpAddr;

use ipnet::IpNet;

use crate::expr::{Expr, VarSource};
use crate::methods::{Method, MethodSet};
pub use params::Params;
use pattern::ParamCheck;
use trie::{Fwd, Rev, Trie, TrieBuilder};

/// Which of APISIX's three HTTP routers to reproduce (`apisix.router.http`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RouterKind {
    /// `radixtree_host_uri` (the default since 3.3): host stage, then hostless routes.
    #[default]
    HostUri,
    /// `radixtree_uri`: one tree, hosts are a per-candidate filter, `:` is literal.
    Uri,
    /// `radixtree_uri_with_parameter`: like `Uri`, with `:name` / `*name` parameters.
    UriWithParameter,
}

/// One route as the router needs it. The caller resolves APISIX's indirections first (a route
/// without hosts takes its service's `hosts`; `host` is a one-element `hosts`).
#[derive(Clone, Debug)]
pub struct RouteEntry<T> {
    /// `uri` or `uris` as written (e.g. "/foo", "/foo*", "/a/*/b", "/u/:id").
    pub paths: Vec<String>,
    /// Host patterns ("*.foo.com", "foo.com", "*"); empty = any host. Lower-cased at build.
    pub hosts: Vec<String>,
    /// `MethodSet::ALL` when the route lists none (an empty set is treated the same way, as the
    /// radix tree treats a zero bitmask).
    pub methods: MethodSet,
    /// Empty = any address.
    pub remote_addrs: Vec<IpNet>,
    pub vars: Option<Expr>,
    pub priority: i64,
    pub value: T,
}

impl<T> RouteEntry<T> {
    /// An entry with the given paths and no other condition.
    pub fn new(paths: Vec<String>, value: T) -> RouteEntry<T> {
        RouteEntry {
            paths,
            hosts: Vec::new(),
            methods: MethodSet::ALL,
            remote_addrs: Vec::new(),
            vars: None,
            priority: 0,
            value,
        }
    }
}

/// What the router needs to know about a request.
#[derive(Clone, Copy, Debug)]
pub struct RequestInfo<'a> {
    /// Already normalised (`normalize_path`).
    pub path: &'a str,
    /// `$host`: Host header without port, lower-cased. `None` skips every host route (nginx
    /// always has a `$host`; pass the server name if that matters).
    pub host: Option<&'a str>,
    /// Raw Host header with port (`$http_host`), for route hosts containing ':' in the URI routers.
    pub host_header: Option<&'a str>,
    /// `None` for methods outside the enum.
    pub method: Option<Method>,
    /// After real-ip.
    pub remote_addr: IpAddr,
}

/// A successful lookup.
#[derive(Debug)]
pub struct RouteMatch<'a, T> {
    pub value: &'a T,
    /// The pattern that matched, verbatim (for metrics).
    pub matched_uri: &'a str,
    /// The host pattern that matched (lower-cased), `None` when the route has no host.
    pub matched_host: Option<&'a str>,
    /// Captured `:name` / `*name` parameters (`:ext` for a bare `*`). Filled whenever the matched
    /// pattern has named segments, in every mode, because APISIX always asks the radix tree for
    /// them; in practice only the parameter router has such prefix patterns.
    pub params: Params<'a>,
}

/// An entry that could not be compiled; it is left out and the others are served.
#[derive(Debug, Clone)]
pub struct TableError {
    /// Index into the entries `Vec` given to `RouteTable::new`.
    pub index: usize,
    pub message: String,
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "route entry #{}: {}", self.index, self.message)
    }
}

impl std::error::Error for TableError {}

/// FxHash: keys are the configured patterns, so there is nobody to mount a collision attack
/// on insertion, and lookups of hostile strings cannot lengthen probe chains. It is several
/// times cheaper than SipHash on short paths.
#[derive(Default, Clone, Copy)]
struct FxHasher(u64);

const FX_SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(FX_SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes([
                c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7],
            ]));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut buf = [0u8; 8];
            buf[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(buf) ^ ((rest.len() as u64) << 59));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// One host pattern of a route.
#[derive(Debug)]
struct HostPat {
    /// Lower-cased, as written (`*.foo.com`).
    pattern: Box<str>,
    wildcard: bool,
    /// Compared with `$http_host` in the URI routers.
    with_port: bool,
}

impl HostPat {
    fn parse(raw: &str) -> Result<HostPat, String> {
        let pattern = raw.to_ascii_lowercase();
        let body = pattern.strip_prefix('*').unwrap_or(&pattern);
        let valid = pattern == "*"
            || (!body.is_empty()
                && body.bytes().all(|c| {
                    c.is_ascii_alphanumeric()
                        || matches!(c, b'-' | b'.' | b'_' | b'[' | b']' | b':')
                }));
        if !valid {
            return Err(format!("invalid host: {raw:?}"));
        }
        Ok(HostPat {
            wildcard: pattern.starts_with('*'),
            with_port: pattern.contains(':'),
            pattern: pattern.into_boxed_str(),
        })
    }

    /// The part after the leading `*` (the whole pattern for exact hosts).
    fn text(&self) -> &str {
        if self.wildcard {
            &self.pattern[1..]
        } else {
            &self.pattern
        }
    }

    fn matches(&self, subject: &str) -> bool {
        let text = self.text().as_bytes();
        let s = subject.as_bytes();
        if self.wildcard {
            s.len() >= text.len() && s[s.len() - text.len()..].eq_ignore_ascii_case(text)
        } else {
            s.eq_ignore_ascii_case(text)
        }
    }
}

/// A kept route.
struct Route<T> {
    value: T,
    paths: Box<[Box<str>]>,
    hosts: Box<[HostPat]>,
    methods: MethodSet,
    remote_addrs: Box<[IpNet]>,
    vars: Option<Expr>,
}

/// One registered path of one route.
struct Plan {
    route: u32,
    path: u32,
    priority: i64,
    /// `None` for the exact table, else the length of the stored prefix.
    prefix: Option<usize>,
    check: Option<ParamCheck>,
}

/// One radix tree's worth of routes.
struct UriTable {
    exact: FxMap<Box<str>, Box<[u32]>>,
    prefixes: Trie,
    /// Candidate plans per stored prefix, indexed by the trie's values.
    lists: Vec<Box<[u32]>>,
}

/// A host entry of `radixtree_host_uri`.
struct HostBucket {
    pattern: Box<str>,
    table: UriTable,
}

/// A compiled, immutable route table; share it between threads and swap it on change.
pub struct RouteTable<T> {
    kind: RouterKind,
    routes: Vec<Route<T>>,
    plans: Vec<Plan>,
    /// Every route in the URI routers; the hostless ones in `HostUri`.
    uri: UriTable,
    exact_hosts: FxMap<Box<str>, u32>,
    /// Reversed wildcard suffixes → bucket.
    wild_hosts: Trie,
    buckets: Vec<HostBucket>,
}

impl<T> fmt::Debug for RouteTable<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteTable")
            .field("kind", &self.kind)
            .field("routes", &self.routes.len())
            .field("host_entries", &self.buckets.len())
            .finish()
    }
}

/// Where a candidate list lives while being built.
#[derive(Default)]
struct UriTableBuilder {
    exact: FxMap<Box<str>, Vec<u32>>,
    prefix_ids: FxMap<Box<str>, u32>,
    lists: Vec<Vec<u32>>,
}

impl UriTableBuilder {
    fn add(&mut self, plan_id: u32, plan: &Plan, pattern: &str) {
        match plan.prefix {
            None => self.exact.entry(pattern.into()).or_default().push(plan_id),
            Some(n) => {
                let key = &pattern[..n];
                let id = match self.prefix_ids.get(key) {
                    Some(&id) => id,
                    None => {
                        let id = self.lists.len() as u32;
                        self.prefix_ids.insert(key.into(), id);
                        self.lists.push(Vec::new());
                        id
                    }
                };
                self.lists[id as usize].push(plan_id);
            }
        }
    }

    /// Orders each path entry: priority descending, then longer original pattern, then insertion
    /// order (plans are numbered in insertion order and the sort is stable).
    fn build<T>(self, plans: &[Plan], routes: &[Route<T>]) -> UriTable {
        let order = |list: &mut Vec<u32>| {
            list.sort_by_key(|&p| {
                let plan = &plans[p as usize];
                let len = routes[plan.route as usize].paths[plan.path as usize].len();
                (std::cmp::Reverse(plan.priority), std::cmp::Reverse(len))
            });
        };
        let exact = self
            .exact
            .into_iter()
            .map(|(k, mut v)| {
                order(&mut v);
                (k, v.into_boxed_slice())
            })
            .collect();
        let mut trie = TrieBuilder::new();
        for (key, id) in &self.prefix_ids {
            trie.insert(key.as_bytes(), *id);
        }
        let lists = self
            .lists
            .into_iter()
            .map(|mut v| {
                order(&mut v);
                v.into_boxed_slice()
            })
            .collect();
        UriTable {
            exact,
            prefixes: trie.build(),
            lists,
        }
    }
}

impl<T> RouteTable<T> {
    /// Entries are in insertion order (earlier = wins ties). A bad entry (bad pattern, bad host) is skipped and reported; the rest are served.
    pub fn new(kind: RouterKind, entries: Vec<RouteEntry<T>>) -> (RouteTable<T>, Vec<TableError>) {
        let mut errors = Vec::new();
        let mut routes: Vec<Route<T>> = Vec::with_capacity(entries.len());
        let mut plans: Vec<Plan> = Vec::with_capacity(entries.len());

        for (index, entry) in entries.into_iter().enumerate() {
            let route_id = routes.len() as u32;
            match compile_entry(kind, route_id, &entry) {
                Ok((hosts, mut entry_plans)) => {
                    plans.append(&mut entry_plans);
                    routes.push(Route {
                        value: entry.value,
                        paths: entry
                            .paths
                            .into_iter()
                            .map(String::into_boxed_str)
                            .collect(),
                        hosts,
                        methods: if entry.methods.is_empty() {
                            MethodSet::ALL
                        } else {
                            entry.methods
                        },
                        remote_addrs: entry.remote_addrs.into_boxed_slice(),
                        vars: entry.vars,
                    });
                }
                Err(message) => errors.push(TableError { index, message }),
            }
        }

        let mut uri = UriTableBuilder::default();
        let mut bucket_builders: Vec<(Box<str>, UriTableBuilder)> = Vec::new();
        let mut exact_hosts: FxMap<Box<str>, u32> = FxMap::default();
        let mut wild_ids: FxMap<Box<str>, u32> = FxMap::default();
        for (id, plan) in plans.iter().enumerate() {
            let route = &routes[plan.route as usize];
            let pattern = &route.paths[plan.path as usize];
            if kind != RouterKind::HostUri || route.hosts.is_empty() {
                uri.add(id as u32, plan, pattern);
                continue;
            }
            for (i, host) in route.hosts.iter().enumerate() {
                if route.hosts[..i].iter().any(|h| h.pattern == host.pattern) {
                    continue;
                }
                let map = if host.wildcard {
                    &mut wild_ids
                } else {
                    &mut exact_hosts
                };
                let bucket = *map.entry(host.pattern.clone()).or_insert_with(|| {
                    bucket_builders.push((host.pattern.clone(), UriTableBuilder::default()));
                    (bucket_builders.len() - 1) as u32
                });
                bucket_builders[bucket as usize]
                    .1
                    .add(id as u32, plan, pattern);
            }
        }

        let mut wild = TrieBuilder::new();
        for (pattern, &bucket) in &wild_ids {
            let rev: Vec<u8> = pattern.as_bytes()[1..].iter().rev().copied().collect();
            wild.insert(&rev, bucket);
        }
        let buckets = bucket_builders
            .into_iter()
            .map(|(pattern, b)| HostBucket {
                pattern,
                table: b.build(&plans, &routes),
            })
            .collect();
        let table = RouteTable {
            kind,
            uri: uri.build(&plans, &routes),
            routes,
            plans,
            exact_hosts,
            wild_hosts: wild.build(),
            buckets,
        };
        (table, errors)
    }

    /// Finds the route for a request.
    ///
    /// `req` shares the table's lifetime because captured parameters borrow from `req.path`.
    pub fn lookup<'a>(
        &'a self,
        req: &RequestInfo<'a>,
        vars: &dyn VarSource,
    ) -> Option<RouteMatch<'a, T>> {
        if self.kind != RouterKind::HostUri {
            return self.find(&self.uri, req, vars, true);
        }
        if let Some(host) = req.host {
            if !self.exact_hosts.is_empty() {
                if let Some(&b) = self.exact_hosts.get(host) {
                    if let Some(m) = self.find_in_bucket(b, req, vars) {
                        return Some(m);
                    }
                }
            }
            if !self.wild_hosts.is_empty() {
                for b in self.wild_hosts.prefixes_of(&Rev(host.as_bytes())) {
                    if let Some(m) = self.find_in_bucket(b, req, vars) {
                        return Some(m);
                    }
                }
            }
        }
        self.find(&self.uri, req, vars, false)
    }

    /// Number of entries kept.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    pub fn kind(&self) -> RouterKind {
        self.kind
    }

    fn find_in_bucket<'a>(
        &'a self,
        bucket: u32,
        req: &RequestInfo<'a>,
        vars: &dyn VarSource,
    ) -> Option<RouteMatch<'a, T>> {
        let b = &self.buckets[bucket as usize];
        let mut m = self.find(&b.table, req, vars, false)?;
        m.matched_host = Some(&b.pattern);
        Some(m)
    }

    /// lua-resty-radixtree's `match_route` over one tree.
    fn find<'a>(
        &'a self,
        table: &'a UriTable,
        req: &RequestInfo<'a>,
        vars: &dyn VarSource,
        host_filter: bool,
    ) -> Option<RouteMatch<'a, T>> {
        if let Some(list) = table.exact.get(req.path) {
            for &p in list.iter() {
                let plan = &self.plans[p as usize];
                if let Some(matched_host) = self.filters(plan, req, vars, host_filter) {
                    let route = &self.routes[plan.route as usize];
                    return Some(RouteMatch {
                        value: &route.value,
                        matched_uri: &route.paths[plan.path as usize],
                        matched_host,
                        params: Params::new(),
                    });
                }
            }
        }
        for id in table.prefixes.prefixes_of(&Fwd(req.path.as_bytes())) {
            for &p in table.lists[id as usize].iter() {
                let plan = &self.plans[p as usize];
                let Some(matched_host) = self.filters(plan, req, vars, host_filter) else {
                    continue;
                };
                let mut params = Params::new();
                if let Some(check) = &plan.check {
                    if !check.check(req.path, &mut params) {
                        continue;
                    }
                }
                let route = &self.routes[plan.route as usize];
                return Some(RouteMatch {
                    value: &route.value,
                    matched_uri: &route.paths[plan.path as usize],
                    matched_host,
                    params,
                });
            }
        }
        None
    }

    /// The per-candidate filters in radixtree order: methods, remote addresses, hosts, vars.
    /// `Some(matched host pattern)` when the candidate passes.
    fn filters<'a>(
        &'a self,
        plan: &Plan,
        req: &RequestInfo<'_>,
        vars: &dyn VarSource,
        host_filter: bool,
    ) -> Option<Option<&'a str>> {
        let route = &self.routes[plan.route as usize];
        if !route.methods.contains(req.method) {
            return None;
        }
        if !route.remote_addrs.is_empty()
            && !route
                .remote_addrs
                .iter()
                .any(|n| n.contains(&req.remote_addr))
        {
            return None;
        }
        let mut matched_host = None;
        if host_filter && !route.hosts.is_empty() {
            let host = req.host?;
            let h = route.hosts.iter().find(|h| {
                // A host with a port can only be compared with the raw Host header.
                let subject = if h.with_port {
                    req.host_header.unwrap_or(host)
                } else {
                    host
                };
                h.matches(subject)
            })?;
            matched_host = Some(&*h.pattern);
        }
        if let Some(expr) = &route.vars {
            if !expr.eval(vars) {
                return None;
            }
        }
        Some(matched_host)
    }
}

/// Validates one entry and registers its paths; any error rejects the whole entry.
fn compile_entry<T>(
    kind: RouterKind,
    route_id: u32,
    entry: &RouteEntry<T>,
) -> Result<(Box<[HostPat]>, Vec<Plan>), String> {
    if entry.paths.is_empty() {
        return Err("route has no uri".to_string());
    }
    let hosts = entry
        .hosts
        .iter()
        .map(|h| HostPat::parse(h))
        .collect::<Result<Box<[HostPat]>, String>>()?;
    let mut plans = Vec::with_capacity(entry.paths.len());
    for (i, p) in entry.paths.iter().enumerate() {
        if p.is_empty() {
            return Err("invalid uri: empty string".to_string());
        }
        // The parameter router cuts at the first ':' if there is one (even after a '*'), the
        // others only at '*'.
        let colon = match kind {
            RouterKind::UriWithParameter => p.find(':'),
            _ => None,
        };
        let prefix = colon.or_else(|| p.find('*'));
        let check = match prefix {
            Some(_) => ParamCheck::compile(p).map_err(|e| format!("invalid uri {p:?}: {e}"))?,
            None => None,
        };
        plans.push(Plan {
            route: route_id,
            path: i as u32,
            priority: entry.priority,
            prefix,
            check,
        });
    }
    Ok((hosts, plans))
}

#[cfg(test)]
mod tests;
