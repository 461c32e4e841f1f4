//! Plugins that transform the request or the response on their way through.

family! {}
