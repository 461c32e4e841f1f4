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
//! The trees are persistent (see `trie`): a change ([`RouteTable::apply`]) rebuilds only the path
//! entries of the routes it takes out or puts in and shares everything else with the version it
//! started from, so a gateway with 100,000 routes takes one change in microseconds while the
//! published table stays immutable and lock-free for the requests reading it.
//!
//! Not `matchit`: APISIX semantics win — it has no character prefixes (`/foo*` matching
//! `/foobar`), no fall-back through shorter prefixes, and one route per path.

mod index;
mod params;
mod pattern;
mod trie;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::ops::ControlFlow;
use std::sync::Arc;

use ipnet::IpNet;

use crate::expr::{Expr, VarSource};
use crate::methods::{Method, MethodSet};
use index::{Keyed, RouteIndex};
pub use params::Params;
use pattern::ParamCheck;
use trie::{Fwd, Rev, Trie};

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
    /// Index into the entries `Vec` given to `RouteTable::new` (or `apply`'s inserts).
    pub index: usize,
    pub message: String,
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "route entry #{}: {}", self.index, self.message)
    }
}

impl std::error::Error for TableError {}

/// foldhash, randomly seeded, for grouping a change's path entries and route keys (requests
/// never hash). It replaced an FxHash whose last step was a multiplication: bytes that differ
/// only late in a word (the digits of `/api/v1/service123/items`, the low bytes of a route's
/// big-endian sequence number) changed only the high bits, which hashbrown does not use to pick a
/// bucket, so a 100,000-route build probed long runs of equal buckets comparing keys (the
/// router bench's `compile/100000`, `benches/router.rs`, measures the build).
type FoldMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
type FoldSet<K> = HashSet<K, foldhash::fast::RandomState>;

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

/// A kept route: its conditions, compiled, and its value.
struct RouteData<T> {
    /// The caller's key; also the insertion order (a smaller key, byte-wise, wins ties).
    key: Box<[u8]>,
    value: T,
    paths: Box<[Box<str>]>,
    /// Per path: where it is filed and its full-path check.
    plans: Box<[PathPlan]>,
    hosts: Box<[HostPat]>,
    methods: MethodSet,
    remote_addrs: Box<[IpNet]>,
    /// Boxed: most routes have none, and an `Expr` takes 96 bytes inline.
    vars: Option<Box<Expr>>,
    priority: i64,
}

/// How one path of a route is registered.
struct PathPlan {
    /// `None` for the exact table, else the length of the stored prefix.
    prefix: Option<usize>,
    check: Option<ParamCheck>,
}

impl<T> Keyed for RouteData<T> {
    fn key(&self) -> &[u8] {
        &self.key
    }
}

/// One registered path of one route, in a candidate list.
struct Cand<T> {
    route: Arc<RouteData<T>>,
    path: u32,
}

impl<T> Clone for Cand<T> {
    fn clone(&self) -> Self {
        Cand {
            route: self.route.clone(),
            path: self.path,
        }
    }
}

impl<T> Cand<T> {
    /// The order of one path entry: priority descending, then longer original pattern, then
    /// insertion order (the route's key, then the path's place in the route).
    fn order(&self) -> (std::cmp::Reverse<i64>, std::cmp::Reverse<usize>, &[u8], u32) {
        let r = &*self.route;
        (
            std::cmp::Reverse(r.priority),
            std::cmp::Reverse(r.paths[self.path as usize].len()),
            &r.key,
            self.path,
        )
    }
}

/// The candidates stored under one path entry, in match order. Replaced whole on change (the
/// lists are as long as the routes sharing one path, usually one or a few).
type List<T> = Arc<[Cand<T>]>;

/// One radix tree's worth of routes.
struct UriTable<T> {
    /// Patterns without `*` (and without `:` in the parameter router).
    exact: Trie<List<T>>,
    /// The rest, by the part before the first `*` (or `:`).
    prefixes: Trie<List<T>>,
}

impl<T> Clone for UriTable<T> {
    fn clone(&self) -> Self {
        UriTable {
            exact: self.exact.clone(),
            prefixes: self.prefixes.clone(),
        }
    }
}

impl<T> Default for UriTable<T> {
    fn default() -> Self {
        UriTable {
            exact: Trie::default(),
            prefixes: Trie::default(),
        }
    }
}

impl<T> UriTable<T> {
    fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.prefixes.is_empty()
    }
}

