//! What a request costs a counting limit: limit-count charges 1 unless a plugin that runs it
//! for a request of its own weighs the request otherwise (graphql-limit-count charges a query's
//! cost), which it says through this request value for that one call.

use ferrisix_plugin_api::PluginCtx;

/// The units the next limit-count call charges the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitCost(pub u64);

impl LimitCost {
    /// The request's cost: 1 unless set.
    pub fn of(ctx: &PluginCtx<'_>) -> u64 {
        ctx.get::<LimitCost>().map_or(1, |c| c.0)
    }
}
