//! Plugins that compress responses for clients that accept it (gzip, brotli), on the streamed
//! body, after every other plugin's body filter.

family! {
    brotli,
    gzip,
}

use ferrisix_plugin_api::{PluginCtx, ResponseHead};
use http::{header, HeaderValue, Version};
use serde_json::{json, Value};

use crate::support::encoding::accepts;

/// The conditions gzip and brotli share (`types`, `min_length`, `http_version`).
#[derive(Debug)]
pub(crate) struct Applies {
    /// `None`: every type (`"*"`).
    pub types: Option<Vec<String>>,
    pub min_length: u64,
    /// `http_version`: the lowest request version compressed (1.0 or 1.1).
    pub http_1_0: bool,
}

impl Applies {
    /// The coding plugin's schema: `types` (a list of media types, or `"*"` for every type)
    /// and `min_length`, then the plugin's own `properties`.
    pub fn schema(properties: Value) -> Value {
        let mut props = json!({
            "types": {
                "anyOf": [
                    {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
                    {"enum": ["*"]}
                ],
                "default": ["text/html"]
            },
            "min_length": {"type": "integer", "minimum": 1, "default": 20}
        });
        if let (Some(props), Value::Object(own)) = (props.as_object_mut(), properties) {
            props.extend(own);
        }
        json!({"type": "object", "properties": props})
    }

    pub fn from_conf(conf: &Value) -> Applies {
        Applies {
            types: conf["types"].as_array().map(|t| {
                t.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            }),
            min_length: conf["min_length"].as_u64().unwrap_or(20),
            http_1_0: conf["http_version"].as_f64() == Some(1.0),
        }
    }

    /// Whether a response with `resp`'s head to a request of `version` is compressed.
    pub fn response(&self, resp: &ResponseHead<'_>, version: Version) -> bool {
        let h = resp.headers();
        // Already encoded (by the upstream or the other coding plugin).
        if h.contains_key(header::CONTENT_ENCODING) {
            return false;
        }
        // Like nginx, no compression without a Content-Type.
        let Some(ct) = h.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        if let Some(types) = &self.types {
            let media = ct.split_once(';').map_or(ct, |(t, _)| t);
            if !types.iter().any(|t| t == media) {
                return false;
            }
        }
        // Like nginx, min_length is only checked against a declared length.
        let length = h
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
        if length.is_some_and(|n| n < self.min_length) {
            return false;
        }
        let lowest = if self.http_1_0 {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        };
        version >= lowest
    }
}

/// Whether one of the request's `Accept-Encoding` headers takes `coding` (or `*` when `star`).
pub(crate) fn accepted(ctx: &PluginCtx<'_>, coding: &str, star: bool) -> bool {
    ctx.headers()
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| accepts(v, coding, star)))
}

/// Marks the response as encoded with `coding`: its length goes, a strong `ETag` becomes weak
/// (one that is not quoted is dropped), as nginx's gzip filter and APISIX's brotli do.
pub(crate) fn mark_encoded(resp: &mut ResponseHead<'_>, coding: &'static str) {
    let h = resp.headers_mut();
    h.remove(header::CONTENT_LENGTH);
    h.insert(header::CONTENT_ENCODING, HeaderValue::from_static(coding));
    if let Some(etag) = h
        .get(header::ETAG)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    {
        let quoted = |s: &str| {
            s.len() >= 2
                && s.starts_with('"')
                && s.ends_with('"')
                && !s[1..s.len() - 1].contains('"')
        };
        if etag.starts_with("W/") && quoted(&etag[2..]) {
            // Already weak.
        } else if quoted(&etag) {
            if let Ok(v) = HeaderValue::from_str(&format!("W/{etag}")) {
                h.insert(header::ETAG, v);
            }
        } else {
            h.remove(header::ETAG);
        }
    }
}

/// A content coding as a body filter; `flush`: every chunk's output goes out with it
/// (APISIX's brotli flushes per chunk; nginx's gzip fills its buffers first).
pub(crate) struct EncodeBody {
    pub encoder: Option<crate::support::encoding::Encoder>,
    pub flush: bool,
}

impl ferrisix_plugin_api::BodyFilter for EncodeBody {
    fn filter(&mut self, chunk: &mut ferrisix_plugin_api::BodyChunk) {
        let Some(enc) = self.encoder.as_mut() else {
            return;
        };
        let mut out = enc.push(&chunk.data, self.flush && !chunk.end);
        if chunk.end {
            if let Some(enc) = self.encoder.take() {
                out.extend(enc.finish());
            }
        }
        chunk.data = bytes::Bytes::from(out);
    }
}
