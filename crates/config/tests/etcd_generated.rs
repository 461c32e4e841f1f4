//! The etcd client's protobuf code, checked in under `vendor/etcd-client/src/rpc/pb/` so that
//! building ferrisix needs no `protoc`, is what tonic-prost-build generates from the crate's own
//! `.proto` files (`vendor/etcd-client/proto/`) with the settings of the published crate's
//! build script: the client only, no server.
//!
//! Needs `protoc` (Debian's protobuf-compiler and libprotobuf-dev, which `scripts/test.sh`
//! installs); without it the test fails, naming them. After updating etcd-client, rewrite the
//! checked-in files with
//! `FERRISIX_WRITE_ETCD_PB=1 cargo test -p ferrisix-config --test etcd_generated`.

use std::path::{Path, PathBuf};

use ferrisix_config::test_support::debian::require;

/// The files the published build script compiles, in its order.
const PROTOS: &[&str] = &[
    "etcd/api/authpb/auth.proto",
    "etcd/api/etcdserverpb/rpc.proto",
    "etcd/api/mvccpb/kv.proto",
    "etcd/server/etcdserver/api/v3election/v3electionpb/v3election.proto",
    "etcd/server/etcdserver/api/v3lock/v3lockpb/v3lock.proto",
];

/// The modules `src/rpc/pb.rs` includes: one generated file per protobuf package. (The
/// packages of the imported google.api and openapiv2 annotations are generated too, and used
/// by nothing.)
const MODULES: &[&str] = &[
    "authpb",
    "etcdserverpb",
    "mvccpb",
    "v3electionpb",
    "v3lockpb",
];

fn vendored() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../vendor/etcd-client")
}

#[test]
fn checked_in_etcd_code_is_what_tonic_prost_build_generates() {
    // prost-build runs the `protoc` on PATH (or PROTOC's).
    require("protoc");
    let root = vendored().join("proto");
    let out = tempfile::tempdir().unwrap();
    let protos: Vec<PathBuf> = PROTOS.iter().map(|p| root.join(p)).collect();
    tonic_prost_build::configure()
        .build_server(false)
        .out_dir(out.path())
        .compile_protos(&protos, std::slice::from_ref(&root))
        .expect("tonic-prost-build compiles etcd's .proto files");

    let write = std::env::var_os("FERRISIX_WRITE_ETCD_PB").is_some();
    let mut differ = Vec::new();
    for module in MODULES {
        let name = format!("{module}.rs");
        let generated = std::fs::read_to_string(out.path().join(&name))
            .unwrap_or_else(|e| panic!("tonic-prost-build wrote no {name}: {e}"));
        let path = vendored().join("src/rpc/pb").join(&name);
        if write {
            std::fs::write(&path, &generated).unwrap();
            continue;
        }
        let checked_in = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        if checked_in != generated {
            differ.push(name);
        }
    }
    assert!(
        differ.is_empty(),
        "vendor/etcd-client/src/rpc/pb/{{{}}} differ from what tonic-prost-build generates; \
         rewrite them with FERRISIX_WRITE_ETCD_PB=1 cargo test -p ferrisix-config --test \
         etcd_generated",
        differ.join(",")
    );
}
