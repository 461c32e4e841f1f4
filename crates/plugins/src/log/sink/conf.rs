//! Reading a logger's conf (its defaults already filled in by the schema): the few shapes
//! every log server's address and timeouts come in.

use std::time::Duration;

use http::{HeaderName, HeaderValue};
use rand::Rng;
use serde_json::{Map, Value};

/// A string property, `""` when absent.
pub fn text<'a>(conf: &'a Map<String, Value>, key: &str) -> &'a str {
    conf.get(key).and_then(Value::as_str).unwrap_or("")
}

/// A boolean property, `false` when absent.
pub fn flag(conf: &Map<String, Value>, key: &str) -> bool {
    conf.get(key).and_then(Value::as_bool).unwrap_or(false)
}

/// An integer property in milliseconds (`default` when absent).
pub fn millis(conf: &Map<String, Value>, key: &str, default: u64) -> Duration {
    Duration::from_millis(conf.get(key).and_then(Value::as_u64).unwrap_or(default))
}

/// An integer property in seconds (`default` when absent).
pub fn secs(conf: &Map<String, Value>, key: &str, default: u64) -> Duration {
    Duration::from_secs(conf.get(key).and_then(Value::as_u64).unwrap_or(default))
}

/// `host` and `port` (the schema bounds the port below only, as APISIX's).
pub fn host_port(conf: &Map<String, Value>) -> Result<(String, u16), String> {
    let port = conf.get("port").and_then(Value::as_i64).unwrap_or(0);
    let port = u16::try_from(port).map_err(|_| format!("invalid port {port}"))?;
    Ok((text(conf, "host").to_owned(), port))
}

/// `endpoint_addr`, else every `endpoint_addrs` (one is picked per batch); `plugin` names the
/// logger in the error when there is none.
pub fn endpoints(conf: &Map<String, Value>, plugin: &str) -> Result<Vec<String>, String> {
    let list: Vec<String> = match conf.get("endpoint_addr").and_then(Value::as_str) {
        Some(one) => vec![one.to_owned()],
        None => conf
            .get("endpoint_addrs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
    };
    if list.is_empty() {
        return Err(format!("{plugin} needs an endpoint"));
    }
    Ok(list)
}

/// An object of header names and string values; entries that are no valid header are left
/// out (the schemas restrict the names already).
pub fn headers(conf: &Map<String, Value>, key: &str) -> Vec<(HeaderName, HeaderValue)> {
    conf.get(key)
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| {
            Some((
                HeaderName::from_bytes(k.as_bytes()).ok()?,
                HeaderValue::from_str(v.as_str()?).ok()?,
            ))
        })
        .collect()
}

/// One of `list` at random (APISIX's loggers spread batches over their endpoints).
pub fn pick<T>(list: &[T]) -> &T {
    &list[rand::thread_rng().gen_range(0..list.len())]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn shapes() {
        let c = json!({"host": "h", "port": 70000, "endpoint_addrs": ["a", "b"],
            "headers": {"x-a": "1", "bad name": "2", "x-n": 3}});
        let c = c.as_object().unwrap();
        assert_eq!(host_port(c), Err("invalid port 70000".into()));
        assert_eq!(endpoints(c, "x").unwrap(), ["a", "b"]);
        assert_eq!(
            endpoints(&Map::new(), "x-logger"),
            Err("x-logger needs an endpoint".into())
        );
        let h = headers(c, "headers");
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].0, "x-a");
        assert_eq!(secs(c, "timeout", 3), Duration::from_secs(3));
    }
}
