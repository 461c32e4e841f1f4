//! Booting from etcd in pages, end to end: a real `ferrisix` on a real etcd with
//! `deployment.etcd.page_size` small enough that a modest configuration spans many pages, while
//! another writer compacts etcd's history during the boot; then every route serves and the
//! watch follows later changes. (A compaction between two given pages, which must restart the
//! listing exactly once, is `boots_in_pages_through_a_compaction_in_the_middle` in
//! `crates/config/tests/etcd.rs`, where a hook can run between pages.)

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::etcd::Etcd;
use support::{poll_from, route_to, Behaviour, StoreGateway, StoreGatewayBuilder, Upstream};

const ROUTES: usize = 300;
const LIMIT: Duration = Duration::from_secs(20);

fn serves(gw: &StoreGateway, uri: &str) -> bool {
    gw.try_get(uri)
        .is_ok_and(|r| r.status == 200 && r.header("X-Upstream") == Some("pages"))
}

/// The `pages=N` of the node's last "loaded the configuration from etcd" line.
fn pages_of_last_listing(log: &str) -> Option<u64> {
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("loaded the configuration from etcd"))?;
    let rest = &line[line.find("pages=")? + "pages=".len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[test]
fn boots_in_many_pages_while_etcd_compacts() {
    let etcd = Etcd::start();
    let kv = etcd.kv();
    let up = Upstream::start("pages", Behaviour::Echo);
    for i in 0..ROUTES {
        kv.put(
            &format!("/apisix/routes/{i}"),
            route_to(&format!("/p/{i}"), &up.node()).to_string(),
        );
    }
    // Another writer (outside the prefix) compacts the history a few times while the node
    // boots: a listing whose pinned revision is compacted starts over from a fresh one.
    let stop = Arc::new(AtomicBool::new(false));
    let compactor = {
        let (kv, stop) = (etcd.kv(), Arc::clone(&stop));
        std::thread::spawn(move || {
            for n in 0..2 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let revision = kv.put("/elsewhere/tick", n.to_string());
                kv.compact(revision);
                std::thread::sleep(Duration::from_millis(40));
            }
        })
    };
    let gw = StoreGatewayBuilder::etcd(&etcd.endpoint())
        .etcd_key("page_size: 7")
        .log_filter("info")
        .start();
    stop.store(true, Ordering::Relaxed);
    compactor.join().unwrap();

    for i in 0..ROUTES {
        let uri = format!("/p/{i}");
        let served = poll_from(
            std::time::Instant::now(),
            LIMIT,
            Duration::from_millis(20),
            || serves(&gw, &uri),
        );
        assert!(served.is_some(), "{uri} is not served");
    }
    let log = gw.log_text();
    let pages = pages_of_last_listing(&log);
    assert!(
        pages.is_some_and(|p| p as usize >= ROUTES / 7),
        "{pages:?} pages:\n{log}"
    );
    if log.contains("listing again from the newest revision") {
        eprintln!("a compaction landed in the middle of the listing");
    }

    // The watch follows from the listing's revision: a new route and a changed one arrive.
    kv.put(
        "/apisix/routes/new",
        route_to("/p/new", &up.node()).to_string(),
    );
    kv.put(
        "/apisix/routes/0",
        route_to("/p/zero", &up.node()).to_string(),
    );
    for uri in ["/p/new", "/p/zero"] {
        let served = poll_from(
            std::time::Instant::now(),
            LIMIT,
            Duration::from_millis(20),
            || serves(&gw, uri),
        );
        assert!(served.is_some(), "{uri} is not served after the boot");
    }
    assert_eq!(gw.status_of("/p/0"), 404, "route 0 moved to /p/zero");
}
