//! ferrisix configuration: the APISIX resource model, validation with APISIX's exact messages,
//! `config.yaml` settings, and the stores the data plane watches.
//!
//! Configuration flows parse → validate (collecting every error) → compile → publish. This crate
//! owns the first two steps and the stores; the proxy crate compiles and publishes. A resource
//! that fails validation is reported on its own and never blocks the others.
#![forbid(unsafe_code)]

pub mod check;
pub mod encrypt;
pub mod env;
pub mod model;
pub mod nesting;
pub mod parallel;
pub mod pem;
pub mod proto;
pub mod provider;
pub mod reopen;
pub mod schema;
pub mod secret;
pub mod settings;
pub mod shared_map;
pub mod state;
pub mod store;
#[cfg(feature = "test-support")]
pub mod test_support;
pub mod validate;
pub mod vars;
pub mod xrpc;
