//! The client's response: its body ([`body`]: a buffer, or an upstream body relayed through
//! the plugins' body filters, carrying the log phase) and the answers the gateway makes itself
//! ([`canned`]: APISIX's error line, nginx's error pages, a plugin's exit, a gRPC error).

pub mod body;
pub mod canned;
