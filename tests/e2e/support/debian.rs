//! The programs the tests run and the Debian packages that hold them: the workspace's one
//! helper, from `ferrisix-config`'s test support.

pub use ferrisix_config::test_support::debian::require;