/// A host entry of `radixtree_host_uri`.
struct HostBucket<T> {
    pattern: Arc<str>,
    table: UriTable<T>,
}

impl<T> Clone for HostBucket<T> {
    fn clone(&self) -> Self {
        HostBucket {
            pattern: self.pattern.clone(),
            table: self.table.clone(),
        }
    }
}

/// A route table: immutable once shared, and changed by making a new version
/// ([`RouteTable::apply`] on a clone) that shares everything the change did not touch.
///
/// Cloning is a handful of reference counts. A change copies the path to each entry it
/// touches, so a table of 100,000 routes takes one route in microseconds, and the version it
/// replaced keeps serving whoever still holds it, unchanged, until the last holder drops it.
pub struct RouteTable<T> {
    kind: RouterKind,
    len: usize,
    /// Every kept route by key, to find what a removal takes out.
    index: RouteIndex<RouteData<T>>,
    /// Every route in the URI routers; the hostless ones in `HostUri`.
    uri: UriTable<T>,
    exact_hosts: Trie<HostBucket<T>>,
    /// Reversed wildcard suffixes (the pattern without its `*`).
    wild_hosts: Trie<HostBucket<T>>,
}

impl<T> Clone for RouteTable<T> {
    fn clone(&self) -> Self {
        RouteTable {
            kind: self.kind,
            len: self.len,
            index: self.index.clone(),
            uri: self.uri.clone(),
            exact_hosts: self.exact_hosts.clone(),
            wild_hosts: self.wild_hosts.clone(),
        }
    }
}

impl<T> fmt::Debug for RouteTable<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteTable")
            .field("kind", &self.kind)
            .field("routes", &self.len)
            .finish()
    }
}

/// Which tree a path entry lives in: the URI table, or the bucket of a host pattern.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Tree {
    Uri,
    Host { pattern: Arc<str>, wildcard: bool },
}

/// Pending changes of one tree: per (exact?, stored key), the candidates to add.
type TreeEdits<T> = FoldMap<(bool, Box<str>), Vec<Cand<T>>>;

impl<T> RouteTable<T> {
    /// A table with no routes.
    pub fn empty(kind: RouterKind) -> RouteTable<T> {
        RouteTable {
            kind,
            len: 0,
            index: RouteIndex::default(),
            uri: UriTable::default(),
            exact_hosts: Trie::default(),
            wild_hosts: Trie::default(),
        }
    }

    /// Entries are in insertion order (earlier = wins ties); entry `i` gets key `i` (8 bytes,
    /// big-endian). A bad
    /// entry (bad pattern, bad host) is skipped and reported; the rest are served.
    pub fn new(kind: RouterKind, entries: Vec<RouteEntry<T>>) -> (RouteTable<T>, Vec<TableError>) {
        let mut table = RouteTable::empty(kind);
        let errors = table.apply(
            std::iter::empty(),
            entries
                .into_iter()
                .enumerate()
                .map(|(i, e)| ((i as u64).to_be_bytes().to_vec(), e))
                .collect(),
        );
        (table, errors)
    }

