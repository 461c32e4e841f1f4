//! Debian packages for tests that need real servers: the workspace's one helper, from
//! `ferrisix-config`'s test support.

pub use ferrisix_config::test_support::debian::{apt_get, which};
