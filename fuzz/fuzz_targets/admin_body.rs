//! Admin API bodies (lua-cjson decoding) and PATCH merges through the real pipeline.
#![no_main]
use std::sync::Arc;

use bytes::Bytes;
use ferrisix_admin::{AdminApi, AdminOptions};
use ferrisix_config::store::memory::MemoryStore;
use http_body_util::Full;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let options = AdminOptions {
        key_required: false,
        ..AdminOptions::default()
    };
    let api = AdminApi::new(
        options,
        Arc::new(MemoryStore::new("/apisix")),
        ferrisix_plugins::PluginRegistry::builtin(),
    );
    rt.block_on(async {
        for (method, path) in [
            ("PUT", "/apisix/admin/routes/1"),
            ("PATCH", "/apisix/admin/routes/1"),
            ("PATCH", "/apisix/admin/routes/1/plugins"),
        ] {
            let req = http::Request::builder()
                .method(method)
                .uri(path)
                .body(Full::new(Bytes::copy_from_slice(data)))
                .unwrap();
            let _ = api.handle(req, [127, 0, 0, 1].into()).await;
        }
    });
});
