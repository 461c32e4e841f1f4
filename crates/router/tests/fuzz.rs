//! Fuzz harness (stable, proptest): route patterns and lookups never panic, whatever the
//! patterns, hosts and request paths. Bounded: `PROPTEST_CASES` overrides the case count.

use std::net::IpAddr;

use ferrisix_router::{normalize_path, RequestInfo, RouteEntry, RouteTable, RouterKind};
use ferrisix_testkit::cases;
use proptest::prelude::*;

/// Paths built from the characters patterns treat specially, plus arbitrary text.
fn path() -> impl Strategy<Value = String> {
    prop_oneof![
        "(/|[a-c]|:|\\*|\\{|\\}|\\.|%|%2[fF]|\\.\\.|//|;|\\?|#){0,24}",
        "/[ -~]{0,40}",
        any::<String>(),
    ]
}

fn host() -> impl Strategy<Value = String> {
    "(\\*\\.)?([a-c]|\\.|-|\\*|:|[0-9]){0,12}"
}

proptest! {
    #![proptest_config(cases(2000))]

    #[test]
    fn tables_build_and_look_up(
        patterns in prop::collection::vec((prop::collection::vec(path(), 1..3), prop::collection::vec(host(), 0..2), -3i64..3), 0..12),
        requests in prop::collection::vec((path(), prop::option::of(host())), 1..8),
        kind in 0..3u8,
    ) {
        let kind = [RouterKind::HostUri, RouterKind::Uri, RouterKind::UriWithParameter][kind as usize];
        let entries = patterns
            .into_iter()
            .enumerate()
            .map(|(i, (paths, hosts, priority))| {
                let mut e = RouteEntry::new(paths, i);
                e.hosts = hosts;
                e.priority = priority;
                e
            })
            .collect();
        let (table, _errors) = RouteTable::new(kind, entries);
        for (raw, host) in &requests {
            let Some(path) = normalize_path(raw) else { continue };
            let info = RequestInfo {
                path: &path,
                host: host.as_deref(),
                host_header: host.as_deref(),
                method: None,
                remote_addr: IpAddr::from([127, 0, 0, 1]),
            };
            if let Some(m) = table.lookup(&info, &()) {
                prop_assert!(*m.value < table.len().max(1) + 12);
            }
        }
    }

    #[test]
    // The output is a decoded `$uri`, not a request line: it may hold bytes (a decoded `%0a`)
    // that a raw path may not, so normalising it again is not meaningful. What holds is the
    // shape nginx guarantees: rooted, no empty, `.` or `..` segment.
    fn normalisation_is_total_and_yields_a_clean_path(raw in path()) {
        if let Some(once) = normalize_path(&raw) {
            prop_assert!(once.starts_with('/'), "{once:?}");
            prop_assert!(!once.contains("//"), "{once:?}");
            for segment in once.split('/').skip(1) {
                prop_assert!(segment != "." && segment != "..", "{once:?}");
            }
        }
    }
}
