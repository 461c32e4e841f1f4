//! Choosing another upstream than the route's: handles the proxy makes at compile time, which
//! plugins hold and hand back on the request path.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use serde_json::Value;

/// An upstream chosen at compile time, opaque to plugins: the proxy makes it and reads it back
/// when a plugin sends a request there ([`crate::PluginCtx::choose_upstream`]).
#[derive(Clone)]
pub struct UpstreamRef(Arc<dyn Any + Send + Sync>);

impl UpstreamRef {
    /// The proxy's side: wraps its compiled upstream.
    pub fn new<T: Any + Send + Sync>(upstream: Arc<T>) -> UpstreamRef {
        UpstreamRef(upstream)
    }

    /// The proxy's side: its compiled upstream back.
    pub fn get<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }

    /// Whether both name the same compiled upstream.
    pub fn same(&self, other: &UpstreamRef) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl fmt::Debug for UpstreamRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("UpstreamRef(..)")
    }
}

/// The upstreams a plugin may choose, offered by the proxy while it compiles a snapshot.
/// `Sync`: a snapshot's routes are compiled on several threads at boot.
pub trait UpstreamResolver: Sync {
    /// The upstream `/apisix/upstreams/<id>` of the snapshot being compiled.
    fn upstream_by_id(&self, id: &str) -> Result<UpstreamRef, String>;

    /// An inline upstream definition (traffic-split's `weighted_upstreams[].upstream`),
    /// validated and compiled as a route's own upstream is. `key` is where it is written, as
    /// APISIX's health-check manager names a plugin's upstream: the holder's etcd key, `#`,
    /// and the path inside it (`/apisix/routes/1#plugins['traffic-split'].rules[0].
    /// weighted_upstreams[0].upstream`). It names the health checker, and the same key with an
    /// unchanged definition gives back the same upstream (its balancer position and its nodes'
    /// health kept across recompiles).
    fn compile_inline_upstream(&self, key: &str, conf: &Value) -> Result<UpstreamRef, String>;
}

/// A resolver with no upstreams at all (tests, and compiles outside a snapshot).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoUpstreams;

impl UpstreamResolver for NoUpstreams {
    fn upstream_by_id(&self, id: &str) -> Result<UpstreamRef, String> {
        Err(format!("failed to find upstream by id: {id}"))
    }

    fn compile_inline_upstream(&self, _key: &str, _conf: &Value) -> Result<UpstreamRef, String> {
        Err("no upstreams can be compiled here".into())
    }
}
