//! Route patterns and lookups: the first line of the input is the request path, the others
//! are patterns.
#![no_main]
use ferrisix_router::{normalize_path, RequestInfo, RouteEntry, RouteTable, RouterKind};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &str| {
    let mut lines = data.lines();
    let request = lines.next().unwrap_or("/");
    let entries: Vec<_> = lines
        .enumerate()
        .map(|(i, p)| RouteEntry::new(vec![p.to_owned()], i))
        .collect();
    for kind in [
        RouterKind::HostUri,
        RouterKind::Uri,
        RouterKind::UriWithParameter,
    ] {
        let (table, _) = RouteTable::new(kind, entries.clone());
        if let Some(path) = normalize_path(request) {
            let info = RequestInfo {
                path: &path,
                host: Some("a.com"),
                host_header: Some("a.com"),
                method: None,
                remote_addr: [127, 0, 0, 1].into(),
            };
            let _ = table.lookup(&info, &());
        }
    }
});
