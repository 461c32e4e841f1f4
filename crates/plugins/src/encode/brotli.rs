//! brotli (`apisix/plugins/brotli.lua`): compresses answers of `types` (or every type with
//! `"*"`) for clients whose `Accept-Encoding` takes `br` (or `*`), with the encoder's `mode`,
//! `comp_level` (quality), `lgwin` and `lgblock`, when the answer is not encoded already, its
//! declared length is at least `min_length` and the request at least `http_version`; `vary`
//! adds `Vary: Accept-Encoding`. Each chunk is compressed and flushed as it passes.

use std::sync::Arc;

use ferrisix_plugin_api::{CompileCtx, Phases, Plugin, PluginCtx, PluginDef, ResponseHead};
use http::{header, HeaderValue};
use serde_json::{json, Value};

use super::{accepted, mark_encoded, Applies, EncodeBody};
use crate::support::encoding::{BrotliParams, Encoder};

pub const NAME: &str = "brotli";

pub static DEF: PluginDef = PluginDef::new(NAME, 996, schema, compile);

fn schema() -> Value {
    Applies::schema(json!({
        "mode": {"type": "integer", "minimum": 0, "maximum": 2, "default": 0},
        "comp_level": {"type": "integer", "minimum": 0, "maximum": 11, "default": 6},
        "lgwin": {
            "type": "integer",
            "default": 19,
            "enum": [0, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24]
        },
        "lgblock": {
            "type": "integer",
            "default": 0,
            "enum": [0, 16, 17, 18, 19, 20, 21, 22, 23, 24]
        },
        "http_version": {"enum": [1.1, 1.0], "default": 1.1},
        "vary": {"type": "boolean"}
    }))
}

#[derive(Debug)]
struct Brotli {
    applies: Applies,
    params: BrotliParams,
    vary: bool,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let n = |k: &str, d: u64| conf[k].as_u64().unwrap_or(d) as u32;
    Ok(Arc::new(Brotli {
        applies: Applies::from_conf(&conf),
        params: BrotliParams {
            quality: n("comp_level", 6),
            lgwin: n("lgwin", 19),
            lgblock: n("lgblock", 0),
            mode: n("mode", 0),
        },
        vary: conf["vary"].as_bool().unwrap_or(false),
    }))
}

impl Plugin for Brotli {
    fn phases(&self) -> Phases {
        Phases::HEADER_FILTER
    }

    fn header_filter(&self, ctx: &mut PluginCtx<'_>, resp: &mut ResponseHead<'_>) {
        if !accepted(ctx, "br", true) || !self.applies.response(resp, ctx.head().version) {
            return;
        }
        if self.vary {
            resp.headers_mut()
                .append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
        }
        mark_encoded(resp, "br");
        resp.add_encoding_filter(Box::new(EncodeBody {
            encoder: Some(Encoder::brotli(self.params)),
            flush: true,
        }));
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use bytes::Bytes;
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::BodyEdits;
    use http::{HeaderMap, StatusCode};

    use super::*;
    use crate::testing::Compiler;

    fn respond(conf: Value, accept: &str, headers: &mut HeaderMap) -> BodyEdits {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "br", None)).unwrap();
        let mut req = TestRequest::get("/").header("accept-encoding", accept);
        let (mut status, mut edits) = (StatusCode::OK, BodyEdits::default());
        let mut head = ResponseHead::new(&mut status, headers, true, &mut edits);
        p.header_filter(&mut req.ctx(), &mut head);
        edits
    }

    fn html() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html"));
        h.insert(header::ETAG, HeaderValue::from_static("unquoted"));
        h
    }

    #[test]
    fn compresses_and_flushes_per_chunk() {
        let mut h = html();
        let edits = respond(json!({"vary": true}), "gzip, br;q=0.8", &mut h);
        assert_eq!(h[header::CONTENT_ENCODING], "br");
        assert_eq!(h[header::VARY], "Accept-Encoding");
        assert!(
            !h.contains_key(header::ETAG),
            "an unquoted ETag cannot be weakened"
        );
        let mut filters = edits.filters;
        let first = filters
            .run(Bytes::from("<p>hello</p>".repeat(50)), false)
            .data;
        let mut partial = String::new();
        // A flushed chunk decodes on its own.
        let _ = brotli::Decompressor::new(&first[..], 4096).read_to_string(&mut partial);
        assert_eq!(partial, "<p>hello</p>".repeat(50));
        let mut all = first.to_vec();
        all.extend_from_slice(&filters.run(Bytes::from("end"), true).data);
        let mut plain = String::new();
        brotli::Decompressor::new(&all[..], 4096)
            .read_to_string(&mut plain)
            .unwrap();
        assert_eq!(plain, format!("{}end", "<p>hello</p>".repeat(50)));
    }

    #[test]
    fn conditions_and_validation() {
        for accept in ["gzip", "br;q=0", ""] {
            let mut h = html();
            assert!(respond(json!({}), accept, &mut h).is_empty(), "{accept}");
        }
        let mut h = html();
        assert!(!respond(json!({}), "*", &mut h).is_empty());
        let mut h = html();
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        assert!(respond(json!({}), "br", &mut h).is_empty());
        let mut h = html();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        assert!(respond(json!({}), "br", &mut h).is_empty());
        let r = crate::PluginRegistry::builtin();
        assert!(r.check(NAME, &json!({"lgwin": 9})).is_err());
        assert!(r.check(NAME, &json!({"comp_level": 12})).is_err());
        assert!(r.check(NAME, &json!({"mode": 3})).is_err());
        assert!(r
            .check(
                NAME,
                &json!({"lgblock": 16, "lgwin": 24, "mode": 1, "comp_level": 0})
            )
            .is_ok());
    }
}