    /// Takes out the routes under the keys of `remove`, then puts in each `(key, entry)` of
    /// `insert` (replacing a route already under that key). A key is also the route's
    /// insertion order: among candidates of one path entry with equal priority and pattern
    /// length, the smaller key (byte-wise) wins, as the earlier route does in APISIX; `new`
    /// gives entry `i` the big-endian bytes of `i`. The result matches
    /// exactly what [`RouteTable::new`] builds from the same routes in key order.
    ///
    /// Only the path entries of the routes taken out and put in are rebuilt; the rest of the
    /// table is shared with the clone this was called on. A bad entry is left out and
    /// reported (`TableError::index` is its place in `insert`); if it replaced a route, that
    /// route is gone. A key given twice in `insert` keeps the first entry.
    pub fn apply(
        &mut self,
        remove: impl IntoIterator<Item = Vec<u8>>,
        insert: Vec<(Vec<u8>, RouteEntry<T>)>,
    ) -> Vec<TableError> {
        let kind = self.kind;
        let mut gone: FoldSet<Box<[u8]>> = FoldSet::default();
        let mut edits: FoldMap<Tree, TreeEdits<T>> = FoldMap::default();
        let outgoing = remove
            .into_iter()
            .chain(insert.iter().map(|(k, _)| k.clone()));
        for key in outgoing {
            if gone.contains(key.as_slice()) {
                continue;
            }
            let Some(old) = self.index.remove(&key) else {
                continue;
            };
            gone.insert(key.into_boxed_slice());
            self.len -= 1;
            // The entries it was filed under are rebuilt without it.
            for_each_entry(kind, &old, |tree, exact, stored, _| {
                edits
                    .entry(tree)
                    .or_default()
                    .entry((exact, stored.into()))
                    .or_default();
            });
        }

        let mut errors = Vec::new();
        let mut added: FoldSet<Vec<u8>> = FoldSet::default();
        for (index, (key, entry)) in insert.into_iter().enumerate() {
            if !added.insert(key.clone()) {
                errors.push(TableError {
                    index,
                    message: format!("route key {key:?} given twice"),
                });
                continue;
            }
            let route = match compile_entry(kind, key.clone().into_boxed_slice(), entry) {
                Ok(r) => Arc::new(r),
                Err(message) => {
                    errors.push(TableError { index, message });
                    continue;
                }
            };
            for_each_entry(kind, &route, |tree, exact, stored, path| {
                edits
                    .entry(tree)
                    .or_default()
                    .entry((exact, stored.into()))
                    .or_default()
                    .push(Cand {
                        route: route.clone(),
                        path,
                    });
            });
            self.index.insert(route);
            self.len += 1;
        }

        for (tree, lists) in edits {
            match tree {
                Tree::Uri => apply_lists(&mut self.uri, lists, &gone),
                Tree::Host { pattern, wildcard } => {
                    let (trie, stored): (_, Vec<u8>) = if wildcard {
                        (&mut self.wild_hosts, pattern[1..].bytes().rev().collect())
                    } else {
                        (&mut self.exact_hosts, pattern.bytes().collect())
                    };
                    trie.update(&stored, |old| {
                        let mut bucket = old.unwrap_or_else(|| HostBucket {
                            pattern: pattern.clone(),
                            table: UriTable::default(),
                        });
                        apply_lists(&mut bucket.table, lists, &gone);
                        (!bucket.table.is_empty()).then_some(bucket)
                    });
                }
            }
        }
        errors
    }

    /// The value of the route under `key`.
    pub fn get(&self, key: &[u8]) -> Option<&T> {
        self.index.get(key).map(|r| &r.value)
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
                if let Some(b) = self.exact_hosts.get(&Fwd(host.as_bytes())) {
                    if let Some(m) = self.find_in_bucket(b, req, vars) {
                        return Some(m);
                    }
                }
            }
            if !self.wild_hosts.is_empty() {
                let found = self.wild_hosts.prefixes_of(
                    &Rev(host.as_bytes()),
                    &mut |b: &'a HostBucket<T>| match self.find_in_bucket(b, req, vars) {
                        Some(m) => ControlFlow::Break(m),
                        None => ControlFlow::Continue(()),
                    },
                );
                if found.is_some() {
                    return found;
                }
            }
        }
        self.find(&self.uri, req, vars, false)
    }

    /// Number of entries kept.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn kind(&self) -> RouterKind {
        self.kind
    }

    fn find_in_bucket<'a>(
        &'a self,
        b: &'a HostBucket<T>,
        req: &RequestInfo<'a>,
        vars: &dyn VarSource,
    ) -> Option<RouteMatch<'a, T>> {
        let mut m = self.find(&b.table, req, vars, false)?;
        m.matched_host = Some(&b.pattern);
        Some(m)
    }

    /// lua-resty-radixtree's `match_route` over one tree.
    fn find<'a>(
        &'a self,
        table: &'a UriTable<T>,
        req: &RequestInfo<'a>,
        vars: &dyn VarSource,
        host_filter: bool,
    ) -> Option<RouteMatch<'a, T>> {
        let path = Fwd(req.path.as_bytes());
        if let Some(list) = table.exact.get(&path) {
            for c in list.iter() {
                if let Some(matched_host) = filters(&c.route, req, vars, host_filter) {
                    return Some(RouteMatch {
                        value: &c.route.value,
                        matched_uri: &c.route.paths[c.path as usize],
                        matched_host,
                        params: Params::new(),
                    });
                }
            }
        }
        table.prefixes.prefixes_of(&path, &mut |list: &'a List<T>| {
            for c in list.iter() {
                let route = &*c.route;
                let Some(matched_host) = filters(route, req, vars, host_filter) else {
                    continue;
                };
                let mut params = Params::new();
                if let Some(check) = &route.plans[c.path as usize].check {
                    if !check.check(req.path, &mut params) {
                        continue;
                    }
                }
                return ControlFlow::Break(RouteMatch {
                    value: &route.value,
                    matched_uri: &route.paths[c.path as usize],
                    matched_host,
                    params,
                });
            }
            ControlFlow::Continue(())
        })
    }
}

