//! Plugins that refuse requests by who sends them or what they ask for: the client address,
//! the `User-Agent`, the `Referer` host, the request URI.

family! {
    ip_restriction,
    referer_restriction,
    ua_restriction,
    uri_blocker,
}

use ferrisix_plugin_api::Exit;
use http::StatusCode;

/// `return code, { message = msg }`: `{"message":"<msg>"}` as APISIX's cjson writes it.
pub(crate) fn message_exit(status: StatusCode, msg: &str) -> Exit {
    let text = ferrisix_config::schema::lua::cjson_encode(&serde_json::Value::String(msg.into()));
    Exit::body(status, format!("{{\"message\":{text}}}\n"))
}
