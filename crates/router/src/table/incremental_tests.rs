//! The incremental table against a full rebuild: after any sequence of batches of inserts,
//! replacements and removals, `apply` answers every request exactly as `RouteTable::new` over
//! the same routes in key order, and the version it was applied to still answers as before.

use std::collections::BTreeMap;
use std::net::IpAddr;

use proptest::prelude::*;

use super::*;

const PATHS: &[&str] = &[
    "/",
    "/a",
    "/a/",
    "/a/b",
    "/a*",
    "/a/*",
    "/a/b*",
    "/a/:id",
    "/a/:id/*rest",
    "/b",
    "/b/*",
    "*",
    "/a/*/c",
    "/ab",
    "/a/b",
    "",
];
const HOSTS: &[&[&str]] = &[
    &[],
    &[],
    &["a.com"],
    &["*.a.com"],
    &["x.a.com"],
    &["*"],
    &["a.com", "*.com"],
    &["A.com", "a.com"],
    &["a.com:80"],
    &["a b"],
];
const METHODS: &[&[&str]] = &[&[], &["GET"], &["POST"], &["GET", "POST"]];
const ADDRS: &[&[&str]] = &[&[], &["127.0.0.1/32"], &["10.0.0.0/8"]];

/// A route drawn from small sets so that routes collide on paths, hosts and priorities.
#[derive(Clone, Debug)]
struct Spec {
    paths: Vec<usize>,
    hosts: usize,
    methods: usize,
    addrs: usize,
    priority: i64,
}

impl Spec {
    fn entry(&self, value: u64) -> RouteEntry<u64> {
        let mut e = RouteEntry::new(
            self.paths.iter().map(|&p| PATHS[p].to_string()).collect(),
            value,
        );
        e.hosts = HOSTS[self.hosts].iter().map(|h| h.to_string()).collect();
        e.methods = MethodSet::from_names(METHODS[self.methods].iter().copied()).unwrap();
        e.remote_addrs = ADDRS[self.addrs]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        e.priority = self.priority;
        e
    }
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        prop::collection::vec(0..PATHS.len(), 0..3),
        0..HOSTS.len(),
        0..METHODS.len(),
        0..ADDRS.len(),
        -1i64..=1,
    )
        .prop_map(|(paths, hosts, methods, addrs, priority)| Spec {
            paths,
            hosts,
            methods,
            addrs,
            priority,
        })
}

#[derive(Clone, Debug)]
enum Op {
    Put(u64, Spec),
    Remove(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u64..16, spec()).prop_map(|(k, s)| Op::Put(k, s)),
        1 => (0u64..16).prop_map(Op::Remove),
    ]
}

fn kind() -> impl Strategy<Value = RouterKind> {
    prop_oneof![
        Just(RouterKind::HostUri),
        Just(RouterKind::Uri),
        Just(RouterKind::UriWithParameter),
    ]
}

const PROBE_PATHS: &[&str] = &[
    "/", "/a", "/a/", "/a/b", "/a/b/c", "/a/x/c", "/ab", "/abc", "/b", "/b/x", "/c", "/a/7",
    "/a/7/x",
];
const PROBE_HOSTS: &[Option<&str>] = &[
    None,
    Some("a.com"),
    Some("x.a.com"),
    Some("y.a.com"),
    Some("b.com"),
];

/// What a lookup answered, comparable across tables.
type Answer = Option<(u64, String, Option<String>, Vec<(String, String)>)>;

fn answers(t: &RouteTable<u64>) -> Vec<Answer> {
    let mut out = Vec::new();
    for path in PROBE_PATHS {
        for host in PROBE_HOSTS {
            for method in [Method::Get, Method::Post] {
                for addr in ["127.0.0.1", "10.1.2.3"] {
                    let info = RequestInfo {
                        path,
                        host: *host,
                        host_header: host.map(|h| if h == "a.com" { "a.com:80" } else { h }),
                        method: Some(method),
                        remote_addr: addr.parse::<IpAddr>().unwrap(),
                    };
                    out.push(t.lookup(&info, &NoVars).map(|m| {
                        (
                            *m.value,
                            m.matched_uri.to_string(),
                            m.matched_host.map(str::to_string),
                            m.params
                                .iter()
                                .map(|(k, v)| (k.to_string(), v.to_string()))
                                .collect(),
                        )
                    }));
                }
            }
        }
    }
    out
}

struct NoVars;

impl VarSource for NoVars {
    fn var(&self, _: &str) -> Option<std::borrow::Cow<'_, str>> {
        None
    }
}

/// A test key: the big-endian bytes `RouteTable::new` uses for positions.
fn key(k: u64) -> Vec<u8> {
    k.to_be_bytes().to_vec()
}

