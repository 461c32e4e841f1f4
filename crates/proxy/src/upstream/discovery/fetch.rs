//! What the registry clients share: JSON over HTTP(S) within a timeout, the dump file of the
//! Consul modules, and `user:password@` in a registry URL.

use std::time::Duration;

use bytes::Bytes;
use ferrisix_config::settings::discovery::DumpSettings;
use ferrisix_plugin_api::HttpClient;
use http::{HeaderMap, Method, Request};
use serde_json::Value;

use super::ServiceMap;

/// An answer's status, headers and body.
pub(super) struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// The body as JSON, when the status is 200.
    pub fn json(&self) -> Result<Value, String> {
        if self.status != 200 {
            return Err(format!("status {}", self.status));
        }
        serde_json::from_slice(&self.body).map_err(|e| format!("invalid JSON body: {e}"))
    }

    pub fn header_u64(&self, name: &str) -> Option<u64> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok())
    }
}

/// `method url` with `headers`, the whole answer read within `timeout`.
pub(super) async fn call(
    client: &HttpClient,
    method: Method,
    url: &str,
    headers: &[(&str, String)],
    timeout: Duration,
    ssl_verify: bool,
) -> Result<Answer, String> {
    let mut req = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, v.as_str());
    }
    let req = req
        .body(Bytes::new())
        .map_err(|e| format!("invalid request {url}: {e}"))?;
    let resp = client
        .send_verified(req, timeout, ssl_verify)
        .await
        .map_err(|e| e.to_string())?;
    let (parts, body) = resp.into_parts();
    Ok(Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body,
    })
}

/// Splits `scheme://user:password@rest` into the URL without the credentials and them.
pub(super) fn split_userinfo(url: &str) -> (String, Option<(String, String)>) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_string(), None);
    };
    let Some(at) = rest.rfind('@') else {
        return (url.to_string(), None);
    };
    let (userinfo, host) = (&rest[..at], &rest[at + 1..]);
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    (
        format!("{scheme}://{host}"),
        Some((user.to_string(), password.to_string())),
    )
}

/// Query-string encoding of one value.
pub(super) fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Writes `services` (by bare service name) as APISIX's dump file:
/// `{"services": {...}, "last_update": <secs>, "expire": <secs>}`.
pub(super) fn write_dump(dump: &DumpSettings, services: &ServiceMap) {
    let services: serde_json::Map<String, Value> = services
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                Value::Array(v.iter().map(|n| n.to_json()).collect()),
            )
        })
        .collect();
    let doc = serde_json::json!({
        "services": services,
        "last_update": now_secs(),
        "expire": dump.expire,
    });
    if let Err(e) = std::fs::write(&dump.path, doc.to_string()) {
        tracing::error!(path = %dump.path, error = %e, "write dump into file got error");
    }
}

/// Reads a dump file written by [`write_dump`] (or by APISIX), unless it is missing, invalid
/// or expired.
pub(super) fn read_dump(dump: &DumpSettings, default_weight: u32) -> Option<ServiceMap> {
    let text = match std::fs::read_to_string(&dump.path) {
        Ok(t) => t,
        Err(e) => {
            tracing::info!(path = %dump.path, error = %e, "read dump file get error");
            return None;
        }
    };
    let doc: Value = match serde_json::from_str(text.trim()) {
        Ok(v) => v,
        Err(e) => {
            tracing::error!(path = %dump.path, error = %e, "decoded dump data got error");
            return None;
        }
    };
    let (Some(services), Some(last_update)) = (
        doc.get("services").and_then(Value::as_object),
        doc.get("last_update").and_then(Value::as_i64),
    ) else {
        tracing::warn!(path = %dump.path, "decoded dump data miss fields");
        return None;
    };
    if dump.expire != 0 && last_update + dump.expire < now_secs() {
        tracing::warn!(path = %dump.path, "dump file had expired, ignored it");
        return None;
    }
    let mut out = ServiceMap::new();
    for (name, nodes) in services {
        let list: Vec<_> = nodes
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| super::DiscoveredNode::from_json(n, default_weight))
            .collect();
        out.insert(name.clone(), std::sync::Arc::new(list));
    }
    Some(out)
}

/// APISIX's `show_dump_file`: the file's text, or 503 with why not.
pub(super) fn show_dump_file(dump: Option<&DumpSettings>) -> (u16, String) {
    let Some(dump) = dump else {
        return (503, "dump params is nil".into());
    };
    match std::fs::read_to_string(&dump.path) {
        Ok(t) => (200, t),
        Err(e) => (503, format!("{}: {e}", dump.path)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::discovery::DiscoveredNode;
    use std::sync::Arc;

    #[test]
    fn userinfo_is_split_off() {
        assert_eq!(
            split_userinfo("http://nacos:secret@127.0.0.1:8848"),
            (
                "http://127.0.0.1:8848".to_string(),
                Some(("nacos".to_string(), "secret".to_string()))
            )
        );
        assert_eq!(
            split_userinfo("http://127.0.0.1:8848"),
            ("http://127.0.0.1:8848".to_string(), None)
        );
    }

    #[test]
    fn dump_file_round_trip_and_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dump.json");
        let mut dump = DumpSettings {
            path: path.to_string_lossy().into(),
            load_on_init: true,
            expire: 0,
        };
        let mut map = ServiceMap::new();
        map.insert(
            "svc".into(),
            Arc::new(vec![DiscoveredNode::new("10.0.0.1", 8080, 2)]),
        );
        write_dump(&dump, &map);
        let back = read_dump(&dump, 1).unwrap();
        assert_eq!(back["svc"][0], DiscoveredNode::new("10.0.0.1", 8080, 2));
        let (status, text) = show_dump_file(Some(&dump));
        assert_eq!(status, 200);
        assert!(text.contains("last_update"));
        // Written long ago: expired.
        std::fs::write(
            &path,
            r#"{"services":{"svc":[{"host":"10.0.0.1","port":80,"weight":1}]},"last_update":1,"expire":10}"#,
        )
        .unwrap();
        dump.expire = 10;
        assert!(read_dump(&dump, 1).is_none());
        assert_eq!(show_dump_file(None), (503, "dump params is nil".into()));
    }
}
