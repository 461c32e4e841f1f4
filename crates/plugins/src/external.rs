//! External plugin runners (APISIX's `ext-plugin-*`): plugins written in any language run in
//! a separate process, the runner, which the gateway asks over a unix socket with APISIX's
//! protocol (`runner`). The binary starts and supervises the runner when config.yaml sets
//! `ext-plugin.cmd`.
//!
//! ext-plugin-post-resp is not built: it sends the request to the upstream node itself in
//! `before_proxy`, and the proxy picks the node only after that phase. The runner's side of
//! it (`HTTPRespCall`, the response-body callback) is in `runner`.

pub mod runner;

family! {
    ext_plugin_pre_req,
    ext_plugin_post_req,
}
