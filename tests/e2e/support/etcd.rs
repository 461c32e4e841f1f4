//! A throwaway single-member etcd for the store end-to-end tests, and a blocking client to
//! read, write and compact it directly, the way APISIX or an operator would: the workspace's
//! one etcd harness, from `ferrisix-config`'s test support.

// Each test binary compiles this module; not every one uses every name.
#[allow(unused_imports)]
pub use ferrisix_config::test_support::etcd::{Etcd, EtcdKv};
