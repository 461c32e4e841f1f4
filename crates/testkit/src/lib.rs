//! Helpers shared by the workspace's tests. Crates take this one as a dev-dependency only, so
//! nothing here reaches the gateway's build, and the router keeps no runtime dependency
//! beyond its matching.
#![forbid(unsafe_code)]

use proptest::test_runner::Config as ProptestConfig;

pub mod openssl_pki;

/// The configuration of a stable fuzz harness (each crate's `tests/fuzz.rs`): `default` cases,
/// or as many as `PROPTEST_CASES` says, so CI and a long local run use one harness; no
/// failure persistence, so a run never writes regression files into the source tree.
///
/// proptest reads `PROPTEST_CASES` itself only when no case count is set in code, and each
/// harness sets its own.
pub fn cases(default: u32) -> ProptestConfig {
    cases_from(std::env::var("PROPTEST_CASES").ok().as_deref(), default)
}

fn cases_from(var: Option<&str>, default: u32) -> ProptestConfig {
    ProptestConfig {
        cases: var.and_then(|v| v.parse().ok()).unwrap_or(default),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_overrides_the_default() {
        assert_eq!(cases_from(None, 64).cases, 64);
        assert_eq!(cases_from(Some("5000"), 64).cases, 5000);
        // A value that is no count leaves the harness's own.
        assert_eq!(cases_from(Some("many"), 64).cases, 64);
        assert!(cases_from(None, 1).failure_persistence.is_none());
    }
}
