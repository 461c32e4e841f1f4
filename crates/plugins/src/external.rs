//! External plugin runners (APISIX's `ext-plugin-*`): plugins written in any language run in
//! a separate process, the runner, which the gateway asks over a unix socket with APISIX's
//! protocol (`runner`). The binary starts and supervises the runner when config.yaml sets
//! `ext-plugin.cmd`.
//! The three plugins ask at the three points APISIX does: before the other plugins
//! (pre-req), after them (post-req), and on the upstream's answer (post-resp).

pub mod runner;

family! {
    ext_plugin_pre_req,
    ext_plugin_post_req,
    ext_plugin_post_resp,
}
