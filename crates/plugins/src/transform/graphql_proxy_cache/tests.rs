use std::sync::Arc;

use ferrisix_config::settings::PluginAttr;
use ferrisix_config::validate::PluginCheck;
use ferrisix_plugin_api::{Clock, Executor, PluginServices, RouteInfo};
use http::StatusCode;
use serde_json::{json, Value};

use super::{PurgeApi, DEF, NAME};
use crate::testing::Compiler;
use crate::transform::proxy_cache::test_zones;

fn compiler(dir: &tempfile::TempDir) -> Compiler {
    let services = PluginServices::new(
        PluginAttr::default(),
        Executor::current(),
        Clock::manual(1_700_000_000_000),
    )
    .with_proxy_cache(Some(test_zones(dir.path())));
    Compiler::with(Arc::new(services))
}

fn route(id: &str) -> RouteInfo {
    RouteInfo {
        id: id.into(),
        name: None,
        service_id: None,
        service_name: None,
        uris: Box::new([]),
        hosts: Box::new([]),
    }
}

#[test]
fn zones_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let c = compiler(&dir);
    let err = |conf: Value| c.registry.check(NAME, &conf).unwrap_err();
    let prefix = "failed to check the configuration of plugin graphql-proxy-cache err: ";
    assert_eq!(
        err(json!({"cache_zone": "nope"})),
        format!("{prefix}cache_zone nope not found")
    );
    assert_eq!(
        err(json!({"cache_strategy": "memory"})),
        format!("{prefix}invalid or empty cache_zone for cache_strategy: memory")
    );
    assert_eq!(
        err(json!({"cache_ttl": 0})),
        format!("{prefix}property \"cache_ttl\" validation failed: expected 0 to be at least 1")
    );
    assert!(c.registry.check(NAME, &json!({})).is_ok());
    assert!(c
        .registry
        .check(
            NAME,
            &json!({"cache_strategy": "memory", "cache_zone": "memory_cache"})
        )
        .is_ok());
}

#[test]
fn the_purge_api_finds_the_live_conf_of_a_route() {
    let dir = tempfile::tempdir().unwrap();
    let c = compiler(&dir);
    let conf = json!({"cache_strategy": "memory", "cache_zone": "memory_cache"});
    let info = route("r1");
    let mut cx = c.cx(NAME, &conf, "r1", None);
    cx.route = Some(&info);
    let plugin = (DEF.compile)(&cx).unwrap();
    let api = PurgeApi {
        services: c.registry.services().clone(),
    };
    let at = |uri: &str| api.answer(uri);
    let base = "/apisix/plugin/graphql-proxy-cache";
    // A memory purge answers 200 whether or not the key was stored, as APISIX's.
    assert_eq!(at(&format!("{base}/memory/r1/k")), StatusCode::OK);
    assert_eq!(at(&format!("{base}/disk/r1/k")), StatusCode::BAD_REQUEST);
    assert_eq!(at(&format!("{base}/memory/r2/k")), StatusCode::NOT_FOUND);
    assert_eq!(at(&format!("{base}/other/r1/k")), StatusCode::BAD_REQUEST);
    assert_eq!(at(&format!("{base}/memory/r1")), StatusCode::BAD_REQUEST);
    assert_eq!(at(&format!("{base}/memory/r1/")), StatusCode::BAD_REQUEST);
    // A recompiled route: the newest live conf answers; once no snapshot holds the route's
    // conf, nothing does.
    let disk_conf = json!({});
    let mut cx = c.cx(NAME, &disk_conf, "r1", None);
    cx.route = Some(&info);
    let newer = (DEF.compile)(&cx).unwrap();
    assert_eq!(at(&format!("{base}/memory/r1/k")), StatusCode::BAD_REQUEST);
    assert_eq!(at(&format!("{base}/disk/r1/k")), StatusCode::NOT_FOUND);
    drop(newer);
    assert_eq!(at(&format!("{base}/memory/r1/k")), StatusCode::OK);
    drop(plugin);
    assert_eq!(at(&format!("{base}/memory/r1/k")), StatusCode::NOT_FOUND);
}
