//! Fuzz harness (stable, proptest): Admin API bodies (lua-cjson decoding) and PATCH merges,
//! through the real request pipeline on an in-memory store. No input panics, and every answer
//! is one of the statuses APISIX gives. Bounded: `PROPTEST_CASES` overrides the case count.

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use ferrisix_admin::{AdminApi, AdminOptions};
use ferrisix_config::settings::{AdminKey, AdminRole};
use ferrisix_config::store::memory::MemoryStore;
use ferrisix_plugins::PluginRegistry;
use ferrisix_testkit::cases;
use http::Request;
use http_body_util::Full;
use proptest::prelude::*;

const ROUTE: &str = r#"{"uri":"/a/*","methods":["GET"],"vars":[["arg_x","==","1"]],"plugins":{"limit-count":{"count":1,"time_window":60}},"upstream":{"type":"roundrobin","nodes":{"127.0.0.1:1980":1}},"labels":{"a":"b"}}"#;

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        // A valid route with a few bytes changed.
        prop::collection::vec((0..ROUTE.len(), any::<u8>()), 0..6).prop_map(|edits| {
            let mut b = ROUTE.as_bytes().to_vec();
            for (at, byte) in edits {
                b[at] = byte;
            }
            b
        }),
        "(\\{|\\}|\\[|\\]|\"[a-z_]{0,6}\"|:|,|null|true|-?0x[0-9a-f]{1,4}|-?[0-9]{1,20}(\\.[0-9]+)?(e[+-]?[0-9]{1,3})?|\\\\u[0-9a-fA-F]{4}| ){0,40}"
            .prop_map(String::into_bytes),
        prop::collection::vec(any::<u8>(), 0..64),
    ]
}

fn path() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("/apisix/admin/routes/1".to_owned()),
        Just("/apisix/admin/routes".to_owned()),
        "/apisix/admin/routes/1/(uri|plugins|upstream/nodes|labels/a|methods|vars/0|x/y/z|%2e%2e|)".prop_map(String::from),
        "/apisix/admin/(upstreams|services|consumers|plugin_configs|global_rules|ssls|schema/validate/routes)(/[a-z0-9]{1,3})?".prop_map(String::from),
    ]
}

fn method() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["PUT", "PATCH", "POST", "GET", "DELETE"])
}

proptest! {
    #![proptest_config(cases(1000))]

    #[test]
    fn bodies_and_patches_never_panic(steps in prop::collection::vec((method(), path(), body()), 1..5)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let store = Arc::new(MemoryStore::new("/apisix"));
        let options = AdminOptions {
            keys: vec![AdminKey { name: "admin".into(), key: "k".into(), role: AdminRole::Admin }],
            ..AdminOptions::default()
        };
        let api = AdminApi::new(options, store, PluginRegistry::builtin());
        rt.block_on(async {
            // A route to PATCH into.
            let put = Request::put("/apisix/admin/routes/1").header("X-API-KEY", "k").body(Full::new(Bytes::from(ROUTE))).unwrap();
            assert_eq!(api.handle(put, IpAddr::from([127, 0, 0, 1])).await.status(), 201);
            for (method, path, body) in steps {
                let req = Request::builder()
                    .method(method)
                    .uri(path)
                    .header("X-API-KEY", "k")
                    .body(Full::new(Bytes::from(body)))
                    .unwrap();
                let status = api.handle(req, IpAddr::from([127, 0, 0, 1])).await.status().as_u16();
                assert!(matches!(status, 200 | 201 | 400 | 404 | 405), "{status}");
            }
        });
    }
}
