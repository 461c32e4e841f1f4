//! One route of `benches/e2e/scale.py`'s mix, as the Admin API stores it (with its id and
//! timestamps), for the in-process views of it: the snapshot-change bench, the route-memory
//! example and its test. Half exact URIs, half prefixes, a host on every fifth route, methods
//! on every seventh, an inline upstream of one node each.

use serde_json::{json, Value};

/// Route `i` of the mix with `uri` instead of its own and `node` as its upstream's one node.
pub fn route_body(i: usize, uri: Option<&str>, node: &str) -> Value {
    let uri = match uri {
        Some(u) => u.to_string(),
        None if i % 2 == 0 => format!("/r{i}/exact"),
        None => format!("/p{i}/*"),
    };
    let mut body = json!({
        "uri": uri,
        "upstream": {"type": "roundrobin", "nodes": {node: 1}},
        "id": i.to_string(),
        "create_time": 1_764_600_000 + i,
        "update_time": 1_764_600_000 + i,
    });
    if i % 5 == 0 {
        body["host"] = json!(format!("h{i}.example.com"));
    }
    if i % 7 == 0 {
        body["methods"] = json!(["GET", "POST"]);
    }
    body
}