/// Rebuilds the path entries named in `lists`: the candidates of the routes in `gone` are
/// taken out, the new ones merged in, and an entry left empty is removed.
fn apply_lists<T>(table: &mut UriTable<T>, lists: TreeEdits<T>, gone: &FoldSet<Box<[u8]>>) {
    for ((exact, stored), mut new) in lists {
        new.sort_by(|a, b| a.order().cmp(&b.order()));
        let trie = if exact {
            &mut table.exact
        } else {
            &mut table.prefixes
        };
        trie.update(stored.as_bytes(), |old| {
            let kept = old
                .iter()
                .flat_map(|l| l.iter())
                .filter(|c| !gone.contains(&c.route.key));
            let merged = merge_in_order(kept, new);
            (!merged.is_empty()).then(|| merged.into())
        });
    }
}

/// Merges two candidate sequences that are each in match order.
fn merge_in_order<'a, T: 'a>(
    kept: impl Iterator<Item = &'a Cand<T>>,
    new: Vec<Cand<T>>,
) -> Vec<Cand<T>> {
    let mut out = Vec::with_capacity(new.len() + 1);
    let mut kept = kept.peekable();
    let mut new = new.into_iter().peekable();
    loop {
        let take_kept = match (kept.peek(), new.peek()) {
            (Some(k), Some(n)) => k.order() < n.order(),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => return out,
        };
        if take_kept {
            out.extend(kept.next().cloned());
        } else {
            out.extend(new.next());
        }
    }
}

/// Calls `f` with every path entry a route is filed under: (tree, exact?, stored key, path).
fn for_each_entry<T>(
    kind: RouterKind,
    route: &RouteData<T>,
    mut f: impl FnMut(Tree, bool, &str, u32),
) {
    for (i, plan) in route.plans.iter().enumerate() {
        let pattern = &*route.paths[i];
        let (exact, stored) = match plan.prefix {
            None => (true, pattern),
            Some(n) => (false, &pattern[..n]),
        };
        if kind != RouterKind::HostUri || route.hosts.is_empty() {
            f(Tree::Uri, exact, stored, i as u32);
            continue;
        }
        for (h, host) in route.hosts.iter().enumerate() {
            if route.hosts[..h].iter().any(|o| o.pattern == host.pattern) {
                continue;
            }
            let tree = Tree::Host {
                pattern: Arc::from(&*host.pattern),
                wildcard: host.wildcard,
            };
            f(tree, exact, stored, i as u32);
        }
    }
}

/// The per-candidate filters in radixtree order: methods, remote addresses, hosts, vars.
/// `Some(matched host pattern)` when the candidate passes.
fn filters<'a, T>(
    route: &'a RouteData<T>,
    req: &RequestInfo<'_>,
    vars: &dyn VarSource,
    host_filter: bool,
) -> Option<Option<&'a str>> {
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

/// Validates one entry and compiles its paths; any error rejects the whole entry.
fn compile_entry<T>(
    kind: RouterKind,
    key: Box<[u8]>,
    entry: RouteEntry<T>,
) -> Result<RouteData<T>, String> {
    if entry.paths.is_empty() {
        return Err("route has no uri".to_string());
    }
    let hosts = entry
        .hosts
        .iter()
        .map(|h| HostPat::parse(h))
        .collect::<Result<Box<[HostPat]>, String>>()?;
    let mut plans = Vec::with_capacity(entry.paths.len());
    for p in &entry.paths {
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
        plans.push(PathPlan { prefix, check });
    }
    Ok(RouteData {
        key,
        value: entry.value,
        paths: entry
            .paths
            .into_iter()
            .map(String::into_boxed_str)
            .collect(),
        plans: plans.into_boxed_slice(),
        hosts,
        // An empty set is treated as all methods, as the radix tree treats a zero bitmask.
        methods: if entry.methods.is_empty() {
            MethodSet::ALL
        } else {
            entry.methods
        },
        remote_addrs: entry.remote_addrs.into_boxed_slice(),
        vars: entry.vars.map(Box::new),
        priority: entry.priority,
    })
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod incremental_tests;
