//! The plugin instance of a plugin that does nothing per request: its work is elsewhere (an
//! API it adds, a timer, the TLS handshake), and enabling it is what turns that work on.

use std::sync::Arc;

use ferrisix_plugin_api::{CompileCtx, Phases, Plugin};

/// Runs in no phase.
struct Inert;

impl Plugin for Inert {
    fn phases(&self) -> Phases {
        Phases::NONE
    }
}

/// A `PluginDef`'s compile function for such a plugin: any conf the schema let through gives
/// the same inert instance.
pub fn compile(_: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(Inert))
}
