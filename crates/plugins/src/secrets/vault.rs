//! Vault's KV secrets engine (`apisix/secret/vault.lua`): the key `<path>/<field>` is read
//! with `GET <uri>/v1/<prefix>/<path>` (the path normalised), `X-Vault-Token: <token>` (the
//! token may be an `$env://` reference) and `X-Vault-Namespace` when `namespace` is set; the
//! value is `data.<field>`. Vault's only auth APISIX supports is the token.
//!
//! KV version 2 answers `data.data.<field>` (with `data.metadata`), for a `prefix` naming the
//! engine's `data/` path (`kv/data/apisix`): ferrisix reads that shape too, where APISIX
//! finds no value.

use bytes::Bytes;
use ferrisix_config::secret::env_or_plain;
use ferrisix_plugin_api::http_client::HttpClient;
use http::{Method, Request};
use serde_json::Value;

use super::{status_error, Env, FetchError, CALL_TIMEOUT};

/// `pl.path.normpath` of `/v1/<prefix>/<path>`: empty and `.` segments dropped, `..` taking
/// the one before.
fn normpath(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    format!("/{}", parts.join("/"))
}

/// The value of `key` (`<path>/<field>`), with APISIX's messages.
pub async fn get(
    http: &HttpClient,
    conf: &Value,
    key: &str,
    env: &Env,
) -> Result<Option<Value>, FetchError> {
    let Some((main, sub)) = key.rsplit_once('/') else {
        return Err(FetchError::Missing(format!("error key format, key: {key}")));
    };
    if main.is_empty() {
        return Err(FetchError::Missing(format!(
            "can't find main key, key: {key}"
        )));
    }
    if sub.is_empty() {
        return Err(FetchError::Missing(format!(
            "can't find sub key, key: {key}"
        )));
    }
    let text = |k: &str| conf.get(k).and_then(Value::as_str).unwrap_or("");
    let uri = format!(
        "{}{}",
        text("uri").trim_end_matches('/'),
        normpath(&format!("/v1/{}/{main}", text("prefix")))
    );
    let mut req = Request::builder()
        .method(Method::GET)
        .uri(&uri)
        .header("x-vault-token", env_or_plain(text("token"), env));
    if let Some(ns) = conf.get("namespace").and_then(Value::as_str) {
        req = req.header("x-vault-namespace", ns);
    }
    let req = req
        .body(Bytes::new())
        .map_err(|e| FetchError::Missing(format!("invalid vault request: {e}")))?;
    let timeout = conf
        .get("timeout")
        .and_then(Value::as_f64)
        .filter(|t| t.is_finite() && *t > 0.0 && *t < 3600.0)
        .map_or(CALL_TIMEOUT, std::time::Duration::from_secs_f64);
    let resp = http.send(req, timeout).await.map_err(|e| {
        FetchError::Unavailable(format!("failed to retrtive data from vault kv engine: {e}"))
    })?;
    let status = resp.status().as_u16();
    let body = String::from_utf8_lossy(resp.body());
    let decoded: Option<Value> = serde_json::from_str(&body).ok();
    let Some(data) = decoded.as_ref().and_then(|v| v.get("data")) else {
        let msg = format!("failed to decode result, res: {body}");
        // A 404 carries `{"errors": []}`: the path holds nothing.
        return Err(if status == 200 {
            FetchError::Missing(msg)
        } else {
            status_error(status, msg)
        });
    };
    // KV v2: `{"data": {"data": {...}, "metadata": {...}}}`.
    let fields = match (data.get("data"), data.get("metadata")) {
        (Some(inner @ Value::Object(_)), Some(Value::Object(_))) => inner,
        _ => data,
    };
    Ok(fields.get(sub).filter(|v| !v.is_null()).cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised() {
        assert_eq!(normpath("/v1/kv/apisix/jack"), "/v1/kv/apisix/jack");
        assert_eq!(normpath("/v1//kv/./a/../jack"), "/v1/kv/jack");
    }
}