/// The routes `model` holds, built from scratch in key order.
fn rebuild(kind: RouterKind, model: &BTreeMap<u64, Spec>) -> (RouteTable<u64>, usize) {
    let (t, errors) = RouteTable::new(kind, model.iter().map(|(k, s)| s.entry(*k)).collect());
    (t, errors.len())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]

    #[test]
    fn incremental_equals_rebuild(
        kind in kind(),
        batches in prop::collection::vec(prop::collection::vec(op(), 1..6), 1..8),
    ) {
        let mut table = RouteTable::empty(kind);
        // Everything put, valid or not: a rebuild skips the invalid ones itself.
        let mut model: BTreeMap<u64, Spec> = BTreeMap::new();
        for batch in batches {
            // A batch's net effect per key: its last operation.
            let mut net: BTreeMap<u64, Option<Spec>> = BTreeMap::new();
            for op in batch {
                match op {
                    Op::Put(k, s) => net.insert(k, Some(s)),
                    Op::Remove(k) => net.insert(k, None),
                };
            }
            let removes: Vec<Vec<u8>> =
                net.iter().filter(|(_, s)| s.is_none()).map(|(k, _)| key(*k)).collect();
            let inserts: Vec<(Vec<u8>, RouteEntry<u64>)> = net
                .iter()
                .filter_map(|(k, s)| s.as_ref().map(|s| (key(*k), s.entry(*k))))
                .collect();
            let invalid = inserts
                .iter()
                .filter(|(_, e)| {
                    let e = e.clone();
                    !RouteTable::new(kind, vec![e]).1.is_empty()
                })
                .count();
            let before = table.clone();
            let before_answers = answers(&before);
            let errors = table.apply(removes, inserts);
            for (k, s) in net {
                match s {
                    Some(s) => model.insert(k, s),
                    None => model.remove(&k),
                };
            }
            let (fresh, _) = rebuild(kind, &model);
            prop_assert_eq!(answers(&table), answers(&fresh));
            prop_assert_eq!(table.len(), fresh.len());
            prop_assert_eq!(errors.len(), invalid);
            for (k, s) in model.iter() {
                let valid = RouteTable::new(kind, vec![s.entry(*k)]).1.is_empty();
                prop_assert_eq!(table.get(&key(*k)).is_some(), valid);
            }
            // The version the change was applied to is untouched.
            prop_assert_eq!(answers(&before), before_answers);
        }
        // Taking every route out leaves nothing behind.
        let all: Vec<Vec<u8>> = model.keys().map(|k| key(*k)).collect();
        table.apply(all, Vec::new());
        prop_assert!(table.is_empty());
        prop_assert!(table.index.is_empty() && table.uri.is_empty());
        prop_assert!(table.exact_hosts.is_empty() && table.wild_hosts.is_empty());
    }
}

#[test]
fn replacing_keeps_the_slot_and_new_keys_go_last() {
    let (mut t, _) = RouteTable::new(
        RouterKind::HostUri,
        vec![
            RouteEntry::new(vec!["/x".into()], 0u64),
            RouteEntry::new(vec!["/x".into()], 1),
        ],
    );
    let get = |t: &RouteTable<u64>| {
        let info = RequestInfo {
            path: "/x",
            host: None,
            host_header: None,
            method: Some(Method::Get),
            remote_addr: "127.0.0.1".parse().unwrap(),
        };
        t.lookup(&info, &NoVars).map(|m| *m.value)
    };
    assert_eq!(get(&t), Some(0));
    // Key 0 replaced: it keeps winning the tie.
    t.apply([], vec![(key(0), RouteEntry::new(vec!["/x".into()], 10))]);
    assert_eq!(get(&t), Some(10));
    // Key 0 removed, then put back under a later key: the older route wins now.
    t.apply(
        [key(0)],
        vec![(key(5), RouteEntry::new(vec!["/x".into()], 50))],
    );
    assert_eq!(get(&t), Some(1));
    assert_eq!(t.len(), 2);
    // A bad replacement takes the route out and is reported against its place in the batch.
    let errors = t.apply(
        [],
        vec![
            (key(7), RouteEntry::new(vec!["/y".into()], 70)),
            (key(1), RouteEntry::new(vec![], 11)),
        ],
    );
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].index, 1);
    assert_eq!(get(&t), Some(50));
    assert_eq!(t.get(&key(1)), None);
    assert_eq!(t.get(&key(7)), Some(&70));
}

#[test]
fn a_change_shares_the_untouched_entries() {
    let entries: Vec<RouteEntry<u64>> = (0..2000)
        .map(|i| {
            let mut e = RouteEntry::new(vec![format!("/svc{i}/*")], i);
            if i % 5 == 0 {
                e.hosts = vec![format!("h{i}.example.com")];
            }
            e
        })
        .collect();
    let (base, errors) = RouteTable::new(RouterKind::HostUri, entries);
    assert!(errors.is_empty());
    let mut next = base.clone();
    next.apply(
        [key(17)],
        vec![(key(17), RouteEntry::new(vec!["/moved/*".into()], 17))],
    );
    let info = |p: &'static str| RequestInfo {
        path: p,
        host: None,
        host_header: None,
        method: Some(Method::Get),
        remote_addr: "127.0.0.1".parse().unwrap(),
    };
    assert_eq!(
        base.lookup(&info("/svc17/a"), &NoVars).map(|m| *m.value),
        Some(17)
    );
    assert!(base.lookup(&info("/moved/a"), &NoVars).is_none());
    assert!(next.lookup(&info("/svc17/a"), &NoVars).is_none());
    assert_eq!(
        next.lookup(&info("/moved/a"), &NoVars).map(|m| *m.value),
        Some(17)
    );
    // The candidate lists of every other route are the same allocations in both versions.
    let lists = |t: &RouteTable<u64>| -> Vec<*const Cand<u64>> {
        t.uri
            .prefixes
            .values()
            .into_iter()
            .map(|l| l.as_ptr())
            .collect()
    };
    let (a, b) = (lists(&base), lists(&next));
    let shared = b.iter().filter(|p| a.contains(p)).count();
    assert_eq!(shared, b.len() - 1, "only the new entry is new");
    assert!(base.exact_hosts.same_as(&next.exact_hosts));
}
